/* test_nn_qkv.c: the attention module's q, k and v in one product (apex_attention_create: one [3C, C]
 * weight and one [3C] bias allocation, q/k/v parameters viewing them, one linear to the packed [B, T,
 * 3C] and apex_causal_attention_qkv) against the path it replaced, built here from the public API:
 * four linears with the module's parameter names, three products, apex_causal_attention_heads, the
 * projection.
 *  - forward outputs and every parameter's gradient bit for bit, in f32, with bf16 and f16 parameters
 *    and under bf16 and f16 autocast: each output column is the same sum over C, each weight-gradient
 *    element the same sum over the B T rows, whatever the width of the product that computes it. One
 *    exception: f32 products on oneDNN's f32 matmul (the default on AVX512_BF16 CPUs), which orders a
 *    long sum by the shape of the call: where the [3C, C] weight gradient is cut into other tiles than
 *    the [C, C] ones (gemm.c's grid; B 8 T 64 C 64: tiles of 48 rows against one call of 64), the q, k
 *    and v weight gradients differ in the last bits, bounded as below by 2 gamma_BT sum_r |g_rj| |x_rk|
 *    (twice, for margin), and are checked bit for bit again with f32 products on apex's own kernel,
 *    whose order depends on K alone;
 *  - the input's gradient within a derived bound: it is one sum over 3C products where the unfused
 *    path summed three sums over C and added them, so each element is the same 3C terms summed in
 *    another order. Both are f32 sums of the same terms (the half operands are the same values in both
 *    paths), each within gamma_n sum|term| of the exact sum (gamma_n = n u / (1 - n u), u = 2^-24;
 *    Higham, Accuracy and Stability, 3.1), so they differ by at most (gamma_3C + gamma_(C+2)) sum|term|,
 *    with sum|term| = sum_j |g_j| |w_jk| taken from the unfused path's q, k and v gradients (a probe run
 *    that makes them leaves); twice that bound allows for those gradients' own rounding;
 *  - construction: the same initial values as four linears made in that order (names, draws), the
 *    parameters as views of the two allocations, each gradient its own, a checkpoint of the fused
 *    module byte for byte the unfused one's, and an unfused module's checkpoint (separate q, k, v
 *    tensors) loading into the fused one;
 *  - a parameter given a value of its own still computes the same (the join is then a copy), and
 *    amp's O2 cast keeps the three one allocation (it casts their span as one);
 *  - apex_causal_attention_qkv against apex_causal_attention_heads on the thirds, and its bad inputs. */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "apex/amp.h"
#include "apex/model_io.h"
#include "apex/nn.h"
#include "backend/cpu/gemm_onednn.h"

typedef struct mode {
  const char *name;
  apex_dtype params;   /* the model's dtype */
  apex_dtype autocast; /* APEX_F32: off */
} mode;

static const mode modes[] = {
    {"f32", APEX_F32, APEX_F32},           {"bf16 parameters", APEX_BF16, APEX_F32}, {"f16 parameters", APEX_F16, APEX_F32},
    {"bf16 autocast", APEX_F32, APEX_BF16}, {"f16 autocast", APEX_F32, APEX_F16},
};

typedef struct shape {
  int64_t b, t, c;
  int h;
} shape;

/* A small product (one call) and ones cut into tiles (gemm.c's grid: 4e6 multiply-adds and up). */
static const shape shapes[] = {{2, 5, 12, 3}, {8, 64, 64, 4}, {4, 64, 128, 4}, {2, 128, 256, 4}};

static const char *const names[8] = {"attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias",
                                     "attn.v.weight", "attn.v.bias", "attn.proj.weight", "attn.proj.bias"};

/* ---- the two paths ------------------------------------------------------------------------------------ */

