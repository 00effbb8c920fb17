/* attention.cu: GPT-2's causal self-attention block on the GPU, forward and backward, on the packed qkv
 * [B, T, 3C] that the c_attn linear produces (apex/cuda.h).
 *
 * The products go to cuBLASLt as strided-batched GEMMs over the B * H heads (tensor cores for f16/bf16,
 * f32 accumulation; TF32 stays off for f32), so the heads are first gathered into contiguous
 * [B * H, T, D] buffers, and the results scattered back: cuBLASLt takes one batch stride, and the heads
 * of a packed [B, T, C] tensor sit at two (b and h). Per head, with scale = 1 / sqrt(D):
 *   forward:  S = scale q k^T (f32), lse = logsumexp over s <= t of each row, P = exp(S - lse) (0 above
 *             the diagonal), O = P v;
 *   backward: S again from q and k, P = exp(S - lse) (no [T, T] matrix kept between the passes),
 *             dP = dO v^T, Di = rowsum(dO o O) (= rowsum(dP o P), but over D instead of T), dS = P (dP - Di),
 *             dq = scale dS k, dk = scale dS^T q, dv = P^T dO.
 * P and dS enter the next GEMM in the input dtype (as FlashAttention keeps them), rounded once from f32.
 * The [T, T] matrices are stored with rows of ld = T rounded up to 8 elements, so that every row and
 * every head starts 16-byte aligned, as the tensor-core kernels want. Nothing is summed with atomics:
 * the same inputs give the same bits. The workspace comes from the caching allocator and goes back as
 * soon as the last kernel reading it is queued (one stream orders the reuse). */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dtype_dev.cuh"

#define FWD "apex_kernel_attention_forward"
#define BWD "apex_kernel_attention_backward"

/* Between the packed layout [B, T, W * H * D] (W = 3 for qkv, 1 for y) and the per-head one
 * [W][B * H][T][D]: a bitwise copy of elements of type E, indexed over the packed layout so that its
 * side is read or written in order. to_heads: packed -> heads; else heads -> packed. */
template <typename E>
__global__ void att_permute(const E *src, E *dst, int64_t b, int64_t t, int64_t w, int64_t h, int64_t d, int to_heads) {
  const int64_t total = b * t * w * h * d;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i; /* i = (((bb * t + tt) * w + ww) * h + hh) * d + dd */
    const int64_t dd = r % d;
    r /= d;
    const int64_t hh = r % h;
    r /= h;
    const int64_t ww = r % w;
    r /= w;
    const int64_t tt = r % t, bb = r / t;
    const int64_t j = (((ww * b + bb) * h + hh) * t + tt) * d + dd;
    if (to_heads) dst[j] = src[i];
    else dst[i] = src[j];
  }
}

static apex_status permute(const char *fn, const apex__cuda_attn *a, int64_t w, const void *src, void *dst, int to_heads) {
  const int64_t n = a->b * a->t * w * a->h * a->d;
  const unsigned grid = apex_grid(n, 256, 4);
  cudaStream_t s = (cudaStream_t)apex__cuda_stream();
  if (a->dtype == APEX_F32)
    att_permute<float><<<grid, 256, 0, s>>>((const float *)src, (float *)dst, a->b, a->t, w, a->h, a->d, to_heads);
  else
    att_permute<uint16_t><<<grid, 256, 0, s>>>((const uint16_t *)src, (uint16_t *)dst, a->b, a->t, w, a->h, a->d, to_heads);
  return apex__cuda_check_launch(fn);
}

/* One block per row r = bh * t + i of the scaled scores s (rows of ld floats, t of them used): lse[r] =
 * log of the sum over j <= i of exp(s[r, j]) and p[r, j] = exp(s[r, j] - lse[r]), 0 for i < j < t, in
 * dtype pt. p may be s itself (f32): each element is read before the thread that reads it writes it,
 * and the block's reductions finish every other read of the row first. */
/* The max m of row sr's causal part (j <= i) and the sum of exp(sr[j] - m) over it, for the whole block (every
 * thread of the block calls it: it syncs). */
