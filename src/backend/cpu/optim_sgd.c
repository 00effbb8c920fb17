/* sgd.c: SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD (PyTorch 1.13)
 * and Apex's FusedSGD (wd_after_momentum):
 *     g = g / scale (+ wd * p unless wd_after_momentum)
 *     buf = g at a parameter's first step, else momentum * buf + (1 - dampening) * g
 *     d = nesterov ? g + momentum * buf : buf        (d = g without momentum)
 *     d += wd * p if wd_after_momentum
 *     p -= lr * d
 * The first-step special case becomes per-tensor coefficients (keep 0, take 1), so the loop has no
 * branch. */
#include <stdlib.h>

#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"
#include "backend/optim_rules.h"

typedef struct {
  float keep, take; /* buf = keep * buf + take * g */
} sgd_coef;

typedef struct {
  float inv_scale, lr, wd_before, wd_after, momentum, nest_g, nest_buf;
  const sgd_coef *coef;
} sgd_ctx;

APEX__INLINE void sgd_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const sgd_ctx *c = vctx;
  const float *g = t->p[0];
  float *p = t->p[1];
  const float inv = c->inv_scale, lr = c->lr, wb = c->wd_before, wa = c->wd_after;
  if (c->momentum == 0.0f) {
    for (size_t i = 0; i < t->n; i++) p[i] = apex__sgd_rule(g[i], p[i], NULL, 0, inv, wb, wa, 0.0f, 0.0f, 0.0f, 0.0f, lr);
  } else {
    float *buf = t->p[2];
    const float keep = c->coef[t->tensor].keep, take = c->coef[t->tensor].take;
    const float ng = c->nest_g, nb = c->nest_buf;
    for (size_t i = 0; i < t->n; i++) p[i] = apex__sgd_rule(g[i], p[i], &buf[i], 1, inv, wb, wa, keep, take, ng, nb, lr);
  }
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(sgd_tile);

apex_status apex__cpu_sgd_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  const apex__cpu_active *a = s->a;
  sgd_coef *coef = malloc((size_t)a->n * sizeof *coef);
  if (!coef) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "SGD step: out of memory");
  for (int i = 0; i < a->n; i++)
    coef[i] = a->step[i] == 1 ? (sgd_coef){0.0f, 1.0f} : (sgd_coef){o->momentum, 1.0f - o->dampening};
  int after = apex__on(o->wd_after_momentum), nesterov = apex__on(o->nesterov);
  sgd_ctx c = {.inv_scale = s->inv_scale, .lr = o->lr, .wd_before = after ? 0.0f : o->weight_decay,
               .wd_after = after ? o->weight_decay : 0.0f, .momentum = o->momentum,
               .nest_g = nesterov ? 1.0f : 0.0f, .nest_buf = nesterov ? o->momentum : 1.0f, .coef = coef};
  int nlists = o->momentum != 0.0f ? 3 : 2;
  apex_status st = apex__optim_run(a, 0, nlists, (1u << nlists) - 2u, &sgd_tile, &c, "SGD step");
  free(coef);
  return st;
}
