/* test_zero.c: the sharded optimizer (zero.h) and the reduce-scatter it runs on (parallel.h).
 *
 * Run alone (the local group, world size 1) and under `mpirun -np 1..4` (tests/test_zero.cmake).
 * The reference is computed in the same run on every rank: DDP's engine (the Reducer, averaging)
 * over a copy of the same parameters and gradients, then an unsharded apex_optimizer step, with the
 * overflow check and clipping a DDP program does. A sharded step must leave every parameter with
 * the reference's bits, on every rank, for every optimizer, in f32 and in f16/bf16 with f32 masters
 * (apex's O0 and O2 parameter layouts) under a loss scale, with and without clipping, stages 1 and
 * 2, with buckets of a few kB (many chunks) and of the default size, with the reduce-scatter after the
 * backward and overlapped with it (gradients marked out of order), and an Inf injected on one rank
 * must make every rank skip. A consolidated checkpoint must have the
 * bytes of the reference optimizer's, and resume bitwise here, on one rank, and (at 3 and 4 ranks) from a
 * checkpoint that 2 of the ranks made. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { NP = 5, STEPS = 4, OVERFLOW_STEP = 2 };
/* Sizes that put the range boundaries inside parameters at 2, 3 and 4 ranks (and some at their
 * ends), 2-D ones for AdamP's channel view. */
static const int64_t SHAPES[NP][2] = {{50, 100}, {300, 1}, {90, 100}, {17, 1}, {4101, 1}};
static const int NDIM[NP] = {2, 1, 2, 1, 1};

static float hash_val(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = a * 1000003u + b * 7919u + c * 104729u + d * 15485863u + 0x5bd1e995u;
  h ^= h >> 13;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  return (float)((double)(h % 2000001u) / 1000000.0 - 1.0);
}

/* Parameters as autograd leaves, so that their gradients are autograd's: those stage 2 releases after the
 * reduce-scatter (zero.h's keep_grads), and that fill_grads's writes make again. */
typedef struct set_t {
  apex_var *v[NP];
  apex_tensor *p[NP], *g[NP];
} set_t;

static apex_dtype dtype_of(int half, int i) {
  if (!half) return APEX_F32;
  static const apex_dtype mixed[NP] = {APEX_F16, APEX_F16, APEX_BF16, APEX_F32, APEX_F16}; /* one f32: batch norm kept f32 */
  return mixed[i];
}

static set_t make_set(int half, int salt) {
  set_t s;
  for (int i = 0; i < NP; i++) {
    s.v[i] = apex_var_create(apex_tensor_create(dtype_of(half, i), NDIM[i], SHAPES[i]), 1);
    s.p[i] = apex_var_value(s.v[i]);
    s.g[i] = apex_var_grad(s.v[i]);
    assert_non_null(s.p[i]);
    assert_non_null(s.g[i]);
    for (size_t j = 0; j < apex_tensor_numel(s.p[i]); j++) apex_tensor_set(s.p[i], j, 0.5f * hash_val(77, (uint64_t)salt, (uint64_t)i, j));
  }
  return s;
}

static void free_set(set_t *s) {
  for (int i = 0; i < NP; i++) apex_var_destroy(s->v[i]);
}

/* This rank's gradients of a step, times the loss scale; an Inf on the last rank at OVERFLOW_STEP. */
static void fill_grads(set_t *s, int step, int rank, int world, float scale, int inject) {
  for (int i = 0; i < NP; i++)
    for (size_t j = 0; j < apex_tensor_numel(s->g[i]); j++)
      apex_tensor_set(s->g[i], j, scale * hash_val((uint64_t)step, (uint64_t)rank, (uint64_t)i, j));
  if (inject && step == OVERFLOW_STEP && rank == world - 1) apex_tensor_set(s->g[2], 4321, INFINITY);
}

static void assert_same_bits(const apex_tensor *a, const apex_tensor *b, const char *what, int i) {
  size_t n = apex_tensor_numel(a);
  assert_int_equal(n, apex_tensor_numel(b));
  const uint8_t *x = apex_tensor_data(a), *y = apex_tensor_data(b);
  size_t es = apex_dtype_size(apex_tensor_dtype(a));
  for (size_t j = 0; j < n; j++)
    if (memcmp(x + j * es, y + j * es, es) != 0)
      fail_msg("%s %d element %zu: sharded %.9g, DDP %.9g (rank %d of %d)", what, i, j, (double)apex_tensor_get(a, j),
               (double)apex_tensor_get(b, j), apex_pg_rank(tu_pg), apex_pg_world_size(tu_pg));
}

static apex_optim_options options_for(apex_optim_kind kind) {
  apex_optim_options o = {.lr = 1e-2f, .weight_decay = 0.01f};
  if (kind == APEX_OPTIM_SGD || kind == APEX_OPTIM_RMSPROP || kind == APEX_OPTIM_RMSPROP_TF) o.momentum = 0.9f;
  if (kind == APEX_OPTIM_ADADELTA) o.lr = 1.0f;
  return o;
}

