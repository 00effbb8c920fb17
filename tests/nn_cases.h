/* nn_cases.h: the op cases shared by test_nn_gradcheck.c (finite differences) and test_nn_golden.c
 * (PyTorch values from gen_ops_golden.py, which lists the same cases with the same shapes and
 * parameters: change both together). Each case is a function of its inputs; data-only inputs (ids,
 * targets, running statistics) are fixed here. */
#ifndef APEX_TESTS_NN_CASES_H
#define APEX_TESTS_NN_CASES_H

#include "apex/nn.h"

#define MAX_IN 6

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
static apex_tensor *bn_mean, *bn_var; /* [2]: {0.2, -0.1} and {0.5, 2.0}, see cases_setup */
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
/* The conv2d case's geometry (test_nn_golden's bound reads it too). */
static const apex_conv2d_options conv_case_opts = {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1};
static apex_var *f_conv(apex_graph *g, apex_var **x) {
  return apex_conv2d(g, x[0], x[1], x[2], &conv_case_opts);
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
static apex_var *f_concat_many(apex_graph *g, apex_var **x) { return apex_concat(g, 6, x, 0); }
static apex_var *f_concat_mid(apex_graph *g, apex_var **x) { return apex_concat(g, 5, x, -2); }
static apex_var *f_layer_norm_2d(apex_graph *g, apex_var **x) { return apex_layer_norm_nd(g, x[0], 2, (int64_t[]){3, 4}, x[1], x[2], 0); }
static apex_var *f_rms_norm_3d(apex_graph *g, apex_var **x) { return apex_rms_norm_nd(g, x[0], 3, (int64_t[]){2, 3, 2}, x[1], 0); }
static apex_var *f_exp(apex_graph *g, apex_var **x) { return apex_exp(g, x[0]); }
static apex_var *f_log(apex_graph *g, apex_var **x) { return apex_log(g, x[0]); }
static apex_var *f_pow2(apex_graph *g, apex_var **x) { return apex_pow(g, x[0], 2.0f); }
static apex_var *f_pow_half(apex_graph *g, apex_var **x) { return apex_pow(g, x[0], 0.5f); }
static apex_var *f_pow3(apex_graph *g, apex_var **x) { return apex_pow(g, x[0], 3.0f); }
static apex_var *f_pow_tensor(apex_graph *g, apex_var **x) { return apex_pow_tensor(g, x[0], x[1]); }
static apex_var *f_norm_all(apex_graph *g, apex_var **x) { return apex_norm_all(g, x[0]); }
static apex_var *f_norm_dim(apex_graph *g, apex_var **x) { return apex_norm(g, x[0], 1, 1); }
static apex_var *f_norm_last(apex_graph *g, apex_var **x) { return apex_norm(g, x[0], -1, 0); }

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
    {"concat_many", f_concat_many, 6, {2, 2, 2, 2, 2, 2}, {{1, 3}, {2, 3}, {1, 3}, {3, 3}, {1, 3}, {2, 3}}, 0, 0},
    {"concat_mid", f_concat_mid, 5, {3, 3, 3, 3, 3}, {{2, 1, 3}, {2, 2, 3}, {2, 1, 3}, {2, 3, 3}, {2, 1, 3}}, 0, 0},
    {"layer_norm_2d", f_layer_norm_2d, 3, {3, 2, 2}, {{2, 3, 4}, {3, 4}, {3, 4}}, 0, 0},
    {"rms_norm_3d", f_rms_norm_3d, 2, {4, 3}, {{2, 2, 3, 2}, {2, 3, 2}}, 0, 0},
    /* issue #5: Apex's FP32 list (log, pow 0.5 and pow_tensor's base on positive inputs; the
     * exponent too, where a^b with b < 0 near a = 0.1 curves too fast for a step of 1e-2) */
    {"exp", f_exp, 1, {2}, {{4, 5}}, 0, 0},
    {"log", f_log, 1, {2}, {{4, 5}}, 1u, 0},
    {"pow2", f_pow2, 1, {2}, {{3, 4}}, 0, 0},
    {"pow_half", f_pow_half, 1, {2}, {{3, 4}}, 1u, 0},
    {"pow3", f_pow3, 1, {2}, {{3, 4}}, 0, 0},
    {"pow_tensor", f_pow_tensor, 2, {2, 1}, {{3, 4}, {4}}, 3u, 0},
    {"norm_all", f_norm_all, 1, {3}, {{2, 3, 4}}, 0, 0},
    {"norm_dim", f_norm_dim, 1, {3}, {{2, 3, 4}}, 0, 0},
    {"norm_last", f_norm_last, 1, {2}, {{3, 5}}, 0, 0},
};

static void cases_setup(void) {
  drop_rng = apex_rng_init(5);
  bn_mean = apex_tensor_create(APEX_F32, 1, (int64_t[]){2});
  bn_var = apex_tensor_create(APEX_F32, 1, (int64_t[]){2});
  apex_tensor_set(bn_mean, 0, 0.2f);
  apex_tensor_set(bn_mean, 1, -0.1f);
  apex_tensor_set(bn_var, 0, 0.5f);
  apex_tensor_set(bn_var, 1, 2.0f);
}

static void cases_teardown(void) {
  apex_tensor_destroy(bn_mean);
  apex_tensor_destroy(bn_var);
}

#define N_CASES (sizeof cases / sizeof cases[0])

#endif
