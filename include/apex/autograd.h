/* autograd.h: tensors with gradients, recorded define-by-run, and backward.
 *
 * A training step is:
 *
 *     apex_var *x = apex_graph_input(g, batch, 0);
 *     apex_var *loss = ...ops from nn_ops.h on x and the model's parameters...;
 *     apex_backward(loss, NULL);          fills the parameters' grad tensors
 *     optimizer step on (apex_var_value(p), apex_var_grad(p)) pairs
 *     apex_graph_reset(g);                frees this step's intermediates for reuse
 *
 * Two kinds of apex_var:
 *  - leaves (apex_var_create): long-lived, owned by the caller or by a model (parameters). A leaf
 *    that requires gradients has a grad tensor of its own dtype and shape, zero at creation, to which
 *    every backward adds until apex_var_zero_grad.
 *  - graph vars: the inputs (apex_graph_input) and the results of ops. The graph owns them; they and
 *    their values stay valid until apex_graph_reset (or apex_graph_destroy), after which the pointers
 *    must not be used. Their memory comes from a per-graph pool that a shape-stable training loop
 *    reuses step after step without allocating.
 *
 * Memory: an op records references to the values its backward reads (linear its input and weight,
 * ReLU its output), not to everything it touched. A caller done with a graph var's value says so
 * with apex_var_release; the value's memory then goes back to the pool as soon as no recorded
 * backward needs it either, and later ops of the same step reuse it. The modules release the
 * intermediates they make, so a model keeps only what its backward needs (PyTorch's saved tensors),
 * and backward drops each op's references once that op has run (unless retain_graph).
 *
 * Every op records its inputs when one of them requires gradients and grad mode is on
 * (apex_graph_set_grad_enabled). Backward runs the recorded ops in reverse creation order, which is
 * a valid topological order because an op's inputs always exist before it. Gradients flow in f32
 * whatever the dtypes of the values; a leaf's grad tensor receives them rounded to its dtype.
 *
 * Autocast (the hook amp builds on): every op has an autocast category (apex_cast_category) and
 * every op call passes through one dispatcher. With autocast on (apex_graph_set_autocast), the
 * dispatcher casts the op's floating inputs per category: HALF ops run in the autocast dtype, FLOAT
 * ops in f32, PROMOTE ops in the widest input dtype, NONE ops in their input's dtype. Casts are
 * recorded ops, so gradients flow back to f32 parameters. On the CPU the FLOAT norms, softmaxes and
 * losses read f16/bf16 inputs without a cast (widening is exact) and give f32 results and gradients
 * of the same bits as with one, without the f32 copy. A leaf's low-precision copy is made once
 * per graph step and reused by every op that needs it (the weight-cast cache, cleared by
 * apex_graph_reset and at the end of each apex_backward, as Apex clears it when scale_loss exits, so
 * that a forward after an optimizer step sees the new weights). apex_graph_set_op_cast overrides an op's category for one graph (Apex's
 * register_half_function / register_float_function).
 *
 * Errors: every function that can fail returns a status or NULL and leaves a message naming the op
 * and the shapes (apex_last_error). Op functions return NULL on failure; passing that NULL to a
 * later op fails again with APEX_ERR_INVALID_ARG, so a chain can be checked once at the end. */
#ifndef APEX_AUTOGRAD_H
#define APEX_AUTOGRAD_H

#include <stddef.h>
#include <stdint.h>

#include "apex/dtype.h"
#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_var apex_var;
typedef struct apex_graph apex_graph;

/* How autocast treats an op's floating inputs. */
typedef enum apex_cast_category {
  APEX_CAST_NONE = 0, /* runs in its input's dtype (reshape, relu, pooling, ...) */
  APEX_CAST_HALF,     /* runs in the autocast dtype (matmul, linear, conv2d, attention) */
  APEX_CAST_FLOAT,    /* runs in f32 (softmax, norms, losses, sum, exp, log, pow) */
  APEX_CAST_PROMOTE   /* runs in the widest dtype among its inputs (add, mul, concat, comparisons) */
} apex_cast_category;

