/* ops_linear.c: the fronts of matmul and linear: autocast, shape checks, recording; the products are
 * the backend's (backend/args_nn.h; the CPU's in backend/cpu/linear.c on backend/cpu/gemm.c).
 * Operands and results stay in their own dtypes. */
#include "autograd/ag.h"

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
  const apex_backend *be = apex__ag_backend(u[0], APEX_OP_MATMUL);
  if (!be || !AG_HAS(be, nn_matmul, APEX_OP_MATMUL)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_MATMUL, dt, nd, shape, 2, u);
  if (!out) return NULL;
  if (be->nn_matmul(&(apex_nn_matmul_args){.batch = d.batch, .m = d.m, .n = d.n, .k = d.k, .a = ag_buf(u[0]->value), .b = ag_buf(u[1]->value),
                                           .b_batched = d.batch > 1, .out = apex_tensor_data(out->value), .out_dtype = dt,
                                           .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_status apex__bwd_matmul(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_MATMUL);
  if (!be || !AG_HAS(be, nn_matmul_bwd, APEX_OP_MATMUL)) return apex_last_status();
  mm_dims d;
  mm_plan(out->in[0]->value, out->in[1]->value, &d);
  float *ga = apex__gbuf(g, out->in[0]), *gb = apex__gbuf(g, out->in[1]);
  return be->nn_matmul_bwd(&(apex_nn_matmul_bwd_args){.batch = d.batch, .m = d.m, .n = d.n, .k = d.k, .a = ag_buf(out->in[0]->value),
                                                      .b = ag_buf(out->in[1]->value), .b_batched = d.batch > 1, .gout = out->gbuf, .ga = ga,
                                                      .gb = gb, .accumulate_a = 1, .accumulate_b = 1, .ws = apex__ag_workspace(g)});
}

/* ---- linear and linear + GELU ------------------------------------------------------------------ */

/* apex_linear (op LINEAR) and apex_linear_gelu (LINEAR_GELU): one front, the slot's gelu flag set for
 * the second, whose pre-activation is its aux: pool scratch kept for the backward when the op is
 * recorded, transient scratch otherwise (evaluation needs only the result). */
static apex_var *linear_op(apex_graph *g, apex_op op, apex_var *x, apex_var *w, apex_var *b) {
  apex_var *in[3] = {x, w, b}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, op, 3, in, 4u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value, *W = u[1]->value;
  if (X->ndim < 1 || W->ndim != 2 || X->shape[X->ndim - 1] != W->shape[1] ||
      (b && (u[2]->value->ndim != 1 || u[2]->value->shape[0] != W->shape[0])))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s, weight %s, bias %s do not fit (need x [..., in], w [out, in], b [out])",
                           apex_op_name(op), apex__shape(x), apex__shape(w), b ? apex__shape(b) : "none");
  int k = (int)W->shape[1], n = (int)W->shape[0];
  int m = (int)(X->numel / (size_t)ag_nz(k));
  int64_t shape[APEX_MAX_DIMS];
  for (int i = 0; i < X->ndim - 1; i++) shape[i] = X->shape[i];
  shape[X->ndim - 1] = n;
  const apex_backend *be = apex__ag_backend(u[0], op);
  if (!be || !AG_HAS(be, nn_linear, op)) return NULL;
  apex_var *out = apex__result(g, op, dt, X->ndim, shape, 3, u);
  if (!out) return NULL;
  void *pre = NULL;
  if (op == APEX_OP_LINEAR_GELU) {
    size_t bytes = ag_nz(out->value->numel) * apex_dtype_size(dt);
    pre = out->requires_grad ? apex__scratch(g, bytes) : apex__scratch_temp(g, bytes);
    if (!pre) return NULL;
    if (out->requires_grad) out->aux = pre;
  }
  if (be->nn_linear(&(apex_nn_linear_args){.m = m, .n = n, .k = k, .x = ag_buf(X), .w = ag_buf(W), .bias = ag_buf_of(b ? u[2] : NULL),
                                           .out = apex_tensor_data(out->value), .out_dtype = dt, .gelu = pre != NULL, .pre = pre,
                                           .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_linear(apex_graph *g, apex_var *x, apex_var *w, apex_var *b) { return linear_op(g, APEX_OP_LINEAR, x, w, b); }
apex_var *apex_linear_gelu(apex_graph *g, apex_var *x, apex_var *w, apex_var *b) { return linear_op(g, APEX_OP_LINEAR_GELU, x, w, b); }

/* How far back from a linear the peephole below looks for its linear_gelu input: the MLP's two products
 * are adjacent in a model's graph, and the look stays linear in the graph's size. */
#define DGELU_REACH 64

/* The linear_gelu h whose GELU backward the backward of linear `out` may take (args_nn.h's dgelu), or NULL.
 * Fused, out's product writes the gradient of h's pre-activation into h's gradient buffer and adds the
 * column sums of it to h's bias gradient; h's own backward then runs its products without GELU or bias.
 * That has the unfused bits when out's product is the whole of h's gradient and the bias gradient's terms
 * keep their order: h's buffer not begun (no op after out added to it: a graph var's gradient has no other
 * reader, no hook, no grad tensor) and no op between h and out reads h (it would add to h's gradient after
 * out) or h's bias (its term would land before the one moved ahead of it). */
static apex_var *dgelu_source(apex_graph *g, const apex_var *out) {
  apex_var *h = out->in[0];
  if (out->op != APEX_OP_LINEAR || !h || h->op != APEX_OP_LINEAR_GELU || h->graph != g || !h->requires_grad || !h->aux || h->gbuf ||
      out->in[1] == h || out->in[2] == h || out->at <= h->at || out->at - h->at > DGELU_REACH)
    return NULL;
  const apex_var *b = h->in[2];
  for (size_t i = h->at + 1; i < out->at; i++) {
    const apex_var *v = g->vars[i];
    for (int k = 0; k < v->n_in; k++)
      if (v->in[k] == h || (b && v->in[k] == b)) return NULL;
  }
  return h;
}

/* The weight's and input's first gradients need not be zeroed (apex__gbuf_w): the products write them. A
 * linear_gelu whose gradient buffer already holds its pre-activation's (gbuf_is_pre) runs the plain
 * products on it, its bias gradient already added. */
static apex_status linear_backward(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, out->op);
  if (!be || !AG_HAS(be, nn_linear_bwd, out->op)) return apex_last_status();
  const apex_tensor *X = out->in[0]->value, *W = out->in[1]->value;
  int k = (int)W->shape[1], n = (int)W->shape[0];
  int m = (int)(X->numel / (size_t)ag_nz(k));
  apex_var *h = dgelu_source(g, out);
  int fresh_x, fresh_w;
  apex_dtype tx;
  void *gx = apex__gbuf_w_any(g, out->in[0], &fresh_x, &tx);
  if (h && !fresh_x) h = NULL;
  float *gw = apex__gbuf_w(g, out->in[1], &fresh_w), *gb = out->gbuf_is_pre ? NULL : apex__gbuf(g, out->in[2]);
  float *dgb = h ? apex__gbuf(g, h->in[2]) : NULL;
  int gelu = out->op == APEX_OP_LINEAR_GELU && !out->gbuf_is_pre;
  apex_status st = be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = m, .n = n, .k = k, .x = ag_buf(X), .w = ag_buf(W), .gout = out->gbuf,
                                                               .gout_dtype = out->gdt, .gx = gx, .gx_dtype = tx, .gw = gw, .gb = gb,
                                                               .accumulate_x = !fresh_x, .accumulate_w = !fresh_w,
                                                               .accumulate_b = 1, .gelu = gelu,
                                                               .pre = {gelu ? out->aux : NULL, out->value->dtype},
                                                               .dgelu_pre = {h ? h->aux : NULL, h ? h->value->dtype : APEX_F32},
                                                               .dgelu_gb = dgb, .accumulate_dgelu_gb = 1,
                                                               .ws = apex__ag_workspace(g)});
  if (st == APEX_OK && h) h->gbuf_is_pre = 1;
  return st;
}

apex_status apex__bwd_linear(apex_graph *g, apex_var *out) { return linear_backward(g, out); }
apex_status apex__bwd_linear_gelu(apex_graph *g, apex_var *out) { return linear_backward(g, out); }
