/* test_multi_tensor.c: the multi-tensor kernels, after Apex's tests/L0/run_amp/test_multi_tensor_*.py.
 *
 * Reference: each kernel's result is recomputed element by element with the scalar conversions
 * (widen, compute in f32, round to nearest even); norms are recomputed in f64. Sizes straddle the
 * chunk size (chunk-1, chunk, chunk+1) for chunks 333, 33333 and 65536, with 1 and 55 tensors, for
 * every input/output dtype pair, and Inf or NaN placed at the first, a middle and the last element
 * must raise the overflow flag exactly then. The baseline and AVX2 copies of the kernels agree bit for
 * bit. */
#include <math.h>
#include <stdlib.h>

#include "apex/cpu.h"
#include "apex/threads.h"
#include "backend/backend.h"
#include "testutil.h"

static const apex_dtype all_dtypes[3] = {APEX_F32, APEX_F16, APEX_BF16};
static const size_t chunk_sizes[3] = {333, 33333, 65536};

typedef struct {
  int n;
  apex_tensor **t;
} tlist;

/* n tensors: sizes alternate between `size` and 555 (Apex pairs a varying size with a fixed one). */
static tlist make_list(apex_dtype dt, int n, size_t size, uint64_t seed) {
  tlist l = {n, calloc((size_t)n, sizeof(apex_tensor *))};
  for (int i = 0; i < n; i++) l.t[i] = tu_random_tensor(dt, i % 2 ? 555 : size, seed + (uint64_t)i, 10.0f);
  return l;
}

static void free_list(tlist l) {
  for (int i = 0; i < l.n; i++) apex_tensor_destroy(l.t[i]);
  free(l.t);
}

/* Element i of t narrowed from f32 through t's dtype (the reference rounding). */
static float round_to(apex_dtype dt, float v) {
  if (dt == APEX_F16) return apex_f16_to_f32(apex_f32_to_f16(v));
  if (dt == APEX_BF16) return apex_bf16_to_f32(apex_f32_to_bf16(v));
  return v;
}

static void check_scaled(tlist in, tlist out, float s) {
  for (int k = 0; k < in.n; k++)
    for (size_t i = 0; i < apex_tensor_numel(in.t[k]); i++) {
      float want = round_to(apex_tensor_dtype(out.t[k]), apex_tensor_get(in.t[k], i) * s);
      float got = apex_tensor_get(out.t[k], i);
      if (tu_bits(want) != tu_bits(got)) fail_msg("tensor %d element %zu: %a, expected %a", k, i, got, want);
    }
}

/* Sets element `which` (0 first, 1 middle, 2 last) of the whole list to v; returns the tensor. */
static apex_tensor *inject(tlist l, int which, float v, size_t *at) {
  apex_tensor *t = which == 0 ? l.t[0] : which == 1 ? l.t[l.n / 2] : l.t[l.n - 1];
  size_t n = apex_tensor_numel(t);
  *at = which == 0 ? 0 : which == 1 ? n / 2 : n - 1;
  apex_tensor_set(t, *at, v);
  return t;
}

