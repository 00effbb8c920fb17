/* zero_comm.c: the sharded optimizer's collectives (zero.h) in buckets: the reduce-scatter of the
 * caller's gradients into this rank's shard, and the all-gathers that bring every rank's shard back
 * into the caller's gradients (the reduced ones) or parameters (the updated ones).
 *
 * Rank r's shard of a dtype is a segment of S elements (zero.c's layout). The collectives move the
 * segments in chunks of L elements: chunk c is elements [cL, cL + L) of every rank's segment, packed
 * rank after rank into one staging buffer of world x L elements, which is what a reduce-scatter and
 * an all-gather of equal segments take (NCCL's included). So besides its shard a rank keeps one
 * bucket (bucket_bytes of apex_zero_options) for the collectives, not a copy of the whole model, and
 * every rank still owns one contiguous range. Each element is summed in rank order by whichever chunk
 * carries it, so the bits are those of one reduce-scatter of the whole model, and DDP's. A span is the
 * part of a piece (a parameter's elements owned by one rank) that one chunk carries. */
#include <stdint.h>
#include <stdlib.h>

#include "apex/parallel.h"
#include "core/internal.h"
#include "parallel/reducer_internal.h"
#include "parallel/zero_internal.h"

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20) /* apex_ddp's default */

void apex__zero_free_chunks(apex_zero *z) {
  for (int s = 0; z->spans && s < z->nspans; s++) {
    apex_tensor_destroy(z->spans[s].grad);
    apex_tensor_destroy(z->spans[s].param);
    apex_tensor_destroy(z->spans[s].slot);
  }
  for (int c = 0; z->chunks && c < z->nchunks; c++) {
    apex_tensor_destroy(z->chunks[c].in);
    apex_tensor_destroy(z->chunks[c].out);
  }
  for (int d = 0; d < APEX_DTYPE_COUNT; d++) apex_tensor_destroy(z->staging[d]);
  free(z->spans);
  free(z->chunks);
}

static apex_status add_span(apex_zero *z, int *cap, const piece *p, size_t at, size_t len, apex_tensor *slot) {
  if (z->nspans == *cap) {
    int ncap = *cap ? 2 * *cap : 64;
    span *s = realloc(z->spans, (size_t)ncap * sizeof *s);
    if (!s) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
    z->spans = s, *cap = ncap;
  }
  int64_t n = (int64_t)len;
  span *s = &z->spans[z->nspans++];
  *s = (span){.owner = p->owner, .slot = slot};
  s->grad = apex_tensor_slice_view(z->grads[p->i], p->off + at, 1, &n);
  s->param = apex_tensor_slice_view(z->params[p->i], p->off + at, 1, &n);
  return s->slot && s->grad && s->param ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
}

apex_status apex__zero_plan_chunks(apex_zero *z, size_t bucket_bytes) {
  apex_device dev = apex_pg_device(z->pg);
  if (!bucket_bytes) bucket_bytes = DEFAULT_BUCKET_BYTES;
  int ccap = 0, scap = 0;
  for (int d = 0; d < APEX_DTYPE_COUNT; d++) {
    size_t seg = z->seg[d], esz = apex_dtype_size((apex_dtype)d);
    if (!seg) continue;
    /* One rank's part of a bucket, at least one element, at most the whole segment. */
    size_t L = bucket_bytes / ((size_t)z->world * esz);
    /* With overlap the Reducer's first buffer of the dtype (at least one bucket, idle once a reduce has
     * finished, which every all-gather follows) is the staging: one bucket less to hold. */
    apex_tensor *slot = z->red ? apex__reducer_slot(z->red, (apex_dtype)d) : NULL;
    z->staging_borrowed[d] = slot && apex_tensor_numel(slot) >= (size_t)z->world;
    if (z->staging_borrowed[d]) L = apex_tensor_numel(slot) / (size_t)z->world;
    if (L < 1) L = 1;
    if (L > seg) L = seg;
    z->chunk_elems[d] = L;
    int64_t all = (int64_t)(L * (size_t)z->world);
    z->staging[d] = z->staging_borrowed[d] ? apex_tensor_slice_view(slot, 0, 1, &all) : apex_tensor_create_on(dev, (apex_dtype)d, 1, &all);
    if (!z->staging[d]) return APEX_ERR_OUT_OF_MEMORY;
    for (size_t c0 = 0; c0 < seg; c0 += L) {
      size_t lc = seg - c0 < L ? seg - c0 : L, carried = 0;
      if (z->nchunks == ccap) {
        ccap = ccap ? 2 * ccap : 16;
        chunk *c = realloc(z->chunks, (size_t)ccap * sizeof *c);
        if (!c) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "out of memory");
        z->chunks = c;
      }
      chunk *c = &z->chunks[z->nchunks++];
      int64_t in_len = (int64_t)(lc * (size_t)z->world), out_len = (int64_t)lc;
      *c = (chunk){.first = z->nspans};
      c->in = apex_tensor_slice_view(z->staging[d], 0, 1, &in_len);
      c->out = apex_tensor_slice_view(z->shard[d], c0, 1, &out_len);
      if (!c->in || !c->out) return APEX_ERR_OUT_OF_MEMORY;
      for (int k = 0; k < z->npieces; k++) {
        const piece *p = &z->pieces[k];
        if ((int)apex_tensor_dtype(z->params[p->i]) != d) continue;
        size_t lo = p->pos > c0 ? p->pos : c0, hi = p->pos + p->len < c0 + lc ? p->pos + p->len : c0 + lc;
        if (lo >= hi) continue;
        int64_t n = (int64_t)(hi - lo);
        apex_tensor *slot = apex_tensor_slice_view(z->staging[d], (size_t)p->owner * lc + (lo - c0), 1, &n);
        apex_status st = add_span(z, &scap, p, lo - p->pos, hi - lo, slot);
        if (st != APEX_OK) return st;
        carried += hi - lo;
      }
      c->count = z->nspans - c->first;
      /* A rank whose share ends inside the chunk leaves padding, which is summed and gathered with
       * the rest: it is zeroed before packing, since an earlier chunk of another length left data there. */
      c->pad = carried != lc * (size_t)z->world;
    }
  }
  return APEX_OK;
}

apex_status apex__zero_reduce_scatter(apex_zero *z) {
  apex_status st = APEX_OK;
  for (int c = 0; st == APEX_OK && c < z->nchunks; c++) {
    const chunk *ch = &z->chunks[c];
    if (ch->pad) st = apex_tensor_fill(ch->in, 0.0f);
    for (int s = ch->first; st == APEX_OK && s < ch->first + ch->count; s++) st = apex_tensor_copy(z->spans[s].slot, z->spans[s].grad);
    if (st == APEX_OK) st = apex_pg_reduce_scatter(z->pg, ch->in, ch->out, APEX_REDUCE_SUM);
  }
  return st;
}

apex_status apex__zero_allgather(apex_zero *z, int params) {
  apex_status st = APEX_OK;
  for (int c = 0; st == APEX_OK && c < z->nchunks; c++) {
    const chunk *ch = &z->chunks[c];
    st = apex_pg_allgather(z->pg, ch->out, ch->in);
    for (int s = ch->first; st == APEX_OK && s < ch->first + ch->count; s++) {
      const span *sp = &z->spans[s];
      if (params && sp->owner == z->rank) continue; /* this rank's own parameters are the ones it stepped */
      st = apex_tensor_copy(params ? sp->param : sp->grad, sp->slot);
    }
  }
  return st;
}
