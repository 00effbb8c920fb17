/* bench_models.c: the benchmarks' models and their training step (see bench_models.h). */
#include "bench_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static const struct {
  const char *name;
  int batch, n_layer, dim;
} MODELS[BENCH_MODEL_COUNT] = {{"mlp", 128, 0, 0}, {"cnn", 128, 0, 0}, {"gpt_c256", 4, 4, 256}, {"gpt_c768", 4, 12, 768}};
enum { GPT_SEQ = 256, GPT_VOCAB = 256, GPT_HEAD_DIM = 64 };

const char *bench_model_name(bench_model model) { return MODELS[model].name; }

int bench_model_samples(bench_model model) {
  return MODELS[model].batch * (model >= BENCH_GPT_C256 ? GPT_SEQ : 1);
}

static int is_gpt(bench_model model) { return model == BENCH_GPT_C256 || model == BENCH_GPT_C768; }

static void die(const char *what) {
  fprintf(stderr, "bench: %s: %s\n", what, apex_last_error());
  exit(1);
}

apex_module *bench_mlp(apex_model *m) {
  apex_module *net = apex_sequential_create(m, NULL);
  apex_sequential_add(net, apex_linear_create(m, "0", 784, 1024, 1));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_linear_create(m, "2", 1024, 1024, 1));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_linear_create(m, "4", 1024, 10, 1));
  return net;
}

apex_module *bench_cnn(apex_model *m) {
  apex_module *net = apex_sequential_create(m, NULL);
  apex_conv2d_options pad = {.pad_h = 1, .pad_w = 1};
  apex_pool2d_options p2 = {.kernel_h = 2, .kernel_w = 2};
  apex_sequential_add(net, apex_conv2d_create(m, "0", 1, 32, 3, 3, &pad, 1));
  apex_sequential_add(net, apex_batch_norm2d_create(m, "1", 32, NULL));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_max_pool2d_create(m, &p2));
  apex_sequential_add(net, apex_conv2d_create(m, "4", 32, 64, 3, 3, &pad, 1));
  apex_sequential_add(net, apex_batch_norm2d_create(m, "5", 64, NULL));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_max_pool2d_create(m, &p2));
  apex_sequential_add(net, apex_flatten_create(m));
  apex_sequential_add(net, apex_linear_create(m, "9", 64 * 7 * 7, 128, 1));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_linear_create(m, "11", 128, 10, 1));
  return net;
}

/* The GPT of apex-train (tools/apex_train/models.c) at the benchmark's sizes: token and position
 * embeddings, pre-norm transformer blocks, final layer norm, output tied to the token embedding. */
static void gpt_build(bench_train *r, int n_layer, int64_t dim) {
  r->n_layer = n_layer;
  r->seq = GPT_SEQ;
  r->wte = apex_embedding_create(r->m, "wte", GPT_VOCAB, dim);
  r->wpe = apex_embedding_create(r->m, "wpe", GPT_SEQ, dim);
  r->blocks = calloc((size_t)n_layer, sizeof *r->blocks);
  if (!r->wte || !r->wpe || !r->blocks) die("gpt embeddings");
  for (int l = 0; l < n_layer; l++) {
    char name[16];
    snprintf(name, sizeof name, "h%d", l);
    if (!(r->blocks[l] = apex_transformer_block_create(r->m, name, dim, (int)(dim / GPT_HEAD_DIM)))) die("gpt block");
  }
  if (!(r->ln_f = apex_layer_norm_create(r->m, "ln_f", dim, 0))) die("gpt ln_f");
}

/* The hidden states [B * T, dim] after ln_f. */
static apex_var *gpt_hidden(bench_train *r) {
  int64_t shape[2] = {r->batch, r->seq}, pos[GPT_SEQ], T = r->seq;
  for (int64_t t = 0; t < T; t++) pos[t] = t;
  apex_graph *g = r->g;
  apex_var *h = apex_add(g, apex_embedding_forward(r->wte, g, r->ids, 2, shape), apex_embedding_forward(r->wpe, g, pos, 1, &T));
  for (int l = 0; l < r->n_layer; l++) h = apex_module_forward(r->blocks[l], g, h);
  h = apex_module_forward(r->ln_f, g, h);
  int64_t flat[2] = {r->batch * r->seq, apex_tensor_dim(apex_var_value(apex_module_param(r->wte, "weight")), 1)};
  return h ? apex_reshape(g, h, 2, flat) : NULL;
}

