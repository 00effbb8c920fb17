/* gemm_onednn.c: bf16 matrix products on oneDNN's matmul primitive (Debian's libdnnl-dev, C API).
 *
 * Why: apex__gemm widens bf16 operands to f32 and multiplies in f32, so low precision adds work and
 * saves none. oneDNN's bf16 matmul uses the CPU's bf16 dot products (AVX512_BF16, AMX) and
 * accumulates in f32.
 *
 * Determinism: oneDNN with OpenMP splits a product over the threads it sees, over K too for some
 * shapes, so its bits could depend on OMP_NUM_THREADS. Here every call of a primitive is one tile of
 * a grid fixed by m, n, k alone (gemm.c's for f32 products; for half ones, tiles as wide as the
 * product: see apex__gemm_onednn), and the primitive is created and run with OpenMP's thread
 * count set to 1 on the calling thread: a tile's bits are a function of its shape and operands only.
 * test_gemm_onednn checks 1, 2 and 3 threads bitwise.
 *
 * Operands: bf16 in place, through memory descriptors with the operand's strides (a transpose is a
 * stride) where the tile reads them densely, else copied into a dense panel (oneDNN 2.6 runs strided
 * bf16 operands on a slower kernel); an f32 operand beside a bf16 one (the f32 gradient of a backward
 * product) is rounded to bf16 a panel at a time (op(B) once for the product, op(A) a row of tiles at
 * a time), so the product runs at bf16 speed as autocast's does. f32 products run on oneDNN's f32 matmul the same way: bench_gemm's gemm_f32_* lines (the
 * four models' linear products, forward and both backward, per tile, one thread) measured oneDNN
 * 1.04x to 1.9x faster than apex's AVX-512 kernel on 27 of 33, the kernel 1.05x to 1.4x faster on 5
 * (within this shared machine's run-to-run spread but one, cnn_fc2_dx [128, 10] x [10, 128], a
 * product of microseconds). f16 runs only when both operands are f16 and oneDNN has an f16 matmul for this CPU (it
 * reports unimplemented otherwise and apex__gemm takes its f32 path): an f32 gradient is never
 * rounded to f16, whose range it could overflow. Each tile's f32 result lands in per-thread scratch;
 * alpha, beta, the bias and the narrowing to C's dtype follow there, in the order gemm.c's
 * sgemm calls use (alpha * AB + beta * C, bias as a C of beta 1). A product with nothing to
 * follow (C f32, alpha 1, beta 0, no bias) is written by oneDNN into C's tile in place; so is a half
 * product with alpha 1 and beta 0 into a dense C of f32 or its own half type, oneDNN adding the bias
 * and rounding as it stores (the forward linears: no f32 tile, no second pass).
 *
 * Primitives are created once per tile shape and layout, kept in a process-wide cache (a model has
 * a handful of shapes), and run with a user scratchpad so threads can share one primitive. */
#include <string.h>

#include "backend/cpu/gemm_onednn.h"
#include "core/internal.h"

static int enabled = 1, f32_mode = APEX__ONEDNN_F32_ALL;
static unsigned long products;

int apex__onednn_set_f32(int mode) {
  int old = f32_mode;
  f32_mode = mode;
  return old;
}

int apex__onednn_set_enabled(int on) {
  int old = enabled;
  enabled = on != 0;
  return old;
}

unsigned long apex__onednn_products(void) { return __atomic_load_n(&products, __ATOMIC_RELAXED); }

