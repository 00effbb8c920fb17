/* cuda.h: the CUDA backend: device tensors, the device loss scaler and the fused GPU kernels.
 *
 * Device tensors are ordinary apex tensors made with apex_tensor_create_on(APEX_DEVICE_CUDA, ...);
 * their memory comes from a caching allocator over cudaMalloc (never managed memory) and
 * apex_tensor_data() gives the device pointer. apex_tensor_fill, apex_tensor_copy (any direction,
 * any dtype pair, with the CPU's exact rounding), apex_tensor_to, apex_tensor_clone, apex_tensor_get
 * and apex_tensor_set work on them; the multi-tensor kernels (multi_tensor.h) and the optimizers
 * (optim.h: every kind; LAMB, NovoGrad and AdamP built but not yet run on a GPU) run on
 * the GPU when their tensors are there; LAMB needs all its groups on one device (its global norm).
 * The autograd ops are CPU-only for now and refuse device tensors.
 *
 * All apex work is queued on one stream (apex_cuda_stream). Nothing waits for the GPU unless it
 * must hand a value to the host: a copy to the host, apex_tensor_get, a norm returned as a float,
 * apex_cuda_scaler_get_state, apex_optimizer_step_count and optimizer saves. The mixed-precision
 * loop below makes no host-device synchronisation at all:
 *
 *     apex_cuda_scaler *sc = apex_cuda_scaler_create(NULL);        dynamic, 2^16
 *     for (...) {
 *       forward; multiply the loss gradient by *apex_cuda_scaler_scale_ptr(sc); backward
 *       apex_cuda_scaler_check(sc, grads, n);                       found_inf |= any Inf/NaN (reads only)
 *       apex_cuda_optimizer_step(opt, sc);                          unscales in-kernel; skips on found_inf
 *       apex_cuda_scaler_update(sc);                                grows / backs off, clears found_inf
 *     }
 *
 * In a build without CUDA, or on a machine without a GPU, apex_cuda_available() is 0 and every other
 * call here fails with APEX_ERR_UNSUPPORTED and a message saying why. */
#ifndef APEX_CUDA_H
#define APEX_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "apex/loss_scaler.h"
#include "apex/nn_ops.h" /* apex_conv2d_options */
#include "apex/optim.h"
#include "apex/status.h"
#include "apex/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with CUDA and a GPU can be used; else 0, and *why (may be NULL) says
 * which of the two is missing (a constant string). */
APEX_API int apex_cuda_available(const char **why);
/* The GPU's name and compute capability ("NVIDIA H100 80GB HBM3, sm_90") into buf. */
APEX_API apex_status apex_cuda_device_name(char *buf, size_t size);
/* Waits for all work queued on apex's stream. */
APEX_API apex_status apex_cuda_synchronize(void);
/* apex's stream as a cudaStream_t (void * here so that this header needs no CUDA headers); NULL
 * without CUDA. Kernels of your own that touch apex tensors should run on it. */
APEX_API void *apex_cuda_stream(void);

typedef struct apex_cuda_memory_stats {
  size_t allocated;      /* bytes in live tensors (rounded block sizes) */
  size_t reserved;       /* bytes obtained from cudaMalloc, live or cached */
  size_t peak_allocated; /* the highest `allocated` since the last reset */
  size_t device_allocs;  /* cudaMalloc calls so far: flat once the cache is warm */
} apex_cuda_memory_stats;
/* The caching allocator's counters. */
APEX_API apex_status apex_cuda_memory_stats_get(apex_cuda_memory_stats *out);
/* Restarts peak_allocated from the current `allocated`. */
APEX_API apex_status apex_cuda_memory_reset_peak(void);
/* Returns every cached (free) block to the GPU. */
APEX_API apex_status apex_cuda_empty_cache(void);

/* Page-locked host memory, for copies that overlap computation (data loading). NULL with a message on
 * failure or without CUDA. */
APEX_API void *apex_cuda_host_alloc(size_t bytes);
APEX_API void apex_cuda_host_free(void *p);
/* Copies between tensors as apex_tensor_copy, without waiting for a copy to the host: the data is
 * there once apex_cuda_synchronize returns. Host tensors should be over apex_cuda_host_alloc memory
 * (apex_tensor_wrap) for the copy to be truly asynchronous. */
APEX_API apex_status apex_tensor_copy_async(apex_tensor *dst, const apex_tensor *src);

/* ---- the device loss scaler -----------------------------------------------------------------------
 * apex_loss_scaler's rules (loss_scaler.h: static or dynamic with growth, backoff, window, min, max,
 * hysteresis), with the scale, both trackers, the counters and the found_inf flag kept on the GPU so
 * that checks, steps and updates never wait for the host. Its state equals, bit for bit, that of an
 * apex_loss_scaler fed the same overflow sequence. */
