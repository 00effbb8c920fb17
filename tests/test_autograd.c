/* test_autograd.c: the engine: accumulation, no-grad, freed graphs, errors that name the op and the
 * shapes, autocast, low-precision parameters, thread-count independence and a 10,000-step run that
 * must not grow (run under LeakSanitizer in the APEX_SANITIZE build). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "apex/nn.h"

static void test_accumulate_and_zero(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *w = tu_random_leaf(APEX_F32, 1, (int64_t[]){3}, 1, 1);
  for (int step = 0; step < 2; step++) {
    apex_var *loss = apex_sum_all(g, apex_scale(g, w, 2.0f));
    TU_OK(apex_backward(loss, NULL));
    apex_graph_reset(g);
  }
  for (size_t i = 0; i < 3; i++) assert_float_equal(apex_tensor_get(apex_var_grad(w), i), 4.0f, 0);
  TU_OK(apex_var_zero_grad(w));
  assert_float_equal(apex_tensor_get(apex_var_grad(w), 1), 0.0f, 0);
  /* a var used twice gets both contributions; a cast passes the gradient through */
  apex_var *y = apex_mul(g, w, apex_cast(g, apex_cast(g, w, APEX_F16), APEX_F32));
  TU_OK(apex_backward(apex_sum_all(g, y), NULL));
  for (size_t i = 0; i < 3; i++) {
    float x = apex_tensor_get(apex_var_value(w), i), xr = apex_f16_to_f32(apex_f32_to_f16(x));
    assert_float_equal(apex_tensor_get(apex_var_grad(w), i), x + xr, 1e-6);
  }
  apex_var_destroy(w);
  apex_graph_destroy(g);
}

static void test_no_grad_and_freed_graph(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *w = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 3}, 2, 1);
  assert_int_equal(apex_graph_set_grad_enabled(g, 0), 1);
  apex_var *y = apex_sum_all(g, apex_relu(g, w));
  assert_false(apex_var_requires_grad(y));
  TU_FAILS(apex_backward(y, NULL), APEX_ERR_STATE, "does not require gradients");
  apex_graph_set_grad_enabled(g, 1);
  apex_graph_reset(g);

  apex_var *loss = apex_mean_all(g, apex_tanh(g, w));
  TU_OK(apex_backward(loss, &(apex_backward_options){.retain_graph = 1}));
  TU_OK(apex_backward(loss, NULL));
  TU_FAILS(apex_backward(loss, NULL), APEX_ERR_STATE, "freed graph");
  tu_assert_message("mean");
  apex_graph_reset(g);

  apex_var *y2 = apex_relu(g, w);
  TU_FAILS(apex_backward(y2, NULL), APEX_ERR_SHAPE, "relu");
  tu_assert_message("[2, 3]");
  tu_assert_message("grad_output");
  apex_tensor *bad = apex_tensor_create(APEX_F32, 1, (int64_t[]){5});
  TU_FAILS(apex_backward(y2, &(apex_backward_options){.grad_output = bad}), APEX_ERR_SHAPE, "[5]");
  TU_FAILS(apex_backward(w, NULL), APEX_ERR_INVALID_ARG, "leaf");
  TU_FAILS(apex_backward(NULL, NULL), APEX_ERR_INVALID_ARG, "NULL");
  apex_tensor_destroy(bad);
  apex_var_destroy(w);
  apex_graph_destroy(g);
}

static void test_errors_name_op_and_shapes(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){4, 3}, 3, 0), *w = tu_random_leaf(APEX_F32, 2, (int64_t[]){5, 4}, 4, 1);
  apex_var *img = tu_random_leaf(APEX_F32, 4, (int64_t[]){2, 3, 8, 8}, 5, 0), *k = tu_random_leaf(APEX_F32, 4, (int64_t[]){4, 2, 3, 3}, 6, 1);
  assert_null(apex_linear(g, x, w, NULL));
  tu_assert_message("linear: input [4, 3], weight [5, 4]");
  assert_null(apex_add(g, x, w));
  tu_assert_message("add: shapes [4, 3] and [5, 4] do not broadcast");
  assert_null(apex_matmul(g, x, x));
  tu_assert_message("matmul: cannot multiply [4, 3] by [4, 3]");
  assert_null(apex_conv2d(g, img, k, NULL, NULL));
  tu_assert_message("conv2d: input [2, 3, 8, 8], weight [4, 2, 3, 3]");
  assert_null(apex_cross_entropy(g, x, (int64_t[]){0, 1, 3, 2}, NULL));
  tu_assert_message("cross_entropy: target 3 at row 2 is outside [0, 3)");
  assert_null(apex_mse_loss(g, x, w, APEX_REDUCTION_MEAN));
  tu_assert_message("mse_loss: input [4, 3] and target [5, 4]");
  assert_null(apex_reshape(g, x, 2, (int64_t[]){5, -1}));
  tu_assert_message("reshape: [4, 3] has 12 elements");
  assert_null(apex_causal_attention(g, img, img, k));
  tu_assert_message("causal_attention");
  apex_tensor *f16stats = apex_tensor_create(APEX_F16, 1, (int64_t[]){3});
  assert_null(apex_batch_norm(g, img, NULL, NULL, f16stats, f16stats, NULL));
  tu_assert_message("batch_norm: running_mean is f16; running statistics are f32");
  assert_null(apex_dropout(g, x, 1.5f, 1, NULL));
  tu_assert_message("dropout: p = 1.5");
  /* a failed op's NULL makes the next op fail, and backward reports it */
  apex_var *chain = apex_relu(g, apex_linear(g, x, w, NULL));
  assert_null(chain);
  tu_assert_message("relu: input 0 is NULL");
  TU_FAILS(apex_backward(chain, NULL), APEX_ERR_INVALID_ARG, "did the forward fail?");
  /* vars from before a reset are refused */
  apex_var *old = apex_relu(g, x);
  apex_graph_reset(g);
  assert_null(apex_relu(g, old));
  tu_assert_message("before apex_graph_reset");
  TU_FAILS(apex_graph_set_autocast(g, 1, APEX_F32), APEX_ERR_DTYPE, "f16 or bf16");
  apex_tensor_destroy(f16stats);
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_var_destroy(img);
  apex_var_destroy(k);
  apex_graph_destroy(g);
}

