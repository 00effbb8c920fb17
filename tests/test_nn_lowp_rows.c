/* test_nn_lowp_rows.c: the norms, softmax, losses, GELUs and reductions on f16 and bf16 tensors, which their CPU kernels
 * read and write in the tensors' own dtype a row (line, plane, block) at a time, give the bits of the
 * reference they replace: the same op on f32 copies of the inputs (widening is exact), its result
 * rounded once to the low-precision dtype, and its gradients those of the f32 op (rounded to the
 * leaves' dtype). Forward values and every input's gradient, at 1, 2 and 3 threads, on shapes past
 * the kernels' threading threshold; the f32 reference always runs on one thread, so the same bits
 * also show that no result depends on the thread count. Under autocast, the FLOAT-category ops among
 * them take f16/bf16 inputs without the recorded f32 cast, with the cast's bits. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "apex/ddp.h"
#include "apex/nn.h"
#include "apex/parallel.h"
#include "apex/threads.h"

#define MAX_IN 3

typedef apex_var *(*op_fn)(apex_graph *g, apex_var **x);

typedef struct {
  const char *name;
  op_fn f;
  int n_in;
  int ndim[MAX_IN];
  int64_t shape[MAX_IN][4];
  int prob;   /* input 0 holds probabilities in [0, 1] (BCE) */
  int unread; /* the backward never reads input 0 (sum, mean): no run holds a copy of it */
} lp_case;

static apex_pg *pg; /* local process group for sync batch norm */
static int64_t xent_targets[64];

