/* test_divergence.c: apex-train's bad-step rule (divergence.h): a step is bad when its loss is not
 * finite or amp skipped it; max_bad bad steps in a row stop the run, as does a bad step at the
 * minimum loss scale; a good step resets the count; 0 never stops; the message names the cause. Expected step numbers are counted by hand. */
#include <math.h>

#include "testutil.h"
#include "../divergence.h"

static void test_streaks(void **state) {
  (void)state;
  divergence d = {.max_bad = 3};
  assert_int_equal(divergence_step(&d, 1, 2.3, 0, 0), 0);
  assert_int_equal(divergence_loss_bad(&d), 0);
  /* Two bad, one good: no stop; then three bad in a row (steps 5-7) stop at 7. */
  assert_int_equal(divergence_step(&d, 2, NAN, 1, 0), 0);
  assert_int_equal(divergence_loss_bad(&d), 1);
  assert_int_equal(divergence_step(&d, 3, 2.2, 1, 0), 0);
  assert_int_equal(divergence_loss_bad(&d), 0);
  assert_int_equal(divergence_step(&d, 4, 2.1, 0, 0), 0);
  assert_int_equal(divergence_step(&d, 5, INFINITY, 1, 0), 0);
  assert_int_equal(divergence_step(&d, 6, NAN, 1, 0), 0);
  assert_int_equal(divergence_step(&d, 7, 2.0, 1, 0), 1);
  char buf[256];
  divergence_describe(&d, 0.5, buf, sizeof buf);
  assert_string_equal(buf, "each of the 3 steps 5-7 had a non-finite loss (2 of them) or was skipped for a gradient overflow (loss scale now 0.5)");
}

static void test_causes(void **state) {
  (void)state;
  char buf[256];
  divergence d = {.max_bad = 2};
  divergence_step(&d, 1, NAN, 1, 0);
  assert_int_equal(divergence_step(&d, 2, -NAN, 1, 0), 1);
  divergence_describe(&d, 1, buf, sizeof buf);
  assert_string_equal(buf, "the loss was not finite (nan) at each of the 2 steps 1-2");
  divergence s = {.max_bad = 2};
  divergence_step(&s, 10, 1.5, 1, 0);
  assert_int_equal(divergence_step(&s, 11, 1.5, 1, 0), 1);
  assert_int_equal(divergence_loss_bad(&s), 0); /* overflow skips leave a state worth saving */
  divergence_describe(&s, 5.96046448e-08, buf, sizeof buf);
  assert_string_equal(buf, "each of the 2 steps 10-11 was skipped for a gradient overflow (loss scale now 5.96046e-08)");
  /* An overflow at the minimum scale stops at once, before max_bad; a good step at the minimum
   * scale (not skipped, finite loss) does not. */
  divergence m = {.max_bad = 50};
  assert_int_equal(divergence_step(&m, 40, 1.0, 0, 1), 0);
  assert_int_equal(divergence_step(&m, 41, 1.0, 1, 0), 0);
  assert_int_equal(divergence_step(&m, 42, 1.0, 1, 1), 1);
  divergence_describe(&m, 5.96046448e-08, buf, sizeof buf);
  assert_string_equal(buf, "step 42 overflowed with the loss scale at its minimum (5.96046e-08), after 2 bad steps in a row");
  /* max_bad 0 never stops; a last step with a NaN loss is still reported as such. */
  divergence n = {0};
  for (long i = 1; i <= 1000; i++) assert_int_equal(divergence_step(&n, i, i < 1000 ? 1.0 : NAN, i == 1000, 0), 0);
  assert_int_equal(divergence_loss_bad(&n), 1);
  divergence_describe(&n, 1, buf, sizeof buf);
  assert_string_equal(buf, "the loss at step 1000, the last, was not finite (nan)");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_streaks), cmocka_unit_test(test_causes)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