/* A model with the attention of sh: fused (apex_attention_create) or four linears of the same names. */
static apex_model *make_model(const shape *sh, apex_dtype dt, int fused, uint64_t seed, apex_module **attn, apex_module *lin[4]) {
  apex_model *m = apex_model_create(&(apex_model_options){.dtype = dt, .seed = seed});
  assert_non_null(m);
  if (fused) {
    *attn = apex_attention_create(m, "attn", sh->c, sh->h);
    assert_non_null(*attn);
  } else {
    static const char *parts[4] = {"attn.q", "attn.k", "attn.v", "attn.proj"};
    for (int i = 0; i < 4; i++) assert_non_null(lin[i] = apex_linear_create(m, parts[i], sh->c, sh->c, 1));
  }
  return m;
}

/* The unfused forward, as apex_attention_create's module ran before one product. */
static apex_var *unfused_forward(apex_module *lin[4], apex_graph *g, apex_var *x, int h) {
  apex_var *q = apex_module_forward(lin[0], g, x), *k = apex_module_forward(lin[1], g, x), *v = apex_module_forward(lin[2], g, x);
  return apex_module_forward(lin[3], g, apex_causal_attention_heads(g, q, k, v, h));
}

typedef struct result {
  apex_tensor *y, *gx, *grad[8]; /* all f32 */
} result;

static void result_free(result *r) {
  apex_tensor_destroy(r->y);
  apex_tensor_destroy(r->gx);
  for (int i = 0; i < 8; i++) apex_tensor_destroy(r->grad[i]);
}

/* One forward and backward of loss = sum(y * w) (w random, so every element of y counts) on x. */
static void run(apex_model *m, apex_module *attn, apex_module *lin[4], const shape *sh, const mode *md, result *r) {
  apex_graph *g = apex_graph_create();
  if (md->autocast != APEX_F32) TU_OK(apex_graph_set_autocast(g, 1, md->autocast));
  int64_t s[3] = {sh->b, sh->t, sh->c};
  apex_var *x = tu_random_leaf(APEX_F32, 3, s, 11, 1), *w = tu_random_leaf(APEX_F32, 3, s, 12, 0);
  apex_var *xin = md->params == APEX_F32 ? x : apex_cast(g, x, md->params);
  apex_var *y = attn ? apex_module_forward(attn, g, xin) : unfused_forward(lin, g, xin, sh->h);
  assert_non_null(y);
  TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, apex_cast(g, y, APEX_F32), w)), NULL));
  r->y = apex_tensor_to(apex_var_value(y), APEX_F32);
  r->gx = apex_tensor_clone(apex_var_grad(x));
  for (int i = 0; i < 8; i++) {
    apex_var *p = apex_model_find_param(m, names[i]);
    r->grad[i] = apex_tensor_to(apex_var_grad(p), APEX_F32);
    TU_OK(apex_var_zero_grad(p));
  }
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_graph_destroy(g);
}

/* The unfused path's q, k and v gradients side by side, g [R, 3C] (f32): a probe run with q, k and v
 * made leaves, for the bounds' sums of |terms|. */
static double *probe_g(apex_module *lin[4], const shape *sh, const mode *md) {
  apex_graph *g = apex_graph_create();
  if (md->autocast != APEX_F32) TU_OK(apex_graph_set_autocast(g, 1, md->autocast));
  int64_t s[3] = {sh->b, sh->t, sh->c};
  apex_var *x = tu_random_leaf(APEX_F32, 3, s, 11, 0), *w = tu_random_leaf(APEX_F32, 3, s, 12, 0), *leaf[3];
  apex_var *xin = md->params == APEX_F32 ? x : apex_cast(g, x, md->params);
  for (int i = 0; i < 3; i++) assert_non_null(leaf[i] = apex_var_create(apex_tensor_clone(apex_var_value(apex_module_forward(lin[i], g, xin))), 1));
  apex_var *y = apex_module_forward(lin[3], g, apex_causal_attention_heads(g, leaf[0], leaf[1], leaf[2], sh->h));
  TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, apex_cast(g, y, APEX_F32), w)), NULL));
  const size_t R = (size_t)(sh->b * sh->t), C = (size_t)sh->c;
  double *gd = malloc(R * 3 * C * sizeof *gd);
  for (int p = 0; p < 3; p++) {
    for (size_t r = 0; r < R; r++)
      for (size_t j = 0; j < C; j++) gd[r * 3 * C + (size_t)p * C + j] = apex_tensor_get(apex_var_grad(leaf[p]), r * C + j);
    apex_var_destroy(leaf[p]);
  }
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_graph_destroy(g);
  return gd;
}

