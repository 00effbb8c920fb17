/* args_mt.h: the argument structs of the multi-tensor slots (backend.h), Apex's multi_tensor_scale,
 * multi_tensor_axpby and multi_tensor_l2norm.
 *
 * Lists are arrays of n tensors on the backend's device, list k's tensor i with as many elements as
 * list 0's. Inputs may be f32, f16 or bf16; every kernel computes in f32. The non-finite check looks at
 * the inputs. Results the caller waits for (host flag, host norms) are separate fields from results
 * left where the tensors are (dev_*), which a GPU writes without waiting for the host. */
#ifndef APEX_BACKEND_ARGS_MT_H
#define APEX_BACKEND_ARGS_MT_H

#include <stddef.h>

#include "apex/tensor.h"

typedef struct apex_mt_scale_args {
  const char *fn;           /* the public call, for messages */
  size_t chunk_size;        /* elements per chunk (0: the default); the CPU's unit of work */
  int n;
  apex_tensor *const *in;
  apex_tensor *const *out;  /* out = in * scale; NULL: only check in */
  float scale;
  /* When set: a float where the tensors are; scale is multiplied by it (divided by it with
   * dev_inverse), read by the kernel itself so that a GPU never waits for the host. */
  const float *dev_scale;
  int dev_inverse;
  int *overflow;            /* host: set to 1 on a non-finite input (never cleared; may be NULL) */
  int *dev_found_inf;       /* where the tensors are: raised on a non-finite input (may be NULL) */
} apex_mt_scale_args;

typedef struct apex_mt_axpby_args {
  const char *fn;
  size_t chunk_size;
  int n;
  apex_tensor *const *x, *const *y, *const *out; /* out = a x + b y */
  float a, b;
  int arg_to_check;         /* -1: x and y, 0: x, 1: y */
  int *overflow;
} apex_mt_axpby_args;

typedef struct apex_mt_l2norm_args {
  const char *fn;
  size_t chunk_size;
  int n;
  apex_tensor *const *x;    /* norms of x * inv_scale */
  float inv_scale;
  float *global_norm;       /* host (may be NULL) */
  float *per_tensor;        /* host, n floats (may be NULL) */
  float *dev_global_norm;   /* one f32 where the tensors are (may be NULL) */
  /* host, one f64 per chunk of every tensor in order (may be NULL): the sum of squares of the chunk's
   * tiles, added in tile order from 0, that the norms are summed from. At chunk_size APEX_MT_TILE each
   * is one tile's f32 sum, so a caller holding parts of tensors cut at tiles (a ZeRO shard) can sum the
   * norms of the whole tensors in the same order. */
  double *per_chunk;
  int *overflow;
} apex_mt_l2norm_args;

/* The end of a low-precision leaf's backward fused with amp's unscale into its f32 master gradient,
 * in one pass over each tensor i (grad bf16, sum and out f32):
 *   s = bf16(grad + sum)       what the backward's flush would leave in grad (one f32 addition, rounded
 *                              to nearest even as apex_convert rounds)
 *   out = s * scale            (at scale 1 the plain widening of s: x * 1 is x)
 * s is checked for Inf/NaN. grad is read, never written: nonzero[i] (host, may be NULL) is set to 1
 * when grad i held any non-zero bits, for the caller to zero it as the unfused unscale would have. */
typedef struct apex_mt_flush_unscale_args {
  const char *fn;
  size_t chunk_size;
  int n;
  apex_tensor *const *grad, *const *sum, *const *out;
  float scale;
  int *overflow;            /* host: set to 1 on a non-finite s (never cleared; may be NULL) */
  unsigned char *nonzero;   /* host, n flags (may be NULL) */
} apex_mt_flush_unscale_args;

#endif
