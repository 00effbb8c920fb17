/* adamp.c: AdamP (Heo et al., "AdamP: Slowing Down the Slowdown for Momentum Optimizers on
 * Scale-invariant Weights", ICLR 2021), after the authors' clovaai/AdamP implementation:
 *     g = g / scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *     perturb = (nesterov ? b1 m + (1 - b1) g : m) / (sqrt(v) / sqrt(bc2) + eps)
 *     for a tensor of 2+ dimensions, try the channel view (rows = first dimension), then the layer
 *     view (the whole tensor): if max |cos(g, p)| over the rows < delta / sqrt(row length),
 *         perturb -= p_n * <p_n, perturb> per row, p_n = p / (||p|| + eps);  wd = wd_ratio
 *     (cos(x, y) = <x, y> / (max(||x||, eps) max(||y||, eps)), as torch's cosine_similarity)
 *     p *= 1 - lr * weight_decay * wd;  p -= lr / bc1 * perturb
 * Pass 1 (rows in parallel, each row summed in a fixed order) updates m and v and sums per row
 * <g, p>, <g, g>, <p, p> and <p, perturb>; pass 2 (the applier) recomputes perturb, projects and
 * updates p. Not used by the benchmarks, so pass 1 favours clarity over speed. */
#include <math.h>
#include <stdlib.h>

#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

typedef struct {
  float inv_scale, beta1, beta2, eps;
  int nesterov;
} adamp_rule;

typedef struct {
  float step_size, inv_bc2_sqrt, decay;
  size_t row_len;         /* elements per row of the projection, or numel */
  const float *row_coef;  /* per row: <p, perturb> / (||p|| + eps)^2; NULL when not projected */
} adamp_coef;

/* m, v and perturb for n elements; the same code in both passes, so perturb is bitwise the same. */
APEX__INLINE void adamp_moments(const adamp_rule *r, const adamp_coef *k, const float *g, float *m, float *v, float *u,
                          size_t n, int update) {
  const float b1 = r->beta1, b2 = r->beta2, nb1 = 1.0f - r->beta1, nb2 = 1.0f - r->beta2;
  if (update)
    for (size_t i = 0; i < n; i++) apex__adamp_moments(g[i], &m[i], &v[i], b1, nb1, b2, nb2);
  for (size_t i = 0; i < n; i++) u[i] = v[i];
  apex__optim_sqrt(u, n);
  const float ib = k->inv_bc2_sqrt, eps = r->eps, ng = r->nesterov ? nb1 : 0.0f, nm = r->nesterov ? b1 : 1.0f;
  for (size_t i = 0; i < n; i++) u[i] = apex__adamp_perturb(m[i], g[i], u[i], ib, eps, nm, ng);
}

/* A tile of t as f32, times mul. */
static void load_f32(const apex_tensor *t, size_t off, size_t n, float mul, float *out) {
  apex_dtype dt = apex_tensor_dtype(t);
  apex__convert_range(out, APEX_F32, (const char *)apex_tensor_data(t) + off * apex_dtype_size(dt), dt, n);
  for (size_t i = 0; i < n; i++) out[i] *= mul;
}

/* Pass 1 over one row: stats[0..4) = <g,p>, <g,g>, <p,p>, <p,perturb>. */
static void row_pass(const adamp_rule *r, const adamp_coef *k, const apex_tensor *gt, const apex_tensor *pt, float *m,
                     float *v, size_t begin, size_t len, double *stats) {
  float g[APEX_MT_TILE], p[APEX_MT_TILE], u[APEX_MT_TILE];
  double gp = 0, gg = 0, pp = 0, pu = 0;
  for (size_t off = 0; off < len; off += APEX_MT_TILE) {
    size_t n = len - off < APEX_MT_TILE ? len - off : APEX_MT_TILE, at = begin + off;
    load_f32(gt, at, n, r->inv_scale, g);
    load_f32(pt, at, n, 1.0f, p);
    adamp_moments(r, k, g, m + at, v + at, u, n, 1);
    for (size_t i = 0; i < n; i++) {
      double gi = g[i], pi = p[i];
      gp += gi * pi;
      gg += gi * gi;
      pp += pi * pi;
      pu += pi * (double)u[i];
    }
  }
  stats[0] = gp, stats[1] = gg, stats[2] = pp, stats[3] = pu;
}

/* The largest |cos(g, p)| over rows [0, rows) of stats. */
static double max_cos(const double *stats, size_t rows, double eps) {
  double best = 0;
  for (size_t r = 0; r < rows; r++) {
    const double *s = stats + 4 * r;
    double c = fabs(s[0]) / (fmax(sqrt(s[1]), eps) * fmax(sqrt(s[2]), eps));
    best = c > best ? c : best;
  }
  return best;
}

