/* test_nn_math.c: what issue #5 added to the ops beyond the shared cases of nn_cases.h (whose
 * forward and backward test_nn_golden checks against PyTorch and test_nn_gradcheck against finite
 * differences): the comparison masks gt/lt/eq against their closed form, with broadcasting and
 * mixed dtypes, and that they are not differentiable; the edge values where exp/log/pow/norm follow
 * PyTorch's conventions rather than the calculus (log of 0 and of negatives, 0^0, the norm of zeros);
 * and every bad input of the new ops. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "apex/nn.h"

/* A leaf of the given dtype and shape holding vals (rounded to the dtype; the values used here are
 * exact in all three). */
static apex_var *leaf_of(apex_dtype dt, int ndim, const int64_t *shape, const float *vals, int requires_grad) {
  apex_tensor *t = apex_tensor_create(dt, ndim, shape);
  for (size_t i = 0; i < apex_tensor_numel(t); i++) apex_tensor_set(t, i, vals[i]);
  return apex_var_create(t, requires_grad);
}

/* ---- comparisons ---------------------------------------------------------------------------------- */

typedef apex_var *(*cmp_fn)(apex_graph *, apex_var *, apex_var *);

static int cmp_want(int which, float x, float y) { return which == 0 ? x > y : which == 1 ? x < y : x == y; }

/* a [2, 3, 4] against b [3, 1] (and b against a) for each comparison and each dtype pair: every
 * element of the mask is 1 exactly where the comparison of the broadcast pair holds, 0 elsewhere;
 * the mask's dtype is the promoted one. Values come from a small set so that ties (for eq) are
 * common, with a NaN in each input (which compares false, == included). */
static void test_comparisons_closed_form(void **state) {
  (void)state;
  static const float pool[6] = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f};
  float av[24], bv[3];
  for (int i = 0; i < 24; i++) av[i] = pool[(i * 7 + 3) % 6];
  bv[0] = 0.5f; /* ties with a at elements 0 and 12 */
  bv[1] = 1.0f; /* and 7 and 19 */
  bv[2] = NAN;
  av[5] = NAN;
  const int64_t as[3] = {2, 3, 4}, bs[2] = {3, 1};
  apex_dtype pairs[5][2] = {{APEX_F32, APEX_F32}, {APEX_F16, APEX_F16}, {APEX_BF16, APEX_BF16}, {APEX_F16, APEX_F32}, {APEX_BF16, APEX_F16}};
  cmp_fn fns[3] = {apex_gt, apex_lt, apex_eq};
  const char *names[3] = {"gt", "lt", "eq"};
  for (int p = 0; p < 5; p++) {
    apex_dtype da = pairs[p][0], db = pairs[p][1], want_dt = da == db ? da : APEX_F32;
    apex_graph *g = apex_graph_create();
    apex_var *a = leaf_of(da, 3, as, av, 0), *b = leaf_of(db, 2, bs, bv, 0);
    for (int f = 0; f < 3; f++)
      for (int swap = 0; swap < 2; swap++) {
        apex_var *m = swap ? fns[f](g, b, a) : fns[f](g, a, b);
        if (!m) fail_msg("%s: %s", names[f], apex_last_error());
        const apex_tensor *M = apex_var_value(m);
        assert_int_equal(apex_tensor_dtype(M), want_dt);
        assert_int_equal(apex_tensor_ndim(M), 3);
        for (int d = 0; d < 3; d++) assert_int_equal(apex_tensor_dim(M, d), as[d]);
        int ones = 0;
        for (int i = 0; i < 24; i++) {
          float x = av[i], y = bv[(i / 4) % 3]; /* b [3, 1] broadcast over [2, 3, 4] */
          int want = swap ? cmp_want(f, y, x) : cmp_want(f, x, y);
          float got = apex_tensor_get(M, (size_t)i);
          if (got != (float)want)
            fail_msg("%s(%s, %s) %s: element %d (%g vs %g) is %g, want %d", names[f], apex_dtype_name(da), apex_dtype_name(db),
                     swap ? "b, a" : "a, b", i, x, y, got, want);
          ones += want;
        }
        assert_true(ones > 0 && ones < 24); /* the case tells 0 from 1 both ways */
      }
    apex_var_destroy(a);
    apex_var_destroy(b);
    apex_graph_destroy(g);
  }
}

