/* tests/cuda/emu/cuda_bf16.h -- bfloat16 for the CPU emulation of CUDA: the
 * type, its pair, and the conversions runtime/cuda uses.  Conversions to bf16
 * round to nearest even (what the _rn intrinsics do; a NaN stays a quiet NaN
 * of the same sign); bf16 to float is exact. */
#ifndef KCU_EMU_CUDA_BF16_H
#define KCU_EMU_CUDA_BF16_H

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t __x; /* the upper 16 bits of the float it stands for */
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep the sign, make it quiet */
    r.__x = (uint16_t)((u >> 16) | 0x0040u);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; overflow rounds to infinity */
  r.__x = (uint16_t)(u >> 16);
  return r;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.__x << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }

#endif
