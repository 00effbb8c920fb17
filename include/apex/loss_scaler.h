/* loss_scaler.h: static and dynamic loss scaling (Apex's LossScaler, with the Ascend edition's
 * tunables and Megatron-style hysteresis).
 *
 * Use: multiply the loss by apex_loss_scaler_scale() before backward; unscale the gradients by its
 * inverse while checking them for Inf/NaN (apex_loss_scaler_unscale, or apex_mt_scale, does both in one
 * pass); then call apex_loss_scaler_update(found_inf) and skip the optimizer step when it says so.
 *
 * A scaler keeps its state where the gradients are (apex_loss_scaler_create_on): on a GPU its scale,
 * trackers, counters and found_inf flag live in device memory, the checks raise the flag there, the
 * optimizer reads the scale and the skip there (apex_optimizer_step_scaled, optim.h) and the update
 * applies the rule there, so that a step never waits for the host:
 *
 *     apex_loss_scaler *sc = apex_loss_scaler_create_on(APEX_DEVICE_CUDA, NULL);   dynamic, 2^16
 *     for (...) {
 *       forward; apex_loss_scaler_scale_tensor(sc, dloss); backward
 *       apex_loss_scaler_check(sc, grads, n);          found_inf |= any Inf/NaN (reads only)
 *       apex_optimizer_step_scaled(opt, sc);           unscales in-kernel; skips on found_inf
 *       apex_loss_scaler_update(sc, 0, NULL);          grows / backs off, clears found_inf
 *     }
 *
 * The same loop runs on a CPU scaler with CPU tensors, with the same bits as a GPU scaler fed the same
 * overflow sequence.
 *
 * Dynamic rule, per update:
 *   overflow:    skip the step; the growth counter restarts; the hysteresis counter drops by one and,
 *                when it reaches zero, scale = max(scale * backoff_factor, min_scale).
 *   no overflow: growth counter + 1; when it reaches growth_interval, scale =
 *                min(scale * growth_factor, max_scale), the growth counter restarts and the hysteresis
 *                counter is reset to `hysteresis`.
 * With hysteresis = 1 (the default) every overflow backs off: Apex's behaviour.
 * A static scaler never changes its scale. It still reports overflow and asks for the step to be
 * skipped, so a static scale can never write Inf/NaN into the weights (Apex's static mode steps
 * anyway; apex prefers not to corrupt a model silently). */
#ifndef APEX_LOSS_SCALER_H
#define APEX_LOSS_SCALER_H

#include <stddef.h>
#include <stdint.h>

#include "apex/loss_scaler_config.h"
#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_loss_scaler apex_loss_scaler;

/* A scaler from the configuration (NULL = all defaults), its state on the CPU. Returns NULL with a
 * message naming the setting for: growth_factor <= 1, backoff_factor outside (0, 1), growth_interval
 * < 0 (0 means the default), hysteresis < 0, min_scale > max_scale, init_scale outside [min_scale,
 * max_scale], negative or non-finite values, an unknown mode. */
APEX_API apex_loss_scaler *apex_loss_scaler_create(const apex_loss_scaler_config *config);
/* As apex_loss_scaler_create, with the state in the memory of `device`, the device of the gradients it
 * will check and of the optimizer that reads it. NULL with APEX_ERR_UNSUPPORTED when this build or
 * machine cannot use the device, APEX_ERR_INVALID_ARG for an unknown one. */
APEX_API apex_loss_scaler *apex_loss_scaler_create_on(apex_device device, const apex_loss_scaler_config *config);
APEX_API void apex_loss_scaler_destroy(apex_loss_scaler *s);
/* The device its state lives on; APEX_DEVICE_CPU (with a message) for NULL. */
APEX_API apex_device apex_loss_scaler_device(const apex_loss_scaler *s);

/* The configuration with every default filled in; all zero (with an APEX_ERR_INVALID_ARG message)
 * for a NULL scaler. */
APEX_API apex_loss_scaler_config apex_loss_scaler_get_config(const apex_loss_scaler *s);
/* The factor to multiply the loss by; NaN (with a message) for a NULL scaler. On a GPU scaler this waits
 * for the GPU (the scale is decided there): kernels should read it at apex_loss_scaler_scale_ptr. */
