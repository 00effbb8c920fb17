/* cpu.c: which CPU fast paths run: the instruction sets this CPU has, the maximum-ISA cap
 * (apex_cpu_set_max_isa / APEX_CPU_ISA, apex/cpu.h) and apex_simd_set, which is that cap under its
 * older name. Every fast-path choice in the library asks apex_cpu_max_isa (or apex_simd_active). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cpu.h"
#include "core/internal.h"

#if APEX_HAVE_X86
#include <cpuid.h>

static unsigned long long xcr0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (unsigned long long)hi << 32 | lo;
}
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
  if ((xcr0() & 6u) != 6u) return 0;
  if (__get_cpuid_max(0, NULL) < 7) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  return (b >> 5) & 1;
#else
  return 0;
#endif
}

/* Each level needs the ones below it. AVX-512: leaf 7 EBX bit 16 with the OS saving the opmask and
 * ZMM state (XCR0 bits 5-7); AVX512_BF16: leaf 7 sub-leaf 1 EAX bit 5; AMX: AMX-BF16 and AMX-TILE
 * (leaf 7 EDX bits 22 and 24) with the OS saving tile state (XCR0 bits 17 and 18). */
static apex_cpu_isa detect(void) {
  if (!apex__cpu_has_avx2()) return APEX_CPU_ISA_PORTABLE;
#if APEX_HAVE_X86
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  unsigned long long x = xcr0();
  int max_sub = (int)a;
  if (!((b >> 16) & 1) || (x & 0xE0u) != 0xE0u) return APEX_CPU_ISA_AVX2;
  int amx = ((d >> 22) & 1) && ((d >> 24) & 1) && (x & 0x60000u) == 0x60000u;
  if (max_sub < 1) return APEX_CPU_ISA_AVX512;
  __cpuid_count(7, 1, a, b, c, d);
  if (!((a >> 5) & 1)) return APEX_CPU_ISA_AVX512;
  return amx ? APEX_CPU_ISA_AMX : APEX_CPU_ISA_AVX512_BF16;
#else
  return APEX_CPU_ISA_AVX2;
#endif
}

apex_cpu_isa apex_cpu_native_isa(void) {
  static int native = -1;
  if (native < 0) native = (int)detect();
  return (apex_cpu_isa)native;
}

static const char *const names[] = {"native", "portable", "avx2", "avx512", "avx512_bf16", "amx"};
#define N_LEVELS ((int)(sizeof names / sizeof names[0]))

const char *apex_cpu_isa_name(apex_cpu_isa isa) { return (int)isa >= 0 && (int)isa < N_LEVELS ? names[isa] : "invalid"; }

apex_status apex_cpu_isa_parse(const char *name, apex_cpu_isa *out) {
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cpu_isa_parse: NULL out");
  for (int i = 0; name && i < N_LEVELS; i++) {
    size_t k = 0;
    while (name[k] && names[i][k] && tolower((unsigned char)name[k]) == names[i][k]) k++;
    if (!name[k] && !names[i][k]) {
      *out = (apex_cpu_isa)i;
      return APEX_OK;
    }
  }
  return apex__fail(APEX_ERR_INVALID_ARG, "apex_cpu_isa_parse: unknown ISA '%s'; use portable, avx2, avx512, avx512_bf16, amx or native",
                    name ? name : "(null)");
}

apex_status apex_cpu_isa_env(apex_cpu_isa *out) {
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cpu_isa_env: NULL out");
  *out = APEX_CPU_ISA_NATIVE;
  const char *v = getenv("APEX_CPU_ISA");
  if (!v || !*v) return APEX_OK;
  apex_cpu_isa isa;
  if (apex_cpu_isa_parse(v, &isa) != APEX_OK)
    return apex__fail(APEX_ERR_INVALID_ARG, "APEX_CPU_ISA='%s' is not an ISA; use portable, avx2, avx512, avx512_bf16, amx or native", v);
  *out = isa;
  return APEX_OK;
}

/* The cap; -1 until set or read from the environment. A plain int is enough: the cap is a
 * process-wide switch set before work starts, and the parallel loops resolve it (apex_simd_active)
 * before their threads read it. */
static int cap = -1;

apex_status apex_cpu_set_max_isa(apex_cpu_isa isa) {
  if ((int)isa < 0 || (int)isa >= N_LEVELS)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_cpu_set_max_isa: unknown ISA %d; use an apex_cpu_isa value", (int)isa);
  cap = (int)isa;
  return APEX_OK;
}

apex_cpu_isa apex_cpu_max_isa(void) {
  if (cap < 0) {
    apex_cpu_isa env;
    apex_cpu_isa_env(&env); /* an unknown value leaves NATIVE, as documented */
    cap = (int)env;
  }
  apex_cpu_isa native = apex_cpu_native_isa();
  return cap == APEX_CPU_ISA_NATIVE || cap > (int)native ? native : (apex_cpu_isa)cap;
}

int apex__cpu_capped_portable(void) {
  apex_cpu_max_isa(); /* reads the environment if nothing set the cap yet */
  return cap == APEX_CPU_ISA_PORTABLE;
}

/* ---- apex_simd_set: the cap under its first name (dtype.h) ----------------------------------------- */

apex_status apex_simd_set(apex_simd simd) {
  switch (simd) {
  case APEX_SIMD_AUTO: return apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE);
  case APEX_SIMD_PORTABLE: return apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE);
  case APEX_SIMD_AVX2:
    if (!apex__cpu_has_avx2())
      return apex__fail(APEX_ERR_UNSUPPORTED, "apex_simd_set: this CPU (or build) lacks AVX2/F16C/FMA; use APEX_SIMD_AUTO");
    return apex_cpu_set_max_isa(APEX_CPU_ISA_AVX2);
  }
  return apex__fail(APEX_ERR_INVALID_ARG, "apex_simd_set: unknown path %d", (int)simd);
}

apex_simd apex_simd_active(void) { return apex_cpu_max_isa() >= APEX_CPU_ISA_AVX2 ? APEX_SIMD_AVX2 : APEX_SIMD_PORTABLE; }
