/* convert_avx2.c: the x86 fast path for conversions (AVX2 + F16C). Compiled with -mavx2 -mf16c
 * -mfma and only called after apex__cpu_has_avx2(). f16 uses the F16C instructions, whose rounding
 * (nearest even) and NaN handling (quieted, payload kept) the portable path reproduces; bf16 uses the
 * same integer rounding as the portable path, eight lanes at a time. A tail shorter than a vector runs the
 * vector code on a zero-padded copy. */
#include <immintrin.h>
#include <string.h>

#include "core/internal.h"

static void f32_to_f16(uint16_t *dst, const float *src, size_t n, size_t *done) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(dst + i), h);
  }
  *done = i;
}

static void f16_to_f32(float *dst, const uint16_t *src, size_t n, size_t *done) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  *done = i;
}

/* Eight f32 bit patterns to eight bf16 patterns in the low 16 bits of each lane. */
static inline __m256i bf16_round8(__m256i x) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n, size_t *done) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i)));
    __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i + 8)));
    /* packus works per 128-bit lane: fix the order of the four quarters afterwards. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256((__m256i *)(dst + i), packed);
  }
  *done = i;
}

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n, size_t *done) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i))), 16);
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    x = _mm256_or_si256(x, _mm256_and_si256(is_nan, quiet));
    _mm256_storeu_si256((__m256i *)(dst + i), x);
  }
  *done = i;
}

/* f16 <-> bf16 goes through an f32 tile: the widening is exact, so there is one rounding only. */
#define APEX_TILE 512
static void via_f32(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  float tile[APEX_TILE];
  for (size_t i = 0; i < n; i += APEX_TILE) {
    size_t len = n - i < APEX_TILE ? n - i : APEX_TILE;
    apex__convert_avx2(tile, APEX_F32, (const uint16_t *)src + i, src_type, len);
    apex__convert_avx2((uint16_t *)dst + i, dst_type, tile, APEX_F32, len);
  }
}

/* The vector loops for the four f32 pairs: how many leading elements they converted (0 for any other
 * pair). */
static size_t vector_part(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  size_t done = 0;
  if (src_type == APEX_F32 && dst_type == APEX_F16) f32_to_f16(dst, src, n, &done);
  else if (src_type == APEX_F16 && dst_type == APEX_F32) f16_to_f32(dst, src, n, &done);
  else if (src_type == APEX_F32 && dst_type == APEX_BF16) f32_to_bf16(dst, src, n, &done);
  else if (src_type == APEX_BF16 && dst_type == APEX_F32) bf16_to_f32(dst, src, n, &done);
  return done;
}

void apex__convert_avx2(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  if (src_type == dst_type) {
    apex__convert_portable(dst, dst_type, src, src_type, n);
    return;
  }
  int f32_pair = src_type == APEX_F32 || dst_type == APEX_F32;
  if (!f32_pair) {
    via_f32(dst, dst_type, src, src_type, n);
    return;
  }
  size_t done = vector_part(dst, dst_type, src, src_type, n);
  if (done == n) return;
  /* The tail (under sixteen) runs the same vector code on a zero-padded copy: a short row (a row
   * helper's [., 65] logits) would otherwise be a call into the portable loop per row. */
  size_t dsz = apex_dtype_size(dst_type), ssz = apex_dtype_size(src_type), len = n - done;
  float in[16] = {0}, out[16];
  memcpy(in, (const char *)src + done * ssz, len * ssz);
  vector_part(out, dst_type, in, src_type, 16);
  memcpy((char *)dst + done * dsz, out, len * dsz);
}
