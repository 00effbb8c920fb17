/* scale_rule.h: one update of the loss scale, shared by the CPU scaler (optim/loss_scaler.c) and the device
 * scaler (backend/cuda/loss_scaler.cu), so that both follow the same rule bit for bit. The rule is the one
 * loss_scaler.h documents: growth after growth_interval clean steps, backoff (after `hysteresis`
 * overflows) on overflow, clamped to [min_scale, max_scale]; a static scaler only counts. */
#ifndef APEX_BACKEND_SCALE_RULE_H
#define APEX_BACKEND_SCALE_RULE_H

#include <math.h>

#include "apex/loss_scaler_config.h"
#include "core/convert_scalar.h" /* APEX_HD */

/* Updates st for one step; returns 1 when an overflow came with the dynamic scale already at its
 * minimum (for apex_loss_scaler_at_min), else 0. */
APEX_HD static inline int apex__scale_rule(apex_loss_scaler_state *st, const apex_loss_scaler_config *c, int found_inf) {
  st->steps++;
  if (!found_inf) {
    if (c->mode == APEX_SCALE_DYNAMIC && ++st->growth_tracker >= c->growth_interval) {
      st->growth_tracker = 0;
      st->hysteresis_tracker = c->hysteresis;
      st->scale = fminf(st->scale * c->growth_factor, c->max_scale);
    }
    return 0;
  }
  st->skipped++;
  if (c->mode == APEX_SCALE_STATIC) return 0;
  int at_min = st->scale <= c->min_scale;
  st->growth_tracker = 0;
  if (st->hysteresis_tracker > 0) st->hysteresis_tracker--;
  if (st->hysteresis_tracker == 0) st->scale = fmaxf(st->scale * c->backoff_factor, c->min_scale);
  return at_min;
}

#endif
