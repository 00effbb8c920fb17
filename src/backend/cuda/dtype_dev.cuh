/* dtype_dev.cuh: loading and storing f32/f16/bf16 elements in device code. Two forms:
 * - by a dtype known only at run time (apex_ld, apex_st): the switch is the same for every thread of a
 *   launch, so it costs a branch, not a divergence, and one kernel serves every dtype mix;
 * - by a dtype known at compile time (the tags DevF32, DevF16, DevBF16 and dev_ld_vec, dev_st_vec), for
 *   the kernels where the per-element switch and 2-byte accesses cost real bandwidth (norm.cu): they load
 *   and store VEC neighbours at once, in 16-byte accesses when the width allows.
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

/* Compile-time dtypes: S is the storage type; ld widens to f32, st rounds to nearest even. */
struct DevF32 {
  typedef float S;
  static __device__ __forceinline__ float ld(S v) { return v; }
  static __device__ __forceinline__ S st(float v) { return v; }
};
struct DevF16 {
  typedef uint16_t S;
  static __device__ __forceinline__ float ld(S v) { return apex__f16_to_f32(v); }
  static __device__ __forceinline__ S st(float v) { return apex__f32_to_f16(v); }
};
struct DevBF16 {
  typedef uint16_t S;
  static __device__ __forceinline__ float ld(S v) { return apex__bf16_to_f32(v); }
  static __device__ __forceinline__ S st(float v) { return apex__f32_to_bf16(v); }
};

/* Whether VEC elements of D go as whole 16-byte accesses (the caller guarantees the alignment). */
template <class D, int VEC>
struct DevVec {
  static constexpr bool wide = (sizeof(typename D::S) * VEC) % 16 == 0;
  static constexpr int words = (int)(sizeof(typename D::S) * VEC / 4); /* 32-bit words moved */
};

/* Element i of S packed in 32-bit words (little-endian, as memory holds them): register shifts, never
 * a local-memory array. */
__device__ __forceinline__ float dev_unpack(const uint32_t *w, int i, float) { return __uint_as_float(w[i]); }
__device__ __forceinline__ uint16_t dev_unpack(const uint32_t *w, int i, uint16_t) {
  return (uint16_t)(w[i >> 1] >> ((i & 1) * 16));
}
__device__ __forceinline__ void dev_pack(uint32_t *w, int i, float v) { w[i] = __float_as_uint(v); }
__device__ __forceinline__ void dev_pack(uint32_t *w, int i, uint16_t v) {
  w[i >> 1] = (i & 1) ? (w[i >> 1] | ((uint32_t)v << 16)) : (uint32_t)v;
}

/* out[0..VEC) = p[0..VEC) as f32. When DevVec says wide, p must be 16-byte aligned. */
template <class D, int VEC>
__device__ __forceinline__ void dev_ld_vec(const typename D::S *p, float *out) {
  typedef typename D::S S;
  if constexpr (DevVec<D, VEC>::wide) {
    uint32_t w[DevVec<D, VEC>::words];
#pragma unroll
    for (int i = 0; i < DevVec<D, VEC>::words / 4; i++) {
      uint4 r = ((const uint4 *)p)[i];
      w[4 * i] = r.x, w[4 * i + 1] = r.y, w[4 * i + 2] = r.z, w[4 * i + 3] = r.w;
    }
#pragma unroll
    for (int v = 0; v < VEC; v++) out[v] = D::ld(dev_unpack(w, v, S()));
  } else {
#pragma unroll
    for (int v = 0; v < VEC; v++) out[v] = D::ld(p[v]);
  }
}

/* p[0..VEC) = in[0..VEC) rounded to D; the same alignment rule as dev_ld_vec. */
template <class D, int VEC>
__device__ __forceinline__ void dev_st_vec(typename D::S *p, const float *in) {
  if constexpr (DevVec<D, VEC>::wide) {
    uint32_t w[DevVec<D, VEC>::words];
#pragma unroll
    for (int v = 0; v < VEC; v++) dev_pack(w, v, D::st(in[v]));
#pragma unroll
    for (int i = 0; i < DevVec<D, VEC>::words / 4; i++)
      ((uint4 *)p)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  } else {
#pragma unroll
    for (int v = 0; v < VEC; v++) p[v] = D::st(in[v]);
  }
}

/* Blocks for n elements at `threads` per block and `per_thread` each, capped for grid-stride loops. */
static inline unsigned apex_grid(int64_t n, int threads, int per_thread) {
  int64_t b = (n + (int64_t)threads * per_thread - 1) / ((int64_t)threads * per_thread);
  if (b < 1) b = 1;
  if (b > 65535 * 8) b = 65535 * 8;
  return (unsigned)b;
}

#endif
