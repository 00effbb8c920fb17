/* bench_util.c: timing and reporting shared by the benchmarks (see bench_util.h). */
#define _POSIX_C_SOURCE 200809L
#include "bench_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "apex/apex.h"
#include "apex/cpu.h"
#include "apex/cuda.h"
#include "apex/threads.h"

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_best(void (*fn)(void *), void *ctx, int warmup, int min_reps, double min_seconds) {
  for (int i = 0; i < warmup; i++) fn(ctx);
  double best = 1e300, start = bench_now();
  for (int reps = 0; reps < min_reps || bench_now() - start < min_seconds; reps++) {
    double t0 = bench_now();
    fn(ctx);
    double t = bench_now() - t0;
    if (t < best) best = t;
  }
  return best;
}

void bench_report(const char *name, double value, const char *unit, double ratio, const char *peer) {
  printf("bench %s %.3f %s ratio=%.3f peer=%s isa=%s threads=%d\n", name, value, unit, ratio, peer,
         apex_cpu_isa_name(apex_cpu_max_isa()), apex_get_num_threads());
  fflush(stdout);
}

const char *bench_peer_python(void) {
  static char path[4096];
  const char *env = getenv("APEX_PEERS_PYTHON"), *root = getenv("APEX_ROOT");
  if (env && *env) return access(env, X_OK) == 0 ? env : NULL;
  snprintf(path, sizeof path, "%s/.peers/bin/python", root ? root : ".");
  return access(path, X_OK) == 0 ? path : NULL;
}

double bench_peer_measure(const char *args) {
  const char *py = bench_peer_python(), *root = getenv("APEX_ROOT");
  if (!py) return 0;
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "%s %s/bench/peer_nn.py --measure %s 2>/dev/null", py, root ? root : ".", args);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  double v = 0;
  if (fscanf(p, "%lf", &v) != 1) v = 0;
  pclose(p);
  return v;
}

void bench_report_gbs(const char *name, double bytes, double apex_s, double peer_bytes, double peer_s, const char *peer) {
  double apex_gbs = bytes / apex_s / 1e9, peer_gbs = peer_bytes / peer_s / 1e9;
  bench_report(name, apex_gbs, "GB/s", apex_gbs / peer_gbs, peer);
}

void bench_skip(const char *name, const char *why) {
  printf("bench %s skipped: %s\n", name, why);
  fflush(stdout);
}

void bench_parallel_memcpy(void *dst, const void *src, size_t bytes) {
  const size_t block = (size_t)1 << 20;
  long long nblocks = (long long)((bytes + block - 1) / block);
#pragma omp parallel for schedule(static)
  for (long long b = 0; b < nblocks; b++) {
    size_t off = (size_t)b * block, len = bytes - off < block ? bytes - off : block;
    memcpy((char *)dst + off, (const char *)src + off, len);
  }
}

int bench_wanted(int argc, char **argv, const char *name) {
  if (argc < 2) return 1;
  for (int i = 1; i < argc; i++)
    if (strstr(name, argv[i])) return 1;
  return 0;
}

int bench_launched_by_mpi(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK"); }

static int on_path(const char *prog) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char *copy = strdup(path), *save = NULL;
  int found = 0;
  for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", dir, prog);
    found = access(full, X_OK) == 0;
  }
  free(copy);
  return found;
}

void bench_relaunch_mpi(const char *name, int np, int argc, char **argv) {
  if (getenv("APEX_BENCH_UNDER_MPIRUN")) {
    bench_skip(name, "started by mpirun but without its environment (not Open MPI, MPICH or PMIx?)");
    return;
  }
  if (!on_path("mpirun")) {
    bench_skip(name, "mpirun is not on PATH (Debian: apt-get install openmpi-bin)");
    return;
  }
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    bench_skip(name, "cannot find this program's path to hand to mpirun");
    return;
  }
  self[len] = '\0';
  char **args = calloc((size_t)argc + 8, sizeof *args), nps[16];
  snprintf(nps, sizeof nps, "%d", np);
  int k = 0;
  args[k++] = "mpirun";
  args[k++] = "--allow-run-as-root";
  args[k++] = "--oversubscribe";
  args[k++] = "-np";
  args[k++] = nps;
  args[k++] = self;
  for (int i = 1; i < argc; i++) args[k++] = argv[i];
  setenv("APEX_BENCH_UNDER_MPIRUN", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1); /* one core per rank */
  fflush(stdout);
  execvp("mpirun", args);
  char why[256];
  snprintf(why, sizeof why, "could not start mpirun: %s", strerror(errno));
  bench_skip(name, why);
  free(args);
}

int bench_gpt2_batch(int64_t *tokens, int64_t *targets, size_t bt, int vocab) {
  const int64_t v = vocab < 50257 ? vocab : 50257;
  float *u = malloc((bt + 1) * sizeof *u);
  if (!u) return 1;
  apex_rng rng = apex_rng_init(42);
  apex_rng_uniform(&rng, u, bt + 1);
  for (size_t i = 0; i < bt; i++) {
    tokens[i] = (int64_t)(u[i] * (float)v) % v;
    targets[i] = (int64_t)(u[i + 1] * (float)v) % v;
  }
  free(u);
  return 0;
}

unsigned long long bench_cuda_waits(void) {
  apex_cuda_memory_stats s = {0};
  return apex_cuda_memory_stats_get(&s) == APEX_OK ? (unsigned long long)s.host_waits : 0;
}
