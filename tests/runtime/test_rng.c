/* tests/runtime/test_rng.c -- Philox known answers, FNV-1a, purity, sliced init,
 * normal statistics, and independence of streams and seeds. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_pool.h"
#include "runtime/rt_rng.h"
#include "tests/runtime/check.h"

/* Known-answer vectors published with Random123 (kat_vectors, philox4x32 10 rounds). */
static void test_philox_kat(void) {
  static const struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
    uint32_t out[4];
    rt_philox4x32_10(kat[k].ctr, kat[k].key, out);
    for (int i = 0; i < 4; i++) CHECK(out[i] == kat[k].out[i]);
  }
}

static void test_fnv(void) {
  /* FNV-1a 64 reference values: offset basis for "", published test strings. */
  CHECK(rt_param_stream("") == 0xcbf29ce484222325ull);
  CHECK(rt_param_stream("a") == 0xaf63dc4c8601ec8cull);
  CHECK(rt_param_stream("foobar") == 0x85944171f73967e8ull);
  CHECK(rt_param_stream("h.0.attn.c_attn.weight") != rt_param_stream("h.1.attn.c_attn.weight"));
  CHECK(rt_param_stream("wte.weight") != rt_param_stream("wpe.weight"));
}

/* The same (seed, stream, index) gives the same bits, whatever was computed before. */
static void test_purity(void) {
  enum { N = 1000 };
  float fwd[N], bwd[N];
  uint64_t s = rt_param_stream("h.3.mlp.c_fc.weight");
  for (int i = 0; i < N; i++) fwd[i] = rt_rng_normal(42, s, (uint64_t)i);
  for (int i = N - 1; i >= 0; i--) {
    (void)rt_rng_normal(7, s + 1, (uint64_t)i * 31);   /* interleaved unrelated draws */
    bwd[i] = rt_rng_normal(42, s, (uint64_t)i);
  }
  CHECK(memcmp(fwd, bwd, sizeof fwd) == 0);
  /* Large indices use the high counter word. */
  uint64_t big = (uint64_t)1 << 40;
  CHECK(rt_rng_normal(42, s, big) == rt_rng_normal(42, s, big));
  CHECK(rt_rng_normal(42, s, big) != rt_rng_normal(42, s, big + 1));
  CHECK(rt_rng_normal(42, s, big) != rt_rng_normal(42, s, 0));
  float u = rt_rng_uniform(1, 2, 3);
  CHECK(u >= 0 && u < 1 && u == rt_rng_uniform(1, 2, 3));
}

/* Cuts [start, start+len) along dim out of a full row-major tensor. */
static void cut(const float *full, float *out, int rank, const int64_t *shape, int dim,
                int64_t start, int64_t len) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= shape[d];
  for (int d = dim + 1; d < rank; d++) inner *= shape[d];
  int64_t k = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = start; j < start + len; j++)
      for (int64_t i = 0; i < inner; i++) out[k++] = full[(o * shape[dim] + j) * inner + i];
}

