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
 * Threads: OpenBLAS keeps its own thread pool.  Before each GEMM, rt_gemm gives it
 * rt_pool_threads() threads (openblas_set_num_threads, called again only when the
 * pool size changed), so the process uses one compute-thread budget: rt_pool for
 * the runtime's loops, OpenBLAS for GEMMs, one after the other.  Never call these
 * functions from inside rt_parallel_for (nested pools oversubscribe the cores).
 * After a GEMM, OpenBLAS's threads spin for a while before sleeping (its
 * OPENBLAS_THREAD_TIMEOUT, 2^n cycles, environment only); setting it low keeps
 * them from competing with the rt_pool loop that follows.
 * Results do not depend on rt_pool's size as long as OpenBLAS splits the work over
 * M and N only, which it does for sgemm (tests/runtime/test_gemm.c checks it). */
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