static void test_scale_all_cases(void **state) {
  (void)state;
  const float s = 0.37f;
  const int counts[2] = {1, 55};
  for (int ci = 0; ci < 3; ci++)
    for (int delta = -1; delta <= 1; delta++)
      for (int ni = 0; ni < 2; ni++)
        for (int a = 0; a < 3; a++)
          for (int b = 0; b < 3; b++) {
            size_t cs = chunk_sizes[ci], size = cs + (size_t)(ptrdiff_t)delta;
            tlist in = make_list(all_dtypes[a], counts[ni], size, 100);
            tlist out = make_list(all_dtypes[b], counts[ni], size, 900);
            int flag = 0;
            TU_OK(apex_mt_scale(cs, &flag, in.t, out.t, in.n, s));
            if (flag) fail_msg("flag set on finite data (chunk %zu, size %zu)", cs, size);
            check_scaled(in, out, s);
            for (int which = 0; which < 3; which++)
              for (int nan = 0; nan < 2; nan++) {
                size_t at;
                apex_tensor *t = inject(in, which, nan ? NAN : INFINITY, &at);
                flag = 0;
                TU_OK(apex_mt_scale(cs, &flag, in.t, out.t, in.n, s));
                if (!flag) fail_msg("%s at position %d not flagged (chunk %zu, size %zu, %d tensors, %s->%s)", nan ? "NaN" : "Inf",
                                    which, cs, size, in.n, apex_dtype_name(all_dtypes[a]), apex_dtype_name(all_dtypes[b]));
                apex_tensor_set(t, at, 1.0f);
              }
            /* The flag is sticky: a clean launch after a dirty one does not clear it. */
            flag = 1;
            TU_OK(apex_mt_scale(cs, &flag, in.t, out.t, in.n, s));
            assert_int_equal(flag, 1);
            free_list(in);
            free_list(out);
          }
}

static void test_scale_in_place_and_threads(void **state) {
  (void)state;
  for (int d = 0; d < 3; d++) {
    tlist a = make_list(all_dtypes[d], 7, 100000, 5), b = make_list(all_dtypes[d], 7, 100000, 5);
    tlist ref = make_list(all_dtypes[d], 7, 100000, 5);
    TU_OK(apex_set_num_threads(1));
    TU_OK(apex_mt_scale(333, NULL, a.t, a.t, a.n, 3.0f));
    TU_OK(apex_set_num_threads(2));
    TU_OK(apex_mt_scale(333, NULL, b.t, b.t, b.n, 3.0f));
    for (int k = 0; k < a.n; k++) assert_memory_equal(apex_tensor_data(a.t[k]), apex_tensor_data(b.t[k]), apex_tensor_nbytes(a.t[k]));
    check_scaled(ref, a, 3.0f);
    free_list(a);
    free_list(b);
    free_list(ref);
  }
}

static void test_axpby(void **state) {
  (void)state;
  const float A = 2.0f, B = -0.75f;
  for (int ci = 0; ci < 3; ci++)
    for (int dx = 0; dx < 3; dx++)
      for (int dy = 0; dy < 3; dy++)
        for (int dout = 0; dout < 3; dout++) {
          size_t cs = chunk_sizes[ci];
          tlist x = make_list(all_dtypes[dx], 3, cs + 1, 1), y = make_list(all_dtypes[dy], 3, cs + 1, 50);
          tlist out = make_list(all_dtypes[dout], 3, cs + 1, 80);
          int flag = 0;
          TU_OK(apex_mt_axpby(cs, &flag, x.t, y.t, out.t, 3, A, B, -1));
          assert_int_equal(flag, 0);
          for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < apex_tensor_numel(x.t[k]); i++) {
              float want = round_to(all_dtypes[dout], A * apex_tensor_get(x.t[k], i) + B * apex_tensor_get(y.t[k], i));
              if (tu_bits(want) != tu_bits(apex_tensor_get(out.t[k], i))) fail_msg("axpby tensor %d element %zu", k, i);
            }
          /* arg_to_check: an Inf in y is seen by -1 and 1, not by 0. */
          apex_tensor_set(y.t[2], 5, INFINITY);
          for (int check = -1; check <= 1; check++) {
            flag = 0;
            TU_OK(apex_mt_axpby(cs, &flag, x.t, y.t, out.t, 3, A, B, check));
            assert_int_equal(flag, check != 0);
          }
          free_list(x);
          free_list(y);
          free_list(out);
        }
}

/* f64 reference norms of a list. */
static void ref_norms(tlist l, float inv_scale, double *global, double *per) {
  *global = 0;
  for (int k = 0; k < l.n; k++) {
    double s = 0;
    for (size_t i = 0; i < apex_tensor_numel(l.t[k]); i++) {
      double v = (double)(apex_tensor_get(l.t[k], i) * inv_scale);
      s += v * v;
    }
    per[k] = sqrt(s);
    *global += s;
  }
  *global = sqrt(*global);
}

