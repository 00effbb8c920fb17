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
  if (c->tf) {
    for (size_t i = 0; i < t->n; i++) {
      float gi = g[i] * inv + l2 * p[i];
      float s = sq[i] + na * (gi * gi - sq[i]);
      sq[i] = s;
      gs[i] = gi;
      d[i] = s;
    }
  } else {
    for (size_t i = 0; i < t->n; i++) {
      float gi = g[i] * inv + l2 * p[i];
      float s = a * sq[i] + na * gi * gi;
      sq[i] = s;
      gs[i] = gi;
      d[i] = s;
    }
  }
  if (c->centered) {
    float *ga = t->p[c->avg_list];
    for (size_t i = 0; i < t->n; i++) {
      float x = c->tf ? ga[i] + na * (gs[i] - ga[i]) : a * ga[i] + na * gs[i];
      ga[i] = x;
      d[i] = d[i] - x * x;
    }
  }
  const float eps_in = c->tf ? eps : 0.0f, eps_out = c->tf ? 0.0f : eps;
  for (size_t i = 0; i < t->n; i++) d[i] = d[i] + eps_in;
  apex__optim_sqrt(d, t->n);
  const float decay = c->decay, lr = c->lr;
  if (c->buf_list) {
    float *buf = t->p[c->buf_list];
    const float m = c->momentum, bl = c->buf_lr, pl = c->p_lr;
    for (size_t i = 0; i < t->n; i++) {
      float b = m * buf[i] + bl * (gs[i] / (d[i] + eps_out));
      buf[i] = b;
      p[i] = p[i] * decay - pl * b;
    }
  } else {
    for (size_t i = 0; i < t->n; i++) p[i] = p[i] * decay - lr * (gs[i] / (d[i] + eps_out));
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
