/* conv.c: the CPU backend's conv2d (im2col + sgemm, one image at a time), max and average pooling
 * kernels (args_nn.h), forward and backward. bf16 operands on a CPU with AVX512_BF16 or AMX take the
 * same image loop with bf16 cols and one oneDNN matmul per image and product (conv_onednn.c, which
 * says why that and not oneDNN's convolution primitive); any thread count gives the same bits there
 * for the same reasons as below.
 *
 * conv2d runs image by image: the image's patches are laid out as cols [C*KH*KW, HO*WO] in a
 * per-thread buffer and one sgemm W [O, C*KH*KW] @ cols writes the image's output [O, HO*WO], which
 * is already NCHW. The threads take whole images, so each image's bits come from one sgemm call of a
 * fixed shape whatever the thread count, and its cols stay in cache between im2col and the product.
 * The backward recomputes each image's cols rather than keeping them: they are C*KH*KW / C times the
 * input (9x for 3x3 kernels, 29 MB for the benchmark CNN's second conv), and writing them out and
 * reading them back cost more than a second im2col into cache.
 *
 * Measured on this 2-core VM against the old layout (the whole batch's cols [K, N*HO*WO] in one
 * tiled product, the output transposed to NCHW after): the single-threaded sgemm runs the per-image
 * shapes of the benchmark CNN at the speed of large ones (64x196x288 at 105 GFLOP/s, 288x196x64 at
 * 110, 64x288x196 at 102, against 106 for 1024^3), while the old weight-gradient product
 * [64, 25088] x [25088, 288] was cut into 32 x 32 tiles that ran at 69 GFLOP/s and re-read their
 * panels from memory. */
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "apex/threads.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/conv_onednn.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/sums.h"
#include "core/internal.h"

typedef apex_nn_conv_geom conv_geom;

static size_t cg_k(const conv_geom *q) { return (size_t)q->c * q->kh * q->kw; }
static size_t cg_p(const conv_geom *q) { return (size_t)q->ho * q->wo; }

/* im2col and col2im work on a zero-padded copy of the image, so that every patch row is a plain
 * strided copy with no bounds to test. Measured for one image of the benchmark CNN's second conv
 * ([32, 14, 14], 3x3, padding 1): 19 to 28 us with a bounds test per output row (a memcpy or a loop
 * per row alike), 8.8 us through the padded copy; im2col had been 12% of the step. */
static size_t cg_padded(const conv_geom *q) { return (size_t)q->c * (q->h + 2 * q->ph) * (q->w + 2 * q->pw); }

/* GCC turns the row copies below into memmove calls, which cost more than rows of 14 floats (the
 * call made im2col 1.9x slower in the benchmark CNN's profile). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_MEMCPY_CALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define NO_MEMCPY_CALLS
#endif

/* A row of n floats; rows of 8 to 16 (14 in the benchmark CNN's second conv) as four 4-float
 * pieces, the last two ending at the row's end and overlapping the first two: the loop ran one
 * 8-float vector and then a scalar tail per row. */
