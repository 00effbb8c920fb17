/* safetensors.c: the safetensors reader (validating every field, since checkpoints come from disk and
 * may be truncated or corrupted) and the atomic writer. Format and guarantees: safetensors.h.
 * The reader is strict where the format is (json_strict.h says what cJSON alone would let through)
 * and n log n in the tensor count: names are checked for duplicates and looked up through a sorted
 * index, and offsets are checked in sorted order, where comparing names pairwise cost seconds at
 * 80,000 tensors.
 * Multi-byte values are little-endian in the file; apex assumes a little-endian host (x86-64,
 * AArch64), as its raw tensor data is written as it lies in memory. */
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "apex/safetensors.h"
#include "core/internal.h"
#include "io/json_strict.h"

typedef struct {
  char *name;
  apex_dtype dtype;
  int ndim;
  int64_t shape[APEX_MAX_DIMS];
  uint64_t begin, end; /* byte offsets into data */
} st_entry;

struct apex_safetensors {
  st_entry *entries; /* in file order */
  st_entry **by_name; /* the same, sorted by name (strcmp), for lookups */
  int count;
  char **meta_keys, **meta_values;
  int n_meta;
  uint8_t *data;
  size_t data_len;
};

static const char *dtype_tag(apex_dtype d) { return d == APEX_F16 ? "F16" : d == APEX_BF16 ? "BF16" : "F32"; }

static int parse_dtype_tag(const char *s, apex_dtype *out) {
  if (strcmp(s, "F32") == 0) *out = APEX_F32;
  else if (strcmp(s, "F16") == 0) *out = APEX_F16;
  else if (strcmp(s, "BF16") == 0) *out = APEX_BF16;
  else return 0;
  return 1;
}

void apex_safetensors_close(apex_safetensors *st) {
  if (!st) return;
  for (int i = 0; i < st->count; i++) free(st->entries[i].name);
  for (int i = 0; i < st->n_meta; i++) {
    free(st->meta_keys[i]);
    free(st->meta_values[i]);
  }
  free(st->entries);
  free(st->by_name);
  free(st->meta_keys);
  free(st->meta_values);
  free(st->data);
  free(st);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Sorts names[0, n) and returns a name that occurs twice in it, or NULL. */
static const char *find_duplicate(const char **names, size_t n) {
  qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) return names[i];
  return NULL;
}

/* ---- reading ---------------------------------------------------------------------------------- */

/* Sets *dup to a key that occurs twice in the JSON object, else NULL. cJSON keeps every copy of a
 * repeated key and its lookups return the first, where Python's json and serde_json keep the last or
 * refuse: a file with one is read differently by different readers, so apex refuses it. */
static apex_status duplicate_key(const cJSON *obj, const char **dup) {
  *dup = NULL;
  size_t n = 0;
  const cJSON *kv;
  cJSON_ArrayForEach(kv, obj) n++;
  const char **keys = malloc((n + 1) * sizeof *keys);
  if (!keys) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  n = 0;
  cJSON_ArrayForEach(kv, obj) keys[n++] = kv->string ? kv->string : "";
  *dup = find_duplicate(keys, n);
  free(keys);
  return APEX_OK;
}

/* A JSON number that is a whole number in [0, 2^53] (exactly representable, as offsets and sizes
 * must be). */
static int json_uint(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!(d >= 0) || d > 9007199254740992.0 || d != floor(d)) return 0;
  *out = (uint64_t)d;
  return 1;
}

