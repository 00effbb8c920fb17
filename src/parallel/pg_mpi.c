/* pg_mpi.c: the MPI backend (Open MPI on Debian; any MPI-3 library).
 *
 * Sums do not use MPI's reductions, whose operand order is the MPI library's choice and which know
 * no half-precision types. An all-reduce is two rounds of point-to-point messages with our
 * arithmetic between them: rank r receives segment r of every rank's buffer (a reduce-scatter's
 * traffic, (n-1)/n of the buffer each way), adds the n pieces in rank order in f32 and writes its
 * reduced segment in place, then sends it to every rank (an all-gather). That is the bus traffic of
 * a ring all-reduce, and the result is bitwise the same on all ranks and across runs. Point-to-point
 * rather than MPI_Ialltoallv + MPI_Iallgatherv: the second round starts whenever a rank notices the
 * first has finished, so rounds of different all-reduces in flight would be posted in different
 * orders on different ranks, and collectives match by order. Messages match by tag instead: every
 * all-reduce takes the next sequence number of the group, the same on every rank because all ranks
 * start their all-reduces in the same order. The communicator returns errors (MPI_ERRORS_RETURN),
 * which become APEX_ERR_IO with MPI's error string. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/pg_internal.h"

#if APEX_HAVE_MPI
#include <mpi.h>

int apex_pg_mpi_available(void) { return 1; }

/* Staging buffers are reused between collectives: a fresh 256 MB malloc per all-reduce costs page
 * faults on every call. */
#define POOL_SLOTS 8

typedef struct mpi_pg {
  MPI_Comm comm;
  int tag_limit; /* tags used are below this */
  unsigned seq;  /* all-reduces started */
  struct {
    void *p;
    size_t bytes;
  } pool[POOL_SLOTS];
} mpi_pg;

enum { PHASE_ONE = 0, PHASE_SCATTER, PHASE_GATHER };

typedef struct mpi_work {
  MPI_Request req; /* single-request collectives */
  int phase;
  /* all-reduce and reduce-scatter */
  void *buf;          /* all-reduce: the buffer; reduce-scatter: the input (read only) */
  void *out;          /* where this rank's reduced segment goes: inside buf, or a reduce-scatter's out */
  int scatter_only;   /* a reduce-scatter: done after round 1 */
  size_t n;
  apex_dtype dtype;
  apex_reduce_op op;
  int tag;
  void *staging;
  size_t staging_bytes;
  int failed;         /* MPI may still write the buffers: never reuse them */
  size_t *start;      /* world + 1 segment boundaries */
  MPI_Request *reqs;  /* 2 * (world - 1) */
  int nreqs;
} mpi_work;

static int finalize_registered;

static void finalize_at_exit(void) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

static apex_status mpi_fail(int rc, const char *what, int rank) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) strcpy(msg, "(no message)");
  return apex__fail(APEX_ERR_IO, "%s failed on rank %d: %s", what, rank, msg);
}

static MPI_Datatype mpi_type(apex_dtype dtype) { return dtype == APEX_F32 ? MPI_FLOAT : MPI_UINT16_T; }

static void *pool_get(mpi_pg *m, size_t bytes, size_t *got) {
  int best = -1;
  for (int i = 0; i < POOL_SLOTS; i++)
    if (m->pool[i].p && m->pool[i].bytes >= bytes && (best < 0 || m->pool[i].bytes < m->pool[best].bytes)) best = i;
  if (best >= 0) {
    void *p = m->pool[best].p;
    *got = m->pool[best].bytes;
    m->pool[best].p = NULL;
    return p;
  }
  *got = bytes;
  return malloc(bytes ? bytes : 1);
}

static void pool_put(mpi_pg *m, void *p, size_t bytes) {
  if (!p) return;
  int slot = -1;
  for (int i = 0; i < POOL_SLOTS; i++)
    if (!m->pool[i].p) {
      slot = i;
      break;
    }
  if (slot < 0) { /* full: keep the larger buffers */
    slot = 0;
    for (int i = 1; i < POOL_SLOTS; i++)
      if (m->pool[i].bytes < m->pool[slot].bytes) slot = i;
    if (m->pool[slot].bytes >= bytes) {
      free(p);
      return;
    }
    free(m->pool[slot].p);
  }
  m->pool[slot].p = p;
  m->pool[slot].bytes = bytes;
}

static mpi_work *work_new(apex_pg_work *w) {
  mpi_work *m = calloc(1, sizeof *m);
  if (!m) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_pg_%s: out of memory", w->what);
  m->req = MPI_REQUEST_NULL;
  w->impl = m;
  return m;
}