APEX_API float apex_loss_scaler_scale(const apex_loss_scaler *s);
/* 1 / scale, the factor to multiply gradients by; NaN (with a message) for a NULL scaler. Waits as
 * apex_loss_scaler_scale does. */
APEX_API float apex_loss_scaler_inv_scale(const apex_loss_scaler *s);
/* Where the state lives, for kernels of your own: the current scale (f32) and the found_inf flag
 * (int32, nonzero = overflow seen since the last update), in the memory of the scaler's device (device
 * pointers on a GPU); NULL (with a message) for a NULL scaler. */
APEX_API const float *apex_loss_scaler_scale_ptr(const apex_loss_scaler *s);
APEX_API int32_t *apex_loss_scaler_found_inf_ptr(apex_loss_scaler *s);

/* Raises found_inf if any element of the n tensors (on the scaler's device; APEX_ERR_DEVICE naming the
 * tensor otherwise) is Inf or NaN; reads them only. */
APEX_API apex_status apex_loss_scaler_check(apex_loss_scaler *s, apex_tensor *const *grads, int n);
/* out[i] = in[i] / scale (in place when out == in), raising found_inf on a non-finite input. */
APEX_API apex_status apex_loss_scaler_unscale(apex_loss_scaler *s, apex_tensor *const *in, apex_tensor *const *out,
                                              int n);
/* Multiplies a tensor (say the loss gradient that seeds backward) by the scale, in place. */
APEX_API apex_status apex_loss_scaler_scale_tensor(apex_loss_scaler *s, apex_tensor *t);

/* Records one step's overflow check: an overflow when found_inf != 0 or the scaler's found_inf flag
 * was raised (apex_loss_scaler_check / unscale), which the update then clears. *skip (may be NULL) is
 * set to 1 when the optimizer step must be skipped (an overflow), else 0. Returns APEX_OK
 * (APEX_ERR_INVALID_ARG for a NULL scaler): an overflow at the minimum scale is not a failure of the
 * call, and apex_loss_scaler_at_min says when it happened.
 * On a GPU scaler the update runs there and returns at once: skip must be NULL (APEX_ERR_INVALID_ARG
 * otherwise, since answering would wait for the GPU; apex_optimizer_step_scaled reads the skip there),
 * and apex_loss_scaler_at_min stays 0 (read the state: the scale at min_scale and `skipped` grown). */
APEX_API apex_status apex_loss_scaler_update(apex_loss_scaler *s, int found_inf, int *skip);
/* 1 when the last apex_loss_scaler_update found an overflow with the dynamic scale already at
 * min_scale (the step was skipped as for any overflow): gradients overflow even at the smallest
 * scale allowed, so the model or its data produce Inf/NaN by themselves (check the inputs and the
 * learning rate). 0 otherwise, for a static scaler, after a set_state or load, and for NULL. */
APEX_API int apex_loss_scaler_at_min(const apex_loss_scaler *s);

/* All zero (with a message) for a NULL scaler. Waits for a GPU scaler's device. */
APEX_API apex_loss_scaler_state apex_loss_scaler_get_state(const apex_loss_scaler *s);
/* Restores a state. Refuses (APEX_ERR_INVALID_ARG, nothing changed) a non-finite or non-positive
 * scale, a scale outside [min_scale, max_scale] of a dynamic scaler, or negative counters. Clears
 * found_inf. */
APEX_API apex_status apex_loss_scaler_set_state(apex_loss_scaler *s, const apex_loss_scaler_state *state);

/* The state as APEX_LOSS_SCALER_STATE_BYTES bytes, and back. Loading checks the magic, version and
 * values (APEX_ERR_CORRUPT for a buffer that is not a scaler state) and changes nothing on error. */
APEX_API apex_status apex_loss_scaler_save(const apex_loss_scaler *s, uint8_t *buf, size_t size);
APEX_API apex_status apex_loss_scaler_load(apex_loss_scaler *s, const uint8_t *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