static apex_status parse_entry(const cJSON *item, st_entry *e) {
  const char *name = item->string, *dup;
  if (!cJSON_IsObject(item)) return apex__fail(APEX_ERR_CORRUPT, "safetensors: entry '%s' is not an object", name);
  apex_status status = duplicate_key(item, &dup);
  if (status != APEX_OK) return status;
  if (dup) return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' has the key '%s' twice", name, dup);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dtype)) return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' has no dtype string", name);
  if (!parse_dtype_tag(dtype->valuestring, &e->dtype))
    return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' has dtype %s; apex reads F32, F16 and BF16", name, dtype->valuestring);
  if (!cJSON_IsArray(shape)) return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' has no shape array", name);
  int nd = cJSON_GetArraySize(shape);
  if (nd > APEX_MAX_DIMS)
    return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' has %d dimensions; apex tensors have at most %d", name, nd, APEX_MAX_DIMS);
  e->ndim = nd;
  uint64_t numel = 1;
  for (int d = 0; d < nd; d++) {
    uint64_t s;
    if (!json_uint(cJSON_GetArrayItem(shape, d), &s))
      return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s': dimension %d is not a non-negative integer", name, d);
    if (s != 0 && numel > (UINT64_MAX / 8) / s)
      return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s': the shape's size overflows", name);
    e->shape[d] = (int64_t)s;
    numel *= s;
  }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(cJSON_GetArrayItem(offs, 0), &e->begin) ||
      !json_uint(cJSON_GetArrayItem(offs, 1), &e->end))
    return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s': data_offsets must be [begin, end] integers", name);
  if (e->end < e->begin || e->end - e->begin != numel * apex_dtype_size(e->dtype))
    return apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s': data_offsets [%llu, %llu] do not hold %llu %s elements", name,
                      (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)numel, dtype->valuestring);
  e->name = strdup(name);
  return e->name ? APEX_OK : apex__fail(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
}

static apex_status parse_metadata(const cJSON *meta, apex_safetensors *st) {
  if (!cJSON_IsObject(meta)) return apex__fail(APEX_ERR_CORRUPT, "safetensors: __metadata__ is not an object");
  const char *dup;
  apex_status status = duplicate_key(meta, &dup);
  if (status != APEX_OK) return status;
  if (dup) return apex__fail(APEX_ERR_CORRUPT, "safetensors: __metadata__ has the key '%s' twice", dup);
  int n = cJSON_GetArraySize(meta);
  st->meta_keys = calloc((size_t)n + 1, sizeof(char *));
  st->meta_values = calloc((size_t)n + 1, sizeof(char *));
  if (!st->meta_keys || !st->meta_values) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  const cJSON *kv;
  cJSON_ArrayForEach(kv, meta) {
    if (!cJSON_IsString(kv)) return apex__fail(APEX_ERR_CORRUPT, "safetensors: metadata '%s' is not a string", kv->string);
    st->meta_keys[st->n_meta] = strdup(kv->string);
    st->meta_values[st->n_meta] = strdup(kv->valuestring);
    st->n_meta++;
    if (!st->meta_keys[st->n_meta - 1] || !st->meta_values[st->n_meta - 1])
      return apex__fail(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  }
  return APEX_OK;
}

static int by_offset(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(st_entry *const *)a)->name, (*(st_entry *const *)b)->name);
}

/* The header text as the format's reference implementation reads it: starting with '{', strict JSON
 * (json_strict.h), then cJSON for the structure. Returns the parsed object or NULL with a message. */
static cJSON *parse_header_json(const char *json, size_t len) {
  if (len == 0) return apex__fail_null(APEX_ERR_CORRUPT, "safetensors: the header is empty; the file is not safetensors");
  if (json[0] != '{')
    return apex__fail_null(APEX_ERR_CORRUPT, "safetensors: the header does not start with '{' (its first byte is 0x%02x); the file is not safetensors or is corrupted",
                           (unsigned)(unsigned char)json[0]);
  size_t end;
  apex__json_flaw flaw = apex__json_strict_check(json, len, &end);
  if (flaw.what)
    return apex__fail_null(APEX_ERR_CORRUPT, "safetensors: the header %s (byte %zu of %zu); the file is corrupted or not written to the format",
                           flaw.what, flaw.at, len);
  const char *stop = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, end, &stop, 0);
  if (!root)
    return apex__fail_null(APEX_ERR_CORRUPT, "safetensors: the header is not valid JSON (error near byte %zu of %zu)",
                           stop && stop >= json ? (size_t)(stop - json) : (size_t)0, len);
  return root;
}

