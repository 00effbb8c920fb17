/* attention.c: the CPU backend's causal scaled-dot-product attention (args_nn.h), forward and
 * backward. Heads run one after another, each product in gemm.c's grid fixed by the shape, so the
 * bits do not depend on the thread count: apex__sgemm for f32 operands (f32 attention's bits as they
 * have always been), apex__gemm for any other.
 *
 * q, k, v are read as stored: apex__gemm widens f16/bf16 operands a tile's panel at a time (the bits
 * of widening the whole tensors, which is the reference), or, for bf16 on a CPU with AVX512_BF16 or
 * AMX, runs the product on oneDNN, which rounds an f32 operand beside a bf16 one to bf16. There the
 * scores S = q k^T come out in f32 from the bf16 q and k, the softmax runs on them in f32, P is
 * rounded to bf16 for the product with v (as PyTorch's bf16 scaled_dot_product_attention on the CPU
 * rounds its probabilities, unnormalised, before that product), and out is written in its own dtype
 * from the f32 sums. The backward's products of the f32 gradients with bf16 q, k, v round those
 * gradients to bf16 in the same way, and P^T dO runs there on P and dO rounded to bf16. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "core/internal.h"

/* A workspace lending one region to each product in turn: a product's scratch is dead once it
 * returns, so the op holds one product's scratch rather than heads x products of it. A request past
 * the region takes a new one twice the size (the old stays valid until the op ends). */
typedef struct reuse_ws {
  const apex_nn_workspace *up;
  char *base;
  size_t cap, used;
} reuse_ws;

static void *reuse_get(void *ctx, size_t bytes) {
  reuse_ws *r = ctx;
  bytes = (bytes + 63) & ~(size_t)63;
  if (r->used + bytes > r->cap) {
    size_t cap = 2 * (r->used + bytes);
    char *p = r->up->get(r->up->ctx, cap);
    if (!p) return NULL;
    r->base = p;
    r->cap = cap;
    r->used = 0;
  }
  void *p = r->base + r->used;
  r->used += bytes;
  return p;
}

/* The product's workspace: the region from its start again. */
static const apex_nn_workspace *fresh(reuse_ws *r, apex_nn_workspace *w) {
  r->used = 0;
  *w = (apex_nn_workspace){reuse_get, r};
  return w;
}

/* Head h's [t, d] block of b as a gemm operand. */
static apex__mat head(apex_nn_buf b, size_t h, size_t td, int d, int trans) {
  return (apex__mat){(const char *)b.data + h * td * apex_dtype_size(b.dtype), b.dtype, d, trans};
}
static apex__mat f32m(const float *p, int ld, int trans) { return (apex__mat){p, APEX_F32, ld, trans}; }

/* C (ct) = alpha op(A) op(B) + beta C. An all-f32 product stays on apex__sgemm, so f32 attention keeps
 * the bits it has always had; any other goes through apex__gemm (per-tile widening, or oneDNN). */
static apex_status prod(reuse_ws *r, int m, int n, int k, float alpha, apex__mat a, apex__mat b, float beta, void *c, apex_dtype ct, int ldc) {
  if (a.dtype == APEX_F32 && b.dtype == APEX_F32 && ct == APEX_F32) {
    apex__sgemm(a.trans, b.trans, m, n, k, alpha, a.data, a.ld, b.data, b.ld, beta, c, ldc);
    return APEX_OK;
  }
  apex_nn_workspace w;
  return apex__gemm(fresh(r, &w), m, n, k, alpha, a, b, beta, c, ct, ldc, NULL);
}

