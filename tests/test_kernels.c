/* test_kernels.c: the raw kernels of apex/kernels.h on the CPU.
 *
 * The kernels live in the CUDA backend only: on CPU tensors every call must refuse with
 * APEX_ERR_UNSUPPORTED naming the call, the kernel and the CPU backend (backend.h's NULL-slot rule),
 * leave its outputs untouched; a call with no tensor at all names the NULL one. The kernels' numerics on a GPU are
 * test_cuda's. */
#include <math.h>

#include "apex/kernels.h"
#include "testutil.h"

/* st and the message of the call just made: APEX_ERR_UNSUPPORTED naming the call and its kernel, then
 * the CPU backend. */
static void refused(apex_status st, const char *call_and_kernel) {
  assert_int_equal(st, APEX_ERR_UNSUPPORTED);
  tu_assert_message(call_and_kernel);
  tu_assert_message("is not implemented on the cpu backend");
}

/* Each call with CPU tensors: refused, naming it and the backend. */
static void test_cpu_tensors_unsupported(void **state) {
  (void)state;
  int64_t s2[2] = {4, 6}, s1[1] = {4}, s4[4] = {1, 2, 3, 3}, sw[4] = {2, 2, 1, 1}, qkv_s[3] = {1, 2, 12};
  apex_tensor *x = apex_tensor_create(APEX_F32, 2, s2), *y = apex_tensor_create(APEX_F32, 2, s2);
  apex_tensor *w = apex_tensor_create(APEX_F32, 1, s2 + 1), *r = apex_tensor_create(APEX_F32, 1, s1);
  apex_tensor *img = apex_tensor_create(APEX_F32, 4, s4), *cw = apex_tensor_create(APEX_F32, 4, sw);
  apex_tensor *qkv = apex_tensor_create(APEX_F32, 3, qkv_s);
  TU_OK(apex_tensor_fill(y, 7.0f));
  int64_t ids[4] = {0, 1, 2, 3};
  refused(apex_kernel_layer_norm_forward(x, w, NULL, 1e-5f, 0, y, r, r), "apex_kernel_layer_norm_forward: layer_norm_forward");
  refused(apex_kernel_layer_norm_backward(y, x, w, r, r, 0, y, w, NULL), "apex_kernel_layer_norm_backward: layer_norm_backward");
  refused(apex_kernel_cross_entropy_forward(x, ids, -1, 0.0f, r, r), "apex_kernel_cross_entropy_forward: cross_entropy_forward");
  refused(apex_kernel_cross_entropy_backward(r, x, ids, r, -1, 0.0f, y), "apex_kernel_cross_entropy_backward: cross_entropy_backward");
  refused(apex_kernel_batch_norm_stats(img, r, r, NULL), "apex_kernel_batch_norm_stats: batch_norm_stats");
  refused(apex_kernel_matmul(x, 0, x, 1, y, 1.0f, 0.0f, NULL, 0), "apex_kernel_matmul: matmul");
  refused(apex_kernel_conv2d_forward(img, cw, NULL, NULL, img), "apex_kernel_conv2d_forward: conv2d_forward");
  refused(apex_kernel_conv2d_backward(img, img, cw, NULL, img, cw, NULL), "apex_kernel_conv2d_backward: conv2d_backward");
  refused(apex_kernel_embedding_forward(x, ids, 4, y), "apex_kernel_embedding_forward: embedding_forward");
  refused(apex_kernel_embedding_backward(y, ids, 4, x), "apex_kernel_embedding_backward: embedding_backward");
  refused(apex_kernel_attention_forward(qkv, 2, y, r), "apex_kernel_attention_forward: attention_forward");
  refused(apex_kernel_attention_backward(y, qkv, y, r, 2, qkv), "apex_kernel_attention_backward: attention_backward");
  refused(apex_kernel_add(x, x, y), "apex_kernel_add: add");
  refused(apex_kernel_mul(x, x, y), "apex_kernel_mul: mul");
  refused(apex_kernel_scale(x, 2.0f, y), "apex_kernel_scale: scale");
  refused(apex_kernel_relu_forward(x, y), "apex_kernel_relu_forward: relu_forward");
  refused(apex_kernel_relu_backward(y, x, y), "apex_kernel_relu_backward: relu_backward");
  refused(apex_kernel_gelu_forward(x, y), "apex_kernel_gelu_forward: gelu_forward");
  refused(apex_kernel_gelu_backward(y, x, y), "apex_kernel_gelu_backward: gelu_backward");
  refused(apex_kernel_sum_rows(x, w, 0), "apex_kernel_sum_rows: sum_rows");
  refused(apex_kernel_sum_all(x, 0, r), "apex_kernel_sum_all: sum_all");
  /* nothing was written */
  for (size_t i = 0; i < apex_tensor_numel(y); i++) assert_true(apex_tensor_get(y, i) == 7.0f);
  /* a call without tensors names the first NULL one, on any build; one with a CPU tensor among NULLs
   * is refused as above, before its arguments are looked at */
  TU_FAILS(apex_kernel_layer_norm_forward(NULL, NULL, NULL, 1e-5f, 0, NULL, NULL, NULL), APEX_ERR_INVALID_ARG,
           "apex_kernel_layer_norm_forward: x is NULL");
  TU_FAILS(apex_kernel_add(NULL, NULL, NULL), APEX_ERR_INVALID_ARG, "apex_kernel_add: a is NULL");
  TU_FAILS(apex_kernel_attention_forward(NULL, 2, NULL, NULL), APEX_ERR_INVALID_ARG, "qkv is NULL");
  refused(apex_kernel_add(NULL, x, NULL), "apex_kernel_add: add");
  apex_tensor_destroy(x);
  apex_tensor_destroy(y);
  apex_tensor_destroy(w);
  apex_tensor_destroy(r);
  apex_tensor_destroy(img);
  apex_tensor_destroy(cw);
  apex_tensor_destroy(qkv);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpu_tensors_unsupported)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