/* The half grid. Tiles first span the product's width up to WIDE_MAX columns (a dense C and op(B), which
 * oneDNN 2.6 runs on its brgemm kernel; see apex__gemm_onednn), their rows halved, not below
 * WIDE_MIN_ROWS, until there are WIDE_MIN_TILES row tiles. Then, for many threads, their columns are
 * halved (to multiples of 32, not below HALF_MIN_COLS) until there are HALF_MANY_TILES tiles. Every
 * halving keeps a tile at HALF_TILE_MIN_MACS multiply-adds or more, and products under gemm.c's
 * TILE_MIN_WORK stay one call. A function of m, n and k alone, as every grid here.
 *
 * Why 16 row tiles: the 16-core AMX run of issue #33 (bench_scaling --half-min-tiles 16 beside the
 * grid of 2 row tiles, same run) measured 1.7x / 2.3x on gpt_c256 O2 at 8 / 16 threads, 1.25x / 2.6x
 * on gpt_c768, 1.37x / 1.2x on the MLP: the GPTs' 1024-row products had 4 tiles of 256 rows, a bound
 * of 4 busy threads. (On 2 threads, in 2026-11, 4 tiles of 32 rows for the MLP's 128-row batch cost
 * 10% against 2 of 64: each row tile converts all of op(B) into oneDNN's pair-interleaved layout.)
 *
 * Why columns next, not rows: that conversion is per tile and reads op(B)'s columns of the tile only,
 * so halving a tile's columns splits its conversion with it, where halving its rows repeats it. The
 * MLP's products have 128 rows: 4 row tiles at most, a bound of 4 busy threads at 16, which only
 * column tiles lift. A tile narrower than the product is strided in C, so it lands in f32 scratch and
 * a second pass (epilogue) adds the bias and rounds it, as apex's f32-scratch path always did.
 *
 * Why tiles of 8M multiply-adds at least (HALF_TILE_MIN_MACS): every tile has a fixed cost (the call,
 * its conversion of op(B), the epilogue), and on this project's 2-core AVX512_BF16 machine tiles of
 * 4M cost the MLP's O2 step 10-20% at one thread against the grid before (bench_scaling, interleaved
 * rounds, 2026-11-28); 8M and 16M were within that shared machine's noise of it. At 8M the MLP's two
 * big products have 8 and 16 tiles, gpt_c256's 8 to 32, gpt_c768's 32 to 64. */
enum { WIDE_MAX = 4096, WIDE_MIN_TILES = 16, WIDE_MIN_ROWS = 32, HALF_MANY_TILES = 64, HALF_MIN_COLS = 128 };
#define HALF_TILE_MIN_MACS ((double)(1 << 23))
#define HALF_MIN_WORK 4e6 /* gemm.c's TILE_MIN_WORK */
/* bench_scaling's knobs (apex__onednn_set_half_min_tiles, apex__onednn_set_half_cols): the row tiles
 * and whether the column split runs, to measure the grid against its variants on many cores. */
static int wide_min_tiles = WIDE_MIN_TILES, half_cols = 1;

int apex__onednn_set_half_min_tiles(int n) {
  int old = wide_min_tiles;
  wide_min_tiles = n < 1 ? WIDE_MIN_TILES : n;
  return old;
}

int apex__onednn_set_half_cols(int on) {
  int old = half_cols;
  half_cols = on != 0;
  return old;
}

long apex__onednn_settings(void) { return enabled | (long)f32_mode << 1 | (long)half_cols << 3 | (long)wide_min_tiles << 4; }

void apex__onednn_half_grid(int m, int n, int k, int *tm, int *tn) {
  if (*tm > m) *tm = m;
  if (*tn > n) *tn = n;
  /* under gemm.c's TILE_MIN_WORK a product is one call by design (microseconds: a tile would cost more) */
  if ((double)m * n * k < HALF_MIN_WORK) return;
  if (*tn < n && n <= WIDE_MAX) *tn = n;
  /* a halved tile keeps HALF_TILE_MIN_MACS: attention's heads (256 x 256 x 64, one whole head a
   * thread) keep their 2 tiles of 128 rows, where 8 of 32 would add calls and conversions of op(B) */
  if (*tn == n)
    while ((m + *tm - 1) / *tm < wide_min_tiles && *tm >= 2 * WIDE_MIN_ROWS && (double)((*tm + 1) / 2) * *tn * k >= HALF_TILE_MIN_MACS)
      *tm = (*tm + 1) / 2;
  if (!half_cols) return;
  for (;;) {
    int half = (*tn / 2 + 31) / 32 * 32;
    long tiles = (long)((m + *tm - 1) / *tm) * ((n + *tn - 1) / *tn);
    if (tiles >= HALF_MANY_TILES || half < HALF_MIN_COLS || half >= *tn || (double)*tm * half * k < HALF_TILE_MIN_MACS) break;
    *tn = half;
  }
}

#if APEX_HAVE_DNNL

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include <dnnl.h>

#include "apex/cpu.h"
#include "apex/threads.h"

