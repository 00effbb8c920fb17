/* parallel.h: process groups, the gradient Reducer and SyncBatchNorm statistics.
 *
 * A process group (apex_pg) is the set of processes that train one model together: each has a
 * rank in [0, world_size). Backends sit behind one interface: "mpi" (Open MPI, processes started
 * with mpirun), "local" (one process, world size 1: every collective is an identity or a copy, so a
 * program runs unchanged without mpirun) and, on GPUs, "nccl".
 *
 * Collectives work on whole f32/f16/bf16 tensors, blocking or not. Every rank must call the same
 * collectives in the same order with the same element counts and dtypes (as in MPI).
 *
 * Sums are deterministic and identical on every rank: the MPI backend does not use MPI's own
 * reduction (whose order is up to the MPI library). Each rank receives one segment of every rank's
 * buffer, adds the contributions in rank order, (((x0 + x1) + x2) + ...), in f32, and the reduced
 * segments are then gathered by all. f16 and bf16 values are widened to f32, summed in f32 and
 * rounded once to the buffer's dtype at the end (round to nearest even), so a half-precision sum
 * is as exact as an f32 one. AVG is that f32 sum divided by world_size, rounded once. MAX is
 * order-free; NaN wins (a NaN on any rank makes the result NaN).
 *
 * The NCCL backend (apex_pg_create_nccl) works on CUDA tensors only and reduces with NCCL: its sums
 * follow NCCL's ring/tree order, and NCCL adds f16/bf16 values in their own precision at each step,
 * so the bits of a sum or average may differ from the MPI backend's (and from one NCCL version or
 * topology to another); on every rank of one run they are the same. AVG is NCCL's ncclAvg. MAX is
 * NCCL's: whether a NaN wins is NCCL's choice, not guaranteed as above.
 *
 * Errors: every function validates its arguments before any communication and returns the status
 * listed; a collective that MPI reports as failed returns APEX_ERR_IO with MPI's error string
 * (the communicator uses MPI_ERRORS_RETURN, so MPI never aborts the program for us). On the NCCL
 * backend a failed NCCL call or an asynchronous NCCL error (ncclCommGetAsyncError, checked while
 * waiting) returns APEX_ERR_IO with NCCL's message, and a CUDA error APEX_ERR_DEVICE; after an
 * asynchronous error the communicator is aborted and every later collective on the group fails:
 * destroy it. An argument error on one rank only leaves the other ranks waiting in that
 * collective, as in MPI: check arguments identically on every rank. */
#ifndef APEX_PARALLEL_H
#define APEX_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- process groups ----------------------------------------------------------------------------- */

typedef enum apex_reduce_op {
  APEX_REDUCE_SUM = 0,
  APEX_REDUCE_AVG = 1, /* the sum divided by world_size */
  APEX_REDUCE_MAX = 2
} apex_reduce_op;

typedef struct apex_pg apex_pg;
/* A collective in flight (from an *_async call). Finished and released by apex_pg_wait. */
typedef struct apex_pg_work apex_pg_work;

/* Zero in any field means its default. */
typedef struct apex_pg_options {
  /* MPI: a pointer to the MPI_Comm to duplicate; NULL means MPI_COMM_WORLD. NCCL: the ranks of that
   * communicator form the NCCL group (MPI carries its bootstrap). */
  const void *mpi_comm;
} apex_pg_options;

/* An MPI process group: initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED) unless the program
 * already did, and duplicates MPI_COMM_WORLD (or options->mpi_comm). When apex initialised MPI it
 * also finalises it, once, at process exit; destroying the group does not, so groups can be
 * created and destroyed again. When apex initialised MPI it also sets MPI_ERRORS_RETURN on
 * MPI_COMM_WORLD, because Open MPI reports failed non-blocking collectives through that
 * communicator's handler; a program that initialises MPI itself should do the same, or such a
 * failure aborts the job. After APEX_ERR_IO from a collective, destroy the group: MPI may still own
 * the buffers of that collective (apex leaks them rather than reuse them).
 * Returns NULL with a message when: apex was built without MPI
 * (APEX_ERR_UNSUPPORTED), MPI was already finalised (APEX_ERR_STATE), or MPI fails (APEX_ERR_IO). */