static apex_var *f_layer_norm(apex_graph *g, apex_var **x) { return apex_layer_norm(g, x[0], x[1], x[2], 1e-5f); }
static apex_var *f_rms_norm(apex_graph *g, apex_var **x) { return apex_rms_norm(g, x[0], x[1], 1e-6f); }
static apex_var *f_bn_train(apex_graph *g, apex_var **x) {
  return apex_batch_norm(g, x[0], x[1], x[2], NULL, NULL, &(apex_batch_norm_options){.training = 1});
}
static apex_var *f_bn_relu(apex_graph *g, apex_var **x) {
  return apex_batch_norm(g, x[0], x[1], x[2], NULL, NULL, &(apex_batch_norm_options){.training = 1, .relu = 1});
}
/* Evaluation with running statistics (made here, f32, the same for both runs). */
static apex_var *f_bn_eval(apex_graph *g, apex_var **x) {
  int64_t C = apex_tensor_dim(apex_var_value(x[0]), 1);
  apex_tensor *rm = apex_tensor_create(APEX_F32, 1, &C), *rv = apex_tensor_create(APEX_F32, 1, &C);
  for (int64_t c = 0; c < C; c++) {
    apex_tensor_set(rm, (size_t)c, 0.1f * (float)c - 0.2f);
    apex_tensor_set(rv, (size_t)c, 0.5f + 0.25f * (float)c);
  }
  apex_var *y = apex_batch_norm(g, x[0], x[1], x[2], rm, rv, &(apex_batch_norm_options){0});
  apex_tensor_destroy(rm);
  apex_tensor_destroy(rv);
  return y;
}
static apex_var *f_sync_bn(apex_graph *g, apex_var **x) { return apex_sync_batch_norm(g, pg, x[0], x[1], x[2], NULL, NULL, NULL); }
static apex_var *f_softmax_last(apex_graph *g, apex_var **x) { return apex_softmax(g, x[0], -1); }
static apex_var *f_softmax_mid(apex_graph *g, apex_var **x) { return apex_softmax(g, x[0], 1); }
static apex_var *f_log_softmax_mid(apex_graph *g, apex_var **x) { return apex_log_softmax(g, x[0], 1); }
static apex_var *f_log_softmax_last(apex_graph *g, apex_var **x) { return apex_log_softmax(g, x[0], -1); }
static apex_var *f_xent(apex_graph *g, apex_var **x) {
  return apex_cross_entropy(g, x[0], xent_targets,
                            &(apex_cross_entropy_options){.label_smoothing = 0.1f, .use_ignore_index = 1, .ignore_index = 3});
}
static apex_var *f_xent_none(apex_graph *g, apex_var **x) {
  return apex_cross_entropy(g, x[0], xent_targets, &(apex_cross_entropy_options){.reduction = APEX_REDUCTION_NONE});
}
static apex_var *f_mse(apex_graph *g, apex_var **x) { return apex_mse_loss(g, x[0], x[1], APEX_REDUCTION_MEAN); }
static apex_var *f_mse_none(apex_graph *g, apex_var **x) { return apex_mse_loss(g, x[0], x[1], APEX_REDUCTION_NONE); }
static apex_var *f_bce_logits(apex_graph *g, apex_var **x) { return apex_bce_with_logits(g, x[0], x[1], APEX_REDUCTION_SUM); }
static apex_var *f_bce(apex_graph *g, apex_var **x) { return apex_bce(g, x[0], x[1], APEX_REDUCTION_MEAN); }
static apex_var *f_mse_sum(apex_graph *g, apex_var **x) { return apex_mse_loss(g, x[0], x[1], APEX_REDUCTION_SUM); }
static apex_var *f_bce_logits_none(apex_graph *g, apex_var **x) { return apex_bce_with_logits(g, x[0], x[1], APEX_REDUCTION_NONE); }
static apex_var *f_bce_logits_mean(apex_graph *g, apex_var **x) { return apex_bce_with_logits(g, x[0], x[1], APEX_REDUCTION_MEAN); }
static apex_var *f_bce_none(apex_graph *g, apex_var **x) { return apex_bce(g, x[0], x[1], APEX_REDUCTION_NONE); }
static apex_var *f_xent_ls_none(apex_graph *g, apex_var **x) {
  return apex_cross_entropy(g, x[0], xent_targets, &(apex_cross_entropy_options){.reduction = APEX_REDUCTION_NONE, .label_smoothing = 0.2f,
                                                                                  .use_ignore_index = 1, .ignore_index = 3});
}
static apex_var *f_gelu(apex_graph *g, apex_var **x) { return apex_gelu(g, x[0]); }
static apex_var *f_gelu_tanh(apex_graph *g, apex_var **x) { return apex_gelu_tanh(g, x[0]); }
static apex_var *f_sum_all(apex_graph *g, apex_var **x) { return apex_sum_all(g, x[0]); }
static apex_var *f_mean_mid(apex_graph *g, apex_var **x) { return apex_mean(g, x[0], 1, 1); }
static apex_var *f_sum_last(apex_graph *g, apex_var **x) { return apex_sum(g, x[0], -1, 0); }
static apex_var *f_norm_all(apex_graph *g, apex_var **x) { return apex_norm_all(g, x[0]); }
static apex_var *f_norm_mid(apex_graph *g, apex_var **x) { return apex_norm(g, x[0], 1, 0); }
static apex_var *f_norm_last(apex_graph *g, apex_var **x) { return apex_norm(g, x[0], -1, 1); }

