/* signals.h: Ctrl-C (SIGINT) and SIGTERM during training. The first one asks the run to stop after
 * the step in progress (so that it can save a checkpoint and say how to resume); a second one kills
 * the process at once, as the default action would. A signal the process was started with ignored
 * (a background job of a non-interactive shell, nohup) stays ignored. */
#ifndef APEX_TRAIN_SIGNALS_H
#define APEX_TRAIN_SIGNALS_H

/* Installs the handlers; the first signal prints one line on stderr unless quiet (ranks other than
 * 0, which mpirun signals too). Non-zero when sigaction fails. */
int signals_install(int quiet);
/* The signal that asked to stop (SIGINT or SIGTERM), or 0. */
int signals_pending(void);
/* Puts back the default actions (after training: a signal then ends the process as usual). */
void signals_restore(void);
/* The exit status of a run stopped by sig: 128 + sig, as a shell reports a process it killed. */
int signals_exit_status(int sig);

#endif
