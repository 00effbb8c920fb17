/* test_kernels.c: the raw kernels of apex/kernels.h on every device against autograd's ops.
 *
 * Every kernels.h function runs on CPU tensors through the CPU backend's slots and is compared with the
 * autograd op that computes the same thing (apex/nn_ops.h) on the same inputs, forward and backward, in
 * f32 and bf16: to 1e-6 of the reference's largest magnitude in f32 (the same slots, so mostly the same
 * bits), to 2^-7 (one bf16 rounding at that magnitude) in bf16. Statistics that no op returns (layer norm's
 * mean and rstd, cross entropy's and attention's (max, 1 / sum) rows, batch statistics) are checked
 * against a double-precision closed form of the same inputs to 1e-5. On a GPU (apex_cuda_available) each
 * case runs again on CUDA tensors and is compared with the CPU kernels' results to 1e-4 in f32 (another
 * summation order, no TF32) and 2^-5 in bf16 (half-precision products and stores); without one the CUDA
 * half prints why it is skipped. Bad inputs are refused with a message and change nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/autograd.h"
#include "apex/cuda.h"
#include "apex/kernels.h"
#include "apex/nn_ops.h"
#include "testutil.h"

static int have_cuda;

/* ---- helpers ---------------------------------------------------------------------------------------- */

/* A host tensor of the shape holding tu_random_tensor's values in [-range, range] (rounded to dt). */
static apex_tensor *rnd(apex_dtype dt, int nd, const int64_t *shape, uint64_t seed, float range) {
  apex_tensor *t = apex_tensor_create(dt, nd, shape);
  assert_non_null(t);
  apex_tensor *r = tu_random_tensor(dt, apex_tensor_numel(t), seed, range);
  for (size_t i = 0; i < apex_tensor_numel(t); i++) apex_tensor_set(t, i, apex_tensor_get(r, i));
  apex_tensor_destroy(r);
  return t;
}

/* A copy of h on dev. */
static apex_tensor *on(apex_device dev, const apex_tensor *h) {
  int64_t s[APEX_MAX_DIMS];
  int nd = apex_tensor_ndim(h);
  for (int i = 0; i < nd; i++) s[i] = apex_tensor_dim(h, i);
  apex_tensor *t = apex_tensor_create_on(dev, apex_tensor_dtype(h), nd, s);
  assert_non_null(t);
  TU_OK(apex_tensor_copy(t, h));
  return t;
}

/* An output on dev, filled with 7 so that an element left unwritten shows. */
static apex_tensor *out_on(apex_device dev, apex_dtype dt, int nd, const int64_t *shape) {
  apex_tensor *t = apex_tensor_create_on(dev, dt, nd, shape);
  assert_non_null(t);
  TU_OK(apex_tensor_fill(t, 7.0f));
  return t;
}

/* A host copy of t (t destroyed when own). */
static apex_tensor *host(apex_tensor *t, int own) {
  if (!t) return NULL;
  int64_t s[APEX_MAX_DIMS];
  int nd = apex_tensor_ndim(t);
  for (int i = 0; i < nd; i++) s[i] = apex_tensor_dim(t, i);
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(t), nd, s);
  TU_OK(apex_tensor_copy(h, t));
  if (own) apex_tensor_destroy(t);
  return h;
}

/* A leaf over a copy of h. */
static apex_var *leaf(const apex_tensor *h, int rg) { return apex_var_create(on(APEX_DEVICE_CPU, h), rg); }

/* got against ref, element by element, to tol times ref's largest magnitude (NaN matches NaN). */
static void close_to(const apex_tensor *got_, const apex_tensor *ref_, double tol, const char *what) {
  apex_tensor *got = host((apex_tensor *)got_, 0), *ref = host((apex_tensor *)ref_, 0);
  size_t n = apex_tensor_numel(ref);
  if (apex_tensor_numel(got) != n) fail_msg("%s: %zu elements, %zu expected", what, apex_tensor_numel(got), n);
  double scale = 1e-30, worst = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(apex_tensor_get(ref, i)));
  for (size_t i = 0; i < n; i++) {
    double g = apex_tensor_get(got, i), r = apex_tensor_get(ref, i);
    if (isnan(g) && isnan(r)) continue;
    double e = fabs(g - r) / scale;
    if (!(e <= tol)) fail_msg("%s: element %zu is %.9g, reference %.9g (largest %.4g, tol %.2g)", what, i, g, r, scale, tol);
    worst = fmax(worst, e);
  }
  printf("  %-44s %-4s n=%-6zu worst %.2e of %.2e  PASS\n", what, apex_dtype_name(apex_tensor_dtype(got)), n, worst, tol);
  apex_tensor_destroy(got);
  apex_tensor_destroy(ref);
}

/* The bound against autograd on the CPU, and CUDA's against the CPU kernels. */
static double tol_ag(apex_dtype dt) { return dt == APEX_F32 ? 1e-6 : 1.0 / 128; }
static double tol_dev(apex_dtype dt) { return dt == APEX_F32 ? 1e-4 : 1.0 / 32; }

/* A f32 host tensor of n doubles. */
static apex_tensor *from_doubles(const double *v, size_t n) {
  int64_t s = (int64_t)n;
  apex_tensor *t = apex_tensor_create(APEX_F32, 1, &s);
  for (size_t i = 0; i < n; i++) apex_tensor_set(t, i, (float)v[i]);
  return t;
}