/* STEPS sharded steps against STEPS DDP steps. */
static void run_case_masters(apex_optim_kind kind, int half, int clip, int stage, int inject, int amp_masters) {
  int rank = apex_pg_rank(tu_pg), world = apex_pg_world_size(tu_pg);
  float scale = half ? 1024.0f : 1.0f;
  apex_optim_options oo = options_for(kind);
  /* amp's flow (amp_masters): the unscaled f32 master gradients first, then the step. With clipping
   * under a loss scale, LAMB's own max_grad_norm may differ in the last bit (zero.h): left off there. */
  if (amp_masters && clip && kind == APEX_OPTIM_LAMB) oo.max_grad_norm = -1.0f;
  /* Ranks other than 0 start from other values: creation copies rank 0's, as DDP does. */
  set_t zs = make_set(half, rank), ref = make_set(half, 0), orig = make_set(0, 0);
  /* Buckets of a few kB move the shards in many chunks, some ending inside a rank's share (padding),
   * the default in one. */
  size_t bucket = stage == 2 ? 4000 : half ? 20000 : 0;
  /* Every other optimizer reduce-scatters its buckets as the gradients are marked (overlap), some
   * buckets straddling ranks and two buffers reused in turn. */
  int overlap = (int)kind % 2 == stage % 2;
  apex_zero *z = apex_zero_create(tu_pg, zs.p, zs.g, NP, kind, &oo,
                                  &(apex_zero_options){.stage = stage, .master_values = amp_masters ? orig.p : NULL,
                                                       .amp_unscale = amp_masters, .bucket_bytes = bucket, .overlap = overlap});
  if (!z) fail_msg("apex_zero_create: %s", apex_last_error());
  if (bucket) { /* the gradients' memory: the largest range (2 bytes or 4 an element) and one bucket per dtype */
    size_t most = 0, b, e;
    for (int r = 0; r < world; r++) {
      TU_OK(apex_zero_shard_range(z, r, &b, &e));
      if (e - b > most) most = e - b;
    }
    /* overlap: two more buckets, each at least the largest gradient (one larger than bucket_bytes is a bucket of its own) */
    size_t held = apex_zero_buffer_bytes(z), largest = (size_t)(SHAPES[2][0] * SHAPES[2][1]) * 4, bound = most * 4 + 3 * bucket + (overlap ? 2 * (largest + bucket) : 0);
    if (held > bound) fail_msg("%zu bytes for the gradients, more than a range of %zu elements and the buckets", held, most);
  }
  apex_optimizer *opt = apex_optimizer_create(kind, &oo);
  assert_non_null(opt);
  apex_tensor *mg[NP] = {0}; /* amp's master gradients: f32 */
  if (amp_masters) { /* as amp's O2: the optimizer is made over the f32 model, then told of the cast */
    TU_OK(apex_optimizer_add_group(opt, orig.p, NP, orig.g, NP, NULL, NULL));
    for (int i = 0; i < NP; i++) {
      mg[i] = apex_tensor_create(APEX_F32, NDIM[i], SHAPES[i]);
      TU_OK(apex_optimizer_replace_param(opt, 0, i, ref.p[i], mg[i], 1));
    }
  } else {
    TU_OK(apex_optimizer_add_group(opt, ref.p, NP, ref.g, NP, NULL, NULL));
  }
  apex_reducer *red = apex_reducer_create(tu_pg, ref.g, NP, NULL);
  assert_non_null(red);
  for (int i = 0; i < NP; i++) assert_same_bits(zs.p[i], ref.p[i], "initial parameter", i);

  for (int step = 1; step <= STEPS; step++) {
    fill_grads(&zs, step, rank, world, scale, inject);
    fill_grads(&ref, step, rank, world, scale, inject);
    /* DDP */
    TU_OK(apex_reducer_reduce(red));
    float ref_norm = 0.0f, z_norm = 0.0f;
    int ref_overflow = 0;
    if (amp_masters) { /* amp: unscale into the master gradients (with the overflow check), clip them, step at scale 1 */
      TU_OK(apex_mt_scale(0, &ref_overflow, ref.g, mg, NP, 1.0f / scale));
      if (clip) TU_OK(apex_optimizer_clip_grad_norm(opt, 0.5f, 1.0f, &ref_norm));
      TU_OK(apex_optimizer_step(opt, 1.0f, ref_overflow));
    } else {
      if (clip) TU_OK(apex_optimizer_clip_grad_norm(opt, 0.5f, scale, &ref_norm));
      TU_OK(apex_mt_check_finite(ref.g, NP, &ref_overflow));
      TU_OK(apex_optimizer_step(opt, scale, ref_overflow));
    }
    /* sharded: with overlap the gradients are marked out of order (as a backward may), the first
     * left to apex_zero_reduce_grads */
    for (int i = 1; overlap && i < NP; i++) TU_OK(apex_zero_mark_ready(z, (i * 3) % (NP - 1) + 1));
    TU_OK(apex_zero_reduce_grads(z));
    /* Stage 2 keeps no gradient tensor: each reads as zeros until written again. */
    for (int i = 0; i < NP; i++) assert_int_equal(apex_tensor_released(zs.g[i]), stage == 2);
    if (stage == 2) assert_int_equal(apex_zero_grad_bytes(z, NULL), 0);
    /* Stage 2 on request (even steps). */
    if (stage == 2 && step % 2 == 0) TU_OK(apex_zero_gather_grads(z));
    if (stage == 1 || step % 2 == 0)
      for (int i = 0; i < NP; i++) assert_same_bits(zs.g[i], ref.g[i], "reduced gradient", i);
    if (clip) {
      TU_OK(apex_zero_clip_grad_norm(z, 0.5f, scale, &z_norm));
      if (!(inject && step == OVERFLOW_STEP)) assert_int_equal(tu_bits(z_norm), tu_bits(ref_norm));
    }
    int overflow = 0, seen = 0;
    TU_OK(apex_zero_reduce_overflow(z, &seen)); /* what amp's callback sees */
    assert_int_equal(seen, ref_overflow);
    TU_OK(apex_zero_step(z, scale, &overflow));
    assert_int_equal(overflow, ref_overflow);
    assert_int_equal(overflow, inject && step == OVERFLOW_STEP);
    for (int i = 0; i < NP; i++) assert_same_bits(zs.p[i], ref.p[i], "parameter", i);
  }
  apex_reducer_destroy(red);
  apex_optimizer_destroy(opt);
  apex_zero_destroy(z);
  free_set(&zs);
  free_set(&ref);
  free_set(&orig);
  for (int i = 0; i < NP; i++) apex_tensor_destroy(mg[i]);
}

