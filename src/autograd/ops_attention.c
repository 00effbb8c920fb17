/* ops_attention.c: the front of causal scaled-dot-product attention: autocast, shape checks,
 * recording; the kernel is the backend's (backend/args_nn.h; the CPU's in backend/cpu/attention.c).
 * q, k, v go to the kernel as stored (no widened copies), and its result is written in the op's dtype.
 * q, k, v are contiguous [..., T, D] (apex_causal_attention: the kernel sees batch = the leading
 * extents, one head each, rows of D) or [..., T, H * D] (apex_causal_attention_heads: H heads side by
 * side in each row, read in place with a row stride of H * D, as the linears that make q, k and v write
 * them, so no permute copies them). The forward keeps each query row's (max, 1 / sum) ([batch, H, T, 2]
 * f32) in the op's scratch; the backward recomputes P from them (args_nn.h). */
#include "autograd/ag.h"

/* Records the attention of q, k, v whose rows of heads * d hold the heads side by side (heads = 1: one
 * head a row, the [..., T, D] layout), t rows a sequence, batch sequences; fn names the call. */
static apex_var *attention(apex_graph *g, apex_var *q, apex_var *k, apex_var *v, int n_heads, const char *fn) {
  apex_var *in[3] = {q, k, v}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_ATTENTION, 3, in, 0, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *Q = u[0]->value;
  if (Q->ndim < 2 || !apex_tensor_same_shape(Q, u[1]->value) || !apex_tensor_same_shape(Q, u[2]->value))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: q %s, k %s, v %s must have one shape [..., T, %s]", fn, apex__shape(q), apex__shape(k),
                           apex__shape(v), n_heads > 1 ? "heads * D" : "D");
  const int64_t row = Q->shape[Q->ndim - 1];
  if (n_heads < 1 || row % n_heads != 0)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: %d heads do not divide the rows of %lld in q %s", fn, n_heads, (long long)row, apex__shape(q));
  size_t batch = 1;
  for (int i = 0; i < Q->ndim - 2; i++) batch *= (size_t)Q->shape[i];
  const int t = (int)Q->shape[Q->ndim - 2], d = (int)(row / n_heads);
  const apex_backend *be = apex__ag_backend(u[0], APEX_OP_ATTENTION);
  if (!be || !AG_HAS(be, nn_attention, APEX_OP_ATTENTION)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_ATTENTION, dt, Q->ndim, Q->shape, 3, u);
  if (!out) return NULL;
  float *stats = apex__scratch(g, ag_nz(batch * (size_t)n_heads * (size_t)t * 2) * sizeof(float));
  if (!stats) return NULL;
  out->aux = stats;
  out->p.attention.batch = batch, out->p.attention.heads = n_heads, out->p.attention.t = t, out->p.attention.d = d;
  size_t ld = (size_t)row;
  if (be->nn_attention(&(apex_nn_attention_args){.batch = batch, .heads = n_heads, .t = t, .d = d, .q = ag_buf(u[0]->value),
                                                 .k = ag_buf(u[1]->value), .v = ag_buf(u[2]->value), .ld_q = ld, .ld_k = ld, .ld_v = ld,
                                                 .ld_out = ld, .stats = stats, .out = apex_tensor_data(out->value),
                                                 .out_dtype = out->value->dtype, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_causal_attention(apex_graph *g, apex_var *q, apex_var *k, apex_var *v) {
  return attention(g, q, k, v, 1, "causal_attention");
}

apex_var *apex_causal_attention_heads(apex_graph *g, apex_var *q, apex_var *k, apex_var *v, int n_heads) {
  return attention(g, q, k, v, n_heads, "causal_attention_heads");
}

apex_status apex__bwd_attention(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_ATTENTION);
  if (!be || !AG_HAS(be, nn_attention_bwd, APEX_OP_ATTENTION)) return apex_last_status();
  float *gq = apex__gbuf(g, out->in[0]), *gk = apex__gbuf(g, out->in[1]), *gv = apex__gbuf(g, out->in[2]);
  const size_t batch = out->p.attention.batch;
  const int heads = out->p.attention.heads, t = out->p.attention.t, d = out->p.attention.d;
  size_t ld = (size_t)heads * (size_t)d;
  return be->nn_attention_bwd(&(apex_nn_attention_bwd_args){
      .batch = batch, .heads = heads, .t = t, .d = d, .q = ag_buf(out->in[0]->value), .k = ag_buf(out->in[1]->value),
      .v = ag_buf(out->in[2]->value), .ld_q = ld, .ld_k = ld, .ld_v = ld, .out = apex_tensor_data(out->value),
      .out_dtype = out->value->dtype, .ld_out = ld, .stats = out->aux, .gout = out->gbuf, .ld_gout = ld, .gq = gq, .gk = gk, .gv = gv,
      .ld_gq = ld, .ld_gk = ld, .ld_gv = ld, .accumulate_q = 1, .accumulate_k = 1, .accumulate_v = 1, .ws = apex__ag_workspace(g)});
}
