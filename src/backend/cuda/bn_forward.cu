/* bn_forward.cu: the batch-norm slot's forward (backend/args_nn.h) on the GPU, one block per channel:
 * the channel's statistics (this batch's in training: the mean, then the mean of squared deviations, each
 * summed in double in the block's fixed order; the running ones in evaluation; or the given ones), the
 * running statistics' update, stats (mean[C], rstd[C]) for the backward, and the normalised output
 * (x - mean) * rstd * w + b, through max(v, 0) with relu, in f32 rounded once to the output's dtype. */
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"

#define BNF_THREADS 256

/* The block's sum of v (every thread's share), in a fixed tree order; every thread gets it. */
__device__ double bnf_block_sum(double v, double *part) {
  __syncthreads(); /* part may still be read from a previous call */
  part[threadIdx.x] = v;
  __syncthreads();
  for (int k = BNF_THREADS / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  return part[0];
}

__global__ void bn_forward_kernel(const void *x, apex_dtype xt, int64_t N, int64_t C, int64_t S, const float *w, const float *b, void *out,
                                  apex_dtype ot, float *stats, int training, int relu, float eps, float mom, float *rm, float *rv,
                                  const float *gm, const float *gr, const float *gv) {
  __shared__ double part[BNF_THREADS];
  const int64_t c = blockIdx.x, M = N * S;
  float m, r;
  if (gm) {
    m = gm[c];
    r = gr[c];
    if (threadIdx.x == 0) {
      if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * gm[c]);
      if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * gv[c]);
    }
  } else {
    double mean, var;
    if (training) {
      double s = 0.0;
      for (int64_t j = threadIdx.x; j < M; j += BNF_THREADS) s += apex_ld(x, xt, ((j / S) * C + c) * S + j % S);
      mean = bnf_block_sum(s, part) / (double)M;
      const float mf = (float)mean;
      double q = 0.0;
      for (int64_t j = threadIdx.x; j < M; j += BNF_THREADS) {
        const float d = apex_ld(x, xt, ((j / S) * C + c) * S + j % S) - mf;
        q += (double)d * d;
      }
      q = bnf_block_sum(q, part);
      var = q / (double)M;
      if (threadIdx.x == 0) {
        if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mean);
        if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * q / (double)(M - 1));
      }
    } else {
      mean = rm[c];
      var = rv[c];
    }
    m = (float)mean;
    r = (float)(1.0 / sqrt(var + (double)eps));
  }
  if (threadIdx.x == 0) {
    stats[c] = m;
    stats[C + c] = r;
  }
  const float wc = w ? w[c] : 1.0f, bc = b ? b[c] : 0.0f;
  for (int64_t j = threadIdx.x; j < M; j += BNF_THREADS) {
    const int64_t at = ((j / S) * C + c) * S + j % S;
    float v = (apex_ld(x, xt, at) - m) * r * wc + bc;
    if (relu) v = v > 0.0f ? v : 0.0f;
    apex_st(out, ot, at, v);
  }
}

extern "C" apex_status apex__cuda_batch_norm_slot_fwd(const apex_nn_batch_norm_args *a) {
  if (!a->C) return APEX_OK;
  if (a->C > 0x7FFFFFFFu) return apex__fail(APEX_ERR_UNSUPPORTED, "nn_batch_norm: %zu channels on the cuda backend (at most 2^31 - 1)", a->C);
  bn_forward_kernel<<<(unsigned)a->C, BNF_THREADS, 0, (cudaStream_t)apex__cuda_stream()>>>(
      a->x.data, a->x.dtype, (int64_t)a->N, (int64_t)a->C, (int64_t)a->S, a->w, a->b, a->out, a->out_dtype, a->stats, a->training, a->relu,
      a->eps, a->momentum, a->running_mean, a->running_var, a->given_mean, a->given_rstd, a->given_var);
  return apex__cuda_check_launch("nn_batch_norm");
}
