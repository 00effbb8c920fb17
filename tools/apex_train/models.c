/* models.c: the three models. The CNN is the one of tests/test_nn_train.c (conv32-bn-pool-conv64-bn-
 * pool-128-10, 0.89+ after two epochs on Fashion-MNIST); the MLP is 784-512-256-10; the GPT is a small
 * GPT-2 (token and position embeddings, pre-norm transformer blocks, final layer norm, output tied to
 * the token embedding). model_dims changes the sizes; its zero value gives these. */
#include "models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

const char *model_kind_name(model_kind kind) {
  return kind == MODEL_MLP ? "mlp" : kind == MODEL_CNN ? "cnn" : "gpt";
}

#define ADD(mod)                                                                                           \
  do {                                                                                                     \
    if (apex_sequential_add(tm->net, (mod)) != APEX_OK) return -1;                                         \
  } while (0)

static int64_t or_default(int64_t v, int64_t def) { return v > 0 ? v : def; }

int model_build(train_model *tm, model_kind kind, uint64_t seed, const model_dims *dims) {
  memset(tm, 0, sizeof *tm);
  tm->kind = kind;
  model_dims z = {0};
  if (!dims) dims = &z;
  int64_t H = or_default(dims->in_h, 28), W = or_default(dims->in_w, 28), hid = or_default(dims->hidden, 512);
  tm->classes = or_default(dims->classes, 10);
  tm->m = apex_model_create(&(apex_model_options){.seed = seed, .device = dims->device});
  if (!tm->m) return -1;
  if (kind == MODEL_MLP) {
    tm->net = apex_sequential_create(tm->m, NULL);
    ADD(apex_linear_create(tm->m, "0", H * W, hid, 1));
    ADD(apex_activation_create(tm->m, APEX_OP_RELU));
    ADD(apex_linear_create(tm->m, "2", hid, hid / 2, 1));
    ADD(apex_activation_create(tm->m, APEX_OP_RELU));
    ADD(apex_linear_create(tm->m, "4", hid / 2, tm->classes, 1));
  } else if (kind == MODEL_CNN) {
    apex_conv2d_options pad1 = {.pad_h = 1, .pad_w = 1};
    apex_pool2d_options p2 = {.kernel_h = 2, .kernel_w = 2};
    tm->net = apex_sequential_create(tm->m, NULL);
    ADD(apex_conv2d_create(tm->m, "0", 1, 32, 3, 3, &pad1, 1));
    ADD(apex_batch_norm2d_create(tm->m, "1", 32, NULL));
    ADD(apex_activation_create(tm->m, APEX_OP_RELU));
    ADD(apex_max_pool2d_create(tm->m, &p2));
    ADD(apex_conv2d_create(tm->m, "4", 32, 64, 3, 3, &pad1, 1));
    ADD(apex_batch_norm2d_create(tm->m, "5", 64, NULL));
    ADD(apex_activation_create(tm->m, APEX_OP_RELU));
    ADD(apex_max_pool2d_create(tm->m, &p2));
    ADD(apex_flatten_create(tm->m));
    ADD(apex_linear_create(tm->m, "9", 64 * (H / 4) * (W / 4), 128, 1)); /* two 2x2 pools, floored */
    ADD(apex_activation_create(tm->m, APEX_OP_RELU));
    ADD(apex_linear_create(tm->m, "11", 128, tm->classes, 1));
  } else {
    tm->n_layer = (int)or_default(dims->n_layer, 2);
    tm->n_head = (int)or_default(dims->n_head, 4);
    tm->dim = or_default(dims->n_embd, 64);
    tm->seq_len = or_default(dims->seq_len, 64);
    tm->vocab = or_default(dims->vocab, 256);
    tm->wte = apex_embedding_create(tm->m, "wte", tm->vocab, tm->dim);
    tm->wpe = apex_embedding_create(tm->m, "wpe", tm->seq_len, tm->dim);
    if (!tm->wte || !tm->wpe) return -1;
    tm->blocks = calloc((size_t)tm->n_layer, sizeof *tm->blocks);
    if (!tm->blocks) return -1;
    for (int l = 0; l < tm->n_layer; l++) {
      char name[16];
      snprintf(name, sizeof name, "h%d", l);
      tm->blocks[l] = apex_transformer_block_create(tm->m, name, tm->dim, tm->n_head);
      if (!tm->blocks[l]) return -1;
    }
    tm->ln_f = apex_layer_norm_create(tm->m, "ln_f", tm->dim, 0);
    if (!tm->ln_f) return -1;
    /* GPT-2's initialisation scale: N(0, 0.02) embeddings rather than nn.Embedding's N(0, 1). */
    apex_var *emb[2] = {apex_module_param(tm->wte, "weight"), apex_module_param(tm->wpe, "weight")};
    for (int k = 0; k < 2; k++) {
      /* scaled on the host (a copy of a GPU model's), so that every device starts from the same bits */
      apex_tensor *t = apex_var_value(emb[k]);
      int owned;
      apex_tensor *h = device_to_host(t, &owned);
      if (!h) return -1;
      float *d = apex_tensor_data(h);
      for (size_t i = 0; i < apex_tensor_numel(h); i++) d[i] *= 0.02f;
      apex_status st = owned ? apex_tensor_copy(t, h) : APEX_OK;
      if (owned) apex_tensor_destroy(h);
      if (st != APEX_OK) return -1;
    }
  }
  return 0;
}

void model_free(train_model *tm) {
  apex_model_destroy(tm->m);
  free(tm->blocks);
  memset(tm, 0, sizeof *tm);
}

apex_var *model_forward_images(train_model *tm, apex_amp *amp, apex_graph *g, apex_var *x) {
  return apex_amp_forward(amp, 0, tm->net, g, x);
}

apex_var *model_forward_text(train_model *tm, apex_graph *g, const int64_t *ids, int64_t B, int64_t T) {
  int64_t shape[2] = {B, T};
  int64_t pos[1024];
  if (T > (int64_t)(sizeof pos / sizeof pos[0])) T = (int64_t)(sizeof pos / sizeof pos[0]);
  for (int64_t t = 0; t < T; t++) pos[t] = t;
  apex_var *tok = apex_embedding_forward(tm->wte, g, ids, 2, shape);
  apex_var *p = apex_embedding_forward(tm->wpe, g, pos, 1, &T);
  apex_var *h = apex_add(g, tok, p);
  for (int l = 0; l < tm->n_layer; l++) h = apex_module_forward(tm->blocks[l], g, h);
  h = apex_module_forward(tm->ln_f, g, h);
  /* Tied output: logits = h @ wte^T, the transpose a recorded op so that the gradient reaches wte. */
  apex_var *wt = apex_transpose(g, apex_module_param(tm->wte, "weight"), 0, 1);
  apex_var *logits = apex_matmul(g, h, wt);
  int64_t flat[2] = {B * T, tm->vocab};
  logits = apex_reshape(g, logits, 2, flat);
  if (logits && apex_tensor_dtype(apex_var_value(logits)) != APEX_F32) logits = apex_cast(g, logits, APEX_F32);
  return logits;
}
