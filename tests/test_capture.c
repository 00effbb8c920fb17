/* test_capture.c: a training step recorded once and replayed (capture.h), against the same step run eagerly.
 *
 * The reference is the step itself called directly, from the same seed on the same batches: a model
 * trained by apex_step_capture + apex_step_replay must end with the eager run's bits, every loss,
 * parameter, f32 master and the loss scale, since a replay repeats the recorded work on new values. The
 * step is a tiny GPT (apex_gpt_loss_index: its batch read from indexes) under amp with AdamW: O0 in f32,
 * O2 in bf16, and O2 in f16 with a dynamic loss scale started at 2^24 so that the first steps overflow and
 * are skipped, then the scale grows back every 2 steps. The batch and the learning rate change every step. On the CPU the
 * capture runs the step and a replay runs it again (nothing is recorded); on a GPU the step is a CUDA graph
 * (the CUDA cases skip without one). Refusals: a learning rate set to 0 (and the replay after a nonzero
 * one), a changed number of optimizer groups, NULL arguments, a step that fails in its first run, and on a GPU a step that reads host ids. */
#include <math.h>
#include <stdlib.h>

#include "apex/cuda.h"
#include "testutil.h"

enum { V = 29, B = 2, T = 6, STEPS = 8 };

typedef struct run {
  apex_model *m;
  apex_module *gpt;
  apex_optimizer *opt;
  apex_amp *amp;
  apex_graph *g;
  apex_index *ids, *targets;
  apex_tensor *loss; /* the step's loss, written in place on the device */
  int host_ids;      /* the step that breaks a capture: apex_gpt_loss with host arrays */
  int fail;          /* the step that fails */
} run;

static apex_status train_step(void *ctx) {
  run *r = ctx;
  if (r->fail) return apex_index_set(NULL, NULL, 0); /* any failure with its message */
  apex_var *loss;
  if (r->host_ids) {
    static const int64_t ids[B * T] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    loss = apex_gpt_loss(r->gpt, r->g, ids, ids, B, T);
  } else {
    loss = apex_gpt_loss_index(r->gpt, r->g, r->ids, r->targets);
  }
  apex_status st = loss ? apex_tensor_copy(r->loss, apex_var_value(loss)) : apex_last_status();
  if (st == APEX_OK) st = apex_amp_backward(r->amp, loss, 0, NULL);
  apex_graph_reset(r->g);
  if (st == APEX_OK) st = apex_amp_step(r->amp, r->opt, NULL);
  return st == APEX_OK ? apex_amp_zero_grad(r->amp) : st;
}

static run make(apex_device dev, const char *level, apex_amp_cast half) {
  run r = {0};
  r.m = apex_model_create(&(apex_model_options){.seed = 21, .device = dev});
  assert_non_null(r.m);
  r.gpt = apex_gpt_create(r.m, &(apex_gpt_options){.vocab = V, .n_layer = 2, .n_embd = 16, .n_head = 2, .n_positions = 8});
  assert_non_null(r.gpt);
  r.opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f});
  assert_non_null(r.opt);
  TU_OK(apex_optimizer_add_model(r.opt, r.m, NULL, NULL));
  apex_amp_config c = {.opt_level = level, .half_type = half};
  if (half == APEX_AMP_CAST_F16) c.loss_scale = APEX_AMP_DYNAMIC, c.init_scale = 16777216.0f, c.scale_window = 2;
  TU_OK(apex_amp_initialize(&r.m, 1, &r.opt, 1, &c, &r.amp));
  r.g = apex_graph_create_on(dev);
  const int64_t shape[2] = {B, T};
  r.ids = apex_index_create_on(dev, 2, shape, V);
  r.targets = apex_index_create_on(dev, 2, shape, V);
  r.loss = apex_tensor_create_on(dev, APEX_F32, 0, NULL);
  assert_non_null(r.g), assert_non_null(r.ids), assert_non_null(r.targets), assert_non_null(r.loss);
  TU_OK(apex_amp_prepare_graph(r.amp, r.g));
  return r;
}

static void destroy(run *r) {
  apex_index_destroy(r->ids);
  apex_index_destroy(r->targets);
  apex_tensor_destroy(r->loss);
  apex_graph_destroy(r->g);
  apex_amp_destroy(r->amp);
  apex_optimizer_destroy(r->opt);
  apex_model_destroy(r->m);
}

/* The learning rate of step s: a warm-up then a decay, so that every replay runs at another rate than the
 * capture's (the rate is read on the device). The capture's is lr_at(0) = 0.0025. */
static float lr_at(int s) { return s < 3 ? 2.5e-3f * (float)(s + 1) : 1e-2f / (float)(s - 1); }