static void test_l2norm(void **state) {
  (void)state;
  for (int ci = 0; ci < 3; ci++)
    for (int d = 0; d < 3; d++)
      for (int unscale = 0; unscale < 2; unscale++) {
        size_t cs = chunk_sizes[ci];
        tlist x = make_list(all_dtypes[d], 55, cs - 1, 11);
        float inv = unscale ? 1.0f / 1024.0f : 1.0f;
        float g1, g2, per1[55], per2[55];
        double gref, pref[55];
        int flag = 0;
        TU_OK(apex_set_num_threads(1));
        if (unscale) TU_OK(apex_mt_unscale_l2norm(cs, &flag, x.t, x.n, inv, &g1, per1));
        else TU_OK(apex_mt_l2norm(cs, &flag, x.t, x.n, &g1, per1));
        TU_OK(apex_set_num_threads(2));
        if (unscale) TU_OK(apex_mt_unscale_l2norm(cs, &flag, x.t, x.n, inv, &g2, per2));
        else TU_OK(apex_mt_l2norm(cs, &flag, x.t, x.n, &g2, per2));
        assert_int_equal(flag, 0);
        assert_int_equal(tu_bits(g1), tu_bits(g2)); /* bitwise the same at 1 and 2 threads */
        assert_memory_equal(per1, per2, sizeof per1);
        ref_norms(x, inv, &gref, pref);
        assert_true(fabs(g1 - gref) <= 1e-5 * gref);
        for (int k = 0; k < x.n; k++) assert_true(fabs(per1[k] - pref[k]) <= 1e-5 * pref[k]);
        size_t at;
        inject(x, 1, NAN, &at);
        TU_OK(apex_mt_l2norm(cs, &flag, x.t, x.n, &g1, NULL));
        assert_int_equal(flag, 1);
        assert_true(isnan(g1));
        free_list(x);
      }
}

/* The reference: any element that is not finite, read one by one through apex_tensor_get. */
static int ref_has_nonfinite(apex_tensor *const *t, int n) {
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < apex_tensor_numel(t[k]); i++)
      if (!isfinite(apex_tensor_get(t[k], i))) return 1;
  return 0;
}

/* apex_mt_check_finite over a list mixing f32, f16 and bf16 tensors that span several chunks: 0 for
 * finite values (the largest finite of each dtype included), 1 for Inf, -Inf or NaN wherever it sits;
 * the answer overwrites the int (no accumulation), nothing is written, and both SIMD paths agree. */
