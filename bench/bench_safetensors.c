/* bench_safetensors.c: how long the safetensors reader takes to open a checkpoint of many small
 * tensors (80,000: a large model's parameters plus optimizer state), and to then read every tensor
 * back by name. Both grow with the tensor count; they must grow as n log n, not n^2.
 *   safetensors_open_80k      apex_safetensors_parse of the whole file, in ms
 *   safetensors_read_all_80k  apex_safetensors_get of each of the 80,000 names, in ms
 * The peer is cJSON parsing (and freeing) the same header in the same run: the floor any reader built
 * on cJSON pays, so ratio = peer time / apex time says what share of apex's time is the JSON parse. */
#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "bench_util.h"

enum { N_TENSORS = 80000 };

/* A safetensors file of n one-element f32 tensors "model.layers.<i>.weight", written from the format's
 * definition (not by apex's writer, so the figure times the reader alone). */
static uint8_t *make_file(int n, size_t *len, size_t *header_len) {
  size_t cap = (size_t)n * 96 + 64, used = 0;
  char *json = malloc(cap);
  used += (size_t)snprintf(json + used, cap - used, "{");
  for (int i = 0; i < n; i++)
    used += (size_t)snprintf(json + used, cap - used, "%s\"model.layers.%d.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", i, 4 * i, 4 * i + 4);
  used += (size_t)snprintf(json + used, cap - used, "}");
  while (used % 8) json[used++] = ' ';
  *header_len = used;
  *len = 8 + used + 4 * (size_t)n;
  uint8_t *buf = malloc(*len);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)used >> (8 * i));
  memcpy(buf + 8, json, used);
  for (int i = 0; i < n; i++) {
    float v = (float)i;
    memcpy(buf + 8 + used + 4 * (size_t)i, &v, 4);
  }
  free(json);
  return buf;
}

typedef struct {
  const uint8_t *buf;
  size_t len, header_len;
  apex_safetensors *st;
  int ok;
} job;

static void run_open(void *p) {
  job *j = p;
  apex_safetensors *st = apex_safetensors_parse(j->buf, j->len);
  j->ok = st != NULL;
  apex_safetensors_close(st);
}

static void run_cjson(void *p) {
  job *j = p;
  cJSON *root = cJSON_ParseWithLength((const char *)j->buf + 8, j->header_len);
  j->ok = root != NULL;
  cJSON_Delete(root);
}

static void run_read_all(void *p) {
  job *j = p;
  char name[64];
  for (int i = 0; i < N_TENSORS; i++) {
    snprintf(name, sizeof name, "model.layers.%d.weight", i);
    apex_tensor *t = apex_safetensors_get(j->st, name);
    if (!t) j->ok = 0;
    apex_tensor_destroy(t);
  }
}

int main(int argc, char **argv) {
  int want_open = bench_wanted(argc, argv, "safetensors_open_80k"), want_read = bench_wanted(argc, argv, "safetensors_read_all_80k");
  if (!want_open && !want_read) return 0;
  job j = {0};
  uint8_t *buf = make_file(N_TENSORS, &j.len, &j.header_len);
  j.buf = buf;
  double t_open = bench_best(run_open, &j, 0, 3, 0.5);
  if (!j.ok) {
    bench_skip("safetensors_open_80k", apex_last_error());
    free(buf);
    return 1;
  }
  double t_json = bench_best(run_cjson, &j, 0, 3, 0.5);
  if (want_open) bench_report("safetensors_open_80k", t_open * 1e3, "ms", t_json / t_open, "cjson_parse");
  if (want_read) {
    j.st = apex_safetensors_parse(buf, j.len);
    j.ok = 1;
    double t_read = bench_best(run_read_all, &j, 0, 3, 0.5);
    if (!j.ok) bench_skip("safetensors_read_all_80k", apex_last_error());
    else bench_report("safetensors_read_all_80k", t_read * 1e3, "ms", t_json / t_read, "cjson_parse");
    apex_safetensors_close(j.st);
  }
  free(buf);
  return 0;
}
