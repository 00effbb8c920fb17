/* ops_norm.c: batch norm (training and evaluation, running statistics; with a statistics hook, the
 * SyncBatchNorm op), layer norm and RMS norm.
 *
 * Statistics are per channel (batch norm) or per row (layer/RMS norm: a row is the normalised last
 * dimensions, flattened), each summed by one thread in a fixed order: batch norm's in the f32-block,
 * f64-total lanes of ag.h, the row norms' in double. The weight and bias
 * gradients of the row norms are column sums of an [rows, D] product, done by apex__colsum_add in
 * row order. */
#include <math.h>
#include <omp.h>

#include "apex/threads.h"

#include "autograd/ag.h"

/* ---- batch norm --------------------------------------------------------------------------------- */

/* A channel's sums run over its N planes of S in the lanes of ag.h (vectorised, f32 blocks into f64,
 * the same bits on any thread). Every pass over a channel prefetches its next plane
 * (ag_prefetch_plane). */
static void lanes_sq(double acc[APEX__LANES], const float *restrict x, size_t n, float mean) {
  for (size_t b0 = 0; b0 < n; b0 += APEX__LANE_BLOCK) {
    size_t e = n - b0 < APEX__LANE_BLOCK ? n : b0 + APEX__LANE_BLOCK, i = b0;
    float f[APEX__LANES] = {0};
#if APEX__LANE_VEC
    apex__v4 a = {0}, b = {0}, c = {0}, d = {0};
    for (; i + APEX__LANES <= e; i += APEX__LANES) {
      apex__v4 d0 = apex__ld4(x + i) - mean, d1 = apex__ld4(x + i + 4) - mean, d2 = apex__ld4(x + i + 8) - mean, d3 = apex__ld4(x + i + 12) - mean;
      a += d0 * d0;
      b += d1 * d1;
      c += d2 * d2;
      d += d3 * d3;
    }
    apex__st16(f, a, b, c, d);
#else
    for (; i + APEX__LANES <= e; i += APEX__LANES)
      for (int l = 0; l < APEX__LANES; l++) {
        float d = x[i + l] - mean;
        f[l] += d * d;
      }
#endif
    for (size_t l = 0; i + l < e; l++) f[l] += (x[i + l] - mean) * (x[i + l] - mean);
    for (int l = 0; l < APEX__LANES; l++) acc[l] += f[l];
  }
}

/* sum of go and of go * (x - m) * r over one plane. */
static void lanes_bwd(double sg[APEX__LANES], double sgx[APEX__LANES], const float *restrict go, const float *restrict x, size_t n, float m, float r) {
  for (size_t b0 = 0; b0 < n; b0 += APEX__LANE_BLOCK) {
    size_t e = n - b0 < APEX__LANE_BLOCK ? n : b0 + APEX__LANE_BLOCK, i = b0;
    float f[APEX__LANES] = {0}, h[APEX__LANES] = {0};
#if APEX__LANE_VEC
    apex__v4 f0 = {0}, f1 = {0}, f2 = {0}, f3 = {0}, h0 = {0}, h1 = {0}, h2 = {0}, h3 = {0};
    for (; i + APEX__LANES <= e; i += APEX__LANES) {
      apex__v4 g0 = apex__ld4(go + i), g1 = apex__ld4(go + i + 4), g2 = apex__ld4(go + i + 8), g3 = apex__ld4(go + i + 12);
      f0 += g0;
      f1 += g1;
      f2 += g2;
      f3 += g3;
      h0 += g0 * (apex__ld4(x + i) - m) * r;
      h1 += g1 * (apex__ld4(x + i + 4) - m) * r;
      h2 += g2 * (apex__ld4(x + i + 8) - m) * r;
      h3 += g3 * (apex__ld4(x + i + 12) - m) * r;
    }
    apex__st16(f, f0, f1, f2, f3);
    apex__st16(h, h0, h1, h2, h3);
#else
    for (; i + APEX__LANES <= e; i += APEX__LANES)
      for (int l = 0; l < APEX__LANES; l++) {
        f[l] += go[i + l];
        h[l] += go[i + l] * (x[i + l] - m) * r;
      }
#endif
    for (size_t l = 0; i + l < e; l++) {
      f[l] += go[i + l];
      h[l] += go[i + l] * (x[i + l] - m) * r;
    }
    for (int l = 0; l < APEX__LANES; l++) {
      sg[l] += f[l];
      sgx[l] += h[l];
    }
  }
}

