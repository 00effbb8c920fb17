/* zero.h: a sharded optimizer over a process group (ZeRO stages 1 and 2; Apex's DistributedFusedAdam,
 * DeepSpeed's ZeRO, PyTorch's ZeroRedundancyOptimizer), for any of the ten fused optimizers.
 *
 *     apex_zero *z = apex_zero_create(pg, params, grads, n, APEX_OPTIM_ADAMW, &lr_etc, NULL);
 *     for (...) {
 *       ... forward and backward on this rank's batch: grads[i] hold this rank's gradients ...
 *       apex_zero_reduce_grads(z);                  reduce-scatter: this rank's shard, summed over ranks
 *       apex_zero_clip_grad_norm(z, 1.0f, scale, NULL);   optional: the global norm
 *       int overflow = 0;
 *       apex_zero_step(z, scale, &overflow);        steps the shard, all-gathers the parameters
 *     }
 *
 * The parameters are seen as one flat vector, params[n - 1] first (the order in which a backward
 * finishes their gradients, as DDP's buckets take them). Rank r owns one contiguous range of it
 * (apex_zero_shard_range), about 1/world of the elements: its f32 masters (for f16/bf16 parameters)
 * and optimizer state exist on rank r only, so a rank holds about 1/world of what an unsharded
 * optimizer holds. The ranges are balanced and cut at multiples of the multi-tensor tile (2048
 * elements) inside a parameter, so that each element meets the same kernel code as in an unsharded
 * step; for LAMB, NovoGrad and AdamP, whose update uses norms of the whole parameter, they are cut at
 * parameter boundaries only (the one nearest the balanced cut), and a rank may own none.
 *
 * The same bits as DistributedDataParallel (ddp.h): gradients are reduce-scattered with
 * apex_pg_reduce_scatter, which sums every element in the same rank order and arithmetic as the
 * all-reduce of DDP's Reducer, and divided by world_size as the Reducer does (unless sum_only); each
 * rank steps its shard with the kernels an unsharded optimizer runs on the same elements; the global
 * gradient norm (clipping, LAMB's max_grad_norm) is taken over the whole reduced gradients in the
 * same order. So a sharded step leaves the parameters bitwise where DDP followed by
 * apex_optimizer_step over the same parameters leaves them, at any number of ranks (MPI and local
 * groups; on NCCL the sums are NCCL's, as for DDP there).
 *
 * Stage 1: after apex_zero_reduce_grads the gradient tensors hold the whole reduced gradients, as
 * after DDP (a reduce-scatter and an all-gather: the traffic of one all-reduce). Stage 2: only this
 * rank's shard of the reduced gradient exists (inside z); the gradient tensors that autograd made are
 * released once reduce-scattered (keep_grads says how; they read as zeros, the next backward makes
 * them again), and the all-gather of gradients, which makes them whole again until the step, happens
 * only for LAMB with max_grad_norm (its step takes the norm of the whole gradients) or
 * apex_zero_gather_grads; clipping sums its global norm from every rank's shard instead.
 *
 * Memory besides the shard's masters and state, per gradient dtype: the shard of the reduced
 * gradients and one bucket (bucket_bytes) through which the collectives move the shards of every
 * rank, a chunk at a time, where DDP's Reducer keeps buckets of the whole model. The reduce-scatter
 * runs when apex_zero_reduce_grads is called, after the backward, or with overlap during it, bucket by
 * bucket as DDP's all-reduce does. The gradient tensors are the caller's: whole on every rank at stage
 * 1; at stage 2 with overlap a rank holds, during a backward, only those whose bucket has not started
 * (apex_zero_grad_bytes measures it).
 *
 * Every rank must call the same functions in the same order (they are collectives). The tensors are
 * borrowed and must outlive z. */
#ifndef APEX_ZERO_H
#define APEX_ZERO_H

#include <stddef.h>

#include "apex/autograd.h"
#include "apex/optim.h"
#include "apex/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_zero apex_zero;

