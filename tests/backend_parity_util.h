/* backend_parity_util.h: what the parity cases (backend_parity_cases.h) share: the device under test
 * and the copies and comparisons between its tensors and the CPU's. */
#ifndef APEX_TESTS_BACKEND_PARITY_UTIL_H
#define APEX_TESTS_BACKEND_PARITY_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "apex/autograd.h"
#include "apex/cuda.h"
#include "apex/kernels.h"
#include "apex/loss_scaler.h"
#include "apex/nn_ops.h"
#include "apex/optim.h"
#include "testutil.h"

/* The device a parity case runs on, set by test_backend_ops.c before each run (a backend whose device
 * is not the CPU: the CPU computes the references). */
static apex_device pc_dev;

static apex_tensor *dev_copy(const apex_tensor *h) {
  apex_tensor *d = apex_tensor_create_on(pc_dev, apex_tensor_dtype(h), apex_tensor_ndim(h), apex_tensor_shape(h));
  assert_non_null(d);
  TU_OK(apex_tensor_copy(d, h));
  return d;
}

static apex_tensor *host_copy(const apex_tensor *d) {
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(d), apex_tensor_ndim(d), apex_tensor_shape(d));
  assert_non_null(h);
  TU_OK(apex_tensor_copy(h, d));
  return h;
}

/* Asserts a device tensor equals a host tensor bit for bit (same dtype). */
static void assert_same_bits(const apex_tensor *dev, const apex_tensor *host, const char *what) {
  apex_tensor *h = host_copy(dev);
  if (memcmp(apex_tensor_data(h), apex_tensor_data(host), apex_tensor_nbytes(host)) != 0) {
    size_t i = 0;
    while (apex_tensor_get(h, i) == apex_tensor_get(host, i)) i++;
    fail_msg("%s: element %zu differs: GPU %.9g, CPU %.9g", what, i, (double)apex_tensor_get(h, i),
             (double)apex_tensor_get(host, i));
  }
  apex_tensor_destroy(h);
}

/* Two device tensors hold the same bits. */
static void same_run_bits(const apex_tensor *a, const apex_tensor *b, const char *what) {
  apex_tensor *h = host_copy(b);
  assert_same_bits(a, h, what);
  apex_tensor_destroy(h);
}

/* Largest distance in f32 ulps between a device f32 tensor and a host one. */
static uint32_t max_ulps(const apex_tensor *dev, const apex_tensor *host) {
  apex_tensor *h = host_copy(dev);
  uint32_t worst = 0;
  const float *a = apex_tensor_data(h), *b = apex_tensor_data(host);
  for (size_t i = 0; i < apex_tensor_numel(host); i++) {
    int64_t ia = (int32_t)tu_bits(a[i]), ib = (int32_t)tu_bits(b[i]);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    uint64_t d = (uint64_t)(ia > ib ? ia - ib : ib - ia);
    if (d > worst) worst = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
  }
  apex_tensor_destroy(h);
  return worst;
}

/* ---- conversions, copies, allocator ---------------------------------------------------------------- */

#endif
