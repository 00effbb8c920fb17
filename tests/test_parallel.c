/* test_parallel.c: process groups, the Reducer and SyncBatchNorm statistics.
 *
 * ctest runs this program three ways (tests/test_parallel.cmake): alone (the local backend, and the
 * argument checks), and under `mpirun -np 2` and `-np 3` (every case again on the MPI backend). Each
 * case is one body run on a group; the MPI variants skip, saying why, when the program was not
 * started by mpirun or apex has no MPI. Expected values are closed forms in the rank r and the world
 * size W (rank r contributes r + 1 + i % 64, exact in every dtype), or are recomputed on every rank
 * from every rank's data, which each rank can regenerate from its seed: sums in rank order in f32,
 * as parallel.h documents, so results must match bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

static apex_pg *g_mpi;          /* the MPI group, or NULL */
static const char *g_skip = ""; /* why there is none */

#define NEED_MPI()                                                                                         \
  do {                                                                                                     \
    if (!g_mpi) {                                                                                          \
      print_message("skipped: %s\n", g_skip);                                                              \
      skip();                                                                                              \
    }                                                                                                      \
  } while (0)

static const apex_dtype dtypes[3] = {APEX_F32, APEX_F16, APEX_BF16};

static float rnd(apex_dtype dt, float v) {
  uint16_t h;
  if (dt == APEX_F32) return v;
  assert_int_equal(apex_convert(&h, dt, &v, APEX_F32, 1), APEX_OK);
  float back;
  assert_int_equal(apex_convert(&back, APEX_F32, &h, dt, 1), APEX_OK);
  return back;
}

static apex_tensor *tensor_1d(apex_dtype dt, size_t n) {
  int64_t shape = (int64_t)n;
  apex_tensor *t = apex_tensor_create(dt, 1, &shape);
  assert_non_null(t);
  return t;
}

static void assert_bits(float got, float want, const char *what, size_t i) {
  if (tu_bits(got) != tu_bits(want)) fail_msg("%s[%zu]: got %.9g (0x%08x), expected %.9g (0x%08x)", what, i, got, tu_bits(got), want, tu_bits(want));
}

/* Checks that every rank holds the same bits in t (rank 0's, broadcast). */
static void assert_same_on_all_ranks(apex_pg *pg, apex_tensor *t) {
  apex_tensor *copy = apex_tensor_clone(t);
  TU_OK(apex_pg_broadcast(pg, copy, 0));
  assert_memory_equal(apex_tensor_data(copy), apex_tensor_data(t), apex_tensor_nbytes(t));
  apex_tensor_destroy(copy);
}

/* ---- collectives ----------------------------------------------------------------------------------- */

static void body_allreduce(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  const size_t sizes[] = {1, 2, 7, 1000, 4099};
  for (int d = 0; d < 3; d++)
    for (int op = 0; op < 3; op++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        apex_tensor *t = tensor_1d(dtypes[d], n);
        for (size_t i = 0; i < n; i++) apex_tensor_set(t, i, (float)(r + 1) + (float)(i % 64));
        TU_OK(apex_pg_allreduce(pg, t, (apex_reduce_op)op));
        for (size_t i = 0; i < n; i++) {
          float k = (float)(i % 64), want;
          if (op == APEX_REDUCE_SUM) want = (float)(w * (w + 1) / 2) + (float)w * k;
          else if (op == APEX_REDUCE_AVG) want = ((float)(w * (w + 1) / 2) + (float)w * k) / (float)w;
          else want = (float)w + k;
          if (apex_tensor_get(t, i) != want)
            fail_msg("%s op %d n %zu [%zu]: got %g, expected %g", apex_dtype_name(dtypes[d]), op, n, i, apex_tensor_get(t, i), want);
        }
        apex_tensor_destroy(t);
      }
}

/* Values that round: the sum must be the rank-order f32 sum of every rank's values, rounded once. */
static void body_allreduce_rank_order(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  const size_t n = 3001;
  for (int d = 0; d < 3; d++) {
    apex_tensor *mine = tu_random_tensor(dtypes[d], n, 100 + (uint64_t)r, 1000.0f);
    apex_tensor *sum = apex_tensor_clone(mine), *avg = apex_tensor_clone(mine);
    TU_OK(apex_pg_allreduce(pg, sum, APEX_REDUCE_SUM));
    TU_OK(apex_pg_allreduce(pg, avg, APEX_REDUCE_AVG));
    apex_tensor **all = malloc((size_t)w * sizeof *all);
    for (int p = 0; p < w; p++) all[p] = tu_random_tensor(dtypes[d], n, 100 + (uint64_t)p, 1000.0f);
    for (size_t i = 0; i < n; i++) {
      float acc = apex_tensor_get(all[0], i);
      for (int p = 1; p < w; p++) acc += apex_tensor_get(all[p], i);
      assert_bits(apex_tensor_get(sum, i), rnd(dtypes[d], acc), "sum", i);
      assert_bits(apex_tensor_get(avg, i), rnd(dtypes[d], acc / (float)w), "avg", i);
    }
    assert_same_on_all_ranks(pg, sum);
    for (int p = 0; p < w; p++) apex_tensor_destroy(all[p]);
    free(all);
    apex_tensor_destroy(mine);
    apex_tensor_destroy(sum);
    apex_tensor_destroy(avg);
  }
}

