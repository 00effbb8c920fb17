/* pg.c: the process-group interface: argument checks, work handles and dispatch to a backend
 * (pg_internal.h). Backends never see a bad argument; the messages for bad arguments are made here,
 * once, for every backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "parallel/pg_internal.h"

apex_pg *apex__pg_new(const apex_pg_vtable *backend, int rank, int world, void *impl) {
  apex_pg *pg = calloc(1, sizeof *pg);
  if (!pg) {
    apex_pg tmp = {.backend = backend, .impl = impl};
    backend->destroy(&tmp);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_pg: out of memory");
  }
  pg->backend = backend;
  pg->rank = rank;
  pg->world = world;
  pg->impl = impl;
  return pg;
}

static void work_unlink(apex_pg_work *w) {
  apex_pg *pg = w->pg;
  if (w->prev) w->prev->next = w->next;
  else pg->inflight = w->next;
  if (w->next) w->next->prev = w->prev;
}

static apex_status work_release(apex_pg_work *w) {
  apex_status st = w->status;
  work_unlink(w);
  w->pg->backend->work_free(w);
  if (st != APEX_OK) apex__fail(st, "%s", w->message);
  free(w);
  return st;
}

/* Records a backend failure in the work (the message is the one the backend just left). */
static apex_status work_failed(apex_pg_work *w, apex_status st) {
  if (w->status == APEX_OK) {
    w->status = st;
    snprintf(w->message, sizeof w->message, "%s", apex_last_error());
  }
  w->done = 1;
  return st;
}

void apex_pg_destroy(apex_pg *pg) {
  if (!pg) return;
  while (pg->inflight) {
    apex_pg_work *w = pg->inflight;
    if (!w->done) {
      apex_status st = pg->backend->progress(w, 1);
      if (st != APEX_OK) work_failed(w, st);
    }
    work_release(w);
  }
  pg->backend->destroy(pg);
  free(pg);
}

/* The accessors answer NULL with the value parallel.h gives and a message. */
static int null_pg(const apex_pg *pg, const char *fn) {
  if (pg) return 0;
  apex__fail_null_arg(fn, "process group");
  return 1;
}

int apex_pg_rank(const apex_pg *pg) { return null_pg(pg, __func__) ? -1 : pg->rank; }
int apex_pg_world_size(const apex_pg *pg) { return null_pg(pg, __func__) ? -1 : pg->world; }
const char *apex_pg_backend(const apex_pg *pg) { return null_pg(pg, __func__) ? "" : pg->backend->name; }
apex_device apex_pg_device(const apex_pg *pg) { return null_pg(pg, __func__) ? APEX_DEVICE_NONE : pg->backend->device; }

/* ---- argument checks -------------------------------------------------------------------------- */

static apex_status check_pg(const apex_pg *pg, const char *fn) {
  if (!pg) return apex__fail(APEX_ERR_INVALID_ARG, "%s: pg is NULL", fn);
  return APEX_OK;
}

static apex_status check_tensor(const apex_pg *pg, const apex_tensor *t, const char *fn, const char *what) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
  apex_dtype dt = apex_tensor_dtype(t);
  if (apex__check_dtype(dt, what) != APEX_OK)
    return apex__fail(APEX_ERR_DTYPE, "%s: %s has an invalid dtype (%d); collectives take f32, f16 or bf16", fn, what, (int)dt);
  if (apex_tensor_device(t) != pg->backend->device)
    return apex__fail(APEX_ERR_DEVICE, "%s: %s is on %s but the %s backend works on %s memory", fn, what,
                      apex_tensor_device(t) == APEX_DEVICE_CPU ? "the CPU" : apex__device_name(apex_tensor_device(t)),
                      pg->backend->name, apex__device_name(pg->backend->device));
  if (apex_tensor_numel(t) > pg->backend->max_count)
    return apex__fail(APEX_ERR_SHAPE, "%s: %s has %zu elements; the %s backend takes at most %zu per collective (split the tensor)",
                      fn, what, apex_tensor_numel(t), pg->backend->name, pg->backend->max_count);
  return APEX_OK;
}

static apex_status new_work(apex_pg *pg, const char *what, apex_pg_work **out) {
  apex_pg_work *w = calloc(1, sizeof *w);
  if (!w) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_pg_%s: out of memory", what);
  w->pg = pg;
  w->what = what;
  w->next = pg->inflight;
  if (pg->inflight) pg->inflight->prev = w;
  pg->inflight = w;
  *out = w;
  return APEX_OK;
}

/* After a backend start call: a failure to start releases the work and returns the failure. */
static apex_status started(apex_pg_work *w, apex_status st, apex_pg_work **work) {
  if (st != APEX_OK) {
    work_failed(w, st);
    *work = NULL;
    return work_release(w);
  }
  *work = w;
  return APEX_OK;
}