int apex__onednn_active(const char **why) {
  const char *w = NULL;
  if (!enabled)
    w = "the oneDNN path is switched off (apex__onednn_set_enabled)";
  else if (apex_cpu_max_isa() < APEX_CPU_ISA_AVX512_BF16)
    w = apex_cpu_native_isa() < APEX_CPU_ISA_AVX512_BF16 ? "this CPU has neither AVX512_BF16 nor AMX"
                                                         : "the maximum ISA (APEX_CPU_ISA / apex_cpu_set_max_isa) is below avx512_bf16";
  if (why) *why = w;
  return w == NULL;
}

/* ---- engine and primitive cache ------------------------------------------------------------------ */

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* oneDNN's own ISA cap can be set once, before its first primitive: it follows apex's cap at that
 * moment when that cap is AVX512_BF16 on an AMX CPU, so APEX_CPU_ISA=avx512_bf16 keeps AMX off. */
static void engine_init(void) {
  if (apex_cpu_max_isa() == APEX_CPU_ISA_AVX512_BF16 && apex_cpu_native_isa() > APEX_CPU_ISA_AVX512_BF16)
    dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16);
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
}

void *apex__onednn_engine(void) {
  pthread_once(&engine_once, engine_init);
  return engine;
}

/* A tile's primitive is fixed by its data type, shape and the strides of its operands. */
typedef struct prim_key {
  dnnl_data_type_t dt;
  int m, n, k;
  int64_t sa[2], sb[2];
  int64_t ldd;          /* the result's row stride: the tile's width in scratch, or C's ldc in place */
  dnnl_data_type_t ddt; /* the result's type: f32, or C's half type when oneDNN writes C itself */
  int bias;             /* oneDNN adds an f32 bias row to the products before rounding to ddt */
} prim_key;

typedef struct prim_entry {
  prim_key key;
  dnnl_primitive_t prim; /* NULL: oneDNN has no primitive for this key */
  size_t scratch;        /* bytes of user scratchpad it needs */
} prim_entry;

/* Enough for every shape of the models many times over; past it primitives are made per call.
 * Read-mostly: an entry is written once, before cache_n is raised past it (release), so a lookup
 * reads cache_n (acquire) and scans without a lock; only a miss takes cache_lock, to create. Attention
 * runs a product per head on every thread, and a lock on each lookup serialised them. */
enum { CACHE_MAX = 1024 };
static prim_entry cache[CACHE_MAX];
static int cache_n;

static int key_eq(const prim_key *x, const prim_key *y) {
  return x->dt == y->dt && x->m == y->m && x->n == y->n && x->k == y->k && x->sa[0] == y->sa[0] && x->sa[1] == y->sa[1] &&
         x->sb[0] == y->sb[0] && x->sb[1] == y->sb[1] && x->ldd == y->ldd && x->ddt == y->ddt && x->bias == y->bias;
}

dnnl_primitive_t apex__onednn_matmul(const dnnl_matmul_desc_t *md, int sum, size_t *scratch) {
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_engine_t eng = apex__onednn_engine();
  *scratch = 0;
  /* oneDNN plans a primitive's split over the threads it sees at creation; apex runs each on one */
  int old = omp_get_max_threads();
  omp_set_num_threads(1);
  int ok = eng && dnnl_primitive_attr_create(&attr) == dnnl_success &&
           dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && sum)
    ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  if (ok && dnnl_primitive_desc_create(&pd, md, attr, eng, NULL) == dnnl_success) {
    const char *impl = NULL;
    /* oneDNN's reference matmul (plain loops) is far slower than apex's own f32 paths: not worth it */
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl && strncmp(impl, "ref", 3) != 0 &&
        dnnl_primitive_create(&prim, pd) == dnnl_success)
      *scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    else
      prim = NULL;
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  omp_set_num_threads(old);
  return prim;
}

