/* test_ddp.c: DistributedDataParallel, SyncBatchNorm and amp with DDP (ddp.h).
 *
 * Run alone (local backend, world size 1) and under `mpirun -np 2` / `-np 3` (tests/test_ddp.cmake).
 * Every rank regenerates the whole global batch from a seed and computes a single-process
 * reference on it with a separate model, so each rank checks its DDP result against it locally. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static apex_pg *g_mpi;
static const char *g_skip = "";

#define NEED_MPI()                                                                                         \
  do {                                                                                                     \
    if (!g_mpi) {                                                                                          \
      print_message("skipped: %s\n", g_skip);                                                              \
      skip();                                                                                              \
    }                                                                                                      \
  } while (0)

enum { IN = 6, HID = 8, OUT = 3 };

typedef struct net_t {
  apex_model *m;
  apex_module *net;
  apex_optimizer *opt;
} net_t;

static void add_opt(net_t *n) {
  size_t np = apex_model_num_params(n->m);
  apex_tensor *p[8], *g[8];
  for (size_t i = 0; i < np; i++) {
    p[i] = apex_var_value(apex_model_param(n->m, i, NULL));
    g[i] = apex_var_grad(apex_model_param(n->m, i, NULL));
  }
  n->opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.1f, .momentum = 0.5f});
  assert_non_null(n->opt);
  TU_OK(apex_optimizer_add_group(n->opt, p, (int)np, g, (int)np, NULL, NULL));
}

static net_t make_net(uint64_t seed, int bn, int opt) {
  net_t n;
  n.m = apex_model_create(&(apex_model_options){.seed = seed});
  n.net = apex_sequential_create(n.m, NULL);
  TU_OK(apex_sequential_add(n.net, apex_linear_create(n.m, "fc1", IN, HID, 1)));
  if (bn) TU_OK(apex_sequential_add(n.net, apex_batch_norm1d_create(n.m, "bn", HID, NULL)));
  TU_OK(apex_sequential_add(n.net, apex_activation_create(n.m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(n.net, apex_linear_create(n.m, "fc2", HID, OUT, 1)));
  n.opt = NULL;
  if (opt) add_opt(&n);
  return n;
}

static void free_net(net_t n) {
  apex_optimizer_destroy(n.opt);
  apex_model_destroy(n.m);
}

/* Rows [r0, r0 + rows) of the global batch of a step: x [rows, IN], targets y [rows, OUT]. */
static apex_tensor *rows_of(int step, int r0, int rows, int cols, uint64_t salt) {
  int64_t shape[2] = {rows, cols};
  apex_tensor *t = apex_tensor_create(APEX_F32, 2, shape);
  assert_non_null(t);
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) {
      uint64_t h = (uint64_t)step * 1000003u + (uint64_t)(r0 + i) * 7919u + (uint64_t)j * 104729u + salt;
      h ^= h >> 13;
      h *= 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
      apex_tensor_set(t, (size_t)(i * cols + j), (float)((h % 2001u) / 1000.0 - 1.0));
    }
  return t;
}

/* One forward/backward of MSE on global rows [r0, r0 + rows) of a step. */
static void fwd_bwd(net_t *n, apex_graph *g, int step, int r0, int rows) {
  apex_tensor *x = rows_of(step, r0, rows, IN, 1), *y = rows_of(step, r0, rows, OUT, 2);
  apex_var *out = apex_module_forward(n->net, g, apex_graph_input(g, x, 0));
  apex_var *loss = apex_mse_loss(g, out, apex_graph_input(g, y, 0), APEX_REDUCTION_MEAN);
  assert_non_null(loss);
  TU_OK(apex_backward(loss, NULL));
  apex_graph_reset(g);
  apex_tensor_destroy(x);
  apex_tensor_destroy(y);
}

static void assert_same_on_all_ranks(apex_pg *pg, apex_tensor *t) {
  apex_tensor *copy = apex_tensor_clone(t);
  TU_OK(apex_pg_broadcast(pg, copy, 0));
  assert_memory_equal(apex_tensor_data(copy), apex_tensor_data(t), apex_tensor_nbytes(t));
  apex_tensor_destroy(copy);
}

