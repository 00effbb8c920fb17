/* index.h: int64 indices on a device (token ids, class targets), for training steps that read their
 * batch from the device they run on.
 *
 *     apex_index *ids = apex_index_create_on(APEX_DEVICE_CUDA, 2, (int64_t[]){B, T}, vocab);
 *     apex_index *tgt = apex_index_create_on(APEX_DEVICE_CUDA, 2, (int64_t[]){B, T}, vocab);
 *     for each step:
 *       apex_index_set(ids, host_tokens, B * T);      checked here, on the host, then queued to the device
 *       apex_index_set(tgt, host_targets, B * T);
 *       apex_var *loss = apex_gpt_loss_index(gpt, g, ids, tgt);
 *
 * Why a type of its own: an op given host ids must check them and copy them to the device inside the
 * step, which a captured step (a CUDA graph replays device work only) cannot repeat. An index is checked
 * once when it is set, against the bound it was made with, so the ops that read it (apex_embedding_index,
 * apex_linear_cross_entropy_index, apex_gpt_loss_index) compare bounds instead of values and copy nothing
 * through the host. apex tensors hold floats only; an index holds ids. */
#ifndef APEX_INDEX_H
#define APEX_INDEX_H

#include <stdint.h>

#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_index apex_index;

/* An index of shape[0..ndim) int64 values on device, each to be in [0, bound), zero-filled until set.
 * NULL with a message for ndim outside [1, APEX_MAX_DIMS], a NULL shape, a negative extent, bound < 1,
 * a device this build cannot use (APEX_ERR_UNSUPPORTED / APEX_ERR_INVALID_ARG) or no memory. */
APEX_API apex_index *apex_index_create_on(apex_device device, int ndim, const int64_t *shape, int64_t bound);
/* Frees the index (NULL is fine). Queued work that reads it finishes first on a GPU. */
APEX_API void apex_index_destroy(apex_index *ix);

/* Sets all n values from the host array values (n must be the index's element count). Every value is
 * checked first: one outside [0, bound) is APEX_ERR_INVALID_ARG, naming it and its position, and the
 * index keeps its values. On a GPU the copy is queued on apex's stream (the host array may be reused on
 * return), so it lands before the work queued after it and after the work queued before it. */
APEX_API apex_status apex_index_set(apex_index *ix, const int64_t *values, int64_t n);
/* Copies the values to the host array out of n elements (waits for the device). APEX_ERR_INVALID_ARG for
 * NULL arguments or n other than the element count. */
APEX_API apex_status apex_index_get(const apex_index *ix, int64_t *out, int64_t n);

/* The device (APEX_DEVICE_NONE for NULL). */
APEX_API apex_device apex_index_device(const apex_index *ix);
/* Dimensions and extents; -1 with a message for NULL or a dimension out of range, as the tensors'. */
APEX_API int apex_index_ndim(const apex_index *ix);
APEX_API int64_t apex_index_dim(const apex_index *ix, int d);
/* The element count (-1 with a message for NULL). */
APEX_API int64_t apex_index_numel(const apex_index *ix);
/* The bound every value is below (-1 with a message for NULL). */
APEX_API int64_t apex_index_bound(const apex_index *ix);

#ifdef __cplusplus
}
#endif
#endif
