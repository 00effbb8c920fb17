/* cudnn_lib.cu: loading cuDNN at run time (cudnn_lib.h), once per process. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}
#include "backend/cuda/cudnn_lib.h"

apex__cudnn_lib apex__dnn;
static pthread_once_t dnn_once = PTHREAD_ONCE_INIT;

static void dnn_load(void) {
  const char *path = getenv("APEX_CUDNN");
  const char *name = path && *path ? path : "libcudnn.so.9";
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(apex__dnn.why, sizeof apex__dnn.why,
             "cuDNN could not be loaded (%s); install cuDNN 9 or set APEX_CUDNN to the path of libcudnn.so.9", dlerror());
    return;
  }
#define LOAD(f)                                                                                                   \
  if (!(apex__dnn.f = (decltype(apex__dnn.f))dlsym(lib, #f))) {                                                   \
    snprintf(apex__dnn.why, sizeof apex__dnn.why, "the cuDNN at %s has no %s (cuDNN 9 is needed)", name, #f);     \
    return;                                                                                                       \
  }
  APEX__CUDNN_FUNCS(LOAD)
#undef LOAD
  apex__dnn.version = apex__dnn.cudnnGetVersion();
  if (apex__dnn.version < 90000) {
    snprintf(apex__dnn.why, sizeof apex__dnn.why, "the cuDNN at %s is version %zu; cuDNN 9 is needed", name, apex__dnn.version);
    return;
  }
  cudnnStatus_t s = apex__dnn.cudnnCreate(&apex__dnn.handle);
  if (s != CUDNN_STATUS_SUCCESS)
    snprintf(apex__dnn.why, sizeof apex__dnn.why, "cudnnCreate failed: %s", apex__dnn.cudnnGetErrorString(s));
}

apex_status apex__cudnn_ready(const char *fn) {
  pthread_once(&dnn_once, dnn_load);
  if (apex__dnn.why[0]) return apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", fn, apex__dnn.why);
  cudnnStatus_t s = apex__dnn.cudnnSetStream(apex__dnn.handle, (cudaStream_t)apex__cuda_stream());
  if (s != CUDNN_STATUS_SUCCESS)
    return apex__fail(APEX_ERR_DEVICE, "%s: cudnnSetStream: %s", fn, apex__dnn.cudnnGetErrorString(s));
  return APEX_OK;
}