static void body_max_nan(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  apex_tensor *t = tensor_1d(APEX_F16, 3);
  apex_tensor_set(t, 0, r == w - 1 ? NAN : 1.0f);
  apex_tensor_set(t, 1, -(float)r);
  apex_tensor_set(t, 2, r == 0 ? INFINITY : 0.0f);
  TU_OK(apex_pg_allreduce(pg, t, APEX_REDUCE_MAX));
  assert_true(isnan(apex_tensor_get(t, 0)));
  assert_true(apex_tensor_get(t, 1) == 0.0f);
  assert_true(apex_tensor_get(t, 2) == INFINITY);
  apex_tensor_destroy(t);
}

static void body_broadcast(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  const size_t n = 1500;
  for (int d = 0; d < 3; d++)
    for (int root = 0; root < w; root++) {
      apex_tensor *t = tensor_1d(dtypes[d], n);
      for (size_t i = 0; i < n; i++) apex_tensor_set(t, i, r == root ? (float)(root * 100) + (float)(i % 50) : -1.0f);
      TU_OK(apex_pg_broadcast(pg, t, root));
      for (size_t i = 0; i < n; i++) assert_true(apex_tensor_get(t, i) == (float)(root * 100) + (float)(i % 50));
      apex_tensor_destroy(t);
    }
}

static void body_allgather(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  const size_t n = 777;
  for (int d = 0; d < 3; d++) {
    apex_tensor *in = tensor_1d(dtypes[d], n), *out = tensor_1d(dtypes[d], n * (size_t)w);
    for (size_t i = 0; i < n; i++) apex_tensor_set(in, i, (float)(r * 10) + (float)(i % 10));
    TU_OK(apex_pg_allgather(pg, in, out));
    for (int p = 0; p < w; p++)
      for (size_t i = 0; i < n; i++) assert_true(apex_tensor_get(out, (size_t)p * n + i) == (float)(p * 10) + (float)(i % 10));
    apex_tensor_destroy(in);
    apex_tensor_destroy(out);
  }
  TU_OK(apex_pg_barrier(pg));
}

/* Several collectives in flight at once, advanced with test and finished in another order. */
static void body_async(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  const size_t n = 20000;
  apex_tensor *a[3], *b = tensor_1d(APEX_BF16, n), *in = tensor_1d(APEX_F16, n), *out = tensor_1d(APEX_F16, n * (size_t)w);
  apex_pg_work *wa[3], *wb, *wg, *wbar;
  for (int d = 0; d < 3; d++) {
    a[d] = tensor_1d(dtypes[d], n);
    for (size_t i = 0; i < n; i++) apex_tensor_set(a[d], i, (float)(r + 1) + (float)(i % 64));
    TU_OK(apex_pg_allreduce_async(pg, a[d], APEX_REDUCE_SUM, &wa[d]));
  }
  for (size_t i = 0; i < n; i++) apex_tensor_set(b, i, r == w - 1 ? (float)(i % 128) : 0.0f);
  for (size_t i = 0; i < n; i++) apex_tensor_set(in, i, (float)r);
  TU_OK(apex_pg_broadcast_async(pg, b, w - 1, &wb));
  TU_OK(apex_pg_allgather_async(pg, in, out, &wg));
  TU_OK(apex_pg_barrier_async(pg, &wbar));
  int done = 0;
  for (int spins = 0; !done && spins < 1000000; spins++) TU_OK(apex_pg_test(wa[0], &done));
  TU_OK(apex_pg_wait(wbar));
  TU_OK(apex_pg_wait(wg));
  for (int d = 2; d >= 0; d--) TU_OK(apex_pg_wait(wa[d]));
  TU_OK(apex_pg_wait(wb));
  for (size_t i = 0; i < n; i++) {
    float want = (float)(w * (w + 1) / 2) + (float)w * (float)(i % 64);
    for (int d = 0; d < 3; d++) assert_true(apex_tensor_get(a[d], i) == want);
    assert_true(apex_tensor_get(b, i) == (float)(i % 128));
  }
  for (int p = 0; p < w; p++) assert_true(apex_tensor_get(out, (size_t)p * n + 5) == (float)p);
  for (int d = 0; d < 3; d++) apex_tensor_destroy(a[d]);
  apex_tensor_destroy(b);
  apex_tensor_destroy(in);
  apex_tensor_destroy(out);
}

static void body_flag(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  int flag = r == w - 1 ? 7 : 0;
  TU_OK(apex_pg_allreduce_flag(pg, &flag));
  assert_int_equal(flag, 1);
  flag = 0;
  TU_OK(apex_pg_allreduce_flag(pg, &flag));
  assert_int_equal(flag, 0);
}

/* ---- the Reducer ------------------------------------------------------------------------------------- */

enum { NGRADS = 6 };
static const size_t grad_sizes[NGRADS] = {1000, 10, 5000, 3, 2048, 1};
static const apex_dtype grad_dtypes[NGRADS] = {APEX_F32, APEX_F16, APEX_BF16, APEX_F32, APEX_F16, APEX_BF16};

