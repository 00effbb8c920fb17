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

#define MAX_IN 4

typedef apex_var *(*op_fn)(apex_graph *g, apex_var **in);

typedef struct gc_case {
  const char *name;
  op_fn fn;
  int n_in;
  int ndim[MAX_IN];
  int64_t shape[MAX_IN][4];
  unsigned positive; /* bit i: input i drawn in [0.1, 0.9] (probabilities, divisors) */
  unsigned nograd;   /* bit i: input i is data, not checked */
} gc_case;

static apex_rng drop_rng;
static apex_tensor *bn_mean, *bn_var;
static const int64_t ce_targets[6] = {0, 3, 1, 2, 3, 0};
static const int64_t emb_ids[5] = {2, 0, 2, 4, 1};

static apex_var *f_add(apex_graph *g, apex_var **x) { return apex_add(g, x[0], x[1]); }
static apex_var *f_sub(apex_graph *g, apex_var **x) { return apex_sub(g, x[0], x[1]); }
static apex_var *f_mul(apex_graph *g, apex_var **x) { return apex_mul(g, x[0], x[1]); }
static apex_var *f_div(apex_graph *g, apex_var **x) { return apex_div(g, x[0], x[1]); }
static apex_var *f_scale(apex_graph *g, apex_var **x) { return apex_scale(g, x[0], -1.5f); }
static apex_var *f_relu(apex_graph *g, apex_var **x) { return apex_relu(g, x[0]); }
static apex_var *f_gelu(apex_graph *g, apex_var **x) { return apex_gelu(g, x[0]); }
static apex_var *f_gelu_tanh(apex_graph *g, apex_var **x) { return apex_gelu_tanh(g, x[0]); }
static apex_var *f_tanh(apex_graph *g, apex_var **x) { return apex_tanh(g, x[0]); }
static apex_var *f_sigmoid(apex_graph *g, apex_var **x) { return apex_sigmoid(g, x[0]); }
static apex_var *f_dropout(apex_graph *g, apex_var **x) {
  apex_rng r = drop_rng;
  return apex_dropout(g, x[0], 0.3f, 1, &r);
}
static apex_var *f_matmul(apex_graph *g, apex_var **x) { return apex_matmul(g, x[0], x[1]); }
static apex_var *f_linear(apex_graph *g, apex_var **x) { return apex_linear(g, x[0], x[1], x[2]); }
static apex_var *f_conv(apex_graph *g, apex_var **x) {
  return apex_conv2d(g, x[0], x[1], x[2], &(apex_conv2d_options){.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1});
}
static apex_var *f_maxpool(apex_graph *g, apex_var **x) {
  return apex_max_pool2d(g, x[0], &(apex_pool2d_options){.kernel_h = 3, .kernel_w = 2, .stride_h = 2, .stride_w = 2, .pad_h = 1});
}
static apex_var *f_avgpool(apex_graph *g, apex_var **x) {
  return apex_avg_pool2d(g, x[0], &(apex_pool2d_options){.kernel_h = 2, .kernel_w = 3, .stride_h = 1, .stride_w = 2, .pad_w = 1});
}
static apex_var *f_bn_train(apex_graph *g, apex_var **x) {
  return apex_batch_norm(g, x[0], x[1], x[2], NULL, NULL, &(apex_batch_norm_options){.training = 1});
}
static apex_var *f_bn_eval(apex_graph *g, apex_var **x) { return apex_batch_norm(g, x[0], x[1], x[2], bn_mean, bn_var, NULL); }
static apex_var *f_layer_norm(apex_graph *g, apex_var **x) { return apex_layer_norm(g, x[0], x[1], x[2], 0); }
static apex_var *f_rms_norm(apex_graph *g, apex_var **x) { return apex_rms_norm(g, x[0], x[1], 0); }
static apex_var *f_embedding(apex_graph *g, apex_var **x) { return apex_embedding(g, x[0], emb_ids, 1, (int64_t[]){5}); }
static apex_var *f_softmax(apex_graph *g, apex_var **x) { return apex_softmax(g, x[0], 1); }
static apex_var *f_log_softmax(apex_graph *g, apex_var **x) { return apex_log_softmax(g, x[0], -1); }
static apex_var *f_ce(apex_graph *g, apex_var **x) {
  return apex_cross_entropy(g, x[0], ce_targets,
                            &(apex_cross_entropy_options){.use_ignore_index = 1, .ignore_index = 2, .label_smoothing = 0.1f});
}
static apex_var *f_ce_none(apex_graph *g, apex_var **x) {
  return apex_cross_entropy(g, x[0], ce_targets, &(apex_cross_entropy_options){.reduction = APEX_REDUCTION_NONE});
}
static apex_var *f_mse(apex_graph *g, apex_var **x) { return apex_mse_loss(g, x[0], x[1], APEX_REDUCTION_MEAN); }
static apex_var *f_bce_logits(apex_graph *g, apex_var **x) { return apex_bce_with_logits(g, x[0], x[1], APEX_REDUCTION_SUM); }
static apex_var *f_bce(apex_graph *g, apex_var **x) { return apex_bce(g, x[0], x[1], APEX_REDUCTION_NONE); }
static apex_var *f_sum_all(apex_graph *g, apex_var **x) { return apex_sum_all(g, x[0]); }
static apex_var *f_mean_dim(apex_graph *g, apex_var **x) { return apex_mean(g, x[0], 1, 1); }
static apex_var *f_sum_dim(apex_graph *g, apex_var **x) { return apex_sum(g, x[0], -1, 0); }
static apex_var *f_reshape(apex_graph *g, apex_var **x) { return apex_mul(g, apex_reshape(g, x[0], 2, (int64_t[]){-1, 4}), x[1]); }
static apex_var *f_permute(apex_graph *g, apex_var **x) { return apex_permute(g, x[0], (int[]){2, 0, 1}); }
static apex_var *f_transpose(apex_graph *g, apex_var **x) { return apex_transpose(g, x[0], 0, 1); }
static apex_var *f_concat(apex_graph *g, apex_var **x) { return apex_concat(g, 3, x, 1); }
static apex_var *f_attention(apex_graph *g, apex_var **x) { return apex_causal_attention(g, x[0], x[1], x[2]); }

