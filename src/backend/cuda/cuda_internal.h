/* cuda_internal.h: the entry points of the CUDA backend's kernels and runtime (the .cu files beside
 * it, compiled by nvcc), for the C files that fill its tables (backend.c, memory.c, mt_slots.c,
 * optim_slots.c, nn_slots.c); apex/cuda.h's fronts (backend/cuda_api.c) reach the runtime's services
 * through backend.c's apex__cuda_services.
 *
 * Every function here exists only when the library is built with APEX_CUDA; code outside this folder
 * reaches them through the backend's tables, never by name. Pointers named d_* are device memory. All
 * work is queued on one stream (apex__cuda_stream), so kernels, copies and the caching allocator's
 * reuse of freed blocks are ordered without host synchronisation; only copies to the host wait. Each
 * function returns APEX_OK or fails with a message (apex__fail) naming the CUDA error. */
#ifndef APEX_CUDA_INTERNAL_H
#define APEX_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "apex/cuda.h"
#include "apex/dtype.h"
#include "apex/loss_scaler_config.h"
#include "apex/optim_options.h"
#include "apex/status.h"
#include "apex/tensor.h"
#include "backend/args_nn.h"
#include "backend/args_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime.cu: devices, the stream, the caching allocator, copies ---------------------------- */

/* 1 when a CUDA device can be used (checked once); 0 with a reason in *why (may be NULL). */
int apex__cuda_ready(const char **why);
/* apex's stream (a cudaStream_t). */
void *apex__cuda_stream(void);
/* Makes apex work on GPU `device` (0 by default): the current device of every thread that calls
 * apex, and the stream. Possible until apex first allocates device memory: APEX_ERR_STATE after
 * that, APEX_ERR_UNSUPPORTED without a GPU, APEX_ERR_INVALID_ARG for a device not visible. */
apex_status apex__cuda_use_device(int device);
/* Device memory of at least `bytes` from the caching allocator (never managed memory), zero-filled
 * when zero is set. Blocks freed earlier are reused; the GPU is asked for more only when none fits,
 * and after a failed request every cached block is given back and the request tried once more. */
apex_status apex__cuda_alloc(size_t bytes, int zero, void **out);
/* Returns a block to the cache (NULL is fine). */
void apex__cuda_free(void *d_ptr);
/* `bytes` of device scratch for one slot call: from the workspace the caller lends (args_nn.h; autograd's
 * graph pool: no allocator call, the same blocks every step) when ws.get is set, else from the allocator,
 * which *owned then holds for apex__cuda_free (NULL otherwise). NULL after a message (*st set). */
void *apex__cuda_ws_scratch(apex_nn_workspace ws, size_t bytes, void **owned, apex_status *st);
enum { APEX__H2D = 1, APEX__D2H = 2, APEX__D2D = 3 };
/* Copies bytes, queued on the stream; with wait set, returns once it (and all earlier work) is done. */
apex_status apex__cuda_memcpy(void *dst, const void *src, size_t bytes, int direction, int wait);
apex_status apex__cuda_sync(const char *what);
/* How many times the host has waited for the GPU (apex_memory.waits). */
unsigned long long apex__cuda_waits(void);
/* Counts one wait of the host for the GPU made outside runtime.cu (an event synchronisation). */
void apex__cuda_note_wait(void);
/* The allocator's side of a CUDA graph capture (see runtime.cu): from begin to end, requests are served
 * only from blocks the pool already holds (APEX_ERR_STATE, naming the size, when none fits), and every
 * block handed out belongs to capture *id, which keeps it, freed or not, until apex__cuda_pool_release(id):
 * the graph replays on those addresses. One capture at a time (APEX_ERR_STATE for a second). */
apex_status apex__cuda_pool_capture_begin(int *id);
void apex__cuda_pool_capture_end(void);
/* Gives capture id's blocks back to the pool (0 is fine: nothing); its graph must never be launched again. */
void apex__cuda_pool_release(int id);
/* What apex/cuda.h publishes (backend/cuda_api.c; only called once apex__cuda_ready said yes). */
apex_status apex__cuda_device_name(char *buf, size_t size);
void apex__cuda_stats(apex_cuda_memory_stats *out, int reset_peak);
void apex__cuda_empty_cache(void);
void *apex__cuda_host_alloc(size_t bytes);
void apex__cuda_host_free(void *p);
apex_status apex__cuda_check_launch(const char *what);

