/* test_dtype_exhaustive.c (label `long`): all 2^32 f32 bit patterns and all 65536 16-bit ones.
 *  - the bulk conversion at every ISA level this CPU has (portable, AVX2/F16C, AVX-512F; capped with
 *    apex_cpu_set_max_isa) agrees bit for bit with the scalar reference, for f32 -> f16 and
 *    f32 -> bf16, and for f16/bf16 -> f32 and f16 <-> bf16 over every 16-bit input;
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
  uint16_t *h = malloc(block * 2), *b = malloc(block * 2), *hr = malloc(block * 2), *br = malloc(block * 2);
  const int top = (int)apex_cpu_native_isa();
  long long bad = 0;
  for (uint64_t base = 0; base < (1ull << 32); base += block) {
    for (size_t i = 0; i < block; i++) in[i] = tu_float((uint32_t)(base + i));
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (long long i = 0; i < (long long)block; i++) {
      hr[i] = apex_f32_to_f16(in[i]);
      br[i] = apex_f32_to_bf16(in[i]);
      if (!(is_nearest(in[i], hr[i], f16_value, 0x7BFF) && is_nearest(in[i], br[i], bf16_value, 0x7F7F)) && bad++ < 5)
        print_error("0x%08x: reference f16 0x%04x bf16 0x%04x is not the nearest\n", tu_bits(in[i]), hr[i], br[i]);
    }
    for (int isa = APEX_CPU_ISA_PORTABLE; isa <= top; isa++) {
      TU_OK(apex_cpu_set_max_isa((apex_cpu_isa)isa));
      TU_OK(apex_convert(h, APEX_F16, in, APEX_F32, block));
      TU_OK(apex_convert(b, APEX_BF16, in, APEX_F32, block));
#pragma omp parallel for reduction(+ : bad) schedule(static)
      for (long long i = 0; i < (long long)block; i++)
        if ((h[i] != hr[i] || b[i] != br[i]) && bad++ < 5)
          print_error("%s: 0x%08x: bulk f16 0x%04x ref 0x%04x, bulk bf16 0x%04x ref 0x%04x\n", apex_cpu_isa_name((apex_cpu_isa)isa),
                      tu_bits(in[i]), h[i], hr[i], b[i], br[i]);
    }
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  free(in);
  free(h);
  free(b);
  free(hr);
  free(br);
  assert_int_equal(bad, 0);
}

/* Every 16-bit pattern widened to f32 and converted to the other 16-bit format, at every ISA level,
 * against the scalar reference (the f16 -> bf16 reference is one rounding of the exact widening). */
static void test_all_16bit(void **state) {
  (void)state;
  uint16_t in[65536], out16[65536];
  float out32[65536];
  for (uint32_t p = 0; p < 65536; p++) in[p] = (uint16_t)p;
  long long bad = 0;
  for (int isa = APEX_CPU_ISA_PORTABLE; isa <= (int)apex_cpu_native_isa(); isa++) {
    TU_OK(apex_cpu_set_max_isa((apex_cpu_isa)isa));
    for (int t = 0; t < 2; t++) {
      apex_dtype dt = t ? APEX_BF16 : APEX_F16, other = t ? APEX_F16 : APEX_BF16;
      float (*widen)(uint16_t) = t ? apex_bf16_to_f32 : apex_f16_to_f32;
      uint16_t (*narrow_other)(float) = t ? apex_f32_to_f16 : apex_f32_to_bf16;
      TU_OK(apex_convert(out32, APEX_F32, in, dt, 65536));
      TU_OK(apex_convert(out16, other, in, dt, 65536));
      for (uint32_t p = 0; p < 65536; p++) {
        uint32_t want = tu_bits(widen((uint16_t)p));
        uint16_t want16 = narrow_other(widen((uint16_t)p));
        if ((tu_bits(out32[p]) != want || out16[p] != want16) && bad++ < 5)
          print_error("%s: %s 0x%04x: f32 0x%08x ref 0x%08x, %s 0x%04x ref 0x%04x\n", apex_cpu_isa_name((apex_cpu_isa)isa),
                      apex_dtype_name(dt), p, tu_bits(out32[p]), want, apex_dtype_name(other), out16[p], want16);
      }
    }
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_16bit), cmocka_unit_test(test_all_f32)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
