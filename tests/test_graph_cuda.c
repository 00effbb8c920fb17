/* test_graph_cuda.c: autograd on a CUDA graph (apex_graph_create_on(APEX_DEVICE_CUDA)) against the same
 * work on a CPU graph.
 *
 * - Ops on their CUDA slots, forward and backward in f32 on the same inputs and the same output
 *   gradient: add, mul, scale, ReLU, transpose and concat bitwise (the CPU's one f32 operation per
 *   element, or elements moved as they are); tanh GELU, GELU, tanh, sigmoid, exp, a broadcast sub,
 *   pooling and embedding to 1e-6 (the device's tanhf, erff and expf are not glibc's); sum, mean, norm,
 *   softmax, log-softmax, MSE and BCE with logits to 1e-5 (sums in fixed trees rather than left to
 *   right); layer norm, RMS norm, linear, matmul and conv2d to 1e-5 (f32 accumulation in another
 *   order); each as max |GPU - CPU| <= bound * max(1, max |CPU|). conv2d is reported as skipped when
 *   cuDNN cannot be loaded, never counted as passed.
 * - A 2-layer MLP (Linear 16-32, ReLU, Linear 32-4, a model made on the GPU with apex_model_options.device)
 *   trained 20 SGD steps with momentum on 0.5 * mean squared error of one fixed batch, built from add and
 *   mul (the ops with CUDA backward): on the CPU graph its loss must at least halve (checked without a GPU
 *   too); against the same model trained on the CPU graph: every step's loss to 1e-4
 *   relative, the last gradients to 1e-3 of their largest magnitude, the final parameters to 1e-4; and
 *   with bf16 parameters under bf16 autocast (the casts, the f32 widening and the flush of f32 gradients
 *   into bf16 grads, all on the device) the losses to 2e-2 relative, gradients to 5e-2 of their largest
 *   magnitude, parameters to 1e-2.
 * - The refusals on a CUDA graph: a CPU tensor as input, a CPU leaf, CPU running statistics or a CPU
 *   grad_output (APEX_ERR_DEVICE naming both devices); a target outside the classes (checked on the
 *   host before the targets go to the device) with APEX_ERR_INVALID_ARG.
 * Without a GPU the program runs the CPU graph's training check, then prints why the rest is skipped and
 * exits 77, which ctest reports as skipped (a failure of the CPU check fails the test). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "apex/autograd.h"
#include "apex/cuda.h"
#include "apex/nn.h"
#include "apex/nn_ops.h"
#include "apex/optim.h"
#include "testutil.h"

static apex_tensor *dev_copy(const apex_tensor *h) {
  apex_tensor *d = apex_tensor_create_on(APEX_DEVICE_CUDA, apex_tensor_dtype(h), apex_tensor_ndim(h), apex_tensor_shape(h));
  assert_non_null(d);
  TU_OK(apex_tensor_copy(d, h));
  return d;
}

/* t (any device, any dtype) as a new host f32 tensor. */
static apex_tensor *host_f32(const apex_tensor *t) {
  apex_tensor *h = apex_tensor_create(APEX_F32, apex_tensor_ndim(t), apex_tensor_shape(t));
  assert_non_null(h);
  TU_OK(apex_tensor_copy(h, t));
  return h;
}

/* Fails unless max |gpu - cpu| <= bound * max(1, max |cpu|) (bitwise for bound 0); gpu on the device. */
static void close_to(const apex_tensor *gpu, const apex_tensor *cpu, double bound, const char *op, const char *what) {
  assert_non_null(gpu);
  assert_non_null(cpu);
  assert_int_equal(apex_tensor_device(gpu), APEX_DEVICE_CUDA);
  apex_tensor *a = host_f32(gpu), *b = host_f32(cpu);
  size_t n = apex_tensor_numel(b);
  assert_int_equal(apex_tensor_numel(a), n);
  const float *x = apex_tensor_data(a), *y = apex_tensor_data(b);
  double scale = 1.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)y[i]));
  for (size_t i = 0; i < n; i++) {
    double d = bound == 0.0 ? (tu_bits(x[i]) != tu_bits(y[i])) : fabs((double)x[i] - (double)y[i]);
    if (d > worst) worst = d, at = i;
  }
  if (bound == 0.0 ? worst != 0.0 : worst > bound * scale)
    fail_msg("%s %s: element %zu is %.9g on the GPU, %.9g on the CPU (bound %g of %g)", op, what, at, (double)x[at], (double)y[at], bound,
             scale);
  apex_tensor_destroy(a);
  apex_tensor_destroy(b);
}

