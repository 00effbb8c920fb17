/* conv_onednn.c: conv2d's per-image products in bf16 on oneDNN (conv_onednn.h), for conv.c.
 *
 * Why this shape of path: two ways were measured on the benchmark CNN's convolutions (bench_models.c's
 * cnn: [1, 28, 28] -> 32 and [32, 14, 14] -> 64, 3x3, padding 1), one image, one thread, oneDNN 2.6.3
 * on this VM's AVX512_BF16 CPU (no AMX), bf16 in, f32 out, microseconds for forward + backward data +
 * backward weights:
 *   (a) oneDNN's convolution primitive per image: with plain NCHW/OIHW memory it falls back to its
 *       gemm-based f32 implementation, 717 (first conv) and 1624 us (second); with the blocked
 *       layouts it picks (format_tag_any) 21 and 130 us (forward 2.1 and 15, backward weights 3.1
 *       and 101), before the reorders between NCHW and the blocked layouts each image would need.
 *   (b) bf16 im2col + oneDNN's matmul (brgemm) per image: the three products take 6.2 and 49 us
 *       (418 to 473 GFLOP/s on the second conv's [64, 288] x [288, 196], its transposes and the
 *       weight gradient's [64, 196] x [196, 288]); im2col and col2im add about 15 us to the second.
 * (b) is kept: about twice as fast on the second conv, which is nearly all of the CNN's convolution
 * work, and it keeps conv.c's image loop, its cols and its fixed sums over images, so determinism
 * comes from the same place as the f32 path's. For the f32 sgemm the same products run at about 105
 * GFLOP/s.
 *
 * The primitives are this file's own, not apex__gemm_onednn's tiles: that function plans a tile grid,
 * looks its primitives up, makes a stream and memory objects and opens an OpenMP region
 * on every call, and conv.c calls it three times per image. Here a thread makes its stream and each
 * product's memory objects once per conv2d call and rebinds them to each image's data
 * (dnnl_memory_set_data_handle). The weight gradient adds the run's partial with a sum post-op
 * (old + product, the f32 add of the beta = 1 epilogue it replaces: the same bits), and the f32 output
 * gradient is rounded to bf16 once per image (apex__conv_onednn_round) for both backward products,
 * which had each rounded it (same values, same bits). The forward keeps its own f32 bias add and
 * rounding (epilogue below): tried here, oneDNN 2.6.3's matmul offered no primitive this file accepts
 * for a per-row bias (its bias [o, 1], or a binary-add post-op of one), so conv2d fell back to its f32
 * path; computing out^T instead would need a transposed output. Measured on the benchmark CNN's O2 step
 * (perf, 2 threads, 40 steps, shares of the samples): apex__gemm_onednn's own code, its OpenMP region
 * and its rounding of the gradient had been 0.6 + 0.8 + 1.5%, now gone; libdnnl's non-JIT code
 * 2.3 -> 1.6%; the forward's epilogue 3.2 -> 1.8% (its bias read once per row, not once per element).
 *
 * Determinism: every primitive is created with OpenMP's thread count at 1 on the creating thread, so
 * it runs single-threaded on whichever thread calls it and an image's bits are a function of its
 * shape and operands only. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_onednn.h"
#include "backend/cpu/gemm_onednn.h"
#include "core/internal.h"

static unsigned long products;

unsigned long apex__conv_onednn_products(void) { return __atomic_load_n(&products, __ATOMIC_RELAXED); }

int apex__conv_onednn_wanted(apex_dtype x, apex_dtype w) {
  return x == w && (x == APEX_BF16 || x == APEX_F16) && apex__onednn_active(NULL);
}

apex__conv_dnn_scratch *apex__conv_onednn_scratch(int n) {
  apex__conv_dnn_scratch *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
  if (!s) apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): no memory for %d threads' scratch; free memory", n);
  return s;
}

/* *buf with at least bytes, grown (its old contents dropped) when smaller; NULL after a message. */
static void *grow(void **buf, size_t *have, size_t bytes) {
  if (bytes <= *have) return *buf;
  free(*buf);
  *have = 0;
  if (!(*buf = malloc(bytes ? bytes : 1))) {
    apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): no memory for %zu bytes of product scratch; free memory", bytes);
    return NULL;
  }
  *have = bytes;
  return *buf;
}

