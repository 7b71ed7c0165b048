/* tests/cuda/emu/bgrad_check.c -- rt_cuda_matmul_ta_bgrad (the weight
 * gradient with its bias gradient in cuBLASLt's BGRADA epilogue) through
 * libparcrt_cuda on the emulated CUDA runtime and cuBLASLt (ctest
 * cuda/bgrad_emu; cuda/bgrad_emu_off runs it with PARC_CUDA_BGRAD=0 and
 * --off: then no call may sum).
 *
 * Each case calls it on dw = x^T dy (x [k, m], dy [k, n]) with the bias
 * vector full of NaN, and checks:
 *   - dw: the bits of the same rt_cuda_matmul_ta without the bias (the
 *     emulation has one algorithm, so the epilogue may not change the GEMM);
 *   - *done = 1 where the epilogue applies: the vector is dy's column sums,
 *     of the values the GEMM reads (GEMM mode bf16: dy's bf16 values, stored
 *     so or rounded into the call's copy), against fp32 sums on the host
 *     (relative 1e-6);
 *     also where the call adds the product into dw (RT_MM_ACCUMULATE): the
 *     vector holds this call's sums, written, not added to;
 *   - *done = 0 where it does not (a batch; GEMM mode tf32,
 *     where cuBLASLt rounds fp32 operands itself; KCU_EMU_LT_NO_BGRAD=1, a
 *     cuBLASLt without such an algorithm; PARC_CUDA_BGRAD=0): the vector
 *     untouched (all NaN).
 * Two calls of one shape (one plan) into two vectors each get their own sums;
 * a NULL vector or done pointer is an error.  rt_cuda_bgrad_ws (the stage
 * programs' scratch for such a vector): one buffer of at least n floats, the
 * same while it is large enough, n < 1 and a NULL out refused. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cu_test.h" /* failures, CHECK */
#include "emu_check.h"  /* emu_dev, emu_host */
#include "runtime/cuda/rt_cuda.h"
#include "runtime/cuda/rt_cuda_ws_plan.h"
#include "runtime/rt_err.h"
#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"

