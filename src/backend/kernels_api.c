/* kernels_api.c: the fronts of the raw kernels (apex/kernels.h). Each checks its arguments in plain C and
 * runs the nn slots (backend/args_nn.h) of the backend its tensors are on: the same kernels autograd's
 * ops run, so that every device with those slots runs kernels.h too. Where a raw kernel's contract
 * differs from the slot's (gradients overwritten in the tensors' own dtypes where the slots write f32,
 * statistics in tensors of their own), the front goes through device scratch from the backend's memory
 * slots, freed when the call returns (in stream order on a device that queues work). A backend without a
 * slot answers APEX_ERR_UNSUPPORTED naming the call and the slot (backend.h's NULL-slot rule). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apex/kernels.h"
#include "core/internal.h"
#include "core/tensor_internal.h"
#include "backend/backend.h"

/* ---- the call's device, its backend and its scratch ----------------------------------------------------- */

#define KS_MAX 16

/* The device of the call running on this thread (k_begin), which need() checks every tensor against. */
static _Thread_local apex_device call_dev;

/* One call's backend (that of its first tensor; every other must be on the same device) and the device
 * memory it took for scratch and workspace, freed by ks_end. */
typedef struct kcall {
  const char *fn;
  const apex_backend *be;
  apex_device dev;
  void *blocks[KS_MAX];
  int n;
} kcall;

static void *ks_get(void *ctx, size_t bytes) {
  kcall *k = ctx;
  if (k->n == KS_MAX) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: more than %d scratch buffers", k->fn, KS_MAX);
  void *p = NULL;
  if (k->be->mem->alloc(bytes ? bytes : 1, 0, &p) != APEX_OK) return NULL;
  k->blocks[k->n++] = p;
  return p;
}

static apex_nn_workspace ks_ws(kcall *k) { return (apex_nn_workspace){ks_get, k}; }

/* n f32 of scratch, or NULL after a message. */
static float *ks_f32(kcall *k, size_t n) { return ks_get(k, n * sizeof(float)); }

/* Frees the call's scratch and passes st through. */
static apex_status ks_end(kcall *k, apex_status st) {
  for (int i = 0; i < k->n; i++) k->be->mem->free(k->blocks[i]);
  k->n = 0;
  return st;
}

/* Sets k to the backend of the call's device: that of its first tensor off the CPU, else the CPU's, so
 * that need() names a host tensor among device ones (it checks every tensor against it); APEX_OK with no
 * backend when all are NULL (need() names the first required one). */
static apex_status k_begin(kcall *k, const char *fn, const apex_tensor *const *ts, int n) {
  *k = (kcall){.fn = fn};
  int any = 0;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (!any || k->dev == APEX_DEVICE_CPU) k->dev = apex_tensor_device(ts[i]);
    any = 1;
  }
  call_dev = k->dev;
  if (!any) return APEX_OK;
  k->be = apex__backend_need(k->dev, fn);
  return k->be ? APEX_OK : apex_last_status();
}

#define BEGIN(k, fn, ...)                                                                           \
  do {                                                                                              \
    const apex_tensor *const on_ts_[] = {__VA_ARGS__};                                              \
    apex_status on_ = k_begin(k, fn, on_ts_, (int)(sizeof on_ts_ / sizeof on_ts_[0]));              \
    if (on_ != APEX_OK) return on_;                                                                 \
  } while (0)

/* APEX_OK when the backend has the slot; APEX_ERR_UNSUPPORTED naming the call and the slot otherwise. */
#define HAVE_SLOT(k, slot) ((k)->be->slot ? APEX_OK : apex__backend_slot_missing((k)->be, (k)->fn, #slot))

/* The kernel's f32 view of t: its data when f32, else a widened copy in scratch (NULL after a message). */
static const float *as_f32(kcall *k, const apex_tensor *t) {
  if (apex_tensor_dtype(t) == APEX_F32) return apex_tensor_data(t);
  size_t n = apex_tensor_numel(t);
  float *f = ks_f32(k, n);
  if (f && n && k->be->mem->convert(f, APEX_F32, apex_tensor_data(t), apex_tensor_dtype(t), n) != APEX_OK) return NULL;
  return f;
}

/* Where a slot writes a gradient that lands in t (NULL: none): t's data when f32, else f32 scratch that
 * land() rounds into t. NULL after a message (*st set). */
static float *grad_out(kcall *k, apex_tensor *t, apex_status *st) {
  if (!t || *st != APEX_OK) return NULL;
  if (apex_tensor_dtype(t) == APEX_F32) return apex_tensor_data(t);
  float *f = ks_f32(k, apex_tensor_numel(t));
  if (!f) *st = apex_last_status();
  return f;
}

/* The slot's f32 gradient g into t when g was scratch (grad_out). */
static apex_status land(kcall *k, apex_tensor *t, const float *g, apex_status st) {
  if (st != APEX_OK || !t || !g || (const void *)g == apex_tensor_data(t) || !apex_tensor_numel(t)) return st;
  return k->be->mem->convert(apex_tensor_data(t), apex_tensor_dtype(t), g, APEX_F32, apex_tensor_numel(t));
}

/* n floats from src to dst, both on the call's device. */
static apex_status dcopy(kcall *k, void *dst, const void *src, size_t n) {
  return n ? k->be->mem->copy(dst, src, n * sizeof(float), APEX_COPY_D2D, 0) : APEX_OK;
}

