/* kernels.c: the multi-tensor kernels of Apex (scale, axpby, check_finite, l2norm, unscale_l2norm) over the
 * applier in apply.c. Each tile kernel is a plain loop over f32 that the compiler vectorises; the
 * non-finite test works on the exponent bits so that it vectorises too and is immune to
 * -ffinite-math-only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apex/multi_tensor.h"
#include "core/internal.h"
#include "multi_tensor/simd_kernel.h"
#include "multi_tensor/mt_cuda.h"

/* 1 when v is Inf or NaN (all exponent bits set). */
APEX__INLINE unsigned nonfinite_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return (u & 0x7F800000u) == 0x7F800000u;
}

/* ---- scale ---- */
APEX__INLINE void scale_tile_body(void *ctx, const apex_mt_tile *t, int *nonfinite) {
  const float s = *(const float *)ctx;
  const float *x = t->p[0];
  float *y = t->p[1];
  unsigned bad = 0;
  for (size_t i = 0; i < t->n; i++) {
    float v = x[i];
    bad |= nonfinite_bits(v);
    y[i] = v * s;
  }
  *nonfinite = bad != 0;
}
APEX__SIMD_KERNEL(scale_tile);

apex_status apex_mt_scale(size_t chunk_size, int *overflow, apex_tensor *const *in, apex_tensor *const *out, int n,
                          float scale) {
  if (apex__mt_on_cuda(in, n)) return apex__mt_cuda_scale(overflow, in, out, n, scale);
  apex_mt_launch L = {.chunk_size = chunk_size, .nlists = 2, .ntensors = n, .lists = {in, out}, .written = 2u,
                      .kernel = apex__simd_pick(&scale_tile), .ctx = &scale, .name = "apex_mt_scale"};
  return apex_multi_tensor_apply(&L, overflow);
}

apex_status apex_mt_unscale_flat(apex_tensor *flat_grads, float inv_scale, int *overflow) {
  if (!flat_grads) return apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_unscale_flat: NULL gradient buffer");
  return apex_mt_scale(0, overflow, &flat_grads, &flat_grads, 1, inv_scale);
}

/* ---- axpby ---- */
typedef struct {
  float a, b;
  int check;
} axpby_ctx;

APEX__INLINE void axpby_tile_body(void *ctx, const apex_mt_tile *t, int *nonfinite) {
  const axpby_ctx *c = ctx;
  const float *x = t->p[0], *y = t->p[1];
  float *out = t->p[2];
  unsigned bad = 0;
  const unsigned cx = c->check != 1, cy = c->check != 0;
  for (size_t i = 0; i < t->n; i++) {
    float xv = x[i], yv = y[i];
    bad |= (cx & nonfinite_bits(xv)) | (cy & nonfinite_bits(yv));
    out[i] = c->a * xv + c->b * yv;
  }
  *nonfinite = bad != 0;
}
APEX__SIMD_KERNEL(axpby_tile);

apex_status apex_mt_axpby(size_t chunk_size, int *overflow, apex_tensor *const *x, apex_tensor *const *y,
                          apex_tensor *const *out, int n, float a, float b, int arg_to_check) {
  if (arg_to_check < -1 || arg_to_check > 1)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_axpby: arg_to_check is %d; use -1 (both), 0 (x) or 1 (y)", arg_to_check);
  if (apex__mt_on_cuda(x, n)) return apex__mt_cuda_axpby(overflow, x, y, out, n, a, b, arg_to_check);
  axpby_ctx c = {a, b, arg_to_check};
  apex_mt_launch L = {.chunk_size = chunk_size, .nlists = 3, .ntensors = n, .lists = {x, y, out}, .written = 4u,
                      .kernel = apex__simd_pick(&axpby_tile), .ctx = &c, .name = "apex_mt_axpby"};
  return apex_multi_tensor_apply(&L, overflow);
}

/* ---- check_finite ---- */
APEX__INLINE void finite_tile_body(void *ctx, const apex_mt_tile *t, int *nonfinite) {
  (void)ctx;
  const float *x = t->p[0];
  unsigned bad = 0;
  for (size_t i = 0; i < t->n; i++) bad |= nonfinite_bits(x[i]);
  *nonfinite = bad != 0;
}
APEX__SIMD_KERNEL(finite_tile);

