/* test_nn_train.c: an MLP and a small CNN learn Fashion-MNIST (ctest label `long`).
 *
 * Two epochs in f32 with AdamW (lr 1e-3 decaying linearly to 0, batch 64), then accuracy on the 10,000 test images: the MLP
 * must reach 0.85 and the CNN 0.89. The data comes from $APEX_FASHION_MNIST or
 * /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist); without it the test skips. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "testutil.h"
#include "apex/data.h"
#include "apex/nn.h"
#include "apex/optim.h"

typedef struct fmnist {
  apex_idx *img[2], *lab[2]; /* train, test */
} fmnist;

static int load(fmnist *d) {
  const char *dir = getenv("APEX_FASHION_MNIST");
  if (!dir) dir = "/usr/share/datasets/fashion-mnist";
  static const char *names[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                                 "t10k-labels-idx1-ubyte.gz"};
  apex_idx **slot[4] = {&d->img[0], &d->lab[0], &d->img[1], &d->lab[1]};
  for (int i = 0; i < 4; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (apex_idx_load(path, slot[i]) != APEX_OK) return 0;
  }
  return 1;
}

static void unload(fmnist *d) {
  for (int i = 0; i < 2; i++) {
    apex_idx_destroy(d->img[i]);
    apex_idx_destroy(d->lab[i]);
  }
}

/* Trains `net` for `epochs` and returns the test accuracy. image_ndim 1: [N, 784]; 3: [N, 1, 28, 28]. */
static double train_and_test(apex_model *m, apex_module *net, const fmnist *d, int image_ndim, int epochs) {
  enum { B = 64 };
  const int64_t flat[1] = {784}, img[3] = {1, 28, 28};
  const int64_t *item = image_ndim == 1 ? flat : img;
  size_t np = apex_model_num_params(m);
  apex_tensor **params = malloc(np * sizeof *params), **grads = malloc(np * sizeof *grads);
  for (size_t i = 0; i < np; i++) {
    params[i] = apex_var_value(apex_model_param(m, i, NULL));
    grads[i] = apex_var_grad(apex_model_param(m, i, NULL));
  }
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .weight_decay = 1e-4f});
  assert_non_null(opt);
  TU_OK(apex_optimizer_add_group(opt, params, (int)np, grads, (int)np, NULL, NULL));
  apex_graph *g = apex_graph_create();
  size_t n_train = (size_t)apex_idx_dim(d->img[0], 0), n_test = (size_t)apex_idx_dim(d->img[1], 0);
  size_t *order = malloc(n_train * sizeof *order);
  for (size_t i = 0; i < n_train; i++) order[i] = i;
  apex_rng rng = apex_rng_init(7);
  int64_t labels[B];
  apex_tensor *x = apex_tensor_create(APEX_F32, image_ndim + 1, (int64_t[]){B, item[0], image_ndim > 1 ? item[1] : 0, image_ndim > 1 ? item[2] : 0});
  const uint8_t *pix = apex_idx_data(d->img[0]), *lab = apex_idx_data(d->lab[0]);
  apex_model_train(m, 1);
  size_t steps = (size_t)epochs * (n_train / B), done = 0;
  for (int e = 0; e < epochs; e++) {
    float u[1];
    for (size_t i = n_train - 1; i > 0; i--) { /* Fisher-Yates from the deterministic generator */
      apex_rng_uniform(&rng, u, 1);
      size_t j = (size_t)(u[0] * (float)(i + 1));
      if (j > i) j = i;
      size_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    double loss_sum = 0;
    for (size_t s = 0; s + B <= n_train; s += B) {
      float *xd = apex_tensor_data(x);
      for (int b = 0; b < B; b++) {
        size_t k = order[s + (size_t)b];
        for (int p = 0; p < 784; p++) xd[b * 784 + p] = (float)pix[k * 784 + (size_t)p] / 255.0f * 2.0f - 1.0f;
        labels[b] = lab[k];
      }
      apex_var *loss = apex_cross_entropy(g, apex_module_forward(net, g, apex_graph_input(g, x, 0)), labels, NULL);
      if (!loss) fail_msg("forward: %s", apex_last_error());
      loss_sum += apex_var_item(loss);
      TU_OK(apex_model_zero_grad(m));
      TU_OK(apex_backward(loss, NULL));
      TU_OK(apex_optimizer_set_lr(opt, 0, 1e-3f * (1.0f - (float)done++ / (float)steps)));
      TU_OK(apex_optimizer_step(opt, 1.0f, 0));
      apex_graph_reset(g);
    }
    printf("# epoch %d: mean loss %.4f\n", e + 1, loss_sum / (double)(n_train / B));
  }
  apex_model_train(m, 0);
  apex_graph_set_grad_enabled(g, 0);
  size_t correct = 0;
  for (size_t s = 0; s < n_test; s += 500) {
    size_t cnt = n_test - s < 500 ? n_test - s : 500;
    apex_tensor *tx = apex_idx_to_f32(d->img[1], s, cnt, image_ndim, item, 0.5f, 0.5f);
    int64_t tl[500];
    TU_OK(apex_idx_labels(d->lab[1], s, cnt, tl));
    apex_var *logits = apex_module_forward(net, g, apex_graph_input(g, tx, 0));
    assert_non_null(logits);
    const float *lg = apex_tensor_data(apex_var_value(logits));
    for (size_t i = 0; i < cnt; i++) {
      int best = 0;
      for (int c = 1; c < 10; c++)
        if (lg[i * 10 + (size_t)c] > lg[i * 10 + (size_t)best]) best = c;
      correct += best == tl[i];
    }
    apex_graph_reset(g);
    apex_tensor_destroy(tx);
  }
  apex_tensor_destroy(x);
  apex_graph_destroy(g);
  apex_optimizer_destroy(opt);
  free(order);
  free(params);
  free(grads);
  return (double)correct / (double)n_test;
}

