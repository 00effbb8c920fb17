/* evaluate.c: test and validation metrics (sharded over the ranks) and text generation (evaluate.h). */
#include "evaluate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

/* Images: (sum of losses, right answers) over this rank's chunks of images [first, first + n) of set
 * k (0: training, where the validation split is; 1: test). */
static int eval_images(train_model *tm, apex_amp *amp, apex_graph *g, const dataset *d, dist *ds, int k, size_t first, size_t n,
                       double *sum) {
  const int64_t flat[1] = {d->in_h * d->in_w}, img[3] = {1, d->in_h, d->in_w};
  int ndim = tm->kind == MODEL_MLP ? 1 : 3;
  size_t C = (size_t)tm->classes;
  for (size_t s = 500 * (size_t)ds->rank; s < n; s += 500 * (size_t)ds->world) {
    size_t cnt = n - s < 500 ? n - s : 500;
    apex_tensor *tx = apex_idx_to_f32(d->img[k], first + s, cnt, ndim, ndim == 1 ? flat : img, 0.5f, 0.5f);
    int64_t tl[500];
    apex_idx_labels(d->lab[k], first + s, cnt, tl);
    int x_owned = 0, l_owned = 0;
    apex_tensor *x = device_from_host(apex_graph_device(g), tx, &x_owned); /* the chunk goes up once */
    apex_var *logits = x ? model_forward_images(tm, amp, g, apex_graph_input(g, x, 0)) : NULL;
    apex_var *loss = logits ? apex_cross_entropy(g, logits, tl, NULL) : NULL;
    /* the logits come down in one copy for the accuracy (on the CPU: the graph's own tensor) */
    apex_tensor *lt = loss ? device_to_host(apex_var_value(logits), &l_owned) : NULL;
    if (!lt) {
      apex_graph_reset(g);
      if (x_owned) apex_tensor_destroy(x);
      apex_tensor_destroy(tx);
      return -1;
    }
    sum[0] += apex_var_item(loss) * (double)cnt;
    for (size_t i = 0; i < cnt; i++) {
      size_t best = 0;
      for (size_t c = 1; c < C; c++)
        if (apex_tensor_get(lt, i * C + c) > apex_tensor_get(lt, i * C + best)) best = c;
      sum[1] += (int64_t)best == tl[i];
    }
    if (l_owned) apex_tensor_destroy(lt);
    apex_graph_reset(g);
    if (x_owned) apex_tensor_destroy(x);
    apex_tensor_destroy(tx);
  }
  return 0;
}

/* Text: the sum of losses over this rank's groups of held-out windows. A group is at most 16
 * windows and 1024 tokens: its logits are [G * T, vocab] f32, 3.3 GB for 16 windows of 1024 GPT-2
 * tokens (the run's peak memory, above the training step's); at most 1024 tokens keep them at a
 * training step's of batch 1, and leave seq_len <= 64 (the default) grouped as before, bit for bit. */
static int eval_text(train_model *tm, apex_graph *g, const dataset *d, dist *ds, double *sum) {
  const int64_t T = d->seq_len, G = T >= 1024 ? 1 : 1024 / T < 16 ? 1024 / T : 16;
  size_t windows = (d->val_len - 1) / (size_t)T;
  if (windows > EVAL_MAX_WINDOWS) windows = EVAL_MAX_WINDOWS;
  int64_t *ids = malloc((size_t)(G * T) * sizeof *ids), *tg = malloc((size_t)(G * T) * sizeof *tg);
  int rc = ids && tg ? 0 : -1;
  for (size_t w0 = (size_t)G * (size_t)ds->rank; rc == 0 && w0 < windows; w0 += (size_t)G * (size_t)ds->world) {
    int64_t B = windows - w0 < (size_t)G ? (int64_t)(windows - w0) : G;
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < T; t++) {
        size_t at = d->len + (w0 + (size_t)b) * (size_t)T + (size_t)t;
        ids[b * T + t] = d->tok[at];
        tg[b * T + t] = d->tok[at + 1];
      }
    apex_var *loss = model_loss_text(tm, g, ids, tg, B, T);
    if (!loss) rc = -1;
    else sum[0] += apex_var_item(loss) * (double)(B * T);
    apex_graph_reset(g);
  }
  sum[1] = (double)windows * (double)T; /* the count, the same on every rank: divided out below */
  free(ids);
  free(tg);
  return rc;
}

