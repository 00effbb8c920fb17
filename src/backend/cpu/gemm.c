/* gemm.c: the matrix products under the ops, on apex's AVX-512 sgemm or OpenBLAS (on bf16 CPUs
 * apex__gemm's products, bf16 and f32, go to gemm_onednn.c first, in the same tile grid; apex__sgemm
 * and apex__sgemm_call, which have no workspace, stay here).
 *
 * A product big enough for threads is cut into a grid of output tiles fixed by its shape alone
 * (never by the thread count), and each tile is one single-threaded sgemm call over all of K. The
 * grid is what makes a product's bits independent of the thread count: OpenBLAS's kernels sum an
 * element in an order that depends on where it falls in the call's microkernel blocking (measured on
 * this machine's Zen kernels: splitting a product at any column, or at rows not a multiple of 24,
 * changes 1% to 40% of the elements in the last bit), so the old split of rows or columns into
 * 2 x threads parts gave different bits at 1 and 2 threads. Now a thread only chooses which tiles
 * it runs.
 *
 * apex__gemm takes operands and results of any float dtype. Each tile widens just the panels of
 * op(A)'s rows and op(B)'s columns it reads into a per-thread scratch (at most PANEL_BYTES each, and
 * kept while the next tile reads the same panel) and narrows its finished f32 tile into the result,
 * so a product's f32 copies no longer grow with its operands. The values each sgemm call sees are
 * the same as after widening whole tensors, so the bits are too (test_nn_ops checks this, and keeps
 * the whole-tensor way as the reference: apex__gemm_set_whole_widening).
 *
 * Measured with bench_nn nn_gemm_tiles (f16 linear [4096, 1024] x [1024, 1024]^T with bias, forward
 * and backward, 2 threads, this shared 2-core VM): per-tile widening ran at 0.97x to 1.13x the speed
 * of whole-tensor widening (noise either way) and the step's pool shrank from 120 MiB to 74.5 MiB,
 * so per tile is the default. The grid itself against the old split of an f32 linear, forward and
 * backward: 0.84x to 1.6x across shapes and runs, no consistent loss within this machine's noise. */
#include <cblas.h>
#include <omp.h>

#include <string.h>

#include "apex/cpu.h"
#include "apex/threads.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_onednn.h"
#include "core/internal.h"

/* Products of at least this many multiply-adds are tiled and run on threads; smaller ones are one
 * sgemm call, which keeps their bits what they have always been. */
#define TILE_MIN_WORK 4e6
/* A tile's panel of op(A) (TM x K) or op(B) (K x TN) takes at most this much f32, so tiles are 256
 * lines up to K = 4096 and narrow beyond (64 at K = 16384, never under 16). Narrower tiles cost sgemm
 * speed: single-threaded OpenBLAS here ran [2048, 1024] x [1024, 1024] at 98 GFLOP/s in one call,
 * 94 in tiles of 256, 88 in tiles of 128, and tiles of 64 at K = 4096 lost a fifth. Re-widening a
 * panel for each tile costs one conversion per 512 multiply-adds at 256. */
#define PANEL_BYTES ((size_t)4 << 20)
enum { TILE_MAX = 256, TILE_MIN = 16, FEW_TILES = 4, SPLIT_MIN = 32, MANY_TILES = 64, MANY_SPLIT_MIN = 128 };
/* The split towards MANY_TILES stops where a halved tile would do fewer multiply-adds than this. */
#define TILE_MIN_MACS ((double)(1 << 20))

static int whole_widening, many_tiles = 1;

int apex__gemm_set_many_tiles(int on) {
  int old = many_tiles;
  many_tiles = on != 0;
  return old;
}

int apex__gemm_set_whole_widening(int on) {
  int old = whole_widening;
  whole_widening = on != 0;
  return old;
}

/* OpenBLAS runs on one thread and apex runs the tiles on its OpenMP threads: OpenBLAS's pthreads
 * spinning beside OpenMP's would fight for the cores. Checked before every product, not once: the
 * program may set OpenBLAS's thread count for its own calls (bench_nn's sgemm peak does), and a
 * product run at 2 x 2 threads on 2 cores took 1.6x as long. */
