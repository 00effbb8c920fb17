/* tensor.c: tensors as views into reference-counted storage.
 *
 * A storage points to its device's memory slots (core/memory.h): allocation, freeing, copies and fills
 * go through them, so that this file names no device API and every layer above sees one tensor type.
 * Host storage is 64-byte aligned (a cache line; also what AVX-512 loads like) and zero-filled.
 * Wrapped storage belongs to the caller and is never freed here. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/tensor_internal.h"

/* A storage header over data (refs 1). */
static apex_storage *storage_header(const apex_memory *m, void *data, size_t bytes, int owned) {
  apex_storage *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->data = data;
  s->bytes = bytes;
  s->owned = owned;
  s->device = m->device;
  s->mem = m;
  atomic_init(&s->refs, 1);
  return s;
}

/* Zero-filled storage in memory m; NULL with a message (the device's own, or out of memory). */
static apex_storage *storage_new_with(const apex_memory *m, size_t bytes, const char *fn) {
  void *data = NULL;
  if (m->alloc(bytes, 1, &data) != APEX_OK) return NULL;
  apex_storage *s = storage_header(m, data, bytes, 1);
  if (!s) {
    m->free(data);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  return s;
}

void apex__storage_release(apex_storage *s) {
  if (!s) return;
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    if (s->owned) s->mem->free(s->data);
    free(s);
  }
}

void apex__storage_retain(apex_storage *s) { atomic_fetch_add(&s->refs, 1); }

apex_storage *apex__storage_alloc(size_t bytes) { return storage_new_with(&apex__host_memory, bytes, "apex_tensor_create"); }

apex_storage *apex__storage_alloc_with(const apex_memory *m, size_t bytes, const char *fn) { return storage_new_with(m, bytes, fn); }

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
  t->device = s->device;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->numel = numel;
  return t;
}

apex_tensor *apex__tensor_create_with(const apex_memory *m, apex_dtype dtype, int ndim, const int64_t *shape,
                                      const char *fn) {
  size_t numel;
  if (apex__check_dtype(dtype, "apex_tensor_create") != APEX_OK) return NULL;
  if (shape_numel("apex_tensor_create", ndim, shape, &numel) != APEX_OK) return NULL;
  apex_storage *s = storage_new_with(m, numel * apex_dtype_size(dtype), fn);
  if (!s) return NULL;
  apex_tensor *t = tensor_new(s, 0, dtype, ndim, shape, numel);
  if (!t) {
    apex__storage_release(s);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_create: out of memory");
  }
  return t;
}

apex_tensor *apex_tensor_create(apex_dtype dtype, int ndim, const int64_t *shape) {
  return apex__tensor_create_with(&apex__host_memory, dtype, ndim, shape, "apex_tensor_create");
}

apex_tensor *apex_tensor_wrap(void *data, apex_dtype dtype, int ndim, const int64_t *shape) {
  return apex__tensor_wrap_with(&apex__host_memory, data, dtype, ndim, shape);
}

apex_tensor *apex__tensor_wrap_with(const apex_memory *m, void *data, apex_dtype dtype, int ndim,
                                    const int64_t *shape) {
  size_t numel;
  if (apex__check_dtype(dtype, "apex_tensor_wrap") != APEX_OK) return NULL;
  if (shape_numel("apex_tensor_wrap", ndim, shape, &numel) != APEX_OK) return NULL;
  if (!data && numel > 0) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_wrap: NULL data for %zu elements", numel);
  if ((uintptr_t)data % apex_dtype_size(dtype) != 0)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_wrap: data %p is not aligned to its %zu-byte elements", data, apex_dtype_size(dtype));
  apex_storage *s = storage_header(m, data, numel * apex_dtype_size(dtype), 0);
  if (!s) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_wrap: out of memory");
  apex_tensor *t = tensor_new(s, 0, dtype, ndim, shape, numel);
  if (!t) {
    apex__storage_release(s);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_wrap: out of memory");
  }
  return t;
}

