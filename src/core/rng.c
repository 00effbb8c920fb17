/* rng.c: Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11) and the uniform, normal and Bernoulli fills built on it.
 *
 * Each output element is a pure function of (seed, offset, index), so fills can be split over any
 * number of threads (or GPU threads) and give the same bits. */
#include <math.h>

#include "apex/rng.h"
#include "core/internal.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Exposed (not in a public header) so that the tests can check the published known-answer vectors,
 * which use all four counter words. */
void apex__philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2], uint32_t out[4]) {
  uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
  uint32_t k0 = key_in[0], k1 = key_in[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

void apex_philox4x32(uint64_t seed, uint64_t ctr, uint32_t out[4]) {
  if (!out) {
    apex__fail_null_arg(__func__, "out");
    return;
  }
  const uint32_t c[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0};
  const uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  apex__philox4x32_10(c, k, out);
}

apex_rng apex_rng_init(uint64_t seed) {
  apex_rng r = {seed, 0};
  return r;
}

/* 24 random bits to [0, 1) exactly representable in f32. */
static inline float to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

typedef enum { FILL_UNIFORM, FILL_NORMAL, FILL_BERNOULLI } fill_kind;

/* Element i of the fill comes from block offset + i / 4, lane i % 4 (Box-Muller pairs lanes 0-1
 * and 2-3, so a normal draw needs its whole pair, which a block always holds). */
static void fill_block(const apex_rng *rng, fill_kind kind, void *out, size_t start, size_t len, float a, float b) {
  for (size_t i = start; i < start + len;) {
    uint32_t w[4];
    size_t blk = i / 4;
    apex_philox4x32(rng->seed, rng->offset + blk, w);
    float z[4];
    if (kind == FILL_NORMAL) {
      for (int p = 0; p < 4; p += 2) {
        /* u1 in (0, 1] so the log is finite; the angle from the other lane. */
        float u1 = (float)((w[p] >> 8) + 1u) * (1.0f / 16777216.0f);
        float u2 = to_unit(w[p + 1]);
        float r = sqrtf(-2.0f * logf(u1));
        float th = 6.28318530717958647692f * u2;
        z[p] = r * cosf(th);
        z[p + 1] = r * sinf(th);
      }
    }
    for (size_t lane = i % 4; lane < 4 && i < start + len; lane++, i++) {
      switch (kind) {
      case FILL_UNIFORM: ((float *)out)[i] = to_unit(w[lane]); break;
      case FILL_NORMAL: ((float *)out)[i] = a + b * z[lane]; break;
      case FILL_BERNOULLI: ((uint8_t *)out)[i] = to_unit(w[lane]) < a; break;
      }
    }
  }
}

static apex_status fill(apex_rng *rng, fill_kind kind, void *out, size_t n, float a, float b, const char *who) {
  if (!rng) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL generator", who);
  if (n == 0) return APEX_OK;
  if (!out) return apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL output for %zu values", who, n);
  long long nblocks = (long long)((n + APEX_THREAD_BLOCK - 1) / APEX_THREAD_BLOCK);
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (long long t = 0; t < nblocks; t++) {
    size_t start = (size_t)t * APEX_THREAD_BLOCK;
    size_t len = n - start < APEX_THREAD_BLOCK ? n - start : APEX_THREAD_BLOCK;
    fill_block(rng, kind, out, start, len, a, b);
  }
  rng->offset += (n + 3) / 4;
  return APEX_OK;
}

apex_status apex_rng_uniform(apex_rng *rng, float *out, size_t n) {
  return fill(rng, FILL_UNIFORM, out, n, 0, 0, "apex_rng_uniform");
}

apex_status apex_rng_normal(apex_rng *rng, float *out, size_t n, float mean, float std) {
  if (!isfinite(mean) || !isfinite(std) || std < 0)
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_rng_normal: mean %g and std %g; need finite values and std >= 0", mean, std);
  return fill(rng, FILL_NORMAL, out, n, mean, std, "apex_rng_normal");
}

apex_status apex_rng_bernoulli(apex_rng *rng, uint8_t *out, size_t n, float p_keep) {
  if (!(p_keep >= 0.0f && p_keep <= 1.0f))
    return apex__fail(APEX_ERR_INVALID_ARG, "apex_rng_bernoulli: probability %g is outside [0, 1]", p_keep);
  return fill(rng, FILL_BERNOULLI, out, n, p_keep, 0, "apex_rng_bernoulli");
}
