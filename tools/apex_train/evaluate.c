/* evaluate.c: test accuracy (sharded over the ranks) and text generation, after training. */
#include "evaluate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double evaluate(train_model *tm, apex_amp *amp, apex_graph *g, const dataset *d, dist *ds) {
  const int64_t flat[1] = {784}, img[3] = {1, 28, 28};
  int ndim = tm->kind == MODEL_MLP ? 1 : 3;
  size_t n = (size_t)apex_idx_dim(d->img[1], 0), correct = 0;
  int failed = 0;
  apex_model_train(tm->m, 0);
  int prev = apex_graph_set_grad_enabled(g, 0);
  for (size_t s = 500 * (size_t)ds->rank; s < n; s += 500 * (size_t)ds->world) {
    size_t cnt = n - s < 500 ? n - s : 500;
    apex_tensor *tx = apex_idx_to_f32(d->img[1], s, cnt, ndim, ndim == 1 ? flat : img, 0.5f, 0.5f);
    int64_t tl[500];
    apex_idx_labels(d->lab[1], s, cnt, tl);
    apex_var *logits = tx ? model_forward_images(tm, amp, g, apex_graph_input(g, tx, 0)) : NULL;
    if (!logits) {
      apex_tensor_destroy(tx);
      failed = 1; /* still joins the sum below, so that the other ranks do not wait */
      break;
    }
    apex_tensor *lt = apex_var_value(logits);
    for (size_t i = 0; i < cnt; i++) {
      int best = 0;
      for (int c = 1; c < 10; c++)
        if (apex_tensor_get(lt, i * 10 + (size_t)c) > apex_tensor_get(lt, i * 10 + (size_t)best)) best = c;
      correct += best == tl[i];
    }
    apex_graph_reset(g);
    apex_tensor_destroy(tx);
  }
  apex_graph_set_grad_enabled(g, prev);
  apex_model_train(tm->m, 1);
  double sum[2] = {(double)correct, failed};
  if (dist_sum(ds, sum, 2) != 0 || sum[1] > 0) return -1;
  return sum[0] / (double)n;
}

int generate(train_model *tm, apex_graph *g, uint64_t seed, long n, FILE *out) {
  const char *prompt = "The ";
  int64_t T = tm->seq_len, len = 0;
  size_t cap = strlen(prompt) + (size_t)n;
  int64_t *buf = malloc(cap * sizeof *buf);
  if (!buf) return -1;
  for (const char *c = prompt; *c; c++) buf[len++] = (uint8_t)*c;
  apex_rng rng = apex_rng_init(seed ^ 0x5A3D1E5ull);
  apex_model_train(tm->m, 0);
  int prev = apex_graph_set_grad_enabled(g, 0);
  fputs(prompt, out);
  for (long k = 0; k < n; k++) {
    int64_t w = len < T ? len : T;
    apex_var *logits = model_forward_text(tm, g, buf + len - w, 1, w);
    if (!logits) {
      free(buf);
      return -1;
    }
    apex_tensor *lt = apex_var_value(logits);
    double p[256], mx = -INFINITY, sum = 0;
    for (int v = 0; v < 256; v++) {
      p[v] = apex_tensor_get(lt, (size_t)(w - 1) * 256 + (size_t)v) / 0.8;
      if (p[v] > mx) mx = p[v];
    }
    for (int v = 0; v < 256; v++) sum += p[v] = exp(p[v] - mx);
    float u;
    apex_rng_uniform(&rng, &u, 1);
    double r = u * sum;
    int pick = 255;
    for (int v = 0; v < 256; v++) {
      r -= p[v];
      if (r < 0) {
        pick = v;
        break;
      }
    }
    buf[len++] = pick;
    fputc(pick == '\n' || pick == '\t' || (pick >= 32 && pick < 127) ? pick : '?', out);
    apex_graph_reset(g);
  }
  fputc('\n', out);
  apex_graph_set_grad_enabled(g, prev);
  apex_model_train(tm->m, 1);
  free(buf);
  return 0;
}
