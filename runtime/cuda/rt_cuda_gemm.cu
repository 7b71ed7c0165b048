/* runtime/cuda/rt_cuda_gemm.cu -- matmul and matmul_ta (rt_gemm.h) through
 * cuBLASLt.
 *
 * Row-major to cuBLAS's column-major: a row-major [r, c] matrix is the
 * column-major [c, r] one, so out[M, N] = A[M, K] B[K, N] is computed as
 * out^T[N, M] = B^T[N, K] A^T[K, M]: cuBLAS's "A" is our b, its "B" our a,
 * its m, n, k are our N, M, K.  Our transposes (transpose_b, matmul_ta) are
 * cuBLAS's transa, transb.  A rank-2 b shared by the batch is a batch
 * stride of 0; a's batch folds into M where a is not transposed and b is
 * shared (one GEMM, as the CPU does).
 *
 * Plans (the descriptors, the layouts and the algorithm cuBLASLt's heuristic
 * chose for the shape, flags, precision and the operands' alignment; with
 * PARC_CUDA_GEMM_TUNE the fastest of its candidates on this GPU,
 * rt_cuda_gemm_tune.cu) are cached per context: a step's GEMMs are planned on
 * the first step only.
 *
 * Precision.  fp32 mode: fp32 operands, fp32 arithmetic (verification).
 * bf16 mode: operands rounded to bf16 (round to nearest even), products
 * accumulated in fp32, the result fp32.  Without a batch, and where k is a
 * multiple of 8 and n of 4, the operands are converted into bf16 workspaces
 * by one pass each, their rows padded to a multiple of 8 elements (16 bytes;
 * an odd m, e.g. the vocabulary of a weight gradient, is fine), and cuBLASLt
 * runs bf16 x bf16 -> fp32, about twice the rate of fp32 operands on Hopper
 * (bench/gemm_gpu.cu).  Elsewhere cuBLASLt rounds the fp32 operands itself
 * (CUBLAS_COMPUTE_32F_FAST_16BF): measured on an H200 for GPT-2's tied head
 * (odd n or k = 50257), the bf16 path was slower there (8.7 ms against 4.9 ms
 * for the logits, 6.0 against 4.8 for their dx) and faster for the weight
 * gradient (2.3 against 5.4).  PARC_CUDA_GEMM_OPERANDS=fp32 keeps the fp32
 * operands everywhere.  The padded-result path (n % 4 != 0 through a padded
 * fp32 workspace and a 2-D copy) stays for PARC_CUDA_GEMM_OPERANDS=bf16,
 * which converts wherever there is no batch.  An operand that a kernel stored
 * as bf16 already (RT_CUDA_MM_A_BF16 / _B_BF16, codegen/cuda_store.h) is read
 * as it is: no copy, the other operand converted as above.  A result that
 * kernels read as bf16 (RT_CUDA_MM_C_BF16) is written bf16 by cuBLASLt (D of
 * type bf16: half the bytes, and a faster epilogue: bench/gemm_gpu.cu's
 * bf16-io column); RT_CUDA_MM_C_ROUND, its reference, rounds an fp32 result in
 * place by one more pass.
 *
 * The bias gradient in the epilogue (rt_cuda_matmul_ta_bgrad): a linear
 * layer's weight gradient dW = x^T dy reads dy [k, n] as cuBLAS's A, not
 * transposed; cuBLASLt's BGRADA epilogue sums op(A) over k into a vector of
 * D's rows (our n): the bias gradient, without its own pass over dy.  Asked
 * only where the sums are of the values the products read, as they are:
 * fp32 operands in fp32 mode, or bf16 ones (a dy the kernels stored as bf16,
 * or the call's rounded copy of an fp32 dy: what a stored trainer's kernel
 * would sum, so --bf16-store round sums the same values), not where cuBLASLt
 * rounds fp32 operands itself (GEMM mode bf16 or tf32 without a copy); and
 * where the GEMM is plain (one member, no transpose of b, an fp32 result;
 * accumulating or not: the epilogue writes the sums of this call's b, which
 * C and beta do not enter, as a stage program wants them: rt_cuda_bgrad_ws);
 * the plan keeps whether cuBLASLt had an algorithm with it, and where it had
 * none the call says so (*done = 0) and the caller sums.
 *
 * The bias added in the epilogue (rt_cuda_matmul_bias): cuBLASLt's BIAS adds
 * an fp32 vector (BIAS_DATA_TYPE; by default it would be D's type) of D's
 * rows (our n) to alpha times the product, before D's conversion: each
 * element fl(product + bias), the bits of the plain fp32 product and an fp32
 * add, rounded once where D is bf16.  Any GEMM mode; one member, no
 * accumulation.  Where the plan has no algorithm with it nothing runs, the
 * call makes the plain product into the caller's other buffer and says so.
 *
 * GELU in the epilogue (rt_cuda_matmul_gelu, _dgelu; GPT-2's MLP): the
 * up-projection's GELU_AUX_BIAS adds the fp32 bias as BIAS does, writes that
 * sum h (the pre-activation the backward reads) to the aux matrix and gelu(h)
 * to D; the backward's DGELU multiplies the product (dg = dy W^T) by
 * gelu'(aux) as D is written.  The aux matrix has D's type
 * (EPILOGUE_AUX_DATA_TYPE left at its default) and D's column-major layout,
 * AUX_LD = D's rows (our n; cuBLASLt wants a multiple of 8); gelu is the
 * tanh form, the IR's (to rounding: the GPU's tanh is its own).  The
 * conditions are BIAS's plus rows of a multiple of 8; RT_CUDA_MM_C_ROUND
 * rounds the aux output in place with the result (the bf16 trainer's bits in
 * fp32 buffers, for --bf16-store round); the aux pointer's
 * alignment is in the plan's key as the vector's is.  Where the plan has no
 * algorithm with the epilogue, nothing runs and the call makes the plain
 * product into the caller's other buffer, as for BIAS: the caller's kernels
 * add the bias and apply gelu (or multiply by its gradient) to it. */
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_impl.h"
extern "C" {
#include "runtime/rt_gemm.h"
}

