/* amp.h: automatic mixed precision in three calls (Apex's amp.initialize, amp.scale_loss and
 * optimizer.step, in C).
 *
 *     apex_amp *amp;
 *     apex_amp_initialize(&model, 1, &opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp);
 *     for (...) {
 *       apex_var *y = apex_amp_forward(amp, 0, net, g, x);   prepares g (O1 autocast) the first time;
 *                                                            O2/O3: input cast in, output f32 out
 *       apex_var *loss = apex_cross_entropy(g, y, labels, NULL);
 *       apex_amp_backward(amp, loss, 0, NULL);          scale, backward, unscale + overflow check
 *       apex_amp_step(amp, opt, &skipped);              steps unless a gradient overflowed
 *       apex_amp_zero_grad(amp);
 *       apex_graph_reset(g);
 *     }
 *
 * What initialize does, per the resolved properties (amp_config.h):
 *  - cast_model: every parameter becomes cast_model_type, except the parameters of batch norm
 *    modules when keep_batchnorm_fp32; buffers stay f32. Each optimizer is told, keeping as its
 *    f32 master the parameter's exact f32 value from before the cast (master_weights), or updating the
 *    low-precision parameter itself (no master weights, O3).
 *  - patch_functions: the graph's autocast goes on in half_type when amp first sees the graph
 *    (apex_amp_forward, apex_amp_casts_enabled or apex_amp_prepare_graph).
 *  - one loss scaler per loss (num_losses), static or dynamic. With half_type bf16 the default is
 *    no scaling (a static 1.0; amp_config.h): set loss_scale = APEX_AMP_DYNAMIC to scale anyway.
 *
 * What backward does (Apex's scale_loss context): the gradient of loss * scale flows back; unless
 * delay_unscale, the new gradients of the optimizers' parameters are then multiplied by 1/scale in
 * one pass that also checks them for Inf/NaN, into the f32 master gradients when there are masters
 * (or in place), added to what earlier losses left there (so several losses with different scales
 * may share parameters). The loss's scaler is updated with the result; on overflow the optimizers'
 * next step is skipped and, at verbosity >= 1, amp prints Apex's line
 *     Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0
 * With delay_unscale (gradient accumulation) the scaled gradients stay and the next backward without
 * it unscales them all.
 *
 * At scale 1 (bf16's default) the unscale multiplies nothing: in-place gradients are only checked
 * for Inf/NaN and master gradients are plain widenings. A static scale still checks: an overflow
 * skips the step (loss_scaler.h) and a non-finite loss fails the backward as with any scale. At O2 with
 * bf16 parameters the end of the backward and the unscale are one pass over each gradient: the bf16
 * gradient the backward would have left (one rounding of its f32 sum) goes straight to the f32
 * master, with the same bits as the separate passes, and the bf16 gradient is left zero, as after
 * any unscale into masters. A before_unscale hook or delay_unscale, which need the bf16 gradients
 * themselves, keeps the passes separate.
 *
 * Disabled amp (config.disabled) makes every call an identity of the f32 program: no cast, no
 * autocast, scale 1, backward and step as plain calls. */
#ifndef APEX_AMP_H
#define APEX_AMP_H

#include <stddef.h>
#include <stdint.h>

#include "apex/amp_config.h"
#include "apex/autograd.h"
#include "apex/nn.h"
#include "apex/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_amp apex_amp;

/* Applies the configuration to models[0..n_models) and optimizers[0..n_opts) and returns the amp
 * handle in *out. The models must be f32 and the optimizers built over their parameters (with any
 * grads; amp sets the gradients it manages). Errors, leaving models, optimizers and *out as they
 * were:
 *   everything apex_amp_resolve refuses (APEX_ERR_INVALID_ARG naming the property);
 *   APEX_ERR_INVALID_ARG  NULL arguments, no model, a model given twice or already initialised by
 *                         another apex_amp ("initialising the same model twice"), an optimizer
 *                         parameter that belongs to none of the models;
 *   APEX_ERR_DTYPE        a model parameter that is not f32;
 *   APEX_ERR_OUT_OF_MEMORY.
 * The amp handle borrows models and optimizers: destroy it first. */