/* Both batch norms: the plain op (statistics of this batch, or the running ones in evaluation) and,
 * with a hook, the op whose statistics the hook computes over a larger batch (SyncBatchNorm). They
 * share the checks, the pool scratch of the statistics (aux: mean[C], rstd[C] as used) and the
 * normalisation; the hooked one takes its running-statistic update from the hook's f32 values. */
static apex_var *batch_norm(apex_graph *g, const apex__bn_stats_hook *hook, apex_var *x, apex_var *weight, apex_var *bias,
                            apex_tensor *running_mean, apex_tensor *running_var, const apex_batch_norm_options *opts) {
  static const apex_batch_norm_options defaults = {0};
  if (!opts) opts = &defaults;
  apex_op op = hook ? APEX_OP_SYNC_BATCH_NORM : APEX_OP_BATCH_NORM;
  const char *name = apex_op_name(op);
  if (hook && opts->relu) return apex__fail_null(APEX_ERR_UNSUPPORTED, "%s: relu is not fused here; apply apex_relu to the result", name);
  apex_var *in[3] = {x, weight, bias}, *u[3];
  apex_dtype dt;
  /* the fused op casts as batch norm does (and follows any override of batch norm's category) */
  if (apex__dispatch(g, op, 3, in, 6u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value;
  dt = X->dtype; /* the input's type, whatever the parameters' (f32 under keep_batchnorm_fp32) */
  if (X->ndim < 2 || X->ndim > 4)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s must be [N, C], [N, C, L] or [N, C, H, W]", name, apex__shape(x));
  int64_t Ci = X->shape[1];
  size_t N = (size_t)X->shape[0], C = (size_t)Ci, S = X->numel / ag_nz(N * C), M = N * S;
  const apex_tensor *stats[2] = {running_mean, running_var};
  for (int i = 0; i < 3; i++)
    if (i && u[i] && (u[i]->value->ndim != 1 || (size_t)u[i]->value->shape[0] != C))
      return apex__fail_null(APEX_ERR_SHAPE, "%s: %s %s does not match the %zu channels of input %s", name, i == 1 ? "weight" : "bias",
                             apex__shape(in[i]), C, apex__shape(x));
  for (int i = 0; i < 2; i++) {
    if (!stats[i]) continue;
    char buf[64];
    if (stats[i]->dtype != APEX_F32)
      return apex__fail_null(APEX_ERR_DTYPE, "%s: %s is %s; running statistics are f32", name, i ? "running_var" : "running_mean",
                             apex_dtype_name(stats[i]->dtype));
    if (stats[i]->numel != C)
      return apex__fail_null(APEX_ERR_SHAPE, "%s: %s %s does not match the %zu channels of input %s", name, i ? "running_var" : "running_mean",
                             apex_tensor_shape_str(stats[i], buf, sizeof buf), C, apex__shape(x));
  }
  /* The hook always normalises with batch statistics (its count over the whole batch is checked there). */
  int training = hook || opts->training;
  if (!training && (!running_mean || !running_var))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: evaluation of %s needs running_mean and running_var", name, apex__shape(x));
  if (!hook && training && M <= 1)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: training needs more than one value per channel; input %s has %zu", name, apex__shape(x), M);
  float mom = 0.0f, eps = 0.0f;
  if (apex__bn_options(opts, name, &mom, &eps) != APEX_OK) return NULL;
  const float *mf = NULL, *rf = NULL, *vf = NULL;
  int64_t count = (int64_t)M;
  if (hook) {
    apex_tensor *mean = apex__pool_tensor(g, APEX_F32, 1, &Ci), *invstd = apex__pool_tensor(g, APEX_F32, 1, &Ci);
    apex_tensor *uvar = apex__pool_tensor(g, APEX_F32, 1, &Ci);
    if (!mean || !invstd || !uvar) return NULL;
    if (hook->stats(hook->ctx, X, mean, invstd, uvar, eps, &count) != APEX_OK) return NULL;
    mf = ag_data(mean);
    rf = ag_data(invstd);
    vf = ag_data(uvar);
  }
  apex_var *out = apex__result(g, hook ? op : opts->relu ? APEX_OP_BATCH_NORM_RELU : APEX_OP_BATCH_NORM, dt, X->ndim, X->shape, 3, u);
  if (!out) return NULL;
  const float *xf = apex__f32(g, X), *wf = u[1] ? apex__f32(g, u[1]->value) : NULL, *bf = u[2] ? apex__f32(g, u[2]->value) : NULL;
  float *o = apex__out_f32(g, out), *st = apex__scratch(g, 2 * C * sizeof(float));
  if (!xf || !o || !st || (u[1] && !wf) || (u[2] && !bf)) return NULL;
  float *rm = running_mean ? ag_data(running_mean) : NULL, *rv = running_var ? ag_data(running_var) : NULL;
  out->aux = st;
  out->p.bn.training = training;
  out->p.bn.channels = (int64_t)C;
  out->p.bn.plane = (int64_t)S;
  out->p.bn.count = count;
  if (hook) out->p.bn.hook = *hook;
  if (hook) {
    /* The hook's statistics as they are; its f32 values update the running ones. */
#pragma omp parallel for schedule(static) if (X->numel > AG_PAR_MIN)
    for (size_t c = 0; c < C; c++) {
      if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mf[c]);
      if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * vf[c]);
      st[c] = mf[c];
      st[C + c] = rf[c];
      apex__bn_normalize_channel(xf, o, N, C, S, c, mf[c], rf[c], wf ? wf[c] : 1.0f, bf ? bf[c] : 0.0f, 0);
    }
    apex__store(out, o);
    return out;
  }
#pragma omp parallel for schedule(static) if (X->numel > AG_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    double mean, var;
    if (training) {
      double sa[APEX__LANES] = {0}, qa[APEX__LANES] = {0};
      for (size_t n = 0; n < N; n++) {
        ag_prefetch_plane(xf, N, C, S, n, c, 0);
        apex__lanes_add(sa, xf + (n * C + c) * S, S);
      }
      mean = apex__lanes_total(sa) / (double)M;
      for (size_t n = 0; n < N; n++) {
        ag_prefetch_plane(xf, N, C, S, n, c, 0);
        lanes_sq(qa, xf + (n * C + c) * S, S, (float)mean);
      }
      double q = apex__lanes_total(qa);
      var = q / (double)M;
      if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mean);
      if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * q / (double)(M - 1));
    } else {
      mean = rm[c];
      var = rv[c];
    }
    float m = (float)mean, r = (float)(1.0 / sqrt(var + eps)), w = wf ? wf[c] : 1.0f, b = bf ? bf[c] : 0.0f;
    st[c] = m;
    st[C + c] = r;
    apex__bn_normalize_channel(xf, o, N, C, S, c, m, r, w, b, opts->relu);
  }
  apex__store(out, o);
  return out;
}

