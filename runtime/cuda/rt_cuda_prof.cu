/* runtime/cuda/rt_cuda_prof.cu -- the profile's device side: CUDA events on
 * the compute stream as rt_cuda_prof.h's RtProfEvents, and the entry points
 * of the generated code (rt_cuda.h: rt_cuda_profiling, rt_cuda_prof_begin,
 * rt_cuda_prof_kernel).  See rt_cuda_prof.h for what is recorded. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cuda/rt_cuda_impl.h"

static const char *ev_reserve(void *ctx, int n) {
  RtCuda *c = (RtCuda *)ctx;
  if (n <= c->prof_nev) return NULL;
  if (n > c->prof_cap) {
    int cap = c->prof_cap ? c->prof_cap : 256;
    while (cap < n) cap *= 2;
    cudaEvent_t *ev = (cudaEvent_t *)realloc(c->prof_ev, sizeof *ev * (size_t)cap);
    if (!ev) return "out of memory";
    c->prof_ev = ev;
    c->prof_cap = cap;
  }
  for (; c->prof_nev < n; c->prof_nev++) {
    cudaError_t e = cudaEventCreate(&c->prof_ev[c->prof_nev]);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  return NULL;
}

static const char *ev_record(void *ctx, int i) {
  RtCuda *c = (RtCuda *)ctx;
  if (i < 0 || i >= c->prof_nev) return "event out of range (an internal error)";
  cudaError_t e = cudaEventRecord(c->prof_ev[i], c->compute);
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static const char *ev_elapsed(void *ctx, int a, int b, double *ms) {
  RtCuda *c = (RtCuda *)ctx;
  if (a < 0 || b < 0 || a >= c->prof_nev || b >= c->prof_nev)
    return "event out of range (an internal error)";
  float f = 0;
  cudaError_t e = cudaEventElapsedTime(&f, c->prof_ev[a], c->prof_ev[b]);
  *ms = f;
  return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static double ev_wall_ms(void *ctx) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

int rt_cuda_prof_open(RtCuda *c) {
  char path[4096];
  if (!rt_prof_config(getenv("PARC_CUDA_PROFILE"), path, sizeof path)) return RT_OK;
  RtProfEvents ev = {c, ev_reserve, ev_record, ev_elapsed, ev_wall_ms};
  static const char *const mode[] = {"fp32", "bf16", "tf32"};
  c->prof = rt_prof_new(&ev, c->wrank, c->ranks, c->desc, c->model,
                        c->gemm >= 0 && c->gemm <= 2 ? mode[c->gemm] : "?");
  if (!c->prof) return rt_fail("rank %d: out of memory for the profile", c->wrank);
  rt_prof_register(c->prof, path);
  return RT_OK;
}

void rt_cuda_prof_close(RtCuda *c) {
  if (c->prof) rt_prof_detach(c->prof); /* the registry keeps it for the report */
  c->prof = NULL;
  for (int i = 0; i < c->prof_nev; i++) cudaEventDestroy(c->prof_ev[i]);
  free(c->prof_ev);
  c->prof_ev = NULL;
  c->prof_nev = c->prof_cap = 0;
}

extern "C" int rt_cuda_profiling(RtCuda *c) { return c->prof && c->prof->on; }

extern "C" void rt_cuda_prof_begin(RtCuda *c) {
  if (c->prof) rt_prof_begin(c->prof);
}

extern "C" void rt_cuda_prof_kernel(RtCuda *c, const char *kernel, int64_t bytes) {
  if (c->prof) rt_prof_end(c->prof, RT_PROF_KERNEL, (double)bytes, 0, kernel);
}
