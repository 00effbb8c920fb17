/* test_nn_modules.c: what the shared op cases (nn_cases.h) cannot check, against references written
 * here in double precision from the definitions (PyTorch's documented formulas):
 *  - dropout's forward: each element is 0 or x / (1 - p), the kept set is the core generator's
 *    Bernoulli draw, the kept fraction is near 1 - p, evaluation is the identity (gradcheck alone
 *    would pass an op that never drops anything, since its backward reuses the forward's mask);
 *  - batch norm's running statistics (momentum, the unbiased variance, eps) through the op and
 *    through BatchNorm1d/2d modules in training and evaluation mode;
 *  - the multi-head causal self-attention module and the transformer block's forward (the head
 *    split and merge, residuals, layer norms, tanh GELU), which finite differences cannot catch;
 *  - PyTorch's default initialisations (bounds and spread);
 *  - bad inputs of the ops and modules not covered in test_autograd / test_nn_ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "apex/nn.h"

/* |got - want| within 1e-5 of max(|want|, floor): f32 arithmetic against a double reference. */
static void assert_close_rel(const char *what, size_t i, double got, double want, double floor) {
  double ref = fmax(fabs(want), floor);
  if (!(fabs(got - want) <= 1e-5 * ref)) fail_msg("%s[%zu]: apex %.9g, double reference %.9g", what, i, got, want);
}

/* ---- dropout -------------------------------------------------------------------------------------- */

static void test_dropout_forward(void **state) {
  (void)state;
  enum { N = 20000 };
  const float p = 0.3f;
  apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int d = 0; d < 3; d++) {
    apex_graph *g = apex_graph_create();
    apex_var *x = tu_random_leaf(dts[d], 2, (int64_t[]){100, N / 100}, 31, 1);
    apex_rng rng = apex_rng_init(77), ref = rng;
    apex_var *y = apex_dropout(g, x, p, 1, &rng);
    assert_non_null(y);
    assert_int_equal(apex_tensor_dtype(apex_var_value(y)), dts[d]);
    /* the generator moved past exactly the draws one Bernoulli fill of N takes */
    uint8_t *mask = malloc(N);
    TU_OK(apex_rng_bernoulli(&ref, mask, N, 1.0f - p));
    assert_true(rng.seed == ref.seed && rng.offset == ref.offset);
    const apex_tensor *X = apex_var_value(x), *Y = apex_var_value(y);
    size_t kept = 0;
    double ulp = dts[d] == APEX_F32 ? 0x1p-23 : dts[d] == APEX_F16 ? 0x1p-10 : 0x1p-7;
    for (size_t i = 0; i < N; i++) {
      double xv = apex_tensor_get(X, i), yv = apex_tensor_get(Y, i);
      if (mask[i]) {
        double want = xv / (1.0 - (double)p); /* rounded once to the dtype: within half an ulp (+ f32's) */
        if (!(fabs(yv - want) <= fabs(want) * ulp)) fail_msg("%s y[%zu] = %.9g, x / (1 - p) = %.9g", apex_dtype_name(dts[d]), i, yv, want);
        kept++;
      } else if (yv != 0.0) {
        fail_msg("%s y[%zu] = %.9g where the mask drops it", apex_dtype_name(dts[d]), i, yv);
      }
    }
    /* Bernoulli(0.7) over 20,000 draws: standard deviation 0.0032 of the fraction; 5 sigma */
    double frac = (double)kept / N;
    if (fabs(frac - 0.7) > 0.0165) fail_msg("kept fraction %.4f for p = 0.3", frac);
    /* backward: the gradient is the mask times 1 / (1 - p) */
    TU_OK(apex_backward(apex_sum_all(g, y), NULL));
    const apex_tensor *G = apex_var_grad(x);
    for (size_t i = 0; i < N; i++) {
      double want = mask[i] ? 1.0 / (1.0 - (double)p) : 0.0;
      if (!(fabs(apex_tensor_get(G, i) - want) <= want * ulp)) fail_msg("grad[%zu] = %.9g, want %.9g", i, apex_tensor_get(G, i), want);
    }
    apex_graph_reset(g);
    /* evaluation and p = 0: the identity, whatever the generator */
    apex_rng before = rng;
    const apex_tensor *E = apex_var_value(apex_dropout(g, x, p, 0, &rng)), *Z = apex_var_value(apex_dropout(g, x, 0.0f, 1, &rng));
    assert_true(rng.offset == before.offset);
    for (size_t i = 0; i < N; i++) {
      assert_int_equal(tu_bits(apex_tensor_get(E, i)), tu_bits(apex_tensor_get(X, i)));
      assert_int_equal(tu_bits(apex_tensor_get(Z, i)), tu_bits(apex_tensor_get(X, i)));
    }
    free(mask);
    apex_var_destroy(x);
    apex_graph_destroy(g);
  }
}

/* A Dropout module follows its model's mode: it drops in training, is the identity in evaluation,
 * and draws from apex_model_rng (same seed, same masks). */
static void test_dropout_module_modes(void **state) {
  (void)state;
  enum { N = 4000 };
  uint32_t first[N];
  for (int run = 0; run < 2; run++) {
    apex_model *m = apex_model_create(&(apex_model_options){.seed = 5});
    apex_module *drop = apex_dropout_create(m, 0.5f);
    assert_non_null(drop);
    apex_graph *g = apex_graph_create();
    apex_var *x = tu_random_leaf(APEX_F32, 2, (int64_t[]){40, 100}, 3, 0);
    assert_int_equal(apex_model_is_training(m), 1);
    apex_rng ref = *apex_model_rng(m);
    const apex_tensor *Y = apex_var_value(apex_module_forward(drop, g, x)), *X = apex_var_value(x);
    uint8_t mask[N];
    TU_OK(apex_rng_bernoulli(&ref, mask, N, 0.5f));
    size_t zeros = 0;
    for (size_t i = 0; i < N; i++) {
      float y = apex_tensor_get(Y, i), want = mask[i] ? 2.0f * apex_tensor_get(X, i) : 0.0f; /* x / 0.5 is exact */
      assert_int_equal(tu_bits(y), tu_bits(want));
      zeros += y == 0.0f;
      if (run == 0) first[i] = tu_bits(y);
      else assert_int_equal(first[i], tu_bits(y));
    }
    assert_true(zeros > N / 2 - 200 && zeros < N / 2 + 200); /* 6 sigma */
    apex_model_train(m, 0);
    assert_int_equal(apex_model_is_training(m), 0);
    const apex_tensor *E = apex_var_value(apex_module_forward(drop, g, x));
    for (size_t i = 0; i < N; i++) assert_int_equal(tu_bits(apex_tensor_get(E, i)), tu_bits(apex_tensor_get(X, i)));
    apex_var_destroy(x);
    apex_graph_destroy(g);
    apex_model_destroy(m);
  }
}

