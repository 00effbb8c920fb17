/* test_optim_api.c: the optimizer object beyond the update rules (those are in test_optim_golden.c):
 * every bad input gets a clear error and changes nothing; a skipped step changes nothing, first step
 * included; save, load, step gives the bits of step; loading refuses mismatches; results do not
 * depend on the thread count or on the SIMD path; parameters without gradient are skipped; groups added later; the
 * learning rate changed between steps; gradient clipping; options and defaults. Expected values here
 * are computed by hand in the test (no golden file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "optim/optim_internal.h"

/* Options that use every state slot of a kind. */
static apex_optim_options full_options(apex_optim_kind kind) {
  apex_optim_options o = {0};
  switch (kind) {
    case APEX_OPTIM_SGD: o.momentum = 0.9f, o.weight_decay = 0.01f; break;
    case APEX_OPTIM_ADAM:
    case APEX_OPTIM_ADAMW: o.amsgrad = APEX_OPTIM_ON, o.weight_decay = 0.01f; break;
    case APEX_OPTIM_ADAGRAD: o.initial_accumulator_value = 0.1f; break;
    case APEX_OPTIM_RMSPROP:
    case APEX_OPTIM_RMSPROP_TF: o.momentum = 0.9f, o.centered = APEX_OPTIM_ON; break;
    default: o.weight_decay = 0.01f; break;
  }
  return o;
}

/* A model: parameters of `dtype` (shapes below), gradients of `gdtype`, random values. */
#define NP 3
typedef struct {
  apex_tensor *p[NP], *g[NP];
  apex_optimizer *opt;
} model;

static void model_init(model *m, apex_optim_kind kind, apex_dtype dtype, apex_dtype gdtype, size_t scale, uint64_t seed) {
  const int64_t shapes[NP][2] = {{4, (int64_t)(5 * scale)}, {(int64_t)(7 * scale), 1}, {3, (int64_t)(4 * scale)}};
  for (int i = 0; i < NP; i++) {
    apex_tensor *flat = tu_random_tensor(dtype, (size_t)(shapes[i][0] * shapes[i][1]), seed + (uint64_t)i, 1.0f);
    m->p[i] = apex_tensor_view(flat, 2, shapes[i]);
    apex_tensor_destroy(flat);
    m->g[i] = apex_tensor_create(gdtype, 2, shapes[i]);
  }
  apex_optim_options o = full_options(kind);
  m->opt = apex_optimizer_create(kind, &o);
  assert_non_null(m->opt);
  TU_OK(apex_optimizer_add_group(m->opt, m->p, NP, m->g, NP, NULL, NULL));
}

static void model_free(model *m) {
  apex_optimizer_destroy(m->opt);
  for (int i = 0; i < NP; i++) {
    apex_tensor_destroy(m->p[i]);
    apex_tensor_destroy(m->g[i]);
  }
}

/* Gradients for step t, the same for every model built with the same shapes. */
static void set_grads(model *m, int t) {
  for (int i = 0; i < NP; i++) {
    apex_tensor *r = tu_random_tensor(APEX_F32, apex_tensor_numel(m->g[i]), 1000 + 17 * (uint64_t)t + (uint64_t)i, 0.5f);
    TU_OK(apex_tensor_copy(m->g[i], r));
    apex_tensor_destroy(r);
  }
}

static void *state_bytes(const apex_optimizer *opt, size_t *size) {
  TU_OK(apex_optimizer_state_size(opt, size));
  void *buf = malloc(*size);
  TU_OK(apex_optimizer_save(opt, buf, *size, NULL));
  return buf;
}

/* Everything a step may change: the saved state and the parameters' bytes. */
typedef struct {
  void *state, *params[NP];
  size_t size;
} snapshot;

static snapshot snap(const model *m) {
  snapshot s;
  s.state = state_bytes(m->opt, &s.size);
  for (int i = 0; i < NP; i++) {
    s.params[i] = malloc(apex_tensor_nbytes(m->p[i]));
    memcpy(s.params[i], apex_tensor_data(m->p[i]), apex_tensor_nbytes(m->p[i]));
  }
  return s;
}

static void snap_free(snapshot *s) {
  free(s->state);
  for (int i = 0; i < NP; i++) free(s->params[i]);
}

static void assert_model_is(const model *m, const snapshot *s, const char *what) {
  snapshot now = snap(m);
  if (now.size != s->size || memcmp(now.state, s->state, s->size)) fail_msg("%s: the optimizer state differs", what);
  for (int i = 0; i < NP; i++)
    if (memcmp(now.params[i], s->params[i], apex_tensor_nbytes(m->p[i])))
      fail_msg("%s: parameter %d differs", what, i);
  snap_free(&now);
}

static const apex_dtype DTYPES[] = {APEX_F32, APEX_BF16, APEX_F16};

/* ---- skipped steps ---- */

static void test_skipped_step_changes_nothing(void **state) {
  (void)state;
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++)
    for (int d = 0; d < 3; d++) {
      char what[96];
      snprintf(what, sizeof what, "%s/%s", apex_optim_kind_name((apex_optim_kind)k), apex_dtype_name(DTYPES[d]));
      model m, twin;
      model_init(&m, (apex_optim_kind)k, DTYPES[d], DTYPES[d], 1, 7);
      model_init(&twin, (apex_optim_kind)k, DTYPES[d], DTYPES[d], 1, 7);
      /* A skipped first step, with gradients full of Inf and NaN. */
      for (int i = 0; i < NP; i++) TU_OK(apex_tensor_fill(m.g[i], i ? NAN : INFINITY));
      snapshot before = snap(&m);
      TU_OK(apex_optimizer_step(m.opt, 65536.0f, 1));
      assert_model_is(&m, &before, what);
      assert_int_equal(apex_optimizer_step_count(m.opt, 0, 0), 0);
      snap_free(&before);
      /* Then real steps, with a skipped one between, follow the twin that never skipped. */
      for (int t = 0; t < 3; t++) {
        set_grads(&m, t);
        set_grads(&twin, t);
        TU_OK(apex_optimizer_step(m.opt, 1.0f, 0));
        TU_OK(apex_optimizer_step(twin.opt, 1.0f, 0));
        snapshot s = snap(&m);
        set_grads(&m, 99);
        TU_OK(apex_optimizer_step(m.opt, 1.0f, 1));
        assert_model_is(&m, &s, what);
        snap_free(&s);
      }
      snapshot a = snap(&m);
      assert_model_is(&twin, &a, what);
      assert_int_equal(apex_optimizer_step_count(m.opt, 0, 2), 3);
      snap_free(&a);
      model_free(&m);
      model_free(&twin);
    }
}

