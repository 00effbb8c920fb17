/* bench_gpt2_memory.c: the peak resident memory of GPT-2 small training steps on the CPU, through the
 * full stack (models.h's apex_gpt_create: 12 layers, 768 wide, 12 heads, GPT-2's 50257 tokens, the head
 * tied to wte), amp at --opt-level (O0: f32; O2: bf16 weights, f32 masters) and apex's AdamW: what a C
 * program that trains GPT-2 small with apex holds. bench/peer_gpt2_memory.py runs it beside PyTorch's
 * same step, each in a process of its own (a peak is per process), and prints the ratio.
 *
 * Two steps on one fixed batch (the second has the optimizer's state), then the process's peak RSS
 * (getrusage), and where the step's memory goes: the weights as the model holds them, AdamW's state,
 * the activations that the forward keeps for backward (apex_graph_saved_bytes) and the graph's pool at
 * its largest. Prints
 *     bench gpt2_memory_B1_T1024_O2_peak_rss VALUE GB ratio=R peer=...
 * with R against --peer-gb X (PyTorch's peak for the same step, from the peer script), 0 without one.
 * Options: --batch B (1), --seq T (1024), --opt-level O0|O2 (O2), --peer-gb X, --threads N, --small (a
 * 2-layer, 64-wide model: a smoke run of the code, not a figure). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "apex/apex.h"
#include "apex/models.h"
#include "bench_util.h"

static double gb(double bytes) { return bytes / 1e9; }

static double peak_rss_bytes(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss * 1024.0; /* kilobytes on Linux */
}

int main(int argc, char **argv) {
  int B = 1, T = 1024, small = 0, threads = 0;
  const char *level = "O2";
  double peer = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--batch") && v) B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && v) T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--opt-level") && v) level = argv[++i];
    else if (!strcmp(argv[i], "--peer-gb") && v) peer = atof(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && v) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--small")) small = 1;
    else {
      fprintf(stderr, "bench_gpt2_memory: unknown option %s (--batch B --seq T --opt-level O0|O2 --peer-gb X --threads N --small)\n", argv[i]);
      return 2;
    }
  }
  if (B < 1 || T < 2 || T > 1024 || (strcmp(level, "O0") && strcmp(level, "O2"))) {
    fprintf(stderr, "bench_gpt2_memory: --batch >= 1, --seq in [2, 1024], --opt-level O0 or O2\n");
    return 2;
  }
  if (threads > 0) apex_set_num_threads(threads);
  char name[96];
  snprintf(name, sizeof name, "gpt2_memory_B%d_T%d_%s_peak_rss", B, T, level);
  double rss0 = peak_rss_bytes();
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 1234});
  apex_module *gpt = m ? apex_gpt_create(m, &(apex_gpt_options){.vocab = 50257, .n_layer = small ? 2 : 12, .n_embd = small ? 64 : 768,
                                                                   .n_head = small ? 4 : 12, .n_positions = T})
                       : NULL;
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
  apex_amp *amp = NULL;
  size_t np = m ? apex_model_num_params(m) : 0, n_elems = 0;
  apex_tensor **pv = malloc((np + 1) * sizeof *pv), **gv = malloc((np + 1) * sizeof *gv);
  int ok = gpt && opt && pv && gv;
  for (size_t i = 0; ok && i < np; i++) {
    pv[i] = apex_var_value(apex_model_param(m, i, NULL));
    gv[i] = apex_var_grad(apex_model_param(m, i, NULL));
    n_elems += apex_tensor_numel(pv[i]);
  }
  ok = ok && apex_optimizer_add_group(opt, pv, (int)np, gv, (int)np, NULL, NULL) == APEX_OK &&
       apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = level, .half_type = APEX_AMP_CAST_BF16}, &amp) == APEX_OK;
  free(pv);
  free(gv);
  apex_graph *g = ok ? apex_graph_create() : NULL;
  ok = g && apex_amp_prepare_graph(amp, g) == APEX_OK;
  size_t bt = (size_t)B * (size_t)T;
  int64_t *tokens = malloc(bt * sizeof *tokens), *targets = malloc(bt * sizeof *targets);
  ok = ok && tokens && targets && !bench_gpt2_batch(tokens, targets, bt, 50257);
  double saved = 0, pool = 0, seconds = bench_now();
  float losses[2] = {0, 0};
  for (int s = 0; ok && s < 2; s++) {
    apex_var *loss = apex_gpt_loss(gpt, g, tokens, targets, B, T); /* the tied head and its loss as one op */
    if (loss) {
      double sb = (double)apex_graph_saved_bytes(g);
      if (sb > saved) saved = sb;
      losses[s] = apex_var_item(loss);
    }
    ok = loss && apex_amp_backward(amp, loss, 0, NULL) == APEX_OK;
    if (ok && (double)apex_graph_pool_bytes(g) > pool) pool = (double)apex_graph_pool_bytes(g);
    apex_graph_reset(g);
    ok = ok && apex_amp_step(amp, opt, NULL) == APEX_OK && apex_amp_zero_grad(amp) == APEX_OK;
  }
  seconds = bench_now() - seconds;
  if (!ok) {
    printf("bench %s failed: %s\n", name, apex_last_error());
    return 0;
  }
  double peak = peak_rss_bytes(), e = (double)n_elems, weights = 0;
  for (size_t i = 0; i < np; i++) weights += (double)apex_tensor_nbytes(apex_var_value(apex_model_param(m, i, NULL)));
  printf("# bench_gpt2_memory: GPT-2 small%s from apex_gpt_create (%.1fM parameters), B=%d T=%d, amp %s%s, AdamW, 2 steps in %.1f s "
         "(losses %.4f %.4f); before the model %.2f GB\n# the weights as the model holds them %.2f GB, AdamW's m and v "
         "(f32) %.2f GB; kept for backward (apex_graph_saved_bytes) %.2f GB, the graph's pool at its largest %.2f GB\n",
         small ? " (--small: 2 layers, 64 wide)" : "", e / 1e6, B, T, level, strcmp(level, "O0") ? " (bf16)" : " (f32)", seconds, (double)losses[0], (double)losses[1],
         gb(rss0), gb(weights), gb(e * 8), gb(saved), gb(pool));
  char peer_name[96];
  snprintf(peer_name, sizeof peer_name, "PyTorch %.2f GB (bench/peer_gpt2_memory.py, same run)", peer);
  bench_report(name, gb(peak), "GB", peer > 0 ? gb(peak) / peer : 0, peer > 0 ? peer_name : "none given (--peer-gb)");
  free(tokens);
  free(targets);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  return 0;
}
