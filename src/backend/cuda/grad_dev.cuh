/* grad_dev.cuh: what the nn slots' CUDA kernels share (loss.cu, shape.cu, conv.cu's pooling, norm.cu's
 * batch norm backward): args_nn.h's accumulate rule for a gradient element, warp-wide reductions for
 * kernels that give one warp to a line, and the launch check. Every reduction here runs in a fixed
 * order set by the shape alone (no atomics), so each run gives the same bits. */
#ifndef APEX_CUDA_GRAD_DEV_CUH
#define APEX_CUDA_GRAD_DEV_CUH

#include <cuda_runtime.h>

#include "backend/cuda/dtype_dev.cuh"

/* g[i] receives term t by args_nn.h's rule: g[i] + t, or the bits of 0.0f + t into a buffer that holds
 * nothing yet (-0 becomes +0), written as a select so that no compiler folds the addition away. */
__device__ __forceinline__ void grad_put(float *g, int64_t i, float t, int accumulate) {
  g[i] = accumulate ? g[i] + t : (t == 0.0f ? 0.0f : t);
}

/* Sums and maxima over a warp's 32 lanes by an xor butterfly: every lane ends with the same bits. */
template <typename T>
__device__ __forceinline__ T warp_total(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* A block of 256 threads' double sum, in a fixed tree (warps, then warp 0 over their 8 results). */
__device__ __forceinline__ double block_total256(double v, double *scratch /* 8 */) {
  v = warp_total(v);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double t = 0;
  if (warp == 0) t = warp_total(lane < 8 ? scratch[lane] : 0.0);
  if (threadIdx.x == 0) scratch[0] = t;
  __syncthreads();
  t = scratch[0];
  __syncthreads();
  return t;
}

static inline cudaStream_t nn_stream(void) { return (cudaStream_t)apex__cuda_stream(); }

#endif
