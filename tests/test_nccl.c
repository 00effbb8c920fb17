/* test_nccl.c: the NCCL process group against values computed on the host.
 *
 * ctest runs this program alone (one rank on GPU 0) and under `mpirun -np 2` (tests/test_nccl.cmake).
 * It exits 77, which ctest reports as skipped, saying why, when apex has no NCCL group (built
 * without CUDA, MPI or NCCL: the stub's message is checked first), when there is no GPU (the
 * group's creation is still tried, over MPI, and must fail cleanly), or when a host has fewer GPUs
 * than ranks (NCCL cannot put two ranks of one communicator on one GPU; every rank must refuse).
 * On a GPU machine: tests/gpu/run_nccl.sh. The reduce-scatter and the sharded optimizer (zero.h) on GPU
 * tensors are checked here too.
 *
 * Values: rank r contributes r + 1 + (i % 16), small integers whose sums and maxima are exact in
 * f16 and bf16 in any order, so SUM and MAX must match the host bit for bit whatever NCCL's order.
 * AVG (ncclAvg may scale before it sums) is compared to the host's f32 quotient within one unit in
 * the last place of the dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/cuda.h"
#include "apex/ddp.h"
#include "apex/zero.h"
#include "testutil.h"

static apex_pg *g_pg;
static const apex_dtype dtypes[3] = {APEX_F32, APEX_F16, APEX_BF16};

static apex_tensor *dev_1d(apex_dtype dt, size_t n) {
  int64_t shape = (int64_t)n;
  apex_tensor *t = apex_tensor_create_on(APEX_DEVICE_CUDA, dt, 1, &shape);
  if (!t) fail_msg("apex_tensor_create_on: %s", apex_last_error());
  return t;
}

static apex_tensor *host_1d(apex_dtype dt, size_t n) {
  int64_t shape = (int64_t)n;
  apex_tensor *t = apex_tensor_create(dt, 1, &shape);
  assert_non_null(t);
  return t;
}

/* A device tensor holding f(i) for every element (set on the host, copied up). */
static apex_tensor *dev_filled(apex_dtype dt, size_t n, float (*f)(size_t, int), int r) {
  apex_tensor *h = host_1d(dt, n), *d = dev_1d(dt, n);
  for (size_t i = 0; i < n; i++) apex_tensor_set(h, i, f(i, r));
  TU_OK(apex_tensor_copy(d, h));
  apex_tensor_destroy(h);
  return d;
}

/* The device tensor's values on the host, as f32. */
static float *down(const apex_tensor *d) {
  size_t n = apex_tensor_numel(d);
  apex_tensor *h = host_1d(APEX_F32, n);
  TU_OK(apex_tensor_copy(h, d));
  float *v = malloc(n * sizeof *v + 1);
  assert_non_null(v);
  memcpy(v, apex_tensor_data(h), n * sizeof *v);
  apex_tensor_destroy(h);
  return v;
}

static float ulp_of(apex_dtype dt) { return dt == APEX_F32 ? 0x1p-23f : dt == APEX_F16 ? 0x1p-10f : 0x1p-7f; }

static float contrib(size_t i, int r) { return (float)(r + 1) + (float)(i % 16); }

/* ---- collectives ---------------------------------------------------------------------------------- */

static void test_allreduce(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t sizes[] = {1, 7, 1000, 65537};
  for (int d = 0; d < 3; d++)
    for (int op = 0; op < 3; op++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        apex_tensor *t = dev_filled(dtypes[d], n, contrib, r);
        TU_OK(apex_pg_allreduce(g_pg, t, (apex_reduce_op)op));
        float *got = down(t);
        for (size_t i = 0; i < n; i++) {
          float sum = 0.0f, max = -INFINITY;
          for (int p = 0; p < w; p++) {
            sum += contrib(i, p);
            if (contrib(i, p) > max) max = contrib(i, p);
          }
          float want = op == APEX_REDUCE_SUM ? sum : op == APEX_REDUCE_MAX ? max : sum / (float)w;
          float tol = op == APEX_REDUCE_AVG ? fabsf(want) * ulp_of(dtypes[d]) : 0.0f;
          if (!(fabsf(got[i] - want) <= tol))
            fail_msg("%s op %d n %zu [%zu]: got %.9g, expected %.9g", apex_dtype_name(dtypes[d]), op, n, i, (double)got[i],
                     (double)want);
        }
        free(got);
        apex_tensor_destroy(t);
      }
}

