/* multi_tensor.c: the CPU backend's multi-tensor slots (backend/args_mt.h): scale, axpby and the L2
 * norms of Apex, and the fused bf16 flush + unscale of amp's O2 chain, over the applier in mt_apply.c. Each tile kernel is a plain loop over f32 that the compiler vectorises; the
 * non-finite test works on the exponent bits so that it vectorises too and is immune to
 * -ffinite-math-only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apex/mt_apply.h"
#include "backend/cpu/cpu_backend.h"
#include "core/internal.h"
#include "backend/cpu/simd_kernel.h"
#include "core/convert_scalar.h"

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

/* Only the non-finite test, for a scale without an output (the loss scaler's check). */
APEX__INLINE void check_tile_body(void *ctx, const apex_mt_tile *t, int *nonfinite) {
  (void)ctx;
  const float *x = t->p[0];
  unsigned bad = 0;
  for (size_t i = 0; i < t->n; i++) bad |= nonfinite_bits(x[i]);
  *nonfinite = bad != 0;
}
APEX__SIMD_KERNEL(check_tile);

/* Raises the caller's flags after a launch that saw a non-finite value. */
static void raise_flags(int bad, int *overflow, int *dev_found_inf) {
  if (bad && overflow) *overflow = 1;
  if (bad && dev_found_inf) *dev_found_inf = 1;
}

apex_status apex__cpu_mt_scale(const apex_mt_scale_args *a) {
  float scale = a->scale;
  if (a->dev_scale) scale = a->dev_inverse ? scale / *a->dev_scale : scale * *a->dev_scale;
  int bad = 0;
  apex_mt_launch L = {.chunk_size = a->chunk_size, .nlists = 2, .ntensors = a->n, .lists = {a->in, a->out},
                      .written = 2u, .kernel = apex__simd_pick(&scale_tile), .ctx = &scale, .name = a->fn};
  if (!a->out) {
    L.nlists = 1;
    L.written = 0u;
    L.kernel = apex__simd_pick(&check_tile);
  }
  apex_status st = apex_multi_tensor_apply(&L, &bad);
  raise_flags(bad, a->overflow, a->dev_found_inf);
  return st;
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

apex_status apex__cpu_mt_axpby(const apex_mt_axpby_args *a) {
  axpby_ctx c = {a->a, a->b, a->arg_to_check};
  apex_mt_launch L = {.chunk_size = a->chunk_size, .nlists = 3, .ntensors = a->n, .lists = {a->x, a->y, a->out},
                      .written = 4u, .kernel = apex__simd_pick(&axpby_tile), .ctx = &c, .name = a->fn};
  return apex_multi_tensor_apply(&L, a->overflow);
}

/* ---- flush + unscale (args_mt.h) ---- */
typedef struct {
  float scale;
  unsigned char *nonzero_chunk; /* one flag per chunk, so that no two threads write one byte */
} flush_unscale_ctx;

APEX__INLINE float f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* List 0 (the bf16 grad) arrives raw. At scale 1 the multiplication leaves every value as it is
 * (a non-finite rounded sum is Inf or a quiet NaN: apex__f32_to_bf16 quiets NaNs), so one loop
 * serves all scales. */
APEX__INLINE void flush_unscale_tile_body(void *ctx, const apex_mt_tile *t, int *nonfinite) {
  const flush_unscale_ctx *c = ctx;
  const uint16_t *g = (const uint16_t *)(const void *)t->p[0];
  const float *sum = t->p[1];
  float *out = t->p[2];
  const float s = c->scale;
  unsigned bad = 0, nz = 0;
  for (size_t i = 0; i < t->n; i++) {
    nz |= g[i];
    uint32_t r = (uint32_t)apex__f32_to_bf16(f32_of_bits((uint32_t)g[i] << 16) + sum[i]) << 16;
    bad |= (r & 0x7F800000u) == 0x7F800000u;
    out[i] = f32_of_bits(r) * s;
  }
  if (nz) c->nonzero_chunk[t->chunk] = 1;
  *nonfinite = bad != 0;
}
APEX__SIMD_KERNEL(flush_unscale_tile);

apex_status apex__cpu_mt_flush_unscale(const apex_mt_flush_unscale_args *a) {
  const char *fn = a->fn;
  if (a->n < 0 || (a->n > 0 && (!a->grad || !a->sum || !a->out)))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s", fn, a->n < 0 ? "negative tensor count" : "NULL tensor list");
  for (int i = 0; i < a->n; i++) {
    if (!a->grad[i] || !a->sum[i] || !a->out[i]) return apex__fail(APEX_ERR_INVALID_ARG, "%s: tensor %d of a list is NULL", fn, i);
    if (apex_tensor_dtype(a->grad[i]) != APEX_BF16 || apex_tensor_dtype(a->sum[i]) != APEX_F32 || apex_tensor_dtype(a->out[i]) != APEX_F32)
      return apex__fail(APEX_ERR_DTYPE, "%s: tensor %d is %s + %s -> %s; the fused flush takes a bf16 grad, an f32 sum and an f32 out", fn,
                        i, apex_dtype_name(apex_tensor_dtype(a->grad[i])), apex_dtype_name(apex_tensor_dtype(a->sum[i])), apex_dtype_name(apex_tensor_dtype(a->out[i])));
  }
  size_t *chunk_start = malloc(((size_t)a->n + 1) * sizeof *chunk_start);
  size_t total = chunk_start ? apex_mt_chunk_count(a->chunk_size, a->grad, a->n, chunk_start) : 0;
  unsigned char *nz = calloc(total ? total : 1, 1);
  if (!chunk_start || !nz) {
    free(chunk_start);
    free(nz);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  flush_unscale_ctx c = {a->scale, nz};
  apex_mt_launch L = {.chunk_size = a->chunk_size, .nlists = 3, .ntensors = a->n, .lists = {a->grad, a->sum, a->out},
                      .written = 4u, .raw = 1u, .kernel = apex__simd_pick(&flush_unscale_tile), .ctx = &c, .name = fn};
  apex_status st = apex_multi_tensor_apply(&L, a->overflow);
  for (int i = 0; st == APEX_OK && a->nonzero && i < a->n; i++) {
    a->nonzero[i] = 0;
    for (size_t k = chunk_start[i]; k < chunk_start[i + 1]; k++) a->nonzero[i] |= nz[k];
  }
  free(chunk_start);
  free(nz);
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

apex_status apex__cpu_mt_l2norm(const apex_mt_l2norm_args *a) {
  const char *name = a->fn;
  size_t chunk_size = a->chunk_size;
  apex_tensor *const *x = a->x;
  int n = a->n;
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
  norm_ctx c = {a->inv_scale, partial};
  apex_mt_launch L = {.chunk_size = chunk_size, .nlists = 1, .ntensors = n, .lists = {x}, .written = 0u,
                      .kernel = apex__simd_pick(&norm_tile), .ctx = &c, .name = name};
  apex_status st = apex_multi_tensor_apply(&L, a->overflow);
  if (st == APEX_OK) {
    double global = 0;
    for (int i = 0; i < n; i++) {
      double sq = 0;
      for (size_t k = chunk_start[i]; k < chunk_start[i + 1]; k++) sq += partial[k];
      if (a->per_tensor) a->per_tensor[i] = (float)sqrt(sq);
      global += sq;
    }
    if (a->global_norm) *a->global_norm = (float)sqrt(global);
    if (a->dev_global_norm) *a->dev_global_norm = (float)sqrt(global);
    if (a->per_chunk) memcpy(a->per_chunk, partial, total * sizeof *partial);
  }
  free(chunk_start);
  free(partial);
  return st;
}
