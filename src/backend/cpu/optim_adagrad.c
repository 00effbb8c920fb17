/* adagrad.c: Adagrad as torch.optim.Adagrad (PyTorch 1.13) with Apex FusedAdagrad's adagrad_w_mode:
 *     g = g / scale (+ wd * p unless adagrad_w_mode)
 *     sum += g * g
 *     p -= clr * (g / (sqrt(sum) + eps) + wd * p if adagrad_w_mode)
 * with clr = lr / (1 + (step - 1) * lr_decay) per parameter, and sum starting at
 * initial_accumulator_value. */
#include <stdlib.h>

#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

typedef struct {
  float inv_scale, eps, l2, wd_w;
  const float *clr; /* per tensor */
} adagrad_ctx;

APEX__INLINE void adagrad_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const adagrad_ctx *c = vctx;
  const float *g = t->p[0];
  float *p = t->p[1], *h = t->p[2];
  const float inv = c->inv_scale, l2 = c->l2, eps = c->eps, ww = c->wd_w, clr = c->clr[t->tensor];
  float gs[APEX_MT_TILE], d[APEX_MT_TILE];
  for (size_t i = 0; i < t->n; i++) {
    gs[i] = apex__adagrad_accum(g[i], p[i], &h[i], inv, l2);
    d[i] = h[i];
  }
  apex__optim_sqrt(d, t->n);
  for (size_t i = 0; i < t->n; i++) p[i] = apex__adagrad_apply(p[i], gs[i], d[i], clr, eps, ww);
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(adagrad_tile);

apex_status apex__cpu_adagrad_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  const apex__cpu_active *a = s->a;
  float *clr = malloc((size_t)a->n * sizeof *clr);
  if (!clr) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "Adagrad step: out of memory");
  for (int i = 0; i < a->n; i++) clr[i] = (float)(o->lr / (1.0 + (double)(a->step[i] - 1) * o->lr_decay));
  int w = apex__on(o->adagrad_w_mode);
  adagrad_ctx c = {.inv_scale = s->inv_scale, .eps = o->eps, .l2 = w ? 0.0f : o->weight_decay,
                   .wd_w = w ? o->weight_decay : 0.0f, .clr = clr};
  apex_status st = apex__optim_run(a, 0, 3, 6u, &adagrad_tile, &c, "Adagrad step");
  free(clr);
  return st;
}