/* ---- every op with a CUDA kernel, forward and backward ---------------------------------------------- */

#define MAX_IN 3

typedef apex_var *(*op_fn)(apex_graph *g, apex_var *const *in);

typedef struct op_case {
  const char *name;
  int n_in;
  int ndim[MAX_IN];
  int64_t shape[MAX_IN][4];
  op_fn fn;
  double bound;     /* 0: bitwise */
} op_case;

static const int64_t ids[6] = {0, 3, 8, 3, 5, 0}; /* repeats: the embedding's backward adds rows */
static const int64_t ids_shape[2] = {2, 3};

static apex_var *f_add(apex_graph *g, apex_var *const *in) { return apex_add(g, in[0], in[1]); }
static apex_var *f_mul(apex_graph *g, apex_var *const *in) { return apex_mul(g, in[0], in[1]); }
static apex_var *f_scale(apex_graph *g, apex_var *const *in) { return apex_scale(g, in[0], 0.37f); }
static apex_var *f_relu(apex_graph *g, apex_var *const *in) { return apex_relu(g, in[0]); }
static apex_var *f_gelu_tanh(apex_graph *g, apex_var *const *in) { return apex_gelu_tanh(g, in[0]); }
static apex_var *f_layer_norm(apex_graph *g, apex_var *const *in) { return apex_layer_norm(g, in[0], in[1], in[2], 1e-5f); }
static apex_var *f_rms_norm(apex_graph *g, apex_var *const *in) { return apex_rms_norm(g, in[0], in[1], 1e-5f); }
static apex_var *f_linear(apex_graph *g, apex_var *const *in) { return apex_linear(g, in[0], in[1], in[2]); }
static apex_var *f_matmul(apex_graph *g, apex_var *const *in) { return apex_matmul(g, in[0], in[1]); }
static apex_var *f_conv2d(apex_graph *g, apex_var *const *in) {
  return apex_conv2d(g, in[0], in[1], in[2], &(apex_conv2d_options){.pad_h = 1, .pad_w = 1});
}
static apex_var *f_embedding(apex_graph *g, apex_var *const *in) { return apex_embedding(g, in[0], ids, 2, ids_shape); }
static apex_var *f_sum(apex_graph *g, apex_var *const *in) { return apex_sum(g, in[0], 0, 0); }
static apex_var *f_mean(apex_graph *g, apex_var *const *in) { return apex_mean(g, in[0], 1, 0); }
static apex_var *f_norm(apex_graph *g, apex_var *const *in) { return apex_norm(g, in[0], 1, 1); }
static apex_var *f_softmax(apex_graph *g, apex_var *const *in) { return apex_softmax(g, in[0], 1); }
static apex_var *f_log_softmax(apex_graph *g, apex_var *const *in) { return apex_log_softmax(g, in[0], 0); }
static apex_var *f_mse(apex_graph *g, apex_var *const *in) { return apex_mse_loss(g, in[0], in[1], APEX_REDUCTION_MEAN); }
static apex_var *f_bce_logits(apex_graph *g, apex_var *const *in) { return apex_bce_with_logits(g, in[0], in[1], APEX_REDUCTION_SUM); }
static apex_var *f_sub(apex_graph *g, apex_var *const *in) { return apex_sub(g, in[0], in[1]); }
static apex_var *f_gelu(apex_graph *g, apex_var *const *in) { return apex_gelu(g, in[0]); }
static apex_var *f_tanh(apex_graph *g, apex_var *const *in) { return apex_tanh(g, in[0]); }
static apex_var *f_sigmoid(apex_graph *g, apex_var *const *in) { return apex_sigmoid(g, in[0]); }
static apex_var *f_exp(apex_graph *g, apex_var *const *in) { return apex_exp(g, in[0]); }
static apex_var *f_transpose(apex_graph *g, apex_var *const *in) { return apex_transpose(g, in[0], 0, 1); }
static apex_var *f_concat(apex_graph *g, apex_var *const *in) { return apex_concat(g, 2, in, 1); }
static apex_var *f_max_pool(apex_graph *g, apex_var *const *in) {
  return apex_max_pool2d(g, in[0], &(apex_pool2d_options){.kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1});
}
static apex_var *f_avg_pool(apex_graph *g, apex_var *const *in) {
  return apex_avg_pool2d(g, in[0], &(apex_pool2d_options){.kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1});
}