/* ---- non-blocking collectives ------------------------------------------------------------------- */

apex_status apex_pg_allreduce_async(apex_pg *pg, apex_tensor *t, apex_reduce_op op, apex_pg_work **work) {
  const char *fn = "apex_pg_allreduce";
  if (work) *work = NULL;
  apex_status st = check_pg(pg, fn);
  if (st == APEX_OK) st = check_tensor(pg, t, fn, "the tensor");
  if (st != APEX_OK) return st;
  if (!work) return apex__fail(APEX_ERR_INVALID_ARG, "%s_async: work is NULL", fn);
  if (op != APEX_REDUCE_SUM && op != APEX_REDUCE_AVG && op != APEX_REDUCE_MAX)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: unknown op %d (use APEX_REDUCE_SUM, _AVG or _MAX)", fn, (int)op);
  apex_pg_work *w = NULL;
  if ((st = new_work(pg, "allreduce", &w)) != APEX_OK) return st;
  return started(w, pg->backend->allreduce(pg, w, apex_tensor_data(t), apex_tensor_numel(t), apex_tensor_dtype(t), op), work);
}

apex_status apex_pg_broadcast_async(apex_pg *pg, apex_tensor *t, int root, apex_pg_work **work) {
  const char *fn = "apex_pg_broadcast";
  if (work) *work = NULL;
  apex_status st = check_pg(pg, fn);
  if (st == APEX_OK) st = check_tensor(pg, t, fn, "the tensor");
  if (st != APEX_OK) return st;
  if (!work) return apex__fail(APEX_ERR_INVALID_ARG, "%s_async: work is NULL", fn);
  if (root < 0 || root >= pg->world)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: root %d is not a rank (world size %d)", fn, root, pg->world);
  apex_pg_work *w = NULL;
  if ((st = new_work(pg, "broadcast", &w)) != APEX_OK) return st;
  return started(w, pg->backend->broadcast(pg, w, apex_tensor_data(t), apex_tensor_numel(t), apex_tensor_dtype(t), root), work);
}

apex_status apex_pg_allgather_async(apex_pg *pg, const apex_tensor *in, apex_tensor *out, apex_pg_work **work) {
  const char *fn = "apex_pg_allgather";
  if (work) *work = NULL;
  apex_status st = check_pg(pg, fn);
  if (st == APEX_OK) st = check_tensor(pg, in, fn, "in");
  if (st == APEX_OK) st = check_tensor(pg, out, fn, "out");
  if (st != APEX_OK) return st;
  if (!work) return apex__fail(APEX_ERR_INVALID_ARG, "%s_async: work is NULL", fn);
  if (apex_tensor_dtype(in) != apex_tensor_dtype(out))
    return apex__fail(APEX_ERR_DTYPE, "%s: in is %s but out is %s", fn, apex_dtype_name(apex_tensor_dtype(in)),
                      apex_dtype_name(apex_tensor_dtype(out)));
  size_t n = apex_tensor_numel(in);
  if (apex_tensor_numel(out) != n * (size_t)pg->world)
    return apex__fail(APEX_ERR_SHAPE, "%s: out has %zu elements but needs world_size (%d) x %zu = %zu", fn, apex_tensor_numel(out),
                      pg->world, n, n * (size_t)pg->world);
  if (apex_tensor_shares_storage(in, out))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: in and out share storage; give out its own buffer", fn);
  apex_pg_work *w = NULL;
  if ((st = new_work(pg, "allgather", &w)) != APEX_OK) return st;
  return started(w, pg->backend->allgather(pg, w, apex_tensor_data(in), apex_tensor_data(out), n, apex_tensor_dtype(in)), work);
}

/* The checks both reduce-scatters make; out may be NULL only when allowed (this rank's part is empty). */
static apex_status check_scatter(apex_pg *pg, const apex_tensor *in, const apex_tensor *out, int out_optional, apex_reduce_op op,
                                 apex_pg_work **work, const char *fn) {
  if (work) *work = NULL;
  apex_status st = check_pg(pg, fn);
  if (st == APEX_OK) st = check_tensor(pg, in, fn, "in");
  if (st == APEX_OK && !(out_optional && !out)) st = check_tensor(pg, out, fn, "out");
  if (st != APEX_OK) return st;
  if (!work) return apex__fail(APEX_ERR_INVALID_ARG, "%s_async: work is NULL", fn);
  if (op != APEX_REDUCE_SUM && op != APEX_REDUCE_AVG && op != APEX_REDUCE_MAX)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: unknown op %d (use APEX_REDUCE_SUM, _AVG or _MAX)", fn, (int)op);
  if (out && apex_tensor_dtype(in) != apex_tensor_dtype(out))
    return apex__fail(APEX_ERR_DTYPE, "%s: in is %s but out is %s", fn, apex_dtype_name(apex_tensor_dtype(in)),
                      apex_dtype_name(apex_tensor_dtype(out)));
  if (out && apex_tensor_shares_storage(in, out))
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: in and out share storage; give out its own buffer", fn);
  return APEX_OK;
}