apex_var *apex_batch_norm(apex_graph *g, apex_var *x, apex_var *weight, apex_var *bias, apex_tensor *running_mean,
                          apex_tensor *running_var, const apex_batch_norm_options *opts) {
  return batch_norm(g, NULL, x, weight, bias, running_mean, running_var, opts);
}

apex_var *apex__batch_norm_hooked(apex_graph *g, const apex__bn_stats_hook *hook, apex_var *x, apex_var *weight, apex_var *bias,
                                  apex_tensor *running_mean, apex_tensor *running_var, const apex_batch_norm_options *opts) {
  if (!hook || !hook->stats || !hook->reduce)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "sync_batch_norm: no statistics hook; the caller must give both of its functions");
  return batch_norm(g, hook, x, weight, bias, running_mean, running_var, opts);
}

/* The fused op's gradient at its batch norm output, one plane: go where the output is non-zero
 * (it is +0 or the positive value itself, never -0 or NaN); 0 + go as relu's backward writes it into
 * fresh zeros, so the bits are those of the unfused ops. An f32 output is non-zero exactly where the
 * forward's apex__bn_affine of the input was > 0, and the input's plane is read here anyway, so the
 * output is not read (12.8 MB less from memory for the benchmark CNN's first batch norm); a half
 * output may have rounded to zero, so its raw bits are tested instead. */
