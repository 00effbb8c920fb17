/* bench_gpt2_cuda.c: GPT-2 small (12 layers, 768 wide, 12 heads, 50304-token padded vocabulary) trained on
 * the GPU in bf16 with f32 masters: apex's CUDA kernels driven by bench/gpt2_cuda.c and apex's fused AdamW
 * (lr 3e-4, betas 0.9/0.95, weight decay 0.1 on the 2-D weights), the training benchmark.
 *
 * One fixed batch of B sequences of T = 1024 synthetic tokens (uniform over GPT-2's 50257 real tokens,
 * targets the next token of the same random stream) is trained on again and again, so the loss must fall
 * (the model memorises the batch): 3 warm-up steps, then 10 timed steps between two synchronisations
 * (host clock; every kernel is on apex's one stream, so the interval is the GPU's). Prints
 *     bench gpt2_small_bf16_tokens_per_s VALUE tokens/s ratio=0.000 peer=...
 *     bench gpt2_small_bf16_ms_per_step, bench gpt2_small_bf16_mfu (percent of the GPU's dense bf16 peak)
 * and the loss of every step. The ratios against PyTorch (eager autocast and torch.compile, same model,
 * same GPU) come from bench/peer_gpt2.py, which runs `bench_gpt2_cuda --time` for apex's figure.
 *
 * MFU: nanoGPT's estimate_mfu: 6 N + 12 L C T FLOPs a token (N = parameters without wpe), over the dense
 * bf16 tensor-core peak: 989.5 TFLOP/s for an H100 SXM or H200 (756 for an H100 PCIe); other GPUs have
 * no table entry and their MFU is skipped.
 *
 * Then, unless --graph 0, the same step captured in a CUDA graph and replayed (gpt2_cuda_train_step_graph), on
 * the same model where the eager steps left it: two calls to warm up and capture, then the same number of
 * timed launches between two synchronisations. Prints
 *     bench gpt2_small_bf16_graph_tokens_per_s VALUE tokens/s ratio=R peer=the eager apex step of this run
 *     bench gpt2_small_bf16_graph_ms_per_step, bench gpt2_small_bf16_graph_host_waits_per_step
 *     bench gpt2_small_bf16_host_waits_per_step (the eager step's, for comparison)
 * with R the graph's tokens/s over the eager figure above; the host's waits are apex's count (stream
 * synchronisations, copies to the host, the graph's staging waits) over the timed steps. None is inside a
 * step; the graph's staging ring makes the host wait at the start of a call once it is two steps ahead of the
 * GPU (its pinned buffer is still being read), so a GPU-bound run shows close to one a step there, where the
 * eager step's pageable copies are staged by the driver and not counted. The loss must keep falling over the
 * graph steps.
 *
 * Then, unless --profile 0, N = 3 more steps with every model call timed on the GPU by CUDA events
 * (gpt2_cuda_profile_start): the breakdown by phase (`bench gpt2_small_bf16_phase_PHASE_ms`, per step, with
 * its share of the profiled step) and by call (every layer's call together, largest first), so that one run
 * says where the time goes without a profiler.
 *
 * Options: --batch B (8), --seq T (1024), --steps N (10), --warmup N (3), --f32 (f32 parameters and
 * activations instead of bf16, for comparison), --time (print apex's tokens/s alone, for peer_gpt2.py),
 * --profile N (3; 0: no breakdown), --graph 0 (no captured-step figures; --time prints none either). APEX_GPT2_ATTENTION=materialised in the environment runs the bf16 model
 * with the materialised attention instead of the fused one (to compare).
 * Skipped, with the reason, without a GPU. A failure (or a loss that does not fall) is a `bench NAME
 * failed: ...` line and exit status 0, as the other benchmarks, so that bench/run goes on; with --time
 * the status is 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "bench_util.h"
#include "gpt2_cuda.h"

/* The dense bf16 tensor-core peak of the GPU in FLOP/s, 0 when this table does not know it. */
static double bf16_peak(const char *dev) {
  if (strstr(dev, "H100") && strstr(dev, "PCIe")) return 756e12;
  if (strstr(dev, "H100") || strstr(dev, "H200")) return 989.5e12;
  return 0;
}

static void fail(const char *name, const char *what) {
  printf("bench %s failed: %s: %s\n", name, what, apex_last_error());
  fflush(stdout);
}

/* The captured step's figures (see the top): `steps` graph launches after two calls that warm up and capture,
 * on the model as the eager steps left it; eager_tps is the eager figure of this run. */
