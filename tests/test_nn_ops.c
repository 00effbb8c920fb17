/* test_nn_ops.c: what issue #4 added to the ops beyond the shared cases of nn_cases.h: concat of
 * many inputs and of mixed dtypes (exact values), layer/RMS norm over several trailing dimensions
 * through the op and the modules, the bad inputs of both, and the tiled low-precision GEMM, which
 * must give the bits of the whole-tensor path for matmul and linear, forward and backward, at 1
 * and 2 threads, in less pool memory; pooling of bf16 and f16 inputs, with the bits of pooling them
 * widened; layer/RMS norm against the one-row formulas bit for bit, and permute's runs and gathers. (PyTorch's values for the new cases are in test_nn_golden.) */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "apex/nn.h"
#include "autograd/ag.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"

/* ---- concat --------------------------------------------------------------------------------------- */

/* Ten inputs [2, w_k, 3] along dim 1 (-2), each dtype: every value lands where torch.cat puts it,
 * bit for bit, and each input's gradient is its slice of the output's. */
static void test_concat_many(void **state) {
  (void)state;
  enum { N = 10 };
  apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int d = 0; d < 3; d++) {
    apex_graph *g = apex_graph_create();
    apex_var *xs[N];
    int64_t total = 0;
    for (int k = 0; k < N; k++) {
      int64_t w = 1 + k % 3;
      xs[k] = tu_random_leaf(dts[d], 3, (int64_t[]){2, w, 3}, 10 + (uint64_t)k, 1);
      total += w;
    }
    apex_var *y = apex_concat(g, N, xs, -2);
    if (!y) fail_msg("%s", apex_last_error());
    const apex_tensor *Y = apex_var_value(y);
    assert_int_equal(apex_tensor_dtype(Y), dts[d]);
    assert_int_equal(apex_tensor_dim(Y, 1), total);
    apex_tensor *R = apex_tensor_create(APEX_F32, 3, (int64_t[]){2, total, 3});
    for (size_t i = 0; i < apex_tensor_numel(R); i++) apex_tensor_set(R, i, (float)i * 0.25f);
    TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = R}));
    int64_t at = 0;
    for (int k = 0; k < N; k++) {
      const apex_tensor *X = apex_var_value(xs[k]), *G = apex_var_grad(xs[k]);
      int64_t w = apex_tensor_dim(X, 1);
      for (int64_t b = 0; b < 2; b++)
        for (int64_t j = 0; j < w; j++)
          for (int64_t c = 0; c < 3; c++) {
            size_t xi = (size_t)((b * w + j) * 3 + c), yi = (size_t)((b * total + at + j) * 3 + c);
            assert_int_equal(tu_bits(apex_tensor_get(Y, yi)), tu_bits(apex_tensor_get(X, xi)));
            assert_int_equal(tu_bits(apex_tensor_get(G, xi)), tu_bits(apex_tensor_get(R, yi)));
          }
      at += w;
    }
    apex_tensor_destroy(R);
    for (int k = 0; k < N; k++) apex_var_destroy(xs[k]);
    apex_graph_destroy(g);
  }
}

/* f16 with bf16 promotes to f32, as torch.cat does; a single input is a copy. */
static void test_concat_mixed_and_single(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *a = tu_random_leaf(APEX_F16, 2, (int64_t[]){2, 3}, 1, 1), *b = tu_random_leaf(APEX_BF16, 2, (int64_t[]){2, 2}, 2, 0);
  apex_var *ab[2] = {a, b};
  apex_var *y = apex_concat(g, 2, ab, 1);
  assert_non_null(y);
  assert_int_equal(apex_tensor_dtype(apex_var_value(y)), APEX_F32);
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 5; c++) {
      float want = c < 3 ? apex_tensor_get(apex_var_value(a), (size_t)(r * 3 + c)) : apex_tensor_get(apex_var_value(b), (size_t)(r * 2 + c - 3));
      assert_int_equal(tu_bits(apex_tensor_get(apex_var_value(y), (size_t)(r * 5 + c))), tu_bits(want));
    }
  TU_OK(apex_backward(apex_sum_all(g, y), NULL));
  for (size_t i = 0; i < 6; i++) assert_true(apex_tensor_get(apex_var_grad(a), i) == 1.0f);
  apex_var *one = apex_concat(g, 1, &a, 0);
  assert_non_null(one);
  assert_true(apex_tensor_same_shape(apex_var_value(one), apex_var_value(a)));
  apex_var_destroy(a);
  apex_var_destroy(b);
  apex_graph_destroy(g);
}

