/* runtime/cuda/rt_cuda_attn_tile.h -- what the two tensor-core attention files
 * (rt_cuda_attn_tc.cu: WMMA; rt_cuda_attn_mma.cu: mma.sync) share: copying a
 * tile of rows of an fp32 (or, mma.sync's, a bf16) [T, HD] matrix into shared
 * memory as bf16, at once (rt_attn_tile_load) or in two halves with the loads
 * in flight between them (RtAttnTileRegs).  A bf16 source is copied as it is,
 * an fp32 one rounded to nearest even: a bf16 source holding the rounded fp32
 * values gives the same tile.  The source's rows are ld elements apart: HD for
 * a head-major [B, H, T, HD] tensor, H HD for a token-major [B, T, H HD] one
 * (IR_SDPA_*: a multiple of HD, so rows stay 16-byte aligned). */
#ifndef RT_CUDA_ATTN_TILE_H
#define RT_CUDA_ATTN_TILE_H

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* f(std::integral_constant<int, HD>()) for the head dimensions the tensor-core
 * kernels are instantiated for (rt_cuda_attn_stored_ok's: 16 to 128 in steps of
 * 16), else other(): the one switch from a run-time hd to a kernel template. */
template <class F, class G> static int rt_attn_by_hd(int64_t hd, F f, G other) {
  switch (hd) {
  case 16: return f(std::integral_constant<int, 16>());
  case 32: return f(std::integral_constant<int, 32>());
  case 48: return f(std::integral_constant<int, 48>());
  case 64: return f(std::integral_constant<int, 64>());
  case 80: return f(std::integral_constant<int, 80>());
  case 96: return f(std::integral_constant<int, 96>());
  case 112: return f(std::integral_constant<int, 112>());
  case 128: return f(std::integral_constant<int, 128>());
  default: return other();
  }
}

/* Element offset of row t of channel ch (a head, or a dq|dk|dv channel) in
 * batch b of a tensor of C channels: head-major [B, C, T, hd], or (tokens)
 * token-major [B, T, C hd]; rt_attn_ld its row stride. */
static __host__ __device__ __forceinline__ int64_t rt_attn_row(bool tokens, int64_t b,
                                                               int64_t ch, int64_t C, int64_t t,
                                                               int64_t T, int hd) {
  return (tokens ? (b * T + t) * C + ch : (b * C + ch) * T + t) * hd;
}
static __host__ __device__ __forceinline__ int rt_attn_ld(bool tokens, int64_t C, int hd) {
  return tokens ? (int)C * hd : hd;
}

/* Element offset of row 0 of operand j's (0 q: query head h; 1 k, 2 v: kv
 * head h) head in batch b, and (rt_attn_in_ld) the operands' row stride:
 * head-major [B, H or KV, T, hd], or (packed: RT_CUDA_ATTN_QKV_TOKENS) the
 * token-major [B, T, H + 2 KV, hd] whose k heads follow q's and v's k's,
 * each operand's pointer at its start. */
static __host__ __device__ __forceinline__ int64_t rt_attn_in(bool packed, int j, int64_t b,
                                                              int64_t h, int64_t H, int64_t KV,
                                                              int64_t T, int hd) {
  return packed ? rt_attn_row(true, b, (j ? H + (j - 1) * KV : 0) + h, H + 2 * KV, 0, T, hd)
                : rt_attn_row(false, b, h, j ? KV : H, 0, T, hd);
}
static __host__ __device__ __forceinline__ int rt_attn_in_ld(bool packed, int64_t H, int64_t KV,
                                                             int hd) {
  return rt_attn_ld(packed, H + 2 * KV, hd);
}

/* Element groups of row r0 + r, columns [c, c + 4) of an fp32 (c + 8 of a
 * bf16) [T, HD] matrix of row stride ld, zeros past row T; vec: src 16-byte
 * aligned (then every group is, HD % 8 == 0 and ld a multiple of HD). */
