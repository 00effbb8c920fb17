/* generate.c: apex_gpt_generate (models.h), incremental decoding with a key/value cache.
 *
 * apex_gpt_forward recomputes every position; a generator needs only the next token's logits, and
 * the keys and values of earlier positions do not change. So the prompt runs once (a prefill, the
 * block computed as apex_gpt_forward's, keys and values kept per layer), and each new token runs
 * one row through the linears, attends with its query over the cached keys and values, and makes
 * one row of logits. Everything is an op on the caller's graph, so it runs on whatever device the
 * model is on and follows the graph's autocast; the one thing this file adds is the attention of
 * one query over the cache (the fused causal attention op takes equal-length q, k and v), done per
 * head as scores = q K^T (a linear with the cache as its weight), softmax, p V, in f32 as the fused
 * op accumulates, rounded to the k/v dtype as its result is. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "apex/models.h"
#include "autograd/ag.h"
#include "backend/backend.h" /* apex__device_name */
#include "core/internal.h"
#include "nn/nn_internal.h"

typedef struct gen_state {
  apex_module *gpt;
  apex_graph *g;
  int64_t B, V, L, C, H, D, P;
  apex_tensor **kc, **vc; /* per layer [B, H, P, D], made at the first prefill in k's dtype */
  int64_t n;              /* positions held in the cache */
  int64_t *pos;           /* [P] scratch: the new rows' positions */
  apex_tensor *host;      /* [B, V] f32 on the host: the logits read back */
} gen_state;

/* A graph input viewing n elements of t from offset, shaped [rows, cols]. */
static apex_var *slice_input(apex_graph *g, apex_tensor *t, size_t offset, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  apex_tensor *v = apex_tensor_slice_view(t, offset, 2, shape);
  apex_var *r = v ? apex_graph_input(g, v, 0) : NULL;
  apex_tensor_destroy(v); /* the input holds its own view of the storage */
  return r;
}

/* Appends the n new rows of k (or v) [B, n, C] to cache [B, H, P, D] at position s->n. */
static apex_status cache_put(gen_state *s, apex_tensor *cache, apex_var *kv, int64_t n) {
  apex_graph *g = s->g;
  apex_var *split = kv;
  if (n > 1) { /* [B, n, H, D] -> [B, H, n, D]: each head's rows contiguous, one copy per head */
    int64_t shape[4] = {s->B, n, s->H, s->D};
    static const int perm[4] = {0, 2, 1, 3};
    split = apex_permute(g, apex_reshape(g, kv, 4, shape), perm);
    if (!split) return apex_last_status();
  }
  apex_tensor *src = apex_var_value(split);
  int64_t shape[2] = {n, s->D};
  apex_status st = APEX_OK;
  for (int64_t bh = 0; st == APEX_OK && bh < s->B * s->H; bh++) {
    apex_tensor *from = apex_tensor_slice_view(src, (size_t)(bh * n * s->D), 2, shape);
    apex_tensor *to = apex_tensor_slice_view(cache, (size_t)((bh * s->P + s->n) * s->D), 2, shape);
    st = from && to ? apex_tensor_copy(to, from) : apex_last_status();
    apex_tensor_destroy(from);
    apex_tensor_destroy(to);
  }
  if (split != kv) apex_var_release(split);
  return st;
}

/* One query row per sequence, q [B, 1, C], against the cache's first len positions of layer l:
 * [B, 1, C] in the cache's dtype. Autocast is off inside (the scores stay f32, as in the fused op). */
