/* onednn_check.h: what the oneDNN path tests (test_gemm_onednn, test_conv_onednn) share: skipping where
 * the path cannot run, a bf16 ulp, and the element-by-element comparison against the portable
 * reference with a bound per element. Header-only, static: each test includes it once. */
#ifndef APEX_TESTS_ONEDNN_CHECK_H
#define APEX_TESTS_ONEDNN_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/cpu.h"
#include "backend/cpu/gemm_onednn.h"
#include "testutil.h"

/* Skips the calling test (returning 1) when the path cannot run at the CPU's own level. */
static int skip_without_path(void) {
  const char *why = NULL;
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  if (apex__onednn_active(&why)) return 0;
  printf("skipped: %s\n", why);
  return 1;
}

/* One bf16 unit in the last place at magnitude v (8 significant bits). */
static double bf16_ulp(double v) {
  int e;
  frexp(v == 0 ? 1e-38 : v, &e);
  return ldexp(1.0, e - 8);
}

/* got vs ref with |err| <= rel * max|ref| + extra[i] (+ one bf16 ulp when ulp); prints the worst
 * error as a share of its bound. */
static void check(const char *what, const apex_tensor *got, const apex_tensor *ref, double rel, const double *extra, int ulp) {
  size_t n = apex_tensor_numel(ref);
  double mx = 0, worst = 0;
  assert_int_equal(n, apex_tensor_numel(got));
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(apex_tensor_get(ref, i)));
  for (size_t i = 0; i < n; i++) {
    double a = apex_tensor_get(ref, i), b = apex_tensor_get(got, i);
    double bound = rel * mx + (extra ? extra[i] : 0) + (ulp ? bf16_ulp(fabs(a)) : 0), err = fabs(a - b);
    if (!(err <= bound)) fail_msg("%s[%zu]: %.9g vs reference %.9g (bound %.3g)", what, i, b, a, bound);
    if (bound > 0) worst = fmax(worst, err / bound);
  }
  printf("# %s: worst error %.3f of its bound\n", what, worst);
}

/* Opens a test that APEX_CPU_ISA=avx512 keeps the path off (the including file defines
 * _POSIX_C_SOURCE for setenv): sets the variable and checks that the path says it is inactive, and
 * why. 0, with the variable cleared, where the CPU lacks AVX512_BF16 and the test is skipped. */
static int env_avx512_begin(void) {
  setenv("APEX_CPU_ISA", "avx512", 1);
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX512_BF16) {
    printf("skipped: this CPU has neither AVX512_BF16 nor AMX\n");
    unsetenv("APEX_CPU_ISA");
    return 0;
  }
  const char *why = NULL;
  assert_false(apex__onednn_active(&why));
  assert_non_null(why);
  printf("# with APEX_CPU_ISA=avx512: %s\n", why);
  return 1;
}

/* Closes it: the cap back to the CPU's own level, the variable cleared. */
static void env_avx512_end(void) {
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  unsetenv("APEX_CPU_ISA");
}

#endif
