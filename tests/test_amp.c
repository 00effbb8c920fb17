/* test_amp.c: amp's three calls, after Apex's tests/L0/run_amp (test_basic_casts, test_cache,
 * test_promotion, test_multiple_models_optimizers_losses, test_checkpointing) and the loss-scale
 * decrease case.
 *
 * References: casts are checked against the same ops run without autocast on explicitly cast inputs;
 * training runs are checked against runs that differ only in the thing under test (no injected
 * overflow, no checkpoint, no amp), which must give the same bits, since loss scales are powers of
 * two and unscaling by them is exact. */
#define _POSIX_C_SOURCE 200809L /* dup, dup2, fileno: to read what amp prints at verbosity 1; mkstemp */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "apex/amp.h"
#include "apex/model_io.h"
#include "apex/safetensors.h"
#include "testutil.h"

enum { IN = 8, HID = 16, OUT = 4, BATCH = 6 };

typedef struct {
  apex_model *m;
  apex_module *net;
  apex_optimizer *opt;
} net_t;

/* Linear(8,16) -> [BatchNorm1d] -> ReLU -> Linear(16,4), SGD with momentum over all parameters. */
static net_t make_net(uint64_t seed, int with_bn, float lr) {
  net_t n;
  n.m = apex_model_create(&(apex_model_options){.seed = seed});
  n.net = apex_sequential_create(n.m, NULL);
  TU_OK(apex_sequential_add(n.net, apex_linear_create(n.m, "fc1", IN, HID, 1)));
  if (with_bn) TU_OK(apex_sequential_add(n.net, apex_batch_norm1d_create(n.m, "bn", HID, NULL)));
  TU_OK(apex_sequential_add(n.net, apex_activation_create(n.m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(n.net, apex_linear_create(n.m, "fc2", HID, OUT, 1)));
  size_t np = apex_model_num_params(n.m);
  apex_tensor *p[8], *g[8];
  for (size_t i = 0; i < np; i++) {
    p[i] = apex_var_value(apex_model_param(n.m, i, NULL));
    g[i] = apex_var_grad(apex_model_param(n.m, i, NULL));
  }
  n.opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = lr, .momentum = 0.125f});
  assert_non_null(n.opt);
  TU_OK(apex_optimizer_add_group(n.opt, p, (int)np, g, (int)np, NULL, NULL));
  return n;
}

static void free_net(net_t n) {
  apex_optimizer_destroy(n.opt);
  apex_model_destroy(n.m);
}

/* Batch `step` of a deterministic data stream: inputs in [-1, 1] and labels. */
static apex_tensor *batch_x(int step) {
  apex_tensor *x = tu_random_tensor(APEX_F32, BATCH * IN, 1000 + (uint64_t)step, 1.0f);
  int64_t shape[2] = {BATCH, IN};
  apex_tensor *v = apex_tensor_view(x, 2, shape);
  apex_tensor_destroy(x);
  return v;
}

static void batch_y(int step, int64_t *y) {
  for (int i = 0; i < BATCH; i++) y[i] = (step * 7 + i * 3) % OUT;
}

/* Copies of every parameter's bytes, for bitwise comparisons. */
static void snapshot(apex_model *m, uint8_t **out, size_t *len) {
  size_t total = 0;
  for (size_t i = 0; i < apex_model_num_params(m); i++) total += apex_tensor_nbytes(apex_var_value(apex_model_param(m, i, NULL)));
  *out = malloc(total);
  *len = total;
  size_t at = 0;
  for (size_t i = 0; i < apex_model_num_params(m); i++) {
    apex_tensor *t = apex_var_value(apex_model_param(m, i, NULL));
    memcpy(*out + at, apex_tensor_data(t), apex_tensor_nbytes(t));
    at += apex_tensor_nbytes(t);
  }
}

/* One amp training step on batch `step`; returns the loss. */
static float amp_step(apex_amp *amp, net_t *n, apex_graph *g, int step, int *skipped) {
  apex_tensor *x = batch_x(step);
  int64_t y[BATCH];
  batch_y(step, y);
  apex_var *out = apex_amp_forward(amp, 0, n->net, g, apex_graph_input(g, x, 0));
  apex_var *loss = apex_cross_entropy(g, out, y, NULL);
  if (!loss) fail_msg("forward failed: %s", apex_last_error());
  float l = apex_var_item(loss);
  TU_OK(apex_amp_backward(amp, loss, 0, NULL));
  TU_OK(apex_amp_step(amp, n->opt, skipped));
  TU_OK(apex_amp_zero_grad(amp));
  apex_graph_reset(g);
  apex_tensor_destroy(x);
  return l;
}

/* ---- O1 casts ---------------------------------------------------------------------------------- */

static void test_o1_casts_per_category(void **state) {
  (void)state;
  for (int bf = 0; bf < 2; bf++) {
    apex_dtype half = bf ? APEX_BF16 : APEX_F16;
    net_t n = make_net(1, 0, 0.1f);
    apex_amp *amp;
    TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1,
                              &(apex_amp_config){.opt_level = "O1", .half_type = bf ? APEX_AMP_CAST_BF16 : APEX_AMP_CAST_F16}, &amp));
    apex_graph *g = apex_graph_create();
    TU_OK(apex_amp_prepare_graph(amp, g));
    apex_tensor *xt = batch_x(0);
    apex_var *x = apex_graph_input(g, xt, 0);
    apex_var *fc1w = apex_model_find_param(n.m, "fc1.weight"), *fc1b = apex_model_find_param(n.m, "fc1.bias");
    apex_var *h = apex_linear(g, x, fc1w, fc1b); /* half */
    assert_int_equal(apex_tensor_dtype(apex_var_value(h)), half);
    apex_var *r = apex_relu(g, h); /* input's type */
    assert_int_equal(apex_tensor_dtype(apex_var_value(r)), half);
    apex_var *s = apex_softmax(g, r, -1); /* float */
    assert_int_equal(apex_tensor_dtype(apex_var_value(s)), APEX_F32);
    apex_var *p = apex_add(g, r, s); /* promote: widest */
    assert_int_equal(apex_tensor_dtype(apex_var_value(p)), APEX_F32);
    apex_var *p2 = apex_mul(g, r, r); /* promote of equal types stays */
    assert_int_equal(apex_tensor_dtype(apex_var_value(p2)), half);
    apex_var *ln = apex_layer_norm(g, r, NULL, NULL, 0); /* float */
    assert_int_equal(apex_tensor_dtype(apex_var_value(ln)), APEX_F32);
    apex_var *ms = apex_mean_all(g, r); /* float reduction */
    assert_int_equal(apex_tensor_dtype(apex_var_value(ms)), APEX_F32);
    apex_var *ge = apex_gelu(g, r); /* float, as in Apex's FP32 list */
    assert_int_equal(apex_tensor_dtype(apex_var_value(ge)), APEX_F32);
    /* The rest of Apex's FP32 list: exp, log, pow and the norm run in f32 on the half input, each
     * giving the bits of the same op on an explicitly cast input in a graph without autocast.
     * Comparisons promote: a half mask for two half inputs, f32 with an f32 one, each the bits of
     * the comparison of explicitly cast inputs. */
    {
      apex_graph *ref = apex_graph_create();
      apex_var *rr = apex_graph_input(ref, apex_var_value(r), 0), *sr = apex_graph_input(ref, apex_var_value(s), 0);
      apex_var *r32 = apex_cast(ref, rr, APEX_F32);
      enum { NF = 7, NC = 4 };
      apex_var *got[NF] = {apex_exp(g, r),          apex_log(g, r),      apex_pow(g, r, 2.0f),      apex_pow(g, r, 0.5f),
                           apex_pow_tensor(g, r, r), apex_norm_all(g, r), apex_norm(g, r, -1, 1)};
      apex_var *want[NF] = {apex_exp(ref, r32),            apex_log(ref, r32),      apex_pow(ref, r32, 2.0f), apex_pow(ref, r32, 0.5f),
                            apex_pow_tensor(ref, r32, r32), apex_norm_all(ref, r32), apex_norm(ref, r32, -1, 1)};
      apex_var *gotc[NC] = {apex_gt(g, r, s), apex_lt(g, s, r), apex_eq(g, r, r), apex_gt(g, r, h)};
      apex_var *wantc[NC] = {apex_gt(ref, r32, sr), apex_lt(ref, sr, r32), apex_eq(ref, rr, rr),
                             apex_gt(ref, rr, apex_graph_input(ref, apex_var_value(h), 0))};
      apex_dtype cdt[NC] = {APEX_F32, APEX_F32, half, half};
      for (int k = 0; k < NF + NC; k++) {
        apex_var *a = k < NF ? got[k] : gotc[k - NF], *b = k < NF ? want[k] : wantc[k - NF];
        if (!a || !b) fail_msg("op %d: %s", k, apex_last_error());
        assert_int_equal(apex_tensor_dtype(apex_var_value(a)), k < NF ? APEX_F32 : cdt[k - NF]);
        assert_int_equal(apex_tensor_dtype(apex_var_value(b)), apex_tensor_dtype(apex_var_value(a)));
        assert_memory_equal(apex_tensor_data(apex_var_value(a)), apex_tensor_data(apex_var_value(b)), apex_tensor_nbytes(apex_var_value(a)));
        assert_int_equal(apex_var_requires_grad(a), k < NF); /* r requires gradients (fc1's); masks never do */
      }
      apex_graph_destroy(ref);
    }
    /* Batch norm runs in its input's type with its f32 parameters. */
    int64_t c16 = HID;
    apex_tensor *bw = apex_tensor_create(APEX_F32, 1, &c16), *rm = apex_tensor_create(APEX_F32, 1, &c16),
                *rv = apex_tensor_create(APEX_F32, 1, &c16);
    apex_tensor_fill(bw, 1.0f);
    apex_tensor_fill(rv, 1.0f);
    apex_var *bwv = apex_var_create(bw, 1);
    apex_var *bn = apex_batch_norm(g, r, bwv, NULL, rm, rv, &(apex_batch_norm_options){.training = 1});
    assert_non_null(bn);
    assert_int_equal(apex_tensor_dtype(apex_var_value(bn)), half);
    /* Plain binary cross-entropy is refused under O1, pointing to the with-logits form. */
    apex_var *prob = apex_sigmoid(g, h);
    assert_null(apex_bce(g, prob, prob, APEX_REDUCTION_MEAN));
    tu_assert_message("apex_bce_with_logits");
    assert_non_null(apex_bce_with_logits(g, h, prob, APEX_REDUCTION_MEAN));
    /* The half linear equals the same op on explicitly cast inputs in a graph without autocast. */
    apex_graph *ref = apex_graph_create();
    apex_var *xr = apex_graph_input(ref, xt, 0);
    apex_var *hr = apex_linear(ref, apex_cast(ref, xr, half), apex_cast(ref, fc1w, half), apex_cast(ref, fc1b, half));
    assert_memory_equal(apex_tensor_data(apex_var_value(h)), apex_tensor_data(apex_var_value(hr)), apex_tensor_nbytes(apex_var_value(h)));
    /* A region with casts disabled runs in the inputs' types. */
    int was = apex_amp_casts_enabled(amp, g, 0);
    assert_int_equal(was, 1);
    apex_var *h32 = apex_linear(g, x, fc1w, fc1b);
    assert_int_equal(apex_tensor_dtype(apex_var_value(h32)), APEX_F32);
    apex_amp_casts_enabled(amp, g, was);
    /* A user registration: linear as float. */
    TU_OK(apex_amp_register_op(amp, APEX_OP_LINEAR, APEX_CAST_FLOAT));
    TU_OK(apex_amp_prepare_graph(amp, g));
    assert_int_equal(apex_tensor_dtype(apex_var_value(apex_linear(g, x, fc1w, fc1b))), APEX_F32);
    apex_graph_destroy(ref);
    apex_graph_destroy(g);
    apex_tensor_destroy(xt);
    apex_var_destroy(bwv);
    apex_tensor_destroy(rm);
    apex_tensor_destroy(rv);
    apex_amp_destroy(amp);
    free_net(n);
  }
  /* allow_banned lets it run. */
  net_t n = make_net(1, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1", .allow_banned = 1}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  apex_tensor *xt = batch_x(0);
  apex_var *prob = apex_sigmoid(g, apex_graph_input(g, xt, 0));
  assert_non_null(apex_bce(g, prob, prob, APEX_REDUCTION_MEAN));
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
}