static int off; /* --off: PARC_CUDA_BGRAD=0, no call sums */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* bf16 of f, to nearest even (finite f), and its value */
static uint16_t bf16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_val(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static RtCuda *open_ctx(int gemm) {
  RtCudaSetup su = {.params_numel = 1, .state_numel = 1, .arena_bytes = 64, .rows = 1, .seq = 1,
                    .tp = 1, .dp = 1, .gemm = gemm, .model = "bgrad_check"};
  RtCuda *c = NULL;
  if (rt_cuda_open(&c, &su, NULL, NULL)) {
    fprintf(stderr, "bgrad_check: %s\n", rt_last_error());
    exit(2);
  }
  return c;
}

/* One case: dw [m, n] = x^T dy on c, flags as a trainer passes them (stored:
 * dy as bf16, RT_CUDA_MM_B_BF16); rounded: the GEMM reads dy's bf16 values
 * (stored, or GEMM mode bf16); want_done: 1 if the epilogue applies. */
static void run_case(const char *name, RtCuda *c, int64_t m, int64_t k, int64_t n, int stored,
                     int rounded, int acc, int want_done) {
  if (off) want_done = 0;
  float *x = malloc(4 * (size_t)(k * m)), *dy = malloc(4 * (size_t)(k * n)),
        *dy0 = malloc(4 * (size_t)(k * n)); /* dy as given; dy: as the GEMM reads it */
  float *w0 = malloc(4 * (size_t)(m * n)), *got = malloc(4 * (size_t)(m * n)),
        *ref = malloc(4 * (size_t)(m * n)), *bias = malloc(4 * (size_t)n),
        *sums = malloc(4 * (size_t)n);
  uint16_t *dyh = malloc(2 * (size_t)(k * n));
  for (int64_t i = 0; i < k * m; i++) x[i] = frand();
  for (int64_t i = 0; i < m * n; i++) w0[i] = frand();
  for (int64_t i = 0; i < k * n; i++) {
    dy[i] = dy0[i] = frand();
    dyh[i] = bf16_rn(dy[i]);
    if (rounded) dy[i] = bf16_val(dyh[i]); /* the values the GEMM reads */
  }
  for (int64_t j = 0; j < n; j++) { /* fp32 in increasing rows */
    float s = 0.0f;
    for (int64_t p = 0; p < k; p++) s += dy[p * n + j];
    sums[j] = s;
    bias[j] = NAN;
  }
  int flags = (stored ? RT_CUDA_MM_B_BF16 : 0) | (acc ? RT_MM_ACCUMULATE : 0);
  float *dx = emu_dev(x, 4 * (size_t)(k * m));
  float *ddy = stored ? emu_dev(dyh, 2 * (size_t)(k * n)) : emu_dev(dy0, 4 * (size_t)(k * n));
  float *dw = emu_dev(w0, 4 * (size_t)(m * n)), *dw2 = emu_dev(w0, 4 * (size_t)(m * n));
  float *dbias = emu_dev(bias, 4 * (size_t)n);
  int done = -1;
  int rc = rt_cuda_matmul_ta_bgrad(c, dw, dx, ddy, dbias, 1, m, k, n, flags, &done);
  CHECK(rc == 0, "%s: %s", name, rt_last_error());
  CHECK(rt_cuda_matmul_ta(c, dw2, dx, ddy, 1, m, k, n, flags) == 0, "%s: %s", name,
        rt_last_error());
  emu_host(got, dw, 4 * (size_t)(m * n));
  emu_host(ref, dw2, 4 * (size_t)(m * n));
  emu_host(bias, dbias, 4 * (size_t)n);
  CHECK(!memcmp(got, ref, 4 * (size_t)(m * n)), "%s: the GEMM's bits differ from the plain call's",
        name);
  CHECK(done == want_done, "%s: done %d, want %d", name, done, want_done);
  double num = 0, den = 0;
  int64_t nan = 0;
  for (int64_t j = 0; j < n; j++) {
    nan += isnan(bias[j]) != 0;
    num += ((double)bias[j] - sums[j]) * ((double)bias[j] - sums[j]);
    den += (double)sums[j] * sums[j];
  }
  if (done == 1)
    CHECK(nan == 0 && sqrt(num / den) <= 1e-6, "%s: bias sums off by %.3g (%lld NaN)", name,
          sqrt(num / den), (long long)nan);
  else
    CHECK(nan == n, "%s: the vector was written (%lld of %lld still NaN) without done", name,
          (long long)nan, (long long)n);
  printf("%-44s done %d\n", name, done);
  cudaFree(dx), cudaFree(ddy), cudaFree(dw), cudaFree(dw2), cudaFree(dbias);
  free(x), free(dy), free(dy0), free(w0), free(got), free(ref), free(bias), free(sums), free(dyh);
}

/* Two calls of one shape (one cached plan) into two vectors: each its own sums. */
static void two_vectors(RtCuda *c) {
  enum { M = 16, K = 24, N = 20 };
  float x[K * M], dy[2][K * N], b[2][N], want[2][N];
  for (int i = 0; i < K * M; i++) x[i] = frand();
  for (int v = 0; v < 2; v++)
    for (int j = 0; j < N; j++) {
      want[v][j] = 0.0f;
      for (int p = 0; p < K; p++) {
        dy[v][p * N + j] = frand();
        want[v][j] += dy[v][p * N + j];
      }
    }
  float *dx = emu_dev(x, sizeof x), *dw = emu_dev(NULL, 4 * M * N);
  int done[2] = {-1, -1};
  float *dd[2], *db[2];
  for (int v = 0; v < 2; v++) {
    dd[v] = emu_dev(dy[v], sizeof dy[v]);
    db[v] = emu_dev(NULL, sizeof b[v]);
  }
  for (int v = 0; v < 2; v++)
    CHECK(rt_cuda_matmul_ta_bgrad(c, dw, dx, dd[v], db[v], 1, M, K, N, 0, &done[v]) == 0, "%s",
          rt_last_error());
  for (int v = 0; v < 2 && !off; v++) {
    emu_host(b[v], db[v], sizeof b[v]);
    CHECK(done[v] == 1, "call %d: done %d", v, done[v]);
    float worst = 0;
    for (int j = 0; j < N; j++) worst = fmaxf(worst, fabsf(b[v][j] - want[v][j]));
    CHECK(worst <= 1e-5f, "call %d of the shared plan: bias off by %g", v, (double)worst);
  }
  for (int v = 0; v < 2; v++) cudaFree(dd[v]), cudaFree(db[v]);
  cudaFree(dx), cudaFree(dw);
  printf("%-44s done %d %d\n", "two vectors, one plan", done[0], done[1]);
}

int main(int argc, char **argv) {
  off = argc == 2 && !strcmp(argv[1], "--off");
  if (argc > 2 || (argc == 2 && !off)) {
    fprintf(stderr, "usage: bgrad_check [--off]  (--off: under PARC_CUDA_BGRAD=0)\n");
    return 2;
  }
  const char *env = getenv("PARC_CUDA_BGRAD");
  if (off != (env && !strcmp(env, "0"))) {
    fprintf(stderr, "bgrad_check: --off goes with PARC_CUDA_BGRAD=0, and only with it\n");
    return 2;
  }
  rt_pool_init(2);
  RtCuda *f = open_ctx(RT_CUDA_GEMM_FP32), *b = open_ctx(RT_CUDA_GEMM_BF16),
         *t = open_ctx(RT_CUDA_GEMM_TF32);
  run_case("fp32 mode, fp32 dy", f, 24, 40, 36, 0, 0, 0, 1);
  run_case("fp32 mode, odd sizes", f, 7, 33, 13, 0, 0, 0, 1);
  /* adding into dw (a stage program's weight gradient into the accumulator):
   * the vector holds this call's sums, written, not added */
  run_case("fp32 mode, accumulating", f, 24, 40, 36, 0, 0, 1, 1);
  run_case("bf16 mode, dy stored as bf16, accumulating", b, 32, 48, 40, 1, 1, 1, 1);
  run_case("bf16 mode, dy stored as bf16", b, 32, 48, 40, 1, 1, 0, 1);
  run_case("bf16 mode, fp32 dy (the call's rounded copy)", b, 32, 48, 40, 0, 1, 0, 1);
  run_case("tf32 mode (cuBLASLt rounds)", t, 32, 48, 40, 0, 0, 0, 0);
  two_vectors(f);
  int done = -1;
  float *p = emu_dev(NULL, 64);
  CHECK(rt_cuda_matmul_ta_bgrad(f, p, p, p, NULL, 1, 2, 2, 2, 0, &done) != 0,
        "a NULL bias vector was accepted");
  CHECK(rt_cuda_matmul_ta_bgrad(f, p, p, p, p + 8, 1, 2, 2, 2, 0, NULL) != 0,
        "a NULL done was accepted");
  cudaFree(p);
  float *w1 = NULL, *w2 = NULL, *w3 = NULL;
  CHECK(rt_cuda_bgrad_ws(f, 3072, &w1) == 0 && w1, "rt_cuda_bgrad_ws(3072): %s", rt_last_error());
  CHECK(rt_cuda_bgrad_ws(f, 768, &w2) == 0 && w2 == w1, "rt_cuda_bgrad_ws(768): a new buffer");
  CHECK(rt_cuda_bgrad_ws(f, 4096, &w3) == 0 && w3, "rt_cuda_bgrad_ws(4096): %s", rt_last_error());
  CHECK(cudaMemset(w3, 0, 4096 * sizeof(float)) == cudaSuccess, "the grown scratch is not 4096 floats");
  CHECK(rt_cuda_bgrad_ws(f, 0, &w1) != 0 && rt_cuda_bgrad_ws(f, 8, NULL) != 0,
        "rt_cuda_bgrad_ws accepted n 0 or a NULL out");
  setenv("KCU_EMU_LT_NO_BGRAD", "1", 1); /* a cuBLASLt without the epilogue (new shapes) */
  run_case("no algorithm with the epilogue", f, 12, 20, 28, 0, 0, 0, 0);
  run_case("no algorithm, bf16 dy", b, 16, 24, 32, 1, 1, 0, 0);
  unsetenv("KCU_EMU_LT_NO_BGRAD");
  rt_cuda_close(f);
  rt_cuda_close(b);
  rt_cuda_close(t);
  if (failures) fprintf(stderr, "bgrad_check: %d failure(s)\n", failures);
  else printf("bgrad_check: all passed\n");
  return failures ? 1 : 0;
}
