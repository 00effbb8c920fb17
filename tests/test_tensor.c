/* test_tensor.c: tensor creation, views, fill, copy and conversion, and every bad input. */
#include <math.h>
#include <stdlib.h>

#include "apex/cuda.h"
#include "apex/kernels.h"
#include "testutil.h"

static void test_create_and_query(void **state) {
  (void)state;
  int64_t shape[3] = {2, 3, 4};
  apex_tensor *t = apex_tensor_create(APEX_BF16, 3, shape);
  assert_non_null(t);
  assert_int_equal(apex_tensor_numel(t), 24);
  assert_int_equal(apex_tensor_nbytes(t), 48);
  assert_int_equal(apex_tensor_ndim(t), 3);
  assert_int_equal(apex_tensor_dim(t, -1), 4);
  assert_int_equal(apex_tensor_dim(t, 3), -1);
  assert_int_equal(apex_tensor_dtype(t), APEX_BF16);
  assert_int_equal(apex_tensor_device(t), APEX_DEVICE_CPU);
  assert_int_equal((uintptr_t)apex_tensor_data(t) % 64, 0);
  for (size_t i = 0; i < 24; i++) assert_true(apex_tensor_get(t, i) == 0.0f); /* zero-filled */
  char buf[64];
  assert_string_equal(apex_tensor_shape_str(t, buf, sizeof buf), "[2, 3, 4]");
  apex_tensor_destroy(t);
  apex_tensor *s = apex_tensor_create(APEX_F32, 0, NULL); /* a scalar */
  assert_non_null(s);
  assert_int_equal(apex_tensor_numel(s), 1);
  apex_tensor_destroy(s);
  int64_t eight[8] = {1, 1, 1, 1, 1, 1, 1, 2};
  s = apex_tensor_create(APEX_F16, 8, eight);
  assert_non_null(s);
  apex_tensor_destroy(s);
  apex_tensor_destroy(NULL);
}

static void test_fill_copy_convert(void **state) {
  (void)state;
  int64_t shape[2] = {3, 5};
  apex_tensor *a = apex_tensor_create(APEX_F32, 2, shape);
  apex_tensor *h = apex_tensor_create(APEX_F16, 2, shape);
  TU_OK(apex_tensor_fill(a, 0.1f));
  TU_OK(apex_tensor_copy(h, a));
  for (size_t i = 0; i < 15; i++) assert_int_equal(((uint16_t *)apex_tensor_data(h))[i], apex_f32_to_f16(0.1f));
  apex_tensor *b = apex_tensor_to(h, APEX_BF16);
  assert_non_null(b);
  assert_int_equal(((uint16_t *)apex_tensor_data(b))[7], apex_f32_to_bf16(apex_f16_to_f32(apex_f32_to_f16(0.1f))));
  TU_OK(apex_tensor_fill(h, 1e6f)); /* beyond f16: Inf */
  assert_true(apex_tensor_get(h, 0) > 1e30f);
  apex_tensor_set(a, 4, -3.5f);
  assert_true(apex_tensor_get(a, 4) == -3.5f);
  apex_tensor *c = apex_tensor_clone(a);
  assert_memory_equal(apex_tensor_data(c), apex_tensor_data(a), 60);
  assert_false(apex_tensor_shares_storage(a, c));
  apex_tensor_destroy(a);
  apex_tensor_destroy(b);
  apex_tensor_destroy(c);
  apex_tensor_destroy(h);
}

/* Fills large enough to run in parallel blocks (including a partial last block), on a view that
 * starts mid-storage so that nothing outside it may change: every element gets the value's bits. */
