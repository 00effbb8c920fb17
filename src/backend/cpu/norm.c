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
 * into buffers of its thread, batch norm reads bf16 in place and widens an f16 channel's N planes, and
 * each rounds its result a row (plane) at a time (cpu_kernels.h). The f32 math is the same as on a
 * whole-tensor f32 copy, so the bits are. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "apex/threads.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/sums.h"
#include "backend/grad_dtype.h"

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

/* Batch norm's forward and backward read a bf16 input in place, plane by plane, widening in registers
 * (xat, xat8): widening the channel first (channel_f32) cost a conversion call per plane and wrote and
 * re-read N * S floats per channel, and bf16 ran slower than f32 on the benchmark CNN's second batch
 * norm. Measured (one thread, best of 15, this shared VM at load 6), before -> after, f32 beside:
 * [128, 64, 196] forward 1.11-1.22 -> 0.88-1.00 ms (f32 0.80-0.93), backward 1.30-1.54 -> 1.05-1.25
 * (f32 1.10-1.26); [128, 32, 784] forward 1.45-1.50 either way, backward 2.18-2.35 -> 2.07-2.24.
 * The values are the same f32 values, so the bits are: bf16 widens exactly by its bits; the
 * conversion's quieting of a signalling NaN is left to the first arithmetic on it, which quiets it the
 * same way (payload kept), and a NaN compares the same either way (test_nn_lowp_rows holds both to the
 * f32 op's bits). Each function below takes `bf` as a constant and is inlined into an f32 and a bf16
 * copy of its caller; the f32 copy is the code it was. */
#define BN_INLINE static inline __attribute__((always_inline))

/* Channel c of x [N, C, S] as the passes read it: its planes from the result, *ps elements apart, bf16
 * in place (*bf set) or f32 (x's own, or an f16 x widened into buf by channel_f32). */
static const void *channel_x(apex_nn_buf x, size_t N, size_t C, size_t S, size_t c, float *buf, size_t *ps, int *bf) {
  *bf = x.dtype == APEX_BF16;
  if (!*bf) return channel_f32(x, N, C, S, c, buf, ps);
  *ps = C * S;
  return (const uint16_t *)x.data + c * S;
}
/* 1 when channel_x widens x into a buffer (N * S floats a thread). */
static int channel_widens(apex_dtype dt) { return dt != APEX_F32 && dt != APEX_BF16; }

/* Plane n of a channel from channel_x, and element i of a plane as f32. */
BN_INLINE const void *xplane(const void *xc, size_t ps, size_t n, int bf) {
  return (const char *)xc + n * ps * (bf ? sizeof(uint16_t) : sizeof(float));
}
BN_INLINE float xat(const void *p, size_t i, int bf) {
  if (!bf) return ((const float *)p)[i];
  uint32_t b = (uint32_t)((const uint16_t *)p)[i] << 16;
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}
#if APEX__LANE_VEC
typedef uint16_t bn_h8 __attribute__((vector_size(16)));
/* Eight elements from i as f32 lanes: lo (i to i + 3) and hi (i + 4 to i + 7). bf16 is one 16-byte
 * load and two interleaves with zero, each element into the high half of its lane (loading four at a
 * time went through the stack). */
BN_INLINE void xat8(const void *p, size_t i, int bf, apex__v4 *lo, apex__v4 *hi) {
  if (!bf) {
    *lo = apex__ld4((const float *)p + i);
    *hi = apex__ld4((const float *)p + i + 4);
    return;
  }
  bn_h8 h, z = {0};
  memcpy(&h, (const uint16_t *)p + i, sizeof h);
  bn_h8 a = __builtin_shufflevector(z, h, 0, 8, 1, 9, 2, 10, 3, 11), b = __builtin_shufflevector(z, h, 4, 12, 5, 13, 6, 14, 7, 15);
  memcpy(lo, &a, sizeof a);
  memcpy(hi, &b, sizeof b);
}
#endif

/* apex__lanes_add (sums.h) over a plane read through xat: the same lanes, blocks and order. */
BN_INLINE void lanes_add_x(double acc[APEX__LANES], const void *x, size_t n, int bf) {
  for (size_t b0 = 0; b0 < n; b0 += APEX__LANE_BLOCK) {
    size_t e = n - b0 < APEX__LANE_BLOCK ? n : b0 + APEX__LANE_BLOCK, i = b0;
    float f[APEX__LANES] = {0};
#if APEX__LANE_VEC
    apex__v4 a = {0}, b = {0}, c = {0}, d = {0};
    for (; i + APEX__LANES <= e; i += APEX__LANES) {
      apex__v4 x0, x1, x2, x3;
      xat8(x, i, bf, &x0, &x1);
      xat8(x, i + 8, bf, &x2, &x3);
      a += x0;
      b += x1;
      c += x2;
      d += x3;
    }
    apex__st16(f, a, b, c, d);
#else
    for (; i + APEX__LANES <= e; i += APEX__LANES)
      for (int l = 0; l < APEX__LANES; l++) f[l] += xat(x, i + l, bf);
#endif
    for (size_t l = 0; i + l < e; l++) f[l] += xat(x, i + l, bf);
    for (int l = 0; l < APEX__LANES; l++) acc[l] += f[l];
  }
}

