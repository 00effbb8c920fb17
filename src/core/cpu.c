/* cpu.c: run-time choice of the SIMD path (portable C or AVX2/F16C). */
#include "core/internal.h"

#if APEX_HAVE_X86
#include <cpuid.h>
#endif

/* Read from CPUID directly (clang 14's __builtin_cpu_supports does not know "f16c"): AVX2 (leaf 7
 * EBX bit 5), F16C (leaf 1 ECX bit 29), FMA (ECX bit 12), and the OS saving YMM state (OSXSAVE,
 * ECX bit 27, with XCR0 bits 1 and 2 set), without which AVX instructions fault. */
int apex__cpu_has_avx2(void) {
#if APEX_HAVE_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int f16c = (c >> 29) & 1, fma = (c >> 12) & 1, osxsave = (c >> 27) & 1;
  if (!f16c || !fma || !osxsave) return 0;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return 0;
  if (__get_cpuid_max(0, NULL) < 7) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  return (b >> 5) & 1;
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