/* Every shape has more than APEX__CPU_PAR_MIN (16384) elements, so the kernels run on threads. */
static const lp_case cases[] = {
    {"layer_norm", f_layer_norm, 3, {2, 1, 1}, {{72, 260}, {260}, {260}}, 0, 0},
    {"rms_norm", f_rms_norm, 2, {3, 1}, {{4, 18, 260}, {260}}, 0, 0},
    {"batch_norm", f_bn_train, 3, {4, 1, 1}, {{6, 5, 24, 25}, {5}, {5}}, 0, 0},
    {"batch_norm_relu", f_bn_relu, 3, {4, 1, 1}, {{6, 5, 24, 25}, {5}, {5}}, 0, 0},
    {"batch_norm_eval", f_bn_eval, 3, {3, 1, 1}, {{40, 4, 120}, {4}, {4}}, 0, 0},
    {"sync_batch_norm", f_sync_bn, 3, {4, 1, 1}, {{6, 5, 24, 25}, {5}, {5}}, 0, 0},
    {"softmax_last", f_softmax_last, 1, {2}, {{70, 300}}, 0, 0},
    {"softmax_mid", f_softmax_mid, 1, {3}, {{3, 70, 90}}, 0, 0},
    {"log_softmax_mid", f_log_softmax_mid, 1, {3}, {{3, 70, 90}}, 0, 0},
    {"log_softmax_last", f_log_softmax_last, 1, {2}, {{70, 300}}, 0, 0},
    {"cross_entropy", f_xent, 1, {2}, {{60, 310}}, 0, 0},
    {"cross_entropy_none", f_xent_none, 1, {2}, {{60, 310}}, 0, 0},
    {"mse", f_mse, 2, {2, 2}, {{90, 210}, {90, 210}}, 0, 0},
    {"mse_none", f_mse_none, 2, {1, 1}, {{17000}, {17000}}, 0, 0},
    {"bce_with_logits", f_bce_logits, 2, {2, 2}, {{90, 210}, {90, 210}}, 0, 0},
    {"bce", f_bce, 2, {2, 2}, {{90, 210}, {90, 210}}, 1, 0},
    /* the pointwise losses compute their terms a 4096-element sum block (or a 1024-element output
     * block) at a time and keep none: sizes with a partial last block of each */
    {"mse_sum", f_mse_sum, 2, {2, 2}, {{3, 5471}, {3, 5471}}, 0, 0},
    {"bce_with_logits_none", f_bce_logits_none, 2, {2, 2}, {{3, 5471}, {3, 5471}}, 0, 0},
    {"bce_with_logits_mean", f_bce_logits_mean, 2, {1, 1}, {{16411}, {16411}}, 0, 0},
    {"bce_none", f_bce_none, 2, {2, 2}, {{3, 5471}, {3, 5471}}, 1, 0},
    /* cross entropy's backward recomputes the softmax from the half logits */
    {"cross_entropy_ls_none", f_xent_ls_none, 1, {2}, {{60, 310}}, 0, 0},
    /* the GELUs read a half input's results and slopes from tables of its 65536 values
     * (cpu/elementwise.c); under autocast they run in f32 (Apex's FP32_FUNCS) */
    {"gelu", f_gelu, 1, {2}, {{70, 300}}, 0, 0},
    {"gelu_tanh", f_gelu_tanh, 1, {2}, {{70, 300}}, 0, 0},
    /* the reductions read a half input a block at a time (cpu/shape.c): a whole-tensor line over
     * several of the 4096-element blocks, lines along a middle dim wider than the 64 columns a task
     * takes (and a partial one), and last-dim lines longer than the 512 elements widened at a time */
    {"sum_all", f_sum_all, 1, {2}, {{5, 4100}}, 0, 1},
    {"mean_mid", f_mean_mid, 1, {3}, {{6, 70, 90}}, 0, 1},
    {"sum_last", f_sum_last, 1, {2}, {{30, 1100}}, 0, 1},
    {"norm_all", f_norm_all, 1, {2}, {{5, 4100}}, 0, 0},
    {"norm_mid", f_norm_mid, 1, {3}, {{6, 70, 90}}, 0, 0},
    {"norm_last", f_norm_last, 1, {2}, {{30, 1100}}, 0, 0},
};

static size_t numel_of(int nd, const int64_t *s) {
  size_t n = 1;
  for (int i = 0; i < nd; i++) n *= (size_t)s[i];
  return n;
}

/* v's bits after rounding f32 to dt (the low-precision result of the reference). */
static uint32_t rounded_bits(float v, apex_dtype dt) {
  if (dt == APEX_BF16) return tu_bits(apex_bf16_to_f32(apex_f32_to_bf16(v)));
  if (dt == APEX_F16) return tu_bits(apex_f16_to_f32(apex_f32_to_f16(v)));
  return tu_bits(v);
}

/* Runs the case on leaves holding vals[i] (f32 arrays) in dtype dt: out receives the result widened
 * (f32), grads[i] every input's gradient widened; `*n_out` the result's numel. */