/* Every op takes f16 and bf16 values, and gives its result in the declared dtype. */
static void test_low_precision_and_autocast(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_dtype dts[2] = {APEX_F16, APEX_BF16};
  for (int d = 0; d < 2; d++) {
    apex_var *x = tu_random_leaf(dts[d], 2, (int64_t[]){4, 6}, 7, 1), *w = tu_random_leaf(dts[d], 2, (int64_t[]){3, 6}, 8, 1);
    apex_var *h = apex_gelu(g, apex_linear(g, x, w, NULL));
    assert_int_equal(apex_tensor_dtype(apex_var_value(h)), dts[d]);
    apex_var *loss = apex_cross_entropy(g, h, (int64_t[]){0, 2, 1, 1}, NULL);
    assert_int_equal(apex_tensor_dtype(apex_var_value(loss)), dts[d]);
    TU_OK(apex_backward(loss, NULL));
    assert_int_equal(apex_tensor_dtype(apex_var_grad(w)), dts[d]);
    apex_graph_reset(g);
    apex_var_destroy(x);
    apex_var_destroy(w);
  }
  /* autocast: linear runs in f16 on a cached cast of the f32 weight; cross entropy in f32 */
  apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){4, 6}, 9, 0), *w = tu_random_leaf(APEX_F32, 2, (int64_t[]){3, 6}, 10, 1);
  TU_OK(apex_graph_set_autocast(g, 1, APEX_F16));
  apex_var *a = apex_linear(g, x, w, NULL), *b = apex_linear(g, x, w, NULL);
  assert_int_equal(apex_tensor_dtype(apex_var_value(a)), APEX_F16);
  apex_var *loss = apex_cross_entropy(g, apex_add(g, a, b), (int64_t[]){0, 2, 1, 1}, NULL);
  assert_int_equal(apex_tensor_dtype(apex_var_value(loss)), APEX_F32);
  size_t before = apex_graph_pool_bytes(g);
  TU_OK(apex_backward(loss, NULL));
  assert_int_equal(apex_tensor_dtype(apex_var_grad(w)), APEX_F32);
  float g_auto = apex_tensor_get(apex_var_grad(w), 0);
  apex_graph_reset(g);
  TU_OK(apex_graph_set_autocast(g, 0, APEX_F16));
  TU_OK(apex_var_zero_grad(w));
  a = apex_linear(g, x, w, NULL);
  TU_OK(apex_backward(apex_cross_entropy(g, apex_add(g, a, a), (int64_t[]){0, 2, 1, 1}, NULL), NULL));
  assert_float_equal(g_auto, apex_tensor_get(apex_var_grad(w), 0), 2e-2 * fabsf(g_auto) + 1e-3);
  /* an override: linear forced to f32 */
  apex_graph_reset(g);
  TU_OK(apex_graph_set_autocast(g, 1, APEX_BF16));
  TU_OK(apex_graph_set_op_cast(g, APEX_OP_LINEAR, APEX_CAST_FLOAT));
  assert_int_equal(apex_tensor_dtype(apex_var_value(apex_linear(g, x, w, NULL))), APEX_F32);
  assert_int_equal(apex_op_cast_category(APEX_OP_CONV2D), APEX_CAST_HALF);
  assert_int_equal(apex_op_cast_category(APEX_OP_SOFTMAX), APEX_CAST_FLOAT);
  assert_string_equal(apex_op_name(APEX_OP_LAYER_NORM), "layer_norm");
  (void)before;
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_graph_destroy(g);
}

/* A low-precision leaf collects its gradient in f32 and adds it to its grad tensor once, rounded once:
 * with an f16 weight used by two linears and a grad that already holds values, the grad must become
 * round(old + (a + b)), a and b the f32 weight gradients of the same graph run on the widened values.
 * The weight is large enough for the parallel path (more than one 65,536-element block). */
