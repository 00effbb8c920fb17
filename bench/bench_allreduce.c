/* bench_allreduce.c: all-reduce bus bandwidth of the MPI process group at 2 ranks.
 *
 *   allreduce_f32_{1,4,16,64,256}MB   bus GB/s = 2 (n-1)/n * bytes / time (what each rank sends and
 *                                     receives in a ring all-reduce; NCCL's convention)
 *   allreduce_bf16_64MB               the same with the f32 widening and rounding of half types
 * The peer is memcpy of the same bytes on one rank, in the same run: the memory bandwidth that a
 * shared-memory all-reduce on one machine is bound by. allreduce_f32_*_vs_mpi compare with Open MPI's
 * own MPI_Allreduce (whose summation order is its own choice; apex's is fixed, see parallel.h).
 *
 * bench/run starts every benchmark as a plain program. Started without MPI ranks, this one re-runs
 * itself under `mpirun --allow-run-as-root --oversubscribe -np 2`, or says why it cannot. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "bench_util.h"
#if APEX_TREE_HAS_MPI
#include <mpi.h>
#endif

/* Best time of `reps` all-reduces; every rank runs the same count (a time limit could differ). */
static double time_allreduce(apex_pg *pg, apex_tensor *t, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps + 1; i++) {
    apex_pg_barrier(pg);
    double t0 = bench_now();
    apex_status st = apex_pg_allreduce(pg, t, APEX_REDUCE_SUM);
    double dt = bench_now() - t0;
    if (st != APEX_OK) {
      fprintf(stderr, "bench_allreduce: %s\n", apex_last_error());
      return -1.0;
    }
    if (i > 0 && dt < best) best = dt; /* the first is warm-up */
  }
  return best;
}

static double time_memcpy(void *dst, const void *src, size_t bytes, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps + 1; i++) {
    double t0 = bench_now();
    memcpy(dst, src, bytes);
    double dt = bench_now() - t0;
    if (i > 0 && dt < best) best = dt;
  }
  return best;
}

static void figure(apex_pg *pg, apex_dtype dtype, size_t mb, int reps, int argc, char **argv) {
  char name[64];
  snprintf(name, sizeof name, "allreduce_%s_%zuMB", apex_dtype_name(dtype), mb);
  int wanted = bench_wanted(argc, argv, name);
  if (!wanted) return; /* every rank parses the same arguments, so all skip alike */
  size_t bytes = mb << 20;
  int64_t n = (int64_t)(bytes / apex_dtype_size(dtype));
  apex_tensor *t = apex_tensor_create(dtype, 1, &n);
  if (!t) {
    bench_skip(name, "out of memory");
    return;
  }
  double s = time_allreduce(pg, t, reps);
  int world = apex_pg_world_size(pg);
  if (apex_pg_rank(pg) == 0 && s > 0) {
    char *a = malloc(bytes), *b = malloc(bytes);
    if (a && b) {
      memset(a, 1, bytes);
      memset(b, 2, bytes);
      double peer = time_memcpy(b, a, bytes, reps);
      double bus = 2.0 * (world - 1) / world * (double)bytes;
      bench_report_gbs(name, bus, s, (double)bytes, peer, "memcpy");
    }
    free(a);
    free(b);
  }
#if APEX_TREE_HAS_MPI
  if (dtype == APEX_F32 && s > 0) {
    double best = 1e30;
    for (int i = 0; i < reps + 1; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = bench_now();
      MPI_Allreduce(MPI_IN_PLACE, apex_tensor_data(t), (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double dt = bench_now() - t0;
      if (i > 0 && dt < best) best = dt;
    }
    if (apex_pg_rank(pg) == 0) {
      double bus = 2.0 * (world - 1) / world * (double)bytes;
      char vs[80];
      snprintf(vs, sizeof vs, "%s_vs_mpi", name);
      bench_report(vs, bus / s / 1e9, "GB/s", best / s, "MPI_Allreduce");
    }
  }
#endif
  apex_pg_barrier(pg);
  apex_tensor_destroy(t);
}

int main(int argc, char **argv) {
  if (!apex_pg_mpi_available()) {
    bench_skip("allreduce", "apex was built without MPI (APEX_MPI=OFF or MPI not found)");
    return 0;
  }
  if (!bench_launched_by_mpi()) {
    bench_relaunch_mpi("allreduce", 2, argc, argv);
    return 0;
  }
  apex_pg *pg = apex_pg_create_mpi(NULL);
  if (!pg) {
    bench_skip("allreduce", apex_last_error());
    return 0;
  }
  const size_t sizes[] = {1, 4, 16, 64, 256};
  const int reps[] = {40, 20, 10, 6, 4};
  for (int i = 0; i < 5; i++) figure(pg, APEX_F32, sizes[i], reps[i], argc, argv);
  figure(pg, APEX_BF16, 64, 6, argc, argv);
  fflush(stdout);
  apex_pg_destroy(pg);
  return 0;
}
