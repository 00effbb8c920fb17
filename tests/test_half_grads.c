/* test_half_grads.c: gradients kept in the values' dtype (apex_graph_set_half_grads) and amp's switch for
 * it (apex_amp_config.half_grads).
 *
 * One op at a time, the half path against the f32 path on the same inputs. h = a * b + cast(c) is bf16,
 * an op's result made from other results, so a graph with half gradients keeps its gradient in bf16; c
 * is an f32 leaf whose cast is made from a leaf alone, so its gradient stays f32 and is h's gradient
 * widened exactly. The op under test reads h and gets a bf16 grad_output; its backward adds one term
 * into h's gradient, which the f32 path keeps as is and the half path rounds once to bf16. So grad(c)
 * on the half path must equal round_bf16(grad(c) on the f32 path): bit for bit on the CPU, whose
 * kernels run the same f32 code on both paths, and within one bf16 unit where a GPU's kernels read the
 * gradient in bf16 directly (their sums may group differently). Ops whose backward takes half
 * gradients (the slots' contract) and ops the engine adapts (an f32 copy of the output's gradient, f32
 * stand-ins landed after the op) are both covered.
 *
 * End to end, a GPT through amp O2 bf16 with plain SGD at lr 1 (so a step's change of the f32 masters
 * is their gradient): half_grads ON against OFF, every parameter's gradient within 2% (relative L2,
 * per tensor) of the f32 path's, not equal to it (the switch took effect), and the graph's own setting
 * back after amp's backward. A wrong gradient anywhere would be off by its own size, not by the few
 * bf16 roundings (2^-9 each, one per op on the way) that separate the paths. */
#include <math.h>
#include <stdlib.h>

#include "apex/cuda.h"
#include "testutil.h"

enum { R = 6, K = 32, N = 24, B = 2, T = 4, H = 2, C = 16 };

/* What an op case needs besides h: its own leaves, made once and read by both paths. */
typedef struct op_case {
  const char *name;
  int ncols;  /* h's last extent (h is [R, ncols], or [B, T, ncols] when btc) */
  int btc;
  apex_var *(*run)(apex_graph *g, apex_var *h, apex_var *const *w);
  int n_leaves;
  int64_t leaf_shape[2][2];
  int passes; /* the backward passes bf16 gout values through unchanged (masked, moved): nothing to round */
} op_case;

static apex_var *run_linear(apex_graph *g, apex_var *h, apex_var *const *w) { return apex_linear(g, h, w[0], w[1]); }
static apex_var *run_linear_gelu(apex_graph *g, apex_var *h, apex_var *const *w) { return apex_linear_gelu(g, h, w[0], w[1]); }
static apex_var *run_layer_norm(apex_graph *g, apex_var *h, apex_var *const *w) { return apex_layer_norm(g, h, w[0], w[1], 1e-5f); }
static apex_var *run_rms_norm(apex_graph *g, apex_var *h, apex_var *const *w) { return apex_rms_norm(g, h, w[0], 1e-5f); }
static apex_var *run_gelu(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_gelu_tanh(g, h); }
static apex_var *run_relu(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_relu(g, h); }
static apex_var *run_tanh(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_tanh(g, h); }
static apex_var *run_scale(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_scale(g, h, 0.37f); }
static apex_var *run_mul_self(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_mul(g, h, h); }
static apex_var *run_add_leaf(apex_graph *g, apex_var *h, apex_var *const *w) { return apex_add(g, h, w[0]); }
static apex_var *run_reshape(apex_graph *g, apex_var *h, apex_var *const *w) {
  (void)w;
  const int64_t s[2] = {R * K / 8, 8};
  return apex_reshape(g, h, 2, s);
}
static apex_var *run_attention(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_causal_attention_qkv(g, h, H); }
/* engine-adapted: f32-only backwards */
static apex_var *run_softmax(apex_graph *g, apex_var *h, apex_var *const *w) { (void)w; return apex_softmax(g, h, 1); }
static apex_var *run_permute(apex_graph *g, apex_var *h, apex_var *const *w) {
  (void)w;
  const int perm[2] = {1, 0};
  return apex_permute(g, h, perm);
}
static apex_var *run_matmul(apex_graph *g, apex_var *h, apex_var *const *w) { return apex_matmul(g, h, w[0]); }