static apex_status parse_header(const char *json, size_t len, size_t data_len, apex_safetensors *st) {
  cJSON *root = parse_header_json(json, len);
  if (!root) return apex_last_status();
  apex_status status = APEX_OK;
  const char *dup; /* root is an object: the text starts with '{' and cJSON parsed exactly one value */
  if ((status = duplicate_key(root, &dup)) != APEX_OK) goto done;
  if (dup) {
    status = strcmp(dup, "__metadata__") == 0 ? apex__fail(APEX_ERR_CORRUPT, "safetensors: two __metadata__ entries")
                                              : apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' appears twice", dup);
    goto done;
  }
  int n = cJSON_GetArraySize(root);
  st->entries = calloc((size_t)n + 1, sizeof *st->entries);
  st->by_name = malloc(((size_t)n + 1) * sizeof *st->by_name);
  if (!st->entries || !st->by_name) {
    status = apex__fail(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    goto done;
  }
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    if (strcmp(item->string, "__metadata__") == 0) status = parse_metadata(item, st);
    else {
      status = parse_entry(item, &st->entries[st->count]);
      if (status == APEX_OK) st->count++;
    }
    if (status != APEX_OK) goto done;
  }
  for (int i = 0; i < st->count; i++) st->by_name[i] = &st->entries[i];
  qsort(st->by_name, (size_t)st->count, sizeof *st->by_name, by_name);
  /* The data must be covered exactly: sorted by offset, each tensor starts where the last ended. */
  st_entry *sorted = malloc(((size_t)st->count + 1) * sizeof *sorted);
  if (!sorted) {
    status = apex__fail(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    goto done;
  }
  memcpy(sorted, st->entries, (size_t)st->count * sizeof *sorted);
  qsort(sorted, (size_t)st->count, sizeof *sorted, by_offset);
  uint64_t at = 0;
  for (int i = 0; i < st->count && status == APEX_OK; i++) {
    if (sorted[i].begin != at)
      status = apex__fail(APEX_ERR_CORRUPT, "safetensors: tensor '%s' starts at byte %llu of the data, expected %llu (overlap or hole)",
                          sorted[i].name, (unsigned long long)sorted[i].begin, (unsigned long long)at);
    at = sorted[i].end;
  }
  if (status == APEX_OK && at != data_len)
    status = apex__fail(APEX_ERR_CORRUPT, "safetensors: the tensors cover %llu bytes of data but the file holds %zu (truncated or padded)",
                        (unsigned long long)at, data_len);
  free(sorted);
done:
  cJSON_Delete(root);
  return status;
}

apex_safetensors *apex_safetensors_parse(const uint8_t *buf, size_t len) {
  if (!buf && len) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_safetensors_parse: NULL buffer");
  if (len < 8) return apex__fail_null(APEX_ERR_CORRUPT, "safetensors: %zu bytes is too short for the 8-byte header length", len);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= (uint64_t)buf[i] << (8 * i);
  if (n > APEX_SAFETENSORS_MAX_HEADER || n > len - 8)
    return apex__fail_null(APEX_ERR_CORRUPT, "safetensors: header length %llu does not fit a %zu-byte file (truncated or not safetensors)",
                           (unsigned long long)n, len);
  apex_safetensors *st = calloc(1, sizeof *st);
  if (!st) return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  st->data_len = len - 8 - (size_t)n;
  if (parse_header((const char *)buf + 8, (size_t)n, st->data_len, st) != APEX_OK) {
    apex_safetensors_close(st);
    return NULL;
  }
  st->data = malloc(st->data_len ? st->data_len : 1);
  if (!st->data) {
    apex_safetensors_close(st);
    return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "safetensors: cannot allocate %zu bytes of data", len);
  }
  memcpy(st->data, buf + 8 + n, st->data_len);
  return st;
}