static const op_case cases[] = {
    {"add", 2, {2, 2}, {{6, 10}, {6, 10}}, f_add, 0.0},
    {"mul", 2, {2, 2}, {{6, 10}, {6, 10}}, f_mul, 0.0},
    {"scale", 1, {2}, {{6, 10}}, f_scale, 0.0},
    {"relu", 1, {2}, {{6, 10}}, f_relu, 0.0},
    {"gelu_tanh", 1, {2}, {{6, 10}}, f_gelu_tanh, 1e-6},
    {"layer_norm", 3, {2, 1, 1}, {{6, 10}, {10}, {10}}, f_layer_norm, 1e-5},
    {"rms_norm", 2, {2, 1}, {{6, 10}, {10}}, f_rms_norm, 1e-5},
    {"linear", 3, {2, 2, 1}, {{6, 10}, {7, 10}, {7}}, f_linear, 1e-5},
    {"matmul", 2, {2, 2}, {{6, 10}, {10, 7}}, f_matmul, 1e-5},
    {"conv2d", 3, {4, 4, 1}, {{2, 3, 6, 6}, {4, 3, 3, 3}, {4}}, f_conv2d, 1e-5},
    {"embedding", 1, {2}, {{9, 5}}, f_embedding, 1e-6},
    {"sum", 1, {2}, {{6, 10}}, f_sum, 1e-5},
    {"mean", 1, {2}, {{6, 10}}, f_mean, 1e-5},
    {"norm", 1, {2}, {{6, 10}}, f_norm, 1e-5},
    {"softmax", 1, {2}, {{6, 10}}, f_softmax, 1e-5},
    {"log_softmax", 1, {2}, {{6, 10}}, f_log_softmax, 1e-5},
    {"mse_loss", 2, {2, 2}, {{6, 10}, {6, 10}}, f_mse, 1e-5},
    {"bce_with_logits", 2, {2, 2}, {{6, 10}, {6, 10}}, f_bce_logits, 1e-5},
    {"sub_broadcast", 2, {2, 1}, {{6, 10}, {10}}, f_sub, 1e-6},
    {"gelu", 1, {2}, {{6, 10}}, f_gelu, 1e-6},
    {"tanh", 1, {2}, {{6, 10}}, f_tanh, 1e-6},
    {"sigmoid", 1, {2}, {{6, 10}}, f_sigmoid, 1e-6},
    {"exp", 1, {2}, {{6, 10}}, f_exp, 1e-6},
    {"transpose", 1, {3}, {{4, 5, 6}}, f_transpose, 0.0},
    {"concat", 2, {2, 2}, {{6, 10}, {6, 3}}, f_concat, 0.0},
    {"max_pool2d", 1, {4}, {{2, 3, 7, 6}}, f_max_pool, 1e-6},
    {"avg_pool2d", 1, {4}, {{2, 3, 7, 6}}, f_avg_pool, 1e-6},
};

/* Runs one case on both graphs; 0 when the GPU could not run it for a reason outside apex (cuDNN). */
static int run_case(const op_case *c, apex_graph *gc, apex_graph *gd) {
  apex_var *hc[MAX_IN], *dc[MAX_IN];
  printf("case %s\n", c->name); /* before the GPU runs it: a crash then names its case */
  fflush(stdout);
  for (int i = 0; i < c->n_in; i++) {
    hc[i] = tu_random_leaf(APEX_F32, c->ndim[i], c->shape[i], 40 + (uint64_t)i, 1);
    dc[i] = apex_var_create(dev_copy(apex_var_value(hc[i])), 1);
    assert_non_null(dc[i]);
  }
  int ran = 1;
  apex_var *yc = c->fn(gc, hc);
  if (!yc) fail_msg("%s on the CPU graph: %s", c->name, apex_last_error());
  apex_var *yd = c->fn(gd, dc);
  if (!yd && !strcmp(c->name, "conv2d") && apex_last_status() == APEX_ERR_UNSUPPORTED && strstr(apex_last_error(), "could not be loaded")) {
    printf("conv2d on the CUDA graph skipped (not counted as passed): %s\n", apex_last_error());
    ran = 0;
  } else {
    if (!yd) fail_msg("%s on the CUDA graph: %s", c->name, apex_last_error());
    close_to(apex_var_value(yd), apex_var_value(yc), c->bound, c->name, "forward");
    apex_tensor *go = tu_random_tensor(APEX_F32, apex_tensor_numel(apex_var_value(yc)), 77, 1.0f);
    apex_tensor *goc = apex_tensor_view(go, apex_tensor_ndim(apex_var_value(yc)), apex_tensor_shape(apex_var_value(yc)));
    apex_tensor *god = dev_copy(goc);
    TU_OK(apex_backward(yc, &(apex_backward_options){.grad_output = goc}));
    apex_status st = apex_backward(yd, &(apex_backward_options){.grad_output = god});
    if (st != APEX_OK) fail_msg("%s backward on the CUDA graph: %s", c->name, apex_last_error());
    for (int i = 0; i < c->n_in; i++) {
      char what[32];
      snprintf(what, sizeof what, "gradient of input %d", i);
      close_to(apex_var_grad(dc[i]), apex_var_grad(hc[i]), c->bound, c->name, what);
    }
    apex_tensor_destroy(god);
    apex_tensor_destroy(goc);
    apex_tensor_destroy(go);
  }
  apex_graph_reset(gc);
  apex_graph_reset(gd);
  for (int i = 0; i < c->n_in; i++) {
    apex_var_destroy(hc[i]);
    apex_var_destroy(dc[i]);
  }
  return ran;
}