static void test_low_precision_leaf_adds_once(void **state) {
  (void)state;
  const int64_t xs[2] = {8, 320}, ws[2] = {300, 320};
  const size_t nw = 300 * 320;
  apex_var *xh = tu_random_leaf(APEX_F16, 2, xs, 21, 0), *wh = tu_random_leaf(APEX_F16, 2, ws, 22, 1);
  apex_tensor *old = tu_random_tensor(APEX_F16, nw, 23, 4.0f);
  memcpy(apex_tensor_data(apex_var_grad(wh)), apex_tensor_data(old), nw * 2);
  apex_var *xf = apex_var_create(apex_tensor_to(apex_var_value(xh), APEX_F32), 0);
  apex_var *wf = apex_var_create(apex_tensor_to(apex_var_value(wh), APEX_F32), 1);
  apex_graph *g = apex_graph_create();
  apex_var *xv[2] = {xh, xf}, *wv[2] = {wh, wf};
  for (int k = 0; k < 2; k++) {
    apex_var *y1 = apex_linear(g, xv[k], wv[k], NULL), *y2 = apex_linear(g, apex_scale(g, xv[k], 0.5f), wv[k], NULL);
    TU_OK(apex_backward(apex_add(g, apex_sum_all(g, y1), apex_sum_all(g, y2)), NULL));
    apex_graph_reset(g);
  }
  const uint16_t *got = apex_tensor_data(apex_var_grad(wh)), *was = apex_tensor_data(old);
  const float *sum = apex_tensor_data(apex_var_grad(wf));
  size_t changed = 0;
  for (size_t i = 0; i < nw; i++) {
    assert_int_equal(got[i], apex_f32_to_f16(apex_f16_to_f32(was[i]) + sum[i]));
    changed += got[i] != was[i];
  }
  assert_true(changed > nw / 2);
  apex_graph_destroy(g);
  apex_tensor_destroy(old);
  apex_var_destroy(xh), apex_var_destroy(wh), apex_var_destroy(xf), apex_var_destroy(wf);
}

/* One training step of a model touching the threaded paths (large enough to split). */
static void train_step(int threads, uint32_t *out_bits, size_t *n_out) {
  TU_OK(apex_set_num_threads(threads));
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 11});
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_conv2d_create(m, "c", 1, 8, 3, 3, &(apex_conv2d_options){.pad_h = 1, .pad_w = 1}, 1)));
  TU_OK(apex_sequential_add(net, apex_batch_norm2d_create(m, "bn", 8, NULL)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_GELU)));
  TU_OK(apex_sequential_add(net, apex_avg_pool2d_create(m, &(apex_pool2d_options){.kernel_h = 2, .kernel_w = 2})));
  TU_OK(apex_sequential_add(net, apex_flatten_create(m)));
  TU_OK(apex_sequential_add(net, apex_layer_norm_create(m, "ln", 8 * 14 * 14, 0)));
  TU_OK(apex_sequential_add(net, apex_dropout_create(m, 0.1f)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "fc", 8 * 14 * 14, 10, 1)));
  apex_graph *g = apex_graph_create();
  apex_tensor *flat = tu_random_tensor(APEX_F32, 32 * 28 * 28, 12, 1.0f);
  apex_tensor *x = apex_tensor_view(flat, 4, (int64_t[]){32, 1, 28, 28});
  int64_t labels[32];
  for (int i = 0; i < 32; i++) labels[i] = (i * 7) % 10;
  apex_var *loss = apex_cross_entropy(g, apex_module_forward(net, g, apex_graph_input(g, x, 0)), labels,
                                      &(apex_cross_entropy_options){.label_smoothing = 0.1f});
  assert_non_null(loss);
  TU_OK(apex_backward(loss, NULL));
  size_t k = 0;
  out_bits[k++] = tu_bits(apex_var_item(loss));
  for (size_t p = 0; p < apex_model_num_params(m); p++) {
    apex_tensor *gr = apex_var_grad(apex_model_param(m, p, NULL));
    for (size_t i = 0; i < apex_tensor_numel(gr); i++) out_bits[k++] = tu_bits(apex_tensor_get(gr, i));
  }
  *n_out = k;
  apex_tensor_destroy(x);
  apex_tensor_destroy(flat);
  apex_graph_destroy(g);
  apex_model_destroy(m);
}

static void test_threads_bitwise(void **state) {
  (void)state;
  size_t cap = 1 << 16, n1, n2;
  uint32_t *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
  int saved = apex_get_num_threads();
  train_step(1, a, &n1);
  train_step(2, b, &n2);
  TU_OK(apex_set_num_threads(saved));
  assert_int_equal(n1, n2);
  for (size_t i = 0; i < n1; i++)
    if (a[i] != b[i]) fail_msg("value %zu differs between 1 and 2 threads: %08x vs %08x", i, a[i], b[i]);
  free(a);
  free(b);
}

/* 10,000 steps: the pool must stop growing after the first, and nothing may leak (LeakSanitizer). */
static void test_ten_thousand_steps(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 4});
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "0", 16, 32, 1)));
  TU_OK(apex_sequential_add(net, apex_rms_norm_create(m, "1", 32, 0)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_SIGMOID)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "2", 32, 4, 1)));
  apex_graph *g = apex_graph_create();
  apex_tensor *x = tu_random_tensor(APEX_F32, 8 * 16, 5, 1.0f);
  apex_tensor *x2 = apex_tensor_view(x, 2, (int64_t[]){8, 16});
  int64_t labels[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  size_t pool = 0;
  float first = 0, last = 0;
  for (int step = 0; step < 10000; step++) {
    apex_var *loss = apex_cross_entropy(g, apex_module_forward(net, g, apex_graph_input(g, x2, 0)), labels, NULL);
    TU_OK(apex_model_zero_grad(m));
    TU_OK(apex_backward(loss, NULL));
    if (step == 0) first = apex_var_item(loss);
    last = apex_var_item(loss);
    for (size_t p = 0; p < apex_model_num_params(m); p++) { /* plain SGD */
      apex_var *v = apex_model_param(m, p, NULL);
      float *w = apex_tensor_data(apex_var_value(v)), *gr = apex_tensor_data(apex_var_grad(v));
      for (size_t i = 0; i < apex_tensor_numel(apex_var_value(v)); i++) w[i] -= 0.05f * gr[i];
    }
    apex_graph_reset(g);
    if (step == 1) pool = apex_graph_pool_bytes(g);
    if (step > 1) assert_int_equal(apex_graph_pool_bytes(g), pool);
  }
  assert_true(last < 0.1f * first);
  apex_tensor_destroy(x2);
  apex_tensor_destroy(x);
  apex_graph_destroy(g);
  apex_model_destroy(m);
}