/* ---- save and load ---- */

static void test_save_load_step_is_step(void **state) {
  (void)state;
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++)
    for (int d = 0; d < 3; d++)
      for (int via_file = 0; via_file < 2; via_file++) {
        char what[96];
        snprintf(what, sizeof what, "%s/%s%s", apex_optim_kind_name((apex_optim_kind)k), apex_dtype_name(DTYPES[d]),
                 via_file ? " (FILE*)" : "");
        model a, b;
        model_init(&a, (apex_optim_kind)k, DTYPES[d], APEX_F32, 1, 11);
        model_init(&b, (apex_optim_kind)k, DTYPES[d], APEX_F32, 1, 12); /* other values: load must fix them */
        TU_OK(apex_optimizer_set_lr(a.opt, 0, 0.003f));
        for (int t = 0; t < 3; t++) {
          set_grads(&a, t);
          TU_OK(apex_optimizer_step(a.opt, 1.0f, 0));
        }
        /* f32 parameters are the model's, not optimizer state: the program restores them itself. */
        for (int i = 0; i < NP; i++)
          if (DTYPES[d] == APEX_F32) TU_OK(apex_tensor_copy(b.p[i], a.p[i]));
        if (via_file) {
          FILE *f = tmpfile();
          assert_non_null(f);
          TU_OK(apex_optimizer_save_file(a.opt, f));
          rewind(f);
          TU_OK(apex_optimizer_load_file(b.opt, f));
          fclose(f);
        } else {
          size_t size;
          void *buf = state_bytes(a.opt, &size);
          TU_OK(apex_optimizer_load(b.opt, buf, size));
          free(buf);
        }
        assert_true(apex_optimizer_get_lr(b.opt, 0) == 0.003f);
        snapshot sa = snap(&a);
        assert_model_is(&b, &sa, what);
        snap_free(&sa);
        for (int t = 3; t < 5; t++) {
          set_grads(&a, t);
          set_grads(&b, t);
          TU_OK(apex_optimizer_step(a.opt, 1.0f, 0));
          TU_OK(apex_optimizer_step(b.opt, 1.0f, 0));
        }
        sa = snap(&a);
        assert_model_is(&b, &sa, what);
        snap_free(&sa);
        model_free(&a);
        model_free(&b);
      }
}

/* Loads buf into m and checks it fails with status and needle, changing nothing. */
static void assert_load_refused(model *m, const void *buf, size_t size, apex_status status, const char *needle) {
  snapshot before = snap(m);
  TU_FAILS(apex_optimizer_load(m->opt, buf, size), status, needle);
  assert_model_is(m, &before, needle);
  snap_free(&before);
}

static void test_load_refuses_mismatches(void **state) {
  (void)state;
  model a;
  model_init(&a, APEX_OPTIM_ADAM, APEX_BF16, APEX_F32, 1, 3);
  set_grads(&a, 0);
  TU_OK(apex_optimizer_step(a.opt, 1.0f, 0));
  size_t size;
  uint8_t *buf = state_bytes(a.opt, &size);

  model b; /* same layout, other values: the target of every refused load */
  model_init(&b, APEX_OPTIM_ADAM, APEX_BF16, APEX_F32, 1, 4);
  TU_OK(apex_optimizer_load(b.opt, buf, size)); /* the good case */
  set_grads(&b, 1);
  TU_OK(apex_optimizer_step(b.opt, 1.0f, 0));

  model other;
  model_init(&other, APEX_OPTIM_SGD, APEX_BF16, APEX_F32, 1, 4);
  assert_load_refused(&other, buf, size, APEX_ERR_STATE, "the state is from an adam optimizer, this one is sgd");
  model_free(&other);
  model_init(&other, APEX_OPTIM_ADAM, APEX_F32, APEX_F32, 1, 4);
  assert_load_refused(&other, buf, size, APEX_ERR_DTYPE, "parameter 0 was saved as bf16 but is f32");
  model_free(&other);
  model_init(&other, APEX_OPTIM_ADAM, APEX_BF16, APEX_F32, 2, 4);
  assert_load_refused(&other, buf, size, APEX_ERR_SHAPE, "parameter 0 was saved with shape [4, 5] but has shape [4, 10]");
  model_free(&other);

  /* Fewer parameters in the group, or another group count. */
  apex_optimizer *small = apex_optimizer_create(APEX_OPTIM_ADAM, NULL);
  TU_OK(apex_optimizer_add_group(small, b.p, 2, b.g, 2, &(apex_optim_options){.amsgrad = APEX_OPTIM_ON}, NULL));
  TU_FAILS(apex_optimizer_load(small, buf, size), APEX_ERR_STATE, "group 0 was saved with 3 parameters but has 2");
  TU_OK(apex_optimizer_add_group(small, b.p + 2, 1, b.g + 2, 1, NULL, NULL));
  TU_FAILS(apex_optimizer_load(small, buf, size), APEX_ERR_STATE, "the state has 1 parameter groups, the optimizer 2");
  apex_optimizer_destroy(small);
  /* Another state layout (amsgrad off: two state tensors instead of three). */
  apex_optimizer *plain = apex_optimizer_create(APEX_OPTIM_ADAM, NULL);
  TU_OK(apex_optimizer_add_group(plain, b.p, NP, b.g, NP, NULL, NULL));
  TU_FAILS(apex_optimizer_load(plain, buf, size), APEX_ERR_STATE, "saved with 3 state tensors per parameter but has 2");
  apex_optimizer_destroy(plain);

  /* Corruption: a flipped byte, a truncation, garbage. */
  buf[size / 2] ^= 0x10;
  assert_load_refused(&b, buf, size, APEX_ERR_CORRUPT, "hash mismatch");
  buf[size / 2] ^= 0x10;
  assert_load_refused(&b, buf, size - 9, APEX_ERR_CORRUPT, "bytes long but");
  assert_load_refused(&b, buf, 20, APEX_ERR_CORRUPT, "truncated");
  assert_load_refused(&b, "definitely not a state, just text here....", 40, APEX_ERR_CORRUPT, "bad magic");
  TU_FAILS(apex_optimizer_save(a.opt, buf, size - 1, NULL), APEX_ERR_INVALID_ARG, "the state needs");
  free(buf);
  model_free(&a);
  model_free(&b);
}