/* The largest power of two dividing the address, up to 256. */
static int align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int al = 4;
  while (al < 256 && !(a & (uintptr_t)(2 * al - 1))) al *= 2;
  return al;
}

/* Row-major x[rows, cols] rounded to bf16 into y[rows, ld] (ld >= cols; the
 * columns past cols are left as they are: no GEMM reads them).  Grid-stride,
 * 4 floats a thread on the fast path (ld == cols, x 16-byte aligned). */
__global__ void to_bf16_kernel(__nv_bfloat16 *__restrict__ y, const float *__restrict__ x,
                               int64_t rows, int64_t cols, int64_t ld) {
  const int64_t n = rows * cols;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
  if (ld == cols && ((uintptr_t)x & 15) == 0) {
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
      if (i + 4 <= n) {
        float4 v = *(const float4 *)(x + i);
        *(__nv_bfloat162 *)(y + i) = __floats2bfloat162_rn(v.x, v.y); /* y 256-aligned, i % 4 == 0 */
        *(__nv_bfloat162 *)(y + i + 2) = __floats2bfloat162_rn(v.z, v.w);
      } else {
        for (int64_t j = i; j < n; j++) y[j] = __float2bfloat16_rn(x[j]);
      }
    }
    return;
  }
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, col = i - r * cols;
    y[r * ld + col] = __float2bfloat16_rn(x[i]);
  }
}

/* to_bf16_kernel over x[rows, cols] into y on the compute stream: RT_OK, or
 * RT_ERR naming what (its launch failed). */
static int to_bf16(RtCuda *c, __nv_bfloat16 *y, const float *x, int64_t rows, int64_t cols,
                   int64_t ld, const char *what) {
  int64_t threads = (rows * cols + 3) / 4;
  unsigned grid = (unsigned)(threads / 256 + 1 < 8192 ? threads / 256 + 1 : 8192);
  to_bf16_kernel<<<grid, 256, 0, c->compute>>>(y, x, rows, cols, ld);
  LAUNCH_CHECK(c, what);
  return RT_OK;
}

/* Row-major x[rows, cols] as bf16 rows of ld elements in workspace slot (NULL
 * on error). */
static const __nv_bfloat16 *as_bf16(RtCuda *c, int slot, const float *x, int64_t rows,
                                    int64_t cols, int64_t ld) {
  __nv_bfloat16 *y = (__nv_bfloat16 *)rt_cuda_ws(c, slot, (size_t)(rows * ld) * 2);
  return y && to_bf16(c, y, x, rows, cols, ld, "to_bf16_kernel") == RT_OK ? y : NULL;
}

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

/* The params' bf16 copy (rt_cuda.h): to_bf16_kernel's rounding, the GEMMs'
 * own operand copies'. */
extern "C" int rt_cuda_params_to_bf16(RtCuda *c) {
  if (!c->params_bf16) return rt_fail("rt_cuda_params_to_bf16: no bf16 copy of the params "
                                      "(RtCudaSetup.params_bf16 is 0)");
  if (!c->params_numel) return RT_OK;
  RtProfScope ps(c);
  if (ps.on())
    ps.set(RT_PROF_OP, 6.0 * (double)c->params_numel, 0, "params_to_bf16 %lld",
           (long long)c->params_numel);
  return to_bf16(c, (__nv_bfloat16 *)c->params_bf16, c->params, 1, c->params_numel,
                 c->params_numel, "to_bf16_kernel (params)");
}

