/* ops_shape.c: sum, mean and the L2 norm, reshape, permute/transpose, concat, and embedding lookups.
 *
 * A reduction along a dim sees x as [outer, D, inner] and sums each line of D in order (the whole
 * tensor for sum_all, in apex__sum_f32's fixed blocks; norm_all in the same fixed blocks), so its
 * bits do not depend on threads. */
#include "autograd/ag.h"

/* ---- sum / mean / norm -------------------------------------------------------------------------- */

/* Sum of squares of n floats in double on the calling thread, in order: the block function of a norm's
 * apex__blocked_sum, so its bits do not depend on the thread count either. */
static double sumsq_serial(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

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
  apex_var *out = apex__result(g, op, dt, nd, shape, 1, &u);
  if (!out) return NULL;
  const float *xf = apex__f32(g, X);
  float *o = apex__out_f32(g, out);
  if (!xf || !o) return NULL;
  double scale = op == APEX_OP_MEAN ? 1.0 / (double)D : 1.0;
  out->p.reduce.outer = (int64_t)outer;
  out->p.reduce.dim = (int64_t)D;
  out->p.reduce.inner = (int64_t)inner;
  out->p.reduce.scale = (float)scale;
  if (op == APEX_OP_NORM) {
    /* The backward divides by the norms: kept in f32 (aux), not read back from a half result. */
    size_t nl = outer * inner, n = nl * D;
    float *nrm = apex__scratch(g, ag_nz(nl) * sizeof(float));
    if (!nrm) return NULL;
    out->aux = nrm;
    if (nl == 1) {
      nrm[0] = (float)sqrt(apex__blocked_sum(xf, D, sumsq_serial));
    } else {
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
      for (size_t l = 0; l < nl; l++) {
        const float *xl = xf + (l / inner) * D * inner + l % inner;
        double s = 0;
        for (size_t j = 0; j < D; j++) s += (double)xl[j * inner] * xl[j * inner];
        nrm[l] = (float)sqrt(s);
      }
    }
    memcpy(o, nrm, nl * sizeof(float));
  } else if (outer * inner == 1) {
    o[0] = (float)(apex__sum_f32(xf, D) * scale);
  } else {
    size_t nl = outer * inner, n = nl * D;
#pragma omp parallel for schedule(static) if (n > AG_PAR_MIN)
    for (size_t l = 0; l < nl; l++) {
      const float *xl = xf + (l / inner) * D * inner + l % inner;
      double s = 0;
      for (size_t j = 0; j < D; j++) s += xl[j * inner];
      o[l] = (float)(s * scale);
    }
  }
  apex__store(out, o);
  return out;
}

apex_var *apex_sum_all(apex_graph *g, apex_var *x) { return reduce(g, APEX_OP_SUM, x, 1, 0, 0); }
apex_var *apex_mean_all(apex_graph *g, apex_var *x) { return reduce(g, APEX_OP_MEAN, x, 1, 0, 0); }
apex_var *apex_sum(apex_graph *g, apex_var *x, int dim, int keepdim) { return reduce(g, APEX_OP_SUM, x, 0, dim, keepdim); }
apex_var *apex_mean(apex_graph *g, apex_var *x, int dim, int keepdim) { return reduce(g, APEX_OP_MEAN, x, 0, dim, keepdim); }
apex_var *apex_norm_all(apex_graph *g, apex_var *x) { return reduce(g, APEX_OP_NORM, x, 1, 0, 0); }
apex_var *apex_norm(apex_graph *g, apex_var *x, int dim, int keepdim) { return reduce(g, APEX_OP_NORM, x, 0, dim, keepdim); }

apex_status apex__bwd_sum(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  size_t D = (size_t)out->p.reduce.dim, inner = (size_t)out->p.reduce.inner, n = ag_numel(out->in[0]);
  const float *go = out->gbuf;
  float s = out->p.reduce.scale;
  AG_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += go[(i / (D * inner)) * inner + i % inner] * s;
  return APEX_OK;
}

