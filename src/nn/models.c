/* models.c: the ready-made models of models.h, built from nn's modules. The CNN is the one of
 * tests/test_nn_train.c (0.89+ after two epochs on Fashion-MNIST), the MLP 784-512-256-10, the GPT a
 * small GPT-2. Construction order is part of the contract: parameters draw from the model's generator
 * in that order, so changing it changes every apex-train run's bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/models.h"
#include "core/internal.h"
#include "nn/nn_internal.h"

static int64_t or_default(int64_t v, int64_t def) { return v > 0 ? v : def; }

/* Appends each module to seq (made first, as apex-train always did); the first NULL (a constructor's
 * failure, its message kept) stops it. */
static apex_module *sequential_of(apex_module *seq, apex_module *const *parts, int n) {
  if (!seq) return NULL;
  for (int i = 0; i < n; i++) {
    if (!parts[i]) return NULL;
    if (apex_sequential_add(seq, parts[i]) != APEX_OK) return NULL;
  }
  return seq;
}

apex_module *apex_mlp_create(apex_model *m, const apex_mlp_options *opts) {
  apex_mlp_options o = opts ? *opts : (apex_mlp_options){0};
  if (!m) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_mlp_create: NULL model");
  if (o.in_features < 0 || o.hidden < 0 || o.classes < 0 || o.hidden == 1)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_mlp_create: in_features %lld, hidden %lld, classes %lld: give sizes >= 1 (hidden >= 2), or 0 for the default",
                           (long long)o.in_features, (long long)o.hidden, (long long)o.classes);
  int64_t in = or_default(o.in_features, 784), hid = or_default(o.hidden, 512), classes = or_default(o.classes, 10);
  apex_module *seq = apex_sequential_create(m, NULL);
  /* Each constructor runs in this order (arguments of a call are unordered in C). */
  apex_module *p[5];
  p[0] = seq ? apex_linear_create(m, "0", in, hid, 1) : NULL;
  p[1] = p[0] ? apex_activation_create(m, APEX_OP_RELU) : NULL;
  p[2] = p[1] ? apex_linear_create(m, "2", hid, hid / 2, 1) : NULL;
  p[3] = p[2] ? apex_activation_create(m, APEX_OP_RELU) : NULL;
  p[4] = p[3] ? apex_linear_create(m, "4", hid / 2, classes, 1) : NULL;
  return sequential_of(seq, p, 5);
}

apex_module *apex_cnn_create(apex_model *m, const apex_cnn_options *opts) {
  apex_cnn_options o = opts ? *opts : (apex_cnn_options){0};
  if (!m) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_cnn_create: NULL model");
  if (o.in_h < 0 || o.in_w < 0 || o.classes < 0 || (o.in_h > 0 && o.in_h < 4) || (o.in_w > 0 && o.in_w < 4))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_cnn_create: image %lld x %lld, classes %lld: images are at least 4 x 4 (two 2x2 pools), classes >= 1; 0 for the default",
                           (long long)o.in_h, (long long)o.in_w, (long long)o.classes);
  int64_t H = or_default(o.in_h, 28), W = or_default(o.in_w, 28), classes = or_default(o.classes, 10);
  apex_conv2d_options pad1 = {.pad_h = 1, .pad_w = 1};
  apex_pool2d_options p2 = {.kernel_h = 2, .kernel_w = 2};
  apex_module *seq = apex_sequential_create(m, NULL), *p[12];
  int n = 0, ok = seq != NULL;
#define PART(expr) (ok = ok && (p[n++] = (expr)) != NULL)
  PART(apex_conv2d_create(m, "0", 1, 32, 3, 3, &pad1, 1));
  PART(apex_batch_norm2d_create(m, "1", 32, NULL));
  PART(apex_activation_create(m, APEX_OP_RELU));
  PART(apex_max_pool2d_create(m, &p2));
  PART(apex_conv2d_create(m, "4", 32, 64, 3, 3, &pad1, 1));
  PART(apex_batch_norm2d_create(m, "5", 64, NULL));
  PART(apex_activation_create(m, APEX_OP_RELU));
  PART(apex_max_pool2d_create(m, &p2));
  PART(apex_flatten_create(m));
  PART(apex_linear_create(m, "9", 64 * (H / 4) * (W / 4), 128, 1)); /* two 2x2 pools, floored */
  PART(apex_activation_create(m, APEX_OP_RELU));
  PART(apex_linear_create(m, "11", 128, classes, 1));
#undef PART
  return ok ? sequential_of(seq, p, n) : NULL;
}

