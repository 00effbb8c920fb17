/* elementwise.c: the CPU backend's elementwise nn kernels (args_nn.h): broadcasting binary ops and
 * comparisons, scale, the activations, exp/log/pow and dropout, forward and backward.
 *
 * A broadcast's rows are independent, so the forward runs them on threads; a backward that must sum
 * over broadcast positions runs them in order on one thread, which keeps it bitwise independent of
 * the thread count.
 *
 * Operands and results are read and written in their own dtypes, EW_BLOCK elements at a time: an
 * f16/bf16 block is widened into the thread's stack by apex__convert_range (apex_convert's bits, in
 * vector registers where the ISA allows), the f32 math runs on it as it would on a whole widened
 * copy, and a half result is narrowed from the stack. So the bits are those of widening whole
 * tensors, and no op holds a whole-tensor f32 copy. GELU, GELU_TANH and tanh of a half input look
 * their f32 results and slopes up in tables over its 65536 values, made by those same loops. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "apex/rng.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/vmath.h"
#include "backend/grad_dtype.h"
#include "core/internal.h"

/* Elements an f16/bf16 operand or result is widened or narrowed in at a time, on the thread's stack. */
#define EW_BLOCK 1024

/* Elements [lo, lo + m) of b (stride 1, or 0: one element repeated) as f32 (cpu_kernels.h's row
 * widening, of the one element when repeated); *st is the stride to read the result with. */
static const float *ew_in(apex_nn_buf b, size_t lo, size_t m, size_t stride, float *buf, size_t *st) {
  *st = stride;
  return apex__cpu_row_f32(b, lo, stride ? m : 1, buf);
}

/* f32 math over n elements: out[i] from x[i] (and go[i] in a backward, which adds into out). */
typedef void ew_fn(const void *ctx, const float *restrict x, const float *restrict go, float *restrict out, size_t n);

/* Runs f over n elements of x (native), EW_BLOCK at a time on threads, into out (out_dtype), with
 * go (f32, may be NULL) beside it. Each block's elements see the same f32 values and math as a whole
 * widened copy would, whatever thread runs it. */
static void ew_map(ew_fn *f, const void *ctx, apex_nn_buf x, const float *go, void *out, apex_dtype out_dtype, size_t n) {
  size_t nb = (n + EW_BLOCK - 1) / EW_BLOCK;
  apex_simd_active(); /* resolve the conversions' path before the threads read it */
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    float xb[EW_BLOCK], ob[EW_BLOCK];
    size_t lo = b * EW_BLOCK, m = n - lo < EW_BLOCK ? n - lo : EW_BLOCK, st;
    const float *xp = ew_in(x, lo, m, 1, xb, &st);
    float *op = apex__cpu_row_out(out, out_dtype, lo, ob);
    f(ctx, xp, go ? go + lo : NULL, op, m);
    apex__cpu_row_store(out, out_dtype, lo, ob, m);
  }
}

/* Row r's base offsets into a and b. */
static void row_offsets(const apex_nn_bcast *p, size_t r, size_t off[2]) {
  off[0] = off[1] = 0;
  for (int d = p->nd - 2; d >= 0; d--) {
    size_t i = r % (size_t)p->shape[d];
    r /= (size_t)p->shape[d];
    off[0] += i * (size_t)p->st[0][d];
    off[1] += i * (size_t)p->st[1][d];
  }
}

