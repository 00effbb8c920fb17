/* dropout.cu: the dropout slot (backend/args_nn.h) on the GPU. The forward draws the mask itself with
 * core/rng.c's Philox 4x32-10 and its Bernoulli fill, element i from counter block offset + i / 4, lane
 * i % 4, keep where the lane's top 24 bits as a unit float are below the keep probability: the bits of
 * apex_rng_bernoulli on the CPU, so a seed gives one mask on every backend. One thread per block of 4. */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"

__device__ __forceinline__ void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; round++) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c[0] = hi1 ^ c[1] ^ k0;
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k1;
    c[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

__global__ void dropout_fwd_kernel(size_t n, uint8_t *mask, uint64_t seed, uint64_t offset, float keep, const void *x, apex_dtype xt,
                                   void *out, apex_dtype ot, float s) {
  const size_t blocks = (n + 3) / 4;
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (size_t)gridDim.x * blockDim.x) {
    const uint64_t ctr = offset + b;
    uint32_t w[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0u, 0u};
    philox4x32_10(w, (uint32_t)seed, (uint32_t)(seed >> 32));
    for (int lane = 0; lane < 4; lane++) {
      const size_t i = 4 * b + lane;
      if (i >= n) break;
      const uint8_t m = (float)(w[lane] >> 8) * (1.0f / 16777216.0f) < keep;
      mask[i] = m;
      apex_st(out, ot, (int64_t)i, m ? apex_ld(x, xt, (int64_t)i) * s : 0.0f);
    }
  }
}

__global__ void dropout_bwd_kernel(size_t n, const uint8_t *mask, const float *gout, float *gx, float s, int accumulate) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    gx[i] = (accumulate ? gx[i] : 0.0f) + (mask[i] ? gout[i] * s : 0.0f);
}

extern "C" apex_status apex__cuda_dropout_slot_fwd(const apex_nn_dropout_args *a) {
  if (!a->n) return APEX_OK;
  dropout_fwd_kernel<<<apex_grid((int64_t)((a->n + 3) / 4), 256, 1), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(
      a->n, a->mask, a->seed, a->offset, a->keep, a->x.data, a->x.dtype, a->out, a->out_dtype, a->s);
  return apex__cuda_check_launch("nn_dropout");
}

extern "C" apex_status apex__cuda_dropout_slot_bwd(const apex_nn_dropout_bwd_args *a) {
  if (!a->n || !a->gx) return APEX_OK;
  dropout_bwd_kernel<<<apex_grid((int64_t)a->n, 256, 4), 256, 0, (cudaStream_t)apex__cuda_stream()>>>(a->n, a->mask, (const float *)a->gout, (float *)a->gx, a->s,
                                                                                                     a->accumulate_x);
  return apex__cuda_check_launch("nn_dropout_bwd");
}