static void test_check_finite(void **state) {
  (void)state;
  const size_t sizes[5] = {70001, 555, 131072, 1, 4099};
  apex_tensor *t[5];
  for (int k = 0; k < 5; k++) t[k] = tu_random_tensor(all_dtypes[k % 3], sizes[k], 90 + (uint64_t)k, 10.0f);
  apex_tensor_set(t[0], 7, 3.4028235e38f);   /* FLT_MAX */
  apex_tensor_set(t[1], 8, 65504.0f);        /* f16's largest finite */
  apex_tensor_set(t[2], 9, 3.3895314e38f);   /* bf16's largest finite */
  apex_cpu_isa levels[3];
  const int nl = tu_kernel_isa_levels(levels);
  const float bad[3] = {INFINITY, -INFINITY, NAN};
  for (int p = 0; p < nl; p++) {
    TU_OK(apex_cpu_set_max_isa(levels[p]));
    int found = 7;
    TU_OK(apex_mt_check_finite(t, 5, &found));
    assert_int_equal(found, 0);
    assert_int_equal(ref_has_nonfinite(t, 5), 0);
    for (int k = 0; k < 5; k++)
      for (int where = 0; where < 3; where++) {
        size_t at = where == 0 ? 0 : where == 1 ? sizes[k] / 2 : sizes[k] - 1;
        float old = apex_tensor_get(t[k], at);
        apex_tensor_set(t[k], at, bad[(k + where) % 3]);
        uint8_t *copy = malloc(apex_tensor_nbytes(t[k]));
        memcpy(copy, apex_tensor_data(t[k]), apex_tensor_nbytes(t[k]));
        found = 0;
        TU_OK(apex_mt_check_finite(t, 5, &found));
        assert_int_equal(found, ref_has_nonfinite(t, 5));
        assert_int_equal(found, 1);
        assert_memory_equal(copy, apex_tensor_data(t[k]), apex_tensor_nbytes(t[k])); /* read only */
        free(copy);
        apex_tensor_set(t[k], at, old);
        TU_OK(apex_mt_check_finite(t, 5, &found)); /* clean again: the answer is 0, not the old 1 */
        assert_int_equal(found, 0);
      }
  }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  int found = 5;
  TU_OK(apex_mt_check_finite(NULL, 0, &found)); /* nothing to check: finite */
  assert_int_equal(found, 0);
  /* Bad input: a message, and the caller's int untouched. */
  found = 5;
  TU_FAILS(apex_mt_check_finite(t, 5, NULL), APEX_ERR_INVALID_ARG, "NULL found_inf");
  TU_FAILS(apex_mt_check_finite(t, -1, &found), APEX_ERR_INVALID_ARG, "negative");
  apex_tensor *holey[2] = {t[0], NULL};
  TU_FAILS(apex_mt_check_finite(holey, 2, &found), APEX_ERR_INVALID_ARG, "tensor 1 is NULL");
  TU_FAILS(apex_mt_check_finite(NULL, 2, &found), APEX_ERR_INVALID_ARG, "NULL");
  assert_int_equal(found, 5);
  for (int k = 0; k < 5; k++) apex_tensor_destroy(t[k]);
}

static void test_flatten_unflatten(void **state) {
  (void)state;
  int64_t s0[2] = {2, 3}, s1[1] = {5}, s2[3] = {1, 2, 2};
  apex_tensor *t[3] = {apex_tensor_create(APEX_F16, 2, s0), apex_tensor_create(APEX_F16, 1, s1),
                       apex_tensor_create(APEX_F16, 3, s2)};
  float v = 0;
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; i < apex_tensor_numel(t[k]); i++) apex_tensor_set(t[k], i, v++);
  apex_tensor *flat = NULL;
  TU_OK(apex_tensor_flatten(t, 3, &flat));
  assert_int_equal(apex_tensor_numel(flat), 15);
  for (size_t i = 0; i < 15; i++) assert_true(apex_tensor_get(flat, i) == (float)i);
  for (int k = 0; k < 3; k++) assert_true(apex_tensor_shares_storage(t[k], flat));
  apex_tensor_set(t[1], 0, 100.0f); /* the originals are views into flat */
  assert_true(apex_tensor_get(flat, 6) == 100.0f);
  /* combine grad for unscale: one pass over the flat buffer, visible through every original */
  int flag = 0;
  TU_OK(apex_mt_unscale_flat(flat, 0.5f, &flag));
  assert_int_equal(flag, 0);
  assert_true(apex_tensor_get(t[2], 3) == 7.0f); /* 14 * 0.5 */
  apex_tensor_set(t[2], 3, INFINITY);
  TU_OK(apex_mt_unscale_flat(flat, 0.5f, &flag));
  assert_int_equal(flag, 1);
  apex_tensor *views[3];
  TU_OK(apex_tensor_unflatten(flat, t, 3, views));
  for (int k = 0; k < 3; k++) {
    assert_true(apex_tensor_same_shape(views[k], t[k]));
    assert_ptr_equal(apex_tensor_data(views[k]), apex_tensor_data(t[k]));
    apex_tensor_destroy(views[k]);
  }
  apex_tensor_destroy(flat); /* the originals keep the buffer alive */
  assert_true(apex_tensor_get(t[0], 1) == 0.25f); /* 1 unscaled twice by 0.5 */
  for (int k = 0; k < 3; k++) apex_tensor_destroy(t[k]);
}

