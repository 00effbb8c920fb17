/* ops_shape.c: the fronts of sum, mean and the L2 norm, reshape, permute/transpose, concat, and
 * embedding lookups: autocast, shape and id checks, recording; the kernels are the backend's
 * (backend/args_nn.h; the CPU's in backend/cpu/shape.c). Reshape is a view and needs none. */
#include "autograd/ag.h"

/* ---- sum / mean / norm -------------------------------------------------------------------------- */

static apex_var *reduce(apex_graph *g, apex_op op, apex_var *x, int all, int dim, int keepdim) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u->value;
  size_t outer = 1, D = X->numel, inner = 1;
  int64_t shape[APEX_MAX_DIMS];
  int nd = 0;
  if (!all) {
    int d = ag_dim(dim, X->ndim);
    if (d < 0) return apex__fail_null(APEX_ERR_SHAPE, "%s: dim %d is out of range for %s", apex_op_name(op), dim, apex__shape(x));
    ag_lines(X, d, &outer, &D, &inner);
    for (int i = 0; i < X->ndim; i++)
      if (i != d || keepdim) shape[nd++] = i == d ? 1 : X->shape[i];
  }
  const apex_backend *be = apex__ag_backend(u, op);
  if (!be || !AG_HAS(be, nn_reduce, op)) return NULL;
  apex_var *out = apex__result(g, op, dt, nd, shape, 1, &u);
  if (!out) return NULL;
  float *o = apex__out_f32(g, out); /* one value a line: the input is read in its own dtype */
  if (!o) return NULL;
  double scale = op == APEX_OP_MEAN ? 1.0 / (double)D : 1.0;
  out->p.reduce.outer = (int64_t)outer;
  out->p.reduce.dim = (int64_t)D;
  out->p.reduce.inner = (int64_t)inner;
  out->p.reduce.scale = (float)scale;
  float *nrm = NULL;
  if (op == APEX_OP_NORM) {
    /* The backward divides by the norms: kept in f32 (aux), not read back from a half result. */
    if (!(nrm = apex__scratch(g, ag_nz(outer * inner) * sizeof(float)))) return NULL;
    out->aux = nrm;
  }
  if (be->nn_reduce(&(apex_nn_reduce_args){.kind = op == APEX_OP_NORM ? APEX_NN_REDUCE_NORM : APEX_NN_REDUCE_SUM, .outer = outer,
                                           .dim = D, .inner = inner, .scale = scale, .x = {apex_tensor_data(X), X->dtype}, .out = o,
                                           .norms = nrm}) != APEX_OK)
    return NULL;
  apex__store(out, o);
  return out;
}

apex_var *apex_sum_all(apex_graph *g, apex_var *x) { return reduce(g, APEX_OP_SUM, x, 1, 0, 0); }
apex_var *apex_mean_all(apex_graph *g, apex_var *x) { return reduce(g, APEX_OP_MEAN, x, 1, 0, 0); }
apex_var *apex_sum(apex_graph *g, apex_var *x, int dim, int keepdim) { return reduce(g, APEX_OP_SUM, x, 0, dim, keepdim); }
apex_var *apex_mean(apex_graph *g, apex_var *x, int dim, int keepdim) { return reduce(g, APEX_OP_MEAN, x, 0, dim, keepdim); }
apex_var *apex_norm_all(apex_graph *g, apex_var *x) { return reduce(g, APEX_OP_NORM, x, 1, 0, 0); }
apex_var *apex_norm(apex_graph *g, apex_var *x, int dim, int keepdim) { return reduce(g, APEX_OP_NORM, x, 0, dim, keepdim); }