/* ---- batch norm's running statistics --------------------------------------------------------------- */

/* x [N, C, S...] flattened; per-channel mean and biased/unbiased variance in double. */
static void channel_stats(const apex_tensor *x, size_t N, size_t C, size_t S, size_t c, double *mean, double *var_b, double *var_u) {
  double s = 0, q = 0;
  for (size_t n = 0; n < N; n++)
    for (size_t i = 0; i < S; i++) s += apex_tensor_get(x, (n * C + c) * S + i);
  double m = s / (double)(N * S);
  for (size_t n = 0; n < N; n++)
    for (size_t i = 0; i < S; i++) q += pow(apex_tensor_get(x, (n * C + c) * S + i) - m, 2);
  *mean = m;
  *var_b = q / (double)(N * S);
  *var_u = q / (double)(N * S - 1);
}

/* Training: running = (1 - momentum) running + momentum batch, with the unbiased variance, over two
 * steps (momentum 0.1 by default, 0.25 given, exactly 0 and 1 with momentum_exact), for [N, C], [N, C, L] and [N, C, H, W]; the output
 * uses the biased variance and eps. Evaluation: the running statistics are used and left alone. */
static void test_batch_norm_running_stats(void **state) {
  (void)state;
  struct {
    int ndim;
    int64_t shape[4];
  } shapes[] = {{2, {7, 3}}, {3, {4, 3, 5}}, {4, {3, 3, 4, 5}}};
  /* default 0.1, 0.25 given, and with momentum_exact PyTorch's momentum=0 (frozen) and 1 (the batch's) */
  float moms[4] = {0.0f, 0.25f, 0.0f, 1.0f}, epss[4] = {0.0f, 1e-2f, 0.0f, 1e-2f};
  int exact[4] = {0, 0, 1, 1};
  for (size_t sh = 0; sh < 3; sh++)
    for (int mo = 0; mo < 4; mo++) {
      size_t N = (size_t)shapes[sh].shape[0], C = 3, S = 1;
      for (int d = 2; d < shapes[sh].ndim; d++) S *= (size_t)shapes[sh].shape[d];
      double mom = moms[mo] == 0.0f && !exact[mo] ? 0.1 : moms[mo], eps = epss[mo] == 0.0f ? 1e-5 : epss[mo];
      apex_batch_norm_options o = {.training = 1, .momentum = moms[mo], .momentum_exact = exact[mo], .eps = epss[mo]};
      apex_graph *g = apex_graph_create();
      apex_var *w = tu_random_leaf(APEX_F32, 1, (int64_t[]){3}, 40, 1), *b = tu_random_leaf(APEX_F32, 1, (int64_t[]){3}, 41, 1);
      apex_tensor *rm = apex_tensor_create(APEX_F32, 1, (int64_t[]){3}), *rv = apex_tensor_create(APEX_F32, 1, (int64_t[]){3});
      double erm[3] = {0.3, -0.2, 0.1}, erv[3] = {0.5, 2.0, 1.5};
      for (size_t c = 0; c < C; c++) apex_tensor_set(rm, c, (float)erm[c]), apex_tensor_set(rv, c, (float)erv[c]);
      for (int step = 0; step < 2; step++) {
        apex_var *x = tu_random_leaf(APEX_F32, shapes[sh].ndim, shapes[sh].shape, 50 + (uint64_t)step, 0);
        /* shift channel c by c so the channels differ in mean */
        for (size_t i = 0; i < N * C * S; i++) apex_tensor_set(apex_var_value(x), i, apex_tensor_get(apex_var_value(x), i) * 2.0f + (float)((i / S) % C));
        const apex_tensor *X = apex_var_value(x), *Y = apex_var_value(apex_batch_norm(g, x, w, b, rm, rv, &o));
        assert_non_null(Y);
        for (size_t c = 0; c < C; c++) {
          double mean, vb, vu;
          channel_stats(X, N, C, S, c, &mean, &vb, &vu);
          erm[c] = (1 - mom) * erm[c] + mom * mean;
          erv[c] = (1 - mom) * erv[c] + mom * vu;
          assert_close_rel("running_mean", c, apex_tensor_get(rm, c), erm[c], 1e-2);
          assert_close_rel("running_var", c, apex_tensor_get(rv, c), erv[c], 1e-2);
          double wc = apex_tensor_get(apex_var_value(w), c), bc = apex_tensor_get(apex_var_value(b), c);
          for (size_t n = 0; n < N; n++)
            for (size_t i = 0; i < S; i++) {
              size_t k = (n * C + c) * S + i;
              assert_close_rel("train y", k, apex_tensor_get(Y, k), (apex_tensor_get(X, k) - mean) / sqrt(vb + eps) * wc + bc, 1.0);
            }
        }
        apex_graph_reset(g);
        apex_var_destroy(x);
      }
      /* evaluation */
      o.training = 0;
      apex_var *x = tu_random_leaf(APEX_F32, shapes[sh].ndim, shapes[sh].shape, 60, 0);
      float rm0[3], rv0[3];
      for (size_t c = 0; c < C; c++) rm0[c] = apex_tensor_get(rm, c), rv0[c] = apex_tensor_get(rv, c);
      const apex_tensor *X = apex_var_value(x), *Y = apex_var_value(apex_batch_norm(g, x, w, b, rm, rv, &o));
      assert_non_null(Y);
      for (size_t k = 0; k < N * C * S; k++) {
        size_t c = (k / S) % C;
        double want = (apex_tensor_get(X, k) - rm0[c]) / sqrt(rv0[c] + eps) * apex_tensor_get(apex_var_value(w), c) + apex_tensor_get(apex_var_value(b), c);
        assert_close_rel("eval y", k, apex_tensor_get(Y, k), want, 1.0);
      }
      for (size_t c = 0; c < C; c++) {
        assert_int_equal(tu_bits(apex_tensor_get(rm, c)), tu_bits(rm0[c]));
        assert_int_equal(tu_bits(apex_tensor_get(rv, c)), tu_bits(rv0[c]));
      }
      apex_var_destroy(x);
      apex_var_destroy(w);
      apex_var_destroy(b);
      apex_tensor_destroy(rm);
      apex_tensor_destroy(rv);
      apex_graph_destroy(g);
    }
}

