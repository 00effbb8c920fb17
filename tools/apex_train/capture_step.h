/* capture_step.h: apex-train's captured step (apex/capture.h). The first step of a run is captured,
 * each later one replayed: on a GPU the whole step (the --grad-accum micro-batches' forwards and amp
 * backwards, amp's unscale and overflow check, the optimizer) is one CUDA graph launched once a step;
 * on the CPU the capture runs the step and each replay runs it again, so that the same code trains on
 * every device and the CPU tests exercise it.
 *
 * A replay repeats the recorded work on the values its memory holds, so everything a step reads is
 * in fixed places, set before each replay: per micro-batch an index of the GPT's ids and one of its
 * targets, or an input tensor of images (uploaded through device.h's staging) and an index of their
 * labels; each micro-batch's loss is copied into a fixed device tensor. What the log shows is read
 * after the replay, outside the recorded work: the losses, whether the step was skipped (the loss
 * scaler's count of skipped steps moved), and, for the JSON log, the gradient norm (captured_step_run).
 *
 * The result is the eager step's (step.h) bit for bit: the same calls on the same values, in the same
 * order. A run that cannot capture steps eagerly (captured_step_refusal): --distributed's hooks and
 * --zero agree on an overflow through the host, and --clip-grad-norm's coefficient is computed on the
 * host between the backward and the optimizer. */
#ifndef APEX_TRAIN_CAPTURE_STEP_H
#define APEX_TRAIN_CAPTURE_STEP_H

#include <stdint.h>

#include "apex/apex.h"
#include "apex/capture.h"
#include "apex/index.h"
#include "args.h"
#include "device.h"
#include "step.h"

typedef struct captured_step {
  step_ctx *c;                /* the run's step context: model, amp, optimizer, data, sizes */
  apex_graph *g;              /* the step's own graph: a captured step owns the graphs it records on,
                               * so evaluation and sampling keep using c->g */
  apex_index **ids, **targets; /* per micro-batch: gpt ids and targets [B, T]; images: targets [B] */
  device_batch *x;            /* images, per micro-batch: the host array and the tensor the step reads */
  apex_tensor **xt;           /* images, per micro-batch: that tensor (the same one at every step) */
  apex_tensor **loss;         /* per micro-batch: its loss, f32 [] on the device */
  apex_captured_step *cs;     /* NULL until the first step */
  int64_t skipped;            /* the loss scaler's count of skipped steps after the last step */
  int runs, first_ok;         /* calls of the step function; the first one succeeded */
  int eager;                  /* the capture failed on this device: the run steps eagerly from here */
  int measure_norm;           /* measure the gradient norm after each step (the log shows it) */
} captured_step;

/* Why the run in a cannot use a captured step ("--no-capture", "--clip-grad-norm: ..."), or NULL
 * when it can. */
const char *captured_step_refusal(const train_args *a);

/* Makes the step's buffers and graph for c (allocated by step_ctx_alloc); measure_norm: the run writes
 * a log, which shows each step's gradient norm (otherwise nothing reads it, and step_result.grad_norm
 * is NaN). Non-zero, with one line on stderr, on failure; k is then freed. */
int captured_step_init(captured_step *k, step_ctx *c, int measure_norm);
/* Frees what init made (the captured step first: its graph replays on them). */
void captured_step_free(captured_step *k);

/* Optimizer step `step` (1-based) on micro-batches pos * accum .. pos * accum + accum - 1 of the epoch,
 * as train_step does it: the first call captures, the later ones replay. When the capture fails on a
 * device after the step's first run succeeded, that run is this step, one line on stderr says why the
 * run steps eagerly from now on, and k->eager is set (the caller then calls train_step). Prints one
 * line and returns non-zero on failure. */
int captured_step_run(captured_step *k, long pos, long step, step_result *out);

#endif
