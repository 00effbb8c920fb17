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
 * The backward recomputes p = exp(x - m) r. One block per row; every sum is a block's fixed order. */

__global__ void ce_fwd_kernel(const void *x, apex_dtype xt, const int64_t *target, int64_t rows, int64_t cols, float eps,
                              float *stats, float *loss) {
  __shared__ float scratch[33];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, apex_ld(x, xt, base + c));
    mx = block_max(mx, scratch);
    float se = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) se += expf(apex_ld(x, xt, base + c) - mx);
    se = block_sum(se, scratch);
    const float lse = mx + logf(se);
    float sl = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sl += apex_ld(x, xt, base + c) - lse;
    sl = block_sum(sl, scratch);
    if (threadIdx.x == 0) {
      stats[2 * row] = mx;
      stats[2 * row + 1] = 1.0f / se;
      const int64_t t = target[row];
      loss[row] = t < 0 ? 0.0f : -(1.0f - eps) * (apex_ld(x, xt, base + t) - lse) - eps / (float)cols * sl;
    }
  }
}

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
      const float p = expf(apex_ld(x, xt, base + c) - m) * r;
      apex_st(gx, gxt, base + c, prev + w * (p - smooth - (c == t ? 1.0f - eps : 0.0f)));
    }
  }
}

static unsigned ce_grid(size_t rows) { return (unsigned)(rows < 65535 * 16 ? rows : 65535 * 16); }

extern "C" apex_status apex__cuda_cross_entropy_slot_fwd(const apex_nn_cross_entropy_args *a) {
  if (!a->rows) {
    if (!a->sum && !a->result) return APEX_OK;
  } else {
    ce_fwd_kernel<<<ce_grid(a->rows), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(a->x.data, a->x.dtype, a->target, (int64_t)a->rows,
                                                                                   (int64_t)a->classes, a->smoothing, a->stats, a->loss);
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