static const op_case CASES[] = {
    {"linear", K, 0, run_linear, 2, {{N, K}, {N, 0}}, 0},
    {"linear_gelu", K, 0, run_linear_gelu, 2, {{N, K}, {N, 0}}, 0},
    {"layer_norm", K, 0, run_layer_norm, 2, {{K, 0}, {K, 0}}, 0},
    {"rms_norm", K, 0, run_rms_norm, 1, {{K, 0}}, 0},
    {"gelu_tanh", K, 0, run_gelu, 0, {{0}}, 0},
    {"relu", K, 0, run_relu, 0, {{0}}, 1},
    {"tanh", K, 0, run_tanh, 0, {{0}}, 0},
    {"scale", K, 0, run_scale, 0, {{0}}, 0},
    {"mul (one var twice)", K, 0, run_mul_self, 0, {{0}}, 0},
    {"add (a leaf)", K, 0, run_add_leaf, 1, {{R, K}}, 1},
    {"reshape", K, 0, run_reshape, 0, {{0}}, 1},
    {"causal_attention_qkv", 3 * C, 1, run_attention, 0, {{0}}, 0},
    {"softmax (adapted)", K, 0, run_softmax, 0, {{0}}, 0},
    {"permute (adapted)", K, 0, run_permute, 0, {{0}}, 1},
    {"matmul (adapted)", K, 0, run_matmul, 1, {{K, N}}, 0},
};

/* grad(c) of one path: the op on h = a * b + cast(c), backward from grad_output go. Returns a host copy. */
static apex_tensor *grad_c(apex_device dev, const op_case *oc, int half, apex_var *a, apex_var *b, apex_var *c, apex_var *const *w,
                           uint64_t seed) {
  apex_graph *g = apex_graph_create_on(dev);
  assert_non_null(g);
  TU_OK(apex_graph_set_half_grads(g, half));
  assert_int_equal(apex_graph_half_grads(g), half);
  TU_OK(apex_var_zero_grad(c));
  apex_var *h = apex_add(g, apex_mul(g, a, b), apex_cast(g, c, APEX_BF16));
  assert_non_null(h);
  apex_var *y = oc->run(g, h, w);
  if (!y) fail_msg("%s: %s", oc->name, apex_last_error());
  const apex_tensor *yv = apex_var_value(y);
  apex_tensor *go = tu_random_on(dev, APEX_BF16, apex_tensor_ndim(yv), apex_tensor_shape(yv), seed, 1.0f);
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = go}));
  apex_tensor *r = tu_host_copy(apex_var_grad(c));
  apex_tensor_destroy(go);
  apex_graph_destroy(g);
  return r;
}

static float round_bf16(float f) {
  uint16_t h;
  float back;
  apex_convert(&h, APEX_BF16, &f, APEX_F32, 1);
  apex_convert(&back, APEX_F32, &h, APEX_BF16, 1);
  return back;
}

/* The distance in bf16 units between a and b (both bf16 values held in f32). */
static double bf16_units(float a, float b) {
  float m = fmaxf(fabsf(a), fabsf(b));
  if (m == 0.0f) return 0.0;
  int e;
  frexpf(m, &e);
  return fabs((double)a - (double)b) / ldexp(1.0, e - 8);
}

