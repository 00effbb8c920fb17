/* test_cuda_classifier.c: the CUDA fused classifier (src/backend/cuda/classifier.cu: cross entropy and its
 * gradient written over the logits in one pass) against an f64 reference computed here from the same
 * rounded logits: f32, f16 and bf16, rows of a width that takes the 16-byte vectors and of one that does
 * not (a tail, and a row stride past the classes whose extra columns must come back untouched), targets
 * ignored (-1) and out of range (NaN loss). Bounds: loss |x - ref| <= 1e-4 (1 + |ref|); gradient
 * max |x - ref| / max |ref| <= 1e-5 (f32), 4e-3 (f16), 1e-2 (bf16): the dtype's rounding of the stored
 * gradient. Runs twice for the same bits. Each case prints one PASS/FAIL line; skipped without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "testutil.h"

#if APEX_TEST_CUDA
#include "backend/cuda/cuda_internal.h"

static float get(apex_dtype dt, const void *p, size_t i) {
  if (dt == APEX_F32) return ((const float *)p)[i];
  uint16_t b = ((const uint16_t *)p)[i];
  return dt == APEX_BF16 ? apex_bf16_to_f32(b) : apex_f16_to_f32(b);
}
static void put(apex_dtype dt, void *p, size_t i, float v) {
  if (dt == APEX_F32) ((float *)p)[i] = v;
  else ((uint16_t *)p)[i] = dt == APEX_BF16 ? apex_f32_to_bf16(v) : apex_f32_to_f16(v);
}

static int run_case(apex_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
  const size_t es = apex_dtype_size(dt), n = (size_t)(rows * ld);
  void *h = malloc(n * es), *out = malloc(n * es), *out2 = malloc(n * es);
  int64_t *tg = malloc((size_t)rows * sizeof *tg);
  float *loss = malloc((size_t)rows * sizeof *loss), *u = malloc(n * sizeof *u);
  assert_true(h && out && out2 && tg && loss && u);
  apex_rng rng = apex_rng_init((uint64_t)(cols + ld + dt));
  apex_rng_uniform(&rng, u, n);
  for (size_t i = 0; i < n; i++) put(dt, h, i, 16.0f * u[i] - 8.0f);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = cols; c < ld; c++) put(dt, h, (size_t)(r * ld + c), 1232.0f); /* past the classes; 1232 is exact in bf16 */
    tg[r] = (r * 7919) % cols;
  }
  tg[1] = -1;       /* ignored */
  tg[2] = cols;     /* out of range: NaN loss */
  tg[3] = cols - 1; /* the last class (in the tail when there is one) */
  const float dloss = 1.0f / (float)rows;
  void *dl = NULL, *dt_ = NULL, *dlo = NULL;
  TU_OK(apex__cuda_alloc(n * es, 0, &dl));
  TU_OK(apex__cuda_alloc((size_t)rows * sizeof *tg, 0, &dt_));
  TU_OK(apex__cuda_alloc((size_t)rows * sizeof(float), 0, &dlo));
  TU_OK(apex__cuda_memcpy(dt_, tg, (size_t)rows * sizeof *tg, APEX__H2D, 1));
  for (int run = 0; run < 2; run++) {
    TU_OK(apex__cuda_memcpy(dl, h, n * es, APEX__H2D, 1));
    TU_OK(apex__cuda_classifier(dl, dt, dt_, rows, cols, ld, dloss, dlo));
    TU_OK(apex__cuda_memcpy(run ? out2 : out, dl, n * es, APEX__D2H, 1));
  }
  TU_OK(apex__cuda_memcpy(loss, dlo, (size_t)rows * sizeof(float), APEX__D2H, 1));
  double eg = 0, gmax = 1e-30, el = 0;
  int untouched = 1, nan_ok = 1;
  for (int64_t r = 0; r < rows; r++) {
    const size_t base = (size_t)(r * ld);
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; c++) m = fmax(m, get(dt, h, base + c));
    for (int64_t c = 0; c < cols; c++) s += exp(get(dt, h, base + c) - m);
    const double lse = m + log(s), g = tg[r] == -1 ? 0.0 : dloss;
    if (tg[r] >= 0 && tg[r] < cols) {
      const double ref = lse - get(dt, h, base + tg[r]), e = fabs(loss[r] - ref) / (1 + fabs(ref));
      if (!(e <= el)) el = isnan(e) ? INFINITY : e;
    } else if (tg[r] == -1) {
      if (loss[r] != 0.0f) el = INFINITY;
    } else if (!isnan(loss[r])) {
      nan_ok = 0;
    }
    for (int64_t c = 0; c < cols; c++) {
      const double ref = g * (exp(get(dt, h, base + c) - lse) - (c == tg[r] ? 1.0 : 0.0)), x = get(dt, out, base + c);
      if (!(fabs(x - ref) <= eg)) eg = isnan(x) ? INFINITY : fabs(x - ref);
      if (fabs(ref) > gmax) gmax = fabs(ref);
    }
    for (int64_t c = cols; c < ld; c++)
      if (get(dt, out, base + c) != 1232.0f) untouched = 0;
  }
  eg /= gmax;
  const double bound = dt == APEX_F32 ? 1e-5 : dt == APEX_F16 ? 4e-3 : 1e-2;
  const int same = memcmp(out, out2, n * es) == 0;
  const int ok = el <= 1e-4 && eg <= bound && untouched && nan_ok && same;
  printf("classifier %s rows %lld cols %lld ld %lld: loss %.2e (bound 1e-04), gradient %.2e (bound %.0e), columns past "
         "the classes %s, NaN for a bad target %s, second run %s: %s\n",
         apex_dtype_name(dt), (long long)rows, (long long)cols, (long long)ld, el, eg, bound,
         untouched ? "untouched" : "WRITTEN", nan_ok ? "yes" : "NO", same ? "same bits" : "DIFFERS", ok ? "PASS" : "FAIL");
  apex__cuda_free(dl);
  apex__cuda_free(dt_);
  apex__cuda_free(dlo);
  free(h);
  free(out);
  free(out2);
  free(tg);
  free(loss);
  free(u);
  return ok;
}

