/* optim.h: fused optimizers over the multi-tensor applier (Apex's FusedSGD, FusedAdam, FusedLAMB,
 * FusedNovoGrad, FusedAdagrad and the Ascend edition's fused Adadelta, AdamP, RMSprop, RMSpropTF).
 *
 * An optimizer holds parameter groups. Each group is a list of parameters, their gradients (any of
 * f32, f16, bf16) and one set of hyperparameters. A step runs one fused pass per group (two for
 * LAMB, NovoGrad and AdamP, which need per-tensor norms first) that unscales the gradients, updates
 * the state and writes the parameters.
 *
 * Mixed precision: for an f16 or bf16 parameter the optimizer keeps an f32 master copy (made when the
 * group is added; see apex_optimizer_replace_param for running without) and f32 state; the step updates the master and writes the master rounded to nearest
 * even into the model's parameter in the same pass. f32 parameters are updated in place.
 *
 * Loss scaling: apex_optimizer_step takes the loss scale the gradients carry and multiplies them by
 * its inverse inside the kernel, and an overflow flag: a step with overflow set changes nothing at
 * all, step counters included. All state is allocated and initialised when a group is added, so a
 * skipped first step leaves no garbage.
 *
 * Step counts are kept per parameter, as PyTorch does: a parameter whose gradient is NULL is skipped
 * by a step, its state and count untouched. Results are bitwise independent of the thread count.
 *
 * Lifetimes: the optimizer borrows the parameter and gradient tensors; they must outlive it (or be
 * replaced with apex_optimizer_set_grad). It owns the masters and the state. */
#ifndef APEX_OPTIM_H
#define APEX_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "apex/loss_scaler.h"
#include "apex/optim_options.h"
#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "sgd", "adam", "adamw", "adamp", "lamb", "adadelta", "adagrad", "rmsprop", "rmsprop_tf",
 * "novograd"; "invalid" for anything else. */
APEX_API const char *apex_optim_kind_name(apex_optim_kind kind);
/* The reverse of apex_optim_kind_name (case-insensitive). APEX_ERR_INVALID_ARG, with the list of
 * names, for anything else. */
APEX_API apex_status apex_optim_kind_parse(const char *name, apex_optim_kind *out);

/* Sets one field by its name as spelled in optim_options.h ("lr", "beta1", "nesterov", ...), for configuration
 * files. A value of 0 sets an explicit zero (the zero bit, or APEX_OPTIM_OFF for a flag); a flag
 * takes 0 or 1. APEX_ERR_INVALID_ARG for an unknown name (listing the names) or a flag value other
 * than 0 or 1. Ranges are checked when the options are used. */
APEX_API apex_status apex_optim_options_set(apex_optim_options *opts, const char *name, double value);

typedef struct apex_optimizer apex_optimizer;

/* A new optimizer of the given kind with no groups. defaults (NULL: all defaults) are the options of
 * groups added without their own. Returns NULL with a message for an invalid kind, invalid defaults
 * (as apex_optimizer_add_group) or a failed allocation. */
APEX_API apex_optimizer *apex_optimizer_create(apex_optim_kind kind, const apex_optim_options *defaults);
/* Frees the optimizer, its masters and state (not the parameters or gradients). NULL is fine. */
APEX_API void apex_optimizer_destroy(apex_optimizer *opt);

/* Adds a group: params[0..n_params) with gradients grads[0..n_grads). grads may be NULL with
 * n_grads == 0 (no gradients yet, see apex_optimizer_set_grad); otherwise n_grads must equal n_params
 * and grads[i] may be NULL for a parameter without gradient. opts NULL means the optimizer's defaults.
 * Creates the f32 masters and the state. Errors, each changing nothing:
 *   APEX_ERR_INVALID_ARG  NULL opt or params, n_params < 1 (an empty group), n_grads neither 0 nor
 *                         n_params, a NULL parameter, a parameter given twice (in this or another
 *                         group), a hyperparameter out of range (negative lr or eps, a beta outside
 *                         [0, 1), ...), an option the kind does not use;
 *   APEX_ERR_SHAPE        a gradient whose shape differs from its parameter's;
 *   APEX_ERR_DTYPE        a parameter or gradient dtype outside f32/f16/bf16;
 *   APEX_ERR_DEVICE       a parameter on another device than parameter 0, or a gradient on another
 *                         device than its parameter: a group lives on one device (the CPU or a GPU),
 *                         where its masters, state and step counts are made;
 *   APEX_ERR_OUT_OF_MEMORY.
 * Returns the new group's index through group_out (may be NULL). */
