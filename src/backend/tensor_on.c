/* tensor_on.c: the tensor calls of apex/tensor.h that name a device (apex_tensor_create_on,
 * apex_tensor_wrap_on). They live in the backend layer, which knows the devices, and hand core the
 * device's memory slots; core then never needs to look a device up (core/memory.h says why). */
#include "backend/backend.h"
#include "core/internal.h"

apex_tensor *apex_tensor_create_on(apex_device device, apex_dtype dtype, int ndim, const int64_t *shape) {
  const char *fn = device == APEX_DEVICE_CPU ? "apex_tensor_create" : "apex_tensor_create_on";
  const apex_memory *m = apex__memory_for(device, fn);
  return m ? apex__tensor_create_with(m, dtype, ndim, shape, fn) : NULL;
}

apex_tensor *apex_tensor_wrap_on(apex_device device, void *data, apex_dtype dtype, int ndim, const int64_t *shape) {
  const apex_memory *m = apex__memory_for(device, "apex_tensor_wrap_on");
  return m ? apex__tensor_wrap_with(m, data, dtype, ndim, shape) : NULL;
}
