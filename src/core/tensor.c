/* tensor.c: tensors as views into reference-counted storage.
 *
 * Storage is allocated 64-byte aligned (a cache line; also what AVX-512 loads like), zero-filled.
 * Wrapped storage belongs to the caller and is never freed here. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/tensor_internal.h"

#define APEX_ALIGN 64

static apex_storage *storage_new(size_t bytes) {
  apex_storage *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  size_t padded = (bytes + APEX_ALIGN - 1) / APEX_ALIGN * APEX_ALIGN;
  s->data = aligned_alloc(APEX_ALIGN, padded ? padded : APEX_ALIGN);
  if (!s->data) {
    free(s);
    return NULL;
  }
  memset(s->data, 0, padded);
  s->bytes = bytes;
  s->owned = 1;
  atomic_init(&s->refs, 1);
  return s;
}

void apex__storage_release(apex_storage *s) {
  if (!s) return;
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    if (s->owned) free(s->data);
    free(s);
  }
}

void apex__storage_retain(apex_storage *s) { atomic_fetch_add(&s->refs, 1); }

apex_storage *apex__storage_alloc(size_t bytes) { return storage_new(bytes); }

/* Checks a shape and computes its element count; returns APEX_OK or an error naming `who`. */
static apex_status shape_numel(const char *who, int ndim, const int64_t *shape, size_t *numel) {
  if (ndim < 0 || ndim > APEX_MAX_DIMS)
    return apex__fail(APEX_ERR_SHAPE, "%s: %d dimensions; apex tensors have 0 to %d", who, ndim, APEX_MAX_DIMS);
  if (ndim > 0 && !shape) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL shape for %d dimensions", who, ndim);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return apex__fail(APEX_ERR_SHAPE, "%s: dimension %d is %lld; sizes must be >= 0", who, i, (long long)shape[i]);
    if (shape[i] > 0 && n > (SIZE_MAX / 8) / (size_t)shape[i])
      return apex__fail(APEX_ERR_SHAPE, "%s: the shape's element count overflows", who);
    n *= (size_t)shape[i];
  }
  *numel = n;
  return APEX_OK;
}

/* A tensor header over storage s (taking one reference that the caller already holds). */
static apex_tensor *tensor_new(apex_storage *s, size_t offset, apex_dtype dtype, int ndim, const int64_t *shape,
                               size_t numel) {
  apex_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->storage = s;
  t->offset = offset;
  t->dtype = dtype;
  t->device = APEX_DEVICE_CPU;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->numel = numel;
  return t;
}

apex_tensor *apex_tensor_create_on(apex_device device, apex_dtype dtype, int ndim, const int64_t *shape) {
  size_t numel;
  if (device != APEX_DEVICE_CPU)
    return apex__fail_null(APEX_ERR_UNSUPPORTED, "apex_tensor_create_on: device %d is not built into this library; use APEX_DEVICE_CPU", (int)device);
  if (apex__check_dtype(dtype, "apex_tensor_create") != APEX_OK) return NULL;
  if (shape_numel("apex_tensor_create", ndim, shape, &numel) != APEX_OK) return NULL;
  apex_storage *s = storage_new(numel * apex_dtype_size(dtype));
  if (!s) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_create: cannot allocate %zu bytes", numel * apex_dtype_size(dtype));
  apex_tensor *t = tensor_new(s, 0, dtype, ndim, shape, numel);
  if (!t) {
    apex__storage_release(s);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_create: out of memory");
  }
  return t;
}

apex_tensor *apex_tensor_create(apex_dtype dtype, int ndim, const int64_t *shape) {
  return apex_tensor_create_on(APEX_DEVICE_CPU, dtype, ndim, shape);
}

apex_tensor *apex_tensor_wrap(void *data, apex_dtype dtype, int ndim, const int64_t *shape) {
  size_t numel;
  if (apex__check_dtype(dtype, "apex_tensor_wrap") != APEX_OK) return NULL;
  if (shape_numel("apex_tensor_wrap", ndim, shape, &numel) != APEX_OK) return NULL;
  if (!data && numel > 0) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_wrap: NULL data for %zu elements", numel);
  if ((uintptr_t)data % apex_dtype_size(dtype) != 0)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_wrap: data %p is not aligned to its %zu-byte elements", data, apex_dtype_size(dtype));
  apex_storage *s = calloc(1, sizeof *s);
  if (!s) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_wrap: out of memory");
  s->data = data;
  s->bytes = numel * apex_dtype_size(dtype);
  s->owned = 0;
  atomic_init(&s->refs, 1);
  apex_tensor *t = tensor_new(s, 0, dtype, ndim, shape, numel);
  if (!t) {
    apex__storage_release(s);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_wrap: out of memory");
  }
  return t;
}

apex_tensor *apex_tensor_clone(const apex_tensor *t) {
  if (!t) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_clone: NULL tensor");
  apex_tensor *c = apex_tensor_create(t->dtype, t->ndim, t->shape);
  if (c) memcpy(apex_tensor_data(c), apex_tensor_data(t), apex_tensor_nbytes(t));
  return c;
}

void apex_tensor_destroy(apex_tensor *t) {
  if (!t) return;
  apex__storage_release(t->storage);
  free(t);
}