static double gamma_n(double n) {
  const double u = ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

static void assert_bits(const char *what, const char *ctx, const apex_tensor *a, const apex_tensor *b) {
  if (apex_tensor_numel(a) != apex_tensor_numel(b) || memcmp(apex_tensor_data(a), apex_tensor_data(b), apex_tensor_nbytes(a)) != 0) {
    size_t i = 0;
    while (i < apex_tensor_numel(a) && apex_tensor_get(a, i) == apex_tensor_get(b, i)) i++;
    fail_msg("%s, %s: the fused path differs from the unfused one at element %zu (%.9g against %.9g)", ctx, what, i,
             (double)apex_tensor_get(a, i), (double)apex_tensor_get(b, i));
  }
}

/* ---- fused against unfused ---------------------------------------------------------------------------- */

/* |got - want| <= bound[i] for every element (bound NULL: bit for bit); the count of elements that
 * differ and the largest fraction of its bound a difference takes. */
static size_t check_within(const char *what, const char *ctx, const apex_tensor *got, const apex_tensor *want, const double *bound,
                           double *worst) {
  if (!bound) {
    assert_bits(what, ctx, got, want);
    return 0;
  }
  size_t differ = 0;
  for (size_t i = 0; i < apex_tensor_numel(got); i++) {
    double a = apex_tensor_get(got, i), b = apex_tensor_get(want, i), d = fabs(a - b);
    differ += d != 0;
    if (!(d <= bound[i])) fail_msg("%s, %s [%zu]: fused %.9g, unfused %.9g, |difference| %.3g past the bound %.3g", ctx, what, i, a, b, d, bound[i]);
    if (bound[i] > 0 && d / bound[i] > *worst) *worst = d / bound[i];
  }
  return differ;
}

/* own_f32: f32 products on apex's own kernel rather than oneDNN's f32 matmul (gemm_onednn.h). */
static void fused_matches_unfused(int own_f32) {
  int old = apex__onednn_set_f32(own_f32 ? APEX__ONEDNN_F32_NONE : APEX__ONEDNN_F32_ALL);
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
      const shape *sh = &shapes[si];
      const mode *md = &modes[mi];
      char ctx[160];
      snprintf(ctx, sizeof ctx, "%s, B %lld T %lld C %lld H %d, f32 products on %s", md->name, (long long)sh->b, (long long)sh->t,
               (long long)sh->c, sh->h, own_f32 ? "apex's kernel" : "oneDNN");
      apex_module *attn = NULL, *lin[4];
      apex_model *mf = make_model(sh, md->params, 1, 5, &attn, NULL), *mu = make_model(sh, md->params, 0, 5, NULL, lin);
      result f, u;
      run(mf, attn, NULL, sh, md, &f);
      run(mu, NULL, lin, sh, md, &u);
      const size_t R = (size_t)(sh->b * sh->t), C = (size_t)sh->c;
      double *g = probe_g(lin, sh, md), *bx = calloc(R * C, sizeof *bx), *bw = calloc(3 * C * C, sizeof *bw), worst = 0;
      /* the input's gradient: x_rk = sum over 3C of g_rj w_jk; a weight gradient: w_jk = sum over R of g_rj x_rk */
      apex_tensor *xv = tu_random_tensor(APEX_F32, R * C, 11, 1.0f);
      double *ax = malloc(R * C * sizeof *ax), *aw = malloc(3 * C * C * sizeof *aw); /* |x|, |w| (w: the joint [3C, C]) */
      for (size_t i = 0; i < R * C; i++) ax[i] = fabs(apex_tensor_get(xv, i));
      for (size_t i = 0; i < 3 * C * C; i++) aw[i] = fabs(apex_tensor_get(apex_var_value(apex_model_find_param(mu, names[2 * (i / (C * C))])), i % (C * C)));
      for (size_t r = 0; r < R; r++)
        for (size_t j = 0; j < 3 * C; j++) {
          double gj = fabs(g[r * 3 * C + j]);
          for (size_t k = 0; k < C; k++) {
            bx[r * C + k] += gj * aw[j * C + k];
            bw[j * C + k] += gj * ax[r * C + k];
          }
        }
      free(ax), free(aw);
      for (size_t i = 0; i < R * C; i++) bx[i] *= 2 * (gamma_n(3.0 * C) + gamma_n(C + 2.0));
      for (size_t i = 0; i < 3 * C * C; i++) bw[i] *= 2 * 2 * gamma_n((double)R);
      check_within("output", ctx, f.y, u.y, NULL, &worst);
      /* the weight gradients are bitwise but for f32 products on oneDNN, whose f32 matmul orders a sum
       * by the call's shape: the joint product's tiles differ from the three products' */
      size_t dw = 0, dx = 0;
      const int onednn_f32 = md->params == APEX_F32 && md->autocast == APEX_F32 && !own_f32;
      for (int i = 0; i < 8; i++) {
        const int qkv_weight = i < 6 && i % 2 == 0;
        dw += check_within(names[i], ctx, f.grad[i], u.grad[i], qkv_weight && onednn_f32 ? bw + (size_t)(i / 2) * C * C : NULL, &worst);
      }
      dx = check_within("input gradient", ctx, f.gx, u.gx, bx, &worst);
      printf("%s: output, biases' and projection's gradients bitwise; q/k/v weight gradients: %zu elements differ; "
             "input gradient: %zu of %zu differ; at most %.3f of a bound\n", ctx, dw, dx, R * C, worst);
      apex_tensor_destroy(xv);
      free(g), free(bx), free(bw);
      result_free(&f);
      result_free(&u);
      apex_model_destroy(mf);
      apex_model_destroy(mu);
    }
  apex__onednn_set_f32(old);
}

