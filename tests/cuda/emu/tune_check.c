/* tests/cuda/emu/tune_check.c -- PARC_CUDA_GEMM_TUNE (runtime/cuda/
 * rt_cuda_gemm_tune.cu) through libparcrt_cuda on the emulated CUDA runtime
 * and cuBLASLt (ctest cuda/tune_emu), with three emulated algorithms
 * (KCU_EMU_LT_ALGOS=3): algorithm i > 0 sums k in i + 1 chunks, so each
 * gives other bits, and algorithm 0, the heuristic's first choice, sleeps 20
 * ms a call (KCU_EMU_LT_SLOW=0), so timing must not choose it.
 *
 * The calls (each twice, the second on the plan the first made): a plain
 * GEMM; one adding into its result (RT_MM_ACCUMULATE: the candidates timed
 * must not add into it); a weight gradient adding into its result with its
 * bias gradient (BGRADA); one with the bias added in its epilogue.  Checked:
 *   - untuned: results against double sums (relative 1e-5), the reference
 *     bits (algorithm 0) of the rest;
 *   - tuned into FILE: the same accuracy (an accumulating call adds once),
 *     other bits than algorithm 0's in every call, FILE one line a plan,
 *     each naming algorithm 1 or 2;
 *   - FILE read: the bits of the run that wrote it; FILE rewritten to name
 *     algorithm 1 (2) everywhere: every call has the bits of the tuned run's
 *     calls where that run chose 1 (2), and the two differ; a line that does
 *     not read as a tuning line is ignored; a line naming an algorithm the
 *     heuristic does not offer is not used (that plan is timed again);
 *   - PARC_CUDA_GEMM_TUNE=1 (no file) tunes; a FILE that cannot be written
 *     is reported (once), the results unharmed. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "../cu_test.h" /* failures, CHECK */
#include "emu_check.h"  /* emu_dev, emu_host */
#include "runtime/cuda/rt_cuda.h"
#include "runtime/rt_err.h"
#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"

enum { M = 24, K = 96, N = 20, NOUT = 4 };
static const char *const what[NOUT] = {"plain", "accumulating", "bias gradient, accumulating",
                                       "bias epilogue"};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* the operands: a [M, K] (also [K, M] for the weight gradients), b [K, N],
 * w0 [M, N] (what accumulating calls add into), bias [N] */
static float a[M * K], at[K * M], b[K * N], w0[M * N], bias[N];

/* One run's results: out[case][call][M N], the bias gradient's vectors */
typedef struct {
  float out[NOUT][2][M * N];
  float bgrad[2][N];
} Run;

/* Every call on a context opened with PARC_CUDA_GEMM_TUNE=tune (NULL: unset),
 * closed after. */