static void assert_close(const apex_tensor *got, const apex_tensor *want, double tol, const char *what) {
  size_t n = apex_tensor_numel(want);
  assert_int_equal(apex_tensor_numel(got), n);
  for (size_t i = 0; i < n; i++) {
    double a = apex_tensor_get(got, i), b = apex_tensor_get(want, i);
    if (!(fabs(a - b) <= tol * fmax(1.0, fabs(b)))) fail_msg("%s[%zu]: got %.9g, expected %.9g", what, i, a, b);
  }
}

/* ---- DDP training equals single-process training on the whole batch ----------------------------- */

/* The gradients of every parameter of n, copied (to see that a finish left them alone). */
static void grads_snapshot(net_t *n, apex_tensor **out) {
  for (size_t i = 0; i < apex_model_num_params(n->m); i++) out[i] = apex_tensor_clone(apex_var_grad(apex_model_param(n->m, i, NULL)));
}

static void grads_unchanged(net_t *n, apex_tensor **snap) {
  for (size_t i = 0; i < apex_model_num_params(n->m); i++) {
    apex_tensor *g = apex_var_grad(apex_model_param(n->m, i, NULL));
    assert_memory_equal(apex_tensor_data(g), apex_tensor_data(snap[i]), apex_tensor_nbytes(g));
    apex_tensor_destroy(snap[i]);
  }
}

/* triggers: buckets cut by allreduce_trigger_params (fc2.weight and fc1.bias) instead of bytes. */
static void body_train(apex_pg *pg, int accumulate, int delay, int triggers) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg), B = 4;
  net_t ref = make_net(1, 0, 1), dn = make_net(1 + (uint64_t)r, 0, 0); /* broadcast fixes the seeds */
  const char *pn[4];
  apex_var *pv[4];
  assert_int_equal(apex_model_num_params(dn.m), 4);
  for (size_t i = 0; i < 4; i++) pv[i] = apex_model_param(dn.m, i, &pn[i]);
  assert_string_equal(pn[1], "fc1.bias");
  assert_string_equal(pn[2], "fc2.weight");
  apex_var *trig[2] = {pv[2], pv[1]};
  apex_ddp_options o = {.bucket_bytes = 64, .delay_allreduce = delay};
  if (triggers) o.allreduce_trigger_params = trig, o.num_allreduce_trigger_params = 2, o.bucket_bytes = 1;
  apex_ddp *ddp = apex_ddp_create(pg, dn.m, &o);
  if (!ddp) fail_msg("apex_ddp_create: %s", apex_last_error());
  apex_reducer *red = apex_ddp_reducer(ddp);
  int nb = apex_reducer_bucket_count(red);
  assert_true(nb > 1);
  if (triggers) {
    /* Reducer order is backward's: fc2.bias, fc2.weight | fc1.bias | fc1.weight (bucket_bytes ignored). */
    assert_int_equal(nb, 3);
    const int want[4] = {0, 0, 1, 2};
    for (int k = 0; k < 4; k++) assert_int_equal(apex_reducer_bucket_of(red, k), want[k]);
  }
  add_opt(&dn); /* after the DDP's broadcast */
  apex_graph *g = apex_graph_create(), *gref = apex_graph_create();
  TU_OK(apex_ddp_attach(ddp, g));
  for (int step = 0; step < 10; step++) {
    if (accumulate) {
      /* Two micro-batches of B/2 rows per rank; the first only accumulates (no_sync): no bucket is
       * started during its backward, and finish leaves the local gradients as they are. */
      apex_ddp_set_sync(ddp, 0);
      fwd_bwd(&dn, g, step, r * (B / 2), B / 2);
      assert_int_equal(apex_reducer_buckets_started(red), 0);
      apex_tensor *snap[4];
      grads_snapshot(&dn, snap);
      TU_OK(apex_ddp_finish(ddp)); /* nothing while sync is off */
      grads_unchanged(&dn, snap);
      apex_ddp_set_sync(ddp, 1);
      fwd_bwd(&dn, g, step + 100, r * (B / 2), B / 2);
      fwd_bwd(&ref, gref, step, 0, w * (B / 2));
      fwd_bwd(&ref, gref, step + 100, 0, w * (B / 2));
    } else {
      fwd_bwd(&dn, g, step, r * B, B);
      fwd_bwd(&ref, gref, step, 0, w * B);
    }
    /* Overlap: every bucket was posted during the backward (each has all its gradients by its end),
     * before finish; with delay_allreduce none was. */
    assert_int_equal(apex_reducer_buckets_started(red), delay ? 0 : nb);
    TU_OK(apex_ddp_finish(ddp));
    assert_int_equal(apex_reducer_buckets_started(red), 0);
    TU_OK(apex_optimizer_step(dn.opt, 1.0f, 0));
    TU_OK(apex_optimizer_step(ref.opt, 1.0f, 0));
    TU_OK(apex_model_zero_grad(dn.m));
    TU_OK(apex_model_zero_grad(ref.m));
  }
  for (size_t i = 0; i < apex_model_num_params(dn.m); i++) {
    const char *name;
    apex_tensor *p = apex_var_value(apex_model_param(dn.m, i, &name));
    assert_close(p, apex_var_value(apex_model_param(ref.m, i, NULL)), 1e-5, name);
    assert_same_on_all_ranks(pg, p);
  }
  apex_graph_destroy(g);
  apex_graph_destroy(gref);
  apex_ddp_destroy(ddp);
  free_net(dn);
  free_net(ref);
}

