/* bench_gpt2_stack.c: GPT-2 small trained through the full stack on the GPU: the library's model
 * (models.h: apex_gpt_create, 12 layers, 768 wide, 12 heads, 1024 positions, the 50304-token padded
 * vocabulary), recorded on a device graph by autograd, amp O2 with bf16 (f32 masters, dynamic loss scale)
 * and apex's AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1) on the device: what a C program that builds
 * its model from apex's modules gets, through the public API alone. The loss is apex_gpt_loss: the tied
 * head and the cross entropy as one op (apex_linear_cross_entropy). bench/peer_gpt2.py trains the same
 * model in PyTorch (eager and torch.compile) and prints the ratios.
 *
 * The GPT-2 benchmarks' fixed batch (bench_util.h: B sequences of T = 1024 tokens uniform over GPT-2's 50257,
 * targets the next token of the stream), set into two indexes (index.h) before every step as a training
 * loop would, is trained on again and again, so the loss must fall. The step reads its batch from the
 * device (apex_gpt_loss_index) and nothing on the host (the loss goes into a device tensor, copied into a
 * device history read at the end; *skipped is not asked), so the host waits only where the stack waits.
 * Two ways, on two models from the same seed:
 *   eager: 3 warm-up steps, then 10 timed steps between two synchronisations;
 *   captured (capture.h): apex_step_capture (one step), 2 warm-up replays, then 10 timed replays.
 * Prints
 *     bench gpt2_stack_bf16_tokens_per_s VALUE tokens/s ratio=R peer=PyTorch eager ...   the captured step
 *     bench gpt2_stack_bf16_ms_per_step, _mfu, _host_waits_per_step                       the same
 *     bench gpt2_stack_bf16_eager_tokens_per_s, _eager_ms_per_step, _eager_host_waits_per_step
 * then 3 more eager steps synchronised after each phase: bench gpt2_stack_bf16_phase_{forward,backward,
 * optimizer}_ms with the host's time to queue each phase (when that is as long as the GPU's, the host is
 * the bound), with R against --peer-tokens-per-s N (PyTorch eager's figure, bench/peer_gpt2.py, in the same
 * run on the same GPU), 0 without one; bench/peer_gpt2.py prints the ratios when handed this figure. MFU is
 * nanoGPT's estimate (6 N + 12 L C T FLOPs a token, N the parameters without wpe) over 989.5 TFLOP/s
 * (756 on an H100 PCIe). A capture that fails is a `bench gpt2_stack_bf16_tokens_per_s failed: ...` line,
 * the eager figures still printed. Options: --batch B (8), --seq T
 * (1024), --steps N (10), --warmup N (3), --peer-tokens-per-s N, --f32-grads (amp's half_grads off: the
 * backward's activation gradients in f32, to measure what gradients in bf16 save), --cpu (the same loops
 * on the CPU with a 2-layer, 64-wide model: a smoke run of the code, not a figure). Skipped, with the reason, without a
 * GPU; a failure (or a loss that does not fall) is a `bench NAME failed: ...` line and exit status 0, as
 * the other benchmarks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/capture.h"
#include "apex/cuda.h"
#include "apex/models.h"
#include "bench_util.h"

#define NAME "gpt2_stack_bf16"

static void fail(const char *what) {
  printf("bench %s failed: %s: %s\n", NAME, what, apex_last_error());
  fflush(stdout);
}

/* The model on the GPU, amp O2-bf16 and AdamW over every parameter; 0 or -1 after fail(). */
static apex_amp_flag half_grads = APEX_AMP_DEFAULT; /* --f32-grads: APEX_AMP_OFF */

static int build(apex_model **m, apex_module **gpt, apex_optimizer **opt, apex_amp **amp, int64_t T, apex_device dev) {
  int small = dev == APEX_DEVICE_CPU; /* the --cpu smoke run */
  *m = apex_model_create(&(apex_model_options){.seed = 1234, .device = dev});
  *gpt = *m ? apex_gpt_create(*m, &(apex_gpt_options){.vocab = 50304, .n_layer = small ? 2 : 12, .n_embd = small ? 64 : 768,
                                                       .n_head = small ? 4 : 12, .n_positions = T})
            : NULL;
  if (!*gpt) return fail("creating the model"), -1;
  *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
  if (!*opt) return fail("creating AdamW"), -1;
  int ok = apex_optimizer_add_model(*opt, *m, NULL, NULL) == APEX_OK &&
           apex_amp_initialize(m, 1, opt, 1, &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16, .half_grads = half_grads},
                               amp) == APEX_OK;
  return ok ? 0 : (fail("amp O2 over AdamW"), -1);
}