__device__ __forceinline__ void causal_row_max_sum(const float *sr, int64_t i, float *scratch, float *m, float *sum) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  mx = block_max(mx, scratch);
  float se = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) se += expf(sr[j] - mx);
  *sum = block_sum(se, scratch);
  *m = mx;
}

__global__ void att_softmax_fwd(const float *s, void *p, apex_dtype pt, float *lse, int64_t rows, int64_t t, int64_t ld) {
  __shared__ float scratch[33];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) { /* the same r for the whole block: its syncs are safe */
    const int64_t i = r % t;
    const float *sr = s + r * ld;
    float mx, se;
    causal_row_max_sum(sr, i, scratch, &mx, &se);
    const float l = mx + logf(se);
    if (threadIdx.x == 0) lse[r] = l;
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) apex_st(p, pt, r * ld + j, j <= i ? expf(sr[j] - l) : 0.0f);
  }
}

/* di[r] for r = bh * t + i, bh = bb * h + hh: the dot product of dy and y (both [B, T, H * D], dtype dt)
 * over head hh's D channels at position (bb, i). A warp per row, its lanes striding over the channels and
 * then a butterfly: a fixed order. */
__global__ void att_row_dot(const void *dy, const void *y, apex_dtype dt, float *di, int64_t b, int64_t t, int64_t h,
                            int64_t d) {
  const int64_t rows = b * h * t, warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  /* blockDim.x is a multiple of 32, so r is the same for all 32 lanes and every lane reaches the shuffles */
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
    const int64_t i = r % t, bh = r / t, hh = bh % h, bb = bh / h;
    const int64_t base = (bb * t + i) * (h * d) + hh * d;
    float acc = 0.0f;
    for (int64_t c = lane; c < d; c += 32) acc += apex_ld(dy, dt, base + c) * apex_ld(y, dt, base + c);
    acc = warp_sum(acc);
    if (lane == 0) di[r] = acc;
  }
}

/* Every element (r, j), j < t, of the [rows, ld] matrices, r = bh * t + i: p = exp(s - lse[r]) and
 * ds = p (dp - di[r]) * scale where j <= i, both 0 above the diagonal; stored in dt. p_out may be s and
 * ds_out dp (f32): each thread reads its element before it writes it. */
__global__ void att_softmax_bwd(const float *s, const float *dp, const float *lse, const float *di, void *p_out,
                                void *ds_out, apex_dtype dt, int64_t rows, int64_t t, int64_t ld, float scale) {
  const int64_t n = rows * t;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = e / t, j = e % t, i = r % t, at = r * ld + j;
    float p = 0.0f, g = 0.0f;
    if (j <= i) {
      p = expf(s[at] - lse[r]);
      g = p * (dp[at] - di[r]) * scale;
    }
    apex_st(p_out, dt, at, p);
    apex_st(ds_out, dt, at, g);
  }
}

/* The row length of the [T, T] matrices: T rounded up to 8 elements (16 bytes in f16/bf16). */
static int64_t ld_of(int64_t t) { return (t + 7) / 8 * 8; }

/* Threads for a block that reduces a row of t: a multiple of 32 (block_sum's warps), at most 256. */
static int row_threads(int64_t t) { return t >= 256 ? 256 : (int)((t + 31) / 32 * 32); }

/* Device workspace of n bytes into *p, when st is still APEX_OK. */
static void take(apex_status *st, size_t n, void **p) {
  if (*st == APEX_OK) *st = apex__cuda_alloc(n, 0, p);
}

/* The batched product over the heads of [T, *] matrices; the shapes and strides of each call are
 * spelled out where it is made. */
#define GEMM(fn, ta, tb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, ct)              \
  do {                                                                                                             \
    if (st == APEX_OK)                                                                                             \
      st = apex__cuda_gemm_batched(fn, ta, tb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, dt, beta, C, ldc, \
                                   stride_c, ct, (int)bh);                                                         \
  } while (0)