static void test_ops_match_cpu(void **state) {
  (void)state;
  apex_graph *gc = apex_graph_create(), *gd = apex_graph_create_on(APEX_DEVICE_CUDA);
  assert_non_null(gc);
  if (!gd) fail_msg("apex_graph_create_on(CUDA): %s", apex_last_error());
  assert_int_equal(apex_graph_device(gd), APEX_DEVICE_CUDA);
  int passed = 0, n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) passed += run_case(&cases[i], gc, gd);
  printf("ops on a CUDA graph: %d of %d cases matched the CPU graph\n", passed, n);
  apex_graph_destroy(gc);
  apex_graph_destroy(gd);
}

/* ---- an MLP trained on both graphs ------------------------------------------------------------------- */

#define BATCH 8
#define IN 16
#define HID 32
#define OUT 4
#define STEPS 20

typedef struct trained {
  double loss[STEPS];
  apex_tensor *grads[4], *params[4]; /* the last step's gradients and the final parameters, on the model's device */
  apex_model *m;
} trained;

/* 0.5 * mean((net(x) - y)^2) through add and mul (the ops with CUDA backward): backward from the squares
 * with grad_output 0.5 / count; the loss itself summed here in double from the squares. */
static void train(apex_device dev, int autocast, trained *t) {
  apex_graph *g = apex_graph_create_on(dev);
  if (!g) fail_msg("apex_graph_create_on: %s", apex_last_error());
  if (autocast) TU_OK(apex_graph_set_autocast(g, 1, APEX_BF16));
  /* under autocast the parameters are bf16 too, so that their gradients are collected in f32 and flushed */
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 11, .dtype = autocast ? APEX_BF16 : APEX_F32, .device = dev});
  if (!m) fail_msg("apex_model_create: %s", apex_last_error());
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "0", IN, HID, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "2", HID, OUT, 1)));
  for (size_t i = 0; i < apex_model_num_params(m); i++)
    assert_int_equal(apex_tensor_device(apex_var_value(apex_model_param(m, i, NULL))), dev);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.05f, .momentum = 0.9f});
  TU_OK(apex_optimizer_add_model(opt, m, NULL, NULL));
  int64_t xs[2] = {BATCH, IN}, ys[2] = {BATCH, OUT};
  apex_tensor *seed = apex_tensor_create(APEX_F32, 2, ys);
  TU_OK(apex_tensor_fill(seed, 0.5f / (BATCH * OUT)));
  apex_tensor *seed_d = dev == APEX_DEVICE_CPU ? NULL : dev_copy(seed);
  for (int s = 0; s < STEPS; s++) {
    /* one fixed batch, so the loss is the same function at every step and must fall as the net fits it (a
     * fresh random batch and target each step gave a loss with nothing to learn, which rose as often) */
    apex_tensor *xr = tu_random_tensor(APEX_F32, BATCH * IN, 200, 1.0f);
    apex_tensor *yr = tu_random_tensor(APEX_F32, BATCH * OUT, 300, 1.0f); /* -y: the loss adds it */
    apex_tensor *xh = apex_tensor_view(xr, 2, xs), *yh = apex_tensor_view(yr, 2, ys);
    apex_tensor *x = dev == APEX_DEVICE_CPU ? xh : dev_copy(xh), *y = dev == APEX_DEVICE_CPU ? yh : dev_copy(yh);
    TU_OK(apex_model_zero_grad(m));
    apex_var *out = apex_module_forward(net, g, apex_graph_input(g, x, 0));
    apex_var *d = apex_add(g, out, apex_graph_input(g, y, 0));
    apex_var *sq = apex_mul(g, d, d);
    if (!sq) fail_msg("forward on %s: %s", dev == APEX_DEVICE_CPU ? "CPU" : "CUDA", apex_last_error());
    apex_tensor *sqh = host_f32(apex_var_value(sq));
    double sum = 0.0;
    for (size_t i = 0; i < apex_tensor_numel(sqh); i++) sum += (double)((const float *)apex_tensor_data(sqh))[i];
    t->loss[s] = 0.5 * sum / (BATCH * OUT);
    apex_tensor_destroy(sqh);
    TU_OK(apex_backward(sq, &(apex_backward_options){.grad_output = seed_d ? seed_d : seed}));
    if (s == STEPS - 1)
      for (size_t i = 0; i < 4; i++) t->grads[i] = apex_tensor_to(apex_var_grad(apex_model_param(m, i, NULL)), APEX_F32);
    TU_OK(apex_optimizer_step(opt, 1.0f, 0));
    apex_graph_reset(g);
    if (x != xh) apex_tensor_destroy(x);
    if (y != yh) apex_tensor_destroy(y);
    apex_tensor_destroy(xh);
    apex_tensor_destroy(yh);
    apex_tensor_destroy(xr);
    apex_tensor_destroy(yr);
  }
  for (size_t i = 0; i < 4; i++) t->params[i] = apex_tensor_to(apex_var_value(apex_model_param(m, i, NULL)), APEX_F32);
  apex_tensor_destroy(seed);
  apex_tensor_destroy(seed_d);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  apex_graph_destroy(g);
}