static void test_fused_matches_unfused(void **state) {
  (void)state;
  fused_matches_unfused(0);
  fused_matches_unfused(1);
}

/* ---- construction, checkpoints ------------------------------------------------------------------------ */

static void test_parameters_and_checkpoints(void **state) {
  (void)state;
  const shape sh = {2, 6, 16, 4};
  apex_module *attn, *lin[4];
  apex_model *mf = make_model(&sh, APEX_F32, 1, 9, &attn, NULL), *mu = make_model(&sh, APEX_F32, 0, 9, NULL, lin);
  assert_int_equal(apex_model_num_params(mf), 8);
  for (size_t i = 0; i < 8; i++) {
    const char *nf, *nu;
    apex_var *pf = apex_model_param(mf, i, &nf), *pu = apex_model_param(mu, i, &nu);
    assert_string_equal(nf, names[i]);
    assert_string_equal(nf, nu);
    assert_true(apex_tensor_same_shape(apex_var_value(pf), apex_var_value(pu)));
    assert_memory_equal(apex_tensor_data(apex_var_value(pf)), apex_tensor_data(apex_var_value(pu)), apex_tensor_nbytes(apex_var_value(pf)));
  }
  /* q, k, v weights back to back in one allocation (biases in another), in order; gradients apart */
  apex_var *w[3], *b[3];
  for (int i = 0; i < 3; i++) w[i] = apex_model_find_param(mf, names[2 * i]), b[i] = apex_model_find_param(mf, names[2 * i + 1]);
  for (int i = 1; i < 3; i++) {
    assert_true(apex_tensor_shares_storage(apex_var_value(w[0]), apex_var_value(w[i])));
    assert_true(apex_tensor_shares_storage(apex_var_value(b[0]), apex_var_value(b[i])));
    assert_ptr_equal((float *)apex_tensor_data(apex_var_value(w[i])), (float *)apex_tensor_data(apex_var_value(w[0])) + i * sh.c * sh.c);
    assert_ptr_equal((float *)apex_tensor_data(apex_var_value(b[i])), (float *)apex_tensor_data(apex_var_value(b[0])) + i * sh.c);
    assert_false(apex_tensor_shares_storage(apex_var_grad(w[0]), apex_var_grad(w[i])));
  }
  assert_false(apex_tensor_shares_storage(apex_var_value(w[0]), apex_var_value(b[0])));
  /* their concat is a view (no copy); a concat of a leaf with itself, or out of order, is not */
  apex_graph *g = apex_graph_create();
  apex_var *cat = apex_concat(g, 3, w, 0), *swapped[3] = {w[1], w[0], w[2]};
  assert_non_null(cat);
  assert_true(apex_tensor_shares_storage(apex_var_value(cat), apex_var_value(w[0])));
  assert_false(apex_tensor_shares_storage(apex_var_value(apex_concat(g, 3, swapped, 0)), apex_var_value(w[0])));
  assert_false(apex_tensor_shares_storage(apex_var_value(apex_concat(g, 3, w, 1)), apex_var_value(w[0])));
  apex_graph_destroy(g);

  /* a checkpoint of the fused module is byte for byte the four linears'; the linears' loads into it */
  char dir[] = "/tmp/apex_qkv_XXXXXX", pf[64], pu[64];
  assert_non_null(mkdtemp(dir));
  snprintf(pf, sizeof pf, "%s/fused.safetensors", dir);
  snprintf(pu, sizeof pu, "%s/unfused.safetensors", dir);
  TU_OK(apex_model_save_f32(mf, NULL, pf));
  TU_OK(apex_model_save_f32(mu, NULL, pu));
  size_t nf, nu;
  FILE *ff = fopen(pf, "rb"), *fu = fopen(pu, "rb");
  assert_non_null(ff);
  assert_non_null(fu);
  fseek(ff, 0, SEEK_END), fseek(fu, 0, SEEK_END);
  nf = (size_t)ftell(ff), nu = (size_t)ftell(fu);
  assert_int_equal(nf, nu);
  rewind(ff), rewind(fu);
  char *bf = malloc(nf), *bu = malloc(nu);
  assert_int_equal(fread(bf, 1, nf, ff), nf);
  assert_int_equal(fread(bu, 1, nu, fu), nu);
  assert_memory_equal(bf, bu, nf);
  fclose(ff), fclose(fu), free(bf), free(bu);

  apex_module *attn2;
  apex_model *m2 = make_model(&sh, APEX_F32, 1, 77, &attn2, NULL); /* another seed: other values until the load */
  TU_OK(apex_model_load_f32(m2, NULL, pu));
  for (size_t i = 0; i < 8; i++) {
    const apex_tensor *a = apex_var_value(apex_model_param(m2, i, NULL)), *e = apex_var_value(apex_model_param(mu, i, NULL));
    assert_memory_equal(apex_tensor_data(a), apex_tensor_data(e), apex_tensor_nbytes(a));
  }
  assert_ptr_equal((float *)apex_tensor_data(apex_var_value(apex_model_find_param(m2, "attn.v.weight"))),
                   (float *)apex_tensor_data(apex_var_value(apex_model_find_param(m2, "attn.q.weight"))) + 2 * sh.c * sh.c);
  result f, u;
  run(m2, attn2, NULL, &sh, &modes[0], &f);
  run(mu, NULL, lin, &sh, &modes[0], &u);
  assert_bits("output after loading the unfused checkpoint", "f32", f.y, u.y);
  result_free(&f);
  result_free(&u);
  unlink(pf), unlink(pu), rmdir(dir);
  apex_model_destroy(m2);
  apex_model_destroy(mf);
  apex_model_destroy(mu);
  printf("names, initial values and checkpoint bytes those of four linears; q/k/v views of one allocation; an unfused checkpoint loads\n");
}

