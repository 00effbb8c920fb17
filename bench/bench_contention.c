/* bench_contention.c: does apex's speed hold up when another process shares the cores?
 *
 * For mlp and gpt_c256 (bench_models.h, O0 f32): the best training-step time alone, and with a
 * busy-loop process pinned to the last CPU apex may run on (a second CPU-bound job on the machine),
 * in alternating rounds (alone, loaded, alone, loaded), no OMP_WAIT_POLICY set (bench/run sets none;
 * scripts/test's passive policy would hide the problem):
 *   contention_<model>         value: loaded samples/s, ratio = loaded time / alone time,
 *                              peer=alone (target <= 2.5);
 *   contention_<model>         value: apex's slowdown, ratio = apex's slowdown / PyTorch's slowdown
 *                              under the same busy loop (bench/peer_nn.py --measure MODEL f32, from
 *                              .peers/), peer=torch-contention (target <= 1.3);
 *   contention_mlp_fixed_threads  the same slowdown with following the load turned off
 *                              (apex_set_threads_follow_load(0)): what OpenMP's spin-waiting costs
 *                              without it, ratio = loaded time / alone time, peer=alone.
 * Before following the load (threads.c), a busy process slowed apex 2.5x to 300x. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/apex.h"
#include "bench_models.h"
#include "bench_util.h"

/* Starts a child spinning on the last CPU of this process's set; its pid, or -1. The child runs
 * no OpenMP (a fork of a process with a thread pool may only run plain code). */
static pid_t busy_start(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) last = c;
  pid_t pid = fork();
  if (pid == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    sched_setaffinity(0, sizeof one, &one);
    for (volatile unsigned long x = 0;; x++) {
    }
  }
  return pid;
}

static void busy_stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* Best alone and loaded step times of apex (t[0], t[1]) and PyTorch's best alone and loaded
 * samples/s (p[0], p[1]; 0 without the peer), over two alternating rounds. */
static void measure(bench_train *r, double t[2], double p[2], int with_peer) {
  char args[64];
  snprintf(args, sizeof args, "%s f32", bench_model_name(r->model));
  t[0] = t[1] = 1e300;
  p[0] = p[1] = 0;
  for (int round = 0; round < 2; round++)
    for (int loaded = 0; loaded < 2; loaded++) {
      pid_t busy = loaded ? busy_start() : 0;
      if (loaded && busy < 0) {
        fprintf(stderr, "bench_contention: could not start the busy loop\n");
        exit(1);
      }
      double s = bench_train_time(r, 1);
      double ps = with_peer ? bench_peer_measure(args) : 0;
      busy_stop(busy);
      t[loaded] = s < t[loaded] ? s : t[loaded];
      p[loaded] = ps > p[loaded] ? ps : p[loaded];
    }
}

int main(int argc, char **argv) {
  const bench_model models[2] = {BENCH_MLP, BENCH_GPT_C256};
  for (int i = 0; i < 2; i++) {
    char name[64];
    snprintf(name, sizeof name, "contention_%s", bench_model_name(models[i]));
    if (!bench_wanted(argc, argv, name)) continue;
    bench_train r;
    bench_train_init(&r, models[i], 0, "O0");
    double t[2], p[2];
    measure(&r, t, p, bench_peer_python() != NULL);
    double slow = t[1] / t[0];
    bench_report(name, bench_model_samples(models[i]) / t[1], "samples/s", slow, "alone");
    if (p[0] > 0 && p[1] > 0) {
      bench_report(name, slow, "x", slow / (p[0] / p[1]), "torch-contention");
    } else {
      char line[128];
      snprintf(line, sizeof line, "%s (apex slowdown %.2fx) peer=torch-contention", name, slow);
      bench_skip(line, bench_peer_python() ? "the peer did not run here" : "no PyPI torch (run bench/setup_peers.sh)");
    }
    if (models[i] == BENCH_MLP && bench_wanted(argc, argv, "contention_mlp_fixed_threads")) {
      apex_set_threads_follow_load(0);
      measure(&r, t, p, 0);
      bench_report("contention_mlp_fixed_threads", bench_model_samples(BENCH_MLP) / t[1], "samples/s", t[1] / t[0], "alone");
      apex_set_threads_follow_load(1);
    }
    bench_train_free(&r);
  }
  return 0;
}
