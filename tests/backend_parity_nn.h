/* backend_parity_nn.h: parity cases of the fused nn kernels (apex/kernels.h: norms, cross-entropy, batch
 * statistics, convolution, embedding, products, elementwise ops and sums, attention) on the device under
 * test against the CPU, their refusals of bad input, and autograd's refusal of device tensors in a CPU
 * graph (bounds: backend_parity_cases.h). */
#ifndef APEX_TESTS_BACKEND_PARITY_NN_H
#define APEX_TESTS_BACKEND_PARITY_NN_H

#include "backend_parity_util.h"

/* Tolerance for a value stored in dtype: relative to `scale`. */
static double tol_for(apex_dtype dt) { return dt == APEX_F32 ? 2e-5 : dt == APEX_F16 ? 1.0 / 256 : 1.0 / 128; }

static void check_close(const apex_tensor *dev, const double *ref, size_t n, double tol, double scale, const char *what) {
  apex_tensor *h = host_copy(dev);
  for (size_t i = 0; i < n; i++) {
    double v = apex_tensor_get(h, i);
    if (!(fabs(v - ref[i]) <= tol * (fabs(ref[i]) > scale ? fabs(ref[i]) : scale)))
      fail_msg("%s: element %zu is %.8g, reference %.8g", what, i, v, ref[i]);
  }
  apex_tensor_destroy(h);
}

/* One layer norm configuration: x's and w's dtypes, shape, RMS or not, a bias or not (ignored with rms), and
 * the element offset at which x, dy, y and dx start inside their buffers (an odd offset makes views whose
 * rows are not 16-byte aligned: the kernels' element-wise path). */
typedef struct {
  apex_dtype dt, wt;
  int64_t rows, cols;
  int rms, bias;
  size_t offset;
} ln_case;

/* A device [rows, cols] tensor of dtype dt starting `offset` elements into a fresh buffer (the view keeps
 * the buffer alive), holding h's values when h is given. */
static apex_tensor *ln_tensor(apex_dtype dt, int64_t rows, int64_t cols, size_t offset, const apex_tensor *h) {
  int64_t shape[2] = {rows, cols}, whole = rows * cols + (int64_t)offset;
  apex_tensor *buf = apex_tensor_create_on(pc_dev, dt, 1, &whole);
  assert_non_null(buf);
  apex_tensor *v = apex_tensor_slice_view(buf, offset, 2, shape);
  assert_non_null(v);
  apex_tensor_destroy(buf);
  if (h) TU_OK(apex_tensor_copy(v, h));
  return v;
}

/* Runs forward and backward; the outputs go to y, mean, rstd, dx, dw, db. */
static void ln_run(const ln_case *k, apex_tensor *x, apex_tensor *dy, apex_tensor *w, apex_tensor *b, apex_tensor *y,
                   apex_tensor *mean, apex_tensor *rstd, apex_tensor *dx, apex_tensor *dw, apex_tensor *db) {
  const int bias = k->bias && !k->rms;
  TU_OK(apex_kernel_layer_norm_forward(x, w, bias ? b : NULL, 1e-5f, k->rms, y, k->rms ? NULL : mean, rstd));
  TU_OK(apex_kernel_layer_norm_backward(dy, x, w, k->rms ? NULL : mean, rstd, k->rms, dx, dw, bias ? db : NULL));
}

/* The GPU against a double-precision reference of the same (rounded) inputs, then a second run that must
 * give the same bits. */