apex_tensor *apex_tensor_clone(const apex_tensor *t) {
  if (!t) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_clone: NULL tensor");
  apex_tensor *c = apex__tensor_create_with(t->storage->mem, t->dtype, t->ndim, t->shape, "apex_tensor_clone");
  if (c && apex_tensor_copy(c, t) != APEX_OK) {
    apex_tensor_destroy(c);
    return NULL;
  }
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

/* The accessors answer a NULL tensor (a failed call earlier in a chain) with a value no tensor has,
 * and leave a message, so that the chain fails where it is checked instead of crashing here. */
static int null_tensor(const apex_tensor *t, const char *fn) {
  if (t) return 0;
  apex__fail_null_arg(fn, "tensor");
  return 1;
}

apex_dtype apex_tensor_dtype(const apex_tensor *t) { return null_tensor(t, __func__) ? APEX_DTYPE_COUNT : t->dtype; }
apex_device apex_tensor_device(const apex_tensor *t) { return null_tensor(t, __func__) ? APEX_DEVICE_NONE : t->device; }
int apex_tensor_ndim(const apex_tensor *t) { return null_tensor(t, __func__) ? -1 : t->ndim; }
const int64_t *apex_tensor_shape(const apex_tensor *t) { return null_tensor(t, __func__) ? NULL : t->shape; }
size_t apex_tensor_numel(const apex_tensor *t) { return null_tensor(t, __func__) ? 0 : t->numel; }
size_t apex_tensor_nbytes(const apex_tensor *t) {
  return null_tensor(t, __func__) ? 0 : t->numel * apex_dtype_size(t->dtype);
}
void *apex_tensor_data(const apex_tensor *t) {
  return null_tensor(t, __func__) || !t->storage->data ? NULL : (char *)t->storage->data + t->offset; /* NULL: released */
}

int64_t apex_tensor_dim(const apex_tensor *t, int dim) {
  if (null_tensor(t, __func__)) return -1;
  if (dim < 0) dim += t->ndim;
  if (dim < 0 || dim >= t->ndim) {
    apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_dim: dimension %d of a %d-d tensor", dim < 0 ? dim - t->ndim : dim, t->ndim);
    return -1;
  }
  return t->shape[dim];
}

int apex_tensor_same_shape(const apex_tensor *a, const apex_tensor *b) {
  if (!a || !b) return 0;
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

void apex__fill_bits(void *p, size_t size, uint32_t bits, size_t n) {
  long long nblocks = (long long)((n + APEX_THREAD_BLOCK - 1) / APEX_THREAD_BLOCK);
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (long long b = 0; b < nblocks; b++) {
    size_t lo = (size_t)b * APEX_THREAD_BLOCK, len = n - lo < APEX_THREAD_BLOCK ? n - lo : APEX_THREAD_BLOCK;
    if (bits == 0) memset((char *)p + lo * size, 0, len * size);
    else if (size == 4) for (size_t i = lo; i < lo + len; i++) ((uint32_t *)p)[i] = bits;
    else if (size == 2) for (size_t i = lo; i < lo + len; i++) ((uint16_t *)p)[i] = (uint16_t)bits;
    else memset((char *)p + lo, (int)(bits & 0xFF), len);
  }
}

apex_status apex_tensor_fill(apex_tensor *t, float value) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "apex_tensor_fill: NULL tensor");
  apex_status st = apex__tensor_remake(t, 1, "apex_tensor_fill");
  if (st != APEX_OK) return st;
  return t->storage->mem->fill(apex_tensor_data(t), t->dtype, value, t->numel);
}

/* A copy with at least one side off the host, through that side's memory slots. Conversions run on the
 * device (with the host's rounding): a host source of another dtype goes up first, a device source of
 * another dtype is converted before it comes down. */
static apex_status copy_device(apex_tensor *dst, const apex_tensor *src, int wait) {
  void *d = apex_tensor_data(dst);
  const void *s = apex_tensor_data(src);
  int up = src->device == APEX_DEVICE_CPU, down = dst->device == APEX_DEVICE_CPU;
  const apex_memory *m = up ? dst->storage->mem : src->storage->mem;
  apex_copy_kind dir = up ? APEX_COPY_H2D : down ? APEX_COPY_D2H : APEX_COPY_D2D;
  if (dst->dtype == src->dtype) return m->copy(d, s, apex_tensor_nbytes(src), dir, wait && down);
  if (dir == APEX_COPY_D2D) return m->convert(d, dst->dtype, s, src->dtype, src->numel);
  /* Stage through a device buffer of the other side's layout. */
  apex_dtype staged = up ? src->dtype : dst->dtype;
  apex_tensor *tmp = apex__tensor_create_with(m, staged, src->ndim, src->shape, "apex_tensor_copy");
  if (!tmp) return APEX_ERR_OUT_OF_MEMORY;
  apex_status st;
  if (up) {
    st = m->copy(apex_tensor_data(tmp), s, apex_tensor_nbytes(src), APEX_COPY_H2D, 0);
    if (st == APEX_OK) st = m->convert(d, dst->dtype, apex_tensor_data(tmp), staged, src->numel);
  } else {
    st = m->convert(apex_tensor_data(tmp), staged, s, src->dtype, src->numel);
    if (st == APEX_OK) st = m->copy(d, apex_tensor_data(tmp), apex_tensor_nbytes(dst), APEX_COPY_D2H, 1);
  }
  apex_tensor_destroy(tmp); /* a device allocator reuses it only behind the queued work */
  return st;
}

