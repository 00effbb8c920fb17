/* test_models.c: the ready-made models of apex/models.h (apex-train's MLP, CNN and GPT).
 *  - every parameter's name and shape against the closed form of the header, in creation order;
 *  - the GPT's and the MLP's logits against a plain C forward written here from the parameters
 *    (embeddings, layer norm, causal attention, tanh GELU, tied head), in double;
 *  - a save (apex_model_save_f32) loaded into a model of another seed gives the same logits, bitwise;
 *  - a checkpoint written by apex-train itself ($APEX_TRAIN, set by tests/test_models.cmake) loads
 *    into apex_gpt_create's model by name and shape, and its logits give the validation loss that
 *    apex-train printed for it (skipped with the reason without apex-train);
 *  - bad options and bad forwards: one clear message each. */
#define _DEFAULT_SOURCE /* mkstemp, mkdtemp, M_PI */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

/* ---- closed-form names ------------------------------------------------------------------------- */

typedef struct {
  char name[64];
  int ndim;
  int64_t shape[4];
} want_param;

static void want(want_param *w, int *n, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  snprintf(w[*n].name, sizeof w[*n].name, "%s", name);
  w[*n].ndim = ndim;
  int64_t d[4] = {d0, d1, d2, d3};
  memcpy(w[*n].shape, d, sizeof d);
  (*n)++;
}

static void check_params(const apex_model *m, const want_param *w, int n) {
  assert_int_equal(apex_model_num_params(m), (size_t)n);
  for (int i = 0; i < n; i++) {
    const char *name;
    const apex_tensor *t = apex_var_value(apex_model_param(m, (size_t)i, &name));
    if (strcmp(name, w[i].name)) fail_msg("parameter %d is '%s', expected '%s'", i, name, w[i].name);
    assert_int_equal(apex_tensor_ndim(t), w[i].ndim);
    for (int d = 0; d < w[i].ndim; d++)
      if (apex_tensor_dim(t, d) != w[i].shape[d])
        fail_msg("%s: dim %d is %lld, expected %lld", name, d, (long long)apex_tensor_dim(t, d), (long long)w[i].shape[d]);
  }
}

static void gpt_names(want_param *w, int *n, int64_t V, int64_t L, int64_t C, int64_t P) {
  want(w, n, "wte.weight", 2, V, C, 0, 0);
  want(w, n, "wpe.weight", 2, P, C, 0, 0);
  for (int64_t l = 0; l < L; l++) {
    char b[64];
#define W2(local, a, c) (snprintf(b, sizeof b, "h%lld.%s", (long long)l, local), want(w, n, b, 2, a, c, 0, 0))
#define W1(local, a) (snprintf(b, sizeof b, "h%lld.%s", (long long)l, local), want(w, n, b, 1, a, 0, 0, 0))
    W1("ln1.weight", C), W1("ln1.bias", C);
    W2("attn.q.weight", C, C), W1("attn.q.bias", C), W2("attn.k.weight", C, C), W1("attn.k.bias", C);
    W2("attn.v.weight", C, C), W1("attn.v.bias", C), W2("attn.proj.weight", C, C), W1("attn.proj.bias", C);
    W1("ln2.weight", C), W1("ln2.bias", C);
    W2("fc.weight", 4 * C, C), W1("fc.bias", 4 * C), W2("proj.weight", C, 4 * C), W1("proj.bias", C);
#undef W2
#undef W1
  }
  want(w, n, "ln_f.weight", 1, C, 0, 0, 0);
  want(w, n, "ln_f.bias", 1, C, 0, 0, 0);
}

