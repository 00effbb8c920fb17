/* block_reduce.cuh: warp- and block-wide sums in a fixed order (warp shuffles, then warp 0 over the
 * warps' results), so that the fused kernels give the same bits on every run. Every thread gets the sum. */
#ifndef APEX_CUDA_BLOCK_REDUCE_CUH
#define APEX_CUDA_BLOCK_REDUCE_CUH

/* The sum of v over the 32 lanes of a warp by an xor butterfly: at every step a lane and its partner add
 * the same two values, so all lanes end with the same bits. All 32 lanes must call it. */
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float block_sum(float v, float *scratch /* >= 33 floats */) {
  v = warp_sum(v);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads(); /* scratch may still be read from a previous call */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = warp_sum(lane < nw ? scratch[lane] : 0.0f);
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