static apex_nn_buf buf_of(const apex_tensor *t) {
  return t ? (apex_nn_buf){apex_tensor_data(t), apex_tensor_dtype(t)} : (apex_nn_buf){NULL, APEX_F32};
}

/* ---- argument checks shared by the kernels below ------------------------------------------------------- */


static apex_status need(const char *fn, const char *what, const apex_tensor *t) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
  if (apex_tensor_device(t) != call_dev)
    return apex__fail(APEX_ERR_DEVICE, "%s: %s is on the %s while the call runs on %s; every tensor of one call "
                      "must be on the same device", fn, what, apex__device_name(apex_tensor_device(t)),
                      apex__device_name(call_dev));
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
  kcall k;
  BEGIN(&k, fn, x, w, b, y, mean, rstd);
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
  if ((st = need_apart(fn, "y", y, "x", x)) || (st = HAVE_SLOT(&k, nn_row_norm))) return st;
  if (!rows || !cols) return APEX_OK;
  /* the slot writes mean[rows] then rstd[rows] side by side */
  float *stats = ks_f32(&k, 2 * (size_t)rows);
  if (!stats) return ks_end(&k, apex_last_status());
  st = k.be->nn_row_norm(&(apex_nn_row_norm_args){.centre = !rms, .rows = (size_t)rows, .cols = (size_t)cols, .x = buf_of(x),
                                                  .w = buf_of(w), .b = buf_of(rms ? NULL : b), .out = apex_tensor_data(y),
                                                  .out_dtype = xt, .stats = stats, .eps = eps, .ws = ks_ws(&k)});
  if (st == APEX_OK && !rms) st = dcopy(&k, apex_tensor_data(mean), stats, (size_t)rows);
  if (st == APEX_OK) st = dcopy(&k, apex_tensor_data(rstd), stats + rows, (size_t)rows);
  return ks_end(&k, st);
}

apex_status apex_kernel_layer_norm_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                            const apex_tensor *mean, const apex_tensor *rstd, int rms, apex_tensor *dx,
                                            apex_tensor *dw, apex_tensor *db) {
  const char *fn = "apex_kernel_layer_norm_backward";
  kcall k;
  BEGIN(&k, fn, dy, x, w, mean, rstd, dx, dw, db);
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
  if ((st = need_apart(fn, "dx", dx, "dy", dy)) || (st = need_apart(fn, "dx", dx, "x", x)) || (st = HAVE_SLOT(&k, nn_row_norm_bwd)))
    return st;
  size_t R = (size_t)rows, D = (size_t)cols;
  /* a norm without centring has no bias: its gradient is zero */
  if (rms && db && D && (st = k.be->mem->fill(apex_tensor_data(db), apex_tensor_dtype(db), 0.0f, D))) return st;
  if (!D) return APEX_OK;
  if (!R) { /* no rows: the weight's (and bias's) gradient sums nothing */
    if ((st = k.be->mem->fill(apex_tensor_data(dw), apex_tensor_dtype(dw), 0.0f, D)) == APEX_OK && db && !rms)
      st = k.be->mem->fill(apex_tensor_data(db), apex_tensor_dtype(db), 0.0f, D);
    return st;
  }
  float *stats = ks_f32(&k, 2 * R), *wsp = stats ? ks_f32(&k, R * D) : NULL;
  st = wsp ? APEX_OK : apex_last_status();
  if (st == APEX_OK) st = rms ? k.be->mem->fill(stats, APEX_F32, 0.0f, R) : dcopy(&k, stats, apex_tensor_data(mean), R);
  if (st == APEX_OK) st = dcopy(&k, stats + R, apex_tensor_data(rstd), R);
  float *gw = grad_out(&k, dw, &st), *gb = rms ? NULL : grad_out(&k, db, &st);
  /* dy and dx go to the slot as stored (its gradients may be in x's dtype: on a GPU the kernel reads dy and
   * writes dx in bf16 itself); dw and db are f32 there */
  if (st == APEX_OK)
    st = k.be->nn_row_norm_bwd(&(apex_nn_row_norm_bwd_args){
        .centre = !rms, .rows = R, .cols = D, .x = buf_of(x), .w = buf_of(w), .stats = stats, .gout = apex_tensor_data(dy),
        .gout_dtype = xt, .gx = apex_tensor_data(dx), .gx_dtype = xt, .gw = gw, .gb = gb, .workspace = wsp,
        .workspace_bytes = R * D * sizeof(float), .ws = ks_ws(&k)});
  st = land(&k, dw, gw, st);
  if (!rms) st = land(&k, db, gb, st);
  return ks_end(&k, st);
}

/* logits is [rows, classes] and target holds rows class indices in [-1, classes), checked here where
 * the targets are host memory (the CPU's); on a device, where reading them would wait for it, an index
 * outside gives a NaN loss (the slot's contract). */
static apex_status xent_args(kcall *k, const apex_tensor *logits, const int64_t *target, float smoothing, int64_t *rows,
                             int64_t *cols) {
  const char *fn = k->fn;
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
  if (k->dev == APEX_DEVICE_CPU)
    for (int64_t r = 0; r < *rows; r++)
      if (target[r] < -1 || target[r] >= *cols)
        return apex__fail(APEX_ERR_INVALID_ARG, "%s: target %lld of row %lld is outside [-1, %lld)", fn, (long long)target[r],
                          (long long)r, (long long)*cols);
  return HAVE_SLOT(k, nn_cross_entropy);
}