static apex_tensor *grad_of(int rank, int i, int step) {
  return tu_random_tensor(grad_dtypes[i], grad_sizes[i], 1000 * (uint64_t)rank + 10 * (uint64_t)i + (uint64_t)step, 4.0f);
}

/* What the Reducer must produce for gradient i, element j (see reducer in parallel.h). */
static float reducer_expect(apex_tensor *const *per_rank, int w, size_t j, apex_dtype gd, const apex_reducer_options *o) {
  apex_dtype bd = o->allreduce_always_fp32 ? APEX_F32 : gd;
  float f = o->gradient_predivide_factor == 0.0f ? 1.0f : o->gradient_predivide_factor;
  float pre = 1.0f / f, post = o->sum_only ? 1.0f : f / (float)w;
  float acc = 0.0f;
  for (int p = 0; p < w; p++) {
    float b = apex_tensor_get(per_rank[p], j);
    if (pre != 1.0f) b *= pre;
    b = rnd(bd, b);
    acc = p == 0 ? b : acc + b;
  }
  float s = rnd(bd, acc);
  return rnd(gd, post != 1.0f ? s * post : s);
}

static void run_reducer(apex_pg *pg, size_t bucket_bytes, apex_reducer_options o) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  o.bucket_bytes = bucket_bytes;
  apex_tensor *grads[NGRADS];
  for (int i = 0; i < NGRADS; i++) grads[i] = grad_of(r, i, 0);
  apex_reducer *red = apex_reducer_create(pg, grads, NGRADS, &o);
  if (!red) fail_msg("apex_reducer_create: %s", apex_last_error());
  if (bucket_bytes == 1 && !o.num_triggers) assert_int_equal(apex_reducer_bucket_count(red), NGRADS);
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < NGRADS; i++) {
      apex_tensor *g = grad_of(r, i, step);
      TU_OK(apex_tensor_copy(grads[i], g));
      apex_tensor_destroy(g);
    }
    /* Odd ranks say "ready" in reverse: the buckets must still be reduced in one order. */
    for (int k = 0; k < NGRADS; k++) TU_OK(apex_reducer_mark_ready(red, r % 2 ? NGRADS - 1 - k : k));
    TU_OK(apex_reducer_finish(red));
    for (int i = 0; i < NGRADS; i++) {
      apex_tensor **per_rank = malloc((size_t)w * sizeof *per_rank);
      for (int p = 0; p < w; p++) per_rank[p] = grad_of(p, i, step);
      for (size_t j = 0; j < grad_sizes[i]; j++) {
        float want = reducer_expect(per_rank, w, j, grad_dtypes[i], &o);
        if (tu_bits(apex_tensor_get(grads[i], j)) != tu_bits(want))
          fail_msg("bucket_bytes %zu fp32 %d sum_only %d predivide %g: grad %d [%zu] = %.9g, expected %.9g", bucket_bytes,
                   o.allreduce_always_fp32, o.sum_only, (double)o.gradient_predivide_factor, i, j, apex_tensor_get(grads[i], j), want);
      }
      for (int p = 0; p < w; p++) apex_tensor_destroy(per_rank[p]);
      free(per_rank);
      assert_same_on_all_ranks(pg, grads[i]);
    }
  }
  apex_reducer_destroy(red);
  for (int i = 0; i < NGRADS; i++) apex_tensor_destroy(grads[i]);
}

static void body_reducer(apex_pg *pg) {
  const size_t buckets[] = {1, 64, 4096, 12000, 0};
  const apex_reducer_options opts[] = {
      {0},
      {.allreduce_always_fp32 = 1},
      {.sum_only = 1},
      {.gradient_predivide_factor = 2.0f},
      {.gradient_predivide_factor = 3.0f, .allreduce_always_fp32 = 1, .sum_only = 1},
  };
  for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++)
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) run_reducer(pg, buckets[b], opts[k]);
}

/* Buckets cut by triggers (Apex's allreduce_trigger_params): bucket_bytes is ignored, a bucket of a
 * dtype ends after each trigger of that dtype, and the values are what any bucketing gives. */
static void body_reducer_triggers(apex_pg *pg) {
  int r = apex_pg_rank(pg);
  apex_tensor *grads[NGRADS];
  for (int i = 0; i < NGRADS; i++) grads[i] = grad_of(r, i, 0);
  const int trig[2] = {3, 0};
  /* Dtypes f32 f16 bf16 f32 f16 bf16: f32 buckets end after 0 and after 3; f16 and bf16 have none. */
  const int want_own[NGRADS] = {0, 1, 2, 3, 1, 2}, want_fp32[NGRADS] = {0, 1, 1, 1, 2, 2};
  for (int fp32 = 0; fp32 < 2; fp32++) {
    apex_reducer_options o = {.bucket_bytes = 1, .allreduce_always_fp32 = fp32, .triggers = trig, .num_triggers = 2};
    apex_reducer *red = apex_reducer_create(pg, grads, NGRADS, &o);
    if (!red) fail_msg("apex_reducer_create: %s", apex_last_error());
    assert_int_equal(apex_reducer_bucket_count(red), fp32 ? 3 : 4);
    for (int i = 0; i < NGRADS; i++) assert_int_equal(apex_reducer_bucket_of(red, i), fp32 ? want_fp32[i] : want_own[i]);
    apex_reducer_destroy(red);
    run_reducer(pg, 1, o);
  }
  const int bad[1] = {NGRADS};
  assert_null(apex_reducer_create(pg, grads, NGRADS, &(apex_reducer_options){.triggers = bad, .num_triggers = 1}));
  tu_assert_message("trigger 0 is gradient 6, outside [0, 6)");
  assert_null(apex_reducer_create(pg, grads, NGRADS, &(apex_reducer_options){.num_triggers = 1}));
  tu_assert_message("triggers is NULL");
  for (int i = 0; i < NGRADS; i++) apex_tensor_destroy(grads[i]);
}