static void run_case(apex_optim_kind kind, int half, int clip, int stage, int inject) {
  run_case_masters(kind, half, clip, stage, inject, 0);
}

static void all_kinds(int half, int clip, int stage, int inject) {
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++) {
    print_message("  %s %s%s stage %d%s\n", apex_optim_kind_name((apex_optim_kind)k), half ? "f16/bf16 + masters" : "f32",
                  clip ? " clipped" : "", stage, inject ? " with an injected overflow" : "");
    run_case((apex_optim_kind)k, half, clip, stage, inject);
  }
}

static void test_o0_matches_ddp(void **state) { (void)state, all_kinds(0, 0, 1, 0); }
static void test_o2_matches_ddp(void **state) { (void)state, all_kinds(1, 0, 1, 1); }
static void test_clip_matches_ddp(void **state) { (void)state, all_kinds(0, 1, 1, 0), all_kinds(1, 1, 1, 1); }
/* amp's O2: masters from the f32 values before the cast (the parameters are the rounded values, the
 * masters the exact ones, and the reference is told of the cast as amp tells it), and amp's unscale
 * into f32 master gradients before a step that applies only the clipping. */
static void test_master_values(void **state) {
  (void)state;
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++) {
    run_case_masters((apex_optim_kind)k, 1, 1, 1 + k % 2, k % 2, 1);
    run_case_masters((apex_optim_kind)k, 1, 0, 2 - k % 2, 1 - k % 2, 1);
  }
}

static void test_stage2_matches_ddp(void **state) { (void)state, all_kinds(0, 0, 2, 1), all_kinds(1, 1, 2, 1); }

/* Every element belongs to exactly one rank; elementwise kinds cut within a tile of the balanced
 * point, at tile multiples inside a parameter; LAMB cuts at parameter ends; the state a rank holds is
 * its share of the unsharded optimizer's. */
static void test_shards(void **state) {
  (void)state;
  int world = apex_pg_world_size(tu_pg);
  /* The flat vector holds the last parameter first (zero.h): starts[j] is where its j-th one starts. */
  size_t total = 0, starts[NP + 1] = {0};
  for (int j = 0; j < NP; j++) {
    total += (size_t)(SHAPES[NP - 1 - j][0] * SHAPES[NP - 1 - j][1]);
    starts[j + 1] = total;
  }
  for (int whole = 0; whole < 2; whole++) {
    apex_optim_kind kind = whole ? APEX_OPTIM_LAMB : APEX_OPTIM_ADAM;
    set_t s = make_set(1, 0);
    apex_zero *z = apex_zero_create(tu_pg, s.p, s.g, NP, kind, NULL, NULL);
    assert_non_null(z);
    size_t prev_end = 0, mine = 0;
    for (int r = 0; r < world; r++) {
      size_t b = 0, e = 0;
      TU_OK(apex_zero_shard_range(z, r, &b, &e));
      assert_int_equal(b, prev_end);
      assert_true(e >= b);
      prev_end = e;
      if (r == apex_pg_rank(tu_pg)) mine = e - b;
      if (r == 0) continue;
      int p = 0;
      while (p < NP && starts[p + 1] <= b) p++;
      if (whole) assert_true(p == NP || b == starts[p]);
      else {
        assert_true(p == NP || (b - starts[p]) % APEX_MT_TILE == 0 || b == starts[p]);
        size_t want = (size_t)r * total / (size_t)world;
        assert_true(b + APEX_MT_TILE >= want && b <= want + APEX_MT_TILE);
      }
    }
    assert_int_equal(prev_end, total);
    /* Adam with masters: 12 bytes per owned element, plus the format's headers. */
    apex_optimizer *full = apex_optimizer_create(kind, NULL);
    TU_OK(apex_optimizer_add_group(full, s.p, NP, s.g, NP, NULL, NULL));
    size_t full_bytes = 0;
    TU_OK(apex_optimizer_state_size(full, &full_bytes));
    size_t zb = apex_zero_state_bytes(z);
    assert_true(zb <= full_bytes);
    if (!whole) assert_true(zb >= 12 * mine && zb <= 12 * mine + 4096);
    if (world == 1) assert_int_equal(zb, full_bytes);
    apex_optimizer_destroy(full);
    apex_zero_destroy(z);
    free_set(&s);
  }
}

