/* zero_internal.h: the sharded optimizer's state, shared by zero.c (the plan, the reduce-scatter, the
 * step and the all-gather) and zero_state.c (checkpoints). */
#ifndef APEX_PARALLEL_ZERO_INTERNAL_H
#define APEX_PARALLEL_ZERO_INTERNAL_H

#include <stddef.h>

#include "apex/zero.h"

typedef struct piece {
  int i;            /* the parameter */
  size_t off, len;  /* elements [off, off + len) of it */
  int owner;
  size_t pos;       /* offset in the owner's segment of the parameter's dtype */
  apex_tensor *param, *grad; /* views of the caller's tensors */
  apex_tensor *flat;         /* its place in the flat buffer */
  apex_tensor *shard;        /* its place in this rank's shard buffer (owned pieces only) */
} piece;

struct apex_zero {
  apex_pg *pg;
  int rank, world, stage, n;
  float post; /* the Reducer's f / world_size after the sum (1 with sum_only) */
  apex_tensor **params, **grads;
  size_t *bound; /* world + 1 range boundaries in the flat vector */
  piece *pieces;
  int npieces;
  apex_tensor *flat[APEX_DTYPE_COUNT], *shard[APEX_DTYPE_COUNT];
  size_t seg[APEX_DTYPE_COUNT]; /* S per dtype (0: no parameter of that dtype) */
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
};

#endif