/* sum, mean and norm share one backward kernel; norm's reads x and the f32 norms (aux). */
static apex_status reduce_bwd(apex_graph *g, apex_var *out, apex_nn_reduce_kind kind) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_reduce_bwd, out->op)) return apex_last_status();
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  const apex_tensor *X = out->in[0]->value; /* read in its own dtype (norm only) */
  return be->nn_reduce_bwd(&(apex_nn_reduce_bwd_args){.kind = kind, .outer = (size_t)out->p.reduce.outer, .dim = (size_t)out->p.reduce.dim,
                                                      .inner = (size_t)out->p.reduce.inner, .scale = out->p.reduce.scale,
                                                      .x = {kind == APEX_NN_REDUCE_NORM ? apex_tensor_data(X) : NULL, X->dtype},
                                                      .norms = out->aux, .gout = out->gbuf, .gx = gx, .accumulate_x = 1});
}

apex_status apex__bwd_sum(apex_graph *g, apex_var *out) { return reduce_bwd(g, out, APEX_NN_REDUCE_SUM); }
apex_status apex__bwd_norm(apex_graph *g, apex_var *out) { return reduce_bwd(g, out, APEX_NN_REDUCE_NORM); }

/* ---- reshape ------------------------------------------------------------------------------------ */

apex_var *apex_reshape(apex_graph *g, apex_var *x, int ndim, const int64_t *shape) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_RESHAPE, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  if (ndim < 0 || ndim > APEX_MAX_DIMS || (ndim && !shape))
    return apex__fail_null(APEX_ERR_SHAPE, "reshape: %d dimensions asked of %s", ndim, apex__shape(x));
  int64_t s[APEX_MAX_DIMS];
  size_t known = 1;
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    s[i] = shape[i];
    if (s[i] == -1 && infer < 0) infer = i;
    else if (s[i] < 0) return apex__fail_null(APEX_ERR_SHAPE, "reshape: %s to %s: bad size %lld", apex__shape(x), apex__shape_of(ndim, shape), (long long)s[i]);
    else known *= (size_t)s[i];
  }
  size_t n = ag_numel(u);
  if (infer >= 0 && known) s[infer] = (int64_t)(n / known);
  size_t total = 1;
  for (int i = 0; i < ndim; i++) total *= (size_t)s[i];
  if (total != n)
    return apex__fail_null(APEX_ERR_SHAPE, "reshape: %s has %zu elements; %s does not", apex__shape(x), n, apex__shape_of(ndim, shape));
  apex_tensor *v = apex_tensor_view(u->value, ndim, s);
  if (!v || !apex__adopt(g, v)) return NULL;
  return apex__result_value(g, APEX_OP_RESHAPE, v, 1, &u);
}

/* ---- permute ------------------------------------------------------------------------------------ */

/* Input element strides, in the result's dimension order. */
static void permute_strides(const apex_tensor *x, const int *perm, int64_t *st) {
  int64_t in_st[APEX_MAX_DIMS], s = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    in_st[d] = s;
    s *= x->shape[d];
  }
  for (int d = 0; d < x->ndim; d++) st[d] = in_st[perm[d]];
}

apex_var *apex_permute(apex_graph *g, apex_var *x, const int *perm) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_PERMUTE, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  int nd = u->value->ndim, seen = 0;
  if (!perm && nd) return apex__fail_null(APEX_ERR_INVALID_ARG, "permute: NULL perm for %s", apex__shape(x));
  for (int i = 0; i < nd; i++) {
    if (perm[i] < 0 || perm[i] >= nd || (seen >> perm[i] & 1))
      return apex__fail_null(APEX_ERR_SHAPE, "permute: entry %d (%d) of the permutation is out of range or repeated for %s", i, perm[i], apex__shape(x));
    seen |= 1 << perm[i];
  }
  const apex_backend *be = apex__ag_backend(u, APEX_OP_PERMUTE);
  if (!be || !AG_HAS(be, nn_permute, APEX_OP_PERMUTE)) return NULL;
  apex_nn_permute_args a = {.ndim = nd};
  for (int i = 0; i < nd; i++) a.shape[i] = u->value->shape[perm[i]];
  apex_var *out = apex__result(g, APEX_OP_PERMUTE, dt, nd, a.shape, 1, &u);
  if (!out) return NULL;
  memcpy(out->p.permute.perm, perm, (size_t)nd * sizeof *perm);
  permute_strides(u->value, perm, a.strides);
  a.n = ag_numel(out);
  a.x = apex_tensor_data(u->value);
  a.out = apex_tensor_data(out->value);
  a.dtype = out->value->dtype;
  if (be->nn_permute(&a) != APEX_OK) return NULL;
  return out;
}