/* A gradient never marked ready is still reduced (no rank waits) and the caller is told. */
static void body_reducer_missing(apex_pg *pg) {
  int w = apex_pg_world_size(pg);
  apex_tensor *g[2] = {tensor_1d(APEX_F32, 5), tensor_1d(APEX_F32, 5)};
  TU_OK(apex_tensor_fill(g[0], 1.0f));
  TU_OK(apex_tensor_fill(g[1], 2.0f));
  apex_reducer *red = apex_reducer_create(pg, g, 2, &(apex_reducer_options){.sum_only = 1, .bucket_bytes = 4});
  assert_non_null(red);
  TU_OK(apex_reducer_mark_ready(red, 0));
  TU_FAILS(apex_reducer_mark_ready(red, 0), APEX_ERR_STATE, "already marked ready");
  TU_FAILS(apex_reducer_finish(red), APEX_ERR_STATE, "gradient 1 was not marked ready");
  assert_true(apex_tensor_get(g[0], 4) == (float)w && apex_tensor_get(g[1], 4) == 2.0f * (float)w);
  TU_OK(apex_reducer_reduce(red)); /* a new step: everything ready */
  assert_true(apex_tensor_get(g[1], 0) == 2.0f * (float)(w * w));
  apex_reducer_destroy(red);
  apex_tensor_destroy(g[0]);
  apex_tensor_destroy(g[1]);
}

/* ---- SyncBatchNorm ------------------------------------------------------------------------------------ */

enum { BN_C = 5, BN_H = 4, BN_W = 3 };

static int64_t bn_batch(int rank) { return rank == 1 ? 0 : 1 + 2 * rank; } /* unequal, and one empty rank */

static apex_tensor *bn_input(apex_dtype dt, int rank, uint64_t salt) {
  int64_t shape[4] = {bn_batch(rank), BN_C, BN_H, BN_W};
  apex_tensor *x = apex_tensor_create(dt, 4, shape);
  size_t n = apex_tensor_numel(x);
  float *tmp = malloc((n ? n : 1) * sizeof *tmp);
  apex_rng rng = apex_rng_init(7000 + 10 * (uint64_t)rank + salt);
  TU_OK(apex_rng_uniform(&rng, tmp, n));
  for (size_t i = 0; i < n; i++) tmp[i] = 3.0f * tmp[i] + (float)((i / (BN_H * BN_W)) % BN_C) - 2.0f; /* channel-dependent mean */
  TU_OK(apex_convert(apex_tensor_data(x), dt, tmp, APEX_F32, n));
  free(tmp);
  return x;
}

/* Element (i, c, s) of every rank's batch, concatenated in rank order, via fn(value, ctx). */
static double bn_direct_sum(apex_dtype dt, int w, int c, uint64_t salt, double (*fn)(double x, double y, const double *k), const double *k,
                            apex_dtype dt2, uint64_t salt2) {
  double acc = 0.0;
  for (int p = 0; p < w; p++) {
    apex_tensor *x = bn_input(dt, p, salt), *y = bn_input(dt2, p, salt2);
    for (int64_t i = 0; i < bn_batch(p); i++)
      for (int s = 0; s < BN_H * BN_W; s++) {
        size_t at = ((size_t)i * BN_C + (size_t)c) * BN_H * BN_W + (size_t)s;
        acc += fn(apex_tensor_get(x, at), apex_tensor_get(y, at), k);
      }
    apex_tensor_destroy(x);
    apex_tensor_destroy(y);
  }
  return acc;
}
static double f_x(double x, double y, const double *k) { return (void)y, (void)k, x; }
static double f_sq(double x, double y, const double *k) { return (void)y, (x - k[0]) * (x - k[0]); }
static double f_dy(double x, double y, const double *k) { return (void)x, (void)k, y; }
static double f_dyxhat(double x, double y, const double *k) { return y * (x - k[0]) * k[1]; }

static void assert_close(double got, double want, double tol, const char *what, int c) {
  if (!(fabs(got - want) <= tol * fmax(fabs(want), 1.0))) fail_msg("%s[%d]: got %.9g, expected %.9g", what, c, got, want);
}