/* BatchNorm1d/2d modules update their buffers in training mode only, with their momentum. */
static void test_batch_norm_module_modes(void **state) {
  (void)state;
  for (int two_d = 0; two_d < 2; two_d++) {
    apex_model *m = apex_model_create(&(apex_model_options){.seed = 8});
    apex_batch_norm_options o = {.momentum = 0.5f};
    apex_module *bn = two_d ? apex_batch_norm2d_create(m, "bn", 4, &o) : apex_batch_norm1d_create(m, "bn", 4, &o);
    assert_non_null(bn);
    apex_tensor *rm = apex_model_find_buffer(m, "bn.running_mean"), *rv = apex_model_find_buffer(m, "bn.running_var");
    apex_graph *g = apex_graph_create();
    int64_t shape[4] = {5, 4, 3, 2};
    size_t N = 5, C = 4, S = two_d ? 6 : 3;
    apex_var *x = tu_random_leaf(APEX_F32, two_d ? 4 : 3, shape, 70, 0);
    assert_non_null(apex_module_forward(bn, g, x));
    for (size_t c = 0; c < C; c++) {
      double mean, vb, vu;
      channel_stats(apex_var_value(x), N, C, S, c, &mean, &vb, &vu);
      assert_close_rel("module running_mean", c, apex_tensor_get(rm, c), 0.5 * mean, 1e-2);
      assert_close_rel("module running_var", c, apex_tensor_get(rv, c), 0.5 + 0.5 * vu, 1e-2);
    }
    apex_graph_reset(g);
    apex_model_train(m, 0);
    float rm0 = apex_tensor_get(rm, 2), rv0 = apex_tensor_get(rv, 2);
    const apex_tensor *Y = apex_var_value(apex_module_forward(bn, g, x));
    assert_non_null(Y);
    assert_int_equal(tu_bits(apex_tensor_get(rm, 2)), tu_bits(rm0));
    assert_int_equal(tu_bits(apex_tensor_get(rv, 2)), tu_bits(rv0));
    for (size_t i = 0; i < S; i++) { /* sample 1, channel 2; weight 1, bias 0 */
      size_t k = (1 * C + 2) * S + i;
      assert_close_rel("module eval y", k, apex_tensor_get(Y, k), (apex_tensor_get(apex_var_value(x), k) - rm0) / sqrt((double)rv0 + 1e-5), 1.0);
    }
    apex_var_destroy(x);
    apex_graph_destroy(g);
    apex_model_destroy(m);
  }
}

/* ---- attention and transformer block modules -------------------------------------------------------- */

/* Fills every parameter with values in [-0.5, 0.5] so norms' weights and biases are not 1 and 0. */
static void randomise_params(apex_model *m) {
  for (size_t p = 0; p < apex_model_num_params(m); p++) {
    apex_tensor *v = apex_var_value(apex_model_param(m, p, NULL));
    apex_tensor *r = tu_random_tensor(APEX_F32, apex_tensor_numel(v), 1000 + p, 0.5f);
    for (size_t i = 0; i < apex_tensor_numel(v); i++) apex_tensor_set(v, i, apex_tensor_get(r, i));
    apex_tensor_destroy(r);
  }
}

static double *param_d(apex_model *m, const char *name) {
  const apex_tensor *t = apex_var_value(apex_model_find_param(m, name));
  if (!t) fail_msg("no parameter %s", name);
  double *d = malloc(apex_tensor_numel(t) * sizeof *d);
  for (size_t i = 0; i < apex_tensor_numel(t); i++) d[i] = apex_tensor_get(t, i);
  return d;
}

/* y [R, out] = x [R, in] W^T + b, W [out, in] the module's. */
static void ref_linear(apex_model *m, const char *prefix, const double *x, double *y, size_t R, size_t in, size_t out) {
  char n[160];
  snprintf(n, sizeof n, "%s.weight", prefix);
  double *W = param_d(m, n);
  snprintf(n, sizeof n, "%s.bias", prefix);
  double *b = param_d(m, n);
  for (size_t r = 0; r < R; r++)
    for (size_t o = 0; o < out; o++) {
      double s = b[o];
      for (size_t i = 0; i < in; i++) s += x[r * in + i] * W[o * in + i];
      y[r * out + o] = s;
    }
  free(W);
  free(b);
}

static void ref_layer_norm(apex_model *m, const char *prefix, const double *x, double *y, size_t R, size_t D) {
  char n[160];
  snprintf(n, sizeof n, "%s.weight", prefix);
  double *w = param_d(m, n);
  snprintf(n, sizeof n, "%s.bias", prefix);
  double *b = param_d(m, n);
  for (size_t r = 0; r < R; r++) {
    double s = 0, q = 0;
    for (size_t i = 0; i < D; i++) s += x[r * D + i];
    s /= (double)D;
    for (size_t i = 0; i < D; i++) q += pow(x[r * D + i] - s, 2);
    q /= (double)D;
    for (size_t i = 0; i < D; i++) y[r * D + i] = (x[r * D + i] - s) / sqrt(q + 1e-5) * w[i] + b[i];
  }
  free(w);
  free(b);
}

/* PyTorch's nn.MultiheadAttention semantics with a causal mask, heads taking consecutive slices of
 * dim: y = proj(concat_h softmax(q_h k_h^T / sqrt(D) + mask) v_h). */
static void ref_attention(apex_model *m, const char *prefix, const double *x, double *y, size_t B, size_t T, size_t C, size_t H) {
  size_t R = B * T, D = C / H;
  double *q = malloc(R * C * sizeof *q), *k = malloc(R * C * sizeof *k), *v = malloc(R * C * sizeof *v), *o = calloc(R * C, sizeof *o);
  char n[160];
  const char *parts[3] = {"q", "k", "v"};
  double *dst[3] = {q, k, v};
  for (int i = 0; i < 3; i++) {
    snprintf(n, sizeof n, "%s.%s", prefix, parts[i]);
    ref_linear(m, n, x, dst[i], R, C, C);
  }
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < H; h++)
      for (size_t i = 0; i < T; i++) {
        double s[64], mx = -INFINITY, z = 0;
        for (size_t j = 0; j <= i; j++) {
          s[j] = 0;
          for (size_t d = 0; d < D; d++) s[j] += q[(b * T + i) * C + h * D + d] * k[(b * T + j) * C + h * D + d];
          s[j] /= sqrt((double)D);
          mx = fmax(mx, s[j]);
        }
        for (size_t j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
        for (size_t j = 0; j <= i; j++)
          for (size_t d = 0; d < D; d++) o[(b * T + i) * C + h * D + d] += s[j] / z * v[(b * T + j) * C + h * D + d];
      }
  snprintf(n, sizeof n, "%s.proj", prefix);
  ref_linear(m, n, o, y, R, C, C);
  free(q), free(k), free(v), free(o);
}

