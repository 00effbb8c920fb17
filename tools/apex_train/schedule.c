/* schedule.c: the learning-rate schedule (schedule.h). */
#include "schedule.h"

#include <math.h>
#include <string.h>

int schedule_parse(const char *name, schedule_kind *out) {
  static const char *const names[] = {"linear", "cosine", "constant"};
  for (int k = 0; k < 3; k++)
    if (strcmp(name, names[k]) == 0) {
      *out = (schedule_kind)k;
      return 0;
    }
  return -1;
}

float schedule_lr(const schedule *sc, long s) {
  if (s < sc->warmup) return sc->peak * (float)((double)(s + 1) / (double)sc->warmup);
  if (sc->kind == SCHEDULE_CONSTANT) return sc->peak;
  /* The decay spans the steps after the warmup; with no warmup, linear is the historical
   * apex-train rule (1 - s / total, floored at 5%), bit for bit. */
  long span = sc->total - sc->warmup;
  double frac = span > 0 ? (double)(s - sc->warmup) / (double)span : 1.0;
  if (sc->kind == SCHEDULE_LINEAR) return sc->peak * (float)(frac < 0.95 ? 1.0 - frac : 0.05);
  if (frac > 1.0) frac = 1.0;
  return sc->peak * (float)(0.05 + 0.95 * 0.5 * (1.0 + cos(3.14159265358979323846 * frac)));
}