static void test_concat_errors(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *xs[6];
  for (int k = 0; k < 6; k++) xs[k] = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 3}, (uint64_t)k, 0);
  assert_null(apex_concat(g, 0, xs, 0));
  tu_assert_message("concat: an empty list (0 inputs)");
  assert_null(apex_concat(g, 3, NULL, 0));
  tu_assert_message("concat: an empty list (3 inputs, NULL array)");
  apex_var *odd = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 4}, 9, 0), *flat = tu_random_leaf(APEX_F32, 1, (int64_t[]){6}, 9, 0);
  apex_var *bad[6] = {xs[0], xs[1], xs[2], xs[3], odd, xs[5]};
  assert_null(apex_concat(g, 6, bad, 0));
  tu_assert_message("concat: input 4 [2, 4] does not match input 0 [2, 3] outside dim 0");
  assert_non_null(apex_concat(g, 6, bad, 1)); /* along dim 1 it fits */
  bad[5] = flat;
  assert_null(apex_concat(g, 6, bad, 1));
  tu_assert_message("concat: input 5 [6] does not match input 0 [2, 3]");
  assert_null(apex_concat(g, 6, xs, 2));
  tu_assert_message("concat: dim 2 is out of range for input 0 [2, 3]");
  bad[5] = NULL;
  assert_null(apex_concat(g, 6, bad, 1));
  tu_assert_message("concat: input 5 is NULL");
  assert_null(apex_concat(NULL, 6, xs, 1));
  tu_assert_message("concat: NULL graph");
  for (int k = 0; k < 6; k++) apex_var_destroy(xs[k]);
  apex_var_destroy(odd);
  apex_var_destroy(flat);
  apex_graph_destroy(g);
}

/* ---- layer norm / RMS norm over trailing dimensions ---------------------------------------------- */

/* The module normalises over its weight's shape: the same bits as the op, and PyTorch's state_dict
 * shapes; the 1-d forms are the nd forms with one dimension. */
static void test_norm_nd_module(void **state) {
  (void)state;
  int64_t ns[2] = {3, 4};
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
  apex_module *ln = apex_layer_norm_nd_create(m, "ln", 2, ns, 0), *rms = apex_rms_norm_nd_create(m, "rms", 2, ns, 1e-6f);
  assert_non_null(ln);
  assert_non_null(rms);
  const apex_tensor *w = apex_var_value(apex_model_find_param(m, "ln.bias"));
  assert_int_equal(apex_tensor_ndim(w), 2);
  assert_int_equal(apex_tensor_dim(w, 0), 3);
  assert_null(apex_model_find_param(m, "rms.bias"));
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 3, (int64_t[]){2, 3, 4}, 7, 0);
  const apex_tensor *a = apex_var_value(apex_module_forward(ln, g, x));
  const apex_tensor *b = apex_var_value(apex_layer_norm_nd(g, x, 2, ns, apex_module_param(ln, "weight"), apex_module_param(ln, "bias"), 0));
  const apex_tensor *c = apex_var_value(apex_module_forward(rms, g, x));
  const apex_tensor *d = apex_var_value(apex_rms_norm_nd(g, x, 2, ns, apex_module_param(rms, "weight"), 1e-6f));
  for (size_t i = 0; i < 24; i++) {
    assert_int_equal(tu_bits(apex_tensor_get(a, i)), tu_bits(apex_tensor_get(b, i)));
    assert_int_equal(tu_bits(apex_tensor_get(c, i)), tu_bits(apex_tensor_get(d, i)));
  }
  /* each [3, 4] block has mean 0 and variance 1 (eps aside) */
  for (int r = 0; r < 2; r++) {
    double s = 0, q = 0;
    for (size_t i = 0; i < 12; i++) s += apex_tensor_get(a, (size_t)r * 12 + i);
    for (size_t i = 0; i < 12; i++) q += pow(apex_tensor_get(a, (size_t)r * 12 + i) - s / 12, 2);
    assert_true(fabs(s / 12) < 1e-6 && fabs(q / 12 - 1) < 1e-3);
  }
  const apex_tensor *one = apex_var_value(apex_layer_norm(g, x, NULL, NULL, 0));
  const apex_tensor *one_nd = apex_var_value(apex_layer_norm_nd(g, x, 1, (int64_t[]){4}, NULL, NULL, 0));
  for (size_t i = 0; i < 24; i++) assert_int_equal(tu_bits(apex_tensor_get(one, i)), tu_bits(apex_tensor_get(one_nd, i)));
  apex_var_destroy(x);
  apex_graph_destroy(g);
  apex_model_destroy(m);
}

/* Layer and RMS norm (f32) give the bits of the one-row-at-a-time formulas computed here: each row's
 * mean and squared deviations summed in double in element order, the backward's two row sums too,
 * and the weight's and bias's gradients summed over rows in row order in f32. The CPU kernels run
 * rows in interleaved groups (cpu/norm.c); row counts around the group sizes (tails of 1 to 7 rows)
 * at 1 and 3 threads check that every row, tail and gradient gets its formula's bits. (A double sum
 * of a row's floats seldom changes its f32 rounding with the order of the additions, so the order
 * itself is kept by construction, not caught here.) */
