/* test_gpt2_cuda_graph.c: the GPU GPT-2's captured step (gpt2_cuda_train_step_graph, bench/gpt2_cuda.c)
 * against its eager step (gpt2_cuda_train_step).
 *
 * - Same bits: two models from the same seed, one trained with eager steps and one with graph steps, 8 steps
 *   on a different batch each (so a replay that read a stale or half-copied batch shows), the learning rate
 *   lowered before step 5 on both (the graph model drops its graph with gpt2_cuda_graph_reset and captures
 *   again). Each step's loss is copied on the device into a history read once at the end, so the host runs
 *   ahead of the GPU and the staging ring is used as in training. Every step's loss must be identical bit for
 *   bit, and at the end every parameter and every f32 master of AdamW byte for byte; the graph model must
 *   report a captured graph from its second step on. bf16 (fused attention, classifier, norms and cuBLASLt
 *   epilogues) and f32 (the separate kernels).
 * - Bad uses, each a clear error after which the model still trains: NULL arguments, a token or a target
 *   outside the vocabulary (APEX_ERR_INVALID_ARG); the per-call profile on (APEX_ERR_STATE; an eager step
 *   while profiling works, and after gpt2_cuda_profile_read the graph step does); a changed learning rate
 *   after the capture (APEX_ERR_STATE naming gpt2_cuda_graph_reset; an eager step works; after the reset the
 *   graph step captures again); another optimizer than the captured one (APEX_ERR_STATE).
 * Without a GPU only the NULL-argument check runs, then the program says why the rest is skipped and
 * exits 77 (ctest: skipped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "gpt2_cuda.h"
#include "testutil.h"

/* Small enough for seconds, shaped to take bf16's fast paths: head dim 64 (the fused attention), widths that
 * are multiples of 8 (cuBLASLt's epilogues). Rows of wpe past T get no gradient. */
static const gpt2_config CFG = {.vocab = 320, .max_t = 80, .n_layer = 2, .n_embd = 128, .n_head = 2};
enum { B = 2, T = 64, STEPS = 8, LR_STEP = 5 };

static void batch(int s, int64_t *tokens, int64_t *targets) {
  for (int i = 0; i < B * T; i++) { /* repeated ids within a batch: the embedding gradient's sums */
    tokens[i] = (i * 37 + s * 101 + 11) % CFG.vocab;
    targets[i] = (i * 53 + s * 7 + 5) % CFG.vocab;
  }
}

/* Appends the bytes of device tensor t to *buf (grown), *len its size. */
static void append_bytes(const apex_tensor *t, unsigned char **buf, size_t *len) {
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  assert_non_null(h);
  TU_OK(apex_tensor_copy(h, t));
  size_t n = apex_tensor_numel(t) * apex_dtype_size(apex_tensor_dtype(t));
  *buf = realloc(*buf, *len + n);
  assert_non_null(*buf);
  memcpy(*buf + *len, apex_tensor_data(h), n);
  *len += n;
  apex_tensor_destroy(h);
}

