/* tests/runtime/test_gemm.c -- rt_matmul / rt_matmul_ta against the interpreter's
 * matmul / matmul_ta: every combination of transpose_b, shared or batched b and
 * accumulate, at shapes with 1-sized and odd dimensions and up to rank 4 (relative
 * L2 <= 1e-5; without accumulate the output starts as NaN, which must not leak
 * in); the same bits for 1, 2 and 3 pool threads; argument errors. */
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"
#include "tests/runtime/check.h"
#include "tests/runtime/ref_op.h"

#define TOL 1e-5

typedef struct {
  int rank;            /* of a: 2..4 */
  int64_t lead[2];     /* a's batch dimensions (rank - 2 of them) */
  int64_t m, k, n;
} Case;

static int64_t batch_of(const Case *c) {
  int64_t b = 1;
  for (int d = 0; d < c->rank - 2; d++) b *= c->lead[d];
  return b;
}

/* One case for op (matmul or matmul_ta) with transpose_b tb, b batched bb and
 * accumulate acc. */
static void run_case(TRng *rng, const Case *c, int ta, int tb, int bb, int acc) {
  int64_t batch = batch_of(c), m = c->m, k = c->k, n = c->n;
  int64_t na = batch * m * k, nb = (bb ? batch : 1) * k * n, nc = batch * m * n;
  float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
  float *out = malloc(sizeof(float) * (size_t)nc), *init = malloc(sizeof(float) * (size_t)nc);
  trng_fill(rng, a, na, 1);
  trng_fill(rng, b, nb, 1);
  trng_fill(rng, init, nc, 1);
  if (acc) memcpy(out, init, sizeof(float) * (size_t)nc);
  else memset(out, 0xff, sizeof(float) * (size_t)nc);  /* NaN: must not be read */

  RefArg args[2];
  args[0].dtype = args[1].dtype = IR_F32;
  args[0].f = a, args[1].f = b;
  args[0].rank = c->rank;
  for (int d = 0; d < c->rank - 2; d++) args[0].shape[d] = args[1].shape[d] = c->lead[d];
  args[0].shape[c->rank - 2] = ta ? k : m;
  args[0].shape[c->rank - 1] = ta ? m : k;
  args[1].rank = bb ? c->rank : 2;
  args[1].shape[args[1].rank - 2] = tb ? n : k;
  args[1].shape[args[1].rank - 1] = tb ? k : n;
  RefOut ref;
  char why[256];
  if (ref_op(ta ? IR_OP_MATMUL_TA : IR_OP_MATMUL, args, 2, tb, 0, 0, 0, &ref, why, sizeof why)) {
    check_report(__FILE__, __LINE__, why);
    goto done;
  }
  if (acc)
    for (int64_t e = 0; e < nc; e++) ref.f[e] += init[e];
  int flags = (tb ? RT_MM_TRANSPOSE_B : 0) | (bb ? RT_MM_B_BATCHED : 0) |
              (acc ? RT_MM_ACCUMULATE : 0);
  CHECK_OK(ta ? rt_matmul_ta(out, a, b, batch, m, k, n, flags)
              : rt_matmul(out, a, b, batch, m, k, n, flags));
  double err = rel_l2(out, ref.f, nc);
  if (!(err <= TOL)) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "%s rank %d batch %lld m %lld k %lld n %lld tb %d bb %d acc %d: rel L2 %.3g",
             ta ? "matmul_ta" : "matmul", c->rank, (long long)batch, (long long)m,
             (long long)k, (long long)n, tb, bb, acc, err);
    check_report(__FILE__, __LINE__, msg);
  }
  ref_out_free(&ref);
done:
  free(a), free(b), free(out), free(init);
}

static void test_against_reference(void) {
  static const Case cases[] = {
    {2, {0, 0}, 1, 1, 1},      {2, {0, 0}, 7, 5, 3},       {2, {0, 0}, 1, 33, 17},
    {2, {0, 0}, 65, 1, 9},     {3, {1, 0}, 4, 6, 1},       {3, {3, 0}, 5, 7, 11},
    {3, {2, 0}, 1, 300, 2},    {4, {2, 3}, 3, 4, 5},       {4, {1, 1}, 9, 2, 8},
    {4, {2, 1}, 17, 19, 23},
    /* past rt_gemm's 1 MFLOP a block: cut into row blocks (m k >= k n) and column
     * blocks (m k < k n), uneven ones included */
    {2, {0, 0}, 403, 67, 45},  {2, {0, 0}, 7, 150, 1001}, {3, {2, 0}, 97, 91, 130},
  };
  TRng rng = {0x9e3779b97f4a7c15ull};
  CHECK_OK(rt_pool_init(2));
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int bb = 0; bb < 2; bb++)
          for (int acc = 0; acc < 2; acc++) {
            if (bb && cases[i].rank == 2) continue;  /* a rank-2 b is the shared case */
            run_case(&rng, &cases[i], ta, tb, bb, acc);
          }
}

/* Large enough for OpenBLAS to use its threads. */
static void test_determinism(void) {
  enum { BATCH = 3, M = 96, K = 257, N = 130 };
  TRng rng = {42};
  float *a = malloc(sizeof(float) * BATCH * M * K), *b = malloc(sizeof(float) * BATCH * K * N);
  float *out[3], *ta[3];
  trng_fill(&rng, a, BATCH * M * K, 1);
  trng_fill(&rng, b, BATCH * K * N, 1);
  for (int t = 0; t < 3; t++) {
    CHECK_OK(rt_pool_init(t + 1));
    out[t] = malloc(sizeof(float) * BATCH * M * N);
    ta[t] = malloc(sizeof(float) * BATCH * K * N);  /* [BATCH, K, N] */
    CHECK_OK(rt_matmul(out[t], a, b, BATCH, M, K, N, 0));
    /* a read as [BATCH, M, K]^T (m = K, k = M), b as [BATCH, N, M] transposed */
    CHECK_OK(rt_matmul_ta(ta[t], a, b, BATCH, K, M, N, RT_MM_B_BATCHED | RT_MM_TRANSPOSE_B));
  }
  for (int t = 1; t < 3; t++) {
    CHECK(memcmp(out[0], out[t], sizeof(float) * BATCH * M * N) == 0);
    CHECK(memcmp(ta[0], ta[t], sizeof(float) * BATCH * K * N) == 0);
  }
  for (int t = 0; t < 3; t++) free(out[t]), free(ta[t]);
  free(a), free(b);
}

static void test_errors(void) {
  float x[4] = {0};
  CHECK_FAILS(rt_matmul(NULL, x, x, 1, 2, 2, 1, 0), "matmul: NULL output");
  CHECK_FAILS(rt_matmul_ta(x, NULL, x, 1, 2, 2, 1, 0), "matmul_ta: NULL a");
  CHECK_FAILS(rt_matmul(x, x, x, 1, 0, 2, 1, 0), "m 0");
  CHECK_FAILS(rt_matmul(x, x, x, 1, 1, 1, 1, 64), "unknown flags");
  CHECK_FAILS(rt_matmul(x, x, x, 1, (int64_t)1 << 31, 1, 1, 0), "below 2^31");
}

int main(void) {
  test_against_reference();
  test_determinism();
  test_errors();
  rt_pool_shutdown();
  return check_result("test_gemm");
}
