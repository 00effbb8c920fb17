/* novograd.c: NovoGrad after Apex's FusedNovoGrad (multi_tensor_novograd.cu). The second moment is
 * one number per tensor, kept as a norm:
 *     n = ||g / scale|| (L2, or the infinity norm)
 *     v = sqrt(b2 v^2 + (1 - b2) n^2)   (L2)      v = b2 v + (1 - b2) n   (inf)
 * where v starts at the first gradient's norm (so that the first blend is a no-op) unless init_zero.
 * Then per element, with d = v / bc2 + eps, bc1 = 1 - b1^t, bc2 = sqrt(1 - b2^t) (1 without
 * bias_correction), beta3 = 1 - b1 with grad_averaging, else 1:
 *     default            m = b1 m + beta3 g;              p -= lr (m / bc1 / d + wd p)
 *     reg_inside_moment  m = b1 m + beta3 (g / d + wd p); p -= lr m / bc1 */
#include <math.h>
#include <stdlib.h>

#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"
#include "backend/optim_rules.h"

/* ---- the per-tensor infinity norm (a max is exact, so any order gives the same bits) ---- */
typedef struct {
  float inv_scale;
  float *chunk_max;
} maxabs_ctx;

static void maxabs_tile(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  maxabs_ctx *c = vctx;
  const float *x = t->p[0];
  float mx = 0.0f;
  for (size_t i = 0; i < t->n; i++) {
    float a = fabsf(x[i]);
    mx = a > mx ? a : mx;
  }
  float *slot = &c->chunk_max[t->chunk];
  if (mx * c->inv_scale > *slot) *slot = mx * c->inv_scale;
  *nonfinite = 0;
}

static apex_status inf_norms(const apex__cpu_active *a, float inv_scale, float *out) {
  size_t *chunk_start = malloc(((size_t)a->n + 1) * sizeof *chunk_start);
  size_t nchunks = chunk_start ? apex_mt_chunk_count(0, a->g, a->n, chunk_start) : 0;
  float *mx = calloc(nchunks + 1, sizeof *mx);
  apex_status st = APEX_OK;
  if (!chunk_start || !mx) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "NovoGrad step: out of memory");
  maxabs_ctx c = {inv_scale, mx};
  apex_mt_launch L = {.nlists = 1, .ntensors = a->n, .lists = {a->g}, .kernel = maxabs_tile, .ctx = &c,
                      .name = "NovoGrad step (norms)"};
  if (st == APEX_OK) st = apex_multi_tensor_apply(&L, NULL);
  for (int i = 0; st == APEX_OK && i < a->n; i++) {
    out[i] = 0.0f;
    for (size_t k = chunk_start[i]; k < chunk_start[i + 1]; k++) out[i] = mx[k] > out[i] ? mx[k] : out[i];
  }
  free(chunk_start);
  free(mx);
  return st;
}

/* ---- the update ---- */
typedef struct {
  float inv_bc1, inv_denom; /* 1 / bc1, 1 / (v / bc2 + eps) */
} novo_coef;

typedef struct {
  float inv_scale, lr, beta1, beta3, wd;
  int reg_inside;
  const novo_coef *coef;
} novo_ctx;

APEX__INLINE void novo_tile_body(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const novo_ctx *c = vctx;
  const float *g = t->p[0];
  float *p = t->p[1], *m = t->p[2];
  const float inv = c->inv_scale, lr = c->lr, b1 = c->beta1, b3 = c->beta3, wd = c->wd;
  const float ib1 = c->coef[t->tensor].inv_bc1, id = c->coef[t->tensor].inv_denom;
  /* reg_inside is passed as a constant in each loop, so that each inlines its own branch of the rule. */
  if (c->reg_inside)
    for (size_t i = 0; i < t->n; i++) p[i] = apex__novograd_rule(g[i], p[i], &m[i], inv, id, ib1, lr, b1, b3, wd, 1);
  else
    for (size_t i = 0; i < t->n; i++) p[i] = apex__novograd_rule(g[i], p[i], &m[i], inv, id, ib1, lr, b1, b3, wd, 0);
  *nonfinite = 0;
}
APEX__SIMD_KERNEL(novo_tile);

apex_status apex__cpu_novograd_step(const apex__cpu_step *s) {
  const apex_optim_options *o = s->o;
  const apex__cpu_active *a = s->a;
  int l2 = o->norm_type != APEX_OPTIM_NORM_INF;
  float *norms = malloc((size_t)a->n * sizeof *norms);
  novo_coef *coef = malloc((size_t)a->n * sizeof *coef);
  apex_status st = APEX_OK;
  if (!norms || !coef) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "NovoGrad step: out of memory");
  else if (l2) st = apex__cpu_mt_l2norm(&(apex_mt_l2norm_args){.fn = "NovoGrad step", .n = a->n, .x = a->g,
                                                  .inv_scale = s->inv_scale, .per_tensor = norms});
  else st = inf_norms(a, s->inv_scale, norms);
  int bc = apex__on(o->bias_correction);
  for (int i = 0; st == APEX_OK && i < a->n; i++) {
    float *v = &s->scalars[a->idx[i]];
    double n = norms[i], b2 = o->beta2;
    if (a->step[i] == 1) *v = apex__on(o->init_zero) ? 0.0f : (float)n;
    *v = l2 ? (float)sqrt(b2 * (double)*v * (double)*v + (1.0 - b2) * n * n) : (float)(b2 * (double)*v + (1.0 - b2) * n);
    double bc1 = bc ? 1.0 - apex__optim_pow(o->beta1, a->step[i]) : 1.0;
    double bc2 = bc ? sqrt(1.0 - apex__optim_pow(o->beta2, a->step[i])) : 1.0;
    coef[i] = (novo_coef){(float)(1.0 / bc1), (float)(1.0 / ((double)*v / bc2 + (double)o->eps))};
  }
  novo_ctx c = {.inv_scale = s->inv_scale, .lr = o->lr, .beta1 = o->beta1,
                .beta3 = apex__on(o->grad_averaging) ? 1.0f - o->beta1 : 1.0f, .wd = o->weight_decay,
                .reg_inside = apex__on(o->reg_inside_moment), .coef = coef};
  if (st == APEX_OK) st = apex__optim_run(a, 0, 3, 6u, &novo_tile, &c, "NovoGrad step");
  free(norms);
  free(coef);
  return st;
}
