/* gpt2_cuda.h: a GPT-2 trained on the GPU with apex's CUDA kernels, llm.c style: an explicit forward and
 * backward over include/apex/cuda.h (cuBLASLt GEMMs, layer norm, attention, GELU, cross-entropy,
 * embedding) and apex's fused AdamW with f32 masters for the step, with no autograd graph: the way
 * llm.c trains, and the way to train a transformer on a GPU where a CUDA graph lacks an op (softmax, the
 * losses, attention: see include/apex/kernels.h for the raw kernels); bench_gpt2_cuda times it
 * against PyTorch (bench/peer_gpt2.py) and test_backend_ops (tests/backend_parity_gpt2.h) checks it
 * against the same model on apex's CPU autograd. Not part of the library: benchmarks and tests compile this file in.
 *
 * The model is nanoGPT's GPT-2: token + position embeddings, L pre-norm blocks (ln_1, causal
 * self-attention with a packed q|k|v projection, ln_2, MLP 4C with GELU in the tanh form, residual
 * connections), a final layer norm and an lm_head tied to the token embedding, cross-entropy averaged
 * over the B * T positions. No dropout. Every parameter, gradient and activation has the model's dtype:
 * f32 (to check against the CPU) or bf16 (to train: the optimizer keeps f32 masters and f32 moments and
 * rounds the masters into the bf16 parameters at each step). bf16 shares f32's exponent range, so its
 * gradients do not underflow the way f16's do: no loss scaling (PyTorch's autocast in bf16 uses none
 * either). Layer-norm statistics, the attention's log-sum-exp and the per-position losses are f32.
 *
 * Usage:
 *     gpt2_cuda *m = gpt2_cuda_create(&cfg, APEX_BF16, B, T, seed);
 *     apex_optimizer *opt = gpt2_cuda_optimizer_create(m, 3e-4f, 0.1f);
 *     for (...) gpt2_cuda_train_step(m, opt, tokens, targets);       never waits for the GPU
 *     (or gpt2_cuda_train_step_graph: the same step replayed as one CUDA graph launch)
 *     gpt2_cuda_loss(m, &loss);                                        waits: the last forward's mean loss
 *
 * Every call returns APEX_OK or the status of the first apex call that failed, with apex_last_error()
 * saying which step of the model failed and why. */
#ifndef APEX_BENCH_GPT2_CUDA_H
#define APEX_BENCH_GPT2_CUDA_H

#include <stdint.h>

#include "apex/apex.h"

typedef struct gpt2_config {
  int vocab;   /* V: rows of wte and columns of the logits; 50304 for GPT-2 (50257 padded to a multiple of
                  128 as nanoGPT and llm.c do: the padded rows are ordinary, never-targeted classes) */
  int max_t;   /* rows of wpe: the longest sequence (1024) */
  int n_layer; /* L (12) */
  int n_embd;  /* C (768), a multiple of n_head */
  int n_head;  /* H (12) */
} gpt2_config;

/* GPT-2 small (124M) with nanoGPT's padded vocabulary. */
gpt2_config gpt2_config_small(void);

/* One block's parameters, PyTorch's layouts (a linear's weight is [out, in]). */
typedef struct gpt2_layer {
  apex_tensor *ln1_w, *ln1_b;       /* [C] */
  apex_tensor *qkv_w, *qkv_b;       /* [3C, C], [3C]: rows 0..C-1 make q, C..2C-1 k, 2C..3C-1 v */
  apex_tensor *proj_w, *proj_b;     /* [C, C], [C] */
  apex_tensor *ln2_w, *ln2_b;       /* [C] */
  apex_tensor *fc_w, *fc_b;         /* [4C, C], [4C] */
  apex_tensor *fcproj_w, *fcproj_b; /* [C, 4C], [C] */
} gpt2_layer;

/* All parameters (or all gradients: the same shapes). */
typedef struct gpt2_params {
  apex_tensor *wte;   /* [V, C], also the lm_head */
  apex_tensor *wpe;   /* [max_t, C] */
  gpt2_layer *layer;  /* [L] */
  apex_tensor *lnf_w, *lnf_b; /* [C] */
} gpt2_params;

#define GPT2_TENSORS_PER_LAYER 12

