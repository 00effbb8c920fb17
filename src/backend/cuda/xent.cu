/* xent.cu: fused softmax + cross-entropy (Apex's xentropy), forward and backward, one block per row.
 * The forward keeps only the log-sum-exp per row; the backward rebuilds each probability from it, so
 * the [rows, classes] softmax is never stored. With label smoothing e over C classes the target
 * distribution is (1 - e) one-hot + e / C, as PyTorch's cross_entropy. A target outside [0, C) that is
 * not ignore_index gives a NaN loss (the kernel cannot stop the step; the NaN makes the overflow check
 * skip it and shows in the loss). */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/dtype_dev.cuh"

__global__ void xent_fwd_kernel(const void *logits, apex_dtype lt, const int64_t *target, int64_t cols,
                                int64_t ignore, float eps, float *loss, float *lse_out) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x, base = row * cols;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, apex_ld(logits, lt, base + c));
  mx = block_max(mx, scratch);
  float se = 0.0f, sx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = apex_ld(logits, lt, base + c);
    se += expf(v - mx);
    sx += v;
  }
  se = block_sum(se, scratch);
  sx = block_sum(sx, scratch);
  if (threadIdx.x == 0) {
    float lse = mx + logf(se);
    lse_out[row] = lse;
    int64_t t = target[row];
    if (t == ignore) loss[row] = 0.0f;
    else if (t < 0 || t >= cols) loss[row] = NAN;
    else loss[row] = (1.0f - eps) * (lse - apex_ld(logits, lt, base + t)) + eps * (lse - sx / (float)cols);
  }
}

__global__ void xent_bwd_kernel(const float *dloss, const void *logits, apex_dtype lt, const int64_t *target,
                                const float *lse, int64_t cols, int64_t ignore, float eps, void *dlogits) {
  const int64_t row = blockIdx.x, base = row * cols;
  int64_t t = target[row];
  float g = t == ignore ? 0.0f : dloss[row], l = lse[row], u = eps / (float)cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float p = expf(apex_ld(logits, lt, base + c) - l);
    apex_st(dlogits, lt, base + c, g * (p - u - (c == t ? 1.0f - eps : 0.0f)));
  }
}

extern "C" apex_status apex__cuda_xent_fwd(const void *logits, apex_dtype lt, const int64_t *target, int64_t rows,
                                           int64_t cols, int64_t ignore_index, float smoothing, float *loss,
                                           float *lse) {
  if (rows == 0) return APEX_OK;
  xent_fwd_kernel<<<(unsigned)rows, 256, 0, (cudaStream_t)apex__cuda_stream()>>>(logits, lt, target, cols,
                                                                                ignore_index, smoothing, loss, lse);
  return apex__cuda_check_launch("apex_kernel_cross_entropy_forward");
}

extern "C" apex_status apex__cuda_xent_bwd(const float *dloss, const void *logits, apex_dtype lt,
                                           const int64_t *target, const float *lse, int64_t rows, int64_t cols,
                                           int64_t ignore_index, float smoothing, void *dlogits) {
  if (rows == 0) return APEX_OK;
  xent_bwd_kernel<<<(unsigned)rows, 256, 0, (cudaStream_t)apex__cuda_stream()>>>(dloss, logits, lt, target, lse, cols,
                                                                                ignore_index, smoothing, dlogits);
  return apex__cuda_check_launch("apex_kernel_cross_entropy_backward");
}

/* ---- the cross-entropy slot (backend/args_nn.h) --------------------------------------------------------
 *
 * The slot's contract: per row the max m and r = 1 / sum exp(x - m) (stats), the term with label
 * smoothing e over C classes, -(1 - e) (x_t - lse) - e / C * sum_c (x_c - lse) with lse = m + log(sum),
 * as the CPU computes it (targets -1: a 0 term); the sum of the terms in double, and the reduced value.
 * The backward recomputes p = exp(x - m) r. One block per row; every sum is a block's fixed order.
 *
 * The forward reads a row once for its statistics: each thread keeps a running max m and the sum s of
 * exp(x - m) over its elements (rescaled when m grows, once a vector of 16 bytes), and the sum of x for the
 * smoothing term (sum_c (x_c - lse) = sum_c x_c - C lse); the block merges the threads' pairs in a fixed
 * order. With gx (the one-pass classifier, args_nn.h) a second sweep reads the row again, mostly from L2
 * (a row of GPT-2's vocabulary is 100 KB in bf16), and writes the gradient, possibly over x: the logits
 * go through DRAM once each way, where a forward and a backward kernel would read them twice and write once. */

namespace {

constexpr int CE_WIDE_THREADS = 1024; /* rows of 8192 classes and more: 8 or more 16-byte vectors a thread */
constexpr int CE_THREADS = 256;

/* (m, s) and (m2, s2): the pair of their union. m = -inf: no element yet (s is 0, or NaN after a NaN). */
__device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) {
    s += s2;
    return;
  }
  s = s * expf(m - mm) + s2 * expf(m2 - mm);
  m = mm;
}

