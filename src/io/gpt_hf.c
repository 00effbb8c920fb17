/* gpt_hf.c: apex's GPT to and from Hugging Face's GPT2LMHeadModel layout (contract and the table of
 * names in gpt_hf.h). Loading builds every apex tensor on the host in f32 first, so that a missing
 * tensor or a wrong shape is found before the model changes; saving builds the whole file the same
 * way and writes it atomically. */
#define _POSIX_C_SOURCE 200809L /* mkdir, fileno, fsync */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "apex/gpt_hf.h"
#include "apex/model_io.h"
#include "apex/safetensors.h"
#include "core/internal.h"

/* ---- sizes ------------------------------------------------------------------------------------- */

static int is_2d(const apex_tensor *t) { return apex_tensor_ndim(t) == 2; }

/* The file's sizes (n_head 0). */
static apex_status sizes_of(const apex_safetensors *st, const char *path, apex_gpt_options *o) {
  if (!apex_safetensors_has(st, "transformer.wte.weight")) {
    if (apex_safetensors_has(st, "wte.weight"))
      return apex__fail(APEX_ERR_INVALID_ARG, "%s is in apex's own layout (wte.weight), not Hugging Face's (transformer.wte.weight): load it with apex_model_load_f32", path);
    return apex__fail(APEX_ERR_INVALID_ARG, "%s is not a Hugging Face GPT-2 file: it has no transformer.wte.weight (nor apex's wte.weight)", path);
  }
  apex_tensor *wte = apex_safetensors_get(st, "transformer.wte.weight");
  apex_tensor *wpe = wte ? apex_safetensors_get(st, "transformer.wpe.weight") : NULL;
  apex_status s = APEX_OK;
  if (!wte || !wpe) {
    s = apex__fail(APEX_ERR_INVALID_ARG, "%s has transformer.wte.weight but no transformer.wpe.weight: not a whole GPT-2", path);
  } else if (!is_2d(wte) || !is_2d(wpe) || apex_tensor_dim(wte, 1) != apex_tensor_dim(wpe, 1)) {
    char a[64], b[64];
    apex_tensor_shape_str(wte, a, sizeof a);
    apex_tensor_shape_str(wpe, b, sizeof b);
    s = apex__fail(APEX_ERR_SHAPE, "%s: transformer.wte.weight %s and transformer.wpe.weight %s must be [vocab, n_embd] and [n_positions, n_embd]", path, a, b);
  } else {
    *o = (apex_gpt_options){.vocab = apex_tensor_dim(wte, 0), .n_embd = apex_tensor_dim(wte, 1), .n_positions = apex_tensor_dim(wpe, 0)};
    char name[96];
    for (;; o->n_layer++) {
      snprintf(name, sizeof name, "transformer.h.%lld.ln_1.weight", (long long)o->n_layer);
      if (!apex_safetensors_has(st, name)) break;
    }
    if (o->n_layer == 0) s = apex__fail(APEX_ERR_INVALID_ARG, "%s has no transformer.h.0 block (transformer.h.0.ln_1.weight): not a whole GPT-2", path);
  }
  apex_tensor_destroy(wte);
  apex_tensor_destroy(wpe);
  return s;
}