/* ---- streams.cu: the stream and event slots (backend/streams.h) ----------------------------------- */

int apex__cuda_device_count(const char **why);
apex_status apex__cuda_enter(const char *what);
apex_status apex__cuda_stream_create(const char *what, void **stream);
void apex__cuda_stream_destroy(void *stream);
apex_status apex__cuda_event_create(const char *what, void **event);
void apex__cuda_event_destroy(void *event);
apex_status apex__cuda_event_record(const char *what, void *event, void *stream);
apex_status apex__cuda_stream_wait(const char *what, void *stream, void *event);
apex_status apex__cuda_event_query(const char *what, void *event, int *done);

/* ---- convert.cu ---------------------------------------------------------------------------------- */

/* n elements from src to dst (both device), with the CPU's exact rounding (core/convert_scalar.h). */
apex_status apex__cuda_convert(void *d_dst, apex_dtype dst_type, const void *d_src, apex_dtype src_type, size_t n);
/* Sets n elements to value rounded to dtype. */
apex_status apex__cuda_fill(void *d_dst, apex_dtype dtype, float value, size_t n);

/* ---- multi_tensor.cu: the multi-tensor kernels on device tensors ------------------------------------ */

/* A list of device tensors as the kernels see them. */
typedef struct apex__cuda_list {
  int n;
  void **ptr;        /* n device pointers */
  apex_dtype *dtype; /* n dtypes */
  size_t *numel;     /* n element counts */
} apex__cuda_list;

/* Device tensors t[0..n) as a list (APEX_ERR_DEVICE naming "<what> i" for a tensor not on the GPU);
 * free it with apex__cuda_list_free (mt_slots.c). */
apex_status apex__cuda_list_make(const char *fn, const char *what, apex_tensor *const *t, int n, apex__cuda_list *l);
void apex__cuda_list_free(apex__cuda_list *l);

/* out = in * scale (scale: the host value times *d_scale when d_scale is not NULL, else the host value;
 * d_inverse = 1 divides by *d_scale instead). Raises *d_flag (device int, may be NULL) on a non-finite
 * input. out NULL: only checks. */
apex_status apex__cuda_mt_scale(const apex__cuda_list *in, const apex__cuda_list *out, float scale,
                                const float *d_scale, int d_inverse, int *d_flag);
/* out = a x + b y; arg_to_check as apex_mt_axpby. */
apex_status apex__cuda_mt_axpby(const apex__cuda_list *x, const apex__cuda_list *y, const apex__cuda_list *out,
                                float a, float b, int arg_to_check, int *d_flag);
/* Global and per-tensor L2 norms of x * inv_scale, into device f32 d_global[1] and d_per[n] (either may
 * be NULL), summed in the CPU's order (chunks of chunk_size, 0 = APEX_MT_DEFAULT_CHUNK; tiles of eight f32
 * lanes; f64 across tiles, chunks and tensors), so they are the CPU's bits: LAMB's trust ratio and
 * clipping, and NovoGrad's norms, then match the CPU's. h_chunks (host, may be NULL): every chunk's f64
 * sum, copied down (a wait), as apex_mt_l2norm_args.per_chunk. */
apex_status apex__cuda_mt_l2norm_chunked(const apex__cuda_list *x, size_t chunk_size, float inv_scale, float *d_global,
                                         float *d_per, int *d_flag, double *h_chunks);
/* apex__cuda_mt_l2norm_chunked with the default chunk. */
apex_status apex__cuda_mt_l2norm(const apex__cuda_list *x, float inv_scale, float *d_global, float *d_per,
                                 int *d_flag);

/* The fused flush + unscale (args_mt.h's apex_mt_flush_unscale_args): grad bf16, sum and out f32;
 * raises *d_flag on a non-finite sum and d_nonzero[i] (n device ints, may be NULL) where grad i held a
 * non-zero element. Queued, never waits. */
apex_status apex__cuda_mt_flush_unscale(const apex__cuda_list *grad, const apex__cuda_list *sum,
                                        const apex__cuda_list *out, float scale, int *d_flag, int *d_nonzero);

/* ---- optim.cu: the fused optimizer step ------------------------------------------------------------ */