apex_status apex__cpu_nn_binary(const apex_nn_binary_args *a) {
  const apex_nn_bcast *p = a->plan;
  apex_nn_binary_kind op = a->kind;
  size_t rows = p->rows, len = p->len, n = rows * len;
  size_t sa0 = p->nd ? (size_t)p->st[0][p->nd - 1] : 0, sb0 = p->nd ? (size_t)p->st[1][p->nd - 1] : 0;
  apex_simd_active(); /* resolve the conversions' path before the threads read it */
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t r = 0; r < rows; r++) {
    size_t off[2];
    row_offsets(p, r, off);
    for (size_t j0 = 0; j0 < len; j0 += EW_BLOCK) {
      float xb[EW_BLOCK], yb[EW_BLOCK], zb[EW_BLOCK];
      size_t m = len - j0 < EW_BLOCK ? len - j0 : EW_BLOCK, sa, sb;
      const float *x = ew_in(a->a, off[0] + j0 * sa0, m, sa0, xb, &sa), *y = ew_in(a->b, off[1] + j0 * sb0, m, sb0, yb, &sb);
      float *z = apex__cpu_row_out(a->out, a->out_dtype, r * len + j0, zb);
      switch (op) {
      case APEX_NN_ADD: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] + y[j * sb]; break;
      case APEX_NN_SUB: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] - y[j * sb]; break;
      case APEX_NN_MUL: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] * y[j * sb]; break;
      case APEX_NN_POW: for (size_t j = 0; j < m; j++) z[j] = powf(x[j * sa], y[j * sb]); break;
      case APEX_NN_GT: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] > y[j * sb] ? 1.0f : 0.0f; break;
      case APEX_NN_LT: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] < y[j * sb] ? 1.0f : 0.0f; break;
      case APEX_NN_EQ: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] == y[j * sb] ? 1.0f : 0.0f; break;
      default: for (size_t j = 0; j < m; j++) z[j] = x[j * sa] / y[j * sb]; break;
      }
      apex__cpu_row_store(a->out, a->out_dtype, r * len + j0, zb, m);
    }
  }
  return APEX_OK;
}

/* d(out)/d(operand k) at one position, given the operands' values there. */
static inline float partial(apex_nn_binary_kind op, int k, float x, float y) {
  switch (op) {
  case APEX_NN_ADD: return 1.0f;
  case APEX_NN_SUB: return k ? -1.0f : 1.0f;
  case APEX_NN_MUL: return k ? x : y;
  /* PyTorch's pow_backward_self / pow_backward_exponent, zeros included: b == 0 gives a^b = 1 for
   * every a, and 0^b (b >= 0) has log(0) * 0 = NaN where the limit from a > 0 is 0 */
  case APEX_NN_POW:
    if (!k) return y == 0.0f ? 0.0f : y * powf(x, y - 1.0f);
    return x == 0.0f && y >= 0.0f ? 0.0f : powf(x, y) * logf(x);
  default: return k ? -x / (y * y) : 1.0f / y;
  }
}

static apex_status binary_bwd_k(const void *a) { return apex__cpu_nn_binary_bwd(a); }

apex_status apex__cpu_nn_binary_bwd(const apex_nn_binary_bwd_args *a) {
  int ran;
  apex_status rs = apex__binary_bwd_f32(&apex__cpu_backend, binary_bwd_k, a, &ran);
  if (ran) return rs;
  const apex_nn_bcast *p = a->plan;
  apex_nn_binary_kind op = a->kind;
  /* add and sub have constant partials and read no values */
  int reads = op == APEX_NN_MUL || op == APEX_NN_DIV || op == APEX_NN_POW;
  if (reads && (!a->a.data || !a->b.data))
    return apex__fail(APEX_ERR_INVALID_ARG, "nn_binary_bwd: the operands' values are needed for this kind; pass a and b");
  const float *go = a->gout;
  float *gout[2] = {a->ga, a->gb};
  size_t numel[2] = {a->numel_a, a->numel_b};
  int acc[2] = {a->accumulate_a, a->accumulate_b};
  size_t rows = p->rows, len = p->len, n = rows * len;
  size_t s0[2] = {p->nd ? (size_t)p->st[0][p->nd - 1] : 0, p->nd ? (size_t)p->st[1][p->nd - 1] : 0};
  apex_simd_active(); /* resolve the conversions' path before the threads read it */
  for (int k = 0; k < 2; k++) {
    float *gk = gout[k];
    if (!gk) continue;
    apex__cpu_grad_begin(gk, numel[k], acc[k]);
    int full = numel[k] == n; /* no broadcast: each output position has its own element */
#pragma omp parallel for schedule(static) if (full && n > APEX__CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
      size_t off[2];
      row_offsets(p, r, off);
      size_t sk = s0[k];
      for (size_t j0 = 0; j0 < len; j0 += EW_BLOCK) {
        size_t m = len - j0 < EW_BLOCK ? len - j0 : EW_BLOCK;
        const float *gr = go + r * len + j0;
        float *gd = gk + off[k] + j0 * sk;
        if (!reads) {
          float c = partial(op, k, 0.0f, 0.0f);
          for (size_t j = 0; j < m; j++) gd[j * sk] += gr[j] * c;
          continue;
        }
        float xb[EW_BLOCK], yb[EW_BLOCK];
        size_t sa, sb;
        const float *x = ew_in(a->a, off[0] + j0 * s0[0], m, s0[0], xb, &sa), *y = ew_in(a->b, off[1] + j0 * s0[1], m, s0[1], yb, &sb);
        for (size_t j = 0; j < m; j++) gd[j * sk] += gr[j] * partial(op, k, x[j * sa], y[j * sb]);
      }
    }
  }
  return APEX_OK;
}