static void test_fill_large(void **state) {
  (void)state;
  const apex_dtype types[3] = {APEX_F32, APEX_F16, APEX_BF16};
  const float values[3] = {0.0f, -0.0f, 0.1f};
  const size_t n = 3 * 65536 + 123;
  for (int d = 0; d < 3; d++)
    for (int v = 0; v < 3; v++) {
      int64_t total = (int64_t)n + 2, shape[1] = {(int64_t)n};
      apex_tensor *base = apex_tensor_create(types[d], 1, &total);
      TU_OK(apex_tensor_fill(base, 7.0f));
      apex_tensor *view = apex_tensor_slice_view(base, 1, 1, shape);
      assert_non_null(view);
      TU_OK(apex_tensor_fill(view, values[v]));
      size_t es = apex_dtype_size(types[d]);
      unsigned char want[4], seven[4];
      TU_OK(apex_convert(want, types[d], &values[v], APEX_F32, 1));
      float s7 = 7.0f;
      TU_OK(apex_convert(seven, types[d], &s7, APEX_F32, 1));
      const unsigned char *p = apex_tensor_data(base);
      assert_memory_equal(p, seven, es);
      for (size_t i = 1; i <= n; i++) assert_memory_equal(p + i * es, want, es);
      assert_memory_equal(p + (n + 1) * es, seven, es);
      apex_tensor_destroy(view);
      apex_tensor_destroy(base);
    }
}

static void test_views(void **state) {
  (void)state;
  int64_t shape[2] = {4, 6};
  apex_tensor *a = apex_tensor_create(APEX_F32, 2, shape);
  for (size_t i = 0; i < 24; i++) apex_tensor_set(a, i, (float)i);
  int64_t vs[1] = {24};
  apex_tensor *v = apex_tensor_view(a, 1, vs);
  assert_true(apex_tensor_shares_storage(a, v));
  int64_t ss[2] = {2, 3};
  apex_tensor *s = apex_tensor_slice_view(a, 10, 2, ss);
  assert_true(apex_tensor_get(s, 0) == 10.0f);
  apex_tensor_set(s, 5, 100.0f);
  apex_tensor_destroy(a); /* the views keep the storage alive */
  assert_true(apex_tensor_get(v, 15) == 100.0f);
  apex_tensor_destroy(s);
  apex_tensor_destroy(v);
}

static void test_wrap(void **state) {
  (void)state;
  float buf[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  apex_tensor *w = apex_tensor_wrap(buf, APEX_F32, 2, shape);
  assert_non_null(w);
  assert_ptr_equal(apex_tensor_data(w), buf);
  apex_tensor_set(w, 0, 9.0f);
  assert_true(buf[0] == 9.0f);
  apex_tensor_destroy(w); /* must not free buf (ASan would catch it) */
  assert_true(buf[5] == 6.0f);
}

static void test_bad_input(void **state) {
  (void)state;
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  assert_null(apex_tensor_create(APEX_F32, 9, nine));
  tu_assert_message("9 dimensions");
  int64_t neg[2] = {2, -3};
  assert_null(apex_tensor_create(APEX_F32, 2, neg));
  tu_assert_message("dimension 1 is -3");
  assert_null(apex_tensor_create(APEX_F32, 2, NULL));
  tu_assert_message("NULL shape");
  assert_null(apex_tensor_create((apex_dtype)5, 1, nine));
  tu_assert_message("invalid dtype");
  int64_t huge[3] = {INT64_MAX / 4, INT64_MAX / 4, 4};
  assert_null(apex_tensor_create(APEX_F32, 3, huge));
  tu_assert_message("overflows");
  const char *why;
  if (!apex_cuda_available(&why)) { /* a CPU-only build or machine: refused, saying which (a GPU: test_cuda) */
    assert_null(apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, nine));
    tu_assert_message(why);
  }
  assert_null(apex_tensor_create_on((apex_device)7, APEX_F32, 1, nine));
  tu_assert_message("unknown device 7");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  float host[9] = {0};
  assert_null(apex_tensor_wrap_on((apex_device)7, host, APEX_F32, 1, nine));
  tu_assert_message("unknown device 7");
  int64_t s1 = 5, s2 = 6;
  apex_tensor *a = apex_tensor_create(APEX_F32, 1, &s1), *b = apex_tensor_create(APEX_F16, 1, &s2);
  TU_FAILS(apex_tensor_copy(a, b), APEX_ERR_SHAPE, "[5] has 5 elements, source [6] has 6");
  apex_clear_error();
  assert_int_equal(apex_last_status(), APEX_OK);
  assert_string_equal(apex_last_error(), "");
  assert_null(apex_tensor_view(a, 1, &s2));
  tu_assert_message("6 elements over a tensor [5]");
  assert_int_equal(apex_last_status(), APEX_ERR_SHAPE); /* a NULL-returning call's status */
  assert_null(apex_tensor_slice_view(a, 3, 1, &s1));
  tu_assert_message("outside");
  char odd[8];
  assert_null(apex_tensor_wrap(odd + 1, APEX_F32, 1, &s1));
  tu_assert_message("aligned");
  assert_null(apex_tensor_wrap(NULL, APEX_F32, 1, &s1));
  tu_assert_message("NULL data");
  TU_FAILS(apex_tensor_fill(NULL, 1), APEX_ERR_INVALID_ARG, "NULL");
  apex_tensor_destroy(a);
  apex_tensor_destroy(b);
}