/* One group's step on the device, every list n long: g (any dtype), p (what is updated: an f32 master or
 * the parameter itself), model (NULL entries, or the f16/bf16 copy written from p), state lists, and
 * d_step: per-parameter int64 step counts on the device, incremented by the step unless it is
 * skipped. inv_scale is multiplied into the gradients, and divided by *d_scale when d_scale is set; a
 * nonzero *d_skip (when set) makes the step change nothing. */
typedef struct apex__cuda_step {
  apex_optim_kind kind;
  const apex_optim_options *o; /* resolved */
  int n;
  apex__cuda_list g, p, model, s[3];
  int nstates;
  int64_t *d_step; /* the group's counts: parameter idx[j] of the group is list entry j */
  const int *idx;
  float inv_scale;
  const float *d_scale;
  const int *d_skip;
  const float *d_lr;        /* when set, the learning rate (o->lr's value, read on the device: capture.h) */
  const float *d_grad_norm; /* LAMB: the global norm of every group's g * inv_scale (NULL: no clipping) */
  float *d_scalars;         /* NovoGrad: the group's per-tensor second moments on the device, by parameter */
  const int64_t *rows;      /* AdamP: each entry's channel-view rows (its first dimension), 0 for 0/1-D tensors */
} apex__cuda_step;
apex_status apex__cuda_optim_step(const apex__cuda_step *s);
/* LAMB's, NovoGrad's and AdamP's steps (lamb.cu, novograd.cu, adamp.cu), reached through
 * apex__cuda_optim_step. */
apex_status apex__cuda_lamb_step(const apex__cuda_step *s);
apex_status apex__cuda_adamp_step(const apex__cuda_step *s);
apex_status apex__cuda_novograd_step(const apex__cuda_step *s);

/* ---- loss_scaler.cu --------------------------------------------------------------------------------- */

/* The device half of a GPU apex_loss_scaler (backend/args_optim.h). */
typedef apex_scaler_dev apex__cuda_scaler_dev;
/* One update (backend/scale_rule.h) from found_inf, which it then clears; queued, never waits. */
apex_status apex__cuda_scaler_update(apex__cuda_scaler_dev *d, const apex_loss_scaler_config *c, int32_t *raise,
                                     uint64_t raise_mask);

/* ---- norm.cu, xent.cu, bn_stats.cu, gemm.cu: the fused kernels (see apex/cuda.h) ---------------------------- */

apex_status apex__cuda_layer_norm_fwd(const void *x, apex_dtype xt, const void *w, const void *b, apex_dtype wt,
                                      int64_t rows, int64_t cols, float eps, int rms, void *y, float *mean,
                                      float *rstd);
/* The residual add fused in front of the layer norm: xsum = x + x2 (rounded to xt, as a separate add stores
 * it; xsum may be x or x2), then y, mean, rstd = layer_norm(xsum) as apex__cuda_layer_norm_fwd (not rms). */
apex_status apex__cuda_add_layer_norm_fwd(const void *x, const void *x2, void *xsum, apex_dtype xt, const void *w,
                                          const void *b, apex_dtype wt, int64_t rows, int64_t cols, float eps, void *y,
                                          float *mean, float *rstd);
/* Its backward: dy and dx in xt, w in wt (f32 or xt), dw and db f32; each gradient lands by its flag as
 * args_nn.h's accumulate rule says (dx NULL: not wanted; db NULL for RMS). The blocks' partial sums of dw
 * and db take ws's memory when it lends some (args_nn.h), else the allocator's. */
apex_status apex__cuda_layer_norm_bwd(const void *dy, const void *x, apex_dtype xt, const void *w, apex_dtype wt,
                                      const float *mean, const float *rstd, int64_t rows, int64_t cols, int rms,
                                      void *dx, int acc_dx, float *dw, int acc_w, float *db, int acc_b,
                                      apex_nn_workspace ws);
apex_status apex__cuda_xent_fwd(const void *logits, apex_dtype lt, const int64_t *target, int64_t rows, int64_t cols,
                                int64_t ignore_index, float smoothing, float *loss, float *lse);
apex_status apex__cuda_xent_bwd(const float *dloss, const void *logits, apex_dtype lt, const int64_t *target,
                                const float *lse, int64_t rows, int64_t cols, int64_t ignore_index, float smoothing,
                                void *dlogits);
apex_status apex__cuda_bn_stats(const void *x, apex_dtype xt, int64_t n, int64_t c, int64_t hw, float *mean,
                                float *var, float *m2);