extern "C" const float *rt_cuda_params_bf16(RtCuda *c, int64_t off) {
  if (!c->params_bf16 || off < 0 || off >= (c->params_numel ? c->params_numel : 1)) return NULL;
  return (const float *)((const __nv_bfloat16 *)c->params_bf16 + off);
}

/* x[0, n) rounded to bf16 values in place (RT_CUDA_MM_C_ROUND), grid-stride. */
__global__ void round_bf16_kernel(float *__restrict__ x, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

int rt_cuda_to_bf16(RtCuda *c, void *y, const float *x, int64_t n) {
  return n > 0 ? to_bf16(c, (__nv_bfloat16 *)y, x, 1, n, n, "to_bf16_kernel") : RT_OK;
}

int rt_cuda_round_bf16(RtCuda *c, float *x, int64_t n) {
  if (n <= 0) return RT_OK;
  unsigned grid = (unsigned)(n / 1024 + 1 < 8192 ? n / 1024 + 1 : 8192);
  round_bf16_kernel<<<grid, 256, 0, c->compute>>>(x, n);
  LAUNCH_CHECK(c, "round_bf16_kernel");
  return RT_OK;
}

/* PARC_CUDA_GEMM_OPERANDS (the head comment); which GEMMs convert their
 * operands: rt_cuda_gemm_bf16ops (rt_cuda_ws_plan.h) */
int rt_cuda_gemm_operands(void) {
  static int want = -1; /* read once (the same in every thread) */
  if (want < 0) {
    const char *v = getenv("PARC_CUDA_GEMM_OPERANDS");
    want = v && !strcmp(v, "fp32")   ? RT_CUDA_OPERANDS_FP32
           : v && !strcmp(v, "bf16") ? RT_CUDA_OPERANDS_BF16
                                     : RT_CUDA_OPERANDS_ALIGNED;
  }
  return want;
}

static cublasComputeType_t compute_type(int mode, int bf16ops) {
  if (bf16ops) return CUBLAS_COMPUTE_32F;
  return mode == RT_CUDA_GEMM_BF16   ? CUBLAS_COMPUTE_32F_FAST_16BF
         : mode == RT_CUDA_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                     : CUBLAS_COMPUTE_32F;
}

static int set_batch(RtCuda *c, cublasLtMatrixLayout_t l, int32_t count, int64_t stride) {
  if (count <= 1) return RT_OK;
  LT_CHECK(c, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof count), "cublasLtMatrixLayoutSetAttribute");
  LT_CHECK(c, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof stride),
           "cublasLtMatrixLayoutSetAttribute");
  return RT_OK;
}

/* The epilogues a plan may ask for (GemmPlan.want_epi, .epi), cuBLASLt's
 * BGRADA, BIAS, GELU_AUX_BIAS and DGELU: BGRADA sums b into its vector beside
 * the plain product; the others make a result other than the plain product's
 * (epi_makes), BIAS and GELU from a vector, GELU and DGELU with an aux matrix
 * (written, read). */
enum { GEMM_EPI_NONE = 0, GEMM_EPI_BGRADA = 1, GEMM_EPI_BIAS = 2, GEMM_EPI_GELU = 3,
       GEMM_EPI_DGELU = 4 };
static int epi_makes(int epi) { return epi >= GEMM_EPI_BIAS; }
static int epi_vector(int epi) { return epi >= GEMM_EPI_BGRADA && epi <= GEMM_EPI_GELU; }
static int epi_aux(int epi) { return epi >= GEMM_EPI_GELU; }

/* PARC_CUDA_BGRAD=0: no bias-gradient epilogue (the kernels sum, as before);
 * PARC_CUDA_BIAS=0: no bias epilogue (the kernels add); PARC_CUDA_GELU=0: no
 * GELU epilogues (the kernels apply gelu and its gradient).  Each read once. */
static int env_allows(const char *name, int *cache) {
  if (*cache < 0) {
    const char *v = getenv(name);
    *cache = !(v && !strcmp(v, "0"));
  }
  return *cache;
}
static int bgrad_allowed(void) {
  static int allowed = -1;
  return env_allows("PARC_CUDA_BGRAD", &allowed);
}
static int bias_allowed(void) {
  static int allowed = -1;
  return env_allows("PARC_CUDA_BIAS", &allowed);
}
static int gelu_allowed(void) {
  static int allowed = -1;
  return env_allows("PARC_CUDA_GELU", &allowed);
}

/* Whether epilogue epi, one that makes the result (epi_makes), may run: one
 * member (the batch folded into m), no accumulation, its env switch; GELU and
 * DGELU: rows of n a multiple of 8 (the aux's AUX_LD). */
static int makes_allowed(int epi, int64_t batch, int64_t n, int flags) {
  if (batch != 1 || (flags & RT_MM_ACCUMULATE)) return 0;
  if (epi == GEMM_EPI_BIAS) return bias_allowed();
  return gelu_allowed() && n % 8 == 0;
}