static void compare_forward(const char *what, const apex_tensor *got, const double *want, size_t n) {
  double mx = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
  assert_int_equal(apex_tensor_numel(got), n);
  for (size_t i = 0; i < n; i++) assert_close_rel(what, i, apex_tensor_get(got, i), want[i], 1e-1 * mx);
}

static void test_attention_module_forward(void **state) {
  (void)state;
  enum { B = 2, T = 5, C = 12, H = 3 };
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 6});
  apex_module *attn = apex_attention_create(m, "attn", C, H);
  assert_non_null(attn);
  randomise_params(m);
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 3, (int64_t[]){B, T, C}, 80, 0);
  const apex_tensor *Y = apex_var_value(apex_module_forward(attn, g, x));
  assert_non_null(Y);
  assert_int_equal(apex_tensor_ndim(Y), 3);
  double xd[B * T * C], yd[B * T * C];
  float y0[B * T * C];
  for (size_t i = 0; i < B * T * C; i++) xd[i] = apex_tensor_get(apex_var_value(x), i), y0[i] = apex_tensor_get(Y, i);
  ref_attention(m, "attn", xd, yd, B, T, C, H);
  compare_forward("attention module", Y, yd, B * T * C);
  /* causal: changing the last position changes no earlier output */
  apex_graph_reset(g);
  apex_tensor_set(apex_var_value(x), (size_t)(T - 1) * C + 3, 5.0f);
  const apex_tensor *Y2 = apex_var_value(apex_module_forward(attn, g, x));
  for (size_t i = 0; i < (size_t)(T - 1) * C; i++) assert_int_equal(tu_bits(apex_tensor_get(Y2, i)), tu_bits(y0[i]));
  apex_var_destroy(x);
  apex_graph_destroy(g);
  apex_model_destroy(m);
}

/* apex_causal_attention_heads on [B, T, H * D] (heads read in place) gives the bits of the heads split
 * out ([B, H, T, D] by reshape and transpose), apex_causal_attention, and merged back: the output and the
 * three gradients, in f32 and bf16. */
static void test_attention_heads_in_place(void **state) {
  (void)state;
  enum { B = 2, T = 7, H = 3, D = 4, C = H * D };
  const apex_dtype dts[2] = {APEX_F32, APEX_BF16};
  for (int di = 0; di < 2; di++) {
    apex_var *q = tu_random_leaf(dts[di], 3, (int64_t[]){B, T, C}, 91, 1), *k = tu_random_leaf(dts[di], 3, (int64_t[]){B, T, C}, 92, 1),
             *v = tu_random_leaf(dts[di], 3, (int64_t[]){B, T, C}, 93, 1), *in[3] = {q, k, v};
    apex_tensor *out[2], *grads[2][3];
    for (int path = 0; path < 2; path++) {
      apex_graph *g = apex_graph_create();
      apex_var *y;
      if (path == 0) {
        y = apex_causal_attention_heads(g, q, k, v, H);
      } else {
        apex_var *s[3];
        for (int i = 0; i < 3; i++) s[i] = apex_transpose(g, apex_reshape(g, in[i], 4, (int64_t[]){B, T, H, D}), 1, 2);
        y = apex_reshape(g, apex_transpose(g, apex_causal_attention(g, s[0], s[1], s[2]), 1, 2), 3, (int64_t[]){B, T, C});
      }
      assert_non_null(y);
      out[path] = apex_tensor_to(apex_var_value(y), APEX_F32);
      /* a loss that weighs every output element differently, so that every gradient element counts */
      apex_var *w = tu_random_leaf(APEX_F32, 3, (int64_t[]){B, T, C}, 94, 0);
      TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, apex_cast(g, y, APEX_F32), w)), NULL));
      for (int i = 0; i < 3; i++) {
        grads[path][i] = apex_tensor_to(apex_var_grad(in[i]), APEX_F32);
        TU_OK(apex_tensor_fill(apex_var_grad(in[i]), 0.0f));
      }
      apex_var_destroy(w);
      apex_graph_destroy(g);
    }
    const char *what[3] = {"dq", "dk", "dv"};
    assert_memory_equal(apex_tensor_data(out[0]), apex_tensor_data(out[1]), apex_tensor_nbytes(out[0]));
    for (int i = 0; i < 3; i++) {
      if (memcmp(apex_tensor_data(grads[0][i]), apex_tensor_data(grads[1][i]), apex_tensor_nbytes(grads[0][i])) != 0)
        fail_msg("%s %s: the heads in place differ from the heads split out", apex_dtype_name(dts[di]), what[i]);
      apex_tensor_destroy(grads[0][i]);
      apex_tensor_destroy(grads[1][i]);
    }
    printf("attention heads in place (%s, B %d, T %d, H %d, D %d): output and dq, dk, dv bitwise those of the heads split out\n",
           apex_dtype_name(dts[di]), B, T, H, D);
    apex_tensor_destroy(out[0]);
    apex_tensor_destroy(out[1]);
    for (int i = 0; i < 3; i++) apex_var_destroy(in[i]);
  }
}

static double gelu_tanh_d(double v) { return 0.5 * v * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v))); }

static void test_transformer_block_forward(void **state) {
  (void)state;
  enum { B = 2, T = 4, C = 8, H = 2, R = B * T };
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 7});
  apex_module *blk = apex_transformer_block_create(m, "h0", C, H);
  assert_non_null(blk);
  randomise_params(m);
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 3, (int64_t[]){B, T, C}, 81, 0);
  const apex_tensor *Y = apex_var_value(apex_module_forward(blk, g, x));
  assert_non_null(Y);
  double xd[R * C], h[R * C], a[R * C], x1[R * C], f[R * 4 * C], p[R * C];
  for (size_t i = 0; i < R * C; i++) xd[i] = apex_tensor_get(apex_var_value(x), i);
  ref_layer_norm(m, "h0.ln1", xd, h, R, C);
  ref_attention(m, "h0.attn", h, a, B, T, C, H);
  for (size_t i = 0; i < R * C; i++) x1[i] = xd[i] + a[i];
  ref_layer_norm(m, "h0.ln2", x1, h, R, C);
  ref_linear(m, "h0.fc", h, f, R, C, 4 * C);
  for (size_t i = 0; i < R * 4 * C; i++) f[i] = gelu_tanh_d(f[i]);
  ref_linear(m, "h0.proj", f, p, R, 4 * C, C);
  for (size_t i = 0; i < R * C; i++) p[i] += x1[i];
  compare_forward("transformer block", Y, p, R * C);
  apex_var_destroy(x);
  apex_graph_destroy(g);
  apex_model_destroy(m);
}