apex_status apex__cuda_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                            const void *b, apex_dtype in_type, float beta, void *c, apex_dtype c_type,
                            const void *bias, int gelu);
/* apex__cuda_gemm without epilogue, alpha read from the device (one f32; NULL: 1, on the host), beta then 0 or 1
 * (else APEX_ERR_INVALID_ARG): a scale known only on the device (a loss's gradient) applied to the f32 sums. */
apex_status apex__cuda_gemm_scaled(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *alpha, const void *a,
                                   const void *b, apex_dtype in_type, float beta, void *c, apex_dtype c_type);
/* cuBLASLt's training epilogues, for C = op(A) op(B) (row-major, as apex__cuda_gemm; alpha 1, beta 0):
 *   GELU_AUX_BIAS: C = gelu_tanh(op(A) op(B) + bias), and aux [m, n] = the pre-activation, kept for the backward;
 *   DGELU_BGRAD:   C = (op(A) op(B)) * gelu_tanh'(aux), and bgrad [n] = the column sums of that C (the bias
 *                  gradient of the layer whose pre-activation aux is);
 *   DGELU:         DGELU_BGRAD's C alone;
 *   BGRADB:        C = op(A) op(B), and bgrad [m] with bgrad[i] = sum over k of op(A)[i, k]: for a weight
 *                  gradient dW = dY^T X (trans_a, A = dY [k, m]), the column sums of dY, the layer's bias gradient.
 * bias and aux in c_type; bgrad in c_type, or f32 with bgrad_f32 set (where cuBLASLt has an algorithm for it). */
typedef enum apex__cuda_epi_kind {
  APEX__EPI_GELU_AUX_BIAS = 1, APEX__EPI_DGELU_BGRAD, APEX__EPI_BGRADB, APEX__EPI_DGELU
} apex__cuda_epi_kind;
typedef struct apex__cuda_epilogue {
  apex__cuda_epi_kind kind;
  const void *bias; /* GELU_AUX_BIAS */
  void *aux;        /* GELU_AUX_BIAS: written; DGELU_BGRAD, DGELU: read */
  void *bgrad;      /* DGELU_BGRAD, BGRADB: written */
  int bgrad_f32;    /* bgrad is f32 rather than c_type */
} apex__cuda_epilogue;
/* APEX_ERR_UNSUPPORTED (with a message) for f32, mixed dtypes, n not a multiple of 8, or when cuBLASLt
 * has no algorithm for the epilogue (remembered per problem, so a refusal costs its heuristic query
 * once): the caller then runs the product and the separate kernels. */
apex_status apex__cuda_gemm_epilogue(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const void *a,
                                     const void *b, apex_dtype in_type, void *c, apex_dtype c_type,
                                     const apex__cuda_epilogue *x);
/* `batch` products C_i = alpha op(A_i) op(B_i) + beta C_i, matrix i of each operand at its base pointer plus
 * i * stride elements; each stored row-major with the row length ld* (>= its stored row's element count:
 * lda >= (trans_a ? m : k), ldb >= (trans_b ? k : n), ldc >= n). Same dtypes and f32 accumulation as
 * apex__cuda_gemm, no epilogue; fn names the public call in messages. batch, m or n 0: nothing to do. */
apex_status apex__cuda_gemm_batched(const char *fn, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                    const void *a, int64_t lda, int64_t stride_a, const void *b, int64_t ldb,
                                    int64_t stride_b, apex_dtype in_type, float beta, void *c, int64_t ldc,
                                    int64_t stride_c, apex_dtype c_type, int batch);

/* ---- conv.cu: 2-D convolution through cuDNN ------------------------------------------------------------- */

/* A convolution's geometry: x [n, c, h, w], w [k, c, r, s], y [n, k, p, q]; x, w, y all of dtype. */
typedef struct apex__cuda_conv {
  int n, c, h, w, k, r, s, p, q;
  int pad_h, pad_w, stride_h, stride_w;
  apex_dtype dtype;
} apex__cuda_conv;
/* y = conv(x, w) (+ b per output channel, b of dtype bt, when b is not NULL). */
apex_status apex__cuda_conv2d_fwd(const apex__cuda_conv *g, const void *x, const void *w, const void *b, apex_dtype bt,
                                  void *y);
/* dx, dw (x's and w's shapes and dtype) and db (bt) from dy, each skipped when NULL; overwritten. */
apex_status apex__cuda_conv2d_bwd(const apex__cuda_conv *g, const void *dy, const void *x, const void *w, void *dx,
                                  void *dw, void *db, apex_dtype bt);