apex_status apex_kernel_cross_entropy_forward(const apex_tensor *logits, const int64_t *target, float label_smoothing,
                                              apex_tensor *loss, apex_tensor *stats) {
  const char *fn = "apex_kernel_cross_entropy_forward";
  kcall k;
  BEGIN(&k, fn, logits, loss, stats);
  int64_t rows = 0, cols = 0;
  apex_status st = xent_args(&k, logits, target, label_smoothing, &rows, &cols);
  if (st || (st = need_numel(fn, "loss", loss, (size_t)rows)) || (st = need_dtype(fn, "loss", loss, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "stats", stats, 2 * (size_t)rows)) || (st = need_dtype(fn, "stats", stats, APEX_F32, APEX_F32)))
    return st;
  if (!rows) return APEX_OK;
  st = k.be->nn_cross_entropy(&(apex_nn_cross_entropy_args){
      .rows = (size_t)rows, .classes = (size_t)cols, .x = buf_of(logits), .target = target, .smoothing = label_smoothing,
      .stats = apex_tensor_data(stats), .loss = apex_tensor_data(loss), .ws = ks_ws(&k)});
  return ks_end(&k, st);
}

apex_status apex_kernel_cross_entropy_backward(const apex_tensor *dloss, const apex_tensor *logits, const int64_t *target,
                                               const apex_tensor *stats, float label_smoothing, apex_tensor *dlogits) {
  const char *fn = "apex_kernel_cross_entropy_backward";
  kcall k;
  BEGIN(&k, fn, dloss, logits, stats, dlogits);
  int64_t rows = 0, cols = 0;
  apex_status st = xent_args(&k, logits, target, label_smoothing, &rows, &cols);
  if (st || (st = need_numel(fn, "dloss", dloss, (size_t)rows)) || (st = need_dtype(fn, "dloss", dloss, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "stats", stats, 2 * (size_t)rows)) || (st = need_dtype(fn, "stats", stats, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "dlogits", dlogits, apex_tensor_numel(logits))) ||
      (st = need_dtype(fn, "dlogits", dlogits, apex_tensor_dtype(logits), apex_tensor_dtype(logits))) ||
      (st = HAVE_SLOT(&k, nn_cross_entropy_bwd)))
    return st;
  if (!rows || !cols) return APEX_OK;
  apex_dtype lt = apex_tensor_dtype(logits);
  size_t R = (size_t)rows, C = (size_t)cols, es = apex_dtype_size(lt);
  const char *x = apex_tensor_data(logits);
  char *out = apex_tensor_data(dlogits);
  const float *sv = apex_tensor_data(stats), *go = apex_tensor_data(dloss);
  /* An f32 dlogits apart from the logits takes the slot's gradient directly. Otherwise (half logits,
   * or dlogits the logits themselves, which the slot may clear before reading) the gradient goes through
   * f32 scratch a block of rows at a time, each block rounded into dlogits after the slot read its rows:
   * the scratch stays at XENT_BLOCK floats however large the vocabulary and batch. */
  enum { XENT_BLOCK = 1 << 24 };
  int direct = lt == APEX_F32 && !overlaps(dlogits, logits);
  size_t per = direct ? R : (XENT_BLOCK / C ? XENT_BLOCK / C : 1);
  float *scratch = direct ? NULL : ks_f32(&k, (per < R ? per : R) * C);
  if (!direct && !scratch) return ks_end(&k, apex_last_status());
  for (size_t r0 = 0; r0 < R && st == APEX_OK; r0 += per) {
    size_t nr = R - r0 < per ? R - r0 : per;
    float *gx = direct ? (float *)out : scratch;
    st = k.be->nn_cross_entropy_bwd(&(apex_nn_cross_entropy_bwd_args){
        .rows = nr, .classes = C, .x = {x + r0 * C * es, lt}, .stats = sv + 2 * r0, .target = target + r0, .smoothing = label_smoothing,
        .reduction = APEX_NN_NONE, .gout = go + r0, .gx = gx, .ws = ks_ws(&k)});
    if (st == APEX_OK && !direct) st = k.be->mem->convert(out + r0 * C * es, lt, scratch, APEX_F32, nr * C);
  }
  return ks_end(&k, st);
}