/* Zero in any field means its default. */
typedef struct apex_zero_options {
  int stage;    /* 1 (default) or 2, see above */
  int sum_only; /* 1: sum the gradients over ranks; 0 (default): average them, as DDP */
  /* The values the f32 masters of f16/bf16 parameters start from: master_values[i] (f32, parameter i's
   * shape; entries of f32 parameters are not read) on every rank. NULL: the parameters widened. amp's
   * O2 keeps a model's exact f32 values from before its cast as masters: pass those (a copy of the
   * model taken before apex_amp_initialize) for a sharded run with the unsharded run's bits. */
  apex_tensor *const *master_values;
  /* 1: the step first unscales this rank's shard of the reduced gradients into f32 (g * (1 / grad_scale),
   * rounded to f32, as amp unscales into its master gradients) and then steps with the clipping
   * coefficient alone: the bits of a program whose amp manages the optimizer (apex_amp_step), at the
   * cost of one f32 shard of gradients. 0 (default): the kernel applies coef / grad_scale in one
   * multiply, the bits of apex_optimizer_step(opt, grad_scale, ...). The same at grad_scale 1. LAMB's
   * max_grad_norm takes (coef / grad_scale) in one multiply too, so under a loss scale other than 1
   * with clipping its global norm may differ from amp's in the last bit. */
  int amp_unscale;
  /* Bytes of one bucket of the collectives, all ranks' parts together (0: 25 MiB, apex_ddp's
   * default): the memory a rank keeps for them beside its shard, per gradient dtype. Smaller buckets
   * cost memory less and collectives more; the bits are the same at any size. */
  size_t bucket_bytes;
  /* 1: reduce-scatter the gradients in buckets during the backward, each as soon as its gradients are
   * final (apex_zero_attach, or apex_zero_mark_ready), as apex_ddp all-reduces them: two buffers of
   * the largest bucket per gradient dtype, one filling while the other is on the wire, in place of the
   * one bucket the collectives use otherwise (they borrow the first; a gradient larger than
   * bucket_bytes is a bucket of its own). Needs apex_pg_reduce_scatter_v (the MPI and local groups).
   * 0 (default): one reduce-scatter in apex_zero_reduce_grads, after the backward. The bits are the same. */
  int overlap;
  /* Stage 2 only. 0 (default): a gradient tensor's memory is released as soon as its reduce-scatter has
   * taken it (with overlap, when its bucket starts during the backward; else in apex_zero_reduce_grads),
   * and it reads as zeros until the next backward makes it again (apex_tensor_released): so a rank holds
   * the gradients of the buckets in flight, not the model's. This applies to autograd's leaf gradients
   * (apex_var_grad); other gradient tensors (the caller's own, or flattened by amp's combine_grad) keep
   * their memory. 1: keep every gradient tensor whole, holding this rank's local gradients after the
   * reduce, for a program that reads them. The bits are the same. */
  int keep_grads;
} apex_zero_options;

/* A sharded optimizer of `kind` with hyperparameters `optim` (NULL: the defaults) over params[0..n)
 * and their gradients grads[0..n) (same shape and dtype as their parameter; f32, f16 or bf16), one
 * parameter group. Collective: checks with apex_pg_check_consistent that every rank passed the same
 * shapes and dtypes, copies rank 0's parameters to every rank, and makes this rank's masters and
 * state. NULL with a message for: NULL pg, params or grads, n < 1, a NULL tensor, a parameter listed
 * twice, a gradient whose shape or dtype differs from its parameter's, a tensor not on the group's
 * device, a stage other than 1 or 2 ("--zero 3 is not implemented"), options the optimizer refuses,
 * overlap on a group without apex_pg_reduce_scatter_v (APEX_ERR_UNSUPPORTED), ranks that disagree, or
 * no memory. */
APEX_API apex_zero *apex_zero_create(apex_pg *pg, apex_tensor *const *params, apex_tensor *const *grads, int n,
                                     apex_optim_kind kind, const apex_optim_options *optim, const apex_zero_options *options);
