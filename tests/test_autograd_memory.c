/* test_autograd_memory.c: values go back to the graph's pool as early as is safe. What an op's
 * backward reads stays; what no backward reads and no caller holds (apex_var_release) goes, and
 * later ops of the step reuse it. Releasing never changes a gradient by one bit: every op runs once
 * holding everything and once releasing its inputs and output at once, with new values written
 * over the freed memory before backward. Under the sanitizer build released memory is poisoned
 * until reset, so an op whose backward read a value the op table says it does not would be
 * reported there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "apex/nn.h"

/* ---- every op, with and without releases ---------------------------------------------------------- */

/* Intermediates an op case makes besides its result (released with the inputs). */
static apex_var *extra[4];
static int n_extra;
static apex_var *keep(apex_var *v) {
  extra[n_extra++] = v;
  return v;
}

typedef apex_var *(*op_case_fn)(apex_graph *g, apex_var *a, apex_var *b);

static apex_var *c_add(apex_graph *g, apex_var *a, apex_var *b) { return apex_add(g, a, b); }
static apex_var *c_sub(apex_graph *g, apex_var *a, apex_var *b) { return apex_sub(g, a, b); }
static apex_var *c_mul(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, a, b); }
static apex_var *c_div(apex_graph *g, apex_var *a, apex_var *b) { return apex_div(g, a, keep(apex_add(g, b, keep(apex_scale(g, b, 3.0f))))); }
static apex_var *c_scale(apex_graph *g, apex_var *a, apex_var *b) { return apex_add(g, apex_scale(g, a, 0.5f), b); }
static apex_var *c_relu(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_relu(g, a)), b); }
static apex_var *c_gelu(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_gelu(g, a)), b); }
static apex_var *c_gelu_tanh(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_gelu_tanh(g, a)), b); }
static apex_var *c_tanh(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_tanh(g, a)), b); }
static apex_var *c_sigmoid(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_sigmoid(g, a)), b); }
static apex_var *c_dropout(apex_graph *g, apex_var *a, apex_var *b) {
  apex_rng rng = apex_rng_init(5);
  return apex_mul(g, keep(apex_dropout(g, a, 0.3f, 1, &rng)), b);
}
static apex_var *c_matmul(apex_graph *g, apex_var *a, apex_var *b) { return apex_matmul(g, a, keep(apex_transpose(g, b, 0, 1))); }
static apex_var *c_linear(apex_graph *g, apex_var *a, apex_var *b) { return apex_linear(g, a, b, keep(apex_sum(g, b, 1, 0))); }
static apex_var *c_conv(apex_graph *g, apex_var *a, apex_var *b) {
  apex_var *w = keep(apex_reshape(g, b, 4, (int64_t[]){2, 2, 2, 2}));
  return apex_conv2d(g, keep(apex_reshape(g, a, 4, (int64_t[]){2, 2, 2, 4})), w, keep(apex_sum(g, b, 1, 0)), NULL);
}
static apex_var *c_pool(apex_graph *g, apex_var *a, apex_var *b, apex_op op) {
  apex_pool2d_options o = {.kernel_h = 2, .kernel_w = 2};
  apex_var *x = keep(apex_reshape(g, apex_add(g, a, b), 4, (int64_t[]){1, 2, 4, 4}));
  return op == APEX_OP_MAX_POOL2D ? apex_max_pool2d(g, x, &o) : apex_avg_pool2d(g, x, &o);
}
static apex_var *c_max_pool(apex_graph *g, apex_var *a, apex_var *b) { return c_pool(g, a, b, APEX_OP_MAX_POOL2D); }
static apex_var *c_avg_pool(apex_graph *g, apex_var *a, apex_var *b) { return c_pool(g, a, b, APEX_OP_AVG_POOL2D); }
static apex_var *c_batch_norm(apex_graph *g, apex_var *a, apex_var *b) {
  apex_var *w = keep(apex_sum(g, b, 0, 0));
  return apex_batch_norm(g, a, w, w, NULL, NULL, &(apex_batch_norm_options){.training = 1});
}
static apex_var *c_layer_norm(apex_graph *g, apex_var *a, apex_var *b) {
  apex_var *w = keep(apex_sum(g, b, 0, 0));
  return apex_layer_norm(g, a, w, w, 1e-5f);
}
static apex_var *c_rms_norm(apex_graph *g, apex_var *a, apex_var *b) { return apex_rms_norm(g, a, keep(apex_sum(g, b, 0, 0)), 1e-5f); }
static apex_var *c_embedding(apex_graph *g, apex_var *a, apex_var *b) {
  return apex_mul(g, keep(apex_embedding(g, a, (int64_t[]){3, 0, 3, 1}, 1, (int64_t[]){4})), b);
}
static apex_var *c_softmax(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_softmax(g, a, 1)), b); }
static apex_var *c_log_softmax(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_log_softmax(g, a, 0)), b); }
static apex_var *c_cross_entropy(apex_graph *g, apex_var *a, apex_var *b) {
  return apex_cross_entropy(g, keep(apex_add(g, a, b)), (int64_t[]){0, 7, 2, 5}, NULL);
}
static apex_var *c_mse(apex_graph *g, apex_var *a, apex_var *b) { return apex_mse_loss(g, a, b, APEX_REDUCTION_SUM); }
static apex_var *c_bce_logits(apex_graph *g, apex_var *a, apex_var *b) { return apex_bce_with_logits(g, a, keep(apex_sigmoid(g, b)), APEX_REDUCTION_MEAN); }
static apex_var *c_sum(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_sum(g, a, 1, 1)), b); }
static apex_var *c_mean(apex_graph *g, apex_var *a, apex_var *b) { return apex_add(g, keep(apex_mean_all(g, a)), b); }
static apex_var *c_reshape(apex_graph *g, apex_var *a, apex_var *b) {
  return apex_add(g, keep(apex_reshape(g, a, 2, (int64_t[]){8, 4})), keep(apex_reshape(g, b, 2, (int64_t[]){8, 4})));
}
static apex_var *c_transpose(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_transpose(g, a, 0, 1)), keep(apex_transpose(g, b, 1, 0))); }
static apex_var *c_concat(apex_graph *g, apex_var *a, apex_var *b) { return apex_concat(g, 2, (apex_var *[]){a, b}, 1); }
static apex_var *c_attention(apex_graph *g, apex_var *a, apex_var *b) {
  int64_t s[4] = {1, 2, 4, 4};
  apex_var *q = keep(apex_reshape(g, a, 4, s)), *k = keep(apex_reshape(g, b, 4, s));
  return apex_causal_attention(g, q, k, keep(apex_scale(g, q, -1.0f)));
}
static apex_var *c_cast(apex_graph *g, apex_var *a, apex_var *b) { return apex_mul(g, keep(apex_cast(g, a, APEX_BF16)), keep(apex_cast(g, b, APEX_BF16))); }

