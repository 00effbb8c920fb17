/* test_optim_golden.c: every optimizer against reference trajectories.
 *
 * The expected values are in tests/data/optim_golden.bin, made by tests/gen_optim_golden.py: for
 * SGD, Adam, AdamW, Adadelta, Adagrad and RMSprop by torch.optim (PyTorch 1.13, float64); for AdamP,
 * LAMB, RMSpropTF, NovoGrad and the Apex-only options (SGD wd_after_momentum, Adam without bias
 * correction, Adagrad adagrad_w_mode) by the float64 references in that script, written from the
 * papers and the authors' code, not from apex's kernels. 38 cases, 12 steps each, with learning-rate
 * schedules, two parameter groups, parameters without gradient and a 2^10 loss scale.
 *
 * f32 parameters must stay within 1e-6 (relative to max(|expected|, 0.1)) of the float64 reference at
 * every step. f16/bf16 parameters with master weights must follow the f32 trajectory bit for bit
 * (same inputs rounded to the dtype), the model copies being the masters rounded to nearest even. */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

/* ---- reading the golden file ---- */
typedef struct {
  const uint8_t *p, *end;
} cursor;

static uint32_t rd_u32(cursor *c) {
  uint32_t v;
  assert_true(c->end - c->p >= 4);
  memcpy(&v, c->p, 4);
  c->p += 4;
  return v;
}
static const void *rd_bytes(cursor *c, size_t n) {
  assert_true((size_t)(c->end - c->p) >= n);
  const void *at = c->p;
  c->p += n;
  return at;
}
static void rd_str(cursor *c, char *out, size_t size) {
  uint32_t n = rd_u32(c);
  assert_true(n < size);
  memcpy(out, rd_bytes(c, n), n);
  out[n] = 0;
}

#define MAX_GROUPS 2
#define MAX_TENSORS 3
#define MAX_STEPS 12
/* Relative differences are taken against max(|expected|, FLOOR): parameters start in [-1, 1], and a
 * value that passes near zero carries the absolute rounding error of the larger values it came from. */
#define FLOOR 0.1

typedef struct {
  char name[64], kind[32], opts[MAX_GROUPS][256];
  int ngroups, ntensors, nsteps, group[MAX_TENSORS], ndim[MAX_TENSORS];
  int64_t shape[MAX_TENSORS][4];
  size_t numel[MAX_TENSORS], total;
  float scale;
  const uint8_t *init; /* f32[total]; the arrays are unaligned in the file: read with memcpy */
  struct {
    const uint8_t *lr, *grad, *has, *expect; /* f32[ngroups], f32[total], u8[ntensors], f64[total] */
  } step[MAX_STEPS];
} golden_case;

static void read_case(cursor *c, golden_case *g) {
  memset(g, 0, sizeof *g);
  rd_str(c, g->name, sizeof g->name);
  rd_str(c, g->kind, sizeof g->kind);
  g->ngroups = (int)rd_u32(c);
  assert_true(g->ngroups >= 1 && g->ngroups <= MAX_GROUPS);
  for (int k = 0; k < g->ngroups; k++) rd_str(c, g->opts[k], sizeof g->opts[k]);
  g->ntensors = (int)rd_u32(c);
  assert_true(g->ntensors <= MAX_TENSORS);
  for (int i = 0; i < g->ntensors; i++) {
    g->group[i] = (int)rd_u32(c);
    g->ndim[i] = (int)rd_u32(c);
    assert_true(g->ndim[i] <= 4);
    g->numel[i] = 1;
    for (int d = 0; d < g->ndim[i]; d++) g->numel[i] *= (size_t)(g->shape[i][d] = rd_u32(c));
    g->total += g->numel[i];
  }
  g->nsteps = (int)rd_u32(c);
  assert_true(g->nsteps <= MAX_STEPS);
  memcpy(&g->scale, rd_bytes(c, 4), 4);
  g->init = rd_bytes(c, 4 * g->total);
  for (int t = 0; t < g->nsteps; t++) {
    g->step[t].lr = rd_bytes(c, 4 * (size_t)g->ngroups);
    g->step[t].has = rd_bytes(c, (size_t)g->ntensors);
    g->step[t].grad = rd_bytes(c, 4 * g->total);
    g->step[t].expect = rd_bytes(c, 8 * g->total);
  }
}

