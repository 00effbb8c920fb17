/* fp16_optimizer.h: Apex's FP16_Optimizer for bring-your-own-model programs (llm.c style): raw
 * parameter and gradient buffers of any dtype, a hand-written backward, and apex for the rest.
 *
 * Wrap an optimizer whose parameters may be f16/bf16 (it keeps their f32 masters, see optim.h):
 *
 *     apex_fp16_optimizer *fo = apex_fp16_optimizer_create(opt, NULL);   dynamic loss scaling
 *     for (...) {
 *       my_backward(loss_scale = apex_fp16_optimizer_loss_scale(fo));    gradients of loss * scale
 *       apex_fp16_optimizer_clip_master_grads(fo, 1.0f, &norm);          optional
 *       apex_fp16_optimizer_step(fo, &skipped);   check for Inf/NaN, update the scale, step or skip
 *     }
 *
 * The gradients stay scaled in their buffers; the optimizer multiplies them by 1/scale inside its
 * kernel, so f16 gradients never underflow on an unscale of their own. */
#ifndef APEX_FP16_OPTIMIZER_H
#define APEX_FP16_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "apex/loss_scaler.h"
#include "apex/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_fp16_optimizer apex_fp16_optimizer;

/* Wraps opt (borrowed: it must outlive the wrapper). scaling NULL means dynamic loss scaling with
 * the scaler's defaults (Apex's FP16_Optimizer defaults to a static scale of 1; ask for
 * {.mode = APEX_SCALE_STATIC, .init_scale = S} to get that). NULL with a message for a NULL opt or
 * invalid scaling settings (as apex_loss_scaler_create). */
APEX_API apex_fp16_optimizer *apex_fp16_optimizer_create(apex_optimizer *opt, const apex_loss_scaler_config *scaling);
APEX_API void apex_fp16_optimizer_destroy(apex_fp16_optimizer *fo);

/* The scale to multiply the loss by (or to seed the backward with). These three accessors answer a
 * NULL fo with NaN or NULL and an APEX_ERR_INVALID_ARG message. */
APEX_API float apex_fp16_optimizer_loss_scale(const apex_fp16_optimizer *fo);
/* The wrapped optimizer, and its scaler (borrowed). */
APEX_API apex_optimizer *apex_fp16_optimizer_optimizer(const apex_fp16_optimizer *fo);
APEX_API apex_loss_scaler *apex_fp16_optimizer_scaler(const apex_fp16_optimizer *fo);

/* Clips the global norm of the unscaled gradients to max_norm for the next step (the norm before
 * clipping in *total_norm, may be NULL). A non-finite norm means overflow: the next step will skip. */
APEX_API apex_status apex_fp16_optimizer_clip_master_grads(apex_fp16_optimizer *fo, float max_norm, float *total_norm);

/* Checks every gradient for Inf/NaN in one read pass, updates the loss scale, and steps the
 * optimizer with the gradients unscaled in its kernel, or skips the step on overflow (*skipped, may
 * be NULL, says which). Returns APEX_OK for a step taken or skipped, the optimizer's errors
 * otherwise. An overflow with the dynamic scale already at its minimum is a skipped step too:
 * apex_loss_scaler_at_min(apex_fp16_optimizer_scaler(fo)) is then 1. */
APEX_API apex_status apex_fp16_optimizer_step(apex_fp16_optimizer *fo, int *skipped);

/* The wrapper's state: the scaler's state, then the optimizer's (apex_optimizer_save), so that a run
 * resumes bitwise. size/save/load as the optimizer's functions; load refuses a corrupted or
 * mismatched buffer and changes nothing. */
APEX_API apex_status apex_fp16_optimizer_state_size(const apex_fp16_optimizer *fo, size_t *bytes);
APEX_API apex_status apex_fp16_optimizer_save(const apex_fp16_optimizer *fo, void *buf, size_t size, size_t *written);
APEX_API apex_status apex_fp16_optimizer_load(apex_fp16_optimizer *fo, const void *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
