/* test_dtype_exhaustive.c (label `long`): all 2^32 f32 bit patterns.
 *  - the bulk conversion on the active path (AVX2/F16C where the CPU has it) agrees bit for bit with
 *    the scalar reference, for f32 -> f16 and f32 -> bf16;
 *  - the scalar reference result is the nearest representable value, ties to even, for every finite
 *    input (an independent check of the reference: see check_nearest in test_dtype.c, repeated here
 *    in a form cheap enough for 2^32 inputs), Inf stays Inf and NaN stays NaN. */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

/* Exact widening tables, verified by test_dtype's round-trip tests. */
static float f16_value[65536], bf16_value[65536];

/* 1 if h is a correct nearest-even rounding of x. */
static int is_nearest(float x, uint16_t h, const float *value, uint16_t max_finite) {
  if (isnan(x)) return isnan(value[h]);
  uint16_t mag = h & 0x7FFF, sign = h & 0x8000;
  double xd = x;
  if (mag > max_finite) {
    if (!isinf(value[h]) || (signbit(x) != 0) != (sign != 0)) return 0;
    double top = value[max_finite], step = top - value[max_finite - 1];
    return fabs(xd) >= top + step / 2;
  }
  double err = fabs((double)value[h] - xd);
  if (value[h] != 0 && (signbit(value[h]) != 0) != (signbit(x) != 0)) return 0;
  if (mag > 0) {
    double o = fabs((double)value[sign | (mag - 1)] - xd);
    if (o < err || (o == err && (mag & 1))) return 0;
  }
  if (mag < max_finite) {
    double o = fabs((double)value[sign | (mag + 1)] - xd);
    if (o < err || (o == err && (mag & 1))) return 0;
  }
  return 1;
}

static void test_all_f32(void **state) {
  (void)state;
  for (uint32_t p = 0; p < 65536; p++) {
    f16_value[p] = apex_f16_to_f32((uint16_t)p);
    bf16_value[p] = apex_bf16_to_f32((uint16_t)p);
  }
  const size_t block = (size_t)1 << 24;
  float *in = malloc(block * 4);
  uint16_t *h = malloc(block * 2), *b = malloc(block * 2);
  long long bad = 0;
  for (uint64_t base = 0; base < (1ull << 32); base += block) {
    for (size_t i = 0; i < block; i++) in[i] = tu_float((uint32_t)(base + i));
    TU_OK(apex_convert(h, APEX_F16, in, APEX_F32, block));
    TU_OK(apex_convert(b, APEX_BF16, in, APEX_F32, block));
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (long long i = 0; i < (long long)block; i++) {
      uint16_t hr = apex_f32_to_f16(in[i]), br = apex_f32_to_bf16(in[i]);
      int ok = h[i] == hr && b[i] == br && is_nearest(in[i], hr, f16_value, 0x7BFF) && is_nearest(in[i], br, bf16_value, 0x7F7F);
      if (!ok && bad++ < 5)
        print_error("0x%08x: bulk f16 0x%04x ref 0x%04x, bulk bf16 0x%04x ref 0x%04x\n", tu_bits(in[i]), h[i], hr, b[i], br);
    }
  }
  free(in);
  free(h);
  free(b);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_f32)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
