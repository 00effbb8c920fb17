/* test_nn_large_count.c: op parameters that count rows stay exact past 2^24.
 *
 * Cross entropy's MEAN divides by the number of rows with a target. That count was once kept in a
 * float, which holds integers exactly only up to 2^24: at 2^24 + 1 rows it read back as 2^24 and
 * every gradient came out 2^-24 relative too large. The expected gradient here is the closed form
 * of PyTorch's: all-zero logits over two classes give p = (0.5, 0.5), so row i's gradient is
 * w * (0.5 - 1) and w * 0.5 with w = (float)(1 / count). About 0.6 GB (0.5 s), so it is labelled long. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "apex/nn.h"

static void test_cross_entropy_mean_count(void **state) {
  (void)state;
  const int64_t N = ((int64_t)1 << 24) + 1;
  apex_tensor *x = apex_tensor_create(APEX_F32, 2, (int64_t[]){N, 2});
  int64_t *targets = calloc((size_t)N, sizeof *targets);
  assert_non_null(x);
  assert_non_null(targets);
  memset(apex_tensor_data(x), 0, (size_t)N * 2 * sizeof(float));
  apex_graph *g = apex_graph_create();
  apex_var *xv = apex_graph_input(g, x, 1);
  apex_var *loss = apex_cross_entropy(g, xv, targets, NULL);
  if (!loss) fail_msg("%s", apex_last_error());
  TU_OK(apex_backward(loss, NULL));
  const float *gx = apex_tensor_data(apex_var_grad(xv));
  float w = (float)(1.0 / (double)N), w_at_2_24 = (float)(1.0 / 16777216.0);
  assert_true(w != w_at_2_24); /* the case tells the two counts apart */
  for (int64_t i = 0; i < N; i += N / 7) {
    assert_true(gx[2 * i] == w * -0.5f);
    assert_true(gx[2 * i + 1] == w * 0.5f);
  }
  assert_true(gx[2 * (N - 1)] == w * -0.5f);
  apex_graph_destroy(g);
  apex_tensor_destroy(x);
  free(targets);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cross_entropy_mean_count)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
