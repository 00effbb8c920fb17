/* convert_avx512.c: the AVX-512 path for conversions, sixteen lanes at a time, chosen by
 * apex__convert_range when the ISA level (apex/cpu.h) is avx512 or above. Each function is compiled
 * for AVX-512F alone (a target attribute; the file needs no special flags) and only called after
 * apex_cpu_max_isa() said the CPU has it.
 *
 * Same bits as the portable path (convert_scalar.h), checked over every f32 and every 16-bit input at
 * each ISA level by test_dtype_exhaustive:
 *  - f32 -> bf16 rounds with integer ops (add 0x7FFF plus the kept lsb, shift), as the portable path
 *    does. Not AVX512_BF16's VCVTNEPS2BF16: it flushes denormal inputs to zero whatever MXCSR says,
 *    and apex keeps them (bf16 shares f32's exponent, so every f32 denormal has a bf16 neighbour).
 *  - bf16 -> f32 is a shift, with a signalling NaN quieted as the portable path quiets it.
 *  - f16 <-> f32 is VCVTPS2PH / VCVTPH2PS on zmm with the rounding given in the instruction (nearest
 *    even, MXCSR not read); they quiet a NaN keeping its top payload bits and keep denormals both
 *    ways, which is what the portable path was written to match.
 * A tail shorter than sixteen goes through a zero-padded sixteen-element buffer, so that short rows
 * (a row helper's [., 65] logits row) never fall back to the portable loop. */
#include <string.h>

#include "core/internal.h"

#if APEX_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f")))
#define INLINE512 static inline __attribute__((always_inline, target("avx512f")))

/* Sixteen f32 bit patterns to sixteen bf16 patterns. */
INLINE512 __m256i bf16_round16(__m512i x) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
  __m512i hi = _mm512_srli_epi32(x, 16);
  __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  /* Every lane is below 2^16 now, so the truncating narrow (VPMOVDW) keeps it whole. */
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
}

/* Sixteen bf16 patterns to sixteen f32 patterns. */
INLINE512 __m512i bf16_widen16(__m256i b) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16);
  __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
  return _mm512_mask_or_epi32(x, is_nan, x, _mm512_set1_epi32(0x00400000));
}

INLINE512 __m256i f16_round16(__m512i x) {
  return _mm512_cvtps_ph(_mm512_castsi512_ps(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

INLINE512 __m512i f16_widen16(__m256i h) { return _mm512_castps_si512(_mm512_cvtph_ps(h)); }

/* One narrowing loop and one widening loop, each expanded for its kernel; the tail runs the same
 * kernel on a zero-padded copy. */
#define NARROW_LOOP(kernel)                                                                         \
  do {                                                                                              \
    size_t i = 0;                                                                                   \
    for (; i + 16 <= n; i += 16)                                                                    \
      _mm256_storeu_si256((__m256i *)(dst + i), kernel(_mm512_loadu_si512((const void *)(src + i)))); \
    if (i < n) {                                                                                    \
      float in[16] = {0};                                                                           \
      uint16_t out[16];                                                                             \
      memcpy(in, src + i, (n - i) * sizeof *src);                                                   \
      _mm256_storeu_si256((__m256i *)out, kernel(_mm512_loadu_si512((const void *)in)));            \
      memcpy(dst + i, out, (n - i) * sizeof *dst);                                                  \
    }                                                                                               \
  } while (0)

#define WIDEN_LOOP(kernel)                                                                          \
  do {                                                                                              \
    size_t i = 0;                                                                                   \
    for (; i + 16 <= n; i += 16)                                                                    \
      _mm512_storeu_si512((void *)(dst + i), kernel(_mm256_loadu_si256((const __m256i *)(src + i)))); \
    if (i < n) {                                                                                    \
      uint16_t in[16] = {0};                                                                        \
      float out[16];                                                                                \
      memcpy(in, src + i, (n - i) * sizeof *src);                                                   \
      _mm512_storeu_si512((void *)out, kernel(_mm256_loadu_si256((const __m256i *)in)));            \
      memcpy(dst + i, out, (n - i) * sizeof *dst);                                                  \
    }                                                                                               \
  } while (0)

AVX512 static void f32_to_bf16(uint16_t *dst, const float *src, size_t n) { NARROW_LOOP(bf16_round16); }
AVX512 static void f32_to_f16(uint16_t *dst, const float *src, size_t n) { NARROW_LOOP(f16_round16); }
AVX512 static void bf16_to_f32(float *dst, const uint16_t *src, size_t n) { WIDEN_LOOP(bf16_widen16); }
AVX512 static void f16_to_f32(float *dst, const uint16_t *src, size_t n) { WIDEN_LOOP(f16_widen16); }

/* f16 <-> bf16: widen sixteen exactly, round once. */
AVX512 static void f16_to_bf16(uint16_t *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    uint16_t in[16] = {0}, out[16];
    size_t len = n - i < 16 ? n - i : 16;
    memcpy(in, src + i, len * 2);
    _mm256_storeu_si256((__m256i *)out, bf16_round16(f16_widen16(_mm256_loadu_si256((const __m256i *)in))));
    memcpy(dst + i, out, len * 2);
  }
}

AVX512 static void bf16_to_f16(uint16_t *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    uint16_t in[16] = {0}, out[16];
    size_t len = n - i < 16 ? n - i : 16;
    memcpy(in, src + i, len * 2);
    _mm256_storeu_si256((__m256i *)out, f16_round16(bf16_widen16(_mm256_loadu_si256((const __m256i *)in))));
    memcpy(dst + i, out, len * 2);
  }
}

void apex__convert_avx512(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  if (src_type == APEX_F32 && dst_type == APEX_BF16) f32_to_bf16(dst, src, n);
  else if (src_type == APEX_BF16 && dst_type == APEX_F32) bf16_to_f32(dst, src, n);
  else if (src_type == APEX_F32 && dst_type == APEX_F16) f32_to_f16(dst, src, n);
  else if (src_type == APEX_F16 && dst_type == APEX_F32) f16_to_f32(dst, src, n);
  else if (src_type == APEX_F16 && dst_type == APEX_BF16) f16_to_bf16(dst, src, n);
  else if (src_type == APEX_BF16 && dst_type == APEX_F16) bf16_to_f16(dst, src, n);
  else apex__convert_portable(dst, dst_type, src, src_type, n); /* same type: a copy */
}

#endif
