/* test_zero_release.c: ZeRO stage 2 with the reduce-scatter overlapped with autograd's backward frees
 * the gradient outside the shard (zero.h's keep_grads), and keeps DDP's bits.
 *
 * Run alone (the local group) and under `mpirun -np 1..4` (tests/test_zero_release.cmake). A model of
 * four linear layers and a parameter that only the first step uses trains for a few steps twice from
 * the same values: the reference is DDP's engine (the Reducer, averaging, after the backward) and an
 * unsharded AdamW step, with clipping on one step; the other is apex_zero at stage 2 with overlap,
 * attached to its graph, buckets of one layer. Every parameter must keep the reference's bits on every
 * rank, in f32 and bf16 (with f32 masters); after each reduce the gradients must be released, and
 * during every backward after the first (whose gradients were made whole at creation) the gradient
 * tensors must have held at most one bucket's gradients at once (apex_zero_grad_bytes's peak), where
 * DDP holds the model's, and the clipping norm (from the shards) makes none again. keep_grads keeps
 * them all, with the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { LAYERS = 4, WIDTH = 32, BATCH = 8, NPARAM = 1 + 2 * LAYERS, STEPS = 4, CLIP_STEP = 3 };

typedef struct net {
  apex_var *v[NPARAM]; /* the unused-after-step-1 vector first (the flat vector's last), then W, b per layer */
  apex_tensor *p[NPARAM], *g[NPARAM];
  apex_graph *graph;
} net;

static float value_at(int i, size_t j) { return 0.02f * (float)((j * 29 + (size_t)i * 7) % 23) - 0.22f; }

static net make_net(apex_dtype dt) {
  net m = {.graph = apex_graph_create()};
  for (int i = 0; i < NPARAM; i++) {
    int64_t shape[2] = {i == 0 ? 2 * WIDTH : WIDTH, WIDTH};
    int ndim = i == 0 || i % 2 == 0 ? 1 : 2; /* u and the biases 1-D */
    apex_tensor *t = apex_tensor_create(dt, ndim, shape);
    assert_non_null(t);
    for (size_t j = 0; j < apex_tensor_numel(t); j++) apex_tensor_set(t, j, value_at(i, j));
    m.v[i] = apex_var_create(t, 1);
    m.p[i] = apex_var_value(m.v[i]);
    m.g[i] = apex_var_grad(m.v[i]);
  }
  return m;
}

static void free_net(net *m) {
  apex_graph_destroy(m->graph);
  for (int i = 0; i < NPARAM; i++) apex_var_destroy(m->v[i]);
}

/* This rank's batch of a step: the loss mean((W4 relu(...W1 x + b1...) + b4)^2), plus sum(u) on step 1. */
static void forward_backward(net *m, apex_dtype dt, int step) {
  int rank = apex_pg_rank(tu_pg);
  apex_tensor *xt = apex_tensor_create(dt, 2, (int64_t[]){BATCH, WIDTH});
  for (size_t j = 0; j < (size_t)(BATCH * WIDTH); j++) apex_tensor_set(xt, j, 0.05f * (float)((j * 17 + (size_t)rank * 5 + (size_t)step * 3) % 41) - 1.0f);
  for (int i = 0; i < NPARAM; i++) TU_OK(apex_var_zero_grad(m->v[i]));
  apex_graph *g = m->graph;
  apex_var *h = apex_graph_input(g, xt, 0);
  for (int l = 0; l < LAYERS; l++) {
    h = apex_linear(g, h, m->v[1 + 2 * l], m->v[2 + 2 * l]);
    if (l + 1 < LAYERS) h = apex_relu(g, h);
  }
  apex_var *loss = apex_mean_all(g, apex_mul(g, h, h));
  if (step == 1) loss = apex_add(g, loss, apex_sum_all(g, m->v[0]));
  TU_OK(apex_backward(loss, NULL));
  apex_graph_reset(g);
  apex_tensor_destroy(xt);
}

static size_t bytes_of(apex_tensor *const *t, int lo, int hi) {
  size_t b = 0;
  for (int i = lo; i < hi; i++) b += apex_tensor_nbytes(t[i]);
  return b;
}