const uint16_t *apex__conv_onednn_round(apex__conv_dnn_scratch *s, int o, int p, const float *gout, apex_dtype dt) {
  if (dt != APEX_BF16) return NULL; /* an f32 gradient is never rounded to f16, whose range it could overflow */
  uint16_t *g = grow((void **)&s->g16, &s->g16_bytes, (size_t)o * p * sizeof(uint16_t));
  if (g) apex__convert_range(g, APEX_BF16, gout, APEX_F32, (size_t)o * p);
  return g;
}

#if APEX_HAVE_DNNL

#include <omp.h>
#include <pthread.h>

#include <dnnl.h>

/* What fixes a primitive: which product, its operands' dtype, the shape, the output's dtype, and
 * whether it adds the partial already in its output (extra: the weight gradient's sum). */
enum { FWD, WGRAD, DGRAD };
typedef struct prim_key {
  int kind, o, k, p, extra;
  dnnl_data_type_t dt, out;
} prim_key;

typedef struct prim_entry {
  prim_key key;
  dnnl_primitive_t prim; /* NULL: oneDNN has no primitive (or only its reference loops) for this key */
  size_t scratch;        /* bytes of user scratchpad it needs */
} prim_entry;

/* A model has a handful of convolutions, each with three products (and the weight gradient's first
 * image without the sum); past the cache's size primitives are made per call. */
enum { CACHE_MAX = 256 };
static prim_entry cache[CACHE_MAX];
static int cache_n;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The product's operands and output as matrices: C [m, n] = A [m, kk] B [kk, n], each with its
 * strides (a transpose is a stride). */
typedef struct mat_descs {
  dnnl_memory_desc_t a, b, c;
} mat_descs;

static int descs(const prim_key *q, mat_descs *d) {
  int64_t m, n, kk;
  dnnl_dims_t as, bs;
  if (q->kind == FWD) { /* out [o, p] = w [o, k] cols [k, p] */
    m = q->o, n = q->p, kk = q->k;
    as[0] = q->k, as[1] = 1, bs[0] = q->p, bs[1] = 1;
  } else if (q->kind == WGRAD) { /* part [o, k] = gout [o, p] cols [k, p]^T */
    m = q->o, n = q->k, kk = q->p;
    as[0] = q->p, as[1] = 1, bs[0] = 1, bs[1] = q->p;
  } else { /* gcols [k, p] = w [o, k]^T gout [o, p] */
    m = q->k, n = q->p, kk = q->o;
    as[0] = 1, as[1] = q->k, bs[0] = q->p, bs[1] = 1;
  }
  dnnl_dims_t ad = {m, kk}, bd = {kk, n}, cd = {m, n}, cs = {n, 1};
  return dnnl_memory_desc_init_by_strides(&d->a, 2, ad, q->dt, as) == dnnl_success &&
         dnnl_memory_desc_init_by_strides(&d->b, 2, bd, q->dt, bs) == dnnl_success &&
         dnnl_memory_desc_init_by_strides(&d->c, 2, cd, q->out, cs) == dnnl_success;
}

/* Creates key's primitive (apex__onednn_matmul; the weight gradient's later images add into C
 * through a sum post-op); e->prim stays NULL when oneDNN has none. */
static void create(prim_entry *e) {
  const prim_key *q = &e->key;
  mat_descs d;
  dnnl_matmul_desc_t md;
  e->prim = NULL;
  e->scratch = 0;
  if (descs(q, &d) && dnnl_matmul_desc_init(&md, &d.a, &d.b, NULL, &d.c) == dnnl_success)
    e->prim = apex__onednn_matmul(&md, q->kind == WGRAD && q->extra, &e->scratch);
}

static int find(const prim_key *key, int from, int to) {
  for (int i = from; i < to; i++)
    if (!memcmp(&cache[i].key, key, sizeof *key)) return i;
  return -1;
}

/* key's entry, made on first use; *owned when the cache is full and the caller destroys it. Every
 * thread of a conv2d call looks its primitives up: a hit reads the published entries without a lock
 * (an entry is written before cache_n is raised past it, release/acquire); a miss creates under it. */
