/* optim_slots.c: the CUDA backend's optimizer-step and loss-scaler slots (backend/args_optim.h) over
 * optim.cu (with lamb.cu, novograd.cu, adamp.cu) and loss_scaler.cu. The step's lists become device
 * lists in one host block; the step counts, the skip flag and the scale stay on the device. */
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "core/internal.h"

apex_status apex__cuda_slot_optim_step(const apex_optim_step_args *a) {
  int n = a->n, lists = 3 + a->nstates;
  size_t each = (size_t)(n ? n : 1);
  /* One block: the lists' pointers, element counts and dtypes, then AdamP's rows per entry. */
  size_t list_bytes = (size_t)lists * each * (sizeof(void *) + sizeof(apex_dtype) + sizeof(size_t));
  list_bytes = (list_bytes + sizeof(int64_t) - 1) / sizeof(int64_t) * sizeof(int64_t);
  char *mem = malloc(list_bytes + each * sizeof(int64_t));
  if (!mem) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
  apex__cuda_step c = {0};
  int64_t *rows = (int64_t *)(mem + list_bytes);
  apex__cuda_list *all[6] = {&c.g, &c.p, &c.model, &c.s[0], &c.s[1], &c.s[2]};
  for (int l = 0; l < lists; l++) {
    all[l]->n = n;
    all[l]->ptr = (void **)(mem + (size_t)l * each * sizeof(void *));
    all[l]->numel = (size_t *)(mem + (size_t)lists * each * sizeof(void *) + (size_t)l * each * sizeof(size_t));
    all[l]->dtype = (apex_dtype *)(mem + (size_t)lists * each * (sizeof(void *) + sizeof(size_t)) +
                                   (size_t)l * each * sizeof(apex_dtype));
  }
  for (int j = 0; j < n; j++) {
    rows[j] = apex_tensor_ndim(a->p[j]) >= 2 ? apex_tensor_dim(a->p[j], 0) : 0;
    apex_tensor *t[6] = {a->g[j], a->p[j], a->model[j], NULL, NULL, NULL};
    for (int s = 0; s < a->nstates; s++) t[3 + s] = a->s[s][j];
    for (int l = 0; l < lists; l++) {
      all[l]->ptr[j] = t[l] ? apex_tensor_data(t[l]) : NULL;
      all[l]->numel[j] = apex_tensor_numel(a->p[j]);
      all[l]->dtype[j] = t[l] ? apex_tensor_dtype(t[l]) : APEX_F32;
    }
  }
  c.rows = rows;
  c.kind = a->kind;
  c.o = a->o;
  c.n = n;
  c.nstates = a->nstates;
  c.inv_scale = a->inv_scale;
  c.d_scale = a->dev_scale;
  c.d_skip = a->dev_skip;
  c.d_lr = a->dev_lr;
  c.d_step = a->dev_step;
  c.idx = a->idx;
  c.d_grad_norm = a->dev_grad_norm;
  c.d_scalars = a->dev_scalars;
  apex_status st = apex__cuda_optim_step(&c);
  free(mem);
  return st;
}

apex_status apex__cuda_slot_scaler_update(const apex_scaler_update_args *a) {
  return apex__cuda_scaler_update(a->dev_state, a->c, a->dev_raise, a->raise_mask);
}
