/* sync_batch_norm.c: SyncBatchNorm as the statistics hook of batch norm, and the model converter.
 *
 * The op and its backward are autograd's (apex__batch_norm_hooked in src/autograd/ops_norm.c); this
 * file gives it the process group's two collectives: forward's global per-channel statistics
 * (apex_syncbn_stats: every rank's counts, means and M2 merged in rank order) and backward's
 * all-reduce of the 2C per-channel sums of dy and dy * xhat (deterministic rank order). A graph on
 * another device than the collectives' has its tensors copied across and back. */
#include "apex/ddp.h"
#include "autograd/ag.h"
#include "nn/nn_internal.h"

/* A tensor like t on `device`: t itself when it is there, else a new one holding t's values (copy set)
 * or zeros; NULL after a message. */
static apex_tensor *staged(const apex_tensor *t, apex_device device, int copy) {
  if (apex_tensor_device(t) == device) return (apex_tensor *)t;
  apex_tensor *s = apex_tensor_create_on(device, apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (s && copy && apex_tensor_copy(s, t) != APEX_OK) {
    apex_tensor_destroy(s);
    return NULL;
  }
  return s;
}

/* Copies a staged tensor's values back to its original (when they differ) and frees it. */
static apex_status unstage(apex_tensor *orig, apex_tensor *s, apex_status st) {
  if (!s || s == orig) return st;
  if (st == APEX_OK) st = apex_tensor_copy(orig, s);
  apex_tensor_destroy(s);
  return st;
}

/* The statistics hook. apex_syncbn_stats reduces on the host, so a batch norm on a device graph has its
 * x staged there and its statistics copied back into the graph's tensors (both copies wait for the
 * device); on a CPU graph nothing is copied. */
static apex_status pg_stats(void *ctx, const apex_tensor *x, apex_tensor *mean, apex_tensor *invstd, apex_tensor *unbiased_var, float eps,
                            int64_t *count) {
  apex_tensor *hx = staged(x, APEX_DEVICE_CPU, 1), *hm = hx ? staged(mean, APEX_DEVICE_CPU, 0) : NULL;
  apex_tensor *hi = hm ? staged(invstd, APEX_DEVICE_CPU, 0) : NULL;
  apex_tensor *hv = hi && unbiased_var ? staged(unbiased_var, APEX_DEVICE_CPU, 0) : NULL;
  apex_status st = !hx || !hm || !hi || (unbiased_var && !hv) ? apex_last_status()
                                                               : apex_syncbn_stats((apex_pg *)ctx, hx, hm, hi, hv, eps, count);
  if (hx != x) apex_tensor_destroy(hx);
  st = unstage(mean, hm, st);
  st = unstage(invstd, hi, st);
  return unstage(unbiased_var, hv, st);
}

/* The backward's all-reduce, on the process group's device: sums from a graph on another device goes
 * there and back. */
static apex_status pg_reduce(void *ctx, apex_tensor *sums) {
  apex_pg *pg = ctx;
  apex_tensor *s = staged(sums, apex_pg_device(pg), 1);
  if (!s) return apex_last_status();
  return unstage(sums, s, apex_pg_allreduce(pg, s, APEX_REDUCE_SUM));
}

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