/* Creates key's primitive (apex__onednn_matmul); e->prim stays NULL when oneDNN has none. */
static void create(prim_entry *e) {
  const prim_key *q = &e->key;
  dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
  dnnl_dims_t ad = {q->m, q->k}, bd = {q->k, q->n}, cd = {q->m, q->n}, as = {q->sa[0], q->sa[1]}, bs = {q->sb[0], q->sb[1]},
              cs = {q->ldd, 1}, biasd = {1, q->n}, biass = {q->n, 1};
  dnnl_matmul_desc_t md;
  e->prim = NULL;
  e->scratch = 0;
  if (dnnl_memory_desc_init_by_strides(&a_md, 2, ad, q->dt, as) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&b_md, 2, bd, q->dt, bs) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&c_md, 2, cd, q->ddt, cs) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&bias_md, 2, biasd, dnnl_f32, biass) == dnnl_success &&
      dnnl_matmul_desc_init(&md, &a_md, &b_md, q->bias ? &bias_md : NULL, &c_md) == dnnl_success)
    e->prim = apex__onednn_matmul(&md, 0, &e->scratch);
}

/* key's entry from the cache, made on first use. *owned is set when the cache is full and the caller
 * must destroy the primitive after the product. */
static int find(const prim_key *key, int from, int to) {
  for (int i = from; i < to; i++)
    if (key_eq(&cache[i].key, key)) return i;
  return -1;
}

static prim_entry get(const prim_key *key, int *owned) {
  prim_entry e = {*key, NULL, 0};
  *owned = 0;
  int n = __atomic_load_n(&cache_n, __ATOMIC_ACQUIRE), i = find(key, 0, n);
  if (i >= 0) return cache[i];
  pthread_mutex_lock(&cache_lock);
  int now = __atomic_load_n(&cache_n, __ATOMIC_RELAXED); /* another thread may have made it meanwhile */
  if ((i = find(key, n, now)) >= 0) {
    pthread_mutex_unlock(&cache_lock);
    return cache[i];
  }
  create(&e);
  if (now < CACHE_MAX) {
    cache[now] = e;
    __atomic_store_n(&cache_n, now + 1, __ATOMIC_RELEASE);
  } else
    *owned = e.prim != NULL;
  pthread_mutex_unlock(&cache_lock);
  return e;
}

/* ---- the product --------------------------------------------------------------------------------- */


static size_t up64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Operand x's stored strides for op(x) tile reads: rows of op(x) step by rs, its columns by cs. */
static void strides(int trans, int64_t ld, int64_t s[2]) {
  s[0] = trans ? 1 : ld;
  s[1] = trans ? ld : 1;
}

typedef struct tile_plan {
  int tm, tn, ti, tj;
  int pack_a;         /* op(A) is read from a per-thread panel, a row of tiles at a time */
  int pack_b;         /* op(B) is read from panels made once for the product, shared by the threads */
  int direct;         /* oneDNN writes the tiles into C in place (as f32, or as C's half type) */
  dnnl_data_type_t ddt; /* C's type in the primitive when direct */
  prim_entry e[2][2]; /* [last row of tiles][last column of tiles] */
  int owned[2][2];
} tile_plan;

/* The strides of the tile's op(A) [mi, k] and op(B) [k, nj] as oneDNN reads them: in place, or in a
 * panel that keeps the stored orientation (as gemm.c's panels do). */
static prim_key tile_key(dnnl_data_type_t dt, const tile_plan *p, const apex__mat *a, const apex__mat *b, int mi, int nj, int k, int ldc,
                         const float *bias) {
  prim_key q = {dt, mi, nj, k, {0, 0}, {0, 0}, p->direct ? ldc : nj, p->direct ? p->ddt : dnnl_f32, p->direct && bias};
  strides(a->trans, p->pack_a ? (a->trans ? mi : k) : a->ld, q.sa);
  strides(b->trans, p->pack_b ? (b->trans ? k : nj) : b->ld, q.sb);
  return q;
}

/* Lines [lo, lo + w) of op(x) (the stored rows or columns they read) into buf, dense, as dtype dt:
 * rounded to nearest even when x is f32, copied when it is dt already. */
static const void *pack_panel(const apex__mat *x, apex_dtype dt, int by_rows, int lo, int w, int k, uint16_t *buf) {
  size_t es = apex_dtype_size(x->dtype);
  const char *base = (const char *)x->data + (by_rows ? (size_t)lo * x->ld : (size_t)lo) * es;
  int rows = by_rows ? w : k, cols = by_rows ? k : w;
  for (int r = 0; r < rows; r++) {
    const char *src = base + (size_t)r * x->ld * es;
    if (x->dtype == dt)
      memcpy(buf + (size_t)r * cols, src, (size_t)cols * es);
    else
      apex__convert_range(buf + (size_t)r * cols, dt, src, x->dtype, (size_t)cols);
  }
  return buf;
}

