/* nn_ops.h: the differentiable ops, as functions on apex_var (see autograd.h).
 *
 * Every op takes its graph first, works on f32, f16 and bf16 values, accumulates in f32 inside,
 * and gives its result in the op's declared dtype: the widest dtype among its floating inputs (f32
 * wins; f16 with bf16 gives f32) after autocast has cast them per the op's category. Losses give a
 * 0-d result unless the reduction is APEX_REDUCTION_NONE.
 *
 * Every op returns NULL on failure with a message naming the op and the shapes involved:
 * APEX_ERR_INVALID_ARG for a NULL graph or input (so a chain of ops can be checked once at the end),
 * APEX_ERR_STATE for a var from another graph step, APEX_ERR_SHAPE for shapes that do not fit
 * together (the per-op lines below say what fits), APEX_ERR_OUT_OF_MEMORY for a failed allocation.
 * Shapes are written [N, C, H, W]; "x [..., K]" means any leading dimensions. */
#ifndef APEX_NN_OPS_H
#define APEX_NN_OPS_H

#include <stdint.h>

#include "apex/autograd.h"
#include "apex/index.h"
#include "apex/kernels.h" /* apex_conv2d_options */
#include "apex/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise ----------------------------------------------------------------------------- */

/* a op b with NumPy broadcasting (trailing dimensions aligned; each pair equal or one of them 1). */
APEX_API apex_var *apex_add(apex_graph *g, apex_var *a, apex_var *b);
APEX_API apex_var *apex_sub(apex_graph *g, apex_var *a, apex_var *b);
APEX_API apex_var *apex_mul(apex_graph *g, apex_var *a, apex_var *b);
APEX_API apex_var *apex_div(apex_graph *g, apex_var *a, apex_var *b);
/* x * s for a constant s. */
APEX_API apex_var *apex_scale(apex_graph *g, apex_var *x, float s);
/* x converted to dtype (recorded: the gradient flows back converted to x's dtype). */
APEX_API apex_var *apex_cast(apex_graph *g, apex_var *x, apex_dtype dtype);

APEX_API apex_var *apex_relu(apex_graph *g, apex_var *x);
/* GELU, exact form x * Phi(x) (PyTorch approximate="none"). */
APEX_API apex_var *apex_gelu(apex_graph *g, apex_var *x);
/* GELU, tanh form (PyTorch approximate="tanh"). */
APEX_API apex_var *apex_gelu_tanh(apex_graph *g, apex_var *x);
APEX_API apex_var *apex_tanh(apex_graph *g, apex_var *x);
APEX_API apex_var *apex_sigmoid(apex_graph *g, apex_var *x);
/* e^x and the natural log, elementwise. As in PyTorch, log gives NaN for x < 0 and -Inf for 0
 * (no error: a loss scaler is what notices non-finite values). Both are in autocast's FLOAT
 * category (Apex's FP32 list): under O1 a half input runs in f32 and gives an f32 result. */
APEX_API apex_var *apex_exp(apex_graph *g, apex_var *x);
APEX_API apex_var *apex_log(apex_graph *g, apex_var *x);
/* x^p for a constant p (torch.pow(x, p)), elementwise; FLOAT category. The gradient is
 * p * x^(p-1), and 0 where p == 0, as in PyTorch; a negative x with a non-integer p gives NaN. */
APEX_API apex_var *apex_pow(apex_graph *g, apex_var *x, float p);
/* a^b elementwise with NumPy broadcasting (torch.pow(a, b)); FLOAT category, so under O1 both run
 * in f32. Gradients as PyTorch's: b a^(b-1) to a (0 where b == 0) and a^b log(a) to b (0 where
 * a == 0 and b >= 0). APEX_ERR_SHAPE when the shapes do not broadcast. */
APEX_API apex_var *apex_pow_tensor(apex_graph *g, apex_var *a, apex_var *b);

/* Comparisons a > b, a < b, a == b with NumPy broadcasting: a mask of 1.0 where the comparison holds
 * and 0.0 elsewhere, in the promoted dtype of a and b (PyTorch gives bool; a float mask multiplies
 * straight into the next op). PROMOTE category: under autocast an f16 input compared with an f32 one
 * is compared in f32, exactly (every f16 value is an f32 value). A mask is not differentiable, as in
 * PyTorch: it never requires gradients and records nothing, so apex_backward from it fails with
 * APEX_ERR_STATE, and an op that uses it (apex_mul(g, mask, x)) passes gradients to its other inputs
 * only. NaN compares false (so NaN == NaN gives 0). APEX_ERR_SHAPE when the shapes do not broadcast. */
