/* ops_attention.c: causal scaled-dot-product attention.
 *
 * For each of the B*H heads: S = q k^T / sqrt(D), masked above the diagonal, P = softmax(S) row by
 * row, O = P v. The forward keeps P ([heads, T, T], f32) for the backward:
 *   dV = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dP * P)) / sqrt(D), dQ = dS k, dK = dS^T q.
 * Heads run one after another, each GEMM on the library's threads. */
#include <math.h>

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
  apex_var *out = apex__result(g, APEX_OP_ATTENTION, dt, u[0]->value->ndim, u[0]->value->shape, 3, u);
  if (!out) return NULL;
  size_t tt = (size_t)a.t * a.t, td = (size_t)a.t * a.d;
  const float *Q = apex__f32(g, u[0]->value), *K = apex__f32(g, u[1]->value), *V = apex__f32(g, u[2]->value);
  float *P = apex__scratch(g, ag_nz(a.heads * tt) * sizeof(float)), *o = apex__out_f32(g, out);
  if (!Q || !K || !V || !P || !o) return NULL;
  out->aux = P;
  float scale = 1.0f / sqrtf((float)a.d);
  for (size_t h = 0; h < a.heads; h++) {
    float *ph = P + h * tt;
    apex__sgemm(0, 1, a.t, a.t, a.d, scale, Q + h * td, a.d, K + h * td, a.d, 0.0f, ph, a.t);
    for (int i = 0; i < a.t; i++) {
      float *row = ph + (size_t)i * a.t, mx = -INFINITY, s = 0.0f;
      for (int j = 0; j <= i; j++) mx = fmaxf(mx, row[j]);
      for (int j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
      for (int j = 0; j <= i; j++) row[j] /= s;
      for (int j = i + 1; j < a.t; j++) row[j] = 0.0f;
    }
    apex__sgemm(0, 0, a.t, a.d, a.t, 1.0f, ph, a.t, V + h * td, a.d, 0.0f, o + h * td, a.d);
  }
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_attention(apex_graph *g, apex_var *out) {
  att_dims a = dims_of(out->value);
  size_t tt = (size_t)a.t * a.t, td = (size_t)a.t * a.d;
  float *gq = apex__gbuf(g, out->in[0]), *gk = apex__gbuf(g, out->in[1]), *gv = apex__gbuf(g, out->in[2]);
  const float *Q = apex__f32(g, out->in[0]->value), *K = apex__f32(g, out->in[1]->value), *V = apex__f32(g, out->in[2]->value);
  float *dS = apex__scratch(g, ag_nz(tt) * sizeof(float));
  if (!Q || !K || !V || !dS) return APEX_ERR_OUT_OF_MEMORY;
  const float *P = out->aux, *go = out->gbuf;
  float scale = 1.0f / sqrtf((float)a.d);
  for (size_t h = 0; h < a.heads; h++) {
    const float *ph = P + h * tt, *gh = go + h * td;
    if (gv) apex__sgemm(1, 0, a.t, a.d, a.t, 1.0f, ph, a.t, gh, a.d, 1.0f, gv + h * td, a.d);
    if (!gq && !gk) continue;
    apex__sgemm(0, 1, a.t, a.t, a.d, 1.0f, gh, a.d, V + h * td, a.d, 0.0f, dS, a.t);
    for (int i = 0; i < a.t; i++) {
      float *row = dS + (size_t)i * a.t;
      const float *pr = ph + (size_t)i * a.t;
      float s = 0.0f;
      for (int j = 0; j <= i; j++) s += row[j] * pr[j];
      for (int j = 0; j < a.t; j++) row[j] = j <= i ? pr[j] * (row[j] - s) * scale : 0.0f;
    }
    if (gq) apex__sgemm(0, 0, a.t, a.d, a.t, 1.0f, dS, a.t, K + h * td, a.d, 1.0f, gq + h * td, a.d);
    if (gk) apex__sgemm(1, 0, a.t, a.d, a.t, 1.0f, dS, a.t, Q + h * td, a.d, 1.0f, gk + h * td, a.d);
  }
  return APEX_OK;
}