/* ---- embedding.cu: lookup and its deterministic gradient, ids on the host -------------------------------- */

/* y [n, d] (yt) = rows ids[0..n) of table [v, d] (tt); ids checked by the caller. */
apex_status apex__cuda_embedding_fwd(const void *table, apex_dtype tt, int64_t v, int64_t d, const int64_t *ids, int64_t n,
                                     void *y, apex_dtype yt);
/* dtable [v, d] (gt) = per row the sum of dy [n, d] (dt) over the positions with that id, overwritten. */
apex_status apex__cuda_embedding_bwd(const void *dy, apex_dtype dt, const int64_t *ids, int64_t n, int64_t v, int64_t d,
                                     void *dtable, apex_dtype gt);

/* ---- embedding.cu, the ids already on the device ------------------------------------------------------------ */

/* embedding.cu's results bit for bit, from device int64 ids (d_ids [n], each in [0, v): not checked, the
 * caller checks them on the host before they go up) and without any host work, allocation or copy, so that
 * a CUDA graph can capture them: the backward sorts the positions by id on the device (a stable radix sort)
 * in d_scratch, of at least apex__cuda_embedding_bwd_scratch(n, v) bytes. */
apex_status apex__cuda_embedding_fwd_dev(const void *table, apex_dtype tt, int64_t d, const int64_t *d_ids, int64_t n,
                                         void *y, apex_dtype yt);
size_t apex__cuda_embedding_bwd_scratch(int64_t n, int64_t v);
apex_status apex__cuda_embedding_bwd_dev(const void *dy, apex_dtype dt, const int64_t *d_ids, int64_t n, int64_t v, int64_t d,
                                         void *dtable, apex_dtype gt, void *d_scratch, size_t scratch_bytes);

/* ---- graph.cu: capturing apex's stream into a CUDA graph (capture.h's apex_step_capture) ----------------- */

typedef struct apex__cuda_graph apex__cuda_graph;
/* Starts capturing apex's stream (thread-local mode: a call of this thread that would synchronise, such as a
 * copy to or from pageable host memory, breaks the capture instead of running) and the allocator's capture
 * (apex__cuda_pool_capture_begin). Nothing queued from here to apex__cuda_capture_end runs. */
apex_status apex__cuda_capture_begin(const char *what);
/* Ends the capture and instantiates it into *out. st is the status of the work queued since begin: when it
 * is not APEX_OK, or the capture broke, or instantiation fails, the capture is thrown away (its blocks back
 * in the pool, the stream capturing no more, *out NULL) and the first failure is returned, its message
 * naming `what`. */
apex_status apex__cuda_capture_end(const char *what, apex_status st, apex__cuda_graph **out);
/* Queues one replay of g on apex's stream; returns at once. */
apex_status apex__cuda_graph_launch(apex__cuda_graph *g, const char *what);
/* Waits for the GPU (a replay may be queued), frees the graph and gives its blocks back. NULL is fine. */
void apex__cuda_graph_destroy(apex__cuda_graph *g);


/* ---- attention.cu: GPT-2's causal self-attention on the packed qkv (see apex/cuda.h) ---------------------- */

/* The shapes, checked by backend/cuda_api.c: qkv [b, t, 3 * h * d], y and dy [b, t, h * d], lse f32 [b, h, t], all but lse
 * of dtype; b, t, h, d >= 1 and b * h within int range. */
typedef struct apex__cuda_attn {
  int64_t b, t, h, d;
  apex_dtype dtype;
} apex__cuda_attn;
/* y and lse from qkv. */
apex_status apex__cuda_attention_fwd(const apex__cuda_attn *a, const void *qkv, void *y, float *lse);
/* dqkv (overwritten) from dy and the forward's qkv, y and lse. */
apex_status apex__cuda_attention_bwd(const apex__cuda_attn *a, const void *dy, const void *qkv, const void *y,
                                     const float *lse, void *dqkv);

/* ---- the nn slots' own kernels, on the slot's arguments (backend/args_nn.h; every buffer device memory) ---- */

