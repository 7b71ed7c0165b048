/* runtime/rt_vmath.h -- elementary functions the compiler can vectorise, for the
 * runtime's CPU kernels (internal: included by rt_attention.c and rt_route.c).
 *
 * libm's expf is a call, so a loop that calls it stays scalar.  rt_exp_nonpos is
 * straight-line float arithmetic (no branches, no calls, no table), so a loop
 * over it vectorises at -O3 without -ffast-math, and it returns the same bits on
 * every x86-64 code path (no FMA contraction in ISO C).
 *
 * Domain: the arguments softmax and log-sum-exp produce, x <= 0 (x - max).
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, then Cephes' degree-7
 * polynomial for e^r, scaled by 2^n built in the exponent bits.  Relative error
 * below 8.2e-8 (1.4 ulp; checked over every float in [-87.3, 0], and sampled by
 * tests/runtime/test_vmath.c); x < -87.3 (where e^x < 2^-126, a
 * subnormal) gives 0; -inf gives 0; NaN gives NaN.  x > 0 is outside the domain
 * but (0, 88] still comes out right, and x > 88 gives +inf. */
#ifndef PARC_RT_VMATH_H
#define PARC_RT_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float rt_exp_nonpos(float x) {
  const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  const float round_magic = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */
  float xc = x >= -87.3f && x <= 88.0f ? x : -87.3f;  /* NaN too: no undefined cast */
  float n = (xc * log2e + round_magic) - round_magic;  /* nearest integer, in [-126, 0] */
  float r = (xc - n * ln2_hi) - n * ln2_lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) * (1 << 23);
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  float y = p * two_n;
  return x != x ? x : x < -87.3f ? 0.0f : x > 88.0f ? (float)HUGE_VAL : y;
}

#endif
