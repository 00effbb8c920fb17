/* bench_gpt2_stack.c: GPT-2 small trained through the full stack on the GPU: the library's model
 * (models.h: apex_gpt_create, 12 layers, 768 wide, 12 heads, 1024 positions, the 50304-token padded
 * vocabulary), recorded on a device graph by autograd, amp O2 with bf16 (f32 masters, dynamic loss scale)
 * and apex's AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1) on the device: what a C program that builds
 * its model from apex's modules gets, through the public API alone. The loss is apex_gpt_loss: the tied
 * head and the cross entropy as one op (apex_linear_cross_entropy). bench/peer_gpt2.py trains the same
 * model in PyTorch (eager and torch.compile) and prints the ratios.
 *
 * The GPT-2 benchmarks' fixed batch (bench_util.h: B sequences of T = 1024 tokens uniform over GPT-2's 50257,
 * targets the next token of the stream) is trained on again and again, so the loss must fall: 3 warm-up
 * steps, then 10 timed steps between two synchronisations. Each step reads nothing on the host (the
 * loss goes into a device history by a device-to-device copy, read at the end; *skipped is not asked),
 * so the host waits only where the stack itself waits. Prints
 *     bench gpt2_stack_bf16_tokens_per_s VALUE tokens/s ratio=R peer=PyTorch eager ...
 *     bench gpt2_stack_bf16_ms_per_step, bench gpt2_stack_bf16_host_waits_per_step
 * then 3 more steps synchronised after each phase: bench gpt2_stack_bf16_phase_{forward,backward,optimizer}_ms
 * with the host's time to queue each phase (when that is as long as the GPU's, the host is the bound)
 * with R against --peer-tokens-per-s N (PyTorch eager's figure, bench/peer_gpt2.py, measured in the
 * same run on the same GPU: tests/gpu/run.sh passes it), 0 without one. Options: --batch B (8), --seq T
 * (1024), --steps N (10), --warmup N (3), --peer-tokens-per-s N, --cpu (the same loop on the CPU with a
 * 2-layer, 64-wide model: a smoke run of the code, not a figure). Skipped, with the reason, without a
 * GPU; a failure (or a loss that does not fall) is a `bench NAME failed: ...` line and exit status 0, as
 * the other benchmarks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "apex/models.h"
#include "bench_util.h"

#define NAME "gpt2_stack_bf16"

static void fail(const char *what) {
  printf("bench %s failed: %s: %s\n", NAME, what, apex_last_error());
  fflush(stdout);
}

/* The model on the GPU, amp O2-bf16 and AdamW over every parameter; 0 or -1 after fail(). */
static int build(apex_model **m, apex_module **gpt, apex_optimizer **opt, apex_amp **amp, int64_t T, apex_device dev) {
  int small = dev == APEX_DEVICE_CPU; /* the --cpu smoke run */
  *m = apex_model_create(&(apex_model_options){.seed = 1234, .device = dev});
  *gpt = *m ? apex_gpt_create(*m, &(apex_gpt_options){.vocab = 50304, .n_layer = small ? 2 : 12, .n_embd = small ? 64 : 768,
                                                       .n_head = small ? 4 : 12, .n_positions = T})
            : NULL;
  if (!*gpt) return fail("creating the model"), -1;
  *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
  if (!*opt) return fail("creating AdamW"), -1;
  size_t np = apex_model_num_params(*m);
  apex_tensor **pv = malloc(np * sizeof *pv), **gv = malloc(np * sizeof *gv);
  int ok = pv && gv;
  for (size_t i = 0; ok && i < np; i++) {
    pv[i] = apex_var_value(apex_model_param(*m, i, NULL));
    gv[i] = apex_var_grad(apex_model_param(*m, i, NULL));
  }
  ok = ok && apex_optimizer_add_group(*opt, pv, (int)np, gv, (int)np, NULL, NULL) == APEX_OK &&
       apex_amp_initialize(m, 1, opt, 1, &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16}, amp) == APEX_OK;
  free(pv);
  free(gv);
  return ok ? 0 : (fail("amp O2 over AdamW"), -1);
}

/* Where a step's time goes: each phase's host time to queue it and its time to the GPU's end (a
 * synchronisation after each phase), summed over the profiled steps. */
