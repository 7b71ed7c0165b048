/* bench/machine_cpu.c -- measures this CPU's sustained rates with parc's own
 * runtime and prints them as a --machine JSON file (passes/machine.h,
 * codegen/machine_file.h).  Not a test.
 *
 *   cmake --build BUILD --target bench_machine_cpu && BUILD/bench_machine_cpu [THREADS [D]]
 *
 * THREADS: pool threads (default: every CPU), as `train --threads` would use;
 * D: the model width the GEMMs are measured at (default 256).  Each figure is
 * the best of REPEATS timed runs (the machine may be shared):
 *   gemm_flops       rt_matmul over one layer's products at width D, 1024
 *                    rows: [1024, D] x [D, 3D], [D, 4D], [1024, 4D] x [4D, D]
 *                    and a vocabulary-wide [1024, D] x [D, 8192], each also
 *                    as the weight gradient's rt_matmul_ta; FLOPs 2 m n k
 *   attention_flops  rt_sdpa + rt_sdpa_grad (from out and lse, as trainers
 *                    call it), B 4, H D/64, T 256, hd 64, causal; FLOPs as
 *                    codegen/step_model.h counts them (forward 4 B H T^2 hd / 2,
 *                    backward 2.5 times that)
 *   memory_bytes_per_s  a parallel triad over 3 x 64 MiB (12 bytes an element)
 *   kernel_s, parallel_call_s  what a generated kernel costs beyond its
 *                    work at codegen's grain (16K elements a task): a triad of
 *                    one task (on the calling thread), and what two tasks
 *                    (waking a pool thread) cost more, each less its work
 *                    run directly (split ideally over the threads)
 *   intra_node_bytes_per_s, latency_s  the thread backend's all_reduce over
 *                    2 ranks: bytes one rank sends (ring: (n-1)/n of 2x the
 *                    buffer) over the time at 4 MiB; latency: a 4-byte one
 * peak_flops is gemm_flops (a CPU states no separate peak here), both
 * precisions get the same rates (the CPU trainer is fp32), and one node holds
 * every rank (inter_node_bytes_per_s = intra). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_attention.h"
#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"

#define REPEATS 5

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *filled(int64_t n, float v) {
  float *x = malloc(sizeof(float) * (size_t)n);
  if (!x) {
    fprintf(stderr, "bench_machine_cpu: out of memory\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) x[i] = v * (float)(i % 13 - 6);
  return x;
}

static void check(int rc) {
  if (rc) {
    fprintf(stderr, "bench_machine_cpu: %s\n", rt_last_error());
    exit(1);
  }
}

/* ---- GEMMs ---- */
static double gemm_rate(int64_t d) {
  /* one layer's forward products at width d, then their backward's
   * transposed-A products (weight gradients), then a vocabulary-wide one */
  const int64_t M = 1024, V = 8192;
  const int64_t shapes[4][3] = {{d, 3 * d, 0}, {d, 4 * d, 0}, {4 * d, d, 0}, {d, V, 0}};
  float *a = filled(M * V, 0.01f), *b = filled(4 * d * V, 0.02f), *y = filled(M * V, 0);
  double best = 0, fl = 0;
  for (int s = 0; s < 4; s++) fl += 2 * 2.0 * (double)M * (double)shapes[s][0] * (double)shapes[s][1];
  for (int r = 0; r <= REPEATS; r++) {
    double t0 = now_s();
    for (int s = 0; s < 4; s++) {
      int64_t k = shapes[s][0], n = shapes[s][1];
      check(rt_matmul(y, a, b, 1, M, k, n, 0));       /* [M, k] x [k, n] */
      check(rt_matmul_ta(y, a, b, 1, k, M, n, 0));    /* [M, k]^T x [M, n] */
    }
    double t = now_s() - t0;
    if (r > 0 && (best == 0 || t < best)) best = t; /* r 0 warms up */
  }
  free(a), free(b), free(y);
  return fl / best;
}

/* ---- attention ---- */
static double attention_rate(int64_t d) {
  int64_t B = 4, H = d / 64 > 0 ? d / 64 : 1, T = 256, hd = 64, n = B * H * T * hd;
  float *q = filled(n, 0.01f), *k = filled(n, 0.02f), *v = filled(n, 0.03f), *dy = filled(n, 0.01f);
  float *out = filled(n, 0), *lse = filled(B * H * T, 0), *g = filled(3 * n, 0);
  double fwd = 4.0 * (double)(B * H) * (double)T * (double)T * (double)hd / 2, best = 0;
  for (int r = 0; r <= REPEATS; r++) {
    double t0 = now_s();
    check(rt_sdpa(out, lse, q, k, v, B, H, H, T, hd, 0.125f, 1));
    check(rt_sdpa_grad(g, q, k, v, dy, out, lse, B, H, H, T, hd, 0.125f, 1));
    double t = now_s() - t0;
    if (r > 0 && (best == 0 || t < best)) best = t;
  }
  free(q), free(k), free(v), free(dy), free(out), free(lse), free(g);
  return 3.5 * fwd / best;
}

/* ---- memory ---- */
typedef struct {
  float *a, *b, *c;
} Triad;

static void triad(void *ctx, int64_t lo, int64_t hi) {
  Triad *t = ctx;
  for (int64_t i = lo; i < hi; i++) t->c[i] = t->a[i] + 0.5f * t->b[i];
}