/* Every kernel is compiled for the baseline, AVX2 and AVX-512 (backend/cpu/simd_kernel.h): every copy
 * this CPU runs gives the portable bits, overflow flags included. Odd sizes put tails in the tile loops. */
static void test_simd_paths_agree(void **state) {
  (void)state;
  apex_cpu_isa levels[3];
  const int nl = tu_kernel_isa_levels(levels);
  for (int d = 0; d < 3; d++)
    for (int bad = 0; bad < 2; bad++) {
      tlist x[3], y[3];
      float norms[3][5], global[3];
      int flags[3][3];
      for (int r = 0; r < nl; r++) {
        TU_OK(apex_cpu_set_max_isa(levels[r]));
        x[r] = make_list(all_dtypes[d], 5, 4099, 21);
        y[r] = make_list(all_dtypes[d], 5, 4099, 41);
        size_t at;
        if (bad) inject(x[r], 1, NAN, &at);
        flags[r][0] = flags[r][1] = flags[r][2] = 0;
        TU_OK(apex_mt_unscale_l2norm(333, &flags[r][0], x[r].t, x[r].n, 0.125f, &global[r], norms[r]));
        TU_OK(apex_mt_axpby(333, &flags[r][1], x[r].t, y[r].t, y[r].t, x[r].n, 0.7f, -1.3f, -1));
        TU_OK(apex_mt_scale(333, &flags[r][2], y[r].t, x[r].t, x[r].n, 3.0f));
      }
      assert_int_equal(flags[0][0], bad);
      for (int r = 1; r < nl; r++) {
        assert_memory_equal(flags[0], flags[r], sizeof flags[0]);
        assert_int_equal(tu_bits(global[0]), tu_bits(global[r]));
        for (int k = 0; k < 5; k++) {
          assert_int_equal(tu_bits(norms[0][k]), tu_bits(norms[r][k]));
          assert_memory_equal(apex_tensor_data(x[0].t[k]), apex_tensor_data(x[r].t[k]), apex_tensor_nbytes(x[0].t[k]));
          assert_memory_equal(apex_tensor_data(y[0].t[k]), apex_tensor_data(y[r].t[k]), apex_tensor_nbytes(y[0].t[k]));
        }
      }
      for (int r = 0; r < nl; r++) {
        free_list(x[r]);
        free_list(y[r]);
      }
    }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
}

/* ---- the fused bf16 flush + unscale slot (backend/args_mt.h) ---- */

/* bf16 round to nearest even, written out here as the closed form (quiet NaN kept a NaN). */
static uint16_t ref_bf16(float f) {
  uint32_t u = tu_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* out = bf16(grad + sum) * scale, checked against the closed form at every ISA level and 1-3
 * threads: ties, -0 + +0, values that round past bf16's largest to Inf, NaN, a zero grad (nonzero
 * flag 0) beside stale ones (1), odd sizes for the vector tails, and a chunk size that splits a
 * tensor across threads. */
