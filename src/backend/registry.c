/* registry.c: which backend serves which device, and the memory table core reads (core/memory.h).
 *
 * The CPU backend is always here; the CUDA backend only in a build with CUDA (APEX_HAVE_CUDA), where
 * backend/cuda/backend.c defines it. A build without it has no CUDA table at all: asking for the device
 * gives APEX_ERR_UNSUPPORTED saying how to build one. */
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda_ops.h"
#include "core/internal.h"

const apex_memory *const apex__memory[APEX__DEVICE_COUNT] = {
    [APEX_DEVICE_CPU] = &apex__cpu_memory,
#if APEX_HAVE_CUDA
    [APEX_DEVICE_CUDA] = &apex__cuda_memory,
#endif
};

const char *const apex__device_missing[APEX__DEVICE_COUNT] = {
    [APEX_DEVICE_CUDA] = "this apex was built without CUDA (configure with nvcc on the PATH, or -DAPEX_CUDA=ON)",
};

static const apex_backend *const backends[APEX__DEVICE_COUNT] = {
    [APEX_DEVICE_CPU] = &apex__cpu_backend,
#if APEX_HAVE_CUDA
    [APEX_DEVICE_CUDA] = &apex__cuda_backend,
#endif
};

const apex_backend *apex__backend_for(apex_device device) {
  return (int)device >= 0 && (int)device < APEX__DEVICE_COUNT ? backends[device] : NULL;
}

const apex_backend *apex__backend_need(apex_device device, const char *fn) {
  /* apex__memory_for says what is missing (no such backend, or no usable device). */
  return apex__memory_for(device, fn) ? backends[device] : NULL;
}

const apex_backend *apex__backend_named(const char *name, const char *fn) {
  for (int d = 0; d < APEX__DEVICE_COUNT; d++)
    if (backends[d] && strcmp(backends[d]->name, name) == 0) return apex__backend_need((apex_device)d, fn);
  /* Not in this build: the registry knows the device only by what is missing. */
  if (strcmp(name, "cuda") == 0) return apex__backend_need(APEX_DEVICE_CUDA, fn);
  return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: apex has no backend called \"%s\"", fn, name);
}

const char *apex__device_name(apex_device device) {
  const apex_backend *b = apex__backend_for(device);
  return b ? b->mem->name : "an unknown device";
}

apex_status apex__backend_slot_missing(const apex_backend *b, const char *fn, const char *op) {
  return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s is not implemented on the %s backend (device %d)", fn, op, b->name,
                    (int)b->device);
}

const apex_cuda_ops *apex__cuda_ops(void) {
#if APEX_HAVE_CUDA
  return &apex__cuda_ops_table;
#else
  return NULL;
#endif
}
