/* reducer.c: bucketed gradient all-reduce (Apex's Reducer; the engine DDP drives during backward).
 *
 * Gradients are copied into per-bucket flat buffers allocated once at creation, each bucket is
 * reduced with one non-blocking all-reduce as soon as all its gradients are ready, and finish
 * waits for them and copies the results back. Buckets start strictly in bucket order on every rank:
 * the order in which a rank happens to mark gradients ready can differ between ranks, but the
 * sequence of collectives must not. The buckets live on the group's device, so device gradients
 * (the NCCL group) are copied, scaled and reduced without leaving the GPU. The sharded optimizer
 * drives the same machinery in scatter mode (reducer_internal.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/multi_tensor.h"
#include "core/internal.h"
#include "parallel/pg_internal.h"
#include "parallel/reducer_internal.h"

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

typedef struct bucket {
  apex_tensor *flat;
  apex_dtype dtype;
  size_t numel;
  int pending; /* gradients not yet ready this step */
  apex_pg_work *work;
  int done;
  int prev; /* scatter mode: the bucket that used this bucket's buffer before it, or -1 */
} bucket;

struct apex_reducer {
  apex_pg *pg;
  int n;
  apex_tensor **grads;
  apex_tensor **views; /* gradient i's place in its bucket */
  int *bucket_of;
  size_t *offset;
  int *ready;
  bucket *buckets;
  int nbuckets;
  int next_post; /* buckets below have been started this step */
  float pre, post;
  /* scatter mode */
  int scatter;
  size_t *counts;       /* world per bucket */
  apex_tensor **outs;   /* per bucket, this rank's part (NULL: none) */
  apex_tensor *slot_buf[APEX_DTYPE_COUNT * 2]; /* reused bucket buffers (slots per dtype) */
  int nslot_bufs;
};

/* Copies src into dst (converting dtypes), times scale unless it is 1. No overflow flag is asked
 * for: on the GPU reading one back would wait for the device at every gradient. */
static apex_status copy_scaled(apex_tensor *dst, apex_tensor *src, float scale) {
  if (scale == 1.0f) return apex_tensor_copy(dst, src);
  return apex_mt_scale(0, NULL, &src, &dst, 1, scale);
}

void apex_reducer_destroy(apex_reducer *r) {
  if (!r) return;
  for (int b = 0; b < r->nbuckets; b++) {
    if (r->buckets[b].work) apex_pg_wait(r->buckets[b].work);
    apex_tensor_destroy(r->buckets[b].flat);
  }
  for (int i = 0; r->views && i < r->n; i++) apex_tensor_destroy(r->views[i]);
  for (int b = 0; r->outs && b < r->nbuckets; b++) apex_tensor_destroy(r->outs[b]);
  for (int k = 0; k < r->nslot_bufs; k++) apex_tensor_destroy(r->slot_buf[k]);
  free(r->counts);
  free(r->outs);
  free(r->grads);
  free(r->views);
  free(r->bucket_of);
  free(r->offset);
  free(r->ready);
  free(r->buckets);
  free(r);
}

static apex_reducer *fail_create(apex_reducer *r, apex_status st) {
  char msg[APEX_PG_MESSAGE];
  snprintf(msg, sizeof msg, "%s", apex_last_error());
  apex_reducer_destroy(r);
  return apex__fail_null(st, "%s", msg);
}

/* Assigns buckets in index order: one open bucket per reduction dtype. With trigger marks (cut[i]
 * nonzero) a bucket ends after each marked gradient and the byte cap plays no part. */
static void plan_buckets(apex_reducer *r, size_t cap, int always_fp32, const unsigned char *cut) {
  int open[APEX_DTYPE_COUNT] = {-1, -1, -1};
  size_t open_bytes[APEX_DTYPE_COUNT] = {0};
  if (cut) cap = SIZE_MAX;
  for (int i = 0; i < r->n; i++) {
    apex_dtype dt = always_fp32 ? APEX_F32 : apex_tensor_dtype(r->grads[i]);
    size_t numel = apex_tensor_numel(r->grads[i]), bytes = numel * apex_dtype_size(dt);
    if (open[dt] >= 0 && open_bytes[dt] + bytes > cap) open[dt] = -1;
    if (open[dt] < 0) {
      open[dt] = r->nbuckets++;
      open_bytes[dt] = 0;
      r->buckets[open[dt]].dtype = dt;
    }
    bucket *b = &r->buckets[open[dt]];
    r->bucket_of[i] = open[dt];
    r->offset[i] = b->numel;
    b->numel += numel;
    b->pending++;
    open_bytes[dt] += bytes;
    if (open_bytes[dt] >= cap || (cut && cut[i])) open[dt] = -1;
  }
}

