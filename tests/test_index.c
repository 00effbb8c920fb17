/* test_index.c: indices on a device (index.h) and the ops that read them: apex_embedding_index,
 * apex_cross_entropy_index, apex_linear_cross_entropy_index, apex_gpt_forward_index, apex_gpt_loss_index.
 *
 * The reference for each op is its host-array twin (apex_embedding, apex_cross_entropy, ...) on the same
 * inputs: the values and every gradient must be the same bits, since the index path copies the ids on the
 * device instead of from the host and changes no arithmetic. Run on every device present (the CUDA cases
 * skip without a GPU). Each bad argument gets its status and message, and a refused apex_index_set
 * leaves the values it had. */
#include <stdlib.h>

#include "apex/cuda.h"
#include "testutil.h"

enum { V = 37, D = 8, B = 3, T = 5 };

static void assert_same(const apex_tensor *a, const apex_tensor *b, const char *what) {
  apex_tensor *ha = tu_host_copy(a), *hb = tu_host_copy(b);
  assert_int_equal(apex_tensor_nbytes(ha), apex_tensor_nbytes(hb));
  if (memcmp(apex_tensor_data(ha), apex_tensor_data(hb), apex_tensor_nbytes(ha)) != 0) fail_msg("%s: the index path's bits differ", what);
  apex_tensor_destroy(ha);
  apex_tensor_destroy(hb);
}

/* A leaf on dev with tu_random_tensor's values in dtype dt. */
static apex_var *leaf_on(apex_device dev, apex_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
  return apex_var_create(tu_random_on(dev, dt, ndim, shape, seed, 1.0f), 1);
}

static void fill_ids(int64_t *ids, int n, int64_t bound, int salt) {
  for (int i = 0; i < n; i++) ids[i] = (i * 7 + salt * 3 + (i % 3 == 0 ? 5 : 0)) % bound; /* repeats, for the sums */
}

/* ---- the index itself ------------------------------------------------------------------------------------- */

static void index_api_on(apex_device dev) {
  if (!tu_device_present(dev)) return;
  const int64_t shape[2] = {B, T};
  apex_index *ix = apex_index_create_on(dev, 2, shape, V);
  assert_non_null(ix);
  assert_int_equal(apex_index_device(ix), dev);
  assert_int_equal(apex_index_ndim(ix), 2);
  assert_int_equal(apex_index_dim(ix, 0), B);
  assert_int_equal(apex_index_dim(ix, 1), T);
  assert_int_equal(apex_index_dim(ix, 2), -1);
  tu_assert_message("dimension 2 of an index of 2");
  assert_int_equal(apex_index_numel(ix), B * T);
  assert_int_equal(apex_index_bound(ix), V);
  int64_t v[B * T], back[B * T];
  TU_OK(apex_index_get(ix, back, B * T)); /* zero-filled until set */
  for (int i = 0; i < B * T; i++) assert_int_equal(back[i], 0);
  fill_ids(v, B * T, V, 1);
  TU_OK(apex_index_set(ix, v, B * T));
  TU_OK(apex_index_get(ix, back, B * T));
  assert_memory_equal(v, back, sizeof v);
  /* refusals, each leaving the values */
  int64_t bad[B * T];
  memcpy(bad, v, sizeof bad);
  bad[B * T - 1] = V;
  TU_FAILS(apex_index_set(ix, bad, B * T), APEX_ERR_INVALID_ARG, "value 37 at 14 is outside [0, 37)");
  bad[B * T - 1] = -1;
  TU_FAILS(apex_index_set(ix, bad, B * T), APEX_ERR_INVALID_ARG, "outside [0, 37)");
  TU_FAILS(apex_index_set(ix, v, B * T - 1), APEX_ERR_INVALID_ARG, "14 values for an index of 15");
  TU_FAILS(apex_index_set(ix, NULL, B * T), APEX_ERR_INVALID_ARG, "NULL values");
  TU_FAILS(apex_index_set(NULL, v, B * T), APEX_ERR_INVALID_ARG, "NULL index");
  TU_FAILS(apex_index_get(ix, back, 3), APEX_ERR_INVALID_ARG, "room for 3 values");
  TU_OK(apex_index_get(ix, back, B * T));
  assert_memory_equal(v, back, sizeof v);
  apex_index_destroy(ix);
  apex_index_destroy(NULL);
  /* creation */
  assert_null(apex_index_create_on(dev, 0, shape, V));
  tu_assert_message("ndim must be in [1, APEX_MAX_DIMS]");
  assert_null(apex_index_create_on(dev, 2, NULL, V));
  tu_assert_message("NULL shape");
  assert_null(apex_index_create_on(dev, 2, (int64_t[]){2, -1}, V));
  tu_assert_message("extent -1 of dimension 1 is negative");
  assert_null(apex_index_create_on(dev, 2, shape, 0));
  tu_assert_message("bound 0");
  assert_null(apex_index_create_on((apex_device)42, 2, shape, V));
  assert_int_equal(apex_index_numel(NULL), -1);
  tu_assert_message("apex_index_numel: NULL index");
  assert_int_equal(apex_index_bound(NULL), -1);
  assert_int_equal(apex_index_ndim(NULL), -1);
  assert_int_equal(apex_index_device(NULL), APEX_DEVICE_NONE);
  /* an empty index sets and gets nothing */
  apex_index *e = apex_index_create_on(dev, 1, (int64_t[]){0}, 4);
  assert_non_null(e);
  TU_OK(apex_index_set(e, NULL, 0));
  TU_OK(apex_index_get(e, NULL, 0));
  apex_index_destroy(e);
}

