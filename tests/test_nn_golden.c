/* test_nn_golden.c: every op's forward and backward against PyTorch.
 *
 * tests/data/nn_ops_golden.bin is made by tests/gen_ops_golden.py (Debian's python3-torch, CPU) from
 * the cases in nn_cases.h. For each case and dtype the inputs are rounded to the dtype; the output and
 * the gradients of L = sum(out * R) must match PyTorch's
 *   f32:      |apex - torch| <= 1e-5 * max(|torch|, 1e-2 * max|torch| over the tensor)
 *   f16/bf16: |apex - torch| <= 2 ulp of the dtype at max(|torch|, 1e-2 * max|torch|)
 * (the floor keeps values that cancel to near zero from demanding more than f32 can give). Dropout is
 * not compared: PyTorch's generator is not apex's (its backward is checked in test_nn_gradcheck).
 * bf16 matmul, linear and conv2d gradients on the oneDNN path get one more term: see rounded_r_bound;
 * bf16 attention there gets one on its output and every input's gradient: see attention_bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/gemm_onednn.h"
#include "testutil.h"
#include "nn_cases.h"
#include "conv_bound.h"

typedef struct golden {
  char *buf;
  size_t size;
} golden;

/* Finds record `name`: its shape and data (unaligned-safe copy into a new f32 tensor). */
static apex_tensor *find(const golden *gd, const char *name) {
  size_t at = 0;
  while (at + 8 <= gd->size) {
    uint32_t nl, nd;
    memcpy(&nl, gd->buf + at, 4);
    const char *nm = gd->buf + at + 4;
    memcpy(&nd, gd->buf + at + 4 + nl, 4);
    int64_t shape[APEX_MAX_DIMS];
    memcpy(shape, gd->buf + at + 8 + nl, 8 * nd);
    size_t n = 1;
    for (uint32_t i = 0; i < nd; i++) n *= (size_t)shape[i];
    const char *data = gd->buf + at + 8 + nl + 8 * nd;
    if (strlen(name) == nl && !memcmp(nm, name, nl)) {
      apex_tensor *t = apex_tensor_create(APEX_F32, (int)nd, shape);
      memcpy(apex_tensor_data(t), data, n * 4);
      return t;
    }
    at += 8 + nl + 8 * nd + 4 * n;
  }
  fail_msg("golden record %s not found (regenerate with tests/gen_ops_golden.py)", name);
  return NULL;
}

static double ulp(double v, apex_dtype dt) {
  int e;
  frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
  int mant = dt == APEX_F16 ? 10 : 7, emin = dt == APEX_F16 ? -14 : -126;
  e = e - 1 < emin ? emin : e - 1;
  return ldexp(1.0, e - mant);
}

/* Compares apex's values with torch's, the bound widened by extra[i] where extra is not NULL; returns
 * the worst error in units of the bound. */
static double compare(const char *what, const apex_tensor *a, const apex_tensor *b, apex_dtype dt, const double *extra) {
  size_t n = apex_tensor_numel(b);
  if (apex_tensor_numel(a) != n) fail_msg("%s: %zu elements, torch has %zu", what, apex_tensor_numel(a), n);
  double mx = 0, worst = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(apex_tensor_get(b, i)));
  for (size_t i = 0; i < n; i++) {
    double x = apex_tensor_get(a, i), y = apex_tensor_get(b, i), ref = fmax(fabs(y), 1e-2 * mx);
    double bound = (dt == APEX_F32 ? 1e-5 * ref : 2 * ulp(ref, dt)) + (extra ? extra[i] : 0);
    double err = fabs(x - y) / (bound > 0 ? bound : 1e-30);
    if (!(err <= 1.0)) fail_msg("%s[%zu]: apex %.9g, torch %.9g (bound %.3g)", what, i, x, y, bound);
    worst = fmax(worst, err);
  }
  return worst;
}

/* Where the CPU runs bf16 matrix products through oneDNN (gemm_onednn.c), a backward product first
 * rounds the f32 output gradient R to bf16 (relative error up to 2^-9 per element), as PyTorch's own
 * bf16 backward carries R in bf16; the golden values keep R in f32. So the gradients of matmul,
 * linear and conv2d (conv_bound.h; conv_onednn.c) get 2^-9 * (|R| x |other operand|) at each element
 * on top of the 2 ulp, computed here from the operands; NULL (no widening) for every other case, dtype, input or path. */
