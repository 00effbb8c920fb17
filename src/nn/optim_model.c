/* optim_model.c: apex_optimizer_add_model, one call that gives an optimizer a model's parameters and
 * their gradients as a group, instead of the gather loop every training program wrote. It lives in
 * nn because optim sits below nn and knows no models. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/nn.h"
#include "core/internal.h"

apex_status apex_optimizer_add_model(apex_optimizer *opt, const apex_model *m, const apex_optim_options *opts, int *group_out) {
  if (!opt || !m) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_model: NULL %s", opt ? "model" : "optimizer");
  size_t np = apex_model_num_params(m);
  if (np == 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_model: the model has no parameters; add its modules first");
  if (np > INT_MAX) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_add_model: %zu parameters is more than a group holds", np);
  apex_tensor **params = malloc(np * sizeof *params), **grads = malloc(np * sizeof *grads);
  apex_status st = APEX_OK;
  if (!params || !grads) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_add_model: out of memory");
  for (size_t i = 0; st == APEX_OK && i < np; i++) {
    apex_var *p = apex_model_param(m, i, NULL);
    params[i] = apex_var_value(p);
    grads[i] = apex_var_grad(p); /* NULL for a parameter that does not require gradients */
  }
  if (st == APEX_OK && (st = apex_optimizer_add_group(opt, params, (int)np, grads, (int)np, opts, group_out)) != APEX_OK) {
    char why[512]; /* the message is rewritten below: copy it out first */
    snprintf(why, sizeof why, "%s", apex_last_error());
    st = apex__fail(st, "apex_optimizer_add_model: %s", why);
  }
  free(params);
  free(grads);
  return st;
}
