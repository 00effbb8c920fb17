/* bn_stats.cu: per-channel batch statistics by Welford's method (Apex's welford kernels for
 * SyncBatchNorm). One block per channel; each thread runs Welford over its share of the N * HW values,
 * then the threads' (count, mean, M2) triples are merged with Chan's formula in a fixed tree order,
 * which is also how SyncBatchNorm merges ranks. */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"

#define BN_THREADS 256

__device__ __forceinline__ void welford_merge(float &n, float &mean, float &m2, float nb, float meanb, float m2b) {
  float nt = n + nb;
  if (nt == 0.0f) return;
  float d = meanb - mean;
  mean += d * (nb / nt);
  m2 += m2b + d * d * (n * nb / nt);
  n = nt;
}

__global__ void bn_stats_kernel(const void *x, apex_dtype xt, int64_t n, int64_t c, int64_t hw, float *mean_out,
                                float *var_out, float *m2_out) {
  __shared__ float sn[BN_THREADS], sm[BN_THREADS], sq[BN_THREADS];
  const int64_t ch = blockIdx.x, total = n * hw;
  float cnt = 0.0f, mean = 0.0f, m2 = 0.0f;
  for (int64_t j = threadIdx.x; j < total; j += BN_THREADS) {
    int64_t b = j / hw, s = j - b * hw;
    float v = apex_ld(x, xt, (b * c + ch) * hw + s);
    cnt += 1.0f;
    float d = v - mean;
    mean += d / cnt;
    m2 += d * (v - mean);
  }
  sn[threadIdx.x] = cnt;
  sm[threadIdx.x] = mean;
  sq[threadIdx.x] = m2;
  __syncthreads();
  for (int stride = BN_THREADS / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      float a = sn[threadIdx.x], am = sm[threadIdx.x], aq = sq[threadIdx.x];
      welford_merge(a, am, aq, sn[threadIdx.x + stride], sm[threadIdx.x + stride], sq[threadIdx.x + stride]);
      sn[threadIdx.x] = a;
      sm[threadIdx.x] = am;
      sq[threadIdx.x] = aq;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    mean_out[ch] = sm[0];
    var_out[ch] = sn[0] > 0.0f ? sq[0] / sn[0] : 0.0f;
    if (m2_out) m2_out[ch] = sq[0];
  }
}

extern "C" apex_status apex__cuda_bn_stats(const void *x, apex_dtype xt, int64_t n, int64_t c, int64_t hw, float *mean,
                                           float *var, float *m2) {
  if (c == 0) return APEX_OK;
  bn_stats_kernel<<<(unsigned)c, BN_THREADS, 0, (cudaStream_t)apex__cuda_stream()>>>(x, xt, n, c, hw, mean, var, m2);
  return apex__cuda_check_launch("apex_kernel_batch_norm_stats");
}