/* apex_pg_reduce_scatter gives each rank its segment of apex_pg_allreduce's result, bit for bit. */
static void test_reduce_scatter_is_allreduce(void **state) {
  (void)state;
  int rank = apex_pg_rank(tu_pg), world = apex_pg_world_size(tu_pg);
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  const apex_reduce_op ops[3] = {APEX_REDUCE_SUM, APEX_REDUCE_AVG, APEX_REDUCE_MAX};
  for (int d = 0; d < 3; d++)
    for (int o = 0; o < 3; o++) {
      int64_t n = 1237, all = n * world;
      apex_tensor *in = apex_tensor_create(dts[d], 1, &all), *ar = apex_tensor_create(dts[d], 1, &all), *out = apex_tensor_create(dts[d], 1, &n);
      for (int64_t j = 0; j < all; j++) apex_tensor_set(in, (size_t)j, 1000.0f * hash_val(5, (uint64_t)rank, (uint64_t)d, (uint64_t)j));
      if (rank == 0) apex_tensor_set(in, 7, NAN);
      TU_OK(apex_tensor_copy(ar, in));
      TU_OK(apex_pg_allreduce(tu_pg, ar, ops[o]));
      TU_OK(apex_pg_reduce_scatter(tu_pg, in, out, ops[o]));
      apex_tensor *seg = apex_tensor_slice_view(ar, (size_t)(rank * n), 1, &n);
      assert_same_bits(out, seg, "reduce-scatter element", o);
      apex_tensor_destroy(seg);
      /* Unequal parts, one of them empty (rank 1's): the same bits as the all-reduce's elements. */
      size_t counts[8], at = 0;
      for (int q = 0; q < world; q++) counts[q] = (size_t)all / (size_t)world + (q == 0 ? (size_t)all % (size_t)world : 0);
      if (world > 1) counts[0] += counts[1], counts[1] = 0;
      for (int q = 0; q < rank; q++) at += counts[q];
      int64_t mine = (int64_t)counts[rank];
      apex_tensor *vout = mine ? apex_tensor_create(dts[d], 1, &mine) : NULL;
      TU_OK(apex_pg_reduce_scatter_v(tu_pg, in, vout, counts, ops[o]));
      if (vout) {
        seg = apex_tensor_slice_view(ar, at, 1, &mine);
        assert_same_bits(vout, seg, "reduce-scatter-v element", o);
        apex_tensor_destroy(seg);
      }
      apex_tensor_destroy(vout);
      apex_tensor_destroy(in);
      apex_tensor_destroy(ar);
      apex_tensor_destroy(out);
    }
}

static uint8_t *save_bytes(const apex_optimizer *opt, size_t *size) {
  TU_OK(apex_optimizer_state_size(opt, size));
  uint8_t *buf = malloc(*size);
  assert_non_null(buf);
  size_t written = 0;
  TU_OK(apex_optimizer_save(opt, buf, *size, &written));
  assert_int_equal(written, *size);
  return buf;
}

/* Steps [from, to] of a sharded optimizer and its DDP reference on a group, checked bitwise. */
static void steps_on(apex_pg *pg, apex_zero *z, set_t *zs, apex_optimizer *opt, set_t *ref, int from, int to, float scale) {
  apex_reducer *red = apex_reducer_create(pg, ref->g, NP, NULL);
  assert_non_null(red);
  int rank = apex_pg_rank(pg), world = apex_pg_world_size(pg);
  for (int step = from; step <= to; step++) {
    fill_grads(zs, step, rank, world, scale, 0);
    fill_grads(ref, step, rank, world, scale, 0);
    TU_OK(apex_reducer_reduce(red));
    TU_OK(apex_optimizer_step(opt, scale, 0));
    TU_OK(apex_zero_reduce_grads(z));
    TU_OK(apex_zero_step(z, scale, NULL));
    for (int i = 0; i < NP; i++) assert_same_bits(zs->p[i], ref->p[i], "parameter", i);
  }
  apex_reducer_destroy(red);
}

/* A fresh unsharded optimizer over s loaded from bytes. */
static apex_optimizer *loaded(apex_optim_kind kind, const apex_optim_options *oo, set_t *s, const uint8_t *buf, size_t size) {
  apex_optimizer *o = apex_optimizer_create(kind, oo);
  assert_non_null(o);
  TU_OK(apex_optimizer_add_group(o, s->p, NP, s->g, NP, NULL, NULL));
  TU_OK(apex_optimizer_load(o, buf, size));
  return o;
}

/* The consolidated checkpoint has the bytes of the DDP run's unsharded optimizer, and loading it
 * resumes bitwise at this number of ranks and at one (the local group): another rank count. */
