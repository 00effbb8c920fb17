/* device.h: where apex-train trains (--device cpu | cuda). The model, its optimizer state and its
 * graph live on the device; what the host makes (an image batch, a test chunk) goes up once per
 * micro-batch through page-locked staging; what the host reads (logits for the accuracy or a sample)
 * comes down in one copy. On the CPU every function here is the identity or a no-op, so a CPU run is
 * the same bits as one that never heard of devices. */
#ifndef APEX_TRAIN_DEVICE_H
#define APEX_TRAIN_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "apex/apex.h"

/* The device --device names, checked: 0, or an exit status with one line on stderr (2: this build
 * has no CUDA; 1: it has, but no GPU can be used here). */
int device_open(const char *name, apex_device *out);

/* The GPU's memory in bytes (apex's caching allocator: live tensors and their peak); 0 and 0 on the
 * CPU. */
void device_memory(apex_device dev, double *used, double *peak);

/* A batch input: the host array the data loader fills, and the tensor the graph reads. On the CPU
 * they are one tensor; on a GPU two page-locked host buffers take turns, so that filling the next
 * micro-batch never waits for the copy of the last one unless both are still in flight. */
typedef struct device_batch {
  apex_device dev;
  apex_tensor *host[2], *on_dev;
  void *pinned[2];
  int pending[2]; /* an upload from this buffer may still be reading it */
  int turn;
} device_batch;

/* Shape [ndim] f32 on dev. Non-zero (with apex's message) on failure. */
int device_batch_create(device_batch *b, apex_device dev, int ndim, const int64_t *shape);
void device_batch_free(device_batch *b);
/* The host array to fill for the next micro-batch. */
float *device_batch_host(device_batch *b);
/* Queues the filled array's copy to the device; returns the tensor the graph reads (NULL on failure). */
apex_tensor *device_batch_upload(device_batch *b);
/* The device has finished every upload queued so far (the caller has just waited for it). */
void device_batch_settled(device_batch *b);

/* t on the host: t itself on the CPU (*owned 0), else a new host copy (*owned 1; the copy waits for
 * the device). NULL with apex's message on failure. */
apex_tensor *device_to_host(const apex_tensor *t, int *owned);
/* A host tensor t copied to dev: t itself on the CPU (*owned 0), else a new device tensor (*owned 1). */
apex_tensor *device_from_host(apex_device dev, apex_tensor *t, int *owned);

#endif
