/* tensor.c: tensors as views into reference-counted storage.
 *
 * Storage is allocated 64-byte aligned (a cache line; also what AVX-512 loads like), zero-filled.
 * Wrapped storage belongs to the caller and is never freed here. CUDA storage comes from the CUDA
 * backend's caching allocator (src/cuda/runtime.cu); the few tensor calls that touch data branch on
 * the device here, so that every layer above sees one tensor type. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "core/internal.h"
#include "core/tensor_internal.h"
#include "cuda/cuda_internal.h"

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
  s->device = APEX_DEVICE_CPU;
  atomic_init(&s->refs, 1);
  return s;
}

/* Zero-filled storage on a device; NULL with a message (the device's own, or out of memory). */
static apex_storage *storage_new_on(apex_device device, size_t bytes) {
  if (device == APEX_DEVICE_CPU) {
    apex_storage *s = storage_new(bytes);
    if (!s) apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_create: cannot allocate %zu bytes", bytes);
    return s;
  }
  /* The same path with and without CUDA: a build without it links stubs whose apex__cuda_ready says so. */
  const char *why;
  if (device != APEX_DEVICE_CUDA)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_create_on: unknown device %d", (int)device);
  if (!apex__cuda_ready(&why)) return apex__fail_null(APEX_ERR_UNSUPPORTED, "apex_tensor_create_on: %s", why);
  apex_storage *s = calloc(1, sizeof *s);
  if (!s) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_tensor_create: out of memory");
  if (apex__cuda_alloc(bytes, 1, &s->data) != APEX_OK) {
    free(s);
    return NULL;
  }
  s->bytes = bytes;
  s->owned = 1;
  s->device = APEX_DEVICE_CUDA;
  atomic_init(&s->refs, 1);
  return s;
}

static void storage_free_data(apex_storage *s) {
#if APEX_HAVE_CUDA
  if (s->device == APEX_DEVICE_CUDA) {
    apex__cuda_free(s->data);
    return;
  }
#endif
  free(s->data);
}

void apex__storage_release(apex_storage *s) {
  if (!s) return;
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    if (s->owned) storage_free_data(s);
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
  t->device = s->device;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->numel = numel;
  return t;
}

apex_tensor *apex_tensor_create_on(apex_device device, apex_dtype dtype, int ndim, const int64_t *shape) {
  size_t numel;
  if (apex__check_dtype(dtype, "apex_tensor_create") != APEX_OK) return NULL;
  if (shape_numel("apex_tensor_create", ndim, shape, &numel) != APEX_OK) return NULL;
  apex_storage *s = storage_new_on(device, numel * apex_dtype_size(dtype));
  if (!s) return NULL;
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
  return apex_tensor_wrap_on(APEX_DEVICE_CPU, data, dtype, ndim, shape);
}

apex_tensor *apex_tensor_wrap_on(apex_device device, void *data, apex_dtype dtype, int ndim, const int64_t *shape) {
  size_t numel;
  if (device != APEX_DEVICE_CPU) {
    const char *why;
    if (device != APEX_DEVICE_CUDA)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_tensor_wrap_on: unknown device %d", (int)device);
    if (!apex__cuda_ready(&why)) return apex__fail_null(APEX_ERR_UNSUPPORTED, "apex_tensor_wrap_on: %s", why);
  }
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
  s->device = device;
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
  apex_tensor *c = apex_tensor_create_on(t->device, t->dtype, t->ndim, t->shape);
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
  return null_tensor(t, __func__) ? NULL : (char *)t->storage->data + t->offset;
}

int64_t apex_tensor_dim(const apex_tensor *t, int dim) {
  if (null_tensor(t, __func__)) return -1;
  if (dim < 0) dim += t->ndim;
  if (dim < 0 || dim >= t->ndim) return -1;
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
  void *p = apex_tensor_data(t);
#if APEX_HAVE_CUDA
  if (t->device == APEX_DEVICE_CUDA) return apex__cuda_fill(p, t->dtype, value, t->numel);
#endif
  uint32_t bits;
  if (t->dtype == APEX_F32) {
    memcpy(&bits, &value, sizeof bits);
  } else {
    uint16_t v;
    apex__convert_portable(&v, t->dtype, &value, APEX_F32, 1);
    bits = v;
  }
  apex__fill_bits(p, apex_dtype_size(t->dtype), bits, t->numel);
  return APEX_OK;
}

