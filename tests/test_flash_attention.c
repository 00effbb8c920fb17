/* test_flash_attention.c: the CUDA fused attention roads, apex's kernel (src/backend/cuda/flash_attention.cu,
 * causal), apex's Hopper kernels (src/backend/cuda/flash_attention_sm90*.cu, causal; compute capability 9.0
 * only) and cuDNN's fused attention (src/backend/cuda/attention_cudnn.cu,
 * causal and without a mask), against
 * an f64 reference computed here on the host from the same rounded inputs, forward (o and the stats) and
 * backward (dq, dk, dv), f16 and bf16, head dims 64 and 128, heads read in place from a packed qkv and from
 * contiguous heads, t not a multiple of the 64-row tile; the backward's bits are the same on a second run
 * (determinism: cuDNN's deterministic backward is the one asked for); and, on GPT's packed layout, each
 * causal road's output against the materialised CUDA path (attention.cu). The argument checks
 * (UNSUPPORTED for what a road does not cover, INVALID_ARG for what is wrong everywhere) run without a GPU;
 * the GPU cases are skipped, with the reason, without one (the cuDNN cases also without cuDNN, the Hopper ones on a
 * device other than compute capability 9.0 or in a build without sm_90a code).
 *
 * Bounds (max |x - ref| over max |ref| of the tensor), the same for every road: bf16 o 1.5e-2, dq/dk/dv
 * 3e-2; f16 o 4e-3, dq/dk/dv 8e-3: the operands' own rounding (2^-9 relative for bf16, 2^-12 for f16), P
 * and dS rounded to the operand dtype before their products (as FlashAttention and the materialised path
 * do), the outputs' rounding. The stats: the kernel's (m, r) = (row max, 1 / sum): |m - ref| <= 1e-4 (1 +
 * |ref|), |r - ref| <= 2e-3 ref (the Hopper kernel's too); cuDNN's (L, 1): the log-sum-exp L within the same bound as m, r exactly 1.
 * The slot's hopper road (APEX_ATTENTION=hopper, through apex_kernel_attention_forward / _backward) is held to its
 * flash road on GPT's packed layout within the same bounds, or, on a device the Hopper kernels do not take, to
 * its refusal (APEX_ERR_UNSUPPORTED, no other path).
 * Each case prints one line `ROAD CASE (...): o E dq E dk E dv E m|lse E r E, backward bits ...: PASS|FAIL`. */
#define _POSIX_C_SOURCE 200809L /* setenv: the road knob, APEX_ATTENTION */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "testutil.h"

#if APEX_TEST_CUDA
#include "backend/cuda/cuda_internal.h"

/* The roads a case runs: apex's fused kernel (causal), cuDNN's fused attention causal and without a mask, apex's
 * Hopper kernels (causal). */
enum { ROAD_FLASH, ROAD_CUDNN_CAUSAL, ROAD_CUDNN_FULL, ROAD_HOPPER };
static const char *const road_names[] = {"flash", "cudnn causal", "cudnn full", "hopper"};

static apex_status road_fwd(int road, const apex__cuda_flash *g, const void *q, const void *k, const void *v, void *o, float *st) {
  if (road == ROAD_FLASH) return apex__cuda_flash_attention_fwd(g, q, k, v, o, st);
  if (road == ROAD_HOPPER) return apex__cuda_flash_sm90_fwd(g, q, k, v, o, st);
  return apex__cuda_sdpa_fwd(g, road == ROAD_CUDNN_CAUSAL, q, k, v, o, st);
}

static apex_status road_bwd(int road, const apex__cuda_flash *g, const void *q, const void *k, const void *v, const void *o,
                            const void *dout, const float *st, void *dq, void *dk, void *dv) {
  if (road == ROAD_FLASH) return apex__cuda_flash_attention_bwd(g, q, k, v, o, dout, st, dq, dk, dv);
  if (road == ROAD_HOPPER) return apex__cuda_flash_sm90_bwd(g, q, k, v, o, dout, st, dq, dk, dv);
  return apex__cuda_sdpa_bwd(g, road == ROAD_CUDNN_CAUSAL, 0, q, k, v, o, dout, st, dq, dk, dv);
}

static uint16_t bits_of(apex_dtype dt, float x) { return dt == APEX_BF16 ? apex_f32_to_bf16(x) : apex_f32_to_f16(x); }
static float value_of(apex_dtype dt, uint16_t b) { return dt == APEX_BF16 ? apex_bf16_to_f32(b) : apex_f16_to_f32(b); }

