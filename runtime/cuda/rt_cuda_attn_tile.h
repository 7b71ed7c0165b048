/* runtime/cuda/rt_cuda_attn_tile.h -- what the two tensor-core attention files
 * (rt_cuda_attn_tc.cu: WMMA; rt_cuda_attn_mma.cu: mma.sync) share: copying a
 * tile of rows of an fp32 [T, HD] matrix into shared memory as bf16. */
#ifndef RT_CUDA_ATTN_TILE_H
#define RT_CUDA_ATTN_TILE_H

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* Rows [r0, r0 + ROWS) of a [T, HD] fp32 matrix into a bf16 tile of row
 * stride HD + 8 (rows >= T are zeros; the 8 pad columns are not written).
 * All THREADS threads of the block take part; the caller synchronises. */
template <int HD, int ROWS, int THREADS>
static __device__ __forceinline__ void rt_attn_tile_load(__nv_bfloat16 *dst, const float *src,
                                                         int r0, int T) {
  constexpr int LDH = HD + 8, V = HD / 4;
  if (((uintptr_t)src & 15) == 0) { /* every row is 16-byte aligned (HD % 4 == 0) */
    for (int e = threadIdx.x; e < ROWS * V; e += THREADS) {
      const int r = e / V, c = (e % V) * 4;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r0 + r < T) x = *(const float4 *)(src + (int64_t)(r0 + r) * HD + c);
      __nv_bfloat162 *d = (__nv_bfloat162 *)(dst + r * LDH + c);
      d[0] = __floats2bfloat162_rn(x.x, x.y);
      d[1] = __floats2bfloat162_rn(x.z, x.w);
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * HD; e += THREADS) {
      const int r = e / HD, c = e % HD;
      dst[r * LDH + c] = __float2bfloat16_rn(r0 + r < T ? src[(int64_t)(r0 + r) * HD + c] : 0.0f);
    }
  }
}

#endif