apex_status apex_gpt_hf_sizes(const char *path, apex_gpt_options *out) {
  if (!path || !out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_hf_sizes: NULL %s", path ? "out" : "path");
  apex_safetensors *st = apex_safetensors_open(path);
  if (!st) return access(path, R_OK) == 0 ? APEX_ERR_CORRUPT : APEX_ERR_IO; /* the message says which */
  apex_status s = sizes_of(st, path, out);
  apex_safetensors_close(st);
  return s;
}

/* ---- the name table ----------------------------------------------------------------------------- */

/* One apex parameter of block N (or a global one when block < 0): it is columns [c0, c0 + n) of the
 * file's tensor, transposed (a Conv1D weight), or elements [c0, c0 + n) of a 1-d one, or the tensor
 * itself (n == 0). */
typedef struct {
  const char *apex, *hf;
  int transpose;
  int part; /* c_attn: 0, 1, 2 for q, k, v; -1 otherwise */
} hf_entry;

static const hf_entry block_entries[] = {
    {"ln1.weight", "ln_1.weight", 0, -1},          {"ln1.bias", "ln_1.bias", 0, -1},
    {"attn.q.weight", "attn.c_attn.weight", 1, 0}, {"attn.q.bias", "attn.c_attn.bias", 0, 0},
    {"attn.k.weight", "attn.c_attn.weight", 1, 1}, {"attn.k.bias", "attn.c_attn.bias", 0, 1},
    {"attn.v.weight", "attn.c_attn.weight", 1, 2}, {"attn.v.bias", "attn.c_attn.bias", 0, 2},
    {"attn.proj.weight", "attn.c_proj.weight", 1, -1}, {"attn.proj.bias", "attn.c_proj.bias", 0, -1},
    {"ln2.weight", "ln_2.weight", 0, -1},          {"ln2.bias", "ln_2.bias", 0, -1},
    {"fc.weight", "mlp.c_fc.weight", 1, -1},       {"fc.bias", "mlp.c_fc.bias", 0, -1},
    {"proj.weight", "mlp.c_proj.weight", 1, -1},   {"proj.bias", "mlp.c_proj.bias", 0, -1},
};
#define N_BLOCK_ENTRIES ((int)(sizeof block_entries / sizeof block_entries[0]))

/* The shape of the Hugging Face tensor that entry e of a model of width C comes from. */
static int hf_shape(const hf_entry *e, int64_t C, int64_t shape[2]) {
  const char *h = e->hf;
  int64_t out = !strncmp(h, "attn.c_attn", 11) ? 3 * C : !strncmp(h, "mlp.c_fc", 8) ? 4 * C : C;
  int64_t in = !strncmp(h, "mlp.c_proj", 10) ? 4 * C : C;
  if (strstr(h, ".weight") && strncmp(h, "ln_", 3)) {
    shape[0] = in, shape[1] = out; /* Conv1D: [in, out] */
    return 2;
  }
  shape[0] = out;
  return 1;
}

/* ---- loading ------------------------------------------------------------------------------------ */

/* The file's tensor `name` in f32 on the host, checked against shape; NULL with the reason. */
static apex_tensor *get_f32(const apex_safetensors *st, const char *path, const char *name, int ndim, const int64_t *shape) {
  if (!apex_safetensors_has(st, name))
    return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_load_hf: %s has no tensor %s; the model was not changed", path, name);
  apex_tensor *t = apex_safetensors_get(st, name);
  if (!t) return NULL;
  int same = apex_tensor_ndim(t) == ndim;
  for (int d = 0; same && d < ndim; d++) same = apex_tensor_dim(t, d) == shape[d];
  if (!same) {
    char have[64], want[64];
    apex_tensor_shape_str(t, have, sizeof have);
    snprintf(want, sizeof want, ndim == 2 ? "[%lld, %lld]" : "[%lld]", (long long)shape[0], (long long)(ndim == 2 ? shape[1] : 0));
    apex_tensor_destroy(t);
    return apex__fail_null(APEX_ERR_SHAPE, "apex_gpt_load_hf: %s in %s has shape %s, expected %s; the model was not changed", name, path, have, want);
  }
  if (apex_tensor_dtype(t) == APEX_F32) return t;
  apex_tensor *f = apex_tensor_to(t, APEX_F32);
  apex_tensor_destroy(t);
  return f;
}

/* The apex tensor dst_shape taken from the file's src per entry e (part of c_attn, transposed). */
static apex_tensor *convert(const apex_tensor *src, const hf_entry *e, int64_t C) {
  const float *s = apex_tensor_data((apex_tensor *)src);
  int64_t c0 = e->part >= 0 ? e->part * C : 0;
  if (apex_tensor_ndim(src) == 1) {
    int64_t n = e->part >= 0 ? C : apex_tensor_dim(src, 0);
    apex_tensor *t = apex_tensor_create(APEX_F32, 1, &n);
    if (t) memcpy(apex_tensor_data(t), s + c0, (size_t)n * sizeof *s);
    return t;
  }
  int64_t rows = apex_tensor_dim(src, 0), cols = apex_tensor_dim(src, 1), n = e->part >= 0 ? C : cols;
  int64_t shape[2] = {n, rows};
  apex_tensor *t = apex_tensor_create(APEX_F32, 2, shape);
  if (!t) return NULL;
  float *d = apex_tensor_data(t);
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < rows; i++) d[j * rows + i] = s[i * cols + c0 + j];
  return t;
}

typedef struct {
  int n, cap;
  char (*names)[APEX_NAME_MAX];
  apex_tensor **t;
} named_list;

static void list_free(named_list *l) {
  for (int i = 0; i < l->n; i++) apex_tensor_destroy(l->t[i]);
  free(l->names);
  free(l->t);
}