static void test_index_api_cpu(void **state) {
  (void)state;
  index_api_on(APEX_DEVICE_CPU);
}

static void test_index_api_cuda(void **state) {
  (void)state;
  if (!tu_device_present(APEX_DEVICE_CUDA)) skip();
  index_api_on(APEX_DEVICE_CUDA);
}

/* ---- embedding and the losses ---------------------------------------------------------------------------- */

static void ops_on(apex_device dev, apex_dtype dt) {
  const int64_t shape[2] = {B, T}, wshape[2] = {V, D};
  int64_t ids[B * T], tg[B * T];
  fill_ids(ids, B * T, V, 2);
  fill_ids(tg, B * T, V, 5);
  apex_index *ix = apex_index_create_on(dev, 2, shape, V), *tx = apex_index_create_on(dev, 2, shape, V);
  assert_non_null(ix);
  assert_non_null(tx);
  TU_OK(apex_index_set(ix, ids, B * T));
  TU_OK(apex_index_set(tx, tg, B * T));
  /* two copies of the same weights: one for each path */
  apex_var *w_host = leaf_on(dev, dt, 2, wshape, 11), *w_ix = leaf_on(dev, dt, 2, wshape, 11);
  apex_var *head_host = leaf_on(dev, dt, 2, wshape, 12), *head_ix = leaf_on(dev, dt, 2, wshape, 12);
  apex_graph *g = apex_graph_create_on(dev), *g2 = apex_graph_create_on(dev); /* one per path: a backward ends its graph's step */
  assert_non_null(g);
  assert_non_null(g2);
  /* embedding -> [B T, D] -> linear cross entropy, summed with a plain cross entropy of the same logits,
   * so that every op of both kinds is on the path to the loss */
  const int64_t flat[2] = {B * T, D};
  apex_var *eh = apex_reshape(g, apex_embedding(g, w_host, ids, 2, shape), 2, flat);
  apex_var *ei = apex_reshape(g2, apex_embedding_index(g2, w_ix, ix), 2, flat);
  assert_non_null(eh);
  assert_non_null(ei);
  assert_same(apex_var_value(eh), apex_var_value(ei), "embedding_index's rows");
  apex_index *txf = apex_index_create_on(dev, 1, (int64_t[]){B * T}, V); /* the same targets, 1-d */
  assert_non_null(txf);
  TU_OK(apex_index_set(txf, tg, B * T));
  apex_var *lh = apex_add(g, apex_linear_cross_entropy(g, eh, head_host, tg, NULL, 4),
                          apex_cross_entropy(g, apex_cast(g, apex_linear(g, eh, head_host, NULL), APEX_F32), tg, NULL));
  apex_var *li = apex_add(g2, apex_linear_cross_entropy_index(g2, ei, head_ix, txf, NULL, 4),
                          apex_cross_entropy_index(g2, apex_cast(g2, apex_linear(g2, ei, head_ix, NULL), APEX_F32), txf, NULL));
  if (!lh || !li) fail_msg("the losses: %s", apex_last_error());
  assert_same(apex_var_value(lh), apex_var_value(li), "the losses");
  TU_OK(apex_backward(lh, NULL));
  TU_OK(apex_backward(li, NULL));
  assert_same(apex_var_grad(w_host), apex_var_grad(w_ix), "the embedding table's gradient");
  assert_same(apex_var_grad(head_host), apex_var_grad(head_ix), "the head's gradient");
  /* what the index path refuses, each with its reason */
  apex_graph_reset(g);
  apex_index *big = apex_index_create_on(dev, 1, (int64_t[]){B * T}, V + 1), *short_ix = apex_index_create_on(dev, 1, (int64_t[]){4}, V);
  assert_non_null(big);
  assert_non_null(short_ix);
  assert_null(apex_embedding_index(g, w_ix, big));
  tu_assert_message("bounded by 38, the weight [37, 8] has 37 rows");
  assert_null(apex_embedding_index(g, w_ix, NULL));
  tu_assert_message("NULL index");
  apex_var *x = apex_reshape(g, apex_embedding_index(g, w_ix, ix), 2, flat);
  assert_non_null(x);
  assert_null(apex_linear_cross_entropy_index(g, x, head_ix, big, NULL, 0));
  tu_assert_message("bounded by 38");
  assert_null(apex_linear_cross_entropy_index(g, x, head_ix, short_ix, NULL, 0));
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE);
  tu_assert_message("an index of 4 targets");
  apex_cross_entropy_options ign = {.use_ignore_index = 1, .ignore_index = 0};
  assert_null(apex_linear_cross_entropy_index(g, x, head_ix, txf, &ign, 0));
  tu_assert_message("cannot be ignored");
  assert_null(apex_cross_entropy_index(g, apex_cast(g, apex_linear(g, x, head_ix, NULL), APEX_F32), NULL, NULL));
  tu_assert_message("NULL index");
  apex_graph_destroy(g);
  apex_graph_destroy(g2);
  apex_index_destroy(big);
  apex_index_destroy(short_ix);
  apex_index_destroy(txf);
  apex_index_destroy(ix);
  apex_index_destroy(tx);
  apex_var_destroy(w_host), apex_var_destroy(w_ix), apex_var_destroy(head_host), apex_var_destroy(head_ix);
}