apex_status apex_kernel_batch_norm_stats(const apex_tensor *x, apex_tensor *mean, apex_tensor *var, apex_tensor *m2) {
  const char *fn = "apex_kernel_batch_norm_stats";
  kcall k;
  BEGIN(&k, fn, x, mean, var, m2);
  apex_status st = need(fn, "x", x);
  if (st != APEX_OK) return st;
  if (apex_tensor_ndim(x) < 2) return apex__fail(APEX_ERR_SHAPE, "%s: x needs at least [N, C]", fn);
  int64_t n = apex_tensor_dim(x, 0), c = apex_tensor_dim(x, 1);
  int64_t hw = n > 0 && c > 0 ? (int64_t)apex_tensor_numel(x) / (n * c) : 0;
  if ((st = need_numel(fn, "mean", mean, (size_t)c)) || (st = need_dtype(fn, "mean", mean, APEX_F32, APEX_F32)) ||
      (st = need_numel(fn, "var", var, (size_t)c)) || (st = need_dtype(fn, "var", var, APEX_F32, APEX_F32)) ||
      (m2 && ((st = need_numel(fn, "m2", m2, (size_t)c)) || (st = need_dtype(fn, "m2", m2, APEX_F32, APEX_F32)))))
    return st;
  if ((st = HAVE_SLOT(&k, nn_batch_norm))) return st;
  if (!c) return APEX_OK;
  /* the slot's statistics-only mode: the mean in the first half of its stats */
  float *stats = ks_f32(&k, 2 * (size_t)c);
  st = stats ? APEX_OK : apex_last_status();
  if (st == APEX_OK)
    st = k.be->nn_batch_norm(&(apex_nn_batch_norm_args){.N = (size_t)n, .C = (size_t)c, .S = (size_t)hw, .x = buf_of(x), .stats = stats,
                                                        .training = 1, .ws = ks_ws(&k), .batch_var = apex_tensor_data(var),
                                                        .batch_m2 = m2 ? apex_tensor_data(m2) : NULL});
  if (st == APEX_OK) st = dcopy(&k, apex_tensor_data(mean), stats, (size_t)c);
  return ks_end(&k, st);
}

apex_status apex_kernel_matmul(const apex_tensor *a, int trans_a, const apex_tensor *b, int trans_b, apex_tensor *c,
                               float alpha, float beta, const apex_tensor *bias, int gelu) {
  const char *fn = "apex_kernel_matmul";
  kcall k;
  BEGIN(&k, fn, a, b, c, bias);
  apex_status st;
  if ((st = need(fn, "a", a)) || (st = need(fn, "b", b)) || (st = need(fn, "c", c))) return st;
  if (apex_tensor_ndim(a) != 2 || apex_tensor_ndim(b) != 2 || apex_tensor_ndim(c) != 2)
    return apex__fail(APEX_ERR_SHAPE, "%s: a, b and c must be 2-d", fn);
  int64_t m = apex_tensor_dim(a, trans_a ? 1 : 0), kk = apex_tensor_dim(a, trans_a ? 0 : 1);
  int64_t kb = apex_tensor_dim(b, trans_b ? 1 : 0), n = apex_tensor_dim(b, trans_b ? 0 : 1);
  if (kk != kb || apex_tensor_dim(c, 0) != m || apex_tensor_dim(c, 1) != n) {
    char sa[64], sb[64], sc[64];
    return apex__fail(APEX_ERR_SHAPE, "%s: op(a) %s%s times op(b) %s%s does not give c %s", fn,
                      apex_tensor_shape_str(a, sa, sizeof sa), trans_a ? "^T" : "", apex_tensor_shape_str(b, sb, sizeof sb),
                      trans_b ? "^T" : "", apex_tensor_shape_str(c, sc, sizeof sc));
  }
  apex_dtype it = apex_tensor_dtype(a), ct = apex_tensor_dtype(c);
  if ((st = need_dtype(fn, "b", b, it, it)) || (st = need_dtype(fn, "c", c, APEX_F32, it)) ||
      (bias && ((st = need_numel(fn, "bias", bias, (size_t)n)) || (st = need_dtype(fn, "bias", bias, ct, ct)))))
    return st;
  if ((st = need_apart(fn, "c", c, "a", a)) || (st = need_apart(fn, "c", c, "b", b)) || (st = HAVE_SLOT(&k, nn_matmul))) return st;
  if (!m || !n) return APEX_OK;
  if (m > INT32_MAX || n > INT32_MAX || kk > INT32_MAX)
    return apex__fail(APEX_ERR_SHAPE, "%s: a product of %lld x %lld x %lld is past the int range of the products", fn, (long long)m,
                      (long long)n, (long long)kk);
  const apex_nn_gemm_ext ext = {.trans_a = trans_a != 0, .trans_b = trans_b != 0, .alpha = alpha, .beta = beta, .bias = buf_of(bias),
                                .gelu = gelu != 0};
  st = k.be->nn_matmul(&(apex_nn_matmul_args){.batch = 1, .m = (int)m, .n = (int)n, .k = (int)kk, .a = buf_of(a), .b = buf_of(b),
                                               .out = apex_tensor_data(c), .out_dtype = ct, .ws = ks_ws(&k), .ext = &ext});
  return ks_end(&k, st);
}

/* ---- convolution ----------------------------------------------------------------------------------------- */

/* The geometry of a convolution of x by w (both checked to be 4-d tensors of one float dtype, on the
 * call's device). */