static void check_row_norm(int centre, int64_t R, int64_t D, int threads) {
  TU_OK(apex_set_num_threads(threads));
  apex_set_threads_follow_load(0); /* the threads asked for, however busy the machine */
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){R, D}, 31 + (uint64_t)R, 1);
  apex_var *w = tu_random_leaf(APEX_F32, 1, &D, 5, 1), *b = centre ? tu_random_leaf(APEX_F32, 1, &D, 6, 1) : NULL;
  apex_var *y = centre ? apex_layer_norm(g, x, w, b, 1e-5f) : apex_rms_norm(g, x, w, 1e-6f);
  assert_non_null(y);
  size_t n = (size_t)(R * D);
  apex_tensor *go = apex_tensor_create(APEX_F32, 2, (int64_t[]){R, D});
  for (size_t i = 0; i < n; i++) apex_tensor_set(go, i, 0.01f * (float)((i * 7919) % 97) - 0.4f);
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = go}));
  const float *X = apex_tensor_data(apex_var_value(x)), *W = apex_tensor_data(apex_var_value(w)), *G = apex_tensor_data(go);
  const float *B = b ? apex_tensor_data(apex_var_value(b)) : NULL, *Y = apex_tensor_data(apex_var_value(y));
  const float *GX = apex_tensor_data(apex_var_grad(x)), *GW = apex_tensor_data(apex_var_grad(w));
  float *gw = calloc((size_t)D, sizeof *gw), *gb = calloc((size_t)D, sizeof *gb);
  float eps = centre ? 1e-5f : 1e-6f;
  for (int64_t r = 0; r < R; r++) {
    const float *xr = X + r * D, *gr = G + r * D;
    double mean = 0, q = 0;
    if (centre) {
      for (int64_t j = 0; j < D; j++) mean += xr[j];
      mean /= (double)D;
    }
    for (int64_t j = 0; j < D; j++) q += (xr[j] - mean) * (xr[j] - mean);
    float m = (float)mean, rs = (float)(1.0 / sqrt(q / (double)D + eps));
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < D; j++) {
      float want = (xr[j] - m) * rs * W[j] + (B ? B[j] : 0.0f), xh = (xr[j] - m) * rs, gh = gr[j] * W[j];
      if (tu_bits(Y[r * D + j]) != tu_bits(want))
        fail_msg("%s [%lld, %lld], %d threads: y[%lld, %lld] is %a, the row formula's %a", centre ? "layer_norm" : "rms_norm", (long long)R,
                 (long long)D, threads, (long long)r, (long long)j, (double)Y[r * D + j], (double)want);
      s1 += gh;
      s2 += gh * xh;
      gw[j] += gr[j] * xh;
      gb[j] += gr[j];
    }
    float ca = centre ? (float)(s1 / (double)D) : 0.0f, cb = (float)(s2 / (double)D);
    for (int64_t j = 0; j < D; j++) {
      float xh = (xr[j] - m) * rs, want = 0.0f + rs * (gr[j] * W[j] - ca - xh * cb);
      if (tu_bits(GX[r * D + j]) != tu_bits(want))
        fail_msg("%s [%lld, %lld], %d threads: gx[%lld, %lld] is %a, the row formula's %a", centre ? "layer_norm" : "rms_norm", (long long)R,
                 (long long)D, threads, (long long)r, (long long)j, (double)GX[r * D + j], (double)want);
    }
  }
  for (int64_t j = 0; j < D; j++) {
    assert_int_equal(tu_bits(GW[j]), tu_bits(0.0f + gw[j]));
    if (b) assert_int_equal(tu_bits(((const float *)apex_tensor_data(apex_var_grad(b)))[j]), tu_bits(0.0f + gb[j]));
  }
  free(gw);
  free(gb);
  apex_tensor_destroy(go);
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
  if (b) apex_var_destroy(b);
}

static void test_row_norm_row_formula(void **state) {
  (void)state;
  const int64_t rows[] = {1, 2, 3, 7, 8, 9, 15, 75, 130};
  int had = apex_get_max_threads();
  for (int centre = 0; centre <= 1; centre++)
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
      for (int t = 1; t <= 3; t += 2) {
        check_row_norm(centre, rows[i], 37, t);
        check_row_norm(centre, rows[i], 260, t);
      }
  TU_OK(apex_set_num_threads(had));
  apex_set_threads_follow_load(1);
}

/* Permute moves elements (and their gradients) exactly, whether the last dim stays in place (the
 * kernel copies runs) or moves (it gathers): checked against index arithmetic done here, f32 and bf16. */
