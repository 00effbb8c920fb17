/* args_nn.h: the argument structs of the nn slots (backend.h): the kernels behind autograd's ops,
 * forward and backward.
 *
 * autograd's fronts check shapes and dtypes, apply autocast and record the graph; a slot receives
 * only valid buffers on its backend's device. Buffers named as float are f32 (the front widens a
 * low-precision value to f32 before the call and narrows a result after it); a buffer whose dtype the
 * kernel reads itself comes with its apex_dtype. Shapes are element counts and extents.
 *
 * Gradient outputs: g<name> is NULL when that input needs no gradient. accumulate_<name> 1 adds the
 * kernel's term into the buffer; 0 means the buffer holds nothing yet and the kernel stores 0.0f +
 * term (the bits of adding into zeros, -0 included), which saves the pass that zeroes it.
 *
 * Gradient dtypes: a slot whose struct names gout_dtype and g<name>_dtype takes gout and those
 * gradients in any float dtype (f32, f16, bf16; the zero value is f32). A graph that keeps the
 * gradients of its f16/bf16 values in their own dtype (apex_graph_set_grad_dtype) hands them over as
 * stored; the kernel computes in f32 from the widened gout and rounds each gradient it lands once, to
 * its buffer's dtype (dst + term, or 0.0f + term, in f32). Every other gradient pointer is f32.
 * backend/grad_dtype.h runs an f32 kernel under this contract for a backend without a direct path. */
#ifndef APEX_BACKEND_ARGS_NN_H
#define APEX_BACKEND_ARGS_NN_H

#include <stddef.h>
#include <stdint.h>

#include "apex/tensor.h"

/* Transient memory a kernel asks for while it runs, where its size depends on the plan the kernel
 * makes (a product's tile grid, its thread count): get returns `bytes` on the slot's device, valid until
 * the kernel returns (on a GPU: until work queued after the call; the stream orders its reuse), or NULL
 * after a message, and the kernel then returns APEX_ERR_OUT_OF_MEMORY. autograd lends the graph's pool
 * (the same blocks step after step, and a captured step's); a NULL get means none is lent. */
typedef struct apex_nn_workspace {
  void *(*get)(void *ctx, size_t bytes);
  void *ctx;
} apex_nn_workspace;

/* A tensor's elements as stored, in its own dtype (any float dtype; row-major): what a kernel that
 * reads native dtypes takes, and what the CPU's kernels widen to f32 themselves. */
typedef struct apex_nn_buf {
  const void *data;
  apex_dtype dtype;
} apex_nn_buf;

/* ---- elementwise (cpu/elementwise.c, cuda/elementwise.cu) ------------------------------------- */

typedef enum apex_nn_binary_kind {
  APEX_NN_ADD, APEX_NN_SUB, APEX_NN_MUL, APEX_NN_DIV, APEX_NN_POW, APEX_NN_GT, APEX_NN_LT, APEX_NN_EQ
} apex_nn_binary_kind;

/* A broadcast of two operands walked as rows of the output's last dimension: each row has one base
 * offset per operand, and within a row an operand either moves with the output (stride 1) or repeats
 * one element (stride 0). */
typedef struct apex_nn_bcast {
  int nd;
  int64_t shape[APEX_MAX_DIMS];  /* the output's */
  int64_t st[2][APEX_MAX_DIMS];  /* element strides of a and b in the output's index space */
  size_t rows, len;              /* rows x len = the output's element count */
} apex_nn_bcast;

/* out = a (kind) b over the broadcast, computed in f32 from the native operands (numel_a, numel_b
 * elements) and rounded to out_dtype; comparisons give 1.0f or 0.0f. ws as unary's. */
typedef struct apex_nn_binary_args {
  apex_nn_binary_kind kind;
  const apex_nn_bcast *plan;
  apex_nn_buf a, b;
  size_t numel_a, numel_b;
  void *out;
  apex_dtype out_dtype;
  apex_nn_workspace ws;
} apex_nn_binary_args;

/* ga, gb += gout * d(out)/d(a), d(out)/d(b), summed over broadcast positions in row order. a and b
 * (native, widened as the forward's) are read only by MUL, DIV and POW (no data otherwise). Not for
 * comparisons, which have no gradient. */