static apex_var *cached_attention(gen_state *s, int64_t l, apex_var *q, int64_t len) {
  apex_graph *g = s->g;
  int ac = g->autocast;
  apex_dtype ac_dtype = g->autocast_dtype, kd = apex_tensor_dtype(s->kc[l]);
  g->autocast = 0;
  apex_tensor *qt = apex_var_value(q);
  float scale = 1.0f / sqrtf((float)s->D);
  size_t nh = (size_t)(s->B * s->H);
  apex_var **heads = malloc(nh * sizeof *heads), *y = NULL;
  int ok = heads != NULL;
  for (int64_t bh = 0; ok && bh < s->B * s->H; bh++) {
    int64_t b = bh / s->H, h = bh % s->H;
    apex_var *qh = slice_input(g, qt, (size_t)(b * s->C + h * s->D), 1, s->D);
    if (qh && apex_tensor_dtype(apex_var_value(qh)) != APEX_F32) qh = apex_cast(g, qh, APEX_F32);
    apex_var *K = slice_input(g, s->kc[l], (size_t)(bh * s->P * s->D), len, s->D);
    apex_var *Vv = slice_input(g, s->vc[l], (size_t)(bh * s->P * s->D), len, s->D);
    apex_var *sc = qh && K ? apex_linear(g, qh, K, NULL) : NULL; /* [1, len] = q K^T, f32 */
    sc = sc ? apex__nn_drop(apex_scale(g, sc, scale), sc) : NULL;
    apex_var *p = sc ? apex__nn_drop(apex_softmax(g, sc, -1), sc) : NULL;
    heads[bh] = p && Vv ? apex__nn_drop(apex_matmul(g, p, Vv), p) : NULL; /* [1, D], f32 */
    ok = heads[bh] != NULL;
  }
  if (ok) y = apex_concat(g, (int)nh, heads, -1); /* [1, B * C]: rows b, heads side by side */
  for (size_t i = 0; heads && i < nh && heads[i]; i++) apex_var_release(heads[i]);
  free(heads);
  int64_t shape[3] = {s->B, 1, s->C};
  if (y) y = apex_reshape(g, y, 3, shape);
  if (y && kd != APEX_F32) y = apex_cast(g, y, kd);
  g->autocast = ac;
  g->autocast_dtype = ac_dtype;
  return y;
}

/* A block (modules.c's block_forward) on the n new rows x [B, n, C]: the prefill (s->n == 0) runs
 * the causal attention op on them, as apex_gpt_forward does; a step (n == 1) attends over the cache. */
static apex_var *block_step(gen_state *s, int64_t l, apex_var *x, int64_t n) {
  apex_graph *g = s->g;
  apex_module **c = s->gpt->children[2 + l]->children, **a = c[1]->children;
  apex_var *h = apex_module_forward(c[0], g, x);
  apex_var *q = h ? apex_module_forward(a[0], g, h) : NULL;
  apex_var *k = q ? apex_module_forward(a[1], g, h) : NULL;
  apex_var *v = k ? apex_module_forward(a[2], g, h) : NULL;
  if (h) apex_var_release(h);
  if (!v) return NULL;
  if (!s->kc[l]) {
    int64_t shape[4] = {s->B, s->H, s->P, s->D};
    apex_dtype dt = apex_tensor_dtype(apex_var_value(k));
    apex_device dev = apex_graph_device(g);
    s->kc[l] = apex_tensor_create_on(dev, dt, 4, shape);
    s->vc[l] = s->kc[l] ? apex_tensor_create_on(dev, dt, 4, shape) : NULL;
    if (!s->vc[l]) return NULL;
  }
  if (cache_put(s, s->kc[l], k, n) != APEX_OK || cache_put(s, s->vc[l], v, n) != APEX_OK) return NULL;
  apex_var *y = s->n == 0 ? apex_causal_attention_heads(g, q, k, v, s->H) : cached_attention(s, l, q, s->n + 1);
  apex_var_release(q);
  apex_var_release(k);
  apex_var_release(v);
  if (!y) return NULL;
  apex_var *at = apex__nn_drop(apex_module_forward(a[3], g, y), y);
  apex_var *x1 = at ? apex__nn_drop(apex_add(g, x, at), at) : NULL;
  h = x1 ? apex_module_forward(c[2], g, x1) : NULL;
  apex_var *f = h ? apex__nn_drop(apex_module_forward(c[3], g, h), h) : NULL;
  h = f ? apex__nn_drop(apex_gelu_tanh(g, f), f) : NULL;
  apex_var *p = h ? apex__nn_drop(apex_module_forward(c[4], g, h), h) : NULL;
  return p ? apex__nn_drop(apex__nn_drop(apex_add(g, x1, p), p), x1) : NULL;
}

/* Runs ids [B, n] at positions s->n .. s->n + n - 1 (a prefill when the cache is empty, else one
 * token), appends their keys and values, and leaves the last position's logits in s->host [B, V]. */
