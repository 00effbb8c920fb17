/* backend_parity_gpt2.h: parity cases of the GPT-2 of bench/gpt2_cuda.c on the GPU against the same model
 * on apex's CPU autograd, and its bf16 training (bounds: backend_parity_cases.h). */
#ifndef APEX_TESTS_BACKEND_PARITY_GPT2_H
#define APEX_TESTS_BACKEND_PARITY_GPT2_H

#include "backend_parity_util.h"
#include "gpt2_cuda.h"

/* ---- GPT-2 on the GPU (bench/gpt2_cuda.c) against the same model on apex's CPU autograd ------------------ */

/* A tiny GPT-2: 2 blocks, C = 64, 4 heads of 16, an unpadded vocabulary of 96, batches of 2 x 16 tokens with
 * room for 24 positions (so wpe has rows no position reaches: their gradient must be 0). */
static const gpt2_config TINY = {.vocab = 96, .max_t = 24, .n_layer = 2, .n_embd = 64, .n_head = 4};
enum { TINY_B = 2, TINY_T = 16 };

static void tiny_batch(int64_t *tokens, int64_t *targets, int64_t *positions) {
  for (int i = 0; i < TINY_B * TINY_T; i++) {
    tokens[i] = (i * 37 + 11) % TINY.vocab;
    targets[i] = (i * 53 + 5) % TINY.vocab;
    positions[i] = i % TINY_T;
  }
}

/* A CPU leaf holding rows [row0, row0 + rows) of the host tensor h ([R, cols], or [R] when cols is 0). */
static apex_var *leaf_rows(const apex_tensor *h, int64_t row0, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols}, w = cols ? cols : 1;
  apex_tensor *t = apex_tensor_create(APEX_F32, cols ? 2 : 1, shape);
  assert_non_null(t);
  memcpy(apex_tensor_data(t), (const float *)apex_tensor_data(h) + row0 * w, (size_t)(rows * w) * sizeof(float));
  return apex_var_create(t, 1);
}

/* The mean cross-entropy of GPT-2 on the CPU graph. leaf[i] holds tensor i of the model's list except
 * c_attn's: its weight and bias are split into their q, k and v thirds (qkv[l][0..2] the weights,
 * qkv[l][3..5] the biases), since the graph has no slicing op and linear layers on the thirds give the
 * same q, k and v. */
static apex_var *cpu_gpt2_loss(apex_graph *g, apex_var **leaf, int n, apex_var *(*qkv)[6], const int64_t *tokens,
                               const int64_t *positions, const int64_t *targets) {
  const int64_t C = TINY.n_embd, H = TINY.n_head;
  const int64_t bt[2] = {TINY_B, TINY_T}, s4[4] = {TINY_B, TINY_T, H, C / H}, s3[3] = {TINY_B, TINY_T, C};
  const int64_t s2[2] = {TINY_B * TINY_T, TINY.vocab};
  const int perm[4] = {0, 2, 1, 3}; /* [B, T, H, D] <-> [B, H, T, D] */
  apex_var *x = apex_add(g, apex_embedding(g, leaf[0], tokens, 2, bt), apex_embedding(g, leaf[1], positions, 2, bt));
  for (int l = 0; l < TINY.n_layer; l++) {
    apex_var **w = leaf + 2 + GPT2_TENSORS_PER_LAYER * l; /* ln1_w ln1_b qkv_w qkv_b proj_w proj_b ln2_w ln2_b fc_w fc_b fcproj_w fcproj_b */
    apex_var *h = apex_layer_norm(g, x, w[0], w[1], 1e-5f), *heads[3];
    for (int j = 0; j < 3; j++) heads[j] = apex_permute(g, apex_reshape(g, apex_linear(g, h, qkv[l][j], qkv[l][3 + j]), 4, s4), perm);
    apex_var *att = apex_causal_attention(g, heads[0], heads[1], heads[2]);
    att = apex_reshape(g, apex_permute(g, att, perm), 3, s3);
    x = apex_add(g, x, apex_linear(g, att, w[4], w[5]));
    h = apex_gelu_tanh(g, apex_linear(g, apex_layer_norm(g, x, w[6], w[7], 1e-5f), w[8], w[9]));
    x = apex_add(g, x, apex_linear(g, h, w[10], w[11]));
  }
  x = apex_layer_norm(g, x, leaf[n - 2], leaf[n - 1], 1e-5f);
  apex_var *logits = apex_reshape(g, apex_linear(g, x, leaf[0], NULL), 2, s2); /* the tied lm_head */
  return apex_cross_entropy(g, logits, targets, NULL);
}