typedef struct apex_nn_binary_bwd_args {
  apex_nn_binary_kind kind;
  const apex_nn_bcast *plan;
  apex_nn_buf a, b;
  size_t numel_a, numel_b;       /* the operands' element counts */
  const void *gout;              /* plan's rows x len */
  void *ga, *gb;
  apex_dtype gout_dtype, ga_dtype, gb_dtype;
  int accumulate_a, accumulate_b;
  apex_nn_workspace ws;
} apex_nn_binary_bwd_args;

typedef enum apex_nn_unary_kind {
  APEX_NN_RELU, APEX_NN_GELU, APEX_NN_GELU_TANH, APEX_NN_TANH, APEX_NN_SIGMOID, APEX_NN_EXP, APEX_NN_LOG,
  APEX_NN_POW_SCALAR
} apex_nn_unary_kind;

/* out = kind(x) over n elements, computed in f32 from the native x and rounded to out_dtype; POW_SCALAR
 * raises to p (2 and 0.5 exactly rounded, as PyTorch). ws: transient memory a backend may use (the
 * CPU's widens on its stack and takes none). */
typedef struct apex_nn_unary_args {
  apex_nn_unary_kind kind;
  size_t n;
  apex_nn_buf x;
  void *out;
  apex_dtype out_dtype;
  float p;
  apex_nn_workspace ws;
} apex_nn_unary_args;

/* gx += gout * kind'(x). RELU reads its output y (y_dtype, raw: non-zero exactly where x > 0) instead
 * of x; every other kind reads x (native, widened as the forward's). */
typedef struct apex_nn_unary_bwd_args {
  apex_nn_unary_kind kind;
  size_t n;
  apex_nn_buf x;
  const void *y;
  apex_dtype y_dtype;
  float p;
  const void *gout;
  void *gx;
  apex_dtype gout_dtype, gx_dtype;
  int accumulate_x;
  apex_nn_workspace ws;
} apex_nn_unary_bwd_args;

/* out = x * s (native x, f32 product rounded to out_dtype, as unary's); backward gx += gout * s. */
typedef struct apex_nn_scale_args {
  size_t n;
  apex_nn_buf x;
  void *out;
  apex_dtype out_dtype;
  float s;
  apex_nn_workspace ws;
} apex_nn_scale_args;

typedef struct apex_nn_scale_bwd_args {
  size_t n;
  const void *gout;
  void *gx;
  apex_dtype gout_dtype, gx_dtype;
  float s;
  int accumulate_x;
} apex_nn_scale_bwd_args;

/* out (out_dtype) = mask ? x * s : 0, in f32 from the native x. The forward draws the mask itself, one
 * byte per element on the backend's device: mask[i] = the Bernoulli draw i (keep probability `keep`)
 * of the generator at (seed, offset), exactly apex_rng_bernoulli's (Philox is counter-based, so every
 * backend computes the same mask from the same generator). The caller advances its generator by
 * ceil(n / 4) blocks. The backward reads the mask on gout. */
typedef struct apex_nn_dropout_args {
  size_t n;
  uint8_t *mask;
  uint64_t seed, offset;
  float keep;
  apex_nn_buf x;
  void *out;
  apex_dtype out_dtype;
  float s;
} apex_nn_dropout_args;

typedef struct apex_nn_dropout_bwd_args {
  size_t n;
  const uint8_t *mask;
  const void *gout;
  void *gx;
  apex_dtype gout_dtype, gx_dtype;
  float s;
  int accumulate_x;
} apex_nn_dropout_bwd_args;

/* ---- softmax and the losses (cpu/loss.c, cuda/xent.cu) ------------------------------------------ */

/* x (native dtype) seen as [outer, dim, inner]: each of the outer * inner lines of dim elements is one
 * softmax (log softmax with log set), computed in f32 into out. */
typedef struct apex_nn_softmax_args {
  int log;
  size_t outer, dim, inner;
  apex_nn_buf x;
  float *out;
  void *out_cast; /* when not NULL, out rounded to cast_dtype as well (the op's value when not f32) */
  apex_dtype cast_dtype;
  apex_nn_workspace ws;
} apex_nn_softmax_args;

