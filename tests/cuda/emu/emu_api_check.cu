/* tests/cuda/emu/emu_api_check.cu -- the emulated CUDA runtime itself
 * (cuda_runtime.h, emu_runtime.cpp, kcu_emu_kernel.h, cub's SortPairs), as
 * CUDA source: built like runtime/cuda (emu_rewrite.py, then g++), so its
 * launches also check the rewrite (multi-line, templated, 2 to 4
 * configuration arguments, extern __shared__).  Each check against values
 * computed here on the host; exit 0 iff all hold (ctest cuda/emu_api).
 *
 * Devices and memory: KCU_EMU_GPUS, properties, cudaMemGetInfo following the
 * allocations, fresh memory all 0xff.  Kernels: every thread of 3-D grids and
 * blocks (a partial last warp) exactly once; shuffles (xor, down, up, indexed,
 * widths 8 to 32) against the lanes' values; dynamic and static shared memory
 * with block barriers; launch-shape and shared-memory checks through
 * cudaGetLastError, nothing run by a refused launch; two host threads running
 * kernels at once.  Streams, events, graphs: timings, a capture (a fork to a
 * second stream and its join) that runs nothing until cudaGraphLaunch replays
 * it in order, the calls a capture prohibits (each invalidating it), an
 * unjoined fork.  The order threads run in (forward, or all reversed with
 * KCU_EMU_ORDER=1: cuda/emu_api_reversed).  The barrier checks: a
 * __syncthreads one thread skips, and a shuffle with part of a warp, abort a
 * child process.  cub: a stable sort of pairs on key bits [begin, end).
 * kcu_emu_mma_ptx.h: runtime/cuda/rt_cuda_mma.h's mma.sync and ldmatrix
 * operands and results in their documented lanes (a product and a product fed
 * back as an operand, against the host); a misaligned ldmatrix row aborts. */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "cu_test.h" /* failures, CHECK */
#include "runtime/cuda/rt_cuda_mma.h"

/* ---- kernels ---- */

/* One warp, through rt_cuda_mma.h's documented layout: s = a b^T (a, b 16 x 16
 * bf16), then o = bf16(s) v (v 16 x 16), each written from the C registers
 * (lane: rows g, g + 8, columns 8 n + 2 t, + 1) to [16][16] fp32. */
__global__ void mma_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                           const __nv_bfloat16 *v, float *s_out, float *o_out) {
  struct __align__(16) Tiles {
    __nv_bfloat16 a[16 * 24], b[16 * 24], v[16 * 24]; /* row stride 48 bytes */
  };
  __shared__ Tiles sm;
  __nv_bfloat16 *as = sm.a, *bs = sm.b, *vs = sm.v;
  for (int e = threadIdx.x; e < 256; e += 32) {
    as[e / 16 * 24 + e % 16] = a[e];
    bs[e / 16 * 24 + e % 16] = b[e];
    vs[e / 16 * 24 + e % 16] = v[e];
  }
  __syncwarp();
  const int g = threadIdx.x >> 2, t = threadIdx.x & 3;
  uint32_t fa[4], fb[4];
  float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}}, o[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  rt_ldsm_a(fa, as, 24);
  rt_ldsm_bt(fb, bs, 24);
  rt_mma16816(s[0], fa, fb);
  rt_mma16816(s[1], fa, fb + 2);
  rt_mma_c2a(fa, s[0], s[1]);
  rt_ldsm_b(fb, vs, 24);
  rt_mma16816(o[0], fa, fb);
  rt_mma16816(o[1], fa, fb + 2);
  for (int n = 0; n < 2; n++)
    for (int i = 0; i < 4; i++) {
      const int at = (g + 8 * (i >> 1)) * 16 + 8 * n + 2 * t + (i & 1);
      s_out[at] = s[n][i];
      o_out[at] = o[n][i];
    }
}

/* ldmatrix with a row address that is not 16-byte aligned */
__global__ void ldsm_misaligned_kernel(float *x) {
  struct __align__(16) Rows {
    __nv_bfloat16 m[8 * 8 * 4 + 8];
  };
  __shared__ Rows sm;
  uint32_t r[4];
  rt_ldsm4(r, sm.m + 1 + (threadIdx.x & 31) * 8);
  x[threadIdx.x] = (float)r[0];
}