static size_t seg_start(size_t n, int p, int world) { return (size_t)((uint64_t)p * n / (uint64_t)world); }

/* Rank r's reduction of its segment: staging holds world pieces of len elements, in rank order. */
static void reduce_segment(mpi_work *m, int rank, int world) {
  size_t start = m->start[rank], len = m->start[rank + 1] - start;
  size_t esz = apex_dtype_size(m->dtype);
  const char *own = (const char *)m->buf + start * esz;
  char *out = m->out;
  const char *st = m->staging;
  enum { TILE = 2048 };
  float acc[TILE], x[TILE];
  /* This rank's own piece is read in place (its slot in staging is unused); each tile of the output
   * (which is the own piece itself in an all-reduce) is written only after every piece of it has been read. */
#define PIECE(p) ((p) == rank ? own + t0 * esz : st + ((size_t)(p) * len + t0) * esz)
  for (size_t t0 = 0; t0 < len; t0 += TILE) {
    size_t tn = len - t0 < TILE ? len - t0 : TILE;
    apex__convert_range(acc, APEX_F32, PIECE(0), m->dtype, tn);
    for (int p = 1; p < world; p++) {
      apex__convert_range(x, APEX_F32, PIECE(p), m->dtype, tn);
      if (m->op == APEX_REDUCE_MAX) {
        for (size_t j = 0; j < tn; j++)
          if (isnan(x[j]) || x[j] > acc[j]) acc[j] = x[j];
      } else {
        for (size_t j = 0; j < tn; j++) acc[j] += x[j];
      }
    }
    if (m->op == APEX_REDUCE_AVG)
      for (size_t j = 0; j < tn; j++) acc[j] /= (float)world;
    apex__convert_range(out + t0 * esz, m->dtype, acc, APEX_F32, tn);
  }
#undef PIECE
}