typedef struct gpt2_cuda {
  gpt2_config cfg;
  apex_dtype dtype; /* APEX_F32 or APEX_BF16 */
  apex_device device; /* APEX_DEVICE_CUDA, or APEX_DEVICE_CPU (gpt2_cuda_create_on) */
  int B, T;         /* the batch the activations were planned for */
  gpt2_params params, grads; /* device tensors */
  /* Every parameter (and its gradient at the same index) in one list: wte, wpe, then per layer the
   * twelve of gpt2_layer in its order, then lnf_w, lnf_b. n_tensors = 2 + 12 L + 2. */
  int n_tensors;
  apex_tensor **param_list, **grad_list;
  struct gpt2_acts *acts; /* activations and backward scratch (gpt2_cuda.c) */
} gpt2_cuda;

/* A model with GPT-2's initialisation drawn from apex's RNG seeded with `seed` on the host, then copied
 * to the GPU: weights normal(0, 0.02), the two residual projections (proj_w, fcproj_w) normal(0, 0.02 /
 * sqrt(2 L)), biases 0, layer-norm weights 1; and every activation buffer for batches of B sequences of
 * T tokens (T <= max_t). NULL with a message on a bad configuration or dtype, or when the GPU fails. */
gpt2_cuda *gpt2_cuda_create(const gpt2_config *cfg, apex_dtype dtype, int B, int T, uint64_t seed);
/* gpt2_cuda_create on a given device. APEX_DEVICE_CPU runs the same calls on apex's CPU kernels (the raw
 * kernels of apex/kernels.h take tensors of either device), without the GPU's fused paths (flash attention,
 * fused classifier, fused norms, cuBLASLt epilogues), the captured step or the profile (both
 * APEX_ERR_UNSUPPORTED there): the same model and the same initial values, slowly, so that the host-side
 * logic around the model (bench/gpt2_loss_dump.c's files, the PyTorch comparison) can be checked where there
 * is no GPU. */
gpt2_cuda *gpt2_cuda_create_on(apex_device device, const gpt2_config *cfg, apex_dtype dtype, int B, int T, uint64_t seed);
void gpt2_cuda_destroy(gpt2_cuda *m);

/* The name of tensor i of param_list ("h.3.fc_w"), into buf. */
const char *gpt2_cuda_tensor_name(const gpt2_cuda *m, int i, char *buf, size_t size);
/* Parameters: all, and those of nanoGPT's MFU estimate (all but wpe; wte counts, as the lm_head). */
int64_t gpt2_cuda_num_params(const gpt2_cuda *m);
int64_t gpt2_cuda_num_params_non_embedding(const gpt2_cuda *m);
/* Model FLOPs per token of a training step (forward + backward), nanoGPT's estimate_mfu:
 * 6 N + 12 L C T with N = gpt2_cuda_num_params_non_embedding. */
double gpt2_cuda_flops_per_token(const gpt2_cuda *m);

/* Forward over B * T host token ids (each in [0, V)) with B * T host targets: queues the logits and the
 * mean cross-entropy on the GPU and returns without waiting. The ids are copied: the caller's arrays may
 * change once it returns. In bf16 (a CUDA build) the fused classifier writes the logits' gradient over the
 * logits in the same pass as the loss (APEX_GPT2_CLASSIFIER=separate in the environment: the separate
 * forward and backward kernels instead). */
apex_status gpt2_cuda_forward(gpt2_cuda *m, const int64_t *tokens, const int64_t *targets);
/* The mean loss of the last forward (waits for the GPU). */
apex_status gpt2_cuda_loss(gpt2_cuda *m, float *loss);
/* The device f32 [1] tensor holding the last forward's mean loss (valid once the GPU gets there): copy it
 * elsewhere on the device to keep a loss history without waiting. */
const apex_tensor *gpt2_cuda_loss_tensor(const gpt2_cuda *m);
/* Backward of the last forward: writes every gradient (each is overwritten, none accumulated, so no
 * zero_grad is needed between steps). The logits buffer holds their gradient afterwards. */
apex_status gpt2_cuda_backward(gpt2_cuda *m);
/* Sets every gradient to 0 (for callers that add gradients of their own). */
apex_status gpt2_cuda_zero_grad(gpt2_cuda *m);

