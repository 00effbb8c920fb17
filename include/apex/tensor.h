/* tensor.h: dense, contiguous tensors of f32/f16/bf16 on a device.
 *
 * A tensor is a view (dtype, shape, byte offset) into a reference-counted storage. Most tensors own
 * their storage alone; apex_tensor_flatten (multi_tensor.h) makes several tensors views into one
 * shared buffer, and apex_tensor_wrap lets a program that owns its memory (llm.c style) hand apex a
 * buffer without copying. Destroying a tensor releases its reference; the storage is freed with the
 * last one. Shapes have 0 to APEX_MAX_DIMS dimensions; a 0-d tensor is a scalar with one element. */
#ifndef APEX_TENSOR_H
#define APEX_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "apex/dtype.h"
#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define APEX_MAX_DIMS 8

typedef enum apex_device {
  APEX_DEVICE_CPU = 0,
  APEX_DEVICE_CUDA = 1, /* the CUDA backend (apex/cuda.h); refused in a build without it */
  APEX_DEVICE_NONE = -1 /* no device: what apex_tensor_device says of a NULL tensor */
} apex_device;

typedef struct apex_tensor apex_tensor;

/* A new zero-filled tensor on the CPU. shape may be NULL when ndim is 0. Returns NULL (with a
 * message) for ndim outside [0, APEX_MAX_DIMS], a negative dimension, an invalid dtype, a size that
 * overflows, or a failed allocation. */
APEX_API apex_tensor *apex_tensor_create(apex_dtype dtype, int ndim, const int64_t *shape);
/* Like apex_tensor_create on a given device. APEX_DEVICE_CUDA needs a build with CUDA and a GPU
 * (apex_cuda_available); otherwise NULL with APEX_ERR_UNSUPPORTED and a message saying which is missing. */
APEX_API apex_tensor *apex_tensor_create_on(apex_device device, apex_dtype dtype, int ndim,
                                            const int64_t *shape);
/* A tensor over memory the caller owns (at least numel * dtype size bytes, aligned to the element
 * size). apex never frees it; the caller keeps it alive while the tensor exists. */
APEX_API apex_tensor *apex_tensor_wrap(void *data, apex_dtype dtype, int ndim, const int64_t *shape);
/* apex_tensor_wrap for memory on a device: data is a device pointer for APEX_DEVICE_CUDA (llm.c-style
 * programs that cudaMalloc their own buffers). */
APEX_API apex_tensor *apex_tensor_wrap_on(apex_device device, void *data, apex_dtype dtype, int ndim,
                                          const int64_t *shape);
/* A new tensor with the same dtype, shape and device as t, its data copied. */
APEX_API apex_tensor *apex_tensor_clone(const apex_tensor *t);
/* Releases t (NULL is fine). */
APEX_API void apex_tensor_destroy(apex_tensor *t);

/* The accessors take NULL (the result of a failed call earlier in a chain such as
 * apex_tensor_dtype(apex_var_value(apex_amp_forward(...)))) without crashing: they return the value
 * given with each below, which no tensor has, and leave an APEX_ERR_INVALID_ARG message. */

/* APEX_DTYPE_COUNT (not a dtype) for NULL. */
APEX_API apex_dtype apex_tensor_dtype(const apex_tensor *t);
/* APEX_DEVICE_NONE for NULL. */
APEX_API apex_device apex_tensor_device(const apex_tensor *t);
/* -1 for NULL. */
APEX_API int apex_tensor_ndim(const apex_tensor *t);
/* Size of dimension dim; negative dim counts from the end. Returns -1 for a dim out of range or NULL,
 * with its own message (apex_last_error). */
APEX_API int64_t apex_tensor_dim(const apex_tensor *t, int dim);
/* Pointer to the shape array (ndim entries); NULL for NULL. */
APEX_API const int64_t *apex_tensor_shape(const apex_tensor *t);
/* 0 for NULL (a valid tensor may also have 0 elements: check apex_tensor_ndim for -1). */
APEX_API size_t apex_tensor_numel(const apex_tensor *t);
APEX_API size_t apex_tensor_nbytes(const apex_tensor *t);
/* Pointer to the first element (host memory for CPU tensors, device memory for CUDA ones); NULL for
 * NULL and for a released tensor (apex_tensor_released). */
APEX_API void *apex_tensor_data(const apex_tensor *t);
/* 1 when t's memory is released: ZeRO stage 2 (zero.h) frees an autograd leaf's gradient once it has
 * been reduce-scattered, and the next backward makes it again. A released tensor reads as zeros
 * (apex_tensor_get gives 0, a copy from it writes zeros); apex_tensor_fill, apex_tensor_copy into it
 * and apex_tensor_set make its memory again; a multi-tensor kernel refuses it (APEX_ERR_STATE). It holds
 * no memory: what a rank's gradients hold is the nbytes of those that are not released. 0 for NULL. */
APEX_API int apex_tensor_released(const apex_tensor *t);
/* 1 when a and b have the same ndim and sizes; 0 when either is NULL. */
APEX_API int apex_tensor_same_shape(const apex_tensor *a, const apex_tensor *b);
/* Writes "[2, 3, 4]" into buf (always NUL-terminated); returns buf. For error messages. */
APEX_API char *apex_tensor_shape_str(const apex_tensor *t, char *buf, size_t size);

/* Sets every element to value, rounded to the tensor's dtype. */
APEX_API apex_status apex_tensor_fill(apex_tensor *t, float value);
/* Copies src into dst; they need the same number of elements. Different dtypes convert (as
 * apex_convert). Either may be on the GPU; the call returns once a copy to the host is done, and
 * other copies are queued on apex's CUDA stream (apex/cuda.h). */
APEX_API apex_status apex_tensor_copy(apex_tensor *dst, const apex_tensor *src);
/* A new tensor of the given dtype with src's shape and values converted. */
APEX_API apex_tensor *apex_tensor_to(const apex_tensor *src, apex_dtype dtype);
/* Element i (flat index) as a float, and the reverse; for tests and small code, not hot loops (on a
 * CUDA tensor each is a copy that waits for the GPU). A NULL tensor or an index past the end gives
 * NaN (get) or changes nothing (set), with an APEX_ERR_INVALID_ARG message. */
APEX_API float apex_tensor_get(const apex_tensor *t, size_t i);
APEX_API void apex_tensor_set(apex_tensor *t, size_t i, float value);

/* A new tensor sharing t's storage, with another shape of the same element count. */
APEX_API apex_tensor *apex_tensor_view(apex_tensor *t, int ndim, const int64_t *shape);
/* A new tensor viewing `numel` elements of t's storage starting at element `offset` of t, with the
 * given shape (whose element count must be numel). */
APEX_API apex_tensor *apex_tensor_slice_view(apex_tensor *t, size_t offset, int ndim, const int64_t *shape);
/* 1 when a and b share storage. */
APEX_API int apex_tensor_shares_storage(const apex_tensor *a, const apex_tensor *b);

#ifdef __cplusplus
}
#endif
#endif