/* Decides the projection of one tensor from its row sums; fills k->row_len, k->row_coef (in coefs)
 * and returns the weight decay ratio. */
static float project(const apex_tensor *p, const double *stats, size_t rows, float delta, float wd_ratio, float eps,
                     adamp_coef *k, float *coefs) {
  size_t numel = apex_tensor_numel(p);
  k->row_len = numel;
  k->row_coef = NULL;
  if (apex_tensor_ndim(p) < 2 || numel == 0) return 1.0f;
  size_t len = numel / rows;
  if (max_cos(stats, rows, eps) < delta / sqrt((double)len)) {
    for (size_t r = 0; r < rows; r++) {
      double n = sqrt(stats[4 * r + 2]) + eps;
      coefs[r] = (float)(stats[4 * r + 3] / (n * n));
    }
    k->row_len = len;
    k->row_coef = coefs;
    return wd_ratio;
  }
  double layer[4] = {0, 0, 0, 0};
  for (size_t r = 0; r < rows; r++)
    for (int j = 0; j < 4; j++) layer[j] += stats[4 * r + j];
  if (max_cos(layer, 1, eps) < delta / sqrt((double)numel)) {
    double n = sqrt(layer[2]) + eps;
    coefs[0] = (float)(layer[3] / (n * n));
    k->row_coef = coefs;
    return wd_ratio;
  }
  return 1.0f;
}

typedef struct {
  adamp_rule rule;
  const adamp_coef *coef;
} adamp_ctx;

APEX__INLINE void adamp_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const adamp_ctx *c = vctx;
  const adamp_coef *k = &c->coef[t->tensor];
  float *p = t->p[1], g[APEX_MT_TILE], u[APEX_MT_TILE];
  for (size_t i = 0; i < t->n; i++) g[i] = t->p[0][i] * c->rule.inv_scale;
  adamp_moments(&c->rule, k, g, t->p[2], t->p[3], u, t->n, 0);
  const float ss = k->step_size, decay = k->decay;
  for (size_t i = 0; i < t->n;) {
    size_t at = t->offset + i, row = at / k->row_len, end = (row + 1) * k->row_len - t->offset;
    if (end > t->n) end = t->n;
    const float rc = k->row_coef ? k->row_coef[row] : 0.0f;
    for (; i < end; i++) p[i] = apex__adamp_apply(p[i], u[i], rc, decay, ss);
  }
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(adamp_tile);

apex_status apex__cpu_adamp_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  const apex__cpu_active *a = s->a;
  adamp_coef *coef = calloc((size_t)a->n, sizeof *coef);
  float **coefs = calloc((size_t)a->n, sizeof *coefs);
  apex_status st = APEX_OK;
  if (!coef || !coefs) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "AdamP step: out of memory");
  adamp_rule rule = {s->inv_scale, o->beta1, o->beta2, o->eps, apex__on(o->nesterov)};
  for (int i = 0; st == APEX_OK && i < a->n; i++) {
    adamp_coef *k = &coef[i];
    double bc1 = 1.0 - apex__optim_pow(o->beta1, a->step[i]), bc2 = 1.0 - apex__optim_pow(o->beta2, a->step[i]);
    k->step_size = (float)(o->lr / bc1);
    k->inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
    const apex_tensor *p = a->p[i];
    size_t numel = apex_tensor_numel(p);
    long long rows = apex_tensor_ndim(p) >= 2 && numel ? apex_tensor_dim(p, 0) : 1;
    size_t len = rows ? numel / (size_t)rows : 0;
    double *stats = malloc((size_t)rows * 4 * sizeof *stats);
    coefs[i] = malloc((size_t)rows * sizeof *coefs[i]);
    if (!stats || !coefs[i]) {
      free(stats);
      st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "AdamP step: out of memory");
      break;
    }
    float *md = apex_tensor_data(a->s[0][i]), *vd = apex_tensor_data(a->s[1][i]);
#pragma omp parallel for schedule(static) if (rows > 1)
    for (long long r = 0; r < rows; r++)
      row_pass(&rule, k, a->g[i], p, md, vd, (size_t)r * len, len, stats + 4 * r);
    float wd = project(p, stats, (size_t)rows, o->delta, o->wd_ratio, o->eps, k, coefs[i]);
    k->decay = o->weight_decay > 0.0f ? 1.0f - o->lr * o->weight_decay * wd : 1.0f;
    free(stats);
  }
  adamp_ctx c = {rule, coef};
  if (st == APEX_OK) st = apex__optim_run(a, 0, 4, 2u, &adamp_tile, &c, "AdamP step");
  for (int i = 0; coefs && i < a->n; i++) free(coefs[i]);
  free(coefs);
  free(coef);
  return st;
}
