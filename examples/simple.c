/* simple.c: mixed precision in three calls, on the smallest problem there is.
 *
 * A two-layer network learns y = 3 x0 - 2 x1 + 1 from noisy samples at opt level O1 (f16 autocast,
 * dynamic loss scaling). The three amp calls are marked; everything else is the f32 program.
 *
 *     ./simple [steps]        (default 300) */
#include <stdio.h>
#include <stdlib.h>

#include <apex/apex.h>

#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    if ((call) != APEX_OK) {                                                                               \
      fprintf(stderr, "%s: %s\n", #call, apex_last_error());                                             \
      return 1;                                                                                            \
    }                                                                                                      \
  } while (0)

enum { B = 32 };

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 300;

  /* The model and its optimizer, as in any f32 program. */
  apex_model *m = apex_model_create(&(apex_model_options){.seed = 1});
  apex_module *net = apex_sequential_create(m, NULL);
  CHECK(apex_sequential_add(net, apex_linear_create(m, "0", 2, 16, 1)));
  CHECK(apex_sequential_add(net, apex_activation_create(m, APEX_OP_TANH)));
  CHECK(apex_sequential_add(net, apex_linear_create(m, "2", 16, 1, 1)));
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAM, &(apex_optim_options){.lr = 1e-2f});
  CHECK(apex_optimizer_add_model(opt, m, NULL, NULL));

  /* 1. amp.initialize */
  apex_amp *amp;
  CHECK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = "O1"}, &amp));

  apex_graph *g = apex_graph_create();
  apex_tensor *x = apex_tensor_create(APEX_F32, 2, (int64_t[]){B, 2}), *y = apex_tensor_create(APEX_F32, 2, (int64_t[]){B, 1});
  apex_rng rng = apex_rng_init(42);
  float first = 0, last = 0;
  for (int s = 0; s < steps; s++) {
    float *xd = apex_tensor_data(x), *yd = apex_tensor_data(y), noise[B];
    apex_rng_uniform(&rng, xd, 2 * B);
    apex_rng_normal(&rng, noise, B, 0.0f, 0.01f);
    for (int i = 0; i < B; i++) {
      xd[2 * i] = 2 * xd[2 * i] - 1;
      xd[2 * i + 1] = 2 * xd[2 * i + 1] - 1;
      yd[i] = 3 * xd[2 * i] - 2 * xd[2 * i + 1] + 1 + noise[i];
    }
    apex_var *pred = apex_amp_forward(amp, 0, net, g, apex_graph_input(g, x, 0));
    apex_var *loss = apex_mse_loss(g, pred, apex_graph_input(g, y, 0), APEX_REDUCTION_MEAN);
    if (!loss) {
      fprintf(stderr, "forward: %s\n", apex_last_error());
      return 1;
    }
    last = apex_var_item(loss);
    if (s == 0) first = last;
    /* 2. with amp.scale_loss(loss, optimizer) as scaled: scaled.backward() */
    CHECK(apex_amp_backward(amp, loss, 0, NULL));
    /* 3. optimizer.step(), skipped when the gradients overflowed */
    CHECK(apex_amp_step(amp, opt, NULL));
    CHECK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    if (s % 100 == 0 || s == steps - 1) printf("step %4d  loss %.5f  loss scale %g\n", s, last, apex_amp_loss_scale(amp, 0));
  }
  printf("loss %.5f -> %.5f\n", first, last);
  apex_tensor_destroy(x);
  apex_tensor_destroy(y);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  return last < first / 10 ? 0 : 1;
}