/* The log-sum-exp m - log r of each (m, r) row of kernel statistics. */
static apex_tensor *lse_of(const apex_tensor *stats) {
  apex_tensor *h = host((apex_tensor *)stats, 0);
  size_t n = apex_tensor_numel(h) / 2;
  double *v = malloc((n ? n : 1) * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = apex_tensor_get(h, 2 * i) - log(apex_tensor_get(h, 2 * i + 1));
  apex_tensor *t = from_doubles(v, n);
  free(v);
  apex_tensor_destroy(h);
  return t;
}

#define MAX_OUT 12
/* A case's outputs, copied to the host, for one device. */
typedef struct outs {
  int n;
  apex_tensor *t[MAX_OUT];
  const char *name[MAX_OUT];
} outs;

static void keep(outs *o, const char *name, apex_tensor *dev_t) {
  o->name[o->n] = name;
  o->t[o->n++] = host(dev_t, 1);
}

static void outs_free(outs *o) {
  for (int i = 0; i < o->n; i++) apex_tensor_destroy(o->t[i]);
  o->n = 0;
}

/* The CUDA run of a case against its CPU run, or why it is skipped. */
static void cuda_vs_cpu(const char *what, apex_dtype dt, void (*run)(apex_device, apex_dtype, outs *), const outs *cpu) {
  if (!have_cuda) return;
  outs g = {0};
  run(APEX_DEVICE_CUDA, dt, &g);
  for (int i = 0; i < g.n; i++) {
    char buf[96];
    snprintf(buf, sizeof buf, "cuda %s %s", what, g.name[i]);
    close_to(g.t[i], cpu->t[i], tol_dev(dt), buf);
  }
  outs_free(&g);
}

static const apex_dtype DTS[2] = {APEX_F32, APEX_BF16};

/* ---- layer norm and RMS norm ---------------------------------------------------------------------- */

enum { LN_R = 37, LN_D = 67 };
static int ln_rms;

static void run_layer_norm(apex_device dev, apex_dtype dt, outs *o) {
  int64_t sx[2] = {LN_R, LN_D}, sd = LN_D, sr = LN_R;
  apex_tensor *hx = rnd(dt, 2, sx, 11, 3.0f), *hw = rnd(dt, 1, &sd, 12, 1.0f), *hb = rnd(dt, 1, &sd, 13, 1.0f),
              *hdy = rnd(dt, 2, sx, 14, 1.0f);
  apex_tensor *x = on(dev, hx), *w = on(dev, hw), *b = on(dev, hb), *dy = on(dev, hdy);
  apex_tensor *y = out_on(dev, dt, 2, sx), *mean = out_on(dev, APEX_F32, 1, &sr), *rstd = out_on(dev, APEX_F32, 1, &sr);
  TU_OK(apex_kernel_layer_norm_forward(x, w, ln_rms ? NULL : b, 1e-5f, ln_rms, y, ln_rms ? NULL : mean, rstd));
  apex_tensor *dx = out_on(dev, dt, 2, sx), *dw = out_on(dev, dt, 1, &sd), *db = out_on(dev, dt, 1, &sd);
  TU_OK(apex_kernel_layer_norm_backward(dy, x, w, ln_rms ? NULL : mean, rstd, ln_rms, dx, dw, ln_rms ? NULL : db));
  keep(o, "y", y), keep(o, "rstd", rstd), keep(o, "dx", dx), keep(o, "dw", dw);
  if (!ln_rms) keep(o, "mean", mean), keep(o, "db", db);
  else apex_tensor_destroy(mean), apex_tensor_destroy(db);
  apex_tensor *all[] = {hx, hw, hb, hdy, x, w, b, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void test_layer_norm(void **state) {
  (void)state;
  for (ln_rms = 0; ln_rms <= 1; ln_rms++)
    for (int d = 0; d < 2; d++) {
      apex_dtype dt = DTS[d];
      outs c = {0};
      run_layer_norm(APEX_DEVICE_CPU, dt, &c);
      /* the same inputs through autograd */
      int64_t sx[2] = {LN_R, LN_D}, sd = LN_D;
      apex_tensor *hx = rnd(dt, 2, sx, 11, 3.0f), *hw = rnd(dt, 1, &sd, 12, 1.0f), *hb = rnd(dt, 1, &sd, 13, 1.0f),
                  *hdy = rnd(dt, 2, sx, 14, 1.0f);
      apex_graph *g = apex_graph_create();
      apex_var *vx = leaf(hx, 1), *vw = leaf(hw, 1), *vb = leaf(hb, 1);
      apex_var *vy = ln_rms ? apex_rms_norm(g, vx, vw, 1e-5f) : apex_layer_norm(g, vx, vw, vb, 1e-5f);
      assert_non_null(vy);
      TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = hdy}));
      const char *what = ln_rms ? "rms_norm" : "layer_norm";
      char buf[64];
      snprintf(buf, sizeof buf, "%s y", what), close_to(c.t[0], apex_var_value(vy), tol_ag(dt), buf);
      snprintf(buf, sizeof buf, "%s dx", what), close_to(c.t[2], apex_var_grad(vx), tol_ag(dt), buf);
      snprintf(buf, sizeof buf, "%s dw", what), close_to(c.t[3], apex_var_grad(vw), tol_ag(dt), buf);
      if (!ln_rms) close_to(c.t[5], apex_var_grad(vb), tol_ag(dt), "layer_norm db");
      /* mean and rstd in double */
      double mean[LN_R], rstd[LN_R];
      for (int r = 0; r < LN_R; r++) {
        double s = 0, q = 0;
        for (int j = 0; j < LN_D; j++) s += apex_tensor_get(hx, (size_t)(r * LN_D + j));
        double m = ln_rms ? 0 : s / LN_D;
        for (int j = 0; j < LN_D; j++) {
          double v = apex_tensor_get(hx, (size_t)(r * LN_D + j)) - m;
          q += v * v;
        }
        mean[r] = m, rstd[r] = 1.0 / sqrt(q / LN_D + 1e-5);
      }
      apex_tensor *rr = from_doubles(rstd, LN_R), *rm = from_doubles(mean, LN_R);
      snprintf(buf, sizeof buf, "%s rstd", what), close_to(c.t[1], rr, 1e-5, buf);
      if (!ln_rms) close_to(c.t[4], rm, 1e-5, "layer_norm mean");
      apex_tensor_destroy(rr), apex_tensor_destroy(rm);
      cuda_vs_cpu(what, dt, run_layer_norm, &c);
      outs_free(&c);
      apex_graph_destroy(g);
      apex_var_destroy(vx), apex_var_destroy(vw), apex_var_destroy(vb);
      apex_tensor_destroy(hx), apex_tensor_destroy(hw), apex_tensor_destroy(hb), apex_tensor_destroy(hdy);
    }
}