/* Every op, in one place. The op table (name, category, backward) is indexed by this enum. */
typedef enum apex_op {
  APEX_OP_LEAF = 0, APEX_OP_CAST,
  APEX_OP_ADD, APEX_OP_SUB, APEX_OP_MUL, APEX_OP_DIV, APEX_OP_SCALE,
  APEX_OP_RELU, APEX_OP_GELU, APEX_OP_GELU_TANH, APEX_OP_TANH, APEX_OP_SIGMOID, APEX_OP_DROPOUT,
  APEX_OP_MATMUL, APEX_OP_LINEAR, APEX_OP_CONV2D, APEX_OP_MAX_POOL2D, APEX_OP_AVG_POOL2D,
  APEX_OP_BATCH_NORM, APEX_OP_LAYER_NORM, APEX_OP_RMS_NORM, APEX_OP_EMBEDDING,
  APEX_OP_SOFTMAX, APEX_OP_LOG_SOFTMAX, APEX_OP_CROSS_ENTROPY, APEX_OP_MSE, APEX_OP_BCE_WITH_LOGITS,
  APEX_OP_BCE, APEX_OP_SUM, APEX_OP_MEAN, APEX_OP_RESHAPE, APEX_OP_PERMUTE, APEX_OP_CONCAT,
  APEX_OP_ATTENTION,
  APEX_OP_SYNC_BATCH_NORM, /* batch norm with statistics over every rank (apex_sync_batch_norm, ddp.h) */
  APEX_OP_BATCH_NORM_RELU, /* relu(batch norm): apex_batch_norm_options.relu */
  /* Apex's FP32 list beyond the activations (appended, so the values above keep their numbers) */
  APEX_OP_EXP, APEX_OP_LOG, APEX_OP_POW, APEX_OP_POW_TENSOR, APEX_OP_NORM,
  APEX_OP_GT, APEX_OP_LT, APEX_OP_EQ, /* comparisons: 0/1 masks, not differentiable */
  APEX_OP_LINEAR_GELU, /* gelu_tanh(linear) with the GELU in the product's epilogue: apex_linear_gelu */
  APEX_OP_LINEAR_CROSS_ENTROPY, /* a classifier head and its loss: apex_linear_cross_entropy */
  APEX_OP_COUNT
} apex_op;

/* The op's name ("linear", "conv2d", ...); "invalid" outside the enum. */
APEX_API const char *apex_op_name(apex_op op);
/* The op's default autocast category (APEX_CAST_NONE outside the enum). */
APEX_API apex_cast_category apex_op_cast_category(apex_op op);

/* ---- graphs -------------------------------------------------------------------------------------- */

/* A new, empty graph on the CPU: apex_graph_create_on(APEX_DEVICE_CPU). */
APEX_API apex_graph *apex_graph_create(void);
/* A new, empty graph whose ops run on `device` (grad mode on, autocast off): its memory pool, op
 * results and gradient buffers live there, allocated, filled, copied and converted through that
 * device's backend. Every value an op reads (leaves, inputs, running statistics) must be on the same
 * device; an op that has no kernel there fails with APEX_ERR_UNSUPPORTED naming the op and the device.
 * NULL with a message for an unknown device (APEX_ERR_INVALID_ARG), a device this build has no backend
 * for or that cannot be used now, e.g. no GPU (APEX_ERR_UNSUPPORTED), or failed allocation. */
APEX_API apex_graph *apex_graph_create_on(apex_device device);
/* The device a graph runs on (APEX_DEVICE_CPU for NULL, with an APEX_ERR_INVALID_ARG message). */
APEX_API apex_device apex_graph_device(const apex_graph *g);
/* Frees the graph, its vars and its memory pool (NULL is fine). Leaves are not touched. */
APEX_API void apex_graph_destroy(apex_graph *g);
/* Ends a step: every graph var made since the last reset becomes invalid, its memory goes back to
 * the pool (pool blocks that this step did not use are freed), and the weight-cast cache is cleared.
 * Grad mode, autocast and category overrides are kept. */
APEX_API void apex_graph_reset(apex_graph *g);
/* Turns recording on (1) or off (0, "no-grad" mode for evaluation); returns the previous setting.
 * With recording off, ops compute values only and their results do not require gradients. The graph
 * functions that return a value (this one, the byte counts, apex_graph_autocast_enabled and
 * apex_graph_config_tag) give 0 for a NULL graph, with an APEX_ERR_INVALID_ARG message. */
APEX_API int apex_graph_set_grad_enabled(apex_graph *g, int enabled);
/* Turns autocast on in `dtype` (APEX_F16 or APEX_BF16) or off (enabled = 0). APEX_ERR_DTYPE for
 * another dtype; APEX_ERR_INVALID_ARG for a NULL graph. */
