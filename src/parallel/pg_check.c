/* pg_check.c: do all ranks hold the same model? Data parallelism silently trains garbage (or hangs
 * in a collective of the wrong size) when one rank built a different model, so DDP checks at
 * construction. Each rank hashes the list of (name, dtype, shape) and the hashes are all-gathered:
 * one small message when all agree. On a mismatch the full descriptions are gathered so that every
 * rank can name the first parameter that differs, with the same message everywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/pg_internal.h"

#define FN "apex_pg_check_consistent"

typedef struct record {
  int64_t valid, n, bytes;
  uint64_t hash;
} record;

/* Appends "name\tdtype\tshape\n" for every parameter; tabs and newlines in names become '?'. */
static char *describe(const char *const *names, apex_tensor *const *tensors, int n, size_t *bytes) {
  size_t cap = 256, len = 0;
  char *s = malloc(cap);
  for (int i = 0; s && i < n; i++) {
    char name[128], shape[160], line[512];
    if (names) snprintf(name, sizeof name, "%s", names[i]);
    else snprintf(name, sizeof name, "parameter %d", i);
    for (char *c = name; *c; c++)
      if (*c == '\t' || *c == '\n') *c = '?';
    apex_tensor_shape_str(tensors[i], shape, sizeof shape);
    int m = snprintf(line, sizeof line, "%s\t%s\t%s\n", name, apex_dtype_name(apex_tensor_dtype(tensors[i])), shape);
    if (len + (size_t)m + 1 > cap) {
      cap = 2 * (len + (size_t)m + 1);
      char *t = realloc(s, cap);
      if (!t) free(s);
      s = t;
      if (!s) break;
    }
    memcpy(s + len, line, (size_t)m);
    len += (size_t)m;
  }
  if (s) s[len] = '\0';
  *bytes = len;
  return s;
}

/* Field f (0 name, 1 dtype, 2 shape) of a description line, copied into out. */
static void field(const char *line, int f, char *out, size_t size) {
  for (int k = 0; k < f; k++) line = strchr(line, '\t') + 1;
  size_t len = strcspn(line, "\t\n");
  if (len >= size) len = size - 1;
  memcpy(out, line, len);
  out[len] = '\0';
}

/* Line i of blob (lines end in '\n'); NULL past the end. */
static const char *line_at(const char *blob, int64_t i) {
  for (int64_t k = 0; k < i && blob; k++) {
    blob = strchr(blob, '\n');
    if (blob) blob++;
  }
  return blob && *blob ? blob : NULL;
}

static int same_line(const char *a, const char *b) {
  size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
  return la == lb && memcmp(a, b, la) == 0;
}

/* Names the first difference between rank 0 and the other ranks. */
static apex_status explain(const record *rec, const char *blobs, size_t stride, int world) {
  int64_t common = rec[0].n;
  for (int r = 1; r < world; r++)
    if (rec[r].n < common) common = rec[r].n;
  for (int64_t i = 0; i < common; i++) {
    const char *a = line_at(blobs, i);
    for (int r = 1; r < world; r++) {
      const char *b = line_at(blobs + (size_t)r * stride, i);
      if (same_line(a, b)) continue;
      char fa[160], fb[160], name[128];
      field(a, 0, name, sizeof name);
      field(a, 0, fa, sizeof fa);
      field(b, 0, fb, sizeof fb);
      if (strcmp(fa, fb))
        return apex__fail(APEX_ERR_INVALID_ARG, FN ": models differ across ranks: parameter %lld is named '%s' on rank 0 but '%s' on rank %d",
                          (long long)i, fa, fb, r);
      field(a, 1, fa, sizeof fa);
      field(b, 1, fb, sizeof fb);
      if (strcmp(fa, fb))
        return apex__fail(APEX_ERR_DTYPE, FN ": models differ across ranks: parameter %lld ('%s') is %s on rank 0 but %s on rank %d",
                          (long long)i, name, fa, fb, r);
      field(a, 2, fa, sizeof fa);
      field(b, 2, fb, sizeof fb);
      return apex__fail(APEX_ERR_SHAPE, FN ": models differ across ranks: parameter %lld ('%s') has shape %s on rank 0 but %s on rank %d",
                        (long long)i, name, fa, fb, r);
    }
  }
  for (int r = 1; r < world; r++) {
    if (rec[r].n == rec[0].n) continue;
    int longer = rec[r].n > rec[0].n ? r : 0;
    char name[128];
    field(line_at(blobs + (size_t)longer * stride, common), 0, name, sizeof name);
    return apex__fail(APEX_ERR_INVALID_ARG,
                      FN ": models differ across ranks: rank 0 has %lld parameters but rank %d has %lld; parameter %lld ('%s') is only on rank %d",
                      (long long)rec[0].n, r, (long long)rec[r].n, (long long)common, name, longer);
  }
  return apex__fail(APEX_ERR_INVALID_ARG, FN ": models differ across ranks (the descriptions hash differently)");
}