extern "C" apex_status apex__cuda_attention_fwd(const apex__cuda_attn *a, const void *qkv, void *y, float *lse) {
  const apex_dtype dt = a->dtype;
  const size_t es = apex_dtype_size(dt);
  const int64_t bh = a->b * a->h, t = a->t, d = a->d, ld = ld_of(t), n = bh * t * d, tt = t * ld;
  const float scale = 1.0f / sqrtf((float)d); /* as apex_causal_attention computes it */
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  apex_status st = APEX_OK;
  void *heads = NULL, *sc = NULL, *p16 = NULL, *o = NULL;
  take(&st, 3 * (size_t)n * es, &heads); /* q, k, v: [3][BH][T][D] */
  take(&st, (size_t)(bh * tt) * sizeof(float), &sc);
  if (dt != APEX_F32) take(&st, (size_t)(bh * tt) * es, &p16); /* f32 P overwrites the scores in place */
  take(&st, (size_t)n * es, &o);
  void *p = dt == APEX_F32 ? sc : p16;
  const char *q = (const char *)heads, *k = q + (size_t)n * es, *v = q + 2 * (size_t)n * es;
  if (st == APEX_OK) st = permute(FWD, a, 3, qkv, heads, 1);
  /* S [T, T] = scale q [T, D] k^T ([T, D] stored) per head, in f32 */
  GEMM(FWD, 0, 1, t, t, d, scale, q, d, t * d, k, d, t * d, 0.0f, sc, ld, tt, APEX_F32);
  if (st == APEX_OK) {
    int64_t rows = bh * t;
    unsigned grid = (unsigned)(rows < 65535 * 16 ? rows : 65535 * 16);
    att_softmax_fwd<<<grid, row_threads(t), 0, stream>>>((const float *)sc, p, dt, lse, rows, t, ld);
    st = apex__cuda_check_launch(FWD);
  }
  /* O [T, D] = P [T, T] v [T, D] per head, rounded to dt */
  GEMM(FWD, 0, 0, t, d, t, 1.0f, p, ld, tt, v, d, t * d, 0.0f, o, d, t * d, dt);
  if (st == APEX_OK) st = permute(FWD, a, 1, o, y, 0);
  apex__cuda_free(heads);
  apex__cuda_free(sc);
  apex__cuda_free(p16);
  apex__cuda_free(o);
  return st;
}