/* d norm / dx = x / norm, and 0 where the norm is 0 (PyTorch's norm_backward: the subgradient 0 at
 * the origin rather than 0/0). */
apex_status apex__bwd_norm(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  const float *X = apex__f32(g, out->in[0]->value), *nrm = out->aux, *go = out->gbuf;
  if (!X) return APEX_ERR_OUT_OF_MEMORY;
  size_t D = (size_t)out->p.reduce.dim, inner = (size_t)out->p.reduce.inner, n = ag_numel(out->in[0]);
  AG_PFOR
  for (size_t i = 0; i < n; i++) {
    size_t l = (i / (D * inner)) * inner + i % inner;
    if (nrm[l] != 0.0f) gx[i] += go[l] * (X[i] / nrm[l]);
  }
  return APEX_OK;
}

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

/* Calls body(out_index, in_offset) for every element, rows of the last dim on threads. */
#define PERMUTE_WALK(out_shape, nd, st, n, BODY)                                                                        \
  do {                                                                                                                  \
    size_t len_ = nd ? (size_t)out_shape[nd - 1] : 1, rows_ = len_ ? n / len_ : 0;                                      \
    _Pragma("omp parallel for schedule(static) if (n > AG_PAR_MIN)") for (size_t r_ = 0; r_ < rows_; r_++) {           \
      size_t rem_ = r_, base_ = 0;                                                                                      \
      for (int d_ = nd - 2; d_ >= 0; d_--) {                                                                            \
        base_ += (rem_ % (size_t)out_shape[d_]) * (size_t)st[d_];                                                       \
        rem_ /= (size_t)out_shape[d_];                                                                                  \
      }                                                                                                                 \
      size_t ls_ = nd ? (size_t)st[nd - 1] : 0;                                                                         \
      for (size_t j_ = 0; j_ < len_; j_++) {                                                                            \
        size_t oi = r_ * len_ + j_, ii = base_ + j_ * ls_;                                                              \
        BODY;                                                                                                           \
      }                                                                                                                 \
    }                                                                                                                   \
  } while (0)

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
  int64_t shape[APEX_MAX_DIMS], st[APEX_MAX_DIMS];
  for (int i = 0; i < nd; i++) shape[i] = u->value->shape[perm[i]];
  apex_var *out = apex__result(g, APEX_OP_PERMUTE, dt, nd, shape, 1, &u);
  if (!out) return NULL;
  memcpy(out->p.permute.perm, perm, (size_t)nd * sizeof *perm);
  permute_strides(u->value, perm, st);
  const float *X = apex__f32(g, u->value);
  float *o = apex__out_f32(g, out);
  if (!X || !o) return NULL;
  size_t n = ag_numel(out);
  PERMUTE_WALK(shape, nd, st, n, o[oi] = X[ii]);
  apex__store(out, o);
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
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  int nd = out->value->ndim;
  int64_t st[APEX_MAX_DIMS];
  const int64_t *shape = out->value->shape;
  permute_strides(out->in[0]->value, out->p.permute.perm, st);
  const float *go = out->gbuf;
  size_t n = ag_numel(out);
  PERMUTE_WALK(shape, nd, st, n, gx[ii] += go[oi]);
  return APEX_OK;
}

/* ---- concat ------------------------------------------------------------------------------------- */

/* Any number of inputs: the in-list past AG_MAX_IN lives in the graph pool (apex__result_value). Each
 * input's rows are converted straight into the result's dtype (a copy when it is the same), so no
 * input is widened to f32 and back: a cast of f16 or bf16 to f32 is exact, and so is the result. */
