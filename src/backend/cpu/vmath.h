/* vmath.h: vectorised f32 math functions for the CPU backend's elementwise kernels (vmath.c).
 *
 * Each function computes n results at a time with AVX-512 (16 f32 a step) or AVX2+FMA (8) under the
 * ISA cap (apex_cpu_max_isa) and returns 1, or returns 0 having written nothing at the portable ISA
 * (or on a CPU or build without them), where the caller runs its libm loop: that loop is the
 * reference the vector code is tested against (tests/test_vmath.c). */
#ifndef APEX_BACKEND_CPU_VMATH_H
#define APEX_BACKEND_CPU_VMATH_H

#include <stddef.h>

/* out[i] = tanh(x[i]) for i < n, within 1 ulp of the exact tanh over all f32 (so within 2 of glibc's
 * tanhf); tanh(+-inf) = +-1, tanh(+-0) = +-0, NaN stays NaN. out may be x. The same bits at both
 * vector widths. */
int apex__vtanh(const float *x, float *out, size_t n);

#endif
