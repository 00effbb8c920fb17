/* test_cpu_isa.c: the maximum-ISA setting (apex/cpu.h): its API and errors, APEX_CPU_ISA, the
 * apex_simd_set alias, and that the cap steers the matrix product.
 *
 * References: the CPU's own level (apex_cpu_native_isa) for what a cap resolves to, and for the
 * portable product a closed form computed here: each element a double sum over k in increasing
 * order, rounded once to f32, which the portable product must match bit for bit. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <math.h>
#include <stdlib.h>

#include "apex/cpu.h"
#include "testutil.h"

/* Runs first, before anything in this process resolves the cap: the environment is read on first
 * use, and a later apex_cpu_set_max_isa overrides it. */
static void test_env_read_on_first_use(void **state) {
  (void)state;
  setenv("APEX_CPU_ISA", "Portable", 1);
  assert_int_equal(apex_cpu_max_isa(), APEX_CPU_ISA_PORTABLE);
  assert_int_equal(apex_simd_active(), APEX_SIMD_PORTABLE);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  assert_int_equal(apex_cpu_max_isa(), apex_cpu_native_isa());
  unsetenv("APEX_CPU_ISA");
}

static void test_env_parse(void **state) {
  (void)state;
  apex_cpu_isa isa = APEX_CPU_ISA_AMX;
  unsetenv("APEX_CPU_ISA");
  TU_OK(apex_cpu_isa_env(&isa));
  assert_int_equal(isa, APEX_CPU_ISA_NATIVE);
  setenv("APEX_CPU_ISA", "avx2", 1);
  TU_OK(apex_cpu_isa_env(&isa));
  assert_int_equal(isa, APEX_CPU_ISA_AVX2);
  setenv("APEX_CPU_ISA", "avx-512", 1);
  TU_FAILS(apex_cpu_isa_env(&isa), APEX_ERR_INVALID_ARG, "APEX_CPU_ISA='avx-512' is not an ISA; use portable, avx2, avx512");
  assert_int_equal(isa, APEX_CPU_ISA_NATIVE);
  TU_FAILS(apex_cpu_isa_env(NULL), APEX_ERR_INVALID_ARG, "apex_cpu_isa_env: NULL out");
  unsetenv("APEX_CPU_ISA");
}

static void test_names_round_trip(void **state) {
  (void)state;
  for (int i = APEX_CPU_ISA_NATIVE; i <= APEX_CPU_ISA_AMX; i++) {
    apex_cpu_isa back;
    TU_OK(apex_cpu_isa_parse(apex_cpu_isa_name((apex_cpu_isa)i), &back));
    assert_int_equal(back, i);
  }
  apex_cpu_isa isa;
  TU_OK(apex_cpu_isa_parse("AVX512_BF16", &isa));
  assert_int_equal(isa, APEX_CPU_ISA_AVX512_BF16);
  assert_string_equal(apex_cpu_isa_name((apex_cpu_isa)42), "invalid");
  TU_FAILS(apex_cpu_isa_parse("avx", &isa), APEX_ERR_INVALID_ARG, "unknown ISA 'avx'; use portable, avx2, avx512, avx512_bf16, amx or native");
  TU_FAILS(apex_cpu_isa_parse("avx2x", &isa), APEX_ERR_INVALID_ARG, "unknown ISA 'avx2x'");
  TU_FAILS(apex_cpu_isa_parse(NULL, &isa), APEX_ERR_INVALID_ARG, "unknown ISA '(null)'");
  TU_FAILS(apex_cpu_isa_parse("avx2", NULL), APEX_ERR_INVALID_ARG, "NULL out");
}

