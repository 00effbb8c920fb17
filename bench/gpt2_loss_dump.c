/* gpt2_loss_dump.c: apex's half of the GPT-2 loss-parity check (bench/gpt2_loss_parity.py is the other), on
 * the library's path only: the model of apex_gpt_create, the loss of apex_gpt_loss, amp and AdamW, as a C
 * program that builds its GPT-2 with apex trains it. It writes what PyTorch needs to start from exactly where
 * apex starts, then trains and writes apex's losses:
 *
 *   DIR/init.safetensors  every parameter of the model as f32 under its apex name (apex_model_param's:
 *                         "wte.weight", "h0.attn.q.weight", ...; a linear's weight is [out, in], as a torch
 *                         Linear's), the value the optimizer steps: amp's f32 master under O2, else the
 *                         parameter. The script joins h<N>.attn.{q,k,v} into its c_attn. The metadata holds
 *                         the run: vocab, max_t, n_layer, n_embd, n_head, batch, seq, steps, lr,
 *                         weight_decay, beta1, beta2, eps, dtype (bf16 or f32), device.
 *   DIR/batch.i64         the batch: B * T token ids, then B * T targets, int64 little-endian, row-major [B, T].
 *   DIR/apex_losses.txt   one line a step: the mean loss of that step's forward (before its update).
 *
 * The run: GPT-2 small (12 layers, 768 wide, 12 heads, 1024 positions, the 50304-token padded vocabulary), or
 * --tiny (peer_gpt2.py's: 2 layers, 64 wide, 4 heads, vocabulary 96, 24 positions, B = 2, T = 16); the model's
 * own initialisation from seed 1234; the fixed batch of the GPT-2 benchmarks (bench_gpt2_batch); amp O2 with
 * bf16 (f32 masters, dynamic loss scale) or, with --f32, amp O0; AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8,
 * weight decay 0.1 on the 2-D weights and none on the rest (two groups, as peer_gpt2.py's optimizer), no
 * clipping, 13 steps by default.
 *
 * Options: --out DIR (required; made if absent), --steps N (13), --batch B, --seq T, --tiny, --f32, --device
 * cuda|cpu (cuda). Exit status 0, 77 (with the reason) when the device is not there, 1 on a failure, 2 on bad
 * arguments. */
#define _DEFAULT_SOURCE /* mkdir's mode bits under -std=c11 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "apex/models.h"
#include "apex/safetensors.h"
#include "bench_util.h"

static int fail(const char *what) {
  fprintf(stderr, "gpt2_loss_dump: %s: %s\n", what, apex_last_error());
  return 1;
}

typedef struct run {
  apex_gpt_options cfg;
  int B, T, steps;
  float lr, wd;
  apex_dtype dt;
  apex_device device;
} run;

/* The model's parameters in two AdamW groups, the 2-D weights with weight decay and the rest without, and
 * amp over them (O2 bf16 or O0). 0, or 1 after saying why. */
static int build(const run *r, apex_model **m, apex_module **gpt, apex_optimizer **opt, apex_amp **amp) {
  *m = apex_model_create(&(apex_model_options){.seed = 1234, .device = r->device});
  *gpt = *m ? apex_gpt_create(*m, &r->cfg) : NULL;
  if (!*gpt) return fail("creating the model");
  *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = r->lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f});
  if (!*opt) return fail("creating AdamW");
  const size_t np = apex_model_num_params(*m);
  apex_tensor **pv = malloc(np * sizeof *pv), **gv = malloc(np * sizeof *gv);
  if (!pv || !gv) {
    free(pv);
    free(gv);
    fprintf(stderr, "gpt2_loss_dump: out of memory\n");
    return 1;
  }
  int rc = 0;
  for (int decay = 1; decay >= 0 && !rc; decay--) {
    int n = 0;
    for (size_t i = 0; i < np; i++) {
      apex_var *p = apex_model_param(*m, i, NULL);
      if ((apex_tensor_ndim(apex_var_value(p)) >= 2) == decay) pv[n] = apex_var_value(p), gv[n++] = apex_var_grad(p);
    }
    apex_optim_options o = {.lr = r->lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = decay ? r->wd : 0};
    if (n > 0 && apex_optimizer_add_group(*opt, pv, n, gv, n, &o, NULL) != APEX_OK) rc = fail("AdamW's groups");
  }
  free(pv);
  free(gv);
  apex_amp_config ac = {.opt_level = r->dt == APEX_BF16 ? "O2" : "O0", .half_type = APEX_AMP_CAST_BF16};
  if (!rc && apex_amp_initialize(m, 1, opt, 1, &ac, amp) != APEX_OK) rc = fail("amp");
  return rc;
}