APEX_API apex_status apex_optimizer_add_group(apex_optimizer *opt, apex_tensor *const *params, int n_params,
                                              apex_tensor *const *grads, int n_grads, const apex_optim_options *opts,
                                              int *group_out);

/* Sets (or, with grad NULL, removes) the gradient of parameter i of a group. APEX_ERR_INVALID_ARG
 * for a group or index out of range, APEX_ERR_SHAPE / APEX_ERR_DTYPE / APEX_ERR_DEVICE as add_group. */
APEX_API apex_status apex_optimizer_set_grad(apex_optimizer *opt, int group, int i, apex_tensor *grad);

/* The learning rate of a group, changeable between steps (schedulers). set: APEX_ERR_INVALID_ARG for a
 * group out of range or an lr that is negative or not finite. get: NaN for a bad group. */
APEX_API apex_status apex_optimizer_set_lr(apex_optimizer *opt, int group, float lr);
APEX_API float apex_optimizer_get_lr(const apex_optimizer *opt, int group);
/* A group's options with every default filled in. APEX_ERR_INVALID_ARG for a bad group or NULL out. */
APEX_API apex_status apex_optimizer_group_options(const apex_optimizer *opt, int group, apex_optim_options *out);

/* APEX_OPTIM_KIND_COUNT and 0 (with an APEX_ERR_INVALID_ARG message) for a NULL opt. */
APEX_API apex_optim_kind apex_optimizer_kind(const apex_optimizer *opt);
APEX_API int apex_optimizer_num_groups(const apex_optimizer *opt);
/* Parameters in a group; -1 for a bad group. */
APEX_API int apex_optimizer_group_size(const apex_optimizer *opt, int group);
/* The tensor the optimizer updates for parameter i of a group: the f32 master for an f16/bf16
 * parameter, the parameter itself for an f32 one (Apex's master_params). Borrowed; NULL (with a
 * message) for a bad index. */
APEX_API apex_tensor *apex_optimizer_master(const apex_optimizer *opt, int group, int i);
/* The model's parameter i of a group (borrowed); NULL (with a message) for a bad index. */
APEX_API apex_tensor *apex_optimizer_param(const apex_optimizer *opt, int group, int i);
/* The gradient of parameter i of a group (borrowed): NULL when it has none, and (with a message) for
 * a bad index. */
APEX_API apex_tensor *apex_optimizer_grad(const apex_optimizer *opt, int group, int i);
/* Replaces parameter i of a group by `param` (same shape, any of f32/f16/bf16) with gradient `grad`
 * (may be NULL), keeping its step count and state: for amp's O2/O3, which cast the model after the
 * optimizer was built. Call it while the old parameter is still alive. With master_weights and an
 * f16/bf16 param, the f32 master is the existing master, or else the old parameter's values widened
 * (so an f32 model's exact values survive the cast, as Apex's master params); without
 * master_weights, or for an f32 param, the optimizer updates param in place (an f16/bf16 param is
 * then widened and rounded back at every step). Errors, changing nothing: APEX_ERR_INVALID_ARG (bad
 * index, NULL param, param already elsewhere in the optimizer), APEX_ERR_SHAPE, APEX_ERR_DTYPE,
 * APEX_ERR_DEVICE, APEX_ERR_OUT_OF_MEMORY. */
APEX_API apex_status apex_optimizer_replace_param(apex_optimizer *opt, int group, int i, apex_tensor *param,
                                                  apex_tensor *grad, int master_weights);
/* Steps taken by parameter i of a group (it counts only the steps where it had a gradient); -1 for a
 * bad index. */
APEX_API int64_t apex_optimizer_step_count(const apex_optimizer *opt, int group, int i);