static apex_status conv_geometry(const char *fn, const apex_tensor *x, const apex_tensor *w, const apex_conv2d_options *o,
                                 apex_nn_conv_geom *g) {
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
    if (d[i] > INT32_MAX) return apex__fail(APEX_ERR_SHAPE, "%s: x %s or w %s has a dimension past the int range", fn, xs, ws);
  *g = (apex_nn_conv_geom){.n = (int)d[0], .c = (int)d[1], .h = (int)d[2], .w = (int)d[3], .o = (int)d[4], .kh = (int)d[5],
                           .kw = (int)d[6], .ph = o->pad_h, .pw = o->pad_w, .sh = o->stride_h ? o->stride_h : 1,
                           .sw = o->stride_w ? o->stride_w : 1};
  int64_t hp = d[2] + 2 * (int64_t)g->ph - d[5], wp = d[3] + 2 * (int64_t)g->pw - d[6];
  if (hp < 0 || wp < 0)
    return apex__fail(APEX_ERR_SHAPE, "%s: the kernel of w %s is larger than x %s with padding (%d, %d)", fn, ws, xs, g->ph, g->pw);
  g->ho = (int)(hp / g->sh + 1);
  g->wo = (int)(wp / g->sw + 1);
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
  kcall k;
  BEGIN(&k, fn, x, w, b, y);
  apex_nn_conv_geom g;
  apex_status st = conv_geometry(fn, x, w, opts, &g);
  if (st) return st;
  apex_dtype dt = apex_tensor_dtype(x);
  if ((st = need_shape4(fn, "y", y, g.n, g.o, g.ho, g.wo)) || (st = need_dtype(fn, "y", y, dt, dt)) ||
      (b && ((st = need_numel(fn, "b", b, (size_t)g.o)) || (st = need_dtype(fn, "b", b, APEX_F32, dt)))) ||
      (st = need_apart(fn, "y", y, "x", x)) || (st = HAVE_SLOT(&k, nn_conv2d)))
    return st;
  if (!apex_tensor_numel(y)) return APEX_OK;
  st = k.be->nn_conv2d(&(apex_nn_conv2d_args){.geom = g, .x = buf_of(x), .w = buf_of(w), .bias = buf_of(b), .out = apex_tensor_data(y),
                                              .out_dtype = dt, .ws = ks_ws(&k)});
  return ks_end(&k, st);
}

apex_status apex_kernel_conv2d_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                        const apex_conv2d_options *opts, apex_tensor *dx, apex_tensor *dw, apex_tensor *db) {
  const char *fn = "apex_kernel_conv2d_backward";
  kcall k;
  BEGIN(&k, fn, dy, x, w, dx, dw, db);
  apex_nn_conv_geom g;
  apex_status st = conv_geometry(fn, x, w, opts, &g);
  if (st) return st;
  apex_dtype dt = apex_tensor_dtype(x);
  if ((st = need_shape4(fn, "dy", dy, g.n, g.o, g.ho, g.wo)) || (st = need_dtype(fn, "dy", dy, dt, dt)) ||
      (dx && ((st = need_shape4(fn, "dx", dx, g.n, g.c, g.h, g.w)) || (st = need_dtype(fn, "dx", dx, dt, dt)))) ||
      (dw && ((st = need_shape4(fn, "dw", dw, g.o, g.c, g.kh, g.kw)) || (st = need_dtype(fn, "dw", dw, dt, dt)))) ||
      (db && ((st = need_numel(fn, "db", db, (size_t)g.o)) || (st = need_dtype(fn, "db", db, APEX_F32, dt)))) ||
      (st = HAVE_SLOT(&k, nn_conv2d_bwd)))
    return st;
  /* with no output position every gradient is a sum of nothing */
  if (!apex_tensor_numel(dy)) {
    apex_tensor *z[3] = {dx, dw, db};
    for (int i = 0; i < 3 && st == APEX_OK; i++)
      if (z[i] && apex_tensor_numel(z[i])) st = k.be->mem->fill(apex_tensor_data(z[i]), apex_tensor_dtype(z[i]), 0.0f, apex_tensor_numel(z[i]));
    return st;
  }
  const float *go = as_f32(&k, dy);
  st = go ? APEX_OK : apex_last_status();
  float *gx = grad_out(&k, dx, &st), *gw = grad_out(&k, dw, &st), *gb = grad_out(&k, db, &st);
  if (st == APEX_OK)
    st = k.be->nn_conv2d_bwd(&(apex_nn_conv2d_bwd_args){.geom = g, .x = buf_of(x), .w = buf_of(w), .gout = go, .gx = gx, .gw = gw,
                                                        .gb = gb, .ws = ks_ws(&k)});
  st = land(&k, dx, gx, st);
  st = land(&k, dw, gw, st);
  return ks_end(&k, land(&k, db, gb, st));
}

/* ---- embedding ------------------------------------------------------------------------------------------- */

/* table (or dtable) is a [V, D] tensor on the call's device and ids[0..n) are in [0, V). */
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
  kcall k;
  BEGIN(&k, fn, table, y);
  apex_status st = embedding_args(fn, "table", table, ids, n);
  if (st != APEX_OK) return st;
  int64_t v = apex_tensor_dim(table, 0), d = apex_tensor_dim(table, 1);
  apex_dtype tt = apex_tensor_dtype(table);
  (void)v;
  if ((st = need_numel(fn, "y", y, (size_t)(n * d))) || (st = need_dtype(fn, "y", y, tt, tt)) ||
      (st = need_apart(fn, "y", y, "table", table)) || (st = HAVE_SLOT(&k, nn_embedding)))
    return st;
  if (!n || !d) return APEX_OK;
  return k.be->nn_embedding(&(apex_nn_embedding_args){.n = (size_t)n, .dim = (size_t)d, .ids = ids, .w = apex_tensor_data(table),
                                                      .dtype = tt, .out = apex_tensor_data(y)});
}