/* Round 1: segment p of my buffer to rank p, segment `me` of everyone's into staging slot p. */
static apex_status post_scatter(apex_pg *pg, mpi_work *m) {
  mpi_pg *mp = pg->impl;
  int me = pg->rank, world = pg->world;
  size_t esz = apex_dtype_size(m->dtype), mylen = m->start[me + 1] - m->start[me];
  MPI_Datatype type = mpi_type(m->dtype);
  m->nreqs = 0;
  for (int p = 0; p < world; p++) {
    if (p == me) continue;
    int rc = MPI_Irecv((char *)m->staging + (size_t)p * mylen * esz, (int)mylen, type, p, m->tag, mp->comm, &m->reqs[m->nreqs++]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend((char *)m->buf + m->start[p] * esz, (int)(m->start[p + 1] - m->start[p]), type, p, m->tag, mp->comm,
                     &m->reqs[m->nreqs++]);
    if (rc != MPI_SUCCESS) return m->failed = 1, mpi_fail(rc, m->scatter_only ? "the reduce-scatter" : "the all-reduce (reduce-scatter)", me);
  }
  m->phase = PHASE_SCATTER;
  return APEX_OK;
}

/* Round 2: my reduced segment to everyone, their segments into place. */
static apex_status post_gather(apex_pg *pg, mpi_work *m) {
  mpi_pg *mp = pg->impl;
  int me = pg->rank, world = pg->world;
  size_t esz = apex_dtype_size(m->dtype);
  MPI_Datatype type = mpi_type(m->dtype);
  m->nreqs = 0;
  for (int p = 0; p < world; p++) {
    if (p == me) continue;
    int rc = MPI_Irecv((char *)m->buf + m->start[p] * esz, (int)(m->start[p + 1] - m->start[p]), type, p, m->tag + 1, mp->comm,
                       &m->reqs[m->nreqs++]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend((char *)m->buf + m->start[me] * esz, (int)(m->start[me + 1] - m->start[me]), type, p, m->tag + 1, mp->comm,
                     &m->reqs[m->nreqs++]);
    if (rc != MPI_SUCCESS) return m->failed = 1, mpi_fail(rc, "the all-reduce (all-gather)", me);
  }
  m->phase = PHASE_GATHER;
  return APEX_OK;
}

/* Takes the next tag pair, plans the segments (counts[p] elements each, or equal ones when counts is
 * NULL) and posts round 1; the reduced segment goes to out. */
static apex_status start_reduce(apex_pg *pg, mpi_work *m, const char *fn, void *out, const size_t *counts) {
  mpi_pg *mp = pg->impl;
  int world = pg->world, me = pg->rank;
  m->out = out;
  m->tag = (int)(2 * (mp->seq++ % (unsigned)(mp->tag_limit / 2)));
  m->start = malloc(((size_t)world + 1) * sizeof *m->start);
  m->reqs = malloc(2 * (size_t)world * sizeof *m->reqs);
  if (!m->start || !m->reqs) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (int p = 0; p <= world; p++) m->start[p] = counts ? (p ? m->start[p - 1] + counts[p - 1] : 0) : seg_start(m->n, p, world);
  size_t need = (size_t)world * (m->start[me + 1] - m->start[me]) * apex_dtype_size(m->dtype);
  m->staging = pool_get(mp, need, &m->staging_bytes);
  if (!m->staging) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu staging bytes", fn, need);
  return post_scatter(pg, m);
}

static apex_status mpi_allreduce(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, apex_reduce_op op) {
  if (pg->world == 1 || n == 0) { /* sum, mean and max of one value */
    w->done = 1;
    return APEX_OK;
  }
  mpi_work *m = work_new(w);
  if (!m) return APEX_ERR_OUT_OF_MEMORY;
  int world = pg->world, me = pg->rank;
  m->buf = buf, m->n = n, m->dtype = dtype, m->op = op;
  return start_reduce(pg, m, "apex_pg_allreduce", (char *)buf + seg_start(n, me, world) * apex_dtype_size(dtype), NULL);
}

/* Round 1 of an all-reduce alone: segment p of the input (n / world elements each) is reduced on
 * rank p, in the same rank order and f32 arithmetic as the all-reduce, so that an element's sum has
 * the same bits whichever of the two collectives computed it. */
static apex_status mpi_reduce_scatter(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype,
                                      apex_reduce_op op) {
  if (n == 0) {
    w->done = 1;
    return APEX_OK;
  }
  if (pg->world == 1) { /* the reduction of one rank's value */
    memcpy(out, in, n * apex_dtype_size(dtype));
    w->done = 1;
    return APEX_OK;
  }
  mpi_work *m = work_new(w);
  if (!m) return APEX_ERR_OUT_OF_MEMORY;
  m->buf = (void *)in, m->n = n * (size_t)pg->world, m->dtype = dtype, m->op = op;
  m->scatter_only = 1;
  return start_reduce(pg, m, "apex_pg_reduce_scatter", out, NULL);
}

/* The same with segment p counts[p] elements long: a bucket of gradients that straddles the ranks'
 * contiguous shards (zero.h), each element still reduced as the all-reduce reduces it. */
static apex_status mpi_reduce_scatter_v(apex_pg *pg, apex_pg_work *w, const void *in, void *out, const size_t *counts,
                                        apex_dtype dtype, apex_reduce_op op) {
  size_t n = 0;
  for (int p = 0; p < pg->world; p++) n += counts[p];
  if (n == 0 || pg->world == 1) {
    if (n) memcpy(out, in, n * apex_dtype_size(dtype));
    w->done = 1;
    return APEX_OK;
  }
  mpi_work *m = work_new(w);
  if (!m) return APEX_ERR_OUT_OF_MEMORY;
  m->buf = (void *)in, m->n = n, m->dtype = dtype, m->op = op;
  m->scatter_only = 1;
  return start_reduce(pg, m, "apex_pg_reduce_scatter_v", out, counts);
}

static apex_status mpi_broadcast(apex_pg *pg, apex_pg_work *w, void *buf, size_t n, apex_dtype dtype, int root) {
  mpi_pg *mp = pg->impl;
  mpi_work *m = work_new(w);
  if (!m) return APEX_ERR_OUT_OF_MEMORY;
  int rc = MPI_Ibcast(buf, (int)n, mpi_type(dtype), root, mp->comm, &m->req);
  return rc == MPI_SUCCESS ? APEX_OK : mpi_fail(rc, "MPI_Ibcast", pg->rank);
}

static apex_status mpi_allgather(apex_pg *pg, apex_pg_work *w, const void *in, void *out, size_t n, apex_dtype dtype) {
  mpi_pg *mp = pg->impl;
  mpi_work *m = work_new(w);
  if (!m) return APEX_ERR_OUT_OF_MEMORY;
  MPI_Datatype type = mpi_type(dtype);
  int rc = MPI_Iallgather(in, (int)n, type, out, (int)n, type, mp->comm, &m->req);
  return rc == MPI_SUCCESS ? APEX_OK : mpi_fail(rc, "MPI_Iallgather", pg->rank);
}

static apex_status mpi_barrier(apex_pg *pg, apex_pg_work *w) {
  mpi_pg *mp = pg->impl;
  mpi_work *m = work_new(w);
  if (!m) return APEX_ERR_OUT_OF_MEMORY;
  int rc = MPI_Ibarrier(mp->comm, &m->req);
  return rc == MPI_SUCCESS ? APEX_OK : mpi_fail(rc, "MPI_Ibarrier", pg->rank);
}

static void release_staging(apex_pg_work *w) {
  mpi_work *m = w->impl;
  if (m && m->staging && !m->failed) {
    pool_put(w->pg->impl, m->staging, m->staging_bytes);
    m->staging = NULL;
  }
}

static apex_status mpi_progress(apex_pg_work *w, int block) {
  mpi_work *m = w->impl;
  apex_pg *pg = w->pg;
  int flag = 1, rc;
  if (m->phase == PHASE_ONE) {
    rc = block ? MPI_Wait(&m->req, MPI_STATUS_IGNORE) : MPI_Test(&m->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, w->what, pg->rank);
    w->done = flag;
    return APEX_OK;
  }
  for (;;) {
    rc = block ? MPI_Waitall(m->nreqs, m->reqs, MPI_STATUSES_IGNORE) : MPI_Testall(m->nreqs, m->reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return m->failed = 1, mpi_fail(rc, "the all-reduce", pg->rank);
    if (!flag) return APEX_OK;
    if (m->phase == PHASE_GATHER) break;
    reduce_segment(m, pg->rank, pg->world);
    if (m->scatter_only) break;
    apex_status st = post_gather(pg, m);
    if (st != APEX_OK) return st;
  }
  release_staging(w);
  w->done = 1;
  return APEX_OK;
}

static void mpi_work_free(apex_pg_work *w) {
  mpi_work *m = w->impl;
  if (!m) return;
  release_staging(w);
  /* After a failure requests may still be live: hand them to MPI, and leak the staging buffer they
   * may still write (release_staging kept it) rather than reuse it. */
  for (int i = 0; m->failed && i < m->nreqs; i++)
    if (m->reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&m->reqs[i]);
  free(m->reqs);
  free(m->start);
  free(m);
  w->impl = NULL;
}

static void mpi_destroy(apex_pg *pg) {
  mpi_pg *m = pg->impl;
  if (!m) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  for (int i = 0; i < POOL_SLOTS; i++) free(m->pool[i].p);
  free(m);
}

static const apex_pg_vtable mpi_backend = {
    .name = "mpi",
    .device = APEX_DEVICE_CPU,
    .max_count = INT_MAX,
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .reduce_scatter_v = mpi_reduce_scatter_v,
    .barrier = mpi_barrier,
    .progress = mpi_progress,
    .work_free = mpi_work_free,
    .destroy = mpi_destroy,
};

apex_pg *apex_pg_create_mpi(const apex_pg_options *options) {
  int inited = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    return apex__fail_null(APEX_ERR_STATE, "apex_pg_create_mpi: MPI was already finalized; create process groups before MPI_Finalize");
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", -1), NULL;
    /* Open MPI reports failed non-blocking collectives through MPI_COMM_WORLD's handler, whatever
     * communicator they ran on; apex owns MPI here, so make those failures statuses too. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (!finalize_registered) {
      finalize_registered = 1;
      atexit(finalize_at_exit);
    }
  }
  MPI_Comm parent = options && options->mpi_comm ? *(const MPI_Comm *)options->mpi_comm : MPI_COMM_WORLD;
  mpi_pg *m = calloc(1, sizeof *m);
  if (!m) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_pg_create_mpi: out of memory");
  int rc = MPI_Comm_dup(parent, &m->comm);
  if (rc != MPI_SUCCESS) {
    free(m);
    return mpi_fail(rc, "MPI_Comm_dup", -1), NULL;
  }
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  MPI_Comm_rank(m->comm, &rank);
  MPI_Comm_size(m->comm, &world);
  int *tag_ub = NULL, has = 0;
  MPI_Comm_get_attr(m->comm, MPI_TAG_UB, &tag_ub, &has);
  m->tag_limit = has && tag_ub && *tag_ub > 2 ? *tag_ub : 32767;
  return apex__pg_new(&mpi_backend, rank, world, m);
}

#else /* built without MPI */

int apex_pg_mpi_available(void) { return 0; }

apex_pg *apex_pg_create_mpi(const apex_pg_options *options) {
  (void)options;
  return apex__fail_null(APEX_ERR_UNSUPPORTED,
                         "apex_pg_create_mpi: apex was built without MPI (APEX_MPI=OFF or MPI not found); install libopenmpi-dev "
                         "and rebuild, or use apex_pg_create_local() for one process");
}

#endif
