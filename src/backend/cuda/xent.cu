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