extern "C" apex_status apex__cuda_attention_bwd(const apex__cuda_attn *a, const void *dy, const void *qkv, const void *y,
                                                const float *lse, void *dqkv) {
  const apex_dtype dt = a->dtype;
  const size_t es = apex_dtype_size(dt);
  const int64_t bh = a->b * a->h, t = a->t, d = a->d, ld = ld_of(t), n = bh * t * d, tt = t * ld;
  const float scale = 1.0f / sqrtf((float)d);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  apex_status st = APEX_OK;
  void *heads = NULL, *dout = NULL, *di = NULL, *sc = NULL, *dp = NULL, *p16 = NULL, *ds16 = NULL, *grads = NULL;
  take(&st, 3 * (size_t)n * es, &heads); /* q, k, v: [3][BH][T][D] */
  take(&st, (size_t)n * es, &dout);      /* dO: [BH][T][D] */
  take(&st, (size_t)(bh * t) * sizeof(float), &di);
  take(&st, (size_t)(bh * tt) * sizeof(float), &sc);
  take(&st, (size_t)(bh * tt) * sizeof(float), &dp);
  if (dt != APEX_F32) { /* f32 P and dS overwrite S and dP in place */
    take(&st, (size_t)(bh * tt) * es, &p16);
    take(&st, (size_t)(bh * tt) * es, &ds16);
  }
  take(&st, 3 * (size_t)n * es, &grads); /* dq, dk, dv: [3][BH][T][D] */
  void *p = dt == APEX_F32 ? sc : p16, *ds = dt == APEX_F32 ? dp : ds16;
  const char *q = (const char *)heads, *k = q + (size_t)n * es, *v = q + 2 * (size_t)n * es;
  char *dq = (char *)grads, *dk = dq + (size_t)n * es, *dv = dq + 2 * (size_t)n * es;
  if (st == APEX_OK) st = permute(BWD, a, 3, qkv, heads, 1);
  if (st == APEX_OK) st = permute(BWD, a, 1, dy, dout, 1);
  if (st == APEX_OK) {
    int64_t rows = bh * t, blocks = (rows + 7) / 8; /* 8 warps a block, a warp a row */
    att_row_dot<<<(unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(dy, y, dt, (float *)di, a->b, t,
                                                                                          a->h, d);
    st = apex__cuda_check_launch(BWD);
  }
  /* S = scale q k^T exactly as the forward made it (same call, same bits), and dP [T, T] = dO [T, D] v^T */
  GEMM(BWD, 0, 1, t, t, d, scale, q, d, t * d, k, d, t * d, 0.0f, sc, ld, tt, APEX_F32);
  GEMM(BWD, 0, 1, t, t, d, 1.0f, dout, d, t * d, v, d, t * d, 0.0f, dp, ld, tt, APEX_F32);
  if (st == APEX_OK) {
    int64_t rows = bh * t;
    att_softmax_bwd<<<apex_grid(rows * t, 256, 4), 256, 0, stream>>>((const float *)sc, (const float *)dp, lse,
                                                                     (const float *)di, p, ds, dt, rows, t, ld, scale);
    st = apex__cuda_check_launch(BWD);
  }
  /* dq [T, D] = dS [T, T] k [T, D]; dk = dS^T q; dv = P^T dO (dS already carries the scale) */
  GEMM(BWD, 0, 0, t, d, t, 1.0f, ds, ld, tt, k, d, t * d, 0.0f, dq, d, t * d, dt);
  GEMM(BWD, 1, 0, t, d, t, 1.0f, ds, ld, tt, q, d, t * d, 0.0f, dk, d, t * d, dt);
  GEMM(BWD, 1, 0, t, d, t, 1.0f, p, ld, tt, dout, d, t * d, 0.0f, dv, d, t * d, dt);
  if (st == APEX_OK) st = permute(BWD, a, 3, grads, dqkv, 0);
  void *all[] = {heads, dout, di, sc, dp, p16, ds16, grads};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex__cuda_free(all[i]);
  return st;
}

/* ---- the attention slot's materialised path (backend/args_nn.h's layout) ------------------------------
 *
 * The slot's q, k, v, out and gradients sit in args_nn.h's strided layout: head (b, h) of a buffer of row
 * stride ld starts at element b * t * ld + h * d, its rows ld apart. The [T, T] scratch (S, P, dS) is
 * [batch * heads][T][ldt], ldt = T rounded up to 8. cuBLASLt takes one batch stride per operand, so the
 * products run as one batched call over every head when all operands step by one stride (heads = 1, or
 * only scratch), else as one call per batch index over its heads (stride d within a row). Per head, with
 * scale = 1 / sqrt(d):
 *   forward:  S = scale q k^T (f32); per row m = max over j <= i, r = 1 / sum exp(s - m) (the stats),
 *             P = exp(S - m) r (0 above the diagonal), in q's dtype; out = P v;
 *   backward: S again, P = exp(S - m) r from the stats, dP = dO v^T, Di = rowsum(dP o P),
 *             dS = P (dP - Di) scale; gv += P^T dO, gq += dS k, gk += dS^T q.
 * Half inputs take dO rounded to their dtype (cuBLASLt reads both operands in one dtype), as P and dS. */

/* An operand of the per-head products: head (b, h) at base + (b * bstride + h * hstride) elements of es
 * bytes, rows ld apart. */
typedef struct att_opnd {
  const char *base;
  size_t es;
  int64_t ld, bstride, hstride;
} att_opnd;

/* In args_nn.h's layout. */
static att_opnd strided(const void *p, apex_dtype dt, int64_t t, int64_t d, int64_t ld) {
  return att_opnd{(const char *)p, apex_dtype_size(dt), ld, t * ld, d};
}
/* [batch * heads][t][ldt] scratch. */
static att_opnd square(const void *p, size_t es, int64_t heads, int64_t t, int64_t ldt) {
  return att_opnd{(const char *)p, es, ldt, heads * t * ldt, t * ldt};
}

typedef struct att_geom {
  int64_t batch, heads, t, d;
} att_geom;

/* C = alpha op(A) op(B) + beta C over every head (A, B of in_type; C of c_type). */
static apex_status heads_gemm(const char *fn, const att_geom *g, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                              att_opnd a, att_opnd b, apex_dtype in_type, float beta, att_opnd c, apex_dtype c_type) {
  const int64_t H = g->heads, B = g->batch;
  /* one stride over all heads: every operand's batch step is heads times its head step */
  if (H == 1 || (a.bstride == H * a.hstride && b.bstride == H * b.hstride && c.bstride == H * c.hstride)) {
    int64_t sa = H == 1 ? a.bstride : a.hstride, sb = H == 1 ? b.bstride : b.hstride, sc = H == 1 ? c.bstride : c.hstride;
    return apex__cuda_gemm_batched(fn, ta, tb, m, n, k, alpha, a.base, a.ld, sa, b.base, b.ld, sb, in_type, beta, (void *)c.base,
                                   c.ld, sc, c_type, (int)(B * H));
  }
  for (int64_t bb = 0; bb < B; bb++) {
    apex_status st = apex__cuda_gemm_batched(fn, ta, tb, m, n, k, alpha, a.base + bb * a.bstride * a.es, a.ld, a.hstride,
                                             b.base + bb * b.bstride * b.es, b.ld, b.hstride, in_type, beta,
                                             (void *)(c.base + bb * c.bstride * c.es), c.ld, c.hstride, c_type, (int)H);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

/* One block per row r = bh * t + i of the scaled scores s ([rows][ld] f32): stats[2r] = m, the max over
 * j <= i, stats[2r + 1] = 1 / sum exp(s - m), and p[r, j] = exp(s - m) * (1 / sum) for j <= i, 0 above,
 * in dtype pt (p may be s itself in f32: the block's reductions finish every read of the row first). */
__global__ void att_stats_fwd(const float *s, void *p, apex_dtype pt, float *stats, int64_t rows, int64_t t, int64_t ld) {
  __shared__ float scratch[33];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % t;
    const float *sr = s + r * ld;
    float mx, se;
    causal_row_max_sum(sr, i, scratch, &mx, &se);
    const float rr = 1.0f / se;
    if (threadIdx.x == 0) {
      stats[2 * r] = mx;
      stats[2 * r + 1] = rr;
    }
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) apex_st(p, pt, r * ld + j, j <= i ? expf(sr[j] - mx) * rr : 0.0f);
  }
}

/* One block per row r: p = exp(s - m) r from the stats, Di = sum over j <= i of dp * p (the block's fixed
 * order), ds = p (dp - Di) scale; both stored in dt, 0 above the diagonal. p_out may be s and ds_out dp
 * (f32): every element is read into registers before the reduction, and written after it. */
__global__ void att_stats_bwd(const float *s, const float *dp, const float *stats, void *p_out, void *ds_out, apex_dtype dt,
                              int64_t rows, int64_t t, int64_t ld, float scale) {
  __shared__ float scratch[33];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % t;
    const float m = stats[2 * r], rr = stats[2 * r + 1];
    float di = 0.0f;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) di += expf(s[r * ld + j] - m) * rr * dp[r * ld + j];
    di = block_sum(di, scratch); /* its syncs order every read above before the writes below */
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
      float p = 0.0f, g = 0.0f;
      if (j <= i) {
        p = expf(s[r * ld + j] - m) * rr;
        g = p * (dp[r * ld + j] - di) * scale;
      }
      apex_st(p_out, dt, r * ld + j, p);
      apex_st(ds_out, dt, r * ld + j, g);
    }
  }
}

