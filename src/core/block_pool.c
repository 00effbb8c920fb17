/* block_pool.c: a caching allocator's block bookkeeping (block_pool.h): the blocks in the order they
 * were made, a sorted index of the pool's free ones for best fit, and an address hash for frees. */
#include "core/block_pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* ---- the address hash ---------------------------------------------------------------------------- */

static size_t ptr_hash(const void *ptr, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)ptr * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 20) & (cap - 1);
}

static void map_put(apex__block_pool *p, size_t idx) {
  size_t s = ptr_hash(p->blocks[idx].ptr, p->map_cap);
  while (p->map[s]) s = (s + 1) & (p->map_cap - 1);
  p->map[s] = idx + 1;
}

/* Rebuilds the hash for the blocks there are, at a size keeping it at most half full; 0 on host OOM. */
static int map_rebuild(apex__block_pool *p, size_t want_blocks) {
  size_t cap = 64;
  while (cap < 2 * want_blocks) cap *= 2;
  if (cap != p->map_cap) {
    size_t *m = malloc(cap * sizeof *m);
    if (!m) return 0;
    free(p->map);
    p->map = m;
    p->map_cap = cap;
  }
  memset(p->map, 0, p->map_cap * sizeof *p->map);
  for (size_t i = 0; i < p->n; i++) map_put(p, i);
  return 1;
}

/* The index of the block at ptr, or -1. */
static long map_find(const apex__block_pool *p, const void *ptr) {
  if (!p->map_cap) return -1;
  for (size_t s = ptr_hash(ptr, p->map_cap);; s = (s + 1) & (p->map_cap - 1)) {
    size_t e = p->map[s];
    if (!e) return -1;
    if (p->blocks[e - 1].ptr == ptr) return (long)(e - 1);
  }
}

/* ---- the free index, sorted by (size, index) ----------------------------------------------------- */

static int before(const apex__block_pool *p, size_t a, size_t b) {
  size_t sa = p->blocks[a].size, sb = p->blocks[b].size;
  return sa < sb || (sa == sb && a < b);
}

/* The first position whose block is not before block idx (or, with idx = SIZE_MAX, whose size is at
 * least size). */
static size_t lower_bound(const apex__block_pool *p, size_t idx, size_t size) {
  size_t lo = 0, hi = p->n_free;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2, m = p->free_idx[mid];
    int less = idx == SIZE_MAX ? p->blocks[m].size < size : before(p, m, idx);
    if (less) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int free_insert(apex__block_pool *p, size_t idx) {
  if (!apex__grow((void **)&p->free_idx, &p->cap_free, p->n_free + 1, sizeof *p->free_idx)) return 0;
  size_t at = lower_bound(p, idx, 0);
  memmove(p->free_idx + at + 1, p->free_idx + at, (p->n_free - at) * sizeof *p->free_idx);
  p->free_idx[at] = idx;
  p->n_free++;
  return 1;
}

static void free_remove(apex__block_pool *p, size_t idx) {
  size_t at = lower_bound(p, idx, 0);
  if (at < p->n_free && p->free_idx[at] == idx) {
    memmove(p->free_idx + at, p->free_idx + at + 1, (p->n_free - at - 1) * sizeof *p->free_idx);
    p->n_free--;
  }
}

/* ---- the pool ------------------------------------------------------------------------------------- */

long apex__bp_take(apex__block_pool *p, size_t size, int capture) {
  long best = -1;
  if (!capture) {
    size_t at = lower_bound(p, SIZE_MAX, size);
    if (at < p->n_free && p->blocks[p->free_idx[at]].size / 2 <= size) best = (long)p->free_idx[at];
  } else { /* rare: a capture may take its own blocks or the pool's, of any size that fits */
    for (size_t i = 0; i < p->n; i++) {
      const apex__bp_block *b = &p->blocks[i];
      if (!b->in_use && (b->owner == 0 || b->owner == capture) && b->size >= size && (best < 0 || b->size < p->blocks[best].size))
        best = (long)i;
    }
  }
  if (best < 0) return -1;
  apex__bp_block *b = &p->blocks[best];
  if (b->owner == 0) free_remove(p, (size_t)best);
  b->in_use = 1;
  if (capture) b->owner = capture;
  return best;
}

int apex__bp_add(apex__block_pool *p, void *ptr, size_t size, int capture) {
  if (!apex__grow((void **)&p->blocks, &p->cap, p->n + 1, sizeof *p->blocks)) return 0;
  if (2 * (p->n + 1) > p->map_cap && !map_rebuild(p, p->n + 1)) return 0;
  p->blocks[p->n] = (apex__bp_block){ptr, size, 1, capture};
  map_put(p, p->n);
  p->n++;
  return 1;
}

size_t apex__bp_put(apex__block_pool *p, void *ptr) {
  long i = map_find(p, ptr);
  if (i < 0 || !p->blocks[i].in_use) return 0;
  apex__bp_block *b = &p->blocks[i];
  b->in_use = 0;
  /* out of host memory for the index: the block stays out of reach, used by nothing, until a trim */
  if (b->owner == 0 && !free_insert(p, (size_t)i)) b->in_use = -1;
  return b->size;
}

void apex__bp_release_owner(apex__block_pool *p, int id) {
  if (!id) return;
  for (size_t i = 0; i < p->n; i++)
    if (p->blocks[i].owner == id) {
      p->blocks[i].owner = 0;
      if (!p->blocks[i].in_use && !free_insert(p, i)) p->blocks[i].in_use = -1;
    }
}

size_t apex__bp_trim(apex__block_pool *p, void (*fn)(void *ptr, size_t size, void *ctx), void *ctx) {
  size_t k = 0, dropped = 0;
  for (size_t i = 0; i < p->n; i++) {
    apex__bp_block b = p->blocks[i];
    if (b.in_use > 0 || b.owner) {
      p->blocks[k++] = b;
    } else {
      if (fn) fn(b.ptr, b.size, ctx);
      dropped += b.size;
    }
  }
  p->n = k;
  p->n_free = 0; /* every free pool block went */
  if (!map_rebuild(p, p->n)) { /* host memory: keep the old table's size (it held more), so this cannot fail */
    memset(p->map, 0, p->map_cap * sizeof *p->map);
    for (size_t i = 0; i < p->n; i++) map_put(p, i);
  }
  return dropped;
}

void apex__bp_destroy(apex__block_pool *p) {
  free(p->blocks);
  free(p->free_idx);
  free(p->map);
  memset(p, 0, sizeof *p);
}
