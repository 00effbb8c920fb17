/* ops_loss.c: the fronts of softmax, log-softmax and the losses (cross entropy, MSE, BCE with
 * logits, BCE): autocast, shape and target checks, recording; the kernels are the backend's
 * (backend/args_nn.h; the CPU's in backend/cpu/loss.c).
 *
 * Softmax along any dim sees x as [outer, D, inner]. Its forward keeps its f32 result in the op's
 * scratch for the backward. Cross entropy keeps the logits and two floats a row, and its backward
 * recomputes the softmax (args_nn.h); its targets and reduced value live on the graph's device. A
 * reduced loss's kernel sums its per-element terms in double in a fixed order, never holding them
 * all, and writes the reduced value (over the count for MEAN) where the result is. */
#include <math.h>

#include "autograd/ag.h"

/* ---- softmax / log-softmax ---------------------------------------------------------------------- */

static apex_var *softmax_op(apex_graph *g, apex_op op, apex_var *x, int dim) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  int dd = ag_dim(dim, u->value->ndim);
  if (dd < 0) return apex__fail_null(APEX_ERR_SHAPE, "%s: dim %d is out of range for %s", apex_op_name(op), dim, apex__shape(x));
  const apex_backend *be = apex__ag_backend(u, op);
  if (!be || !AG_HAS(be, nn_softmax, op)) return NULL;
  apex_var *out = apex__result(g, op, dt, u->value->ndim, u->value->shape, 1, &u);
  if (!out) return NULL;
  /* backward reads the f32 result (aux): persistent scratch when the value itself is not f32, which the
   * kernel then rounds into the value line by line */
  int f32 = out->value->dtype == APEX_F32;
  float *o = f32 ? ag_data(out->value) : apex__scratch(g, ag_numel(out) * sizeof(float));
  if (!o) return NULL;
  size_t outer, D, inner;
  ag_lines(u->value, dd, &outer, &D, &inner);
  out->p.softmax.dim = dd;
  out->aux = o;
  if (be->nn_softmax(&(apex_nn_softmax_args){.log = op == APEX_OP_LOG_SOFTMAX, .outer = outer, .dim = D, .inner = inner,
                                              .x = ag_buf(u->value), .out = o, .out_cast = f32 ? NULL : apex_tensor_data(out->value),
                                              .cast_dtype = out->value->dtype, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_softmax(apex_graph *g, apex_var *x, int dim) { return softmax_op(g, APEX_OP_SOFTMAX, x, dim); }
apex_var *apex_log_softmax(apex_graph *g, apex_var *x, int dim) { return softmax_op(g, APEX_OP_LOG_SOFTMAX, x, dim); }

static apex_status softmax_bwd(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_softmax_bwd, out->op)) return apex_last_status();
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  size_t outer, D, inner;
  ag_lines(out->value, out->p.softmax.dim, &outer, &D, &inner);
  return be->nn_softmax_bwd(&(apex_nn_softmax_bwd_args){.log = out->op == APEX_OP_LOG_SOFTMAX, .outer = outer, .dim = D,
                                                        .inner = inner, .y = out->aux, .gout = out->gbuf, .gx = gx,
                                                        .accumulate_x = 1});
}

apex_status apex__bwd_softmax(apex_graph *g, apex_var *out) { return softmax_bwd(g, out); }
apex_status apex__bwd_log_softmax(apex_graph *g, apex_var *out) { return softmax_bwd(g, out); }

/* ---- reduced results ---------------------------------------------------------------------------- */

/* The result var of a loss: 0-d for MEAN and SUM, like `shape` for NONE. */
static apex_var *loss_result(apex_graph *g, apex_op op, apex_dtype dt, apex_reduction red, int ndim, const int64_t *shape,
                             int n, apex_var *const *in) {
  if ((int)red < 0 || red > APEX_REDUCTION_NONE)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: reduction %d is not an apex_reduction", apex_op_name(op), (int)red);
  apex_var *out = red == APEX_REDUCTION_NONE ? apex__result(g, op, dt, ndim, shape, n, in) : apex__result(g, op, dt, 0, NULL, n, in);
  if (out) out->p.loss.reduction = red;
  return out;
}

static apex_nn_reduction nn_reduction(apex_reduction r) {
  return r == APEX_REDUCTION_NONE ? APEX_NN_NONE : r == APEX_REDUCTION_SUM ? APEX_NN_SUM : APEX_NN_MEAN;
}

/* ---- cross entropy ------------------------------------------------------------------------------ */

int64_t *apex__ce_targets(apex_graph *g, const int64_t *targets, const apex_index *ix, size_t N, size_t C,
                          const apex_cross_entropy_options *opts, const char *fn, const apex_var *logits, int64_t *count) {
  if (!targets && !ix && N > 0) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL targets for logits %s", fn, apex__shape(logits));
  float eps = opts->label_smoothing;
  if (!(eps >= 0.0f && eps <= 1.0f))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: label_smoothing %g is outside [0, 1]", fn, eps);
  int64_t n = 0;
  if (ix) {
    if (ix->numel != (int64_t)N)
      return apex__fail_null(APEX_ERR_SHAPE, "%s: an index of %lld targets for logits %s", fn, (long long)ix->numel, apex__shape(logits));
    if (ix->bound > (int64_t)C)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: the index's targets are bounded by %lld, the logits %s have %zu classes", fn,
                             (long long)ix->bound, apex__shape(logits), C);
    if (opts->use_ignore_index)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: an index's targets cannot be ignored (use_ignore_index): the mean's count "
                             "would need a read of the device; give host targets", fn);
    if (ix->mem->device != g->be->device)
      return apex__fail_null(APEX_ERR_DEVICE, "%s: the index is on the %s, the graph on the %s", fn, ix->mem->name, g->mem->name);
    n = (int64_t)N;
  } else {
    for (size_t i = 0; i < N; i++) {
      if (opts->use_ignore_index && targets[i] == opts->ignore_index) continue;
      if (targets[i] < 0 || (size_t)targets[i] >= C)
        return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: target %lld at row %zu is outside [0, %zu) for logits %s", fn,
                               (long long)targets[i], i, C, apex__shape(logits));
      n++;
    }
  }
  /* host targets are made on the host (the caller's array) and copied to the graph's device; an index's
   * are copied on the device */
  int64_t *tg = apex__scratch(g, N * sizeof(int64_t) + 2 * N * sizeof(float));
  if (!tg) return NULL;
  if (ix) {
    if (N && g->mem->copy(tg, ix->data, N * sizeof(int64_t), APEX_COPY_D2D, 0) != APEX_OK) return NULL;
  } else {
    int64_t *host_tg = g->be->device != APEX_DEVICE_CPU ? apex__host_scratch(g, ag_nz(N) * sizeof(int64_t)) : tg;
    if (!host_tg) return NULL;
    for (size_t i = 0; i < N; i++) host_tg[i] = opts->use_ignore_index && targets[i] == opts->ignore_index ? -1 : targets[i];
    if (N && host_tg != tg && g->mem->copy(tg, host_tg, N * sizeof(int64_t), APEX_COPY_H2D, 0) != APEX_OK) return NULL;
  }
  *count = n;
  return tg;
}

