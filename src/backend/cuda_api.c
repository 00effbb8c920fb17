/* cuda_api.c: the public calls of apex/cuda.h (device, stream, allocator, page-locked memory): plain C in
 * every build over the CUDA backend's table (cuda_ops.h). A build without CUDA has no table, and each call
 * says so. The raw kernels' fronts are kernels_api.c. */
#include <stdlib.h>
#include <string.h>

#include "apex/cuda.h"
#include "core/internal.h"
#include "backend/backend.h"
#include "backend/cuda_ops.h"

#define NO_CUDA_BUILD (apex__device_missing(APEX_DEVICE_CUDA))

const apex_cuda_ops *apex__cuda_need(const char *fn) {
  const apex_cuda_ops *ops = apex__cuda_ops();
  const char *why = NO_CUDA_BUILD;
  if (!ops || !ops->ready(&why)) return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: %s", fn, why);
  return ops;
}

#define REQUIRE_CUDA(fn)                                    \
  do {                                                      \
    if (!apex__cuda_need(fn)) return apex_last_status();          \
  } while (0)

#define CU (apex__cuda_ops())

int apex_cuda_available(const char **why) {
  const apex_cuda_ops *ops = apex__cuda_ops();
  if (!ops) {
    if (why) *why = NO_CUDA_BUILD;
    return 0;
  }
  return ops->ready(why);
}

apex_status apex_cuda_device_name(char *buf, size_t size) {
  if (!buf || size == 0) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_device_name: NULL or empty buffer");
  REQUIRE_CUDA("apex_cuda_device_name");
  return CU->device_name(buf, size);
}

apex_status apex_cuda_synchronize(void) {
  const apex_cuda_ops *ops = apex__cuda_ops();
  if (!ops) return apex__fail(APEX_ERR_UNSUPPORTED, "apex_cuda_synchronize: %s", NO_CUDA_BUILD);
  return ops->sync("apex_cuda_synchronize");
}

void *apex_cuda_stream(void) { return apex__cuda_ops() ? apex__cuda_ops()->stream() : NULL; }

apex_status apex_cuda_memory_stats_get(apex_cuda_memory_stats *out) {
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_cuda_memory_stats_get: NULL out");
  REQUIRE_CUDA("apex_cuda_memory_stats_get");
  CU->stats(out, 0);
  return APEX_OK;
}

apex_status apex_cuda_memory_reset_peak(void) {
  REQUIRE_CUDA("apex_cuda_memory_reset_peak");
  CU->stats(NULL, 1);
  return APEX_OK;
}

apex_status apex_cuda_empty_cache(void) {
  REQUIRE_CUDA("apex_cuda_empty_cache");
  CU->empty_cache();
  return APEX_OK;
}

void *apex_cuda_host_alloc(size_t bytes) {
  const apex_cuda_ops *ops = apex__cuda_need("apex_cuda_host_alloc");
  return ops ? ops->host_alloc(bytes) : NULL;
}

void apex_cuda_host_free(void *p) {
  const apex_cuda_ops *ops = apex__cuda_ops();
  if (p && ops && ops->ready(NULL)) ops->host_free(p);
}
