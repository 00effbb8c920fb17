/* model.c: models, their named parameters and buffers, and deterministic initialisation.
 *
 * Parameters draw their initial values from the model's own Philox generator in creation order, so
 * two models built the same way from the same seed are bit-identical whatever the thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/ag.h"
#include "core/internal.h"
#include "nn/nn_internal.h"

apex_model *apex_model_create(const apex_model_options *opts) {
  static const apex_model_options defaults = {0};
  if (!opts) opts = &defaults;
  if (apex__check_dtype(opts->dtype, "apex_model_create") != APEX_OK) return NULL;
  if (!apex__memory_for(opts->device, "apex_model_create")) return NULL;
  apex_model *m = calloc(1, sizeof *m);
  if (!m) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "apex_model_create: out of memory");
  m->init_rng = apex_rng_init(opts->seed);
  /* dropout draws from a stream of its own, so adding dropout does not shift initial values */
  m->rng = apex_rng_init(opts->seed ^ 0x9e3779b97f4a7c15ull);
  m->dtype = opts->dtype;
  m->device = opts->device;
  m->training = 1;
  return m;
}

static void module_free(apex_module *mod) {
  for (size_t i = 0; i < mod->n_positions; i++) apex_index_destroy(mod->positions[i]);
  free(mod->positions);
  free(mod->children);
  free(mod);
}

void apex_model_destroy(apex_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_params; i++) apex_var_destroy(m->params[i].var);
  for (size_t i = 0; i < m->n_buffers; i++) apex_tensor_destroy(m->buffers[i].t);
  for (size_t i = 0; i < m->n_modules; i++) module_free(m->modules[i]);
  free(m->params);
  free(m->buffers);
  free(m->modules);
  free(m);
}

void apex_model_train(apex_model *m, int training) {
  if (m) m->training = training != 0;
}
/* The accessors answer a NULL model with the value nn.h gives and a message (apex__fail_null_arg). */
static int null_model(const apex_model *m, const char *fn) {
  if (m) return 0;
  apex__fail_null_arg(fn, "model");
  return 1;
}

int apex_model_is_training(const apex_model *m) { return null_model(m, __func__) ? 0 : m->training; }
apex_rng *apex_model_rng(apex_model *m) { return null_model(m, __func__) ? NULL : &m->rng; }

size_t apex_model_num_params(const apex_model *m) { return null_model(m, __func__) ? 0 : m->n_params; }
apex_var *apex_model_param(const apex_model *m, size_t i, const char **name) {
  if (null_model(m, __func__) || i >= m->n_params) return NULL;
  if (name) *name = m->params[i].name;
  return m->params[i].var;
}
apex_var *apex_model_find_param(const apex_model *m, const char *name) {
  if (null_model(m, __func__)) return NULL;
  for (size_t i = 0; name && i < m->n_params; i++)
    if (!strcmp(m->params[i].name, name)) return m->params[i].var;
  return NULL;
}
size_t apex_model_param_elements(const apex_model *m) {
  size_t n = 0;
  if (null_model(m, __func__)) return 0;
  for (size_t i = 0; i < m->n_params; i++) n += apex_tensor_numel(apex_var_value(m->params[i].var));
  return n;
}
size_t apex_model_num_buffers(const apex_model *m) { return null_model(m, __func__) ? 0 : m->n_buffers; }
apex_tensor *apex_model_buffer(const apex_model *m, size_t i, const char **name) {
  if (null_model(m, __func__) || i >= m->n_buffers) return NULL;
  if (name) *name = m->buffers[i].name;
  return m->buffers[i].t;
}
apex_tensor *apex_model_find_buffer(const apex_model *m, const char *name) {
  if (null_model(m, __func__)) return NULL;
  for (size_t i = 0; name && i < m->n_buffers; i++)
    if (!strcmp(m->buffers[i].name, name)) return m->buffers[i].t;
  return NULL;
}

apex_status apex_model_zero_grad(apex_model *m) {
  if (!m) return apex__fail(APEX_ERR_INVALID_ARG, "apex_model_zero_grad: NULL model");
  for (size_t i = 0; i < m->n_params; i++) apex_var_zero_grad(m->params[i].var);
  return APEX_OK;
}