/* Every parameter as f32 on the host (amp's master where it keeps one: the value PyTorch's f32 parameter
 * must start from), with the run in the metadata, into DIR/init.safetensors. */
static int write_init(const run *r, const apex_model *m, const apex_amp *amp, const char *dir) {
  const size_t n = apex_model_num_params(m);
  const char **np = calloc(n, sizeof *np);
  apex_tensor **host = calloc(n, sizeof *host);
  int rc = !np || !host;
  if (rc) fprintf(stderr, "gpt2_loss_dump: out of memory\n");
  for (size_t i = 0; !rc && i < n; i++) {
    const apex_var *p = apex_model_param(m, i, &np[i]);
    const apex_tensor *master = apex_amp_master_of(amp, p), *v = master ? master : apex_var_value(p);
    host[i] = apex_tensor_create(APEX_F32, apex_tensor_ndim(v), apex_tensor_shape(v));
    if (!host[i] || apex_tensor_copy(host[i], v) != APEX_OK) rc = fail(np[i]);
  }
  char val[15][32], path[4096];
  const apex_gpt_options *c = &r->cfg;
  snprintf(val[0], sizeof val[0], "%lld", (long long)c->vocab);
  snprintf(val[1], sizeof val[1], "%lld", (long long)c->n_positions);
  snprintf(val[2], sizeof val[2], "%lld", (long long)c->n_layer);
  snprintf(val[3], sizeof val[3], "%lld", (long long)c->n_embd);
  snprintf(val[4], sizeof val[4], "%lld", (long long)c->n_head);
  snprintf(val[5], sizeof val[5], "%d", r->B);
  snprintf(val[6], sizeof val[6], "%d", r->T);
  snprintf(val[7], sizeof val[7], "%d", r->steps);
  snprintf(val[8], sizeof val[8], "%.9g", (double)r->lr);
  snprintf(val[9], sizeof val[9], "%.9g", (double)r->wd);
  snprintf(val[10], sizeof val[10], "%.9g", 0.9);
  snprintf(val[11], sizeof val[11], "%.9g", 0.95);
  snprintf(val[12], sizeof val[12], "%.9g", 1e-8);
  snprintf(val[13], sizeof val[13], "%s", r->dt == APEX_BF16 ? "bf16" : "f32");
  snprintf(val[14], sizeof val[14], "%s", r->device == APEX_DEVICE_CUDA ? "cuda" : "cpu");
  const char *keys[15] = {"vocab", "max_t", "n_layer", "n_embd", "n_head", "batch", "seq", "steps",
                          "lr", "weight_decay", "beta1", "beta2", "eps", "dtype", "device"};
  const char *vals[15];
  for (int k = 0; k < 15; k++) vals[k] = val[k];
  snprintf(path, sizeof path, "%s/init.safetensors", dir);
  if (!rc && apex_safetensors_save(path, np, host, (int)n, keys, vals, 15) != APEX_OK) rc = fail(path);
  for (size_t i = 0; host && i < n; i++) apex_tensor_destroy(host[i]);
  free(host);
  free(np);
  return rc;
}

/* tokens then targets, BT int64 each, into DIR/batch.i64 (this machine's byte order: x86 and ARM are little-endian). */
static int write_batch(const char *dir, const int64_t *tokens, const int64_t *targets, size_t bt) {
  char path[4096];
  snprintf(path, sizeof path, "%s/batch.i64", dir);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(tokens, sizeof *tokens, bt, f) == bt && fwrite(targets, sizeof *targets, bt, f) == bt;
  if (f && fclose(f) != 0) ok = 0;
  if (!ok) fprintf(stderr, "gpt2_loss_dump: cannot write %s: %s\n", path, strerror(errno));
  return !ok;
}

/* One training step through the library; *loss gets its forward's mean loss. */
static apex_status train_step(apex_module *gpt, apex_amp *amp, apex_optimizer *opt, apex_graph *g, const run *r,
                              const int64_t *tokens, const int64_t *targets, apex_tensor *host_loss, float *loss) {
  apex_var *l = apex_gpt_loss(gpt, g, tokens, targets, r->B, r->T);
  apex_status st = l ? apex_tensor_copy(host_loss, apex_var_value(l)) : apex_last_status();
  if (st == APEX_OK) *loss = *(const float *)apex_tensor_data(host_loss);
  if (st == APEX_OK) st = apex_amp_backward(amp, l, 0, NULL);
  apex_graph_reset(g);
  if (st == APEX_OK) st = apex_amp_step(amp, opt, NULL);
  if (st == APEX_OK) st = apex_amp_zero_grad(amp);
  return st;
}