#if defined(__GNUC__)
typedef float row4 __attribute__((vector_size(16))); /* wider vectors spill to the stack without AVX */
static inline row4 ld4(const float *p) {
  row4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void st4(float *p, row4 v) { memcpy(p, &v, sizeof v); }
#endif
NO_MEMCPY_CALLS static inline void row_copy(float *restrict d, const float *restrict s, int n) {
#if defined(__GNUC__)
  if (n >= 8 && n <= 16) {
    row4 a0 = ld4(s), a1 = ld4(s + 4), b0 = ld4(s + n - 8), b1 = ld4(s + n - 4);
    st4(d, a0);
    st4(d + 4, a1);
    st4(d + n - 8, b0);
    st4(d + n - 4, b1);
    return;
  }
#endif
  for (int i = 0; i < n; i++) d[i] = s[i];
}

/* One image x [C, H, W] to cols [K, P], through xp (cg_padded elements). Each padded input row is
 * read once for its KW shifted copies. The geometry is copied into locals: the row copies' stores
 * may alias it as far as the compiler knows. Measured for one image, one thread: the second conv's
 * im2col 8.7 -> 6.9 us, the first's ([1, 28, 28]) 0.78 -> 0.60 us. Written once for f32 and once,
 * through the same macro, for 16-bit elements (bf16 cols for conv_onednn.c, which copies bits). */
/* The same for 16-bit elements: rows of 8 to 16 as two 8-element pieces, the second ending at the
 * row's end; the element loop made bf16 im2col 1.2x slower than f32's in the benchmark CNN. */
NO_MEMCPY_CALLS static inline void row_copy16(uint16_t *restrict d, const uint16_t *restrict s, int n) {
#if defined(__GNUC__)
  if (n >= 8 && n <= 16) {
    row4 a = ld4((const float *)(const void *)s), b = ld4((const float *)(const void *)(s + n - 8));
    st4((float *)(void *)d, a);
    st4((float *)(void *)(d + n - 8), b);
    return;
  }
#endif
  for (int i = 0; i < n; i++) d[i] = s[i];
}
#define DEFINE_IM2COL(NAME, T, ROW_COPY)                                                                                                 \
  NO_MEMCPY_CALLS static void NAME(const conv_geom *q, const T *restrict x, T *restrict cols, T *restrict xp) {                        \
    int hp = q->h + 2 * q->ph, wp = q->w + 2 * q->pw;                                                                                \
    for (int c = 0; c < q->c; c++) {                                                                                                 \
      T *pc = xp + (size_t)c * hp * wp;                                                                                              \
      memset(pc, 0, (size_t)q->ph * wp * sizeof(T));                                                                                 \
      memset(pc + (size_t)(hp - q->ph) * wp, 0, (size_t)q->ph * wp * sizeof(T));                                                     \
      for (int i = 0; i < q->h; i++) {                                                                                               \
        T *r = pc + (size_t)(i + q->ph) * wp;                                                                                        \
        const T *src = x + ((size_t)c * q->h + i) * q->w;                                                                            \
        for (int j = 0; j < q->pw; j++) r[j] = r[wp - 1 - j] = 0;                                                                    \
        for (int j = 0; j < q->w; j++) r[q->pw + j] = src[j];                                                                        \
      }                                                                                                                              \
    }                                                                                                                                \
    const int C = q->c, KH = q->kh, KW = q->kw, HO = q->ho, WO = q->wo, SH = q->sh, SW = q->sw;                                      \
    const size_t P = (size_t)HO * WO;                                                                                                \
    for (int c = 0; c < C; c++)                                                                                                      \
      for (int ki = 0; ki < KH; ki++)                                                                                                \
        for (int oh = 0; oh < HO; oh++) {                                                                                            \
          const T *src = xp + ((size_t)c * hp + ki + (size_t)oh * SH) * wp;                                                          \
          T *d = cols + (size_t)(c * KH + ki) * KW * P + (size_t)oh * WO;                                                            \
          for (int kj = 0; kj < KW; kj++, d += P)                                                                                    \
            if (SW == 1)                                                                                                             \
              ROW_COPY(d, src + kj, WO);                                                                                             \
            else                                                                                                                     \
              for (int ow = 0; ow < WO; ow++) d[ow] = src[kj + (size_t)ow * SW];                                                     \
        }                                                                                                                            \
  }
DEFINE_IM2COL(im2col, float, row_copy)
DEFINE_IM2COL(im2col16, uint16_t, row_copy16)

/* The adjoint of im2col for one image: gx [C, H, W] += cols (= 0 + cols when fresh), summed first
 * into the padded gp. Each input element gathers its terms in (ki, kj) order. */
static void col2im_add(const conv_geom *q, const float *restrict cols, float *restrict gx, int fresh, float *restrict gp) {
  int hp = q->h + 2 * q->ph, wp = q->w + 2 * q->pw;
  memset(gp, 0, cg_padded(q) * sizeof(float));
  const float *s = cols;
  for (int c = 0; c < q->c; c++)
    for (int ki = 0; ki < q->kh; ki++)
      for (int kj = 0; kj < q->kw; kj++) {
        float *dst = gp + ((size_t)c * hp + ki) * wp + kj;
        for (int oh = 0; oh < q->ho; oh++, s += q->wo, dst += (size_t)wp * q->sh)
          if (q->sw == 1)
            for (int ow = 0; ow < q->wo; ow++) dst[ow] += s[ow];
          else
            for (int ow = 0; ow < q->wo; ow++) dst[(size_t)ow * q->sw] += s[ow];
      }
  for (int c = 0; c < q->c; c++)
    for (int i = 0; i < q->h; i++) {
      const float *r = gp + ((size_t)c * hp + i + q->ph) * wp + q->pw;
      float *o = gx + ((size_t)c * q->h + i) * q->w;
      if (fresh)
        for (int j = 0; j < q->w; j++) o[j] = 0.0f + r[j];
      else
        for (int j = 0; j < q->w; j++) o[j] += r[j];
    }
}

/* Images run on threads once the whole convolution is worth it. */
static int conv_par(const conv_geom *q) { return (double)q->n * q->o * cg_p(q) * cg_k(q) > 4e6 && q->n > 1; }

/* The first error any thread met, kept once. */
static void keep_error(apex_status *err, apex_status st) {
  if (st == APEX_OK) return;
#pragma omp critical(apex_conv_error)
  if (*err == APEX_OK) *err = st;
}

/* What one image's passes read and write. lp: the bf16 path (conv_onednn.h): x and w stay in their
 * 16-bit dtype, cols are 16-bit and each product is one oneDNN matmul; else x and w are f32 (widened
 * whole) and each product is one sgemm call. */
typedef struct conv_job {
  conv_geom q;
  int lp;
  apex_dtype dt; /* x's and w's dtype */
  const void *x, *w;
  const float *bias;
  void *out; /* lp: the output in its dtype; else the f32 result */
  apex_dtype out_dtype;
} conv_job;

static apex_status fwd_image(const conv_job *j, int n, float *cb, apex__conv_dnn_scratch *sc) {
  const conv_geom *q = &j->q;
  size_t K = cg_k(q), P = cg_p(q), CHW = (size_t)q->c * q->h * q->w, OP = (size_t)q->o * P;
  if (j->lp) {
    uint16_t *c16 = (uint16_t *)cb;
    im2col16(q, (const uint16_t *)j->x + (size_t)n * CHW, c16, c16 + K * P);
    return apex__conv_onednn_fwd(sc, q->o, (int)K, (int)P, j->w, j->dt, c16, j->bias,
                                 (char *)j->out + (size_t)n * OP * apex_dtype_size(j->out_dtype), j->out_dtype);
  }
  float *on = (float *)j->out + (size_t)n * OP;
  im2col(q, (const float *)j->x + (size_t)n * CHW, cb, cb + K * P);
  if (j->bias)
    for (int oc = 0; oc < q->o; oc++)
      for (size_t p = 0; p < P; p++) on[(size_t)oc * P + p] = j->bias[oc];
  apex__sgemm_call(0, 0, q->o, (int)P, (int)K, 1.0f, j->w, (int)K, cb, (int)P, j->bias ? 1.0f : 0.0f, on, (int)P);
  return APEX_OK;
}

/* The images' passes on the threads, from image first on. */
static apex_status fwd_images(const conv_job *j, int first, float *cols, size_t per, apex__conv_dnn_scratch *sc) {
  apex_status err = APEX_OK;
  apex__blas_serial();
#pragma omp parallel if (conv_par(&j->q))
  {
    int t = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int n = first; n < j->q.n; n++)
      if (err == APEX_OK) keep_error(&err, fwd_image(j, n, cols + (size_t)t * per, sc ? sc + t : NULL));
  }
  return err;
}