APEX_API apex_var *apex_gt(apex_graph *g, apex_var *a, apex_var *b);
APEX_API apex_var *apex_lt(apex_graph *g, apex_var *a, apex_var *b);
APEX_API apex_var *apex_eq(apex_graph *g, apex_var *a, apex_var *b);

/* Zeroes each element with probability p and scales the rest by 1/(1-p), with a mask drawn from
 * rng (advanced as apex_rng_bernoulli does). Identity when !training or p == 0. p must be in
 * [0, 1); rng may be NULL only when the op is an identity. */
APEX_API apex_var *apex_dropout(apex_graph *g, apex_var *x, float p, int training, apex_rng *rng);

/* ---- matrix products ------------------------------------------------------------------------- */

/* a [..., M, K] @ b [K, N] or b [..., K, N] with the same leading dimensions as a; a [M, K] @ b. */
APEX_API apex_var *apex_matmul(apex_graph *g, apex_var *a, apex_var *b);
/* x [..., in] @ w^T + b, w [out, in] (PyTorch's layout), b [out] or NULL. */
APEX_API apex_var *apex_linear(apex_graph *g, apex_var *x, apex_var *w, apex_var *b);
/* gelu_tanh(x @ w^T + b) as one op (APEX_OP_LINEAR_GELU): the GELU runs in the product's epilogue (a
 * transformer's MLP; cuBLASLt's GELU_AUX_BIAS on a GPU), and the op keeps the pre-activation for its
 * backward instead of a second result. Shapes as apex_linear; autocast treats it as a linear (HALF):
 * its result has the product's dtype, the GELU computed in f32 and rounded once. On the CPU its bits
 * are those of apex_gelu_tanh(apex_linear(...)), forward and backward, when a following op reads the
 * result in that dtype (as the next linear does under autocast); on a GPU the GELU may read the f32 sum
 * before its rounding (backend/args_nn.h). */
APEX_API apex_var *apex_linear_gelu(apex_graph *g, apex_var *x, apex_var *w, apex_var *b);

/* apex_conv2d_options: kernels.h. */
/* x [N, C, H, W] conv w [O, C, KH, KW] (+ b [O] or NULL) -> [N, O, HO, WO]; opts may be NULL. */
APEX_API apex_var *apex_conv2d(apex_graph *g, apex_var *x, apex_var *w, apex_var *b, const apex_conv2d_options *opts);

typedef struct apex_pool2d_options {
  int kernel_h, kernel_w; /* required, >= 1 */
  int stride_h, stride_w; /* 0 means the kernel size (PyTorch's default) */
  int pad_h, pad_w;       /* at most half the kernel */
} apex_pool2d_options;
/* Max pooling over x [N, C, H, W]; padding never wins the max. */
APEX_API apex_var *apex_max_pool2d(apex_graph *g, apex_var *x, const apex_pool2d_options *opts);
/* Average pooling; padded zeros count in the divisor (PyTorch's count_include_pad=True). */
APEX_API apex_var *apex_avg_pool2d(apex_graph *g, apex_var *x, const apex_pool2d_options *opts);

/* ---- normalisation --------------------------------------------------------------------------- */

typedef struct apex_batch_norm_options {
  int training;    /* 1: batch statistics, and running statistics updated; 0: running statistics */
  float momentum;  /* in [0, 1]; 0 means 0.1 unless momentum_exact:
                      running = (1 - momentum) * running + momentum * batch */
  int momentum_exact; /* 1: momentum as given, 0 included (PyTorch's momentum=0 keeps the running
                         statistics as they are) */
  float eps;       /* 0 means 1e-5 */
  int relu;        /* 1: the result is relu(batch norm(x)), as one op (APEX_OP_BATCH_NORM_RELU) that
                      spares a pass over the activations each way; apex_sequential fuses a batch
                      norm followed by a ReLU this way */
} apex_batch_norm_options;
/* Batch norm over channel dimension 1 of x [N, C], [N, C, L] or [N, C, H, W]. weight and bias [C] or
 * NULL. APEX_ERR_INVALID_ARG for a momentum outside [0, 1] or an eps that is negative or not finite. running_mean and running_var are f32 tensors [C] (NULL allowed in training: no update);
 * training updates them (running_var with the unbiased batch variance) as PyTorch does. The result
 * has x's dtype whatever the parameters' (amp keeps batch norm parameters f32 on a half model). */