static void run_case(const lp_case *c, apex_dtype dt, float *const *vals, float **out, size_t *n_out, float **grads) {
  apex_graph *g = apex_graph_create();
  apex_var *x[MAX_IN];
  for (int i = 0; i < c->n_in; i++) {
    size_t n = numel_of(c->ndim[i], c->shape[i]);
    apex_tensor *t = apex_tensor_create(dt, c->ndim[i], c->shape[i]);
    assert_non_null(t);
    TU_OK(apex_convert(apex_tensor_data(t), dt, vals[i], APEX_F32, n));
    x[i] = apex_var_create(t, 1);
  }
  apex_var *y = c->f(g, x);
  if (!y) fail_msg("%s: %s", c->name, apex_last_error());
  const apex_tensor *Y = apex_var_value(y);
  size_t ny = apex_tensor_numel(Y);
  *n_out = ny;
  *out = malloc(ny * sizeof(float));
  TU_OK(apex_convert(*out, APEX_F32, apex_tensor_data(Y), apex_tensor_dtype(Y), ny));
  /* a fixed, uneven gradient of the output (f32), the same for both runs */
  apex_tensor *R = apex_tensor_create(APEX_F32, apex_tensor_ndim(Y), apex_tensor_shape(Y));
  for (size_t i = 0; i < ny; i++) apex_tensor_set(R, i, 0.01f * (float)((i * 7919) % 97) - 0.4f);
  TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = R}));
  for (int i = 0; i < c->n_in; i++) {
    const apex_tensor *G = apex_var_grad(x[i]);
    size_t n = apex_tensor_numel(G);
    grads[i] = malloc(n * sizeof(float));
    TU_OK(apex_convert(grads[i], APEX_F32, apex_tensor_data(G), apex_tensor_dtype(G), n));
  }
  apex_tensor_destroy(R);
  apex_graph_destroy(g);
  for (int i = 0; i < c->n_in; i++) apex_var_destroy(x[i]);
}

/* Case c on leaves holding vals (values exact in dt) in dt at 1, 2 and 3 threads against the f32 op on
 * one thread: the result and every input's gradient bitwise as the f32 op's rounded to dt. */
static void check_vals(const lp_case *c, apex_dtype dt, float *const *vals) {
  TU_OK(apex_set_num_threads(1));
  float *ref, *ref_g[MAX_IN];
  size_t n_ref;
  run_case(c, APEX_F32, vals, &ref, &n_ref, ref_g);
  for (int threads = 1; threads <= 3; threads++) {
    TU_OK(apex_set_num_threads(threads));
    float *got, *got_g[MAX_IN];
    size_t n_got;
    run_case(c, dt, vals, &got, &n_got, got_g);
    assert_int_equal(n_got, n_ref);
    /* a reduced loss is one value summed in double and rounded once, as the reference's */
    for (size_t k = 0; k < n_ref; k++)
      if (tu_bits(got[k]) != rounded_bits(ref[k], dt))
        fail_msg("%s %s, %d threads: result %zu is %a, the f32 op's rounded is %a", c->name, apex_dtype_name(dt), threads, k,
                 (double)got[k], (double)tu_float(rounded_bits(ref[k], dt)));
    for (int i = 0; i < c->n_in; i++) {
      size_t n = numel_of(c->ndim[i], c->shape[i]);
      for (size_t k = 0; k < n; k++)
        if (tu_bits(got_g[i][k]) != rounded_bits(ref_g[i][k], dt))
          fail_msg("%s %s, %d threads: gradient of input %d, element %zu is %a, the f32 op's rounded is %a", c->name,
                   apex_dtype_name(dt), threads, i, k, (double)got_g[i][k], (double)tu_float(rounded_bits(ref_g[i][k], dt)));
      free(got_g[i]);
    }
    free(got);
  }
  for (int i = 0; i < c->n_in; i++) free(ref_g[i]);
  free(ref);
}

static void check_case(const lp_case *c) {
  for (int d = 0; d < 2; d++) {
    apex_dtype dt = d ? APEX_BF16 : APEX_F16;
    /* the inputs: random values representable in dt (so the f32 run sees exactly what dt holds) */
    float *vals[MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
      size_t n = numel_of(c->ndim[i], c->shape[i]);
      apex_tensor *t = tu_random_tensor(dt, n, 100 + (uint64_t)i, 2.0f);
      vals[i] = malloc(n * sizeof(float));
      TU_OK(apex_convert(vals[i], APEX_F32, apex_tensor_data(t), dt, n));
      apex_tensor_destroy(t);
      if (i == 0 && c->prob)
        for (size_t k = 0; k < n; k++) vals[i][k] = apex_bf16_to_f32(apex_f32_to_bf16(fabsf(vals[i][k]) * 0.5f)); /* exact in f16 too */
    }
    check_vals(c, dt, vals);
    for (int i = 0; i < c->n_in; i++) free(vals[i]);
  }
}

