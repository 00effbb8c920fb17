/* ops_classifier.c: a language model's classifier as one op, apex_linear_cross_entropy: the logits
 * x w^T of a head without bias (GPT's tied head reads the embedding table w where it is), their
 * cross entropy against the targets, reduced, and the logits' gradient, either written over the logits
 * by the forward's loss kernel (one pass, llm.c's fused classifier: on a GPU by default) or made in the
 * backward a chunk of rows at a time (two passes), and consumed at once by the head's products.
 *
 * One pass: the gradient is made for a loss gradient of 1, before the real one (a loss scale, on the
 * device) is known, and the backward's products take the real one as their alpha (nn_linear_bwd's
 * gout_scale). The logits go through memory once each way, the backward is two products over all the
 * rows, and nothing is allocated for the gradient.
 *
 * What it saves against apex_linear, a cast to f32 and apex_cross_entropy: the logits stay in the
 * product's dtype (the cross entropy slot widens a row at a time, so no f32 copy is ever made), and
 * their f32 gradient, [N, V] floats for N rows of a V-word vocabulary (1.6 GB for GPT-2 small at
 * B 8, T 1024), is never whole: each chunk of rows gets it from the cross entropy's backward and hands
 * it straight to the linear's. The kernels are the backend's own slots, so the op runs wherever
 * nn_linear and nn_cross_entropy do.
 *
 * Bits: the forward is the linear and the cross entropy of the unfused ops. With one chunk the backward
 * is theirs too; with several, each chunk's weight-gradient product adds into the last one's (beta 1),
 * so the weight gradient is summed in another order (a few f32 ulps of its largest element), and a
 * chunk's input-gradient rows come from a product of fewer rows (the same sums on the CPU's tile grid
 * where a row's tile does not depend on m; within the product's own bound elsewhere). */
#include "autograd/ag.h"

/* The default chunk: as many rows as keep their f32 gradient within 32 MiB on the CPU (whose products run
 * as fast on a few hundred rows as on thousands, and whose memory is the training run's), 256 MiB on a
 * device (where each chunk is a few kernel launches: GPT-2 small at B 8, T 1024 makes 7 chunks of 1,334
 * rows), at least one row. */
#define CHUNK_BYTES_CPU ((size_t)32 << 20)
#define CHUNK_BYTES_DEVICE ((size_t)256 << 20)

/* Whether the forward writes the logits' gradient (apex_cross_entropy_options.one_pass): asked (1, -1), or
 * by default where it pays and keeps the bits that matter. A GPU's step gains a read of the logits and
 * the backward's chunking (each chunk's weight-gradient product reads and writes the whole f32 [V, C]
 * gradient: 7 times for GPT-2 small at B 8); the CPU keeps its f32 gradient and its bits. f16 never: see
 * nn_ops.h. */
static int one_pass(const apex_graph *g, int asked, apex_dtype dt) {
  if (asked) return asked == 1;
  return g->be->device != APEX_DEVICE_CPU && dt != APEX_F16;
}

