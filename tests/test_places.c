/* test_places.c: the CPUs apex counts for its threads (apex/threads.h, core/places.c) under OpenMP's
 * binding and a narrowed affinity mask: issue #33's case, where OMP_PLACES=cores OMP_PROC_BIND=close
 * narrowed the main thread's mask to one core and apex counted one CPU.
 *
 * OpenMP reads its environment once, as the process starts, so each combination runs in a child: the
 * test re-executes itself (--child) with the variables set, and the child prints what apex counts. The
 * reference is independent of places.c: the parent's own affinity mask, read by sched_getaffinity
 * before any binding (the parent runs unbound), from which OpenMP builds a child's places; a child
 * whose mask the parent narrows (as taskset or mpirun's binding of a rank do) must count that mask. */
#define _GNU_SOURCE /* sched_getaffinity, sched_setaffinity, CPU_COUNT */
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/threads.h"
#include "testutil.h"

enum { MAXC = 1024 };

/* ---- the child: prints what apex counts ---------------------------------------------------------- */

static void print_list(const char *name, const int *ids, int n) {
  printf("%s %d", name, n);
  for (int i = 0; i < n && i < MAXC; i++) printf(" %d", ids[i]);
  printf("\n");
}

static int child(void) {
  static int ids[MAXC];
  int n = apex_threads_cpus(ids, MAXC);
  print_list("cpus", ids, n);
  n = apex_threads_team_cpus(2, ids, MAXC);
  print_list("team2", ids, n);
  cpu_set_t set;
  sched_getaffinity(0, sizeof set, &set);
  int k = 0;
  for (int c = 0; c < CPU_SETSIZE && k < MAXC; c++)
    if (CPU_ISSET(c, &set)) ids[k++] = c;
  print_list("main", ids, k);
  printf("max %d\n", apex_get_max_threads());
  return 0;
}

/* ---- the parent ------------------------------------------------------------------------------------ */

typedef struct counted {
  int cpus[MAXC], ncpus, team[MAXC], nteam, main_[MAXC], nmain, max;
} counted;

static int read_list(FILE *f, const char *name, int *ids) {
  char word[16];
  int n = 0;
  if (fscanf(f, "%15s %d", word, &n) != 2 || strcmp(word, name) != 0) return -1;
  for (int i = 0; i < n && i < MAXC; i++)
    if (fscanf(f, "%d", &ids[i]) != 1) return -1;
  return n;
}

/* Runs the child with env ("NAME=VALUE ...", applied after clearing the OpenMP variables) and, when
 * pin >= 0, its mask narrowed to that one CPU first. */
static void run_child(const char *env, int pin, counted *out) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd[1], STDOUT_FILENO);
    close(fd[0]);
    unsetenv("OMP_PLACES"), unsetenv("OMP_PROC_BIND"), unsetenv("OMP_NUM_THREADS");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", env);
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
      char *eq = strchr(tok, '=');
      *eq = '\0';
      setenv(tok, eq + 1, 1);
    }
    if (pin >= 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(pin, &one);
      sched_setaffinity(0, sizeof one, &one);
    }
    execl("/proc/self/exe", "test_places", "--child", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  out->ncpus = read_list(f, "cpus", out->cpus);
  out->nteam = read_list(f, "team2", out->team);
  out->nmain = read_list(f, "main", out->main_);
  char word[16];
  if (fscanf(f, "%15s %d", word, &out->max) != 2) out->max = -1;
  fclose(f);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (out->ncpus < 0 || out->nteam < 0 || out->nmain < 0 || out->max < 0) fail_msg("child with %s printed no counts", env);
}

static int parent_mask(int *ids) {
  cpu_set_t set;
  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < MAXC; c++)
    if (CPU_ISSET(c, &set)) ids[n++] = c;
  return n;
}

static void assert_list(const char *what, const int *got, int ngot, const int *want, int nwant) {
  if (ngot != nwant) fail_msg("%s: %d CPUs, expected %d", what, ngot, nwant);
  for (int i = 0; i < ngot && i < MAXC; i++)
    if (got[i] != want[i]) fail_msg("%s: CPU %d at %d, expected %d", what, got[i], i, want[i]);
}

/* The reference is the parent's own mask: a parent bound by OpenMP has narrowed it already. */
static void need_unbound(void) {
  if (getenv("OMP_PLACES") || getenv("OMP_PROC_BIND")) {
    printf("skipped: this test's own process runs under OMP_PLACES or OMP_PROC_BIND\n");
    skip();
  }
}

/* Every combination that leaves the process's mask whole counts all of it: binding narrows each
 * thread to its place, not the set the threads share. The thread count stays OpenMP's. */