static void ops_on(apex_device dev) {
  if (!tu_device_present(dev)) return;
  for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
    const op_case *oc = &CASES[ci];
    int64_t hs[3];
    int hn = oc->btc ? 3 : 2;
    if (oc->btc) hs[0] = B, hs[1] = T, hs[2] = oc->ncols;
    else hs[0] = R, hs[1] = oc->ncols;
    apex_var *a = apex_var_create(tu_random_on(dev, APEX_BF16, hn, hs, 11 + ci, 1.0f), 1);
    apex_var *b = apex_var_create(tu_random_on(dev, APEX_BF16, hn, hs, 29 + ci, 1.0f), 1);
    apex_var *c = apex_var_create(tu_random_on(dev, APEX_F32, hn, hs, 43 + ci, 1.0f), 1);
    apex_var *w[2] = {NULL, NULL};
    for (int i = 0; i < oc->n_leaves; i++) {
      int nd = oc->leaf_shape[i][1] ? 2 : 1;
      w[i] = apex_var_create(tu_random_on(dev, APEX_BF16, nd, oc->leaf_shape[i], 71 + 7 * i + ci, 0.5f), 1);
    }
    apex_tensor *f = grad_c(dev, oc, 0, a, b, c, w, 97 + ci), *hf = grad_c(dev, oc, 1, a, b, c, w, 97 + ci);
    const float *pf = apex_tensor_data(f), *ph = apex_tensor_data(hf);
    size_t n = apex_tensor_numel(f), off = 0, rounded = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
      float want = round_bf16(pf[i]);
      if (want != pf[i]) rounded++;
      double u = bf16_units(ph[i], want);
      if (u > worst) worst = u;
      if (dev == APEX_DEVICE_CPU ? tu_bits(ph[i]) != tu_bits(want) && !(want == 0.0f && ph[i] == 0.0f) : u > 1.0) off++;
    }
    printf("%-24s %s: %zu of %zu gradients round to bf16 on the half path; worst %.2f bf16 units from round(f32)\n", oc->name,
           dev == APEX_DEVICE_CPU ? "cpu" : "cuda", rounded, n, worst);
    if (off) fail_msg("%s: %zu of %zu gradients of h differ from round_bf16 of the f32 path's", oc->name, off, n);
    /* the comparison shows the rounding only where the f32 path's gradient is not already bf16 */
    if (!oc->passes) assert_true(rounded > n / 4);
    apex_tensor_destroy(f);
    apex_tensor_destroy(hf);
    apex_var *all[5] = {a, b, c, w[0], w[1]};
    for (int i = 0; i < 5; i++) apex_var_destroy(all[i]);
  }
}

static void test_ops_cpu(void **state) {
  (void)state;
  ops_on(APEX_DEVICE_CPU);
}
static void test_ops_cuda(void **state) {
  (void)state;
  ops_on(APEX_DEVICE_CUDA);
}

/* ---- GPT through amp ---------------------------------------------------------------------------------- */

enum { GV = 29, GB = 2, GT = 8 };

/* The change of every f32 master over one SGD step at lr 1 (the master gradients), host copies in out[]. */
static size_t gpt_grads(apex_device dev, apex_amp_flag half, apex_tensor **out, size_t cap) {
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 5, .device = dev});
  assert_non_null(m);
  apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.vocab = GV, .n_layer = 2, .n_embd = 16, .n_head = 2, .n_positions = GT});
  assert_non_null(gpt);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 1.0f});
  assert_non_null(opt);
  size_t np = apex_model_num_params(m);
  assert_true(np <= cap);
  TU_OK(apex_optimizer_add_model(opt, m, NULL, NULL));
  apex_amp *amp = NULL;
  TU_OK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16, .half_grads = half}, &amp));
  assert_int_equal(apex_amp_properties_of(amp)->half_grads, half);
  apex_graph *g = apex_graph_create_on(dev);
  assert_non_null(g);
  int64_t ids[GB * GT], tg[GB * GT];
  for (int i = 0; i < GB * GT; i++) ids[i] = (i * 5 + 3) % GV, tg[i] = (i * 11 + 1) % GV;
  apex_tensor **before = calloc(np, sizeof *before);
  for (size_t i = 0; i < np; i++) before[i] = tu_host_copy(apex_amp_master_of(amp, apex_model_param(m, i, NULL)));
  apex_var *loss = apex_gpt_loss(gpt, g, ids, tg, GB, GT);
  assert_non_null(loss);
  TU_OK(apex_amp_backward(amp, loss, 0, NULL));
  assert_int_equal(apex_graph_half_grads(g), 0); /* amp's setting was for its backward only */
  apex_graph_reset(g);
  TU_OK(apex_amp_step(amp, opt, NULL));
  for (size_t i = 0; i < np; i++) {
    apex_tensor *after = tu_host_copy(apex_amp_master_of(amp, apex_model_param(m, i, NULL)));
    float *pb = apex_tensor_data(before[i]);
    const float *pa = apex_tensor_data(after);
    for (size_t j = 0; j < apex_tensor_numel(after); j++) pb[j] -= pa[j];
    out[i] = before[i];
    apex_tensor_destroy(after);
  }
  free(before);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  return np;
}