static void test_permute_runs(void **state) {
  (void)state;
  const int perms[2][4] = {{0, 2, 1, 3}, {3, 1, 0, 2}};
  const int64_t shape[4] = {3, 5, 7, 9};
  for (int d = 0; d < 2; d++)
    for (int p = 0; p < 2; p++) {
      apex_graph *g = apex_graph_create();
      apex_var *x = tu_random_leaf(d ? APEX_BF16 : APEX_F32, 4, shape, 3, 1);
      apex_var *y = apex_permute(g, x, perms[p]);
      assert_non_null(y);
      size_t n = 3 * 5 * 7 * 9;
      apex_tensor *go = apex_tensor_create(APEX_F32, 4, apex_tensor_shape(apex_var_value(y)));
      for (size_t i = 0; i < n; i++) apex_tensor_set(go, i, (float)i);
      TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = go}));
      const apex_tensor *X = apex_var_value(x), *Y = apex_var_value(y), *GX = apex_var_grad(x);
      int64_t ys[4], st[4] = {5 * 7 * 9, 7 * 9, 9, 1};
      for (int k = 0; k < 4; k++) ys[k] = shape[perms[p][k]];
      for (size_t i = 0; i < n; i++) {
        size_t rem = i, src = 0;
        for (int k = 3; k >= 0; k--) {
          src += (rem % (size_t)ys[k]) * (size_t)st[perms[p][k]];
          rem /= (size_t)ys[k];
        }
        assert_int_equal(tu_bits(apex_tensor_get(Y, i)), tu_bits(apex_tensor_get(X, src)));
        assert_int_equal(tu_bits(apex_tensor_get(GX, src)), tu_bits(apex_bf16_to_f32(apex_f32_to_bf16((float)i))) * d +
                                                               tu_bits((float)i) * !d);
      }
      apex_tensor_destroy(go);
      apex_graph_destroy(g);
      apex_var_destroy(x);
    }
}

static void test_norm_nd_errors(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 3, (int64_t[]){2, 3, 4}, 7, 0), *w34 = tu_random_leaf(APEX_F32, 2, (int64_t[]){3, 4}, 8, 1);
  apex_var *w12 = tu_random_leaf(APEX_F32, 1, (int64_t[]){12}, 8, 1), *w4 = tu_random_leaf(APEX_F32, 1, (int64_t[]){4}, 8, 1);
  int64_t ns[2] = {3, 4};
  assert_null(apex_layer_norm_nd(g, x, 2, NULL, NULL, NULL, 0));
  tu_assert_message("layer_norm: NULL normalized_shape");
  assert_null(apex_layer_norm_nd(g, x, 0, ns, NULL, NULL, 0));
  tu_assert_message("layer_norm: normalized_shape of 0 dimensions for input [2, 3, 4] (need 1 to 3)");
  assert_null(apex_rms_norm_nd(g, x, 4, (int64_t[]){1, 2, 3, 4}, NULL, 0));
  tu_assert_message("rms_norm: normalized_shape of 4 dimensions for input [2, 3, 4]");
  assert_null(apex_layer_norm_nd(g, x, 2, (int64_t[]){4, 3}, NULL, NULL, 0));
  tu_assert_message("layer_norm: normalized_shape [4, 3] does not match the last 2 dimensions of input [2, 3, 4]");
  assert_null(apex_layer_norm_nd(g, x, 2, ns, w12, NULL, 0));
  tu_assert_message("layer_norm: weight [12] does not match normalized_shape [3, 4] of input [2, 3, 4]");
  assert_null(apex_layer_norm_nd(g, x, 2, ns, w34, w4, 0));
  tu_assert_message("layer_norm: bias [4] does not match normalized_shape [3, 4]");
  assert_null(apex_layer_norm(g, x, w34, NULL, 0));
  tu_assert_message("layer_norm: weight [3, 4] does not match normalized_shape [4]");
  assert_null(apex_rms_norm_nd(g, x, 2, ns, w4, 0));
  tu_assert_message("rms_norm: weight [4] does not match normalized_shape [3, 4]");
  apex_model *m = apex_model_create(NULL);
  assert_null(apex_layer_norm_nd_create(m, "a", 0, ns, 0));
  tu_assert_message("apex_layer_norm_nd_create: normalized_shape of 0 dimensions");
  assert_null(apex_rms_norm_nd_create(m, "b", 2, NULL, 0));
  tu_assert_message("apex_rms_norm_nd_create: normalized_shape of 2 dimensions, NULL");
  assert_null(apex_layer_norm_nd_create(m, "c", 2, (int64_t[]){3, 0}, 0));
  tu_assert_message("normalized_shape entry 1 is 0");
  assert_null(apex_layer_norm_create(m, "d", 0, 0));
  tu_assert_message("apex_layer_norm_create: normalized_shape entry 0 is 0");
  apex_module *ln = apex_layer_norm_nd_create(m, "e", 2, (int64_t[]){4, 4}, 0);
  assert_null(apex_module_forward(ln, g, x));
  tu_assert_message("layer_norm: normalized_shape [4, 4] does not match the last 2 dimensions of input [2, 3, 4]");
  apex_model_destroy(m);
  apex_var_destroy(x);
  apex_var_destroy(w34);
  apex_var_destroy(w12);
  apex_var_destroy(w4);
  apex_graph_destroy(g);
}