APEX_API apex_pg *apex_pg_create_mpi(const apex_pg_options *options);
/* An NCCL process group over the ranks of an MPI communicator (as apex_pg_create_mpi: MPI_COMM_WORLD
 * or options->mpi_comm; MPI is initialised and finalised as there): one NCCL communicator per
 * process, collectives on CUDA tensors (apex_tensor_create_on(APEX_DEVICE_CUDA, ...)) only; CPU
 * tensors are refused with APEX_ERR_DEVICE. Collective: every rank of the communicator calls it.
 *
 * Each rank takes GPU (local rank % visible GPUs), its local rank being its index among the ranks
 * on its host, and apex's CUDA work moves to that GPU: call this before creating any CUDA tensor,
 * because apex works on one device per process and cannot move once it holds memory on one
 * (APEX_ERR_STATE; apex_cuda_available before is fine).
 * NCCL cannot put two ranks of one communicator on one GPU, so a host that runs more ranks than it
 * has GPUs is refused, on every rank, with APEX_ERR_UNSUPPORTED. Rank 0's ncclUniqueId is sent over
 * MPI. The MPI group stays inside: apex_pg_check_consistent and apex_syncbn_stats exchange their
 * host data over it.
 *
 * Collectives run on a stream of their own that first waits for everything queued on apex's
 * stream (apex_cuda_stream), so they see what earlier apex kernels wrote, and later apex kernels may
 * overlap them. A work ends with a cudaEvent: apex_pg_test queries it, apex_pg_wait blocks until it
 * has completed (polling, to report asynchronous NCCL errors rather than hang); read or overwrite
 * the tensors only after apex_pg_wait, as with MPI. Kernels of your own on other streams must wait
 * for that too. apex_pg_allreduce_flag goes through a one-element device buffer.
 *
 * Returns NULL with a message when apex was built without CUDA, MPI or NCCL
 * (APEX_ERR_UNSUPPORTED), when a rank has no usable GPU or a host too few, when MPI fails, or when
 * NCCL or CUDA fails during setup (the message names the rank and NCCL's or CUDA's error). Every
 * rank fails together in all these cases except a failing ncclCommInitRank. */
APEX_API apex_pg *apex_pg_create_nccl(const apex_pg_options *options);
/* 1 when this library was built with the NCCL group (CUDA, MPI and NCCL); a GPU may still be missing. */
APEX_API int apex_pg_nccl_available(void);
/* A one-process group (rank 0, world size 1). NULL only when out of memory. */
APEX_API apex_pg *apex_pg_create_local(void);
/* The group a program started by mpirun (Open MPI, MPICH, Slurm's PMI) wants: MPI when the
 * launcher's environment is present and apex has MPI, otherwise local. Errors as
 * apex_pg_create_mpi when MPI is chosen. It never picks NCCL: a program with CUDA tensors asks for
 * apex_pg_create_nccl. */
APEX_API apex_pg *apex_pg_create(const apex_pg_options *options);
/* Waits for every collective still in flight on pg, then frees it (NULL is fine). */
APEX_API void apex_pg_destroy(apex_pg *pg);

/* 1 when this library was built with MPI. */
APEX_API int apex_pg_mpi_available(void);
/* This process's rank and the number of ranks; -1 for a NULL pg. The pg and reducer accessors leave
 * an APEX_ERR_INVALID_ARG message when handed NULL. */
APEX_API int apex_pg_rank(const apex_pg *pg);
APEX_API int apex_pg_world_size(const apex_pg *pg);
/* "mpi", "local" or "nccl"; "" for NULL. */
APEX_API const char *apex_pg_backend(const apex_pg *pg);
/* Where the group's tensors must live: APEX_DEVICE_CPU for mpi and local, APEX_DEVICE_CUDA for nccl,
 * APEX_DEVICE_NONE for NULL. */
APEX_API apex_device apex_pg_device(const apex_pg *pg);

/* Reduces t over all ranks in place (see the top of this file for the order and rounding).
 * Errors: APEX_ERR_INVALID_ARG for a NULL pg or t or an unknown op; APEX_ERR_DTYPE for a dtype
 * outside f32/f16/bf16; APEX_ERR_DEVICE for a tensor this backend cannot reach (CUDA tensors on
 * mpi/local, CPU tensors on nccl); APEX_ERR_SHAPE for more than 2^31-1 elements (MPI counts are
 * int); APEX_ERR_IO when MPI or NCCL fails; APEX_ERR_DEVICE when CUDA fails (nccl). */
APEX_API apex_status apex_pg_allreduce(apex_pg *pg, apex_tensor *t, apex_reduce_op op);
/* Copies root's t into t on every rank. Errors as allreduce, plus APEX_ERR_INVALID_ARG for a root
 * outside [0, world_size). */