static void body_syncbn(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  int64_t total_n = 0;
  for (int p = 0; p < w; p++) total_n += bn_batch(p);
  if (total_n == 0) return; /* one rank with the empty batch: covered by the error test */
  for (int d = 0; d < 3; d++) {
    apex_dtype dt = dtypes[d];
    apex_tensor *x = bn_input(dt, r, 0), *dy = bn_input(APEX_F32, r, 1);
    apex_tensor *mean = tensor_1d(APEX_F32, BN_C), *invstd = tensor_1d(APEX_F32, BN_C), *uvar = tensor_1d(APEX_F32, BN_C);
    int64_t total = 0;
    const float eps = 1e-5f;
    TU_OK(apex_syncbn_stats(pg, x, mean, invstd, uvar, eps, &total));
    assert_int_equal(total, total_n * BN_H * BN_W);
    apex_tensor *sdy = tensor_1d(APEX_F32, BN_C), *sdx = tensor_1d(APEX_F32, BN_C);
    TU_OK(apex_syncbn_backward_reduce(pg, x, dy, mean, invstd, sdy, sdx));
    for (int c = 0; c < BN_C; c++) {
      double cnt = (double)total;
      double mu = bn_direct_sum(dt, w, c, 0, f_x, NULL, APEX_F32, 1) / cnt;
      double m2 = bn_direct_sum(dt, w, c, 0, f_sq, &mu, APEX_F32, 1);
      assert_close(apex_tensor_get(mean, (size_t)c), mu, 1e-5, "mean", c);
      assert_close(apex_tensor_get(invstd, (size_t)c), 1.0 / sqrt(m2 / cnt + eps), 1e-5, "invstd", c);
      assert_close(apex_tensor_get(uvar, (size_t)c), m2 / (cnt - 1), 1e-5, "unbiased var", c);
      double k[2] = {apex_tensor_get(mean, (size_t)c), apex_tensor_get(invstd, (size_t)c)};
      assert_close(apex_tensor_get(sdy, (size_t)c), bn_direct_sum(dt, w, c, 0, f_dy, k, APEX_F32, 1), 1e-5, "sum_dy", c);
      assert_close(apex_tensor_get(sdx, (size_t)c), bn_direct_sum(dt, w, c, 0, f_dyxhat, k, APEX_F32, 1), 1e-5, "sum_dy_xhat", c);
    }
    assert_same_on_all_ranks(pg, mean);
    assert_same_on_all_ranks(pg, invstd);
    assert_same_on_all_ranks(pg, uvar);
    assert_same_on_all_ranks(pg, sdy);
    assert_same_on_all_ranks(pg, sdx);

    /* dx from the reduced sums against the formula, element by element, in f64. */
    apex_tensor *weight = tensor_1d(APEX_F32, BN_C), *dx = apex_tensor_create(APEX_F32, apex_tensor_ndim(x), apex_tensor_shape(x));
    for (int c = 0; c < BN_C; c++) apex_tensor_set(weight, (size_t)c, 0.5f + (float)c);
    TU_OK(apex_syncbn_backward_input(x, dy, mean, invstd, weight, sdy, sdx, total, dx));
    for (size_t i = 0; i < apex_tensor_numel(x); i++) {
      int c = (int)((i / (BN_H * BN_W)) % BN_C);
      double is = apex_tensor_get(invstd, (size_t)c), xhat = (apex_tensor_get(x, i) - apex_tensor_get(mean, (size_t)c)) * is;
      double want = apex_tensor_get(weight, (size_t)c) * is *
                    (apex_tensor_get(dy, i) - apex_tensor_get(sdy, (size_t)c) / (double)total - xhat * apex_tensor_get(sdx, (size_t)c) / (double)total);
      assert_close(apex_tensor_get(dx, i), want, 1e-5, "dx", c);
    }
    apex_tensor_destroy(weight);
    apex_tensor_destroy(dx);
    apex_tensor_destroy(x);
    apex_tensor_destroy(dy);
    apex_tensor_destroy(mean);
    apex_tensor_destroy(invstd);
    apex_tensor_destroy(uvar);
    apex_tensor_destroy(sdy);
    apex_tensor_destroy(sdx);
  }
}

/* ---- ranks that disagree ------------------------------------------------------------------------------- */

