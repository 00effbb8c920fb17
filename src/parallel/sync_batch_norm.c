/* sync_batch_norm.c: SyncBatchNorm as the statistics hook of batch norm, and the model converter.
 *
 * The op and its backward are autograd's (apex__batch_norm_hooked in src/autograd/ops_norm.c); this
 * file gives it the process group's two collectives: forward's global per-channel statistics
 * (apex_syncbn_stats: every rank's counts, means and M2 merged in rank order) and backward's
 * all-reduce of the 2C per-channel sums of dy and dy * xhat (deterministic rank order). */
#include "apex/ddp.h"
#include "autograd/ag.h"
#include "nn/nn_internal.h"

static apex_status pg_stats(void *ctx, const apex_tensor *x, apex_tensor *mean, apex_tensor *invstd, apex_tensor *unbiased_var, float eps,
                            int64_t *count) {
  return apex_syncbn_stats((apex_pg *)ctx, x, mean, invstd, unbiased_var, eps, count);
}

static apex_status pg_reduce(void *ctx, apex_tensor *sums) { return apex_pg_allreduce((apex_pg *)ctx, sums, APEX_REDUCE_SUM); }

static apex__bn_stats_hook pg_hook(apex_pg *pg) { return (apex__bn_stats_hook){pg_stats, pg_reduce, pg}; }

apex_var *apex_sync_batch_norm(apex_graph *g, apex_pg *pg, apex_var *x, apex_var *weight, apex_var *bias, apex_tensor *running_mean,
                               apex_tensor *running_var, const apex_batch_norm_options *opts) {
  if (!pg) return apex__fail_null(APEX_ERR_INVALID_ARG, "sync_batch_norm: pg is NULL");
  apex__bn_stats_hook hook = pg_hook(pg);
  return apex__batch_norm_hooked(g, &hook, x, weight, bias, running_mean, running_var, opts);
}

apex_status apex_convert_sync_batchnorm(apex_model *m, apex_pg *pg, int *count) {
  if (count) *count = 0;
  if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "apex_convert_sync_batchnorm: model is NULL");
  for (size_t i = 0; i < m->n_modules; i++) {
    apex_module *mod = m->modules[i];
    if (mod->kind != NN_BATCH_NORM1D && mod->kind != NN_BATCH_NORM2D) continue;
    mod->bn_hook = pg ? pg_hook(pg) : (apex__bn_stats_hook){0};
    if (count) (*count)++;
  }
  return APEX_OK;
}
