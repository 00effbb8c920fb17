/* bench_gemm.c: the matrix products of the models' shapes, bf16 through oneDNN against f32, and the
 * f32 candidates against each other, all in one run on apex's threads.
 *
 * Shapes (m x k x n): the MLP's [128, 784] x [784, 1024] and [128, 1024] x [1024, 1024], the GPT's
 * [4096, 768] x [768, 768], 2048^3, and apex-train's MLP first layer at its batch of 64,
 * [64, 784] x [784, 512] (small tiles, where a call's fixed cost shows). Per shape, in GFLOP/s
 * (best of repeated runs, the candidates interleaved over three rounds because the machine is
 * shared); <isa> is the maximum ISA in effect (apex/cpu.h), which picks the path:
 *   gemm_<shape>_bf16_onednn_<isa>    apex_matmul on bf16 operands (gemm_onednn.c: oneDNN per tile),
 *                                     peer apex-f32-<isa>: apex_matmul on f32 (apex's grid, AVX-512
 *                                     sgemm); ..._vs_widened: the same against apex-bf16-widened
 *                                     (oneDNN off: the old path that widens bf16 to f32)
 *   gemm_<shape>_bf16_onednn_whole    one oneDNN bf16 primitive over the whole product on all threads
 *                                     (what the per-tile, thread-count-independent calls give up),
 *                                     peer apex-bf16-onednn-tiles
 *   gemm_<shape>_f32_apex_<isa>       apex's f32 path (its AVX-512 kernel at avx512 and above), peer
 *                                     openblas-f32 (cblas_sgemm on all threads)
 *   gemm_<shape>_f32_onednn           one oneDNN f32 primitive on all threads, peer apex-f32-<isa>
 * Lines that need oneDNN or AVX512_BF16 print a skip line saying why.
 *
 * The f32 products of the four models (bench_models.h), forward and both backward products, with
 * the transposes the step uses (linear.c, conv.c's per-image products, attention.c's per-head ones),
 * each on 1 and 2 threads, the three deterministic candidates interleaved in the same run, all in
 * apex__gemm's fixed tile grid (the grid is what keeps the bits independent of the thread count):
 *   gemm_f32_<model>_<product>_<m>x<k>x<n>_t<N>            apex's AVX-512 kernel (sgemm_avx512.c),
 *                                                         peer openblas-tiles (cblas_sgemm per tile)
 *   gemm_f32_<model>_<product>_<m>x<k>x<n>_t<N>_vs_onednn  the same, peer onednn-f32-tiles (oneDNN's
 *                                                         f32 matmul per tile, as gemm_onednn.c's bf16)
 * A ratio above 1 is the benchmark line that keeps the hand-written kernel. From these lines,
 * apex__gemm runs f32 products on oneDNN where oneDNN runs (gemm_onednn.h, apex__onednn_set_f32);
 * the kernel keeps the per-image conv and per-head attention products (apex__sgemm_call,
 * apex__sgemm) and CPUs without AVX512_BF16, and OpenBLAS the CPUs without AVX-512. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "apex/cpu.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "bench_util.h"

#if APEX_BENCH_HAVE_DNNL
#include <dnnl.h>
#endif

typedef struct ctx {
  int m, k, n;
  apex_graph *g;
  apex_var *x, *w;       /* operands of apex_matmul (bf16 or f32) */
  float *a, *b, *c;      /* f32 operands for OpenBLAS */
#if APEX_BENCH_HAVE_DNNL
  dnnl_engine_t eng;
  dnnl_stream_t s;
  dnnl_primitive_t prim;
  dnnl_memory_t mem[3];
#endif
} ctx;

static void run_matmul(void *p) {
  ctx *c = p;
  apex_graph_reset(c->g);
  if (!apex_matmul(c->g, c->x, c->w)) {
    fprintf(stderr, "bench_gemm: %s\n", apex_last_error());
    exit(1);
  }
}

static void run_openblas(void *p) {
  ctx *c = p;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->m, c->n, c->k, 1.0f, c->a, c->k, c->b, c->n, 0.0f, c->c, c->n);
}

