/* bench/comm_bandwidth.c -- all_reduce bus bandwidth of the communicator's thread
 * backend against memcpy.  Not a test.
 *
 *   cmake --build BUILD --target bench_comm_bandwidth && BUILD/bench_comm_bandwidth [MAX_MIB]
 *
 * For 2 and 4 ranks and buffers of 4 KiB .. 64 MiB (in place, float32):
 *   algbw = bytes / time per all_reduce
 *   busbw = algbw * 2 (n - 1) / n   (NCCL's convention: the bytes each rank must move
 *                                    through its link in a bandwidth-optimal all-reduce)
 *   memcpy = bytes / time of one memcpy of the same size on one thread, the ceiling of
 *            copying on this machine; ratio = busbw / memcpy.
 * Each figure is the best of REPEATS timed loops (the machine may be shared). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define REPEATS 3

static int iters_for(size_t bytes) {
  size_t it = ((size_t)256 << 20) / bytes;    /* about 256 MiB per measurement */
  return it < 5 ? 5 : it > 20000 ? 20000 : (int)it;
}

typedef struct {
  size_t bytes;
  double secs;                /* per all_reduce, measured by rank 0 */
} Job;

static int bench_rank(RtComm *w, void *arg) {
  Job *j = arg;
  int64_t n = (int64_t)(j->bytes / sizeof(float));
  float *x = malloc(j->bytes);
  if (!x) return rt_fail("out of memory for %zu bytes", j->bytes);
  for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 7) * 0.25f;
  int it = iters_for(j->bytes), rc = RT_OK;
  for (int k = 0; k < 2 && rc == RT_OK; k++) rc = rt_comm_all_reduce(w, x, x, n);  /* warm */
  /* Best of REPEATS timed loops: the machine may be shared. */
  for (int rep = 0; rep < REPEATS && rc == RT_OK; rep++) {
    rc = rt_comm_barrier(w);
    double t0 = now_s();
    for (int k = 0; k < it && rc == RT_OK; k++) rc = rt_comm_all_reduce(w, x, x, n);
    if (rc == RT_OK) rc = rt_comm_barrier(w);
    double s = (now_s() - t0) / it;
    if (rt_comm_rank(w) == 0 && (rep == 0 || s < j->secs)) j->secs = s;
  }
  free(x);
  return rc;
}

static double memcpy_secs(size_t bytes) {
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) {
    free(a);
    free(b);
    return 0;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  int it = iters_for(bytes);
  memcpy(b, a, bytes);
  double s = 0;
  for (int rep = 0; rep < REPEATS; rep++) {
    double t0 = now_s();
    for (int k = 0; k < it; k++) {
      memcpy(k % 2 ? a : b, k % 2 ? b : a, bytes);
      __asm__ volatile("" : : "r"(a), "r"(b) : "memory");
    }
    double t = (now_s() - t0) / it;
    if (rep == 0 || t < s) s = t;
  }
  free(a);
  free(b);
  return s;
}

int main(int argc, char **argv) {
  size_t max_mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
  printf("thread-backend all_reduce (in place, float32) vs one-thread memcpy; %ld CPUs\n",
         sysconf(_SC_NPROCESSORS_ONLN));
  printf("%6s %10s %10s %10s %10s %7s\n", "ranks", "size", "us/op", "busbw GB/s",
         "memcpy GB/s", "ratio");
  for (int ranks = 2; ranks <= 4; ranks += 2)
    for (size_t bytes = 4096; bytes <= max_mib << 20; bytes *= 4) {
      Job j = {.bytes = bytes};
      if (rt_comm_threads_run(ranks, bench_rank, &j)) {
        fprintf(stderr, "bench_comm_bandwidth: %s\n", rt_last_error());
        return 1;
      }
      double mc = memcpy_secs(bytes);
      double busbw = (double)bytes / j.secs * 2.0 * (ranks - 1) / ranks / 1e9;
      double mbw = mc > 0 ? (double)bytes / mc / 1e9 : 0;
      char size[32];
      if (bytes >= (1u << 20)) snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
      else snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
      printf("%6d %10s %10.1f %10.2f %10.2f %7.2f\n", ranks, size, j.secs * 1e6, busbw, mbw,
             mbw > 0 ? busbw / mbw : 0);
      fflush(stdout);
    }
  return 0;
}
