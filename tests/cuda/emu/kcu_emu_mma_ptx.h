/* tests/cuda/emu/kcu_emu_mma_ptx.h -- the CPU emulation of
 * runtime/cuda/rt_cuda_mma.h's primitives (PTX mma.sync.m16n8k16 with bf16
 * operands and fp32 accumulators, ldmatrix x4 and x4.trans), with the register
 * layout that header states (the PTX ISA's): lane L holds exactly the elements
 * the hardware gives it, so a kernel that assumes a wrong layout computes
 * wrong results here too.
 *
 * Each is a warp collective: every lane puts its operands (or its row
 * address) in the block's staging slot for its thread, the warp meets
 * (__syncwarp), each lane reads what it receives from the other lanes' slots,
 * and the warp meets again before any slot is reused.  A lane missing from the
 * call fails the emulation's barrier check.
 *
 * rt_mma16816: c[i] + sum over k = 0..15 of A(row, k) B(k, col), in increasing
 * k, in fp32 (a product of two bf16 is exact in fp32).  Tensor cores add in
 * another order: results agree with a GPU to rounding. */
#ifndef KCU_EMU_MMA_PTX_H
#define KCU_EMU_MMA_PTX_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct KcuMmaSlot {
  uint32_t a[4], b[2];
  const unsigned char *p;
};

/* One slot per thread of the block (blocks have at most 1024 threads). */
inline KcuMmaSlot *kcu_mma_slots() {
  static thread_local KcuMmaSlot slots[1024];
  return slots;
}

/* the bf16 in half h (0: low) of u, as a float */
inline float kcu_mma_half(uint32_t u, int h) {
  __nv_bfloat16 b;
  b.__x = (uint16_t)(h ? u >> 16 : u & 0xffffu);
  return __bfloat162float(b);
}

inline void rt_mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  KcuMmaSlot *s = kcu_mma_slots();
  const unsigned tid = kcu_emu_tid(), w = tid & ~31u, lane = tid & 31u;
  memcpy(s[tid].a, a, sizeof s[tid].a);
  memcpy(s[tid].b, b, sizeof s[tid].b);
  __syncwarp();
  const int g = (int)(lane >> 2), t = (int)(lane & 3);
  float out[4];
  for (int i = 0; i < 4; i++) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; k++) {
      /* A(row, k): lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8) */
      const KcuMmaSlot &sa = s[w + (unsigned)((row & 7) * 4 + (k & 7) / 2)];
      const float av = kcu_mma_half(sa.a[(row >= 8) + 2 * (k >= 8)], k & 1);
      /* B(k, col): lane col * 4 + (k % 8) / 2, register k >= 8 */
      const KcuMmaSlot &sb = s[w + (unsigned)(col * 4 + (k & 7) / 2)];
      const float bv = kcu_mma_half(sb.b[k >= 8], k & 1);
      acc += av * bv;
    }
    out[i] = acc;
  }
  __syncwarp();
  memcpy(c, out, sizeof out);
}

/* ldmatrix x4 (trans: transposed); row: this lane's row address */
inline void kcu_emu_ldsm4(uint32_t r[4], const void *row, bool trans) {
  KcuMmaSlot *s = kcu_mma_slots();
  const unsigned tid = kcu_emu_tid(), w = tid & ~31u, lane = tid & 31u;
  if ((uintptr_t)row & 15) { /* the hardware's rule: each row 16-byte aligned */
    fprintf(stderr, "kcu_emu: ldmatrix row address %p of thread %u is not 16-byte aligned\n",
            row, tid);
    abort();
  }
  s[tid].p = (const unsigned char *)row;
  __syncwarp();
  const int g = (int)(lane >> 2), t = (int)(lane & 3);
  for (int i = 0; i < 4; i++) {
    uint16_t lo, hi;
    if (!trans) { /* row g, columns 2t, 2t + 1 */
      const unsigned char *p = s[w + (unsigned)(8 * i + g)].p;
      memcpy(&lo, p + 4 * t, 2);
      memcpy(&hi, p + 4 * t + 2, 2);
    } else { /* column g, rows 2t, 2t + 1 */
      memcpy(&lo, s[w + (unsigned)(8 * i + 2 * t)].p + 2 * g, 2);
      memcpy(&hi, s[w + (unsigned)(8 * i + 2 * t + 1)].p + 2 * g, 2);
    }
    r[i] = (uint32_t)lo | (uint32_t)hi << 16;
  }
  __syncwarp();
}
inline void rt_ldsm4(uint32_t r[4], const void *row) { kcu_emu_ldsm4(r, row, false); }
inline void rt_ldsm4_t(uint32_t r[4], const void *row) { kcu_emu_ldsm4(r, row, true); }
/* ex2.approx.ftz.f32: 2^x, results below 2^-126 flushed to zero (the SFU's own
 * rounding is not modelled: exp2f's) */
inline float rt_ex2(float x) {
  const float y = exp2f(x);
  return y < 0x1p-126f ? 0.0f : y;
}

#endif