/* One optimizer step over every group. Gradients are multiplied by 1 / grad_scale inside the kernel
 * (pass 1 for unscaled gradients). overflow != 0 skips the step: nothing changes (step counts,
 * state, masters, parameters), only a pending clip coefficient is dropped. Groups may live on
 * different devices, each stepped where it is, except for LAMB, whose global gradient norm needs
 * every group on one device. APEX_ERR_INVALID_ARG for a NULL opt or a grad_scale that is not finite
 * and > 0; APEX_ERR_STATE for an optimizer without groups; APEX_ERR_DEVICE for a LAMB optimizer with
 * groups on different devices. */
APEX_API apex_status apex_optimizer_step(apex_optimizer *opt, float grad_scale, int overflow);
/* apex_optimizer_step with the loss scale and the overflow flag read where the scaler keeps them
 * (loss_scaler.h): the gradients are divided by the scaler's scale inside the kernel, and a step with
 * its found_inf flag raised changes nothing, step counts included. On a GPU nothing waits for the
 * host. Does not update the scaler (call apex_loss_scaler_update after, which clears the flag).
 * APEX_ERR_DEVICE when a group's parameters are not on the scaler's device; otherwise as
 * apex_optimizer_step. */
APEX_API apex_status apex_optimizer_step_scaled(apex_optimizer *opt, apex_loss_scaler *scaler);

/* Global gradient-norm clipping (torch.nn.utils.clip_grad_norm_): computes the L2 norm of all
 * gradients of all groups, unscaled by 1 / grad_scale (the norm of the f32 values the step will
 * use), returns it in *total_norm (may be NULL) and, when it exceeds max_norm, makes the next step
 * multiply the gradients by max_norm / (norm + 1e-6). The gradients themselves are not rewritten:
 * the coefficient joins the unscale inside the step kernel, so f16 gradients lose no precision. A
 * non-finite norm is returned as it is and sets no coefficient (skip the step). APEX_ERR_INVALID_ARG
 * for max_norm not finite and > 0 or a bad grad_scale. */
APEX_API apex_status apex_optimizer_clip_grad_norm(apex_optimizer *opt, float max_norm, float grad_scale,
                                                   float *total_norm);

/* ---- state save / load -------------------------------------------------------------------------
 * The state is: per group its options (lr included) and per parameter its dtype, shape, step count,
 * f32 master (f16/bf16 parameters) and f32 state tensors, plus per-tensor scalars (NovoGrad). Layout,
 * all integers and floats little-endian:
 *     "APEXOPTM"  u32 version (1)  u32 kind  u32 ngroups  u64 total bytes
 *     per group:  u32 nfields, then per field u32 bits (the options, in the order of the struct)
 *                 u32 nparams  u32 nstates  u32 nscalars
 *                 per param:  u32 dtype  u32 ndim  i64 shape[ndim]  i64 step  u32 has_master
 *                             f32 master[numel] (if has_master)  f32 state[nstates][numel]
 *                 f32 scalars[nparams * nscalars]
 *     u64 FNV-1a hash of every byte before it
 * Loading restores the options and rewrites each f16/bf16 parameter as its master rounded, so that
 * save, load, step gives the same bits as step. It refuses (changing nothing) another kind, another
 * number of groups or parameters, another shape or dtype, or another state layout
 * or master weights where the optimizer has none (or the reverse)
 * (APEX_ERR_SHAPE / APEX_ERR_DTYPE / APEX_ERR_STATE, the message naming the first mismatch), and a
 * truncated or corrupted buffer (APEX_ERR_CORRUPT).
 * A GPU group's masters, states, step counts and per-tensor scalars are copied from and to the device;
 * the bytes are the same layout, so a state saved from a GPU optimizer loads into a CPU one and the reverse. */

/* Bytes apex_optimizer_save needs. */
APEX_API apex_status apex_optimizer_state_size(const apex_optimizer *opt, size_t *bytes);
/* Writes the state into buf (size bytes; APEX_ERR_INVALID_ARG if too small) and its length into
 * *written (may be NULL). */
APEX_API apex_status apex_optimizer_save(const apex_optimizer *opt, void *buf, size_t size, size_t *written);
APEX_API apex_status apex_optimizer_load(apex_optimizer *opt, const void *buf, size_t size);
/* The same through a FILE* (APEX_ERR_IO when it cannot be written or read). */
APEX_API apex_status apex_optimizer_save_file(const apex_optimizer *opt, FILE *f);
APEX_API apex_status apex_optimizer_load_file(apex_optimizer *opt, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