apex_var *apex_transpose(apex_graph *g, apex_var *x, int dim0, int dim1) {
  if (!x) return apex_permute(g, x, NULL);
  int nd = x->value->ndim, d0 = ag_dim(dim0, nd), d1 = ag_dim(dim1, nd), perm[APEX_MAX_DIMS];
  if (d0 < 0 || d1 < 0) return apex__fail_null(APEX_ERR_SHAPE, "transpose: dims %d, %d are out of range for %s", dim0, dim1, apex__shape(x));
  for (int i = 0; i < nd; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return apex_permute(g, x, perm);
}

apex_status apex__bwd_permute(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_PERMUTE);
  if (!be || !AG_HAS(be, nn_permute_bwd, APEX_OP_PERMUTE)) return apex_last_status();
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  apex_nn_permute_bwd_args a = {.ndim = out->value->ndim, .n = ag_numel(out), .gout = out->gbuf, .gx = gx, .accumulate_x = 1};
  memcpy(a.shape, out->value->shape, (size_t)a.ndim * sizeof *a.shape);
  permute_strides(out->in[0]->value, out->p.permute.perm, a.strides);
  return be->nn_permute_bwd(&a);
}

/* ---- concat ------------------------------------------------------------------------------------- */

/* 1 when the concat of u[0..n) along d is already in memory: every input a leaf of dtype dt, the inputs
 * back to back in order in one storage, and d the outermost dimension that is not 1 (so each input is
 * one block of the result). Parameters made as views of one allocation (nn's joint q/k/v weight) are
 * so: their concat is a view, and the product over it reads them in place. Leaves only, so that the
 * view is never activation memory the pool could reuse under it, and its values are the leaves' own
 * (a cast concat copies). The backward is the same either way: each input's gradient is its part of
 * the result's. */
static int leaves_in_place(apex_var *const *u, int n, int d, apex_dtype dt) {
  const apex_tensor *t0 = u[0]->value;
  for (int i = 0; i < d; i++)
    if (t0->shape[i] != 1) return 0;
  size_t at = t0->offset;
  for (int k = 0; k < n; k++) {
    const apex_tensor *t = u[k]->value;
    if (u[k]->graph || t->dtype != dt || t->storage != t0->storage || t->offset != at) return 0;
    at += t->numel * apex_dtype_size(dt);
  }
  return 1;
}

/* Any number of inputs: the in-list past AG_MAX_IN lives in the graph pool (apex__result_value). Each
 * input's rows are converted straight into the result's dtype (a copy when it is the same), so no
 * input is widened to f32 and back: a cast of f16 or bf16 to f32 is exact, and so is the result. */
