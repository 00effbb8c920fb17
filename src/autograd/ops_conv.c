/* ops_conv.c: conv2d (im2col + one sgemm for the whole batch), max and average pooling.
 *
 * conv2d lays the batch's patches out as one matrix cols [C*KH*KW, N*HO*WO], so the forward is one
 * GEMM W [O, C*KH*KW] @ cols (large enough to keep every thread busy) and the backward two more.
 * The forward keeps cols for the weight gradient. col2im, the adjoint of im2col, runs one input
 * channel per thread: every input element is summed by one thread in a fixed order. */
#include <float.h>

#include "autograd/ag.h"

typedef struct conv_geom {
  int n, c, h, w, o, kh, kw, sh, sw, ph, pw, ho, wo;
} conv_geom;

static size_t cg_k(const conv_geom *q) { return (size_t)q->c * q->kh * q->kw; }
static size_t cg_np(const conv_geom *q) { return (size_t)q->n * q->ho * q->wo; }

static void im2col(const conv_geom *q, const float *x, float *cols) {
  size_t K = cg_k(q), NP = cg_np(q), P = (size_t)q->ho * q->wo;
#pragma omp parallel for schedule(static) if (K * NP > AG_PAR_MIN)
  for (size_t k = 0; k < K; k++) {
    int c = (int)(k / (size_t)(q->kh * q->kw)), ki = (int)(k / (size_t)q->kw % (size_t)q->kh), kj = (int)(k % (size_t)q->kw);
    float *row = cols + k * NP;
    for (int n = 0; n < q->n; n++) {
      const float *plane = x + ((size_t)n * q->c + c) * q->h * q->w;
      float *dst = row + (size_t)n * P;
      for (int oh = 0; oh < q->ho; oh++) {
        int ih = oh * q->sh - q->ph + ki;
        float *d = dst + (size_t)oh * q->wo;
        if (ih < 0 || ih >= q->h) {
          memset(d, 0, (size_t)q->wo * sizeof(float));
          continue;
        }
        const float *src = plane + (size_t)ih * q->w;
        for (int ow = 0; ow < q->wo; ow++) {
          int iw = ow * q->sw - q->pw + kj;
          d[ow] = iw >= 0 && iw < q->w ? src[iw] : 0.0f;
        }
      }
    }
  }
}

static void col2im_add(const conv_geom *q, const float *cols, float *gx) {
  size_t NP = cg_np(q), P = (size_t)q->ho * q->wo;
#pragma omp parallel for schedule(static) if (cg_k(q) * NP > AG_PAR_MIN)
  for (int c = 0; c < q->c; c++)
    for (int ki = 0; ki < q->kh; ki++)
      for (int kj = 0; kj < q->kw; kj++) {
        const float *row = cols + (((size_t)c * q->kh + ki) * q->kw + kj) * NP;
        for (int n = 0; n < q->n; n++) {
          float *plane = gx + ((size_t)n * q->c + c) * q->h * q->w;
          const float *src = row + (size_t)n * P;
          for (int oh = 0; oh < q->ho; oh++) {
            int ih = oh * q->sh - q->ph + ki;
            if (ih < 0 || ih >= q->h) continue;
            for (int ow = 0; ow < q->wo; ow++) {
              int iw = ow * q->sw - q->pw + kj;
              if (iw >= 0 && iw < q->w) plane[(size_t)ih * q->w + iw] += src[(size_t)oh * q->wo + ow];
            }
          }
        }
      }
}

_Static_assert(sizeof(conv_geom) <= sizeof(((apex_var *)0)->ia), "conv_geom fits an op's parameters");
static void geom_store(apex_var *out, const conv_geom *q) { memcpy(out->ia, q, sizeof *q); }
static conv_geom geom_load(const apex_var *out) {
  conv_geom q;
  memcpy(&q, out->ia, sizeof q);
  return q;
}