/* Step s's batch: a stream of tokens that changes with s, each target the next token. */
static void set_batch(run *r, int s) {
  int64_t stream[B * T + 1], tg[B * T];
  for (int i = 0; i <= B * T; i++) stream[i] = (i * 5 + s * 11 + (i * s) % 7) % V;
  for (int i = 0; i < B * T; i++) tg[i] = stream[i + 1];
  TU_OK(apex_index_set(r->ids, stream, B * T));
  TU_OK(apex_index_set(r->targets, tg, B * T));
}

static float read_loss(const run *r) {
  apex_tensor *h = apex_tensor_create(APEX_F32, 0, NULL);
  TU_OK(apex_tensor_copy(h, r->loss));
  float v = *(const float *)apex_tensor_data(h);
  apex_tensor_destroy(h);
  return v;
}

static void assert_same_tensor(const apex_tensor *a, const apex_tensor *b, const char *what) {
  apex_tensor *ha = apex_tensor_create(apex_tensor_dtype(a), apex_tensor_ndim(a), apex_tensor_shape(a));
  apex_tensor *hb = apex_tensor_create(apex_tensor_dtype(b), apex_tensor_ndim(b), apex_tensor_shape(b));
  TU_OK(apex_tensor_copy(ha, a));
  TU_OK(apex_tensor_copy(hb, b));
  if (memcmp(apex_tensor_data(ha), apex_tensor_data(hb), apex_tensor_nbytes(ha)) != 0) fail_msg("%s: the captured run's bits differ", what);
  apex_tensor_destroy(ha);
  apex_tensor_destroy(hb);
}

/* STEPS eager steps against a capture and STEPS - 1 replays, from the same seed on the same batches. */
static void captured_equals_eager(apex_device dev, const char *level, apex_amp_cast half, const char *what) {
  run e = make(dev, level, half), c = make(dev, level, half);
  float le[STEPS], lc[STEPS];
  for (int s = 0; s < STEPS; s++) {
    set_batch(&e, s);
    TU_OK(apex_optimizer_set_lr(e.opt, 0, lr_at(s)));
    TU_OK(train_step(&e));
    le[s] = read_loss(&e);
  }
  apex_captured_step *cs = NULL;
  set_batch(&c, 0);
  TU_OK(apex_optimizer_set_lr(c.opt, 0, lr_at(0)));
  TU_OK(apex_step_capture(dev, train_step, &c, &(apex_capture_options){&c.opt, 1}, &cs));
  assert_non_null(cs);
  lc[0] = read_loss(&c);
  for (int s = 1; s < STEPS; s++) {
    set_batch(&c, s);
    TU_OK(apex_optimizer_set_lr(c.opt, 0, lr_at(s))); /* read on the device by the recorded step */
    TU_OK(apex_step_replay(cs));
    lc[s] = read_loss(&c);
  }
  printf("%s: losses", what);
  for (int s = 0; s < STEPS; s++) printf(" %.5f/%.5f", (double)le[s], (double)lc[s]);
  printf("; loss scale %g/%g\n", (double)apex_amp_loss_scale(e.amp, 0), (double)apex_amp_loss_scale(c.amp, 0));
  for (int s = 0; s < STEPS; s++)
    if (tu_bits(le[s]) != tu_bits(lc[s])) fail_msg("%s: step %d's loss eager %.9g, captured %.9g", what, s, (double)le[s], (double)lc[s]);
  for (int s = 0; s < STEPS; s++) assert_true(isfinite(le[s]));
  assert_true(tu_bits(apex_amp_loss_scale(e.amp, 0)) == tu_bits(apex_amp_loss_scale(c.amp, 0)));
  for (size_t i = 0; i < apex_model_num_params(e.m); i++) {
    const char *name;
    apex_var *pe = apex_model_param(e.m, i, &name), *pc = apex_model_param(c.m, i, NULL);
    assert_same_tensor(apex_var_value(pe), apex_var_value(pc), name);
    const apex_tensor *me = apex_amp_master_of(e.amp, pe), *mc = apex_amp_master_of(c.amp, pc);
    assert_true((me == NULL) == (mc == NULL));
    if (me) assert_same_tensor(me, mc, name);
  }
  /* a learning rate of 0 changes the recorded work (a zero-lr group's update is skipped), so the replay
   * refuses and runs nothing; back to a nonzero rate, it runs */
  TU_OK(apex_optimizer_set_lr(c.opt, 0, 0.0f));
  set_batch(&c, STEPS);
  TU_FAILS(apex_step_replay(cs), APEX_ERR_STATE, "learning rate went from 0.0025 to 0 since the capture");
  TU_OK(apex_optimizer_set_lr(c.opt, 0, 1e-2f));
  TU_OK(apex_step_replay(cs));
  assert_true(isfinite(read_loss(&c)));
  apex_captured_step_destroy(cs);
  destroy(&e);
  destroy(&c);
}