/* Points p->op's epilogue epi at a call's vector (bias) and aux matrix, those
 * of them it reads or writes (calls of one shape share the plan). */
static cublasStatus_t set_pointers(GemmPlan *p, int epi, const float *bias, const void *aux) {
  const void *vec = epi_vector(epi) ? bias : NULL;
  cublasStatus_t st =
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec);
  if (st == CUBLAS_STATUS_SUCCESS && epi_aux(epi))
    st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                        sizeof aux);
  return st;
}

/* Sets the epilogue of p->op: epi (GEMM_EPI_*) with vector bias (fp32) and
 * aux matrix aux (D's type, rows of p->n), or the default. */
static cublasStatus_t set_epilogue(GemmPlan *p, int epi, const float *bias, const void *aux) {
  static const uint32_t kind[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BGRADA,
                                  CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                  CUBLASLT_EPILOGUE_DGELU}; /* by GEMM_EPI_* */
  uint32_t e = kind[epi];
  cublasStatus_t st =
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
  /* an fp32 vector whatever D's type (BGRADA's is D's type, fp32 there) */
  int32_t type = CUDA_R_32F;
  if (st == CUBLAS_STATUS_SUCCESS && (epi == GEMM_EPI_BIAS || epi == GEMM_EPI_GELU))
    st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type,
                                        sizeof type);
  /* the aux matrix in D's layout: D's rows are our rows of n */
  int64_t ld = p->n;
  if (st == CUBLAS_STATUS_SUCCESS && epi_aux(epi))
    st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                        sizeof ld);
  return st == CUBLAS_STATUS_SUCCESS ? set_pointers(p, epi, bias, aux) : st;
}

static void drop_plan(GemmPlan *p) {
  cublasLtMatrixLayoutDestroy(p->la);
  cublasLtMatrixLayoutDestroy(p->lb);
  cublasLtMatrixLayoutDestroy(p->lc);
  cublasLtMatmulDescDestroy(p->op);
}

/* Builds plan p for: batch GEMMs of out[m, n] = op(a)[m, k] op(b)[k, n]; with
 * p->want_epi, that epilogue (BGRADA into bias; BIAS, GELU from it; GELU
 * into aux, DGELU from it) where cuBLASLt has an algorithm for it (p->epi),
 * else without. */
static int make_plan(RtCuda *c, GemmPlan *p, int al_a, int al_b, int al_c, const float *bias,
                     const void *aux, int tunable) {
  int ta = p->ta, tb = (p->flags & RT_MM_TRANSPOSE_B) != 0, bb = (p->flags & RT_MM_B_BATCHED) != 0;
  int64_t m = p->m, n = p->n, k = p->k;
  int32_t batch = (int32_t)p->batch;
  LT_CHECK(c, cublasLtMatmulDescCreate(&p->op, compute_type(p->mode, p->bf16ops), CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "cublasLtMatmulDescSetAttribute");
  LT_CHECK(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "cublasLtMatmulDescSetAttribute");
  /* stored shapes, column-major: our b is [n, k] (or [k, n] transposed), our a [k, m] */
  uint64_t ra = (uint64_t)(tb ? k : n), ca = (uint64_t)(tb ? n : k);
  uint64_t rb = (uint64_t)(ta ? m : k), cb = (uint64_t)(ta ? k : m);
  cudaDataType_t in = p->bf16ops ? CUDA_R_16BF : CUDA_R_32F;
  LT_CHECK(c, cublasLtMatrixLayoutCreate(&p->la, in, ra, ca, p->ld[1]),
           "cublasLtMatrixLayoutCreate");
  LT_CHECK(c, cublasLtMatrixLayoutCreate(&p->lb, in, rb, cb, p->ld[0]),
           "cublasLtMatrixLayoutCreate");
  cudaDataType_t out = (p->flags & RT_CUDA_MM_C_BF16) ? CUDA_R_16BF : CUDA_R_32F;
  LT_CHECK(c, cublasLtMatrixLayoutCreate(&p->lc, out, (uint64_t)n, (uint64_t)m, p->ld[2]),
           "cublasLtMatrixLayoutCreate");
  if (set_batch(c, p->la, batch, bb ? k * n : 0) || set_batch(c, p->lb, batch, m * k) ||
      set_batch(c, p->lc, batch, m * n))
    return RT_ERR;
  cublasLtMatmulPreference_t pref;
  LT_CHECK(c, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  uint64_t ws = RT_CUDA_GEMM_WORKSPACE;
  uint32_t a32 = (uint32_t)al_b, b32 = (uint32_t)al_a, c32 = (uint32_t)al_c; /* cuBLAS's A is b */
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &a32, sizeof a32);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &b32, sizeof b32);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &c32, sizeof c32);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &c32, sizeof c32);
  /* the heuristic's first choice; tuning (rt_cuda_gemm_tune.cu), its candidates */
  cublasLtMatmulHeuristicResult_t res[RT_CUDA_TUNE_ALGOS];
  const int want = tunable && c->tune ? RT_CUDA_TUNE_ALGOS : 1;
  int found = 0;
  memset(res, 0, sizeof res);
  p->epi = GEMM_EPI_NONE;
  if (st == CUBLAS_STATUS_SUCCESS && p->want_epi) { /* with the epilogue, if cuBLASLt can */
    cublasStatus_t sb = set_epilogue(p, p->want_epi, bias, aux);
    if (sb == CUBLAS_STATUS_SUCCESS)
      sb = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, want,
                                          res, &found);
    if (sb == CUBLAS_STATUS_SUCCESS && found >= 1) p->epi = p->want_epi;
    else { /* none: the plain GEMM, and the caller does the epilogue's work */
      found = 0;
      st = set_epilogue(p, GEMM_EPI_NONE, NULL, NULL);
    }
  }
  if (st == CUBLAS_STATUS_SUCCESS && !p->epi)
    st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, want,
                                        res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  LT_CHECK(c, st, "cublasLtMatmulAlgoGetHeuristic");
  if (found < 1) {
    char what[192];
    snprintf(what, sizeof what, "no algorithm for batch %lld, m %lld, k %lld, n %lld",
             (long long)p->batch, (long long)m, (long long)k, (long long)n);
    return rt_cuda_fail_at(c, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", what);
  }
  p->algo = res[0].algo;
  p->used = 1;
  if (want > 1) rt_cuda_tune_plan(c, p, res, found);
  return RT_OK;
}

