/* models.h: ready-made models, the ones apex-train trains: an MLP and a CNN for 28x28 greyscale images
 * (Fashion-MNIST) and a GPT-2 style transformer for tokens. Each builder adds its modules and
 * parameters to an apex_model (nn.h), which owns them: there is nothing else to free. A checkpoint
 * apex-train writes (model.safetensors) loads into a model built here with the same sizes
 * (apex_model_load_f32), because the parameter names below are the ones apex-train saves.
 *
 *     apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
 *     apex_module *gpt = apex_gpt_create(m, &(apex_gpt_options){.n_layer = 4, .n_embd = 128});
 *     apex_model_load_f32(m, NULL, "ck/step-100/model.safetensors");    optional
 *     apex_graph *g = apex_graph_create();
 *     apex_var *logits = apex_gpt_forward(gpt, g, ids, B, T);             [B * T, vocab], f32
 *     apex_gpt_generate(gpt, g, prompt, 1, T, 200, out, &(apex_gpt_generate_options){.temperature = 0.8f});
 *
 * Parameters are drawn from the model's seeded generator in creation order (nn.h's rules), so the
 * same seed and options give the same bits as apex-train's --seed. Every option struct may be NULL,
 * and a zero field means the default given beside it. Builders return NULL with a message
 * (apex_last_error) for a NULL model, a negative size, sizes that do not fit together, or a model
 * that already has modules of the same names (one model per apex_model). */
#ifndef APEX_MODELS_H
#define APEX_MODELS_H

#include <stdint.h>

#include "apex/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- MLP: in_features -> hidden -> hidden / 2 -> classes, ReLU between ----------------------- */

typedef struct apex_mlp_options {
  int64_t in_features; /* [784: a flattened 28x28 image] */
  int64_t hidden;      /* the first hidden width, the second has half [512]; at least 2 */
  int64_t classes;     /* [10] */
} apex_mlp_options;

/* A Sequential of Linear(in, hidden) "0", ReLU, Linear(hidden, hidden / 2) "2", ReLU,
 * Linear(hidden / 2, classes) "4", so the parameters are "0.weight" [hidden, in], "0.bias" [hidden],
 * "2.weight" [hidden / 2, hidden], "2.bias", "4.weight" [classes, hidden / 2], "4.bias" (PyTorch's
 * nn.Sequential names; nn.Linear's initialisation). Run it with apex_module_forward (or
 * apex_amp_forward) on x [N, in_features]: logits [N, classes]. APEX_ERR_INVALID_ARG for a negative
 * size or hidden < 2. */
APEX_API apex_module *apex_mlp_create(apex_model *m, const apex_mlp_options *opts);

/* ---- CNN: conv32-bn-relu-pool, conv64-bn-relu-pool, 128, classes ------------------------------ */

typedef struct apex_cnn_options {
  int64_t in_h, in_w; /* the image's size, one channel [28 x 28]; each at least 4 */
  int64_t classes;    /* [10] */
} apex_cnn_options;

/* A Sequential of Conv2d(1, 32, 3x3, padding 1) "0", BatchNorm2d(32) "1", ReLU, MaxPool 2x2,
 * Conv2d(32, 64, 3x3, padding 1) "4", BatchNorm2d(64) "5", ReLU, MaxPool 2x2, Flatten,
 * Linear(64 * (in_h / 4) * (in_w / 4), 128) "9" (the pools floor), ReLU, Linear(128, classes) "11".
 * Parameters: "0.weight" [32, 1, 3, 3], "0.bias" [32], "1.weight", "1.bias" [32], "4.weight"
 * [64, 32, 3, 3], "4.bias", "5.weight", "5.bias" [64], "9.weight" [128, 64 * (in_h/4) * (in_w/4)],
 * "9.bias", "11.weight" [classes, 128], "11.bias"; buffers "1.running_mean", "1.running_var",
 * "5.running_mean", "5.running_var". Run it with apex_module_forward (or apex_amp_forward) on
 * x [N, 1, in_h, in_w]: logits [N, classes]; batch norm follows apex_model_train's mode.
 * APEX_ERR_INVALID_ARG for a negative size or an image under 4x4. */
APEX_API apex_module *apex_cnn_create(apex_model *m, const apex_cnn_options *opts);

/* ---- GPT: GPT-2's architecture --------------------------------------------------------------- */

typedef struct apex_gpt_options {
  int64_t vocab;       /* tokens [256: bytes] */
  int64_t n_layer;     /* transformer blocks [2] */
  int64_t n_embd;      /* width [64]; a multiple of n_head */
  int64_t n_head;      /* attention heads [4] */
  int64_t n_positions; /* rows of the position table, the longest sequence it runs [64] */
} apex_gpt_options;

/* GPT-2: token and position embeddings, n_layer pre-norm blocks (apex_transformer_block_create:
 * layer norm eps 1e-5, causal attention scaled by 1/sqrt(n_embd / n_head), GELU with the tanh
 * approximation, every linear with a bias), a final layer norm, and the output tied to the token
 * embedding (logits = h wte^T: no separate head). Parameters, C = n_embd:
 *   "wte.weight" [vocab, C], "wpe.weight" [n_positions, C]             N(0, 0.02), as GPT-2's
 *   "hL.ln1.weight", "hL.ln1.bias", "hL.ln2.weight", "hL.ln2.bias" [C]  ones, zeros
 *   "hL.attn.q|k|v|proj.weight" [C, C], "hL.attn.q|k|v|proj.bias" [C]
 *   "hL.fc.weight" [4C, C], "hL.fc.bias" [4C], "hL.proj.weight" [C, 4C], "hL.proj.bias" [C]
 *   "ln_f.weight", "ln_f.bias" [C]
 * for L = 0 .. n_layer - 1, in that order; the linears have nn.Linear's initialisation (weights
 * [out, in], as PyTorch's, not GPT-2's Conv1D [in, out]). APEX_ERR_INVALID_ARG for a negative size or
 * an n_embd that n_head does not divide. The module runs only through apex_gpt_forward. */
