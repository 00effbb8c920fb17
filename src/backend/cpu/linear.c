/* linear.c: the CPU backend's matmul and linear kernels (args_nn.h) on apex__gemm (gemm.c).
 *
 * Operands and results stay in their own dtypes: apex__gemm widens low-precision operands to f32
 * (per tile once a product is big), or runs bf16 ones through oneDNN on bf16 CPUs (gemm_onednn.c),
 * and every product accumulates in f32, split over the threads never along K, so a product's bits do
 * not depend on the thread count. */
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/sums.h"
#include "backend/grad_dtype.h"

/* b's data from element off, as a gemm operand with rows of ld elements. */
static apex__mat mat(apex_nn_buf b, size_t off, int ld, int trans) {
  return (apex__mat){(const char *)b.data + off * apex_dtype_size(b.dtype), b.dtype, ld, trans};
}
static apex__mat mat_f32(const float *p, int ld, int trans) { return (apex__mat){p, APEX_F32, ld, trans}; }

/* One product entry with apex_nn_gemm_ext's epilogue: straight into out where apex__gemm covers it (no
 * GELU; beta 0 or an f32 out; a bias only with beta 0), else through an f32 [m, n] tile of the workspace
 * that receives beta * out, the product, the bias, and is rounded into out once (through GELU). */
static apex_status matmul_ext_one(const apex_nn_matmul_args *a, apex__mat A, apex__mat B, void *o) {
  const apex_nn_gemm_ext *e = a->ext;
  int m = a->m, n = a->n, k = a->k;
  size_t mn = (size_t)m * n;
  const float *bias = apex__cpu_f32(e->bias, (size_t)n, &a->ws);
  if (e->bias.data && !bias) return APEX_ERR_OUT_OF_MEMORY;
  if (!e->gelu && (e->beta == 0.0f || (a->out_dtype == APEX_F32 && !bias)))
    return apex__gemm(&a->ws, m, n, k, e->alpha, A, B, e->beta, o, a->out_dtype, n, e->beta == 0.0f ? bias : NULL);
  float *t = a->ws.get(a->ws.ctx, (mn ? mn : 1) * sizeof(float));
  if (!t) return APEX_ERR_OUT_OF_MEMORY;
  if (e->beta != 0.0f && apex_convert(t, APEX_F32, o, a->out_dtype, mn) != APEX_OK) return apex_last_status();
  apex_status st = apex__gemm(&a->ws, m, n, k, e->alpha, A, B, e->beta, t, APEX_F32, n, NULL);
  if (st != APEX_OK) return st;
  if (bias)
    for (size_t i = 0; i < (size_t)m; i++)
      for (size_t j = 0; j < (size_t)n; j++) t[i * n + j] += bias[j];
  if (e->gelu)
    return apex__cpu_nn_unary(&(apex_nn_unary_args){.kind = APEX_NN_GELU_TANH, .n = mn, .x = {t, APEX_F32}, .out = o,
                                                    .out_dtype = a->out_dtype, .ws = a->ws});
  return apex_convert(o, a->out_dtype, t, APEX_F32, mn);
}