apex_safetensors *apex_safetensors_open(const char *path) {
  if (!path) return apex__fail_null(APEX_ERR_INVALID_ARG, "apex_safetensors_open: NULL path");
  FILE *f = fopen(path, "rb");
  if (!f) return apex__fail_null(APEX_ERR_IO, "cannot open checkpoint file %s: %s", path, strerror(errno));
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : (size_t)1 << 16;
      uint8_t *grown = realloc(buf, cap);
      if (!grown) {
        free(buf);
        fclose(f);
        return apex__fail_null(APEX_ERR_OUT_OF_MEMORY, "cannot read %s: out of memory", path);
      }
      buf = grown;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    return apex__fail_null(APEX_ERR_IO, "cannot read %s", path);
  }
  apex_safetensors *st = apex_safetensors_parse(buf, len);
  free(buf);
  if (!st) {
    char why[768];
    snprintf(why, sizeof why, "%s", apex_last_error());
    return apex__fail_null(apex_last_status(), "%s: %s", path, why);
  }
  return st;
}

int apex_safetensors_count(const apex_safetensors *st) {
  if (!st) apex__fail_null_arg(__func__, "safetensors");
  return st ? st->count : 0;
}

const char *apex_safetensors_name(const apex_safetensors *st, int i) {
  if (!st) apex__fail_null_arg(__func__, "safetensors");
  return st && i >= 0 && i < st->count ? st->entries[i].name : NULL;
}

static int name_vs_entry(const void *key, const void *elem) { return strcmp(key, (*(st_entry *const *)elem)->name); }

static const st_entry *find(const apex_safetensors *st, const char *name) {
  if (!st || !name) return NULL;
  st_entry *const *hit = bsearch(name, st->by_name, (size_t)st->count, sizeof *st->by_name, name_vs_entry);
  return hit ? *hit : NULL;
}

int apex_safetensors_has(const apex_safetensors *st, const char *name) { return find(st, name) != NULL; }

const char *apex_safetensors_metadata(const apex_safetensors *st, const char *key) {
  if (!st) apex__fail_null_arg(__func__, "safetensors");
  for (int i = 0; st && key && i < st->n_meta; i++)
    if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
  return NULL;
}

apex_tensor *apex_safetensors_get(const apex_safetensors *st, const char *name) {
  const st_entry *e = find(st, name);
  if (!e) return apex__fail_null(APEX_ERR_INVALID_ARG, "safetensors: no tensor named '%s'", name ? name : "(null)");
  apex_tensor *t = apex_tensor_create(e->dtype, e->ndim, e->shape);
  if (t) memcpy(apex_tensor_data(t), st->data + e->begin, e->end - e->begin);
  return t;
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t size) {
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int i = 0; i < ndim && used < size; i++) used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (used < size) snprintf(buf + used, size - used, "]");
}

