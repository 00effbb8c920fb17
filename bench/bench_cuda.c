/* bench_cuda.c: the CUDA backend on the GPU. Each figure against a peer in the same run:
 *   cuda_adamw_f32_100M, cuda_adamw_bf16_master_100M: the fused AdamW step over 100M parameters in 20
 *     tensors, effective GB/s at 28 bytes per parameter (f32: g, p, m, v read, p, m, v written; bf16 with
 *     f32 masters: bf16 g, master, m, v read, master, m, v and the bf16 model written), against a
 *     device-to-device copy of the same bytes (14 bytes read + 14 written per parameter);
 *   cuda_lamb_f32_100M, cuda_novograd_f32_100M, cuda_adamp_f32_100M: the other fused steps with norms between
 *     their passes, the same 100M f32 parameters in 20 tensors (AdamP's of 2000 x 2500, so that its channel
 *     view has rows), effective GB/s at what each step must move per parameter (no peer in PyTorch: against
 *     the copy of the same bytes, half read, half written):
 *       LAMB 52: its default global-norm clipping (max_grad_norm 1) reads g (4), stage 1 reads g, p, m, v and
 *         writes m, v, u (28), ||p|| and ||u|| read p, u (8), stage 2 reads p, u and writes p (12);
 *       NovoGrad 24: ||g|| reads g (4), the update reads g, p, m and writes m, p (20);
 *       AdamP 40: the rows pass reads g, p, m, v and writes m, v, u (28), apply reads p, u and writes p (12);
 *   cuda_layer_norm_bf16_R, cuda_rms_norm_bf16_R: layer norm (RMSNorm: the same kernels with rms = 1, no
 *     bias) forward + backward over 16384 rows of R bf16 values (R = 256..8192; RMSNorm at 768 and 4096),
 *     effective GB/s (x, y, dy, dx at 2 bytes each, x read twice, plus the f32 weight) against the same
 *     copy peer;
 *   cuda_matmul_bf16_8192: an 8192^3 bf16 GEMM with f32 accumulation, and cuda_matmul_bf16_m8192_k768_nN:
 *     GPT-2 small's forward products x w^T at B * T = 8192 rows, x [8192, 768], w [N, 768] for N = 2304
 *     (q, k, v), 3072 (the MLP's first) and 50304 (the head), TFLOP/s (peer: none here; torch.matmul in
 *     bench/peer_cuda.py).
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

/* kind's step over nparams parameters of dtype dt (bf16: with f32 masters) in ntensors tensors, each of
 * [rows, nparams / ntensors / rows] (rows 0: 1-D). */
static double optim_seconds(apex_optim_kind kind, apex_dtype dt, size_t nparams, int ntensors, int64_t rows) {
  apex_tensor **p = calloc((size_t)ntensors, sizeof *p), **g = calloc((size_t)ntensors, sizeof *g);
  int64_t each = (int64_t)(nparams / (size_t)ntensors);
  int64_t shape[2] = {rows, rows ? each / rows : each};
  int nd = rows ? 2 : 1;
  for (int i = 0; i < ntensors; i++) {
    p[i] = apex_tensor_create_on(APEX_DEVICE_CUDA, dt, nd, rows ? shape : &each);
    g[i] = apex_tensor_create_on(APEX_DEVICE_CUDA, dt, nd, rows ? shape : &each);
    apex_tensor_fill(p[i], 0.5f);
    apex_tensor_fill(g[i], 1e-3f);
  }
  step_ctx c = {apex_optimizer_create(kind, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-2f})};
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
  int rms;
} ln_ctx;
static apex_status ln_run(ln_ctx *c) {
  apex_status st = apex_kernel_layer_norm_forward(c->x, c->w, c->rms ? NULL : c->b, 1e-5f, c->rms, c->y, c->mean, c->rstd);
  if (st != APEX_OK) return st;
  return apex_kernel_layer_norm_backward(c->dy, c->x, c->w, c->mean, c->rstd, c->rms, c->dx, c->dw, c->rms ? NULL : c->db);
}
static void ln_step(void *v) { ln_run(v); }