int evaluate(train_model *tm, apex_amp *amp, apex_graph *g, const dataset *d, dist *ds, eval_split which, eval_result *out) {
  int val = which == EVAL_VALIDATION && tm->kind != MODEL_GPT;
  size_t first = val ? d->n_items : 0, n = tm->kind == MODEL_GPT ? 0 : val ? d->n_val : (size_t)apex_idx_dim(d->img[1], 0);
  apex_model_train(tm->m, 0);
  int prev = apex_graph_set_grad_enabled(g, 0);
  double sum[3] = {0, 0, 0};
  int failed = (tm->kind == MODEL_GPT ? eval_text(tm, g, d, ds, sum) : eval_images(tm, amp, g, d, ds, val ? 0 : 1, first, n, sum)) != 0;
  apex_graph_set_grad_enabled(g, prev);
  apex_model_train(tm->m, 1);
  double count = tm->kind == MODEL_GPT ? sum[1] : (double)n;
  if (tm->kind == MODEL_GPT) sum[1] = 0;
  sum[2] = failed; /* every rank joins the sum, also after its own failure, so that none waits */
  if (dist_sum(ds, sum, 3) != 0 || sum[2] > 0) return -1;
  memset(out, 0, sizeof *out);
  out->loss = sum[0] / count;
  if (tm->kind == MODEL_GPT) out->perplexity = exp(out->loss);
  else out->accuracy = sum[1] / count;
  return 0;
}

/* Prints each new token as it comes: a byte as text (unprintable ones as '?'), a token through the
 * tokenizer when there is one, else its number. */
typedef struct sample_out {
  FILE *f;
  int bytes;
  const tokenizer *tok;
} sample_out;

static void print_token(void *ctx, int64_t i, const int64_t *tokens, int64_t B) {
  (void)i;
  (void)B;
  sample_out *o = ctx;
  int64_t t = tokens[0];
  if (o->bytes) fputc(t == '\n' || t == '\t' || (t >= 32 && t < 127) ? (int)t : '?', o->f);
  else if (o->tok) tokenizer_write(o->tok, t, o->f);
  else fprintf(o->f, " %lld", (long long)t);
  fflush(o->f);
}

int generate(train_model *tm, apex_graph *g, uint64_t seed, long n, int bytes, const tokenizer *tok, FILE *out) {
  const char *text = "The ";
  int64_t prompt[8], T = 0;
  if (bytes)
    for (const char *c = text; *c; c++) prompt[T++] = (uint8_t)*c;
  else prompt[T++] = tok && tokenizer_eot(tok) >= 0 && tokenizer_eot(tok) < tm->vocab ? tokenizer_eot(tok) : 0;
  int64_t *toks = malloc((size_t)(n > 0 ? n : 1) * sizeof *toks);
  if (!toks) return -1;
  if (bytes) fputs(text, out);
  else if (tok) tokenizer_write(tok, prompt[0], out);
  else fputs("0", out);
  sample_out so = {out, bytes, tok};
  /* Temperature 0.8 over the whole vocabulary, drawn from a generator of its own (the seed apex-train
   * always used), through the library's cached generator: one token's work per new token. */
  apex_gpt_generate_options o = {.temperature = 0.8f, .seed = seed ^ 0x5A3D1E5ull, .on_token = print_token, .ctx = &so};
  int rc = apex_gpt_generate(tm->net, g, prompt, 1, T, n, toks, &o) == APEX_OK ? 0 : -1;
  if (rc == 0) fputc('\n', out);
  free(toks);
  return rc;
}