static void run(const char *tune, Run *r) {
  if (tune) setenv("PARC_CUDA_GEMM_TUNE", tune, 1);
  else unsetenv("PARC_CUDA_GEMM_TUNE");
  RtCudaSetup su = {.params_numel = 1, .state_numel = 1, .arena_bytes = 64, .rows = 1, .seq = 1,
                    .tp = 1, .dp = 1, .gemm = RT_CUDA_GEMM_FP32, .model = "tune_check"};
  RtCuda *c = NULL;
  if (rt_cuda_open(&c, &su, NULL, NULL)) {
    fprintf(stderr, "tune_check: %s\n", rt_last_error());
    exit(2);
  }
  float *da = emu_dev(a, sizeof a), *dat = emu_dev(at, sizeof at), *db = emu_dev(b, sizeof b);
  float *dbias = emu_dev(bias, sizeof bias), *dg = emu_dev(NULL, sizeof bias);
  float *out = emu_dev(NULL, sizeof w0), *plain = emu_dev(NULL, sizeof w0);
  for (int call = 0; call < 2; call++) {
    int done = -1;
    CHECK(rt_cuda_matmul(c, out, da, db, 1, M, K, N, 0) == 0, "%s", rt_last_error());
    emu_host(r->out[0][call], out, sizeof w0);
    CHECK(cudaMemcpy(out, w0, sizeof w0, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    CHECK(rt_cuda_matmul_ta(c, out, dat, db, 1, M, K, N, RT_MM_ACCUMULATE) == 0, "%s",
          rt_last_error());
    emu_host(r->out[1][call], out, sizeof w0);
    CHECK(cudaMemcpy(out, w0, sizeof w0, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    CHECK(rt_cuda_matmul_ta_bgrad(c, out, dat, db, dg, 1, M, K, N, RT_MM_ACCUMULATE, &done) == 0 &&
              done == 1, "bias gradient: done %d: %s", done, rt_last_error());
    emu_host(r->out[2][call], out, sizeof w0);
    emu_host(r->bgrad[call], dg, sizeof bias);
    done = -1;
    CHECK(rt_cuda_matmul_bias(c, out, plain, da, db, dbias, 1, M, K, N, 0, 0, &done) == 0 &&
              done == 1, "bias epilogue: done %d: %s", done, rt_last_error());
    emu_host(r->out[3][call], out, sizeof w0);
  }
  cudaFree(da), cudaFree(dat), cudaFree(db), cudaFree(dbias), cudaFree(out), cudaFree(plain);
  cudaFree(dg);
  rt_cuda_close(c);
}

/* r's calls against double sums: relative L2 error <= 1e-5 each */
static void check_accuracy(const char *name, const Run *r) {
  for (int o = 0; o < NOUT; o++)
    for (int call = 0; call < 2; call++) {
      double num = 0, den = 0;
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double s = o == 1 || o == 2 ? w0[i * N + j] : o == 3 ? bias[j] : 0.0;
          for (int p = 0; p < K; p++) s += (double)a[i * K + p] * b[p * N + j];
          const double d = r->out[o][call][i * N + j] - s;
          num += d * d, den += s * s;
        }
      CHECK(sqrt(num / den) <= 1e-5, "%s: %s call %d off by %.3g (relative)", name, what[o], call,
            sqrt(num / den));
    }
  for (int j = 0; j < N; j++) {
    double s = 0;
    for (int p = 0; p < K; p++) s += b[p * N + j];
    CHECK(fabs(r->bgrad[0][j] - s) <= 1e-4 && r->bgrad[1][j] == r->bgrad[0][j],
          "%s: bias gradient %d: %g, want %g", name, j, (double)r->bgrad[0][j], s);
  }
}

/* whether case o's calls have the same bits in x and y */
static int same(const Run *x, const Run *y, int o) {
  return !memcmp(x->out[o], y->out[o], sizeof x->out[o]);
}

/* FILE's tuning lines: the algorithm (its second word) each names, in order;
 * how many (lines without a ':' skipped) */
static int file_algos(const char *path, unsigned long long *alg, int max) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f) && n < max) {
    const char *s = line[0] == '#' ? NULL : strchr(line, ':');
    unsigned long long w0_, w1;
    if (!s) continue; /* a comment, or the check's line that is none */
    if (sscanf(s, ": %llx %llx", &w0_, &w1) != 2) return -1;
    alg[n++] = w1;
  }
  fclose(f);
  return n;
}

/* FILE rewritten with every line naming algorithm `to` (the second word) */
static void rename_algos(const char *path, int to) {
  FILE *f = fopen(path, "r");
  char buf[64][1024];
  int n = 0;
  while (f && n < 64 && fgets(buf[n], sizeof buf[n], f)) n++;
  if (f) fclose(f);
  f = fopen(path, "w");
  CHECK(f != NULL, "cannot rewrite %s", path);
  if (!f) return;
  for (int i = 0; i < n; i++) {
    char *s = buf[i][0] == '#' ? NULL : strchr(buf[i], ':');
    if (s) { /* ": " + 16 hex digits + " " + 16 hex digits: the second word's last digit */
      s += 2 + 16 + 1 + 15;
      *s = (char)('0' + to);
    }
    fputs(buf[i], f);
  }
  fclose(f);
}

