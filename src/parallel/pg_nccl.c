/* pg_nccl.c: the NCCL backend: collectives on CUDA tensors, one communicator per process, one GPU
 * per process.
 *
 * Bootstrap over MPI: the group first makes an MPI group (apex_pg_create_mpi) over the same ranks.
 * Every rank sends its host name's hash and GPU count; from them each rank derives its local rank
 * (its index among the ranks on its host), checks that no host runs more ranks than it has GPUs
 * (NCCL refuses two ranks of one communicator on one GPU) and takes device local_rank % count.
 * Rank 0's ncclUniqueId then travels in a second exchange that also carries every rank's setup
 * status, so a rank that cannot open its GPU makes every rank fail with the same message instead
 * of leaving the others in ncclCommInitRank. The MPI group is kept: the host-memory exchanges of
 * the layers above (apex_pg_check_consistent, SyncBatchNorm's statistics) go over it, with no GPU
 * round trip.
 *
 * Streams: apex's kernels run on apex's stream; the collectives on a stream of their own, which
 * first waits (an event, no host synchronisation) for everything queued on apex's stream, so a
 * collective sees the gradients the preceding kernels wrote, while apex kernels queued after it
 * (the rest of backward) can overlap it. A work's end is an event recorded after the collective;
 * apex_pg_test queries it and apex_pg_wait polls it. Polling rather than waiting on the event
 * lets the wait notice ncclCommGetAsyncError (a peer that died, a network error): the
 * communicator is then aborted and the wait returns APEX_ERR_IO instead of hanging.
 *
 * The device is reached only through the CUDA backend's slots (backend/backend.h: its memory for the
 * scratch buffer, backend/streams.h for the device, streams and events); this file makes NCCL's calls
 * and no CUDA runtime call. NCCL takes the slots' native handles (a cudaStream_t is what the stream
 * slot hands out).
 *
 * Sums are NCCL's (its ring or tree order, f16/bf16 added in their own precision per step), so
 * results may differ in the last bits from the MPI backend's rank-order f32 sums; they are the
 * same on every rank. AVG is ncclAvg. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "backend/backend.h"
#include "parallel/pg_internal.h"

#if defined(APEX_HAVE_NCCL) && APEX_HAVE_NCCL
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "apex's NCCL backend needs NCCL 2.14 or newer (ncclAvg, bf16, ncclGetLastError, ncclCommFinalize); configure with -DAPEX_NCCL=OFF"
#endif

int apex_pg_nccl_available(void) { return 1; }

typedef struct nccl_pg {
  apex_pg_vtable vt;       /* nccl_backend with the device of the backend below */
  const apex_backend *dev; /* the CUDA backend: memory, streams and events */
  const apex_streams *st;  /* dev->streams */
  ncclComm_t comm;
  void *stream;            /* where the collectives run (a side stream) */
  void *ready;             /* an event recorded on apex's stream before each collective */
  float *d_scratch;        /* the barrier's one-element all-reduce */
  apex_pg *mpi;            /* the bootstrap group, kept for host-memory exchanges */
  int device;
  int rank;
  int broken; /* the communicator was aborted after an asynchronous error */
  char broken_msg[256];
} nccl_pg;

typedef struct nccl_work {
  void *done; /* an event recorded after the collective */
} nccl_work;

/* A device slot's failure, its message prefixed with the rank (every rank reports its own). */
static apex_status on_rank(apex_status st, int rank) {
  if (st == APEX_OK) return st;
  char msg[APEX_PG_MESSAGE];
  snprintf(msg, sizeof msg, "%s", apex_last_error());
  return apex__fail(st, "rank %d: %s", rank, msg);
}

static apex_status nccl_err(ncclComm_t comm, ncclResult_t r, const char *what, int rank) {
  const char *detail = ncclGetLastError(comm);
  return apex__fail(APEX_ERR_IO, "%s failed on rank %d: NCCL error %s%s%s", what, rank, ncclGetErrorString(r),
                    detail && *detail ? ": " : "", detail ? detail : "");
}

static ncclDataType_t nccl_type(apex_dtype dtype) {
  return dtype == APEX_F32 ? ncclFloat32 : dtype == APEX_F16 ? ncclFloat16 : ncclBfloat16;
}

static ncclRedOp_t nccl_op(apex_reduce_op op) {
  return op == APEX_REDUCE_SUM ? ncclSum : op == APEX_REDUCE_AVG ? ncclAvg : ncclMax;
}

/* Every failure after an abort names the first one: the communicator is gone. */
static apex_status broken(const nccl_pg *p, const char *what) {
  return apex__fail(APEX_ERR_IO, "apex_pg_%s on rank %d: the NCCL communicator was aborted after an earlier failure (%s); destroy the group",
                    what, p->rank, p->broken_msg);
}