static void assert_same_bits(const apex_tensor *a, const apex_tensor *b, int i, int step) {
  if (memcmp(apex_tensor_data(a), apex_tensor_data(b), apex_tensor_nbytes(a)) != 0)
    fail_msg("parameter %d after step %d differs from DDP's (rank %d of %d)", i, step, apex_pg_rank(tu_pg), apex_pg_world_size(tu_pg));
}

static void run(apex_dtype dt, int keep) {
  net ref = make_net(dt), zn = make_net(dt);
  apex_optim_options oo = {.lr = 1e-2f, .weight_decay = 0.01f};
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &oo);
  assert_non_null(opt);
  TU_OK(apex_optimizer_add_group(opt, ref.p, NPARAM, ref.g, NPARAM, NULL, NULL));
  apex_reducer *red = apex_reducer_create(tu_pg, ref.g, NPARAM, NULL);
  assert_non_null(red);
  size_t layer = bytes_of(zn.g, 1, 3), total = bytes_of(zn.g, 0, NPARAM); /* a bucket: one layer's W and b */
  apex_zero *z = apex_zero_create(tu_pg, zn.p, zn.g, NPARAM, APEX_OPTIM_ADAMW, &oo,
                                  &(apex_zero_options){.stage = 2, .overlap = 1, .bucket_bytes = layer, .keep_grads = keep});
  if (!z) fail_msg("apex_zero_create: %s", apex_last_error());
  TU_OK(apex_zero_attach(z, zn.graph));
  for (int step = 1; step <= STEPS; step++) {
    forward_backward(&ref, dt, step);
    TU_OK(apex_reducer_reduce(red));
    float ref_norm = 0.0f, z_norm = 0.0f;
    if (step == CLIP_STEP) TU_OK(apex_optimizer_clip_grad_norm(opt, 0.05f, 1.0f, &ref_norm));
    TU_OK(apex_optimizer_step(opt, 1.0f, 0));

    forward_backward(&zn, dt, step);
    TU_OK(apex_zero_reduce_grads(z));
    size_t peak = 0, now = apex_zero_grad_bytes(z, &peak);
    for (int i = 0; i < NPARAM; i++) assert_int_equal(apex_tensor_released(zn.g[i]), !keep);
    assert_int_equal(now, keep ? total : 0);
    /* After the first step the backward makes each gradient and its bucket takes it at once. */
    if (!keep && step > 1 && peak > layer) fail_msg("step %d: the gradients held %zu bytes at once; one bucket is %zu (the model %zu)", step, peak, layer, total);
    if (keep || step == 1) assert_int_equal(peak, total);
    if (step == CLIP_STEP) {
      TU_OK(apex_zero_clip_grad_norm(z, 0.05f, 1.0f, &z_norm)); /* from the shards: nothing gathered */
      assert_int_equal(tu_bits(z_norm), tu_bits(ref_norm));
      assert_int_equal(apex_zero_grad_bytes(z, NULL), keep ? total : 0);
    }
    TU_OK(apex_zero_step(z, 1.0f, NULL));
    assert_int_equal(apex_zero_grad_bytes(z, NULL), keep ? total : 0);
    for (int i = 0; i < NPARAM; i++) assert_same_bits(zn.p[i], ref.p[i], i, step);
  }
  apex_zero_destroy(z);
  apex_reducer_destroy(red);
  apex_optimizer_destroy(opt);
  free_net(&ref);
  free_net(&zn);
}

static void test_f32_releases(void **state) { (void)state, run(APEX_F32, 0); }
static void test_bf16_releases(void **state) { (void)state, run(APEX_BF16, 0); }
static void test_keep_grads(void **state) { (void)state, run(APEX_F32, 1); }

static void test_bad_input(void **state) {
  (void)state;
  size_t peak = 7;
  assert_int_equal(apex_zero_grad_bytes(NULL, &peak), 0);
  assert_int_equal(peak, 0);
  assert_non_null(strstr(apex_last_error(), "z is NULL"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32_releases),
      cmocka_unit_test(test_bf16_releases),
      cmocka_unit_test(test_keep_grads),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, tu_pg_setup, tu_pg_teardown);
}