static void test_cases(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

/* Batch norm reads a bf16 input in place, eight elements to the vector (norm.c): on the benchmark
 * CNN's plane size (S = 196, a multiple of neither 8 nor 16, so the vector loops and their scalar
 * tails both run), with a NaN in one channel and an infinity in another, the bits stay the f32 op's
 * on the widened input, fused relu or not. */
static void test_batch_norm_bf16_special(void **state) {
  (void)state;
  const lp_case bn[2] = {{"batch_norm 196", f_bn_train, 3, {4, 1, 1}, {{3, 4, 14, 14}, {4}, {4}}, 0, 0},
                         {"batch_norm_relu 196", f_bn_relu, 3, {4, 1, 1}, {{3, 4, 14, 14}, {4}, {4}}, 0, 0}};
  for (int k = 0; k < 2; k++) {
    const lp_case *c = &bn[k];
    float *vals[MAX_IN];
    for (int i = 0; i < c->n_in; i++) {
      size_t n = numel_of(c->ndim[i], c->shape[i]);
      apex_tensor *t = tu_random_tensor(APEX_BF16, n, 300 + (uint64_t)i, 2.0f);
      vals[i] = malloc(n * sizeof(float));
      TU_OK(apex_convert(vals[i], APEX_F32, apex_tensor_data(t), APEX_BF16, n));
      apex_tensor_destroy(t);
    }
    vals[0][(0 * 4 + 1) * 196 + 37] = NAN;      /* image 0, channel 1 */
    vals[0][(2 * 4 + 3) * 196 + 195] = INFINITY; /* image 2, channel 3, the tail */
    check_vals(c, APEX_BF16, vals);
    for (int i = 0; i < c->n_in; i++) free(vals[i]);
  }
}

/* ---- autocast ---------------------------------------------------------------------------------- */

/* Runs case c under autocast in dt on leaves holding vals, each passed through scale(1) (so the op's
 * input is a bf16/f16 graph var, as an activation is); with `cast` the op gets apex_cast(.., f32) of
 * it, the recorded cast autocast made before the FLOAT ops read half inputs. Returns the result
 * (widened) and the leaves' gradients; *live the graph's live bytes after the forward (what it holds
 * for the backward). */
static int run_autocast(const lp_case *c, apex_dtype dt, int cast, float *const *vals, float **out, size_t *n_out, float **grads,
                        size_t *live) {
  apex_graph *g = apex_graph_create();
  TU_OK(apex_graph_set_autocast(g, 1, dt));
  apex_var *x[MAX_IN], *h[MAX_IN];
  for (int i = 0; i < c->n_in; i++) {
    size_t n = numel_of(c->ndim[i], c->shape[i]);
    apex_tensor *t = apex_tensor_create(dt, c->ndim[i], c->shape[i]);
    TU_OK(apex_convert(apex_tensor_data(t), dt, vals[i], APEX_F32, n));
    x[i] = apex_var_create(t, 1);
    h[i] = apex_scale(g, x[i], 1.0f);
    assert_int_equal(apex_tensor_dtype(apex_var_value(h[i])), dt);
    if (cast) h[i] = apex_cast(g, h[i], APEX_F32);
    assert_non_null(h[i]);
  }
  apex_var *y = c->f(g, h);
  int ok = y && apex_op_cast_category(apex_var_op(y)) == APEX_CAST_FLOAT;
  if (ok) {
    const apex_tensor *Y = apex_var_value(y);
    assert_int_equal(apex_tensor_dtype(Y), APEX_F32); /* the category's dtype, as with the cast */
    *live = apex_graph_live_bytes(g);
    size_t ny = apex_tensor_numel(Y);
    *n_out = ny;
    *out = malloc(ny * sizeof(float));
    memcpy(*out, apex_tensor_data(Y), ny * sizeof(float));
    apex_tensor *R = apex_tensor_create(APEX_F32, apex_tensor_ndim(Y), apex_tensor_shape(Y));
    for (size_t i = 0; i < ny; i++) apex_tensor_set(R, i, 0.01f * (float)((i * 7919) % 97) - 0.4f);
    TU_OK(apex_backward(y, &(apex_backward_options){.grad_output = R}));
    apex_tensor_destroy(R);
    for (int i = 0; i < c->n_in; i++) {
      const apex_tensor *G = apex_var_grad(x[i]);
      size_t n = apex_tensor_numel(G);
      grads[i] = malloc(n * sizeof(float));
      TU_OK(apex_convert(grads[i], APEX_F32, apex_tensor_data(G), apex_tensor_dtype(G), n));
    }
  }
  apex_graph_destroy(g);
  for (int i = 0; i < c->n_in; i++) apex_var_destroy(x[i]);
  return ok;
}

/* Under autocast the FLOAT-category norms, softmax, losses, GELUs and reductions take f16/bf16 inputs uncast
 * (op_table.c's reads_half): their results and the gradients that reach the leaves are the bits of
 * the recorded f32 cast they replace, at 1 to 3 threads, and the graph holds less memory after the
 * forward (no f32 copy of the input). */
static void test_autocast_float_ops_uncast(void **state) {
  (void)state;
  int checked = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const lp_case *c = &cases[ci];
    for (int d = 0; d < 2; d++) {
      apex_dtype dt = d ? APEX_BF16 : APEX_F16;
      float *vals[MAX_IN];
      for (int i = 0; i < c->n_in; i++) {
        size_t n = numel_of(c->ndim[i], c->shape[i]);
        apex_tensor *t = tu_random_tensor(dt, n, 200 + (uint64_t)i, 2.0f);
        vals[i] = malloc(n * sizeof(float));
        TU_OK(apex_convert(vals[i], APEX_F32, apex_tensor_data(t), dt, n));
        apex_tensor_destroy(t);
      }
      TU_OK(apex_set_num_threads(1));
      float *ref = NULL, *ref_g[MAX_IN] = {0};
      size_t n_ref = 0, live_ref = 0, live = 0;
      int ok = run_autocast(c, dt, 1, vals, &ref, &n_ref, ref_g, &live_ref);
      for (int threads = 1; ok && threads <= 3; threads++) {
        TU_OK(apex_set_num_threads(threads));
        float *got = NULL, *got_g[MAX_IN] = {0};
        size_t n_got = 0;
        assert_true(run_autocast(c, dt, 0, vals, &got, &n_got, got_g, &live));
        assert_int_equal(n_got, n_ref);
        /* the f32 copy of the first input (4 bytes an element) is no longer held for the backward;
         * where the backward never reads it, neither run holds it, and uncast holds no more */
        size_t n0 = numel_of(c->ndim[0], c->shape[0]);
        if (c->unread ? live > live_ref : live + 3 * n0 > live_ref)
          fail_msg("%s %s: %zu live bytes uncast, %zu with the cast: the %zu-element input's f32 copy is still held", c->name,
                   apex_dtype_name(dt), live, live_ref, n0);
        for (size_t k = 0; k < n_ref; k++)
          if (tu_bits(got[k]) != tu_bits(ref[k]))
            fail_msg("%s %s autocast, %d threads: result %zu is %a, with the cast %a", c->name, apex_dtype_name(dt), threads, k,
                     (double)got[k], (double)ref[k]);
        for (int i = 0; i < c->n_in; i++) {
          size_t n = numel_of(c->ndim[i], c->shape[i]);
          for (size_t k = 0; k < n; k++)
            if (tu_bits(got_g[i][k]) != tu_bits(ref_g[i][k]))
              fail_msg("%s %s autocast, %d threads: gradient of input %d, element %zu is %a, with the cast %a", c->name,
                       apex_dtype_name(dt), threads, i, k, (double)got_g[i][k], (double)ref_g[i][k]);
          free(got_g[i]);
        }
        free(got);
      }
      if (ok) {
        checked++;
        for (int i = 0; i < c->n_in; i++) free(ref_g[i]);
        free(ref);
      }
      for (int i = 0; i < c->n_in; i++) free(vals[i]);
    }
  }
  /* layer/RMS norm, the four softmaxes, three cross entropies, three MSEs, three BCEs with logits, the
   * two GELUs and the six reductions, each dtype (BCE is refused under autocast; batch norm is not a
   * FLOAT op) */
  assert_int_equal(checked, 2 * 23);
}

