/* ops_linear.c: matmul and linear on apex__gemm (gemm.c).
 *
 * Operands and results stay in their own dtypes: apex__gemm widens low-precision operands to f32
 * (per tile once a product is big), or runs bf16 ones through oneDNN on bf16 CPUs (gemm_onednn.c),
 * and every product accumulates in f32, split over the threads never along K, so a product's bits do
 * not depend on the thread count. */
#include "autograd/ag.h"

/* t's data from element off, as a gemm operand with rows of ld elements. */
static ag_mat mat(const apex_tensor *t, size_t off, int ld, int trans) {
  return (ag_mat){(const char *)apex_tensor_data(t) + off * apex_dtype_size(t->dtype), t->dtype, ld, trans};
}
static ag_mat mat_f32(const float *p, int ld, int trans) { return (ag_mat){p, APEX_F32, ld, trans}; }

void apex__colsum_add(const float *m, size_t rows, size_t cols, float *dst) {
  enum { CB = 64 };
  size_t nb = (cols + CB - 1) / CB;
#pragma omp parallel for schedule(static) if (rows * cols > AG_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    float acc[CB] = {0};
    size_t c0 = b * CB, w = cols - c0 < CB ? cols - c0 : CB;
    for (size_t r = 0; r < rows; r++)
      for (size_t c = 0; c < w; c++) acc[c] += m[r * cols + c0 + c];
    for (size_t c = 0; c < w; c++) dst[c0 + c] += acc[c];
  }
}

/* ---- matmul -------------------------------------------------------------------------------------- */

typedef struct mm_dims {
  size_t batch; /* 1 when b is 2-d (a's leading dims fold into M) */
  int m, n, k;
} mm_dims;

static int mm_plan(const apex_tensor *a, const apex_tensor *b, mm_dims *d) {
  if (a->ndim < 2 || b->ndim < 2) return 0;
  d->k = (int)a->shape[a->ndim - 1];
  d->n = (int)b->shape[b->ndim - 1];
  if (b->shape[b->ndim - 2] != d->k) return 0;
  if (b->ndim == 2) {
    size_t m = 1;
    for (int i = 0; i < a->ndim - 1; i++) m *= (size_t)a->shape[i];
    d->batch = 1;
    d->m = (int)m;
    return 1;
  }
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim - 2; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  d->m = (int)a->shape[a->ndim - 2];
  d->batch = 1;
  for (int i = 0; i < a->ndim - 2; i++) d->batch *= (size_t)a->shape[i];
  return 1;
}

apex_var *apex_matmul(apex_graph *g, apex_var *a, apex_var *b) {
  apex_var *in[2] = {a, b}, *u[2];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_MATMUL, 2, in, 0, u, &dt) != APEX_OK) return NULL;
  mm_dims d;
  if (!mm_plan(u[0]->value, u[1]->value, &d))
    return apex__fail_null(APEX_ERR_SHAPE, "matmul: cannot multiply %s by %s (need a [..., M, K] and b [K, N] or [..., K, N] with a's leading dims)",
                           apex__shape(a), apex__shape(b));
  int64_t shape[APEX_MAX_DIMS];
  int nd = u[0]->value->ndim;
  for (int i = 0; i < nd - 1; i++) shape[i] = u[0]->value->shape[i];
  shape[nd - 1] = d.n;
  apex_var *out = apex__result(g, APEX_OP_MATMUL, dt, nd, shape, 2, u);
  if (!out) return NULL;
  const apex_tensor *A = u[0]->value, *B = u[1]->value;
  size_t sa = (size_t)d.m * d.k, sb = d.batch > 1 ? (size_t)d.k * d.n : 0, so = (size_t)d.m * d.n;
  char *o = apex_tensor_data(out->value);
  for (size_t i = 0; i < d.batch; i++)
    if (apex__gemm(g, d.m, d.n, d.k, 1.0f, mat(A, i * sa, d.k, 0), mat(B, i * sb, d.n, 0), 0.0f, o + i * so * apex_dtype_size(dt), dt, d.n,
                   NULL) != APEX_OK)
      return NULL;
  return out;
}