/* out[linear thread id] = its id + 1 and the coordinates' consistency */
__global__ void ids_kernel(int *out, int *bad) {
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  if (threadIdx.x >= blockDim.x || threadIdx.y >= blockDim.y || threadIdx.z >= blockDim.z ||
      blockIdx.x >= gridDim.x || blockIdx.y >= gridDim.y || blockIdx.z >= gridDim.z)
    atomicAdd(bad, 1);
  out[b * nt + t] += (int)(b * nt + t) + 1;
}

/* Per thread: [0] xor-sum over the warp, [1] down by 3 within 16 lanes, [2]
 * lane 5 of each 8, [3] up by 1 within 32 (a double's bits: 8 bytes) */
__global__ void shfl_kernel(float *out) {
  unsigned t = threadIdx.x;
  float v = (float)(t * 3 + 1);
  float s = v;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  float d = __shfl_down_sync(0xffffffffu, v, 3, 16);
  float i = __shfl_sync(0xffffffffu, v, 5, 8);
  double u = __shfl_up_sync(0xffffffffu, (double)v + 0.5, 1);
  out[4 * t + 0] = s;
  out[4 * t + 1] = d;
  out[4 * t + 2] = i;
  out[4 * t + 3] = (float)u;
}

/* Reverses each block's n elements through dynamic shared memory, then adds
 * the block's sum (a static __shared__ accumulator); T, SCALE templated. */
template <typename T, int SCALE>
__global__ void __launch_bounds__(256, 2) rev_kernel(T *x, int n) {
  extern __shared__ __align__(16) unsigned char raw[];
  __shared__ T total;
  T *sh = (T *)raw;
  int t = threadIdx.x;
  if (t == 0) total = 0;
  T *row = x + (size_t)blockIdx.x * n;
  if (t < n) sh[t] = row[t];
  __syncthreads();
  if (t < n) atomicAdd(&total, sh[t]);
  __syncthreads();
  if (t < n) row[t] = sh[n - 1 - t] * SCALE + total;
}

/* Each thread takes a ticket: the order threads run in (no barrier) */
__global__ void ticket_kernel(int *next, int *ticket) {
  ticket[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(next, 1);
}

__global__ void add_kernel(float *x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f + v;
}

__global__ void skip_barrier_kernel(int *x) {
  if (threadIdx.x != 3) __syncthreads();
  x[threadIdx.x] = 1;
}

__global__ void part_warp_kernel(float *x) {
  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_xor_sync(0xffffu, x[threadIdx.x], 1);
}

/* ---- checks ---- */

static void check_device(void) {
  setenv("KCU_EMU_GPUS", "3", 1);
  int n = 0;
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 3, "%d devices", n);
  CHECK(cudaSetDevice(3) == cudaErrorInvalidDevice, "device 3 of 3");
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice, "the error is the last one");
  CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError resets it");
  unsetenv("KCU_EMU_GPUS");
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 1, "%d devices by default", n);
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9 && p.minor == 0 &&
            p.totalGlobalMem == (size_t)16 << 30 && p.multiProcessorCount > 0,
        "properties sm_%d%d, %zu bytes", p.major, p.minor, p.totalGlobalMem);
  int major = 0;
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
            major == 9, "major %d", major);
  size_t f0, t0, f1, t1, f2, t2;
  cudaMemGetInfo(&f0, &t0);
  void *d = NULL;
  CHECK(cudaMalloc(&d, 1 << 20) == cudaSuccess && d, "cudaMalloc");
  cudaMemGetInfo(&f1, &t1);
  CHECK(f0 - f1 == 1 << 20 && t0 == t1, "free %zu -> %zu", f0, f1);
  const unsigned char *b = (const unsigned char *)d;
  int all_ff = 1;
  for (int i = 0; i < 1 << 20; i++) all_ff &= b[i] == 0xff;
  CHECK(all_ff, "fresh device memory is 0xff");
  CHECK(cudaFree(d) == cudaSuccess, "cudaFree");
  cudaMemGetInfo(&f2, &t2);
  CHECK(f2 == f0, "free back to %zu, got %zu", f0, f2);
  CHECK(cudaFree((void *)0x1234) == cudaErrorInvalidValue, "freeing a wild pointer");
  (void)cudaGetLastError();
  void *huge = NULL;
  CHECK(cudaMalloc(&huge, (size_t)17 << 30) == cudaErrorMemoryAllocation, "17 GiB of 16");
  (void)cudaGetLastError();
}