/* The cached half copy of a weight is refreshed after each step and across train/eval/train: every
 * forward equals the linear of freshly cast weights (Apex's test_cache). */
static void test_cast_cache_across_modes(void **state) {
  (void)state;
  net_t n = make_net(2, 0, 0.5f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));
  apex_graph *g = apex_graph_create(), *ref = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  apex_var *w = apex_model_find_param(n.m, "fc1.weight"), *b = apex_model_find_param(n.m, "fc1.bias");
  apex_tensor *xt = batch_x(3);
  const int modes[5] = {1, 1, 0, 1, 0};
  for (int it = 0; it < 5; it++) {
    apex_model_train(n.m, modes[it]);
    int prev = apex_graph_set_grad_enabled(g, modes[it]);
    apex_var *h = apex_linear(g, apex_graph_input(g, xt, 0), w, b);
    apex_var *h2 = apex_linear(g, apex_graph_input(g, xt, 0), w, b); /* second use: from the cache */
    apex_var *hr = apex_linear(ref, apex_cast(ref, apex_graph_input(ref, xt, 0), APEX_F16), apex_cast(ref, w, APEX_F16), apex_cast(ref, b, APEX_F16));
    size_t nb = apex_tensor_nbytes(apex_var_value(hr));
    assert_memory_equal(apex_tensor_data(apex_var_value(h)), apex_tensor_data(apex_var_value(hr)), nb);
    assert_memory_equal(apex_tensor_data(apex_var_value(h2)), apex_tensor_data(apex_var_value(hr)), nb);
    if (modes[it]) { /* a training step changes the weights */
      apex_var *loss = apex_mean_all(g, h);
      TU_OK(apex_amp_backward(amp, loss, 0, NULL));
      int skipped;
      TU_OK(apex_amp_step(amp, n.opt, &skipped));
      assert_int_equal(skipped, 0);
      TU_OK(apex_amp_zero_grad(amp));
    }
    apex_graph_set_grad_enabled(g, prev);
    apex_graph_reset(g);
    apex_graph_reset(ref);
  }
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_graph_destroy(ref);
  apex_amp_destroy(amp);
  free_net(n);
}

/* The cache ends with each backward (Apex clears it when scale_loss exits): a forward after the
 * optimizer step, in the same graph step (an evaluation before the reset), must see the new weights,
 * not the half copies cast before the step. The reference casts the current weights in a graph
 * without autocast. */
static void test_cast_cache_cleared_by_backward(void **state) {
  (void)state;
  net_t n = make_net(4, 0, 0.5f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));
  apex_graph *g = apex_graph_create(), *ref = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  apex_var *w = apex_model_find_param(n.m, "fc1.weight"), *b = apex_model_find_param(n.m, "fc1.bias");
  apex_tensor *xt = batch_x(5);
  for (int it = 0; it < 3; it++) {
    apex_var *h = apex_linear(g, apex_graph_input(g, xt, 0), w, b);
    size_t nb = apex_tensor_nbytes(apex_var_value(h));
    uint8_t *before = malloc(nb);
    memcpy(before, apex_tensor_data(apex_var_value(h)), nb);
    TU_OK(apex_amp_backward(amp, apex_mean_all(g, h), 0, NULL));
    int skipped;
    TU_OK(apex_amp_step(amp, n.opt, &skipped));
    assert_int_equal(skipped, 0);
    TU_OK(apex_amp_zero_grad(amp));
    /* Same graph step, no reset: evaluate with the stepped weights. */
    int prev = apex_graph_set_grad_enabled(g, 0);
    apex_var *h2 = apex_linear(g, apex_graph_input(g, xt, 0), w, b);
    apex_graph_set_grad_enabled(g, prev);
    apex_var *hr = apex_linear(ref, apex_cast(ref, apex_graph_input(ref, xt, 0), APEX_F16), apex_cast(ref, w, APEX_F16),
                               apex_cast(ref, b, APEX_F16));
    assert_non_null(h2);
    assert_int_equal(apex_tensor_dtype(apex_var_value(h2)), APEX_F16);
    if (memcmp(apex_tensor_data(apex_var_value(h2)), apex_tensor_data(apex_var_value(hr)), nb) != 0)
      fail_msg("iteration %d: the forward after the step used the weights' half copies from before it", it);
    assert_true(memcmp(before, apex_tensor_data(apex_var_value(hr)), nb) != 0); /* the step did change them */
    free(before);
    apex_graph_reset(g);
    apex_graph_reset(ref);
  }
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_graph_destroy(ref);
  apex_amp_destroy(amp);
  free_net(n);
}

/* User registrations as half and as promote (Apex's register_half_function /
 * register_promote_function; float is checked above): each op runs as its new category says, with
 * the values of the same op on explicitly cast inputs in a graph without autocast. */
static void test_register_half_and_promote(void **state) {
  (void)state;
  net_t n = make_net(6, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));
  apex_tensor *at = tu_random_tensor(APEX_F32, BATCH * IN, 71, 1.0f), *bt = tu_random_tensor(APEX_F32, BATCH * IN, 72, 1.0f);
  int64_t sa[2] = {BATCH, IN}, sb[2] = {IN, BATCH};
  apex_tensor *a2 = apex_tensor_view(at, 2, sa), *b2 = apex_tensor_view(bt, 2, sa), *bm = apex_tensor_view(bt, 2, sb);
  apex_graph *g = apex_graph_create(), *ref = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  /* Before any registration: add promotes (f32 + f32 stays f32), matmul is half. */
  apex_var *a = apex_graph_input(g, a2, 0), *b = apex_graph_input(g, b2, 0), *m = apex_graph_input(g, bm, 0);
  assert_int_equal(apex_tensor_dtype(apex_var_value(apex_add(g, a, b))), APEX_F32);
  assert_int_equal(apex_tensor_dtype(apex_var_value(apex_matmul(g, a, m))), APEX_F16);
  apex_graph_reset(g);
  TU_OK(apex_amp_register_op(amp, APEX_OP_ADD, APEX_CAST_HALF));
  TU_OK(apex_amp_register_op(amp, APEX_OP_MATMUL, APEX_CAST_PROMOTE));
  TU_OK(apex_amp_prepare_graph(amp, g));
  a = apex_graph_input(g, a2, 0);
  b = apex_graph_input(g, b2, 0);
  m = apex_graph_input(g, bm, 0);
  apex_var *ar = apex_graph_input(ref, a2, 0), *br = apex_graph_input(ref, b2, 0), *mr = apex_graph_input(ref, bm, 0);
  /* add as half: both f32 inputs run in f16. */
  apex_var *s = apex_add(g, a, b), *sr = apex_add(ref, apex_cast(ref, ar, APEX_F16), apex_cast(ref, br, APEX_F16));
  assert_int_equal(apex_tensor_dtype(apex_var_value(s)), APEX_F16);
  assert_memory_equal(apex_tensor_data(apex_var_value(s)), apex_tensor_data(apex_var_value(sr)), apex_tensor_nbytes(apex_var_value(sr)));
  /* matmul as promote: an f16 and an f32 input run in f32 (the widest). */
  apex_var *ah = apex_cast(g, a, APEX_F16);
  apex_var *p = apex_matmul(g, ah, m);
  apex_var *pr = apex_matmul(ref, apex_cast(ref, apex_cast(ref, ar, APEX_F16), APEX_F32), mr);
  assert_int_equal(apex_tensor_dtype(apex_var_value(p)), APEX_F32);
  assert_memory_equal(apex_tensor_data(apex_var_value(p)), apex_tensor_data(apex_var_value(pr)), apex_tensor_nbytes(apex_var_value(pr)));
  /* Two half inputs stay half under promote. */
  assert_int_equal(apex_tensor_dtype(apex_var_value(apex_matmul(g, ah, apex_cast(g, m, APEX_F16)))), APEX_F16);
  TU_FAILS(apex_amp_register_op(amp, APEX_OP_COUNT, APEX_CAST_HALF), APEX_ERR_INVALID_ARG, "out of range");
  TU_FAILS(apex_amp_register_op(amp, APEX_OP_ADD, (apex_cast_category)9), APEX_ERR_INVALID_ARG, "out of range");
  apex_graph_destroy(g);
  apex_graph_destroy(ref);
  apex_tensor_destroy(a2);
  apex_tensor_destroy(b2);
  apex_tensor_destroy(bm);
  apex_tensor_destroy(at);
  apex_tensor_destroy(bt);
  apex_amp_destroy(amp);
  free_net(n);
}

