/* signals.h: Ctrl-C (SIGINT) and SIGTERM during training. The first one asks the run to stop after
 * the step in progress (so that it can save a checkpoint and say how to resume). Another one within
 * SIGNALS_GRACE_S of the first is the same stop delivered twice (timeout(1) signals the child and
 * then its process group; a terminal signals the whole foreground group) and changes nothing; one
 * after the grace is a person pressing Ctrl-C again: the process says so in one line and exits at
 * once with SIGNALS_EXIT_AT_ONCE, leaving the last checkpoint saved as it was (saves are atomic).
 * A signal the process was started with ignored (a background job of a non-interactive shell,
 * nohup) stays ignored. */
#ifndef APEX_TRAIN_SIGNALS_H
#define APEX_TRAIN_SIGNALS_H

/* Seconds after the first signal during which another one is taken for the same request. */
#define SIGNALS_GRACE_S 1.0
/* The exit status of a run stopped at once by a second signal. */
#define SIGNALS_EXIT_AT_ONCE 4

/* Installs the handlers; the signals print one line on stderr unless quiet (ranks other than 0,
 * which mpirun signals too). Non-zero when sigaction fails. */
int signals_install(int quiet);
/* The signal that asked to stop (SIGINT or SIGTERM), or 0. */
int signals_pending(void);
/* Puts back the default actions (after the last save: a signal then ends the process as usual). */
void signals_restore(void);
/* The exit status of a run stopped by sig: 128 + sig, as a shell reports a process it killed. */
int signals_exit_status(int sig);

#endif
