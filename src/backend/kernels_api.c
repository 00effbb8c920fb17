/* kernels_api.c: the fronts of the raw kernels (apex/kernels.h). Each checks its arguments in plain C and
 * runs the kernel of the backend its tensors are on; a backend without the kernel gets
 * APEX_ERR_UNSUPPORTED naming it (backend.h's NULL-slot rule). The CUDA backend's kernels are reached
 * through its table (cuda_ops.h), only after a tensor proved to be a CUDA tensor, which exists only in a
 * build that has it; the other tensors of the call must then be CUDA tensors too (APEX_ERR_DEVICE naming
 * the one that is not). */
#include <stdlib.h>
#include <string.h>

#include "apex/kernels.h"
#include "core/internal.h"
#include "core/tensor_internal.h"
#include "backend/backend.h"
#include "backend/cuda_ops.h"

/* The CUDA backend's table behind a front whose tensors are CUDA tensors. */
#define CU (apex__cuda_ops())

#define KERNEL_PREFIX "apex_kernel_"

/* APEX_OK when the backend of the call's device has fn's kernel and can run it now; otherwise a message
 * naming fn, the kernel and the device. The device is CUDA when any of the call's n tensors is there (a
 * CPU one among them is then named by need()), else that of its first tensor; NULL tensors are skipped
 * (need() names them). */
static apex_status on_device(const char *fn, const apex_tensor *const *ts, int n) {
  const apex_tensor *first = NULL;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (apex_tensor_device(ts[i]) == APEX_DEVICE_CUDA) return apex__cuda_need(fn) ? APEX_OK : apex_last_status();
    if (!first) first = ts[i];
  }
  if (!first) return APEX_OK;
  const apex_backend *b = apex__backend_need(apex_tensor_device(first), fn);
  if (!b) return apex_last_status();
  /* The kernels live only in the CUDA backend's table: every other backend lacks them. */
  size_t np = strlen(KERNEL_PREFIX);
  return apex__backend_slot_missing(b, fn, strncmp(fn, KERNEL_PREFIX, np) == 0 ? fn + np : fn);
}

#define ON_DEVICE(fn, ...)                                                                          \
  do {                                                                                              \
    const apex_tensor *const on_ts_[] = {__VA_ARGS__};                                              \
    apex_status on_ = on_device(fn, on_ts_, (int)(sizeof on_ts_ / sizeof on_ts_[0]));               \
    if (on_ != APEX_OK) return on_;                                                                 \
  } while (0)

/* ---- argument checks shared by the kernels below ------------------------------------------------------- */

static apex_status need(const char *fn, const char *what, const apex_tensor *t) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
  if (apex_tensor_device(t) != APEX_DEVICE_CUDA) /* another tensor of the call took it to CUDA (on_device) */
    return apex__fail(APEX_ERR_DEVICE, "%s: %s is on the %s while the call runs on CUDA; every tensor of one call "
                      "must be on the same device", fn, what, apex__device_name(apex_tensor_device(t)));
  return APEX_OK;
}