static void layer_norm_case(ln_case k) {
  const int64_t rows = k.rows, cols = k.cols;
  const int bias = k.bias && !k.rms;
  size_t n = (size_t)(rows * cols);
  apex_tensor *hx = tu_random_tensor(k.dt, n, 7 + (uint64_t)cols, 3.0f), *hdy = tu_random_tensor(k.dt, n, 9, 1.0f);
  apex_tensor *hw = tu_random_tensor(k.wt, (size_t)cols, 10, 1.0f), *hb = tu_random_tensor(k.wt, (size_t)cols, 12, 1.0f);
  apex_tensor *x = ln_tensor(k.dt, rows, cols, k.offset, hx), *dy = ln_tensor(k.dt, rows, cols, k.offset, hdy);
  apex_tensor *w = dev_copy(hw), *b = dev_copy(hb);
  apex_tensor *y = ln_tensor(k.dt, rows, cols, k.offset, NULL), *dx = ln_tensor(k.dt, rows, cols, k.offset, NULL);
  apex_tensor *mean = apex_tensor_create_on(pc_dev, APEX_F32, 1, &rows), *rstd = apex_tensor_create_on(pc_dev, APEX_F32, 1, &rows);
  apex_tensor *dw = apex_tensor_create_on(pc_dev, k.wt, 1, &cols), *db = apex_tensor_create_on(pc_dev, k.wt, 1, &cols);
  TU_OK(apex_tensor_fill(mean, 0.0f));
  TU_OK(apex_tensor_fill(db, 0.0f));
  ln_run(&k, x, dy, w, b, y, mean, rstd, dx, dw, db);
  double *ry = malloc(n * sizeof *ry), *rdx = malloc(n * sizeof *rdx), *rdw = calloc((size_t)cols, sizeof *rdw),
         *rdb = calloc((size_t)cols, sizeof *rdb);
  for (int64_t r = 0; r < rows; r++) {
    double mu = 0, var = 0, a = 0, bb = 0;
    for (int64_t c = 0; c < cols; c++) mu += apex_tensor_get(hx, (size_t)(r * cols + c));
    mu = k.rms ? 0 : mu / (double)cols;
    for (int64_t c = 0; c < cols; c++) {
      double d = apex_tensor_get(hx, (size_t)(r * cols + c)) - mu;
      var += d * d;
    }
    double rs = 1.0 / sqrt(var / (double)cols + 1e-5);
    for (int64_t c = 0; c < cols; c++) {
      size_t i = (size_t)(r * cols + c);
      double xh = (apex_tensor_get(hx, i) - mu) * rs, g = apex_tensor_get(hdy, i), wc = apex_tensor_get(hw, (size_t)c);
      ry[i] = xh * wc + (bias ? apex_tensor_get(hb, (size_t)c) : 0);
      a += g * wc;
      bb += g * wc * xh;
      rdw[c] += g * xh;
      rdb[c] += g;
    }
    for (int64_t c = 0; c < cols; c++) {
      size_t i = (size_t)(r * cols + c);
      double xh = (apex_tensor_get(hx, i) - mu) * rs, wdy = apex_tensor_get(hdy, i) * apex_tensor_get(hw, (size_t)c);
      rdx[i] = rs * (wdy - (k.rms ? 0 : a / (double)cols) - xh * bb / (double)cols);
    }
  }
  char what[96];
  snprintf(what, sizeof what, "%s [%lld, %lld] offset %zu", k.rms ? "rms norm" : "layer norm", (long long)rows,
           (long long)cols, k.offset);
  const double wtol = k.wt == APEX_F32 ? 1e-4 : tol_for(k.wt);
  check_close(y, ry, n, tol_for(k.dt), 1.0, what);
  check_close(dx, rdx, n, tol_for(k.dt) * 2, 1.0, what);
  check_close(dw, rdw, (size_t)cols, wtol, sqrt((double)rows), what);
  if (bias) check_close(db, rdb, (size_t)cols, wtol, sqrt((double)rows), what);
  /* run to run: the same bits */
  apex_tensor *y2 = ln_tensor(k.dt, rows, cols, k.offset, NULL), *dx2 = ln_tensor(k.dt, rows, cols, k.offset, NULL);
  apex_tensor *mean2 = apex_tensor_create_on(pc_dev, APEX_F32, 1, &rows), *rstd2 = apex_tensor_create_on(pc_dev, APEX_F32, 1, &rows);
  apex_tensor *dw2 = apex_tensor_create_on(pc_dev, k.wt, 1, &cols), *db2 = apex_tensor_create_on(pc_dev, k.wt, 1, &cols);
  TU_OK(apex_tensor_fill(mean2, 0.0f)); /* as mean and db: rms leaves mean untouched, no bias leaves db */
  TU_OK(apex_tensor_fill(db2, 0.0f));
  ln_run(&k, x, dy, w, b, y2, mean2, rstd2, dx2, dw2, db2);
  same_run_bits(y, y2, "layer norm y, second run");
  same_run_bits(rstd, rstd2, "layer norm rstd, second run");
  same_run_bits(mean, mean2, "layer norm mean, second run");
  same_run_bits(dx, dx2, "layer norm dx, second run");
  same_run_bits(dw, dw2, "layer norm dw, second run");
  same_run_bits(db, db2, "layer norm db, second run");
  /* Bad input: a CPU weight, a weight of the wrong length. */
  TU_FAILS(apex_kernel_layer_norm_forward(x, hw, NULL, 1e-5f, k.rms, y, mean, rstd), APEX_ERR_DEVICE, "w is on the CPU");
  TU_FAILS(apex_kernel_layer_norm_forward(x, mean, NULL, 1e-5f, k.rms, y, mean, rstd), APEX_ERR_SHAPE, "w has shape");
  /* In place is refused: the kernels may write a row before another row's input is read. */
  TU_FAILS(apex_kernel_layer_norm_forward(x, w, NULL, 1e-5f, k.rms, x, mean, rstd), APEX_ERR_INVALID_ARG, "y overlaps x");
  TU_FAILS(apex_kernel_layer_norm_backward(dy, x, w, mean, rstd, k.rms, dy, dw, NULL), APEX_ERR_INVALID_ARG, "dx overlaps dy");
  free(ry), free(rdx), free(rdw), free(rdb);
  apex_tensor *all[] = {hx, hdy, hw, hb, x, dy, w, b, y, dx, mean, rstd, dw, db, y2, dx2, mean2, rstd2, dw2, db2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

/* Row lengths on both sides of the kernels' shapes (a warp per row up to 512; 64..512 threads up to 8,192
 * with dw/db summed in the same kernel; 512 threads and a separate dw/db pass up to 16,384), lengths that
 * are not a multiple of the 16-byte width (the element-wise path) or are but leave a partial last vector
 * team, odd offsets, weights in x's dtype, no bias, and enough rows that every block of the backward
 * takes several. */
static void pc_layer_norm(void) {
  const ln_case cases[] = {
      {APEX_F32, APEX_F32, 37, 1024, 0, 1, 0},     {APEX_BF16, APEX_F32, 300, 768, 0, 1, 0},
      {APEX_F16, APEX_F32, 64, 4097, 0, 1, 0},     {APEX_BF16, APEX_F32, 33, 8192, 1, 0, 0},
      {APEX_F32, APEX_F32, 5, 100, 1, 0, 0},       {APEX_BF16, APEX_F32, 64, 1023, 0, 1, 0},
      {APEX_F16, APEX_F32, 50, 1000, 0, 1, 0},     {APEX_F32, APEX_F32, 201, 7, 0, 1, 0},
      {APEX_BF16, APEX_BF16, 40, 2048, 0, 1, 0},   {APEX_F16, APEX_F16, 17, 16384, 0, 1, 0},
      {APEX_F32, APEX_F32, 9, 16384, 1, 0, 0},     {APEX_BF16, APEX_F32, 12, 16383, 0, 1, 0},
      {APEX_BF16, APEX_F32, 20, 8192, 0, 0, 0},    {APEX_BF16, APEX_F32, 30, 1024, 0, 1, 1},
      {APEX_F32, APEX_F32, 6, 12000, 0, 1, 3},     {APEX_F16, APEX_F16, 25, 520, 1, 0, 5},
      {APEX_BF16, APEX_BF16, 3000, 1024, 0, 1, 0}, {APEX_F16, APEX_F32, 20000, 64, 0, 1, 0},
      {APEX_F32, APEX_F32, 2500, 256, 0, 0, 0},    {APEX_BF16, APEX_F32, 1, 8200, 0, 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) layer_norm_case(cases[i]);
}

static void pc_cross_entropy(void) {
  const int64_t rows = 67, cols = 5003;
  for (int dt = APEX_F32; dt <= APEX_BF16; dt++) {
    apex_tensor *hl = tu_random_tensor((apex_dtype)dt, (size_t)(rows * cols), 21, 8.0f);
    int64_t shape[2] = {rows, cols};
    apex_tensor *l = apex_tensor_create_on(pc_dev, (apex_dtype)dt, 2, shape);
    TU_OK(apex_tensor_copy(l, hl));
    int64_t target[67];
    for (int64_t r = 0; r < rows; r++) target[r] = r == 5 ? -1 : (r * 7919) % cols;
    int64_t two = 2 * rows; /* the int64 targets travel as raw bytes in an f32 tensor of twice the length */
    apex_tensor *ht = apex_tensor_wrap(target, APEX_F32, 1, &two), *dt_ = apex_tensor_create_on(pc_dev, APEX_F32, 1, &two);
    TU_OK(apex_tensor_copy(dt_, ht));
    const int64_t *d_target = apex_tensor_data(dt_);
    int64_t rows2[2] = {rows, 2};
    apex_tensor *loss = apex_tensor_create_on(pc_dev, APEX_F32, 1, &rows), *lse = apex_tensor_create_on(pc_dev, APEX_F32, 2, rows2);
    apex_tensor *dloss = apex_tensor_create_on(pc_dev, APEX_F32, 1, &rows), *dl = apex_tensor_create_on(pc_dev, (apex_dtype)dt, 2, shape);
    const float eps = 0.1f;
    TU_OK(apex_tensor_fill(dloss, 0.5f));
    TU_OK(apex_kernel_cross_entropy_forward(l, d_target, eps, loss, lse));
    TU_OK(apex_kernel_cross_entropy_backward(dloss, l, d_target, lse, eps, dl));
    double *rl = malloc((size_t)rows * sizeof *rl), *rg = malloc((size_t)(rows * cols) * sizeof *rg);
    for (int64_t r = 0; r < rows; r++) {
      double mx = -INFINITY, se = 0, sx = 0;
      for (int64_t c = 0; c < cols; c++) mx = fmax(mx, apex_tensor_get(hl, (size_t)(r * cols + c)));
      for (int64_t c = 0; c < cols; c++) {
        double v = apex_tensor_get(hl, (size_t)(r * cols + c));
        se += exp(v - mx);
        sx += v;
      }
      double lsev = mx + log(se);
      int ign = target[r] == -1;
      rl[r] = ign ? 0 : (1 - eps) * (lsev - apex_tensor_get(hl, (size_t)(r * cols + target[r]))) + eps * (lsev - sx / (double)cols);
      for (int64_t c = 0; c < cols; c++) {
        double p = exp(apex_tensor_get(hl, (size_t)(r * cols + c)) - lsev);
        rg[r * cols + c] = ign ? 0 : 0.5 * (p - eps / (double)cols - (c == target[r] ? 1 - eps : 0));
      }
    }
    check_close(loss, rl, (size_t)rows, 1e-5, 1.0, "cross-entropy loss");
    check_close(dl, rg, (size_t)(rows * cols), tol_for((apex_dtype)dt), 1e-3, "cross-entropy grad");
    free(rl), free(rg);
    TU_FAILS(apex_kernel_cross_entropy_forward(l, d_target, 1.5f, loss, lse), APEX_ERR_INVALID_ARG, "label_smoothing");
    TU_FAILS(apex_kernel_cross_entropy_forward(l, d_target, 0, loss, dl), APEX_ERR_SHAPE, "stats has shape");
    apex_tensor *all[] = {hl, l, ht, dt_, loss, lse, dloss, dl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  }
}

static void pc_batch_norm_stats(void) {
  int64_t shape[4] = {6, 5, 13, 17};
  size_t n = 6 * 5 * 13 * 17;
  apex_tensor *hx = tu_random_tensor(APEX_F32, n, 31, 4.0f);
  for (size_t i = 0; i < n; i++) apex_tensor_set(hx, i, apex_tensor_get(hx, i) + 100.0f); /* a large mean */
  apex_tensor *x = apex_tensor_create_on(pc_dev, APEX_F32, 4, shape);
  TU_OK(apex_tensor_copy(x, hx));
  int64_t c = 5;
  apex_tensor *mean = apex_tensor_create_on(pc_dev, APEX_F32, 1, &c), *var = apex_tensor_create_on(pc_dev, APEX_F32, 1, &c);
  TU_OK(apex_kernel_batch_norm_stats(x, mean, var, NULL));
  double rm[5] = {0}, rv[5] = {0};
  size_t per = 6 * 13 * 17;
  for (size_t i = 0; i < n; i++) rm[(i / (13 * 17)) % 5] += apex_tensor_get(hx, i) / (double)per;
  for (size_t i = 0; i < n; i++) {
    double d = apex_tensor_get(hx, i) - rm[(i / (13 * 17)) % 5];
    rv[(i / (13 * 17)) % 5] += d * d / (double)per;
  }
  check_close(mean, rm, 5, 1e-6, 1.0, "batch mean");
  check_close(var, rv, 5, 1e-4, 1.0, "batch variance"); /* Welford keeps it despite the mean of 100 */
  apex_tensor_destroy(hx), apex_tensor_destroy(x), apex_tensor_destroy(mean), apex_tensor_destroy(var);
}

/* Convolution through cuDNN against apex_conv2d and its backward on the CPU over the same inputs (the
 * CPU op accumulates in f32, as cuDNN does): f32 to 2e-5 of the output's largest value (another
 * summation order), f16/bf16 to the dtype's rounding. Skipped, saying why,
 * where cuDNN cannot be loaded. */
static int conv_case(apex_dtype dt, const int64_t xs[4], const int64_t ws[4], apex_conv2d_options o, int bias) {
  apex_graph *g = apex_graph_create();
  apex_var *x = tu_random_leaf(dt, 4, xs, 31, 1), *w = tu_random_leaf(dt, 4, ws, 32, 1);
  apex_var *b = bias ? tu_random_leaf(APEX_F32, 1, &ws[0], 33, 1) : NULL;
  apex_var *y = apex_conv2d(g, x, w, b, &o);
  assert_non_null(y);
  const apex_tensor *hy = apex_var_value(y);
  apex_tensor *hdy = apex_tensor_create(dt, apex_tensor_ndim(hy), apex_tensor_shape(hy));
  apex_tensor *r = tu_random_tensor(APEX_F32, apex_tensor_numel(hy), 34, 1.0f);
  for (size_t i = 0; i < apex_tensor_numel(r); i++) apex_tensor_set(hdy, i, apex_tensor_get(r, i));
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = hdy}));
  apex_tensor *dx_ = dev_copy(apex_var_value(x)), *dw_ = dev_copy(apex_var_value(w));
  apex_tensor *db_ = bias ? dev_copy(apex_var_value(b)) : NULL, *ddy = dev_copy(hdy);
  apex_tensor *dy = apex_tensor_create_on(pc_dev, dt, apex_tensor_ndim(hy), apex_tensor_shape(hy));
  apex_tensor *gx = apex_tensor_create_on(pc_dev, dt, 4, xs), *gw = apex_tensor_create_on(pc_dev, dt, 4, ws);
  apex_tensor *gb = bias ? apex_tensor_create_on(pc_dev, APEX_F32, 1, &ws[0]) : NULL;
  apex_status st = apex_kernel_conv2d_forward(dx_, dw_, db_, &o, dy);
  int ran = !(st == APEX_ERR_UNSUPPORTED && strstr(apex_last_error(), "could not be loaded"));
  if (!ran) {
    printf("conv2d on the GPU skipped: %s\n", apex_last_error());
  } else {
    TU_OK(st);
    TU_OK(apex_kernel_conv2d_backward(ddy, dx_, dw_, &o, gx, gw, gb));
    const apex_tensor *want[4] = {hy, apex_var_grad(x), apex_var_grad(w), bias ? apex_var_grad(b) : NULL};
    const apex_tensor *got[4] = {dy, gx, gw, gb};
    const char *what[4] = {"conv2d y", "conv2d dx", "conv2d dw", "conv2d db"};
    for (int k = 0; k < 4; k++) {
      if (!want[k]) continue;
      size_t n = apex_tensor_numel(want[k]);
      double *ref = malloc(n * sizeof *ref), scale = 1e-30;
      for (size_t i = 0; i < n; i++) {
        ref[i] = apex_tensor_get(want[k], i);
        scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
      }
      check_close(got[k], ref, n, tol_for(apex_tensor_dtype(got[k])), scale, what[k]);
      free(ref);
    }
    /* Bad input: w with other input channels, a y of the wrong shape, a CPU tensor. */
    int64_t bad[4] = {ws[0], ws[1] + 1, ws[2], ws[3]};
    apex_tensor *wbad = apex_tensor_create_on(pc_dev, dt, 4, bad);
    TU_FAILS(apex_kernel_conv2d_forward(dx_, wbad, NULL, &o, dy), APEX_ERR_SHAPE, "input channels");
    TU_FAILS(apex_kernel_conv2d_forward(dx_, dw_, NULL, &o, gx), APEX_ERR_SHAPE, "y has shape");
    TU_FAILS(apex_kernel_conv2d_forward(apex_var_value(x), dw_, NULL, &o, dy), APEX_ERR_DEVICE, "x is on the CPU");
    apex_tensor_destroy(wbad);
  }
  apex_tensor *all[] = {hdy, r, dx_, dw_, db_, ddy, dy, gx, gw, gb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  apex_graph_destroy(g);
  apex_var_destroy(x);
  apex_var_destroy(w);
  apex_var_destroy(b);
  return ran;
}

static void pc_conv2d(void) {
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int d = 0; d < 3; d++) {
    /* the benchmark CNN's first and second layers (3x3, padding 1), and a strided 5x5 without padding */
    if (!conv_case(dts[d], (int64_t[]){4, 1, 28, 28}, (int64_t[]){32, 1, 3, 3}, (apex_conv2d_options){.pad_h = 1, .pad_w = 1}, 1))
      skip();
    conv_case(dts[d], (int64_t[]){4, 32, 14, 14}, (int64_t[]){64, 32, 3, 3}, (apex_conv2d_options){.pad_h = 1, .pad_w = 1}, 1);
    conv_case(dts[d], (int64_t[]){2, 8, 17, 13}, (int64_t[]){16, 8, 5, 5}, (apex_conv2d_options){.stride_h = 2, .stride_w = 3}, 0);
  }
}

/* Embedding against apex_embedding on the CPU: the lookup is a copy (bitwise), the gradient sums each
 * row's positions in ascending order like the CPU op (bitwise in f32; f16/bf16 tables to their
 * rounding); ids 40..49 never occur, so their rows must come back zero. */
static void pc_embedding(void) {
  enum { V = 50, D = 300, N = 1000 };
  int64_t ids[N], n = N;
  for (int t = 0; t < N; t++) ids[t] = (int64_t)((t * 7919u + (unsigned)t * t) % 40u);
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int k = 0; k < 3; k++) {
    apex_dtype dt = dts[k];
    apex_graph *g = apex_graph_create();
    apex_var *w = tu_random_leaf(dt, 2, (int64_t[]){V, D}, 71, 1);
    apex_var *y = apex_embedding(g, w, ids, 1, &n);
    assert_non_null(y);
    apex_tensor *hdy = apex_tensor_create(dt, 2, (int64_t[]){N, D}), *r = tu_random_tensor(APEX_F32, (size_t)N * D, 72, 1.0f);
    for (size_t i = 0; i < (size_t)N * D; i++) apex_tensor_set(hdy, i, apex_tensor_get(r, i));
    TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = hdy}));
    apex_tensor *table = dev_copy(apex_var_value(w)), *dy = dev_copy(hdy);
    apex_tensor *out = apex_tensor_create_on(pc_dev, dt, 2, (int64_t[]){N, D});
    apex_tensor *dtable = apex_tensor_create_on(pc_dev, dt, 2, (int64_t[]){V, D});
    TU_OK(apex_tensor_fill(dtable, 7.0f)); /* overwritten, absent rows included */
    TU_OK(apex_kernel_embedding_forward(table, ids, n, out));
    TU_OK(apex_kernel_embedding_backward(dy, ids, n, dtable));
    assert_same_bits(out, apex_var_value(y), "embedding y");
    if (dt == APEX_F32) {
      assert_same_bits(dtable, apex_var_grad(w), "embedding dtable");
    } else {
      double *ref = malloc((size_t)V * D * sizeof *ref);
      for (size_t i = 0; i < (size_t)V * D; i++) ref[i] = apex_tensor_get(apex_var_grad(w), i);
      check_close(dtable, ref, (size_t)V * D, tol_for(dt), 4.0, "embedding dtable");
      free(ref);
    }
    apex_tensor *h = host_copy(dtable);
    for (size_t i = (size_t)40 * D; i < (size_t)V * D; i++) assert_true(apex_tensor_get(h, i) == 0.0f);
    apex_tensor_destroy(h);
    int64_t bad[2] = {3, V};
    TU_FAILS(apex_kernel_embedding_forward(table, bad, 2, out), APEX_ERR_INVALID_ARG, "id 50 at 1 is outside [0, 50)");
    TU_FAILS(apex_kernel_embedding_backward(dy, ids, n - 1, dtable), APEX_ERR_SHAPE, "dy has shape");
    apex_tensor *all[] = {hdy, r, table, dy, out, dtable};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
    apex_graph_destroy(g);
    apex_var_destroy(w);
  }
}

