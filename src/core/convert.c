/* convert.c: dtype facts, scalar conversions, and bulk conversion split over threads.
 *
 * The bulk path splits the array into fixed blocks of APEX_THREAD_BLOCK elements; each block goes to
 * the single-threaded kernel of the ISA level in effect (apex_cpu_max_isa): convert_avx512.c from
 * avx512 up, convert_avx2.c at avx2, else the portable loop here, which is the reference the other
 * two match bit for bit. */
#include <string.h>
#include <strings.h>

#include "apex/cpu.h"
#include "core/convert_scalar.h"
#include "core/internal.h"

size_t apex_dtype_size(apex_dtype dtype) {
  switch (dtype) {
  case APEX_F32: return 4;
  case APEX_F16:
  case APEX_BF16: return 2;
  default: return 0;
  }
}

const char *apex_dtype_name(apex_dtype dtype) {
  switch (dtype) {
  case APEX_F32: return "f32";
  case APEX_F16: return "f16";
  case APEX_BF16: return "bf16";
  default: return "invalid";
  }
}

apex_status apex_dtype_parse(const char *name, apex_dtype *out) {
  static const struct { const char *name; apex_dtype dtype; } names[] = {
      {"f32", APEX_F32},  {"float32", APEX_F32}, {"float", APEX_F32},     {"f16", APEX_F16},
      {"float16", APEX_F16}, {"half", APEX_F16}, {"bf16", APEX_BF16}, {"bfloat16", APEX_BF16},
  };
  if (!name || !out) return apex__fail(APEX_ERR_INVALID_ARG, "apex_dtype_parse: NULL argument");
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcasecmp(name, names[i].name) == 0) {
      *out = names[i].dtype;
      return APEX_OK;
    }
  }
  return apex__fail(APEX_ERR_INVALID_ARG, "unknown dtype '%s'; expected f32, f16 or bf16", name);
}

apex_status apex__check_dtype(apex_dtype dtype, const char *what) {
  if ((unsigned)dtype >= APEX_DTYPE_COUNT)
    return apex__fail(APEX_ERR_DTYPE, "%s: invalid dtype %d (expected APEX_F32, APEX_F16 or APEX_BF16)", what, (int)dtype);
  return APEX_OK;
}

float apex_f16_to_f32(uint16_t h) { return apex__f16_to_f32(h); }
uint16_t apex_f32_to_f16(float f) { return apex__f32_to_f16(f); }
float apex_bf16_to_f32(uint16_t b) { return apex__bf16_to_f32(b); }
uint16_t apex_f32_to_bf16(float f) { return apex__f32_to_bf16(f); }

/* Loads element i of a buffer of the given type as f32. */
static inline float apex_load(const void *p, apex_dtype t, size_t i) {
  switch (t) {
  case APEX_F16: return apex__f16_to_f32(((const uint16_t *)p)[i]);
  case APEX_BF16: return apex__bf16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

void apex__convert_portable(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  if (dst_type == src_type) {
    if (dst != src) memcpy(dst, src, n * apex_dtype_size(dst_type));
    return;
  }
  switch (dst_type) {
  case APEX_F32:
    for (size_t i = 0; i < n; i++) ((float *)dst)[i] = apex_load(src, src_type, i);
    break;
  case APEX_F16:
    for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = apex__f32_to_f16(apex_load(src, src_type, i));
    break;
  case APEX_BF16:
    for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = apex__f32_to_bf16(apex_load(src, src_type, i));
    break;
  default: break;
  }
}

void apex__convert_range(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
#if APEX_HAVE_X86
  apex_cpu_isa isa = apex_cpu_max_isa();
  if (isa >= APEX_CPU_ISA_AVX512) {
    apex__convert_avx512(dst, dst_type, src, src_type, n);
    return;
  }
  if (isa >= APEX_CPU_ISA_AVX2) {
    apex__convert_avx2(dst, dst_type, src, src_type, n);
    return;
  }
#endif
  apex__convert_portable(dst, dst_type, src, src_type, n);
}

apex_status apex_convert(void *dst, apex_dtype dst_type, const void *src, apex_dtype src_type, size_t n) {
  apex_status st;
  if ((st = apex__check_dtype(dst_type, "apex_convert: destination")) != APEX_OK) return st;
  if ((st = apex__check_dtype(src_type, "apex_convert: source")) != APEX_OK) return st;
  if (n == 0) return APEX_OK;
  if (!dst || !src) return apex__fail(APEX_ERR_INVALID_ARG, "apex_convert: NULL buffer for %zu elements", n);
  if (dst == src && dst_type != src_type)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_convert: in-place conversion from %s to %s is not supported",
                      apex_dtype_name(src_type), apex_dtype_name(dst_type));
  size_t dsz = apex_dtype_size(dst_type), ssz = apex_dtype_size(src_type);
  long long nblocks = (long long)((n + APEX_THREAD_BLOCK - 1) / APEX_THREAD_BLOCK);
  apex_cpu_max_isa(); /* resolve the path once, before the threads read it */
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (long long b = 0; b < nblocks; b++) {
    size_t start = (size_t)b * APEX_THREAD_BLOCK;
    size_t len = n - start < APEX_THREAD_BLOCK ? n - start : APEX_THREAD_BLOCK;
    apex__convert_range((char *)dst + start * dsz, dst_type, (const char *)src + start * ssz, src_type, len);
  }
  return APEX_OK;
}