/* A tensor of dtype and shape [d0, d1] with tu_random_tensor's values. */
static apex_tensor *random_2d(apex_dtype dtype, int64_t d0, int64_t d1, uint64_t seed) {
  const int64_t shape[2] = {d0, d1};
  apex_tensor *flat = tu_random_tensor(dtype, (size_t)(d0 * d1), seed, 1.0f);
  apex_tensor *t = apex_tensor_view(flat, 2, shape);
  apex_tensor_destroy(flat);
  return t;
}

/* An Adam optimizer (amsgrad) over params, split into groups of the sizes given (0-terminated). */
static apex_optimizer *adam_over(apex_tensor **params, const int *sizes) {
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAM, &(apex_optim_options){.amsgrad = APEX_OPTIM_ON});
  assert_non_null(opt);
  for (int at = 0; *sizes; at += *sizes++) TU_OK(apex_optimizer_add_group(opt, params + at, *sizes, NULL, 0, NULL, NULL));
  return opt;
}

/* Loads buf into opt and checks it fails with status and needle, the optimizer's state unchanged. */
static void assert_opt_load_refused(apex_optimizer *opt, const void *buf, size_t size, apex_status status,
                                    const char *needle) {
  size_t before_size, after_size;
  void *before = state_bytes(opt, &before_size);
  TU_FAILS(apex_optimizer_load(opt, buf, size), status, needle);
  void *after = state_bytes(opt, &after_size);
  if (after_size != before_size || memcmp(after, before, before_size)) fail_msg("%s: the state changed", needle);
  free(before);
  free(after);
}

/* The refusal names the first mismatch, wherever it is: a later parameter, a later group, and not a
 * later mismatch of the same load. */
static void test_load_names_first_mismatch(void **state) {
  (void)state;
  /* Saved: bf16 [4, 5], bf16 [7, 1], bf16 [3, 4], f32 [2, 2], after one step with gradients. */
  apex_tensor *saved[4] = {random_2d(APEX_BF16, 4, 5, 1), random_2d(APEX_BF16, 7, 1, 2), random_2d(APEX_BF16, 3, 4, 3),
                           random_2d(APEX_F32, 2, 2, 4)};
  apex_tensor *grads[4];
  for (int i = 0; i < 4; i++) grads[i] = random_2d(APEX_F32, apex_tensor_dim(saved[i], 0), apex_tensor_dim(saved[i], 1), 10 + (uint64_t)i);
  const int one_group[] = {4, 0}, two_groups[] = {2, 2, 0};
  size_t size1, size2;
  apex_optimizer *src = adam_over(saved, one_group);
  for (int i = 0; i < 4; i++) TU_OK(apex_optimizer_set_grad(src, 0, i, grads[i]));
  TU_OK(apex_optimizer_step(src, 1.0f, 0));
  void *buf1 = state_bytes(src, &size1);
  apex_optimizer_destroy(src);
  src = adam_over(saved, two_groups);
  void *buf2 = state_bytes(src, &size2);
  apex_optimizer_destroy(src);

  /* Parameter 0 matches; parameter 1 has another shape and parameter 2 another dtype: the message
   * names parameter 1. With parameter 1 fixed, it names parameter 2. */
  apex_tensor *p[4] = {random_2d(APEX_BF16, 4, 5, 5), random_2d(APEX_BF16, 7, 2, 6), random_2d(APEX_F16, 3, 4, 7),
                       random_2d(APEX_F32, 2, 2, 8)};
  apex_optimizer *dst = adam_over(p, one_group);
  assert_opt_load_refused(dst, buf1, size1, APEX_ERR_SHAPE,
                          "group 0, parameter 1 was saved with shape [7, 1] but has shape [7, 2]");
  apex_optimizer_destroy(dst);
  apex_tensor *p1 = p[1];
  p[1] = random_2d(APEX_BF16, 7, 1, 9);
  dst = adam_over(p, one_group);
  assert_opt_load_refused(dst, buf1, size1, APEX_ERR_DTYPE, "group 0, parameter 2 was saved as bf16 but is f16");
  apex_optimizer_destroy(dst);
  /* The last parameter alone differs: another dtype, then another rank. */
  apex_tensor *p2 = p[2], *p3 = p[3];
  p[2] = random_2d(APEX_BF16, 3, 4, 11);
  p[3] = random_2d(APEX_BF16, 2, 2, 12);
  dst = adam_over(p, one_group);
  assert_opt_load_refused(dst, buf1, size1, APEX_ERR_DTYPE, "group 0, parameter 3 was saved as f32 but is bf16");
  apex_optimizer_destroy(dst);
  apex_tensor_destroy(p[3]);
  const int64_t four = 4;
  p[3] = apex_tensor_create(APEX_F32, 1, &four);
  dst = adam_over(p, one_group);
  assert_opt_load_refused(dst, buf1, size1, APEX_ERR_SHAPE, "group 0, parameter 3 was saved with shape [2, 2] but has shape [4]");
  apex_optimizer_destroy(dst);

  /* Two groups: the first group's count differs ({1, 3} against the saved {2, 2}), or only the second
   * group's last parameter. */
  const int other_split[] = {1, 3, 0};
  dst = adam_over(p, other_split);
  assert_opt_load_refused(dst, buf2, size2, APEX_ERR_STATE, "group 0 was saved with 2 parameters but has 1");
  apex_optimizer_destroy(dst);
  dst = adam_over(p, two_groups);
  assert_opt_load_refused(dst, buf2, size2, APEX_ERR_SHAPE, "group 1, parameter 1 was saved with shape [2, 2] but has shape [4]");
  apex_optimizer_destroy(dst);
  /* With every parameter matching, both load; the loaded step counts are the saved ones. */
  apex_tensor_destroy(p[3]);
  p[3] = random_2d(APEX_F32, 2, 2, 13);
  dst = adam_over(p, one_group);
  TU_OK(apex_optimizer_load(dst, buf1, size1));
  for (int i = 0; i < 4; i++) assert_int_equal(apex_optimizer_step_count(dst, 0, i), 1);
  apex_optimizer_destroy(dst);
  dst = adam_over(p, two_groups);
  TU_OK(apex_optimizer_load(dst, buf2, size2));
  apex_optimizer_destroy(dst);

  free(buf1);
  free(buf2);
  apex_tensor_destroy(p1);
  apex_tensor_destroy(p2);
  apex_tensor_destroy(p3);
  for (int i = 0; i < 4; i++) {
    apex_tensor_destroy(p[i]);
    apex_tensor_destroy(saved[i]);
    apex_tensor_destroy(grads[i]);
  }
}

