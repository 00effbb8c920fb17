/* nn.h: models and modules (Linear, Conv2d, BatchNorm, LayerNorm, RMSNorm, Embedding, attention,
 * transformer blocks, activations, pooling, Sequential).
 *
 * A model owns everything: its modules, their named parameters (leaf vars with gradients) and named
 * buffers (batch norm's running statistics). Names follow PyTorch's state_dict: a module named
 * "fc1" has "fc1.weight" and "fc1.bias"; a module made inside another gets the outer name as a
 * prefix ("h0.attn.q.weight"). Checkpoints and amp's casting find tensors by these names.
 *
 * Parameters are initialised when their module is created, from the model's seeded generator in
 * creation order, as PyTorch initialises them: Linear and Conv2d weights and biases uniform in
 * +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5)), Embedding N(0, 1), norm weights 1 and biases
 * 0, running mean 0 and variance 1. The same seed and the same construction give the same bits.
 *
 *     apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
 *     apex_module *net = apex_sequential_create(m, NULL);
 *     apex_sequential_add(net, apex_linear_create(m, "0", 784, 128, 1));
 *     apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
 *     apex_sequential_add(net, apex_linear_create(m, "2", 128, 10, 1));
 *     apex_var *logits = apex_module_forward(net, g, x);
 *
 * Constructors return NULL with a message for a NULL model, a size < 1, a name longer than
 * APEX_NAME_MAX - 1 or already used, or a failed allocation. apex_module_forward returns NULL with
 * the failing op's message (which names the module's op and the shapes). */
#ifndef APEX_NN_H
#define APEX_NN_H

#include <stddef.h>
#include <stdint.h>

#include "apex/autograd.h"
#include "apex/index.h"
#include "apex/optim.h"
#include "apex/nn_ops.h"
#include "apex/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define APEX_NAME_MAX 128

typedef struct apex_model apex_model;
typedef struct apex_module apex_module;

typedef struct apex_model_options {
  uint64_t seed;    /* for initialisation, and dropout unless apex_model_rng is reseeded */
  apex_dtype dtype; /* dtype of the parameters (f32 when zero) */
  /* where the parameters and buffers live (the CPU when zero); run the model on a graph of the same
   * device (apex_graph_create_on). They are initialised on the host and copied there, so a seed gives
   * the same initial bits on every device. */
  apex_device device;
} apex_model_options;

/* A new empty model in training mode; opts may be NULL (seed 0, f32, CPU). NULL with a message for a
 * bad dtype, or a device this build has no backend for or that cannot be used now. */
APEX_API apex_model *apex_model_create(const apex_model_options *opts);
/* Frees the model, its modules, parameters and buffers (NULL is fine). */
APEX_API void apex_model_destroy(apex_model *m);

/* The model accessors below take a NULL model without crashing: is_training, num_params,
 * param_elements and num_buffers give 0, the others NULL, each with an APEX_ERR_INVALID_ARG message.
 *
 * Training (1) or evaluation (0) mode: batch norm statistics and dropout follow it. */
APEX_API void apex_model_train(apex_model *m, int training);
APEX_API int apex_model_is_training(const apex_model *m);
/* The generator dropout modules draw from (seeded with the model's seed at creation). */
APEX_API apex_rng *apex_model_rng(apex_model *m);

/* Parameters in creation order; *name (if name is not NULL) receives the parameter's name. NULL for
 * i out of range. */
APEX_API size_t apex_model_num_params(const apex_model *m);
APEX_API apex_var *apex_model_param(const apex_model *m, size_t i, const char **name);
APEX_API apex_var *apex_model_find_param(const apex_model *m, const char *name);
/* The total element count of all parameters. */
APEX_API size_t apex_model_param_elements(const apex_model *m);
/* Buffers (f32 tensors that are state but not parameters), same conventions. */
APEX_API size_t apex_model_num_buffers(const apex_model *m);
APEX_API apex_tensor *apex_model_buffer(const apex_model *m, size_t i, const char **name);
APEX_API apex_tensor *apex_model_find_buffer(const apex_model *m, const char *name);
/* 1 when parameter i belongs to a BatchNorm1d/2d module (amp keeps these f32 under
 * keep_batchnorm_fp32); 0 otherwise or for i out of range. */
APEX_API int apex_model_param_in_batch_norm(const apex_model *m, size_t i);
/* Zeroes every parameter's grad. APEX_ERR_INVALID_ARG for NULL. */
APEX_API apex_status apex_model_zero_grad(apex_model *m);

/* Adds every parameter of m, in creation order, with its gradient to opt as one new group
 * (apex_optimizer_add_group over apex_var_value / apex_var_grad of each apex_model_param): opts NULL
 * means the optimizer's defaults, and the group's index goes to *group_out (may be NULL). Call it
 * before apex_amp_initialize, as with add_group. Errors, each changing nothing: APEX_ERR_INVALID_ARG
 * for NULL opt or m or a model without parameters; whatever apex_optimizer_add_group refuses (a
 * parameter already in one of opt's groups, a bad option, ...), its message prefixed with this
 * call's name. */
APEX_API apex_status apex_optimizer_add_model(apex_optimizer *opt, const apex_model *m, const apex_optim_options *opts,
                                              int *group_out);

/* ---- modules --------------------------------------------------------------------------------- */