/* f32 on both sides, from identical parameters (random, larger than GPT-2's initialisation, so that the
 * softmaxes and GELUs work away from their linear regions): the mean loss to 1e-4 relative and every
 * gradient to 1e-3 of that gradient's largest magnitude (both sides accumulate in f32; the bound leaves
 * room for the other summation orders of the GEMMs and of the attention, and still catches a wrong index,
 * transpose, scale or mask). */
static void pc_gpt2_matches_cpu(void) {
  int64_t tokens[TINY_B * TINY_T], targets[TINY_B * TINY_T], positions[TINY_B * TINY_T];
  tiny_batch(tokens, targets, positions);
  gpt2_cuda *m = gpt2_cuda_create(&TINY, APEX_F32, TINY_B, TINY_T, 7);
  if (!m) fail_msg("gpt2_cuda_create: %s", apex_last_error());
  const int n = m->n_tensors, L = TINY.n_layer;
  const int64_t C = TINY.n_embd;
  apex_tensor **hp = calloc((size_t)n, sizeof *hp);
  apex_var **leaf = calloc((size_t)n, sizeof *leaf);
  apex_var *(*qkv)[6] = calloc((size_t)L, sizeof *qkv);
  for (int i = 0; i < n; i++) {
    char name[32];
    gpt2_cuda_tensor_name(m, i, name, sizeof name);
    apex_tensor *p = m->param_list[i];
    size_t numel = apex_tensor_numel(p);
    apex_tensor *r = tu_random_tensor(APEX_F32, numel, 900 + (uint64_t)i, 0.25f);
    if (strstr(name, "ln") && name[strlen(name) - 1] == 'w') /* layer-norm weights around 1 */
      for (size_t k = 0; k < numel; k++) ((float *)apex_tensor_data(r))[k] += 1.0f;
    TU_OK(apex_tensor_copy(p, r));
    hp[i] = r;
    int64_t cols = apex_tensor_ndim(p) == 2 ? apex_tensor_dim(p, 1) : 0;
    leaf[i] = leaf_rows(r, 0, apex_tensor_dim(p, 0), cols);
  }
  for (int l = 0; l < L; l++) {
    int wi = 2 + GPT2_TENSORS_PER_LAYER * l + 2; /* qkv_w; qkv_b follows */
    for (int j = 0; j < 3; j++) {
      qkv[l][j] = leaf_rows(hp[wi], j * C, C, C);
      qkv[l][3 + j] = leaf_rows(hp[wi + 1], j * C, C, 0);
    }
  }
  TU_OK(gpt2_cuda_forward(m, tokens, targets));
  float gpu_loss;
  TU_OK(gpt2_cuda_loss(m, &gpu_loss));
  TU_OK(gpt2_cuda_backward(m));
  apex_graph *g = apex_graph_create();
  apex_var *loss = cpu_gpt2_loss(g, leaf, n, qkv, tokens, positions, targets);
  if (!loss) fail_msg("the CPU GPT-2: %s", apex_last_error());
  TU_OK(apex_backward(loss, NULL));
  double cpu_loss = apex_var_item(loss);
  printf("gpt2 f32: loss GPU %.7f, CPU %.7f\n", (double)gpu_loss, cpu_loss);
  if (!(fabs(gpu_loss - cpu_loss) <= 1e-4 * fabs(cpu_loss))) fail_msg("GPT-2 loss: GPU %.7f, CPU %.7f", (double)gpu_loss, cpu_loss);
  double worst = 0;
  char worst_name[32] = "";
  for (int i = 0; i < n; i++) {
    char name[32];
    gpt2_cuda_tensor_name(m, i, name, sizeof name);
    apex_tensor *gd = host_copy(m->grad_list[i]);
    size_t numel = apex_tensor_numel(gd);
    double *ref = malloc(numel * sizeof *ref);
    int j = i >= 2 && i < n - 2 ? (i - 2) % GPT2_TENSORS_PER_LAYER : -1;
    if (j == 2 || j == 3) { /* c_attn: the thirds' gradients side by side */
      int l = (i - 2) / GPT2_TENSORS_PER_LAYER;
      size_t third = numel / 3;
      for (int t = 0; t < 3; t++) {
        const float *part = apex_tensor_data(apex_var_grad(qkv[l][t + (j == 3 ? 3 : 0)]));
        for (size_t k = 0; k < third; k++) ref[t * third + k] = part[k];
      }
    } else {
      const float *cg = apex_tensor_data(apex_var_grad(leaf[i]));
      for (size_t k = 0; k < numel; k++) ref[k] = cg[k];
    }
    double mag = 0, err = 0;
    for (size_t k = 0; k < numel; k++) mag = fmax(mag, fabs(ref[k]));
    for (size_t k = 0; k < numel; k++) err = fmax(err, fabs(apex_tensor_get(gd, k) - ref[k]));
    if (!(mag > 0)) fail_msg("GPT-2 %s: the CPU gradient is all zero", name);
    if (!(err <= 1e-3 * mag)) fail_msg("GPT-2 gradient %s: max |GPU - CPU| %.3g is more than 1e-3 of its largest magnitude %.3g", name, err, mag);
    if (err / mag > worst) worst = err / mag, snprintf(worst_name, sizeof worst_name, "%s", name);
    if (i == 1) /* positions T..max_t-1 never occur */
      for (size_t k = (size_t)TINY_T * (size_t)C; k < numel; k++) assert_true(apex_tensor_get(gd, k) == 0.0f);
    free(ref);
    apex_tensor_destroy(gd);
  }
  printf("gpt2 f32: %d gradients, the worst max|GPU - CPU| / max|CPU| %.2e (%s)\n", n, worst, worst_name);
  TU_FAILS(gpt2_cuda_backward(m), APEX_ERR_STATE, "no forward");
  apex_graph_destroy(g);
  for (int i = 0; i < n; i++) apex_var_destroy(leaf[i]), apex_tensor_destroy(hp[i]);
  for (int l = 0; l < L; l++)
    for (int j = 0; j < 6; j++) apex_var_destroy(qkv[l][j]);
  free(qkv);
  free(leaf);
  free(hp);
  gpt2_cuda_destroy(m);
}