/* dst [rows][cols] (dst_dtype, row stride ld_dst) = src [rows][cols] (src_dtype, ld_src), converted; with
 * land set, dst is f32 and receives (accumulate ? dst : 0.0f) + src (args_nn.h's accumulate rule). */
__global__ void att_copy_rows(void *dst, apex_dtype dst_dtype, int64_t ld_dst, const void *src, apex_dtype src_dtype, int64_t ld_src,
                              int64_t rows, int64_t cols, int land, int accumulate) {
  const int64_t n = rows * cols;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    float v = apex_ld(src, src_dtype, r * ld_src + c);
    if (land) {
      const int64_t at = r * ld_dst + c;
      apex_st(dst, dst_dtype, at, (accumulate ? apex_ld(dst, dst_dtype, at) : 0.0f) + v);
    } else {
      apex_st(dst, dst_dtype, r * ld_dst + c, v);
    }
  }
}

/* dst [rows][cols] (f32, row stride ld) = 0. */
__global__ void att_zero_rows(float *dst, int64_t ld, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
    dst[(e / cols) * ld + e % cols] = 0.0f;
}

#define SLOT_FWD "nn_attention"
#define SLOT_BWD "nn_attention_bwd"

static unsigned row_grid(int64_t rows) { return (unsigned)(rows < 65535 * 16 ? rows : 65535 * 16); }

