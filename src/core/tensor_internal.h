/* tensor_internal.h: the tensor and storage structs, for the layers inside apex. Public code sees
 * only the opaque apex_tensor of tensor.h. */
#ifndef APEX_CORE_TENSOR_INTERNAL_H
#define APEX_CORE_TENSOR_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>

#include "apex/tensor.h"
#include "core/memory.h"

typedef struct apex_storage {
  void *data;
  size_t bytes;
  int owned; /* 0 for apex_tensor_wrap: the caller frees the memory */
  int releasable; /* its owner may free data while the tensors stay, and make it again (releasable.c) */
  apex_device device;
  const apex_memory *mem; /* the device's memory slots: what frees, copies and fills the data */
  atomic_int refs;
} apex_storage;

struct apex_tensor {
  apex_storage *storage;
  size_t offset; /* in bytes */
  apex_dtype dtype;
  apex_device device;
  int ndim;
  int64_t shape[APEX_MAX_DIMS];
  size_t numel;
};

apex_storage *apex__storage_alloc(size_t bytes);
/* Zero-filled storage of `bytes` in memory m; NULL with a message naming fn on failure. */
apex_storage *apex__storage_alloc_with(const apex_memory *m, size_t bytes, const char *fn);
void apex__storage_retain(apex_storage *s);
void apex__storage_release(apex_storage *s);
/* A new tensor over storage s at byte_offset (takes its own reference to s). */
apex_tensor *apex__tensor_view_of(apex_storage *s, size_t byte_offset, apex_dtype dtype, int ndim, const int64_t *shape);

#endif