static void pc_matmul(void) {
  const int64_t m = 96, k = 200, n = 72;
  for (int gelu = 0; gelu <= 1; gelu++)
    for (int ta = 0; ta <= 1; ta++) {
      apex_tensor *ha = tu_random_tensor(APEX_BF16, (size_t)(m * k), 41, 1.0f), *hb = tu_random_tensor(APEX_BF16, (size_t)(k * n), 43, 1.0f);
      apex_tensor *hbias = tu_random_tensor(APEX_F32, (size_t)n, 47, 1.0f);
      int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {k, n}, sc[2] = {m, n};
      apex_tensor *a = apex_tensor_create_on(pc_dev, APEX_BF16, 2, sa), *b = apex_tensor_create_on(pc_dev, APEX_BF16, 2, sb);
      TU_OK(apex_tensor_copy(a, ha));
      TU_OK(apex_tensor_copy(b, hb));
      apex_tensor *bias = dev_copy(hbias), *c = apex_tensor_create_on(pc_dev, APEX_F32, 2, sc);
      TU_OK(apex_kernel_matmul(a, ta, b, 0, c, 1.0f, 0.0f, bias, gelu));
      double *ref = malloc((size_t)(m * n) * sizeof *ref);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double s = apex_tensor_get(hbias, (size_t)j);
          for (int64_t p = 0; p < k; p++)
            s += (double)apex_tensor_get(ha, (size_t)(ta ? p * m + i : i * k + p)) * apex_tensor_get(hb, (size_t)(p * n + j));
          if (gelu) s = 0.5 * s * (1 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
          ref[i * n + j] = s;
        }
      check_close(c, ref, (size_t)(m * n), 1e-2, 1.0, gelu ? "matmul + bias + gelu" : "matmul + bias");
      /* The second call takes the algorithm cuBLASLt chose for the first from apex's cache: same bits. */
      apex_tensor *c2 = apex_tensor_create_on(pc_dev, APEX_F32, 2, sc);
      TU_OK(apex_kernel_matmul(a, ta, b, 0, c2, 1.0f, 0.0f, bias, gelu));
      apex_tensor *hc = host_copy(c);
      assert_same_bits(c2, hc, "matmul repeated (cached algorithm)");
      apex_tensor_destroy(hc);
      /* The same a one element into a bigger buffer: 2-byte aligned, so another cache entry (the
       * heuristic told the real alignment), and still the same product. */
      int64_t big = m * k + 1;
      apex_tensor *abuf = apex_tensor_create_on(pc_dev, APEX_BF16, 1, &big);
      apex_tensor *av = apex_tensor_slice_view(abuf, 1, 2, sa);
      TU_OK(apex_tensor_copy(av, ha));
      TU_OK(apex_kernel_matmul(av, ta, b, 0, c2, 1.0f, 0.0f, bias, gelu));
      check_close(c2, ref, (size_t)(m * n), 1e-2, 1.0, "matmul of a 2-byte aligned operand");
      apex_tensor_destroy(av);
      apex_tensor_destroy(abuf);
      apex_tensor_destroy(c2);
      free(ref);
      TU_FAILS(apex_kernel_matmul(a, !ta, b, 0, c, 1.0f, 0.0f, NULL, 0), APEX_ERR_SHAPE, "does not give c");
      apex_tensor *all[] = {ha, hb, hbias, a, b, bias, c};
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
    }
}