apex_var *apex_concat(apex_graph *g, int n, apex_var *const *xs, int dim) {
  if (!g) return apex__fail_null(APEX_ERR_INVALID_ARG, "concat: NULL graph");
  if (n < 1 || !xs) return apex__fail_null(APEX_ERR_INVALID_ARG, "concat: an empty list (%d inputs%s); give at least one", n, xs ? "" : ", NULL array");
  apex_var *small[AG_MAX_IN], **u = n <= AG_MAX_IN ? small : apex__host_scratch(g, (size_t)n * sizeof *u);
  apex_dtype dt;
  if (!u || apex__dispatch(g, APEX_OP_CONCAT, n, xs, 0, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *x0 = u[0]->value;
  int nd = x0->ndim, d = ag_dim(dim, nd);
  if (d < 0) return apex__fail_null(APEX_ERR_SHAPE, "concat: dim %d is out of range for input 0 %s", dim, apex__shape(xs[0]));
  int64_t shape[APEX_MAX_DIMS];
  memcpy(shape, x0->shape, sizeof(int64_t) * (size_t)nd);
  shape[d] = 0;
  for (int k = 0; k < n; k++) {
    const apex_tensor *t = u[k]->value;
    int ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = i == d || t->shape[i] == x0->shape[i];
    if (!ok)
      return apex__fail_null(APEX_ERR_SHAPE, "concat: input %d %s does not match input 0 %s outside dim %d", k, apex__shape(xs[k]),
                             apex__shape(xs[0]), d);
    shape[d] += t->shape[d];
  }
  if (leaves_in_place(u, n, d, dt)) { /* no copy: the result is a view of the leaves' one allocation */
    apex_tensor *view = apex__tensor_view_of(u[0]->value->storage, u[0]->value->offset, dt, nd, shape);
    if (!view || !apex__adopt(g, view)) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "concat: out of memory");
    apex_var *out = apex__result_value(g, APEX_OP_CONCAT, view, n, u);
    if (out) out->p.concat.dim = d;
    return out;
  }
  const apex_backend *be = apex__ag_backend(u[0], APEX_OP_CONCAT);
  if (!be || !AG_HAS(be, nn_concat, APEX_OP_CONCAT)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_CONCAT, dt, nd, shape, n, u);
  if (!out) return NULL;
  out->p.concat.dim = d;
  size_t outer, D, inner;
  ag_lines(out->value, d, &outer, &D, &inner);
  /* the lists are read on the host (args_nn.h): host memory whatever the graph's device */
  const void **x = apex__host_temp(g, (size_t)n * (sizeof *x + sizeof(apex_dtype) + sizeof(size_t)));
  if (!x) return NULL;
  size_t *width = (size_t *)(x + n);
  apex_dtype *xdt = (apex_dtype *)(width + n);
  for (int k = 0; k < n; k++) {
    x[k] = apex_tensor_data(u[k]->value);
    xdt[k] = u[k]->value->dtype;
    width[k] = (size_t)u[k]->value->shape[d] * inner;
  }
  if (be->nn_concat(&(apex_nn_concat_args){.n = n, .outer = outer, .row = D * inner, .x = x, .x_dtype = xdt, .width = width,
                                           .out = apex_tensor_data(out->value), .out_dtype = dt}) != APEX_OK)
    return NULL;
  return out;
}

apex_status apex__bwd_concat(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_CONCAT);
  if (!be || !AG_HAS(be, nn_concat_bwd, APEX_OP_CONCAT)) return apex_last_status();
  int d = out->p.concat.dim, n = out->n_in;
  size_t outer, D, inner;
  ag_lines(out->value, d, &outer, &D, &inner);
  float **gx = apex__host_temp(g, (size_t)n * (sizeof *gx + sizeof(size_t) + sizeof(int))); /* read on the host */
  if (!gx) return APEX_ERR_OUT_OF_MEMORY;
  size_t *width = (size_t *)(gx + n);
  int *acc = (int *)(width + n);
  for (int k = 0; k < n; k++) {
    width[k] = (size_t)out->in[k]->value->shape[d] * inner;
    gx[k] = apex__gbuf(g, out->in[k]);
    acc[k] = 1;
  }
  return be->nn_concat_bwd(&(apex_nn_concat_bwd_args){.n = n, .outer = outer, .row = D * inner, .width = width, .gout = out->gbuf,
                                                      .gx = gx, .accumulate = acc});
}

/* ---- embedding ---------------------------------------------------------------------------------- */

/* The lookup from ids on the host (checked here, each against V) or from an apex_index (checked when it was
 * set, against its bound: only the bound is compared here). The graph keeps its own copy of the ids for the
 * backward: host memory for host ids (the slot reads them there), the graph's device memory for an index's,
 * copied on the device, so that nothing in the step goes through the host. */