/* One element into a thread's (m, s, sx), m already at least x (or x NaN). A -inf x adds exactly 0
 * (exp(-inf - m)), also while m is still -inf, where the subtraction would be NaN. */
__device__ __forceinline__ void ms_add(float m, float &s, float &sx, float x) {
  s += x == -INFINITY ? 0.0f : expf(x - m);
  sx += x;
}

/* Element c's gradient term w (p - smooth - (1 - eps at the target t)), p = exp(x - m) r recomputed from the
 * row's stats: the backward's, and the one-pass forward's. */
__device__ __forceinline__ float ce_term(float x, float m, float r, float w, float smooth, float eps, int64_t c, int64_t t) {
  return w * (expf(x - m) * r - smooth - (c == t ? 1.0f - eps : 0.0f));
}

/* Element c of a row's one-pass gradient: the term into a fresh gradient (an ignored row, t < 0: 0, whatever x
 * holds), as ce_bwd_kernel stores it. */
__device__ __forceinline__ float ce_grad(float x, float m, float r, float w, float smooth, float eps, int64_t c, int64_t t) {
  return t < 0 ? 0.0f : 0.0f + ce_term(x, m, r, w, smooth, eps, c, t);
}

/* The block's (m, s) and sum of x, every thread getting them: warps by butterflies, then warp 0 over the
 * warps, in a fixed order. sm: >= 3 * 32 + 3 floats. */
__device__ __forceinline__ void ms_block(float &m, float &s, float &sx, float *sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_merge(m, s, m2, s2);
    sx += __shfl_xor_sync(0xffffffffu, sx, o);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) sm[warp] = m, sm[32 + warp] = s, sm[64 + warp] = sx;
  __syncthreads();
  if (warp == 0) {
    m = lane < nw ? sm[lane] : -INFINITY;
    s = lane < nw ? sm[32 + lane] : 0.0f;
    sx = lane < nw ? sm[64 + lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      ms_merge(m, s, m2, s2);
      sx += __shfl_xor_sync(0xffffffffu, sx, o);
    }
    if (lane == 0) sm[96] = m, sm[97] = s, sm[98] = sx;
  }
  __syncthreads();
  m = sm[96], s = sm[97], sx = sm[98];
}

/* Rows of x [rows, cols] (type Dt, VEC elements a 16-byte access when the rows allow it, else 1): stats,
 * terms, and with gx the one-pass gradient w1 (p - e / C - (1 - e at the target)) (0 for an ignored row). */
template <class Dt, int VEC>
__global__ void __launch_bounds__(CE_WIDE_THREADS) ce_fwd_kernel(const typename Dt::S *x, typename Dt::S *gx, const int64_t *target, int64_t rows, int64_t cols, float eps,
                              float w1, float *stats, float *loss) {
  __shared__ float sm[99];
  const int64_t nvec = cols / VEC, tail = nvec * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const typename Dt::S *xr = x + row * cols;
    const int64_t t = target[row];
    float m = -INFINITY, s = 0.0f, sx = 0.0f;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      float e[VEC];
      dev_ld_vec<Dt, VEC>(xr + v * VEC, e);
      float vm = e[0];
#pragma unroll
      for (int i = 1; i < VEC; i++) vm = fmaxf(vm, e[i]);
      if (vm > m) {
        s = m == -INFINITY ? s : s * expf(m - vm);
        m = vm;
      }
#pragma unroll
      for (int i = 0; i < VEC; i++) ms_add(m, s, sx, e[i]);
    }
    for (int64_t c = tail + threadIdx.x; c < cols; c += blockDim.x) {
      const float e = Dt::ld(xr[c]);
      if (e > m) {
        s = m == -INFINITY ? s : s * expf(m - e);
        m = e;
      }
      ms_add(m, s, sx, e);
    }
    /* x[t] is read before the block's last barrier in ms_block, so before any thread writes the row */
    const float xt = t >= 0 ? Dt::ld(xr[t]) : 0.0f;
    ms_block(m, s, sx, sm);
    const float lse = m + logf(s), r = 1.0f / s;
    if (threadIdx.x == 0) {
      stats[2 * row] = m;
      stats[2 * row + 1] = r;
      loss[row] = t < 0 ? 0.0f : -(1.0f - eps) * (xt - lse) - eps / (float)cols * (sx - (float)cols * lse);
    }
    if (gx) {
      typename Dt::S *gr = gx + row * cols;
      const float smooth = eps / (float)cols;
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        float e[VEC];
        dev_ld_vec<Dt, VEC>(xr + v * VEC, e);
#pragma unroll
        for (int i = 0; i < VEC; i++) e[i] = ce_grad(e[i], m, r, w1, smooth, eps, v * VEC + i, t);
        dev_st_vec<Dt, VEC>(gr + v * VEC, e);
      }
      for (int64_t c = tail + threadIdx.x; c < cols; c += blockDim.x) gr[c] = Dt::st(ce_grad(Dt::ld(xr[c]), m, r, w1, smooth, eps, c, t));
    }
    __syncthreads(); /* sm is the next row's */
  }
}