/* ---- cross entropy ---------------------------------------------------------------------------------- */

enum { XE_R = 29, XE_C = 301 };
static const float XE_EPS = 0.1f;

static void xe_targets(int64_t *t) {
  for (int r = 0; r < XE_R; r++) t[r] = r == 3 ? -1 : (r * 7919) % XE_C;
}

static void run_xent(apex_device dev, apex_dtype dt, outs *o) {
  int64_t sl[2] = {XE_R, XE_C}, sr = XE_R, s2[2] = {XE_R, 2}, tgt[XE_R], two = 2 * XE_R;
  xe_targets(tgt);
  apex_tensor *hl = rnd(dt, 2, sl, 21, 6.0f), *hdl = rnd(APEX_F32, 1, &sr, 22, 1.0f);
  /* the int64 targets travel as raw bytes in an f32 tensor of twice the length */
  apex_tensor *ht = apex_tensor_wrap(tgt, APEX_F32, 1, &two), *dt_ = on(dev, ht);
  apex_tensor *l = on(dev, hl), *dloss = on(dev, hdl), *loss = out_on(dev, APEX_F32, 1, &sr), *st = out_on(dev, APEX_F32, 2, s2);
  const int64_t *d_tgt = apex_tensor_data(dt_);
  TU_OK(apex_kernel_cross_entropy_forward(l, d_tgt, XE_EPS, loss, st));
  apex_tensor *dl = out_on(dev, dt, 2, sl);
  TU_OK(apex_kernel_cross_entropy_backward(dloss, l, d_tgt, st, XE_EPS, dl));
  /* in place: dlogits may be the logits themselves */
  TU_OK(apex_kernel_cross_entropy_backward(dloss, l, d_tgt, st, XE_EPS, l));
  keep(o, "loss", loss), keep(o, "stats", st), keep(o, "dlogits", dl), keep(o, "dlogits in place", l);
  apex_tensor *all[] = {hl, hdl, ht, dt_, dloss};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void test_cross_entropy(void **state) {
  (void)state;
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = DTS[d];
    outs c = {0};
    run_xent(APEX_DEVICE_CPU, dt, &c);
    int64_t sl[2] = {XE_R, XE_C}, sr = XE_R, tgt[XE_R];
    xe_targets(tgt);
    apex_tensor *hl = rnd(dt, 2, sl, 21, 6.0f), *hdl = rnd(APEX_F32, 1, &sr, 22, 1.0f);
    apex_graph *g = apex_graph_create();
    apex_var *vl = leaf(hl, 1);
    apex_var *vloss = apex_cross_entropy(g, vl, tgt, &(apex_cross_entropy_options){.reduction = APEX_REDUCTION_NONE, .use_ignore_index = 1,
                                                                                  .ignore_index = -1, .label_smoothing = XE_EPS});
    assert_non_null(vloss);
    TU_OK(apex_backward(vloss, &(apex_backward_options){.grad_output = hdl}));
    close_to(c.t[0], apex_var_value(vloss), tol_ag(dt), "cross_entropy loss");
    close_to(c.t[2], apex_var_grad(vl), tol_ag(dt), "cross_entropy dlogits");
    close_to(c.t[3], apex_var_grad(vl), tol_ag(dt), "cross_entropy dlogits in place");
    /* the stats' log-sum-exp in double */
    double lse[XE_R];
    for (int r = 0; r < XE_R; r++) {
      double m = -INFINITY, s = 0;
      for (int j = 0; j < XE_C; j++) m = fmax(m, apex_tensor_get(hl, (size_t)(r * XE_C + j)));
      for (int j = 0; j < XE_C; j++) s += exp(apex_tensor_get(hl, (size_t)(r * XE_C + j)) - m);
      lse[r] = m + log(s);
    }
    apex_tensor *got = lse_of(c.t[1]), *ref = from_doubles(lse, XE_R);
    close_to(got, ref, 1e-5, "cross_entropy stats (log-sum-exp)");
    apex_tensor_destroy(got), apex_tensor_destroy(ref);
    cuda_vs_cpu("cross_entropy", dt, run_xent, &c);
    outs_free(&c);
    apex_graph_destroy(g);
    apex_var_destroy(vl);
    apex_tensor_destroy(hl), apex_tensor_destroy(hdl);
  }
  /* a target outside [-1, classes) on the CPU: refused, nothing written */
  int64_t sl[2] = {2, 3}, sr = 2, s2[2] = {2, 2}, bad[2] = {0, 3};
  apex_tensor *l = rnd(APEX_F32, 2, sl, 1, 1.0f), *loss = out_on(APEX_DEVICE_CPU, APEX_F32, 1, &sr),
              *st = out_on(APEX_DEVICE_CPU, APEX_F32, 2, s2);
  TU_FAILS(apex_kernel_cross_entropy_forward(l, bad, 0.0f, loss, st), APEX_ERR_INVALID_ARG, "target 3 of row 1 is outside [-1, 3)");
  int64_t good[2] = {0, -1};
  TU_FAILS(apex_kernel_cross_entropy_forward(l, good, 0.0f, loss, loss), APEX_ERR_SHAPE, "stats has shape");
  for (size_t i = 0; i < 2; i++) assert_true(apex_tensor_get(loss, i) == 7.0f);
  apex_tensor_destroy(l), apex_tensor_destroy(loss), apex_tensor_destroy(st);
}

/* ---- batch statistics ------------------------------------------------------------------------------ */