static void relu_mask_plane(float *restrict gm, const float *restrict go, const float *restrict x, const apex_var *out, size_t off, size_t S,
                            float m, float r, float w, float bias) {
  const uint16_t *restrict y = out->value->dtype == APEX_F32 ? NULL : (const uint16_t *)apex_tensor_data(out->value) + off;
  for (size_t i = 0; i < S; i++) {
    float v = go[off + i] + 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= -(uint32_t)(y ? y[i] != 0 : apex__bn_affine(x[off + i], m, r, w, bias) > 0.0f);
    memcpy(gm + i, &b, sizeof b);
  }
}

/* The batch norm backward reads its gradient twice per channel: once for the sums, once for the
 * input's gradient. The fused op masks each plane once, in the first pass, into a per-thread copy of
 * the channel's gradient (N * S floats, which stays in cache for the second pass), so its output is
 * read once. */
apex_status apex__bwd_batch_norm(apex_graph *g, apex_var *out) {
  int fresh;
  float *gx = apex__gbuf_w(g, out->in[0], &fresh), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  size_t C = (size_t)out->p.bn.channels, S = (size_t)out->p.bn.plane, N = ag_numel(out) / ag_nz(C * S), M = N * S;
  int training = out->p.bn.training, fused = out->op == APEX_OP_BATCH_NORM_RELU;
  int par = ag_numel(out) > AG_PAR_MIN, nt = par ? apex_get_num_threads() : 1;
  const float *xf = apex__f32(g, out->in[0]->value), *wf = out->in[1] ? apex__f32(g, out->in[1]->value) : NULL;
  const float *bf = fused && out->in[2] ? apex__f32(g, out->in[2]->value) : NULL;
  const float *st = out->aux, *go = out->gbuf;
  float *gms = fused ? apex__scratch_temp(g, (size_t)nt * ag_nz(M) * sizeof(float)) : NULL;
  if (!xf || (out->in[1] && !wf) || (fused && (!gms || (out->in[2] && !bf)))) return APEX_ERR_OUT_OF_MEMORY;
  size_t ysize = apex_dtype_size(out->value->dtype);
  int read_y = out->value->dtype != APEX_F32;
#pragma omp parallel for schedule(static) if (par)
  for (size_t c = 0; c < C; c++) {
    float m = st[c], r = st[C + c], w = wf ? wf[c] : 1.0f, bias = bf ? bf[c] : 0.0f, *gm = fused ? gms + (size_t)omp_get_thread_num() * M : NULL;
    double sga[APEX__LANES] = {0}, sgxa[APEX__LANES] = {0};
    for (size_t n = 0; n < N; n++) {
      size_t off = (n * C + c) * S;
      ag_prefetch_plane(go, N, C, S, n, c, 0);
      ag_prefetch_plane(xf, N, C, S, n, c, 0);
      if (fused) {
        if (read_y) ag_prefetch_plane_of(apex_tensor_data(out->value), ysize, N, C, S, n, c, 0);
        relu_mask_plane(gm + n * S, go, xf, out, off, S, m, r, w, bias);
      }
      lanes_bwd(sga, sgxa, fused ? gm + n * S : go + off, xf + off, S, m, r);
    }
    double sg = apex__lanes_total(sga), sgx = apex__lanes_total(sgxa);
    if (gw) gw[c] += (float)sgx;
    if (gb) gb[c] += (float)sg;
    if (!gx) continue;
    float a = w * r, mg = training ? (float)(sg / (double)M) : 0.0f, mgx = training ? (float)(sgx / (double)M) : 0.0f;
    for (size_t n = 0; n < N; n++) {
      size_t off = (n * C + c) * S;
      const float *restrict gop = fused ? gm + n * S : go + off, *restrict xp = xf + off;
      float *restrict gxp = gx + off;
      if (!fused) ag_prefetch_plane(go, N, C, S, n, c, 0);
      ag_prefetch_plane(xf, N, C, S, n, c, 0);
      ag_prefetch_plane(gx, N, C, S, n, c, 1);
      if (fresh)
        for (size_t i = 0; i < S; i++) gxp[i] = 0.0f + a * (gop[i] - mg - (xp[i] - m) * r * mgx);
      else
        for (size_t i = 0; i < S; i++) gxp[i] += a * (gop[i] - mg - (xp[i] - m) * r * mgx);
    }
  }
  return APEX_OK;
}