/* The collective must see what an apex kernel queued just before it wrote, with no host wait between. */
static void test_orders_after_apex_kernels(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg);
  size_t n = (size_t)1 << 22;
  apex_tensor *t = dev_1d(APEX_F32, n);
  TU_OK(apex_tensor_fill(t, 3.0f)); /* a kernel on apex's stream */
  TU_OK(apex_pg_allreduce(g_pg, t, APEX_REDUCE_SUM));
  float *got = down(t);
  for (size_t i = 0; i < n; i += 4097) assert_true(got[i] == 3.0f * (float)w);
  assert_true(got[n - 1] == 3.0f * (float)w);
  free(got);
  apex_tensor_destroy(t);
}

static float root_value(size_t i, int root) { return (float)(root * 100) + (float)(i % 50); }

static void test_broadcast(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t n = 1500;
  for (int d = 0; d < 3; d++)
    for (int root = 0; root < w; root++) {
      apex_tensor *t = dev_filled(dtypes[d], n, r == root ? root_value : contrib, r == root ? root : -99);
      TU_OK(apex_pg_broadcast(g_pg, t, root));
      float *got = down(t);
      for (size_t i = 0; i < n; i++)
        if (got[i] != root_value(i, root)) fail_msg("%s root %d [%zu]: got %g", apex_dtype_name(dtypes[d]), root, i, (double)got[i]);
      free(got);
      apex_tensor_destroy(t);
    }
}

static float gathered(size_t i, int r) { return (float)(r * 10) + (float)(i % 10); }

static void test_allgather(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t n = 777;
  for (int d = 0; d < 3; d++) {
    apex_tensor *in = dev_filled(dtypes[d], n, gathered, r), *out = dev_1d(dtypes[d], n * (size_t)w);
    TU_OK(apex_pg_allgather(g_pg, in, out));
    float *got = down(out);
    for (int p = 0; p < w; p++)
      for (size_t i = 0; i < n; i++) assert_true(got[(size_t)p * n + i] == gathered(i, p));
    free(got);
    apex_tensor_destroy(in);
    apex_tensor_destroy(out);
  }
  TU_OK(apex_pg_barrier(g_pg));
}

static float grad_value(size_t i, int r);

/* ncclReduceScatter: rank r's segment of the host's reduction (exact for SUM and MAX, as above). */
static void test_reduce_scatter(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t n = 1001;
  for (int d = 0; d < 3; d++)
    for (int op = 0; op < 3; op++) {
      apex_tensor *in = dev_filled(dtypes[d], n * (size_t)w, contrib, r), *out = dev_1d(dtypes[d], n);
      TU_OK(apex_pg_reduce_scatter(g_pg, in, out, (apex_reduce_op)op));
      float *got = down(out);
      for (size_t i = 0; i < n; i++) {
        size_t e = (size_t)r * n + i;
        float sum = 0.0f, max = -INFINITY;
        for (int p = 0; p < w; p++) {
          sum += contrib(e, p);
          if (contrib(e, p) > max) max = contrib(e, p);
        }
        float want = op == APEX_REDUCE_SUM ? sum : op == APEX_REDUCE_MAX ? max : sum / (float)w;
        float tol = op == APEX_REDUCE_AVG ? fabsf(want) * ulp_of(dtypes[d]) : 0.0f;
        if (!(fabsf(got[i] - want) <= tol))
          fail_msg("reduce-scatter %s op %d [%zu]: got %.9g, expected %.9g", apex_dtype_name(dtypes[d]), op, i, (double)got[i], (double)want);
      }
      free(got);
      apex_tensor_destroy(in);
      apex_tensor_destroy(out);
    }
}

/* The sharded optimizer on GPU tensors against DDP's engine and an unsharded step on the same GPU:
 * the gradients are small integers, so NCCL's sums are exact whatever its order, and the steps must
 * agree bit for bit. */