static void test_checkpoint(void **state) {
  (void)state;
  int rank = apex_pg_rank(tu_pg);
  apex_pg *local = apex_pg_create_local();
  for (int half = 0; half < 2; half++)
    for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++) {
      apex_optim_kind kind = (apex_optim_kind)k;
      apex_optim_options oo = options_for(kind);
      float scale = half ? 1024.0f : 1.0f;
      set_t zs = make_set(half, rank), ref = make_set(half, 0);
      apex_zero *z = apex_zero_create(tu_pg, zs.p, zs.g, NP, kind, &oo, NULL);
      assert_non_null(z);
      apex_optimizer *opt = apex_optimizer_create(kind, &oo);
      TU_OK(apex_optimizer_add_group(opt, ref.p, NP, ref.g, NP, NULL, NULL));
      TU_OK(apex_zero_set_lr(z, 5e-3f));
      TU_OK(apex_optimizer_set_lr(opt, 0, 5e-3f));
      steps_on(tu_pg, z, &zs, opt, &ref, 1, 2, scale);
      apex_optimizer *full = apex_zero_consolidate(z);
      if (!full) fail_msg("apex_zero_consolidate: %s", apex_last_error());
      size_t zsize = 0, rsize = 0;
      uint8_t *zbuf = save_bytes(full, &zsize), *rbuf = save_bytes(opt, &rsize);
      assert_int_equal(zsize, rsize);
      if (memcmp(zbuf, rbuf, zsize) != 0) fail_msg("%s: the consolidated checkpoint differs from DDP's", apex_optim_kind_name(kind));
      apex_optimizer_destroy(full);

      /* Resume here: the parameters from the model file (the f32 ones are in no optimizer state), the
       * state from the bytes. */
      set_t zs2 = make_set(half, rank + 7), ref2 = make_set(half, 9), zs3 = make_set(half, 11), ref3 = make_set(half, 12);
      for (int i = 0; i < NP; i++) {
        TU_OK(apex_tensor_copy(zs2.p[i], ref.p[i]));
        TU_OK(apex_tensor_copy(ref2.p[i], ref.p[i]));
        TU_OK(apex_tensor_copy(zs3.p[i], ref.p[i]));
        TU_OK(apex_tensor_copy(ref3.p[i], ref.p[i]));
      }
      apex_zero *z2 = apex_zero_create(tu_pg, zs2.p, zs2.g, NP, kind, &oo, &(apex_zero_options){.bucket_bytes = 5000});
      apex_optimizer *from = loaded(kind, &oo, &zs2, zbuf, zsize), *opt2 = loaded(kind, &oo, &ref2, rbuf, rsize);
      TU_OK(apex_zero_load_state(z2, from));
      assert_true(apex_zero_get_lr(z2) == 5e-3f);
      apex_optimizer_destroy(from);
      steps_on(tu_pg, z2, &zs2, opt2, &ref2, 3, 4, scale);
      /* And on one rank. */
      apex_zero *z3 = apex_zero_create(local, zs3.p, zs3.g, NP, kind, &oo, NULL);
      apex_optimizer *from3 = loaded(kind, &oo, &zs3, zbuf, zsize), *opt3 = loaded(kind, &oo, &ref3, rbuf, rsize);
      TU_OK(apex_zero_load_state(z3, from3));
      apex_optimizer_destroy(from3);
      steps_on(local, z3, &zs3, opt3, &ref3, 3, 4, scale);

      apex_optimizer_destroy(opt);
      apex_optimizer_destroy(opt2);
      apex_optimizer_destroy(opt3);
      apex_zero_destroy(z);
      apex_zero_destroy(z2);
      apex_zero_destroy(z3);
      free(zbuf);
      free(rbuf);
      free_set(&zs), free_set(&ref), free_set(&zs2), free_set(&ref2), free_set(&zs3), free_set(&ref3);
    }
  /* Refusals. */
  set_t s = make_set(0, 0);
  apex_zero *z = apex_zero_create(local, s.p, s.g, NP, APEX_OPTIM_ADAM, NULL, NULL);
  apex_optimizer *sgd = apex_optimizer_create(APEX_OPTIM_SGD, NULL);
  TU_OK(apex_optimizer_add_group(sgd, s.p, NP, NULL, 0, NULL, NULL));
  TU_FAILS(apex_zero_load_state(z, sgd), APEX_ERR_STATE, "the optimizer is sgd but this sharded optimizer adam");
  TU_FAILS(apex_zero_load_state(z, NULL), APEX_ERR_INVALID_ARG, "full is NULL");
  apex_optimizer *ams = apex_optimizer_create(APEX_OPTIM_ADAM, &(apex_optim_options){.amsgrad = APEX_OPTIM_ON});
  TU_OK(apex_optimizer_add_group(ams, s.p, NP, NULL, 0, NULL, NULL));
  TU_FAILS(apex_zero_load_state(z, ams), APEX_ERR_STATE, "keeps 3 state tensors per parameter, this one 2");
  apex_optimizer *few = apex_optimizer_create(APEX_OPTIM_ADAM, NULL);
  TU_OK(apex_optimizer_add_group(few, s.p, NP - 1, NULL, 0, NULL, NULL));
  TU_FAILS(apex_zero_load_state(z, few), APEX_ERR_STATE, "1 group(s) of 4 parameters; this one 1 of 5");
  assert_null(apex_zero_consolidate(NULL));
  apex_optimizer_destroy(sgd);
  apex_optimizer_destroy(ams);
  apex_optimizer_destroy(few);
  apex_zero_destroy(z);
  free_set(&s);
  apex_pg_destroy(local);
}

#if APEX_TEST_MPI
#include <mpi.h>

