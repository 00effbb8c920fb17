/* progress.c: the progress line fitted to a width, the terminal's width and interactivity, and the
 * recent step rate (progress.h). */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

enum { F_BAR, F_EPOCH, F_STEP, F_LOSS, F_SCALE, F_SKIPPED, F_RATE, F_MS, F_ETA, F_MEM, F_OPT, NFIELDS };

static void format_eta(char *out, size_t cap, double s) {
  if (!(s >= 0) || s > 1e8) {
    snprintf(out, cap, "ETA ?");
    return;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, cap, "ETA %ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(out, cap, "ETA %ldm%02lds", t / 60, t % 60);
  else snprintf(out, cap, "ETA %lds", t);
}

size_t progress_format(char *buf, size_t cap, const progress_point *p, int width, int with_bar) {
  char f[NFIELDS][64];
  snprintf(f[F_EPOCH], 64, "epoch %ld/%ld", p->epoch, p->epochs);
  snprintf(f[F_STEP], 64, "step %ld/%ld", p->step, p->total_steps);
  snprintf(f[F_LOSS], 64, "loss %.4f", p->loss);
  snprintf(f[F_SCALE], 64, "scale %g", p->loss_scale);
  snprintf(f[F_SKIPPED], 64, "skipped %ld", p->skipped);
  if (p->tokens_per_s > 0) snprintf(f[F_RATE], 64, "%.0f tok/s", p->tokens_per_s);
  else snprintf(f[F_RATE], 64, "%.0f samples/s", p->samples_per_s);
  snprintf(f[F_MS], 64, "%.1f ms/step", p->ms_per_step);
  format_eta(f[F_ETA], 64, p->eta_s);
  f[F_MEM][0] = 0;
  if (p->device_peak_gb > 0) snprintf(f[F_MEM], 64, "gpu %.2f/%.2f GB", p->device_gb, p->device_peak_gb);
  f[F_OPT][0] = 0;
  if (p->optim_mb > 0) snprintf(f[F_OPT], 64, "optim %.1f MB/rank", p->optim_mb);
  f[F_BAR][0] = 0;

  /* Most useful first; the bar takes what is left. */
  static const int priority[] = {F_STEP, F_LOSS, F_ETA, F_EPOCH, F_RATE, F_MS, F_SCALE, F_SKIPPED, F_MEM, F_OPT};
  int keep[NFIELDS] = {0};
  long avail = width > 1 ? width - 1 : 0, used = 0;
  for (size_t i = 0; i < sizeof priority / sizeof priority[0]; i++) {
    long len = (long)strlen(f[priority[i]]), need = len + (used ? 1 : 0);
    if (len == 0) continue; /* a field with nothing to show (no GPU) */
    if (i == 0 && need > avail) break; /* no line without the step: it is cut below */
    if (used + need <= avail) {
      keep[priority[i]] = 1;
      used += need;
    }
  }
  long left = avail - used - (used ? 1 : 0); /* room for "[...]" after a separator */
  if (with_bar && left >= 12) {
    int inner = left - 2 > 30 ? 30 : (int)(left - 2);
    double frac = p->total_steps > 0 ? (double)p->step / (double)p->total_steps : 0;
    int fill = (int)(frac * inner + 0.5);
    f[F_BAR][0] = '[';
    for (int i = 0; i < inner; i++) f[F_BAR][1 + i] = i < fill ? '#' : '.';
    f[F_BAR][inner + 1] = ']';
    f[F_BAR][inner + 2] = 0;
    keep[F_BAR] = 1;
  }

  size_t at = 0;
  if (cap == 0) return 0;
  buf[0] = 0;
  for (int i = 0; i < NFIELDS; i++) {
    if (!keep[i]) continue;
    int w = snprintf(buf + at, cap - at, "%s%s", at ? " " : "", f[i]);
    if (w < 0 || (size_t)w >= cap - at) {
      at = cap - 1;
      break;
    }
    at += (size_t)w;
  }
  if (at == 0) { /* even "step S/N" is too wide: cut it */
    snprintf(buf, cap, "%s", f[F_STEP]);
    at = strlen(buf);
    if ((long)at > avail) buf[at = (size_t)avail] = 0;
  }
  return at;
}

int progress_terminal_width(int fd) {
  struct winsize ws;
  if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char *c = getenv("COLUMNS");
  if (c && *c) {
    char *end;
    long v = strtol(c, &end, 10);
    if (!*end && v > 0 && v < 100000) return (int)v;
  }
  return 80;
}

int progress_interactive(int fd) {
  static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_SIZE",
                                              "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"};
  if (!isatty(fd)) return 0;
  for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++) {
    const char *v = getenv(launcher_vars[i]);
    if (v && *v) return 0;
  }
  return 1;
}

void progress_rate_push(progress_rate *r, double t) {
  r->t[r->n % (PROGRESS_WINDOW + 1)] = t;
  r->n++;
}

double progress_rate_step_s(const progress_rate *r) {
  if (r->n < 2) return 0;
  long steps = r->n - 1 < PROGRESS_WINDOW ? r->n - 1 : PROGRESS_WINDOW;
  double newest = r->t[(r->n - 1) % (PROGRESS_WINDOW + 1)], oldest = r->t[(r->n - 1 - steps) % (PROGRESS_WINDOW + 1)];
  return (newest - oldest) / (double)steps;
}