/* Batch norm's output for channel c (its planes read through xat) of x [N, C, S] into out [N, C, S]
 * (out_dtype; computed in f32, in tmp (S floats) when out is not f32, and rounded once):
 * (x - mean) * rstd * w + b, through relu's max(v, 0) when `relu` (the same bits as relu on the
 * unfused output). Shared by the op's own statistics and given ones, which differ only in where mean
 * and rstd come from. */
static inline float bn_affine(float x, float mean, float rstd, float w, float b) { return (x - mean) * rstd * w + b; }
BN_INLINE void bn_normalize_channel(const void *xc, size_t ps, int bf, void *out, apex_dtype out_dtype, float *tmp, size_t N, size_t C,
                                   size_t S, size_t c, float mean, float rstd, float w, float b, int relu) {
  for (size_t n = 0; n < N; n++) {
    const void *xs = xplane(xc, ps, n, bf);
    size_t off = (n * C + c) * S;
    float *os = apex__cpu_row_out(out, out_dtype, off, tmp);
    prefetch_plane_of(out, apex_dtype_size(out_dtype), N, C, S, n, c, 1);
    size_t i = 0;
#if APEX__LANE_VEC
    if (bf) /* gcc leaves the bf16 loop below scalar; the same operations eight at a time */
      for (; i + 8 <= S; i += 8) {
        apex__v4 v[2];
        xat8(xs, i, 1, &v[0], &v[1]);
        for (int h = 0; h < 2; h++) {
          v[h] = (v[h] - mean) * rstd * w + b;
          if (relu) {
            typedef int32_t i4 __attribute__((vector_size(16)));
            i4 bits, keep = v[h] > 0.0f; /* max(v, 0) as below: +0 where v <= 0 or NaN */
            memcpy(&bits, &v[h], sizeof bits);
            bits &= keep;
            memcpy(&v[h], &bits, sizeof bits);
          }
        }
        memcpy(os + i, v, sizeof v);
      }
#endif
    if (relu)
      for (; i < S; i++) {
        float v = bn_affine(xat(xs, i, bf), mean, rstd, w, b);
        os[i] = v > 0.0f ? v : 0.0f;
      }
    else
      for (; i < S; i++) os[i] = bn_affine(xat(xs, i, bf), mean, rstd, w, b);
    apex__cpu_row_store(out, out_dtype, off, os, S);
  }
}

/* A channel's sums run over its N planes of S in the lanes of sums.h (vectorised, f32 blocks into f64,
 * the same bits on any thread). Every pass over a channel prefetches its next plane
 * (prefetch_plane). */
BN_INLINE void lanes_sq(double acc[APEX__LANES], const void *restrict x, size_t n, float mean, int bf) {
  for (size_t b0 = 0; b0 < n; b0 += APEX__LANE_BLOCK) {
    size_t e = n - b0 < APEX__LANE_BLOCK ? n : b0 + APEX__LANE_BLOCK, i = b0;
    float f[APEX__LANES] = {0};
#if APEX__LANE_VEC
    apex__v4 a = {0}, b = {0}, c = {0}, d = {0};
    for (; i + APEX__LANES <= e; i += APEX__LANES) {
      apex__v4 d0, d1, d2, d3;
      xat8(x, i, bf, &d0, &d1);
      xat8(x, i + 8, bf, &d2, &d3);
      d0 -= mean, d1 -= mean, d2 -= mean, d3 -= mean;
      a += d0 * d0;
      b += d1 * d1;
      c += d2 * d2;
      d += d3 * d3;
    }
    apex__st16(f, a, b, c, d);
#else
    for (; i + APEX__LANES <= e; i += APEX__LANES)
      for (int l = 0; l < APEX__LANES; l++) {
        float d = xat(x, i + l, bf) - mean;
        f[l] += d * d;
      }
#endif
    for (size_t l = 0; i + l < e; l++) f[l] += (xat(x, i + l, bf) - mean) * (xat(x, i + l, bf) - mean);
    for (int l = 0; l < APEX__LANES; l++) acc[l] += f[l];
  }
}