/* The hooked op's backward: per-channel sums of dy and dy * xhat over this process's batch (f64, in
 * order), added to the weight and bias gradients as this process's share (data parallelism sums or
 * averages the shares), then reduced by the hook to the whole batch's sums, from which the input's
 * gradient follows as for one big batch of p.bn.count values per channel. */
apex_status apex__bwd_sync_batch_norm(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  size_t C = (size_t)out->p.bn.channels, S = (size_t)out->p.bn.plane, N = ag_numel(out) / ag_nz(C * S);
  const apex__bn_stats_hook *hook = &out->p.bn.hook;
  const float *xf = apex__f32(g, out->in[0]->value), *wf = out->in[1] ? apex__f32(g, out->in[1]->value) : NULL;
  const float *mf = out->aux, *rf = mf + C, *go = out->gbuf;
  int64_t two_c = (int64_t)(2 * C);
  apex_tensor *sums = apex__pool_tensor(g, APEX_F32, 1, &two_c);
  if (!xf || (out->in[1] && !wf) || !sums) return APEX_ERR_OUT_OF_MEMORY;
  float *sd = ag_data(sums);
#pragma omp parallel for schedule(static) if (ag_numel(out) > AG_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    double sg = 0, sgx = 0;
    for (size_t n = 0; n < N; n++)
      for (size_t i = 0; i < S; i++) {
        size_t j = (n * C + c) * S + i;
        sg += go[j];
        sgx += go[j] * (xf[j] - mf[c]) * rf[c];
      }
    sd[c] = (float)sg;
    sd[C + c] = (float)sgx;
    if (gb) gb[c] += (float)sg;
    if (gw) gw[c] += (float)sgx;
  }
  if (!gx) return APEX_OK; /* the input needs no gradient in any process (the same graph everywhere) */
  apex_status st = hook->reduce(hook->ctx, sums);
  if (st != APEX_OK) return st;
  float inv_total = 1.0f / (float)out->p.bn.count;
#pragma omp parallel for schedule(static) if (ag_numel(out) > AG_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    float m = mf[c], r = rf[c], a = (wf ? wf[c] : 1.0f) * r, mg = sd[c] * inv_total, mgx = sd[C + c] * inv_total;
    for (size_t n = 0; n < N; n++)
      for (size_t i = 0; i < S; i++) {
        size_t j = (n * C + c) * S + i;
        gx[j] += a * (go[j] - mg - (xf[j] - m) * r * mgx);
      }
  }
  return APEX_OK;
}