extern "C" apex_status apex__cuda_rows_copy(void *dst, apex_dtype dst_dtype, int64_t ld_dst, const void *src, apex_dtype src_dtype,
                                            int64_t ld_src, int64_t rows, int64_t cols, int land, int accumulate) {
  if (!rows || !cols) return APEX_OK;
  att_copy_rows<<<apex_grid(rows * cols, 256, 4), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(dst, dst_dtype, ld_dst, src, src_dtype,
                                                                                                 ld_src, rows, cols, land, accumulate);
  return apex__cuda_check_launch("apex_kernel_rows_copy");
}

extern "C" apex_status apex__cuda_attention_slot_fwd(const apex_nn_attention_args *a) {
  const apex_dtype dt = a->q.dtype;
  const att_geom g = {(int64_t)a->batch, a->heads, a->t, a->d};
  const int64_t t = g.t, d = g.d, bh = g.batch * g.heads, ldt = ld_of(t), rows = bh * t;
  if (!bh || !t) return APEX_OK;
  const float scale = 1.0f / sqrtf((float)d); /* as the CPU's */
  const size_t es = apex_dtype_size(dt);
  apex_status st = APEX_OK;
  void *sc = NULL, *p16 = NULL;
  take(&st, (size_t)(rows * ldt) * sizeof(float), &sc);
  if (dt != APEX_F32) take(&st, (size_t)(rows * ldt) * es, &p16);
  void *p = dt == APEX_F32 ? sc : p16;
  if (st == APEX_OK)
    st = heads_gemm(SLOT_FWD, &g, 0, 1, t, t, d, scale, strided(a->q.data, dt, t, d, (int64_t)a->ld_q), strided(a->k.data, dt, t, d, (int64_t)a->ld_k),
                    dt, 0.0f, square(sc, sizeof(float), g.heads, t, ldt), APEX_F32);
  if (st == APEX_OK) {
    att_stats_fwd<<<row_grid(rows), row_threads(t), 0, (cudaStream_t)apex__cuda_stream()>>>((const float *)sc, p, dt, a->stats, rows, t, ldt);
    st = apex__cuda_check_launch(SLOT_FWD);
  }
  if (st == APEX_OK)
    st = heads_gemm(SLOT_FWD, &g, 0, 0, t, d, t, 1.0f, square(p, es, g.heads, t, ldt), strided(a->v.data, dt, t, d, (int64_t)a->ld_v), dt, 0.0f,
                    strided(a->out, a->out_dtype, t, d, (int64_t)a->ld_out), a->out_dtype);
  apex__cuda_free(sc);
  apex__cuda_free(p16);
  return st;
}