/* bf16 (and f16, where oneDNN has it) operands try the oneDNN path first: the first image runs alone,
 * and when oneDNN has no primitive for the shape it says so there, with nothing written, and the
 * f32 path runs instead. */
apex_status apex__cpu_nn_conv2d(const apex_nn_conv2d_args *a) {
  conv_geom q = a->geom;
  size_t K = cg_k(&q), P = cg_p(&q), CHW = (size_t)q.c * q.h * q.w, OP = (size_t)q.o * P;
  int nt = conv_par(&q) ? apex_get_num_threads() : 1;
  size_t per = K * P + cg_padded(&q);
  const float *bf = apex__cpu_f32(a->bias, (size_t)q.o, &a->ws);
  float *cols = a->ws.get(a->ws.ctx, (size_t)nt * per * sizeof(float));
  if (!cols || (a->bias.data && !bf)) return APEX_ERR_OUT_OF_MEMORY;
  conv_job j = {q, 0, a->x.dtype, NULL, NULL, bf, NULL, a->out_dtype};
  if (apex__conv_onednn_wanted(a->x.dtype, a->w.dtype)) {
    apex__conv_dnn_scratch *sc = apex__conv_onednn_scratch(nt);
    if (!sc) return APEX_ERR_OUT_OF_MEMORY;
    j.lp = 1, j.x = a->x.data, j.w = a->w.data, j.out = a->out;
    apex_status st = fwd_image(&j, 0, cols, sc);
    if (st == APEX_OK) st = fwd_images(&j, 1, cols, per, sc);
    apex__conv_onednn_release(sc, nt);
    if (st != APEX_ERR_UNSUPPORTED) return st;
    j.lp = 0;
  }
  j.x = apex__cpu_f32(a->x, (size_t)q.n * CHW, &a->ws), j.w = apex__cpu_f32(a->w, (size_t)q.o * K, &a->ws);
  j.out = apex__cpu_out_f32(a->out, a->out_dtype, (size_t)q.n * OP, &a->ws);
  if (!j.x || !j.w || !j.out) return APEX_ERR_OUT_OF_MEMORY;
  fwd_images(&j, 0, cols, per, NULL);
  apex__cpu_store(a->out, a->out_dtype, j.out, (size_t)q.n * OP);
  return APEX_OK;
}

