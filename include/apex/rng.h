/* rng.h: a counter-based random number generator (Philox 4x32-10, Salmon et al., SC'11).
 *
 * A draw depends only on (seed, offset), never on which thread made it or how many threads there
 * are, and the CUDA backend computes the same numbers. An apex_rng is a small value type: copy it
 * to save it, assign it to restore it. Element i of a fill starting at offset o comes from counter
 * block o + i / 4, lane i % 4; after a fill of n elements the offset advances by ceil(n / 4). */
#ifndef APEX_RNG_H
#define APEX_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct apex_rng {
  uint64_t seed;
  uint64_t offset; /* in blocks of 4 draws */
} apex_rng;

/* A generator at offset 0. */
APEX_API apex_rng apex_rng_init(uint64_t seed);
/* The raw Philox4x32-10 block for (key = seed, counter = (ctr, 0)): four 32-bit words (nothing but
 * an APEX_ERR_INVALID_ARG message for a NULL out). */
APEX_API void apex_philox4x32(uint64_t seed, uint64_t ctr, uint32_t out[4]);
/* n uniform floats in [0, 1) (24 random bits each). */
APEX_API apex_status apex_rng_uniform(apex_rng *rng, float *out, size_t n);
/* n normal floats N(mean, std^2) by Box-Muller on the lanes of each block. */
APEX_API apex_status apex_rng_normal(apex_rng *rng, float *out, size_t n, float mean, float std);
/* n independent Bernoulli(p_keep) draws as 0/1 bytes, for dropout masks. */
APEX_API apex_status apex_rng_bernoulli(apex_rng *rng, uint8_t *out, size_t n, float p_keep);

#ifdef __cplusplus
}
#endif
#endif