static const void *in_place(const apex__mat *x, int by_rows, int lo) {
  return (const char *)x->data + (by_rows ? (size_t)lo * x->ld : (size_t)lo) * apex_dtype_size(x->dtype);
}

/* A thread's memory objects for one tile shape of a product: made at its first tile of that shape and
 * pointed at each next tile's data (dnnl_memory_set_data_handle), not made and destroyed per tile: a
 * product of 16 tiles made 50 to 80 objects a call, each an allocation inside oneDNN. */
typedef struct tile_mem {
  dnnl_memory_t m[5]; /* A, B, C, scratchpad, bias; NULL until made */
  int made;
} tile_mem;

static void tile_mem_free(tile_mem *t) {
  for (int i = 0; i < 5; i++)
    if (t->m[i]) dnnl_memory_destroy(t->m[i]);
  memset(t, 0, sizeof *t);
}

static int make_tile_mem(const prim_entry *e, tile_mem *t) {
  dnnl_memory_desc_t a_md, b_md, c_md, p_md, bias_md;
  dnnl_dims_t ad = {e->key.m, e->key.k}, bd = {e->key.k, e->key.n}, cd = {e->key.m, e->key.n}, pd = {(int64_t)e->scratch};
  dnnl_dims_t as = {e->key.sa[0], e->key.sa[1]}, bs = {e->key.sb[0], e->key.sb[1]}, cs = {e->key.ldd, 1};
  dnnl_dims_t biasd = {1, e->key.n}, biass = {e->key.n, 1};
  t->made = 1;
  int ok = dnnl_memory_desc_init_by_strides(&a_md, 2, ad, e->key.dt, as) == dnnl_success &&
           dnnl_memory_desc_init_by_strides(&b_md, 2, bd, e->key.dt, bs) == dnnl_success &&
           dnnl_memory_desc_init_by_strides(&c_md, 2, cd, e->key.ddt, cs) == dnnl_success &&
           dnnl_memory_create(&t->m[0], &a_md, engine, DNNL_MEMORY_NONE) == dnnl_success &&
           dnnl_memory_create(&t->m[1], &b_md, engine, DNNL_MEMORY_NONE) == dnnl_success &&
           dnnl_memory_create(&t->m[2], &c_md, engine, DNNL_MEMORY_NONE) == dnnl_success;
  if (ok && e->scratch)
    ok = dnnl_memory_desc_init_by_tag(&p_md, 1, pd, dnnl_u8, dnnl_a) == dnnl_success &&
         dnnl_memory_create(&t->m[3], &p_md, engine, DNNL_MEMORY_NONE) == dnnl_success;
  if (ok && e->key.bias)
    ok = dnnl_memory_desc_init_by_strides(&bias_md, 2, biasd, dnnl_f32, biass) == dnnl_success &&
         dnnl_memory_create(&t->m[4], &bias_md, engine, DNNL_MEMORY_NONE) == dnnl_success;
  return ok;
}

static int run_tile(const prim_entry *e, tile_mem *t, dnnl_stream_t s, const void *ap, const void *bp, void *dst, const float *bias, void *pad) {
  if (!t->made && !make_tile_mem(e, t)) return 0;
  if (!t->m[2]) return 0; /* a making that failed */
  int ok = dnnl_memory_set_data_handle(t->m[0], (void *)ap) == dnnl_success && dnnl_memory_set_data_handle(t->m[1], (void *)bp) == dnnl_success &&
           dnnl_memory_set_data_handle(t->m[2], dst) == dnnl_success;
  int nargs = 3;
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, t->m[0]}, {DNNL_ARG_WEIGHTS, t->m[1]}, {DNNL_ARG_DST, t->m[2]}};
  if (ok && e->scratch) {
    ok = dnnl_memory_set_data_handle(t->m[3], pad) == dnnl_success;
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, t->m[3]};
  }
  if (ok && e->key.bias) {
    ok = dnnl_memory_set_data_handle(t->m[4], (void *)bias) == dnnl_success;
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, t->m[4]};
  }
  return ok && dnnl_primitive_execute(e->prim, s, nargs, args) == dnnl_success && dnnl_stream_wait(s) == dnnl_success;
}