/* attention.cu: the materialised causal attention (S and P in device scratch), q, k, v of one dtype. */
apex_status apex__cuda_attention_slot_fwd(const apex_nn_attention_args *a);
apex_status apex__cuda_attention_slot_bwd(const apex_nn_attention_bwd_args *a);
/* attention.cu: dst [rows][cols] (ld_dst) = src [rows][cols] (ld_src) converted to dst_dtype; with land
 * set, dst receives (accumulate ? dst : 0.0f) + src in f32, rounded once to dst_dtype (args_nn.h's
 * accumulate rule). */
apex_status apex__cuda_rows_copy(void *dst, apex_dtype dst_dtype, int64_t ld_dst, const void *src, apex_dtype src_dtype, int64_t ld_src,
                                 int64_t rows, int64_t cols, int land, int accumulate);
/* xent.cu: cross entropy, one block per row. */
apex_status apex__cuda_cross_entropy_slot_fwd(const apex_nn_cross_entropy_args *a);
apex_status apex__cuda_cross_entropy_slot_bwd(const apex_nn_cross_entropy_bwd_args *a);
/* dropout.cu: the mask drawn on the device (core/rng.c's Philox and Bernoulli fill). */
apex_status apex__cuda_dropout_slot_fwd(const apex_nn_dropout_args *a);
apex_status apex__cuda_dropout_slot_bwd(const apex_nn_dropout_bwd_args *a);
/* bn_forward.cu: batch norm's forward, one block per channel. */
apex_status apex__cuda_batch_norm_slot_fwd(const apex_nn_batch_norm_args *a);

/* ---- flash_attention.cu: fused causal attention, no [T, T] matrix (FlashAttention-2's scheme) --------------- */

/* The geometry of apex_nn_attention_args (backend/args_nn.h): element (b, h, i, j) of q sits at
 * q + (b * t + i) * ld_q + h * d + j, likewise every other operand with its own ld (the packed qkv of GPT
 * is q = qkv, k = qkv + C, v = qkv + 2C, ld = 3C). */
typedef struct apex__cuda_flash {
  int batch, heads, t, d;
  int64_t ld_q, ld_k, ld_v, ld_o, ld_do, ld_dq, ld_dk, ld_dv; /* row strides in elements, layout as above */
  apex_dtype dtype; /* APEX_F16 or APEX_BF16: q, k, v, o, dout, dq, dk, dv all of it */
} apex__cuda_flash;
/* o and stats [batch, heads, t, 2] f32 (per query row m = the max of the scaled masked scores and
 * r = 1 / sum_j exp(s_j - m)) from q, k, v; causal, scale 1 / sqrt(d). APEX_ERR_UNSUPPORTED (with a
 * message) when the shape/dtype is not covered (f32, d not 64/128, a row stride not a multiple of 8
 * elements or a base not 16-byte aligned, batch * heads above 65535), so that the caller takes the
 * materialised path. */
apex_status apex__cuda_flash_attention_fwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v,
                                           void *o, float *stats);
/* dq, dk, dv (written, not accumulated, in dtype) from the forward's q, k, v, o and stats and the output
 * gradient dout. Deterministic: no atomics, the same inputs give the same bits. Support as the forward. */
apex_status apex__cuda_flash_attention_bwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v,
                                           const void *o, const void *dout, const float *stats, void *dq, void *dk,
                                           void *dv);
/* The checks every fused attention path makes of g and its n operands (ptrs, their row strides lds), for
 * fn's messages: APEX_ERR_INVALID_ARG for what is wrong on every path (a NULL geometry or operand, an extent
 * below 1, a row stride below heads x d), APEX_ERR_UNSUPPORTED naming `who` for what a fused path does not
 * take (a dtype other than f16/bf16, a row stride or base not 16-byte aligned). */
apex_status apex__cuda_attn_operands_check(const char *fn, const char *who, const apex__cuda_flash *g,
                                           const void *const *ptrs, const int64_t *lds, int n);

/* ---- flash_attention_sm90*.cu: the same attention for Hopper (FlashAttention-3's scheme: TMA, wgmma) -------- */

/* The forward of apex__cuda_flash_attention_fwd (the same operands, stats (m, r) and coverage: f16/bf16,
 * d 64 or 128, 16-byte aligned rows), run by a warp-specialised kernel for compute capability 9.0 (TMA
 * loads, wgmma); apex__cuda_flash_attention_bwd reads its stats. APEX_ERR_UNSUPPORTED, with the reason, on
 * any other device, in a build without sm_90a code, or where the driver lacks the tensor-map encoder. */
