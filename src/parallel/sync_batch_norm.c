/* sync_batch_norm.c: the SyncBatchNorm op (APEX_OP_SYNC_BATCH_NORM) and the model converter.
 *
 * The op follows the op-file pattern of src/autograd (ag.h) but lives here because it communicates:
 * autograd may not depend on the parallel layer. Forward takes the global per-channel statistics
 * from apex_syncbn_stats; backward sums dy and dy * xhat per channel locally (f64), all-reduces the
 * 2C sums (deterministic rank order) and forms the input gradient as apex_syncbn_backward_input
 * documents. The var keeps the statistics as pool tensors in ext[0..1] and the group in aux. */
#include <math.h>

#include "apex/ddp.h"
#include "autograd/ag.h"
#include "nn/nn_internal.h"

apex_var *apex_sync_batch_norm(apex_graph *g, apex_pg *pg, apex_var *x, apex_var *weight, apex_var *bias, apex_tensor *running_mean,
                               apex_tensor *running_var, const apex_batch_norm_options *opts) {
  static const apex_batch_norm_options defaults = {0};
  if (!opts) opts = &defaults;
  if (!pg) return apex__fail_null(APEX_ERR_INVALID_ARG, "sync_batch_norm: pg is NULL");
  if (opts->relu) return apex__fail_null(APEX_ERR_UNSUPPORTED, "sync_batch_norm: relu is not fused here; apply apex_relu to the result");
  apex_var *in[3] = {x, weight, bias}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_SYNC_BATCH_NORM, 3, in, 6u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value;
  if (X->ndim < 2 || X->ndim > 4)
    return apex__fail_null(APEX_ERR_SHAPE, "sync_batch_norm: input %s must be [N, C], [N, C, L] or [N, C, H, W]", apex__shape(x));
  int64_t Ci = X->shape[1];
  size_t N = (size_t)X->shape[0], C = (size_t)Ci, S = X->numel / ag_nz(N * C);
  for (int i = 1; i < 3; i++)
    if (u[i] && (u[i]->value->ndim != 1 || (size_t)u[i]->value->shape[0] != C))
      return apex__fail_null(APEX_ERR_SHAPE, "sync_batch_norm: %s %s does not match the %zu channels of input %s", i == 1 ? "weight" : "bias",
                             apex__shape(in[i]), C, apex__shape(x));
  const apex_tensor *stats[2] = {running_mean, running_var};
  for (int i = 0; i < 2; i++)
    if (stats[i] && (stats[i]->dtype != APEX_F32 || stats[i]->numel != C))
      return apex__fail_null(APEX_ERR_SHAPE, "sync_batch_norm: %s must be f32 with %zu elements", i ? "running_var" : "running_mean", C);
  float mom = 0.0f, eps = 0.0f;
  if (apex__bn_options(opts, "sync_batch_norm", &mom, &eps) != APEX_OK) return NULL;
  apex_tensor *mean = apex__pool_tensor(g, APEX_F32, 1, &Ci), *invstd = apex__pool_tensor(g, APEX_F32, 1, &Ci);
  apex_tensor *uvar = apex__pool_tensor(g, APEX_F32, 1, &Ci);
  if (!mean || !invstd || !uvar) return NULL;
  int64_t total = 0;
  if (apex_syncbn_stats(pg, X, mean, invstd, uvar, eps, &total) != APEX_OK) return NULL;
  apex_var *out = apex__result(g, APEX_OP_SYNC_BATCH_NORM, X->dtype, X->ndim, X->shape, 3, u);
  if (!out) return NULL;
  const float *xf = apex__f32(g, X), *wf = u[1] ? apex__f32(g, u[1]->value) : NULL, *bf = u[2] ? apex__f32(g, u[2]->value) : NULL;
  float *o = apex__out_f32(g, out);
  if (!xf || !o || (u[1] && !wf) || (u[2] && !bf)) return NULL;
  const float *mf = ag_data(mean), *rf = ag_data(invstd), *vf = ag_data(uvar);
  float *rm = running_mean ? ag_data(running_mean) : NULL, *rv = running_var ? ag_data(running_var) : NULL;
  out->ext[0] = mean;
  out->ext[1] = invstd;
  out->aux = pg;
  out->ia[0] = total;
  out->ia[1] = (int64_t)C;
  out->ia[2] = (int64_t)S;
#pragma omp parallel for schedule(static) if (X->numel > AG_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mf[c]);
    if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * vf[c]);
    float m = mf[c], r = rf[c], w = wf ? wf[c] : 1.0f, b = bf ? bf[c] : 0.0f;
    apex__bn_normalize_channel(xf, o, N, C, S, c, m, r, w, b, 0);
  }
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_sync_batch_norm(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  int64_t total = out->ia[0];
  size_t C = (size_t)out->ia[1], S = (size_t)out->ia[2], N = ag_numel(out) / ag_nz(C * S);
  apex_pg *pg = out->aux;
  const float *xf = apex__f32(g, out->in[0]->value), *wf = out->in[1] ? apex__f32(g, out->in[1]->value) : NULL;
  const float *mf = ag_data(out->ext[0]), *rf = ag_data(out->ext[1]), *go = out->gbuf;
  int64_t two_c = (int64_t)(2 * C);
  apex_tensor *sums = apex__pool_tensor(g, APEX_F32, 1, &two_c);
  if (!xf || (out->in[1] && !wf) || !sums) return APEX_ERR_OUT_OF_MEMORY;
  float *sd = ag_data(sums);
#pragma omp parallel for schedule(static) if (ag_numel(out) > AG_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    double sg = 0, sgx = 0;
    for (size_t n = 0; n < N; n++)
      for (size_t i = 0; i < S; i++) {
        size_t j = (n * C + c) * S + i;
        sg += go[j];
        sgx += go[j] * (xf[j] - mf[c]) * rf[c];
      }
    sd[c] = (float)sg;
    sd[C + c] = (float)sgx;
    if (gb) gb[c] += (float)sg; /* this rank's share: DDP sums or averages it with the others' */
    if (gw) gw[c] += (float)sgx;
  }
  if (!gx) return APEX_OK; /* the input needs no gradient on any rank (same graph everywhere) */
  apex_status st = apex_pg_allreduce(pg, sums, APEX_REDUCE_SUM);
  if (st != APEX_OK) return st;
  float inv_total = 1.0f / (float)total;