/* ---- threads ---- */

static void test_thread_count_independent(void **state) {
  (void)state;
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++)
    for (int d = 0; d < 2; d++) {
      model m[2];
      for (int r = 0; r < 2; r++) {
        TU_OK(apex_set_num_threads(r + 1));
        /* 40000-element rows: tensors of several chunks; bf16 gradients on the bf16 run. */
        model_init(&m[r], (apex_optim_kind)k, DTYPES[d], DTYPES[d], 40000, 5);
        for (int t = 0; t < 3; t++) {
          set_grads(&m[r], t);
          TU_OK(apex_optimizer_clip_grad_norm(m[r].opt, 50.0f, 1.0f, NULL));
          TU_OK(apex_optimizer_step(m[r].opt, 2.0f, 0));
        }
      }
      snapshot s = snap(&m[0]);
      char what[64];
      snprintf(what, sizeof what, "%s/%s, 1 vs 2 threads", apex_optim_kind_name((apex_optim_kind)k), apex_dtype_name(DTYPES[d]));
      assert_model_is(&m[1], &s, what);
      snap_free(&s);
      model_free(&m[0]);
      model_free(&m[1]);
    }
  TU_OK(apex_set_num_threads(2));
}

/* ---- SIMD paths ---- */

/* Every kind's tile kernel is compiled for the baseline, AVX2 and AVX-512 (simd_kernel.h); every copy
 * this CPU runs must give the portable copy's bits, state included. Odd sizes put tails in every tile
 * loop. */
static void test_simd_paths_agree(void **state) {
  (void)state;
  apex_cpu_isa levels[3];
  int nl = tu_kernel_isa_levels(levels);
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++)
    for (int d = 0; d < 3; d++) {
      model m[3];
      for (int r = 0; r < nl; r++) {
        TU_OK(apex_cpu_set_max_isa(levels[r]));
        model_init(&m[r], (apex_optim_kind)k, DTYPES[d], DTYPES[d], 333, 11);
        for (int t = 0; t < 4; t++) {
          set_grads(&m[r], t);
          TU_OK(apex_optimizer_clip_grad_norm(m[r].opt, 30.0f, 1.0f, NULL));
          TU_OK(apex_optimizer_step(m[r].opt, 4.0f, 0));
        }
      }
      snapshot s = snap(&m[0]);
      for (int r = 1; r < nl; r++) {
        char what[64];
        snprintf(what, sizeof what, "%s/%s, portable vs %s", apex_optim_kind_name((apex_optim_kind)k),
                 apex_dtype_name(DTYPES[d]), apex_cpu_isa_name(levels[r]));
        assert_model_is(&m[r], &s, what);
      }
      snap_free(&s);
      for (int r = 0; r < nl; r++) model_free(&m[r]);
    }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

/* O2: Adam writes a bf16 model copy in the same pass as the master's update (optim_adam.c), the other
 * kinds and f16 copies through the launch. Either way each model copy must be exactly the master
 * rounded by the scalar reference (apex_f32_to_bf16 / apex_f32_to_f16), NaN included, and masters and
 * copies must have the same bits at every ISA level and thread count. */
