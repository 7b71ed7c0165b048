/* tests/runtime/comm_util.h -- inputs and references shared by the communicator
 * tests (comm_test.c, comm_xcheck.c).
 *
 * Every test value is a pure function of (seed, rank, index), so a rank (thread or
 * process) can compute any other rank's input and the serial reference itself.
 * Values span 2^-16 .. 2^15 in magnitude, both signs, so float sums depend on their
 * order: a reference that adds ranks in another order differs in many elements. */
#ifndef PARC_TESTS_RUNTIME_COMM_UTIL_H
#define PARC_TESTS_RUNTIME_COMM_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t cu_mix(uint64_t x) {   /* splitmix64's finaliser */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static inline float cu_value(uint64_t seed, int rank, int64_t i) {
  uint64_t h = cu_mix(cu_mix(seed ^ ((uint64_t)rank << 48)) ^ (uint64_t)i);
  float mant = (float)(h >> 40) / 16777216.0f - 0.5f;   /* [-0.5, 0.5), 24 bits */
  int e = (int)((h >> 3) & 31) - 15;
  return ldexpf(mant, e);
}

static inline void cu_fill(float *x, int64_t n, uint64_t seed, int rank, int64_t first) {
  for (int64_t i = 0; i < n; i++) x[i] = cu_value(seed, rank, first + i);
}

/* out[i] = ((v(0, first+i) + v(1, first+i)) + ...) + v(nranks-1, first+i). */
static inline void cu_ordered_sum(float *out, int64_t n, uint64_t seed, int nranks,
                                  int64_t first) {
  for (int64_t i = 0; i < n; i++) {
    float s = cu_value(seed, 0, first + i);
    for (int r = 1; r < nranks; r++) s += cu_value(seed, r, first + i);
    out[i] = s;
  }
}

/* A small deterministic generator for sizes and counts. */
static inline uint64_t cu_next(uint64_t *state) { return cu_mix((*state)++); }

/* Index of the first element whose bits differ, or -1. */
static inline int64_t cu_first_diff(const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return -1;
}

#endif
