/* kernels.h: raw kernels on apex tensors, for programs that bring their own model (llm.c style) and
 * call the fused kernels directly instead of building a graph (autograd.h, nn_ops.h).
 *
 * Each call is device-neutral: it runs on the device its tensors are on, through the same backend kernels
 * that autograd's ops run there (so on the CPU as on a GPU), and every tensor of one call must be on the
 * same device (APEX_ERR_DEVICE naming the one that is not). A backend without the kernel answers
 * APEX_ERR_UNSUPPORTED naming the call and the kernel, and changes nothing. The numerics below are each
 * kernel's contract; where a backend's library (cuBLASLt, cuDNN) or device math sets a bound, the text
 * names it. Gradients are computed in f32 and rounded once into the gradient's own dtype. Nothing here waits for the device: results are there once the device is synchronised
 * (apex_cuda_synchronize) or read back (apex_tensor_get, apex_tensor_copy to the host). */
#ifndef APEX_KERNELS_H
#define APEX_KERNELS_H

#include <stdint.h>

#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The geometry of a 2-D convolution (apex_kernel_conv2d_forward here, apex_conv2d in nn_ops.h). */
typedef struct apex_conv2d_options {
  int stride_h, stride_w; /* 0 means 1 */
  int pad_h, pad_w;       /* zero padding on each side */
} apex_conv2d_options;

/* ---- fused kernels (Apex's FusedLayerNorm, FusedRMSNorm, xentropy, Welford BN, fused dense) --------------
 * Each checks shapes, dtypes and devices (APEX_ERR_SHAPE / APEX_ERR_DTYPE / APEX_ERR_DEVICE naming the
 * argument), accumulates in f32 and is deterministic: the same inputs give
 * the same bits on every run. x, y, dy, dx: f32, f16 or bf16; weights f32 or x's dtype. */

/* Layer norm over the last dimension of x ([rows, cols], any leading shape): y = (x - mean) * rstd * w + b.
 * b may be NULL (no bias); mean and rstd are f32 [rows] outputs for the backward. With rms = 1 this is
 * RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), mean left untouched (may be NULL). y may
 * not overlap x (APEX_ERR_INVALID_ARG). */
APEX_API apex_status apex_kernel_layer_norm_forward(const apex_tensor *x, const apex_tensor *w, const apex_tensor *b,
                                                    float eps, int rms, apex_tensor *y, apex_tensor *mean,
                                                    apex_tensor *rstd);
/* The gradients dx (x's dtype), dw and db (w's dtype; db may be NULL; both overwritten, not
 * accumulated) from dy and the forward's x, w, mean and rstd. dw and db are summed over rows in an order
 * fixed by the shape and the GPU model (its multiprocessor count): the same bits on every run there.
 * dx may not overlap dy or x (APEX_ERR_INVALID_ARG). */
APEX_API apex_status apex_kernel_layer_norm_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                                     const apex_tensor *mean, const apex_tensor *rstd, int rms,
                                                     apex_tensor *dx, apex_tensor *dw, apex_tensor *db);
/* Softmax + cross-entropy per row of logits [rows, classes] against class indices d_target (a pointer
 * to rows int64 values in the memory of logits' device; -1 marks a row to ignore), as PyTorch's
 * cross_entropy with reduction='none', ignore_index=-1 and label_smoothing: loss f32 [rows] (0 for an
 * ignored row) and stats f32 [rows, 2] (any shape of 2 * rows elements), each row's max m and
 * r = 1 / sum exp(x - m) (its log-sum-exp is m - log r), from which the backward recomputes the softmax.
 * Never keeps the softmax. A target outside [-1, classes) is APEX_ERR_INVALID_ARG where the targets are
 * host memory (the CPU); on a GPU, where checking would wait for it, its row's loss is NaN. */
APEX_API apex_status apex_kernel_cross_entropy_forward(const apex_tensor *logits, const int64_t *d_target,
                                                       float label_smoothing, apex_tensor *loss, apex_tensor *stats);
/* dlogits (logits' dtype; may be logits itself) = dloss[row] * (softmax - smoothed one-hot), 0 for
 * ignored rows, from the forward's stats. */
APEX_API apex_status apex_kernel_cross_entropy_backward(const apex_tensor *dloss, const apex_tensor *logits,
                                                        const int64_t *d_target, const apex_tensor *stats,
                                                        float label_smoothing, apex_tensor *dlogits);
