/* report.c: progress bar, plain lines and JSON-lines log for apex-train. */
#define _POSIX_C_SOURCE 200809L
#include "report.h"

#include <math.h>
#include <stdlib.h>

#include "evaluate.h"
#include <unistd.h>

struct report {
  FILE *out;
  FILE *log;
  int tty;
  double last_draw;
  int drawn;
};

report *report_create(FILE *out, const char *log_path, int append) {
  report *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->out = out;
  r->tty = isatty(fileno(out));
  r->last_draw = -1;
  if (log_path) {
    r->log = fopen(log_path, append ? "a" : "w");
    if (!r->log) {
      fprintf(stderr, "apex-train: cannot write the log %s\n", log_path);
      free(r);
      return NULL;
    }
  }
  return r;
}

static void draw_bar(report *r, const report_point *p) {
  const int width = 24;
  double frac = p->total_steps > 0 ? (double)p->step / (double)p->total_steps : 0;
  int fill = (int)(frac * width + 0.5);
  long done = p->step - p->first_step;
  double eta = done > 0 && p->total_steps > p->step ? p->elapsed_s / (double)done * (double)(p->total_steps - p->step) : 0;
  fprintf(r->out, "\r[");
  for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', r->out);
  fprintf(r->out, "] epoch %ld/%ld step %ld/%ld loss %.4f scale %g skipped %ld %.0f samples/s ETA %.0fs   ", p->epoch, p->epochs,
          p->step, p->total_steps, p->loss, p->loss_scale, p->skipped, p->samples_per_s, eta);
  fflush(r->out);
  r->drawn = 1;
}

/* A JSON number, or null for Inf and NaN (which JSON lacks). */
static void json_num(FILE *f, const char *key, double v) {
  if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
  else fprintf(f, ",\"%s\":null", key);
}

void report_step(report *r, const report_point *p) {
  if (r->log) {
    fprintf(r->log, "{\"step\":%ld,\"epoch\":%ld", p->step, p->epoch);
    json_num(r->log, "loss", p->loss);
    json_num(r->log, "loss_scale", p->loss_scale);
    fprintf(r->log, ",\"skipped\":%ld,\"step_skipped\":%s", p->skipped, p->step_skipped ? "true" : "false");
    json_num(r->log, "lr", p->lr);
    json_num(r->log, "grad_norm", p->grad_norm);
    fprintf(r->log, ",\"samples_per_s\":%.3f", p->samples_per_s);
    if (p->tokens_per_s > 0) fprintf(r->log, ",\"tokens_per_s\":%.3f", p->tokens_per_s);
    fprintf(r->log, ",\"elapsed_s\":%.3f}\n", p->elapsed_s);
    fflush(r->log);
  }
  if (r->tty) {
    if (p->elapsed_s - r->last_draw >= 0.1 || p->step == p->total_steps) {
      draw_bar(r, p);
      r->last_draw = p->elapsed_s;
    }
  } else if (p->step % 100 == 0 || p->step == p->total_steps) {
    fprintf(r->out, "epoch %ld/%ld step %ld/%ld loss %.4f loss_scale %g skipped %ld samples/s %.0f elapsed %.1fs\n", p->epoch,
            p->epochs, p->step, p->total_steps, p->loss, p->loss_scale, p->skipped, p->samples_per_s, p->elapsed_s);
    fflush(r->out);
  }
}

void report_eval(report *r, long step, int text, const eval_result *e) {
  if (!r->log) return;
  fprintf(r->log, "{\"step\":%ld", step);
  json_num(r->log, "eval_loss", e->loss);
  json_num(r->log, text ? "eval_perplexity" : "eval_accuracy", text ? e->perplexity : e->accuracy);
  fputs("}\n", r->log);
  fflush(r->log);
}

void report_finish(report *r) {
  if (r->tty && r->drawn) fputc('\n', r->out);
  r->drawn = 0;
}

void report_destroy(report *r) {
  if (!r) return;
  if (r->log) fclose(r->log);
  free(r);
}

const char *one_line(const char *msg) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "%s", msg);
  for (char *c = buf; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  return buf;
}
