/* fashion_mnist.c: Apex's ImageNet example, scaled to Fashion-MNIST: a CNN with batch norm trained
 * at any opt level, then tested.
 *
 *     ./fashion_mnist [O0|O1|O2|O3] [steps] [f16|bf16]     (defaults O1, 1874 = two epochs, f16)
 *
 * Data: $APEX_FASHION_MNIST or /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist);
 * without it the program says so and exits 77 (ctest's "skipped"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <apex/apex.h>

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    if ((call) != APEX_OK) {                                                                               \
      fprintf(stderr, "%s: %s\n", #call, apex_last_error());                                             \
      return 1;                                                                                            \
    }                                                                                                      \
  } while (0)

enum { B = 64 };

int main(int argc, char **argv) {
  const char *level = argc > 1 ? argv[1] : "O1";
  long steps = argc > 2 ? atol(argv[2]) : 1874;
  int bf16 = argc > 3 && strcmp(argv[3], "bf16") == 0;
  const char *dir = getenv("APEX_FASHION_MNIST") ? getenv("APEX_FASHION_MNIST") : "/usr/share/datasets/fashion-mnist";
  const char *files[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                          "t10k-labels-idx1-ubyte.gz"};
  apex_idx *idx[4];
  for (int i = 0; i < 4; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (apex_idx_load(path, &idx[i]) != APEX_OK) {
      fprintf(stderr, "fashion_mnist: %s (install Debian's dataset-fashion-mnist); skipping\n", apex_last_error());
      return 77;
    }
  }

  /* conv32-bn-relu-pool, conv64-bn-relu-pool, 128, 10 */
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 2});
  apex_module *net = apex_sequential_create(m, NULL);
  apex_conv2d_options pad1 = {.pad_h = 1, .pad_w = 1};
  apex_pool2d_options p2 = {.kernel_h = 2, .kernel_w = 2};
  CHECK(apex_sequential_add(net, apex_conv2d_create(m, "0", 1, 32, 3, 3, &pad1, 1)));
  CHECK(apex_sequential_add(net, apex_batch_norm2d_create(m, "1", 32, NULL)));
  CHECK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  CHECK(apex_sequential_add(net, apex_max_pool2d_create(m, &p2)));
  CHECK(apex_sequential_add(net, apex_conv2d_create(m, "4", 32, 64, 3, 3, &pad1, 1)));
  CHECK(apex_sequential_add(net, apex_batch_norm2d_create(m, "5", 64, NULL)));
  CHECK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  CHECK(apex_sequential_add(net, apex_max_pool2d_create(m, &p2)));
  CHECK(apex_sequential_add(net, apex_flatten_create(m)));
  CHECK(apex_sequential_add(net, apex_linear_create(m, "9", 64 * 7 * 7, 128, 1)));
  CHECK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  CHECK(apex_sequential_add(net, apex_linear_create(m, "11", 128, 10, 1)));

  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f});
  CHECK(apex_optimizer_add_model(opt, m, NULL, NULL));
  apex_amp *amp;
  CHECK(apex_amp_initialize(&m, 1, &opt, 1,
                            &(apex_amp_config){.opt_level = level, .half_type = bf16 ? APEX_AMP_CAST_BF16 : APEX_AMP_CAST_F16}, &amp));
  char props[2048];
  printf("%s", apex_amp_properties_format(apex_amp_properties_of(amp), props, sizeof props));

  apex_graph *g = apex_graph_create();
  size_t n_train = (size_t)apex_idx_dim(idx[0], 0), per_epoch = n_train / B;
  int64_t shape[3] = {1, 28, 28}, labels[B];
  for (long s = 0; s < steps; s++) {
    size_t first = (size_t)(s % (long)per_epoch) * B; /* in file order: the example keeps it short */
    apex_tensor *x = apex_idx_to_f32(idx[0], first, B, 3, shape, 0.5f, 0.5f);
    CHECK(apex_idx_labels(idx[1], first, B, labels));
    apex_optimizer_set_lr(opt, 0, 1e-3f * (1.0f - (float)s / (float)steps));
    apex_var *loss = apex_cross_entropy(g, apex_amp_forward(amp, 0, net, g, apex_graph_input(g, x, 0)), labels, NULL);
    if (!loss) {
      fprintf(stderr, "forward: %s\n", apex_last_error());
      return 1;
    }
    float l = apex_var_item(loss);
    CHECK(apex_amp_backward(amp, loss, 0, NULL));
    CHECK(apex_amp_step(amp, opt, NULL));
    CHECK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    apex_tensor_destroy(x);
    if (s % 100 == 0 || s == steps - 1) printf("step %5ld  loss %.4f  loss scale %g\n", s, l, apex_amp_loss_scale(amp, 0));
  }

  /* Test: evaluation mode (running statistics), no gradients. */
  apex_model_train(m, 0);
  apex_graph_set_grad_enabled(g, 0);
  size_t n_test = steps < 500 ? 1000 : (size_t)apex_idx_dim(idx[2], 0), correct = 0;
  for (size_t s = 0; s < n_test; s += 500) {
    int64_t tl[500];
    apex_tensor *x = apex_idx_to_f32(idx[2], s, 500, 3, shape, 0.5f, 0.5f);
    CHECK(apex_idx_labels(idx[3], s, 500, tl));
    apex_tensor *lg = apex_var_value(apex_amp_forward(amp, 0, net, g, apex_graph_input(g, x, 0)));
    for (size_t i = 0; i < 500; i++) {
      int best = 0;
      for (int c = 1; c < 10; c++)
        if (apex_tensor_get(lg, i * 10 + (size_t)c) > apex_tensor_get(lg, i * 10 + (size_t)best)) best = c;
      correct += best == tl[i];
    }
    apex_graph_reset(g);
    apex_tensor_destroy(x);
  }
  double acc = (double)correct / (double)n_test;
  printf("%s: test accuracy %.4f on %zu images after %ld steps\n", level, acc, n_test, steps);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  for (int i = 0; i < 4; i++) apex_idx_destroy(idx[i]);
  return acc > 0.5 ? 0 : 1; /* even 60 steps learn this much */
}
