/* bench_scaling.c: how a training step scales with the cores, against PyTorch at the same thread
 * counts in the same run.
 *
 * For each model of bench_models.h (mlp, cnn, gpt_c256, gpt_c768) and each of O0 (f32) and O2-bf16:
 *   scaling_<model>_<O0|O2>_t<N>        samples/s (tokens/s for the GPTs) at N threads, for N = 1, 2,
 *                                       4, 8, 16, ... up to the CPUs this process's threads may run on
 *                                       (OpenMP's places, else the affinity mask: apex_threads_cpus) and
 *                                       that count itself; ratio = apex / PyTorch at N threads (f32
 *                                       eager for O0, bf16 autocast for O2), measured one after the other;
 *   scaling_<model>_<O0|O2>_worst_doubling  the least throughput(2N) / throughput(N) over the counts
 *                                       measured (N and 2N both; the last count against its half or
 *                                       less): under 1, more threads were slower; ratio = that / PyTorch's
 *                                       worst doubling in the same run;
 *   scaling curve <model> <level> ...   apex's curve and PyTorch's beside it, one line each, with the
 *                                       ratio and each doubling's gain;
 *   scaling_<model>_<O0|O2>_serial      the step's serial fraction at one thread: the time outside
 *                                       parallel regions over the step's time (see the probe below);
 *   scaling_<model>_<O0|O2>_amdahl_<N>  the bound that fraction puts on the speedup at N = 16, 32, 64
 *                                       threads, 1 / (s + (1 - s) / N), in x; ratio = bound / N.
 *   scaling_<model>_<O0|O2>_regions     the parallel regions a step enters (each a fork and a join);
 *   scaling_<model>_<O0|O2>_tile_bound_16  the speedup at 16 threads that the serial part and the
 *                                       products' tiles allow together (tile_bound), in x; _64 the same
 *                                       at 64 threads (bench/README.md's 64-core estimate);
 *   scaling_tiles <model> <level> ...   every matrix product of the step (m x n x k) with the tiles of
 *                                       its fixed grid, and the fewest tiles a thread gets at 16
 *                                       threads: a grid with fewer tiles than threads leaves threads
 *                                       idle whatever the rest of the step does. Half products are
 *                                       counted in the grid they run in on a bf16 CPU (oneDNN's wide
 *                                       tiles), whatever CPU runs this.
 *
 * The probe. The step runs with apex's thread count at the cores present (at least 2; after a warmup
 * step at that count, so the graph's pools are grown) while every OpenMP parallel region is
 * run on one thread: this program defines GOMP_parallel (libgomp's entry for `omp parallel`, which
 * libapex's regions call), so the library's calls land here, and it passes them on to libgomp's with
 * a team of one, timing each. A region whose `if` clause is false reaches GOMP_parallel with one
 * thread asked for and counts as serial, as it would run at any thread count; one that would take
 * threads counts as parallel. What is left of the step (its code outside regions, and regions that
 * stay serial) is the serial part. Nothing in the library changes for it, and nothing else sees it.
 *
 * Options: --seconds-per-point S (default 0.25: each figure is the best step of at least S seconds,
 * at least one step; a gpt_c768 step at one thread takes seconds, so its points take one step),
 * --max-threads N, --models a,b (names), --no-peer, --half-min-tiles N (half products on oneDNN cut
 * into at least N row tiles, not 16: apex__onednn_set_half_min_tiles; 2 is the grid before issue #33),
 * --half-rows-only (half products' tiles as wide as the product, no column split towards 64 tiles:
 * apex__onednn_set_half_cols(0), the grid issue #33's 16-core run measured as --half-min-tiles 16),
 * --f32-few-tiles (f32 products in the grid they had before the split for many
 * threads: apex__gemm_set_many_tiles(0), to compare the two in one script). The PyTorch peer is bench/peer_nn.py --serve, one
 * process for the whole run (bench_util.h says which Python: bench/run's); without it the apex lines
 * print with ratio=0 peer=missing. Thread counts are exact: following the load is off.
 *
 * Binding. Run as it is and under OMP_PLACES=cores OMP_PROC_BIND=close (tests/gpu/run.sh runs both):
 * OpenMP reads its binding once, at start, so one process measures one way. Under binding every line's
 * name says so (scaling_bound_...), the header names the places, and the peer, started from this
 * process, is bound the same way by its own OpenMP. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apex/apex.h"
#include "apex/threads.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "bench_models.h"
#include "bench_util.h"

/* ---- the probe: libgomp's GOMP_parallel, interposed ----------------------------------------------- */

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn real_parallel;
static int probe_on, probe_depth;
static double probe_in_parallel;
static long probe_regions;
/* the product (index into products[], below) whose region comes next, -1 none */
static int probe_product = -1;
static void probe_product_time(int i, double t);