static const struct op_case {
  const char *name;
  op_case_fn fn;
  int64_t b_rows; /* b is [b_rows, 8] (a is always [4, 8]) */
} cases[] = {
    {"add", c_add, 4},         {"sub", c_sub, 4},           {"mul", c_mul, 4},
    {"div", c_div, 4},         {"scale", c_scale, 4},       {"relu", c_relu, 4},
    {"gelu", c_gelu, 4},       {"gelu_tanh", c_gelu_tanh, 4}, {"tanh", c_tanh, 4},
    {"sigmoid", c_sigmoid, 4}, {"dropout", c_dropout, 4},   {"matmul", c_matmul, 3},
    {"linear", c_linear, 3},   {"conv2d", c_conv, 2},       {"max_pool2d", c_max_pool, 4},
    {"avg_pool2d", c_avg_pool, 4}, {"batch_norm", c_batch_norm, 4}, {"layer_norm", c_layer_norm, 4},
    {"rms_norm", c_rms_norm, 4}, {"embedding", c_embedding, 4}, {"softmax", c_softmax, 4},
    {"log_softmax", c_log_softmax, 4}, {"cross_entropy", c_cross_entropy, 4}, {"mse", c_mse, 4},
    {"bce_with_logits", c_bce_logits, 4}, {"sum", c_sum, 4}, {"mean", c_mean, 4},
    {"reshape", c_reshape, 4}, {"transpose", c_transpose, 4}, {"concat", c_concat, 4},
    {"attention", c_attention, 4}, {"cast", c_cast, 4},
};

/* One forward and backward of a case at dtype; with `release`, the case's inputs, intermediates and
 * result are released as soon as the loss is built and new values are written over what was freed.
 * Returns the loss value; A's and B's gradients are left in their grad tensors. */