static void gpt_on(apex_device dev) {
  if (!tu_device_present(dev)) return;
  enum { CAP = 64 };
  apex_tensor *f[CAP], *h[CAP];
  size_t np = gpt_grads(dev, APEX_AMP_OFF, f, CAP);
  assert_int_equal(gpt_grads(dev, APEX_AMP_ON, h, CAP), np);
  /* Each tensor's difference relative to its own norm, or to a hundredth of the largest gradient norm
   * where its own is smaller: the key bias's gradient is zero in exact arithmetic (softmax ignores a
   * shift common to a query's scores), so both paths give rounding noise there. */
  double scale = 0.0, worst = 0.0;
  for (size_t i = 0; i < np; i++) {
    double n2 = 0.0;
    const float *a = apex_tensor_data(f[i]);
    for (size_t j = 0; j < apex_tensor_numel(f[i]); j++) n2 += (double)a[j] * a[j];
    if (sqrt(n2) > scale) scale = sqrt(n2);
  }
  int differ = 0;
  for (size_t i = 0; i < np; i++) {
    const float *a = apex_tensor_data(f[i]), *b = apex_tensor_data(h[i]);
    double d2 = 0.0, n2 = 0.0;
    for (size_t j = 0; j < apex_tensor_numel(f[i]); j++) {
      d2 += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
      n2 += (double)a[j] * a[j];
      differ |= a[j] != b[j];
    }
    double rel = sqrt(d2) / fmax(sqrt(n2), 1e-2 * scale);
    if (rel > worst) worst = rel;
    if (rel > 0.02) fail_msg("parameter %zu: the half path's gradient is %.4f (relative L2) from the f32 path's", i, rel);
    apex_tensor_destroy(f[i]);
    apex_tensor_destroy(h[i]);
  }
  printf("gpt O2 bf16 %s: half gradients vs f32 gradients, worst relative L2 difference %.5f over %zu parameters\n",
         dev == APEX_DEVICE_CPU ? "cpu" : "cuda", worst, np);
  assert_true(differ); /* the switch reached the backward */
}

static void test_gpt_cpu(void **state) {
  (void)state;
  gpt_on(APEX_DEVICE_CPU);
}
static void test_gpt_cuda(void **state) {
  (void)state;
  gpt_on(APEX_DEVICE_CUDA);
}

/* ---- refusals ------------------------------------------------------------------------------------------ */

static void test_refusals(void **state) {
  (void)state;
  assert_int_equal(apex_graph_set_half_grads(NULL, 1), APEX_ERR_INVALID_ARG);
  tu_assert_message("NULL graph");
  assert_int_equal(apex_graph_half_grads(NULL), 0);
  apex_amp_properties p;
  p.half_grads = APEX_AMP_ON;
  assert_int_equal(apex_amp_resolve(&(apex_amp_config){.opt_level = "O2", .half_grads = (apex_amp_flag)7}, &p), APEX_ERR_INVALID_ARG);
  tu_assert_message("half_grads is 7");
  assert_int_equal(p.half_grads, APEX_AMP_ON); /* untouched */
  TU_OK(apex_amp_resolve(&(apex_amp_config){.opt_level = "O2"}, &p));
  assert_int_equal(p.half_grads, APEX_AMP_DEFAULT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_cpu), cmocka_unit_test(test_ops_cuda), cmocka_unit_test(test_gpt_cpu),
      cmocka_unit_test(test_gpt_cuda), cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