typedef struct apex_cuda_scaler apex_cuda_scaler;

/* A scaler from the configuration (NULL = the defaults), validated as apex_loss_scaler_create. */
APEX_API apex_cuda_scaler *apex_cuda_scaler_create(const apex_loss_scaler_config *config);
APEX_API void apex_cuda_scaler_destroy(apex_cuda_scaler *s);
/* Device pointers: the current scale (f32) and the found_inf flag (int32, nonzero = overflow seen);
 * NULL for a NULL scaler. */
APEX_API const float *apex_cuda_scaler_scale_ptr(const apex_cuda_scaler *s);
APEX_API int *apex_cuda_scaler_found_inf_ptr(apex_cuda_scaler *s);
/* Raises found_inf if any element of the n device tensors is Inf or NaN; reads them only. */
APEX_API apex_status apex_cuda_scaler_check(apex_cuda_scaler *s, apex_tensor *const *grads, int n);
/* out[i] = in[i] / scale (in place when out == in), raising found_inf on a non-finite input. */
APEX_API apex_status apex_cuda_scaler_unscale(apex_cuda_scaler *s, apex_tensor *const *in, apex_tensor *const *out,
                                              int n);
/* Multiplies a device tensor (say the loss gradient that seeds backward) by the scale, in place. */
APEX_API apex_status apex_cuda_scaler_scale_tensor(apex_cuda_scaler *s, apex_tensor *t);
/* Applies one update from found_inf (as apex_loss_scaler_update) and clears the flag. Returns at once,
 * so it cannot say whether the overflow came with the scale already at min_scale (what
 * apex_loss_scaler_at_min reports on the CPU) without waiting: read the state to find out (the scale
 * at min_scale and `skipped` grown). */
APEX_API apex_status apex_cuda_scaler_update(apex_cuda_scaler *s);
/* The state (waits for the GPU), and the reverse (validated as apex_loss_scaler_set_state); save and
 * load it with apex_loss_scaler_save/load through an apex_loss_scaler. */
APEX_API apex_status apex_cuda_scaler_get_state(apex_cuda_scaler *s, apex_loss_scaler_state *out);
APEX_API apex_status apex_cuda_scaler_set_state(apex_cuda_scaler *s, const apex_loss_scaler_state *state);
/* One optimizer step over device parameters with the gradients unscaled by the scaler's scale inside the
 * kernel and skipped, every state and step count unchanged, when found_inf is set. Does not update the
 * scaler (call apex_cuda_scaler_update after). APEX_ERR_DEVICE for an optimizer with CPU parameters. */
APEX_API apex_status apex_cuda_optimizer_step(apex_optimizer *opt, apex_cuda_scaler *s);

/* ---- fused kernels (Apex's FusedLayerNorm, FusedRMSNorm, xentropy, Welford BN, fused dense) --------------
 * Each takes device tensors, checks shapes, dtypes and devices (APEX_ERR_SHAPE / APEX_ERR_DTYPE /
 * APEX_ERR_DEVICE naming the argument), accumulates in f32 and is deterministic: the same inputs give
 * the same bits on every run. x, y, dy, dx: f32, f16 or bf16; weights f32 or x's dtype. */

/* Layer norm over the last dimension of x ([rows, cols], any leading shape): y = (x - mean) * rstd * w + b.
 * b may be NULL (no bias); mean and rstd are f32 [rows] outputs for the backward. With rms = 1 this is
 * RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), mean left untouched (may be NULL). y may
 * not overlap x (APEX_ERR_INVALID_ARG). */
APEX_API apex_status apex_cuda_layer_norm_forward(const apex_tensor *x, const apex_tensor *w, const apex_tensor *b,
                                                  float eps, int rms, apex_tensor *y, apex_tensor *mean,
                                                  apex_tensor *rstd);
/* The gradients dx (x's dtype), dw and db (w's dtype; db may be NULL; both overwritten, not
 * accumulated) from dy and the forward's x, w, mean and rstd. dw and db are summed over rows in an order
 * fixed by the shape and the GPU model (its multiprocessor count): the same bits on every run there.
 * dx may not overlap dy or x (APEX_ERR_INVALID_ARG). */
APEX_API apex_status apex_cuda_layer_norm_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                                   const apex_tensor *mean, const apex_tensor *rstd, int rms,
                                                   apex_tensor *dx, apex_tensor *dw, apex_tensor *db);
