/* gpt2_loss_dump.c: apex's half of the GPT-2 loss-parity check (bench/gpt2_loss_parity.py is the other).
 * It writes what PyTorch needs to start from exactly where apex starts, then trains and writes apex's losses:
 *
 *   DIR/init.safetensors  every parameter of gpt2_cuda_create's model as f32, named as gpt2_cuda_tensor_name
 *                         ("wte", "h.0.qkv_w", ...) in gpt2_cuda.h's PyTorch layouts (a linear's weight [out, in],
 *                         qkv_w [3C, C] with rows q|k|v, no lm_head: it is wte). A bf16 model's values are the bf16
 *                         values it trains from, widened (exactly) to f32, so PyTorch's f32 parameters start at the
 *                         same numbers. The metadata holds the run: vocab, max_t, n_layer, n_embd, n_head, batch,
 *                         seq, steps, lr, weight_decay, beta1, beta2, eps, dtype (bf16 or f32), device.
 *   DIR/batch.i64         the batch: B * T token ids, then B * T targets, int64 little-endian, row-major [B, T].
 *   DIR/apex_losses.txt   one line a step: the mean loss of that step's forward (before its update).
 *
 * The run is bench_gpt2_cuda's: GPT-2 small (or --tiny: peer_gpt2.py's 2 layers, 64 wide, 4 heads, vocabulary 96,
 * B = 2, T = 16), seed 1234 for the weights, the same fixed batch (apex's RNG seeded 42: a uniform token stream over
 * the real vocabulary, each target the next token), AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
 * the 2-D weights, no clipping, the eager step (gpt2_cuda_train_step), 13 steps by default.
 *
 * Options: --out DIR (required; made if absent), --steps N (13), --batch B, --seq T, --tiny, --f32 (f32 parameters
 * instead of bf16 with f32 masters), --device cuda|cpu (cuda; cpu runs gpt2_cuda_create_on's CPU model, to check
 * the files and the comparison where there is no GPU). Exit status 0, 77 (with the reason) when the device is
 * not there, 1 on a failure, 2 on bad arguments. */
#define _DEFAULT_SOURCE /* mkdir's mode bits under -std=c11 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "apex/safetensors.h"
#include "bench_util.h"
#include "gpt2_cuda.h"

static int fail(const char *what) {
  fprintf(stderr, "gpt2_loss_dump: %s: %s\n", what, apex_last_error());
  return 1;
}

