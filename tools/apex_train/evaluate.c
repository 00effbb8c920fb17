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

/* Text: the sum of losses over this rank's groups of held-out windows. */
static int eval_text(train_model *tm, apex_graph *g, const dataset *d, dist *ds, double *sum) {
  const int64_t T = d->seq_len, G = 16;
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

int generate(train_model *tm, apex_graph *g, uint64_t seed, long n, int bytes, FILE *out) {
  const char *prompt = bytes ? "The " : "";
  int64_t T = tm->seq_len, len = 0, V = tm->vocab;
  size_t cap = strlen(prompt) + (size_t)n + 1;
  int64_t *buf = malloc(cap * sizeof *buf);
  double *p = malloc((size_t)V * sizeof *p);
  if (!buf || !p) {
    free(buf);
    free(p);
    return -1;
  }
  for (const char *c = prompt; *c; c++) buf[len++] = (uint8_t)*c;
  if (!bytes) buf[len++] = 0;
  apex_rng rng = apex_rng_init(seed ^ 0x5A3D1E5ull);
  apex_model_train(tm->m, 0);
  int prev = apex_graph_set_grad_enabled(g, 0), rc = 0;
  fputs(bytes ? prompt : "0", out);
  for (long k = 0; k < n; k++) {
    int64_t w = len < T ? len : T;
    apex_var *logits = model_forward_text(tm, g, buf + len - w, 1, w);
    int owned = 0;
    apex_tensor *lt = logits ? device_to_host(apex_var_value(logits), &owned) : NULL;
    if (!lt) {
      rc = -1;
      break;
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++) {
      p[v] = apex_tensor_get(lt, (size_t)((w - 1) * V + v)) / 0.8;
      if (p[v] > mx) mx = p[v];
    }
    if (owned) apex_tensor_destroy(lt);
    for (int64_t v = 0; v < V; v++) sum += p[v] = exp(p[v] - mx);
    float u;
    apex_rng_uniform(&rng, &u, 1);
    double r = u * sum;
    int64_t pick = V - 1;
    for (int64_t v = 0; v < V; v++) {
      r -= p[v];
      if (r < 0) {
        pick = v;
        break;
      }
    }
    buf[len++] = pick;
    if (bytes) fputc(pick == '\n' || pick == '\t' || (pick >= 32 && pick < 127) ? (int)pick : '?', out);
    else fprintf(out, " %lld", (long long)pick);
    apex_graph_reset(g);
  }
  if (rc == 0) fputc('\n', out);
  apex_graph_reset(g);
  apex_graph_set_grad_enabled(g, prev);
  apex_model_train(tm->m, 1);
  free(buf);
  free(p);
  return rc;
}
