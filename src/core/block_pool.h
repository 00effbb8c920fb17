/* block_pool.h: the bookkeeping of a caching device allocator (the CUDA backend's, runtime.cu), kept
 * apart from the device calls so that it is plain C and tested on any machine (test_block_pool).
 *
 * The pool keeps every block it was given. A freed block serves a later request that it fits: the
 * smallest free block of at least the request and at most twice it (so a small tensor never pins a
 * huge block), the earliest-made among equals. A CUDA graph capture (a non-zero capture id) bakes the
 * addresses of the blocks it used into the graph: while one is on, every block handed out becomes the
 * capture's, comes back only to it when freed, and may be of any size that fits; apex__bp_release_owner
 * gives its blocks back to the pool.
 *
 * Why an index: a training step makes hundreds of requests and the pool holds thousands of blocks, so
 * a scan of them all per request and per free is host time every kernel launch pays. Free pool blocks
 * are kept sorted by (size, age) for a binary search, and a hash of addresses finds a block to free. */
#ifndef APEX_CORE_BLOCK_POOL_H
#define APEX_CORE_BLOCK_POOL_H

#include <stddef.h>

typedef struct apex__bp_block {
  void *ptr;
  size_t size;
  int in_use;
  int owner; /* 0: the pool's; else the capture that took it */
} apex__bp_block;

/* Zero-initialised is an empty pool. */
typedef struct apex__block_pool {
  apex__bp_block *blocks; /* in the order they were added */
  size_t n, cap;
  size_t *free_idx; /* indices of the pool's free blocks (owner 0), sorted by (size, index) */
  size_t n_free, cap_free;
  size_t *map; /* open addressing over ptr: 1 + block index, 0 empty; map_cap a power of two */
  size_t map_cap;
} apex__block_pool;

/* The block to reuse for a request of `size` bytes, by the rule above (capture: the capture on, 0 for
 * none), marked in use (and the capture's); -1 when none fits. */
long apex__bp_take(apex__block_pool *p, size_t size, int capture);
/* Records a new block of `size` bytes at ptr, in use (the capture's when one is on). 0 when host memory
 * ran out (nothing recorded), else 1. */
int apex__bp_add(apex__block_pool *p, void *ptr, size_t size, int capture);
/* Marks the in-use block at ptr free; returns its size, 0 when ptr is no in-use block of the pool. */
size_t apex__bp_put(apex__block_pool *p, void *ptr);
/* The blocks of capture id become the pool's again. */
void apex__bp_release_owner(apex__block_pool *p, int id);
/* Drops every free block of the pool (owner 0), calling fn(ptr, size, ctx) for each, in block order;
 * returns the bytes dropped. In-use and captured blocks stay. */
size_t apex__bp_trim(apex__block_pool *p, void (*fn)(void *ptr, size_t size, void *ctx), void *ctx);
/* Frees the pool's host memory (not the blocks: trim first). */
void apex__bp_destroy(apex__block_pool *p);

#endif
