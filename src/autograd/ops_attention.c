/* ops_attention.c: the front of causal scaled-dot-product attention: autocast, shape checks,
 * recording; the kernel is the backend's (backend/args_nn.h; the CPU's in backend/cpu/attention.c).
 * q, k, v go to the kernel as stored (no widened copies), and its result is written in the op's dtype.
 * q, k, v are contiguous [..., T, D] (apex_causal_attention: the kernel sees batch = the leading
 * extents, one head each, rows of D) or [..., T, H * D] (apex_causal_attention_heads: H heads side by
 * side in each row, read in place with a row stride of H * D, as the linears that make q, k and v write
 * them, so no permute copies them), or packed in one [..., T, 3 * H * D] (apex_causal_attention_qkv: q,
 * k and v the thirds of each row, as one joint q/k/v linear writes them; one recorded input, whose
 * gradient's thirds the backward writes). The forward keeps each query row's (max, 1 / sum) ([batch, H,
 * T, 2] f32) in the op's scratch; the backward recomputes P from them (args_nn.h). The kernel sees the
 * same elements in the same order either way, so the packed form has the bits of the three-input one. */
#include "autograd/ag.h"

/* Records the attention of q, k, v whose rows of heads * d hold the heads side by side (heads = 1: one
 * head a row, the [..., T, D] layout), t rows a sequence, batch sequences; fn names the call. packed:
 * q is [..., T, 3 * heads * d] holding q, k and v as the thirds of each row (k, v NULL). */