static double memory_rate(void) {
  const int64_t n = (int64_t)16 << 20; /* 64 MiB a buffer */
  Triad t = {filled(n, 1), filled(n, 2), filled(n, 0)};
  double best = 0;
  for (int r = 0; r <= REPEATS; r++) {
    double t0 = now_s();
    rt_parallel_for(n, 1 << 16, triad, &t);
    double s = now_s() - t0;
    if (r > 0 && (best == 0 || s < best)) best = s;
  }
  free(t.a), free(t.b), free(t.c);
  return 12.0 * (double)n / best;
}

/* What a generated kernel costs beyond its work, at codegen/host.c's grain
 * (16K elements a task): *one for a kernel of one task (run on the calling
 * thread), *two for one of two tasks (it wakes a pool thread), each less its
 * work done directly on this thread (split ideally over the threads). */
static void call_costs(double *one, double *two) {
  const int64_t n = 2 * 16384;
  Triad t = {filled(n, 1), filled(n, 2), filled(n, 0)};
  double pooled[2] = {0, 0}, direct[2] = {0, 0};
  for (int r = 0; r <= REPEATS; r++)
    for (int tasks = 1; tasks <= 2; tasks++) {
      int64_t len = tasks * 16384;
      double t0 = now_s();
      for (int k = 0; k < 1000; k++) rt_parallel_for(len, 16384, triad, &t);
      double t1 = now_s();
      for (int k = 0; k < 1000; k++) triad(&t, 0, len);
      double t2 = now_s(), p = (t1 - t0) / 1000, d = (t2 - t1) / 1000;
      if (r > 0 && (pooled[tasks - 1] == 0 || p < pooled[tasks - 1])) pooled[tasks - 1] = p;
      if (r > 0 && (direct[tasks - 1] == 0 || d < direct[tasks - 1])) direct[tasks - 1] = d;
    }
  free(t.a), free(t.b), free(t.c);
  int th = rt_pool_threads() < 2 ? rt_pool_threads() : 2;
  *one = pooled[0] - direct[0] > 0 ? pooled[0] - direct[0] : 0;
  *two = pooled[1] - direct[1] / th - *one > 0 ? pooled[1] - direct[1] / th - *one : 0;
  if (th < 2) *two = 0; /* one thread: nothing to wake */
}

/* ---- the thread backend's all_reduce ---- */
typedef struct {
  int64_t n;
  double secs; /* per all_reduce, rank 0's best */
} Job;

static int reduce_rank(RtComm *w, void *arg) {
  Job *j = arg;
  float *x = calloc((size_t)j->n, sizeof(float));
  if (!x) return rt_fail("out of memory");
  int it = j->n > 1024 ? 50 : 5000, rc = rt_comm_all_reduce(w, x, x, j->n);
  for (int r = 0; r < REPEATS && rc == RT_OK; r++) {
    rc = rt_comm_barrier(w);
    double t0 = now_s();
    for (int k = 0; k < it && rc == RT_OK; k++) rc = rt_comm_all_reduce(w, x, x, j->n);
    double s = (now_s() - t0) / it;
    if (rt_comm_rank(w) == 0 && (r == 0 || s < j->secs)) j->secs = s;
  }
  free(x);
  return rc;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 0;
  int64_t d = argc > 2 ? atoll(argv[2]) : 256;
  if (threads < 0 || threads > RT_POOL_MAX_THREADS || d < 64 || d > 8192) {
    fprintf(stderr, "usage: bench_machine_cpu [THREADS in [0, %d] [D in [64, 8192]]]\n",
            RT_POOL_MAX_THREADS);
    return 2;
  }
  check(rt_pool_init(threads));
  double gemm = gemm_rate(d), attn = attention_rate(d), mem = memory_rate(), call, wake;
  call_costs(&call, &wake);
  rt_pool_shutdown();
  Job big = {(int64_t)1 << 20, 0}, small = {1, 0};
  check(rt_comm_threads_run(2, reduce_rank, &big));
  check(rt_comm_threads_run(2, reduce_rank, &small));
  double link = 4.0 * (double)big.n * 2 * (2 - 1) / 2 / big.secs;
  char host[64] = "cpu";
  if (gethostname(host, sizeof host - 1)) strcpy(host, "cpu");
  host[sizeof host - 1] = 0;
  printf("{\n  \"name\": \"%s, %ld CPUs, %d threads\",\n", host, sysconf(_SC_NPROCESSORS_ONLN),
         threads ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
  printf("  \"peak_flops\": %.4g,\n  \"gemm_flops\": %.4g,\n  \"attention_flops\": %.4g,\n", gemm,
         gemm, attn);
  printf("  \"memory_bytes_per_s\": %.4g,\n  \"kernel_s\": %.4g,\n", mem, call);
  printf("  \"parallel_call_s\": %.4g,\n  \"parallel_min_elements\": 32768,\n", wake);
  printf("  \"intra_node_bytes_per_s\": %.4g,\n  \"inter_node_bytes_per_s\": %.4g,\n", link, link);
  printf("  \"latency_s\": %.4g,\n  \"ranks_per_node\": 1024\n}\n", small.secs);
  return 0;
}
