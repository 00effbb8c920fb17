/* lamb.c: LAMB after Apex's FusedLAMB (multi_tensor_lamb.cu), in two passes per group:
 *   stage 1  g = g / scale / clip, where clip = max(1, global_norm / max_grad_norm) over all groups
 *            g += wd * p                                  (L2 mode, adam_w_mode off)
 *            m = b1 * m + beta3 * g;  v = b2 * v + (1 - b2) * g * g      (beta3 = 1 - b1 with
 *            grad_averaging, else 1)
 *            u = (m / bc1) / (sqrt(v / bc2) + eps) (+ wd * p in adam_w_mode)
 *   stage 2  p -= ratio * u, ratio = lr * ||p|| / ||u|| per tensor when weight_decay != 0 or
 *            use_nvlamb (and both norms are non-zero), else lr.
 * Apex stores u in the gradient buffer between the stages; apex leaves the caller's gradients alone.
 * Tensors go through both stages in batches of at most batch_params (2^21) parameters, and stage 1
 * writes a batch's u into a scratch buffer of that size, which stage 2 reads back (from the cache,
 * mostly): stage 2 then costs one multiply-add per element instead of recomputing u's square root
 * and division, which made LAMB compute-bound (a batch can be small: a tensor's norms come only from
 * its own chunks). A tensor larger than a batch gets no scratch and stage 2 recomputes u from m, v and
 * p, bit for bit the same expression. Stage 1 sums ||p||^2 and ||u||^2 per chunk as it goes, so there
 * is no separate norm pass over p or u; the per-chunk sums are combined in chunk order: thread-count
 * independent. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

typedef struct {
  float inv_bc1, inv_bc2, ratio;
} lamb_coef;

typedef struct {
  float grad_mul, beta1, beta2, beta3, eps, l2, wd_w;
  const lamb_coef *coef;
  double *p_sq, *u_sq; /* per chunk */
  int store_u;         /* stage 1 writes u into list 4 (the batch's scratch) */
} lamb_ctx;

/* u = (m / bc1) / (sqrt(v / bc2) + eps) + wd_w * p: the same code in both stages. */
APEX__INLINE void lamb_update(const lamb_ctx *c, const lamb_coef *k, const float *p, const float *m, const float *v,
                        float *u, size_t n) {
  for (size_t i = 0; i < n; i++) u[i] = v[i] * k->inv_bc2;
  apex__optim_sqrt(u, n);
  const float eps = c->eps, ww = c->wd_w, ib1 = k->inv_bc1;
  for (size_t i = 0; i < n; i++) u[i] = apex__lamb_update(m[i], u[i], p[i], ib1, eps, ww);
}

APEX__INLINE void lamb_stage1_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const lamb_ctx *c = vctx;
  const float *g = t->p[0], *p = t->p[1];
  float *m = t->p[2], *v = t->p[3];
  const float gm = c->grad_mul, l2 = c->l2, b1 = c->beta1, b2 = c->beta2, b3 = c->beta3, nb2 = 1.0f - c->beta2;
  for (size_t i = 0; i < t->n; i++) apex__adam_moments(g[i], p[i], &m[i], &v[i], gm, l2, b1, b3, b2, nb2);
  float local[APEX_MT_TILE], *u = c->store_u ? t->p[4] : local;
  lamb_update(c, &c->coef[t->tensor], p, m, v, u, t->n);
  c->p_sq[t->chunk] += apex__optim_sumsq(p, t->n);
  c->u_sq[t->chunk] += apex__optim_sumsq(u, t->n);
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(lamb_stage1);

APEX__INLINE void lamb_stage2_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const lamb_ctx *c = vctx;
  float *p = t->p[0];
  const float *m = t->p[1], *v = t->p[2];
  const lamb_coef *k = &c->coef[t->tensor];
  float u[APEX_MT_TILE];
  lamb_update(c, k, p, m, v, u, t->n);
  const float ratio = k->ratio;
  for (size_t i = 0; i < t->n; i++) p[i] = p[i] - ratio * u[i];
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(lamb_stage2);

/* Stage 2 with u stored by stage 1: lists p, m, v, u (m and v unread). */
APEX__INLINE void lamb_apply_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const lamb_ctx *c = vctx;
  float *p = t->p[0];
  const float *u = t->p[3], ratio = c->coef[t->tensor].ratio;
  for (size_t i = 0; i < t->n; i++) p[i] = p[i] - ratio * u[i];
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(lamb_apply);

/* A batch's size in parameters: its u scratch (8 MiB) and its p, m, v stay within the L2/L3 caches
 * between the stages. Settable for tests (apex__lamb_set_batch_params), to reach the recomputing
 * path with small tensors. */
static size_t batch_params = (size_t)1 << 21;

size_t apex__lamb_set_batch_params(size_t n) {
  size_t old = batch_params;
  batch_params = n > 0 ? n : 1;
  return old;
}

/* Both stages over the active tensors [first, first + n) of a; u_buf: batch_params floats, or NULL
 * for a batch (one tensor) larger than that. */
