/* optim_rules.h: the element update rules of the optimizers, written once for both backends: the CPU
 * tile kernels (backend/cpu/optim_<kind>.c) and the CUDA steps (backend/cuda/optim.cu for the elementwise
 * kinds, lamb.cu, novograd.cu, adamp.cu) call the same functions, so the two cannot drift apart and
 * compute the same bits (the CUDA files are compiled with -fmad=false, and ISO C does not contract, so
 * neither side fuses a multiply and an add).
 *
 * A rule that takes a square root is split around it: the part before returns what goes under the root,
 * the part after takes its root. The CPU runs each part as its own loop over a tile with a vector sqrt in
 * between (so that every loop vectorises); the GPU runs them back to back on one element in registers.
 * Per-tensor coefficients (bias corrections, SGD's first-step momentum, Adagrad's decayed lr) are
 * computed by each backend from the step count and passed in. */
#ifndef APEX_BACKEND_OPTIM_RULES_H
#define APEX_BACKEND_OPTIM_RULES_H

#include "core/convert_scalar.h" /* APEX_HD */

#if defined(__CUDACC__)
#define APEX_RULE static APEX_HD __forceinline__
#else
/* always_inline: each SIMD copy of a tile kernel (backend/cpu/simd_kernel.h) inlines the rule for its target. */
#define APEX_RULE static inline __attribute__((always_inline))
#endif

/* SGD: d = g * inv + wb * p; with momentum, buf = keep * buf + take * d and d = ng * d + nb * buf; the new
 * p = p - lr * (d + wa * p). wb / wa: weight decay before / after momentum; keep, take: 0, 1 at a
 * parameter's first step, else momentum, 1 - dampening; ng, nb: 1, momentum for Nesterov, else 0, 1. */
APEX_RULE float apex__sgd_rule(float g, float p, float *buf, int momentum, float inv, float wb, float wa, float keep,
                               float take, float ng, float nb, float lr) {
  float d = g * inv + wb * p;
  if (momentum) {
    float b = keep * *buf + take * d;
    *buf = b;
    d = ng * d + nb * b;
  }
  return p - lr * (d + wa * p);
}

/* Adam / AdamW before the root: gi = g * inv + l2 * p, m and v updated in place (nb1 = 1 - b1,
 * nb2 = 1 - b2); returns the new v. */
APEX_RULE float apex__adam_moments(float g, float p, float *m, float *v, float inv, float l2, float b1, float nb1,
                                   float b2, float nb2) {
  float gi = g * inv + l2 * p;
  float mi = b1 * *m + nb1 * gi;
  float vi = b2 * *v + nb2 * gi * gi;
  *m = mi;
  *v = vi;
  return vi;
}
/* amsgrad: the running maximum of v, which replaces v under the root. */
APEX_RULE float apex__adam_amsgrad(float *vmax, float v) {
  float x = *vmax > v ? *vmax : v;
  *vmax = x;
  return x;
}
/* After the root: the new p from m and root = sqrt(v or vmax); ss = lr / bc1, ib = 1 / sqrt(bc2), decay =
 * 1 - lr * wd for AdamW, else 1. */
APEX_RULE float apex__adam_apply(float p, float m, float root, float decay, float ss, float ib, float eps) {
  return p * decay - ss * (m / (root * ib + eps));
}

/* Adagrad before the root: gi = g * inv + l2 * p and h += gi * gi in place; returns gi. */
APEX_RULE float apex__adagrad_accum(float g, float p, float *h, float inv, float l2) {
  float gi = g * inv + l2 * p;
  *h = *h + gi * gi;
  return gi;
}
/* After the root (root = sqrt(h)): clr = lr / (1 + (step - 1) * lr_decay); ww: decoupled weight decay. */
APEX_RULE float apex__adagrad_apply(float p, float gi, float root, float clr, float eps, float ww) {
  return p - clr * (gi / (root + eps) + ww * p);
}

/* Adadelta before the roots: gi = g * inv + wd * p and sq = rho * sq + nrho * gi * gi in place; returns gi.
 * The roots are sqrt(sq + eps) and sqrt(acc + eps), acc as it was before this step. */
APEX_RULE float apex__adadelta_accum(float g, float p, float *sq, float inv, float wd, float rho, float nrho) {
  float gi = g * inv + wd * p;
  *sq = rho * *sq + nrho * gi * gi;
  return gi;
}
/* After the roots: delta = root_acc / root_sq * gi, acc updated in place, the new p returned. */
APEX_RULE float apex__adadelta_apply(float p, float gi, float root_acc, float root_sq, float *acc, float rho, float nrho,
                                     float lr) {
  float delta = root_acc / root_sq * gi;
  *acc = rho * *acc + nrho * delta * delta;
  return p - lr * delta;
}