/* A device copy of n 16-bit elements. */
static void *to_dev(const uint16_t *h, size_t n) {
  void *d = NULL;
  TU_OK(apex__cuda_alloc(n * 2, 0, &d));
  TU_OK(apex__cuda_memcpy(d, h, n * 2, APEX__H2D, 1));
  return d;
}

/* max |a - ref| / max(max |ref|, unit) over the head elements (b, h, i, j) of two [batch * t, ld] row-major
 * buffers (a in the dtype, ref f64 with row length heads * d). unit: the scale below which ref counts as zero,
 * so that a result that is exactly zero in real arithmetic (dq and dk of one key: its softmax is the constant
 * 1) is judged by its rounding against its siblings' size, not divided by nothing. */
static double head_err(apex_dtype dt, const uint16_t *a, int64_t ld, const double *ref, int batch, int heads, int t,
                       int d, double unit) {
  double num = 0, den = unit > 1e-30 ? unit : 1e-30;
  for (int64_t r = 0; r < (int64_t)batch * t; r++)
    for (int c = 0; c < heads * d; c++) {
      double x = value_of(dt, a[r * ld + c]), y = ref[r * heads * d + c];
      if (fabs(x - y) > num || isnan(x)) num = isnan(x) ? INFINITY : fabs(x - y);
      if (fabs(y) > den) den = fabs(y);
    }
  return num / den;
}

/* One case: q, k, v at offsets 0, heads * d, 2 heads * d of rows of ld_in (packed qkv when ld_in = 3 heads
 * d); o, dout, dq, dk, dv likewise in rows of ld_out (dq, dk, dv in one buffer of ld_out * 3 per row when
 * packed). Returns 1 when every bound held. */