/* Runs the module on x. Embedding modules take ids instead: apex_embedding_forward. */
APEX_API apex_var *apex_module_forward(apex_module *mod, apex_graph *g, apex_var *x);
/* The module's full name ("" for an unnamed one, and with a message for NULL). */
APEX_API const char *apex_module_name(const apex_module *mod);
/* The module's parameter called `local` ("weight", "bias"), or NULL (with a message for a NULL mod). */
APEX_API apex_var *apex_module_param(const apex_module *mod, const char *local);

/* nn.Linear: y = x w^T + b; weight [out, in], bias [out] when `bias`. */
APEX_API apex_module *apex_linear_create(apex_model *m, const char *name, int64_t in, int64_t out, int bias);
/* nn.Conv2d: weight [out_ch, in_ch, kh, kw], bias [out_ch] when `bias`; opts may be NULL. */
APEX_API apex_module *apex_conv2d_create(apex_model *m, const char *name, int64_t in_ch, int64_t out_ch, int kh, int kw,
                                         const apex_conv2d_options *opts, int bias);
/* nn.BatchNorm1d (input [N, C] or [N, C, L]) and nn.BatchNorm2d ([N, C, H, W]): weight and bias
 * [C], buffers running_mean and running_var [C]. opts->training is ignored (the model's mode
 * decides); opts may be NULL. Forward fails with APEX_ERR_SHAPE on an input of the other kind. */
APEX_API apex_module *apex_batch_norm1d_create(apex_model *m, const char *name, int64_t channels, const apex_batch_norm_options *opts);
APEX_API apex_module *apex_batch_norm2d_create(apex_model *m, const char *name, int64_t channels, const apex_batch_norm_options *opts);
/* nn.LayerNorm over the last dimension: weight, bias [dim]; eps 0 means 1e-5. */
APEX_API apex_module *apex_layer_norm_create(apex_model *m, const char *name, int64_t dim, float eps);
/* nn.LayerNorm(normalized_shape) over the last ndim dimensions: weight, bias of shape
 * normalized_shape. APEX_ERR_INVALID_ARG for ndim outside [1, APEX_MAX_DIMS], a NULL shape or an entry
 * < 1; forward fails with APEX_ERR_SHAPE unless the input ends in normalized_shape. */
APEX_API apex_module *apex_layer_norm_nd_create(apex_model *m, const char *name, int ndim, const int64_t *normalized_shape, float eps);
/* RMSNorm over the last dimension: weight [dim]; eps 0 means 1e-5. */
APEX_API apex_module *apex_rms_norm_create(apex_model *m, const char *name, int64_t dim, float eps);
/* RMSNorm(normalized_shape) over the last ndim dimensions (Apex FusedRMSNorm); as above. */
APEX_API apex_module *apex_rms_norm_nd_create(apex_model *m, const char *name, int ndim, const int64_t *normalized_shape, float eps);
/* nn.Embedding: weight [num, dim]. */
APEX_API apex_module *apex_embedding_create(apex_model *m, const char *name, int64_t num, int64_t dim);
APEX_API apex_var *apex_embedding_forward(apex_module *mod, apex_graph *g, const int64_t *ids, int ndim, const int64_t *shape);
/* The same lookup with the ids of an index on the graph's device (apex_embedding_index). */
APEX_API apex_var *apex_embedding_forward_index(apex_module *mod, apex_graph *g, const apex_index *ids);
/* Causal multi-head self-attention on x [B, T, dim]: linears q, k, v and proj (dim -> dim, with
 * biases), heads of dim / n_heads (APEX_ERR_INVALID_ARG unless n_heads divides dim). The parameters
 * "<name>.q.weight" ... "<name>.proj.bias" are those of four linears (names, initial values,
 * checkpoints), but q's, k's and v's weights are views of one [3 dim, dim] allocation and their biases
 * of one [3 dim], so the forward computes q, k and v as one product (GPT-2's c_attn) and attends on the
 * packed result (apex_causal_attention_qkv). */
APEX_API apex_module *apex_attention_create(apex_model *m, const char *name, int64_t dim, int n_heads);
/* A GPT-2 style pre-norm transformer block on x [B, T, dim]:
 *   x = x + attn(ln1(x)); x = x + proj(gelu_tanh(fc(ln2(x)))), fc: dim -> 4 dim, proj: 4 dim -> dim. */
APEX_API apex_module *apex_transformer_block_create(apex_model *m, const char *name, int64_t dim, int n_heads);

/* Parameter-free modules. op is one of APEX_OP_RELU, GELU, GELU_TANH, TANH, SIGMOID. */
APEX_API apex_module *apex_activation_create(apex_model *m, apex_op op);
APEX_API apex_module *apex_max_pool2d_create(apex_model *m, const apex_pool2d_options *opts);
APEX_API apex_module *apex_avg_pool2d_create(apex_model *m, const apex_pool2d_options *opts);
/* [N, ...] -> [N, rest]. */
APEX_API apex_module *apex_flatten_create(apex_model *m);
/* Dropout with probability p, active in training mode, drawing from apex_model_rng. */
APEX_API apex_module *apex_dropout_create(apex_model *m, float p);

/* Composition: runs its children in order. */
APEX_API apex_module *apex_sequential_create(apex_model *m, const char *name);
/* Appends child (a module of the same model). APEX_ERR_INVALID_ARG for NULL, another model's
 * module, or a container that is not a sequential. */
APEX_API apex_status apex_sequential_add(apex_module *seq, apex_module *child);

#ifdef __cplusplus
}
#endif
#endif
