/* index_internal.h: what the ops that read an apex_index (index.h) see of it. */
#ifndef APEX_BACKEND_INDEX_INTERNAL_H
#define APEX_BACKEND_INDEX_INTERNAL_H

#include "apex/index.h"
#include "core/memory.h"

struct apex_index {
  const apex_memory *mem; /* the device's memory slots: data lives there */
  int64_t *data;          /* numel values, each in [0, bound) (checked when set) */
  int64_t numel, bound;
  int ndim;
  int64_t shape[APEX_MAX_DIMS];
};

#endif
