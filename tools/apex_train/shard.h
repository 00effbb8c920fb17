/* shard.h: apex-train --zero, the sharded optimizer (apex_zero, zero.h) in place of the optimizer
 * amp would step.
 *
 * amp still casts the model, scales the loss and keeps the loss scaler, but manages no optimizer: the
 * shard's optimizer lives in apex_zero. Its f32 masters start from the model's f32 values taken
 * before amp's cast (shard_snapshot), as amp's own masters do. Each backward reduce-scatters the
 * gradients bucket by bucket as it finishes them (apex_zero_attach), and amp's callbacks complete that
 * after each backward (and, with stage 2 between micro-batches, gather them back, as
 * DDP reduces after every micro-batch) and add this rank's shard to the overflow flag amp reduces, so
 * that the steps are the unsharded run's, bit for bit. Checkpoints are the unsharded run's files:
 * saving gathers the shards into one unsharded optimizer (apex_zero_consolidate), loading goes
 * through one (shard_full). */
#ifndef APEX_TRAIN_SHARD_H
#define APEX_TRAIN_SHARD_H

#include "apex/apex.h"
#include "models.h"

typedef struct shard {
  apex_zero *z;
  apex_optim_kind kind;
  apex_optim_options oo;
  int stage;
  int last;     /* the backward under way closes the step (no delay_unscale) */
  int overflow; /* the step's overflow flag, reduced over the ranks by the last backward */
  apex_amp_backward_options bo; /* the callbacks below, ctx = this shard */
  size_t state_bytes;           /* the optimizer state of the rank holding the most (apex_zero_state_bytes) */
  size_t full_bytes;            /* what the unsharded optimizer holds on every rank */
} shard;

/* Copies of the model's f32 parameters (NULL entries for none), for the masters; free with
 * shard_snapshot_free. NULL when out of memory. */
apex_tensor **shard_snapshot(const train_model *tm);
void shard_snapshot_free(apex_tensor **vals, const train_model *tm);
/* Collective: the sharded optimizer over the model's parameters (after amp's cast) on pg, masters from
 * vals, its reduce-scatter attached to the backward of g, and the state sizes above. One line on
 * stderr and non-zero on failure. */
int shard_create(shard *s, apex_pg *pg, train_model *tm, apex_graph *g, apex_tensor *const *vals, apex_optim_kind kind,
                 const apex_optim_options *oo, int stage);
/* A new unsharded optimizer over the model's parameters with the shard's kind and options, its state
 * fresh: what a checkpoint loads into before apex_zero_load_state. NULL with a message. */
apex_optimizer *shard_full(const shard *s, train_model *tm);
void shard_free(shard *s);

#endif