static void test_binding_counts_every_place(void **state) {
  (void)state;
  need_unbound();
  static int mask[MAXC];
  static counted c;
  int n = parent_mask(mask);
  const char *envs[] = {"", "OMP_PLACES=cores OMP_PROC_BIND=close", "OMP_PLACES=cores OMP_PROC_BIND=spread", "OMP_PROC_BIND=true",
                        "OMP_PLACES=threads", "OMP_PLACES=cores OMP_PROC_BIND=close OMP_NUM_THREADS=1",
                        "OMP_PLACES=sockets OMP_PROC_BIND=close OMP_NUM_THREADS=2"};
  for (size_t e = 0; e < sizeof envs / sizeof envs[0]; e++) {
    run_child(envs[e], -1, &c);
    char what[128];
    snprintf(what, sizeof what, "apex_threads_cpus under '%s'", envs[e]);
    assert_list(what, c.cpus, c.ncpus, mask, n);
    if (strstr(envs[e], "OMP_NUM_THREADS=1")) assert_int_equal(c.max, 1);
    if (strstr(envs[e], "OMP_NUM_THREADS=2")) assert_int_equal(c.max, 2);
    /* the team of 2 runs within the mask, and on 2 CPUs at least when bound close to cores of a
     * mask of 2 or more (threads on places 0 and 1); the main thread's own mask is one place */
    assert_true(c.nteam >= 1 && c.nteam <= n);
    if (strstr(envs[e], "cores OMP_PROC_BIND=close") && n >= 2 && !strstr(envs[e], "OMP_NUM_THREADS")) {
      assert_true(c.nteam >= 2);
      assert_true(c.nmain < n); /* the case of issue #33: the mask alone said fewer CPUs */
    }
  }
}

/* A mask narrowed before start (taskset; mpirun binding a rank to a core) bounds the CPUs, with or
 * without places: OpenMP builds its places from that mask. */
static void test_narrowed_mask(void **state) {
  (void)state;
  need_unbound();
  static int mask[MAXC];
  static counted c;
  int n = parent_mask(mask), last = mask[n - 1];
  const char *envs[] = {"", "OMP_PLACES=cores OMP_PROC_BIND=close"};
  for (size_t e = 0; e < 2; e++) {
    run_child(envs[e], last, &c);
    assert_list(envs[e], c.cpus, c.ncpus, &last, 1);
    assert_list(envs[e], c.team, c.nteam, &last, 1);
  }
}

/* Places listed by hand: exactly those CPUs, whatever the rest of the mask. */
static void test_explicit_places(void **state) {
  (void)state;
  need_unbound();
  static int mask[MAXC];
  static counted c;
  int n = parent_mask(mask);
  char env[128];
  snprintf(env, sizeof env, "OMP_PLACES={%d} OMP_PROC_BIND=close", mask[0]);
  run_child(env, -1, &c);
  assert_list(env, c.cpus, c.ncpus, mask, 1);
  if (n >= 2) {
    snprintf(env, sizeof env, "OMP_PLACES={%d},{%d} OMP_PROC_BIND=close", mask[0], mask[n - 1]);
    int want[2] = {mask[0], mask[n - 1]};
    run_child(env, -1, &c);
    assert_list(env, c.cpus, c.ncpus, want, 2);
    assert_list(env, c.team, c.nteam, want, 2); /* close: thread 1 on the second place */
  }
}

static void test_format(void **state) {
  (void)state;
  char out[64];
  const int a[] = {0, 1, 2, 3, 8, 10, 11};
  assert_string_equal(apex_cpus_format(a, 7, out, sizeof out), "0-3,8,10-11");
  const int one[] = {5};
  assert_string_equal(apex_cpus_format(one, 1, out, sizeof out), "5");
  assert_string_equal(apex_cpus_format(a, 0, out, sizeof out), "");
  assert_string_equal(apex_cpus_format(a, 7, out, 10), "0-3,8...");
  assert_string_equal(apex_cpus_format(a, 7, out, 4), "...");
  assert_string_equal(apex_cpus_format(a, 7, out, 3), "");
  const int pairs[] = {0, 2, 4, 5};
  assert_string_equal(apex_cpus_format(pairs, 4, out, sizeof out), "0,2,4-5");
}

/* In this process (no places): the mask, and a count no larger than a small buffer holds. */
static void test_here(void **state) {
  (void)state;
  need_unbound();
  static int mask[MAXC], got[MAXC];
  int n = parent_mask(mask);
  assert_list("apex_threads_cpus", got, apex_threads_cpus(got, MAXC), mask, n);
  int first;
  assert_int_equal(apex_threads_cpus(&first, 1), n);
  assert_int_equal(first, mask[0]);
  assert_int_equal(apex_threads_cpus(NULL, 0), n);
  assert_int_equal(apex_threads_cpus(NULL, 5), n); /* NULL: counts only */
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child") == 0) return child();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_here),
      cmocka_unit_test(test_binding_counts_every_place),
      cmocka_unit_test(test_narrowed_mask),
      cmocka_unit_test(test_explicit_places),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
