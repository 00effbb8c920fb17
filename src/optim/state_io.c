/* state_io.c: saving and loading an optimizer's state (layout documented in include/apex/optim.h).
 *
 * Loading parses the whole buffer twice: a dry run that checks every count, shape, dtype and the
 * hash, and only then a second run that copies. So a refused load changes nothing.
 *
 * A GPU group's masters, states and step counts are copied between the device and the buffer; the
 * bytes are the same as for the same state on the CPU, so a state saved on one device loads on the
 * other. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "backend/backend.h"
#include "optim/optim_internal.h"

#define MAGIC "APEXOPTM"
#define VERSION 1u
#define OPTION_WORDS (sizeof(apex_optim_options) / 4)
_Static_assert(sizeof(apex_optim_options) % 4 == 0, "options are 4-byte words");

static int host_is_le(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
#define FNV_SEED 0xcbf29ce484222325ull

/* ---- writing (buf NULL: only count) ---- */
typedef struct {
  uint8_t *buf;
  size_t pos;
  apex_status st; /* the first failed device copy */
} writer;

static void put_bytes(writer *w, const void *p, size_t n) {
  if (w->buf) memcpy(w->buf + w->pos, p, n);
  w->pos += n;
}
static void put_le(writer *w, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
  put_bytes(w, b, (size_t)bytes);
}
static void put_f32s(writer *w, const float *x, size_t n) {
  if (host_is_le()) {
    put_bytes(w, x, n * 4);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    put_le(w, u, 4);
  }
}

/* An f32 state tensor (master, moment) wherever it lives. Device memory goes straight into the
 * buffer: every CUDA host is little-endian, the layout's byte order. */
static void put_tensor(writer *w, const apex_tensor *t) {
  size_t n = apex_tensor_numel(t);
  if (apex_tensor_device(t) == APEX_DEVICE_CPU) {
    put_f32s(w, apex_tensor_data(t), n);
    return;
  }
  if (w->buf && w->st == APEX_OK && host_is_le())
    w->st = apex__backend_for(apex_tensor_device(t))->mem->copy(w->buf + w->pos, apex_tensor_data(t), n * 4,
                                                                APEX_COPY_D2H, 1);
  w->pos += n * 4;
}

static void write_state(const apex_optimizer *opt, writer *w) {
  put_bytes(w, MAGIC, 8);
  put_le(w, VERSION, 4);
  put_le(w, (uint32_t)opt->kind, 4);
  put_le(w, (uint32_t)opt->ngroups, 4);
  size_t total_at = w->pos;
  put_le(w, 0, 8);
  for (int k = 0; k < opt->ngroups; k++) {
    const apex__group *g = &opt->groups[k];
    put_le(w, OPTION_WORDS, 4);
    put_f32s(w, (const float *)&g->o, OPTION_WORDS);
    put_le(w, (uint32_t)g->n, 4);
    put_le(w, (uint32_t)g->nstates, 4);
    put_le(w, (uint32_t)g->nscalars, 4);
    for (int i = 0; i < g->n; i++) {
      const apex_tensor *p = g->params[i];
      put_le(w, (uint32_t)apex_tensor_dtype(p), 4);
      put_le(w, (uint32_t)apex_tensor_ndim(p), 4);
      for (int d = 0; d < apex_tensor_ndim(p); d++) put_le(w, (uint64_t)apex_tensor_shape(p)[d], 8);
      put_le(w, (uint64_t)g->step[i], 8);
      put_le(w, g->master[i] != NULL, 4);
      if (g->master[i]) put_tensor(w, g->master[i]);
      for (int s = 0; s < g->nstates; s++) put_tensor(w, g->state[(size_t)i * g->nstates + s]);
    }
    put_f32s(w, g->scalars, (size_t)g->n * (size_t)g->nscalars);
  }
  size_t total = w->pos + 8;
  if (w->buf) {
    for (int i = 0; i < 8; i++) w->buf[total_at + i] = (uint8_t)((uint64_t)total >> (8 * i));
  }
  uint64_t h = w->buf ? fnv1a(FNV_SEED, w->buf, w->pos) : 0;
  put_le(w, h, 8);
}

apex_status apex_optimizer_state_size(const apex_optimizer *opt, size_t *bytes) {
  if (!opt || !bytes) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_state_size: NULL argument");
  writer w = {NULL, 0, APEX_OK};
  write_state(opt, &w);
  *bytes = w.pos;
  return APEX_OK;
}

