/* runtime/rt_gemm.h -- float32 matrix products for the IR ops matmul and matmul_ta,
 * through OpenBLAS (cblas_sgemm, row-major).
 *
 * Layouts (dense row-major, last dimension fastest; `batch` is the product of the
 * leading dimensions of a, 1 for rank-2 operands):
 *   rt_matmul:    a [batch, m, k]                       (ir: matmul)
 *   rt_matmul_ta: a [batch, k, m], read transposed      (ir: matmul_ta)
 *   b             [k, n], or [n, k] with RT_MM_TRANSPOSE_B;
 *                 shared by every batch index (a rank-2 b), or with RT_MM_B_BATCHED
 *                 one such matrix per batch index: [batch, k, n] / [batch, n, k]
 *   out           [batch, m, n]:  out[i] = A[i] @ B[i]  (A[i] = a[i] or a[i]^T,
 *                 B[i] = b, b[i], or their transposes)
 * With RT_MM_ACCUMULATE, out += the product (gradient accumulation); else out is
 * overwritten (never read, so it may hold garbage).  out must not overlap a or b.
 *
 * Execution: rt_matmul with a shared b is one GEMM of (batch*m) x k by k x n (a's
 * batch dimensions folded into M, while batch*m < 2^31); every other case is one
 * GEMM per batch index.  CBLAS takes int dimensions: m, k and n must each be below
 * 2^31 (RT_ERR otherwise).
 *
 * Threads: OpenBLAS runs single-threaded; each GEMM is cut into at most 8 blocks
 * of rows or columns (whichever leaves the smaller operand to pack again per
 * block), ~1 MFLOP each at the least, whose bounds depend on the shape alone,
 * run on rt_pool (rt_parallel_for), one cblas_sgemm a block.  Results are therefore the same
 * bits for every pool size (tests/runtime/test_gemm.c checks it): OpenBLAS's own
 * threading is not, on CPUs whose kernels round a matrix's edge tiles
 * differently (its Zen kernels: a row or column split changes ~6% of sgemm's
 * results by an ulp).  Called from inside rt_parallel_for, a GEMM runs its
 * blocks on the calling thread (rt_pool.h's nesting rule): the same bits. */
#ifndef PARC_RT_GEMM_H
#define PARC_RT_GEMM_H

#include <stdint.h>

enum {
  RT_MM_TRANSPOSE_B = 1,  /* b holds [.., n, k] (ir: transpose_b) */
  RT_MM_B_BATCHED = 2,    /* b has a's batch dimensions (ir: rank(b) > 2) */
  RT_MM_ACCUMULATE = 4,   /* out += product */
};

/* out[batch, m, n] (+)= a[batch, m, k] @ B.  Returns RT_OK, or RT_ERR on a NULL
 * pointer, a dimension < 1, unknown flags, or a dimension too large for CBLAS. */
int rt_matmul(float *out, const float *a, const float *b, int64_t batch, int64_t m,
              int64_t k, int64_t n, int flags);

/* out[batch, m, n] (+)= a[batch, k, m]^T @ B.  Errors as rt_matmul. */
int rt_matmul_ta(float *out, const float *a, const float *b, int64_t batch, int64_t m,
                 int64_t k, int64_t n, int flags);

#endif
