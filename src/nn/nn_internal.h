/* nn_internal.h: the model and module structs shared by model.c and modules.c. */
#ifndef APEX_NN_INTERNAL_H
#define APEX_NN_INTERNAL_H

#include <stddef.h>

#include "apex/nn.h"
#include "autograd/ag.h" /* apex__bn_stats_hook */

typedef enum nn_kind {
  NN_LINEAR, NN_CONV2D, NN_BATCH_NORM1D, NN_BATCH_NORM2D, NN_LAYER_NORM, NN_RMS_NORM, NN_EMBEDDING, NN_ATTENTION,
  NN_BLOCK, NN_ACTIVATION, NN_MAX_POOL, NN_AVG_POOL, NN_FLATTEN, NN_DROPOUT, NN_SEQUENTIAL,
  NN_GPT /* models.c: children wte, wpe, h0 .. h(n_layer - 1), ln_f */
} nn_kind;

#define NN_MAX_PARAMS 2
#define NN_MAX_CHILDREN_FIXED 6

struct apex_module {
  apex_model *model;
  nn_kind kind;
  char name[APEX_NAME_MAX];
  apex_var *p[NN_MAX_PARAMS];     /* weight, bias (NULL when absent) */
  apex_tensor *buf[2];            /* running_mean, running_var */
  apex_module **children;         /* sequential children, or a composite's parts */
  size_t n_children, cap_children;
  apex_op act;
  float f;                        /* eps, dropout p */
  int n_heads;
  apex_conv2d_options conv;
  apex_pool2d_options pool;
  apex_batch_norm_options bn;
  /* Batch norm modules: where the statistics come from in training mode when stats is set
   * (SyncBatchNorm: installed by apex_convert_sync_batchnorm in the parallel layer). */
  apex__bn_stats_hook bn_hook;
  /* GPT modules: the positions 0..T-1 as indices on the model's device, one per T asked for
   * (apex_gpt_forward_index): made once and kept with the module, since a captured step keeps reading the
   * one it was captured with */
  apex_index **positions;
  size_t n_positions;
};

typedef struct nn_named_param {
  char name[APEX_NAME_MAX];
  apex_var *var;
} nn_named_param;

typedef struct nn_named_buffer {
  char name[APEX_NAME_MAX];
  apex_tensor *t;
} nn_named_buffer;

struct apex_model {
  apex_rng init_rng, rng;
  apex_dtype dtype;
  apex_device device; /* where parameters and buffers live */
  int training;
  nn_named_param *params;
  size_t n_params, cap_params;
  nn_named_buffer *buffers;
  size_t n_buffers, cap_buffers;
  apex_module **modules;
  size_t n_modules, cap_modules;
};

/* dst = "a.b" ("b" when a is empty), cut to APEX_NAME_MAX - 1 characters. */
static inline const char *apex__nn_join(char *dst, const char *a, const char *b) {
  size_t n = 0;
  for (const char *s = a; *s && n < APEX_NAME_MAX - 1; s++) dst[n++] = *s;
  if (*a && n < APEX_NAME_MAX - 1) dst[n++] = '.';
  for (const char *s = b; *s && n < APEX_NAME_MAX - 1; s++) dst[n++] = *s;
  dst[n] = 0;
  return dst;
}

/* A new module of the model (registered for destruction); NULL with a message on failure. name may
 * be NULL (unnamed); a non-empty name must be unused among the model's modules. */
apex_module *apex__nn_module(apex_model *m, nn_kind kind, const char *name, const char *who);
/* Registers "<module>.<local>" as a parameter of shape [d0] or [d0, d1, ...] initialised per init:
 * 'u' uniform +-bound, 'n' N(0, 1) (times bound when bound > 0, in f32 before any rounding), '1' ones,
 * '0' zeros. */
apex_var *apex__nn_param(apex_module *mod, const char *local, int ndim, const int64_t *shape, char init, float bound);
/* Gives the n linear modules mods[i] (made without parameters, each to be in -> out with a bias) their
 * "weight" [out, in] and "bias" [out], drawn and registered as apex_linear_create's (module by module,
 * weight then bias), with the n weights one allocation [n * out, in] and the n biases another [n * out]:
 * each parameter a view of its block, in order, so that the joint weight and bias are the concat of the
 * parts in place (apex_concat makes no copy) and one product computes all n linears. Named parameters,
 * checkpoints, optimizers and gradients see n separate linears; each gradient is its own allocation. */
apex_status apex__nn_linear_params_joint(apex_module *const *mods, int n, int64_t in, int64_t out);
/* Registers a f32 buffer "<module>.<local>" [n] filled with value. */
apex_tensor *apex__nn_buffer(apex_module *mod, const char *local, int64_t n, float value);
/* nn.Embedding (apex_embedding_create) whose weight is N(0, 1) times std when std > 0. */
apex_module *apex__nn_embedding(apex_model *m, const char *name, int64_t num, int64_t dim, float std);
/* Appends child to mod's children. */
int apex__nn_add_child(apex_module *mod, apex_module *child);
/* Returns result after releasing done, an intermediate the caller never sees: its memory goes back to
 * the graph's pool once no backward needs it (apex_var_release). An op may hand its input back as its
 * result (dropout in evaluation), which must then stay. */
static inline apex_var *apex__nn_drop(apex_var *result, apex_var *done) {
  if (done != result) apex_var_release(done);
  return result;
}

/* A transformer block (apex_transformer_block_create) on the input a + b (b NULL: a), its residual adds
 * fused into the layer norms after them: returns x1 and sets *p_out so that x1 + p is the block's output,
 * left for whoever normalises it next to add (apex_add_layer_norm). Releases b and a when b is given
 * (their sum replaces them). NULL after a message. */
apex_var *apex__nn_block_forward2(apex_module *mod, apex_graph *g, apex_var *a, apex_var *b, apex_var **p_out);

#endif