/* Frees z (NULL is fine); the parameters and gradients stay. */
APEX_API void apex_zero_destroy(apex_zero *z);

/* With overlap: runs the reduce-scatter during every backward of g that has grad mode on, bucket by
 * bucket as the backward finishes the gradients (g's grad hook, apex_graph_set_grad_hook: one per
 * graph, so not beside apex_ddp_attach). apex_zero_reduce_grads then starts what the backward did not
 * reach and waits. APEX_ERR_INVALID_ARG for NULL; APEX_ERR_STATE without overlap. */
APEX_API apex_status apex_zero_attach(apex_zero *z, apex_graph *g);
/* With overlap, for a program without apex's autograd: gradient i (of params[i]) is final for this
 * backward, and the buckets that are complete start, in bucket order (the last parameter's first).
 * APEX_ERR_INVALID_ARG for NULL or i outside [0, n); APEX_ERR_STATE without overlap or when i was
 * already marked since the last apex_zero_reduce_grads; APEX_ERR_IO. */
APEX_API apex_status apex_zero_mark_ready(apex_zero *z, int i);

/* Reduce-scatters the gradients: this rank's shard receives the sum (or average) over all ranks.
 * Stage 1 then all-gathers the reduced gradients into grads[]. APEX_ERR_INVALID_ARG for NULL;
 * APEX_ERR_IO when a collective fails. */
APEX_API apex_status apex_zero_reduce_grads(apex_zero *z);
/* After apex_zero_reduce_grads: the whole reduced gradients into grads[] on every rank (what stage 1
 * does after each reduce), for a stage-2 program that needs them once: e.g. gradient accumulation
 * that must reduce after every micro-batch, as DDP does, to keep DDP's bits. APEX_ERR_INVALID_ARG for
 * NULL; APEX_ERR_STATE before apex_zero_reduce_grads; APEX_ERR_IO. */
APEX_API apex_status apex_zero_gather_grads(apex_zero *z);
/* Global gradient-norm clipping after apex_zero_reduce_grads, as apex_optimizer_clip_grad_norm on an
 * unsharded optimizer: the L2 norm of the whole reduced gradients times 1 / grad_scale (the same bits
 * on every rank) into *total_norm (may be NULL), and, when it exceeds max_norm, the next step
 * multiplies the gradients by max_norm / (norm + 1e-6). Collective: each rank's part of the norm is
 * taken over its shard and the parts are gathered (a few bytes per 2048 gradients), so stage 2 makes no
 * gradient tensor whole for it (LAMB with max_grad_norm gathers the gradients, which its step reads). APEX_ERR_INVALID_ARG for NULL z, max_norm
 * not finite and > 0 or a bad grad_scale; APEX_ERR_STATE before apex_zero_reduce_grads. */
APEX_API apex_status apex_zero_clip_grad_norm(apex_zero *z, float max_norm, float grad_scale, float *total_norm);
/* Collective, after apex_zero_reduce_grads: *flag (this rank's own overflow flag on entry) becomes 1
 * on every rank when it was set on any or when any rank's shard of the reduced gradients holds an
 * Inf or NaN, else 0: amp's reduce_overflow callback (apex_amp_backward_options) for a program whose
 * amp manages no optimizer, so that its loss scaler sees every rank's overflow. apex_zero_step does
 * the same itself. APEX_ERR_INVALID_ARG for NULL; APEX_ERR_STATE before apex_zero_reduce_grads. */