static apex_status list_add(named_list *l, const char *name, apex_tensor *t) {
  if (!t) return apex_last_status() != APEX_OK ? apex_last_status() : APEX_ERR_OUT_OF_MEMORY;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    void *a = realloc(l->names, (size_t)cap * sizeof *l->names), *b = a ? realloc(l->t, (size_t)cap * sizeof *l->t) : NULL;
    if (a) l->names = a;
    if (b) l->t = b;
    if (!a || !b) {
      apex_tensor_destroy(t);
      return apex__fail(APEX_ERR_OUT_OF_MEMORY, "gpt_hf: out of memory");
    }
    l->cap = cap;
  }
  snprintf(l->names[l->n], APEX_NAME_MAX, "%s", name);
  l->t[l->n++] = t;
  return APEX_OK;
}

/* The first rows of a [R, C] f32 tensor. */
static apex_tensor *first_rows(const apex_tensor *t, int64_t rows) {
  int64_t shape[2] = {rows, apex_tensor_dim(t, 1)};
  apex_tensor *r = apex_tensor_create(APEX_F32, 2, shape);
  if (r) memcpy(apex_tensor_data(r), apex_tensor_data((apex_tensor *)t), (size_t)(rows * shape[1]) * sizeof(float));
  return r;
}

/* Every apex tensor of the GPT of sizes o, from the file, into l. */
static apex_status read_all(const apex_safetensors *st, const char *path, const apex_gpt_options *o, named_list *l) {
  int64_t C = o->n_embd, wshape[2] = {o->vocab, C}, pshape[2] = {0, C};
  apex_tensor *wte = get_f32(st, path, "transformer.wte.weight", 2, wshape);
  apex_status s = list_add(l, "wte.weight", wte);
  if (s != APEX_OK) return s;
  if (apex_safetensors_has(st, "lm_head.weight")) {
    apex_tensor *head = get_f32(st, path, "lm_head.weight", 2, wshape);
    if (!head) return apex_last_status();
    int tied = !memcmp(apex_tensor_data(head), apex_tensor_data(wte), apex_tensor_numel(wte) * sizeof(float));
    apex_tensor_destroy(head);
    if (!tied)
      return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_load_hf: %s has an lm_head.weight that is not transformer.wte.weight; apex's GPT ties its head to the token embedding; the model was not changed", path);
  }
  apex_tensor *wpe_file = apex_safetensors_get(st, "transformer.wpe.weight");
  if (!wpe_file) return apex_last_status();
  pshape[0] = apex_tensor_dim(wpe_file, 0);
  apex_tensor_destroy(wpe_file);
  apex_tensor *wpe = get_f32(st, path, "transformer.wpe.weight", 2, pshape);
  if (!wpe) return apex_last_status();
  apex_tensor *wpe_rows = first_rows(wpe, o->n_positions);
  apex_tensor_destroy(wpe);
  if ((s = list_add(l, "wpe.weight", wpe_rows)) != APEX_OK) return s;
  for (int64_t b = 0; b < o->n_layer; b++) {
    apex_tensor *src = NULL;
    const char *src_of = NULL;
    for (int k = 0; k < N_BLOCK_ENTRIES && s == APEX_OK; k++) {
      const hf_entry *e = &block_entries[k];
      if (!src_of || strcmp(src_of, e->hf)) { /* q, k, v share c_attn: read it once */
        apex_tensor_destroy(src);
        char hf[APEX_NAME_MAX];
        int64_t shape[2];
        int nd = hf_shape(e, C, shape);
        snprintf(hf, sizeof hf, "transformer.h.%lld.%s", (long long)b, e->hf);
        src = get_f32(st, path, hf, nd, shape);
        src_of = e->hf;
        if (!src) {
          s = apex_last_status();
          break;
        }
      }
      char name[APEX_NAME_MAX];
      snprintf(name, sizeof name, "h%lld.%s", (long long)b, e->apex);
      s = list_add(l, name, convert(src, e, C));
    }
    apex_tensor_destroy(src);
    if (s != APEX_OK) return s;
  }
  int64_t cshape[1] = {C};
  if ((s = list_add(l, "ln_f.weight", get_f32(st, path, "transformer.ln_f.weight", 1, cshape))) != APEX_OK) return s;
  return list_add(l, "ln_f.bias", get_f32(st, path, "transformer.ln_f.bias", 1, cshape));
}