/* Aborts the communicator after an asynchronous error, so that no later call waits on it. */
static apex_status abort_comm(nccl_pg *p, ncclResult_t r, const char *what) {
  apex_status st = nccl_err(p->comm, r, what, p->rank);
  snprintf(p->broken_msg, sizeof p->broken_msg, "%s", apex_last_error());
  p->broken = 1;
  ncclCommAbort(p->comm);
  p->comm = NULL;
  return st;
}

/* The common start of a collective over n elements: a work with its end event, and the collective
 * stream made to wait for what apex has queued so far. n == 0 finishes the work at once and sets
 * *out to NULL (every rank passes the same count, so every rank skips). */
static apex_status begin(apex_pg *pg, apex_pg_work *w, size_t n, nccl_work **out) {
  nccl_pg *p = pg->impl;
  *out = NULL;
  if (n == 0) {
    w->done = 1;
    return APEX_OK;
  }
  if (p->broken) return broken(p, w->what);
  apex_status st = p->st->enter(w->what); /* puts this thread on apex's device */
  if (st != APEX_OK) return on_rank(st, p->rank);
  nccl_work *nw = calloc(1, sizeof *nw);
  if (!nw) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_pg_%s: out of memory", w->what);
  w->impl = nw;
  st = p->st->event_create("creating the collective's end event", &nw->done);
  if (st == APEX_OK) st = p->st->event_record("ordering the collective after apex's stream", p->ready, NULL);
  if (st == APEX_OK) st = p->st->stream_wait("ordering the collective after apex's stream", p->stream, p->ready);
  if (st != APEX_OK) return on_rank(st, p->rank);
  *out = nw;
  return APEX_OK;
}

/* The common end: checks what NCCL said when enqueueing, then marks the end of the work. */
static apex_status end(apex_pg *pg, nccl_work *nw, ncclResult_t r, const char *what) {
  nccl_pg *p = pg->impl;
  if (r != ncclSuccess) return nccl_err(p->comm, r, what, p->rank);
  return on_rank(p->st->event_record("marking the collective's end", nw->done, p->stream), p->rank);
}

static apex_status nccl_allreduce(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, apex_reduce_op op) {
  nccl_pg *p = pg->impl;
  nccl_work *nw = NULL;
  apex_status st = begin(pg, w, n, &nw);
  if (st != APEX_OK || !nw) return st;
  return end(pg, nw, ncclAllReduce(buf, buf, n, nccl_type(dtype), nccl_op(op), p->comm, (cudaStream_t)p->stream),
             "ncclAllReduce");
}

static apex_status nccl_broadcast(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, int root) {
  nccl_pg *p = pg->impl;
  nccl_work *nw = NULL;
  apex_status st = begin(pg, w, n, &nw);
  if (st != APEX_OK || !nw) return st;
  return end(pg, nw, ncclBroadcast(buf, buf, n, nccl_type(dtype), root, p->comm, (cudaStream_t)p->stream), "ncclBroadcast");
}

static apex_status nccl_allgather(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype) {
  nccl_pg *p = pg->impl;
  nccl_work *nw = NULL;
  apex_status st = begin(pg, w, n, &nw);
  if (st != APEX_OK || !nw) return st;
  return end(pg, nw, ncclAllGather(in, out, n, nccl_type(dtype), p->comm, (cudaStream_t)p->stream), "ncclAllGather");
}

static apex_status nccl_reduce_scatter(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype,
                                       apex_reduce_op op) {
  nccl_pg *p = pg->impl;
  nccl_work *nw = NULL;
  apex_status st = begin(pg, w, n, &nw);
  if (st != APEX_OK || !nw) return st;
  return end(pg, nw, ncclReduceScatter(in, out, n, nccl_type(dtype), nccl_op(op), p->comm, (cudaStream_t)p->stream),
             "ncclReduceScatter");
}

/* NCCL has no barrier: a one-element all-reduce finishes on no rank before every rank has joined. */
static apex_status nccl_barrier(apex_pg *pg, apex_pg_work *w) {
  nccl_pg *p = pg->impl;
  nccl_work *nw = NULL;
  apex_status st = begin(pg, w, 1, &nw);
  if (st != APEX_OK) return st;
  return end(pg, nw, ncclAllReduce(p->d_scratch, p->d_scratch, 1, ncclFloat32, ncclSum, p->comm, (cudaStream_t)p->stream),
             "ncclAllReduce (barrier)");
}

