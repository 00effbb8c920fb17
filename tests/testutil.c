/* testutil.c: helpers shared by the tests (see testutil.h). */
#include "testutil.h"

#include "apex/cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void tu_assert_message(const char *needle) {
  if (!strstr(apex_last_error(), needle)) fail_msg("message '%s' does not mention '%s'", apex_last_error(), needle);
}

apex_tensor *tu_random_tensor(apex_dtype dtype, size_t n, uint64_t seed, float range) {
  int64_t shape = (int64_t)n;
  apex_tensor *t = apex_tensor_create(dtype, 1, &shape);
  assert_non_null(t);
  float *tmp = malloc((n ? n : 1) * sizeof *tmp);
  apex_rng rng = apex_rng_init(seed);
  assert_int_equal(apex_rng_uniform(&rng, tmp, n), APEX_OK);
  for (size_t i = 0; i < n; i++) tmp[i] = (2.0f * tmp[i] - 1.0f) * range;
  assert_int_equal(apex_convert(apex_tensor_data(t), dtype, tmp, APEX_F32, n), APEX_OK);
  free(tmp);
  return t;
}

apex_var *tu_random_leaf(apex_dtype dtype, int ndim, const int64_t *shape, uint64_t seed, int requires_grad) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  apex_tensor *flat = tu_random_tensor(dtype, n, seed, 1.0f);
  apex_tensor *t = apex_tensor_view(flat, ndim, shape);
  apex_tensor_destroy(flat);
  return apex_var_create(t, requires_grad);
}

void *tu_read_data(const char *name, size_t *size) {
  const char *dir = getenv("APEX_TEST_DATA");
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open golden file %s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc((size_t)len + 1);
  if (fread(buf, 1, (size_t)len, f) != (size_t)len) fail_msg("short read on %s", path);
  fclose(f);
  ((char *)buf)[len] = 0;
  *size = (size_t)len;
  return buf;
}

double tu_max_rel_diff(const float *a, const float *b, size_t n, double floor) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]) / fmax(fabs((double)b[i]), floor);
    if (!(d <= worst)) worst = d; /* NaN counts as worst */
  }
  return worst;
}

void tu_assert_scaler_state_equal(const apex_loss_scaler_state *a, const apex_loss_scaler_state *b) {
  assert_int_equal(tu_bits(a->scale), tu_bits(b->scale));
  assert_int_equal(a->growth_tracker, b->growth_tracker);
  assert_int_equal(a->hysteresis_tracker, b->hysteresis_tracker);
  assert_int_equal(a->steps, b->steps);
  assert_int_equal(a->skipped, b->skipped);
}

apex_pg *tu_pg;

int tu_pg_setup(void **state) {
  (void)state;
  tu_pg = apex_pg_create(NULL);
  if (!tu_pg) {
    fprintf(stderr, "apex_pg_create failed: %s\n", apex_last_error());
    return -1;
  }
  print_message("process group %s, rank %d of %d\n", apex_pg_backend(tu_pg), apex_pg_rank(tu_pg), apex_pg_world_size(tu_pg));
  return 0;
}

int tu_pg_teardown(void **state) {
  (void)state;
  apex_pg_destroy(tu_pg);
  tu_pg = NULL;
  return 0;
}

int tu_device_present(apex_device dev) {
  const char *why = NULL;
  if (dev == APEX_DEVICE_CPU || apex_cuda_available(&why)) return 1;
  printf("skipped: %s\n", why ? why : "no CUDA GPU");
  return 0;
}

apex_tensor *tu_host_copy(const apex_tensor *t) {
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  assert_non_null(h);
  TU_OK(apex_tensor_copy(h, t));
  return h;
}

apex_tensor *tu_random_on(apex_device dev, apex_dtype dtype, int ndim, const int64_t *shape, uint64_t seed, float range) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  apex_tensor *r = tu_random_tensor(dtype, n, seed, range), *t = apex_tensor_create_on(dev, dtype, ndim, shape);
  assert_non_null(t);
  apex_tensor *v = apex_tensor_view(r, ndim, shape);
  assert_non_null(v);
  TU_OK(apex_tensor_copy(t, v));
  apex_tensor_destroy(v);
  apex_tensor_destroy(r);
  return t;
}