APEX_API apex_var *apex_batch_norm(apex_graph *g, apex_var *x, apex_var *weight, apex_var *bias,
                                   apex_tensor *running_mean, apex_tensor *running_var,
                                   const apex_batch_norm_options *opts);
/* Layer norm over the last dimension of x [..., D]; weight, bias [D] or NULL; eps 0 means 1e-5. */
APEX_API apex_var *apex_layer_norm(apex_graph *g, apex_var *x, apex_var *weight, apex_var *bias, float eps);
/* The residual add and the layer norm after it, as a transformer block runs them: returns
 * apex_layer_norm(x + r, w, b, eps) and stores x + r (an ADD result, the residual stream the block goes
 * on with) in *sum. Where x and r share shape and dtype, w and b are [D] and autocast gives the norm
 * the sum uncast, one call of the backend computes both (on a GPU one kernel; the sum rounded once to
 * the operands' dtype, then normalised as stored: the bits of the two ops, forward and backward, which
 * stay two recorded ops);
 * otherwise the two ops run in turn. Errors as theirs; APEX_ERR_INVALID_ARG for a NULL sum. *sum is
 * NULL on failure. */
APEX_API apex_var *apex_add_layer_norm(apex_graph *g, apex_var *x, apex_var *r, apex_var *w, apex_var *b, float eps, apex_var **sum);
/* Layer norm over the last norm_ndim dimensions of x, which must equal normalized_shape (PyTorch's
 * F.layer_norm(x, normalized_shape, weight, bias, eps)): mean and variance over all of them at once.
 * weight and bias have shape normalized_shape, or are NULL. APEX_ERR_INVALID_ARG for a NULL
 * normalized_shape; APEX_ERR_SHAPE when norm_ndim is not in [1, x's ndim], normalized_shape is not
 * x's trailing shape, or weight/bias has another shape. */
APEX_API apex_var *apex_layer_norm_nd(apex_graph *g, apex_var *x, int norm_ndim, const int64_t *normalized_shape,
                                      apex_var *weight, apex_var *bias, float eps);
/* x / sqrt(mean(x^2) + eps) * weight over the last dimension; weight [D] or NULL; eps 0 means 1e-5
 * (Apex FusedRMSNorm's default). */
APEX_API apex_var *apex_rms_norm(apex_graph *g, apex_var *x, apex_var *weight, float eps);
/* RMS norm over the last norm_ndim dimensions (Apex FusedRMSNorm(normalized_shape)); the mean of x^2
 * is over all of them; weight of shape normalized_shape or NULL; errors as apex_layer_norm_nd's. */
APEX_API apex_var *apex_rms_norm_nd(apex_graph *g, apex_var *x, int norm_ndim, const int64_t *normalized_shape,
                                    apex_var *weight, float eps);

/* Rows of weight [V, D] picked by ids (shape [ndim dims], each in [0, V)) -> [shape..., D]. */
APEX_API apex_var *apex_embedding(apex_graph *g, apex_var *weight, const int64_t *ids, int ndim, const int64_t *shape);
/* The same lookup with the ids of an index (index.h) on the graph's device -> [ids' shape..., D], the same
 * bits: the ids were checked when set, so only the index's bound is compared with V (APEX_ERR_INVALID_ARG
 * when it is larger), and nothing in the op goes through the host (a step that reads its batch from the
 * device, captured or not). APEX_ERR_DEVICE for an index on another device than the graph's. The op
 * copies the ids: the index may be set again once the op is recorded. */
APEX_API apex_var *apex_embedding_index(apex_graph *g, apex_var *weight, const apex_index *ids);

/* ---- softmax and losses ---------------------------------------------------------------------- */

/* Along dim (negative counts from the end). */
APEX_API apex_var *apex_softmax(apex_graph *g, apex_var *x, int dim);
APEX_API apex_var *apex_log_softmax(apex_graph *g, apex_var *x, int dim);

typedef enum apex_reduction {
  APEX_REDUCTION_MEAN = 0,
  APEX_REDUCTION_SUM,
  APEX_REDUCTION_NONE
} apex_reduction;

