/* bench_cuda.c: the CUDA backend on the GPU. Each figure against a peer in the same run:
 *   cuda_adamw_f32_100M, cuda_adamw_bf16_master_100M: the fused AdamW step over 100M parameters in 20
 *     tensors, effective GB/s at 28 bytes per parameter (f32: g, p, m, v read, p, m, v written; bf16 with
 *     f32 masters: bf16 g, master, m, v read, master, m, v and the bf16 model written), against a
 *     device-to-device copy of the same bytes (14 bytes read + 14 written per parameter);
 *   cuda_layer_norm_bf16_R: layer norm forward + backward over 16384 rows of R = 768..8192 bf16 values,
 *     effective GB/s (x, y, dy, dx at 2 bytes each, plus the f32 weight) against the same copy peer.
 *   cuda_matmul_bf16_8192: an 8192^3 bf16 GEMM with f32 accumulation, TFLOP/s (peer: none here; PyTorch
 *     in bench/peer_cuda.py).
 * `bench_cuda --time NAME` prints only apex's seconds per iteration, for peer_cuda.py.
 * Skipped, with the reason, without a GPU. Timing: the host clock around a synchronised loop, best of
 * several rounds; every kernel is queued on one stream, so the loop measures the GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "bench_util.h"

static double time_loop(void (*fn)(void *), void *ctx, int iters) {
  double best = 1e30;
  fn(ctx); /* warm up: allocations, cuBLASLt's heuristics */
  apex_cuda_synchronize();
  for (int round = 0; round < 5; round++) {
    double t0 = bench_now();
    for (int i = 0; i < iters; i++) fn(ctx);
    apex_cuda_synchronize();
    double t = (bench_now() - t0) / iters;
    if (t < best) best = t;
  }
  return best;
}

/* Uniform values in [-1, 1) from apex's RNG (never time on zeros). */
static void random_fill(apex_tensor *t, uint64_t seed) {
  size_t n = apex_tensor_numel(t);
  float *tmp = malloc(n * sizeof *tmp);
  apex_rng rng = apex_rng_init(seed);
  apex_rng_uniform(&rng, tmp, n);
  for (size_t i = 0; i < n; i++) tmp[i] = 2.0f * tmp[i] - 1.0f;
  int64_t len = (int64_t)n;
  apex_tensor *h = apex_tensor_wrap(tmp, APEX_F32, 1, &len);
  apex_tensor_copy(t, h);
  apex_tensor_destroy(h);
  free(tmp);
}

typedef struct {
  apex_tensor *src, *dst;
} copy_ctx;
static void copy_step(void *c) {
  copy_ctx *x = c;
  apex_tensor_copy(x->dst, x->src);
}

/* A device-to-device copy of `bytes` read + `bytes` written; seconds per copy. */
static double copy_seconds(size_t bytes) {
  int64_t n = (int64_t)(bytes / 4);
  copy_ctx c = {apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &n), apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &n)};
  double t = time_loop(copy_step, &c, 20);
  apex_tensor_destroy(c.src);
  apex_tensor_destroy(c.dst);
  return t;
}

typedef struct {
  apex_optimizer *opt;
} step_ctx;
static void optim_step(void *c) { apex_optimizer_step(((step_ctx *)c)->opt, 1.0f, 0); }

static double adamw_seconds(apex_dtype dt, size_t nparams, int ntensors) {
  apex_tensor **p = calloc((size_t)ntensors, sizeof *p), **g = calloc((size_t)ntensors, sizeof *g);
  int64_t each = (int64_t)(nparams / (size_t)ntensors);
  for (int i = 0; i < ntensors; i++) {
    p[i] = apex_tensor_create_on(APEX_DEVICE_CUDA, dt, 1, &each);
    g[i] = apex_tensor_create_on(APEX_DEVICE_CUDA, dt, 1, &each);
    apex_tensor_fill(p[i], 0.5f);
    apex_tensor_fill(g[i], 1e-3f);
  }
  step_ctx c = {apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-2f})};
  double t = -1;
  if (apex_optimizer_add_group(c.opt, p, ntensors, g, ntensors, NULL, NULL) == APEX_OK) t = time_loop(optim_step, &c, 10);
  else fprintf(stderr, "bench_cuda: %s\n", apex_last_error());
  apex_optimizer_destroy(c.opt);
  for (int i = 0; i < ntensors; i++) apex_tensor_destroy(p[i]), apex_tensor_destroy(g[i]);
  free(p);
  free(g);
  return t;
}

typedef struct {
  apex_tensor *x, *w, *b, *y, *mean, *rstd, *dy, *dx, *dw, *db;
} ln_ctx;
static void ln_step(void *v) {
  ln_ctx *c = v;
  apex_kernel_layer_norm_forward(c->x, c->w, c->b, 1e-5f, 0, c->y, c->mean, c->rstd);
  apex_kernel_layer_norm_backward(c->dy, c->x, c->w, c->mean, c->rstd, 0, c->dx, c->dw, c->db);
}