/* The weight gradient sums over images: the images are cut into a fixed number of runs (a function
 * of the shape alone), each run's sum is one partial [O, K] added image by image in order, and the
 * partials are added into the gradient in run order; so the bits do not depend on which thread ran
 * which run. Partials take at most PART_BYTES; 16 runs keep up to 16 threads busy. */
#define PART_BYTES ((size_t)16 << 20)
enum { MAX_RUNS = 16 };
static int weight_runs(const conv_geom *q) {
  size_t fit = PART_BYTES / ((q->o && cg_k(q) ? (size_t)q->o * cg_k(q) : 1) * sizeof(float));
  int r = fit < MAX_RUNS ? (int)fit : MAX_RUNS;
  if (r > q->n) r = q->n;
  return r < 1 ? 1 : r;
}

typedef struct bwd_job {
  conv_job c;
  const float *gout;
  float *gx, *gw, *part;
  double *bpart; /* the bias gradient's lanes per run */
  int fresh, runs;
} bwd_job;

/* Image n (of run r, which starts at image n0) into the run's partials and gx. Per thread, cb holds
 * the image's cols, then its cols' gradient, then the padded image. */
static apex_status bwd_image(const bwd_job *b, int r, int n, int n0, float *cb, apex__conv_dnn_scratch *sc) {
  const conv_geom *q = &b->c.q;
  size_t K = cg_k(q), P = cg_p(q), CHW = (size_t)q->c * q->h * q->w, OP = (size_t)q->o * P, OK = (size_t)q->o * K;
  float *gcb = cb + K * P, *pad = gcb + K * P;
  const float *gon = b->gout + (size_t)n * OP;
  apex_status st = APEX_OK;
  if (b->bpart) /* the bias gradient in the same lanes per run, summed over runs like the weight's */
    for (int oc = 0; oc < q->o; oc++) apex__lanes_add(b->bpart + ((size_t)r * q->o + oc) * APEX__LANES, gon + (size_t)oc * P, P);
  const uint16_t *g16 = NULL; /* the lp path's gradient, rounded to bf16 once for both products */
  if (b->c.lp && (b->gw || b->gx) && !(g16 = apex__conv_onednn_round(sc, q->o, (int)P, gon, b->c.dt)))
    return b->c.dt == APEX_BF16 ? APEX_ERR_OUT_OF_MEMORY : APEX_ERR_UNSUPPORTED;
  if (b->gw && b->c.lp) {
    uint16_t *c16 = (uint16_t *)cb;
    im2col16(q, (const uint16_t *)b->c.x + (size_t)n * CHW, c16, (uint16_t *)pad);
    st = apex__conv_onednn_wgrad(sc, q->o, (int)K, (int)P, g16, c16, b->c.dt, b->part + (size_t)r * OK, n > n0);
  } else if (b->gw) {
    im2col(q, (const float *)b->c.x + (size_t)n * CHW, cb, pad);
    apex__sgemm_call(0, 1, q->o, (int)K, (int)P, 1.0f, gon, (int)P, cb, (int)P, n > n0 ? 1.0f : 0.0f, b->part + (size_t)r * OK, (int)K);
  }
  if (b->gx && st == APEX_OK) {
    if (b->c.lp)
      st = apex__conv_onednn_dgrad(sc, q->o, (int)K, (int)P, b->c.w, b->c.dt, g16, gcb);
    else
      apex__sgemm_call(1, 0, (int)K, (int)P, q->o, 1.0f, b->c.w, (int)K, gon, (int)P, 0.0f, gcb, (int)P);
    if (st == APEX_OK) col2im_add(q, gcb, b->gx + (size_t)n * CHW, b->fresh, pad);
  }
  return st;
}