apex_status apex_pg_reduce_scatter_async(apex_pg *pg, const apex_tensor *in, apex_tensor *out, apex_reduce_op op,
                                         apex_pg_work **work) {
  const char *fn = "apex_pg_reduce_scatter";
  apex_status st = check_scatter(pg, in, out, 0, op, work, fn);
  if (st != APEX_OK) return st;
  size_t n = apex_tensor_numel(out);
  if (apex_tensor_numel(in) != n * (size_t)pg->world)
    return apex__fail(APEX_ERR_SHAPE, "%s: in has %zu elements but needs world_size (%d) x numel(out) (%zu) = %zu", fn,
                      apex_tensor_numel(in), pg->world, n, n * (size_t)pg->world);
  apex_pg_work *w = NULL;
  if ((st = new_work(pg, "reduce_scatter", &w)) != APEX_OK) return st;
  return started(w, pg->backend->reduce_scatter(pg, w, apex_tensor_data(in), apex_tensor_data(out), n, apex_tensor_dtype(in), op),
                 work);
}

apex_status apex_pg_reduce_scatter_v_async(apex_pg *pg, const apex_tensor *in, apex_tensor *out, const size_t *counts, apex_reduce_op op,
                                           apex_pg_work **work) {
  const char *fn = "apex_pg_reduce_scatter_v";
  apex_status st = check_scatter(pg, in, out, 1, op, work, fn);
  if (st != APEX_OK) return st;
  if (!counts) return apex__fail(APEX_ERR_INVALID_ARG, "%s: counts is NULL", fn);
  size_t total = 0;
  for (int p = 0; p < pg->world; p++) total += counts[p];
  if (apex_tensor_numel(in) != total)
    return apex__fail(APEX_ERR_SHAPE, "%s: in has %zu elements but the counts add up to %zu", fn, apex_tensor_numel(in), total);
  size_t mine = out ? apex_tensor_numel(out) : 0;
  if (mine != counts[pg->rank])
    return apex__fail(APEX_ERR_SHAPE, "%s: out has %zu elements but counts[%d] is %zu%s", fn, mine, pg->rank, counts[pg->rank],
                      out ? "" : " (out is NULL)");
  if (!pg->backend->reduce_scatter_v)
    return apex__fail(APEX_ERR_UNSUPPORTED, "%s: the %s group has no reduce-scatter of unequal parts", fn, pg->backend->name);
  apex_pg_work *w = NULL;
  if ((st = new_work(pg, "reduce_scatter_v", &w)) != APEX_OK) return st;
  return started(w, pg->backend->reduce_scatter_v(pg, w, apex_tensor_data(in), out ? apex_tensor_data(out) : NULL, counts,
                                                  apex_tensor_dtype(in), op),
                 work);
}

apex_status apex_pg_barrier_async(apex_pg *pg, apex_pg_work **work) {
  if (work) *work = NULL;
  apex_status st = check_pg(pg, "apex_pg_barrier");
  if (st != APEX_OK) return st;
  if (!work) return apex__fail(APEX_ERR_INVALID_ARG, "apex_pg_barrier_async: work is NULL");
  apex_pg_work *w = NULL;
  if ((st = new_work(pg, "barrier", &w)) != APEX_OK) return st;
  return started(w, pg->backend->barrier(pg, w), work);
}

apex_status apex_pg_test(apex_pg_work *work, int *done) {
  if (!work || !done) return apex__fail(APEX_ERR_INVALID_ARG, "apex_pg_test: %s is NULL", work ? "done" : "work");
  if (!work->done) {
    apex_status st = work->pg->backend->progress(work, 0);
    if (st != APEX_OK) work_failed(work, st);
  }
  *done = work->done;
  if (work->status != APEX_OK) return apex__fail(work->status, "%s", work->message);
  return APEX_OK;
}

apex_status apex_pg_wait(apex_pg_work *work) {
  if (!work) return apex__fail(APEX_ERR_INVALID_ARG, "apex_pg_wait: work is NULL");
  if (!work->done) {
    apex_status st = work->pg->backend->progress(work, 1);
    if (st != APEX_OK) work_failed(work, st);
  }
  return work_release(work);
}

/* ---- blocking collectives ----------------------------------------------------------------------- */


apex_status apex_pg_allreduce(apex_pg *pg, apex_tensor *t, apex_reduce_op op) {
  apex_pg_work *w = NULL;
  apex_status st = apex_pg_allreduce_async(pg, t, op, &w);
  return st != APEX_OK ? st : apex_pg_wait(w);
}

