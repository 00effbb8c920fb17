/* test_nn_gradcheck.c: every op's backward against central finite differences.
 *
 * For an op y = f(x1, x2, ...) the test takes the scalar L = sum(y * R) for a fixed random R, runs
 * apex_backward, and compares each input's gradient with (L(x + h e_i) - L(x - h e_i)) / 2h, where
 * L is summed in double from the op's f32 outputs and h = 1e-2 (the ops compute in f32, so a smaller
 * step would measure f32 rounding instead of the derivative). Inputs start away from the kinks of
 * relu and max pooling, so the quotients see one smooth piece. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "apex/nn.h"

#include "nn_cases.h"

/* sum(y * R) in double, R[i] = a fixed pattern in [-1, 1]. */
static double weighted(const apex_var *y) {
  const apex_tensor *t = apex_var_value(y);
  double s = 0;
  for (size_t i = 0; i < apex_tensor_numel(t); i++) s += (double)apex_tensor_get(t, i) * sin(0.7 * (double)i + 0.3);
  return s;
}

static void check_case(const gc_case *c) {
  apex_graph *g = apex_graph_create();
  apex_var *in[MAX_IN];
  for (int k = 0; k < c->n_in; k++) {
    apex_tensor *t = apex_tensor_create(APEX_F32, c->ndim[k], c->shape[k]);
    size_t n = apex_tensor_numel(t);
    float *d = apex_tensor_data(t);
    apex_rng r = apex_rng_init(100 + (uint64_t)k);
    apex_rng_uniform(&r, d, n);
    for (size_t i = 0; i < n; i++) {
      if (c->positive >> k & 1) d[i] = 0.1f + 0.8f * d[i];
      else d[i] = (d[i] < 0.5f ? -1.0f : 1.0f) * (0.15f + 1.7f * fabsf(d[i] - 0.5f)); /* |x| >= 0.15: off relu's kink */
    }
    if (!strcmp(c->name, "max_pool2d")) /* distinct values: no ties inside a window */
      for (size_t i = 0; i < n; i++) d[i] = (float)((i * 37) % n) * 0.1f - 1.0f;
    in[k] = apex_var_create(t, !(c->nograd >> k & 1));
  }
  apex_var *y = c->fn(g, in);
  if (!y) fail_msg("%s: forward failed: %s", c->name, apex_last_error());
  size_t ny = apex_tensor_numel(apex_var_value(y));
  apex_tensor *R = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)ny});
  for (size_t i = 0; i < ny; i++) apex_tensor_set(R, i, (float)sin(0.7 * (double)i + 0.3));
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = R}));
  apex_graph_reset(g);
  apex_graph_set_grad_enabled(g, 0);
  const double h = 1e-2;
  double worst = 0;
  for (int k = 0; k < c->n_in; k++) {
    if (c->nograd >> k & 1) continue;
    apex_tensor *v = apex_var_value(in[k]), *gr = apex_var_grad(in[k]);
    for (size_t i = 0; i < apex_tensor_numel(v); i++) {
      float x0 = apex_tensor_get(v, i);
      apex_tensor_set(v, i, x0 + (float)h);
      double lp = weighted(c->fn(g, in));
      apex_graph_reset(g);
      apex_tensor_set(v, i, x0 - (float)h);
      double lm = weighted(c->fn(g, in));
      apex_graph_reset(g);
      apex_tensor_set(v, i, x0);
      double num = (lp - lm) / (2 * h), ana = apex_tensor_get(gr, i);
      double err = fabs(num - ana) / (2e-3 + 1e-2 * fabs(num));
      if (err > worst) worst = err;
      if (err > 1.0) fail_msg("%s: input %d element %zu: backward %.6g, finite difference %.6g", c->name, k, i, ana, num);
    }
  }
  printf("# %-20s ok (worst error / tolerance %.3f)\n", c->name, worst);
  apex_tensor_destroy(R);
  for (int k = 0; k < c->n_in; k++) apex_var_destroy(in[k]);
  apex_graph_destroy(g);
}

static void test_all_ops(void **state) {
  (void)state;
  cases_setup();
  for (size_t i = 0; i < N_CASES; i++) check_case(&cases[i]);
  cases_teardown();
}

/* A transformer block end to end (attention, layer norm, GELU, residuals, reshapes) through the
 * module API, against finite differences on a few of its parameters. */
static void test_transformer_block(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 3});
  apex_module *blk = apex_transformer_block_create(m, "h0", 8, 2);
  assert_non_null(blk);
  assert_non_null(apex_model_find_param(m, "h0.attn.q.weight"));
  assert_non_null(apex_model_find_param(m, "h0.ln2.bias"));
  apex_graph *g = apex_graph_create();
  apex_tensor *xt = tu_random_tensor(APEX_F32, 2 * 3 * 8, 9, 1.0f);
  apex_tensor *x3 = apex_tensor_view(xt, 3, (int64_t[]){2, 3, 8});
  apex_var *y = apex_module_forward(blk, g, apex_graph_input(g, x3, 0));
  assert_non_null(y);
  apex_var *loss = apex_mean_all(g, apex_mul(g, y, y));
  TU_OK(apex_backward(loss, NULL));
  apex_graph_reset(g);
  apex_graph_set_grad_enabled(g, 0);
  const char *names[] = {"h0.attn.q.weight", "h0.attn.k.bias", "h0.ln1.weight", "h0.fc.weight", "h0.proj.bias"};
  for (int p = 0; p < 5; p++) {
    apex_var *w = apex_model_find_param(m, names[p]);
    apex_tensor *v = apex_var_value(w);
    for (size_t i = 0; i < apex_tensor_numel(v); i += 7) {
      float x0 = apex_tensor_get(v, i);
      double l[2];
      for (int s = 0; s < 2; s++) {
        apex_tensor_set(v, i, x0 + (s ? -1e-2f : 1e-2f));
        apex_var *yy = apex_module_forward(blk, g, apex_graph_input(g, x3, 0));
        l[s] = 0;
        for (size_t j = 0; j < 48; j++) {
          double e = apex_tensor_get(apex_var_value(yy), j);
          l[s] += e * e / 48.0;
        }
        apex_graph_reset(g);
      }
      apex_tensor_set(v, i, x0);
      double num = (l[0] - l[1]) / 2e-2, ana = apex_tensor_get(apex_var_grad(w), i);
      if (fabs(num - ana) > 2e-3 + 2e-2 * fabs(num)) fail_msg("%s[%zu]: backward %.6g, finite difference %.6g", names[p], i, ana, num);
    }
  }
  apex_tensor_destroy(x3);
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_ops), cmocka_unit_test(test_transformer_block)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