static void test_slices(void) {
  static const int64_t shapes[][4] = {{7, 0, 0, 0}, {5, 6, 0, 0}, {3, 4, 5, 0}, {2, 3, 4, 5}};
  static const int ranks[] = {1, 2, 3, 4};
  const uint64_t seed = 1234, stream = rt_param_stream("model.layers.0.mlp.up_proj.weight");
  const float std = 0.02f;
  for (int c = 0; c < 4; c++) {
    int rank = ranks[c];
    const int64_t *shape = shapes[c];
    int64_t numel = rt_slice_numel(rank, shape, -1, 0, 0);
    float *full = malloc(sizeof(float) * (size_t)numel);
    float *got = malloc(sizeof(float) * (size_t)numel);
    float *want = malloc(sizeof(float) * (size_t)numel);
    CHECK_OK(rt_init_normal_slice(full, seed, stream, std, rank, shape, -1, 0, 0));
    for (int64_t i = 0; i < numel; i++)
      CHECK(full[i] == std * rt_rng_normal(seed, stream, (uint64_t)i));
    for (int dim = 0; dim < rank; dim++)
      for (int64_t start = 0; start <= shape[dim]; start++)
        for (int64_t len = 0; start + len <= shape[dim]; len++) {
          int64_t n = rt_slice_numel(rank, shape, dim, start, len);
          memset(got, 0xff, sizeof(float) * (size_t)numel);
          CHECK_OK(rt_init_normal_slice(got, seed, stream, std, rank, shape, dim, start, len));
          cut(full, want, rank, shape, dim, start, len);
          CHECK(memcmp(got, want, sizeof(float) * (size_t)n) == 0);
        }
    /* Equal shards along each dim, as tensor parallelism cuts them, tile the tensor. */
    for (int dim = 0; dim < rank; dim++) {
      int64_t parts = shape[dim] % 2 == 0 ? 2 : 1, len = shape[dim] / parts;
      for (int64_t p = 0; p < parts; p++) {
        CHECK_OK(rt_init_normal_slice(got, seed, stream, std, rank, shape, dim, p * len, len));
        cut(full, want, rank, shape, dim, p * len, len);
        CHECK(memcmp(got, want, sizeof(float) * (size_t)(numel / parts)) == 0);
      }
    }
    free(full);
    free(got);
    free(want);
  }
  /* A scalar (rank 0) is one element, index 0. */
  float x = 0;
  CHECK_OK(rt_init_normal_slice(&x, seed, stream, 1.0f, 0, NULL, -1, 0, 0));
  CHECK(x == rt_rng_normal(seed, stream, 0));
  /* Bad arguments fail with a message, and write nothing. */
  const int64_t sh[2] = {4, 6};
  float buf[24];
  CHECK_FAILS(rt_init_normal_slice(buf, seed, stream, std, 2, sh, 1, 4, 3), "exceeds its size 6");
  CHECK_FAILS(rt_init_normal_slice(buf, seed, stream, std, 2, sh, 2, 0, 1), "dim 2");
  CHECK_FAILS(rt_init_normal_slice(buf, seed, stream, std, 2, sh, 0, -1, 1), "exceeds");
  const int64_t neg[2] = {4, -6};
  CHECK_FAILS(rt_init_normal_slice(buf, seed, stream, std, 2, neg, -1, 0, 0), "negative size");
}

/* Run r of test_runs starts at global index 100000 r + 5. */
static int64_t runs_start(const void *ctx, int64_t r) {
  (void)ctx;
  return 100000 * r + 5;
}

/* rt_init_normal_runs on the pool: chunks that start and end inside runs and
 * inside the padding give every element its own value, the same bits on 1 and
 * 3 threads; slices of a tensor big enough for several chunks, likewise. */
static void test_runs(void) {
  const uint64_t seed = 42, stream = rt_param_stream("wte.weight");
  const int64_t nruns = 7, run = 30000, lrun = 30011, n = nruns * lrun;
  float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
  for (int64_t r = 0; r < nruns; r++)
    for (int64_t t = 0; t < lrun; t++)
      want[r * lrun + t] =
          t < run ? 0.5f * rt_rng_normal(seed, stream, (uint64_t)(100000 * r + 5 + t)) : 0.0f;
  CHECK(rt_parallel_chunks(n, (int64_t)1 << 15) > 1);
  for (int threads = 1; threads <= 3; threads += 2) {
    CHECK_OK(rt_pool_init(threads));
    memset(got, 0xff, sizeof(float) * (size_t)n);
    rt_init_normal_runs(got, seed, stream, 0.5f, nruns, run, lrun, runs_start, NULL);
    CHECK(memcmp(got, want, sizeof(float) * (size_t)n) == 0);
    /* a [3, 5, 20000] tensor's rows [1, 4) of dim 1: runs of 20000 across chunks */
    const int64_t shape[3] = {3, 5, 20000};
    memset(got, 0xff, sizeof(float) * (size_t)n);
    CHECK_OK(rt_init_normal_slice(got, seed, stream, 0.02f, 3, shape, 1, 1, 3));
    int64_t k = 0, bad = 0;
    for (int64_t o = 0; o < 3; o++)
      for (int64_t j = 1; j < 4; j++)
        for (int64_t i = 0; i < 20000; i++, k++)
          bad += got[k] != 0.02f * rt_rng_normal(seed, stream, (uint64_t)((o * 5 + j) * 20000 + i));
    CHECK(bad == 0);
  }
  rt_pool_shutdown();
  free(want);
  free(got);
}