/* ---- elementwise ops and reductions ---------------------------------------------------------------------- */

/* The spacing of dtype's values at |v| (the smallest spacing for subnormals and zero). */
static double ulp_in(apex_dtype dt, double v) {
  int mant = dt == APEX_F32 ? 23 : dt == APEX_F16 ? 10 : 7, emin = dt == APEX_F16 ? -14 : -126, e = 0;
  frexp(fabs(v), &e); /* |v| = m 2^e with m in [0.5, 1): the binade's exponent is e - 1 */
  e = v != 0 && e - 1 > emin ? e - 1 : emin;
  return ldexp(1.0, e - mant);
}

/* n elements of dtype in [-range, range] with special values from index `at` on: signed zeros,
 * infinities, NaN, subnormals, values where GELU's tanh saturates and values past f16's range. Two
 * operands built with different `at` pair the specials with each other (inf + -inf, inf * 0, ...). */
static apex_tensor *ew_input(apex_dtype dt, size_t n, uint64_t seed, float range, size_t at) {
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 10.0f,
                                  -10.0f, 100.0f, -100.0f, 7e4f, -3e5f, 1.0f, -1.0f, -4.0f};
  apex_tensor *t = tu_random_tensor(dt, n, seed, range);
  for (size_t k = 0; k < sizeof special / sizeof special[0] && at + k < n; k++) apex_tensor_set(t, at + k, special[k]);
  return t;
}

/* Compares a device result with the CPU's (same dtype and count): bit for bit when bound is NULL (any
 * NaN matching any NaN: the GPU's arithmetic returns one canonical NaN), else within bound[i] + 2 ulp
 * of the dtype at the larger of the two, and bit for bit where either is not finite. Returns the worst
 * |GPU - CPU| as a fraction of what was allowed. */
static double compare_ew(const apex_tensor *dev, const apex_tensor *cpu, const double *bound, const char *what) {
  assert_int_equal(apex_tensor_dtype(dev), apex_tensor_dtype(cpu));
  assert_int_equal(apex_tensor_numel(dev), apex_tensor_numel(cpu));
  apex_tensor *h = host_copy(dev);
  apex_dtype dt = apex_tensor_dtype(cpu);
  size_t n = apex_tensor_numel(cpu), es = apex_dtype_size(dt);
  const char *pg = apex_tensor_data(h), *pc = apex_tensor_data(cpu);
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double g = apex_tensor_get(h, i), c = apex_tensor_get(cpu, i);
    if (isnan(g) && isnan(c)) continue;
    if (!bound || !isfinite(g) || !isfinite(c)) {
      if (memcmp(pg + i * es, pc + i * es, es) != 0) fail_msg("%s: element %zu: GPU %.9g, CPU %.9g (bitwise expected)", what, i, g, c);
      continue;
    }
    double allowed = (isnan(bound[i]) ? INFINITY : bound[i]) + 2 * ulp_in(dt, fmax(fabs(g), fabs(c))), d = fabs(g - c);
    if (!(d <= allowed)) fail_msg("%s: element %zu: GPU %.9g, CPU %.9g, |difference| %.3g > %.3g allowed", what, i, g, c, d, allowed);
    if (d / allowed > worst) worst = d / allowed;
  }
  apex_tensor_destroy(h);
  return worst;
}

/* add and mul against apex_add / apex_mul on the CPU, bit for bit: one dtype and mixed ones, an output
 * narrower than the CPU op's (its f32 result rounded once, as the kernel rounds), counts below, across
 * and far past one block, and in place (y = a). */
static void pc_elementwise_binary(void) {
  const apex_dtype cases[][3] = {{APEX_F32, APEX_F32, APEX_F32},  {APEX_F16, APEX_F16, APEX_F16}, {APEX_BF16, APEX_BF16, APEX_BF16},
                                 {APEX_F16, APEX_F32, APEX_F32},  {APEX_F32, APEX_BF16, APEX_F32}, {APEX_BF16, APEX_F16, APEX_F32},
                                 {APEX_F32, APEX_F16, APEX_BF16}};
  const size_t sizes[] = {1, 255, 1000, ((size_t)1 << 20) + 3};
  for (int op = 0; op < 2; op++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        apex_dtype at = cases[c][0], bt = cases[c][1], yt = cases[c][2];
        size_t n = sizes[s];
        int64_t shape = (int64_t)n;
        char what[96];
        snprintf(what, sizeof what, "%s %s, %s -> %s, %zu elements", op ? "mul" : "add", apex_dtype_name(at), apex_dtype_name(bt),
                 apex_dtype_name(yt), n);
        apex_tensor *ha = ew_input(at, n, 100 + s, 4.0f, 0), *hb = ew_input(bt, n, 200 + s, 4.0f, 3);
        apex_tensor *a = dev_copy(ha), *b = dev_copy(hb), *y = apex_tensor_create_on(pc_dev, yt, 1, &shape);
        apex_graph *g = apex_graph_create();
        apex_var *va = apex_var_create(ha, 0), *vb = apex_var_create(hb, 0);
        apex_var *vy = op ? apex_mul(g, va, vb) : apex_add(g, va, vb);
        assert_non_null(vy);
        apex_tensor *want = apex_tensor_to(apex_var_value(vy), yt);
        TU_OK(op ? apex_kernel_mul(a, b, y) : apex_kernel_add(a, b, y));
        compare_ew(y, want, NULL, what);
        if (at == yt) {
          TU_OK(op ? apex_kernel_mul(a, b, a) : apex_kernel_add(a, b, a)); /* in place */
          compare_ew(a, want, NULL, what);
        }
        apex_tensor *all[] = {a, b, y, want};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
        apex_graph_destroy(g);
        apex_var_destroy(va);
        apex_var_destroy(vb);
      }
}

#define GELU_K 0.7978845608028654
#define GELU_C 0.044715
typedef enum { ACT_RELU, ACT_GELU, ACT_SCALE } act_kind;

/* One activation (or scale, by 0.3) over n elements: x of xt, y of yt (xt, or narrower than an f32 x), dy
 * of dyt; forward against the CPU op, backward against apex_backward from the op's output with dy as its
 * grad_output (scale's backward is a scale: not a call of its own). ReLU and scale bit for bit, GELU
 * within cuda.h's bounds. Positions 16..31 hold x > 0 with dy = -0, where the CPU's gradient is +0
 * (added into zeros). Then in place: y = x, and dx = dy. */