apex_module *apex_gpt_create(apex_model *m, const apex_gpt_options *opts) {
  apex_gpt_options o = opts ? *opts : (apex_gpt_options){0};
  if (!m) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_create: NULL model");
  if (o.vocab < 0 || o.n_layer < 0 || o.n_embd < 0 || o.n_head < 0 || o.n_positions < 0)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_create: vocab %lld, n_layer %lld, n_embd %lld, n_head %lld, n_positions %lld: give sizes >= 1, or 0 for the default",
                           (long long)o.vocab, (long long)o.n_layer, (long long)o.n_embd, (long long)o.n_head, (long long)o.n_positions);
  int64_t V = or_default(o.vocab, 256), L = or_default(o.n_layer, 2), C = or_default(o.n_embd, 64), H = or_default(o.n_head, 4),
          P = or_default(o.n_positions, 64);
  if (C % H)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_create: n_embd %lld is not a multiple of n_head %lld", (long long)C, (long long)H);
  if (H > 1 << 20 || L > 1 << 20)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_create: n_head %lld, n_layer %lld: too many", (long long)H, (long long)L);
  apex_module *gpt = apex__nn_module(m, NN_GPT, NULL, "apex_gpt_create");
  if (!gpt) return NULL;
  gpt->n_heads = (int)H;
  /* GPT-2's initialisation scale: N(0, 0.02) embeddings rather than nn.Embedding's N(0, 1). */
  apex_module *c = apex__nn_embedding(m, "wte", V, C, 0.02f);
  if (!c || !apex__nn_add_child(gpt, c)) return c ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_create: out of memory") : NULL;
  c = apex__nn_embedding(m, "wpe", P, C, 0.02f);
  if (!c || !apex__nn_add_child(gpt, c)) return c ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_create: out of memory") : NULL;
  for (int64_t l = 0; l < L; l++) {
    char name[32];
    snprintf(name, sizeof name, "h%lld", (long long)l);
    c = apex_transformer_block_create(m, name, C, (int)H);
    if (!c || !apex__nn_add_child(gpt, c)) return c ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_create: out of memory") : NULL;
  }
  c = apex_layer_norm_create(m, "ln_f", C, 0);
  if (!c || !apex__nn_add_child(gpt, c)) return c ? apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_create: out of memory") : NULL;
  return gpt;
}

apex_status apex_gpt_sizes(const apex_module *gpt, apex_gpt_options *out) {
  if (!gpt || !out || gpt->kind != NN_GPT)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_sizes: %s", !gpt || !out ? "NULL argument" : "not a GPT (apex_gpt_create makes one)");
  const apex_tensor *wte = apex_var_value(gpt->children[0]->p[0]), *wpe = apex_var_value(gpt->children[1]->p[0]);
  *out = (apex_gpt_options){.vocab = apex_tensor_dim(wte, 0),
                            .n_layer = (int64_t)gpt->n_children - 3,
                            .n_embd = apex_tensor_dim(wte, 1),
                            .n_head = gpt->n_heads,
                            .n_positions = apex_tensor_dim(wpe, 0)};
  return APEX_OK;
}

enum { STACK_POSITIONS = 1024 };

/* The positions 0..T-1 on the host: in stack (STACK_POSITIONS long) when they fit, else in memory the caller
 * frees (when the result is not stack); NULL after a message naming fn. */
static int64_t *count_up(int64_t T, int64_t *stack, const char *fn) {
  int64_t *pos = T <= STACK_POSITIONS ? stack : malloc((size_t)T * sizeof *pos);
  if (!pos) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (int64_t t = 0; t < T; t++) pos[t] = t;
  return pos;
}

/* The positions 0..T-1 as an index on device, made the first time this GPT sees T there and kept with it. */
static const apex_index *gpt_positions(apex_module *gpt, apex_device device, int64_t T, const char *fn) {
  for (size_t i = 0; i < gpt->n_positions; i++)
    if (apex_index_numel(gpt->positions[i]) == T && apex_index_device(gpt->positions[i]) == device) return gpt->positions[i];
  apex_index **grown = realloc(gpt->positions, (gpt->n_positions + 1) * sizeof *grown);
  if (!grown) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  gpt->positions = grown;
  int64_t stack_pos[STACK_POSITIONS], *pos = count_up(T, stack_pos, fn);
  apex_index *ix = pos ? apex_index_create_on(device, 1, &T, T) : NULL;
  if (ix && apex_index_set(ix, pos, T) != APEX_OK) apex_index_destroy(ix), ix = NULL;
  if (pos != stack_pos) free(pos);
  if (ix) gpt->positions[gpt->n_positions++] = ix;
  return ix;
}

/* The hidden states after ln_f, [B * T, C], of token ids [B, T] (the part of the model before its head):
 * from the host array ids, or from the index ix (its positions then an index too, so that nothing goes
 * through the host), with fn naming the public call in messages. */
