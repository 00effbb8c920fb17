/* byo_model.c: bring your own model (llm.c style). The program owns its parameters and gradients as
 * raw f16 buffers and writes its forward and backward by hand; apex supplies what mixed precision
 * needs around them: a dynamic loss scaler, f32 master weights and a fused AdamW that unscales the
 * f16 gradients inside its kernel (Apex's FP16_Optimizer). No autograd, no apex modules.
 *
 * The model: y = w2 . relu(W1 x + b1) + b2, fitted to a fixed nonlinear target.
 *
 *     ./byo_model [steps]      (default 1000) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <apex/apex.h>

enum { B = 64, IN = 8, H = 64 };

/* The model's memory, as a C program would lay it out: one f16 buffer per tensor. */
static uint16_t W1[H * IN], b1[H], w2[H], b2[1];
static uint16_t gW1[H * IN], gb1[H], gw2[H], gb2[1];

static float f(uint16_t h) { return apex_f16_to_f32(h); }

/* Forward and backward of the mean squared error on one batch; the gradients of loss * scale are
 * written into the f16 gradient buffers (they may overflow to Inf: the scaler deals with that). */
static float forward_backward(const float *x, const float *y, float scale) {
  static float h[B][H], pre[B][H];
  float gw1[H * IN] = {0}, gbias1[H] = {0}, gw2f[H] = {0}, gbias2 = 0, loss = 0;
  for (int n = 0; n < B; n++) {
    float out = f(b2[0]);
    for (int j = 0; j < H; j++) {
      float a = f(b1[j]);
      for (int k = 0; k < IN; k++) a += f(W1[j * IN + k]) * x[n * IN + k];
      pre[n][j] = a;
      h[n][j] = a > 0 ? a : 0;
      out += f(w2[j]) * h[n][j];
    }
    float d = out - y[n];
    loss += d * d / B;
    float dout = scale * 2 * d / B; /* d(loss * scale) / d out */
    gbias2 += dout;
    for (int j = 0; j < H; j++) {
      gw2f[j] += dout * h[n][j];
      float dh = pre[n][j] > 0 ? dout * f(w2[j]) : 0;
      gbias1[j] += dh;
      for (int k = 0; k < IN; k++) gw1[j * IN + k] += dh * x[n * IN + k];
    }
  }
  for (int i = 0; i < H * IN; i++) gW1[i] = apex_f32_to_f16(gw1[i]);
  for (int j = 0; j < H; j++) {
    gb1[j] = apex_f32_to_f16(gbias1[j]);
    gw2[j] = apex_f32_to_f16(gw2f[j]);
  }
  gb2[0] = apex_f32_to_f16(gbias2);
  return loss;
}

int main(int argc, char **argv) {
  long steps = argc > 1 ? atol(argv[1]) : 1000;
  apex_rng rng = apex_rng_init(3);
  float init[H * IN];
  apex_rng_uniform(&rng, init, H * IN);
  for (int i = 0; i < H * IN; i++) W1[i] = apex_f32_to_f16((2 * init[i] - 1) / sqrtf(IN));
  apex_rng_uniform(&rng, init, H);
  for (int j = 0; j < H; j++) w2[j] = apex_f32_to_f16((2 * init[j] - 1) / sqrtf(H));

  /* Hand apex the buffers (no copies) and build the optimizer over them: it keeps f32 masters. */
  uint16_t *pbuf[4] = {W1, b1, w2, b2}, *gbuf[4] = {gW1, gb1, gw2, gb2};
  int64_t len[4] = {H * IN, H, H, 1};
  apex_tensor *params[4], *grads[4];
  for (int i = 0; i < 4; i++) {
    params[i] = apex_tensor_wrap(pbuf[i], APEX_F16, 1, &len[i]);
    grads[i] = apex_tensor_wrap(gbuf[i], APEX_F16, 1, &len[i]);
  }
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 3e-3f});
  if (!opt || apex_optimizer_add_group(opt, params, 4, grads, 4, NULL, NULL) != APEX_OK) {
    fprintf(stderr, "optimizer: %s\n", apex_last_error());
    return 1;
  }
  apex_fp16_optimizer *fo = apex_fp16_optimizer_create(opt, NULL); /* dynamic loss scaling from 2^16 */

  float x[B * IN], y[B], first = 0, loss = 0;
  long skipped_total = 0;
  for (long s = 0; s < steps; s++) {
    apex_rng_uniform(&rng, x, B * IN);
    for (int n = 0; n < B; n++) {
      y[n] = 0;
      for (int k = 0; k < IN; k++) {
        x[n * IN + k] = 2 * x[n * IN + k] - 1;
        y[n] += sinf(3 * x[n * IN + k]) / (k + 1);
      }
    }
    loss = forward_backward(x, y, apex_fp16_optimizer_loss_scale(fo));
    if (s == 0) first = loss;
    float norm;
    apex_fp16_optimizer_clip_master_grads(fo, 5.0f, &norm); /* optional, on the unscaled gradients */
    int skipped;
    apex_status st = apex_fp16_optimizer_step(fo, &skipped); /* Inf/NaN check, scale update, step or skip */
    if (st != APEX_OK) {
      fprintf(stderr, "step: %s\n", apex_last_error());
      return 1;
    }
    skipped_total += skipped;
    if (s % 200 == 0 || s == steps - 1)
      printf("step %5ld  loss %.5f  loss scale %g  skipped so far %ld\n", s, loss, apex_fp16_optimizer_loss_scale(fo), skipped_total);
  }
  printf("loss %.5f -> %.5f, %ld steps skipped for overflow\n", first, loss, skipped_total);
  apex_fp16_optimizer_destroy(fo);
  apex_optimizer_destroy(opt);
  for (int i = 0; i < 4; i++) {
    apex_tensor_destroy(params[i]);
    apex_tensor_destroy(grads[i]);
  }
  return loss < first / 4 ? 0 : 1;
}
