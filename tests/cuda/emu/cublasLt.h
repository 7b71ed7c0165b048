/* tests/cuda/emu/cublasLt.h -- cuBLASLt's matmul for the CPU emulation of
 * CUDA (the subset runtime/cuda/rt_cuda_gemm.cu uses), implemented in
 * emu_cublaslt.cpp.
 *
 * What it computes is cuBLASLt's contract: D = alpha op(A) op(B) + beta C on
 * column-major layouts (type, rows, cols, leading dimension, batch count,
 * strided batch offset in elements), C not read when beta is 0.  Operands are
 * CUDA_R_32F or CUDA_R_16BF, C and D CUDA_R_32F.  Compute types: 32F (fp32
 * operands as they are), 32F_FAST_16BF (fp32 operands rounded to bf16, to
 * nearest even, first), 32F_FAST_TF32 (rounded to tf32: 10 fraction bits, to
 * nearest, ties away).  Products are summed in fp32 in increasing k from 0,
 * then scaled: alpha * sum + beta * C.  A real GPU sums in another order, so
 * results agree with it to rounding, not bit for bit; the emulation is
 * deterministic, so a run agrees with itself (graph replays included).
 *
 * The work is enqueued on the stream (kcu_emu_api.h) with copies of the
 * descriptors and of alpha and beta (host pointer mode: read at the call, as
 * cuBLASLt does), so a captured graph replays it after the descriptors are
 * destroyed.  What cuBLASLt would reject is rejected with its status: bad
 * layouts (ld below rows, shapes that do not chain, batch counts that differ),
 * unsupported types, unknown attributes, a NULL handle. */
#ifndef KCU_EMU_CUBLASLT_H
#define KCU_EMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
} cublasLtMatmulDescAttributes_t;

/* The epilogues emulated: none; BGRADA (bias[i] = the sum over p of
 * op(A)[i, p], the operand values as the products read them, fp32 in
 * increasing p; written, not scaled, C and beta not involved; D's type, fp32
 * only; A not transposed, one batch member, as the heuristic requires);
 * BIAS (D[i, j] = alpha acc + beta C + bias[i], in fp32, then D's type; the
 * vector of BIAS_DATA_TYPE, fp32 or bf16, by default D's type; one batch
 * member); GELU_AUX_BIAS (h = alpha acc + beta C + bias[i] as BIAS's, in fp32;
 * aux[i + j AUX_LD] = h and D[i, j] = gelu(h), each converted to D's type);
 * and DGELU (D[i, j] = (alpha acc + beta C) gelu'(x), x = aux[i + j AUX_LD],
 * in fp32, then D's type).  gelu is the IR's tanh form in fp32, in the order
 * of the generated kernels (codegen/cg_emit.c): t = tanhf(0.797884583 (x +
 * 0.0447149985 x x x)), gelu(x) = 0.5 x (1 + t), gelu'(x) = 0.5 (1 + t) +
 * 0.5 x (1 - t t) 0.797884583 (1 + 0.134145007 x x), left to right (the
 * C library's tanhf, not the kernels' own kcu_tanh: a last bit of t may
 * differ from theirs, as a GPU's epilogue may differ more).  Their
 * aux matrix (EPILOGUE_AUX_POINTER) has D's type and column-major layout with
 * leading dimension AUX_LD; the heuristic finds no algorithm without the
 * pointer, with AUX_LD below D's rows or not a multiple of 8 (as cuBLASLt
 * documents), or with a batch.  KCU_EMU_LT_NO_BGRAD=1 makes the heuristic
 * find no algorithm with any epilogue, as a library without one would (the
 * callers' other path). */
typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
  CUBLASLT_EPILOGUE_DGELU = 64 | 128,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

typedef enum {
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef struct KcuLtHandle *cublasLtHandle_t;
typedef struct KcuLtDesc *cublasLtMatmulDesc_t;
typedef struct KcuLtLayout *cublasLtMatrixLayout_t;
typedef struct KcuLtPref *cublasLtMatmulPreference_t;

/* Opaque like cuBLASLt's.  The emulation marks its algorithms (data[0]) and
 * numbers them (data[1]): by default it has one; KCU_EMU_LT_ALGOS=N (1 to 8)
 * gives the heuristic N, algorithm i > 0 summing k in i + 1 consecutive
 * chunks, each from 0, added in order (other bits than algorithm 0's: the
 * GEMM tuning's checks tell them apart), and KCU_EMU_LT_SLOW=i makes
 * algorithm i sleep 20 ms a call (one that tuning must not choose). */
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
const char *cublasLtGetStatusString(cublasStatus_t status);
size_t cublasLtGetVersion(void); /* the emulation's: 1 */

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size);

/* One result (found = 1) where the layouts chain and their types are
 * supported; else CUBLAS_STATUS_NOT_SUPPORTED with found = 0.  The
 * preference's workspace and alignment limits do not matter to the one
 * algorithm. */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *found);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t adesc,
                              const void *B, cublasLtMatrixLayout_t bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cdesc, void *D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
