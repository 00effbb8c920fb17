/* ops_linear.c: matmul and linear on OpenBLAS sgemm.
 *
 * Low-precision operands are widened to f32 once per call and every product accumulates in f32
 * inside sgemm. apex__sgemm splits the output into blocks over the OpenMP threads (never along K),
 * so a product's bits do not depend on the thread count. */
#include <cblas.h>

#include "apex/threads.h"
#include "autograd/ag.h"

void apex__sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                 int ldb, float beta, float *c, int ldc) {
  /* OpenBLAS runs on one thread and apex splits the output over its OpenMP threads: OpenBLAS's
   * pthreads spinning beside OpenMP's would fight for the cores, and every output element is still
   * summed over all of K by the same kernel, so the bits do not depend on the split. */
  static int blas_single;
  if (!blas_single) {
    openblas_set_num_threads(1);
    blas_single = 1;
  }
  int t = apex_get_num_threads();
  double work = (double)m * n * k;
  if (t < 2 || work < 4e6) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
    return;
  }
  int split_rows = m >= n, len = split_rows ? m : n, parts = t * 2;
  int chunk = ((len + parts - 1) / parts + 15) / 16 * 16;
  int nparts = (len + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (int p = 0; p < nparts; p++) {
    int lo = p * chunk, w = len - lo < chunk ? len - lo : chunk;
    if (split_rows) {
      const float *ap = trans_a ? a + lo : a + (size_t)lo * lda;
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, w, n, k, alpha, ap, lda, b,
                  ldb, beta, c + (size_t)lo * ldc, ldc);
    } else {
      const float *bp = trans_b ? b + (size_t)lo * ldb : b + lo;
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, w, k, alpha, a, lda, bp,
                  ldb, beta, c + lo, ldc);
    }
  }
}

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
  const float *A = apex__f32(g, u[0]->value), *B = apex__f32(g, u[1]->value);
  float *o = apex__out_f32(g, out);
  if (!A || !B || !o) return NULL;
  size_t sa = (size_t)d.m * d.k, sb = d.batch > 1 ? (size_t)d.k * d.n : 0, so = (size_t)d.m * d.n;
  for (size_t i = 0; i < d.batch; i++)
    apex__sgemm(0, 0, d.m, d.n, d.k, 1.0f, A + i * sa, d.k, B + i * sb, d.n, 0.0f, o + i * so, d.n);
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_matmul(apex_graph *g, apex_var *out) {
  mm_dims d;
  mm_plan(out->in[0]->value, out->in[1]->value, &d);
  float *ga = apex__gbuf(g, out->in[0]), *gb = apex__gbuf(g, out->in[1]);
  const float *A = apex__f32(g, out->in[0]->value), *B = apex__f32(g, out->in[1]->value), *go = out->gbuf;
  if (!A || !B) return APEX_ERR_OUT_OF_MEMORY;
  size_t sa = (size_t)d.m * d.k, sb = d.batch > 1 ? (size_t)d.k * d.n : 0, so = (size_t)d.m * d.n;
  for (size_t i = 0; i < d.batch; i++) {
    if (ga) apex__sgemm(0, 1, d.m, d.k, d.n, 1.0f, go + i * so, d.n, B + i * sb, d.n, 1.0f, ga + i * sa, d.k);
    if (gb) apex__sgemm(1, 0, d.k, d.n, d.m, 1.0f, A + i * sa, d.k, go + i * so, d.n, 1.0f, gb + i * sb, d.n);
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
  const float *xf = apex__f32(g, X), *wf = apex__f32(g, W), *bf = b ? apex__f32(g, u[2]->value) : NULL;
  float *o = apex__out_f32(g, out);
  if (!xf || !wf || !o || (b && !bf)) return NULL;
  float beta = 0.0f;
  if (bf) {
    size_t rows = (size_t)m, cols = (size_t)n, total = rows * cols;
#pragma omp parallel for schedule(static) if (total > AG_PAR_MIN)
    for (size_t r = 0; r < rows; r++) memcpy(o + r * cols, bf, cols * sizeof(float));
    beta = 1.0f;
  }
  apex__sgemm(0, 1, m, n, k, 1.0f, xf, k, wf, k, beta, o, n);
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_linear(apex_graph *g, apex_var *out) {
  const apex_tensor *X = out->in[0]->value, *W = out->in[1]->value;
  int k = (int)W->shape[1], n = (int)W->shape[0];
  int m = (int)(X->numel / (size_t)ag_nz(k));
  const float *go = out->gbuf;
  float *gx = apex__gbuf(g, out->in[0]), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  if (gx) {
    const float *wf = apex__f32(g, W);
    if (!wf) return APEX_ERR_OUT_OF_MEMORY;
    apex__sgemm(0, 0, m, k, n, 1.0f, go, n, wf, k, 1.0f, gx, k);
  }
  if (gw) {
    const float *xf = apex__f32(g, X);
    if (!xf) return APEX_ERR_OUT_OF_MEMORY;
    apex__sgemm(1, 0, n, k, m, 1.0f, go, n, xf, k, 1.0f, gw, k);
  }
  if (gb) apex__colsum_add(go, (size_t)m, (size_t)n, gb);
  return APEX_OK;
}
