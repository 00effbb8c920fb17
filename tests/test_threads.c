/* test_threads.c: apex's thread count (apex/threads.h): the setting and its error, the cap, and
 * following the load: the fit of threads to free cores (closed-form cases), and that the measured
 * count always stays within [1, cap] and returns to the cap when following is off.
 *
 * The load of a shared machine cannot be made exact in a test, so the live part checks the bounds,
 * and one case whose answer no outside load can change: with a busy-loop process on every CPU apex
 * may use, others take all the cores, and apex must drop to one thread. The arithmetic that turns a
 * measurement into a count is checked on its own. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "apex/threads.h"
#include "core/internal.h"
#include "testutil.h"

static void test_set_and_error(void **state) {
  (void)state;
  TU_FAILS(apex_set_num_threads(0), APEX_ERR_INVALID_ARG, "need at least 1");
  TU_FAILS(apex_set_num_threads(-3), APEX_ERR_INVALID_ARG, "-3 threads");
  TU_OK(apex_set_num_threads(3));
  assert_int_equal(apex_get_max_threads(), 3);
  assert_int_equal(apex_get_num_threads(), 3);
  TU_OK(apex_set_num_threads(2));
  assert_int_equal(apex_get_max_threads(), 2);
}

static void test_fit(void **state) {
  (void)state;
  assert_int_equal(apex__threads_fit(2, 0.0, 2), 2);  /* idle: the cap */
  assert_int_equal(apex__threads_fit(8, 0.0, 2), 2);  /* never above the cap */
  assert_int_equal(apex__threads_fit(2, 1.0, 2), 1);  /* one busy-loop on two cores */
  assert_int_equal(apex__threads_fit(2, 0.4, 2), 2);  /* a core others use under half the time is free */
  assert_int_equal(apex__threads_fit(2, 0.6, 2), 1);
  assert_int_equal(apex__threads_fit(2, 5.0, 2), 1);  /* overloaded: still one thread */
  assert_int_equal(apex__threads_fit(16, 5.2, 16), 11);
  assert_int_equal(apex__threads_fit(1, 0.0, 4), 1);
}

/* /proc/stat's ticks round each CPU's busy time: the window grows with the CPUs so that the rounding
 * (one tick a CPU) stays under a quarter core. 16 CPUs over 0.1 s had read as 1.6 cores used. */
static void test_window(void **state) {
  (void)state;
  assert_true(apex__threads_window(2, 100) == 0.1);  /* a few CPUs: the 0.1 s floor */
  assert_true(fabs(apex__threads_window(16, 100) - 0.64) < 1e-12);
  assert_true(fabs(apex__threads_window(64, 100) - 2.56) < 1e-12);
  for (int ncpu = 1; ncpu <= 256; ncpu *= 2) /* ncpu ticks over the window: at most a quarter core */
    assert_true((double)ncpu / 100.0 / apex__threads_window(ncpu, 100) <= 0.25 + 1e-12);
  assert_true(apex__threads_window(16, 0) == apex__threads_window(16, 100)); /* unknown hz: 100 */
}

static void test_follow_bounds(void **state) {
  (void)state;
  TU_OK(apex_set_num_threads(2));
  apex_set_threads_follow_load(1);
  struct timespec ts = {0, 120 * 1000 * 1000}; /* past the 0.1 s window, so each call measures */
  for (int i = 0; i < 4; i++) {
    apex__threads_follow_load();
    int n = apex_get_num_threads();
    assert_true(n >= 1 && n <= 2);
    nanosleep(&ts, NULL);
  }
  apex_set_threads_follow_load(0);
  assert_int_equal(apex_get_num_threads(), 2);
  apex__threads_follow_load(); /* off: no change */
  assert_int_equal(apex_get_num_threads(), 2);
  apex_set_threads_follow_load(1);
}

static void test_follow_busy_cpus(void **state) {
  (void)state;
  cpu_set_t set;
  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  int ncpu = CPU_COUNT(&set);
  if (ncpu > 64) skip(); /* one child per CPU: too many here */
  TU_OK(apex_set_num_threads(ncpu > 1 ? ncpu : 2));
  apex_set_threads_follow_load(1);
  pid_t kids[64];
  for (int i = 0; i < ncpu; i++) {
    kids[i] = fork();
    if (kids[i] == 0)
      for (volatile unsigned long x = 0;; x++) {
      }
    assert_true(kids[i] > 0);
  }
  struct timespec ts = {0, 300 * 1000 * 1000};
  apex__threads_follow_load(); /* the window starts (or a stale one ends) */
  nanosleep(&ts, NULL);
  apex__threads_follow_load(); /* measures a window in which every CPU was busy with a child */
  int n = apex_get_num_threads();
  for (int i = 0; i < ncpu; i++) kill(kids[i], SIGKILL), waitpid(kids[i], NULL, 0);
  assert_int_equal(n, 1);
  apex_set_threads_follow_load(0);
  assert_int_equal(apex_get_num_threads(), ncpu > 1 ? ncpu : 2);
  apex_set_threads_follow_load(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_set_and_error),
      cmocka_unit_test(test_fit),
      cmocka_unit_test(test_window),
      cmocka_unit_test(test_follow_bounds),
      cmocka_unit_test(test_follow_busy_cpus),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
