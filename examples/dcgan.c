/* dcgan.c: Apex's GAN case (examples/dcgan): a generator and a discriminator on Fashion-MNIST, two
 * optimizers and three losses, each with its own loss scaler (num_losses = 3):
 *   errD_real and errD_fake reach the discriminator's optimizer, errG the generator's.
 * The networks are small MLPs so that it runs in seconds on a CPU; the amp calls are Apex's.
 *
 *     ./dcgan [steps] [O0|O1|O2|O3]      (defaults 500, O1)
 *
 * Data as in fashion_mnist.c; exits 77 without it. */
#include <math.h>
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

enum { B = 64, NZ = 32 };

static apex_optimizer *adam_for(apex_model *m) {
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAM, &(apex_optim_options){.lr = 2e-4f, .beta1 = 0.5f});
  if (opt && apex_optimizer_add_model(opt, m, NULL, NULL) != APEX_OK) {
    apex_optimizer_destroy(opt);
    return NULL;
  }
  return opt;
}

int main(int argc, char **argv) {
  long steps = argc > 1 ? atol(argv[1]) : 500;
  const char *level = argc > 2 ? argv[2] : "O1";
  const char *dir = getenv("APEX_FASHION_MNIST") ? getenv("APEX_FASHION_MNIST") : "/usr/share/datasets/fashion-mnist";
  char path[1024];
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
  apex_idx *images;
  if (apex_idx_load(path, &images) != APEX_OK) {
    fprintf(stderr, "dcgan: %s (install Debian's dataset-fashion-mnist); skipping\n", apex_last_error());
    return 77;
  }

  /* netG: z -> 256 -> 784 in [-1, 1]; netD: 784 -> 256 -> 1 logit. */
  apex_model *mg = apex_model_create(&(apex_model_options){.seed = 1}), *md = apex_model_create(&(apex_model_options){.seed = 2});
  apex_module *netG = apex_sequential_create(mg, NULL), *netD = apex_sequential_create(md, NULL);
  CHECK(apex_sequential_add(netG, apex_linear_create(mg, "0", NZ, 256, 1)));
  CHECK(apex_sequential_add(netG, apex_activation_create(mg, APEX_OP_RELU)));
  CHECK(apex_sequential_add(netG, apex_linear_create(mg, "2", 256, 784, 1)));
  CHECK(apex_sequential_add(netG, apex_activation_create(mg, APEX_OP_TANH)));
  CHECK(apex_sequential_add(netD, apex_linear_create(md, "0", 784, 256, 1)));
  CHECK(apex_sequential_add(netD, apex_activation_create(md, APEX_OP_RELU)));
  CHECK(apex_sequential_add(netD, apex_linear_create(md, "2", 256, 1, 1)));
  apex_optimizer *optG = adam_for(mg), *optD = adam_for(md);
  if (!optG || !optD) {
    fprintf(stderr, "optimizers: %s\n", apex_last_error());
    return 1;
  }

  /* [modelG, modelD], [optimizerG, optimizerD] = amp.initialize(..., num_losses=3) */
  apex_model *models[2] = {mg, md};
  apex_optimizer *opts[2] = {optG, optD};
  apex_amp *amp;
  CHECK(apex_amp_initialize(models, 2, opts, 2, &(apex_amp_config){.opt_level = level, .num_losses = 3}, &amp));
  /* The first backward keeps the step's graph: errD_fake runs backward through the same graph step. */
  apex_amp_backward_options toD_keep = {.optimizers = &optD, .n_optimizers = 1, .retain_graph = 1};
  apex_amp_backward_options toD = {.optimizers = &optD, .n_optimizers = 1}, toG = {.optimizers = &optG, .n_optimizers = 1};

  apex_graph *g = apex_graph_create();
  apex_tensor *z = apex_tensor_create(APEX_F32, 2, (int64_t[]){B, NZ});
  apex_tensor *ones = apex_tensor_create(APEX_F32, 2, (int64_t[]){B, 1}), *zeros = apex_tensor_create(APEX_F32, 2, (int64_t[]){B, 1});
  apex_tensor_fill(ones, 1.0f);
  apex_rng rng = apex_rng_init(7);
  size_t per_epoch = (size_t)apex_idx_dim(images, 0) / B;
  float eDr = 0, eDf = 0, eG = 0;
  for (long s = 0; s < steps; s++) {
    apex_tensor *real = apex_idx_to_f32(images, (size_t)(s % (long)per_epoch) * B, B, 1, (int64_t[]){784}, 0.5f, 0.5f);
    CHECK(apex_rng_normal(&rng, apex_tensor_data(z), B * NZ, 0.0f, 1.0f));

    /* (1) the discriminator: maximise log D(x) + log(1 - D(G(z))). */
    apex_var *out = apex_amp_forward(amp, 1, netD, g, apex_graph_input(g, real, 0));
    apex_var *errD_real = apex_bce_with_logits(g, out, apex_graph_input(g, ones, 0), APEX_REDUCTION_MEAN);
    CHECK(apex_amp_backward(amp, errD_real, 0, &toD_keep)); /* with amp.scale_loss(errD_real, optimizerD, loss_id=0) */
    apex_var *fake = apex_amp_forward(amp, 0, netG, g, apex_graph_input(g, z, 0));
    if (!errD_real || !fake) {
      fprintf(stderr, "forward: %s\n", apex_last_error());
      return 1;
    }
    apex_var *detached = apex_graph_input(g, apex_var_value(fake), 0); /* fake.detach() */
    apex_var *errD_fake = apex_bce_with_logits(g, apex_amp_forward(amp, 1, netD, g, detached), apex_graph_input(g, zeros, 0),
                                               APEX_REDUCTION_MEAN);
    CHECK(apex_amp_backward(amp, errD_fake, 1, &toD)); /* loss_id=1 */
    CHECK(apex_amp_step(amp, optD, NULL));
    eDr = apex_var_item(errD_real);
    eDf = apex_var_item(errD_fake);
    CHECK(apex_amp_zero_grad(amp));
    apex_graph_reset(g); /* a new step: the casts of D's updated weights are made afresh */

    /* (2) the generator: maximise log D(G(z)). */
    fake = apex_amp_forward(amp, 0, netG, g, apex_graph_input(g, z, 0));
    apex_var *errG = apex_bce_with_logits(g, apex_amp_forward(amp, 1, netD, g, fake), apex_graph_input(g, ones, 0), APEX_REDUCTION_MEAN);
    if (!errG) {
      fprintf(stderr, "forward: %s\n", apex_last_error());
      return 1;
    }
    CHECK(apex_amp_backward(amp, errG, 2, &toG)); /* loss_id=2 */
    CHECK(apex_amp_step(amp, optG, NULL));
    eG = apex_var_item(errG);
    CHECK(apex_amp_zero_grad(amp));
    apex_graph_reset(g);
    apex_tensor_destroy(real);
    if (s % 100 == 0 || s == steps - 1)
      printf("[%ld/%ld] Loss_D_real %.4f Loss_D_fake %.4f Loss_G %.4f  scales %g %g %g\n", s, steps, eDr, eDf, eG,
             apex_amp_loss_scale(amp, 0), apex_amp_loss_scale(amp, 1), apex_amp_loss_scale(amp, 2));
  }
  apex_tensor_destroy(z);
  apex_tensor_destroy(ones);
  apex_tensor_destroy(zeros);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(optG);
  apex_optimizer_destroy(optD);
  apex_model_destroy(mg);
  apex_model_destroy(md);
  apex_idx_destroy(images);
  return isfinite(eDr) && isfinite(eDf) && isfinite(eG) ? 0 : 1;
}