static apex_status nccl_progress(apex_pg_work *w, int block) {
  nccl_pg *p = w->pg->impl;
  nccl_work *nw = w->impl;
  apex_status st = p->st->enter(w->what);
  if (st != APEX_OK) return on_rank(st, p->rank);
  for (;;) {
    if (p->broken) return broken(p, w->what);
    int done = 0;
    st = p->st->event_query(w->what, nw->done, &done);
    if (st != APEX_OK) return on_rank(st, p->rank);
    if (done) {
      w->done = 1;
      return APEX_OK;
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(p->comm, &async);
    if (r != ncclSuccess) return abort_comm(p, r, "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) return abort_comm(p, async, w->what);
    if (!block) return APEX_OK;
    /* Short naps: a gradient bucket takes from microseconds to milliseconds. */
    struct timespec nap = {0, 20000};
    nanosleep(&nap, NULL);
  }
}

static void nccl_work_free(apex_pg_work *w) {
  nccl_work *nw = w->impl;
  if (!nw) return;
  nccl_pg *p = w->pg->impl;
  p->st->event_destroy(nw->done); /* released once it completes, should it be pending */
  free(nw);
  w->impl = NULL;
}

static void nccl_destroy(apex_pg *pg) {
  nccl_pg *p = pg->impl;
  if (!p) return;
  if (p->comm) {
    /* Finalize flushes what NCCL still has in flight; apex_pg_destroy has waited for every work. */
    if (ncclCommFinalize(p->comm) == ncclSuccess) ncclCommDestroy(p->comm);
    else ncclCommAbort(p->comm);
  }
  if (p->st) { /* NULL when creation failed before finding the backend */
    p->st->stream_destroy(p->stream); /* after its queued work */
    p->dev->mem->free(p->d_scratch);
    p->st->event_destroy(p->ready);
  }
  apex_pg_destroy(p->mpi);
  free(p);
}

/* Each group copies it into nccl_pg.vt with .device set to the CUDA backend's device. */
static const apex_pg_vtable nccl_backend = {
    .name = "nccl",
    .max_count = SIZE_MAX,
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .progress = nccl_progress,
    .work_free = nccl_work_free,
    .destroy = nccl_destroy,
};

/* ---- creation ---------------------------------------------------------------------------------- */

#define FN "apex_pg_create_nccl"

typedef struct host_record { /* round 1: where each rank runs */
  uint64_t host;             /* hash of the host name */
  int32_t gpus;              /* visible GPUs; 0 when the device runtime cannot start */
  int32_t pad;
} host_record;

typedef struct setup_record { /* round 2: whether each rank is ready, and rank 0's id */
  int32_t ok;
  int32_t pad;
  ncclUniqueId id;
} setup_record;

/* Picks this rank's GPU from every rank's host record; the same verdict on every rank. */
static apex_status choose_device(const host_record *all, int world, int rank, const char *my_why, int *device) {
  for (int r = 0; r < world; r++) {
    int local = 0, on_host = 0;
    for (int q = 0; q < world; q++)
      if (all[q].host == all[r].host) {
        on_host++;
        if (q < r) local++;
      }
    if (all[r].gpus <= 0)
      return apex__fail(APEX_ERR_UNSUPPORTED, FN ": rank %d sees no usable CUDA GPU%s%s", r, r == rank ? ": " : " (its own error says why)",
                        r == rank ? my_why : "");
    if (on_host > all[r].gpus)
      return apex__fail(APEX_ERR_UNSUPPORTED,
                        FN ": the host of rank %d runs %d ranks but has %d visible GPU%s; NCCL needs one GPU per rank (two ranks of one "
                        "communicator cannot share a GPU): start at most %d ranks per host, or use apex_pg_create_mpi",
                        r, on_host, all[r].gpus, all[r].gpus == 1 ? "" : "s", all[r].gpus);
    if (r == rank) *device = local % all[r].gpus;
  }
  return APEX_OK;
}

/* This rank's GPU, streams, event and scratch buffer. */
static apex_status setup_device(nccl_pg *p, int device) {
  apex_status st = p->st->use_device(device);
  if (st != APEX_OK) return st;
  p->device = device;
  st = p->st->stream_create("creating the collectives' stream", &p->stream);
  if (st == APEX_OK) st = p->st->event_create("creating the collectives' ordering event", &p->ready);
  if (st == APEX_OK) st = p->dev->mem->alloc(sizeof(float), 1, (void **)&p->d_scratch);
  return on_rank(st, p->rank);
}

static apex_pg *fail_create(nccl_pg *p, apex_status st) {
  char msg[APEX_PG_MESSAGE];
  snprintf(msg, sizeof msg, "%s", apex_last_error());
  apex_pg tmp = {.backend = &nccl_backend, .impl = p};
  nccl_destroy(&tmp);
  return apex__fail_null(st, "%s", msg);
}

apex_pg *apex_pg_create_nccl(const apex_pg_options *options) {
  apex_pg *mpi = apex_pg_create_mpi(options);
  if (!mpi) {
    char msg[APEX_PG_MESSAGE];
    snprintf(msg, sizeof msg, "%s", apex_last_error());
    return apex__fail_null(APEX_ERR_IO, FN ": the MPI bootstrap failed: %s", msg);
  }
  nccl_pg *p = calloc(1, sizeof *p);
  if (!p) {
    apex_pg_destroy(mpi);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, FN ": out of memory");
  }
  p->mpi = mpi;
  int rank = apex_pg_rank(mpi), world = apex_pg_world_size(mpi);
  p->rank = rank;
  /* By name, without opening the device: that waits for this rank's choice below. */
  p->dev = apex__backend_by_name("cuda");
  if (!p->dev || !p->dev->streams)
    return fail_create(p, apex__fail(APEX_ERR_UNSUPPORTED, FN ": this build has no CUDA backend with streams, "
                                                           "which NCCL needs"));
  p->st = p->dev->streams;
  p->vt = nccl_backend;
  p->vt.device = p->dev->device;

  /* Round 1. The count alone: opening a device (any other slot) would open device 0 before the choice. */
  host_record mine = {0};
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "?");
  mine.host = apex__fnv1a(APEX_FNV_OFFSET, host, strlen(host));
  const char *why = "";
  mine.gpus = p->st->device_count(&why);
  host_record *hosts = malloc((size_t)world * sizeof *hosts);
  if (!hosts) return fail_create(p, apex__fail(APEX_ERR_OUT_OF_MEMORY, FN ": out of memory"));
  apex_status st = apex__pg_allgather_bytes(mpi, &mine, hosts, sizeof mine);
  int device = 0;
  if (st == APEX_OK) st = choose_device(hosts, world, rank, why, &device);
  free(hosts);
  if (st != APEX_OK) return fail_create(p, st);

  /* Round 2: every rank's setup status, and rank 0's id. */
  char my_msg[APEX_PG_MESSAGE] = "";
  setup_record me = {0};
  apex_status local = setup_device(p, device);
  if (local == APEX_OK && rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&me.id);
    if (r != ncclSuccess) local = nccl_err(NULL, r, "ncclGetUniqueId", rank);
  }
  if (local != APEX_OK) snprintf(my_msg, sizeof my_msg, "%s", apex_last_error());
  me.ok = local == APEX_OK;
  setup_record *all = malloc((size_t)world * sizeof *all);
  if (!all) return fail_create(p, apex__fail(APEX_ERR_OUT_OF_MEMORY, FN ": out of memory"));
  st = apex__pg_allgather_bytes(mpi, &me, all, sizeof me);
  for (int r = 0; st == APEX_OK && r < world; r++) {
    if (all[r].ok) continue;
    if (r == rank) st = apex__fail(local, FN ": %s", my_msg);
    else st = apex__fail(APEX_ERR_DEVICE, FN ": rank %d could not prepare its GPU (its own error says why)", r);
  }
  ncclUniqueId id = all[0].id;
  free(all);
  if (st != APEX_OK) return fail_create(p, st);

  ncclResult_t r = ncclCommInitRank(&p->comm, world, id, rank);
  if (r != ncclSuccess) {
    p->comm = NULL;
    return fail_create(p, nccl_err(NULL, r, "ncclCommInitRank", rank));
  }
  apex_pg *pg = apex__pg_new(&p->vt, rank, world, p);
  if (pg) pg->host = mpi;
  return pg;
}

#else /* built without NCCL */

int apex_pg_nccl_available(void) { return 0; }

apex_pg *apex_pg_create_nccl(const apex_pg_options *options) {
  (void)options;
  return apex__fail_null(APEX_ERR_UNSUPPORTED, "apex_pg_create_nccl: %s",
                         !apex__backend_by_name("cuda") ? "apex was built without CUDA (APEX_CUDA=OFF or nvcc not found); the NCCL group needs CUDA, NCCL "
                                           "and MPI: use apex_pg_create_mpi() for CPU tensors"
                         : !APEX_HAVE_MPI ? "apex was built without MPI (APEX_MPI=OFF or MPI not found); the NCCL group exchanges its id "
                                            "over MPI: install libopenmpi-dev and rebuild"
                                          : "apex was built without NCCL (APEX_NCCL=OFF, or nccl.h/libnccl not found under the CUDA "
                                            "toolkit); install NCCL and reconfigure");
}

#endif