static void resolve_real_parallel(void) {
  if (!real_parallel) real_parallel = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  if (!real_parallel) {
    fprintf(stderr, "bench_scaling: libgomp's GOMP_parallel not found (OpenMP not GCC's?)\n");
    exit(1);
  }
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
  resolve_real_parallel();
  if (!probe_on || probe_depth) {
    real_parallel(fn, data, probe_on ? 1 : num_threads, flags);
    return;
  }
  /* probe: on the main thread only (every region runs on one thread), nested regions inside pass */
  probe_depth++;
  double t0 = bench_now();
  real_parallel(fn, data, 1, flags);
  double t = bench_now() - t0;
  if (num_threads != 1) probe_in_parallel += t, probe_regions++;
  if (probe_product >= 0) probe_product_time(probe_product, num_threads != 1 ? t : 0);
  probe_product = -1;
  probe_depth--;
}

/* ---- the PyTorch peer ------------------------------------------------------------------------------ */

static FILE *peer_in, *peer_out;
static pid_t peer_pid;

static int peer_start(int max_threads) {
  const char *py = bench_peer_python(), *root = getenv("APEX_ROOT");
  if (!py) return 0;
  char script[4096], threads[16];
  snprintf(script, sizeof script, "%s/bench/peer_nn.py", root ? root : ".");
  snprintf(threads, sizeof threads, "%d", max_threads);
  int to[2], from[2];
  if (pipe(to) || pipe(from)) return 0;
  fflush(stdout);
  peer_pid = fork();
  if (peer_pid == 0) {
    dup2(to[0], STDIN_FILENO);
    dup2(from[1], STDOUT_FILENO);
    close(to[1]), close(from[0]);
    setenv("OMP_NUM_THREADS", threads, 1);
    execl(py, py, script, "--serve", (char *)NULL);
    _exit(1);
  }
  close(to[0]), close(from[1]);
  if (peer_pid < 0) return 0;
  peer_in = fdopen(to[1], "w"), peer_out = fdopen(from[0], "r");
  return peer_in && peer_out;
}

/* The peer's samples/s for model in mode at `threads` threads; 0 when it could not run. */
static double peer_measure(const char *model, const char *mode, int threads, double seconds) {
  if (!peer_in) return 0;
  fprintf(peer_in, "%s %s %d %.3f\n", model, mode, threads, seconds);
  fflush(peer_in);
  char line[128];
  if (!fgets(line, sizeof line, peer_out)) {
    fclose(peer_in), fclose(peer_out);
    peer_in = peer_out = NULL;
    return 0;
  }
  double v = strtod(line, NULL);
  return v > 0 ? v : 0;
}

static void peer_stop(void) {
  if (peer_in) fclose(peer_in);
  if (peer_out) fclose(peer_out);
  if (peer_pid > 0) waitpid(peer_pid, NULL, 0);
}

/* ---- tiles ----------------------------------------------------------------------------------------- */

enum { MAX_PRODUCTS = 64 };
static struct product {
  int m, n, k, half, calls;
  double time; /* seconds its parallel regions took in the probe's step */
} products[MAX_PRODUCTS];
static int n_products;

static void probe_product_time(int i, double t) { products[i].time += t; }