static void all_levels(apex_device dev) {
  captured_equals_eager(dev, "O0", APEX_AMP_CAST_DEFAULT, "O0 f32");
  captured_equals_eager(dev, "O2", APEX_AMP_CAST_BF16, "O2 bf16");
  captured_equals_eager(dev, "O2", APEX_AMP_CAST_F16, "O2 f16, dynamic scale from 2^24");
}

static void test_captured_equals_eager_cpu(void **state) {
  (void)state;
  all_levels(APEX_DEVICE_CPU);
}

static void test_captured_equals_eager_cuda(void **state) {
  (void)state;
  const char *why = NULL;
  if (!apex_cuda_available(&why)) {
    printf("skipped: %s\n", why ? why : "no CUDA GPU");
    skip();
  }
  all_levels(APEX_DEVICE_CUDA);
}

static void refusals_on(apex_device dev) {
  run r = make(dev, "O2", APEX_AMP_CAST_BF16);
  set_batch(&r, 0);
  apex_captured_step *cs = (apex_captured_step *)&r; /* must come back NULL on every failure */
  TU_FAILS(apex_step_capture(dev, NULL, &r, NULL, &cs), APEX_ERR_INVALID_ARG, "NULL step");
  assert_null(cs);
  TU_FAILS(apex_step_capture(dev, train_step, &r, NULL, NULL), APEX_ERR_INVALID_ARG, "NULL out");
  TU_FAILS(apex_step_capture(dev, train_step, &r, &(apex_capture_options){NULL, 1}, &cs), APEX_ERR_INVALID_ARG, "1 optimizers and a NULL list");
  TU_FAILS(apex_step_capture(dev, train_step, &r, &(apex_capture_options){(apex_optimizer *[]){NULL}, 1}, &cs), APEX_ERR_INVALID_ARG,
           "optimizer 0 is NULL");
  TU_FAILS(apex_step_capture(dev, train_step, &r, &(apex_capture_options){&r.opt, -1}, &cs), APEX_ERR_INVALID_ARG, "-1 optimizers");
  TU_FAILS(apex_step_capture((apex_device)42, train_step, &r, NULL, &cs), APEX_ERR_INVALID_ARG, "apex_step_capture");
  TU_FAILS(apex_step_replay(NULL), APEX_ERR_INVALID_ARG, "NULL step");
  apex_captured_step_destroy(NULL);
  /* the step's own failure in its first run */
  r.fail = 1;
  TU_FAILS(apex_step_capture(dev, train_step, &r, NULL, &cs), APEX_ERR_INVALID_ARG, "apex_index_set: NULL index");
  assert_null(cs);
  r.fail = 0;
  if (dev != APEX_DEVICE_CPU) {
    /* host ids: the recorded call copies host memory, which a graph cannot replay; the first run's step stands */
    r.host_ids = 1;
    apex_status st = apex_step_capture(dev, train_step, &r, NULL, &cs);
    printf("a step with host ids: %s: %s\n", apex_status_name(st), apex_last_error());
    assert_int_not_equal(st, APEX_OK);
    assert_null(cs);
    r.host_ids = 0;
    /* and the stream works after the broken capture */
    TU_OK(train_step(&r));
    assert_true(isfinite(read_loss(&r)));
  }
  /* the optimizer's groups changed: the recorded kernels step the old ones */
  TU_OK(apex_step_capture(dev, train_step, &r, &(apex_capture_options){&r.opt, 1}, &cs));
  apex_tensor *extra = apex_tensor_create_on(dev, APEX_F32, 1, (int64_t[]){3});
  TU_OK(apex_optimizer_add_group(r.opt, &extra, 1, NULL, 0, NULL, NULL));
  TU_FAILS(apex_step_replay(cs), APEX_ERR_STATE, "optimizer 0 has 2 groups, 1 when the step was captured");
  apex_captured_step_destroy(cs);
  destroy(&r);
  apex_tensor_destroy(extra);
}

static void test_refusals_cpu(void **state) {
  (void)state;
  refusals_on(APEX_DEVICE_CPU);
}

static void test_refusals_cuda(void **state) {
  (void)state;
  const char *why = NULL;
  if (!apex_cuda_available(&why)) {
    printf("skipped: %s\n", why ? why : "no CUDA GPU");
    skip();
  }
  refusals_on(APEX_DEVICE_CUDA);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_captured_equals_eager_cpu),
      cmocka_unit_test(test_captured_equals_eager_cuda),
      cmocka_unit_test(test_refusals_cpu),
      cmocka_unit_test(test_refusals_cuda),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