static void act_case(act_kind k, apex_dtype xt, apex_dtype yt, apex_dtype dyt, size_t n) {
  static const char *names[] = {"relu", "gelu", "scale"};
  const float alpha = 0.3f;
  char what[96];
  int64_t shape = (int64_t)n;
  apex_tensor *hx = ew_input(xt, n, 300 + n, 6.0f, 0), *hdy = tu_random_tensor(dyt, n, 400 + n, 2.0f);
  for (size_t i = 16; i < 32 && i < n; i++) {
    apex_tensor_set(hx, i, 0.25f * (float)(i - 15));
    apex_tensor_set(hdy, i, -0.0f);
  }
  apex_tensor *x = dev_copy(hx), *dy = dev_copy(hdy), *y = apex_tensor_create_on(pc_dev, yt, 1, &shape),
              *dx = apex_tensor_create_on(pc_dev, xt, 1, &shape);
  apex_graph *g = apex_graph_create();
  apex_var *vx = apex_var_create(hx, 1);
  apex_var *vy = k == ACT_RELU ? apex_relu(g, vx) : k == ACT_GELU ? apex_gelu_tanh(g, vx) : apex_scale(g, vx, alpha);
  assert_non_null(vy);
  apex_tensor *want_y = apex_tensor_to(apex_var_value(vy), yt);
  TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = hdy}));
  const apex_tensor *want_dx = apex_var_grad(vx);
  TU_OK(k == ACT_RELU ? apex_kernel_relu_forward(x, y) : k == ACT_GELU ? apex_kernel_gelu_forward(x, y) : apex_kernel_scale(x, alpha, y));
  if (k == ACT_RELU) TU_OK(apex_kernel_relu_backward(dy, x, dx));
  if (k == ACT_GELU) TU_OK(apex_kernel_gelu_backward(dy, x, dx));
  double *by = NULL, *bdx = NULL;
  if (k == ACT_GELU) {
    by = malloc(n * sizeof *by), bdx = malloc(n * sizeof *bdx);
    for (size_t i = 0; i < n; i++) {
      double xv = fabs(apex_tensor_get(hx, i)), p = xv * GELU_K * (1 + 3 * GELU_C * xv * xv) / 2;
      by[i] = xv * ldexp(1.0, -21);
      bdx[i] = fabs(apex_tensor_get(hdy, i)) * (1 + p) * ldexp(1.0, -19);
    }
  }
  snprintf(what, sizeof what, "%s forward %s -> %s, %zu elements", names[k], apex_dtype_name(xt), apex_dtype_name(yt), n);
  double wy = compare_ew(y, want_y, by, what), wdx = 0;
  if (k != ACT_SCALE) {
    snprintf(what, sizeof what, "%s backward dy %s, x %s, %zu elements", names[k], apex_dtype_name(dyt), apex_dtype_name(xt), n);
    wdx = compare_ew(dx, want_dx, bdx, what);
  }
  if (k == ACT_GELU)
    printf("gelu %s -> %s, %zu elements: worst |GPU - CPU| is %.3f of the bound (y), %.3f (dx)\n", apex_dtype_name(xt),
           apex_dtype_name(yt), n, wy, wdx);
  if (yt == xt) { /* y = x in place (the backward above has read x already) */
    TU_OK(k == ACT_RELU ? apex_kernel_relu_forward(x, x) : k == ACT_GELU ? apex_kernel_gelu_forward(x, x) : apex_kernel_scale(x, alpha, x));
    snprintf(what, sizeof what, "%s forward in place, %s, %zu elements", names[k], apex_dtype_name(xt), n);
    compare_ew(x, want_y, by, what);
  }
  if (k != ACT_SCALE && dyt == xt) { /* dx = dy in place, from a fresh x */
    apex_tensor *x2 = dev_copy(apex_var_value(vx));
    TU_OK(k == ACT_RELU ? apex_kernel_relu_backward(dy, x2, dy) : apex_kernel_gelu_backward(dy, x2, dy));
    snprintf(what, sizeof what, "%s backward in place, %s, %zu elements", names[k], apex_dtype_name(xt), n);
    compare_ew(dy, want_dx, bdx, what);
    apex_tensor_destroy(x2);
  }
  free(by), free(bdx);
  apex_tensor *all[] = {x, dy, y, dx, want_y};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  apex_graph_destroy(g);
  apex_var_destroy(vx);
  apex_tensor_destroy(hdy);
}

static void pc_activations(void) {
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  const size_t sizes[] = {1, 1000, ((size_t)1 << 20) + 3};
  for (int k = ACT_RELU; k <= ACT_SCALE; k++) {
    for (int d = 0; d < 3; d++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) act_case((act_kind)k, dts[d], dts[d], dts[d], sizes[s]);
    /* an f32 x into a narrower y, the gradient from a dy of another dtype */
    act_case((act_kind)k, APEX_F32, APEX_BF16, APEX_F16, 1000);
    act_case((act_kind)k, APEX_F32, APEX_F16, APEX_BF16, 4097);
  }
}

/* x's element i in the exact sets below: multiples of 1/4 in [-1/2, 1/2], so that every partial sum of
 * fewer than 2^23 of them is a multiple of 1/4 below 2^22: exact in f32, whatever the order. */
static float exact_value(size_t i) { return (float)((int)((i * 2654435761u) % 5u) - 2) / 4.0f; }

/* Column sums of x [rows, cols] (xt) into y (yt): (a) over exact_value, bit for bit against the exact
 * sum rounded to y's dtype (as the kernel rounds its f32 sum); (b) over random values against a double
 * sum to 1e-5 of the column's sum of |x| (at these shapes each value goes through fewer than 60 f32
 * roundings) plus y's rounding, and the same bits on a second run. With accumulate, y starts at
 * multiples of 1/4 that are added. */
