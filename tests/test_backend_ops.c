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
 * Each op case runs forward and backward (gradient of sum(out * R) for a fixed R) in f32, f16 and
 * bf16; the output and every input gradient are compared, bitwise or within the case's bound
 * (backend_ops_cases.h). One line per case per backend x dtype, then a summary table and a coverage
 * line counting the ops of APEX_OP_COUNT that no case runs. Any failure fails the test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/cpu.h"
#include "apex/cuda.h"
#include "backend/cpu/gemm_onednn.h"
#include "backend_ops_cases.h"
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
 * through oneDNN with the gradient rounded to bf16 (see BF16_ONEDNN_REL). */
static double op_rel(const char *name, apex_dtype dt, const backend *b) {
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

/* Runs case c forward and backward on dev; records the output and the input gradients. On failure
 * returns the status (the message is apex_last_error). *op gets the op of the result. */
static apex_status run_op(const gc_case *c, int ci, apex_dtype dt, apex_device dev, apex_cpu_isa isa, result *r, apex_op *op) {
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
  apex_graph *g = apex_graph_create();
  apex_var *y = c->fn(g, in);
  if (!y) {
    st = apex_last_status();
    apex_graph_destroy(g);
    goto out;
  }
  *op = apex_var_op(y);
  capture(r, "out", apex_var_value(y));
  size_t ny = apex_tensor_numel(apex_var_value(y));
  R = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)ny});
  for (size_t i = 0; i < ny; i++) apex_tensor_set(R, i, (float)sin(0.7 * (double)i + 0.3));
  if ((st = apex_backward(y, &(apex_backward_options){.grad_output = R})) == APEX_OK)
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

static void check_op_case(const gc_case *c, int ci) {
  for (int d = 0; d < 3; d++) {
    apex_dtype dt = dtypes[d];
    result ref = {0};
    apex_op op = APEX_OP_LEAF;
    apex_status st = run_op(c, ci, dt, APEX_DEVICE_CPU, APEX_CPU_ISA_PORTABLE, &ref, &op);
    if (st != APEX_OK) fail_msg("%s %s on the reference path: %s", c->name, apex_dtype_name(dt), apex_last_error());
    covered[op] = 1;
    for (size_t i = 0; i < sizeof case_op / sizeof case_op[0]; i++)
      if (!strcmp(case_op[i].name, c->name)) covered[case_op[i].op] = 1;
    for (int bi = 0; bi < n_backends; bi++) {
      const backend *b = &backends[bi];
      if (!b->present) {
        report(bi, dt, "op", c->name, SKIPPED, "backend absent");
        continue;
      }
      result got = {0};
      apex_op op2;
      st = run_op(c, ci, dt, b->device, b->isa, &got, &op2);
      judge(bi, dt, "op", c->name, st, &ref, &got, op_rel(c->name, dt, b));
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
    if ((st = apex_tensor_flatten(x, MT_N, &flat)) == APEX_OK) st = apex_mt_unscale_flat(flat, 1.0f / 512, &overflow);
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
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  cases_teardown();
  apex_pg_destroy(sbn_pg);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_cases),
      cmocka_unit_test(test_multi_tensor_cases),
      cmocka_unit_test(test_optimizer_cases),
      cmocka_unit_test(test_summary),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
