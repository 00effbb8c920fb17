/* rmsprop.c: RMSprop as torch.optim.RMSprop (PyTorch 1.13), and RMSpropTF as timm's RMSpropTF
 * (TensorFlow's variant). One kernel, since they differ in four places:
 *                       RMSprop                          RMSpropTF
 *     square average    sq = alpha * sq + (1-alpha) g^2   sq += (1-alpha) (g^2 - sq), starts at 1
 *     centered          ga = alpha * ga + (1-alpha) g     ga += (1-alpha) (g - ga)
 *     denominator       sqrt(sq - ga^2) + eps             sqrt(sq - ga^2 + eps)
 *     momentum          buf = m buf + g / d; p -= lr buf  lr_in_momentum: buf = m buf + lr g / d; p -= buf
 *     weight decay      L2                                L2, or decoupled_decay: p *= 1 - lr wd
 * Without momentum both do p -= lr * g / d. State slots: square average, then the momentum buffer
 * (momentum > 0), then the gradient average (centered). */
#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

typedef struct {
  float inv_scale, lr, alpha, eps, l2, decay, momentum;
  float buf_lr, p_lr; /* buf = momentum * buf + buf_lr * g / d;  p -= p_lr * buf */
  int tf, centered, buf_list, avg_list;
} rms_ctx;

APEX__INLINE void rms_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const rms_ctx *c = vctx;
  const float *g = t->p[0];
  float *p = t->p[1], *sq = t->p[2];
  const float inv = c->inv_scale, l2 = c->l2, a = c->alpha, na = 1.0f - c->alpha, eps = c->eps;
  float gs[APEX_MT_TILE], d[APEX_MT_TILE];
  /* tf is passed as a constant in each loop, so that each inlines its own rule and vectorises. */
  if (c->tf)
    for (size_t i = 0; i < t->n; i++) d[i] = apex__rmsprop_square(g[i], p[i], &sq[i], &gs[i], inv, l2, a, na, 1);
  else
    for (size_t i = 0; i < t->n; i++) d[i] = apex__rmsprop_square(g[i], p[i], &sq[i], &gs[i], inv, l2, a, na, 0);
  if (c->centered) {
    float *ga = t->p[c->avg_list];
    if (c->tf)
      for (size_t i = 0; i < t->n; i++) d[i] = apex__rmsprop_center(d[i], gs[i], &ga[i], a, na, 1);
    else
      for (size_t i = 0; i < t->n; i++) d[i] = apex__rmsprop_center(d[i], gs[i], &ga[i], a, na, 0);
  }
  const float eps_in = c->tf ? eps : 0.0f, eps_out = c->tf ? 0.0f : eps;
  for (size_t i = 0; i < t->n; i++) d[i] = d[i] + eps_in;
  apex__optim_sqrt(d, t->n);
  const float decay = c->decay, lr = c->lr;
  if (c->buf_list) {
    float *buf = t->p[c->buf_list];
    const float m = c->momentum, bl = c->buf_lr, pl = c->p_lr;
    for (size_t i = 0; i < t->n; i++) p[i] = apex__rmsprop_apply_buf(p[i], gs[i], d[i], &buf[i], eps_out, decay, m, bl, pl);
  } else {
    for (size_t i = 0; i < t->n; i++) p[i] = apex__rmsprop_apply(p[i], gs[i], d[i], eps_out, decay, lr);
  }
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(rms_tile);

apex_status apex__cpu_rmsprop_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  int tf = s->kind == APEX_OPTIM_RMSPROP_TF;
  int mom = o->momentum > 0.0f, centered = apex__on(o->centered);
  int decoupled = tf && apex__on(o->decoupled_decay), lr_in = tf && apex__on(o->lr_in_momentum);
  rms_ctx c = {.inv_scale = s->inv_scale, .lr = o->lr, .alpha = o->alpha, .eps = o->eps,
               .l2 = decoupled ? 0.0f : o->weight_decay, .decay = decoupled ? 1.0f - o->lr * o->weight_decay : 1.0f,
               .momentum = o->momentum, .buf_lr = lr_in ? o->lr : 1.0f, .p_lr = lr_in ? 1.0f : o->lr, .tf = tf,
               .centered = centered, .buf_list = mom ? 3 : 0, .avg_list = centered ? 3 + mom : 0};
  int nlists = 3 + mom + centered;
  return apex__optim_run(s->a, 0, nlists, (1u << nlists) - 2u, &rms_tile, &c, tf ? "RMSpropTF step" : "RMSprop step");
}