int main(void) {
  setenv("KCU_EMU_LT_ALGOS", "3", 1);
  setenv("KCU_EMU_LT_SLOW", "0", 1);
  rt_pool_init(2);
  for (int i = 0; i < M * K; i++) a[i] = frand();
  for (int i = 0; i < M; i++)
    for (int p = 0; p < K; p++) at[p * M + i] = a[i * K + p];
  for (int i = 0; i < K * N; i++) b[i] = frand();
  for (int i = 0; i < M * N; i++) w0[i] = frand();
  for (int j = 0; j < N; j++) bias[j] = frand();
  char path[512];
  const char *tmp = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/parc_tune_check_%d.txt", tmp && *tmp ? tmp : "/tmp",
           (int)getpid());
  remove(path);
  static Run r0, r1, r2, ra[3], rbad, rt;

  run(NULL, &r0); /* the heuristic's first choice: algorithm 0 */
  check_accuracy("untuned", &r0);
  for (int o = 0; o < NOUT; o++)
    CHECK(!memcmp(r0.out[o][0], r0.out[o][1], sizeof r0.out[o][0]),
          "untuned: %s: the second call's bits differ", what[o]);

  run(path, &r1); /* timed: 1 or 2, written to FILE */
  check_accuracy("tuned", &r1);
  for (int o = 0; o < NOUT; o++)
    CHECK(!same(&r0, &r1, o), "tuned: %s has the first choice's bits (the slow algorithm)",
          what[o]);
  unsigned long long alg[16];
  int nalg = file_algos(path, alg, 16);
  CHECK(nalg == NOUT, "%s: %d tuning lines, want one a plan (%d)", path, nalg, NOUT);
  for (int i = 0; i < nalg; i++)
    CHECK(alg[i] == 1 || alg[i] == 2, "%s: line %d names algorithm %llu", path, i + 1, alg[i]);
  printf("tuned: %d plans, algorithms", nalg);
  for (int i = 0; i < nalg; i++) printf(" %llu", alg[i]);
  printf("\n");
  fflush(stdout);

  run(path, &r2); /* read: the writer's bits */
  for (int o = 0; o < NOUT; o++)
    CHECK(same(&r1, &r2, o), "read: %s differs from the run that wrote the file", what[o]);

  for (int to = 1; to <= 2; to++) { /* FILE naming 1, then 2, everywhere */
    rename_algos(path, to);
    run(path, &ra[to]);
    check_accuracy(to == 1 ? "file naming 1" : "file naming 2", &ra[to]);
  }
  /* the plans' lines are in the calls' order of first use: case o is line o */
  for (int o = 0; o < NOUT && nalg == NOUT; o++) {
    CHECK(!same(&ra[1], &ra[2], o), "%s: algorithms 1 and 2 give the same bits", what[o]);
    CHECK(same(&r1, &ra[alg[o]], o), "%s: the tuned run's bits are not algorithm %llu's",
          what[o], alg[o]);
  }

  FILE *f = fopen(path, "a"); /* a line that is not a tuning line: ignored */
  if (f) fputs("this is not a tuning line\n", f), fclose(f);
  run(path, &rbad);
  for (int o = 0; o < NOUT; o++)
    CHECK(same(&ra[2], &rbad, o), "a bad line: %s no longer runs the file's algorithm", what[o]);

  rename_algos(path, 7); /* an algorithm the heuristic does not offer: timed again */
  run(path, &rt);
  check_accuracy("file naming an unknown algorithm", &rt);
  for (int o = 0; o < NOUT; o++)
    CHECK(!same(&r0, &rt, o), "unknown algorithm: %s not timed again", what[o]);
  nalg = file_algos(path, alg, 16);
  CHECK(nalg == 2 * NOUT, "%s: %d lines after timing again, want %d", path, nalg, 2 * NOUT);

  run("1", &rt); /* no file */
  check_accuracy("PARC_CUDA_GEMM_TUNE=1", &rt);
  for (int o = 0; o < NOUT; o++)
    CHECK(!same(&r0, &rt, o), "PARC_CUDA_GEMM_TUNE=1: %s not tuned", what[o]);
  CHECK(access("1", F_OK) != 0, "PARC_CUDA_GEMM_TUNE=1 wrote a file named 1");

  run("/nonexistent-parc-dir/tune.txt", &rt); /* reported */
  check_accuracy("an unwritable file", &rt);
  remove(path);
  if (failures) fprintf(stderr, "tune_check: %d failure(s)\n", failures);
  else printf("tune_check: all passed\n");
  return failures ? 1 : 0;
}