/* ---- initialisation ----------------------------------------------------------------------------- */

/* Uniform(-b, b) has variance b^2 / 3; N(0, 1) mean 0 and variance 1. Bounds of 6 standard errors. */
static void check_uniform(const char *what, const apex_tensor *t, double bound) {
  size_t n = apex_tensor_numel(t);
  double s = 0, q = 0;
  for (size_t i = 0; i < n; i++) {
    double v = apex_tensor_get(t, i);
    if (!(fabs(v) <= bound)) fail_msg("%s[%zu] = %g outside +-%g", what, i, v, bound);
    s += v;
    q += v * v;
  }
  double var = q / (double)n, want = bound * bound / 3;
  if (fabs(s / (double)n) > 6 * bound / sqrt(3.0 * (double)n)) fail_msg("%s: mean %g", what, s / (double)n);
  /* var(v^2) = b^4 (1/5 - 1/9) for the uniform */
  if (fabs(var - want) > 6 * bound * bound * sqrt(4.0 / 45.0 / (double)n)) fail_msg("%s: variance %g, want %g", what, var, want);
}

static void test_default_init(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 21});
  assert_non_null(apex_linear_create(m, "fc", 300, 40, 1));
  assert_non_null(apex_conv2d_create(m, "conv", 16, 64, 3, 5, NULL, 1));
  assert_non_null(apex_embedding_create(m, "emb", 200, 64));
  assert_non_null(apex_layer_norm_create(m, "ln", 10, 0));
  assert_non_null(apex_rms_norm_create(m, "rms", 10, 0));
  assert_non_null(apex_batch_norm2d_create(m, "bn", 6, NULL));
  check_uniform("fc.weight", apex_var_value(apex_model_find_param(m, "fc.weight")), 1.0 / sqrt(300.0));
  check_uniform("fc.bias", apex_var_value(apex_model_find_param(m, "fc.bias")), 1.0 / sqrt(300.0));
  check_uniform("conv.weight", apex_var_value(apex_model_find_param(m, "conv.weight")), 1.0 / sqrt(16.0 * 3 * 5));
  check_uniform("conv.bias", apex_var_value(apex_model_find_param(m, "conv.bias")), 1.0 / sqrt(16.0 * 3 * 5));
  const apex_tensor *e = apex_var_value(apex_model_find_param(m, "emb.weight"));
  size_t n = apex_tensor_numel(e);
  double s = 0, q = 0;
  for (size_t i = 0; i < n; i++) s += apex_tensor_get(e, i), q += pow(apex_tensor_get(e, i), 2);
  assert_true(fabs(s / (double)n) < 6 / sqrt((double)n));
  assert_true(fabs(q / (double)n - 1) < 6 * sqrt(2.0 / (double)n));
  const char *ones[3] = {"ln.weight", "rms.weight", "bn.weight"}, *zeros[2] = {"ln.bias", "bn.bias"};
  for (int i = 0; i < 3; i++) {
    const apex_tensor *t = apex_var_value(apex_model_find_param(m, ones[i]));
    for (size_t k = 0; k < apex_tensor_numel(t); k++) assert_true(apex_tensor_get(t, k) == 1.0f);
  }
  for (int i = 0; i < 2; i++) {
    const apex_tensor *t = apex_var_value(apex_model_find_param(m, zeros[i]));
    for (size_t k = 0; k < apex_tensor_numel(t); k++) assert_true(apex_tensor_get(t, k) == 0.0f);
  }
  /* another seed, other values */
  apex_model *m2 = apex_model_create(&(apex_model_options){.seed = 22});
  assert_non_null(apex_linear_create(m2, "fc", 300, 40, 1));
  const apex_tensor *a = apex_var_value(apex_model_find_param(m, "fc.weight")), *b = apex_var_value(apex_model_find_param(m2, "fc.weight"));
  size_t same = 0;
  for (size_t i = 0; i < apex_tensor_numel(a); i++) same += apex_tensor_get(a, i) == apex_tensor_get(b, i);
  assert_true(same < 10);
  apex_model_destroy(m2);
  apex_model_destroy(m);
}

/* ---- small ops ---------------------------------------------------------------------------------- */

/* mean_all and reshape (a view: no copy), from their definitions. */
static void test_mean_all_and_view(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(APEX_F32, 3, (int64_t[]){3, 4, 5}, 90, 1);
  apex_var *y = apex_mean_all(g, x);
  assert_non_null(y);
  assert_int_equal(apex_tensor_ndim(apex_var_value(y)), 0);
  double s = 0;
  for (size_t i = 0; i < 60; i++) s += apex_tensor_get(apex_var_value(x), i);
  assert_close_rel("mean_all", 0, apex_var_item(y), s / 60, 1e-3);
  TU_OK(apex_backward(y, NULL));
  for (size_t i = 0; i < 60; i++) assert_close_rel("mean_all grad", i, apex_tensor_get(apex_var_grad(x), i), 1.0 / 60, 0);
  apex_var *r = apex_reshape(g, x, 2, (int64_t[]){12, -1});
  assert_non_null(r);
  assert_int_equal(apex_tensor_dim(apex_var_value(r), 1), 5);
  assert_ptr_equal(apex_tensor_data(apex_var_value(r)), apex_tensor_data(apex_var_value(x)));
  apex_var_destroy(x);
  apex_graph_destroy(g);
}

/* Plain binary cross entropy at the ends of [0, 1]: each log clamped at -100, the gradient
 * (p - y) / max(p (1 - p), 1e-12) (PyTorch's), both in closed form; outside [0, 1] an error. */