APEX_API apex_status apex_graph_set_autocast(apex_graph *g, int enabled, apex_dtype dtype);
/* Keeps the gradients of the graph's f16/bf16 values in their own dtype during a backward (on = 1), as
 * PyTorch's autograd and llm.c do, or in f32 (0, the default). Half gradients halve the bytes every
 * backward kernel moves between ops; each gradient is then rounded once per op that adds into it. What
 * stays f32 either way: the gradients of leaves (accumulated in f32 and added to their grad tensors
 * once, or into amp's f32 master gradients) and of values made from leaves alone (a cast of a weight, a
 * view joining weights), so that parameters receive unrounded f32 sums. Kept across resets; amp turns
 * it on for its backward where its properties say (apex_amp_properties.half_grads). APEX_ERR_INVALID_ARG
 * for a NULL graph. */
APEX_API apex_status apex_graph_set_half_grads(apex_graph *g, int on);
/* 1 when the graph keeps half gradients (apex_graph_set_half_grads); 0 otherwise, and for NULL (with an
 * APEX_ERR_INVALID_ARG message). */
APEX_API int apex_graph_half_grads(const apex_graph *g);
/* Overrides op's autocast category for this graph. APEX_ERR_INVALID_ARG for an op or category
 * outside its enum. */
APEX_API apex_status apex_graph_set_op_cast(apex_graph *g, apex_op op, apex_cast_category category);
/* Bytes held by the graph's pool (in use or cached for reuse); for tests and tuning. */
APEX_API size_t apex_graph_pool_bytes(const apex_graph *g);
/* Bytes of the pool holding this step's values, gradients and what ops saved for backward: the
 * pool minus its cached spares, released values and the current op's transient f32 copies. */
APEX_API size_t apex_graph_live_bytes(const apex_graph *g);
/* Activation memory, read after a forward: apex_graph_live_bytes plus the caller-owned values of
 * graph inputs (apex_graph_input) that a recorded op reads in backward, each storage once. These
 * too are kept alive for backward, though not by the pool: with them an f32 batch that the first
 * layer saves counts as its f16 copy does under amp. */
APEX_API size_t apex_graph_saved_bytes(const apex_graph *g);

/* ---- vars ---------------------------------------------------------------------------------------- */

/* A leaf var that takes ownership of `value` (destroyed with the var). With requires_grad, the var
 * gets a zero grad tensor of value's dtype, shape and device. NULL for a NULL value or failed
 * allocation. A leaf may be on any device; an op refuses (APEX_ERR_DEVICE, naming both devices) a
 * leaf that is not on its graph's device. */
APEX_API apex_var *apex_var_create(apex_tensor *value, int requires_grad);
/* Destroys a leaf var, its value and its grad (NULL is fine). Graph vars are owned by their graph:
 * passing one here does nothing. */
APEX_API void apex_var_destroy(apex_var *v);
/* Drops the caller's hold on a graph var's value (PyTorch's `del x`): its memory goes back to the
 * graph's pool once, in addition, no recorded backward reads it. Afterwards the value's data must
 * not be read and v may not be an op's input (APEX_ERR_STATE says it was released); v stays valid
 * otherwise (its shape, apex_backward from it, gradients through it) until apex_graph_reset. Does
 * nothing for NULL, a leaf, a var already released or one from before a reset. Under the
 * sanitizer build released memory is poisoned until reset, so a stray read is reported. */
APEX_API void apex_var_release(apex_var *v);
/* A graph var holding a view of t (no copy; t's storage must not change until the graph is reset).
 * With requires_grad the var gets a grad tensor from the pool, valid until reset. APEX_ERR_DEVICE
 * (naming both devices) when t is not on the graph's device. */
APEX_API apex_var *apex_graph_input(apex_graph *g, apex_tensor *t, int requires_grad);

/* The var accessors take NULL (the result of a failed op earlier in a chain) without crashing: they
 * return the value given with each and leave an APEX_ERR_INVALID_ARG message that keeps the earlier
 * failure's message after its own. */