typedef struct apex_cross_entropy_options {
  apex_reduction reduction;
  int use_ignore_index;   /* 1: targets equal to ignore_index add nothing and do not count in the mean */
  int64_t ignore_index;
  float label_smoothing;  /* in [0, 1] */
  /* apex_linear_cross_entropy only (apex_cross_entropy refuses a nonzero value): whether the forward
   * also writes the logits' gradient over them, for a gradient of 1 on the loss, in the logits' dtype, so
   * that the backward's head products read it and scale by the loss's real gradient (llm.c's fused
   * classifier: the logits cross memory once each way). 0: on for a graph on a GPU whose logits are bf16
   * or f32, off on the CPU (whose backward keeps the gradient in f32, as before); 1: on; -1: off. f16 logits
   * never take it (f16's range cannot hold a gradient made before its loss scale): 1 with f16 logits is
   * APEX_ERR_INVALID_ARG. */
  int one_pass;
} apex_cross_entropy_options;
/* Cross entropy of logits [N, C] against class indices targets[N] (each in [0, C) unless ignored);
 * opts may be NULL. Reduction NONE gives [N]. APEX_ERR_INVALID_ARG for a target out of range. */
APEX_API apex_var *apex_cross_entropy(apex_graph *g, apex_var *logits, const int64_t *targets,
                                      const apex_cross_entropy_options *opts);
/* The same with the targets of an index of N values on the graph's device, the same bits. Its bound must be
 * at most C (APEX_ERR_INVALID_ARG), its element count N (APEX_ERR_SHAPE), and opts may not ignore targets
 * (APEX_ERR_INVALID_ARG: the mean would need their count, a read of the device). The op copies them. */
APEX_API apex_var *apex_cross_entropy_index(apex_graph *g, apex_var *logits, const apex_index *targets,
                                            const apex_cross_entropy_options *opts);
/* A classifier head and its loss as one op (APEX_OP_LINEAR_CROSS_ENTROPY): cross entropy of the logits
 * x w^T (x [N, C], w [V, C], no bias: a language model's head, tied or not) against targets[N] (each in
 * [0, V) unless ignored), reduced by MEAN or SUM (opts; NULL: MEAN); the result is f32 [], whatever
 * the product's dtype. The logits are kept in the product's dtype (autocast treats the op as a linear,
 * HALF) and never widened whole. Their gradient:
 *   - one pass (opts->one_pass; the default on a GPU): written over the logits by the forward's loss
 *     kernel, in their dtype, and read by one backward product each for x and w, scaled there by the
 *     loss's gradient. For a power-of-two loss gradient (1, a loss scale) the bits are those of the
 *     two-pass road with the logits' gradient kept in their dtype (a graph with half gradients);
 *   - two passes (the default on the CPU): made by the backward chunk_rows rows at a time (0: as many
 *     rows as fit in 32 MiB on the CPU, 256 MiB on a GPU) and fed to the head's products at once, so the
 *     [N, V] f32 gradient of apex_linear + apex_cross_entropy never exists. With one chunk the bits are
 *     those of apex_cross_entropy(apex_linear(x, w, NULL)); with more, w's gradient adds the chunks'
 *     products in turn (ops_classifier.c).
 * APEX_ERR_SHAPE for shapes that do not fit, APEX_ERR_INVALID_ARG for a target out of range, reduction
 * NONE (use the two ops), a negative chunk_rows or a one_pass the logits cannot take. */
APEX_API apex_var *apex_linear_cross_entropy(apex_graph *g, apex_var *x, apex_var *w, const int64_t *targets,
                                             const apex_cross_entropy_options *opts, int64_t chunk_rows);
/* The same with the targets of an index, as apex_cross_entropy_index takes them; the same bits. */
APEX_API apex_var *apex_linear_cross_entropy_index(apex_graph *g, apex_var *x, apex_var *w, const apex_index *targets,
                                                   const apex_cross_entropy_options *opts, int64_t chunk_rows);
/* (x - y)^2 reduced; x and y of the same shape. */
APEX_API apex_var *apex_mse_loss(apex_graph *g, apex_var *x, apex_var *y, apex_reduction reduction);
/* Binary cross entropy of sigmoid(x) against targets y in [0, 1], computed stably from the logits. */
APEX_API apex_var *apex_bce_with_logits(apex_graph *g, apex_var *x, apex_var *y, apex_reduction reduction);
/* Binary cross entropy of probabilities p in [0, 1] against y; each log is clamped at -100 as
 * PyTorch does. APEX_ERR_INVALID_ARG for a p outside [0, 1] (NaN passes, for the loss scaler). */