static void body_consistency(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg);
  int64_t s0[2] = {4, 5}, s1[1] = {5};
  apex_tensor *t[3] = {apex_tensor_create(APEX_F32, 2, s0), apex_tensor_create(APEX_F32, 1, s1), apex_tensor_create(APEX_BF16, 1, s1)};
  const char *names[3] = {"fc.weight", "fc.bias", "norm.weight"};
  TU_OK(apex_pg_check_consistent(pg, names, t, 3));
  TU_OK(apex_pg_check_consistent(pg, NULL, t, 3));
  if (w == 1) goto out; /* nothing can differ */
  char msg[256];
  /* A shape on the last rank. */
  int64_t s0b[2] = {4, 6};
  apex_tensor *other = apex_tensor_create(APEX_F32, 2, s0b);
  apex_tensor *tt[3] = {r == w - 1 ? other : t[0], t[1], t[2]};
  snprintf(msg, sizeof msg, "parameter 0 ('fc.weight') has shape [4, 5] on rank 0 but [4, 6] on rank %d", w - 1);
  TU_FAILS(apex_pg_check_consistent(pg, names, tt, 3), APEX_ERR_SHAPE, msg);
  apex_tensor_destroy(other);
  /* A dtype on rank 1. */
  other = apex_tensor_create(APEX_F16, 1, s1);
  apex_tensor *td[3] = {t[0], t[1], r == 1 ? other : t[2]};
  TU_FAILS(apex_pg_check_consistent(pg, names, td, 3), APEX_ERR_DTYPE, "parameter 2 ('norm.weight') is bf16 on rank 0 but f16 on rank 1");
  apex_tensor_destroy(other);
  /* A name, and a missing parameter. */
  const char *names2[3] = {"fc.weight", r == 1 ? "fc.b" : "fc.bias", "norm.weight"};
  TU_FAILS(apex_pg_check_consistent(pg, names2, t, 3), APEX_ERR_INVALID_ARG, "parameter 1 is named 'fc.bias' on rank 0 but 'fc.b' on rank 1");
  TU_FAILS(apex_pg_check_consistent(pg, names, t, r == 1 ? 2 : 3), APEX_ERR_INVALID_ARG,
           "rank 0 has 3 parameters but rank 1 has 2; parameter 2 ('norm.weight') is only on rank 0");
  /* A bad argument on one rank: it gets its own error, the others are told, nobody hangs. */
  apex_tensor *tn[3] = {t[0], r == 1 ? NULL : t[1], t[2]};
  if (r == 1) TU_FAILS(apex_pg_check_consistent(pg, names, tn, 3), APEX_ERR_INVALID_ARG, "tensor 1 is NULL");
  else TU_FAILS(apex_pg_check_consistent(pg, names, tn, 3), APEX_ERR_INVALID_ARG, "rank 1 passed invalid arguments");
  /* The Reducer refuses ranks that disagree, on every rank. */
  other = apex_tensor_create(APEX_F16, 1, s1);
  apex_tensor *tr[3] = {t[0], t[1], r == 1 ? other : t[2]};
  assert_null(apex_reducer_create(pg, tr, 3, NULL));
  tu_assert_message("models differ across ranks: parameter 2 ('parameter 2') is bf16 on rank 0 but f16 on rank 1");
  /* ... or options that cut other buckets. */
  assert_null(apex_reducer_create(pg, t, 3, &(apex_reducer_options){.allreduce_always_fp32 = r == 1}));
  tu_assert_message("parameter 2 is named 'gradient 2 (bucket 1, reduced in bf16)' on rank 0 but 'gradient 2 (bucket 0, reduced in f32)' on rank 1");
  const int trig1[1] = {1};
  assert_null(apex_reducer_create(pg, t, 3, &(apex_reducer_options){.allreduce_always_fp32 = 1, .triggers = trig1, .num_triggers = r == 1}));
  tu_assert_message("parameter 2 is named 'gradient 2 (bucket 0, reduced in f32)' on rank 0 but 'gradient 2 (bucket 1, reduced in f32)' on rank 1");
  apex_tensor_destroy(other);
  /* SyncBN with another channel count on the last rank. */
  int64_t xs[3] = {2, r == w - 1 ? 4 : 3, 2};
  apex_tensor *x = apex_tensor_create(APEX_F32, 3, xs), *m = tensor_1d(APEX_F32, (size_t)xs[1]), *is = tensor_1d(APEX_F32, (size_t)xs[1]);
  snprintf(msg, sizeof msg, "x has 3 channels on rank 0 but 4 on rank %d", w - 1);
  TU_FAILS(apex_syncbn_stats(pg, x, m, is, NULL, 1e-5f, NULL), APEX_ERR_SHAPE, msg);
  /* ... and a bad eps on rank 0 only. */
  if (r == 0) TU_FAILS(apex_syncbn_stats(pg, x, m, is, NULL, -1.0f, NULL), APEX_ERR_INVALID_ARG, "eps must be");
  else TU_FAILS(apex_syncbn_stats(pg, x, m, is, NULL, 1e-5f, NULL), APEX_ERR_INVALID_ARG, "rank 0 passed invalid arguments");
  apex_tensor_destroy(x);
  apex_tensor_destroy(m);
  apex_tensor_destroy(is);
out:
  for (int i = 0; i < 3; i++) apex_tensor_destroy(t[i]);
}

/* A collective that MPI fails comes back as APEX_ERR_IO with MPI's message: a broadcast whose root
 * sends more elements than the others expect truncates on the receivers. */
static void body_mpi_error(apex_pg *pg) {
  int r = apex_pg_rank(pg);
  apex_tensor *t = tensor_1d(APEX_F32, r == 0 ? 8 : 4);
  apex_status st = apex_pg_broadcast(pg, t, 0);
  if (r == 0) TU_OK(st);
  else {
    if (st != APEX_ERR_IO) fail_msg("expected APEX_ERR_IO, got %s: %s", apex_status_name(st), apex_last_error());
    tu_assert_message("broadcast failed on rank");
    tu_assert_message("truncat");
  }
  apex_tensor_destroy(t);
  TU_OK(apex_pg_barrier(pg)); /* the group still works */
}

/* ---- cases: each body on the local group, and on the MPI group ------------------------------------------ */

#define CASES(X)                                                                                           \
  X(allreduce) X(allreduce_rank_order) X(max_nan) X(broadcast) X(allgather) X(async) X(flag) X(reducer)    \
  X(reducer_triggers) X(reducer_missing) X(syncbn) X(consistency)