/* 1 when the bytes of a and b overlap. */
static int overlaps(const apex_tensor *a, const apex_tensor *b) {
  uintptr_t pa = (uintptr_t)apex_tensor_data(a), pb = (uintptr_t)apex_tensor_data(b);
  size_t na = apex_tensor_nbytes(a), nb = apex_tensor_nbytes(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

/* The output `out` must not share a byte with the input `in` (kernels that read an input after, or
 * while, writing their output); APEX_ERR_INVALID_ARG naming both otherwise. */
static apex_status need_apart(const char *fn, const char *oname, const apex_tensor *out, const char *iname,
                              const apex_tensor *in) {
  if (!overlaps(out, in)) return APEX_OK;
  return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s overlaps %s; it needs memory of its own", fn, oname, iname);
}

static apex_status need_numel(const char *fn, const char *what, const apex_tensor *t, size_t numel) {
  apex_status st = need(fn, what, t);
  if (st == APEX_OK && apex_tensor_numel(t) != numel) {
    char buf[96];
    st = apex__fail(APEX_ERR_SHAPE, "%s: %s has shape %s (%zu elements); %zu expected", fn, what,
                    apex_tensor_shape_str(t, buf, sizeof buf), apex_tensor_numel(t), numel);
  }
  return st;
}

static apex_status need_dtype(const char *fn, const char *what, const apex_tensor *t, apex_dtype a, apex_dtype b) {
  apex_dtype d = apex_tensor_dtype(t);
  if (d != a && d != b)
    return apex__fail(APEX_ERR_DTYPE, "%s: %s is %s; use %s%s%s", fn, what, apex_dtype_name(d), apex_dtype_name(a),
                      a == b ? "" : " or ", a == b ? "" : apex_dtype_name(b));
  return APEX_OK;
}

/* ---- fused kernels ------------------------------------------------------------------------------------------ */

static int64_t rows_of(const apex_tensor *x, int64_t cols) { return cols ? (int64_t)(apex_tensor_numel(x) / (size_t)cols) : 0; }

apex_status apex_kernel_layer_norm_forward(const apex_tensor *x, const apex_tensor *w, const apex_tensor *b, float eps,
                                           int rms, apex_tensor *y, apex_tensor *mean, apex_tensor *rstd) {
  const char *fn = "apex_kernel_layer_norm_forward";
  ON_DEVICE(fn, x, w, b, y, mean, rstd);
  apex_status st = need(fn, "x", x);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(x) < 1) return apex__fail(APEX_ERR_SHAPE, "%s: x is a scalar; it needs a last dimension", fn);
  int64_t cols = apex_tensor_dim(x, -1), rows = rows_of(x, cols);
  apex_dtype xt = apex_tensor_dtype(x);
  if ((st = need_numel(fn, "w", w, (size_t)cols)) || (st = need_dtype(fn, "w", w, APEX_F32, xt)) ||
      (b && ((st = need_numel(fn, "b", b, (size_t)cols)) || (st = need_dtype(fn, "b", b, apex_tensor_dtype(w), apex_tensor_dtype(w))))) ||
      (st = need_numel(fn, "y", y, apex_tensor_numel(x))) || (st = need_dtype(fn, "y", y, xt, xt)) ||
      (!rms && ((st = need_numel(fn, "mean", mean, (size_t)rows)) || (st = need_dtype(fn, "mean", mean, APEX_F32, APEX_F32)))) ||
      (st = need_numel(fn, "rstd", rstd, (size_t)rows)) || (st = need_dtype(fn, "rstd", rstd, APEX_F32, APEX_F32)))
    return st;
  if (!(eps >= 0.0f)) return apex__fail(APEX_ERR_INVALID_ARG, "%s: eps is %g; it must be >= 0", fn, (double)eps);
  /* The kernels read a row into registers and may write y before other rows' x is read. */
  if ((st = need_apart(fn, "y", y, "x", x))) return st;
  return CU->layer_norm_fwd(apex_tensor_data(x), xt, apex_tensor_data(w), b ? apex_tensor_data(b) : NULL,
                                   apex_tensor_dtype(w), rows, cols, eps, rms, apex_tensor_data(y),
                                   rms ? NULL : apex_tensor_data(mean), apex_tensor_data(rstd));
}

apex_status apex_kernel_layer_norm_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                            const apex_tensor *mean, const apex_tensor *rstd, int rms, apex_tensor *dx,
                                            apex_tensor *dw, apex_tensor *db) {
  const char *fn = "apex_kernel_layer_norm_backward";
  ON_DEVICE(fn, dy, x, w, mean, rstd, dx, dw, db);
  apex_status st = need(fn, "x", x);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(x) < 1) return apex__fail(APEX_ERR_SHAPE, "%s: x is a scalar; it needs a last dimension", fn);
  int64_t cols = apex_tensor_dim(x, -1), rows = rows_of(x, cols);
  apex_dtype xt = apex_tensor_dtype(x);
  if ((st = need_numel(fn, "dy", dy, apex_tensor_numel(x))) || (st = need_dtype(fn, "dy", dy, xt, xt)) ||
      (st = need_numel(fn, "w", w, (size_t)cols)) || (st = need_dtype(fn, "w", w, APEX_F32, xt)) ||
      (!rms && ((st = need_numel(fn, "mean", mean, (size_t)rows)) || (st = need_dtype(fn, "mean", mean, APEX_F32, APEX_F32)))) ||
      (st = need_numel(fn, "rstd", rstd, (size_t)rows)) || (st = need_dtype(fn, "rstd", rstd, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "dx", dx, apex_tensor_numel(x))) || (st = need_dtype(fn, "dx", dx, xt, xt)) ||
      (st = need_numel(fn, "dw", dw, (size_t)cols)) || (st = need_dtype(fn, "dw", dw, apex_tensor_dtype(w), apex_tensor_dtype(w))) ||
      (db && ((st = need_numel(fn, "db", db, (size_t)cols)) || (st = need_dtype(fn, "db", db, apex_tensor_dtype(w), apex_tensor_dtype(w))))))
    return st;
  /* dw and db are summed from dy and x after (or while) dx is written. */
  if ((st = need_apart(fn, "dx", dx, "dy", dy)) || (st = need_apart(fn, "dx", dx, "x", x))) return st;
  return CU->layer_norm_bwd(apex_tensor_data(dy), apex_tensor_data(x), xt, apex_tensor_data(w),
                                   apex_tensor_dtype(w), rms ? NULL : apex_tensor_data(mean), apex_tensor_data(rstd),
                                   rows, cols, rms, apex_tensor_data(dx), apex_tensor_data(dw),
                                   db ? apex_tensor_data(db) : NULL);
}