template <int HD>
static __device__ __forceinline__ float4 rt_attn_ld4(const float *src, bool vec, int r0, int r,
                                                     int c, int T, int ld) {
  if (r0 + r >= T) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float *p = src + (int64_t)(r0 + r) * ld + c;
  return vec ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
}
template <int HD>
static __device__ __forceinline__ int4 rt_attn_ld8(const __nv_bfloat16 *src, bool vec, int r0,
                                                   int r, int c, int T, int ld) {
  int4 x = make_int4(0, 0, 0, 0);
  if (r0 + r < T) {
    const __nv_bfloat16 *p = src + (int64_t)(r0 + r) * ld + c;
    if (vec) x = *(const int4 *)p;
    else memcpy(&x, p, sizeof x);
  }
  return x;
}

/* Rows [r0, r0 + ROWS) of a [T, HD] fp32 matrix (row stride ld) into a bf16 tile of row
 * stride HD + 8 (rows >= T are zeros; the 8 pad columns are not written).
 * All THREADS threads of the block take part; the caller synchronises.
 * UNROLL: 0, the loop as the compiler unrolls it; else at most UNROLL
 * iterations (loads in flight) at once, for a kernel with no registers to
 * spare. */
template <int HD, int ROWS, int THREADS, int UNROLL = 0>
static __device__ __forceinline__ void rt_attn_tile_load(__nv_bfloat16 *dst, const float *src,
                                                         int r0, int T, int ld = HD) {
  constexpr int LDH = HD + 8, V = HD / 4;
  if (((uintptr_t)src & 15) == 0) { /* every row is 16-byte aligned (HD % 4 == 0) */
    auto one = [&](int e) {
      const int r = e / V, c = (e % V) * 4;
      const float4 x = rt_attn_ld4<HD>(src, true, r0, r, c, T, ld);
      __nv_bfloat162 *d = (__nv_bfloat162 *)(dst + r * LDH + c);
      d[0] = __floats2bfloat162_rn(x.x, x.y);
      d[1] = __floats2bfloat162_rn(x.z, x.w);
    };
    if constexpr (UNROLL > 0) {
#pragma unroll(UNROLL)
      for (int e = threadIdx.x; e < ROWS * V; e += THREADS) one(e);
    } else {
      for (int e = threadIdx.x; e < ROWS * V; e += THREADS) one(e);
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * HD; e += THREADS) {
      const int r = e / HD, c = e % HD;
      dst[r * LDH + c] = __float2bfloat16_rn(r0 + r < T ? src[(int64_t)(r0 + r) * ld + c] : 0.0f);
    }
  }
}

/* The same from a bf16 [T, HD] matrix (HD % 8 == 0): 16-byte copies. */
template <int HD, int ROWS, int THREADS, int UNROLL = 0>
static __device__ __forceinline__ void rt_attn_tile_load_bf16(__nv_bfloat16 *dst,
                                                              const __nv_bfloat16 *src, int r0,
                                                              int T, int ld = HD) {
  constexpr int LDH = HD + 8, G = HD / 8;
  const bool vec = ((uintptr_t)src & 15) == 0; /* block-uniform */
  auto one = [&](int e) {
    const int r = e / G, c = (e % G) * 8;
    *(int4 *)(dst + r * LDH + c) = rt_attn_ld8<HD>(src, vec, r0, r, c, T, ld);
  };
  if constexpr (UNROLL > 0) {
#pragma unroll(UNROLL)
    for (int e = threadIdx.x; e < ROWS * G; e += THREADS) one(e);
  } else {
    for (int e = threadIdx.x; e < ROWS * G; e += THREADS) one(e);
  }
}

/* Either, as b16 says. */
template <int HD, int ROWS, int THREADS, int UNROLL = 0>
static __device__ __forceinline__ void rt_attn_tile_load(__nv_bfloat16 *dst, const void *src,
                                                         bool b16, int r0, int T, int ld = HD) {
  if (b16)
    rt_attn_tile_load_bf16<HD, ROWS, THREADS, UNROLL>(dst, (const __nv_bfloat16 *)src, r0, T, ld);
  else
    rt_attn_tile_load<HD, ROWS, THREADS, UNROLL>(dst, (const float *)src, r0, T, ld);
}