/* gx += the gradient through the softmax, from its f32 result y. */
typedef struct apex_nn_softmax_bwd_args {
  int log;
  size_t outer, dim, inner;
  const float *y;
  const float *gout;
  float *gx;
  int accumulate_x;
} apex_nn_softmax_bwd_args;

/* How a loss's per-element terms became its result, for the gradient of term i: gout[i] for NONE,
 * gout[0] for SUM, gout[0] / count for MEAN. */
typedef enum apex_nn_reduction { APEX_NN_MEAN, APEX_NN_SUM, APEX_NN_NONE } apex_nn_reduction;

/* Cross entropy of logits x [rows, classes] against target (one class per row, an int64 array in the
 * backend's device memory; -1: ignored, its term 0; the front checked the rest against classes) with
 * label smoothing: loss receives the per-row terms (f32), and stats each row's max m
 * and r = 1 / sum of exp(x - m) (rows x 2 floats), from which and x the backward recomputes the
 * softmax p = exp(x - m) * r with the forward's bits. The row softmax is never kept. A reduced loss:
 * sum (when not NULL) receives the terms' sum in double, in fixed blocks, and result (when not NULL)
 * (float)(sum / divisor) (MEAN's count, 1 for SUM; 0 / 0 is NaN) as one value of result_dtype. Every
 * buffer is the backend's device memory.
 *
 * The one-pass classifier (llm.c's fused classifier): with gx set, the same call also writes the
 * gradient of the reduced loss for a gradient of 1 on it, in x's dtype (gx may be x.data itself: each
 * row is read whole before it is written), with the bits of nn_cross_entropy_bwd into a fresh gx with
 * gout 1 and count = divisor: 0.0f + w (p - e / C - (1 - e at the target)), w = (float)(1 / divisor),
 * rounded once; an ignored row gets zeros. So the logits are read for the loss and rewritten as their
 * gradient in one kernel, and the backward's consumer scales by the real gradient of the result
 * (nn_linear_bwd's gout_scale): for a power-of-two gradient (1, a loss scale) that scaling is exact. */
typedef struct apex_nn_cross_entropy_args {
  size_t rows, classes;
  apex_nn_buf x; /* native dtype, widened to f32 a row at a time */
  const int64_t *target;
  float smoothing;
  float *stats;
  float *loss;
  double *sum;
  void *result;
  apex_dtype result_dtype;
  double divisor;
  void *gx; /* NULL, or the one-pass gradient [rows, classes] in x's dtype (above) */
  apex_nn_workspace ws;
} apex_nn_cross_entropy_args;

/* The gradient, from x and the forward's stats. */
typedef struct apex_nn_cross_entropy_bwd_args {
  size_t rows, classes;
  apex_nn_buf x;      /* the forward's logits, native dtype */
  const float *stats; /* the forward's */
  const int64_t *target;
  float smoothing;
  apex_nn_reduction reduction;
  double count; /* MEAN's divisor: the rows with a target */
  const float *gout;
  void *gx;
  apex_dtype gx_dtype;
  int accumulate_x;
  apex_nn_workspace ws;
} apex_nn_cross_entropy_bwd_args;

typedef enum apex_nn_pointwise_loss_kind { APEX_NN_MSE, APEX_NN_BCE_WITH_LOGITS, APEX_NN_BCE } apex_nn_pointwise_loss_kind;

/* Per-element terms of input x against target y (n each), computed in f32: into loss (when not
 * NULL) as loss_dtype, rounded once, and/or their sum into *sum (when not NULL) as for cross entropy,
 * and/or result (when not NULL) (float)(sum / divisor) (MEAN's count, 1 for SUM) as one value of
 * result_dtype, rounded as apex_tensor_set does. No whole-tensor f32 buffer is needed for any. Every
 * buffer is the backend's device memory, so a reduced loss on a GPU is written there and nobody waits. */
typedef struct apex_nn_pointwise_loss_args {
  apex_nn_pointwise_loss_kind kind;
  size_t n;
  apex_nn_buf x, y; /* native dtypes, widened to f32 a block at a time */
  void *loss;
  apex_dtype loss_dtype;
  double *sum;
  void *result;
  apex_dtype result_dtype;
  double divisor;
} apex_nn_pointwise_loss_args;