#if APEX_HAVE_CUDA
/* A copy with at least one side on the GPU. Conversions run on the GPU (the same rounding as the CPU's):
 * a host source of another dtype goes up first, a device source of another dtype is converted before it
 * comes down. */
static apex_status copy_cuda(apex_tensor *dst, const apex_tensor *src, int wait) {
  void *d = apex_tensor_data(dst);
  const void *s = apex_tensor_data(src);
  int dir = src->device == APEX_DEVICE_CPU ? APEX__H2D : dst->device == APEX_DEVICE_CPU ? APEX__D2H : APEX__D2D;
  if (dst->dtype == src->dtype)
    return apex__cuda_memcpy(d, s, apex_tensor_nbytes(src), dir, wait && dir == APEX__D2H);
  if (dir == APEX__D2D) return apex__cuda_convert(d, dst->dtype, s, src->dtype, src->numel);
  /* Stage through a device buffer of the other side's layout. */
  apex_dtype staged = dir == APEX__H2D ? src->dtype : dst->dtype;
  apex_tensor *tmp = apex_tensor_create_on(APEX_DEVICE_CUDA, staged, src->ndim, src->shape);
  if (!tmp) return APEX_ERR_OUT_OF_MEMORY;
  apex_status st;
  if (dir == APEX__H2D) {
    st = apex__cuda_memcpy(apex_tensor_data(tmp), s, apex_tensor_nbytes(src), APEX__H2D, 0);
    if (st == APEX_OK) st = apex__cuda_convert(d, dst->dtype, apex_tensor_data(tmp), staged, src->numel);
  } else {
    st = apex__cuda_convert(apex_tensor_data(tmp), staged, s, src->dtype, src->numel);
    if (st == APEX_OK) st = apex__cuda_memcpy(d, apex_tensor_data(tmp), apex_tensor_nbytes(dst), APEX__D2H, 1);
  }
  apex_tensor_destroy(tmp); /* the allocator reuses it only behind the queued work */
  return st;
}
#endif

static apex_status copy_impl(apex_tensor *dst, const apex_tensor *src, int wait, const char *fn) {
  if (!dst || !src) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL tensor", fn);
  if (dst->numel != src->numel) {
    char a[96], b[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: destination %s has %zu elements, source %s has %zu", fn,
                      apex_tensor_shape_str(dst, a, sizeof a), dst->numel, apex_tensor_shape_str(src, b, sizeof b), src->numel);
  }
  if (apex_tensor_data(dst) == apex_tensor_data(src) && dst->dtype == src->dtype && dst->device == src->device)
    return APEX_OK;
#if APEX_HAVE_CUDA
  if (dst->device != APEX_DEVICE_CPU || src->device != APEX_DEVICE_CPU) return copy_cuda(dst, src, wait);
#else
  (void)wait;
#endif
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
  apex_tensor *t = apex_tensor_create_on(src->device, dtype, src->ndim, src->shape);
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
#if APEX_HAVE_CUDA
  if (t->device == APEX_DEVICE_CUDA) {
    if (apex__cuda_memcpy(out, p, es, APEX__D2H, 1) != APEX_OK) memset(out, 0xFF, es); /* NaN: no silent zero */
    return;
  }
#endif
  memcpy(out, p, es);
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
  unsigned char raw[4];
  float v;
  element_bytes(t, i, raw);
  apex__convert_portable(&v, APEX_F32, raw, t->dtype, 1);
  return v;
}

void apex_tensor_set(apex_tensor *t, size_t i, float value) {
  if (bad_element(t, i, __func__)) return;
  size_t es = apex_dtype_size(t->dtype);
  unsigned char raw[4];
  apex__convert_portable(raw, t->dtype, &value, APEX_F32, 1);
#if APEX_HAVE_CUDA
  if (t->device == APEX_DEVICE_CUDA) {
    apex__cuda_memcpy((char *)apex_tensor_data(t) + i * es, raw, es, APEX__H2D, 1);
    return;
  }
#endif
  memcpy((char *)apex_tensor_data(t) + i * es, raw, es);
}
