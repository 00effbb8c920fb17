/* norm.c: the CPU backend's normalisation kernels (args_nn.h): batch norm (its own statistics, the
 * running ones, or given ones from a statistics hook), its fused relu, and layer and RMS norm, forward
 * and backward.
 *
 * Statistics are per channel (batch norm) or per row (layer/RMS norm), each summed by one thread in a
 * fixed order: batch norm's in the f32-block, f64-total lanes of sums.h, the row norms' in double.
 * The weight and bias gradients of the row norms are column sums of an [rows, D] product, done by
 * apex__colsum_add in row order. So no result depends on the thread count.
 *
 * f16/bf16 inputs and results are read and written in their dtype: a row norm widens a group of rows
 * into buffers of its thread, batch norm one channel's N planes, and each rounds its result a row (plane)
 * at a time (cpu_kernels.h). The f32 math is the same as on a whole-tensor f32 copy, so the bits are. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "apex/threads.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"

/* Asks for plane n + 1 (when there is one) of channel c of t [N, C, S]: a channel's planes lie C * S
 * floats apart, and the hardware prefetcher does not follow a pass from one to the next, so each
 * plane began with misses all the way to memory. `write` for a plane about to be overwritten.
 * Measured on the benchmark CNN (2 threads, batch norm over [128, 32, 28, 28]): forward 1.11 ->
 * 0.73 ms, backward 1.70 -> 1.23 ms. */
static inline void prefetch_plane_of(const void *t, size_t esize, size_t N, size_t C, size_t S, size_t n, size_t c, int write) {
  if (n + 1 >= N) return;
  const char *p = (const char *)t + ((n + 1) * C + c) * S * esize;
  for (size_t i = 0; i < S * esize; i += 64)
    if (write)
      __builtin_prefetch(p + i, 1);
    else
      __builtin_prefetch(p + i);
}
static inline void prefetch_plane(const float *t, size_t N, size_t C, size_t S, size_t n, size_t c, int write) {
  prefetch_plane_of(t, sizeof(float), N, C, S, n, c, write);
}

/* Channel c of x [N, C, S] as f32 planes, *ps floats apart: x's own (C * S apart) when f32, else its
 * N planes widened into buf (N * S floats; S apart), each prefetching the next. */
static const float *channel_f32(apex_nn_buf x, size_t N, size_t C, size_t S, size_t c, float *buf, size_t *ps) {
  if (x.dtype == APEX_F32) {
    *ps = C * S;
    return (const float *)x.data + c * S;
  }
  for (size_t n = 0; n < N; n++) {
    prefetch_plane_of(x.data, apex_dtype_size(x.dtype), N, C, S, n, c, 0);
    apex__cpu_row_f32(x, (n * C + c) * S, S, buf + n * S);
  }
  *ps = S;
  return buf;
}

/* Batch norm's output for channel c (its f32 planes xc, ps apart) of x [N, C, S] into out [N, C, S]
 * (out_dtype; computed in f32, in tmp (S floats) when out is not f32, and rounded once):
 * (x - mean) * rstd * w + b, through relu's max(v, 0) when `relu` (the same bits as relu on the
 * unfused output). Shared by the op's own statistics and given ones, which differ only in where mean
 * and rstd come from. */
static inline float bn_affine(float x, float mean, float rstd, float w, float b) { return (x - mean) * rstd * w + b; }
static inline void bn_normalize_channel(const float *xc, size_t ps, void *out, apex_dtype out_dtype, float *tmp, size_t N, size_t C,
                                        size_t S, size_t c, float mean, float rstd, float w, float b, int relu) {
  for (size_t n = 0; n < N; n++) {
    const float *xs = xc + n * ps;
    size_t off = (n * C + c) * S;
    float *os = apex__cpu_row_out(out, out_dtype, off, tmp);
    prefetch_plane_of(out, apex_dtype_size(out_dtype), N, C, S, n, c, 1);
    if (relu)
      for (size_t i = 0; i < S; i++) {
        float v = bn_affine(xs[i], mean, rstd, w, b);
        os[i] = v > 0.0f ? v : 0.0f;
      }
    else
      for (size_t i = 0; i < S; i++) os[i] = bn_affine(xs[i], mean, rstd, w, b);
    apex__cpu_row_store(out, out_dtype, off, os, S);
  }
}

