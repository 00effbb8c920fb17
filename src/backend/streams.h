/* streams.h: the stream and event slots of a backend whose device runs work asynchronously (CUDA), for
 * work that runs beside apex's own kernels: the NCCL process group (parallel/pg_nccl.c) runs its
 * collectives on a side stream that waits for apex's stream through an event, without the host waiting,
 * and learns a collective's end by querying an event.
 *
 * Handles are the device runtime's own (a cudaStream_t and a cudaEvent_t on CUDA), passed as void *, so
 * that a library of that device (NCCL) can be handed them while the caller names no device API. A
 * backend without asynchronous work (the CPU) has no such slots: its apex_backend.streams is NULL. Each
 * slot fails with apex__fail, naming `what` and the runtime's error. */
#ifndef APEX_BACKEND_STREAMS_H
#define APEX_BACKEND_STREAMS_H

#include "apex/status.h"

typedef struct apex_streams {
  /* Devices visible to this process, without opening one (a process group chooses its device before
   * apex opens any); 0 with the reason in *why (why may be NULL). */
  int (*device_count)(const char **why);
  /* Makes apex work on device `device` from now on (apex__cuda_use_device: APEX_ERR_STATE once apex
   * holds memory on another). */
  apex_status (*use_device)(int device);
  /* Puts the calling thread on apex's device, for a thread that calls the runtime before any apex
   * kernel (a process group's progress, run from any thread). APEX_ERR_UNSUPPORTED without a device. */
  apex_status (*enter)(const char *what);
  /* A new stream that does not wait for apex's (a side stream), or destroys one after its queued work
   * finished (NULL is fine). */
  apex_status (*stream_create)(const char *what, void **stream);
  void (*stream_destroy)(void *stream);
  /* A new event (without timing), or destroys one (NULL is fine; a pending event is released once it
   * completes). */
  apex_status (*event_create)(const char *what, void **event);
  void (*event_destroy)(void *event);
  /* Records `event` after the work queued so far on `stream` (NULL: apex's stream). */
  apex_status (*event_record)(const char *what, void *event, void *stream);
  /* Makes `stream` (NULL: apex's stream) wait for `event` before its later work; the host does not wait. */
  apex_status (*stream_wait)(const char *what, void *stream, void *event);
  /* *done = 1 when the work before `event` has finished, 0 while it runs. */
  apex_status (*event_query)(const char *what, void *event, int *done);
} apex_streams;

#endif