/* Scatter mode: `slots` buffers per dtype, each as large as that dtype's largest bucket; bucket b
 * is a view of buffer (its rank among its dtype's buckets) mod slots. */
static apex_status make_slots(apex_reducer *r, int slots) {
  size_t most[APEX_DTYPE_COUNT] = {0};
  int seen[APEX_DTYPE_COUNT] = {0}, first[APEX_DTYPE_COUNT];
  for (int b = 0; b < r->nbuckets; b++)
    if (r->buckets[b].numel > most[r->buckets[b].dtype]) most[r->buckets[b].dtype] = r->buckets[b].numel;
  for (int d = 0; d < APEX_DTYPE_COUNT; d++) {
    first[d] = r->nslot_bufs;
    for (int k = 0; most[d] && k < slots; k++) {
      int64_t len = (int64_t)most[d];
      if (!(r->slot_buf[r->nslot_bufs++] = apex_tensor_create_on(r->pg->backend->device, (apex_dtype)d, 1, &len))) return APEX_ERR_OUT_OF_MEMORY;
    }
  }
  int *last = malloc((size_t)slots * APEX_DTYPE_COUNT * sizeof *last);
  if (!last) return APEX_ERR_OUT_OF_MEMORY;
  for (int k = 0; k < slots * APEX_DTYPE_COUNT; k++) last[k] = -1;
  for (int b = 0; b < r->nbuckets; b++) {
    bucket *bk = &r->buckets[b];
    int d = (int)bk->dtype, k = seen[d]++ % slots;
    int64_t len = (int64_t)bk->numel;
    bk->prev = last[d * slots + k];
    last[d * slots + k] = b;
    if (!(bk->flat = apex_tensor_slice_view(r->slot_buf[first[d] + k], 0, 1, &len))) {
      free(last);
      return APEX_ERR_OUT_OF_MEMORY;
    }
  }
  free(last);
  return APEX_OK;
}

static apex_reducer *create(apex_pg *pg, apex_tensor *const *grads, int n, const apex_reducer_options *options, int slots);

apex_reducer *apex_reducer_create(apex_pg *pg, apex_tensor *const *grads, int n, const apex_reducer_options *options) {
  return create(pg, grads, n, options, 0);
}

apex_reducer *apex__reducer_create_scatter(apex_pg *pg, apex_tensor *const *grads, int n, size_t bucket_bytes, int slots) {
  if (slots < 1 || slots > 2) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_reducer: %d buffers per dtype (1 or 2)", slots);
  apex_reducer *r = create(pg, grads, n, &(apex_reducer_options){.bucket_bytes = bucket_bytes, .sum_only = 1}, slots);
  if (r) r->scatter = 1;
  return r;
}