/* ---- SyncBatchNorm equals batch norm on the whole batch (unequal batch sizes per rank) ------------ */

static void body_syncbn(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg), C = 3, S = 4;
  int total = 0, r0 = 0;
  for (int k = 0; k < w; k++) {
    if (k < r) r0 += k + 2;
    total += k + 2;
  }
  int nr = r + 2;
  apex_model *ms = apex_model_create(NULL), *mp = apex_model_create(NULL);
  apex_module *bs = apex_batch_norm2d_create(ms, "bn", C, NULL), *bp = apex_batch_norm2d_create(mp, "bn", C, NULL);
  int count = 0;
  TU_OK(apex_convert_sync_batchnorm(ms, pg, &count));
  assert_int_equal(count, 1);
  /* Non-trivial affine parameters, the same on both. */
  for (int c = 0; c < C; c++) {
    apex_tensor_set(apex_var_value(apex_module_param(bs, "weight")), (size_t)c, 0.5f + (float)c);
    apex_tensor_set(apex_var_value(apex_module_param(bp, "weight")), (size_t)c, 0.5f + (float)c);
    apex_tensor_set(apex_var_value(apex_module_param(bs, "bias")), (size_t)c, 0.25f * (float)c);
    apex_tensor_set(apex_var_value(apex_module_param(bp, "bias")), (size_t)c, 0.25f * (float)c);
  }
  apex_graph *g = apex_graph_create();
  for (int it = 0; it < 2; it++) {
    apex_tensor *xall = rows_of(it, 0, total, C * S, 5), *dyall = rows_of(it, 0, total, C * S, 6);
    int64_t sh_all[4] = {total, C, 2, 2}, sh_loc[4] = {nr, C, 2, 2};
    apex_tensor *xa = apex_tensor_view(xall, 4, sh_all), *dya = apex_tensor_view(dyall, 4, sh_all);
    apex_tensor *xl = apex_tensor_slice_view(xall, (size_t)r0 * C * S, 4, sh_loc);
    apex_tensor *dyl = apex_tensor_slice_view(dyall, (size_t)r0 * C * S, 4, sh_loc);
    apex_var *ia = apex_graph_input(g, xa, 1), *il = apex_graph_input(g, xl, 1);
    apex_var *ya = apex_module_forward(bp, g, ia), *yl = apex_module_forward(bs, g, il);
    assert_non_null(ya);
    assert_non_null(yl);
    assert_int_equal(apex_var_op(yl), APEX_OP_SYNC_BATCH_NORM);
    apex_tensor *ya_slice = apex_tensor_slice_view(apex_var_value(ya), (size_t)r0 * C * S, 4, sh_loc);
    assert_close(apex_var_value(yl), ya_slice, 1e-5, "forward");
    TU_OK(apex_backward(ya, &(apex_backward_options){.grad_output = dya, .retain_graph = 1}));
    TU_OK(apex_backward(yl, &(apex_backward_options){.grad_output = dyl}));
    apex_tensor *dx_slice = apex_tensor_slice_view(apex_var_grad(ia), (size_t)r0 * C * S, 4, sh_loc);
    assert_close(apex_var_grad(il), dx_slice, 1e-5, "dx");
    /* Weight and bias gradients are this rank's share; their sum over ranks is the whole batch's. */
    for (int p = 0; p < 2; p++) {
      const char *nm = p ? "bias" : "weight";
      apex_tensor *gsum = apex_tensor_clone(apex_var_grad(apex_module_param(bs, nm)));
      TU_OK(apex_pg_allreduce(pg, gsum, APEX_REDUCE_SUM));
      assert_close(gsum, apex_var_grad(apex_module_param(bp, nm)), 1e-5, nm);
      apex_tensor_destroy(gsum);
    }
    TU_OK(apex_model_zero_grad(ms));
    TU_OK(apex_model_zero_grad(mp));
    for (int b = 0; b < 2; b++) {
      apex_tensor *rs = apex_model_buffer(ms, (size_t)b, NULL);
      assert_close(rs, apex_model_buffer(mp, (size_t)b, NULL), 1e-6, b ? "running_var" : "running_mean");
      assert_same_on_all_ranks(pg, rs);
    }
    apex_graph_reset(g);
    apex_tensor *all[] = {ya_slice, dx_slice, xa, dya, xl, dyl, xall, dyall};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  }
  /* Evaluation uses the running statistics: no communication, plain batch norm. */
  apex_model_train(ms, 0);
  apex_graph_destroy(g);
  apex_model_destroy(ms);
  apex_model_destroy(mp);
}

