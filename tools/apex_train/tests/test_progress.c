/* test_progress.c: apex-train's progress line (progress.h) at terminal widths 40, 60, 80 and 120,
 * the recent-window step rate, and when a bar may be drawn (a pipe: never; a pty: yes, unless an
 * MPI launcher's variables say this is a rank).
 *
 * The expected lines are written out by hand from the rule in progress.h (fields dropped least
 * useful first: the bar, skipped, scale, ms/step, rate, epoch, ETA; the last column left empty). */
#define _XOPEN_SOURCE 600
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "testutil.h"
#include "../progress.h"

static const progress_point point = {.epoch = 1, .epochs = 2, .step = 500, .total_steps = 1874, .loss = 0.41234,
                                     .loss_scale = 65536, .skipped = 3, .samples_per_s = 12345.4, .ms_per_step = 5.2,
                                     .eta_s = 125};

static void expect_line(int width, const char *want) {
  char buf[512];
  size_t n = progress_format(buf, sizeof buf, &point, width, 1);
  if (strcmp(buf, want) != 0) fail_msg("width %d:\n got  '%s'\n want '%s'", width, buf, want);
  assert_int_equal(n, strlen(want));
  assert_true((int)n <= width - 1);
}

static void test_each_width(void **state) {
  (void)state;
  /* The fields in order of use: "step 500/1874" (13) "loss 0.4123" (11) "ETA 2m05s" (9) "epoch 1/2" (9)
   * "12345 samples/s" (15) "5.2 ms/step" (11) "scale 65536" (11) "skipped 3" (9), one space apart,
   * each taken while the line stays within width - 1. The old line was 111 characters. */
  /* 39: 13 + 12 + 10 = 35; the epoch would make 45. */
  expect_line(40, "step 500/1874 loss 0.4123 ETA 2m05s");
  /* 59: 45 with the epoch; the rate would make 61, ms/step makes 57. */
  expect_line(60, "epoch 1/2 step 500/1874 loss 0.4123 5.2 ms/step ETA 2m05s");
  /* 79: 73 with rate and ms/step; scale would make 85. */
  expect_line(80, "epoch 1/2 step 500/1874 loss 0.4123 12345 samples/s 5.2 ms/step ETA 2m05s");
  /* 119: all eight fields make 95; 119 - 95 - 1 = 23 is left for "[" 21 cells "]", filled
   * round(21 * 500 / 1874) = round(5.60) = 6. */
  expect_line(120, "[######...............] epoch 1/2 step 500/1874 loss 0.4123 scale 65536 skipped 3 12345 samples/s 5.2 ms/step ETA 2m05s");
}

static void test_narrow_and_plain(void **state) {
  (void)state;
  char buf[512];
  /* 20 columns: step and loss no longer both fit (13 + 1 + 11 = 25 > 19). */
  progress_format(buf, sizeof buf, &point, 20, 1);
  assert_string_equal(buf, "step 500/1874");
  /* 10 columns: even the step is cut to 9 characters, never wrapped. */
  progress_format(buf, sizeof buf, &point, 10, 1);
  assert_string_equal(buf, "step 500/");
  /* Plain lines (a file): every field, no bar. */
  progress_format(buf, sizeof buf, &point, 512, 0);
  assert_string_equal(buf, "epoch 1/2 step 500/1874 loss 0.4123 scale 65536 skipped 3 12345 samples/s 5.2 ms/step ETA 2m05s");
  /* gpt: tok/s instead of samples/s; an unknown ETA; a NaN loss is shown, not hidden. */
  progress_point g = point;
  g.tokens_per_s = 81920;
  g.eta_s = -1;
  g.loss = NAN;
  progress_format(buf, sizeof buf, &g, 512, 0);
  assert_string_equal(buf, "epoch 1/2 step 500/1874 loss nan scale 65536 skipped 3 81920 tok/s 5.2 ms/step ETA ?");
}

static void test_rate_window(void **state) {
  (void)state;
  progress_rate r = {0};
  assert_true(progress_rate_step_s(&r) == 0);
  progress_rate_push(&r, 100.0); /* the start */
  assert_true(progress_rate_step_s(&r) == 0);
  /* 10 slow steps of 1 s, then 40 fast ones of 0.25 s: the window holds the last 20 (0.25 s each),
   * while the average since the start would be (10 + 10) / 50 = 0.4 s. */
  double t = 100.0;
  for (int i = 0; i < 10; i++) progress_rate_push(&r, t += 1.0);
  assert_true(progress_rate_step_s(&r) == 1.0);
  for (int i = 0; i < 40; i++) progress_rate_push(&r, t += 0.25);
  assert_true(progress_rate_step_s(&r) == 0.25);
  /* Early on, the window is the steps so far: 2 of 1 s and 2 of 0.5 s give 0.75 s. */
  progress_rate q = {0};
  double times[] = {0, 1, 2, 2.5, 3};
  for (int i = 0; i < 5; i++) progress_rate_push(&q, times[i]);
  assert_true(progress_rate_step_s(&q) == 0.75);
}

static void test_interactive(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  assert_int_equal(progress_interactive(p[1]), 0);
  close(p[0]);
  close(p[1]);
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    if (master >= 0) close(master);
    skip(); /* no pty in this environment: the launcher half cannot be checked */
  }
  int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  assert_true(slave >= 0);
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("PMI_SIZE");
  unsetenv("MV2_COMM_WORLD_RANK");
  assert_int_equal(progress_interactive(slave), 1);
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    setenv(vars[i], "0", 1);
    assert_int_equal(progress_interactive(slave), 0);
    unsetenv(vars[i]);
  }
  /* A pty reports its size; without one (0 columns) $COLUMNS, then 80. */
  struct winsize ws = {.ws_row = 24, .ws_col = 57};
  if (ioctl(slave, TIOCSWINSZ, &ws) == 0) assert_int_equal(progress_terminal_width(slave), 57);
  close(slave);
  close(master);
  int q[2];
  assert_int_equal(pipe(q), 0);
  setenv("COLUMNS", "66", 1);
  assert_int_equal(progress_terminal_width(q[1]), 66);
  unsetenv("COLUMNS");
  assert_int_equal(progress_terminal_width(q[1]), 80);
  close(q[0]);
  close(q[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_width),
      cmocka_unit_test(test_narrow_and_plain),
      cmocka_unit_test(test_rate_window),
      cmocka_unit_test(test_interactive),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