static void test_zero_device(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t sizes[3] = {5000, 300, 4099};
  const apex_dtype kinds[3] = {APEX_F16, APEX_F32, APEX_BF16};
  const apex_optim_kind opts[3] = {APEX_OPTIM_SGD, APEX_OPTIM_ADAMW, APEX_OPTIM_LAMB};
  for (int o = 0; o < 3; o++) {
    apex_tensor *zp[3], *zg[3], *rp[3], *rg[3];
    for (int k = 0; k < 3; k++) {
      zp[k] = dev_filled(kinds[k], sizes[k], gathered, 0);
      rp[k] = dev_filled(kinds[k], sizes[k], gathered, 0);
      zg[k] = dev_1d(kinds[k], sizes[k]);
      rg[k] = dev_1d(kinds[k], sizes[k]);
    }
    apex_optim_options oo = {.lr = 1e-2f};
    apex_zero *z = apex_zero_create(g_pg, zp, zg, 3, opts[o], &oo, &(apex_zero_options){.stage = 2, .sum_only = 1});
    if (!z) fail_msg("apex_zero_create: %s", apex_last_error());
    apex_optimizer *opt = apex_optimizer_create(opts[o], &oo);
    TU_OK(apex_optimizer_add_group(opt, rp, 3, rg, 3, NULL, NULL));
    apex_reducer *red = apex_reducer_create(g_pg, rg, 3, &(apex_reducer_options){.sum_only = 1});
    if (!red) fail_msg("apex_reducer_create: %s", apex_last_error());
    for (int step = 0; step < 2; step++) {
      for (int k = 0; k < 3; k++) {
        apex_tensor *h = dev_filled(kinds[k], sizes[k], grad_value, r + step);
        TU_OK(apex_tensor_copy(zg[k], h));
        TU_OK(apex_tensor_copy(rg[k], h));
        apex_tensor_destroy(h);
      }
      TU_OK(apex_reducer_reduce(red));
      TU_OK(apex_optimizer_step(opt, 1.0f, 0));
      TU_OK(apex_zero_reduce_grads(z));
      int overflow = 0;
      TU_OK(apex_zero_step(z, 1.0f, &overflow));
      assert_int_equal(overflow, 0);
      for (int k = 0; k < 3; k++) {
        float *a = down(zp[k]), *b = down(rp[k]);
        for (size_t i = 0; i < sizes[k]; i++)
          if (tu_bits(a[i]) != tu_bits(b[i]))
            fail_msg("%s step %d param %d [%zu]: sharded %.9g, DDP %.9g (%d ranks)", apex_optim_kind_name(opts[o]), step, k, i,
                     (double)a[i], (double)b[i], w);
        free(a);
        free(b);
      }
    }
    apex_reducer_destroy(red);
    apex_optimizer_destroy(opt);
    apex_zero_destroy(z);
    for (int k = 0; k < 3; k++) {
      apex_tensor_destroy(zp[k]), apex_tensor_destroy(zg[k]);
      apex_tensor_destroy(rp[k]), apex_tensor_destroy(rg[k]);
    }
  }
}

/* Several collectives in flight, advanced with test and finished in another order. */
static void test_async(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t n = 100000;
  apex_tensor *a = dev_filled(APEX_BF16, n, contrib, r), *b = dev_filled(APEX_F32, n, contrib, r);
  apex_tensor *c = dev_filled(APEX_F16, n, r == 0 ? root_value : contrib, 0);
  apex_pg_work *wa = NULL, *wb = NULL, *wc = NULL, *wd = NULL;
  TU_OK(apex_pg_allreduce_async(g_pg, a, APEX_REDUCE_SUM, &wa));
  TU_OK(apex_pg_allreduce_async(g_pg, b, APEX_REDUCE_MAX, &wb));
  TU_OK(apex_pg_broadcast_async(g_pg, c, 0, &wc));
  TU_OK(apex_pg_barrier_async(g_pg, &wd));
  int done = 0;
  for (int spin = 0; !done && spin < 1000000; spin++) TU_OK(apex_pg_test(wa, &done));
  TU_OK(apex_pg_wait(wd));
  TU_OK(apex_pg_wait(wc));
  TU_OK(apex_pg_wait(wa));
  TU_OK(apex_pg_wait(wb));
  float *ga = down(a), *gb = down(b), *gc = down(c);
  for (size_t i = 0; i < n; i++) {
    float k = (float)(i % 16);
    assert_true(ga[i] == (float)(w * (w + 1) / 2) + (float)w * k);
    assert_true(gb[i] == (float)w + k);
    assert_true(gc[i] == root_value(i, 0));
  }
  free(ga), free(gb), free(gc);
  apex_tensor_destroy(a);
  apex_tensor_destroy(b);
  apex_tensor_destroy(c);
}

