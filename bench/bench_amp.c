/* bench_amp.c: what amp costs and saves on this CPU, each opt level against our own O0 in the same
 * run.
 *   amp_{mlp,cnn}_O{1,2}_step   training-step time ratio O-level / O0 (target <= 1.3: this CPU has no
 *                               native f16 arithmetic, so amp must not cost more than the casts);
 *                               the value is the level's samples/s.
 *   amp_{mlp,cnn}_O{1,2}_bf16_step_<isa>  the same with half_type bf16, naming the maximum ISA in
 *                               effect (at avx512_bf16 and above the products run through oneDNN;
 *                               target on AVX512_BF16 without AMX: O2 <= 0.75).
 *   amp_mlp_activation_O{0..3}  bytes autograd keeps for backward after the forward at batch 4096
 *                               (apex_graph_saved_bytes: what the pool holds, plus the caller's f32
 *                               batch where the first layer saves it, as its f16 copy is counted
 *                               under amp), ratio = level / O0 (target for O2 <= 0.55).
 *   amp_mlp_peak_O{0..3}        total peak resident memory of a process training the MLP at batch
 *                               4096 at that level (each level in a fresh process), ratio to O0;
 *   amp_mlp_train_mem_O{0..3}   the same less what the process held before building the model (the
 *                               loaded libraries: OpenBLAS, OpenMP, MPI), which no level changes.
 * MLP 784-1024-1024-10 and the CNN of bench_nn.c, AdamW, batch 128 for the speed figures. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/apex.h"
#include "apex/cpu.h"
#include "bench_models.h"
#include "bench_util.h"

typedef struct {
  apex_model *m;
  apex_module *net;
  apex_optimizer *opt;
  apex_amp *amp;
  apex_graph *g;
  apex_tensor *x;
  int64_t *labels;
  int batch;
} run_t;

static void die(const char *what) {
  fprintf(stderr, "bench_amp: %s: %s\n", what, apex_last_error());
  exit(1);
}

static void run_init_half(run_t *r, int cnn, int batch, const char *level, apex_amp_cast half) {
  memset(r, 0, sizeof *r);
  r->batch = batch;
  r->m = apex_model_create(&(apex_model_options){.seed = 1});
  r->net = cnn ? bench_cnn(r->m) : bench_mlp(r->m);
  size_t np = apex_model_num_params(r->m);
  apex_tensor *ps[16], *gs[16];
  for (size_t i = 0; i < np; i++) {
    ps[i] = apex_var_value(apex_model_param(r->m, i, NULL));
    gs[i] = apex_var_grad(apex_model_param(r->m, i, NULL));
  }
  r->opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f});
  if (!r->opt || apex_optimizer_add_group(r->opt, ps, (int)np, gs, (int)np, NULL, NULL) != APEX_OK) die("optimizer");
  if (apex_amp_initialize(&r->m, 1, &r->opt, 1, &(apex_amp_config){.opt_level = level, .half_type = half}, &r->amp) != APEX_OK) die("amp");
  r->g = apex_graph_create();
  if (apex_amp_prepare_graph(r->amp, r->g) != APEX_OK) die("graph");
  int64_t xs[4] = {batch, 1, 28, 28}, xm[2] = {batch, 784};
  r->x = cnn ? apex_tensor_create(APEX_F32, 4, xs) : apex_tensor_create(APEX_F32, 2, xm);
  apex_rng rng = apex_rng_init(3);
  apex_rng_normal(&rng, apex_tensor_data(r->x), apex_tensor_numel(r->x), 0.0f, 1.0f);
  r->labels = malloc((size_t)batch * sizeof *r->labels);
  for (int i = 0; i < batch; i++) r->labels[i] = (i * 7) % 10;
}

static void run_init(run_t *r, int cnn, int batch, const char *level) { run_init_half(r, cnn, batch, level, APEX_AMP_CAST_DEFAULT); }

static void run_free(run_t *r) {
  apex_graph_destroy(r->g);
  apex_amp_destroy(r->amp);
  apex_optimizer_destroy(r->opt);
  apex_model_destroy(r->m);
  apex_tensor_destroy(r->x);
  free(r->labels);
}

static apex_var *forward(run_t *r) {
  apex_var *out = apex_amp_forward(r->amp, 0, r->net, r->g, apex_graph_input(r->g, r->x, 0));
  apex_var *loss = apex_cross_entropy(r->g, out, r->labels, NULL);
  if (!loss) die("forward");
  return loss;
}

static void step(void *p) {
  run_t *r = p;
  apex_var *loss = forward(r);
  if (apex_amp_backward(r->amp, loss, 0, NULL) != APEX_OK) die("backward");
  if (apex_amp_step(r->amp, r->opt, NULL) != APEX_OK) die("step");
  apex_amp_zero_grad(r->amp);
  apex_graph_reset(r->g);
}

/* The configurations timed against each other: O0, then O1 and O2 in f16 (Apex's half type) and in
 * bf16 (where AVX512_BF16 or AMX runs the products through oneDNN). */