/* ---- O2 / O3 model casting ---------------------------------------------------------------------- */

static void test_o2_casts_model_keeps_bn_and_masters(void **state) {
  (void)state;
  net_t n = make_net(3, 1, 0.1f);
  uint8_t *before;
  size_t len;
  snapshot(n.m, &before, &len); /* all f32 */
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp));
  size_t at = 0;
  for (size_t i = 0; i < apex_model_num_params(n.m); i++) {
    const char *name;
    apex_var *v = apex_model_param(n.m, i, &name);
    int bn = strncmp(name, "bn.", 3) == 0;
    assert_int_equal(apex_model_param_in_batch_norm(n.m, i), bn);
    apex_tensor *t = apex_var_value(v);
    assert_int_equal(apex_tensor_dtype(t), bn ? APEX_F32 : APEX_F16);
    assert_int_equal(apex_tensor_dtype(apex_var_grad(v)), bn ? APEX_F32 : APEX_F16);
    /* The master is the exact f32 value from before the cast. */
    apex_tensor *master = apex_amp_master_param(amp, n.opt, 0, (int)i);
    assert_int_equal(apex_tensor_dtype(master), APEX_F32);
    assert_memory_equal(apex_tensor_data(master), before + at, apex_tensor_nbytes(master));
    at += apex_tensor_nbytes(master);
  }
  /* Forward: input cast in, f32 out. */
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  assert_int_equal(apex_graph_autocast_enabled(g), 0);
  apex_tensor *xt = batch_x(0);
  apex_var *y = apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, xt, 0));
  assert_non_null(y);
  assert_int_equal(apex_tensor_dtype(apex_var_value(y)), APEX_F32);
  apex_graph_reset(g);
  /* Training moves the masters and keeps the model copies equal to them rounded. */
  for (int s = 0; s < 3; s++) amp_step(amp, &n, g, s, NULL);
  for (size_t i = 0; i < apex_model_num_params(n.m); i++) {
    apex_tensor *t = apex_var_value(apex_model_param(n.m, i, NULL));
    apex_tensor *master = apex_amp_master_param(amp, n.opt, 0, (int)i);
    if (apex_tensor_dtype(t) == APEX_F32) { /* batch norm, kept f32: it is its own master */
      assert_ptr_equal(master, t);
      continue;
    }
    for (size_t k = 0; k < apex_tensor_numel(t); k++)
      assert_int_equal(tu_bits(apex_tensor_get(t, k)), tu_bits(apex_f16_to_f32(apex_f32_to_f16(apex_tensor_get(master, k)))));
  }
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
  free(before);
  /* O3: no masters; the f16 parameters are what the optimizer updates. */
  n = make_net(3, 1, 0.1f);
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O3"}, &amp));
  for (size_t i = 0; i < apex_model_num_params(n.m); i++) {
    apex_tensor *t = apex_var_value(apex_model_param(n.m, i, NULL));
    assert_int_equal(apex_tensor_dtype(t), APEX_F16); /* keep_batchnorm_fp32 is off at O3 */
    assert_ptr_equal(apex_amp_master_param(amp, n.opt, 0, (int)i), t);
  }
  apex_amp_destroy(amp);
  free_net(n);
}

/* ---- loss scaling -------------------------------------------------------------------------------- */

/* O2 gradients overflow f16 when the scale is too large: w * 4 summed gives d/dw = 4, and 4 * 2^14
 * and up is past f16's 65504. Each overflow halves the scale and skips the step (Apex's loss scale
 * decrease test: after k overflows the scale is init / 2^k and the unskipped count is 0). */
static void test_loss_scale_decrease(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 5});
  apex_module *lin = apex_linear_create(m, "w", 4, 1, 0);
  apex_var *w = apex_model_param(m, 0, NULL);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.01f});
  apex_tensor *p = apex_var_value(w), *gr = apex_var_grad(w);
  TU_OK(apex_optimizer_add_group(opt, &p, 1, &gr, 1, NULL, NULL));
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  int64_t shape[2] = {1, 4};
  apex_tensor *xt = apex_tensor_create(APEX_F32, 2, shape);
  apex_tensor_fill(xt, 4.0f);
  uint8_t *before, *after;
  size_t len;
  for (int k = 1; k <= 4; k++) {
    snapshot(m, &before, &len);
    apex_var *y = apex_amp_forward(amp, 0, lin, g, apex_graph_input(g, xt, 0));
    TU_OK(apex_amp_backward(amp, apex_sum_all(g, y), 0, NULL));
    int skipped;
    TU_OK(apex_amp_step(amp, opt, &skipped));
    snapshot(m, &after, &len);
    apex_loss_scaler_state st = apex_loss_scaler_get_state(apex_amp_loss_scaler(amp, 0));
    if (k <= 3) {
      assert_int_equal(skipped, 1);
      assert_true(apex_amp_loss_scale(amp, 0) == ldexpf(65536.0f, -k));
      assert_int_equal(st.growth_tracker, 0);
      assert_memory_equal(before, after, len); /* nothing stepped */
    } else { /* 4 * 8192 = 32768 fits */
      assert_int_equal(skipped, 0);
      assert_true(apex_amp_loss_scale(amp, 0) == 8192.0f);
      assert_int_equal(st.growth_tracker, 1);
      assert_true(memcmp(before, after, len) != 0);
    }
    free(before);
    free(after);
    TU_OK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
  }
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
}

/* With the dynamic scale already at its minimum, an overflowing gradient is a skipped step like any
 * other: backward and step return APEX_OK, *skipped is 1, the weights keep their bits, and
 * apex_amp_scale_at_min says the minimum was hit. A non-finite loss at the minimum is reported the
 * same way (backward says APEX_ERR_NONFINITE, as above the minimum). A clean step clears the query.
 * The gradient of sum(w * x) is scale * x: with x = 4 and scale 2^16 it is 2^18, past f16's range. */
static void test_overflow_at_min_scale_is_a_skip(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 9});
  apex_module *lin = apex_linear_create(m, "w", 4, 1, 0);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.1f});
  TU_OK(apex_optimizer_add_model(opt, m, NULL, NULL));
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&m, 1, &opt, 1,
                            &(apex_amp_config){.opt_level = "O2", .min_loss_scale = 65536.0f, .max_loss_scale = 65536.0f}, &amp));
  apex_graph *g = apex_graph_create();
  int64_t shape[2] = {1, 4};
  apex_tensor *xt = apex_tensor_create(APEX_F32, 2, shape);
  uint8_t *before, *after;
  size_t len;
  /* it 0, 1: gradient overflow at the minimum; 2: a NaN loss at the minimum; 3: a clean step. */
  const float xs[4] = {4.0f, 4.0f, NAN, 0.125f}; /* 2^16 * 0.125 fits; the step moves w by 0.0125 */
  for (int it = 0; it < 4; it++) {
    apex_tensor_fill(xt, xs[it]);
    snapshot(m, &before, &len);
    apex_var *y = apex_amp_forward(amp, 0, lin, g, apex_graph_input(g, xt, 0));
    apex_status want = it == 2 ? APEX_ERR_NONFINITE : APEX_OK;
    assert_int_equal(apex_amp_backward(amp, apex_sum_all(g, y), 0, NULL), want);
    int skipped = -1;
    TU_OK(apex_amp_step(amp, opt, &skipped));
    snapshot(m, &after, &len);
    assert_true(apex_amp_loss_scale(amp, 0) == 65536.0f);
    apex_loss_scaler_state st = apex_loss_scaler_get_state(apex_amp_loss_scaler(amp, 0));
    if (it < 3) {
      assert_int_equal(skipped, 1);
      assert_int_equal(apex_amp_scale_at_min(amp, 0), 1);
      assert_int_equal(st.skipped, it + 1);
      assert_memory_equal(before, after, len);
    } else {
      assert_int_equal(skipped, 0);
      assert_int_equal(apex_amp_scale_at_min(amp, 0), 0);
      assert_int_equal(st.skipped, 3);
      assert_true(memcmp(before, after, len) != 0);
    }
    free(before);
    free(after);
    TU_OK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
  }
  assert_int_equal(apex_amp_scale_at_min(amp, 1), 0);
  tu_assert_message("no loss scaler 1");
  assert_int_equal(apex_amp_scale_at_min(NULL, 0), 0);
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
}

