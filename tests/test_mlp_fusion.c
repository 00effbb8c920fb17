/* test_mlp_fusion.c: the MLP's GELU backward fused into the projection's product (args_nn.h's dgelu, the
 * peephole in autograd/ops_linear.c): y = apex_linear(apex_linear_gelu(x, W1, b1), W2, b2) against the
 * unfused graph apex_linear(apex_gelu_tanh(apex_linear(x, W1, b1)), W2, b2), on the same leaves (their
 * grads preset to the same nonzero values, so that a change in the order of the terms added to them would
 * show) and the same grad_output.
 *
 * On the CPU the gradients of x, W1, b1, W2 and b2 equal the unfused graph's bit for bit, fused or not: f32,
 * bf16 and f16 values with half gradients, and bf16 values with f32 gradients. A grad hook looks at the
 * linear_gelu's var while the backward runs (gbuf_is_pre, ag.h) to see whether the fusion took place: it
 * must where the projection is the hidden value's only reader, with or without b1, and must not where
 * another op reads the hidden value (made after the projection, or between the two) or reads b1 between
 * them. On a GPU (skipped without one) the fused graph's gradients are within a bound of the unfused
 * graph's: cuBLASLt's DGELU epilogue takes GELU' of the product before its rounding (args_nn.h), so each
 * element of the hidden gradient may move by about one unit of its dtype, and the gradients made from it
 * by their sums of such units: 2^-5 of max |ref| for bf16 (units of 2^-8; M = 12 rows at most summed),
 * 2^-7 for f16, 1e-5 for f32 (no epilogue: the separate kernels, the same steps as the unfused ops). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/cuda.h"
#include "autograd/ag.h"
#include "testutil.h"

enum { M = 12, C = 16, K = 24, N = 40, NLEAF = 5 };

typedef enum mode { FUSED, NO_BIAS, READ_AFTER, READ_BETWEEN, BIAS_BETWEEN, N_MODES } mode;
static const char *const mode_name[N_MODES] = {"only reader", "no b1", "h read after", "h read between", "b1 read between"};

/* The hook's view of the backward: whether the linear_gelu's gradient became its pre-activation's. */
typedef struct watch {
  apex_var *h;
  int fused;
} watch;

static apex_status look(void *ctx, apex_var *leaf) {
  (void)leaf;
  watch *w = ctx;
  if (w->h && w->h->gbuf_is_pre) w->fused = 1;
  return APEX_OK;
}

/* One backward of the mode's graph (fused: with apex_linear_gelu, else apex_linear and apex_gelu_tanh) on
 * leaves l (x, W1, b1, W2, b2) whose grads start as g0; host copies of their grads into out; returns
 * whether the hook saw the fusion. */
static int run(apex_device dev, int half, mode md, int fuse, apex_var *const *l, apex_tensor *const *g0, apex_tensor **out) {
  apex_graph *g = apex_graph_create_on(dev);
  assert_non_null(g);
  TU_OK(apex_graph_set_half_grads(g, half));
  watch w = {0};
  TU_OK(apex_graph_set_grad_hook(g, look, &w));
  for (int i = 0; i < NLEAF; i++) TU_OK(apex_tensor_copy(apex_var_grad(l[i]), g0[i]));
  apex_var *b1 = md == NO_BIAS ? NULL : l[2];
  apex_var *x = apex_scale(g, l[0], 1.0f); /* a result, so that h is not made from leaves alone (half gradients) */
  apex_var *h = fuse ? apex_linear_gelu(g, x, l[1], b1) : apex_gelu_tanh(g, apex_linear(g, x, l[1], b1));
  w.h = fuse ? h : NULL;
  apex_var *u = md == READ_BETWEEN ? apex_scale(g, h, 0.5f) : md == BIAS_BETWEEN ? apex_linear(g, x, l[1], b1) : NULL;
  apex_var *y = apex_linear(g, h, l[3], l[4]);
  if (md == READ_AFTER) u = apex_scale(g, h, 0.5f);
  apex_var *o = u ? apex_concat(g, 2, (apex_var *[]){y, u}, -1) : y;
  if (!o) fail_msg("%s: %s", mode_name[md], apex_last_error());
  const apex_tensor *ov = apex_var_value(o);
  apex_tensor *go = tu_random_on(dev, APEX_F32, 2, apex_tensor_shape(ov), 77 + md, 1.0f);
  TU_OK(apex_backward(o, &(apex_backward_options){.grad_output = go}));
  for (int i = 0; i < NLEAF; i++) out[i] = tu_host_copy(apex_var_grad(l[i]));
  apex_tensor_destroy(go);
  apex_graph_destroy(g);
  return w.fused;
}

