/* capture.h: a training step recorded once and replayed. On a GPU the step's work (forward, backward,
 * amp's unscale and overflow check, the optimizer) becomes one CUDA graph, and each later step is one
 * launch of it: the host's cost of a step (hundreds of kernel launches, each op's bookkeeping) is paid
 * once, at the capture.
 *
 *     apex_status step(void *ctx) {                 everything the step does, reading nothing on the host
 *       struct run *r = ctx;
 *       apex_var *loss = apex_gpt_loss_index(r->gpt, r->g, r->ids, r->targets);
 *       apex_status st = loss ? apex_tensor_copy(r->loss, apex_var_value(loss)) : apex_last_status();
 *       if (st == APEX_OK) st = apex_amp_backward(r->amp, loss, 0, NULL);
 *       apex_graph_reset(r->g);
 *       if (st == APEX_OK) st = apex_amp_step(r->amp, r->opt, NULL);
 *       return st == APEX_OK ? apex_amp_zero_grad(r->amp) : st;
 *     }
 *     apex_index_set(ids, batch0, n); apex_index_set(targets, next0, n);
 *     apex_step_capture(APEX_DEVICE_CUDA, step, &r, &(apex_capture_options){&opt, 1}, &cs);   step 1
 *     for each later batch:
 *       apex_index_set(ids, batch, n); apex_index_set(targets, next, n);                  new values, same places
 *       apex_step_replay(cs);                                                            one launch
 *
 * What a replay repeats is the recorded work with the values its memory holds when it runs: the same
 * shapes, the same tensors, every scalar the ops were given at the capture. So between replays change
 * values only, in place: the batch through apex_index_set (index.h), tensors through apex_tensor_copy.
 * In particular:
 *   - the step must read nothing from the host: ids and targets as indexes (apex_gpt_loss_index, not
 *     apex_gpt_loss), the loss copied into a device tensor (read after the loop), amp's skipped flag
 *     not asked for; a step that makes the host wait, copies host memory or allocates past what its
 *     first run left in the pool breaks the capture, which apex_step_capture reports;
 *   - the optimizers' options (weight decay, betas, eps, ...) are held by the recorded kernels: name the
 *     optimizers in the options, and a replay refuses once one of them changed; the learning rate is
 *     read on the device (apex_optimizer_set_lr updates the group's copy there), so a schedule works
 *     across replays, except a change to or from 0; step counts, Adam's bias corrections and amp's loss
 *     scale live on the device and move on with each replay;
 *   - the graphs the step records on belong to it while it lives: use another apex_graph for evaluation.
 *
 * On the CPU, and on any device without graphs, nothing is recorded: the capture runs the step and each
 * replay runs it again, so a program written for the GPU runs the same steps everywhere. */
#ifndef APEX_CAPTURE_H
#define APEX_CAPTURE_H

#include "apex/optim.h"
#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One training step on ctx: APEX_OK, or the failure it met (with apex's message). */
typedef apex_status (*apex_step_fn)(void *ctx);

typedef struct apex_capture_options {
  apex_optimizer *const *optimizers; /* those the step steps: a replay refuses once their options changed */
  int n_optimizers;
} apex_capture_options;

typedef struct apex_captured_step apex_captured_step;

/* Runs step(ctx) once as it is (a real training step; on a GPU it also leaves in the allocator's pool the
 * blocks a step needs and makes the products' plans), then on a device with graphs records a second call
 * of it without running it. So after a successful capture the model has taken exactly one step, wherever
 * it ran, and *out is the step to replay. opts may be NULL (no optimizer watched). Errors, *out NULL:
 *   APEX_ERR_INVALID_ARG  NULL step or out, a negative count or NULL optimizer in opts;
 *   apex__backend_need's for a device this build cannot use;
 *   the step's own failure in its first run (the model then as the step left it);
 *   APEX_ERR_DEVICE       the capture broke: the recorded call made the host wait, copied host memory,
 *                         or used another stream (the message says which); the first run's step stands;
 *   APEX_ERR_STATE        the recorded call asked the allocator for memory its first run did not leave
 *                         (a step that changes its shapes), or another capture is on;
 *   the recorded call's own failure. */
APEX_API apex_status apex_step_capture(apex_device device, apex_step_fn step, void *ctx, const apex_capture_options *opts,
                                       apex_captured_step **out);
/* One more step: one launch of the recorded graph (queued; returns at once), or on the CPU one call of
 * the step. APEX_ERR_INVALID_ARG for NULL; APEX_ERR_STATE, running nothing, when a watched optimizer's
 * number of groups or any group's options but the learning rate changed since the capture, or a learning
 * rate went to or from 0. */
APEX_API apex_status apex_step_replay(apex_captured_step *s);
/* Frees the step and the memory its graph replays on (after a queued replay finishes). NULL is fine. */
APEX_API void apex_captured_step_destroy(apex_captured_step *s);

#ifdef __cplusplus
}
#endif
#endif