static apex_reducer *create(apex_pg *pg, apex_tensor *const *grads, int n, const apex_reducer_options *options, int slots) {
  const char *fn = "apex_reducer_create";
  apex_reducer_options o = options ? *options : (apex_reducer_options){0};
  if (!pg) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: pg is NULL", fn);
  if (!grads || n < 1) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: need at least one gradient (grads %s, n = %d)", fn, grads ? "given" : "NULL", n);
  for (int i = 0; i < n; i++) {
    if (!grads[i]) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: gradient %d is NULL", fn, i);
    if (apex_tensor_device(grads[i]) != pg->backend->device)
      return apex__fail_null(APEX_ERR_DEVICE, "%s: gradient %d is not on the device of the %s backend", fn, i, pg->backend->name);
    for (int j = 0; j < i; j++)
      if (grads[j] == grads[i]) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: gradient %d is listed twice (also at %d)", fn, i, j);
  }
  float f = o.gradient_predivide_factor == 0.0f ? 1.0f : o.gradient_predivide_factor;
  if (!(f > 0.0f) || !isfinite(f))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: gradient_predivide_factor must be positive and finite (got %g)", fn, (double)f);
  size_t cap = o.bucket_bytes ? o.bucket_bytes : DEFAULT_BUCKET_BYTES;
  if (o.num_triggers < 0 || (o.num_triggers > 0 && !o.triggers))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: %d triggers %s", fn, o.num_triggers, o.num_triggers < 0 ? "(must be >= 0)" : "but triggers is NULL");
  for (int t = 0; t < o.num_triggers; t++)
    if (o.triggers[t] < 0 || o.triggers[t] >= n)
      return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: trigger %d is gradient %d, outside [0, %d)", fn, t, o.triggers[t], n);

  apex_reducer *r = calloc(1, sizeof *r);
  if (!r) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  r->pg = pg;
  r->n = n;
  r->pre = 1.0f / f;
  r->post = o.sum_only ? 1.0f : f / (float)pg->world;
  r->grads = malloc((size_t)n * sizeof *r->grads);
  r->views = calloc((size_t)n, sizeof *r->views);
  r->bucket_of = malloc((size_t)n * sizeof *r->bucket_of);
  r->offset = malloc((size_t)n * sizeof *r->offset);
  r->ready = calloc((size_t)n, sizeof *r->ready);
  r->buckets = calloc((size_t)n, sizeof *r->buckets);
  if (!r->grads || !r->views || !r->bucket_of || !r->offset || !r->ready || !r->buckets)
    return fail_create(r, apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn));
  memcpy(r->grads, grads, (size_t)n * sizeof *grads);
  unsigned char *cut = NULL;
  if (o.num_triggers > 0) {
    if (!(cut = calloc((size_t)n, 1))) return fail_create(r, apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn));
    for (int t = 0; t < o.num_triggers; t++) cut[o.triggers[t]] = 1;
  }
  plan_buckets(r, cap, o.allreduce_always_fp32, cut);
  free(cut);

  /* The ranks must agree on every gradient and on the buckets, or the all-reduces would not match. */
  char **names = calloc((size_t)n, sizeof *names);
  apex_status st = names ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (int i = 0; st == APEX_OK && i < n; i++) {
    names[i] = malloc(64);
    if (!names[i]) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    else snprintf(names[i], 64, "gradient %d (bucket %d, reduced in %s)", i, r->bucket_of[i], apex_dtype_name(r->buckets[r->bucket_of[i]].dtype));
  }
  /* First the tensors (a message about a dtype or shape), then the bucket plans (different options). */
  if (st == APEX_OK) st = apex_pg_check_consistent(pg, NULL, grads, n);
  if (st == APEX_OK) st = apex_pg_check_consistent(pg, (const char *const *)names, grads, n);
  for (int i = 0; names && i < n; i++) free(names[i]);
  free(names);
  if (st != APEX_OK) return fail_create(r, st);

  if (slots > 0 && make_slots(r, slots) != APEX_OK) return fail_create(r, APEX_ERR_OUT_OF_MEMORY);
  for (int b = 0; slots == 0 && b < r->nbuckets; b++) {
    int64_t len = (int64_t)r->buckets[b].numel;
    /* On the backend's device: the NCCL group reduces device gradients in device buckets. */
    r->buckets[b].flat = apex_tensor_create_on(pg->backend->device, r->buckets[b].dtype, 1, &len);
    if (!r->buckets[b].flat) return fail_create(r, APEX_ERR_OUT_OF_MEMORY);
  }
  for (int i = 0; i < n; i++) {
    r->views[i] = apex_tensor_slice_view(r->buckets[r->bucket_of[i]].flat, r->offset[i], apex_tensor_ndim(grads[i]), apex_tensor_shape(grads[i]));
    if (!r->views[i]) return fail_create(r, APEX_ERR_OUT_OF_MEMORY);
  }
  return r;
}

/* Scatter mode: once the bucket that used the buffer before has finished, bucket k's gradients go in
 * and its reduce-scatter starts. */