/* apex_linear_cross_entropy and _index: targets from the host array or the index (apex__ce_targets). */
static apex_var *linear_cross_entropy_of(apex_graph *g, apex_var *x, apex_var *w, const int64_t *targets, const apex_index *ix,
                                         const apex_cross_entropy_options *opts, int64_t chunk_rows) {
  static const apex_cross_entropy_options defaults = {0};
  const apex_op op = APEX_OP_LINEAR_CROSS_ENTROPY;
  if (!opts) opts = &defaults;
  if (opts->reduction != APEX_REDUCTION_MEAN && opts->reduction != APEX_REDUCTION_SUM)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "linear_cross_entropy: reduction %d: give APEX_REDUCTION_MEAN or SUM (for per-row "
                           "terms use apex_linear and apex_cross_entropy)", (int)opts->reduction);
  if (chunk_rows < 0)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "linear_cross_entropy: chunk_rows %lld; give >= 1, or 0 for the default", (long long)chunk_rows);
  if (opts->one_pass < -1 || opts->one_pass > 1)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "linear_cross_entropy: one_pass %d; give 1 (on), -1 (off) or 0 (the default)",
                           opts->one_pass);
  apex_var *in[2] = {x, w}, *u[2];
  apex_dtype dt;
  if (apex__dispatch(g, op, 2, in, 0, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value, *W = u[1]->value;
  if (X->ndim != 2 || W->ndim != 2 || X->shape[1] != W->shape[1])
    return apex__fail_null(APEX_ERR_SHAPE, "linear_cross_entropy: input %s, weight %s do not fit (need x [N, C], w [V, C])", apex__shape(x),
                           apex__shape(w));
  size_t N = (size_t)X->shape[0], V = (size_t)W->shape[0], C = (size_t)X->shape[1];
  if (N > (size_t)INT32_MAX || V > (size_t)INT32_MAX || C > (size_t)INT32_MAX)
    return apex__fail_null(APEX_ERR_SHAPE, "linear_cross_entropy: input %s, weight %s: each extent must be below 2^31", apex__shape(x),
                           apex__shape(w));
  if (opts->one_pass == 1 && dt == APEX_F16)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "linear_cross_entropy: one_pass 1 with f16 logits: their gradient would be made "
                           "before its loss scale, below f16's range; leave one_pass 0 (two passes for f16) or use bf16");
  int64_t count = 0;
  int64_t *tg = apex__ce_targets(g, targets, ix, N, V, opts, ix ? "linear_cross_entropy_index" : "linear_cross_entropy", x, &count);
  if (!tg) return NULL;
  const apex_backend *be = apex__ag_backend(u[0], op);
  if (!be || !AG_HAS(be, nn_linear, op) || !AG_HAS(be, nn_cross_entropy, op)) return NULL;
  apex_var *out = apex__result(g, op, APEX_F32, 0, NULL, 2, u);
  if (!out) return NULL;
  /* the logits in the product's dtype: kept after the targets and statistics when the op is recorded,
   * transient otherwise */
  size_t lbytes = ag_nz(N * V) * apex_dtype_size(dt);
  void *logits = out->requires_grad ? apex__scratch(g, lbytes) : apex__scratch_temp(g, lbytes);
  float *terms = apex__scratch_temp(g, ag_nz(N) * sizeof(float));
  if (!logits || !terms) return NULL;
  out->aux = tg;
  out->p.classifier.logits = logits;
  out->p.classifier.dtype = dt;
  out->p.classifier.rows = (int64_t)N;
  out->p.classifier.classes = (int64_t)V;
  out->p.classifier.count = count;
  out->p.classifier.smoothing = opts->label_smoothing;
  out->p.classifier.reduction = opts->reduction;
  out->p.classifier.one_pass = out->requires_grad && one_pass(g, opts->one_pass, dt);
  size_t chunk_bytes = g->be->device == APEX_DEVICE_CPU ? CHUNK_BYTES_CPU : CHUNK_BYTES_DEVICE;
  out->p.classifier.chunk_rows = chunk_rows ? chunk_rows : (int64_t)(chunk_bytes / (ag_nz(V) * sizeof(float)));
  if (out->p.classifier.chunk_rows < 1) out->p.classifier.chunk_rows = 1;
  apex_status st = be->nn_linear(&(apex_nn_linear_args){.m = (int)N, .n = (int)V, .k = (int)C, .x = ag_buf(X), .w = ag_buf(W),
                                                        .bias = {NULL, APEX_F32}, .out = logits, .out_dtype = dt,
                                                        .ws = apex__ag_workspace(g)});
  if (st == APEX_OK)
    st = be->nn_cross_entropy(&(apex_nn_cross_entropy_args){
        .rows = N, .classes = V, .x = {logits, dt}, .target = tg, .smoothing = opts->label_smoothing, .stats = (float *)(tg + N),
        .loss = terms, .result = apex_tensor_data(out->value), .result_dtype = APEX_F32,
        .divisor = opts->reduction == APEX_REDUCTION_MEAN ? (double)count : 1.0, .gx = out->p.classifier.one_pass ? logits : NULL,
        .ws = apex__ag_workspace(g)});
  return st == APEX_OK ? out : NULL;
}

apex_var *apex_linear_cross_entropy(apex_graph *g, apex_var *x, apex_var *w, const int64_t *targets,
                                    const apex_cross_entropy_options *opts, int64_t chunk_rows) {
  return linear_cross_entropy_of(g, x, w, targets, NULL, opts, chunk_rows);
}

apex_var *apex_linear_cross_entropy_index(apex_graph *g, apex_var *x, apex_var *w, const apex_index *targets,
                                          const apex_cross_entropy_options *opts, int64_t chunk_rows) {
  if (!targets) return apex__fail_null(APEX_ERR_INVALID_ARG, "linear_cross_entropy_index: NULL index");
  return linear_cross_entropy_of(g, x, w, NULL, targets, opts, chunk_rows);
}

