/* bench_amp.c: what amp costs and saves on this CPU, each opt level against our own O0 in the same
 * run.
 *   amp_<model>_O{1,2}_bf16_step  training-step time ratio O-level (half_type bf16) / O0, for the
 *                               models of bench_models.h (mlp, cnn, gpt_c256, gpt_c768); the value is
 *                               the level's samples/s (tokens/s for the GPTs). Targets (issue 17):
 *                               O2 <= 0.75 on AVX512_BF16, <= 0.4-0.6 with AMX; no slower than O0
 *                               without bf16 hardware. amp_<model>_O0_f32_step gives O0's own rate.
 *   amp_mlp_activation_O{0..3}  bytes autograd keeps for backward after the forward at batch 4096
 *                               (apex_graph_saved_bytes: what the pool holds, plus the caller's f32
 *                               batch where the first layer saves it, as its f16 copy is counted
 *                               under amp), ratio = level / O0 (target for O2 <= 0.55).
 *   amp_mlp_peak_O{0..3}        total peak resident memory of a process training the MLP at batch
 *                               4096 at that level (each level in a fresh process), ratio to O0;
 *   amp_mlp_train_mem_O{0..3}   the same less what the process held before building the model (the
 *                               loaded libraries: OpenBLAS, OpenMP, MPI), which no level changes.
 * Models and step: bench_models.h. The memory figures are the MLP at batch 4096, half_type bf16. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/apex.h"
#include "bench_models.h"
#include "bench_util.h"

/* Best step time of O0, O1 and O2 (bf16) on one model, t[level]. The levels run in interleaved
 * rounds, best of each kept, so that all three see the same moments of a shared machine (one level
 * after the other let a busy second skew the ratio either way); gpt_c256 gets two rounds and
 * gpt_c768 one, as a C768 step took 4-12 s on this shared 2-core machine. */
static void time_levels(bench_model model, const char *const *levels, double t[3]) {
  bench_train r[3];
  int rounds = model == BENCH_GPT_C768 ? 1 : model == BENCH_GPT_C256 ? 2 : 4;
  for (int l = 0; l < 3; l++) bench_train_init(&r[l], model, 0, levels[l]), t[l] = 1e300;
  for (int round = 0; round < rounds; round++)
    for (int l = 0; l < 3; l++) {
      double s = bench_train_time(&r[l], round == 0);
      t[l] = s < t[l] ? s : t[l];
    }
  for (int l = 0; l < 3; l++) bench_train_free(&r[l]);
}

/* Bytes the graph holds for backward after the forward: its live pool blocks (saved values and
 * state, the logits and loss; not cached spares, released values or transient f32 copies) and the
 * caller's batch when backward reads it (O0: the first linear saves its f32 input; amp levels save
 * their f16 copy, which is the pool's). */
static double activation_bytes(const char *level) {
  bench_train r;
  bench_train_init(&r, BENCH_MLP, 4096, level);
  bench_train_step(&r); /* warm the pool to its working size, then measure a clean forward */
  apex_graph_destroy(r.g);
  r.g = apex_graph_create();
  apex_amp_prepare_graph(r.amp, r.g);
  bench_train_loss(&r);
  double bytes = (double)apex_graph_saved_bytes(r.g);
  bench_train_free(&r);
  return bytes;
}

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* Linux's peak RSS (VmHWM) is reset to the current RSS by writing 5 to /proc/self/clear_refs. Without
 * the reset, what the dynamic loader touched while relocating a large library (oneDNN's is ~130 MiB)
 * stays the process's peak, and training below it would read as costing nothing. */
static void reset_peak_rss(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  fputs("5", f);
  fclose(f);
}

/* The current RSS in KiB (VmRSS), or -1 where /proc is missing. */
static long cur_rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
  fclose(f);
  return kib;
}

/* The child of peak_rss: trains 3 MLP steps at batch 4096 and prints its RSS before (with the peak
 * reset to it) and its peak after, in KiB. */