static double *rounded_r_bound(const gc_case *c, int k, apex_var **in, const apex_tensor *R, apex_dtype dt) {
  int lin = !strcmp(c->name, "linear"), mm = !strncmp(c->name, "matmul", 6), conv = !strcmp(c->name, "conv2d");
  if (dt != APEX_BF16 || !(lin || mm || conv) || k > 1 || !apex__onednn_active(NULL)) return NULL;
  if (conv) return conv_rounding_bound(k, apex_var_value(in[0]), apex_var_value(in[1]), R, &conv_case_opts);
  const apex_tensor *A = apex_var_value(in[0]), *B = apex_var_value(in[1]);
  int nda = apex_tensor_ndim(A), ndb = apex_tensor_ndim(B);
  size_t K = (size_t)apex_tensor_dim(A, nda - 1), N = (size_t)(lin ? apex_tensor_dim(B, 0) : apex_tensor_dim(B, ndb - 1));
  size_t M = lin ? apex_tensor_numel(A) / K : (size_t)apex_tensor_dim(A, nda - 2), nb = apex_tensor_numel(A) / (M * K);
  int shared = lin || ndb == 2; /* one B for every batch entry */
  double *out = calloc(apex_tensor_numel(k ? B : A), sizeof *out);
  assert_non_null(out);
  for (size_t bi = 0; bi < nb; bi++)
    for (size_t i = 0; i < M; i++)
      for (size_t t = 0; t < K; t++)
        for (size_t j = 0; j < N; j++) {
          /* op(B)[t, j]: linear's w is [N, K] */
          size_t ib = lin ? j * K + t : (shared ? 0 : bi * K * N) + t * N + j, ia = (bi * M + i) * K + t;
          double r = fabs(apex_tensor_get(R, (bi * M + i) * N + j));
          if (k == 0)
            out[ia] += ldexp(r * fabs(apex_tensor_get(B, ib)), -9);
          else
            out[ib] += ldexp(r * fabs(apex_tensor_get(A, ia)), -9);
        }
  return out;
}

/* Where bf16 attention runs on oneDNN (backend/cpu/attention.c), the f32 probabilities P are rounded
 * to bf16 for P v and P^T R, the f32 output gradient R for R v^T and P^T R, and dS for dS k and dS^T q,
 * each by up to 2^-9 of itself; the golden values round none of them. The bound of each element grows by the
 * first-order effect of those roundings, computed here in double from the inputs, per head:
 *   out: 2^-9 P |v|;  E_P = 2^-9 |R| |v|^T (dP's error);  E_S = scale P (E_P + rowsum(P E_P)) (dS's);
 *   F = E_S + 2^-9 |dS|;  grad q: F |k|;  grad k: F^T |q|;  grad v: 2^-8 P^T |R| (P and R rounded).
 * k is the input whose gradient is compared, -1 for the output; NULL for every other case or path. */