static void trained_free(trained *t) {
  for (int i = 0; i < 4; i++) {
    apex_tensor_destroy(t->grads[i]);
    apex_tensor_destroy(t->params[i]);
  }
}

/* The largest |x| of a tensor (any device). */
static double max_abs(const apex_tensor *t) {
  apex_tensor *h = host_f32(t);
  double m = 0.0;
  for (size_t i = 0; i < apex_tensor_numel(h); i++) m = fmax(m, fabs((double)((const float *)apex_tensor_data(h))[i]));
  apex_tensor_destroy(h);
  return m;
}

/* The loss of the fixed batch at least halves over the steps and never rises by more than 1% from one step
 * to the next (momentum may overshoot a little). */
static void it_trains(const trained *t) {
  for (int s = 1; s < STEPS; s++)
    if (!(t->loss[s] <= 1.01 * t->loss[s - 1])) fail_msg("step %d: the loss rose from %.9g to %.9g", s, t->loss[s - 1], t->loss[s]);
  if (!(t->loss[STEPS - 1] <= 0.5 * t->loss[0]))
    fail_msg("the loss fell only from %.9g to %.9g in %d steps", t->loss[0], t->loss[STEPS - 1], STEPS);
}

static void mlp_matches(int autocast, double loss_bound, double grad_bound, double param_bound) {
  trained c = {0}, d = {0};
  train(APEX_DEVICE_CPU, autocast, &c);
  train(APEX_DEVICE_CUDA, autocast, &d);
  for (int s = 0; s < STEPS; s++) {
    printf("%s step %d: loss CPU %.9g, CUDA %.9g\n", autocast ? "bf16 autocast" : "f32", s, c.loss[s], d.loss[s]);
    if (!(fabs(d.loss[s] - c.loss[s]) <= loss_bound * fabs(c.loss[s])))
      fail_msg("step %d: loss %.9g on the CUDA graph, %.9g on the CPU graph (bound %g relative)", s, d.loss[s], c.loss[s], loss_bound);
  }
  it_trains(&c);
  for (int i = 0; i < 4; i++) {
    char what[32];
    snprintf(what, sizeof what, "parameter %d", i);
    close_to(d.grads[i], c.grads[i], grad_bound * max_abs(c.grads[i]) / fmax(1.0, max_abs(c.grads[i])), "mlp gradient", what);
    close_to(d.params[i], c.params[i], param_bound, "mlp", what);
  }
  trained_free(&c);
  trained_free(&d);
}

