/* bench_util.c: timing and reporting shared by the benchmarks (see bench_util.h). */
#define _POSIX_C_SOURCE 200809L
#include "bench_util.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

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
  printf("bench %s %.3f %s ratio=%.3f peer=%s\n", name, value, unit, ratio, peer);
  fflush(stdout);
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