/* The GEMM with epilogue epi (GEMM_EPI_*; vector bias, aux matrix aux, as
 * it reads or writes them) where it can (the head comment): BGRADA its bias
 * gradient beside the product, else the product alone; an epilogue that
 * makes the result (epi_makes), else nothing runs.  *done = whether the
 * epilogue ran. */
static int gemm(RtCuda *c, const char *opname, int ta, float *out, const float *a,
                const float *b, int64_t batch, int64_t m, int64_t k, int64_t n, int flags,
                int epi, float *bias, const void *aux, int *done) {
  if (done) *done = 0;
  if (!out || !a || !b)
    return rt_fail("%s: NULL %s pointer", opname, !out ? "output" : !a ? "a" : "b");
  if (batch < 1 || m < 1 || k < 1 || n < 1)
    return rt_fail("%s: dimensions must be >= 1, got batch %lld, m %lld, k %lld, n %lld", opname,
                   (long long)batch, (long long)m, (long long)k, (long long)n);
  const int stored = flags & (RT_CUDA_MM_A_BF16 | RT_CUDA_MM_B_BF16 | RT_CUDA_MM_C_BF16 |
                              RT_CUDA_MM_C_ROUND);
  const int wide = flags & (RT_CUDA_MM_A_WIDE | RT_CUDA_MM_B_WIDE);
  const int cout = flags & (RT_CUDA_MM_C_BF16 | RT_CUDA_MM_C_ROUND);
  if ((flags & ~(RT_MM_TRANSPOSE_B | RT_MM_B_BATCHED | RT_MM_ACCUMULATE | stored | wide)) ||
      ((flags & RT_CUDA_MM_A_WIDE) && !(flags & RT_CUDA_MM_A_BF16)) ||
      ((flags & RT_CUDA_MM_B_WIDE) && !(flags & RT_CUDA_MM_B_BF16)) ||
      cout == (RT_CUDA_MM_C_BF16 | RT_CUDA_MM_C_ROUND) || (cout && (flags & RT_MM_ACCUMULATE)))
    return rt_fail("%s: unknown flags 0x%x", opname, (unsigned)flags);
  if (!ta && !(flags & RT_MM_B_BATCHED)) { /* fold the batch into M */
    m *= batch;
    batch = 1;
  }
  /* a result the epilogue makes (the bias added: fl(product + bias); gelu or its
   * gradient), in any mode (rt_cuda.h); decided before the operands' bf16
   * copies, which the caller's plain call would make again */
  const int want_made = epi_makes(epi) && makes_allowed(epi, batch, n, flags);
  if (epi_makes(epi) && !want_made) return RT_OK; /* (*done = 0: the caller's plain call) */
  int gflags = flags & ~RT_MM_ACCUMULATE;
  /* an operand stored as bf16 makes the GEMM a bf16 one, whatever
   * PARC_CUDA_GEMM_OPERANDS says (rt_cuda_open refuses other GEMM modes) */
  int bf16ops = stored ? 1 : rt_cuda_gemm_bf16ops(c->gemm, rt_cuda_gemm_operands(), batch, k, n);
  int tb = (flags & RT_MM_TRANSPOSE_B) != 0;
  /* what cuBLASLt reads and writes: row-major a [ar, ac], b [br, bc], out [m, n]
   * with rows of ld[0], ld[1], ld[2] elements */
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  int64_t ld[3] = {ac, bc, n};
  const void *ga = a, *gb = b;
  float *gout = out;
  if (stored && (c->gemm != RT_CUDA_GEMM_BF16 || batch != 1 ||
                 ((flags & RT_CUDA_MM_A_BF16) && ac % 8) ||
                 ((flags & RT_CUDA_MM_B_BF16) && bc % 8) || (cout && n % 8)))
    return rt_fail("%s: a bf16 operand or result (flags 0x%x) needs GEMM mode bf16, no batch "
                   "and rows of a multiple of 8 (batch %lld, m %lld, k %lld, n %lld)", opname,
                   (unsigned)flags, (long long)batch, (long long)m, (long long)k, (long long)n);
  if (bf16ops) {
    ld[0] = round8(ac), ld[1] = round8(bc);
    if (flags & RT_CUDA_MM_A_WIDE) ld[0] = 2 * ac;
    if (flags & RT_CUDA_MM_B_WIDE) ld[1] = 2 * bc;
    if (!(flags & RT_CUDA_MM_A_BF16) && !(ga = as_bf16(c, WS_BF16_A, a, ar, ac, ld[0])))
      return RT_ERR;
    if (!(flags & RT_CUDA_MM_B_BF16) && !(gb = as_bf16(c, WS_BF16_B, b, br, bc, ld[1])))
      return RT_ERR;
    if (n % 4) { /* fp32 rows not 16-byte aligned: a padded result */
      ld[2] = round8(n);
      if (!(gout = (float *)rt_cuda_ws(c, WS_GEMM_OUT, (size_t)(m * ld[2]) * 4))) return RT_ERR;
      if (flags & RT_MM_ACCUMULATE)
        CU_CHECK(c, cudaMemcpy2DAsync(gout, (size_t)ld[2] * 4, out, (size_t)n * 4, (size_t)n * 4,
                                      (size_t)m, cudaMemcpyDeviceToDevice, c->compute),
                 "gemm: the accumulated result into its padded rows");
    }
  }
  int al_a = align_of(ga), al_b = align_of(gb), al_c = align_of(gout);
  /* the bias gradient from the epilogue: sums of b's own values (the head comment) */
  int want_bgrad = epi == GEMM_EPI_BGRADA && bgrad_allowed() && batch == 1 && !tb && !cout &&
                   (bf16ops || c->gemm == RT_CUDA_GEMM_FP32);
  int want_epi = want_bgrad ? GEMM_EPI_BGRADA : want_made ? epi : GEMM_EPI_NONE;
  int al_bias = epi_vector(want_epi) ? align_of(bias) : 0;
  int al_aux = epi_aux(want_epi) ? align_of(aux) : 0;
  /* the cache key: shape, flags, precision, epilogue and alignment class */
  uint64_t h = (uint64_t)(m * 1000003 + k * 10007 + n * 101 + batch * 7 + gflags * 3 + ta) ^
               ((uint64_t)(al_a + 3 * al_b + 7 * al_c + 11 * al_bias + 13 * al_aux +
                           1031 * want_epi) << 40) ^
               ((uint64_t)c->gemm << 60);
  GemmPlan *p = NULL;
  for (int i = 0; i < RT_CUDA_GEMM_CACHE; i++) {
    GemmPlan *q = &c->plans[(h + (uint64_t)i) % RT_CUDA_GEMM_CACHE];
    if (!q->used) {
      p = q;
      break;
    }
    if (q->batch == batch && q->m == m && q->k == k && q->n == n && q->flags == gflags &&
        q->ta == ta && q->mode == c->gemm && q->bf16ops == bf16ops &&
        q->al[0] == al_a && q->al[1] == al_b && q->al[2] == al_c &&
        q->want_epi == want_epi && q->al_bias == al_bias && q->al_aux == al_aux) {
      p = q;
      break;
    }
  }
  GemmPlan scratch;
  int temporary = 0;
  if (!p) { /* cache full: plan, run and forget */
    memset(&scratch, 0, sizeof scratch);
    p = &scratch;
    temporary = 1;
  }
  if (!p->used) {
    p->batch = batch, p->m = m, p->k = k, p->n = n, p->flags = gflags, p->ta = ta;
    p->mode = c->gemm;
    p->bf16ops = bf16ops;
    p->ld[0] = ld[0], p->ld[1] = ld[1], p->ld[2] = ld[2];
    p->al[0] = al_a, p->al[1] = al_b, p->al[2] = al_c;
    p->want_epi = want_epi, p->al_bias = al_bias, p->al_aux = al_aux;
    if (make_plan(c, p, al_a, al_b, al_c, bias, aux, !temporary)) return RT_ERR;
  }
  if (want_made && !p->epi) { /* no algorithm makes it: nothing runs, the caller does */
    if (temporary) drop_plan(p);
    return RT_OK;
  }
  float alpha = 1.0f, beta = (flags & RT_MM_ACCUMULATE) ? 1.0f : 0.0f;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (p->epi) st = set_pointers(p, p->epi, bias, aux); /* this call's */
  if (st == CUBLAS_STATUS_SUCCESS && p->tune && !c->graph_capturing &&
      rt_cuda_tune_time(c, p, gb, ga, gout, beta)) /* (never a temporary plan) */
    return RT_ERR;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(c->lt, p->op, &alpha, gb, p->la, ga, p->lb, &beta, gout,
                                     p->lc, gout, p->lc, &p->algo, c->lt_ws,
                                     RT_CUDA_GEMM_WORKSPACE, c->compute);
  if (temporary) drop_plan(p);
  if (st != CUBLAS_STATUS_SUCCESS) {
    char what[256];
    snprintf(what, sizeof what, "%s (batch %lld, m %lld, k %lld, n %lld, flags 0x%x)",
             cublasLtGetStatusString(st), (long long)batch, (long long)m, (long long)k,
             (long long)n, (unsigned)flags);
    return rt_cuda_fail_at(c, __FILE__, __LINE__, opname, what);
  }
  const int p_epi = p->epi;
  if (done) *done = p_epi != GEMM_EPI_NONE;
  if (gout != out)
    CU_CHECK(c, cudaMemcpy2DAsync(out, (size_t)n * 4, gout, (size_t)ld[2] * 4, (size_t)n * 4,
                                  (size_t)m, cudaMemcpyDeviceToDevice, c->compute),
             "gemm: the result out of its padded rows");
  /* the reference of a bf16 result: its values in fp32 (and the GELU's aux
   * output, which is of the result's type) */
  if (!(flags & RT_CUDA_MM_C_ROUND)) return RT_OK;
  if (p_epi == GEMM_EPI_GELU && rt_cuda_round_bf16(c, (float *)aux, m * n)) return RT_ERR;
  return rt_cuda_round_bf16(c, out, m * n);
}

