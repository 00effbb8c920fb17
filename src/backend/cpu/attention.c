/* attention.c: the CPU backend's causal scaled-dot-product attention (args_nn.h), forward and
 * backward. Each product runs in a grid fixed by its shape, so the bits do not depend on the thread
 * count: apex__sgemm for f32 operands (f32 attention's bits as they have always been), apex__gemm for
 * any other. Heads run one after another with the threads on each product, except bf16 heads on
 * oneDNN, which run whole on the threads (run_heads).
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
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "apex/threads.h"
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

/* ---- heads on threads ---------------------------------------------------------------------------- */

/* bf16 attention on oneDNN runs whole heads on threads: a head's products are small ([T, T] x
 * [T, D]: on two threads each was a fork and join of four tiles of microseconds) and its softmax
 * ran on one thread while the others waited. Each head runs on one thread start to end, its
 * products in the same tile grid as on the caller's thread (fixed by the shape), so the bits are
 * those of running the heads one after another, for any thread count. */
static int heads_on_threads(apex_nn_buf q, apex_nn_buf k, apex_nn_buf v, size_t heads) {
  return heads > 1 && q.dtype == APEX_BF16 && k.dtype == APEX_BF16 && v.dtype == APEX_BF16 && apex__onednn_active(NULL);
}

/* A workspace that never grows: a thread's region, sized by head 0's run on the caller's thread
 * (every head asks for the same scratch). */
static void *none_get(void *ctx, size_t bytes) {
  (void)ctx, (void)bytes;
  return NULL;
}
static const apex_nn_workspace no_more = {none_get, NULL};

typedef apex_status (*head_fn)(const void *args, size_t h, reuse_ws *r, char *extra);

/* Runs fn on head 0 here (which sizes a product's scratch) and on heads 1.. over the threads, each
 * with its own region of that size and `extra` bytes of its own. */
static apex_status run_heads(const apex_nn_workspace *ws, size_t heads, size_t extra, head_fn fn, const void *args) {
  extra = (extra + 63) & ~(size_t)63;
  char *x0 = extra ? ws->get(ws->ctx, extra) : NULL;
  if (extra && !x0) return APEX_ERR_OUT_OF_MEMORY;
  reuse_ws r0 = {ws, NULL, 0, 0};
  apex_status st = fn(args, 0, &r0, x0);
  if (st != APEX_OK) return st;
  /* regions for as many threads as could ever run (the cap, not the load), so the pool holds steady */
  size_t cap = r0.cap, per = cap + extra, rest = heads - 1;
  int slots = apex_get_max_threads(), threads = apex_get_num_threads();
  if ((size_t)slots > rest) slots = (int)rest;
  if (slots < 1) slots = 1;
  if (threads > slots) threads = slots;
  char *base = ws->get(ws->ctx, (size_t)slots * per + 64);
  if (!base) return APEX_ERR_OUT_OF_MEMORY;
  base = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
  int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed)
  {
    int old = omp_get_max_threads();
    omp_set_num_threads(1);
    char *mine = base + (size_t)omp_get_thread_num() * per;
    reuse_ws r = {&no_more, mine + extra, cap, 0};
#pragma omp for schedule(static)
    for (size_t h = 1; h < heads; h++)
      if (!failed && fn(args, h, &r, extra ? mine : NULL) != APEX_OK) failed = 1;
    omp_set_num_threads(old);
  }
  /* a product fails only for want of scratch, and every head asks for head 0's */
  return failed ? apex__fail(APEX_ERR_OUT_OF_MEMORY, "causal_attention: a head's product found no scratch on its thread; free memory")
                : APEX_OK;
}

/* ---- forward ------------------------------------------------------------------------------------- */