/* sum of go and of go * (x - m) * r over one plane. */
BN_INLINE void lanes_bwd(double sg[APEX__LANES], double sgx[APEX__LANES], const float *restrict go, const void *restrict x, size_t n, float m,
                         float r, int bf) {
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
      apex__v4 x0, x1, x2, x3;
      xat8(x, i, bf, &x0, &x1);
      xat8(x, i + 8, bf, &x2, &x3);
      h0 += g0 * (x0 - m) * r;
      h1 += g1 * (x1 - m) * r;
      h2 += g2 * (x2 - m) * r;
      h3 += g3 * (x3 - m) * r;
    }
    apex__st16(f, f0, f1, f2, f3);
    apex__st16(h, h0, h1, h2, h3);
#else
    for (; i + APEX__LANES <= e; i += APEX__LANES)
      for (int l = 0; l < APEX__LANES; l++) {
        f[l] += go[i + l];
        h[l] += go[i + l] * (xat(x, i + l, bf) - m) * r;
      }
#endif
    for (size_t l = 0; i + l < e; l++) {
      f[l] += go[i + l];
      h[l] += go[i + l] * (xat(x, i + l, bf) - m) * r;
    }
    for (int l = 0; l < APEX__LANES; l++) {
      sg[l] += f[l];
      sgx[l] += h[l];
    }
  }
}

/* One channel's statistics (training) or the running ones, and its output: the forward's loop body,
 * inlined once for f32 planes and once for bf16 (bf). */
BN_INLINE void bn_forward_channel(const apex_nn_batch_norm_args *a, size_t c, float *buf, int bf) {
  size_t N = a->N, C = a->C, S = a->S, M = N * S, ps;
  const float *xf = a->x.dtype == APEX_F32 ? a->x.data : NULL, *wf = a->w, *bf_ = a->b;
  float *rm = a->running_mean, *rv = a->running_var, mom = a->momentum;
  int dummy;
  const void *xc = channel_x(a->x, N, C, S, c, buf, &ps, &dummy);
  double mean, var;
  if (a->training) {
    double sa[APEX__LANES] = {0}, qa[APEX__LANES] = {0};
    for (size_t n = 0; n < N; n++) {
      if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
      if (bf) prefetch_plane_of(a->x.data, sizeof(uint16_t), N, C, S, n, c, 0);
      lanes_add_x(sa, xplane(xc, ps, n, bf), S, bf);
    }
    mean = apex__lanes_total(sa) / (double)M;
    for (size_t n = 0; n < N; n++) {
      if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
      lanes_sq(qa, xplane(xc, ps, n, bf), S, (float)mean, bf);
    }
    double q = apex__lanes_total(qa);
    var = q / (double)M;
    if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mean);
    if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * q / (double)(M - 1));
    if (a->batch_var) a->batch_var[c] = (float)var;
    if (a->batch_m2) a->batch_m2[c] = (float)q;
    if (!a->out) { /* statistics only */
      a->stats[c] = (float)mean;
      return;
    }
  } else {
    mean = rm[c];
    var = rv[c];
  }
  float m = (float)mean, r = (float)(1.0 / sqrt(var + a->eps)), w = wf ? wf[c] : 1.0f, b = bf_ ? bf_[c] : 0.0f;
  a->stats[c] = m;
  a->stats[C + c] = r;
  bn_normalize_channel(xc, ps, bf, a->out, a->out_dtype, buf ? buf + (channel_widens(a->x.dtype) ? M : 0) : NULL, N, C, S, c, m, r, w, b,
                       a->relu);
}

/* Given statistics normalise in a loop of their own, so that the plain op's per-channel loop is the
 * one measured (its forward was 5-8% slower on one thread with both in one loop). */