static apex_status start_scatter(apex_reducer *r, int k) {
  bucket *b = &r->buckets[k];
  apex_status st = APEX_OK;
  if (b->prev >= 0 && r->buckets[b->prev].work) {
    st = apex_pg_wait(r->buckets[b->prev].work);
    r->buckets[b->prev].work = NULL;
  }
  for (int i = 0; st == APEX_OK && i < r->n; i++)
    if (r->bucket_of[i] == k) st = copy_scaled(r->views[i], r->grads[i], r->pre);
  if (st == APEX_OK && !r->counts) st = apex__fail(APEX_ERR_STATE, "apex_reducer: scatter mode without targets");
  if (st != APEX_OK) return st;
  return apex_pg_reduce_scatter_v_async(r->pg, b->flat, r->outs[k], r->counts + (size_t)k * (size_t)r->pg->world, APEX_REDUCE_SUM,
                                        &b->work);
}

/* Starts every bucket that is complete and whose predecessors have started; advances those in flight. */
static apex_status post_and_poll(apex_reducer *r) {
  while (r->next_post < r->nbuckets && r->buckets[r->next_post].pending == 0) {
    int k = r->next_post;
    bucket *b = &r->buckets[k];
    apex_status st = r->scatter ? start_scatter(r, k) : apex_pg_allreduce_async(r->pg, b->flat, APEX_REDUCE_SUM, &b->work);
    if (st != APEX_OK) return st;
    b->done = 0;
    r->next_post++;
  }
  for (int k = 0; k < r->next_post; k++) {
    bucket *b = &r->buckets[k];
    if (b->work && !b->done) {
      apex_status st = apex_pg_test(b->work, &b->done);
      if (st != APEX_OK) return st;
    }
  }
  return APEX_OK;
}

static apex_status copy_in(apex_reducer *r, int i) {
  /* Scatter mode copies a bucket in when it starts (its buffer may still be in use). */
  apex_status st = r->scatter ? APEX_OK : copy_scaled(r->views[i], r->grads[i], r->pre);
  if (st != APEX_OK) return st;
  r->ready[i] = 1;
  r->buckets[r->bucket_of[i]].pending--;
  return APEX_OK;
}

apex_status apex_reducer_mark_ready(apex_reducer *r, int i) {
  if (!r) return apex__fail(APEX_ERR_INVALID_ARG, "apex_reducer_mark_ready: reducer is NULL");
  if (i < 0 || i >= r->n) return apex__fail(APEX_ERR_INVALID_ARG, "apex_reducer_mark_ready: gradient %d is not in [0, %d)", i, r->n);
  if (r->ready[i])
    return apex__fail(APEX_ERR_STATE, "apex_reducer_mark_ready: gradient %d was already marked ready this step (call apex_reducer_finish to end the step)", i);
  apex_status st = copy_in(r, i);
  return st != APEX_OK ? st : post_and_poll(r);
}

apex_status apex_reducer_finish(apex_reducer *r) {
  if (!r) return apex__fail(APEX_ERR_INVALID_ARG, "apex_reducer_finish: reducer is NULL");
  int missing = -1;
  apex_status st = APEX_OK;
  for (int i = 0; i < r->n && st == APEX_OK; i++) {
    if (r->ready[i]) continue;
    if (missing < 0) missing = i;
    st = copy_in(r, i);
  }
  if (st == APEX_OK) st = post_and_poll(r);
  /* Wait for everything started, even after a failure, so no work outlives the step. */
  char msg[APEX_PG_MESSAGE] = "";
  for (int k = 0; k < r->nbuckets; k++) {
    bucket *b = &r->buckets[k];
    if (!b->work) continue;
    apex_status wst = apex_pg_wait(b->work);
    b->work = NULL;
    if (wst != APEX_OK && st == APEX_OK) {
      st = wst;
      snprintf(msg, sizeof msg, "%s", apex_last_error());
    }
  }
  for (int i = 0; i < r->n && st == APEX_OK && !r->scatter; i++) st = copy_scaled(r->grads[i], r->views[i], r->post);
  if (msg[0]) apex__fail(st, "%s", msg);
  /* A new step. */
  memset(r->ready, 0, (size_t)r->n * sizeof *r->ready);
  for (int k = 0; k < r->nbuckets; k++) r->buckets[k].pending = 0;
  for (int i = 0; i < r->n; i++) r->buckets[r->bucket_of[i]].pending++;
  r->next_post = 0;
  if (st == APEX_OK && missing >= 0)
    return apex__fail(APEX_ERR_STATE,
                      "apex_reducer_finish: gradient %d was not marked ready this step; it was reduced with its current value "
                      "(mark unused gradients ready, with zeros, to silence this)",
                      missing);
  return st;
}

