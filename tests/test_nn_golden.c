/* test_nn_golden.c: every op's forward and backward against PyTorch.
 *
 * tests/data/nn_ops_golden.bin is made by tests/gen_ops_golden.py (Debian's python3-torch, CPU) from
 * the cases in nn_cases.h. For each case and dtype the inputs are rounded to the dtype; the output and
 * the gradients of L = sum(out * R) must match PyTorch's
 *   f32:      |apex - torch| <= 1e-5 * max(|torch|, 1e-2 * max|torch| over the tensor)
 *   f16/bf16: |apex - torch| <= 2 ulp of the dtype at max(|torch|, 1e-2 * max|torch|)
 * (the floor keeps values that cancel to near zero from demanding more than f32 can give). Dropout is
 * not compared: PyTorch's generator is not apex's (its backward is checked in test_nn_gradcheck). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "nn_cases.h"

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

/* Compares apex's values with torch's; returns the worst error in units of the bound. */
static double compare(const char *what, const apex_tensor *a, const apex_tensor *b, apex_dtype dt) {
  size_t n = apex_tensor_numel(b);
  if (apex_tensor_numel(a) != n) fail_msg("%s: %zu elements, torch has %zu", what, apex_tensor_numel(a), n);
  double mx = 0, worst = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(apex_tensor_get(b, i)));
  for (size_t i = 0; i < n; i++) {
    double x = apex_tensor_get(a, i), y = apex_tensor_get(b, i), ref = fmax(fabs(y), 1e-2 * mx);
    double bound = dt == APEX_F32 ? 1e-5 * ref : 2 * ulp(ref, dt);
    double err = fabs(x - y) / (bound > 0 ? bound : 1e-30);
    if (!(err <= 1.0)) fail_msg("%s[%zu]: apex %.9g, torch %.9g (bound %.3g)", what, i, x, y, bound);
    worst = fmax(worst, err);
  }
  return worst;
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
  double worst = compare(name, apex_var_value(y), want, dt);
  apex_tensor_destroy(want);
  size_t ny = apex_tensor_numel(apex_var_value(y));
  apex_tensor *R = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)ny});
  for (size_t i = 0; i < ny; i++) apex_tensor_set(R, i, (float)sin(0.7 * (double)i + 0.3));
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = R}));
  for (int k = 0; k < c->n_in; k++) {
    if (c->nograd >> k & 1) continue;
    snprintf(name, sizeof name, "%s.%s.grad%d", c->name, dn, k);
    want = find(gd, name);
    worst = fmax(worst, compare(name, apex_var_grad(in[k]), want, dt));
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
