/* cuda.h: what only the CUDA device has: whether it can be used, its name, apex's stream, the caching
 * allocator's counters and page-locked host memory.
 *
 * Everything else is device-neutral and takes CUDA tensors as it takes CPU ones: tensors
 * (apex_tensor_create_on(APEX_DEVICE_CUDA, ...), tensor.h; apex_tensor_data() gives the device pointer),
 * the multi-tensor kernels (multi_tensor.h), the optimizers (optim.h), the loss scaler
 * (loss_scaler.h: apex_loss_scaler_create_on) and the raw kernels (kernels.h). Device memory comes from a
 * caching allocator over cudaMalloc (never managed memory).
 *
 * All apex work is queued on one stream (apex_cuda_stream). Nothing waits for the GPU unless it must hand
 * a value to the host: a copy to the host, apex_tensor_get, a norm returned as a float, the loss scaler's
 * apex_loss_scaler_scale and apex_loss_scaler_get_state, apex_optimizer_step_count and optimizer saves.
 * The mixed-precision loop of loss_scaler.h makes no host-device synchronisation at all.
 *
 * In a build without CUDA, or on a machine without a GPU, apex_cuda_available() is 0 and every other
 * call here fails with APEX_ERR_UNSUPPORTED and a message saying why. */
#ifndef APEX_CUDA_H
#define APEX_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with CUDA and a GPU can be used; else 0, and *why (may be NULL) says
 * which of the two is missing (a constant string). */
APEX_API int apex_cuda_available(const char **why);
/* The GPU's name and compute capability ("NVIDIA H100 80GB HBM3, sm_90") into buf. */
APEX_API apex_status apex_cuda_device_name(char *buf, size_t size);
/* Waits for all work queued on apex's stream. */
APEX_API apex_status apex_cuda_synchronize(void);
/* apex's stream as a cudaStream_t (void * here so that this header needs no CUDA headers); NULL
 * without CUDA. Kernels of your own that touch apex tensors should run on it. */
APEX_API void *apex_cuda_stream(void);

typedef struct apex_cuda_memory_stats {
  size_t allocated;      /* bytes in live tensors (rounded block sizes) */
  size_t reserved;       /* bytes obtained from cudaMalloc, live or cached */
  size_t peak_allocated; /* the highest `allocated` since the last reset */
  size_t device_allocs;  /* cudaMalloc calls so far: flat once the cache is warm */
  size_t host_waits;     /* times so far the host waited for the GPU (a synchronisation, a copy to the host):
                            a training loop that reads nothing back should add none a step */
} apex_cuda_memory_stats;
/* The caching allocator's counters. */
APEX_API apex_status apex_cuda_memory_stats_get(apex_cuda_memory_stats *out);
/* Restarts peak_allocated from the current `allocated`. */
APEX_API apex_status apex_cuda_memory_reset_peak(void);
/* Returns every cached (free) block to the GPU. */
APEX_API apex_status apex_cuda_empty_cache(void);

/* Page-locked host memory, for copies that overlap computation (data loading). NULL with a message on
 * failure or without CUDA. */
APEX_API void *apex_cuda_host_alloc(size_t bytes);
APEX_API void apex_cuda_host_free(void *p);
/* Copies between tensors as apex_tensor_copy, without waiting for a copy to the host: the data is
 * there once apex_cuda_synchronize returns. Host tensors should be over apex_cuda_host_alloc memory
 * (apex_tensor_wrap) for the copy to be truly asynchronous. */
APEX_API apex_status apex_tensor_copy_async(apex_tensor *dst, const apex_tensor *src);

#ifdef __cplusplus
}
#endif
#endif