static int run_case(const char *name, int road, apex_dtype dt, int batch, int heads, int t, int d, int packed, uint64_t seed) {
  const int causal = road != ROAD_CUDNN_FULL;
  const int C = heads * d;
  const int64_t ld_in = packed ? 3 * C : C, rows = (int64_t)batch * t;
  const size_t n_in = (size_t)(rows * (packed ? 3 * C : C)) * (packed ? 1 : 3), n_o = (size_t)(rows * C);
  uint16_t *hin = malloc(n_in * 2), *hdo = malloc(n_o * 2), *ho = malloc(n_o * 2), *hg = malloc(n_in * 2);
  float *hst = malloc((size_t)rows * heads * 2 * sizeof(float));
  double *rq = calloc(n_o, sizeof(double)), *rk = calloc(n_o, sizeof(double)), *rv = calloc(n_o, sizeof(double));
  double *ro = calloc(n_o, sizeof(double)), *rdo = calloc(n_o, sizeof(double)), *rdq = calloc(n_o, sizeof(double));
  double *rdk = calloc(n_o, sizeof(double)), *rdv = calloc(n_o, sizeof(double));
  double *rm = calloc((size_t)rows * heads, sizeof(double)), *rr = calloc((size_t)rows * heads, sizeof(double));
  double *s = malloc((size_t)t * sizeof(double)), *dp = malloc((size_t)t * sizeof(double));
  assert_true(hin && hdo && ho && hg && hst && rq && rk && rv && ro && rdo && rdq && rdk && rdv && rm && rr && s && dp);
  apex_rng rng = apex_rng_init(seed);
  float *u = malloc((n_in > n_o ? n_in : n_o) * sizeof(float));
  assert_non_null(u);
  apex_rng_uniform(&rng, u, n_in);
  for (size_t i = 0; i < n_in; i++) hin[i] = bits_of(dt, 6.0f * u[i] - 3.0f); /* scores of a few units: peaked rows */
  apex_rng_uniform(&rng, u, n_o);
  for (size_t i = 0; i < n_o; i++) hdo[i] = bits_of(dt, 2.0f * u[i] - 1.0f);
  free(u);
  /* where q, k, v of row r (= b * t + i), column c < C sit in hin */
  const int64_t off_k = packed ? C : (int64_t)rows * C, off_v = 2 * off_k;
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) {
      rq[r * C + c] = value_of(dt, hin[r * ld_in + c]);
      rk[r * C + c] = value_of(dt, hin[off_k + r * ld_in + c]);
      rv[r * C + c] = value_of(dt, hin[off_v + r * ld_in + c]);
      rdo[r * C + c] = value_of(dt, hdo[r * C + c]);
    }
  /* the f64 reference, per (b, h) and row i */
  const double scale = 1.0 / sqrt((double)d);
  for (int b = 0; b < batch; b++)
    for (int h = 0; h < heads; h++)
      for (int i = 0; i < t; i++) {
        const double *qi = rq + ((int64_t)b * t + i) * C + h * d, *doi = rdo + ((int64_t)b * t + i) * C + h * d;
        double m = -INFINITY, l = 0, dd = 0;
        const int jn = causal ? i + 1 : t; /* the keys row i sees */
        for (int j = 0; j < jn; j++) {
          const double *kj = rk + ((int64_t)b * t + j) * C + h * d, *vj = rv + ((int64_t)b * t + j) * C + h * d;
          double a = 0, e = 0;
          for (int c = 0; c < d; c++) {
            a += qi[c] * kj[c];
            e += doi[c] * vj[c];
          }
          s[j] = a * scale;
          dp[j] = e;
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j < jn; j++) l += exp(s[j] - m);
        const int64_t srow = ((int64_t)(b * heads + h) * t + i);
        rm[srow] = m;
        rr[srow] = 1.0 / l;
        double *oi = ro + ((int64_t)b * t + i) * C + h * d;
        for (int j = 0; j < jn; j++) {
          s[j] = exp(s[j] - m) / l; /* P */
          dd += s[j] * dp[j];
          const double *vj = rv + ((int64_t)b * t + j) * C + h * d;
          for (int c = 0; c < d; c++) oi[c] += s[j] * vj[c];
        }
        double *dqi = rdq + ((int64_t)b * t + i) * C + h * d;
        for (int j = 0; j < jn; j++) {
          const double ds = s[j] * (dp[j] - dd) * scale;
          const int64_t rj = ((int64_t)b * t + j) * C + h * d;
          for (int c = 0; c < d; c++) {
            dqi[c] += ds * rk[rj + c];
            rdk[rj + c] += ds * qi[c];
            rdv[rj + c] += s[j] * doi[c];
          }
        }
      }
  /* the device run */
  void *din = to_dev(hin, n_in), *ddo = to_dev(hdo, n_o), *dout = NULL, *dg = NULL, *dst = NULL;
  TU_OK(apex__cuda_alloc(n_o * 2, 0, &dout));
  TU_OK(apex__cuda_alloc(n_in * 2, 1, &dg));
  TU_OK(apex__cuda_alloc((size_t)rows * heads * 2 * sizeof(float), 0, &dst));
  char *q = din, *k = q + off_k * 2, *v = q + off_v * 2, *gq = dg, *gk = gq + off_k * 2, *gv = gq + off_v * 2;
  apex__cuda_flash g = {batch, heads, t, d, ld_in, ld_in, ld_in, C, C, ld_in, ld_in, ld_in, dt};
  TU_OK(road_fwd(road, &g, q, k, v, dout, dst));
  TU_OK(road_bwd(road, &g, q, k, v, dout, ddo, dst, gq, gk, gv));
  TU_OK(apex__cuda_memcpy(ho, dout, n_o * 2, APEX__D2H, 1));
  TU_OK(apex__cuda_memcpy(hg, dg, n_in * 2, APEX__D2H, 1));
  TU_OK(apex__cuda_memcpy(hst, dst, (size_t)rows * heads * 2 * sizeof(float), APEX__D2H, 1));
  /* determinism: the backward again, the same bits */
  uint16_t *hg2 = malloc(n_in * 2);
  assert_non_null(hg2);
  TU_OK(road_bwd(road, &g, q, k, v, dout, ddo, dst, gq, gk, gv));
  TU_OK(apex__cuda_memcpy(hg2, dg, n_in * 2, APEX__D2H, 1));
  int same = memcmp(hg, hg2, n_in * 2) == 0;
  free(hg2);

  /* the gradients' common unit: the largest |dv| (dv = P^T dO is never zero for a nonzero dO) */
  double gunit = 0;
  for (size_t i = 0; i < n_o; i++) gunit = fabs(rdv[i]) > gunit ? fabs(rdv[i]) : gunit;
  const double eo = head_err(dt, ho, C, ro, batch, heads, t, d, 0);
  const double eq = head_err(dt, hg, ld_in, rdq, batch, heads, t, d, gunit);
  const double ek = head_err(dt, hg + off_k, ld_in, rdk, batch, heads, t, d, gunit);
  const double ev = head_err(dt, hg + off_v, ld_in, rdv, batch, heads, t, d, gunit);
  double em = 0, er = 0;
  for (int64_t r = 0; r < rows * heads; r++) {
    /* cuDNN keeps the log-sum-exp alone, as (m, r) = (L, 1): its L = m - log r against the reference's, and r */
    if (road == ROAD_CUDNN_CAUSAL || road == ROAD_CUDNN_FULL) {
      rm[r] -= log(rr[r]);
      rr[r] = 1;
    }
    double xm = fabs(hst[2 * r] - rm[r]) / (1 + fabs(rm[r])), xr = fabs(hst[2 * r + 1] - rr[r]) / rr[r];
    if (!(xm <= em)) em = isnan(xm) ? INFINITY : xm;
    if (!(xr <= er)) er = isnan(xr) ? INFINITY : xr;
  }
  const double bo = dt == APEX_BF16 ? 1.5e-2 : 4e-3, bg = dt == APEX_BF16 ? 3e-2 : 8e-3;
  const int ok = eo <= bo && eq <= bg && ek <= bg && ev <= bg && em <= 1e-4 && er <= 2e-3 && same;
  printf("%s %s (%s, batch %d, heads %d, t %d, d %d, %s): o %.2e dq %.2e dk %.2e dv %.2e (bounds %.0e, %.0e) %s %.2e "
         "r %.2e, backward bits %s: %s\n",
         road_names[road], name, apex_dtype_name(dt), batch, heads, t, d, packed ? "packed qkv" : "contiguous", eo, eq, ek, ev, bo,
         bg, road == ROAD_CUDNN_CAUSAL || road == ROAD_CUDNN_FULL ? "lse" : "m", em, er, same ? "repeat" : "DIFFER", ok ? "PASS" : "FAIL");
  fflush(stdout);

  /* GPT's packed layout: the materialised path (attention.cu) on the same qkv gives the same o */
  if (packed && causal) {
    void *dy2 = NULL, *dl = NULL;
    TU_OK(apex__cuda_alloc(n_o * 2, 0, &dy2));
    TU_OK(apex__cuda_alloc((size_t)rows * heads * sizeof(float), 0, &dl));
    apex__cuda_attn a = {batch, t, heads, d, dt};
    TU_OK(apex__cuda_attention_fwd(&a, din, dy2, dl));
    uint16_t *hy2 = malloc(n_o * 2);
    double *y2 = malloc(n_o * sizeof(double));
    assert_true(hy2 && y2);
    TU_OK(apex__cuda_memcpy(hy2, dy2, n_o * 2, APEX__D2H, 1));
    for (size_t i = 0; i < n_o; i++) y2[i] = value_of(dt, hy2[i]);
    const double e2 = head_err(dt, ho, C, y2, batch, heads, t, d, 0);
    printf("%s %s: o against the materialised CUDA attention %.2e (bound %.0e): %s\n", road_names[road], name, e2, bo,
           e2 <= bo ? "PASS" : "FAIL");
    assert_true(e2 <= bo);
    free(hy2);
    free(y2);
    apex__cuda_free(dy2);
    apex__cuda_free(dl);
  }
  apex__cuda_free(din);
  apex__cuda_free(ddo);
  apex__cuda_free(dout);
  apex__cuda_free(dg);
  apex__cuda_free(dst);
  void *all[] = {hin, hdo, ho, hg, hst, rq, rk, rv, ro, rdo, rdq, rdk, rdv, rm, rr, s, dp};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  return ok;
}

