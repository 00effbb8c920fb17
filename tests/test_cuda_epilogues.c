/* test_cuda_epilogues.c: cuBLASLt's training epilogues (apex__cuda_gemm_epilogue, src/backend/cuda/gemm.cu)
 * against an f64 reference computed here from the same bf16 operands, in apex's row-major convention:
 *   GELU_AUX_BIAS: C = gelu_tanh(A B^T + bias) and aux = A B^T + bias (c_fc's forward);
 *   DGELU_BGRAD:   C = (A B) * gelu_tanh'(aux) and bgrad = the column sums of C (the MLP's hidden gradient),
 *                  bgrad in bf16 and (where cuBLASLt takes it) f32; DGELU: that C alone;
 *   BGRADB:        C = A^T B with A [k, m], and bgrad = the column sums of A (a weight and bias gradient).
 * Bound: max |x - ref| / max |ref| <= 1e-2 for each output (bf16 outputs: 2^-9 relative rounding, and the
 * f32 accumulation). A refusal (cuBLASLt without an algorithm: APEX_ERR_UNSUPPORTED) is printed and
 * counted as a failure here, since GPT-2's step would silently lose the fusion. The argument checks run
 * without a GPU; the products are skipped, with the reason, without one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "testutil.h"

#if APEX_TEST_CUDA
#include "backend/cuda/cuda_internal.h"

enum { M = 96, N = 48, K = 40 };

static double gelu(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 /* sqrt(2 / pi) */ * (x + 0.044715 * x * x * x))); }
static double dgelu(double x) {
  const double u = 0.7978845608028654 /* sqrt(2 / pi) */ * (x + 0.044715 * x * x * x), t = tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 /* sqrt(2 / pi) */ * (1 + 3 * 0.044715 * x * x);
}

/* n bf16 values uniform in [-r, r), on the host (h, rounded values in v) and the device (returned). */
static void *operand(size_t n, float r, uint64_t seed, double *v) {
  float *u = malloc(n * sizeof *u);
  uint16_t *h = malloc(n * 2);
  assert_true(u && h);
  apex_rng rng = apex_rng_init(seed);
  apex_rng_uniform(&rng, u, n);
  for (size_t i = 0; i < n; i++) {
    h[i] = apex_f32_to_bf16(r * (2 * u[i] - 1));
    v[i] = apex_bf16_to_f32(h[i]);
  }
  void *d = NULL;
  TU_OK(apex__cuda_alloc(n * 2, 0, &d));
  TU_OK(apex__cuda_memcpy(d, h, n * 2, APEX__H2D, 1));
  free(u);
  free(h);
  return d;
}

/* max |dev - ref| / max |ref| over n bf16 values of device buffer d. */
static double err(const void *d, const double *ref, size_t n) {
  uint16_t *h = malloc(n * 2);
  assert_non_null(h);
  TU_OK(apex__cuda_memcpy(h, d, n * 2, APEX__D2H, 1));
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double x = apex_bf16_to_f32(h[i]);
    if (!(fabs(x - ref[i]) <= num)) num = isnan(x) ? INFINITY : fabs(x - ref[i]);
    if (fabs(ref[i]) > den) den = fabs(ref[i]);
  }
  free(h);
  return num / den;
}

static int report(const char *what, apex_status st, double e1, const char *n1, double e2, const char *n2) {
  if (st != APEX_OK) {
    printf("epilogue %s: %s: %s: FAIL\n", what, apex_status_name(st), apex_last_error());
    return 0;
  }
  const int ok = e1 <= 1e-2 && e2 <= 1e-2;
  printf("epilogue %s: %s %.2e, %s %.2e (bound 1e-02): %s\n", what, n1, e1, n2, e2, ok ? "PASS" : "FAIL");
  return ok;
}