/* ---- graphs are prepared by the amp that sees them --------------------------------------------------- */

/* Forgetting apex_amp_prepare_graph used to train O1 in f32. Now apex_amp_forward prepares the graph
 * the first time it sees it (the same bits as an explicit prepare), once only (a region with casts
 * turned off stays off), again after apex_amp_register_op; and a loss from a graph that no
 * forward or prepare of this amp touched is refused before anything runs. */
static void test_forward_prepares_graph(void **state) {
  (void)state;
  net_t n = make_net(81, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));
  apex_tensor *xt = batch_x(0);
  int64_t y[BATCH];
  batch_y(0, y);
  apex_graph *g = apex_graph_create(), *ref = apex_graph_create();
  assert_int_equal(apex_graph_autocast_enabled(g), 0);
  TU_OK(apex_amp_prepare_graph(amp, ref));
  apex_var *out = apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, xt, 0));
  apex_var *out_ref = apex_amp_forward(amp, 0, n.net, ref, apex_graph_input(ref, xt, 0));
  assert_int_equal(apex_graph_autocast_enabled(g), 1);
  assert_int_equal(apex_tensor_dtype(apex_var_value(out)), APEX_F16); /* fc2 ran in half: autocast was on */
  assert_memory_equal(apex_tensor_data(apex_var_value(out)), apex_tensor_data(apex_var_value(out_ref)),
                      apex_tensor_nbytes(apex_var_value(out_ref)));
  apex_graph_reset(g);
  /* Casts off in a region: the next forward leaves them off (f32 out). */
  assert_int_equal(apex_amp_casts_enabled(amp, g, 0), 1);
  out = apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, xt, 0));
  assert_int_equal(apex_tensor_dtype(apex_var_value(out)), APEX_F32);
  assert_int_equal(apex_amp_casts_enabled(amp, g, 1), 0);
  apex_graph_reset(g);
  /* A registration reaches a graph prepared before it at that graph's next forward: relu as float
   * makes the net's last layer see an f32 input, and linear stays half. */
  TU_OK(apex_amp_register_op(amp, APEX_OP_LINEAR, APEX_CAST_FLOAT));
  out = apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, xt, 0));
  assert_int_equal(apex_tensor_dtype(apex_var_value(out)), APEX_F32);
  apex_graph_reset(g);
  apex_graph_reset(ref);
  /* A graph amp never saw: its forward ran in f32; amp refuses the loss, changing nothing. */
  apex_graph *raw = apex_graph_create();
  apex_var *loss = apex_cross_entropy(raw, apex_module_forward(n.net, raw, apex_graph_input(raw, xt, 0)), y, NULL);
  assert_non_null(loss);
  apex_loss_scaler_state st0 = apex_loss_scaler_get_state(apex_amp_loss_scaler(amp, 0));
  TU_FAILS(apex_amp_backward(amp, loss, 0, NULL), APEX_ERR_STATE, "apex_amp_prepare_graph");
  apex_loss_scaler_state st1 = apex_loss_scaler_get_state(apex_amp_loss_scaler(amp, 0));
  tu_assert_scaler_state_equal(&st0, &st1);
  for (size_t i = 0; i < apex_model_num_params(n.m); i++) { /* backward did not run */
    apex_tensor *gr = apex_var_grad(apex_model_param(n.m, i, NULL));
    for (size_t k = 0; k < apex_tensor_numel(gr); k++) assert_true(apex_tensor_get(gr, k) == 0.0f);
  }
  apex_graph_reset(raw);
  /* Prepared explicitly, the same graph is accepted. */
  TU_OK(apex_amp_prepare_graph(amp, raw));
  loss = apex_cross_entropy(raw, apex_module_forward(n.net, raw, apex_graph_input(raw, xt, 0)), y, NULL);
  TU_OK(apex_amp_backward(amp, loss, 0, NULL));
  TU_OK(apex_amp_step(amp, n.opt, NULL));
  apex_graph_destroy(raw);
  apex_graph_destroy(g);
  apex_graph_destroy(ref);
  apex_tensor_destroy(xt);
  apex_amp_destroy(amp);
  free_net(n);
}

/* The README's chain fails instead of crashing: a bad model index makes apex_amp_forward return NULL,
 * and the accessors after it answer NULL with an invalid value, keeping the first failure's message. */
static void test_null_chain(void **state) {
  (void)state;
  net_t n = make_net(82, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));
  apex_graph *g = apex_graph_create();
  apex_tensor *xt = batch_x(0);
  assert_int_equal(apex_tensor_dtype(apex_var_value(apex_amp_forward(amp, 7, n.net, g, apex_graph_input(g, xt, 0)))),
                   APEX_DTYPE_COUNT);
  tu_assert_message("apex_tensor_dtype: NULL tensor");
  tu_assert_message("apex_var_value: NULL var");
  tu_assert_message("apex_amp_forward: model 7");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_int_equal(apex_tensor_ndim(apex_var_grad(NULL)), -1);
  assert_int_equal(apex_var_requires_grad(NULL), 0);
  assert_int_equal(apex_var_op(NULL), APEX_OP_COUNT);
  assert_null(apex_var_graph(NULL));
  assert_true(isnan(apex_var_item(NULL)));
  tu_assert_message("apex_var_item: NULL var");
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
}

/* A failed initialize leaves the caller's handle as it was (it used to write NULL over it). */
static void test_failed_initialize_keeps_out(void **state) {
  (void)state;
  net_t a = make_net(83, 0, 0.1f), b = make_net(84, 0, 0.1f);
  apex_amp *first;
  TU_OK(apex_amp_initialize(&a.m, 1, &a.opt, 1, NULL, &first));
  apex_amp *out = first;
  TU_FAILS(apex_amp_initialize(&b.m, 1, &a.opt, 1, NULL, &out), APEX_ERR_INVALID_ARG, "belongs to none");
  assert_ptr_equal(out, first);
  TU_FAILS(apex_amp_initialize(&b.m, 1, &b.opt, 1, &(apex_amp_config){.opt_level = "O7"}, &out), APEX_ERR_INVALID_ARG, "O7");
  assert_ptr_equal(out, first);
  TU_FAILS(apex_amp_initialize(&a.m, 1, &a.opt, 1, NULL, &out), APEX_ERR_INVALID_ARG, "already initialised");
  assert_ptr_equal(out, first);
  apex_amp_destroy(first);
  free_net(a);
  free_net(b);
}

/* Two models, two optimizers, two losses with scales 4 and 16 (set on the scalers as Apex's test
 * does), SGD with momentum; model 1 gets gradients from both losses, so the second loss's unscale adds
 * to what the first left. An Inf injected into one iteration's input makes both losses non-finite:
 * that iteration is skipped, and the final parameters equal a run that leaves the iteration out. */
static void run_two_losses(const char *level, int inject_at, int leave_out, uint8_t **params, size_t *len) {
  /* level NULL: the same training without amp, gradients of both losses summed by autograd. */
  net_t a = make_net(11, 0, 0.25f), b = make_net(12, 0, 0.5f);
  apex_model *models[2] = {a.m, b.m};
  apex_optimizer *opts[2] = {a.opt, b.opt};
  apex_amp *amp;
  TU_OK(apex_amp_initialize(models, 2, opts, 2,
                            &(apex_amp_config){.opt_level = level ? level : "O0", .num_losses = 2, .disabled = !level}, &amp));
  for (int l = 0; level && l < 2; l++) {
    apex_loss_scaler_state st = apex_loss_scaler_get_state(apex_amp_loss_scaler(amp, l));
    st.scale = l ? 16.0f : 4.0f;
    TU_OK(apex_loss_scaler_set_state(apex_amp_loss_scaler(amp, l), &st));
  }
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  for (int it = 0; it < 6; it++) {
    if (it == leave_out) continue;
    apex_tensor *x = batch_x(it);
    if (it == inject_at) apex_tensor_set(x, 3, INFINITY);
    int64_t y[BATCH];
    batch_y(it, y);
    apex_var *xi = apex_graph_input(g, x, 0);
    apex_var *loss0 = apex_add(g, apex_cross_entropy(g, apex_amp_forward(amp, 0, a.net, g, xi), y, NULL),
                               apex_cross_entropy(g, apex_amp_forward(amp, 1, b.net, g, xi), y, NULL));
    apex_var *loss1 = apex_mean_all(g, apex_amp_forward(amp, 1, b.net, g, xi));
    apex_amp_backward_options both = {.optimizers = opts, .n_optimizers = 2, .retain_graph = 1};
    apex_amp_backward_options only_b = {.optimizers = &opts[1], .n_optimizers = 1};
    apex_status want = it == inject_at ? APEX_ERR_NONFINITE : APEX_OK;
    assert_int_equal(apex_amp_backward(amp, loss0, 0, &both), want);
    assert_int_equal(apex_amp_backward(amp, loss1, 1, &only_b), want);
    int s0, s1;
    TU_OK(apex_amp_step(amp, a.opt, &s0));
    TU_OK(apex_amp_step(amp, b.opt, &s1));
    assert_int_equal(s0, it == inject_at);
    assert_int_equal(s1, it == inject_at);
    TU_OK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    apex_tensor_destroy(x);
  }
  uint8_t *pa, *pb;
  size_t la, lb;
  snapshot(a.m, &pa, &la);
  snapshot(b.m, &pb, &lb);
  *params = malloc(la + lb);
  memcpy(*params, pa, la);
  memcpy(*params + la, pb, lb);
  *len = la + lb;
  free(pa);
  free(pb);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(a);
  free_net(b);
}

