/* capture_step.c: apex-train's captured step (capture_step.h). */
#include "capture_step.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "report.h"

const char *captured_step_refusal(const train_args *a) {
  if (a->no_capture) return "--no-capture";
  if (a->zero) return "--zero: the shards agree on an overflow through the host";
  if (a->distributed) return "--distributed: the ranks agree on an overflow through the host";
  if (a->clip_grad_norm > 0) return "--clip-grad-norm: the clip coefficient is computed on the host";
  return NULL;
}

void captured_step_free(captured_step *k) {
  apex_captured_step_destroy(k->cs);
  long n = k->c ? k->c->accum : 0;
  for (long i = 0; i < n; i++) {
    if (k->ids) apex_index_destroy(k->ids[i]);
    if (k->targets) apex_index_destroy(k->targets[i]);
    if (k->x) device_batch_free(&k->x[i]);
    if (k->loss) apex_tensor_destroy(k->loss[i]);
  }
  free(k->ids);
  free(k->targets);
  free(k->x);
  free(k->xt);
  free(k->loss);
  apex_graph_destroy(k->g);
  *k = (captured_step){0};
}

int captured_step_init(captured_step *k, step_ctx *c, int measure_norm) {
  *k = (captured_step){.c = c, .measure_norm = measure_norm};
  size_t n = (size_t)c->accum;
  int gpt = c->tm->kind == MODEL_GPT;
  k->ids = calloc(n, sizeof *k->ids);
  k->targets = calloc(n, sizeof *k->targets);
  k->x = calloc(n, sizeof *k->x);
  k->xt = calloc(n, sizeof *k->xt);
  k->loss = calloc(n, sizeof *k->loss);
  int made = k->ids && k->targets && k->x && k->xt && k->loss;
  int64_t B = c->B, H = c->d->in_h, W = c->d->in_w;
  for (size_t i = 0; made && i < n; i++) {
    if (gpt) {
      const int64_t shape[2] = {B, c->T};
      made = (k->ids[i] = apex_index_create_on(c->dev, 2, shape, c->tm->vocab)) != NULL &&
             (k->targets[i] = apex_index_create_on(c->dev, 2, shape, c->tm->vocab)) != NULL;
    } else {
      made = (k->targets[i] = apex_index_create_on(c->dev, 1, &B, c->tm->classes)) != NULL &&
             (c->tm->kind == MODEL_MLP ? device_batch_create(&k->x[i], c->dev, 2, (int64_t[]){B, H * W})
                                       : device_batch_create(&k->x[i], c->dev, 4, (int64_t[]){B, 1, H, W})) == 0;
    }
    made = made && (k->loss[i] = apex_tensor_create_on(c->dev, APEX_F32, 0, NULL)) != NULL;
  }
  /* O1's autocast is on for the graphs amp prepared */
  made = made && (k->g = apex_graph_create_on(c->dev)) != NULL && apex_amp_prepare_graph(c->amp, k->g) == APEX_OK;
  if (!made) {
    fprintf(stderr, "apex-train: cannot make the captured step's buffers: %s\n", one_line(apex_last_error()));
    captured_step_free(k);
    return 1;
  }
  /* skipped steps are counted from here: a resumed run's scaler starts with its checkpoint's count */
  k->skipped = apex_loss_scaler_get_state(apex_amp_loss_scaler(c->amp, 0)).skipped;
  return 0;
}

/* The step function: what a replay repeats. It reads the batch from k's indexes and tensors only and
 * reads nothing back to the host. The gradients are zeroed first, not last as the eager step does, so
 * that they outlive the step for the norm the log shows (captured_step_run); the optimizer then sees
 * the same gradients as the eager step's, whose zeroing is the end of the step before. */
static apex_status step_fn(void *ctx) {
  captured_step *k = ctx;
  step_ctx *c = k->c;
  k->runs++;
  apex_amp_backward_options bo = {0};
  apex_status st = apex_amp_zero_grad(c->amp);
  for (long i = 0; i < c->accum && st == APEX_OK; i++) {
    apex_var *loss = c->tm->kind == MODEL_GPT ? model_loss_text_index(c->tm, k->g, k->ids[i], k->targets[i])
                                              : model_loss_images_index(c->tm, c->amp, k->g, k->xt[i], k->targets[i]);
    st = loss ? apex_tensor_copy(k->loss[i], apex_var_value(loss)) : apex_last_status();
    if (st == APEX_OK) st = step_backward(c, k->g, loss, i, &bo);
    else apex_graph_reset(k->g);
  }
  if (st == APEX_OK) st = apex_amp_step(c->amp, c->opt, NULL);
  if (st == APEX_OK && k->runs == 1) k->first_ok = 1;
  return st;
}