static void test_ops_cpu(void **state) {
  (void)state;
  ops_on(APEX_DEVICE_CPU, APEX_F32);
  ops_on(APEX_DEVICE_CPU, APEX_BF16);
}

static void test_ops_cuda(void **state) {
  (void)state;
  if (!tu_device_present(APEX_DEVICE_CUDA)) skip();
  ops_on(APEX_DEVICE_CUDA, APEX_F32);
  ops_on(APEX_DEVICE_CUDA, APEX_BF16);
}

/* ---- the GPT ----------------------------------------------------------------------------------------------- */

static apex_model *gpt_on(apex_device dev, apex_dtype dt, apex_module **gpt) {
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 5, .dtype = dt, .device = dev});
  assert_non_null(m);
  *gpt = apex_gpt_create(m, &(apex_gpt_options){.vocab = V, .n_layer = 2, .n_embd = 16, .n_head = 2, .n_positions = 8});
  assert_non_null(*gpt);
  return m;
}

static void gpt_on_device(apex_device dev, apex_dtype dt) {
  const int64_t shape[2] = {B, T};
  int64_t ids[B * T], tg[B * T];
  fill_ids(ids, B * T, V, 3);
  fill_ids(tg, B * T, V, 4);
  apex_module *gh, *gi;
  apex_model *mh = gpt_on(dev, dt, &gh), *mi = gpt_on(dev, dt, &gi);
  apex_index *ix = apex_index_create_on(dev, 2, shape, V), *tx = apex_index_create_on(dev, 2, shape, V);
  assert_non_null(ix);
  assert_non_null(tx);
  TU_OK(apex_index_set(ix, ids, B * T));
  TU_OK(apex_index_set(tx, tg, B * T));
  apex_graph *g = apex_graph_create_on(dev), *g2 = apex_graph_create_on(dev); /* one per path */
  for (int round = 0; round < 2; round++) { /* the second round reuses the positions the first made */
    apex_var *lh = apex_gpt_loss(gh, g, ids, tg, B, T), *li = apex_gpt_loss_index(gi, g2, ix, tx);
    if (!lh || !li) fail_msg("apex_gpt_loss(_index): %s", apex_last_error());
    assert_same(apex_var_value(lh), apex_var_value(li), "the GPT's loss");
    TU_OK(apex_backward(lh, NULL));
    TU_OK(apex_backward(li, NULL));
    for (size_t i = 0; i < apex_model_num_params(mh); i++) {
      const char *name;
      apex_var *ph = apex_model_param(mh, i, &name), *pi = apex_model_param(mi, i, NULL);
      assert_same(apex_var_grad(ph), apex_var_grad(pi), name);
    }
    apex_graph_reset(g);
    apex_graph_reset(g2);
    apex_var *fh = apex_gpt_forward(gh, g, ids, B, T), *fi = apex_gpt_forward_index(gi, g2, ix);
    if (!fh || !fi) fail_msg("apex_gpt_forward(_index): %s", apex_last_error());
    assert_same(apex_var_value(fh), apex_var_value(fi), "the GPT's logits");
    apex_graph_reset(g);
    apex_graph_reset(g2);
    for (size_t i = 0; i < apex_model_num_params(mh); i++) { /* the next round's gradients from zero */
      TU_OK(apex_tensor_fill(apex_var_grad(apex_model_param(mh, i, NULL)), 0.0f));
      TU_OK(apex_tensor_fill(apex_var_grad(apex_model_param(mi, i, NULL)), 0.0f));
    }
  }
  /* refusals */
  apex_index *flat = apex_index_create_on(dev, 1, (int64_t[]){B * T}, V), *other = apex_index_create_on(dev, 2, (int64_t[]){T, B}, V);
  apex_index *too_long = apex_index_create_on(dev, 2, (int64_t[]){1, 9}, V), *wide = apex_index_create_on(dev, 2, shape, V + 1);
  assert_non_null(flat), assert_non_null(other), assert_non_null(too_long), assert_non_null(wide);
  assert_null(apex_gpt_loss_index(gi, g, flat, tx));
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE);
  tu_assert_message("ids of 1 dimensions; give [B, T]");
  assert_null(apex_gpt_loss_index(gi, g, ix, other));
  tu_assert_message("targets of another shape than the ids [3, 5]");
  assert_null(apex_gpt_loss_index(gi, g, ix, NULL));
  tu_assert_message("NULL targets");
  assert_null(apex_gpt_forward_index(gi, g, too_long));
  tu_assert_message("1 <= T <= 8");
  assert_null(apex_gpt_forward_index(gi, g, wide));
  tu_assert_message("bounded by 38");
  assert_null(apex_gpt_forward_index(NULL, g, ix));
  tu_assert_message("NULL module");
  assert_null(apex_gpt_forward_index(gi, g, NULL));
  tu_assert_message("NULL ids");
  apex_index_destroy(flat), apex_index_destroy(other), apex_index_destroy(too_long), apex_index_destroy(wide);
  apex_graph_destroy(g);
  apex_graph_destroy(g2);
  apex_index_destroy(ix);
  apex_index_destroy(tx);
  apex_model_destroy(mh);
  apex_model_destroy(mi);
}

static void test_gpt_cpu(void **state) {
  (void)state;
  gpt_on_device(APEX_DEVICE_CPU, APEX_F32);
  gpt_on_device(APEX_DEVICE_CPU, APEX_BF16);
}

static void test_gpt_cuda(void **state) {
  (void)state;
  if (!tu_device_present(APEX_DEVICE_CUDA)) skip();
  gpt_on_device(APEX_DEVICE_CUDA, APEX_F32);
  gpt_on_device(APEX_DEVICE_CUDA, APEX_BF16);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_index_api_cpu), cmocka_unit_test(test_index_api_cuda), cmocka_unit_test(test_ops_cpu),
      cmocka_unit_test(test_ops_cuda),      cmocka_unit_test(test_gpt_cpu),        cmocka_unit_test(test_gpt_cuda),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
