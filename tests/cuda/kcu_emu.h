/* tests/cuda/kcu_emu.h -- just enough of CUDA to run a generated kernels.cu
 * on the CPU, for tests without a GPU (cu_split_emu.cpp).
 *
 * A launch runs its blocks one after another, in an order the test chooses
 * (kcu_emu_order), each as blockDim.x fibers (ucontext) on one OS thread.  A
 * fiber runs until it reaches a barrier: __syncthreads (all threads of the
 * block), __syncwarp and the shuffles (the 32 threads of its warp); a
 * barrier is released when every thread it waits for has reached that same
 * kind of barrier.  Anything else is an error that aborts the test: a
 * block barrier some threads of the block never reach (one returned, or
 * waits on another barrier), a warp barrier with part of the warp.
 * Shared memory (`__shared__` locals) becomes function statics: one block
 * runs at a time.  Fences and atomics are plain sequential code.
 *
 * The source must be rewritten first (cu_split_emu.sh): `#include
 * <cuda_runtime.h>` to this header, and `K<<<grid, block, 0, stream>>>(args)`
 * to `kcu_emu_launch(grid, block, K, args)`. */
#ifndef KCU_EMU_H
#define KCU_EMU_H

#include <math.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __restrict__ __restrict

struct kcu_emu_dim3 {
  unsigned x, y, z;
};
/* a launch's grid of x by y blocks (batched launches: kir_cuda.h, NAME_multi) */
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline kcu_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

typedef struct CUstream_st *cudaStream_t;

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

/* ---- arithmetic: the host's IEEE single precision, round to nearest (build
 * with -ffp-contract=off so nothing becomes an FMA that is not one) ---- */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __ll2float_rn(long long v) { return (float)v; }
inline float __int2float_rn(int v) { return (float)v; }
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
/* fabsf, fmaf, copysignf: <math.h>'s */

template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }

inline void __threadfence() {}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
  unsigned o = *p;
  *p = o + v;
  return o;
}
inline unsigned atomicExch(unsigned *p, unsigned v) {
  unsigned o = *p;
  *p = v;
  return o;
}

/* ---- fibers ---- */

enum { KCU_EMU_RUN, KCU_EMU_BLOCK, KCU_EMU_WARP, KCU_EMU_DONE };

struct KcuEmuFiber {
  ucontext_t ctx;
  int state;
  std::vector<char> stack;
};

inline std::vector<KcuEmuFiber> kcu_emu_fibers;
inline ucontext_t kcu_emu_sched;
inline int kcu_emu_cur;
inline std::function<void()> kcu_emu_body;
inline uint64_t kcu_emu_xchg[1024];  /* the shuffles' values, by thread */
inline long kcu_emu_barriers;         /* released, for the test's report */

[[noreturn]] inline void kcu_emu_fail(const char *what) {
  std::fprintf(stderr, "kcu_emu: block %u: %s\n", blockIdx.x, what);
  std::exit(1);
}

inline void kcu_emu_wait(int kind) {
  kcu_emu_fibers[kcu_emu_cur].state = kind;
  swapcontext(&kcu_emu_fibers[kcu_emu_cur].ctx, &kcu_emu_sched);
}