static void test_names_and_shapes(void **state) {
  (void)state;
  want_param w[128];
  int n = 0;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
  assert_non_null(apex_mlp_create(m, NULL));
  want(w, &n, "0.weight", 2, 512, 784, 0, 0), want(w, &n, "0.bias", 1, 512, 0, 0, 0);
  want(w, &n, "2.weight", 2, 256, 512, 0, 0), want(w, &n, "2.bias", 1, 256, 0, 0, 0);
  want(w, &n, "4.weight", 2, 10, 256, 0, 0), want(w, &n, "4.bias", 1, 10, 0, 0, 0);
  check_params(m, w, n);
  apex_model_destroy(m);

  n = 0;
  m = apex_model_create(&(apex_model_options){.seed = 1});
  assert_non_null(apex_cnn_create(m, &(apex_cnn_options){.in_h = 30, .in_w = 17, .classes = 7}));
  want(w, &n, "0.weight", 4, 32, 1, 3, 3), want(w, &n, "0.bias", 1, 32, 0, 0, 0);
  want(w, &n, "1.weight", 1, 32, 0, 0, 0), want(w, &n, "1.bias", 1, 32, 0, 0, 0);
  want(w, &n, "4.weight", 4, 64, 32, 3, 3), want(w, &n, "4.bias", 1, 64, 0, 0, 0);
  want(w, &n, "5.weight", 1, 64, 0, 0, 0), want(w, &n, "5.bias", 1, 64, 0, 0, 0);
  want(w, &n, "9.weight", 2, 128, 64 * (30 / 4) * (17 / 4), 0, 0), want(w, &n, "9.bias", 1, 128, 0, 0, 0);
  want(w, &n, "11.weight", 2, 7, 128, 0, 0), want(w, &n, "11.bias", 1, 7, 0, 0, 0);
  check_params(m, w, n);
  const char *bufs[4] = {"1.running_mean", "1.running_var", "5.running_mean", "5.running_var"};
  assert_int_equal(apex_model_num_buffers(m), 4);
  for (int i = 0; i < 4; i++) {
    const char *name;
    apex_model_buffer(m, (size_t)i, &name);
    assert_string_equal(name, bufs[i]);
  }
  apex_model_destroy(m);

  n = 0;
  m = apex_model_create(&(apex_model_options){.seed = 1});
  apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.vocab = 50, .n_layer = 3, .n_embd = 24, .n_head = 3, .n_positions = 20});
  assert_non_null(gpt);
  gpt_names(w, &n, 50, 3, 24, 20);
  check_params(m, w, n);
  apex_gpt_options s;
  TU_OK(apex_gpt_sizes(gpt, &s));
  assert_true(s.vocab == 50 && s.n_layer == 3 && s.n_embd == 24 && s.n_head == 3 && s.n_positions == 20);
  apex_model_destroy(m);

  /* The defaults: 256 tokens, 2 layers, width 64, 4 heads, 64 positions. */
  n = 0;
  m = apex_model_create(NULL);
  gpt = apex_gpt_create(m, NULL);
  gpt_names(w, &n, 256, 2, 64, 64);
  check_params(m, w, n);
  TU_OK(apex_gpt_sizes(gpt, &s));
  assert_int_equal(s.n_head, 4);
  apex_model_destroy(m);
}

/* GPT-2's embedding scale: N(0, 0.02), so the sample standard deviation of 50 x 64 values is near it. */
static void test_gpt_init_scale(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 3});
  assert_non_null(apex_gpt_create(m, &(apex_gpt_options){.vocab = 50}));
  const float *d = apex_tensor_data(apex_var_value(apex_model_find_param(m, "wte.weight")));
  double s2 = 0;
  for (int i = 0; i < 50 * 64; i++) s2 += (double)d[i] * d[i];
  double sd = sqrt(s2 / (50 * 64));
  assert_true(sd > 0.018 && sd < 0.022);
  const float *lw = apex_tensor_data(apex_var_value(apex_model_find_param(m, "h1.ln2.weight")));
  assert_true(lw[0] == 1.0f && lw[63] == 1.0f);
  apex_model_destroy(m);
}

/* ---- plain C forwards ---------------------------------------------------------------------------- */