/* ---- softmax lines with signed zeros, NaN and -inf ---------------------------------------------- */

/* The kernels' running maximum is a compare-and-select, not fmaxf: on lines whose maximum is -0 or
 * +0 (either order), that hold a NaN, or are all -inf, softmax, log-softmax and cross entropy give
 * the bits of the formula with fmaxf, computed here in plain C (f32, in line order). */
static void test_softmax_special_lines(void **state) {
  (void)state;
  enum { R = 6, D = 5 };
  const float ni = -INFINITY;
  const float lines[R][D] = {{-0.0f, -1.0f, 0.0f, -2.0f, -0.0f}, {0.0f, -0.0f, -3.0f, -0.0f, -1.0f}, {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f},
                             {1.0f, NAN, 2.0f, -1.0f, 0.5f},      {ni, ni, ni, ni, ni},               {ni, -0.0f, ni, 0.0f, ni}};
  apex_graph *g = apex_graph_create();
  apex_tensor *t = apex_tensor_create(APEX_F32, 2, (int64_t[]){R, D});
  memcpy(apex_tensor_data(t), lines, sizeof lines);
  apex_var *x = apex_var_create(t, 0);
  int64_t tg[R] = {0, 1, 2, 3, 4, 1};
  apex_var *sm = apex_softmax(g, x, -1), *lsm = apex_log_softmax(g, x, -1);
  apex_var *ce = apex_cross_entropy(g, x, tg, &(apex_cross_entropy_options){.reduction = APEX_REDUCTION_NONE, .label_smoothing = 0.25f});
  assert_non_null(sm);
  assert_non_null(lsm);
  assert_non_null(ce);
  const float *ys = apex_tensor_data(apex_var_value(sm)), *yl = apex_tensor_data(apex_var_value(lsm)), *yc = apex_tensor_data(apex_var_value(ce));
  for (int r = 0; r < R; r++) {
    const float *l = lines[r];
    float mx = -INFINITY, s = 0.0f, sum_logp = 0.0f;
    for (int j = 0; j < D; j++) mx = fmaxf(mx, l[j]);
    for (int j = 0; j < D; j++) s += expf(l[j] - mx);
    float lse = mx + logf(s), rcp = 1.0f / s;
    for (int j = 0; j < D; j++) {
      assert_int_equal(tu_bits(ys[r * D + j]), tu_bits(expf(l[j] - mx) * rcp));
      assert_int_equal(tu_bits(yl[r * D + j]), tu_bits(l[j] - lse));
      sum_logp += l[j] - lse;
    }
    float ce_ref = -(1.0f - 0.25f) * (l[tg[r]] - lse) - 0.25f / (float)D * sum_logp;
    assert_int_equal(tu_bits(yc[r]), tu_bits(ce_ref));
  }
  apex_var_destroy(x);
  apex_graph_destroy(g);
}

