/* test_dtype.c: exactness of the f16/bf16 conversions.
 *
 * References used here, none of them the code under test:
 *  - closed-form values (1.0 = 0x3C00, 65504 = 0x7BFF, the smallest subnormals, ...);
 *  - the nearest-value property: the result of rounding x must be a representable value with no
 *    other representable value closer to x, and on a tie the one with an even last bit;
 *  - PyTorch's conversions (tests/data/dtype_golden.bin, made by tests/gen_dtype_golden.py);
 *  - the portable path, for the AVX2/F16C and AVX-512 fast paths, which must agree bit for bit at
 *    every ISA level this CPU has (apex_cpu_set_max_isa). */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

/* Checks that h is a correct round-to-nearest-even of the finite x to a 16-bit format, using only
 * that format's exact widening (to_f32, verified separately by the round-trip tests). */
static void check_nearest(float x, uint16_t h, float (*to_f32)(uint16_t), uint16_t max_finite) {
  uint16_t mag = h & 0x7FFF, sign = h & 0x8000;
  double xd = x, v = to_f32(h);
  if ((h & 0x7FFF) > max_finite) {
    /* Overflowed to Inf: x must be at least halfway between max_finite and the next step. */
    double top = to_f32(max_finite), step = top - to_f32(max_finite - 1);
    if (!(fabs(xd) >= top + step / 2)) fail_msg("x=%a rounded to Inf (0x%04x) but is below the overflow threshold", x, h);
    return;
  }
  if (signbit(v) != signbit(xd) && v != 0) fail_msg("x=%a: sign lost (0x%04x)", x, h);
  double err = fabs(v - xd);
  for (int d = -1; d <= 1; d += 2) {
    int nm = (int)mag + d;
    if (nm < 0 || nm > max_finite) continue;
    double other = fabs((double)to_f32((uint16_t)(sign | nm)) - xd);
    if (other < err) fail_msg("x=%a: 0x%04x is not the nearest (0x%04x is closer)", x, h, sign | nm);
    if (other == err && (mag & 1)) fail_msg("x=%a: tie resolved to odd 0x%04x", x, h);
  }
}

static float f16_widen(uint16_t h) { return apex_f16_to_f32(h); }
static float bf16_widen(uint16_t h) { return apex_bf16_to_f32(h); }