typedef struct apex_nn_pointwise_loss_bwd_args {
  apex_nn_pointwise_loss_kind kind;
  size_t n;
  apex_nn_buf x, y;
  apex_nn_reduction reduction;
  double count; /* MEAN's divisor */
  const float *gout;
  float *gx, *gy;
  int accumulate_x, accumulate_y;
} apex_nn_pointwise_loss_bwd_args;

/* ---- normalisation (cpu/norm.c, cuda/norm.cu, cuda/bn_stats.cu) ------------------------------------ */

/* Batch norm of x [N, C, S] (S: the flattened spatial extent; native dtype) into out (out_dtype,
 * computed in f32 and rounded once), per channel c: (x - mean) * rstd * w + b (w, b NULL: 1, 0), through max(v, 0) with relu. The statistics used are
 * written to stats (mean[C], then rstd[C]) for the backward. Where they come from:
 *   - given_mean set: given_mean, given_rstd and given_var (the unbiased variance, f32 [C] each, on the
 *     backend's device like every other buffer) computed elsewhere (a statistics hook over a larger
 *     batch); the running statistics (when set) move toward them;
 *   - else training: this batch's, with rstd = 1 / sqrt(var + eps) and the running statistics (when
 *     set) moved toward the mean and the unbiased variance by momentum;
 *   - else running_mean and running_var themselves. */
typedef struct apex_nn_batch_norm_args {
  size_t N, C, S;
  apex_nn_buf x;
  const float *w, *b;
  void *out;
  apex_dtype out_dtype;
  float *stats;
  int training, relu;
  float eps, momentum;
  float *running_mean, *running_var;
  const float *given_mean, *given_rstd, *given_var;
  apex_nn_workspace ws;
  /* The statistics-only mode (apex_kernel_batch_norm_stats): with out NULL, training and no given
   * statistics, the op writes this batch's per-channel mean into stats' first half, its biased variance
   * into batch_var and, when set, the sum of squared deviations M2 into batch_m2 (f32 [C] each: the
   * triples SyncBatchNorm merges across ranks), and nothing else. NULL otherwise. */
  float *batch_var, *batch_m2;
} apex_nn_batch_norm_args;

/* The backward of batch norm from its statistics (stats as the forward wrote them). With relu (the
 * fused op) the gradient first passes the output's mask: y is the output (y_dtype; read only when it is
 * not f32, where the mask is recomputed from x). gw, gb receive the per-channel sums of gout * xhat
 * and gout. */
typedef struct apex_nn_batch_norm_bwd_args {
  size_t N, C, S;
  apex_nn_buf x;
  const float *w, *b;
  const void *y;
  apex_dtype y_dtype;
  const float *stats;
  int training, relu;
  const float *gout;
  float *gx, *gw, *gb;
  int accumulate_x, accumulate_w, accumulate_b;
  apex_nn_workspace ws;
} apex_nn_batch_norm_bwd_args;

/* The first half of a batch norm backward whose statistics came from elsewhere: per-channel sums of
 * gout and of gout * xhat (f64 in order) into sums (f32 [2C]), also added to gb and gw. */
typedef struct apex_nn_batch_norm_sums_args {
  size_t N, C, S;
  apex_nn_buf x;
  const float *mean, *rstd;
  const float *gout;
  float *sums;
  float *gw, *gb;
  int accumulate_w, accumulate_b;
  apex_nn_workspace ws;
} apex_nn_batch_norm_sums_args;

/* Its second half: gx from the sums over the whole batch of `count` values per channel. */
typedef struct apex_nn_batch_norm_dx_args {
  size_t N, C, S;
  apex_nn_buf x;
  const float *w, *mean, *rstd;
  const float *gout;
  const float *sums;
  int64_t count;
  float *gx;
  int accumulate_x;
  apex_nn_workspace ws;
} apex_nn_batch_norm_dx_args;

/* Layer norm (centre: subtract the row mean, add b) or RMS norm of each of R rows of D: out =
 * (x - mean) * rstd * w + b, with rstd = 1 / sqrt(mean of squares + eps), computed in f32 from the
 * native x, w, b (w, b data NULL: 1, 0) and rounded to out_dtype; stats (f32) receives mean[R] then
 * rstd[R]. ws: the f32 rows (and weights) that a kernel widens into. */
