/* models.c: apex-train's models are the library's (apex/models.h: apex_mlp_create, apex_cnn_create,
 * apex_gpt_create); this keeps the sizes the rest of apex-train reads and picks the forward. */
#include "models.h"

#include <string.h>

const char *model_kind_name(model_kind kind) {
  return kind == MODEL_MLP ? "mlp" : kind == MODEL_CNN ? "cnn" : "gpt";
}

static int64_t or_default(int64_t v, int64_t def) { return v > 0 ? v : def; }

int model_build(train_model *tm, model_kind kind, uint64_t seed, const model_dims *dims) {
  memset(tm, 0, sizeof *tm);
  tm->kind = kind;
  model_dims z = {0};
  if (!dims) dims = &z;
  tm->classes = or_default(dims->classes, 10);
  tm->m = apex_model_create(&(apex_model_options){.seed = seed, .device = dims->device});
  if (!tm->m) return -1;
  if (kind == MODEL_MLP) {
    tm->net = apex_mlp_create(tm->m, &(apex_mlp_options){.in_features = or_default(dims->in_h, 28) * or_default(dims->in_w, 28),
                                                          .hidden = dims->hidden, .classes = tm->classes});
  } else if (kind == MODEL_CNN) {
    tm->net = apex_cnn_create(tm->m, &(apex_cnn_options){.in_h = dims->in_h, .in_w = dims->in_w, .classes = tm->classes});
  } else {
    tm->net = apex_gpt_create(tm->m, &(apex_gpt_options){.vocab = dims->vocab, .n_layer = dims->n_layer, .n_embd = dims->n_embd,
                                                          .n_head = dims->n_head, .n_positions = dims->seq_len});
    apex_gpt_options s;
    if (tm->net && apex_gpt_sizes(tm->net, &s) == APEX_OK) {
      tm->n_layer = (int)s.n_layer;
      tm->n_head = (int)s.n_head;
      tm->dim = s.n_embd;
      tm->seq_len = s.n_positions;
      tm->vocab = s.vocab;
    }
  }
  return tm->net ? 0 : -1;
}

void model_free(train_model *tm) {
  apex_model_destroy(tm->m);
  memset(tm, 0, sizeof *tm);
}

apex_var *model_forward_images(train_model *tm, apex_amp *amp, apex_graph *g, apex_var *x) {
  return apex_amp_forward(amp, 0, tm->net, g, x);
}

apex_var *model_forward_text(train_model *tm, apex_graph *g, const int64_t *ids, int64_t B, int64_t T) {
  return apex_gpt_forward(tm->net, g, ids, B, T);
}

apex_var *model_loss_text(train_model *tm, apex_graph *g, const int64_t *ids, const int64_t *targets, int64_t B, int64_t T) {
  return apex_gpt_loss(tm->net, g, ids, targets, B, T);
}

apex_var *model_loss_text_index(train_model *tm, apex_graph *g, const apex_index *ids, const apex_index *targets) {
  return apex_gpt_loss_index(tm->net, g, ids, targets);
}

/* The logits of a batch tensor (NULL when x is: a failed upload). */
static apex_var *image_logits(train_model *tm, apex_amp *amp, apex_graph *g, apex_tensor *x) {
  return x ? model_forward_images(tm, amp, g, apex_graph_input(g, x, 0)) : NULL;
}

apex_var *model_loss_images(train_model *tm, apex_amp *amp, apex_graph *g, apex_tensor *x, const int64_t *labels) {
  apex_var *logits = image_logits(tm, amp, g, x);
  return logits ? apex_cross_entropy(g, logits, labels, NULL) : NULL;
}

apex_var *model_loss_images_index(train_model *tm, apex_amp *amp, apex_graph *g, apex_tensor *x, const apex_index *labels) {
  apex_var *logits = image_logits(tm, amp, g, x);
  return logits ? apex_cross_entropy_index(g, logits, labels, NULL) : NULL;
}
