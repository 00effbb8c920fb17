/* backend_parity_gpt2.h: parity cases of the library's GPT (models.h: apex_gpt_create, apex_gpt_loss) on the
 * device against the same model on the CPU, and its training under amp O2 with bf16 there (bounds:
 * backend_parity_cases.h). What a C program that builds its GPT-2 with apex runs, nothing private. */
#ifndef APEX_TESTS_BACKEND_PARITY_GPT2_H
#define APEX_TESTS_BACKEND_PARITY_GPT2_H

#include "apex/models.h"
#include "backend_parity_util.h"

/* A tiny GPT-2: 2 blocks, C = 64, 4 heads of 16, an unpadded vocabulary of 96, batches of 2 x 16 tokens with
 * room for 24 positions (so wpe has rows no position reaches: their gradient must be 0). */
static const apex_gpt_options TINY = {.vocab = 96, .n_layer = 2, .n_embd = 64, .n_head = 4, .n_positions = 24};
enum { TINY_B = 2, TINY_T = 16 };

static void tiny_batch(int64_t *tokens, int64_t *targets) {
  for (int i = 0; i < TINY_B * TINY_T; i++) {
    tokens[i] = (i * 37 + 11) % TINY.vocab;
    targets[i] = (i * 53 + 5) % TINY.vocab;
  }
}

/* The tiny GPT on dev from seed. */
static apex_model *tiny_gpt(apex_device dev, uint64_t seed, apex_module **gpt) {
  apex_model *m = apex_model_create(&(apex_model_options){.seed = seed, .device = dev});
  *gpt = m ? apex_gpt_create(m, &TINY) : NULL;
  if (!*gpt) fail_msg("apex_gpt_create on %s: %s", dev == APEX_DEVICE_CPU ? "the CPU" : "the device", apex_last_error());
  return m;
}

/* f32 on both sides, from identical parameters (random, larger than GPT-2's initialisation, so that the
 * softmaxes and GELUs work away from their linear regions): the mean loss to 1e-4 relative and every
 * gradient to 1e-3 of that gradient's largest magnitude (both sides accumulate in f32; the bound leaves
 * room for the other summation orders of the products, the attention and the classifier, and still catches
 * a wrong index, transpose, scale or mask). */
static void pc_gpt2_matches_cpu(void) {
  int64_t tokens[TINY_B * TINY_T], targets[TINY_B * TINY_T];
  tiny_batch(tokens, targets);
  apex_module *gc, *gd;
  apex_model *mc = tiny_gpt(APEX_DEVICE_CPU, 7, &gc), *md = tiny_gpt(pc_dev, 7, &gd);
  const size_t n = apex_model_num_params(mc);
  assert_int_equal(apex_model_num_params(md), n);
  for (size_t i = 0; i < n; i++) {
    const char *name;
    apex_tensor *pc = apex_var_value(apex_model_param(mc, i, &name)), *pd = apex_var_value(apex_model_param(md, i, NULL));
    size_t numel = apex_tensor_numel(pc);
    apex_tensor *r = tu_random_tensor(APEX_F32, numel, 900 + (uint64_t)i, 0.25f);
    if (strstr(name, "ln") && strstr(name, ".weight")) /* layer-norm weights around 1 */
      for (size_t k = 0; k < numel; k++) ((float *)apex_tensor_data(r))[k] += 1.0f;
    memcpy(apex_tensor_data(pc), apex_tensor_data(r), numel * sizeof(float));
    TU_OK(apex_tensor_copy(pd, r));
    apex_tensor_destroy(r);
  }
  apex_graph *g = apex_graph_create(), *gdev = apex_graph_create_on(pc_dev);
  apex_var *lc = apex_gpt_loss(gc, g, tokens, targets, TINY_B, TINY_T);
  apex_var *ld = apex_gpt_loss(gd, gdev, tokens, targets, TINY_B, TINY_T);
  if (!lc || !ld) fail_msg("apex_gpt_loss: %s", apex_last_error());
  TU_OK(apex_backward(lc, NULL));
  TU_OK(apex_backward(ld, NULL));
  apex_tensor *ldh = host_copy(apex_var_value(ld));
  double cpu_loss = apex_var_item(lc), dev_loss = apex_tensor_get(ldh, 0);
  printf("gpt f32: loss device %.7f, CPU %.7f\n", dev_loss, cpu_loss);
  if (!(fabs(dev_loss - cpu_loss) <= 1e-4 * fabs(cpu_loss))) fail_msg("GPT loss: device %.7f, CPU %.7f", dev_loss, cpu_loss);
  double worst = 0;
  const char *worst_name = "";
  for (size_t i = 0; i < n; i++) {
    const char *name;
    const apex_tensor *cg = apex_var_grad(apex_model_param(mc, i, &name));
    apex_tensor *dg = host_copy(apex_var_grad(apex_model_param(md, i, NULL)));
    size_t numel = apex_tensor_numel(dg);
    double mag = 0, err = 0;
    for (size_t k = 0; k < numel; k++) mag = fmax(mag, fabs(apex_tensor_get(cg, k)));
    for (size_t k = 0; k < numel; k++) err = fmax(err, fabs(apex_tensor_get(dg, k) - apex_tensor_get(cg, k)));
    if (!(mag > 0)) fail_msg("GPT %s: the CPU gradient is all zero", name);
    if (!(err <= 1e-3 * mag)) fail_msg("GPT gradient %s: max |device - CPU| %.3g is more than 1e-3 of its largest magnitude %.3g", name, err, mag);
    if (err / mag > worst) worst = err / mag, worst_name = name;
    if (!strcmp(name, "wpe.weight")) /* positions T..n_positions-1 never occur */
      for (size_t k = (size_t)TINY_T * (size_t)TINY.n_embd; k < numel; k++) assert_true(apex_tensor_get(dg, k) == 0.0f);
    apex_tensor_destroy(dg);
  }
  printf("gpt f32: %zu gradients, the worst max|device - CPU| / max|CPU| %.2e (%s)\n", n, worst, worst_name);
  apex_tensor_destroy(ldh);
  apex_graph_destroy(gdev);
  apex_graph_destroy(g);
  apex_model_destroy(md);
  apex_model_destroy(mc);
}