static void test_master_copies(void **state) {
  (void)state;
  const apex_optim_kind kinds[4] = {APEX_OPTIM_ADAM, APEX_OPTIM_ADAMW, APEX_OPTIM_SGD, APEX_OPTIM_LAMB};
  apex_cpu_isa levels[3];
  int nl = tu_kernel_isa_levels(levels);
  apex_set_threads_follow_load(0); /* exactly 1, 2 and 3 threads, whatever else runs */
  for (int k = 0; k < 4; k++) {
    uint8_t *first[NP] = {0}, *first_master[NP] = {0};
    for (int r = 0; r < nl; r++)
      for (int th = 1; th <= 3; th++) {
        TU_OK(apex_cpu_set_max_isa(levels[r]));
        TU_OK(apex_set_num_threads(th));
        model m;
        /* Tensors of 20000+ elements: several tiles and chunks, with tails. */
        model_init(&m, kinds[k], APEX_F32, APEX_F32, 5003, 77);
        const apex_dtype cast_to[NP] = {APEX_BF16, APEX_F16, APEX_BF16};
        for (int i = 0; i < NP; i++) {
          apex_tensor *cast = apex_tensor_to(m.p[i], cast_to[i]);
          apex_tensor *g = apex_tensor_create(APEX_F32, apex_tensor_ndim(cast), apex_tensor_shape(cast));
          TU_OK(apex_optimizer_replace_param(m.opt, 0, i, cast, g, 1));
          apex_tensor_destroy(m.p[i]);
          apex_tensor_destroy(m.g[i]);
          m.p[i] = cast, m.g[i] = g;
        }
        for (int t = 0; t < 3; t++) {
          set_grads(&m, t);
          apex_tensor_set(m.g[2], 11, NAN); /* a NaN master: the copy keeps a quiet NaN */
          apex_tensor_set(m.g[0], 5, 3e38f);
          TU_OK(apex_optimizer_step(m.opt, 1.0f, 0));
        }
        for (int i = 0; i < NP; i++) {
          const apex_tensor *master = apex_optimizer_master(m.opt, 0, i);
          const float *mw = apex_tensor_data(master);
          const uint16_t *h = apex_tensor_data(m.p[i]);
          size_t n = apex_tensor_numel(m.p[i]);
          for (size_t e = 0; e < n; e++) {
            uint16_t want = cast_to[i] == APEX_BF16 ? apex_f32_to_bf16(mw[e]) : apex_f32_to_f16(mw[e]);
            if (h[e] != want)
              fail_msg("%s, %s copy %d element %zu at %s, %d threads: 0x%04x, master rounds to 0x%04x",
                       apex_optim_kind_name(kinds[k]), apex_dtype_name(cast_to[i]), i, e, apex_cpu_isa_name(levels[r]), th,
                       h[e], want);
          }
          assert_true(isnan(mw[11]) == (i == 2));
          if (!first[i]) {
            first[i] = malloc(apex_tensor_nbytes(m.p[i]));
            first_master[i] = malloc(apex_tensor_nbytes(master));
            memcpy(first[i], h, apex_tensor_nbytes(m.p[i]));
            memcpy(first_master[i], mw, apex_tensor_nbytes(master));
          } else {
            assert_memory_equal(first[i], h, apex_tensor_nbytes(m.p[i]));
            assert_memory_equal(first_master[i], mw, apex_tensor_nbytes(master));
          }
        }
        model_free(&m);
      }
    for (int i = 0; i < NP; i++) free(first[i]), free(first_master[i]);
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  TU_OK(apex_set_num_threads(2));
  apex_set_threads_follow_load(1);
}

/* Adam reads bf16 gradients as stored and widens them in registers (optim_adam.c). Widening is exact,
 * so a step from bf16 gradients must give the bits of a step from f32 gradients holding the same
 * values, for f32 parameters and for bf16 parameters behind f32 masters, at every ISA level. */
static void test_adam_bf16_grads(void **state) {
  (void)state;
  const apex_optim_kind kinds[2] = {APEX_OPTIM_ADAM, APEX_OPTIM_ADAMW}; /* amsgrad off and on */
  apex_cpu_isa levels[3];
  int nl = tu_kernel_isa_levels(levels);
  for (int r = 0; r < nl; r++)
    for (int k = 0; k < 2; k++)
      for (int masters = 0; masters < 2; masters++) {
        TU_OK(apex_cpu_set_max_isa(levels[r]));
        model mb, mf;
        model_init(&mb, kinds[k], APEX_F32, APEX_BF16, 2001, 5);
        model_init(&mf, kinds[k], APEX_F32, APEX_F32, 2001, 5);
        if (masters)
          for (int i = 0; i < NP; i++) {
            model *both[2] = {&mb, &mf};
            for (int w = 0; w < 2; w++) {
              model *m = both[w];
              apex_tensor *cast = apex_tensor_to(m->p[i], APEX_BF16);
              TU_OK(apex_optimizer_replace_param(m->opt, 0, i, cast, m->g[i], 1));
              apex_tensor_destroy(m->p[i]);
              m->p[i] = cast;
            }
          }
        for (int t = 0; t < 3; t++) {
          set_grads(&mb, t);
          for (int i = 0; i < NP; i++) TU_OK(apex_tensor_copy(mf.g[i], mb.g[i])); /* the same values, exactly */
          TU_OK(apex_optimizer_step(mb.opt, 2.0f, 0));
          TU_OK(apex_optimizer_step(mf.opt, 2.0f, 0));
        }
        snapshot s = snap(&mf);
        char what[96];
        snprintf(what, sizeof what, "%s, bf16 vs f32 gradients%s at %s", apex_optim_kind_name(kinds[k]),
                 masters ? " behind masters" : "", apex_cpu_isa_name(levels[r]));
        assert_model_is(&mb, &s, what);
        snap_free(&s);
        model_free(&mb);
        model_free(&mf);
      }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

/* LAMB runs its two stages batch by batch, keeping u in a scratch buffer between them, and
 * recomputes u for a tensor larger than a batch (lamb.c). Any batch size gives the same bits: every
 * tensor batched (the default here), some alone and recomputed, all recomputed. */
static void test_lamb_batches_agree(void **state) {
  (void)state;
  const size_t sizes[3] = {(size_t)1 << 20, 4000, 1};
  for (int d = 0; d < 3; d++) {
    model m[3];
    for (int r = 0; r < 3; r++) {
      size_t old = apex__lamb_set_batch_params(sizes[r]);
      model_init(&m[r], APEX_OPTIM_LAMB, DTYPES[d], DTYPES[d], 333, 13); /* 6660, 2331 and 3996 elements: at 4000, two batched alone and one recomputed */
      for (int t = 0; t < 3; t++) {
        set_grads(&m[r], t);
        TU_OK(apex_optimizer_step(m[r].opt, 2.0f, 0));
      }
      apex__lamb_set_batch_params(old);
    }
    snapshot s = snap(&m[0]);
    char what[64];
    for (int r = 1; r < 3; r++) {
      snprintf(what, sizeof what, "LAMB/%s, batches of %zu", apex_dtype_name(DTYPES[d]), sizes[r]);
      assert_model_is(&m[r], &s, what);
    }
    snap_free(&s);
    for (int r = 0; r < 3; r++) model_free(&m[r]);
  }
}

/* ---- parameters without gradient, groups, learning rate ---- */

static void test_missing_grad_is_skipped(void **state) {
  (void)state;
  for (int k = 0; k < APEX_OPTIM_KIND_COUNT; k++) {
    model m;
    model_init(&m, (apex_optim_kind)k, APEX_BF16, APEX_F32, 1, 9);
    set_grads(&m, 0);
    TU_OK(apex_optimizer_step(m.opt, 1.0f, 0));
    void *p1 = malloc(apex_tensor_nbytes(m.p[1]));
    memcpy(p1, apex_tensor_data(m.p[1]), apex_tensor_nbytes(m.p[1]));
    apex_tensor *master1 = apex_tensor_clone(apex_optimizer_master(m.opt, 0, 1));
    TU_OK(apex_optimizer_set_grad(m.opt, 0, 1, NULL));
    set_grads(&m, 1);
    TU_OK(apex_optimizer_step(m.opt, 1.0f, 0));
    assert_memory_equal(apex_tensor_data(m.p[1]), p1, apex_tensor_nbytes(m.p[1]));
    assert_memory_equal(apex_tensor_data(apex_optimizer_master(m.opt, 0, 1)), apex_tensor_data(master1),
                        apex_tensor_nbytes(master1));
    assert_int_equal(apex_optimizer_step_count(m.opt, 0, 0), 2);
    assert_int_equal(apex_optimizer_step_count(m.opt, 0, 1), 1);
    free(p1);
    apex_tensor_destroy(master1);
    model_free(&m);
  }
}

static void test_groups_and_lr(void **state) {
  (void)state;
  /* Plain SGD: p -= lr * g / scale, easy to check by hand. */
  int64_t n = 6;
  apex_tensor *p0 = apex_tensor_create(APEX_F32, 1, &n), *g0 = apex_tensor_create(APEX_F32, 1, &n);
  apex_tensor *p1 = apex_tensor_create(APEX_F16, 1, &n), *g1 = apex_tensor_create(APEX_BF16, 1, &n);
  TU_OK(apex_tensor_fill(p0, 1.0f));
  TU_OK(apex_tensor_fill(g0, 4.0f));
  TU_OK(apex_tensor_fill(p1, 2.0f));
  TU_OK(apex_tensor_fill(g1, 8.0f));
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 0.25f});
  int group = -1;
  TU_OK(apex_optimizer_add_group(opt, &p0, 1, &g0, 1, NULL, &group));
  assert_int_equal(group, 0);
  TU_OK(apex_optimizer_step(opt, 2.0f, 0)); /* 1 - 0.25 * 4 / 2 */
  assert_true(apex_tensor_get(p0, 0) == 0.5f);
  /* A group added after steps, with its own lr; the master of an f16 parameter is f32. */
  TU_OK(apex_optimizer_add_group(opt, &p1, 1, &g1, 1, &(apex_optim_options){.lr = 0.125f}, &group));
  assert_int_equal(group, 1);
  assert_int_equal(apex_optimizer_num_groups(opt), 2);
  assert_int_equal(apex_optimizer_group_size(opt, 1), 1);
  assert_int_equal(apex_tensor_dtype(apex_optimizer_master(opt, 1, 0)), APEX_F32);
  assert_ptr_equal(apex_optimizer_master(opt, 0, 0), p0);
  TU_OK(apex_optimizer_step(opt, 2.0f, 0));
  assert_true(apex_tensor_get(p0, 0) == 0.0f);  /* 0.5 - 0.25 * 2 */
  assert_true(apex_tensor_get(p1, 0) == 1.5f);  /* 2 - 0.125 * 4 */
  /* lr changed between steps, including an explicit zero. */
  TU_OK(apex_optimizer_set_lr(opt, 0, 0.0f));
  TU_OK(apex_optimizer_set_lr(opt, 1, 0.5f));
  assert_true(apex_optimizer_get_lr(opt, 1) == 0.5f);
  TU_OK(apex_optimizer_step(opt, 2.0f, 0));
  assert_true(apex_tensor_get(p0, 0) == 0.0f);
  assert_true(apex_tensor_get(p1, 0) == -0.5f);
  assert_true(apex_tensor_get(apex_optimizer_master(opt, 1, 0), 5) == -0.5f);
  apex_optimizer_destroy(opt);
  apex_tensor_destroy(p0);
  apex_tensor_destroy(g0);
  apex_tensor_destroy(p1);
  apex_tensor_destroy(g1);
}

