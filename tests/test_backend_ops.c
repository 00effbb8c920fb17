/* test_backend_ops.c: every op case, multi-tensor kernel and optimizer kind on every backend present,
 * against the CPU's portable reference path (ggml's test-backend-ops is the model).
 *
 * The reference is the CPU under APEX_CPU_ISA_PORTABLE (apex/cpu.h): plain C conversions and tiles
 * and the plain-C double-accumulating matrix product. The backends compared with it:
 *   cpu:<isa>  the CPU under each maximum ISA above portable that this CPU has: AVX2 (AVX2
 *              conversions and tiles, OpenBLAS products), AVX512 (adds the AVX-512 product kernel)
 *              and its own level (at AVX512_BF16 or AMX, bf16 products run through oneDNN:
 *              gemm_onednn.c). These run on any x86 machine, GPU or not.
 *   cuda       tensors on the GPU, where one is present (skipped with the reason otherwise). A call
 *              refused with APEX_ERR_UNSUPPORTED or APEX_ERR_DEVICE is a slot the backend lacks:
 *              listed as unsupported, never counted as passed.
 * Each op case runs on a graph made on the backend's device (apex_graph_create_on), forward and
 * backward (gradient of sum(out * R) for a fixed R), in f32, f16 and bf16, and once more per half
 * dtype under autocast ("amp" rows: f32 inputs, the graph's autocast in f16 or bf16), which gives the
 * kernels the mixed dtypes amp produces (a half operand beside an f32 one, an f32 gradient against a
 * half weight); the output and every input gradient are compared, bitwise or within the case's bound
 * (backend_ops_cases.h). One line per case per backend x dtype, then a summary table and a coverage
 * line counting the ops of APEX_OP_COUNT that no case runs. Any failure fails the test. In a build with
 * CUDA, one check (test_cuda_slots_filled) fails for every slot the cuda backend leaves NULL, GPU or
 * not.
 *
 * Then the parity cases (backend_parity_cases.h, the checks test_cuda.c once held), one cmocka test
 * each, run on every backend present whose device is not the CPU: each asserts its own bounds against
 * the CPU and prints a row when it passed (a failure is cmocka's, naming the check); with no such
 * backend each is skipped with the reason. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/cpu.h"
#include "apex/cuda.h"
#include "backend/backend.h"
#include "backend/cpu/gemm_onednn.h"
#include "backend_ops_cases.h"
#include "backend_parity_cases.h"
#include "testutil.h"

/* ---- backends and the tally ----------------------------------------------------------------------- */

#define MAX_BACKENDS 5
typedef struct backend {
  char name[32];
  apex_device device;
  apex_cpu_isa isa; /* the cap a CPU backend runs under */
  int present;
  const char *why; /* why a backend is absent */
} backend;

static backend backends[MAX_BACKENDS];
static int n_backends;

enum { PASSED, FAILED, UNSUPPORTED, SKIPPED, N_OUTCOMES };
static const char *const outcome_name[N_OUTCOMES] = {"passed", "failed", "unsupported", "skipped"};
static const apex_dtype dtypes[3] = {APEX_F32, APEX_F16, APEX_BF16};
static int tally[MAX_BACKENDS][3][N_OUTCOMES];
static int parity_tally[MAX_BACKENDS][N_OUTCOMES]; /* the parity cases, which span dtypes */
static int covered[APEX_OP_COUNT];

static void setup_backends(void) {
  apex_cpu_isa native = apex_cpu_native_isa();
  for (apex_cpu_isa isa = APEX_CPU_ISA_AVX2; isa <= native; isa++) {
    /* AVX2, AVX512 where the CPU has more (above it bf16 products leave the AVX-512 kernel for
     * oneDNN), and the CPU's own level; AMX's products differ from AVX512_BF16's only inside oneDNN */
    if (isa != APEX_CPU_ISA_AVX2 && isa != native && !(isa == APEX_CPU_ISA_AVX512 && native > APEX_CPU_ISA_AVX512)) continue;
    backend *b = &backends[n_backends++];
    snprintf(b->name, sizeof b->name, "cpu:%s", apex_cpu_isa_name(isa));
    b->device = APEX_DEVICE_CPU, b->isa = isa, b->present = 1;
  }
  if (native < APEX_CPU_ISA_AVX2) {
    backend *b = &backends[n_backends++];
    snprintf(b->name, sizeof b->name, "cpu:fast");
    b->why = "this CPU has no path above portable: nothing to compare";
  }
  backend *c = &backends[n_backends++];
  snprintf(c->name, sizeof c->name, "cuda");
  c->device = APEX_DEVICE_CUDA;
  c->present = apex_cuda_available(&c->why);
  printf("# reference: cpu:portable (apex_cpu_set_max_isa(APEX_CPU_ISA_PORTABLE))\n");
  for (int i = 0; i < n_backends; i++)
    printf("# backend %-16s %s%s\n", backends[i].name, backends[i].present ? "present" : "absent, its rows are skipped: ",
           backends[i].present ? "" : backends[i].why);
}

/* Runs on the reference path (for the CPU) or leaves the cap where the backend wants it. */
static void use_isa(apex_cpu_isa isa) { TU_OK(apex_cpu_set_max_isa(isa)); }

static int dtype_index(apex_dtype dt) { return dt == APEX_F32 ? 0 : dt == APEX_F16 ? 1 : 2; }

static void report(int bi, apex_dtype dt, const char *kind, const char *name, int outcome, const char *detail) {
  tally[bi][dtype_index(dt)][outcome]++;
  printf("%-16s %-4s %-5s %-24s %-11s %s\n", backends[bi].name, apex_dtype_name(dt), kind, name, outcome_name[outcome], detail);
}

/* ---- results: the tensors a run produces, widened to f32 ------------------------------------------ */

#define MAX_RES 16
typedef struct result {
  int n;
  char what[MAX_RES][24];
  size_t len[MAX_RES];
  float *v[MAX_RES];
} result;

static void result_free(result *r) {
  for (int i = 0; i < r->n; i++) free(r->v[i]);
  r->n = 0;
}

/* Records t's values (copied to the host first if it lives on the GPU). */
static void capture(result *r, const char *what, const apex_tensor *t) {
  assert_true(r->n < MAX_RES);
  const apex_tensor *h = t;
  apex_tensor *tmp = NULL;
  if (apex_tensor_device(t) != APEX_DEVICE_CPU) {
    tmp = apex_tensor_create(apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
    TU_OK(apex_tensor_copy(tmp, t));
    h = tmp;
  }
  size_t n = apex_tensor_numel(h);
  float *v = malloc((n ? n : 1) * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = apex_tensor_get(h, i);
  snprintf(r->what[r->n], sizeof r->what[0], "%s", what);
  r->len[r->n] = n, r->v[r->n] = v, r->n++;
  apex_tensor_destroy(tmp);
}

static void capture_scalars(result *r, const char *what, const float *x, size_t n) {
  assert_true(r->n < MAX_RES);
  float *v = malloc((n ? n : 1) * sizeof *v);
  memcpy(v, x, n * sizeof *v);
  snprintf(r->what[r->n], sizeof r->what[0], "%s", what);
  r->len[r->n] = n, r->v[r->n] = v, r->n++;
}

static double ulp_at(double v, apex_dtype dt) {
  if (dt == APEX_F32) return 0;
  int e;
  frexp(v, &e);
  int mant = dt == APEX_F16 ? 10 : 7, emin = dt == APEX_F16 ? -14 : -126;
  e = e - 1 < emin ? emin : e - 1;
  return ldexp(1.0, e - mant);
}

/* Compares got with ref: bitwise when rel is 0, else |got - ref| <= rel * max|ref| + one ulp of dt at
 * |ref| (see backend_ops_cases.h). Returns 1 if within; detail says the worst error or the first
 * element outside. */
static int compare(const result *ref, const result *got, double rel, apex_dtype dt, char *detail, size_t dsize) {
  if (ref->n != got->n) {
    snprintf(detail, dsize, "%d results, reference has %d", got->n, ref->n);
    return 0;
  }
  double worst = 0;
  for (int t = 0; t < ref->n; t++) {
    if (ref->len[t] != got->len[t]) {
      snprintf(detail, dsize, "%s: %zu elements, reference %zu", ref->what[t], got->len[t], ref->len[t]);
      return 0;
    }
    double mx = 0;
    for (size_t i = 0; i < ref->len[t]; i++)
      if (isfinite(ref->v[t][i])) mx = fmax(mx, fabs(ref->v[t][i]));
    for (size_t i = 0; i < ref->len[t]; i++) {
      float a = ref->v[t][i], b = got->v[t][i];
      if (tu_bits(a) == tu_bits(b)) continue;
      double bound = rel * mx + ulp_at(fabs(a), dt), err = fabs((double)b - a);
      if (rel == 0 || !(err <= bound)) {
        snprintf(detail, dsize, "%s[%zu] = %.9g (0x%08x), reference %.9g (0x%08x)%s", ref->what[t], i, b, tu_bits(b), a, tu_bits(a),
                 rel == 0 ? ", bitwise expected" : "");
        if (rel != 0) snprintf(detail + strlen(detail), dsize - strlen(detail), ", bound %.3g", bound);
        return 0;
      }
      worst = fmax(worst, err / bound);
    }
  }
  if (rel == 0)
    snprintf(detail, dsize, "bitwise");
  else
    snprintf(detail, dsize, "worst error %.3f of its bound (rel %.0e%s)", worst, rel, dt == APEX_F32 ? "" : " + 1 ulp");
  return 1;
}

/* A copy of host tensor t on dev (t itself for the CPU; the caller destroys t either way). */
static apex_tensor *on_device(apex_tensor *t, apex_device dev) {
  if (dev == APEX_DEVICE_CPU) return apex_tensor_clone(t);
  apex_tensor *d = apex_tensor_create_on(dev, apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (d && apex_tensor_copy(d, t) != APEX_OK) {
    apex_tensor_destroy(d);
    return NULL;
  }
  return d;
}

/* A refusal that names a missing slot (or a device the call cannot use) rather than a wrong result. */
static int is_unsupported(apex_status st) { return st == APEX_ERR_UNSUPPORTED || st == APEX_ERR_DEVICE; }

/* Reports one run against the reference: st is the run's status. */
static void judge(int bi, apex_dtype dt, const char *kind, const char *name, apex_status st, const result *ref, const result *got,
                  double rel) {
  char detail[256];
  if (st != APEX_OK) {
    snprintf(detail, sizeof detail, "%s: %s", apex_status_name(st), apex_last_error());
    report(bi, dt, kind, name, is_unsupported(st) ? UNSUPPORTED : FAILED, detail);
    return;
  }
  int ok = compare(ref, got, rel, dt, detail, sizeof detail);
  report(bi, dt, kind, name, ok ? PASSED : FAILED, detail);
}

/* ---- op cases ------------------------------------------------------------------------------------- */

/* The case's bound on a backend: a matrix product of bf16 operands at AVX512_BF16 and above runs
 * through oneDNN with the gradient rounded to bf16 (see BF16_ONEDNN_REL); the cuda backend's are
 * CUDA_OP_REL and CUDA_PRODUCT_REL (backend_ops_cases.h). */
static double op_rel(const char *name, apex_dtype dt, const backend *b) {
  if (b->device == APEX_DEVICE_CUDA) {
    for (size_t j = 0; dt != APEX_F32 && j < sizeof bf16_onednn_cases / sizeof bf16_onednn_cases[0]; j++)
      if (!strcmp(bf16_onednn_cases[j], name)) return dt == APEX_BF16 ? BF16_ONEDNN_REL : CUDA_F16_ROUNDED_REL;
    for (size_t i = 0; i < sizeof case_rel / sizeof case_rel[0]; i++)
      if (!strcmp(case_rel[i].name, name)) return CUDA_PRODUCT_REL;
    return CUDA_OP_REL;
  }
  for (size_t i = 0; i < sizeof case_rel / sizeof case_rel[0]; i++)
    if (!strcmp(case_rel[i].name, name)) {
      int onednn = 0, product = 0;
      for (size_t j = 0; j < sizeof bf16_onednn_cases / sizeof bf16_onednn_cases[0]; j++) product |= !strcmp(bf16_onednn_cases[j], name);
      if (product && dt == APEX_BF16 && b->device == APEX_DEVICE_CPU && b->isa >= APEX_CPU_ISA_AVX512_BF16) {
        TU_OK(apex_cpu_set_max_isa(b->isa));
        onednn = apex__onednn_active(NULL);
        TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
      }
      return onednn && case_rel[i].rel < BF16_ONEDNN_REL ? BF16_ONEDNN_REL : case_rel[i].rel;
    }
  return 0;
}

/* The case's inputs on the host, in dt: uniform in [-1, 1] (or [0.1, 0.9] for positive inputs),
 * made on the reference path so every backend starts from the same bits. */
static apex_tensor *op_input(const gc_case *c, int ci, int k, apex_dtype dt) {
  size_t n = 1;
  for (int d = 0; d < c->ndim[k]; d++) n *= (size_t)c->shape[k][d];
  apex_tensor *f = tu_random_tensor(APEX_F32, n, 1000u * (unsigned)ci + (unsigned)k + 1, 1.0f);
  if (c->positive >> k & 1)
    for (size_t i = 0; i < n; i++) apex_tensor_set(f, i, 0.5f + 0.4f * apex_tensor_get(f, i));
  apex_tensor *v = apex_tensor_view(f, c->ndim[k], c->shape[k]);
  apex_tensor *t = apex_tensor_to(v, dt);
  apex_tensor_destroy(v);
  apex_tensor_destroy(f);
  return t;
}

/* nn_cases.h's given batch-norm statistics (host tensors) copied to the GPU, for its graphs: a graph
 * takes tensors on its own device only (made in group_setup when the cuda backend is present). */
static apex_tensor *bn_mean_gpu, *bn_var_gpu;

/* Runs case c forward and backward on dev; records the output and the input gradients. On failure
 * returns the status (the message is apex_last_error). *op gets the op of the result. */
static apex_status run_op(const gc_case *c, int ci, apex_dtype dt, apex_device dev, apex_cpu_isa isa, result *r, apex_op *op,
                          apex_dtype autocast) {
  apex_status st = APEX_OK;
  apex_var *in[MAX_IN] = {0};
  apex_tensor *R = NULL;
  use_isa(APEX_CPU_ISA_PORTABLE);
  for (int k = 0; k < c->n_in; k++) {
    apex_tensor *h = op_input(c, ci, k, dt), *t = on_device(h, dev);
    apex_tensor_destroy(h);
    if (!t || !(in[k] = apex_var_create(t, !(c->nograd >> k & 1)))) {
      st = apex_last_status();
      apex_tensor_destroy(t);
      goto out;
    }
  }
  use_isa(isa);
  /* the graph on the device under test: its ops run there, on its backend's slots */
  apex_graph *g = apex_graph_create_on(dev);
  if (!g || (autocast != APEX_F32 && (st = apex_graph_set_autocast(g, 1, autocast)) != APEX_OK)) {
    if (g) apex_graph_destroy(g);
    else st = apex_last_status();
    goto out;
  }
  apex_tensor *host_mean = bn_mean, *host_var = bn_var;
  if (dev != APEX_DEVICE_CPU) bn_mean = bn_mean_gpu, bn_var = bn_var_gpu;
  apex_var *y = c->fn(g, in);
  bn_mean = host_mean, bn_var = host_var;
  if (!y) {
    st = apex_last_status();
    apex_graph_destroy(g);
    goto out;
  }
  *op = apex_var_op(y);
  capture(r, "out", apex_var_value(y));
  size_t ny = apex_tensor_numel(apex_var_value(y));
  apex_tensor *Rh = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)ny});
  for (size_t i = 0; i < ny; i++) apex_tensor_set(Rh, i, (float)sin(0.7 * (double)i + 0.3));
  R = on_device(Rh, dev); /* the output gradient lives where the graph does */
  apex_tensor_destroy(Rh);
  if (!R) st = apex_last_status();
  else if ((st = apex_backward(y, &(apex_backward_options){.grad_output = R})) == APEX_OK)
    for (int k = 0; k < c->n_in; k++) {
      if (c->nograd >> k & 1) continue;
      char what[24];
      snprintf(what, sizeof what, "grad%d", k);
      capture(r, what, apex_var_grad(in[k]));
    }
  apex_graph_destroy(g);
out:
  apex_tensor_destroy(R);
  for (int k = 0; k < c->n_in; k++) apex_var_destroy(in[k]);
  use_isa(APEX_CPU_ISA_NATIVE);
  return st;
}