static apex_status xent_args(const char *fn, const apex_tensor *logits, const int64_t *target, float smoothing,
                             int64_t *rows, int64_t *cols) {
  apex_status st = need(fn, "logits", logits);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(logits) != 2) {
    char buf[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: logits has shape %s; it must be [rows, classes]", fn,
                      apex_tensor_shape_str(logits, buf, sizeof buf));
  }
  *rows = apex_tensor_dim(logits, 0);
  *cols = apex_tensor_dim(logits, 1);
  if (!target && *rows > 0) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL target", fn);
  if (!(smoothing >= 0.0f && smoothing <= 1.0f))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: label_smoothing is %g; it must be in [0, 1]", fn, (double)smoothing);
  return APEX_OK;
}

apex_status apex_kernel_cross_entropy_forward(const apex_tensor *logits, const int64_t *target, int64_t ignore_index,
                                              float label_smoothing, apex_tensor *loss, apex_tensor *lse) {
  const char *fn = "apex_kernel_cross_entropy_forward";
  ON_DEVICE(fn, logits, loss, lse);
  int64_t rows = 0, cols = 0;
  apex_status st = xent_args(fn, logits, target, label_smoothing, &rows, &cols);
  if (st || (st = need_numel(fn, "loss", loss, (size_t)rows)) || (st = need_dtype(fn, "loss", loss, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "lse", lse, (size_t)rows)) || (st = need_dtype(fn, "lse", lse, APEX_F32, APEX_F32)))
    return st;
  return CU->xent_fwd(apex_tensor_data(logits), apex_tensor_dtype(logits), target, rows, cols,
                             ignore_index, label_smoothing, apex_tensor_data(loss), apex_tensor_data(lse));
}

apex_status apex_kernel_cross_entropy_backward(const apex_tensor *dloss, const apex_tensor *logits,
                                               const int64_t *target, const apex_tensor *lse, int64_t ignore_index,
                                               float label_smoothing, apex_tensor *dlogits) {
  const char *fn = "apex_kernel_cross_entropy_backward";
  ON_DEVICE(fn, dloss, logits, lse, dlogits);
  int64_t rows = 0, cols = 0;
  apex_status st = xent_args(fn, logits, target, label_smoothing, &rows, &cols);
  if (st || (st = need_numel(fn, "dloss", dloss, (size_t)rows)) || (st = need_dtype(fn, "dloss", dloss, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "lse", lse, (size_t)rows)) || (st = need_dtype(fn, "lse", lse, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "dlogits", dlogits, apex_tensor_numel(logits))) ||
      (st = need_dtype(fn, "dlogits", dlogits, apex_tensor_dtype(logits), apex_tensor_dtype(logits))))
    return st;
  return CU->xent_bwd(apex_tensor_data(dloss), apex_tensor_data(logits), apex_tensor_dtype(logits),
                             target, apex_tensor_data(lse), rows, cols, ignore_index, label_smoothing,
                             apex_tensor_data(dlogits));
}

