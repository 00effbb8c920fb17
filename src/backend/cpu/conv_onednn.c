/* conv_onednn.c: conv2d's per-image products in bf16 on oneDNN (conv_onednn.h), for conv.c.
 *
 * Why this shape of path: two ways were measured on the benchmark CNN's convolutions (bench_models.c's
 * cnn: [1, 28, 28] -> 32 and [32, 14, 14] -> 64, 3x3, padding 1), one image, one thread, oneDNN 2.6.3
 * on this VM's AVX512_BF16 CPU (no AMX), bf16 in, f32 out, microseconds for forward + backward data +
 * backward weights:
 *   (a) oneDNN's convolution primitive per image: with plain NCHW/OIHW memory it falls back to its
 *       gemm-based f32 implementation, 717 (first conv) and 1624 us (second); with the blocked
 *       layouts it picks (format_tag_any) 21 and 130 us (forward 2.1 and 15, backward weights 3.1
 *       and 101), before the reorders between NCHW and the blocked layouts each image would need.
 *   (b) bf16 im2col + oneDNN's matmul (brgemm) per image: the three products take 6.2 and 49 us
 *       (418 to 473 GFLOP/s on the second conv's [64, 288] x [288, 196], its transposes and the
 *       weight gradient's [64, 196] x [196, 288]); im2col and col2im add about 15 us to the second.
 * (b) is kept: about twice as fast on the second conv, which is nearly all of the CNN's convolution
 * work, and it keeps conv.c's image loop, its cols and its fixed sums over images, so determinism
 * comes from the same place as the f32 path's. For the f32 sgemm the same products run at about 105
 * GFLOP/s. The CNN's training step (bench_amp, ratio of step time to O0, median of 8 interleaved
 * runs against a build without this path, on the shared VM at load 5 to 8): O1 1.04 -> 0.76, O2
 * 1.07 -> 0.76.
 *
 * Each product is apex__gemm_onednn (gemm_onednn.c) with one tile: one single-threaded matmul over
 * the whole image, its primitive created once per shape and cached there, with its f32-operand
 * rounding (the f32 output gradient to bf16, a panel at a time) and its f16 rules. Its workspace here
 * is the calling thread's own, grown on first use, since conv.c runs it inside its own threads. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_onednn.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "core/internal.h"

static unsigned long products;

unsigned long apex__conv_onednn_products(void) { return __atomic_load_n(&products, __ATOMIC_RELAXED); }

int apex__conv_onednn_wanted(apex_dtype x, apex_dtype w) {
  return x == w && (x == APEX_BF16 || x == APEX_F16) && apex__onednn_active(NULL);
}

apex__conv_dnn_scratch *apex__conv_onednn_scratch(int n) {
  apex__conv_dnn_scratch *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
  if (!s) apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): no memory for %d threads' scratch; free memory", n);
  return s;
}

void apex__conv_onednn_release(apex__conv_dnn_scratch *s, int n) {
  for (int i = 0; s && i < n; i++) {
    free(s[i].pad);
    free(s[i].acc);
  }
  free(s);
}

/* *buf with at least bytes, grown (its old contents dropped) when smaller; NULL after a message. */
static void *grow(void **buf, size_t *have, size_t bytes) {
  if (bytes <= *have) return *buf;
  free(*buf);
  *have = 0;
  if (!(*buf = malloc(bytes ? bytes : 1))) {
    apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): no memory for %zu bytes of product scratch; free memory", bytes);
    return NULL;
  }
  *have = bytes;
  return *buf;
}

static void *pad_get(void *ctx, size_t bytes) {
  apex__conv_dnn_scratch *s = ctx;
  return grow(&s->pad, &s->pad_bytes, bytes);
}

/* C [m, n] (f32, ldc n) = op(A) op(B) + beta C as one tile. */
static apex_status product(apex__conv_dnn_scratch *s, int m, int n, int k, apex__mat a, apex__mat b, float beta, float *c) {
  apex_nn_workspace ws = {pad_get, s};
  apex_status st = apex__gemm_onednn(&ws, m, n, k, 1.0f, a, b, beta, c, APEX_F32, n, NULL, m, n);
  if (st == APEX_OK) __atomic_fetch_add(&products, 1, __ATOMIC_RELAXED);
  return st;
}

apex_status apex__conv_onednn_fwd(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *cols,
                                  const float *bias, void *out, apex_dtype out_dtype) {
  float *acc = out_dtype == APEX_F32 ? out : grow((void **)&s->acc, &s->acc_bytes, (size_t)o * p * sizeof(float));
  if (!acc) return APEX_ERR_OUT_OF_MEMORY;
  apex_status st = product(s, o, p, k, (apex__mat){w, dt, k, 0}, (apex__mat){cols, dt, p, 0}, 0.0f, acc);
  if (st != APEX_OK) return st;
  for (int r = 0; r < o; r++) {
    float *v = acc + (size_t)r * p;
    if (bias)
      for (int x = 0; x < p; x++) v[x] += bias[r];
    if (out_dtype != APEX_F32) apex__convert_range((char *)out + (size_t)r * p * apex_dtype_size(out_dtype), out_dtype, v, APEX_F32, (size_t)p);
  }
  return APEX_OK;
}

apex_status apex__conv_onednn_wgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const float *gout, const uint16_t *cols, apex_dtype dt,
                                    float *part, int add) {
  return product(s, o, k, p, (apex__mat){gout, APEX_F32, p, 0}, (apex__mat){cols, dt, p, 1}, add ? 1.0f : 0.0f, part);
}

apex_status apex__conv_onednn_dgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const float *gout,
                                    float *gcols) {
  return product(s, k, p, o, (apex__mat){w, dt, k, 1}, (apex__mat){gout, APEX_F32, p, 0}, 0.0f, gcols);
}
