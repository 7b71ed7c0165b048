/* tests/cuda/emu/kcu_emu_kernel.h -- the device side of the emulated CUDA
 * runtime (cuda_runtime.h includes it under C++): what a runtime/cuda kernel
 * uses, and the launch that tests/cuda/emu_rewrite.py writes for `K<<<grid,
 * block, smem, stream>>>(args)`:  kcu_emu_launch(K, grid, block, smem, stream)(args).
 *
 * A sibling of tests/cuda/kcu_emu.h (generated kernels, cuda/split_emu), with
 * the same execution model and these additions: 3-D grids and blocks, blocks
 * that are not a multiple of 32 threads (the last warp is partial), dynamic
 * shared memory (`extern __shared__ T name[]` becomes a pointer to it, 128-byte
 * aligned, filled with 0xff before each block: reads of unwritten shared
 * memory show as NaN), shuffles with a width, launches enqueued on streams (a
 * captured graph replays them), launch-shape checks, and all state per host
 * thread (ranks as threads each run their own kernels).
 *
 * Execution: a launch runs its blocks one after another (grid x fastest), each
 * as one fiber per thread on the calling host thread (x86-64: a register swap,
 * elsewhere ucontext), warp by warp: the fibers of a warp take turns, each
 * running until it reaches a barrier -- __syncwarp and the shuffles (every
 * thread of its warp), __syncthreads (every thread of the block) -- and a
 * warp's barrier is released as its last thread arrives; when every warp is
 * at the block barrier, that is released.  Anything else aborts the process
 * with the kernel's block (a __syncthreads some threads never reach, a
 * shuffle with part of a warp, a warp that has exited in part).  So a race
 * between warps (a missing __syncthreads) may go unseen: warps run in order
 * (KCU_EMU_ORDER=1 reverses it).  The masks of __syncwarp and the shuffles
 * are not checked beyond that: the whole warp takes part.  Static `__shared__` variables are
 * function-level `static thread_local`: one block runs at a time per thread.
 * Atomics and fences are plain code (a block's fibers never run at once).
 * Arithmetic is the host's IEEE single precision (build with
 * -ffp-contract=off); the fast-math intrinsics (__expf, ...) are the exact
 * functions, so they are more accurate here than on a GPU. */
#ifndef KCU_EMU_KERNEL_H
#define KCU_EMU_KERNEL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __constant__ static
#define __align__(n) alignas(n)
#define __restrict__ __restrict

/* ---- vector types ---- */
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

/* ---- the executing thread, per host thread.  All four are uint3 (CUDA's
 * blockDim and gridDim are dim3, which converts from uint3): a trivial type,
 * constant-initialised, is read without a TLS wrapper call. ---- */
inline thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

/* ---- arithmetic ---- */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float a) { return std::exp(a); }
inline float __exp2f(float a) { return std::exp2(a); }
inline float __logf(float a) { return std::log(a); }
inline float __log2f(float a) { return std::log2(a); }
inline float __sinf(float a) { return std::sin(a); }
inline float __cosf(float a) { return std::cos(a); }
inline float __tanhf(float a) { return std::tanh(a); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline float __ll2float_rn(long long v) { return (float)v; }
inline float __int2float_rn(int v) { return (float)v; }
/* the bits of f as a To (same size) */
template <class To, class From> inline To kcu_bits(From f) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast between sizes");
  To t;
  memcpy(&t, &f, sizeof t);
  return t;
}
inline int __float_as_int(float f) { return kcu_bits<int>(f); }
inline float __int_as_float(int i) { return kcu_bits<float>(i); }
inline unsigned __float_as_uint(float f) { return kcu_bits<unsigned>(f); }
inline float __uint_as_float(unsigned i) { return kcu_bits<float>(i); }
/* CUDA's device min and max, for any mix of arithmetic types */
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value &&
                                                     std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) {
  return b < a ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value &&
                                                     std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}

template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
template <class T> inline void __stcs(T *p, T v) { *p = v; }