/* The profile's record of a GEMM (rt_cuda.h): "matmul BxMxKxN", the shape as
 * cuBLASLt runs it (a's batch folded into M where gemm() folds it); epi: the
 * epilogue that ran (GEMM_EPI_*), its vector of a bias gradient and its aux
 * matrix (of the result's type) counted in the bytes. */
static void prof_gemm(RtCuda *c, RtProfScope &ps, const char *op, int ta, int64_t batch,
                      int64_t m, int64_t k, int64_t n, int flags, int epi) {
  const int bgrad = epi == GEMM_EPI_BGRADA;
  double B = (double)batch, M = (double)m, K = (double)k, N = (double)n;
  int acc = (flags & RT_MM_ACCUMULATE) != 0;
  double ea = (flags & RT_CUDA_MM_A_BF16) ? 2 : 4, eb = (flags & RT_CUDA_MM_B_BF16) ? 2 : 4;
  double ec = (flags & RT_CUDA_MM_C_BF16) ? 2 : 4;
  double bytes = ea * B * M * K + eb * ((flags & RT_MM_B_BATCHED) ? B : 1) * K * N +
                 ec * (acc ? 2 : 1) * B * M * N + (bgrad ? 4 * N : 0) +
                 (epi_aux(epi) ? ec * B * M * N : 0);
  if (!ta && !(flags & RT_MM_B_BATCHED)) m *= batch, batch = 1;
  char shape[64];
  if (batch > 1)
    snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld", (long long)batch, (long long)m,
             (long long)k, (long long)n);
  else
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)m, (long long)k, (long long)n);
  ps.set(c->gemm == RT_CUDA_GEMM_FP32 ? RT_PROF_GEMM_FP32 : RT_PROF_GEMM, bytes, 2 * B * M * K * N,
         "%s %s%s%s%s", op, shape, (flags & RT_MM_TRANSPOSE_B) ? " b^T" : "", acc ? " +=" : "",
         bgrad ? " +bias grad" : "");
}