APEX_API apex_status apex_amp_initialize(apex_model *const *models, int n_models, apex_optimizer *const *opts, int n_opts,
                                         const apex_amp_config *config, apex_amp **out);
/* Frees amp's state (scalers, master gradients); models and optimizers keep their current dtypes. */
APEX_API void apex_amp_destroy(apex_amp *amp);
/* The resolved properties (amp_config.h); NULL (with a message) for NULL. */
APEX_API const apex_amp_properties *apex_amp_properties_of(const apex_amp *amp);

/* Prepares a graph for this amp: autocast on in half_type under patch_functions (off otherwise) and
 * the registered op categories; it persists across resets. apex_amp_forward and
 * apex_amp_casts_enabled do this themselves the first time they see a graph (and again after
 * apex_amp_register_op or another amp's preparation), so calling it is needed only for ops recorded
 * on a graph before its first apex_amp_forward. */
APEX_API apex_status apex_amp_prepare_graph(apex_amp *amp, apex_graph *g);
/* Registers a user op's autocast category (Apex's register_half_function / register_float_function
 * / register_promote_function): every graph this amp prepares afterwards gets it, and the graphs it
 * prepared before are prepared again at their next apex_amp_forward. APEX_ERR_INVALID_ARG for an op
 * or category outside its enum. */
APEX_API apex_status apex_amp_register_op(apex_amp *amp, apex_op op, apex_cast_category category);
/* Turns casts off (0) or back on (1) in a region of a graph's forward (Apex's disable_casts);
 * returns the previous setting. Outside O1 it does nothing and returns 0. */
APEX_API int apex_amp_casts_enabled(apex_amp *amp, apex_graph *g, int enabled);

/* Runs net (a module of models[model]) on x. First prepares g as apex_amp_prepare_graph does, unless
 * this amp already prepared it, so that O1 cannot silently run in f32. With cast_model, floating x
 * is cast to the model's type on entry and the output to cast_model_outputs on the way out (Apex's
 * patched forward); otherwise it is apex_module_forward. NULL with a message on failure. */
APEX_API apex_var *apex_amp_forward(apex_amp *amp, int model, apex_module *net, apex_graph *g, apex_var *x);

typedef struct apex_amp_backward_options {
  apex_optimizer *const *optimizers; /* whose gradients this loss reaches; NULL = all of amp's */
  int n_optimizers;
  int delay_unscale;                 /* gradient accumulation: leave the gradients scaled */
  int retain_graph;
  /* Data parallelism (ddp.h: apex_ddp_amp_before_unscale / _reduce_overflow with hook_ctx = the DDP).
   * before_unscale is called after the backward (also when amp is disabled, and in place of it when
   * the loss is not finite) and before unscaling: it all-reduces the gradients. reduce_overflow is
   * called with this rank's overflow flag before the loss scaler sees it (on every backward that
   * unscales, and for a non-finite loss with the flag 1) and must MAX-reduce it over the ranks, so
   * every rank skips the same steps and loss scales stay equal. Either may be NULL. A callback's
   * error is returned unless an earlier one came first; amp still calls the other callback so
   * that the ranks stay in step. */
  apex_status (*before_unscale)(void *ctx);
  apex_status (*reduce_overflow)(void *ctx, int *overflow);
  void *hook_ctx;
} apex_amp_backward_options;

/* Backward of loss with loss scaler loss_id (see the top of this file); opts may be NULL. Returns
 * APEX_OK also when the step will be skipped (see apex_amp_step), the case of gradients that
 * overflowed with the dynamic scale already at its minimum included (apex_amp_scale_at_min says
 * so); APEX_ERR_NONFINITE when the loss itself is Inf or NaN (nothing is run, the step is skipped
 * and the scaler backs off as for an overflow); APEX_ERR_INVALID_ARG for a bad loss_id or NULL loss;
 * APEX_ERR_STATE, nothing run, when autocast applies (O1) and the loss's graph is not one this amp
 * prepared (its forward ran in f32: see apex_amp_prepare_graph); whatever apex_backward returns. */