static void test_bce_edges(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *p = apex_var_create(apex_tensor_create(APEX_F32, 1, (int64_t[]){4}), 1);
  apex_var *y = apex_var_create(apex_tensor_create(APEX_F32, 1, (int64_t[]){4}), 0);
  const float pv[4] = {0.0f, 1.0f, 0.0f, 0.25f}, yv[4] = {1.0f, 0.0f, 0.5f, 1.0f};
  for (size_t i = 0; i < 4; i++) apex_tensor_set(apex_var_value(p), i, pv[i]), apex_tensor_set(apex_var_value(y), i, yv[i]);
  const double want[4] = {100.0, 100.0, 50.0, -log(0.25)};
  apex_var *l = apex_bce(g, p, y, APEX_REDUCTION_NONE);
  assert_non_null(l);
  for (size_t i = 0; i < 4; i++) assert_close_rel("bce", i, apex_tensor_get(apex_var_value(l), i), want[i], 1.0);
  TU_OK(apex_backward(apex_sum_all(g, l), NULL));
  for (size_t i = 0; i < 4; i++) {
    double d = fmax((double)pv[i] * (1.0 - pv[i]), 1e-12), gw = ((double)pv[i] - yv[i]) / d;
    assert_close_rel("bce grad", i, apex_tensor_get(apex_var_grad(p), i), gw, 1e-3);
  }
  apex_graph_reset(g);
  apex_tensor_set(apex_var_value(p), 2, -0.5f);
  assert_null(apex_bce(g, p, y, APEX_REDUCTION_MEAN));
  tu_assert_message("bce: input element 2 of [4] is -0.5; probabilities must be in [0, 1]");
  apex_tensor_set(apex_var_value(p), 2, 1.25f);
  assert_null(apex_bce(g, p, y, APEX_REDUCTION_MEAN));
  tu_assert_message("is 1.25");
  apex_tensor_set(apex_var_value(p), 2, NAN); /* passes, and the loss is NaN (not a clamped -100 log) */
  assert_true(isnan(apex_var_item(apex_bce(g, p, y, APEX_REDUCTION_SUM))));
  apex_var_destroy(p);
  apex_var_destroy(y);
  apex_graph_destroy(g);
}

/* ---- bad inputs ----------------------------------------------------------------------------------- */

/* A NULL-returning call: its status (apex_last_status) and message. */
#define FAILS_WITH(expr, status, needle)                                                                   \
  do {                                                                                                     \
    apex_clear_error();                                                                                    \
    assert_null(expr);                                                                                     \
    tu_assert_message(needle);                                                                             \
    if (apex_last_status() != (status))                                                                    \
      fail_msg("%s: status %s, expected %s", #expr, apex_status_name(apex_last_status()),                  \
               apex_status_name(status));                                                                  \
  } while (0)

