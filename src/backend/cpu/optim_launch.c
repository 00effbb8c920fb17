/* optim_launch.c: runs an optimizer's tile kernel over a group through the multi-tensor applier, and the
 * small vector helpers the kernels share.
 *
 * The model copy of an f16/bf16 parameter is written from inside the launch, tile by tile, right
 * after the kernel updated the master's tile: one pass over memory, and no sixth applier list
 * (the applier takes five; Adam with amsgrad already needs g, p, m, v, max v). A kernel may write the
 * copies of one dtype itself, from the new p still in registers (Adam writes bf16 copies so); the
 * launch then leaves those alone. */
#include <math.h>

#include "core/internal.h"
#include "backend/cpu/cpu_optim.h"


typedef struct {
  apex_mt_kernel kernel;
  void *ctx;
  apex_tensor *const *model;
  int p_list;        /* which tile list holds p */
  apex_dtype skip;   /* copies of this dtype the kernel writes itself; APEX_F32: none */
} writeback_ctx;

static void writeback_tile(void *vctx, const apex_mt_tile *t, int *nonfinite) {
  const writeback_ctx *c = vctx;
  c->kernel(c->ctx, t, nonfinite);
  const apex_tensor *m = c->model[t->tensor];
  if (m && apex_tensor_dtype(m) != c->skip) {
    apex_dtype dt = apex_tensor_dtype(m);
    apex__convert_range((char *)apex_tensor_data(m) + t->offset * apex_dtype_size(dt), dt, t->p[c->p_list], APEX_F32,
                        t->n);
  }
}

apex_status apex__optim_run(const apex__cpu_active *a, int first, int nlists, unsigned written, const apex__simd_kernel *k,
                            void *ctx, const char *name) {
  return apex__optim_run_writing(a, first, nlists, written, k, ctx, name, APEX_F32, 0u);
}

apex_status apex__optim_run_writing(const apex__cpu_active *a, int first, int nlists, unsigned written,
                                    const apex__simd_kernel *k, void *ctx, const char *name, apex_dtype own, unsigned raw) {
  apex_mt_kernel kernel = apex__simd_pick(k);
  apex_tensor *const *all[2 + APEX__OPTIM_MAX_STATES] = {a->g, a->p, a->s[0], a->s[1], a->s[2]};
  apex_mt_launch L = {.nlists = nlists, .ntensors = a->n, .written = written, .kernel = kernel, .ctx = ctx,
                      .name = name, .raw = raw};
  for (int l = 0; l < nlists; l++) L.lists[l] = all[first + l];
  int p_list = 1 - first;
  int any_model = 0;
  for (int i = 0; i < a->n; i++) any_model |= a->model[i] != NULL && apex_tensor_dtype(a->model[i]) != own;
  writeback_ctx wb = {kernel, ctx, a->model, p_list, own};
  if (any_model && (written >> p_list & 1u)) {
    L.kernel = writeback_tile;
    L.ctx = &wb;
  }
  return apex_multi_tensor_apply(&L, NULL);
}

double apex__optim_pow(double beta, int64_t step) { return pow(beta, (double)step); }