/* Every accessor takes NULL (a failed call earlier in a chain) without crashing: it returns the
 * value tensor.h gives, which no tensor has, and leaves a message that keeps the earlier failure. */
static void test_null_accessors(void **state) {
  (void)state;
  apex_clear_error();
  assert_int_equal(apex_tensor_dtype(NULL), APEX_DTYPE_COUNT);
  tu_assert_message("apex_tensor_dtype: NULL tensor");
  assert_int_equal(apex_last_status(), APEX_ERR_INVALID_ARG);
  assert_int_equal(apex_tensor_device(NULL), APEX_DEVICE_NONE);
  tu_assert_message("apex_tensor_device: NULL tensor");
  assert_int_equal(apex_tensor_ndim(NULL), -1);
  tu_assert_message("apex_tensor_ndim: NULL tensor");
  assert_int_equal(apex_tensor_dim(NULL, 0), -1);
  tu_assert_message("apex_tensor_dim: NULL tensor");
  assert_null(apex_tensor_shape(NULL));
  tu_assert_message("apex_tensor_shape: NULL tensor");
  assert_int_equal(apex_tensor_numel(NULL), 0);
  tu_assert_message("apex_tensor_numel: NULL tensor");
  assert_int_equal(apex_tensor_nbytes(NULL), 0);
  tu_assert_message("apex_tensor_nbytes: NULL tensor");
  assert_null(apex_tensor_data(NULL));
  tu_assert_message("apex_tensor_data: NULL tensor");
  assert_true(isnan(apex_tensor_get(NULL, 0)));
  tu_assert_message("apex_tensor_get: NULL tensor");
  apex_tensor_set(NULL, 0, 1.0f);
  tu_assert_message("apex_tensor_set: NULL tensor");
  int64_t three = 3;
  apex_tensor *t = apex_tensor_create(APEX_F16, 1, &three);
  assert_int_equal(apex_tensor_same_shape(t, NULL), 0);
  assert_int_equal(apex_tensor_same_shape(NULL, t), 0);
  assert_int_equal(apex_tensor_same_shape(NULL, NULL), 0);
  /* An index past the end: NaN, nothing written, a message naming both numbers. */
  apex_tensor_set(t, 1, 2.5f);
  assert_true(isnan(apex_tensor_get(t, 3)));
  tu_assert_message("element 3 of a tensor of 3 elements");
  apex_tensor_set(t, 3, 7.0f);
  tu_assert_message("element 3 of a tensor of 3 elements");
  assert_true(apex_tensor_get(t, 0) == 0.0f && apex_tensor_get(t, 1) == 2.5f && apex_tensor_get(t, 2) == 0.0f);
  /* The failure that made the NULL stays in the message: here a failed create, then an accessor. */
  int64_t neg = -1;
  assert_null(apex_tensor_create(APEX_F32, 1, &neg));
  assert_int_equal(apex_tensor_dtype(apex_tensor_create(APEX_F32, 1, &neg)), APEX_DTYPE_COUNT);
  tu_assert_message("apex_tensor_dtype: NULL tensor");
  tu_assert_message("dimension 0 is -1");
  apex_tensor_destroy(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_and_query), cmocka_unit_test(test_fill_copy_convert), cmocka_unit_test(test_fill_large),
      cmocka_unit_test(test_views),            cmocka_unit_test(test_wrap),
      cmocka_unit_test(test_bad_input),        cmocka_unit_test(test_null_accessors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
