/* bench/gemm_gpu.cu -- what bf16 storage would buy parc's GEMMs: cuBLASLt on
 * GPT-2 small's forward GEMM shapes (8192 tokens) in three precisions, timed
 * with CUDA events in one run:
 *
 *   fp32-io   fp32 A, B, C with CUBLAS_COMPUTE_32F_FAST_16BF: what parc's bf16
 *             trainer does today (runtime/cuda/rt_cuda_gemm.cu, activations fp32)
 *   bf16-in   bf16 A, B, fp32 C, CUBLAS_COMPUTE_32F (bf16 operands stored)
 *   bf16-io   bf16 A, B, C (everything stored in bf16)
 *
 * plus the fp32 -> bf16 conversion of one operand (the cost of converting per
 * GEMM instead of storing bf16).  Row-major out[M, N] = A[M, K] B[K, N] (or
 * B^T for the tied LM head) as parc maps it.  Build and run on the GPU machine
 * (tests/gpu/check.sh does both):
 *
 *   nvcc -O2 -arch=sm_90 bench/gemm_gpu.cu -lcublasLt -o gemm_gpu && ./gemm_gpu
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
#define LK(x)                                                                  \
  do {                                                                         \
    cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cublasLtGetStatusString(s_)); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

enum Mode { FP32_IO, BF16_IN, BF16_IO, NMODES };

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = 64u << 20;

__global__ void fill(float *x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = ((float)((i * 2654435761u + seed) % 2001u) - 1000.0f) * 1e-3f;
}

__global__ void to_bf16(__nv_bfloat16 *y, const float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}

/* Milliseconds per GEMM out[M, N] = A[M, K] op(B) for mode, over `reps` runs. */
static float time_gemm(Mode mode, int M, int K, int N, int tb, const void *a, const void *b,
                       void *out, int reps) {
  cudaDataType_t in = mode == FP32_IO ? CUDA_R_32F : CUDA_R_16BF;
  cudaDataType_t oc = mode == BF16_IO ? CUDA_R_16BF : CUDA_R_32F;
  cublasComputeType_t ct = mode == FP32_IO ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op;
  LK(cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F));
  cublasOperation_t ta = tb ? CUBLAS_OP_T : CUBLAS_OP_N, tn = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tn, sizeof tn));
  /* column-major: cuBLAS's A is our B ([N, K] stored, or [K, N] when transposed) */
  cublasLtMatrixLayout_t la, lb, lc;
  LK(cublasLtMatrixLayoutCreate(&la, in, tb ? K : N, tb ? N : K, tb ? K : N));
  LK(cublasLtMatrixLayoutCreate(&lb, in, K, M, K));
  LK(cublasLtMatrixLayoutCreate(&lc, oc, N, M, N));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
                                          sizeof WS));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found));
  if (!found) return -1.0f;
  float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; i++)
    LK(cublasLtMatmul(lt, op, &alpha, b, la, a, lb, &beta, out, lc, out, lc, &res.algo, ws, WS, 0));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < reps; i++)
    LK(cublasLtMatmul(lt, op, &alpha, b, la, a, lb, &beta, out, lc, out, lc, &res.algo, ws, WS, 0));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  return ms / reps;
}

int main(void) {
  struct { const char *name; int M, K, N, tb; } shapes[] = {
      {"attn qkv", 8192, 768, 2304, 0},  {"attn proj", 8192, 768, 768, 0},
      {"mlp fc", 8192, 768, 3072, 0},    {"mlp proj", 8192, 3072, 768, 0},
      {"lm head (tied)", 8192, 768, 50257, 1},
  };
  const int nshapes = sizeof shapes / sizeof shapes[0], reps = 20;
  size_t most = 0;
  for (int s = 0; s < nshapes; s++) {
    size_t m = (size_t)shapes[s].M, k = (size_t)shapes[s].K, n = (size_t)shapes[s].N;
    size_t need = m * k > k * n ? m * k : k * n;
    need = need > m * n ? need : m * n;
    most = need > most ? need : most;
  }
  float *a, *b, *c;
  __nv_bfloat16 *ah, *bh;
  CK(cudaMalloc(&a, most * 4));
  CK(cudaMalloc(&b, most * 4));
  CK(cudaMalloc(&c, most * 4));
  CK(cudaMalloc(&ah, most * 2));
  CK(cudaMalloc(&bh, most * 2));
  CK(cudaMalloc(&ws, WS));
  fill<<<1024, 256>>>(a, most, 1);
  fill<<<1024, 256>>>(b, most, 2);
  to_bf16<<<1024, 256>>>(ah, a, most);
  to_bf16<<<1024, 256>>>(bh, b, most);
  CK(cudaDeviceSynchronize());
  LK(cublasLtCreate(&lt));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("gemm_gpu on %s: cuBLASLt %zu, mean of %d GEMMs after 3 warm-ups\n",
         prop.name, cublasLtGetVersion(), reps);
  printf("%-16s %-20s %10s %10s %10s %12s %14s\n", "gemm", "M x K x N", "fp32-io", "bf16-in",
         "bf16-io", "cvt A ms", "fp32-io/bf16-io");
  double tot[NMODES] = {0}, tot_cvt = 0;
  for (int s = 0; s < nshapes; s++) {
    int M = shapes[s].M, K = shapes[s].K, N = shapes[s].N;
    double flops = 2.0 * M * K * N;
    float ms[NMODES];
    for (int md = 0; md < NMODES; md++)
      ms[md] = time_gemm((Mode)md, M, K, N, shapes[s].tb, md == FP32_IO ? (void *)a : (void *)ah,
                         md == FP32_IO ? (void *)b : (void *)bh, c, reps);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++) to_bf16<<<1024, 256>>>(ah, a, (size_t)M * K);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float cvt = 0;
    CK(cudaEventElapsedTime(&cvt, e0, e1));
    cvt /= reps;
    char shape[32];
    snprintf(shape, sizeof shape, "%dx%dx%d", M, K, N);
    printf("%-16s %-20s", shapes[s].name, shape);
    for (int md = 0; md < NMODES; md++) {
      printf(" %10.1f", ms[md] > 0 ? flops / (ms[md] * 1e-3) / 1e12 : 0.0);
      tot[md] += ms[md];
    }
    tot_cvt += cvt;
    printf(" %12.4f %14.2f\n", cvt, ms[FP32_IO] / ms[BF16_IO]);
  }
  printf("(TFLOP/s per mode)\nforward GEMMs of one layer set, ms: fp32-io %.3f, bf16-in %.3f, "
         "bf16-io %.3f, conversions %.3f\n", tot[0], tot[1], tot[2], tot_cvt);
  printf("RESULT INFO fp32-io/bf16-io time %.2f, fp32-io/bf16-in %.2f over GPT-2's forward "
         "GEMM shapes\n", tot[0] / tot[2], tot[0] / tot[1]);
  cublasLtDestroy(lt);
  return 0;
}