static void test_two_models_two_losses_skip(void **state) {
  (void)state;
  const char *levels[4] = {"O0", "O1", "O2", "O3"};
  for (int l = 0; l < 4; l++) {
    uint8_t *injected, *reference;
    size_t li, lr;
    run_two_losses(levels[l], 3, -1, &injected, &li);
    run_two_losses(levels[l], -1, 3, &reference, &lr);
    assert_int_equal(li, lr);
    if (memcmp(injected, reference, li) != 0) fail_msg("%s: the skipped iteration left a trace", levels[l]);
    free(injected);
    free(reference);
  }
  /* At O0 the scales 4 and 16 are exact, so unscaling each loss and adding the results must give the
   * bits of plain f32 training, where autograd sums the two losses' gradients. */
  uint8_t *amp_run, *plain;
  size_t la, lp;
  run_two_losses("O0", -1, -1, &amp_run, &la);
  run_two_losses(NULL, -1, -1, &plain, &lp);
  assert_int_equal(la, lp);
  assert_memory_equal(amp_run, plain, la);
  free(amp_run);
  free(plain);
}

/* ---- checkpointing: bitwise resume ---------------------------------------------------------------- */

typedef struct {
  uint8_t *params, *opt, *amp;
  size_t params_len, opt_len, amp_len;
} saved_state;

static void save_all(net_t *n, apex_amp *amp, saved_state *s) {
  snapshot(n->m, &s->params, &s->params_len);
  TU_OK(apex_optimizer_state_size(n->opt, &s->opt_len));
  s->opt = malloc(s->opt_len);
  TU_OK(apex_optimizer_save(n->opt, s->opt, s->opt_len, NULL));
  s->amp_len = apex_amp_state_size(amp);
  s->amp = malloc(s->amp_len);
  TU_OK(apex_amp_state_save(amp, s->amp, s->amp_len));
}

static void load_all(net_t *n, apex_amp *amp, const saved_state *s) {
  size_t at = 0;
  for (size_t i = 0; i < apex_model_num_params(n->m); i++) {
    apex_tensor *t = apex_var_value(apex_model_param(n->m, i, NULL));
    memcpy(apex_tensor_data(t), s->params + at, apex_tensor_nbytes(t));
    at += apex_tensor_nbytes(t);
  }
  assert_int_equal(at, s->params_len);
  TU_OK(apex_optimizer_load(n->opt, s->opt, s->opt_len));
  TU_OK(apex_amp_state_load(amp, s->amp, s->amp_len));
}

/* Losses of `steps` steps from `first`; two losses when num_losses == 2 (the second a scaled copy). */
static void train_range(apex_amp *amp, net_t *n, int first, int steps, int num_losses, float *losses) {
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  for (int s = first; s < first + steps; s++) {
    apex_tensor *x = batch_x(s);
    int64_t y[BATCH];
    batch_y(s, y);
    apex_var *out = apex_amp_forward(amp, 0, n->net, g, apex_graph_input(g, x, 0));
    apex_var *loss = apex_cross_entropy(g, out, y, NULL);
    losses[s] = apex_var_item(loss);
    apex_amp_backward_options keep = {.retain_graph = num_losses == 2};
    TU_OK(apex_amp_backward(amp, loss, 0, &keep));
    if (num_losses == 2) TU_OK(apex_amp_backward(amp, apex_mean_all(g, out), 1, NULL));
    TU_OK(apex_amp_step(amp, n->opt, NULL));
    TU_OK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    apex_tensor_destroy(x);
  }
  apex_graph_destroy(g);
}

static void test_bitwise_resume(void **state) {
  (void)state;
  const char *levels[4] = {"O0", "O1", "O2", "O3"};
  /* f16; bf16 (whose products run through oneDNN on AVX512_BF16/AMX CPUs: gemm_onednn.c) with dynamic
   * scaling asked for explicitly; and bf16 with its default, no loss scaling (l >= 8). */
  for (int l = 0; l < 12; l++)
    for (int nl = 1; nl <= 2; nl++) {
      if (l == 4 || l == 8) continue; /* O0 has no half type */
      int dyn = (l % 4 == 1 || l % 4 == 2) && l < 8;
      apex_amp_config cfg = {.opt_level = levels[l % 4], .num_losses = nl, .scale_window = dyn ? 3 : 0,
                             .loss_scale = dyn && l >= 4 ? APEX_AMP_DYNAMIC : 0.0f,
                             .half_type = l < 4 ? APEX_AMP_CAST_DEFAULT : APEX_AMP_CAST_BF16};
      float straight[10], resumed[10];
      net_t a = make_net(21, 1, 0.1f);
      apex_amp *amp;
      TU_OK(apex_amp_initialize(&a.m, 1, &a.opt, 1, &cfg, &amp));
      train_range(amp, &a, 0, 10, nl, straight);
      uint8_t *final_straight;
      size_t len;
      snapshot(a.m, &final_straight, &len);
      apex_amp_destroy(amp);
      free_net(a);

      net_t b = make_net(21, 1, 0.1f);
      TU_OK(apex_amp_initialize(&b.m, 1, &b.opt, 1, &cfg, &amp));
      train_range(amp, &b, 0, 5, nl, resumed);
      saved_state s;
      save_all(&b, amp, &s);
      apex_amp_destroy(amp);
      free_net(b);

      net_t c = make_net(99, 1, 0.1f); /* another seed: everything must come from the checkpoint */
      TU_OK(apex_amp_initialize(&c.m, 1, &c.opt, 1, &cfg, &amp));
      load_all(&c, amp, &s);
      train_range(amp, &c, 5, 5, nl, resumed);
      uint8_t *final_resumed;
      snapshot(c.m, &final_resumed, &len);
      for (int i = 0; i < 10; i++)
        if (tu_bits(straight[i]) != tu_bits(resumed[i]))
          fail_msg("%s %s, %d losses: loss %d differs", levels[l % 4], l < 4 ? "f16" : "bf16", nl, i);
      assert_memory_equal(final_straight, final_resumed, len);
      free(final_straight);
      free(final_resumed);
      free(s.params);
      free(s.opt);
      free(s.amp);
      apex_amp_destroy(amp);
      free_net(c);
    }
}

/* ---- disabled amp, accumulation, FP16 state ------------------------------------------------------- */

/* enabled = false: the same bits as the program without amp. */
static void test_disabled_is_identity(void **state) {
  (void)state;
  net_t a = make_net(31, 0, 0.1f), b = make_net(31, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&a.m, 1, &a.opt, 1, &(apex_amp_config){.opt_level = "O2", .disabled = 1}, &amp));
  assert_true(apex_amp_loss_scale(amp, 0) == 1.0f);
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  for (int s = 0; s < 4; s++) amp_step(amp, &a, g, s, NULL);
  for (int s = 0; s < 4; s++) { /* plain f32 program */
    apex_tensor *x = batch_x(s);
    int64_t y[BATCH];
    batch_y(s, y);
    apex_var *loss = apex_cross_entropy(g, apex_module_forward(b.net, g, apex_graph_input(g, x, 0)), y, NULL);
    TU_OK(apex_backward(loss, NULL));
    TU_OK(apex_optimizer_step(b.opt, 1.0f, 0));
    TU_OK(apex_model_zero_grad(b.m));
    apex_graph_reset(g);
    apex_tensor_destroy(x);
  }
  uint8_t *pa, *pb;
  size_t la, lb;
  snapshot(a.m, &pa, &la);
  snapshot(b.m, &pb, &lb);
  assert_int_equal(la, lb);
  assert_memory_equal(pa, pb, la);
  free(pa);
  free(pb);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(a);
  free_net(b);
}

/* Gradient accumulation with delay_unscale over two micro-batches equals plain accumulation in f32
 * (O0 with a dynamic scale of 2^16: scaling is exact). */
static void test_delay_unscale_accumulation(void **state) {
  (void)state;
  net_t a = make_net(41, 0, 0.1f), b = make_net(41, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&a.m, 1, &a.opt, 1, &(apex_amp_config){.opt_level = "O0", .loss_scale = APEX_AMP_DYNAMIC}, &amp));
  assert_true(apex_amp_loss_scale(amp, 0) == 65536.0f);
  apex_graph *g = apex_graph_create(), *gb = apex_graph_create();
  for (int it = 0; it < 3; it++)
    for (int micro = 0; micro < 2; micro++) {
      apex_tensor *x = batch_x(it * 2 + micro);
      int64_t y[BATCH];
      batch_y(it * 2 + micro, y);
      apex_var *la = apex_cross_entropy(g, apex_amp_forward(amp, 0, a.net, g, apex_graph_input(g, x, 0)), y, NULL);
      apex_amp_backward_options o = {.delay_unscale = micro == 0};
      TU_OK(apex_amp_backward(amp, la, 0, &o));
      if (micro == 0) TU_FAILS(apex_amp_step(amp, a.opt, NULL), APEX_ERR_STATE, "still scaled");
      apex_var *lb = apex_cross_entropy(gb, apex_module_forward(b.net, gb, apex_graph_input(gb, x, 0)), y, NULL);
      TU_OK(apex_backward(lb, NULL));
      if (micro == 1) {
        TU_OK(apex_amp_step(amp, a.opt, NULL));
        TU_OK(apex_amp_zero_grad(amp));
        TU_OK(apex_optimizer_step(b.opt, 1.0f, 0));
        TU_OK(apex_model_zero_grad(b.m));
      }
      apex_graph_reset(g);
      apex_graph_reset(gb);
      apex_tensor_destroy(x);
    }
  uint8_t *pa, *pb;
  size_t la, lb;
  snapshot(a.m, &pa, &la);
  snapshot(b.m, &pb, &lb);
  assert_memory_equal(pa, pb, la);
  free(pa);
  free(pb);
  apex_graph_destroy(g);
  apex_graph_destroy(gb);
  apex_amp_destroy(amp);
  free_net(a);
  free_net(b);
}