static const gc_case cases[] = {
    {"add", f_add, 2, {3, 2}, {{2, 3, 4}, {3, 1}}, 0, 0},
    {"sub", f_sub, 2, {2, 1}, {{3, 4}, {4}}, 0, 0},
    {"mul", f_mul, 2, {3, 3}, {{2, 1, 4}, {1, 3, 4}}, 0, 0},
    {"div", f_div, 2, {2, 2}, {{3, 4}, {3, 4}}, 2u, 0},
    {"scale", f_scale, 1, {2}, {{3, 5}}, 0, 0},
    {"relu", f_relu, 1, {2}, {{4, 5}}, 0, 0},
    {"gelu", f_gelu, 1, {2}, {{4, 5}}, 0, 0},
    {"gelu_tanh", f_gelu_tanh, 1, {2}, {{4, 5}}, 0, 0},
    {"tanh", f_tanh, 1, {2}, {{4, 5}}, 0, 0},
    {"sigmoid", f_sigmoid, 1, {2}, {{4, 5}}, 0, 0},
    {"dropout", f_dropout, 1, {2}, {{6, 7}}, 0, 0},
    {"matmul", f_matmul, 2, {3, 2}, {{2, 3, 4}, {4, 5}}, 0, 0},
    {"matmul_batched", f_matmul, 2, {3, 3}, {{2, 3, 4}, {2, 4, 2}}, 0, 0},
    {"linear", f_linear, 3, {2, 2, 1}, {{3, 4}, {5, 4}, {5}}, 0, 0},
    {"conv2d", f_conv, 3, {4, 4, 1}, {{2, 2, 5, 4}, {3, 2, 3, 2}, {3}}, 0, 0},
    {"max_pool2d", f_maxpool, 1, {4}, {{2, 2, 5, 4}}, 0, 0},
    {"avg_pool2d", f_avgpool, 1, {4}, {{2, 2, 4, 5}}, 0, 0},
    {"batch_norm_train", f_bn_train, 3, {4, 1, 1}, {{3, 2, 2, 3}, {2}, {2}}, 0, 0},
    {"batch_norm_eval", f_bn_eval, 3, {3, 1, 1}, {{3, 2, 4}, {2}, {2}}, 0, 0},
    {"layer_norm", f_layer_norm, 3, {3, 1, 1}, {{2, 3, 5}, {5}, {5}}, 0, 0},
    {"rms_norm", f_rms_norm, 2, {2, 1}, {{4, 6}, {6}}, 0, 0},
    {"embedding", f_embedding, 1, {2}, {{5, 3}}, 0, 0},
    {"softmax", f_softmax, 1, {3}, {{2, 4, 3}}, 0, 0},
    {"log_softmax", f_log_softmax, 1, {2}, {{3, 5}}, 0, 0},
    {"cross_entropy", f_ce, 1, {2}, {{6, 4}}, 0, 0},
    {"cross_entropy_none", f_ce_none, 1, {2}, {{6, 4}}, 0, 0},
    {"mse_loss", f_mse, 2, {2, 2}, {{3, 4}, {3, 4}}, 0, 0},
    {"bce_with_logits", f_bce_logits, 2, {2, 2}, {{3, 4}, {3, 4}}, 2u, 0},
    {"bce", f_bce, 2, {2, 2}, {{3, 4}, {3, 4}}, 3u, 0},
    {"sum_all", f_sum_all, 1, {3}, {{2, 3, 4}}, 0, 0},
    {"mean_dim", f_mean_dim, 1, {3}, {{2, 3, 4}}, 0, 0},
    {"sum_dim", f_sum_dim, 1, {3}, {{2, 3, 4}}, 0, 0},
    {"reshape", f_reshape, 2, {3, 2}, {{2, 3, 4}, {6, 4}}, 0, 0},
    {"permute", f_permute, 1, {3}, {{2, 3, 4}}, 0, 0},
    {"transpose", f_transpose, 1, {2}, {{3, 5}}, 0, 0},
    {"concat", f_concat, 3, {2, 2, 2}, {{2, 3}, {2, 1}, {2, 2}}, 0, 0},
    {"causal_attention", f_attention, 3, {4, 4, 4}, {{1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}}, 0, 0},
};

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
  drop_rng = apex_rng_init(5);
  bn_mean = apex_tensor_create(APEX_F32, 1, (int64_t[]){2});
  bn_var = apex_tensor_create(APEX_F32, 1, (int64_t[]){2});
  apex_tensor_set(bn_mean, 0, 0.2f);
  apex_tensor_set(bn_mean, 1, -0.1f);
  apex_tensor_set(bn_var, 0, 0.5f);
  apex_tensor_set(bn_var, 1, 2.0f);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
  apex_tensor_destroy(bn_mean);
  apex_tensor_destroy(bn_var);
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