static void test_refuses_cpu_tensors(void **state) {
  (void)state;
  apex_tensor *h = host_1d(APEX_F32, 8), *d = dev_1d(APEX_F32, 8);
  assert_int_equal(apex_pg_device(g_pg), APEX_DEVICE_CUDA);
  assert_string_equal(apex_pg_backend(g_pg), "nccl");
  TU_FAILS(apex_pg_allreduce(g_pg, h, APEX_REDUCE_SUM), APEX_ERR_DEVICE, "nccl backend works on CUDA memory");
  TU_FAILS(apex_pg_broadcast(g_pg, h, 0), APEX_ERR_DEVICE, "on the CPU");
  apex_tensor *big = host_1d(APEX_F32, 8 * (size_t)apex_pg_world_size(g_pg));
  TU_FAILS(apex_pg_allgather(g_pg, d, big), APEX_ERR_DEVICE, "out is on the CPU");
  assert_null(apex_reducer_create(g_pg, &h, 1, NULL));
  tu_assert_message("not on the device of the nccl backend");
  apex_tensor_destroy(big);
  apex_tensor_destroy(h);
  apex_tensor_destroy(d);
}

static void test_flag(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  int flag = 0;
  TU_OK(apex_pg_allreduce_flag(g_pg, &flag));
  assert_int_equal(flag, 0);
  flag = r == w - 1 ? 7 : 0; /* any nonzero value counts */
  TU_OK(apex_pg_allreduce_flag(g_pg, &flag));
  assert_int_equal(flag, 1);
}

/* ---- the Reducer over device gradients, and what rides on the MPI side group --------------------- */

static float grad_value(size_t i, int r) { return (float)(2 * r + 1) * (float)((i % 8) + 1); }

static void test_reducer_device_grads(void **state) {
  (void)state;
  int w = apex_pg_world_size(g_pg), r = apex_pg_rank(g_pg);
  const size_t sizes[4] = {300, 1024, 5, 4000};
  const apex_dtype kinds[4] = {APEX_F32, APEX_F16, APEX_BF16, APEX_F32};
  apex_tensor *g[4];
  for (int k = 0; k < 4; k++) g[k] = dev_filled(kinds[k], sizes[k], grad_value, r);
  /* Small buckets: several all-reduces in flight, and the f32 ones in two buckets. */
  apex_reducer *red = apex_reducer_create(g_pg, g, 4, &(apex_reducer_options){.bucket_bytes = 2048});
  if (!red) fail_msg("apex_reducer_create: %s", apex_last_error());
  assert_true(apex_reducer_bucket_count(red) >= 4);
  for (int step = 0; step < 2; step++) {
    for (int k = 3; k >= 0; k--) TU_OK(apex_reducer_mark_ready(red, k));
    TU_OK(apex_reducer_finish(red));
    for (int k = 0; k < 4; k++) {
      float *got = down(g[k]);
      for (size_t i = 0; i < sizes[k]; i++) {
        /* Step 0 averages the odd multiples: sum over p of (2p+1) = w^2, so the mean is w (i%8+1). Step 1
         * averages equal values again. Both exact. */
        float want = (float)w * (float)((i % 8) + 1);
        if (got[i] != want) fail_msg("step %d grad %d [%zu]: got %g, expected %g", step, k, i, (double)got[i], (double)want);
      }
      free(got);
    }
  }
  apex_reducer_destroy(red);
  for (int k = 0; k < 4; k++) apex_tensor_destroy(g[k]);
}

