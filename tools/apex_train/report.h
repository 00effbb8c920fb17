/* report.h: what apex-train tells the user while it trains: a progress bar on an interactive
 * terminal (progress.h), plain lines otherwise, and optionally JSON lines to a log file. Every write
 * to the log is checked: a full disk stops the run rather than leaving a silent hole in the log. */
#ifndef APEX_TRAIN_REPORT_H
#define APEX_TRAIN_REPORT_H

#include <stdio.h>

typedef struct report report;

typedef struct report_point {
  long epoch, epochs;
  long step, total_steps;    /* steps from the start of training */
  double loss;               /* may be Inf or NaN: written as null in the log */
  double loss_scale;
  long skipped;              /* skipped steps so far */
  int step_skipped;          /* this step was skipped (an overflow or a non-finite loss) */
  double lr;                 /* the learning rate of this step */
  double grad_norm;          /* global norm of the unscaled f32 gradients, before clipping */
  double step_s;             /* seconds per step over a recent window (progress_rate); 0: unknown */
  long samples_per_step;     /* the global batch */
  long tokens_per_step;      /* gpt: the global batch's tokens; 0 for image models */
  double elapsed_s;          /* training time since the run began, resumed runs included */
  double optim_bytes;     /* --zero: the optimizer state this rank holds; 0 otherwise */
  double device_bytes, device_peak_bytes; /* --device cuda: the GPU memory apex holds, and its peak; 0 on the CPU */
} report_point;

/* A reporter writing to out (a bar when it is an interactive terminal) and, when log_path is not
 * NULL, JSON lines to that file (appended to when resuming). NULL with a message on stderr when the
 * log cannot be opened. */
report *report_create(FILE *out, const char *log_path, int append);
/* Records one step; the bar is redrawn at most ten times a second, plain lines every 100 steps and
 * at the last. Non-zero, with one line on stderr, when the log cannot be written. */
int report_step(report *r, const report_point *p);
/* Logs an evaluation after `step` steps as its own JSON line: {"step", "eval_loss", "eval_accuracy"}
 * for images (the validation split's, or the test set's without one), {"step", "eval_loss",
 * "eval_perplexity"} for the GPT (text: true); after report_finish, appended to the closed log. Non-zero, with one line on stderr, when the log cannot
 * be written. */
struct eval_result;
int report_eval(report *r, long step, int text, const struct eval_result *e);
/* Logs the test set's figures of an image model that evaluates a validation split during training
 * (then report_eval's lines are the validation split's): {"step", "test_loss", "test_accuracy"}, a
 * line the plot leaves out. Same convention as report_eval. */
int report_test(report *r, long step, const struct eval_result *e);
/* Prints one line of news (a save, a stop) without breaking the bar: the bar's line is cleared
 * first and redrawn at the next step. */
void report_message(report *r, const char *fmt, ...);
/* Ends the bar's line and closes the log. Non-zero, with one line on stderr, when the log's last
 * writes failed. */
int report_finish(report *r);
void report_destroy(report *r);

/* msg with its line breaks turned into spaces (a static buffer, overwritten by the next call), so
 * that every error apex-train prints is one line. */
const char *one_line(const char *msg);

#endif