apex_status apex_kernel_batch_norm_stats(const apex_tensor *x, apex_tensor *mean, apex_tensor *var, apex_tensor *m2) {
  const char *fn = "apex_kernel_batch_norm_stats";
  ON_DEVICE(fn, x, mean, var, m2);
  apex_status st = need(fn, "x", x);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(x) < 2) return apex__fail(APEX_ERR_SHAPE, "%s: x needs at least [N, C]", fn);
  int64_t n = apex_tensor_dim(x, 0), c = apex_tensor_dim(x, 1);
  int64_t hw = n > 0 && c > 0 ? (int64_t)apex_tensor_numel(x) / (n * c) : 0;
  if ((st = need_numel(fn, "mean", mean, (size_t)c)) || (st = need_dtype(fn, "mean", mean, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "var", var, (size_t)c)) || (st = need_dtype(fn, "var", var, APEX_F32, APEX_F32)) ||
      (m2 && ((st = need_numel(fn, "m2", m2, (size_t)c)) || (st = need_dtype(fn, "m2", m2, APEX_F32, APEX_F32)))))
    return st;
  return CU->bn_stats(apex_tensor_data(x), apex_tensor_dtype(x), n, c, hw, apex_tensor_data(mean),
                             apex_tensor_data(var), m2 ? apex_tensor_data(m2) : NULL);
}

apex_status apex_kernel_matmul(const apex_tensor *a, int trans_a, const apex_tensor *b, int trans_b, apex_tensor *c,
                               float alpha, float beta, const apex_tensor *bias, int gelu) {
  const char *fn = "apex_kernel_matmul";
  ON_DEVICE(fn, a, b, c, bias);
  apex_status st;
  if ((st = need(fn, "a", a)) || (st = need(fn, "b", b)) || (st = need(fn, "c", c))) return st;
  if (apex_tensor_ndim(a) != 2 || apex_tensor_ndim(b) != 2 || apex_tensor_ndim(c) != 2)
    return apex__fail(APEX_ERR_SHAPE, "%s: a, b and c must be 2-d", fn);
  int64_t m = apex_tensor_dim(a, trans_a ? 1 : 0), k = apex_tensor_dim(a, trans_a ? 0 : 1);
  int64_t kb = apex_tensor_dim(b, trans_b ? 1 : 0), n = apex_tensor_dim(b, trans_b ? 0 : 1);
  if (k != kb || apex_tensor_dim(c, 0) != m || apex_tensor_dim(c, 1) != n) {
    char sa[64], sb[64], sc[64];
    return apex__fail(APEX_ERR_SHAPE, "%s: op(a) %s%s times op(b) %s%s does not give c %s", fn,
                      apex_tensor_shape_str(a, sa, sizeof sa), trans_a ? "^T" : "", apex_tensor_shape_str(b, sb, sizeof sb),
                      trans_b ? "^T" : "", apex_tensor_shape_str(c, sc, sizeof sc));
  }
  apex_dtype it = apex_tensor_dtype(a), ct = apex_tensor_dtype(c);
  if ((st = need_dtype(fn, "b", b, it, it)) || (st = need_dtype(fn, "c", c, APEX_F32, it)) ||
      (bias && ((st = need_numel(fn, "bias", bias, (size_t)n)) || (st = need_dtype(fn, "bias", bias, ct, ct)))))
    return st;
  return CU->gemm(trans_a, trans_b, m, n, k, alpha, apex_tensor_data(a), apex_tensor_data(b), it, beta,
                         apex_tensor_data(c), ct, bias ? apex_tensor_data(bias) : NULL, gelu);
}

/* ---- convolution ----------------------------------------------------------------------------------------- */