static void test_closed_form(void **state) {
  (void)state;
  assert_int_equal(apex_f32_to_f16(1.0f), 0x3C00);
  assert_int_equal(apex_f32_to_f16(-2.0f), 0xC000);
  assert_int_equal(apex_f32_to_f16(65504.0f), 0x7BFF);
  assert_int_equal(apex_f32_to_f16(65519.99f), 0x7BFF);
  assert_int_equal(apex_f32_to_f16(65520.0f), 0x7C00); /* the tie at the top rounds to even = Inf */
  assert_int_equal(apex_f32_to_f16(1e10f), 0x7C00);
  assert_int_equal(apex_f32_to_f16(-INFINITY), 0xFC00);
  assert_int_equal(apex_f32_to_f16(0x1p-24f), 0x0001);  /* smallest subnormal */
  assert_int_equal(apex_f32_to_f16(0x1p-25f), 0x0000);  /* half of it: tie to even zero */
  assert_int_equal(apex_f32_to_f16(0x1.8p-24f), 0x0002); /* 1.5 ulp: tie to even 2 */
  assert_int_equal(apex_f32_to_f16(0x1p-14f), 0x0400);  /* smallest normal */
  assert_int_equal(apex_f32_to_f16(-0.0f), 0x8000);
  assert_true(apex_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(apex_f16_to_f32(0x03FF) == 0x3FFp-24f);
  assert_true(isnan(apex_f16_to_f32(0x7C01)));
  assert_int_equal(apex_f32_to_bf16(1.0f), 0x3F80);
  assert_int_equal(apex_f32_to_bf16(tu_float(0x3F808000)), 0x3F80); /* tie, even stays */
  assert_int_equal(apex_f32_to_bf16(tu_float(0x3F818000)), 0x3F82); /* tie, odd rounds up */
  assert_int_equal(apex_f32_to_bf16(tu_float(0x7F7FFFFF)), 0x7F80); /* FLT_MAX rounds to Inf */
  assert_int_equal(apex_f32_to_bf16(tu_float(0x00000001)), 0x0000);
  assert_int_equal(apex_f32_to_bf16(tu_float(0x00008000)), 0x0000); /* subnormal tie to even 0 */
  assert_int_equal(apex_f32_to_bf16(tu_float(0x00018000)), 0x0002);
  assert_true(isnan(apex_bf16_to_f32(apex_f32_to_bf16(NAN))));
  assert_int_equal(apex_f32_to_f16(tu_float(0xFFC00000)) & 0x8000, 0x8000); /* NaN keeps its sign */
}

/* Every 16-bit pattern widens and narrows back to itself; NaNs stay NaN (quieted). */
static void round_trip_all(uint16_t (*narrow)(float), float (*widen)(uint16_t), uint16_t exp_mask, uint16_t quiet) {
  for (uint32_t p = 0; p < 65536; p++) {
    uint16_t h = (uint16_t)p;
    float f = widen(h);
    uint16_t back = narrow(f);
    int is_nan = (h & exp_mask) == exp_mask && (h & ~(exp_mask | 0x8000)) != 0;
    if (is_nan) {
      if (!isnan(f)) fail_msg("NaN 0x%04x widened to non-NaN %a", h, f);
      if (back != (h | quiet)) fail_msg("NaN 0x%04x came back as 0x%04x", h, back);
    } else if (back != h) {
      fail_msg("0x%04x -> %a -> 0x%04x", h, f, back);
    }
  }
}

static void test_round_trip_f16(void **state) {
  (void)state;
  round_trip_all(apex_f32_to_f16, apex_f16_to_f32, 0x7C00, 0x0200);
}

static void test_round_trip_bf16(void **state) {
  (void)state;
  round_trip_all(apex_f32_to_bf16, apex_bf16_to_f32, 0x7F80, 0x0040);
}

/* The scalar narrowing obeys the nearest-even property on a dense sample of f32 patterns (the
 * long test test_dtype_exhaustive covers all 2^32). */
static void test_nearest_property_sampled(void **state) {
  (void)state;
  for (uint64_t p = 0; p < (1ull << 32); p += 4099) {
    float x = tu_float((uint32_t)p);
    if (isnan(x)) continue;
    if (isinf(x)) {
      assert_int_equal(apex_f32_to_f16(x), signbit(x) ? 0xFC00 : 0x7C00);
      continue;
    }
    check_nearest(x, apex_f32_to_f16(x), f16_widen, 0x7BFF);
    check_nearest(x, apex_f32_to_bf16(x), bf16_widen, 0x7F7F);
  }
}

/* PyTorch's conversions of special and random values (NaNs excluded: PyTorch makes every bf16 NaN
 * 0x7FC0, apex keeps sign and payload). File: u32 count, then count x {f32 bits, f16 bits, bf16 bits}. */
static void test_pytorch_golden(void **state) {
  (void)state;
  size_t size;
  uint8_t *buf = tu_read_data("dtype_golden.bin", &size);
  uint32_t count;
  memcpy(&count, buf, 4);
  assert_int_equal(size, 4 + (size_t)count * 8);
  assert_true(count > 1000);
  for (uint32_t i = 0; i < count; i++) {
    uint32_t x;
    uint16_t h, b;
    memcpy(&x, buf + 4 + i * 8, 4);
    memcpy(&h, buf + 8 + i * 8, 2);
    memcpy(&b, buf + 10 + i * 8, 2);
    if (apex_f32_to_f16(tu_float(x)) != h) fail_msg("f16(0x%08x): apex 0x%04x, torch 0x%04x", x, apex_f32_to_f16(tu_float(x)), h);
    if (apex_f32_to_bf16(tu_float(x)) != b) fail_msg("bf16(0x%08x): apex 0x%04x, torch 0x%04x", x, apex_f32_to_bf16(tu_float(x)), b);
  }
  free(buf);
}

/* Bulk conversions on each path against the scalar reference, for every dtype pair, over all 65536
 * 16-bit patterns and a spread of f32 patterns, at odd lengths so the vector tails are exercised. */
static void bulk_matches_scalar(apex_cpu_isa isa) {
  TU_OK(apex_cpu_set_max_isa(isa));
  const size_t n = 65536 + 37;
  uint16_t *h = malloc(n * 2), *out16 = malloc(n * 2);
  float *f = malloc(n * 4), *out32 = malloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    h[i] = (uint16_t)(i * 40503u);
    f[i] = tu_float((uint32_t)(i * 2654435761u));
  }
  for (int from = 0; from < 2; from++) {
    apex_dtype t = from ? APEX_BF16 : APEX_F16;
    float (*widen)(uint16_t) = from ? bf16_widen : f16_widen;
    uint16_t (*narrow)(float) = from ? apex_f32_to_bf16 : apex_f32_to_f16;
    TU_OK(apex_convert(out32, APEX_F32, h, t, n));
    for (size_t i = 0; i < n; i++)
      if (tu_bits(out32[i]) != tu_bits(widen(h[i]))) fail_msg("%s->f32 [%zu]=0x%04x differs", apex_dtype_name(t), i, h[i]);
    TU_OK(apex_convert(out16, t, f, APEX_F32, n));
    for (size_t i = 0; i < n; i++)
      if (out16[i] != narrow(f[i])) fail_msg("f32->%s [%zu]=0x%08x: 0x%04x vs 0x%04x", apex_dtype_name(t), i, tu_bits(f[i]), out16[i], narrow(f[i]));
    /* 16-bit to the other 16-bit format: one rounding of the exact widening. */
    apex_dtype other = from ? APEX_F16 : APEX_BF16;
    uint16_t (*narrow_other)(float) = from ? apex_f32_to_f16 : apex_f32_to_bf16;
    TU_OK(apex_convert(out16, other, h, t, n));
    for (size_t i = 0; i < n; i++)
      if (out16[i] != narrow_other(widen(h[i]))) fail_msg("%s->%s [%zu] differs", apex_dtype_name(t), apex_dtype_name(other), i);
  }
  free(h);
  free(out16);
  free(f);
  free(out32);
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

static void test_bulk_portable(void **state) {
  (void)state;
  bulk_matches_scalar(APEX_CPU_ISA_PORTABLE);
}

static void test_bulk_avx2(void **state) {
  (void)state;
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX2) skip(); /* this CPU has no AVX2/F16C */
  bulk_matches_scalar(APEX_CPU_ISA_AVX2);
}