/* max |a - b| / max |b| over the elements of host tensors a and b (f32 values). */
static double rel_err(const apex_tensor *a, const apex_tensor *b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < apex_tensor_numel(b); i++) {
    double x = apex_tensor_get(a, i), r = apex_tensor_get(b, i);
    num = isnan(x) ? INFINITY : fmax(num, fabs(x - r));
    den = fmax(den, fabs(r));
  }
  return den > 0 ? num / den : num;
}

static void check(apex_device dev, apex_dtype dt, int half) {
  static const char *const leaf_name[NLEAF] = {"x", "W1", "b1", "W2", "b2"};
  const int64_t shapes[NLEAF][2] = {{M, C}, {K, C}, {K, 0}, {N, K}, {N, 0}};
  apex_var *l[NLEAF];
  apex_tensor *g0[NLEAF];
  for (int i = 0; i < NLEAF; i++) {
    int nd = shapes[i][1] ? 2 : 1;
    /* the pre-activations spread over GELU's curve (its slope from about -0.13 to 1.13) */
    l[i] = apex_var_create(tu_random_on(dev, dt, nd, shapes[i], 11 + i, i == 1 ? 1.0f : 0.5f), 1);
    g0[i] = tu_random_on(dev, dt, nd, shapes[i], 31 + i, 0.25f);
    assert_non_null(l[i]);
  }
  const char *where = dev == APEX_DEVICE_CPU ? "cpu" : "cuda";
  const double bound = dev == APEX_DEVICE_CPU ? 0 : dt == APEX_BF16 ? 0x1p-5 : dt == APEX_F16 ? 0x1p-7 : 1e-5;
  for (int md = 0; md < N_MODES; md++) {
    apex_tensor *ref[NLEAF], *got[NLEAF];
    int ref_fused = run(dev, half, (mode)md, 0, l, g0, ref), fused = run(dev, half, (mode)md, 1, l, g0, got);
    const int want = md == FUSED || md == NO_BIAS;
    printf("%s %s%s, %s: %s\n", where, apex_dtype_name(dt), half ? " half grads" : "", mode_name[md], fused ? "fused" : "not fused");
    assert_false(ref_fused);
    if (fused != want) fail_msg("%s %s, %s: the fusion %s", where, apex_dtype_name(dt), mode_name[md], want ? "did not take place" : "took place");
    for (int i = 0; i < NLEAF; i++) {
      double e = rel_err(got[i], ref[i]);
      size_t off = 0;
      for (size_t j = 0; j < apex_tensor_numel(ref[i]); j++)
        off += tu_bits(apex_tensor_get(got[i], j)) != tu_bits(apex_tensor_get(ref[i], j));
      if (dev == APEX_DEVICE_CPU ? off != 0 : !(e <= bound))
        fail_msg("%s %s, %s: grad %s: %zu elements differ from the unfused graph's, max error %.3g of max |ref| (bound %s)", where,
                 apex_dtype_name(dt), mode_name[md], leaf_name[i], off, e, dev == APEX_DEVICE_CPU ? "bitwise" : "below");
      if (dev != APEX_DEVICE_CPU) printf("  grad %s: %.3g of max |ref| (bound %.3g)\n", leaf_name[i], e, bound);
      apex_tensor_destroy(ref[i]);
      apex_tensor_destroy(got[i]);
    }
  }
  for (int i = 0; i < NLEAF; i++) apex_var_destroy(l[i]), apex_tensor_destroy(g0[i]);
}

static void test_cpu(void **state) {
  (void)state;
  check(APEX_DEVICE_CPU, APEX_F32, 0);
  check(APEX_DEVICE_CPU, APEX_BF16, 1);
  check(APEX_DEVICE_CPU, APEX_F16, 1);
  check(APEX_DEVICE_CPU, APEX_BF16, 0);
}

static void test_cuda(void **state) {
  (void)state;
  if (!tu_device_present(APEX_DEVICE_CUDA)) {
    printf("cuda cases skipped: no GPU\n");
    skip();
  }
  check(APEX_DEVICE_CUDA, APEX_F32, 0);
  check(APEX_DEVICE_CUDA, APEX_BF16, 1);
  check(APEX_DEVICE_CUDA, APEX_F16, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpu), cmocka_unit_test(test_cuda)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