/* C's rows [i0, i0 + mi) x [j0, j0 + nj) from the tile's f32 products. */
static void epilogue(float *acc, int mi, int nj, int i0, int j0, float alpha, float beta, void *c, apex_dtype ct, int ldc, const float *bias) {
  size_t es = apex_dtype_size(ct);
  for (int r = 0; r < mi; r++) {
    float *v = acc + (size_t)r * nj;
    char *cr = (char *)c + ((size_t)(i0 + r) * ldc + j0) * es;
    if (alpha != 1.0f)
      for (int x = 0; x < nj; x++) v[x] *= alpha;
    if (bias)
      for (int x = 0; x < nj; x++) v[x] += bias[j0 + x];
    else if (beta != 0.0f && ct == APEX_F32)
      for (int x = 0; x < nj; x++) v[x] += beta * ((const float *)cr)[x];
    if (ct == APEX_F32)
      memcpy(cr, v, (size_t)nj * sizeof(float));
    else
      apex__convert_range(cr, ct, v, APEX_F32, (size_t)nj);
  }
}

apex_status apex__gemm_onednn(const apex_nn_workspace *ws, int m, int n, int k, float alpha, apex__mat a, apex__mat b, float beta, void *c,
                              apex_dtype ct, int ldc, const float *bias, int tm, int tn) {
  if (!apex__onednn_active(NULL) || m <= 0 || n <= 0 || k <= 0 || tm <= 0 || tn <= 0) return APEX_ERR_UNSUPPORTED;
  if (ct != APEX_F32 && beta != 0.0f && !bias) return APEX_ERR_UNSUPPORTED;
  dnnl_data_type_t dt;
  apex_dtype half;
  tile_plan p = {0};
  if (a.dtype == APEX_F16 && b.dtype == APEX_F16)
    dt = dnnl_f16, half = APEX_F16;
  else if (a.dtype == APEX_F32 && b.dtype == APEX_F32 &&
           (f32_mode == APEX__ONEDNN_F32_ALL || (f32_mode == APEX__ONEDNN_F32_TRANS_B && b.trans)))
    dt = dnnl_f32, half = APEX_F32;
  else if ((a.dtype == APEX_BF16 && (b.dtype == APEX_BF16 || b.dtype == APEX_F32)) || (b.dtype == APEX_BF16 && a.dtype == APEX_F32))
    dt = dnnl_bf16, half = APEX_BF16;
  else
    return APEX_ERR_UNSUPPORTED;
  pthread_once(&engine_once, engine_init);
  if (!engine) return APEX_ERR_UNSUPPORTED;

  int lowp = dt != dnnl_f32;
  p.tm = tm < m ? tm : m, p.tn = tn < n ? tn : n;
  /* Half products run in their own grid (apex__onednn_half_grid, above): oneDNN 2.6 takes its brgemm
   * kernel (AVX512_BF16 dot products) only for dense operands and result, and a 256-column tile of a
   * wider B or C is strided, which sent every backward product to its older gemm:jit kernel
   * (bench_gemm gemm_4096x768x768, B as stored, 2 threads: 167-173 GFLOP/s in 256-column tiles,
   * 0.58-0.62x one whole-product primitive in the same run; 303-365 GFLOP/s, 0.75-1.0x, in wide
   * tiles), so tiles start as wide as the product; op(B)'s panels of a column split are packed dense
   * once a product (pack_b below). f32 products keep gemm.c's grid, and their bits. */
  if (lowp) apex__onednn_half_grid(m, n, k, &p.tm, &p.tn);
  p.ti = (m + p.tm - 1) / p.tm, p.tj = (n + p.tn - 1) / p.tn;
  /* An operand is packed into a dense panel when it must be rounded to bf16 (an f32 operand beside
   * a bf16 one) or, for half products, when its tiles are strided in place (see above). */
  int dense_a = a.trans ? p.ti == 1 && a.ld == m : a.ld == k, dense_b = b.trans ? b.ld == k : p.tj == 1 && b.ld == n;
  p.pack_a = a.dtype != half || (lowp && !dense_a);
  p.pack_b = b.dtype != half || (lowp && !dense_b);
  /* The product as oneDNN leaves it is C's value: no scratch tile, no copy (the backward's f32
   * gradient products; a copy of every tile cost 5% of the MLP's O2 step, perf, one thread), where
   * C's tile is dense or the product is f32 (whose primitives take strided results as they are). */
  p.direct = ct == APEX_F32 && alpha == 1.0f && beta == 0.0f && !bias && (!lowp || (p.tj == 1 && ldc == n));
  /* A half product with a dense C, alpha 1 and beta 0 goes further: oneDNN adds the bias and rounds
   * to C's half type as it stores the tile (the f32 scratch tile and the pass over it go). The f32
   * sums are rounded once, to nearest even, as the epilogue's are; oneDNN may add the bias at
   * another point of the sum than after it (test_gemm_onednn bounds the forward at one bf16 ulp
   * beside the f32 summation term, against the portable path). */
  if (lowp && alpha == 1.0f && beta == 0.0f && (ct == APEX_F32 || ct == half) && p.tj == 1 && ldc == n) p.direct = 1;
  p.ddt = ct == APEX_F32 ? dnnl_f32 : dt;
  /* the (at most four) tile shapes: full, last row, last column, corner */
  int usable = 1;
  size_t pad = 0;
  for (int li = 0; li < 2; li++)
    for (int lj = 0; lj < 2; lj++) {
      int mi = li ? m - (p.ti - 1) * p.tm : p.tm, nj = lj ? n - (p.tj - 1) * p.tn : p.tn;
      prim_key q = tile_key(dt, &p, &a, &b, mi, nj, k, ldc, bias);
      p.e[li][lj] = get(&q, &p.owned[li][lj]);
      if (!p.e[li][lj].prim) usable = 0;
      if (p.e[li][lj].scratch > pad) pad = p.e[li][lj].scratch;
    }
  apex_status st = APEX_ERR_UNSUPPORTED;
  if (!usable) goto done;

  /* Scratch for as many threads as could ever run the tiles (the thread cap, at most one a tile), not
   * for the threads running now, which follow the machine's load: the graph's pool must not grow
   * between steps when the load changes (test_autograd's ten thousand steps). op(B)'s panels are
   * made once for all threads (every tile of a column reads the same panel). */
  int nt = p.ti * p.tj, cap = apex_get_max_threads(), slots = nt < cap ? nt : cap, threads = apex_get_num_threads();
  if (slots < 1) slots = 1;
  /* The region takes the whole team even when fewer threads have tiles (workers): libgomp ends the
   * pool threads a smaller team leaves out and makes new ones for the next bigger team, so a product
   * of 8 tiles between regions of 16 threads cost 8 thread exits and creations each (issue #33: the
   * MLP, whose f32 products have 8 tiles, peaked at 8 threads on the 16-core machine). */
  int workers = threads < slots ? threads : slots;
  size_t fb = p.pack_b ? up64((size_t)k * n * 2) : 0, fa = p.pack_a ? up64((size_t)p.tm * k * 2) : 0;
  size_t fc = p.direct ? 0 : up64((size_t)p.tm * p.tn * sizeof(float)), per = fa + fc + up64(pad);
  char *scratch = ws->get(ws->ctx, fb + (size_t)slots * per + 64);
  if (!scratch) {
    st = APEX_ERR_OUT_OF_MEMORY;
    goto done;
  }
  scratch = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  uint16_t *bpanels = (uint16_t *)scratch;
  int failed = 0;
#pragma omp parallel num_threads(threads) if (workers > 1) reduction(| : failed) firstprivate(workers)
  {
    int old = omp_get_max_threads();
    omp_set_num_threads(1);
    if (p.pack_b) {
      /* panel jj holds op(B)'s columns [jj tn, jj tn + nj) dense, at jj tn k elements in */
#pragma omp for schedule(static)
      for (int jj = 0; jj < p.tj; jj++) {
        int j0 = jj * p.tn, nj = n - j0 < p.tn ? n - j0 : p.tn;
        pack_panel(&b, half, b.trans, j0, nj, k, bpanels + (size_t)j0 * k);
      }
    }
    /* worker w runs tiles [lo, hi), a contiguous run as OpenMP's static schedule gives (a row of tiles
     * reuses its op(A) panel); the team's other threads have no tile and no scratch */
    int w = omp_get_thread_num(), lo = 0, hi = 0, team = omp_get_num_threads();
    /* the team OpenMP gave, which may be smaller than asked: one thread inside the caller's own
     * region (test_threads_team), or under bench_scaling's probe, which runs every region on one */
    if (team < workers) workers = team;
    if (w < workers) {
      int q = nt / workers, r = nt % workers;
      lo = w * q + (w < r ? w : r);
      hi = lo + q + (w < r);
    }
    char *mine = scratch + fb + (size_t)(w < workers ? w : 0) * per;
    uint16_t *abuf = (uint16_t *)mine;
    float *acc = (float *)(mine + fa);
    void *padp = mine + fa + fc;
    dnnl_stream_t s = NULL;
    if (lo < hi && dnnl_stream_create(&s, engine, dnnl_stream_default_flags) != dnnl_success) failed = 1;
    const void *ap = NULL;
    int last_i = -1;
    tile_mem tm[2][2];
    memset(tm, 0, sizeof tm);
    for (int t = lo; t < hi; t++) {
      if (failed) continue;
      int i = t / p.tj, jj = t % p.tj, i0 = i * p.tm, j0 = jj * p.tn;
      int mi = m - i0 < p.tm ? m - i0 : p.tm, nj = n - j0 < p.tn ? n - j0 : p.tn;
      if (i != last_i) ap = p.pack_a ? pack_panel(&a, half, !a.trans, i0, mi, k, abuf) : in_place(&a, !a.trans, i0);
      last_i = i;
      const void *bp = p.pack_b ? (const void *)(bpanels + (size_t)j0 * k) : in_place(&b, b.trans, j0);
      void *dst = p.direct ? (char *)c + ((size_t)i0 * ldc + j0) * apex_dtype_size(ct) : (void *)acc;
      int li = i == p.ti - 1, lj = jj == p.tj - 1;
      if (!run_tile(&p.e[li][lj], &tm[li][lj], s, ap, bp, dst, bias ? bias + j0 : NULL, padp)) {
        failed = 1;
        continue;
      }
      if (!p.direct) epilogue(acc, mi, nj, i0, j0, alpha, beta, c, ct, ldc, bias);
    }
    for (int li = 0; li < 2; li++)
      for (int lj = 0; lj < 2; lj++) tile_mem_free(&tm[li][lj]);
    if (s) dnnl_stream_destroy(s);
    omp_set_num_threads(old);
  }
  /* Every primitive here was created for this layout and gets its scratchpad from us, so a run fails
   * only when oneDNN cannot allocate (its memory objects); C may then hold some tiles already. */
  st = failed ? apex__fail(APEX_ERR_OUT_OF_MEMORY,
                           "gemm (oneDNN): a matmul primitive failed to run a [%d, %d] x [%d, %d] product; free memory, or set "
                           "APEX_CPU_ISA=avx512 to take the f32 path",
                           m, k, k, n)
              : APEX_OK;
  if (st == APEX_OK) __atomic_fetch_add(&products, 1, __ATOMIC_RELAXED);
done:
  for (int li = 0; li < 2; li++)
    for (int lj = 0; lj < 2; lj++)
      if (p.owned[li][lj]) dnnl_primitive_destroy(p.e[li][lj].prim);
  return st;
}

#else /* built without oneDNN */

void *apex__onednn_engine(void) { return NULL; }

int apex__onednn_active(const char **why) {
  if (why) *why = "this build has no oneDNN (install libdnnl-dev and reconfigure)";
  return 0;
}

apex_status apex__gemm_onednn(const apex_nn_workspace *ws, int m, int n, int k, float alpha, apex__mat a, apex__mat b, float beta, void *c,
                              apex_dtype ct, int ldc, const float *bias, int tm, int tn) {
  (void)ws, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)b, (void)beta, (void)c, (void)ct, (void)ldc, (void)bias, (void)tm, (void)tn;
  return APEX_ERR_UNSUPPORTED;
}

#endif
