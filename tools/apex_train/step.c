/* step.c: one optimizer step with gradient accumulation and clipping (step.h). */
#include "step.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>

#include "report.h"

int step_ctx_alloc(step_ctx *c) {
  int64_t B = c->B, T = c->T;
  if (c->tm->kind == MODEL_GPT) {
    c->ids = malloc((size_t)(B * T) * sizeof *c->ids);
    c->labels = malloc((size_t)(B * T) * sizeof *c->labels);
    return c->ids && c->labels ? 0 : -1;
  }
  int64_t H = c->d->in_h, W = c->d->in_w;
  c->labels = malloc((size_t)B * sizeof *c->labels);
  c->x = c->tm->kind == MODEL_MLP ? apex_tensor_create(APEX_F32, 2, (int64_t[]){B, H * W})
                                  : apex_tensor_create(APEX_F32, 4, (int64_t[]){B, 1, H, W});
  return c->labels && c->x ? 0 : -1;
}

void step_ctx_free(step_ctx *c) {
  apex_tensor_destroy(c->x);
  free(c->labels);
  free(c->ids);
  c->x = NULL;
  c->labels = c->ids = NULL;
}

int train_step(step_ctx *c, long pos, long step, step_result *out) {
  apex_graph *g = c->g;
  apex_amp_backward_options bo = {0};
  if (c->bo) bo = *c->bo;
  double sum = 0;
  for (long k = 0; k < c->accum; k++) {
    size_t micro = (size_t)(pos * c->accum + k);
    apex_var *logits;
    if (c->tm->kind == MODEL_GPT) {
      dataset_text_batch(c->d, micro, c->B, c->ids, c->labels);
      logits = model_forward_text(c->tm, g, c->ids, c->B, c->T);
    } else {
      dataset_image_batch(c->d, micro, c->B, apex_tensor_data(c->x), c->labels);
      logits = model_forward_images(c->tm, c->amp, g, apex_graph_input(g, c->x, 0));
    }
    apex_var *loss = apex_cross_entropy(g, logits, c->labels, NULL);
    double lv = loss ? apex_var_item(loss) : 0;
    /* The step's loss is the mean over its micro-batches: each backward carries 1 / accum of it. */
    if (loss && c->accum > 1) loss = apex_scale(g, loss, 1.0f / (float)c->accum);
    if (!loss) {
      fprintf(stderr, "apex-train: forward failed at step %ld: %s\n", step, one_line(apex_last_error()));
      return 1;
    }
    sum += lv;
    bo.delay_unscale = k + 1 < c->accum;
    apex_status st = apex_amp_backward(c->amp, loss, 0, &bo);
    apex_graph_reset(g);
    /* A non-finite loss or an overflow (at the minimum scale too) skips the step; whether the run
     * diverged is the bad-step rule's to say (divergence.h). */
    if (st != APEX_OK && st != APEX_ERR_NONFINITE) {
      fprintf(stderr, "apex-train: backward failed at step %ld: %s\n", step, one_line(apex_last_error()));
      return 1;
    }
  }
  /* Without --clip-grad-norm the norm is still measured for the log: a bound no finite norm exceeds
   * sets no clipping coefficient, so the step is the unclipped one, bit for bit. */
  float norm = 0;
  if (apex_amp_clip_grad_norm(c->amp, c->opt, c->clip > 0 ? c->clip : FLT_MAX, &norm) != APEX_OK) {
    fprintf(stderr, "apex-train: gradient norm at step %ld: %s\n", step, one_line(apex_last_error()));
    return 1;
  }
  int skipped = 0;
  if (apex_amp_step(c->amp, c->opt, &skipped) != APEX_OK) {
    fprintf(stderr, "apex-train: optimizer step %ld failed: %s\n", step, one_line(apex_last_error()));
    return 1;
  }
  apex_amp_zero_grad(c->amp);
  out->loss = sum / (double)c->accum;
  out->grad_norm = norm;
  out->skipped = skipped;
  return 0;
}