static void graph_run(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets, int steps,
                      size_t bt, double eager_tps, const char *name) {
  char figure[96];
  snprintf(figure, sizeof figure, "%s_graph_tokens_per_s", name);
  float before = 0, after = 0;
  if (gpt2_cuda_loss(m, &before) != APEX_OK) {
    fail(figure, "reading the loss");
    return;
  }
  for (int s = 0; s < 2; s++)
    if (gpt2_cuda_train_step_graph(m, opt, tokens, targets) != APEX_OK) {
      fail(figure, s ? "capturing the step" : "the uncaptured warm-up step");
      return;
    }
  if (!gpt2_cuda_graph_captured(m)) {
    printf("bench %s failed: no graph after the capture call\n", figure);
    return;
  }
  if (apex_cuda_synchronize() != APEX_OK) {
    fail(figure, "synchronising");
    return;
  }
  unsigned long long waits = bench_cuda_waits();
  double seconds = bench_now();
  for (int s = 0; s < steps; s++)
    if (gpt2_cuda_train_step_graph(m, opt, tokens, targets) != APEX_OK) {
      fail(figure, "replaying the step");
      return;
    }
  waits = bench_cuda_waits() - waits; /* before the synchronisation below, which is the timing's, not the steps' */
  if (apex_cuda_synchronize() != APEX_OK) {
    fail(figure, "synchronising");
    return;
  }
  seconds = bench_now() - seconds;
  if (gpt2_cuda_loss(m, &after) != APEX_OK) {
    fail(figure, "reading the loss");
    return;
  }
  const double tps = (double)bt * steps / seconds;
  printf("# captured step (one CUDA graph launch a step): loss %.4f -> %.4f over %d replays\n", (double)before,
         (double)after, steps);
  bench_report(figure, tps, "tokens/s", tps / eager_tps, "the eager apex step of this run");
  snprintf(figure, sizeof figure, "%s_graph_ms_per_step", name);
  bench_report(figure, 1e3 * seconds / steps, "ms", 0, "the eager apex step of this run");
  snprintf(figure, sizeof figure, "%s_graph_host_waits_per_step", name);
  bench_report(figure, (double)waits / steps, "waits", 0, "none");
  if (!(after < before))
    printf("bench %s_graph failed: the loss did not decrease over the graph steps (%.4f -> %.4f)\n", name, (double)before,
           (double)after);
  fflush(stdout);
}

/* The phase of a model call, from its name (bench/gpt2_cuda.c's step names). */
static const char *phase_of(const char *label) {
  static const char *const map[][2] = {
      {"AdamW", "optimizer"},
      {"uploading", "targets_upload"},
      {" and h.0 ln_1", "residual_add_and_layer_norm"},
      {"residual and", "residual_add_and_layer_norm"},
      {"embedding sum", "residual_adds"},
      {"embedding", "embedding"},
      {"residual", "residual_adds"},
      {"attention backward", "attention_bwd"},
      {"attention", "attention_fwd"},
      {"gelu backward", "gelu_bwd"},
      {"gelu", "gelu_fwd"},
      {"cross-entropy", "classifier_loss"},
      {"mean loss", "classifier_loss"},
      {"lm_head", "classifier_matmuls"},
      {"ln_", "layer_norm"}, /* ln_1, ln_2, ln_f, forward and backward */
      {" db", "bias_grads"},
      {" dW", "linear_bwd_matmuls"},
      {" dx", "linear_bwd_matmuls"},
      {"c_attn", "linear_fwd_matmuls"},
      {"c_proj", "linear_fwd_matmuls"},
      {"c_fc", "linear_fwd_matmuls"},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strstr(label, map[i][0])) return map[i][1];
  return "other";
}