void apex__blas_serial(void) {
  apex_cpu_max_isa(); /* every product's threads call this first: resolve the ISA cap before they read it */
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

static int own_kernel = 1;

int apex__gemm_set_own_kernel(int on) {
  int old = own_kernel;
  own_kernel = on != 0;
  return old;
}

/* One single-threaded product, by the maximum ISA (apex/cpu.h): apex's AVX-512 kernel at AVX512 and
 * above (OpenBLAS is pinned to its AVX2 kernels on this project's machines; see sgemm_avx512.c), the
 * plain-C reference product (sgemm_ref.c) when the cap asks for PORTABLE, else OpenBLAS. */
static void sgemm1(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                   float beta, float *c, int ldc) {
  if (apex__cpu_capped_portable()) {
    apex__sgemm_ref(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (own_kernel && apex_cpu_max_isa() >= APEX_CPU_ISA_AVX512 && apex__sgemm_avx512_ok()) {
    apex__sgemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

void apex__sgemm_call(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                      float beta, float *c, int ldc) {
  sgemm1(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* ---- the tile grid -------------------------------------------------------------------------------- */

typedef struct grid {
  int tm, tn, ti, tj; /* tile rows and columns; tiles down and across */
} grid;

static int tiles_of(int m, int n, const grid *gr) { return ((m + gr->tm - 1) / gr->tm) * ((n + gr->tn - 1) / gr->tn); }

/* Halves gr's longer side (that may be halved: at least 2 x split_min) until m x n has `want` tiles
 * or no side may be halved, or a halved tile would do under min_macs multiply-adds. */
static void split(grid *gr, int m, int n, int k, int want, int split_min, double min_macs) {
  while (tiles_of(m, n, gr) < want && (gr->tm >= 2 * split_min || gr->tn >= 2 * split_min) && (double)gr->tm * gr->tn * k / 2 >= min_macs) {
    if (gr->tm >= gr->tn && gr->tm >= 2 * split_min)
      gr->tm = (gr->tm + 1) / 2;
    else
      gr->tn = (gr->tn + 1) / 2;
  }
}

/* The grid of a product: a function of m, n, k only (and of `many`, which each caller fixes). */
static grid plan(int m, int n, int k, int many) {
  grid gr = {m, n, 1, 1};
  if ((double)m * n * k < TILE_MIN_WORK) return gr;
  size_t fit = PANEL_BYTES / sizeof(float) / (size_t)(k > 0 ? k : 1) / TILE_MIN * TILE_MIN;
  int t = fit < TILE_MIN ? TILE_MIN : fit > TILE_MAX ? TILE_MAX : (int)fit;
  gr.tm = m < t ? m : t;
  gr.tn = n < t ? n : t;
  /* A product that fits a few tiles is halved (the longer side first, down to SPLIT_MIN) until it has
   * FEW_TILES: otherwise the benchmark CNN's first linear, [128, 3136] x [3136, 128], was one tile on
   * one thread (0.99 ms measured, of a ~33 ms step, with the other thread waiting). 64 x 128 x 3136
   * ran at 98.5 GFLOP/s single-threaded against 104 for 128 x 128 x 3136. */
  split(&gr, m, n, k, FEW_TILES, SPLIT_MIN, 0);
  /* Then, for many threads, on towards MANY_TILES (4 a thread at 16) while both sides of a tile stay
   * at least MANY_SPLIT_MIN: at 4 tiles the MLP's forward products left 12 of 16 threads idle. Tiles
   * of 128 x 128 cost one thread nothing measurable against 128 x 256 or 256 x 256 (OpenBLAS, one
   * thread, best of 40: the models' products at 0.97x to 1.06x), 64-line tiles 10-15% (64 x 128 of
   * [128, 784] x [784, 1024]: 1.10x and 1.13x), so the split stops at 128 lines and short products
   * keep fewer tiles than MANY_TILES. Half products on oneDNN take only the first split
   * (gemm_onednn.c widens their tiles and counts their rows itself). */
  if (many && many_tiles) split(&gr, m, n, k, MANY_TILES, MANY_SPLIT_MIN, TILE_MIN_MACS);
  gr.ti = (m + gr.tm - 1) / gr.tm;
  gr.tj = (n + gr.tn - 1) / gr.tn;
  return gr;
}

/* The part of x's storage that lines [lo, lo + w) of op(x) read, as f32: stored rows lo.. when
 * by_rows (w rows of k), else stored columns lo.. (k rows of w). f32 data is used in place; other
 * dtypes are widened into buf. */
static const float *panel(const apex__mat *x, int by_rows, int lo, int w, int k, float *buf, int *ld) {
  size_t es = apex_dtype_size(x->dtype);
  const char *base = (const char *)x->data + (by_rows ? (size_t)lo * x->ld : (size_t)lo) * es;
  if (x->dtype == APEX_F32) {
    *ld = x->ld;
    return (const float *)base;
  }
  int rows = by_rows ? w : k, cols = by_rows ? k : w;
  for (int r = 0; r < rows; r++) apex__convert_range(buf + (size_t)r * cols, APEX_F32, base + (size_t)r * x->ld * es, x->dtype, (size_t)cols);
  *ld = cols;
  return buf;
}

static size_t lowp(apex_dtype dt, size_t n) { return dt == APEX_F32 ? 0 : n; }

typedef struct job {
  int m, n, k;
  float alpha, beta;
  apex__mat a, b;
  void *c;
  apex_dtype ct;
  int ldc;
  const float *bias;
} job;

/* Runs every tile of j's grid; scratch holds `per` floats for each thread (panels and a C tile for
 * the operands and result that are not f32). Tiles go to threads in runs along a row of tiles, so a
 * thread widens its op(A) panel once per row, or along a column when only op(B) needs widening. */
static void run_grid(const job *j, grid gr, float *scratch, size_t fa, size_t fb) {
  size_t per = fa + fb + lowp(j->ct, (size_t)gr.tm * gr.tn), es = apex_dtype_size(j->ct);
  /* the whole team even when there are fewer tiles than threads: a smaller team makes libgomp end
   * the threads it leaves out and create new ones at the next full region (gemm_onednn.c) */
  int nt = gr.ti * gr.tj, par = nt > 1 && apex_get_num_threads() > 1, down = j->a.dtype == APEX_F32 && j->b.dtype != APEX_F32;
#pragma omp parallel if (par)
  {
    float *abuf = scratch ? scratch + (size_t)omp_get_thread_num() * per : NULL, *bbuf = abuf ? abuf + fa : NULL, *cbuf = bbuf ? bbuf + fb : NULL;
    const float *ap = NULL, *bp = NULL;
    int lda = 0, ldb = 0, last_i = -1, last_j = -1;
#pragma omp for schedule(static)
    for (int t = 0; t < nt; t++) {
      int i = down ? t % gr.ti : t / gr.tj, jj = down ? t / gr.ti : t % gr.tj, i0 = i * gr.tm, j0 = jj * gr.tn;
      int mi = j->m - i0 < gr.tm ? j->m - i0 : gr.tm, nj = j->n - j0 < gr.tn ? j->n - j0 : gr.tn;
      if (i != last_i) ap = panel(&j->a, !j->a.trans, i0, mi, j->k, abuf, &lda);
      if (jj != last_j) bp = panel(&j->b, j->b.trans, j0, nj, j->k, bbuf, &ldb);
      last_i = i;
      last_j = jj;
      int narrow = j->ct != APEX_F32, ldt = narrow ? nj : j->ldc;
      float *cp = narrow ? cbuf : (float *)j->c + (size_t)i0 * j->ldc + j0;
      if (j->bias)
        for (int r = 0; r < mi; r++) memcpy(cp + (size_t)r * ldt, j->bias + j0, (size_t)nj * sizeof(float));
      sgemm1(j->a.trans, j->b.trans, mi, nj, j->k, j->alpha, ap, lda, bp, ldb, j->bias ? 1.0f : j->beta, cp, ldt);
      if (narrow)
        for (int r = 0; r < mi; r++)
          apex__convert_range((char *)j->c + ((size_t)(i0 + r) * j->ldc + j0) * es, j->ct, cbuf + (size_t)r * nj, APEX_F32, (size_t)nj);
    }
  }
}

void apex__sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc) {
  apex__blas_serial();
  job j = {m, n, k, alpha, beta, {a, APEX_F32, lda, trans_a}, {b, APEX_F32, ldb, trans_b}, c, APEX_F32, ldc, NULL};
  run_grid(&j, plan(m, n, k, 1), NULL, 0, 0);
}

/* The reference way: every low-precision operand (and the result) widened whole first, then the
 * same grid on f32. */
static apex_status gemm_whole(const apex_nn_workspace *ws, const job *j, grid gr) {
  size_t na = (size_t)(j->a.trans ? j->k : j->m) * j->a.ld, nb = (size_t)(j->b.trans ? j->n : j->k) * j->b.ld, nc = (size_t)j->m * j->ldc;
  size_t fa = lowp(j->a.dtype, na), fb = lowp(j->b.dtype, nb), fc = lowp(j->ct, nc);
  float *buf = ws->get(ws->ctx, (fa + fb + fc) * sizeof(float));
  if (!buf) return APEX_ERR_OUT_OF_MEMORY;
  job w = *j;
  if (fa) apex_convert(buf, APEX_F32, j->a.data, j->a.dtype, na);
  if (fb) apex_convert(buf + fa, APEX_F32, j->b.data, j->b.dtype, nb);
  w.a = (apex__mat){fa ? buf : j->a.data, APEX_F32, j->a.ld, j->a.trans};
  w.b = (apex__mat){fb ? buf + fa : j->b.data, APEX_F32, j->b.ld, j->b.trans};
  w.c = fc ? buf + fa + fb : j->c;
  w.ct = APEX_F32;
  run_grid(&w, gr, NULL, 0, 0);
  if (fc) apex_convert(j->c, j->ct, w.c, APEX_F32, nc);
  return APEX_OK;
}

void apex__gemm_grid(int m, int n, int k, int half_onednn, int *ti, int *tj) {
  grid gr = plan(m, n, k, !half_onednn);
  if (half_onednn) apex__onednn_half_grid(m, n, k, &gr.tm, &gr.tn);
  *ti = m > 0 && gr.tm > 0 ? (m + gr.tm - 1) / gr.tm : 0;
  *tj = n > 0 && gr.tn > 0 ? (n + gr.tn - 1) / gr.tn : 0;
}

long apex__gemm_settings(void) { return whole_widening | many_tiles << 1 | own_kernel << 2 | apex__onednn_settings() << 3; }

static apex__gemm_observer observer;

void apex__gemm_set_observer(apex__gemm_observer fn) { observer = fn; }

apex_status apex__gemm(const apex_nn_workspace *ws, int m, int n, int k, float alpha, apex__mat a, apex__mat b, float beta, void *c, apex_dtype ct, int ldc,
                       const float *bias) {
  if (observer) observer(m, n, k, a.dtype, b.dtype);
  apex__blas_serial();
  job j = {m, n, k, alpha, beta, a, b, c, ct, ldc, bias};
  grid gr = plan(m, n, k, 1), gh = a.dtype != APEX_F32 || b.dtype != APEX_F32 ? plan(m, n, k, 0) : gr;
  /* on bf16 hardware: oneDNN (gemm_onednn.c), in the same grid (half products: from their own) */
  apex_status od = apex__gemm_onednn(ws, m, n, k, alpha, a, b, beta, c, ct, ldc, bias, gh.tm, gh.tn);
  if (od != APEX_ERR_UNSUPPORTED) return od;
  if (a.dtype == APEX_F32 && b.dtype == APEX_F32 && ct == APEX_F32) {
    run_grid(&j, gr, NULL, 0, 0);
    return APEX_OK;
  }
  if (whole_widening) return gemm_whole(ws, &j, gr);
  size_t fa = lowp(a.dtype, (size_t)gr.tm * k), fb = lowp(b.dtype, (size_t)k * gr.tn), fc = lowp(ct, (size_t)gr.tm * gr.tn);
  size_t per = (size_t)apex_get_num_threads() * (fa + fb + fc);
  float *scratch = ws->get(ws->ctx, (per ? per : 1) * sizeof(float));
  if (!scratch) return APEX_ERR_OUT_OF_MEMORY;
  run_grid(&j, gr, scratch, fa, fb);
  return APEX_OK;
}
