/* test_threads_team.c: apex's parallel regions keep OpenMP's team whole (issue #33).
 *
 * libgomp keeps a pool of threads between parallel regions; a region with a smaller team ends the pool
 * threads it leaves out, and the next bigger region creates new ones. A matrix product of 4 tiles run
 * on a team of 4 between regions of 8 threads cost 4 thread exits and creations each time: on the
 * 16-core machine the MLP (8-tile products) peaked at 8 threads and fell at 16. So a product with fewer
 * tiles than threads, and attention with fewer heads than threads, run on the whole team with threads
 * left idle. The check is independent of apex's code: the kernel's thread ids (gettid) of a full region
 * before and after the op must be the same threads. And since a team may be smaller than asked (one
 * thread, inside the caller's own region), the threads that run tiles are counted in the team OpenMP
 * gave: a product called there gives the bits it gives outside. */
#define _GNU_SOURCE /* syscall */
#include <omp.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "apex/threads.h"
#include "testutil.h"

enum { TEAM = 8 };

static int cmp_int(const void *x, const void *y) { return *(const int *)x - *(const int *)y; }

/* The sorted thread ids of a region of TEAM threads. */
static void team_ids(int ids[TEAM]) {
#pragma omp parallel num_threads(TEAM)
  ids[omp_get_thread_num()] = (int)syscall(SYS_gettid);
  qsort(ids, TEAM, sizeof ids[0], cmp_int);
}

static void assert_same_team(const int before[TEAM], const char *what) {
  int after[TEAM];
  team_ids(after);
  for (int i = 0; i < TEAM; i++)
    if (before[i] != after[i]) fail_msg("%s: OpenMP's pool changed threads (thread id %d became %d): a region ran a smaller team", what, before[i], after[i]);
}

/* Products of 1 to a few tiles (f32 and bf16, forward and backward: both grids), between full regions. */
static void test_products_keep_the_team(void **state) {
  (void)state;
  TU_OK(apex_set_num_threads(TEAM));
  apex_set_threads_follow_load(0);
  static const int64_t shapes[][3] = {{64, 256, 256}, {96, 512, 128}, {128, 784, 1000}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int d = 0; d < 2; d++) {
      apex_dtype dt = d ? APEX_BF16 : APEX_F32;
      int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
      apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){m, k}, 3 + s, 1), *w = tu_random_leaf(dt, 2, (int64_t[]){k, n}, 5 + s, 1);
      int before[TEAM];
      team_ids(before);
      apex_graph *g = apex_graph_create();
      apex_var *y = apex_matmul(g, x, w);
      if (!y) fail_msg("%s", apex_last_error());
      apex_tensor *r = tu_random_tensor(APEX_F32, (size_t)(m * n), 7 + s, 1.0f);
      TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = r}));
      apex_tensor_destroy(r);
      char what[96];
      snprintf(what, sizeof what, "%s matmul [%lld, %lld] x [%lld, %lld]", apex_dtype_name(dt), (long long)m, (long long)k, (long long)k,
               (long long)n);
      assert_same_team(before, what);
      apex_graph_destroy(g);
      apex_var_destroy(x);
      apex_var_destroy(w);
    }
  apex_set_threads_follow_load(1);
}

/* Attention with 2 heads on 8 threads: 2 threads run heads, the others wait in the same team. */
static void test_attention_keeps_the_team(void **state) {
  (void)state;
  TU_OK(apex_set_num_threads(TEAM));
  apex_set_threads_follow_load(0);
  int64_t shape[4] = {1, 2, 64, 32};
  apex_var *q = tu_random_leaf(APEX_F32, 4, shape, 11, 1), *k = tu_random_leaf(APEX_F32, 4, shape, 12, 1),
           *v = tu_random_leaf(APEX_F32, 4, shape, 13, 1);
  for (int rep = 0; rep < 2; rep++) { /* the first call sizes the heads' scratch on head 0 alone */
    int before[TEAM];
    team_ids(before);
    apex_graph *g = apex_graph_create();
    apex_var *y = apex_causal_attention(g, q, k, v);
    if (!y) fail_msg("%s", apex_last_error());
    apex_tensor *r = tu_random_tensor(APEX_F32, 2 * 64 * 32, 17, 1.0f);
    TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = r}));
    apex_tensor_destroy(r);
    assert_same_team(before, "causal attention, 2 heads");
    apex_graph_destroy(g);
  }
  apex_var_destroy(q);
  apex_var_destroy(k);
  apex_var_destroy(v);
  apex_set_threads_follow_load(1);
}

/* y = x w (and its gradients) as f32 copies, the graph gone. */
static void matmul_run(apex_var *x, apex_var *w, const apex_tensor *r, apex_tensor *out[3]) {
  apex_graph *g = apex_graph_create();
  apex_var *y = apex_matmul(g, x, w);
  if (!y) fail_msg("%s", apex_last_error());
  TU_OK(apex_tensor_fill(apex_var_grad(x), 0.0f));
  TU_OK(apex_tensor_fill(apex_var_grad(w), 0.0f));
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = r}));
  out[0] = apex_tensor_to(apex_var_value(y), APEX_F32);
  out[1] = apex_tensor_to(apex_var_grad(x), APEX_F32);
  out[2] = apex_tensor_to(apex_var_grad(w), APEX_F32);
  apex_graph_destroy(g);
}

/* A product called from one thread of the caller's own parallel region (OpenMP then gives apex's
 * region one thread, whatever apex asks for) still runs every tile: the same bits as outside it. */
static void test_product_inside_a_region(void **state) {
  (void)state;
  TU_OK(apex_set_num_threads(TEAM));
  apex_set_threads_follow_load(0);
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = d ? APEX_BF16 : APEX_F32;
    apex_var *x = tu_random_leaf(dt, 2, (int64_t[]){128, 784}, 21, 1), *w = tu_random_leaf(dt, 2, (int64_t[]){784, 1000}, 22, 1);
    apex_tensor *r = tu_random_tensor(APEX_F32, 128 * 1000, 23, 1.0f), *outside[3], *inside[3];
    matmul_run(x, w, r, outside);
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      matmul_run(x, w, r, inside);
    }
    for (int p = 0; p < 3; p++) {
      for (size_t i = 0; i < apex_tensor_numel(outside[p]); i++)
        if (tu_bits(apex_tensor_get(inside[p], i)) != tu_bits(apex_tensor_get(outside[p], i)))
          fail_msg("%s result %d element %zu: %.9g inside a region, %.9g outside", apex_dtype_name(dt), p, i, apex_tensor_get(inside[p], i),
                   apex_tensor_get(outside[p], i));
      apex_tensor_destroy(inside[p]);
      apex_tensor_destroy(outside[p]);
    }
    apex_tensor_destroy(r);
    apex_var_destroy(x);
    apex_var_destroy(w);
  }
  apex_set_threads_follow_load(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_products_keep_the_team),
      cmocka_unit_test(test_attention_keeps_the_team),
      cmocka_unit_test(test_product_inside_a_region),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