static void test_model_names_and_init(void **state) {
  (void)state;
  apex_model *a = apex_model_create(&(apex_model_options){.seed = 9}), *b = apex_model_create(&(apex_model_options){.seed = 9});
  apex_model *c = apex_model_create(&(apex_model_options){.seed = 9, .dtype = APEX_BF16});
  apex_model *ms[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    assert_non_null(apex_linear_create(ms[i], "fc", 10, 20, 1));
    assert_non_null(apex_batch_norm1d_create(ms[i], "bn", 20, NULL));
    assert_non_null(apex_embedding_create(ms[i], "wte", 7, 4));
  }
  assert_null(apex_linear_create(a, "fc", 3, 3, 1));
  tu_assert_message("already has a module named 'fc'");
  assert_int_equal(apex_model_num_params(a), 5);
  assert_int_equal(apex_model_num_buffers(a), 2);
  const char *name;
  apex_model_param(a, 1, &name);
  assert_string_equal(name, "fc.bias");
  apex_model_buffer(a, 1, &name);
  assert_string_equal(name, "bn.running_var");
  assert_float_equal(apex_tensor_get(apex_model_find_buffer(a, "bn.running_var"), 3), 1.0f, 0);
  assert_int_equal(apex_model_param_elements(a), 200 + 20 + 20 + 20 + 28);
  apex_tensor *wa = apex_var_value(apex_model_find_param(a, "fc.weight")), *wb = apex_var_value(apex_model_find_param(b, "fc.weight"));
  assert_memory_equal(apex_tensor_data(wa), apex_tensor_data(wb), apex_tensor_nbytes(wa));
  for (size_t i = 0; i < 200; i++) assert_true(fabsf(apex_tensor_get(wa, i)) <= 1.0f / sqrtf(10.0f));
  apex_tensor *wc = apex_var_value(apex_model_find_param(c, "fc.weight"));
  assert_int_equal(apex_tensor_dtype(wc), APEX_BF16);
  assert_int_equal(apex_f32_to_bf16(apex_tensor_get(wa, 5)), apex_f32_to_bf16(apex_tensor_get(wc, 5)));
  assert_float_equal(apex_tensor_get(apex_var_value(apex_model_find_param(a, "bn.weight")), 0), 1.0f, 0);
  for (int i = 0; i < 3; i++) apex_model_destroy(ms[i]);
}

/* relu(batch norm) as one op (apex_batch_norm_options.relu, fused by apex_sequential) gives the bits
 * of the two ops: output, running statistics and the gradients of input, weight and bias, in f32 and
 * with a half input (whose output is masked by its raw bits), in training and in evaluation. The
 * bias is an op's result, released after the batch norm and its memory offered to the next op: the
 * fused backward reads it (op_table.c), so it must stay. */
static void bn_relu_run(apex_dtype dt, int training, int fused, uint32_t *bits, size_t *n) {
  enum { N = 6, C = 3, H = 5, W = 7 };
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(dt, 4, (int64_t[]){N, C, H, W}, 21, 1), *w = tu_random_leaf(APEX_F32, 1, (int64_t[]){C}, 22, 1);
  apex_var *b = tu_random_leaf(APEX_F32, 1, (int64_t[]){C}, 23, 1);
  apex_tensor *rm = apex_tensor_create(APEX_F32, 1, (int64_t[]){C}), *rv = apex_tensor_create(APEX_F32, 1, (int64_t[]){C});
  apex_tensor *go = tu_random_tensor(APEX_F32, N * C * H * W, 24, 1.0f);
  apex_tensor_fill(rm, 0.25f);
  apex_tensor_fill(rv, 0.5f);
  apex_batch_norm_options o = {.training = training, .relu = fused};
  apex_var *bias = apex_scale(g, b, 1.0f);
  apex_var *y = apex_batch_norm(g, x, w, bias, rm, rv, &o);
  apex_var_release(bias);
  assert_non_null(apex_scale(g, b, -7.0f)); /* may take the bias's block if it was let go */
  if (!fused) y = apex_relu(g, y);
  assert_non_null(y);
  assert_int_equal(apex_var_op(y), fused ? APEX_OP_BATCH_NORM_RELU : APEX_OP_RELU);
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = go}));
  size_t k = 0;
  const apex_tensor *ts[6] = {apex_var_value(y), rm, rv, apex_var_grad(x), apex_var_grad(w), apex_var_grad(b)};
  for (int t = 0; t < 6; t++)
    for (size_t i = 0; i < apex_tensor_numel(ts[t]); i++) bits[k++] = tu_bits(apex_tensor_get(ts[t], i));
  *n = k;
  apex_tensor_destroy(go);
  apex_tensor_destroy(rm);
  apex_tensor_destroy(rv);
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_var_destroy(b);
}