static void test_mlp(void **state) {
  (void)state;
  fmnist d = {0};
  if (!load(&d)) {
    unload(&d);
    skip();
  }
  double t0 = (double)clock() / CLOCKS_PER_SEC;
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
  apex_module *net = apex_sequential_create(m, NULL);
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "0", 784, 512, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "2", 512, 256, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "4", 256, 10, 1)));
  double acc = train_and_test(m, net, &d, 1, 2);
  printf("# MLP 784-512-256-10: test accuracy %.4f after 2 epochs (cpu %.1f s)\n", acc, (double)clock() / CLOCKS_PER_SEC - t0);
  assert_true(acc >= 0.85);
  apex_model_destroy(m);
  unload(&d);
}

static void test_cnn(void **state) {
  (void)state;
  fmnist d = {0};
  if (!load(&d)) {
    unload(&d);
    skip();
  }
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 2});
  apex_module *net = apex_sequential_create(m, NULL);
  apex_conv2d_options pad1 = {.pad_h = 1, .pad_w = 1};
  apex_pool2d_options p2 = {.kernel_h = 2, .kernel_w = 2};
  TU_OK(apex_sequential_add(net, apex_conv2d_create(m, "0", 1, 32, 3, 3, &pad1, 1)));
  TU_OK(apex_sequential_add(net, apex_batch_norm2d_create(m, "1", 32, NULL)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_max_pool2d_create(m, &p2)));
  TU_OK(apex_sequential_add(net, apex_conv2d_create(m, "4", 32, 64, 3, 3, &pad1, 1)));
  TU_OK(apex_sequential_add(net, apex_batch_norm2d_create(m, "5", 64, NULL)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_max_pool2d_create(m, &p2)));
  TU_OK(apex_sequential_add(net, apex_flatten_create(m)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "9", 64 * 7 * 7, 128, 1)));
  TU_OK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_RELU)));
  TU_OK(apex_sequential_add(net, apex_linear_create(m, "11", 128, 10, 1)));
  double acc = train_and_test(m, net, &d, 3, 2);
  printf("# CNN conv32-bn-pool-conv64-bn-pool-128-10: test accuracy %.4f after 2 epochs\n", acc);
  assert_true(acc >= 0.89);
  apex_model_destroy(m);
  unload(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mlp), cmocka_unit_test(test_cnn)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
