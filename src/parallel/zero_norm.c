/* zero_norm.c: the global gradient norm (clipping) from every rank's shard, without gathering the
 * gradients (zero.h): stage 2 then never holds the model's gradients for a norm.
 *
 * An unsharded norm (apex_optimizer_clip_grad_norm over the whole reduced gradients) sums each
 * multi-tensor tile's squares in f32, adds a chunk's tiles in f64 in order, a tensor's chunks, then the
 * tensors in parameter order. A shard's pieces are cut at tiles of their parameter (zero.c's plan), so
 * a rank's norm pass over its own pieces in chunks of one tile (apex_mt_l2norm_args.per_chunk) gives
 * exactly the f32 sums of the tiles it owns. Every rank gathers all of them (a few bytes per 2048
 * gradients) and adds them up in the unsharded order: the same bits on every rank, and as DDP's. */
#include <math.h>
#include <stdlib.h>

#include "apex/mt_apply.h"
#include "backend/backend.h"
#include "core/internal.h"
#include "optim/optim_shard.h"
#include "parallel/pg_internal.h"
#include "parallel/zero_internal.h"

static size_t tiles_of(size_t len) { return (len + APEX_MT_TILE - 1) / APEX_MT_TILE; }

/* This rank's tile sums of its own pieces, in piece order, into mine (zeros past them). */
static apex_status own_tile_sums(apex_zero *z, float inv_scale, double *mine) {
  if (z->owned == 0) return APEX_OK;
  const char *fn = "apex_zero_clip_grad_norm";
  const apex_backend *be = apex__backend_need(apex_pg_device(z->pg), fn);
  if (!be) return apex_last_status();
  if (!be->mt_l2norm) return apex__backend_slot_missing(be, fn, "the multi-tensor L2 norm");
  return be->mt_l2norm(&(apex_mt_l2norm_args){.fn = fn, .chunk_size = APEX_MT_TILE, .n = z->owned, .x = z->own_grads,
                                              .inv_scale = inv_scale, .per_chunk = mine});
}

apex_status apex__zero_global_norm(apex_zero *z, float inv_scale, float *norm) {
  /* Each rank's tile count, and where each piece's tiles start among its owner's. */
  size_t *count = calloc((size_t)z->world, sizeof *count), *at = malloc((size_t)z->npieces * sizeof *at), most = 1;
  if (!count || !at) {
    free(count), free(at);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_clip_grad_norm: out of memory");
  }
  for (int k = 0; k < z->npieces; k++) {
    at[k] = count[z->pieces[k].owner];
    count[z->pieces[k].owner] += tiles_of(z->pieces[k].len);
  }
  for (int r = 0; r < z->world; r++) most = count[r] > most ? count[r] : most;
  double *mine = calloc(most, sizeof *mine), *all = malloc((size_t)z->world * most * sizeof *all);
  apex_status st = mine && all ? own_tile_sums(z, inv_scale, mine) : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_clip_grad_norm: out of memory");
  if (st == APEX_OK) st = apex__pg_allgather_bytes(z->pg, mine, all, most * sizeof *mine);
  if (st == APEX_OK) {
    /* The unsharded order: parameters 0..n-1; in each, its tiles from the start (its pieces, which are
     * contiguous in the plan and in element order), a chunk of tiles at a time. */
    const size_t per_chunk = APEX_MT_DEFAULT_CHUNK / APEX_MT_TILE;
    int *first = malloc((size_t)z->n * sizeof *first);
    if (!first) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_zero_clip_grad_norm: out of memory");
    for (int i = 0; first && i < z->n; i++) first[i] = -1;
    for (int k = z->npieces - 1; first && k >= 0; k--) first[z->pieces[k].i] = k;
    double global = 0.0;
    for (int i = 0; st == APEX_OK && i < z->n; i++) {
      double sq = 0.0, chunk = 0.0;
      size_t tile = 0, tiles = tiles_of(apex_tensor_numel(z->params[i]));
      for (int k = first[i]; k >= 0 && k < z->npieces && z->pieces[k].i == i; k++)
        for (size_t t = 0; t < tiles_of(z->pieces[k].len); t++, tile++) {
          chunk += all[(size_t)z->pieces[k].owner * most + at[k] + t];
          if ((tile + 1) % per_chunk == 0 || tile + 1 == tiles) sq += chunk, chunk = 0.0;
        }
      global += sq;
    }
    free(first);
    if (st == APEX_OK) *norm = (float)sqrt(global);
  }
  free(count), free(at), free(mine), free(all);
  return st;
}