static void test_flush_unscale(void **state) {
  (void)state;
  const apex_backend *be = apex__backend_need(APEX_DEVICE_CPU, "test");
  assert_non_null(be);
  assert_non_null(be->mt_flush_unscale);
  const int64_t sizes[3] = {4099, 17, 300};
  apex_tensor *grad[3], *sum[3], *out[3];
  for (int i = 0; i < 3; i++) {
    grad[i] = apex_tensor_create(APEX_BF16, 1, &sizes[i]);
    sum[i] = tu_random_tensor(APEX_F32, sizes[i], 50 + (uint64_t)i, 3.0f);
    out[i] = apex_tensor_create(APEX_F32, 1, &sizes[i]);
    uint16_t *g = apex_tensor_data(grad[i]);
    for (int64_t e = 0; e < sizes[i]; e++) g[e] = i == 1 ? 0 : ref_bf16((float)((e * 7919) % 201 - 100) / 64.0f);
  }
  float *s0 = apex_tensor_data(sum[0]);
  uint16_t *g0 = apex_tensor_data(grad[0]);
  s0[0] = f32_of(0x3F808000u), g0[0] = 0;                 /* a tie: rounds to even (1.0) */
  s0[1] = f32_of(0x3F818000u), g0[1] = 0;                 /* a tie: rounds up to even */
  s0[2] = -0.0f, g0[2] = 0;                               /* +0 + -0 = +0 */
  s0[3] = f32_of(0x7F7FFFFFu), g0[3] = 0;                 /* f32's largest: rounds to Inf in bf16 */
  const apex_cpu_isa isas[3] = {APEX_CPU_ISA_PORTABLE, APEX_CPU_ISA_AVX2, APEX_CPU_ISA_AVX512};
  const float scales[2] = {1.0f, 0x1p-16f};
  int threads = apex_get_num_threads();
  for (int bad = 0; bad < 2; bad++)
    for (int sc = 0; sc < 2; sc++)
      for (int isa = 0; isa < 3; isa++)
        for (int th = 1; th <= 3; th++) {
          float *s2 = apex_tensor_data(sum[2]);
          s2[5] = bad ? NAN : 0.5f;
          TU_OK(apex_cpu_set_max_isa(isas[isa]));
          TU_OK(apex_set_num_threads(th));
          int overflow = 0;
          unsigned char nz[3] = {9, 9, 9};
          TU_OK(be->mt_flush_unscale(&(apex_mt_flush_unscale_args){.fn = "test", .chunk_size = 1000, .n = 3, .grad = grad, .sum = sum,
                                                                   .out = out, .scale = scales[sc], .overflow = &overflow,
                                                                   .nonzero = nz}));
          assert_int_equal(overflow, 1); /* s0[3] rounds to Inf */
          assert_int_equal(nz[0], 1);
          assert_int_equal(nz[1], 0);
          assert_int_equal(nz[2], 1);
          for (int i = 0; i < 3; i++) {
            const uint16_t *g = apex_tensor_data(grad[i]);
            const float *sm = apex_tensor_data(sum[i]), *o = apex_tensor_data(out[i]);
            for (int64_t e = 0; e < sizes[i]; e++) {
              float want = f32_of((uint32_t)ref_bf16(f32_of((uint32_t)g[e] << 16) + sm[e]) << 16) * scales[sc];
              if (tu_bits(o[e]) != tu_bits(want))
                fail_msg("isa %d, %d threads, scale %g: tensor %d element %lld is %a, want %a", isa, th, (double)scales[sc], i,
                         (long long)e, (double)o[e], (double)want);
            }
          }
          float *o0 = apex_tensor_data(out[0]);
          assert_true(o0[0] == scales[sc] && tu_bits(o0[1]) == tu_bits(f32_of(0x3F820000u) * scales[sc]) && tu_bits(o0[2]) == 0);
        }
  TU_OK(apex_cpu_set_max_isa(APEX_CPU_ISA_NATIVE));
  TU_OK(apex_set_num_threads(threads));
  /* Refusals: another dtype, NULL lists, a negative count; nothing written. */
  int overflow = 0;
  apex_tensor *f32g[1] = {sum[0]};
  TU_FAILS(be->mt_flush_unscale(&(apex_mt_flush_unscale_args){.fn = "test", .n = 1, .grad = f32g, .sum = sum, .out = out, .scale = 1.0f,
                                                              .overflow = &overflow}),
           APEX_ERR_DTYPE, "bf16 grad");
  TU_FAILS(be->mt_flush_unscale(&(apex_mt_flush_unscale_args){.fn = "test", .n = 1, .grad = grad, .scale = 1.0f}), APEX_ERR_INVALID_ARG,
           "NULL tensor list");
  TU_FAILS(be->mt_flush_unscale(&(apex_mt_flush_unscale_args){.fn = "test", .n = -1, .scale = 1.0f}), APEX_ERR_INVALID_ARG, "negative");
  assert_int_equal(overflow, 0);
  for (int i = 0; i < 3; i++) {
    apex_tensor_destroy(grad[i]);
    apex_tensor_destroy(sum[i]);
    apex_tensor_destroy(out[i]);
  }
}