/* A channel's sums run over its N planes of S in the lanes of sums.h (vectorised, f32 blocks into f64,
 * the same bits on any thread). Every pass over a channel prefetches its next plane
 * (prefetch_plane). */
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

/* Given statistics normalise in a loop of their own, so that the plain op's per-channel loop is the
 * one measured (its forward was 5-8% slower on one thread with both in one loop). */
apex_status apex__cpu_nn_batch_norm(const apex_nn_batch_norm_args *a) {
  size_t N = a->N, C = a->C, S = a->S, M = N * S, numel = N * C * S;
  const float *xf = a->x.dtype == APEX_F32 ? a->x.data : NULL, *wf = a->w, *bf = a->b;
  float *st = a->stats, *rm = a->running_mean, *rv = a->running_var;
  void *o = a->out;
  apex_dtype odt = a->out_dtype;
  int fail;
  /* per thread: the channel's N planes widened (M floats), then one output plane (S) */
  float *bufs = apex__cpu_thread_rows(&a->ws, !xf || odt != APEX_F32, 1, M + S, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  float mom = a->momentum, eps = a->eps;
  int training = a->training;
  if (a->given_mean) {
    const float *mf = a->given_mean, *rf = a->given_rstd, *vf = a->given_var;
#pragma omp parallel for schedule(static) if (numel > APEX__CPU_PAR_MIN)
    for (size_t c = 0; c < C; c++) {
      if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mf[c]);
      if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * vf[c]);
      st[c] = mf[c];
      st[C + c] = rf[c];
      float *buf = apex__cpu_my_row(bufs, 1, M + S, 0);
      size_t ps;
      const float *xc = channel_f32(a->x, N, C, S, c, buf, &ps);
      bn_normalize_channel(xc, ps, o, odt, buf ? buf + M : NULL, N, C, S, c, mf[c], rf[c], wf ? wf[c] : 1.0f, bf ? bf[c] : 0.0f, 0);
    }
    return APEX_OK;
  }
#pragma omp parallel for schedule(static) if (numel > APEX__CPU_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    double mean, var;
    float *buf = apex__cpu_my_row(bufs, 1, M + S, 0);
    size_t ps;
    const float *xc = channel_f32(a->x, N, C, S, c, buf, &ps);
    if (training) {
      double sa[APEX__LANES] = {0}, qa[APEX__LANES] = {0};
      for (size_t n = 0; n < N; n++) {
        if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
        apex__lanes_add(sa, xc + n * ps, S);
      }
      mean = apex__lanes_total(sa) / (double)M;
      for (size_t n = 0; n < N; n++) {
        if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
        lanes_sq(qa, xc + n * ps, S, (float)mean);
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
    bn_normalize_channel(xc, ps, o, odt, buf ? buf + M : NULL, N, C, S, c, m, r, w, b, a->relu);
  }
  return APEX_OK;
}

/* The fused op's gradient at its batch norm output, one plane: go where the output is non-zero
 * (it is +0 or the positive value itself, never -0 or NaN); 0 + go as relu's backward writes it into
 * fresh zeros, so the bits are those of the unfused ops. An f32 output is non-zero exactly where the
 * forward's apex__bn_affine of the input was > 0, and the input's plane is read here anyway, so the
 * output is not read (12.8 MB less from memory for the benchmark CNN's first batch norm); a half
 * output may have rounded to zero, so its raw bits are tested instead. */
static void relu_mask_plane(float *restrict gm, const float *restrict go, const float *restrict xs, const void *yv, size_t off, size_t S,
                            float m, float r, float w, float bias) {
  const uint16_t *restrict y = yv ? (const uint16_t *)yv + off : NULL;
  for (size_t i = 0; i < S; i++) {
    float v = go[off + i] + 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= -(uint32_t)(y ? y[i] != 0 : bn_affine(xs[i], m, r, w, bias) > 0.0f);
    memcpy(gm + i, &b, sizeof b);
  }
}

/* The batch norm backward reads its gradient twice per channel: once for the sums, once for the
 * input's gradient. The fused op masks each plane once, in the first pass, into a per-thread copy of
 * the channel's gradient (from the workspace; N * S floats, which stays in cache for the second pass), so
 * its output is read once. */