/* ---- layer norm and RMS norm -------------------------------------------------------------------- */

/* 1 when t has shape [ns...] (nn dims). */
static int has_shape(const apex_tensor *t, int nn, const int64_t *ns) {
  if (t->ndim != nn) return 0;
  for (int i = 0; i < nn; i++)
    if (t->shape[i] != ns[i]) return 0;
  return 1;
}

/* One op for both: layer norm centres and has a bias; RMS norm does neither. Each row is the last
 * nn dimensions of x flattened (PyTorch's normalized_shape), so weight and bias, of that shape and
 * contiguous, index the row as a flat [D]; ns NULL means x's own last nn dimensions. */
static apex_var *row_norm(apex_graph *g, apex_op op, apex_var *x, int nn, const int64_t *ns, apex_var *weight, apex_var *bias, float eps) {
  apex_var *in[3] = {x, weight, bias}, *u[3];
  apex_dtype dt;
  const char *name = apex_op_name(op);
  int n_in = op == APEX_OP_LAYER_NORM ? 3 : 2;
  if (apex__dispatch(g, op, n_in, in, 6u, u, &dt) != APEX_OK) return NULL;
  if (n_in == 2) u[2] = NULL;
  const apex_tensor *X = u[0]->value;
  if (nn < 1 || nn > X->ndim)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: normalized_shape of %d dimensions for input %s (need 1 to %d)", name, nn, apex__shape(x), X->ndim);
  const int64_t *tail = X->shape + X->ndim - nn;
  if (!ns) ns = tail;
  if (memcmp(ns, tail, (size_t)nn * sizeof *ns))
    return apex__fail_null(APEX_ERR_SHAPE, "%s: normalized_shape %s does not match the last %d dimensions of input %s", name,
                           apex__shape_of(nn, ns), nn, apex__shape(x));
  size_t D = 1;
  for (int i = 0; i < nn; i++) D *= (size_t)ns[i];
  size_t R = X->numel / ag_nz(D);
  for (int i = 1; i < 3; i++)
    if (u[i] && !has_shape(u[i]->value, nn, ns))
      return apex__fail_null(APEX_ERR_SHAPE, "%s: %s %s does not match normalized_shape %s of input %s", name, i == 1 ? "weight" : "bias",
                             apex__shape(in[i]), apex__shape_of(nn, ns), apex__shape(x));
  if (eps == 0.0f) eps = 1e-5f;
  apex_var *out = apex__result(g, op, dt, X->ndim, X->shape, n_in, u);
  if (!out) return NULL;
  const float *xf = apex__f32(g, X), *wf = u[1] ? apex__f32(g, u[1]->value) : NULL, *bf = u[2] ? apex__f32(g, u[2]->value) : NULL;
  float *o = apex__out_f32(g, out), *st = apex__scratch(g, ag_nz(2 * R) * sizeof(float));
  if (!xf || !o || !st || (u[1] && !wf) || (u[2] && !bf)) return NULL;
  int centre = op == APEX_OP_LAYER_NORM;
  out->aux = st;
  out->p.row_norm.rows = (int64_t)R;
  out->p.row_norm.cols = (int64_t)D;
#pragma omp parallel for schedule(static) if (X->numel > AG_PAR_MIN)
  for (size_t r = 0; r < R; r++) {
    const float *xr = xf + r * D;
    double mean = centre ? apex__sum_serial(xr, D) / (double)D : 0.0, q = 0;
    for (size_t j = 0; j < D; j++) q += (xr[j] - mean) * (xr[j] - mean);
    float m = (float)mean, rs = (float)(1.0 / sqrt(q / (double)D + eps));
    st[r] = m;
    st[R + r] = rs;
    float *orow = o + r * D;
    for (size_t j = 0; j < D; j++) orow[j] = (xr[j] - m) * rs * (wf ? wf[j] : 1.0f) + (bf ? bf[j] : 0.0f);
  }
  apex__store(out, o);
  return out;
}

