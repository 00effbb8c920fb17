/* memory.c: the CUDA backend's memory slots (core/memory.h) over runtime.cu (the caching allocator,
 * apex's stream) and convert.cu (conversions with the host's rounding). */
#include "backend/cuda/cuda_backend.h"

static apex_status cuda_copy(void *dst, const void *src, size_t bytes, apex_copy_kind kind, int wait) {
  /* apex_copy_kind's values are the runtime's APEX__H2D, APEX__D2H and APEX__D2D. */
  return apex__cuda_memcpy(dst, src, bytes, (int)kind, wait);
}

const apex_memory apex__cuda_memory = {
    .device = APEX_DEVICE_CUDA, .name = "CUDA", .ready = apex__cuda_ready, .alloc = apex__cuda_alloc,
    .free = apex__cuda_free, .copy = cuda_copy, .convert = apex__cuda_convert, .fill = apex__cuda_fill,
    .sync = apex__cuda_sync, .waits = apex__cuda_waits,
};