static double layer_norm_seconds(int64_t rows, int64_t cols, size_t *bytes) {
  int64_t shape[2] = {rows, cols};
  ln_ctx c;
  c.x = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, shape);
  c.y = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, shape);
  c.dy = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, shape);
  c.dx = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, shape);
  c.w = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &cols);
  c.b = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &cols);
  c.dw = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &cols);
  c.db = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &cols);
  c.mean = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &rows);
  c.rstd = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &rows);
  random_fill(c.x, 1);
  random_fill(c.dy, 2);
  apex_tensor_fill(c.w, 1.1f);
  /* forward reads x, writes y; backward reads dy and x (twice: dx, then dw/db), writes dx */
  *bytes = (size_t)(rows * cols) * 2 * 6;
  double t = time_loop(ln_step, &c, 20);
  apex_tensor *all[] = {c.x, c.w, c.b, c.y, c.mean, c.rstd, c.dy, c.dx, c.dw, c.db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  return t;
}

typedef struct {
  apex_tensor *a, *b, *c;
} mm_ctx;
static void mm_step(void *v) {
  mm_ctx *c = v;
  apex_kernel_matmul(c->a, 0, c->b, 0, c->c, 1.0f, 0.0f, NULL, 0);
}

static double matmul_seconds(int64_t n) {
  int64_t s[2] = {n, n};
  mm_ctx c = {apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, s), apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, s),
              apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, s)};
  random_fill(c.a, 3);
  random_fill(c.b, 4);
  double t = time_loop(mm_step, &c, 10);
  apex_tensor_destroy(c.a), apex_tensor_destroy(c.b), apex_tensor_destroy(c.c);
  return t;
}

/* 768: GPT-2 small's width, whose layer norms took 14% of the GPT-2 side program's step in the H200 run of 2026-11-26 */
static const int64_t LN_COLS[] = {768, 1024, 2048, 4096, 8192};
#define N_LN_COLS (int)(sizeof LN_COLS / sizeof LN_COLS[0])
#define LN_ROWS 16384
#define NPARAMS ((size_t)100000000)

int main(int argc, char **argv) {
  const char *why;
  if (!apex_cuda_available(&why)) {
    bench_skip("cuda", why);
    return 0;
  }
  if (argc == 3 && !strcmp(argv[1], "--time")) { /* for peer_cuda.py: one figure's seconds per iteration */
    size_t bytes;
    double t = -1;
    if (!strcmp(argv[2], "cuda_adamw_f32_100M")) t = adamw_seconds(APEX_F32, NPARAMS, 20);
    else if (!strcmp(argv[2], "cuda_adamw_bf16_master_100M")) t = adamw_seconds(APEX_BF16, NPARAMS, 20);
    else if (!strcmp(argv[2], "cuda_matmul_bf16_8192")) t = matmul_seconds(8192);
    for (int i = 0; i < N_LN_COLS; i++) {
      char name[64];
      snprintf(name, sizeof name, "cuda_layer_norm_bf16_%lld", (long long)LN_COLS[i]);
      if (!strcmp(argv[2], name)) t = layer_norm_seconds(LN_ROWS, LN_COLS[i], &bytes);
    }
    printf("%.9f\n", t);
    return t > 0 ? 0 : 1;
  }
  char dev[128];
  apex_cuda_device_name(dev, sizeof dev);
  printf("# bench_cuda on %s\n", dev);
  double copy28 = copy_seconds(NPARAMS * 14);
  if (bench_wanted(argc, argv, "cuda_adamw_f32_100M"))
    bench_report_gbs("cuda_adamw_f32_100M", 28.0 * NPARAMS, adamw_seconds(APEX_F32, NPARAMS, 20), 28.0 * NPARAMS, copy28,
                     "device-to-device copy");
  if (bench_wanted(argc, argv, "cuda_adamw_bf16_master_100M"))
    bench_report_gbs("cuda_adamw_bf16_master_100M", 28.0 * NPARAMS, adamw_seconds(APEX_BF16, NPARAMS, 20),
                     28.0 * NPARAMS, copy28, "device-to-device copy");
  for (int i = 0; i < N_LN_COLS; i++) {
    char name[64];
    snprintf(name, sizeof name, "cuda_layer_norm_bf16_%lld", (long long)LN_COLS[i]);
    if (!bench_wanted(argc, argv, name)) continue;
    size_t bytes;
    double t = layer_norm_seconds(LN_ROWS, LN_COLS[i], &bytes);
    bench_report_gbs(name, (double)bytes, t, (double)bytes, copy_seconds(bytes / 2), "device-to-device copy");
  }
  if (bench_wanted(argc, argv, "cuda_matmul_bf16_8192")) {
    double t = matmul_seconds(8192);
    bench_report("cuda_matmul_bf16_8192", 2.0 * 8192.0 * 8192.0 * 8192.0 / t / 1e12, "TFLOP/s", 0, "torch.matmul in peer_cuda.py");
  }
  return 0;
}
