/* test_graph_device.c: a graph's device (apex_graph_create_on), on any machine.
 *
 * apex_graph_create_on(APEX_DEVICE_CPU) is apex_graph_create: the same MLP trained a few SGD steps on
 * each, in f32 and in bf16 (parameters in bf16, so that gradients are collected in f32 and added to the
 * grad tensors once per backward), gives the same bits in every loss, gradient and parameter, and the
 * same pool size. A low-precision leaf's grad after two backwards is checked against its closed form
 * (one rounding of the old grad plus the f32 sum), since that addition now goes through the backend's
 * slots. The refusals: a CUDA graph or model where this build or machine has no usable GPU, an unknown
 * device, a NULL graph; each with its status and a message naming the call, and nothing leaked (the
 * sanitizer build checks that). What needs a GPU is in test_graph_cuda.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "apex/autograd.h"
#include "apex/cuda.h"
#include "apex/nn.h"
#include "apex/optim.h"
#include "testutil.h"

#define BATCH 8
#define IN 16
#define HID 32
#define OUT 4
#define STEPS 4

typedef struct run {
  float loss[STEPS];
  apex_tensor *params[4]; /* final parameters, f32 copies */
  apex_tensor *grads[4];  /* last step's gradients, f32 copies */
  size_t pool_bytes;
} run;

/* Trains Linear(IN, HID) - ReLU - Linear(HID, OUT) with cross entropy and SGD for STEPS steps on graph g. */
static void train(apex_graph *g, apex_dtype dtype, run *r) {
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 7, .dtype = dtype});
  assert_non_null(m);
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "0", IN, HID, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "2", HID, OUT, 1)));
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.1f, .momentum = 0.9f});
  assert_non_null(opt);
  TU_OK(apex_optimizer_add_model(opt, m, NULL, NULL));
  int64_t xs[2] = {BATCH, IN};
  int64_t targets[BATCH];
  for (int i = 0; i < BATCH; i++) targets[i] = (i * 3) % OUT;
  for (int s = 0; s < STEPS; s++) {
    apex_tensor *xt = tu_random_tensor(dtype, BATCH * IN, 100 + (uint64_t)s, 1.0f);
    apex_tensor *x2 = apex_tensor_view(xt, 2, xs);
    assert_non_null(x2);
    TU_OK(apex_model_zero_grad(m));
    apex_var *x = apex_graph_input(g, x2, 0);
    apex_var *loss = apex_cross_entropy(g, apex_module_forward(net, g, x), targets, NULL);
    assert_non_null(loss);
    r->loss[s] = apex_var_item(loss);
    TU_OK(apex_backward(loss, NULL));
    if (s == STEPS - 1) {
      for (size_t i = 0; i < 4; i++) r->grads[i] = apex_tensor_to(apex_var_grad(apex_model_param(m, i, NULL)), APEX_F32);
      r->pool_bytes = apex_graph_pool_bytes(g);
    }
    TU_OK(apex_optimizer_step(opt, 1.0f, 0));
    apex_graph_reset(g);
    apex_tensor_destroy(x2);
    apex_tensor_destroy(xt);
  }
  for (size_t i = 0; i < 4; i++) r->params[i] = apex_tensor_to(apex_var_value(apex_model_param(m, i, NULL)), APEX_F32);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
}

static void run_free(run *r) {
  for (int i = 0; i < 4; i++) {
    apex_tensor_destroy(r->params[i]);
    apex_tensor_destroy(r->grads[i]);
  }
}

static void same_bits(const apex_tensor *a, const apex_tensor *b, const char *what, int i) {
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(apex_tensor_nbytes(a), apex_tensor_nbytes(b));
  if (memcmp(apex_tensor_data(a), apex_tensor_data(b), apex_tensor_nbytes(a)) != 0) fail_msg("%s %d differs between the two graphs", what, i);
}