/* The runs' images on the threads; image 0 is left out when skip0 (it ran alone first). */
static apex_status bwd_runs(const bwd_job *b, int skip0, float *cols, size_t per, apex__conv_dnn_scratch *sc) {
  const conv_geom *q = &b->c.q;
  apex_status err = APEX_OK;
  apex__blas_serial();
#pragma omp parallel if (conv_par(q))
  {
    int t = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int r = 0; r < b->runs; r++) {
      int n0 = (int)((long long)q->n * r / b->runs), n1 = (int)((long long)q->n * (r + 1) / b->runs);
      for (int n = n0 + (skip0 && r == 0); n < n1 && err == APEX_OK; n++)
        keep_error(&err, bwd_image(b, r, n, n0, cols + (size_t)t * per, sc ? sc + t : NULL));
    }
  }
  return err;
}

apex_status apex__cpu_nn_conv2d_bwd(const apex_nn_conv2d_bwd_args *a) {
  conv_geom q = a->geom;
  size_t K = cg_k(&q), P = cg_p(&q), CHW = (size_t)q.c * q.h * q.w, OK = (size_t)q.o * K;
  float *gx = a->gx, *gw = a->gw, *gb = a->gb;
  int nt = conv_par(&q) ? apex_get_num_threads() : 1, runs = weight_runs(&q);
  if (!gw && !gx && !gb) return APEX_OK;
  apex__cpu_grad_begin(gw, OK, a->accumulate_w);
  apex__cpu_grad_begin(gb, (size_t)q.o, a->accumulate_b);
  size_t per = 2 * K * P + cg_padded(&q), bbytes = (size_t)runs * q.o * APEX__LANES * sizeof(double);
  float *cols = a->ws.get(a->ws.ctx, (size_t)nt * per * sizeof(float));
  float *part = gw ? a->ws.get(a->ws.ctx, (OK ? (size_t)runs * OK : 1) * sizeof(float)) : NULL;
  double *bpart = gb ? a->ws.get(a->ws.ctx, bbytes) : NULL;
  if ((gw && !part) || (gb && !bpart) || !cols) return APEX_ERR_OUT_OF_MEMORY;
  if (gb) memset(bpart, 0, bbytes);
  bwd_job b = {{q, 0, a->x.dtype, NULL, NULL, NULL, NULL, APEX_F32}, a->gout, gx, gw, part, bpart, !a->accumulate_x, runs};
  apex_status st = APEX_ERR_UNSUPPORTED;
  if (apex__conv_onednn_wanted(a->x.dtype, a->w.dtype)) {
    apex__conv_dnn_scratch *sc = apex__conv_onednn_scratch(nt);
    if (!sc) return APEX_ERR_OUT_OF_MEMORY;
    b.c.lp = 1, b.c.x = a->x.data, b.c.w = a->w.data;
    /* image 0 alone first: an unsupported product there has written only the run's partials (the
     * f32 path rewrites them from image 0) and never gx */
    st = bwd_image(&b, 0, 0, 0, cols, sc);
    if (st == APEX_OK) st = bwd_runs(&b, 1, cols, per, sc);
    apex__conv_onednn_release(sc, nt);
    if (st != APEX_OK && st != APEX_ERR_UNSUPPORTED) return st;
  }
  if (st == APEX_ERR_UNSUPPORTED) {
    b.c.lp = 0;
    if (gb) memset(bpart, 0, bbytes);
    b.c.x = gw ? apex__cpu_f32(a->x, (size_t)q.n * CHW, &a->ws) : NULL;
    b.c.w = gx ? apex__cpu_f32(a->w, OK, &a->ws) : NULL;
    if ((gw && !b.c.x) || (gx && !b.c.w)) return APEX_ERR_OUT_OF_MEMORY;
    bwd_runs(&b, 0, cols, per, NULL);
  }
  if (gw) {
#pragma omp parallel for schedule(static) if (conv_par(&q) && OK > APEX__CPU_PAR_MIN)
    for (size_t j = 0; j < OK; j++) {
      float s = part[j];
      for (int r = 1; r < runs; r++) s += part[(size_t)r * OK + j];
      gw[j] += s;
    }
  }
  for (int oc = 0; gb && oc < q.o; oc++) {
    double acc[APEX__LANES];
    for (int l = 0; l < APEX__LANES; l++) {
      acc[l] = 0;
      for (int r = 0; r < runs; r++) acc[l] += bpart[((size_t)r * q.o + oc) * APEX__LANES + l];
    }
    gb[oc] += (float)apex__lanes_total(acc);
  }
  return APEX_OK;
}