/* Where a step's time goes: each phase's host time to queue it and its time to the GPU's end (a
 * synchronisation after each phase), summed over the profiled steps. */
typedef struct phases {
  double queue[3], done[3]; /* forward (with the loss), backward, optimizer step */
  int steps;
} phases;

/* One model and what its step needs. */
typedef struct run {
  apex_model *m;
  apex_module *gpt;
  apex_optimizer *opt;
  apex_amp *amp;
  apex_graph *g;
  apex_index *ids, *targets;
  apex_tensor *loss; /* the step's loss, on the device */
  phases *ph;        /* NULL: no synchronisation inside the step */
  int cpu;
} run;

static apex_status sync_if(const run *r) { return r->ph && !r->cpu ? apex_cuda_synchronize() : APEX_OK; }

/* One training step (apex_step_fn): its loss into r->loss; with r->ph, timed phase by phase. */
static apex_status step(void *ctx) {
  run *r = ctx;
  double t0 = bench_now();
  /* the head and the loss as one op (apex_gpt_loss_index): no [B T, vocab] f32 logits nor their f32 gradient */
  apex_var *loss = apex_gpt_loss_index(r->gpt, r->g, r->ids, r->targets);
  apex_status st = loss ? apex_tensor_copy(r->loss, apex_var_value(loss)) : apex_last_status();
  double t1 = bench_now();
  if (st == APEX_OK) st = sync_if(r);
  double t2 = bench_now();
  if (st == APEX_OK) st = apex_amp_backward(r->amp, loss, 0, NULL);
  apex_graph_reset(r->g);
  double t3 = bench_now();
  if (st == APEX_OK) st = sync_if(r);
  double t4 = bench_now();
  if (st == APEX_OK) st = apex_amp_step(r->amp, r->opt, NULL);
  if (st == APEX_OK) st = apex_amp_zero_grad(r->amp);
  double t5 = bench_now();
  if (st == APEX_OK) st = sync_if(r);
  double t6 = bench_now();
  if (r->ph && st == APEX_OK) {
    double q[3] = {t1 - t0, t3 - t2, t5 - t4}, d[3] = {t2 - t0, t4 - t2, t6 - t4};
    for (int k = 0; k < 3; k++) r->ph->queue[k] += q[k], r->ph->done[k] += d[k];
    r->ph->steps++;
  }
  return st;
}

static void run_free(run *r) {
  apex_index_destroy(r->ids);
  apex_index_destroy(r->targets);
  apex_tensor_destroy(r->loss);
  apex_graph_destroy(r->g);
  apex_amp_destroy(r->amp);
  apex_optimizer_destroy(r->opt);
  apex_model_destroy(r->m);
}

/* The model, its graph, indexes and loss; 0 or -1 after fail(). */
static int run_make(run *r, int64_t B, int64_t T, apex_device dev) {
  *r = (run){.cpu = dev == APEX_DEVICE_CPU};
  if (build(&r->m, &r->gpt, &r->opt, &r->amp, T, dev)) return -1;
  const int64_t shape[2] = {B, T};
  r->g = apex_graph_create_on(dev);
  r->ids = apex_index_create_on(dev, 2, shape, 50304);
  r->targets = apex_index_create_on(dev, 2, shape, 50304);
  r->loss = apex_tensor_create_on(dev, APEX_F32, 0, NULL);
  if (!r->g || !r->ids || !r->targets || !r->loss || apex_amp_prepare_graph(r->amp, r->g) != APEX_OK) return fail("the graph"), -1;
  return 0;
}

/* The batch set as a loop sets it before each step, then the step (or a replay of it), its loss copied into
 * history slot s. */
static apex_status one_step(run *r, apex_captured_step *cs, const int64_t *tokens, const int64_t *targets, size_t bt,
                            apex_tensor *history, int64_t s) {
  apex_status st = apex_index_set(r->ids, tokens, (int64_t)bt);
  if (st == APEX_OK) st = apex_index_set(r->targets, targets, (int64_t)bt);
  if (st == APEX_OK) st = cs ? apex_step_replay(cs) : step(r);
  apex_tensor *slot = st == APEX_OK ? apex_tensor_slice_view(history, (size_t)s, 0, NULL) : NULL;
  if (st == APEX_OK) st = slot ? apex_tensor_copy(slot, r->loss) : apex_last_status();
  apex_tensor_destroy(slot);
  return st;
}

typedef struct timing {
  double seconds;
  unsigned long long waits;
} timing;