static float run_case(apex_graph *g, const struct op_case *c, apex_var *A, apex_var *B, apex_dtype dt, int release) {
  n_extra = 0;
  apex_var *a = apex_cast(g, A, dt), *b = apex_cast(g, B, dt);
  apex_var *y = c->fn(g, a, b);
  if (!y) fail_msg("%s at %s: %s", c->name, apex_dtype_name(dt), apex_last_error());
  apex_var *loss = apex_sum_all(g, apex_mul(g, y, y));
  if (release) {
    apex_var *done[3] = {a, b, y};
    for (int i = 0; i < 3; i++) apex_var_release(done[i]);
    for (int i = 0; i < n_extra; i++) apex_var_release(extra[i]);
    for (int i = 0; i < 4; i++) assert_non_null(apex_scale(g, apex_cast(g, i & 1 ? B : A, dt), -3.0f));
  }
  TU_OK(apex_var_zero_grad(A));
  TU_OK(apex_var_zero_grad(B));
  TU_OK(apex_backward(loss, NULL));
  float v = apex_var_item(loss);
  apex_graph_reset(g);
  return v;
}

static void assert_same_bits(const apex_tensor *x, const apex_tensor *y, const char *what, const char *op) {
  for (size_t i = 0; i < apex_tensor_numel(x); i++)
    if (tu_bits(apex_tensor_get(x, i)) != tu_bits(apex_tensor_get(y, i)))
      fail_msg("%s: %s differs at %zu after releases: %a vs %a", op, what, i, (double)apex_tensor_get(y, i), (double)apex_tensor_get(x, i));
}

static void test_releases_never_change_gradients(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  const apex_dtype dts[2] = {APEX_F32, APEX_F16};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int d = 0; d < 2; d++) {
      const struct op_case *c = &cases[k];
      apex_var *A = tu_random_leaf(APEX_F32, 2, (int64_t[]){4, 8}, 11 + k, 1);
      apex_var *B = tu_random_leaf(APEX_F32, 2, (int64_t[]){c->b_rows, 8}, 40 + k, 1);
      float l0 = run_case(g, c, A, B, dts[d], 0);
      apex_tensor *ga = apex_tensor_clone(apex_var_grad(A)), *gb = apex_tensor_clone(apex_var_grad(B));
      float l1 = run_case(g, c, A, B, dts[d], 1);
      if (tu_bits(l0) != tu_bits(l1)) fail_msg("%s: the loss differs after releases", c->name);
      assert_same_bits(ga, apex_var_grad(A), "A's gradient", c->name);
      assert_same_bits(gb, apex_var_grad(B), "B's gradient", c->name);
      apex_tensor_destroy(ga);
      apex_tensor_destroy(gb);
      apex_var_destroy(A);
      apex_var_destroy(B);
    }
  apex_graph_destroy(g);
}

/* ---- what is kept, what goes ----------------------------------------------------------------------- */

static void test_kept_is_what_backward_reads(void **state) {
  (void)state;
  enum { N = 256, D = 128 };
  const size_t bytes = (size_t)N * D * sizeof(float);
  apex_graph *g = apex_graph_create();
  apex_tensor *xt = tu_random_tensor(APEX_F32, N * D, 3, 1.0f), *x2 = apex_tensor_view(xt, 2, (int64_t[]){N, D});
  apex_var *w1 = tu_random_leaf(APEX_F32, 2, (int64_t[]){D, D}, 4, 1), *w2 = tu_random_leaf(APEX_F32, 2, (int64_t[]){D, D}, 5, 1);
  for (int retain = 0; retain < 2; retain++) {
    apex_var *x = apex_graph_input(g, x2, 0);
    apex_var *h = apex_linear(g, x, w1, NULL), *r = apex_relu(g, h), *y = apex_linear(g, r, w2, NULL);
    apex_var *loss = apex_sum_all(g, y);
    size_t live = apex_graph_live_bytes(g), pool = apex_graph_pool_bytes(g);
    /* the first linear saves its input, which is the caller's memory */
    assert_int_equal(apex_graph_saved_bytes(g), live + bytes);
    apex_var_release(h); /* relu reads its output and linear never reads its own: h goes */
    assert_int_equal(apex_graph_live_bytes(g), live - bytes);
    apex_var_release(r); /* ReLU's backward and the second linear's read r: it stays */
    apex_var_release(r); /* twice is harmless */
    assert_int_equal(apex_graph_live_bytes(g), live - bytes);
    apex_var_release(y); /* sum reads no values */
    assert_int_equal(apex_graph_live_bytes(g), live - 2 * bytes);
    assert_null(apex_relu(g, r));
    tu_assert_message("released");
    /* a new value of h's size takes freed memory: the pool does not grow (except under the
     * sanitizers, which keep freed memory poisoned and unused until reset) */
    apex_var *z = apex_cast(g, apex_graph_input(g, x2, 0), APEX_F32);
    assert_non_null(z);
#if !defined(__SANITIZE_ADDRESS__)
    assert_int_equal(apex_graph_pool_bytes(g), pool);
#else
    (void)pool;
#endif
    apex_var_release(z);
    TU_OK(apex_backward(loss, &(apex_backward_options){.retain_graph = retain}));
    if (retain) {
      assert_int_equal(apex_graph_live_bytes(g) >= bytes, 1); /* r is kept for the second backward */
      TU_OK(apex_backward(loss, NULL));
    }
    /* backward dropped what the ops saved: r is gone and only the loss's few bytes are left */
    assert_true(apex_graph_live_bytes(g) < bytes);
    TU_FAILS(apex_backward(loss, NULL), APEX_ERR_STATE, "freed graph");
    apex_graph_reset(g);
  }
  apex_var_destroy(w1);
  apex_var_destroy(w2);
  apex_tensor_destroy(x2);
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
}