static apex_status step(gen_state *s, const int64_t *ids, int64_t n) {
  apex_graph *g = s->g;
  apex_module **c = s->gpt->children;
  int64_t shape[2] = {s->B, n};
  for (int64_t t = 0; t < n; t++) s->pos[t] = s->n + t;
  apex_var *tok = apex_embedding_forward(c[0], g, ids, 2, shape);
  apex_var *p = tok ? apex_embedding_forward(c[1], g, s->pos, 1, &n) : NULL;
  apex_var *x = p ? apex_add(g, tok, p) : NULL;
  if (x) {
    apex_var_release(tok);
    apex_var_release(p);
  }
  for (int64_t l = 0; x && l < s->L; l++) x = apex__nn_drop(block_step(s, l, x, n), x);
  if (!x) return apex_last_status();
  /* Only the last position's row goes on: the final norm is per row, the head one row a sequence. */
  apex_var *last;
  if (n == 1) {
    int64_t flat[2] = {s->B, s->C};
    last = apex_reshape(g, x, 2, flat);
  } else {
    apex_var *rows[64], **r = s->B <= 64 ? rows : malloc((size_t)s->B * sizeof *r);
    if (!r) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_generate: out of memory");
    int ok = 1;
    for (int64_t b = 0; ok && b < s->B; b++) ok = (r[b] = slice_input(g, apex_var_value(x), (size_t)((b * n + n - 1) * s->C), 1, s->C)) != NULL;
    last = ok ? apex_concat(g, (int)s->B, r, 0) : NULL;
    if (r != rows) free(r);
  }
  apex_var *h = last ? apex_module_forward(c[2 + s->L], g, last) : NULL;
  apex_var *logits = h ? apex_linear(g, h, c[0]->p[0], NULL) : NULL; /* [B, V], the tied head */
  apex_status st = logits ? apex_tensor_copy(s->host, apex_var_value(logits)) : apex_last_status();
  s->n += n;
  apex_graph_reset(g);
  return st;
}

typedef struct ranked {
  float v;
  int64_t id;
} ranked;

