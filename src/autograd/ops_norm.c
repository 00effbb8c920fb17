/* ops_norm.c: the fronts of batch norm (training and evaluation, running statistics; with a
 * statistics hook, the SyncBatchNorm op), layer norm and RMS norm: autocast, shape and option checks,
 * recording; the kernels are the backend's (backend/args_nn.h; the CPU's in backend/cpu/norm.c). */
#include "autograd/ag.h"

/* ---- batch norm --------------------------------------------------------------------------------- */

/* Both batch norms: the plain op (statistics of this batch, or the running ones in evaluation) and,
 * with a hook, the op whose statistics the hook computes over a larger batch (SyncBatchNorm). They
 * share the checks, the pool scratch of the statistics (aux: mean[C], rstd[C] as used) and the
 * normalisation; the hooked one takes its running-statistic update from the hook's f32 values. */
static apex_var *batch_norm(apex_graph *g, const apex__bn_stats_hook *hook, apex_var *x, apex_var *weight, apex_var *bias,
                            apex_tensor *running_mean, apex_tensor *running_var, const apex_batch_norm_options *opts) {
  static const apex_batch_norm_options defaults = {0};
  if (!opts) opts = &defaults;
  apex_op op = hook ? APEX_OP_SYNC_BATCH_NORM : APEX_OP_BATCH_NORM;
  const char *name = apex_op_name(op);
  if (hook && opts->relu) return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: relu is not fused here; apply apex_relu to the result", name);
  apex_var *in[3] = {x, weight, bias}, *u[3];
  apex_dtype dt;
  /* the fused op casts as batch norm does (and follows any override of batch norm's category) */
  if (apex__dispatch(g, op, 3, in, 6u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value;
  dt = X->dtype; /* the input's type, whatever the parameters' (f32 under keep_batchnorm_fp32) */
  if (X->ndim < 2 || X->ndim > 4)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s must be [N, C], [N, C, L] or [N, C, H, W]", name, apex__shape(x));
  int64_t Ci = X->shape[1];
  size_t N = (size_t)X->shape[0], C = (size_t)Ci, S = X->numel / ag_nz(N * C), M = N * S;
  const apex_tensor *stats[2] = {running_mean, running_var};
  for (int i = 0; i < 3; i++)
    if (i && u[i] && (u[i]->value->ndim != 1 || (size_t)u[i]->value->shape[0] != C))
      return apex__fail_null(APEX_ERR_SHAPE, "%s: %s %s does not match the %zu channels of input %s", name, i == 1 ? "weight" : "bias",
                             apex__shape(in[i]), C, apex__shape(x));
  for (int i = 0; i < 2; i++) {
    if (!stats[i]) continue;
    char buf[64];
    if (apex__on_graph_device(g, stats[i], name, i ? "running_var" : "running_mean") != APEX_OK) return NULL;
    if (stats[i]->dtype != APEX_F32)
      return apex__fail_null(APEX_ERR_DTYPE, "%s: %s is %s; running statistics are f32", name, i ? "running_var" : "running_mean",
                             apex_dtype_name(stats[i]->dtype));
    if (stats[i]->numel != C)
      return apex__fail_null(APEX_ERR_SHAPE, "%s: %s %s does not match the %zu channels of input %s", name, i ? "running_var" : "running_mean",
                             apex_tensor_shape_str(stats[i], buf, sizeof buf), C, apex__shape(x));
  }
  /* The hook always normalises with batch statistics (its count over the whole batch is checked there). */
  int training = hook || opts->training;
  if (!training && (!running_mean || !running_var))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: evaluation of %s needs running_mean and running_var", name, apex__shape(x));
  if (!hook && training && M <= 1)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: training needs more than one value per channel; input %s has %zu", name, apex__shape(x), M);
  float mom = 0.0f, eps = 0.0f;
  if (apex__bn_options(opts, name, &mom, &eps) != APEX_OK) return NULL;
  const apex_backend *be = apex__ag_backend(u[0], op);
  if (!be || !AG_HAS(be, nn_batch_norm, op)) return NULL;
  const float *mf = NULL, *rf = NULL, *vf = NULL;
  int64_t count = (int64_t)M;
  /* the hook writes the statistics into tensors on the graph's device (given to the kernel there,
   * args_nn.h); SyncBatchNorm's stages them through the host (parallel/sync_batch_norm.c) */
  if (hook) {
    apex_tensor *mean = apex__pool_tensor(g, APEX_F32, 1, &Ci), *invstd = apex__pool_tensor(g, APEX_F32, 1, &Ci);
    apex_tensor *uvar = apex__pool_tensor(g, APEX_F32, 1, &Ci);
    if (!mean || !invstd || !uvar) return NULL;
    if (hook->stats(hook->ctx, X, mean, invstd, uvar, eps, &count) != APEX_OK) return NULL;
    mf = ag_data(mean);
    rf = ag_data(invstd);
    vf = ag_data(uvar);
  }
  apex_var *out = apex__result(g, hook ? op : opts->relu ? APEX_OP_BATCH_NORM_RELU : APEX_OP_BATCH_NORM, dt, X->ndim, X->shape, 3, u);
  if (!out) return NULL;
  /* x and the result stay in their dtype (the kernel widens a channel at a time); the parameters are
   * [C], so their f32 views cost nothing */
  const float *wf = u[1] ? apex__f32(g, u[1]->value) : NULL, *bf = u[2] ? apex__f32(g, u[2]->value) : NULL;
  float *st = apex__scratch(g, 2 * C * sizeof(float));
  if (!st || (u[1] && !wf) || (u[2] && !bf)) return NULL;
  float *rm = running_mean ? ag_data(running_mean) : NULL, *rv = running_var ? ag_data(running_var) : NULL;
  out->aux = st;
  out->p.bn.training = training;
  out->p.bn.channels = (int64_t)C;
  out->p.bn.plane = (int64_t)S;
  out->p.bn.count = count;
  if (hook) out->p.bn.hook = *hook;
  if (be->nn_batch_norm(&(apex_nn_batch_norm_args){.N = N, .C = C, .S = S, .x = ag_buf(X), .w = wf, .b = bf,
                                                   .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype, .stats = st,
                                                   .training = training, .relu = opts->relu, .eps = eps, .momentum = mom,
                                                   .running_mean = rm, .running_var = rv, .given_mean = mf, .given_rstd = rf,
                                                   .given_var = vf, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_batch_norm(apex_graph *g, apex_var *x, apex_var *weight, apex_var *bias, apex_tensor *running_mean,
                          apex_tensor *running_var, const apex_batch_norm_options *opts) {
  return batch_norm(g, NULL, x, weight, bias, running_mean, running_var, opts);
}

apex_var *apex__batch_norm_hooked(apex_graph *g, const apex__bn_stats_hook *hook, apex_var *x, apex_var *weight, apex_var *bias,
                                  apex_tensor *running_mean, apex_tensor *running_var, const apex_batch_norm_options *opts) {
  if (!hook || !hook->stats || !hook->reduce)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "sync_batch_norm: no statistics hook; the caller must give both of its functions");
  return batch_norm(g, hook, x, weight, bias, running_mean, running_var, opts);
}

/* The fused op's backward masks the gradient per plane into a per-thread workspace (backend/cpu/norm.c). */
apex_status apex__bwd_batch_norm(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_batch_norm_bwd, out->op)) return apex_last_status();
  int fresh;
  float *gx = apex__gbuf_w(g, out->in[0], &fresh), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  size_t C = (size_t)out->p.bn.channels, S = (size_t)out->p.bn.plane, N = ag_numel(out) / ag_nz(C * S);
  int fused = out->op == APEX_OP_BATCH_NORM_RELU;
  const float *wf = out->in[1] ? apex__f32(g, out->in[1]->value) : NULL;
  const float *bf = fused && out->in[2] ? apex__f32(g, out->in[2]->value) : NULL;
  if ((out->in[1] && !wf) || (fused && out->in[2] && !bf)) return APEX_ERR_OUT_OF_MEMORY;
  return be->nn_batch_norm_bwd(&(apex_nn_batch_norm_bwd_args){
      .N = N, .C = C, .S = S, .x = ag_buf(out->in[0]->value), .w = wf, .b = bf, .y = apex_tensor_data(out->value), .y_dtype = out->value->dtype,
      .stats = out->aux, .training = out->p.bn.training, .relu = fused, .gout = out->gbuf, .gx = gx, .gw = gw, .gb = gb,
      .accumulate_x = !fresh, .accumulate_w = 1, .accumulate_b = 1, .ws = apex__ag_workspace(g)});
}

/* The hooked op's backward: per-channel sums of dy and dy * xhat over this process's batch (f64, in
 * order), added to the weight and bias gradients as this process's share (data parallelism sums or
 * averages the shares), then reduced by the hook to the whole batch's sums, from which the input's
 * gradient follows as for one big batch of p.bn.count values per channel. */
apex_status apex__bwd_sync_batch_norm(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_batch_norm_sums, out->op) || !AG_HAS(be, nn_batch_norm_dx, out->op)) return apex_last_status();
  float *gx = apex__gbuf(g, out->in[0]), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  size_t C = (size_t)out->p.bn.channels, S = (size_t)out->p.bn.plane, N = ag_numel(out) / ag_nz(C * S);
  const apex__bn_stats_hook *hook = &out->p.bn.hook;
  const float *wf = out->in[1] ? apex__f32(g, out->in[1]->value) : NULL;
  const float *mf = out->aux, *rf = mf + C, *go = out->gbuf;
  apex_nn_buf xb = ag_buf(out->in[0]->value);
  int64_t two_c = (int64_t)(2 * C);
  apex_tensor *sums = apex__pool_tensor(g, APEX_F32, 1, &two_c);
  if ((out->in[1] && !wf) || !sums) return APEX_ERR_OUT_OF_MEMORY;
  apex_status st = be->nn_batch_norm_sums(&(apex_nn_batch_norm_sums_args){.N = N, .C = C, .S = S, .x = xb, .mean = mf, .rstd = rf,
                                                                          .gout = go, .sums = ag_data(sums), .gw = gw, .gb = gb,
                                                                          .accumulate_w = 1, .accumulate_b = 1,
                                                                          .ws = apex__ag_workspace(g)});
  if (st != APEX_OK || !gx) return st; /* no gx: the input needs no gradient in any process (the same graph everywhere) */
  if ((st = hook->reduce(hook->ctx, sums)) != APEX_OK) return st;
  return be->nn_batch_norm_dx(&(apex_nn_batch_norm_dx_args){.N = N, .C = C, .S = S, .x = xb, .w = wf, .mean = mf, .rstd = rf,
                                                            .gout = go, .sums = ag_data(sums), .count = out->p.bn.count, .gx = gx,
                                                            .accumulate_x = 1, .ws = apex__ag_workspace(g)});
}

/* ---- layer norm and RMS norm -------------------------------------------------------------------- */

/* 1 when t has shape [ns...] (nn dims). */
static int has_shape(const apex_tensor *t, int nn, const int64_t *ns) {
  if (t->ndim != nn) return 0;
  for (int i = 0; i < nn; i++)
    if (t->shape[i] != ns[i]) return 0;
  return 1;
}

/* One op for both: layer norm centres and has a bias; RMS norm does neither. Each row is the last
 * nn dimensions of x flattened (PyTorch's normalized_shape), so weight and bias, of that shape and
 * contiguous, index the row as a flat [D]; ns NULL means x's own last nn dimensions. */
static apex_var *row_norm(apex_graph *g, apex_op op, apex_var *x, int nn, const int64_t *ns, apex_var *weight, apex_var *bias, float eps,
                          const apex_var *add_a, const apex_var *add_b) {
  apex_var *in[3] = {x, weight, bias}, *u[3];
  apex_dtype dt;
  const char *name = apex_op_name(op);
  int n_in = op == APEX_OP_LAYER_NORM ? 3 : 2;
  if (apex__dispatch(g, op, n_in, in, 6u, u, &dt) != APEX_OK) return NULL;
  if (n_in == 2) u[2] = NULL;
  const apex_tensor *X = u[0]->value;
  if (nn < 1 || nn > X->ndim)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: normalized_shape of %d dimensions for input %s (need 1 to %d)", name, nn, apex__shape(x), X->ndim);
  const int64_t *tail = X->shape + X->ndim - nn;
  if (!ns) ns = tail;
  if (memcmp(ns, tail, (size_t)nn * sizeof *ns))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: normalized_shape %s does not match the last %d dimensions of input %s", name,
                           apex__shape_of(nn, ns), nn, apex__shape(x));
  size_t D = 1;
  for (int i = 0; i < nn; i++) D *= (size_t)ns[i];
  size_t R = X->numel / ag_nz(D);
  for (int i = 1; i < 3; i++)
    if (u[i] && !has_shape(u[i]->value, nn, ns))
      return apex__fail_null(APEX_ERR_SHAPE, "%s: %s %s does not match normalized_shape %s of input %s", name, i == 1 ? "weight" : "bias",
                             apex__shape(in[i]), apex__shape_of(nn, ns), apex__shape(x));
  if (eps == 0.0f) eps = 1e-5f;
  const apex_backend *be = apex__ag_backend(u[0], op);
  if (!be || !AG_HAS(be, nn_row_norm, op)) return NULL;
  apex_var *out = apex__result(g, op, dt, X->ndim, X->shape, n_in, u);
  if (!out) return NULL;
  float *st = apex__scratch(g, ag_nz(2 * R) * sizeof(float));
  if (!st) return NULL;
  out->aux = st;
  out->p.row_norm.rows = (int64_t)R;
  out->p.row_norm.cols = (int64_t)D;
  /* with add_a, add_b: x is their sum, recorded but not yet computed (apex_add_layer_norm): the kernel
   * writes it into x's value as it normalises it */
  if (be->nn_row_norm(&(apex_nn_row_norm_args){.centre = op == APEX_OP_LAYER_NORM, .rows = R, .cols = D,
                                               .x = add_a ? ag_buf(add_a->value) : ag_buf(X), .w = ag_buf_of(u[1]), .b = ag_buf_of(u[2]),
                                               .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype, .stats = st,
                                               .eps = eps, .x2 = add_b ? ag_buf(add_b->value) : (apex_nn_buf){NULL, APEX_F32},
                                               .xsum = add_a ? apex_tensor_data(X) : NULL, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_layer_norm(apex_graph *g, apex_var *x, apex_var *w, apex_var *b, float eps) {
  return row_norm(g, APEX_OP_LAYER_NORM, x, 1, NULL, w, b, eps, NULL, NULL);
}
apex_var *apex_rms_norm(apex_graph *g, apex_var *x, apex_var *w, float eps) {
  return row_norm(g, APEX_OP_RMS_NORM, x, 1, NULL, w, NULL, eps, NULL, NULL);
}

/* Fused where the sum and the norm read it as the separate ops would: operands of one shape and dtype
 * (no broadcast, no promotion), the norm taking the sum uncast under autocast, weight and bias [D] of
 * the last dimension. Otherwise (and for a NULL argument, so the messages are the ops' own) the two
 * ops run one after the other, with the same results. */
apex_var *apex_add_layer_norm(apex_graph *g, apex_var *x, apex_var *r, apex_var *w, apex_var *b, float eps, apex_var **sum) {
  if (!sum) return apex__fail_null(APEX_ERR_INVALID_ARG, "add_layer_norm: NULL sum (it receives x + r)");
  *sum = NULL;
  const apex_tensor *X = x ? x->value : NULL, *Rt = r ? r->value : NULL;
  int fuse = g && X && Rt && X->ndim >= 1 && apex_tensor_same_shape(X, Rt) && X->dtype == Rt->dtype && X->numel > 0 &&
             apex__dispatch_keeps(g, APEX_OP_LAYER_NORM, x);
  for (int i = 0; fuse && i < 2; i++) {
    const apex_var *p = i ? b : w;
    fuse = p && p->value->ndim == 1 && p->value->shape[0] == X->shape[X->ndim - 1];
  }
  apex_var *s = fuse ? apex__add_unfilled(g, x, r) : apex_add(g, x, r);
  apex_var *y = !s ? NULL : fuse ? row_norm(g, APEX_OP_LAYER_NORM, s, 1, NULL, w, b, eps, x, r) : apex_layer_norm(g, s, w, b, eps);
  if (y) *sum = s;
  return y;
}

/* The _nd forms take normalized_shape explicitly, as PyTorch does, so that a mismatch with x is an
 * error rather than a silently different normalisation. */
static apex_var *row_norm_nd(apex_graph *g, apex_op op, apex_var *x, int nn, const int64_t *ns, apex_var *w, apex_var *b, float eps) {
  if (!ns) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL normalized_shape", apex_op_name(op));
  return row_norm(g, op, x, nn, ns, w, b, eps, NULL, NULL);
}
apex_var *apex_layer_norm_nd(apex_graph *g, apex_var *x, int norm_ndim, const int64_t *normalized_shape, apex_var *w, apex_var *b, float eps) {
  return row_norm_nd(g, APEX_OP_LAYER_NORM, x, norm_ndim, normalized_shape, w, b, eps);
}
apex_var *apex_rms_norm_nd(apex_graph *g, apex_var *x, int norm_ndim, const int64_t *normalized_shape, apex_var *w, float eps) {
  return row_norm_nd(g, APEX_OP_RMS_NORM, x, norm_ndim, normalized_shape, w, NULL, eps);
}

static apex_status row_norm_bwd(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_row_norm_bwd, out->op)) return apex_last_status();
  size_t R = (size_t)out->p.row_norm.rows, D = (size_t)out->p.row_norm.cols;
  int centre = out->op == APEX_OP_LAYER_NORM;
  apex_dtype tx;
  void *gx = apex__gbuf_any(g, out->in[0], &tx);
  float *gw = apex__gbuf(g, out->in[1]), *gb = centre ? apex__gbuf(g, out->in[2]) : NULL;
  size_t ws = gw ? ag_nz(R * D) * sizeof(float) : 0;
  float *gxhat = gw ? apex__scratch_temp(g, ws) : NULL; /* only while the kernel runs */
  if (gw && !gxhat) return APEX_ERR_OUT_OF_MEMORY;
  return be->nn_row_norm_bwd(&(apex_nn_row_norm_bwd_args){.centre = centre, .rows = R, .cols = D, .x = ag_buf(out->in[0]->value),
                                                          .w = ag_buf_of(out->in[1]), .stats = out->aux, .gout = out->gbuf,
                                                          .gout_dtype = out->gdt, .gx = gx, .gx_dtype = tx, .gw = gw, .gb = gb, .accumulate_x = 1, .accumulate_w = 1, .accumulate_b = 1,
                                                          .workspace = gxhat, .workspace_bytes = ws, .ws = apex__ag_workspace(g)});
}

apex_status apex__bwd_layer_norm(apex_graph *g, apex_var *out) { return row_norm_bwd(g, out); }
apex_status apex__bwd_rms_norm(apex_graph *g, apex_var *out) { return row_norm_bwd(g, out); }