static void observe(int m, int n, int k, apex_dtype a, apex_dtype b) {
  /* a product inside a parallel region (attention's per head) is one task of that region's grid */
  if (omp_get_level() > 0) return;
  int half = a != APEX_F32 || b != APEX_F32;
  for (int i = 0; i < n_products; i++)
    if (products[i].m == m && products[i].n == n && products[i].k == k && products[i].half == half) {
      products[i].calls++;
      probe_product = i;
      return;
    }
  if (n_products < MAX_PRODUCTS) probe_product = n_products, products[n_products++] = (struct product){m, n, k, half, 1, 0};
}

/* The speedup at n threads the probe's step allows once the products' tiles are counted: the serial
 * part stays, each product's parallel time t over T tiles takes t * ceil(T / n) / T (a thread runs
 * whole tiles), the other regions' time divides by n. Half products in the wide grid of a bf16 CPU. */
static double tile_bound(double step, double serial_s, int n) {
  double rest = step - serial_s, t = serial_s;
  for (int i = 0; i < n_products; i++) {
    int ti, tj;
    apex__gemm_grid(products[i].m, products[i].n, products[i].k, products[i].half, &ti, &tj);
    int tiles = ti * tj > 0 ? ti * tj : 1;
    t += products[i].time * (double)((tiles + n - 1) / n) / tiles;
    rest -= products[i].time;
  }
  t += (rest > 0 ? rest : 0) / n;
  return step / t;
}

/* One line listing the step's products and their tiles, with the fewest tiles per thread at 16. */
static void report_tiles(bench_train *r, const char *level) {
  n_products = 0;
  apex__gemm_set_observer(observe);
  bench_train_step(r);
  apex__gemm_set_observer(NULL);
  char buf[4096];
  int len = 0;
  double min_per = 1e30;
  for (int i = 0; i < n_products; i++) {
    int ti, tj;
    apex__gemm_grid(products[i].m, products[i].n, products[i].k, products[i].half, &ti, &tj);
    double per = (double)(ti * tj) / 16.0;
    /* a product under gemm.c's TILE_MIN_WORK (4e6 multiply-adds, microseconds) is one call by design */
    if (per < min_per && (double)products[i].m * products[i].n * products[i].k >= 4e6) min_per = per;
    if (len < (int)sizeof buf - 64)
      len += snprintf(buf + len, sizeof buf - (size_t)len, " %dx%dx%d%s=%dx%d", products[i].m, products[i].n, products[i].k,
                      products[i].half ? "h" : "", ti, tj);
  }
  printf("scaling_tiles %s %s min_tiles_per_thread_16=%.3f (products of 4e6 multiply-adds or more) products(m x n x k[h: half]=tiles down x across):%s\n",
         bench_model_name(r->model), level, n_products ? min_per : 0.0, buf);
  if (r->model == BENCH_GPT_C256 || r->model == BENCH_GPT_C768)
    printf("scaling_tiles %s %s attention: %d heads (batch x heads) a pass, each whole on one thread: %.2f a thread at 16\n",
           bench_model_name(r->model), level, 4 * (r->model == BENCH_GPT_C768 ? 12 : 4), 4 * (r->model == BENCH_GPT_C768 ? 12 : 4) / 16.0);
  fflush(stdout);
}

/* ---- the run --------------------------------------------------------------------------------------- */

static double seconds_per_point = 0.25;

/* Best step time at the current thread count. */
static double step_time(bench_train *r) {
  int big = r->model == BENCH_GPT_C256 || r->model == BENCH_GPT_C768;
  return bench_best(bench_train_step, r, 0, big ? 1 : 3, seconds_per_point);
}

/* The serial fraction of r's step at one thread (see the probe above), from its best step; *step
 * gets that step's time, *regions its parallel regions, *bound16 its tile_bound at 16 threads. */
