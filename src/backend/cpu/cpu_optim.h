/* cpu_optim.h: what the CPU backend's optimizer kernels share (optim.c, optim_<kind>.c, optim_launch.c).
 *
 * optim.c is the optim_step slot: it turns the slot's arguments (backend/args_optim.h) into an
 * apex__cpu_step, with each entry's step count already advanced, and calls the kind's step. Each kind's
 * step runs its tile kernels over the multi-tensor applier through apex__optim_run, which refreshes the
 * f16/bf16 model copies in the same pass. */
#ifndef APEX_BACKEND_CPU_OPTIM_H
#define APEX_BACKEND_CPU_OPTIM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "apex/mt_apply.h"
#include "apex/optim_options.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/internal.h"
#include "backend/cpu/simd_kernel.h"

#define APEX__OPTIM_MAX_STATES APEX_OPTIM_MAX_STATES

/* The entries of one step, as applier lists. */
typedef struct apex__cpu_active {
  int n;
  const int *idx;         /* index in the group */
  apex_tensor **g;        /* gradients */
  apex_tensor **p;        /* what is updated: the master or the f32 parameter */
  apex_tensor **model;    /* the f16/bf16 parameter behind a master, NULL for f32 */
  apex_tensor **s[APEX__OPTIM_MAX_STATES];
  int64_t *step;          /* step counts, already including this step */
} apex__cpu_active;

/* What a kind's step gets. */
typedef struct apex__cpu_step {
  apex_optim_kind kind;
  const apex_optim_options *o; /* resolved */
  const apex__cpu_active *a;
  float inv_scale;             /* 1 / grad_scale, times any clip coefficient */
  float global_grad_norm;      /* LAMB: the norm of every group's gradients times inv_scale (0: none) */
  float *scalars;              /* the group's per-parameter scalars (NovoGrad's second moment), by parameter */
} apex__cpu_step;

/* The kinds' steps (optim_<kind>.c). */
apex_status apex__cpu_sgd_step(const apex__cpu_step *s);
apex_status apex__cpu_adam_step(const apex__cpu_step *s);
apex_status apex__cpu_adamp_step(const apex__cpu_step *s);
apex_status apex__cpu_lamb_step(const apex__cpu_step *s);
apex_status apex__cpu_adadelta_step(const apex__cpu_step *s);
apex_status apex__cpu_adagrad_step(const apex__cpu_step *s);
apex_status apex__cpu_rmsprop_step(const apex__cpu_step *s);
apex_status apex__cpu_novograd_step(const apex__cpu_step *s);

/* ---- optim_launch.c ---- */

/* Runs kernel k over the active tensors with the lists {g, p, s[0], s[1], ...} starting at list
 * `first` (0, or 1 to leave the gradients out), `nlists` of them. written: bits of the lists (counted
 * from `first`) the kernel writes. When the p list is written, each model copy is refreshed from the
 * tile of p in the same pass (rounded to nearest even). */
apex_status apex__optim_run(const apex__cpu_active *a, int first, int nlists, unsigned written,
                            const apex__simd_kernel *k, void *ctx, const char *name);
/* apex__optim_run for a kernel that writes the model copies of dtype `own` itself (from the tile's
 * tensor index and offset into a->model, rounded as apex__f32_to_bf16 / apex__f32_to_f16 round; the
 * launch refreshes the copies of other dtypes) and that takes the lists whose bits are set in `raw` as
 * stored (apex_mt_launch.raw, counted from `first`), widening them itself. */
apex_status apex__optim_run_writing(const apex__cpu_active *a, int first, int nlists, unsigned written,
                                    const apex__simd_kernel *k, void *ctx, const char *name, apex_dtype own,
                                    unsigned raw);
/* x[i] = sqrt(x[i]) for a tile, correctly rounded; vectorised by the compiler (apex builds with
 * -fno-math-errno, without which the errno-setting sqrtf keeps loops scalar). */
APEX__INLINE void apex__optim_sqrt(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = sqrtf(x[i]);
}
/* Sum of x[i]^2 in a fixed order (eight f32 lanes), as the multi-tensor l2norm sums a tile: the
 * same bits whatever the vector width. */
APEX__INLINE float apex__optim_sumsq(const float *x, size_t n) {
  float acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += x[i + k] * x[i + k];
  for (int k = 0; i < n; i++, k++) acc[k] += x[i] * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
/* beta^step in double, the bias corrections' base. */
double apex__optim_pow(double beta, int64_t step);

/* ---- optim_lamb.c ---- */

/* Sets how many parameters one LAMB batch holds (both stages run batch by batch; see optim_lamb.c) and
 * returns the old value: for tests, to reach the path for tensors larger than a batch. */
size_t apex__lamb_set_batch_params(size_t n);

#endif