/* STEPS steps (eager or graph) from seed 7; the losses, then every parameter's and master's bytes. */
static void train(apex_dtype dt, int graph, float *loss, unsigned char **bytes, size_t *nbytes) {
  gpt2_cuda *m = gpt2_cuda_create(&CFG, dt, B, T, 7);
  assert_non_null(m);
  apex_optimizer *opt = gpt2_cuda_optimizer_create(m, 1e-3f, 0.1f);
  assert_non_null(opt);
  int64_t len = STEPS, tokens[B * T], targets[B * T];
  apex_tensor *history = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &len);
  assert_non_null(history);
  for (int s = 0; s < STEPS; s++) {
    if (s == LR_STEP) { /* a schedule's step: the graph must be captured again */
      for (int k = 0; k < apex_optimizer_num_groups(opt); k++) TU_OK(apex_optimizer_set_lr(opt, k, 5e-4f));
      if (graph) gpt2_cuda_graph_reset(m);
    }
    batch(s, tokens, targets);
    TU_OK(graph ? gpt2_cuda_train_step_graph(m, opt, tokens, targets) : gpt2_cuda_train_step(m, opt, tokens, targets));
    if (graph) assert_int_equal(gpt2_cuda_graph_captured(m), s != 0 && s != LR_STEP);
    apex_tensor *slot = apex_tensor_slice_view(history, (size_t)s, 1, (int64_t[]){1});
    assert_non_null(slot);
    TU_OK(apex_tensor_copy(slot, gpt2_cuda_loss_tensor(m)));
    apex_tensor_destroy(slot);
  }
  apex_tensor *h = apex_tensor_create(APEX_F32, 1, &len);
  assert_non_null(h);
  TU_OK(apex_tensor_copy(h, history)); /* waits for the GPU */
  memcpy(loss, apex_tensor_data(h), sizeof(float) * STEPS);
  apex_tensor_destroy(h);
  apex_tensor_destroy(history);
  *bytes = NULL;
  *nbytes = 0;
  for (int i = 0; i < m->n_tensors; i++) append_bytes(m->param_list[i], bytes, nbytes);
  for (int k = 0; k < apex_optimizer_num_groups(opt); k++)
    for (int i = 0; i < apex_optimizer_group_size(opt, k); i++) append_bytes(apex_optimizer_master(opt, k, i), bytes, nbytes);
  apex_optimizer_destroy(opt);
  gpt2_cuda_destroy(m);
}

static void check_same_bits(apex_dtype dt) {
  float le[STEPS], lg[STEPS];
  unsigned char *be = NULL, *bg = NULL;
  size_t ne = 0, ng = 0;
  train(dt, 0, le, &be, &ne);
  train(dt, 1, lg, &bg, &ng);
  int same = 1;
  for (int s = 0; s < STEPS; s++) {
    int eq = memcmp(&le[s], &lg[s], sizeof(float)) == 0;
    printf("%s %s step %d: eager loss %.9g, graph loss %.9g\n", eq ? "PASS" : "FAIL", apex_dtype_name(dt), s, (double)le[s],
           (double)lg[s]);
    same &= eq && isfinite(le[s]);
  }
  assert_int_equal(ne, ng);
  size_t diff = 0;
  for (size_t i = 0; i < ne; i++) diff += be[i] != bg[i];
  printf("%s %s parameters and masters: %zu of %zu bytes differ\n", diff ? "FAIL" : "PASS", apex_dtype_name(dt), diff, ne);
  free(be);
  free(bg);
  assert_true(same);
  assert_int_equal(diff, 0);
  assert_true(le[STEPS - 1] < le[0]); /* it trained */
}

static int no_gpu(void) {
  const char *why;
  if (apex_cuda_available(&why)) return 0;
  printf("skipped: %s\n", why);
  return 1;
}

static void test_graph_matches_eager_bf16(void **state) {
  (void)state;
  if (no_gpu()) skip();
  check_same_bits(APEX_BF16);
}

static void test_graph_matches_eager_f32(void **state) {
  (void)state;
  if (no_gpu()) skip();
  check_same_bits(APEX_F32);
}

static void test_null_arguments(void **state) {
  (void)state;
  int64_t ids[1] = {0};
  TU_FAILS(gpt2_cuda_train_step_graph(NULL, NULL, ids, ids), APEX_ERR_INVALID_ARG, "NULL argument");
  gpt2_cuda_graph_reset(NULL); /* nothing to do */
  assert_int_equal(gpt2_cuda_graph_captured(NULL), 0);
}

/* A graph step, then the mean loss is finite. */
static void graph_step_ok(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets) {
  TU_OK(gpt2_cuda_train_step_graph(m, opt, tokens, targets));
  float loss = NAN;
  TU_OK(gpt2_cuda_loss(m, &loss));
  assert_true(isfinite(loss));
}

