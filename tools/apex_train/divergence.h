/* divergence.h: when a run has diverged. A step is bad when its loss is Inf or NaN or when amp
 * skipped it (a gradient overflowed); a run stops when its last --max-bad-steps steps were all bad,
 * or sooner when a step overflowed with the dynamic loss scale already at its minimum
 * (apex_amp_scale_at_min): then no scale can bring it back, and a non-finite loss comes from the
 * weights, not from the scale. The rule reads the loss, the step's skipped flag and amp's query,
 * not status codes. */
#ifndef APEX_TRAIN_DIVERGENCE_H
#define APEX_TRAIN_DIVERGENCE_H

#include <stddef.h>

#define DIVERGENCE_DEFAULT_MAX_BAD 50

typedef struct divergence {
  long max_bad;       /* bad steps in a row that stop the run; 0: never stop, not even at the minimum scale */
  long streak;        /* bad steps in a row up to the last */
  long nonfinite;     /* of those, steps whose loss was Inf or NaN */
  long last_step;
  double last_loss;
  int at_min;         /* the last step overflowed at the minimum loss scale */
} divergence;

/* Records step `step` (1-based): its loss, whether amp skipped it, and whether it overflowed at the
 * minimum loss scale. Returns 1 when the run must stop. */
int divergence_step(divergence *d, long step, double loss, int skipped, int at_min_scale);
/* 1 when the last step's loss was Inf or NaN: its state is not worth a checkpoint. */
int divergence_loss_bad(const divergence *d);
/* One line (no "apex-train:" and no newline) saying why the run stopped: which steps were bad, and
 * how; scale is the loss scale now. */
void divergence_describe(const divergence *d, double scale, char *buf, size_t cap);

#endif