APEX_API apex_status apex_pg_broadcast(apex_pg *pg, apex_tensor *t, int root);
/* out (world_size * numel(in) elements, any shape) receives every rank's in, in rank order.
 * Errors as allreduce, plus APEX_ERR_DTYPE when in and out differ in dtype, APEX_ERR_SHAPE when out
 * has the wrong element count, APEX_ERR_INVALID_ARG when in and out share storage. */
APEX_API apex_status apex_pg_allgather(apex_pg *pg, const apex_tensor *in, apex_tensor *out);
/* Reduces in (world_size * numel(out) elements, any shape) over all ranks and leaves segment `rank`
 * of the result, elements [rank * numel(out), (rank + 1) * numel(out)), in out: an all-reduce of which
 * each rank keeps only its share, for half the traffic (ZeRO, zero.h). On the MPI and local groups
 * each element is reduced exactly as apex_pg_allreduce reduces it (rank order, f32, one rounding), so
 * the two give the same bits; on NCCL it is ncclReduceScatter. Errors as allreduce, plus
 * APEX_ERR_DTYPE when in and out differ in dtype, APEX_ERR_SHAPE when in has the wrong element count,
 * APEX_ERR_INVALID_ARG when in and out share storage. */
APEX_API apex_status apex_pg_reduce_scatter(apex_pg *pg, const apex_tensor *in, apex_tensor *out, apex_reduce_op op);
/* The same with unequal parts: in holds counts[0] + ... + counts[world_size - 1] elements (the same
 * counts on every rank) and rank r's out receives elements [counts[0] + ... + counts[r - 1], + counts[r])
 * of the reduction (out may be NULL where counts[rank] is 0): a bucket of gradients that straddles the
 * contiguous shards of a sharded optimizer. Each element is reduced as apex_pg_allreduce reduces it.
 * Errors as apex_pg_reduce_scatter (APEX_ERR_SHAPE when in or out disagrees with counts), and
 * APEX_ERR_UNSUPPORTED on a group without it (nccl, for now). */
APEX_API apex_status apex_pg_reduce_scatter_v(apex_pg *pg, const apex_tensor *in, apex_tensor *out, const size_t *counts,
                                              apex_reduce_op op);
/* Returns once every rank has entered the barrier. APEX_ERR_INVALID_ARG for NULL; APEX_ERR_IO. */
APEX_API apex_status apex_pg_barrier(apex_pg *pg);
/* Sets *flag on every rank to 1 when any rank passed a nonzero *flag, else 0 (a MAX all-reduce), so
 * that every rank skips the same amp step after an overflow on any of them. flag is host memory on
 * every backend (nccl copies it to the GPU and back). */
APEX_API apex_status apex_pg_allreduce_flag(apex_pg *pg, int *flag);

/* Non-blocking forms: start the collective and return at once with *work set (NULL on error).
 * The tensors must stay alive and untouched until apex_pg_wait returns. Collectives progress while
 * the program calls apex (apex_pg_test, apex_pg_wait, further collectives), as in MPI. Errors as
 * the blocking forms, plus APEX_ERR_INVALID_ARG for a NULL work. */
APEX_API apex_status apex_pg_allreduce_async(apex_pg *pg, apex_tensor *t, apex_reduce_op op, apex_pg_work **work);
APEX_API apex_status apex_pg_broadcast_async(apex_pg *pg, apex_tensor *t, int root, apex_pg_work **work);
APEX_API apex_status apex_pg_allgather_async(apex_pg *pg, const apex_tensor *in, apex_tensor *out, apex_pg_work **work);
APEX_API apex_status apex_pg_reduce_scatter_async(apex_pg *pg, const apex_tensor *in, apex_tensor *out, apex_reduce_op op,
                                                 apex_pg_work **work);
APEX_API apex_status apex_pg_reduce_scatter_v_async(apex_pg *pg, const apex_tensor *in, apex_tensor *out, const size_t *counts,
                                                   apex_reduce_op op, apex_pg_work **work);
APEX_API apex_status apex_pg_barrier_async(apex_pg *pg, apex_pg_work **work);
/* Advances work without blocking; *done = 1 when it has finished. The work stays valid (release it
 * with apex_pg_wait). A failure is returned here and again by apex_pg_wait. */
APEX_API apex_status apex_pg_test(apex_pg_work *work, int *done);
/* Blocks until work has finished and releases it, also on error; returns the collective's status
 * (APEX_ERR_IO with MPI's message when it failed). NULL is APEX_ERR_INVALID_ARG. */
APEX_API apex_status apex_pg_wait(apex_pg_work *work);