/* The geometry of a convolution of x by w (both checked to be 4-d CUDA tensors of one float dtype). */
static apex_status conv_geometry(const char *fn, const apex_tensor *x, const apex_tensor *w, const apex_conv2d_options *o,
                                 apex__cuda_conv *g) {
  apex_status st;
  if ((st = need(fn, "x", x)) || (st = need(fn, "w", w))) return st;
  char xs[96], ws[96];
  apex_tensor_shape_str(x, xs, sizeof xs);
  apex_tensor_shape_str(w, ws, sizeof ws);
  if (apex_tensor_ndim(x) != 4 || apex_tensor_ndim(w) != 4)
    return apex__fail(APEX_ERR_SHAPE, "%s: x %s and w %s must be [N, C, H, W] and [K, C, R, S]", fn, xs, ws);
  if (apex_tensor_dim(w, 1) != apex_tensor_dim(x, 1))
    return apex__fail(APEX_ERR_SHAPE, "%s: w %s has %lld input channels but x %s has %lld", fn, ws, (long long)apex_tensor_dim(w, 1),
                      xs, (long long)apex_tensor_dim(x, 1));
  apex_dtype dt = apex_tensor_dtype(x);
  if ((st = need_dtype(fn, "w", w, dt, dt))) return st;
  static const apex_conv2d_options defaults = {0};
  if (!o) o = &defaults;
  if (o->stride_h < 0 || o->stride_w < 0 || o->pad_h < 0 || o->pad_w < 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: stride (%d, %d) and padding (%d, %d) must be >= 0", fn, o->stride_h, o->stride_w,
                      o->pad_h, o->pad_w);
  int64_t d[8] = {apex_tensor_dim(x, 0), apex_tensor_dim(x, 1), apex_tensor_dim(x, 2), apex_tensor_dim(x, 3),
                  apex_tensor_dim(w, 0), apex_tensor_dim(w, 2), apex_tensor_dim(w, 3), 0};
  for (int i = 0; i < 7; i++)
    if (d[i] > INT32_MAX) return apex__fail(APEX_ERR_SHAPE, "%s: x %s or w %s has a dimension past cuDNN's int range", fn, xs, ws);
  *g = (apex__cuda_conv){.n = (int)d[0], .c = (int)d[1], .h = (int)d[2], .w = (int)d[3], .k = (int)d[4], .r = (int)d[5],
                         .s = (int)d[6], .pad_h = o->pad_h, .pad_w = o->pad_w, .stride_h = o->stride_h ? o->stride_h : 1,
                         .stride_w = o->stride_w ? o->stride_w : 1, .dtype = dt};
  int64_t hp = d[2] + 2 * (int64_t)g->pad_h - d[5], wp = d[3] + 2 * (int64_t)g->pad_w - d[6];
  if (hp < 0 || wp < 0)
    return apex__fail(APEX_ERR_SHAPE, "%s: the kernel of w %s is larger than x %s with padding (%d, %d)", fn, ws, xs, g->pad_h, g->pad_w);
  g->p = (int)(hp / g->stride_h + 1);
  g->q = (int)(wp / g->stride_w + 1);
  return APEX_OK;
}

/* t has the shape [a, b, c, d]. */
static apex_status need_shape4(const char *fn, const char *what, const apex_tensor *t, int a, int b, int c, int d) {
  apex_status st = need(fn, what, t);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(t) != 4 || apex_tensor_dim(t, 0) != a || apex_tensor_dim(t, 1) != b || apex_tensor_dim(t, 2) != c ||
      apex_tensor_dim(t, 3) != d) {
    char buf[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: %s has shape %s; [%d, %d, %d, %d] expected", fn, what,
                      apex_tensor_shape_str(t, buf, sizeof buf), a, b, c, d);
  }
  return APEX_OK;
}

apex_status apex_kernel_conv2d_forward(const apex_tensor *x, const apex_tensor *w, const apex_tensor *b,
                                       const apex_conv2d_options *opts, apex_tensor *y) {
  const char *fn = "apex_kernel_conv2d_forward";
  ON_DEVICE(fn, x, w, b, y);
  apex__cuda_conv g;
  apex_status st = conv_geometry(fn, x, w, opts, &g);
  if (st || (st = need_shape4(fn, "y", y, g.n, g.k, g.p, g.q)) || (st = need_dtype(fn, "y", y, g.dtype, g.dtype)) ||
      (b && ((st = need_numel(fn, "b", b, (size_t)g.k)) || (st = need_dtype(fn, "b", b, APEX_F32, g.dtype)))))
    return st;
  return CU->conv2d_fwd(&g, apex_tensor_data(x), apex_tensor_data(w), b ? apex_tensor_data(b) : NULL,
                               b ? apex_tensor_dtype(b) : APEX_F32, apex_tensor_data(y));
}

apex_status apex_kernel_conv2d_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                        const apex_conv2d_options *opts, apex_tensor *dx, apex_tensor *dw, apex_tensor *db) {
  const char *fn = "apex_kernel_conv2d_backward";
  ON_DEVICE(fn, dy, x, w, dx, dw, db);
  apex__cuda_conv g;
  apex_status st = conv_geometry(fn, x, w, opts, &g);
  if (st || (st = need_shape4(fn, "dy", dy, g.n, g.k, g.p, g.q)) || (st = need_dtype(fn, "dy", dy, g.dtype, g.dtype)) ||
      (dx && ((st = need_shape4(fn, "dx", dx, g.n, g.c, g.h, g.w)) || (st = need_dtype(fn, "dx", dx, g.dtype, g.dtype)))) ||
      (dw && ((st = need_shape4(fn, "dw", dw, g.k, g.c, g.r, g.s)) || (st = need_dtype(fn, "dw", dw, g.dtype, g.dtype)))) ||
      (db && ((st = need_numel(fn, "db", db, (size_t)g.k)) || (st = need_dtype(fn, "db", db, APEX_F32, g.dtype)))))
    return st;
  return CU->conv2d_bwd(&g, apex_tensor_data(dy), apex_tensor_data(x), apex_tensor_data(w),
                               dx ? apex_tensor_data(dx) : NULL, dw ? apex_tensor_data(dw) : NULL,
                               db ? apex_tensor_data(db) : NULL, db ? apex_tensor_dtype(db) : APEX_F32);
}

