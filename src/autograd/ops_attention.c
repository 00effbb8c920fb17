/* ops_attention.c: the front of causal scaled-dot-product attention: autocast, shape checks,
 * recording; the kernel is the backend's (backend/args_nn.h; the CPU's in backend/cpu/attention.c).
 * q, k, v go to the kernel as stored (no widened copies), and its result is written in the op's dtype.
 * q, k, v are contiguous [..., T, D]: the kernel sees batch = the leading extents, one head each, rows
 * of D. The forward keeps each query row's (max, 1 / sum) ([batch, T, 2] f32) in the op's scratch;
 * the backward recomputes P from them (args_nn.h). */
#include "autograd/ag.h"

typedef struct att_dims {
  size_t heads;
  int t, d;
} att_dims;

static att_dims dims_of(const apex_tensor *q) {
  att_dims a;
  a.t = (int)q->shape[q->ndim - 2];
  a.d = (int)q->shape[q->ndim - 1];
  a.heads = 1;
  for (int i = 0; i < q->ndim - 2; i++) a.heads *= (size_t)q->shape[i];
  return a;
}

apex_var *apex_causal_attention(apex_graph *g, apex_var *q, apex_var *k, apex_var *v) {
  apex_var *in[3] = {q, k, v}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_ATTENTION, 3, in, 0, u, &dt) != APEX_OK) return NULL;
  if (u[0]->value->ndim < 2 || !apex_tensor_same_shape(u[0]->value, u[1]->value) || !apex_tensor_same_shape(u[0]->value, u[2]->value))
    return apex__fail_null(APEX_ERR_SHAPE, "causal_attention: q %s, k %s, v %s must have one shape [..., T, D]", apex__shape(q), apex__shape(k),
                           apex__shape(v));
  att_dims a = dims_of(u[0]->value);
  const apex_backend *be = apex__ag_backend(u[0], APEX_OP_ATTENTION);
  if (!be || !AG_HAS(be, nn_attention, APEX_OP_ATTENTION)) return NULL;
  apex_var *out = apex__result(g, APEX_OP_ATTENTION, dt, u[0]->value->ndim, u[0]->value->shape, 3, u);
  if (!out) return NULL;
  float *stats = apex__scratch(g, ag_nz(a.heads * (size_t)a.t * 2) * sizeof(float));
  if (!stats) return NULL;
  out->aux = stats;
  size_t ld = (size_t)a.d;
  if (be->nn_attention(&(apex_nn_attention_args){.batch = a.heads, .heads = 1, .t = a.t, .d = a.d, .q = ag_buf(u[0]->value),
                                                 .k = ag_buf(u[1]->value), .v = ag_buf(u[2]->value), .ld_q = ld, .ld_k = ld, .ld_v = ld,
                                                 .ld_out = ld, .stats = stats, .out = apex_tensor_data(out->value),
                                                 .out_dtype = out->value->dtype, .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_status apex__bwd_attention(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_ATTENTION);
  if (!be || !AG_HAS(be, nn_attention_bwd, APEX_OP_ATTENTION)) return apex_last_status();
  att_dims a = dims_of(out->value);
  float *gq = apex__gbuf(g, out->in[0]), *gk = apex__gbuf(g, out->in[1]), *gv = apex__gbuf(g, out->in[2]);
  size_t ld = (size_t)a.d;
  return be->nn_attention_bwd(&(apex_nn_attention_bwd_args){
      .batch = a.heads, .heads = 1, .t = a.t, .d = a.d, .q = ag_buf(out->in[0]->value), .k = ag_buf(out->in[1]->value),
      .v = ag_buf(out->in[2]->value), .ld_q = ld, .ld_k = ld, .ld_v = ld, .out = apex_tensor_data(out->value),
      .out_dtype = out->value->dtype, .ld_out = ld, .stats = out->aux, .gout = out->gbuf, .ld_gout = ld, .gq = gq, .gk = gk, .gv = gv,
      .ld_gq = ld, .ld_gk = ld, .ld_gv = ld, .accumulate_q = 1, .accumulate_k = 1, .accumulate_v = 1, .ws = apex__ag_workspace(g)});
}
