/* models.h: the models apex-train knows: an MLP and a CNN for Fashion-MNIST, and a byte-level GPT
 * for text, built by the library (apex/models.h). Each is an apex_model plus what its forward needs. */
#ifndef APEX_TRAIN_MODELS_H
#define APEX_TRAIN_MODELS_H

#include <stdint.h>

#include "apex/apex.h"

typedef enum { MODEL_MLP, MODEL_CNN, MODEL_GPT } model_kind;

/* The sizes a model is built with; a zero field means the default in brackets. */
typedef struct model_dims {
  int64_t in_h, in_w;     /* mlp, cnn: image size [28 x 28] */
  int64_t classes;        /* mlp, cnn: [10] */
  int64_t hidden;         /* mlp: first hidden width, the second has half [512] */
  int64_t vocab;          /* gpt: [256, bytes] */
  int64_t n_layer, n_embd, n_head; /* gpt: [2, 64, 4] */
  int64_t seq_len;        /* gpt: the context, and the position table's rows [64] */
  apex_device device;     /* where the parameters live [the CPU] */
} model_dims;

typedef struct train_model {
  model_kind kind;
  apex_model *m;
  apex_module *net;       /* mlp, cnn: the whole network; gpt: the GPT (apex_gpt_forward) */
  /* gpt */
  int n_layer, n_head;
  int64_t dim, seq_len, vocab;
  int64_t classes;        /* mlp, cnn */
} train_model;

/* Builds the model with parameters initialised from seed. 0 on success; otherwise prints nothing
 * and leaves apex_last_error. */
int model_build(train_model *tm, model_kind kind, uint64_t seed, const model_dims *dims);
void model_free(train_model *tm);

/* mlp/cnn: logits [N, classes] (f32) of images x (a graph input, [N, 784] or [N, 1, 28, 28]). */
apex_var *model_forward_images(train_model *tm, apex_amp *amp, apex_graph *g, apex_var *x);
/* gpt: logits [B * T, vocab] (f32) of ids [B, T]. */
apex_var *model_forward_text(train_model *tm, apex_graph *g, const int64_t *ids, int64_t B, int64_t T);
/* gpt: the mean cross entropy (f32 []) of ids [B, T] against targets [B, T], the head and the loss as one
 * op (apex_gpt_loss): what training and evaluation run. */
apex_var *model_loss_text(train_model *tm, apex_graph *g, const int64_t *ids, const int64_t *targets, int64_t B, int64_t T);

/* gpt: model_loss_text with the ids and targets in indexes on the model's device (apex_gpt_loss_index):
 * the same bits, and nothing read from the host, as a captured step needs (capture_step.h). */
apex_var *model_loss_text_index(train_model *tm, apex_graph *g, const apex_index *ids, const apex_index *targets);
/* mlp/cnn: the mean cross entropy (f32 []) of images x (a tensor on the model's device) against the
 * class labels[N] on the host, or (_index) an index of them on the device, the same bits. */
apex_var *model_loss_images(train_model *tm, apex_amp *amp, apex_graph *g, apex_tensor *x, const int64_t *labels);
apex_var *model_loss_images_index(train_model *tm, apex_amp *amp, apex_graph *g, apex_tensor *x, const apex_index *labels);

/* mlp | cnn | gpt. */
const char *model_kind_name(model_kind kind);

#endif