/* Layer norm (rms: RMSNorm) forward + backward on [rows, cols] bf16; *bytes: what it must move. */
static double norm_seconds(int64_t rows, int64_t cols, int rms, size_t *bytes) {
  int64_t shape[2] = {rows, cols};
  ln_ctx c;
  c.rms = rms;
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
  double t = -1;
  if (ln_run(&c) == APEX_OK) t = time_loop(ln_step, &c, 20);
  else fprintf(stderr, "bench_cuda: %s\n", apex_last_error());
  apex_tensor *all[] = {c.x, c.w, c.b, c.y, c.mean, c.rstd, c.dy, c.dx, c.dw, c.db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
  return t;
}

typedef struct {
  apex_tensor *a, *b, *c;
  int trans_b;
} mm_ctx;
static apex_status mm_run(mm_ctx *c) { return apex_kernel_matmul(c->a, 0, c->b, c->trans_b, c->c, 1.0f, 0.0f, NULL, 0); }
static void mm_step(void *v) { mm_run(v); }

/* c [m, n] = a [m, k] times b [k, n], or (trans_b) times the transpose of b [n, k]: a layer's x w^T. */
static double matmul_seconds(int64_t m, int64_t k, int64_t n, int trans_b) {
  int64_t sa[2] = {m, k}, sb[2] = {trans_b ? n : k, trans_b ? k : n}, sc[2] = {m, n};
  mm_ctx c = {apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, sa), apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, sb),
              apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, sc), trans_b};
  random_fill(c.a, 3);
  random_fill(c.b, 4);
  double t = -1;
  if (mm_run(&c) == APEX_OK) t = time_loop(mm_step, &c, 10);
  else fprintf(stderr, "bench_cuda: %s\n", apex_last_error());
  apex_tensor_destroy(c.a), apex_tensor_destroy(c.b), apex_tensor_destroy(c.c);
  return t;
}

/* The figures, each a line. 768: GPT-2 small's width, whose layer norms took 14% of the GPT-2 side program's step
 * in the H200 run of 2026-11-26; 256 and 512: the small widths where a row is a few warps' work. */
enum { FIG_OPTIM, FIG_NORM, FIG_MATMUL };
typedef struct {
  int kind;
  apex_dtype dt;      /* FIG_OPTIM: the parameters' dtype */
  int64_t m, k, n;    /* FIG_OPTIM: m the apex_optim_kind, k the bytes a parameter must move, n the tensors' rows
                       * (0: 1-D); FIG_NORM: n columns, k = 1 for RMSNorm; FIG_MATMUL: the product's shape */
  int trans_b;        /* FIG_MATMUL: x w^T */
  char name[64];
} figure;

#define LN_ROWS 16384
#define NPARAMS ((size_t)100000000)
static const int64_t LN_COLS[] = {256, 512, 768, 1024, 2048, 4096, 8192}, RMS_COLS[] = {768, 4096};
static const int64_t GPT2_N[] = {2304, 3072, 50304}; /* x [8192, 768] times w^T: q k v, the MLP's first, the head */
#define COUNT(a) (int)(sizeof a / sizeof a[0])
#define MAX_FIGURES 32
_Static_assert(5 + COUNT(LN_COLS) + COUNT(RMS_COLS) + 1 + COUNT(GPT2_N) <= MAX_FIGURES, "figures() fills fig[MAX_FIGURES]");