apex_status apex_kernel_embedding_backward(const apex_tensor *dy, const int64_t *ids, int64_t n, apex_tensor *dtable) {
  const char *fn = "apex_kernel_embedding_backward";
  kcall k;
  BEGIN(&k, fn, dy, dtable);
  apex_status st = embedding_args(fn, "dtable", dtable, ids, n);
  if (st != APEX_OK) return st;
  int64_t v = apex_tensor_dim(dtable, 0), d = apex_tensor_dim(dtable, 1);
  if ((st = need_numel(fn, "dy", dy, (size_t)(n * d))) || (st = need_apart(fn, "dtable", dtable, "dy", dy)) ||
      (st = HAVE_SLOT(&k, nn_embedding_bwd)))
    return st;
  if (!v || !d) return APEX_OK;
  float *gw = grad_out(&k, dtable, &st);
  if (st == APEX_OK)
    st = k.be->nn_embedding_bwd(&(apex_nn_embedding_bwd_args){.n = (size_t)n, .dim = (size_t)d, .rows = (size_t)v, .ids = ids,
                                                              .gout = apex_tensor_data(dy), .gout_dtype = apex_tensor_dtype(dy),
                                                              .gw = gw, .ws = ks_ws(&k)});
  return ks_end(&k, land(&k, dtable, gw, st));
}

/* ---- attention ------------------------------------------------------------------------------------------- */

/* x is the tensor [b, t, c] of dtype dt on the call's device. */
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

/* An attention call's geometry: B, T, the heads H and their width D. */
typedef struct attn_geom {
  int64_t b, t, h, d;
  apex_dtype dtype;
} attn_geom;

/* qkv is a [B, T, 3 * C] tensor with C split into n_heads heads, and stats an f32 tensor of
 * B * n_heads * T * 2 elements; fills a with the shapes. */
static apex_status attention_args(const char *fn, const apex_tensor *qkv, int n_heads, const apex_tensor *stats, attn_geom *a) {
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
  *a = (attn_geom){.b = apex_tensor_dim(qkv, 0), .t = apex_tensor_dim(qkv, 1), .h = n_heads, .d = c / n_heads,
                   .dtype = apex_tensor_dtype(qkv)};
  if (a->t > INT32_MAX || a->d > INT32_MAX)
    return apex__fail(APEX_ERR_SHAPE, "%s: qkv %s has a sequence or head width past the int range", fn, buf);
  if ((st = need_numel(fn, "stats", stats, (size_t)(a->b * a->h * a->t * 2))) ||
      (st = need_dtype(fn, "stats", stats, APEX_F32, APEX_F32)))
    return st;
  return APEX_OK;
}

apex_status apex_kernel_attention_forward(const apex_tensor *qkv, int n_heads, apex_tensor *y, apex_tensor *stats) {
  const char *fn = "apex_kernel_attention_forward";
  kcall k;
  BEGIN(&k, fn, qkv, y, stats);
  attn_geom a;
  apex_status st = attention_args(fn, qkv, n_heads, stats, &a);
  if (st || (st = need_btc(fn, "y", y, a.b, a.t, a.h * a.d, a.dtype)) || (st = need_apart(fn, "y", y, "qkv", qkv)) ||
      (st = HAVE_SLOT(&k, nn_attention)))
    return st;
  if (a.b * a.t == 0) return APEX_OK; /* no positions: y and stats are empty */
  /* q, k and v are the thirds of each row of qkv, read in place */
  size_t C = (size_t)(a.h * a.d), es = apex_dtype_size(a.dtype);
  const char *q = apex_tensor_data(qkv);
  st = k.be->nn_attention(&(apex_nn_attention_args){
      .batch = (size_t)a.b, .heads = (int)a.h, .t = (int)a.t, .d = (int)a.d, .q = {q, a.dtype}, .k = {q + C * es, a.dtype},
      .v = {q + 2 * C * es, a.dtype}, .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C, .ld_out = C, .stats = apex_tensor_data(stats),
      .out = apex_tensor_data(y), .out_dtype = a.dtype, .ws = ks_ws(&k)});
  return ks_end(&k, st);
}

