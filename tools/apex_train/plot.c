/* plot.c: SVG loss curves from JSON-lines logs (plot.h). */
#include "plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One log's points. */
typedef struct series {
  const char *name;
  double *step, *loss, *scale; /* training steps; loss NaN where the log has null */
  size_t n, cap;
  double *estep, *eloss;       /* evaluations */
  size_t ne, ecap;
  long *skipped;               /* steps that were skipped */
  size_t ns, scap;
} series;

static int grow(void **p, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t c = *cap ? 2 * *cap : 256;
  void *q = realloc(*p, c * elem);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}

static void series_free(series *s) {
  free(s->step);
  free(s->loss);
  free(s->scale);
  free(s->estep);
  free(s->eloss);
  free(s->skipped);
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads one log; one line on stderr and non-zero on failure. */
static int read_log(const char *path, series *s) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "apex-train plot: cannot read %s: %s\n", path, strerror(errno));
    return 1;
  }
  s->name = path;
  char *line = NULL;
  size_t lcap = 0;
  long lineno = 0;
  int rc = 0;
  while (getline(&line, &lcap, f) > 0 && rc == 0) {
    lineno++;
    if (strspn(line, " \t\r\n") == strlen(line)) continue;
    cJSON *o = cJSON_Parse(line);
    double step = o ? num(o, "step") : NAN;
    if (!cJSON_IsObject(o) || !(step >= 0)) {
      fprintf(stderr, "apex-train plot: %s line %ld is not an apex-train log line (a JSON object with a \"step\")\n", path, lineno);
      rc = 1;
    } else if (cJSON_GetObjectItemCaseSensitive(o, "eval_loss")) {
      size_t cap = s->ecap; /* the two arrays grow together */
      if (grow((void **)&s->estep, &cap, s->ne, sizeof(double)) || (cap = s->ecap, grow((void **)&s->eloss, &cap, s->ne, sizeof(double))))
        rc = 1;
      else {
        s->ecap = cap;
        s->estep[s->ne] = step;
        s->eloss[s->ne++] = num(o, "eval_loss");
      }
    } else if (cJSON_GetObjectItemCaseSensitive(o, "loss")) {
      size_t cap = s->cap; /* the three arrays grow together */
      if (grow((void **)&s->step, &cap, s->n, sizeof(double)) || (cap = s->cap, grow((void **)&s->loss, &cap, s->n, sizeof(double))) ||
          (cap = s->cap, grow((void **)&s->scale, &cap, s->n, sizeof(double))))
        rc = 1;
      else {
        s->cap = cap;
        s->step[s->n] = step;
        s->loss[s->n] = num(o, "loss");
        s->scale[s->n++] = num(o, "loss_scale");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "step_skipped"))) {
          if (grow((void **)&s->skipped, &s->scap, s->ns, sizeof(long))) rc = 1;
          else s->skipped[s->ns++] = (long)step;
        }
      }
    }
    if (rc && o && cJSON_IsObject(o) && step >= 0) fprintf(stderr, "apex-train plot: out of memory reading %s\n", path);
    cJSON_Delete(o);
  }
  free(line);
  fclose(f);
  if (rc == 0 && s->n == 0) {
    fprintf(stderr, "apex-train plot: %s has no training steps (is it an apex-train --log file?)\n", path);
    rc = 1;
  }
  return rc;
}

/* The file name without its directories, escaped for XML. */
static void xml_name(FILE *out, const char *path) {
  const char *b = strrchr(path, '/');
  for (const char *c = b ? b + 1 : path; *c; c++) {
    if (*c == '&') fputs("&amp;", out);
    else if (*c == '<') fputs("&lt;", out);
    else if (*c == '>') fputs("&gt;", out);
    else if (*c == '"') fputs("&quot;", out);
    else fputc(*c, out);
  }
}