static void scale_f32(const void *ctx, const float *restrict x, const float *restrict go, float *restrict o, size_t n) {
  (void)go;
  float s = *(const float *)ctx;
  for (size_t i = 0; i < n; i++) o[i] = x[i] * s;
}

apex_status apex__cpu_nn_scale(const apex_nn_scale_args *a) {
  ew_map(scale_f32, &a->s, a->x, NULL, a->out, a->out_dtype, a->n);
  return APEX_OK;
}

static apex_status scale_bwd_k(const void *a) { return apex__cpu_nn_scale_bwd(a); }

apex_status apex__cpu_nn_scale_bwd(const apex_nn_scale_bwd_args *a) {
  int ran;
  apex_status rs = apex__scale_bwd_f32(&apex__cpu_backend, scale_bwd_k, a, &ran);
  if (ran) return rs;
  const float *go = a->gout;
  float *gx = a->gx;
  float s = a->s;
  size_t n = a->n;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
  APEX__CPU_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += go[i] * s;
  return APEX_OK;
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* t[i] = tanh(u[i]) (erf_n: erf) for i < n (t may be u): vmath's vector function above the portable
 * ISA, libm's tanhf (erff) at it (the reference). Each GELU and tanh step below is otherwise the same
 * f32 operations at every ISA, so results differ from the reference only through tanh's or erf's
 * last bit (vmath.h). */
static void tanh_n(const float *u, float *t, size_t n) {
  if (apex__vtanh(u, t, n)) return;
  for (size_t i = 0; i < n; i++) t[i] = tanhf(u[i]);
}
static void erf_n(const float *u, float *t, size_t n) {
  if (apex__verf(u, t, n)) return;
  for (size_t i = 0; i < n; i++) t[i] = erff(u[i]);
}

/* kind(x) over n elements (ctx: the args, for the kind and p). */
static void unary_f32(const void *ctx, const float *restrict X, const float *restrict go, float *restrict o, size_t n) {
  (void)go;
  const apex_nn_unary_args *a = ctx;
  float p = a->p;
  switch (a->kind) {
  case APEX_NN_RELU:
    for (size_t i = 0; i < n; i++) o[i] = X[i] > 0.0f ? X[i] : 0.0f;
    break;
  case APEX_NN_GELU:
    for (size_t i = 0; i < n; i++) o[i] = X[i] * 0.70710678118654752f;
    erf_n(o, o, n);
    for (size_t i = 0; i < n; i++) o[i] = 0.5f * X[i] * (1.0f + o[i]);
    break;
  case APEX_NN_GELU_TANH:
    for (size_t i = 0; i < n; i++) o[i] = GELU_K * (X[i] + GELU_C * X[i] * X[i] * X[i]);
    tanh_n(o, o, n);
    for (size_t i = 0; i < n; i++) o[i] = 0.5f * X[i] * (1.0f + o[i]);
    break;
  case APEX_NN_TANH:
    tanh_n(X, o, n);
    break;
  case APEX_NN_EXP:
    for (size_t i = 0; i < n; i++) o[i] = expf(X[i]);
    break;
  case APEX_NN_LOG:
    for (size_t i = 0; i < n; i++) o[i] = logf(X[i]);
    break;
  case APEX_NN_POW_SCALAR:
    /* squares and square roots exactly rounded, as PyTorch's pow special-cases them */
    if (p == 2.0f) {
      for (size_t i = 0; i < n; i++) o[i] = X[i] * X[i];
    } else if (p == 0.5f) {
      for (size_t i = 0; i < n; i++) o[i] = sqrtf(X[i]);
    } else {
      for (size_t i = 0; i < n; i++) o[i] = powf(X[i], p);
    }
    break;
  default:
    for (size_t i = 0; i < n; i++) o[i] = 1.0f / (1.0f + expf(-X[i]));
    break;
  }
}

/* f[i] = kind'(x[i]) for GELU, GELU_TANH and TANH, whose backward is gx += go * f (n <= EW_BLOCK). */
static void act_slope(apex_nn_unary_kind kind, const float *restrict x, float *restrict f, size_t n) {
  if (kind == APEX_NN_GELU) {
    for (size_t i = 0; i < n; i++) f[i] = x[i] * 0.70710678118654752f;
    erf_n(f, f, n);
    for (size_t i = 0; i < n; i++) {
      float cdf = 0.5f * (1.0f + f[i]), pdf = 0.3989422804014327f * expf(-0.5f * x[i] * x[i]);
      f[i] = cdf + x[i] * pdf;
    }
  } else if (kind == APEX_NN_TANH) {
    tanh_n(x, f, n);
    for (size_t i = 0; i < n; i++) f[i] = 1.0f - f[i] * f[i];
  } else {
    for (size_t i = 0; i < n; i++) f[i] = GELU_K * (x[i] + GELU_C * x[i] * x[i] * x[i]);
    tanh_n(f, f, n);
    for (size_t i = 0; i < n; i++) {
      float t = f[i];
      f[i] = 0.5f * (1.0f + t) + 0.5f * x[i] * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x[i] * x[i]);
    }
  }
}

