/* memory.h: the memory slots of a device, as core sees them.
 *
 * A storage points to the apex_memory of the device it lives on, and frees, copies and fills through
 * it, so that core never names a device API. Core has the host's (host_memory.c), for apex_tensor_create
 * and the CPU backend; a device backend has its own, and the backend layer makes device tensors with
 * apex__tensor_create_with (apex_tensor_create_on lives there, in backend/tensor_on.c, beside the
 * registry that knows the devices).
 *
 * Why no hook for core to find a device's slots: a registration call would have to run before the first
 * apex_tensor_create_on, which a constructor cannot promise (a static link drops an object file nobody
 * references, and constructors run in no set order), and a table defined by the backend layer would be
 * a symbol core uses from a layer above it. Putting the calls that take a device in the layer that knows
 * the devices needs neither: core only ever meets a device through a storage that already points to its
 * slots. */
#ifndef APEX_CORE_MEMORY_H
#define APEX_CORE_MEMORY_H

#include <stddef.h>

#include "apex/dtype.h"
#include "apex/status.h"
#include "apex/tensor.h"

/* Which way a copy goes, seen from the device that owns the slots. */
typedef enum apex_copy_kind {
  APEX_COPY_H2D = 1, /* host to this device */
  APEX_COPY_D2H = 2, /* this device to host */
  APEX_COPY_D2D = 3  /* within this device */
} apex_copy_kind;

typedef struct apex_memory {
  apex_device device;
  const char *name; /* "CPU", "CUDA": for messages */
  /* 1 when the device can be used; 0 with a reason in *why (why may be NULL). Checked before the
   * first allocation, so that "no GPU" reads as such rather than as a failed allocation. */
  int (*ready)(const char **why);
  /* At least `bytes` bytes (64-byte aligned on the host), zero-filled when zero is set. */
  apex_status (*alloc)(size_t bytes, int zero, void **out);
  void (*free)(void *p); /* NULL is fine */
  /* bytes from src to dst; with wait set, returns once the copy (and all earlier work) is done.
   * A copy to the host always waits when wait is set; other copies may be queued. */
  apex_status (*copy)(void *dst, const void *src, size_t bytes, apex_copy_kind kind, int wait);
  /* n elements from src (src_type) to dst (dst_type), both on this device, rounded as apex_convert. */
  apex_status (*convert)(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n);
  /* n elements at dst set to value rounded to dtype. */
  apex_status (*fill)(void *dst, apex_dtype dtype, float value, size_t n);
  /* Waits for all queued work; `what` names the caller in a failure's message. */
  apex_status (*sync)(const char *what);
  /* How many times, since the process started, the host has waited for this device: a sync, or a copy
   * that waited (every copy to the host). For tests that count a step's waits (amp waits at most once a
   * step on a GPU). The host's own memory counts the calls that would wait on a device (syncs and
   * waiting copies to the host), which a CPU step makes none of. */
  unsigned long long (*waits)(void);
} apex_memory;

/* Host memory's slots (host_memory.c). */
extern const apex_memory apex__host_memory;

/* A new zero-filled tensor in memory m (checks as apex_tensor_create; fn names the caller in messages). */
apex_tensor *apex__tensor_create_with(const apex_memory *m, apex_dtype dtype, int ndim, const int64_t *shape,
                                      const char *fn);
/* A tensor over the caller's memory `data` in memory m, never freed by apex (checks as apex_tensor_wrap). */
apex_tensor *apex__tensor_wrap_with(const apex_memory *m, void *data, apex_dtype dtype, int ndim,
                                    const int64_t *shape);

#endif