static double gflops(const ctx *c, double s) { return 2.0 * c->m * c->k * c->n / s / 1e9; }

static void set_operands(ctx *c, apex_dtype dt) {
  if (c->x) apex_var_destroy(c->x);
  if (c->w) apex_var_destroy(c->w);
  apex_tensor *x = apex_tensor_create(dt, 2, (int64_t[]){c->m, c->k}), *w = apex_tensor_create(dt, 2, (int64_t[]){c->k, c->n});
  for (size_t i = 0; i < (size_t)c->m * c->k; i++) apex_tensor_set(x, i, c->a[i]);
  for (size_t i = 0; i < (size_t)c->k * c->n; i++) apex_tensor_set(w, i, c->b[i]);
  c->x = apex_var_create(x, 0);
  c->w = apex_var_create(w, 0);
}

#if APEX_BENCH_HAVE_DNNL
/* One oneDNN matmul over the whole product, on all of OpenMP's threads, src/weights of dt. */
static int onednn_setup(ctx *c, dnnl_data_type_t dt) {
  dnnl_memory_desc_t md[3];
  dnnl_dims_t d[3] = {{c->m, c->k}, {c->k, c->n}, {c->m, c->n}};
  dnnl_data_type_t t[3] = {dt, dt, dnnl_f32};
  size_t es = dt == dnnl_f32 ? 4 : 2;
  void *h[3] = {aligned_alloc(64, ((size_t)c->m * c->k * es + 63) / 64 * 64), aligned_alloc(64, ((size_t)c->k * c->n * es + 63) / 64 * 64),
                aligned_alloc(64, ((size_t)c->m * c->n * 4 + 63) / 64 * 64)};
  for (int i = 0; i < 3; i++) {
    if (dnnl_memory_desc_init_by_tag(&md[i], 2, d[i], t[i], dnnl_ab) != dnnl_success) return 0;
    if (dnnl_memory_create(&c->mem[i], &md[i], c->eng, h[i]) != dnnl_success) return 0;
  }
  /* operand values: the same as the others see, narrowed where dt is bf16 */
  for (size_t i = 0; i < (size_t)c->m * c->k; i++)
    if (es == 4) ((float *)h[0])[i] = c->a[i];
    else apex_convert((uint16_t *)h[0] + i, APEX_BF16, c->a + i, APEX_F32, 1);
  for (size_t i = 0; i < (size_t)c->k * c->n; i++)
    if (es == 4) ((float *)h[1])[i] = c->b[i];
    else apex_convert((uint16_t *)h[1] + i, APEX_BF16, c->b + i, APEX_F32, 1);
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd;
  if (dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) != dnnl_success) return 0;
  if (dnnl_primitive_desc_create(&pd, &desc, NULL, c->eng, NULL) != dnnl_success) return 0;
  int ok = dnnl_primitive_create(&c->prim, pd) == dnnl_success;
  dnnl_primitive_desc_destroy(pd);
  return ok;
}

static void onednn_teardown(ctx *c) {
  for (int i = 0; i < 3; i++) {
    void *h = NULL;
    dnnl_memory_get_data_handle(c->mem[i], &h);
    dnnl_memory_destroy(c->mem[i]);
    free(h);
  }
  dnnl_primitive_destroy(c->prim);
}

static void run_onednn(void *p) {
  ctx *c = p;
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, c->mem[0]}, {DNNL_ARG_WEIGHTS, c->mem[1]}, {DNNL_ARG_DST, c->mem[2]}};
  dnnl_primitive_execute(c->prim, c->s, 3, args);
  dnnl_stream_wait(c->s);
}
#endif

static void line(const char *shape, const char *what, double v, double peer_v, const char *peer) {
  char name[256];
  snprintf(name, sizeof name, "gemm_%s_%s", shape, what);
  bench_report(name, v, "GFLOP/s", v / peer_v, peer);
}