/* ---- activations of f16/bf16 inputs by table ---------------------------------------------------
 * A half input has 65536 values, so GELU, GELU_TANH and tanh of one, and their slopes, are functions
 * of its 16 bits: tables of the f32 results that the block loops above compute for each of them
 * (unary_f32, act_slope), made once per kind, dtype and set of tanh/erf bits (vector or libm, by the
 * ISA cap; vmath.h) on first use, give those bits with one load an element instead of a tanh in
 * double (the GELU took a fifth of a bf16 GPT step). Kept for the process; without memory for one,
 * the loops run as before. */
enum { ACT_VALUES = 65536, ACT_KINDS = 3 };
/* What a table holds: the f32 results, the f32 slopes, or the results rounded to the input's dtype
 * (for a result of that dtype, as apex__cpu_row_store rounds them: 128 KiB). */
typedef enum { ACT_RESULT, ACT_SLOPE, ACT_ROUNDED, ACT_WHATS } act_what;
static _Atomic(void *) act_tables[ACT_KINDS][2][2][ACT_WHATS]; /* [kind][bf16][vector][what] */

static int act_kind(apex_nn_unary_kind kind) {
  return kind == APEX_NN_GELU ? 0 : kind == APEX_NN_GELU_TANH ? 1 : kind == APEX_NN_TANH ? 2 : -1;
}

/* The table `what` of kind over every value of dt, or NULL (another kind or dtype, or no memory).
 * Call outside parallel regions: a first call computes it. */
static const void *act_table(apex_nn_unary_kind kind, apex_dtype dt, act_what what) {
  int k = act_kind(kind);
  if (k < 0 || (dt != APEX_F16 && dt != APEX_BF16)) return NULL;
  _Atomic(void *) *slot = &act_tables[k][dt == APEX_BF16][apex__vmath_vector()][what];
  void *t = atomic_load(slot), *none = NULL;
  if (t) return t;
  if (!(t = malloc(ACT_VALUES * (what == ACT_ROUNDED ? sizeof(uint16_t) : sizeof(float))))) return NULL;
  apex_nn_unary_args a = {.kind = kind};
  for (size_t lo = 0; lo < ACT_VALUES; lo += EW_BLOCK) {
    uint16_t h[EW_BLOCK];
    float x[EW_BLOCK], r[EW_BLOCK], *f = what == ACT_ROUNDED ? r : (float *)t + lo;
    for (size_t i = 0; i < EW_BLOCK; i++) h[i] = (uint16_t)(lo + i);
    apex__convert_range(x, APEX_F32, h, dt, EW_BLOCK);
    if (what == ACT_SLOPE)
      act_slope(kind, x, f, EW_BLOCK);
    else
      unary_f32(&a, x, NULL, f, EW_BLOCK);
    if (what == ACT_ROUNDED) apex__convert_range((uint16_t *)t + lo, dt, r, APEX_F32, EW_BLOCK);
  }
  if (!atomic_compare_exchange_strong(slot, &none, t)) { /* another thread made it first: the same values */
    free(t);
    t = none;
  }
  return t;
}