APEX_API apex_module *apex_gpt_create(apex_model *m, const apex_gpt_options *opts);

/* Logits [B * T, vocab] (f32 whatever the model's dtype) of the token ids [B, T] (row-major, each in
 * [0, vocab)), recorded on g so that apex_backward reaches every parameter. APEX_ERR_INVALID_ARG for
 * a module that is not a GPT, NULL g or ids, B or T < 1, or T > n_positions (the position table's
 * rows); the embedding's error for an id out of range. */
APEX_API apex_var *apex_gpt_forward(apex_module *gpt, apex_graph *g, const int64_t *ids, int64_t B, int64_t T);

/* The model's loss on token ids [B, T] against targets [B, T] (the next tokens; each in [0, vocab)): the
 * mean cross entropy over the B * T positions, f32 [], recorded on g like apex_gpt_forward. The tied
 * head and the loss run as one op (apex_linear_cross_entropy, nn_ops.h): the head reads wte where it
 * is, the logits stay in the model's (or autocast's) dtype and their f32 gradient is made a chunk of
 * rows at a time, so a training step never holds the [B * T, vocab] f32 logits or their gradient that
 * apex_gpt_forward + apex_cross_entropy hold. Errors as apex_gpt_forward's, and APEX_ERR_INVALID_ARG
 * for NULL targets or a target out of range. */
APEX_API apex_var *apex_gpt_loss(apex_module *gpt, apex_graph *g, const int64_t *ids, const int64_t *targets, int64_t B, int64_t T);

/* apex_gpt_forward and apex_gpt_loss with the token ids and targets [B, T] in indexes (index.h) on the
 * graph's device: the same values and gradients, bit for bit, and nothing of the step goes through the
 * host, so a step built on them can be captured (capture.h). The positions 0..T-1 are an index the GPT
 * makes the first time it sees T on that device and keeps until the model is destroyed. Errors as the
 * host calls', APEX_ERR_SHAPE for ids that are not 2-d or targets of another shape, APEX_ERR_INVALID_ARG
 * for an index bounded above the vocabulary, APEX_ERR_DEVICE for an index on another device than g. */
APEX_API apex_var *apex_gpt_forward_index(apex_module *gpt, apex_graph *g, const apex_index *ids);
APEX_API apex_var *apex_gpt_loss_index(apex_module *gpt, apex_graph *g, const apex_index *ids, const apex_index *targets);

/* The sizes gpt was built with, every field resolved (no zero). APEX_ERR_INVALID_ARG for NULL
 * arguments or a module that is not a GPT. */
APEX_API apex_status apex_gpt_sizes(const apex_module *gpt, apex_gpt_options *out);

/* ---- GPT: generation with a key/value cache (generate.c) -------------------------------------- */

/* Called after each generation step with the B new tokens (one per row), i counting from 0: for
 * printing them as they come. */
typedef void (*apex_gpt_token_fn)(void *ctx, int64_t i, const int64_t *tokens, int64_t B);

typedef struct apex_gpt_generate_options {
  float temperature;     /* 0: greedy, the most likely token (the lowest id on a tie); > 0: sampled
                            from softmax(logits / temperature) [0] */
  int64_t top_k;         /* > 0: sampled among the top_k most likely tokens only (ties at the edge go
                            to the lower id) [0: the whole vocabulary] */
  uint64_t seed;         /* the sampling generator's seed (apex_rng_init); one uniform draw per row
                            per step, rows in order [0] */
  apex_gpt_token_fn on_token; /* [NULL] */
  void *ctx;             /* on_token's first argument */
} apex_gpt_generate_options;

/* n_new tokens after each of B prompts prompt [B, T] (row-major, ids in [0, vocab)), written to out
 * [B, n_new], computed on g (its device is the model's; its autocast applies, as to
 * apex_gpt_forward). Incremental decoding: the prompt runs once through the model (a prefill) and
 * each new token then costs one token's work, its keys and values appended to a cache (per layer
 * [B, n_head, n_positions, n_embd / n_head], the dtype the model's k and v linears give, on g's
 * device) against which its query attends, and only the last position's logits are made.
 * Tokens are those of apex_gpt_forward on the same window, argmax of its last row at temperature 0
 * (the sums run in another order, so a logit may differ in its last bits). The window: the model
 * sees at most n_positions tokens (a longer prompt: its last n_positions); when the cache is full,
 * it restarts from the last (n_positions + 1) / 2 tokens with one prefill. Deterministic: the same
 * model, prompt, options and CPU path give the same tokens whatever the thread count.
 * g runs without recording (its grad mode is restored) and is reset after every step: vars made on
 * it before the call are invalid after it. APEX_ERR_INVALID_ARG for a module that is not a GPT, NULL
 * g, prompt or out (out may be NULL only when n_new is 0), B or T < 1, n_new < 0, a temperature that
 * is negative or not finite, a negative top_k, or a prompt id outside [0, vocab); APEX_ERR_NONFINITE
 * when a row's logits hold NaN (a diverged model); an op's error otherwise. */
APEX_API apex_status apex_gpt_generate(apex_module *gpt, apex_graph *g, const int64_t *prompt, int64_t B, int64_t T,
                                       int64_t n_new, int64_t *out, const apex_gpt_generate_options *opts);

#ifdef __cplusplus
}
#endif
#endif