typedef struct apex_nn_row_norm_args {
  int centre;
  size_t rows, cols;
  apex_nn_buf x, w, b;
  void *out;
  apex_dtype out_dtype;
  float *stats;
  float eps;
  /* The residual add in front of the norm (apex_add_layer_norm): with x2.data set, the rows normalised
   * are x + x2 (x2 of x's shape and dtype), summed in f32 and rounded once to x's dtype as the binary
   * slot's ADD rounds it, and stored into xsum (x's dtype, may be x or x2) as well: the transformer's
   * residual stream and its next norm from one pass over the rows. */
  apex_nn_buf x2;
  void *xsum;
  apex_nn_workspace ws;
} apex_nn_row_norm_args;

/* a's norm with its residual add done: the same arguments reading xsum (where the add stored x + x2) as
 * x, and no x2. A backend whose kernel does not fuse the add runs it, then the norm of this. */
static inline apex_nn_row_norm_args apex__row_norm_of_sum(const apex_nn_row_norm_args *a) {
  apex_nn_row_norm_args c = *a;
  c.x = (apex_nn_buf){a->xsum, a->x.dtype};
  c.x2 = (apex_nn_buf){NULL, APEX_F32};
  c.xsum = NULL;
  return c;
}

/* Its backward from the native x and w (as the forward's); gw (when set) needs workspace of rows *
 * cols floats for gout * xhat; ws as the forward's. */
typedef struct apex_nn_row_norm_bwd_args {
  int centre;
  size_t rows, cols;
  apex_nn_buf x, w;
  const float *stats;
  const void *gout;
  void *gx;
  apex_dtype gout_dtype, gx_dtype;
  float *gw, *gb;
  int accumulate_x, accumulate_w, accumulate_b;
  float *workspace;
  size_t workspace_bytes;
  apex_nn_workspace ws;
} apex_nn_row_norm_bwd_args;

/* ---- reductions, layout and lookups (cpu/shape.c, cuda/embedding.cu) --------------------------------- */

/* x seen as [outer, dim, inner]: out[l] for each of the outer * inner lines of dim elements is its sum
 * times scale (SUM; mean is scale 1 / dim) or its L2 norm (NORM, scale unused; norms receives the
 * same f32 values, kept for the backward). x is read in its own dtype (f16 and bf16 widen exactly, so
 * the sums are those of its f32 values). Sums run in double in order; a single line over the whole
 * tensor in fixed blocks of 4096, so no bits depend on the thread count. */
typedef enum apex_nn_reduce_kind { APEX_NN_REDUCE_SUM, APEX_NN_REDUCE_NORM } apex_nn_reduce_kind;

typedef struct apex_nn_reduce_args {
  apex_nn_reduce_kind kind;
  size_t outer, dim, inner;
  double scale;
  apex_nn_buf x;
  float *out;
  float *norms;
} apex_nn_reduce_args;

/* gx (outer * dim * inner) += gout of its line times scale (SUM) or times x / norm, 0 where the norm is
 * 0 (NORM: x, in its own dtype, and norms read). */
typedef struct apex_nn_reduce_bwd_args {
  apex_nn_reduce_kind kind;
  size_t outer, dim, inner;
  float scale;
  apex_nn_buf x;
  const float *norms;
  const float *gout;
  float *gx;
  int accumulate_x;
} apex_nn_reduce_bwd_args;

/* out (shape [ndim], n elements) = x permuted: output element at index i reads x at sum_d i_d *
 * strides[d] (the input's element strides in the output's dimension order). x and out are of dtype
 * and their elements are moved as they are, never converted. */
typedef struct apex_nn_permute_args {
  int ndim;
  int64_t shape[APEX_MAX_DIMS];
  int64_t strides[APEX_MAX_DIMS];
  size_t n;
  const void *x;
  void *out;
  apex_dtype dtype;
} apex_nn_permute_args;

/* gx += gout permuted back (the forward's shape and strides). */
typedef struct apex_nn_permute_bwd_args {
  int ndim;
  int64_t shape[APEX_MAX_DIMS];
  int64_t strides[APEX_MAX_DIMS];
  size_t n;
  const float *gout;
  float *gx;
  int accumulate_x;
} apex_nn_permute_bwd_args;