static apex_status fwd_head(const void *args, size_t h, reuse_ws *r, char *extra) {
  const apex_nn_attention_args *a = args;
  (void)extra;
  int t = a->t, d = a->d;
  size_t tt = (size_t)t * t, td = (size_t)t * d, es = apex_dtype_size(a->out_dtype);
  float *ph = a->p + h * tt;
  float scale = 1.0f / sqrtf((float)d);
  apex_status st = prod(r, t, t, d, scale, head(a->q, h, td, d, 0), head(a->k, h, td, d, 1), 0.0f, ph, APEX_F32, t);
  if (st != APEX_OK) return st;
  for (int i = 0; i < t; i++) {
    float *row = ph + (size_t)i * t, mx = -INFINITY, s = 0.0f;
    for (int j = 0; j <= i; j++) mx = apex__cpu_line_max(mx, row[j]);
    for (int j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
    for (int j = 0; j <= i; j++) row[j] /= s;
    for (int j = i + 1; j < t; j++) row[j] = 0.0f;
  }
  return prod(r, t, d, t, 1.0f, f32m(ph, t, 0), head(a->v, h, td, d, 0), 0.0f, (char *)a->out + h * td * es, a->out_dtype, d);
}

apex_status apex__cpu_nn_attention(const apex_nn_attention_args *a) {
  if (heads_on_threads(a->q, a->k, a->v, a->heads)) return run_heads(&a->ws, a->heads, 0, fwd_head, a);
  reuse_ws r = {&a->ws, NULL, 0, 0};
  for (size_t h = 0; h < a->heads; h++) {
    apex_status st = fwd_head(a, h, &r, NULL);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

/* ---- backward ------------------------------------------------------------------------------------ */

/* Whether v's gradient product runs on oneDNN, so that dO goes into it rounded to bf16. */
static int go_rounded(const apex_nn_attention_bwd_args *a) { return a->gv && a->v.dtype == APEX_BF16 && apex__onednn_active(NULL); }

/* extra: dS ([T, T] f32) when q or k takes a gradient, then dO rounded to bf16 ([T, D]) when v's
 * product runs on oneDNN (see bwd_extra). */
static apex_status bwd_head(const void *args, size_t h, reuse_ws *r, char *extra) {
  const apex_nn_attention_bwd_args *a = args;
  int t = a->t, d = a->d;
  size_t tt = (size_t)t * t, td = (size_t)t * d;
  float *gq = a->gq, *gk = a->gk, *gv = a->gv;
  float *dS = gq || gk ? (float *)extra : NULL;
  uint16_t *go16 = go_rounded(a) ? (uint16_t *)(extra + (dS ? tt * sizeof(float) : 0)) : NULL;
  const float *ph = a->p + h * tt, *gh = a->gout + h * td;
  float scale = 1.0f / sqrtf((float)d);
  /* the products add into their gradients (beta 1): one that holds nothing yet is zeroed first */
  if (gq && !a->accumulate_q) memset(gq + h * td, 0, td * sizeof *gq);
  if (gk && !a->accumulate_k) memset(gk + h * td, 0, td * sizeof *gk);
  if (gv && !a->accumulate_v) memset(gv + h * td, 0, td * sizeof *gv);
  /* P^T dO has two f32 operands; where v's product runs on oneDNN, dO goes in as bf16 (rounded here,
   * and P beside it by oneDNN) so that this product runs there too, as PyTorch's bf16 backward does */
  apex__mat gom = f32m(gh, d, 0);
  if (go16) {
    apex__convert_range(go16, APEX_BF16, gh, APEX_F32, td);
    gom = (apex__mat){go16, APEX_BF16, d, 0};
  }
  if (gv && prod(r, t, d, t, 1.0f, f32m(ph, t, 1), gom, 1.0f, gv + h * td, APEX_F32, d) != APEX_OK) return APEX_ERR_OUT_OF_MEMORY;
  if (!gq && !gk) return APEX_OK;
  if (prod(r, t, t, d, 1.0f, f32m(gh, d, 0), head(a->v, h, td, d, 1), 0.0f, dS, APEX_F32, t) != APEX_OK) return APEX_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < t; i++) {
    float *row = dS + (size_t)i * t;
    const float *pr = ph + (size_t)i * t;
    float s = 0.0f;
    for (int j = 0; j <= i; j++) s += row[j] * pr[j];
    for (int j = 0; j < t; j++) row[j] = j <= i ? pr[j] * (row[j] - s) * scale : 0.0f;
  }
  if (gq && prod(r, t, d, t, 1.0f, f32m(dS, t, 0), head(a->k, h, td, d, 0), 1.0f, gq + h * td, APEX_F32, d) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  if (gk && prod(r, t, d, t, 1.0f, f32m(dS, t, 1), head(a->q, h, td, d, 0), 1.0f, gk + h * td, APEX_F32, d) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  return APEX_OK;
}

/* The bytes of bwd_head's extra. */
static size_t bwd_extra(const apex_nn_attention_bwd_args *a) {
  size_t tt = (size_t)a->t * a->t, td = (size_t)a->t * a->d;
  return (a->gq || a->gk ? tt * sizeof(float) : 0) + (go_rounded(a) ? td * sizeof(uint16_t) : 0);
}

apex_status apex__cpu_nn_attention_bwd(const apex_nn_attention_bwd_args *a) {
  size_t extra = bwd_extra(a);
  if (heads_on_threads(a->q, a->k, a->v, a->heads)) return run_heads(&a->ws, a->heads, extra, bwd_head, a);
  char *x = extra ? a->ws.get(a->ws.ctx, extra) : NULL;
  if (extra && !x) return APEX_ERR_OUT_OF_MEMORY;
  reuse_ws r = {&a->ws, NULL, 0, 0};
  for (size_t h = 0; h < a->heads; h++) {
    apex_status st = bwd_head(a, h, &r, x);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}
