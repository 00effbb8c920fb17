/* pg_local.c: the one-process backend (world size 1). A sum, average or max over one rank is the
 * value itself and a broadcast from rank 0 changes nothing, so every collective but all-gather and
 * reduce-scatter (copies) is an identity, done at once. It lets a program written for many ranks run without mpirun. */
#include <string.h>

#include "core/internal.h"
#include "parallel/pg_internal.h"

static apex_status local_allreduce(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, apex_reduce_op op) {
  (void)pg, (void)buf, (void)n, (void)dtype, (void)op;
  w->done = 1;
  return APEX_OK;
}

static apex_status local_broadcast(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, int root) {
  (void)pg, (void)buf, (void)n, (void)dtype, (void)root;
  w->done = 1;
  return APEX_OK;
}

static apex_status local_allgather(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype) {
  (void)pg;
  memcpy(out, in, n * apex_dtype_size(dtype));
  w->done = 1;
  return APEX_OK;
}

/* One rank's segment is the whole input, reduced over one rank: a copy. */
static apex_status local_reduce_scatter(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype,
                                        apex_reduce_op op) {
  (void)pg, (void)op;
  memcpy(out, in, n * apex_dtype_size(dtype));
  w->done = 1;
  return APEX_OK;
}

static apex_status local_reduce_scatter_v(apex_pg *pg, apex_pg_work *w, const void *in, void *out, const size_t *counts,
                                          apex_dtype dtype, apex_reduce_op op) {
  return local_reduce_scatter(pg, w, in, out, counts[0], dtype, op);
}

static apex_status local_barrier(apex_pg *pg, apex_pg_work *w) {
  (void)pg;
  w->done = 1;
  return APEX_OK;
}

static apex_status local_progress(apex_pg_work *w, int block) {
  (void)block;
  w->done = 1;
  return APEX_OK;
}

static void local_work_free(apex_pg_work *w) { (void)w; }
static void local_destroy(apex_pg *pg) { (void)pg; }

static const apex_pg_vtable local_backend = {
    .name = "local",
    .device = APEX_DEVICE_CPU,
    .max_count = SIZE_MAX,
    .allreduce = local_allreduce,
    .broadcast = local_broadcast,
    .allgather = local_allgather,
    .reduce_scatter = local_reduce_scatter,
    .reduce_scatter_v = local_reduce_scatter_v,
    .barrier = local_barrier,
    .progress = local_progress,
    .work_free = local_work_free,
    .destroy = local_destroy,
};

apex_pg *apex_pg_create_local(void) { return apex__pg_new(&local_backend, 0, 1, NULL); }