apex_var *apex_conv2d(apex_graph *g, apex_var *x, apex_var *w, apex_var *b, const apex_conv2d_options *opts) {
  static const apex_conv2d_options defaults = {0};
  if (!opts) opts = &defaults;
  apex_var *in[3] = {x, w, b}, *u[3];
  apex_dtype dt;
  if (apex__dispatch(g, APEX_OP_CONV2D, 3, in, 4u, u, &dt) != APEX_OK) return NULL;
  const apex_tensor *X = u[0]->value, *W = u[1]->value;
  conv_geom q = {0};
  q.sh = opts->stride_h ? opts->stride_h : 1;
  q.sw = opts->stride_w ? opts->stride_w : 1;
  q.ph = opts->pad_h;
  q.pw = opts->pad_w;
  if (X->ndim != 4 || W->ndim != 4 || X->shape[1] != W->shape[1] || (b && (u[2]->value->ndim != 1 || u[2]->value->shape[0] != W->shape[0])))
    return apex__fail_null(APEX_ERR_SHAPE, "conv2d: input %s, weight %s, bias %s do not fit (need x [N, C, H, W], w [O, C, KH, KW], b [O])",
                           apex__shape(x), apex__shape(w), b ? apex__shape(b) : "none");
  if (q.sh < 1 || q.sw < 1 || q.ph < 0 || q.pw < 0)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "conv2d: stride %dx%d, padding %dx%d on input %s", q.sh, q.sw, q.ph, q.pw, apex__shape(x));
  q.n = (int)X->shape[0], q.c = (int)X->shape[1], q.h = (int)X->shape[2], q.w = (int)X->shape[3];
  q.o = (int)W->shape[0], q.kh = (int)W->shape[2], q.kw = (int)W->shape[3];
  q.ho = (q.h + 2 * q.ph - q.kh) / q.sh + 1;
  q.wo = (q.w + 2 * q.pw - q.kw) / q.sw + 1;
  if (q.h + 2 * q.ph < q.kh || q.w + 2 * q.pw < q.kw)
    return apex__fail_null(APEX_ERR_SHAPE, "conv2d: kernel %s is larger than the padded input %s", apex__shape(w), apex__shape(x));
  int64_t shape[4] = {q.n, q.o, q.ho, q.wo};
  apex_var *out = apex__result(g, APEX_OP_CONV2D, dt, 4, shape, 3, u);
  if (!out) return NULL;
  geom_store(out, &q);
  size_t K = cg_k(&q), NP = cg_np(&q), P = (size_t)q.ho * q.wo;
  const float *xf = apex__f32(g, X), *wf = apex__f32(g, W), *bf = b ? apex__f32(g, u[2]->value) : NULL;
  float *cols = apex__scratch(g, ag_nz(K * NP) * sizeof(float));
  float *y = apex__scratch(g, ag_nz((size_t)q.o * NP) * sizeof(float));
  float *o = apex__out_f32(g, out);
  if (!xf || !wf || !cols || !y || !o || (b && !bf)) return NULL;
  out->aux = cols;
  im2col(&q, xf, cols);
  apex__sgemm(0, 0, q.o, (int)NP, (int)K, 1.0f, wf, (int)K, cols, (int)NP, 0.0f, y, (int)NP);
  size_t planes = (size_t)q.n * q.o;
#pragma omp parallel for schedule(static) if (planes * P > AG_PAR_MIN)
  for (size_t pl = 0; pl < planes; pl++) {
    size_t n = pl / (size_t)q.o, oc = pl % (size_t)q.o;
    const float *src = y + oc * NP + n * P;
    float bias = bf ? bf[oc] : 0.0f, *dst = o + pl * P;
    for (size_t p = 0; p < P; p++) dst[p] = src[p] + bias;
  }
  apex__store(out, o);
  return out;
}

apex_status apex__bwd_conv2d(apex_graph *g, apex_var *out) {
  conv_geom q = geom_load(out);
  size_t K = cg_k(&q), NP = cg_np(&q), P = (size_t)q.ho * q.wo;
  float *gx = apex__gbuf(g, out->in[0]), *gw = apex__gbuf(g, out->in[1]), *gb = apex__gbuf(g, out->in[2]);
  float *goT = apex__scratch(g, ag_nz((size_t)q.o * NP) * sizeof(float));
  if (!goT) return APEX_ERR_OUT_OF_MEMORY;
  const float *go = out->gbuf;
  size_t planes = (size_t)q.n * q.o;
#pragma omp parallel for schedule(static) if (planes * P > AG_PAR_MIN)
  for (size_t pl = 0; pl < planes; pl++) {
    size_t n = pl / (size_t)q.o, oc = pl % (size_t)q.o;
    memcpy(goT + oc * NP + n * P, go + pl * P, P * sizeof(float));
  }
  if (gw) apex__sgemm(0, 1, q.o, (int)K, (int)NP, 1.0f, goT, (int)NP, out->aux, (int)NP, 1.0f, gw, (int)K);
  if (gb) {
#pragma omp parallel for schedule(static) if (planes * P > AG_PAR_MIN)
    for (int oc = 0; oc < q.o; oc++) gb[oc] += (float)apex__sum_serial(goT + (size_t)oc * NP, NP);
  }
  if (gx) {
    const float *wf = apex__f32(g, out->in[1]->value);
    float *gcols = apex__scratch(g, ag_nz(K * NP) * sizeof(float));
    if (!wf || !gcols) return APEX_ERR_OUT_OF_MEMORY;
    apex__sgemm(1, 0, (int)K, (int)NP, q.o, 1.0f, wf, (int)K, goT, (int)NP, 0.0f, gcols, (int)NP);
    col2im_add(&q, gcols, gx);
  }
  return APEX_OK;
}

/* ---- pooling ------------------------------------------------------------------------------------ */