template <class Dt>
void ce_fwd_launch(const apex_nn_cross_entropy_args *a, unsigned grid, float w1) {
  typedef typename Dt::S S;
  constexpr int VEC = 16 / sizeof(S);
  const int64_t cols = (int64_t)a->classes;
  const int threads = cols >= 8192 ? CE_WIDE_THREADS : CE_THREADS;
  const bool wide = cols % VEC == 0 && ((uintptr_t)a->x.data & 15u) == 0 && ((uintptr_t)a->gx & 15u) == 0;
  cudaStream_t st = (cudaStream_t)apex__cuda_stream();
  if (wide)
    ce_fwd_kernel<Dt, VEC><<<grid, threads, 0, st>>>((const S *)a->x.data, (S *)a->gx, a->target, (int64_t)a->rows, cols, a->smoothing, w1,
                                                    a->stats, a->loss);
  else
    ce_fwd_kernel<Dt, 1><<<grid, threads, 0, st>>>((const S *)a->x.data, (S *)a->gx, a->target, (int64_t)a->rows, cols, a->smoothing, w1,
                                                  a->stats, a->loss);
}

} /* namespace */

/* One block: the sum of l[0..n) in double (each thread a strided share, then a tree in shared memory:
 * a fixed order), into *sum (may be NULL) and *result (may be NULL) as (float)(sum / divisor), rounded
 * to rt. */
#define CE_SUM_THREADS 256
__global__ void ce_sum_kernel(const float *l, int64_t n, double *sum, void *result, apex_dtype rt, double divisor) {
  __shared__ double part[CE_SUM_THREADS];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += CE_SUM_THREADS) s += (double)l[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = CE_SUM_THREADS / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (sum) *sum = part[0];
    if (result) apex_st(result, rt, 0, (float)(part[0] / divisor));
  }
}

/* gx row (f32) = (accumulate ? gx : 0) + w (p - e / C - (1 - e at the target)), w the row's gradient
 * by the reduction (0: none, 1: sum, 2: mean, as apex_nn_reduction); ignored rows get no term. */
__global__ void ce_bwd_kernel(const void *x, apex_dtype xt, const float *stats, const int64_t *target, int64_t rows, int64_t cols,
                              float eps, int reduction, double count, const float *gout, void *gx, apex_dtype gxt, int accumulate) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols, t = target[row];
    const float m = stats[2 * row], r = stats[2 * row + 1], smooth = eps / (float)cols;
    const float w = reduction == APEX_NN_NONE ? gout[row] : reduction == APEX_NN_MEAN ? (float)(gout[0] / count) : gout[0];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float prev = accumulate ? apex_ld(gx, gxt, base + c) : 0.0f;
      if (t < 0) {
        apex_st(gx, gxt, base + c, prev);
        continue;
      }
      apex_st(gx, gxt, base + c, prev + ce_term(apex_ld(x, xt, base + c), m, r, w, smooth, eps, c, t));
    }
  }
}

static unsigned ce_grid(size_t rows) { return (unsigned)(rows < 65535 * 16 ? rows : 65535 * 16); }

extern "C" apex_status apex__cuda_cross_entropy_slot_fwd(const apex_nn_cross_entropy_args *a) {
  if (!a->rows) {
    if (!a->sum && !a->result) return APEX_OK;
  } else {
    const float w1 = (float)(1.0 / a->divisor); /* the one-pass gradient's weight: the backward's for a gout of 1 */
    switch (a->x.dtype) {
    case APEX_F32: ce_fwd_launch<DevF32>(a, ce_grid(a->rows), w1); break;
    case APEX_F16: ce_fwd_launch<DevF16>(a, ce_grid(a->rows), w1); break;
    case APEX_BF16: ce_fwd_launch<DevBF16>(a, ce_grid(a->rows), w1); break;
    default: return apex__fail(APEX_ERR_DTYPE, "nn_cross_entropy: logits of %s: f32, f16 or bf16", apex_dtype_name(a->x.dtype));
    }
    apex_status st = apex__cuda_check_launch("nn_cross_entropy");
    if (st != APEX_OK || (!a->sum && !a->result)) return st;
  }
  ce_sum_kernel<<<1, CE_SUM_THREADS, 0, (cudaStream_t)apex__cuda_stream()>>>(a->loss, (int64_t)a->rows, a->sum, a->result, a->result_dtype,
                                                                             a->divisor);
  return apex__cuda_check_launch("nn_cross_entropy");
}

extern "C" apex_status apex__cuda_cross_entropy_slot_bwd(const apex_nn_cross_entropy_bwd_args *a) {
  if (!a->rows || !a->classes || !a->gx) return APEX_OK;
  ce_bwd_kernel<<<ce_grid(a->rows), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(
      a->x.data, a->x.dtype, a->stats, a->target, (int64_t)a->rows, (int64_t)a->classes, a->smoothing, (int)a->reduction, a->count, a->gout,
      a->gx, a->gx_dtype, a->accumulate_x);
  return apex__cuda_check_launch("nn_cross_entropy_bwd");
}