/* Copies rank 0's n bytes (n itself first) to every rank of tu_pg, as f32 words: MPI moves the bits. */
static uint8_t *bcast_bytes(const uint8_t *buf, size_t *n) {
  int64_t one = 1;
  float len = (float)*n;
  apex_tensor *t = apex_tensor_wrap(&len, APEX_F32, 1, &one);
  TU_OK(apex_pg_broadcast(tu_pg, t, 0));
  apex_tensor_destroy(t);
  *n = (size_t)len;
  int64_t words = (int64_t)((*n + 3) / 4);
  uint8_t *out = calloc((size_t)words, 4);
  assert_non_null(out);
  if (buf) memcpy(out, buf, *n);
  t = apex_tensor_wrap(out, APEX_F32, 1, &words);
  TU_OK(apex_pg_broadcast(tu_pg, t, 0));
  apex_tensor_destroy(t);
  return out;
}

/* Resume across rank counts: ranks 0 and 1 train 2 steps on a group of their own and save; then every
 * rank of the job (3 or 4) resumes from those bytes, sharded, against DDP at this world size resumed
 * from the same bytes. */
static void test_resume_two_to_more(void **state) {
  (void)state;
  int rank = apex_pg_rank(tu_pg), world = apex_pg_world_size(tu_pg);
  if (world < 3) {
    print_message("skipped: needs 3 or more ranks (ctest's test_zero_np3 and _np4)\n");
    skip();
  }
  MPI_Comm two;
  assert_int_equal(MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &two), MPI_SUCCESS);
  const apex_optim_kind kinds[4] = {APEX_OPTIM_ADAMW, APEX_OPTIM_LAMB, APEX_OPTIM_SGD, APEX_OPTIM_NOVOGRAD};
  for (int half = 0; half < 2; half++)
    for (int k = 0; k < 4; k++) {
      apex_optim_kind kind = kinds[k];
      apex_optim_options oo = options_for(kind);
      float scale = half ? 1024.0f : 1.0f;
      uint8_t *mine = NULL;
      size_t size = 0;
      set_t model = make_set(half, 0); /* the model file: rank 0's parameters after step 2 */
      if (rank < 2) {
        apex_pg *pg2 = apex_pg_create_mpi(&(apex_pg_options){.mpi_comm = &two});
        assert_non_null(pg2);
        set_t zs = make_set(half, rank), ref = make_set(half, 0);
        apex_zero *z = apex_zero_create(pg2, zs.p, zs.g, NP, kind, &oo, NULL);
        apex_optimizer *opt = apex_optimizer_create(kind, &oo);
        assert_non_null(z);
        TU_OK(apex_optimizer_add_group(opt, ref.p, NP, ref.g, NP, NULL, NULL));
        steps_on(pg2, z, &zs, opt, &ref, 1, 2, scale);
        apex_optimizer *full = apex_zero_consolidate(z);
        assert_non_null(full);
        size_t rsize = 0;
        mine = save_bytes(full, &size);
        uint8_t *rbuf = save_bytes(opt, &rsize);
        assert_true(size == rsize && memcmp(mine, rbuf, size) == 0);
        for (int i = 0; i < NP; i++) TU_OK(apex_tensor_copy(model.p[i], zs.p[i]));
        free(rbuf);
        apex_optimizer_destroy(full);
        apex_optimizer_destroy(opt);
        apex_zero_destroy(z);
        free_set(&zs), free_set(&ref);
        apex_pg_destroy(pg2);
      }
      uint8_t *bytes = bcast_bytes(mine, &size);
      for (int i = 0; i < NP; i++) TU_OK(apex_pg_broadcast(tu_pg, model.p[i], 0));
      set_t zs = make_set(half, rank + 20), ref = make_set(half, 30);
      for (int i = 0; i < NP; i++) {
        TU_OK(apex_tensor_copy(zs.p[i], model.p[i]));
        TU_OK(apex_tensor_copy(ref.p[i], model.p[i]));
      }
      apex_optimizer *from = loaded(kind, &oo, &zs, bytes, size), *opt = loaded(kind, &oo, &ref, bytes, size);
      apex_zero *z = apex_zero_create(tu_pg, zs.p, zs.g, NP, kind, &oo, &(apex_zero_options){.stage = 2, .bucket_bytes = 3000});
      assert_non_null(z);
      TU_OK(apex_zero_load_state(z, from));
      apex_optimizer_destroy(from);
      steps_on(tu_pg, z, &zs, opt, &ref, 3, 4, scale);
      apex_zero_destroy(z);
      apex_optimizer_destroy(opt);
      free_set(&zs), free_set(&ref), free_set(&model);
      free(mine);
      free(bytes);
    }
  if (two != MPI_COMM_NULL) MPI_Comm_free(&two);
  if (rank == 0) print_message("  2 ranks saved, %d resumed: every step bitwise DDP's\n", world);
}
#endif

