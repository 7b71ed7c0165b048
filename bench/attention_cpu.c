/* bench/attention_cpu.c -- CPU throughput of the runtime's compute kernels at a
 * GPT-2-small-like layer: rt_sdpa / rt_sdpa_grad (causal, GQA optional) and
 * rt_matmul, for 1 .. N pool threads.  Not a test: prints one line per run.
 * sdpa_grad is timed twice: from the forward's out and lse (the same work as the
 * trainers' rt_sdpa_grad_stats from lse and D, less D's row sums) and
 * recomputing them (the statistics pass; their ratio is printed).
 *
 *   bench_attention_cpu [B H KV T hd [max_threads]]     (default 4 12 12 1024 64, all CPUs)
 *
 * FLOPs counted: sdpa 4 B H T^2 hd (halved when causal), sdpa_grad 2.5x that
 * (the useful work of the backward, not its recomputation). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_attention.h"
#include "runtime/rt_err.h"
#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *randn(int64_t n, unsigned seed) {
  float *x = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((double)(seed >> 8) / 16777216.0 - 0.5);
  }
  return x;
}

int main(int argc, char **argv) {
  int64_t B = 4, H = 12, KV = 12, T = 1024, hd = 64;
  int maxt = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (argc >= 6) {
    B = atoll(argv[1]), H = atoll(argv[2]), KV = atoll(argv[3]), T = atoll(argv[4]);
    hd = atoll(argv[5]);
  }
  if (argc >= 7) maxt = atoi(argv[6]);
  int64_t nq = B * H * T * hd, nk = B * KV * T * hd;
  float *q = randn(nq, 1), *k = randn(nk, 2), *v = randn(nk, 3), *dy = randn(nq, 4);
  float *out = malloc(sizeof(float) * (size_t)nq), *lse = malloc(sizeof(float) * (size_t)(B * H * T));
  float *g = malloc(sizeof(float) * (size_t)(B * (H + 2 * KV) * T * hd));
  float scale = (float)(1 / sqrt((double)hd));
  double fl = 4.0 * (double)(B * H) * (double)T * (double)T * (double)hd / 2;  /* causal */
  int64_t M = B * T, D = H * hd;
  float *x = randn(M * D, 5), *w = randn(D * 3 * D, 6), *y = malloc(sizeof(float) * (size_t)(M * 3 * D));
  printf("B %lld H %lld KV %lld T %lld hd %lld, causal\n", (long long)B, (long long)H,
         (long long)KV, (long long)T, (long long)hd);
  for (int t = 1; t <= maxt; t++) {
    if (rt_pool_init(t)) return fprintf(stderr, "%s\n", rt_last_error()), 1;
    double t0 = now();
    if (rt_sdpa(out, lse, q, k, v, B, H, KV, T, hd, scale, 1)) return 1;
    double t1 = now();
    if (rt_sdpa_grad(g, q, k, v, dy, out, lse, B, H, KV, T, hd, scale, 1)) return 1;
    double t2 = now();
    if (rt_sdpa_grad(g, q, k, v, dy, NULL, NULL, B, H, KV, T, hd, scale, 1)) return 1;
    double t3 = now();
    if (rt_matmul(y, x, w, 1, M, D, 3 * D, 0)) return 1;
    double t4 = now();
    /* sdpa_grad: from the forward's out and lse (the trainers' call; 2.5 forwards of
     * FLOPs), then recomputing them (one forward more: 3.5) */
    printf("threads %d: sdpa %7.1f ms %6.2f GFLOP/s | sdpa_grad %7.1f ms %6.2f GFLOP/s "
           "(recomputing the statistics: %7.1f ms, ratio %.3f) | "
           "matmul [%lld,%lld]x[%lld,%lld] %7.1f ms %6.2f GFLOP/s\n",
           t, 1e3 * (t1 - t0), fl / (t1 - t0) * 1e-9, 1e3 * (t2 - t1),
           2.5 * fl / (t2 - t1) * 1e-9, 1e3 * (t3 - t2), (t2 - t1) / (t3 - t2), (long long)M,
           (long long)D, (long long)D, (long long)(3 * D), 1e3 * (t4 - t3),
           2.0 * (double)M * (double)D * 3 * (double)D / (t4 - t3) * 1e-9);
  }
  rt_pool_shutdown();
  free(q), free(k), free(v), free(dy), free(out), free(lse), free(g), free(x), free(w), free(y);
  return 0;
}