apex_status apex__cpu_nn_batch_norm_bwd(const apex_nn_batch_norm_bwd_args *a) {
  size_t N = a->N, C = a->C, S = a->S, M = N * S, numel = N * C * S;
  int training = a->training, fused = a->relu, fresh = !a->accumulate_x;
  int par = numel > APEX__CPU_PAR_MIN;
  const float *xf = a->x.dtype == APEX_F32 ? a->x.data : NULL, *wf = a->w, *bf = fused ? a->b : NULL, *st = a->stats, *go = a->gout;
  float *gx = a->gx, *gw = a->gw, *gb = a->gb, *gms = NULL;
  if (fused) {
    size_t nt = par ? (size_t)apex_get_num_threads() : 1;
    if (!(gms = a->ws.get(a->ws.ctx, nt * (M ? M : 1) * sizeof(float)))) return APEX_ERR_OUT_OF_MEMORY;
  }
  int fail;
  float *xbufs = apex__cpu_thread_rows(&a->ws, !xf, 1, M, &fail); /* the channel's planes widened */
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  apex__cpu_grad_begin(gw, C, a->accumulate_w);
  apex__cpu_grad_begin(gb, C, a->accumulate_b);
  size_t ysize = apex_dtype_size(a->y_dtype);
  int read_y = a->y_dtype != APEX_F32;
  const void *y = read_y ? a->y : NULL;
#pragma omp parallel for schedule(static) if (par)
  for (size_t c = 0; c < C; c++) {
    float m = st[c], r = st[C + c], w = wf ? wf[c] : 1.0f, bias = bf ? bf[c] : 0.0f, *gm = fused ? gms + (size_t)omp_get_thread_num() * M : NULL;
    double sga[APEX__LANES] = {0}, sgxa[APEX__LANES] = {0};
    size_t ps;
    const float *xc = channel_f32(a->x, N, C, S, c, apex__cpu_my_row(xbufs, 1, M, 0), &ps);
    for (size_t n = 0; n < N; n++) {
      size_t off = (n * C + c) * S;
      prefetch_plane(go, N, C, S, n, c, 0);
      if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
      if (fused) {
        if (read_y) prefetch_plane_of(y, ysize, N, C, S, n, c, 0);
        relu_mask_plane(gm + n * S, go, xc + n * ps, y, off, S, m, r, w, bias);
      }
      lanes_bwd(sga, sgxa, fused ? gm + n * S : go + off, xc + n * ps, S, m, r);
    }
    double sg = apex__lanes_total(sga), sgx = apex__lanes_total(sgxa);
    if (gw) gw[c] += (float)sgx;
    if (gb) gb[c] += (float)sg;
    if (!gx) continue;
    float a = w * r, mg = training ? (float)(sg / (double)M) : 0.0f, mgx = training ? (float)(sgx / (double)M) : 0.0f;
    for (size_t n = 0; n < N; n++) {
      size_t off = (n * C + c) * S;
      const float *restrict gop = fused ? gm + n * S : go + off, *restrict xp = xc + n * ps;
      float *restrict gxp = gx + off;
      if (!fused) prefetch_plane(go, N, C, S, n, c, 0);
      if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
      prefetch_plane(gx, N, C, S, n, c, 1);
      if (fresh)
        for (size_t i = 0; i < S; i++) gxp[i] = 0.0f + a * (gop[i] - mg - (xp[i] - m) * r * mgx);
      else
        for (size_t i = 0; i < S; i++) gxp[i] += a * (gop[i] - mg - (xp[i] - m) * r * mgx);
    }
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_batch_norm_sums(const apex_nn_batch_norm_sums_args *a) {
  size_t N = a->N, C = a->C, S = a->S;
  const float *mf = a->mean, *rf = a->rstd, *go = a->gout;
  float *sd = a->sums, *gw = a->gw, *gb = a->gb;
  int fail;
  float *xbufs = apex__cpu_thread_rows(&a->ws, a->x.dtype != APEX_F32, 1, N * S, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  apex__cpu_grad_begin(gw, C, a->accumulate_w);
  apex__cpu_grad_begin(gb, C, a->accumulate_b);
#pragma omp parallel for schedule(static) if (N * C * S > APEX__CPU_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    double sg = 0, sgx = 0;
    size_t ps;
    const float *xc = channel_f32(a->x, N, C, S, c, apex__cpu_my_row(xbufs, 1, N * S, 0), &ps);
    for (size_t n = 0; n < N; n++)
      for (size_t i = 0; i < S; i++) {
        size_t j = (n * C + c) * S + i;
        sg += go[j];
        sgx += go[j] * (xc[n * ps + i] - mf[c]) * rf[c];
      }
    sd[c] = (float)sg;
    sd[C + c] = (float)sgx;
    if (gb) gb[c] += (float)sg;
    if (gw) gw[c] += (float)sgx;
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_batch_norm_dx(const apex_nn_batch_norm_dx_args *a) {
  size_t N = a->N, C = a->C, S = a->S;
  const float *wf = a->w, *mf = a->mean, *rf = a->rstd, *go = a->gout, *sd = a->sums;
  float *gx = a->gx;
  apex_nn_buf x = a->x;
  int fail;
  float *xbufs = apex__cpu_thread_rows(&a->ws, a->x.dtype != APEX_F32, 1, N * S, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  apex__cpu_grad_begin(gx, N * C * S, a->accumulate_x);
  float inv_total = 1.0f / (float)a->count;
#pragma omp parallel for schedule(static) if (N * C * S > APEX__CPU_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    float m = mf[c], r = rf[c], a = (wf ? wf[c] : 1.0f) * r, mg = sd[c] * inv_total, mgx = sd[C + c] * inv_total;
    size_t ps;
    const float *xc = channel_f32(x, N, C, S, c, apex__cpu_my_row(xbufs, 1, N * S, 0), &ps);
    for (size_t n = 0; n < N; n++)
      for (size_t i = 0; i < S; i++) {
        size_t j = (n * C + c) * S + i;
        gx[j] += a * (go[j] - mg - (xc[n * ps + i] - m) * r * mgx);
      }
  }
  return APEX_OK;
}

/* Layer/RMS norm rows go RN_G at a time. Each row's sums run in double in element order, a chain of
 * dependent adds (4 cycles an element); the rows of a group interleave their chains, so the adds of
 * RN_G rows overlap and each row's sum is still the same additions in the same order: the same bits
 * as one row at a time, and as the grouping does not depend on the thread count, neither do they. */
enum { RN_G = 8, RN_GB = 2 /* the backward's: it keeps two sums a row and stores as it goes */ };

/* The rows [r0, r0 + g) of x as f32 (widened into bufs, G rows of D, when half); the slots past g
 * repeat row r0, so a group always runs G chains (their results unused). */
static void rn_rows(apex_nn_buf x, size_t r0, size_t g, size_t G, size_t D, float *bufs, const float **xr) {
  for (size_t k = 0; k < G; k++) xr[k] = apex__cpu_row_f32(x, (r0 + (k < g ? k : 0)) * D, k < g ? D : 0, bufs ? bufs + k * D : NULL);
  for (size_t k = g; k < G; k++) xr[k] = xr[0];
}

apex_status apex__cpu_nn_row_norm(const apex_nn_row_norm_args *a) {
  size_t R = a->rows, D = a->cols, ng = (R + RN_G - 1) / RN_G;
  const float *wf = apex__cpu_f32(a->w, D, &a->ws), *bf = apex__cpu_f32(a->b, D, &a->ws);
  int fail;
  float *rows = apex__cpu_thread_rows(&a->ws, a->x.dtype != APEX_F32 || a->out_dtype != APEX_F32, RN_G + 1, D, &fail), *st = a->stats,
        eps = a->eps;
  if (fail || (a->w.data && !wf) || (a->b.data && !bf)) return APEX_ERR_OUT_OF_MEMORY;
  int centre = a->centre;
#pragma omp parallel for schedule(static) if (R * D > APEX__CPU_PAR_MIN)
  for (size_t gi = 0; gi < ng; gi++) {
    size_t r0 = gi * RN_G, g = R - r0 < RN_G ? R - r0 : RN_G;
    const float *xr[RN_G];
    rn_rows(a->x, r0, g, RN_G, D, apex__cpu_my_row(rows, RN_G + 1, D, 0), xr);
    double mean[RN_G] = {0}, q[RN_G] = {0};
    if (centre) {
      for (size_t j = 0; j < D; j++)
        for (size_t k = 0; k < RN_G; k++) mean[k] += xr[k][j];
      for (size_t k = 0; k < RN_G; k++) mean[k] /= (double)D;
    }
    for (size_t j = 0; j < D; j++)
      for (size_t k = 0; k < RN_G; k++) q[k] += (xr[k][j] - mean[k]) * (xr[k][j] - mean[k]);
    for (size_t k = 0; k < g; k++) {
      size_t r = r0 + k;
      float m = (float)mean[k], rs = (float)(1.0 / sqrt(q[k] / (double)D + eps));
      st[r] = m;
      st[R + r] = rs;
      float *orow = apex__cpu_row_out(a->out, a->out_dtype, r * D, apex__cpu_my_row(rows, RN_G + 1, D, RN_G));
      const float *x1 = xr[k];
      for (size_t j = 0; j < D; j++) orow[j] = (x1[j] - m) * rs * (wf ? wf[j] : 1.0f) + (bf ? bf[j] : 0.0f);
      apex__cpu_row_store(a->out, a->out_dtype, r * D, orow, D);
    }
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_row_norm_bwd(const apex_nn_row_norm_bwd_args *a) {
  size_t R = a->rows, D = a->cols, ng = (R + RN_GB - 1) / RN_GB;
  int centre = a->centre;
  const float *wf = apex__cpu_f32(a->w, D, &a->ws), *st = a->stats, *go = a->gout;
  int fail;
  float *rows = apex__cpu_thread_rows(&a->ws, a->x.dtype != APEX_F32, RN_GB, D, &fail);
  if (fail || (a->w.data && !wf)) return APEX_ERR_OUT_OF_MEMORY;
  float *gx = a->gx, *gw = a->gw, *gb = a->gb, *gxhat = gw ? a->workspace : NULL;
  apex__cpu_grad_begin(gx, R * D, a->accumulate_x);
  apex__cpu_grad_begin(gw, D, a->accumulate_w);
  apex__cpu_grad_begin(gb, D, a->accumulate_b);
#pragma omp parallel for schedule(static) if (R * D > APEX__CPU_PAR_MIN)
  for (size_t gi = 0; gi < ng; gi++) {
    size_t r0 = gi * RN_GB, g = R - r0 < RN_GB ? R - r0 : RN_GB;
    const float *xr[RN_GB], *gr[RN_GB];
    float m[RN_GB], rs[RN_GB];
    rn_rows(a->x, r0, g, RN_GB, D, apex__cpu_my_row(rows, RN_GB, D, 0), xr);
    double s1[RN_GB] = {0}, s2[RN_GB] = {0};
    for (size_t k = 0; k < RN_GB; k++) {
      size_t r = r0 + (k < g ? k : 0);
      gr[k] = go + r * D, m[k] = st[r], rs[k] = st[R + r];
    }
    /* the weight's gradient terms (go * x-hat) are stored in the same pass by a whole group */
    float *gh_out = gxhat && g == RN_GB ? gxhat + r0 * D : NULL;
    for (size_t j = 0; j < D; j++) {
      float w = wf ? wf[j] : 1.0f;
      for (size_t k = 0; k < RN_GB; k++) {
        float xh = (xr[k][j] - m[k]) * rs[k], gh = gr[k][j] * w;
        if (gh_out) gh_out[k * D + j] = gr[k][j] * xh;
        s1[k] += gh;
        s2[k] += gh * xh;
      }
    }
    for (size_t k = 0; gxhat && !gh_out && k < g; k++)
      for (size_t j = 0; j < D; j++) gxhat[(r0 + k) * D + j] = gr[k][j] * ((xr[k][j] - m[k]) * rs[k]);
    if (!gx) continue;
    for (size_t k = 0; k < g; k++) {
      const float *x1 = xr[k], *g1 = gr[k];
      float mk = m[k], rk = rs[k], ca = centre ? (float)(s1[k] / (double)D) : 0.0f, cb = (float)(s2[k] / (double)D);
      float *gxr = gx + (r0 + k) * D;
      for (size_t j = 0; j < D; j++) {
        float xh = (x1[j] - mk) * rk, gh = g1[j] * (wf ? wf[j] : 1.0f);
        gxr[j] += rk * (gh - ca - xh * cb);
      }
    }
  }
  if (gw) apex__colsum_add(gxhat, R, D, gw);
  if (gb) apex__colsum_add(go, R, D, gb);
  return APEX_OK;
}