/* out [outer, row] of out_dtype = the n inputs side by side: input k gives width[k] elements of each
 * of the outer rows (x[k] of x_dtype[k], converted as apex_convert does). The lists x, x_dtype and
 * width are host arrays (the slot reads them to launch), the buffers they point to device memory. */
typedef struct apex_nn_concat_args {
  int n;
  size_t outer, row;
  const void *const *x;
  const apex_dtype *x_dtype;
  const size_t *width;
  void *out;
  apex_dtype out_dtype;
} apex_nn_concat_args;

/* gx[k] (NULL: not wanted) += its columns of gout. width, gx and accumulate are host arrays. */
typedef struct apex_nn_concat_bwd_args {
  int n;
  size_t outer, row;
  const size_t *width;
  const float *gout;
  float *const *gx;
  const int *accumulate;
} apex_nn_concat_bwd_args;

/* out [n, dim] = rows ids[i] of w [V, dim] (the same dtype, copied as bytes). The ids are in host memory
 * unless ids_on_device (then in the device's, as an apex_index keeps them, for a step that reads nothing
 * from the host); either way the front has checked them against V. */
typedef struct apex_nn_embedding_args {
  size_t n, dim;
  const int64_t *ids;
  int ids_on_device;
  const void *w;
  apex_dtype dtype;
  void *out;
} apex_nn_embedding_args;

/* gw row ids[i] += gout row i, in order of i (so a repeated id's terms add in a fixed order). */
typedef struct apex_nn_embedding_bwd_args {
  size_t n, dim, rows;
  const int64_t *ids;
  int ids_on_device; /* as the forward's */
  const void *gout;
  apex_dtype gout_dtype;
  float *gw;
  int accumulate_w;
  apex_nn_workspace ws;
} apex_nn_embedding_bwd_args;

/* ---- products (cpu/linear.c on cpu/gemm.c, cuda/gemm.cu) -------------------------------------------- */

/* What a raw product (apex_kernel_matmul, kernels.h) adds to autograd's: transposed operands, scaling,
 * accumulation into the output, a bias and a GELU epilogue. Per batch entry, out = gelu?(alpha * op(a)
 * op(b) + beta * out + bias), in f32 and rounded once to out_dtype; out is read (in out_dtype) only when
 * beta is not 0. */
typedef struct apex_nn_gemm_ext {
  int trans_a, trans_b; /* a stored [k, m], b stored [n, k] (each batch entry) */
  float alpha, beta;
  apex_nn_buf bias; /* [n], any float dtype, added to every row (data NULL: none) */
  int gelu;         /* then GELU in the tanh form, with apex_gelu_tanh's CPU bits */
} apex_nn_gemm_ext;

/* out [batch][m, n] (out_dtype) = a [batch][m, k] b [k, n] (b_batched: [batch][k, n]), accumulated in
 * f32. ext (NULL for autograd's plain product) widens it to apex_nn_gemm_ext's. */
typedef struct apex_nn_matmul_args {
  size_t batch;
  int m, n, k;
  apex_nn_buf a, b;
  int b_batched;
  void *out;
  apex_dtype out_dtype;
  apex_nn_workspace ws;
  const apex_nn_gemm_ext *ext;
} apex_nn_matmul_args;

/* ga += gout b^T, gb += a^T gout, per batch entry (gout, ga, gb f32). accumulate 0 writes the product
 * alone (beta 0). */
typedef struct apex_nn_matmul_bwd_args {
  size_t batch;
  int m, n, k;
  apex_nn_buf a, b;
  int b_batched;
  const float *gout;
  float *ga, *gb;
  int accumulate_a, accumulate_b;
  apex_nn_workspace ws;
} apex_nn_matmul_bwd_args;

/* out [m, n] (out_dtype) = x [m, k] w^T (w [n, k]) + bias ([n], as stored, any float dtype; data NULL:
 * none), summed in f32.
 *
 * With gelu set, the GELU epilogue of a transformer's MLP (apex_linear_gelu): pre [m, n] (out_dtype)
 * receives that sum, rounded once, and out = gelu_tanh(pre), rounded once to out_dtype; the backward
 * reads pre. A backend takes GELU of pre as stored (the CPU: the bits of a linear then apex_gelu_tanh)
 * or of the f32 sum before its rounding (cuBLASLt's GELU_AUX_BIAS epilogue): the two differ by at most
 * GELU's slope (under 1.13) times half an ulp of pre, then out's own rounding. */
