/* test_gpt_hf.c: GPT-2 weights in Hugging Face's layout (apex/gpt_hf.h), both directions.
 *  - import: tests/data/gpt2_hf_tiny.safetensors, a random GPT-2 that Transformers saved
 *    (tests/gen_gpt2_hf_golden.py; n_layer 2, n_embd 32, n_head 4, vocab 300, 64 positions), loaded
 *    into apex_gpt_create's model gives Transformers' logits and loss on the same ids
 *    (gpt2_hf_tiny_logits.safetensors, computed in double) within 1e-4 of the logits' scale and 1e-5
 *    of the loss; with a 16-row position table it takes the file's first 16 rows;
 *  - export: apex_gpt_save_hf writes back every tensor of that file bit for bit (layout checked
 *    against Transformers' own file, not against our loader) and a config.json;
 *  - bad files (another size, apex's own layout, not safetensors, a missing tensor, a wrong shape, an
 *    untied lm_head) fail with one message each and leave the model as it was; a tied lm_head loads;
 *  - live, where Transformers imports: a GPT that apex-train trains for 3 steps and `apex-train export`
 *    writes is loaded by GPT2LMHeadModel.from_pretrained, whose loss and logits must be apex's
 *    (tests/gpt2_hf_live.py); skipped with the reason where Transformers or apex-train is absent.
 *    $APEX_HF_PYTHON names the Python to use (default python3). */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

static char tmpdir[64];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/apex_test_gpt_hf_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *data_path(const char *name) {
  static char buf[4][1024];
  static int k;
  const char *dir = getenv("APEX_TEST_DATA");
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir ? dir : "tests/data", name);
  return buf[k];
}

/* Logits [B * T, V] of gpt on ids into out. */
static void run_gpt(apex_module *gpt, const int64_t *ids, int64_t B, int64_t T, float *out) {
  apex_graph *g = apex_graph_create();
  apex_var *y = apex_gpt_forward(gpt, g, ids, B, T);
  if (!y) fail_msg("apex_gpt_forward: %s", apex_last_error());
  memcpy(out, apex_tensor_data(apex_var_value(y)), apex_tensor_numel(apex_var_value(y)) * sizeof *out);
  apex_graph_destroy(g);
}

/* Transformers' loss with labels = ids: the mean over b and t < T - 1 of -log softmax(logits[b, t])[ids[b, t + 1]]. */
static double lm_loss(const float *logits, const int64_t *ids, int64_t B, int64_t T, int64_t V) {
  double sum = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t + 1 < T; t++) {
      const float *row = logits + (b * T + t) * V;
      double mx = -INFINITY, s = 0;
      for (int64_t v = 0; v < V; v++) mx = fmax(mx, row[v]);
      for (int64_t v = 0; v < V; v++) s += exp(row[v] - mx);
      sum += log(s) + mx - row[ids[b * T + t + 1]];
    }
  return sum / (double)(B * (T - 1));
}

typedef struct {
  int64_t ids[2 * 16];
  apex_tensor *logits; /* [2, 16, 300] */
  float loss;
} golden;

static void read_golden(golden *g) {
  apex_safetensors *st = apex_safetensors_open(data_path("gpt2_hf_tiny_logits.safetensors"));
  if (!st) fail_msg("%s", apex_last_error());
  apex_tensor *ids = apex_safetensors_get(st, "ids"), *loss = apex_safetensors_get(st, "loss");
  g->logits = apex_safetensors_get(st, "logits");
  assert_true(ids && loss && g->logits);
  assert_int_equal(apex_tensor_numel(ids), 32);
  assert_int_equal(apex_tensor_numel(g->logits), 32 * 300);
  for (int i = 0; i < 32; i++) g->ids[i] = (int64_t)((float *)apex_tensor_data(ids))[i];
  g->loss = ((float *)apex_tensor_data(loss))[0];
  apex_tensor_destroy(ids);
  apex_tensor_destroy(loss);
  apex_safetensors_close(st);
}

static apex_module *tiny_gpt(apex_model **m, int64_t positions) {
  *m = apex_model_create(&(apex_model_options){.seed = 7});
  apex_module *gpt = apex_gpt_create(*m, &(apex_gpt_options){.vocab = 300, .n_layer = 2, .n_embd = 32, .n_head = 4, .n_positions = positions});
  assert_non_null(gpt);
  return gpt;
}