static apex_status lamb_batch(const apex__cpu_active *a, int first, int n, const apex_optim_options *o, lamb_ctx *c,
                              lamb_coef *coef, size_t *chunk_start, double *sums, float *u_buf, apex_tensor **u) {
  apex__cpu_active b = *a;
  b.n = n;
  b.idx = a->idx + first;
  b.g = a->g + first;
  b.p = a->p + first;
  b.model = a->model + first;
  for (int s = 0; s < APEX__OPTIM_MAX_STATES; s++) b.s[s] = a->s[s] ? a->s[s] + first : NULL;
  b.step = a->step + first;
  apex_status st = APEX_OK;
  c->store_u = u_buf != NULL;
  if (u_buf) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
      int64_t numel = apex_tensor_numel(b.p[i]);
      u[i] = apex_tensor_wrap(u_buf + off, APEX_F32, 1, &numel);
      if (!u[i]) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "LAMB step: out of memory");
      off += (size_t)numel;
    }
    b.s[2] = u;
  }
  size_t nchunks = apex_mt_chunk_count(0, b.p, n, chunk_start);
  memset(sums, 0, 2 * nchunks * sizeof *sums);
  c->coef = coef + first;
  c->p_sq = sums;
  c->u_sq = sums + nchunks;
  if (st == APEX_OK)
    st = c->store_u ? apex__optim_run(&b, 0, 5, 28u, &lamb_stage1, c, "LAMB step (stage 1)")
                    : apex__optim_run(&b, 0, 4, 12u, &lamb_stage1, c, "LAMB step (stage 1)");
  if (st == APEX_OK && (apex__on(o->use_nvlamb) || o->weight_decay != 0.0f)) {
    for (int i = 0; i < n; i++) {
      double psq = 0, usq = 0;
      for (size_t k = chunk_start[i]; k < chunk_start[i + 1]; k++) {
        psq += c->p_sq[k];
        usq += c->u_sq[k];
      }
      float pn = (float)sqrt(psq), un = (float)sqrt(usq);
      if (pn != 0.0f && un != 0.0f) coef[first + i].ratio = o->lr * (pn / un);
    }
  }
  if (st == APEX_OK)
    st = c->store_u ? apex__optim_run(&b, 1, 4, 1u, &lamb_apply, c, "LAMB step (stage 2)")
                    : apex__optim_run(&b, 1, 3, 1u, &lamb_stage2, c, "LAMB step (stage 2)");
  if (u_buf)
    for (int i = 0; i < n; i++) apex_tensor_destroy(u[i]);
  return st;
}

apex_status apex__cpu_lamb_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  const apex__cpu_active *a = s->a;
  size_t *chunk_start = malloc(((size_t)a->n + 1) * sizeof *chunk_start);
  size_t nchunks = chunk_start ? apex_mt_chunk_count(0, a->p, a->n, chunk_start) : 0;
  double *sums = calloc(2 * nchunks + 1, sizeof *sums);
  lamb_coef *coef = malloc((size_t)a->n * sizeof *coef);
  apex_tensor **u = calloc((size_t)a->n + 1, sizeof *u);
  size_t fits = 0; /* parameters in tensors that fit a batch: the scratch never needs more */
  for (int i = 0; i < a->n; i++) {
    size_t numel = (size_t)apex_tensor_numel(a->p[i]);
    if (numel <= batch_params) fits += numel;
  }
  size_t most = fits < batch_params ? fits : batch_params;
  float *u_buf = most ? malloc(most * sizeof *u_buf) : NULL;
  apex_status st = APEX_OK;
  if (!chunk_start || !sums || !coef || !u || (most && !u_buf)) {
    st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "LAMB step: out of memory");
    goto done;
  }
  int bc = apex__on(o->bias_correction), w = apex__on(o->adam_w_mode);
  for (int i = 0; i < a->n; i++) {
    double bc1 = bc ? 1.0 - apex__optim_pow(o->beta1, a->step[i]) : 1.0;
    double bc2 = bc ? 1.0 - apex__optim_pow(o->beta2, a->step[i]) : 1.0;
    coef[i] = (lamb_coef){(float)(1.0 / bc1), (float)(1.0 / bc2), o->lr};
  }
  float gnorm = s->global_grad_norm, maxn = o->max_grad_norm;
  float clip = maxn > 0.0f && gnorm > maxn ? gnorm / maxn : 1.0f;
  lamb_ctx c = {.grad_mul = s->inv_scale / clip, .beta1 = o->beta1, .beta2 = o->beta2,
                .beta3 = apex__on(o->grad_averaging) ? 1.0f - o->beta1 : 1.0f, .eps = o->eps,
                .l2 = w ? 0.0f : o->weight_decay, .wd_w = w ? o->weight_decay : 0.0f};
  /* A tensor's norms come from its own chunks only, so batching does not change any bit. */
  for (int first = 0; st == APEX_OK && first < a->n;) {
    int n = 0;
    size_t params = 0;
    while (first + n < a->n) {
      size_t numel = (size_t)apex_tensor_numel(a->p[first + n]);
      if (n > 0 && params + numel > batch_params) break;
      params += numel;
      n++;
    }
    st = lamb_batch(a, first, n, o, &c, coef, chunk_start, sums, params <= batch_params ? u_buf : NULL, u);
    first += n;
  }
done:
  free(chunk_start);
  free(sums);
  free(coef);
  free(u);
  free(u_buf);
  return st;
}