static void sum_rows_case(apex_dtype xt, apex_dtype yt, int64_t rows, int64_t cols, int accumulate) {
  size_t n = (size_t)(rows * cols);
  int64_t xs[2] = {rows, cols};
  char what[96];
  snprintf(what, sizeof what, "sum_rows [%lld, %lld] %s -> %s%s", (long long)rows, (long long)cols, apex_dtype_name(xt),
           apex_dtype_name(yt), accumulate ? ", accumulating" : "");
  apex_tensor *hx = apex_tensor_create(xt, 2, xs), *hy0 = apex_tensor_create(yt, 1, &cols), *want = apex_tensor_create(yt, 1, &cols);
  for (size_t i = 0; i < n; i++) apex_tensor_set(hx, i, exact_value(i));
  for (int64_t j = 0; j < cols; j++) apex_tensor_set(hy0, (size_t)j, (float)((int)(j % 5) - 2) / 4.0f);
  for (int64_t j = 0; j < cols; j++) {
    double s = accumulate ? apex_tensor_get(hy0, (size_t)j) : 0.0;
    for (int64_t i = 0; i < rows; i++) s += apex_tensor_get(hx, (size_t)(i * cols + j));
    apex_tensor_set(want, (size_t)j, (float)s);
  }
  apex_tensor *x = dev_copy(hx), *y = dev_copy(hy0), *y2 = dev_copy(hy0);
  TU_OK(apex_kernel_sum_rows(x, y, accumulate));
  compare_ew(y, want, NULL, what);
  /* random values, twice */
  apex_tensor *hr = tu_random_tensor(xt, n, 500 + (uint64_t)rows, 1.0f);
  TU_OK(apex_tensor_copy(x, hr));
  TU_OK(apex_tensor_copy(y, hy0));
  TU_OK(apex_kernel_sum_rows(x, y, accumulate));
  TU_OK(apex_kernel_sum_rows(x, y2, accumulate));
  apex_tensor *h2 = host_copy(y2);
  compare_ew(y, h2, NULL, "sum_rows run to run");
  apex_tensor *h = host_copy(y);
  for (int64_t j = 0; j < cols; j++) {
    double s = accumulate ? apex_tensor_get(hy0, (size_t)j) : 0.0, a = fabs(s);
    for (int64_t i = 0; i < rows; i++) {
      double v = apex_tensor_get(hr, (size_t)(i * cols + j));
      s += v, a += fabs(v);
    }
    double got = apex_tensor_get(h, (size_t)j);
    if (!(fabs(got - s) <= 1e-5 * a + ulp_in(yt, s)))
      fail_msg("%s: column %lld is %.9g, the double sum %.9g (sum of |x| %.6g)", what, (long long)j, got, s, a);
  }
  apex_tensor *all[] = {hx, hy0, want, x, y, y2, hr, h2, h};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void pc_sum_rows(void) {
  /* one row, a tall narrow x, a short wide one, a tall one of 17 chunks, GPT-2's bias gradient, no rows */
  const int64_t shapes[][2] = {{1, 5}, {1000, 7}, {3, 4096}, {4097, 3}, {8192, 768}, {0, 5}};
  const apex_dtype dts[][2] = {{APEX_F32, APEX_F32}, {APEX_BF16, APEX_F32}, {APEX_F16, APEX_F16}, {APEX_F32, APEX_BF16}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
      for (int acc = 0; acc <= 1; acc++) sum_rows_case(dts[d][0], dts[d][1], shapes[s][0], shapes[s][1], acc);
}

/* The sum and the mean of all of x: over exact_value bit for bit against the exact sum (the mean: it
 * divided in double and rounded once, as the kernel does); over random values against a double sum to
 * 1e-5 of the sum of |x| (plus the f32 rounding), the same bits on a second run. */
static void sum_all_case(apex_dtype xt, size_t n) {
  char what[64];
  snprintf(what, sizeof what, "sum_all %s, %zu elements", apex_dtype_name(xt), n);
  int64_t one = 1, shape = (int64_t)n;
  apex_tensor *hx = apex_tensor_create(xt, 1, &shape);
  double exact = 0;
  for (size_t i = 0; i < n; i++) {
    apex_tensor_set(hx, i, exact_value(i));
    exact += exact_value(i);
  }
  apex_tensor *x = dev_copy(hx), *y = apex_tensor_create_on(pc_dev, APEX_F32, 1, &one);
  apex_tensor *hy = host_copy(y);
  for (int mean = 0; mean <= 1; mean++) {
    TU_OK(apex_kernel_sum_all(x, mean, y));
    apex_tensor_set(hy, 0, (float)(mean ? exact / (double)n : exact));
    compare_ew(y, hy, NULL, what);
  }
  apex_tensor *hr = tu_random_tensor(xt, n, 600 + n, 1.0f);
  TU_OK(apex_tensor_copy(x, hr));
  double s = 0, a = 0;
  for (size_t i = 0; i < n; i++) {
    double v = apex_tensor_get(hr, i);
    s += v, a += fabs(v);
  }
  for (int mean = 0; mean <= 1; mean++) {
    TU_OK(apex_kernel_sum_all(x, mean, y));
    TU_OK(apex_tensor_copy(hy, y));
    TU_OK(apex_kernel_sum_all(x, mean, y));
    compare_ew(y, hy, NULL, "sum_all run to run");
    double div = mean ? (double)n : 1.0, want = s / div, got = apex_tensor_get(hy, 0);
    if (!(fabs(got - want) <= 1e-5 * a / div + ulp_in(APEX_F32, want)))
      fail_msg("%s%s: %.9g, the double reference %.9g", what, mean ? " (mean)" : "", got, want);
  }
  apex_tensor *all[] = {hx, x, y, hy, hr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void pc_sum_all(void) {
  const size_t sizes[] = {1, 1000, ((size_t)1 << 20) + 3, 5000000};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    sum_all_case(APEX_F32, sizes[s]);
    sum_all_case(APEX_BF16, sizes[s]);
  }
  sum_all_case(APEX_F16, 4099);
  /* An empty x: the sum 0, the mean NaN (0 / 0, as PyTorch's mean). */
  int64_t zero = 0, one = 1;
  apex_tensor *x = apex_tensor_create_on(pc_dev, APEX_F32, 1, &zero), *y = apex_tensor_create_on(pc_dev, APEX_F32, 1, &one);
  TU_OK(apex_kernel_sum_all(x, 0, y));
  assert_true(apex_tensor_get(y, 0) == 0.0f);
  TU_OK(apex_kernel_sum_all(x, 1, y));
  assert_true(isnan(apex_tensor_get(y, 0)));
  apex_tensor_destroy(x);
  apex_tensor_destroy(y);
}

/* Every bad input names the argument: a CPU tensor, a NULL one, another element count, an output
 * overlapping an input other than as itself in its dtype, sum_rows' shapes and sum_all's f32 output. */
static void pc_elementwise_bad_inputs(void) {
  int64_t n = 64, m = 63, one = 1, two = 2, rc[2] = {4, 16};
  apex_tensor *a = apex_tensor_create_on(pc_dev, APEX_F32, 1, &n), *b = apex_tensor_create_on(pc_dev, APEX_F16, 1, &n);
  apex_tensor *y = apex_tensor_create_on(pc_dev, APEX_F32, 1, &n), *short_ = apex_tensor_create_on(pc_dev, APEX_F32, 1, &m);
  apex_tensor *host = apex_tensor_create(APEX_F32, 1, &n), *x2 = apex_tensor_create_on(pc_dev, APEX_BF16, 2, rc);
  apex_tensor *as_bf16 = apex_tensor_wrap_on(pc_dev, apex_tensor_data(a), APEX_BF16, 1, &n); /* a's first half, as bf16 */
  apex_tensor *shifted = apex_tensor_slice_view(a, 1, 1, &m);
  apex_tensor *a63 = apex_tensor_slice_view(a, 0, 1, &m);
  apex_tensor *s1 = apex_tensor_create_on(pc_dev, APEX_F32, 1, &one), *s2 = apex_tensor_create_on(pc_dev, APEX_F32, 1, &two);
  apex_tensor *s16 = apex_tensor_create_on(pc_dev, APEX_F16, 1, &one), *col5 = apex_tensor_create_on(pc_dev, APEX_F32, 1, (int64_t[]){5});
  apex_tensor *a16 = apex_tensor_slice_view(a, 1, 1, (int64_t[]){16}); /* 16 columns of 4 rows, inside a */
  assert_non_null(as_bf16);
  assert_non_null(shifted);
  assert_non_null(a63);
  assert_non_null(a16);
  TU_FAILS(apex_kernel_add(host, b, y), APEX_ERR_DEVICE, "apex_kernel_add: a is on the CPU");
  TU_FAILS(apex_kernel_mul(a, host, y), APEX_ERR_DEVICE, "apex_kernel_mul: b is on the CPU");
  TU_FAILS(apex_kernel_add(a, NULL, y), APEX_ERR_INVALID_ARG, "apex_kernel_add: b is NULL");
  TU_FAILS(apex_kernel_add(a, short_, y), APEX_ERR_SHAPE, "b has shape [63] (63 elements); 64 expected");
  TU_FAILS(apex_kernel_mul(a, b, short_), APEX_ERR_SHAPE, "y has shape [63]");
  TU_FAILS(apex_kernel_scale(NULL, 2.0f, y), APEX_ERR_INVALID_ARG, "apex_kernel_scale: x is NULL");
  TU_FAILS(apex_kernel_scale(a, 2.0f, host), APEX_ERR_DEVICE, "y is on the CPU");
  TU_FAILS(apex_kernel_relu_forward(a, as_bf16), APEX_ERR_INVALID_ARG, "y (bf16) overlaps x (f32)");
  TU_FAILS(apex_kernel_gelu_forward(a63, shifted), APEX_ERR_INVALID_ARG, "y (f32) overlaps x (f32)");
  TU_FAILS(apex_kernel_add(a63, shifted, shifted), APEX_ERR_INVALID_ARG, "overlaps a");
  TU_FAILS(apex_kernel_relu_backward(a, b, host), APEX_ERR_DEVICE, "apex_kernel_relu_backward: dx is on the CPU");
  TU_FAILS(apex_kernel_gelu_backward(a, short_, y), APEX_ERR_SHAPE, "apex_kernel_gelu_backward: x has shape");
  TU_FAILS(apex_kernel_gelu_backward(a, b, as_bf16), APEX_ERR_INVALID_ARG, "dx (bf16) overlaps dy (f32)");
  TU_FAILS(apex_kernel_sum_rows(x2, col5, 0), APEX_ERR_SHAPE, "x [4, 16] (64 elements) is not a whole number of rows of y's 5 columns");
  TU_FAILS(apex_kernel_sum_rows(host, s1, 0), APEX_ERR_DEVICE, "apex_kernel_sum_rows: x is on the CPU");
  TU_FAILS(apex_kernel_sum_rows(a, a16, 0), APEX_ERR_INVALID_ARG, "apex_kernel_sum_rows: y overlaps x");
  apex_tensor *a1 = apex_tensor_slice_view(a, 3, 1, &one);
  TU_FAILS(apex_kernel_sum_all(a, 0, a1), APEX_ERR_INVALID_ARG, "apex_kernel_sum_all: y overlaps x");
  apex_tensor_destroy(a1);
  TU_FAILS(apex_kernel_sum_all(a, 0, s16), APEX_ERR_DTYPE, "y is f16; use f32");
  TU_FAILS(apex_kernel_sum_all(a, 0, s2), APEX_ERR_SHAPE, "y has shape [2] (2 elements); 1 expected");
  TU_FAILS(apex_kernel_sum_all(a, 1, a63), APEX_ERR_SHAPE, "y has shape");
  TU_FAILS(apex_kernel_sum_all(a, 1, NULL), APEX_ERR_INVALID_ARG, "y is NULL");
  /* in place over the same memory and dtype is fine, through a view too */
  apex_tensor *view = apex_tensor_slice_view(a, 0, 1, &n);
  TU_OK(apex_tensor_fill(a, -2.0f));
  TU_OK(apex_kernel_relu_forward(a, view));
  assert_true(apex_tensor_get(a, 5) == 0.0f);
  apex_tensor *all[] = {a, b, y, short_, host, x2, as_bf16, shifted, a63, s1, s2, s16, col5, view, a16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

/* ---- attention --------------------------------------------------------------------------------------------- */

/* Element (b, t, part w, head h, channel d) of a packed [B, T, W * H * D] tensor (W = 3 for qkv, 1 for y),
 * and of a per-head [B, H, T, D] one. */
static size_t att_packed(int64_t T, int64_t W, int64_t H, int64_t D, int64_t b, int64_t t, int64_t w, int64_t h, int64_t d) {
  return (size_t)((((b * T + t) * W + w) * H + h) * D + d);
}
static size_t att_head(int64_t T, int64_t H, int64_t D, int64_t b, int64_t t, int64_t h, int64_t d) {
  return (size_t)(((b * H + h) * T + t) * D + d);
}

/* The GPU's y [B, T, C] and dqkv [B, T, 3C] against apex_causal_attention and its backward on the CPU, run
 * in f32 on the same (already rounded) inputs, each element to tol times the largest magnitude of its
 * reference (per third of dqkv: dv is larger than dq and dk). The tolerances: f32 2e-5 for y and 5e-5
 * for dqkv (another summation order; no TF32); f16 2e-3 and 4e-3, bf16 2e-2 and 3e-2 (P and dS enter
 * their GEMMs rounded to the dtype, and y, dqkv are stored in it: a few of its half-ulps, 2^-11 and
 * 2^-8 relative). lse against a double-precision log-sum-exp of the rounded inputs to 1e-5 relative
 * (f32 scores whatever the dtype). A second run must give the same bits. */
static void attention_case(apex_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t C = H * D;
  const size_t nq = (size_t)(B * T * 3 * C), ny = (size_t)(B * T * C), nl = (size_t)(B * H * T);
  const double tol_y = dt == APEX_F32 ? 2e-5 : dt == APEX_F16 ? 2e-3 : 2e-2;
  const double tol_g = dt == APEX_F32 ? 5e-5 : dt == APEX_F16 ? 4e-3 : 3e-2;
  apex_tensor *hqkv = tu_random_tensor(dt, nq, 81 + (uint64_t)T, 2.0f), *hdy = tu_random_tensor(dt, ny, 83 + (uint64_t)T, 1.0f);
  /* The CPU reference on [B, H, T, D] permutes of the same values, in f32. */
  int64_t hs[4] = {B, H, T, D};
  apex_tensor *hq[3], *rdy = apex_tensor_create(APEX_F32, 4, hs);
  for (int w = 0; w < 3; w++) hq[w] = apex_tensor_create(APEX_F32, 4, hs);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++) {
          for (int w = 0; w < 3; w++)
            apex_tensor_set(hq[w], att_head(T, H, D, b, t, h, d), apex_tensor_get(hqkv, att_packed(T, 3, H, D, b, t, w, h, d)));
          apex_tensor_set(rdy, att_head(T, H, D, b, t, h, d), apex_tensor_get(hdy, att_packed(T, 1, H, D, b, t, 0, h, d)));
        }
  apex_graph *g = apex_graph_create();
  apex_var *vq = apex_var_create(hq[0], 1), *vk = apex_var_create(hq[1], 1), *vv = apex_var_create(hq[2], 1);
  apex_var *vy = apex_causal_attention(g, vq, vk, vv);
  assert_non_null(vy);
  TU_OK(apex_backward(vy, &(apex_backward_options){.grad_output = rdy}));
  const apex_tensor *ry = apex_var_value(vy), *rg[3] = {apex_var_grad(vq), apex_var_grad(vk), apex_var_grad(vv)};
  /* The GPU. */
  int64_t sq[3] = {B, T, 3 * C}, sy[3] = {B, T, C}, sl[4] = {B, H, T, 2};
  apex_tensor *qkv = apex_tensor_create_on(pc_dev, dt, 3, sq), *dy = apex_tensor_create_on(pc_dev, dt, 3, sy);
  TU_OK(apex_tensor_copy(qkv, hqkv));
  TU_OK(apex_tensor_copy(dy, hdy));
  apex_tensor *y[2], *lse[2], *dqkv[2];
  for (int run = 0; run < 2; run++) {
    y[run] = apex_tensor_create_on(pc_dev, dt, 3, sy);
    lse[run] = apex_tensor_create_on(pc_dev, APEX_F32, 4, sl);
    dqkv[run] = apex_tensor_create_on(pc_dev, dt, 3, sq);
    TU_OK(apex_tensor_fill(y[run], 7.0f)); /* every element must be overwritten */
    TU_OK(apex_tensor_fill(dqkv[run], 7.0f));
    TU_OK(apex_kernel_attention_forward(qkv, (int)H, y[run], lse[run]));
    TU_OK(apex_kernel_attention_backward(dy, qkv, y[run], lse[run], (int)H, dqkv[run]));
  }
  char what[96];
  snprintf(what, sizeof what, "attention %s B=%lld T=%lld H=%lld D=%lld", apex_dtype_name(dt), (long long)B, (long long)T,
           (long long)H, (long long)D);
  /* y and dqkv */
  double *ref = malloc(nq * sizeof *ref), scale[3] = {1e-30, 1e-30, 1e-30};
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++) {
          size_t i = att_packed(T, 1, H, D, b, t, 0, h, d);
          ref[i] = apex_tensor_get(ry, att_head(T, H, D, b, t, h, d));
          scale[0] = fmax(scale[0], fabs(ref[i]));
        }
  apex_tensor *got = host_copy(y[0]);
  for (size_t i = 0; i < ny; i++)
    if (!(fabs(apex_tensor_get(got, i) - ref[i]) <= tol_y * scale[0]))
      fail_msg("%s: y element %zu is %.8g, reference %.8g (largest %.4g)", what, i, (double)apex_tensor_get(got, i), ref[i], scale[0]);
  apex_tensor_destroy(got);
  scale[0] = 1e-30;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int w = 0; w < 3; w++)
        for (int64_t h = 0; h < H; h++)
          for (int64_t d = 0; d < D; d++) {
            size_t i = att_packed(T, 3, H, D, b, t, w, h, d);
            ref[i] = apex_tensor_get(rg[w], att_head(T, H, D, b, t, h, d));
            scale[w] = fmax(scale[w], fabs(ref[i]));
          }
  got = host_copy(dqkv[0]);
  for (size_t i = 0; i < nq; i++) {
    int w = (int)((i / (size_t)C) % 3);
    if (!(fabs(apex_tensor_get(got, i) - ref[i]) <= tol_g * scale[w]))
      fail_msg("%s: d%c element %zu of dqkv is %.8g, reference %.8g (largest %.4g)", what, "qkv"[w], i,
               (double)apex_tensor_get(got, i), ref[i], scale[w]);
  }
  apex_tensor_destroy(got);
  /* lse: log sum over s <= t of exp(q_t . k_s / sqrt(D)), in double */
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        double mx = -INFINITY, *sc = malloc((size_t)(t + 1) * sizeof *sc), se = 0;
        for (int64_t u = 0; u <= t; u++) {
          double dot = 0;
          for (int64_t d = 0; d < D; d++)
            dot += (double)apex_tensor_get(hqkv, att_packed(T, 3, H, D, b, t, 0, h, d)) *
                   apex_tensor_get(hqkv, att_packed(T, 3, H, D, b, u, 1, h, d));
          sc[u] = dot / sqrt((double)D);
          mx = fmax(mx, sc[u]);
        }
        for (int64_t u = 0; u <= t; u++) se += exp(sc[u] - mx);
        ref[(b * H + h) * T + t] = mx + log(se);
        free(sc);
      }
  snprintf(what + strlen(what), sizeof what - strlen(what), " lse");
  /* the kernel keeps each row's (m, r): its log-sum-exp is m - log r */
  apex_tensor *hst = host_copy(lse[0]), *lv = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)nl});
  for (size_t i = 0; i < nl; i++) apex_tensor_set(lv, i, (float)(apex_tensor_get(hst, 2 * i) - log(apex_tensor_get(hst, 2 * i + 1))));
  check_close(lv, ref, nl, 1e-5, 1.0, what);
  apex_tensor_destroy(hst), apex_tensor_destroy(lv);
  free(ref);
  /* deterministic: the second run gives the same bits */
  same_run_bits(y[1], y[0], "attention y, second run");
  same_run_bits(lse[1], lse[0], "attention lse, second run");
  same_run_bits(dqkv[1], dqkv[0], "attention dqkv, second run");
  for (int run = 0; run < 2; run++) {
    apex_tensor_destroy(y[run]), apex_tensor_destroy(lse[run]), apex_tensor_destroy(dqkv[run]);
  }
  apex_tensor *all[] = {hqkv, hdy, rdy, qkv, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  apex_graph_destroy(g);
  apex_var_destroy(vq), apex_var_destroy(vk), apex_var_destroy(vv);
}

