/* attention.c: the CPU backend's causal scaled-dot-product attention (args_nn.h), forward and
 * backward. Each product runs in a grid fixed by its shape, so the bits do not depend on the thread
 * count: apex__sgemm for f32 operands (f32 attention's bits as they have always been), apex__gemm for
 * any other. Whole heads run on the threads, one head a thread from start to end (run_heads); a
 * single head runs with the threads on its products.
 *
 * q, k, v are read as stored: apex__gemm widens f16/bf16 operands a tile's panel at a time (the bits
 * of widening the whole tensors, which is the reference), or, for bf16 on a CPU with AVX512_BF16 or
 * AMX, runs the product on oneDNN, which rounds an f32 operand beside a bf16 one to bf16. There the
 * scores S = q k^T come out in f32 from the bf16 q and k, the softmax runs on them in f32, P is
 * rounded to bf16 for the product with v (as PyTorch's bf16 scaled_dot_product_attention on the CPU
 * rounds its probabilities, unnormalised, before that product), and out is written in its own dtype
 * from the f32 sums. The backward's products of the f32 gradients with bf16 q, k, v round those
 * gradients to bf16 in the same way, and P^T dO runs there on P and dO rounded to bf16.
 *
 * The forward keeps only each row's (max, 1 / sum) (args_nn.h); the backward recomputes S and P per
 * head with the forward's own code (scores_softmax), so its P, and the gradients, have the bits of a
 * kept P. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "backend/grad_dtype.h"
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

/* The [t, d] block of head (b, h) = bh (bh = b * heads + h) of a buffer of row stride ld (args_nn.h's
 * layout): its first element's index. */
