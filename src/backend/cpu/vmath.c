/* vmath.c: vectorised f32 tanh for the CPU backend's GELU (tanh approximation) and tanh
 * (vmath.h), replacing per-element calls of libm's tanhf, which took about a third of a bf16 GPT
 * training step (issue #17).
 *
 * Why double: tanh(a) = 1 - 2 / (e^2a + 1) loses the leading bits to cancellation as a -> 0 (16x
 * at a = 1/16), which in f32 arithmetic would cost several ulps; each f32 lane is widened to double,
 * where the same formula (and a Taylor series below a = 1/16) is accurate to ~2^-44, so the one
 * rounding back to f32 gives the correctly rounded tanh except where the exact value lies within
 * ~2^-20 ulp of a rounding boundary: at most 1 ulp from the exact tanh. Double halves the lanes, but
 * the loop is still far faster than libm's scalar tanhf.
 *
 * The body is written once in GCC vector extensions over a double vector of D lanes and compiled
 * for AVX-512 (D = 8) and AVX2 (D = 4). apex builds ISO C, where GCC does not contract a * b + c
 * into an FMA, so each lane runs the same IEEE operations at both widths: the same bits
 * (test_vmath checks it). e^y is computed as 2^k e^r: k = nearest(y / ln 2) by the add-and-subtract
 * of 1.5 * 2^52, r = y - k ln 2 in two parts (k * LN2_HI is exact: |k| <= 58 and LN2_HI has 32
 * trailing zero bits), e^r by its Taylor series to r^12 (|r| <= ln2 / 2: truncation < 2^-52), and
 * 2^k built in the exponent bits. */
#include "backend/cpu/vmath.h"

#include <string.h>

#include "apex/cpu.h"
#include "core/internal.h"

#if APEX_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
#define VMATH_X86 1
#else
#define VMATH_X86 0
#endif

#if VMATH_X86
#define VM_INLINE static inline __attribute__((always_inline))

#define LN2_HI 6.93147180369123816490e-01 /* 0x3fe62e42fee00000 */
#define LN2_LO 1.90821492927058770002e-10
#define LOG2E 1.44269504088896338700
#define ROUND_MAGIC 0x1.8p52
/* Beyond this |x|, tanh(x) rounds to +-1 in f32 (from |x| ~ 9.01) and in double (~ 19.1): clamping
 * here keeps e^2a finite. */
#define TANH_CLAMP 20.0
/* Below this |x| the Taylor series to x^9 is used: its next term is < 2^-46 of tanh(x). */
#define TANH_SMALL 0.0625