apex_status apex_gpt_load_hf(apex_model *m, apex_module *gpt, apex_amp *amp, const char *path) {
  if (!m || !gpt || !path) return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_load_hf: NULL %s", !m ? "model" : !gpt ? "gpt" : "path");
  apex_gpt_options have, want;
  if (apex_gpt_sizes(gpt, &want) != APEX_OK) return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_load_hf: not a GPT (apex_gpt_create makes one)");
  apex_safetensors *st = apex_safetensors_open(path);
  if (!st) return access(path, R_OK) == 0 ? APEX_ERR_CORRUPT : APEX_ERR_IO; /* the message says which */
  apex_status s = sizes_of(st, path, &have);
  if (s == APEX_OK && (have.vocab != want.vocab || have.n_embd != want.n_embd || have.n_layer != want.n_layer || have.n_positions < want.n_positions))
    s = apex__fail(APEX_ERR_SHAPE, "apex_gpt_load_hf: %s holds vocab %lld, n_embd %lld, n_layer %lld, n_positions %lld; the model has %lld, %lld, %lld, %lld (n_positions at most the file's); the model was not changed",
                   path, (long long)have.vocab, (long long)have.n_embd, (long long)have.n_layer, (long long)have.n_positions, (long long)want.vocab,
                   (long long)want.n_embd, (long long)want.n_layer, (long long)want.n_positions);
  named_list l = {0};
  if (s == APEX_OK) s = read_all(st, path, &want, &l);
  apex_safetensors_close(st);
  /* Every parameter found and shaped as the model's before any is written. */
  apex_var **dst = s == APEX_OK ? calloc((size_t)l.n + 1, sizeof *dst) : NULL;
  if (s == APEX_OK && !dst) s = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_load_hf: out of memory");
  for (int i = 0; s == APEX_OK && i < l.n; i++) {
    dst[i] = apex_model_find_param(m, l.names[i]);
    const apex_tensor *v = dst[i] ? apex_var_value(dst[i]) : NULL;
    int same = v && apex_tensor_ndim(v) == apex_tensor_ndim(l.t[i]);
    for (int d = 0; same && d < apex_tensor_ndim(v); d++) same = apex_tensor_dim(v, d) == apex_tensor_dim(l.t[i], d);
    if (!same) s = apex__fail(APEX_ERR_SHAPE, "apex_gpt_load_hf: the model's %s is missing or of another shape than the file's; was gpt made in m?", l.names[i]);
  }
  for (int i = 0; s == APEX_OK && i < l.n; i++) {
    apex_tensor *master = apex_amp_master_of(amp, dst[i]);
    if (master) s = apex_tensor_copy(master, l.t[i]);
    if (s == APEX_OK) s = apex_tensor_copy(apex_var_value(dst[i]), l.t[i]);
  }
  free(dst);
  list_free(&l);
  return s;
}

/* ---- saving ------------------------------------------------------------------------------------- */

/* The parameter's f32 values on the host (amp's master where it keeps one); owned by the caller. */
static apex_tensor *host_f32(const apex_model *m, const apex_amp *amp, const char *name) {
  apex_var *p = apex_model_find_param(m, name);
  if (!p) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_gpt_save_hf: the model has no %s; was gpt made in m?", name);
  apex_tensor *master = apex_amp_master_of(amp, p), *t = master ? master : apex_var_value(p);
  apex_tensor *h = apex_tensor_create(APEX_F32, apex_tensor_ndim(t), apex_tensor_shape(t));
  if (h && apex_tensor_copy(h, t) != APEX_OK) {
    apex_tensor_destroy(h);
    return NULL;
  }
  return h;
}

/* dst (Hugging Face's tensor of entry e) gets the apex tensor src at its place: the inverse of convert. */
static void place(apex_tensor *dst, const apex_tensor *src, const hf_entry *e, int64_t C) {
  float *d = apex_tensor_data(dst);
  const float *s = apex_tensor_data((apex_tensor *)src);
  int64_t c0 = e->part >= 0 ? e->part * C : 0;
  if (apex_tensor_ndim(dst) == 1) {
    memcpy(d + c0, s, apex_tensor_numel(src) * sizeof *s);
    return;
  }
  int64_t rows = apex_tensor_dim(dst, 0), cols = apex_tensor_dim(dst, 1), n = apex_tensor_dim(src, 0);
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < rows; i++) d[i * cols + c0 + j] = s[j * rows + i];
}

