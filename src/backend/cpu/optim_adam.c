/* adam.c: Adam and AdamW as torch.optim.Adam / AdamW (PyTorch 1.13) and Apex's FusedAdam:
 *     p *= 1 - lr * wd                                  (AdamW: decoupled decay)
 *     g = g / scale (+ wd * p for Adam: L2)
 *     m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g;  vmax = max(vmax, v) (amsgrad)
 *     p -= lr / bc1 * m / (sqrt(v or vmax) / sqrt(bc2) + eps)
 * with bc = 1 - beta^step per parameter (1 without bias_correction). The bias corrections are
 * computed once per tensor and step.
 *
 * The whole group is one applier launch (one parallel region per step, contiguous chunks per thread),
 * and each tile is one pass (adam_tile_pass): with 28 bytes of traffic per f32 parameter the step is
 * bound by memory once the roots and divisions are vectorised, so what counts is touching each
 * stream once. Measured on the 2-core AVX512_BF16 VM, load 2-8 from other users, bench_optim against
 * the build before this pass (interleaved): AdamW over 10M f32 parameters 6.4-6.6 -> 3.7-4.5 ms on one
 * thread (AVX2 copy of the one-pass kernel 4.0-4.1 ms); AdamW over bf16 parameters with f32 masters
 * (bf16 gradients read through the tile, the bf16 copy rounded in the pass) 15-16 -> 50-56 GB/s. */
#include <math.h>
#include <stdlib.h>

#include "core/convert_scalar.h"
#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

typedef struct {
  float step_size;    /* lr / bc1 */
  float inv_bc2_sqrt; /* 1 / sqrt(bc2) */
} adam_coef;

typedef struct {
  float inv_scale, beta1, beta2, eps, l2, decay;
  int amsgrad;
  const adam_coef *coef;
  apex_tensor *const *model; /* the model copies behind masters, NULL entries for none */
  apex_tensor *const *grad;  /* the gradients */
  int raw_grads;             /* they reach the kernel as stored (every one f32 or bf16) */
} adam_ctx;

/* One pass over the tile: each element's moments, root and new p in registers, so that the tile's
 * four (five) streams are read and written once and nothing goes through a scratch buffer; a bf16
 * model copy (O2's master -> model) is rounded from the new p in the same pass, as Apex's fused Adam
 * writes its half copy. The operations and their order are those of the rules (apex__adam_moments,
 * apex__adam_amsgrad, sqrtf, apex__adam_apply) and the rounding is apex__f32_to_bf16's, so every copy
 * gives the bits of update-then-convert and of the CUDA kernel. A bf16 gradient (amp O3, or bf16
 * gradients behind masters) is read as stored and widened in registers, which is exact, so it gives
 * the bits of the applier's widened tile without the tile. amsgrad, the bf16 output and the bf16
 * gradient are compile-time constants at each call, so that every loop vectorises without a branch. */
APEX__INLINE void adam_tile_pass(const adam_ctx *c, const apex_mt_tile *t, int amsgrad, uint16_t *restrict out, int gbf16) {
  const float *restrict g = t->p[0];
  const uint16_t *restrict gb = (const uint16_t *)(const void *)t->p[0];
  float *restrict p = t->p[1], *restrict m = t->p[2], *restrict v = t->p[3];
  float *restrict vmax = amsgrad ? t->p[4] : NULL;
  const float inv = c->inv_scale, b1 = c->beta1, b2 = c->beta2, l2 = c->l2;
  const float nb1 = 1.0f - b1, nb2 = 1.0f - b2;
  const float ss = c->coef[t->tensor].step_size, ib = c->coef[t->tensor].inv_bc2_sqrt, eps = c->eps;
  const float decay = c->decay;
  const size_t n = t->n;
  for (size_t i = 0; i < n; i++) {
    float pi = p[i], mi = m[i], vi = v[i];
    float gi = gbf16 ? apex__bf16_to_f32(gb[i]) : g[i];
    float d = apex__adam_moments(gi, pi, &mi, &vi, inv, l2, b1, nb1, b2, nb2);
    if (amsgrad) d = apex__adam_amsgrad(&vmax[i], d);
    m[i] = mi;
    v[i] = vi;
    float np = apex__adam_apply(pi, mi, sqrtf(d), decay, ss, ib, eps);
    p[i] = np;
    if (out) out[i] = apex__f32_to_bf16(np);
  }
}

APEX__INLINE void adam_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const adam_ctx *c = vctx;
  const apex_tensor *mc = c->model[t->tensor];
  uint16_t *out = mc && apex_tensor_dtype(mc) == APEX_BF16 ? (uint16_t *)apex_tensor_data(mc) + t->offset : NULL;
  int gbf16 = c->raw_grads && apex_tensor_dtype(c->grad[t->tensor]) == APEX_BF16;
  switch ((c->amsgrad ? 1 : 0) | (out ? 2 : 0) | (gbf16 ? 4 : 0)) {
  case 0: adam_tile_pass(c, t, 0, NULL, 0); break;
  case 1: adam_tile_pass(c, t, 1, NULL, 0); break;
  case 2: adam_tile_pass(c, t, 0, out, 0); break;
  case 3: adam_tile_pass(c, t, 1, out, 0); break;
  case 4: adam_tile_pass(c, t, 0, NULL, 1); break;
  case 5: adam_tile_pass(c, t, 1, NULL, 1); break;
  case 6: adam_tile_pass(c, t, 0, out, 1); break;
  default: adam_tile_pass(c, t, 1, out, 1); break;
  }
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(adam_tile);

apex_status apex__cpu_adam_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  const apex__cpu_active *a = s->a;
  adam_coef *coef = malloc((size_t)a->n * sizeof *coef);
  if (!coef) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "Adam step: out of memory");
  int bc = apex__on(o->bias_correction);
  for (int i = 0; i < a->n; i++) {
    double bc1 = bc ? 1.0 - apex__optim_pow(o->beta1, a->step[i]) : 1.0;
    double bc2 = bc ? 1.0 - apex__optim_pow(o->beta2, a->step[i]) : 1.0;
    coef[i] = (adam_coef){(float)(o->lr / bc1), (float)(1.0 / sqrt(bc2))};
  }
  int w = apex__on(o->adam_w_mode), ams = apex__on(o->amsgrad);
  adam_ctx c = {.inv_scale = s->inv_scale, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                .l2 = w ? 0.0f : o->weight_decay, .decay = w ? 1.0f - o->lr * o->weight_decay : 1.0f,
                .amsgrad = ams, .coef = coef, .model = a->model, .grad = a->g};
  int nlists = ams ? 5 : 4;
  /* bf16 gradients are widened in the kernel, unless an f16 one would need the applier's widening. */
  int raw = 1;
  for (int i = 0; i < a->n; i++) raw &= apex_tensor_dtype(a->g[i]) != APEX_F16;
  c.raw_grads = raw;
  apex_status st = apex__optim_run_writing(a, 0, nlists, (1u << nlists) - 2u, &adam_tile, &c, "Adam step", APEX_BF16,
                                           raw ? 1u : 0u);
  free(coef);
  return st;
}
