/* param_kind.c: what kind of module owns a parameter, for amp's keep_batchnorm_fp32 (batch norm
 * weights stay f32 when the rest of the model is cast). */
#include "nn/nn_internal.h"

int apex_model_param_in_batch_norm(const apex_model *m, size_t i) {
  if (!m || i >= m->n_params) return 0;
  const apex_var *v = m->params[i].var;
  for (size_t k = 0; k < m->n_modules; k++) {
    const apex_module *mod = m->modules[k];
    if (mod->kind != NN_BATCH_NORM1D && mod->kind != NN_BATCH_NORM2D) continue;
    for (int p = 0; p < NN_MAX_PARAMS; p++)
      if (mod->p[p] == v) return 1;
  }
  return 0;
}
