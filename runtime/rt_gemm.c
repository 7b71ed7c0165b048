/* runtime/rt_gemm.c -- matmul and matmul_ta through cblas_sgemm; see rt_gemm.h. */
#include "runtime/rt_gemm.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"

/* OpenBLAS runs single-threaded (set once, under blas_mu: ranks that are
 * threads may get here together); rt_pool runs the blocks. */
static atomic_int blas_single;
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;

static void blas_single_thread(void) {
  if (atomic_load(&blas_single)) return;
  pthread_mutex_lock(&blas_mu);
  if (!atomic_load(&blas_single)) {
    openblas_set_num_threads(1);
    atomic_store(&blas_single, 1);
  }
  pthread_mutex_unlock(&blas_mu);
}

/* One row-major GEMM out[m, n] (+)= op(a)[m, k] op(b)[k, n] cut into blocks of
 * rows or of columns (gemm_blocks) whose bounds depend on the shape alone
 * (rt_parallel_for's chunks), each block one single-threaded cblas_sgemm.  A
 * block's result depends on its own shape (OpenBLAS's kernels round the edge
 * tiles of a matrix differently on some CPUs, e.g. its Zen kernels), so fixing
 * the blocks by shape is what makes the result the same for every thread count. */
typedef struct {
  enum CBLAS_TRANSPOSE opa, opb;
  int by_cols;
  int64_t m, k, n;
  const float *a, *b;
  float *out;
  int lda, ldb;
  float beta;
} GemmBlocks;

static void gemm_block(void *ctx, int64_t lo, int64_t hi) {
  const GemmBlocks *g = ctx;
  const float *a = g->a, *b = g->b;
  float *out = g->out;
  int64_t m = g->m, n = g->n;
  if (g->by_cols) { /* columns [lo, hi) of op(b) and out */
    b += g->opb == CblasTrans ? lo * g->ldb : lo;
    out += lo;
    n = hi - lo;
  } else { /* rows [lo, hi) of op(a) and out */
    a += g->opa == CblasTrans ? lo : lo * g->lda;
    out += lo * g->n;
    m = hi - lo;
  }
  cblas_sgemm(CblasRowMajor, g->opa, g->opb, (int)m, (int)n, (int)g->k, 1.0f, a, g->lda, b,
              g->ldb, g->beta, out, (int)g->n);
}

/* A block does about 1 MFLOP at the least, and a GEMM has at most
 * GEMM_MAX_BLOCKS: every block packs the operand it does not cut again, so few
 * large blocks, cut along the dimension whose block leaves the smaller operand
 * to pack (rows of out: all of op(b), k n floats; columns: all of op(a), m k). */
#define GEMM_BLOCK_FLOPS (1 << 20)
#define GEMM_MAX_BLOCKS 8

static void gemm_blocks(GemmBlocks *g) {
  double flops = 2.0 * (double)g->m * (double)g->k * (double)g->n;
  int64_t blocks = (int64_t)(flops / GEMM_BLOCK_FLOPS);
  blocks = blocks < 1 ? 1 : blocks > GEMM_MAX_BLOCKS ? GEMM_MAX_BLOCKS : blocks;
  g->by_cols = g->m * g->k < g->k * g->n;
  int64_t dim = g->by_cols ? g->n : g->m;
  rt_parallel_for(dim, dim / blocks > 0 ? dim / blocks : 1, gemm_block, g);
}

static int gemm(const char *op, int ta, float *out, const float *a, const float *b,
                int64_t batch, int64_t m, int64_t k, int64_t n, int flags) {
  if (!out || !a || !b)
    return rt_fail("%s: NULL %s pointer", op, !out ? "output" : !a ? "a" : "b");
  if (batch < 1 || m < 1 || k < 1 || n < 1)
    return rt_fail("%s: dimensions must be >= 1, got batch %lld, m %lld, k %lld, n %lld", op,
                   (long long)batch, (long long)m, (long long)k, (long long)n);
  if (flags & ~(RT_MM_TRANSPOSE_B | RT_MM_B_BATCHED | RT_MM_ACCUMULATE))
    return rt_fail("%s: unknown flags 0x%x", op, (unsigned)flags);
  if (m > INT_MAX || k > INT_MAX || n > INT_MAX)
    return rt_fail("%s: m %lld, k %lld, n %lld: each must be below 2^31 for CBLAS", op,
                   (long long)m, (long long)k, (long long)n);
  blas_single_thread();
  int tb = (flags & RT_MM_TRANSPOSE_B) != 0, bb = (flags & RT_MM_B_BATCHED) != 0;
  GemmBlocks g = {ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, 0, m, k, n,
                  a, b, out, (int)(ta ? m : k), (int)(tb ? k : n),
                  (flags & RT_MM_ACCUMULATE) ? 1.0f : 0.0f};
  /* A shared b and a stored [batch*m, k]: one GEMM with the batch folded into M. */
  if (!ta && !bb && batch > 1 && batch <= INT_MAX / m) {
    g.m = batch * m;
    gemm_blocks(&g);
    return RT_OK;
  }
  for (int64_t i = 0; i < batch; i++) {
    g.a = a + i * m * k;
    g.b = b + (bb ? i * k * n : 0);
    g.out = out + i * m * n;
    gemm_blocks(&g);
  }
  return RT_OK;
}

int rt_matmul(float *out, const float *a, const float *b, int64_t batch, int64_t m,
              int64_t k, int64_t n, int flags) {
  return gemm("matmul", 0, out, a, b, batch, m, k, n, flags);
}

int rt_matmul_ta(float *out, const float *a, const float *b, int64_t batch, int64_t m,
                 int64_t k, int64_t n, int flags) {
  return gemm("matmul_ta", 1, out, a, b, batch, m, k, n, flags);
}