apex_status apex__bwd_matmul(apex_graph *g, apex_var *out) {
  mm_dims d;
  mm_plan(out->in[0]->value, out->in[1]->value, &d);
  float *ga = apex__gbuf(g, out->in[0]), *gb = apex__gbuf(g, out->in[1]);
  const apex_tensor *A = out->in[0]->value, *B = out->in[1]->value;
  const float *go = out->gbuf;
  size_t sa = (size_t)d.m * d.k, sb = d.batch > 1 ? (size_t)d.k * d.n : 0, so = (size_t)d.m * d.n;
  for (size_t i = 0; i < d.batch; i++) {
    if (ga && apex__gemm(g, d.m, d.k, d.n, 1.0f, mat_f32(go + i * so, d.n, 0), mat(B, i * sb, d.n, 1), 1.0f, ga + i * sa, APEX_F32, d.k,
                         NULL) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
    if (gb && apex__gemm(g, d.k, d.n, d.m, 1.0f, mat(A, i * sa, d.k, 1), mat_f32(go + i * so, d.n, 0), 1.0f, gb + i * sb, APEX_F32, d.n,
                         NULL) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
  }
  return APEX_OK;
}

/* ---- linear -------------------------------------------------------------------------------------- */

apex_var *apex_linear(apex_graph *g, apex_var *x, apex_var *w, apex_var *b) {
  apex_var *in[3] = {x, w, b}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_LINEAR, 3, in, 4u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value, *W = u[1]->value;
  if (X->ndim < 1 || W->ndim != 2 || X->shape[X->ndim - 1] != W->shape[1] ||
      (b && (u[2]->value->ndim != 1 || u[2]->value->shape[0] != W->shape[0])))
    return apex__fail_null(APEX_ERR_SHAPE, "linear: input %s, weight %s, bias %s do not fit (need x [..., in], w [out, in], b [out])",
                           apex__shape(x), apex__shape(w), b ? apex__shape(b) : "none");
  int k = (int)W->shape[1], n = (int)W->shape[0];
  int m = (int)(X->numel / (size_t)ag_nz(k));
  int64_t shape[APEX_MAX_DIMS];
  for (int i = 0; i < X->ndim - 1; i++) shape[i] = X->shape[i];
  shape[X->ndim - 1] = n;
  apex_var *out = apex__result(g, APEX_OP_LINEAR, dt, X->ndim, shape, 3, u);
  if (!out) return NULL;
  const float *bf = b ? apex__f32(g, u[2]->value) : NULL;
  if (b && !bf) return NULL;
  if (apex__gemm(g, m, n, k, 1.0f, mat(X, 0, k, 0), mat(W, 0, k, 1), 0.0f, apex_tensor_data(out->value), dt, n, bf) != APEX_OK) return NULL;
  return out;
}

apex_status apex__bwd_linear(apex_graph *g, apex_var *out) {
  const apex_tensor *X = out->in[0]->value, *W = out->in[1]->value;
  int k = (int)W->shape[1], n = (int)W->shape[0];
  int m = (int)(X->numel / (size_t)ag_nz(k));
  const float *go = out->gbuf;
  /* A first gradient is written with beta 0 into an unzeroed buffer (see apex__gbuf_w); the product
   * then starts from +0 as it would have in a zeroed one. */
  int fresh_x, fresh_w;
  float *gx = apex__gbuf_w(g, out->in[0], &fresh_x), *gw = apex__gbuf_w(g, out->in[1], &fresh_w);
  float *gb = apex__gbuf(g, out->in[2]);
  if (gx && apex__gemm(g, m, k, n, 1.0f, mat_f32(go, n, 0), mat(W, 0, k, 0), fresh_x ? 0.0f : 1.0f, gx, APEX_F32, k,
                       NULL) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  if (gw && apex__gemm(g, n, k, m, 1.0f, mat_f32(go, n, 1), mat(X, 0, k, 0), fresh_w ? 0.0f : 1.0f, gw, APEX_F32, k,
                       NULL) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  if (gb) apex__colsum_add(go, (size_t)m, (size_t)n, gb);
  return APEX_OK;
}