/* Softmax + cross-entropy per row of logits [rows, classes] against class indices d_target (a device
 * pointer to rows int64 values, as PyTorch's cross_entropy with reduction='none', ignore_index and
 * label_smoothing): loss f32 [rows] (0 for an ignored row, NaN for an index outside [0, classes)) and
 * lse f32 [rows], the log-sum-exp the backward reuses. Never forms the softmax. */
APEX_API apex_status apex_cuda_cross_entropy_forward(const apex_tensor *logits, const int64_t *d_target,
                                                     int64_t ignore_index, float label_smoothing, apex_tensor *loss,
                                                     apex_tensor *lse);
/* dlogits = dloss[row] * (softmax - smoothed one-hot), 0 for ignored rows, in one pass. */
APEX_API apex_status apex_cuda_cross_entropy_backward(const apex_tensor *dloss, const apex_tensor *logits,
                                                      const int64_t *d_target, const apex_tensor *lse,
                                                      int64_t ignore_index, float label_smoothing,
                                                      apex_tensor *dlogits);
/* Per-channel batch statistics of x [N, C, ...] by Welford's method: mean, biased variance and the sum of
 * squared deviations M2 (f32 [C] each; m2 may be NULL), the triples SyncBatchNorm merges across ranks. */
APEX_API apex_status apex_cuda_batch_norm_stats(const apex_tensor *x, apex_tensor *mean, apex_tensor *var,
                                                apex_tensor *m2);
/* c = alpha * op(a) @ op(b) + beta * c (+ bias per column of c) (then GELU, tanh form, when gelu = 1),
 * through cuBLASLt with f32 accumulation: a, b f16/bf16 (tensor cores) or f32 (TF32 off); c f32 or a's
 * dtype; bias (may be NULL) c's dtype, [n]. a is [m, k] ([k, m] with trans_a), b [k, n] ([n, k] with
 * trans_b), c [m, n], all row-major. */
APEX_API apex_status apex_cuda_matmul(const apex_tensor *a, int trans_a, const apex_tensor *b, int trans_b,
                                      apex_tensor *c, float alpha, float beta, const apex_tensor *bias, int gelu);

/* 2-D convolution through cuDNN (loaded at the first call from $APEX_CUDNN, else libcudnn.so.9 on the
 * loader's path; APEX_ERR_UNSUPPORTED saying so when it cannot be loaded): y = conv(x, w) + b as
 * apex_conv2d (nn_ops.h) computes it, x [N, C, H, W], w [K, C, R, S], b [K] or NULL, y [N, K, P, Q]
 * with P = (H + 2 pad_h - R) / stride_h + 1 (Q likewise); x, w and y of one dtype (f32 on the FMA
 * units, f16/bf16 on the tensor cores, f32 accumulation), b f32 or that dtype; opts may be NULL.
 * Deterministic: cuDNN's algorithms are chosen among those it marks deterministic. */
APEX_API apex_status apex_cuda_conv2d_forward(const apex_tensor *x, const apex_tensor *w, const apex_tensor *b,
                                              const apex_conv2d_options *opts, apex_tensor *y);
/* The gradients of the forward above from dy [N, K, P, Q]: dx (x's shape and dtype), dw (w's) and db
 * (b's, [K]), overwritten; any of them may be NULL to skip it. */
APEX_API apex_status apex_cuda_conv2d_backward(const apex_tensor *dy, const apex_tensor *x, const apex_tensor *w,
                                               const apex_conv2d_options *opts, apex_tensor *dx, apex_tensor *dw,
                                               apex_tensor *db);

/* Embedding lookup: y[t, :] = table[ids[t], :] for the n ids, a HOST array of int64 (as apex_embedding
 * takes them; copied to the GPU without waiting for it). table [V, D] f32/f16/bf16; y of table's dtype
 * with n * D elements (e.g. [n, D] or [B, T, D]). APEX_ERR_INVALID_ARG naming the position of an id
 * outside [0, V). */
APEX_API apex_status apex_cuda_embedding_forward(const apex_tensor *table, const int64_t *ids, int64_t n, apex_tensor *y);
/* The table's gradient: dtable [V, D] (f32, f16 or bf16) row v = the sum of dy[t, :] over the positions
 * t with ids[t] == v, in ascending t (deterministic, no atomics), zero for ids not present; overwritten.
 * dy has n * D elements of any float dtype. */
APEX_API apex_status apex_cuda_embedding_backward(const apex_tensor *dy, const int64_t *ids, int64_t n, apex_tensor *dtable);


