/* test_rng.c: Philox 4x32-10 against the Random123 known-answer vectors (tests/kat_vectors of
 * Random123 v1.14), and the fills' determinism: same (seed, offset) -> same bits at any thread count,
 * offsets that continue a stream exactly. */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

void apex__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

static void test_known_answers(void **state) {
  (void)state;
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    apex__philox4x32_10(kat[i], kat[i] + 4, out);
    for (int k = 0; k < 4; k++) assert_int_equal(out[k], kat[i][6 + k]);
  }
  /* The 64-bit (seed, counter) form maps to key = seed words, counter = (ctr words, 0, 0). */
  uint32_t a[4], b[4];
  const uint32_t ctr[4] = {0x85a308d3u, 0x243f6a88u, 0, 0}, key[2] = {0x299f31d0u, 0xa4093822u};
  apex_philox4x32(0xa4093822299f31d0ull, 0x243f6a8885a308d3ull, a);
  apex__philox4x32_10(ctr, key, b);
  assert_memory_equal(a, b, sizeof a);
}

static void test_uniform_range_and_mean(void **state) {
  (void)state;
  const size_t n = 1 << 20;
  float *u = malloc(n * sizeof *u);
  apex_rng r = apex_rng_init(42);
  TU_OK(apex_rng_uniform(&r, u, n));
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(u[i] >= 0.0f && u[i] < 1.0f);
    sum += u[i];
  }
  /* The mean of 2^20 uniforms has standard deviation 1/sqrt(12 * 2^20) ~ 2.8e-4: 10 sigma. */
  assert_true(fabs(sum / n - 0.5) < 2.8e-3);
  assert_int_equal(r.offset, n / 4);
  free(u);
}

static void test_normal_moments(void **state) {
  (void)state;
  const size_t n = 1 << 20;
  float *z = malloc(n * sizeof *z);
  apex_rng r = apex_rng_init(7);
  TU_OK(apex_rng_normal(&r, z, n, 1.0f, 2.0f));
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(isfinite(z[i]));
    s += z[i];
    s2 += (double)z[i] * z[i];
  }
  double mean = s / n, var = s2 / n - mean * mean;
  assert_true(fabs(mean - 1.0) < 0.02); /* sd of the mean: 2/1024 */
  assert_true(fabs(var - 4.0) < 0.06);  /* sd of the variance: ~4*sqrt(2/n) = 0.0055 */
  free(z);
}

/* The same fill at 1 and 2 threads gives the same bits; two consecutive fills equal one big fill
 * when the first ends on a block boundary. */
static void test_thread_independence_and_streams(void **state) {
  (void)state;
  const size_t n = 3 * 65536 + 12;
  float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
  apex_rng r1 = apex_rng_init(99), r2 = apex_rng_init(99), r3 = apex_rng_init(99);
  TU_OK(apex_set_num_threads(1));
  TU_OK(apex_rng_normal(&r1, a, n, 0, 1));
  TU_OK(apex_set_num_threads(2));
  TU_OK(apex_rng_normal(&r2, b, n, 0, 1));
  assert_memory_equal(a, b, n * 4);
  TU_OK(apex_rng_normal(&r3, c, 1000, 0, 1));
  TU_OK(apex_rng_normal(&r3, c + 1000, n - 1000, 0, 1));
  assert_memory_equal(a, c, n * 4);
  assert_int_equal(r1.offset, r3.offset);
  /* A saved generator replays: copying the struct is saving it. */
  apex_rng saved = r1;
  TU_OK(apex_rng_uniform(&r1, a, 100));
  TU_OK(apex_rng_uniform(&saved, b, 100));
  assert_memory_equal(a, b, 400);
  /* A different seed gives different numbers. */
  apex_rng other = apex_rng_init(100);
  TU_OK(apex_rng_uniform(&other, c, 100));
  assert_true(memcmp(a, c, 400) != 0);
  free(a);
  free(b);
  free(c);
}

static void test_bernoulli(void **state) {
  (void)state;
  const size_t n = 1 << 18;
  uint8_t *m = malloc(n);
  apex_rng r = apex_rng_init(3);
  TU_OK(apex_rng_bernoulli(&r, m, n, 0.75f));
  size_t ones = 0;
  for (size_t i = 0; i < n; i++) ones += m[i];
  assert_true(fabs((double)ones / n - 0.75) < 0.01); /* sd ~ 8.5e-4 */
  TU_FAILS(apex_rng_bernoulli(&r, m, n, 1.5f), APEX_ERR_INVALID_ARG, "probability");
  TU_FAILS(apex_rng_normal(&r, (float *)m, 4, 0, -1), APEX_ERR_INVALID_ARG, "std");
  TU_FAILS(apex_rng_uniform(NULL, (float *)m, 4), APEX_ERR_INVALID_ARG, "NULL");
  TU_FAILS(apex_rng_uniform(&r, NULL, 4), APEX_ERR_INVALID_ARG, "NULL output");
  free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_answers),   cmocka_unit_test(test_uniform_range_and_mean),
      cmocka_unit_test(test_normal_moments),  cmocka_unit_test(test_thread_independence_and_streams),
      cmocka_unit_test(test_bernoulli),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