static void check_kernels(void) {
  /* 3-D grid and block, 30 threads a block: one partial warp */
  dim3 grid(3, 2, 2), block(5, 3, 2);
  int nt = 3 * 2 * 2 * 30;
  int *ids, *bad;
  cudaMalloc(&ids, nt * sizeof(int));
  cudaMalloc(&bad, sizeof(int));
  cudaMemset(ids, 0, nt * sizeof(int));
  cudaMemset(bad, 0, sizeof(int));
  ids_kernel<<<grid,
               block>>>(ids, bad);
  CHECK(cudaGetLastError() == cudaSuccess, "3-D launch");
  int wrong = 0;
  for (int i = 0; i < nt; i++) wrong += ids[i] != i + 1;
  CHECK(wrong == 0 && *bad == 0, "%d threads wrong, %d out of range", wrong, *bad);

  /* shuffles: 64 threads, two warps */
  float *sh;
  cudaMalloc(&sh, 64 * 4 * sizeof(float));
  shfl_kernel<<<1, 64, 0>>>(sh);
  for (int t = 0; t < 64; t++) {
    float v = (float)(t * 3 + 1), s = 0;
    int w = t & ~31, l = t & 31;
    for (int j = 0; j < 32; j++) s += (float)((w + j) * 3 + 1);
    float d = (l % 16) + 3 < 16 ? (float)((t + 3) * 3 + 1) : v;
    float i = (float)((w + (l & ~7) + 5) * 3 + 1);
    float u = l >= 1 ? (float)((t - 1) * 3 + 1) + 0.5f : v + 0.5f;
    CHECK(sh[4 * t] == s && sh[4 * t + 1] == d && sh[4 * t + 2] == i && sh[4 * t + 3] == u,
          "thread %d: %g %g %g %g, want %g %g %g %g", t, sh[4 * t], sh[4 * t + 1],
          sh[4 * t + 2], sh[4 * t + 3], s, d, i, u);
  }

  /* dynamic + static shared memory, a templated kernel, 3 blocks of 100 */
  int n = 100;
  float *x;
  cudaMalloc(&x, 3 * n * sizeof(float));
  std::vector<float> h(3 * n);
  for (int i = 0; i < 3 * n; i++) h[i] = (float)(i % 17);
  cudaMemcpy(x, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  rev_kernel<float, 2><<<3, 128, n * sizeof(float),
                         st>>>(x, n);
  CHECK(cudaGetLastError() == cudaSuccess, "rev_kernel");
  std::vector<float> got(3 * n);
  cudaMemcpyAsync(got.data(), x, got.size() * 4, cudaMemcpyDeviceToHost, st);
  cudaStreamSynchronize(st);
  for (int b = 0; b < 3; b++) {
    float tot = 0;
    for (int i = 0; i < n; i++) tot += h[b * n + i];
    for (int i = 0; i < n; i++)
      CHECK(got[b * n + i] == h[b * n + n - 1 - i] * 2 + tot, "block %d element %d", b, i);
  }

  /* the order threads run in: blocks, then warps, then lanes, in order, or all
   * reversed with KCU_EMU_ORDER=1 */
  {
    const char *o = getenv("KCU_EMU_ORDER");
    int rev = o && !strcmp(o, "1");
    int *next, *ticket;
    cudaMalloc(&next, sizeof(int));
    cudaMalloc(&ticket, 128 * sizeof(int));
    *next = 0;
    ticket_kernel<<<2, 64>>>(next, ticket);
    int bad_order = 0;
    for (int i = 0; i < 128; i++) bad_order += ticket[i] != (rev ? 127 - i : i);
    CHECK(bad_order == 0, "%d threads out of %s order", bad_order, rev ? "reversed" : "");
    cudaFree(next);
    cudaFree(ticket);
  }

  /* refused launches run nothing */
  cudaMemcpy(x, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  add_kernel<<<1, 1025>>>(x, 1.0f, n);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads a block");
  add_kernel<<<dim3(1, 65536), 32>>>(x, 1.0f, n);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y 65536");
  rev_kernel<float, 1><<<1, 128, 64 * 1024>>>(x, n);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory");
  CHECK(memcmp(x, h.data(), h.size() * 4) == 0, "a refused launch ran");
  CHECK(cudaFuncSetAttribute(rev_kernel<float, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             64 * 1024) == cudaSuccess, "raising the limit");
  rev_kernel<float, 1><<<1, 128, 64 * 1024>>>(x, n);
  CHECK(cudaGetLastError() == cudaSuccess, "64 KiB once raised");
  CHECK(x[0] != h[0] || x[1] != h[1], "it ran");
  CHECK(cudaFuncSetAttribute(rev_kernel<float, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             228 * 1024) == cudaErrorInvalidValue, "above 227 KiB");
  (void)cudaGetLastError();

  /* two host threads at once, each its own kernels and shared memory */
  std::vector<float> r[2];
  auto work = [&](int k) {
    float *y;
    cudaMalloc(&y, 4 * 64 * sizeof(float));
    for (int i = 0; i < 4 * 64; i++) y[i] = (float)(i % 64 + k);
    for (int rep = 0; rep < 20; rep++) rev_kernel<float, 1><<<4, 64, 64 * 4>>>(y, 64);
    r[k].assign(y, y + 4 * 64);
    cudaFree(y);
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join();
  t1.join();
  for (int k = 0; k < 2; k++) {
    std::vector<float> y(4 * 64);
    for (int i = 0; i < 4 * 64; i++) y[i] = (float)(i % 64 + k);
    for (int rep = 0; rep < 20; rep++)
      for (int b = 0; b < 4; b++) {
        float tot = 0, tmp[64];
        for (int i = 0; i < 64; i++) tot += y[b * 64 + i];
        for (int i = 0; i < 64; i++) tmp[i] = y[b * 64 + 63 - i] + tot;
        memcpy(&y[b * 64], tmp, sizeof tmp);
      }
    CHECK(r[k] == y, "host thread %d's results", k);
  }
  cudaStreamDestroy(st);
  cudaFree(ids);
  cudaFree(bad);
  cudaFree(sh);
  cudaFree(x);
}

/* A child process runs f; it must die of SIGABRT with `what` on stderr. */
static void check_aborts(void (*f)(void), const char *what) {
  fflush(stdout);
  fflush(stderr);
  pid_t p = fork();
  if (p == 0) {
    if (!freopen("/dev/null", "w", stderr)) _exit(2);
    f();
    _exit(0);
  }
  int st = 0;
  waitpid(p, &st, 0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "%s: not aborted (status %d)", what, st);
}
static void run_skip_barrier(void) {
  int *x;
  cudaMalloc(&x, 64 * sizeof(int));
  skip_barrier_kernel<<<1, 64>>>(x);
}
static void run_part_warp(void) {
  float *x;
  cudaMalloc(&x, 32 * sizeof(float));
  part_warp_kernel<<<1, 32>>>(x);
}

/* rt_cuda_mma.h's products against the host (device memory is host memory
 * here), on values that make every element distinct: a wrong lane, register or half gives a wrong sum. */
static void check_mma(void) {
  __nv_bfloat16 *a, *b, *v;
  float *so, *oo;
  cudaMalloc(&a, 3 * 256 * sizeof *a);
  cudaMalloc(&so, 2 * 256 * sizeof *so);
  b = a + 256, v = b + 256, oo = so + 256;
  for (int i = 0; i < 256; i++) {
    a[i] = __float2bfloat16_rn((float)((i * 37) % 61 - 30) / 16.0f);
    b[i] = __float2bfloat16_rn((float)((i * 53) % 67 - 33) / 32.0f);
    v[i] = __float2bfloat16_rn((float)((i * 29) % 59 - 29) / 8.0f);
  }
  mma_kernel<<<1, 32>>>(a, b, v, so, oo);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "mma_kernel");
  int bad_s = 0, bad_o = 0;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      double rs = 0, ro = 0;
      for (int k = 0; k < 16; k++) {
        rs += (double)__bfloat162float(a[i * 16 + k]) * __bfloat162float(b[j * 16 + k]);
        ro += (double)__bfloat162float(__float2bfloat16_rn(so[i * 16 + k])) *
              __bfloat162float(v[k * 16 + j]);
      }
      bad_s += fabs(so[i * 16 + j] - rs) > 1e-5 * (1 + fabs(rs));
      bad_o += fabs(oo[i * 16 + j] - ro) > 1e-5 * (1 + fabs(ro));
    }
  CHECK(bad_s == 0 && bad_o == 0, "mma.sync layout: %d of a b^T, %d of s v wrong", bad_s, bad_o);
  cudaFree(a);
  cudaFree(so);
}
static void run_ldsm_misaligned(void) {
  float *x;
  cudaMalloc(&x, 32 * sizeof(float));
  ldsm_misaligned_kernel<<<1, 32>>>(x);
  cudaDeviceSynchronize();
}

static void check_streams_graphs(void) {
  cudaStream_t s, s2;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreate(&s2);
  cudaEvent_t a, b, nt, fork, join;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventCreateWithFlags(&nt, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  int n = 256;
  float *x, *y;
  cudaMalloc(&x, n * sizeof(float));
  cudaMalloc(&y, n * sizeof(float));
  cudaMemset(x, 0, n * sizeof(float));

  /* timing */
  cudaEventRecord(a, s);
  for (int i = 0; i < 5; i++) add_kernel<<<2, 128, 0, s>>>(x, 1.0f, n);
  cudaEventRecord(b, s);
  cudaEventRecord(nt, s);
  CHECK(cudaEventSynchronize(b) == cudaSuccess && cudaEventQuery(b) == cudaSuccess, "done");
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0.0f, "elapsed %g ms", ms);
  CHECK(cudaEventElapsedTime(&ms, a, nt) != cudaSuccess, "a timing-disabled event");
  (void)cudaGetLastError();
  CHECK(x[0] == 31.0f, "x = 2x + 1 five times: %g", x[0]);

  /* capture: s, forked to s2 and joined back */
  cudaMemset(x, 0, n * sizeof(float));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin");
  add_kernel<<<2, 128, 0, s>>>(x, 1.0f, n);
  cudaEventRecord(fork, s);
  CHECK(cudaStreamWaitEvent(s2, fork, 0) == cudaSuccess, "s2 joins the capture");
  cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s2);
  add_kernel<<<2, 128, 0, s2>>>(y, 0.5f, n);
  cudaEventRecord(join, s2);
  cudaStreamWaitEvent(s, join, 0);
  int order = 0, seen = -1;
  CHECK(kcu_emu_enqueue(s, [&]() { seen = order++; }) == 0, "an enqueued closure");
  cudaGraph_t g = NULL;
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "end");
  CHECK(x[0] == 0.0f && seen == -1, "nothing ran during the capture: %g %d", x[0], seen);
  cudaGraphExec_t ge = NULL;
  CHECK(cudaGraphInstantiateWithFlags(&ge, g, 0) == cudaSuccess, "instantiate");
  cudaGraphDestroy(g);
  float want_x = 0;
  for (int rep = 0; rep < 3; rep++) {
    CHECK(cudaGraphLaunch(ge, s) == cudaSuccess, "launch %d", rep);
    want_x = want_x * 2 + 1;
    float want_y = want_x * 2 + 0.5f;
    CHECK(x[7] == want_x && y[7] == want_y && seen == rep, "replay %d: %g %g %d (want %g %g)",
          rep, x[7], y[7], seen, want_x, want_y);
  }
  cudaGraphExecDestroy(ge);

  /* prohibited calls invalidate the capture */
  struct {
    const char *what;
    int call;
  } bad[] = {{"cudaMalloc", 0}, {"cudaMemcpy", 1}, {"cudaStreamSynchronize", 2},
             {"cudaEventQuery", 3}, {"cudaDeviceSynchronize", 4}};
  for (auto &c : bad) {
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    add_kernel<<<1, 32, 0, s>>>(x, 1.0f, 32);
    cudaEventRecord(a, s);
    void *p = NULL;
    cudaError_t e = c.call == 0   ? cudaMalloc(&p, 64)
                    : c.call == 1 ? cudaMemcpy(y, x, 4, cudaMemcpyDeviceToDevice)
                    : c.call == 2 ? cudaStreamSynchronize(s)
                    : c.call == 3 ? cudaEventQuery(a)
                                  : cudaDeviceSynchronize();
    CHECK(e == cudaErrorStreamCaptureUnsupported, "%s during a capture: %s", c.what,
          cudaGetErrorName(e));
    g = (cudaGraph_t)1;
    e = cudaStreamEndCapture(s, &g);
    CHECK(e == cudaErrorStreamCaptureInvalidated && !g, "%s: the capture ends with %s", c.what,
          cudaGetErrorName(e));
    (void)cudaGetLastError();
  }
  /* a fork never joined */
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(s2, fork, 0);
  add_kernel<<<1, 32, 0, s2>>>(y, 1.0f, 32);
  cudaError_t e = cudaStreamEndCapture(s, &g);
  CHECK(e == cudaErrorStreamCaptureUnjoined, "unjoined: %s", cudaGetErrorName(e));
  (void)cudaGetLastError();
  /* s2 left the capture with it: its work runs again */
  float y0 = y[0];
  add_kernel<<<1, 32, 0, s2>>>(y, 1.0f, 32);
  CHECK(y[0] == y0 * 2 + 1, "s2 after the capture");
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(nt);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
}