/* ---- attention (GPT-2's causal self-attention block) ---------------------------------------------------------
 * Causal multi-head self-attention on the packed projection qkv [B, T, 3 * C] that GPT-2's c_attn linear
 * produces: q, k and v are its three [B, T, C] thirds, each split into n_heads heads of D = C / n_heads
 * contiguous channels. y [B, T, C] is, per head, softmax(q k^T / sqrt(D) + causal mask) v with the heads
 * side by side again (ready for the c_proj linear), as apex_causal_attention (nn_ops.h) computes it on
 * [B, H, T, D] operands. qkv and y of one dtype: f32, or f16/bf16 on the tensor cores, accumulating in
 * f32. lse f32 [B, n_heads, T]: the log-sum-exp of each scaled score row, saved for the backward (which
 * recomputes the probabilities from it instead of keeping a [T, T] matrix per head). Deterministic. */
APEX_API apex_status apex_cuda_attention_forward(const apex_tensor *qkv, int n_heads, apex_tensor *y, apex_tensor *lse);
/* dqkv [B, T, 3 * C] (qkv's dtype, overwritten) from dy [B, T, C] (y's dtype) and the forward's qkv, y and
 * lse. */
APEX_API apex_status apex_cuda_attention_backward(const apex_tensor *dy, const apex_tensor *qkv, const apex_tensor *y,
                                                  const apex_tensor *lse, int n_heads, apex_tensor *dqkv);

/* ---- elementwise and reductions --------------------------------------------------------------------------
 * Device tensors of f32, f16 or bf16 (each argument may have its own dtype, and its own shape: only the
 * element counts must agree), math in f32, rounded to the output's dtype as the CPU ops round: the same bits
 * as apex_add / apex_mul / apex_scale / apex_relu and ReLU's gradient on the CPU (NaN where the CPU gives NaN,
 * not necessarily the same NaN: the GPU's arithmetic returns one canonical NaN). GELU goes through the
 * device's tanhf, which is not glibc's (each is within 2 ulp of tanh), so it is not bitwise: y is within
 * |x| 2^-21 + 2 ulp (of y's dtype, at y) of apex_gelu_tanh's, and dx within |dy| (1 + P) 2^-19 + 2 ulp of
 * the CPU backward's, P = |x| sqrt(2/pi) (1 + 3 * 0.044715 x^2) / 2; the same values where either is not
 * finite. Outputs may alias inputs of the same dtype (y = a is an in-place update); any other overlap of an
 * output with an input is APEX_ERR_INVALID_ARG. APEX_ERR_DEVICE for a CPU tensor, APEX_ERR_SHAPE for an
 * element count that does not match, each naming the argument. */

/* y = a + b over equal element counts (a residual connection; dx += dy in a backward). */
APEX_API apex_status apex_cuda_add(const apex_tensor *a, const apex_tensor *b, apex_tensor *y);
/* y = a * b over equal element counts. */
APEX_API apex_status apex_cuda_mul(const apex_tensor *a, const apex_tensor *b, apex_tensor *y);
/* y = alpha * x. */
APEX_API apex_status apex_cuda_scale(const apex_tensor *x, float alpha, apex_tensor *y);
/* y = max(x, 0) (+0 for NaN, as the CPU op); dx = dy where x > 0, else 0 (overwritten, not accumulated). */
APEX_API apex_status apex_cuda_relu_forward(const apex_tensor *x, apex_tensor *y);
APEX_API apex_status apex_cuda_relu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx);
/* GELU in the tanh form (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its gradient
 * dx = dy * gelu'(x) from the forward's input x (overwritten, not accumulated). */
APEX_API apex_status apex_cuda_gelu_forward(const apex_tensor *x, apex_tensor *y);
APEX_API apex_status apex_cuda_gelu_backward(const apex_tensor *dy, const apex_tensor *x, apex_tensor *dx);
/* Column sums of x viewed as [rows, cols] (cols = y's element count, rows = x's count / cols, which must
 * divide it: APEX_ERR_SHAPE otherwise): y[j] = sum over i of x[i, j] (+ y[j] when accumulate), summed in
 * f32 in an order fixed by the shape (the same bits on every run; a bias's gradient). y f32, f16 or bf16,
 * apart from x (APEX_ERR_INVALID_ARG). Zero rows give zeros (or leave y as it is when accumulating). */
APEX_API apex_status apex_cuda_sum_rows(const apex_tensor *x, apex_tensor *y, int accumulate);
/* The sum of all elements of x into y (one f32 element, apart from x), or their mean with mean = 1 (NaN
 * for an empty x, as PyTorch's mean): f32 sums over fixed slices of x, combined in f64 in a fixed order
 * and rounded once, so every run gives the same bits. */
APEX_API apex_status apex_cuda_sum_all(const apex_tensor *x, int mean, apex_tensor *y);

#ifdef __cplusplus
}
#endif
#endif