static const float *P(const apex_model *m, const char *fmt, long l) {
  char name[64];
  snprintf(name, sizeof name, fmt, l);
  apex_var *v = apex_model_find_param(m, name);
  if (!v) fail_msg("no parameter %s", name);
  return apex_tensor_data(apex_var_value(v));
}

static void ref_layer_norm(const double *x, double *y, const float *w, const float *b, int64_t C) {
  double mu = 0, var = 0;
  for (int64_t c = 0; c < C; c++) mu += x[c];
  mu /= (double)C;
  for (int64_t c = 0; c < C; c++) var += (x[c] - mu) * (x[c] - mu);
  var /= (double)C;
  for (int64_t c = 0; c < C; c++) y[c] = (x[c] - mu) / sqrt(var + 1e-5) * w[c] + b[c];
}

/* y[out] = x[in] W^T + b with W [out, in] (nn.Linear). */
static void ref_linear(const double *x, double *y, const float *W, const float *b, int64_t in, int64_t out) {
  for (int64_t o = 0; o < out; o++) {
    double s = b[o];
    for (int64_t i = 0; i < in; i++) s += x[i] * W[o * in + i];
    y[o] = s;
  }
}

/* Logits [T, V] of one sequence, by GPT-2's definition. */
static void ref_gpt(const apex_model *m, const int64_t *ids, int64_t T, int64_t V, int64_t L, int64_t C, int64_t H, double *logits) {
  double *x = calloc((size_t)(T * C), sizeof *x), *h = calloc((size_t)(T * C), sizeof *h), *q = calloc((size_t)(T * C), sizeof *q),
         *k = calloc((size_t)(T * C), sizeof *k), *v = calloc((size_t)(T * C), sizeof *v), *a = calloc((size_t)(T * C), sizeof *a),
         *f = calloc((size_t)(4 * C), sizeof *f), *o = calloc((size_t)C, sizeof *o), *att = calloc((size_t)T, sizeof *att);
  const float *wte = P(m, "wte.weight", 0), *wpe = P(m, "wpe.weight", 0);
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < C; c++) x[t * C + c] = (double)wte[ids[t] * C + c] + wpe[t * C + c];
  int64_t D = C / H;
  for (long l = 0; l < L; l++) {
    for (int64_t t = 0; t < T; t++) {
      ref_layer_norm(x + t * C, h + t * C, P(m, "h%ld.ln1.weight", l), P(m, "h%ld.ln1.bias", l), C);
      ref_linear(h + t * C, q + t * C, P(m, "h%ld.attn.q.weight", l), P(m, "h%ld.attn.q.bias", l), C, C);
      ref_linear(h + t * C, k + t * C, P(m, "h%ld.attn.k.weight", l), P(m, "h%ld.attn.k.bias", l), C, C);
      ref_linear(h + t * C, v + t * C, P(m, "h%ld.attn.v.weight", l), P(m, "h%ld.attn.v.bias", l), C, C);
    }
    for (int64_t hd = 0; hd < H; hd++)
      for (int64_t t = 0; t < T; t++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s <= t; s++) {
          double d = 0;
          for (int64_t e = 0; e < D; e++) d += q[t * C + hd * D + e] * k[s * C + hd * D + e];
          att[s] = d / sqrt((double)D);
          if (att[s] > mx) mx = att[s];
        }
        for (int64_t s = 0; s <= t; s++) sum += (att[s] = exp(att[s] - mx));
        for (int64_t e = 0; e < D; e++) {
          double y = 0;
          for (int64_t s = 0; s <= t; s++) y += att[s] / sum * v[s * C + hd * D + e];
          a[t * C + hd * D + e] = y;
        }
      }
    for (int64_t t = 0; t < T; t++) {
      ref_linear(a + t * C, o, P(m, "h%ld.attn.proj.weight", l), P(m, "h%ld.attn.proj.bias", l), C, C);
      for (int64_t c = 0; c < C; c++) x[t * C + c] += o[c];
      ref_layer_norm(x + t * C, h + t * C, P(m, "h%ld.ln2.weight", l), P(m, "h%ld.ln2.bias", l), C);
      ref_linear(h + t * C, f, P(m, "h%ld.fc.weight", l), P(m, "h%ld.fc.bias", l), C, 4 * C);
      for (int64_t c = 0; c < 4 * C; c++) f[c] = 0.5 * f[c] * (1 + tanh(sqrt(2 / M_PI) * (f[c] + 0.044715 * f[c] * f[c] * f[c])));
      ref_linear(f, o, P(m, "h%ld.proj.weight", l), P(m, "h%ld.proj.bias", l), 4 * C, C);
      for (int64_t c = 0; c < C; c++) x[t * C + c] += o[c];
    }
  }
  for (int64_t t = 0; t < T; t++) {
    ref_layer_norm(x + t * C, h + t * C, P(m, "ln_f.weight", 0), P(m, "ln_f.bias", 0), C);
    for (int64_t u = 0; u < V; u++) {
      double s = 0;
      for (int64_t c = 0; c < C; c++) s += h[t * C + c] * wte[u * C + c];
      logits[t * V + u] = s;
    }
  }
  free(x), free(h), free(q), free(k), free(v), free(a), free(f), free(o), free(att);
}

