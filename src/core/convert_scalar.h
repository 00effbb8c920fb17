/* convert_scalar.h: the reference scalar conversions, inline so that the portable bulk loops and the
 * public scalar functions are the same code. See dtype.h for the rounding and NaN contract. */
#ifndef APEX_CORE_CONVERT_SCALAR_H
#define APEX_CORE_CONVERT_SCALAR_H

#include <stdint.h>
#include <string.h>

/* The CUDA backend compiles these same functions for the device (src/backend/cuda/convert.cu), so that a
 * conversion on the GPU gives the bits the CPU gives. */
#if defined(__CUDACC__)
#define APEX_HD __host__ __device__
#else
#define APEX_HD
#endif

APEX_HD static inline uint32_t apex__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

APEX_HD static inline float apex__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

APEX_HD static inline float apex__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) /* Inf, or NaN made quiet with its payload kept */
    return apex__bits_f32(sign | 0x7F800000u | (mant ? 0x00400000u | (mant << 13) : 0));
  if (exp == 0) {
    if (mant == 0) return apex__bits_f32(sign);
    /* Subnormal: shift the leading one up to the implicit position, lowering the exponent. */
    uint32_t e = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      e--;
    }
    return apex__bits_f32(sign | (e << 23) | ((mant & 0x3FFu) << 13));
  }
  return apex__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

APEX_HD static inline uint16_t apex__f32_to_f16(float f) {
  uint32_t x = apex__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu)); /* quiet NaN */
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to Inf (and Inf) */
  if (ax >= 0x38800000u) { /* normal in f16: rebias the exponent, round the 13 dropped bits to even */
    uint32_t r = ax - 0x38000000u + 0xFFFu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) return sign; /* at most 2^-25: half the smallest subnormal, ties to 0 */
  /* Subnormal in f16: the 24-bit significand shifted right, rounded to nearest even. */
  uint32_t e = ax >> 23;
  uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126u - e;
  uint32_t h = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

APEX_HD static inline float apex__bf16_to_f32(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) x |= 0x00400000u; /* quiet a signalling NaN */
  return apex__bits_f32(x);
}

APEX_HD static inline uint16_t apex__f32_to_bf16(float f) {
  uint32_t x = apex__f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

#endif
