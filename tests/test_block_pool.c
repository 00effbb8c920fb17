/* test_block_pool.c: the caching allocator's bookkeeping (core/block_pool.h, behind the CUDA backend's
 * allocator) against a reference that scans every block as the allocator did before the index: random
 * requests, frees, captures and trims, every choice the same block (or the same refusal), every free the
 * same size, every trim the same blocks dropped in the same order. Runs on any machine: the "device"
 * addresses are made up and never touched. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/block_pool.h"
#include "testutil.h"

/* ---- the reference: a linear scan of every block ------------------------------------------------ */

typedef struct ref_pool {
  apex__bp_block b[4096];
  size_t n;
} ref_pool;

static long ref_take(ref_pool *r, size_t size, int capture) {
  long best = -1;
  for (size_t i = 0; i < r->n; i++) {
    apex__bp_block *b = &r->b[i];
    int mine = capture ? b->owner == 0 || b->owner == capture : b->owner == 0;
    if (!b->in_use && mine && b->size >= size && (capture || b->size / 2 <= size) && (best < 0 || b->size < r->b[best].size))
      best = (long)i;
  }
  if (best >= 0) {
    r->b[best].in_use = 1;
    if (capture) r->b[best].owner = capture;
  }
  return best;
}

static size_t ref_put(ref_pool *r, void *ptr) {
  for (size_t i = 0; i < r->n; i++)
    if (r->b[i].ptr == ptr && r->b[i].in_use) {
      r->b[i].in_use = 0;
      return r->b[i].size;
    }
  return 0;
}

typedef struct dropped {
  void *ptr[4096];
  size_t n;
} dropped;

static void note_drop(void *ptr, size_t size, void *ctx) {
  (void)size;
  dropped *d = ctx;
  d->ptr[d->n++] = ptr;
}

static size_t ref_trim(ref_pool *r, dropped *d) {
  size_t k = 0, bytes = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->b[i].in_use || r->b[i].owner) {
      r->b[k++] = r->b[i];
    } else {
      d->ptr[d->n++] = r->b[i].ptr;
      bytes += r->b[i].size;
    }
  r->n = k;
  return bytes;
}

/* ---- the comparison --------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return rng_state;
}

static void test_matches_the_scan(void **state) {
  (void)state;
  static ref_pool ref;
  static apex__block_pool pool;
  static void *live[4096];
  size_t n_live = 0;
  uintptr_t next_addr = 0x10000;
  int capture = 0, captures = 0;
  static const size_t sizes[] = {512, 1024, 1536, 4096, 65536, 2u << 20, 4u << 20, 6u << 20, 64u << 20};
  for (int step = 0; step < 200000; step++) {
    uint64_t r = next() % 1000;
    if (r < 480 && ref.n < 4000) { /* a request: reuse or a new block */
      size_t size = sizes[next() % (sizeof sizes / sizeof sizes[0])];
      long a = ref_take(&ref, size, capture), b = apex__bp_take(&pool, size, capture);
      if (a != b) fail_msg("step %d: request of %zu (capture %d): the scan takes block %ld, the index %ld", step, size, capture, a, b);
      if (a < 0 && !capture) {
        void *p = (void *)next_addr;
        next_addr += size;
        ref.b[ref.n++] = (apex__bp_block){p, size, 1, 0};
        assert_int_equal(apex__bp_add(&pool, p, size, 0), 1);
        a = (long)ref.n - 1;
      }
      if (a >= 0) live[n_live++] = ref.b[a].ptr;
    } else if (r < 960 && n_live) { /* a free, or a free of something not in use */
      size_t k = next() % n_live;
      void *p = live[k];
      live[k] = live[--n_live];
      assert_int_equal(ref_put(&ref, p), apex__bp_put(&pool, p));
      assert_int_equal(apex__bp_put(&pool, p), 0); /* twice: nothing */
      ref_put(&ref, p);
    } else if (r < 975) { /* a capture begins or ends, and an ended one is released now and then */
      if (capture) {
        int id = capture;
        capture = 0;
        if (next() % 2) {
          for (size_t i = 0; i < ref.n; i++)
            if (ref.b[i].owner == id) ref.b[i].owner = 0;
          apex__bp_release_owner(&pool, id);
        }
      } else {
        capture = ++captures;
      }
    } else if (r < 980 && !capture) { /* the cache given back */
      static dropped da, db;
      da.n = db.n = 0;
      assert_int_equal(ref_trim(&ref, &da), apex__bp_trim(&pool, note_drop, &db));
      assert_int_equal(da.n, db.n);
      assert_memory_equal(da.ptr, db.ptr, da.n * sizeof *da.ptr);
    }
    if (step % 5000 == 0) { /* the whole state, now and then */
      assert_int_equal(ref.n, pool.n);
      for (size_t i = 0; i < ref.n; i++) {
        assert_ptr_equal(ref.b[i].ptr, pool.blocks[i].ptr);
        assert_int_equal(ref.b[i].in_use, pool.blocks[i].in_use);
        assert_int_equal(ref.b[i].owner, pool.blocks[i].owner);
      }
    }
  }
  assert_true(captures > 10);
  apex__bp_destroy(&pool);
}

static void test_edges(void **state) {
  (void)state;
  apex__block_pool p = {0};
  assert_int_equal(apex__bp_take(&p, 512, 0), -1); /* empty */
  assert_int_equal(apex__bp_put(&p, (void *)0x1000), 0); /* unknown address */
  assert_int_equal(apex__bp_add(&p, (void *)0x1000, 4096, 0), 1);
  assert_int_equal(apex__bp_put(&p, (void *)0x1000), 4096);
  assert_int_equal(apex__bp_take(&p, 1024, 0), -1); /* over twice the request: a small tensor never pins it */
  assert_int_equal(apex__bp_take(&p, 2048, 0), 0);
  assert_int_equal(apex__bp_put(&p, (void *)0x1000), 4096);
  assert_int_equal(apex__bp_take(&p, 1024, 7), 0); /* a capture takes any size that fits */
  assert_int_equal(apex__bp_put(&p, (void *)0x1000), 4096);
  assert_int_equal(apex__bp_take(&p, 4096, 0), -1); /* the capture's until released */
  assert_int_equal(apex__bp_trim(&p, NULL, NULL), 0); /* and a trim keeps it */
  apex__bp_release_owner(&p, 7);
  assert_int_equal(apex__bp_take(&p, 4096, 0), 0);
  assert_int_equal(apex__bp_put(&p, (void *)0x1000), 4096);
  assert_int_equal(apex__bp_trim(&p, NULL, NULL), 4096);
  assert_int_equal(p.n, 0);
  apex__bp_destroy(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_matches_the_scan), cmocka_unit_test(test_edges)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