/* warmup + steps steps (replays of cs when given; cs's capture counts as the first warm-up step), the last
 * `steps` timed between two synchronisations; the losses into history[0..warmup + steps). 0, or -1 after
 * saying why. */
static int train(run *r, apex_captured_step *cs, const int64_t *tokens, const int64_t *targets, size_t bt, int warmup, int steps,
                 apex_tensor *history, timing *t, const char *what) {
  for (int s = cs ? 1 : 0; s < warmup + steps; s++) {
    if (s == warmup) {
      if (!r->cpu && apex_cuda_synchronize() != APEX_OK) return fail("synchronising"), -1;
      t->seconds = bench_now();
      t->waits = r->cpu ? 0 : bench_cuda_waits();
    }
    if (one_step(r, cs, tokens, targets, bt, history, s) != APEX_OK) return fail(what), -1;
  }
  t->waits = r->cpu ? 0 : bench_cuda_waits() - t->waits;
  if (!r->cpu && apex_cuda_synchronize() != APEX_OK) return fail("synchronising"), -1;
  t->seconds = bench_now() - t->seconds;
  return 0;
}

/* The losses of a history, printed; 0 when the last is below the first. */
static int print_losses(const char *what, apex_tensor *history, int64_t n) {
  apex_tensor *hh = apex_tensor_create(APEX_F32, 1, &n);
  if (!hh || apex_tensor_copy(hh, history) != APEX_OK) {
    apex_tensor_destroy(hh);
    return fail("reading the losses"), -1;
  }
  const float *loss = apex_tensor_data(hh);
  printf("# %s loss by step:", what);
  for (int64_t s = 0; s < n; s++) printf(" %.4f", (double)loss[s]);
  printf("\n");
  int ok = loss[n - 1] < loss[0];
  if (!ok) printf("bench %s failed: the %s loss did not decrease on the repeated batch (%.4f -> %.4f)\n", NAME, what, (double)loss[0],
                  (double)loss[n - 1]);
  apex_tensor_destroy(hh);
  return ok ? 0 : -1;
}