static void run_bn_stats(apex_device dev, apex_dtype dt, outs *o) {
  int64_t sx[4] = {3, 5, 7, 6}, sc = 5;
  apex_tensor *hx = rnd(dt, 4, sx, 31, 4.0f), *x = on(dev, hx);
  apex_tensor *mean = out_on(dev, APEX_F32, 1, &sc), *var = out_on(dev, APEX_F32, 1, &sc), *m2 = out_on(dev, APEX_F32, 1, &sc);
  TU_OK(apex_kernel_batch_norm_stats(x, mean, var, m2));
  keep(o, "mean", mean), keep(o, "var", var), keep(o, "m2", m2);
  apex_tensor_destroy(hx), apex_tensor_destroy(x);
}

static void test_batch_norm_stats(void **state) {
  (void)state;
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = DTS[d];
    outs c = {0};
    run_bn_stats(APEX_DEVICE_CPU, dt, &c);
    int64_t sx[4] = {3, 5, 7, 6}, sc = 5;
    const double M = 3 * 7 * 6;
    apex_tensor *hx = rnd(dt, 4, sx, 31, 4.0f);
    /* autograd's batch norm with momentum 1 leaves the batch's mean and unbiased variance in the running
     * statistics */
    apex_tensor *rm = apex_tensor_create(APEX_F32, 1, &sc), *rv = apex_tensor_create(APEX_F32, 1, &sc);
    TU_OK(apex_tensor_fill(rm, 0.0f));
    TU_OK(apex_tensor_fill(rv, 1.0f));
    apex_graph *g = apex_graph_create();
    apex_var *vx = leaf(hx, 0);
    assert_non_null(apex_batch_norm(g, vx, NULL, NULL, rm, rv, &(apex_batch_norm_options){.training = 1, .momentum = 1.0f}));
    close_to(c.t[0], rm, 1e-6, "batch_norm_stats mean");
    apex_tensor *var = apex_tensor_create(APEX_F32, 1, &sc), *m2 = apex_tensor_create(APEX_F32, 1, &sc);
    for (size_t i = 0; i < 5; i++) {
      apex_tensor_set(var, i, (float)(apex_tensor_get(rv, i) * (M - 1) / M));
      apex_tensor_set(m2, i, (float)(apex_tensor_get(rv, i) * (M - 1)));
    }
    close_to(c.t[1], var, 1e-6, "batch_norm_stats var");
    close_to(c.t[2], m2, 1e-6, "batch_norm_stats m2");
    cuda_vs_cpu("batch_norm_stats", dt, run_bn_stats, &c);
    outs_free(&c);
    apex_graph_destroy(g);
    apex_var_destroy(vx);
    apex_tensor_destroy(hx), apex_tensor_destroy(rm), apex_tensor_destroy(rv), apex_tensor_destroy(var), apex_tensor_destroy(m2);
  }
}

/* ---- products ------------------------------------------------------------------------------------------- */

enum { MM_M = 19, MM_K = 33, MM_N = 23 };

/* The products of a linear layer y = gelu?(x w^T + b) and its backward, as a transformer's MLP runs them:
 * forward (trans_b, bias, GELU), dx = dy w, dw = dy^T x (trans_a), and an accumulation
 * c = 0.5 dy^T x + 2 c (alpha, beta). */
static void run_matmul(apex_device dev, apex_dtype dt, outs *o) {
  int64_t sx[2] = {MM_M, MM_K}, sw[2] = {MM_N, MM_K}, sy[2] = {MM_M, MM_N}, sn = MM_N;
  apex_tensor *hx = rnd(dt, 2, sx, 41, 1.0f), *hw = rnd(dt, 2, sw, 42, 1.0f), *hb = rnd(dt, 1, &sn, 43, 1.0f), *hdy = rnd(dt, 2, sy, 44, 1.0f);
  apex_tensor *x = on(dev, hx), *w = on(dev, hw), *b = on(dev, hb), *dy = on(dev, hdy);
  apex_tensor *y = out_on(dev, dt, 2, sy), *yg = out_on(dev, dt, 2, sy), *dx = out_on(dev, dt, 2, sx), *dw = out_on(dev, dt, 2, sw);
  apex_tensor *acc = on(dev, hw);
  TU_OK(apex_kernel_matmul(x, 0, w, 1, y, 1.0f, 0.0f, b, 0));
  TU_OK(apex_kernel_matmul(x, 0, w, 1, yg, 1.0f, 0.0f, b, 1));
  TU_OK(apex_kernel_matmul(dy, 0, w, 0, dx, 1.0f, 0.0f, NULL, 0));
  TU_OK(apex_kernel_matmul(dy, 1, x, 0, dw, 1.0f, 0.0f, NULL, 0));
  TU_OK(apex_kernel_matmul(dy, 1, x, 0, acc, 0.5f, 2.0f, NULL, 0));
  keep(o, "x w^T + b", y), keep(o, "gelu(x w^T + b)", yg), keep(o, "dy w", dx), keep(o, "dy^T x", dw), keep(o, "0.5 dy^T x + 2 c", acc);
  apex_tensor *all[] = {hx, hw, hb, hdy, x, w, b, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void test_matmul(void **state) {
  (void)state;
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = DTS[d];
    outs c = {0};
    run_matmul(APEX_DEVICE_CPU, dt, &c);
    int64_t sx[2] = {MM_M, MM_K}, sw[2] = {MM_N, MM_K}, sy[2] = {MM_M, MM_N}, sn = MM_N;
    apex_tensor *hx = rnd(dt, 2, sx, 41, 1.0f), *hw = rnd(dt, 2, sw, 42, 1.0f), *hb = rnd(dt, 1, &sn, 43, 1.0f),
                *hdy = rnd(dt, 2, sy, 44, 1.0f);
    apex_graph *g = apex_graph_create();
    apex_var *vx = leaf(hx, 1), *vw = leaf(hw, 1), *vb = leaf(hb, 1);
    apex_var *vy = apex_linear(g, vx, vw, vb), *vyg = apex_gelu_tanh(g, apex_linear(g, vx, vw, vb));
    assert_non_null(vy), assert_non_null(vyg);
    /* the backward of the plain linear: gx = dy w, gw = dy^T x */
    TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = hdy}));
    close_to(c.t[0], apex_var_value(vy), tol_ag(dt), "matmul x w^T + b (apex_linear)");
    close_to(c.t[1], apex_var_value(vyg), tol_ag(dt), "matmul gelu epilogue (apex_gelu_tanh)");
    close_to(c.t[2], apex_var_grad(vx), tol_ag(dt), "matmul dy w (linear's dx)");
    close_to(c.t[3], apex_var_grad(vw), tol_ag(dt), "matmul dy^T x (linear's dw)");
    /* alpha and beta: 0.5 * (dy^T x) + 2 * w through autograd's scale and add */
    apex_graph *g2 = apex_graph_create();
    apex_var *dyv = leaf(hdy, 0), *xv = leaf(hx, 0), *wv = leaf(hw, 0);
    apex_var *r = apex_add(g2, apex_scale(g2, apex_matmul(g2, apex_transpose(g2, dyv, 0, 1), xv), 0.5f), apex_scale(g2, wv, 2.0f));
    assert_non_null(r);
    close_to(c.t[4], apex_var_value(r), dt == APEX_F32 ? tol_ag(dt) : 2 * tol_ag(dt), "matmul alpha, beta");
    cuda_vs_cpu("matmul", dt, run_matmul, &c);
    outs_free(&c);
    apex_graph_destroy(g), apex_graph_destroy(g2);
    apex_var_destroy(vx), apex_var_destroy(vw), apex_var_destroy(vb), apex_var_destroy(dyv), apex_var_destroy(xv), apex_var_destroy(wv);
    apex_tensor_destroy(hx), apex_tensor_destroy(hw), apex_tensor_destroy(hb), apex_tensor_destroy(hdy);
  }
}