apex_status apex__cpu_nn_matmul(const apex_nn_matmul_args *a) {
  int m = a->m, n = a->n, k = a->k;
  if (a->ext) {
    const apex_nn_gemm_ext *e = a->ext;
    size_t sa = (size_t)m * k, sb = a->b_batched ? (size_t)k * n : 0, so = (size_t)m * n;
    for (size_t i = 0; i < a->batch; i++) {
      apex_status st = matmul_ext_one(a, mat(a->a, i * sa, e->trans_a ? m : k, e->trans_a), mat(a->b, i * sb, e->trans_b ? k : n, e->trans_b),
                                      (char *)a->out + i * so * apex_dtype_size(a->out_dtype));
      if (st != APEX_OK) return st;
    }
    return APEX_OK;
  }
  size_t sa = (size_t)m * k, sb = a->b_batched ? (size_t)k * n : 0, so = (size_t)m * n;
  char *o = a->out;
  for (size_t i = 0; i < a->batch; i++) {
    apex_status st = apex__gemm(&a->ws, m, n, k, 1.0f, mat(a->a, i * sa, k, 0), mat(a->b, i * sb, n, 0), 0.0f,
                                o + i * so * apex_dtype_size(a->out_dtype), a->out_dtype, n, NULL);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_matmul_bwd(const apex_nn_matmul_bwd_args *a) {
  int m = a->m, n = a->n, k = a->k;
  size_t sa = (size_t)m * k, sb = a->b_batched ? (size_t)k * n : 0, so = (size_t)m * n;
  const float *go = a->gout;
  float *ga = a->ga, *gb = a->gb, beta_a = a->accumulate_a ? 1.0f : 0.0f, beta_b = a->accumulate_b ? 1.0f : 0.0f;
  for (size_t i = 0; i < a->batch; i++) {
    if (ga && apex__gemm(&a->ws, m, k, n, 1.0f, mat_f32(go + i * so, n, 0), mat(a->b, i * sb, n, 1), beta_a, ga + i * sa, APEX_F32, k,
                         NULL) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
    if (gb && apex__gemm(&a->ws, k, n, m, 1.0f, mat(a->a, i * sa, k, 1), mat_f32(go + i * so, n, 0), beta_b, gb + i * sb, APEX_F32, n,
                         NULL) != APEX_OK)
      return APEX_ERR_OUT_OF_MEMORY;
  }
  return APEX_OK;
}

/* apex__gemm adds an f32 bias: a half one is widened here, n elements into the workspace (against the
 * product's m x n x k multiply-adds), with apex_convert's bits. */
apex_status apex__cpu_nn_linear(const apex_nn_linear_args *a) {
  int m = a->m, n = a->n, k = a->k;
  const float *bias = apex__cpu_f32(a->bias, (size_t)n, &a->ws);
  if (a->bias.data && !bias) return APEX_ERR_OUT_OF_MEMORY;
  /* the GELU epilogue reads pre as stored: the product rounded into pre, then the unary slot's GELU, the
   * bits of the two ops it fuses */
  void *prod = a->gelu ? a->pre : a->out;
  apex_status st = apex__gemm(&a->ws, m, n, k, 1.0f, mat(a->x, 0, k, 0), mat(a->w, 0, k, 1), 0.0f, prod, a->out_dtype, n, bias);
  if (st != APEX_OK || !a->gelu) return st;
  return apex__cpu_nn_unary(&(apex_nn_unary_args){.kind = APEX_NN_GELU_TANH, .n = (size_t)m * n, .x = {a->pre, a->out_dtype},
                                                  .out = a->out, .out_dtype = a->out_dtype, .ws = a->ws});
}

/* A first gradient (accumulate 0) is written with beta 0 into a buffer that holds nothing yet; the
 * product then starts from +0 as it would have in a zeroed one. */
static apex_status linear_bwd_k(const void *a) { return apex__cpu_nn_linear_bwd(a); }

/* gb [cols] receives the column sums of g [rows, cols] (f32, summed in row order) by the accumulate rule. */
static void colsums_into(float *gb, const float *g, size_t rows, size_t cols, int accumulate) {
  if (!accumulate) memset(gb, 0, cols * sizeof *gb);
  apex__colsum_add(g, rows, cols, gb);
}

/* args_nn.h's dgelu: the three steps the unfused ops take, on their own kernels: this backward with gout w
 * into the workspace (in gx's dtype, as it would land in x's gradient), the unary slot's GELU backward from
 * it into gx, and the column sums of gx as stored. */
static apex_status linear_bwd_dgelu(const apex_nn_linear_bwd_args *a) {
  if (!a->gx || a->accumulate_x)
    return apex__fail(APEX_ERR_INVALID_ARG, "nn_linear_bwd: dgelu_pre needs a gx that holds nothing yet (accumulate_x 0)");
  size_t mk = (size_t)a->m * (size_t)a->k;
  void *gh = a->ws.get(a->ws.ctx, (mk ? mk : 1) * apex_dtype_size(a->gx_dtype));
  if (!gh) return APEX_ERR_OUT_OF_MEMORY;
  apex_nn_linear_bwd_args c = *a;
  c.gx = gh;
  c.dgelu_pre = (apex_nn_buf){NULL, APEX_F32};
  c.dgelu_gb = NULL;
  apex_status st = apex__cpu_nn_linear_bwd(&c);
  if (st == APEX_OK)
    st = apex__cpu_nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = APEX_NN_GELU_TANH, .n = mk, .x = a->dgelu_pre, .gout = gh,
                                                          .gout_dtype = a->gx_dtype, .gx = a->gx, .gx_dtype = a->gx_dtype,
                                                          .accumulate_x = 0, .ws = a->ws});
  if (st != APEX_OK || !a->dgelu_gb) return st;
  const float *gp = apex__cpu_f32((apex_nn_buf){a->gx, a->gx_dtype}, mk, &a->ws);
  if (!gp) return APEX_ERR_OUT_OF_MEMORY;
  colsums_into(a->dgelu_gb, gp, (size_t)a->m, (size_t)a->k, a->accumulate_dgelu_gb);
  return APEX_OK;
}

apex_status apex__cpu_nn_linear_bwd(const apex_nn_linear_bwd_args *a) {
  if (a->dgelu_pre.data) return linear_bwd_dgelu(a);
  int m = a->m, n = a->n, k = a->k;
  if (a->gout_scale && a->gb) return apex__fail(APEX_ERR_INVALID_ARG, "nn_linear_bwd: gout_scale with a bias gradient (args_nn.h)");
  if (a->gelu) {
    /* gpre in gout's dtype (rounded when that is half), as the GELU op's backward would land it in pre's
     * fresh gradient (args_nn.h), then the plain backward on it */
    size_t mn = (size_t)m * n;
    void *gp = a->ws.get(a->ws.ctx, (mn ? mn : 1) * apex_dtype_size(a->gout_dtype));
    if (!gp) return APEX_ERR_OUT_OF_MEMORY;
    apex_status st = apex__cpu_nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = APEX_NN_GELU_TANH, .n = mn, .x = a->pre, .gout = a->gout,
                                                                       .gout_dtype = a->gout_dtype, .gx = gp, .gx_dtype = a->gout_dtype,
                                                                       .accumulate_x = 0, .ws = a->ws});
    if (st != APEX_OK) return st;
    apex_nn_linear_bwd_args c = *a;
    c.gelu = 0;
    c.gout = gp;
    return apex__cpu_nn_linear_bwd(&c);
  }
  int ran;
  apex_status rs = apex__linear_bwd_f32(&apex__cpu_backend, linear_bwd_k, a, &ran);
  if (ran) return rs;
  const float *go = a->gout;
  const float alpha = a->gout_scale ? *a->gout_scale : 1.0f; /* the products' alpha: the CPU's memory is the host's */
  if (a->gx && apex__gemm(&a->ws, m, k, n, alpha, mat_f32(go, n, 0), mat(a->w, 0, k, 0), a->accumulate_x ? 1.0f : 0.0f, a->gx,
                          APEX_F32, k, NULL) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  if (a->gw && apex__gemm(&a->ws, n, k, m, alpha, mat_f32(go, n, 1), mat(a->x, 0, k, 0), a->accumulate_w ? 1.0f : 0.0f, a->gw,
                          APEX_F32, k, NULL) != APEX_OK)
    return APEX_ERR_OUT_OF_MEMORY;
  if (a->gb) colsums_into(a->gb, go, (size_t)m, (size_t)n, a->accumulate_b);
  return APEX_OK;
}