static void test_bad_input(void **state) {
  (void)state;
  int world = apex_pg_world_size(tu_pg);
  set_t s = make_set(0, 0);
  apex_tensor *p2[NP], *g2[NP];
  memcpy(p2, s.p, sizeof p2);
  memcpy(g2, s.g, sizeof g2);
  TU_FAILS(apex_zero_create(NULL, s.p, s.g, NP, APEX_OPTIM_ADAM, NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG,
           "apex_zero_create: pg is NULL");
  TU_FAILS(apex_zero_create(tu_pg, s.p, s.g, 0, APEX_OPTIM_ADAM, NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG,
           "need at least one parameter");
  TU_FAILS(apex_zero_create(tu_pg, s.p, s.g, NP, APEX_OPTIM_ADAM, NULL, &(apex_zero_options){.stage = 3}) ? APEX_OK : apex_last_status(),
           APEX_ERR_INVALID_ARG, "stage 3 is not implemented");
  TU_FAILS(apex_zero_create(tu_pg, s.p, s.g, NP, APEX_OPTIM_KIND_COUNT, NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG,
           "invalid optimizer kind");
  g2[1] = s.g[0];
  TU_FAILS(apex_zero_create(tu_pg, s.p, g2, NP, APEX_OPTIM_ADAM, NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_SHAPE,
           "gradient 1 has another shape than its parameter");
  g2[1] = s.g[1];
  p2[1] = s.p[3];
  g2[1] = s.g[3];
  TU_FAILS(apex_zero_create(tu_pg, p2, g2, NP, APEX_OPTIM_ADAM, NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG,
           "parameter 3 is listed twice (also at 1)");
  apex_tensor *h = apex_tensor_create(APEX_F16, NDIM[0], SHAPES[0]);
  memcpy(g2, s.g, sizeof g2);
  g2[0] = h;
  TU_FAILS(apex_zero_create(tu_pg, s.p, g2, NP, APEX_OPTIM_ADAM, NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_DTYPE,
           "gradient 0 is f16 but its parameter f32");
  TU_FAILS(apex_zero_create(tu_pg, s.p, s.g, NP, APEX_OPTIM_ADAM, &(apex_optim_options){.momentum = 0.5f}, NULL) ? APEX_OK : apex_last_status(),
           APEX_ERR_INVALID_ARG, "momentum");

  set_t hs = make_set(1, 0);
  apex_tensor *mv[NP];
  memcpy(mv, hs.p, sizeof mv);
  TU_FAILS(apex_zero_create(tu_pg, hs.p, hs.g, NP, APEX_OPTIM_ADAM, NULL, &(apex_zero_options){.master_values = mv}) ? APEX_OK : apex_last_status(),
           APEX_ERR_DTYPE, "master_values[0] is f16; masters are f32");
  mv[0] = s.p[0];
  mv[1] = s.p[0];
  TU_FAILS(apex_zero_create(tu_pg, hs.p, hs.g, NP, APEX_OPTIM_ADAM, NULL, &(apex_zero_options){.master_values = mv}) ? APEX_OK : apex_last_status(),
           APEX_ERR_SHAPE, "master_values[1] has another shape or device than parameter 1");
  mv[1] = NULL;
  TU_FAILS(apex_zero_create(tu_pg, hs.p, hs.g, NP, APEX_OPTIM_ADAM, NULL, &(apex_zero_options){.master_values = mv}) ? APEX_OK : apex_last_status(),
           APEX_ERR_INVALID_ARG, "master_values[1] is NULL (parameter 1 is f16)");
  free_set(&hs);

  apex_zero *z = apex_zero_create(tu_pg, s.p, s.g, NP, APEX_OPTIM_ADAM, NULL, NULL);
  assert_non_null(z);
  int of = 0;
  TU_FAILS(apex_zero_step(z, 1.0f, &of), APEX_ERR_STATE, "call apex_zero_reduce_grads before each step");
  TU_FAILS(apex_zero_clip_grad_norm(z, 1.0f, 1.0f, NULL), APEX_ERR_STATE, "call apex_zero_reduce_grads first");
  TU_FAILS(apex_zero_gather_grads(z), APEX_ERR_STATE, "call apex_zero_reduce_grads first");
  TU_FAILS(apex_zero_gather_grads(NULL), APEX_ERR_INVALID_ARG, "z is NULL");
  TU_FAILS(apex_zero_reduce_overflow(z, &of), APEX_ERR_STATE, "call apex_zero_reduce_grads first");
  TU_FAILS(apex_zero_reduce_overflow(z, NULL), APEX_ERR_INVALID_ARG, "flag is NULL");
  TU_FAILS(apex_zero_step(NULL, 1.0f, &of), APEX_ERR_INVALID_ARG, "z is NULL");
  TU_FAILS(apex_zero_reduce_grads(NULL), APEX_ERR_INVALID_ARG, "z is NULL");
  TU_FAILS(apex_zero_step(z, 0.0f, &of), APEX_ERR_INVALID_ARG, "grad_scale is 0");
  TU_FAILS(apex_zero_clip_grad_norm(z, -1.0f, 1.0f, NULL), APEX_ERR_INVALID_ARG, "max_norm is -1");
  TU_FAILS(apex_zero_set_lr(z, NAN), APEX_ERR_INVALID_ARG, "lr is nan");
  TU_OK(apex_zero_set_lr(z, 0.25f));
  assert_true(apex_zero_get_lr(z) == 0.25f);
  size_t b, e;
  TU_FAILS(apex_zero_shard_range(z, world, &b, &e), APEX_ERR_INVALID_ARG, "outside [0,");
  TU_FAILS(apex_zero_shard_range(z, 0, NULL, &e), APEX_ERR_INVALID_ARG, "begin is NULL");
  assert_int_equal(apex_zero_state_bytes(NULL), 0);
  /* One reduce allows one step. */
  for (int i = 0; i < NP; i++) TU_OK(apex_tensor_fill(s.g[i], 0.0f));
  TU_OK(apex_zero_reduce_grads(z));
  TU_OK(apex_zero_step(z, 1.0f, NULL));
  TU_FAILS(apex_zero_step(z, 1.0f, NULL), APEX_ERR_STATE, "before each step");
  apex_zero_destroy(z);
  apex_zero_destroy(NULL);

  /* overlap's calls. */
  z = apex_zero_create(tu_pg, s.p, s.g, NP, APEX_OPTIM_ADAM, NULL, NULL);
  apex_graph *graph = apex_graph_create();
  TU_FAILS(apex_zero_attach(z, graph), APEX_ERR_STATE, "made without overlap");
  TU_FAILS(apex_zero_mark_ready(z, 0), APEX_ERR_STATE, "made without overlap");
  apex_zero_destroy(z);
  z = apex_zero_create(tu_pg, s.p, s.g, NP, APEX_OPTIM_ADAM, NULL, &(apex_zero_options){.overlap = 1});
  assert_non_null(z);
  TU_FAILS(apex_zero_attach(z, NULL), APEX_ERR_INVALID_ARG, "graph is NULL");
  TU_FAILS(apex_zero_attach(NULL, graph), APEX_ERR_INVALID_ARG, "z is NULL");
  TU_OK(apex_zero_attach(z, graph));
  TU_FAILS(apex_zero_mark_ready(z, NP), APEX_ERR_INVALID_ARG, "parameter 5 is not in [0, 5)");
  TU_OK(apex_zero_mark_ready(z, 2));
  TU_FAILS(apex_zero_mark_ready(z, 2), APEX_ERR_STATE, "already marked");
  TU_OK(apex_zero_reduce_grads(z));
  TU_OK(apex_zero_mark_ready(z, 2)); /* a new step */
  TU_OK(apex_zero_reduce_grads(z));
  apex_graph_destroy(graph);
  apex_zero_destroy(z);

  /* The reduce-scatter's own checks. */
  int64_t n = 4, all = 4 * world, wrong = 4 * world + 1;
  apex_tensor *in = apex_tensor_create(APEX_F32, 1, &all), *out = apex_tensor_create(APEX_F32, 1, &n);
  apex_tensor *bad = apex_tensor_create(APEX_F32, 1, &wrong), *o16 = apex_tensor_create(APEX_F16, 1, &n);
  TU_FAILS(apex_pg_reduce_scatter(NULL, in, out, APEX_REDUCE_SUM), APEX_ERR_INVALID_ARG, "pg is NULL");
  TU_FAILS(apex_pg_reduce_scatter(tu_pg, bad, out, APEX_REDUCE_SUM), APEX_ERR_SHAPE, "needs world_size");
  TU_FAILS(apex_pg_reduce_scatter(tu_pg, in, o16, APEX_REDUCE_SUM), APEX_ERR_DTYPE, "in is f32 but out is f16");
  TU_FAILS(apex_pg_reduce_scatter(tu_pg, in, out, (apex_reduce_op)9), APEX_ERR_INVALID_ARG, "unknown op 9");
  apex_tensor *alias = apex_tensor_slice_view(in, 0, 1, &n);
  TU_FAILS(apex_pg_reduce_scatter(tu_pg, in, alias, APEX_REDUCE_SUM), APEX_ERR_INVALID_ARG, "share storage");
  apex_pg_work *w = NULL;
  TU_FAILS(apex_pg_reduce_scatter_async(tu_pg, in, out, APEX_REDUCE_SUM, NULL), APEX_ERR_INVALID_ARG, "work is NULL");
  {
    size_t counts[8] = {0};
    counts[0] = apex_tensor_numel(in);
    TU_FAILS(apex_pg_reduce_scatter_v(tu_pg, in, out, NULL, APEX_REDUCE_SUM), APEX_ERR_INVALID_ARG, "counts is NULL");
    counts[0] += 1;
    TU_FAILS(apex_pg_reduce_scatter_v(tu_pg, in, out, counts, APEX_REDUCE_SUM), APEX_ERR_SHAPE, "the counts add up to");
    counts[0] -= 1;
    if (apex_pg_rank(tu_pg) != 0) TU_FAILS(apex_pg_reduce_scatter_v(tu_pg, in, out, counts, APEX_REDUCE_SUM), APEX_ERR_SHAPE, "out has");
    else TU_FAILS(apex_pg_reduce_scatter_v(tu_pg, in, NULL, counts, APEX_REDUCE_SUM), APEX_ERR_SHAPE, "(out is NULL)");
  }
  assert_null(w);
  apex_tensor *tmp[] = {in, out, bad, o16, alias, h};
  for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) apex_tensor_destroy(tmp[i]);
  free_set(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_scatter_is_allreduce), cmocka_unit_test(test_shards),
      cmocka_unit_test(test_o0_matches_ddp),  cmocka_unit_test(test_o2_matches_ddp),
      cmocka_unit_test(test_clip_matches_ddp), cmocka_unit_test(test_stage2_matches_ddp),
      cmocka_unit_test(test_master_values),
      cmocka_unit_test(test_checkpoint), cmocka_unit_test(test_bad_input),
#if APEX_TEST_MPI
      cmocka_unit_test(test_resume_two_to_more),
#endif
  };
  return cmocka_run_group_tests(tests, tu_pg_setup, tu_pg_teardown);
}