/* A mask is not differentiable, as PyTorch's bool results are not: it does not require gradients
 * even when its inputs do, a backward from it (or from a sum of it) is refused, and through
 * mask * a the gradient reaches a as the mask, while b (which only made the mask) gets nothing. */
static void test_comparisons_not_differentiable(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *a = tu_random_leaf(APEX_F32, 2, (int64_t[]){3, 4}, 1, 1), *b = tu_random_leaf(APEX_F32, 1, (int64_t[]){4}, 2, 1);
  apex_var *m = apex_gt(g, a, b);
  assert_non_null(m);
  assert_int_equal(apex_var_op(m), APEX_OP_GT);
  assert_false(apex_var_requires_grad(m));
  TU_FAILS(apex_backward(m, &(apex_backward_options){.grad_output = apex_var_value(m)}), APEX_ERR_STATE,
           "the output of 'gt' [3, 4] does not require gradients");
  TU_FAILS(apex_backward(apex_sum_all(g, m), NULL), APEX_ERR_STATE, "does not require gradients");
  TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, m, a)), NULL));
  for (size_t i = 0; i < 12; i++) {
    assert_true(apex_tensor_get(apex_var_grad(a), i) == apex_tensor_get(apex_var_value(m), i));
    if (i < 4) assert_true(apex_tensor_get(apex_var_grad(b), i) == 0.0f);
  }
  apex_var_destroy(a);
  apex_var_destroy(b);
  apex_graph_destroy(g);
}

/* ---- PyTorch's conventions at the edges ----------------------------------------------------------- */

static void expect(const char *what, const apex_tensor *t, const float *want, size_t n) {
  assert_int_equal(apex_tensor_numel(t), n);
  for (size_t i = 0; i < n; i++) {
    float got = apex_tensor_get(t, i);
    int same = isnan(want[i]) ? isnan(got) : got == want[i];
    if (!same) fail_msg("%s[%zu]: %g, want %g", what, i, got, want[i]);
  }
}

/* Closed forms where PyTorch picks a value the formula leaves open: log gives NaN for x < 0 and
 * -Inf for 0 (no error); x^0 is 1 with gradient 0 even at x = 0; 0^0 = 1 and 0^2 = 0 with the
 * masked gradients of pow_backward_self / pow_backward_exponent; the norm of zeros is 0 with
 * gradient 0; and exp/log/pow/norm of an f16 input give f16 outside autocast (FLOAT only matters
 * under autocast). */
static void test_edges_follow_torch(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *x = leaf_of(APEX_F32, 1, (int64_t[]){3}, (float[]){-1.0f, 0.0f, 1.0f}, 1);
  apex_var *lg = apex_log(g, x);
  expect("log", apex_var_value(lg), (float[]){NAN, -INFINITY, 0.0f}, 3);
  apex_var *p0 = apex_pow(g, x, 0.0f);
  expect("x^0", apex_var_value(p0), (float[]){1.0f, 1.0f, 1.0f}, 3);
  TU_OK(apex_backward(apex_sum_all(g, p0), NULL));
  expect("d x^0 / dx", apex_var_grad(x), (float[]){0.0f, 0.0f, 0.0f}, 3);
  apex_graph_reset(g);

  apex_var *a = leaf_of(APEX_F32, 1, (int64_t[]){3}, (float[]){0.0f, 0.0f, 2.0f}, 1);
  apex_var *e = leaf_of(APEX_F32, 1, (int64_t[]){3}, (float[]){0.0f, 2.0f, 0.0f}, 1);
  apex_var *pw = apex_pow_tensor(g, a, e);
  expect("a^b", apex_var_value(pw), (float[]){1.0f, 0.0f, 1.0f}, 3);
  TU_OK(apex_backward(apex_sum_all(g, pw), NULL));
  expect("d a^b / da", apex_var_grad(a), (float[]){0.0f, 0.0f, 0.0f}, 3);
  expect("d a^b / db", apex_var_grad(e), (float[]){0.0f, 0.0f, logf(2.0f)}, 3);
  apex_graph_reset(g);

  apex_var *z = leaf_of(APEX_F32, 2, (int64_t[]){2, 2}, (float[]){0.0f, 0.0f, 3.0f, 4.0f}, 1);
  apex_var *nr = apex_norm(g, z, 1, 0);
  expect("norm", apex_var_value(nr), (float[]){0.0f, 5.0f}, 2);
  TU_OK(apex_backward(apex_sum_all(g, nr), NULL));
  expect("d norm / dx", apex_var_grad(z), (float[]){0.0f, 0.0f, 0.6f, 0.8f}, 4);
  apex_graph_reset(g);

  apex_var *h = leaf_of(APEX_F16, 1, (int64_t[]){2}, (float[]){0.5f, 2.0f}, 0);
  apex_var *outs[4] = {apex_exp(g, h), apex_log(g, h), apex_pow(g, h, 3.0f), apex_norm_all(g, h)};
  for (int k = 0; k < 4; k++) {
    assert_non_null(outs[k]);
    assert_int_equal(apex_tensor_dtype(apex_var_value(outs[k])), APEX_F16);
  }
  expect("pow f16", apex_var_value(outs[2]), (float[]){0.125f, 8.0f}, 2);
  assert_int_equal(apex_tensor_ndim(apex_var_value(outs[3])), 0);
  apex_var_destroy(x);
  apex_var_destroy(a);
  apex_var_destroy(e);
  apex_var_destroy(z);
  apex_var_destroy(h);
  apex_graph_destroy(g);
}