/* The cases every road runs: GPT's packed qkv in both dtypes, one row, a long sequence, head dim 128 on
 * contiguous and packed heads. Case i draws its inputs from seed0 + i. Returns 1 when every case passed. */
static int run_cases(int road, uint64_t seed0) {
  static const struct {
    const char *name;
    apex_dtype dt;
    int batch, heads, t, d, packed;
  } cases[] = {{"gpt packed", APEX_BF16, 2, 3, 200, 64, 1}, {"gpt packed", APEX_F16, 2, 3, 200, 64, 1},
               {"one row", APEX_BF16, 1, 2, 1, 64, 1},      {"long", APEX_BF16, 1, 2, 1024, 64, 1},
               {"d128", APEX_BF16, 3, 1, 130, 128, 0},      {"d128", APEX_F16, 1, 2, 64, 128, 1}};
  int ok = 1;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ok &= run_case(cases[i].name, road, cases[i].dt, cases[i].batch, cases[i].heads, cases[i].t, cases[i].d, cases[i].packed,
                   seed0 + i);
  return ok;
}

/* The Hopper kernels' own cases, beyond run_cases': their blocks are 128 rows and their streamed tiles 64 or 128,
 * so t of 129 (a second block of one row), 255 and 300 (the two-stage rings reused), d 128 on GPT's packed layout
 * in both dtypes, several batches and heads. */
