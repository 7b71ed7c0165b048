/* tests/runtime/test_vmath.c -- rt_exp_nonpos against exp in double: relative error
 * below 8.2e-8 on a sample of every 257th float in [-87.3, 0] (the header's bound,
 * checked there over every float) and across the positive range it still serves;
 * special values; and that it is a pure function (same bits in a vector loop as
 * one at a time). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_vmath.h"
#include "tests/runtime/check.h"

static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static uint32_t to_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static void test_accuracy(void) {
  double worst = 0;
  float at = 0;
  for (uint32_t u = to_bits(-0.0f); u <= to_bits(-87.3f); u += 257) {
    float x = from_bits(u);
    double ref = exp((double)x), rel = fabs((double)rt_exp_nonpos(x) - ref) / ref;
    if (rel > worst) worst = rel, at = x;
  }
  for (float x = 1e-6f; x <= 88.0f; x *= 1.001f) {
    double ref = exp((double)x), rel = fabs((double)rt_exp_nonpos(x) - ref) / ref;
    if (rel > worst) worst = rel, at = x;
  }
  if (!(worst < 8.2e-8)) {
    char m[120];
    snprintf(m, sizeof m, "rt_exp_nonpos: relative error %.3g at %.9g", worst, at);
    check_report(__FILE__, __LINE__, m);
  }
}

static void test_special(void) {
  CHECK(rt_exp_nonpos(0.0f) == 1.0f);
  CHECK(rt_exp_nonpos(-0.0f) == 1.0f);
  CHECK(rt_exp_nonpos(-INFINITY) == 0.0f);
  CHECK(rt_exp_nonpos(-100.0f) == 0.0f);
  CHECK(rt_exp_nonpos(-87.29f) > 0.0f);
  CHECK(isnan(rt_exp_nonpos(NAN)));
  CHECK(isinf(rt_exp_nonpos(100.0f)));
  CHECK(fabs(rt_exp_nonpos(-1.0f) - 0.36787944117144233) < 1e-7 * 0.368);
}

/* The vectorised loop (this file is built like the kernels) and single calls agree. */
static void test_pure(void) {
  enum { N = 1003 };
  float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = -90.0f + 0.09f * (float)i;
  for (int i = 0; i < N; i++) y[i] = rt_exp_nonpos(x[i]);
  for (int i = 0; i < N; i++) {
    volatile float xi = x[i];
    float one = rt_exp_nonpos(xi);
    CHECK(memcmp(&one, &y[i], sizeof one) == 0);
  }
}

int main(void) {
  test_accuracy();
  test_special();
  test_pure();
  return check_result("test_vmath");
}