apex_status apex_mt_check_finite(apex_tensor *const *tensors, int n, int *found_inf) {
  if (!found_inf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_check_finite: NULL found_inf (pass the int to set)");
  int flag = 0; /* the caller's int changes only on success */
  apex_status st;
  if (apex__mt_on_cuda(tensors, n)) {
    st = apex__mt_cuda_check_finite(&flag, tensors, n);
  } else {
    apex_mt_launch L = {.chunk_size = 0, .nlists = 1, .ntensors = n, .lists = {tensors}, .written = 0u,
                        .kernel = apex__simd_pick(&finite_tile), .ctx = NULL, .name = "apex_mt_check_finite"};
    st = apex_multi_tensor_apply(&L, &flag);
  }
  if (st == APEX_OK) *found_inf = flag;
  return st;
}

/* ---- l2norm ---- */
typedef struct {
  float inv_scale;
  double *partial; /* one sum of squares per chunk */
} norm_ctx;

/* Eight running f32 sums combined in a fixed order: vectorisable and the same on every run. */
APEX__INLINE void norm_tile_body(void *ctx, const apex_mt_tile *t, int *nonfinite) {
  norm_ctx *c = ctx;
  const float *x = t->p[0];
  const float s = c->inv_scale;
  float acc[8] = {0};
  unsigned bad = 0;
  size_t i = 0;
  for (; i + 8 <= t->n; i += 8)
    for (int k = 0; k < 8; k++) {
      float v = x[i + k] * s;
      bad |= nonfinite_bits(x[i + k]);
      acc[k] += v * v;
    }
  for (int k = 0; i < t->n; i++, k++) {
    float v = x[i] * s;
    bad |= nonfinite_bits(x[i]);
    acc[k] += v * v;
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  c->partial[t->chunk] += sum;
  *nonfinite = bad != 0;
}
APEX__SIMD_KERNEL(norm_tile);

static apex_status norm_launch(const char *name, size_t chunk_size, int *overflow, apex_tensor *const *x, int n,
                               float inv_scale, float *global_norm, float *per_tensor) {
  if (n < 0) return apex__fail(APEX_ERR_INVALID_ARG, "%s: negative tensor count %d", name, n);
  if (n > 0 && !x) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL tensor list", name);
  for (int i = 0; i < n; i++)
    if (!x[i]) return apex__fail(APEX_ERR_INVALID_ARG, "%s: tensor %d is NULL", name, i);
  size_t *chunk_start = malloc(((size_t)n + 1) * sizeof *chunk_start);
  size_t total = chunk_start ? apex_mt_chunk_count(chunk_size, x, n, chunk_start) : 0;
  double *partial = calloc(total ? total : 1, sizeof *partial);
  if (!chunk_start || !partial) {
    free(chunk_start);
    free(partial);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
  }
  norm_ctx c = {inv_scale, partial};
  apex_mt_launch L = {.chunk_size = chunk_size, .nlists = 1, .ntensors = n, .lists = {x}, .written = 0u,
                      .kernel = apex__simd_pick(&norm_tile), .ctx = &c, .name = name};
  apex_status st = apex_multi_tensor_apply(&L, overflow);
  if (st == APEX_OK) {
    double global = 0;
    for (int i = 0; i < n; i++) {
      double sq = 0;
      for (size_t k = chunk_start[i]; k < chunk_start[i + 1]; k++) sq += partial[k];
      if (per_tensor) per_tensor[i] = (float)sqrt(sq);
      global += sq;
    }
    if (global_norm) *global_norm = (float)sqrt(global);
  }
  free(chunk_start);
  free(partial);
  return st;
}

apex_status apex_mt_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n, float *global_norm,
                           float *per_tensor) {
  if (apex__mt_on_cuda(x, n)) return apex__mt_cuda_l2norm("apex_mt_l2norm", overflow, x, n, 1.0f, global_norm, per_tensor);
  return norm_launch("apex_mt_l2norm", chunk_size, overflow, x, n, 1.0f, global_norm, per_tensor);
}

apex_status apex_mt_unscale_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n, float inv_scale,
                                   float *global_norm, float *per_tensor) {
  if (apex__mt_on_cuda(x, n))
    return apex__mt_cuda_l2norm("apex_mt_unscale_l2norm", overflow, x, n, inv_scale, global_norm, per_tensor);
  return norm_launch("apex_mt_unscale_l2norm", chunk_size, overflow, x, n, inv_scale, global_norm, per_tensor);
}
