/* step.c: one optimizer step with gradient accumulation and clipping (step.h). */
#include "step.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>

#include "report.h"

int step_ctx_alloc(step_ctx *c) {
  int64_t B = c->B, T = c->T;
  /* every model keeps a GPU's micro-batch losses until the step is queued (read_losses) */
  c->losses = calloc((size_t)c->accum, sizeof *c->losses);
  if (c->tm->kind == MODEL_GPT) {
    c->ids = malloc((size_t)(B * T) * sizeof *c->ids);
    c->labels = malloc((size_t)(B * T) * sizeof *c->labels);
    return c->ids && c->labels && c->losses ? 0 : -1;
  }
  int64_t H = c->d->in_h, W = c->d->in_w;
  c->labels = malloc((size_t)B * sizeof *c->labels);
  int made = c->tm->kind == MODEL_MLP ? device_batch_create(&c->x, c->dev, 2, (int64_t[]){B, H * W})
                                      : device_batch_create(&c->x, c->dev, 4, (int64_t[]){B, 1, H, W});
  return c->labels && c->losses && made == 0 ? 0 : -1;
}

void step_ctx_free(step_ctx *c) {
  device_batch_free(&c->x);
  free(c->labels);
  free(c->ids);
  free(c->losses);
  c->losses = NULL;
  c->labels = c->ids = NULL;
}

/* The GPU's losses of a queued step, added to *sum (when not NULL) in micro-batch order, the order of
 * the CPU's sum: the first read waits for the device, once a step. */
static void read_losses(step_ctx *c, double *sum) {
  for (long k = 0; c->dev != APEX_DEVICE_CPU && k < c->accum; k++) {
    if (c->losses[k] && sum) *sum += apex_tensor_get(c->losses[k], 0);
    apex_tensor_destroy(c->losses[k]);
    c->losses[k] = NULL;
  }
  device_batch_settled(&c->x);
}

/* --zero: the global norm of the unscaled gradients (clipped as amp clips its masters' gradients),
 * then the shard's step, skipped on every rank after an overflow on any (shard.h). */
static int zero_step(step_ctx *c, float scale, long step, double sum, step_result *out) {
  float norm = 0;
  apex_status st = apex_zero_clip_grad_norm(c->zs->z, c->clip > 0 ? c->clip : FLT_MAX, scale, &norm);
  int overflow = c->zs->overflow;
  if (st == APEX_OK) st = apex_zero_step(c->zs->z, scale, &overflow);
  if (st != APEX_OK) {
    fprintf(stderr, "apex-train: optimizer step %ld failed: %s\n", step, one_line(apex_last_error()));
    return read_losses(c, NULL), 1;
  }
  /* amp manages no optimizer here: the model's gradients are cleared directly. */
  apex_amp_zero_grad(c->amp);
  apex_model_zero_grad(c->tm->m);
  read_losses(c, &sum);
  out->loss = sum / (double)c->accum;
  out->grad_norm = norm;
  out->skipped = overflow;
  return 0;
}

apex_status step_backward(const step_ctx *c, apex_graph *g, apex_var *loss, long k, apex_amp_backward_options *bo) {
  /* The step's loss is the mean over its micro-batches: each backward carries 1 / accum of it. */
  if (c->accum > 1) loss = apex_scale(g, loss, 1.0f / (float)c->accum);
  apex_status st = loss ? APEX_OK : apex_last_status();
  bo->delay_unscale = k + 1 < c->accum;
  if (st == APEX_OK) st = apex_amp_backward(c->amp, loss, 0, bo);
  apex_graph_reset(g);
  /* A non-finite loss or an overflow (at the minimum scale too) skips the step. */
  return st == APEX_ERR_NONFINITE ? APEX_OK : st;
}

int train_step(step_ctx *c, long pos, long step, step_result *out) {
  apex_graph *g = c->g;
  apex_amp_backward_options bo = {0};
  if (c->bo) bo = *c->bo;
  double sum = 0;
  int failed = 0;
  /* --zero steps with the scale the gradients carry: the one before the closing backward updates it. */
  float scale = apex_amp_loss_scale(c->amp, 0);
  if (c->zs) c->zs->overflow = 0;
  for (long k = 0; k < c->accum && !failed; k++) {
    size_t micro = (size_t)(pos * c->accum + k);
    apex_var *loss;
    if (c->tm->kind == MODEL_GPT) {
      dataset_text_batch(c->d, micro, c->B, c->ids, c->labels);
      loss = model_loss_text(c->tm, g, c->ids, c->labels, c->B, c->T);
    } else {
      dataset_image_batch(c->d, micro, c->B, device_batch_host(&c->x), c->labels);
      loss = model_loss_images(c->tm, c->amp, g, device_batch_upload(&c->x), c->labels);
    }
    /* On the CPU the loss is read at once (it costs nothing); on a GPU a queued copy keeps it, read
     * after the step is queued, so that the host does not wait for each micro-batch's forward. */
    double lv = 0;
    if (loss && c->dev == APEX_DEVICE_CPU) lv = apex_var_item(loss);
    else if (loss && !(c->losses[k] = apex_tensor_clone(apex_var_value(loss)))) loss = NULL;
    if (!loss) {
      fprintf(stderr, "apex-train: forward failed at step %ld: %s\n", step, one_line(apex_last_error()));
      apex_graph_reset(g);
      failed = 1;
      break;
    }
    sum += lv;
    if (c->zs) c->zs->last = k + 1 == c->accum;
    if (step_backward(c, g, loss, k, &bo) != APEX_OK) {
      fprintf(stderr, "apex-train: backward failed at step %ld: %s\n", step, one_line(apex_last_error()));
      failed = 1;
    }
  }
  if (failed) return read_losses(c, NULL), 1;
  /* Without --clip-grad-norm the norm is still measured for the log: a bound no finite norm exceeds
   * sets no clipping coefficient, so the step is the unclipped one, bit for bit. */
  float norm = 0;
  if (c->zs) return zero_step(c, scale, step, sum, out);
  if (apex_amp_clip_grad_norm(c->amp, c->opt, c->clip > 0 ? c->clip : FLT_MAX, &norm) != APEX_OK) {
    fprintf(stderr, "apex-train: gradient norm at step %ld: %s\n", step, one_line(apex_last_error()));
    return read_losses(c, NULL), 1;
  }
  int skipped = 0;
  if (apex_amp_step(c->amp, c->opt, &skipped) != APEX_OK) {
    fprintf(stderr, "apex-train: optimizer step %ld failed: %s\n", step, one_line(apex_last_error()));
    return read_losses(c, NULL), 1;
  }
  apex_amp_zero_grad(c->amp);
  read_losses(c, &sum);
  out->loss = sum / (double)c->accum;
  out->grad_norm = norm;
  out->skipped = skipped;
  return 0;
}
