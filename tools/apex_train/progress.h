/* progress.h: the progress bar's text and where it may be drawn. The line is built for a given
 * width by dropping the least useful fields first, so that a redraw never wraps (a wrapped line
 * cannot be erased by '\r'); the bar is drawn only on an interactive terminal of the launching
 * shell, since a pty that an MPI launcher gives each rank ends in a file. The step rate is a recent
 * window, so a rate and an ETA follow the run as it is now, not its average since the start. */
#ifndef APEX_TRAIN_PROGRESS_H
#define APEX_TRAIN_PROGRESS_H

#include <stddef.h>

/* What one line shows. */
typedef struct progress_point {
  long epoch, epochs;
  long step, total_steps;    /* steps from the start of training */
  double loss;
  double loss_scale;
  long skipped;              /* skipped steps so far */
  double samples_per_s;      /* images models: shown as samples/s */
  double tokens_per_s;       /* > 0 (gpt): shown as tok/s, with ms/step, instead of samples/s */
  double ms_per_step;
  double eta_s;              /* < 0: unknown */
  double device_gb, device_peak_gb; /* > 0 (a GPU run): shown as "gpu 0.41/0.52 GB" (now/peak) */
  double optim_mb;           /* > 0 (--zero): the optimizer state this rank holds, as "optim 1.2 MB/rank" */
} progress_point;

/* Writes into buf (size cap) a progress line of at most width - 1 characters (the last column stays
 * empty: writing it makes some terminals wrap). The fields are taken most useful first (step S/N,
 * loss, ETA, epoch, rate, ms/step, scale, skipped), each one that still fits, and shown in a fixed
 * order (the GPU's memory, when there is a GPU, and --zero's optimizer state per rank last); "step S/N" is cut at width - 1 when even it does not fit. The bar ([###...], 10 to 30 wide) comes only
 * with with_bar and only in the room the fields leave. Returns the line's length. */
size_t progress_format(char *buf, size_t cap, const progress_point *p, int width, int with_bar);

/* The terminal width of fd: TIOCGWINSZ, else $COLUMNS, else 80. */
int progress_terminal_width(int fd);

/* 1 when fd is a terminal that a person watches: isatty, and not a rank started by an MPI launcher
 * (Open MPI, MPICH/Hydra, PMIx, MVAPICH, Slurm's srun), whose pty is usually redirected to a file. */
int progress_interactive(int fd);

/* The time per step over the last PROGRESS_WINDOW steps (fewer at the start). */
#define PROGRESS_WINDOW 20
typedef struct progress_rate {
  double t[PROGRESS_WINDOW + 1]; /* ring of step end times */
  long n;                         /* times pushed */
} progress_rate;

/* Records that a step ended at time t (seconds, monotonic); the first call marks the start. */
void progress_rate_push(progress_rate *r, double t);
/* Seconds per step over the window; 0 before the first step ended. */
double progress_rate_step_s(const progress_rate *r);

#endif