/* amp O2/O3: the model is cast after the optimizer was built. */
static void test_replace_param(void **state) {
  (void)state;
  model m;
  model_init(&m, APEX_OPTIM_ADAMW, APEX_F32, APEX_F32, 1, 31);
  apex_tensor *old = m.p[0], *cast = apex_tensor_to(old, APEX_BF16), *cast3 = apex_tensor_to(m.p[2], APEX_F16);
  apex_tensor *g16 = apex_tensor_create(APEX_BF16, apex_tensor_ndim(old), apex_tensor_shape(old));
  assert_ptr_equal(apex_optimizer_param(m.opt, 0, 0), old);
  TU_OK(apex_optimizer_replace_param(m.opt, 0, 0, cast, g16, 1));
  TU_OK(apex_optimizer_replace_param(m.opt, 0, 2, cast3, m.g[2], 0)); /* O3: no master */
  assert_ptr_equal(apex_optimizer_param(m.opt, 0, 0), cast);
  apex_tensor *master = apex_optimizer_master(m.opt, 0, 0);
  assert_int_equal(apex_tensor_dtype(master), APEX_F32);
  assert_memory_equal(apex_tensor_data(master), apex_tensor_data(old), apex_tensor_nbytes(old)); /* exact f32 values */
  assert_ptr_equal(apex_optimizer_master(m.opt, 0, 2), cast3);
  TU_FAILS(apex_optimizer_replace_param(m.opt, 0, 1, cast, NULL, 1), APEX_ERR_INVALID_ARG, "already in group 0");
  TU_FAILS(apex_optimizer_replace_param(m.opt, 0, 1, m.g[0], NULL, 1), APEX_ERR_SHAPE, "the new parameter has shape [4, 5], the old [7, 1]");
  m.p[0] = cast;
  apex_tensor_destroy(m.g[0]);
  m.g[0] = g16;
  apex_tensor *old2 = m.p[2];
  m.p[2] = cast3;
  float before3 = apex_tensor_get(cast3, 0);
  for (int t = 0; t < 2; t++) {
    set_grads(&m, t);
    TU_OK(apex_optimizer_step(m.opt, 1.0f, 0));
  }
  const float *mw = apex_tensor_data(master);
  const uint16_t *bf = apex_tensor_data(cast);
  for (size_t e = 0; e < apex_tensor_numel(cast); e++) assert_int_equal(bf[e], apex_f32_to_bf16(mw[e]));
  assert_true(apex_tensor_get(cast3, 0) != before3); /* updated in place, in f16 */
  /* A state with a master does not load where the parameter has none. */
  size_t size;
  void *buf = state_bytes(m.opt, &size);
  TU_OK(apex_optimizer_replace_param(m.opt, 0, 0, cast, g16, 0));
  TU_FAILS(apex_optimizer_load(m.opt, buf, size), APEX_ERR_STATE, "parameter 0 was saved with f32 master weights");
  free(buf);
  apex_tensor_destroy(old);
  apex_tensor_destroy(old2);
  model_free(&m);
}

/* ---- clipping ---- */

