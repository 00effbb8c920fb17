/* test_cuda_nn_contract.c: the slots whose argument structs are one contract on every backend
 * (backend/args_nn.h): causal attention with strided heads and per-row stats (held to the CPU's by
 * their log-sum-exp), cross entropy with device targets, stats and a device-resident reduced value, dropout drawing its mask on
 * the device, batch norm's forward (batch, running and given statistics). Each runs on the CUDA
 * backend and on the CPU backend with the same inputs, and the CUDA results are held to the CPU's:
 * dropout bitwise (the same Philox draws), the others within a stated fraction of max|CPU| (the GPU
 * sums in other orders, and its half attention rounds P and dS to the inputs' dtype). Each check prints
 * one PASS/FAIL line with its number. Without a GPU the program says why and exits 77 (ctest: skipped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/autograd.h"
#include "apex/ddp.h"
#include "apex/parallel.h"
#include "apex/nn.h"
#include "apex/rng.h"
#include "backend/backend.h"
#include "core/memory.h"
#include "testutil.h"

static const apex_backend *cpu, *gpu;
static int failures;

/* ---- host and device buffers ---------------------------------------------------------------------- */

/* Transient host memory lent to the CPU slots, freed after each case. */
static void *held[4096];
static int n_held;
static void *ws_get(void *ctx, size_t bytes) {
  (void)ctx;
  void *p = malloc(bytes ? bytes : 1);
  if (p && n_held < (int)(sizeof held / sizeof held[0])) held[n_held++] = p;
  return p;
}
static const apex_nn_workspace host_ws = {ws_get, NULL};
static void ws_release(void) {
  while (n_held) free(held[--n_held]);
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  TU_OK(gpu->mem->alloc(bytes ? bytes : 1, 1, &p));
  return p;
}
static void *dev_from(const void *host, size_t bytes) {
  void *p = dev_alloc(bytes);
  if (bytes) TU_OK(gpu->mem->copy(p, host, bytes, APEX_COPY_H2D, 1));
  return p;
}
static void *host_from(const void *dev, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  if (bytes) TU_OK(gpu->mem->copy(p, dev, bytes, APEX_COPY_D2H, 1));
  return p;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float urand(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(rng_state >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* n random values in [-range, range] rounded to dt, as raw elements. */
static void *random_raw(apex_dtype dt, size_t n, float range) {
  float *f = malloc(n * sizeof *f + 1);
  void *r = malloc(n * apex_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) f[i] = range * urand();
  TU_OK(apex_convert(r, dt, f, APEX_F32, n));
  free(f);
  return r;
}

/* raw elements of dt as f32 (a new buffer). */
static float *widen(const void *raw, apex_dtype dt, size_t n) {
  float *f = malloc(n * sizeof *f + 1);
  TU_OK(apex_convert(f, APEX_F32, raw, dt, n));
  return f;
}

/* Prints and counts: max |got - ref| over max |ref| against tol. */
static void close_to(const char *what, const float *ref, const float *got, size_t n, double tol) {
  double worst = 0, big = 0;
  for (size_t i = 0; i < n; i++) {
    double r = ref[i], e = fabs((double)got[i] - r);
    if (fabs(r) > big) big = fabs(r);
    if (!(e <= worst)) worst = e; /* NaN sticks */
  }
  double rel = big > 0 ? worst / big : worst;
  int ok = rel <= tol;
  printf("%s %-56s err %.3g of max|cpu| %.3g (tol %.1g)\n", ok ? "PASS" : "FAIL", what, rel, big, tol);
  failures += !ok;
}

static void same_bytes(const char *what, const void *ref, const void *got, size_t bytes) {
  size_t at = bytes;
  for (size_t i = 0; i < bytes && at == bytes; i++)
    if (((const unsigned char *)ref)[i] != ((const unsigned char *)got)[i]) at = i;
  printf("%s %-56s %s\n", at == bytes ? "PASS" : "FAIL", what, at == bytes ? "bitwise equal" : "differs");
  if (at != bytes) printf("     first differing byte %zu of %zu\n", at, bytes);
  failures += at != bytes;
}

/* ---- attention: GPT's packed qkv [B, T, 3C], heads read in place ---------------------------------- */

static void attention_case(int B, int H, int T, int D, apex_dtype dt, double tol) {
  size_t C = (size_t)H * D, rows = (size_t)B * T, es = apex_dtype_size(dt), nqkv = rows * 3 * C, no = rows * C;
  size_t nstats = (size_t)B * H * T * 2;
  char name[96];
  void *qkv = random_raw(dt, nqkv, 1.5f);
  void *d_qkv = dev_from(qkv, nqkv * es);
  const char *hq = qkv, *dq = d_qkv;
  /* forward */
  void *o_cpu = malloc(no * es), *d_o = dev_alloc(no * es);
  float *st_cpu = malloc(nstats * sizeof(float)), *d_st = dev_alloc(nstats * sizeof(float));
  apex_nn_attention_args a = {.batch = (size_t)B, .heads = H, .t = T, .d = D, .q = {hq, dt}, .k = {hq + C * es, dt}, .v = {hq + 2 * C * es, dt},
                              .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C, .ld_out = C, .stats = st_cpu, .out = o_cpu, .out_dtype = dt,
                              .ws = host_ws};
  TU_OK(cpu->nn_attention(&a));
  a.q.data = dq, a.k.data = dq + C * es, a.v.data = dq + 2 * C * es, a.stats = d_st, a.out = d_o;
  TU_OK(gpu->nn_attention(&a));
  void *o_gpu = host_from(d_o, no * es);
  float *st_gpu = host_from(d_st, nstats * sizeof(float));
  float *of_cpu = widen(o_cpu, dt, no), *of_gpu = widen(o_gpu, dt, no);
  snprintf(name, sizeof name, "attention B%d H%d T%d d%d %s out", B, H, T, D, apex_dtype_name(dt));
  close_to(name, of_cpu, of_gpu, no, tol);
  /* stats: the log-sum-exp m - log r per row, the part of the pair every path agrees on (args_nn.h: cuDNN
   * keeps (lse, 1), the others (max, 1 / sum)) */
  float *m[2] = {malloc(nstats / 2 * sizeof(float)), malloc(nstats / 2 * sizeof(float))};
  float *r[2] = {NULL, NULL};
  for (size_t i = 0; i < nstats / 2; i++)
    m[0][i] = st_cpu[2 * i] - logf(st_cpu[2 * i + 1]), m[1][i] = st_gpu[2 * i] - logf(st_gpu[2 * i + 1]);
  snprintf(name, sizeof name, "attention B%d H%d T%d d%d %s stats lse", B, H, T, D, apex_dtype_name(dt));
  close_to(name, m[0], m[1], nstats / 2, 1e-5);
  /* backward: once into fresh buffers (NaN before: every element must be written), once accumulating */
  float *gout = malloc(no * sizeof(float));
  for (size_t i = 0; i < no; i++) gout[i] = urand();
  float *d_gout = dev_from(gout, no * sizeof(float));
  for (int acc = 0; acc < 2; acc++) {
    float *g_cpu = malloc(nqkv * sizeof(float));
    for (size_t i = 0; i < nqkv; i++) g_cpu[i] = acc ? urand() : NAN;
    float *d_g = dev_from(g_cpu, nqkv * sizeof(float));
    apex_nn_attention_bwd_args b = {.batch = (size_t)B, .heads = H, .t = T, .d = D, .q = {hq, dt}, .k = {hq + C * es, dt},
                                    .v = {hq + 2 * C * es, dt}, .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C, .out = o_cpu,
                                    .out_dtype = dt, .ld_out = C, .stats = st_cpu, .gout = gout, .ld_gout = C, .gq = g_cpu,
                                    .gk = g_cpu + C, .gv = g_cpu + 2 * C, .ld_gq = 3 * C, .ld_gk = 3 * C, .ld_gv = 3 * C,
                                    .accumulate_q = acc, .accumulate_k = acc, .accumulate_v = acc, .ws = host_ws};
    TU_OK(cpu->nn_attention_bwd(&b));
    b.q.data = dq, b.k.data = dq + C * es, b.v.data = dq + 2 * C * es, b.out = d_o, b.stats = d_st, b.gout = d_gout;
    b.gq = d_g, b.gk = d_g + C, b.gv = d_g + 2 * C;
    TU_OK(gpu->nn_attention_bwd(&b));
    float *g_gpu = host_from(d_g, nqkv * sizeof(float));
    snprintf(name, sizeof name, "attention B%d H%d T%d d%d %s grads %s", B, H, T, D, apex_dtype_name(dt), acc ? "accumulated" : "fresh");
    close_to(name, g_cpu, g_gpu, nqkv, tol);
    gpu->mem->free(d_g);
    free(g_cpu);
    free(g_gpu);
  }
  gpu->mem->free(d_gout);
  gpu->mem->free(d_qkv);
  gpu->mem->free(d_o);
  gpu->mem->free(d_st);
  void *all[] = {qkv, o_cpu, st_cpu, o_gpu, st_gpu, of_cpu, of_gpu, m[0], m[1], r[0], r[1], gout};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  ws_release();
}

static void test_attention(void **state) {
  (void)state;
  /* d 64 is a shape the fused kernel (flash_attention.cu) may take for f16/bf16; d 24 never is */
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  const double tol[3] = {5e-5, 4e-3, 3e-2};
  for (int i = 0; i < 3; i++) {
    attention_case(2, 3, 37, 24, dts[i], tol[i]);
    attention_case(2, 2, 80, 64, dts[i], tol[i]);
    attention_case(1, 1, 1, 8, dts[i], tol[i]);
  }
}

/* Mixed q, k, v dtypes are refused by name (the products read one dtype). */
static void test_attention_refuses_mixed_dtypes(void **state) {
  (void)state;
  float f[8] = {0};
  apex_status st = gpu->nn_attention(&(apex_nn_attention_args){.batch = 1, .heads = 1, .t = 1, .d = 1, .q = {f, APEX_F32}, .k = {f, APEX_BF16},
                                                               .v = {f, APEX_F32}, .ld_q = 1, .ld_k = 1, .ld_v = 1, .ld_out = 1, .stats = f,
                                                               .out = f, .out_dtype = APEX_F32});
  assert_int_equal(st, APEX_ERR_UNSUPPORTED);
  tu_assert_message("nn_attention: q, k, v of f32, bf16, f32");
}

/* ---- cross entropy ----------------------------------------------------------------------------------- */

static void cross_entropy_case(size_t N, size_t Cc, apex_dtype dt, float eps, double tol) {
  size_t es = apex_dtype_size(dt);
  char name[96];
  void *x = random_raw(dt, N * Cc, 6.0f);
  int64_t *tg = malloc(N * sizeof *tg);
  size_t count = 0;
  for (size_t i = 0; i < N; i++) {
    tg[i] = i % 5 == 2 ? -1 : (int64_t)((i * 7919) % Cc);
    count += tg[i] >= 0;
  }
  void *d_x = dev_from(x, N * Cc * es), *d_tg = dev_from(tg, N * sizeof *tg);
  float *st_cpu = malloc(2 * N * sizeof(float)), *l_cpu = malloc(N * sizeof(float));
  float *d_st = dev_alloc(2 * N * sizeof(float)), *d_l = dev_alloc(N * sizeof(float));
  double sum_cpu = 0, *d_sum = dev_alloc(sizeof(double));
  uint16_t res_cpu = 0, *d_res = dev_alloc(sizeof(uint16_t)); /* the reduced value as bf16 */
  apex_nn_cross_entropy_args a = {.rows = N, .classes = Cc, .x = {x, dt}, .target = tg, .smoothing = eps, .stats = st_cpu, .loss = l_cpu,
                                  .sum = &sum_cpu, .result = &res_cpu, .result_dtype = APEX_BF16, .divisor = (double)count,
                                  .ws = host_ws};
  TU_OK(cpu->nn_cross_entropy(&a));
  a.x.data = d_x, a.target = d_tg, a.stats = d_st, a.loss = d_l, a.sum = d_sum, a.result = d_res;
  TU_OK(gpu->nn_cross_entropy(&a));
  float *st_gpu = host_from(d_st, 2 * N * sizeof(float)), *l_gpu = host_from(d_l, N * sizeof(float));
  double *sum_gpu = host_from(d_sum, sizeof(double));
  uint16_t *res_gpu = host_from(d_res, sizeof(uint16_t));
  snprintf(name, sizeof name, "cross_entropy %zux%zu %s eps %g terms", N, Cc, apex_dtype_name(dt), eps);
  close_to(name, l_cpu, l_gpu, N, tol);
  snprintf(name, sizeof name, "cross_entropy %zux%zu %s eps %g stats", N, Cc, apex_dtype_name(dt), eps);
  close_to(name, st_cpu, st_gpu, 2 * N, tol);
  float s_cpu = (float)sum_cpu, s_gpu = (float)*sum_gpu, r_cpu = apex_bf16_to_f32(res_cpu), r_gpu = apex_bf16_to_f32(*res_gpu);
  snprintf(name, sizeof name, "cross_entropy %zux%zu %s eps %g sum", N, Cc, apex_dtype_name(dt), eps);
  close_to(name, &s_cpu, &s_gpu, 1, tol);
  snprintf(name, sizeof name, "cross_entropy %zux%zu %s eps %g mean as bf16", N, Cc, apex_dtype_name(dt), eps);
  close_to(name, &r_cpu, &r_gpu, 1, 1.0 / 128); /* one bf16 ulp */
  for (int red = 0; red < 3; red++)
    for (int acc = 0; acc < 2; acc++) {
      float *go = malloc(N * sizeof(float)), *g_cpu = malloc(N * Cc * sizeof(float));
      for (size_t i = 0; i < N; i++) go[i] = urand();
      for (size_t i = 0; i < N * Cc; i++) g_cpu[i] = acc ? urand() : NAN;
      float *d_go = dev_from(go, N * sizeof(float)), *d_g = dev_from(g_cpu, N * Cc * sizeof(float));
      apex_nn_cross_entropy_bwd_args b = {.rows = N, .classes = Cc, .x = {x, dt}, .stats = st_cpu, .target = tg, .smoothing = eps,
                                          .reduction = (apex_nn_reduction)red, .count = (double)count, .gout = go, .gx = g_cpu,
                                          .accumulate_x = acc, .ws = host_ws};
      TU_OK(cpu->nn_cross_entropy_bwd(&b));
      b.x.data = d_x, b.stats = d_st, b.target = d_tg, b.gout = d_go, b.gx = d_g;
      TU_OK(gpu->nn_cross_entropy_bwd(&b));
      float *g_gpu = host_from(d_g, N * Cc * sizeof(float));
      snprintf(name, sizeof name, "cross_entropy %zux%zu %s grad red %d %s", N, Cc, apex_dtype_name(dt), red, acc ? "acc" : "fresh");
      close_to(name, g_cpu, g_gpu, N * Cc, tol);
      gpu->mem->free(d_go);
      gpu->mem->free(d_g);
      free(go);
      free(g_cpu);
      free(g_gpu);
    }
  void *dev[] = {d_x, d_tg, d_st, d_l, d_sum, d_res};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->mem->free(dev[i]);
  void *host[] = {x, tg, st_cpu, l_cpu, st_gpu, l_gpu, sum_gpu, res_gpu};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  ws_release();
}

static void test_cross_entropy(void **state) {
  (void)state;
  /* the GPU sums a row in a block's order, the CPU in order: the sum of exps may differ by a few f32
   * ulps times the square root of the classes */
  cross_entropy_case(67, 1000, APEX_F32, 0.1f, 1e-5);
  cross_entropy_case(67, 1000, APEX_BF16, 0.0f, 1e-5);
  cross_entropy_case(9, 50257, APEX_F16, 0.0f, 1e-5);
  cross_entropy_case(300, 10, APEX_F32, 0.0f, 1e-5);
}

/* ---- dropout: one mask for one generator on both backends -------------------------------------------- */

static void dropout_case(size_t n, apex_dtype xt, apex_dtype ot, uint64_t seed, uint64_t offset, float keep) {
  char name[96];
  size_t xs = apex_dtype_size(xt), os = apex_dtype_size(ot);
  void *x = random_raw(xt, n, 2.0f), *d_x = dev_from(x, n * xs);
  uint8_t *mask = malloc(n + 1), *d_mask = dev_alloc(n + 1);
  void *out = malloc(n * os + 1), *d_out = dev_alloc(n * os + 1);
  apex_nn_dropout_args a = {.n = n, .mask = mask, .seed = seed, .offset = offset, .keep = keep, .x = {x, xt}, .out = out, .out_dtype = ot,
                            .s = 1.0f / keep};
  TU_OK(cpu->nn_dropout(&a));
  a.mask = d_mask, a.x.data = d_x, a.out = d_out;
  TU_OK(gpu->nn_dropout(&a));
  uint8_t *m_gpu = host_from(d_mask, n);
  void *o_gpu = host_from(d_out, n * os);
  snprintf(name, sizeof name, "dropout n %zu seed %llu offset %llu mask", n, (unsigned long long)seed, (unsigned long long)offset);
  same_bytes(name, mask, m_gpu, n);
  snprintf(name, sizeof name, "dropout n %zu %s -> %s out", n, apex_dtype_name(xt), apex_dtype_name(ot));
  same_bytes(name, out, o_gpu, n * os);
  /* the kept fraction is the keep probability (4 sigma of a binomial) */
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) kept += mask[i];
  double sd = sqrt((double)n * keep * (1 - keep));
  int ok = fabs((double)kept - (double)n * keep) <= 4 * sd + 1;
  printf("%s dropout n %zu kept %zu of expected %.0f\n", ok ? "PASS" : "FAIL", n, kept, (double)n * keep);
  failures += !ok;
  for (int acc = 0; acc < 2; acc++) {
    float *go = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) go[i] = urand(), g[i] = acc ? urand() : NAN;
    float *d_go = dev_from(go, n * sizeof(float)), *d_g = dev_from(g, n * sizeof(float));
    apex_nn_dropout_bwd_args b = {.n = n, .mask = mask, .gout = go, .gx = g, .s = 1.0f / keep, .accumulate_x = acc};
    TU_OK(cpu->nn_dropout_bwd(&b));
    b.mask = d_mask, b.gout = d_go, b.gx = d_g;
    TU_OK(gpu->nn_dropout_bwd(&b));
    float *g_gpu = host_from(d_g, n * sizeof(float));
    snprintf(name, sizeof name, "dropout n %zu grad %s", n, acc ? "accumulated" : "fresh");
    same_bytes(name, g, g_gpu, n * sizeof(float));
    gpu->mem->free(d_go);
    gpu->mem->free(d_g);
    free(go);
    free(g);
    free(g_gpu);
  }
  gpu->mem->free(d_x);
  gpu->mem->free(d_mask);
  gpu->mem->free(d_out);
  free(x);
  free(mask);
  free(out);
  free(m_gpu);
  free(o_gpu);
}

static void test_dropout(void **state) {
  (void)state;
  dropout_case(1000003, APEX_F32, APEX_F32, 1234, 77, 0.7f);
  dropout_case(4099, APEX_BF16, APEX_BF16, 5, (uint64_t)1 << 33, 0.9f);
  dropout_case(3, APEX_F16, APEX_F32, 42, 0, 0.5f);
}

/* ---- batch norm's forward ------------------------------------------------------------------------------- */

static void batch_norm_case(const char *mode, size_t N, size_t C, size_t S, apex_dtype xt, int relu, double tol) {
  char name[112];
  size_t n = N * C * S, xs = apex_dtype_size(xt);
  void *x = random_raw(xt, n, 3.0f), *d_x = dev_from(x, n * xs);
  float *w = malloc(C * sizeof(float)), *b = malloc(C * sizeof(float)), *rm = malloc(C * sizeof(float)), *rv = malloc(C * sizeof(float));
  float *given = malloc(3 * C * sizeof(float));
  for (size_t c = 0; c < C; c++) {
    w[c] = 1.0f + 0.5f * urand(), b[c] = urand(), rm[c] = 0.2f * urand(), rv[c] = 1.0f + 0.5f * urand();
    given[c] = urand(), given[C + c] = 1.0f + 0.5f * urand(), given[2 * C + c] = 2.0f + urand();
  }
  float *d_w = dev_from(w, C * sizeof(float)), *d_b = dev_from(b, C * sizeof(float)), *d_rm = dev_from(rm, C * sizeof(float));
  float *d_rv = dev_from(rv, C * sizeof(float)), *d_given = dev_from(given, 3 * C * sizeof(float));
  float *out = malloc(n * xs + 1), *d_out = dev_alloc(n * xs + 1), *st = malloc(2 * C * sizeof(float)), *d_st = dev_alloc(2 * C * sizeof(float));
  int training = strcmp(mode, "eval") != 0, give = strcmp(mode, "given") == 0;
  apex_nn_batch_norm_args a = {.N = N, .C = C, .S = S, .x = {x, xt}, .w = w, .b = b, .out = out, .out_dtype = xt, .stats = st,
                               .training = training, .relu = relu, .eps = 1e-5f, .momentum = 0.1f, .running_mean = rm, .running_var = rv,
                               .given_mean = give ? given : NULL, .given_rstd = give ? given + C : NULL, .given_var = give ? given + 2 * C : NULL,
                               .ws = host_ws};
  TU_OK(cpu->nn_batch_norm(&a));
  a.x.data = d_x, a.w = d_w, a.b = d_b, a.out = d_out, a.stats = d_st, a.running_mean = d_rm, a.running_var = d_rv;
  if (give) a.given_mean = d_given, a.given_rstd = d_given + C, a.given_var = d_given + 2 * C;
  TU_OK(gpu->nn_batch_norm(&a));
  void *o_gpu = host_from(d_out, n * xs);
  float *st_gpu = host_from(d_st, 2 * C * sizeof(float)), *rm_gpu = host_from(d_rm, C * sizeof(float)), *rv_gpu = host_from(d_rv, C * sizeof(float));
  float *of = widen(out, xt, n), *og = widen(o_gpu, xt, n);
  snprintf(name, sizeof name, "batch_norm %s %zux%zux%zu %s%s out", mode, N, C, S, apex_dtype_name(xt), relu ? " relu" : "");
  close_to(name, of, og, n, tol);
  snprintf(name, sizeof name, "batch_norm %s %zux%zux%zu %s stats", mode, N, C, S, apex_dtype_name(xt));
  close_to(name, st, st_gpu, 2 * C, 1e-5);
  snprintf(name, sizeof name, "batch_norm %s %zux%zux%zu %s running mean", mode, N, C, S, apex_dtype_name(xt));
  close_to(name, rm, rm_gpu, C, 1e-5);
  snprintf(name, sizeof name, "batch_norm %s %zux%zux%zu %s running var", mode, N, C, S, apex_dtype_name(xt));
  close_to(name, rv, rv_gpu, C, 1e-5);
  void *dev[] = {d_x, d_w, d_b, d_rm, d_rv, d_given, d_out, d_st};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->mem->free(dev[i]);
  void *host[] = {x, w, b, rm, rv, given, out, st, o_gpu, st_gpu, rm_gpu, rv_gpu, of, og};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  ws_release();
}

static void test_batch_norm(void **state) {
  (void)state;
  const char *modes[3] = {"train", "eval", "given"};
  for (int m = 0; m < 3; m++) {
    batch_norm_case(modes[m], 4, 3, 50, APEX_F32, 0, 1e-5);
    batch_norm_case(modes[m], 8, 5, 49, APEX_BF16, 1, 1.0 / 64); /* an element may round one bf16 ulp apart */
    batch_norm_case(modes[m], 2, 2, 1, APEX_F16, 0, 1.0 / 512);
  }
}

/* ---- the fronts on a CUDA graph ---------------------------------------------------------------------- */

/* A leaf on `device` holding h's values (h stays the caller's). */
static apex_var *leaf_on(apex_device device, const apex_tensor *h) {
  apex_tensor *t = apex_tensor_create_on(device, apex_tensor_dtype(h), apex_tensor_ndim(h), apex_tensor_shape(h));
  assert_non_null(t);
  TU_OK(apex_tensor_copy(t, h));
  apex_var *v = apex_var_create(t, 1);
  assert_non_null(v);
  return v;
}

/* t (any device) as host f32 values (a new buffer of its numel). */
static float *values(const apex_tensor *t) {
  apex_tensor *h = apex_tensor_create(APEX_F32, apex_tensor_ndim(t), apex_tensor_shape(t));
  assert_non_null(h);
  TU_OK(apex_tensor_copy(h, t));
  float *f = malloc(apex_tensor_numel(t) * sizeof(float) + 1);
  memcpy(f, apex_tensor_data(h), apex_tensor_numel(t) * sizeof(float));
  apex_tensor_destroy(h);
  return f;
}

/* loss = mean cross entropy (host targets, one ignored) of logits -> dropout -> causal attention of the
 * result seen as [2, 3, 4, 8] heads, on a CPU graph and on a CUDA graph from the same values and
 * generator: the loss and the leaf's gradient agree, and both generators end at one offset. */
static void test_graph_fronts(void **state) {
  (void)state;
  int64_t shape[2] = {24, 8};
  apex_tensor *h = tu_random_tensor(APEX_F32, 24 * 8, 31, 2.0f), *hv = apex_tensor_view(h, 2, shape);
  int64_t tg[24];
  for (int i = 0; i < 24; i++) tg[i] = i == 5 ? -100 : (i * 5) % 8;
  float loss[2], *grad[2];
  uint64_t offset[2];
  for (int dev = 0; dev < 2; dev++) {
    apex_device device = dev ? APEX_DEVICE_CUDA : APEX_DEVICE_CPU;
    apex_graph *g = apex_graph_create_on(device);
    assert_non_null(g);
    apex_var *x = leaf_on(device, hv);
    apex_rng rng = apex_rng_init(99);
    apex_var *d = apex_dropout(g, x, 0.25f, 1, &rng);
    assert_non_null(d);
    int64_t hs[4] = {2, 3, 4, 8};
    apex_var *q = apex_reshape(g, d, 4, hs), *k = apex_reshape(g, apex_scale(g, x, 0.5f), 4, hs);
    apex_var *att = apex_causal_attention(g, q, k, k);
    assert_non_null(att);
    apex_var *y = apex_reshape(g, att, 2, shape);
    apex_var *l = apex_cross_entropy(g, y, tg, &(apex_cross_entropy_options){.use_ignore_index = 1, .ignore_index = -100,
                                                                             .label_smoothing = 0.05f});
    if (!l) fail_msg("cross_entropy on %s: %s", dev ? "cuda" : "cpu", apex_last_error());
    TU_OK(apex_backward(l, NULL));
    loss[dev] = apex_var_item(l);
    grad[dev] = values(apex_var_grad(x));
    offset[dev] = rng.offset;
    apex_graph_destroy(g);
    apex_var_destroy(x);
  }
  close_to("graph: dropout -> attention -> cross entropy loss", &loss[0], &loss[1], 1, 1e-5);
  close_to("graph: dropout -> attention -> cross entropy grad", grad[0], grad[1], 24 * 8, 1e-5);
  int ok = offset[0] == offset[1];
  printf("%s graph: generator offsets cpu %llu cuda %llu\n", ok ? "PASS" : "FAIL", (unsigned long long)offset[0], (unsigned long long)offset[1]);
  failures += !ok;
  free(grad[0]);
  free(grad[1]);
  apex_tensor_destroy(hv);
  apex_tensor_destroy(h);
}

/* SyncBatchNorm (a local process group) on a CUDA graph: its statistics hook stages x through the host
 * and gives the kernel device statistics; the output and gradients agree with a CPU graph's. */
static void test_sync_batch_norm_graph(void **state) {
  (void)state;
  apex_pg *pg = apex_pg_create_local();
  assert_non_null(pg);
  int64_t xs[4] = {3, 4, 5, 6}, cs[1] = {4};
  apex_tensor *hx = tu_random_tensor(APEX_F32, 360, 7, 2.0f), *hxv = apex_tensor_view(hx, 4, xs);
  apex_tensor *hw = tu_random_tensor(APEX_F32, 4, 8, 1.0f), *hwv = apex_tensor_view(hw, 1, cs);
  float *out[2], *gx[2], *gw[2];
  for (int dev = 0; dev < 2; dev++) {
    apex_device device = dev ? APEX_DEVICE_CUDA : APEX_DEVICE_CPU;
    apex_graph *g = apex_graph_create_on(device);
    assert_non_null(g);
    apex_var *x = leaf_on(device, hxv), *w = leaf_on(device, hwv);
    apex_var *y = apex_sync_batch_norm(g, pg, x, w, NULL, NULL, NULL, NULL);
    if (!y) fail_msg("sync_batch_norm on %s: %s", dev ? "cuda" : "cpu", apex_last_error());
    apex_var *l = apex_sum_all(g, apex_mul(g, y, y));
    if (!l || apex_backward(l, NULL) != APEX_OK) {
      /* only a slot this build does not have yet (the batch-norm backward's) may stop the backward */
      int missing = apex_last_status() == APEX_ERR_UNSUPPORTED;
      printf("%s sync_batch_norm graph backward on %s: %s\n", missing ? "SKIP" : "FAIL", dev ? "cuda" : "cpu", apex_last_error());
      failures += !missing;
      out[dev] = values(apex_var_value(y));
      gx[dev] = gw[dev] = NULL;
    } else {
      out[dev] = values(apex_var_value(y));
      gx[dev] = values(apex_var_grad(x));
      gw[dev] = values(apex_var_grad(w));
    }
    apex_graph_destroy(g);
    apex_var_destroy(x);
    apex_var_destroy(w);
  }
  close_to("graph: sync_batch_norm out", out[0], out[1], 360, 1e-5);
  if (gx[0] && gx[1]) {
    close_to("graph: sync_batch_norm grad x", gx[0], gx[1], 360, 1e-5);
    close_to("graph: sync_batch_norm grad w", gw[0], gw[1], 4, 1e-5);
  }
  for (int i = 0; i < 2; i++) free(out[i]), free(gx[i]), free(gw[i]);
  apex_tensor_destroy(hwv);
  apex_tensor_destroy(hw);
  apex_tensor_destroy(hxv);
  apex_tensor_destroy(hx);
  apex_pg_destroy(pg);
}

static void test_no_failures(void **state) {
  (void)state;
  printf("%s cuda nn contract: %d failing check(s)\n", failures ? "FAIL" : "PASS", failures);
  assert_int_equal(failures, 0);
}

int main(void) {
  cpu = apex__backend_for(APEX_DEVICE_CPU);
  gpu = apex__backend_named("cuda", "test_cuda_nn_contract");
  if (!gpu || !gpu->mem->ready(NULL)) {
    printf("# test_cuda_nn_contract skipped: %s\n", apex_last_error());
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention), cmocka_unit_test(test_attention_refuses_mixed_dtypes), cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_dropout),   cmocka_unit_test(test_batch_norm),                     cmocka_unit_test(test_graph_fronts),
      cmocka_unit_test(test_sync_batch_norm_graph), cmocka_unit_test(test_no_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
