/* block_reduce.cuh: a block-wide sum in a fixed order (warp shuffles, then warp 0 over the warps'
 * results), so that the fused kernels give the same bits on every run. Every thread gets the sum. */
#ifndef APEX_CUDA_BLOCK_REDUCE_CUH
#define APEX_CUDA_BLOCK_REDUCE_CUH

__device__ __forceinline__ float block_sum(float v, float *scratch /* >= 33 floats */) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads(); /* scratch may still be read from a previous call */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? scratch[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  return scratch[32];
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? scratch[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  return scratch[32];
}

#endif