enum { N_CONF = 5 };
static const struct {
  const char *level, *dtype;
  apex_amp_cast half;
} confs[N_CONF] = {{"O0", "f32", APEX_AMP_CAST_DEFAULT},
                   {"O1", "f16", APEX_AMP_CAST_F16},
                   {"O2", "f16", APEX_AMP_CAST_F16},
                   {"O1", "bf16", APEX_AMP_CAST_BF16},
                   {"O2", "bf16", APEX_AMP_CAST_BF16}};

/* Best step time of each configuration on one model, t[conf]. They run in interleaved rounds, best
 * of each kept, so that all see the same moments of a shared machine (one level after the other let
 * a busy second skew the ratio either way). */
static void time_levels(int cnn, double t[N_CONF]) {
  run_t r[N_CONF];
  for (int l = 0; l < N_CONF; l++) run_init_half(&r[l], cnn, 128, confs[l].level, confs[l].half), t[l] = 1e300;
  for (int round = 0; round < 4; round++)
    for (int l = 0; l < N_CONF; l++) {
      double s = bench_best(step, &r[l], round == 0 ? 2 : 0, 3, 0.5);
      t[l] = s < t[l] ? s : t[l];
    }
  for (int l = 0; l < N_CONF; l++) run_free(&r[l]);
}

/* Bytes the graph holds for backward after the forward: its live pool blocks (saved values and
 * state, the logits and loss; not cached spares, released values or transient f32 copies) and the
 * caller's batch when backward reads it (O0: the first linear saves its f32 input; amp levels save
 * their f16 copy, which is the pool's). */
static double activation_bytes(const char *level) {
  run_t r;
  run_init(&r, 0, 4096, level);
  step(&r); /* warm the pool to its working size, then measure a clean forward */
  apex_graph_destroy(r.g);
  r.g = apex_graph_create();
  apex_amp_prepare_graph(r.amp, r.g);
  forward(&r);
  double bytes = (double)apex_graph_saved_bytes(r.g);
  run_free(&r);
  return bytes;
}

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* The child of peak_rss: trains 3 MLP steps at batch 4096 and prints its peak RSS before and after,
 * in KiB. */
static int peak_child(const char *level) {
  long base = max_rss_kib();
  run_t r;
  run_init(&r, 0, 4096, level);
  for (int i = 0; i < 3; i++) step(&r);
  printf("%ld %ld\n", base, max_rss_kib());
  run_free(&r);
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
  for (int cnn = 0; cnn < 2; cnn++) {
    char name[64];
    snprintf(name, sizeof name, "amp_%s_O1_step", cnn ? "cnn" : "mlp");
    if (!bench_wanted(argc, argv, name)) continue;
    double t[N_CONF];
    time_levels(cnn, t);
    for (int l = 1; l < N_CONF; l++) {
      /* f16 keeps its old names; bf16 lines name the ISA level they ran at (apex/cpu.h) */
      if (confs[l].half == APEX_AMP_CAST_F16)
        snprintf(name, sizeof name, "amp_%s_%s_step", cnn ? "cnn" : "mlp", confs[l].level);
      else
        snprintf(name, sizeof name, "amp_%s_%s_%s_step_%s", cnn ? "cnn" : "mlp", confs[l].level, confs[l].dtype,
                 apex_cpu_isa_name(apex_cpu_max_isa()));
      bench_report(name, 128.0 / t[l], "samples/s", t[l] / t[0], "apex-O0-time");
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