apex_status apex_kernel_attention_backward(const apex_tensor *dy, const apex_tensor *qkv, const apex_tensor *y,
                                           const apex_tensor *stats, int n_heads, apex_tensor *dqkv) {
  const char *fn = "apex_kernel_attention_backward";
  kcall k;
  BEGIN(&k, fn, dy, qkv, y, stats, dqkv);
  attn_geom a;
  apex_status st = attention_args(fn, qkv, n_heads, stats, &a);
  if (st || (st = need_btc(fn, "dy", dy, a.b, a.t, a.h * a.d, a.dtype)) ||
      (st = need_btc(fn, "y", y, a.b, a.t, a.h * a.d, a.dtype)) ||
      (st = need_btc(fn, "dqkv", dqkv, a.b, a.t, 3 * a.h * a.d, a.dtype)) || (st = need_apart(fn, "dqkv", dqkv, "qkv", qkv)) ||
      (st = need_apart(fn, "dqkv", dqkv, "dy", dy)) || (st = need_apart(fn, "dqkv", dqkv, "y", y)) ||
      (st = HAVE_SLOT(&k, nn_attention_bwd)))
    return st;
  if (a.b * a.t == 0) return APEX_OK;
  size_t C = (size_t)(a.h * a.d), es = apex_dtype_size(a.dtype);
  const char *q = apex_tensor_data(qkv);
  /* dy and dqkv go to the slot as stored, the gradients of q, k and v the thirds of each row of dqkv (a
   * fused GPU backward reads dO and writes them in the inputs' dtype itself) */
  char *g = apex_tensor_data(dqkv);
  st = k.be->nn_attention_bwd(&(apex_nn_attention_bwd_args){
      .batch = (size_t)a.b, .heads = (int)a.h, .t = (int)a.t, .d = (int)a.d, .q = {q, a.dtype}, .k = {q + C * es, a.dtype},
      .v = {q + 2 * C * es, a.dtype}, .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C, .out = apex_tensor_data(y), .out_dtype = a.dtype,
      .ld_out = C, .stats = apex_tensor_data(stats), .gout = apex_tensor_data(dy), .gout_dtype = a.dtype, .ld_gout = C, .gq = g,
      .gk = g + C * es, .gv = g + 2 * C * es, .gq_dtype = a.dtype, .gk_dtype = a.dtype, .gv_dtype = a.dtype, .ld_gq = 3 * C,
      .ld_gk = 3 * C, .ld_gv = 3 * C, .ws = ks_ws(&k)});
  return ks_end(&k, st);
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

typedef enum ew_op { EW_ADD, EW_MUL, EW_SCALE, EW_RELU, EW_RELU_BWD, EW_GELU, EW_GELU_BWD } ew_op;

/* The flat plan of two operands of n elements each, neither broadcast (nn_binary's walk). */
static apex_nn_bcast flat_plan(size_t n) {
  apex_nn_bcast p = {.nd = 1, .rows = 1, .len = n};
  p.shape[0] = (int64_t)n;
  p.st[0][0] = p.st[1][0] = 1;
  return p;
}

/* A backward's gradient gx = gout * f'(x) (overwritten) into dx in its own dtype: gout is dy widened to
 * f32, and ReLU's mask comes from its output, recomputed from x (the slot reads y, non-zero exactly
 * where x > 0). */
static apex_status unary_bwd(kcall *k, apex_nn_unary_kind kind, const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx,
                             size_t n) {
  apex_status st = HAVE_SLOT(k, nn_unary_bwd);
  if (st == APEX_OK && kind == APEX_NN_RELU) st = HAVE_SLOT(k, nn_unary);
  if (st != APEX_OK) return st;
  const float *go = as_f32(k, dy);
  st = go ? APEX_OK : apex_last_status();
  void *y = NULL;
  if (st == APEX_OK && kind == APEX_NN_RELU) {
    y = ks_get(k, n * apex_dtype_size(apex_tensor_dtype(x)));
    st = y ? k->be->nn_unary(&(apex_nn_unary_args){.kind = APEX_NN_RELU, .n = n, .x = buf_of(x), .out = y,
                                                   .out_dtype = apex_tensor_dtype(x), .ws = ks_ws(k)})
           : apex_last_status();
  }
  /* An f32 dx that is dy itself takes f32 scratch that land() copies into it, as cross entropy's dlogits does:
   * the slot may clear gx before it reads gout (the CPU's does). */
  float *gx = st == APEX_OK && (const void *)go == apex_tensor_data(dx) ? ks_f32(k, n) : grad_out(k, dx, &st);
  if (st == APEX_OK && !gx) st = apex_last_status();
  if (st == APEX_OK)
    st = k->be->nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = kind, .n = n, .x = buf_of(x), .y = y, .y_dtype = apex_tensor_dtype(x),
                                                       .gout = go, .gx = gx, .ws = ks_ws(k)});
  return land(k, dx, gx, st);
}

/* The checks every elementwise call shares, then the slot: a, b (when bname is set; NULL is then an
 * error) and y are tensors of the call's device with a's element count (any shapes, any dtypes), and y
 * is an input or apart from it. */
static apex_status elementwise(const char *fn, ew_op op, const char *aname, const apex_tensor *a, const char *bname,
                               const apex_tensor *b, float alpha, const char *yname, apex_tensor *y) {
  kcall k;
  BEGIN(&k, fn, a, b, y);
  apex_status st = need(fn, aname, a);
  if (st != APEX_OK) return st;
  size_t n = apex_tensor_numel(a);
  if ((bname && (st = need_numel(fn, bname, b, n))) || (st = need_numel(fn, yname, y, n)) ||
      (st = need_in_place_or_apart(fn, yname, y, aname, a)) ||
      (bname && (st = need_in_place_or_apart(fn, yname, y, bname, b))))
    return st;
  void *out = apex_tensor_data(y);
  apex_dtype ot = apex_tensor_dtype(y);
  switch (op) {
  case EW_ADD:
  case EW_MUL: {
    if ((st = HAVE_SLOT(&k, nn_binary)) || !n) return st;
    apex_nn_bcast plan = flat_plan(n);
    st = k.be->nn_binary(&(apex_nn_binary_args){.kind = op == EW_ADD ? APEX_NN_ADD : APEX_NN_MUL, .plan = &plan, .a = buf_of(a),
                                                .b = buf_of(b), .numel_a = n, .numel_b = n, .out = out, .out_dtype = ot,
                                                .ws = ks_ws(&k)});
    break;
  }
  case EW_SCALE:
    if ((st = HAVE_SLOT(&k, nn_scale)) || !n) return st;
    st = k.be->nn_scale(&(apex_nn_scale_args){.n = n, .x = buf_of(a), .out = out, .out_dtype = ot, .s = alpha, .ws = ks_ws(&k)});
    break;
  case EW_RELU:
  case EW_GELU:
    if ((st = HAVE_SLOT(&k, nn_unary)) || !n) return st;
    st = k.be->nn_unary(&(apex_nn_unary_args){.kind = op == EW_RELU ? APEX_NN_RELU : APEX_NN_GELU_TANH, .n = n, .x = buf_of(a), .out = out,
                                              .out_dtype = ot, .ws = ks_ws(&k)});
    break;
  case EW_RELU_BWD:
  case EW_GELU_BWD:
    if (!n) return APEX_OK;
    st = unary_bwd(&k, op == EW_RELU_BWD ? APEX_NN_RELU : APEX_NN_GELU_TANH, a, b, y, n);
    break;
  }
  return ks_end(&k, st);
}