/* ---- convolution --------------------------------------------------------------------------------------- */

static const apex_conv2d_options CONV = {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 2};

static void run_conv(apex_device dev, apex_dtype dt, outs *o) {
  int64_t sx[4] = {2, 3, 9, 8}, sw[4] = {4, 3, 3, 2}, sb = 4, sy[4] = {2, 4, 5, 11};
  apex_tensor *hx = rnd(dt, 4, sx, 51, 1.0f), *hw = rnd(dt, 4, sw, 52, 1.0f), *hb = rnd(dt, 1, &sb, 53, 1.0f), *hdy = rnd(dt, 4, sy, 54, 1.0f);
  apex_tensor *x = on(dev, hx), *w = on(dev, hw), *b = on(dev, hb), *dy = on(dev, hdy);
  apex_tensor *y = out_on(dev, dt, 4, sy), *dx = out_on(dev, dt, 4, sx), *dw = out_on(dev, dt, 4, sw), *db = out_on(dev, dt, 1, &sb);
  TU_OK(apex_kernel_conv2d_forward(x, w, b, &CONV, y));
  TU_OK(apex_kernel_conv2d_backward(dy, x, w, &CONV, dx, dw, db));
  keep(o, "y", y), keep(o, "dx", dx), keep(o, "dw", dw), keep(o, "db", db);
  apex_tensor *all[] = {hx, hw, hb, hdy, x, w, b, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void test_conv2d(void **state) {
  (void)state;
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = DTS[d];
    outs c = {0};
    run_conv(APEX_DEVICE_CPU, dt, &c);
    int64_t sx[4] = {2, 3, 9, 8}, sw[4] = {4, 3, 3, 2}, sb = 4, sy[4] = {2, 4, 5, 11};
    apex_tensor *hx = rnd(dt, 4, sx, 51, 1.0f), *hw = rnd(dt, 4, sw, 52, 1.0f), *hb = rnd(dt, 1, &sb, 53, 1.0f), *hdy = rnd(dt, 4, sy, 54, 1.0f);
    apex_graph *g = apex_graph_create();
    apex_var *vx = leaf(hx, 1), *vw = leaf(hw, 1), *vb = leaf(hb, 1), *vy = apex_conv2d(g, vx, vw, vb, &CONV);
    assert_non_null(vy);
    TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = hdy}));
    close_to(c.t[0], apex_var_value(vy), tol_ag(dt), "conv2d y");
    close_to(c.t[1], apex_var_grad(vx), tol_ag(dt), "conv2d dx");
    close_to(c.t[2], apex_var_grad(vw), tol_ag(dt), "conv2d dw");
    close_to(c.t[3], apex_var_grad(vb), tol_ag(dt), "conv2d db");
    cuda_vs_cpu("conv2d", dt, run_conv, &c);
    outs_free(&c);
    apex_graph_destroy(g);
    apex_var_destroy(vx), apex_var_destroy(vw), apex_var_destroy(vb);
    apex_tensor_destroy(hx), apex_tensor_destroy(hw), apex_tensor_destroy(hb), apex_tensor_destroy(hdy);
  }
}

/* ---- embedding ------------------------------------------------------------------------------------------ */

enum { EM_V = 11, EM_D = 13, EM_N = 17 };
static void em_ids(int64_t *ids) {
  for (int i = 0; i < EM_N; i++) ids[i] = (i * 5) % 7; /* repeats, and rows 7..10 never named */
}