/* ---- amp O2 + DDP: an overflow on one rank skips the step everywhere ---------------------------- */

static void body_amp(apex_pg *pg) {
  int r = apex_pg_rank(pg), w = apex_pg_world_size(pg), B = 4;
  net_t n = make_net(3, 0, 1);
  apex_amp *amp;
  TU_OK(apex_amp_initialize(&n.m, 1, &n.opt, 1, &(apex_amp_config){.opt_level = "O2"}, &amp));
  apex_ddp *ddp = apex_ddp_create(pg, n.m, &(apex_ddp_options){.bucket_bytes = 64});
  assert_non_null(ddp);
  apex_graph *g = apex_graph_create();
  TU_OK(apex_amp_prepare_graph(amp, g));
  TU_OK(apex_ddp_attach(ddp, g));
  apex_amp_backward_options bo = {.before_unscale = apex_ddp_amp_before_unscale, .reduce_overflow = apex_ddp_amp_reduce_overflow,
                                  .hook_ctx = ddp};
  for (int step = 0; step < 4; step++) {
    apex_tensor *x = rows_of(step, r * B, B, IN, 1), *y = rows_of(step, r * B, B, OUT, 2);
    if (step == 2 && r == w - 1) apex_tensor_set(x, 3, INFINITY); /* this rank only */
    apex_var *out = apex_amp_forward(amp, 0, n.net, g, apex_graph_input(g, x, 0));
    apex_var *loss = apex_mse_loss(g, out, apex_graph_input(g, y, 0), APEX_REDUCTION_MEAN);
    assert_non_null(loss);
    apex_status st = apex_amp_backward(amp, loss, 0, &bo);
    assert_true(st == APEX_OK || (st == APEX_ERR_NONFINITE && step == 2 && r == w - 1));
    int skipped = -1;
    TU_OK(apex_amp_step(amp, n.opt, &skipped));
    assert_int_equal(skipped, step == 2);
    float scale = apex_amp_loss_scale(amp, 0);
    apex_tensor *sc = apex_tensor_create(APEX_F32, 0, NULL);
    apex_tensor_set(sc, 0, scale);
    assert_same_on_all_ranks(pg, sc);
    apex_tensor_destroy(sc);
    TU_OK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    apex_tensor_destroy(x);
    apex_tensor_destroy(y);
  }
  for (size_t i = 0; i < apex_model_num_params(n.m); i++) assert_same_on_all_ranks(pg, apex_var_value(apex_model_param(n.m, i, NULL)));
  apex_graph_destroy(g);
  apex_ddp_destroy(ddp);
  apex_amp_destroy(amp);
  free_net(n);
}

