/* bench_attention.c: causal self-attention on the GPU, forward + backward, GPT-2's shapes: B = 8, H = 12,
 * head dim 64, T = 1024 and 2048, bf16, heads read in place from the packed qkv [B, T, 3C] (as GPT's c_attn
 * makes it), the gradients written into a packed dqkv. Through the library's public calls only
 * (apex_kernel_attention_forward / _backward, kernels.h): what a user's program and autograd get.
 *
 * For each T it prints
 *     bench attention_<T>_fwdbwd_ms MS ms ratio=R peer=...     the library's default road (APEX_ATTENTION unset)
 *     bench attention_<T>_fwd_ms, attention_<T>_bwd_ms          its two halves
 *     bench attention_<T>_fwdbwd_tflops                         4 B H T^2 d / 2 (forward) x 3.5 (FlashAttention's
 *                                                               count: the backward is 2.5 forwards) over the time
 *     bench attention_<T>_road_<R>_fwdbwd_ms                   each road with APEX_ATTENTION=R: flash (apex's
 *                                                               kernel), cudnn (cuDNN's fused attention,
 *                                                               deterministic backward), cudnn-nondeterministic,
 *                                                               hopper (apex's Hopper kernels, TMA and wgmma;
 *                                                               compute capability 9.0 only, a `failed:` line
 *                                                               elsewhere),
 *                                                               each with its ratio against the peer, so that one
 *                                                               run decides the default
 *     bench attention_<T>_road_<R>_fwd_ms                      each road's forward alone
 * The backward's figures include the slot's f32 gradient: the public backward widens dy to f32 and lands
 * the f32 gradient in dqkv's dtype, as autograd's backward does.
 * R is PyTorch's scaled_dot_product_attention(is_causal=True) time over apex's (R >= 1: apex faster), when
 * the peer's milliseconds are passed in with --peer-ms-1024 X --peer-ms-2048 Y (forward + backward) and
 * --peer-fwd-ms-1024 X --peer-fwd-ms-2048 Y (forward); bench/peer_attention.py measures PyTorch and runs
 * this program for the figures. `--time` prints only `T MS FWD_MS` lines: the default road's forward +
 * backward and its forward (for peer_attention.py). Timing: the host clock around a synchronised loop of 20 iterations,
 * best of 5 rounds (one stream: the loop measures the GPU). Skipped, with the reason, without a GPU. */
#define _POSIX_C_SOURCE 200809L /* setenv: the road knob, APEX_ATTENTION */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cuda.h"
#include "bench_util.h"

enum { B = 8, H = 12, D = 64, C = H * D };

struct ctx {
  int which; /* 0 forward, 1 backward, 2 both */
  apex_tensor *qkv, *y, *dy, *dqkv, *stats;
  apex_status st;
};

static void step(struct ctx *c) {
  if (c->st != APEX_OK) return;
  if (c->which != 1) c->st = apex_kernel_attention_forward(c->qkv, H, c->y, c->stats);
  if (c->st == APEX_OK && c->which != 0) c->st = apex_kernel_attention_backward(c->dy, c->qkv, c->y, c->stats, H, c->dqkv);
}

static double time_loop(struct ctx *c, int which, int iters) {
  c->which = which;
  step(c); /* warm up: the allocator's blocks, the kernels' attributes, cuDNN's plans */
  if (apex_cuda_synchronize() != APEX_OK && c->st == APEX_OK) c->st = apex_last_status();
  double best = 1e30;
  for (int round = 0; round < 5 && c->st == APEX_OK; round++) {
    double t0 = bench_now();
    for (int i = 0; i < iters; i++) step(c);
    if (apex_cuda_synchronize() != APEX_OK && c->st == APEX_OK) c->st = apex_last_status();
    double s = (bench_now() - t0) / iters;
    if (s < best) best = s;
  }
  return best;
}

/* A bf16 tensor on the GPU of shape [B, t, w], uniform in [-range, range) (zeros when range is 0). */
static apex_tensor *dev_random(int t, int64_t w, float range, uint64_t seed, apex_status *st) {
  const int64_t shape[3] = {B, t, w};
  if (*st != APEX_OK) return NULL;
  apex_tensor *d = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 3, shape), *h = NULL;
  if (d && range != 0 && (h = apex_tensor_create(APEX_F32, 3, shape))) {
    apex_rng rng = apex_rng_init(seed);
    float *u = apex_tensor_data(h);
    size_t n = apex_tensor_numel(h);
    apex_rng_uniform(&rng, u, n);
    for (size_t i = 0; i < n; i++) u[i] = range * (2 * u[i] - 1);
  }
  if (!d || (range != 0 && (!h || apex_tensor_copy(d, h) != APEX_OK))) *st = apex_last_status();
  apex_tensor_destroy(h);
  return d;
}