apex_status apex_kernel_add(const apex_tensor *a, const apex_tensor *b, apex_tensor *y) {
  return elementwise("apex_kernel_add", EW_ADD, "a", a, "b", b, 0.0f, "y", y);
}

apex_status apex_kernel_mul(const apex_tensor *a, const apex_tensor *b, apex_tensor *y) {
  return elementwise("apex_kernel_mul", EW_MUL, "a", a, "b", b, 0.0f, "y", y);
}

apex_status apex_kernel_scale(const apex_tensor *x, float alpha, apex_tensor *y) {
  return elementwise("apex_kernel_scale", EW_SCALE, "x", x, NULL, NULL, alpha, "y", y);
}

apex_status apex_kernel_relu_forward(const apex_tensor *x, apex_tensor *y) {
  return elementwise("apex_kernel_relu_forward", EW_RELU, "x", x, NULL, NULL, 0.0f, "y", y);
}

apex_status apex_kernel_relu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx) {
  return elementwise("apex_kernel_relu_backward", EW_RELU_BWD, "dy", dy, "x", x, 0.0f, "dx", dx);
}

apex_status apex_kernel_gelu_forward(const apex_tensor *x, apex_tensor *y) {
  return elementwise("apex_kernel_gelu_forward", EW_GELU, "x", x, NULL, NULL, 0.0f, "y", y);
}

apex_status apex_kernel_gelu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx) {
  return elementwise("apex_kernel_gelu_backward", EW_GELU_BWD, "dy", dy, "x", x, 0.0f, "dx", dx);
}

apex_status apex_kernel_sum_rows(const apex_tensor *x, apex_tensor *y, int accumulate) {
  const char *fn = "apex_kernel_sum_rows";
  kcall k;
  BEGIN(&k, fn, x, y);
  apex_status st;
  if ((st = need(fn, "x", x)) || (st = need(fn, "y", y))) return st;
  size_t n = apex_tensor_numel(x), cols = apex_tensor_numel(y);
  if (cols ? n % cols != 0 : n != 0) {
    char xs[96], ys[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: x %s (%zu elements) is not a whole number of rows of y's %zu columns (y %s)", fn,
                      apex_tensor_shape_str(x, xs, sizeof xs), n, cols, apex_tensor_shape_str(y, ys, sizeof ys));
  }
  if ((st = need_apart(fn, "y", y, "x", x)) || (st = HAVE_SLOT(&k, nn_reduce)) || (accumulate && (st = HAVE_SLOT(&k, nn_binary))))
    return st;
  if (!cols) return APEX_OK;
  apex_dtype yt = apex_tensor_dtype(y);
  /* the column sums in f32 (straight into an f32 y that is overwritten), then added to y or rounded into it */
  int direct = yt == APEX_F32 && !accumulate;
  float *s = direct ? apex_tensor_data(y) : ks_f32(&k, cols);
  if (!s) return ks_end(&k, apex_last_status());
  st = k.be->nn_reduce(&(apex_nn_reduce_args){.kind = APEX_NN_REDUCE_SUM, .outer = 1, .dim = n / cols, .inner = cols, .scale = 1.0,
                                              .x = buf_of(x), .out = s});
  if (st == APEX_OK && accumulate) {
    apex_nn_bcast plan = flat_plan(cols);
    st = k.be->nn_binary(&(apex_nn_binary_args){.kind = APEX_NN_ADD, .plan = &plan, .a = buf_of(y), .b = {s, APEX_F32}, .numel_a = cols,
                                                .numel_b = cols, .out = apex_tensor_data(y), .out_dtype = yt, .ws = ks_ws(&k)});
  } else if (st == APEX_OK && !direct) {
    st = k.be->mem->convert(apex_tensor_data(y), yt, s, APEX_F32, cols);
  }
  return ks_end(&k, st);
}

apex_status apex_kernel_sum_all(const apex_tensor *x, int mean, apex_tensor *y) {
  const char *fn = "apex_kernel_sum_all";
  kcall k;
  BEGIN(&k, fn, x, y);
  apex_status st;
  if ((st = need(fn, "x", x)) || (st = need_numel(fn, "y", y, 1)) || (st = need_dtype(fn, "y", y, APEX_F32, APEX_F32)))
    return st;
  if ((st = need_apart(fn, "y", y, "x", x)) || (st = HAVE_SLOT(&k, nn_reduce))) return st;
  size_t n = apex_tensor_numel(x);
  /* the mean of nothing is 0 * (1 / 0): NaN, as PyTorch's */
  return k.be->nn_reduce(&(apex_nn_reduce_args){.kind = APEX_NN_REDUCE_SUM, .outer = 1, .dim = n, .inner = 1,
                                                .scale = mean ? 1.0 / (double)n : 1.0, .x = buf_of(x), .out = apex_tensor_data(y)});
}
