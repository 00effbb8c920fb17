/* dtype_dev.cuh: loading and storing f32/f16/bf16 elements in device code, by a dtype known only at
 * run time. The switch is the same for every thread of a launch, so it costs a branch, not a
 * divergence, and one kernel serves every dtype mix (memory-bound kernels do not miss the templates).
 * The conversions are core/convert_scalar.h's, compiled for the device: the GPU rounds as the CPU does. */
#ifndef APEX_CUDA_DTYPE_DEV_CUH
#define APEX_CUDA_DTYPE_DEV_CUH

#include <stdint.h>

#include "apex/dtype.h"
#include "core/convert_scalar.h"

__device__ __forceinline__ float apex_ld(const void *p, apex_dtype t, int64_t i) {
  if (t == APEX_F32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return t == APEX_F16 ? apex__f16_to_f32(h) : apex__bf16_to_f32(h);
}

__device__ __forceinline__ void apex_st(void *p, apex_dtype t, int64_t i, float v) {
  if (t == APEX_F32) ((float *)p)[i] = v;
  else ((uint16_t *)p)[i] = t == APEX_F16 ? apex__f32_to_f16(v) : apex__f32_to_bf16(v);
}

__device__ __forceinline__ int apex_finite(float v) { return (apex__f32_bits(v) & 0x7F800000u) != 0x7F800000u; }

/* Blocks for n elements at `threads` per block and `per_thread` each, capped for grid-stride loops. */
static inline unsigned apex_grid(int64_t n, int threads, int per_thread) {
  int64_t b = (n + (int64_t)threads * per_thread - 1) / ((int64_t)threads * per_thread);
  if (b < 1) b = 1;
  if (b > 65535 * 8) b = 65535 * 8;
  return (unsigned)b;
}

#endif