/* One pass: the head's products on the gradient the forward left in the logits. Two passes, per chunk of
 * rows: the logits' f32 gradient (the cross entropy's backward, stored fresh), then the
 * head's products from it: the chunk's rows of gx (written once each) and gw (the first chunk writes,
 * the rest add). */
apex_status apex__bwd_linear_cross_entropy(apex_graph *g, apex_var *out) {
  const apex_op op = APEX_OP_LINEAR_CROSS_ENTROPY;
  const apex_backend *be = apex__ag_backend(out, op);
  if (!be || !AG_HAS(be, nn_cross_entropy_bwd, op) || !AG_HAS(be, nn_linear_bwd, op)) return apex_last_status();
  const apex_tensor *X = out->in[0]->value, *W = out->in[1]->value;
  const size_t N = (size_t)out->p.classifier.rows, V = (size_t)out->p.classifier.classes, C = (size_t)X->shape[1];
  const size_t R = (size_t)out->p.classifier.chunk_rows;
  const apex_dtype dt = out->p.classifier.dtype;
  const size_t es = apex_dtype_size(dt), xs = apex_dtype_size(X->dtype);
  const int64_t *tg = out->aux;
  const float *stats = (const float *)(tg + N);
  int fresh_x = 0, fresh_w = 0;
  apex_dtype tx;
  char *gx = apex__gbuf_w_any(g, out->in[0], &fresh_x, &tx);
  float *gw = apex__gbuf_w(g, out->in[1], &fresh_w);
  if (!gx && !gw) return APEX_OK;
  if (out->p.classifier.one_pass) /* the logits hold their gradient for 1: one product each, scaled by out's */
    return be->nn_linear_bwd(&(apex_nn_linear_bwd_args){
        .m = (int)N, .n = (int)V, .k = (int)C, .x = ag_buf(X), .w = ag_buf(W), .gout = out->p.classifier.logits, .gout_dtype = dt,
        .gout_scale = out->gbuf, .gx = gx, .gx_dtype = tx, .gw = gw, .accumulate_x = !fresh_x, .accumulate_w = !fresh_w,
        .ws = apex__ag_workspace(g)});
  const size_t gs = apex_dtype_size(tx);
  /* the chunk's gradient lives until the graph's reset, so that the slots' transient scratch can go back
   * to the pool after each chunk (it would otherwise pile up, chunk after chunk, until the next op) */
  /* with half gradients the logits' gradient is rounded to their dtype, as the gradient of a separate
   * logits value would be (and the head's products then read it as stored) */
  const apex_dtype lt = tx == APEX_F32 ? APEX_F32 : dt;
  void *gl = apex__scratch(g, ag_nz((R < N ? R : N) * V) * apex_dtype_size(lt));
  if (!gl) return apex_last_status();
  const char *logits = out->p.classifier.logits, *xd = apex_tensor_data(X);
  for (size_t r0 = 0; r0 < N; r0 += R) {
    size_t rows = N - r0 < R ? N - r0 : R;
    apex_status st = be->nn_cross_entropy_bwd(&(apex_nn_cross_entropy_bwd_args){
        .rows = rows, .classes = V, .x = {logits + r0 * V * es, dt}, .stats = stats + 2 * r0, .target = tg + r0,
        .smoothing = out->p.classifier.smoothing,
        .reduction = out->p.classifier.reduction == APEX_REDUCTION_SUM ? APEX_NN_SUM : APEX_NN_MEAN,
        .count = (double)out->p.classifier.count, .gout = out->gbuf, .gx = gl, .gx_dtype = lt, .accumulate_x = 0, .ws = apex__ag_workspace(g)});
    if (st == APEX_OK)
      st = be->nn_linear_bwd(&(apex_nn_linear_bwd_args){
          .m = (int)rows, .n = (int)V, .k = (int)C, .x = {xd + r0 * C * xs, X->dtype}, .w = ag_buf(W), .gout = gl, .gout_dtype = lt,
          .gx = gx ? gx + r0 * C * gs : NULL, .gx_dtype = tx, .gw = gw, .gb = NULL, .accumulate_x = !fresh_x, .accumulate_w = !fresh_w || r0 > 0,
          .accumulate_b = 1, .ws = apex__ag_workspace(g)});
    if (st != APEX_OK) return st;
    apex__release_temps(g);
  }
  return APEX_OK;
}
