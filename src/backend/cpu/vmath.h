/* vmath.h: vectorised f32 tanh and erf for the CPU backend's elementwise kernels (vmath.c).
 *
 * Each function computes its n results in AVX-512 or AVX2 vectors of doubles (8 or 4 f32 inputs a
 * step, widened; see vmath.c for why) under the ISA cap (apex_cpu_max_isa) and returns 1, or returns
 * 0 having written nothing at the portable ISA (or on a CPU or build without them), where the caller
 * runs its libm loop: that loop is the reference the vector code is tested against
 * (tests/test_vmath.c, tests/test_vmath_exhaustive.c). */
#ifndef APEX_BACKEND_CPU_VMATH_H
#define APEX_BACKEND_CPU_VMATH_H

#include <stddef.h>

/* out[i] = tanh(x[i]) for i < n (out may be x), within 1 ulp of the exact tanh for every f32 (measured
 * over all 2^32: 0.5000 ulp, so correctly rounded but for near-halfway cases; up to 2 ulp from glibc's
 * tanhf); tanh(+-inf) = +-1, tanh(+-0) = +-0, NaN stays NaN. The same bits at both vector widths. */
int apex__vtanh(const float *x, float *out, size_t n);

/* out[i] = erf(x[i]), with the same properties as apex__vtanh (measured: 0.5002 ulp from the exact
 * erf, up to 1 from glibc's erff; erf(+-inf) = +-1). */
int apex__verf(const float *x, float *out, size_t n);

/* 1 when apex__vtanh and apex__verf run their vector code under the current ISA cap, 0 when they
 * decline (the caller's libm loop runs): which of the two sets of bits a tanh or erf result has. */
int apex__vmath_vector(void);

#endif