typedef struct phases {
  double queue[3], done[3]; /* forward (with the loss), backward, optimizer step */
  int steps;
} phases;

static int on_cpu; /* --cpu: nothing to synchronise */
static apex_status sync_if(phases *ph) { return ph && !on_cpu ? apex_cuda_synchronize() : APEX_OK; }

/* One training step; its loss (f32, on the device) copied into slot. With ph: timed phase by phase. */
static apex_status step(apex_module *gpt, apex_amp *amp, apex_optimizer *opt, apex_graph *g, const int64_t *tokens,
                        const int64_t *targets, int64_t B, int64_t T, apex_tensor *slot, phases *ph) {
  double t0 = bench_now();
  /* the head and the loss as one op (apex_gpt_loss): no [B T, vocab] f32 logits nor their f32 gradient */
  apex_var *loss = apex_gpt_loss(gpt, g, tokens, targets, B, T);
  apex_status st = loss ? apex_tensor_copy(slot, apex_var_value(loss)) : apex_last_status();
  double t1 = bench_now();
  if (st == APEX_OK) st = sync_if(ph);
  double t2 = bench_now();
  if (st == APEX_OK) st = apex_amp_backward(amp, loss, 0, NULL);
  apex_graph_reset(g);
  double t3 = bench_now();
  if (st == APEX_OK) st = sync_if(ph);
  double t4 = bench_now();
  if (st == APEX_OK) st = apex_amp_step(amp, opt, NULL);
  if (st == APEX_OK) st = apex_amp_zero_grad(amp);
  double t5 = bench_now();
  if (st == APEX_OK) st = sync_if(ph);
  double t6 = bench_now();
  if (ph && st == APEX_OK) {
    double q[3] = {t1 - t0, t3 - t2, t5 - t4}, d[3] = {t2 - t0, t4 - t2, t6 - t4};
    for (int k = 0; k < 3; k++) ph->queue[k] += q[k], ph->done[k] += d[k];
    ph->steps++;
  }
  return st;
}