/* Cross entropy keeps, for the backward, the logits themselves and two floats a row (max, 1 / sum),
 * from which it recomputes the softmax, for every dtype (args_nn.h): the logits stay when the caller
 * releases them. Bytes: logits N x C, targets N int64, 2 N floats, the 0-d result of the logits'
 * dtype. */
static void test_cross_entropy_keeps_by_dtype(void **state) {
  (void)state;
  enum { N = 96, C = 250 };
  const apex_dtype dts[3] = {APEX_F32, APEX_BF16, APEX_F16};
  int64_t tg[N];
  for (int i = 0; i < N; i++) tg[i] = (i * 37) % C;
  apex_var *L = tu_random_leaf(APEX_F32, 2, (int64_t[]){N, C}, 9, 1);
  for (int d = 0; d < 3; d++) {
    apex_graph *g = apex_graph_create(); /* fresh: a reused pool block may be larger than asked */
    size_t es = apex_dtype_size(dts[d]);
    apex_var *x = apex_cast(g, apex_scale(g, L, 2.0f), dts[d]);
    size_t before = apex_graph_saved_bytes(g);
    apex_var *y = apex_cross_entropy(g, x, tg, NULL);
    assert_non_null(y);
    apex_var_release(x);
    size_t expect = (size_t)N * C * es + 2 * N * sizeof(float); /* the logits, max and 1/sum a row */
    if (apex_graph_saved_bytes(g) != before - (size_t)N * C * es + N * sizeof(int64_t) + expect + es)
      fail_msg("cross_entropy at %s keeps %zu bytes, not %zu", apex_dtype_name(dts[d]), apex_graph_saved_bytes(g) - (before - (size_t)N * C * es),
               N * sizeof(int64_t) + expect + es);
    TU_OK(apex_backward(y, NULL));
    apex_graph_destroy(g);
  }
  apex_var_destroy(L);
}

/* A sequential keeps what backward needs of its intermediates (ReLU outputs, read by ReLU and the
 * next linear) and nothing else; without recording it keeps nothing but its result. */
static void test_sequential_keeps_only_saved(void **state) {
  (void)state;
  enum { N = 64, D = 32 };
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 2});
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "0", D, D, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "2", D, D, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "4", D, D, 1)));
  apex_graph *g = apex_graph_create();
  apex_tensor *xt = tu_random_tensor(APEX_F32, N * D, 6, 1.0f), *x2 = apex_tensor_view(xt, 2, (int64_t[]){N, D});
  const size_t act = (size_t)N * D * sizeof(float);
  apex_var *y = apex_module_forward(net, g, apex_graph_input(g, x2, 0));
  assert_non_null(y);
  assert_int_equal(apex_graph_live_bytes(g), 3 * act); /* two ReLU outputs and the result */
  apex_graph_reset(g);
  apex_graph_set_grad_enabled(g, 0);
  assert_non_null(apex_module_forward(net, g, apex_graph_input(g, x2, 0)));
  assert_int_equal(apex_graph_live_bytes(g), act);
  apex_graph_destroy(g);
  apex_tensor_destroy(x2);
  apex_tensor_destroy(xt);
  apex_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_releases_never_change_gradients),
      cmocka_unit_test(test_kept_is_what_backward_reads),
      cmocka_unit_test(test_sequential_keeps_only_saved),
      cmocka_unit_test(test_cross_entropy_keeps_by_dtype),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
