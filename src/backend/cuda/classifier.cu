/* classifier.cu: the fused classifier of a language model's training step (cuda_internal.h): cross entropy
 * over each row of logits and its gradient, written in place over the logits, in one kernel.
 *
 * One block per row (1024 threads). Pass 1 reads the row once, in 16-byte vectors, keeping per thread a
 * running max m and sum s of exp(x - m) (rescaled when m grows, once a vector); the block merges the
 * threads' (m, s) pairs in a fixed order (warp butterflies, then warp 0), so lse = m + log s has the same
 * bits on every run. Pass 2 reads the row again (mostly from L2: the rows in flight are ~100 KB each) and
 * writes dlogits = dloss (softmax - onehot) in the logits' dtype over it. The row's loss lse - x[target] is
 * taken from x[target] read before any thread writes. So the logits are read twice and written once, where
 * a forward kernel (max, then sum) and a backward kernel read them three or four times. A target of -1 is
 * ignored (loss 0, gradient row 0); any other target outside [0, cols) gives a NaN loss and the row's
 * softmax as gradient (the kernel cannot stop the step; the NaN shows in the loss). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/dtype_dev.cuh"

#define CLS "apex__cuda_classifier"

namespace {

constexpr int THREADS = 1024;
constexpr float LOG2E = 1.4426950408889634f;

/* (m, s) and (m2, s2): the pair of their union. m = -inf means empty (s = 0). */
__device__ __forceinline__ void merge(float &m, float &s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return; /* both empty */
  s = s * exp2f((m - mm) * LOG2E) + s2 * exp2f((m2 - mm) * LOG2E);
  m = mm;
}

template <class Dt, int VEC>
__global__ void __launch_bounds__(THREADS)
    classifier_kernel(typename Dt::S *logits, const int64_t *target, int64_t cols, int64_t ld, float dloss, float *loss) {
  typedef typename Dt::S S;
  __shared__ float sm_m[32], sm_s[32], sm_out[2];
  const int64_t row = blockIdx.x;
  S *x = logits + row * ld;
  const int64_t t = target[row];
  const bool valid = t >= 0 && t < cols;
  const float xt = valid ? Dt::ld(x[t]) : 0.0f; /* read before any thread of the block writes the row */
  const int64_t nvec = cols / VEC, tail = nvec * VEC;
  float m = -INFINITY, s = 0.0f;
  for (int64_t v = threadIdx.x; v < nvec; v += THREADS) {
    float e[VEC];
    dev_ld_vec<Dt, VEC>(x + v * VEC, e);
    float vm = e[0];
#pragma unroll
    for (int i = 1; i < VEC; i++) vm = fmaxf(vm, e[i]);
    if (vm > m) {
      s = m == -INFINITY ? 0.0f : s * exp2f((m - vm) * LOG2E);
      m = vm;
    }
    const float ml = m * LOG2E;
#pragma unroll
    for (int i = 0; i < VEC; i++) s += exp2f(__fmaf_rn(e[i], LOG2E, -ml));
  }
  for (int64_t c = tail + threadIdx.x; c < cols; c += THREADS) merge(m, s, Dt::ld(x[c]), 1.0f);
  /* the block's (m, s): warps by butterflies, then warp 0 over the warps, in a fixed order */
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads(); /* also: every thread has read its part of the row (and xt is read) before any write */
  if (warp == 0) {
    m = sm_m[lane]; /* THREADS / 32 == 32 warps */
    s = sm_s[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      const float lse = m + logf(s);
      sm_out[0] = lse;
      loss[row] = t == -1 ? 0.0f : valid ? lse - xt : NAN;
    }
  }
  __syncthreads();
  const float lse2 = sm_out[0] * LOG2E, g = t == -1 ? 0.0f : dloss;
  for (int64_t v = threadIdx.x; v < nvec; v += THREADS) {
    float e[VEC];
    dev_ld_vec<Dt, VEC>(x + v * VEC, e);
#pragma unroll
    for (int i = 0; i < VEC; i++) e[i] = g * (exp2f(__fmaf_rn(e[i], LOG2E, -lse2)) - (v * VEC + i == t ? 1.0f : 0.0f));
    dev_st_vec<Dt, VEC>(x + v * VEC, e);
  }
  for (int64_t c = tail + threadIdx.x; c < cols; c += THREADS)
    x[c] = Dt::st(g * (exp2f(__fmaf_rn(Dt::ld(x[c]), LOG2E, -lse2)) - (c == t ? 1.0f : 0.0f)));
}

template <class Dt, int VEC>
apex_status launch(void *logits, const int64_t *target, int64_t rows, int64_t cols, int64_t ld, float dloss, float *loss,
                   bool wide) {
  cudaStream_t st = (cudaStream_t)apex__cuda_stream();
  typedef typename Dt::S S;
  if (wide) classifier_kernel<Dt, VEC><<<(unsigned)rows, THREADS, 0, st>>>((S *)logits, target, cols, ld, dloss, loss);
  else classifier_kernel<Dt, 1><<<(unsigned)rows, THREADS, 0, st>>>((S *)logits, target, cols, ld, dloss, loss);
  return apex__cuda_check_launch(CLS);
}

} /* namespace */

extern "C" apex_status apex__cuda_classifier(void *logits, apex_dtype lt, const int64_t *target, int64_t rows, int64_t cols,
                                             int64_t ld, float dloss, float *loss) {
  if (!logits || !target || !loss) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL argument", CLS);
  if (rows < 0 || cols < 1 || ld < cols || rows > 0x7fffffff)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: rows %lld, cols %lld, ld %lld: rows in [0, 2^31), cols >= 1, ld >= cols",
                      CLS, (long long)rows, (long long)cols, (long long)ld);
  if (rows == 0) return APEX_OK;
  const int vec = lt == APEX_F32 ? 4 : 8; /* 16 bytes */
  const bool wide = ld % vec == 0 && ((uintptr_t)logits & 15u) == 0;
  switch (lt) {
  case APEX_F32: return launch<DevF32, 4>(logits, target, rows, cols, ld, dloss, loss, wide);
  case APEX_F16: return launch<DevF16, 8>(logits, target, rows, cols, ld, dloss, loss, wide);
  case APEX_BF16: return launch<DevBF16, 8>(logits, target, rows, cols, ld, dloss, loss, wide);
  default: return apex__fail(APEX_ERR_DTYPE, "%s: logits of %s: f32, f16 or bf16", CLS, apex_dtype_name(lt));
  }
}