typedef struct apex_nn_linear_args {
  int m, n, k;
  apex_nn_buf x, w, bias;
  void *out;
  apex_dtype out_dtype;
  int gelu;
  void *pre;
  apex_nn_workspace ws;
} apex_nn_linear_args;

/* gx += gout w, gw += gout^T x, gb += the column sums of gout (in row order). With gelu set, gout is
 * the gradient of the GELU epilogue's output: the kernel first forms gpre = 0.0f + gout * gelu_tanh'(pre)
 * in f32 (the unary slot's GELU backward, from pre as the forward stored it; rounded to gout_dtype when
 * that is not f32, as that backward would land it in pre's gradient) and runs the products and the column
 * sums on gpre, so the results are those of apex_gelu_tanh's backward followed by the linear's.
 *
 * With dgelu_pre set, x is the output of a GELU epilogue (the previous layer's apex_linear_gelu, whose
 * pre-activation dgelu_pre [m, k] is, as its forward stored it) and gx receives the gradient of that
 * pre-activation instead of x's: gpre = (gout w) * gelu_tanh'(dgelu_pre). gx must hold nothing yet
 * (accumulate_x 0, gx set): it is the gradient of the previous layer's pre-activation, which no other op
 * adds to. dgelu_gb, when set, receives the column sums of gpre (the previous layer's bias gradient, f32
 * [k]) by the accumulate_dgelu_gb rule. The CPU forms gout w as without dgelu (rounded to gx_dtype, as it
 * would land in x's gradient), then gpre as the unary slot's GELU backward from it (rounded to gx_dtype),
 * then the column sums of gpre as stored, as gb's: the bits of this linear's backward, apex_gelu_tanh's and
 * the previous linear's column sums run apart. The CUDA backend's epilogue (cuBLASLt's DGELU, for half
 * operands, gx and dgelu_pre of one dtype) takes gelu_tanh' times the f32 product before its rounding:
 * with u gx_dtype's unit roundoff, |gout w| |gelu_tanh'| u = |gpre| u, so each element of gpre is within
 * 3u |gpre| of the CPU's (that, then each side's own rounding), and the column sums within the sum of
 * those over the rows (the epilogue's BGRAD sums the unrounded elements). */
typedef struct apex_nn_linear_bwd_args {
  int m, n, k;
  apex_nn_buf x, w;
  const void *gout;
  /* NULL, or one f32 in the backend's memory by which gout is multiplied: the products take
   * gout_scale * gout (the scaling applied to each product's f32 sum, as a GEMM's alpha), so that a
   * gradient made before its scale was known (the one-pass classifier's) needs no pass of its own.
   * Not with gb (APEX_ERR_INVALID_ARG on every backend). */
  const float *gout_scale;
  void *gx;
  apex_dtype gout_dtype, gx_dtype;
  float *gw, *gb;
  int accumulate_x, accumulate_w, accumulate_b;
  int gelu;
  apex_nn_buf pre;
  apex_nn_buf dgelu_pre;
  float *dgelu_gb;
  int accumulate_dgelu_gb;
  apex_nn_workspace ws;
} apex_nn_linear_bwd_args;

/* ---- attention (cpu/attention.c, cuda/attention.cu) --------------------------------------------------- */

/* Causal scaled-dot-product attention, heads read in place: element (b, h, i, j) of q sits at
 * q.data + ((b * t + i) * ld_q + h * d + j) (likewise k, v, out with their own ld). The packed qkv
 * [B, T, 3C] of GPT is q = qkv, k = qkv + C, v = qkv + 2C, ld = 3C, heads = H, d = C / H; a contiguous
 * [B*H, T, d] tensor is batch = B*H, heads = 1, ld = d. Per head, S = q k^T / sqrt(d) masked above the
 * diagonal, P = softmax(S) row by row in f32, out (out_dtype) = P v. q, k, v are read as stored (any
 * float dtype). */