/* Per-channel batch statistics of x [N, C, ...] by Welford's method: mean, biased variance and the sum of
 * squared deviations M2 (f32 [C] each; m2 may be NULL), the triples SyncBatchNorm merges across ranks. */
APEX_API apex_status apex_kernel_batch_norm_stats(const apex_tensor *x, apex_tensor *mean, apex_tensor *var,
                                                  apex_tensor *m2);
/* c = alpha * op(a) @ op(b) + beta * c (+ bias per column of c) (then GELU, tanh form, when gelu = 1),
 * accumulated in f32 (on a GPU through cuBLASLt: f16/bf16 on the tensor cores, f32 with TF32 off): a, b of
 * one dtype, f32, f16 or bf16; c f32 or a's dtype (read when beta is not 0); bias (may be NULL) c's
 * dtype, [n]. c may not overlap a or b. a is [m, k] ([k, m] with trans_a), b [k, n] ([n, k] with
 * trans_b), c [m, n], all row-major. */
APEX_API apex_status apex_kernel_matmul(const apex_tensor *a, int trans_a, const apex_tensor *b, int trans_b,
                                        apex_tensor *c, float alpha, float beta, const apex_tensor *bias, int gelu);

/* 2-D convolution (on a GPU through cuDNN, loaded at the first call from $APEX_CUDNN, else libcudnn.so.9
 * on the loader's path; APEX_ERR_UNSUPPORTED saying so when it cannot be loaded): y = conv(x, w) + b as
 * apex_conv2d (nn_ops.h) computes it, x [N, C, H, W], w [K, C, R, S], b [K] or NULL, y [N, K, P, Q]
 * with P = (H + 2 pad_h - R) / stride_h + 1 (Q likewise); x, w and y of one dtype (f32 on the FMA
 * units, f16/bf16 on the tensor cores, f32 accumulation), b f32 or that dtype; opts may be NULL.
 * Deterministic: cuDNN's algorithms are chosen among those it marks deterministic. y may not overlap x. */
APEX_API apex_status apex_kernel_conv2d_forward(const apex_tensor *x, const apex_tensor *w, const apex_tensor *b,
                                                const apex_conv2d_options *opts, apex_tensor *y);
/* The gradients of the forward above from dy [N, K, P, Q]: dx (x's shape and dtype), dw (w's) and db
 * (b's, [K]), overwritten; any of them may be NULL to skip it. */
APEX_API apex_status apex_kernel_conv2d_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                                 const apex_conv2d_options *opts, apex_tensor *dx, apex_tensor *dw,
                                                 apex_tensor *db);

/* Embedding lookup: y[t, :] = table[ids[t], :] for the n ids, a HOST array of int64 on every device (as
 * apex_embedding takes them; copied to a GPU without waiting for it). table [V, D] f32/f16/bf16; y of table's dtype
 * with n * D elements (e.g. [n, D] or [B, T, D]). APEX_ERR_INVALID_ARG naming the position of an id
 * outside [0, V). */
APEX_API apex_status apex_kernel_embedding_forward(const apex_tensor *table, const int64_t *ids, int64_t n, apex_tensor *y);
/* The table's gradient: dtable [V, D] (f32, f16 or bf16) row v = the sum of dy[t, :] over the positions
 * t with ids[t] == v, in ascending t (deterministic, no atomics), zero for ids not present; overwritten.
 * dy has n * D elements of any float dtype. */
APEX_API apex_status apex_kernel_embedding_backward(const apex_tensor *dy, const int64_t *ids, int64_t n, apex_tensor *dtable);


/* ---- attention (GPT-2's causal self-attention block) ---------------------------------------------------------
 * Causal multi-head self-attention on the packed projection qkv [B, T, 3 * C] that GPT-2's c_attn linear
 * produces: q, k and v are its three [B, T, C] thirds, each split into n_heads heads of D = C / n_heads
 * contiguous channels. y [B, T, C] is, per head, softmax(q k^T / sqrt(D) + causal mask) v with the heads
 * side by side again (ready for the c_proj linear), as apex_causal_attention (nn_ops.h) computes it on
 * [B, H, T, D] operands. qkv and y of one dtype: f32, or f16/bf16 on the tensor cores, accumulating in
 * f32. stats f32 [B, n_heads, T, 2] (any shape of that many elements): per scaled score row a pair
 * (m, r) whose m - log r is the row's log-sum-exp (apex's kernels write the row's max and
 * 1 / sum exp(s - max); cuDNN's fused attention on a GPU writes (log-sum-exp, 1)), saved for the backward,
 * which reads only m - log r and recomputes the probabilities from it instead of keeping a [T, T] matrix
 * per head. Deterministic, except the backward under APEX_ATTENTION=cudnn-nondeterministic on a GPU
 * (cuDNN's atomic backward). y may not overlap qkv. */