static void test_bulk_avx512(void **state) {
  (void)state;
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX512) skip(); /* this CPU has no AVX-512F */
  bulk_matches_scalar(APEX_CPU_ISA_AVX512);
}

/* The inputs where a vector path is most likely to part from the portable one: rounding ties (even
 * and odd kept bit), f32 denormals (which VCVTNEPS2BF16 would flush), the f16 overflow and underflow
 * thresholds and their neighbours, signalling and quiet NaNs with payload bits in every position, Inf,
 * both zeros, the largest finite values; and the 16-bit patterns of the same kinds. */
static const uint32_t edge_f32[] = {
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00007FFF, 0x00008000, 0x00008001, 0x00018000, 0x0000FFFF,
    0x007FFFFF, 0x807FFFFF, 0x007F8000, 0x00800000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x3F800FFF,
    0x3F801000, 0x3F803000, 0x3F801001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x477FE000, 0x477FEFFF,
    0x477FF000, 0x477FF001, 0x47800000, 0x38800000, 0x387FFFFF, 0x387FE000, 0x33000000, 0x33000001, 0x32FFFFFF,
    0x33800000, 0x33C00000, 0x33A00000, 0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7F800100, 0x7F810000,
    0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA0E000, 0x7F801FFF, 0x7F802000,
};
static const uint16_t edge_16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7C01,
                                   0x7D00, 0x7DFF, 0x7E00, 0x7FFF, 0xFFFF, 0x007F, 0x0080, 0x7F7F, 0x7F80, 0x7F81,
                                   0x7FBF, 0x7FC0, 0xFF81, 0x3C00, 0x3C01, 0xBC01};