static apex_var *gpt_hidden(apex_module *gpt, apex_graph *g, const int64_t *ids, const apex_index *ix, int64_t B, int64_t T,
                            const char *fn) {
  if (!gpt || gpt->kind != NN_GPT)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: %s", fn, !gpt ? "NULL module (did apex_gpt_create fail?)" : "not a GPT (apex_gpt_create makes one)");
  if (!g || (!ids && !ix)) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL %s", fn, !g ? "graph" : "ids");
  apex_gpt_options s;
  apex_gpt_sizes(gpt, &s);
  if (B < 1 || T < 1 || T > s.n_positions)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: B %lld, T %lld: give B >= 1 and 1 <= T <= %lld (n_positions, the position table's rows)",
                           fn, (long long)B, (long long)T, (long long)s.n_positions);
  apex_module **c = gpt->children;
  apex_var *tok, *p;
  if (ix) {
    const apex_index *pix = gpt_positions(gpt, apex_index_device(ix), T, fn);
    tok = pix ? apex_embedding_forward_index(c[0], g, ix) : NULL;
    p = tok ? apex_embedding_forward_index(c[1], g, pix) : NULL;
  } else {
    int64_t shape[2] = {B, T};
    int64_t stack_pos[STACK_POSITIONS], *pos = count_up(T, stack_pos, fn);
    if (!pos) return NULL;
    tok = apex_embedding_forward(c[0], g, ids, 2, shape);
    p = tok ? apex_embedding_forward(c[1], g, pos, 1, &T) : NULL;
    if (pos != stack_pos) free(pos);
  }
  /* every residual add goes into the layer norm after it: the embeddings' sum into block 0's ln1, each
   * block's last add into the next one's ln1 or ln_f (apex__nn_block_forward2) */
  apex_var *a = tok, *b = p;
  for (int64_t l = 0; a && b && l < s.n_layer; l++) a = apex__nn_block_forward2(c[2 + l], g, a, b, &b);
  apex_module *ln_f = c[2 + s.n_layer];
  apex_var *sum = NULL, *h = a && b ? apex_add_layer_norm(g, a, b, ln_f->p[0], ln_f->p[1], ln_f->f, &sum) : NULL;
  if (!h) return NULL;
  apex_var_release(a), apex_var_release(b), apex_var_release(sum);
  int64_t flat[2] = {B * T, s.n_embd};
  return apex_reshape(g, h, 2, flat);
}

/* B and T of an index of token ids [B, T]; 0 after a message naming fn otherwise. */
static int gpt_index_sizes(const apex_index *ids, int64_t *B, int64_t *T, const char *fn) {
  if (!ids) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL ids", fn), 0;
  if (apex_index_ndim(ids) != 2) return apex__fail(APEX_ERR_SHAPE, "%s: ids of %d dimensions; give [B, T]", fn, apex_index_ndim(ids)), 0;
  *B = apex_index_dim(ids, 0), *T = apex_index_dim(ids, 1);
  return 1;
}

/* The logits [B * T, V] in f32 of the hidden states h (NULL passes through). */
static apex_var *gpt_logits(apex_module *gpt, apex_graph *g, apex_var *h) {
  if (!h) return NULL;
  /* Tied output: logits = h wte^T as a linear with wte [V, C] as its weight, read where it is (a
   * product with a transposed operand). Until f4316f8 this was apex_transpose + apex_matmul: a
   * [C, V] copy of the table every forward (154 MB for GPT-2 small in f32) and its gradient summed
   * back through the transpose; the logits keep their bits, wte's gradient changed its bits once. */
  apex_var *logits = apex_linear(g, h, gpt->children[0]->p[0], NULL);
  if (logits && apex_tensor_dtype(apex_var_value(logits)) != APEX_F32) logits = apex_cast(g, logits, APEX_F32);
  return logits;
}

apex_var *apex_gpt_forward(apex_module *gpt, apex_graph *g, const int64_t *ids, int64_t B, int64_t T) {
  return gpt_logits(gpt, g, gpt_hidden(gpt, g, ids, NULL, B, T, "apex_gpt_forward"));
}

apex_var *apex_gpt_forward_index(apex_module *gpt, apex_graph *g, const apex_index *ids) {
  int64_t B, T;
  if (!gpt_index_sizes(ids, &B, &T, "apex_gpt_forward_index")) return NULL;
  return gpt_logits(gpt, g, gpt_hidden(gpt, g, NULL, ids, B, T, "apex_gpt_forward_index"));
}

apex_var *apex_gpt_loss(apex_module *gpt, apex_graph *g, const int64_t *ids, const int64_t *targets, int64_t B, int64_t T) {
  if (!targets) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_loss: NULL targets");
  apex_var *h = gpt_hidden(gpt, g, ids, NULL, B, T, "apex_gpt_loss");
  /* the tied head reads wte [V, C] where it is: logits = h wte^T, a linear without bias */
  return h ? apex_linear_cross_entropy(g, h, gpt->children[0]->p[0], targets, NULL, 0) : NULL;
}

apex_var *apex_gpt_loss_index(apex_module *gpt, apex_graph *g, const apex_index *ids, const apex_index *targets) {
  const char *fn = "apex_gpt_loss_index";
  int64_t B, T;
  if (!gpt_index_sizes(ids, &B, &T, fn)) return NULL;
  if (!targets) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL targets", fn);
  if (apex_index_ndim(targets) != 2 || apex_index_dim(targets, 0) != B || apex_index_dim(targets, 1) != T)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: targets of another shape than the ids [%lld, %lld]", fn, (long long)B, (long long)T);
  apex_var *h = gpt_hidden(gpt, g, NULL, ids, B, T, fn);
  return h ? apex_linear_cross_entropy_index(g, h, gpt->children[0]->p[0], targets, NULL, 0) : NULL;
}
