/* kernels.c: the multi-tensor calls of multi_tensor.h (scale, axpby, check_finite, l2norm, unscale_l2norm)
 * as fronts over the backend's slots (backend/args_mt.h). The lists' first tensor picks the backend, once;
 * the backend checks that every tensor is on its device (APEX_ERR_DEVICE naming the first that is not). */
#include "apex/multi_tensor.h"
#include "backend/backend.h"
#include "core/internal.h"

/* The backend of a list's first tensor (the CPU for an empty list, where the checks report it). */
static const apex_backend *backend_of(const char *fn, apex_tensor *const *t, int n) {
  return apex__backend_need(n > 0 && t && t[0] ? apex_tensor_device(t[0]) : APEX_DEVICE_CPU, fn);
}

static apex_status scale_impl(const char *fn, size_t chunk_size, int *overflow, apex_tensor *const *in,
                              apex_tensor *const *out, int n, float scale) {
  const apex_backend *b = backend_of(fn, in, n);
  if (!b) return apex_last_status();
  if (n > 0 && !out) return apex__fail(APEX_ERR_INVALID_ARG, "%s: the output tensor list 1 is NULL", fn);
  if (!b->mt_scale) return apex__backend_slot_missing(b, fn, "the multi-tensor scale");
  return b->mt_scale(&(apex_mt_scale_args){.fn = fn, .chunk_size = chunk_size, .n = n, .in = in, .out = out,
                                           .scale = scale, .overflow = overflow});
}

apex_status apex_mt_scale(size_t chunk_size, int *overflow, apex_tensor *const *in, apex_tensor *const *out, int n,
                          float scale) {
  return scale_impl("apex_mt_scale", chunk_size, overflow, in, out, n, scale);
}

apex_status apex_mt_unscale_flat(apex_tensor *flat_grads, float inv_scale, int *overflow) {
  if (!flat_grads) return apex__fail(APEX_ERR_INVALID_ARG, "apex_mt_unscale_flat: NULL gradient buffer");
  return apex_mt_scale(0, overflow, &flat_grads, &flat_grads, 1, inv_scale);
}

apex_status apex_mt_axpby(size_t chunk_size, int *overflow, apex_tensor *const *x, apex_tensor *const *y,
                          apex_tensor *const *out, int n, float a, float b, int arg_to_check) {
  const char *fn = "apex_mt_axpby";
  if (arg_to_check < -1 || arg_to_check > 1)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: arg_to_check is %d; use -1 (both), 0 (x) or 1 (y)", fn, arg_to_check);
  const apex_backend *be = backend_of(fn, x, n);
  if (!be) return apex_last_status();
  if (n > 0 && (!y || !out))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: the %s tensor list %d is NULL", fn, !y ? "y" : "output", !y ? 1 : 2);
  if (!be->mt_axpby) return apex__backend_slot_missing(be, fn, "the multi-tensor axpby");
  return be->mt_axpby(&(apex_mt_axpby_args){.fn = fn, .chunk_size = chunk_size, .n = n, .x = x, .y = y, .out = out,
                                            .a = a, .b = b, .arg_to_check = arg_to_check, .overflow = overflow});
}

apex_status apex_mt_check_finite(apex_tensor *const *tensors, int n, int *found_inf) {
  const char *fn = "apex_mt_check_finite";
  if (!found_inf) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL found_inf (pass the int to set)", fn);
  const apex_backend *b = backend_of(fn, tensors, n);
  if (!b) return apex_last_status();
  if (!b->mt_scale) return apex__backend_slot_missing(b, fn, "the multi-tensor scale");
  int flag = 0; /* the caller's int changes only on success */
  apex_status st = b->mt_scale(&(apex_mt_scale_args){.fn = fn, .n = n, .in = tensors, .out = NULL, .scale = 1.0f,
                                                     .overflow = &flag});
  if (st == APEX_OK) *found_inf = flag;
  return st;
}

static apex_status norm_impl(const char *fn, size_t chunk_size, int *overflow, apex_tensor *const *x, int n,
                             float inv_scale, float *global_norm, float *per_tensor) {
  const apex_backend *b = backend_of(fn, x, n);
  if (!b) return apex_last_status();
  if (!b->mt_l2norm) return apex__backend_slot_missing(b, fn, "the multi-tensor L2 norm");
  return b->mt_l2norm(&(apex_mt_l2norm_args){.fn = fn, .chunk_size = chunk_size, .n = n, .x = x,
                                             .inv_scale = inv_scale, .global_norm = global_norm,
                                             .per_tensor = per_tensor, .overflow = overflow});
}

apex_status apex_mt_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n, float *global_norm,
                           float *per_tensor) {
  return norm_impl("apex_mt_l2norm", chunk_size, overflow, x, n, 1.0f, global_norm, per_tensor);
}

apex_status apex_mt_unscale_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n, float inv_scale,
                                   float *global_norm, float *per_tensor) {
  return norm_impl("apex_mt_unscale_l2norm", chunk_size, overflow, x, n, inv_scale, global_norm, per_tensor);
}
