/* runtime/rt_gemm.c -- matmul and matmul_ta through cblas_sgemm; see rt_gemm.h. */
#include "runtime/rt_gemm.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"

/* The thread count last given to OpenBLAS (0: never); set under blas_mu so that
 * two ranks-as-threads never resize OpenBLAS's pool at the same time. */
static atomic_int blas_threads;
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;

static void sync_blas_threads(void) {
  int want = rt_pool_threads();
  if (atomic_load(&blas_threads) == want) return;
  pthread_mutex_lock(&blas_mu);
  if (atomic_load(&blas_threads) != want) {
    openblas_set_num_threads(want);
    atomic_store(&blas_threads, want);
  }
  pthread_mutex_unlock(&blas_mu);
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
  sync_blas_threads();
  int tb = (flags & RT_MM_TRANSPOSE_B) != 0, bb = (flags & RT_MM_B_BATCHED) != 0;
  float beta = (flags & RT_MM_ACCUMULATE) ? 1.0f : 0.0f;
  enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  int lda = (int)(ta ? m : k), ldb = (int)(tb ? k : n);
  /* A shared b and a stored [batch*m, k]: one GEMM with the batch folded into M. */
  if (!ta && !bb && batch > 1 && batch <= INT_MAX / m) {
    cblas_sgemm(CblasRowMajor, opa, opb, (int)(batch * m), (int)n, (int)k, 1.0f, a, lda, b,
                ldb, beta, out, (int)n);
    return RT_OK;
  }
  for (int64_t i = 0; i < batch; i++)
    cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, 1.0f, a + i * m * k, lda,
                b + (bb ? i * k * n : 0), ldb, beta, out + i * m * n, (int)n);
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