static prim_entry get(const prim_key *key, int *owned) {
  prim_entry e = {*key, NULL, 0};
  *owned = 0;
  int n = __atomic_load_n(&cache_n, __ATOMIC_ACQUIRE), i = find(key, 0, n);
  if (i >= 0) return cache[i];
  pthread_mutex_lock(&cache_lock);
  int now = __atomic_load_n(&cache_n, __ATOMIC_RELAXED);
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

/* One product kind's state on one thread: its primitive and memory objects (a, b, c, scratchpad), made on the first image and rebound to each next image's data. */
typedef struct dnn_slot {
  int ready;
  prim_entry e;
  int owned;
  dnnl_memory_t mem[4];
} dnn_slot;

static void slot_release(dnn_slot *sl) {
  for (int i = 0; i < 4; i++)
    if (sl->mem[i]) dnnl_memory_destroy(sl->mem[i]);
  if (sl->owned) dnnl_primitive_destroy(sl->e.prim);
  memset(sl, 0, sizeof *sl);
}

/* The thread's slot for key (a different key than the slot held, as the weight gradient's first
 * image of a run without the sum and the rest with it, drops the old one); NULL with *st set when
 * oneDNN has no primitive (APEX_ERR_UNSUPPORTED, no message) or no memory for its objects. */
static dnn_slot *slot_for(apex__conv_dnn_scratch *s, const prim_key *key, apex_status *st) {
  dnnl_engine_t engine = apex__onednn_engine();
  int which = key->kind * 2 + (key->extra != 0);
  dnn_slot *sl = (dnn_slot *)s->slot[which];
  *st = APEX_ERR_UNSUPPORTED;
  if (!engine) return NULL;
  if (!sl && !(sl = s->slot[which] = calloc(1, sizeof *sl))) {
    *st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): no memory for a thread's product state; free memory");
    return NULL;
  }
  if (sl->ready && !memcmp(&sl->e.key, key, sizeof *key)) return sl;
  slot_release(sl);
  sl->e = get(key, &sl->owned);
  if (!sl->e.prim) return NULL;
  if (!s->stream && dnnl_stream_create((dnnl_stream_t *)&s->stream, engine, dnnl_stream_default_flags) != dnnl_success) s->stream = NULL;
  mat_descs d;
  dnnl_memory_desc_t pmd;
  dnnl_dims_t pdims = {(int64_t)sl->e.scratch};
  const dnnl_memory_desc_t *mds[3] = {&d.a, &d.b, &d.c};
  int ok = s->stream && descs(key, &d) && dnnl_memory_desc_init_by_tag(&pmd, 1, pdims, dnnl_u8, dnnl_a) == dnnl_success;
  for (int i = 0; ok && i < 3; i++) ok = dnnl_memory_create(&sl->mem[i], mds[i], engine, DNNL_MEMORY_NONE) == dnnl_success;
  if (ok && sl->e.scratch) ok = dnnl_memory_create(&sl->mem[3], &pmd, engine, DNNL_MEMORY_NONE) == dnnl_success;
  if (!ok) {
    slot_release(sl);
    *st = apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): could not make a product's stream or memory objects; free memory, or set "
                                             "APEX_CPU_ISA=avx512 to take the f32 path");
    return NULL;
  }
  sl->ready = 1;
  return sl;
}

/* Runs key's product on this thread: c = a b (+ c for the weight gradient's sum). */
static apex_status product(apex__conv_dnn_scratch *s, const prim_key *key, const void *a, const void *b, void *c) {
  apex_status st;
  dnn_slot *sl = slot_for(s, key, &st);
  if (!sl) return st;
  void *pad = NULL;
  if (sl->e.scratch && !(pad = grow(&s->pad, &s->pad_bytes, sl->e.scratch))) return APEX_ERR_OUT_OF_MEMORY;
  const void *data[4] = {a, b, c, pad};
  static const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
  dnnl_exec_arg_t args[4];
  int nargs = 0, ok = 1;
  for (int i = 0; i < 4; i++) {
    if (!data[i] || !sl->mem[i]) continue;
    ok = ok && dnnl_memory_set_data_handle(sl->mem[i], (void *)data[i]) == dnnl_success;
    args[nargs].arg = arg[i], args[nargs].memory = sl->mem[i], nargs++;
  }
  int old = omp_get_max_threads();
  omp_set_num_threads(1);
  ok = ok && dnnl_primitive_execute(sl->e.prim, (dnnl_stream_t)s->stream, nargs, args) == dnnl_success &&
       dnnl_stream_wait((dnnl_stream_t)s->stream) == dnnl_success;
  omp_set_num_threads(old);
  if (!ok)
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "conv2d (oneDNN): a matmul primitive failed to run an image's product; free memory, or set "
                                              "APEX_CPU_ISA=avx512 to take the f32 path");
  __atomic_fetch_add(&products, 1, __ATOMIC_RELAXED);
  return APEX_OK;
}

