/* bench_attention.c: causal self-attention on the GPU, forward + backward, GPT-2's shapes: B = 8, H = 12,
 * head dim 64, T = 1024 and 2048, bf16, heads read in place from the packed qkv [B, T, 3C] (as GPT's c_attn
 * makes it), the gradients written into a packed dqkv.
 *
 * For each T it prints
 *     bench attention_<T>_fwdbwd_ms MS ms ratio=R peer=...     the fused kernel (flash_attention.cu)
 *     bench attention_<T>_fwd_ms, attention_<T>_bwd_ms          its two halves
 *     bench attention_<T>_fwdbwd_tflops                         4 B H T^2 d / 2 (forward) x 3.5 (FlashAttention's
 *                                                               count: the backward is 2.5 forwards) over the time
 *     bench attention_<T>_materialised_fwdbwd_ms                the materialised path (attention.cu: permutes, T x T
 *                                                               scores, softmax kernels), ratio = materialised / fused
 *     bench attention_<T>_road_<R>_fwdbwd_ms                   the library's attention as a user calls it
 *                                                               (apex_kernel_attention_forward/backward) with
 *                                                               APEX_ATTENTION=R: flash (apex's kernel), cudnn
 *                                                               (cuDNN's fused attention, deterministic backward),
 *                                                               cudnn-nondeterministic; each with the ratio
 *                                                               against the peer, so one run decides the default
 *                                                               (these include the slot's f32 gradient landing)
 * R for the fused line is PyTorch's scaled_dot_product_attention(is_causal=True) forward + backward time over
 * apex's (R >= 1: apex faster), when the peer's milliseconds are passed in with --peer-ms-1024 X
 * --peer-ms-2048 Y; bench/peer_attention.py measures PyTorch and runs this program for both figures.
 * `--time` prints only `T MS` lines for the fused forward + backward (for peer_attention.py).
 * Timing: the host clock around a synchronised loop of 20 iterations, best of 5 rounds (one stream: the
 * loop measures the GPU). Skipped, with the reason, without a GPU or without CUDA in the build. */
#define _POSIX_C_SOURCE 200809L /* setenv: the road knob, APEX_ATTENTION */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "bench_util.h"

#if APEX_BENCH_CUDA
#include "backend/cuda/cuda_internal.h"

enum { B = 8, H = 12, D = 64, C = H * D };

struct ctx {
  int t, which; /* which: 0 fused fwd, 1 fused bwd, 2 fused both, 3 materialised both, 4 the public calls */
  void *qkv, *y, *dy, *dqkv, *y2, *dqkv2;
  float *stats, *lse;
  apex__cuda_flash g;
  apex__cuda_attn a;
  apex_tensor *tq, *ty, *tdy, *tdq, *tst; /* the same buffers as tensors, for the public calls */
  apex_status st;
};

static void step(void *p) {
  struct ctx *c = p;
  if (c->st != APEX_OK) return;
  char *q = c->qkv, *dq = c->dqkv;
  const size_t off = (size_t)C * 2;
  if (c->which == 0 || c->which == 2)
    c->st = apex__cuda_flash_attention_fwd(&c->g, q, q + off, q + 2 * off, c->y, c->stats);
  if (c->st == APEX_OK && (c->which == 1 || c->which == 2))
    c->st = apex__cuda_flash_attention_bwd(&c->g, q, q + off, q + 2 * off, c->y, c->dy, c->stats, dq, dq + off, dq + 2 * off);
  if (c->which == 4) {
    c->st = apex_kernel_attention_forward(c->tq, H, c->ty, c->tst);
    if (c->st == APEX_OK) c->st = apex_kernel_attention_backward(c->tdy, c->tq, c->ty, c->tst, H, c->tdq);
  }
  if (c->which == 3) {
    c->st = apex__cuda_attention_fwd(&c->a, c->qkv, c->y2, c->lse);
    if (c->st == APEX_OK) c->st = apex__cuda_attention_bwd(&c->a, c->dy, c->qkv, c->y2, c->lse, c->dqkv2);
  }
}