/* gelu_tanh(linear) as one op (apex_linear_gelu, what the transformer block runs) gives the bits of the
 * two ops on the CPU, forward and backward, when the next op reads its result in the product's dtype:
 * here a second linear, under autocast too (where the unfused GELU runs in f32 and the next linear casts
 * its result back, the one rounding the fused op does). Compared: the final output and the gradients of
 * x, both weights and both biases; dt is the leaves' dtype, autocast 0 or the autocast dtype. The bias
 * is an op's result released at once: the backward never reads it (op_table.c). In evaluation (no
 * gradient) the fused op keeps no pre-activation and gives the same output. */
static void linear_gelu_run(apex_dtype dt, apex_dtype autocast, int fused, int grad, uint32_t *bits, size_t *n) {
  enum { M = 7, K = 24, H = 40, O = 9 };
  apex_graph *g = apex_graph_create();
  if (autocast) TU_OK(apex_graph_set_autocast(g, 1, autocast));
  if (!grad) apex_graph_set_grad_enabled(g, 0);
  apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){M, K}, 31, grad), *w1 = tu_random_leaf(dt, 2, (int64_t[]){H, K}, 32, grad);
  apex_var *b1 = tu_random_leaf(dt, 1, (int64_t[]){H}, 33, grad), *w2 = tu_random_leaf(dt, 2, (int64_t[]){O, H}, 34, grad);
  apex_var *b2 = tu_random_leaf(dt, 1, (int64_t[]){O}, 35, grad);
  apex_tensor *go = tu_random_tensor(APEX_F32, M * O, 36, 1.0f);
  apex_var *bias = apex_scale(g, b1, 1.0f);
  apex_var *h = fused ? apex_linear_gelu(g, x, w1, bias) : apex_gelu_tanh(g, apex_linear(g, x, w1, bias));
  assert_non_null(h);
  assert_int_equal(apex_var_op(h), fused ? APEX_OP_LINEAR_GELU : APEX_OP_GELU_TANH);
  apex_var_release(bias);
  apex_var *y = apex_linear(g, h, w2, b2);
  assert_non_null(y);
  size_t k = 0;
  const apex_tensor *out = apex_var_value(y);
  for (size_t i = 0; i < apex_tensor_numel(out); i++) bits[k++] = tu_bits(apex_tensor_get(out, i));
  if (grad) {
    TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = go}));
    apex_var *leaves[5] = {x, w1, b1, w2, b2};
    for (int t = 0; t < 5; t++)
      for (size_t i = 0; i < apex_tensor_numel(apex_var_grad(leaves[t])); i++) bits[k++] = tu_bits(apex_tensor_get(apex_var_grad(leaves[t]), i));
  }
  *n = k;
  apex_tensor_destroy(go);
  apex_graph_destroy(g);
  apex_var *leaves[5] = {x, w1, b1, w2, b2};
  for (int t = 0; t < 5; t++) apex_var_destroy(leaves[t]);
}

static void test_linear_gelu_fused(void **state) {
  (void)state;
  enum { CAP = 8192 };
  static uint32_t a[CAP], f[CAP];
  const struct { apex_dtype dt, autocast; } runs[] = {{APEX_F32, 0}, {APEX_BF16, 0}, {APEX_F16, 0}, {APEX_F32, APEX_BF16}, {APEX_F32, APEX_F16}};
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
    for (int grad = 0; grad < 2; grad++) {
      size_t na, nf;
      linear_gelu_run(runs[r].dt, runs[r].autocast, 0, grad, a, &na);
      linear_gelu_run(runs[r].dt, runs[r].autocast, 1, grad, f, &nf);
      assert_int_equal(na, nf);
      assert_true(na > 0);
      for (size_t i = 0; i < na; i++)
        if (a[i] != f[i]) fail_msg("%s autocast %s grad %d: value %zu is 0x%08x fused, 0x%08x unfused", apex_dtype_name(runs[r].dt),
                                   runs[r].autocast ? apex_dtype_name(runs[r].autocast) : "off", grad, i, f[i], a[i]);
    }
  assert_string_equal(apex_op_name(APEX_OP_LINEAR_GELU), "linear_gelu");
  assert_int_equal(apex_op_cast_category(APEX_OP_LINEAR_GELU), APEX_CAST_HALF);
  /* shapes are checked as apex_linear's, naming the op */
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){3, 4}, 37, 0), *w = tu_random_leaf(APEX_F32, 2, (int64_t[]){5, 6}, 38, 0);
  assert_null(apex_linear_gelu(g, x, w, NULL));
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE);
  assert_non_null(strstr(apex_last_error(), "linear_gelu"));
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
}

/* The classifier as one op (apex_linear_cross_entropy) against apex_cross_entropy(apex_linear(x, w)), its
 * two ops: the loss bit for bit always (the same slots run forward); the gradients of x and w bit for bit
 * with one chunk, and with several (chunk_rows 3 of 10 rows) within a few f32 ulps of the largest
 * element (w's gradient adds the chunks' products in turn). out receives loss, gx, gw as f32. */
