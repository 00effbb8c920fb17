/* ddp.h: DistributedDataParallel and SyncBatchNorm for apex models (Apex's apex.parallel, in C).
 *
 *     apex_pg *pg = apex_pg_create(NULL);
 *     ... build the model (the same on every rank); apex_amp_initialize if amp is used ...
 *     apex_convert_sync_batchnorm(model, pg);            optional: batch norm over every rank's batch
 *     apex_ddp *ddp = apex_ddp_create(pg, model, NULL);  checks the models agree, broadcasts rank 0's
 *     apex_ddp_attach(ddp, g);                           all-reduces buckets during backward
 *     for (...) {
 *       loss = ...forward on this rank's shard...;
 *       apex_backward(loss, NULL);                       buckets are posted as their grads become final
 *       apex_ddp_finish(ddp);                            waits; the grads are now the average over ranks
 *       optimizer step; zero grads; apex_graph_reset(g);
 *     }
 *
 * With amp, pass the DDP callbacks to apex_amp_backward, which calls them after the backward and
 * before unscaling, so the overflow check sees the reduced gradients and every rank skips the same
 * steps (the overflow flag is MAX-reduced too) and keeps the same loss scale:
 *
 *     apex_amp_backward_options bo = {.before_unscale = apex_ddp_amp_before_unscale,
 *                                     .reduce_overflow = apex_ddp_amp_reduce_overflow, .hook_ctx = ddp};
 *     apex_amp_backward(amp, loss, 0, &bo);   (no apex_ddp_finish of your own)
 *
 * Create the DDP after apex_amp_initialize: amp replaces the parameters' grad tensors when it casts
 * the model, and the DDP's Reducer keeps pointers to them.
 *
 * Gradient accumulation (Apex/PyTorch no_sync): apex_ddp_set_sync(ddp, 0) for the micro-batches whose
 * gradients should only accumulate locally, then 1 before the last micro-batch's backward: that one
 * reduces the accumulated sums.
 *
 * Every rank must run the same sequence of synced backwards and finishes (as with any collective).
 *
 * The pg must work on the model's device. apex models (autograd) live on the CPU, so a DDP runs over
 * the MPI or local group; the NCCL group (CUDA tensors only) refuses them. For gradients
 * on the GPU, use the Reducer (parallel.h) over the NCCL group directly. */
#ifndef APEX_DDP_H
#define APEX_DDP_H

#include "apex/autograd.h"
#include "apex/nn.h"
#include "apex/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_ddp apex_ddp;

/* Zero in any field means its default. */
typedef struct apex_ddp_options {
  size_t bucket_bytes;             /* 25 MiB (apex_reducer_options) */
  int sum_only;                    /* 1: sum the gradients; 0 (default): average them (gradient_average) */
  float gradient_predivide_factor; /* as apex_reducer_options (1.0) */
  int allreduce_always_fp32;       /* reduce f16/bf16 gradients in f32 buckets */
  int delay_allreduce;             /* 1: nothing during backward; apex_ddp_finish reduces everything */
  /* Apex's allreduce_trigger_params: parameters of the model after whose gradient a bucket ends (in
   * the order backward finishes them, reverse creation order; one open bucket per dtype), in place
   * of bucket_bytes, which is then ignored. Each listed bucket's all-reduce is posted as soon as its
   * gradients are final, as usual. Not with delay_allreduce (as in Apex). */
  apex_var *const *allreduce_trigger_params;
  int num_allreduce_trigger_params;
} apex_ddp_options;

/* A DDP over every parameter of m (collective). It checks that every rank has the same model
 * (apex_pg_check_consistent over the parameters' names, dtypes and shapes), copies rank 0's
 * parameters and buffers to every rank, and builds a Reducer over the parameters' grad tensors in
 * reverse creation order (the order backward finishes them), so buckets are cut and reduced in the
 * same order on every rank. NULL with a message (the same on every rank for models that differ)
 * for a NULL pg or m, a model without parameters, ranks whose models differ, or no memory; and
 * APEX_ERR_INVALID_ARG, before any communication, for allreduce_trigger_params with delay_allreduce,
 * a negative count, a NULL list with a positive count, or an entry that is not a parameter of m
 * (a program that passes the same options on every rank fails alike on every rank). Ranks whose
 * triggers cut other buckets are refused like models that differ. */
APEX_API apex_ddp *apex_ddp_create(apex_pg *pg, apex_model *m, const apex_ddp_options *options);
/* Waits for buckets in flight and frees the DDP (NULL is fine). Graphs it was attached to must have
 * their hook removed (apex_graph_set_grad_hook(g, NULL, NULL)) or be destroyed first. */
APEX_API void apex_ddp_destroy(apex_ddp *ddp);
/* Installs the DDP's grad hook on g (apex_graph_set_grad_hook): each bucket's all-reduce starts as
 * soon as its gradients are final. APEX_ERR_INVALID_ARG for NULL. */
APEX_API apex_status apex_ddp_attach(apex_ddp *ddp, apex_graph *g);
/* Ends the step after backward: reduces what was not started yet (everything with delay_allreduce,
 * and gradients the backward did not reach: they are reduced with their current value), waits for
 * every bucket and writes the reduced gradients back. Does nothing while sync is off. */
APEX_API apex_status apex_ddp_finish(apex_ddp *ddp);
/* 1 (default): backwards reduce; 0: gradients only accumulate (no_sync). Returns the previous value. */
APEX_API int apex_ddp_set_sync(apex_ddp *ddp, int sync);
/* Sets *flag to 1 on every rank when it was nonzero on any (a MAX all-reduce). */
APEX_API apex_status apex_ddp_allreduce_overflow(apex_ddp *ddp, int *flag);
/* The callbacks for apex_amp_backward_options (ctx is the apex_ddp). */
APEX_API apex_status apex_ddp_amp_before_unscale(void *ddp);
APEX_API apex_status apex_ddp_amp_reduce_overflow(void *ddp, int *flag);
/* The DDP's Reducer (borrowed), e.g. for its bucket count; NULL (with a message) for NULL. */
APEX_API apex_reducer *apex_ddp_reducer(const apex_ddp *ddp);

/* ---- SyncBatchNorm --------------------------------------------------------------------------------- */

/* Batch norm in training mode with statistics over every rank's batch (Apex's SyncBatchNorm):
 * apex_syncbn_stats in forward (ranks may have different batch sizes), and in backward the sums of
 * dy and dy * xhat all-reduced over ranks for the input gradient. The running statistics are updated
 * from the global statistics, so they stay identical on every rank. The weight and bias gradients
 * are this rank's share (as PyTorch's SyncBatchNorm): DDP's all-reduce combines them. Arguments as
 * apex_batch_norm (opts->training is ignored: always training); collective: every rank calls it. */
APEX_API apex_var *apex_sync_batch_norm(apex_graph *g, apex_pg *pg, apex_var *x, apex_var *weight, apex_var *bias,
                                        apex_tensor *running_mean, apex_tensor *running_var,
                                        const apex_batch_norm_options *opts);
/* Makes every BatchNorm1d/2d module of m use apex_sync_batch_norm over pg in training mode (PyTorch's
 * convert_sync_batchnorm); evaluation still uses the running statistics. pg NULL turns it back off.
 * Returns the number of modules converted (via *count, may be NULL). APEX_ERR_INVALID_ARG for NULL m. */
APEX_API apex_status apex_convert_sync_batchnorm(apex_model *m, apex_pg *pg, int *count);

#ifdef __cplusplus
}
#endif
#endif