extern "C" apex_status apex__cuda_attention_slot_bwd(const apex_nn_attention_bwd_args *a) {
  const apex_dtype dt = a->q.dtype;
  const att_geom g = {(int64_t)a->batch, a->heads, a->t, a->d};
  const int64_t t = g.t, d = g.d, H = g.heads, bh = g.batch * H, ldt = ld_of(t), rows = bh * t, C = H * d;
  if (!bh || !t || (!a->gq && !a->gk && !a->gv)) return APEX_OK;
  const float scale = 1.0f / sqrtf((float)d);
  const size_t es = apex_dtype_size(dt);
  cudaStream_t stream = (cudaStream_t)apex__cuda_stream();
  apex_status st = APEX_OK;
  void *sc = NULL, *dp = NULL, *p16 = NULL, *ds16 = NULL, *dout16 = NULL;
  take(&st, (size_t)(rows * ldt) * sizeof(float), &sc);
  take(&st, (size_t)(rows * ldt) * sizeof(float), &dp);
  if (dt != APEX_F32) {
    take(&st, (size_t)(rows * ldt) * es, &p16);
    take(&st, (size_t)(rows * ldt) * es, &ds16);
    take(&st, (size_t)(g.batch * t * C) * es, &dout16); /* dO in dt, [B, T, H * d] */
  }
  void *p = dt == APEX_F32 ? sc : p16, *ds = dt == APEX_F32 ? dp : ds16;
  att_opnd q = strided(a->q.data, dt, t, d, (int64_t)a->ld_q), k = strided(a->k.data, dt, t, d, (int64_t)a->ld_k),
           v = strided(a->v.data, dt, t, d, (int64_t)a->ld_v);
  att_opnd dO = dt == APEX_F32 ? strided(a->gout, APEX_F32, t, d, (int64_t)a->ld_gout) : strided(dout16, dt, t, d, C);
  if (st == APEX_OK && dt != APEX_F32)
    st = apex__cuda_rows_copy(dout16, dt, C, a->gout, APEX_F32, (int64_t)a->ld_gout, g.batch * t, C, 0, 0);
  if (st == APEX_OK)
    st = heads_gemm(SLOT_BWD, &g, 0, 1, t, t, d, scale, q, k, dt, 0.0f, square(sc, sizeof(float), H, t, ldt), APEX_F32);
  if (st == APEX_OK) st = heads_gemm(SLOT_BWD, &g, 0, 1, t, t, d, 1.0f, dO, v, dt, 0.0f, square(dp, sizeof(float), H, t, ldt), APEX_F32);
  if (st == APEX_OK) {
    att_stats_bwd<<<row_grid(rows), row_threads(t), 0, stream>>>((const float *)sc, (const float *)dp, a->stats, p, ds, dt, rows, t, ldt,
                                                                 scale);
    st = apex__cuda_check_launch(SLOT_BWD);
  }
  /* the products add into their gradients (beta 1): one that holds nothing yet is zeroed first */
  float *gs[3] = {(float *)a->gq, (float *)a->gk, (float *)a->gv};
  const int64_t lds[3] = {(int64_t)a->ld_gq, (int64_t)a->ld_gk, (int64_t)a->ld_gv};
  const int acc[3] = {a->accumulate_q, a->accumulate_k, a->accumulate_v};
  for (int w = 0; w < 3 && st == APEX_OK; w++)
    if (gs[w] && !acc[w]) {
      att_zero_rows<<<apex_grid(g.batch * t * C, 256, 4), 256, 0, stream>>>(gs[w], lds[w], g.batch * t, C);
      st = apex__cuda_check_launch(SLOT_BWD);
    }
  if (st == APEX_OK && a->gv)
    st = heads_gemm(SLOT_BWD, &g, 1, 0, t, d, t, 1.0f, square(p, es, H, t, ldt), dO, dt, 1.0f, strided(a->gv, APEX_F32, t, d, lds[2]), APEX_F32);
  if (st == APEX_OK && a->gq)
    st = heads_gemm(SLOT_BWD, &g, 0, 0, t, d, t, 1.0f, square(ds, es, H, t, ldt), k, dt, 1.0f, strided(a->gq, APEX_F32, t, d, lds[0]), APEX_F32);
  if (st == APEX_OK && a->gk)
    st = heads_gemm(SLOT_BWD, &g, 1, 0, t, d, t, 1.0f, square(ds, es, H, t, ldt), q, dt, 1.0f, strided(a->gk, APEX_F32, t, d, lds[1]), APEX_F32);
  void *all[] = {sc, dp, p16, ds16, dout16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex__cuda_free(all[i]);
  return st;
}