static int run_hopper_cases(uint64_t seed0) {
  static const struct {
    const char *name;
    apex_dtype dt;
    int batch, heads, t, d, packed;
  } cases[] = {{"tile+1", APEX_F16, 2, 2, 129, 64, 1},    {"ring", APEX_BF16, 3, 2, 300, 64, 1},
               {"d128 packed", APEX_BF16, 2, 3, 255, 128, 1}, {"d128 packed", APEX_F16, 2, 2, 300, 128, 1},
               {"d128 contiguous", APEX_F16, 1, 3, 200, 128, 0}};
  int ok = 1;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ok &= run_case(cases[i].name, ROAD_HOPPER, cases[i].dt, cases[i].batch, cases[i].heads, cases[i].t, cases[i].d,
                   cases[i].packed, seed0 + i);
  return ok;
}

static void test_fused_matches_reference(void **state) {
  (void)state;
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("flash cases skipped: %s\n", why);
    skip();
  }
  assert_true(run_cases(ROAD_FLASH, 1));
}

/* cuDNN's fused attention (attention_cudnn.cu) on the same cases and the same bounds, causal and without a
 * mask, f16 and bf16, d 64 and 128, packed and contiguous heads: skipped, with the reason, where cuDNN cannot
 * be loaded; a shape cuDNN refuses on a GPU that has it fails (the slot would quietly take the kernel). */
static void test_cudnn_matches_reference(void **state) {
  (void)state;
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("cudnn cases skipped: %s\n", why);
    skip();
  }
  apex__cuda_flash probe = {1, 1, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, APEX_BF16};
  if (apex__cuda_sdpa_check(&probe, 1, 0, 0) == APEX_ERR_UNSUPPORTED && strstr(apex_last_error(), "cuDNN could not be loaded")) {
    printf("cudnn cases skipped: %s\n", apex_last_error());
    skip();
  }
  const int causal_ok = run_cases(ROAD_CUDNN_CAUSAL, 11), full_ok = run_cases(ROAD_CUDNN_FULL, 21);
  assert_true(causal_ok && full_ok);
}

/* apex's Hopper kernels (flash_attention_sm90*.cu), forward and backward, on run_cases' cases and their own, within
 * the same bounds: skipped, with the reason, on a device other than compute capability 9.0
 * or in a build without sm_90a code; any other refusal on a GPU fails. */
static void test_hopper_matches_reference(void **state) {
  (void)state;
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("hopper cases skipped: %s\n", why);
    skip();
  }
  void *buf = NULL, *st = NULL;
  TU_OK(apex__cuda_alloc(4 * 64 * 64 * 2, 1, &buf)); /* a packed qkv of t 64, then o */
  TU_OK(apex__cuda_alloc(64 * 2 * sizeof(float), 0, &st));
  apex__cuda_flash probe = {1, 1, 64, 64, 192, 192, 192, 64, 64, 64, 64, 64, APEX_BF16};
  char *p = buf;
  const apex_status ps = apex__cuda_flash_sm90_fwd(&probe, p, p + 128, p + 256, p + 3 * 64 * 64 * 2, st);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ps == APEX_OK ? "" : apex_last_error());
  apex__cuda_free(buf);
  apex__cuda_free(st);
  if (ps == APEX_ERR_UNSUPPORTED && (strstr(msg, "run on 9.0 only") || strstr(msg, "without sm_90a"))) {
    printf("hopper cases skipped: %s\n", msg);
    skip();
  }
  if (ps != APEX_OK) printf("hopper probe failed: %s\n", msg);
  assert_int_equal(ps, APEX_OK);
  const int common_ok = run_cases(ROAD_HOPPER, 31), own_ok = run_hopper_cases(41);
  assert_true(common_ok && own_ok);
}