/* ---- embedding ------------------------------------------------------------------------------------------- */

/* table (or dtable) is a CUDA [V, D] tensor and ids[0..n) are in [0, V). */
static apex_status embedding_args(const char *fn, const char *what, const apex_tensor *table, const int64_t *ids, int64_t n) {
  apex_status st = need(fn, what, table);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(table) != 2) {
    char buf[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: %s has shape %s; it must be [V, D]", fn, what, apex_tensor_shape_str(table, buf, sizeof buf));
  }
  if (n < 0) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %lld ids", fn, (long long)n);
  if (n > 0 && !ids) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL ids", fn);
  int64_t v = apex_tensor_dim(table, 0);
  for (int64_t t = 0; t < n; t++)
    if (ids[t] < 0 || ids[t] >= v)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: id %lld at %lld is outside [0, %lld)", fn, (long long)ids[t], (long long)t, (long long)v);
  return APEX_OK;
}

apex_status apex_kernel_embedding_forward(const apex_tensor *table, const int64_t *ids, int64_t n, apex_tensor *y) {
  const char *fn = "apex_kernel_embedding_forward";
  ON_DEVICE(fn, table, y);
  apex_status st = embedding_args(fn, "table", table, ids, n);
  if (st != APEX_OK) return st;
  int64_t v = apex_tensor_dim(table, 0), d = apex_tensor_dim(table, 1);
  apex_dtype tt = apex_tensor_dtype(table);
  if ((st = need_numel(fn, "y", y, (size_t)(n * d))) || (st = need_dtype(fn, "y", y, tt, tt))) return st;
  return CU->embedding_fwd(apex_tensor_data(table), tt, v, d, ids, n, apex_tensor_data(y), tt);
}

apex_status apex_kernel_embedding_backward(const apex_tensor *dy, const int64_t *ids, int64_t n, apex_tensor *dtable) {
  const char *fn = "apex_kernel_embedding_backward";
  ON_DEVICE(fn, dy, dtable);
  apex_status st = embedding_args(fn, "dtable", dtable, ids, n);
  if (st != APEX_OK) return st;
  int64_t v = apex_tensor_dim(dtable, 0), d = apex_tensor_dim(dtable, 1);
  if ((st = need_numel(fn, "dy", dy, (size_t)(n * d)))) return st;
  return CU->embedding_bwd(apex_tensor_data(dy), apex_tensor_dtype(dy), ids, n, v, d, apex_tensor_data(dtable),
                                  apex_tensor_dtype(dtable));
}

/* ---- attention ------------------------------------------------------------------------------------------- */

/* t is the CUDA tensor [b, t, c] of dtype dt. */
static apex_status need_btc(const char *fn, const char *what, const apex_tensor *x, int64_t b, int64_t t, int64_t c,
                            apex_dtype dt) {
  apex_status st = need(fn, what, x);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(x) != 3 || apex_tensor_dim(x, 0) != b || apex_tensor_dim(x, 1) != t || apex_tensor_dim(x, 2) != c) {
    char buf[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: %s has shape %s; [%lld, %lld, %lld] expected", fn, what,
                      apex_tensor_shape_str(x, buf, sizeof buf), (long long)b, (long long)t, (long long)c);
  }
  return need_dtype(fn, what, x, dt, dt);
}

/* qkv is a CUDA [B, T, 3 * C] tensor with C split into n_heads heads (any of the three float dtypes: a
 * tensor has no other), and lse an f32 CUDA tensor of B * n_heads * T elements; fills a with the shapes. */
