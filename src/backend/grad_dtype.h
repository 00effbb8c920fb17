/* grad_dtype.h: running a backward kernel written for f32 gradients under args_nn.h's gradient-dtype
 * contract (gout and some gradients in f16/bf16).
 *
 * A backend whose kernel for a slot reads and writes f32 gradients only (the CPU's, which computes in
 * f32 anyway; a GPU path without a direct low-precision variant) keeps that kernel and calls the slot's
 * road below: each low-precision gradient input is widened into a temporary, each low-precision gradient
 * output gets a zeroed f32 temporary that the kernel adds its term into (0.0f + term, the contract's
 * fresh bits), and the temporary then lands in the real buffer, rounded once: dst + term when the call
 * accumulates, else the term alone. The numbers are the contract's, so a direct kernel and this road
 * agree to the rounding of each landed gradient. Which fields of each slot's arguments are gradients,
 * and how many elements each spans, is written here once for every backend.
 *
 * Every road has one form: when any of a's gradients is f16/bf16 it runs kernel (the backend's slot, or
 * its f32 path) on a copy of a whose gradients are f32, on backend be's memory, sets *ran to 1 and
 * returns kernel's status or the first failure of the road; otherwise it sets *ran to 0 and runs nothing.
 * Outputs may share a buffer (the packed q, k, v): every one that holds nothing yet is zeroed first, then
 * each lands in turn (each rounding once). A strided output spans its rows, and its temporary's other
 * columns land as +0. */
#ifndef APEX_BACKEND_GRAD_DTYPE_H
#define APEX_BACKEND_GRAD_DTYPE_H

#include "backend/backend.h"

typedef apex_status (*apex__grad_kernel)(const void *args);

apex_status apex__binary_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_binary_bwd_args *a, int *ran);
apex_status apex__unary_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_unary_bwd_args *a, int *ran);
apex_status apex__scale_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_scale_bwd_args *a, int *ran);
apex_status apex__dropout_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_dropout_bwd_args *a, int *ran);
apex_status apex__row_norm_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_row_norm_bwd_args *a, int *ran);
apex_status apex__embedding_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_embedding_bwd_args *a, int *ran);
apex_status apex__linear_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_linear_bwd_args *a, int *ran);
apex_status apex__attention_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_attention_bwd_args *a, int *ran);
apex_status apex__cross_entropy_bwd_f32(const apex_backend *be, apex__grad_kernel kernel, const apex_nn_cross_entropy_bwd_args *a,
                                        int *ran);

/* dst (n elements of dt) = dst + src (f32), or 0.0f + src when accumulate is 0, computed in f32 and
 * rounded once to dt, with backend be's kernels: the landing of a gradient computed in f32. */
apex_status apex__grad_land(const apex_backend *be, void *dst, apex_dtype dt, const float *src, size_t n, int accumulate);

#endif