extern "C" int rt_cuda_matmul(RtCuda *c, float *out, const float *a, const float *b,
                              int64_t batch, int64_t m, int64_t k, int64_t n, int flags) {
  RtProfScope ps(c);
  if (ps.on()) prof_gemm(c, ps, "matmul", 0, batch, m, k, n, flags, GEMM_EPI_NONE);
  return gemm(c, "matmul", 0, out, a, b, batch, m, k, n, flags, GEMM_EPI_NONE, NULL, NULL, NULL);
}

extern "C" int rt_cuda_matmul_ta(RtCuda *c, float *out, const float *a, const float *b,
                                 int64_t batch, int64_t m, int64_t k, int64_t n, int flags) {
  RtProfScope ps(c);
  if (ps.on()) prof_gemm(c, ps, "matmul_ta", 1, batch, m, k, n, flags, GEMM_EPI_NONE);
  return gemm(c, "matmul_ta", 1, out, a, b, batch, m, k, n, flags, GEMM_EPI_NONE, NULL, NULL,
              NULL);
}

/* rt_cuda_matmul_bias, _gelu and _dgelu (rt_cuda.h): the result epilogue epi
 * (epi_makes) makes from the product, vector bias and aux matrix aux (those
 * it reads or writes) to out as out_flags say, *done = 1; where it cannot,
 * the plain product to plain as flags say, *done = 0. */