/* ---- pooling ------------------------------------------------------------------------------------ */

/* A window's running maximum takes v (at index k) when v is greater or NaN (so NaN propagates, the
 * last one winning), as the general loop does. The choice is made with bit masks: written as
 * ternaries, gcc vectorised the 2x2 loop but compiled its scalar remainder (3 of the 7 outputs of a
 * row of the benchmark CNN's second pool) into branches, which random data mispredicts; that pool
 * took 1.12 ms on one thread, 0.63 with the masks (same bits). */
static inline void take_max(float v, int32_t k, float *best, int32_t *at) {
  uint32_t m = -(uint32_t)((v > *best) | (v != v)), vb, bb;
  memcpy(&vb, &v, sizeof vb);
  memcpy(&bb, best, sizeof bb);
  bb = (vb & m) | (bb & ~m);
  memcpy(best, &bb, sizeof bb);
  *at = (int32_t)(((uint32_t)k & m) | ((uint32_t)*at & ~m));
}

/* Max pooling of one plane whose windows all lie inside it, without branches: each window keeps
 * its first element, then takes each next one through take_max. The maxima of data are coin flips
 * to the branch predictor: the branching loop took 16% of the benchmark CNN's step. */
static void max_plane(const conv_geom *q, const float *restrict src, float *restrict o, int32_t *restrict arg) {
  for (int oh = 0; oh < q->ho; oh++) {
    float *orow = o + (size_t)oh * q->wo;
    int32_t *arow = arg + (size_t)oh * q->wo;
    if (q->kh == 2 && q->kw == 2 && q->sw == 2) { /* written out so that gcc vectorises it */
      int32_t i0 = oh * q->sh * q->w, w = q->w;
      const float *restrict r0 = src + i0, *restrict r1 = r0 + w;
      for (int ow = 0; ow < q->wo; ow++) {
        float best = r0[2 * ow];
        int32_t at = i0 + 2 * ow;
        take_max(r0[2 * ow + 1], i0 + 2 * ow + 1, &best, &at);
        take_max(r1[2 * ow], i0 + w + 2 * ow, &best, &at);
        take_max(r1[2 * ow + 1], i0 + w + 2 * ow + 1, &best, &at);
        orow[ow] = best;
        arow[ow] = at;
      }
      continue;
    }
    for (int ow = 0; ow < q->wo; ow++) {
      int32_t at = oh * q->sh * q->w + ow * q->sw;
      float best = src[at];
      for (int i = 0; i < q->kh; i++)
        for (int j = 0; j < q->kw; j++) {
          int32_t k = (oh * q->sh + i) * q->w + ow * q->sw + j;
          take_max(src[k], k, &best, &at);
        }
      orow[ow] = best;
      arow[ow] = at;
    }
  }
}