/* A GPU group's step counts live on the device (updated there by each step): bring them to the host
 * mirror that write_state reads. */
static apex_status steps_to_host(const apex_optimizer *opt) {
  for (int k = 0; k < opt->ngroups; k++) {
    apex_status st = apex__optim_steps_to_host((apex__group *)&opt->groups[k]);
    if (st != APEX_OK) return st;
  }
  return APEX_OK;
}

apex_status apex_optimizer_save(const apex_optimizer *opt, void *buf, size_t size, size_t *written) {
  size_t need = 0;
  apex_status st = apex_optimizer_state_size(opt, &need);
  if (st != APEX_OK) return st;
  if (!buf || size < need)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_save: the buffer holds %zu bytes, the state needs %zu "
                      "(see apex_optimizer_state_size)", buf ? size : 0, need);
  st = steps_to_host(opt);
  if (st != APEX_OK) return st;
  writer w = {buf, 0, APEX_OK};
  write_state(opt, &w);
  if (w.st != APEX_OK) return w.st;
  if (!host_is_le())
    for (int k = 0; k < opt->ngroups; k++)
      if (opt->groups[k].device != APEX_DEVICE_CPU)
        return apex__fail(APEX_ERR_UNSUPPORTED, "apex_optimizer_save: GPU state on a big-endian host");
  if (written) *written = w.pos;
  return APEX_OK;
}

/* ---- reading ---- */
typedef struct {
  const uint8_t *buf;
  size_t size, pos;
  int apply; /* 0: dry run, check only */
} reader;

static apex_status need(reader *r, size_t n, const char *what) {
  if (r->size - r->pos < n)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: the state is truncated (at byte %zu, reading %s)",
                      r->pos, what);
  return APEX_OK;
}
static uint64_t get_le(reader *r, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)r->buf[r->pos + i] << (8 * i);
  r->pos += (size_t)bytes;
  return v;
}
/* Reads n floats into dst (when applying; skips them in a dry run). */
static apex_status get_f32s(reader *r, float *dst, size_t n, const char *what) {
  if (n > SIZE_MAX / 4) return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: %s is too large", what);
  apex_status st = need(r, n * 4, what);
  if (st != APEX_OK || !r->apply) {
    if (st == APEX_OK) r->pos += n * 4;
    return st;
  }
  if (host_is_le()) {
    memcpy(dst, r->buf + r->pos, n * 4);
    r->pos += n * 4;
  } else {
    for (size_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)get_le(r, 4);
      memcpy(&dst[i], &u, 4);
    }
  }
  return APEX_OK;
}

/* Reads an f32 state tensor wherever it lives (skips it in a dry run). */
static apex_status get_tensor(reader *r, apex_tensor *t, const char *what) {
  size_t n = apex_tensor_numel(t);
  if (apex_tensor_device(t) == APEX_DEVICE_CPU) return get_f32s(r, apex_tensor_data(t), n, what);
  apex_status st = need(r, n * 4, what);
  if (st != APEX_OK) return st;
  if (r->apply) {
    if (!host_is_le()) return apex__fail(APEX_ERR_UNSUPPORTED, "apex_optimizer_load: GPU state on a big-endian host");
    st = apex__backend_for(apex_tensor_device(t))->mem->copy(apex_tensor_data(t), r->buf + r->pos, n * 4, APEX_COPY_H2D, 1);
    if (st != APEX_OK) return st;
  }
  r->pos += n * 4;
  return APEX_OK;
}

#define GET(var, bytes, what)                     \
  do {                                            \
    apex_status st_ = need(r, (bytes), (what));   \
    if (st_ != APEX_OK) return st_;               \
    (var) = get_le(r, (bytes));                   \
  } while (0)