static void parse_options(const char *text, apex_optim_options *o) {
  memset(o, 0, sizeof *o);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  for (char *save = NULL, *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(kv, '=');
    assert_non_null(eq);
    *eq = 0;
    TU_OK(apex_optim_options_set(o, kv, strtod(eq + 1, NULL)));
  }
}

/* ---- running a case ---- */

/* Loads n floats (possibly unaligned) into t, rounded to its dtype. */
static void load(apex_tensor *t, const uint8_t *src, size_t n) {
  float *tmp = malloc(n * sizeof *tmp);
  memcpy(tmp, src, n * sizeof *tmp);
  TU_OK(apex_convert(apex_tensor_data(t), apex_tensor_dtype(t), tmp, APEX_F32, n));
  free(tmp);
}

/* Tensors with the case's initial values rounded to `dtype`, but stored as `store` (f32, to run the
 * f32 trajectory of rounded inputs, or the dtype itself). */
typedef struct {
  apex_tensor *p[MAX_TENSORS], *g[MAX_TENSORS];
  apex_optimizer *opt;
} run_state;

static apex_tensor *rounded(const golden_case *gc, int i, const uint8_t *src, apex_dtype dtype, apex_dtype store) {
  apex_tensor *t = apex_tensor_create(dtype, gc->ndim[i], gc->shape[i]);
  load(t, src, gc->numel[i]);
  if (store == dtype) return t;
  apex_tensor *s = apex_tensor_to(t, store);
  apex_tensor_destroy(t);
  return s;
}

static void run_begin(const golden_case *gc, run_state *r, apex_dtype dtype, apex_dtype store) {
  apex_optim_kind kind;
  TU_OK(apex_optim_kind_parse(gc->kind, &kind));
  r->opt = apex_optimizer_create(kind, NULL);
  assert_non_null(r->opt);
  size_t off = 0;
  for (int i = 0; i < gc->ntensors; i++) {
    r->p[i] = rounded(gc, i, gc->init + 4 * off, dtype, store);
    r->g[i] = apex_tensor_create(store, gc->ndim[i], gc->shape[i]);
    off += gc->numel[i];
  }
  for (int k = 0; k < gc->ngroups; k++) {
    apex_tensor *ps[MAX_TENSORS], *gs[MAX_TENSORS];
    int n = 0;
    for (int i = 0; i < gc->ntensors; i++)
      if (gc->group[i] == k) ps[n] = r->p[i], gs[n++] = r->g[i];
    apex_optim_options o;
    parse_options(gc->opts[k], &o);
    TU_OK(apex_optimizer_add_group(r->opt, ps, n, gs, n, &o, NULL));
  }
}

/* Step t: the learning rates, the gradients (rounded to dtype), the step. */
static void run_step(const golden_case *gc, run_state *r, int t, apex_dtype dtype) {
  for (int k = 0; k < gc->ngroups; k++) {
    float lr;
    memcpy(&lr, gc->step[t].lr + 4 * k, 4);
    TU_OK(apex_optimizer_set_lr(r->opt, k, lr));
  }
  int slot[MAX_GROUPS] = {0};
  size_t off = 0;
  for (int i = 0; i < gc->ntensors; i++) {
    apex_tensor *tmp = rounded(gc, i, gc->step[t].grad + 4 * off, dtype, apex_tensor_dtype(r->g[i]));
    TU_OK(apex_tensor_copy(r->g[i], tmp));
    apex_tensor_destroy(tmp);
    int k = gc->group[i];
    TU_OK(apex_optimizer_set_grad(r->opt, k, slot[k]++, gc->step[t].has[i] ? r->g[i] : NULL));
    off += gc->numel[i];
  }
  TU_OK(apex_optimizer_step(r->opt, gc->scale, 0));
}

static void run_end(const golden_case *gc, run_state *r) {
  apex_optimizer_destroy(r->opt);
  for (int i = 0; i < gc->ntensors; i++) {
    apex_tensor_destroy(r->p[i]);
    apex_tensor_destroy(r->g[i]);
  }
}

static uint8_t *golden_file(size_t *size, uint32_t *ncases, cursor *c) {
  uint8_t *data = tu_read_data("optim_golden.bin", size);
  *c = (cursor){data, data + *size};
  assert_memory_equal(rd_bytes(c, 8), "APXOGLD1", 8);
  *ncases = rd_u32(c);
  return data;
}