apex_status apex_pg_check_consistent(apex_pg *pg, const char *const *names, apex_tensor *const *tensors, int n) {
  if (!pg) return apex__fail(APEX_ERR_INVALID_ARG, FN ": pg is NULL");
  /* A bad argument here still takes part in the exchange, so the other ranks are told, not left waiting. */
  apex_status local = APEX_OK;
  char local_msg[APEX_PG_MESSAGE] = "";
  if (n < 0) local = apex__fail(APEX_ERR_INVALID_ARG, FN ": negative parameter count %d", n);
  else if (n > 0 && !tensors) local = apex__fail(APEX_ERR_INVALID_ARG, FN ": tensors is NULL");
  for (int i = 0; local == APEX_OK && i < n; i++) {
    if (!tensors[i]) local = apex__fail(APEX_ERR_INVALID_ARG, FN ": tensor %d is NULL", i);
    else if (names && !names[i]) local = apex__fail(APEX_ERR_INVALID_ARG, FN ": name %d is NULL", i);
  }
  size_t bytes = 0;
  char *blob = NULL;
  if (local == APEX_OK) {
    blob = describe(names, tensors, n, &bytes);
    if (!blob) local = apex__fail(APEX_ERR_OUT_OF_MEMORY, FN ": out of memory");
  }
  if (local != APEX_OK) snprintf(local_msg, sizeof local_msg, "%s", apex_last_error());

  int world = pg->world;
  record mine = {.valid = local == APEX_OK, .n = local == APEX_OK ? n : 0, .bytes = (int64_t)bytes,
                 .hash = blob ? apex__fnv1a(APEX_FNV_OFFSET, blob, bytes) : 0};
  record *rec = malloc((size_t)world * sizeof *rec);
  if (!rec) {
    free(blob);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, FN ": out of memory");
  }
  apex_status st = apex__pg_allgather_bytes(pg, &mine, rec, sizeof mine);
  int bad = -1, differ = 0;
  size_t stride = 4;
  for (int r = 0; st == APEX_OK && r < world; r++) {
    if (!rec[r].valid && bad < 0) bad = r;
    if (rec[r].n != rec[0].n || rec[r].hash != rec[0].hash) differ = 1;
    if ((size_t)rec[r].bytes + 1 > stride) stride = ((size_t)rec[r].bytes + 1 + 3) / 4 * 4;
  }
  if (st == APEX_OK && local != APEX_OK) st = apex__fail(local, "%s", local_msg);
  else if (st == APEX_OK && bad >= 0)
    st = apex__fail(APEX_ERR_INVALID_ARG, FN ": rank %d passed invalid arguments (its own error names them); no rank checked its model", bad);
  else if (st == APEX_OK && differ) {
    char *mine_pad = calloc(1, stride), *all = calloc((size_t)world, stride);
    /* Every rank reaches this branch (all saw the same records), so every rank joins the gather. */
    if (!mine_pad || !all) st = apex__fail(APEX_ERR_OUT_OF_MEMORY, FN ": out of memory");
    else {
      memcpy(mine_pad, blob, bytes);
      st = apex__pg_allgather_bytes(pg, mine_pad, all, stride);
      if (st == APEX_OK) st = explain(rec, all, stride, world);
    }
    free(mine_pad);
    free(all);
  }
  free(rec);
  free(blob);
  return st;
}