/* A bf16 tensor on the GPU of shape [b, t, w], uniform in [-range, range) from seed (zeros when range is 0). */
static apex_tensor *dev_tensor(int64_t b, int64_t t, int64_t w, float range, uint64_t seed) {
  const int64_t shape[3] = {b, t, w};
  apex_tensor *d = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 3, shape), *h = apex_tensor_create(APEX_F32, 3, shape);
  assert_true(d && h);
  float *u = apex_tensor_data(h);
  const size_t n = apex_tensor_numel(h);
  apex_rng rng = apex_rng_init(seed);
  apex_rng_uniform(&rng, u, n);
  for (size_t i = 0; i < n; i++) u[i] = range * (2 * u[i] - 1);
  TU_OK(apex_tensor_copy(d, h));
  apex_tensor_destroy(h);
  return d;
}

/* max |a - b| / max |b| of two tensors of n elements on the GPU (through f32 host copies). */
static double tensor_err(const apex_tensor *a, const apex_tensor *b, int64_t b0, int64_t t, int64_t w) {
  const int64_t shape[3] = {b0, t, w};
  apex_tensor *ha = apex_tensor_create(APEX_F32, 3, shape), *hb = apex_tensor_create(APEX_F32, 3, shape);
  assert_true(ha && hb);
  TU_OK(apex_tensor_copy(ha, a));
  TU_OK(apex_tensor_copy(hb, b));
  const float *x = apex_tensor_data(ha), *y = apex_tensor_data(hb);
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < apex_tensor_numel(ha); i++) {
    const double e = fabs((double)x[i] - y[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(y[i]) > den) den = fabs(y[i]);
  }
  apex_tensor_destroy(ha);
  apex_tensor_destroy(hb);
  return num / den;
}

/* The slot's hopper road against its flash road through the public calls (GPT's packed qkv, bf16, B 2, H 3,
 * T 300, d 64): y within the bf16 bound of o, dqkv within that of the gradients; on a device the Hopper kernels
 * do not take, the road's answer is their refusal. */