static apex_status read_param(apex_optimizer *opt, reader *r, int k, int i) {
  apex__group *g = &opt->groups[k];
  const apex_tensor *p = g->params[i];
  uint64_t dtype, ndim, step;
  GET(dtype, 4, "a dtype");
  if (dtype != (uint64_t)apex_tensor_dtype(p))
    return apex__fail(APEX_ERR_DTYPE, "apex_optimizer_load: group %d, parameter %d was saved as %s but is %s", k, i,
                      apex_dtype_name((apex_dtype)(dtype < APEX_DTYPE_COUNT ? dtype : APEX_DTYPE_COUNT)),
                      apex_dtype_name(apex_tensor_dtype(p)));
  GET(ndim, 4, "a rank");
  int same = ndim == (uint64_t)apex_tensor_ndim(p);
  int64_t shape[APEX_MAX_DIMS] = {0};
  for (uint64_t d = 0; d < ndim && d < APEX_MAX_DIMS; d++) {
    GET(shape[d], 8, "a shape");
    same = same && shape[d] == apex_tensor_shape(p)[d];
  }
  if (!same) {
    char saved[160] = "[", want[96];
    for (uint64_t d = 0; d < ndim && d < APEX_MAX_DIMS; d++)
      snprintf(saved + strlen(saved), sizeof saved - strlen(saved), "%s%lld", d ? ", " : "", (long long)shape[d]);
    strcat(saved, ndim > APEX_MAX_DIMS ? ", ...]" : "]");
    return apex__fail(APEX_ERR_SHAPE, "apex_optimizer_load: group %d, parameter %d was saved with shape %s but has "
                      "shape %s", k, i, saved, apex_tensor_shape_str(p, want, sizeof want));
  }
  GET(step, 8, "a step count");
  if ((int64_t)step < 0)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: group %d, parameter %d has step count %lld", k, i,
                      (long long)step);
  uint64_t has_master;
  GET(has_master, 4, "the master flag");
  if (has_master != (g->master[i] != NULL))
    return apex__fail(APEX_ERR_STATE, "apex_optimizer_load: group %d, parameter %d was saved %s f32 master weights but "
                      "the optimizer keeps %s", k, i, has_master ? "with" : "without", g->master[i] ? "some" : "none");
  apex_status st = APEX_OK;
  if (g->master[i]) st = get_tensor(r, g->master[i], "a master");
  for (int s = 0; st == APEX_OK && s < g->nstates; s++)
    st = get_tensor(r, g->state[(size_t)i * g->nstates + s], "a state tensor");
  if (st == APEX_OK && r->apply) {
    g->step[i] = (int64_t)step;
    if (g->master[i]) st = apex_tensor_copy(g->params[i], g->master[i]);
  }
  return st;
}

static apex_status read_group(apex_optimizer *opt, reader *r, int k) {
  apex__group *g = &opt->groups[k];
  uint64_t words, n, nstates, nscalars;
  GET(words, 4, "the options");
  if (words != OPTION_WORDS)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: group %d has %llu option words, expected %zu", k,
                      (unsigned long long)words, (size_t)OPTION_WORDS);
  apex_optim_options o, resolved;
  reader sub = *r;
  sub.apply = 1;
  apex_status st = get_f32s(&sub, (float *)&o, OPTION_WORDS, "the options");
  if (st != APEX_OK) return st;
  r->pos = sub.pos;
  if (apex__optim_resolve(opt->ops, &o, &resolved) != APEX_OK)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: group %d: invalid saved options (%s)", k,
                      apex_last_error());
  GET(n, 4, "a parameter count");
  if (n != (uint64_t)g->n)
    return apex__fail(APEX_ERR_STATE, "apex_optimizer_load: group %d was saved with %llu parameters but has %d", k,
                      (unsigned long long)n, g->n);
  GET(nstates, 4, "a state count");
  GET(nscalars, 4, "a scalar count");
  int want_states = opt->ops->nstates(&resolved);
  if (nstates != (uint64_t)want_states || (int)nstates != g->nstates || nscalars != (uint64_t)g->nscalars)
    return apex__fail(APEX_ERR_STATE, "apex_optimizer_load: group %d was saved with %llu state tensors per parameter "
                      "but has %d (options such as amsgrad, momentum or centered differ)", k,
                      (unsigned long long)nstates, g->nstates);
  for (int i = 0; i < g->n; i++) {
    st = read_param(opt, r, k, i);
    if (st != APEX_OK) return st;
  }
  st = get_f32s(r, g->scalars, (size_t)g->n * (size_t)g->nscalars, "the per-tensor scalars");
  if (st == APEX_OK && r->apply) {
    g->o = resolved;
    st = apex__optim_lr_to_device(g);
    if (st == APEX_OK) st = apex__optim_steps_to_device(g);
  }
  return st;
}