/* A round tick step for a range: 1, 2 or 5 times a power of ten, about 5 ticks. */
static double tick_step(double range) {
  double raw = range / 5, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

enum { WIDTH = 960, HEIGHT = 540, LEFT = 80, RIGHT = 90, TOP = 40, BOTTOM = 60 };
static const char *const colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

static void draw(FILE *o, series *ss, int n) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY, s0 = INFINITY, s1 = -INFINITY;
  for (int k = 0; k < n; k++) {
    for (size_t i = 0; i < ss[k].n; i++) {
      x0 = fmin(x0, ss[k].step[i]);
      x1 = fmax(x1, ss[k].step[i]);
      if (isfinite(ss[k].loss[i])) y0 = fmin(y0, ss[k].loss[i]), y1 = fmax(y1, ss[k].loss[i]);
      if (ss[k].scale[i] > 0 && isfinite(ss[k].scale[i])) s0 = fmin(s0, log2(ss[k].scale[i])), s1 = fmax(s1, log2(ss[k].scale[i]));
    }
    for (size_t i = 0; i < ss[k].ne; i++)
      if (isfinite(ss[k].eloss[i])) y0 = fmin(y0, ss[k].eloss[i]), y1 = fmax(y1, ss[k].eloss[i]);
  }
  /* The loss-scale axis only where a scale changed (bf16 and static scales draw none). */
  int scale_moves = 0;
  for (int k = 0; k < n; k++)
    for (size_t i = 1; i < ss[k].n; i++)
      if (ss[k].scale[i] != ss[k].scale[0] && !(isnan(ss[k].scale[i]) && isnan(ss[k].scale[0]))) scale_moves = 1;
  if (!(y0 <= y1)) y0 = 0, y1 = 1; /* every loss null */
  if (!(s0 <= s1)) s0 = 0, s1 = 0;
  /* Flat ranges get a margin so that nothing divides by zero and the line sits mid-plot. */
  if (x1 == x0) x0 -= 1, x1 += 1;
  double ypad = (y1 - y0) * 0.05;
  if (ypad == 0) ypad = fabs(y0) * 0.1 + 0.1;
  y0 = fmax(0, y0 - ypad);
  y1 += ypad;
  s0 = floor(s0) - 1;
  s1 = ceil(s1) + 1;
  const double pw = WIDTH - LEFT - RIGHT, ph = HEIGHT - TOP - BOTTOM;
#define PX(x) (LEFT + ((x) - x0) / (x1 - x0) * pw)
#define PY(y) (TOP + (y1 - (y)) / (y1 - y0) * ph)
#define PS(s) (TOP + (s1 - (s)) / (s1 - s0) * ph)
  fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
          WIDTH, HEIGHT, WIDTH, HEIGHT);
  fprintf(o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(o, "<rect class=\"plot-area\" x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\" "
             "data-x-min=\"%.17g\" data-x-max=\"%.17g\" data-y-min=\"%.17g\" data-y-max=\"%.17g\" data-s-min=\"%.17g\" data-s-max=\"%.17g\"/>\n",
          LEFT, TOP, pw, ph, x0, x1, y0, y1, s0, s1);
  /* Axes: step below, loss left, log2 loss scale right. */
  double dx = tick_step(x1 - x0), dy = tick_step(y1 - y0), ds = fmax(1, round(tick_step(s1 - s0)));
  for (double t = ceil(x0 / dx) * dx; t <= x1 + 1e-9; t += dx)
    fprintf(o, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
            PX(t), TOP, PX(t), HEIGHT - BOTTOM, PX(t), HEIGHT - BOTTOM + 16, t);
  for (double t = ceil(y0 / dy) * dy; t <= y1 + 1e-12; t += dy)
    fprintf(o, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%.3g</text>\n",
            LEFT, PY(t), WIDTH - RIGHT, PY(t), LEFT - 6, PY(t) + 4, t);
  for (double t = ceil(s0 / ds) * ds; scale_moves && t <= s1 + 1e-9; t += ds)
    fprintf(o, "<text x=\"%d\" y=\"%.2f\" fill=\"#666\">2^%g</text>\n", WIDTH - RIGHT + 6, PS(t) + 4, t == 0 ? 0.0 : t);
  fprintf(o, "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">step</text>\n", LEFT + pw / 2, HEIGHT - 18);
  fprintf(o, "<text transform=\"translate(20 %.0f) rotate(-90)\" text-anchor=\"middle\">loss (solid: train, dashed: eval)</text>\n", TOP + ph / 2);
  if (scale_moves)
    fprintf(o, "<text transform=\"translate(%d %.0f) rotate(90)\" text-anchor=\"middle\" fill=\"#666\">loss scale (dotted)</text>\n", WIDTH - 20,
            TOP + ph / 2);
  for (int k = 0; k < n; k++) {
    const series *s = &ss[k];
    const char *c = colours[k % 8];
    fprintf(o, "<polyline class=\"train-loss\" data-log=\"");
    xml_name(o, s->name);
    /* Earlier logs are drawn wider, so that runs whose curves coincide (opt levels often do) still
     * show every colour. */
    /* The raw loss light, its moving average (the mean of the last w finite losses) over it. */
    fprintf(o, "\" fill=\"none\" stroke=\"%s\" stroke-opacity=\"0.35\" stroke-width=\"%.1f\" points=\"", c, 1.5 + 1.5 * (n - 1 - k));
    for (size_t i = 0; i < s->n; i++)
      if (isfinite(s->loss[i])) fprintf(o, "%s%.2f,%.2f", i ? " " : "", PX(s->step[i]), PY(s->loss[i]));
    fprintf(o, "\"/>\n");
    size_t w = s->n / 50 < 2 ? 2 : s->n / 50 > 100 ? 100 : s->n / 50, got = 0;
    if (s->n >= 20) {
      fprintf(o, "<polyline class=\"train-loss-avg\" data-window=\"%zu\" data-log=\"", w);
      xml_name(o, s->name);
      fprintf(o, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"", c, 1.5 + 1.5 * (n - 1 - k));
      double sum = 0, ring[100];
      for (size_t i = 0; i < s->n; i++) {
        if (!isfinite(s->loss[i])) continue;
        if (got >= w) sum -= ring[got % w];
        ring[got % w] = s->loss[i];
        sum += s->loss[i];
        got++;
        fprintf(o, "%s%.2f,%.2f", got > 1 ? " " : "", PX(s->step[i]), PY(sum / (double)(got < w ? got : w)));
      }
      fprintf(o, "\"/>\n");
    }
    if (scale_moves) {
      fprintf(o, "<polyline class=\"loss-scale\" data-log=\"");
      xml_name(o, s->name);
      fprintf(o, "\" fill=\"none\" stroke=\"%s\" stroke-opacity=\"0.6\" stroke-dasharray=\"1,3\" points=\"", c);
      for (size_t i = 0; i < s->n; i++)
        if (s->scale[i] > 0 && isfinite(s->scale[i])) fprintf(o, "%s%.2f,%.2f", i ? " " : "", PX(s->step[i]), PS(log2(s->scale[i])));
      fprintf(o, "\"/>\n");
    }
    if (s->ne) {
      fprintf(o, "<polyline class=\"eval-loss\" data-log=\"");
      xml_name(o, s->name);
      fprintf(o, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"6,4\" points=\"", c);
      for (size_t i = 0; i < s->ne; i++)
        if (isfinite(s->eloss[i])) fprintf(o, "%s%.2f,%.2f", i ? " " : "", PX(s->estep[i]), PY(s->eloss[i]));
      fprintf(o, "\"/>\n");
    }
    /* Skipped steps: a cross on the plot's top edge, where it hides no curve. */
    for (size_t i = 0; i < s->ns; i++) {
      double x = PX((double)s->skipped[i]);
      fprintf(o, "<path class=\"skipped\" data-step=\"%ld\" d=\"M%.2f,%d l6,6 m0,-6 l-6,6\" transform=\"translate(-3,%d)\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
              s->skipped[i], x, TOP, 2 + 8 * k, c);
    }
    /* Legend: one row per log in the plot's top right corner. */
    int lx = WIDTH - RIGHT - 330, ly = TOP + 22 + 16 * k;
    fprintf(o, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/><text class=\"legend\" x=\"%d\" y=\"%d\">", lx, ly - 4,
            lx + 20, ly - 4, c, lx + 24, ly);
    xml_name(o, s->name);
    fprintf(o, " (%zu steps, %zu skipped)</text>\n", s->n, s->ns);
  }
  fprintf(o, "</svg>\n");
#undef PX
#undef PY
#undef PS
}

int plot_logs(const char *const *logs, int n, const char *svg_path) {
  series *ss = calloc((size_t)n, sizeof *ss);
  if (!ss) {
    fprintf(stderr, "apex-train plot: out of memory\n");
    return 1;
  }
  int rc = 0;
  for (int k = 0; k < n && rc == 0; k++) rc = read_log(logs[k], &ss[k]);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);
  FILE *o = rc ? NULL : fopen(tmp, "w");
  if (!rc && !o) {
    fprintf(stderr, "apex-train plot: cannot write %s: %s\n", svg_path, strerror(errno));
    rc = 1;
  }
  if (o) {
    draw(o, ss, n);
    int bad = ferror(o);
    bad = fclose(o) != 0 || bad;
    if (bad || rename(tmp, svg_path) != 0) {
      fprintf(stderr, "apex-train plot: cannot write %s: %s\n", svg_path, strerror(errno));
      remove(tmp);
      rc = 1;
    }
  }
  for (int k = 0; k < n; k++) series_free(&ss[k]);
  free(ss);
  return rc;
}