/* Runs `steps` profiled training steps and prints the breakdown. */
static void print_breakdown(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets, int steps,
                            const char *name) {
  if (gpt2_cuda_profile_start(m) != APEX_OK) {
    printf("bench %s_phase skipped: %s\n", name, apex_last_error());
    return;
  }
  for (int s = 0; s < steps; s++)
    if (gpt2_cuda_train_step(m, opt, tokens, targets) != APEX_OK) {
      fail(name, "profiled training step");
      break;
    }
  const char *labels[96];
  double ms[96], total = 0;
  int profiled = 0, n = gpt2_cuda_profile_read(m, labels, ms, 96, &profiled);
  if (n == 0 || profiled == 0) {
    printf("bench %s_phase skipped: no profiled step\n", name);
    return;
  }
  for (int i = 0; i < n; i++) total += ms[i];
  /* the last step's intervals are read by gpt2_cuda_profile_read: every profiled step is counted */
  printf("# per-step GPU time by phase, mean of %d profiled steps (CUDA events after every model call; their sum, "
         "%.3f ms, is the step's GPU time less the host gap before each step's first call)\n",
         profiled, total / profiled);
  const char *phases[32];
  double pms[32];
  int np = 0;
  for (int i = 0; i < n; i++) {
    const char *ph = phase_of(labels[i]);
    int j = 0;
    while (j < np && strcmp(phases[j], ph)) j++;
    if (j == np && np < 32) phases[np] = ph, pms[np++] = 0;
    if (j < np) pms[j] += ms[i];
  }
  for (int i = 0; i < np; i++) { /* largest first: a selection sort of a few entries */
    int best = i;
    for (int j = i + 1; j < np; j++)
      if (pms[j] > pms[best]) best = j;
    const char *tn = phases[i];
    double tm = pms[i];
    phases[i] = phases[best], pms[i] = pms[best];
    phases[best] = tn, pms[best] = tm;
    char figure[128], share[64];
    snprintf(figure, sizeof figure, "%s_phase_%s_ms", name, phases[i]);
    snprintf(share, sizeof share, "share=%.1f%%", 100.0 * pms[i] / total);
    bench_report(figure, pms[i] / profiled, "ms", 0, share);
  }
  printf("# by call (every layer's together), ms per step, largest first:\n");
  for (int i = 0; i < n; i++) {
    int best = i;
    for (int j = i + 1; j < n; j++)
      if (ms[j] > ms[best]) best = j;
    const char *tl = labels[i];
    double tm = ms[i];
    labels[i] = labels[best], ms[i] = ms[best];
    labels[best] = tl, ms[best] = tm;
    printf("#   %8.3f ms  %5.1f%%  %-20s %s\n", ms[i] / profiled, 100.0 * ms[i] / total, phase_of(labels[i]), labels[i]);
  }
  fflush(stdout);
}