#define DEFINE_CASE(name)                                                                                  \
  static void test_local_##name(void **state) {                                                            \
    (void)state;                                                                                           \
    apex_pg *pg = apex_pg_create_local();                                                                  \
    assert_non_null(pg);                                                                                   \
    body_##name(pg);                                                                                       \
    apex_pg_destroy(pg);                                                                                   \
  }                                                                                                        \
  static void test_mpi_##name(void **state) {                                                              \
    (void)state;                                                                                           \
    NEED_MPI();                                                                                            \
    body_##name(g_mpi);                                                                                    \
  }
CASES(DEFINE_CASE)

static void test_mpi_error(void **state) {
  (void)state;
  NEED_MPI();
  if (apex_pg_world_size(g_mpi) < 2) skip();
  body_mpi_error(g_mpi);
}

/* Groups can be created and destroyed again (MPI is finalised only at exit). */
static void test_mpi_recreate(void **state) {
  (void)state;
  NEED_MPI();
  for (int k = 0; k < 3; k++) {
    apex_pg *pg = apex_pg_create_mpi(NULL);
    if (!pg) fail_msg("apex_pg_create_mpi: %s", apex_last_error());
    assert_string_equal(apex_pg_backend(pg), "mpi");
    assert_int_equal(apex_pg_rank(pg), apex_pg_rank(g_mpi));
    body_flag(pg);
    apex_pg_destroy(pg);
  }
}

/* ---- bad input (local group: the same checks run before any backend) -------------------------------------- */

