/* optim.c: the CPU backend's optim_step slot (backend/args_optim.h). The step counts live in host memory
 * (dev_step): each entry's count plus one goes to the kind's step (bias corrections, SGD's first-step
 * momentum), and is stored back once the step succeeded. A step whose dev_skip flag is set changes
 * nothing, counts included, as on a GPU. */
#include <stdlib.h>

#include "backend/cpu/cpu_optim.h"

typedef apex_status (*kind_step)(const apex__cpu_step *s);

static kind_step step_of(apex_optim_kind kind) {
  switch (kind) {
    case APEX_OPTIM_SGD: return apex__cpu_sgd_step;
    case APEX_OPTIM_ADAM:
    case APEX_OPTIM_ADAMW: return apex__cpu_adam_step;
    case APEX_OPTIM_ADAMP: return apex__cpu_adamp_step;
    case APEX_OPTIM_LAMB: return apex__cpu_lamb_step;
    case APEX_OPTIM_ADADELTA: return apex__cpu_adadelta_step;
    case APEX_OPTIM_ADAGRAD: return apex__cpu_adagrad_step;
    case APEX_OPTIM_RMSPROP:
    case APEX_OPTIM_RMSPROP_TF: return apex__cpu_rmsprop_step;
    case APEX_OPTIM_NOVOGRAD: return apex__cpu_novograd_step;
    default: return NULL;
  }
}

apex_status apex__cpu_optim_step(const apex_optim_step_args *a) {
  kind_step step = step_of(a->kind);
  if (!step) return apex__fail(APEX_ERR_INVALID_ARG, "%s: unknown optimizer kind %d", a->fn, (int)a->kind);
  if (a->dev_skip && *a->dev_skip) return APEX_OK;
  int64_t *counts = malloc((size_t)(a->n ? a->n : 1) * sizeof *counts);
  if (!counts) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
  for (int j = 0; j < a->n; j++) counts[j] = a->dev_step[a->idx[j]] + 1;
  apex__cpu_active act = {.n = a->n, .idx = a->idx, .g = a->g, .p = a->p, .model = a->model, .step = counts};
  for (int s = 0; s < a->nstates; s++) act.s[s] = a->s[s];
  float inv_scale = a->inv_scale;
  if (a->dev_scale) inv_scale /= *a->dev_scale;
  /* The global norm was taken of g * a->inv_scale (args_optim.h): the scaler's scale is divided out
   * here, as the CUDA LAMB kernel does. */
  float gnorm = a->dev_grad_norm ? *a->dev_grad_norm : 0.0f;
  if (a->dev_grad_norm && a->dev_scale) gnorm /= *a->dev_scale;
  apex__cpu_step s = {.kind = a->kind, .o = a->o, .a = &act, .inv_scale = inv_scale, .global_grad_norm = gnorm,
                      .scalars = a->dev_scalars};
  apex_status st = step(&s);
  if (st == APEX_OK)
    for (int j = 0; j < a->n; j++) a->dev_step[a->idx[j]] = counts[j];
  free(counts);
  return st;
}