static void check_sort(void) {
  int n = 1000;
  std::vector<int> k(n), v(n);
  uint64_t r = 12345;
  for (int i = 0; i < n; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    k[i] = (int)(r % 50) | (int)((r >> 20) % 4) << 8; /* bits 8, 9 ignored below */
    v[i] = i;
  }
  int *dk, *dv, *ok, *ov;
  cudaMalloc(&dk, n * 4);
  cudaMalloc(&dv, n * 4);
  cudaMalloc(&ok, n * 4);
  cudaMalloc(&ov, n * 4);
  cudaMemcpy(dk, k.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v.data(), n * 4, cudaMemcpyHostToDevice);
  size_t temp = 0;
  CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp, (const int *)NULL, (int *)NULL,
                                        (const int *)NULL, (int *)NULL, n, 0, 8) == cudaSuccess &&
            temp > 0, "temp size %zu", temp);
  void *t;
  cudaMalloc(&t, temp);
  CHECK(cub::DeviceRadixSort::SortPairs(t, temp, dk, ok, dv, ov, n, 0, 8) == cudaSuccess, "sort");
  std::vector<int> ref(v);
  std::stable_sort(ref.begin(), ref.end(), [&](int a, int b) { return (k[a] & 255) < (k[b] & 255); });
  int wrong = 0;
  for (int i = 0; i < n; i++) wrong += ov[i] != ref[i] || ok[i] != k[ref[i]];
  CHECK(wrong == 0, "%d pairs out of place", wrong);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(ok);
  cudaFree(ov);
  cudaFree(t);
}

int main(void) {
  check_device();
  check_kernels();
  check_aborts(run_skip_barrier, "a __syncthreads one thread skips");
  check_aborts(run_part_warp, "a shuffle with half a warp");
  check_mma();
  check_aborts(run_ldsm_misaligned, "ldmatrix of a misaligned row");
  check_streams_graphs();
  check_sort();
  printf("emu_api_check: %s (%d failure%s)\n", failures ? "FAIL" : "ok", failures,
         failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