static void report_ms(const char *name, double ms, double peer, const char *peer_what) {
  bench_report(name, ms, "ms", peer > 0 ? peer / ms : 0, peer > 0 ? peer_what : "none given (bench/peer_attention.py)");
}

int main(int argc, char **argv) {
  int time_only = 0;
  double peer_ms[2] = {0, 0}, peer_fwd_ms[2] = {0, 0};
  const int ts[2] = {1024, 2048};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--time")) time_only = 1;
    else if (!strcmp(argv[i], "--peer-ms-1024") && i + 1 < argc) peer_ms[0] = atof(argv[++i]);
    else if (!strcmp(argv[i], "--peer-ms-2048") && i + 1 < argc) peer_ms[1] = atof(argv[++i]);
    else if (!strcmp(argv[i], "--peer-fwd-ms-1024") && i + 1 < argc) peer_fwd_ms[0] = atof(argv[++i]);
    else if (!strcmp(argv[i], "--peer-fwd-ms-2048") && i + 1 < argc) peer_fwd_ms[1] = atof(argv[++i]);
  }
  const char *why;
  if (!apex_cuda_available(&why)) {
    bench_skip("attention_1024_fwdbwd_ms", why);
    return time_only;
  }
  char dev[128] = "?";
  apex_cuda_device_name(dev, sizeof dev);
  if (!time_only)
    printf("# bench_attention on %s: causal attention B=%d H=%d d=%d bf16, heads in place from the packed qkv, through "
           "apex_kernel_attention_*; ratio = PyTorch SDPA ms / apex ms (>= 1: apex faster), when --peer-ms-T is given\n",
           dev, B, H, D);
  const char *sdpa = "PyTorch SDPA (is_causal), same GPU";
  int rc = 0;
  for (int k = 0; k < 2; k++) {
    const int t = ts[k];
    struct ctx c = {.st = APEX_OK};
    c.qkv = dev_random(t, 3 * C, 1.5f, 11 + k, &c.st);
    c.dy = dev_random(t, C, 1.0f, 21 + k, &c.st);
    c.y = dev_random(t, C, 0, 0, &c.st);
    c.dqkv = dev_random(t, 3 * C, 0, 0, &c.st);
    const int64_t ss[4] = {B, H, t, 2};
    if (c.st == APEX_OK && !(c.stats = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 4, ss))) c.st = apex_last_status();
    char name[96];
    snprintf(name, sizeof name, "attention_%d_fwdbwd_ms", t);
    unsetenv("APEX_ATTENTION"); /* the default road */
    double both = time_loop(&c, 2, 20);
    if (c.st != APEX_OK) {
      printf("bench %s failed: %s\n", name, apex_last_error());
      rc = 1;
    } else if (time_only) {
      const double fwd = time_loop(&c, 0, 20);
      printf("%d %.4f %.4f\n", t, 1e3 * both, 1e3 * fwd);
    } else {
      const double fwd = time_loop(&c, 0, 20), bwd = time_loop(&c, 1, 20);
      const double flops = 3.5 * 4.0 * B * H * (double)t * t * D / 2;
      report_ms(name, 1e3 * both, peer_ms[k], sdpa);
      snprintf(name, sizeof name, "attention_%d_fwd_ms", t);
      report_ms(name, 1e3 * fwd, peer_fwd_ms[k], sdpa);
      snprintf(name, sizeof name, "attention_%d_bwd_ms", t);
      bench_report(name, 1e3 * bwd, "ms", 0, "-");
      snprintf(name, sizeof name, "attention_%d_fwdbwd_tflops", t);
      bench_report(name, flops / both / 1e12, "TFLOP/s", 0, "-");
      const char *roads[] = {"flash", "cudnn", "cudnn-nondeterministic", "hopper"};
      for (size_t r = 0; r < sizeof roads / sizeof roads[0]; r++) {
        setenv("APEX_ATTENTION", roads[r], 1);
        c.st = APEX_OK;
        const double ms = 1e3 * time_loop(&c, 2, 20), fms = c.st == APEX_OK ? 1e3 * time_loop(&c, 0, 20) : 0;
        snprintf(name, sizeof name, "attention_%d_road_%s_fwdbwd_ms", t, roads[r]);
        if (c.st != APEX_OK) {
          printf("bench %s failed: %s\n", name, apex_last_error());
          continue;
        }
        report_ms(name, ms, peer_ms[k], sdpa);
        snprintf(name, sizeof name, "attention_%d_road_%s_fwd_ms", t, roads[r]);
        report_ms(name, fms, peer_fwd_ms[k], sdpa);
      }
      unsetenv("APEX_ATTENTION");
    }
    apex_tensor *all[] = {c.qkv, c.dy, c.y, c.dqkv, c.stats};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) apex_tensor_destroy(all[i]);
    apex_cuda_empty_cache();
  }
  fflush(stdout);
  return time_only ? rc : 0;
}
