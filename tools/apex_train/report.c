/* report.c: progress bar, plain lines and JSON-lines log for apex-train. */
#define _POSIX_C_SOURCE 200809L
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "evaluate.h"
#include <unistd.h>

#include "progress.h"

struct report {
  FILE *out;
  FILE *log;
  const char *log_path;
  int tty;
  double last_draw;
  int drawn;
};

report *report_create(FILE *out, const char *log_path, int append) {
  report *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->out = out;
  r->tty = progress_interactive(fileno(out));
  r->last_draw = -1;
  if (log_path) {
    r->log = fopen(log_path, append ? "a" : "w");
    if (!r->log) {
      fprintf(stderr, "apex-train: --log %s: cannot open it for writing: %s\n", log_path, strerror(errno));
      free(r);
      return NULL;
    }
    r->log_path = log_path;
  }
  return r;
}

/* What a line shows, with the rates derived from the recent step time. */
static progress_point to_progress(const report_point *p) {
  progress_point q = {.epoch = p->epoch, .epochs = p->epochs, .step = p->step, .total_steps = p->total_steps,
                      .loss = p->loss, .loss_scale = p->loss_scale, .skipped = p->skipped, .eta_s = -1,
                      .device_gb = p->device_bytes / 1e9, .device_peak_gb = p->device_peak_bytes / 1e9,
                      .optim_mb = p->optim_bytes / 1e6};
  if (p->step_s > 0) {
    q.samples_per_s = (double)p->samples_per_step / p->step_s;
    q.tokens_per_s = (double)p->tokens_per_step / p->step_s;
    q.ms_per_step = 1e3 * p->step_s;
    q.eta_s = p->step_s * (double)(p->total_steps - p->step);
  }
  return q;
}

/* A JSON number, or null for Inf and NaN (which JSON cannot spell). */
static void json_number(FILE *f, const char *key, const char *fmt, double v) {
  fprintf(f, ",\"%s\":", key);
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs("null", f);
}

static int log_failed(report *r) {
  fprintf(stderr, "apex-train: --log %s: cannot write: %s\n", r->log_path, strerror(errno ? errno : EIO));
  fclose(r->log);
  r->log = NULL;
  return 1;
}

static int write_log(report *r, const report_point *p, const progress_point *q) {
  FILE *f = r->log;
  errno = 0;
  fprintf(f, "{\"step\":%ld,\"epoch\":%ld", p->step, p->epoch);
  json_number(f, "loss", "%.9g", p->loss);
  json_number(f, "loss_scale", "%.9g", p->loss_scale);
  fprintf(f, ",\"skipped\":%ld,\"step_skipped\":%s", p->skipped, p->step_skipped ? "true" : "false");
  json_number(f, "lr", "%.9g", p->lr);
  json_number(f, "grad_norm", "%.9g", p->grad_norm);
  json_number(f, "samples_per_s", "%.3f", q->samples_per_s);
  if (p->tokens_per_step > 0) json_number(f, "tokens_per_s", "%.3f", q->tokens_per_s);
  json_number(f, "ms_per_step", "%.3f", q->ms_per_step);
  json_number(f, "elapsed_s", "%.3f", p->elapsed_s);
  if (p->device_peak_bytes > 0) {
    json_number(f, "gpu_mem_gb", "%.4f", q->device_gb);
    json_number(f, "gpu_peak_gb", "%.4f", q->device_peak_gb);
  }
  fputs("}\n", f);
  /* fprintf's own errors are sticky in ferror; the flush reports a full disk. */
  if (fflush(f) != 0 || ferror(f)) return log_failed(r);
  return 0;
}

static void draw_bar(report *r, const progress_point *q) {
  char line[512];
  progress_format(line, sizeof line, q, progress_terminal_width(fileno(r->out)), 1);
  /* \033[K erases what a longer previous line (or a message) left to the right. */
  fprintf(r->out, "\r%s\033[K", line);
  fflush(r->out);
  r->drawn = 1;
}

int report_step(report *r, const report_point *p) {
  progress_point q = to_progress(p);
  if (r->log && write_log(r, p, &q) != 0) return 1;
  if (r->tty) {
    if (r->last_draw < 0 || p->elapsed_s - r->last_draw >= 0.1 || p->elapsed_s < r->last_draw || p->step == p->total_steps) {
      draw_bar(r, &q);
      r->last_draw = p->elapsed_s;
    }
  } else if (p->step % 100 == 0 || p->step == p->total_steps) {
    char line[512];
    progress_format(line, sizeof line, &q, (int)sizeof line, 0); /* every field: a file has no width */
    fprintf(r->out, "%s\n", line);
    fflush(r->out);
  }
  return 0;
}

/* One evaluation line: {"step", "<prefix>loss", "<prefix><metric>"}. */
static int log_eval(report *r, long step, const char *loss_key, const char *metric_key, double loss, double metric) {
  if (!r->log_path) return 0;
  FILE *f = r->log ? r->log : fopen(r->log_path, "a");
  errno = 0;
  int bad = !f;
  if (f) {
    fprintf(f, "{\"step\":%ld", step);
    json_number(f, loss_key, "%.9g", loss);
    json_number(f, metric_key, "%.9g", metric);
    fputs("}\n", f);
    bad = fflush(f) != 0 || ferror(f);
  }
  if (r->log) return bad ? log_failed(r) : 0;
  int e2 = errno;
  if (f) bad = fclose(f) != 0 || bad;
  if (bad) fprintf(stderr, "apex-train: --log %s: cannot write: %s\n", r->log_path, strerror(e2 ? e2 : errno ? errno : EIO));
  return bad;
}

int report_eval(report *r, long step, int text, const eval_result *e) {
  return log_eval(r, step, "eval_loss", text ? "eval_perplexity" : "eval_accuracy", e->loss, text ? e->perplexity : e->accuracy);
}

int report_test(report *r, long step, const eval_result *e) { return log_eval(r, step, "test_loss", "test_accuracy", e->loss, e->accuracy); }

void report_message(report *r, const char *fmt, ...) {
  if (r->drawn) fputs("\r\033[K", r->out);
  r->drawn = 0;
  r->last_draw = -1;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(r->out, fmt, ap);
  va_end(ap);
  fputc('\n', r->out);
  fflush(r->out);
}

int report_finish(report *r) {
  if (r->tty && r->drawn) fputc('\n', r->out);
  r->drawn = 0;
  if (!r->log) return 0;
  errno = 0;
  int bad = ferror(r->log) || fflush(r->log) != 0;
  int e = errno;
  bad = fclose(r->log) != 0 || bad;
  r->log = NULL;
  if (bad) fprintf(stderr, "apex-train: --log %s: cannot write: %s\n", r->log_path, strerror(e ? e : errno ? errno : EIO));
  return bad;
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