static void test_hopper_road(void **state) {
  (void)state;
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("hopper road skipped: %s\n", why);
    skip();
  }
  enum { NB = 2, NH = 3, NT = 300, HD = 64, NC = NH * HD };
  apex_tensor *qkv = dev_tensor(NB, NT, 3 * NC, 1.5f, 51), *dy = dev_tensor(NB, NT, NC, 1.0f, 52);
  apex_tensor *y[2] = {dev_tensor(NB, NT, NC, 0, 0), dev_tensor(NB, NT, NC, 0, 0)};
  apex_tensor *dqkv[2] = {dev_tensor(NB, NT, 3 * NC, 0, 0), dev_tensor(NB, NT, 3 * NC, 0, 0)};
  const int64_t ss[4] = {NB, NH, NT, 2};
  apex_tensor *stats[2] = {apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 4, ss),
                           apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 4, ss)};
  assert_true(stats[0] && stats[1]);
  const char *roads[2] = {"flash", "hopper"};
  apex_status st[2];
  for (int r = 0; r < 2; r++) {
    setenv("APEX_ATTENTION", roads[r], 1);
    st[r] = apex_kernel_attention_forward(qkv, NH, y[r], stats[r]);
    if (st[r] == APEX_OK) st[r] = apex_kernel_attention_backward(dy, qkv, y[r], stats[r], NH, dqkv[r]);
    if (st[r] != APEX_OK) printf("%s road: %s\n", roads[r], apex_last_error());
  }
  unsetenv("APEX_ATTENTION");
  assert_int_equal(st[0], APEX_OK);
  const char *refusal = apex_last_error();
  if (st[1] == APEX_ERR_UNSUPPORTED && (strstr(refusal, "run on 9.0 only") || strstr(refusal, "without sm_90a"))) {
    printf("hopper road: refused on this device, as it must be (no other path)\n");
  } else {
    assert_int_equal(st[1], APEX_OK);
    const double ey = tensor_err(y[1], y[0], NB, NT, NC), eg = tensor_err(dqkv[1], dqkv[0], NB, NT, 3 * NC);
    printf("hopper road against the flash road (bf16, batch %d, heads %d, t %d, d %d, packed qkv): y %.2e dqkv %.2e (bounds "
           "1.5e-02, 3e-02): %s\n", NB, NH, NT, HD, ey, eg, ey <= 1.5e-2 && eg <= 3e-2 ? "PASS" : "FAIL");
    assert_true(ey <= 1.5e-2 && eg <= 3e-2);
  }
  apex_tensor *all[] = {qkv, dy, y[0], y[1], dqkv[0], dqkv[1], stats[0], stats[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

/* What a fused road (apex's kernel, cuDNN's) does not cover is UNSUPPORTED (the caller falls back), what is
 * wrong on every path INVALID_ARG; both are decided before any device work or cuDNN, so they hold without a GPU. */
static void test_arguments(void **state) {
  (void)state;
  _Alignas(16) static char buf[4096];
  const void *p = buf;
  float st[8];
  apex__cuda_flash g = {2, 12, 64, 64, 2304, 2304, 2304, 768, 768, 2304, 2304, 2304, APEX_BF16};
  apex__cuda_flash f = g;
  f.dtype = APEX_F32;
  TU_FAILS(apex__cuda_flash_attention_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "f16 or bf16");
  f = g;
  f.d = 80;
  f.ld_q = f.ld_k = f.ld_v = 3 * 12 * 80;
  f.ld_o = 12 * 80;
  TU_FAILS(apex__cuda_flash_attention_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "head dim 80");
  f = g;
  f.ld_k = 2300; /* >= heads * d but not a multiple of 8 */
  TU_FAILS(apex__cuda_flash_attention_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "16-byte aligned");
  TU_FAILS(apex__cuda_flash_attention_fwd(&g, p, buf + 2, p, buf, st), APEX_ERR_UNSUPPORTED, "16-byte aligned");
  f = g;
  f.ld_o = 512; /* below heads * d */
  TU_FAILS(apex__cuda_flash_attention_fwd(&f, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "below heads x d");
  f = g;
  f.t = 0;
  TU_FAILS(apex__cuda_flash_attention_fwd(&f, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "must be >= 1");
  TU_FAILS(apex__cuda_flash_attention_fwd(NULL, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "NULL geometry");
  TU_FAILS(apex__cuda_flash_attention_fwd(&g, p, p, NULL, buf, st), APEX_ERR_INVALID_ARG, "NULL operand 2");
  TU_FAILS(apex__cuda_flash_attention_fwd(&g, p, p, p, buf, NULL), APEX_ERR_INVALID_ARG, "NULL stats");
  TU_FAILS(apex__cuda_flash_attention_bwd(&g, p, p, p, p, p, st, buf, buf, NULL), APEX_ERR_INVALID_ARG, "NULL operand 7");
  f = g;
  f.ld_dq = 2300;
  TU_FAILS(apex__cuda_flash_attention_bwd(&f, p, p, p, p, p, st, buf, buf, buf), APEX_ERR_UNSUPPORTED, "operand 5");
  TU_FAILS(apex__cuda_flash_attention_bwd(&g, p, p, p, p, p, NULL, buf, buf, buf), APEX_ERR_INVALID_ARG, "NULL stats");
  /* the Hopper kernels make the same checks before they ask the device */
  f = g;
  f.dtype = APEX_F32;
  TU_FAILS(apex__cuda_flash_sm90_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "f16 or bf16");
  f = g;
  f.d = 80;
  f.ld_q = f.ld_k = f.ld_v = 3 * 12 * 80;
  f.ld_o = 12 * 80;
  TU_FAILS(apex__cuda_flash_sm90_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "head dim 80");
  f = g;
  f.ld_k = 2300;
  TU_FAILS(apex__cuda_flash_sm90_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "16-byte aligned");
  TU_FAILS(apex__cuda_flash_sm90_fwd(&g, p, buf + 2, p, buf, st), APEX_ERR_UNSUPPORTED, "16-byte aligned");
  f = g;
  f.ld_o = 512;
  TU_FAILS(apex__cuda_flash_sm90_fwd(&f, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "below heads x d");
  f = g;
  f.t = 0;
  TU_FAILS(apex__cuda_flash_sm90_fwd(&f, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "must be >= 1");
  TU_FAILS(apex__cuda_flash_sm90_fwd(NULL, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "NULL geometry");
  TU_FAILS(apex__cuda_flash_sm90_fwd(&g, p, p, NULL, buf, st), APEX_ERR_INVALID_ARG, "NULL operand 2");
  TU_FAILS(apex__cuda_flash_sm90_fwd(&g, p, p, p, buf, NULL), APEX_ERR_INVALID_ARG, "NULL stats");
  f = g;
  f.batch = 65536 / 12 + 1;
  TU_FAILS(apex__cuda_flash_sm90_fwd(&f, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "above 65535");
  TU_FAILS(apex__cuda_flash_sm90_bwd(&f, p, p, p, p, p, st, buf, buf, buf), APEX_ERR_UNSUPPORTED, "above 65535");
  TU_FAILS(apex__cuda_flash_sm90_bwd(&g, p, p, p, p, p, st, buf, buf, NULL), APEX_ERR_INVALID_ARG, "NULL operand 7");
  TU_FAILS(apex__cuda_flash_sm90_bwd(&g, p, p, p, p, p, NULL, buf, buf, buf), APEX_ERR_INVALID_ARG, "NULL stats");
  f = g;
  f.ld_dq = 2300;
  TU_FAILS(apex__cuda_flash_sm90_bwd(&f, p, p, p, p, p, st, buf, buf, buf), APEX_ERR_UNSUPPORTED, "operand 5");
  f = g;
  f.d = 32;
  f.ld_q = f.ld_k = f.ld_v = f.ld_dq = f.ld_dk = f.ld_dv = 3 * 12 * 32;
  f.ld_o = f.ld_do = 12 * 32;
  TU_FAILS(apex__cuda_flash_sm90_bwd(&f, p, p, p, p, p, st, buf, buf, buf), APEX_ERR_UNSUPPORTED, "head dim 32");
  TU_FAILS(apex__cuda_flash_sm90_bwd(NULL, p, p, p, p, p, st, buf, buf, buf), APEX_ERR_INVALID_ARG, "NULL geometry");
  /* cuDNN's road makes the same checks before cuDNN is asked */
  f = g;
  f.dtype = APEX_F32;
  TU_FAILS(apex__cuda_sdpa_fwd(&f, 1, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "f16 or bf16");
  TU_FAILS(apex__cuda_sdpa_check(&f, 1, 1, 0), APEX_ERR_UNSUPPORTED, "f16 or bf16");
  f = g;
  f.ld_k = 2300;
  TU_FAILS(apex__cuda_sdpa_fwd(&f, 1, p, p, p, buf, st), APEX_ERR_UNSUPPORTED, "16-byte aligned");
  TU_FAILS(apex__cuda_sdpa_fwd(&g, 0, p, buf + 2, p, buf, st), APEX_ERR_UNSUPPORTED, "16-byte aligned");
  f = g;
  f.ld_o = 512;
  TU_FAILS(apex__cuda_sdpa_fwd(&f, 1, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "below heads x d");
  f = g;
  f.t = 0;
  TU_FAILS(apex__cuda_sdpa_check(&f, 0, 0, 0), APEX_ERR_INVALID_ARG, "must be >= 1");
  TU_FAILS(apex__cuda_sdpa_fwd(NULL, 1, p, p, p, buf, st), APEX_ERR_INVALID_ARG, "NULL geometry");
  TU_FAILS(apex__cuda_sdpa_check(NULL, 1, 0, 0), APEX_ERR_INVALID_ARG, "NULL geometry");
  TU_FAILS(apex__cuda_sdpa_fwd(&g, 1, p, p, NULL, buf, st), APEX_ERR_INVALID_ARG, "NULL operand 2");
  TU_FAILS(apex__cuda_sdpa_fwd(&g, 1, p, p, p, buf, NULL), APEX_ERR_INVALID_ARG, "NULL stats");
  TU_FAILS(apex__cuda_sdpa_bwd(&g, 1, 0, p, p, p, p, p, st, buf, buf, NULL), APEX_ERR_INVALID_ARG, "NULL operand 7");
  TU_FAILS(apex__cuda_sdpa_bwd(&g, 1, 0, p, p, p, p, p, NULL, buf, buf, buf), APEX_ERR_INVALID_ARG, "NULL stats");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arguments),
      cmocka_unit_test(test_fused_matches_reference),
      cmocka_unit_test(test_cudnn_matches_reference),
      cmocka_unit_test(test_hopper_matches_reference),
      cmocka_unit_test(test_hopper_road),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  printf("test_flash_attention skipped: built without CUDA (-DAPEX_CUDA=ON)\n");
  return 77;
}
#endif