/* ---- bad inputs ----------------------------------------------------------------------------------- */

#define FAILS_NULL(call, status, needle)                                                                      \
  do {                                                                                                        \
    if ((call) != NULL) fail_msg("%s succeeded", #call);                                                      \
    if (apex_last_status() != (status)) fail_msg("%s: status %s, want %s", #call, apex_status_name(apex_last_status()), apex_status_name(status)); \
    tu_assert_message(needle);                                                                                \
  } while (0)

static void test_bad_inputs(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 3, (int64_t[]){2, 3, 4}, 3, 1), *y = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 3}, 4, 0);
  FAILS_NULL(apex_exp(g, NULL), APEX_ERR_INVALID_ARG, "exp: input 0 is NULL");
  FAILS_NULL(apex_log(NULL, x), APEX_ERR_INVALID_ARG, "log: NULL graph");
  FAILS_NULL(apex_pow(g, NULL, 2.0f), APEX_ERR_INVALID_ARG, "pow: input 0 is NULL");
  FAILS_NULL(apex_pow_tensor(g, x, NULL), APEX_ERR_INVALID_ARG, "pow_tensor: input 1 is NULL");
  FAILS_NULL(apex_pow_tensor(g, x, y), APEX_ERR_SHAPE, "pow_tensor: shapes [2, 3, 4] and [2, 3] do not broadcast");
  FAILS_NULL(apex_norm_all(g, NULL), APEX_ERR_INVALID_ARG, "norm: input 0 is NULL");
  FAILS_NULL(apex_norm(g, x, 3, 0), APEX_ERR_SHAPE, "norm: dim 3 is out of range for [2, 3, 4]");
  FAILS_NULL(apex_norm(g, x, -4, 1), APEX_ERR_SHAPE, "norm: dim -4 is out of range for [2, 3, 4]");
  FAILS_NULL(apex_gt(g, NULL, x), APEX_ERR_INVALID_ARG, "gt: input 0 is NULL");
  FAILS_NULL(apex_lt(NULL, x, x), APEX_ERR_INVALID_ARG, "lt: NULL graph");
  FAILS_NULL(apex_eq(g, x, y), APEX_ERR_SHAPE, "eq: shapes [2, 3, 4] and [2, 3] do not broadcast");
  FAILS_NULL(apex_gt(g, y, x), APEX_ERR_SHAPE, "gt: shapes [2, 3] and [2, 3, 4] do not broadcast");
  /* a var from before a reset */
  apex_var *old = apex_exp(g, x);
  assert_non_null(old);
  apex_graph_reset(g);
  FAILS_NULL(apex_lt(g, old, x), APEX_ERR_STATE, "lt: input 0 belongs to another graph or to a step before apex_graph_reset");
  apex_var_destroy(x);
  apex_var_destroy(y);
  apex_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_comparisons_closed_form), cmocka_unit_test(test_comparisons_not_differentiable),
      cmocka_unit_test(test_edges_follow_torch),      cmocka_unit_test(test_bad_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
