/* test_syncbn_cuda.c: SyncBatchNorm's statistics (parallel.h: apex_syncbn_stats, _backward_reduce,
 * _backward_input) on tensors on the GPU give the bits the same calls give on the CPU (the device path
 * stages through host copies; the exchanges are the group's host side, here the local group). Exits 77,
 * skipped with the reason, without a GPU. */
#include <stdio.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "testutil.h"

static apex_tensor *up(const apex_tensor *h) {
  apex_tensor *d = apex_tensor_create_on(APEX_DEVICE_CUDA, apex_tensor_dtype(h), apex_tensor_ndim(h), apex_tensor_shape(h));
  assert_non_null(d);
  TU_OK(apex_tensor_copy(d, h));
  return d;
}

/* d (on the GPU) holds exactly h's bytes. */
static void assert_same_bits(const apex_tensor *d, const apex_tensor *h, const char *what) {
  apex_tensor *back = apex_tensor_create(apex_tensor_dtype(h), apex_tensor_ndim(h), apex_tensor_shape(h));
  TU_OK(apex_tensor_copy(back, d));
  int same = memcmp(apex_tensor_data(back), apex_tensor_data(h), apex_tensor_nbytes(h)) == 0;
  printf("%s %s: GPU and CPU %s\n", same ? "PASS" : "FAIL", what, same ? "bitwise equal" : "differ");
  apex_tensor_destroy(back);
  assert_true(same);
}

static void check(apex_dtype dt) {
  apex_pg *pg = apex_pg_create_local();
  assert_non_null(pg);
  const int64_t N = 8, C = 5, H = 6, W = 7, shape[4] = {N, C, H, W}, c1 = C;
  size_t n = (size_t)(N * C * H * W);
  apex_tensor *hx = tu_random_tensor(dt, n, 11, 2.0f), *hdy = tu_random_tensor(dt, n, 12, 1.0f), *hw = tu_random_tensor(APEX_F32, (size_t)C, 13, 1.0f);
  apex_tensor *x4 = apex_tensor_create(dt, 4, shape), *dy4 = apex_tensor_create(dt, 4, shape), *w1 = apex_tensor_create(APEX_F32, 1, &c1);
  TU_OK(apex_tensor_copy(x4, hx));
  TU_OK(apex_tensor_copy(dy4, hdy));
  TU_OK(apex_tensor_copy(w1, hw));
  apex_tensor *hs[5], *ds[5];
  for (int i = 0; i < 5; i++) {
    hs[i] = apex_tensor_create(APEX_F32, 1, &c1);
    ds[i] = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &c1);
    assert_non_null(ds[i]);
  }
  apex_tensor *dx4 = up(x4), *ddy4 = up(dy4), *dw1 = up(w1);
  int64_t ht = 0, dt_ = 0;
  /* mean, invstd, unbiased var; then sum_dy, sum_dy_xhat */
  TU_OK(apex_syncbn_stats(pg, x4, hs[0], hs[1], hs[2], 1e-5f, &ht));
  TU_OK(apex_syncbn_stats(pg, dx4, ds[0], ds[1], ds[2], 1e-5f, &dt_));
  assert_int_equal(ht, dt_);
  assert_same_bits(ds[0], hs[0], "syncbn mean");
  assert_same_bits(ds[1], hs[1], "syncbn invstd");
  assert_same_bits(ds[2], hs[2], "syncbn unbiased var");
  TU_OK(apex_syncbn_backward_reduce(pg, x4, dy4, hs[0], hs[1], hs[3], hs[4]));
  TU_OK(apex_syncbn_backward_reduce(pg, dx4, ddy4, ds[0], ds[1], ds[3], ds[4]));
  assert_same_bits(ds[3], hs[3], "syncbn sum_dy");
  assert_same_bits(ds[4], hs[4], "syncbn sum_dy_xhat");
  apex_tensor *hgx = apex_tensor_create(dt, 4, shape), *dgx = apex_tensor_create_on(APEX_DEVICE_CUDA, dt, 4, shape);
  TU_OK(apex_syncbn_backward_input(x4, dy4, hs[0], hs[1], w1, hs[3], hs[4], ht, hgx));
  TU_OK(apex_syncbn_backward_input(dx4, ddy4, ds[0], ds[1], dw1, ds[3], ds[4], dt_, dgx));
  assert_same_bits(dgx, hgx, "syncbn dx");
  for (int i = 0; i < 5; i++) {
    apex_tensor_destroy(hs[i]);
    apex_tensor_destroy(ds[i]);
  }
  apex_tensor *all[] = {hx, hdy, hw, x4, dy4, w1, dx4, ddy4, dw1, hgx, dgx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  apex_pg_destroy(pg);
}

static void test_f32(void **state) {
  (void)state;
  check(APEX_F32);
}

static void test_bf16(void **state) {
  (void)state;
  check(APEX_BF16);
}

int main(void) {
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("test_syncbn_cuda skipped: %s\n", why);
    return 77;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_f32), cmocka_unit_test(test_bf16)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