/* Runs d = 0..2: the case in dtypes[d]; d = 3, 4: f32 inputs under autocast in f16, bf16 ("amp"). */
static void check_op_case(const gc_case *c, int ci) {
  for (int d = 0; d < 5; d++) {
    apex_dtype dt = dtypes[d < 3 ? d : d - 2], in_dt = d < 3 ? dt : APEX_F32, ac = d < 3 ? APEX_F32 : dt;
    const char *kind = d < 3 ? "op" : "amp";
    result ref = {0};
    apex_op op = APEX_OP_LEAF;
    apex_status st = run_op(c, ci, in_dt, APEX_DEVICE_CPU, APEX_CPU_ISA_PORTABLE, &ref, &op, ac);
    if (st != APEX_OK) fail_msg("%s %s %s on the reference path: %s", kind, c->name, apex_dtype_name(dt), apex_last_error());
    covered[op] = 1;
    for (size_t i = 0; i < sizeof case_op / sizeof case_op[0]; i++)
      if (!strcmp(case_op[i].name, c->name)) covered[case_op[i].op] = 1;
    for (int bi = 0; bi < n_backends; bi++) {
      const backend *b = &backends[bi];
      if (!b->present) {
        report(bi, dt, kind, c->name, SKIPPED, b->why ? b->why : "backend absent");
        continue;
      }
      result got = {0};
      apex_op op2;
      st = run_op(c, ci, in_dt, b->device, b->isa, &got, &op2, ac);
      judge(bi, dt, kind, c->name, st, &ref, &got, op_rel(c->name, dt, b));
      result_free(&got);
    }
    result_free(&ref);
  }
}

static void test_op_cases(void **state) {
  (void)state;
  for (size_t i = 0; i < N_CASES; i++) check_op_case(&cases[i], (int)i);
  for (size_t i = 0; i < sizeof extra_cases / sizeof extra_cases[0]; i++) check_op_case(&extra_cases[i], (int)(N_CASES + i));
}

/* ---- multi-tensor cases --------------------------------------------------------------------------- */

/* MT_N tensors of dt on dev with values in [-range, range] from seed (NULL entries on failure). */
static void mt_tensors(apex_tensor **t, apex_dtype dt, apex_device dev, unsigned seed, float range, int with_inf) {
  use_isa(APEX_CPU_ISA_PORTABLE);
  for (int i = 0; i < MT_N; i++) {
    apex_tensor *f = tu_random_tensor(APEX_F32, (size_t)mt_sizes[i], seed + (unsigned)i, range);
    if (with_inf && i == 2) apex_tensor_set(f, 4444, INFINITY);
    apex_tensor *h = apex_tensor_to(f, dt);
    t[i] = on_device(h, dev);
    apex_tensor_destroy(h);
    apex_tensor_destroy(f);
  }
  use_isa(APEX_CPU_ISA_NATIVE);
}

static void mt_free(apex_tensor **t) {
  for (int i = 0; i < MT_N; i++) apex_tensor_destroy(t[i]), t[i] = NULL;
}

static apex_status run_mt(mt_kind kind, apex_dtype dt, apex_device dev, apex_cpu_isa isa, result *r) {
  apex_tensor *x[MT_N], *y[MT_N] = {0}, *out[MT_N] = {0};
  mt_tensors(x, dt, dev, 77, 3.0f, kind == MT_SCALE_INF || kind == MT_CHECK_INF);
  apex_status st = APEX_OK;
  for (int i = 0; i < MT_N; i++)
    if (!x[i]) {
      st = apex_last_status();
      goto out;
    }
  int overflow = 0;
  float norm = 0, per[MT_N] = {0};
  apex_tensor *flat = NULL;
  apex_dtype odt = kind == MT_SCALE_TO_F32 ? APEX_F32 : dt;
  if (kind == MT_SCALE || kind == MT_SCALE_TO_F32 || kind == MT_SCALE_INF || kind == MT_AXPBY) {
    use_isa(APEX_CPU_ISA_PORTABLE);
    for (int i = 0; i < MT_N; i++) {
      apex_tensor *z = apex_tensor_create(odt, 1, &mt_sizes[i]);
      out[i] = on_device(z, dev);
      apex_tensor_destroy(z);
    }
  }
  if (kind == MT_AXPBY) mt_tensors(y, dt, dev, 99, 2.0f, 0);
  use_isa(isa);
  switch (kind) {
  case MT_SCALE:
  case MT_SCALE_INF: st = apex_mt_scale(MT_CHUNK, &overflow, x, out, MT_N, 0.37f); break;
  case MT_SCALE_TO_F32: st = apex_mt_scale(MT_CHUNK, &overflow, x, out, MT_N, 1.0f / 1024); break;
  case MT_AXPBY: st = apex_mt_axpby(MT_CHUNK, &overflow, x, y, out, MT_N, 0.5f, -1.25f, -1); break;
  case MT_L2NORM: st = apex_mt_l2norm(MT_CHUNK, &overflow, x, MT_N, &norm, per); break;
  case MT_UNSCALE_L2NORM: st = apex_mt_unscale_l2norm(MT_CHUNK, &overflow, x, MT_N, 1.0f / 512, &norm, per); break;
  case MT_CHECK_FINITE:
  case MT_CHECK_INF: st = apex_mt_check_finite(x, MT_N, &overflow); break;
  case MT_UNSCALE_FLAT:
    /* the flat buffer must stay on the list's device (it was a host buffer filled by memcpy from the GPU) */
    if ((st = apex_tensor_flatten(x, MT_N, &flat)) == APEX_OK && apex_tensor_device(flat) != dev)
      fail_msg("apex_tensor_flatten: the flat buffer of device %d tensors is on device %d", (int)dev, (int)apex_tensor_device(flat));
    if (st == APEX_OK) st = apex_mt_unscale_flat(flat, 1.0f / 512, &overflow);
    break;
  }
  if (st == APEX_OK) {
    float of = (float)overflow;
    capture_scalars(r, "overflow", &of, 1); /* first: the caller reads it as v[0][0] */
    if (flat) capture(r, "flat", flat);
    if (kind == MT_L2NORM || kind == MT_UNSCALE_L2NORM) capture_scalars(r, "norm", &norm, 1), capture_scalars(r, "per_tensor", per, MT_N);
    for (int i = 0; i < MT_N && out[0]; i++) capture(r, "out", out[i]);
  }
  apex_tensor_destroy(flat);
out:
  use_isa(APEX_CPU_ISA_NATIVE);
  mt_free(x), mt_free(y), mt_free(out);
  return st;
}

static void test_multi_tensor_cases(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof mt_cases / sizeof mt_cases[0]; c++)
    for (int d = 0; d < 3; d++) {
      apex_dtype dt = dtypes[d];
      result ref = {0};
      if (run_mt(mt_cases[c].kind, dt, APEX_DEVICE_CPU, APEX_CPU_ISA_PORTABLE, &ref) != APEX_OK)
        fail_msg("%s %s on the reference path: %s", mt_cases[c].name, apex_dtype_name(dt), apex_last_error());
      mt_kind kind = mt_cases[c].kind;
      if ((kind == MT_SCALE_INF || kind == MT_CHECK_INF) != (ref.v[0][0] == 1.0f))
        fail_msg("%s: the reference's overflow flag is %g", mt_cases[c].name, ref.v[0][0]);
      for (int bi = 0; bi < n_backends; bi++) {
        if (!backends[bi].present) {
          report(bi, dt, "mt", mt_cases[c].name, SKIPPED, "backend absent");
          continue;
        }
        result got = {0};
        apex_status st = run_mt(mt_cases[c].kind, dt, backends[bi].device, backends[bi].isa, &got);
        judge(bi, dt, "mt", mt_cases[c].name, st, &ref, &got, backends[bi].device == APEX_DEVICE_CUDA ? mt_cases[c].cuda_rel : 0);
        result_free(&got);
      }
      result_free(&ref);
    }
}

/* ---- optimizer cases ------------------------------------------------------------------------------ */

static apex_status run_optim(int oc, apex_dtype dt, apex_device dev, apex_cpu_isa isa, result *r) {
  apex_tensor *p[MT_N], *g[MT_N];
  mt_tensors(p, dt, dev, 11, 1.0f, 0);
  mt_tensors(g, dt, dev, 22, 4.0f, 0); /* gradients scaled by 4 */
  apex_status st = APEX_OK;
  apex_optimizer *opt = NULL;
  for (int i = 0; i < MT_N; i++)
    if (!p[i] || !g[i]) {
      st = apex_last_status();
      goto out;
    }
  use_isa(isa);
  if (!(opt = apex_optimizer_create(optim_cases[oc].kind, &optim_cases[oc].opts))) {
    st = apex_last_status();
    goto out;
  }
  if ((st = apex_optimizer_add_group(opt, p, MT_N, g, MT_N, NULL, NULL)) != APEX_OK) goto out;
  for (int s = 0; s < 2 && st == APEX_OK; s++) st = apex_optimizer_step(opt, 4.0f, 0);
  if (st != APEX_OK) goto out;
  for (int i = 0; i < MT_N; i++) {
    capture(r, "param", p[i]);
    const apex_tensor *m = apex_optimizer_master(opt, 0, i);
    if (m && m != p[i]) capture(r, "master", m);
  }
out:
  use_isa(APEX_CPU_ISA_NATIVE);
  apex_optimizer_destroy(opt);
  mt_free(p), mt_free(g);
  return st;
}

