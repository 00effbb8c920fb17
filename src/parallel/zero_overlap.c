/* zero_overlap.c: the sharded optimizer's reduce-scatter overlapped with the backward (zero.h's
 * overlap option). DDP's Reducer runs it, in scatter mode (reducer_internal.h), over the gradients in
 * the flat vector's order (the last parameter first, the order backward finishes them): a bucket is
 * then one stretch of the flat vector of one dtype, whose parts belong to consecutive ranks and are,
 * on each owner, one stretch of its shard. So each bucket is one reduce-scatter of unequal parts
 * (apex_pg_reduce_scatter_v), started as soon as its gradients are final, and every rank keeps its
 * contiguous range. The backward marks the gradients through the graph's grad hook (apex_zero_attach)
 * or the caller does (apex_zero_mark_ready). */
#include <stdint.h>
#include <stdlib.h>

#include "apex/autograd.h"
#include "core/internal.h"
#include "parallel/pg_internal.h"
#include "parallel/reducer_internal.h"
#include "parallel/zero_internal.h"

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20) /* apex_ddp's default */

static int cmp_grad(const void *a, const void *b) {
  uintptr_t x = ((const zero_lookup *)a)->grad, y = ((const zero_lookup *)b)->grad;
  return x < y ? -1 : x > y;
}

void apex__zero_free_overlap(apex_zero *z) {
  apex_reducer_destroy(z->red);
  free(z->lookup);
  free(z->marked);
}

/* counts and this rank's target for every bucket, from the pieces; a plan that breaks the layout's
 * promise (owners in rank order, one stretch of this rank's shard per bucket) is an internal error. */
static apex_status plan_targets(apex_zero *z, size_t *counts, apex_tensor **outs) {
  int nb = apex_reducer_bucket_count(z->red), world = z->world;
  size_t *start = malloc((size_t)nb * sizeof *start);
  int *owner = malloc((size_t)nb * sizeof *owner), *first = malloc((size_t)z->n * sizeof *first);
  apex_status st = start && owner && first ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
  for (int b = 0; st == APEX_OK && b < nb; b++) start[b] = SIZE_MAX, owner[b] = 0;
  for (int i = 0; st == APEX_OK && i < z->n; i++) first[i] = -1;
  for (int k = z->npieces - 1; st == APEX_OK && k >= 0; k--) first[z->pieces[k].i] = k;
  for (int k = 0; st == APEX_OK && k < z->n; k++) {
    int i = z->n - 1 - k, b = apex_reducer_bucket_of(z->red, k);
    for (int q = first[i]; st == APEX_OK && q < z->npieces && z->pieces[q].i == i; q++) {
      const piece *p = &z->pieces[q];
      size_t *mine = &counts[(size_t)b * (size_t)world + (size_t)p->owner];
      if (p->owner < owner[b] || (p->owner == z->rank && start[b] != SIZE_MAX && p->pos != start[b] + *mine))
        st = apex__fail(APEX_ERR_STATE, "internal: bucket %d of the overlapped reduce-scatter does not follow the shards", b);
      if (p->owner == z->rank && start[b] == SIZE_MAX) start[b] = p->pos;
      owner[b] = p->owner;
      *mine += p->len;
    }
  }
  for (int b = 0; st == APEX_OK && b < nb; b++) {
    int64_t len = (int64_t)counts[(size_t)b * (size_t)world + (size_t)z->rank];
    int d = -1;
    for (int k = 0; d < 0 && k < z->n; k++)
      if (apex_reducer_bucket_of(z->red, k) == b) d = (int)apex_tensor_dtype(z->grads[z->n - 1 - k]);
    if (len && !(outs[b] = apex_tensor_slice_view(z->shard[d], start[b], 1, &len))) st = APEX_ERR_OUT_OF_MEMORY;
  }
  free(start);
  free(owner);
  free(first);
  return st;
}

