/* model_io.c: a model's parameters and buffers to and from a safetensors file in f32 (contract in
 * model_io.h). Saving takes amp's f32 masters where they exist, since the low-precision parameter is
 * only their rounding; loading checks everything before it writes anything. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apex/model_io.h"
#include "apex/safetensors.h"
#include "core/internal.h"

/* Entry i of the model's state: parameters first, then buffers, with the name. */
static apex_tensor *entry(const apex_model *m, size_t i, const char **name, apex_var **param) {
  size_t np = apex_model_num_params(m);
  *param = NULL;
  if (i < np) {
    *param = apex_model_param(m, i, name);
    return apex_var_value(*param);
  }
  return apex_model_buffer(m, i - np, name);
}

apex_status apex_model_save_f32(const apex_model *m, const apex_amp *amp, const char *path) {
  if (!m || !path) return apex__fail(APEX_ERR_INVALID_ARG, "apex_model_save_f32: NULL %s", m ? "path" : "model");
  size_t n = apex_model_num_params(m) + apex_model_num_buffers(m);
  const char **names = calloc(n + 1, sizeof *names);
  apex_tensor **ts = calloc(n + 1, sizeof *ts), **owned = calloc(n + 1, sizeof *owned);
  apex_status st = names && ts && owned ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_model_save_f32: out of memory");
  for (size_t i = 0; i < n && st == APEX_OK; i++) {
    apex_var *param;
    apex_tensor *t = entry(m, i, &names[i], &param);
    apex_tensor *master = param ? apex_amp_master_of(amp, param) : NULL;
    if (master) t = master;
    /* a host f32 copy of what is stored in another dtype or on a device (a model made on a GPU) */
    if (apex_tensor_dtype(t) != APEX_F32 || apex_tensor_device(t) != APEX_DEVICE_CPU) {
      owned[i] = apex_tensor_create(APEX_F32, apex_tensor_ndim(t), apex_tensor_shape(t));
      st = owned[i] ? apex_tensor_copy(owned[i], t) : APEX_ERR_OUT_OF_MEMORY; /* the failing call's message stands */
      t = owned[i];
    }
    ts[i] = t;
  }
  if (st == APEX_OK) {
    const char *key = "format", *value = "apex model f32";
    st = apex_safetensors_save(path, names, ts, (int)n, &key, &value, 1);
  }
  for (size_t i = 0; owned && i < n; i++) apex_tensor_destroy(owned[i]);
  free(owned);
  free(ts);
  free(names);
  return st;
}

/* The file's tensor for model entry `name` shaped like dst, or NULL with the reason. */
static apex_tensor *matching(const apex_safetensors *f, const char *name, const apex_tensor *dst, const char *path,
                             apex_status *st) {
  if (!apex_safetensors_has(f, name)) {
    *st = apex__fail(APEX_ERR_INVALID_ARG, "apex_model_load_f32: %s has no tensor %s; the model was not changed", path, name);
    return NULL;
  }
  apex_tensor *t = apex_safetensors_get(f, name);
  if (!t) {
    *st = APEX_ERR_OUT_OF_MEMORY;
    return NULL;
  }
  int same = apex_tensor_ndim(t) == apex_tensor_ndim(dst);
  for (int d = 0; same && d < apex_tensor_ndim(t); d++) same = apex_tensor_dim(t, d) == apex_tensor_dim(dst, d);
  if (!same) {
    char have[96], want[96];
    apex_tensor_shape_str(t, have, sizeof have);
    apex_tensor_shape_str(dst, want, sizeof want);
    *st = apex__fail(APEX_ERR_SHAPE, "apex_model_load_f32: %s in %s has shape %s but the model's is %s; the model was not changed",
                     name, path, have, want);
    apex_tensor_destroy(t);
    return NULL;
  }
  return t;
}

apex_status apex_model_load_f32(apex_model *m, apex_amp *amp, const char *path) {
  if (!m || !path) return apex__fail(APEX_ERR_INVALID_ARG, "apex_model_load_f32: NULL %s", m ? "path" : "model");
  apex_safetensors *f = apex_safetensors_open(path);
  if (!f) return access(path, R_OK) == 0 ? APEX_ERR_CORRUPT : APEX_ERR_IO; /* the message says which */
  size_t n = apex_model_num_params(m) + apex_model_num_buffers(m);
  apex_tensor **src = calloc(n + 1, sizeof *src);
  apex_status st = src ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_model_load_f32: out of memory");
  /* Everything is read and checked first ... */
  for (size_t i = 0; i < n && st == APEX_OK; i++) {
    const char *name;
    apex_var *param;
    apex_tensor *dst = entry(m, i, &name, &param);
    src[i] = matching(f, name, dst, path, &st);
  }
  /* ... then written: masters get the file's values, the model its dtype's rounding of them. */
  for (size_t i = 0; i < n && st == APEX_OK; i++) {
    const char *name;
    apex_var *param;
    apex_tensor *dst = entry(m, i, &name, &param);
    apex_tensor *master = param ? apex_amp_master_of(amp, param) : NULL;
    if (master) st = apex_tensor_copy(master, src[i]);
    if (st == APEX_OK) st = apex_tensor_copy(dst, master ? master : src[i]);
  }
  for (size_t i = 0; src && i < n; i++) apex_tensor_destroy(src[i]);
  free(src);
  apex_safetensors_close(f);
  return st;
}