static void classifier_run_seeded(apex_dtype dt, apex_dtype autocast, int fused, int64_t chunk, const apex_cross_entropy_options *o,
                                  float seed, int half_grads, float *out, size_t *n) {
  enum { N = 10, C = 12, V = 33 };
  static const int64_t tg[N] = {3, 0, 32, 7, 7, 1, 30, 2, 5, 16};
  apex_graph *g = apex_graph_create();
  if (autocast) TU_OK(apex_graph_set_autocast(g, 1, autocast));
  TU_OK(apex_graph_set_half_grads(g, half_grads));
  apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){N, C}, 41, 1), *w = tu_random_leaf(dt, 2, (int64_t[]){V, C}, 42, 1);
  apex_var *h = apex_scale(g, x, 2.0f); /* an op's result, as a model's last layer norm gives */
  apex_var *loss = fused ? apex_linear_cross_entropy(g, h, w, tg, o, chunk) : apex_cross_entropy(g, apex_linear(g, h, w, NULL), tg, o);
  assert_non_null(loss);
  assert_int_equal(apex_var_op(loss), fused ? APEX_OP_LINEAR_CROSS_ENTROPY : APEX_OP_CROSS_ENTROPY);
  apex_tensor *go = apex_tensor_create(APEX_F32, 0, NULL); /* the loss's gradient: 1, or a loss scale */
  TU_OK(apex_tensor_fill(go, seed));
  TU_OK(apex_backward(loss, &(apex_backward_options){.grad_output = go}));
  apex_tensor_destroy(go);
  size_t k = 0;
  out[k++] = apex_tensor_get(apex_var_value(loss), 0);
  for (size_t i = 0; i < (size_t)N * C; i++) out[k++] = apex_tensor_get(apex_var_grad(x), i);
  for (size_t i = 0; i < (size_t)V * C; i++) out[k++] = apex_tensor_get(apex_var_grad(w), i);
  *n = k;
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
}

/* After the refusals: a loss that is made, runs its backward and is finite (the graph kept working). */
static void loss_runs(apex_var *loss) {
  assert_non_null(loss);
  TU_OK(apex_backward(loss, NULL));
  assert_true(isfinite(apex_tensor_get(apex_var_value(loss), 0)));
}

static void classifier_run(apex_dtype dt, apex_dtype autocast, int fused, int64_t chunk, const apex_cross_entropy_options *o, float *out,
                           size_t *n) {
  classifier_run_seeded(dt, autocast, fused, chunk, o, 1.0f, 0, out, n);
}

/* The one-pass classifier (apex_cross_entropy_options.one_pass 1: the logits' gradient written by the
 * forward for a loss gradient of 1, the backward's products scaled by the real one) against two passes
 * (-1) in a graph that keeps gradients in the values' dtype, so that the two-pass road also rounds the
 * logits' gradient to their dtype: bit for bit for a power-of-two loss gradient (1, 1024, 2^-3: a loss
 * scale), where scaling commutes with every rounding; within a rounding of the logits' dtype for 0.3.
 * f32, bf16 and bf16 autocast; MEAN, SUM with smoothing, an ignored target. Then the refusals. */