/* nanoGPT's estimate of a token's FLOPs: 6 N + 12 L C T, N the parameters without wpe. */
static double flops_per_token(const run *r, int64_t T) {
  apex_gpt_options o;
  if (apex_gpt_sizes(r->gpt, &o) != APEX_OK) return 0;
  double n = (double)apex_model_param_elements(r->m) - (double)(o.n_positions * o.n_embd);
  return 6 * n + 12.0 * (double)(o.n_layer * o.n_embd * T);
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
    else if (!strcmp(argv[i], "--f32-grads")) half_grads = APEX_AMP_OFF;
    else {
      fprintf(stderr, "bench_gpt2_stack: unknown option %s (--batch B --seq T --steps N --warmup N --peer-tokens-per-s N --f32-grads --cpu)\n", argv[i]);
      return 2;
    }
  }
  if (B < 1 || T < 2 || T > 1024 || steps < 1 || warmup < 1) {
    fprintf(stderr, "bench_gpt2_stack: --batch >= 1, --seq in [2, 1024], --steps >= 1, --warmup >= 1\n");
    return 2;
  }
  const char *why = NULL;
  apex_device dev_kind = cpu ? APEX_DEVICE_CPU : APEX_DEVICE_CUDA;
  if (!cpu && !apex_cuda_available(&why)) {
    bench_skip(NAME "_tokens_per_s", why && *why ? why : "no CUDA GPU");
    return 0;
  }
  char dev[128] = "the CPU (--cpu: 2 layers, 64 wide)";
  if (!cpu) apex_cuda_device_name(dev, sizeof dev);
  const double peak = cpu ? 0 : strstr(dev, "PCIe") ? 756e12 : 989.5e12;
  size_t bt = (size_t)B * (size_t)T;
  int64_t *tokens = malloc(bt * sizeof *tokens), *targets = malloc(bt * sizeof *targets);
  int64_t total = warmup + steps;
  run e = {0}, c = {0};
  apex_tensor *history = NULL;
  apex_captured_step *cs = NULL;
  timing te = {0, 0}, tc = {0, 0};
  /* the GPT-2 benchmarks' fixed batch (bench_util.h) */
  int rc = tokens && targets && !bench_gpt2_batch(tokens, targets, bt, 50304) ? 0 : (fail("out of memory"), -1);
  if (rc == 0) rc = run_make(&e, B, T, dev_kind);
  if (rc == 0 && !(history = apex_tensor_create_on(dev_kind, APEX_F32, 1, &total))) rc = (fail("the loss history"), -1);
  if (rc == 0) rc = train(&e, NULL, tokens, targets, bt, warmup, steps, history, &te, "eager training step");
  if (rc == 0) rc = print_losses("eager", history, total);
  apex_cuda_memory_stats ms = {0};
  if (rc == 0 && !cpu) apex_cuda_memory_stats_get(&ms);
  printf("# bench_gpt2_stack on %s: GPT-2 small from apex_gpt_create, B=%d T=%d, amp O2 bf16 (f32 masters), AdamW lr 3e-4 "
         "betas (0.9, 0.95) wd 0.1, batch from indexes; eager %d warm-up + %d timed steps, peak GPU memory %.2f GiB\n",
         dev, B, T, warmup, steps, (double)ms.peak_allocated / (1024.0 * 1024.0 * 1024.0));
  char peer_name[96];
  snprintf(peer_name, sizeof peer_name, "PyTorch eager %.0f tokens/s (bench/peer_gpt2.py, same run)", peer);
  const char *peer_what = peer > 0 ? peer_name : "none given (--peer-tokens-per-s)";
  if (rc == 0) {
    double tps = (double)bt * steps / te.seconds;
    bench_report(NAME "_eager_tokens_per_s", tps, "tokens/s", peer > 0 ? tps / peer : 0, peer_what);
    bench_report(NAME "_eager_ms_per_step", 1e3 * te.seconds / steps, "ms", 0, "-");
    bench_report(NAME "_eager_host_waits_per_step", (double)te.waits / steps, "waits", 0, "apex_cuda_memory_stats.host_waits");
    /* Then 3 steps more, synchronised after each phase: where the step's time goes, and how much of it the
     * host needs just to queue the work (when queueing takes as long as the GPU, the host is the bound). */
    phases ph = {{0}, {0}, 0};
    e.ph = &ph;
    for (int s = 0; s < 3; s++)
      if (one_step(&e, NULL, tokens, targets, bt, history, total - 1) != APEX_OK) break;
    e.ph = NULL;
    static const char *const phase_name[3] = {"forward", "backward", "optimizer"};
    for (int k = 0; k < 3 && ph.steps > 0; k++) {
      char figure[96], what[96];
      snprintf(figure, sizeof figure, NAME "_phase_%s_ms", phase_name[k]);
      snprintf(what, sizeof what, "eager; host queueing %.2f ms of it", 1e3 * ph.queue[k] / ph.steps);
      bench_report(figure, 1e3 * ph.done[k] / ph.steps, "ms", 0, what);
    }
  }
  /* the captured step, on a second model from the same seed (the eager one's memory given back first) */
  run_free(&e);
  e = (run){0};
  if (rc == 0) rc = run_make(&c, B, T, dev_kind);
  apex_status st = APEX_OK;
  if (rc == 0) {
    st = apex_index_set(c.ids, tokens, (int64_t)bt);
    if (st == APEX_OK) st = apex_index_set(c.targets, targets, (int64_t)bt);
    if (st == APEX_OK) st = apex_step_capture(dev_kind, step, &c, &(apex_capture_options){&c.opt, 1}, &cs);
    apex_tensor *slot = st == APEX_OK ? apex_tensor_slice_view(history, 0, 0, NULL) : NULL;
    if (st == APEX_OK) st = slot ? apex_tensor_copy(slot, c.loss) : apex_last_status();
    apex_tensor_destroy(slot);
    if (st != APEX_OK) printf("bench %s_tokens_per_s failed: capturing the step: %s\n", NAME, apex_last_error());
  }
  if (rc == 0 && st == APEX_OK && train(&c, cs, tokens, targets, bt, warmup, steps, history, &tc, "replaying the captured step") == 0 &&
      print_losses("captured", history, total) == 0) {
    double tps = (double)bt * steps / tc.seconds, fpt = flops_per_token(&c, T);
    bench_report(NAME "_tokens_per_s", tps, "tokens/s", peer > 0 ? tps / peer : 0, peer_what);
    bench_report(NAME "_ms_per_step", 1e3 * tc.seconds / steps, "ms", 0, "captured (apex_step_replay)");
    if (peak > 0) bench_report(NAME "_mfu", 100 * fpt * tps / peak, "%", 0, "nanoGPT's estimate over the dense bf16 peak");
    bench_report(NAME "_host_waits_per_step", (double)tc.waits / steps, "waits", 0, "apex_cuda_memory_stats.host_waits");
  }
  apex_captured_step_destroy(cs);
  run_free(&c);
  apex_tensor_destroy(history);
  free(tokens);
  free(targets);
  return 0;
}
