/* adadelta.c: Adadelta as torch.optim.Adadelta (PyTorch 1.13):
 *     g = g / scale + wd * p
 *     sq = rho * sq + (1 - rho) * g * g
 *     delta = sqrt(acc + eps) / sqrt(sq + eps) * g
 *     acc = rho * acc + (1 - rho) * delta * delta
 *     p -= lr * delta */
#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

typedef struct {
  float inv_scale, lr, rho, eps, wd;
} adadelta_ctx;

APEX__INLINE void adadelta_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const adadelta_ctx *c = vctx;
  const float *g = t->p[0];
  float *p = t->p[1], *sq = t->p[2], *acc = t->p[3];
  const float inv = c->inv_scale, rho = c->rho, nrho = 1.0f - c->rho, eps = c->eps, wd = c->wd, lr = c->lr;
  float gs[APEX_MT_TILE], std[APEX_MT_TILE], old[APEX_MT_TILE];
  for (size_t i = 0; i < t->n; i++) {
    gs[i] = apex__adadelta_accum(g[i], p[i], &sq[i], inv, wd, rho, nrho);
    std[i] = sq[i] + eps;
    old[i] = acc[i] + eps;
  }
  apex__optim_sqrt(std, t->n);
  apex__optim_sqrt(old, t->n);
  for (size_t i = 0; i < t->n; i++) p[i] = apex__adadelta_apply(p[i], gs[i], old[i], std[i], &acc[i], rho, nrho, lr);
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(adadelta_tile);

apex_status apex__cpu_adadelta_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  adadelta_ctx c = {s->inv_scale, o->lr, o->rho, o->eps, o->weight_decay};
  return apex__optim_run(s->a, 0, 4, 14u, &adadelta_tile, &c, "Adadelta step");
}