static void test_bad_inputs(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  apex_var *x23 = tu_random_leaf(APEX_F32, 2, (int64_t[]){2, 3}, 1, 1), *x34 = tu_random_leaf(APEX_F32, 2, (int64_t[]){3, 4}, 2, 1);
  apex_var *x3 = tu_random_leaf(APEX_F32, 1, (int64_t[]){3}, 3, 1), *img = tu_random_leaf(APEX_F32, 4, (int64_t[]){2, 3, 4, 4}, 4, 1);
  apex_var *one = tu_random_leaf(APEX_F32, 4, (int64_t[]){1, 3, 1, 1}, 5, 1);
  /* broadcasting ops name themselves and both shapes */
  FAILS_WITH(apex_sub(g, x23, x34), APEX_ERR_SHAPE, "sub: shapes [2, 3] and [3, 4] do not broadcast");
  FAILS_WITH(apex_mul(g, x34, x23), APEX_ERR_SHAPE, "mul: shapes [3, 4] and [2, 3] do not broadcast");
  FAILS_WITH(apex_div(g, x23, x34), APEX_ERR_SHAPE, "div: shapes [2, 3] and [3, 4]");
  /* dims out of range */
  FAILS_WITH(apex_softmax(g, x23, 2), APEX_ERR_SHAPE, "softmax: dim 2 is out of range for [2, 3]");
  FAILS_WITH(apex_log_softmax(g, x23, -3), APEX_ERR_SHAPE, "log_softmax: dim -3 is out of range for [2, 3]");
  FAILS_WITH(apex_sum(g, x23, 5, 0), APEX_ERR_SHAPE, "sum: dim 5 is out of range for [2, 3]");
  FAILS_WITH(apex_mean(g, x23, -4, 1), APEX_ERR_SHAPE, "mean: dim -4 is out of range for [2, 3]");
  FAILS_WITH(apex_transpose(g, x23, 0, 2), APEX_ERR_SHAPE, "transpose: dims 0, 2 are out of range for [2, 3]");
  FAILS_WITH(apex_permute(g, x23, (int[]){0, 0}), APEX_ERR_SHAPE, "permute: entry 1 (0) of the permutation is out of range or repeated for [2, 3]");
  /* losses */
  FAILS_WITH(apex_bce_with_logits(g, x23, x34, APEX_REDUCTION_MEAN), APEX_ERR_SHAPE, "bce_with_logits: input [2, 3] and target [3, 4]");
  FAILS_WITH(apex_bce(g, x23, x34, APEX_REDUCTION_SUM), APEX_ERR_SHAPE, "bce: input [2, 3] and target [3, 4]");
  FAILS_WITH(apex_mse_loss(g, x23, x23, (apex_reduction)7), APEX_ERR_INVALID_ARG, "mse_loss: reduction 7 is not an apex_reduction");
  FAILS_WITH(apex_cross_entropy(g, x3, (int64_t[]){0, 1, 2}, NULL), APEX_ERR_SHAPE, "cross_entropy: logits [3] must be [N, C]");
  FAILS_WITH(apex_cross_entropy(g, x23, (int64_t[]){0, -1}, NULL), APEX_ERR_INVALID_ARG, "target -1 at row 1 is outside [0, 3) for logits [2, 3]");
  FAILS_WITH(apex_cross_entropy(g, x23, (int64_t[]){0, 1}, &(apex_cross_entropy_options){.label_smoothing = 1.5f}), APEX_ERR_INVALID_ARG,
             "cross_entropy: label_smoothing 1.5 is outside [0, 1]");
  FAILS_WITH(apex_cross_entropy(g, x23, NULL, NULL), APEX_ERR_INVALID_ARG, "cross_entropy: NULL targets for logits [2, 3]");
  /* an ignored target may be out of range: it is not used */
  assert_non_null(apex_cross_entropy(g, x23, (int64_t[]){-100, 1}, &(apex_cross_entropy_options){.use_ignore_index = 1, .ignore_index = -100}));
  /* embedding */
  FAILS_WITH(apex_embedding(g, x34, (int64_t[]){0, 3, 1}, 1, (int64_t[]){3}), APEX_ERR_INVALID_ARG,
             "embedding: id 3 at 1 is outside [0, 3) for weight [3, 4]");
  FAILS_WITH(apex_embedding(g, x3, (int64_t[]){0}, 1, (int64_t[]){1}), APEX_ERR_SHAPE, "embedding: weight [3] must be [V, D]");
  FAILS_WITH(apex_embedding(g, x34, NULL, 1, (int64_t[]){2}), APEX_ERR_INVALID_ARG, "embedding: NULL ids of shape [2]");
  /* pooling and convolution */
  FAILS_WITH(apex_max_pool2d(g, x23, &(apex_pool2d_options){.kernel_h = 2, .kernel_w = 2}), APEX_ERR_SHAPE, "max_pool2d: input [2, 3] must be [N, C, H, W]");
  FAILS_WITH(apex_avg_pool2d(g, img, &(apex_pool2d_options){.kernel_h = 5, .kernel_w = 2}), APEX_ERR_SHAPE,
             "avg_pool2d: kernel 5x2 is larger than the padded input [2, 3, 4, 4]");
  FAILS_WITH(apex_max_pool2d(g, img, &(apex_pool2d_options){.kernel_h = 2, .kernel_w = 2, .pad_h = 2}), APEX_ERR_INVALID_ARG,
             "padding at most half the kernel");
  FAILS_WITH(apex_max_pool2d(g, img, NULL), APEX_ERR_INVALID_ARG, "max_pool2d: NULL options");
  apex_var *k = tu_random_leaf(APEX_F32, 4, (int64_t[]){2, 3, 3, 3}, 6, 1);
  FAILS_WITH(apex_conv2d(g, img, k, x34, NULL), APEX_ERR_SHAPE, "bias [3, 4]");
  FAILS_WITH(apex_conv2d(g, img, k, NULL, &(apex_conv2d_options){.stride_h = -1}), APEX_ERR_INVALID_ARG, "conv2d: stride -1x");
  /* batch norm */
  FAILS_WITH(apex_batch_norm(g, img, x34, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1}), APEX_ERR_SHAPE,
             "batch_norm: weight [3, 4] does not match the 3 channels of input [2, 3, 4, 4]");
  FAILS_WITH(apex_batch_norm(g, img, NULL, NULL, NULL, NULL, NULL), APEX_ERR_INVALID_ARG,
             "batch_norm: evaluation of [2, 3, 4, 4] needs running_mean and running_var");
  /* momentum outside [0, 1], a bad eps: the op and the modules refuse them */
  FAILS_WITH(apex_batch_norm(g, img, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1, .momentum = -0.1f}),
             APEX_ERR_INVALID_ARG, "batch_norm: momentum is -0.1; it must be in [0, 1]");
  FAILS_WITH(apex_batch_norm(g, img, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1, .momentum = 1.5f}),
             APEX_ERR_INVALID_ARG, "momentum is 1.5");
  FAILS_WITH(apex_batch_norm(g, img, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1, .momentum = NAN}),
             APEX_ERR_INVALID_ARG, "momentum is nan");
  FAILS_WITH(apex_batch_norm(g, img, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1, .eps = -1.0f}),
             APEX_ERR_INVALID_ARG, "batch_norm: eps is -1; it must be finite and >= 0");
  {
    apex_model *bm = apex_model_create(NULL);
    FAILS_WITH(apex_batch_norm2d_create(bm, "bn", 3, &(apex_batch_norm_options){.momentum = 2.0f}), APEX_ERR_INVALID_ARG,
               "apex_batch_norm2d_create: momentum is 2");
    FAILS_WITH(apex_batch_norm1d_create(bm, "bn", 3, &(apex_batch_norm_options){.eps = INFINITY}), APEX_ERR_INVALID_ARG,
               "apex_batch_norm1d_create: eps is inf");
    assert_int_equal(apex_model_num_params(bm), 0);
    apex_model_destroy(bm);
  }
  FAILS_WITH(apex_batch_norm(g, one, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1}), APEX_ERR_SHAPE,
             "batch_norm: training needs more than one value per channel; input [1, 3, 1, 1]");
  FAILS_WITH(apex_batch_norm(g, x3, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1}), APEX_ERR_SHAPE,
             "batch_norm: input [3] must be [N, C]");
  /* attention names all three shapes */
  FAILS_WITH(apex_causal_attention(g, x23, x23, x34), APEX_ERR_SHAPE, "causal_attention: q [2, 3], k [2, 3], v [3, 4] must have one shape");
  FAILS_WITH(apex_causal_attention_heads(g, x34, x34, x34, 3), APEX_ERR_SHAPE, "causal_attention_heads: 3 heads do not divide the rows of 4");
  FAILS_WITH(apex_causal_attention_heads(g, x34, x34, x34, 0), APEX_ERR_SHAPE, "causal_attention_heads: 0 heads do not divide");
  FAILS_WITH(apex_causal_attention_heads(g, x34, x23, x34, 2), APEX_ERR_SHAPE, "causal_attention_heads: q [3, 4], k [2, 3], v [3, 4] must have one shape");
  /* cast to a dtype outside the enum */
  FAILS_WITH(apex_cast(g, x23, (apex_dtype)9), APEX_ERR_DTYPE, "cast: invalid dtype 9");
  /* modules */
  apex_model *m = apex_model_create(NULL);
  apex_module *bn2 = apex_batch_norm2d_create(m, "bn2", 3, NULL), *bn1 = apex_batch_norm1d_create(m, "bn1", 3, NULL);
  FAILS_WITH(apex_module_forward(bn2, g, x23), APEX_ERR_SHAPE, "BatchNorm2d 'bn2': input has 2 dimensions; it takes [N, C, H, W]");
  FAILS_WITH(apex_module_forward(bn1, g, img), APEX_ERR_SHAPE, "BatchNorm1d 'bn1': input has 4 dimensions");
  apex_module *attn = apex_attention_create(m, "attn", 4, 2);
  FAILS_WITH(apex_module_forward(attn, g, x34), APEX_ERR_SHAPE, "attention 'attn': input must be [B, T, C], not 2-d");
  FAILS_WITH(apex_attention_create(m, "attn2", 6, 4), APEX_ERR_INVALID_ARG, "apex_attention_create: 4 heads do not divide dim 6");
  apex_module *lin = apex_linear_create(m, "lin", 5, 2, 1);
  FAILS_WITH(apex_module_forward(lin, g, x23), APEX_ERR_SHAPE, "linear: input [2, 3], weight [2, 5]");
  apex_module *emb = apex_embedding_create(m, "emb", 4, 2);
  FAILS_WITH(apex_module_forward(emb, g, x23), APEX_ERR_INVALID_ARG, "embedding 'emb' takes ids");
  FAILS_WITH(apex_activation_create(m, APEX_OP_SOFTMAX), APEX_ERR_INVALID_ARG, "op 'softmax' is not an activation");
  FAILS_WITH(apex_dropout_create(m, 1.0f), APEX_ERR_INVALID_ARG, "apex_dropout_create: p = 1");
  FAILS_WITH(apex_linear_create(m, "bad", 0, 3, 1), APEX_ERR_INVALID_ARG, "apex_linear_create: sizes 0 -> 3");
  FAILS_WITH(apex_max_pool2d_create(m, NULL), APEX_ERR_INVALID_ARG, "a kernel size >= 1 is required");
  apex_model *other = apex_model_create(NULL);
  apex_module *seq = apex_sequential_create(m, "seq");
  TU_FAILS(apex_sequential_add(seq, apex_linear_create(other, "x", 2, 2, 1)), APEX_ERR_INVALID_ARG, "belongs to another model");
  TU_FAILS(apex_sequential_add(lin, attn), APEX_ERR_INVALID_ARG, "'lin' is not a sequential");
  apex_model_destroy(other);
  apex_model_destroy(m);
  apex_var_destroy(x23), apex_var_destroy(x34), apex_var_destroy(x3), apex_var_destroy(img), apex_var_destroy(one), apex_var_destroy(k);
  apex_graph_destroy(g);
}

