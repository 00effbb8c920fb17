/* places.c: which CPUs apex's threads run on (apex/threads.h), from OpenMP's places rather than the
 * main thread's affinity mask.
 *
 * Why not the mask. With OMP_PLACES=cores OMP_PROC_BIND=close (the usual way to pin an OpenMP
 * program) libgomp binds the main thread to the first place as it starts, so sched_getaffinity on it
 * says one core while the team has them all: bench_scaling then measured one thread only, and
 * apex-train refused --threads 2 on a 2-core machine. OpenMP builds its places from the process's
 * mask at start (so mpirun's binding of a rank, or taskset, still narrows them), and their union is
 * the set the threads share. Without places the mask is the answer: nothing narrowed it but the
 * process's launcher. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_ISSET */
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apex/threads.h"

/* The set's CPUs into cpus (first max), ascending; returns their count. */
static int from_set(const cpu_set_t *set, int *cpus, int max) {
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, set)) {
      if (n < max) cpus[n] = c;
      n++;
    }
  return n;
}

/* The online CPUs 0..N-1, when no mask can be read (not Linux). */
static int online(int *cpus, int max) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  for (int c = 0; c < n && c < max; c++) cpus[c] = c;
  return (int)n;
}

int apex_threads_cpus(int *cpus, int max) {
  if (!cpus) max = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  int places = omp_get_num_places(), any = 0;
  for (int p = 0; p < places; p++) {
    int k = omp_get_place_num_procs(p);
    if (k <= 0) continue;
    int *ids = malloc((size_t)k * sizeof *ids);
    if (!ids) break;
    omp_get_place_proc_ids(p, ids);
    for (int i = 0; i < k; i++)
      if (ids[i] >= 0 && ids[i] < CPU_SETSIZE) CPU_SET(ids[i], &set), any = 1;
    free(ids);
  }
  if (!any && sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) any = 1;
  return any ? from_set(&set, cpus, max) : online(cpus, max);
}

int apex_threads_team_cpus(int n, int *cpus, int max) {
  if (!cpus) max = 0;
  if (n < 1) n = apex_get_max_threads();
  cpu_set_t all;
  CPU_ZERO(&all);
  int failed = 0;
  /* each thread's mask as OpenMP bound it, for this team size (close binding places thread i on the
   * i-th place from the main thread's; spread spaces them out) */
#pragma omp parallel num_threads(n) reduction(| : failed)
  {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0)
      failed = 1;
    else
#pragma omp critical(apex_team_cpus)
      CPU_OR(&all, &all, &mine);
  }
  return !failed && CPU_COUNT(&all) > 0 ? from_set(&all, cpus, max) : apex_threads_cpus(cpus, max);
}

char *apex_cpus_format(const int *cpus, int n, char *out, size_t size) {
  if (!out || size == 0) return out;
  out[0] = '\0';
  size_t len = 0;
  for (int i = 0; i < n && cpus;) {
    int j = i;
    while (j + 1 < n && cpus[j + 1] == cpus[j] + 1) j++;
    char part[32];
    int w = j > i ? snprintf(part, sizeof part, "%s%d-%d", i ? "," : "", cpus[i], cpus[j])
                  : snprintf(part, sizeof part, "%s%d", i ? "," : "", cpus[i]);
    if (len + (size_t)w + 4 > size) { /* keep room for "..." and the terminator: len + 4 <= size holds */
      if (size >= 4) memcpy(out + len, "...", 4);
      return out;
    }
    memcpy(out + len, part, (size_t)w + 1);
    len += (size_t)w;
    i = j + 1;
  }
  return out;
}
