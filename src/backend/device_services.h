/* device_services.h: the runtime services of a device that has a runtime of its own (CUDA) beyond its
 * memory and stream slots: its name, the stream apex queues its work on, the caching allocator's
 * counters and cache, and page-locked host memory. apex/cuda.h's fronts (backend/cuda_api.c) call them
 * through the backend's table once the device proved usable (its memory slots' ready); whether it is
 * usable and waiting for it are the memory slots' ready and sync (core/memory.h). A device without a
 * runtime (the CPU) has no such services: its apex_backend.services is NULL. */
#ifndef APEX_BACKEND_DEVICE_SERVICES_H
#define APEX_BACKEND_DEVICE_SERVICES_H

#include <stddef.h>

#include "apex/cuda.h"
#include "apex/status.h"

typedef struct apex_device_services {
  /* The device's name and compute capability into buf ("NVIDIA H100 80GB HBM3, sm_90"). */
  apex_status (*device_name)(char *buf, size_t size);
  /* The stream apex queues its work on (a cudaStream_t on CUDA). */
  void *(*stream)(void);
  /* The caching allocator's counters into out (when not NULL); with reset_peak, peak_allocated
   * restarts from the current allocation. */
  void (*memory_stats)(apex_cuda_memory_stats *out, int reset_peak);
  /* Gives every cached (free) block back to the device. */
  void (*empty_cache)(void);
  /* Page-locked host memory (NULL with a message on failure), and its release (NULL is fine). */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  /* Recording the work queued on apex's stream into a graph that replays it (capture.h): begin; end with
   * the status of what was queued since (the graph into *graph, or the first failure, the recording thrown
   * away); queue one replay; free a graph and the memory it replays on. `what` names the caller. */
  apex_status (*capture_begin)(const char *what);
  apex_status (*capture_end)(const char *what, apex_status st, void **graph);
  apex_status (*graph_launch)(void *graph, const char *what);
  void (*graph_destroy)(void *graph);
} apex_device_services;

#endif