static double serial_fraction(bench_train *r, int probe_threads, double *step, long *regions, double *bound16, double *bound64) {
  apex_set_num_threads(probe_threads);
  int big = r->model == BENCH_GPT_C256 || r->model == BENCH_GPT_C768;
  double best = 1e300, best_s = 1;
  double start = bench_now();
  for (int rep = 0; rep < (big ? 1 : 3) || bench_now() - start < seconds_per_point; rep++) {
    probe_in_parallel = 0, probe_regions = 0, n_products = 0;
    probe_on = 1;
    apex__gemm_set_observer(observe);
    double t0 = bench_now();
    bench_train_step(r);
    double t = bench_now() - t0;
    apex__gemm_set_observer(NULL);
    probe_on = 0;
    if (t < best) best = t, best_s = (t - probe_in_parallel) / t, *regions = probe_regions, *bound16 = tile_bound(t, t - probe_in_parallel, 16),
                    *bound64 = tile_bound(t, t - probe_in_parallel, 64);
  }
  *step = best;
  return best_s;
}

static int wanted_model(const char *list, const char *name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char *p = list; (p = strstr(p, name)); p += n)
    if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
  return 0;
}

static void cpu_name(char *out, size_t size) {
  snprintf(out, size, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      snprintf(out, size, "%s", strchr(line, ':') + 2);
      out[strcspn(out, "\n")] = '\0';
      break;
    }
  fclose(f);
}

/* The physical cores among the CPUs of set: CPUs whose topology names the same first sibling share a
 * core (SMT). 0 when /sys does not say. With two threads a core, threads past the physical count share
 * a core's vector and matrix units, and a benchmark's curve flattens there for that reason alone. */
static int physical_cores(const cpu_set_t *set) {
  static unsigned char seen[CPU_SETSIZE];
  int n = 0;
  memset(seen, 0, sizeof seen);
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, set)) continue;
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    FILE *f = fopen(path, "r");
    int first = -1;
    if (!f) return 0;
    if (fscanf(f, "%d", &first) != 1 || first < 0 || first >= CPU_SETSIZE) first = c;
    fclose(f);
    if (!seen[first]) seen[first] = 1, n++;
  }
  return n;
}

static int bound; /* OpenMP binds its threads (OMP_PROC_BIND, or OMP_PLACES alone) */

/* The lines' prefix: a bound run's names say so, to keep the two runs' figures apart wherever they land. */
static const char *prefix(void) { return bound ? "scaling_bound" : "scaling"; }

/* The least v[i'] / v[i] over the counts where threads[i'] = 2 threads[i] (or, for the last count, the
 * largest count at most half of it): 0 when no pair was measured. */
static double worst_doubling(const int *threads, int n, const double *v) {
  double worst = 0;
  for (int j = 1; j < n; j++) {
    int i = -1;
    for (int k = 0; k < j; k++)
      if (2 * threads[k] <= threads[j]) i = k;
    if (i < 0 || v[i] <= 0 || v[j] <= 0) continue;
    double g = v[j] / v[i];
    if (worst == 0 || g < worst) worst = g;
  }
  return worst;
}

/* apex's and PyTorch's curves of one model and level, one line each, with the ratio and the gain of
 * each doubling of the threads; and the worst doubling as a bench line. c[0]: apex, c[1]: the peer. */
static void print_curve(const char *model, const char *level, const char *peer, const int *threads, int n, double c[2][16]) {
  const char *pre = bound ? "scaling curve (bound)" : "scaling curve";
  printf("%s %s %s threads   ", pre, model, level);
  for (int i = 0; i < n; i++) printf(" %9d", threads[i]);
  printf("\n%s %s %s apex      ", pre, model, level);
  for (int i = 0; i < n; i++) printf(" %9.0f", c[0][i]);
  printf("\n%s %s %s %-10s", pre, model, level, c[1][0] > 0 ? "torch" : "torch:none");
  for (int i = 0; i < n; i++) printf(" %9.0f", c[1][i]);
  printf("\n%s %s %s apex/torch", pre, model, level);
  for (int i = 0; i < n; i++) printf(" %9.2f", c[1][i] > 0 ? c[0][i] / c[1][i] : 0.0);
  printf("\n%s %s %s gain 2N/N ", pre, model, level);
  for (int i = 0; i < n; i++) printf(" %9.2f", i ? c[0][i] / c[0][i - 1] : 1.0);
  printf("\n");
  double w = worst_doubling(threads, n, c[0]), wp = worst_doubling(threads, n, c[1]);
  char line[96];
  snprintf(line, sizeof line, "%s_%s_%s_worst_doubling", prefix(), model, level);
  printf("%s %s %s worst doubling: apex %.2f, torch %.2f\n", pre, model, level, w, wp);
  bench_report(line, w, "x", wp > 0 ? w / wp : 0.0, wp > 0 ? peer : "missing");
}

