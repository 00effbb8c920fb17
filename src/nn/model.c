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

/* Fills d[0..n) per init (apex__nn_param's codes) from the model's generator. */
static void init_values(apex_model *m, float *d, size_t n, char init, float bound) {
  if (init == 'u') {
    apex_rng_uniform(&m->init_rng, d, n);
    for (size_t i = 0; i < n; i++) d[i] = (2.0f * d[i] - 1.0f) * bound;
  } else if (init == 'n') {
    apex_rng_normal(&m->init_rng, d, n, 0.0f, 1.0f);
    if (bound > 0)
      for (size_t i = 0; i < n; i++) d[i] *= bound;
  } else {
    for (size_t i = 0; i < n; i++) d[i] = init == '1' ? 1.0f : 0.0f;
  }
}

/* f (a host f32 tensor, consumed) in the model's dtype on the model's device; NULL with a message. */
static apex_tensor *on_model(const apex_model *m, apex_tensor *f) {
  apex_tensor *t = f;
  if (m->dtype != APEX_F32) {
    t = apex_tensor_to(f, m->dtype);
    apex_tensor_destroy(f);
    if (!t) return NULL;
  }
  return to_device(m, t);
}

/* Registers value (consumed, NULL after a failure: passed on) as the parameter "<module>.<local>". */
static apex_var *add_param(apex_module *mod, const char *local, apex_tensor *value) {
  apex_model *m = mod->model;
  if (!value) return NULL;
  apex_var *v = apex__grow((void **)&m->params, &m->cap_params, m->n_params + 1, sizeof *m->params) ? apex_var_create(value, 1) : NULL;
  if (!v) {
    apex_tensor_destroy(value);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", mod->name);
  }
  full_name(m->params[m->n_params].name, mod, local);
  m->params[m->n_params++].var = v;
  return v;
}

apex_var *apex__nn_param(apex_module *mod, const char *local, int ndim, const int64_t *shape, char init, float bound) {
  apex_tensor *f = apex_tensor_create(APEX_F32, ndim, shape);
  if (!f) return NULL;
  init_values(mod->model, apex_tensor_data(f), apex_tensor_numel(f), init, bound);
  return add_param(mod, local, on_model(mod->model, f));
}

apex_status apex__nn_linear_params_joint(apex_module *const *mods, int n, int64_t in, int64_t out) {
  apex_model *m = mods[0]->model;
  int64_t ws[2] = {n * out, in}, bs = n * out, one_w[2] = {out, in};
  apex_tensor *w = apex_tensor_create(APEX_F32, 2, ws), *b = w ? apex_tensor_create(APEX_F32, 1, &bs) : NULL;
  if (!b) {
    apex_tensor_destroy(w);
    return apex_last_status();
  }
  /* apex_linear_create's draws, in its order: a module's weight, then its bias, module by module */
  const float bound = 1.0f / sqrtf((float)in);
  const size_t wn = (size_t)out * (size_t)in;
  for (int i = 0; i < n; i++) {
    init_values(m, (float *)apex_tensor_data(w) + (size_t)i * wn, wn, 'u', bound);
    init_values(m, (float *)apex_tensor_data(b) + (size_t)i * (size_t)out, (size_t)out, 'u', bound);
  }
  if ((w = on_model(m, w))) b = on_model(m, b);
  else apex_tensor_destroy(b);
  apex_status st = w && b ? APEX_OK : apex_last_status();
  /* each parameter a view of its block; the views keep the two allocations alive once w and b go */
  for (int i = 0; i < n && st == APEX_OK; i++) {
    mods[i]->p[0] = add_param(mods[i], "weight", apex_tensor_slice_view(w, (size_t)i * wn, 2, one_w));
    mods[i]->p[1] = mods[i]->p[0] ? add_param(mods[i], "bias", apex_tensor_slice_view(b, (size_t)i * (size_t)out, 1, &out)) : NULL;
    if (!mods[i]->p[1]) st = apex_last_status();
  }
  apex_tensor_destroy(w);
  apex_tensor_destroy(b);
  return st;
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
