/* backend.h: the one interface every compute backend implements (DESIGN.md, "backend").
 *
 * A backend is one const apex_backend: its device, its memory slots, and one slot per kernel, grouped
 * by concern. Every kernel slot takes a pointer to a typed argument struct with named fields, declared
 * in the group's own header (args_mt.h, args_optim.h, ...), so that a new group is a new header and a
 * new block of slots here. The layers above pick a backend with apex__backend_for (registry.c) and
 * call its slots after checking their arguments, the way parallel/pg.c fronts its process groups: a
 * slot sees only valid arguments on its own device. A NULL slot means "not on this backend": call it
 * through apex__backend_slot_missing, which says so with APEX_ERR_UNSUPPORTED naming the op and the
 * device.
 *
 * Where a new kernel goes: its argument struct in the group's args_*.h, a slot below, the portable
 * CPU loop in cpu/<group>.c and the CUDA kernel in cuda/<group>.cu (the same file names on both
 * sides), each backend's table (cpu/backend.c, cuda/backend.c) pointing at its function. */
#ifndef APEX_BACKEND_BACKEND_H
#define APEX_BACKEND_BACKEND_H

#include "apex/tensor.h"
#include "backend/args_mt.h"
#include "backend/args_optim.h"
#include "core/memory.h"

/* Number of apex_device values with a backend slot in the registry (APEX_DEVICE_CPU, APEX_DEVICE_CUDA). */
#define APEX__DEVICE_COUNT 2

typedef struct apex_backend {
  const char *name; /* "cpu", "cuda" */
  apex_device device;

  /* ---- memory: alloc, free, copy (h2d/d2h/d2d), convert, fill, sync (core/memory.h). Core owns the
   * type because every storage points to it, to be freed by the device that made it. */
  const apex_memory *mem;

  /* ---- multi-tensor kernels (args_mt.h) ---- */
  apex_status (*mt_scale)(const apex_mt_scale_args *a);
  apex_status (*mt_axpby)(const apex_mt_axpby_args *a);
  apex_status (*mt_l2norm)(const apex_mt_l2norm_args *a);

  /* ---- optimizer and loss scaler (args_optim.h) ---- */
  apex_status (*optim_step)(const apex_optim_step_args *a);
  apex_status (*scaler_update)(const apex_scaler_update_args *a);
} apex_backend;

/* The backend of `device`: the CPU's always; another only when this build has it. NULL (without a
 * message) otherwise: use apex__backend_need for a message. */
const apex_backend *apex__backend_for(apex_device device);
/* apex__backend_for, or NULL after APEX_ERR_UNSUPPORTED (APEX_ERR_INVALID_ARG for an unknown device)
 * with a message naming fn and why the device cannot be used. */
const apex_backend *apex__backend_need(apex_device device, const char *fn);
/* The backend called `name` ("cpu", "cuda"), for calls that name their backend (apex/cuda.h's), or NULL
 * after APEX_ERR_UNSUPPORTED saying why it is not here or its device cannot be used. */
const apex_backend *apex__backend_named(const char *name, const char *fn);
/* A device's name for messages ("CPU", "CUDA"); "an unknown device" for one this build has no backend for. */
const char *apex__device_name(apex_device device);
/* The memory slots of `device`, or NULL after a message naming fn: an unknown device
 * (APEX_ERR_INVALID_ARG), one this build has no backend for or that cannot be used now
 * (APEX_ERR_UNSUPPORTED, with the reason). */
const apex_memory *apex__memory_for(apex_device device, const char *fn);
/* Why this build has no backend for `device` ("this apex was built without CUDA (...)"), or NULL. */
const char *apex__device_missing(apex_device device);
/* APEX_ERR_UNSUPPORTED: "<fn>: <op> is not implemented on the <backend> backend". */
apex_status apex__backend_slot_missing(const apex_backend *b, const char *fn, const char *op);

/* The backends this build has (backend/cpu/backend.c, backend/cuda/backend.c) and the CUDA one's memory
 * slots (backend/cuda/memory.c; the CPU backend's are core's host memory, core/host_memory.c). */
extern const apex_backend apex__cpu_backend;
extern const apex_backend apex__cuda_backend;
extern const apex_memory apex__cuda_memory;

#endif