/* Bad input still gets its message from the fronts that no longer widen: a bf16 probability out of
 * [0, 1] for BCE is named with its element. */
static void test_bce_refuses_bf16_out_of_range(void **state) {
  (void)state;
  apex_graph *g = apex_graph_create();
  int64_t n = 3000;
  apex_tensor *p = apex_tensor_create(APEX_BF16, 1, &n), *t = apex_tensor_create(APEX_BF16, 1, &n);
  for (int64_t i = 0; i < n; i++) apex_tensor_set(p, (size_t)i, 0.5f), apex_tensor_set(t, (size_t)i, 1.0f);
  apex_tensor_set(p, 2500, 1.5f);
  apex_var *pv = apex_var_create(p, 0), *tv = apex_var_create(t, 0);
  assert_null(apex_bce(g, pv, tv, APEX_REDUCTION_MEAN));
  tu_assert_message("input element 2500");
  tu_assert_message("must be in [0, 1]");
  apex_var_destroy(pv);
  apex_var_destroy(tv);
  apex_graph_destroy(g);
}

static int setup(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof xent_targets / sizeof xent_targets[0]; i++) xent_targets[i] = (int64_t)((i * 37) % 310);
  xent_targets[5] = 3; /* the ignored class of f_xent: its row has no term and no gradient */
  pg = apex_pg_create_local();
  return pg ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  apex_pg_destroy(pg);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cases),
      cmocka_unit_test(test_batch_norm_bf16_special),
      cmocka_unit_test(test_autocast_float_ops_uncast),
      cmocka_unit_test(test_softmax_special_lines),
      cmocka_unit_test(test_bce_refuses_bf16_out_of_range),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
