/* tests/cuda/emu/emu_cublaslt.cpp -- the emulated cuBLASLt (cublasLt.h says
 * what it computes). */
#include <cublasLt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_bf16.h>

#include "kcu_emu_api.h"

struct KcuLtHandle {
  int magic;
};
struct KcuLtDesc {
  cublasComputeType_t compute;
  cublasOperation_t ta, tb;
  uint32_t epilogue;
  void *bias;
  int32_t bias_type; /* -1: D's type */
  void *aux;         /* GELU_AUX_BIAS's, DGELU's matrix: D's type, column-major */
  int64_t aux_ld;
};
struct KcuLtLayout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride; /* elements between batch members */
};
struct KcuLtPref {
  uint64_t workspace;
};

static const uint64_t ALGO_MARK = 0x6b63752d656d75ull; /* "kcu-emu" */

/* KCU_EMU_LT_ALGOS, KCU_EMU_LT_SLOW (cublasLt.h), read at each call */
static uint64_t emu_algos() {
  const char *v = std::getenv("KCU_EMU_LT_ALGOS");
  const long n = v ? std::strtol(v, nullptr, 10) : 1;
  return n >= 1 && n <= 8 ? (uint64_t)n : 1;
}
static bool emu_slow(uint64_t algo) {
  const char *v = std::getenv("KCU_EMU_LT_SLOW");
  return v && *v && std::strtoull(v, nullptr, 10) == algo;
}

extern "C" size_t cublasLtGetVersion(void) { return 1; }

extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new KcuLtHandle{1};
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d,
                                                   cublasComputeType_t compute,
                                                   cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  if (scale != CUDA_R_32F ||
      (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_16BF &&
       compute != CUBLAS_COMPUTE_32F_FAST_TF32))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = new KcuLtDesc{compute, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, -1,
                     NULL, 0};
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                         cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size) {
  if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER) {
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&d->bias, buf, sizeof d->bias);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER) {
    if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&d->aux, buf, sizeof d->aux);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) {
    if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&d->aux_ld, buf, sizeof d->aux_ld);
    return CUBLAS_STATUS_SUCCESS; /* (checked by the heuristic and the call) */
  }
  if (attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) {
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&d->bias_type, buf, sizeof d->bias_type);
    return CUBLAS_STATUS_SUCCESS; /* (checked by the heuristic and the call) */
  }
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE) {
    if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&d->epilogue, buf, sizeof d->epilogue);
    return CUBLAS_STATUS_SUCCESS; /* (an unknown one fails the heuristic and the call) */
  }
  if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t v;
  std::memcpy(&v, buf, sizeof v);
  if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
  (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)v;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l,
                                                     cudaDataType_t type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < 1 || (uint64_t)ld < rows) return CUBLAS_STATUS_INVALID_VALUE; /* column-major */
  *l = new KcuLtLayout{type, rows, cols, ld, 1, 0};
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                           cublasLtMatrixLayoutAttribute_t attr,
                                                           const void *buf, size_t size) {
  if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) {
    int32_t v;
    std::memcpy(&v, buf, sizeof v);
    if (v < 1) return CUBLAS_STATUS_INVALID_VALUE;
    l->batch = v;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) {
    std::memcpy(&l->stride, buf, sizeof l->stride);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new KcuLtPref{0};
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                     cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                     size_t size) {
  if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&p->workspace, buf, sizeof p->workspace);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
    return size == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

/* The GEMM's shape from the layouts, or a status: op(A) [m, k], op(B) [k, n],
 * C and D [m, n], equal batch counts. */
