/* runtime/rt_rng.c -- Philox4x32-10, FNV-1a and sliced normal init; see rt_rng.h. */
#include "runtime/rt_rng.h"

#include <math.h>
#include <stddef.h>

#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"

/* Published Philox4x32 constants: round multipliers and Weyl key increments. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

#define FNV64_OFFSET 0xcbf29ce484222325ull
#define FNV64_PRIME 0x100000001b3ull

#define RT_RNG_MAXRANK 16

void rt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
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

uint64_t rt_param_stream(const char *param_name) {
  uint64_t h = FNV64_OFFSET;
  for (const unsigned char *p = (const unsigned char *)param_name; *p; p++) {
    h ^= *p;
    h *= FNV64_PRIME;
  }
  return h;
}

static void block(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
  rt_philox4x32_10(ctr, key, out);
}

float rt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t x[4];
  block(seed, stream, index, x);
  const double two_pi = 6.283185307179586476925286766559;
  double u1 = ((double)x[0] + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)x[1] * (1.0 / 4294967296.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
}

float rt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t x[4];
  block(seed, stream, index, x);
  return (float)(x[0] >> 8) * (1.0f / 16777216.0f);
}

/* Splits the global shape around `dim` into outer x extent x inner; returns RT_ERR
 * with a message on invalid arguments. dim = -1 is the whole tensor as one slice. */
static int slice_geometry(int rank, const int64_t *shape, int dim, int64_t start, int64_t len,
                          int64_t *outer, int64_t *extent, int64_t *inner) {
  if (rank < 0 || rank > RT_RNG_MAXRANK)
    return rt_fail("init slice: rank %d is outside 0..%d; pass the tensor's number of dims",
                   rank, RT_RNG_MAXRANK);
  if (rank > 0 && !shape)
    return rt_fail("init slice: rank %d but no shape given", rank);
  int64_t total = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0)
      return rt_fail("init slice: dimension %d has negative size %lld", i, (long long)shape[i]);
    if (shape[i] != 0 && total > INT64_MAX / shape[i])
      return rt_fail("init slice: tensor of rank %d has more than 2^63 elements", rank);
    total *= shape[i];
  }
  if (dim == -1) {
    *outer = 1;
    *extent = total;
    *inner = 1;
    return RT_OK;
  }
  if (dim < 0 || dim >= rank)
    return rt_fail("init slice: dim %d is not a dimension of a rank-%d tensor (use -1 for the "
                   "whole tensor)", dim, rank);
  if (start < 0 || len < 0 || start > shape[dim] || len > shape[dim] - start)
    return rt_fail("init slice: range [%lld, %lld) of dim %d exceeds its size %lld; the shard "
                   "must lie inside the global tensor", (long long)start,
                   (long long)start + (long long)len, dim, (long long)shape[dim]);
  int64_t o = 1, in = 1;
  for (int i = 0; i < dim; i++) o *= shape[i];
  for (int i = dim + 1; i < rank; i++) in *= shape[i];
  *outer = o;
  *extent = len;
  *inner = in;
  return RT_OK;
}

int64_t rt_slice_numel(int rank, const int64_t *global_shape, int dim, int64_t start,
                       int64_t len) {
  int64_t outer, extent, inner;
  if (slice_geometry(rank, global_shape, dim, start, len, &outer, &extent, &inner)) return -1;
  return outer * extent * inner;
}

typedef struct {
  float *dst;
  uint64_t seed, stream;
  float std;
  int64_t run, lrun;
  RtRunStartFn start;
  const void *ctx;
} RunsJob;

/* Elements [k0, k1) of the runs: the run and offset of k0, then onwards. */
static void runs_chunk(void *arg, int64_t k0, int64_t k1) {
  const RunsJob *j = arg;
  int64_t r = k0 / j->lrun, t = k0 % j->lrun;
  int64_t base = j->start(j->ctx, r);
  for (int64_t k = k0; k < k1; k++) {
    j->dst[k] = t < j->run ? j->std * rt_rng_normal(j->seed, j->stream, (uint64_t)(base + t)) : 0.0f;
    if (++t == j->lrun && k + 1 < k1) t = 0, base = j->start(j->ctx, ++r);
  }
}

/* About 2 ms of one core's work (rt_rng_normal: ~70 ns an element). */
#define RUNS_GRAIN ((int64_t)1 << 15)

void rt_init_normal_runs(float *dst, uint64_t seed, uint64_t stream, float std, int64_t nruns,
                         int64_t run, int64_t lrun, RtRunStartFn start, const void *ctx) {
  if (nruns <= 0 || lrun <= 0) return;
  RunsJob j = {dst, seed, stream, std, run, lrun, start, ctx};
  rt_parallel_for(nruns * lrun, RUNS_GRAIN, runs_chunk, &j);
}

/* A slice's runs: one a (outer, extent) pair, inner elements each. */
typedef struct {
  int64_t extent, dimsize, start, inner;
} SliceRuns;

static int64_t slice_run_start(const void *ctx, int64_t r) {
  const SliceRuns *s = ctx;
  return (r / s->extent * s->dimsize + s->start + r % s->extent) * s->inner;
}

int rt_init_normal_slice(float *dst, uint64_t seed, uint64_t stream, float std, int rank,
                         const int64_t *global_shape, int dim, int64_t start, int64_t len) {
  int64_t outer, extent, inner;
  if (slice_geometry(rank, global_shape, dim, start, len, &outer, &extent, &inner))
    return RT_ERR;
  /* runs: one an (outer, slice row) pair, inner elements each; dim -1: one run of all */
  SliceRuns s = dim == -1 ? (SliceRuns){1, 1, 0, extent}
                          : (SliceRuns){extent, global_shape[dim], start, inner};
  rt_init_normal_runs(dst, seed, stream, std, dim == -1 ? 1 : outer * extent, s.inner, s.inner,
                      slice_run_start, &s);
  return RT_OK;
}

void rt_fill(float *dst, int64_t n, float value) {
  for (int64_t i = 0; i < n; i++) dst[i] = value;
}

void rt_fill_zeros(float *dst, int64_t n) { rt_fill(dst, n, 0.0f); }

void rt_fill_ones(float *dst, int64_t n) { rt_fill(dst, n, 1.0f); }