static apex_status copy_impl(apex_tensor *dst, const apex_tensor *src, int wait, const char *fn) {
  if (!dst || !src) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL tensor", fn);
  if (dst->numel != src->numel) {
    char a[96], b[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: destination %s has %zu elements, source %s has %zu", fn,
                      apex_tensor_shape_str(dst, a, sizeof a), dst->numel, apex_tensor_shape_str(src, b, sizeof b), src->numel);
  }
  /* Released memory reads as zeros (releasable.c); a write makes it again. */
  apex_status st = apex__tensor_remake(dst, 1, fn);
  if (st != APEX_OK) return st;
  if (apex_tensor_released(src)) return dst->storage->mem->fill(apex_tensor_data(dst), dst->dtype, 0.0f, dst->numel);
  if (apex_tensor_data(dst) == apex_tensor_data(src) && dst->dtype == src->dtype && dst->device == src->device)
    return APEX_OK;
  if (dst->device != APEX_DEVICE_CPU || src->device != APEX_DEVICE_CPU) return copy_device(dst, src, wait);
  return apex_convert(apex_tensor_data(dst), dst->dtype, apex_tensor_data(src), src->dtype, src->numel);
}

apex_status apex_tensor_copy(apex_tensor *dst, const apex_tensor *src) {
  return copy_impl(dst, src, 1, "apex_tensor_copy");
}

apex_status apex_tensor_copy_async(apex_tensor *dst, const apex_tensor *src) {
  return copy_impl(dst, src, 0, "apex_tensor_copy_async");
}

apex_tensor *apex_tensor_to(const apex_tensor *src, apex_dtype dtype) {
  if (!src) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_to: NULL tensor");
  apex_tensor *t = apex__tensor_create_with(src->storage->mem, dtype, src->ndim, src->shape, "apex_tensor_to");
  if (!t) return NULL;
  if (apex_tensor_copy(t, src) != APEX_OK) {
    apex_tensor_destroy(t);
    return NULL;
  }
  return t;
}

/* Element i's bytes on the host (copied down from a device tensor). */
static void element_bytes(const apex_tensor *t, size_t i, void *out) {
  size_t es = apex_dtype_size(t->dtype);
  const char *p = (const char *)apex_tensor_data(t) + i * es;
  if (t->device == APEX_DEVICE_CPU) {
    memcpy(out, p, es);
    return;
  }
  if (t->storage->mem->copy(out, p, es, APEX_COPY_D2H, 1) != APEX_OK) memset(out, 0xFF, es); /* NaN: no silent zero */
}

/* Refuses what apex_tensor_get/set cannot read or write: a NULL tensor or an index past the end. */
static int bad_element(const apex_tensor *t, size_t i, const char *fn) {
  if (null_tensor(t, fn)) return 1;
  if (i < t->numel) return 0;
  apex__fail(APEX_ERR_INVALID_ARG, "%s: element %zu of a tensor of %zu elements", fn, i, t->numel);
  return 1;
}

float apex_tensor_get(const apex_tensor *t, size_t i) {
  if (bad_element(t, i, __func__)) return NAN;
  if (apex_tensor_released(t)) return 0.0f;
  unsigned char raw[4];
  float v;
  element_bytes(t, i, raw);
  apex__convert_portable(&v, APEX_F32, raw, t->dtype, 1);
  return v;
}

void apex_tensor_set(apex_tensor *t, size_t i, float value) {
  if (bad_element(t, i, __func__) || apex__tensor_remake(t, 1, __func__) != APEX_OK) return;
  size_t es = apex_dtype_size(t->dtype);
  unsigned char raw[4];
  apex__convert_portable(raw, t->dtype, &value, APEX_F32, 1);
  char *p = (char *)apex_tensor_data(t) + i * es;
  if (t->device == APEX_DEVICE_CPU) memcpy(p, raw, es);
  else t->storage->mem->copy(p, raw, es, APEX_COPY_H2D, 1);
}