static void test_matches_reference(void **state) {
  (void)state;
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("classifier cases skipped: %s\n", why);
    skip();
  }
  int ok = 1;
  const apex_dtype dts[] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int i = 0; i < 3; i++) {
    ok &= run_case(dts[i], 9, 50304, 50304); /* GPT-2's padded vocabulary: 16-byte vectors */
    ok &= run_case(dts[i], 6, 1001, 1003);   /* no vectors: odd stride, a tail, 2 columns past the classes */
  }
  assert_true(ok);
}

static void test_arguments(void **state) {
  (void)state;
  _Alignas(16) static char buf[256];
  int64_t tg[1] = {0};
  float loss[1];
  TU_FAILS(apex__cuda_classifier(NULL, APEX_BF16, tg, 1, 8, 8, 1.0f, loss), APEX_ERR_INVALID_ARG, "NULL argument");
  TU_FAILS(apex__cuda_classifier(buf, APEX_BF16, tg, 1, 8, 4, 1.0f, loss), APEX_ERR_INVALID_ARG, "ld >= cols");
  TU_FAILS(apex__cuda_classifier(buf, APEX_BF16, tg, 1, 0, 8, 1.0f, loss), APEX_ERR_INVALID_ARG, "cols >= 1");
  TU_FAILS(apex__cuda_classifier(buf, (apex_dtype)APEX_DTYPE_COUNT, tg, 1, 8, 8, 1.0f, loss), APEX_ERR_DTYPE, "f32, f16 or bf16");
  TU_OK(apex__cuda_classifier(buf, APEX_BF16, tg, 0, 8, 8, 1.0f, loss)); /* no rows: nothing to do */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arguments),
      cmocka_unit_test(test_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  printf("test_cuda_classifier skipped: built without CUDA (-DAPEX_CUDA=ON)\n");
  return 77;
}
#endif