/* amp's O2 cast gives each parameter a value of its own (apex_var_swap_value): the module still
 * computes the same, joining copies of the three. */
static void test_separate_values(void **state) {
  (void)state;
  const shape sh = {2, 6, 16, 4};
  apex_module *attn, *lin[4];
  apex_model *mf = make_model(&sh, APEX_F32, 1, 3, &attn, NULL), *mu = make_model(&sh, APEX_F32, 0, 3, NULL, lin);
  apex_var *k = apex_model_find_param(mf, "attn.k.weight");
  apex_tensor_destroy(apex_var_swap_value(k, apex_tensor_clone(apex_var_value(k))));
  assert_false(apex_tensor_shares_storage(apex_var_value(k), apex_var_value(apex_model_find_param(mf, "attn.q.weight"))));
  result f, u;
  run(mf, attn, NULL, &sh, &modes[0], &f);
  run(mu, NULL, lin, &sh, &modes[0], &u);
  assert_bits("output", "k's own value", f.y, u.y);
  for (int i = 0; i < 8; i++) assert_bits(names[i], "k's own value", f.grad[i], u.grad[i]);
  result_free(&f);
  result_free(&u);
  apex_model_destroy(mf);
  apex_model_destroy(mu);
}

/* amp's O2 casts the parameters to half; the q/k/v weights (and biases) stay one allocation, which the
 * forward joins in place, and the model computes what the unfused one cast alike does. */