/* ---- backend slots -------------------------------------------------------------------------------- */

/* A front whose backend lacks the op's slot refuses with APEX_ERR_UNSUPPORTED naming the op, the
 * backend and the device; the CPU table fills every nn slot (the block from nn_binary to
 * nn_pool2d_bwd in backend.h). */
static void test_backend_slots(void **state) {
  (void)state;
  apex_backend b = apex__cpu_backend;
  b.name = "test";
  b.nn_unary = NULL;
  assert_int_equal(AG_HAS(&b, nn_unary, APEX_OP_RELU), 0);
  assert_int_equal(apex_last_status(), APEX_ERR_UNSUPPORTED);
  tu_assert_message("relu: the test backend has no kernel for this op (tensors on CPU)");
  assert_int_equal(AG_HAS(&apex__cpu_backend, nn_unary, APEX_OP_RELU), 1);
  typedef apex_status (*slot_fn)(const void *);
  const char *t = (const char *)&apex__cpu_backend;
  int n = 0;
  for (size_t off = offsetof(apex_backend, nn_binary); off <= offsetof(apex_backend, nn_pool2d_bwd); off += sizeof(slot_fn), n++) {
    slot_fn f;
    memcpy(&f, t + off, sizeof f);
    if (!f) fail_msg("the CPU backend's nn slot %d (byte %zu of apex_backend) is NULL", n, off);
  }
  assert_true(n >= 38); /* the block as backend.h declares it, not an empty range */
}

/* ---- tiled GEMM ----------------------------------------------------------------------------------- */

typedef struct gemm_run {
  apex_tensor *out;      /* f32 copies */
  apex_tensor *grads[4];
  size_t pool;           /* the graph pool's bytes after forward and backward */
} gemm_run;

/* y = linear(x, w, b) @ v (v [n, 20], or [3, n, 20] with y reshaped to [3, -1, n]), forward and
 * backward of sum(y * y), widening per tile or whole, on `threads` threads. */
static gemm_run run_gemm(apex_var **in, int batched, int whole, int threads) {
  int old = apex__gemm_set_whole_widening(whole);
  int old_onednn = apex__onednn_set_enabled(0); /* bf16 would take oneDNN (test_gemm_onednn checks that path) */
  TU_OK(apex_set_num_threads(threads));
  for (int k = 0; k < 4; k++) TU_OK(apex_tensor_fill(apex_var_grad(in[k]), 0.0f));
  apex_graph *g = apex_graph_create();
  apex_var *h = apex_linear(g, in[0], in[1], in[2]);
  int64_t n = apex_tensor_dim(apex_var_value(in[1]), 0);
  apex_var *y = apex_matmul(g, batched ? apex_reshape(g, h, 3, (int64_t[]){3, -1, n}) : h, in[3]);
  if (!y) fail_msg("%s", apex_last_error());
  TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, y, y)), NULL));
  gemm_run r = {apex_tensor_to(apex_var_value(y), APEX_F32), {NULL}, apex_graph_pool_bytes(g)};
  for (int k = 0; k < 4; k++) r.grads[k] = apex_tensor_to(apex_var_grad(in[k]), APEX_F32);
  apex_graph_destroy(g);
  apex__gemm_set_whole_widening(old);
  apex__onednn_set_enabled(old_onednn);
  return r;
}

static void assert_same_bits(const char *what, const apex_tensor *a, const apex_tensor *b) {
  size_t n = apex_tensor_numel(a);
  assert_int_equal(n, apex_tensor_numel(b));
  for (size_t i = 0; i < n; i++)
    if (tu_bits(apex_tensor_get(a, i)) != tu_bits(apex_tensor_get(b, i)))
      fail_msg("%s[%zu]: %.9g vs %.9g", what, i, apex_tensor_get(a, i), apex_tensor_get(b, i));
}

static void assert_same_run(const char *what, const gemm_run *a, const gemm_run *b) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s output", what);
  assert_same_bits(buf, a->out, b->out);
  for (int q = 0; q < 4; q++) {
    snprintf(buf, sizeof buf, "%s grad %d", what, q);
    assert_same_bits(buf, a->grads[q], b->grads[q]);
  }
}

static void free_run(gemm_run *r) {
  apex_tensor_destroy(r->out);
  for (int k = 0; k < 4; k++) apex_tensor_destroy(r->grads[k]);
}

/* Per-tile widening gives the bits of whole-tensor widening, and 2 and 3 threads the bits of 1, in
 * every dtype mix (f32 alone included: its split once depended on the thread count); shapes with
 * ragged tile edges ([300, 130] x [270, 130]^T, tiles of 256), one with K = 1500 (tiles of 256,
 * batched), one split for many threads ([128, 300] x [1024, 300]^T: 8 tiles of 128 x 128, its
 * backward's [1024, 300] weight gradient 16) and one that stays a single call. The K = 1500 one's
 * pool is smaller per tile than whole. */