/* Every pair on every ISA level this CPU has, at every length 1..40 and at four alignments, against
 * the scalar reference: the lengths reach the vector bodies and all their tails. */
static void test_edge_cases_every_isa(void **state) {
  (void)state;
  enum { NE = sizeof edge_f32 / sizeof edge_f32[0], N16 = sizeof edge_16 / sizeof edge_16[0], MAXN = 40 };
  float f[MAXN + 4], out32[MAXN + 4];
  uint16_t h[MAXN + 4], out16[MAXN + 4];
  for (int isa = APEX_CPU_ISA_PORTABLE; isa <= (int)apex_cpu_native_isa(); isa++) {
    TU_OK(apex_cpu_set_max_isa((apex_cpu_isa)isa));
    for (int rot = 0; rot < NE; rot++)
      for (size_t off = 0; off < 4; off++)
        for (size_t n = 1; n <= MAXN; n++) {
          for (size_t i = 0; i < n; i++) {
            f[off + i] = tu_float(edge_f32[(rot + i) % NE]);
            h[off + i] = edge_16[(rot + i) % N16];
          }
          for (int t = 0; t < 2; t++) {
            apex_dtype dt = t ? APEX_BF16 : APEX_F16, other = t ? APEX_F16 : APEX_BF16;
            uint16_t (*narrow)(float) = t ? apex_f32_to_bf16 : apex_f32_to_f16;
            uint16_t (*narrow_other)(float) = t ? apex_f32_to_f16 : apex_f32_to_bf16;
            float (*widen)(uint16_t) = t ? apex_bf16_to_f32 : apex_f16_to_f32;
            out16[off + n] = 0xABCD; /* the element past the end stays untouched */
            TU_OK(apex_convert(out16 + off, dt, f + off, APEX_F32, n));
            for (size_t i = 0; i < n; i++)
              if (out16[off + i] != narrow(f[off + i]))
                fail_msg("%s: f32->%s of 0x%08x at [%zu] of %zu: 0x%04x, portable 0x%04x", apex_cpu_isa_name((apex_cpu_isa)isa),
                         apex_dtype_name(dt), tu_bits(f[off + i]), i, n, out16[off + i], narrow(f[off + i]));
            assert_int_equal(out16[off + n], 0xABCD);
            out32[off + n] = 1234.0f;
            TU_OK(apex_convert(out32 + off, APEX_F32, h + off, dt, n));
            for (size_t i = 0; i < n; i++)
              if (tu_bits(out32[off + i]) != tu_bits(widen(h[off + i])))
                fail_msg("%s: %s->f32 of 0x%04x: 0x%08x, portable 0x%08x", apex_cpu_isa_name((apex_cpu_isa)isa), apex_dtype_name(dt),
                         h[off + i], tu_bits(out32[off + i]), tu_bits(widen(h[off + i])));
            assert_true(out32[off + n] == 1234.0f);
            TU_OK(apex_convert(out16 + off, other, h + off, dt, n));
            for (size_t i = 0; i < n; i++)
              if (out16[off + i] != narrow_other(widen(h[off + i])))
                fail_msg("%s: %s->%s of 0x%04x differs", apex_cpu_isa_name((apex_cpu_isa)isa), apex_dtype_name(dt),
                         apex_dtype_name(other), h[off + i]);
            assert_int_equal(out16[off + n], 0xABCD);
          }
        }
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

/* Independent anchors for the edge cases above, from the closed form: the bf16 of the smallest f32
 * denormal is itself a denormal under nearest-even (0x00000001 is below half of bf16's 0x0001, so 0;
 * 0x00008001 is above half, so 0x0001), which VCVTNEPS2BF16 would have flushed to 0; a signalling
 * NaN keeps its sign and top payload and gains the quiet bit. Checked at every ISA level. */
static void test_edge_closed_form_every_isa(void **state) {
  (void)state;
  const uint32_t in[] = {0x00008001, 0x80018000, 0x007FFFFF, 0x00000001, 0x7F800001, 0xFFA00000, 0x3F808000, 0x3F818000};
  const uint16_t want[] = {0x0001, 0x8002, 0x0080, 0x0000, 0x7FC0, 0xFFE0, 0x3F80, 0x3F82};
  enum { N = sizeof in / sizeof in[0] };
  for (int isa = APEX_CPU_ISA_PORTABLE; isa <= (int)apex_cpu_native_isa(); isa++) {
    TU_OK(apex_cpu_set_max_isa((apex_cpu_isa)isa));
    float f[32];
    uint16_t b[32];
    for (int i = 0; i < 32; i++) f[i] = tu_float(in[i % N]); /* 32: a full vector body on every path */
    TU_OK(apex_convert(b, APEX_BF16, f, APEX_F32, 32));
    for (int i = 0; i < 32; i++)
      if (b[i] != want[i % N]) fail_msg("%s: bf16(0x%08x) = 0x%04x, want 0x%04x", apex_cpu_isa_name((apex_cpu_isa)isa), in[i % N], b[i], want[i % N]);
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

/* Large conversions split over threads give the same bits at 1, 2 and 3 threads, on every ISA level
 * this CPU has, as the portable path at 1 thread. */
static void test_thread_count_independent(void **state) {
  (void)state;
  const size_t n = 3 * APEX_MT_DEFAULT_CHUNK * 4 + 11;
  apex_tensor *src = tu_random_tensor(APEX_F32, n, 7, 1000.0f);
  uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
  int before = apex_get_max_threads();
  apex_set_threads_follow_load(0); /* the threads asked for, however busy the machine */
  TU_OK(apex_set_num_threads(1));
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE));
  TU_OK(apex_convert(a, APEX_BF16, apex_tensor_data(src), APEX_F32, n));
  for (int isa = APEX_CPU_ISA_PORTABLE; isa <= (int)apex_cpu_native_isa(); isa++)
    for (int threads = 1; threads <= 3; threads++) {
      TU_OK(apex_cpu_set_max_isa((apex_cpu_isa)isa));
      TU_OK(apex_set_num_threads(threads));
      memset(b, 0, n * 2);
      TU_OK(apex_convert(b, APEX_BF16, apex_tensor_data(src), APEX_F32, n));
      assert_memory_equal(a, b, n * 2);
    }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  TU_OK(apex_set_num_threads(before));
  apex_set_threads_follow_load(1);
  free(a);
  free(b);
  apex_tensor_destroy(src);
}

static void test_bad_input(void **state) {
  (void)state;
  float f = 1;
  uint16_t h;
  TU_FAILS(apex_convert(&h, (apex_dtype)7, &f, APEX_F32, 1), APEX_ERR_DTYPE, "destination");
  TU_FAILS(apex_convert(&h, APEX_F16, &f, (apex_dtype)-1, 1), APEX_ERR_DTYPE, "source");
  TU_FAILS(apex_convert(NULL, APEX_F16, &f, APEX_F32, 1), APEX_ERR_INVALID_ARG, "NULL");
  TU_FAILS(apex_convert(&f, APEX_F16, &f, APEX_F32, 1), APEX_ERR_INVALID_ARG, "in-place");
  TU_OK(apex_convert(NULL, APEX_F16, NULL, APEX_F32, 0));
  apex_dtype d;
  TU_FAILS(apex_dtype_parse("fp8", &d), APEX_ERR_INVALID_ARG, "fp8");
  TU_OK(apex_dtype_parse("bfloat16", &d));
  assert_int_equal(d, APEX_BF16);
  assert_int_equal(apex_dtype_size(APEX_F32), 4);
  assert_int_equal(apex_dtype_size((apex_dtype)9), 0);
  assert_string_equal(apex_dtype_name((apex_dtype)9), "invalid");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_closed_form),       cmocka_unit_test(test_round_trip_f16),
      cmocka_unit_test(test_round_trip_bf16),   cmocka_unit_test(test_nearest_property_sampled),
      cmocka_unit_test(test_pytorch_golden),    cmocka_unit_test(test_bulk_portable),
      cmocka_unit_test(test_bulk_avx2),         cmocka_unit_test(test_bulk_avx512),
      cmocka_unit_test(test_edge_cases_every_isa), cmocka_unit_test(test_edge_closed_form_every_isa),
      cmocka_unit_test(test_thread_count_independent),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