/* apex's AdamW over the model as nanoGPT configures it: betas (0.9, 0.95), eps 1e-8, the learning rate
 * lr; group 0 holds the 2-D weights (embeddings and linear weights) with weight decay `weight_decay`,
 * group 1 the biases and layer-norm weights without. For bf16 parameters the optimizer keeps f32
 * masters. The model must outlive the optimizer. */
apex_optimizer *gpt2_cuda_optimizer_create(gpt2_cuda *m, float lr, float weight_decay);
/* forward, backward and one optimizer step, without waiting for the GPU. */
apex_status gpt2_cuda_train_step(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets);

/* gpt2_cuda_train_step as one CUDA graph launch: the same kernels in the same order, so the same bits (losses
 * and parameters) as gpt2_cuda_train_step from the same state, with no host work or wait inside the step.
 * The first call runs the step uncaptured (so that apex's allocator holds every block it needs and cuBLASLt
 * has its plans), the second captures the whole step (forward, backward, AdamW) on apex's stream into a
 * graph and launches it, and every later call only copies this batch's ids to the device (through one of two
 * pinned buffers, waiting only when the host is two steps ahead of the GPU) and launches the graph. The graph
 * reads the ids from device buffers, so the caller's arrays may change once a call returns, as with
 * gpt2_cuda_forward. gpt2_cuda_loss and gpt2_cuda_loss_tensor read the step's loss as after an eager step,
 * and eager calls (gpt2_cuda_train_step, forward, backward) may be mixed with graph steps.
 *
 * What the graph holds fixed: the model's tensors and batch shape (fixed at creation), the optimizer `opt`
 * and its groups' options (the learning rate is a kernel argument of the captured step, so a learning-rate
 * schedule needs a new capture each time it changes: gpt2_cuda_graph_reset). The optimizer's step counts
 * live on the GPU and advance with each replay, so its bias corrections follow. Gradient clipping
 * (apex_optimizer_clip_grad_norm) is not part of the captured step, and loading the optimizer's state or
 * changing its groups needs gpt2_cuda_graph_reset.
 *
 * Errors, each leaving the model and the optimizer as they were (gpt2_cuda_train_step still trains them):
 * APEX_ERR_INVALID_ARG for a NULL argument or a token or target outside [0, V); APEX_ERR_STATE while the
 * per-call profile is on (gpt2_cuda_profile_start: it reads events between the calls of a step), for another
 * optimizer than the one the step was captured with, or for changed options (learning rate, weight decay,
 * betas, eps) since the capture; APEX_ERR_UNSUPPORTED in a build without the CUDA backend; a failed capture
 * (a call in the step that waits for the GPU or allocates more than the warm-up did) says what broke, and
 * the next call tries to capture again. */
apex_status gpt2_cuda_train_step_graph(gpt2_cuda *m, apex_optimizer *opt, const int64_t *tokens, const int64_t *targets);
/* Drops the captured step (waiting for its last replay): the next gpt2_cuda_train_step_graph warms up and
 * captures again, with the optimizer and options it is given then. NULL is fine. */
void gpt2_cuda_graph_reset(gpt2_cuda *m);
/* 1 when the step is captured (gpt2_cuda_train_step_graph launches a graph), else 0. */
int gpt2_cuda_graph_captured(const gpt2_cuda *m);

/* Which attention the model runs: "fused (flash_attention.cu)" or "materialised (attention.cu)". */
const char *gpt2_cuda_attention_path(const gpt2_cuda *m);

/* The per-call breakdown: from the next forward on, every call the model makes is timed on the GPU with
 * events, under the name its error messages give it (a format string: "h.%d c_attn" is every layer's
 * c_attn together), and the optimizer's step as "AdamW step" (gpt2_cuda_train_step). Each forward then
 * first waits for the previous step's events, so profiled steps are not the ones to time the whole step
 * with. APEX_ERR_UNSUPPORTED in a build without the CUDA backend. */
apex_status gpt2_cuda_profile_start(gpt2_cuda *m);
/* Up to max (name, milliseconds summed over the profiled steps) pairs in the order first met, and *steps
 * (may be NULL) the profiled forwards; waits for the GPU and ends the profiling. Returns the pairs' count
 * (0 when none was started). */
int gpt2_cuda_profile_read(gpt2_cuda *m, const char **labels, double *ms, int max, int *steps);

#endif