/* amp O2 with bf16 on the device, AdamW in two groups (weight decay on the 2-D weights only, as GPT-2 is
 * trained): the first loss near the f32 model's from the same seed (the same values before rounding), then
 * 5 steps on the same batch lower it, the masters are f32 and the bf16 parameters moved. */
static void pc_gpt2_bf16_trains(void) {
  int64_t tokens[TINY_B * TINY_T], targets[TINY_B * TINY_T];
  tiny_batch(tokens, targets);
  apex_module *gref, *gpt;
  apex_model *ref = tiny_gpt(pc_dev, 11, &gref), *m = tiny_gpt(pc_dev, 11, &gpt);
  apex_graph *g = apex_graph_create_on(pc_dev);
  apex_var *l = apex_gpt_loss(gref, g, tokens, targets, TINY_B, TINY_T);
  if (!l) fail_msg("apex_gpt_loss (f32): %s", apex_last_error());
  apex_tensor *lh = host_copy(apex_var_value(l));
  const double l32 = apex_tensor_get(lh, 0);
  apex_tensor_destroy(lh);
  apex_graph_reset(g);
  const size_t np = apex_model_num_params(m);
  apex_tensor **pv = calloc(np, sizeof *pv), **gv = calloc(np, sizeof *gv);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f});
  assert_non_null(opt);
  for (int decay = 1; decay >= 0; decay--) {
    int k = 0;
    for (size_t i = 0; i < np; i++) {
      apex_var *p = apex_model_param(m, i, NULL);
      if ((apex_tensor_ndim(apex_var_value(p)) >= 2) == decay) pv[k] = apex_var_value(p), gv[k++] = apex_var_grad(p);
    }
    apex_optim_options o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = decay ? 0.1f : 0};
    TU_OK(apex_optimizer_add_group(opt, pv, k, gv, k, &o, NULL));
  }
  free(pv);
  free(gv);
  assert_int_equal(apex_optimizer_group_size(opt, 0), 2 + 6 * TINY.n_layer); /* wte, wpe, 6 linear weights a block */
  assert_int_equal(apex_optimizer_group_size(opt, 1), 2 + 10 * TINY.n_layer); /* 6 biases and 4 layer-norm tensors a block, ln_f */
  apex_amp *amp = NULL;
  TU_OK(apex_amp_initialize(&m, 1, &opt, 1, &(apex_amp_config){.opt_level = "O2", .half_type = APEX_AMP_CAST_BF16}, &amp));
  assert_int_equal(apex_tensor_dtype(apex_optimizer_master(opt, 0, 0)), APEX_F32);
  apex_tensor *wte0 = host_copy(apex_var_value(apex_model_param(m, 0, NULL)));
  double loss[6];
  for (int s = 0; s < 6; s++) {
    l = apex_gpt_loss(gpt, g, tokens, targets, TINY_B, TINY_T);
    if (!l) fail_msg("apex_gpt_loss (bf16), step %d: %s", s, apex_last_error());
    lh = host_copy(apex_var_value(l));
    loss[s] = apex_tensor_get(lh, 0); /* the loss of the forward before step s's update */
    apex_tensor_destroy(lh);
    if (s == 5) break;
    TU_OK(apex_amp_backward(amp, l, 0, NULL));
    apex_graph_reset(g);
    TU_OK(apex_amp_step(amp, opt, NULL));
    TU_OK(apex_amp_zero_grad(amp));
  }
  printf("gpt bf16: f32 loss %.4f; bf16 losses %.4f %.4f %.4f %.4f %.4f -> %.4f\n", l32, loss[0], loss[1], loss[2], loss[3],
         loss[4], loss[5]);
  if (!(fabs(loss[0] - l32) <= 0.02 * l32)) fail_msg("GPT bf16 first loss %.5f, f32 %.5f", loss[0], l32);
  for (int s = 0; s < 6; s++) assert_true(isfinite(loss[s]));
  if (!(loss[5] < loss[0] - 0.01)) fail_msg("GPT bf16: 5 AdamW steps took the loss from %.5f to %.5f", loss[0], loss[5]);
  apex_tensor *wte1 = host_copy(apex_var_value(apex_model_param(m, 0, NULL)));
  assert_int_equal(apex_tensor_dtype(wte1), APEX_BF16);
  assert_true(memcmp(apex_tensor_data(wte0), apex_tensor_data(wte1), apex_tensor_nbytes(wte0)) != 0);
  apex_tensor_destroy(wte0);
  apex_tensor_destroy(wte1);
  apex_graph_destroy(g);
  apex_amp_destroy(amp);
  apex_optimizer_destroy(opt);
  apex_model_destroy(m);
  apex_model_destroy(ref);
}

#endif