apex_status apex__cpu_nn_attention(const apex_nn_attention_args *a) {
  int t = a->t, d = a->d;
  size_t tt = (size_t)t * t, td = (size_t)t * d, es = apex_dtype_size(a->out_dtype);
  float *P = a->p;
  float scale = 1.0f / sqrtf((float)d);
  reuse_ws r = {&a->ws, NULL, 0, 0};
  for (size_t h = 0; h < a->heads; h++) {
    float *ph = P + h * tt;
    apex_status st = prod(&r, t, t, d, scale, head(a->q, h, td, d, 0), head(a->k, h, td, d, 1), 0.0f, ph, APEX_F32, t);
    if (st != APEX_OK) return st;
    for (int i = 0; i < t; i++) {
      float *row = ph + (size_t)i * t, mx = -INFINITY, s = 0.0f;
      for (int j = 0; j <= i; j++) mx = apex__cpu_line_max(mx, row[j]);
      for (int j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
      for (int j = 0; j <= i; j++) row[j] /= s;
      for (int j = i + 1; j < t; j++) row[j] = 0.0f;
    }
    st = prod(&r, t, d, t, 1.0f, f32m(ph, t, 0), head(a->v, h, td, d, 0), 0.0f, (char *)a->out + h * td * es, a->out_dtype, d);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_attention_bwd(const apex_nn_attention_bwd_args *a) {
  int t = a->t, d = a->d;
  size_t tt = (size_t)t * t, td = (size_t)t * d, n = a->heads * td;
  const float *P = a->p, *go = a->gout;
  float *gq = a->gq, *gk = a->gk, *gv = a->gv;
  float *dS = gq || gk ? a->ws.get(a->ws.ctx, tt * sizeof(float)) : NULL;
  if ((gq || gk) && !dS) return APEX_ERR_OUT_OF_MEMORY;
  /* P^T dO has two f32 operands; where v's product runs on oneDNN, dO goes in as bf16 (rounded here,
   * and P beside it by oneDNN) so that this product runs there too, as PyTorch's bf16 backward does */
  uint16_t *go16 = gv && a->v.dtype == APEX_BF16 && apex__onednn_active(NULL) ? a->ws.get(a->ws.ctx, td * sizeof(uint16_t)) : NULL;
  if (gv && a->v.dtype == APEX_BF16 && apex__onednn_active(NULL) && !go16) return APEX_ERR_OUT_OF_MEMORY;
  /* the products add into their gradients (beta 1): one that holds nothing yet is zeroed first */
  if (gq && !a->accumulate_q) memset(gq, 0, n * sizeof *gq);
  if (gk && !a->accumulate_k) memset(gk, 0, n * sizeof *gk);
  if (gv && !a->accumulate_v) memset(gv, 0, n * sizeof *gv);
  float scale = 1.0f / sqrtf((float)d);
  reuse_ws r = {&a->ws, NULL, 0, 0};
  for (size_t h = 0; h < a->heads; h++) {
    const float *ph = P + h * tt, *gh = go + h * td;
    apex__mat gom = f32m(gh, d, 0);
    if (go16) {
      apex__convert_range(go16, APEX_BF16, gh, APEX_F32, td);
      gom = (apex__mat){go16, APEX_BF16, d, 0};
    }
    if (gv && prod(&r, t, d, t, 1.0f, f32m(ph, t, 1), gom, 1.0f, gv + h * td, APEX_F32, d) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
    if (!gq && !gk) continue;
    if (prod(&r, t, t, d, 1.0f, f32m(gh, d, 0), head(a->v, h, td, d, 1), 0.0f, dS, APEX_F32, t) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < t; i++) {
      float *row = dS + (size_t)i * t;
      const float *pr = ph + (size_t)i * t;
      float s = 0.0f;
      for (int j = 0; j <= i; j++) s += row[j] * pr[j];
      for (int j = 0; j < t; j++) row[j] = j <= i ? pr[j] * (row[j] - s) * scale : 0.0f;
    }
    if (gq && prod(&r, t, d, t, 1.0f, f32m(dS, t, 0), head(a->k, h, td, d, 0), 1.0f, gq + h * td, APEX_F32, d) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
    if (gk && prod(&r, t, d, t, 1.0f, f32m(dS, t, 1), head(a->q, h, td, d, 0), 1.0f, gk + h * td, APEX_F32, d) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
  }
  return APEX_OK;
}