/* RMSprop (tf = 0) and RMSpropTF (tf = 1, a compile-time constant at every call) before the root: gi =
 * g * inv + l2 * p into *gi and the square average updated in place (na = 1 - alpha); returns it. */
APEX_RULE float apex__rmsprop_square(float g, float p, float *sq, float *gi, float inv, float l2, float a, float na,
                                     int tf) {
  float x = g * inv + l2 * p;
  float s = tf ? *sq + na * (x * x - *sq) : a * *sq + na * x * x;
  *sq = s;
  *gi = x;
  return s;
}
/* centered: the gradient average ga updated in place; returns d - ga^2, d the square average. */
APEX_RULE float apex__rmsprop_center(float d, float gi, float *ga, float a, float na, int tf) {
  float x = tf ? *ga + na * (gi - *ga) : a * *ga + na * gi;
  *ga = x;
  return d - x * x;
}
/* After the root (root = sqrt(d + eps_in); eps_in, eps_out: eps, 0 for RMSpropTF, else 0, eps); decay = 1 -
 * lr * wd for decoupled decay, else 1. Without momentum: the new p. */
APEX_RULE float apex__rmsprop_apply(float p, float gi, float root, float eps_out, float decay, float lr) {
  return p * decay - lr * (gi / (root + eps_out));
}
/* With momentum: buf = m * buf + bl * gi / (root + eps_out) in place, the new p = p * decay - pl * buf (bl, pl:
 * lr, 1 with lr_in_momentum, else 1, lr). */
APEX_RULE float apex__rmsprop_apply_buf(float p, float gi, float root, float *buf, float eps_out, float decay, float m,
                                        float bl, float pl) {
  float b = m * *buf + bl * (gi / (root + eps_out));
  *buf = b;
  return p * decay - pl * b;
}

/* LAMB's moments are Adam's (apex__adam_moments with nb1 = beta3: 1 - beta1 with grad_averaging, else 1).
 * After the root (root = sqrt(v * ib2)): the update direction u = (m * ib1) / (root + eps) + ww * p, ib1,
 * ib2 = 1 / bc1, 1 / bc2, ww: the decoupled weight decay (adam_w_mode) or 0. */
APEX_RULE float apex__lamb_update(float m, float root, float p, float ib1, float eps, float ww) {
  return (m * ib1) / (root + eps) + ww * p;
}

/* NovoGrad's element update, after the per-tensor coefficients: ib1 = 1 / bc1, id = 1 / (v / bc2 + eps) from
 * the tensor's gradient-norm moment v. m updated in place, the new p returned; reg_inside (a compile-time
 * constant at each CPU call): the weight decay goes into the moment, else into the step. */
APEX_RULE float apex__novograd_rule(float g, float p, float *m, float inv, float id, float ib1, float lr, float b1,
                                    float b3, float wd, int reg_inside) {
  if (reg_inside) {
    float mi = b1 * *m + b3 * (g * inv * id + wd * p);
    *m = mi;
    return p - lr * (mi * ib1);
  }
  float mi = b1 * *m + b3 * (g * inv);
  *m = mi;
  return p - lr * (mi * ib1 * id + wd * p);
}

/* AdamP before the root: m and v updated in place from gi (the gradient already unscaled; nb1 = 1 - b1,
 * nb2 = 1 - b2). */
APEX_RULE void apex__adamp_moments(float gi, float *m, float *v, float b1, float nb1, float b2, float nb2) {
  *m = b1 * *m + nb1 * gi;
  *v = b2 * *v + nb2 * gi * gi;
}
/* After the root (root = sqrt(v)): the perturbation (nm * m + ng * gi) / (root * ib + eps), ib = 1 / sqrt(bc2);
 * nm, ng: b1, 1 - b1 with Nesterov, else 1, 0. */
APEX_RULE float apex__adamp_perturb(float m, float gi, float root, float ib, float eps, float nm, float ng) {
  return (nm * m + ng * gi) / (root * ib + eps);
}
/* The new p from the perturbation u and its row's projection coefficient rc (0 when not projected); ss = lr /
 * bc1, decay = 1 - lr * wd * (the weight decay ratio). */
APEX_RULE float apex__adamp_apply(float p, float u, float rc, float decay, float ss) {
  return p * decay - ss * (u - rc * p);
}

#endif