apex_status apex_reducer_reduce(apex_reducer *r) {
  if (!r) return apex__fail(APEX_ERR_INVALID_ARG, "apex_reducer_reduce: reducer is NULL");
  for (int i = 0; i < r->n; i++) {
    if (r->ready[i]) continue;
    apex_status st = copy_in(r, i);
    if (st != APEX_OK) return st;
  }
  apex_status st = post_and_poll(r);
  apex_status fst = apex_reducer_finish(r);
  return st != APEX_OK ? st : fst;
}

int apex_reducer_bucket_count(const apex_reducer *r) {
  if (!r) apex__fail_null_arg(__func__, "reducer");
  return r ? r->nbuckets : -1;
}

int apex_reducer_bucket_of(const apex_reducer *r, int i) { return r && i >= 0 && i < r->n ? r->bucket_of[i] : -1; }

int apex_reducer_buckets_started(const apex_reducer *r) {
  if (!r) apex__fail_null_arg(__func__, "reducer");
  return r ? r->next_post : -1;
}

/* ---- scatter mode (reducer_internal.h) ----------------------------------------------------------- */

apex_status apex__reducer_set_scatter(apex_reducer *r, const size_t *counts, apex_tensor *const *outs) {
  if (!r || !r->scatter || !counts || !outs) return apex__fail(APEX_ERR_INVALID_ARG, "apex_reducer: not in scatter mode, or no targets");
  int world = r->pg->world;
  for (int b = 0; b < r->nbuckets; b++) {
    size_t sum = 0, mine = counts[(size_t)b * (size_t)world + (size_t)r->pg->rank];
    for (int q = 0; q < world; q++) sum += counts[(size_t)b * (size_t)world + (size_t)q];
    if (sum != r->buckets[b].numel || (outs[b] ? apex_tensor_numel(outs[b]) : 0) != mine)
      return apex__fail(APEX_ERR_SHAPE, "apex_reducer: the targets of bucket %d do not fit it", b);
  }
  size_t nc = (size_t)r->nbuckets * (size_t)world;
  r->counts = malloc(nc * sizeof *r->counts);
  r->outs = calloc((size_t)r->nbuckets, sizeof *r->outs);
  if (!r->counts || !r->outs) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_reducer: out of memory");
  memcpy(r->counts, counts, nc * sizeof *counts);
  for (int b = 0; b < r->nbuckets; b++) {
    if (!outs[b]) continue;
    r->outs[b] = apex_tensor_slice_view(outs[b], 0, apex_tensor_ndim(outs[b]), apex_tensor_shape(outs[b]));
    if (!r->outs[b]) return APEX_ERR_OUT_OF_MEMORY;
  }
  return APEX_OK;
}

apex_tensor *apex__reducer_slot(const apex_reducer *r, apex_dtype d) {
  for (int k = 0; k < r->nslot_bufs; k++)
    if (apex_tensor_dtype(r->slot_buf[k]) == d) return r->slot_buf[k];
  return NULL;
}

size_t apex__reducer_bucket_numel(const apex_reducer *r, int b) { return r->buckets[b].numel; }
size_t apex__reducer_offset(const apex_reducer *r, int i) { return r->offset[i]; }

size_t apex_reducer_buffer_bytes(const apex_reducer *r) {
  if (!r) return apex__fail(APEX_ERR_INVALID_ARG, "apex_reducer_buffer_bytes: reducer is NULL"), 0;
  size_t bytes = 0;
  for (int k = 0; k < r->nslot_bufs; k++) bytes += apex_tensor_numel(r->slot_buf[k]) * apex_dtype_size(apex_tensor_dtype(r->slot_buf[k]));
  for (int b = 0; !r->nslot_bufs && b < r->nbuckets; b++) bytes += r->buckets[b].numel * apex_dtype_size(r->buckets[b].dtype);
  return bytes;
}