static void test_linear_cross_entropy_one_pass(void **state) {
  (void)state;
  enum { CAP = 1024 };
  static float a[CAP], f[CAP];
  const struct { apex_dtype dt, autocast; } runs[] = {{APEX_F32, 0}, {APEX_BF16, 0}, {APEX_F32, APEX_BF16}};
  const apex_cross_entropy_options base[3] = {{0}, {.reduction = APEX_REDUCTION_SUM, .label_smoothing = 0.1f},
                                              {.use_ignore_index = 1, .ignore_index = 7}};
  const float seeds[4] = {1.0f, 1024.0f, 0.125f, 0.3f};
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
    for (int o = 0; o < 3; o++)
      for (int si = 0; si < 4; si++) {
        apex_cross_entropy_options one = base[o], two = base[o];
        one.one_pass = 1, two.one_pass = -1;
        size_t na, nf;
        classifier_run_seeded(runs[r].dt, runs[r].autocast, 1, 0, &two, seeds[si], 1, a, &na);
        classifier_run_seeded(runs[r].dt, runs[r].autocast, 1, 0, &one, seeds[si], 1, f, &nf);
        assert_int_equal(na, nf);
        const int exact = si < 3, f32 = runs[r].dt == APEX_F32 && !runs[r].autocast;
        double mx = 0;
        for (size_t i = 1; i < na; i++) mx = fmax(mx, fabs(a[i]));
        for (size_t i = 0; i < na; i++) {
          /* 0.3: the two-pass road rounds 0.3 x the gradient, the one-pass one the gradient, then scales: a
           * rounding of each term in the logits' dtype (2^-24 relative in f32, 2^-8 in bf16), summed over the
           * products */
          double bound = i == 0 || exact ? 0 : ldexp(mx, f32 ? -18 : -6);
          if (!(tu_bits(a[i]) == tu_bits(f[i]) || fabs((double)a[i] - f[i]) <= bound))
            fail_msg("%s autocast %s opts %d seed %g: value %zu is %.9g in one pass, %.9g in two (bound %.3g)", apex_dtype_name(runs[r].dt),
                     runs[r].autocast ? apex_dtype_name(runs[r].autocast) : "off", o, (double)seeds[si], i, f[i], a[i], bound);
        }
      }
  /* refusals: a clear error each, nothing recorded */
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F16, 2, (int64_t[]){2, 4}, 43, 1), *w = tu_random_leaf(APEX_F16, 2, (int64_t[]){5, 4}, 44, 1);
  const int64_t good[2] = {1, 4};
  assert_null(apex_linear_cross_entropy(g, x, w, good, &(apex_cross_entropy_options){.one_pass = 1}, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_non_null(strstr(apex_last_error(), "f16 logits"));
  assert_null(apex_linear_cross_entropy(g, x, w, good, &(apex_cross_entropy_options){.one_pass = 2}, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_non_null(strstr(apex_last_error(), "one_pass 2"));
  assert_null(apex_cross_entropy(g, apex_linear(g, x, w, NULL), good, &(apex_cross_entropy_options){.one_pass = 1}));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_non_null(strstr(apex_last_error(), "apex_linear_cross_entropy"));
  loss_runs(apex_linear_cross_entropy(g, x, w, good, NULL, 0)); /* f16 by default: two passes, and it runs */
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
}

static void test_linear_cross_entropy(void **state) {
  (void)state;
  enum { CAP = 1024 };
  static float a[CAP], f[CAP];
  const struct { apex_dtype dt, autocast; } runs[] = {{APEX_F32, 0}, {APEX_BF16, 0}, {APEX_F32, APEX_BF16}, {APEX_F32, APEX_F16}};
  const apex_cross_entropy_options opts[3] = {{0}, {.reduction = APEX_REDUCTION_SUM, .label_smoothing = 0.1f},
                                              {.use_ignore_index = 1, .ignore_index = 7}};
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
    for (int o = 0; o < 3; o++)
      for (int chunk = 0; chunk < 2; chunk++) {
        size_t na, nf;
        classifier_run(runs[r].dt, runs[r].autocast, 0, 0, &opts[o], a, &na);
        classifier_run(runs[r].dt, runs[r].autocast, 1, chunk ? 3 : 0, &opts[o], f, &nf);
        assert_int_equal(na, nf);
        /* the fused loss is f32 whatever the dtype; the unfused one of bf16 logits is bf16: the same value rounded */
        if (runs[r].dt == APEX_BF16 && !runs[r].autocast) f[0] = apex_bf16_to_f32(apex_f32_to_bf16(f[0]));
        double mx = 0;
        for (size_t i = 1; i < na; i++) mx = fmax(mx, fabs(a[i]));
        for (size_t i = 0; i < na; i++) {
          /* the loss, and with one chunk everything, bitwise; a gradient of a half leaf is stored rounded,
           * so it may also move by one ulp of its dtype */
          double bound = i == 0 || !chunk ? 0 : 1e-6 * mx + (runs[r].dt == APEX_F32 ? 0 : ldexp(fabs(a[i]), -7));
          if (!(tu_bits(a[i]) == tu_bits(f[i]) || fabs((double)a[i] - f[i]) <= bound))
            fail_msg("%s autocast %s opts %d chunk %d: value %zu is %.9g fused, %.9g unfused (bound %.3g)", apex_dtype_name(runs[r].dt),
                     runs[r].autocast ? apex_dtype_name(runs[r].autocast) : "off", o, chunk, i, f[i], a[i], bound);
        }
      }
  assert_string_equal(apex_op_name(APEX_OP_LINEAR_CROSS_ENTROPY), "linear_cross_entropy");
  /* bad input: one clear error each, and the graph keeps working */
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 4}, 43, 1), *w = tu_random_leaf(APEX_F32, 2, (int64_t[]){5, 4}, 44, 1);
  apex_var *w3 = tu_random_leaf(APEX_F32, 2, (int64_t[]){5, 3}, 45, 1);
  const int64_t good[2] = {1, 4}, bad[2] = {1, 5};
  assert_null(apex_linear_cross_entropy(g, x, w, bad, NULL, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_non_null(strstr(apex_last_error(), "target 5 at row 1"));
  assert_null(apex_linear_cross_entropy(g, x, w3, good, NULL, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE);
  assert_null(apex_linear_cross_entropy(g, x, w, good, &(apex_cross_entropy_options){.reduction = APEX_REDUCTION_NONE}, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_null(apex_linear_cross_entropy(g, x, w, good, NULL, -1));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_null(apex_linear_cross_entropy(g, x, w, NULL, NULL, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  loss_runs(apex_linear_cross_entropy(g, x, w, good, NULL, 1));
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_var_destroy(w3);
}

/* The residual add and its layer norm (apex_add_layer_norm) against apex_add then apex_layer_norm: the
 * norm's output, the sum, and every gradient (x, r, weight, bias), bit for bit, in f32, bf16, f16 and
 * under autocast (where the norm reads a half sum uncast), both results carrying a gradient; and where
 * it cannot fuse (r broadcast over rows) the same results by the two ops. */
static void add_ln_run(apex_dtype dt, apex_dtype autocast, int fused, int bcast, uint32_t *bits, size_t *n) {
  enum { R = 9, D = 20 };
  apex_graph *g = apex_graph_create();
  if (autocast) TU_OK(apex_graph_set_autocast(g, 1, autocast));
  apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){R, D}, 51, 1), *r = tu_random_leaf(dt, 2, (int64_t[]){bcast ? 1 : R, D}, 52, 1);
  apex_var *w = tu_random_leaf(APEX_F32, 1, (int64_t[]){D}, 53, 1), *b = tu_random_leaf(APEX_F32, 1, (int64_t[]){D}, 54, 1);
  apex_var *sum = NULL, *y;
  if (fused) {
    y = apex_add_layer_norm(g, x, r, w, b, 1e-5f, &sum);
  } else {
    sum = apex_add(g, x, r);
    y = apex_layer_norm(g, sum, w, b, 1e-5f);
  }
  assert_non_null(y);
  assert_non_null(sum);
  apex_var *z = apex_add(g, apex_scale(g, y, 0.75f), apex_cast(g, sum, apex_tensor_dtype(apex_var_value(y))));
  apex_tensor *go = tu_random_tensor(APEX_F32, R * D, 55, 1.0f);
  TU_OK(apex_backward(z, &(apex_backward_options){.grad_output = go}));
  size_t k = 0;
  const apex_tensor *ts[6] = {apex_var_value(y), apex_var_value(sum), apex_var_grad(x), apex_var_grad(r), apex_var_grad(w), apex_var_grad(b)};
  for (int t = 0; t < 6; t++)
    for (size_t i = 0; i < apex_tensor_numel(ts[t]); i++) bits[k++] = tu_bits(apex_tensor_get(ts[t], i));
  *n = k;
  apex_tensor_destroy(go);
  apex_graph_destroy(g);
  apex_var *leaves[4] = {x, r, w, b};
  for (int t = 0; t < 4; t++) apex_var_destroy(leaves[t]);
}

static void test_add_layer_norm(void **state) {
  (void)state;
  enum { CAP = 4096 };
  static uint32_t a[CAP], f[CAP];
  const struct { apex_dtype dt, autocast; } runs[] = {{APEX_F32, 0}, {APEX_BF16, 0}, {APEX_F16, 0}, {APEX_BF16, APEX_BF16}, {APEX_F32, APEX_F16}};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
    for (int bcast = 0; bcast < 2; bcast++) {
      size_t na, nf;
      add_ln_run(runs[i].dt, runs[i].autocast, 0, bcast, a, &na);
      add_ln_run(runs[i].dt, runs[i].autocast, 1, bcast, f, &nf);
      assert_int_equal(na, nf);
      for (size_t j = 0; j < na; j++)
        if (a[j] != f[j]) fail_msg("%s autocast %s broadcast %d: value %zu is 0x%08x fused, 0x%08x by the two ops", apex_dtype_name(runs[i].dt),
                                   runs[i].autocast ? apex_dtype_name(runs[i].autocast) : "off", bcast, j, f[j], a[j]);
    }
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 4}, 56, 0), *w = tu_random_leaf(APEX_F32, 1, (int64_t[]){4}, 57, 0);
  apex_var *w5 = tu_random_leaf(APEX_F32, 1, (int64_t[]){5}, 58, 0), *sum = x;
  assert_null(apex_add_layer_norm(g, x, x, w, w, 0.0f, NULL));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_null(apex_add_layer_norm(g, x, x, w5, w5, 0.0f, &sum)); /* the norm's own shape error */
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE);
  assert_null(sum);
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_var_destroy(w5);
}

static void test_batch_norm_relu_fused(void **state) {
  (void)state;
  enum { CAP = 4096 };
  static uint32_t a[CAP], f[CAP];
  apex_dtype dts[2] = {APEX_F32, APEX_F16};
  for (int d = 0; d < 2; d++)
    for (int training = 0; training < 2; training++) {
      size_t na, nf;
      bn_relu_run(dts[d], training, 0, a, &na);
      bn_relu_run(dts[d], training, 1, f, &nf);
      assert_int_equal(na, nf);
      assert_memory_equal(a, f, na * sizeof *a);
    }
  assert_string_equal(apex_op_name(APEX_OP_BATCH_NORM_RELU), "batch_norm_relu");
  /* a sequential fuses a batch norm followed by a ReLU, and not one followed by another activation */
  apex_op acts[2] = {APEX_OP_RELU, APEX_OP_GELU}, want[2] = {APEX_OP_BATCH_NORM_RELU, APEX_OP_GELU};
  for (int i = 0; i < 2; i++) {
    apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
    apex_module *net = apex_sequential_create(m, NULL);
    TU_OK(apex_sequential_add(net, apex_batch_norm2d_create(m, "bn", 3, NULL)));
    TU_OK(apex_sequential_add(net, apex_activation_create(m, acts[i])));
    apex_graph *g = apex_graph_create();
    apex_var *x = tu_random_leaf(APEX_F32, 4, (int64_t[]){2, 3, 4, 4}, 25, 0);
    apex_var *y = apex_module_forward(net, g, x);
    assert_non_null(y);
    assert_int_equal(apex_var_op(y), want[i]);
    apex_graph_destroy(g);
    apex_var_destroy(x);
    apex_model_destroy(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accumulate_and_zero),       cmocka_unit_test(test_no_grad_and_freed_graph),
      cmocka_unit_test(test_errors_name_op_and_shapes), cmocka_unit_test(test_low_precision_and_autocast),
      cmocka_unit_test(test_threads_bitwise),           cmocka_unit_test(test_ten_thousand_steps),
      cmocka_unit_test(test_model_names_and_init),       cmocka_unit_test(test_batch_norm_relu_fused), cmocka_unit_test(test_linear_gelu_fused), cmocka_unit_test(test_linear_cross_entropy), cmocka_unit_test(test_linear_cross_entropy_one_pass), cmocka_unit_test(test_add_layer_norm),
      cmocka_unit_test(test_low_precision_leaf_adds_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
