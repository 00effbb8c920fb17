/* bench_optim.c: fused optimizer steps over 10M parameters in 20 tensors, in effective GB/s.
 *
 * Effective bytes per parameter are what the update must move at least: AdamW and LAMB read g and
 * read/write p, m, v (4 + 3 * 8 = 28 bytes); SGD with momentum reads g and reads/writes p and the
 * buffer (20); AdamW with bf16 parameters reads a bf16 g, reads/writes the f32 master, m and v and
 * writes the bf16 model copy (2 + 3 * 8 + 2 = 28). LAMB needs more traffic than that by its nature
 * (a global norm pass and two passes per group), and is still counted at 28: its ratio says how far
 * from one Adam-like pass it is.
 *
 * Peer: a triad a[i] = b[i] + s * c[i] over the same number of bytes on the same threads, measured in
 * the same run: the machine's attainable bandwidth for a streaming kernel.
 *
 * `bench_optim --time NAME` prints only `time NAME SECONDS` (best step time) for bench/peer_optim.py,
 * which compares apex with PyTorch in the same bench/run invocation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "bench_util.h"

#define NPARAMS 10000000
#define NTENSORS 20

typedef struct {
  const char *name;
  apex_optim_kind kind;
  apex_dtype dtype;
  double bytes_per_param;
  apex_optim_options o;
} config;

static const config CONFIGS[] = {
    {"optim_adamw_f32", APEX_OPTIM_ADAMW, APEX_F32, 28, {.lr = 1e-3f, .weight_decay = 0.01f}},
    {"optim_sgd_momentum_f32", APEX_OPTIM_SGD, APEX_F32, 20, {.lr = 1e-3f, .momentum = 0.9f}},
    {"optim_lamb_f32", APEX_OPTIM_LAMB, APEX_F32, 28, {.lr = 1e-3f, .weight_decay = 0.01f}},
    {"optim_adamw_bf16_master", APEX_OPTIM_ADAMW, APEX_BF16, 28, {.lr = 1e-3f, .weight_decay = 0.01f}},
};

typedef struct {
  apex_tensor *p[NTENSORS], *g[NTENSORS];
  apex_optimizer *opt;
} setup;

static int setup_init(setup *s, const config *c) {
  int64_t n = NPARAMS / NTENSORS;
  for (int i = 0; i < NTENSORS; i++) {
    s->p[i] = apex_tensor_create(c->dtype, 1, &n);
    s->g[i] = apex_tensor_create(c->dtype, 1, &n);
    if (!s->p[i] || !s->g[i] || apex_tensor_fill(s->p[i], 0.5f + 0.01f * (float)i) != APEX_OK ||
        apex_tensor_fill(s->g[i], 1e-3f * (float)(i + 1)) != APEX_OK)
      return 0;
  }
  s->opt = apex_optimizer_create(c->kind, &c->o);
  return s->opt && apex_optimizer_add_group(s->opt, s->p, NTENSORS, s->g, NTENSORS, NULL, NULL) == APEX_OK;
}

static void setup_free(setup *s) {
  apex_optimizer_destroy(s->opt);
  for (int i = 0; i < NTENSORS; i++) {
    apex_tensor_destroy(s->p[i]);
    apex_tensor_destroy(s->g[i]);
  }
}

static void step_fn(void *ctx) {
  if (apex_optimizer_step(((setup *)ctx)->opt, 1.0f, 0) != APEX_OK) {
    fprintf(stderr, "bench_optim: step failed: %s\n", apex_last_error());
    exit(1);
  }
}

typedef struct {
  float *a, *b, *c;
  size_t n;
} triad_ctx;

static void triad_fn(void *ctx) {
  triad_ctx *t = ctx;
  const size_t block = (size_t)1 << 16;
  long long nblocks = (long long)((t->n + block - 1) / block);
#pragma omp parallel for schedule(static)
  for (long long k = 0; k < nblocks; k++) {
    size_t lo = (size_t)k * block, hi = lo + block < t->n ? lo + block : t->n;
    float *restrict a = t->a;
    const float *restrict b = t->b, *restrict c = t->c;
    for (size_t i = lo; i < hi; i++) a[i] = b[i] + 0.5f * c[i];
  }
}

static void setup_or_exit(setup *s, const config *c) {
  if (!setup_init(s, c)) {
    fprintf(stderr, "bench_optim: setup of %s failed: %s\n", c->name, apex_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--time")) {
    for (size_t k = 0; k < sizeof CONFIGS / sizeof CONFIGS[0]; k++)
      if (!strcmp(argv[2], CONFIGS[k].name)) {
        setup s = {0};
        setup_or_exit(&s, &CONFIGS[k]);
        printf("time %s %.9f\n", CONFIGS[k].name, bench_best(step_fn, &s, 2, 5, 1.0));
        setup_free(&s);
        return 0;
      }
    fprintf(stderr, "bench_optim: no figure named %s\n", argv[2]);
    return 1;
  }
  for (size_t k = 0; k < sizeof CONFIGS / sizeof CONFIGS[0]; k++) {
    const config *c = &CONFIGS[k];
    if (!bench_wanted(argc, argv, c->name)) continue;
    double bytes = c->bytes_per_param * NPARAMS;
    setup s = {0};
    setup_or_exit(&s, c);
    triad_ctx t = {.n = (size_t)(bytes / 12)};
    t.a = malloc(t.n * sizeof *t.a), t.b = malloc(t.n * sizeof *t.b), t.c = malloc(t.n * sizeof *t.c);
    if (!t.a || !t.b || !t.c) {
      fprintf(stderr, "bench_optim: out of memory for the triad\n");
      return 1;
    }
    for (size_t i = 0; i < t.n; i++) t.a[i] = 0.0f, t.b[i] = 1.0f, t.c[i] = 2.0f;
    /* Interleaved rounds, best of each: both see the same moments of a shared machine. */
    double apex_s = 1e300, triad_s = 1e300;
    for (int round = 0; round < 4; round++) {
      double a = bench_best(step_fn, &s, 1, 3, 0.3), b = bench_best(triad_fn, &t, 1, 3, 0.3);
      apex_s = a < apex_s ? a : apex_s;
      triad_s = b < triad_s ? b : triad_s;
    }
    setup_free(&s);
    free(t.a), free(t.b), free(t.c);
    char name[96];
    snprintf(name, sizeof name, "%s_%dthreads", c->name, apex_get_num_threads());
    bench_report_gbs(name, bytes, apex_s, 12.0 * (double)t.n, triad_s, "triad");
  }
  return 0;
}