apex_status apex_pg_broadcast(apex_pg *pg, apex_tensor *t, int root) {
  apex_pg_work *w = NULL;
  apex_status st = apex_pg_broadcast_async(pg, t, root, &w);
  return st != APEX_OK ? st : apex_pg_wait(w);
}

apex_status apex_pg_allgather(apex_pg *pg, const apex_tensor *in, apex_tensor *out) {
  apex_pg_work *w = NULL;
  apex_status st = apex_pg_allgather_async(pg, in, out, &w);
  return st != APEX_OK ? st : apex_pg_wait(w);
}

apex_status apex_pg_reduce_scatter(apex_pg *pg, const apex_tensor *in, apex_tensor *out, apex_reduce_op op) {
  apex_pg_work *w = NULL;
  apex_status st = apex_pg_reduce_scatter_async(pg, in, out, op, &w);
  return st != APEX_OK ? st : apex_pg_wait(w);
}

apex_status apex_pg_reduce_scatter_v(apex_pg *pg, const apex_tensor *in, apex_tensor *out, const size_t *counts, apex_reduce_op op) {
  apex_pg_work *w = NULL;
  apex_status st = apex_pg_reduce_scatter_v_async(pg, in, out, counts, op, &w);
  return st != APEX_OK ? st : apex_pg_wait(w);
}

apex_status apex_pg_barrier(apex_pg *pg) {
  apex_pg_work *w = NULL;
  apex_status st = apex_pg_barrier_async(pg, &w);
  return st != APEX_OK ? st : apex_pg_wait(w);
}

apex_status apex_pg_allreduce_flag(apex_pg *pg, int *flag) {
  if (!flag) return apex__fail(APEX_ERR_INVALID_ARG, "apex_pg_allreduce_flag: flag is NULL");
  apex_status st = check_pg(pg, "apex_pg_allreduce_flag");
  if (st != APEX_OK) return st;
  float v = *flag ? 1.0f : 0.0f;
  int64_t shape = 1;
  apex_tensor *t = apex_tensor_wrap(&v, APEX_F32, 1, &shape);
  if (!t) return APEX_ERR_OUT_OF_MEMORY;
  if (pg->backend->device == APEX_DEVICE_CPU) {
    st = apex_pg_allreduce(pg, t, APEX_REDUCE_MAX);
  } else {
    /* A device backend reduces on the device, on the same stream order as the gradients it follows. */
    apex_tensor *d = apex_tensor_create_on(pg->backend->device, APEX_F32, 1, &shape);
    st = d ? apex_tensor_copy(d, t) : APEX_ERR_OUT_OF_MEMORY;
    if (st == APEX_OK) st = apex_pg_allreduce(pg, d, APEX_REDUCE_MAX);
    if (st == APEX_OK) st = apex_tensor_copy(t, d);
    apex_tensor_destroy(d);
  }
  apex_tensor_destroy(t);
  if (st == APEX_OK) *flag = v != 0.0f;
  return st;
}

/* ---- raw buffers, for the layers inside apex ---------------------------------------------------- */

apex_status apex__pg_allgather_bytes(apex_pg *pg, const void *in, void *out, size_t bytes) {
  if (pg->host) pg = pg->host;
  int64_t n = (int64_t)(bytes / 4), nout = n * pg->world;
  apex_tensor *tin = apex_tensor_wrap((void *)in, APEX_F32, 1, &n);
  apex_tensor *tout = apex_tensor_wrap(out, APEX_F32, 1, &nout);
  apex_status st = tin && tout ? apex_pg_allgather(pg, tin, tout) : APEX_ERR_OUT_OF_MEMORY;
  apex_tensor_destroy(tin);
  apex_tensor_destroy(tout);
  return st;
}

apex_status apex__pg_allreduce_f32(apex_pg *pg, float *buf, size_t n, apex_reduce_op op) {
  if (pg->host) pg = pg->host;
  int64_t shape = (int64_t)n;
  apex_tensor *t = apex_tensor_wrap(buf, APEX_F32, 1, &shape);
  if (!t) return APEX_ERR_OUT_OF_MEMORY;
  apex_status st = apex_pg_allreduce(pg, t, op);
  apex_tensor_destroy(t);
  return st;
}

uint64_t apex__fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* ---- choosing a backend ------------------------------------------------------------------------- */

/* Environment variables that MPI launchers set in the processes they start. */
static int launched_by_mpi(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

apex_pg *apex_pg_create(const apex_pg_options *options) {
  if (apex_pg_mpi_available() && (launched_by_mpi() || (options && options->mpi_comm))) return apex_pg_create_mpi(options);
  return apex_pg_create_local();
}