int main(int argc, char **argv) {
  int B = 8, T = 1024, steps = 10, warmup = 3, cpu = 0;
  double peer = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--batch") && v) B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && v) T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && v) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && v) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--peer-tokens-per-s") && v) peer = atof(argv[++i]);
    else if (!strcmp(argv[i], "--cpu")) cpu = 1;
    else {
      fprintf(stderr, "bench_gpt2_stack: unknown option %s (--batch B --seq T --steps N --warmup N --peer-tokens-per-s N --cpu)\n", argv[i]);
      return 2;
    }
  }
  if (B < 1 || T < 2 || T > 1024 || steps < 1 || warmup < 0) {
    fprintf(stderr, "bench_gpt2_stack: --batch >= 1, --seq in [2, 1024], --steps >= 1, --warmup >= 0\n");
    return 2;
  }
  const char *why = NULL;
  apex_device dev_kind = cpu ? APEX_DEVICE_CPU : APEX_DEVICE_CUDA;
  on_cpu = cpu;
  if (!cpu && !apex_cuda_available(&why)) {
    bench_skip(NAME "_tokens_per_s", why && *why ? why : "no CUDA GPU");
    return 0;
  }
  char dev[128] = "the CPU (--cpu: 2 layers, 64 wide)";
  if (!cpu) apex_cuda_device_name(dev, sizeof dev);
  apex_model *m = NULL;
  apex_module *gpt = NULL;
  apex_optimizer *opt = NULL;
  apex_amp *amp = NULL;
  apex_graph *g = NULL;
  size_t bt = (size_t)B * (size_t)T;
  int64_t *tokens = malloc(bt * sizeof *tokens), *targets = malloc(bt * sizeof *targets);
  int64_t total = warmup + steps;
  apex_tensor *history = NULL;
  /* the GPT-2 benchmarks' fixed batch (bench_util.h) */
  int rc = tokens && targets && !bench_gpt2_batch(tokens, targets, bt, 50304) ? build(&m, &gpt, &opt, &amp, T, dev_kind)
                                                                              : (fail("out of memory"), -1);
  if (rc == 0) {
    g = apex_graph_create_on(dev_kind);
    history = apex_tensor_create_on(dev_kind, APEX_F32, 1, &total);
    if (!g || !history || apex_amp_prepare_graph(amp, g) != APEX_OK) rc = (fail("the graph"), -1);
  }
  double seconds = 0;
  unsigned long long waits0 = 0;
  for (int s = 0; rc == 0 && s < total; s++) {
    if (s == warmup) {
      if (!cpu && apex_cuda_synchronize() != APEX_OK) rc = (fail("synchronising"), -1);
      seconds = bench_now();
      waits0 = cpu ? 0 : bench_cuda_waits();
    }
    apex_tensor *slot = apex_tensor_slice_view(history, (size_t)s, 1, (int64_t[]){1});
    if (!slot || step(gpt, amp, opt, g, tokens, targets, B, T, slot, NULL) != APEX_OK) rc = (fail("training step"), -1);
    apex_tensor_destroy(slot);
  }
  unsigned long long waits = rc == 0 && !cpu ? bench_cuda_waits() - waits0 : 0;
  if (rc == 0 && !cpu && apex_cuda_synchronize() != APEX_OK) rc = (fail("synchronising"), -1);
  seconds = bench_now() - seconds;
  apex_tensor *hh = rc == 0 ? apex_tensor_create(APEX_F32, 1, &total) : NULL;
  if (rc == 0 && (!hh || apex_tensor_copy(hh, history) != APEX_OK)) rc = (fail("reading the losses"), -1);
  if (rc == 0) {
    const float *loss = apex_tensor_data(hh);
    double tps = (double)bt * steps / seconds;
    apex_cuda_memory_stats ms = {0};
    if (!cpu) apex_cuda_memory_stats_get(&ms);
    printf("# bench_gpt2_stack on %s: GPT-2 small from apex_gpt_create, B=%d T=%d, amp O2 bf16 (f32 masters), AdamW lr 3e-4 "
           "betas (0.9, 0.95) wd 0.1, %d warm-up + %d timed steps, peak GPU memory %.2f GiB\n# loss by step:",
           dev, B, T, warmup, steps, (double)ms.peak_allocated / (1024.0 * 1024.0 * 1024.0));
    for (int s = 0; s < total; s++) printf(" %.4f", (double)loss[s]);
    printf("\n");
    char peer_name[96];
    snprintf(peer_name, sizeof peer_name, "PyTorch eager %.0f tokens/s (bench/peer_gpt2.py, same run)", peer);
    bench_report(NAME "_tokens_per_s", tps, "tokens/s", peer > 0 ? tps / peer : 0, peer > 0 ? peer_name : "none given (--peer-tokens-per-s)");
    bench_report(NAME "_ms_per_step", 1e3 * seconds / steps, "ms", 0, "-");
    bench_report(NAME "_host_waits_per_step", (double)waits / steps, "waits", 0, "apex_memory.waits");
    /* Then 3 steps more, synchronised after each phase: where the step's time goes, and how much of it the
     * host needs just to queue the work (when queueing takes as long as the GPU, the host is the bound). */
    phases ph = {{0}, {0}, 0};
    apex_tensor *last = apex_tensor_slice_view(history, (size_t)(total - 1), 1, (int64_t[]){1});
    for (int s = 0; s < 3 && last; s++)
      if (step(gpt, amp, opt, g, tokens, targets, B, T, last, &ph) != APEX_OK) break;
    apex_tensor_destroy(last);
    static const char *const phase_name[3] = {"forward", "backward", "optimizer"};
    for (int k = 0; k < 3 && ph.steps > 0; k++) {
      char figure[96], what[96];
      snprintf(figure, sizeof figure, NAME "_phase_%s_ms", phase_name[k]);
      snprintf(what, sizeof what, "host queueing %.2f ms of it", 1e3 * ph.queue[k] / ph.steps);
      bench_report(figure, 1e3 * ph.done[k] / ph.steps, "ms", 0, what);
    }
    if (!(loss[total - 1] < loss[0]))
      printf("bench %s failed: the loss did not decrease on the repeated batch (%.4f -> %.4f)\n", NAME, (double)loss[0],
             (double)loss[total - 1]);
  }
  apex_tensor_destroy(hh);
  apex_tensor_destroy(history);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  free(tokens);
  free(targets);
  return 0;
}