/* A cap resolves to min(cap, the CPU's level); a bad value is refused and changes nothing. */
static void test_cap_resolves(void **state) {
  (void)state;
  apex_cpu_isa native = apex_cpu_native_isa();
  assert_true(native >= APEX_CPU_ISA_PORTABLE && native <= APEX_CPU_ISA_AMX);
  for (int cap = APEX_CPU_ISA_PORTABLE; cap <= APEX_CPU_ISA_AMX; cap++) {
    TU_OK(apex_cpu_set_max_isa((apex_cpu_isa)cap));
    assert_int_equal(apex_cpu_max_isa(), cap < (int)native ? cap : (int)native);
    assert_int_equal(apex_simd_active(), apex_cpu_max_isa() >= APEX_CPU_ISA_AVX2 ? APEX_SIMD_AVX2 : APEX_SIMD_PORTABLE);
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
  TU_FAILS(apex_cpu_set_max_isa((apex_cpu_isa)6), APEX_ERR_INVALID_ARG, "apex_cpu_set_max_isa: unknown ISA 6");
  TU_FAILS(apex_cpu_set_max_isa((apex_cpu_isa)-1), APEX_ERR_INVALID_ARG, "unknown ISA -1");
  assert_int_equal(apex_cpu_max_isa(), APEX_CPU_ISA_PORTABLE);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  assert_int_equal(apex_cpu_max_isa(), native);
}

/* apex_simd_set is the same cap under its older name. */
static void test_simd_alias(void **state) {
  (void)state;
  TU_OK(apex_simd_set(APEX_SIMD_PORTABLE));
  assert_int_equal(apex_cpu_max_isa(), APEX_CPU_ISA_PORTABLE);
  TU_OK(apex_simd_set(APEX_SIMD_AUTO));
  assert_int_equal(apex_cpu_max_isa(), apex_cpu_native_isa());
  if (apex_cpu_native_isa() >= APEX_CPU_ISA_AVX2) {
    TU_OK(apex_simd_set(APEX_SIMD_AVX2));
    assert_int_equal(apex_cpu_max_isa(), APEX_CPU_ISA_AVX2);
  } else {
    TU_FAILS(apex_simd_set(APEX_SIMD_AVX2), APEX_ERR_UNSUPPORTED, "lacks AVX2");
  }
  TU_FAILS(apex_simd_set((apex_simd)7), APEX_ERR_INVALID_ARG, "unknown path 7");
  TU_OK(apex_simd_set(APEX_SIMD_AUTO));
}

/* y = a b for f32 a [m, k] and b [k, n] under the current cap, into out (m * n floats). */
static void matmul(int m, int k, int n, float *out) {
  apex_graph *g = apex_graph_create();
  apex_var *a = tu_random_leaf(APEX_F32, 2, (int64_t[]){m, k}, 5, 0), *b = tu_random_leaf(APEX_F32, 2, (int64_t[]){k, n}, 6, 0);
  apex_var *y = apex_matmul(g, a, b);
  if (!y) fail_msg("apex_matmul: %s", apex_last_error());
  memcpy(out, apex_tensor_data(apex_var_value(y)), (size_t)m * n * sizeof(float));
  const float *pa = apex_tensor_data(apex_var_value(a)), *pb = apex_tensor_data(apex_var_value(b));
  for (int i = 0; i < m; i++) /* leaves the closed form in out's second half */
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int p = 0; p < k; p++) s += (double)pa[(size_t)i * k + p] * pb[(size_t)p * n + j];
      out[(size_t)m * n + (size_t)i * n + j] = (float)s;
    }
  apex_var_destroy(a), apex_var_destroy(b);
  apex_graph_destroy(g);
}

/* Under the portable cap the product is the closed form, bit for bit, in one call and in gemm.c's
 * tile grid on threads (128 x 130 x 272 is past its threshold); under the CPU's own cap another
 * kernel runs, whose f32 sums differ from it somewhere. */
static void test_cap_steers_gemm(void **state) {
  (void)state;
  int shapes[2][3] = {{7, 33, 9}, {128, 272, 130}};
  for (int s = 0; s < 2; s++) {
    int m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
    size_t mn = (size_t)m * n;
    float *portable = malloc(2 * mn * sizeof(float)), *fast = malloc(2 * mn * sizeof(float));
    TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
    matmul(m, k, n, portable);
    for (size_t i = 0; i < mn; i++)
      if (tu_bits(portable[i]) != tu_bits(portable[mn + i]))
        fail_msg("%d x %d x %d, element %zu: portable %.9g, closed form %.9g", m, k, n, i, portable[i], portable[mn + i]);
    TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
    if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX2) {
      printf("skipped the fast half: this CPU has no level above portable\n");
    } else if (s == 1) {
      matmul(m, k, n, fast);
      size_t differ = 0;
      for (size_t i = 0; i < mn; i++) differ += tu_bits(fast[i]) != tu_bits(portable[i]);
      printf("# %s product: %zu of %zu elements differ from the portable one in some bit\n", apex_cpu_isa_name(apex_cpu_max_isa()), differ, mn);
      assert_true(differ > 0);
    }
    free(portable), free(fast);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_read_on_first_use), cmocka_unit_test(test_env_parse),   cmocka_unit_test(test_names_round_trip),
      cmocka_unit_test(test_cap_resolves),          cmocka_unit_test(test_simd_alias), cmocka_unit_test(test_cap_steers_gemm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