static int peak_child(const char *level) {
  reset_peak_rss();
  long base = cur_rss_kib();
  if (base < 0) base = max_rss_kib();
  bench_train r;
  bench_train_init(&r, BENCH_MLP, 4096, level);
  for (int i = 0; i < 3; i++) bench_train_step(&r);
  printf("%ld %ld\n", base, max_rss_kib());
  bench_train_free(&r);
  return 0;
}

/* Peak RSS of this program re-run as a peak_child (each level measured alone), and in *base what
 * it held before training; bytes, -1 on failure. A fresh exec, not a
 * bare fork: the parent's OpenMP thread pool does not survive fork, and the child would hang. */
static double peak_rss(const char *level, double *base) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    if (dup2(fd[1], STDOUT_FILENO) < 0) _exit(1);
    execl("/proc/self/exe", "bench_amp", "--peak-child", level, (char *)NULL);
    _exit(1);
  }
  close(fd[1]);
  char buf[64] = {0};
  ssize_t got = pid > 0 ? read(fd[0], buf, sizeof buf - 1) : -1;
  close(fd[0]);
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  long before = -1, kib = -1;
  if (got <= 0 || sscanf(buf, "%ld %ld", &before, &kib) != 2 || kib <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  *base = (double)before * 1024.0;
  return (double)kib * 1024.0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--peak-child")) return peak_child(argv[2]);
  const char *levels[4] = {"O0", "O1", "O2", "O3"};
  for (bench_model model = 0; model < BENCH_MODEL_COUNT; model++) {
    char name[64], o1[64], o2[64];
    snprintf(o1, sizeof o1, "amp_%s_O1_bf16_step", bench_model_name(model));
    snprintf(o2, sizeof o2, "amp_%s_O2_bf16_step", bench_model_name(model));
    snprintf(name, sizeof name, "amp_%s_O0_f32_step", bench_model_name(model));
    if (!bench_wanted(argc, argv, o1) && !bench_wanted(argc, argv, o2) && !bench_wanted(argc, argv, name)) continue;
    double t[3];
    time_levels(model, levels, t);
    bench_report(name, bench_model_samples(model) / t[0], "samples/s", 1.0, "apex-O0");
    for (int l = 1; l <= 2; l++) {
      snprintf(name, sizeof name, "amp_%s_%s_bf16_step", bench_model_name(model), levels[l]);
      bench_report(name, bench_model_samples(model) / t[l], "samples/s", t[l] / t[0], "apex-O0");
    }
  }
  if (bench_wanted(argc, argv, "amp_mlp_activation")) {
    double a0 = activation_bytes("O0");
    bench_report("amp_mlp_activation_O0", a0 / 1048576.0, "MiB", 1.0, "apex-O0");
    for (int l = 1; l < 4; l++) {
      char name[64];
      snprintf(name, sizeof name, "amp_mlp_activation_%s", levels[l]);
      double a = activation_bytes(levels[l]);
      bench_report(name, a / 1048576.0, "MiB", a / a0, "apex-O0");
    }
  }
  if (bench_wanted(argc, argv, "amp_mlp_peak") || bench_wanted(argc, argv, "amp_mlp_train_mem")) {
    double peak[4], train[4];
    for (int l = 0; l < 4; l++) {
      double base = 0;
      peak[l] = peak_rss(levels[l], &base);
      train[l] = peak[l] - base;
    }
    for (int k = 0; k < 2; k++)
      for (int l = 0; l < 4; l++) {
        char name[64];
        snprintf(name, sizeof name, "amp_mlp_%s_%s", k ? "train_mem" : "peak", levels[l]);
        const double *v = k ? train : peak;
        if (peak[l] < 0 || peak[0] < 0) bench_skip(name, "the child process failed");
        else bench_report(name, v[l] / 1048576.0, "MiB", v[l] / v[0], "apex-O0");
      }
  }
  return 0;
}