APEX_API apex_status apex_zero_reduce_overflow(apex_zero *z, int *flag);
/* One step after apex_zero_reduce_grads: the gradients are multiplied by 1 / grad_scale inside the
 * kernel; at stage 2 the gradient tensors are released afterwards (keep_grads), also when skipped. *overflow (overflow may be NULL: 0) is this rank's own overflow flag on entry (e.g. a
 * non-finite loss); this rank's shard of the reduced gradients is checked for Inf/NaN too, and the
 * flag is MAX-reduced over the ranks: when it is set on any rank, every rank skips the step (nothing
 * changes: state, step counts, parameters) and *overflow is 1 on every rank; otherwise each rank
 * steps its shard and the updated parameters are all-gathered, in their own dtype, into params[] on
 * every rank. APEX_ERR_INVALID_ARG for NULL z or a grad_scale that is not finite and > 0;
 * APEX_ERR_STATE before apex_zero_reduce_grads (each reduce allows one step); APEX_ERR_IO. */
APEX_API apex_status apex_zero_step(apex_zero *z, float grad_scale, int *overflow);

/* The learning rate, for schedulers: every rank sets the same. APEX_ERR_INVALID_ARG for NULL or an lr
 * that is negative or not finite. get: NaN for NULL. */
APEX_API apex_status apex_zero_set_lr(apex_zero *z, float lr);
APEX_API float apex_zero_get_lr(const apex_zero *z);

/* The range [*begin, *end) of the flat parameter vector that `rank` owns. APEX_ERR_INVALID_ARG for
 * NULL arguments or a rank outside [0, world_size). */
APEX_API apex_status apex_zero_shard_range(const apex_zero *z, int rank, size_t *begin, size_t *end);
/* Bytes of optimizer state this rank holds: its f32 masters and state tensors, as
 * apex_optimizer_state_size counts them for an unsharded optimizer (0 for a rank that owns nothing).
 * 0 with a message for NULL. */
APEX_API size_t apex_zero_state_bytes(const apex_zero *z);
/* Bytes of the buffers z keeps for the gradients and collectives on this rank: the shard of the
 * reduced gradients and one bucket per gradient dtype, or with overlap the Reducer's two buffers per
 * dtype instead of the bucket. Not the gradient tensors (apex_zero_grad_bytes). 0 with a message for NULL. */
APEX_API size_t apex_zero_buffer_bytes(const apex_zero *z);

/* Bytes the gradient tensors grads[] hold now on this rank (a released one holds none), and in *peak
 * (may be NULL) the most they held at once since the previous apex_zero_step (or apex_zero_create): read
 * it after apex_zero_reduce_grads for the step's backward. 0 (and *peak 0) with a message for NULL. */
APEX_API size_t apex_zero_grad_bytes(const apex_zero *z, size_t *peak);

/* ---- checkpoints -------------------------------------------------------------------------------------
 * A sharded run saves what an unsharded run saves: apex_zero_consolidate gathers every rank's shard
 * into one unsharded optimizer over the same parameters (one group, z's kind and options), whose
 * apex_optimizer_save bytes are those of the unsharded optimizer a DDP run steps, so one process (or
 * another number of ranks) loads them. To resume, load the bytes into an unsharded optimizer built over
 * the parameters (apex_optimizer_create, apex_optimizer_add_group, apex_optimizer_load) and hand it
 * to apex_zero_load_state, at any number of ranks. Both hold the whole state on every rank for a
 * moment: the cost of one file that everything reads. */

/* Collective: a new unsharded optimizer holding the whole state (masters, state tensors, step counts,
 * per-tensor scalars, options and lr) on every rank; it borrows z's parameters. Destroy it with
 * apex_optimizer_destroy. NULL with a message for NULL z, no memory, or a failed collective. */
APEX_API apex_optimizer *apex_zero_consolidate(apex_zero *z);
/* Not collective: this rank's shard of the state, the options and the lr of `full`, an unsharded
 * optimizer of z's kind over parameters of z's shapes and dtypes in one group (the parameters of
 * `full` are copied into z's when they are other tensors). APEX_ERR_INVALID_ARG for NULL;
 * APEX_ERR_STATE for another kind, group layout or number of state tensors; APEX_ERR_SHAPE /
 * APEX_ERR_DTYPE for a parameter that differs. */
APEX_API apex_status apex_zero_load_state(apex_zero *z, const apex_optimizer *full);

#ifdef __cplusplus
}
#endif
#endif
