/* divergence.c: the bad-step streak that stops a diverged run (divergence.h). */
#include "divergence.h"

#include <math.h>
#include <stdio.h>

int divergence_step(divergence *d, long step, double loss, int skipped, int at_min_scale) {
  int nonfinite = !isfinite(loss);
  d->last_step = step;
  d->last_loss = loss;
  d->at_min = at_min_scale != 0;
  if (nonfinite || skipped) {
    d->streak++;
    d->nonfinite += nonfinite;
  } else {
    d->streak = 0;
    d->nonfinite = 0;
  }
  return d->max_bad > 0 && (d->streak >= d->max_bad || (d->at_min && d->streak > 0));
}

int divergence_loss_bad(const divergence *d) { return d->last_step > 0 && !isfinite(d->last_loss); }

void divergence_describe(const divergence *d, double scale, char *buf, size_t cap) {
  long from = d->last_step - d->streak + 1;
  if (d->at_min && d->streak < d->max_bad)
    snprintf(buf, cap, "step %ld %s with the loss scale at its minimum (%g), after %ld bad steps in a row", d->last_step,
             isfinite(d->last_loss) ? "overflowed" : "had a non-finite loss", scale, d->streak);
  else if (d->streak == 1 && d->nonfinite == 1)
    snprintf(buf, cap, "the loss at step %ld, the last, was not finite (%g)", d->last_step, isnan(d->last_loss) ? NAN : d->last_loss);
  else if (d->nonfinite == d->streak)
    snprintf(buf, cap, "the loss was not finite (%g) at each of the %ld steps %ld-%ld", isnan(d->last_loss) ? NAN : d->last_loss, d->streak,
             from, d->last_step);
  else if (d->nonfinite == 0)
    snprintf(buf, cap, "each of the %ld steps %ld-%ld was skipped for a gradient overflow (loss scale now %g)", d->streak, from,
             d->last_step, scale);
  else
    snprintf(buf, cap, "each of the %ld steps %ld-%ld had a non-finite loss (%ld of them) or was skipped for a gradient overflow (loss scale now %g)",
             d->streak, from, d->last_step, d->nonfinite, scale);
}