apex_var *apex_concat(apex_graph *g, int n, apex_var *const *xs, int dim) {
  if (!g) return apex__fail_null(APEX_ERR_INVALID_ARG, "concat: NULL graph");
  if (n < 1 || !xs) return apex__fail_null(APEX_ERR_INVALID_ARG, "concat: an empty list (%d inputs%s); give at least one", n, xs ? "" : ", NULL array");
  apex_var *small[AG_MAX_IN], **u = n <= AG_MAX_IN ? small : apex__scratch(g, (size_t)n * sizeof *u);
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
  apex_var *out = apex__result(g, APEX_OP_CONCAT, dt, nd, shape, n, u);
  if (!out) return NULL;
  out->p.concat.dim = d;
  size_t outer, D, inner, es = apex_dtype_size(dt);
  ag_lines(out->value, d, &outer, &D, &inner);
  size_t row = D * inner, at = 0;
  char *o = apex_tensor_data(out->value);
  for (int k = 0; k < n; k++) {
    const apex_tensor *t = u[k]->value;
    const char *X = apex_tensor_data(t);
    size_t w = (size_t)t->shape[d] * inner, tes = apex_dtype_size(t->dtype);
    for (size_t r = 0; r < outer; r++) apex_convert(o + (r * row + at) * es, dt, X + r * w * tes, t->dtype, w);
    at += w;
  }
  return out;
}

apex_status apex__bwd_concat(apex_graph *g, apex_var *out) {
  int d = out->p.concat.dim;
  size_t outer, D, inner;
  ag_lines(out->value, d, &outer, &D, &inner);
  size_t row = D * inner, at = 0;
  for (int k = 0; k < out->n_in; k++) {
    size_t w = (size_t)out->in[k]->value->shape[d] * inner;
    float *gx = apex__gbuf(g, out->in[k]);
    if (gx)
      for (size_t r = 0; r < outer; r++)
        for (size_t j = 0; j < w; j++) gx[r * w + j] += out->gbuf[r * row + at + j];
    at += w;
  }
  return APEX_OK;
}

/* ---- embedding ---------------------------------------------------------------------------------- */

apex_var *apex_embedding(apex_graph *g, apex_var *weight, const int64_t *ids, int ndim, const int64_t *shape) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_EMBEDDING, 1, &weight, 0, &u, &dt) != APEX_OK) return NULL;
  const apex_tensor *W = u->value;
  if (W->ndim != 2) return apex__fail_null(APEX_ERR_SHAPE, "embedding: weight %s must be [V, D]", apex__shape(weight));
  if (ndim < 0 || ndim >= APEX_MAX_DIMS || (ndim && !shape))
    return apex__fail_null(APEX_ERR_SHAPE, "embedding: ids of %d dimensions (at most %d) for weight %s", ndim, APEX_MAX_DIMS - 1, apex__shape(weight));
  size_t n = 1, V = (size_t)W->shape[0], D = (size_t)W->shape[1];
  int64_t oshape[APEX_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    oshape[i] = shape[i];
    n *= (size_t)shape[i];
  }
  oshape[ndim] = (int64_t)D;
  if (n && !ids) return apex__fail_null(APEX_ERR_INVALID_ARG, "embedding: NULL ids of shape %s", apex__shape_of(ndim, shape));
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || (size_t)ids[i] >= V)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "embedding: id %lld at %zu is outside [0, %zu) for weight %s", (long long)ids[i], i, V,
                             apex__shape(weight));
  apex_var *out = apex__result(g, APEX_OP_EMBEDDING, dt, ndim + 1, oshape, 1, &u);
  if (!out) return NULL;
  int64_t *keep = apex__scratch(g, ag_nz(n) * sizeof(int64_t));
  if (!keep) return NULL;
  memcpy(keep, ids, n * sizeof(int64_t));
  out->aux = keep;
  size_t es = apex_dtype_size(dt);
  const char *src = apex_tensor_data(W);
  char *dst = apex_tensor_data(out->value);
  for (size_t i = 0; i < n; i++) memcpy(dst + i * D * es, src + (size_t)ids[i] * D * es, D * es);
  return out;
}

apex_status apex__bwd_embedding(apex_graph *g, apex_var *out) {
  float *gw = apex__gbuf(g, out->in[0]);
  if (!gw) return APEX_OK;
  size_t D = (size_t)out->in[0]->value->shape[1], n = ag_numel(out) / ag_nz(D);
  const int64_t *ids = out->aux;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < D; j++) gw[(size_t)ids[i] * D + j] += out->gbuf[i * D + j];
  return APEX_OK;
}