/* apex_optimizer_add_model: one group holding every parameter in creation order with its own
 * gradient, the group's options and index as asked; refusals name the call and change nothing. */
static void test_optimizer_add_model(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 3});
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "fc1", 3, 4, 1)));
  TU_OK(apex_sequential_add(net, apex_batch_norm1d_create(m, "bn", 4, NULL)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "fc2", 4, 2, 0)));
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, NULL);
  int group = -1;
  TU_OK(apex_optimizer_add_model(opt, m, &(apex_optim_options){.lr = 0.25f}, &group));
  assert_int_equal(group, 0);
  assert_int_equal(apex_optimizer_num_groups(opt), 1);
  assert_int_equal(apex_model_num_params(m), 5); /* fc1 weight and bias, bn weight and bias, fc2 weight */
  assert_int_equal(apex_optimizer_group_size(opt, 0), 5);
  for (int i = 0; i < 5; i++) {
    apex_var *p = apex_model_param(m, (size_t)i, NULL);
    assert_ptr_equal(apex_optimizer_param(opt, 0, i), apex_var_value(p));
    assert_ptr_equal(apex_optimizer_grad(opt, 0, i), apex_var_grad(p));
    assert_non_null(apex_var_grad(p));
  }
  assert_true(apex_optimizer_get_lr(opt, 0) == 0.25f);
  /* The same model again: its parameters are in a group already. */
  group = -1;
  TU_FAILS(apex_optimizer_add_model(opt, m, NULL, &group), APEX_ERR_INVALID_ARG, "apex_optimizer_add_model: ");
  tu_assert_message("already in group 0");
  assert_int_equal(group, -1);
  assert_int_equal(apex_optimizer_num_groups(opt), 1);
  /* A second model with the optimizer's defaults goes into group 1. */
  apex_model *m2 = apex_model_create(&(apex_model_options){.seed = 4});
  assert_non_null(apex_linear_create(m2, "fc", 2, 2, 1));
  TU_OK(apex_optimizer_add_model(opt, m2, NULL, &group));
  assert_int_equal(group, 1);
  assert_int_equal(apex_optimizer_group_size(opt, 1), 2);
  assert_true(apex_optimizer_get_lr(opt, 1) == 1e-3f); /* AdamW's default */
  /* Bad input. */
  apex_model *empty = apex_model_create(NULL);
  TU_FAILS(apex_optimizer_add_model(opt, empty, NULL, NULL), APEX_ERR_INVALID_ARG, "no parameters");
  TU_FAILS(apex_optimizer_add_model(NULL, m, NULL, NULL), APEX_ERR_INVALID_ARG, "NULL optimizer");
  TU_FAILS(apex_optimizer_add_model(opt, NULL, NULL, NULL), APEX_ERR_INVALID_ARG, "NULL model");
  TU_FAILS(apex_optimizer_add_model(opt, m2, &(apex_optim_options){.lr = -1.0f}, NULL), APEX_ERR_INVALID_ARG,
           "apex_optimizer_add_model: ");
  assert_int_equal(apex_optimizer_num_groups(opt), 2);
  apex_optimizer_destroy(opt);
  apex_model_destroy(empty);
  apex_model_destroy(m2);
  apex_model_destroy(m);
}

/* The model and module accessors take NULL without crashing: the values nn.h gives, and a message. */
static void test_null_accessors(void **state) {
  (void)state;
  apex_clear_error();
  assert_int_equal(apex_model_num_params(NULL), 0);
  tu_assert_message("apex_model_num_params: NULL model");
  assert_null(apex_model_param(NULL, 0, NULL));
  tu_assert_message("apex_model_param: NULL model");
  assert_null(apex_model_find_param(NULL, "w"));
  assert_int_equal(apex_model_param_elements(NULL), 0);
  assert_int_equal(apex_model_num_buffers(NULL), 0);
  assert_null(apex_model_buffer(NULL, 0, NULL));
  assert_null(apex_model_find_buffer(NULL, "b"));
  assert_int_equal(apex_model_is_training(NULL), 0);
  assert_null(apex_model_rng(NULL));
  tu_assert_message("apex_model_rng: NULL model");
  assert_string_equal(apex_module_name(NULL), "");
  tu_assert_message("apex_module_name: NULL module");
  assert_null(apex_module_param(NULL, "weight"));
  tu_assert_message("apex_module_param: NULL module");
  assert_int_equal(apex_optimizer_num_groups(NULL), 0);
  tu_assert_message("apex_optimizer_num_groups: NULL optimizer");
  assert_int_equal(apex_optimizer_kind(NULL), APEX_OPTIM_KIND_COUNT);
  /* A chain: a module made with a NULL model fails, and so does every accessor after it. */
  assert_null(apex_var_value(apex_module_param(apex_linear_create(NULL, "fc", 2, 2, 1), "weight")));
  tu_assert_message("apex_var_value: NULL var");
  tu_assert_message("NULL model");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dropout_forward),          cmocka_unit_test(test_dropout_module_modes),
      cmocka_unit_test(test_batch_norm_running_stats), cmocka_unit_test(test_batch_norm_module_modes),
      cmocka_unit_test(test_attention_module_forward), cmocka_unit_test(test_attention_heads_in_place), cmocka_unit_test(test_transformer_block_forward),
      cmocka_unit_test(test_default_init),             cmocka_unit_test(test_mean_all_and_view),
      cmocka_unit_test(test_bad_inputs),                cmocka_unit_test(test_bce_edges),
      cmocka_unit_test(test_optimizer_add_model),      cmocka_unit_test(test_null_accessors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
