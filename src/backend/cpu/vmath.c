/* vmath.c: vectorised f32 tanh and erf for the CPU backend's GELUs and tanh (vmath.h), replacing
 * per-element calls of libm's tanhf and erff: tanhf took about a third of a bf16 GPT training step
 * (issue #17).
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
 * 2^k built in the exponent bits.
 *
 * erf(a) = 2/sqrt(pi) a sum_n (-1)^n a^2n / (n! (2n + 1)), the Taylor series to n = 65 in double for
 * a = |x| clamped to 4 (erf rounds to 1 in f32 from a ~ 3.92): at a = 4 the last term is 7e-15 and
 * the largest ~1e5, so the sum's rounding errors stay near 1e5 * 2^-53 = 2^-36 absolute, under 2^-12
 * of an f32 ulp of erf there, and relatively smaller for smaller a. */
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

#define ERF_TERMS 66
#define ERF_CLAMP 4.0
#define TWO_OVER_SQRTPI 1.12837916709551257390
/* (-1)^n / (n! (2n + 1)), each correctly rounded (computed as exact fractions) */
static const double ERF_C[ERF_TERMS] = {
    0x1.0000000000000p+0, -0x1.5555555555555p-2, 0x1.999999999999ap-4, -0x1.8618618618618p-6,
    0x1.2f684bda12f68p-8, -0x1.8d3018d3018d3p-11, 0x1.c01c01c01c01cp-14, -0x1.bbd779334ef0bp-17,
    0x1.87a00187a0018p-20, -0x1.3777c55568ccdp-23, 0x1.c2e3054870b38p-27, -0x1.2b67310aa9f3ap-30,
    0x1.6f448e13e85e1p-34, -0x1.a289ee7e40f74p-38, 0x1.bd577e658d020p-42, -0x1.bc6250fb14231p-46,
    0x1.a173a167fba4dp-50, -0x1.7271cbe5863ecp-54, 0x1.377c2110f2083p-58, -0x1.f1b4073b34a68p-63,
    0x1.7abd72258fb6ep-67, -0x1.13246abce1bddp-71, 0x1.7e6b81382cd42p-76, -0x1.fd6bebd65107ap-81,
    0x1.45c0a838efe59p-85, -0x1.909c9de3a31c5p-90, 0x1.da7460554e5dbp-95, -0x1.0eef30fa10d2cp-99,
    0x1.2ac65385f79acp-104, -0x1.3e81bb5701ac5p-109, 0x1.4899fcdef0a8dp-114, -0x1.486eea20c2656p-119,
    0x1.3e53defc4e233p-124, -0x1.2b778acc3dedfp-129, 0x1.11ae81077a49ep-134, -0x1.e6597092ccbf0p-140,
    0x1.a47767f2a3c32p-145, -0x1.61f30bc3acd1ap-150, 0x1.22521d98f98a9p-155, -0x1.d05cc9e3507c9p-161,
    0x1.6a513f56f8a2fp-166, -0x1.13f85fc9e143ep-171, 0x1.9aa19d4d16643p-177, -0x1.2a8fa59ffec31p-182,
    0x1.a8830736a5123p-188, -0x1.273d8edcec957p-193, 0x1.91ef82b367a95p-199, -0x1.0be5a4cd94283p-204,
    0x1.5dd4c9219115ap-210, -0x1.bfb10e0f68c50p-216, 0x1.18d952ef00889p-221, -0x1.59982b2e94840p-227,
    0x1.a13ec00b39f6fp-233, -0x1.ee6cefaa5a158p-239, 0x1.1f9dec94da5f8p-244, -0x1.48a6b3820b441p-250,
    0x1.70f41ac13e2a1p-256, -0x1.970f1cb2ad53fp-262, 0x1.b97d90d3e603bp-268, -0x1.d6db2a7c68dcbp-274,
    0x1.edf1e6e4658a9p-280, -0x1.fdcf88bbf71dbp-286, 0x1.02eb04e5f82f5p-291, -0x1.02e2bc1b5790ep-297,
    0x1.fdbe706576d5dp-304, -0x1.ee3d33862f55bp-310};

/* erf of each lane of x, as tanh_VD. */
#define VM_ERF(VD, VI)                                                                                        \
  VM_INLINE VD erf_##VD(VD x) {                                                                               \
    const VI sign_bit = (VI){0} + (long long)0x8000000000000000ull;                                          \
    VI xb = (VI)x, sign = xb & sign_bit;                                                                      \
    VD a = (VD)(xb & ~sign_bit);                                                                              \
    VI big = a > ERF_CLAMP;                                                                                   \
    a = (VD)(((VI)a & ~big) | ((VI)((VD){0} + ERF_CLAMP) & big));                                             \
    VD s = a * a, p = (VD){0} + ERF_C[ERF_TERMS - 1];                                                         \
    for (int i = ERF_TERMS - 2; i >= 0; i--) p = p * s + ERF_C[i];                                            \
    VI res = (VI)(a * TWO_OVER_SQRTPI * p) | sign;                                                            \
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

/* The vector helpers are always inlined, so no vector crosses a call; they are compiled for the ISA
 * whose registers their vectors fill, so that GCC has no ABI change to note (-Wpsabi) at their
 * definitions. The code is generated where they are inlined, under the same target. */
#pragma GCC push_options
#pragma GCC target("avx512f")
VM_TANH(vd8, vi8)
VM_ERF(vd8, vi8)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2")
VM_TANH(vd4, vi4)
VM_ERF(vd4, vi4)
#pragma GCC pop_options
__attribute__((target("avx512f"))) VM_MAP(vtanh_avx512, tanh_vd8, vf8, vd8)
__attribute__((target("avx2"))) VM_MAP(vtanh_avx2, tanh_vd4, vf4, vd4)
__attribute__((target("avx512f"))) VM_MAP(verf_avx512, erf_vd8, vf8, vd8)
__attribute__((target("avx2"))) VM_MAP(verf_avx2, erf_vd4, vf4, vd4)

typedef void vm_fn(const float *x, float *out, size_t n);

/* The AVX-512 copy or the AVX2 one under the ISA cap, or 0 (write nothing) at the portable ISA. */
static int vm_run(vm_fn *avx512, vm_fn *avx2, const float *x, float *out, size_t n) {
  apex_cpu_isa isa = apex_cpu_max_isa();
  if (isa >= APEX_CPU_ISA_AVX512) {
    avx512(x, out, n);
    return 1;
  }
  if (isa >= APEX_CPU_ISA_AVX2) {
    avx2(x, out, n);
    return 1;
  }
  return 0;
}
#endif

int apex__vmath_vector(void) {
#if VMATH_X86
  return apex_cpu_max_isa() >= APEX_CPU_ISA_AVX2;
#else
  return 0;
#endif
}

int apex__vtanh(const float *x, float *out, size_t n) {
#if VMATH_X86
  return vm_run(vtanh_avx512, vtanh_avx2, x, out, n);
#else
  (void)x, (void)out, (void)n;
  return 0;
#endif
}

int apex__verf(const float *x, float *out, size_t n) {
#if VMATH_X86
  return vm_run(verf_avx512, verf_avx2, x, out, n);
#else
  (void)x, (void)out, (void)n;
  return 0;
#endif
}
