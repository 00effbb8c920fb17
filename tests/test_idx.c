/* test_idx.c: the IDX reader on small files written here: a valid one read back byte for byte, and
 * the refusals (missing, bad magic, truncated), each leaving the caller's handle as it was. The
 * Fashion-MNIST files themselves are read by test_nn_train and the examples. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "apex/data.h"
#include "testutil.h"

/* Writes bytes to a fresh temporary file; its name goes to path. */
static void write_tmp(char *path, const uint8_t *bytes, size_t n) {
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes, n), (ssize_t)n);
  close(fd);
}

static void test_load_and_refusals(void **state) {
  (void)state;
  /* [2, 3] unsigned bytes: 0x00 0x00 0x08 0x02, sizes 2 and 3 big-endian, six elements. */
  const uint8_t good[4 + 8 + 6] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 10, 20, 30, 40, 50, 255};
  char gp[] = "/tmp/apex_test_idx_XXXXXX", bp[] = "/tmp/apex_test_idx_XXXXXX", tp[] = "/tmp/apex_test_idx_XXXXXX";
  write_tmp(gp, good, sizeof good);
  uint8_t bad[sizeof good];
  memcpy(bad, good, sizeof good);
  bad[0] = 1; /* not two zero bytes */
  write_tmp(bp, bad, sizeof bad);
  write_tmp(tp, good, sizeof good - 2); /* two elements short */
  apex_idx *idx = NULL;
  TU_OK(apex_idx_load(gp, &idx));
  assert_int_equal(apex_idx_ndim(idx), 2);
  assert_int_equal(apex_idx_dim(idx, 0), 2);
  assert_int_equal(apex_idx_dim(idx, 1), 3);
  assert_int_equal(apex_idx_dim(idx, 2), -1);
  assert_int_equal(apex_idx_numel(idx), 6);
  assert_memory_equal(apex_idx_data(idx), good + 12, 6);
  /* Every failure leaves the handle the caller had. */
  apex_idx *keep = idx;
  TU_FAILS(apex_idx_load("/nonexistent/apex/idx", &keep), APEX_ERR_IO, "/nonexistent/apex/idx");
  assert_ptr_equal(keep, idx);
  TU_FAILS(apex_idx_load(bp, &keep), APEX_ERR_CORRUPT, "bad magic");
  assert_ptr_equal(keep, idx);
  TU_FAILS(apex_idx_load(tp, &keep), APEX_ERR_CORRUPT, "truncated");
  assert_ptr_equal(keep, idx);
  TU_FAILS(apex_idx_load(NULL, &keep), APEX_ERR_INVALID_ARG, "NULL path");
  assert_ptr_equal(keep, idx);
  TU_FAILS(apex_idx_load(gp, NULL), APEX_ERR_INVALID_ARG, "NULL out");
  apex_idx_destroy(idx);
  /* The accessors on NULL (a failed load's handle). */
  assert_int_equal(apex_idx_ndim(NULL), 0);
  tu_assert_message("apex_idx_ndim: NULL idx");
  assert_int_equal(apex_idx_dim(NULL, 0), -1);
  assert_int_equal(apex_idx_numel(NULL), 0);
  assert_null(apex_idx_data(NULL));
  tu_assert_message("apex_idx_data: NULL idx");
  unlink(gp);
  unlink(bp);
  unlink(tp);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_load_and_refusals)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