static double *attention_bound(const gc_case *c, int k, apex_var **in, const apex_tensor *R, apex_dtype dt) {
  if (dt != APEX_BF16 || strncmp(c->name, "causal_attention", 16) || !apex__onednn_active(NULL)) return NULL;
  const apex_tensor *Q = apex_var_value(in[0]), *K = apex_var_value(in[1]), *V = apex_var_value(in[2]);
  int nd = apex_tensor_ndim(Q);
  size_t T = (size_t)apex_tensor_dim(Q, nd - 2), D = (size_t)apex_tensor_dim(Q, nd - 1), heads = apex_tensor_numel(Q) / (T * D);
  double scale = 1.0 / sqrt((double)D), *out = calloc(apex_tensor_numel(Q), sizeof *out), *P = calloc(T * T, sizeof *P),
         *EP = calloc(T * T, sizeof *EP), *F = calloc(T * T, sizeof *F);
  assert_true(out && P && EP && F);
#define AT(t, h, i, c) ((double)apex_tensor_get((t), ((h) * T + (i)) * D + (c)))
  for (size_t h = 0; h < heads; h++) {
    for (size_t i = 0; i < T; i++) {
      double mx = -INFINITY, sum = 0, rs = 0, rp = 0;
      for (size_t j = 0; j <= i; j++) {
        double sij = 0;
        for (size_t e = 0; e < D; e++) sij += AT(Q, h, i, e) * AT(K, h, j, e);
        P[i * T + j] = sij * scale;
        mx = fmax(mx, P[i * T + j]);
      }
      for (size_t j = 0; j <= i; j++) sum += (P[i * T + j] = exp(P[i * T + j] - mx));
      for (size_t j = 0; j <= i; j++) {
        P[i * T + j] /= sum;
        double dp = 0, ep = 0;
        for (size_t e = 0; e < D; e++) {
          dp += AT(R, h, i, e) * AT(V, h, j, e);
          ep += fabs(AT(R, h, i, e) * AT(V, h, j, e));
        }
        EP[i * T + j] = ldexp(ep, -9);
        F[i * T + j] = dp; /* dP for now */
        rs += P[i * T + j] * dp;
        rp += P[i * T + j] * EP[i * T + j];
      }
      for (size_t j = 0; j <= i; j++) {
        double ds = P[i * T + j] * (F[i * T + j] - rs) * scale;
        F[i * T + j] = scale * P[i * T + j] * (EP[i * T + j] + rp) + ldexp(fabs(ds), -9);
      }
    }
    for (size_t i = 0; i < T; i++)
      for (size_t j = 0; j <= i; j++)
        for (size_t e = 0; e < D; e++) {
          if (k < 0) out[(h * T + i) * D + e] += ldexp(P[i * T + j] * fabs(AT(V, h, j, e)), -9);
          if (k == 0) out[(h * T + i) * D + e] += F[i * T + j] * fabs(AT(K, h, j, e));
          if (k == 1) out[(h * T + j) * D + e] += F[i * T + j] * fabs(AT(Q, h, i, e));
          if (k == 2) out[(h * T + j) * D + e] += ldexp(P[i * T + j] * fabs(AT(R, h, i, e)), -8);
        }
  }
#undef AT
  free(P);
  free(EP);
  free(F);
  return out;
}

static void check(const golden *gd, const gc_case *c, apex_dtype dt) {
  const char *dn = apex_dtype_name(dt);
  char name[128];
  apex_graph *g = apex_graph_create();
  apex_var *in[MAX_IN];
  for (int k = 0; k < c->n_in; k++) {
    snprintf(name, sizeof name, "%s.in%d", c->name, k);
    apex_tensor *f = find(gd, name);
    in[k] = apex_var_create(apex_tensor_to(f, dt), !(c->nograd >> k & 1));
    apex_tensor_destroy(f);
  }
  apex_var *y = c->fn(g, in);
  if (!y) fail_msg("%s %s: %s", c->name, dn, apex_last_error());
  assert_int_equal(apex_tensor_dtype(apex_var_value(y)), dt);
  snprintf(name, sizeof name, "%s.%s.out", c->name, dn);
  apex_tensor *want = find(gd, name);
  size_t ny = apex_tensor_numel(apex_var_value(y));
  apex_tensor *R = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)ny});
  for (size_t i = 0; i < ny; i++) apex_tensor_set(R, i, (float)sin(0.7 * (double)i + 0.3));
  double *extra = attention_bound(c, -1, in, R, dt);
  double worst = compare(name, apex_var_value(y), want, dt, extra);
  free(extra);
  apex_tensor_destroy(want);
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = R}));
  for (int k = 0; k < c->n_in; k++) {
    if (c->nograd >> k & 1) continue;
    snprintf(name, sizeof name, "%s.%s.grad%d", c->name, dn, k);
    want = find(gd, name);
    extra = rounded_r_bound(c, k, in, R, dt);
    if (!extra) extra = attention_bound(c, k, in, R, dt);
    worst = fmax(worst, compare(name, apex_var_grad(in[k]), want, dt, extra));
    free(extra);
    apex_tensor_destroy(want);
  }
  printf("# %-20s %-4s worst error / bound %.3f\n", c->name, dn, worst);
  apex_tensor_destroy(R);
  for (int k = 0; k < c->n_in; k++) apex_var_destroy(in[k]);
  apex_graph_destroy(g);
}

static void test_ops_match_torch(void **state) {
  (void)state;
  golden gd;
  gd.buf = tu_read_data("nn_ops_golden.bin", &gd.size);
  cases_setup();
  apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (size_t i = 0; i < N_CASES; i++) {
    if (cases[i].fn == f_dropout) continue;
    for (int d = 0; d < 3; d++) check(&gd, &cases[i], dts[d]);
  }
  cases_teardown();
  free(gd.buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_ops_match_torch)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