static apex_status attention_args(const char *fn, const apex_tensor *qkv, int n_heads, const apex_tensor *lse,
                                  apex__cuda_attn *a) {
  apex_status st = need(fn, "qkv", qkv);
  if (st != APEX_OK) return st;
  char buf[96];
  apex_tensor_shape_str(qkv, buf, sizeof buf);
  if (apex_tensor_ndim(qkv) != 3 || apex_tensor_dim(qkv, 2) % 3 != 0 || apex_tensor_dim(qkv, 2) == 0)
    return apex__fail(APEX_ERR_SHAPE, "%s: qkv has shape %s; it must be [B, T, 3 * C] with C >= 1", fn, buf);
  if (n_heads < 1) return apex__fail(APEX_ERR_INVALID_ARG, "%s: n_heads is %d; it must be >= 1", fn, n_heads);
  int64_t c = apex_tensor_dim(qkv, 2) / 3;
  if (c % n_heads != 0)
    return apex__fail(APEX_ERR_SHAPE, "%s: qkv %s has C = %lld channels per third, not divisible by n_heads = %d", fn, buf,
                      (long long)c, n_heads);
  *a = (apex__cuda_attn){.b = apex_tensor_dim(qkv, 0), .t = apex_tensor_dim(qkv, 1), .h = n_heads, .d = c / n_heads,
                         .dtype = apex_tensor_dtype(qkv)};
  if (a->b * a->h > INT32_MAX)
    return apex__fail(APEX_ERR_SHAPE, "%s: qkv %s with %d heads makes %lld (batch, head) pairs; at most %d", fn, buf, n_heads,
                      (long long)(a->b * a->h), INT32_MAX);
  if ((st = need_numel(fn, "lse", lse, (size_t)(a->b * a->h * a->t))) || (st = need_dtype(fn, "lse", lse, APEX_F32, APEX_F32)))
    return st;
  return APEX_OK;
}

apex_status apex_kernel_attention_forward(const apex_tensor *qkv, int n_heads, apex_tensor *y, apex_tensor *lse) {
  const char *fn = "apex_kernel_attention_forward";
  ON_DEVICE(fn, qkv, y, lse);
  apex__cuda_attn a;
  apex_status st = attention_args(fn, qkv, n_heads, lse, &a);
  if (st || (st = need_btc(fn, "y", y, a.b, a.t, a.h * a.d, a.dtype))) return st;
  if (a.b * a.t == 0) return APEX_OK; /* no positions: y and lse are empty */
  return CU->attention_fwd(&a, apex_tensor_data(qkv), apex_tensor_data(y), apex_tensor_data(lse));
}

apex_status apex_kernel_attention_backward(const apex_tensor *dy, const apex_tensor *qkv, const apex_tensor *y,
                                           const apex_tensor *lse, int n_heads, apex_tensor *dqkv) {
  const char *fn = "apex_kernel_attention_backward";
  ON_DEVICE(fn, dy, qkv, y, lse, dqkv);
  apex__cuda_attn a;
  apex_status st = attention_args(fn, qkv, n_heads, lse, &a);
  if (st || (st = need_btc(fn, "dy", dy, a.b, a.t, a.h * a.d, a.dtype)) ||
      (st = need_btc(fn, "y", y, a.b, a.t, a.h * a.d, a.dtype)) ||
      (st = need_btc(fn, "dqkv", dqkv, a.b, a.t, 3 * a.h * a.d, a.dtype)))
    return st;
  if (a.b * a.t == 0) return APEX_OK;
  return CU->attention_bwd(&a, apex_tensor_data(dy), apex_tensor_data(qkv), apex_tensor_data(y),
                                  apex_tensor_data(lse), apex_tensor_data(dqkv));
}

/* ---- elementwise and reductions ------------------------------------------------------------------------- */

/* The output y may be the input `in` itself in its dtype (an in-place update: each element is read,
 * then written, by one thread) but may not overlap it otherwise: through a shifted view, or with
 * another element size, threads would overwrite elements that others have yet to read. */
static apex_status need_in_place_or_apart(const char *fn, const char *yname, const apex_tensor *y, const char *iname,
                                          const apex_tensor *in) {
  if (!overlaps(y, in) || (apex_tensor_data(y) == apex_tensor_data(in) && apex_tensor_dtype(y) == apex_tensor_dtype(in)))
    return APEX_OK;
  return apex__fail(APEX_ERR_INVALID_ARG,
                    "%s: %s (%s) overlaps %s (%s) without being it in the same dtype; an in-place update must pass the "
                    "same tensor (or a view of the same memory and dtype)",
                    fn, yname, apex_dtype_name(apex_tensor_dtype(y)), iname, apex_dtype_name(apex_tensor_dtype(in)));
}

/* The checks every elementwise call shares, then the launch: a, b (when bname is set; NULL is then an
 * error) and y are CUDA tensors with a's element count (any shapes, any dtypes), and y is an input or
 * apart from it. */