static void test_gemm_tiles_bitwise(void **state) {
  (void)state;
  int saved = apex_get_num_threads();
  struct {
    int m, k, n, batched;
  } shapes[] = {{300, 130, 270, 0}, {390, 1500, 100, 1}, {30, 20, 10, 0}, {128, 300, 1024, 0}};
  struct {
    apex_dtype x, w;
  } mixes[] = {{APEX_F16, APEX_F16}, {APEX_BF16, APEX_BF16}, {APEX_F16, APEX_F32}, {APEX_F32, APEX_BF16}, {APEX_F32, APEX_F32}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t mx = 0; mx < sizeof mixes / sizeof mixes[0]; mx++) {
      int m = shapes[s].m, k = shapes[s].k, n = shapes[s].n;
      apex_var *in[4] = {tu_random_leaf(mixes[mx].x, 2, (int64_t[]){m, k}, 1, 1), tu_random_leaf(mixes[mx].w, 2, (int64_t[]){n, k}, 2, 1),
                         tu_random_leaf(mixes[mx].w, 1, (int64_t[]){n}, 3, 1),
                         shapes[s].batched ? tu_random_leaf(mixes[mx].x, 3, (int64_t[]){3, n, 20}, 4, 1) : tu_random_leaf(mixes[mx].x, 2, (int64_t[]){n, 20}, 4, 1)};
      gemm_run whole = run_gemm(in, shapes[s].batched, 1, 1);
      for (int t = 1; t <= 3; t++) {
        gemm_run tiled = run_gemm(in, shapes[s].batched, 0, t);
        char what[96];
        snprintf(what, sizeof what, "shape %zu mix %zu, %d thread(s), per tile vs whole", s, mx, t);
        assert_same_run(what, &tiled, &whole);
        if (s == 1 && mx < 2 && tiled.pool >= whole.pool) fail_msg("%s: tiles use %zu pool bytes, whole tensors %zu", what, tiled.pool, whole.pool);
        free_run(&tiled);
      }
      free_run(&whole);
      for (int q = 0; q < 4; q++) apex_var_destroy(in[q]);
    }
  TU_OK(apex_set_num_threads(saved));
}

/* Causal attention's heads run whole on the threads (cpu/attention.c): forward and backward give the
 * bits of one thread at 2 and 3 threads, for f32, bf16 and f16 heads, with the heads split out
 * ([B, H, T, D]) and read in place ([B, T, H * D]); and the first call of a shape (head 0 sizes the
 * scratch alone) the bits of a later one (every head on the threads at once). bf16 runs as the CPU
 * gives it (oneDNN where there is AVX512_BF16, widened to f32 elsewhere). */
static gemm_run run_attention(apex_var **qkv, int in_place, int threads) {
  TU_OK(apex_set_num_threads(threads));
  for (int k = 0; k < 3; k++) TU_OK(apex_tensor_fill(apex_var_grad(qkv[k]), 0.0f));
  apex_graph *g = apex_graph_create();
  apex_var *y = in_place ? apex_causal_attention_heads(g, qkv[0], qkv[1], qkv[2], 3) : apex_causal_attention(g, qkv[0], qkv[1], qkv[2]);
  if (!y) fail_msg("%s", apex_last_error());
  TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, y, y)), NULL));
  gemm_run r = {apex_tensor_to(apex_var_value(y), APEX_F32), {NULL}, 0};
  for (int k = 0; k < 3; k++) r.grads[k] = apex_tensor_to(apex_var_grad(qkv[k]), APEX_F32);
  apex_graph_destroy(g);
  return r;
}

static void assert_same_attention(const char *what, const gemm_run *a, const gemm_run *b) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s: output", what);
  assert_same_bits(buf, a->out, b->out);
  for (int q = 0; q < 3; q++) {
    snprintf(buf, sizeof buf, "%s: gradient of %c", what, "qkv"[q]);
    assert_same_bits(buf, a->grads[q], b->grads[q]);
  }
}