void bench_train_init(bench_train *r, bench_model model, int batch, const char *level) {
  memset(r, 0, sizeof *r);
  r->model = model;
  r->batch = batch > 0 ? batch : MODELS[model].batch;
  r->m = apex_model_create(&(apex_model_options){.seed = 1 + (uint64_t)model});
  if (!r->m) die("model");
  int samples = r->batch;
  if (model == BENCH_MLP) r->net = bench_mlp(r->m);
  else if (model == BENCH_CNN) r->net = bench_cnn(r->m);
  else gpt_build(r, MODELS[model].n_layer, MODELS[model].dim), samples = r->batch * GPT_SEQ;
  size_t np = apex_model_num_params(r->m);
  apex_tensor **ps = malloc(np * sizeof *ps), **gs = malloc(np * sizeof *gs);
  for (size_t i = 0; i < np; i++) {
    ps[i] = apex_var_value(apex_model_param(r->m, i, NULL));
    gs[i] = apex_var_grad(apex_model_param(r->m, i, NULL));
  }
  r->opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-2f});
  if (!r->opt || apex_optimizer_add_group(r->opt, ps, (int)np, gs, (int)np, NULL, NULL) != APEX_OK) die("optimizer");
  free(ps);
  free(gs);
  apex_amp_config cfg = {.opt_level = level, .half_type = APEX_AMP_CAST_BF16};
  if (apex_amp_initialize(&r->m, 1, &r->opt, 1, &cfg, &r->amp) != APEX_OK) die("amp");
  r->g = apex_graph_create();
  if (apex_amp_prepare_graph(r->amp, r->g) != APEX_OK) die("graph");
  r->labels = malloc((size_t)samples * sizeof *r->labels);
  if (is_gpt(model)) {
    /* a fixed token stream; each label is the next token, as in language-model training */
    r->ids = malloc((size_t)samples * sizeof *r->ids);
    for (int i = 0; i < samples; i++) r->ids[i] = (i * 37 + i / 7) % GPT_VOCAB;
    for (int i = 0; i < samples; i++) r->labels[i] = r->ids[(i + 1) % samples];
  } else {
    int64_t xs[4] = {r->batch, 1, 28, 28}, xm[2] = {r->batch, 784};
    r->x = model == BENCH_CNN ? apex_tensor_create(APEX_F32, 4, xs) : apex_tensor_create(APEX_F32, 2, xm);
    apex_rng rng = apex_rng_init(3);
    apex_rng_normal(&rng, apex_tensor_data(r->x), apex_tensor_numel(r->x), 0.0f, 1.0f);
    for (int i = 0; i < samples; i++) r->labels[i] = (i * 7) % 10;
  }
}

/* The GPT's loss is the library's fast path, the tied head and the cross entropy as one op
 * (apex_linear_cross_entropy, as apex_gpt_loss runs them). */
apex_var *bench_train_loss(bench_train *r) {
  apex_var *loss;
  if (is_gpt(r->model)) {
    apex_var *h = gpt_hidden(r);
    loss = h ? apex_linear_cross_entropy(r->g, h, apex_module_param(r->wte, "weight"), r->labels, NULL, 0) : NULL;
  } else {
    loss = apex_cross_entropy(r->g, apex_amp_forward(r->amp, 0, r->net, r->g, apex_graph_input(r->g, r->x, 0)), r->labels, NULL);
  }
  if (!loss) die("forward");
  return loss;
}

void bench_train_step(void *p) {
  bench_train *r = p;
  apex_var *loss = bench_train_loss(r);
  if (apex_amp_backward(r->amp, loss, 0, NULL) != APEX_OK) die("backward");
  if (apex_amp_step(r->amp, r->opt, NULL) != APEX_OK) die("step");
  apex_amp_zero_grad(r->amp);
  apex_graph_reset(r->g);
}

double bench_train_time(bench_train *r, int warmup) {
  if (is_gpt(r->model)) return bench_best(bench_train_step, r, warmup, 2, 0.0);
  return bench_best(bench_train_step, r, warmup ? 2 : 0, 3, 0.5);
}

void bench_train_free(bench_train *r) {
  apex_graph_destroy(r->g);
  apex_amp_destroy(r->amp);
  apex_optimizer_destroy(r->opt);
  apex_model_destroy(r->m);
  apex_tensor_destroy(r->x);
  free(r->blocks);
  free(r->ids);
  free(r->labels);
  memset(r, 0, sizeof *r);
}