apex_status apex__zero_make_overlap(apex_zero *z, size_t bucket_bytes) {
  if (!z->pg->backend->reduce_scatter_v)
    return apex__fail(APEX_ERR_UNSUPPORTED, "overlap needs a reduce-scatter of unequal parts, which the %s group lacks; leave overlap off",
                      z->pg->backend->name);
  apex_tensor **order = malloc((size_t)z->n * sizeof *order);
  z->lookup = malloc((size_t)z->n * sizeof *z->lookup);
  z->marked = calloc((size_t)z->n, 1);
  if (!order || !z->lookup || !z->marked) {
    free(order);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
  }
  for (int i = 0; i < z->n; i++) {
    order[z->n - 1 - i] = z->grads[i];
    z->lookup[i] = (zero_lookup){(uintptr_t)z->grads[i], i};
  }
  qsort(z->lookup, (size_t)z->n, sizeof *z->lookup, cmp_grad);
  /* Two buffers per dtype: one bucket fills while the one before it is still on the wire. */
  z->red = apex__reducer_create_scatter(z->pg, order, z->n, bucket_bytes ? bucket_bytes : DEFAULT_BUCKET_BYTES, 2);
  free(order);
  if (!z->red) return APEX_ERR_INVALID_ARG; /* its message stands */
  int nb = apex_reducer_bucket_count(z->red);
  size_t *counts = calloc((size_t)nb * (size_t)z->world, sizeof *counts);
  apex_tensor **outs = calloc((size_t)nb, sizeof *outs);
  apex_status st = counts && outs ? plan_targets(z, counts, outs) : apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
  if (st == APEX_OK) st = apex__reducer_set_scatter(z->red, counts, outs);
  for (int b = 0; outs && b < nb; b++) apex_tensor_destroy(outs[b]);
  free(outs);
  free(counts);
  return st;
}

apex_status apex__zero_overlap_reduce(apex_zero *z) {
  /* The gradients no backward marked (all of them, without a hook) start in bucket order. */
  apex_status st = apex_reducer_reduce(z->red);
  for (int i = 0; i < z->n; i++) z->marked[i] = 0;
  return st;
}

apex_status apex_zero_mark_ready(apex_zero *z, int i) {
  const char *fn = "apex_zero_mark_ready";
  if (!z) return apex__fail(APEX_ERR_INVALID_ARG, "%s: z is NULL", fn);
  if (!z->red) return apex__fail(APEX_ERR_STATE, "%s: this sharded optimizer was made without overlap (apex_zero_options)", fn);
  if (i < 0 || i >= z->n) return apex__fail(APEX_ERR_INVALID_ARG, "%s: parameter %d is not in [0, %d)", fn, i, z->n);
  if (z->marked[i])
    return apex__fail(APEX_ERR_STATE, "%s: gradient %d was already marked this step; call apex_zero_reduce_grads after each backward", fn, i);
  z->marked[i] = 1;
  apex_status st = apex_reducer_mark_ready(z->red, z->n - 1 - i);
  /* A started bucket's gradients are in its buffer: stage 2 needs them no more. */
  if (st == APEX_OK) apex__zero_release_started(z);
  return st;
}

static apex_status zero_hook(void *ctx, apex_var *leaf) {
  apex_zero *z = ctx;
  zero_lookup key = {(uintptr_t)apex_var_grad(leaf), 0};
  const zero_lookup *e = key.grad ? bsearch(&key, z->lookup, (size_t)z->n, sizeof key, cmp_grad) : NULL;
  return e ? apex_zero_mark_ready(z, e->i) : APEX_OK; /* a leaf whose gradient z does not hold */
}

apex_status apex_zero_attach(apex_zero *z, apex_graph *g) {
  if (!z || !g) return apex__fail(APEX_ERR_INVALID_ARG, "apex_zero_attach: %s is NULL", z ? "graph" : "z");
  if (!z->red) return apex__fail(APEX_ERR_STATE, "apex_zero_attach: this sharded optimizer was made without overlap (apex_zero_options)");
  return apex_graph_set_grad_hook(g, zero_hook, z);
}