static void eager_step_ok(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets) {
  TU_OK(gpt2_cuda_train_step(m, opt, tokens, targets));
  float loss = NAN;
  TU_OK(gpt2_cuda_loss(m, &loss));
  assert_true(isfinite(loss));
}

static void test_bad_uses(void **state) {
  (void)state;
  if (no_gpu()) skip();
  gpt2_cuda *m = gpt2_cuda_create(&CFG, APEX_BF16, B, T, 7);
  assert_non_null(m);
  apex_optimizer *opt = gpt2_cuda_optimizer_create(m, 1e-3f, 0.1f);
  assert_non_null(opt);
  int64_t tokens[B * T], targets[B * T];
  batch(0, tokens, targets);
  TU_FAILS(gpt2_cuda_train_step_graph(m, NULL, tokens, targets), APEX_ERR_INVALID_ARG, "NULL argument");
  tokens[3] = CFG.vocab;
  TU_FAILS(gpt2_cuda_train_step_graph(m, opt, tokens, targets), APEX_ERR_INVALID_ARG, "token 320 at 3 is outside [0, 320)");
  batch(0, tokens, targets);
  targets[5] = -1;
  TU_FAILS(gpt2_cuda_train_step_graph(m, opt, tokens, targets), APEX_ERR_INVALID_ARG, "target -1 at 5 is outside [0, 320)");
  batch(0, tokens, targets);
  /* the profile: refused while on, an eager step profiles, and once read the graph step goes */
  TU_OK(gpt2_cuda_profile_start(m));
  TU_FAILS(gpt2_cuda_train_step_graph(m, opt, tokens, targets), APEX_ERR_STATE, "per-call profile is on");
  eager_step_ok(m, opt, tokens, targets);
  const char *labels[96];
  double ms[96];
  assert_true(gpt2_cuda_profile_read(m, labels, ms, 96, NULL) > 0);
  graph_step_ok(m, opt, tokens, targets); /* uncaptured */
  assert_int_equal(gpt2_cuda_graph_captured(m), 0);
  graph_step_ok(m, opt, tokens, targets); /* captured and launched */
  assert_int_equal(gpt2_cuda_graph_captured(m), 1);
  /* a changed learning rate: refused until the graph is captured again, the eager step meanwhile fine */
  TU_OK(apex_optimizer_set_lr(opt, 0, 2e-3f));
  TU_FAILS(gpt2_cuda_train_step_graph(m, opt, tokens, targets), APEX_ERR_STATE, "gpt2_cuda_graph_reset");
  eager_step_ok(m, opt, tokens, targets);
  gpt2_cuda_graph_reset(m);
  assert_int_equal(gpt2_cuda_graph_captured(m), 0);
  graph_step_ok(m, opt, tokens, targets);
  graph_step_ok(m, opt, tokens, targets);
  assert_int_equal(gpt2_cuda_graph_captured(m), 1);
  /* another optimizer */
  apex_optimizer *other = gpt2_cuda_optimizer_create(m, 1e-3f, 0.1f);
  assert_non_null(other);
  TU_FAILS(gpt2_cuda_train_step_graph(m, other, tokens, targets), APEX_ERR_STATE, "another optimizer");
  apex_optimizer_destroy(other);
  graph_step_ok(m, opt, tokens, targets);
  eager_step_ok(m, opt, tokens, targets); /* eager after graph steps */
  graph_step_ok(m, opt, tokens, targets); /* and the graph again after it */
  apex_optimizer_destroy(opt);
  gpt2_cuda_destroy(m);
}

int main(void) {
  const struct CMUnitTest cpu_tests[] = {cmocka_unit_test(test_null_arguments)};
  const char *why;
  if (!apex_cuda_available(&why)) {
    int failed = cmocka_run_group_tests(cpu_tests, NULL, NULL);
    if (failed) return failed;
    printf("test_gpt2_cuda_graph: the GPU cases skipped: %s\n", why);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_graph_matches_eager_bf16),
      cmocka_unit_test(test_graph_matches_eager_f32),
      cmocka_unit_test(test_bad_uses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