static void check_golden(apex_module *gpt, const golden *gd) {
  float *logits = malloc(32 * 300 * sizeof *logits);
  run_gpt(gpt, gd->ids, 2, 16, logits);
  const float *ref = apex_tensor_data(gd->logits);
  double diff = 0, scale = 0;
  for (int i = 0; i < 32 * 300; i++) diff = fmax(diff, fabs(logits[i] - ref[i])), scale = fmax(scale, fabs(ref[i]));
  double loss = lm_loss(logits, gd->ids, 2, 16, 300);
  printf("golden (Transformers): loss %.6f, apex %.6f; logits max |diff| %.2e at scale %.2f (bounds: 1e-5 relative, 1e-4 x scale)\n", gd->loss, loss,
         diff, scale);
  assert_true(diff <= 1e-4 * fmax(1, scale));
  assert_true(fabs(loss - gd->loss) <= 1e-5 * fmax(1, fabs(gd->loss)));
  free(logits);
}

static void test_import_golden(void **state) {
  (void)state;
  apex_gpt_options o;
  TU_OK(apex_gpt_hf_sizes(data_path("gpt2_hf_tiny.safetensors"), &o));
  assert_true(o.vocab == 300 && o.n_layer == 2 && o.n_embd == 32 && o.n_positions == 64 && o.n_head == 0);
  golden gd;
  read_golden(&gd);
  apex_model *m;
  apex_module *gpt = tiny_gpt(&m, 64);
  TU_OK(apex_gpt_load_hf(m, gpt, NULL, data_path("gpt2_hf_tiny.safetensors")));
  check_golden(gpt, &gd);
  apex_model_destroy(m);
  /* A shorter position table takes the file's first rows: the same logits for these 16 positions. */
  gpt = tiny_gpt(&m, 16);
  TU_OK(apex_gpt_load_hf(m, gpt, NULL, data_path("gpt2_hf_tiny.safetensors")));
  check_golden(gpt, &gd);
  apex_model_destroy(m);
  /* At O2 the f32 masters get the file's values and the bf16 model their rounding. */
  gpt = tiny_gpt(&m, 64);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, NULL);
  apex_amp *amp = NULL;
  TU_OK(apex_optimizer_add_model(opt, m, NULL, NULL));
  TU_OK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16}, &amp));
  TU_OK(apex_gpt_load_hf(m, gpt, amp, data_path("gpt2_hf_tiny.safetensors")));
  apex_var *q = apex_model_find_param(m, "h1.attn.k.weight");
  apex_tensor *master = apex_amp_master_of(amp, q);
  assert_non_null(master);
  apex_safetensors *st = apex_safetensors_open(data_path("gpt2_hf_tiny.safetensors"));
  apex_tensor *c_attn = apex_safetensors_get(st, "transformer.h.1.attn.c_attn.weight"); /* [32, 96]: k is columns 32..63, transposed */
  const float *cw = apex_tensor_data(c_attn), *mw = apex_tensor_data(master);
  for (int o2 = 0; o2 < 32; o2++)
    for (int i = 0; i < 32; i++) assert_true(tu_bits(mw[o2 * 32 + i]) == tu_bits(cw[i * 96 + 32 + o2]));
  assert_int_equal(apex_tensor_dtype(apex_var_value(q)), APEX_BF16);
  apex_tensor_destroy(c_attn);
  apex_safetensors_close(st);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  apex_tensor_destroy(gd.logits);
}

