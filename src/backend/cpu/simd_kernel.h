/* simd_kernel.h: a multi-tensor tile kernel written once and compiled for three instruction sets.
 *
 * A kernel's body is an always-inline function; APEX__SIMD_KERNEL(name) compiles it for the build's
 * baseline (SSE2 on x86-64), for AVX2 and for AVX-512, and apex__simd_pick chooses by the ISA level
 * (apex_cpu_max_isa) at run time. The AVX2 and AVX-512 copies are the same C code with 8- and 16-wide
 * vectors. Nothing may contract a * b + c into an FMA: apex builds ISO C, where GCC does not
 * contract, but clang does by default and its avx512f implies FMA, hence the pragma below. So every
 * element gets the same IEEE operations in the same order, and the three copies give the same bits
 * (test_optim_api and test_multi_tensor check every kernel on every level the CPU has).
 *
 * What the vectors buy is compute: the square roots and divisions of the Adam family. Once a kernel
 * runs its element in one pass (optim_adam.c), it is bound by memory; see optim_adam.c for figures. */
#ifndef APEX_BACKEND_CPU_SIMD_KERNEL_H
#define APEX_BACKEND_CPU_SIMD_KERNEL_H

#include "apex/mt_apply.h"
#include "core/internal.h"

#if APEX_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
#define APEX__TARGET_AVX2 __attribute__((target("avx2")))
#if defined(__clang__)
#define APEX__TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#else
/* 512-bit vectors: GCC's cost model would keep 256-bit ones for some tunings (clang has no such switch
 * in the attribute, and uses 512 bits for it). */
#define APEX__TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#endif
#else
#define APEX__TARGET_AVX2
#define APEX__TARGET_AVX512
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

/* For kernel bodies and the helpers they call, so that each copy inlines them for its own target. */
#define APEX__INLINE static inline __attribute__((always_inline))

typedef struct apex__simd_kernel {
  apex_mt_kernel portable, avx2, avx512;
} apex__simd_kernel;

/* Defines `static const apex__simd_kernel name` from `name##_body`. */
#define APEX__SIMD_KERNEL(name)                                                                              \
  static void name##_portable(void *ctx, const apex_mt_tile *t, int *nonfinite) { name##_body(ctx, t, nonfinite); } \
  APEX__TARGET_AVX2 static void name##_avx2(void *ctx, const apex_mt_tile *t, int *nonfinite) {               \
    name##_body(ctx, t, nonfinite);                                                                           \
  }                                                                                                           \
  APEX__TARGET_AVX512 static void name##_avx512(void *ctx, const apex_mt_tile *t, int *nonfinite) {           \
    name##_body(ctx, t, nonfinite);                                                                           \
  }                                                                                                           \
  static const apex__simd_kernel name = {name##_portable, name##_avx2, name##_avx512}

/* The copy of k for this CPU and ISA cap: AVX-512 from APEX_CPU_ISA_AVX512 up, AVX2 at AVX2. */
apex_mt_kernel apex__simd_pick(const apex__simd_kernel *k);

#endif