/* Writes text to path atomically (a temporary beside it, renamed over it). */
static apex_status write_text(const char *path, const char *text) {
  size_t n = strlen(path) + 16;
  char *tmp = malloc(n);
  if (!tmp) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_save_hf: out of memory");
  snprintf(tmp, n, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int ok = f && fputs(text, f) >= 0;
  ok = f && fflush(f) == 0 && ok;
  int err = errno;
  if (f && fclose(f) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  if (!ok) remove(tmp);
  free(tmp);
  return ok ? APEX_OK : apex__fail(APEX_ERR_IO, "apex_gpt_save_hf: cannot write %s: %s", path, strerror(err));
}

apex_status apex_gpt_save_hf(const apex_model *m, const apex_module *gpt, const apex_amp *amp, const char *dir) {
  if (!m || !gpt || !dir) return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_save_hf: NULL %s", !m ? "model" : !gpt ? "gpt" : "dir");
  apex_gpt_options o;
  if (apex_gpt_sizes(gpt, &o) != APEX_OK) return apex__fail(APEX_ERR_INVALID_ARG, "apex_gpt_save_hf: not a GPT (apex_gpt_create makes one)");
  struct stat sb;
  if (mkdir(dir, 0777) != 0 && !(errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)))
    return apex__fail(APEX_ERR_IO, "apex_gpt_save_hf: cannot make the directory %s: %s", dir, errno == EEXIST ? "a file of that name exists" : strerror(errno));
  int64_t C = o.n_embd;
  named_list l = {0};
  apex_status s = list_add(&l, "transformer.wte.weight", host_f32(m, amp, "wte.weight"));
  if (s == APEX_OK) s = list_add(&l, "transformer.wpe.weight", host_f32(m, amp, "wpe.weight"));
  for (int64_t b = 0; s == APEX_OK && b < o.n_layer; b++) {
    for (int k = 0; s == APEX_OK && k < N_BLOCK_ENTRIES; k++) {
      const hf_entry *e = &block_entries[k];
      char hf[APEX_NAME_MAX], name[APEX_NAME_MAX];
      snprintf(hf, sizeof hf, "transformer.h.%lld.%s", (long long)b, e->hf);
      snprintf(name, sizeof name, "h%lld.%s", (long long)b, e->apex);
      if (e->part <= 0) { /* a new file tensor (q's part opens c_attn's) */
        int64_t shape[2];
        int nd = hf_shape(e, C, shape);
        s = list_add(&l, hf, apex_tensor_create(APEX_F32, nd, shape));
        if (s != APEX_OK) break;
      }
      /* q, k and v go into the c_attn tensor of their kind (weight or bias) added last */
      apex_tensor *dst = l.t[l.n - 1];
      if (e->part > 0)
        for (int i = l.n - 1; i >= 0; i--)
          if (!strcmp(l.names[i], hf)) {
            dst = l.t[i];
            break;
          }
      apex_tensor *src = host_f32(m, amp, name);
      if (!src) {
        s = apex_last_status();
        break;
      }
      place(dst, src, e, C);
      apex_tensor_destroy(src);
    }
  }
  if (s == APEX_OK) s = list_add(&l, "transformer.ln_f.weight", host_f32(m, amp, "ln_f.weight"));
  if (s == APEX_OK) s = list_add(&l, "transformer.ln_f.bias", host_f32(m, amp, "ln_f.bias"));
  size_t plen = strlen(dir) + 32;
  char *path = malloc(plen);
  const char **names = calloc((size_t)l.n + 1, sizeof *names);
  if (s == APEX_OK && (!path || !names)) s = apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_gpt_save_hf: out of memory");
  if (s == APEX_OK) {
    for (int i = 0; i < l.n; i++) names[i] = l.names[i];
    /* Transformers refuses a safetensors file whose format is not one of its frameworks'. */
    const char *key = "format", *value = "pt";
    snprintf(path, plen, "%s/model.safetensors", dir);
    s = apex_safetensors_save(path, names, l.t, l.n, &key, &value, 1);
  }
  if (s == APEX_OK) {
    char cfg[1400];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n"
             "  \"n_ctx\": %lld,\n  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  \"n_inner\": null,\n"
             "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n"
             "  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
             "  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
             (long long)o.vocab, (long long)o.n_positions, (long long)o.n_positions, (long long)o.n_embd, (long long)o.n_layer, (long long)o.n_head);
    snprintf(path, plen, "%s/config.json", dir);
    s = write_text(path, cfg);
  }
  free(names);
  free(path);
  list_free(&l);
  return s;
}