/* apex_cross_entropy and apex_cross_entropy_index: targets from the host array or the index (apex__ce_targets). */
static apex_var *cross_entropy_of(apex_graph *g, apex_var *logits, const int64_t *targets, const apex_index *ix,
                                  const apex_cross_entropy_options *opts) {
  static const apex_cross_entropy_options defaults = {0};
  if (!opts) opts = &defaults;
  if (opts->one_pass)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "cross_entropy: one_pass %d is for apex_linear_cross_entropy (whose backward "
                           "reads the gradient it writes); leave it 0", opts->one_pass);
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_CROSS_ENTROPY, 1, &logits, 0, &u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u->value;
  if (X->ndim != 2) return apex__fail_null(APEX_ERR_SHAPE, "cross_entropy: logits %s must be [N, C]", apex__shape(logits));
  size_t N = (size_t)X->shape[0], C = (size_t)X->shape[1];
  /* kept for the backward, on the graph's device: the targets (-1 where ignored), then each row's max
   * and 1 / sum of exp, from which and the logits, read again, the backward recomputes the softmax */
  int64_t nshape = (int64_t)N, count = 0;
  int64_t *tg = apex__ce_targets(g, targets, ix, N, C, opts, ix ? "cross_entropy_index" : "cross_entropy", logits, &count);
  if (!tg) return NULL;
  const apex_backend *be = apex__ag_backend(u, APEX_OP_CROSS_ENTROPY);
  if (!be || !AG_HAS(be, nn_cross_entropy, APEX_OP_CROSS_ENTROPY)) return NULL;
  apex_var *out = loss_result(g, APEX_OP_CROSS_ENTROPY, dt, opts->reduction, 1, &nshape, 1, &u);
  if (!out) return NULL;
  int none = opts->reduction == APEX_REDUCTION_NONE;
  int f32_terms = none && out->value->dtype == APEX_F32;
  float *l = f32_terms ? ag_data(out->value) : apex__scratch_temp(g, ag_nz(N) * sizeof(float));
  if (!l) return NULL;
  float eps = opts->label_smoothing;
  out->aux = tg;
  out->p.loss.rows = (int64_t)N;
  out->p.loss.classes = (int64_t)C;
  out->p.loss.smoothing = eps;
  out->p.loss.count = count;
  /* a reduced loss's value (the sum, over count for MEAN) is written by the kernel on the device */
  if (be->nn_cross_entropy(&(apex_nn_cross_entropy_args){
          .rows = N, .classes = C, .x = ag_buf(X), .target = tg, .smoothing = eps, .stats = (float *)(tg + N), .loss = l,
          .result = none ? NULL : apex_tensor_data(out->value), .result_dtype = out->value->dtype,
          .divisor = opts->reduction == APEX_REDUCTION_MEAN ? (double)count : 1.0, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  if (none && !f32_terms) apex__store(out, l);
  return out;
}

apex_var *apex_cross_entropy(apex_graph *g, apex_var *logits, const int64_t *targets, const apex_cross_entropy_options *opts) {
  return cross_entropy_of(g, logits, targets, NULL, opts);
}

apex_var *apex_cross_entropy_index(apex_graph *g, apex_var *logits, const apex_index *targets, const apex_cross_entropy_options *opts) {
  if (!targets) return apex__fail_null(APEX_ERR_INVALID_ARG, "cross_entropy_index: NULL index");
  return cross_entropy_of(g, logits, NULL, targets, opts);
}

apex_status apex__bwd_cross_entropy(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_CROSS_ENTROPY);
  if (!be || !AG_HAS(be, nn_cross_entropy_bwd, APEX_OP_CROSS_ENTROPY)) return apex_last_status();
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  size_t N = (size_t)out->p.loss.rows, C = (size_t)out->p.loss.classes;
  const int64_t *tg = out->aux;
  return be->nn_cross_entropy_bwd(&(apex_nn_cross_entropy_bwd_args){
      .rows = N, .classes = C, .x = ag_buf(out->in[0]->value), .stats = (const float *)(tg + N), .target = tg,
      .smoothing = out->p.loss.smoothing, .reduction = nn_reduction(out->p.loss.reduction), .count = (double)out->p.loss.count,
      .gout = out->gbuf, .gx = gx, .accumulate_x = 1, .ws = apex__ag_workspace(g)});
}

/* ---- pointwise losses --------------------------------------------------------------------------- */

static apex_nn_pointwise_loss_kind pointwise_kind(apex_op op) {
  return op == APEX_OP_MSE ? APEX_NN_MSE : op == APEX_OP_BCE_WITH_LOGITS ? APEX_NN_BCE_WITH_LOGITS : APEX_NN_BCE;
}

/* Probabilities outside [0, 1] would give a finite, meaningless loss (the clamp turns log of a
 * negative number into -100), so they are refused as PyTorch refuses them. NaN passes: a non-finite
 * forward must reach the loss scaler, which skips the step. Read a block at a time in f32; a block of
 * a device tensor is copied to the host first (the check waits for the device, once a block). */
static apex_status bce_check(const apex_tensor *t, const apex_var *x) {
  enum { BLK = 1024 };
  float blk[BLK];
  uint32_t raw[BLK]; /* a block's raw elements, up to 4 bytes each */
  const char *d = apex_tensor_data(t);
  size_t n = t->numel, es = apex_dtype_size(t->dtype);
  int host = t->device == APEX_DEVICE_CPU;
  for (size_t b = 0; b < n; b += BLK) {
    size_t len = n - b < BLK ? n - b : BLK;
    const void *src = d + b * es;
    if (!host) {
      apex_status st = t->storage->mem->copy(raw, src, len * es, APEX_COPY_D2H, 1);
      if (st != APEX_OK) return st;
      src = raw;
    }
    apex_convert(blk, APEX_F32, src, t->dtype, len);
    for (size_t i = 0; i < len; i++)
      if (blk[i] < 0.0f || blk[i] > 1.0f)
        return apex__fail(APEX_ERR_INVALID_ARG, "bce: input element %zu of %s is %g; probabilities must be in [0, 1] (for logits use "
                          "apex_bce_with_logits)", b + i, apex__shape(x), (double)blk[i]);
  }
  return APEX_OK;
}

static apex_var *pointwise_loss(apex_graph *g, apex_op op, apex_var *x, apex_var *y, apex_reduction red) {
  apex_var *in[2] = {x, y}, *u[2];
  apex_dtype dt;
  if (apex__dispatch(g, op, 2, in, 0, u, &dt) != APEX_OK) return NULL;
  if (!apex_tensor_same_shape(u[0]->value, u[1]->value))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s and target %s must have the same shape", apex_op_name(op), apex__shape(x), apex__shape(y));
  const apex_backend *be = apex__ag_backend(u[0], op);
  if (!be || !AG_HAS(be, nn_pointwise_loss, op)) return NULL;
  size_t n = ag_numel(u[0]);
  if (op == APEX_OP_BCE && bce_check(u[0]->value, x) != APEX_OK) return NULL;
  apex_var *out = loss_result(g, op, dt, red, u[0]->value->ndim, u[0]->value->shape, 2, u);
  if (!out) return NULL;
  /* NONE: the terms straight into the result, rounded once; else their sum (over n for MEAN), written
   * by the kernel where the result is, so that a loss on a GPU is never brought to the host */
  int none = red == APEX_REDUCTION_NONE;
  if (be->nn_pointwise_loss(&(apex_nn_pointwise_loss_args){
          .kind = pointwise_kind(op), .n = n, .x = ag_buf(u[0]->value), .y = ag_buf(u[1]->value),
          .loss = none ? apex_tensor_data(out->value) : NULL, .loss_dtype = out->value->dtype,
          .result = none ? NULL : apex_tensor_data(out->value), .result_dtype = out->value->dtype,
          .divisor = red == APEX_REDUCTION_MEAN ? (double)n : 1.0}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_mse_loss(apex_graph *g, apex_var *x, apex_var *y, apex_reduction r) { return pointwise_loss(g, APEX_OP_MSE, x, y, r); }
apex_var *apex_bce_with_logits(apex_graph *g, apex_var *x, apex_var *y, apex_reduction r) {
  return pointwise_loss(g, APEX_OP_BCE_WITH_LOGITS, x, y, r);
}
apex_var *apex_bce(apex_graph *g, apex_var *p, apex_var *y, apex_reduction r) { return pointwise_loss(g, APEX_OP_BCE, p, y, r); }

apex_status apex__bwd_pointwise_loss(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_pointwise_loss_bwd, out->op)) return apex_last_status();
  float *gx = apex__gbuf(g, out->in[0]), *gy = apex__gbuf(g, out->in[1]);
  size_t n = ag_numel(out->in[0]);
  return be->nn_pointwise_loss_bwd(&(apex_nn_pointwise_loss_bwd_args){
      .kind = pointwise_kind(out->op), .n = n, .x = ag_buf(out->in[0]->value), .y = ag_buf(out->in[1]->value), .reduction = nn_reduction(out->p.loss.reduction),
      .count = (double)n, .gout = out->gbuf, .gx = gx, .gy = gy, .accumulate_x = 1, .accumulate_y = 1});
}