static void test_clip_grad_norm(void **state) {
  (void)state;
  int64_t n = 4;
  apex_tensor *p[2] = {apex_tensor_create(APEX_F32, 1, &n), apex_tensor_create(APEX_BF16, 1, &n)};
  apex_tensor *g[2] = {apex_tensor_create(APEX_F32, 1, &n), apex_tensor_create(APEX_F16, 1, &n)};
  TU_OK(apex_tensor_fill(g[0], 3.0f * 8)); /* scaled by 8: norm of the unscaled = sqrt(4*9 + 4*16) = 10 */
  TU_OK(apex_tensor_fill(g[1], 4.0f * 8));
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_SGD, &(apex_optim_options){.lr = 1.0f});
  TU_OK(apex_optimizer_add_group(opt, p, 2, g, 2, NULL, NULL));
  float norm = 0;
  TU_OK(apex_optimizer_clip_grad_norm(opt, 5.0f, 8.0f, &norm));
  assert_float_equal(norm, 10.0f, 1e-6);
  /* The gradients are left alone; the next step applies 5 / (10 + 1e-6). */
  assert_true(apex_tensor_get(g[0], 0) == 24.0f);
  TU_OK(apex_optimizer_step(opt, 8.0f, 0));
  assert_float_equal(apex_tensor_get(p[0], 0), -1.5f, 1e-6);
  assert_float_equal(apex_tensor_get(apex_optimizer_master(opt, 0, 1), 0), -2.0f, 1e-6);
  /* Used once: the next step is unclipped. A norm under max_norm clips nothing. */
  TU_OK(apex_optimizer_clip_grad_norm(opt, 100.0f, 8.0f, &norm));
  TU_OK(apex_optimizer_step(opt, 8.0f, 0));
  assert_float_equal(apex_tensor_get(p[0], 0), -4.5f, 1e-6);
  /* A non-finite norm is reported and sets nothing. */
  apex_tensor_set(g[1], 2, INFINITY);
  TU_OK(apex_optimizer_clip_grad_norm(opt, 5.0f, 8.0f, &norm));
  assert_true(isinf(norm));
  TU_OK(apex_optimizer_step(opt, 8.0f, 1));
  TU_FAILS(apex_optimizer_clip_grad_norm(opt, 0.0f, 1.0f, NULL), APEX_ERR_INVALID_ARG, "max_norm is 0");
  TU_FAILS(apex_optimizer_clip_grad_norm(opt, 1.0f, -1.0f, NULL), APEX_ERR_INVALID_ARG, "grad_scale is -1");
  apex_optimizer_destroy(opt);
  for (int i = 0; i < 2; i++) {
    apex_tensor_destroy(p[i]);
    apex_tensor_destroy(g[i]);
  }
}

/* ---- options ---- */

static void test_options_and_defaults(void **state) {
  (void)state;
  apex_optim_options o;
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_LAMB, NULL);
  int64_t n = 3;
  apex_tensor *p = apex_tensor_create(APEX_F32, 1, &n);
  TU_OK(apex_optimizer_add_group(opt, &p, 1, NULL, 0, NULL, NULL));
  TU_OK(apex_optimizer_group_options(opt, 0, &o));
  assert_true(o.lr == 1e-3f && o.beta1 == 0.9f && o.beta2 == 0.999f && o.eps == 1e-6f && o.max_grad_norm == 1.0f);
  assert_int_equal(o.adam_w_mode, APEX_OPTIM_ON);
  assert_int_equal(o.grad_averaging, APEX_OPTIM_ON);
  assert_int_equal(o.use_nvlamb, APEX_OPTIM_OFF);
  /* No gradients yet: a step does nothing. */
  TU_OK(apex_optimizer_step(opt, 1.0f, 0));
  assert_int_equal(apex_optimizer_step_count(opt, 0, 0), 0);
  apex_optimizer_destroy(opt);

  /* Explicit zeros, through the bits or by name. */
  memset(&o, 0, sizeof o);
  TU_OK(apex_optim_options_set(&o, "beta1", 0));
  TU_OK(apex_optim_options_set(&o, "amsgrad", 1));
  TU_OK(apex_optim_options_set(&o, "lr", 0.5));
  opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &o);
  TU_OK(apex_optimizer_add_group(opt, &p, 1, NULL, 0, &(apex_optim_options){.zero = APEX_OPTIM_ZERO_EPS}, NULL));
  TU_OK(apex_optimizer_group_options(opt, 0, &o));
  assert_true(o.eps == 0.0f && o.beta1 == 0.9f && o.lr == 1e-3f); /* the group's own options, not the defaults */
  assert_int_equal(o.adam_w_mode, APEX_OPTIM_ON);
  apex_optimizer_destroy(opt);

  apex_optim_kind kind;
  TU_OK(apex_optim_kind_parse("RMSprop_TF", &kind));
  assert_int_equal(kind, APEX_OPTIM_RMSPROP_TF);
  assert_string_equal(apex_optim_kind_name(APEX_OPTIM_NOVOGRAD), "novograd");
  apex_tensor_destroy(p);
}

/* ---- bad input ---- */

typedef struct {
  apex_optim_kind kind;
  apex_optim_options o;
  const char *needle;
} bad_options;

