/* test_generate.c: apex_gpt_generate (models.h), the cached generator, against the uncached forward.
 *
 * The reference is apex_gpt_forward run on the whole window for every new token (no cache), and
 * the generator's documented rules written out here: greedy is the argmax of the last row (lowest id
 * on a tie); sampling draws one apex_rng_uniform per row per step and walks the kept tokens
 * (the top_k by logit, lower id first on a tie) in id order, exp((l - max) / temperature) each; the
 * window restarts from its last (n_positions + 1) / 2 tokens when full. Cached tokens must equal the
 * reference's token for token on every device present (the CUDA case skips without a GPU), for f32
 * and bf16 models and under bf16 autocast, and be the same at 1 and 2 threads. Each bad argument
 * gets its status and message. */
#include <math.h>
#include <stdlib.h>

#include "apex/cuda.h"
#include "testutil.h"

enum { V = 61, L = 2, C = 32, H = 4, P = 16, B = 2, T = 5, N = 30 };

typedef struct setup {
  apex_model *m;
  apex_module *gpt;
  apex_graph *g;
} setup;

static setup make(apex_device dev, apex_dtype dt, uint64_t seed) {
  setup s;
  s.m = apex_model_create(&(apex_model_options){.seed = seed, .dtype = dt, .device = dev});
  assert_non_null(s.m);
  s.gpt = apex_gpt_create(s.m, &(apex_gpt_options){.vocab = V, .n_layer = L, .n_embd = C, .n_head = H, .n_positions = P});
  assert_non_null(s.gpt);
  s.g = apex_graph_create_on(dev);
  assert_non_null(s.g);
  return s;
}

static void unmake(setup *s) {
  apex_graph_destroy(s->g);
  apex_model_destroy(s->m);
}

static void prompt_of(int64_t *prompt, uint64_t seed) {
  apex_rng r = apex_rng_init(seed);
  for (int i = 0; i < B * T; i++) {
    float u;
    apex_rng_uniform(&r, &u, 1);
    prompt[i] = (int64_t)(u * V) % V;
  }
}

/* The reference: every token from apex_gpt_forward on the whole window, picked by the rules above. */
static void reference(setup *s, const int64_t *prompt, const apex_gpt_generate_options *o, int64_t *out) {
  int64_t seq[B][T + N], len = T, start = 0, ids[B * P];
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) seq[b][t] = prompt[b * T + t];
  apex_rng rng = apex_rng_init(o->seed);
  for (int i = 0; i < N; i++) {
    int64_t w = len - start;
    for (int b = 0; b < B; b++)
      for (int64_t t = 0; t < w; t++) ids[b * w + t] = seq[b][start + t];
    apex_var *y = apex_gpt_forward(s->gpt, s->g, ids, B, w);
    if (!y) fail_msg("apex_gpt_forward: %s", apex_last_error());
    apex_tensor *host = apex_tensor_create(APEX_F32, 2, (int64_t[]){B * w, V});
    TU_OK(apex_tensor_copy(host, apex_var_value(y)));
    for (int b = 0; b < B; b++) {
      const float *l = (const float *)apex_tensor_data(host) + (b * w + w - 1) * V;
      int64_t best = 0;
      for (int64_t v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
      int64_t pick = best;
      if (o->temperature > 0) {
        int keep[V];
        for (int v = 0; v < V; v++) { /* rank of v: how many beat it (higher, or equal with a lower id) */
          int rank = 0;
          for (int u = 0; u < V; u++) rank += l[u] > l[v] || (l[u] == l[v] && u < v);
          keep[v] = o->top_k == 0 || rank < o->top_k;
        }
        double p[V], sum = 0;
        for (int v = 0; v < V; v++)
          if (keep[v]) sum += p[v] = exp(((double)l[v] - l[best]) / o->temperature);
        float u;
        apex_rng_uniform(&rng, &u, 1);
        double r = u * sum;
        for (int v = 0; v < V; v++)
          if (keep[v]) {
            pick = v;
            if ((r -= p[v]) < 0) break;
          }
      }
      seq[b][len] = out[b * N + i] = pick;
    }
    apex_tensor_destroy(host);
    apex_graph_reset(s->g);
    if (++len - start > P) start = len - (P + 1) / 2;
  }
}

static int64_t calls;
static void count_tokens(void *ctx, int64_t i, const int64_t *tokens, int64_t b) {
  int64_t *last = ctx;
  assert_int_equal(i, calls);
  assert_int_equal(b, B);
  for (int r = 0; r < B; r++) last[r] = tokens[r];
  calls++;
}

/* Cached against uncached on one device, dtype and option set; autocast: bf16 autocast on the graph. */
static void check(apex_device dev, apex_dtype dt, int autocast, apex_gpt_generate_options o, const char *what) {
  setup s = make(dev, dt, 11);
  if (autocast) TU_OK(apex_graph_set_autocast(s.g, 1, APEX_BF16));
  int64_t prompt[B * T], want[B * N], got[B * N], last[B];
  prompt_of(prompt, 5);
  reference(&s, prompt, &o, want);
  calls = 0;
  o.on_token = count_tokens;
  o.ctx = last;
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, B, T, N, got, &o));
  assert_int_equal(calls, N);
  for (int b = 0; b < B; b++) assert_int_equal(last[b], got[b * N + N - 1]);
  int same = 0;
  while (same < B * N && got[same] == want[same]) same++;
  printf("%s: %d of %d tokens equal the uncached forward's (prompt %d, window %d, its restarts included)\n", what, same, B * N, T, P);
  assert_memory_equal(got, want, sizeof got);
  unmake(&s);
}

