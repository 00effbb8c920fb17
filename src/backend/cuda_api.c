/* cuda_api.c: the public calls of apex/cuda.h (device, stream, allocator, page-locked memory): plain C in
 * every build, over the CUDA backend's memory slots (ready, sync) and runtime services
 * (backend/device_services.h). A build without CUDA has no such backend, and each call says so. The raw
 * kernels' fronts are kernels_api.c. */
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "core/internal.h"
#include "backend/backend.h"

/* The CUDA backend whatever its state, or NULL in a build without it (no message). */
static const apex_backend *cuda_backend(void) { return apex__backend_by_name("cuda"); }

/* The CUDA backend's services once a GPU can be used; NULL after APEX_ERR_UNSUPPORTED naming fn and
 * saying why not. */
static const apex_device_services *need_services(const char *fn) {
  const apex_backend *b = apex__backend_need(APEX_DEVICE_CUDA, fn);
  if (b && !b->services) return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: the %s backend has no runtime services", fn, b->name);
  return b ? b->services : NULL;
}

int apex_cuda_available(const char **why) {
  const apex_backend *b = cuda_backend();
  if (!b) {
    if (why) *why = apex__device_missing(APEX_DEVICE_CUDA);
    return 0;
  }
  return b->mem->ready(why);
}

apex_status apex_cuda_device_name(char *buf, size_t size) {
  if (!buf || size == 0) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_device_name: NULL or empty buffer");
  const apex_device_services *sv = need_services("apex_cuda_device_name");
  return sv ? sv->device_name(buf, size) : apex_last_status();
}

apex_status apex_cuda_synchronize(void) {
  const apex_backend *b = cuda_backend();
  if (!b) return apex__fail(APEX_ERR_UNSUPPORTED, "apex_cuda_synchronize: %s", apex__device_missing(APEX_DEVICE_CUDA));
  return b->mem->sync("apex_cuda_synchronize");
}

void *apex_cuda_stream(void) {
  const apex_backend *b = cuda_backend();
  return b && b->services ? b->services->stream() : NULL;
}

apex_status apex_cuda_memory_stats_get(apex_cuda_memory_stats *out) {
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_memory_stats_get: NULL out");
  const apex_device_services *sv = need_services("apex_cuda_memory_stats_get");
  if (!sv) return apex_last_status();
  sv->memory_stats(out, 0);
  return APEX_OK;
}

apex_status apex_cuda_memory_reset_peak(void) {
  const apex_device_services *sv = need_services("apex_cuda_memory_reset_peak");
  if (!sv) return apex_last_status();
  sv->memory_stats(NULL, 1);
  return APEX_OK;
}

apex_status apex_cuda_empty_cache(void) {
  const apex_device_services *sv = need_services("apex_cuda_empty_cache");
  if (!sv) return apex_last_status();
  sv->empty_cache();
  return APEX_OK;
}

void *apex_cuda_host_alloc(size_t bytes) {
  const apex_device_services *sv = need_services("apex_cuda_host_alloc");
  return sv ? sv->host_alloc(bytes) : NULL;
}

void apex_cuda_host_free(void *p) {
  const apex_backend *b = cuda_backend();
  if (p && b && b->services && b->mem->ready(NULL)) b->services->host_free(p);
}