APEX_API apex_var *apex_bce(apex_graph *g, apex_var *p, apex_var *y, apex_reduction reduction);

/* ---- reductions and shapes ------------------------------------------------------------------- */

/* Sum / mean of all elements -> 0-d. */
APEX_API apex_var *apex_sum_all(apex_graph *g, apex_var *x);
APEX_API apex_var *apex_mean_all(apex_graph *g, apex_var *x);
/* Sum / mean along dim, keeping it as size 1 when keepdim. */
APEX_API apex_var *apex_sum(apex_graph *g, apex_var *x, int dim, int keepdim);
APEX_API apex_var *apex_mean(apex_graph *g, apex_var *x, int dim, int keepdim);
/* The L2 norm sqrt(sum x^2) of all elements -> 0-d (torch.linalg.vector_norm(x)), or along dim
 * keeping it as size 1 when keepdim (torch.norm(x, 2, dim, keepdim)). FLOAT category; the squares are
 * summed in double whatever x's dtype. The gradient is x / norm, and 0 where the norm is 0 (as
 * PyTorch's). APEX_ERR_SHAPE for a dim out of range. */
APEX_API apex_var *apex_norm_all(apex_graph *g, apex_var *x);
APEX_API apex_var *apex_norm(apex_graph *g, apex_var *x, int dim, int keepdim);
/* Same elements, another shape; one entry may be -1 (inferred). A view: no copy. */
APEX_API apex_var *apex_reshape(apex_graph *g, apex_var *x, int ndim, const int64_t *shape);
/* Dimensions reordered: result dim i is x's dim perm[i] (a copy, contiguous). */
APEX_API apex_var *apex_permute(apex_graph *g, apex_var *x, const int *perm);
APEX_API apex_var *apex_transpose(apex_graph *g, apex_var *x, int dim0, int dim1);
/* n >= 1 vars (any number) joined along dim (negative counts from the end); every other dimension
 * must equal input 0's. Mixed dtypes promote as every op's do (f16 with bf16 or f32 gives f32), like
 * torch.cat. APEX_ERR_INVALID_ARG for an empty list; APEX_ERR_SHAPE naming the input that does not fit. */
APEX_API apex_var *apex_concat(apex_graph *g, int n, apex_var *const *xs, int dim);

/* Causal scaled-dot-product attention: softmax(q k^T / sqrt(D) + causal mask) v for q, k, v
 * [B, H, T, D] (or [..., T, D] with equal shapes) -> [B, H, T, D]. */
APEX_API apex_var *apex_causal_attention(apex_graph *g, apex_var *q, apex_var *k, apex_var *v);
/* The same attention with n_heads heads side by side in each row: q, k, v [B, T, n_heads * D] (or
 * [..., T, n_heads * D], equal shapes), as the q, k and v linears of a transformer make them ->
 * [B, T, n_heads * D], the heads side by side again (ready for the output projection). Each head reads
 * its D columns in place, so no [B, H, T, D] copies are made forward or backward; the result is
 * apex_causal_attention's of the heads split out. APEX_ERR_SHAPE when n_heads does not divide the rows
 * or the shapes differ. */
APEX_API apex_var *apex_causal_attention_heads(apex_graph *g, apex_var *q, apex_var *k, apex_var *v, int n_heads);
/* The same attention on q, k and v packed in one tensor: qkv [B, T, 3 * n_heads * D] (or [..., T, 3 *
 * n_heads * D]) holds q, k and v as the thirds of each row, as one linear with the three weights
 * stacked ([3 * C, C], GPT-2's c_attn) makes them -> [B, T, n_heads * D]. Each head reads its columns
 * in place, and the backward writes q's, k's and v's gradients into the thirds of qkv's, so a joint
 * q/k/v product needs no split; the result and the gradients have apex_causal_attention_heads's bits
 * on the thirds. APEX_ERR_SHAPE when the last dimension is not a multiple of 3 or n_heads does not
 * divide its third. */
APEX_API apex_var *apex_causal_attention_qkv(apex_graph *g, apex_var *qkv, int n_heads);

#ifdef __cplusplus
}
#endif
#endif