apex_status apex__cuda_flash_sm90_fwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v, void *o,
                                      float *stats);
/* flash_attention_sm90_bwd.cu: the backward of apex__cuda_flash_attention_bwd (the same operands, stats and
 * coverage; deterministic, no atomics) on the same Hopper machinery; refuses as the forward does. */
apex_status apex__cuda_flash_sm90_bwd(const apex__cuda_flash *g, const void *q, const void *k, const void *v, const void *o,
                                      const void *dout, const float *stats, void *dq, void *dk, void *dv);

/* ---- attention_cudnn.cu: the same attention through cuDNN's fused scaled-dot-product attention ------------ */

/* The same operation as apex__cuda_flash_attention_fwd/bwd, on the same geometry (q, k, v, o, dout, dq,
 * dk, dv in place with their row strides, f16 or bf16), run by cuDNN 9's fused attention engine through its
 * backend API, with causal masking when causal is set (else every key counts) and scale 1 / sqrt(d).
 * Stats: cuDNN keeps the log-sum-exp L of each row alone, so the forward writes each row's pair as (m, r) =
 * (L, 1), which gives the same L = m - log r that every backward reads (args_nn.h), and the backward takes
 * any pair (the fused kernel's and the CPU's (max, 1 / sum) as well). The backward is deterministic (cuDNN's
 * dQ without atomics) unless nondeterministic is set (dQ accumulated in f32 with atomics, as
 * FlashAttention-2 does). Execution plans are built once per geometry, causal flag and direction and
 * kept; the workspace comes from the caching allocator. APEX_ERR_INVALID_ARG as the fused kernel's for
 * a wrong geometry; APEX_ERR_UNSUPPORTED, with the reason, when cuDNN is missing or refuses the shape
 * (that answer is kept too, so a refused shape costs one build), so that the caller takes another path. */
apex_status apex__cuda_sdpa_fwd(const apex__cuda_flash *g, int causal, const void *q, const void *k, const void *v, void *o,
                                float *stats);
apex_status apex__cuda_sdpa_bwd(const apex__cuda_flash *g, int causal, int nondeterministic, const void *q, const void *k,
                                const void *v, const void *o, const void *dout, const float *stats, void *dq, void *dk,
                                void *dv);
/* Whether cuDNN takes this geometry (the shape, dtype and strides of g; alignment of the pointers aside) for
 * the forward (backward 0) or the backward: APEX_OK, or APEX_ERR_UNSUPPORTED saying why (cuDNN missing,
 * the shape refused, no engine), or APEX_ERR_INVALID_ARG for a wrong geometry. Builds and keeps the plan. */
apex_status apex__cuda_sdpa_check(const apex__cuda_flash *g, int causal, int backward, int nondeterministic);


/* ---- elementwise.cu: elementwise ops and deterministic sums (see apex/cuda.h) ----------------------------- */

typedef enum apex__cuda_ew_op {
  APEX__EW_ADD,      /* y = a + b */
  APEX__EW_MUL,      /* y = a * b */
  APEX__EW_SCALE,    /* y = a * alpha */
  APEX__EW_RELU,     /* y = max(a, 0) */
  APEX__EW_RELU_BWD, /* y = a (dy) where b (x) > 0, else 0 */
  APEX__EW_GELU,     /* y = gelu_tanh(a) */
  APEX__EW_GELU_BWD  /* y = a (dy) * gelu_tanh'(b (x)) */
} apex__cuda_ew_op;
/* y[i] = op(a[i], b[i]) for i < n, in f32 from each operand's dtype, rounded to yt; b is unused (may be
 * NULL) by the unary ops, alpha by all but SCALE. y may be a or b with its dtype. */
apex_status apex__cuda_ew(apex__cuda_ew_op op, const void *a, apex_dtype at, const void *b, apex_dtype bt, float alpha,
                          void *y, apex_dtype yt, int64_t n);
/* y[j] (yt, cols elements) = the column sums of x [rows, cols] (xt) in f32, plus y[j] when accumulate. */
apex_status apex__cuda_sum_rows(const void *x, apex_dtype xt, int64_t rows, int64_t cols, void *y, apex_dtype yt,
                                int accumulate);
/* *y (f32) = the sum of x's n elements, or their mean when mean is set. */
apex_status apex__cuda_sum_all(const void *x, apex_dtype xt, int64_t n, int mean, float *y);

#ifdef __cplusplus
}
#endif
#endif