apex_var *apex_layer_norm(apex_graph *g, apex_var *x, apex_var *w, apex_var *b, float eps) {
  return row_norm(g, APEX_OP_LAYER_NORM, x, 1, NULL, w, b, eps);
}
apex_var *apex_rms_norm(apex_graph *g, apex_var *x, apex_var *w, float eps) { return row_norm(g, APEX_OP_RMS_NORM, x, 1, NULL, w, NULL, eps); }

/* The _nd forms take normalized_shape explicitly, as PyTorch does, so that a mismatch with x is an
 * error rather than a silently different normalisation. */
static apex_var *row_norm_nd(apex_graph *g, apex_op op, apex_var *x, int nn, const int64_t *ns, apex_var *w, apex_var *b, float eps) {
  if (!ns) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL normalized_shape", apex_op_name(op));
  return row_norm(g, op, x, nn, ns, w, b, eps);
}
apex_var *apex_layer_norm_nd(apex_graph *g, apex_var *x, int norm_ndim, const int64_t *normalized_shape, apex_var *w, apex_var *b, float eps) {
  return row_norm_nd(g, APEX_OP_LAYER_NORM, x, norm_ndim, normalized_shape, w, b, eps);
}
apex_var *apex_rms_norm_nd(apex_graph *g, apex_var *x, int norm_ndim, const int64_t *normalized_shape, apex_var *w, float eps) {
  return row_norm_nd(g, APEX_OP_RMS_NORM, x, norm_ndim, normalized_shape, w, NULL, eps);
}

static apex_status row_norm_bwd(apex_graph *g, apex_var *out) {
  size_t R = (size_t)out->p.row_norm.rows, D = (size_t)out->p.row_norm.cols;
  int centre = out->op == APEX_OP_LAYER_NORM;
  float *gx = apex__gbuf(g, out->in[0]), *gw = apex__gbuf(g, out->in[1]), *gb = centre ? apex__gbuf(g, out->in[2]) : NULL;
  const float *xf = apex__f32(g, out->in[0]->value), *wf = out->in[1] ? apex__f32(g, out->in[1]->value) : NULL;
  const float *st = out->aux, *go = out->gbuf;
  float *gxhat = gw ? apex__scratch(g, ag_nz(R * D) * sizeof(float)) : NULL;
  if (!xf || (out->in[1] && !wf) || (gw && !gxhat)) return APEX_ERR_OUT_OF_MEMORY;
#pragma omp parallel for schedule(static) if (R * D > AG_PAR_MIN)
  for (size_t r = 0; r < R; r++) {
    const float *xr = xf + r * D, *gr = go + r * D;
    float m = st[r], rs = st[R + r];
    double s1 = 0, s2 = 0;
    for (size_t j = 0; j < D; j++) {
      float xh = (xr[j] - m) * rs, gh = gr[j] * (wf ? wf[j] : 1.0f);
      if (gxhat) gxhat[r * D + j] = gr[j] * xh;
      s1 += gh;
      s2 += gh * xh;
    }
    if (!gx) continue;
    float a = centre ? (float)(s1 / (double)D) : 0.0f, b = (float)(s2 / (double)D);
    float *gxr = gx + r * D;
    for (size_t j = 0; j < D; j++) {
      float xh = (xr[j] - m) * rs, gh = gr[j] * (wf ? wf[j] : 1.0f);
      gxr[j] += rs * (gh - a - xh * b);
    }
  }
  if (gw) apex__colsum_add(gxhat, R, D, gw);
  if (gb) apex__colsum_add(go, R, D, gb);
  return APEX_OK;
}

apex_status apex__bwd_layer_norm(apex_graph *g, apex_var *out) { return row_norm_bwd(g, out); }
apex_status apex__bwd_rms_norm(apex_graph *g, apex_var *out) { return row_norm_bwd(g, out); }