static void test_bad_input(void **state) {
  (void)state;
  apex_pg *pg = apex_pg_create_local();
  assert_string_equal(apex_pg_backend(pg), "local");
  assert_int_equal(apex_pg_rank(pg), 0);
  assert_int_equal(apex_pg_world_size(pg), 1);
  assert_int_equal(apex_pg_rank(NULL), -1);
  tu_assert_message("apex_pg_rank: NULL process group");
  assert_int_equal(apex_pg_world_size(NULL), -1);
  assert_string_equal(apex_pg_backend(NULL), "");
  assert_int_equal(apex_pg_device(pg), APEX_DEVICE_CPU);
  assert_int_equal(apex_pg_device(NULL), APEX_DEVICE_NONE); /* not the CPU: there is no group */
  tu_assert_message("apex_pg_device: NULL process group");
  apex_tensor *t = tensor_1d(APEX_F32, 4), *h = tensor_1d(APEX_F16, 4), *o = tensor_1d(APEX_F32, 5);
  apex_pg_work *w = (apex_pg_work *)&w;
  TU_FAILS(apex_pg_allreduce(NULL, t, APEX_REDUCE_SUM), APEX_ERR_INVALID_ARG, "pg is NULL");
  TU_FAILS(apex_pg_allreduce(pg, NULL, APEX_REDUCE_SUM), APEX_ERR_INVALID_ARG, "the tensor is NULL");
  TU_FAILS(apex_pg_allreduce(pg, t, (apex_reduce_op)9), APEX_ERR_INVALID_ARG, "unknown op 9");
  TU_FAILS(apex_pg_allreduce_async(pg, t, APEX_REDUCE_SUM, NULL), APEX_ERR_INVALID_ARG, "work is NULL");
  TU_FAILS(apex_pg_allreduce_async(pg, NULL, APEX_REDUCE_SUM, &w), APEX_ERR_INVALID_ARG, "is NULL");
  assert_null(w);
  TU_FAILS(apex_pg_broadcast(pg, t, 1), APEX_ERR_INVALID_ARG, "root 1 is not a rank (world size 1)");
  TU_FAILS(apex_pg_broadcast(pg, t, -1), APEX_ERR_INVALID_ARG, "root -1");
  TU_FAILS(apex_pg_allgather(pg, t, h), APEX_ERR_DTYPE, "in is f32 but out is f16");
  TU_FAILS(apex_pg_allgather(pg, t, o), APEX_ERR_SHAPE, "out has 5 elements but needs world_size (1) x 4 = 4");
  TU_FAILS(apex_pg_allgather(pg, t, t), APEX_ERR_INVALID_ARG, "share storage");
  TU_FAILS(apex_pg_barrier(NULL), APEX_ERR_INVALID_ARG, "pg is NULL");
  TU_FAILS(apex_pg_wait(NULL), APEX_ERR_INVALID_ARG, "work is NULL");
  TU_FAILS(apex_pg_test(NULL, NULL), APEX_ERR_INVALID_ARG, "work is NULL");
  TU_FAILS(apex_pg_allreduce_flag(pg, NULL), APEX_ERR_INVALID_ARG, "flag is NULL");
  TU_FAILS(apex_pg_check_consistent(NULL, NULL, &t, 1), APEX_ERR_INVALID_ARG, "pg is NULL");
  TU_FAILS(apex_pg_check_consistent(pg, NULL, &t, -1), APEX_ERR_INVALID_ARG, "negative parameter count");
  apex_tensor *tn[2] = {t, NULL};
  TU_FAILS(apex_pg_check_consistent(pg, NULL, tn, 2), APEX_ERR_INVALID_ARG, "tensor 1 is NULL");
  const char *nn[1] = {NULL};
  TU_FAILS(apex_pg_check_consistent(pg, nn, &t, 1), APEX_ERR_INVALID_ARG, "name 0 is NULL");

  /* The Reducer. */
  assert_null(apex_reducer_create(NULL, &t, 1, NULL));
  tu_assert_message("pg is NULL");
  assert_null(apex_reducer_create(pg, &t, 0, NULL));
  tu_assert_message("need at least one gradient");
  assert_null(apex_reducer_create(pg, tn, 2, NULL));
  tu_assert_message("gradient 1 is NULL");
  apex_tensor *twice[2] = {t, t};
  assert_null(apex_reducer_create(pg, twice, 2, NULL));
  tu_assert_message("gradient 1 is listed twice");
  assert_null(apex_reducer_create(pg, &t, 1, &(apex_reducer_options){.gradient_predivide_factor = -2.0f}));
  tu_assert_message("gradient_predivide_factor must be positive");
  apex_reducer *red = apex_reducer_create(pg, &t, 1, NULL);
  assert_non_null(red);
  TU_FAILS(apex_reducer_mark_ready(red, 1), APEX_ERR_INVALID_ARG, "gradient 1 is not in [0, 1)");
  TU_FAILS(apex_reducer_mark_ready(NULL, 0), APEX_ERR_INVALID_ARG, "reducer is NULL");
  TU_FAILS(apex_reducer_finish(NULL), APEX_ERR_INVALID_ARG, "reducer is NULL");
  assert_int_equal(apex_reducer_bucket_of(red, 5), -1);
  apex_reducer_destroy(red);

  /* SyncBN. */
  int64_t xs[3] = {2, 3, 2};
  apex_tensor *x = apex_tensor_create(APEX_F32, 3, xs), *m = tensor_1d(APEX_F32, 3), *is = tensor_1d(APEX_F32, 3), *m16 = tensor_1d(APEX_F16, 3);
  TU_FAILS(apex_syncbn_stats(NULL, x, m, is, NULL, 1e-5f, NULL), APEX_ERR_INVALID_ARG, "pg is NULL");
  TU_FAILS(apex_syncbn_stats(pg, NULL, m, is, NULL, 1e-5f, NULL), APEX_ERR_INVALID_ARG, "x is NULL");
  TU_FAILS(apex_syncbn_stats(pg, t, m, is, NULL, 1e-5f, NULL), APEX_ERR_INVALID_ARG, "x has 1 dimensions");
  TU_FAILS(apex_syncbn_stats(pg, x, m16, is, NULL, 1e-5f, NULL), APEX_ERR_DTYPE, "mean_out is f16");
  TU_FAILS(apex_syncbn_stats(pg, x, t, is, NULL, 1e-5f, NULL), APEX_ERR_SHAPE, "mean_out has 4 elements but x has 3 channels");
  TU_FAILS(apex_syncbn_stats(pg, x, m, is, NULL, NAN, NULL), APEX_ERR_INVALID_ARG, "eps must be");
  int64_t one[3] = {1, 3, 1};
  apex_tensor *x1 = apex_tensor_create(APEX_F32, 3, one);
  TU_FAILS(apex_syncbn_stats(pg, x1, m, is, NULL, 1e-5f, NULL), APEX_ERR_INVALID_ARG, "needs more than 1");
  apex_tensor *dyw = apex_tensor_create(APEX_F32, 3, one);
  TU_FAILS(apex_syncbn_backward_reduce(pg, x, dyw, m, is, m, is), APEX_ERR_SHAPE, "x is [2, 3, 2] but dy is [1, 3, 1]");
  TU_FAILS(apex_syncbn_backward_input(x, x, m, is, NULL, m, is, 0, x), APEX_ERR_INVALID_ARG, "total_count is 0");
  TU_FAILS(apex_syncbn_backward_input(x, x, m, is, h, m, is, 4, x), APEX_ERR_DTYPE, "weight is f16");

  /* Without MPI in the library, the MPI group says so. */
  if (!apex_pg_mpi_available()) {
    assert_null(apex_pg_create_mpi(NULL));
    tu_assert_message("built without MPI");
  }
  apex_tensor *all[] = {t, h, o, x, m, is, m16, x1, dyw};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  apex_pg_destroy(pg);
}

static int setup(void **state) {
  (void)state;
  const char *why = getenv("APEX_TEST_MPI_SKIP");
  if (why) g_skip = why;
  else if (!apex_pg_mpi_available()) g_skip = "apex was built without MPI (APEX_MPI=OFF or MPI not found)";
  else if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK"))
    g_skip = "not started by mpirun (ctest runs test_parallel_np2 and _np3 for the MPI cases)";
  else {
    g_mpi = apex_pg_create_mpi(NULL);
    if (!g_mpi) {
      fprintf(stderr, "apex_pg_create_mpi failed: %s\n", apex_last_error());
      return -1;
    }
    /* Keep only rank 0's report readable; failures on any rank still fail the run. */
  }
  if (!g_mpi) print_message("MPI cases skipped: %s\n", g_skip);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  apex_pg_destroy(g_mpi);
  return 0;
}

#define LOCAL_ENTRY(name) cmocka_unit_test(test_local_##name),
#define MPI_ENTRY(name) cmocka_unit_test(test_mpi_##name),

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_input),
      CASES(LOCAL_ENTRY) CASES(MPI_ENTRY) cmocka_unit_test(test_mpi_error),
      cmocka_unit_test(test_mpi_recreate),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