struct Shape {
  uint64_t m, n, k;
  int32_t batch;
};
static cublasStatus_t shape_of(const KcuLtDesc *d, const KcuLtLayout *a, const KcuLtLayout *b,
                               const KcuLtLayout *c, const KcuLtLayout *o, Shape *s) {
  if (!d || !a || !b || !c || !o) return CUBLAS_STATUS_INVALID_VALUE;
  s->m = d->ta == CUBLAS_OP_T ? a->cols : a->rows;
  s->k = d->ta == CUBLAS_OP_T ? a->rows : a->cols;
  uint64_t bk = d->tb == CUBLAS_OP_T ? b->cols : b->rows;
  s->n = d->tb == CUBLAS_OP_T ? b->rows : b->cols;
  if (bk != s->k || c->rows != s->m || c->cols != s->n || o->rows != s->m || o->cols != s->n)
    return CUBLAS_STATUS_INVALID_VALUE;
  /* fp32 x fp32 -> fp32, bf16 x bf16 -> fp32 or bf16 (C as D) */
  if (a->type != b->type || c->type != o->type ||
      (o->type != CUDA_R_32F && !(o->type == CUDA_R_16BF && a->type == CUDA_R_16BF)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->batch != o->batch || b->batch != o->batch || c->batch != o->batch)
    return CUBLAS_STATUS_INVALID_VALUE;
  s->batch = o->batch;
  if (d->epilogue == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
  const bool gelu_aux = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (gelu_aux || d->epilogue == CUBLASLT_EPILOGUE_DGELU) { /* the aux matrix, as cublasLt.h says */
    if (s->batch != 1 || d->aux_ld < (int64_t)o->rows || d->aux_ld % 8)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!d->aux) return CUBLAS_STATUS_INVALID_VALUE;
    if (!gelu_aux) return CUBLAS_STATUS_SUCCESS;
  }
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS || gelu_aux) { /* the vector, as cublasLt.h says */
    const int32_t t = d->bias_type < 0 ? (int32_t)o->type : d->bias_type;
    if (s->batch != 1 || (t != CUDA_R_32F && t != CUDA_R_16BF)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return d->bias ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  }
  /* BGRADA, as cublasLt.h says: an fp32 vector of D's rows */
  if (d->epilogue != CUBLASLT_EPILOGUE_BGRADA || d->ta != CUBLAS_OP_N || s->batch != 1 ||
      o->type != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!d->bias) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                               cublasLtMatrixLayout_t o, cublasLtMatmulPreference_t p,
                               int requested, cublasLtMatmulHeuristicResult_t *res, int *found) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!p || requested < 1 || !res || !found) return CUBLAS_STATUS_INVALID_VALUE;
  *found = 0;
  Shape s;
  cublasStatus_t st = shape_of(d, a, b, c, o, &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st == CUBLAS_STATUS_INVALID_VALUE ? st : CUBLAS_STATUS_NOT_SUPPORTED;
  const char *no = std::getenv("KCU_EMU_LT_NO_BGRAD");
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && no && !std::strcmp(no, "1"))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const int n = (int)std::min<uint64_t>(emu_algos(), (uint64_t)requested);
  for (int i = 0; i < n; i++) {
    std::memset(&res[i], 0, sizeof res[i]);
    res[i].algo.data[0] = ALGO_MARK;
    res[i].algo.data[1] = (uint64_t)i;
    res[i].state = CUBLAS_STATUS_SUCCESS;
    res[i].wavesCount = 1.0f;
  }
  *found = n;
  return CUBLAS_STATUS_SUCCESS;
}

/* x rounded as the compute type rounds fp32 operands. */
static float round_operand(float x, cublasComputeType_t compute) {
  if (compute == CUBLAS_COMPUTE_32F_FAST_16BF) return __bfloat162float(__float2bfloat16_rn(x));
  if (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && std::isfinite(x)) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x1000u) & ~0x1fffu; /* 10 fraction bits, to nearest, ties away */
    std::memcpy(&x, &u, 4);
  }
  return x;
}

/* Element at of an array of type (fp32 or bf16), as a float; v stored there
 * (a bf16 rounded to nearest even). */
static float load_at(const void *base, int32_t type, int64_t at) {
  if (type == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)base)[at]);
  return ((const float *)base)[at];
}
static void store_at(void *base, int32_t type, int64_t at, float v) {
  if (type == CUDA_R_16BF) ((__nv_bfloat16 *)base)[at] = __float2bfloat16_rn(v);
  else ((float *)base)[at] = v;
}

/* Element (r, c) of a column-major operand of batch member i, as a float. */
static float load(const void *base, const KcuLtLayout &l, int32_t i, uint64_t r, uint64_t c) {
  return load_at(base, l.type, (int64_t)i * l.stride + (int64_t)c * l.ld + (int64_t)r);
}

/* The IR's tanh gelu and its derivative in fp32, in the generated kernels'
 * order (cublasLt.h). */