/* The value (never NULL for a valid var); NULL for NULL. */
APEX_API apex_tensor *apex_var_value(const apex_var *v);
/* The grad tensor of a var that requires gradients and is a leaf or graph input; NULL otherwise. */
APEX_API apex_tensor *apex_var_grad(const apex_var *v);
/* 0 for NULL. */
APEX_API int apex_var_requires_grad(const apex_var *v);
/* The op that made v (APEX_OP_LEAF for leaves and inputs); APEX_OP_COUNT (no op) for NULL. */
APEX_API apex_op apex_var_op(const apex_var *v);
/* The graph that owns a graph var; NULL for a leaf and for NULL. */
APEX_API apex_graph *apex_var_graph(const apex_var *v);
/* Sets the grad tensor of a leaf to zero. APEX_ERR_INVALID_ARG for NULL or a var without grad. */
APEX_API apex_status apex_var_zero_grad(apex_var *v);
/* The value of a one-element var as a float (NaN with a message for NULL or another element count). */
APEX_API float apex_var_item(const apex_var *v);

/* Replaces a leaf's value by `value` (same shape, any dtype; the var takes ownership) and its grad by
 * a zero tensor of the new dtype, and returns the old value, which the caller now owns (the old grad
 * is freed). For amp, which casts a model's parameters after the model was built. NULL with a
 * message for a graph var (APEX_ERR_INVALID_ARG), another shape (APEX_ERR_SHAPE), a value on another
 * device than the old one (APEX_ERR_DEVICE), or a failed allocation (nothing changed). The new grad
 * is on the value's device. */
APEX_API apex_tensor *apex_var_swap_value(apex_var *v, apex_tensor *value);
/* 1 when the graph's autocast is on. */
APEX_API int apex_graph_autocast_enabled(const apex_graph *g);
/* Makes op fail (APEX_ERR_UNSUPPORTED, naming the safe alternative) while the graph's autocast is on
 * (banned = 1), or allows it again (0): amp bans plain binary cross-entropy under O1 as Apex does.
 * APEX_ERR_INVALID_ARG for a NULL graph or an op outside the enum. */
APEX_API apex_status apex_graph_set_op_banned(apex_graph *g, apex_op op, int banned);
/* A number the graph keeps for whoever configures its autocast: 0 at creation (and for NULL), kept
 * across resets. amp stores there the id of the apex_amp that prepared the graph, so that it
 * prepares each graph it is handed exactly once. APEX_ERR_INVALID_ARG for a NULL graph. */
APEX_API uint64_t apex_graph_config_tag(const apex_graph *g);
APEX_API apex_status apex_graph_set_config_tag(apex_graph *g, uint64_t tag);

/* ---- backward ------------------------------------------------------------------------------------ */

typedef struct apex_backward_options {
  /* The gradient of the output (same element count as the output, any dtype). NULL: the output must
   * have one element and its gradient is 1. */
  const apex_tensor *grad_output;
  /* Keep the graph for another backward before the next reset (PyTorch's retain_graph). */
  int retain_graph;
} apex_backward_options;

/* Runs backward from `out` (opts may be NULL: defaults), adding gradients into every leaf and input
 * that requires them and that `out` depends on. Errors:
 *  APEX_ERR_INVALID_ARG  NULL out, or out is a leaf;
 *  APEX_ERR_STATE        out does not require gradients (made in no-grad mode, or from nothing that
 *                        requires them), or the graph was already run backward without
 *                        retain_graph ("backward through a freed graph");
 *  APEX_ERR_SHAPE        out has more than one element and no grad_output was given, or
 *                        grad_output's element count differs from out's (message names the op that
 *                        made out and both shapes);
 *  whatever an op's backward returns (an allocation failure).
 * With APEX_BACKWARD_PROFILE=1 in the environment, the host's time in each op kind's backward is summed
 * over the process and printed to stderr at its exit (on a GPU: the time to queue each op's work). */
APEX_API apex_status apex_backward(apex_var *out, const apex_backward_options *opts);

/* Called by apex_backward once per leaf (a var from apex_var_create that requires gradients) that
 * this backward reaches, as soon as the leaf's gradient for this backward is final: right after the
 * backward of the earliest-created op that reads the leaf (backward runs in reverse creation order,
 * so no later op can add to it). At that point the leaf's grad tensor holds its final value for this
 * backward, in its own dtype (an f16/bf16 leaf is rounded into its grad tensor early, once, as at
 * the end of backward). DDP posts each gradient bucket's all-reduce from here while the rest of the
 * backward runs. A hook that returns an error stops the backward, which returns that status. */
typedef apex_status (*apex_grad_hook)(void *ctx, apex_var *leaf);
/* Installs fn (NULL removes it) for every later backward on g; ctx is passed through.
 * APEX_ERR_INVALID_ARG for a NULL graph. */
APEX_API apex_status apex_graph_set_grad_hook(apex_graph *g, apex_grad_hook fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