static size_t head_at(size_t bh, int heads, int t, int d, size_t ld) {
  size_t b = bh / (size_t)heads, h = bh % (size_t)heads;
  return b * (size_t)t * ld + h * (size_t)d;
}
/* That block of buf as a gemm operand. */
static apex__mat head(apex_nn_buf buf, size_t at, size_t ld, int trans) {
  return (apex__mat){(const char *)buf.data + at * apex_dtype_size(buf.dtype), buf.dtype, (int)ld, trans};
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

/* Heads run whole on the threads: a head's products are small ([T, T] x [T, D]: on two threads each
 * was a fork and join of four tiles of microseconds, 4,705 parallel regions a gpt_c768 step at O0) and
 * its softmax ran on the caller's thread while the others waited (the O0 GPTs' serial fraction at one
 * thread, bench_scaling). Each head runs on one thread start to end, its products in the same tile grid
 * as on the caller's thread (fixed by the shape), so the bits are those of running the heads one after
 * another, for any thread count (test_nn_ops' test_attention_threads_bitwise). */
static int heads_on_threads(size_t heads) { return heads > 1; }

/* A workspace that never grows: a thread's region, sized by head 0's run on one thread in the first call
 * of the op's key (every head asks for the same scratch). */
static void *none_get(void *ctx, size_t bytes) {
  (void)ctx, (void)bytes;
  return NULL;
}
static const apex_nn_workspace no_more = {none_get, NULL};

typedef apex_status (*head_fn)(const void *args, size_t h, reuse_ws *r, char *extra);

/* What a head's scratch depends on: everything of the op but its pointers and its batch, the thread cap
 * (oneDNN's products size their scratch by it; on a thread of run_heads a product sees one thread) and
 * the products' settings (apex__gemm_settings: the grid and the widening).
 * Every field is an int64, so keys compare with memcmp. */
enum { KEY_FIELDS = 20, SIZES_MAX = 64 };
typedef struct heads_key {
  int64_t f[KEY_FIELDS];
} heads_key;

/* The scratch per head of every key met so far (append-only: readers take no lock; a key is published
 * by the count's release after its fields are written). A key seen for the first time is sized by
 * running head 0 alone; later calls run every head on the threads at once. Past SIZES_MAX keys, each
 * call sizes again (correct, with head 0 alone). */
static struct {
  heads_key key;
  size_t cap;
} sizes[SIZES_MAX];
static int n_sizes;
static pthread_mutex_t sizes_lock = PTHREAD_MUTEX_INITIALIZER;

static int size_known(const heads_key *k, size_t *cap) {
  int n = __atomic_load_n(&n_sizes, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (!memcmp(&sizes[i].key, k, sizeof *k)) {
      *cap = sizes[i].cap;
      return 1;
    }
  return 0;
}

static void size_learnt(const heads_key *k, size_t cap) {
  pthread_mutex_lock(&sizes_lock);
  size_t had;
  if (!size_known(k, &had) && n_sizes < SIZES_MAX) {
    sizes[n_sizes].key = *k;
    sizes[n_sizes].cap = cap;
    __atomic_store_n(&n_sizes, n_sizes + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&sizes_lock);
}

/* The key's common part; fields from 8 on are the caller's. */
static heads_key key_of(head_fn fn, int t, int d, apex_dtype q, apex_dtype k, apex_dtype v, size_t extra) {
  heads_key key;
  memset(&key, 0, sizeof key);
  int64_t *f = key.f;
  f[0] = (int64_t)(intptr_t)fn, f[1] = t, f[2] = d, f[3] = q, f[4] = k, f[5] = v, f[6] = (int64_t)extra;
  f[7] = (int64_t)apex__onednn_active(NULL) | (int64_t)apex_get_max_threads() << 1 | (int64_t)apex__gemm_settings() << 24;
  return key;
}

/* Runs fn on every head over the threads, each with its own region of a head's scratch and `extra`
 * bytes of its own; the first call of a key runs head 0 here first, which sizes the region. */
static apex_status run_heads(const apex_nn_workspace *ws, const heads_key *key, size_t heads, size_t extra, head_fn fn, const void *args) {
  extra = (extra + 63) & ~(size_t)63;
  size_t cap = 0, first = 0;
  if (!size_known(key, &cap)) {
    char *x0 = extra ? ws->get(ws->ctx, extra) : NULL;
    if (extra && !x0) return APEX_ERR_OUT_OF_MEMORY;
    reuse_ws r0 = {ws, NULL, 0, 0};
    /* on one thread, as the heads below run: a product sizes its widening scratch by the threads it sees */
    int old = omp_get_max_threads();
    omp_set_num_threads(1);
    apex_status st = fn(args, 0, &r0, x0);
    omp_set_num_threads(old);
    if (st != APEX_OK) return st;
    cap = r0.cap, first = 1;
    size_learnt(key, cap);
  }
  /* regions for as many threads as could ever run (the cap, not the load), so the pool holds steady */
  size_t per = cap + extra, rest = heads - first;
  if (!rest) return APEX_OK;
  int slots = apex_get_max_threads(), threads = apex_get_num_threads();
  if ((size_t)slots > rest) slots = (int)rest;
  if (slots < 1) slots = 1;
  /* the whole team, with `workers` of it running heads: a smaller team makes libgomp end the pool
   * threads it leaves out and create new ones at the next full region (gemm_onednn.c says more) */
  int workers = threads < slots ? threads : slots;
  char *base = ws->get(ws->ctx, (size_t)slots * per + 64);
  if (!base) return APEX_ERR_OUT_OF_MEMORY;
  base = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
  int failed = 0;
#pragma omp parallel num_threads(threads) if (workers > 1) reduction(| : failed) firstprivate(workers)
  {
    int old = omp_get_max_threads(), w = omp_get_thread_num(), team = omp_get_num_threads();
    omp_set_num_threads(1);
    if (team < workers) workers = team; /* the team OpenMP gave: one thread inside another region */
    if (w < workers) { /* heads [lo, hi) of the rest, a contiguous run as the static schedule gave */
      size_t q = rest / (size_t)workers, rm = rest % (size_t)workers, uw = (size_t)w;
      size_t lo = first + uw * q + (uw < rm ? uw : rm), hi = lo + q + (uw < rm);
      char *mine = base + uw * per;
      reuse_ws r = {&no_more, mine + extra, cap, 0};
      for (size_t h = lo; h < hi; h++)
        if (!failed && fn(args, h, &r, extra ? mine : NULL) != APEX_OK) failed = 1;
    }
    omp_set_num_threads(old);
  }
  /* a product fails only for want of scratch, and every head asks for head 0's */
  return failed ? apex__fail(APEX_ERR_OUT_OF_MEMORY, "causal_attention: a head's product found no scratch on its thread; free memory")
                : APEX_OK;
}

/* ---- scores and softmax: one code path for the forward and the backward's recomputation ---------- */

/* P [t, t] (row stride t, f32) of head bh: S = scale q k^T, then each row's softmax over j <= i (0
 * above the diagonal), computed as the CPU always has (P = exp(s - m) / sum). stats (when not NULL)
 * receives the row's (m, 1 / sum). The backward calls this with the forward's inputs and gets P's
 * bits again. */
static apex_status scores_softmax(reuse_ws *r, apex_nn_buf q, size_t qat, size_t ld_q, apex_nn_buf k, size_t kat, size_t ld_k, int t, int d,
                                  float *ph, float *stats) {
  float scale = 1.0f / sqrtf((float)d);
  apex_status st = prod(r, t, t, d, scale, head(q, qat, ld_q, 0), head(k, kat, ld_k, 1), 0.0f, ph, APEX_F32, t);
  if (st != APEX_OK) return st;
  for (int i = 0; i < t; i++) {
    float *row = ph + (size_t)i * t, mx = -INFINITY, s = 0.0f;
    for (int j = 0; j <= i; j++) mx = apex__cpu_line_max(mx, row[j]);
    for (int j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
    for (int j = 0; j <= i; j++) row[j] /= s;
    for (int j = i + 1; j < t; j++) row[j] = 0.0f;
    if (stats) {
      stats[2 * i] = mx;
      stats[2 * i + 1] = 1.0f / s;
    }
  }
  return APEX_OK;
}

/* ---- forward ------------------------------------------------------------------------------------- */

/* extra: the head's P ([t, t] f32). */
static apex_status fwd_head(const void *args, size_t bh, reuse_ws *r, char *extra) {
  const apex_nn_attention_args *a = args;
  int t = a->t, d = a->d, H = a->heads;
  float *ph = (float *)extra;
  apex_status st = scores_softmax(r, a->q, head_at(bh, H, t, d, a->ld_q), a->ld_q, a->k, head_at(bh, H, t, d, a->ld_k), a->ld_k, t, d, ph,
                                  a->stats + bh * (size_t)t * 2);
  if (st != APEX_OK) return st;
  size_t es = apex_dtype_size(a->out_dtype), oat = head_at(bh, H, t, d, a->ld_out);
  return prod(r, t, d, t, 1.0f, f32m(ph, t, 0), head(a->v, head_at(bh, H, t, d, a->ld_v), a->ld_v, 0), 0.0f, (char *)a->out + oat * es,
              a->out_dtype, (int)a->ld_out);
}

apex_status apex__cpu_nn_attention(const apex_nn_attention_args *a) {
  size_t heads = a->batch * (size_t)a->heads, extra = (size_t)a->t * a->t * sizeof(float);
  if (!heads || !a->t) return APEX_OK;
  if (heads_on_threads(heads)) {
    heads_key key = key_of(fwd_head, a->t, a->d, a->q.dtype, a->k.dtype, a->v.dtype, extra);
    int64_t *f = key.f + 8;
    f[0] = (int64_t)a->ld_q, f[1] = (int64_t)a->ld_k, f[2] = (int64_t)a->ld_v, f[3] = (int64_t)a->ld_out, f[4] = a->out_dtype;
    return run_heads(&a->ws, &key, heads, extra, fwd_head, a);
  }
  char *x = a->ws.get(a->ws.ctx, extra);
  if (!x) return APEX_ERR_OUT_OF_MEMORY;
  reuse_ws r = {&a->ws, NULL, 0, 0};
  for (size_t h = 0; h < heads; h++) {
    apex_status st = fwd_head(a, h, &r, x);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

/* ---- backward ------------------------------------------------------------------------------------ */

/* Whether v's gradient product runs on oneDNN, so that dO goes into it rounded to bf16. */
static int go_rounded(const apex_nn_attention_bwd_args *a) { return a->gv && a->v.dtype == APEX_BF16 && apex__onednn_active(NULL); }

/* Zeroes the [t, d] block at g (row stride ld). */
static void zero_block(float *g, int t, int d, size_t ld) {
  if (ld == (size_t)d) {
    memset(g, 0, (size_t)t * d * sizeof *g);
    return;
  }
  for (int i = 0; i < t; i++) memset(g + (size_t)i * ld, 0, (size_t)d * sizeof *g);
}

/* extra: P ([T, T] f32, recomputed), then dS ([T, T] f32) when q or k takes a gradient, then dO
 * rounded to bf16 ([T, D]) when v's product runs on oneDNN (see bwd_extra). */
static apex_status bwd_head(const void *args, size_t bh, reuse_ws *r, char *extra) {
  const apex_nn_attention_bwd_args *a = args;
  int t = a->t, d = a->d, H = a->heads;
  size_t tt = (size_t)t * t;
  float *gq = a->gq, *gk = a->gk, *gv = a->gv;
  float *ph = (float *)extra;
  float *dS = gq || gk ? ph + tt : NULL;
  uint16_t *go16 = go_rounded(a) ? (uint16_t *)(extra + (dS ? 2 : 1) * tt * sizeof(float)) : NULL;
  size_t qat = head_at(bh, H, t, d, a->ld_q), kat = head_at(bh, H, t, d, a->ld_k), vat = head_at(bh, H, t, d, a->ld_v);
  const float *gh = (const float *)a->gout + head_at(bh, H, t, d, a->ld_gout);
  float *gqh = gq ? gq + head_at(bh, H, t, d, a->ld_gq) : NULL, *gkh = gk ? gk + head_at(bh, H, t, d, a->ld_gk) : NULL;
  float *gvh = gv ? gv + head_at(bh, H, t, d, a->ld_gv) : NULL;
  float scale = 1.0f / sqrtf((float)d);
  /* P again, by the forward's own code on the same inputs: the same bits */
  if (scores_softmax(r, a->q, qat, a->ld_q, a->k, kat, a->ld_k, t, d, ph, NULL) != APEX_OK) return APEX_ERR_OUT_OF_MEMORY;
  /* the products add into their gradients (beta 1): one that holds nothing yet is zeroed first */
  if (gq && !a->accumulate_q) zero_block(gqh, t, d, a->ld_gq);
  if (gk && !a->accumulate_k) zero_block(gkh, t, d, a->ld_gk);
  if (gv && !a->accumulate_v) zero_block(gvh, t, d, a->ld_gv);
  /* P^T dO has two f32 operands; where v's product runs on oneDNN, dO goes in as bf16 (rounded here,
   * and P beside it by oneDNN) so that this product runs there too, as PyTorch's bf16 backward does */
  apex__mat gom = f32m(gh, (int)a->ld_gout, 0);
  if (go16) {
    for (int i = 0; i < t; i++) apex__convert_range(go16 + (size_t)i * d, APEX_BF16, gh + (size_t)i * a->ld_gout, APEX_F32, (size_t)d);
    gom = (apex__mat){go16, APEX_BF16, d, 0};
  }
  if (gv && prod(r, t, d, t, 1.0f, f32m(ph, t, 1), gom, 1.0f, gvh, APEX_F32, (int)a->ld_gv) != APEX_OK) return APEX_ERR_OUT_OF_MEMORY;
  if (!gq && !gk) return APEX_OK;
  if (prod(r, t, t, d, 1.0f, f32m(gh, (int)a->ld_gout, 0), head(a->v, vat, a->ld_v, 1), 0.0f, dS, APEX_F32, t) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < t; i++) {
    float *row = dS + (size_t)i * t;
    const float *pr = ph + (size_t)i * t;
    float s = 0.0f;
    for (int j = 0; j <= i; j++) s += row[j] * pr[j];
    for (int j = 0; j < t; j++) row[j] = j <= i ? pr[j] * (row[j] - s) * scale : 0.0f;
  }
  if (gq && prod(r, t, d, t, 1.0f, f32m(dS, t, 0), head(a->k, kat, a->ld_k, 0), 1.0f, gqh, APEX_F32, (int)a->ld_gq) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  if (gk && prod(r, t, d, t, 1.0f, f32m(dS, t, 1), head(a->q, qat, a->ld_q, 0), 1.0f, gkh, APEX_F32, (int)a->ld_gk) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  return APEX_OK;
}

/* The bytes of bwd_head's extra. */
static size_t bwd_extra(const apex_nn_attention_bwd_args *a) {
  size_t tt = (size_t)a->t * a->t, td = (size_t)a->t * a->d;
  return (a->gq || a->gk ? 2 : 1) * tt * sizeof(float) + (go_rounded(a) ? td * sizeof(uint16_t) : 0);
}

static apex_status attention_bwd_k(const void *a) { return apex__cpu_nn_attention_bwd(a); }

apex_status apex__cpu_nn_attention_bwd(const apex_nn_attention_bwd_args *a) {
  size_t heads = a->batch * (size_t)a->heads;
  if (!heads || !a->t || (!a->gq && !a->gk && !a->gv)) return APEX_OK;
  int ran;
  apex_status rs = apex__attention_bwd_f32(&apex__cpu_backend, attention_bwd_k, a, &ran);
  if (ran) return rs;
  size_t extra = bwd_extra(a);
  if (heads_on_threads(heads)) {
    heads_key key = key_of(bwd_head, a->t, a->d, a->q.dtype, a->k.dtype, a->v.dtype, extra);
    int64_t *f = key.f + 8;
    f[0] = (int64_t)a->ld_q, f[1] = (int64_t)a->ld_k, f[2] = (int64_t)a->ld_v, f[3] = (int64_t)a->ld_gout;
    f[4] = (int64_t)a->ld_gq, f[5] = (int64_t)a->ld_gk, f[6] = (int64_t)a->ld_gv;
    f[7] = (a->gq != NULL) | (a->gk != NULL) << 1 | (a->gv != NULL) << 2;
    return run_heads(&a->ws, &key, heads, extra, bwd_head, a);
  }
  char *x = a->ws.get(a->ws.ctx, extra);
  if (!x) return APEX_ERR_OUT_OF_MEMORY;
  reuse_ws r = {&a->ws, NULL, 0, 0};
  for (size_t h = 0; h < heads; h++) {
    apex_status st = bwd_head(a, h, &r, x);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}
