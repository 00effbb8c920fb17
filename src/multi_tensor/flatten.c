/* flatten.c: Apex's "combine tensors": many tensors into one contiguous buffer with the originals as
 * views into it (so one multi-tensor launch, one all-reduce, or one unscale covers them all), and
 * the inverse, views of a flat buffer shaped like a list of tensors. */
#include <stdlib.h>
#include <string.h>

#include "apex/multi_tensor.h"
#include "core/internal.h"
#include "core/tensor_internal.h"

apex_status apex_tensor_flatten(apex_tensor *const *tensors, int n, apex_tensor **flat) {
  if (!flat) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_flatten: NULL output");
  if (n < 1 || !tensors) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_flatten: need at least one tensor (got %d)", n);
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    const apex_tensor *t = tensors[i];
    if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_flatten: tensor %d is NULL", i);
    if (t->device != tensors[0]->device)
      return apex__fail(APEX_ERR_DEVICE, "apex_tensor_flatten: tensor %d is on device %s but tensor 0 is on device %s; flatten each device's "
                        "tensors separately", i, t->storage->mem->name, tensors[0]->storage->mem->name);
    if (t->dtype != tensors[0]->dtype)
      return apex__fail(APEX_ERR_DTYPE, "apex_tensor_flatten: tensor %d is %s but tensor 0 is %s; flatten each dtype separately", i,
                        apex_dtype_name(t->dtype), apex_dtype_name(tensors[0]->dtype));
    if (!t->storage->owned)
      return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_flatten: tensor %d wraps caller memory, which apex cannot re-point", i);
    for (int j = 0; j < i; j++)
      if (tensors[j] == t) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_flatten: tensor %d appears twice (also at %d)", i, j);
    total += t->numel;
  }
  int64_t shape = (int64_t)total;
  /* the flat buffer lives where the tensors do, filled by that device's own copies (a GPU's data is
   * not the host's to memcpy); every copy is made before any tensor is re-pointed, so a failed one
   * leaves them all as they were */
  const apex_memory *mem = tensors[0]->storage->mem;
  apex_tensor *f = apex__tensor_create_with(mem, tensors[0]->dtype, 1, &shape, "apex_tensor_flatten");
  if (!f) return apex_last_status();
  size_t esz = apex_dtype_size(f->dtype), at = 0;
  for (int i = 0; i < n; i++) {
    apex_tensor *t = tensors[i];
    char *dst = (char *)apex_tensor_data(f) + at * esz;
    if (t->device == APEX_DEVICE_CPU) {
      memcpy(dst, apex_tensor_data(t), t->numel * esz);
    } else {
      apex_status st = t->numel ? mem->copy(dst, apex_tensor_data(t), t->numel * esz, APEX_COPY_D2D, 0) : APEX_OK;
      if (st != APEX_OK) {
        apex_tensor_destroy(f);
        return st;
      }
    }
    at += t->numel;
  }
  at = 0;
  for (int i = 0; i < n; i++) {
    apex_tensor *t = tensors[i];
    apex__storage_release(t->storage);
    apex__storage_retain(f->storage);
    t->storage = f->storage;
    t->offset = at * esz;
    at += t->numel;
  }
  *flat = f;
  return APEX_OK;
}

apex_status apex_tensor_unflatten(apex_tensor *flat, apex_tensor *const *like, int n, apex_tensor **out) {
  if (!flat || !out || (n > 0 && !like)) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_unflatten: NULL argument");
  if (n < 0) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_unflatten: negative count %d", n);
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (!like[i]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_unflatten: template %d is NULL", i);
    total += like[i]->numel;
  }
  if (total != flat->numel)
    return apex__fail(APEX_ERR_SHAPE, "apex_tensor_unflatten: the templates hold %zu elements but the flat tensor has %zu", total, flat->numel);
  /* Made aside and copied out at the end, so that a failure leaves the caller's out[] as it was. */
  apex_tensor **views = calloc((size_t)n + 1, sizeof *views);
  if (!views) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_unflatten: out of memory");
  size_t esz = apex_dtype_size(flat->dtype), at = 0;
  for (int i = 0; i < n; i++) {
    views[i] = apex__tensor_view_of(flat->storage, flat->offset + at * esz, flat->dtype, like[i]->ndim, like[i]->shape);
    if (!views[i]) {
      for (int j = 0; j < i; j++) apex_tensor_destroy(views[j]);
      free(views);
      return APEX_ERR_OUT_OF_MEMORY;
    }
    at += like[i]->numel;
  }
  memcpy(out, views, (size_t)n * sizeof *out);
  free(views);
  return APEX_OK;
}