apex_status apex_safetensors_read_into(const apex_safetensors *st, const char *name, apex_tensor *dst) {
  if (!dst) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_read_into: NULL destination for '%s'", name ? name : "(null)");
  const st_entry *e = find(st, name);
  if (!e) return apex__fail(APEX_ERR_INVALID_ARG, "safetensors: no tensor named '%s'", name ? name : "(null)");
  char fs[128], ds[128];
  shape_text(e->shape, e->ndim, fs, sizeof fs);
  apex_tensor_shape_str(dst, ds, sizeof ds);
  if (e->dtype != apex_tensor_dtype(dst))
    return apex__fail(APEX_ERR_DTYPE, "safetensors: tensor '%s' is %s %s in the file but %s %s here", name, apex_dtype_name(e->dtype), fs,
                      apex_dtype_name(apex_tensor_dtype(dst)), ds);
  int same = e->ndim == apex_tensor_ndim(dst);
  for (int i = 0; same && i < e->ndim; i++) same = e->shape[i] == apex_tensor_shape(dst)[i];
  if (!same) return apex__fail(APEX_ERR_SHAPE, "safetensors: tensor '%s' has shape %s in the file but %s here", name, fs, ds);
  if (apex_tensor_device(dst) == APEX_DEVICE_CPU) {
    memcpy(apex_tensor_data(dst), st->data + e->begin, e->end - e->begin);
    return APEX_OK;
  }
  /* a device tensor (a model made on a GPU) is filled through its device's copy, from a host staging copy */
  apex_tensor *h = apex_tensor_create(e->dtype, apex_tensor_ndim(dst), apex_tensor_shape(dst));
  if (!h) return apex_last_status();
  memcpy(apex_tensor_data(h), st->data + e->begin, e->end - e->begin);
  apex_status rc = apex_tensor_copy(dst, h);
  apex_tensor_destroy(h);
  return rc;
}

/* ---- writing ---------------------------------------------------------------------------------- */

static int valid_utf8(const char *s) {
  size_t n = strlen(s);
  return apex__utf8_invalid_at(s, n) == n;
}

