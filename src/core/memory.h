/* memory.h: the memory slots of a device, as core sees them.
 *
 * A storage points to the apex_memory of the device it lives on, and frees, copies and fills through
 * it, so that core never names a device API. The backend layer owns the tables: each backend's
 * apex_backend (backend/backend.h) points to its apex_memory, and backend/registry.c defines
 * apex__memory below.
 *
 * Why a table defined by the backend layer and not a hook registered at run time: a registration
 * call would have to run before the first apex_tensor_create_on, which a constructor cannot promise
 * (a static link drops an object file nobody references, and constructors run in no set order), and
 * an explicit init call would be one more thing every program must remember. A const array of const
 * pointers is complete when the program is loaded: no order, no race, no init. Core only declares it
 * and includes nothing of the backend layer; what remains is a link-time reference to one symbol. */
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
} apex_memory;

/* Number of apex_device values. */
#define APEX__DEVICE_COUNT 2

/* The memory slots of each device, by apex_device value; NULL for a device this build has no
 * backend for. Defined by the backend layer (backend/registry.c). */
extern const apex_memory *const apex__memory[APEX__DEVICE_COUNT];

/* Why this build has no backend for a device (for the devices whose apex__memory entry is NULL), e.g.
 * "this apex was built without CUDA (...how to build it...)". Defined beside apex__memory. */
extern const char *const apex__device_missing[APEX__DEVICE_COUNT];

/* The memory slots of `device`, or NULL after a message naming fn: an unknown device
 * (APEX_ERR_INVALID_ARG), one this build has no backend for or that cannot be used now
 * (APEX_ERR_UNSUPPORTED, with the reason). */
const apex_memory *apex__memory_for(apex_device device, const char *fn);

#endif