/* What amp prints to stderr while fn(arg) runs, NUL-terminated in buf. */
static void capture_stderr(void (*fn)(void *), void *arg, char *buf, size_t size) {
  fflush(stderr);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  int saved = dup(fileno(stderr));
  assert_true(saved >= 0);
  assert_true(dup2(fileno(tmp), fileno(stderr)) >= 0);
  fn(arg);
  fflush(stderr);
  dup2(saved, fileno(stderr));
  close(saved);
  rewind(tmp);
  size_t got = fread(buf, 1, size - 1, tmp);
  buf[got] = '\0';
  fclose(tmp);
}

/* One O2 step whose f16 gradients overflow at the default scale 2^16 (d/dw of sum(4 * w) is 4, and
 * 4 * 2^16 is past f16's 65504), at the verbosity given. */
static void overflow_step(void *arg) {
  int verbosity = *(int *)arg;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 5});
  apex_module *lin = apex_linear_create(m, "w", 4, 1, 0);
  apex_var *w = apex_model_param(m, 0, NULL);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.01f});
  apex_tensor *p = apex_var_value(w), *gr = apex_var_grad(w);
  TU_OK(apex_optimizer_add_group(opt, &p, 1, &gr, 1, NULL, NULL));
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = "O2", .verbosity = verbosity}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  int64_t shape[2] = {1, 4};
  apex_tensor *xt = apex_tensor_create(APEX_F32, 2, shape);
  apex_tensor_fill(xt, 4.0f);
  apex_var *y = apex_amp_forward(amp, 0, lin, g, apex_graph_input(g, xt, 0));
  TU_OK(apex_amp_backward(amp, apex_sum_all(g, y), 0, NULL));
  int skipped;
  TU_OK(apex_amp_step(amp, opt, &skipped));
  assert_int_equal(skipped, 1);
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
}

/* At verbosity >= 1 amp prints the properties and Apex's line for a skipped step; at 0 nothing. */
static void test_overflow_message(void **state) {
  (void)state;
  char out[4096];
  int verbosity = 1;
  capture_stderr(overflow_step, &verbosity, out, sizeof out);
  if (!strstr(out, "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0\n"))
    fail_msg("no overflow line in: %s", out);
  assert_non_null(strstr(out, "Selected optimization level O2"));
  verbosity = 0;
  capture_stderr(overflow_step, &verbosity, out, sizeof out);
  assert_string_equal(out, "");
}

/* cast_model_outputs: O2 returns the model's outputs in the type asked for, f32 by default. */
static void test_cast_model_outputs(void **state) {
  (void)state;
  const apex_amp_cast asked[3] = {APEX_AMP_CAST_DEFAULT, APEX_AMP_CAST_F16, APEX_AMP_CAST_BF16};
  const apex_dtype want[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int i = 0; i < 3; i++) {
    net_t n = make_net(7, 1, 0.1f);
    apex_amp *amp;
    TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O2", .cast_model_outputs = asked[i]}, &amp));
    apex_graph *g = apex_graph_create();
    TU_OK(apex_amp_prepare_graph(amp, g));
    apex_tensor *xt = batch_x(0);
    apex_var *y = apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, xt, 0));
    assert_non_null(y);
    assert_int_equal(apex_tensor_dtype(apex_var_value(y)), want[i]);
    apex_tensor_destroy(xt);
    apex_graph_destroy(g);
    apex_amp_destroy(amp);
    free_net(n);
  }
}

/* Clipping through master_params (torch.nn.utils.clip_grad_norm_(amp.master_params(opt), max_norm)) at
 * O2: the norm is that of the unscaled f32 master gradients, computed here in double, and the step
 * moves each f32 master by lr * g * max_norm / (norm + 1e-6) (SGD's first momentum step is the
 * gradient itself). */
static void test_clip_master_grads(void **state) {
  (void)state;
  const float lr = 0.25f;
  net_t n = make_net(8, 1, lr);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  apex_tensor *xt = batch_x(9);
  int64_t y[BATCH];
  batch_y(9, y);
  apex_var *loss = apex_cross_entropy(g, apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, xt, 0)), y, NULL);
  TU_OK(apex_amp_backward(amp, loss, 0, NULL));
  int np = (int)apex_model_num_params(n.m);
  double sq = 0;
  size_t total = 0;
  for (int i = 0; i < np; i++) {
    apex_tensor *gm = apex_optimizer_grad(n.opt, 0, i);
    assert_int_equal(apex_tensor_dtype(gm), APEX_F32); /* master gradients, f32 behind f16 params too */
    for (size_t k = 0; k < apex_tensor_numel(gm); k++) sq += (double)apex_tensor_get(gm, k) * apex_tensor_get(gm, k);
    total += apex_tensor_numel(gm);
  }
  double norm = sqrt(sq);
  assert_true(norm > 0);
  float max_norm = (float)(norm / 4), got;
  float *g0 = malloc(total * sizeof *g0), *m0 = malloc(total * sizeof *m0);
  size_t at = 0;
  for (int i = 0; i < np; i++) {
    apex_tensor *gm = apex_optimizer_grad(n.opt, 0, i), *mm = apex_amp_master_param(amp, n.opt, 0, i);
    for (size_t k = 0; k < apex_tensor_numel(gm); k++, at++) {
      g0[at] = apex_tensor_get(gm, k);
      m0[at] = apex_tensor_get(mm, k);
    }
  }
  TU_OK(apex_amp_clip_grad_norm(amp, n.opt, max_norm, &got));
  if (fabs(got - norm) > 1e-5 * norm) fail_msg("norm %.9g, expected %.9g", got, norm);
  int skipped;
  TU_OK(apex_amp_step(amp, n.opt, &skipped));
  assert_int_equal(skipped, 0);
  double coef = max_norm / (norm + 1e-6);
  at = 0;
  for (int i = 0; i < np; i++) {
    apex_tensor *mm = apex_amp_master_param(amp, n.opt, 0, i);
    for (size_t k = 0; k < apex_tensor_numel(mm); k++, at++) {
      double want = m0[at] - lr * (g0[at] * coef);
      double tol = 1e-6 * fmax(fabs(want), 1.0);
      if (fabs(apex_tensor_get(mm, k) - want) > tol) fail_msg("param %d element %zu: %.9g, expected %.9g", i, k, apex_tensor_get(mm, k), want);
    }
  }
  assert_int_equal(at, total);
  TU_FAILS(apex_amp_clip_grad_norm(amp, NULL, 1.0f, NULL), APEX_ERR_INVALID_ARG, "unknown optimizer");
  free(g0);
  free(m0);
  apex_tensor_destroy(xt);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
}

static void test_bad_input(void **state) {
  (void)state;
  net_t a = make_net(51, 0, 0.1f), b = make_net(52, 0, 0.1f);
  apex_amp *amp = NULL, *again = NULL;
  /* An optimizer over parameters of no given model. */
  TU_FAILS(apex_amp_initialize(&a.m, 1, &b.opt, 1, NULL, &amp), APEX_ERR_INVALID_ARG, "belongs to none of the models");
  assert_null(amp);
  TU_FAILS(apex_amp_initialize(&a.m, 1, &a.opt, 1, &(apex_amp_config){.opt_level = "O1", .master_weights = APEX_AMP_ON}, &amp),
           APEX_ERR_INVALID_ARG, "master_weights");
  apex_model *twice[2] = {a.m, a.m};
  TU_FAILS(apex_amp_initialize(twice, 2, &a.opt, 1, NULL, &amp), APEX_ERR_INVALID_ARG, "given twice");
  TU_OK(apex_amp_initialize(&a.m, 1, &a.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp));
  /* The same model again: refused, and the first amp is untouched. */
  TU_FAILS(apex_amp_initialize(&a.m, 1, &a.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &again), APEX_ERR_INVALID_ARG,
           "already initialised");
  assert_null(again);
  apex_graph *g = apex_graph_create();
  apex_tensor *x = batch_x(0);
  apex_var *loss = apex_mean_all(g, apex_amp_forward(amp, 0, a.net, g, apex_graph_input(g, x, 0)));
  TU_FAILS(apex_amp_backward(amp, loss, 1, NULL), APEX_ERR_INVALID_ARG, "num_losses = 1");
  TU_FAILS(apex_amp_backward(amp, NULL, 0, NULL), APEX_ERR_INVALID_ARG, "NULL");
  TU_FAILS(apex_amp_step(amp, b.opt, NULL), APEX_ERR_INVALID_ARG, "not managed");
  apex_amp_backward_options foreign = {.optimizers = &b.opt, .n_optimizers = 1};
  TU_FAILS(apex_amp_backward(amp, loss, 0, &foreign), APEX_ERR_INVALID_ARG, "not managed");
  assert_null(apex_amp_forward(amp, 3, a.net, g, apex_graph_input(g, x, 0)));
  tu_assert_message("model 3");
  assert_true(isnan(apex_amp_loss_scale(amp, 5)));
  uint8_t buf[8] = {0};
  TU_FAILS(apex_amp_state_load(amp, buf, sizeof buf), APEX_ERR_CORRUPT, "1 losses");
  apex_tensor_destroy(x);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  /* Destroying releases the model: it can be initialised again. */
  TU_OK(apex_amp_initialize(&b.m, 1, &b.opt, 1, NULL, &again));
  apex_amp_destroy(again);
  free_net(a);
  free_net(b);
}

/* ---- the fused end of backward at O2 bf16 ------------------------------------------------------- */

static apex_status no_op_hook(void *ctx) {
  (void)ctx;
  return APEX_OK;
}

