/* multi_tensor.h: one launch over many tensors (Apex's multi_tensor_applier, in C).
 *
 * A launch takes up to APEX_MT_MAX_LISTS lists of tensors (say grads, params, m, v, masters), the
 * same number of tensors in each list and the same element count at each index; each list may have
 * its own dtype. The tensors are cut into chunks of chunk_size elements that the threads share; a
 * chunk is processed in tiles, each tile widened to f32 (f32 lists are used in place), handed to the
 * kernel, and the lists the kernel writes narrowed back with round-to-nearest-even. Non-finite
 * values seen by the kernel raise one overflow flag for the whole launch.
 *
 * The flag is an int the caller owns: kernels set it to 1 and never clear it, so one flag can
 * gather several launches (Apex's noop/overflow buffer). Results never depend on the thread count:
 * chunk and tile boundaries depend only on chunk_size, and reductions combine per-chunk partials in
 * chunk order. */
#ifndef APEX_MULTI_TENSOR_H
#define APEX_MULTI_TENSOR_H

#include <stddef.h>

#include "apex/mt_apply.h" /* the applier and its constants, for writing new kernels */
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the kernels -------------------------------------------------------------------------------- */

/* out[i] = in[i] * scale for every tensor; sets *overflow if any input is Inf or NaN (the output
 * is written anyway, as in Apex). in and out may be the same tensors (in-place). */
APEX_API apex_status apex_mt_scale(size_t chunk_size, int *overflow, apex_tensor *const *in, apex_tensor *const *out,
                                   int n, float scale);

/* out[i] = a * x[i] + b * y[i]. arg_to_check picks which inputs are checked for Inf/NaN:
 * -1 both, 0 only x, 1 only y (Apex's convention). */
APEX_API apex_status apex_mt_axpby(size_t chunk_size, int *overflow, apex_tensor *const *x, apex_tensor *const *y,
                                   apex_tensor *const *out, int n, float a, float b, int arg_to_check);

/* Are there Inf/NaN in these tensors? One read pass over tensors[0..n) (any dtype, each may be f32,
 * f16 or bf16; all on the CPU, or all on the GPU where the CUDA multi-tensor kernel does the pass),
 * writing nothing: *found_inf is set to 1 if any element is Inf or NaN, else 0 (unlike the other
 * calls' flags, it is an answer, not an accumulator). For bring-your-own-model programs whose
 * optimizer unscales in its kernel (apex_optimizer_step's grad_scale): check, then
 * apex_loss_scaler_update(found_inf). APEX_ERR_INVALID_ARG (found_inf untouched) for a NULL found_inf,
 * a NULL list or tensor or a negative n; APEX_ERR_DEVICE for a list that mixes devices. */
APEX_API apex_status apex_mt_check_finite(apex_tensor *const *tensors, int n, int *found_inf);

/* The L2 norm of all elements of all tensors (global_norm, may be NULL) and of each tensor
 * (per_tensor: NULL or n floats). Squares are summed in f32 within a tile and in f64 across tiles,
 * in a fixed order. Non-finite elements set *overflow (and make the norm non-finite). */
APEX_API apex_status apex_mt_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n,
                                    float *global_norm, float *per_tensor);

/* As apex_mt_l2norm of x[i] * inv_scale, without writing x: the norm of unscaled gradients for
 * clipping before the unscale is done (Apex's multi_tensor_unscale_l2norm). */
APEX_API apex_status apex_mt_unscale_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n,
                                            float inv_scale, float *global_norm, float *per_tensor);

/* ---- combine tensors ------------------------------------------------------------------------------ */

/* Copies n tensors of one dtype into one new contiguous 1-d tensor (*flat) in order, and makes each
 * original a view into it: afterwards writing through tensors[i] writes flat, and the tensors'
 * old buffers are released. All must have the same dtype (else APEX_ERR_DTYPE, naming the first
 * that differs) and live on one device, where *flat is made (else APEX_ERR_DEVICE). Tensors
 * wrapping caller memory are refused (apex cannot re-point the caller's pointer). On error nothing
 * is changed. */
APEX_API apex_status apex_tensor_flatten(apex_tensor *const *tensors, int n, apex_tensor **flat);

/* New tensors out[0..n) viewing consecutive segments of flat shaped like like[0..n) (the inverse
 * of flatten). The element counts must add up to flat's (else APEX_ERR_SHAPE). On error no tensor is
 * created and out[] is left as it was. */
APEX_API apex_status apex_tensor_unflatten(apex_tensor *flat, apex_tensor *const *like, int n, apex_tensor **out);

/* "Combine grad for unscale": multiplies every element of one flat gradient buffer by inv_scale in
 * place and sets *overflow if any was Inf/NaN, in one pass over one buffer instead of one launch per
 * gradient (the Ascend edition's combine_grad). */
APEX_API apex_status apex_mt_unscale_flat(apex_tensor *flat_grads, float inv_scale, int *overflow);

#ifdef __cplusplus
}
#endif
#endif