int main(int argc, char **argv) {
  const char *models = NULL;
  int max_threads = 0, use_peer = 1, named = 0, others = 0, half_min_tiles = 0, few = 0, rows_only = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds-per-point") && i + 1 < argc)
      seconds_per_point = atof(argv[++i]);
    else if (!strcmp(argv[i], "--max-threads") && i + 1 < argc)
      max_threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--models") && i + 1 < argc)
      models = argv[++i];
    else if (!strcmp(argv[i], "--half-min-tiles") && i + 1 < argc)
      half_min_tiles = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--half-rows-only"))
      apex__onednn_set_half_cols(0), rows_only = 1;
    else if (!strcmp(argv[i], "--f32-few-tiles"))
      apex__gemm_set_many_tiles(0), few = 1;
    else if (!strcmp(argv[i], "--no-peer"))
      use_peer = 0;
    else if (strstr("scaling_", argv[i]) || !strncmp(argv[i], "scaling", 7))
      named = 1;
    else
      others = 1;
  }
  /* bench/run passes its NAME filters to every program: run when none is given or one names this one */
  if (others && !named) return 0;
  resolve_real_parallel();
  signal(SIGPIPE, SIG_IGN); /* a peer that died answers nothing (its lines say missing), never kills the run */
  if (rows_only) printf("scaling half products (oneDNN) in tiles as wide as the product, no column split (--half-rows-only)\n");
  if (few) printf("scaling f32 products in the grid of few tiles (--f32-few-tiles: apex__gemm_set_many_tiles(0))\n");
  if (half_min_tiles > 0) {
    apex__onednn_set_half_min_tiles(half_min_tiles);
    printf("scaling half products (oneDNN) in at least %d row tiles (--half-min-tiles; the default is 16)\n", half_min_tiles);
  }
  /* the CPUs of OpenMP's places, not the main thread's mask: binding narrows that to one place */
  static int ids[CPU_SETSIZE];
  int cores = apex_threads_cpus(ids, CPU_SETSIZE);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int i = 0; i < cores && i < CPU_SETSIZE; i++) CPU_SET(ids[i], &set);
  if (max_threads <= 0 || max_threads > cores) max_threads = cores;
  int threads[16], nthreads = 0;
  for (int t = 1; t < max_threads && nthreads < 15; t *= 2) threads[nthreads++] = t;
  threads[nthreads++] = max_threads;
  bound = omp_get_proc_bind() != omp_proc_bind_false;
  /* the probe runs with apex's count at the most threads (at least 2, so that every region that
   * would take threads asks for them); the pools grow to that count's size in the warmup step */
  int probe_threads = max_threads > 2 ? max_threads : 2;
  apex_set_threads_follow_load(0);
  char cpu[256];
  cpu_name(cpu, sizeof cpu);
  char list[256];
  apex_cpus_format(ids, cores < CPU_SETSIZE ? cores : CPU_SETSIZE, list, sizeof list);
  printf("scaling cpu: %s, %d CPUs (%s) %s on %d physical cores, isa %s\n", cpu, cores, list,
         omp_get_num_places() > 0 ? "in OpenMP's places" : "in this process's affinity mask", physical_cores(&set),
         apex_cpu_isa_name(apex_cpu_max_isa()));
  const char *places = getenv("OMP_PLACES");
  static const char *const binds[] = {"false", "true", "master", "close", "spread"};
  int b = (int)omp_get_proc_bind();
  printf("scaling binding: %s (OMP_PROC_BIND %s, OMP_PLACES %s, %d places)%s\n", bound ? "bound" : "unbound",
         b >= 0 && b < 5 ? binds[b] : "?", places ? places : "unset", omp_get_num_places(), bound ? ": lines named scaling_bound_*" : "");
  int have_peer = use_peer && peer_start(max_threads);
  if (!have_peer) printf("bench scaling peer skipped: %s\n", use_peer ? "no PyPI torch (run bench/setup_peers.sh)" : "--no-peer");
  fflush(stdout);
  const char *levels[2] = {"O0", "O2"}, *modes[2] = {"f32", "autocast"};
  double start = bench_now();
  for (bench_model model = 0; model < BENCH_MODEL_COUNT; model++) {
    const char *name = bench_model_name(model);
    if (!wanted_model(models, name)) continue;
    bench_train r[2];
    for (int l = 0; l < 2; l++) {
      bench_train_init(&r[l], model, 0, levels[l]);
      apex_set_num_threads(probe_threads);
      report_tiles(&r[l], levels[l]); /* also the warmup step, in the probe's thread count (the pools' size) */
    }
    double serial[2], curve[2][2][16] = {{{0}}};
    for (int l = 0; l < 2; l++) {
      double step, bound16 = 0, bound64 = 0;
      long regions = 0;
      serial[l] = serial_fraction(&r[l], probe_threads, &step, &regions, &bound16, &bound64);
      char line[96];
      apex_set_num_threads(1);
      snprintf(line, sizeof line, "%s_%s_%s_serial", prefix(), name, levels[l]);
      bench_report(line, serial[l], "fraction", 1.0, "step-at-1-thread");
      snprintf(line, sizeof line, "%s_%s_%s_regions", prefix(), name, levels[l]);
      bench_report(line, (double)regions, "regions/step", 1.0, "step-at-1-thread");
      snprintf(line, sizeof line, "%s_%s_%s_tile_bound_16", prefix(), name, levels[l]);
      bench_report(line, bound16, "x", bound16 / 16, "ideal");
      snprintf(line, sizeof line, "%s_%s_%s_tile_bound_64", prefix(), name, levels[l]);
      bench_report(line, bound64, "x", bound64 / 64, "ideal");
    }
    for (int ti = 0; ti < nthreads; ti++) {
      int t = threads[ti];
      for (int l = 0; l < 2; l++) {
        apex_set_num_threads(t);
        if (have_peer) usleep(200000); /* let the peer's OpenMP threads stop spinning */
        double s = step_time(&r[l]);
        double mine = bench_model_samples(model) / s;
        double peer = have_peer ? peer_measure(name, modes[l], t, seconds_per_point) : 0;
        curve[l][0][ti] = mine, curve[l][1][ti] = peer;
        char line[96];
        snprintf(line, sizeof line, "%s_%s_%s_t%d", prefix(), name, levels[l], t);
        apex_set_num_threads(t);
        bench_report(line, mine, "samples/s", peer > 0 ? mine / peer : 0.0, peer > 0 ? (l ? "torch-bf16-autocast" : "torch-f32") : "missing");
      }
    }
    for (int l = 0; l < 2; l++) print_curve(name, levels[l], l ? "torch-bf16-autocast" : "torch-f32", threads, nthreads, curve[l]);
    for (int l = 0; l < 2; l++)
      for (int n = 16; n <= 64; n *= 2) {
        double bound = 1.0 / (serial[l] + (1.0 - serial[l]) / n);
        char line[96];
        snprintf(line, sizeof line, "%s_%s_%s_amdahl_%d", prefix(), name, levels[l], n);
        bench_report(line, bound, "x", bound / n, "ideal");
      }
    for (int l = 0; l < 2; l++) bench_train_free(&r[l]);
  }
  peer_stop();
  printf("scaling total %.1f s\n", bench_now() - start);
  return 0;
}
