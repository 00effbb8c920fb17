/* report.h: what apex-train tells the user while it trains: a progress bar on a terminal, plain
 * lines otherwise, and optionally JSON lines to a log file. */
#ifndef APEX_TRAIN_REPORT_H
#define APEX_TRAIN_REPORT_H

#include <stdio.h>

typedef struct report report;

typedef struct report_point {
  long epoch, epochs;
  long step, total_steps;    /* steps from the start of training */
  long first_step;           /* where this process started (resumed runs), for the ETA */
  double loss;
  double loss_scale;
  long skipped;              /* skipped steps so far */
  int step_skipped;          /* this step was skipped (an overflow) */
  double lr;                 /* the learning rate of this step */
  double grad_norm;          /* global norm of the unscaled f32 gradients, before clipping */
  double samples_per_s;
  double tokens_per_s;       /* gpt; 0 otherwise */
  double elapsed_s;
} report_point;

/* A reporter writing to out (a bar when it is a terminal) and, when log_path is not NULL, JSON lines
 * to that file (appended to when resuming). NULL with a message on stderr when the log cannot be
 * opened. */
report *report_create(FILE *out, const char *log_path, int append);
/* Records one step; the bar is redrawn at most ten times a second, plain lines every `every` steps. */
void report_step(report *r, const report_point *p);
/* Logs an evaluation after `step` steps as its own JSON line: {"step", "eval_loss", "eval_accuracy"}
 * for images, {"step", "eval_loss", "eval_perplexity"} for the GPT (text: true). */
struct eval_result;
void report_eval(report *r, long step, int text, const struct eval_result *e);
/* Ends the bar's line. */
void report_finish(report *r);
void report_destroy(report *r);

/* msg with its line breaks turned into spaces (a static buffer, overwritten by the next call), so
 * that every error apex-train prints is one line. */
const char *one_line(const char *msg);

#endif
