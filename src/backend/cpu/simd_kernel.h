/* simd_kernel.h: a multi-tensor tile kernel written once and compiled for three instruction sets.
 *
 * A kernel's body is an always-inline function; APEX__SIMD_KERNEL(name) compiles it for the build's
 * baseline (SSE2 on x86-64), for AVX2 and for AVX-512, and apex__simd_pick chooses by the ISA level
 * (apex_cpu_max_isa) at run time. The AVX2 and AVX-512 copies are the same C code with 8- and 16-wide
 * vectors. FMA is not enabled for AVX2, and apex builds ISO C, where GCC does not contract a * b + c
 * (-ffp-contract=off; the AVX-512 target implies FMA, so this is what keeps that copy uncontracted),
 * so every element gets the same IEEE operations in the same order: the three copies give the same
 * bits (test_optim_api and test_multi_tensor check every kernel on every level the CPU has). Measured over 10M f32 parameters in 20 tensors
 * (best of 15 steps, this shared 2-core VM, another build running): AdamW 14.7 -> 11.1 ms per step
 * on 1 thread and 7.8 -> 6.1 ms on 2; LAMB 28.5 -> 23.3 and 15.3 -> 12.4; SGD with momentum, which is
 * bound by memory, unchanged (3.6-3.7 ms on 2 threads): the square roots and divisions of the Adam
 * family are what the wider vectors speed up. */
#ifndef APEX_BACKEND_CPU_SIMD_KERNEL_H
#define APEX_BACKEND_CPU_SIMD_KERNEL_H

#include "apex/mt_apply.h"
#include "core/internal.h"

#if APEX_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
#define APEX__TARGET_AVX2 __attribute__((target("avx2")))
/* 512-bit vectors: GCC's default cost model would keep 256-bit ones for some tunings. */
#define APEX__TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#else
#define APEX__TARGET_AVX2
#define APEX__TARGET_AVX512
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