#pragma omp parallel for schedule(static) if (ag_numel(out) > AG_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    float m = mf[c], r = rf[c], a = (wf ? wf[c] : 1.0f) * r, mg = sd[c] * inv_total, mgx = sd[C + c] * inv_total;
    for (size_t n = 0; n < N; n++)
      for (size_t i = 0; i < S; i++) {
        size_t j = (n * C + c) * S + i;
        gx[j] += a * (go[j] - mg - (xf[j] - m) * r * mgx);
      }
  }
  return APEX_OK;
}

static apex_var *sbn_forward(void *ctx, apex_graph *g, apex_var *x, apex_var *w, apex_var *b, apex_tensor *rm, apex_tensor *rv,
                             const apex_batch_norm_options *o) {
  return apex_sync_batch_norm(g, (apex_pg *)ctx, x, w, b, rm, rv, o);
}

apex_status apex_convert_sync_batchnorm(apex_model *m, apex_pg *pg, int *count) {
  if (count) *count = 0;
  if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "apex_convert_sync_batchnorm: model is NULL");
  for (size_t i = 0; i < m->n_modules; i++) {
    apex_module *mod = m->modules[i];
    if (mod->kind != NN_BATCH_NORM1D && mod->kind != NN_BATCH_NORM2D) continue;
    mod->bn_forward = pg ? sbn_forward : NULL;
    mod->bn_ctx = pg;
    if (count) (*count)++;
  }
  return APEX_OK;
}