/* ---- fences and atomics: a block's fibers never run at once ---- */
inline void __threadfence() {}
inline void __threadfence_block() {}
template <class T> inline T atomicAdd(T *p, T v) {
  T o = *p;
  *p = o + v;
  return o;
}
template <class T> inline T atomicSub(T *p, T v) {
  T o = *p;
  *p = o - v;
  return o;
}
template <class T> inline T atomicExch(T *p, T v) {
  T o = *p;
  *p = v;
  return o;
}
template <class T> inline T atomicMax(T *p, T v) {
  T o = *p;
  if (o < v) *p = v;
  return o;
}
template <class T> inline T atomicMin(T *p, T v) {
  T o = *p;
  if (v < o) *p = v;
  return o;
}
template <class T> inline T atomicCAS(T *p, T cmp, T v) {
  T o = *p;
  if (o == cmp) *p = v;
  return o;
}

/* ---- barriers (emu_runtime.cpp) ---- */
enum { KCU_EMU_RUN, KCU_EMU_BLOCK, KCU_EMU_WARP, KCU_EMU_DONE };
/* The calling fiber waits at a barrier of that kind. */
void kcu_emu_wait(int kind);
/* The shuffles' exchange slots, one per thread of the block. */
uint64_t *kcu_emu_xchg();

inline unsigned kcu_emu_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

inline void __syncthreads() { kcu_emu_wait(KCU_EMU_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { kcu_emu_wait(KCU_EMU_WARP); }

/* Every thread of the warp offers v and reads the value of lane src(lane)
 * (its own where src is -1). */
template <class T, class F> inline T kcu_emu_shfl(T v, F src) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle of a wide type");
  const unsigned t = kcu_emu_tid(), lane = t & 31u, base = t & ~31u;
  const unsigned n = blockDim.x * blockDim.y * blockDim.z;
  uint64_t *x = kcu_emu_xchg(), b = 0;
  memcpy(&b, &v, sizeof v);
  x[t] = b;
  kcu_emu_wait(KCU_EMU_WARP);
  int s = src(lane);
  uint64_t o = s >= 0 && base + (unsigned)s < n ? x[base + (unsigned)s] : b;
  kcu_emu_wait(KCU_EMU_WARP); /* everyone has read before anyone writes again */
  T r;
  memcpy(&r, &o, sizeof r);
  return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  return kcu_emu_shfl(v, [=](unsigned l) {
    return (int)((l & ~(unsigned)(width - 1)) + ((unsigned)src & (unsigned)(width - 1)));
  });
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
  return kcu_emu_shfl(v, [=](unsigned l) {
    unsigned t = l ^ (unsigned)m;
    return t >= (l & ~(unsigned)(width - 1)) + (unsigned)width ? -1 : (int)t;
  });
}
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
  return kcu_emu_shfl(v, [=](unsigned l) {
    unsigned t = l + d;
    return t >= (l & ~(unsigned)(width - 1)) + (unsigned)width ? -1 : (int)t;
  });
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  return kcu_emu_shfl(v, [=](unsigned l) {
    return l < (l & ~(unsigned)(width - 1)) + d ? -1 : (int)(l - d);
  });
}

/* ---- launches ---- */

/* The launch's dynamic shared memory (what `extern __shared__` names). */
void *kcu_emu_dyn_smem();

/* Checks the shape and the dynamic shared memory of a launch of kernel f (0,
 * or the error, then cudaGetLastError's); enqueues body on the stream, body
 * running every block of the launch (emu_runtime.cpp). */
int kcu_emu_launch_body(const void *f, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                        std::function<void()> body);

/* kcu_emu_launch(K, grid, block[, smem[, stream]])(args...): the arguments
 * are converted to K's parameter types and copied into the launch (a graph
 * replays it with the same values). */
template <class... P> struct KcuEmuLaunch {
  void (*k)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t s;
  template <class... A> void operator()(A &&...args) const {
    static_assert(sizeof...(A) == sizeof...(P), "a kernel launch with the wrong argument count");
    std::tuple<std::decay_t<P>...> t(std::forward<A>(args)...);
    void (*kk)(P...) = k;
    kcu_emu_launch_body((const void *)k, grid, block, smem, s,
                        [kk, t]() { std::apply(kk, t); });
  }
};
template <class... P>
inline KcuEmuLaunch<P...> kcu_emu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem = 0,
                                         cudaStream_t s = 0) {
  return KcuEmuLaunch<P...>{k, grid, block, smem, s};
}

#endif