static double time_loop(struct ctx *c, int which, int iters) {
  c->which = which;
  step(c); /* warm up: the allocator's blocks, the kernels' attributes */
  apex_cuda_synchronize();
  double best = 1e30;
  for (int round = 0; round < 5 && c->st == APEX_OK; round++) {
    double t0 = bench_now();
    for (int i = 0; i < iters; i++) step(c);
    if (apex_cuda_synchronize() != APEX_OK && c->st == APEX_OK) c->st = APEX_ERR_DEVICE;
    double s = (bench_now() - t0) / iters;
    if (s < best) best = s;
  }
  return best;
}

/* Device buffer of n bf16 values uniform in [-range, range), or zeros when range is 0. */
static void *dev_random(size_t n, float range, uint64_t seed, apex_status *st) {
  void *d = NULL;
  if (*st != APEX_OK) return NULL;
  if ((*st = apex__cuda_alloc(n * 2, 1, &d)) != APEX_OK || range == 0) return d;
  float *u = malloc(n * sizeof *u);
  uint16_t *h = malloc(n * 2);
  if (!u || !h) {
    *st = APEX_ERR_OUT_OF_MEMORY;
  } else {
    apex_rng rng = apex_rng_init(seed);
    apex_rng_uniform(&rng, u, n);
    for (size_t i = 0; i < n; i++) h[i] = apex_f32_to_bf16(range * (2 * u[i] - 1));
    *st = apex__cuda_memcpy(d, h, n * 2, APEX__H2D, 1);
  }
  free(u);
  free(h);
  return d;
}