static void on_device(apex_device dev, const char *name) {
  char what[128];
  snprintf(what, sizeof what, "%s f32 greedy", name);
  check(dev, APEX_F32, 0, (apex_gpt_generate_options){0}, what);
  snprintf(what, sizeof what, "%s f32 temperature 0.8 top_k 7", name);
  check(dev, APEX_F32, 0, (apex_gpt_generate_options){.temperature = 0.8f, .top_k = 7, .seed = 3}, what);
  snprintf(what, sizeof what, "%s f32 temperature 1.3", name);
  check(dev, APEX_F32, 0, (apex_gpt_generate_options){.temperature = 1.3f, .seed = 4}, what);
  snprintf(what, sizeof what, "%s bf16 model greedy", name);
  check(dev, APEX_BF16, 0, (apex_gpt_generate_options){0}, what);
  snprintf(what, sizeof what, "%s f32 model, bf16 autocast, greedy", name);
  check(dev, APEX_F32, 1, (apex_gpt_generate_options){0}, what);
}

static void test_cpu_matches_forward(void **state) {
  (void)state;
  on_device(APEX_DEVICE_CPU, "cpu");
}

static void test_cuda_matches_forward(void **state) {
  (void)state;
  const char *why = NULL;
  if (!apex_cuda_available(&why)) {
    printf("test_cuda_matches_forward skipped: %s\n", why ? why : "no usable GPU");
    skip();
  }
  on_device(APEX_DEVICE_CUDA, "cuda");
}

/* The same tokens at 1 and 2 threads, and from one seed; top_k 1 is greedy whatever the temperature. */
static void test_deterministic(void **state) {
  (void)state;
  setup s = make(APEX_DEVICE_CPU, APEX_F32, 2);
  int64_t prompt[B * T], a[B * N], b[B * N], c[B * N];
  prompt_of(prompt, 9);
  apex_gpt_generate_options o = {.temperature = 1.0f, .top_k = 10, .seed = 77};
  apex_set_num_threads(1);
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, B, T, N, a, &o));
  apex_set_num_threads(2);
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, B, T, N, b, &o));
  assert_memory_equal(a, b, sizeof a);
  o.seed = 78;
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, B, T, N, c, &o));
  assert_memory_not_equal(a, c, sizeof a);
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, B, T, N, a, &(apex_gpt_generate_options){0}));
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, B, T, N, b, &(apex_gpt_generate_options){.temperature = 5.0f, .top_k = 1, .seed = 1}));
  assert_memory_equal(a, b, sizeof a);
  /* a prompt longer than the window: its last P tokens, as the reference's window */
  int64_t longp[2 * 20], x[2 * 4], y[2 * 4];
  for (int i = 0; i < 40; i++) longp[i] = (i * 13) % V;
  TU_OK(apex_gpt_generate(s.gpt, s.g, longp, 2, 20, 4, x, NULL));
  int64_t cut[2 * P];
  for (int r = 0; r < 2; r++)
    for (int t = 0; t < P; t++) cut[r * P + t] = longp[r * 20 + 20 - P + t];
  TU_OK(apex_gpt_generate(s.gpt, s.g, cut, 2, P, 4, y, NULL));
  assert_memory_equal(x, y, sizeof x);
  unmake(&s);
}

static void test_bad_args(void **state) {
  (void)state;
  setup s = make(APEX_DEVICE_CPU, APEX_F32, 1);
  int64_t prompt[2] = {1, 2}, out[4];
  apex_model *m = apex_model_create(NULL);
  apex_module *mlp = apex_mlp_create(m, NULL);
  TU_FAILS(apex_gpt_generate(NULL, s.g, prompt, 1, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "NULL module");
  TU_FAILS(apex_gpt_generate(mlp, s.g, prompt, 1, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "not a GPT");
  TU_FAILS(apex_gpt_generate(s.gpt, NULL, prompt, 1, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "NULL graph");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, NULL, 1, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "NULL prompt");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 4, NULL, NULL), APEX_ERR_INVALID_ARG, "NULL out");
  TU_OK(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 0, NULL, NULL)); /* nothing to write */
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 0, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "B >= 1");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 0, 4, out, NULL), APEX_ERR_INVALID_ARG, "T >= 1");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, -1, out, NULL), APEX_ERR_INVALID_ARG, "n_new >= 0");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 4, out, &(apex_gpt_generate_options){.temperature = -1}), APEX_ERR_INVALID_ARG,
           "temperature -1");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 4, out, &(apex_gpt_generate_options){.temperature = NAN}), APEX_ERR_INVALID_ARG,
           "temperature nan");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 4, out, &(apex_gpt_generate_options){.temperature = INFINITY}), APEX_ERR_INVALID_ARG,
           "temperature inf");
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 4, out, &(apex_gpt_generate_options){.top_k = -2}), APEX_ERR_INVALID_ARG, "top_k -2");
  int64_t bad[2] = {3, V};
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, bad, 1, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "prompt id 61 at row 0, position 1");
  bad[1] = -1;
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, bad, 1, 2, 4, out, NULL), APEX_ERR_INVALID_ARG, "prompt id -1");
  /* a diverged model: NaN logits are refused, not sampled from */
  apex_var *lnw = apex_model_find_param(s.m, "ln_f.bias");
  assert_non_null(lnw);
  apex_tensor_set(apex_var_value(lnw), 0, NAN);
  TU_FAILS(apex_gpt_generate(s.gpt, s.g, prompt, 1, 2, 4, out, NULL), APEX_ERR_NONFINITE, "NaN");
  apex_model_destroy(m);
  unmake(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_matches_forward),
      cmocka_unit_test(test_cuda_matches_forward),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