static void test_consistency_check(void **state) {
  (void)state;
  int r = apex_pg_rank(g_pg);
  apex_tensor *t[2] = {dev_1d(APEX_F16, 10), dev_1d(APEX_F32, 3)};
  const char *names[2] = {"a", "b"};
  TU_OK(apex_pg_check_consistent(g_pg, names, t, 2));
  if (apex_pg_world_size(g_pg) > 1) {
    apex_tensor *odd = dev_1d(APEX_F32, r == 0 ? 3 : 4), *u[2] = {t[0], odd};
    TU_FAILS(apex_pg_check_consistent(g_pg, names, u, 2), APEX_ERR_SHAPE, "'b'");
    apex_tensor_destroy(odd);
  }
  apex_tensor_destroy(t[0]);
  apex_tensor_destroy(t[1]);
}

/* apex models are on the CPU: a DDP over the NCCL group says so, on every rank, before any exchange. */
static void test_ddp_refuses_cpu_model(void **state) {
  (void)state;
  apex_model *m = apex_model_create(NULL);
  assert_non_null(apex_linear_create(m, "fc", 4, 3, 1));
  assert_null(apex_ddp_create(g_pg, m, NULL));
  tu_assert_message("apex_ddp_create");
  tu_assert_message("is on the CPU but the nccl group works on CUDA tensors");
  apex_model_destroy(m);
}

/* ---- setup: create the group or say why not ---------------------------------------------------------- */

static int skip_run(const char *why) {
  printf("test_nccl skipped: %s\n", why);
  fflush(stdout);
  return 77;
}

int main(void) {
  if (!apex_pg_nccl_available()) {
    /* The stub must fail cleanly and say why. */
    apex_pg *pg = apex_pg_create_nccl(NULL);
    if (pg || !strstr(apex_last_error(), "apex was built without")) {
      fprintf(stderr, "test_nccl: the stub apex_pg_create_nccl returned %p with '%s'\n", (void *)pg, apex_last_error());
      return 1;
    }
    return skip_run(apex_last_error());
  }
  /* A launcher that found no mpirun (mpirun_test.sh itself exits 77 then): one process cannot stand in. */
  if (getenv("APEX_TEST_MPI_SKIP")) return skip_run(getenv("APEX_TEST_MPI_SKIP"));
  const char *why = NULL;
  if (!apex_cuda_available(&why)) {
    /* Still built with NCCL: the group bootstraps over MPI and must refuse on every rank, not hang. */
    apex_pg *pg = apex_pg_create_nccl(NULL);
    if (pg) {
      fprintf(stderr, "test_nccl: apex_pg_create_nccl succeeded without a GPU\n");
      apex_pg_destroy(pg);
      return 1;
    }
    printf("apex_pg_create_nccl without a GPU: %s\n", apex_last_error());
    return skip_run(why);
  }
  g_pg = apex_pg_create_nccl(NULL);
  if (!g_pg) {
    if (strstr(apex_last_error(), "NCCL needs one GPU per rank")) return skip_run(apex_last_error());
    fprintf(stderr, "test_nccl: apex_pg_create_nccl failed: %s\n", apex_last_error());
    return 1;
  }
  char name[128] = "";
  apex_cuda_device_name(name, sizeof name);
  printf("test_nccl: rank %d of %d on %s\n", apex_pg_rank(g_pg), apex_pg_world_size(g_pg), name);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allreduce),       cmocka_unit_test(test_orders_after_apex_kernels),
      cmocka_unit_test(test_broadcast),       cmocka_unit_test(test_allgather),
      cmocka_unit_test(test_async),           cmocka_unit_test(test_refuses_cpu_tensors),
      cmocka_unit_test(test_flag),            cmocka_unit_test(test_reducer_device_grads),
      cmocka_unit_test(test_consistency_check), cmocka_unit_test(test_ddp_refuses_cpu_model),
      cmocka_unit_test(test_reduce_scatter),    cmocka_unit_test(test_zero_device),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  apex_pg_destroy(g_pg);
  return failed;
}