int main(int argc, char **argv) {
  const char *out = NULL;
  int tiny = 0;
  run r = {.steps = 13, .B = -1, .T = -1, .lr = 3e-4f, .wd = 0.1f, .dt = APEX_BF16, .device = APEX_DEVICE_CUDA};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) r.steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) r.B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && i + 1 < argc) r.T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tiny")) tiny = 1;
    else if (!strcmp(argv[i], "--f32")) r.dt = APEX_F32;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cpu")) r.device = APEX_DEVICE_CPU, i++;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cuda")) r.device = APEX_DEVICE_CUDA, i++;
    else {
      fprintf(stderr, "usage: gpt2_loss_dump --out DIR [--steps N] [--batch B] [--seq T] [--tiny] [--f32] [--device cuda|cpu]\n");
      return 2;
    }
  }
  r.cfg = tiny ? (apex_gpt_options){.vocab = 96, .n_layer = 2, .n_embd = 64, .n_head = 4, .n_positions = 24} /* peer_gpt2.py --tiny */
               : (apex_gpt_options){.vocab = 50304, .n_layer = 12, .n_embd = 768, .n_head = 12, .n_positions = 1024};
  if (r.B < 0) r.B = tiny ? 2 : 8;
  if (r.T < 0) r.T = tiny ? 16 : 1024;
  if (!out || r.steps < 1 || r.B < 1 || r.T < 1 || r.T > r.cfg.n_positions) {
    fprintf(stderr, "gpt2_loss_dump: --out DIR is required; --steps >= 1, --batch >= 1, --seq in [1, %lld]\n",
            (long long)r.cfg.n_positions);
    return 2;
  }
  const char *why;
  if (r.device == APEX_DEVICE_CUDA && !apex_cuda_available(&why)) {
    printf("gpt2_loss_dump skipped: %s\n", why);
    return 77;
  }
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "gpt2_loss_dump: cannot make %s: %s\n", out, strerror(errno));
    return 1;
  }
  apex_model *m = NULL;
  apex_module *gpt = NULL;
  apex_optimizer *opt = NULL;
  apex_amp *amp = NULL;
  apex_graph *g = NULL;
  apex_tensor *host_loss = apex_tensor_create(APEX_F32, 1, (int64_t[]){1});
  const size_t bt = (size_t)r.B * (size_t)r.T;
  int64_t *tokens = calloc(bt, sizeof *tokens), *targets = calloc(bt, sizeof *targets);
  float *loss = calloc((size_t)r.steps, sizeof *loss);
  int rc = 0;
  if (!host_loss || !tokens || !targets || !loss || bench_gpt2_batch(tokens, targets, bt, (int)r.cfg.vocab)) {
    fprintf(stderr, "gpt2_loss_dump: out of memory\n");
    rc = 1;
  }
  if (!rc) rc = build(&r, &m, &gpt, &opt, &amp);
  if (!rc && (!(g = apex_graph_create_on(r.device)) || apex_amp_prepare_graph(amp, g) != APEX_OK)) rc = fail("the graph");
  if (!rc) rc = write_init(&r, m, amp, out) || write_batch(out, tokens, targets, bt);
  for (int s = 0; !rc && s < r.steps; s++)
    if (train_step(gpt, amp, opt, g, &r, tokens, targets, host_loss, &loss[s]) != APEX_OK) rc = fail("training step");
  if (!rc) {
    char path[4096];
    snprintf(path, sizeof path, "%s/apex_losses.txt", out);
    FILE *f = fopen(path, "w");
    for (int s = 0; f && s < r.steps; s++) fprintf(f, "%.9g\n", (double)loss[s]);
    if (!f || fclose(f) != 0) {
      fprintf(stderr, "gpt2_loss_dump: cannot write %s: %s\n", path, strerror(errno));
      rc = 1;
    }
  }
  if (!rc) {
    printf("# gpt2_loss_dump: apex_gpt_create + apex_gpt_loss + amp %s + AdamW, %lld layers, %lld wide, %lld heads, "
           "vocabulary %lld, B=%d T=%d, on the %s, lr %g wd %g, %d steps, files in %s\n# apex loss by step:",
           r.dt == APEX_BF16 ? "O2 bf16 (f32 masters)" : "O0 (f32)", (long long)r.cfg.n_layer, (long long)r.cfg.n_embd,
           (long long)r.cfg.n_head, (long long)r.cfg.vocab, r.B, r.T, r.device == APEX_DEVICE_CUDA ? "GPU" : "CPU",
           (double)r.lr, (double)r.wd, r.steps, out);
    for (int s = 0; s < r.steps; s++) printf(" %.4f", (double)loss[s]);
    printf("\n");
  }
  free(loss);
  free(tokens);
  free(targets);
  apex_tensor_destroy(host_loss);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  return rc;
}