static apex_var *pool(apex_graph *g, apex_op op, apex_var *x, const apex_pool2d_options *opts) {
  apex_var *u;
  apex_dtype dt;
  if (apex__dispatch(g, op, 1, &x, 0, &u, &dt) != APEX_OK) return NULL;
  const char *name = apex_op_name(op);
  if (!opts) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL options (the kernel size is required) for %s", name, apex__shape(x));
  const apex_tensor *X = u->value;
  conv_geom q = {0};
  q.kh = opts->kernel_h, q.kw = opts->kernel_w;
  q.sh = opts->stride_h ? opts->stride_h : q.kh;
  q.sw = opts->stride_w ? opts->stride_w : q.kw;
  q.ph = opts->pad_h, q.pw = opts->pad_w;
  if (X->ndim != 4) return apex__fail_null(APEX_ERR_SHAPE, "%s: input %s must be [N, C, H, W]", name, apex__shape(x));
  if (q.kh < 1 || q.kw < 1 || q.sh < 1 || q.sw < 1 || q.ph < 0 || q.pw < 0 || 2 * q.ph > q.kh || 2 * q.pw > q.kw)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: kernel %dx%d, stride %dx%d, padding %dx%d on %s (padding at most half the kernel)", name,
                           q.kh, q.kw, q.sh, q.sw, q.ph, q.pw, apex__shape(x));
  q.n = (int)X->shape[0], q.c = (int)X->shape[1], q.h = (int)X->shape[2], q.w = (int)X->shape[3], q.o = q.c;
  if (q.h + 2 * q.ph < q.kh || q.w + 2 * q.pw < q.kw)
    return apex__fail_null(APEX_ERR_SHAPE, "%s: kernel %dx%d is larger than the padded input %s", name, q.kh, q.kw, apex__shape(x));
  q.ho = (q.h + 2 * q.ph - q.kh) / q.sh + 1;
  q.wo = (q.w + 2 * q.pw - q.kw) / q.sw + 1;
  int64_t shape[4] = {q.n, q.c, q.ho, q.wo};
  apex_var *out = apex__result(g, op, dt, 4, shape, 1, &u);
  if (!out) return NULL;
  geom_store(out, &q);
  const float *xf = apex__f32(g, X);
  float *o = apex__out_f32(g, out);
  size_t planes = (size_t)q.n * q.c, P = (size_t)q.ho * q.wo, HW = (size_t)q.h * q.w;
  int32_t *arg = op == APEX_OP_MAX_POOL2D ? apex__scratch(g, ag_nz(planes * P) * sizeof(int32_t)) : NULL;
  if (!xf || !o || (op == APEX_OP_MAX_POOL2D && !arg)) return NULL;
  out->aux = arg;
  float inv = 1.0f / (float)(q.kh * q.kw);
#pragma omp parallel for schedule(static) if (planes * P > AG_PAR_MIN)
  for (size_t pl = 0; pl < planes; pl++) {
    const float *src = xf + pl * HW;
    for (int oh = 0; oh < q.ho; oh++)
      for (int ow = 0; ow < q.wo; ow++) {
        float best = -FLT_MAX, s = 0.0f;
        int32_t at = -1;
        for (int i = 0; i < q.kh; i++) {
          int ih = oh * q.sh - q.ph + i;
          if (ih < 0 || ih >= q.h) continue;
          for (int j = 0; j < q.kw; j++) {
            int iw = ow * q.sw - q.pw + j;
            if (iw < 0 || iw >= q.w) continue;
            float v = src[ih * q.w + iw];
            s += v;
            if (v > best || at < 0 || v != v) best = v, at = ih * q.w + iw;
          }
        }
        size_t oi = pl * P + (size_t)oh * q.wo + ow;
        if (arg) {
          o[oi] = best;
          arg[oi] = at;
        } else {
          o[oi] = s * inv;
        }
      }
  }
  apex__store(out, o);
  return out;
}

apex_var *apex_max_pool2d(apex_graph *g, apex_var *x, const apex_pool2d_options *o) { return pool(g, APEX_OP_MAX_POOL2D, x, o); }
apex_var *apex_avg_pool2d(apex_graph *g, apex_var *x, const apex_pool2d_options *o) { return pool(g, APEX_OP_AVG_POOL2D, x, o); }

static apex_status pool_bwd(apex_graph *g, apex_var *out) {
  float *gx = apex__gbuf(g, out->in[0]);
  if (!gx) return APEX_OK;
  conv_geom q = geom_load(out);
  size_t planes = (size_t)q.n * q.c, P = (size_t)q.ho * q.wo, HW = (size_t)q.h * q.w;
  const float *go = out->gbuf;
  const int32_t *arg = out->aux;
  float inv = 1.0f / (float)(q.kh * q.kw);
#pragma omp parallel for schedule(static) if (planes * P > AG_PAR_MIN)
  for (size_t pl = 0; pl < planes; pl++) {
    float *dst = gx + pl * HW;
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

apex_status apex__bwd_max_pool2d(apex_graph *g, apex_var *out) { return pool_bwd(g, out); }
apex_status apex__bwd_avg_pool2d(apex_graph *g, apex_var *out) { return pool_bwd(g, out); }