APEX_API apex_status apex_amp_backward(apex_amp *amp, apex_var *loss, int loss_id, const apex_amp_backward_options *opts);

/* The optimizer step, unless a backward since the last step found an overflow for this optimizer
 * (at the minimum loss scale too) or a non-finite loss: then nothing changes, APEX_OK is returned
 * and *skipped (may be NULL) is 1. APEX_ERR_STATE when gradients are still
 * scaled (delay_unscale without a closing backward) or when a backward since the last zero_grad
 * failed after it ran (its gradients are incomplete); APEX_ERR_INVALID_ARG for an optimizer amp does
 * not manage. */
APEX_API apex_status apex_amp_step(apex_amp *amp, apex_optimizer *opt, int *skipped);

/* Zeroes every managed parameter's gradient and master gradient, and forgets pending skips and a
 * failed backward. */
APEX_API apex_status apex_amp_zero_grad(apex_amp *amp);

/* Loss scaler loss_id (borrowed), e.g. to read its state or set a scale as Apex's tests do through
 * amp._amp_state.loss_scalers; NULL (with a message) for a bad loss_id. */
APEX_API apex_loss_scaler *apex_amp_loss_scaler(const apex_amp *amp, int loss_id);
/* 1 when the last backward of loss loss_id found an overflow (or a non-finite loss) with the dynamic
 * scale already at its minimum (apex_loss_scaler_at_min): the step is skipped as for any overflow,
 * but the model or its data make Inf/NaN at any scale, so a training loop usually stops. 0
 * otherwise, when amp is disabled, and (with an APEX_ERR_INVALID_ARG message) for a bad loss_id. */
APEX_API int apex_amp_scale_at_min(const apex_amp *amp, int loss_id);
/* The current scale of a loss scaler (1 when disabled); NaN (with a message) for a bad loss_id or a
 * NULL amp. */
APEX_API float apex_amp_loss_scale(const apex_amp *amp, int loss_id);
/* The f32 master of parameter i of an optimizer group (Apex's amp.master_params): what the
 * optimizer updates. NULL for a bad index. */
APEX_API apex_tensor *apex_amp_master_param(const apex_amp *amp, apex_optimizer *opt, int group, int i);
/* The f32 master that amp's optimizers keep of a model parameter (O2), or NULL when there is none:
 * the optimizer updates the parameter itself (O0, O1, O3, batch norm kept in f32), or the parameter
 * is in none of amp's optimizers (or amp or param is NULL: then with a message). */
APEX_API apex_tensor *apex_amp_master_of(const apex_amp *amp, const apex_var *param);
/* Clips the global norm of an optimizer's (unscaled, master) gradients to max_norm, as
 * torch.nn.utils.clip_grad_norm_(amp.master_params(opt), max_norm); *total_norm (may be NULL)
 * receives the norm before clipping. Call after apex_amp_backward, before apex_amp_step. */
APEX_API apex_status apex_amp_clip_grad_norm(apex_amp *amp, apex_optimizer *opt, float max_norm, float *total_norm);

/* amp's state: every loss scaler, bitwise (Apex's amp.state_dict). The size is 0 (with a message)
 * for a NULL amp. */
APEX_API size_t apex_amp_state_size(const apex_amp *amp);
APEX_API apex_status apex_amp_state_save(const apex_amp *amp, uint8_t *buf, size_t size);
/* Refuses (APEX_ERR_CORRUPT / APEX_ERR_STATE, nothing changed) a buffer of another size, a different
 * number of losses, or a corrupted scaler state. */
APEX_API apex_status apex_amp_state_load(apex_amp *amp, const uint8_t *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
