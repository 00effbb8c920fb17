/* threads.c: the thread count apex's OpenMP loops use, and how it follows the load on shared cores.
 *
 * Why apex follows the load. libgomp spins at each barrier for ~300000 iterations before sleeping;
 * a training step runs hundreds of short parallel regions. When another CPU-bound process shares
 * the cores, one of apex's threads is descheduled, the others spin waiting for it, and each region
 * costs a scheduler slice: steps ran 2.5x to 300x slower. OMP_WAIT_POLICY=passive fixes it, but
 * libgomp reads its environment once, in its own constructor, which runs before any constructor of
 * libapex (a library's dependencies initialise first; measured with glibc 2.36: a setenv of
 * GOMP_SPINCOUNT in libapex's constructor has no effect), so the library cannot choose the wait
 * policy for its users. What it can choose is how many threads it asks for: never more than the
 * cores other processes leave free. With as many threads as free cores, no thread of apex waits on
 * a descheduled sibling, spinning or not. Every result is bitwise independent of the thread count
 * (threads.h), so changing it between steps changes speed only.
 *
 * The free cores are measured, not guessed: between two calls of apex__threads_follow_load (at
 * most every apex__threads_window: 0.1 s on a few CPUs, longer on many), the busy time of the CPUs apex may run on
 * (apex_threads_cpus: OpenMP's places, else the process's mask; /proc/stat) less the CPU
 * time of this process is what others used; others' cores = that / wall time. */
#define _GNU_SOURCE /* CPU_SET, CPU_ISSET */
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "apex/threads.h"
#include "core/internal.h"

enum { FOLLOW_MAX_CPUS = 1024 };
#define FOLLOW_MIN_S 0.1 /* /proc/stat counts in 10 ms ticks: a shorter window is mostly rounding */

static struct {
  atomic_flag busy;  /* one caller measures at a time; others skip */
  atomic_int cap;    /* the most threads: apex_set_num_threads, else OpenMP's default; 0 = not read yet */
  atomic_int follow; /* 1 (default) follow the load, 0 keep cap */
  int have;          /* a first sample was taken */
  int ncpu;          /* CPUs counted in the last sample */
  double wall, own, busy_s;
} S = {ATOMIC_FLAG_INIT, 0, 1, 0, 0, 0, 0, 0};

static int cap_get(void) {
  int c = atomic_load(&S.cap);
  if (c == 0) {
    int expect = 0;
    atomic_compare_exchange_strong(&S.cap, &expect, omp_get_max_threads());
    c = atomic_load(&S.cap);
  }
  return c;
}

apex_status apex_set_num_threads(int n) {
  if (n < 1) return apex__fail(APEX_ERR_INVALID_ARG, "apex_set_num_threads: %d threads; need at least 1", n);
  atomic_store(&S.cap, n);
  omp_set_num_threads(n);
  return APEX_OK;
}

int apex_get_num_threads(void) { return omp_get_max_threads(); }

int apex_get_max_threads(void) { return cap_get(); }

void apex_set_threads_follow_load(int on) {
  atomic_store(&S.follow, on != 0);
  if (!on) omp_set_num_threads(cap_get());
}

int apex__threads_fit(int ncpu, double others_cores, int cap) {
  int free_cores = (int)((double)ncpu - others_cores + 0.5); /* a core others use half the time counts as free */
  if (free_cores > cap) free_cores = cap;
  return free_cores < 1 ? 1 : free_cores;
}

static double now_s(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds the CPUs in `set` have been busy (not idle or iowait) since boot, and how many there are;
 * -1 when /proc/stat cannot be read (not Linux). */
static double cpus_busy_s(const cpu_set_t *set, int *ncpu) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  char line[512];
  double busy = 0;
  long hz = sysconf(_SC_CLK_TCK);
  *ncpu = 0;
  while (fgets(line, sizeof line, f)) {
    int id;
    unsigned long long v[8] = {0};
    if (strncmp(line, "cpu", 3) != 0) break; /* the cpu lines come first */
    if (sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &id, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
               &v[7]) != 9 ||
        id < 0 || id >= FOLLOW_MAX_CPUS || !CPU_ISSET(id, set))
      continue; /* the aggregate line, or a CPU apex may not run on */
    /* user nice system idle iowait irq softirq steal: busy is all but idle and iowait */
    busy += (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)(hz > 0 ? hz : 100);
    ++*ncpu;
  }
  fclose(f);
  return *ncpu > 0 ? busy : -1;
}

/* Each CPU's line of /proc/stat counts whole ticks, so the busy time of ncpu CPUs over a window is
 * off by up to ncpu ticks, and so is what it says others used: over FOLLOW_MIN_S on 16 CPUs that is
 * up to 1.6 cores, and an idle 16-core machine read as 15 free cores (bench_amp printed threads=15).
 * The window is long enough that the rounding stays under a quarter of a core: ncpu ticks / window
 * <= 0.25. */
double apex__threads_window(int ncpu, long hz) {
  double w = 4.0 * (double)ncpu / (double)(hz > 0 ? hz : 100);
  return w > FOLLOW_MIN_S ? w : FOLLOW_MIN_S;
}

void apex__threads_follow_load(void) {
  if (!atomic_load(&S.follow) || atomic_flag_test_and_set(&S.busy)) return;
  double wall = now_s(CLOCK_MONOTONIC);
  if (S.have && wall - S.wall < apex__threads_window(S.ncpu, sysconf(_SC_CLK_TCK))) {
    atomic_flag_clear(&S.busy);
    return;
  }
  int cap = cap_get(), ncpu = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  double busy = -1, own = now_s(CLOCK_PROCESS_CPUTIME_ID);
  if (cap > 1) { /* the CPUs of OpenMP's places, not the main thread's mask, which binding narrows (places.c) */
    int cpus[FOLLOW_MAX_CPUS], n = apex_threads_cpus(cpus, FOLLOW_MAX_CPUS);
    for (int i = 0; i < n && i < FOLLOW_MAX_CPUS; i++) CPU_SET(cpus[i], &set);
    busy = cpus_busy_s(&set, &ncpu);
  }
  if (busy >= 0 && S.have) {
    double others = ((busy - S.busy_s) - (own - S.own)) / (wall - S.wall);
    omp_set_num_threads(apex__threads_fit(ncpu, others < 0 ? 0 : others, cap));
  }
  S.have = busy >= 0;
  S.ncpu = ncpu;
  S.wall = wall;
  S.own = own;
  S.busy_s = busy;
  atomic_flag_clear(&S.busy);
}