typedef struct apex_nn_attention_args {
  size_t batch;
  int heads, t, d;
  apex_nn_buf q, k, v;
  size_t ld_q, ld_k, ld_v, ld_out; /* row strides, in elements */
  float *stats; /* [batch, heads, t, 2] f32, kept for the backward: per query row a pair (m, r) whose
                   m - log r is the log-sum-exp of the scaled masked scores, which is all a backward reads
                   (P = exp(s - m) r). The CPU and apex's own kernels keep m = the row max and r = 1 / sum_j
                   exp(s_j - m); cuDNN's fused attention keeps (m, r) = (log-sum-exp, 1). P is never kept:
                   the backward recomputes it */
  void *out;
  apex_dtype out_dtype;
  apex_nn_workspace ws;
} apex_nn_attention_args;

/* dV = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dP * P)) / sqrt(d), dQ = dS k, dK = dS^T q, with q,
 * k, v native as in the forward (the same geometry), out the forward's output (native, out_dtype; a
 * backend may use it for rowsum(dO * O)), stats the forward's, and the gradients in their dtypes
 * with their own row strides (a gradient of other than f32 always accumulates: the three may share
 * one buffer's rows). A backend recomputes P from S and the stats (the CPU recomputes S and P with its forward's
 * own code, so P has the forward's bits). ws lends the recomputed P and dS, and the products' scratch. */
typedef struct apex_nn_attention_bwd_args {
  size_t batch;
  int heads, t, d;
  apex_nn_buf q, k, v;
  size_t ld_q, ld_k, ld_v;
  const void *out;
  apex_dtype out_dtype;
  size_t ld_out;
  const float *stats;
  const void *gout;
  size_t ld_gout;
  void *gq, *gk, *gv;
  apex_dtype gout_dtype, gq_dtype, gk_dtype, gv_dtype;
  size_t ld_gq, ld_gk, ld_gv;
  int accumulate_q, accumulate_k, accumulate_v;
  apex_nn_workspace ws;
} apex_nn_attention_bwd_args;

/* ---- convolution and pooling (cpu/conv.c, cuda/conv.cu) ------------------------------------------- */

/* Convolution and pooling geometry: n images of c channels, h x w, into o channels (pooling: o = c)
 * of ho x wo, with a kh x kw window at strides sh, sw and zero padding ph, pw. */
typedef struct apex_nn_conv_geom {
  int n, c, h, w, o, kh, kw, sh, sw, ph, pw, ho, wo;
} apex_nn_conv_geom;

/* out [n, o, ho, wo] (out_dtype) = the convolution of x [n, c, h, w] with w [o, c, kh, kw], plus bias
 * [o] (data NULL: none), in f32 from the native inputs. */
typedef struct apex_nn_conv2d_args {
  apex_nn_conv_geom geom;
  apex_nn_buf x, w, bias;
  void *out;
  apex_dtype out_dtype;
  apex_nn_workspace ws;
} apex_nn_conv2d_args;

/* gx, gw, gb of the convolution; x (native) is read when gw is set, w (native) when gx is. */
typedef struct apex_nn_conv2d_bwd_args {
  apex_nn_conv_geom geom;
  apex_nn_buf x, w;
  const float *gout;
  float *gx, *gw, *gb;
  int accumulate_x, accumulate_w, accumulate_b;
  apex_nn_workspace ws;
} apex_nn_conv2d_bwd_args;

/* Max pooling (argmax set: it receives each output's flat index in its input plane, for the backward;
 * NaN propagates) or average pooling (argmax NULL; the divisor is the whole window, padding
 * included) of x [n, c, h, w] into out [n, c, ho, wo]. */
typedef struct apex_nn_pool2d_args {
  apex_nn_conv_geom geom;
  apex_nn_buf x;       /* native: a low-precision x is widened a plane at a time, never whole */
  void *out;           /* out_dtype */
  apex_dtype out_dtype;
  int32_t *argmax;
  apex_nn_workspace ws;
} apex_nn_pool2d_args;

typedef struct apex_nn_pool2d_bwd_args {
  apex_nn_conv_geom geom;
  const int32_t *argmax;
  const float *gout;
  float *gx;
  int accumulate_x;
} apex_nn_pool2d_bwd_args;

#endif
