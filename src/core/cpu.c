/* cpu.c: run-time choice of the SIMD path (portable C or AVX2/F16C). */
#include "core/internal.h"

int apex__cpu_has_avx2(void) {
#if APEX_HAVE_X86 && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

/* -1 = not yet resolved. A plain int is enough: apex_simd_set is documented as a process-wide switch
 * for tests and benchmarks, set before work starts. */
static int apex_simd_current = -1;

apex_status apex_simd_set(apex_simd simd) {
  switch (simd) {
  case APEX_SIMD_AUTO: apex_simd_current = apex__cpu_has_avx2() ? APEX_SIMD_AVX2 : APEX_SIMD_PORTABLE; return APEX_OK;
  case APEX_SIMD_PORTABLE: apex_simd_current = APEX_SIMD_PORTABLE; return APEX_OK;
  case APEX_SIMD_AVX2:
    if (!apex__cpu_has_avx2())
      return apex__fail(APEX_ERR_UNSUPPORTED, "apex_simd_set: this CPU (or build) lacks AVX2/F16C/FMA; use APEX_SIMD_AUTO");
    apex_simd_current = APEX_SIMD_AVX2;
    return APEX_OK;
  }
  return apex__fail(APEX_ERR_INVALID_ARG, "apex_simd_set: unknown path %d", (int)simd);
}

apex_simd apex_simd_active(void) {
  if (apex_simd_current < 0) apex_simd_set(APEX_SIMD_AUTO);
  return (apex_simd)apex_simd_current;
}
