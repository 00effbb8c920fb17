/* test_vmath_exhaustive.c (label `long`): apex__vtanh and apex__verf (backend/cpu/vmath.h) over all
 * 2^32 f32 bit patterns at the CPU's best vector ISA: within 1 ulp of the exact function, within 3
 * of glibc's tanhf or erff, and the special-value rules of vmath_check.h. The rows it prints are the measured bounds that
 * vmath.h and backend_ops_cases.h state. */
#include <stdlib.h>

#include "apex/cpu.h"
#include "vmath_check.h"

#define CHUNK 65536

/* f over every f32, on the threads. */
static void check_all(const vc_fn *f) {
  vc_stats total = {0};
#pragma omp parallel
  {
    float *x = malloc(CHUNK * sizeof *x), *o = malloc(CHUNK * sizeof *o);
    vc_stats s = {0};
#pragma omp for schedule(dynamic)
    for (uint64_t c = 0; c < (1ull << 32) / CHUNK; c++) {
      for (size_t i = 0; i < CHUNK; i++) x[i] = tu_float((uint32_t)(c * CHUNK + i));
      if (f->vec(x, o, CHUNK) != 1) s.bad++;
      vc_check(f, x, o, CHUNK, &s);
    }
#pragma omp critical
    vc_merge(&total, &s);
    free(x), free(o);
  }
  vc_print(f, apex_cpu_isa_name(apex_cpu_max_isa()), &total);
  assert_int_equal(total.bad, 0);
  assert_true(total.max_ulp <= VC_MAX_ULP);
  assert_true(total.max_vs_libm <= VC_MAX_VS_LIBM);
}

static void test_all_f32(void **state) {
  (void)state;
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX2) skip();
  for (int fi = 0; fi < 2; fi++) check_all(&vc_fns[fi]);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_f32)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