static void create_on_cpu_is_create(apex_dtype dtype) {
  apex_graph *ga = apex_graph_create(), *gb = apex_graph_create_on(APEX_DEVICE_CPU);
  assert_non_null(ga);
  assert_non_null(gb);
  assert_int_equal(apex_graph_device(ga), APEX_DEVICE_CPU);
  assert_int_equal(apex_graph_device(gb), APEX_DEVICE_CPU);
  run a = {0}, b = {0};
  train(ga, dtype, &a);
  train(gb, dtype, &b);
  for (int s = 0; s < STEPS; s++) {
    assert_true(isfinite(a.loss[s]));
    assert_int_equal(tu_bits(a.loss[s]), tu_bits(b.loss[s]));
  }
  assert_true(a.loss[STEPS - 1] < a.loss[0]); /* it trains: the comparison is not of two idle runs */
  for (int i = 0; i < 4; i++) {
    same_bits(a.grads[i], b.grads[i], "gradient", i);
    same_bits(a.params[i], b.params[i], "parameter", i);
  }
  assert_int_equal(a.pool_bytes, b.pool_bytes);
  run_free(&a);
  run_free(&b);
  apex_graph_destroy(ga);
  apex_graph_destroy(gb);
}

static void test_create_on_cpu_is_create_f32(void **state) {
  (void)state;
  create_on_cpu_is_create(APEX_F32);
}

static void test_create_on_cpu_is_create_bf16(void **state) {
  (void)state;
  create_on_cpu_is_create(APEX_BF16);
}

/* y = 2x + 3x on a bf16 leaf: backward collects 3g + 2g in f32 (exact for these values) and adds it to
 * the grad tensor once, rounding once: grad = bf16(f32(old grad) + 5g). Two backwards, so the second
 * adds to a grad that is not zero. Expected values are formed here from the closed form. */
static void test_low_precision_leaf_grad_rounds_once(void **state) {
  (void)state;
  enum { N = 64 };
  apex_graph *g = apex_graph_create_on(APEX_DEVICE_CPU);
  int64_t n = N;
  apex_var *x = tu_random_leaf(APEX_BF16, 1, &n, 3, 1);
  apex_tensor *go = apex_tensor_create(APEX_F32, 1, &n);
  float gof[N];
  for (int i = 0; i < N; i++) {
    gof[i] = (float)(i - 20) * 0.0078125f + 1.0f / 3.0f; /* 1/3 is not a bf16: the rounding shows */
    apex_tensor_set(go, (size_t)i, gof[i]);
  }
  float expect[N] = {0};
  for (int pass = 0; pass < 2; pass++) {
    apex_var *y = apex_add(g, apex_scale(g, x, 2.0f), apex_scale(g, x, 3.0f));
    assert_non_null(y);
    TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = go}));
    for (int i = 0; i < N; i++) {
      float sum = 3.0f * gof[i] + 2.0f * gof[i];
      uint16_t r;
      float wide = expect[i] + sum;
      TU_OK(apex_convert(&r, APEX_BF16, &wide, APEX_F32, 1));
      TU_OK(apex_convert(&expect[i], APEX_F32, &r, APEX_BF16, 1));
    }
    for (int i = 0; i < N; i++)
      if (tu_bits(apex_tensor_get(apex_var_grad(x), (size_t)i)) != tu_bits(expect[i]))
        fail_msg("pass %d element %d: grad %.9g, expected %.9g", pass, i, (double)apex_tensor_get(apex_var_grad(x), (size_t)i),
                 (double)expect[i]);
    apex_graph_reset(g);
  }
  apex_tensor_destroy(go);
  apex_var_destroy(x);
  apex_graph_destroy(g);
}

static void test_refusals(void **state) {
  (void)state;
  apex_clear_error();
  assert_null(apex_graph_create_on((apex_device)7));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  tu_assert_message("apex_graph_create_on: unknown device 7");
  assert_int_equal(apex_graph_device(NULL), APEX_DEVICE_CPU);
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  const char *why = NULL;
  if (apex_cuda_available(&why)) {
    printf("the no-GPU refusals skipped: this machine has a usable GPU (test_graph_cuda covers it)\n");
    return;
  }
  apex_clear_error();
  assert_null(apex_graph_create_on(APEX_DEVICE_CUDA));
  assert_int_equal(apex_last_status(), APEX_ERR_UNSUPPORTED);
  tu_assert_message("apex_graph_create_on: ");
  assert_non_null(strstr(apex_last_error(), "CUDA") ? apex_last_error() : strstr(apex_last_error(), "GPU"));
  apex_clear_error();
  assert_null(apex_model_create(&(apex_model_options){.device = APEX_DEVICE_CUDA}));
  assert_int_equal(apex_last_status(), APEX_ERR_UNSUPPORTED);
  tu_assert_message("apex_model_create: ");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_on_cpu_is_create_f32),
      cmocka_unit_test(test_create_on_cpu_is_create_bf16),
      cmocka_unit_test(test_low_precision_leaf_grad_rounds_once),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