apex_status apex__cpu_nn_batch_norm(const apex_nn_batch_norm_args *a) {
  size_t N = a->N, C = a->C, S = a->S, M = N * S, numel = N * C * S;
  const float *wf = a->w, *bf = a->b;
  float *st = a->stats, *rm = a->running_mean, *rv = a->running_var;
  void *o = a->out;
  apex_dtype odt = a->out_dtype;
  int fail, widens = channel_widens(a->x.dtype), x16 = a->x.dtype == APEX_BF16;
  /* per thread: the channel's N planes widened (M floats, f16 only), then one output plane (S) */
  size_t per = (widens ? M : 0) + S;
  float *bufs = apex__cpu_thread_rows(&a->ws, widens || odt != APEX_F32, 1, per, &fail);
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  float mom = a->momentum;
  if (a->given_mean) {
    const float *mf = a->given_mean, *rf = a->given_rstd, *vf = a->given_var;
#pragma omp parallel for schedule(static) if (numel > APEX__CPU_PAR_MIN)
    for (size_t c = 0; c < C; c++) {
      if (rm) rm[c] = (float)((1.0 - mom) * rm[c] + mom * mf[c]);
      if (rv) rv[c] = (float)((1.0 - mom) * rv[c] + mom * vf[c]);
      st[c] = mf[c];
      st[C + c] = rf[c];
      float *buf = apex__cpu_my_row(bufs, 1, per, 0);
      size_t ps;
      int b16;
      const void *xc = channel_x(a->x, N, C, S, c, buf, &ps, &b16);
      float *tmp = buf ? buf + (widens ? M : 0) : NULL, w = wf ? wf[c] : 1.0f, b = bf ? bf[c] : 0.0f;
      /* relu as the contract says, given statistics or not (the SyncBatchNorm front never fuses it) */
      if (b16)
        bn_normalize_channel(xc, ps, 1, o, odt, tmp, N, C, S, c, mf[c], rf[c], w, b, a->relu);
      else
        bn_normalize_channel(xc, ps, 0, o, odt, tmp, N, C, S, c, mf[c], rf[c], w, b, a->relu);
    }
    return APEX_OK;
  }
#pragma omp parallel for schedule(static) if (numel > APEX__CPU_PAR_MIN)
  for (size_t c = 0; c < C; c++) {
    float *buf = apex__cpu_my_row(bufs, 1, per, 0);
    if (x16)
      bn_forward_channel(a, c, buf, 1);
    else
      bn_forward_channel(a, c, buf, 0);
  }
  return APEX_OK;
}

/* The fused op's gradient at its batch norm output, one plane: go where the output is non-zero
 * (it is +0 or the positive value itself, never -0 or NaN); 0 + go as relu's backward writes it into
 * fresh zeros, so the bits are those of the unfused ops. An f32 output is non-zero exactly where the
 * forward's apex__bn_affine of the input was > 0, and the input's plane is read here anyway, so the
 * output is not read (12.8 MB less from memory for the benchmark CNN's first batch norm); a half
 * output may have rounded to zero, so its raw bits are tested instead. */
BN_INLINE void relu_mask_plane(float *restrict gm, const float *restrict go, const void *restrict xs, const void *yv, size_t off, size_t S,
                               float m, float r, float w, float bias, int bf) {
  const uint16_t *restrict y = yv ? (const uint16_t *)yv + off : NULL;
  for (size_t i = 0; i < S; i++) {
    float v = go[off + i] + 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= -(uint32_t)(y ? y[i] != 0 : bn_affine(xat(xs, i, bf), m, r, w, bias) > 0.0f);
    memcpy(gm + i, &b, sizeof b);
  }
}

/* The batch norm backward reads its gradient twice per channel: once for the sums, once for the
 * input's gradient. The fused op masks each plane once, in the first pass, into a per-thread copy of
 * the channel's gradient (from the workspace; N * S floats, which stays in cache for the second pass), so
 * its output is read once. This is one channel of it, inlined once for f32 planes and once for bf16
 * (bf); gm: the thread's masked gradient (the fused op), xbuf: its widening buffer (f16 only). */
