/* grad_dtype.h: running a backward kernel written for f32 gradients under args_nn.h's gradient-dtype
 * contract (gout and some gradients in f16/bf16).
 *
 * A backend whose kernel for a slot reads and writes f32 gradients only (the CPU's, which computes in
 * f32 anyway; a GPU path without a direct low-precision variant) keeps that kernel and calls
 * apex__grads_via_f32: each low-precision gradient input is widened into a temporary, each low-precision
 * gradient output gets a zeroed f32 temporary that the kernel adds its term into (0.0f + term, the
 * contract's fresh bits), and the temporary then lands in the real buffer, rounded once: dst + term when
 * the call accumulates, else the term alone. The numbers are the contract's, so a direct kernel and this
 * road agree to the rounding of each landed gradient. */
#ifndef APEX_BACKEND_GRAD_DTYPE_H
#define APEX_BACKEND_GRAD_DTYPE_H

#include "backend/backend.h"

/* A gradient the kernel reads: *data (n elements of *dtype), rewritten to f32 for the call. */
typedef struct apex__grad_in {
  const void **data;
  apex_dtype *dtype;
  size_t n;
} apex__grad_in;

/* A gradient the kernel writes: *data spans n elements of *dtype (a strided output spans its rows; its
 * temporary's other columns land as +0), *accumulate its flag. NULL data: no gradient wanted. */
typedef struct apex__grad_out {
  void **data;
  apex_dtype *dtype;
  size_t n;
  int *accumulate;
} apex__grad_out;

#define APEX__GRAD_IO_MAX 4

/* 1 when any listed gradient is not f32 (the call then needs apex__grads_via_f32 or a direct path). */
int apex__grads_low(const apex__grad_in *in, int n_in, const apex__grad_out *out, int n_out);

/* Calls kernel(args) with the listed gradients as f32 (args is the caller's copy of the slot's
 * arguments; the lists point into it), on backend be's memory, then lands each output as above. At most
 * APEX__GRAD_IO_MAX of each. Outputs may share a buffer: every one that holds nothing yet is zeroed
 * first, then each lands in turn (each rounding once). fn names the slot in messages. */
apex_status apex__grads_via_f32(const apex_backend *be, const char *fn, apex_status (*kernel)(const void *args), void *args,
                                const apex__grad_in *in, int n_in, const apex__grad_out *out, int n_out);

/* dst (n elements of dt) = dst + src (f32), or 0.0f + src when accumulate is 0, computed in f32 and
 * rounded once to dt, with backend be's kernels: the landing of a gradient computed in f32. */
apex_status apex__grad_land(const apex_backend *be, void *dst, apex_dtype dt, const float *src, size_t n, int accumulate);

#endif