APEX_API apex_status apex_kernel_attention_forward(const apex_tensor *qkv, int n_heads, apex_tensor *y, apex_tensor *stats);
/* dqkv [B, T, 3 * C] (qkv's dtype, overwritten) from dy [B, T, C] (y's dtype) and the forward's qkv, y and
 * stats. dqkv may not overlap dy, qkv or y. */
APEX_API apex_status apex_kernel_attention_backward(const apex_tensor *dy, const apex_tensor *qkv, const apex_tensor *y,
                                                    const apex_tensor *stats, int n_heads, apex_tensor *dqkv);

/* ---- elementwise and reductions --------------------------------------------------------------------------
 * Tensors of f32, f16 or bf16 (each argument may have its own dtype, and its own shape: only the
 * element counts must agree), math in f32, rounded to the output's dtype as the CPU ops round: the same bits
 * as apex_add / apex_mul / apex_scale / apex_relu and ReLU's gradient on the CPU (on a GPU NaN where the CPU
 * gives NaN, not necessarily the same NaN: the GPU's arithmetic returns one canonical NaN). On a GPU GELU
 * goes through the device's tanhf, which is not glibc's (each is within 2 ulp of tanh), so it is not bitwise: y is within
 * |x| 2^-21 + 2 ulp (of y's dtype, at y) of apex_gelu_tanh's, and dx within |dy| (1 + P) 2^-19 + 2 ulp of
 * the CPU backward's, P = |x| sqrt(2/pi) (1 + 3 * 0.044715 x^2) / 2; the same values where either is not
 * finite. Outputs may alias inputs of the same dtype (y = a is an in-place update); any other overlap of an
 * output with an input is APEX_ERR_INVALID_ARG. APEX_ERR_SHAPE for an element count that does not match,
 * naming the argument. */

/* y = a + b over equal element counts (a residual connection; dx += dy in a backward). */
APEX_API apex_status apex_kernel_add(const apex_tensor *a, const apex_tensor *b, apex_tensor *y);
/* y = a * b over equal element counts. */
APEX_API apex_status apex_kernel_mul(const apex_tensor *a, const apex_tensor *b, apex_tensor *y);
/* y = alpha * x. */
APEX_API apex_status apex_kernel_scale(const apex_tensor *x, float alpha, apex_tensor *y);
/* y = max(x, 0) (+0 for NaN, as the CPU op); dx = dy where x > 0, else 0 (overwritten, not accumulated). */
APEX_API apex_status apex_kernel_relu_forward(const apex_tensor *x, apex_tensor *y);
APEX_API apex_status apex_kernel_relu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx);
/* GELU in the tanh form (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its gradient
 * dx = dy * gelu'(x) from the forward's input x (overwritten, not accumulated). */
APEX_API apex_status apex_kernel_gelu_forward(const apex_tensor *x, apex_tensor *y);
APEX_API apex_status apex_kernel_gelu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx);
/* Column sums of x viewed as [rows, cols] (cols = y's element count, rows = x's count / cols, which must
 * divide it: APEX_ERR_SHAPE otherwise): y[j] = sum over i of x[i, j] (+ y[j] when accumulate), summed (in
 * f64 on the CPU) in an order fixed by the shape (the same bits on every run; a bias's
 * gradient). y f32, f16 or bf16,
 * apart from x (APEX_ERR_INVALID_ARG). Zero rows give zeros (or leave y as it is when accumulating). */
APEX_API apex_status apex_kernel_sum_rows(const apex_tensor *x, apex_tensor *y, int accumulate);
/* The sum of all elements of x into y (one f32 element, apart from x), or their mean with mean = 1 (NaN
 * for an empty x, as PyTorch's mean): summed in an order fixed by x's size alone (in f64 over fixed blocks
 * on the CPU) and rounded once, so every run gives the same bits. */
APEX_API apex_status apex_kernel_sum_all(const apex_tensor *x, int mean, apex_tensor *y);

#ifdef __cplusplus
}
#endif
#endif
