/* test_releasable.c: gradients whose memory is released and made again (core/internal.h's releasable
 * tensors, apex_tensor_released): what ZeRO stage 2 relies on. A released leaf gradient reads as zeros
 * everywhere it is read, is refused by a multi-tensor kernel, stays released through apex_var_zero_grad,
 * and a backward into it gives the bits of a backward into a zeroed one (the reference: the same
 * backward on a gradient that was never released), for f32 leaves (accumulated in place) and bf16 ones
 * (flushed at the end, and at the grad hook). Only whole autograd leaf gradients are releasable. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "testutil.h"

enum { N = 96 };

static apex_var *leaf(apex_dtype dt, int salt) {
  int64_t shape[2] = {8, 12};
  apex_tensor *t = apex_tensor_create(dt, 2, shape);
  assert_non_null(t);
  for (size_t j = 0; j < N; j++) apex_tensor_set(t, j, 0.01f * (float)((j * 37 + (size_t)salt * 11) % 19) - 0.09f);
  apex_var *v = apex_var_create(t, 1);
  assert_non_null(v);
  return v;
}

static void test_released_reads_as_zeros(void **state) {
  (void)state;
  apex_var *v = leaf(APEX_F32, 1);
  apex_tensor *g = apex_var_grad(v);
  TU_OK(apex_tensor_fill(g, 3.0f));
  assert_false(apex_tensor_released(g));
  assert_int_equal(apex__tensor_release(g), 1);
  assert_true(apex_tensor_released(g));
  assert_null(apex_tensor_data(g));
  assert_true(apex_tensor_get(g, 5) == 0.0f);
  /* a copy from it writes zeros; a kernel refuses it, saying why */
  int64_t n = N;
  apex_tensor *out = apex_tensor_create(APEX_F32, 1, &n);
  TU_OK(apex_tensor_fill(out, 7.0f));
  TU_OK(apex_tensor_copy(out, g));
  for (size_t j = 0; j < N; j++) assert_true(apex_tensor_get(out, j) == 0.0f);
  TU_FAILS(apex_mt_scale(0, NULL, &g, &out, 1, 2.0f), APEX_ERR_STATE, "ZeRO stage 2 released");
  /* zero_grad keeps it released; a fill makes it again */
  TU_OK(apex_var_zero_grad(v));
  assert_true(apex_tensor_released(g));
  TU_OK(apex_tensor_fill(g, 2.0f));
  assert_false(apex_tensor_released(g));
  assert_true(apex_tensor_get(g, N - 1) == 2.0f);
  /* a copy into a released one and apex_tensor_set make it again, zeros around what they write */
  assert_int_equal(apex__tensor_release(g), 1);
  apex_tensor_set(g, 3, 4.0f);
  assert_true(apex_tensor_get(g, 3) == 4.0f && apex_tensor_get(g, 4) == 0.0f);
  assert_int_equal(apex__tensor_release(g), 1);
  TU_OK(apex_tensor_copy(g, out));
  assert_false(apex_tensor_released(g));
  /* a view is not released by itself, but follows its storage */
  int64_t half = N / 2;
  apex_tensor *view = apex_tensor_slice_view(g, half, 1, &half);
  assert_int_equal(apex__tensor_release(view), 0);
  assert_int_equal(apex__tensor_release(g), 1);
  assert_true(apex_tensor_released(view));
  TU_OK(apex__tensor_remake(view, 1, "test"));
  assert_false(apex_tensor_released(g));
  assert_true(apex_tensor_get(g, 0) == 0.0f);
  apex_tensor_destroy(view);
  apex_tensor_destroy(out);
  apex_var_destroy(v);
}

static void test_only_leaf_grads_release(void **state) {
  (void)state;
  int64_t n = N;
  float host[N] = {0};
  apex_tensor *made = apex_tensor_create(APEX_F32, 1, &n), *wrapped = apex_tensor_wrap(host, APEX_F32, 1, &n);
  assert_int_equal(apex__tensor_release(made), 0); /* a caller's own tensor */
  assert_int_equal(apex__tensor_release(wrapped), 0);
  apex__tensor_set_releasable(wrapped); /* never: the caller's memory */
  assert_int_equal(apex__tensor_release(wrapped), 0);
  assert_false(apex_tensor_released(NULL));
  assert_non_null(strstr(apex_last_error(), "NULL tensor"));
  apex_tensor_destroy(made);
  apex_tensor_destroy(wrapped);
  /* amp's swap_value gives the leaf a new gradient, releasable too */
  apex_var *v = leaf(APEX_F32, 2);
  int64_t shape[2] = {8, 12};
  apex_tensor_destroy(apex_var_swap_value(v, apex_tensor_create(APEX_BF16, 2, shape)));
  assert_int_equal(apex__tensor_release(apex_var_grad(v)), 1);
  apex_var_destroy(v);
}

static apex_status count_hook(void *ctx, apex_var *leaf) {
  (void)leaf;
  ++*(int *)ctx;
  return APEX_OK;
}

/* Two backwards of loss = sum((w * x)^2 + w) into w's gradient; the released one first released. */
static void backward_twice(apex_dtype dt, int hook) {
  apex_var *w[2] = {leaf(dt, 3), leaf(dt, 3)};
  for (int k = 0; k < 2; k++) {
    apex_graph *g = apex_graph_create();
    int calls = 0;
    if (hook) TU_OK(apex_graph_set_grad_hook(g, count_hook, &calls));
    for (int step = 0; step < 2; step++) {
      apex_tensor *xt = apex_tensor_create(dt, 2, (int64_t[]){8, 12});
      for (size_t j = 0; j < N; j++) apex_tensor_set(xt, j, 0.5f - 0.01f * (float)((j * 13 + (size_t)step) % 97));
      if (k == 1) assert_int_equal(apex__tensor_release(apex_var_grad(w[k])), 1); /* as ZeRO after a reduce */
      else TU_OK(apex_var_zero_grad(w[k]));
      apex_var *x = apex_graph_input(g, xt, 0), *y = apex_mul(g, w[k], x);
      TU_OK(apex_backward(apex_sum_all(g, apex_add(g, apex_mul(g, y, y), w[k])), NULL));
      assert_false(apex_tensor_released(apex_var_grad(w[k])));
      apex_graph_reset(g);
      apex_tensor_destroy(xt);
    }
    if (hook) assert_int_equal(calls, 2);
    apex_graph_destroy(g);
  }
  const apex_tensor *a = apex_var_grad(w[0]), *b = apex_var_grad(w[1]);
  assert_memory_equal(apex_tensor_data(a), apex_tensor_data(b), apex_tensor_nbytes(a));
  apex_var_destroy(w[0]);
  apex_var_destroy(w[1]);
}

static void test_backward_remakes(void **state) {
  (void)state;
  backward_twice(APEX_F32, 0);
  backward_twice(APEX_BF16, 0);
  backward_twice(APEX_F32, 1);
  backward_twice(APEX_BF16, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_released_reads_as_zeros),
      cmocka_unit_test(test_only_leaf_grads_release),
      cmocka_unit_test(test_backward_remakes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