/* Every bad input of the two calls is refused with a message naming the argument, before any work. */
static void attention_bad_input(void) {
  int64_t sq[3] = {1, 4, 24}, sy[3] = {1, 4, 8}, sl[4] = {1, 2, 4, 2}, s2[2] = {4, 24}, s25[3] = {1, 4, 25}, sy9[3] = {1, 4, 9};
  apex_tensor *qkv = apex_tensor_create_on(pc_dev, APEX_F32, 3, sq), *y = apex_tensor_create_on(pc_dev, APEX_F32, 3, sy);
  apex_tensor *lse = apex_tensor_create_on(pc_dev, APEX_F32, 4, sl), *dqkv = apex_tensor_create_on(pc_dev, APEX_F32, 3, sq);
  apex_tensor *dy = apex_tensor_create_on(pc_dev, APEX_F32, 3, sy);
  apex_tensor *q2 = apex_tensor_create_on(pc_dev, APEX_F32, 2, s2), *q25 = apex_tensor_create_on(pc_dev, APEX_F32, 3, s25);
  apex_tensor *y9 = apex_tensor_create_on(pc_dev, APEX_F32, 3, sy9), *y16 = apex_tensor_create_on(pc_dev, APEX_F16, 3, sy);
  apex_tensor *l16 = apex_tensor_create_on(pc_dev, APEX_F16, 4, sl), *l7 = apex_tensor_create_on(pc_dev, APEX_F32, 1, (int64_t[]){7});
  apex_tensor *dq16 = apex_tensor_create_on(pc_dev, APEX_BF16, 3, sq), *hqkv = apex_tensor_create(APEX_F32, 3, sq);
  apex_tensor *hl = apex_tensor_create(APEX_F32, 4, sl);
  TU_OK(apex_tensor_fill(qkv, 0.5f));
  TU_OK(apex_tensor_fill(dy, 0.25f));
  TU_OK(apex_kernel_attention_forward(qkv, 2, y, lse)); /* the shapes below differ from these in one thing each */
  TU_FAILS(apex_kernel_attention_forward(q2, 2, y, lse), APEX_ERR_SHAPE, "qkv has shape [4, 24]; it must be [B, T, 3 * C]");
  TU_FAILS(apex_kernel_attention_forward(q25, 2, y, lse), APEX_ERR_SHAPE, "qkv has shape [1, 4, 25]");
  TU_FAILS(apex_kernel_attention_forward(qkv, 3, y, lse), APEX_ERR_SHAPE, "C = 8 channels per third, not divisible by n_heads = 3");
  TU_FAILS(apex_kernel_attention_forward(qkv, 0, y, lse), APEX_ERR_INVALID_ARG, "n_heads is 0");
  TU_FAILS(apex_kernel_attention_forward(qkv, -1, y, lse), APEX_ERR_INVALID_ARG, "n_heads is -1");
  TU_FAILS(apex_kernel_attention_forward(qkv, 2, y9, lse), APEX_ERR_SHAPE, "y has shape [1, 4, 9]; [1, 4, 8] expected");
  TU_FAILS(apex_kernel_attention_forward(qkv, 2, y16, lse), APEX_ERR_DTYPE, "y is f16; use f32");
  TU_FAILS(apex_kernel_attention_forward(qkv, 2, y, l16), APEX_ERR_DTYPE, "stats is f16; use f32");
  TU_FAILS(apex_kernel_attention_forward(qkv, 2, y, l7), APEX_ERR_SHAPE, "stats has shape [7] (7 elements); 16 expected");
  TU_FAILS(apex_kernel_attention_forward(qkv, 1, y, lse), APEX_ERR_SHAPE, "stats has shape"); /* one head: 4 rows, not 8 */
  TU_FAILS(apex_kernel_attention_forward(hqkv, 2, y, lse), APEX_ERR_DEVICE, "qkv is on the CPU");
  TU_FAILS(apex_kernel_attention_forward(qkv, 2, y, hl), APEX_ERR_DEVICE, "stats is on the CPU");
  TU_FAILS(apex_kernel_attention_forward(NULL, 2, y, lse), APEX_ERR_INVALID_ARG, "qkv is NULL");
  TU_FAILS(apex_kernel_attention_forward(qkv, 2, NULL, lse), APEX_ERR_INVALID_ARG, "y is NULL");
  TU_OK(apex_kernel_attention_backward(dy, qkv, y, lse, 2, dqkv));
  TU_FAILS(apex_kernel_attention_backward(dy, qkv, y, lse, 2, q25), APEX_ERR_SHAPE, "dqkv has shape [1, 4, 25]; [1, 4, 24] expected");
  TU_FAILS(apex_kernel_attention_backward(dy, qkv, y, lse, 2, dq16), APEX_ERR_DTYPE, "dqkv is bf16; use f32");
  TU_FAILS(apex_kernel_attention_backward(y16, qkv, y, lse, 2, dqkv), APEX_ERR_DTYPE, "dy is f16; use f32");
  TU_FAILS(apex_kernel_attention_backward(dy, qkv, y9, lse, 2, dqkv), APEX_ERR_SHAPE, "y has shape [1, 4, 9]");
  TU_FAILS(apex_kernel_attention_backward(dy, qkv, y, l16, 2, dqkv), APEX_ERR_DTYPE, "stats is f16");
  TU_FAILS(apex_kernel_attention_backward(dy, qkv, y, lse, 3, dqkv), APEX_ERR_SHAPE, "not divisible by n_heads = 3");
  TU_FAILS(apex_kernel_attention_backward(dy, hqkv, y, lse, 2, dqkv), APEX_ERR_DEVICE, "qkv is on the CPU");
  TU_FAILS(apex_kernel_attention_backward(dy, qkv, y, lse, 2, NULL), APEX_ERR_INVALID_ARG, "dqkv is NULL");
  apex_tensor *all[] = {qkv, y, lse, dqkv, dy, q2, q25, y9, y16, l16, l7, dq16, hqkv, hl};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
}