/* Checks that every rank holds the same model: the same number of parameters, and parameter i has
 * the same name, dtype and shape everywhere (data parallelism needs it; DDP calls this when it is
 * created). Costs one small all-gather when the models agree. Every rank returns the same status
 * and the same message, naming the first parameter that differs and the ranks: APEX_ERR_SHAPE for
 * a shape, APEX_ERR_DTYPE for a dtype, APEX_ERR_INVALID_ARG for a name or the parameter count.
 * names may be NULL (parameters are then called "parameter i"). Bad arguments (NULL pg or tensors,
 * n < 0, a NULL tensor or name) give APEX_ERR_INVALID_ARG on the rank that passed them, and that
 * rank still takes part, so the other ranks return APEX_ERR_INVALID_ARG naming it instead of
 * waiting. */
APEX_API apex_status apex_pg_check_consistent(apex_pg *pg, const char *const *names, apex_tensor *const *tensors, int n);

/* ---- the Reducer: bucketed gradient all-reduce (Apex's Reducer and DDP's engine) ----------------- */

typedef struct apex_reducer apex_reducer;

/* Zero in any field means its default. */
typedef struct apex_reducer_options {
  size_t bucket_bytes;              /* bytes per bucket, counted in the reduction dtype: 25 MiB */
  int sum_only;                     /* 1: sum the gradients; 0 (default): average them (Apex's gradient_average) */
  float gradient_predivide_factor;  /* 1.0: gradients are multiplied by 1/f before the all-reduce, and by
                                       f/world_size after it when averaging (Apex's semantics) */
  int allreduce_always_fp32;        /* 1: f16/bf16 gradients are reduced in an f32 bucket */
  /* Buckets cut by the caller (Apex's allreduce_trigger_params): with num_triggers > 0, bucket_bytes
   * is ignored and the open bucket of gradient i's reduction dtype is closed right after i, for each
   * index i in triggers[0..num_triggers) (listing one twice is harmless). Gradients after the last
   * trigger of their dtype share a final bucket. */
  const int *triggers;
  int num_triggers;
} apex_reducer_options;

/* A Reducer for the n gradient tensors grads[0..n) (kept by pointer: they must outlive the Reducer).
 * Buckets are cut in index order: each tensor joins the open bucket of its reduction dtype (its own,
 * or f32 with allreduce_always_fp32), and a bucket is closed when the next tensor would take it past
 * bucket_bytes; a tensor larger than bucket_bytes gets a bucket of its own (or, with triggers, a
 * bucket is closed after each trigger index instead). Each bucket owns a flat
 * buffer allocated here, once. Buckets are reduced in bucket order on every rank, so give the
 * tensors in the order their gradients become ready (DDP: reverse parameter order).
 * Creation is collective: it checks with apex_pg_check_consistent that every rank has the same
 * tensors (dtypes and shapes). The buckets live on the group's device: on the NCCL group the
 * gradients are CUDA tensors and never leave the GPU. Returns NULL with a message for: NULL pg or
 * grads or a NULL tensor, n < 1, a tensor listed twice, a tensor not on the group's device (CUDA on
 * mpi/local, CPU on nccl), a negative or non-finite predivide factor, num_triggers < 0, NULL
 * triggers with num_triggers > 0 or a trigger outside [0, n), ranks that disagree (the bucket plans
 * are compared too, so ranks with other triggers are refused), or no memory. */
APEX_API apex_reducer *apex_reducer_create(apex_pg *pg, apex_tensor *const *grads, int n, const apex_reducer_options *options);
/* Waits for buckets still in flight, then frees r (NULL is fine). */
APEX_API void apex_reducer_destroy(apex_reducer *r);

/* Says gradient i is final for this step: it is copied (scaled by 1/predivide, converted) into its
 * bucket, and every bucket whose tensors are all ready is all-reduced without blocking, in bucket
 * order (bucket k is started only after buckets 0..k-1). Buckets in flight are advanced.
 * Errors: APEX_ERR_INVALID_ARG for NULL or i outside [0, n); APEX_ERR_STATE when i was already
 * marked this step; APEX_ERR_IO when a collective fails. */
APEX_API apex_status apex_reducer_mark_ready(apex_reducer *r, int i);
/* Ends the step: starts the buckets not started yet, waits for all of them and writes the reduced
 * values back into the gradients (times f/world_size when averaging, converted back to their
 * dtype). Then the next step can begin. A gradient not marked ready is still reduced with its
 * current value, so no rank is left waiting, but APEX_ERR_STATE names the first one afterwards.
 * APEX_ERR_IO when a collective fails. */