/* tanh of each lane of x: VD a double vector, VI the int64 vector of the same size. */
#define VM_TANH(VD, VI)                                                                                       \
  VM_INLINE VD tanh_##VD(VD x) {                                                                              \
    const VI sign_bit = (VI){0} + (long long)0x8000000000000000ull;                                          \
    VI xb = (VI)x, sign = xb & sign_bit;                                                                      \
    VD a = (VD)(xb & ~sign_bit);                                                                              \
    VI big = a > TANH_CLAMP; /* NaN compares false and is restored at the end */                              \
    a = (VD)(((VI)a & ~big) | ((VI)((VD){0} + TANH_CLAMP) & big));                                            \
    /* e = e^2a */                                                                                            \
    VD y = a + a;                                                                                             \
    VD km = y * LOG2E + ROUND_MAGIC;                                                                          \
    VD k = km - ROUND_MAGIC;                                                                                  \
    VD r = (y - k * LN2_HI) - k * LN2_LO;                                                                     \
    VD p = (VD){0} + 1.0 / 479001600.0;                                                                                \
    p = p * r + 1.0 / 39916800.0;                                                                             \
    p = p * r + 1.0 / 3628800.0;                                                                              \
    p = p * r + 1.0 / 362880.0;                                                                               \
    p = p * r + 1.0 / 40320.0;                                                                                \
    p = p * r + 1.0 / 5040.0;                                                                                 \
    p = p * r + 1.0 / 720.0;                                                                                  \
    p = p * r + 1.0 / 120.0;                                                                                  \
    p = p * r + 1.0 / 24.0;                                                                                   \
    p = p * r + 1.0 / 6.0;                                                                                    \
    p = p * r + 0.5;                                                                                          \
    p = p * r + 1.0;                                                                                          \
    p = p * r + 1.0;                                                                                          \
    VI scale = (((VI)km - (VI)((VD){0} + ROUND_MAGIC)) + 1023) << 52;                                         \
    VD e = p * (VD)scale;                                                                                     \
    VD t = 1.0 - 2.0 / (e + 1.0);                                                                             \
    /* near 0: x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 */                                                \
    VD s = a * a;                                                                                             \
    VD q = (VD){0} + 62.0 / 2835.0;                                                                                    \
    q = q * s - 17.0 / 315.0;                                                                                 \
    q = q * s + 2.0 / 15.0;                                                                                   \
    q = q * s - 1.0 / 3.0;                                                                                    \
    VD ts = a + a * (s * q);                                                                                  \
    VI small = a < TANH_SMALL;                                                                                \
    VI res = (((VI)ts & small) | ((VI)t & ~small)) | sign;                                                    \
    VI nan = x != x;                                                                                          \
    return (VD)((res & ~nan) | ((VI)(x + x) & nan));                                                          \
  }

/* out[i] = f(x[i]) for i < n, D = sizeof(VD) / 8 elements a step, the last partial step padded. */
#define VM_MAP(NAME, F, VF, VD)                                                                               \
  static void NAME(const float *x, float *out, size_t n) {                                                   \
    enum { D = sizeof(VD) / sizeof(double) };                                                                 \
    size_t i = 0;                                                                                             \
    for (; i + D <= n; i += D) {                                                                              \
      VF v;                                                                                                   \
      memcpy(&v, x + i, sizeof v);                                                                            \
      v = __builtin_convertvector(F(__builtin_convertvector(v, VD)), VF);                                     \
      memcpy(out + i, &v, sizeof v);                                                                          \
    }                                                                                                         \
    if (i < n) {                                                                                              \
      float buf[D] = {0};                                                                                     \
      memcpy(buf, x + i, (n - i) * sizeof *buf);                                                              \
      VF v;                                                                                                   \
      memcpy(&v, buf, sizeof v);                                                                              \
      v = __builtin_convertvector(F(__builtin_convertvector(v, VD)), VF);                                     \
      memcpy(buf, &v, sizeof v);                                                                              \
      memcpy(out + i, buf, (n - i) * sizeof *buf);                                                            \
    }                                                                                                         \
  }

typedef double vd8 __attribute__((vector_size(64)));
typedef long long vi8 __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd4 __attribute__((vector_size(32)));
typedef long long vi4 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

/* the vector helpers are always inlined, so no vector crosses a call; GCC warns at the end of the file */
#pragma GCC diagnostic ignored "-Wpsabi"
VM_TANH(vd8, vi8)
VM_TANH(vd4, vi4)
__attribute__((target("avx512f"))) VM_MAP(vtanh_avx512, tanh_vd8, vf8, vd8)
__attribute__((target("avx2"))) VM_MAP(vtanh_avx2, tanh_vd4, vf4, vd4)
#endif

int apex__vtanh(const float *x, float *out, size_t n) {
#if VMATH_X86
  apex_cpu_isa isa = apex_cpu_max_isa();
  if (isa >= APEX_CPU_ISA_AVX512) {
    vtanh_avx512(x, out, n);
    return 1;
  }
  if (isa >= APEX_CPU_ISA_AVX2) {
    vtanh_avx2(x, out, n);
    return 1;
  }
#else
  (void)x, (void)out, (void)n;
#endif
  return 0;
}
