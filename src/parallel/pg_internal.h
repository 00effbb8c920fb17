/* pg_internal.h: the process-group backend interface.
 *
 * A backend (pg_local.c, pg_mpi.c, pg_nccl.c) fills an apex_pg_vtable. pg.c checks every
 * argument before calling it, so a backend sees only valid buffers: contiguous memory on its device,
 * a dtype in f32/f16/bf16, counts within max_count, a root in range. A start function begins the
 * collective and may finish it at once (setting w->done); progress(w, block) advances it, blocking
 * until it is done when block is set. Backends fail with apex__fail; pg.c keeps the message in the
 * work so that apex_pg_wait can report it later. */
#ifndef APEX_PARALLEL_PG_INTERNAL_H
#define APEX_PARALLEL_PG_INTERNAL_H

#include <stddef.h>

#include "apex/parallel.h"

typedef struct apex_pg_vtable {
  const char *name;
  apex_device device; /* where the buffers must live */
  size_t max_count;   /* most elements in one collective */
  apex_status (*allreduce)(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, apex_reduce_op op);
  apex_status (*broadcast)(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, int root);
  apex_status (*allgather)(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype);
  /* in holds world * n elements; out (n, never overlapping in) receives segment `rank` reduced. */
  apex_status (*reduce_scatter)(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype,
                                apex_reduce_op op);
  /* in holds counts[0] + ... + counts[world - 1] elements; out (counts[rank], NULL when 0) receives
   * segment `rank` reduced. NULL: not on this backend (APEX_ERR_UNSUPPORTED). */
  apex_status (*reduce_scatter_v)(apex_pg *pg, apex_pg_work *w, const void *in, void *out, const size_t *counts, apex_dtype dtype,
                                  apex_reduce_op op);
  apex_status (*barrier)(apex_pg *pg, apex_pg_work *w);
  apex_status (*progress)(apex_pg_work *w, int block);
  void (*work_free)(apex_pg_work *w); /* frees w->impl (the work is finished or failed) */
  void (*destroy)(apex_pg *pg);       /* frees pg->impl */
} apex_pg_vtable;

struct apex_pg {
  const apex_pg_vtable *backend;
  int rank;
  int world;
  void *impl;
  apex_pg_work *inflight; /* works not yet released by apex_pg_wait, newest first */
  /* A CPU group over the same ranks for the host-buffer helpers below, when this backend works on
   * device memory (nccl: its MPI bootstrap group, owned by the backend); NULL otherwise. */
  apex_pg *host;
};

#define APEX_PG_MESSAGE 512

struct apex_pg_work {
  apex_pg *pg;
  const char *what; /* "allreduce", ... for messages */
  int done;
  apex_status status;             /* sticky: the first failure */
  char message[APEX_PG_MESSAGE];  /* its message */
  void *impl;                     /* the backend's state */
  apex_pg_work *next, *prev;
};

/* A group over a backend; takes ownership of impl (freed by backend->destroy). NULL when out of
 * memory (impl is then destroyed too). */
apex_pg *apex__pg_new(const apex_pg_vtable *backend, int rank, int world, void *impl);

/* Blocking collectives on raw host buffers, for the layers built on process groups (over pg->host
 * when the group works on device memory). bytes must be a multiple of 4; the data is moved, never
 * interpreted. */
apex_status apex__pg_allgather_bytes(apex_pg *pg, const void *in, void *out, size_t bytes);
/* Sums n floats over all ranks in place (rank order, as apex_pg_allreduce). */
apex_status apex__pg_allreduce_f32(apex_pg *pg, float *buf, size_t n, apex_reduce_op op);

/* 64-bit FNV-1a, for comparing descriptions across ranks. */
uint64_t apex__fnv1a(uint64_t h, const void *data, size_t n);
#define APEX_FNV_OFFSET 0xcbf29ce484222325ull

#endif