/* Trains 6 steps at O2 bf16 (batch norm in f32 included) and returns, after every backward, the
 * master gradients' bytes and, after every step, the parameters' bytes. unfused: a before_unscale
 * hook (which must see the bf16 gradients) keeps the engine's flush, the unscale and the zeroing as
 * separate passes; without it they are one pass. stale: a non-zero value is left in fc1's bf16
 * gradient before each backward (as a plain apex_backward would leave one), which both paths must
 * add in and then clear. Checks that every model gradient behind a master is zero after each
 * backward. dynamic: loss_scale = APEX_AMP_DYNAMIC, and step 3 overflows and is skipped. */
static uint8_t *train_fused(int unfused, int stale, int dynamic, size_t *len, size_t *pool, size_t *sums) {
  net_t n = make_net(83, 1, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1,
                            &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16,
                                               .loss_scale = dynamic ? APEX_AMP_DYNAMIC : 0.0f}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  size_t np = apex_model_num_params(n.m), one = 0;
  for (size_t i = 0; i < np; i++) {
    apex_tensor *mg = apex_optimizer_grad(n.opt, 0, (int)i);
    one += apex_tensor_nbytes(mg);
  }
  uint8_t *snap;
  size_t plen;
  snapshot(n.m, &snap, &plen);
  free(snap);
  uint8_t *all = malloc(6 * (one + plen));
  size_t at = 0;
  for (int step = 0; step < 6; step++) {
    apex_tensor *x = batch_x(step);
    if (dynamic && step == 3) apex_tensor_set(x, 5, 1e38f); /* gradients past bf16's range at scale 65536 */
    int64_t y[BATCH];
    batch_y(step, y);
    if (stale) TU_OK(apex_tensor_fill(apex_var_grad(apex_model_find_param(n.m, "fc1.weight")), 0.375f));
    apex_var *loss = apex_cross_entropy(g, apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, x, 0)), y, NULL);
    assert_non_null(loss);
    TU_OK(apex_amp_backward(amp, loss, 0, &(apex_amp_backward_options){.before_unscale = unfused ? no_op_hook : NULL}));
    if (pool && apex_graph_pool_bytes(g) > *pool) *pool = apex_graph_pool_bytes(g);
    for (size_t i = 0; i < np; i++) {
      apex_var *v = apex_model_param(n.m, i, NULL);
      apex_tensor *mg = apex_optimizer_grad(n.opt, 0, (int)i);
      memcpy(all + at, apex_tensor_data(mg), apex_tensor_nbytes(mg));
      at += apex_tensor_nbytes(mg);
      if (sums && step == 0 && apex_amp_master_of(amp, v)) *sums += 4 * apex_tensor_numel(apex_var_value(v));
      if (apex_amp_master_of(amp, v)) { /* the bf16 gradient was consumed: zero, as after the unscale */
        apex_tensor *gr = apex_var_grad(v);
        for (size_t e = 0; e < apex_tensor_numel(gr); e++)
          if (tu_bits(apex_tensor_get(gr, e)) != 0) fail_msg("param %zu: bf16 grad %zu not zeroed after the backward", i, e);
      }
    }
    int skipped;
    TU_OK(apex_amp_step(amp, n.opt, &skipped));
    assert_int_equal(skipped, dynamic && step == 3);
    TU_OK(apex_amp_zero_grad(amp));
    snapshot(n.m, &snap, &plen);
    memcpy(all + at, snap, plen);
    at += plen;
    free(snap);
    apex_graph_reset(g);
    apex_tensor_destroy(x);
  }
  *len = at;
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
  return all;
}

/* The fused flush + unscale gives the bits of the separate passes: master gradients after every
 * backward and parameters after every step, with bf16's default (no scaling) and with dynamic
 * scaling (overflow skip included), with and without a stale value in a bf16 gradient. */
static void test_fused_flush_unscale(void **state) {
  (void)state;
  for (int dynamic = 0; dynamic < 2; dynamic++)
    for (int stale = 0; stale < 2; stale++) {
      size_t la, lb, pool_a = 0, pool_b = 0, sums = 0;
      uint8_t *a = train_fused(0, stale, dynamic, &la, &pool_a, &sums), *b = train_fused(1, stale, dynamic, &lb, &pool_b, NULL);
      assert_int_equal(la, lb);
      if (memcmp(a, b, la)) fail_msg("dynamic %d, stale %d: the fused flush + unscale changed the bits", dynamic, stale);
      /* fused, the backward collects the bf16 leaves' f32 sums in their masters' gradients: the graph's pool
       * holds no f32 copy of them (apex__leaf_sum_into), so it is smaller (by about the sums: its blocks are
       * rounded and reused, so not exactly) */
      assert_true(sums > 0);
      if (!(pool_a < pool_b))
        fail_msg("dynamic %d, stale %d: the fused backward's pool holds %zu bytes, the unfused one's %zu: the f32 sums (%zu bytes) "
                 "should not be in it", dynamic, stale, pool_a, pool_b, sums);
      free(a);
      free(b);
    }
  /* The stale value is really added in: the runs with and without it differ. */
  size_t la, lb;
  uint8_t *a = train_fused(0, 0, 0, &la, NULL, NULL), *b = train_fused(0, 1, 0, &lb, NULL, NULL);
  assert_true(la == lb && memcmp(a, b, la) != 0);
  free(a);
  free(b);
}

static apex_status inject_inf_hook(void *ctx) {
  apex_tensor_set(apex_var_grad(ctx), 3, INFINITY);
  return APEX_OK;
}

/* bf16's default (a static 1.0, no scaling) still checks the gradients: an Inf in one (put there by a
 * before_unscale hook, after the backward) skips the step at O1, where the check runs alone over the
 * in-place f32 gradients, and at O2; the scale stays 1 and a clean step steps. */
static void test_bf16_static_overflow_skips(void **state) {
  (void)state;
  const char *levels[2] = {"O1", "O2"};
  for (int l = 0; l < 2; l++)
    for (int inject = 0; inject < 2; inject++) {
      net_t n = make_net(91, 0, 0.1f);
      apex_amp *amp;
      TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = levels[l], .half_type = APEX_AMP_CAST_BF16}, &amp));
      assert_true(apex_amp_loss_scale(amp, 0) == 1.0f);
      apex_graph *g = apex_graph_create();
      TU_OK(apex_amp_prepare_graph(amp, g));
      apex_tensor *x = batch_x(0);
      int64_t y[BATCH];
      batch_y(0, y);
      apex_var *loss = apex_cross_entropy(g, apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, x, 0)), y, NULL);
      apex_var *w = apex_model_find_param(n.m, "fc2.weight");
      TU_OK(apex_amp_backward(amp, loss, 0,
                              &(apex_amp_backward_options){.before_unscale = inject ? inject_inf_hook : no_op_hook, .hook_ctx = w}));
      uint8_t *before, *after;
      size_t len;
      snapshot(n.m, &before, &len);
      int skipped = -1;
      TU_OK(apex_amp_step(amp, n.opt, &skipped));
      snapshot(n.m, &after, &len);
      assert_int_equal(skipped, inject);
      assert_int_equal(memcmp(before, after, len) == 0, inject);
      assert_true(apex_amp_loss_scale(amp, 0) == 1.0f);
      free(before);
      free(after);
      apex_tensor_destroy(x);
      apex_graph_destroy(g);
      apex_amp_destroy(amp);
      free_net(n);
    }
}

/* ---- combine_grad -------------------------------------------------------------------------------- */

/* Trains 6 steps at `level` with combine_grad off or on (below O0, batch 3 has an input that overflows
 * in half, so that step is skipped); returns the parameters' bytes after each step, concatenated. */
static uint8_t *train_combined(const char *level, apex_amp_cast half, int combine, size_t *len, int *adjacent) {
  net_t n = make_net(61, 1, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1,
                            &(apex_amp_config){.opt_level = level, .half_type = half,
                                                 /* bf16 scales only when asked: this test needs the overflow */
                                                 .loss_scale = half == APEX_AMP_CAST_BF16 ? APEX_AMP_DYNAMIC : 0.0f,
                                                 .combine_grad = combine ? APEX_AMP_ON : APEX_AMP_OFF}, &amp));
  /* Gradients of fc1 (weight, then bias) next to each other in one buffer: the combination happened. */
  apex_tensor *gw = apex_var_grad(apex_model_param(n.m, 0, NULL)), *gb = apex_var_grad(apex_model_param(n.m, 1, NULL));
  *adjacent = (char *)apex_tensor_data(gw) + apex_tensor_nbytes(gw) == (char *)apex_tensor_data(gb);
  apex_tensor *mw = apex_optimizer_grad(n.opt, 0, 0), *mb = apex_optimizer_grad(n.opt, 0, 1);
  *adjacent &= (char *)apex_tensor_data(mw) + apex_tensor_nbytes(mw) == (char *)apex_tensor_data(mb);
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  uint8_t *all = NULL;
  size_t one = 0;
  for (int step = 0; step < 6; step++) {
    /* Two backwards a step: the second adds to what the first unscaled (the accumulating path). */
    int inject = step == 3 && strcmp(level, "O0") != 0, skipped;
    for (int micro = 0; micro < 2; micro++) {
      apex_tensor *x = batch_x(2 * step + micro);
      if (inject && micro == 0) apex_tensor_set(x, 5, half == APEX_AMP_CAST_BF16 ? 1e38f : 1e30f); /* past the range */
      int64_t y[BATCH];
      batch_y(2 * step + micro, y);
      apex_var *loss = apex_cross_entropy(g, apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, x, 0)), y, NULL);
      assert_non_null(loss);
      TU_OK(apex_amp_backward(amp, loss, 0, NULL));
      apex_graph_reset(g);
      apex_tensor_destroy(x);
    }
    TU_OK(apex_amp_step(amp, n.opt, &skipped));
    assert_int_equal(skipped, inject);
    TU_OK(apex_amp_zero_grad(amp));
    uint8_t *snap;
    snapshot(n.m, &snap, &one);
    all = realloc(all, (size_t)(step + 1) * one);
    memcpy(all + (size_t)step * one, snap, one);
    free(snap);
  }
  *len = 6 * one;
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
  return all;
}