/* Logits of apex_gpt_forward into out [B * T * V]. */
static void run_gpt(apex_module *gpt, const int64_t *ids, int64_t B, int64_t T, float *out) {
  apex_graph *g = apex_graph_create();
  apex_var *y = apex_gpt_forward(gpt, g, ids, B, T);
  if (!y) fail_msg("apex_gpt_forward: %s", apex_last_error());
  const apex_tensor *t = apex_var_value(y);
  assert_int_equal(apex_tensor_dtype(t), APEX_F32);
  assert_int_equal(apex_tensor_ndim(t), 2);
  memcpy(out, apex_tensor_data(t), apex_tensor_numel(t) * sizeof *out);
  apex_graph_destroy(g);
}

/* apex's logits against the plain forward, each sequence of the batch on its own. */
static void check_against_ref(const apex_model *m, const float *logits, const int64_t *ids, int64_t B, int64_t T, int64_t V, int64_t L,
                              int64_t C, int64_t H) {
  double *ref = malloc((size_t)(T * V) * sizeof *ref), worst = 0;
  for (int64_t b = 0; b < B; b++) {
    ref_gpt(m, ids + b * T, T, V, L, C, H, ref);
    for (int64_t i = 0; i < T * V; i++) {
      double d = fabs(logits[b * T * V + i] - ref[i]) / fmax(fabs(ref[i]), 1.0);
      if (d > worst) worst = d;
    }
  }
  free(ref);
  printf("gpt logits against the plain C forward: max rel diff %.2e (bound 1e-4)\n", worst);
  assert_true(worst < 1e-4);
}

