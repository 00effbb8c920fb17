/* streams.cu: the CUDA backend's stream and event slots (backend/streams.h), over the runtime's streams
 * and events, for work beside apex's stream (the NCCL process group's collectives). A NULL stream means
 * apex's own (runtime.cu). */
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}

static apex_status fail(cudaError_t e, const char *what) {
  return apex__fail(e == cudaErrorMemoryAllocation ? APEX_ERR_OUT_OF_MEMORY : APEX_ERR_DEVICE, "%s: CUDA error %s (%s)",
                    what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static cudaStream_t stream_or_apex(void *stream) {
  return stream ? (cudaStream_t)stream : (cudaStream_t)apex__cuda_stream();
}

extern "C" int apex__cuda_device_count(const char **why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (count == 0 && why)
    *why = e == cudaSuccess || e == cudaErrorNoDevice ? "no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES)"
           : e == cudaErrorInsufficientDriver         ? "the CUDA driver is missing or older than the runtime"
                                                      : "the CUDA runtime could not start (cudaGetDeviceCount failed)";
  return count;
}

extern "C" apex_status apex__cuda_enter(const char *what) {
  const char *why = NULL;
  return apex__cuda_ready(&why) ? APEX_OK : apex__fail(APEX_ERR_UNSUPPORTED, "%s: %s", what, why);
}

extern "C" apex_status apex__cuda_stream_create(const char *what, void **stream) {
  cudaStream_t s = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = e == cudaSuccess ? (void *)s : NULL;
  return e == cudaSuccess ? APEX_OK : fail(e, what);
}

extern "C" void apex__cuda_stream_destroy(void *stream) {
  if (!stream) return;
  cudaStreamSynchronize((cudaStream_t)stream);
  cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" apex_status apex__cuda_event_create(const char *what, void **event) {
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  *event = e == cudaSuccess ? (void *)ev : NULL;
  return e == cudaSuccess ? APEX_OK : fail(e, what);
}

extern "C" void apex__cuda_event_destroy(void *event) {
  /* Safe even while the event is pending: CUDA releases it once it completes. */
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

extern "C" apex_status apex__cuda_event_record(const char *what, void *event, void *stream) {
  cudaError_t e = cudaEventRecord((cudaEvent_t)event, stream_or_apex(stream));
  return e == cudaSuccess ? APEX_OK : fail(e, what);
}

extern "C" apex_status apex__cuda_stream_wait(const char *what, void *stream, void *event) {
  cudaError_t e = cudaStreamWaitEvent(stream_or_apex(stream), (cudaEvent_t)event, 0);
  return e == cudaSuccess ? APEX_OK : fail(e, what);
}

extern "C" apex_status apex__cuda_event_query(const char *what, void *event, int *done) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)event);
  *done = e == cudaSuccess;
  if (e == cudaSuccess || e == cudaErrorNotReady) {
    if (e == cudaErrorNotReady) cudaGetLastError(); /* not an error: leave none pending for the next check */
    return APEX_OK;
  }
  return fail(e, what);
}