static apex_status elementwise(const char *fn, apex__cuda_ew_op op, const char *aname, const apex_tensor *a,
                               const char *bname, const apex_tensor *b, float alpha, const char *yname, apex_tensor *y) {
  ON_DEVICE(fn, a, b, y);
  apex_status st = need(fn, aname, a);
  if (st != APEX_OK) return st;
  size_t n = apex_tensor_numel(a);
  if ((bname && (st = need_numel(fn, bname, b, n))) || (st = need_numel(fn, yname, y, n)) ||
      (st = need_in_place_or_apart(fn, yname, y, aname, a)) ||
      (bname && (st = need_in_place_or_apart(fn, yname, y, bname, b))))
    return st;
  return CU->ew(op, apex_tensor_data(a), apex_tensor_dtype(a), bname ? apex_tensor_data(b) : NULL,
                       bname ? apex_tensor_dtype(b) : APEX_F32, alpha, apex_tensor_data(y), apex_tensor_dtype(y),
                       (int64_t)n);
}

apex_status apex_kernel_add(const apex_tensor *a, const apex_tensor *b, apex_tensor *y) {
  return elementwise("apex_kernel_add", APEX__EW_ADD, "a", a, "b", b, 0.0f, "y", y);
}

apex_status apex_kernel_mul(const apex_tensor *a, const apex_tensor *b, apex_tensor *y) {
  return elementwise("apex_kernel_mul", APEX__EW_MUL, "a", a, "b", b, 0.0f, "y", y);
}

apex_status apex_kernel_scale(const apex_tensor *x, float alpha, apex_tensor *y) {
  return elementwise("apex_kernel_scale", APEX__EW_SCALE, "x", x, NULL, NULL, alpha, "y", y);
}

apex_status apex_kernel_relu_forward(const apex_tensor *x, apex_tensor *y) {
  return elementwise("apex_kernel_relu_forward", APEX__EW_RELU, "x", x, NULL, NULL, 0.0f, "y", y);
}

apex_status apex_kernel_relu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx) {
  return elementwise("apex_kernel_relu_backward", APEX__EW_RELU_BWD, "dy", dy, "x", x, 0.0f, "dx", dx);
}

apex_status apex_kernel_gelu_forward(const apex_tensor *x, apex_tensor *y) {
  return elementwise("apex_kernel_gelu_forward", APEX__EW_GELU, "x", x, NULL, NULL, 0.0f, "y", y);
}

apex_status apex_kernel_gelu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx) {
  return elementwise("apex_kernel_gelu_backward", APEX__EW_GELU_BWD, "dy", dy, "x", x, 0.0f, "dx", dx);
}

apex_status apex_kernel_sum_rows(const apex_tensor *x, apex_tensor *y, int accumulate) {
  const char *fn = "apex_kernel_sum_rows";
  ON_DEVICE(fn, x, y);
  apex_status st;
  if ((st = need(fn, "x", x)) || (st = need(fn, "y", y))) return st;
  size_t n = apex_tensor_numel(x), cols = apex_tensor_numel(y);
  if (cols ? n % cols != 0 : n != 0) {
    char xs[96], ys[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: x %s (%zu elements) is not a whole number of rows of y's %zu columns (y %s)", fn,
                      apex_tensor_shape_str(x, xs, sizeof xs), n, cols, apex_tensor_shape_str(y, ys, sizeof ys));
  }
  if ((st = need_apart(fn, "y", y, "x", x))) return st;
  return CU->sum_rows(apex_tensor_data(x), apex_tensor_dtype(x), cols ? (int64_t)(n / cols) : 0, (int64_t)cols,
                             apex_tensor_data(y), apex_tensor_dtype(y), accumulate != 0);
}

apex_status apex_kernel_sum_all(const apex_tensor *x, int mean, apex_tensor *y) {
  const char *fn = "apex_kernel_sum_all";
  ON_DEVICE(fn, x, y);
  apex_status st;
  if ((st = need(fn, "x", x)) || (st = need_numel(fn, "y", y, 1)) || (st = need_dtype(fn, "y", y, APEX_F32, APEX_F32)))
    return st;
  if ((st = need_apart(fn, "y", y, "x", x))) return st;
  return CU->sum_all(apex_tensor_data(x), apex_tensor_dtype(x), (int64_t)apex_tensor_numel(x), mean != 0,
                            apex_tensor_data(y));
}