static void test_export_roundtrip(void **state) {
  (void)state;
  apex_model *m;
  apex_module *gpt = tiny_gpt(&m, 64);
  TU_OK(apex_gpt_load_hf(m, gpt, NULL, data_path("gpt2_hf_tiny.safetensors")));
  char dir[128], path[160];
  snprintf(dir, sizeof dir, "%s/export", tmpdir);
  TU_OK(apex_gpt_save_hf(m, gpt, NULL, dir));
  /* Every tensor Transformers wrote comes back with the same name, shape and bits. */
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  apex_safetensors *ours = apex_safetensors_open(path), *theirs = apex_safetensors_open(data_path("gpt2_hf_tiny.safetensors"));
  assert_true(ours && theirs);
  assert_int_equal(apex_safetensors_count(ours), apex_safetensors_count(theirs));
  assert_string_equal(apex_safetensors_metadata(ours, "format"), "pt");
  for (int i = 0; i < apex_safetensors_count(theirs); i++) {
    const char *name = apex_safetensors_name(theirs, i);
    apex_tensor *a = apex_safetensors_get(ours, name), *b = apex_safetensors_get(theirs, name);
    if (!a) fail_msg("the export has no %s", name);
    assert_int_equal(apex_tensor_numel(a), apex_tensor_numel(b));
    assert_int_equal(apex_tensor_ndim(a), apex_tensor_ndim(b));
    for (int d = 0; d < apex_tensor_ndim(a); d++) assert_int_equal(apex_tensor_dim(a, d), apex_tensor_dim(b, d));
    if (memcmp(apex_tensor_data(a), apex_tensor_data(b), apex_tensor_numel(a) * sizeof(float))) fail_msg("%s differs from Transformers' file", name);
    apex_tensor_destroy(a);
    apex_tensor_destroy(b);
  }
  apex_safetensors_close(ours);
  apex_safetensors_close(theirs);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char cfg[2048] = {0};
  size_t got = fread(cfg, 1, sizeof cfg - 1, f);
  fclose(f);
  assert_true(got > 0);
  const char *keys[] = {"\"model_type\": \"gpt2\"", "\"vocab_size\": 300", "\"n_positions\": 64", "\"n_embd\": 32", "\"n_layer\": 2",
                        "\"n_head\": 4", "\"activation_function\": \"gelu_new\"", "\"layer_norm_epsilon\": 1e-05", "\"tie_word_embeddings\": true"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
    if (!strstr(cfg, keys[k])) fail_msg("config.json lacks %s:\n%s", keys[k], cfg);
  /* The export loads back as the same model. */
  apex_model *m2;
  apex_module *gpt2 = tiny_gpt(&m2, 64);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  TU_OK(apex_gpt_load_hf(m2, gpt2, NULL, path));
  for (size_t i = 0; i < apex_model_num_params(m); i++) {
    const apex_tensor *a = apex_var_value(apex_model_param(m, i, NULL)), *b = apex_var_value(apex_model_param(m2, i, NULL));
    assert_memory_equal(apex_tensor_data((apex_tensor *)a), apex_tensor_data((apex_tensor *)b), apex_tensor_numel(a) * sizeof(float));
  }
  /* A dir that cannot be made. */
  snprintf(path, sizeof path, "%s/config.json/sub", dir);
  TU_FAILS(apex_gpt_save_hf(m, gpt, NULL, path), APEX_ERR_IO, "cannot make the directory");
  TU_FAILS(apex_gpt_save_hf(m, NULL, NULL, dir), APEX_ERR_INVALID_ARG, "NULL gpt");
  apex_model_destroy(m2);
  apex_model_destroy(m);
}

/* A copy of the golden file with tensor `drop` left out, `reshape` cut to its first half, and
 * lm_head.weight added (equal to wte when tied, else perturbed) when head is 1 or 2. */
static void variant(const char *path, const char *drop, const char *cut, int head) {
  apex_safetensors *st = apex_safetensors_open(data_path("gpt2_hf_tiny.safetensors"));
  int n = apex_safetensors_count(st), k = 0;
  const char *names[64];
  apex_tensor *ts[64];
  for (int i = 0; i < n; i++) {
    const char *name = apex_safetensors_name(st, i);
    if (drop && !strcmp(name, drop)) continue;
    apex_tensor *t = apex_safetensors_get(st, name);
    if (cut && !strcmp(name, cut)) {
      int64_t half = apex_tensor_numel(t) / 2;
      apex_tensor *c = apex_tensor_create(APEX_F32, 1, &half);
      memcpy(apex_tensor_data(c), apex_tensor_data(t), (size_t)half * sizeof(float));
      apex_tensor_destroy(t);
      t = c;
    }
    names[k] = name, ts[k++] = t;
  }
  if (head) {
    apex_tensor *h = apex_safetensors_get(st, "transformer.wte.weight");
    if (head == 2) ((float *)apex_tensor_data(h))[5] += 1.0f;
    names[k] = "lm_head.weight", ts[k++] = h;
  }
  const char *key = "format", *value = "pt";
  TU_OK(apex_safetensors_save(path, names, ts, k, &key, &value, 1));
  for (int i = 0; i < k; i++) apex_tensor_destroy(ts[i]);
  apex_safetensors_close(st);
}

static void test_bad_files(void **state) {
  (void)state;
  apex_model *m;
  apex_module *gpt = tiny_gpt(&m, 64);
  apex_tensor *before = apex_tensor_to(apex_var_value(apex_model_find_param(m, "h0.fc.bias")), APEX_F32);
  char path[160];
  /* another size */
  apex_model *m3 = apex_model_create(NULL);
  apex_module *g3 = apex_gpt_create(m3, &(apex_gpt_options){.vocab = 300, .n_layer = 3, .n_embd = 32, .n_head = 4});
  TU_FAILS(apex_gpt_load_hf(m3, g3, NULL, data_path("gpt2_hf_tiny.safetensors")), APEX_ERR_SHAPE, "n_layer 2");
  apex_model_destroy(m3);
  m3 = apex_model_create(NULL);
  g3 = apex_gpt_create(m3, &(apex_gpt_options){.vocab = 300, .n_layer = 2, .n_embd = 32, .n_head = 4, .n_positions = 65});
  TU_FAILS(apex_gpt_load_hf(m3, g3, NULL, data_path("gpt2_hf_tiny.safetensors")), APEX_ERR_SHAPE, "n_positions at most the file's");
  apex_model_destroy(m3);
  /* apex's own layout, and a safetensors file of neither */
  snprintf(path, sizeof path, "%s/apex.safetensors", tmpdir);
  TU_OK(apex_model_save_f32(m, NULL, path));
  TU_FAILS(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_INVALID_ARG, "apex's own layout (wte.weight)");
  apex_gpt_options o;
  TU_FAILS(apex_gpt_hf_sizes(data_path("golden.safetensors"), &o), APEX_ERR_INVALID_ARG, "not a Hugging Face GPT-2 file");
  /* not safetensors at all; absent */
  snprintf(path, sizeof path, "%s/junk.safetensors", tmpdir);
  FILE *f = fopen(path, "w");
  fputs("not a safetensors file", f);
  fclose(f);
  assert_int_equal(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_CORRUPT);
  snprintf(path, sizeof path, "%s/absent.safetensors", tmpdir);
  assert_int_equal(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_IO);
  /* a missing tensor, a wrong shape, an untied head: each named, the model unchanged */
  snprintf(path, sizeof path, "%s/v.safetensors", tmpdir);
  variant(path, "transformer.h.1.mlp.c_fc.bias", NULL, 0);
  TU_FAILS(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_INVALID_ARG, "no tensor transformer.h.1.mlp.c_fc.bias");
  variant(path, NULL, "transformer.h.1.attn.c_attn.weight", 0);
  TU_FAILS(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_SHAPE, "transformer.h.1.attn.c_attn.weight in");
  variant(path, NULL, NULL, 2);
  TU_FAILS(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_INVALID_ARG, "lm_head.weight that is not transformer.wte.weight");
  variant(path, "transformer.ln_f.bias", NULL, 0);
  TU_FAILS(apex_gpt_load_hf(m, gpt, NULL, path), APEX_ERR_INVALID_ARG, "transformer.ln_f.bias");
  const apex_tensor *after = apex_var_value(apex_model_find_param(m, "h0.fc.bias"));
  assert_memory_equal(apex_tensor_data(before), apex_tensor_data((apex_tensor *)after), 128 * sizeof(float));
  /* a tied head loads */
  variant(path, NULL, NULL, 1);
  TU_OK(apex_gpt_load_hf(m, gpt, NULL, path));
  /* not a GPT */
  apex_module *lin = apex_linear_create(m, "lin", 2, 2, 1);
  TU_FAILS(apex_gpt_load_hf(m, lin, NULL, path), APEX_ERR_INVALID_ARG, "not a GPT");
  TU_FAILS(apex_gpt_save_hf(m, lin, NULL, tmpdir), APEX_ERR_INVALID_ARG, "not a GPT");
  apex_tensor_destroy(before);
  apex_model_destroy(m);
}

/* apex-train trains, exports; Transformers loads the export and must give apex's loss. */
static void test_live_transformers(void **state) {
  (void)state;
  const char *bin = getenv("APEX_TRAIN"), *py = getenv("APEX_HF_PYTHON");
  if (!py || !*py) py = "python3";
  char cmd[4096];
  if (!bin || access(bin, X_OK) != 0) {
    printf("skipped: APEX_TRAIN does not name the apex-train binary (tests/test_gpt_hf.cmake sets it)\n");
    return;
  }
  snprintf(cmd, sizeof cmd, "'%s' -c 'import transformers, safetensors' > /dev/null 2>&1", py);
  if (system(cmd) != 0) {
    printf("skipped: %s cannot import transformers and safetensors (set APEX_HF_PYTHON to a Python that can; see tests/gen_gpt2_hf_golden.py)\n", py);
    return;
  }
  char text[256];
  snprintf(text, sizeof text, "%s/text.txt", tmpdir);
  FILE *f = fopen(text, "w");
  assert_non_null(f);
  for (int i = 0; i < 300; i++) fprintf(f, "It was the best of times, it was the worst of times (%d). ", i);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "'%s' --model gpt --data '%s' --steps 3 --batch-size 2 --seq-len 16 --n-layer 2 --n-embd 48 --n-head 3 --threads 1 "
           "--checkpoint '%s/ck' > '%s/train.txt' 2>&1 && '%s' export --format hf --checkpoint '%s/ck' --out '%s/hf' > '%s/export.txt' 2>&1",
           bin, text, tmpdir, tmpdir, bin, tmpdir, tmpdir, tmpdir);
  if (system(cmd) != 0) fail_msg("%s failed (see %s/*.txt)", cmd, tmpdir);
  /* apex's logits and loss of the checkpoint on fixed ids, through the library */
  apex_model *m = apex_model_create(NULL);
  apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.n_layer = 2, .n_embd = 48, .n_head = 3, .n_positions = 16});
  snprintf(cmd, sizeof cmd, "%s/ck/step-3/model.safetensors", tmpdir);
  TU_OK(apex_model_load_f32(m, NULL, cmd));
  int64_t ids[2 * 16];
  const char *s = "It was the best of times, it was the worst of times.";
  for (int i = 0; i < 32; i++) ids[i] = (unsigned char)s[i % 50];
  int64_t lshape[2] = {32, 256}, ishape[2] = {2, 16}, one = 1;
  apex_tensor *logits = apex_tensor_create(APEX_F32, 2, lshape), *idt = apex_tensor_create(APEX_F32, 2, ishape),
              *loss = apex_tensor_create(APEX_F32, 1, &one);
  run_gpt(gpt, ids, 2, 16, apex_tensor_data(logits));
  for (int i = 0; i < 32; i++) ((float *)apex_tensor_data(idt))[i] = (float)ids[i];
  ((float *)apex_tensor_data(loss))[0] = (float)lm_loss(apex_tensor_data(logits), ids, 2, 16, 256);
  const char *names[3] = {"ids", "logits", "loss"};
  apex_tensor *ts[3] = {idt, logits, loss};
  snprintf(cmd, sizeof cmd, "%s/case.safetensors", tmpdir);
  TU_OK(apex_safetensors_save(cmd, names, ts, 3, NULL, NULL, 0));
  const char *src = getenv("APEX_TEST_SRC");
  snprintf(cmd, sizeof cmd, "'%s' '%s/gpt2_hf_live.py' '%s/hf' '%s/case.safetensors'", py, src ? src : "tests", tmpdir, tmpdir);
  int rc = system(cmd);
  apex_tensor_destroy(idt);
  apex_tensor_destroy(logits);
  apex_tensor_destroy(loss);
  apex_model_destroy(m);
  assert_int_equal(rc, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_import_golden),
      cmocka_unit_test(test_export_roundtrip),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_live_transformers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