/* Every parameter as f32 on the host, with the run in the metadata, into DIR/init.safetensors. */
static int write_init(const gpt2_cuda *m, const char *dir, int steps, float lr, float wd) {
  const int n = m->n_tensors;
  char(*names)[64] = calloc((size_t)n, sizeof *names);
  const char **np = calloc((size_t)n, sizeof *np);
  apex_tensor **host = calloc((size_t)n, sizeof *host);
  int rc = !names || !np || !host;
  if (rc) fprintf(stderr, "gpt2_loss_dump: out of memory\n");
  for (int i = 0; !rc && i < n; i++) {
    const apex_tensor *p = m->param_list[i];
    np[i] = gpt2_cuda_tensor_name(m, i, names[i], sizeof names[i]);
    host[i] = apex_tensor_create(APEX_F32, apex_tensor_ndim(p), apex_tensor_shape(p));
    /* a bf16 parameter converts exactly: its f32 value is the one the model computes with */
    if (!host[i] || apex_tensor_copy(host[i], p) != APEX_OK) rc = fail(np[i]);
  }
  char val[15][32], path[4096];
  const gpt2_config *c = &m->cfg;
  snprintf(val[0], sizeof val[0], "%d", c->vocab);
  snprintf(val[1], sizeof val[1], "%d", c->max_t);
  snprintf(val[2], sizeof val[2], "%d", c->n_layer);
  snprintf(val[3], sizeof val[3], "%d", c->n_embd);
  snprintf(val[4], sizeof val[4], "%d", c->n_head);
  snprintf(val[5], sizeof val[5], "%d", m->B);
  snprintf(val[6], sizeof val[6], "%d", m->T);
  snprintf(val[7], sizeof val[7], "%d", steps);
  snprintf(val[8], sizeof val[8], "%.9g", (double)lr);
  snprintf(val[9], sizeof val[9], "%.9g", (double)wd);
  snprintf(val[10], sizeof val[10], "%.9g", 0.9);
  snprintf(val[11], sizeof val[11], "%.9g", 0.95);
  snprintf(val[12], sizeof val[12], "%.9g", 1e-8);
  snprintf(val[13], sizeof val[13], "%s", m->dtype == APEX_BF16 ? "bf16" : "f32");
  snprintf(val[14], sizeof val[14], "%s", m->device == APEX_DEVICE_CUDA ? "cuda" : "cpu");
  const char *keys[15] = {"vocab", "max_t", "n_layer", "n_embd", "n_head", "batch", "seq", "steps",
                          "lr", "weight_decay", "beta1", "beta2", "eps", "dtype", "device"};
  const char *vals[15];
  for (int k = 0; k < 15; k++) vals[k] = val[k];
  snprintf(path, sizeof path, "%s/init.safetensors", dir);
  if (!rc && apex_safetensors_save(path, np, host, n, keys, vals, 15) != APEX_OK) rc = fail(path);
  for (int i = 0; host && i < n; i++) apex_tensor_destroy(host[i]);
  free(host);
  free(np);
  free(names);
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

int main(int argc, char **argv) {
  const char *out = NULL;
  int steps = 13, B = -1, T = -1, tiny = 0;
  apex_dtype dt = APEX_BF16;
  apex_device device = APEX_DEVICE_CUDA;
  const float lr = 3e-4f, wd = 0.1f; /* bench_gpt2_cuda's */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tiny")) tiny = 1;
    else if (!strcmp(argv[i], "--f32")) dt = APEX_F32;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cpu")) device = APEX_DEVICE_CPU, i++;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cuda")) device = APEX_DEVICE_CUDA, i++;
    else {
      fprintf(stderr, "usage: gpt2_loss_dump --out DIR [--steps N] [--batch B] [--seq T] [--tiny] [--f32] [--device cuda|cpu]\n");
      return 2;
    }
  }
  gpt2_config cfg = gpt2_config_small();
  if (tiny) cfg = (gpt2_config){.vocab = 96, .max_t = 24, .n_layer = 2, .n_embd = 64, .n_head = 4}; /* peer_gpt2.py --tiny */
  if (B < 0) B = tiny ? 2 : 8;
  if (T < 0) T = tiny ? 16 : 1024;
  if (!out || steps < 1 || B < 1 || T < 1 || T > cfg.max_t) {
    fprintf(stderr, "gpt2_loss_dump: --out DIR is required; --steps >= 1, --batch >= 1, --seq in [1, %d]\n", cfg.max_t);
    return 2;
  }
  const char *why;
  if (device == APEX_DEVICE_CUDA && !apex_cuda_available(&why)) {
    printf("gpt2_loss_dump skipped: %s\n", why);
    return 77;
  }
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "gpt2_loss_dump: cannot make %s: %s\n", out, strerror(errno));
    return 1;
  }
  gpt2_cuda *m = gpt2_cuda_create_on(device, &cfg, dt, B, T, 1234);
  if (!m) return fail("creating the model");
  apex_optimizer *opt = gpt2_cuda_optimizer_create(m, lr, wd);
  const size_t bt = (size_t)B * (size_t)T;
  int64_t *tokens = calloc(bt, sizeof *tokens), *targets = calloc(bt, sizeof *targets);
  float *loss = calloc((size_t)steps, sizeof *loss);
  int rc = !opt ? fail("creating AdamW") : 0;
  if (!rc && (!tokens || !targets || !loss || bench_gpt2_batch(tokens, targets, bt, cfg.vocab))) {
    fprintf(stderr, "gpt2_loss_dump: out of memory\n");
    rc = 1;
  }
  if (!rc) rc = write_init(m, out, steps, lr, wd) || write_batch(out, tokens, targets, bt);
  for (int s = 0; !rc && s < steps; s++) {
    if (gpt2_cuda_train_step(m, opt, tokens, targets) != APEX_OK) rc = fail("training step");
    else if (gpt2_cuda_loss(m, &loss[s]) != APEX_OK) rc = fail("reading the loss");
  }
  if (!rc) {
    char path[4096];
    snprintf(path, sizeof path, "%s/apex_losses.txt", out);
    FILE *f = fopen(path, "w");
    for (int s = 0; f && s < steps; s++) fprintf(f, "%.9g\n", (double)loss[s]);
    if (!f || fclose(f) != 0) {
      fprintf(stderr, "gpt2_loss_dump: cannot write %s: %s\n", path, strerror(errno));
      rc = 1;
    }
  }
  if (!rc) {
    printf("# gpt2_loss_dump: %d layers, %d wide, %d heads, vocabulary %d, B=%d T=%d, %s on the %s, AdamW lr %g wd %g, "
           "%d steps, files in %s\n# apex loss by step:",
           cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab, B, T,
           dt == APEX_BF16 ? "bf16 parameters with f32 masters" : "f32", device == APEX_DEVICE_CUDA ? "GPU" : "CPU",
           (double)lr, (double)wd, steps, out);
    for (int s = 0; s < steps; s++) printf(" %.4f", (double)loss[s]);
    printf("\n");
  }
  free(loss);
  free(tokens);
  free(targets);
  apex_optimizer_destroy(opt);
  gpt2_cuda_destroy(m);
  return rc;
}
