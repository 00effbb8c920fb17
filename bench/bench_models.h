/* bench_models.h: the training benchmarks' models and one training step over them, built in one
 * place so that every benchmark (bench_amp, bench_nn, bench_contention) and the PyTorch peer
 * (bench/peer_nn.py, which builds the same networks) measure the same work.
 *
 * Models, by the names the bench lines use:
 *   mlp       784-1024-1024-10 with ReLU, batch 128 of [784] images;
 *   cnn       conv 32 + BN + ReLU + pool, conv 64 + BN + ReLU + pool, linear 128, linear 10, batch 128
 *             of [1, 28, 28] images;
 *   gpt_c256  byte-level GPT-2 (vocab 256, pre-norm blocks, tied output): L=4, C=256, 4 heads, T=256, B=4;
 *   gpt_c768  the same at L=12, C=768, 12 heads (GPT-2 small's width and depth), T=256, B=4.
 * A step is forward, cross-entropy, backward and AdamW (lr 1e-3, weight decay 1e-2), through amp at
 * the given opt level. */
#ifndef APEX_BENCH_MODELS_H
#define APEX_BENCH_MODELS_H

#include "apex/apex.h"

typedef enum { BENCH_MLP, BENCH_CNN, BENCH_GPT_C256, BENCH_GPT_C768, BENCH_MODEL_COUNT } bench_model;

/* "mlp", "cnn", "gpt_c256", "gpt_c768". */
const char *bench_model_name(bench_model model);
/* Samples a step trains: images for mlp and cnn, tokens (B * T) for the GPTs. */
int bench_model_samples(bench_model model);

/* The networks of mlp and cnn (also used by bench_amp's memory figures at other batch sizes). */
apex_module *bench_mlp(apex_model *m);
apex_module *bench_cnn(apex_model *m);

typedef struct bench_train {
  bench_model model;
  int batch;
  apex_model *m;
  apex_module *net;                         /* mlp, cnn */
  apex_module *wte, *wpe, *ln_f, **blocks;  /* gpt */
  int n_layer;
  int64_t seq;
  apex_optimizer *opt;
  apex_amp *amp;
  apex_graph *g;
  apex_tensor *x;  /* mlp, cnn: images */
  int64_t *ids;    /* gpt: tokens [batch, seq] */
  int64_t *labels; /* per sample */
} bench_train;

/* Builds `model` (batch 0: the model's own) with AdamW under amp at `level` ("O0".."O3") with
 * half_type bf16; exits the program with a message on failure (a benchmark has nothing to return). */
void bench_train_init(bench_train *r, bench_model model, int batch, const char *level);
/* One training step (a void * for bench_best). */
void bench_train_step(void *r);
/* The forward up to the loss, for figures that stop there. */
apex_var *bench_train_loss(bench_train *r);
void bench_train_free(bench_train *r);

/* Best step time in seconds, with warmup and reps scaled down for the big models (a C768 step takes
 * seconds on two cores): at least `reps` steps and min_s seconds for mlp and cnn, 2 steps for the GPTs. */
double bench_train_time(bench_train *r, int warmup);

#endif