/* combine_grad flattens the gradients (one buffer per dtype and kind) and unscales them in one pass:
 * training gives the same bits as without it, skipped step included, at every level. */
static void test_combine_grad(void **state) {
  (void)state;
  const char *levels[] = {"O0", "O1", "O2", "O3", "O1", "O2"};
  for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
    size_t la, lb;
    int adj_off, adj_on;
    apex_amp_cast half = l < 4 ? APEX_AMP_CAST_F16 : APEX_AMP_CAST_BF16;
    uint8_t *a = train_combined(levels[l], half, 0, &la, &adj_off), *b = train_combined(levels[l], half, 1, &lb, &adj_on);
    assert_int_equal(la, lb);
    if (memcmp(a, b, la)) fail_msg("%s: combine_grad changed the training", levels[l]);
    if (!adj_on) fail_msg("%s: combine_grad left the gradients in separate buffers", levels[l]);
    if (adj_off) fail_msg("%s: gradients already adjacent without combine_grad: the check above proves nothing", levels[l]);
    free(a);
    free(b);
  }
}

/* A backward that fails once it has run leaves partial gradients: the step is refused until
 * apex_amp_zero_grad, and nothing changes meanwhile. */
static void test_step_refused_after_failed_backward(void **state) {
  (void)state;
  net_t n = make_net(71, 0, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  apex_tensor *x = batch_x(0);
  int64_t y[BATCH];
  batch_y(0, y);
  apex_var *loss = apex_cross_entropy(g, apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, x, 0)), y, NULL);
  TU_OK(apex_amp_backward(amp, loss, 0, NULL));
  assert_int_not_equal(apex_amp_backward(amp, loss, 0, NULL), APEX_OK); /* the graph was freed by the first */
  uint8_t *before, *after;
  size_t len;
  snapshot(n.m, &before, &len);
  TU_FAILS(apex_amp_step(amp, n.opt, NULL), APEX_ERR_STATE, "failed");
  snapshot(n.m, &after, &len);
  assert_memory_equal(before, after, len);
  TU_OK(apex_amp_zero_grad(amp));
  apex_graph_reset(g);
  assert_true(amp_step(amp, &n, g, 1, NULL) > 0.0f); /* the iteration again: steps */
  free(before);
  free(after);
  apex_tensor_destroy(x);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  free_net(n);
}

/* ---- the model's saved state is f32 at every level --------------------------------------------------- */

static void test_model_state_is_f32(void **state) {
  (void)state;
  char path[] = "/tmp/apex_test_model_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  net_t a = make_net(81, 1, 0.1f);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&a.m, 1, &a.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp));
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  for (int step = 0; step < 3; step++) amp_step(amp, &a, g, step, NULL);
  TU_OK(apex_model_save_f32(a.m, amp, path));
  /* The file: every tensor f32; a cast parameter is its master, bit for bit; BN stays itself. */
  apex_safetensors *f = apex_safetensors_open(path);
  assert_non_null(f);
  size_t np = apex_model_num_params(a.m), nb = apex_model_num_buffers(a.m);
  assert_int_equal(apex_safetensors_count(f), (int)(np + nb));
  int masters = 0;
  for (size_t i = 0; i < np; i++) {
    const char *name;
    apex_var *v = apex_model_param(a.m, i, &name);
    apex_tensor *t = apex_safetensors_get(f, name), *m = apex_amp_master_of(amp, v);
    assert_int_equal(apex_tensor_dtype(t), APEX_F32);
    const apex_tensor *want = m ? m : apex_var_value(v);
    if (m) masters++;
    assert_int_equal(apex_tensor_dtype(want), APEX_F32);
    assert_memory_equal(apex_tensor_data(t), apex_tensor_data(want), apex_tensor_nbytes(t));
    apex_tensor_destroy(t);
  }
  assert_int_equal(masters, 4); /* fc1 and fc2 weight and bias; the batch norm's stay f32 without one */
  for (size_t j = 0; j < nb; j++) {
    const char *name;
    apex_tensor *b = apex_model_buffer(a.m, j, &name), *t = apex_safetensors_get(f, name);
    assert_memory_equal(apex_tensor_data(t), apex_tensor_data(b), apex_tensor_nbytes(t));
    apex_tensor_destroy(t);
  }
  apex_safetensors_close(f);
  /* Into another O2 model: its masters become the saved values, its parameters their rounding (which
   * is what the first model holds). */
  net_t b = make_net(82, 1, 0.1f);
  apex_amp *amp_b;
  TU_OK(apex_amp_initialize(&b.m, 1, &b.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp_b));
  TU_OK(apex_model_load_f32(b.m, amp_b, path));
  for (size_t i = 0; i < np; i++) {
    apex_var *va = apex_model_param(a.m, i, NULL), *vb = apex_model_param(b.m, i, NULL);
    apex_tensor *pa = apex_var_value(va), *pb = apex_var_value(vb);
    assert_int_equal(apex_tensor_dtype(pa), apex_tensor_dtype(pb));
    assert_memory_equal(apex_tensor_data(pa), apex_tensor_data(pb), apex_tensor_nbytes(pa));
    apex_tensor *ma = apex_amp_master_of(amp, va), *mb = apex_amp_master_of(amp_b, vb);
    assert_true(!ma == !mb);
    if (ma) assert_memory_equal(apex_tensor_data(ma), apex_tensor_data(mb), apex_tensor_nbytes(ma));
  }
  /* Into a plain f32 model (O0, no amp): the f32 values are the masters. */
  net_t c = make_net(83, 1, 0.1f);
  TU_OK(apex_model_load_f32(c.m, NULL, path));
  for (size_t i = 0; i < np; i++) {
    apex_var *va = apex_model_param(a.m, i, NULL);
    apex_tensor *want = apex_amp_master_of(amp, va) ? apex_amp_master_of(amp, va) : apex_var_value(va);
    apex_tensor *pc = apex_var_value(apex_model_param(c.m, i, NULL));
    assert_memory_equal(apex_tensor_data(pc), apex_tensor_data(want), apex_tensor_nbytes(want));
  }
  /* Bad input: nothing changes. A model of other shapes, one with a parameter the file lacks, no file. */
  apex_model *wide = apex_model_create(&(apex_model_options){.seed = 84});
  apex_module *seq = apex_sequential_create(wide, NULL);
  TU_OK(apex_sequential_add(seq, apex_linear_create(wide, "fc1", IN, HID + 1, 1)));
  uint8_t *before, *after;
  size_t len;
  snapshot(wide, &before, &len);
  TU_FAILS(apex_model_load_f32(wide, NULL, path), APEX_ERR_SHAPE, "fc1.weight");
  snapshot(wide, &after, &len);
  assert_memory_equal(before, after, len);
  free(before);
  free(after);
  apex_model *extra = apex_model_create(&(apex_model_options){.seed = 85});
  apex_module *seq2 = apex_sequential_create(extra, NULL);
  TU_OK(apex_sequential_add(seq2, apex_linear_create(extra, "fc1", IN, HID, 1)));
  TU_OK(apex_sequential_add(seq2, apex_linear_create(extra, "fc9", HID, OUT, 1)));
  snapshot(extra, &before, &len);
  TU_FAILS(apex_model_load_f32(extra, NULL, path), APEX_ERR_INVALID_ARG, "fc9");
  snapshot(extra, &after, &len);
  assert_memory_equal(before, after, len);
  free(before);
  free(after);
  TU_FAILS(apex_model_load_f32(c.m, NULL, "/nonexistent/model.safetensors"), APEX_ERR_IO, "/nonexistent/model.safetensors");
  TU_FAILS(apex_model_save_f32(NULL, NULL, path), APEX_ERR_INVALID_ARG, "NULL");
  apex_model_destroy(wide);
  apex_model_destroy(extra);
  unlink(path);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_amp_destroy(amp_b);
  free_net(a);
  free_net(b);
  free_net(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_o1_casts_per_category),     cmocka_unit_test(test_cast_cache_across_modes),
      cmocka_unit_test(test_o2_casts_model_keeps_bn_and_masters), cmocka_unit_test(test_loss_scale_decrease),
      cmocka_unit_test(test_two_models_two_losses_skip), cmocka_unit_test(test_bitwise_resume),
      cmocka_unit_test(test_disabled_is_identity),       cmocka_unit_test(test_delay_unscale_accumulation),
      cmocka_unit_test(test_bad_input),                  cmocka_unit_test(test_cast_cache_cleared_by_backward),
      cmocka_unit_test(test_register_half_and_promote),  cmocka_unit_test(test_overflow_message),
      cmocka_unit_test(test_cast_model_outputs),         cmocka_unit_test(test_clip_master_grads),
      cmocka_unit_test(test_combine_grad),               cmocka_unit_test(test_step_refused_after_failed_backward),
      cmocka_unit_test(test_model_state_is_f32),
      cmocka_unit_test(test_fused_flush_unscale),
      cmocka_unit_test(test_bf16_static_overflow_skips),
      cmocka_unit_test(test_overflow_at_min_scale_is_a_skip), cmocka_unit_test(test_forward_prepares_graph),
      cmocka_unit_test(test_null_chain),                 cmocka_unit_test(test_failed_initialize_keeps_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