apex_tensor *apex__tensor_view_of(apex_storage *s, size_t byte_offset, apex_dtype dtype, int ndim, const int64_t *shape) {
  size_t numel;
  if (shape_numel("apex_tensor_view", ndim, shape, &numel) != APEX_OK) return NULL;
  if (byte_offset + numel * apex_dtype_size(dtype) > s->bytes)
    return apex__fail_null(APEX_ERR_SHAPE, "apex_tensor_view: %zu elements at byte %zu run past the %zu-byte storage", numel, byte_offset, s->bytes);
  apex__storage_retain(s);
  apex_tensor *t = tensor_new(s, byte_offset, dtype, ndim, shape, numel);
  if (!t) {
    apex__storage_release(s);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_view: out of memory");
  }
  return t;
}

apex_tensor *apex_tensor_view(apex_tensor *t, int ndim, const int64_t *shape) {
  size_t numel;
  if (!t) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_view: NULL tensor");
  if (shape_numel("apex_tensor_view", ndim, shape, &numel) != APEX_OK) return NULL;
  if (numel != t->numel) {
    char buf[96];
    return apex__fail_null(APEX_ERR_SHAPE, "apex_tensor_view: a view of %zu elements over a tensor %s of %zu", numel,
                           apex_tensor_shape_str(t, buf, sizeof buf), t->numel);
  }
  return apex__tensor_view_of(t->storage, t->offset, t->dtype, ndim, shape);
}

apex_tensor *apex_tensor_slice_view(apex_tensor *t, size_t offset, int ndim, const int64_t *shape) {
  size_t numel;
  if (!t) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_slice_view: NULL tensor");
  if (shape_numel("apex_tensor_slice_view", ndim, shape, &numel) != APEX_OK) return NULL;
  if (offset > t->numel || numel > t->numel - offset)
    return apex__fail_null(APEX_ERR_SHAPE, "apex_tensor_slice_view: elements [%zu, %zu) are outside a tensor of %zu", offset,
                           offset + numel, t->numel);
  return apex__tensor_view_of(t->storage, t->offset + offset * apex_dtype_size(t->dtype), t->dtype, ndim, shape);
}

int apex_tensor_shares_storage(const apex_tensor *a, const apex_tensor *b) { return a && b && a->storage == b->storage; }

apex_dtype apex_tensor_dtype(const apex_tensor *t) { return t->dtype; }
apex_device apex_tensor_device(const apex_tensor *t) { return t->device; }
int apex_tensor_ndim(const apex_tensor *t) { return t->ndim; }
const int64_t *apex_tensor_shape(const apex_tensor *t) { return t->shape; }
size_t apex_tensor_numel(const apex_tensor *t) { return t->numel; }
size_t apex_tensor_nbytes(const apex_tensor *t) { return t->numel * apex_dtype_size(t->dtype); }
void *apex_tensor_data(const apex_tensor *t) { return (char *)t->storage->data + t->offset; }

int64_t apex_tensor_dim(const apex_tensor *t, int dim) {
  if (dim < 0) dim += t->ndim;
  if (dim < 0 || dim >= t->ndim) return -1;
  return t->shape[dim];
}

int apex_tensor_same_shape(const apex_tensor *a, const apex_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

char *apex_tensor_shape_str(const apex_tensor *t, char *buf, size_t size) {
  if (!buf || size == 0) return buf;
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int i = 0; t && i < t->ndim && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  if (used < size) snprintf(buf + used, size - used, "]");
  return buf;
}

apex_status apex_tensor_fill(apex_tensor *t, float value) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_fill: NULL tensor");
  void *p = apex_tensor_data(t);
  if (t->dtype == APEX_F32) {
    for (size_t i = 0; i < t->numel; i++) ((float *)p)[i] = value;
  } else {
    uint16_t v;
    apex__convert_portable(&v, t->dtype, &value, APEX_F32, 1);
    for (size_t i = 0; i < t->numel; i++) ((uint16_t *)p)[i] = v;
  }
  return APEX_OK;
}

apex_status apex_tensor_copy(apex_tensor *dst, const apex_tensor *src) {
  if (!dst || !src) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_copy: NULL tensor");
  if (dst->numel != src->numel) {
    char a[96], b[96];
    return apex__fail(APEX_ERR_SHAPE, "apex_tensor_copy: destination %s has %zu elements, source %s has %zu",
                      apex_tensor_shape_str(dst, a, sizeof a), dst->numel, apex_tensor_shape_str(src, b, sizeof b), src->numel);
  }
  if (apex_tensor_data(dst) == apex_tensor_data(src) && dst->dtype == src->dtype) return APEX_OK;
  return apex_convert(apex_tensor_data(dst), dst->dtype, apex_tensor_data(src), src->dtype, src->numel);
}

apex_tensor *apex_tensor_to(const apex_tensor *src, apex_dtype dtype) {
  if (!src) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_to: NULL tensor");
  apex_tensor *t = apex_tensor_create(dtype, src->ndim, src->shape);
  if (!t) return NULL;
  if (apex_tensor_copy(t, src) != APEX_OK) {
    apex_tensor_destroy(t);
    return NULL;
  }
  return t;
}

float apex_tensor_get(const apex_tensor *t, size_t i) {
  float v;
  apex__convert_portable(&v, APEX_F32, (const char *)apex_tensor_data(t) + i * apex_dtype_size(t->dtype), t->dtype, 1);
  return v;
}

void apex_tensor_set(apex_tensor *t, size_t i, float value) {
  apex__convert_portable((char *)apex_tensor_data(t) + i * apex_dtype_size(t->dtype), t->dtype, &value, APEX_F32, 1);
}