/* f32 against the float64 reference. */
static void test_f32_trajectories(void **state) {
  (void)state;
  size_t size;
  uint32_t ncases;
  cursor c;
  uint8_t *data = golden_file(&size, &ncases, &c);
  int kinds_seen[APEX_OPTIM_KIND_COUNT] = {0};
  for (uint32_t k = 0; k < ncases; k++) {
    golden_case gc;
    read_case(&c, &gc);
    run_state r;
    run_begin(&gc, &r, APEX_F32, APEX_F32);
    kinds_seen[apex_optimizer_kind(r.opt)]++;
    double worst = 0;
    for (int t = 0; t < gc.nsteps; t++) {
      run_step(&gc, &r, t, APEX_F32);
      size_t off = 0;
      for (int i = 0; i < gc.ntensors; i++) {
        const float *got = apex_tensor_data(r.p[i]);
        for (size_t e = 0; e < gc.numel[i]; e++) {
          double want;
          memcpy(&want, gc.step[t].expect + 8 * (off + e), 8);
          double d = fabs((double)got[e] - want) / fmax(fabs(want), FLOOR);
          if (!(d <= 1e-6))
            fail_msg("%s: step %d, tensor %d, element %zu: %.9g, expected %.9g (relative %.3g)", gc.name, t + 1, i, e,
                     (double)got[e], want, d);
          worst = d > worst ? d : worst;
        }
        off += gc.numel[i];
      }
    }
    print_message("%-34s max relative difference %.2e over %d steps\n", gc.name, worst, gc.nsteps);
    run_end(&gc, &r);
  }
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++)
    if (kinds_seen[k] < 2) fail_msg("only %d golden cases for %s", kinds_seen[k], apex_optim_kind_name((apex_optim_kind)k));
  free(data);
}

/* f16/bf16 parameters and gradients with f32 masters follow the f32 run of the rounded inputs. */
static void check_master_trajectories(apex_dtype dtype) {
  size_t size;
  uint32_t ncases;
  cursor c;
  uint8_t *data = golden_file(&size, &ncases, &c);
  for (uint32_t k = 0; k < ncases; k++) {
    golden_case gc;
    read_case(&c, &gc);
    run_state ref, mixed;
    run_begin(&gc, &ref, dtype, APEX_F32);
    run_begin(&gc, &mixed, dtype, dtype);
    for (int t = 0; t < gc.nsteps; t++) {
      run_step(&gc, &ref, t, dtype);
      run_step(&gc, &mixed, t, dtype);
      int slot[MAX_GROUPS] = {0};
      for (int i = 0; i < gc.ntensors; i++) {
        int grp = gc.group[i];
        apex_tensor *master = apex_optimizer_master(mixed.opt, grp, slot[grp]++);
        assert_int_equal(apex_tensor_dtype(master), APEX_F32);
        const float *want = apex_tensor_data(ref.p[i]), *got = apex_tensor_data(master);
        const uint16_t *model = apex_tensor_data(mixed.p[i]);
        for (size_t e = 0; e < gc.numel[i]; e++) {
          if (tu_bits(got[e]) != tu_bits(want[e]))
            fail_msg("%s (%s): step %d, tensor %d, element %zu: master %.9g, f32 run %.9g", gc.name,
                     apex_dtype_name(dtype), t + 1, i, e, (double)got[e], (double)want[e]);
          uint16_t r = dtype == APEX_F16 ? apex_f32_to_f16(got[e]) : apex_f32_to_bf16(got[e]);
          if (model[e] != r)
            fail_msg("%s (%s): step %d, tensor %d, element %zu: model 0x%04x, master rounded 0x%04x", gc.name,
                     apex_dtype_name(dtype), t + 1, i, e, model[e], r);
        }
      }
    }
    run_end(&gc, &ref);
    run_end(&gc, &mixed);
  }
  free(data);
}

static void test_f16_masters(void **state) {
  (void)state;
  check_master_trajectories(APEX_F16);
}

static void test_bf16_masters(void **state) {
  (void)state;
  check_master_trajectories(APEX_BF16);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32_trajectories),
      cmocka_unit_test(test_f16_masters),
      cmocka_unit_test(test_bf16_masters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
