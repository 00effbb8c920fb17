/* launch.c: runs an optimizer's tile kernel over a group through the multi-tensor applier, and the
 * small vector helpers the kernels share.
 *
 * The model copy of an f16/bf16 parameter is written from inside the launch, tile by tile, right
 * after the kernel updated the master's tile: one pass over memory, and no sixth applier list
 * (the applier takes five; Adam with amsgrad already needs g, p, m, v, max v). */
#include <math.h>

#include "core/internal.h"
#include "optim/optim_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

typedef struct {
  apex_mt_kernel kernel;
  void *ctx;
  apex_tensor *const *model;
  int p_list; /* which tile list holds p */
} writeback_ctx;

static void writeback_tile(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const writeback_ctx *c = vctx;
  c->kernel(c->ctx, t, nonfinite);
  const apex_tensor *m = c->model[t->tensor];
  if (m) {
    apex_dtype dt = apex_tensor_dtype(m);
    apex__convert_range((char *)apex_tensor_data(m) + t->offset * apex_dtype_size(dt), dt, t->p[c->p_list], APEX_F32,
                        t->n);
  }
}

apex_status apex__optim_run(const apex__active *a, int first, int nlists, unsigned written, apex_mt_kernel kernel,
                            void *ctx, const char *name) {
  apex_tensor *const *all[2 + APEX__OPTIM_MAX_STATES] = {a->g, a->p, a->s[0], a->s[1], a->s[2]};
  apex_mt_launch L = {.nlists = nlists, .ntensors = a->n, .written = written, .kernel = kernel, .ctx = ctx,
                      .name = name};
  for (int l = 0; l < nlists; l++) L.lists[l] = all[first + l];
  int p_list = 1 - first;
  int any_model = 0;
  for (int i = 0; i < a->n; i++) any_model |= a->model[i] != NULL;
  writeback_ctx wb = {kernel, ctx, a->model, p_list};
  if (any_model && (written >> p_list & 1u)) {
    L.kernel = writeback_tile;
    L.ctx = &wb;
  }
  return apex_multi_tensor_apply(&L, NULL);
}

void apex__optim_sqrt(float *x, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#elif defined(__aarch64__)
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vsqrtq_f32(vld1q_f32(x + i)));
#endif
  for (; i < n; i++) x[i] = sqrtf(x[i]);
}

float apex__optim_sumsq(const float *x, size_t n) {
  float acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += x[i + k] * x[i + k];
  for (int k = 0; i < n; i++, k++) acc[k] += x[i] * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double apex__optim_pow(double beta, int64_t step) { return pow(beta, (double)step); }