static void pc_attention_matches_cpu(void) {
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (int k = 0; k < 3; k++) {
    attention_case(dts[k], 2, 7, 3, 8);   /* T not a multiple of 8: the padded [T, T] rows */
    attention_case(dts[k], 1, 33, 2, 16); /* T past a warp */
    attention_case(dts[k], 2, 64, 4, 32);
  }
  attention_case(APEX_BF16, 1, 300, 2, 64); /* rows longer than a 256-thread block */
  attention_bad_input();
}

/* A graph takes only tensors on its own device (test_graph_cuda runs ops on a CUDA graph): a device tensor
 * into a CPU graph is refused naming both devices, as is a device leaf in a CPU graph's op; a leaf may
 * live on the device (its grad does too), and its value is swapped only for one on the same device. */
static void pc_autograd_refuses_device_tensors(void) {
  int64_t shape[2] = {4, 8};
  apex_tensor *d = apex_tensor_create_on(pc_dev, APEX_F32, 2, shape);
  apex_graph *g = apex_graph_create();
  apex_clear_error();
  assert_null(apex_graph_input(g, d, 1));
  tu_assert_message("apex_graph_input: the tensor is on device CUDA but the graph is on device CPU");
  assert_int_equal(apex_last_status(), APEX_ERR_DEVICE);
  apex_tensor *d2 = apex_tensor_create_on(pc_dev, APEX_F32, 2, shape);
  apex_var *dleaf = apex_var_create(d2, 1);
  assert_non_null(dleaf);
  assert_int_equal(apex_tensor_device(apex_var_grad(dleaf)), pc_dev);
  assert_null(apex_relu(g, dleaf));
  tu_assert_message("relu: input 0 is on device CUDA but the graph is on device CPU");
  apex_tensor *h = apex_tensor_create(APEX_F32, 2, shape);
  apex_var *leaf = apex_var_create(h, 1);
  assert_non_null(leaf);
  assert_null(apex_var_swap_value(leaf, d));
  tu_assert_message("apex_var_swap_value: the new value is on device CUDA but the leaf's value is on device CPU");
  assert_ptr_equal(apex_var_value(leaf), h); /* unchanged */
  apex_var_destroy(leaf);
  apex_var_destroy(dleaf);
  apex_graph_destroy(g);
  apex_tensor_destroy(d);
}

#endif
