/* bench_models.c: the benchmarks' MLP and CNN (see bench_models.h). */
#include "bench_models.h"

apex_module *bench_mlp(apex_model *m) {
  apex_module *net = apex_sequential_create(m, NULL);
  apex_sequential_add(net, apex_linear_create(m, "0", 784, 1024, 1));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_linear_create(m, "2", 1024, 1024, 1));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_linear_create(m, "4", 1024, 10, 1));
  return net;
}

apex_module *bench_cnn(apex_model *m) {
  apex_module *net = apex_sequential_create(m, NULL);
  apex_conv2d_options pad = {.pad_h = 1, .pad_w = 1};
  apex_pool2d_options p2 = {.kernel_h = 2, .kernel_w = 2};
  apex_sequential_add(net, apex_conv2d_create(m, "0", 1, 32, 3, 3, &pad, 1));
  apex_sequential_add(net, apex_batch_norm2d_create(m, "1", 32, NULL));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_max_pool2d_create(m, &p2));
  apex_sequential_add(net, apex_conv2d_create(m, "4", 32, 64, 3, 3, &pad, 1));
  apex_sequential_add(net, apex_batch_norm2d_create(m, "5", 64, NULL));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_max_pool2d_create(m, &p2));
  apex_sequential_add(net, apex_flatten_create(m));
  apex_sequential_add(net, apex_linear_create(m, "9", 64 * 7 * 7, 128, 1));
  apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU));
  apex_sequential_add(net, apex_linear_create(m, "11", 128, 10, 1));
  return net;
}