/* One plane: src [h, w] into o [ho, wo] (and arg, for max pooling). */
static void pool_plane(const conv_geom *q, const float *restrict src, float *restrict o, int32_t *restrict arg, float inv) {
  if (arg && q->ph == 0 && q->pw == 0) { /* every window lies inside the image */
    max_plane(q, src, o, arg);
    return;
  }
  for (int oh = 0; oh < q->ho; oh++)
    for (int ow = 0; ow < q->wo; ow++) {
      float best = -FLT_MAX, s = 0.0f;
      int32_t at = -1;
      for (int i = 0; i < q->kh; i++) {
        int ih = oh * q->sh - q->ph + i;
        if (ih < 0 || ih >= q->h) continue;
        for (int j = 0; j < q->kw; j++) {
          int iw = ow * q->sw - q->pw + j;
          if (iw < 0 || iw >= q->w) continue;
          float v = src[ih * q->w + iw];
          s += v;
          if (v > best || at < 0 || v != v) best = v, at = ih * q->w + iw;
        }
      }
      size_t oi = (size_t)oh * q->wo + ow;
      if (arg) {
        o[oi] = best;
        arg[oi] = at;
      } else {
        o[oi] = s * inv;
      }
    }
}

/* Low-precision planes are widened one at a time into the thread's buffer, pooled there and the
 * result rounded into out: the bits of widening the whole input first (the pooling is f32 math
 * either way), without its copy (the benchmark CNN's first pool reads 12.8 MB as f32). */
apex_status apex__cpu_nn_pool2d(const apex_nn_pool2d_args *a) {
  conv_geom q = a->geom;
  int32_t *arg = a->argmax;
  size_t planes = (size_t)q.n * q.c, P = (size_t)q.ho * q.wo, HW = (size_t)q.h * q.w;
  float inv = 1.0f / (float)(q.kh * q.kw);
  int direct = a->x.dtype == APEX_F32 && a->out_dtype == APEX_F32, par = planes * P > APEX__CPU_PAR_MIN;
  int nt = par ? apex_get_num_threads() : 1;
  float *buf = direct ? NULL : a->ws.get(a->ws.ctx, (size_t)nt * (HW + P) * sizeof(float));
  if (!direct && !buf) return APEX_ERR_OUT_OF_MEMORY;
#pragma omp parallel num_threads(nt) if (par)
  {
    float *mine = direct ? NULL : buf + (size_t)omp_get_thread_num() * (HW + P);
#pragma omp for schedule(static)
    for (size_t pl = 0; pl < planes; pl++) {
      float *o = apex__cpu_row_out(a->out, a->out_dtype, pl * P, mine ? mine + HW : NULL);
      pool_plane(&q, apex__cpu_row_f32(a->x, pl * HW, HW, mine), o, arg ? arg + pl * P : NULL, inv);
      apex__cpu_row_store(a->out, a->out_dtype, pl * P, o, P);
    }
  }
  return APEX_OK;
}

apex_status apex__cpu_nn_pool2d_bwd(const apex_nn_pool2d_bwd_args *a) {
  int fresh = !a->accumulate_x;
  float *gx = a->gx;
  conv_geom q = a->geom;
  size_t planes = (size_t)q.n * q.c, P = (size_t)q.ho * q.wo, HW = (size_t)q.h * q.w;
  const float *go = a->gout;
  const int32_t *arg = a->argmax;
  float inv = 1.0f / (float)(q.kh * q.kw);
#pragma omp parallel for schedule(static) if (planes * P > APEX__CPU_PAR_MIN)
  for (size_t pl = 0; pl < planes; pl++) {
    float *dst = gx + pl * HW;
    if (fresh) memset(dst, 0, HW * sizeof(float)); /* while the plane is about to be in cache anyway */
    for (int oh = 0; oh < q.ho; oh++)
      for (int ow = 0; ow < q.wo; ow++) {
        size_t oi = pl * P + (size_t)oh * q.wo + ow;
        if (arg) {
          dst[arg[oi]] += go[oi];
          continue;
        }
        for (int i = 0; i < q.kh; i++) {
          int ih = oh * q.sh - q.ph + i;
          if (ih < 0 || ih >= q.h) continue;
          for (int j = 0; j < q.kw; j++) {
            int iw = ow * q.sw - q.pw + j;
            if (iw >= 0 && iw < q.w) dst[ih * q.w + iw] += go[oi] * inv;
          }
        }
      }
  }
  return APEX_OK;
}