/* Sets the step's inputs to micro-batches pos * accum .. of the epoch: the values change, the places
 * stay. On a GPU the copies are queued before the replay that reads them. */
static apex_status load_batch(captured_step *k, long pos) {
  step_ctx *c = k->c;
  apex_status st = APEX_OK;
  for (long i = 0; i < c->accum && st == APEX_OK; i++) {
    size_t micro = (size_t)(pos * c->accum + i);
    if (c->tm->kind == MODEL_GPT) {
      dataset_text_batch(c->d, micro, c->B, c->ids, c->labels);
      st = apex_index_set(k->ids[i], c->ids, c->B * c->T);
      if (st == APEX_OK) st = apex_index_set(k->targets[i], c->labels, c->B * c->T);
    } else {
      dataset_image_batch(c->d, micro, c->B, device_batch_host(&k->x[i]), c->labels);
      st = (k->xt[i] = device_batch_upload(&k->x[i])) != NULL ? apex_index_set(k->targets[i], c->labels, c->B) : apex_last_status();
    }
  }
  return st;
}

/* The capture of the run's first step; when it fails on a device after the step's first run worked,
 * that run stands as the step and the run goes on eagerly. */
static apex_status capture(captured_step *k, long step) {
  step_ctx *c = k->c;
  apex_status st = apex_step_capture(c->dev, step_fn, k, &(apex_capture_options){&c->opt, 1}, &k->cs);
  if (st == APEX_OK || !k->first_ok) return st;
  fprintf(stderr, "apex-train: the step cannot be captured on this device (%s); step %ld ran, the steps after it run eagerly\n",
          one_line(apex_last_error()), step);
  apex_graph_reset(k->g); /* a recording broken midway leaves its nodes */
  k->eager = 1;
  return APEX_OK;
}

int captured_step_run(captured_step *k, long pos, long step, step_result *out) {
  step_ctx *c = k->c;
  apex_status st = load_batch(k, pos);
  if (st != APEX_OK) {
    fprintf(stderr, "apex-train: the batch of step %ld: %s\n", step, one_line(apex_last_error()));
    return 1;
  }
  st = k->cs ? apex_step_replay(k->cs) : capture(k, step);
  if (st != APEX_OK) {
    fprintf(stderr, "apex-train: step %ld failed: %s\n", step, one_line(apex_last_error()));
    return 1;
  }
  /* The losses in micro-batch order, the eager step's sum; the first read waits for the device. */
  double sum = 0;
  for (long i = 0; i < c->accum; i++) sum += apex_tensor_get(k->loss[i], 0);
  for (long i = 0; i < c->accum && c->tm->kind != MODEL_GPT; i++) device_batch_settled(&k->x[i]);
  /* The norm the log shows, measured here, outside the recorded work, from the gradients the step left
   * (it zeroes them at its start): the optimizer reads them without writing them, so they are the ones
   * the eager step measures before its optimizer step. A bound no finite norm exceeds sets no clipping
   * coefficient, so the next step is not changed by the measure. Only a log reads it: without one the
   * pass over the gradients (out of the caches by now, after the optimizer's) is not made. */
  float norm = NAN;
  if (k->measure_norm && apex_amp_clip_grad_norm(c->amp, c->opt, FLT_MAX, &norm) != APEX_OK) {
    fprintf(stderr, "apex-train: gradient norm at step %ld: %s\n", step, one_line(apex_last_error()));
    return 1;
  }
  /* amp counts a skipped step in the loss scaler's state, where the step leaves it (read after it) */
  int64_t skipped = apex_loss_scaler_get_state(apex_amp_loss_scaler(c->amp, 0)).skipped;
  out->loss = sum / (double)c->accum;
  out->grad_norm = norm;
  out->skipped = skipped > k->skipped;
  k->skipped = skipped;
  /* the eager steps after a failed capture start from zeroed gradients, as after an eager step */
  if (k->eager && apex_amp_zero_grad(c->amp) != APEX_OK) {
    fprintf(stderr, "apex-train: step %ld: %s\n", step, one_line(apex_last_error()));
    return 1;
  }
  return 0;
}
