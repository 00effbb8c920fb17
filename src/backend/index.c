/* index.c: int64 indices on a device (index.h). In the backend layer because it allocates and copies
 * through a device's memory slots, as tensor_on.c does for tensors. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/index_internal.h"
#include "core/internal.h"

apex_index *apex_index_create_on(apex_device device, int ndim, const int64_t *shape, int64_t bound) {
  const char *fn = "apex_index_create_on";
  if (ndim < 1 || ndim > APEX_MAX_DIMS || !shape)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: %s", fn, !shape ? "NULL shape" : "ndim must be in [1, APEX_MAX_DIMS]");
  if (bound < 1) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: bound %lld: every value must be below it, give >= 1", fn, (long long)bound);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0 || (shape[d] > 0 && n > INT64_MAX / 8 / shape[d]))
      return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: extent %lld of dimension %d is %s", fn, (long long)shape[d], d,
                             shape[d] < 0 ? "negative" : "too large");
    n *= shape[d];
  }
  const apex_memory *m = apex__memory_for(device, fn);
  if (!m) return NULL;
  apex_index *ix = calloc(1, sizeof *ix);
  if (!ix) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  *ix = (apex_index){.mem = m, .numel = n, .bound = bound, .ndim = ndim};
  memcpy(ix->shape, shape, (size_t)ndim * sizeof *shape);
  if (m->alloc((size_t)(n ? n : 1) * sizeof(int64_t), 1, (void **)&ix->data) != APEX_OK) {
    free(ix);
    return NULL;
  }
  return ix;
}

void apex_index_destroy(apex_index *ix) {
  if (!ix) return;
  ix->mem->free(ix->data);
  free(ix);
}

apex_status apex_index_set(apex_index *ix, const int64_t *values, int64_t n) {
  const char *fn = "apex_index_set";
  if (!ix || (!values && n > 0)) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s", fn, !ix ? "index" : "values");
  if (n != ix->numel)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %lld values for an index of %lld", fn, (long long)n, (long long)ix->numel);
  for (int64_t i = 0; i < n; i++) /* all of them before anything is copied: a refusal changes nothing */
    if (values[i] < 0 || values[i] >= ix->bound)
      return apex__fail(APEX_ERR_INVALID_ARG, "%s: value %lld at %lld is outside [0, %lld)", fn, (long long)values[i], (long long)i,
                        (long long)ix->bound);
  if (n == 0) return APEX_OK;
  if (ix->mem->device == APEX_DEVICE_CPU) {
    memcpy(ix->data, values, (size_t)n * sizeof *values);
    return APEX_OK;
  }
  return ix->mem->copy(ix->data, values, (size_t)n * sizeof *values, APEX_COPY_H2D, 0);
}

apex_status apex_index_get(const apex_index *ix, int64_t *out, int64_t n) {
  const char *fn = "apex_index_get";
  if (!ix || (!out && n > 0)) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s", fn, !ix ? "index" : "out");
  if (n != ix->numel)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: room for %lld values, the index has %lld", fn, (long long)n, (long long)ix->numel);
  if (n == 0) return APEX_OK;
  return ix->mem->copy(out, ix->data, (size_t)n * sizeof *out, APEX_COPY_D2H, 1);
}

/* 1, or 0 after the message that fn got a NULL index. */
static int have(const apex_index *ix, const char *fn) {
  if (!ix) apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL index", fn);
  return ix != NULL;
}

apex_device apex_index_device(const apex_index *ix) { return ix ? ix->mem->device : APEX_DEVICE_NONE; }
int apex_index_ndim(const apex_index *ix) { return have(ix, __func__) ? ix->ndim : -1; }
int64_t apex_index_dim(const apex_index *ix, int d) {
  if (!have(ix, __func__)) return -1;
  if (d < 0 || d >= ix->ndim)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_index_dim: dimension %d of an index of %d", d, ix->ndim), -1;
  return ix->shape[d];
}
int64_t apex_index_numel(const apex_index *ix) { return have(ix, __func__) ? ix->numel : -1; }
int64_t apex_index_bound(const apex_index *ix) { return have(ix, __func__) ? ix->bound : -1; }