inline void __syncthreads() { kcu_emu_wait(KCU_EMU_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { kcu_emu_wait(KCU_EMU_WARP); }

template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a wide type");
  const unsigned t = threadIdx.x;
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  kcu_emu_xchg[t] = b;
  kcu_emu_wait(KCU_EMU_WARP);
  const uint64_t o = kcu_emu_xchg[(t & ~31u) | ((t & 31u) ^ (unsigned)m)];
  kcu_emu_wait(KCU_EMU_WARP);  /* everyone read before anyone writes again */
  T r;
  std::memcpy(&r, &o, sizeof r);
  return r;
}

inline void kcu_emu_entry() {
  kcu_emu_body();
  kcu_emu_fibers[kcu_emu_cur].state = KCU_EMU_DONE;
  swapcontext(&kcu_emu_fibers[kcu_emu_cur].ctx, &kcu_emu_sched);
}

/* One block: every thread from the start to its return. */
inline void kcu_emu_block(unsigned n) {
  if (kcu_emu_fibers.size() < n) kcu_emu_fibers.resize(n);
  for (unsigned i = 0; i < n; i++) {
    KcuEmuFiber &f = kcu_emu_fibers[i];
    f.stack.resize(256 * 1024);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, kcu_emu_entry, 0);
    f.state = KCU_EMU_RUN;
  }
  for (;;) {
    for (unsigned i = 0; i < n; i++) {
      while (kcu_emu_fibers[i].state == KCU_EMU_RUN) {
        kcu_emu_cur = (int)i;
        threadIdx = {i, 0, 0};
        swapcontext(&kcu_emu_sched, &kcu_emu_fibers[i].ctx);
      }
    }
    int done = 0, block = 0, released = 0;
    for (unsigned w = 0; w < n; w += 32) {
      int at = 0;
      for (unsigned i = w; i < w + 32 && i < n; i++) at += kcu_emu_fibers[i].state == KCU_EMU_WARP;
      if (at == 0) continue;
      if (at != 32) kcu_emu_fail("a warp barrier or shuffle without the whole warp");
      for (unsigned i = w; i < w + 32; i++) kcu_emu_fibers[i].state = KCU_EMU_RUN;
      released = 1;
      kcu_emu_barriers++;
    }
    if (released) continue;
    for (unsigned i = 0; i < n; i++) {
      done += kcu_emu_fibers[i].state == KCU_EMU_DONE;
      block += kcu_emu_fibers[i].state == KCU_EMU_BLOCK;
    }
    if ((unsigned)done == n) return;
    if ((unsigned)block != n) kcu_emu_fail("__syncthreads that not every thread of the block reaches");
    for (unsigned i = 0; i < n; i++) kcu_emu_fibers[i].state = KCU_EMU_RUN;
    kcu_emu_barriers++;
  }
}

/* The order blocks run in: 0 in index order, 1 reversed, else a shuffle
 * seeded by it.  Sequential blocks make "the last block" the last of the
 * order; a deterministic kernel gives the same bits for every order. */
inline unsigned kcu_emu_order = 0;
inline long kcu_emu_launches, kcu_emu_blocks;

template <class K, class... A> void kcu_emu_launch(dim3 grid2, unsigned block, K kernel, A... args) {
  const unsigned grid = grid2.x * grid2.y; /* blocks in all, y-major: b = y * x + x */
  if (grid2.x == 0 || grid2.y == 0 || grid2.z != 1 || block == 0 || block > 1024 || block % 32)
    kcu_emu_fail("bad launch shape");
  gridDim = {grid2.x, grid2.y, 1};
  blockDim = {block, 1, 1};
  std::vector<unsigned> order(grid);
  for (unsigned i = 0; i < grid; i++) order[i] = kcu_emu_order == 1 ? grid - 1 - i : i;
  if (kcu_emu_order > 1) {
    uint64_t s = kcu_emu_order * 0x9e3779b97f4a7c15ull;
    for (unsigned i = grid - 1; i > 0; i--) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      unsigned j = (unsigned)(s % (i + 1));
      unsigned t = order[i];
      order[i] = order[j], order[j] = t;
    }
  }
  kcu_emu_body = [&]() { kernel(args...); };
  for (unsigned b : order) {
    blockIdx = {b % grid2.x, b / grid2.x, 0};
    kcu_emu_block(block);
  }
  kcu_emu_launches++;
  kcu_emu_blocks += grid;
}

template <class K, class... A> void kcu_emu_launch(unsigned grid, unsigned block, K kernel, A... args) {
  kcu_emu_launch(dim3(grid, 1), block, kernel, args...);
}

#endif