static void test_bad_input(void **state) {
  (void)state;
  tlist a = make_list(APEX_F32, 3, 10, 1), b = make_list(APEX_F32, 3, 11, 1);
  int flag = 0;
  TU_FAILS(apex_mt_scale(0, &flag, a.t, b.t, 3, 1.0f), APEX_ERR_SHAPE, "tensor 0 has 10 elements in list 0 but 11 in list 1");
  TU_FAILS(apex_mt_scale(0, &flag, a.t, NULL, 3, 1.0f), APEX_ERR_INVALID_ARG, "list 1 is NULL");
  TU_FAILS(apex_mt_axpby(0, &flag, a.t, a.t, a.t, 3, 1, 1, 2), APEX_ERR_INVALID_ARG, "arg_to_check");
  TU_FAILS(apex_mt_l2norm(0, &flag, a.t, -1, NULL, NULL), APEX_ERR_INVALID_ARG, "negative");
  apex_tensor *holey[2] = {a.t[0], NULL};
  TU_FAILS(apex_mt_l2norm(0, &flag, holey, 2, NULL, NULL), APEX_ERR_INVALID_ARG, "tensor 1 is NULL");
  apex_mt_launch L = {.nlists = 6, .ntensors = 1, .kernel = NULL};
  TU_FAILS(apex_multi_tensor_apply(&L, &flag), APEX_ERR_INVALID_ARG, "no kernel");
  assert_int_equal(flag, 0);
  /* flatten refuses mixed dtypes, duplicates and caller memory, changing nothing */
  apex_tensor *h = tu_random_tensor(APEX_F16, 4, 1, 1.0f);
  apex_tensor *mixed[2] = {a.t[0], h}, *dup[2] = {a.t[0], a.t[0]}, *flat = NULL;
  void *before = apex_tensor_data(a.t[0]);
  TU_FAILS(apex_tensor_flatten(mixed, 2, &flat), APEX_ERR_DTYPE, "tensor 1 is f16 but tensor 0 is f32");
  TU_FAILS(apex_tensor_flatten(dup, 2, &flat), APEX_ERR_INVALID_ARG, "appears twice");
  float mem[4];
  int64_t four = 4;
  apex_tensor *w = apex_tensor_wrap(mem, APEX_F32, 1, &four);
  apex_tensor *withw[2] = {a.t[0], w};
  TU_FAILS(apex_tensor_flatten(withw, 2, &flat), APEX_ERR_INVALID_ARG, "caller memory");
  TU_FAILS(apex_tensor_flatten(a.t, 0, &flat), APEX_ERR_INVALID_ARG, "at least one");
  assert_null(flat);
  assert_ptr_equal(apex_tensor_data(a.t[0]), before);
  apex_tensor *views[3];
  TU_FAILS(apex_tensor_unflatten(h, a.t, 3, views), APEX_ERR_SHAPE, "hold 575 elements but the flat tensor has 4");
  apex_tensor_destroy(w);
  apex_tensor_destroy(h);
  free_list(a);
  free_list(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scale_all_cases), cmocka_unit_test(test_scale_in_place_and_threads),
      cmocka_unit_test(test_axpby),           cmocka_unit_test(test_l2norm),
      cmocka_unit_test(test_flatten_unflatten), cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_simd_paths_agree), cmocka_unit_test(test_check_finite),
      cmocka_unit_test(test_flush_unscale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