static void test_optimizer_cases(void **state) {
  (void)state;
  int kinds[APEX_OPTIM_KIND_COUNT] = {0};
  for (size_t k = 0; k < sizeof optim_cases / sizeof optim_cases[0]; k++) kinds[optim_cases[k].kind] = 1;
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++)
    if (!kinds[k]) fail_msg("optimizer kind %s has no case in backend_ops_cases.h", apex_optim_kind_name((apex_optim_kind)k));
  for (int k = 0; k < (int)(sizeof optim_cases / sizeof optim_cases[0]); k++)
    for (int d = 0; d < 3; d++) {
      apex_dtype dt = dtypes[d];
      const char *name = optim_cases[k].name;
      result ref = {0};
      if (run_optim(k, dt, APEX_DEVICE_CPU, APEX_CPU_ISA_PORTABLE, &ref) != APEX_OK)
        fail_msg("%s %s on the reference path: %s", name, apex_dtype_name(dt), apex_last_error());
      for (int bi = 0; bi < n_backends; bi++) {
        if (!backends[bi].present) {
          report(bi, dt, "optim", name, SKIPPED, "backend absent");
          continue;
        }
        result got = {0};
        apex_status st = run_optim(k, dt, backends[bi].device, backends[bi].isa, &got);
        judge(bi, dt, "optim", name, st, &ref, &got, backends[bi].device == APEX_DEVICE_CUDA ? OPTIM_CUDA_REL : 0);
        result_free(&got);
      }
      result_free(&ref);
    }
}

/* ---- nn slot cases -------------------------------------------------------------------------------- */

/* The nn slots (backend/args_nn.h) called directly, with every buffer on the backend's device: the
 * kernels a backend plugs into autograd's fronts, checked before any front sends them device tensors.
 * Gradient outputs mix accumulate 1 (over preloaded values) and 0, so both halves of the rule are
 * compared. The reference is the CPU backend's slot under the portable ISA. */

#define SLOT_MAX 48
typedef struct slot_run {
  apex_device dev;
  const apex_backend *be;
  apex_tensor *t[SLOT_MAX];
  int nt;
  void *mem[32];
  int nmem;
  result *r;
} slot_run;

/* n values of dt on the run's device: seeded values in [-1, 1], or zeros for seed 0. */
static void *sbuf_as(slot_run *s, size_t n, uint64_t seed, apex_dtype dt) {
  assert_true(s->nt < SLOT_MAX);
  apex_tensor *h = seed ? tu_random_tensor(dt, n, seed, 1.0f) : apex_tensor_create(dt, 1, (int64_t[]){(int64_t)n});
  apex_tensor *d = on_device(h, s->dev);
  apex_tensor_destroy(h);
  assert_non_null(d);
  s->t[s->nt++] = d;
  return apex_tensor_data(d);
}
static float *sbuf(slot_run *s, size_t n, uint64_t seed) { return sbuf_as(s, n, seed, APEX_F32); }

/* Records the buffer sbuf gave as p (found among the run's tensors). */
static void sgot(slot_run *s, const char *what, const void *p) {
  for (int i = 0; i < s->nt; i++)
    if (apex_tensor_data(s->t[i]) == p) {
      capture(s->r, what, s->t[i]);
      return;
    }
  fail_msg("slot buffer %s not found", what);
}

/* The slots' workspace (args_nn.h: memory on the slot's device): host blocks for the CPU, device tensors
 * for another backend, kept until the run ends. */
static void *slot_ws_get(void *ctx, size_t bytes) {
  slot_run *s = ctx;
  if (s->dev != APEX_DEVICE_CPU) {
    if (s->nt == SLOT_MAX) return NULL;
    apex_tensor *t = apex_tensor_create_on(s->dev, APEX_F32, 1, (int64_t[]){(int64_t)((bytes + 3) / 4 + 1)});
    if (!t) return NULL;
    s->t[s->nt++] = t;
    return apex_tensor_data(t);
  }
  if (s->nmem == (int)(sizeof s->mem / sizeof s->mem[0])) return NULL;
  return s->mem[s->nmem++] = malloc(bytes ? bytes : 1);
}
static apex_nn_workspace slot_ws(slot_run *s) { return (apex_nn_workspace){slot_ws_get, s}; }