static apex_var *attention(apex_graph *g, apex_var *q, apex_var *k, apex_var *v, int n_heads, int packed, const char *fn) {
  apex_var *in[3] = {q, k, v}, *u[3];
  apex_dtype dt;
  const int n_in = packed ? 1 : 3;
  if (apex__dispatch(g, APEX_OP_ATTENTION, n_in, in, 0, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *Q = u[0]->value;
  if (packed) {
    if (Q->ndim < 2 || Q->shape[Q->ndim - 1] % 3 != 0)
      return apex__fail_null(APEX_ERR_SHAPE, "%s: qkv %s must be [..., T, 3 * heads * D] (q, k and v side by side in each row)", fn,
                             apex__shape(q));
  } else if (Q->ndim < 2 || !apex_tensor_same_shape(Q, u[1]->value) || !apex_tensor_same_shape(Q, u[2]->value)) {
    return apex__fail_null(APEX_ERR_SHAPE, "%s: q %s, k %s, v %s must have one shape [..., T, %s]", fn, apex__shape(q), apex__shape(k),
                           apex__shape(v), n_heads > 1 ? "heads * D" : "D");
  }
  const int64_t row = Q->shape[Q->ndim - 1] / (packed ? 3 : 1); /* q's part of a row: heads * D */
  if (n_heads < 1 || row % n_heads != 0)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: %d heads do not divide the rows of %lld in %s %s", fn, n_heads, (long long)row,
                           packed ? "each third of qkv" : "q", apex__shape(q));
  size_t batch = 1;
  for (int i = 0; i < Q->ndim - 2; i++) batch *= (size_t)Q->shape[i];
  const int t = (int)Q->shape[Q->ndim - 2], d = (int)(row / n_heads);
  const apex_backend *be = apex__ag_backend(u[0], APEX_OP_ATTENTION);
  if (!be || !AG_HAS(be, nn_attention, APEX_OP_ATTENTION)) return NULL;
  int64_t shape[APEX_MAX_DIMS];
  for (int i = 0; i < Q->ndim - 1; i++) shape[i] = Q->shape[i];
  shape[Q->ndim - 1] = row;
  apex_var *out = apex__result(g, APEX_OP_ATTENTION, dt, Q->ndim, shape, n_in, u);
  if (!out) return NULL;
  float *stats = apex__scratch(g, ag_nz(batch * (size_t)n_heads * (size_t)t * 2) * sizeof(float));
  if (!stats) return NULL;
  out->aux = stats;
  out->p.attention.batch = batch, out->p.attention.heads = n_heads, out->p.attention.t = t, out->p.attention.d = d;
  apex_nn_buf qb = ag_buf(u[0]->value), kb = packed ? qb : ag_buf(u[1]->value), vb = packed ? qb : ag_buf(u[2]->value);
  size_t ld = (size_t)row, ldi = packed ? 3 * ld : ld, es = apex_dtype_size(qb.dtype);
  if (packed) kb.data = (const char *)qb.data + ld * es, vb.data = (const char *)qb.data + 2 * ld * es;
  if (be->nn_attention(&(apex_nn_attention_args){.batch = batch, .heads = n_heads, .t = t, .d = d, .q = qb, .k = kb, .v = vb,
                                                 .ld_q = ldi, .ld_k = ldi, .ld_v = ldi, .ld_out = ld, .stats = stats,
                                                 .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype,
                                                 .ws = apex__ag_workspace(g)}) != APEX_OK)
    return NULL;
  return out;
}

apex_var *apex_causal_attention(apex_graph *g, apex_var *q, apex_var *k, apex_var *v) {
  return attention(g, q, k, v, 1, 0, "causal_attention");
}

apex_var *apex_causal_attention_heads(apex_graph *g, apex_var *q, apex_var *k, apex_var *v, int n_heads) {
  return attention(g, q, k, v, n_heads, 0, "causal_attention_heads");
}

apex_var *apex_causal_attention_qkv(apex_graph *g, apex_var *qkv, int n_heads) {
  return attention(g, qkv, NULL, NULL, n_heads, 1, "causal_attention_qkv");
}

/* A packed op (one input) reads q, k, v and writes their gradients as the thirds of its input's rows. */
apex_status apex__bwd_attention(apex_graph *g, apex_var *out) {
  const apex_backend *be = apex__ag_backend(out, APEX_OP_ATTENTION);
  if (!be || !AG_HAS(be, nn_attention_bwd, APEX_OP_ATTENTION)) return apex_last_status();
  const int packed = out->n_in == 1;
  apex_var *vq = out->in[0], *vk = packed ? vq : out->in[1], *vv = packed ? vq : out->in[2];
  const size_t batch = out->p.attention.batch;
  const int heads = out->p.attention.heads, t = out->p.attention.t, d = out->p.attention.d;
  size_t ld = (size_t)heads * (size_t)d, ldi = packed ? 3 * ld : ld, es = apex_dtype_size(vq->value->dtype);
  apex_nn_buf qb = ag_buf(vq->value), kb = ag_buf(vk->value), vb = ag_buf(vv->value);
  /* the packed input's gradient is written whole by the three (fresh: a kernel may write it directly) */
  int fresh = 0;
  apex_dtype tq, tk, tv;
  char *gq = packed ? apex__gbuf_w_any(g, vq, &fresh, &tq) : apex__gbuf_any(g, vq, &tq);
  size_t gs = apex_dtype_size(tq);
  char *gk = packed ? (gq ? gq + ld * gs : NULL) : apex__gbuf_any(g, vk, &tk);
  char *gv = packed ? (gq ? gq + 2 * ld * gs : NULL) : apex__gbuf_any(g, vv, &tv);
  if (packed) tk = tv = tq;
  if (packed) kb.data = (const char *)qb.data + ld * es, vb.data = (const char *)qb.data + 2 * ld * es;
  return be->nn_attention_bwd(&(apex_nn_attention_bwd_args){
      .batch = batch, .heads = heads, .t = t, .d = d, .q = qb, .k = kb, .v = vb, .ld_q = ldi, .ld_k = ldi, .ld_v = ldi,
      .out = apex_tensor_data(out->value), .out_dtype = out->value->dtype, .ld_out = ld, .stats = out->aux, .gout = out->gbuf,
      .ld_gout = ld, .gq = gq, .gk = gk, .gv = gv, .gout_dtype = out->gdt, .gq_dtype = tq, .gk_dtype = tk, .gv_dtype = tv, .ld_gq = ldi,
      .ld_gk = ldi, .ld_gv = ldi, .accumulate_q = !fresh, .accumulate_k = !fresh, .accumulate_v = !fresh, .ws = apex__ag_workspace(g)});
}