static apex_status read_state(apex_optimizer *opt, reader *r) {
  uint64_t version, kind, ngroups, total, hash;
  apex_status st = need(r, 8, "the magic");
  if (st != APEX_OK) return st;
  if (memcmp(r->buf, MAGIC, 8))
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: not an apex optimizer state (bad magic)");
  r->pos = 8;
  GET(version, 4, "the version");
  if (version != VERSION)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: state version %llu; this library reads version %u",
                      (unsigned long long)version, VERSION);
  GET(kind, 4, "the kind");
  if (kind != (uint64_t)opt->kind)
    return apex__fail(APEX_ERR_STATE, "apex_optimizer_load: the state is from an %s optimizer, this one is %s",
                      apex_optim_kind_name((apex_optim_kind)(kind < APEX_OPTIM_KIND_COUNT ? kind : APEX_OPTIM_KIND_COUNT)),
                      apex_optim_kind_name(opt->kind));
  GET(ngroups, 4, "the group count");
  if (ngroups != (uint64_t)opt->ngroups)
    return apex__fail(APEX_ERR_STATE, "apex_optimizer_load: the state has %llu parameter groups, the optimizer %d",
                      (unsigned long long)ngroups, opt->ngroups);
  GET(total, 8, "the length");
  if (total != r->size)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: the state says it is %llu bytes long but %zu were given",
                      (unsigned long long)total, r->size);
  reader tail = {r->buf, r->size, r->size - 8, 0};
  hash = get_le(&tail, 8);
  if (fnv1a(FNV_SEED, r->buf, r->size - 8) != hash)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: the state is corrupted (hash mismatch)");
  for (int k = 0; k < opt->ngroups; k++) {
    st = read_group(opt, r, k);
    if (st != APEX_OK) return st;
  }
  if (r->pos != r->size - 8)
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: %zu unexpected bytes after the state",
                      r->size - 8 - r->pos);
  return APEX_OK;
}

apex_status apex_optimizer_load(apex_optimizer *opt, const void *buf, size_t size) {
  if (!opt || !buf) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_load: NULL argument");
  if (size < 36) return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load: the state is truncated (%zu bytes)", size);
  reader dry = {buf, size, 0, 0};
  apex_status st = read_state(opt, &dry);
  if (st != APEX_OK) return st;
  reader apply = {buf, size, 0, 1};
  return read_state(opt, &apply);
}

apex_status apex_optimizer_save_file(const apex_optimizer *opt, FILE *f) {
  size_t n = 0;
  apex_status st = apex_optimizer_state_size(opt, &n);
  if (st != APEX_OK) return st;
  if (!f) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_save_file: NULL file");
  void *buf = malloc(n);
  if (!buf) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_save_file: out of memory (%zu bytes)", n);
  st = apex_optimizer_save(opt, buf, n, NULL);
  if (st == APEX_OK && fwrite(buf, 1, n, f) != n)
    st = apex__fail(APEX_ERR_IO, "apex_optimizer_save_file: could not write %zu bytes", n);
  free(buf);
  return st;
}

apex_status apex_optimizer_load_file(apex_optimizer *opt, FILE *f) {
  if (!opt || !f) return apex__fail(APEX_ERR_INVALID_ARG, "apex_optimizer_load_file: NULL argument");
  uint8_t head[28];
  if (fread(head, 1, sizeof head, f) != sizeof head)
    return apex__fail(APEX_ERR_IO, "apex_optimizer_load_file: could not read the state header");
  uint64_t total = 0;
  for (int i = 0; i < 8; i++) total |= (uint64_t)head[20 + i] << (8 * i);
  if (total < sizeof head || total > ((uint64_t)1 << 48))
    return apex__fail(APEX_ERR_CORRUPT, "apex_optimizer_load_file: implausible state length %llu",
                      (unsigned long long)total);
  uint8_t *buf = malloc((size_t)total);
  if (!buf) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_optimizer_load_file: out of memory");
  memcpy(buf, head, sizeof head);
  apex_status st = APEX_OK;
  if (fread(buf + sizeof head, 1, (size_t)total - sizeof head, f) != (size_t)total - sizeof head)
    st = apex__fail(APEX_ERR_IO, "apex_optimizer_load_file: the file ends before the state does");
  if (st == APEX_OK) st = apex_optimizer_load(opt, buf, (size_t)total);
  free(buf);
  return st;
}