/* The forward's f32 products acc [o, p] plus the bias, rounded into out when it is not f32: each row
 * once, while it is in cache. The same f32 adds and rounding as apex__gemm_onednn's epilogue. */
static void epilogue(float *acc, int o, int p, const float *bias, void *out, apex_dtype out_dtype) {
  size_t es = apex_dtype_size(out_dtype);
  for (int r = 0; r < o; r++) {
    float *restrict v = acc + (size_t)r * p;
    if (bias) {
      const float b = bias[r];
      for (int x = 0; x < p; x++) v[x] += b;
    }
    if (out_dtype != APEX_F32) apex__convert_range((char *)out + (size_t)r * p * es, out_dtype, v, APEX_F32, (size_t)p);
  }
}

static dnnl_data_type_t dnn_dt(apex_dtype t) { return t == APEX_BF16 ? dnnl_bf16 : t == APEX_F16 ? dnnl_f16 : dnnl_f32; }

apex_status apex__conv_onednn_fwd(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *cols,
                                  const float *bias, void *out, apex_dtype out_dtype) {
  float *acc = out_dtype == APEX_F32 ? out : grow((void **)&s->acc, &s->acc_bytes, (size_t)o * p * sizeof(float));
  if (!acc) return APEX_ERR_OUT_OF_MEMORY;
  prim_key key = {FWD, o, k, p, 0, dnn_dt(dt), dnnl_f32};
  apex_status st = product(s, &key, w, cols, acc);
  if (st == APEX_OK) epilogue(acc, o, p, bias, out, out_dtype);
  return st;
}

apex_status apex__conv_onednn_wgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const uint16_t *gout16, const uint16_t *cols, apex_dtype dt,
                                    float *part, int add) {
  prim_key key = {WGRAD, o, k, p, add != 0, dnn_dt(dt), dnnl_f32};
  return product(s, &key, gout16, cols, part);
}

apex_status apex__conv_onednn_dgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *gout16,
                                    float *gcols) {
  prim_key key = {DGRAD, o, k, p, 0, dnn_dt(dt), dnnl_f32};
  return product(s, &key, w, gout16, gcols);
}

void apex__conv_onednn_release(apex__conv_dnn_scratch *s, int n) {
  for (int i = 0; s && i < n; i++) {
    for (int j = 0; j < 6; j++)
      if (s[i].slot[j]) {
        slot_release(s[i].slot[j]);
        free(s[i].slot[j]);
      }
    if (s[i].stream) dnnl_stream_destroy((dnnl_stream_t)s[i].stream);
    free(s[i].pad);
    free(s[i].g16);
    free(s[i].acc);
  }
  free(s);
}

#else /* built without oneDNN: apex__conv_onednn_wanted is 0, and the products say so if asked */

apex_status apex__conv_onednn_fwd(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *cols,
                                  const float *bias, void *out, apex_dtype out_dtype) {
  (void)s, (void)o, (void)k, (void)p, (void)w, (void)dt, (void)cols, (void)bias, (void)out, (void)out_dtype;
  return APEX_ERR_UNSUPPORTED;
}

apex_status apex__conv_onednn_wgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const uint16_t *gout16, const uint16_t *cols, apex_dtype dt,
                                    float *part, int add) {
  (void)s, (void)o, (void)k, (void)p, (void)gout16, (void)cols, (void)dt, (void)part, (void)add;
  return APEX_ERR_UNSUPPORTED;
}

apex_status apex__conv_onednn_dgrad(apex__conv_dnn_scratch *s, int o, int k, int p, const void *w, apex_dtype dt, const uint16_t *gout16,
                                    float *gcols) {
  (void)s, (void)o, (void)k, (void)p, (void)w, (void)dt, (void)gout16, (void)gcols;
  return APEX_ERR_UNSUPPORTED;
}

void apex__conv_onednn_release(apex__conv_dnn_scratch *s, int n) {
  for (int i = 0; s && i < n; i++) {
    free(s[i].pad);
    free(s[i].g16);
    free(s[i].acc);
  }
  free(s);
}

#endif