int plot_path_for(const char *log, char *out, size_t size) {
  static const char *const exts[] = {".jsonl", ".json", ".log"};
  size_t len = strlen(log);
  for (int i = 0; i < 3; i++) {
    size_t m = strlen(exts[i]);
    if (len > m && strcmp(log + len - m, exts[i]) == 0) {
      len -= m;
      break;
    }
  }
  if ((size_t)snprintf(out, size, "%.*s.svg", (int)len, log) >= size) {
    fprintf(stderr, "apex-train: the log's name %s is too long for the plot's\n", log);
    return 1;
  }
  return 0;
}

int plot_main(int argc, char **argv) {
  const char *out = NULL;
  int first = 1;
  if (argc > 2 && strcmp(argv[1], "-o") == 0) {
    out = argv[2];
    first = 3;
  }
  const char *usage = "usage: apex-train plot [-o OUT.svg] LOG.jsonl... (draws the logs' loss curves; default OUT: the first log's name with .svg)";
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    printf("%s\n", usage);
    return 0;
  }
  if (first >= argc) {
    fprintf(stderr, "apex-train plot: no log given; %s\n", usage);
    return 2;
  }
  for (int i = first; i < argc; i++)
    if (argv[i][0] == '-') {
      fprintf(stderr, "apex-train plot: unknown option %s (usage: apex-train plot [-o OUT.svg] LOG...)\n", argv[i]);
      return 2;
    }
  char path[4200];
  if (!out) {
    if (plot_path_for(argv[first], path, sizeof path) != 0) return 2;
    out = path;
  }
  if (plot_logs((const char *const *)argv + first, argc - first, out) != 0) return 1;
  printf("apex-train plot: %s\n", out);
  return 0;
}