apex_status apex__cpu_nn_unary(const apex_nn_unary_args *a) {
  size_t n = a->n, nb = (n + EW_BLOCK - 1) / EW_BLOCK;
  const uint16_t *xh = a->x.data;
  const uint16_t *rounded = a->out_dtype == a->x.dtype ? act_table(a->kind, a->x.dtype, ACT_ROUNDED) : NULL;
  if (rounded) {
    uint16_t *o = a->out;
    APEX__CPU_PFOR
    for (size_t i = 0; i < n; i++) o[i] = rounded[xh[i]];
    return APEX_OK;
  }
  const float *tab = act_table(a->kind, a->x.dtype, ACT_RESULT);
  if (!tab) {
    ew_map(unary_f32, a, a->x, NULL, a->out, a->out_dtype, a->n);
    return APEX_OK;
  }
  apex_simd_active(); /* resolve the rounding's path before the threads read it */
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    float ob[EW_BLOCK];
    size_t lo = b * EW_BLOCK, m = n - lo < EW_BLOCK ? n - lo : EW_BLOCK;
    float *op = apex__cpu_row_out(a->out, a->out_dtype, lo, ob);
    for (size_t i = 0; i < m; i++) op[i] = tab[xh[lo + i]];
    apex__cpu_row_store(a->out, a->out_dtype, lo, ob, m);
  }
  return APEX_OK;
}

/* ReLU's backward reads its output, not its input, so that the input (usually a linear's output
 * nothing else keeps) can go. The output is +0 or the positive input itself, in the input's dtype
 * (never -0 or NaN), so its bits are non-zero exactly where the input was > 0: tested as raw bits, a
 * half output needs no widening to f32. The gradient is loaded whatever the mask and then selected,
 * so that the loop vectorises into masks instead of branching on every element (the signs of a ReLU
 * input are coin flips to the branch predictor: the branching loop took 15% of the benchmark CNN's
 * step). */
#define RELU_BWD(T)                                                  \
  do {                                                               \
    const T *restrict o = y;                                         \
    if (fresh) {                                                     \
      APEX__CPU_PFOR                                                 \
      for (size_t i = 0; i < n; i++) {                               \
        float v = go[i] + 0.0f; /* 0 + go, as adding into zeros */   \
        uint32_t b;                                                  \
        memcpy(&b, &v, sizeof b);                                    \
        b &= -(uint32_t)(o[i] != 0); /* a mask: gcc will not         \
                                        vectorise a stored select */ \
        memcpy(gx + i, &b, sizeof b);                                \
      }                                                              \
    } else {                                                         \
      APEX__CPU_PFOR                                                 \
      for (size_t i = 0; i < n; i++) {                               \
        float v = go[i];                                             \
        gx[i] += o[i] ? v : 0.0f;                                    \
      }                                                              \
    }                                                                \
  } while (0)

static void relu_bwd(float *restrict gx, int fresh, const void *y, apex_dtype y_dtype, const float *restrict go, size_t n) {
  if (apex_dtype_size(y_dtype) == 2)
    RELU_BWD(uint16_t);
  else
    RELU_BWD(uint32_t);
}