static apex_status slot_binary(slot_run *s, apex_nn_binary_kind kind) {
  enum { N = 1000 };
  apex_nn_bcast plan = {.nd = 1, .shape = {N}, .st = {{1}, {1}}, .rows = 1, .len = N};
  float *a = sbuf(s, N, 11), *b = sbuf(s, N, 12), *out = sbuf(s, N, 0), *go = sbuf(s, N, 13), *ga = sbuf(s, N, 14), *gb = sbuf(s, N, 0);
  apex_status st = s->be->nn_binary(&(apex_nn_binary_args){.kind = kind, .plan = &plan, .a = {a, APEX_F32}, .b = {b, APEX_F32},
                                                            .numel_a = N, .numel_b = N, .out = out, .out_dtype = APEX_F32,
                                                            .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_binary_bwd(&(apex_nn_binary_bwd_args){.kind = kind, .plan = &plan, .a = {a, APEX_F32}, .b = {b, APEX_F32},
                                                          .numel_a = N, .numel_b = N, .gout = go, .ga = ga, .gb = gb,
                                                          .accumulate_a = 1, .accumulate_b = 0, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "ga", ga), sgot(s, "gb", gb);
  return st;
}
static apex_status slot_add(slot_run *s) { return slot_binary(s, APEX_NN_ADD); }
static apex_status slot_mul(slot_run *s) { return slot_binary(s, APEX_NN_MUL); }

/* x and the result in dt (the slot widens and rounds them itself); gradients f32. */
static apex_status slot_unary(slot_run *s, apex_nn_unary_kind kind, apex_dtype dt) {
  enum { N = 777 };
  void *x = sbuf_as(s, N, 21, dt), *out = sbuf_as(s, N, 0, dt);
  float *go = sbuf(s, N, 22), *gx = sbuf(s, N, 23);
  apex_status st = s->be->nn_unary(&(apex_nn_unary_args){.kind = kind, .n = N, .x = {x, dt}, .out = out, .out_dtype = dt,
                                                            .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = kind, .n = N, .x = {x, dt}, .y = out, .y_dtype = dt, .gout = go,
                                                        .gx = gx, .accumulate_x = 1, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "gx", gx);
  return st;
}
static apex_status slot_relu(slot_run *s) { return slot_unary(s, APEX_NN_RELU, APEX_F32); }
static apex_status slot_gelu_tanh(slot_run *s) { return slot_unary(s, APEX_NN_GELU_TANH, APEX_F32); }
static apex_status slot_relu_f16(slot_run *s) { return slot_unary(s, APEX_NN_RELU, APEX_F16); }
static apex_status slot_gelu_tanh_bf16(slot_run *s) { return slot_unary(s, APEX_NN_GELU_TANH, APEX_BF16); }

static apex_status slot_scale(slot_run *s) {
  enum { N = 513 };
  float *x = sbuf(s, N, 31), *out = sbuf(s, N, 0), *go = sbuf(s, N, 32), *gx = sbuf(s, N, 0);
  apex_status st = s->be->nn_scale(&(apex_nn_scale_args){.n = N, .x = {x, APEX_F32}, .out = out, .out_dtype = APEX_F32, .s = 0.37f,
                                                            .ws = slot_ws(s)});
  if (st == APEX_OK) st = s->be->nn_scale_bwd(&(apex_nn_scale_bwd_args){.n = N, .gout = go, .gx = gx, .s = 0.37f, .accumulate_x = 0});
  sgot(s, "out", out), sgot(s, "gx", gx);
  return st;
}

/* x, w, b and the result in dt (the slot widens them itself); statistics f32, gout and gx in gdt (the
 * gradient-dtype contract), gw and gb f32. */
static apex_status slot_row_norm_g(slot_run *s, int centre, apex_dtype dt, size_t R, size_t D, apex_dtype gdt) {
  void *x = sbuf_as(s, R * D, 41, dt), *w = sbuf_as(s, D, 42, dt), *b = centre ? sbuf_as(s, D, 43, dt) : NULL;
  void *out = sbuf_as(s, R * D, 0, dt), *go = sbuf_as(s, R * D, 44, gdt), *gx = sbuf_as(s, R * D, 45, gdt);
  float *stats = sbuf(s, 2 * R, 0), *gw = sbuf(s, D, 46);
  float *gb = centre ? sbuf(s, D, 47) : NULL;
  apex_status st = s->be->nn_row_norm(&(apex_nn_row_norm_args){.centre = centre, .rows = R, .cols = D, .x = {x, dt},
                                                                .w = {w, dt}, .b = {b, dt}, .out = out,
                                                                .out_dtype = dt, .stats = stats, .eps = 1e-5f, .ws = slot_ws(s)});
  float *work = s->dev == APEX_DEVICE_CPU ? slot_ws_get(s, R * D * sizeof(float)) : NULL;
  if (st == APEX_OK)
    st = s->be->nn_row_norm_bwd(&(apex_nn_row_norm_bwd_args){.centre = centre, .rows = R, .cols = D, .x = {x, dt}, .w = {w, dt}, .stats = stats,
                                                              .gout = go, .gout_dtype = gdt, .gx = gx, .gx_dtype = gdt, .gw = gw,
                                                              .gb = gb, .accumulate_x = 1,
                                                              .accumulate_w = 1, .accumulate_b = 1, .workspace = work,
                                                              .workspace_bytes = work ? R * D * sizeof(float) : 0, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "rstd", stats), sgot(s, "gx", gx), sgot(s, "gw", gw);
  if (centre) sgot(s, "gb", gb);
  return st;
}
static apex_status slot_row_norm_of(slot_run *s, int centre, apex_dtype dt, size_t R, size_t D) {
  return slot_row_norm_g(s, centre, dt, R, D, APEX_F32);
}
static apex_status slot_row_norm(slot_run *s, int centre, apex_dtype dt) { return slot_row_norm_of(s, centre, dt, 8, 96); }
/* rows longer than cuda's fused kernels take (16,384): its wide-row path */
static apex_status slot_layer_norm_wide(slot_run *s) { return slot_row_norm_of(s, 1, APEX_BF16, 3, 20000); }
static apex_status slot_rms_norm_wide(slot_run *s) { return slot_row_norm_of(s, 0, APEX_F32, 2, 17000); }
static apex_status slot_layer_norm(slot_run *s) { return slot_row_norm(s, 1, APEX_F32); }
static apex_status slot_rms_norm(slot_run *s) { return slot_row_norm(s, 0, APEX_F32); }
static apex_status slot_layer_norm_f16(slot_run *s) { return slot_row_norm(s, 1, APEX_F16); }
static apex_status slot_rms_norm_bf16(slot_run *s) { return slot_row_norm(s, 0, APEX_BF16); }

static apex_status slot_sum(slot_run *s) {
  enum { DIM = 37, INNER = 19 };
  float *x = sbuf(s, DIM * INNER, 51), *out = sbuf(s, INNER, 0);
  apex_status st = s->be->nn_reduce(&(apex_nn_reduce_args){.kind = APEX_NN_REDUCE_SUM, .outer = 1, .dim = DIM, .inner = INNER,
                                                            .scale = 1.0 / DIM, .x = {x, APEX_F32}, .out = out});
  sgot(s, "out", out);
  return st;
}

static apex_status slot_embedding(slot_run *s) {
  enum { V = 11, DIM = 16, N = 20 };
  int64_t ids[N]; /* on the host for both backends (args_nn.h; cuda/embedding.cu reads them there) */
  for (int i = 0; i < N; i++) ids[i] = (i * 7 + 3) % V == 5 ? 2 : (i * 7 + 3) % V; /* id 5 never occurs, id 2 often */
  float *w = sbuf(s, V * DIM, 61), *out = sbuf(s, N * DIM, 0), *go = sbuf(s, N * DIM, 62), *gw = sbuf(s, V * DIM, 63);
  float *gw0 = sbuf(s, V * DIM, 64);
  apex_status st = s->be->nn_embedding(&(apex_nn_embedding_args){.n = N, .dim = DIM, .ids = ids, .w = w, .dtype = APEX_F32, .out = out});
  for (int acc = 1; acc >= 0 && st == APEX_OK; acc--)
    st = s->be->nn_embedding_bwd(&(apex_nn_embedding_bwd_args){.n = N, .dim = DIM, .rows = V, .ids = ids, .gout = go,
                                                                .gw = acc ? gw : gw0, .accumulate_w = acc});
  sgot(s, "out", out), sgot(s, "gw", gw), sgot(s, "gw fresh", gw0);
  return st;
}

static apex_status slot_linear(slot_run *s) {
  enum { M = 13, N = 17, K = 19 };
  float *x = sbuf(s, M * K, 71), *w = sbuf(s, N * K, 72), *bias = sbuf(s, N, 73), *out = sbuf(s, M * N, 0);
  float *go = sbuf(s, M * N, 74), *gx = sbuf(s, M * K, 0), *gw = sbuf(s, N * K, 75), *gb = sbuf(s, N, 76);
  apex_status st = s->be->nn_linear(&(apex_nn_linear_args){.m = M, .n = N, .k = K, .x = {x, APEX_F32}, .w = {w, APEX_F32}, .bias = {bias, APEX_F32},
                                                            .out = out, .out_dtype = APEX_F32, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = M, .n = N, .k = K, .x = {x, APEX_F32}, .w = {w, APEX_F32}, .gout = go,
                                                          .gx = gx, .gw = gw, .gb = gb, .accumulate_x = 0, .accumulate_w = 1,
                                                          .accumulate_b = 1, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "gx", gx), sgot(s, "gw", gw), sgot(s, "gb", gb);
  return st;
}

static apex_status slot_matmul(slot_run *s, int b_batched) {
  enum { B = 3, M = 5, N = 7, K = 9 };
  size_t nb = (size_t)(b_batched ? B : 1) * K * N;
  float *a = sbuf(s, B * M * K, 81), *b = sbuf(s, nb, 82), *out = sbuf(s, B * M * N, 0), *go = sbuf(s, B * M * N, 83);
  float *ga = sbuf(s, B * M * K, 0), *gb = sbuf(s, nb, 84);
  apex_status st = s->be->nn_matmul(&(apex_nn_matmul_args){.batch = B, .m = M, .n = N, .k = K, .a = {a, APEX_F32}, .b = {b, APEX_F32},
                                                            .b_batched = b_batched, .out = out, .out_dtype = APEX_F32, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_matmul_bwd(&(apex_nn_matmul_bwd_args){.batch = B, .m = M, .n = N, .k = K, .a = {a, APEX_F32}, .b = {b, APEX_F32},
                                                          .b_batched = b_batched, .gout = go, .ga = ga, .gb = gb, .accumulate_a = 0,
                                                          .accumulate_b = 1, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "ga", ga), sgot(s, "gb", gb);
  return st;
}
static apex_status slot_bmm(slot_run *s) { return slot_matmul(s, 1); }
static apex_status slot_matmul_shared(slot_run *s) { return slot_matmul(s, 0); }

static apex_status slot_conv2d(slot_run *s) {
  apex_nn_conv_geom g = {.n = 2, .c = 3, .h = 8, .w = 7, .o = 4, .kh = 3, .kw = 3, .sh = 2, .sw = 1, .ph = 1, .pw = 1, .ho = 4, .wo = 7};
  size_t nx = 2 * 3 * 8 * 7, nw = 4 * 3 * 3 * 3, no = 2 * 4 * 4 * 7;
  float *x = sbuf(s, nx, 91), *w = sbuf(s, nw, 92), *bias = sbuf(s, 4, 93), *out = sbuf(s, no, 0), *go = sbuf(s, no, 94);
  float *gx = sbuf(s, nx, 0), *gw = sbuf(s, nw, 95), *gb = sbuf(s, 4, 0);
  apex_status st = s->be->nn_conv2d(&(apex_nn_conv2d_args){.geom = g, .x = {x, APEX_F32}, .w = {w, APEX_F32}, .bias = {bias, APEX_F32},
                                                            .out = out, .out_dtype = APEX_F32, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_conv2d_bwd(&(apex_nn_conv2d_bwd_args){.geom = g, .x = {x, APEX_F32}, .w = {w, APEX_F32}, .gout = go, .gx = gx, .gw = gw, .gb = gb,
                                                          .accumulate_x = 0, .accumulate_w = 1, .accumulate_b = 0, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "gx", gx), sgot(s, "gw", gw), sgot(s, "gb", gb);
  return st;
}

/* ---- the slots of the kernels beside the CPU's loss.c, shape.c, conv.c, norm.c and multi_tensor.c, with
 * native half inputs and the mixed dtypes amp gives them ---- */

/* n values of dt on the run's device in [lo, hi] (seeded). */
static void *sbuf_in(slot_run *s, size_t n, uint64_t seed, apex_dtype dt, float lo, float hi) {
  assert_true(s->nt < SLOT_MAX);
  apex_tensor *f = tu_random_tensor(APEX_F32, n, seed, 1.0f);
  for (size_t i = 0; i < n; i++) apex_tensor_set(f, i, lo + (apex_tensor_get(f, i) + 1.0f) * 0.5f * (hi - lo));
  apex_tensor *h = apex_tensor_to(f, dt), *d = on_device(h, s->dev);
  apex_tensor_destroy(f);
  apex_tensor_destroy(h);
  assert_non_null(d);
  s->t[s->nt++] = d;
  return apex_tensor_data(d);
}

/* The tensor whose data sbuf gave as p. */
static apex_tensor *stensor(slot_run *s, const void *p) {
  for (int i = 0; i < s->nt; i++)
    if (apex_tensor_data(s->t[i]) == p) return s->t[i];
  fail_msg("slot buffer not found");
  return NULL;
}

/* autocast's products: an f32 x against a bf16 weight and bias, and the f32 gradient against both. */
static apex_status slot_linear_mixed(slot_run *s) {
  enum { M = 13, N = 17, K = 19 };
  float *x = sbuf(s, M * K, 171), *out = sbuf(s, M * N, 0), *go = sbuf(s, M * N, 174), *gx = sbuf(s, M * K, 0);
  void *w = sbuf_as(s, N * K, 172, APEX_BF16), *bias = sbuf_as(s, N, 173, APEX_BF16);
  float *gw = sbuf(s, N * K, 175), *gb = sbuf(s, N, 176);
  apex_status st = s->be->nn_linear(&(apex_nn_linear_args){.m = M, .n = N, .k = K, .x = {x, APEX_F32}, .w = {w, APEX_BF16},
                                                            .bias = {bias, APEX_BF16}, .out = out, .out_dtype = APEX_F32, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = M, .n = N, .k = K, .x = {x, APEX_F32}, .w = {w, APEX_BF16}, .gout = go,
                                                          .gx = gx, .gw = gw, .gb = gb, .accumulate_x = 0, .accumulate_w = 1,
                                                          .accumulate_b = 0, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "gx", gx), sgot(s, "gw", gw), sgot(s, "gb", gb);
  return st;
}

/* a bf16 batch against an f32 b into a bf16 result, and the gradients of both. */
static apex_status slot_matmul_mixed(slot_run *s) {
  enum { B = 3, M = 5, N = 7, K = 9 };
  void *a = sbuf_as(s, B * M * K, 181, APEX_BF16), *out = sbuf_as(s, B * M * N, 0, APEX_BF16);
  float *b = sbuf(s, B * K * N, 182), *go = sbuf(s, B * M * N, 183), *ga = sbuf(s, B * M * K, 184), *gb = sbuf(s, B * K * N, 0);
  apex_status st = s->be->nn_matmul(&(apex_nn_matmul_args){.batch = B, .m = M, .n = N, .k = K, .a = {a, APEX_BF16}, .b = {b, APEX_F32},
                                                            .b_batched = 1, .out = out, .out_dtype = APEX_BF16, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_matmul_bwd(&(apex_nn_matmul_bwd_args){.batch = B, .m = M, .n = N, .k = K, .a = {a, APEX_BF16}, .b = {b, APEX_F32},
                                                          .b_batched = 1, .gout = go, .ga = ga, .gb = gb, .accumulate_a = 1,
                                                          .accumulate_b = 0, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "ga", ga), sgot(s, "gb", gb);
  return st;
}

/* ---- the one-pass classifier (args_nn.h: nn_cross_entropy's gx, nn_linear_bwd's gout_scale) ---- */

/* n int64 targets on the run's device (an f32 buffer of 2n elements holding their bytes). */
static int64_t *sbuf_targets(slot_run *s, const int64_t *tg, size_t n) {
  apex_tensor *h = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)(2 * n)});
  assert_non_null(h);
  memcpy(apex_tensor_data(h), tg, n * sizeof *tg);
  apex_tensor *d = on_device(h, s->dev);
  apex_tensor_destroy(h);
  assert_non_null(d);
  assert_true(s->nt < SLOT_MAX);
  s->t[s->nt++] = d;
  return apex_tensor_data(d);
}

/* ROWS rows of `classes` logits of dt with label smoothing 0.1, row 1 ignored: the terms, stats and mean,
 * and the gradient written over the logits themselves. */
static apex_status slot_ce_one_pass(slot_run *s, apex_dtype dt, size_t classes) {
  enum { ROWS = 5 };
  int64_t tg[ROWS];
  for (size_t r = 0; r < ROWS; r++) tg[r] = (int64_t)((r * 7919 + 3) % classes);
  tg[1] = -1, tg[3] = (int64_t)classes - 1; /* an ignored row; the last class (a tail's, when there is one) */
  void *x = sbuf_as(s, ROWS * classes, 301, dt);
  float *stats = sbuf(s, 2 * ROWS, 0), *loss = sbuf(s, ROWS, 0), *result = sbuf(s, 1, 0);
  apex_status st = s->be->nn_cross_entropy(&(apex_nn_cross_entropy_args){
      .rows = ROWS, .classes = classes, .x = {x, dt}, .target = sbuf_targets(s, tg, ROWS), .smoothing = 0.1f, .stats = stats, .loss = loss,
      .result = result, .result_dtype = APEX_F32, .divisor = ROWS - 1, .gx = x, .ws = slot_ws(s)});
  sgot(s, "stats", stats), sgot(s, "loss", loss), sgot(s, "result", result), sgot(s, "gx", x);
  return st;
}
/* 16-byte vectors of 1024-thread rows; one element at a time (37 classes); f16's vectors */
static apex_status slot_ce_one_pass_wide(slot_run *s) { return slot_ce_one_pass(s, APEX_BF16, 8200); }
static apex_status slot_ce_one_pass_tail(slot_run *s) { return slot_ce_one_pass(s, APEX_F32, 37); }
static apex_status slot_ce_one_pass_f16(slot_run *s) { return slot_ce_one_pass(s, APEX_F16, 64); }

/* The head's backward on a bf16 gradient scaled by a device-side 0.37: gx bf16 fresh, gw f32 added to. */
static apex_status slot_linear_gout_scale(slot_run *s) {
  enum { M = 13, N = 40, K = 24 };
  void *x = sbuf_as(s, M * K, 311, APEX_BF16), *w = sbuf_as(s, N * K, 312, APEX_BF16), *go = sbuf_as(s, M * N, 313, APEX_BF16);
  void *gx = sbuf_as(s, M * K, 0, APEX_BF16);
  float *gw = sbuf(s, N * K, 314), *scale = sbuf(s, 1, 0);
  apex_tensor *sc = stensor(s, scale);
  TU_OK(apex_tensor_fill(sc, 0.37f));
  /* a bias gradient cannot take the scale (args_nn.h): refused, nothing written */
  float *gb = sbuf(s, N, 0);
  TU_FAILS(s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = M, .n = N, .k = K, .x = {x, APEX_BF16}, .w = {w, APEX_BF16}, .gout = go,
                                                            .gout_dtype = APEX_BF16, .gout_scale = scale, .gw = gw, .gb = gb,
                                                            .accumulate_w = 1, .ws = slot_ws(s)}),
           APEX_ERR_INVALID_ARG, "gout_scale with a bias gradient");
  apex_status st = s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = M, .n = N, .k = K, .x = {x, APEX_BF16}, .w = {w, APEX_BF16}, .gout = go,
                                                                    .gout_dtype = APEX_BF16, .gout_scale = scale, .gx = gx, .gx_dtype = APEX_BF16,
                                                                    .gw = gw, .accumulate_x = 0, .accumulate_w = 1, .ws = slot_ws(s)});
  sgot(s, "gx", gx), sgot(s, "gw", gw);
  return st;
}

/* ---- gradients in the values' dtype (args_nn.h's gradient dtypes: a graph with half gradients) ---- */

static apex_status slot_layer_norm_half_grads(slot_run *s) { return slot_row_norm_g(s, 1, APEX_BF16, 8, 96, APEX_BF16); }
static apex_status slot_rms_norm_half_grads_wide(slot_run *s) { return slot_row_norm_g(s, 0, APEX_BF16, 3, 20000, APEX_BF16); }

/* bf16 x and w, the output's gradient and gx bf16 (gx added to), gw and gb f32; with gelu, the epilogue's
 * pre-activation bf16 and gx written fresh. */
static apex_status slot_linear_half_grads_of(slot_run *s, int gelu) {
  enum { M = 13, N = 17, K = 19 };
  void *x = sbuf_as(s, M * K, 271, APEX_BF16), *w = sbuf_as(s, N * K, 272, APEX_BF16), *bias = sbuf_as(s, N, 273, APEX_BF16);
  void *out = sbuf_as(s, M * N, 0, APEX_BF16), *pre = gelu ? sbuf_as(s, M * N, 0, APEX_BF16) : NULL;
  void *go = sbuf_as(s, M * N, 274, APEX_BF16), *gx = sbuf_as(s, M * K, 275, APEX_BF16);
  float *gw = sbuf(s, N * K, 276), *gb = sbuf(s, N, 277);
  apex_status st = s->be->nn_linear(&(apex_nn_linear_args){.m = M, .n = N, .k = K, .x = {x, APEX_BF16}, .w = {w, APEX_BF16},
                                                            .bias = {bias, APEX_BF16}, .out = out, .out_dtype = APEX_BF16, .gelu = gelu,
                                                            .pre = pre, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = M, .n = N, .k = K, .x = {x, APEX_BF16}, .w = {w, APEX_BF16}, .gout = go,
                                                          .gout_dtype = APEX_BF16, .gx = gx, .gx_dtype = APEX_BF16, .gw = gw, .gb = gb,
                                                          .accumulate_x = !gelu, .accumulate_w = 1, .accumulate_b = 0, .gelu = gelu,
                                                          .pre = {pre, APEX_BF16}, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "gx", gx), sgot(s, "gw", gw), sgot(s, "gb", gb);
  return st;
}
static apex_status slot_linear_half_grads(slot_run *s) { return slot_linear_half_grads_of(s, 0); }

/* A bf16 x against an f32 weight with an f32 output gradient (an f32 product) whose gx is bf16: a half
 * gradient of operands that the products take in f32 (cuBLASLt cannot write it directly). */
static apex_status slot_linear_half_gx_f32_product(slot_run *s) {
  enum { M = 13, N = 17, K = 19 };
  void *x = sbuf_as(s, M * K, 371, APEX_BF16), *gx = sbuf_as(s, M * K, 375, APEX_BF16);
  float *w = sbuf(s, N * K, 372), *go = sbuf(s, M * N, 374), *gw = sbuf(s, N * K, 0);
  apex_status st = s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){.m = M, .n = N, .k = K, .x = {x, APEX_BF16}, .w = {w, APEX_F32},
                                                                    .gout = go, .gx = gx, .gx_dtype = APEX_BF16, .gw = gw,
                                                                    .accumulate_x = 1, .accumulate_w = 0, .ws = slot_ws(s)});
  sgot(s, "gx", gx), sgot(s, "gw", gw);
  return st;
}
static apex_status slot_linear_gelu_half_grads(slot_run *s) { return slot_linear_half_grads_of(s, 1); }

/* args_nn.h's dgelu: x is the output of the previous layer's GELU epilogue, whose pre-activation is pre [M, k]
 * (spread over GELU's curve), and gx (written fresh) receives that pre-activation's gradient, its column
 * sums added to the previous layer's bias gradient dgb; values, pre and gradients in dt. k a multiple of 8
 * takes cuBLASLt's DGELU epilogue on the GPU for half dt, k = 19 the separate kernels. part 0 records gx,
 * gw and gb, part 1 dgb (their bounds differ: see slot_cases). */
static apex_status slot_linear_dgelu_of(slot_run *s, apex_dtype dt, int k, int part) {
  enum { M = 13, N = 24 }; /* N, the product's inner extent, a multiple of 8 too: no row of an operand unaligned */
  void *x = sbuf_as(s, (size_t)M * k, 471, dt), *w = sbuf_as(s, (size_t)N * k, 472, dt), *go = sbuf_as(s, M * N, 474, dt);
  void *pre = sbuf_in(s, (size_t)M * k, 478, dt, -3.0f, 3.0f), *gx = sbuf_as(s, (size_t)M * k, 0, dt);
  float *gw = sbuf(s, (size_t)N * k, 476), *gb = sbuf(s, N, 0), *dgb = sbuf(s, (size_t)k, 477);
  apex_status st = s->be->nn_linear_bwd(&(apex_nn_linear_bwd_args){
      .m = M, .n = N, .k = k, .x = {x, dt}, .w = {w, dt}, .gout = go, .gout_dtype = dt, .gx = gx, .gx_dtype = dt, .gw = gw, .gb = gb,
      .accumulate_x = 0, .accumulate_w = 1, .accumulate_b = 0, .dgelu_pre = {pre, dt}, .dgelu_gb = dgb, .accumulate_dgelu_gb = 1,
      .ws = slot_ws(s)});
  if (st == APEX_OK && s->dev == APEX_DEVICE_CPU && part == 1) {
    /* dgb's bound (slot_cases) is relative to max |gx|: here no smaller than max |dgb| */
    double mx = 0, mb = 0;
    for (size_t i = 0; i < (size_t)M * k; i++) mx = fmax(mx, fabs(apex_tensor_get(stensor(s, gx), i)));
    for (int j = 0; j < k; j++) mb = fmax(mb, fabs(dgb[j]));
    if (!(mb >= mx)) fail_msg("nn_linear dgelu: max |dgb| %g below max |gx| %g: the case's bound does not hold", mb, mx);
  }
  if (part == 0) sgot(s, "gx", gx), sgot(s, "gw", gw), sgot(s, "gb", gb);
  else sgot(s, "dgelu_gb", dgb);
  return st;
}
static apex_status slot_linear_dgelu_f32(slot_run *s) { return slot_linear_dgelu_of(s, APEX_F32, 32, 0); }
static apex_status slot_linear_dgelu_f16(slot_run *s) { return slot_linear_dgelu_of(s, APEX_F16, 32, 0); }
static apex_status slot_linear_dgelu_bf16(slot_run *s) { return slot_linear_dgelu_of(s, APEX_BF16, 32, 0); }
static apex_status slot_linear_dgelu_bf16_k19(slot_run *s) { return slot_linear_dgelu_of(s, APEX_BF16, 19, 0); }
static apex_status slot_linear_dgelu_gb_f32(slot_run *s) { return slot_linear_dgelu_of(s, APEX_F32, 32, 1); }
static apex_status slot_linear_dgelu_gb_f16(slot_run *s) { return slot_linear_dgelu_of(s, APEX_F16, 32, 1); }
static apex_status slot_linear_dgelu_gb_bf16(slot_run *s) { return slot_linear_dgelu_of(s, APEX_BF16, 32, 1); }
static apex_status slot_linear_dgelu_gb_bf16_k19(slot_run *s) { return slot_linear_dgelu_of(s, APEX_BF16, 19, 1); }

/* add's backward from a bf16 gradient into a bf16 ga (added to) and an f32 gb (fresh): the residual
 * stream beside a value made from leaves alone. */
static apex_status slot_add_half_grads(slot_run *s) {
  enum { N = 1000 };
  apex_nn_bcast plan = {.nd = 1, .shape = {N}, .st = {{1}, {1}}, .rows = 1, .len = N};
  void *go = sbuf_as(s, N, 281, APEX_BF16), *ga = sbuf_as(s, N, 282, APEX_BF16);
  float *gb = sbuf(s, N, 0);
  apex_status st = s->be->nn_binary_bwd(&(apex_nn_binary_bwd_args){.kind = APEX_NN_ADD, .plan = &plan, .numel_a = N, .numel_b = N, .gout = go,
                                                                    .gout_dtype = APEX_BF16, .ga = ga, .gb = gb, .ga_dtype = APEX_BF16,
                                                                    .gb_dtype = APEX_F32, .accumulate_a = 1, .accumulate_b = 0,
                                                                    .ws = slot_ws(s)});
  sgot(s, "ga", ga), sgot(s, "gb", gb);
  return st;
}

/* GPT's packed attention in bf16 (B 2, T 33, 2 heads of 64): dO bf16, and the gradients of q, k and v
 * the thirds of one fresh bf16 buffer's rows (what a fused GPU backward writes in place). */
static apex_status slot_attention_half_grads(slot_run *s) {
  enum { B = 2, T = 33, H = 2, D = 64, C = H * D, ROWS = B * T };
  void *qkv = sbuf_as(s, ROWS * 3 * C, 291, APEX_BF16), *out = sbuf_as(s, ROWS * C, 0, APEX_BF16);
  void *go = sbuf_as(s, ROWS * C, 292, APEX_BF16), *g = sbuf_as(s, ROWS * 3 * C, 0, APEX_BF16);
  float *stats = sbuf(s, (size_t)B * H * T * 2, 0);
  const char *q = qkv;
  char *gq = g;
  const size_t es = 2;
  apex_status st = s->be->nn_attention(&(apex_nn_attention_args){.batch = B, .heads = H, .t = T, .d = D, .q = {q, APEX_BF16},
                                                                  .k = {q + C * es, APEX_BF16}, .v = {q + 2 * C * es, APEX_BF16},
                                                                  .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C, .ld_out = C, .stats = stats,
                                                                  .out = out, .out_dtype = APEX_BF16, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_attention_bwd(&(apex_nn_attention_bwd_args){
        .batch = B, .heads = H, .t = T, .d = D, .q = {q, APEX_BF16}, .k = {q + C * es, APEX_BF16}, .v = {q + 2 * C * es, APEX_BF16},
        .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C, .out = out, .out_dtype = APEX_BF16, .ld_out = C, .stats = stats, .gout = go,
        .gout_dtype = APEX_BF16, .ld_gout = C, .gq = gq, .gk = gq + C * es, .gv = gq + 2 * C * es, .gq_dtype = APEX_BF16,
        .gk_dtype = APEX_BF16, .gv_dtype = APEX_BF16, .ld_gq = 3 * C, .ld_gk = 3 * C, .ld_gv = 3 * C, .ws = slot_ws(s)});
  sgot(s, "out", out), sgot(s, "dqkv", g);
  return st;
}

/* softmax and log-softmax over the middle dimension of a bf16 x [3, 37, 5], each also rounded to bf16. */
static apex_status slot_softmax(slot_run *s) {
  enum { O = 3, D = 37, I = 5, N = O * D * I };
  apex_status st = APEX_OK;
  for (int lg = 0; lg < 2 && st == APEX_OK; lg++) {
    void *x = sbuf_in(s, N, 201 + lg, APEX_BF16, -4.0f, 4.0f), *cast = sbuf_as(s, N, 0, APEX_BF16);
    float *out = sbuf(s, N, 0), *go = sbuf(s, N, 203 + lg), *gx = sbuf(s, N, 205 + lg);
    st = s->be->nn_softmax(&(apex_nn_softmax_args){.log = lg, .outer = O, .dim = D, .inner = I, .x = {x, APEX_BF16}, .out = out,
                                                   .out_cast = cast, .cast_dtype = APEX_BF16, .ws = slot_ws(s)});
    if (st == APEX_OK)
      st = s->be->nn_softmax_bwd(&(apex_nn_softmax_bwd_args){.log = lg, .outer = O, .dim = D, .inner = I, .y = out, .gout = go, .gx = gx,
                                                             .accumulate_x = lg});
    sgot(s, "out", out), sgot(s, "cast", cast), sgot(s, "gx", gx);
  }
  return st;
}

/* MSE, BCE with logits and BCE of an f16 x against an f32 y: the terms (NONE, rounded to f16), their sum
 * (a double where the tensors are), their mean (the reduced result, bf16, where the tensors are), and the
 * gradients under MEAN. */
static apex_status slot_pointwise_loss(slot_run *s) {
  enum { N = 3000 };
  apex_status st = APEX_OK;
  for (int k = 0; k < 3 && st == APEX_OK; k++) {
    apex_nn_pointwise_loss_kind kind = k == 0 ? APEX_NN_MSE : k == 1 ? APEX_NN_BCE_WITH_LOGITS : APEX_NN_BCE;
    void *x = k == 2 ? sbuf_in(s, N, 211 + k, APEX_F16, 0.05f, 0.95f) : sbuf_as(s, N, 211 + k, APEX_F16);
    float *y = sbuf_in(s, N, 221 + k, APEX_F32, 0.0f, 1.0f), *sum = sbuf(s, 2, 0);
    void *loss = sbuf_as(s, N, 0, APEX_F16), *mean = sbuf_as(s, 1, 0, APEX_BF16);
    float *go = sbuf(s, 1, 231 + k), *gx = sbuf(s, N, 0), *gy = sbuf(s, N, 241 + k);
    st = s->be->nn_pointwise_loss(&(apex_nn_pointwise_loss_args){.kind = kind, .n = N, .x = {x, APEX_F16}, .y = {y, APEX_F32}, .loss = loss,
                                                                 .loss_dtype = APEX_F16, .sum = (double *)(void *)sum,
                                                                 .result = mean, .result_dtype = APEX_BF16, .divisor = N});
    if (st == APEX_OK)
      st = s->be->nn_pointwise_loss_bwd(&(apex_nn_pointwise_loss_bwd_args){.kind = kind, .n = N, .x = {x, APEX_F16}, .y = {y, APEX_F32},
                                                                           .reduction = APEX_NN_MEAN, .count = N, .gout = go, .gx = gx,
                                                                           .gy = gy, .accumulate_x = 0, .accumulate_y = 1});
    /* the double, read back as one f32 value */
    apex_tensor *h = apex_tensor_create(APEX_F32, 1, (int64_t[]){2});
    TU_OK(apex_tensor_copy(h, stensor(s, sum)));
    double d;
    memcpy(&d, apex_tensor_data(h), sizeof d);
    float f = (float)d;
    apex_tensor_destroy(h);
    sgot(s, "loss", loss), capture_scalars(s->r, "sum", &f, 1), sgot(s, "mean", mean), sgot(s, "gx", gx), sgot(s, "gy", gy);
  }
  return st;
}

/* The fused batch norm + relu's backward from a bf16 x and its bf16 output (training statistics). */
static apex_status slot_batch_norm_bwd(slot_run *s) {
  enum { NB = 3, C = 4, S = 10, N = NB * C * S };
  void *x = sbuf_as(s, N, 251, APEX_BF16), *y = sbuf_as(s, N, 252, APEX_BF16);
  float *w = sbuf(s, C, 253), *b = sbuf(s, C, 254), *stats = sbuf_in(s, 2 * C, 255, APEX_F32, 0.5f, 1.5f), *go = sbuf(s, N, 256);
  float *gx = sbuf(s, N, 257), *gw = sbuf(s, C, 0), *gb = sbuf(s, C, 258);
  apex_status st = s->be->nn_batch_norm_bwd(&(apex_nn_batch_norm_bwd_args){
      .N = NB, .C = C, .S = S, .x = {x, APEX_BF16}, .w = w, .b = b, .y = y, .y_dtype = APEX_BF16, .stats = stats, .training = 1, .relu = 1,
      .gout = go, .gx = gx, .gw = gw, .gb = gb, .accumulate_x = 0, .accumulate_w = 0, .accumulate_b = 1, .ws = slot_ws(s)});
  sgot(s, "gx", gx), sgot(s, "gw", gw), sgot(s, "gb", gb);
  return st;
}

/* The hooked batch norm's backward halves on an f16 x: the sums, then gx from them. */
static apex_status slot_batch_norm_sums_dx(slot_run *s) {
  enum { NB = 2, C = 3, S = 17, N = NB * C * S };
  void *x = sbuf_as(s, N, 261, APEX_F16);
  float *mean = sbuf(s, C, 262), *rstd = sbuf_in(s, C, 263, APEX_F32, 0.5f, 2.0f), *w = sbuf(s, C, 264), *go = sbuf(s, N, 265);
  float *sums = sbuf(s, 2 * C, 0), *gw = sbuf(s, C, 266), *gb = sbuf(s, C, 0), *gx = sbuf(s, N, 267);
  apex_status st = s->be->nn_batch_norm_sums(&(apex_nn_batch_norm_sums_args){.N = NB, .C = C, .S = S, .x = {x, APEX_F16}, .mean = mean,
                                                                             .rstd = rstd, .gout = go, .sums = sums, .gw = gw, .gb = gb,
                                                                             .accumulate_w = 1, .accumulate_b = 0, .ws = slot_ws(s)});
  if (st == APEX_OK)
    st = s->be->nn_batch_norm_dx(&(apex_nn_batch_norm_dx_args){.N = NB, .C = C, .S = S, .x = {x, APEX_F16}, .w = w, .mean = mean,
                                                                .rstd = rstd, .gout = go, .sums = sums, .count = 2 * NB * S, .gx = gx,
                                                                .accumulate_x = 1, .ws = slot_ws(s)});
  sgot(s, "sums", sums), sgot(s, "gw", gw), sgot(s, "gb", gb), sgot(s, "gx", gx);
  return st;
}

/* Max (with argmax) and average pooling of a bf16 x, 3x3 windows at stride 2 with padding 1 (windows
 * overlap, so the backward adds several terms into one element). */
static apex_status slot_pool2d(slot_run *s) {
  apex_nn_conv_geom g = {.n = 2, .c = 3, .h = 9, .w = 8, .o = 3, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .ho = 5, .wo = 4};
  size_t nx = 2 * 3 * 9 * 8, no = 2 * 3 * 5 * 4;
  apex_status st = APEX_OK;
  for (int mx = 0; mx < 2 && st == APEX_OK; mx++) {
    void *x = sbuf_as(s, nx, 271 + mx, APEX_BF16), *out = sbuf_as(s, no, 0, APEX_BF16);
    float *arg = mx ? sbuf(s, no, 0) : NULL, *go = sbuf(s, no, 273 + mx), *gx = sbuf(s, nx, 275 + mx);
    st = s->be->nn_pool2d(&(apex_nn_pool2d_args){.geom = g, .x = {x, APEX_BF16}, .out = out, .out_dtype = APEX_BF16, .argmax = (int32_t *)arg,
                                                 .ws = slot_ws(s)});
    if (st == APEX_OK)
      st = s->be->nn_pool2d_bwd(&(apex_nn_pool2d_bwd_args){.geom = g, .argmax = (int32_t *)arg, .gout = go, .gx = gx, .accumulate_x = mx});
    sgot(s, "out", out), sgot(s, "gx", gx);
  }
  return st;
}

/* A [2, 3, 4, 5] bf16 tensor permuted to [4, 2, 5, 3], and the gradient back. */
static apex_status slot_permute(slot_run *s) {
  enum { N = 120 };
  void *x = sbuf_as(s, N, 281, APEX_BF16), *out = sbuf_as(s, N, 0, APEX_BF16);
  float *go = sbuf(s, N, 282), *gx = sbuf(s, N, 283);
  apex_nn_permute_args a = {.ndim = 4, .shape = {4, 2, 5, 3}, .strides = {5, 60, 1, 20}, .n = N, .x = x, .out = out, .dtype = APEX_BF16};
  apex_status st = s->be->nn_permute(&a);
  apex_nn_permute_bwd_args b = {.ndim = 4, .shape = {4, 2, 5, 3}, .strides = {5, 60, 1, 20}, .n = N, .gout = go, .gx = gx, .accumulate_x = 1};
  if (st == APEX_OK) st = s->be->nn_permute_bwd(&b);
  sgot(s, "out", out), sgot(s, "gx", gx);
  return st;
}

/* f32, bf16 and f16 pieces side by side into an f16 result, and the gradients back. */
static apex_status slot_concat(slot_run *s) {
  enum { O = 6, W0 = 3, W1 = 5, W2 = 2, ROW = W0 + W1 + W2 };
  const void *x[3] = {sbuf(s, O * W0, 291), sbuf_as(s, O * W1, 292, APEX_BF16), sbuf_as(s, O * W2, 293, APEX_F16)};
  apex_dtype xd[3] = {APEX_F32, APEX_BF16, APEX_F16};
  size_t width[3] = {W0, W1, W2};
  void *out = sbuf_as(s, O * ROW, 0, APEX_F16);
  float *go = sbuf(s, O * ROW, 294), *g0 = sbuf(s, O * W0, 0), *g2 = sbuf(s, O * W2, 295);
  float *gx[3] = {g0, NULL, g2};
  int acc[3] = {0, 0, 1};
  apex_status st = s->be->nn_concat(&(apex_nn_concat_args){.n = 3, .outer = O, .row = ROW, .x = x, .x_dtype = xd, .width = width, .out = out,
                                                           .out_dtype = APEX_F16});
  if (st == APEX_OK)
    st = s->be->nn_concat_bwd(&(apex_nn_concat_bwd_args){.n = 3, .outer = O, .row = ROW, .width = width, .gout = go, .gx = gx,
                                                         .accumulate = acc});
  sgot(s, "out", out), sgot(s, "g0", g0), sgot(s, "g2", g2);
  return st;
}

/* Sums and L2 norms of an f16 x [4, 33, 6] over its middle dimension and of all of it, and their
 * gradients. */
static apex_status slot_reduce(slot_run *s) {
  enum { O = 4, D = 33, I = 6, N = O * D * I };
  void *x = sbuf_as(s, N, 301, APEX_F16);
  apex_status st = APEX_OK;
  for (int c = 0; c < 4 && st == APEX_OK; c++) {
    int norm = c & 1, all = c >> 1;
    size_t o = all ? 1 : O, d = all ? N : D, in = all ? 1 : I, nl = o * in;
    float *out = sbuf(s, nl, 0), *nrm = norm ? sbuf(s, nl, 0) : NULL, *go = sbuf(s, nl, 302 + c), *gx = sbuf(s, N, 306 + c);
    apex_nn_reduce_kind kind = norm ? APEX_NN_REDUCE_NORM : APEX_NN_REDUCE_SUM;
    st = s->be->nn_reduce(&(apex_nn_reduce_args){.kind = kind, .outer = o, .dim = d, .inner = in, .scale = 1.0 / (double)d,
                                                 .x = {x, APEX_F16}, .out = out, .norms = nrm});
    if (st == APEX_OK)
      st = s->be->nn_reduce_bwd(&(apex_nn_reduce_bwd_args){.kind = kind, .outer = o, .dim = d, .inner = in, .scale = 1.0f / (float)d,
                                                           .x = {x, APEX_F16}, .norms = nrm, .gout = go, .gx = gx, .accumulate_x = c & 1});
    sgot(s, "out", out), sgot(s, "gx", gx);
  }
  return st;
}

/* Every binary kind of a bf16 a [4, 6] against an f32 b [6] broadcast over its rows (b's gradient sums
 * four terms an element), into an f32 result. */
static apex_status slot_binary_bcast(slot_run *s) {
  enum { R = 4, L = 6 };
  apex_nn_bcast plan = {.nd = 2, .shape = {R, L}, .st = {{L, 1}, {0, 1}}, .rows = R, .len = L};
  void *a = sbuf_in(s, R * L, 311, APEX_BF16, 0.2f, 2.0f);
  float *b = sbuf_in(s, L, 312, APEX_F32, 0.5f, 1.5f), *go = sbuf(s, R * L, 313);
  apex_status st = APEX_OK;
  static const apex_nn_binary_kind kinds[] = {APEX_NN_ADD, APEX_NN_SUB, APEX_NN_MUL, APEX_NN_DIV, APEX_NN_POW, APEX_NN_GT, APEX_NN_LT, APEX_NN_EQ};
  float *out = sbuf(s, R * L, 0), *ga = sbuf(s, R * L, 0), *gb = sbuf(s, L, 0);
  for (int k = 0; k < 8 && st == APEX_OK; k++) {
    st = s->be->nn_binary(&(apex_nn_binary_args){.kind = kinds[k], .plan = &plan, .a = {a, APEX_BF16}, .b = {b, APEX_F32}, .numel_a = R * L,
                                                 .numel_b = L, .out = out, .out_dtype = APEX_F32, .ws = slot_ws(s)});
    char what[24];
    snprintf(what, sizeof what, "out %d", k);
    sgot(s, what, out);
    if (st != APEX_OK || kinds[k] >= APEX_NN_GT) continue; /* comparisons have no gradient */
    st = s->be->nn_binary_bwd(&(apex_nn_binary_bwd_args){.kind = kinds[k], .plan = &plan, .a = {a, APEX_BF16}, .b = {b, APEX_F32},
                                                         .numel_a = R * L, .numel_b = L, .gout = go, .ga = ga, .gb = gb, .accumulate_a = k & 1,
                                                         .accumulate_b = 1, .ws = slot_ws(s)});
  }
  sgot(s, "ga", ga), sgot(s, "gb", gb);
  return st;
}

/* Every unary kind but relu and the tanh GELU (slot_unary's) on an f16 x into an f16 result. */
static apex_status slot_unary_kinds(slot_run *s) {
  enum { N = 300 };
  static const apex_nn_unary_kind kinds[] = {APEX_NN_GELU, APEX_NN_TANH, APEX_NN_SIGMOID, APEX_NN_EXP, APEX_NN_LOG, APEX_NN_POW_SCALAR,
                                             APEX_NN_POW_SCALAR, APEX_NN_POW_SCALAR};
  static const float ps[] = {0, 0, 0, 0, 0, 2.0f, 0.5f, 1.7f};
  void *x = sbuf_in(s, N, 321, APEX_F16, 0.1f, 2.0f), *out = sbuf_as(s, N, 0, APEX_F16);
  float *go = sbuf(s, N, 322), *gx = sbuf(s, N, 0);
  apex_status st = APEX_OK;
  for (int k = 0; k < 8 && st == APEX_OK; k++) {
    st = s->be->nn_unary(&(apex_nn_unary_args){.kind = kinds[k], .n = N, .x = {x, APEX_F16}, .out = out, .out_dtype = APEX_F16, .p = ps[k],
                                               .ws = slot_ws(s)});
    if (st == APEX_OK)
      st = s->be->nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = kinds[k], .n = N, .x = {x, APEX_F16}, .y = out, .y_dtype = APEX_F16,
                                                         .p = ps[k], .gout = go, .gx = gx, .accumulate_x = k > 0, .ws = slot_ws(s)});
    char what[24];
    snprintf(what, sizeof what, "out %d", k);
    sgot(s, what, out);
  }
  sgot(s, "gx", gx);
  return st;
}

/* amp's fused flush + unscale of two bf16 leaves (one all zeros) into f32 masters. */
static apex_status slot_flush_unscale(slot_run *s) {
  enum { N0 = 1000, N1 = 77 };
  sbuf_as(s, N0, 331, APEX_BF16), sbuf_as(s, N1, 0, APEX_BF16);
  apex_tensor *grad[2] = {s->t[s->nt - 2], s->t[s->nt - 1]};
  sbuf(s, N0, 332), sbuf(s, N1, 333);
  apex_tensor *sum[2] = {s->t[s->nt - 2], s->t[s->nt - 1]};
  sbuf(s, N0, 0), sbuf(s, N1, 0);
  apex_tensor *out[2] = {s->t[s->nt - 2], s->t[s->nt - 1]};
  int overflow = 0;
  unsigned char nz[2] = {7, 7};
  apex_status st = s->be->mt_flush_unscale(&(apex_mt_flush_unscale_args){.fn = "slot_flush_unscale", .n = 2, .grad = grad, .sum = sum,
                                                                          .out = out, .scale = 1.0f / 64, .overflow = &overflow, .nonzero = nz});
  float flags[3] = {(float)overflow, nz[0], nz[1]};
  capture_scalars(s->r, "flags", flags, 3), capture(s->r, "out0", out[0]), capture(s->r, "out1", out[1]);
  return st;
}

/* rel: the CUDA kernels' order of summation (and cuDNN's algorithm choice) differ from the CPU's; dt:
 * the dtype of the case's native inputs, whose ulp the bound adds. */
static const struct {
  const char *name;
  apex_status (*run)(slot_run *s);
  double rel;
  apex_dtype dt;
} slot_cases[] = {
    {"nn_binary add", slot_add, 1e-6, APEX_F32},
    {"nn_binary mul", slot_mul, 1e-6, APEX_F32},
    {"nn_unary relu", slot_relu, 1e-6, APEX_F32},
    {"nn_unary gelu_tanh", slot_gelu_tanh, 1e-5, APEX_F32},
    {"nn_unary relu", slot_relu_f16, 1e-6, APEX_F16},
    {"nn_unary gelu_tanh", slot_gelu_tanh_bf16, 1e-5, APEX_BF16},
    {"nn_scale", slot_scale, 1e-6, APEX_F32},
    {"nn_row_norm layer", slot_layer_norm, 1e-4, APEX_F32},
    {"nn_row_norm rms", slot_rms_norm, 1e-4, APEX_F32},
    {"nn_row_norm layer", slot_layer_norm_f16, 1e-4, APEX_F16},
    {"nn_row_norm rms", slot_rms_norm_bf16, 1e-4, APEX_BF16},
    {"nn_reduce sum", slot_sum, 1e-5, APEX_F32},
    {"nn_embedding", slot_embedding, 1e-6, APEX_F32},
    {"nn_linear", slot_linear, 1e-4, APEX_F32},
    {"nn_matmul batched", slot_bmm, 1e-4, APEX_F32},
    {"nn_matmul shared b", slot_matmul_shared, 1e-4, APEX_F32},
    {"nn_conv2d", slot_conv2d, 2e-3, APEX_F32},
    /* the kernels beside loss.c, shape.c, conv.c, norm.c and multi_tensor.c, and amp's mixed dtypes; rel
     * as CUDA_OP_REL and CUDA_PRODUCT_REL (backend_ops_cases.h), dt the half dtype whose ulp a result adds */
    {"nn_row_norm layer wide", slot_layer_norm_wide, 1e-4, APEX_BF16},
    {"nn_row_norm rms wide", slot_rms_norm_wide, 1e-4, APEX_F32},
    /* the mixed products: a bf16 operand makes the GPU round the f32 output gradient to bf16 before
     * the backward products (cuda/nn_slots.c's bf16_grad, as oneDNN does on the CPU), so their bound is
     * BF16_ONEDNN_REL's 4 u, derived in backend_ops_cases.h; 1e-4 (the f32 accumulation alone) failed
     * on an H200 (f4316f8's run: gx[1] -0.04029 vs -0.03687, err 3.4e-3, i.e. 17 terms each off by up to
     * 2^-9 of itself, within 2^-6 * max|gx|) */
    {"nn_linear mixed", slot_linear_mixed, BF16_ONEDNN_REL, APEX_BF16},
    {"nn_matmul mixed", slot_matmul_mixed, BF16_ONEDNN_REL, APEX_BF16},
    /* gradients in the values' dtype: each side rounds its f32 term once, so the bound adds a bf16 unit;
     * the products' rel as the mixed ones' (the gradient is bf16 on both sides); the attention's twice
     * test_flash_attention's bf16 dq/dk/dv bound against an exact reference (3e-2 each side: operand, P and
     * dS roundings), since here both sides carry such errors */
    {"nn_row_norm layer half grads", slot_layer_norm_half_grads, 1e-4, APEX_BF16},
    {"nn_row_norm rms wide half grads", slot_rms_norm_half_grads_wide, 1e-4, APEX_BF16},
    {"nn_linear half grads", slot_linear_half_grads, BF16_ONEDNN_REL, APEX_BF16},
    {"nn_linear gelu half grads", slot_linear_gelu_half_grads, BF16_ONEDNN_REL, APEX_BF16},
    /* gw meets the bf16 x with the gradient rounded to bf16 on the GPU (bf16_grad), as the mixed cases */
    {"nn_linear half gx, f32 product", slot_linear_half_gx_f32_product, BF16_ONEDNN_REL, APEX_BF16},
    /* dgelu: with u the dtype's unit roundoff, the GPU's epilogue rounds gpre = (gout w) gelu'(pre) once from
     * f32 where the CPU rounds gout w first (u |gout w| |gelu'| = u |gpre|), then gpre: each element within
     * 3u |gpre| of the CPU's (the products' f32 order adding far less), inside 4u (BF16_ONEDNN_REL,
     * CUDA_F16_ROUNDED_REL); f32 runs the separate kernels, the CPU's steps. dgelu_gb sums M = 13 such
     * elements: 3u M of max |gx|, which the case checks is below max |dgelu_gb| */
    {"nn_linear dgelu", slot_linear_dgelu_f32, 1e-4, APEX_F32},
    {"nn_linear dgelu", slot_linear_dgelu_f16, CUDA_F16_ROUNDED_REL, APEX_F16},
    {"nn_linear dgelu", slot_linear_dgelu_bf16, BF16_ONEDNN_REL, APEX_BF16},
    {"nn_linear dgelu, k 19 (no epilogue)", slot_linear_dgelu_bf16_k19, BF16_ONEDNN_REL, APEX_BF16},
    {"nn_linear dgelu bias grad", slot_linear_dgelu_gb_f32, 1e-4, APEX_F32},
    {"nn_linear dgelu bias grad", slot_linear_dgelu_gb_f16, 39 * 0x1p-11, APEX_F16},
    {"nn_linear dgelu bias grad", slot_linear_dgelu_gb_bf16, 39 * 0x1p-8, APEX_BF16},
    {"nn_linear dgelu bias grad, k 19", slot_linear_dgelu_gb_bf16_k19, 39 * 0x1p-8, APEX_BF16},
    {"nn_binary add half grads", slot_add_half_grads, 0, APEX_BF16},
    {"nn_attention half grads", slot_attention_half_grads, 6e-2, APEX_BF16},
    /* the one-pass classifier: the GPU's running max and its sums' trees against the CPU's passes (the
     * ops' CUDA_OP_REL), then the gradient's rounding (the ulp of dt); the scaled products as the half
     * gradients' */
    {"nn_cross_entropy one pass", slot_ce_one_pass_wide, 1e-5, APEX_BF16},
    {"nn_cross_entropy one pass", slot_ce_one_pass_tail, 1e-5, APEX_F32},
    {"nn_cross_entropy one pass", slot_ce_one_pass_f16, 1e-5, APEX_F16},
    {"nn_linear gout_scale", slot_linear_gout_scale, BF16_ONEDNN_REL, APEX_BF16},
    {"nn_softmax", slot_softmax, 1e-5, APEX_BF16},
    {"nn_pointwise_loss", slot_pointwise_loss, 1e-5, APEX_F16},
    {"nn_batch_norm_bwd relu", slot_batch_norm_bwd, 1e-5, APEX_BF16},
    {"nn_batch_norm_sums dx", slot_batch_norm_sums_dx, 1e-5, APEX_F16},
    {"nn_pool2d", slot_pool2d, 1e-6, APEX_BF16},
    {"nn_permute", slot_permute, 0, APEX_BF16},
    {"nn_concat", slot_concat, 0, APEX_F16},
    {"nn_reduce", slot_reduce, 1e-6, APEX_F16},
    {"nn_binary broadcast", slot_binary_bcast, 1e-5, APEX_BF16},
    {"nn_unary kinds", slot_unary_kinds, 1e-5, APEX_F16},
    {"mt_flush_unscale", slot_flush_unscale, 0, APEX_BF16},
};

/* One case on one backend: its status, with the results in *r. */
static apex_status run_slot(int c, apex_device dev, const apex_backend *be, result *r) {
  slot_run s = {.dev = dev, .be = be, .r = r};
  apex_status st = slot_cases[c].run(&s);
  for (int i = 0; i < s.nt; i++) apex_tensor_destroy(s.t[i]);
  for (int i = 0; i < s.nmem; i++) free(s.mem[i]);
  return st;
}

static void test_nn_slot_cases(void **state) {
  (void)state;
  for (int c = 0; c < (int)(sizeof slot_cases / sizeof slot_cases[0]); c++) {
    result ref = {0};
    use_isa(APEX_CPU_ISA_PORTABLE);
    apex_status st = run_slot(c, APEX_DEVICE_CPU, &apex__cpu_backend, &ref);
    use_isa(APEX_CPU_ISA_NATIVE);
    if (st != APEX_OK) fail_msg("%s on the reference path: %s", slot_cases[c].name, apex_last_error());
    for (int bi = 0; bi < n_backends; bi++) {
      const backend *b = &backends[bi];
      if (b->device != APEX_DEVICE_CUDA) continue; /* the CPU's other ISAs are the op cases' concern */
      if (!b->present) {
        report(bi, slot_cases[c].dt, "slot", slot_cases[c].name, SKIPPED, b->why);
        continue;
      }
      result got = {0};
      st = run_slot(c, b->device, apex__backend_for(b->device), &got);
      judge(bi, slot_cases[c].dt, "slot", slot_cases[c].name, st, &ref, &got, slot_cases[c].rel);
      result_free(&got);
    }
    result_free(&ref);
  }
}

/* args_nn.h's dgelu on the CPU is the unfused ops' composition bit for bit: the projection's backward with
 * dgelu (gx = the pre-activation's gradient, the previous layer's bias gradient added) followed by the
 * previous layer's plain backward on that gx, against the projection's plain backward, the previous
 * linear_gelu's backward with its GELU (gelu set) and, for gpre itself, the unary slot's GELU backward. Values
 * and pre in dt, gradients in gdt (half gradients, and f32 ones beside half values). */
static void linear_dgelu_composition(apex_dtype dt, apex_dtype gdt) {
  enum { M = 13, C = 11, K = 24, N = 17 };
  const apex_backend *be = &apex__cpu_backend;
  result unused = {0};
  slot_run s = {.dev = APEX_DEVICE_CPU, .be = be, .r = &unused};
  void *x0 = sbuf_as(&s, M * C, 571, dt), *w1 = sbuf_as(&s, K * C, 572, dt), *h = sbuf_as(&s, M * K, 573, dt);
  void *pre = sbuf_in(&s, M * K, 574, dt, -3.0f, 3.0f), *w2 = sbuf_as(&s, N * K, 575, dt), *go = sbuf_as(&s, M * N, 576, gdt);
  /* [0]: unfused, [1]: fused; the accumulated ones preloaded alike */
  void *gmid[2], *gx0[2];
  float *gw2[2], *gb2[2], *gw1[2], *gb1[2];
  for (int i = 0; i < 2; i++) {
    gmid[i] = sbuf_as(&s, M * K, 0, gdt), gx0[i] = sbuf_as(&s, M * C, 0, gdt);
    gw2[i] = sbuf(&s, N * K, 577), gb2[i] = sbuf(&s, N, 578), gw1[i] = sbuf(&s, K * C, 0), gb1[i] = sbuf(&s, K, 579);
  }
  void *gp = sbuf_as(&s, M * K, 0, gdt);
  const apex_nn_linear_bwd_args proj = {.m = M, .n = N, .k = K, .x = {h, dt}, .w = {w2, dt}, .gout = go, .gout_dtype = gdt,
                                        .gx_dtype = gdt, .accumulate_x = 0, .accumulate_w = 1, .accumulate_b = 1, .ws = slot_ws(&s)};
  const apex_nn_linear_bwd_args fc = {.m = M, .n = K, .k = C, .x = {x0, dt}, .w = {w1, dt}, .gout_dtype = gdt, .gx_dtype = gdt,
                                      .accumulate_x = 0, .accumulate_w = 0, .accumulate_b = 1, .pre = {pre, dt}, .ws = slot_ws(&s)};
  apex_nn_linear_bwd_args a = proj;
  a.gx = gmid[0], a.gw = gw2[0], a.gb = gb2[0];
  TU_OK(be->nn_linear_bwd(&a));
  a = fc;
  a.gout = gmid[0], a.gx = gx0[0], a.gw = gw1[0], a.gb = gb1[0], a.gelu = 1;
  TU_OK(be->nn_linear_bwd(&a));
  TU_OK(be->nn_unary_bwd(&(apex_nn_unary_bwd_args){.kind = APEX_NN_GELU_TANH, .n = M * K, .x = {pre, dt}, .gout = gmid[0], .gout_dtype = gdt,
                                                     .gx = gp, .gx_dtype = gdt, .accumulate_x = 0, .ws = slot_ws(&s)}));
  a = proj;
  a.gx = gmid[1], a.gw = gw2[1], a.gb = gb2[1], a.dgelu_pre = (apex_nn_buf){pre, dt}, a.dgelu_gb = gb1[1], a.accumulate_dgelu_gb = 1;
  TU_OK(be->nn_linear_bwd(&a));
  a = fc;
  a.gout = gmid[1], a.gx = gx0[1], a.gw = gw1[1], a.gb = NULL;
  TU_OK(be->nn_linear_bwd(&a));
  const struct {
    const char *what;
    const void *ref, *got;
    size_t bytes;
  } cmp[] = {{"gpre", gp, gmid[1], M * K * apex_dtype_size(gdt)}, {"gw2", gw2[0], gw2[1], N * K * 4}, {"gb2", gb2[0], gb2[1], N * 4},
             {"gx0", gx0[0], gx0[1], M * C * apex_dtype_size(gdt)}, {"gw1", gw1[0], gw1[1], K * C * 4}, {"gb1", gb1[0], gb1[1], K * 4}};
  for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
    if (memcmp(cmp[i].ref, cmp[i].got, cmp[i].bytes))
      fail_msg("nn_linear dgelu (%s values, %s gradients): %s differs from the unfused ops'", apex_dtype_name(dt), apex_dtype_name(gdt),
               cmp[i].what);
  /* and the fusion did something: gx is not the plain product */
  assert_true(memcmp(gmid[0], gmid[1], M * K * apex_dtype_size(gdt)) != 0);
  printf("# nn_linear dgelu, cpu: %s values, %s gradients: the unfused ops' bits\n", apex_dtype_name(dt), apex_dtype_name(gdt));
  for (int i = 0; i < s.nt; i++) apex_tensor_destroy(s.t[i]);
  for (int i = 0; i < s.nmem; i++) free(s.mem[i]);
}

static void test_linear_dgelu_composition(void **state) {
  (void)state;
  linear_dgelu_composition(APEX_F32, APEX_F32);
  linear_dgelu_composition(APEX_F16, APEX_F16);
  linear_dgelu_composition(APEX_BF16, APEX_BF16);
  linear_dgelu_composition(APEX_BF16, APEX_F32);
}

/* Every kernel slot of backend.h by name, for the check that a backend fills them all. */
#define SLOT(name) {#name, offsetof(apex_backend, name)}
static const struct {
  const char *name;
  size_t at;
} backend_slots[] = {
    SLOT(mt_scale),          SLOT(mt_axpby),           SLOT(mt_l2norm),          SLOT(mt_flush_unscale),
    SLOT(optim_step),        SLOT(scaler_update),      SLOT(nn_binary),          SLOT(nn_binary_bwd),
    SLOT(nn_unary),          SLOT(nn_unary_bwd),       SLOT(nn_scale),           SLOT(nn_scale_bwd),
    SLOT(nn_dropout),        SLOT(nn_dropout_bwd),     SLOT(nn_softmax),         SLOT(nn_softmax_bwd),
    SLOT(nn_cross_entropy),  SLOT(nn_cross_entropy_bwd), SLOT(nn_pointwise_loss), SLOT(nn_pointwise_loss_bwd),
    SLOT(nn_batch_norm),     SLOT(nn_batch_norm_bwd),  SLOT(nn_batch_norm_sums), SLOT(nn_batch_norm_dx),
    SLOT(nn_row_norm),       SLOT(nn_row_norm_bwd),    SLOT(nn_reduce),          SLOT(nn_reduce_bwd),
    SLOT(nn_permute),        SLOT(nn_permute_bwd),     SLOT(nn_concat),          SLOT(nn_concat_bwd),
    SLOT(nn_embedding),      SLOT(nn_embedding_bwd),   SLOT(nn_matmul),          SLOT(nn_matmul_bwd),
    SLOT(nn_linear),         SLOT(nn_linear_bwd),      SLOT(nn_attention),       SLOT(nn_attention_bwd),
    SLOT(nn_conv2d),         SLOT(nn_conv2d_bwd),      SLOT(nn_pool2d),          SLOT(nn_pool2d_bwd),
};
#undef SLOT

/* The names of be's NULL kernel slots into list; their count. */
static int null_slots(const apex_backend *be, char *list, size_t size) {
  int missing = 0;
  list[0] = '\0';
  for (size_t i = 0; i < sizeof backend_slots / sizeof backend_slots[0]; i++) {
    void (*fn)(void);
    memcpy(&fn, (const char *)be + backend_slots[i].at, sizeof fn);
    if (fn) continue;
    missing++;
    snprintf(list + strlen(list), size - strlen(list), " %s", backend_slots[i].name);
  }
  return missing;
}

/* backend_slots names every slot of the struct: the pointers after `streams` are the kernel slots, all
 * of one size, so their count is the struct's tail over a pointer's size (a slot added to backend.h and
 * not here fails this). */
static void test_slot_table_complete(void **state) {
  (void)state;
  size_t tail = sizeof(apex_backend) - offsetof(apex_backend, mt_scale);
  assert_int_equal(tail / sizeof(void (*)(void)), sizeof backend_slots / sizeof backend_slots[0]);
}

/* Every slot is filled on the cuda backend: a NULL one fails, naming it. It reads the table only, so it
 * runs in every build with CUDA, GPU or not; a build without CUDA skips it with the reason. */
static void test_cuda_slots_filled(void **state) {
  (void)state;
  const apex_backend *cb = apex__backend_by_name("cuda");
  if (!cb) {
    printf("# cuda slots: skipped, %s\n", apex__device_missing(APEX_DEVICE_CUDA));
    skip();
  }
  char list[1024];
  int missing = null_slots(cb, list, sizeof list);
  printf("# cuda slots: %d of %zu filled%s%s\n", (int)(sizeof backend_slots / sizeof backend_slots[0]) - missing,
         sizeof backend_slots / sizeof backend_slots[0], missing ? "; NULL:" : "", list);
  if (missing) fail_msg("the cuda backend leaves %d slot(s) NULL:%s", missing, list);
}

/* ---- stream and event slots (backend/streams.h) ----------------------------------------------------- */

/* The registry hands out each backend by name without opening its device, the CPU backend has no stream
 * slots, and a backend that has them has every one; its device count agrees with apex_cuda_available
 * (0 with a reason on a machine without a GPU). Runs in every build, GPU or not. */
static void test_stream_slots(void **state) {
  (void)state;
  assert_ptr_equal(apex__backend_by_name("cpu"), apex__backend_for(APEX_DEVICE_CPU));
  assert_null(apex__backend_by_name("cpu")->streams);
  assert_null(apex__backend_by_name("tpu"));
  const apex_backend *cb = apex__backend_by_name("cuda");
  assert_ptr_equal(cb, apex__backend_for(APEX_DEVICE_CUDA)); /* NULL in a build without CUDA */
  if (!cb) {
    printf("# stream slots: no cuda backend in this build (%s)\n", apex__device_missing(APEX_DEVICE_CUDA));
    return;
  }
  const apex_streams *s = cb->streams;
  assert_non_null(s);
  assert_true(s->device_count && s->use_device && s->enter && s->stream_create && s->stream_destroy && s->event_create &&
              s->event_destroy && s->event_record && s->stream_wait && s->event_query);
  const char *why = NULL, *cuda_why = NULL;
  int count = s->device_count(&why);
  int avail = apex_cuda_available(&cuda_why);
  printf("# stream slots: cuda sees %d device%s%s%s\n", count, count == 1 ? "" : "s", count ? "" : ": ", count ? "" : why);
  if (!count) {
    assert_non_null(why);
    assert_true(*why != '\0');
    assert_false(avail);
    TU_FAILS(s->enter("test_stream_slots"), APEX_ERR_UNSUPPORTED, "test_stream_slots");
  } else if (avail) {
    TU_OK(s->enter("test_stream_slots"));
  }
}

/* ---- parity cases (backend_parity_cases.h) ---------------------------------------------------------- */

/* One parity case on every backend whose device is not the CPU. A failed assertion leaves through cmocka,
 * which reports the test failed; so a row is printed only for a run that passed. */
static void test_parity_case(void **state) {
  const parity_case *pc = *state;
  int ran = 0;
  for (int bi = 0; bi < n_backends; bi++) {
    const backend *b = &backends[bi];
    if (b->device == APEX_DEVICE_CPU) continue; /* the CPU computes the references */
    if (!b->present) {
      parity_tally[bi][SKIPPED]++;
      printf("%-16s %-4s %-5s %-24s %-11s %s\n", b->name, "-", "parity", pc->name, outcome_name[SKIPPED], b->why);
      continue;
    }
    /* the references on the CPU's own paths, as the bounds were set */
    use_isa(apex_cpu_native_isa());
    pc_dev = b->device;
    pc->run();
    parity_tally[bi][PASSED]++, ran++;
    printf("%-16s %-4s %-5s %-24s %-11s\n", b->name, "-", "parity", pc->name, outcome_name[PASSED]);
  }
  if (!ran) skip(); /* the rows above say why */
}

/* ---- summary -------------------------------------------------------------------------------------- */

/* The table, the coverage line, and the verdict over every section. */
static void test_summary(void **state) {
  (void)state;
  int failed = 0;
  printf("\n# %-16s %-4s %7s %7s %12s %8s\n", "backend", "type", "passed", "failed", "unsupported", "skipped");
  for (int bi = 0; bi < n_backends; bi++)
    for (int d = 0; d < 3; d++) {
      int *t = tally[bi][d];
      printf("# %-16s %-4s %7d %7d %12d %8d\n", backends[bi].name, apex_dtype_name(dtypes[d]), t[PASSED], t[FAILED], t[UNSUPPORTED], t[SKIPPED]);
      failed += t[FAILED];
    }
  for (int bi = 0; bi < n_backends; bi++) { /* the parity cases: type "-", they span dtypes */
    if (backends[bi].device == APEX_DEVICE_CPU) continue;
    int *t = parity_tally[bi];
    printf("# %-16s %-4s %7d %7d %12d %8d  (parity cases)\n", backends[bi].name, "-", t[PASSED], t[FAILED], t[UNSUPPORTED],
           t[SKIPPED]);
  }
  /* LEAF marks a graph's inputs: there is nothing of its own to compute, so it is not counted. */
  int missing = 0;
  char list[512] = "";
  for (int op = APEX_OP_LEAF + 1; op < APEX_OP_COUNT; op++)
    if (!covered[op]) {
      missing++;
      snprintf(list + strlen(list), sizeof list - strlen(list), " %s", apex_op_name((apex_op)op));
    }
  printf("# coverage: %d of %d ops (APEX_OP_COUNT less leaf) have no case%s%s\n", missing, APEX_OP_COUNT - 1, missing ? ":" : "", list);
  if (failed) fail_msg("%d case runs failed (lines marked failed above)", failed);
}

static int group_setup(void **state) {
  (void)state;
  cases_setup();
  sbn_pg = apex_pg_create_local();
  if (!sbn_pg) return -1;
  setup_backends();
  for (int i = 0; i < n_backends; i++)
    if (backends[i].device == APEX_DEVICE_CUDA && backends[i].present) {
      bn_mean_gpu = on_device(bn_mean, APEX_DEVICE_CUDA);
      bn_var_gpu = on_device(bn_var, APEX_DEVICE_CUDA);
      if (!bn_mean_gpu || !bn_var_gpu) return -1;
    }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  cases_teardown();
  apex_tensor_destroy(bn_mean_gpu);
  apex_tensor_destroy(bn_var_gpu);
  apex_pg_destroy(sbn_pg);
  return 0;
}

int main(void) {
  const struct CMUnitTest sections[] = {
      cmocka_unit_test(test_op_cases),
      cmocka_unit_test(test_multi_tensor_cases),
      cmocka_unit_test(test_optimizer_cases),
      cmocka_unit_test(test_nn_slot_cases),
      cmocka_unit_test(test_linear_dgelu_composition),
      cmocka_unit_test(test_slot_table_complete),
      cmocka_unit_test(test_cuda_slots_filled),
      cmocka_unit_test(test_stream_slots),
  };
  enum { N_SECTIONS = sizeof sections / sizeof sections[0] };
  /* the sections, a test per parity case named after it, and the summary last */
  struct CMUnitTest tests[N_SECTIONS + N_PARITY_CASES + 1];
  int n = 0;
  for (int i = 0; i < N_SECTIONS; i++) tests[n++] = sections[i];
  for (int i = 0; i < N_PARITY_CASES; i++)
    tests[n++] = (struct CMUnitTest){.name = parity_cases[i].name, .test_func = test_parity_case,
                                     .initial_state = (void *)&parity_cases[i]};
  tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_summary);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