static void bench_shape(int m, int k, int n) {
  ctx c = {0};
  c.m = m, c.k = k, c.n = n, c.g = apex_graph_create();
  char shape[64], what[96], peer[160];
  snprintf(shape, sizeof shape, "%dx%dx%d", m, k, n);
  c.a = malloc((size_t)m * k * 4), c.b = malloc((size_t)k * n * 4), c.c = malloc((size_t)m * n * 4);
  uint32_t r = 12345; /* values in [-1, 1) from a fixed LCG: the timings do not depend on them */
  for (size_t i = 0; i < (size_t)m * k; i++) c.a[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / (1 << 23) - 1.0f;
  for (size_t i = 0; i < (size_t)k * n; i++) c.b[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / (1 << 23) - 1.0f;
  const char *isa = apex_cpu_isa_name(apex_cpu_max_isa()), *why = NULL;
  int bf16 = apex__onednn_active(&why);
  double best[6] = {1e300, 1e300, 1e300, 1e300, 1e300, 1e300}; /* bf16 tiles, bf16 widened, f32 apex, openblas, onednn f32, onednn bf16 */
#if APEX_BENCH_HAVE_DNNL
  dnnl_engine_create(&c.eng, dnnl_cpu, 0);
  dnnl_stream_create(&c.s, c.eng, dnnl_stream_default_flags);
#endif
  for (int round = 0; round < 3; round++) {
    double t;
    if (bf16) {
      set_operands(&c, APEX_BF16);
      t = bench_best(run_matmul, &c, 2, 3, 0.3);
      best[0] = t < best[0] ? t : best[0];
      int old = apex__onednn_set_enabled(0);
      t = bench_best(run_matmul, &c, 1, 3, 0.3);
      best[1] = t < best[1] ? t : best[1];
      apex__onednn_set_enabled(old);
    }
    set_operands(&c, APEX_F32);
    t = bench_best(run_matmul, &c, 1, 3, 0.3);
    best[2] = t < best[2] ? t : best[2];
    openblas_set_num_threads(apex_get_num_threads());
    t = bench_best(run_openblas, &c, 1, 3, 0.3);
    best[3] = t < best[3] ? t : best[3];
#if APEX_BENCH_HAVE_DNNL
    for (int v = 0; v < 2; v++) {
      if (v == 1 && !bf16) break;
      if (!onednn_setup(&c, v ? dnnl_bf16 : dnnl_f32)) break;
      t = bench_best(run_onednn, &c, 1, 3, 0.3);
      best[4 + v] = t < best[4 + v] ? t : best[4 + v];
      onednn_teardown(&c);
    }
#endif
  }
  char f32_peer[64];
  snprintf(f32_peer, sizeof f32_peer, "apex-f32-%s", isa);
  if (bf16) {
    snprintf(what, sizeof what, "bf16_onednn_%s", isa);
    line(shape, what, gflops(&c, best[0]), gflops(&c, best[2]), f32_peer);
    snprintf(peer, sizeof peer, "%s_vs_widened", what);
    line(shape, peer, gflops(&c, best[0]), gflops(&c, best[1]), "apex-bf16-widened");
    if (best[5] < 1e300) line(shape, "bf16_onednn_whole", gflops(&c, best[5]), gflops(&c, best[0]), "apex-bf16-onednn-tiles");
  } else {
    snprintf(what, sizeof what, "gemm_%s_bf16_onednn", shape);
    bench_skip(what, why);
  }
  snprintf(what, sizeof what, "f32_apex_%s", isa);
  line(shape, what, gflops(&c, best[2]), gflops(&c, best[3]), "openblas-f32");
  snprintf(peer, sizeof peer, "apex-f32-%s", isa);
  if (best[4] < 1e300)
    line(shape, "f32_onednn", gflops(&c, best[4]), gflops(&c, best[2]), peer);
  else {
    snprintf(what, sizeof what, "gemm_%s_f32_onednn", shape);
    bench_skip(what, "this build has no oneDNN");
  }
#if APEX_BENCH_HAVE_DNNL
  dnnl_stream_destroy(c.s);
  dnnl_engine_destroy(c.eng);
#endif
  apex_var_destroy(c.x);
  apex_var_destroy(c.w);
  apex_graph_destroy(c.g);
  free(c.a);
  free(c.b);
  free(c.c);
}

/* ---- the models' f32 products ------------------------------------------------------------------ */

typedef struct model_product {
  const char *name; /* <model>_<product> */
  int m, k, n, ta, tb;
} model_product;

/* From an instrumented run of each model's step (apex__gemm's and apex__sgemm's arguments).
 * fwd: x w^T; dx: dy w; dw: dy^T x (linear.c); conv: per image, forward w x cols, backward data
 * w^T dy, backward weights dy cols^T (conv.c); attn: per head, q k^T, p v, p^T dy (attention.c). */
static const model_product products_f32[] = {
    {"mlp_fc1_fwd", 128, 784, 1024, 0, 1},       {"mlp_fc1_dw", 1024, 128, 784, 1, 0},
    {"mlp_fc2_fwd", 128, 1024, 1024, 0, 1},      {"mlp_fc2_dx", 128, 1024, 1024, 0, 0},
    {"mlp_fc2_dw", 1024, 128, 1024, 1, 0},       {"mlp_fc3_fwd", 128, 1024, 10, 0, 1},
    {"mlp_fc3_dx", 128, 10, 1024, 0, 0},         {"mlp_fc3_dw", 10, 128, 1024, 1, 0},
    {"cnn_conv1_fwd", 32, 9, 784, 0, 0},         {"cnn_conv1_dw", 32, 784, 9, 0, 1},
    {"cnn_conv2_fwd", 64, 288, 196, 0, 0},       {"cnn_conv2_dx", 288, 64, 196, 1, 0},
    {"cnn_conv2_dw", 64, 196, 288, 0, 1},        {"cnn_fc1_fwd", 128, 3136, 128, 0, 1},
    {"cnn_fc1_dx", 128, 128, 3136, 0, 0},        {"cnn_fc1_dw", 128, 128, 3136, 1, 0},
    {"cnn_fc2_fwd", 128, 128, 10, 0, 1},         {"cnn_fc2_dx", 128, 10, 128, 0, 0},
    {"cnn_fc2_dw", 10, 128, 128, 1, 0},          {"gpt_c256_attn_fwd", 1024, 256, 256, 0, 1},
    {"gpt_c256_attn_dx", 1024, 256, 256, 0, 0},  {"gpt_c256_attn_dw", 256, 1024, 256, 1, 0},
    {"gpt_c256_fc_fwd", 1024, 256, 1024, 0, 1},  {"gpt_c256_fc_dx", 1024, 1024, 256, 0, 0},
    {"gpt_c256_fc_dw", 1024, 1024, 256, 1, 0},   {"gpt_c256_proj_fwd", 1024, 1024, 256, 0, 1},
    {"gpt_c256_proj_dx", 1024, 256, 1024, 0, 0}, {"gpt_c256_proj_dw", 256, 1024, 1024, 1, 0},
    {"gpt_head_qk", 256, 64, 256, 0, 1},         {"gpt_head_pv", 256, 256, 64, 0, 0},
    {"gpt_head_dv", 256, 256, 64, 1, 0},         {"gpt_c768_attn_fwd", 1024, 768, 768, 0, 1},
    {"gpt_c768_attn_dx", 1024, 768, 768, 0, 0},  {"gpt_c768_attn_dw", 768, 1024, 768, 1, 0},
    {"gpt_c768_fc_fwd", 1024, 768, 3072, 0, 1},  {"gpt_c768_fc_dx", 1024, 3072, 768, 0, 0},
    {"gpt_c768_fc_dw", 3072, 1024, 768, 1, 0},   {"gpt_c768_proj_fwd", 1024, 3072, 768, 0, 1},
    {"gpt_c768_proj_dx", 1024, 768, 3072, 0, 0}, {"gpt_c768_proj_dw", 768, 1024, 3072, 1, 0},
    {"gpt_c768_head_fwd", 1024, 768, 256, 0, 1}, {"gpt_c768_head_dx", 1024, 256, 768, 0, 0},
    {"gpt_c768_head_dw", 256, 1024, 768, 1, 0},
};

typedef struct f32ctx {
  const model_product *p;
  float *a, *b, *c;
  apex_nn_workspace ws;
} f32ctx;

static void *ws_get(void *ctx, size_t bytes) {
  static void *buf;
  static size_t have;
  (void)ctx;
  if (bytes > have) {
    free(buf);
    buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    have = buf ? bytes : 0;
  }
  return buf;
}

static void run_f32(void *p) {
  f32ctx *c = p;
  const model_product *q = c->p;
  apex__mat a = {c->a, APEX_F32, q->ta ? q->m : q->k, q->ta}, b = {c->b, APEX_F32, q->tb ? q->k : q->n, q->tb};
  if (apex__gemm(&c->ws, q->m, q->n, q->k, 1.0f, a, b, 0.0f, c->c, APEX_F32, q->n, NULL) != APEX_OK) {
    fprintf(stderr, "bench_gemm: %s\n", apex_last_error());
    exit(1);
  }
}

static void bench_f32_product(const model_product *q, int threads) {
  f32ctx c = {q, malloc((size_t)q->m * q->k * 4), malloc((size_t)q->k * q->n * 4), malloc((size_t)q->m * q->n * 4), {ws_get, NULL}};
  uint32_t r = 777;
  for (size_t i = 0; i < (size_t)q->m * q->k; i++) c.a[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / (1 << 23) - 1.0f;
  for (size_t i = 0; i < (size_t)q->k * q->n; i++) c.b[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) / (1 << 23) - 1.0f;
  int old_threads = apex_get_num_threads();
  apex_set_num_threads(threads);
  const char *why = NULL;
  int dnn = apex__onednn_active(&why);
  double best[3] = {1e300, 1e300, 1e300}; /* apex kernel, OpenBLAS, oneDNN f32: each per tile */
  double min_s = (double)q->m * q->n * q->k > 1e8 ? 0.3 : 0.1;
  for (int round = 0; round < 3; round++)
    for (int v = 0; v < 3; v++) {
      if (v == 2 && !dnn) break;
      int old_own = apex__gemm_set_own_kernel(v == 0);
      int old_f32 = apex__onednn_set_f32(v == 2 ? APEX__ONEDNN_F32_ALL : APEX__ONEDNN_F32_NONE);
      double t = bench_best(run_f32, &c, 1, 3, min_s);
      apex__gemm_set_own_kernel(old_own);
      apex__onednn_set_f32(old_f32);
      best[v] = t < best[v] ? t : best[v];
    }
  apex_set_num_threads(old_threads);
  char name[160];
  double flop = 2.0 * q->m * q->k * q->n / 1e9;
  snprintf(name, sizeof name, "gemm_f32_%s_%dx%dx%d_t%d", q->name, q->m, q->k, q->n, threads);
  bench_report(name, flop / best[0], "GFLOP/s", best[1] / best[0], "openblas-tiles");
  strncat(name, "_vs_onednn", sizeof name - strlen(name) - 1);
  if (dnn)
    bench_report(name, flop / best[0], "GFLOP/s", best[2] / best[0], "onednn-f32-tiles");
  else
    bench_skip(name, why);
  free(c.a);
  free(c.b);
  free(c.c);
}

int main(int argc, char **argv) {
  static const int shapes[][3] = {{128, 784, 1024}, {128, 1024, 1024}, {4096, 768, 768}, {2048, 2048, 2048}, {64, 784, 512}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "gemm_%dx%dx%d", shapes[i][0], shapes[i][1], shapes[i][2]);
    if (bench_wanted(argc, argv, name)) bench_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
  }
  for (size_t i = 0; i < sizeof products_f32 / sizeof products_f32[0]; i++)
    for (int threads = 1; threads <= 2; threads++) {
      char name[160];
      const model_product *q = &products_f32[i];
      snprintf(name, sizeof name, "gemm_f32_%s_%dx%dx%d_t%d", q->name, q->m, q->k, q->n, threads);
      if (bench_wanted(argc, argv, name)) bench_f32_product(q, threads);
    }
  return 0;
}