static void test_mlp_f32_matches_cpu(void **state) {
  (void)state;
  mlp_matches(0, 1e-4, 1e-3, 1e-4);
}

/* The CPU graph alone (runs without a GPU too): the f32 MLP and, under bf16 autocast, the bf16 one train. */
static void test_mlp_trains_on_cpu(void **state) {
  (void)state;
  for (int autocast = 0; autocast < 2; autocast++) {
    trained c = {0};
    train(APEX_DEVICE_CPU, autocast, &c);
    printf("%s on the CPU graph: loss %.6g -> %.6g in %d steps\n", autocast ? "bf16 autocast" : "f32", c.loss[0], c.loss[STEPS - 1], STEPS);
    it_trains(&c);
    trained_free(&c);
  }
}

static void test_mlp_bf16_autocast_matches_cpu(void **state) {
  (void)state;
  mlp_matches(1, 2e-2, 5e-2, 1e-2);
}

/* ---- what a CUDA graph refuses ---------------------------------------------------------------------- */

static void test_refusals(void **state) {
  (void)state;
  apex_graph *gd = apex_graph_create_on(APEX_DEVICE_CUDA);
  assert_non_null(gd);
  int64_t s2[2] = {4, 6}, c = 6;
  apex_tensor *h = tu_random_tensor(APEX_F32, 24, 5, 1.0f), *hv = apex_tensor_view(h, 2, s2);
  assert_null(apex_graph_input(gd, hv, 1));
  assert_int_equal(apex_last_status(), APEX_ERR_DEVICE);
  tu_assert_message("apex_graph_input: the tensor is on device CPU but the graph is on device CUDA");
  apex_var *hleaf = tu_random_leaf(APEX_F32, 2, s2, 6, 1);
  assert_null(apex_relu(gd, hleaf));
  tu_assert_message("relu: input 0 is on device CPU but the graph is on device CUDA");
  apex_tensor *dv = dev_copy(hv);
  apex_var *x = apex_graph_input(gd, dv, 1);
  assert_non_null(x);
  /* a CUDA graph takes host targets (copied to the device), checked on the host first */
  int64_t tg[4] = {0, 1, 9, 3};
  assert_null(apex_cross_entropy(gd, x, tg, NULL));
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  tu_assert_message("cross_entropy: target 9 at row 2 is outside [0, 6)");
  apex_tensor *rm = apex_tensor_create(APEX_F32, 1, &c), *rv = apex_tensor_create(APEX_F32, 1, &c);
  assert_null(apex_batch_norm(gd, x, NULL, NULL, rm, rv, &(apex_batch_norm_options){.training = 1}));
  assert_int_equal(apex_last_status(), APEX_ERR_DEVICE);
  tu_assert_message("running_mean is on device CPU but the graph is on device CUDA");
  apex_var *y = apex_scale(gd, x, 2.0f);
  assert_non_null(y);
  apex_tensor *go = apex_tensor_create(APEX_F32, 2, s2);
  assert_int_equal(apex_backward(y, &(apex_backward_options){.grad_output = go}), APEX_ERR_DEVICE);
  tu_assert_message("apex_backward: grad_output is on device CPU but the graph is on device CUDA");
  /* the refused backward changed nothing: a good one still runs */
  apex_tensor *god = dev_copy(go);
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = god}));
  apex_tensor_destroy(go);
  apex_tensor_destroy(god);
  apex_tensor_destroy(rm);
  apex_tensor_destroy(rv);
  apex_graph_destroy(gd);
  apex_tensor_destroy(dv);
  apex_var_destroy(hleaf);
  apex_tensor_destroy(hv);
  apex_tensor_destroy(h);
}

int main(void) {
  const char *why;
  const struct CMUnitTest cpu_tests[] = {cmocka_unit_test(test_mlp_trains_on_cpu)};
  if (!apex_cuda_available(&why)) {
    int failed = cmocka_run_group_tests(cpu_tests, NULL, NULL);
    if (failed) return failed;
    printf("test_graph_cuda: the CUDA cases skipped: %s\n", why);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_trains_on_cpu),
      cmocka_unit_test(test_ops_match_cpu),
      cmocka_unit_test(test_mlp_f32_matches_cpu),
      cmocka_unit_test(test_mlp_bf16_autocast_matches_cpu),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
