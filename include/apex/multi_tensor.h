/* multi_tensor.h: one launch over many tensors (Apex's multi_tensor_applier, in C).
 *
 * A launch takes up to APEX_MT_MAX_LISTS lists of tensors (say grads, params, m, v, masters), the
 * same number of tensors in each list and the same element count at each index; each list may have
 * its own dtype. The tensors are cut into chunks of chunk_size elements that the threads share; a
 * chunk is processed in tiles, each tile widened to f32 (f32 lists are used in place), handed to the
 * kernel, and the lists the kernel writes narrowed back with round-to-nearest-even. Non-finite
 * values seen by the kernel raise one overflow flag for the whole launch.
 *
 * The flag is an int the caller owns: kernels set it to 1 and never clear it, so one flag can
 * gather several launches (Apex's noop/overflow buffer). Results never depend on the thread count:
 * chunk and tile boundaries depend only on chunk_size, and reductions combine per-chunk partials in
 * chunk order. */
#ifndef APEX_MULTI_TENSOR_H
#define APEX_MULTI_TENSOR_H

#include <stddef.h>

#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define APEX_MT_MAX_LISTS 5
/* Apex's default chunk for multi-tensor kernels. chunk_size 0 in any call below means this. */
#define APEX_MT_DEFAULT_CHUNK 65536
/* Elements per tile (the unit a kernel sees). */
#define APEX_MT_TILE 2048

/* ---- the kernels -------------------------------------------------------------------------------- */

/* out[i] = in[i] * scale for every tensor; sets *overflow if any input is Inf or NaN (the output
 * is written anyway, as in Apex). in and out may be the same tensors (in-place). */
APEX_API apex_status apex_mt_scale(size_t chunk_size, int *overflow, apex_tensor *const *in, apex_tensor *const *out,
                                   int n, float scale);

/* out[i] = a * x[i] + b * y[i]. arg_to_check picks which inputs are checked for Inf/NaN:
 * -1 both, 0 only x, 1 only y (Apex's convention). */
APEX_API apex_status apex_mt_axpby(size_t chunk_size, int *overflow, apex_tensor *const *x, apex_tensor *const *y,
                                   apex_tensor *const *out, int n, float a, float b, int arg_to_check);

/* Are there Inf/NaN in these tensors? One read pass over tensors[0..n) (any dtype, each may be f32,
 * f16 or bf16; all on the CPU, or all on the GPU where the CUDA multi-tensor kernel does the pass),
 * writing nothing: *found_inf is set to 1 if any element is Inf or NaN, else 0 (unlike the other
 * calls' flags, it is an answer, not an accumulator). For bring-your-own-model programs whose
 * optimizer unscales in its kernel (apex_optimizer_step's grad_scale): check, then
 * apex_loss_scaler_update(found_inf). APEX_ERR_INVALID_ARG (found_inf untouched) for a NULL found_inf,
 * a NULL list or tensor or a negative n; APEX_ERR_DEVICE for a list that mixes devices. */
APEX_API apex_status apex_mt_check_finite(apex_tensor *const *tensors, int n, int *found_inf);

/* The L2 norm of all elements of all tensors (global_norm, may be NULL) and of each tensor
 * (per_tensor: NULL or n floats). Squares are summed in f32 within a tile and in f64 across tiles,
 * in a fixed order. Non-finite elements set *overflow (and make the norm non-finite). */
APEX_API apex_status apex_mt_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n,
                                    float *global_norm, float *per_tensor);

/* As apex_mt_l2norm of x[i] * inv_scale, without writing x: the norm of unscaled gradients for
 * clipping before the unscale is done (Apex's multi_tensor_unscale_l2norm). */
APEX_API apex_status apex_mt_unscale_l2norm(size_t chunk_size, int *overflow, apex_tensor *const *x, int n,
                                            float inv_scale, float *global_norm, float *per_tensor);

/* ---- combine tensors ------------------------------------------------------------------------------ */

/* Copies n tensors of one dtype into one new contiguous 1-d tensor (*flat) in order, and makes each
 * original a view into it: afterwards writing through tensors[i] writes flat, and the tensors'
 * old buffers are released. All must have the same dtype (else APEX_ERR_DTYPE, naming the first
 * that differs). Tensors wrapping caller memory are refused (apex cannot re-point the caller's
 * pointer). On error nothing is changed. */
APEX_API apex_status apex_tensor_flatten(apex_tensor *const *tensors, int n, apex_tensor **flat);

/* New tensors out[0..n) viewing consecutive segments of flat shaped like like[0..n) (the inverse
 * of flatten). The element counts must add up to flat's (else APEX_ERR_SHAPE). On error no tensor is
 * created and out[] is left as it was. */
APEX_API apex_status apex_tensor_unflatten(apex_tensor *flat, apex_tensor *const *like, int n, apex_tensor **out);

/* "Combine grad for unscale": multiplies every element of one flat gradient buffer by inv_scale in
 * place and sets *overflow if any was Inf/NaN, in one pass over one buffer instead of one launch per
 * gradient (the Ascend edition's combine_grad). */
APEX_API apex_status apex_mt_unscale_flat(apex_tensor *flat_grads, float inv_scale, int *overflow);

/* ---- the generic applier, for writing new multi-tensor kernels ----------------------------------- */

typedef struct apex_mt_tile {
  float *p[APEX_MT_MAX_LISTS]; /* the tile of each list as f32; lists not written must not be modified */
  size_t n;                    /* elements in the tile */
  int tensor;                  /* index of the tensor in the lists */
  size_t offset;               /* element offset of the tile inside that tensor */
  size_t chunk;                /* index of the chunk among all chunks of the launch */
} apex_mt_tile;

/* A kernel: processes one tile; sets *nonfinite to 1 if it saw a value that must raise the
 * overflow flag. Called from many threads at once: it must only write its own tile and per-chunk
 * or per-tensor slots of ctx. */
typedef void (*apex_mt_kernel)(void *ctx, const apex_mt_tile *tile, int *nonfinite);

typedef struct apex_mt_launch {
  size_t chunk_size;                             /* 0 = APEX_MT_DEFAULT_CHUNK */
  int nlists;                                    /* 1..APEX_MT_MAX_LISTS */
  int ntensors;                                  /* tensors per list, >= 0 */
  apex_tensor *const *lists[APEX_MT_MAX_LISTS];  /* lists[l][i]: tensor i of list l */
  unsigned written;                              /* bit l set: the kernel writes list l */
  apex_mt_kernel kernel;
  void *ctx;
  const char *name;                              /* for error messages */
} apex_mt_launch;

/* Checks the lists (counts, element counts, dtypes, devices) and runs the kernel over every tile.
 * *overflow is set to 1 if any tile reported a non-finite value; it is never cleared. overflow may
 * be NULL. On a bad launch nothing is run and the message names the list and tensor at fault. */
APEX_API apex_status apex_multi_tensor_apply(const apex_mt_launch *launch, int *overflow);

/* The number of chunks a launch over these element counts has (for kernels that keep per-chunk
 * partials), and the index of the first chunk of each tensor in chunk_start[0..n] (n+1 entries,
 * may be NULL). */
APEX_API size_t apex_mt_chunk_count(size_t chunk_size, apex_tensor *const *tensors, int n, size_t *chunk_start);

#ifdef __cplusplus
}
#endif
#endif