static void test_gpt_forward(void **state) {
  (void)state;
  const int64_t V = 40, L = 2, C = 16, H = 4, B = 2, T = 7;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 11});
  apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.vocab = V, .n_layer = L, .n_embd = C, .n_head = H, .n_positions = 8});
  assert_non_null(gpt);
  /* Random norms and biases too, so that a mixed-up name or layout cannot hide behind ones and zeros. */
  for (size_t i = 0; i < apex_model_num_params(m); i++) {
    apex_tensor *t = apex_var_value(apex_model_param(m, i, NULL));
    float *d = apex_tensor_data(t);
    apex_tensor *r = tu_random_tensor(APEX_F32, apex_tensor_numel(t), 100 + i, 0.5f);
    const float *rd = apex_tensor_data(r);
    for (size_t j = 0; j < apex_tensor_numel(t); j++) d[j] = apex_tensor_ndim(t) == 1 ? 1.0f + rd[j] * 0.5f : rd[j];
    apex_tensor_destroy(r);
  }
  int64_t ids[B * T];
  for (int i = 0; i < B * T; i++) ids[i] = (i * 7 + 3) % V;
  float *logits = malloc((size_t)(B * T * V) * sizeof *logits);
  run_gpt(gpt, ids, B, T, logits);
  check_against_ref(m, logits, ids, B, T, V, L, C, H);

  /* Saved and loaded into a model of another seed: the same logits, bitwise. */
  char path[] = "/tmp/apex_test_models_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  TU_OK(apex_model_save_f32(m, NULL, path));
  apex_model *m2 = apex_model_create(&(apex_model_options){.seed = 12});
  apex_module *gpt2 = apex_gpt_create(m2, &(apex_gpt_options){.vocab = V, .n_layer = L, .n_embd = C, .n_head = H, .n_positions = 8});
  float *other = malloc((size_t)(B * T * V) * sizeof *other);
  run_gpt(gpt2, ids, B, T, other);
  assert_true(memcmp(other, logits, (size_t)(B * T * V) * sizeof *other) != 0);
  TU_OK(apex_model_load_f32(m2, NULL, path));
  run_gpt(gpt2, ids, B, T, other);
  assert_memory_equal(other, logits, (size_t)(B * T * V) * sizeof *other);
  /* A model of other sizes refuses the file, naming the tensor. */
  apex_model *m3 = apex_model_create(NULL);
  apex_gpt_create(m3, &(apex_gpt_options){.vocab = V, .n_layer = L, .n_embd = C, .n_head = H, .n_positions = 9});
  TU_FAILS(apex_model_load_f32(m3, NULL, path), APEX_ERR_SHAPE, "wpe.weight");
  unlink(path);
  free(other);
  free(logits);
  apex_model_destroy(m3);
  apex_model_destroy(m2);
  apex_model_destroy(m);
}

static void test_mlp_cnn_forward(void **state) {
  (void)state;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 5});
  apex_module *mlp = apex_mlp_create(m, &(apex_mlp_options){.in_features = 12, .hidden = 8, .classes = 3});
  assert_non_null(mlp);
  apex_graph *g = apex_graph_create();
  apex_tensor *x = tu_random_tensor(APEX_F32, 2 * 12, 9, 1.0f);
  apex_tensor *x2 = apex_tensor_view(x, 2, (int64_t[]){2, 12});
  apex_var *y = apex_module_forward(mlp, g, apex_graph_input(g, x2, 0));
  assert_non_null(y);
  assert_int_equal(apex_tensor_dim(apex_var_value(y), 1), 3);
  const float *xd = apex_tensor_data(x2), *yd = apex_tensor_data(apex_var_value(y));
  for (int n = 0; n < 2; n++) {
    double in[12], h1[8], h2[4], out[3];
    for (int i = 0; i < 12; i++) in[i] = xd[n * 12 + i];
    ref_linear(in, h1, P(m, "0.weight", 0), P(m, "0.bias", 0), 12, 8);
    for (int i = 0; i < 8; i++) h1[i] = h1[i] > 0 ? h1[i] : 0;
    ref_linear(h1, h2, P(m, "2.weight", 0), P(m, "2.bias", 0), 8, 4);
    for (int i = 0; i < 4; i++) h2[i] = h2[i] > 0 ? h2[i] : 0;
    ref_linear(h2, out, P(m, "4.weight", 0), P(m, "4.bias", 0), 4, 3);
    for (int c = 0; c < 3; c++) assert_true(fabs(yd[n * 3 + c] - out[c]) < 1e-5 * fmax(1, fabs(out[c])));
  }
  apex_graph_destroy(g);
  apex_tensor_destroy(x2);
  apex_tensor_destroy(x);
  apex_model_destroy(m);

  m = apex_model_create(&(apex_model_options){.seed = 5});
  apex_module *cnn = apex_cnn_create(m, &(apex_cnn_options){.in_h = 9, .in_w = 8, .classes = 4});
  assert_non_null(cnn);
  g = apex_graph_create();
  x = tu_random_tensor(APEX_F32, 3 * 9 * 8, 2, 1.0f);
  x2 = apex_tensor_view(x, 4, (int64_t[]){3, 1, 9, 8});
  y = apex_module_forward(cnn, g, apex_graph_input(g, x2, 0));
  if (!y) fail_msg("cnn forward: %s", apex_last_error());
  assert_int_equal(apex_tensor_dim(apex_var_value(y), 0), 3);
  assert_int_equal(apex_tensor_dim(apex_var_value(y), 1), 4);
  apex_graph_destroy(g);
  apex_tensor_destroy(x2);
  apex_tensor_destroy(x);
  apex_model_destroy(m);
}

