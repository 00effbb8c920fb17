/* timer.cu: a GPU stopwatch on apex's stream (cuda_internal.h): timing events recorded between queued
 * kernels, read once the GPU has passed them. For benchmarks' per-phase breakdowns (bench/gpt2_cuda.c):
 * no profiler needed, and recording an event costs the stream next to nothing. */
#include <cuda_runtime.h>
#include <stdlib.h>

extern "C" {
#include "core/internal.h"
#include "backend/cuda/cuda_internal.h"
}

struct apex__cuda_timer {
  int n;
  cudaEvent_t ev[1]; /* n of them */
};

extern "C" apex_status apex__cuda_timer_create(int n, apex__cuda_timer **out) {
  *out = NULL;
  if (n < 1) return apex__fail(APEX_ERR_INVALID_ARG, "apex__cuda_timer_create: %d events", n);
  apex__cuda_timer *t = (apex__cuda_timer *)calloc(1, sizeof *t + (size_t)(n - 1) * sizeof(cudaEvent_t));
  if (!t) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex__cuda_timer_create: out of memory");
  for (int i = 0; i < n; i++) {
    cudaError_t e = cudaEventCreate(&t->ev[i]); /* timing on (the default flags) */
    if (e != cudaSuccess) {
      t->n = i;
      apex__cuda_timer_destroy(t);
      return apex__fail(APEX_ERR_DEVICE, "apex__cuda_timer_create: event %d: %s", i, cudaGetErrorString(e));
    }
  }
  t->n = n;
  *out = t;
  return APEX_OK;
}

extern "C" void apex__cuda_timer_destroy(apex__cuda_timer *t) {
  if (!t) return;
  for (int i = 0; i < t->n; i++) cudaEventDestroy(t->ev[i]);
  free(t);
}

extern "C" apex_status apex__cuda_timer_mark(apex__cuda_timer *t, int i) {
  if (!t || i < 0 || i >= t->n) return apex__fail(APEX_ERR_INVALID_ARG, "apex__cuda_timer_mark: event %d of %d", i, t ? t->n : 0);
  cudaError_t e = cudaEventRecord(t->ev[i], (cudaStream_t)apex__cuda_stream());
  return e == cudaSuccess ? APEX_OK : apex__fail(APEX_ERR_DEVICE, "apex__cuda_timer_mark: %s", cudaGetErrorString(e));
}

extern "C" apex_status apex__cuda_timer_elapsed(apex__cuda_timer *t, int i, int j, float *ms) {
  if (!t || i < 0 || j < 0 || i >= t->n || j >= t->n || !ms)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex__cuda_timer_elapsed: events %d and %d of %d", i, j, t ? t->n : 0);
  cudaError_t e = cudaEventSynchronize(t->ev[j]);
  if (e == cudaSuccess) e = cudaEventElapsedTime(ms, t->ev[i], t->ev[j]);
  return e == cudaSuccess ? APEX_OK : apex__fail(APEX_ERR_DEVICE, "apex__cuda_timer_elapsed: %s", cudaGetErrorString(e));
}