int main(int argc, char **argv) {
  int time_only = 0;
  double peer_ms[2] = {0, 0};
  const int ts[2] = {1024, 2048};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--time")) time_only = 1;
    else if (!strcmp(argv[i], "--peer-ms-1024") && i + 1 < argc) peer_ms[0] = atof(argv[++i]);
    else if (!strcmp(argv[i], "--peer-ms-2048") && i + 1 < argc) peer_ms[1] = atof(argv[++i]);
  }
  const char *why;
  if (!apex_cuda_available(&why)) {
    bench_skip("attention_1024_fwdbwd_ms", why);
    return time_only;
  }
  char dev[128] = "?";
  apex_cuda_device_name(dev, sizeof dev);
  if (!time_only)
    printf("# bench_attention on %s: causal attention B=%d H=%d d=%d bf16, heads in place from the packed qkv; "
           "ratio = PyTorch SDPA ms / apex ms (>= 1: apex faster), when --peer-ms-T is given\n",
           dev, B, H, D);
  int rc = 0;
  for (int k = 0; k < 2; k++) {
    const int t = ts[k];
    const size_t rows = (size_t)B * t;
    struct ctx c = {0};
    c.t = t;
    c.st = APEX_OK;
    c.qkv = dev_random(rows * 3 * C, 1.5f, 11 + k, &c.st);
    c.dy = dev_random(rows * C, 1.0f, 21 + k, &c.st);
    c.y = dev_random(rows * C, 0, 0, &c.st);
    c.dqkv = dev_random(rows * 3 * C, 0, 0, &c.st);
    if (c.st == APEX_OK) c.st = apex__cuda_alloc(rows * H * 2 * sizeof(float), 0, (void **)&c.stats);
    c.g = (apex__cuda_flash){B, H, t, D, 3 * C, 3 * C, 3 * C, C, C, 3 * C, 3 * C, 3 * C, APEX_BF16};
    char name[96];
    snprintf(name, sizeof name, "attention_%d_fwdbwd_ms", t);
    double both = time_loop(&c, 2, 20);
    if (c.st != APEX_OK) {
      printf("bench %s failed: %s\n", name, apex_last_error());
      rc = 1;
    } else if (time_only) {
      printf("%d %.4f\n", t, 1e3 * both);
    } else {
      const double fwd = time_loop(&c, 0, 20), bwd = time_loop(&c, 1, 20);
      const double flops = 3.5 * 4.0 * B * H * (double)t * t * D / 2;
      bench_report(name, 1e3 * both, "ms", peer_ms[k] > 0 ? peer_ms[k] / (1e3 * both) : 0,
                   peer_ms[k] > 0 ? "PyTorch SDPA (is_causal) fwd+bwd, same GPU" : "none given (bench/peer_attention.py)");
      snprintf(name, sizeof name, "attention_%d_fwd_ms", t);
      bench_report(name, 1e3 * fwd, "ms", 0, "-");
      snprintf(name, sizeof name, "attention_%d_bwd_ms", t);
      bench_report(name, 1e3 * bwd, "ms", 0, "-");
      snprintf(name, sizeof name, "attention_%d_fwdbwd_tflops", t);
      bench_report(name, flops / both / 1e12, "TFLOP/s", 0, "-");
      /* each road of the library's own attention, through the public calls */
      const int64_t s3[3] = {B, t, 3 * C}, s1[3] = {B, t, C}, ss[4] = {B, H, t, 2};
      c.tq = apex_tensor_wrap_on(APEX_DEVICE_CUDA, c.qkv, APEX_BF16, 3, s3);
      c.tdq = apex_tensor_wrap_on(APEX_DEVICE_CUDA, c.dqkv, APEX_BF16, 3, s3);
      c.ty = apex_tensor_wrap_on(APEX_DEVICE_CUDA, c.y, APEX_BF16, 3, s1);
      c.tdy = apex_tensor_wrap_on(APEX_DEVICE_CUDA, c.dy, APEX_BF16, 3, s1);
      c.tst = apex_tensor_wrap_on(APEX_DEVICE_CUDA, c.stats, APEX_F32, 4, ss);
      const char *roads[3] = {"flash", "cudnn", "cudnn-nondeterministic"};
      for (int r = 0; r < 3 && c.tq && c.tdq && c.ty && c.tdy && c.tst; r++) {
        setenv("APEX_ATTENTION", roads[r], 1);
        c.st = APEX_OK;
        const double ms = 1e3 * time_loop(&c, 4, 20);
        snprintf(name, sizeof name, "attention_%d_road_%s_fwdbwd_ms", t, roads[r]);
        if (c.st == APEX_OK)
          bench_report(name, ms, "ms", peer_ms[k] > 0 ? peer_ms[k] / ms : 0,
                       peer_ms[k] > 0 ? "PyTorch SDPA (is_causal) fwd+bwd, same GPU" : "none given (bench/peer_attention.py)");
        else
          printf("bench %s failed: %s\n", name, apex_last_error());
      }
      unsetenv("APEX_ATTENTION");
      c.st = APEX_OK;
      apex_tensor *ts[] = {c.tq, c.tdq, c.ty, c.tdy, c.tst};
      for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) apex_tensor_destroy(ts[i]);
      /* the materialised path, for the record: B H T^2 f32 scores, so 2048 needs ~3 GiB a matrix */
      c.a = (apex__cuda_attn){B, t, H, D, APEX_BF16};
      c.y2 = dev_random(rows * C, 0, 0, &c.st);
      c.dqkv2 = dev_random(rows * 3 * C, 0, 0, &c.st);
      if (c.st == APEX_OK) c.st = apex__cuda_alloc(rows * H * sizeof(float), 0, (void **)&c.lse);
      const double mat = c.st == APEX_OK ? time_loop(&c, 3, 5) : 0;
      snprintf(name, sizeof name, "attention_%d_materialised_fwdbwd_ms", t);
      if (c.st == APEX_OK) bench_report(name, 1e3 * mat, "ms", mat / both, "ratio = materialised / fused");
      else printf("bench %s failed: %s\n", name, apex_last_error());
    }
    void *all[] = {c.qkv, c.dy, c.y, c.dqkv, c.stats, c.y2, c.dqkv2, c.lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex__cuda_free(all[i]);
    apex_cuda_empty_cache();
  }
  fflush(stdout);
  return time_only ? rc : 0;
}
#else
int main(void) {
  bench_skip("attention_1024_fwdbwd_ms", "built without CUDA (-DAPEX_CUDA=ON)");
  return 0;
}
#endif
