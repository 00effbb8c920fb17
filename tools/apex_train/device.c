/* device.c: --device, the GPU's memory figures and the host<->device staging (device.h). */
#include "device.h"

#include <stdio.h>
#include <string.h>

#include "apex/cuda.h"

int device_open(const char *name, apex_device *out) {
  *out = APEX_DEVICE_CPU;
  if (strcmp(name, "cuda") != 0) return 0;
#if APEX_TRAIN_CUDA
  const char *why = NULL;
  if (!apex_cuda_available(&why)) {
    fprintf(stderr, "apex-train: --device cuda: no GPU found (%s); use --device cpu\n", why && *why ? why : "CUDA cannot start");
    return 1;
  }
  *out = APEX_DEVICE_CUDA;
  return 0;
#else
  fprintf(stderr, "apex-train: --device cuda: this apex-train was built without CUDA (configure with -DAPEX_CUDA=ON on a machine with nvcc); use --device cpu\n");
  return 2;
#endif
}

void device_memory(apex_device dev, double *used, double *peak) {
  apex_cuda_memory_stats s;
  *used = *peak = 0;
  if (dev == APEX_DEVICE_CUDA && apex_cuda_memory_stats_get(&s) == APEX_OK) {
    *used = (double)s.allocated;
    *peak = (double)s.peak_allocated;
  }
}

int device_batch_create(device_batch *b, apex_device dev, int ndim, const int64_t *shape) {
  memset(b, 0, sizeof *b);
  b->dev = dev;
  if (dev == APEX_DEVICE_CPU) {
    b->host[0] = apex_tensor_create(APEX_F32, ndim, shape);
    return b->host[0] ? 0 : -1;
  }
  b->on_dev = apex_tensor_create_on(dev, APEX_F32, ndim, shape);
  if (!b->on_dev) return -1;
  size_t bytes = apex_tensor_nbytes(b->on_dev);
  for (int k = 0; k < 2; k++) {
    /* Page-locked, so that the copy is a true DMA that overlaps the host's work. */
    b->pinned[k] = apex_cuda_host_alloc(bytes ? bytes : 4);
    b->host[k] = b->pinned[k] ? apex_tensor_wrap(b->pinned[k], APEX_F32, ndim, shape) : NULL;
    if (!b->host[k]) return -1;
  }
  return 0;
}

void device_batch_free(device_batch *b) {
  /* The buffers may still feed a queued copy: wait before freeing them. */
  if (b->dev != APEX_DEVICE_CPU && (b->pending[0] || b->pending[1])) apex_cuda_synchronize();
  for (int k = 0; k < 2; k++) {
    apex_tensor_destroy(b->host[k]);
    apex_cuda_host_free(b->pinned[k]);
  }
  apex_tensor_destroy(b->on_dev);
  memset(b, 0, sizeof *b);
}

float *device_batch_host(device_batch *b) {
  if (b->dev == APEX_DEVICE_CPU) return apex_tensor_data(b->host[0]);
  b->turn ^= 1;
  if (b->pending[b->turn]) { /* both buffers in flight (gradient accumulation): wait for the older */
    apex_cuda_synchronize();
    b->pending[0] = b->pending[1] = 0;
  }
  return apex_tensor_data(b->host[b->turn]);
}

apex_tensor *device_batch_upload(device_batch *b) {
  if (b->dev == APEX_DEVICE_CPU) return b->host[0];
  /* The graph's previous reads of on_dev were queued before this copy on the same stream. */
  if (apex_tensor_copy_async(b->on_dev, b->host[b->turn]) != APEX_OK) return NULL;
  b->pending[b->turn] = 1;
  return b->on_dev;
}

void device_batch_settled(device_batch *b) { b->pending[0] = b->pending[1] = 0; }

apex_tensor *device_to_host(const apex_tensor *t, int *owned) {
  *owned = 0;
  if (!t || apex_tensor_device(t) == APEX_DEVICE_CPU) return (apex_tensor *)t;
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (h && apex_tensor_copy(h, t) != APEX_OK) {
    apex_tensor_destroy(h);
    h = NULL;
  }
  *owned = h != NULL;
  return h;
}

apex_tensor *device_from_host(apex_device dev, apex_tensor *t, int *owned) {
  *owned = 0;
  if (!t || dev == APEX_DEVICE_CPU) return t;
  apex_tensor *d = apex_tensor_create_on(dev, apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (d && apex_tensor_copy(d, t) != APEX_OK) {
    apex_tensor_destroy(d);
    d = NULL;
  }
  *owned = d != NULL;
  return d;
}
