/* attention.c: the CPU backend's causal scaled-dot-product attention (args_nn.h), forward and
 * backward. Heads run one after another, each product on the library's threads in apex__sgemm's
 * fixed grid. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"

apex_status apex__cpu_nn_attention(const apex_nn_attention_args *a) {
  int t = a->t, d = a->d;
  size_t tt = (size_t)t * t, td = (size_t)t * d;
  const float *Q = a->q, *K = a->k, *V = a->v;
  float *P = a->p, *o = a->out;
  float scale = 1.0f / sqrtf((float)d);
  for (size_t h = 0; h < a->heads; h++) {
    float *ph = P + h * tt;
    apex__sgemm(0, 1, t, t, d, scale, Q + h * td, d, K + h * td, d, 0.0f, ph, t);
    for (int i = 0; i < t; i++) {
      float *row = ph + (size_t)i * t, mx = -INFINITY, s = 0.0f;
      for (int j = 0; j <= i; j++) mx = fmaxf(mx, row[j]);
      for (int j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
      for (int j = 0; j <= i; j++) row[j] /= s;
      for (int j = i + 1; j < t; j++) row[j] = 0.0f;
    }
    apex__sgemm(0, 0, t, d, t, 1.0f, ph, t, V + h * td, d, 0.0f, o + h * td, d);
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_attention_bwd(const apex_nn_attention_bwd_args *a) {
  int t = a->t, d = a->d;
  size_t tt = (size_t)t * t, td = (size_t)t * d, n = a->heads * td;
  const float *Q = a->q, *K = a->k, *V = a->v, *P = a->p, *go = a->gout;
  float *gq = a->gq, *gk = a->gk, *gv = a->gv, *dS = a->workspace;
  /* the products add into their gradients (beta 1): one that holds nothing yet is zeroed first */
  if (gq && !a->accumulate_q) memset(gq, 0, n * sizeof *gq);
  if (gk && !a->accumulate_k) memset(gk, 0, n * sizeof *gk);
  if (gv && !a->accumulate_v) memset(gv, 0, n * sizeof *gv);
  float scale = 1.0f / sqrtf((float)d);
  for (size_t h = 0; h < a->heads; h++) {
    const float *ph = P + h * tt, *gh = go + h * td;
    if (gv) apex__sgemm(1, 0, t, d, t, 1.0f, ph, t, gh, d, 1.0f, gv + h * td, d);
    if (!gq && !gk) continue;
    apex__sgemm(0, 1, t, t, d, 1.0f, gh, d, V + h * td, d, 0.0f, dS, t);
    for (int i = 0; i < t; i++) {
      float *row = dS + (size_t)i * t;
      const float *pr = ph + (size_t)i * t;
      float s = 0.0f;
      for (int j = 0; j <= i; j++) s += row[j] * pr[j];
      for (int j = 0; j < t; j++) row[j] = j <= i ? pr[j] * (row[j] - s) * scale : 0.0f;
    }
    if (gq) apex__sgemm(0, 0, t, d, t, 1.0f, dS, t, K + h * td, d, 1.0f, gq + h * td, d);
    if (gk) apex__sgemm(1, 0, t, d, t, 1.0f, dS, t, Q + h * td, d, 1.0f, gk + h * td, d);
  }
  return APEX_OK;
}
