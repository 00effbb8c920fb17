/* reducer_internal.h: the Reducer (reducer.c) as the sharded optimizer (zero.c) drives it. In scatter
 * mode each bucket is reduce-scattered (apex_pg_reduce_scatter_v) to the ranks that own its parts
 * instead of all-reduced, and nothing is written back: the owners keep the sums. The buckets share a
 * few buffers per dtype, used in turn, so the memory is that of `slots` buckets, not of the model: a
 * bucket's gradients are copied in when it starts (they stay put in the caller's tensors until then),
 * after the bucket that used its buffer before has finished. */
#ifndef APEX_PARALLEL_REDUCER_INTERNAL_H
#define APEX_PARALLEL_REDUCER_INTERNAL_H

#include <stddef.h>

#include "apex/parallel.h"

/* A Reducer in scatter mode over grads[0..n) (summing; buckets of bucket_bytes cut as
 * apex_reducer_create cuts them), with `slots` (>= 1) buffers per dtype. Collective, as
 * apex_reducer_create. Give it its targets with apex__reducer_set_scatter before the first mark. */
apex_reducer *apex__reducer_create_scatter(apex_pg *pg, apex_tensor *const *grads, int n, size_t bucket_bytes, int slots);
/* Where the sums go: counts[b * world + q] elements of bucket b belong to rank q (in rank order,
 * adding up to the bucket), and outs[b] (NULL when this rank has none) receives this rank's. Both
 * are copied. APEX_ERR_INVALID_ARG / APEX_ERR_SHAPE when they do not fit the buckets. */
apex_status apex__reducer_set_scatter(apex_reducer *r, const size_t *counts, apex_tensor *const *outs);
/* Scatter mode: the first of the buffers of dtype d (NULL when no bucket has that dtype). Between a
 * finished reduce (apex_reducer_reduce or apex_reducer_finish) and the next mark nothing uses it, so the
 * sharded optimizer's all-gathers borrow it then. */
apex_tensor *apex__reducer_slot(const apex_reducer *r, apex_dtype d);
/* Gradient i's place: its bucket's element count and dtype, and its offset in the bucket. */
size_t apex__reducer_bucket_numel(const apex_reducer *r, int b);
size_t apex__reducer_offset(const apex_reducer *r, int i);

#endif