static int by_logit(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The next token of one row of logits l [V]; p [V] and rk [V] scratch. */
static apex_status pick(const float *l, int64_t V, const apex_gpt_generate_options *o, apex_rng *rng, double *p, ranked *rk,
                        int64_t *out) {
  int64_t best = 0;
  for (int64_t v = 0; v < V; v++) {
    if (l[v] != l[v]) return apex__fail(APEX_ERR_NONFINITE, "apex_gpt_generate: logit %lld is NaN (has the model diverged?)", (long long)v);
    if (l[v] > l[best]) best = v;
  }
  if (o->temperature == 0.0f) {
    *out = best;
    return APEX_OK;
  }
  /* Kept tokens: all, or the top_k by (logit, lower id); p[v] < 0 marks one left out. */
  if (o->top_k > 0 && o->top_k < V) {
    for (int64_t v = 0; v < V; v++) rk[v] = (ranked){l[v], v};
    qsort(rk, (size_t)V, sizeof *rk, by_logit);
    for (int64_t v = 0; v < V; v++) p[v] = -1;
    for (int64_t i = 0; i < o->top_k; i++) p[rk[i].id] = 0;
  } else {
    for (int64_t v = 0; v < V; v++) p[v] = 0;
  }
  double sum = 0, mx = l[best], t = o->temperature;
  int64_t last = best;
  for (int64_t v = 0; v < V; v++)
    if (p[v] >= 0) {
      sum += p[v] = exp(((double)l[v] - mx) / t);
      last = v;
    }
  float u;
  apex_rng_uniform(rng, &u, 1);
  double r = u * sum;
  for (int64_t v = 0; v < V; v++)
    if (p[v] >= 0 && (r -= p[v]) < 0) {
      *out = v;
      return APEX_OK;
    }
  *out = last; /* u * sum rounded up to the sum */
  return APEX_OK;
}

static void state_free(gen_state *s) {
  for (int64_t l = 0; l < s->L; l++) {
    if (s->kc) apex_tensor_destroy(s->kc[l]);
    if (s->vc) apex_tensor_destroy(s->vc[l]);
  }
  free(s->kc);
  free(s->vc);
  free(s->pos);
  apex_tensor_destroy(s->host);
}

/* Generation proper, the arguments checked: seq [B, cap] holds each row's tokens so far. */
static apex_status run(gen_state *s, int64_t *seq, int64_t cap, int64_t len, int64_t n_new, int64_t *out, const apex_gpt_generate_options *o) {
  int64_t B = s->B, V = s->V, P = s->P;
  double *p = malloc((size_t)V * sizeof *p);
  ranked *rk = o->top_k > 0 ? malloc((size_t)V * sizeof *rk) : NULL;
  int64_t *ids = malloc((size_t)(B * P) * sizeof *ids), *next = malloc((size_t)B * sizeof *next);
  apex_status st = p && ids && next && (rk || o->top_k <= 0) ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_generate: out of memory");
  apex_rng rng = apex_rng_init(o->seed);
  int64_t start = len > P ? len - P : 0; /* the window's first token */
  int need_prefill = 1;
  for (int64_t i = 0; st == APEX_OK && i < n_new; i++) {
    if (need_prefill) {
      int64_t n = len - start;
      for (int64_t b = 0; b < B; b++) memcpy(ids + b * n, seq + b * cap + start, (size_t)n * sizeof *ids);
      s->n = 0;
      st = step(s, ids, n);
      need_prefill = 0;
    } else {
      for (int64_t b = 0; b < B; b++) ids[b] = seq[b * cap + len - 1];
      st = step(s, ids, 1);
    }
    const float *lg = st == APEX_OK ? apex_tensor_data(s->host) : NULL;
    for (int64_t b = 0; st == APEX_OK && b < B; b++) st = pick(lg + b * V, V, o, &rng, p, rk, &next[b]);
    if (st != APEX_OK) break;
    for (int64_t b = 0; b < B; b++) seq[b * cap + len] = out[b * n_new + i] = next[b];
    len++;
    if (o->on_token) o->on_token(o->ctx, i, next, B);
    if (len - start > P) { /* the new token has no position left: restart from the window's last half */
      start = len - (P + 1) / 2;
      need_prefill = 1;
    }
  }
  free(p);
  free(rk);
  free(ids);
  free(next);
  return st;
}

apex_status apex_gpt_generate(apex_module *gpt, apex_graph *g, const int64_t *prompt, int64_t B, int64_t T, int64_t n_new, int64_t *out,
                              const apex_gpt_generate_options *opts) {
  apex_gpt_generate_options o = opts ? *opts : (apex_gpt_generate_options){0};
  if (!gpt || gpt->kind != NN_GPT)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_generate: %s", !gpt ? "NULL module (did apex_gpt_create fail?)" : "not a GPT (apex_gpt_create makes one)");
  if (!g || !prompt || (!out && n_new > 0))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_generate: NULL %s", !g ? "graph" : !prompt ? "prompt" : "out");
  if (B < 1 || T < 1 || n_new < 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_generate: B %lld, T %lld, n_new %lld: give B >= 1, T >= 1 (the prompt's length) and n_new >= 0",
                      (long long)B, (long long)T, (long long)n_new);
  if (!(o.temperature >= 0.0f) || isinf(o.temperature))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_generate: temperature %g: give 0 (greedy) or a finite value > 0", (double)o.temperature);
  if (o.top_k < 0) return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_generate: top_k %lld: give 0 (the whole vocabulary) or k >= 1", (long long)o.top_k);
  apex_gpt_options sz;
  apex_gpt_sizes(gpt, &sz);
  for (int64_t i = 0; i < B * T; i++)
    if (prompt[i] < 0 || prompt[i] >= sz.vocab)
      return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_generate: prompt id %lld at row %lld, position %lld is outside [0, %lld) (the vocabulary)",
                        (long long)prompt[i], (long long)(i / T), (long long)(i % T), (long long)sz.vocab);
  if (apex_graph_device(g) != gpt->model->device)
    return apex__fail(APEX_ERR_DEVICE, "apex_gpt_generate: the graph runs on %s, the model's parameters live on %s: make the graph with apex_graph_create_on(the model's device)",
                      apex__device_name(apex_graph_device(g)), apex__device_name(gpt->model->device));
  if (n_new == 0) return APEX_OK;
  gen_state s = {.gpt = gpt, .g = g, .B = B, .V = sz.vocab, .L = sz.n_layer, .C = sz.n_embd, .H = sz.n_head, .P = sz.n_positions};
  s.D = s.C / s.H;
  int64_t vshape[2] = {B, s.V}, cap = T + n_new;
  s.kc = calloc((size_t)s.L + 1, sizeof *s.kc);
  s.vc = calloc((size_t)s.L + 1, sizeof *s.vc);
  s.pos = malloc((size_t)s.P * sizeof *s.pos);
  s.host = apex_tensor_create(APEX_F32, 2, vshape);
  int64_t *seq = malloc((size_t)(B * cap) * sizeof *seq);
  apex_status st = s.kc && s.vc && s.pos && s.host && seq ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_generate: out of memory");
  int prev = apex_graph_set_grad_enabled(g, 0);
  if (st == APEX_OK) {
    for (int64_t b = 0; b < B; b++) memcpy(seq + b * cap, prompt + b * T, (size_t)T * sizeof *seq);
    st = run(&s, seq, cap, T, n_new, out, &o);
  }
  apex_graph_reset(g);
  apex_graph_set_grad_enabled(g, prev);
  free(seq);
  state_free(&s);
  return st;
}