/* ---- models that differ: the same clear error on every rank, no hang ----------------------------- */

static void body_mismatch(apex_pg *pg) {
  int r = apex_pg_rank(pg);
  apex_model *m = apex_model_create(NULL);
  assert_non_null(apex_linear_create(m, "fc", 4, r == 0 ? 3 : 5, 1));
  assert_null(apex_ddp_create(pg, m, NULL));
  tu_assert_message("apex_ddp_create");
  tu_assert_message("fc.weight");
  apex_model_destroy(m);
}

static void body_train_plain(apex_pg *pg) { body_train(pg, 0, 0, 0); }
static void body_train_accum(apex_pg *pg) { body_train(pg, 1, 0, 0); }
static void body_train_delay(apex_pg *pg) { body_train(pg, 0, 1, 0); }
static void body_train_triggers(apex_pg *pg) { body_train(pg, 1, 0, 1); }

#define CASES(X) X(train_plain) X(train_accum) X(train_delay) X(train_triggers) X(syncbn) X(amp)

#define DEFINE_CASE(name)                                                                                  \
  static void test_local_##name(void **state) {                                                            \
    (void)state;                                                                                           \
    apex_pg *pg = apex_pg_create_local();                                                                  \
    body_##name(pg);                                                                                       \
    apex_pg_destroy(pg);                                                                                   \
  }                                                                                                        \
  static void test_mpi_##name(void **state) {                                                              \
    (void)state;                                                                                           \
    NEED_MPI();                                                                                            \
    body_##name(g_mpi);                                                                                    \
  }
CASES(DEFINE_CASE)

static void test_mpi_mismatch(void **state) {
  (void)state;
  NEED_MPI();
  if (apex_pg_world_size(g_mpi) < 2) skip();
  body_mismatch(g_mpi);
}

/* The grad hook fires once per reached leaf, after its gradient is final. */
static apex_status count_hook(void *ctx, apex_var *leaf) {
  int *c = ctx;
  (void)leaf;
  (*c)++;
  return APEX_OK;
}

static void test_grad_hook(void **state) {
  (void)state;
  net_t n = make_net(1, 0, 0);
  apex_graph *g = apex_graph_create();
  int calls = 0;
  TU_OK(apex_graph_set_grad_hook(g, count_hook, &calls));
  fwd_bwd(&n, g, 0, 0, 4);
  assert_int_equal(calls, (int)apex_model_num_params(n.m));
  TU_FAILS(apex_graph_set_grad_hook(NULL, count_hook, NULL), APEX_ERR_INVALID_ARG, "graph is NULL");
  assert_null(apex_ddp_create(NULL, n.m, NULL));
  tu_assert_message("pg is NULL");
  /* allreduce_trigger_params: refused before any communication. */
  apex_pg *pg = apex_pg_create_local();
  net_t other = make_net(2, 0, 0);
  apex_var *mine[1] = {apex_model_param(n.m, 0, NULL)}, *theirs[1] = {apex_model_param(other.m, 0, NULL)};
  assert_null(apex_ddp_create(pg, n.m,
                              &(apex_ddp_options){.delay_allreduce = 1, .allreduce_trigger_params = mine, .num_allreduce_trigger_params = 1}));
  tu_assert_message("only valid without delay_allreduce");
  assert_null(apex_ddp_create(pg, n.m, &(apex_ddp_options){.allreduce_trigger_params = theirs, .num_allreduce_trigger_params = 1}));
  tu_assert_message("allreduce_trigger_params[0] is not a parameter of the model");
  assert_null(apex_ddp_create(pg, n.m, &(apex_ddp_options){.num_allreduce_trigger_params = 1}));
  tu_assert_message("the list is NULL");
  free_net(other);
  apex_pg_destroy(pg);
  apex_graph_destroy(g);
  free_net(n);
}

