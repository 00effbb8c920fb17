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
#include "backend/args_nn.h"
#include "backend/args_optim.h"
#include "backend/device_services.h"
#include "backend/streams.h"
#include "core/memory.h"

/* Number of apex_device values with a backend slot in the registry (APEX_DEVICE_CPU, APEX_DEVICE_CUDA). */
#define APEX__DEVICE_COUNT 2

typedef struct apex_backend {
  const char *name; /* "cpu", "cuda" */
  apex_device device;
  /* 1 when the nn kernels of the ops that autocast runs in f32 (op_table.c's reads_half) take f16/bf16
   * inputs as they are, widen them exactly and compute in f32 into f32 results: autocast then gives
   * such an op its low-precision inputs uncast (graph.c's apex__dispatch). */
  unsigned char float_ops_read_half;

  /* ---- memory: alloc, free, copy (h2d/d2h/d2d), convert, fill, sync (core/memory.h). Core owns the
   * type because every storage points to it, to be freed by the device that made it. */
  const apex_memory *mem;
  /* ---- streams and events (streams.h), on a device that runs work asynchronously; NULL otherwise ---- */
  const apex_streams *streams;
  /* ---- runtime services (device_services.h: name, stream, allocator counters, page-locked host
   * memory), on a device with a runtime of its own; NULL otherwise ---- */
  const apex_device_services *services;

  /* ---- multi-tensor kernels (args_mt.h) ---- */
  apex_status (*mt_scale)(const apex_mt_scale_args *a);
  apex_status (*mt_axpby)(const apex_mt_axpby_args *a);
  apex_status (*mt_l2norm)(const apex_mt_l2norm_args *a);
  apex_status (*mt_flush_unscale)(const apex_mt_flush_unscale_args *a); /* may be NULL: amp then flushes and unscales */

  /* ---- optimizer and loss scaler (args_optim.h) ---- */
  apex_status (*optim_step)(const apex_optim_step_args *a);
  apex_status (*scaler_update)(const apex_scaler_update_args *a);

  /* ---- nn kernels, autograd's ops forward and backward (args_nn.h) ---- */
  apex_status (*nn_binary)(const apex_nn_binary_args *a);
  apex_status (*nn_binary_bwd)(const apex_nn_binary_bwd_args *a);
  apex_status (*nn_unary)(const apex_nn_unary_args *a);
  apex_status (*nn_unary_bwd)(const apex_nn_unary_bwd_args *a);
  apex_status (*nn_scale)(const apex_nn_scale_args *a);
  apex_status (*nn_scale_bwd)(const apex_nn_scale_bwd_args *a);
  apex_status (*nn_dropout)(const apex_nn_dropout_args *a);
  apex_status (*nn_dropout_bwd)(const apex_nn_dropout_bwd_args *a);
  apex_status (*nn_softmax)(const apex_nn_softmax_args *a);
  apex_status (*nn_softmax_bwd)(const apex_nn_softmax_bwd_args *a);
  apex_status (*nn_cross_entropy)(const apex_nn_cross_entropy_args *a);
  apex_status (*nn_cross_entropy_bwd)(const apex_nn_cross_entropy_bwd_args *a);
  apex_status (*nn_pointwise_loss)(const apex_nn_pointwise_loss_args *a);
  apex_status (*nn_pointwise_loss_bwd)(const apex_nn_pointwise_loss_bwd_args *a);
  apex_status (*nn_batch_norm)(const apex_nn_batch_norm_args *a);
  apex_status (*nn_batch_norm_bwd)(const apex_nn_batch_norm_bwd_args *a);
  apex_status (*nn_batch_norm_sums)(const apex_nn_batch_norm_sums_args *a);
  apex_status (*nn_batch_norm_dx)(const apex_nn_batch_norm_dx_args *a);
  apex_status (*nn_row_norm)(const apex_nn_row_norm_args *a);
  apex_status (*nn_row_norm_bwd)(const apex_nn_row_norm_bwd_args *a);
  apex_status (*nn_reduce)(const apex_nn_reduce_args *a);
  apex_status (*nn_reduce_bwd)(const apex_nn_reduce_bwd_args *a);
  apex_status (*nn_permute)(const apex_nn_permute_args *a);
  apex_status (*nn_permute_bwd)(const apex_nn_permute_bwd_args *a);
  apex_status (*nn_concat)(const apex_nn_concat_args *a);
  apex_status (*nn_concat_bwd)(const apex_nn_concat_bwd_args *a);
  apex_status (*nn_embedding)(const apex_nn_embedding_args *a);
  apex_status (*nn_embedding_bwd)(const apex_nn_embedding_bwd_args *a);
  apex_status (*nn_matmul)(const apex_nn_matmul_args *a);
  apex_status (*nn_matmul_bwd)(const apex_nn_matmul_bwd_args *a);
  apex_status (*nn_linear)(const apex_nn_linear_args *a);
  apex_status (*nn_linear_bwd)(const apex_nn_linear_bwd_args *a);
  apex_status (*nn_attention)(const apex_nn_attention_args *a);
  apex_status (*nn_attention_bwd)(const apex_nn_attention_bwd_args *a);
  apex_status (*nn_conv2d)(const apex_nn_conv2d_args *a);
  apex_status (*nn_conv2d_bwd)(const apex_nn_conv2d_bwd_args *a);
  apex_status (*nn_pool2d)(const apex_nn_pool2d_args *a);
  apex_status (*nn_pool2d_bwd)(const apex_nn_pool2d_bwd_args *a);
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
/* The backend called `name` ("cpu", "cuda") when this build has it, else NULL; no message, and the device
 * is not opened (apex__backend_named opens it to say whether it can be used). */
const apex_backend *apex__backend_by_name(const char *name);
/* Why this build has no backend for `device` ("this apex was built without CUDA (...)"), or NULL. */
const char *apex__device_missing(apex_device device);
/* APEX_ERR_UNSUPPORTED: "<fn>: <op> is not implemented on the <backend> backend". */
apex_status apex__backend_slot_missing(const apex_backend *b, const char *fn, const char *op);

/* The backends this build has (backend/cpu/backend.c, backend/cuda/backend.c), the CUDA one's memory
 * slots (backend/cuda/memory.c; the CPU backend's are core's host memory, core/host_memory.c) and its
 * stream and event slots and runtime services (backend/cuda/backend.c, over streams.cu and runtime.cu). */
extern const apex_backend apex__cpu_backend;
extern const apex_backend apex__cuda_backend;
extern const apex_memory apex__cuda_memory;
extern const apex_streams apex__cuda_streams;
extern const apex_device_services apex__cuda_services;

#endif