static void test_attention_threads_bitwise(void **state) {
  (void)state;
  int saved = apex_get_num_threads();
  apex_set_threads_follow_load(0);
  const apex_dtype dts[] = {APEX_F32, APEX_BF16, APEX_F16};
  for (size_t di = 0; di < 3; di++)
    for (int in_place = 0; in_place < 2; in_place++) {
      /* 2 sequences of 3 heads, T = 37 (ragged tiles), D = 16: 6 heads over 1 to 3 threads */
      int64_t split[4] = {2, 3, 37, 16}, packed[3] = {2, 37, 48};
      apex_var *qkv[3];
      for (int k = 0; k < 3; k++) qkv[k] = in_place ? tu_random_leaf(dts[di], 3, packed, 40 + k, 1) : tu_random_leaf(dts[di], 4, split, 40 + k, 1);
      char what[96];
      snprintf(what, sizeof what, "attention %s%s", apex_dtype_name(dts[di]), in_place ? " (heads in place)" : "");
      gemm_run first = run_attention(qkv, in_place, 1), one = run_attention(qkv, in_place, 1);
      assert_same_attention(what, &one, &first);
      for (int t = 2; t <= 3; t++) {
        gemm_run more = run_attention(qkv, in_place, t);
        assert_same_attention(what, &more, &one);
        free_run(&more);
      }
      free_run(&first);
      free_run(&one);
      for (int k = 0; k < 3; k++) apex_var_destroy(qkv[k]);
    }
  apex_set_threads_follow_load(1);
  TU_OK(apex_set_num_threads(saved));
}

/* A tiled f16 linear against a double-precision product of the same f16 inputs: within the 2 ulp
 * that test_nn_golden allows against PyTorch. */
static void test_gemm_tiles_accuracy(void **state) {
  (void)state;
  int m = 300, k = 130, n = 270;
  apex_var *x = tu_random_leaf(APEX_F16, 2, (int64_t[]){m, k}, 5, 0), *w = tu_random_leaf(APEX_F16, 2, (int64_t[]){n, k}, 6, 0);
  apex_graph *g = apex_graph_create();
  const apex_tensor *Y = apex_var_value(apex_linear(g, x, w, NULL)), *X = apex_var_value(x), *W = apex_var_value(w);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int q = 0; q < k; q++) s += (double)apex_tensor_get(X, (size_t)(i * k + q)) * apex_tensor_get(W, (size_t)(j * k + q));
      int e;
      frexp(fmax(fabs(s), 1e-2), &e);
      double ulp = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10), got = apex_tensor_get(Y, (size_t)(i * n + j));
      if (fabs(got - s) > 2 * ulp) fail_msg("y[%d, %d] = %.9g, double %.9g (2 ulp %.3g)", i, j, got, s, 2 * ulp);
    }
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_graph_destroy(g);
}

/* apex's AVX-512 product (where the CPU has it) against a double-precision reference: every
 * transpose pair, ragged shapes around its 8 x 32 tile and 256-deep slices, alpha and beta (beta 0
 * over a NaN-filled C must not read it), leading dimensions wider than the operands. f32 sums of up
 * to 600 terms of values in [-1, 1]: within 1e-5 of the largest magnitude the sum could have. */
static void test_own_sgemm(void **state) {
  (void)state;
  if (!apex__sgemm_avx512_ok()) {
    printf("skipped: this CPU has no AVX-512, gemm.c uses OpenBLAS only\n");
    return;
  }
  struct {
    int m, n, k;
  } shapes[] = {{1, 1, 1}, {12, 32, 256}, {13, 33, 257}, {100, 130, 600}, {7, 300, 5}, {200, 3, 40}, {5, 5, 0}};
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int ab = 0; ab < 3; ab++) {
          int m = shapes[sh].m, n = shapes[sh].n, k = shapes[sh].k;
          float alpha = ab == 2 ? -0.5f : 1.0f, beta = ab == 0 ? 0.0f : ab == 1 ? 1.0f : 0.25f;
          int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
          size_t na = (size_t)(ta ? k : m) * lda + 1, nb = (size_t)(tb ? n : k) * ldb + 1, nc = (size_t)m * ldc;
          apex_tensor *A = tu_random_tensor(APEX_F32, na, 100 + sh, 1.0f), *B = tu_random_tensor(APEX_F32, nb, 200 + sh, 1.0f);
          apex_tensor *C = tu_random_tensor(APEX_F32, nc, 300 + sh, 1.0f);
          float *a = apex_tensor_data(A), *b = apex_tensor_data(B), *c = apex_tensor_data(C);
          float *c0 = malloc(nc * sizeof *c0);
          if (beta == 0.0f)
            for (size_t i = 0; i < nc; i++) c[i] = NAN;
          memcpy(c0, c, nc * sizeof *c0);
          apex__sgemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
          for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
              double sum = 0;
              for (int q = 0; q < k; q++)
                sum += (double)(ta ? a[(size_t)q * lda + i] : a[(size_t)i * lda + q]) * (tb ? b[(size_t)j * ldb + q] : b[(size_t)q * ldb + j]);
              double want = alpha * sum + (beta == 0.0f ? 0.0 : beta * (double)c0[(size_t)i * ldc + j]);
              double got = c[(size_t)i * ldc + j];
              if (!(fabs(got - want) <= 1e-5 * (k + 1)))
                fail_msg("shape %zu (%d x %d x %d) trans %d%d alpha %g beta %g: c[%d, %d] = %.9g, double %.9g", sh, m, n, k,
                         ta, tb, alpha, beta, i, j, got, want);
            }
          for (int i = 0; i < m; i++) /* the padding column of C is not written */
            assert_memory_equal(&c[(size_t)i * ldc + n], &c0[(size_t)i * ldc + n], sizeof(float));
          free(c0);
          apex_tensor_destroy(A), apex_tensor_destroy(B), apex_tensor_destroy(C);
        }
}