static float gelu_tanh(float x) {
  return std::tanh(0.797884583f * (x + 0.0447149985f * x * x * x));
}
static float gelu(float x) { return 0.5f * x * (1.0f + gelu_tanh(x)); }
static float gelu_grad(float x) {
  const float t = gelu_tanh(x);
  return 0.5f * (1.0f + t) +
         0.5f * x * (1.0f - t * t) * 0.797884583f * (1.0f + 0.134145007f * x * x);
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                         const void *alpha, const void *A,
                                         cublasLtMatrixLayout_t ad, const void *B,
                                         cublasLtMatrixLayout_t bd, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t cd, void *D,
                                         cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *algo,
                                         void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  (void)workspace, (void)workspace_bytes;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!alpha || !beta || !A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo && (algo->data[0] != ALGO_MARK || algo->data[1] >= emu_algos()))
    return CUBLAS_STATUS_INVALID_VALUE;
  const uint64_t variant = algo ? algo->data[1] : 0; /* cublasLt.h: k in variant + 1 chunks */
  const bool slow = emu_slow(variant);
  Shape s;
  cublasStatus_t st = shape_of(d, ad, bd, cd, dd, &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  float al, be;
  std::memcpy(&al, alpha, 4);
  std::memcpy(&be, beta, 4);
  if (be != 0.0f && !C) return CUBLAS_STATUS_INVALID_VALUE;
  const KcuLtDesc desc = *d;
  const KcuLtLayout la = *ad, lb = *bd, lc = *cd, lo = *dd;
  /* per member, per column j of D: acc[i] += op(A)[i, p] op(B)[p, j] for p = 0,
   * 1, ..., k - 1 (each element summed in increasing p) */
  auto run = [=]() {
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<float> acc(s.m), part(s.m), col(s.k);
    const uint64_t chunk = (s.k + variant) / (variant + 1); /* variant 0: all of k */
    const bool ta = desc.ta == CUBLAS_OP_T, tb = desc.tb == CUBLAS_OP_T;
    const bool gelu_aux = desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (desc.epilogue == CUBLASLT_EPILOGUE_BGRADA) /* (shape_of: A not transposed, one member) */
      for (uint64_t i = 0; i < s.m; i++) {
        float sum = 0.0f;
        for (uint64_t p = 0; p < s.k; p++) sum += round_operand(load(A, la, 0, i, p), desc.compute);
        ((float *)desc.bias)[i] = sum;
      }
    for (int32_t bi = 0; bi < s.batch; bi++)
      for (uint64_t j = 0; j < s.n; j++) {
        for (uint64_t p = 0; p < s.k; p++)
          col[p] = round_operand(tb ? load(B, lb, bi, j, p) : load(B, lb, bi, p, j), desc.compute);
        for (uint64_t i = 0; i < s.m; i++) acc[i] = part[i] = 0.0f;
        for (uint64_t p = 0; p < s.k; p++) {
          if (p && p % chunk == 0) /* a chunk's sum onto the others' (variant > 0) */
            for (uint64_t i = 0; i < s.m; i++) acc[i] += part[i], part[i] = 0.0f;
          const float bp = col[p];
          for (uint64_t i = 0; i < s.m; i++) {
            float ap = ta ? load(A, la, bi, p, i) : load(A, la, bi, i, p);
            part[i] += round_operand(ap, desc.compute) * bp;
          }
        }
        for (uint64_t i = 0; i < s.m; i++) acc[i] += part[i]; /* 0 + x: x, for variant 0 */
        /* D and aux of type bf16: the fp32 value rounded to nearest even; the
         * aux's of the one member (shape_of) */
        for (uint64_t i = 0; i < s.m; i++) {
          float v = be == 0.0f ? al * acc[i] : al * acc[i] + be * load(C, lc, bi, i, j);
          if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS || gelu_aux)
            v += load_at(desc.bias, desc.bias_type < 0 ? lo.type : desc.bias_type, (int64_t)i);
          const int64_t ax = (int64_t)j * desc.aux_ld + (int64_t)i;
          if (gelu_aux) {
            store_at(desc.aux, lo.type, ax, v);
            v = gelu(v);
          } else if (desc.epilogue == CUBLASLT_EPILOGUE_DGELU) {
            v = v * gelu_grad(load_at(desc.aux, lo.type, ax));
          }
          store_at(D, lo.type, (int64_t)bi * lo.stride + (int64_t)j * lo.ld + (int64_t)i, v);
        }
      }
  };
  if (kcu_emu_enqueue(stream, run)) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}