static int matmul_made(RtCuda *c, int epi, float *out, float *plain, const float *a,
                       const float *b, const float *bias, const void *aux, int64_t batch,
                       int64_t m, int64_t k, int64_t n, int flags, int out_flags, int *done) {
  static const char *const fn[] = {"", "", "rt_cuda_matmul_bias", "rt_cuda_matmul_gelu",
                                   "rt_cuda_matmul_dgelu"};
  static const char *const rec[] = {"", "", "matmul +bias", "matmul +gelu", "matmul +dgelu"};
  const int cbits = RT_CUDA_MM_C_BF16 | RT_CUDA_MM_C_ROUND;
  const char *null = epi_vector(epi) && !bias ? "bias"
                     : epi_aux(epi) && !aux   ? "aux"
                     : !done                  ? "done"
                     : !plain                 ? "plain"
                                              : NULL;
  if (null) return rt_fail("%s: NULL %s", fn[epi], null);
  if (out_flags & ~cbits)
    return rt_fail("%s: out flags 0x%x not understood", fn[epi], (unsigned)out_flags);
  RtProfScope ps(c);
  const int eflags = (flags & ~cbits) | out_flags;
  int rc = gemm(c, "matmul", 0, out, a, b, batch, m, k, n, eflags, epi, (float *)bias, aux, done);
  if (!rc && !*done)
    rc = gemm(c, "matmul", 0, plain, a, b, batch, m, k, n, flags, GEMM_EPI_NONE, NULL, NULL, NULL);
  if (ps.on())
    prof_gemm(c, ps, *done ? rec[epi] : "matmul", 0, batch, m, k, n, *done ? eflags : flags,
              *done ? epi : GEMM_EPI_NONE);
  return rc;
}

extern "C" int rt_cuda_matmul_bias(RtCuda *c, float *out, float *plain, const float *a,
                                   const float *b, const float *bias, int64_t batch, int64_t m,
                                   int64_t k, int64_t n, int flags, int out_flags, int *done) {
  return matmul_made(c, GEMM_EPI_BIAS, out, plain, a, b, bias, NULL, batch, m, k, n, flags,
                     out_flags, done);
}

extern "C" int rt_cuda_matmul_gelu(RtCuda *c, float *out, float *aux, float *plain,
                                   const float *a, const float *b, const float *bias,
                                   int64_t batch, int64_t m, int64_t k, int64_t n, int flags,
                                   int out_flags, int *done) {
  return matmul_made(c, GEMM_EPI_GELU, out, plain, a, b, bias, aux, batch, m, k, n, flags,
                     out_flags, done);
}

extern "C" int rt_cuda_matmul_dgelu(RtCuda *c, float *out, float *plain, const float *a,
                                    const float *b, const float *aux, int64_t batch, int64_t m,
                                    int64_t k, int64_t n, int flags, int out_flags, int *done) {
  return matmul_made(c, GEMM_EPI_DGELU, out, plain, a, b, NULL, aux, batch, m, k, n, flags,
                     out_flags, done);
}

extern "C" int rt_cuda_bgrad_ws(RtCuda *c, int64_t n, float **out) {
  if (!out || n < 1)
    return rt_fail("rt_cuda_bgrad_ws: %s", !out ? "NULL out" : "n must be >= 1");
  *out = (float *)rt_cuda_ws(c, WS_BGRAD, (size_t)n * sizeof(float));
  return *out ? RT_OK : RT_ERR;
}

extern "C" int rt_cuda_matmul_ta_bgrad(RtCuda *c, float *out, const float *a, const float *b,
                                       float *bgrad, int64_t batch, int64_t m, int64_t k,
                                       int64_t n, int flags, int *done) {
  if (!bgrad || !done)
    return rt_fail("rt_cuda_matmul_ta_bgrad: NULL %s", !bgrad ? "bias gradient" : "done");
  RtProfScope ps(c);
  int rc = gemm(c, "matmul_ta", 1, out, a, b, batch, m, k, n, flags, GEMM_EPI_BGRADA, bgrad,
                NULL, done);
  if (ps.on())
    prof_gemm(c, ps, "matmul_ta", 1, batch, m, k, n, flags,
              *done ? GEMM_EPI_BGRADA : GEMM_EPI_NONE);
  return rc;
}