static void test_epilogues(void **state) {
  (void)state;
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("epilogue cases skipped: %s\n", why);
    skip();
  }
  double *a = malloc(M * K * sizeof *a), *b = malloc(K * N * sizeof *b), *bias = malloc(N * sizeof *bias);
  double *aux = malloc(M * N * sizeof *aux), *c = malloc(M * N * sizeof *c), *pre = malloc(M * N * sizeof *pre);
  double *vec = calloc(M > N ? M : N, sizeof *vec);
  assert_true(a && b && bias && aux && c && pre && vec);
  void *da = operand(M * K, 1.0f, 1, a), *db = operand(K * N, 1.0f, 2, b), *dbias = operand(N, 1.0f, 3, bias);
  void *daux = operand(M * N, 3.0f, 4, aux), *dc = NULL, *dout_aux = NULL, *dvec = NULL;
  TU_OK(apex__cuda_alloc(M * N * 2, 1, &dc));
  TU_OK(apex__cuda_alloc(M * N * 2, 1, &dout_aux));
  TU_OK(apex__cuda_alloc((M > N ? M : N) * 2, 1, &dvec));
  int ok = 1;

  /* GELU_AUX_BIAS: A [M, K], B stored [N, K] (trans_b) */
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = bias[j];
      for (int k = 0; k < K; k++) s += a[i * K + k] * b[j * K + k];
      pre[i * N + j] = s;
      c[i * N + j] = gelu(s);
    }
  apex__cuda_epilogue e1 = {APEX__EPI_GELU_AUX_BIAS, dbias, dout_aux, NULL, 0};
  apex_status st = apex__cuda_gemm_epilogue(0, 1, M, N, K, da, db, APEX_BF16, dc, APEX_BF16, &e1);
  ok &= report("GELU_AUX_BIAS", st, st == APEX_OK ? err(dc, c, M * N) : 0, "C", st == APEX_OK ? err(dout_aux, pre, M * N) : 0,
               "aux");

  /* DGELU_BGRAD: A [M, K], B [K, N] */
  memset(vec, 0, N * sizeof *vec);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += a[i * K + k] * b[k * N + j];
      c[i * N + j] = s * dgelu(aux[i * N + j]);
      vec[j] += c[i * N + j];
    }
  apex__cuda_epilogue e2 = {APEX__EPI_DGELU_BGRAD, NULL, daux, dvec, 0};
  st = apex__cuda_gemm_epilogue(0, 0, M, N, K, da, db, APEX_BF16, dc, APEX_BF16, &e2);
  ok &= report("DGELU_BGRAD", st, st == APEX_OK ? err(dc, c, M * N) : 0, "C", st == APEX_OK ? err(dvec, vec, N) : 0, "bgrad");
  /* the same with an f32 bgrad (nn_linear_bwd's dgelu asks for it first; a refusal is no failure, the slot
   * then sums the rows itself), and DGELU alone (the slot's other form: its refusal is one) */
  TU_OK(apex__cuda_fill(dc, APEX_BF16, 0.0f, M * N));
  void *dvec32 = NULL;
  TU_OK(apex__cuda_alloc(N * 4, 1, &dvec32));
  apex__cuda_epilogue e2f = {APEX__EPI_DGELU_BGRAD, NULL, daux, dvec32, 1};
  st = apex__cuda_gemm_epilogue(0, 0, M, N, K, da, db, APEX_BF16, dc, APEX_BF16, &e2f);
  if (st == APEX_OK) {
    float h32[N];
    TU_OK(apex__cuda_memcpy(h32, dvec32, sizeof h32, APEX__D2H, 1));
    double num = 0, den = 1e-30;
    for (int j = 0; j < N; j++) num = isnan(h32[j]) ? INFINITY : fmax(num, fabs(h32[j] - vec[j])), den = fmax(den, fabs(vec[j]));
    ok &= report("DGELU_BGRAD, f32 bgrad", st, err(dc, c, M * N), "C", num / den, "bgrad");
  } else {
    printf("epilogue DGELU_BGRAD, f32 bgrad: refused (%s): nn_linear_bwd sums the rows instead\n", apex_last_error());
  }
  apex__cuda_free(dvec32);
  TU_OK(apex__cuda_fill(dc, APEX_BF16, 0.0f, M * N));
  apex__cuda_epilogue e4 = {APEX__EPI_DGELU, NULL, daux, NULL, 0};
  st = apex__cuda_gemm_epilogue(0, 0, M, N, K, da, db, APEX_BF16, dc, APEX_BF16, &e4);
  ok &= report("DGELU", st, st == APEX_OK ? err(dc, c, M * N) : 0, "C", 0, "-");

  /* BGRADB: A stored [K, Mb] (trans_a), B [K, N]; C [Mb, N] = A^T B, bgrad [Mb] = column sums of A. Mb = 24 so
   * that A's K x Mb values come from the first buffer. */
  const int Mb = 24;
  memset(vec, 0, Mb * sizeof *vec);
  for (int i = 0; i < Mb; i++) {
    for (int k = 0; k < K; k++) vec[i] += a[k * Mb + i];
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += a[k * Mb + i] * b[k * N + j];
      c[i * N + j] = s;
    }
  }
  apex__cuda_epilogue e3 = {APEX__EPI_BGRADB, NULL, NULL, dvec, 0};
  st = apex__cuda_gemm_epilogue(1, 0, Mb, N, K, da, db, APEX_BF16, dc, APEX_BF16, &e3);
  ok &= report("BGRADB", st, st == APEX_OK ? err(dc, c, Mb * N) : 0, "C", st == APEX_OK ? err(dvec, vec, Mb) : 0, "bgrad");

  void *all[] = {da, db, dbias, daux, dc, dout_aux, dvec};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex__cuda_free(all[i]);
  free(a), free(b), free(bias), free(aux), free(c), free(pre), free(vec);
  assert_true(ok);
}

static void test_arguments(void **state) {
  (void)state;
  _Alignas(16) static char buf[256];
  apex__cuda_epilogue e = {APEX__EPI_BGRADB, NULL, NULL, buf, 0};
  TU_FAILS(apex__cuda_gemm_epilogue(1, 0, 8, 8, 8, buf, buf, APEX_BF16, buf, APEX_BF16, NULL), APEX_ERR_INVALID_ARG,
           "NULL epilogue");
  TU_FAILS(apex__cuda_gemm_epilogue(1, 0, 8, 8, 8, buf, buf, APEX_F32, buf, APEX_F32, &e), APEX_ERR_UNSUPPORTED,
           "f16/bf16 in and out");
  TU_FAILS(apex__cuda_gemm_epilogue(1, 0, 8, 12, 8, buf, buf, APEX_BF16, buf, APEX_BF16, &e), APEX_ERR_UNSUPPORTED,
           "multiple of 8");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arguments),
      cmocka_unit_test(test_epilogues),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  printf("test_cuda_epilogues skipped: built without CUDA (-DAPEX_CUDA=ON)\n");
  return 77;
}
#endif
