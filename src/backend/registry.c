/* registry.c: which backend serves which device.
 *
 * The CPU backend is always here; the CUDA backend only in a build with CUDA (APEX_HAVE_CUDA), where
 * backend/cuda/backend.c defines it. A build without it has no CUDA table at all: asking for the device
 * gives APEX_ERR_UNSUPPORTED saying how to build one. */
#include <string.h>

#include "backend/backend.h"
#include "core/internal.h"

/* Why this build has no backend for a device. */
static const char *const device_missing[APEX__DEVICE_COUNT] = {
    [APEX_DEVICE_CUDA] = "this apex was built without CUDA (configure again with nvcc on the PATH: CUDA is detected at every configure unless -DAPEX_CUDA=OFF)",
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

const apex_memory *apex__memory_for(apex_device device, const char *fn) {
  if ((int)device < 0 || (int)device >= APEX__DEVICE_COUNT)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: unknown device %d", fn, (int)device);
  if (!backends[device])
    return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: %s", fn,
                           device_missing[device] ? device_missing[device] : "no backend for this device");
  const apex_memory *m = backends[device]->mem;
  const char *why = NULL;
  if (!m->ready(&why)) return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: %s", fn, why ? why : "the device cannot be used");
  return m;
}

const char *apex__device_missing(apex_device device) {
  return (int)device >= 0 && (int)device < APEX__DEVICE_COUNT ? device_missing[device] : NULL;
}

const apex_backend *apex__backend_need(apex_device device, const char *fn) {
  /* apex__memory_for says what is missing (no such backend, or no usable device). */
  return apex__memory_for(device, fn) ? backends[device] : NULL;
}

const apex_backend *apex__backend_by_name(const char *name) {
  for (int d = 0; d < APEX__DEVICE_COUNT; d++)
    if (backends[d] && strcmp(backends[d]->name, name) == 0) return backends[d];
  return NULL;
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