static void test_amp_o2_keeps_one_allocation(void **state) {
  (void)state;
  const shape sh = {2, 6, 16, 4};
  apex_module *attn, *lin[4];
  apex_model *m[2] = {make_model(&sh, APEX_F32, 1, 4, &attn, NULL), make_model(&sh, APEX_F32, 0, 4, NULL, lin)};
  apex_optimizer *opt[2];
  apex_amp *amp[2];
  for (int i = 0; i < 2; i++) {
    assert_non_null(opt[i] = apex_optimizer_create(APEX_OPTIM_ADAMW, NULL));
    TU_OK(apex_optimizer_add_model(opt[i], m[i], NULL, NULL));
    TU_OK(apex_amp_initialize(&m[i], 1, &opt[i], 1, &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16}, &amp[i]));
  }
  apex_var *w[3];
  for (int i = 0; i < 3; i++) w[i] = apex_model_find_param(m[0], names[2 * i]);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(apex_tensor_dtype(apex_var_value(w[i])), APEX_BF16);
    assert_ptr_equal((char *)apex_tensor_data(apex_var_value(w[i])), (char *)apex_tensor_data(apex_var_value(w[0])) + 2 * i * sh.c * sh.c);
    apex_var *b = apex_model_find_param(m[0], names[2 * i + 1]), *b0 = apex_model_find_param(m[0], names[1]);
    assert_ptr_equal((char *)apex_tensor_data(apex_var_value(b)), (char *)apex_tensor_data(apex_var_value(b0)) + 2 * i * sh.c);
  }
  apex_graph *g = apex_graph_create();
  apex_var *cat = apex_concat(g, 3, w, 0);
  assert_true(apex_tensor_shares_storage(apex_var_value(cat), apex_var_value(w[0])));
  apex_graph_destroy(g);
  const mode o2 = {"O2 bf16", APEX_BF16, APEX_F32};
  result f, u;
  run(m[0], attn, NULL, &sh, &o2, &f);
  run(m[1], NULL, lin, &sh, &o2, &u);
  assert_bits("output", "amp O2 bf16", f.y, u.y);
  for (int i = 0; i < 8; i++) assert_bits(names[i], "amp O2 bf16", f.grad[i], u.grad[i]);
  result_free(&f);
  result_free(&u);
  for (int i = 0; i < 2; i++) {
    apex_amp_destroy(amp[i]);
    apex_optimizer_destroy(opt[i]);
    apex_model_destroy(m[i]);
  }
}

/* ---- the packed attention op -------------------------------------------------------------------------- */