/* ---- registration ------------------------------------------------------------------------------- */

apex_module *apex__nn_module(apex_model *m, nn_kind kind, const char *name, const char *who) {
  if (!m) return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: NULL model", who);
  if (name && strlen(name) >= APEX_NAME_MAX - 16)
    return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: name '%.40s...' is too long (at most %d characters)", who, name, APEX_NAME_MAX - 17);
  for (size_t i = 0; name && *name && i < m->n_modules; i++)
    if (!strcmp(m->modules[i]->name, name))
      return apex__fail_null(APEX_ERR_INVALID_ARG, "%s: the model already has a module named '%s'", who, name);
  if (!apex__grow((void **)&m->modules, &m->cap_modules, m->n_modules + 1, sizeof *m->modules))
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
  apex_module *mod = calloc(1, sizeof *mod);
  if (!mod) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
  mod->model = m;
  mod->kind = kind;
  if (name) apex__nn_join(mod->name, "", name);
  m->modules[m->n_modules++] = mod;
  return mod;
}

static void full_name(char *dst, const apex_module *mod, const char *local) { apex__nn_join(dst, mod->name, local); }

/* t (a host tensor, consumed) on the model's device: itself on the CPU, else a copy; NULL with a message. */
static apex_tensor *to_device(const apex_model *m, apex_tensor *t) {
  if (m->device == APEX_DEVICE_CPU) return t;
  apex_tensor *d = apex_tensor_create_on(m->device, apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (d && apex_tensor_copy(d, t) != APEX_OK) {
    apex_tensor_destroy(d);
    d = NULL;
  }
  apex_tensor_destroy(t);
  return d;
}

apex_var *apex__nn_param(apex_module *mod, const char *local, int ndim, const int64_t *shape, char init, float bound) {
  apex_model *m = mod->model;
  if (!apex__grow((void **)&m->params, &m->cap_params, m->n_params + 1, sizeof *m->params))
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", mod->name);
  apex_tensor *f = apex_tensor_create(APEX_F32, ndim, shape);
  if (!f) return NULL;
  float *d = apex_tensor_data(f);
  size_t n = apex_tensor_numel(f);
  if (init == 'u') {
    apex_rng_uniform(&m->init_rng, d, n);
    for (size_t i = 0; i < n; i++) d[i] = (2.0f * d[i] - 1.0f) * bound;
  } else if (init == 'n') {
    apex_rng_normal(&m->init_rng, d, n, 0.0f, 1.0f);
    if (bound > 0)
      for (size_t i = 0; i < n; i++) d[i] *= bound;
  } else {
    apex_tensor_fill(f, init == '1' ? 1.0f : 0.0f);
  }
  apex_tensor *t = f;
  if (m->dtype != APEX_F32) {
    t = apex_tensor_to(f, m->dtype);
    apex_tensor_destroy(f);
    if (!t) return NULL;
  }
  if (!(t = to_device(m, t))) return NULL;
  apex_var *v = apex_var_create(t, 1);
  if (!v) {
    apex_tensor_destroy(t);
    return NULL;
  }
  full_name(m->params[m->n_params].name, mod, local);
  m->params[m->n_params++].var = v;
  return v;
}

apex_tensor *apex__nn_buffer(apex_module *mod, const char *local, int64_t n, float value) {
  apex_model *m = mod->model;
  if (!apex__grow((void **)&m->buffers, &m->cap_buffers, m->n_buffers + 1, sizeof *m->buffers))
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", mod->name);
  apex_tensor *t = apex_tensor_create_on(m->device, APEX_F32, 1, &n);
  if (!t) return NULL;
  if (apex_tensor_fill(t, value) != APEX_OK) {
    apex_tensor_destroy(t);
    return NULL;
  }
  full_name(m->buffers[m->n_buffers].name, mod, local);
  m->buffers[m->n_buffers++].t = t;
  return t;
}

int apex__nn_add_child(apex_module *mod, apex_module *child) {
  if (!apex__grow((void **)&mod->children, &mod->cap_children, mod->n_children + 1, sizeof *mod->children)) return 0;
  mod->children[mod->n_children++] = child;
  return 1;
}
