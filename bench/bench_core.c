/* bench_core.c: the foundation's memory-bound figures, each against memcpy of the same traffic in the
 * same run:
 *   convert_*      f32<->f16 and f32<->bf16 over 64M elements (target ratio >= 0.8)
 *   convert_*_avx512_vs_avx2, convert_*_l1_avx512_vs_avx2: the same conversions on the AVX-512 path
 *                  against the AVX2 path in the same run (ISA cap, apex/cpu.h), over the 64M array and
 *                  over a 4096-element block that stays in L1 (one thread: the size of a row helper's
 *                  call); ratio is AVX2's time over AVX-512's, isa= names the path measured
 *   mt_scale_*     multi-tensor scale with overflow check, 10M f32 in 200 tensors (target >= 0.8)
 * Traffic is bytes read + bytes written; the memcpy peer copies half that many bytes (it reads and
 * writes each), over the same threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "bench_util.h"

typedef struct {
  void *dst;
  const void *src;
  apex_dtype dt, st;
  size_t n;
} convert_job;

static void run_convert(void *p) {
  convert_job *j = p;
  apex_convert(j->dst, j->dt, j->src, j->st, j->n);
}

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
} copy_job;

static void run_copy(void *p) {
  copy_job *j = p;
  bench_parallel_memcpy(j->dst, j->src, j->bytes);
}

typedef struct {
  apex_tensor **in, **out;
  int n;
  int flag;
} scale_job;

/* Out of place (scaled gradients into master gradients), so that apex and memcpy touch the same
 * memory footprint. */
static void run_scale(void *p) {
  scale_job *j = p;
  apex_mt_scale(0, &j->flag, j->in, j->out, j->n, 1.0f / 1024.0f);
}

static void bench_convert(const char *name, apex_dtype from, apex_dtype to, char *a, char *b, size_t n) {
  convert_job cj = {b, a, to, from, n};
  double traffic = (double)n * (double)(apex_dtype_size(from) + apex_dtype_size(to));
  copy_job pj = {b, a, (size_t)(traffic / 2)};
  double t_apex = bench_best(run_convert, &cj, 2, 5, 1.0);
  double t_copy = bench_best(run_copy, &pj, 2, 5, 1.0);
  bench_report_gbs(name, traffic, t_apex, traffic, t_copy, "memcpy");
}

typedef struct {
  convert_job job;
  int reps;
} small_job;

static void run_small(void *p) {
  small_job *j = p;
  for (int r = 0; r < j->reps; r++) apex_convert(j->job.dst, j->job.dt, j->job.src, j->job.st, j->job.n);
}

/* The conversion at the avx512 cap against the avx2 cap, over n elements (l1: a 4096-element block
 * converted 4096 times, below apex_convert's thread split, so one thread). */
static void bench_convert_isa(int argc, char **argv, const char *name, apex_dtype from, apex_dtype to, char *a, char *b, size_t n,
                              int l1) {
  char line[128];
  snprintf(line, sizeof line, "%s%s_avx512_vs_avx2", name, l1 ? "_l1" : "");
  if (!bench_wanted(argc, argv, line)) return;
  if (apex_cpu_native_isa() < APEX_CPU_ISA_AVX512) {
    bench_skip(line, "this CPU has no AVX-512F");
    return;
  }
  small_job sj = {{b, a, to, from, l1 ? 4096 : n}, l1 ? 4096 : 1};
  double traffic = (double)sj.job.n * sj.reps * (double)(apex_dtype_size(from) + apex_dtype_size(to));
  double t[2] = {1e300, 1e300};
  for (int round = 0; round < 4; round++) /* interleaved, best of each: the machine's load moves */
    for (int k = 0; k < 2; k++) {
      apex_cpu_set_max_isa(k ? APEX_CPU_ISA_AVX512 : APEX_CPU_ISA_AVX2);
      double tk = bench_best(run_small, &sj, 1, 3, 0.25);
      if (tk < t[k]) t[k] = tk;
    }
  bench_report_gbs(line, traffic, t[1], traffic, t[0], "apex-avx2"); /* printed under the avx512 cap */
  apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE);
}

int main(int argc, char **argv) {
  const size_t n = (size_t)64 << 20;
  char *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4);
  if (!a || !b) {
    fprintf(stderr, "bench_core: out of memory\n");
    return 1;
  }
  /* Values in f16 range, so no path runs a special case more than real data would. */
  apex_rng rng = apex_rng_init(1);
  apex_rng_normal(&rng, (float *)a, n, 0.0f, 10.0f);
  memset(b, 0, n * 4);
  if (bench_wanted(argc, argv, "convert_f32_to_f16")) bench_convert("convert_f32_to_f16", APEX_F32, APEX_F16, a, b, n);
  if (bench_wanted(argc, argv, "convert_f32_to_bf16")) bench_convert("convert_f32_to_bf16", APEX_F32, APEX_BF16, a, b, n);
  apex_convert(b, APEX_F16, a, APEX_F32, n);
  if (bench_wanted(argc, argv, "convert_f16_to_f32")) bench_convert("convert_f16_to_f32", APEX_F16, APEX_F32, b, a, n);
  apex_convert(b, APEX_BF16, a, APEX_F32, n);
  if (bench_wanted(argc, argv, "convert_bf16_to_f32")) bench_convert("convert_bf16_to_f32", APEX_BF16, APEX_F32, b, a, n);
  for (int l1 = 0; l1 < 2; l1++) {
    bench_convert_isa(argc, argv, "convert_f32_to_bf16", APEX_F32, APEX_BF16, a, b, n, l1);
    bench_convert_isa(argc, argv, "convert_bf16_to_f32", APEX_BF16, APEX_F32, b, a, n, l1);
    bench_convert_isa(argc, argv, "convert_f32_to_f16", APEX_F32, APEX_F16, a, b, n, l1);
    bench_convert_isa(argc, argv, "convert_f16_to_f32", APEX_F16, APEX_F32, b, a, n, l1);
  }

  if (bench_wanted(argc, argv, "mt_scale_f32")) {
    enum { NT = 200 };
    const size_t total = 10u << 20, per = total / NT;
    apex_tensor *in[NT], *out[NT];
    int64_t shape = (int64_t)per;
    for (int i = 0; i < NT; i++) {
      in[i] = apex_tensor_create(APEX_F32, 1, &shape);
      out[i] = apex_tensor_create(APEX_F32, 1, &shape);
      memcpy(apex_tensor_data(in[i]), a + (size_t)i * per * 4, per * 4);
    }
    scale_job sj = {in, out, NT, 0};
    copy_job pj = {b, a, per * NT * 4};
    double traffic = 2.0 * (double)(per * NT * 4);
    double t_apex = bench_best(run_scale, &sj, 2, 10, 1.0);
    double t_copy = bench_best(run_copy, &pj, 2, 10, 1.0);
    bench_report_gbs("mt_scale_f32_10M_200t", traffic, t_apex, traffic, t_copy, "memcpy");
    for (int i = 0; i < NT; i++) {
      apex_tensor_destroy(in[i]);
      apex_tensor_destroy(out[i]);
    }
  }
  free(a);
  free(b);
  return 0;
}