/* The same copy split at the registers, so that a kernel can issue the next
 * streamed tile's global loads before the current tile's products and store
 * them to shared memory after (software pipelining: the loads' latency hides
 * behind the tensor-core work instead of stalling the block at the barrier).
 * put() writes the same bf16 values rt_attn_tile_load would, with the same
 * rounding, so a kernel's results do not depend on HOLD.  HOLD costs 4 N
 * registers a thread; where a kernel has none to spare (ptxas would spill),
 * HOLD = false makes load() nothing and put() the whole copy, of the tile it
 * names, UNROLL loads at once.  Every thread of the block calls both, put()
 * with the arguments of the tile's load(). */
template <int HD, int ROWS, int THREADS, bool HOLD, int UNROLL = 0> struct RtAttnTileRegs {
  static constexpr int V = HD / 4, G = HD / 8;                 /* float4, 8 bf16 a row */
  static constexpr int N = (ROWS * V + THREADS - 1) / THREADS; /* float4 a thread */
  static constexpr int NB = (ROWS * G + THREADS - 1) / THREADS; /* bf16 source: 16 B each */
  float4 x[HOLD ? N : 1]; /* bf16 source: x[0, NB) hold its bytes */

  /* rows [r0, r0 + ROWS) of src (bf16 where b16; rows >= T as zeros) into x */
  __device__ __forceinline__ void load(const void *src, bool b16, int r0, int T, int ld = HD) {
    if constexpr (HOLD) {
      const bool vec = ((uintptr_t)src & 15) == 0; /* block-uniform */
      if (b16) {
#pragma unroll
        for (int i = 0; i < NB; i++) {
          const int e = (int)threadIdx.x + i * THREADS, r = e / G, c = (e % G) * 8;
          int4 v = make_int4(0, 0, 0, 0);
          if (e < ROWS * G) v = rt_attn_ld8<HD>((const __nv_bfloat16 *)src, vec, r0, r, c, T, ld);
          x[i] = make_float4(__int_as_float(v.x), __int_as_float(v.y), __int_as_float(v.z),
                             __int_as_float(v.w));
        }
        return;
      }
#pragma unroll
      for (int i = 0; i < N; i++) {
        const int e = (int)threadIdx.x + i * THREADS, r = e / V, c = (e % V) * 4;
        x[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (e < ROWS * V) x[i] = rt_attn_ld4<HD>((const float *)src, vec, r0, r, c, T, ld);
      }
    }
  }
  /* those rows into the bf16 tile dst of row stride HD + 8 (pad columns not written) */
  __device__ __forceinline__ void put(__nv_bfloat16 *dst, const void *src, bool b16, int r0,
                                      int T, int ld = HD) const {
    if constexpr (HOLD) {
      if (b16) {
#pragma unroll
        for (int i = 0; i < NB; i++) {
          const int e = (int)threadIdx.x + i * THREADS, r = e / G, c = (e % G) * 8;
          if (e < ROWS * G)
            *(int4 *)(dst + r * (HD + 8) + c) =
                make_int4(__float_as_int(x[i].x), __float_as_int(x[i].y),
                          __float_as_int(x[i].z), __float_as_int(x[i].w));
        }
        return;
      }
#pragma unroll
      for (int i = 0; i < N; i++) {
        const int e = (int)threadIdx.x + i * THREADS, r = e / V, c = (e % V) * 4;
        if (e < ROWS * V) {
          __nv_bfloat162 *d = (__nv_bfloat162 *)(dst + r * (HD + 8) + c);
          d[0] = __floats2bfloat162_rn(x[i].x, x[i].y);
          d[1] = __floats2bfloat162_rn(x[i].z, x[i].w);
        }
      }
    } else {
      rt_attn_tile_load<HD, ROWS, THREADS, UNROLL>(dst, src, b16, r0, T, ld);
    }
  }
};

#endif