APEX_API apex_status apex_reducer_finish(apex_reducer *r);
/* Marks every gradient ready in index order and finishes: reduce everything now. */
APEX_API apex_status apex_reducer_reduce(apex_reducer *r);
/* The number of buckets, and the bucket holding gradient i (-1 for a bad argument or NULL). */
APEX_API int apex_reducer_bucket_count(const apex_reducer *r);
APEX_API int apex_reducer_bucket_of(const apex_reducer *r, int i);
/* The number of buckets whose all-reduce has been started in the current step (buckets start in
 * order, so these are buckets 0..k-1): after a backward that marked gradients ready, the buckets
 * already in flight before apex_reducer_finish, i.e. the communication overlapped with the backward.
 * 0 at the start of a step (after finish). -1 for NULL. */
APEX_API int apex_reducer_buckets_started(const apex_reducer *r);
/* Bytes of the Reducer's bucket buffers on this rank (every gradient once, in its reduction dtype; in
 * ZeRO's scatter mode a few reused buffers): what it holds beside the gradient tensors. 0 with a
 * message for NULL. */
APEX_API size_t apex_reducer_buffer_bytes(const apex_reducer *r);

/* ---- SyncBatchNorm statistics --------------------------------------------------------------------- */

/* Per-channel batch statistics over every rank's batch, for SyncBatchNorm's forward.
 * x is (N, C, ...) of any dtype on this rank; N may differ between ranks (and be 0 on some).
 * Each rank computes (count, mean, M2) per channel in f64 (two passes), the triples are all-gathered
 * and merged in rank order with Chan et al.'s parallel formula, so every rank gets bitwise the same
 * result, equal to the statistics of the concatenated batch. Writes mean_out and invstd_out =
 * 1/sqrt(var + eps) (biased variance, used to normalise), and unbiased_var_out (may be NULL; for the
 * running variance) as f32 tensors of C elements; *total_count (may be NULL) = the number of values
 * per channel over all ranks.
 * Errors: APEX_ERR_INVALID_ARG for NULL pg/x/mean_out/invstd_out, eps < 0 or non-finite, x with
 * fewer than 2 dimensions, or fewer than 2 values per channel over all ranks (as PyTorch); on every
 * rank, naming the rank: ranks with different C, or a rank that passed bad arguments (it still takes
 * part in the exchange). APEX_ERR_DTYPE for outputs that are not f32; APEX_ERR_SHAPE for outputs
 * without C elements; APEX_ERR_IO when MPI fails. */
APEX_API apex_status apex_syncbn_stats(apex_pg *pg, const apex_tensor *x, apex_tensor *mean_out, apex_tensor *invstd_out,
                                       apex_tensor *unbiased_var_out, float eps, int64_t *total_count);

/* SyncBatchNorm's backward reduction: per channel, sum_dy = sum(dy) and sum_dy_xhat =
 * sum(dy * (x - mean) * invstd) over the local batch (in f64), then summed over all ranks (one
 * all-reduce of 2C floats, in rank order). x and dy are (N, C, ...) with the same shape; mean and
 * invstd are the f32 tensors apex_syncbn_stats wrote; sum_dy_out and sum_dy_xhat_out are f32
 * tensors of C elements. The local sums before the all-reduce are the gradients of the affine bias
 * and weight on this rank. Errors: APEX_ERR_INVALID_ARG for NULL or ndim < 2, APEX_ERR_SHAPE for
 * mismatched shapes or channel counts, APEX_ERR_DTYPE for non-f32 statistics, APEX_ERR_IO. */
APEX_API apex_status apex_syncbn_backward_reduce(apex_pg *pg, const apex_tensor *x, const apex_tensor *dy,
                                                 const apex_tensor *mean, const apex_tensor *invstd,
                                                 apex_tensor *sum_dy_out, apex_tensor *sum_dy_xhat_out);

/* The input gradient from the reduced sums (no communication):
 *   dx = weight * invstd * (dy - sum_dy / total - xhat * sum_dy_xhat / total),  xhat = (x - mean) * invstd,
 * computed in f32 and rounded to dx's dtype. weight may be NULL (no affine: weight 1). dx has x's
 * shape (any dtype). Errors: APEX_ERR_INVALID_ARG for NULL or total_count < 1, APEX_ERR_SHAPE,
 * APEX_ERR_DTYPE for non-f32 per-channel tensors. */
APEX_API apex_status apex_syncbn_backward_input(const apex_tensor *x, const apex_tensor *dy, const apex_tensor *mean,
                                                const apex_tensor *invstd, const apex_tensor *weight,
                                                const apex_tensor *sum_dy, const apex_tensor *sum_dy_xhat,
                                                int64_t total_count, apex_tensor *dx);

#ifdef __cplusplus
}
#endif
#endif