/* apex_sync_batch_norm refuses bad input with batch norm's checks, naming itself, and a refused call
 * leaves the running statistics as they were. */
static void test_sync_batch_norm_bad_input(void **state) {
  (void)state;
  apex_pg *pg = apex_pg_create_local();
  apex_graph *g = apex_graph_create();
  int64_t xs[4] = {2, 3, 2, 2}, x1s[4] = {1, 3, 1, 1}, c3 = 3, c4 = 4;
  apex_tensor *xt = apex_tensor_create(APEX_F32, 4, xs), *x1t = apex_tensor_create(APEX_F32, 4, x1s);
  apex_tensor *w4 = apex_tensor_create(APEX_F32, 1, &c4), *rm = apex_tensor_create(APEX_F32, 1, &c3);
  apex_tensor *rv16 = apex_tensor_create(APEX_F16, 1, &c3);
  for (size_t i = 0; i < 3; i++) apex_tensor_set(rm, i, 0.5f + (float)i);
  apex_var *x = apex_graph_input(g, xt, 1), *x1 = apex_graph_input(g, x1t, 1), *w = apex_graph_input(g, w4, 1);
  const apex_batch_norm_options train = {.training = 1};
  assert_null(apex_sync_batch_norm(g, NULL, x, NULL, NULL, NULL, NULL, &train));
  tu_assert_message("sync_batch_norm: pg is NULL");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_null(apex_sync_batch_norm(g, pg, x, NULL, NULL, NULL, NULL, &(apex_batch_norm_options){.training = 1, .relu = 1}));
  tu_assert_message("sync_batch_norm: relu is not fused here");
  assert_int_equal(apex_last_status(), APEX_ERR_UNSUPPORTED);
  assert_null(apex_sync_batch_norm(g, pg, x, w, NULL, NULL, NULL, &train));
  tu_assert_message("sync_batch_norm: weight [4] does not match the 3 channels of input [2, 3, 2, 2]");
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE);
  assert_null(apex_sync_batch_norm(g, pg, x, NULL, NULL, rm, rv16, &train));
  tu_assert_message("sync_batch_norm: running_var is f16; running statistics are f32");
  assert_int_equal(apex_last_status(), APEX_ERR_DTYPE);
  assert_null(apex_sync_batch_norm(g, pg, x, NULL, NULL, rm, NULL, &(apex_batch_norm_options){.training = 1, .momentum = 2.0f}));
  tu_assert_message("sync_batch_norm: momentum is 2; it must be in [0, 1]");
  /* One value per channel over the whole group: the statistics hook refuses it. */
  assert_null(apex_sync_batch_norm(g, pg, x1, NULL, NULL, rm, NULL, &train));
  tu_assert_message("needs more than 1");
  for (size_t i = 0; i < 3; i++) assert_true(apex_tensor_get(rm, i) == 0.5f + (float)i);
  apex_tensor *all[] = {xt, x1t, w4, rm, rv16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  apex_graph_destroy(g);
  apex_pg_destroy(pg);
}

static int setup(void **state) {
  (void)state;
  const char *why = getenv("APEX_TEST_MPI_SKIP");
  if (why) g_skip = why;
  else if (!apex_pg_mpi_available()) g_skip = "apex was built without MPI (APEX_MPI=OFF or MPI not found)";
  else if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK"))
    g_skip = "not started by mpirun (ctest runs test_ddp_np2 and _np3 for the MPI cases)";
  else if (!(g_mpi = apex_pg_create_mpi(NULL))) {
    fprintf(stderr, "apex_pg_create_mpi failed: %s\n", apex_last_error());
    return -1;
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
      cmocka_unit_test(test_grad_hook), cmocka_unit_test(test_sync_batch_norm_bad_input), CASES(LOCAL_ENTRY) CASES(MPI_ENTRY) cmocka_unit_test(test_mpi_mismatch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