static void test_bad_input(void **state) {
  (void)state;
  model m;
  model_init(&m, APEX_OPTIM_ADAM, APEX_BF16, APEX_F32, 1, 21);
  set_grads(&m, 0);
  TU_OK(apex_optimizer_step(m.opt, 1.0f, 0));
  snapshot before = snap(&m);
  int64_t n5 = 5, n3 = 3;
  apex_tensor *extra = apex_tensor_create(APEX_F32, 1, &n5), *g3 = apex_tensor_create(APEX_F32, 1, &n3);
  apex_tensor *none[2] = {extra, NULL};

  /* Hyperparameters out of range or not used by the kind: refused by create and by add_group. */
  const bad_options bad[] = {
      {APEX_OPTIM_ADAM, {.lr = -0.1f}, "Adam: lr is -0.1; it must be finite and >= 0"},
      {APEX_OPTIM_SGD, {.lr = NAN}, "SGD: lr is nan"},
      {APEX_OPTIM_ADAM, {.eps = -1e-8f}, "Adam: eps is -1e-08"},
      {APEX_OPTIM_ADAMW, {.beta1 = 1.0f}, "AdamW: beta1 is 1; it must be in [0, 1)"},
      {APEX_OPTIM_LAMB, {.beta2 = -0.5f}, "LAMB: beta2 is -0.5; it must be in [0, 1)"},
      {APEX_OPTIM_NOVOGRAD, {.beta2 = 1.5f}, "NovoGrad: beta2 is 1.5"},
      {APEX_OPTIM_ADAMP, {.beta1 = 2.0f}, "AdamP: beta1 is 2"},
      {APEX_OPTIM_ADADELTA, {.rho = 1.5f}, "Adadelta: rho is 1.5; it must be in [0, 1]"},
      {APEX_OPTIM_RMSPROP, {.alpha = -1.0f}, "RMSprop: alpha is -1"},
      {APEX_OPTIM_SGD, {.momentum = -0.9f}, "SGD: momentum is -0.9"},
      {APEX_OPTIM_ADAGRAD, {.weight_decay = -1.0f}, "Adagrad: weight_decay is -1"},
      {APEX_OPTIM_ADAM, {.momentum = 0.9f}, "Adam: option momentum does not apply to Adam"},
      {APEX_OPTIM_SGD, {.amsgrad = APEX_OPTIM_ON}, "SGD: option amsgrad does not apply to SGD"},
      {APEX_OPTIM_ADAM, {.amsgrad = 7}, "Adam: flag amsgrad is 7"},
      {APEX_OPTIM_ADAM, {.beta1 = 0.5f, .zero = APEX_OPTIM_ZERO_BETA1}, "beta1 is set but its APEX_OPTIM_ZERO bit"},
      {APEX_OPTIM_ADAM, {.zero = 1u << 20}, "unknown bits"},
      {APEX_OPTIM_NOVOGRAD, {.norm_type = 1}, "NovoGrad: norm_type is 1"},
      {APEX_OPTIM_SGD, {.nesterov = APEX_OPTIM_ON}, "SGD: nesterov needs momentum > 0 and dampening 0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    apex_clear_error();
    assert_null(apex_optimizer_create(bad[i].kind, &bad[i].o));
    tu_assert_message(bad[i].needle);
    if (bad[i].kind == APEX_OPTIM_ADAM) {
      TU_FAILS(apex_optimizer_add_group(m.opt, &extra, 1, NULL, 0, &bad[i].o, NULL), APEX_ERR_INVALID_ARG, bad[i].needle);
      assert_int_equal(apex_optimizer_num_groups(m.opt), 1);
    }
  }
  assert_null(apex_optimizer_create((apex_optim_kind)99, NULL));
  tu_assert_message("invalid optimizer kind 99");

  /* Lists. */
  TU_FAILS(apex_optimizer_add_group(m.opt, NULL, 0, NULL, 0, NULL, NULL), APEX_ERR_INVALID_ARG, "empty parameter list");
  TU_FAILS(apex_optimizer_add_group(m.opt, &extra, 0, NULL, 0, NULL, NULL), APEX_ERR_INVALID_ARG, "empty parameter list");
  TU_FAILS(apex_optimizer_add_group(m.opt, &extra, 1, m.g, 2, NULL, NULL), APEX_ERR_INVALID_ARG,
           "1 parameters but 2 gradients; the lists must have the same length");
  TU_FAILS(apex_optimizer_add_group(m.opt, none + 1, 1, NULL, 0, NULL, NULL), APEX_ERR_INVALID_ARG, "parameter 0 is NULL");
  apex_tensor *twice[2] = {extra, extra};
  TU_FAILS(apex_optimizer_add_group(m.opt, twice, 2, NULL, 0, NULL, NULL), APEX_ERR_INVALID_ARG,
           "parameter 1 is parameter 0 again");
  TU_FAILS(apex_optimizer_add_group(m.opt, m.p + 1, 1, NULL, 0, NULL, NULL), APEX_ERR_INVALID_ARG,
           "parameter 0 is already in group 0");
  TU_FAILS(apex_optimizer_add_group(m.opt, &extra, 1, &g3, 1, NULL, NULL), APEX_ERR_SHAPE,
           "gradient 0 has shape [3] but its parameter [5]");
  TU_FAILS(apex_optimizer_set_grad(m.opt, 0, 0, g3), APEX_ERR_SHAPE, "gradient 0 has shape [3]");
  TU_FAILS(apex_optimizer_set_grad(m.opt, 0, 3, NULL), APEX_ERR_INVALID_ARG, "parameter 3 out of range");
  TU_FAILS(apex_optimizer_set_grad(m.opt, 1, 0, NULL), APEX_ERR_INVALID_ARG, "group 1 out of range");
  assert_int_equal(apex_optimizer_num_groups(m.opt), 1);

  /* Learning rate, step, names. */
  TU_FAILS(apex_optimizer_set_lr(m.opt, 0, -1e-3f), APEX_ERR_INVALID_ARG, "lr is -0.001");
  TU_FAILS(apex_optimizer_set_lr(m.opt, 0, INFINITY), APEX_ERR_INVALID_ARG, "lr is inf");
  TU_FAILS(apex_optimizer_set_lr(m.opt, 2, 0.1f), APEX_ERR_INVALID_ARG, "group 2 out of range");
  TU_FAILS(apex_optimizer_step(m.opt, 0.0f, 0), APEX_ERR_INVALID_ARG, "grad_scale is 0");
  TU_FAILS(apex_optimizer_step(m.opt, NAN, 0), APEX_ERR_INVALID_ARG, "grad_scale is nan");
  TU_FAILS(apex_optimizer_step(NULL, 1.0f, 0), APEX_ERR_INVALID_ARG, "NULL optimizer");
  apex_optim_options o = {0};
  TU_FAILS(apex_optim_options_set(&o, "learning_rate", 0.1), APEX_ERR_INVALID_ARG, "unknown option 'learning_rate'");
  TU_FAILS(apex_optim_options_set(&o, "nesterov", 0.5), APEX_ERR_INVALID_ARG, "nesterov is a flag");
  apex_optim_kind kind;
  TU_FAILS(apex_optim_kind_parse("adamax", &kind), APEX_ERR_INVALID_ARG, "unknown optimizer 'adamax'");
  assert_model_is(&m, &before, "after the bad calls");

  apex_optimizer *empty = apex_optimizer_create(APEX_OPTIM_SGD, NULL);
  TU_FAILS(apex_optimizer_step(empty, 1.0f, 0), APEX_ERR_STATE, "no parameter groups");
  apex_optimizer_destroy(empty);

  snap_free(&before);
  apex_tensor_destroy(extra);
  apex_tensor_destroy(g3);
  model_free(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_skipped_step_changes_nothing),
      cmocka_unit_test(test_save_load_step_is_step),
      cmocka_unit_test(test_load_refuses_mismatches),
      cmocka_unit_test(test_load_names_first_mismatch),
      cmocka_unit_test(test_thread_count_independent),
      cmocka_unit_test(test_simd_paths_agree),
      cmocka_unit_test(test_lamb_batches_agree),
      cmocka_unit_test(test_missing_grad_is_skipped),
      cmocka_unit_test(test_groups_and_lr),
      cmocka_unit_test(test_replace_param),
      cmocka_unit_test(test_master_copies),
      cmocka_unit_test(test_adam_bf16_grads),
      cmocka_unit_test(test_clip_grad_norm),
      cmocka_unit_test(test_options_and_defaults),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
