/* runtime/cuda/rt_cuda_mma.h -- warp-level bf16 tensor-core products with a
 * known register layout (PTX mma.sync.m16n8k16 and ldmatrix), for kernels that
 * keep a product's accumulators in registers and feed them back as operands
 * (rt_cuda_attn_mma.cu).  WMMA leaves the fragment layout unspecified, so a
 * WMMA kernel must pass every score tile through shared memory; these do not.
 *
 * Layout (PTX ISA, "Matrix fragments for mma.m16n8k16", .bf16 operands, .f32
 * accumulators), lane L of the warp, g = L / 4, t = L % 4; each uint32_t holds
 * two bf16, the lower column (or k) index in its low 16 bits:
 *   A, 16 x 16 (rows x k):  a[0] (g, 2t..2t+1)   a[1] (g+8, 2t..2t+1)
 *                           a[2] (g, 2t+8..2t+9) a[3] (g+8, 2t+8..2t+9)
 *   B, 16 x 8 (k x cols):   b[0] (k 2t..2t+1, col g)  b[1] (k 2t+8..2t+9, col g)
 *   C, 16 x 8 (fp32):       c[0], c[1] (g, 2t), (g, 2t+1); c[2], c[3] (g+8, 2t), (g+8, 2t+1)
 * So the C tiles of columns [0, 8) and [8, 16), converted to bf16 pairs, are
 * the A operand of those 16 columns as k: a = {pk(c0[0], c0[1]), pk(c0[2],
 * c0[3]), pk(c1[0], c1[1]), pk(c1[2], c1[3])} (rt_mma_c2a).
 *
 * ldmatrix (x4): lane L names the address of row L % 8 of 8 x 8 bf16 matrix
 * L / 8 (a row's 16 bytes contiguous and 16-byte aligned, in shared memory);
 * r[i] receives matrix i's row g, columns 2t, 2t+1 (rt_ldsm4), or with .trans
 * its column g, rows 2t, 2t+1 (rt_ldsm4_t).  The lane addresses the helpers
 * below compute make the usual operands of a row-major bf16 tile p of row
 * stride ld (elements):
 *   rt_ldsm_a(a, p, ld)     A = the 16 x 16 tile at p
 *   rt_ldsm_bt(b, p, ld)    B = (the 16 x 16 tile at p)^T: b[0..1] the B of its
 *                           rows [0, 8) as columns, b[2..3] of rows [8, 16)
 *                           (S = Q K^T with K's rows at p)
 *   rt_ldsm_b(b, p, ld)     B = the 16 x 16 tile at p (k rows, 16 columns):
 *                           b[0..1] columns [0, 8), b[2..3] columns [8, 16)
 *                           (O = P V with V's rows at p)
 *   rt_ldsm_at(a, p, ld)    A = (the 16 x 16 tile at p)^T (dQ = dS K with
 *                           dS^T's rows, the keys, at p)
 *   rt_ldsm_bk(b, p, ld)    B of 8 columns over k 32: the column block at p
 *                           of 32 k rows; b[0..1] k [0, 16), b[2..3] k [16, 32)
 * Every lane of the warp must call each of these together (converged).
 *
 * The CPU emulation (tests/cuda/emu) supplies the same functions with the same
 * layout from its kcu_emu_mma_ptx.h. */
#ifndef RT_CUDA_MMA_H
#define RT_CUDA_MMA_H

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#ifdef KCU_EMU_CUDA_RUNTIME_H
#include "kcu_emu_mma_ptx.h"
#else

/* c += a b (16 x 8 x 16, bf16 operands, fp32 accumulation) */
static __device__ __forceinline__ void rt_mma16816(float c[4], const uint32_t a[4],
                                                   const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* r[i]: row g, columns 2t, 2t+1 of the matrix whose row L % 8 lane L + 8 i names */
static __device__ __forceinline__ void rt_ldsm4(uint32_t r[4], const void *row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

/* the same, transposed: r[i] holds column g, rows 2t, 2t+1 */
static __device__ __forceinline__ void rt_ldsm4_t(uint32_t r[4], const void *row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

/* 2^x by the special-function unit alone (ex2.approx.ftz: ~2 ulp, a result
 * below 2^-126 flushed to 0; 2^-inf = 0): exp2f's ex2.approx.f32 without the
 * instructions that keep denormal results, which a softmax probability that
 * small does not need */
static __device__ __forceinline__ float rt_ex2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}
#endif /* KCU_EMU_CUDA_RUNTIME_H */

/* two floats as a bf16 pair (lo in the low half) */
static __device__ __forceinline__ uint32_t rt_pk_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

/* A = tile p[16][16] (row-major, row stride ld elements) */
static __device__ __forceinline__ void rt_ldsm_a(uint32_t a[4], const __nv_bfloat16 *p, int ld) {
  const int L = threadIdx.x & 31;
  rt_ldsm4(a, p + (L & 15) * ld + (L >> 4) * 8);
}

/* B = (p[16][16])^T: b[0], b[1] for columns = rows [0, 8) of p, b[2], b[3] for rows [8, 16) */
static __device__ __forceinline__ void rt_ldsm_bt(uint32_t b[4], const __nv_bfloat16 *p, int ld) {
  const int L = threadIdx.x & 31;
  rt_ldsm4(b, p + ((L & 7) + ((L >> 4) << 3)) * ld + ((L >> 3) & 1) * 8);
}

/* B = p[16][16] (k rows): b[0], b[1] for columns [0, 8), b[2], b[3] for [8, 16) */
static __device__ __forceinline__ void rt_ldsm_b(uint32_t b[4], const __nv_bfloat16 *p, int ld) {
  const int L = threadIdx.x & 31;
  rt_ldsm4_t(b, p + ((L & 7) + (((L >> 3) & 1) << 3)) * ld + (L >> 4) * 8);
}

/* A = (p[16][16])^T: row r of A is column r of p */
static __device__ __forceinline__ void rt_ldsm_at(uint32_t a[4], const __nv_bfloat16 *p, int ld) {
  const int L = threadIdx.x & 31;
  rt_ldsm4_t(a, p + ((L & 7) + ((L >> 4) << 3)) * ld + ((L >> 3) & 1) * 8);
}

/* B (k x 8) = p[32][8], two k steps: b[0..1] k rows [0, 16), b[2..3] [16, 32) */
static __device__ __forceinline__ void rt_ldsm_bk(uint32_t b[4], const __nv_bfloat16 *p, int ld) {
  rt_ldsm4_t(b, p + (threadIdx.x & 31) * ld);
}

/* A of 16 k from the C tiles of columns [0, 8) (c0) and [8, 16) (c1) */
static __device__ __forceinline__ void rt_mma_c2a(uint32_t a[4], const float c0[4],
                                                  const float c1[4]) {
  a[0] = rt_pk_bf16(c0[0], c0[1]);
  a[1] = rt_pk_bf16(c0[2], c0[3]);
  a[2] = rt_pk_bf16(c1[0], c1[1]);
  a[3] = rt_pk_bf16(c1[2], c1[3]);
}

#endif