/* gx += go * kind'(x) over n elements (ctx: the args). */
static void unary_bwd_f32(const void *ctx, const float *restrict X, const float *restrict go, float *restrict gx, size_t n) {
  const apex_nn_unary_bwd_args *a = ctx;
  switch (a->kind) {
  case APEX_NN_GELU:
  case APEX_NN_GELU_TANH:
  case APEX_NN_TANH:
    for (size_t lo = 0; lo < n; lo += EW_BLOCK) {
      float f[EW_BLOCK];
      size_t m = n - lo < EW_BLOCK ? n - lo : EW_BLOCK;
      const float *g = go + lo;
      float *d = gx + lo;
      act_slope(a->kind, X + lo, f, m);
      for (size_t i = 0; i < m; i++) d[i] += g[i] * f[i];
    }
    break;
  /* exp is recomputed from x rather than read from a half output, which would round it once more */
  case APEX_NN_EXP:
    for (size_t i = 0; i < n; i++) gx[i] += go[i] * expf(X[i]);
    break;
  case APEX_NN_LOG:
    for (size_t i = 0; i < n; i++) gx[i] += go[i] / X[i];
    break;
  case APEX_NN_POW_SCALAR: {
    float p = a->p;
    if (p == 0.0f) break; /* x^0 is 1 everywhere: PyTorch gives 0, not 0 * 0^-1 = NaN at x = 0 */
    for (size_t i = 0; i < n; i++) gx[i] += go[i] * (p * powf(X[i], p - 1.0f));
    break;
  }
  default:
    for (size_t i = 0; i < n; i++) {
      float s = 1.0f / (1.0f + expf(-X[i]));
      gx[i] += go[i] * s * (1.0f - s);
    }
    break;
  }
}

static apex_status unary_bwd_k(const void *a) { return apex__cpu_nn_unary_bwd(a); }

apex_status apex__cpu_nn_unary_bwd(const apex_nn_unary_bwd_args *a) {
  int ran;
  apex_status rs = apex__unary_bwd_f32(&apex__cpu_backend, unary_bwd_k, a, &ran);
  if (ran) return rs;
  if (a->kind == APEX_NN_RELU) {
    relu_bwd(a->gx, !a->accumulate_x, a->y, a->y_dtype, a->gout, a->n);
    return APEX_OK;
  }
  apex__cpu_grad_begin(a->gx, a->n, a->accumulate_x);
  const float *tab = act_table(a->kind, a->x.dtype, ACT_SLOPE);
  if (!tab) {
    ew_map(unary_bwd_f32, a, a->x, a->gout, a->gx, APEX_F32, a->n);
    return APEX_OK;
  }
  size_t n = a->n;
  const uint16_t *xh = a->x.data;
  const float *go = a->gout;
  float *gx = a->gx;
  APEX__CPU_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += go[i] * tab[xh[i]];
  return APEX_OK;
}

apex_status apex__cpu_nn_dropout(const apex_nn_dropout_args *a) {
  apex_rng rng = {a->seed, a->offset};
  if (apex_rng_bernoulli(&rng, a->mask, a->n, a->keep) != APEX_OK) return apex_last_status();
  const uint8_t *mask = a->mask;
  float s = a->s;
  size_t n = a->n, nb = (n + EW_BLOCK - 1) / EW_BLOCK;
  apex_simd_active(); /* resolve the conversions' path before the threads read it */
#pragma omp parallel for schedule(static) if (n > APEX__CPU_PAR_MIN)
  for (size_t b = 0; b < nb; b++) {
    float xb[EW_BLOCK], ob[EW_BLOCK];
    size_t lo = b * EW_BLOCK, m = n - lo < EW_BLOCK ? n - lo : EW_BLOCK, st;
    const float *X = ew_in(a->x, lo, m, 1, xb, &st);
    float *o = apex__cpu_row_out(a->out, a->out_dtype, lo, ob);
    for (size_t i = 0; i < m; i++) o[i] = mask[lo + i] ? X[i] * s : 0.0f;
    apex__cpu_row_store(a->out, a->out_dtype, lo, ob, m);
  }
  return APEX_OK;
}

static apex_status dropout_bwd_k(const void *a) { return apex__cpu_nn_dropout_bwd(a); }

apex_status apex__cpu_nn_dropout_bwd(const apex_nn_dropout_bwd_args *a) {
  int ran;
  apex_status rs = apex__dropout_bwd_f32(&apex__cpu_backend, dropout_bwd_k, a, &ran);
  if (ran) return rs;
  const uint8_t *mask = a->mask;
  const float *go = a->gout;
  float *gx = a->gx;
  float s = a->s;
  size_t n = a->n;
  apex__cpu_grad_begin(gx, n, a->accumulate_x);
  APEX__CPU_PFOR
  for (size_t i = 0; i < n; i++) gx[i] += mask[i] ? go[i] * s : 0.0f;
  return APEX_OK;
}