static void run_embedding(apex_device dev, apex_dtype dt, outs *o) {
  int64_t st[2] = {EM_V, EM_D}, sy[2] = {EM_N, EM_D}, ids[EM_N];
  em_ids(ids);
  apex_tensor *ht = rnd(dt, 2, st, 61, 1.0f), *hdy = rnd(dt, 2, sy, 62, 1.0f), *t = on(dev, ht), *dy = on(dev, hdy);
  apex_tensor *y = out_on(dev, dt, 2, sy), *dt_ = out_on(dev, dt, 2, st);
  TU_OK(apex_kernel_embedding_forward(t, ids, EM_N, y));
  TU_OK(apex_kernel_embedding_backward(dy, ids, EM_N, dt_));
  keep(o, "y", y), keep(o, "dtable", dt_);
  apex_tensor_destroy(ht), apex_tensor_destroy(hdy), apex_tensor_destroy(t), apex_tensor_destroy(dy);
}

static void test_embedding(void **state) {
  (void)state;
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = DTS[d];
    outs c = {0};
    run_embedding(APEX_DEVICE_CPU, dt, &c);
    int64_t st[2] = {EM_V, EM_D}, sy[2] = {EM_N, EM_D}, ids[EM_N], n = EM_N;
    em_ids(ids);
    apex_tensor *ht = rnd(dt, 2, st, 61, 1.0f), *hdy = rnd(dt, 2, sy, 62, 1.0f);
    apex_graph *g = apex_graph_create();
    apex_var *vt = leaf(ht, 1), *vy = apex_embedding(g, vt, ids, 1, &n);
    assert_non_null(vy);
    TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = hdy}));
    close_to(c.t[0], apex_var_value(vy), 0.0, "embedding y");
    close_to(c.t[1], apex_var_grad(vt), tol_ag(dt), "embedding dtable");
    cuda_vs_cpu("embedding", dt, run_embedding, &c);
    outs_free(&c);
    apex_graph_destroy(g);
    apex_var_destroy(vt);
    apex_tensor_destroy(ht), apex_tensor_destroy(hdy);
  }
}

/* ---- attention ------------------------------------------------------------------------------------------ */

enum { AT_B = 2, AT_T = 9, AT_H = 3, AT_D = 8, AT_C = AT_H * AT_D };

static void run_attention(apex_device dev, apex_dtype dt, outs *o) {
  int64_t sq[3] = {AT_B, AT_T, 3 * AT_C}, sy[3] = {AT_B, AT_T, AT_C}, ss[4] = {AT_B, AT_H, AT_T, 2};
  apex_tensor *hq = rnd(dt, 3, sq, 71, 2.0f), *hdy = rnd(dt, 3, sy, 72, 1.0f), *q = on(dev, hq), *dy = on(dev, hdy);
  apex_tensor *y = out_on(dev, dt, 3, sy), *st = out_on(dev, APEX_F32, 4, ss), *dq = out_on(dev, dt, 3, sq);
  TU_OK(apex_kernel_attention_forward(q, AT_H, y, st));
  TU_OK(apex_kernel_attention_backward(dy, q, y, st, AT_H, dq));
  keep(o, "y", y), keep(o, "stats", st), keep(o, "dqkv", dq);
  apex_tensor_destroy(hq), apex_tensor_destroy(hdy), apex_tensor_destroy(q), apex_tensor_destroy(dy);
}

/* Element (b, t, h, d) of third w of a packed [B, T, n * C] tensor, and of a [B, H, T, D] one. */
static size_t packed(int n, int b, int t, int w, int h, int d) { return ((size_t)(b * AT_T + t) * n + w) * AT_C + (size_t)(h * AT_D + d); }
static size_t heads(int b, int t, int h, int d) { return (((size_t)b * AT_H + h) * AT_T + t) * AT_D + (size_t)d; }

static void test_attention(void **state) {
  (void)state;
  for (int di = 0; di < 2; di++) {
    apex_dtype dt = DTS[di];
    outs c = {0};
    run_attention(APEX_DEVICE_CPU, dt, &c);
    int64_t sq[3] = {AT_B, AT_T, 3 * AT_C}, sy[3] = {AT_B, AT_T, AT_C}, sh[4] = {AT_B, AT_H, AT_T, AT_D};
    apex_tensor *hq = rnd(dt, 3, sq, 71, 2.0f), *hdy = rnd(dt, 3, sy, 72, 1.0f);
    /* autograd's causal attention on [B, H, T, D] permutes of the same values */
    apex_tensor *p[3], *pdy = apex_tensor_create(dt, 4, sh);
    for (int w = 0; w < 3; w++) p[w] = apex_tensor_create(dt, 4, sh);
    for (int b = 0; b < AT_B; b++)
      for (int t = 0; t < AT_T; t++)
        for (int h = 0; h < AT_H; h++)
          for (int d = 0; d < AT_D; d++) {
            for (int w = 0; w < 3; w++) apex_tensor_set(p[w], heads(b, t, h, d), apex_tensor_get(hq, packed(3, b, t, w, h, d)));
            apex_tensor_set(pdy, heads(b, t, h, d), apex_tensor_get(hdy, packed(1, b, t, 0, h, d)));
          }
    apex_graph *g = apex_graph_create();
    apex_var *vq = apex_var_create(p[0], 1), *vk = apex_var_create(p[1], 1), *vv = apex_var_create(p[2], 1);
    apex_var *vy = apex_causal_attention(g, vq, vk, vv);
    assert_non_null(vy);
    TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = pdy}));
    /* the references packed back as the kernels lay them out */
    apex_tensor *ry = apex_tensor_create(dt, 3, sy), *rg = apex_tensor_create(dt, 3, sq);
    const apex_tensor *grads[3] = {apex_var_grad(vq), apex_var_grad(vk), apex_var_grad(vv)};
    double lse[AT_B * AT_H * AT_T];
    for (int b = 0; b < AT_B; b++)
      for (int t = 0; t < AT_T; t++)
        for (int h = 0; h < AT_H; h++) {
          for (int d = 0; d < AT_D; d++) {
            apex_tensor_set(ry, packed(1, b, t, 0, h, d), apex_tensor_get(apex_var_value(vy), heads(b, t, h, d)));
            for (int w = 0; w < 3; w++) apex_tensor_set(rg, packed(3, b, t, w, h, d), apex_tensor_get(grads[w], heads(b, t, h, d)));
          }
          double s[AT_T], m = -INFINITY, e = 0;
          for (int u = 0; u <= t; u++) {
            double dot = 0;
            for (int d = 0; d < AT_D; d++) dot += (double)apex_tensor_get(hq, packed(3, b, t, 0, h, d)) * apex_tensor_get(hq, packed(3, b, u, 1, h, d));
            s[u] = dot / sqrt((double)AT_D);
            m = fmax(m, s[u]);
          }
          for (int u = 0; u <= t; u++) e += exp(s[u] - m);
          lse[((size_t)b * AT_H + h) * AT_T + t] = m + log(e);
        }
    close_to(c.t[0], ry, tol_ag(dt), "attention y (apex_causal_attention)");
    close_to(c.t[2], rg, tol_ag(dt), "attention dqkv");
    apex_tensor *got = lse_of(c.t[1]), *ref = from_doubles(lse, AT_B * AT_H * AT_T);
    close_to(got, ref, 1e-5, "attention stats (log-sum-exp)");
    apex_tensor_destroy(got), apex_tensor_destroy(ref);
    cuda_vs_cpu("attention", dt, run_attention, &c);
    outs_free(&c);
    apex_graph_destroy(g);
    apex_var_destroy(vq), apex_var_destroy(vk), apex_var_destroy(vv);
    apex_tensor_destroy(hq), apex_tensor_destroy(hdy), apex_tensor_destroy(pdy), apex_tensor_destroy(ry), apex_tensor_destroy(rg);
  }
}

