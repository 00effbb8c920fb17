/* vmath_check.h: the accuracy check test_vmath and test_vmath_exhaustive run over f32 bit patterns:
 * apex__vtanh and apex__verf (backend/cpu/vmath.h) at the current ISA cap against the exact function
 * (libm's tanh or erf in double, whose error of about 1 double ulp is 2^-29 of an f32 ulp) and
 * against glibc's tanhf or erff, the portable path's reference. */
#ifndef APEX_TESTS_VMATH_CHECK_H
#define APEX_TESTS_VMATH_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/cpu/vmath.h"
#include "testutil.h"

/* The spacing of f32 values at |v| (subnormal spacing below the normal range). */
static inline double vc_ulp(double v) {
  int e;
  frexp(fabs(v), &e);
  return ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 23);
}

/* Bit patterns ordered as the values: the distance between two floats in ulps. */
static inline int64_t vc_order(float f) {
  int32_t b = (int32_t)tu_bits(f);
  return b < 0 ? -(int64_t)(b & 0x7fffffff) : (int64_t)b;
}

/* A function under test: both are odd, +-1 at +-inf, NaN at NaN. */
typedef struct vc_fn {
  const char *name;
  int (*vec)(const float *x, float *out, size_t n);
  double (*exact)(double);
  float (*libm)(float);
} vc_fn;

static const vc_fn vc_fns[2] = {{"tanh", apex__vtanh, tanh, tanhf}, {"erf", apex__verf, erf, erff}};

typedef struct vc_stats {
  double max_ulp;      /* worst |vector - exact| in f32 ulps at the exact value */
  int64_t max_vs_libm; /* worst ulp distance between the vector result and libm's f32 function */
  float worst_x;       /* an input where max_ulp occurs */
  uint64_t bad;        /* inputs whose special-value rule failed */
  float bad_x;
} vc_stats;

/* Checks the n inputs x against out = f->vec(x), folding into s. Special values: NaN stays NaN,
 * +-inf gives +-1, zeros and the sign of every result follow x. */
static inline void vc_check(const vc_fn *f, const float *x, const float *out, size_t n, vc_stats *s) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i], t = out[i];
    int ok;
    if (isnan(v)) {
      ok = isnan(t);
    } else if (isinf(v)) {
      ok = t == (v > 0 ? 1.0f : -1.0f);
    } else {
      ok = signbit(t) == signbit(v) && !(v == 0 && tu_bits(t) != tu_bits(v));
      double ref = f->exact((double)v), err = fabs((double)t - ref) / vc_ulp(ref);
      if (err > s->max_ulp) s->max_ulp = err, s->worst_x = v;
      int64_t d = vc_order(t) - vc_order(f->libm(v));
      if (d < 0) d = -d;
      if (d > s->max_vs_libm) s->max_vs_libm = d;
    }
    if (!ok && !s->bad++) s->bad_x = v;
  }
}

static inline void vc_merge(vc_stats *into, const vc_stats *s) {
  if (s->max_ulp > into->max_ulp) into->max_ulp = s->max_ulp, into->worst_x = s->worst_x;
  if (s->max_vs_libm > into->max_vs_libm) into->max_vs_libm = s->max_vs_libm;
  if (s->bad && !into->bad) into->bad_x = s->bad_x;
  into->bad += s->bad;
}

static inline void vc_print(const vc_fn *f, const char *what, const vc_stats *s) {
  printf("# %s, %s: worst %.4f ulp from the exact %s (at x = %.9g), worst %lld ulp from glibc %sf, %llu special-value failures\n",
         f->name, what, s->max_ulp, f->name, s->worst_x, (long long)s->max_vs_libm, f->name, (unsigned long long)s->bad);
}

/* The bounds the library states (vmath.h and backend_ops_cases.h). */
#define VC_MAX_ULP 1.0
#define VC_MAX_VS_LIBM 3

#endif
