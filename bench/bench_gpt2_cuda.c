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
 * Options: --batch B (8), --seq T (1024), --steps N (10), --warmup N (3), --f32 (f32 parameters and
 * activations instead of bf16, for comparison), --time (print apex's tokens/s alone, for peer_gpt2.py).
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

#define REAL_VOCAB 50257 /* GPT-2's tokens; the padded rows up to 50304 are never targets */

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

int main(int argc, char **argv) {
  int B = 8, T = 1024, steps = 10, warmup = 3, time_only = 0;
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
    else if (argv[i][0] != '-' && n_names < 16) names[n_names++] = argv[i];
    else {
      fprintf(stderr, "usage: bench_gpt2_cuda [--batch B] [--seq T] [--steps N] [--warmup N] [--f32] [--time] [NAME...]\n");
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
  /* The fixed batch: a random token stream, each position's target the token after it. */
  size_t bt = (size_t)B * (size_t)T;
  int64_t *tokens = malloc(bt * sizeof *tokens), *targets = malloc(bt * sizeof *targets);
  float *u = malloc((bt + 1) * sizeof *u);
  apex_rng rng = apex_rng_init(42);
  apex_rng_uniform(&rng, u, bt + 1);
  for (size_t i = 0; i < bt; i++) {
    tokens[i] = (int64_t)(u[i] * REAL_VOCAB) % REAL_VOCAB;
    targets[i] = (int64_t)(u[i + 1] * REAL_VOCAB) % REAL_VOCAB;
  }
  free(u);
  /* Every step's loss goes into a device history by a device-to-device copy, read once at the end. */
  int total = warmup + steps;
  int64_t len = total;
  apex_tensor *history = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &len);
  int rc = 0;
  double seconds = 0;
  for (int s = 0; s < total && rc == 0; s++) {
    if (s == warmup) {
      if (apex_cuda_synchronize() != APEX_OK) rc = 1;
      seconds = bench_now();
    }
    apex_tensor *slot = apex_tensor_slice_view(history, (size_t)s, 1, (int64_t[]){1});
    if (gpt2_cuda_train_step(m, opt, tokens, targets) != APEX_OK || !slot ||
        apex_tensor_copy(slot, gpt2_cuda_loss_tensor(m)) != APEX_OK) {
      fail(name, "training step");
      rc = 1;
    }
    apex_tensor_destroy(slot);
  }
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
             "AdamW lr 3e-4 betas (0.9, 0.95) wd 0.1, %d warm-up + %d timed steps, peak GPU memory %.2f GiB\n",
             dev, gpt2_cuda_num_params(m) / 1e6, gpt2_cuda_num_params_non_embedding(m) / 1e6, B, T,
             dt == APEX_BF16 ? "bf16 parameters with f32 masters" : "f32", warmup, steps,
             (double)ms.peak_allocated / (1024.0 * 1024.0 * 1024.0));
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
    }
    if (!decreasing) {
      printf("bench %s failed: the loss did not decrease on the repeated batch (%.4f -> %.4f)\n", name, (double)loss[0],
             (double)loss[total - 1]);
      rc = 1;
    }
    apex_tensor_destroy(hh);
  }
  apex_tensor_destroy(history);
  free(tokens);
  free(targets);
  apex_optimizer_destroy(opt);
  gpt2_cuda_destroy(m);
  return time_only ? rc : 0;
}