/* bf16 parameters and activations with f32 masters: the first loss near the f32 model's (same seed, so the
 * same initial values before rounding), then 5 AdamW steps on the same batch lower it, the optimizer's
 * masters are f32 and the bf16 parameters moved. */
static void pc_gpt2_bf16_trains(void) {
  int64_t tokens[TINY_B * TINY_T], targets[TINY_B * TINY_T], positions[TINY_B * TINY_T];
  tiny_batch(tokens, targets, positions);
  gpt2_cuda *ref = gpt2_cuda_create(&TINY, APEX_F32, TINY_B, TINY_T, 11), *m = gpt2_cuda_create(&TINY, APEX_BF16, TINY_B, TINY_T, 11);
  if (!ref || !m) fail_msg("gpt2_cuda_create: %s", apex_last_error());
  float l32, loss[6];
  TU_OK(gpt2_cuda_forward(ref, tokens, targets));
  TU_OK(gpt2_cuda_loss(ref, &l32));
  apex_optimizer *opt = gpt2_cuda_optimizer_create(m, 1e-3f, 0.1f);
  if (!opt) fail_msg("gpt2_cuda_optimizer_create: %s", apex_last_error());
  assert_int_equal(apex_optimizer_num_groups(opt), 2);
  assert_int_equal(apex_optimizer_group_size(opt, 0), 2 + 4 * TINY.n_layer);     /* wte, wpe, 4 linear weights a block */
  assert_int_equal(apex_optimizer_group_size(opt, 1), 2 + 8 * TINY.n_layer);     /* 4 biases and 4 layer-norm tensors a block, ln_f */
  assert_int_equal(apex_tensor_dtype(apex_optimizer_master(opt, 0, 0)), APEX_F32);
  apex_tensor *wte0 = host_copy(m->params.wte);
  for (int s = 0; s < 5; s++) {
    TU_OK(gpt2_cuda_train_step(m, opt, tokens, targets));
    TU_OK(gpt2_cuda_loss(m, &loss[s])); /* the loss of the forward before step s's update */
  }
  TU_OK(gpt2_cuda_forward(m, tokens, targets));
  TU_OK(gpt2_cuda_loss(m, &loss[5]));
  printf("gpt2 bf16: f32 loss %.4f; bf16 losses %.4f %.4f %.4f %.4f %.4f -> %.4f\n", (double)l32, (double)loss[0],
         (double)loss[1], (double)loss[2], (double)loss[3], (double)loss[4], (double)loss[5]);
  if (!(fabs(loss[0] - l32) <= 0.02 * l32)) fail_msg("GPT-2 bf16 first loss %.5f, f32 %.5f", (double)loss[0], (double)l32);
  for (int s = 0; s < 6; s++) assert_true(isfinite(loss[s]));
  if (!(loss[5] < loss[0] - 0.01f)) fail_msg("GPT-2 bf16: 5 AdamW steps took the loss from %.5f to %.5f", (double)loss[0], (double)loss[5]);
  apex_tensor *wte1 = host_copy(m->params.wte);
  assert_true(memcmp(apex_tensor_data(wte0), apex_tensor_data(wte1), apex_tensor_nbytes(wte0)) != 0);
  apex_tensor_destroy(wte0);
  apex_tensor_destroy(wte1);
  apex_optimizer_destroy(opt);
  gpt2_cuda_destroy(m);
  gpt2_cuda_destroy(ref);
}

#endif