static int figures(figure *f) {
  int n = 0;
  f[n++] = (figure){FIG_OPTIM, APEX_F32, APEX_OPTIM_ADAMW, 28, 0, 0, "cuda_adamw_f32_100M"};
  f[n++] = (figure){FIG_OPTIM, APEX_BF16, APEX_OPTIM_ADAMW, 28, 0, 0, "cuda_adamw_bf16_master_100M"};
  f[n++] = (figure){FIG_OPTIM, APEX_F32, APEX_OPTIM_LAMB, 52, 0, 0, "cuda_lamb_f32_100M"};
  f[n++] = (figure){FIG_OPTIM, APEX_F32, APEX_OPTIM_NOVOGRAD, 24, 0, 0, "cuda_novograd_f32_100M"};
  f[n++] = (figure){FIG_OPTIM, APEX_F32, APEX_OPTIM_ADAMP, 40, 2000, 0, "cuda_adamp_f32_100M"};
  for (int i = 0; i < COUNT(LN_COLS); i++) {
    f[n] = (figure){FIG_NORM, APEX_BF16, LN_ROWS, 0, LN_COLS[i], 0, ""};
    snprintf(f[n++].name, sizeof f->name, "cuda_layer_norm_bf16_%lld", (long long)LN_COLS[i]);
  }
  for (int i = 0; i < COUNT(RMS_COLS); i++) {
    f[n] = (figure){FIG_NORM, APEX_BF16, LN_ROWS, 1, RMS_COLS[i], 0, ""};
    snprintf(f[n++].name, sizeof f->name, "cuda_rms_norm_bf16_%lld", (long long)RMS_COLS[i]);
  }
  f[n++] = (figure){FIG_MATMUL, APEX_BF16, 8192, 8192, 8192, 0, "cuda_matmul_bf16_8192"};
  for (int i = 0; i < COUNT(GPT2_N); i++) {
    f[n] = (figure){FIG_MATMUL, APEX_BF16, 8192, 768, GPT2_N[i], 1, ""};
    snprintf(f[n++].name, sizeof f->name, "cuda_matmul_bf16_m8192_k768_n%lld", (long long)GPT2_N[i]);
  }
  return n;
}

/* Seconds per iteration of figure f, and in *work what an iteration does (bytes moved, or FLOPs). */
static double figure_seconds(const figure *f, double *work) {
  size_t bytes = 0;
  double t = -1;
  switch (f->kind) {
    case FIG_OPTIM:
      t = optim_seconds((apex_optim_kind)f->m, f->dt, NPARAMS, 20, f->n);
      *work = (double)f->k * NPARAMS;
      break;
    case FIG_NORM:
      t = norm_seconds(f->m, f->n, (int)f->k, &bytes);
      *work = (double)bytes;
      break;
    case FIG_MATMUL:
      t = matmul_seconds(f->m, f->k, f->n, f->trans_b);
      *work = 2.0 * (double)f->m * (double)f->k * (double)f->n;
      break;
  }
  return t;
}

int main(int argc, char **argv) {
  const char *why;
  if (!apex_cuda_available(&why)) {
    bench_skip("cuda", why);
    return 0;
  }
  figure fig[MAX_FIGURES];
  int nfig = figures(fig);
  double work;
  if (argc == 3 && !strcmp(argv[1], "--time")) { /* for peer_cuda.py: one figure's seconds per iteration */
    double t = -1;
    for (int i = 0; i < nfig; i++)
      if (!strcmp(argv[2], fig[i].name)) t = figure_seconds(&fig[i], &work);
    printf("%.9f\n", t);
    return t > 0 ? 0 : 1;
  }
  char dev[128];
  apex_cuda_device_name(dev, sizeof dev);
  printf("# bench_cuda on %s\n", dev);
  double copy28 = copy_seconds(NPARAMS * 14);
  for (int i = 0; i < nfig; i++) {
    if (!bench_wanted(argc, argv, fig[i].name)) continue;
    double t = figure_seconds(&fig[i], &work);
    if (t <= 0) {
      bench_skip(fig[i].name, "failed (the message above says why)");
      continue;
    }
    if (fig[i].kind == FIG_MATMUL)
      bench_report(fig[i].name, work / t / 1e12, "TFLOP/s", 0, "torch.matmul in peer_cuda.py");
    else /* the copy of the same bytes (half read, half written) */
      bench_report_gbs(fig[i].name, work, t, work, work == 28.0 * NPARAMS ? copy28 : copy_seconds((size_t)work / 2),
                       "device-to-device copy");
  }
  return 0;
}