static apex_status check_save_args(const char *const *names, apex_tensor *const *tensors, int n, const char *const *mk,
                                   const char *const *mv, int n_meta) {
  if (n < 0 || n_meta < 0) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: negative count");
  if ((n > 0 && (!names || !tensors)) || (n_meta > 0 && (!mk || !mv)))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: NULL name, tensor or metadata array");
  for (int i = 0; i < n; i++) {
    if (!names[i] || !names[i][0]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: tensor %d has no name", i);
    if (strncmp(names[i], "__", 2) == 0)
      return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: name '%s' starts with '__', which the format reserves", names[i]);
    if (!tensors[i]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: tensor '%s' is NULL", names[i]);
    if (!valid_utf8(names[i])) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: tensor name %d is not valid UTF-8", i);
  }
  for (int i = 0; i < n_meta; i++) {
    if (!mk[i] || !mv[i]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: metadata entry %d is NULL", i);
    if (!valid_utf8(mk[i]) || !valid_utf8(mv[i]))
      return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: metadata entry %d is not valid UTF-8", i);
  }
  /* The reader refuses repeated names and keys, so the writer never writes them. */
  int most = n > n_meta ? n : n_meta;
  const char **sorted = malloc(((size_t)most + 1) * sizeof *sorted), *dup;
  if (!sorted) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_safetensors_save: out of memory");
  if (n) memcpy(sorted, names, (size_t)n * sizeof *sorted);
  if ((dup = find_duplicate(sorted, (size_t)n)) != NULL) {
    apex_status st = apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: two tensors named '%s'", dup);
    free(sorted);
    return st;
  }
  if (n_meta) memcpy(sorted, mk, (size_t)n_meta * sizeof *sorted);
  if ((dup = find_duplicate(sorted, (size_t)n_meta)) != NULL) {
    apex_status st = apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: two metadata entries with the key '%s'", dup);
    free(sorted);
    return st;
  }
  free(sorted);
  return APEX_OK;
}

/* The JSON header, padded with spaces to a multiple of 8 bytes. Numbers are written as raw integer
 * text so that no size is ever printed in exponent form. */
static char *build_header(const char *const *names, apex_tensor *const *tensors, int n, const char *const *mk,
                          const char *const *mv, int n_meta, size_t *len) {
  cJSON *root = cJSON_CreateObject();
  char num[32];
  if (n_meta > 0) {
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(meta, mk[i], mv[i]);
  }
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(root, names[i]);
    cJSON_AddStringToObject(e, "dtype", dtype_tag(apex_tensor_dtype(tensors[i])));
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    for (int d = 0; d < apex_tensor_ndim(tensors[i]); d++) {
      snprintf(num, sizeof num, "%lld", (long long)apex_tensor_shape(tensors[i])[d]);
      cJSON_AddItemToArray(shape, cJSON_CreateRaw(num));
    }
    cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
    snprintf(num, sizeof num, "%llu", (unsigned long long)at);
    cJSON_AddItemToArray(offs, cJSON_CreateRaw(num));
    at += apex_tensor_nbytes(tensors[i]);
    snprintf(num, sizeof num, "%llu", (unsigned long long)at);
    cJSON_AddItemToArray(offs, cJSON_CreateRaw(num));
  }
  char *json = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!json) return NULL;
  size_t raw = strlen(json), padded = (raw + 7) / 8 * 8;
  char *out = malloc(padded + 1);
  if (out) {
    memcpy(out, json, raw);
    memset(out + raw, ' ', padded - raw);
    out[padded] = 0;
    *len = padded;
  }
  cJSON_free(json);
  return out;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Writes t's bytes to fd, a device tensor's (a model trained on a GPU) from a host copy made for it:
 * 0, 1 after a write error (errno says why), 2 when the copy failed (apex_last_error says why). */
static int write_tensor(int fd, const apex_tensor *t) {
  if (apex_tensor_device(t) == APEX_DEVICE_CPU) return write_all(fd, apex_tensor_data(t), apex_tensor_nbytes(t)) != 0;
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (!h || apex_tensor_copy(h, t) != APEX_OK) {
    apex_tensor_destroy(h);
    return 2;
  }
  int bad = write_all(fd, apex_tensor_data(h), apex_tensor_nbytes(h)) != 0, err = errno;
  apex_tensor_destroy(h);
  errno = err;
  return bad;
}

/* fsync the directory holding path, so the rename itself survives a crash. */
static void sync_parent_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) ? (int)(slash - path) : 1, path);
  int fd = open(dir, O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

apex_status apex_safetensors_save(const char *path, const char *const *names, apex_tensor *const *tensors, int n,
                                  const char *const *meta_keys, const char *const *meta_values, int n_meta) {
  if (!path || !path[0]) return apex__fail(APEX_ERR_INVALID_ARG, "apex_safetensors_save: no path");
  apex_status st = check_save_args(names, tensors, n, meta_keys, meta_values, n_meta);
  if (st != APEX_OK) return st;
  size_t hlen = 0;
  char *header = build_header(names, tensors, n, meta_keys, meta_values, n_meta, &hlen);
  if (!header) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_safetensors_save: out of memory building the header");
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) {
    free(header);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "apex_safetensors_save: out of memory");
  }
  snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    st = apex__fail(APEX_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    goto out;
  }
  uint8_t lenbuf[8];
  for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  int bad = fchmod(fd, 0644) != 0 || write_all(fd, lenbuf, 8) != 0 || write_all(fd, header, hlen) != 0;
  for (int i = 0; i < n && !bad; i++) {
    bad = write_tensor(fd, tensors[i]);
    if (bad == 2) { /* a failed copy from the device: its own error, not the OS's */
      close(fd);
      unlink(tmp);
      st = apex__fail(apex_last_status(), "apex_safetensors_save: cannot copy tensor '%s' to the host (the previous file, if any, is unchanged)",
                      names[i]);
      goto out;
    }
  }
  if (!bad) bad = fsync(fd) != 0;
  int saved_errno = errno;
  if (close(fd) != 0 && !bad) {
    bad = 1;
    saved_errno = errno;
  }
  if (!bad && rename(tmp, path) != 0) {
    bad = 1;
    saved_errno = errno;
  }
  if (bad) {
    unlink(tmp);
    st = apex__fail(APEX_ERR_IO, "cannot write %s: %s (the previous file, if any, is unchanged)", path, strerror(saved_errno));
    goto out;
  }
  sync_parent_dir(path);
out:
  free(tmp);
  free(header);
  return st;
}