static void test_fill(void) {
  float v[5] = {9, 9, 9, 9, 9};
  rt_fill_zeros(v, 4);
  CHECK(v[0] == 0 && v[3] == 0 && v[4] == 9);
  rt_fill_ones(v, 5);
  CHECK(v[0] == 1 && v[4] == 1);
  rt_fill(v, 2, -2.5f);
  CHECK(v[1] == -2.5f && v[2] == 1);
}

/* Moments of 1e6 normals against N(0,1), each with a 5-sigma tolerance. */
static void test_statistics(void) {
  enum { N = 1000000 };
  const uint64_t stream = rt_param_stream("wte.weight");
  double s1 = 0, s2 = 0, s4 = 0, cross = 0, cross_seed = 0;
  long tail = 0, exact_same = 0;
  for (int i = 0; i < N; i++) {
    double z = rt_rng_normal(1337, stream, (uint64_t)i);
    double w = rt_rng_normal(1337, stream + 1, (uint64_t)i);   /* neighbouring stream */
    double v = rt_rng_normal(1338, stream, (uint64_t)i);       /* neighbouring seed */
    s1 += z;
    s2 += z * z;
    s4 += z * z * z * z;
    cross += z * w;
    cross_seed += z * v;
    tail += fabs(z) > 1.959963985;
    exact_same += (z == w) + (z == v);
  }
  double mean = s1 / N, var = s2 / N - mean * mean, kurt = s4 / N;
  double sd_n = 1 / sqrt((double)N);
  CHECK(fabs(mean) < 5 * sd_n);
  CHECK(fabs(var - 1) < 5 * sqrt(2.0) * sd_n);
  CHECK(fabs(kurt - 3) < 5 * sqrt(96.0) * sd_n);
  CHECK(fabs((double)tail / N - 0.05) < 5 * sqrt(0.05 * 0.95) * sd_n);
  /* Independent streams and seeds: correlation within noise, no coinciding values. */
  CHECK(fabs(cross / N) < 5 * sd_n);
  CHECK(fabs(cross_seed / N) < 5 * sd_n);
  CHECK(exact_same < 5);
  /* Coarse histogram against the normal CDF (a chi-square-like bound per bin). */
  enum { BINS = 8 };
  static const double edges[BINS - 1] = {-2, -1, -0.5, 0, 0.5, 1, 2};
  long count[BINS] = {0};
  for (int i = 0; i < N; i++) {
    double z = rt_rng_normal(99, 5, (uint64_t)i);
    int b = 0;
    while (b < BINS - 1 && z >= edges[b]) b++;
    count[b]++;
  }
  for (int b = 0; b < BINS; b++) {
    double lo = b ? 0.5 * erfc(-edges[b - 1] / sqrt(2.0)) : 0;
    double hi = b < BINS - 1 ? 0.5 * erfc(-edges[b] / sqrt(2.0)) : 1;
    double p = hi - lo;
    CHECK(fabs((double)count[b] / N - p) < 5 * sqrt(p * (1 - p)) * sd_n);
  }
}

int main(void) {
  test_philox_kat();
  test_fnv();
  test_purity();
  test_slices();
  test_runs();
  test_fill();
  test_statistics();
  return check_result("test_rng");
}