/* apex-train's own checkpoint (a GPT trained 3 steps) loads into the library's model by name and shape. */
static void test_apex_train_checkpoint(void **state) {
  (void)state;
  const char *bin = getenv("APEX_TRAIN");
  if (!bin || access(bin, X_OK) != 0) {
    printf("skipped: APEX_TRAIN does not name the apex-train binary (tests/test_models.cmake sets it)\n");
    return;
  }
  char dir[] = "/tmp/apex_test_models_ck_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char text[600], cmd[2048];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  FILE *f = fopen(text, "w");
  assert_non_null(f);
  for (int i = 0; i < 400; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog. ", i);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "'%s' --model gpt --data '%s' --steps 3 --batch-size 2 --seq-len 16 --n-layer 2 --n-embd 32 --n-head 4 --threads 1 "
           "--checkpoint '%s/ck' > '%s/out.txt' 2>&1",
           bin, text, dir, dir);
  if (system(cmd) != 0) fail_msg("%s failed (see %s/out.txt)", cmd, dir);
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 99});
  apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.n_layer = 2, .n_embd = 32, .n_head = 4, .n_positions = 16});
  snprintf(cmd, sizeof cmd, "%s/ck/step-3/model.safetensors", dir);
  TU_OK(apex_model_load_f32(m, NULL, cmd));
  /* The loaded weights are the file's (wte checked element by element), and they run. */
  apex_safetensors *st = apex_safetensors_open(cmd);
  apex_tensor *wte = apex_safetensors_get(st, "wte.weight");
  assert_memory_equal(apex_tensor_data(wte), P(m, "wte.weight", 0), 256 * 32 * sizeof(float));
  apex_tensor_destroy(wte);
  apex_safetensors_close(st);
  int64_t ids[16 * 16];
  for (int i = 0; i < 16; i++) ids[i] = "the quick brown "[i];
  float *logits = malloc(16 * 16 * 256 * sizeof *logits);
  run_gpt(gpt, ids, 1, 16, logits);
  check_against_ref(m, logits, ids, 1, 16, 256, 2, 32, 4);

  /* apex-train's own validation loss of these weights (its last line of numbers), recomputed here from
   * the library's logits over the same held-out windows: the last tenth of the bytes, windows of 16. */
  snprintf(cmd, sizeof cmd, "%s/out.txt", dir);
  FILE *o = fopen(cmd, "r");
  assert_non_null(o);
  char line[512];
  double cli_loss = -1;
  while (fgets(line, sizeof line, o)) {
    const char *at = strstr(line, "validation loss ");
    if (at) cli_loss = atof(at + strlen("validation loss "));
  }
  fclose(o);
  assert_true(cli_loss > 0);
  f = fopen(text, "rb");
  unsigned char *bytes = malloc(1 << 16);
  size_t len = fread(bytes, 1, 1 << 16, f);
  fclose(f);
  const size_t T = 16;
  size_t val = len / 10 > T + 1 ? len / 10 : T + 1, train = len - val, windows = (val - 1) / T;
  if (windows > 256) windows = 256;
  double sum = 0;
  for (size_t w0 = 0; w0 < windows; w0 += 16) {
    size_t B = windows - w0 < 16 ? windows - w0 : 16;
    for (size_t b = 0; b < B; b++)
      for (size_t t = 0; t < T; t++) ids[b * T + t] = bytes[train + (w0 + b) * T + t];
    run_gpt(gpt, ids, (int64_t)B, (int64_t)T, logits);
    for (size_t r = 0; r < B * T; r++) {
      const float *row = logits + r * 256;
      double mx = -INFINITY, se = 0;
      for (int v = 0; v < 256; v++) mx = fmax(mx, row[v]);
      for (int v = 0; v < 256; v++) se += exp(row[v] - mx);
      size_t b = r / T, t = r % T;
      sum += log(se) + mx - row[bytes[train + (w0 + b) * T + t + 1]];
    }
  }
  double lib_loss = sum / (double)(windows * T);
  printf("apex-train's validation loss %.4f; the library's model on its checkpoint %.6f\n", cli_loss, lib_loss);
  assert_true(fabs(lib_loss - cli_loss) <= 1e-4);
  free(bytes);
  free(logits);
  apex_model_destroy(m);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_bad_options(void **state) {
  (void)state;
  apex_model *m = apex_model_create(NULL);
  TU_FAILS(apex_gpt_create(m, &(apex_gpt_options){.n_embd = 30, .n_head = 4}) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG,
           "n_embd 30 is not a multiple of n_head 4");
  TU_FAILS(apex_gpt_create(m, &(apex_gpt_options){.vocab = -1}) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "vocab -1");
  TU_FAILS(apex_gpt_create(NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "NULL model");
  TU_FAILS(apex_mlp_create(m, &(apex_mlp_options){.hidden = 1}) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "hidden >= 2");
  TU_FAILS(apex_mlp_create(m, &(apex_mlp_options){.classes = -3}) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "classes -3");
  TU_FAILS(apex_cnn_create(m, &(apex_cnn_options){.in_h = 3}) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "at least 4 x 4");
  TU_FAILS(apex_cnn_create(NULL, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "NULL model");
  apex_model_destroy(m);

  m = apex_model_create(NULL);
  apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.vocab = 10, .n_embd = 8, .n_head = 2, .n_positions = 4});
  assert_non_null(gpt);
  /* a second GPT in the same model would reuse its names */
  TU_FAILS(apex_gpt_create(m, NULL) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "already has a module named 'wte'");
  apex_graph *g = apex_graph_create();
  int64_t ids[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  TU_FAILS(apex_gpt_forward(gpt, g, ids, 1, 5) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "T <= 4 (n_positions");
  TU_FAILS(apex_gpt_forward(gpt, g, ids, 0, 2) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "B >= 1");
  TU_FAILS(apex_gpt_forward(gpt, g, NULL, 1, 2) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "NULL ids");
  int64_t bad[2] = {3, 10};
  TU_FAILS(apex_gpt_forward(gpt, g, bad, 1, 2) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "id 10");
  apex_module *lin = apex_linear_create(m, "lin", 2, 2, 1);
  TU_FAILS(apex_gpt_forward(lin, g, ids, 1, 2) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "not a GPT");
  apex_gpt_options s;
  TU_FAILS(apex_gpt_sizes(lin, &s), APEX_ERR_INVALID_ARG, "not a GPT");
  apex_tensor *xt = tu_random_tensor(APEX_F32, 8, 1, 1.0f);
  apex_var *x = apex_graph_input(g, xt, 0);
  TU_FAILS(apex_module_forward(gpt, g, x) ? APEX_OK : apex_last_status(), APEX_ERR_INVALID_ARG, "use apex_gpt_forward");
  apex_graph_destroy(g);
  apex_tensor_destroy(xt);
  apex_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_and_shapes),      cmocka_unit_test(test_gpt_init_scale), cmocka_unit_test(test_gpt_forward),
      cmocka_unit_test(test_mlp_cnn_forward),       cmocka_unit_test(test_apex_train_checkpoint),
      cmocka_unit_test(test_bad_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
