/* step.h: one optimizer step of apex-train: --grad-accum micro-batches, each a forward and an amp
 * backward (all but the last with delay_unscale, so the gradients stay scaled until the last
 * backward unscales and checks them once, as Apex's scale_loss(delay_unscale=True) does), the
 * global gradient norm of the unscaled f32 master gradients (clipped to --clip-grad-norm when
 * given), and amp's step, skipped on an overflow or a non-finite loss (the caller's bad-step rule
 * judges those: divergence.h). */
#ifndef APEX_TRAIN_STEP_H
#define APEX_TRAIN_STEP_H

#include <stdint.h>

#include "apex/apex.h"
#include "dataset.h"
#include "device.h"
#include "models.h"
#include "shard.h"

typedef struct step_ctx {
  train_model *tm;
  apex_amp *amp;
  apex_optimizer *opt;                  /* NULL with --zero */
  shard *zs;                            /* --zero: the sharded optimizer in place of opt, else NULL */
  apex_graph *g;
  const dataset *d;
  const apex_amp_backward_options *bo; /* the data-parallel hooks, or NULL */
  int64_t B, T;                         /* micro-batch size; gpt sequence length */
  long accum;                           /* micro-batches per step (>= 1) */
  float clip;                           /* > 0: clip the gradient norm to this */
  apex_device dev;                      /* where the model is: batches go up there */
  /* batch buffers (step_ctx_alloc) */
  device_batch x;
  apex_tensor **losses;                 /* on a GPU: each micro-batch's loss, read once the step is queued */
  int64_t *labels, *ids;
} step_ctx;

typedef struct step_result {
  double loss;      /* mean of the micro-batches' losses (this rank's) */
  float grad_norm;  /* before clipping; Inf or NaN on an overflow */
  int skipped;      /* amp skipped the optimizer step */
} step_result;

/* Allocates the batch buffers of c (B, T, tm and d set). Non-zero when out of memory. */
int step_ctx_alloc(step_ctx *c);
void step_ctx_free(step_ctx *c);
/* Runs optimizer step `step` (1-based, for messages) on micro-batches pos * accum .. pos * accum +
 * accum - 1 of the current epoch. Prints one line and returns non-zero on failure. */
int train_step(step_ctx *c, long pos, long step, step_result *out);

/* The backward of micro-batch k (0-based) of a step, on graph g (the eager step's c->g, or the
 * captured step's own: capture_step.h): the loss scaled by 1 / accum (the step's loss is the mean of
 * its micro-batches'), amp's backward with delay_unscale on all but the last micro-batch (bo holds
 * the data-parallel hooks, or is zero), then g reset for the next forward. APEX_OK also for a
 * non-finite loss or an overflow: amp then skips the step, and whether the run diverged is the
 * bad-step rule's to say (divergence.h). Otherwise the failure, with apex's message. */
apex_status step_backward(const step_ctx *c, apex_graph *g, apex_var *loss, long k, apex_amp_backward_options *bo);

#endif