static apex_var *embedding_of(apex_graph *g, apex_var *weight, const int64_t *ids, const apex_index *ix, int ndim,
                              const int64_t *shape, const char *fn) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_EMBEDDING, 1, &weight, 0, &u, &dt) != APEX_OK) return NULL;
  const apex_tensor *W = u->value;
  if (W->ndim != 2) return apex__fail_null(APEX_ERR_SHAPE, "%s: weight %s must be [V, D]", fn, apex__shape(weight));
  if (ndim < 0 || ndim >= APEX_MAX_DIMS || (ndim && !shape))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: ids of %d dimensions (at most %d) for weight %s", fn, ndim, APEX_MAX_DIMS - 1, apex__shape(weight));
  size_t n = 1, V = (size_t)W->shape[0], D = (size_t)W->shape[1];
  int64_t oshape[APEX_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    oshape[i] = shape[i];
    n *= (size_t)shape[i];
  }
  oshape[ndim] = (int64_t)D;
  if (ix) {
    if (ix->bound > (int64_t)V)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: the index's values are bounded by %lld, the weight %s has %zu rows", fn,
                             (long long)ix->bound, apex__shape(weight), V);
    if (ix->mem->device != g->be->device)
      return apex__fail_null(APEX_ERR_DEVICE, "%s: the index is on the %s, the graph on the %s", fn, ix->mem->name, g->mem->name);
  } else {
    if (n && !ids) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL ids of shape %s", fn, apex__shape_of(ndim, shape));
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0 || (size_t)ids[i] >= V)
        return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: id %lld at %zu is outside [0, %zu) for weight %s", fn, (long long)ids[i], i, V,
                               apex__shape(weight));
  }
  const apex_backend *be = apex__ag_backend(u, APEX_OP_EMBEDDING);
  if (!be || !AG_HAS(be, nn_embedding, APEX_OP_EMBEDDING)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_EMBEDDING, dt, ndim + 1, oshape, 1, &u);
  if (!out) return NULL;
  int64_t *keep = ix ? apex__scratch(g, ag_nz(n) * sizeof(int64_t)) : apex__host_scratch(g, ag_nz(n) * sizeof(int64_t));
  if (!keep) return NULL;
  if (ix && n && g->mem->copy(keep, ix->data, n * sizeof(int64_t), APEX_COPY_D2D, 0) != APEX_OK) return NULL;
  if (!ix && ids) memcpy(keep, ids, n * sizeof(int64_t));
  out->aux = keep;
  out->p.embedding.ids_on_device = ix != NULL;
  if (be->nn_embedding(&(apex_nn_embedding_args){.n = n, .dim = D, .ids = keep, .ids_on_device = ix != NULL, .w = apex_tensor_data(W),
                                                 .dtype = dt, .out = apex_tensor_data(out->value)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_embedding(apex_graph *g, apex_var *weight, const int64_t *ids, int ndim, const int64_t *shape) {
  return embedding_of(g, weight, ids, NULL, ndim, shape, "embedding");
}

apex_var *apex_embedding_index(apex_graph *g, apex_var *weight, const apex_index *ids) {
  if (!ids) return apex__fail_null(APEX_ERR_INVALID_ARG, "embedding_index: NULL index");
  return embedding_of(g, weight, NULL, ids, ids->ndim, ids->shape, "embedding_index");
}

apex_status apex__bwd_embedding(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_EMBEDDING);
  if (!be || !AG_HAS(be, nn_embedding_bwd, APEX_OP_EMBEDDING)) return apex_last_status();
  float *gw = apex__gbuf(g, out->in[0]);
  if (!gw) return APEX_OK;
  size_t D = (size_t)out->in[0]->value->shape[1];
  return be->nn_embedding_bwd(&(apex_nn_embedding_bwd_args){.n = ag_numel(out) / ag_nz(D), .dim = D,
                                                            .rows = (size_t)out->in[0]->value->shape[0], .ids = out->aux,
                                                            .ids_on_device = out->p.embedding.ids_on_device, .gout = out->gbuf,
                                                            .gout_dtype = out->gdt, .gw = gw, .accumulate_w = 1,
                                                            .ws = apex__ag_workspace(g)});
}