int main(int argc, char **argv) {
  int B = 8, T = 1024, steps = 10, warmup = 3, time_only = 0, profile = 3, graph = 1;
  apex_dtype dt = APEX_BF16;
  char *names[16];
  int n_names = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--f32")) dt = APEX_F32;
    else if (!strcmp(argv[i], "--time")) time_only = 1;
    else if (!strcmp(argv[i], "--profile") && i + 1 < argc) profile = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--graph") && i + 1 < argc) graph = atoi(argv[++i]);
    else if (argv[i][0] != '-' && n_names < 16) names[n_names++] = argv[i];
    else {
      fprintf(stderr, "usage: bench_gpt2_cuda [--batch B] [--seq T] [--steps N] [--warmup N] [--f32] [--time] [--profile N] "
                      "[--graph 0|1] [NAME...]\n");
      return 2;
    }
  }
  char name[64];
  snprintf(name, sizeof name, "gpt2_small_%s", dt == APEX_BF16 ? "bf16" : "f32");
  /* bench/run passes figure names: run only when one of them matches ours. */
  char *filter[17] = {argv[0]};
  for (int i = 0; i < n_names; i++) filter[i + 1] = names[i];
  if (!bench_wanted(n_names + 1, filter, name) && !bench_wanted(n_names + 1, filter, "gpt2_small_bf16_tokens_per_s")) return 0;
  const char *why;
  if (!apex_cuda_available(&why)) {
    bench_skip(name, why);
    return 0;
  }
  if (B < 1 || T < 1 || T > 1024 || steps < 1 || warmup < 0) {
    fprintf(stderr, "bench_gpt2_cuda: --batch >= 1, --seq in [1, 1024], --steps >= 1, --warmup >= 0\n");
    return 2;
  }
  char dev[128] = "?";
  apex_cuda_device_name(dev, sizeof dev);
  gpt2_config cfg = gpt2_config_small();
  gpt2_cuda *m = gpt2_cuda_create(&cfg, dt, B, T, 1234);
  if (!m) {
    fail(name, "creating the model");
    return time_only;
  }
  apex_optimizer *opt = gpt2_cuda_optimizer_create(m, 3e-4f, 0.1f);
  if (!opt) {
    fail(name, "creating AdamW");
    gpt2_cuda_destroy(m);
    return time_only;
  }
  /* The fixed batch: a random token stream, each position's target the token after it (bench_util.h). */
  size_t bt = (size_t)B * (size_t)T;
  int64_t *tokens = malloc(bt * sizeof *tokens), *targets = malloc(bt * sizeof *targets);
  int rc = 0;
  if (!tokens || !targets || bench_gpt2_batch(tokens, targets, bt, cfg.vocab)) {
    fail(name, "out of memory");
    rc = 1;
  }
  /* Every step's loss goes into a device history by a device-to-device copy, read once at the end. */
  int total = warmup + steps;
  int64_t len = total;
  apex_tensor *history = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &len);
  double seconds = 0;
  unsigned long long waits = 0;
  for (int s = 0; s < total && rc == 0; s++) {
    if (s == warmup) {
      if (apex_cuda_synchronize() != APEX_OK) rc = 1;
      seconds = bench_now();
      waits = bench_cuda_waits();
    }
    apex_tensor *slot = apex_tensor_slice_view(history, (size_t)s, 1, (int64_t[]){1});
    if (gpt2_cuda_train_step(m, opt, tokens, targets) != APEX_OK || !slot ||
        apex_tensor_copy(slot, gpt2_cuda_loss_tensor(m)) != APEX_OK) {
      fail(name, "training step");
      rc = 1;
    }
    apex_tensor_destroy(slot);
  }
  waits = bench_cuda_waits() - waits;
  if (rc == 0 && apex_cuda_synchronize() != APEX_OK) {
    fail(name, "synchronising");
    rc = 1;
  }
  seconds = bench_now() - seconds;
  if (rc == 0) {
    double tps = (double)bt * steps / seconds, flops = gpt2_cuda_flops_per_token(m) * tps, peak = bf16_peak(dev);
    apex_tensor *hh = apex_tensor_create(APEX_F32, 1, &len);
    if (!hh || apex_tensor_copy(hh, history) != APEX_OK) {
      fail(name, "reading the losses");
      apex_tensor_destroy(hh);
      hh = apex_tensor_create(APEX_F32, 1, &len); /* zeros: reported below as a loss that did not fall */
    }
    const float *loss = apex_tensor_data(hh);
    int decreasing = loss[total - 1] < loss[0]; /* false for NaN too */
    if (time_only) {
      if (decreasing) printf("%.3f\n", tps); /* else the failure line below is the last: peer_gpt2.py reports it */
    } else {
      apex_cuda_memory_stats ms = {0};
      apex_cuda_memory_stats_get(&ms);
      printf("# bench_gpt2_cuda on %s: GPT-2 small, %.2fM parameters (%.2fM in the MFU estimate), B=%d T=%d, %s, "
             "AdamW lr 3e-4 betas (0.9, 0.95) wd 0.1, %d warm-up + %d timed steps, peak GPU memory %.2f GiB, "
             "attention %s\n",
             dev, gpt2_cuda_num_params(m) / 1e6, gpt2_cuda_num_params_non_embedding(m) / 1e6, B, T,
             dt == APEX_BF16 ? "bf16 parameters with f32 masters" : "f32", warmup, steps,
             (double)ms.peak_allocated / (1024.0 * 1024.0 * 1024.0), gpt2_cuda_attention_path(m));
      printf("# loss by step:");
      for (int s = 0; s < total; s++) printf(" %.4f", (double)loss[s]);
      printf("\n# the loss %s on the repeated batch (%.4f -> %.4f)\n", decreasing ? "decreased" : "DID NOT DECREASE",
             (double)loss[0], (double)loss[total - 1]);
      char figure[96];
      snprintf(figure, sizeof figure, "%s_tokens_per_s", name);
      bench_report(figure, tps, "tokens/s", 0, "PyTorch eager and torch.compile in bench/peer_gpt2.py");
      snprintf(figure, sizeof figure, "%s_ms_per_step", name);
      bench_report(figure, 1e3 * seconds / steps, "ms", 0, "bench/peer_gpt2.py");
      snprintf(figure, sizeof figure, "%s_mfu", name);
      if (dt != APEX_BF16) bench_skip(figure, "MFU is against the bf16 peak; this run is f32");
      else if (peak > 0) bench_report(figure, 100.0 * flops / peak, "%", 0, "bench/peer_gpt2.py");
      else bench_skip(figure, "no dense bf16 peak known for this GPU (bench_gpt2_cuda.c knows H100 and H200)");
      snprintf(figure, sizeof figure, "%s_host_waits_per_step", name);
      bench_report(figure, (double)waits / steps, "waits", 0, "none");
    }
    if (!decreasing) {
      printf("bench %s failed: the loss did not decrease on the repeated batch (%.4f -> %.4f)\n", name, (double)loss[0],
             (double)loss[total - 1]);
      rc = 1;
    }
    apex_tensor_destroy(hh);
    if (!time_only && graph) graph_run(m, opt, tokens, targets, steps, bt, tps, name);
    if (!time_only && profile > 0) print_breakdown(m, opt, tokens, targets, profile, name);
  }
  apex_tensor_destroy(history);
  free(tokens);
  free(targets);
  apex_optimizer_destroy(opt);
  gpt2_cuda_destroy(m);
  return time_only ? rc : 0;
}
