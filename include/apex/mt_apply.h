/* mt_apply.h: the CPU multi-tensor applier, for writing new multi-tensor kernels (Apex's
 * multi_tensor_applier, in C). multi_tensor.h includes it; it belongs to the CPU backend, which runs its
 * own multi-tensor and optimizer kernels on it.
 *
 * A launch takes up to APEX_MT_MAX_LISTS lists of CPU tensors (say grads, params, m, v, masters), the
 * same number of tensors in each list and the same element count at each index; each list may have
 * its own dtype. The tensors are cut into chunks of chunk_size elements that the threads share; a
 * chunk is processed in tiles, each tile widened to f32 (f32 lists are used in place), handed to the
 * kernel, and the lists the kernel writes narrowed back with round-to-nearest-even. Non-finite
 * values seen by the kernel raise one overflow flag for the whole launch. Results never depend on the
 * thread count: chunk and tile boundaries depend only on chunk_size. */
#ifndef APEX_MT_APPLY_H
#define APEX_MT_APPLY_H

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
  unsigned raw;                                  /* bit l set: list l reaches the kernel as stored, not
                                                    widened: tile.p[l] points at the tensor's own elements
                                                    (cast to float *; the kernel knows their dtype), and
                                                    what the kernel writes there stays as written */
} apex_mt_launch;

/* Checks the lists (counts, element counts, dtypes, devices) and runs the kernel over every tile.
 * *overflow is set to 1 if any tile reported a non-finite value; it is never cleared. overflow may
 * be NULL. On a bad launch nothing is run and the message names the list and tensor at fault. */
APEX_API apex_status apex_multi_tensor_apply(const apex_mt_launch *launch, int *overflow);

/* The number of chunks a launch over these element counts has (for kernels that keep per-chunk
 * partials), and the index of the first chunk of each tensor in chunk_start[0..n] (n+1 entries,
 * may be NULL). 0, chunk_start untouched, with an APEX_ERR_INVALID_ARG message, for a negative n, a
 * NULL list or a NULL tensor in it. */
APEX_API size_t apex_mt_chunk_count(size_t chunk_size, apex_tensor *const *tensors, int n, size_t *chunk_start);

#ifdef __cplusplus
}
#endif
#endif
