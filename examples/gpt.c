/* gpt.c: a byte-level GPT (token and position embeddings, causal attention blocks, layer norm,
 * output tied to the token embedding) trained on a text file with amp, then sampled.
 *
 *     ./gpt [steps] [FILE] [O0|O1|O2|O3]    (defaults 300, /usr/share/common-licenses/GPL-3, O1)
 *
 * The default text is the GNU GPL v3, which Debian's base-files installs on every system. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <apex/apex.h>

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    if ((call) != APEX_OK) {                                                                               \
      fprintf(stderr, "%s: %s\n", #call, apex_last_error());                                             \
      return 1;                                                                                            \
    }                                                                                                      \
  } while (0)

enum { B = 16, T = 64, D = 64, LAYERS = 2, HEADS = 4, V = 256 };

static apex_module *wte, *wpe, *ln_f, *blocks[LAYERS];

/* logits [n * t, V] in f32 of ids [n, t]. */
static apex_var *forward(apex_graph *g, const int64_t *ids, int64_t n, int64_t t) {
  int64_t shape[2] = {n, t}, pos[T];
  for (int64_t i = 0; i < t; i++) pos[i] = i;
  apex_var *h = apex_add(g, apex_embedding_forward(wte, g, ids, 2, shape), apex_embedding_forward(wpe, g, pos, 1, &t));
  for (int l = 0; l < LAYERS; l++) h = apex_module_forward(blocks[l], g, h);
  h = apex_module_forward(ln_f, g, h);
  /* Tied output: h @ wte^T as a linear whose weight is wte [V, D], read in place (no transposed copy);
   * wte gets both gradients, the embedding's and the head's. */
  apex_var *logits = apex_linear(g, h, apex_module_param(wte, "weight"), NULL);
  logits = apex_reshape(g, logits, 2, (int64_t[]){n * t, V});
  return logits && apex_tensor_dtype(apex_var_value(logits)) != APEX_F32 ? apex_cast(g, logits, APEX_F32) : logits;
}

int main(int argc, char **argv) {
  long steps = argc > 1 ? atol(argv[1]) : 300;
  const char *path = argc > 2 ? argv[2] : "/usr/share/common-licenses/GPL-3";
  const char *level = argc > 3 ? argv[3] : "O1";
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    fprintf(stderr, "gpt: cannot open %s\n", path);
    return 1;
  }
  static uint8_t text[1 << 22];
  size_t len = fread(text, 1, sizeof text, fp);
  fclose(fp);
  if (len < T + 2) {
    fprintf(stderr, "gpt: %s is too short\n", path);
    return 1;
  }

  apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
  wte = apex_embedding_create(m, "wte", V, D);
  wpe = apex_embedding_create(m, "wpe", T, D);
  for (int l = 0; l < LAYERS; l++) {
    char name[8];
    snprintf(name, sizeof name, "h%d", l);
    blocks[l] = apex_transformer_block_create(m, name, D, HEADS);
  }
  ln_f = apex_layer_norm_create(m, "ln_f", D, 0);
  if (!ln_f) {
    fprintf(stderr, "model: %s\n", apex_last_error());
    return 1;
  }
  for (int k = 0; k < 2; k++) { /* GPT-2's N(0, 0.02) embeddings */
    apex_tensor *w = apex_var_value(apex_module_param(k ? wpe : wte, "weight"));
    for (size_t i = 0; i < apex_tensor_numel(w); i++) apex_tensor_set(w, i, 0.02f * apex_tensor_get(w, i));
  }
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 3e-3f, .weight_decay = 0.01f});
  CHECK(apex_optimizer_add_model(opt, m, NULL, NULL));
  apex_amp *amp;
  CHECK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = level}, &amp));
  apex_graph *g = apex_graph_create();
  /* The forward takes token ids (apex_embedding_forward), not apex_amp_forward, so amp prepares the
   * graph here: without it O1 would run in f32, and apex_amp_backward refuses such a graph's loss. */
  CHECK(apex_amp_prepare_graph(amp, g));

  apex_rng rng = apex_rng_init(5);
  int64_t ids[B * T], targets[B * T];
  for (long s = 0; s < steps; s++) {
    float u[B];
    apex_rng_uniform(&rng, u, B);
    for (int b = 0; b < B; b++) { /* B random windows of the text */
      size_t start = (size_t)(u[b] * (float)(len - T - 1));
      for (int t = 0; t < T; t++) {
        ids[b * T + t] = text[start + (size_t)t];
        targets[b * T + t] = text[start + (size_t)t + 1];
      }
    }
    apex_optimizer_set_lr(opt, 0, 3e-3f * (1.0f - 0.9f * (float)s / (float)steps));
    apex_var *loss = apex_cross_entropy(g, forward(g, ids, B, T), targets, NULL);
    if (!loss) {
      fprintf(stderr, "forward: %s\n", apex_last_error());
      return 1;
    }
    float l = apex_var_item(loss);
    CHECK(apex_amp_backward(amp, loss, 0, NULL));
    CHECK(apex_amp_step(amp, opt, NULL));
    CHECK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    if (s % 50 == 0 || s == steps - 1) printf("step %4ld  loss %.4f  (uniform: %.4f)\n", s, l, log(256.0));
  }

  /* Sample 200 bytes at temperature 0.8. */
  apex_model_train(m, 0);
  apex_graph_set_grad_enabled(g, 0);
  int64_t ctx[T + 200];
  const char *prompt = "The ";
  int64_t n = 0;
  for (const char *c = prompt; *c; c++) ctx[n++] = (uint8_t)*c;
  printf("%s", prompt);
  for (int k = 0; k < 200; k++) {
    int64_t w = n < T ? n : T;
    apex_tensor *lt = apex_var_value(forward(g, ctx + n - w, 1, w));
    double p[V], mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++) {
      p[v] = apex_tensor_get(lt, (size_t)(w - 1) * V + (size_t)v) / 0.8;
      mx = p[v] > mx ? p[v] : mx;
    }
    for (int v = 0; v < V; v++) sum += p[v] = exp(p[v] - mx);
    float u;
    apex_rng_uniform(&rng, &u, 1);
    double r = u * sum;
    int pick = V - 1;
    for (int v = 0; v < V && r >= 0; v++) {
      r -= p[v];
      if (r < 0) pick = v;
    }
    ctx[n++] = pick;
    putchar(pick == '\n' || (pick >= 32 && pick < 127) ? pick : '?');
    apex_graph_reset(g);
  }
  putchar('\n');
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  return 0;
}