/* ---- pooling of low-precision inputs ----------------------------------------------------------------- */

/* The CPU pools bf16 and f16 inputs a plane at a time (conv.c): the result must be the bits of pooling
 * the input widened whole to f32 and rounding the output, and the max's argmax (seen through the
 * backward) the same; with and without padding (the padded windows take the general loop, the
 * others the branchless one), on one thread and on several (64 planes of 28 x 28). */
static void test_pool_low_precision(void **state) {
  (void)state;
  const apex_pool2d_options opts[3] = {{.kernel_h = 2, .kernel_w = 2}, {.kernel_h = 3, .kernel_w = 2, .stride_h = 2, .stride_w = 2, .pad_h = 1},
                                       {.kernel_h = 2, .kernel_w = 3, .stride_h = 1, .stride_w = 2, .pad_w = 1}};
  const int64_t shapes[2][4] = {{2, 3, 7, 6}, {2, 32, 28, 28}};
  apex_dtype dts[2] = {APEX_BF16, APEX_F16};
  for (int d = 0; d < 2; d++)
    for (int sh = 0; sh < 2; sh++)
      for (int k = 0; k < 6; k++) {
        int max = k < 3;
        apex_var *lo = tu_random_leaf(dts[d], 4, shapes[sh], 40 + k + 10 * sh, 1);
        apex_var *wide = apex_var_create(apex_tensor_to(apex_var_value(lo), APEX_F32), 1);
        apex_graph *g = apex_graph_create(), *gw = apex_graph_create();
        apex_var *y = max ? apex_max_pool2d(g, lo, &opts[k % 3]) : apex_avg_pool2d(g, lo, &opts[k % 3]);
        apex_var *yw = max ? apex_max_pool2d(gw, wide, &opts[k % 3]) : apex_avg_pool2d(gw, wide, &opts[k % 3]);
        if (!y || !yw) fail_msg("%s", apex_last_error());
        assert_int_equal(apex_tensor_dtype(apex_var_value(y)), dts[d]);
        apex_tensor *want = apex_tensor_to(apex_var_value(yw), dts[d]);
        size_t n = apex_tensor_numel(want);
        for (size_t i = 0; i < n; i++)
          if (tu_bits(apex_tensor_get(apex_var_value(y), i)) != tu_bits(apex_tensor_get(want, i)))
            fail_msg("%s %s pool %d shape %d [%zu]: %.9g, widened whole %.9g", apex_dtype_name(dts[d]), max ? "max" : "avg", k % 3, sh, i,
                     apex_tensor_get(apex_var_value(y), i), apex_tensor_get(want, i));
        apex_tensor *r = tu_random_tensor(APEX_F32, n, 7, 1.0f);
        TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = r}));
        TU_OK(apex_backward(yw, &(apex_backward_options){.grad_output = r}));
        for (size_t i = 0; i < apex_tensor_numel(apex_var_value(lo)); i++) {
          float a = apex_tensor_get(apex_var_grad(lo), i), b = apex_tensor_get(apex_var_grad(wide), i);
          /* the low-precision leaf's gradient is stored in its dtype: compare after the same rounding */
          apex_tensor *one = apex_tensor_create(APEX_F32, 1, (int64_t[]){1});
          apex_tensor_set(one, 0, b);
          apex_tensor *bl = apex_tensor_to(one, apex_tensor_dtype(apex_var_grad(lo)));
          if (tu_bits(a) != tu_bits(apex_tensor_get(bl, 0))) fail_msg("%s grad [%zu]: %.9g vs %.9g", max ? "max" : "avg", i, a, b);
          apex_tensor_destroy(one);
          apex_tensor_destroy(bl);
        }
        apex_tensor_destroy(r);
        apex_tensor_destroy(want);
        apex_graph_destroy(g);
        apex_graph_destroy(gw);
        apex_var_destroy(lo);
        apex_var_destroy(wide);
      }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concat_many),    cmocka_unit_test(test_concat_mixed_and_single), cmocka_unit_test(test_concat_errors),
      cmocka_unit_test(test_norm_nd_module), cmocka_unit_test(test_norm_nd_errors),          cmocka_unit_test(test_row_norm_row_formula),
      cmocka_unit_test(test_permute_runs),          cmocka_unit_test(test_gemm_tiles_bitwise), cmocka_unit_test(test_attention_threads_bitwise),
      cmocka_unit_test(test_gemm_tiles_accuracy), cmocka_unit_test(test_own_sgemm),
      cmocka_unit_test(test_backend_slots),  cmocka_unit_test(test_pool_low_precision),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
