/* dtype.h: the element types apex works in and exact conversions between them.
 *
 * f16 is IEEE 754 binary16, bf16 is the top half of an IEEE binary32. Every conversion to a
 * narrower type rounds to nearest, ties to even; ±Inf is kept; a finite f32 too large for f16
 * becomes ±Inf; subnormals on both sides are exact. NaN stays NaN with its sign and the top bits of
 * its payload; signalling NaNs come out quiet (as the x86 F16C instructions do, so the fast path and
 * the portable path agree bit for bit). */
#ifndef APEX_DTYPE_H
#define APEX_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum apex_dtype {
  APEX_F32 = 0,
  APEX_F16 = 1,
  APEX_BF16 = 2,
  APEX_DTYPE_COUNT
} apex_dtype;

/* Bytes per element (4, 2, 2); 0 for a value outside the enum. */
APEX_API size_t apex_dtype_size(apex_dtype dtype);
/* "f32", "f16", "bf16"; "invalid" otherwise. */
APEX_API const char *apex_dtype_name(apex_dtype dtype);
/* Parses "f32"/"float32", "f16"/"float16"/"half", "bf16"/"bfloat16". Returns APEX_ERR_INVALID_ARG
 * (with a message listing the accepted names) for anything else. */
APEX_API apex_status apex_dtype_parse(const char *name, apex_dtype *out);

/* Scalar conversions: the reference path. */
APEX_API float apex_f16_to_f32(uint16_t h);
APEX_API uint16_t apex_f32_to_f16(float f);
APEX_API float apex_bf16_to_f32(uint16_t b);
APEX_API uint16_t apex_f32_to_bf16(float f);

/* Which code path bulk conversions and multi-tensor kernels use. AUTO picks the fastest the CPU
 * supports (checked at run time); PORTABLE forces plain C. Both give bit-identical results.
 * apex_simd_set is apex_cpu_set_max_isa (cpu.h) under an older name: AUTO is APEX_CPU_ISA_NATIVE,
 * PORTABLE and AVX2 are the ISA levels of the same names, so they cap the matrix products too. */
typedef enum apex_simd {
  APEX_SIMD_AUTO = 0,
  APEX_SIMD_PORTABLE = 1,
  APEX_SIMD_AVX2 = 2 /* AVX2 + F16C + FMA */
} apex_simd;

/* Sets the path for the whole process (meant for tests and benchmarks). Asking for AVX2 on a CPU
 * without it returns APEX_ERR_UNSUPPORTED and changes nothing. */
APEX_API apex_status apex_simd_set(apex_simd simd);
/* The path in use now (never AUTO: AUTO is resolved to what the CPU has): AVX2 when
 * apex_cpu_max_isa() is AVX2 or above. */
APEX_API apex_simd apex_simd_active(void);

/* Converts n elements from src (of src_type) to dst (of dst_type). The same dtype is a copy.
 * Buffers must not overlap unless dst == src and the types are equal. Runs on the library's threads
 * (see threads.h); the result does not depend on the thread count. */
APEX_API apex_status apex_convert(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type,
                                  size_t n);

#ifdef __cplusplus
}
#endif
#endif