/* ---- elementwise and sums --------------------------------------------------------------------------------- */

enum { EW_R = 7, EW_C = 45 };

static void run_elementwise(apex_device dev, apex_dtype dt, outs *o) {
  int64_t s[2] = {EW_R, EW_C}, sc = EW_C, s1 = 1;
  apex_tensor *ha = rnd(dt, 2, s, 81, 3.0f), *hb = rnd(dt, 2, s, 82, 3.0f), *hdy = rnd(dt, 2, s, 83, 1.0f);
  apex_tensor *a = on(dev, ha), *b = on(dev, hb), *dy = on(dev, hdy);
  apex_tensor *r[9];
  for (int i = 0; i < 7; i++) r[i] = out_on(dev, dt, 2, s);
  TU_OK(apex_kernel_add(a, b, r[0]));
  TU_OK(apex_kernel_mul(a, b, r[1]));
  TU_OK(apex_kernel_scale(a, -0.75f, r[2]));
  TU_OK(apex_kernel_relu_forward(a, r[3]));
  TU_OK(apex_kernel_relu_backward(dy, a, r[4]));
  TU_OK(apex_kernel_gelu_forward(a, r[5]));
  TU_OK(apex_kernel_gelu_backward(dy, a, r[6]));
  r[7] = out_on(dev, dt, 1, &sc);
  TU_OK(apex_kernel_sum_rows(a, r[7], 0));
  r[8] = out_on(dev, APEX_F32, 1, &s1);
  TU_OK(apex_kernel_sum_all(a, 1, r[8]));
  static const char *names[9] = {"add", "mul", "scale", "relu", "relu backward", "gelu", "gelu backward", "sum_rows", "sum_all (mean)"};
  for (int i = 0; i < 9; i++) keep(o, names[i], r[i]);
  /* sum_rows accumulating, and an in-place add */
  apex_tensor *acc = on(dev, hdy), *accr = out_on(dev, dt, 1, &sc);
  TU_OK(apex_tensor_copy(accr, o->t[7]));
  TU_OK(apex_kernel_sum_rows(b, accr, 1));
  TU_OK(apex_kernel_add(acc, a, acc));
  keep(o, "sum_rows accumulate", accr), keep(o, "add in place", acc);
  /* dx = dy in place (an MLP backward without cuBLASLt's epilogue): the CPU slot clears dx before it
   * adds into it, so it must not read dy from there */
  apex_tensor *gin = on(dev, hdy);
  TU_OK(apex_kernel_gelu_backward(gin, a, gin));
  keep(o, "gelu backward in place", gin);
  apex_tensor *all[] = {ha, hb, hdy, a, b, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void test_elementwise_and_sums(void **state) {
  (void)state;
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = DTS[d];
    outs c = {0};
    run_elementwise(APEX_DEVICE_CPU, dt, &c);
    int64_t s[2] = {EW_R, EW_C};
    apex_tensor *ha = rnd(dt, 2, s, 81, 3.0f), *hb = rnd(dt, 2, s, 82, 3.0f), *hdy = rnd(dt, 2, s, 83, 1.0f);
    apex_graph *g = apex_graph_create();
    apex_var *va = leaf(ha, 1), *vb = leaf(hb, 0), *va2 = leaf(ha, 1);
    apex_var *add = apex_add(g, va, vb), *mul = apex_mul(g, va, vb), *sc = apex_scale(g, va, -0.75f);
    apex_var *relu = apex_relu(g, va), *gelu = apex_gelu_tanh(g, va2);
    apex_var *sr = apex_sum(g, va, 0, 0), *sa = apex_mean_all(g, va);
    apex_var *sr2 = apex_add(g, apex_sum(g, va, 0, 0), apex_sum(g, vb, 0, 0));
    assert_true(add && mul && sc && relu && gelu && sr && sa && sr2);
    close_to(c.t[0], apex_var_value(add), 0.0, "add");
    close_to(c.t[1], apex_var_value(mul), 0.0, "mul");
    close_to(c.t[2], apex_var_value(sc), 0.0, "scale");
    close_to(c.t[3], apex_var_value(relu), 0.0, "relu");
    close_to(c.t[5], apex_var_value(gelu), 0.0, "gelu (tanh form)");
    close_to(c.t[7], apex_var_value(sr), tol_ag(dt), "sum_rows (apex_sum over dim 0)");
    close_to(c.t[8], apex_var_value(sa), tol_ag(dt), "sum_all mean (apex_mean_all)"); /* the op's mean is x's dtype */
    close_to(c.t[9], apex_var_value(sr2), dt == APEX_F32 ? 1e-6 : 2 * tol_ag(dt), "sum_rows accumulate");
    /* acc = dy + a in place */
    apex_graph *g3 = apex_graph_create();
    apex_var *vdy = leaf(hdy, 0), *va3 = leaf(ha, 0), *ip = apex_add(g3, vdy, va3);
    assert_non_null(ip);
    close_to(c.t[10], apex_var_value(ip), 0.0, "add in place");
    apex_graph_destroy(g3);
    apex_var_destroy(vdy), apex_var_destroy(va3);
    /* the activations' backward from dy */
    TU_OK(apex_backward(relu, &(apex_backward_options){.grad_output = hdy, .retain_graph = 1}));
    close_to(c.t[4], apex_var_grad(va), 0.0, "relu backward");
    TU_OK(apex_backward(gelu, &(apex_backward_options){.grad_output = hdy, .retain_graph = 1}));
    close_to(c.t[6], apex_var_grad(va2), tol_ag(dt), "gelu backward");
    close_to(c.t[11], c.t[6], 0.0, "gelu backward in place (dx = dy), against out of place");
    cuda_vs_cpu("elementwise", dt, run_elementwise, &c);
    outs_free(&c);
    apex_graph_destroy(g);
    apex_var_destroy(va), apex_var_destroy(vb), apex_var_destroy(va2);
    apex_tensor_destroy(ha), apex_tensor_destroy(hb), apex_tensor_destroy(hdy);
  }
}

/* ---- bad inputs ----------------------------------------------------------------------------------------- */

/* Each refusal names the argument and leaves the outputs as they were. */
static void test_bad_inputs(void **state) {
  (void)state;
  int64_t s2[2] = {4, 6}, s1[1] = {4}, s6 = 6, s3[3] = {1, 2, 12};
  apex_tensor *x = rnd(APEX_F32, 2, s2, 1, 1.0f), *y = out_on(APEX_DEVICE_CPU, APEX_F32, 2, s2), *w = rnd(APEX_F32, 1, &s6, 2, 1.0f);
  apex_tensor *r = out_on(APEX_DEVICE_CPU, APEX_F32, 1, s1), *qkv = rnd(APEX_F32, 3, s3, 3, 1.0f);
  apex_tensor *r5 = out_on(APEX_DEVICE_CPU, APEX_F32, 1, (int64_t[]){5});
  TU_FAILS(apex_kernel_layer_norm_forward(NULL, NULL, NULL, 1e-5f, 0, NULL, NULL, NULL), APEX_ERR_INVALID_ARG,
           "apex_kernel_layer_norm_forward: x is NULL");
  TU_FAILS(apex_kernel_layer_norm_forward(x, r, NULL, 1e-5f, 0, y, r, r), APEX_ERR_SHAPE, "w has shape");
  TU_FAILS(apex_kernel_layer_norm_forward(x, w, NULL, 1e-5f, 0, x, r, r), APEX_ERR_INVALID_ARG, "y overlaps x");
  TU_FAILS(apex_kernel_layer_norm_forward(x, w, NULL, -1.0f, 0, y, r, r), APEX_ERR_INVALID_ARG, "eps is -1");
  TU_FAILS(apex_kernel_add(NULL, NULL, NULL), APEX_ERR_INVALID_ARG, "apex_kernel_add: a is NULL");
  TU_FAILS(apex_kernel_add(x, r, y), APEX_ERR_SHAPE, "b has shape");
  TU_FAILS(apex_kernel_matmul(x, 0, x, 0, y, 1.0f, 0.0f, NULL, 0), APEX_ERR_SHAPE, "does not give c");
  TU_FAILS(apex_kernel_sum_rows(x, r5, 0), APEX_ERR_SHAPE, "is not a whole number of rows");
  TU_FAILS(apex_kernel_attention_forward(NULL, 2, NULL, NULL), APEX_ERR_INVALID_ARG, "qkv is NULL");
  TU_FAILS(apex_kernel_attention_forward(qkv, 3, y, r), APEX_ERR_SHAPE, "not divisible by n_heads = 3");
  int64_t bad[2] = {0, 6};
  TU_FAILS(apex_kernel_embedding_forward(x, bad, 2, y), APEX_ERR_INVALID_ARG, "id 6 at 1 is outside [0, 4)");
  for (size_t i = 0; i < apex_tensor_numel(y); i++) assert_true(apex_tensor_get(y, i) == 7.0f);
  for (size_t i = 0; i < apex_tensor_numel(r); i++) assert_true(apex_tensor_get(r, i) == 7.0f);
  if (have_cuda) { /* a CPU tensor among CUDA ones is named */
    apex_tensor *dx = on(APEX_DEVICE_CUDA, x), *dy = out_on(APEX_DEVICE_CUDA, APEX_F32, 2, s2);
    TU_FAILS(apex_kernel_add(dx, x, dy), APEX_ERR_DEVICE, "b is on the CPU");
    apex_tensor_destroy(dx), apex_tensor_destroy(dy);
  }
  apex_tensor_destroy(x), apex_tensor_destroy(y), apex_tensor_destroy(w), apex_tensor_destroy(r), apex_tensor_destroy(qkv);
  apex_tensor_destroy(r5);
}

int main(void) {
  const char *why = NULL;
  have_cuda = apex_cuda_available(&why);
  if (!have_cuda) printf("test_kernels: the CUDA half of every case is skipped: %s\n", why ? why : "no GPU");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layer_norm), cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_batch_norm_stats),
      cmocka_unit_test(test_matmul),     cmocka_unit_test(test_conv2d),        cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_attention),  cmocka_unit_test(test_elementwise_and_sums), cmocka_unit_test(test_bad_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