BN_INLINE void bn_backward_channel(const apex_nn_batch_norm_bwd_args *a, size_t c, float *gm, float *xbuf, int bf) {
  size_t N = a->N, C = a->C, S = a->S, M = N * S, ps;
  int fused = a->relu, read_y = a->y_dtype != APEX_F32;
  const float *xf = a->x.dtype == APEX_F32 ? a->x.data : NULL, *go = a->gout, *st = a->stats;
  const void *y = read_y ? a->y : NULL;
  size_t ysize = apex_dtype_size(a->y_dtype);
  float m = st[c], r = st[C + c], w = a->w ? a->w[c] : 1.0f, bias = fused && a->b ? a->b[c] : 0.0f, *gx = a->gx;
  double sga[APEX__LANES] = {0}, sgxa[APEX__LANES] = {0};
  int dummy;
  const void *xc = channel_x(a->x, N, C, S, c, xbuf, &ps, &dummy);
  for (size_t n = 0; n < N; n++) {
    size_t off = (n * C + c) * S;
    const void *xs = xplane(xc, ps, n, bf);
    prefetch_plane(go, N, C, S, n, c, 0);
    if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
    if (bf) prefetch_plane_of(a->x.data, sizeof(uint16_t), N, C, S, n, c, 0);
    if (fused) {
      if (read_y) prefetch_plane_of(y, ysize, N, C, S, n, c, 0);
      relu_mask_plane(gm + n * S, go, xs, y, off, S, m, r, w, bias, bf);
    }
    lanes_bwd(sga, sgxa, fused ? gm + n * S : go + off, xs, S, m, r, bf);
  }
  double sg = apex__lanes_total(sga), sgx = apex__lanes_total(sgxa);
  if (a->gw) a->gw[c] += (float)sgx;
  if (a->gb) a->gb[c] += (float)sg;
  if (!gx) return;
  int training = a->training;
  float k = w * r, mg = training ? (float)(sg / (double)M) : 0.0f, mgx = training ? (float)(sgx / (double)M) : 0.0f;
  for (size_t n = 0; n < N; n++) {
    size_t off = (n * C + c) * S;
    const float *restrict gop = fused ? gm + n * S : go + off;
    const void *restrict xp = xplane(xc, ps, n, bf);
    float *restrict gxp = gx + off;
    if (!fused) prefetch_plane(go, N, C, S, n, c, 0);
    if (xf) prefetch_plane(xf, N, C, S, n, c, 0);
    prefetch_plane(gx, N, C, S, n, c, 1);
    if (!a->accumulate_x)
      for (size_t i = 0; i < S; i++) gxp[i] = 0.0f + k * (gop[i] - mg - (xat(xp, i, bf) - m) * r * mgx);
    else
      for (size_t i = 0; i < S; i++) gxp[i] += k * (gop[i] - mg - (xat(xp, i, bf) - m) * r * mgx);
  }
}

apex_status apex__cpu_nn_batch_norm_bwd(const apex_nn_batch_norm_bwd_args *a) {
  size_t N = a->N, C = a->C, S = a->S, M = N * S, numel = N * C * S;
  int fused = a->relu, par = numel > APEX__CPU_PAR_MIN, x16 = a->x.dtype == APEX_BF16;
  float *gms = NULL;
  if (fused) {
    size_t nt = par ? (size_t)apex_get_num_threads() : 1;
    if (!(gms = a->ws.get(a->ws.ctx, nt * (M ? M : 1) * sizeof(float)))) return APEX_ERR_OUT_OF_MEMORY;
  }
  int fail;
  float *xbufs = apex__cpu_thread_rows(&a->ws, channel_widens(a->x.dtype), 1, M, &fail); /* an f16 channel's planes widened */
  if (fail) return APEX_ERR_OUT_OF_MEMORY;
  apex__cpu_grad_begin(a->gw, C, a->accumulate_w);
  apex__cpu_grad_begin(a->gb, C, a->accumulate_b);
#pragma omp parallel for schedule(static) if (par)
  for (size_t c = 0; c < C; c++) {
    float *gm = fused ? gms + (size_t)omp_get_thread_num() * M : NULL, *xbuf = apex__cpu_my_row(xbufs, 1, M, 0);
    if (x16)
      bn_backward_channel(a, c, gm, xbuf, 1);
    else
      bn_backward_channel(a, c, gm, xbuf, 0);
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

static apex_status row_norm(const apex_nn_row_norm_args *a);

/* The residual add in front (x2): the binary slot's ADD over the flat rows into xsum, then the norm of
 * xsum as stored, so the bits are those of apex_add followed by apex_layer_norm. */
apex_status apex__cpu_nn_row_norm(const apex_nn_row_norm_args *a) {
  if (!a->x2.data) return row_norm(a);
  size_t n = a->rows * a->cols;
  apex_nn_bcast flat = {.nd = 1, .shape = {(int64_t)n}, .st = {{1}, {1}}, .rows = n ? 1 : 0, .len = n};
  apex_status st = apex__cpu_nn_binary(&(apex_nn_binary_args){.kind = APEX_NN_ADD, .plan = &flat, .a = a->x, .b = a->x2, .numel_a = n,
                                                              .numel_b = n, .out = a->xsum, .out_dtype = a->x.dtype, .ws = a->ws});
  if (st != APEX_OK) return st;
  apex_nn_row_norm_args c = apex__row_norm_of_sum(a);
  return row_norm(&c);
}

static apex_status row_norm(const apex_nn_row_norm_args *a) {
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

static apex_status row_norm_bwd_k(const void *a) { return apex__cpu_nn_row_norm_bwd(a); }

apex_status apex__cpu_nn_row_norm_bwd(const apex_nn_row_norm_bwd_args *a) {
  int ran;
  apex_status rs = apex__row_norm_bwd_f32(&apex__cpu_backend, row_norm_bwd_k, a, &ran);
  if (ran) return rs;
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