static void test_attention_qkv_op(void **state) {
  (void)state;
  enum { B = 2, T = 9, H = 3, D = 4, C = H * D };
  const apex_dtype dts[3] = {APEX_F32, APEX_BF16, APEX_F16};
  for (int di = 0; di < 3; di++) {
    const int64_t s3[3] = {B, T, 3 * C}, s1[3] = {B, T, C};
    apex_var *qkv = tu_random_leaf(dts[di], 3, s3, 21, 1), *part[3];
    for (int p = 0; p < 3; p++) { /* the thirds of each row, as leaves of their own */
      apex_tensor *t = apex_tensor_create(dts[di], 3, s1);
      size_t es = apex_dtype_size(dts[di]);
      for (size_t r = 0; r < (size_t)(B * T); r++)
        memcpy((char *)apex_tensor_data(t) + r * C * es, (char *)apex_tensor_data(apex_var_value(qkv)) + (r * 3 * C + (size_t)p * C) * es, C * es);
      part[p] = apex_var_create(t, 1);
    }
    apex_tensor *y[2];
    for (int path = 0; path < 2; path++) {
      apex_graph *g = apex_graph_create();
      apex_var *o = path ? apex_causal_attention_heads(g, part[0], part[1], part[2], H) : apex_causal_attention_qkv(g, qkv, H);
      assert_non_null(o);
      apex_var *w = tu_random_leaf(APEX_F32, 3, s1, 22, 0);
      TU_OK(apex_backward(apex_sum_all(g, apex_mul(g, apex_cast(g, o, APEX_F32), w)), NULL));
      y[path] = apex_tensor_to(apex_var_value(o), APEX_F32);
      apex_var_destroy(w);
      apex_graph_destroy(g);
    }
    assert_bits("output", apex_dtype_name(dts[di]), y[0], y[1]);
    const apex_tensor *gp = apex_var_grad(qkv);
    for (int p = 0; p < 3; p++)
      for (size_t r = 0; r < (size_t)(B * T); r++)
        for (size_t j = 0; j < C; j++)
          if (apex_tensor_get(gp, r * 3 * C + (size_t)p * C + j) != apex_tensor_get(apex_var_grad(part[p]), r * C + j))
            fail_msg("%s: the packed gradient's third %d differs at row %zu column %zu", apex_dtype_name(dts[di]), p, r, j);
    for (int p = 0; p < 3; p++) apex_var_destroy(part[p]);
    apex_var_destroy(qkv);
    apex_tensor_destroy(y[0]);
    apex_tensor_destroy(y[1]);
  }
  /* bad inputs */
  apex_graph *g = apex_graph_create();
  apex_var *odd = tu_random_leaf(APEX_F32, 3, (int64_t[]){2, 3, 13}, 1, 1), *row = tu_random_leaf(APEX_F32, 1, (int64_t[]){12}, 2, 1),
           *ok = tu_random_leaf(APEX_F32, 3, (int64_t[]){2, 3, 12}, 3, 1);
  assert_null(apex_causal_attention_qkv(g, odd, 1));
  tu_assert_message("3 * heads * D");
  assert_null(apex_causal_attention_qkv(g, row, 1));
  tu_assert_message("[..., T, 3 * heads * D]");
  assert_null(apex_causal_attention_qkv(g, ok, 3));
  tu_assert_message("3 heads do not divide");
  assert_null(apex_causal_attention_qkv(g, ok, 0));
  assert_null(apex_causal_attention_qkv(g, NULL, 1));
  tu_assert_message("NULL");
  assert_null(apex_causal_attention_qkv(NULL, ok, 1));
  assert_non_null(apex_causal_attention_qkv(g, ok, 2));
  apex_var_destroy(odd), apex_var_destroy(row), apex_var_destroy(ok);
  apex_graph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fused_matches_unfused),
      cmocka_unit_test(test_parameters_and_checkpoints),
      cmocka_unit_test(test_separate_values),
      cmocka_unit_test(test_amp_o2_keeps_one_allocation),
      cmocka_unit_test(test_attention_qkv_op),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
