/* zero_internal.h: the sharded optimizer's state, shared by zero.c (the plan and the step),
 * zero_comm.c (the collectives, in buckets), zero_overlap.c (the reduce-scatter during backward) and
 * zero_state.c (checkpoints). */
#ifndef APEX_PARALLEL_ZERO_INTERNAL_H
#define APEX_PARALLEL_ZERO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "apex/zero.h"

typedef struct piece {
  int i;            /* the parameter */
  size_t off, len;  /* elements [off, off + len) of it */
  int owner;
  size_t pos;       /* offset in the owner's segment of the parameter's dtype */
  apex_tensor *param, *grad; /* views of the caller's tensors */
  apex_tensor *shard;        /* its place in this rank's shard buffer (owned pieces only) */
} piece;

/* The part of a piece that one chunk of the collectives carries (zero_comm.c). */
typedef struct span {
  apex_tensor *grad, *param; /* views of the caller's tensors */
  apex_tensor *slot;         /* its place in the staging buffer */
  int owner;
} span;

/* Elements [c0, c0 + len) of every rank's segment of one dtype: one reduce-scatter or all-gather. */
typedef struct chunk {
  apex_tensor *in;  /* world x len elements of the staging buffer, rank 0's part first */
  apex_tensor *out; /* this rank's shard, elements [c0, c0 + len) */
  int first, count; /* its spans */
  int pad;          /* some rank's share ends inside it: the staging holds padding */
} chunk;

/* A gradient tensor's address and its parameter, sorted by address: the grad hook's lookup. */
typedef struct zero_lookup {
  uintptr_t grad;
  int i;
} zero_lookup;

struct apex_zero {
  apex_pg *pg;
  int rank, world, stage, n;
  float post; /* the Reducer's f / world_size after the sum (1 with sum_only) */
  apex_tensor **params, **grads;
  size_t *bound; /* world + 1 range boundaries in the flat vector */
  piece *pieces;
  int npieces;
  apex_tensor *shard[APEX_DTYPE_COUNT];
  size_t seg[APEX_DTYPE_COUNT]; /* S per dtype (0: no parameter of that dtype) */
  apex_tensor *staging[APEX_DTYPE_COUNT]; /* one bucket of the collectives per dtype */
  int staging_borrowed[APEX_DTYPE_COUNT]; /* overlap: staging is a view of the Reducer's first buffer */
  size_t chunk_elems[APEX_DTYPE_COUNT];   /* L: one rank's part of a full chunk */
  chunk *chunks;
  int nchunks;
  span *spans;
  int nspans;
  /* overlap (zero_overlap.c) */
  apex_reducer *red;      /* scatter mode over the gradients, last parameter first */
  zero_lookup *lookup;
  unsigned char *marked;  /* per parameter, this step */
  apex_optimizer *opt;
  apex_optim_kind kind;
  apex_optim_options optim; /* as given, for the unsharded optimizer of a checkpoint */
  int owned;        /* pieces this rank owns (the optimizer has a group when > 0) */
  apex_tensor **own_grads;   /* the shard's reduced gradients, one view per owned piece */
  apex_tensor **step_grads;  /* what the optimizer reads: own_grads, or their f32 unscaled copies (amp_unscale) */
  apex_tensor *unscaled;     /* amp_unscale: the f32 buffer behind step_grads */
  float lr;
  int lamb_norm;    /* LAMB with max_grad_norm: the step needs the whole gradients */
  int reduced;      /* gradients reduced since the last step */
  int gathered;     /* grads[] hold the whole reduced gradients */
  /* stage 2 without keep_grads (zero_release.c): the gradient tensors are released once reduce-scattered */
  int release;
  int released_upto;   /* overlap: the buckets whose gradients were released this step */
  size_t grad_peak;    /* the most bytes grads[] held at once since the last step */
};

/* zero_comm.c. Plans the chunks of buckets of bucket_bytes (0: the default) after zero.c's pieces and
 * shard buffers and the overlap's Reducer exist; APEX_ERR_OUT_OF_MEMORY. */
apex_status apex__zero_plan_chunks(apex_zero *z, size_t bucket_bytes);
void apex__zero_free_chunks(apex_zero *z);
/* The caller's gradients, summed over the ranks, into this rank's shard (the sums; no division). */
apex_status apex__zero_reduce_scatter(apex_zero *z);
/* Every rank's shard into the caller's gradients (params 0: after a reduce, every reduced gradient)
 * or into the parameters this rank does not own (params 1: after a step packed its own into the shard). */
apex_status apex__zero_allgather(apex_zero *z, int params);

/* zero_release.c. Releases the gradients of params[i] for i in [lo, hi) that are autograd's (the others
 * keep their memory), after noting what grads[] held in the peak; without release, does nothing. */
void apex__zero_release(apex_zero *z, int lo, int hi);
/* With overlap: releases the gradients of the buckets that have started since the last call. */
void apex__zero_release_started(apex_zero *z);
/* Bytes grads[] hold now (released ones hold none). */
size_t apex__zero_grad_held(const apex_zero *z);

/* zero_norm.c. The L2 norm of the whole reduced gradients times inv_scale, with the bits of an unsharded
 * apex_optimizer_clip_grad_norm over them, from every rank's shard (collective, after a reduce). */
apex_status apex__zero_global_norm(apex_zero *z, float inv_scale, float *norm);

/* zero_overlap.c. Makes the Reducer (after the pieces and the shard buffers): APEX_ERR_UNSUPPORTED on a
 * group without apex_pg_reduce_scatter_v. */
apex_status apex__zero_make_overlap(apex_zero *z, size_t bucket_bytes);
void apex__zero_free_overlap(apex_zero *z);
/* Starts the buckets no backward started and waits for all: the sums in this rank's shard. */
apex_status apex__zero_overlap_reduce(apex_zero *z);

#endif
