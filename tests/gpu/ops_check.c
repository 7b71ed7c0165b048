/* tests/gpu/ops_check.c -- the GPU runtime's ops (runtime/cuda/rt_cuda.h)
 * against the CPU runtime's (rt_gemm.h, rt_attention.h, rt_route.h) on random
 * inputs, with their time and achieved FLOP/s or bandwidth.  Needs a GPU: run
 * by tests/gpu/check.sh, built (not run) by ctest everywhere CUDA is found.
 *
 *   gpu_ops_check            one table row per case; exit 0 iff all within tolerance
 *   gpu_ops_check --small    only the cases of a few thousand rows or less (no
 *                            GPT-2-sized ones): what the CPU emulation of the
 *                            CUDA runtime (tests/cuda/emu) runs in seconds
 *
 * Tolerance: relative L2 error (|gpu - cpu| / |cpu|) <= 1e-5 for fp32 (2e-5 for
 * the attention backward, whose sums run in another order).  The attention
 * backward runs three times: as the trainers call it, from the GPU forward's lse
 * and D (sdpa_grad (lse, D)), D by rt_cuda_sdpa_delta from the merged GPU out and
 * dy ([B, T, H hd], as merge_heads lays them out; the "sdpa_delta" row, against
 * rt_sdpa_delta on the same merged tensors); from the forward's out and lse
 * (sdpa_grad); and recomputing them (sdpa_grad (recomputed)).  Two ranks as
 * threads on the one GPU (the host-staged backend) check the vocabulary-parallel
 * cross-entropy and embedding against the CPU's at two members.  The
 * cross-entropy gradients again in place (dlogits == logits, as parc's buffer
 * plan calls them: IR_F_INPLACE0) must give the out-of-place device result bit
 * for bit (the "in place" rows: the fraction of floats that differ, 0).
 *
 * The "bf16 tc" attention rows run a second context in GEMM mode bf16, where
 * sdpa and sdpa_grad take the tensor-core kernels (rt_cuda_attn_mma.cu; the
 * "wmma" rows rt_cuda_attn_tc.cu's, PARC_CUDA_ATTN=wmma, for comparison; with
 * PARC_CUDA_ATTN=fp32 the fp32 kernels, which pass too).  Their error is
 * max |gpu - cpu| / max |cpu|, taken separately over out, dq, dk and dv, the
 * worst shown (with lse's max absolute error in the forward's), against 2e-2:
 * q, k, v, dy and the probabilities and score gradients are rounded to bf16
 * (2^-9 relative each), which on these inputs costs ~5e-3; a wrong row or
 * tile (mask, tail, head) costs O(1).  The "bf16 io" rows (check_attn_io) call
 * the same kernels with tensors stored as bf16, as a bf16 trainer does, and
 * compare bits with the plain calls (tolerance 0); their "mma4" and "split"
 * rows (check_attn_variant) the 4-warp blocks' and the two-kernel backward's
 * results with the default's (the forward's bits; dk, dv bits and dq within
 * 1e-2 of the largest: dqkv_bf16_vs), and time them.  "sdpa_grad (dq
 * launches)" (check_attn_dq_launches): the fused backward in a context whose
 * planned dq scratch holds one kv group (a launch a group) or none (the split
 * kernels), against the unplanned default's.
 * The "token-major" rows
 * (check_attn_layout) hold each kernel family's token-major out, dy and dqkv
 * to its head-major results moved, bit for bit.  The "matmul_ta+bgrad" rows
 * (check_mm_bgrad): a weight gradient with its bias gradient; "matmul+bias"
 * (check_mm_bias): a product with its bias added; "matmul+gelu" and
 * "matmul+dgelu" (check_mm_gelu): GPT-2's MLP GEMMs with gelu or its gradient
 * in cuBLASLt's epilogue, or the caller's plain product where it has none. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda.h"
#include "runtime/rt_attention.h"
#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_gemm.h"
#include "runtime/rt_pool.h"
#include "runtime/rt_route.h"

static int failures;

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rnd(int64_t n, float scale) {
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
  return x;
}
static void *dev_copy(const void *h, size_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess ||
      (h && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)) {
    fprintf(stderr, "cudaMalloc/cudaMemcpy failed\n");
    exit(2);
  }
  return d;
}
static void to_host(void *h, const void *d, size_t bytes) {
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "device error: %s\n", cudaGetErrorString(cudaGetLastError()));
    exit(2);
  }
}
static double rel_l2(const float *a, const float *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * (double)ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The fraction of a's floats whose bits differ from b's (0: bit for bit). */
static double differing(const float *a, const float *b, int64_t n) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += memcmp(&a[i], &b[i], 4) != 0;
  return (double)k / (double)(n ? n : 1);
}

/* bf16 of f, rounded to nearest even (not NaN): what the GPU's
 * __float2bfloat16_rn gives */
static uint16_t bf16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f's value as a bf16 (rounded to nearest even), in fp32 */
static float bf16_val(float f) {
  const uint32_t u = (uint32_t)bf16_rn(f) << 16;
  memcpy(&f, &u, 4);
  return f;
}

/* x's first n bf16 elements (a bf16 result in the bytes of n floats) widened
 * into its n floats, in place (from the back) */
static void widen_bf16(float *x, int64_t n) {
  for (int64_t e = n - 1; e >= 0; e--) {
    const uint32_t u = (uint32_t)((const uint16_t *)x)[e] << 16;
    memcpy(&x[e], &u, 4);
  }
}

/* The share of rows x V values where the bf16 rows of 2 V (the dlogits of the
 * _bf16 cross-entropy gradients, rt_cuda.h) are not ref rounded to bf16. */
static double bf16_rows_differ(const void *got, int64_t ld, const float *ref, int64_t rows,
                               int64_t V) {
  const uint16_t *g = got;
  int64_t k = 0;
  for (int64_t p = 0; p < rows; p++)
    for (int64_t v = 0; v < V; v++) k += g[p * ld + v] != bf16_rn(ref[p * V + v]);
  return (double)k / (double)(rows * V > 0 ? rows * V : 1);
}

/* Times `reps` calls of the op (ms per call) through events on its stream. */
typedef int (*OpFn)(RtCuda *c, void *arg);
static double time_op(RtCuda *c, OpFn fn, void *arg, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaStream_t st = rt_cuda_stream(c);
  fn(c, arg); /* warm-up (plans, workspace) */
  cudaEventRecord(a, st);
  for (int i = 0; i < reps; i++) fn(c, arg);
  cudaEventRecord(b, st);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

static void row(const char *op, const char *shape, double err, double tol, double ms,
                double flops, double bytes) {
  int ok = err <= tol && !isnan(err);
  failures += !ok;
  char perf[64] = "";
  if (flops > 0) snprintf(perf, sizeof perf, "%8.2f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  else if (bytes > 0) snprintf(perf, sizeof perf, "%8.1f GB/s", bytes / (ms * 1e-3) / 1e9);
  printf("%-22s %-30s %10.2e %-4s %9.4f ms  %s\n", op, shape, err, ok ? "ok" : "FAIL", ms, perf);
  fflush(stdout);
}

/* A row of a time alone (a variant of the row above it), not a check. */
static void time_row(const char *what, double ms, double flops) {
  printf("%-22s %-30s %10s %-4s %9.4f ms  %8.2f TFLOP/s\n", what, "", "", "", ms,
         flops / (ms * 1e-3) / 1e12);
}

/* ---- GEMM ---- */
typedef struct {
  float *out, *a, *b;
  int64_t batch, m, k, n;
  int flags, ta;
} Mm;
static int mm_gpu(RtCuda *c, void *p) {
  Mm *x = p;
  return (x->ta ? rt_cuda_matmul_ta : rt_cuda_matmul)(c, x->out, x->a, x->b, x->batch, x->m, x->k,
                                                      x->n, x->flags);
}
/* tol: relative L2 error against the CPU's fp32 GEMM (bf16 mode: operands
 * rounded to bf16, 8 significant bits, so about 3e-3 expected; 1e-2 allowed) */
static void check_mm(RtCuda *c, int64_t batch, int64_t m, int64_t k, int64_t n, int flags, int ta,
                     double tol) {
  int bb = (flags & RT_MM_B_BATCHED) != 0;
  int64_t na = batch * m * k, nb = (bb ? batch : 1) * k * n, no = batch * m * n;
  float *a = rnd(na, 1), *b = rnd(nb, 1), *ref = rnd(no, 1), *got = malloc(4 * (size_t)no);
  /* out starts as ref's random values: RT_MM_ACCUMULATE adds to them */
  Mm x = {dev_copy(ref, 4 * (size_t)no), dev_copy(a, 4 * (size_t)na), dev_copy(b, 4 * (size_t)nb),
          batch, m, k, n, flags, ta};
  (ta ? rt_matmul_ta : rt_matmul)(ref, a, b, batch, m, k, n, flags);
  double err = mm_gpu(c, &x) ? INFINITY : 0;
  to_host(got, x.out, 4 * (size_t)no);
  if (err == 0) err = rel_l2(got, ref, no);
  else fprintf(stderr, "%s\n", rt_last_error());
  double ms = time_op(c, mm_gpu, &x, 10);
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld%s%s%s", (long long)batch, (long long)m,
           (long long)k, (long long)n, flags & RT_MM_TRANSPOSE_B ? " tb" : "", bb ? " bb" : "",
           flags & RT_MM_ACCUMULATE ? " +=" : "");
  row(ta ? (tol > 1e-4 ? "matmul_ta (bf16)" : "matmul_ta") : (tol > 1e-4 ? "matmul (bf16)" : "matmul"),
      shape, err, tol, ms, 2.0 * batch * m * k * n, 0);
  cudaFree(x.out), cudaFree(x.a), cudaFree(x.b);
  free(a), free(b), free(ref), free(got);
}

/* x [rows, cols] rounded to bf16 into rows of ld (cols or 2 cols: a stored
 * operand, RT_CUDA_MM_A_BF16 and _WIDE), on the device */
static void *dev_bf16(const float *x, int64_t rows, int64_t cols, int64_t ld) {
  uint16_t *h = calloc((size_t)(rows * ld), 2);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) h[r * ld + j] = bf16_rn(x[r * cols + j]);
  void *d = dev_copy(h, 2 * (size_t)(rows * ld));
  free(h);
  return d;
}

/* A GEMM reading operands stored as bf16 (stored: RT_CUDA_MM_A_BF16 etc.,
 * cb in GEMM mode bf16) against the same GEMM converting fp32 operands:
 * the same bits (share of results differing, tolerance 0), both timed. */
static void check_mm_stored(RtCuda *cb, int64_t m, int64_t k, int64_t n, int flags, int ta,
                            int stored) {
  int tb = (flags & RT_MM_TRANSPOSE_B) != 0;
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  float *a = rnd(ar * ac, 1), *b = rnd(br * bc, 1), *ref = malloc(4 * (size_t)(m * n)),
        *got = malloc(4 * (size_t)(m * n));
  Mm x = {dev_copy(NULL, 4 * (size_t)(m * n)), dev_copy(a, 4 * (size_t)(ar * ac)),
          dev_copy(b, 4 * (size_t)(br * bc)), 1, m, k, n, flags, ta};
  double err = mm_gpu(cb, &x) ? INFINITY : 0;
  to_host(ref, x.out, 4 * (size_t)(m * n));
  double ms_conv = time_op(cb, mm_gpu, &x, 10);
  Mm y = x;
  y.flags = flags | stored;
  if (stored & RT_CUDA_MM_A_BF16)
    y.a = dev_bf16(a, ar, ac, (stored & RT_CUDA_MM_A_WIDE) ? 2 * ac : ac);
  if (stored & RT_CUDA_MM_B_BF16)
    y.b = dev_bf16(b, br, bc, (stored & RT_CUDA_MM_B_WIDE) ? 2 * bc : bc);
  if (err == 0) err = mm_gpu(cb, &y) ? INFINITY : 0;
  to_host(got, y.out, 4 * (size_t)(m * n));
  if (err == 0) err = differing(got, ref, m * n);
  else fprintf(stderr, "%s\n", rt_last_error());
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lld%s %s%s%s", (long long)m, (long long)k,
           (long long)n, tb ? " tb" : "", (stored & RT_CUDA_MM_A_BF16) ? "a" : "",
           (stored & RT_CUDA_MM_A_WIDE) ? "(2x)" : "", (stored & RT_CUDA_MM_B_BF16) ? "b" : "");
  row(ta ? "matmul_ta (bf16 stored)" : "matmul (bf16 stored)", shape, err, 0,
      time_op(cb, mm_gpu, &y, 10), 2.0 * m * k * n, 0);
  time_row("  the same converting", ms_conv, 2.0 * m * k * n);
  if (y.a != x.a) cudaFree(y.a);
  if (y.b != x.b) cudaFree(y.b);
  cudaFree(x.out), cudaFree(x.a), cudaFree(x.b);
  free(a), free(b), free(ref), free(got);
}

/* A GEMM writing its result as bf16 (RT_CUDA_MM_C_BF16, cb in GEMM mode bf16)
 * and its reference (RT_CUDA_MM_C_ROUND) against the same GEMM writing fp32:
 * the reference is that result rounded to bf16, bit for bit (share of results
 * differing, tolerance 0); the bf16 result is within bf16's rounding of it
 * (relative L2; the same bits in the emulation, cuBLASLt may pick another
 * algorithm for a bf16 D).  Both timed beside the fp32 result. */
static void check_mm_out(RtCuda *cb, int64_t m, int64_t k, int64_t n, int flags, int ta) {
  int tb = (flags & RT_MM_TRANSPOSE_B) != 0;
  int64_t na = ta ? k * m : m * k, nb = k * n, no = m * n;
  float *a = rnd(na, 1), *b = rnd(nb, 1), *ref = malloc(4 * (size_t)no),
        *got = malloc(4 * (size_t)no);
  uint16_t *h = malloc(2 * (size_t)no);
  Mm x = {dev_copy(NULL, 4 * (size_t)no), dev_copy(a, 4 * (size_t)na), dev_copy(b, 4 * (size_t)nb),
          1, m, k, n, flags, ta};
  double err = mm_gpu(cb, &x) ? INFINITY : 0;
  to_host(ref, x.out, 4 * (size_t)no);
  double ms_f32 = time_op(cb, mm_gpu, &x, 10);
  for (int64_t i = 0; i < no; i++) { /* ref: its values rounded to bf16 */
    uint32_t u = (uint32_t)bf16_rn(ref[i]) << 16;
    memcpy(&ref[i], &u, 4);
  }
  Mm y = x, z = x;
  y.flags = flags | RT_CUDA_MM_C_ROUND;
  z.flags = flags | RT_CUDA_MM_C_BF16;
  z.out = dev_copy(NULL, 2 * (size_t)no);
  double err_z = err;
  if (err == 0) err = mm_gpu(cb, &y) ? INFINITY : 0;
  to_host(got, y.out, 4 * (size_t)no);
  if (err == 0) err = differing(got, ref, no);
  if (err_z == 0) err_z = mm_gpu(cb, &z) ? INFINITY : 0;
  to_host(h, z.out, 2 * (size_t)no);
  for (int64_t i = 0; i < no; i++) {
    uint32_t u = (uint32_t)h[i] << 16;
    memcpy(&got[i], &u, 4);
  }
  if (err_z == 0) err_z = rel_l2(got, ref, no);
  if (isinf(err) || isinf(err_z)) fprintf(stderr, "%s\n", rt_last_error());
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)m, (long long)k, (long long)n,
           tb ? " tb" : "");
  double flop = 2.0 * m * k * n;
  row(ta ? "matmul_ta (bf16 out)" : "matmul (bf16 out)", shape, err_z, 3e-3,
      time_op(cb, mm_gpu, &z, 10), flop, 0);
  row(ta ? "matmul_ta (rounded out)" : "matmul (rounded out)", shape, err, 0,
      time_op(cb, mm_gpu, &y, 10), flop, 0);
  time_row("  the same, fp32 out", ms_f32, flop);
  cudaFree(z.out), cudaFree(x.out), cudaFree(x.a), cudaFree(x.b);
  free(a), free(b), free(ref), free(got), free(h);
}

/* n floats of device result d (bf16 where bf16) to h as fp32 */
static void result_to_host(float *h, const void *d, int64_t n, int bf16) {
  to_host(h, d, 4 * (size_t)n);
  if (bf16) widen_bf16(h, n);
}
/* The share of n device floats at d not NaN (what the check set them to). */
static double touched(float *h, const void *d, int64_t n) {
  to_host(h, d, 4 * (size_t)n);
  int64_t k = 0;
  for (int64_t e = 0; e < n; e++) k += !isnan(h[e]);
  return (double)k / (double)n;
}

/* The product with the bias added (rt_cuda_matmul_bias; operands and result
 * bf16 where stored): where the epilogue added it (*done = 1) the result
 * against the plain product (the same call's other path) plus the bias in
 * fp32 on the host (relative L2; 1e-5, and 4e-3 for a bf16 result: cuBLASLt
 * may pick another algorithm for the epilogue or a bf16 D; the emulation
 * gives the same bits); else the result untouched ("by caller").  Timed
 * beside the plain GEMM. */
typedef struct {
  Mm mm;
  float *res, *bias;
  int out_flags, done;
} Mbias;
static int mbias_gpu(RtCuda *c, void *p) {
  Mbias *x = p;
  return rt_cuda_matmul_bias(c, x->res, x->mm.out, x->mm.a, x->mm.b, x->bias, 1, x->mm.m,
                             x->mm.k, x->mm.n, x->mm.flags, x->out_flags, &x->done);
}
static void check_mm_bias(RtCuda *c, int64_t m, int64_t k, int64_t n, int stored) {
  float *a = rnd(m * k, 1), *b = rnd(k * n, 1), *bias = rnd(n, 1);
  float *plain = malloc(4 * (size_t)(m * n)), *got = malloc(4 * (size_t)(m * n));
  const int fl = stored ? RT_CUDA_MM_A_BF16 | RT_CUDA_MM_B_BF16 : 0;
  Mbias x = {{dev_copy(NULL, 4 * (size_t)(m * n)), stored ? dev_bf16(a, m, k, k) : dev_copy(a, 4 * (size_t)(m * k)),
              stored ? dev_bf16(b, k, n, n) : dev_copy(b, 4 * (size_t)(k * n)), 1, m, k, n, fl, 0},
             dev_copy(NULL, 4 * (size_t)(m * n)), dev_copy(bias, 4 * (size_t)n),
             stored ? RT_CUDA_MM_C_BF16 : 0, -1};
  cudaMemset(x.res, 0xff, 4 * (size_t)(m * n));
  double err = mbias_gpu(c, &x) ? INFINITY : 0;
  const int done = x.done;
  if (err == 0 && done == 1) {
    result_to_host(got, x.res, m * n, stored);
    if (mm_gpu(c, &x.mm)) err = INFINITY; /* the plain product, fp32 */
    to_host(plain, x.mm.out, 4 * (size_t)(m * n));
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) plain[i * n + j] += bias[j];
    if (err == 0) err = rel_l2(got, plain, m * n);
  } else if (err == 0) { /* by the caller: the result untouched */
    err = touched(got, x.res, m * n) > 0 ? 1 : 0;
  }
  if (isinf(err)) fprintf(stderr, "%s\n", rt_last_error());
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)m, (long long)k, (long long)n,
           stored ? " bf16" : "");
  const double flop = 2.0 * m * k * n;
  row(done == 1 ? "matmul+bias, epilogue" : "matmul+bias, by caller", shape, err,
      done == 1 && stored ? 4e-3 : done == 1 ? 1e-5 : 0, time_op(c, mbias_gpu, &x, 10), flop, 0);
  double ms = time_op(c, mm_gpu, &x.mm, 10);
  time_row("  the same, no bias", ms, flop);
  cudaFree(x.mm.out), cudaFree(x.mm.a), cudaFree(x.mm.b), cudaFree(x.res), cudaFree(x.bias);
  free(a), free(b), free(bias), free(plain), free(got);
}

/* GPT-2's MLP GEMMs with gelu in the epilogue (operands and results bf16
 * where stored): rt_cuda_matmul_gelu, the up-projection h = a b + bias to aux
 * and gelu(h) to out; rt_cuda_matmul_dgelu (dgelu), the backward's
 * dg = dy W^T (b transposed) times gelu'(aux) to out, aux a random h (of the
 * result's type).  Where the epilogue ran (*done = 1), out (and gelu's aux)
 * against the CPU's product of the same operand values (bf16 ones where
 * stored), bias, gelu and gelu' in double (ir/interp.c's tanh form) and the
 * rounding to the result's type: relative L2, the worse of out and aux,
 * within 4e-3 for bf16 (bf16's rounding, which may flip where the GPU's
 * sums differ), 1e-4 for fp32 (a GPU's epilogue may take its tanh from a
 * faster approximation than tanhf; the emulation's differ by 1e-7).  Else
 * ("by caller") the plain product against the CPU's (1e-5), and out and aux
 * untouched (err 1 if not).  Timed beside the plain GEMM with the same
 * result type. */
typedef struct {
  Mm mm; /* mm.out: the plain product where the epilogue cannot (fp32) */
  float *res, *aux, *bias;
  int out_flags, dgelu, done;
} Mgelu;
static int mgelu_gpu(RtCuda *c, void *p) {
  Mgelu *x = p;
  const Mm *y = &x->mm;
  if (x->dgelu)
    return rt_cuda_matmul_dgelu(c, x->res, y->out, y->a, y->b, x->aux, 1, y->m, y->k, y->n,
                                y->flags, x->out_flags, &x->done);
  return rt_cuda_matmul_gelu(c, x->res, x->aux, y->out, y->a, y->b, x->bias, 1, y->m, y->k, y->n,
                             y->flags, x->out_flags, &x->done);
}
/* The IR's tanh gelu and its derivative (ir/interp.c's, in double). */
static double gelu_ref(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double gelu_grad_ref(double x) {
  const double k = 0.7978845608028654, t = tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
/* v as the result stores it (bf16 or fp32), in fp32 */
static float stored_as(double v, int bf16) { return bf16 ? bf16_val((float)v) : (float)v; }
static void check_mm_gelu(RtCuda *c, int64_t m, int64_t k, int64_t n, int stored, int dgelu) {
  const int64_t no = m * n, br = dgelu ? n : k, bc = dgelu ? k : n; /* dgelu: W [n, k] */
  float *a = rnd(m * k, 1), *b = rnd(k * n, 1), *bias = rnd(n, 1), *h = rnd(no, 3);
  float *prod = malloc(4 * (size_t)no), *ref = malloc(4 * (size_t)no),
        *ref_aux = malloc(4 * (size_t)no), *got = malloc(4 * (size_t)no);
  double err_aux = 0; /* gelu's aux against ref_aux */
  for (int64_t i = 0; stored && i < m * k; i++) a[i] = bf16_val(a[i]); /* the values read */
  for (int64_t i = 0; stored && i < k * n; i++) b[i] = bf16_val(b[i]);
  for (int64_t i = 0; i < no; i++) h[i] = stored_as(h[i], stored);
  const int fl = (stored ? RT_CUDA_MM_A_BF16 | RT_CUDA_MM_B_BF16 : 0) |
                 (dgelu ? RT_MM_TRANSPOSE_B : 0);
  rt_matmul(prod, a, b, 1, m, k, n, fl & RT_MM_TRANSPOSE_B);
  for (int64_t e = 0; e < no; e++) {
    const double v = dgelu ? (double)prod[e] : (double)prod[e] + (double)bias[e % n];
    ref[e] = stored_as(dgelu ? v * gelu_grad_ref(h[e]) : gelu_ref(v), stored);
    ref_aux[e] = stored_as(v, stored); /* (gelu's) */
  }
  Mgelu x = {{dev_copy(NULL, 4 * (size_t)no),
              stored ? dev_bf16(a, m, k, k) : dev_copy(a, 4 * (size_t)(m * k)),
              stored ? dev_bf16(b, br, bc, bc) : dev_copy(b, 4 * (size_t)(k * n)), 1, m, k, n, fl,
              0},
             dev_copy(NULL, 4 * (size_t)no),
             !dgelu ? dev_copy(NULL, 4 * (size_t)no) /* gelu writes it */
             : stored ? dev_bf16(h, m, n, n)
                      : dev_copy(h, 4 * (size_t)no),
             dev_copy(bias, 4 * (size_t)n), stored ? RT_CUDA_MM_C_BF16 : 0, dgelu, -1};
  cudaMemset(x.res, 0xff, 4 * (size_t)no);
  if (!dgelu) cudaMemset(x.aux, 0xff, 4 * (size_t)no);
  double err = mgelu_gpu(c, &x) ? INFINITY : 0;
  const int done = x.done;
  if (err == 0 && done == 1) {
    result_to_host(got, x.res, no, stored);
    err = rel_l2(got, ref, no);
    if (!dgelu) result_to_host(got, x.aux, no, stored);
    if (!dgelu) err_aux = rel_l2(got, ref_aux, no);
  } else if (err == 0) { /* by the caller: the plain product, out and aux untouched */
    to_host(got, x.mm.out, 4 * (size_t)no);
    err = rel_l2(got, prod, no);
    if (touched(got, x.res, no) > 0 || (!dgelu && touched(got, x.aux, no) > 0)) err_aux = 1;
  }
  if (isinf(err)) fprintf(stderr, "%s\n", rt_last_error());
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lld%s%s", (long long)m, (long long)k, (long long)n,
           dgelu ? " tb" : "", stored ? " bf16" : "");
  const double flop = 2.0 * m * k * n;
  const char *op = dgelu ? (done == 1 ? "matmul+dgelu, epilogue" : "matmul+dgelu, by caller")
                         : (done == 1 ? "matmul+gelu, epilogue" : "matmul+gelu, by caller");
  row(op, shape, err > err_aux ? err : err_aux, done == 1 ? (stored ? 4e-3 : 1e-4) : 1e-5,
      time_op(c, mgelu_gpu, &x, 10), flop, 0);
  Mm y = x.mm; /* the plain GEMM, its result of the same type (into the fallback's buffer) */
  y.flags |= x.out_flags;
  double ms = time_op(c, mm_gpu, &y, 10);
  time_row("  the same, plain", ms, flop);
  cudaFree(x.mm.out), cudaFree(x.mm.a), cudaFree(x.mm.b), cudaFree(x.res), cudaFree(x.aux);
  cudaFree(x.bias);
  free(a), free(b), free(bias), free(h), free(prod), free(ref), free(ref_aux), free(got);
}

/* The weight gradient with its bias gradient (rt_cuda_matmul_ta_bgrad, dy
 * stored as bf16 where stored): dw = x^T dy against the CPU's (relative L2,
 * tol), and the bias: where the call summed (*done = 1, cuBLASLt's epilogue)
 * dy's column sums against the CPU's of the same values (relative L2 1e-5),
 * else the vector untouched (the trainer's kernel sums: "by the caller").
 * The row says which; the same GEMM without the bias is timed beside. */
typedef struct {
  Mm mm;
  float *bias;
  int done;
} Mb;
static int mb_gpu(RtCuda *c, void *p) {
  Mb *x = p;
  return rt_cuda_matmul_ta_bgrad(c, x->mm.out, x->mm.a, x->mm.b, x->bias, 1, x->mm.m, x->mm.k,
                                 x->mm.n, x->mm.flags, &x->done);
}
static void check_mm_bgrad(RtCuda *c, int64_t m, int64_t k, int64_t n, int stored, double tol) {
  float *a = rnd(k * m, 1), *b = rnd(k * n, 1), *ref = malloc(4 * (size_t)(m * n)),
        *got = malloc(4 * (size_t)(m * n)), *sums = malloc(4 * (size_t)n),
        *bias = malloc(4 * (size_t)n);
  for (int64_t i = 0; stored && i < k * n; i++) { /* the values the GEMM reads */
    uint32_t u = (uint32_t)bf16_rn(b[i]) << 16;
    memcpy(&b[i], &u, 4);
  }
  for (int64_t j = 0; j < n; j++) {
    double s = 0;
    for (int64_t p = 0; p < k; p++) s += b[p * n + j];
    sums[j] = (float)s, bias[j] = NAN;
  }
  rt_matmul_ta(ref, a, b, 1, m, k, n, 0);
  Mb x = {{dev_copy(NULL, 4 * (size_t)(m * n)), dev_copy(a, 4 * (size_t)(k * m)),
           stored ? dev_bf16(b, k, n, n) : dev_copy(b, 4 * (size_t)(k * n)), 1, m, k, n,
           stored ? RT_CUDA_MM_B_BF16 : 0, 1},
          dev_copy(bias, 4 * (size_t)n), -1};
  double err = mb_gpu(c, &x) ? INFINITY : 0, err_b = err;
  to_host(got, x.mm.out, 4 * (size_t)(m * n));
  to_host(bias, x.bias, 4 * (size_t)n);
  if (err == 0) err = rel_l2(got, ref, m * n);
  else fprintf(stderr, "%s\n", rt_last_error());
  int64_t nan = 0;
  for (int64_t j = 0; j < n; j++) nan += isnan(bias[j]) != 0;
  if (err_b == 0) err_b = x.done == 1 ? (nan ? INFINITY : rel_l2(bias, sums, n)) : nan == n ? 0 : 1;
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)m, (long long)k, (long long)n,
           stored ? " b" : "");
  double flop = 2.0 * m * k * n;
  row(stored ? "matmul_ta+bgrad (bf16)" : "matmul_ta+bgrad", shape, err, tol,
      time_op(c, mb_gpu, &x, 10), flop, 0);
  row(x.done == 1 ? "  bias grad, epilogue" : "  bias grad, by caller", "", err_b, 1e-5, 0, 0, 0);
  double ms = time_op(c, mm_gpu, &x.mm, 10);
  time_row("  the same, no bias", ms, flop);
  cudaFree(x.mm.out), cudaFree(x.mm.a), cudaFree(x.mm.b), cudaFree(x.bias);
  free(a), free(b), free(ref), free(got), free(sums), free(bias);
}

static int params_refresh(RtCuda *c, void *unused) {
  (void)unused;
  return rt_cuda_params_to_bf16(c);
}

/* The params' bf16 copy (RtCudaSetup.params_bf16, rt_cuda_params_to_bf16):
 * a context holding [pad | weight [k, n] | tail] as its params, a GEMM
 * reading the weight from the copy (RT_CUDA_MM_B_BF16, PB(offset) in a
 * trainer) against the same GEMM converting the fp32 weight: the same bits
 * (share of results differing, tolerance 0), the copy's refresh timed as
 * bytes (read 4, write 2 a parameter).  After the params change on the
 * device, a refresh follows them (the GEMM again, the same bits).  Also: the
 * copy's pointer past the params is NULL, a refresh without a copy fails. */
static void check_params_bf16(int64_t m, int64_t k, int64_t n, int flags) {
  int tb = (flags & RT_MM_TRANSPOSE_B) != 0;
  const int64_t off = 48, numel = off + k * n + 13; /* (leaf offsets: multiples of 16) */
  float *params = rnd(numel, 1), *a = rnd(m * k, 1), *ref = malloc(4 * (size_t)(m * n)),
        *got = malloc(4 * (size_t)(m * n));
  RtCudaSetup s = {.params_numel = numel, .state_numel = 1, .arena_bytes = 64, .rows = 1,
                   .seq = 1, .tp = 1, .dp = 1, .gemm = RT_CUDA_GEMM_BF16, .model = "ops",
                   .params_bf16 = 1};
  RtCuda *c, *none;
  char shape[96];
  snprintf(shape, sizeof shape, "%lldx%lldx%lld%s", (long long)m, (long long)k, (long long)n,
           tb ? " tb" : "");
  if (rt_cuda_open(&c, &s, params, NULL)) {
    fprintf(stderr, "params_bf16: %s\n", rt_last_error());
    rt_cuda_close(c);
    row("matmul (bf16 weights)", shape, INFINITY, 0, 0, 0, 0);
    return;
  }
  Mm x = {dev_copy(NULL, 4 * (size_t)(m * n)), dev_copy(a, 4 * (size_t)(m * k)),
          rt_cuda_params(c) + off, 1, m, k, n, flags, 0};
  Mm y = x;
  y.b = (float *)rt_cuda_params_bf16(c, off);
  y.flags = flags | RT_CUDA_MM_B_BF16;
  double err = !y.b || rt_cuda_params_to_bf16(c) || mm_gpu(c, &x) ? INFINITY : 0;
  to_host(ref, x.out, 4 * (size_t)(m * n));
  if (err == 0) err = mm_gpu(c, &y) ? INFINITY : 0;
  to_host(got, y.out, 4 * (size_t)(m * n));
  if (err == 0) err = differing(got, ref, m * n);
  /* the params move (as an update moves them): the refreshed copy follows */
  for (int64_t i = 0; i < numel; i++) params[i] *= -0.75f;
  if (err == 0 && cudaMemcpy(rt_cuda_params(c), params, 4 * (size_t)numel,
                             cudaMemcpyHostToDevice) != cudaSuccess)
    err = INFINITY;
  if (err == 0) err = rt_cuda_params_to_bf16(c) || mm_gpu(c, &x) ? INFINITY : 0;
  to_host(ref, x.out, 4 * (size_t)(m * n));
  if (err == 0) err = mm_gpu(c, &y) ? INFINITY : 0;
  to_host(got, y.out, 4 * (size_t)(m * n));
  if (err == 0) err = differing(got, ref, m * n);
  if (isinf(err)) fprintf(stderr, "%s\n", rt_last_error());
  row("matmul (bf16 weights)", shape, err, 0, time_op(c, mm_gpu, &y, 10), 2.0 * m * k * n, 0);
  double past = rt_cuda_params_bf16(c, numel) || rt_cuda_params_bf16(c, -1) ? 1 : 0;
  row("params_to_bf16", "", past, 0, time_op(c, params_refresh, NULL, 10), 0, 6.0 * numel);
  rt_cuda_close(c);
  s.params_bf16 = 0; /* no copy: no pointer, a refresh refused */
  double refused = 1;
  if (!rt_cuda_open(&none, &s, params, NULL))
    refused = !rt_cuda_params_bf16(none, off) && rt_cuda_params_to_bf16(none) ? 0 : 1;
  rt_cuda_close(none);
  row("params_to_bf16 refused", "(no copy)", refused, 0, 0, 0, 0);
  cudaFree(x.out), cudaFree(x.a);
  free(params), free(a), free(ref), free(got);
}

/* ---- attention ---- */
typedef struct {
  float *out, *q, *k, *v, *dy, *dqkv;
  int64_t B, H, KV, T, hd;
  float scale;
  int causal;
  float *lse; /* NULL: not asked for */
  int kept;   /* at_bwd passes: 2 the forward's lse and d (at_delta), 1 its out and lse
                 (both computed by at_fwd), 0 neither (recomputed) */
  float *m, *dm, *d; /* merged out and dy [B, T, H hd]; D [B, H, T] */
} At;
static int at_fwd(RtCuda *c, void *p) {
  At *x = p;
  return rt_cuda_sdpa(c, x->out, x->lse, x->q, x->k, x->v, x->B, x->H, x->KV, x->T, x->hd,
                      x->scale, x->causal);
}
static int at_delta(RtCuda *c, void *p) {
  At *x = p;
  return rt_cuda_sdpa_delta(c, x->d, x->m, x->dm, x->B, x->H, x->T, x->hd);
}
static int at_bwd(RtCuda *c, void *p) {
  At *x = p;
  if (x->kept == 2)
    return rt_cuda_sdpa_grad_stats(c, x->dqkv, x->q, x->k, x->v, x->dy, x->lse, x->d, x->B, x->H,
                                   x->KV, x->T, x->hd, x->scale, x->causal);
  return rt_cuda_sdpa_grad(c, x->dqkv, x->q, x->k, x->v, x->dy, x->kept ? x->out : NULL,
                           x->kept ? x->lse : NULL, x->B, x->H, x->KV, x->T, x->hd, x->scale,
                           x->causal);
}
/* merge_heads: dst[b, t, c, :] = src[b, c, t, :] over C channels of hd
 * elements of esz bytes (fp32 or bf16 elements, moved bytewise) */
static void merge_bytes(void *dst, const void *src, int64_t B, int64_t C, int64_t T, int64_t hd,
                        size_t esz) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < T; t++)
        memcpy((char *)dst + (size_t)(((b * T + t) * C + c) * hd) * esz,
               (const char *)src + (size_t)(((b * C + c) * T + t) * hd) * esz,
               esz * (size_t)hd);
}

/* x->m, x->dm: the merged GPU out (x->out) and dy (host copy dy); x->d = D by
 * rt_cuda_sdpa_delta, checked against rt_sdpa_delta (the "sdpa_delta" row when
 * tol > 0). */
static void attn_delta(RtCuda *c, At *x, const float *dy, const char *shape, double tol) {
  int64_t nq = x->B * x->H * x->T * x->hd, nl = x->B * x->H * x->T;
  float *o = malloc(4 * (size_t)nq), *mo = malloc(4 * (size_t)nq), *mdy = malloc(4 * (size_t)nq);
  float *dref = malloc(4 * (size_t)nl), *dgot = malloc(4 * (size_t)nl);
  to_host(o, x->out, 4 * (size_t)nq);
  merge_bytes(mo, o, x->B, x->H, x->T, x->hd, 4);
  merge_bytes(mdy, dy, x->B, x->H, x->T, x->hd, 4);
  x->m = dev_copy(mo, 4 * (size_t)nq), x->dm = dev_copy(mdy, 4 * (size_t)nq);
  x->d = dev_copy(NULL, 4 * (size_t)nl);
  rt_sdpa_delta(dref, mo, mdy, x->B, x->H, x->T, x->hd);
  double err = at_delta(c, x) ? INFINITY : 0;
  if (err == 0) {
    to_host(dgot, x->d, 4 * (size_t)nl);
    err = rel_l2(dgot, dref, nl);
  } else fprintf(stderr, "%s\n", rt_last_error());
  if (tol > 0)
    row("sdpa_delta", shape, err, tol, time_op(c, at_delta, x, 5), 0, 4.0 * (double)(2 * nq + nl));
  free(o), free(mo), free(mdy), free(dref), free(dgot);
}

static void check_attn(RtCuda *c, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                       int causal) {
  int64_t nq = B * H * T * hd, nk = B * KV * T * hd, ng = B * (H + 2 * KV) * T * hd;
  float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *dy = rnd(nq, 1);
  float *ref = malloc(4 * (size_t)ng), *got = malloc(4 * (size_t)ng);
  float scale = 1.0f / sqrtf((float)hd);
  At x = {dev_copy(NULL, 4 * (size_t)nq), dev_copy(q, 4 * (size_t)nq), dev_copy(k, 4 * (size_t)nk),
          dev_copy(v, 4 * (size_t)nk), dev_copy(dy, 4 * (size_t)nq), dev_copy(NULL, 4 * (size_t)ng),
          B, H, KV, T, hd, scale, causal, dev_copy(NULL, 4 * (size_t)(B * H * T)), 0, NULL, NULL,
          NULL};
  char shape[96];
  snprintf(shape, sizeof shape, "B%lld H%lld KV%lld T%lld hd%lld%s", (long long)B, (long long)H,
           (long long)KV, (long long)T, (long long)hd, causal ? " causal" : "");
  double fl = 4.0 * B * H * T * T * hd * (causal ? 0.5 : 1.0);
  rt_sdpa(ref, NULL, q, k, v, B, H, KV, T, hd, scale, causal);
  double err = at_fwd(c, &x) ? INFINITY : 0; /* leaves out and lse for the kept backward */
  to_host(got, x.out, 4 * (size_t)nq);
  if (err == 0) err = rel_l2(got, ref, nq);
  row("sdpa", shape, err, 1e-5, time_op(c, at_fwd, &x, 5), fl, 0);
  attn_delta(c, &x, dy, shape, 1e-5);
  rt_sdpa_grad(ref, q, k, v, dy, NULL, NULL, B, H, KV, T, hd, scale, causal);
  static const char *const name[3] = {"sdpa_grad (recomputed)", "sdpa_grad", "sdpa_grad (lse, D)"};
  for (x.kept = 2; x.kept >= 0; x.kept--) {
    err = at_bwd(c, &x) ? INFINITY : 0;
    to_host(got, x.dqkv, 4 * (size_t)ng);
    if (err == 0) err = rel_l2(got, ref, ng);
    row(name[x.kept], shape, err, 2e-5, time_op(c, at_bwd, &x, 5), 2.5 * fl, 0);
  }
  cudaFree(x.out), cudaFree(x.q), cudaFree(x.k), cudaFree(x.v), cudaFree(x.dy), cudaFree(x.dqkv);
  cudaFree(x.lse), cudaFree(x.m), cudaFree(x.dm), cudaFree(x.d);
  free(q), free(k), free(v), free(dy), free(ref), free(got);
}

/* max |a - ref| / max |ref| over channels [c0, c1) of n [B, C, T hd] tensors
 * (NaN anywhere: infinite) */
static double rel_max(const float *a, const float *ref, int64_t B, int64_t C, int64_t c0,
                      int64_t c1, int64_t thd) {
  double md = 0, mr = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = (b * C + c0) * thd; i < (b * C + c1) * thd; i++) {
      if (isnan(a[i])) return INFINITY;
      md = fmax(md, fabs((double)a[i] - (double)ref[i]));
      mr = fmax(mr, fabs((double)ref[i]));
    }
  return md / (mr > 0 ? mr : 1);
}

/* The bf16 tensor-core path (cb: a context in GEMM mode bf16), tolerance 2e-2
 * (head comment). */
static void check_attn_bf16(RtCuda *cb, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                            int causal) {
  int64_t nq = B * H * T * hd, nk = B * KV * T * hd, ng = B * (H + 2 * KV) * T * hd, nl = B * H * T;
  float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *dy = rnd(nq, 1);
  float *ref = malloc(4 * (size_t)ng), *got = malloc(4 * (size_t)ng);
  float *lref = malloc(4 * (size_t)nl), *lgot = malloc(4 * (size_t)nl);
  float scale = 1.0f / sqrtf((float)hd);
  At x = {dev_copy(NULL, 4 * (size_t)nq), dev_copy(q, 4 * (size_t)nq), dev_copy(k, 4 * (size_t)nk),
          dev_copy(v, 4 * (size_t)nk), dev_copy(dy, 4 * (size_t)nq), dev_copy(NULL, 4 * (size_t)ng),
          B, H, KV, T, hd, scale, causal, dev_copy(NULL, 4 * (size_t)nl), 0, NULL, NULL, NULL};
  char shape[96];
  snprintf(shape, sizeof shape, "B%lld H%lld KV%lld T%lld hd%lld%s", (long long)B, (long long)H,
           (long long)KV, (long long)T, (long long)hd, causal ? " causal" : "");
  double fl = 4.0 * B * H * T * T * hd * (causal ? 0.5 : 1.0);
  rt_sdpa(ref, lref, q, k, v, B, H, KV, T, hd, scale, causal);
  double err = 0;
  for (int wmma = 1; wmma >= 0; wmma--) { /* the default last: x.out, x.lse stay its */
    if (wmma) setenv("PARC_CUDA_ATTN", "wmma", 1);
    err = at_fwd(cb, &x) ? INFINITY : 0;
    if (err == 0) {
      to_host(got, x.out, 4 * (size_t)nq);
      to_host(lgot, x.lse, 4 * (size_t)nl);
      err = rel_max(got, ref, B, H, 0, H, T * hd);
      for (int64_t i = 0; i < nl; i++)
        err = isnan(lgot[i]) ? INFINITY : fmax(err, fabs((double)lgot[i] - (double)lref[i]));
    } else fprintf(stderr, "%s\n", rt_last_error());
    const double ms = time_op(cb, at_fwd, &x, 5);
    if (wmma) unsetenv("PARC_CUDA_ATTN");
    row(wmma ? "sdpa (bf16 wmma)" : "sdpa (bf16 tc)", shape, err, 2e-2, ms, fl, 0);
  }
  attn_delta(cb, &x, dy, shape, 0); /* D of the tc forward's out */
  rt_sdpa_grad(ref, q, k, v, dy, NULL, NULL, B, H, KV, T, hd, scale, causal);
  static const char *const name[4] = {"sdpa_grad (bf16 tc, recomputed)", "sdpa_grad (bf16 tc)",
                                      "sdpa_grad (bf16 tc, lse, D)",
                                      "sdpa_grad (bf16 wmma, lse, D)"};
  /* x.out, x.lse: the tc forward's; kept 3: the WMMA backward (rt_cuda_attn_tc.cu) the
   * trainers' way (lse, D), for comparison with the default (rt_cuda_attn_mma.cu) */
  for (int pass = 3; pass >= 0; pass--) {
    x.kept = pass < 3 ? pass : 2;
    if (pass == 3) setenv("PARC_CUDA_ATTN", "wmma", 1);
    err = at_bwd(cb, &x) ? INFINITY : 0;
    if (err == 0) {
      int64_t C = H + 2 * KV;
      to_host(got, x.dqkv, 4 * (size_t)ng);
      err = fmax(rel_max(got, ref, B, C, 0, H, T * hd),
                 fmax(rel_max(got, ref, B, C, H, H + KV, T * hd),
                      rel_max(got, ref, B, C, H + KV, C, T * hd)));
    } else fprintf(stderr, "%s\n", rt_last_error());
    const double ms = time_op(cb, at_bwd, &x, 5);
    if (pass == 3) unsetenv("PARC_CUDA_ATTN");
    row(name[pass], shape, err, 2e-2, ms, 2.5 * fl, 0);
  }
  cudaFree(x.out), cudaFree(x.q), cudaFree(x.k), cudaFree(x.v), cudaFree(x.dy), cudaFree(x.dqkv);
  cudaFree(x.lse), cudaFree(x.m), cudaFree(x.dm), cudaFree(x.d);
  free(q), free(k), free(v), free(dy), free(ref), free(got), free(lref), free(lgot);
}

/* ---- attention reading and writing tensors stored as bf16 ---- */
/* x rounded to bf16 values (still fp32) */
static float *bf16_values(const float *x, int64_t n) {
  float *r = malloc(4 * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) r[i] = bf16_val(x[i]);
  return r;
}

/* The share of the n values where got (fp32, or bf16 where b16) is not ref
 * rounded to bf16 (0: bit for bit). */
static double rounded_differ(const void *got, int b16, const float *ref, int64_t n) {
  if (b16) return bf16_rows_differ(got, n, ref, 1, n);
  float *r = bf16_values(ref, n);
  double k = differing(got, r, n);
  free(r);
  return k;
}

typedef struct {
  void *q[2], *k[2], *v[2], *dy[2]; /* [0] fp32 (rounded values), [1] bf16 copies */
  float *out, *lse, *d, *dqkv;
  int64_t B, H, KV, T, hd;
  float scale;
  int causal;
  unsigned io;
} AtIo;
#define IO_IN(x, name, bit) ((x)->name[((x)->io & (bit)) != 0])

/* x's q, k, v, dy on the device from h (len elements each): [0] fp32 holding
 * h rounded to bf16 values, [1] the bf16 copies */
static void at_io_upload(AtIo *x, float *const h[4], const int64_t len[4]) {
  void **slot[4] = {x->q, x->k, x->v, x->dy};
  for (int i = 0; i < 4; i++) {
    float *r = bf16_values(h[i], len[i]);
    slot[i][0] = dev_copy(r, 4 * (size_t)len[i]);
    slot[i][1] = dev_bf16(h[i], 1, len[i], len[i]);
    free(r);
  }
}

/* frees at_io_upload's copies and the outputs */
static void at_io_free(AtIo *x) {
  void **slot[4] = {x->q, x->k, x->v, x->dy};
  for (int i = 0; i < 4; i++) cudaFree(slot[i][0]), cudaFree(slot[i][1]);
  cudaFree(x->out), cudaFree(x->lse), cudaFree(x->d), cudaFree(x->dqkv);
}
static int at_io_fwd(RtCuda *c, void *p) {
  AtIo *x = p;
  return rt_cuda_sdpa_io(c, x->out, x->lse, IO_IN(x, q, RT_CUDA_ATTN_Q_BF16),
                         IO_IN(x, k, RT_CUDA_ATTN_K_BF16), IO_IN(x, v, RT_CUDA_ATTN_V_BF16), x->B,
                         x->H, x->KV, x->T, x->hd, x->scale, x->causal, x->io);
}
static int at_io_bwd(RtCuda *c, void *p) {
  AtIo *x = p;
  return rt_cuda_sdpa_grad_stats_io(
      c, x->dqkv, IO_IN(x, q, RT_CUDA_ATTN_Q_BF16), IO_IN(x, k, RT_CUDA_ATTN_K_BF16),
      IO_IN(x, v, RT_CUDA_ATTN_V_BF16), IO_IN(x, dy, RT_CUDA_ATTN_DY_BF16), x->lse, x->d, x->B,
      x->H, x->KV, x->T, x->hd, x->scale, x->causal, x->io);
}

/* Two backward results of x's shape, bf16 dqkv [B, H + 2 KV, T, hd] (head-
 * major): dk and dv must be the same bits (one kernel computes them either
 * way), dq within 1e-2 of the other's largest (max |a - b| / max |b| over each
 * batch's dq): the fused backward (rt_cuda_attn_mma.cu) sums a row's dq over
 * key blocks of 16 W keys, the split one over tiles of 64 in one register, so
 * the fp32 sums round differently before the bf16 rounding.  Returns the
 * larger of the two errors (INFINITY where dk or dv differ). */
static double dqkv_bf16_vs(const AtIo *x, const uint16_t *a, const uint16_t *b) {
  const int64_t C = x->H + 2 * x->KV, per = x->T * x->hd, n = x->B * C * per;
  float *fa = malloc(4 * (size_t)n), *fb = malloc(4 * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
    memcpy(&fa[i], &ua, 4), memcpy(&fb[i], &ub, 4);
  }
  double err = rel_max(fa, fb, x->B, C, 0, x->H, per);
  for (int64_t bb = 0; bb < x->B; bb++)
    if (memcmp(a + (bb * C + x->H) * per, b + (bb * C + x->H) * per, 2 * (size_t)(2 * x->KV * per)))
      err = INFINITY;
  free(fa), free(fb);
  return err;
}

/* PARC_CUDA_ATTN=env against the default on x with inputs `in` read as bf16
 * and results written so: "mma4" (the mma kernels in 4-warp blocks; built for
 * hd 64 and 128 with bf16 tensors) forward and backward, "split" (the backward
 * as two kernels, dq's products again in the second) the backward.  The
 * forward's out and lse the same bits (a row's sums run in the same order); the
 * backward's as dqkv_bf16_vs; and its time, for the comparison ("sdpa (bf16
 * io)" rows: the default's). */
static void check_attn_variant(RtCuda *cb, AtIo *x, unsigned in, const char *shape, double fl,
                               const char *env) {
  const int mma4 = !strcmp(env, "mma4");
  if (mma4 && x->hd != 64 && x->hd != 128) return;
  const int64_t nl = x->B * x->H * x->T;
  const size_t nl4 = 4 * (size_t)nl;
  for (int grad = !mma4; grad < 2; grad++) {
    const OpFn fn = grad ? at_io_bwd : at_io_fwd;
    const size_t bytes = 2 * (size_t)(x->B * (grad ? x->H + 2 * x->KV : x->H) * x->T * x->hd);
    void *res = grad ? (void *)x->dqkv : (void *)x->out;
    unsigned char *a = malloc(bytes), *b = malloc(bytes), *la = malloc(nl4), *lb = malloc(nl4);
    x->io = (grad ? in : in & ~(unsigned)RT_CUDA_ATTN_DY_BF16) | RT_CUDA_ATTN_O_BF16;
    double err = fn(cb, x) ? INFINITY : 0;
    to_host(a, res, bytes);
    to_host(la, x->lse, nl4);
    setenv("PARC_CUDA_ATTN", env, 1);
    if (err == 0 && fn(cb, x)) {
      fprintf(stderr, "%s\n", rt_last_error());
      err = INFINITY;
    }
    to_host(b, res, bytes);
    to_host(lb, x->lse, nl4);
    if (err == 0)
      err = grad ? dqkv_bf16_vs(x, (const uint16_t *)b, (const uint16_t *)a)
                 : memcmp(a, b, bytes) != 0 || memcmp(la, lb, nl4) != 0;
    /* and it did run the 4-warp blocks (else the rows compare a kernel with itself) */
    if (mma4 && rt_cuda_attn_mma_warps(x->hd, x->io) != 4) err = INFINITY;
    const double ms = err < INFINITY ? time_op(cb, fn, x, 5) : 0;
    unsetenv("PARC_CUDA_ATTN");
    if (rt_cuda_attn_mma_warps(x->hd, x->io) != 8) err = INFINITY; /* the default's */
    char name[48];
    snprintf(name, sizeof name, "%s (bf16 io, %s)", grad ? "sdpa_grad" : "sdpa", env);
    row(name, shape, err, grad ? 1e-2 : 0, ms, grad ? 2.5 * fl : fl, 0);
    free(a), free(b), free(la), free(lb);
  }
}

/* rt_cuda_sdpa_io and rt_cuda_sdpa_grad_stats_io (cb in GEMM mode bf16) with
 * the inputs `in` (RT_CUDA_ATTN_{Q,K,V,DY}_BF16) read from bf16 copies and the
 * result written bf16, then with every input fp32 and the result rounded
 * (the --bf16-store round trainer's call), against the plain calls on the same
 * (bf16-exact) values: the results must be the plain ones rounded to bf16, bit
 * for bit (tolerance 0), and lse the same bits; PARC_CUDA_ATTN=wmma must refuse
 * them.  The tensor-core kernels round their inputs to bf16 anyway, so bf16
 * inputs change nothing but the bytes read. */
static void check_attn_io(RtCuda *cb, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                          int causal, unsigned in) {
  const int64_t nq = B * H * T * hd, nk = B * KV * T * hd, ng = B * (H + 2 * KV) * T * hd;
  const int64_t nl = B * H * T;
  float *h[4] = {rnd(nq, 1), rnd(nk, 1), rnd(nk, 1), rnd(nq, 1)}, *d = rnd(nl, 0.1f);
  const int64_t len[4] = {nq, nk, nk, nq};
  AtIo x = {{0}, {0}, {0}, {0}, dev_copy(NULL, 4 * (size_t)nq), dev_copy(NULL, 4 * (size_t)nl),
            dev_copy(d, 4 * (size_t)nl), dev_copy(NULL, 4 * (size_t)ng), B, H, KV, T, hd,
            1.0f / sqrtf((float)hd), causal, 0};
  at_io_upload(&x, h, len);
  float *ref = malloc(4 * (size_t)ng), *lref = malloc(4 * (size_t)nl);
  float *got = malloc(4 * (size_t)ng), *lgot = malloc(4 * (size_t)nl);
  char shape[96], name[48];
  snprintf(shape, sizeof shape, "B%lld H%lld KV%lld T%lld hd%lld%s", (long long)B, (long long)H,
           (long long)KV, (long long)T, (long long)hd, causal ? " causal" : "");
  const char *ins = in == (RT_CUDA_ATTN_Q_BF16 | RT_CUDA_ATTN_K_BF16 | RT_CUDA_ATTN_V_BF16 |
                           RT_CUDA_ATTN_DY_BF16) ? "all in" : "some in";
  const double fl = 4.0 * B * H * T * T * hd * (causal ? 0.5 : 1.0);
  for (int grad = 0; grad < 2; grad++) {
    const OpFn fn = grad ? at_io_bwd : at_io_fwd;
    const int64_t n = grad ? ng : nq;
    void *res = grad ? (void *)x.dqkv : (void *)x.out;
    x.io = 0; /* the plain call: the reference */
    double err = fn(cb, &x) ? INFINITY : 0;
    to_host(ref, res, 4 * (size_t)n);
    to_host(lref, x.lse, 4 * (size_t)nl);
    for (int stored = 0; stored < 2 && err == 0; stored++) {
      x.io = stored ? (in & (grad ? ~0u : ~(unsigned)RT_CUDA_ATTN_DY_BF16)) | RT_CUDA_ATTN_O_BF16
                    : RT_CUDA_ATTN_O_ROUND;
      if (fn(cb, &x)) {
        fprintf(stderr, "%s\n", rt_last_error());
        err = INFINITY;
        break;
      }
      to_host(got, res, (stored ? 2 : 4) * (size_t)n);
      err = fmax(err, rounded_differ(got, stored, ref, n));
      if (!grad) {
        to_host(lgot, x.lse, 4 * (size_t)nl);
        err = fmax(err, differing(lgot, lref, nl));
      }
    }
    const double ms = err == 0 ? time_op(cb, fn, &x, 5) : 0;
    snprintf(name, sizeof name, "%s (bf16 io, %s)", grad ? "sdpa_grad" : "sdpa", ins);
    row(name, shape, err, 0, ms, grad ? 2.5 * fl : fl, 0);
  }
  check_attn_variant(cb, &x, in, shape, fl, "mma4");
  check_attn_variant(cb, &x, in, shape, fl, "split");
  /* sdpa_delta with the merged out m and its gradient dm (here q's and dy's
   * values as [B, T, H hd]) read as bf16, both or one: the plain call's bits */
  float *dref = malloc(4 * (size_t)nl), *dgot = malloc(4 * (size_t)nl);
  double err = rt_cuda_sdpa_delta(cb, x.d, x.q[0], x.dy[0], B, H, T, hd) ? INFINITY : 0;
  to_host(dref, x.d, 4 * (size_t)nl);
  static const unsigned dio[3] = {RT_CUDA_ATTN_M_BF16 | RT_CUDA_ATTN_DM_BF16, RT_CUDA_ATTN_M_BF16,
                                  RT_CUDA_ATTN_DM_BF16};
  for (int i = 0; i < 3 && err == 0; i++) {
    const unsigned f = dio[i];
    if (rt_cuda_sdpa_delta_io(cb, x.d, x.q[(f & RT_CUDA_ATTN_M_BF16) != 0],
                              x.dy[(f & RT_CUDA_ATTN_DM_BF16) != 0], B, H, T, hd, f)) {
      fprintf(stderr, "%s\n", rt_last_error());
      err = INFINITY;
      break;
    }
    to_host(dgot, x.d, 4 * (size_t)nl);
    err = fmax(err, differing(dgot, dref, nl));
  }
  row("sdpa_delta (bf16 io)", shape, err, 0, 0, 0, 0);
  free(dref), free(dgot);
  /* the WMMA kernels read no bf16 tensor: a clear refusal, not wrong numbers */
  setenv("PARC_CUDA_ATTN", "wmma", 1);
  x.io = in | RT_CUDA_ATTN_O_BF16;
  int refused = at_io_fwd(cb, &x) != 0 && strstr(rt_last_error(), "--bf16-store off") != NULL;
  unsetenv("PARC_CUDA_ATTN");
  row("sdpa (bf16 io, wmma)", "refused", refused ? 0 : 1, 0, 0, 0, 0);
  at_io_free(&x);
  for (int i = 0; i < 4; i++) free(h[i]);
  free(d), free(ref), free(lref), free(got), free(lgot);
}

/* The fused attention backward with its dq scratch planned
 * (RtCudaSetup.attn_dq_bytes, s0's otherwise): one kv group's bytes (a launch
 * a group: B KV launches; a launch asking for more would fail rt_cuda_ws's
 * plan check) and a float less (no group fits: the split kernels), each in a
 * context of its own, against cb's unplanned call (every group in one launch)
 * on the same bf16 tensors: the same bits; the split kernels' dqkv_bf16_vs. */
static void check_attn_dq_launches(RtCuda *cb, const RtCudaSetup *s0, int64_t B, int64_t H,
                                   int64_t KV, int64_t T, int64_t hd, int causal) {
  const int64_t nq = B * H * T * hd, nk = B * KV * T * hd, ng = B * (H + 2 * KV) * T * hd;
  const int64_t nl = B * H * T;
  float *h[4] = {rnd(nq, 1), rnd(nk, 1), rnd(nk, 1), rnd(nq, 1)}, *d = rnd(nl, 0.1f);
  float *lse = rnd(nl, 0.5f);
  for (int64_t i = 0; i < nl; i++) lse[i] += 4.0f; /* (row sums of exp above 1) */
  const int64_t len[4] = {nq, nk, nk, nq};
  const unsigned all = RT_CUDA_ATTN_Q_BF16 | RT_CUDA_ATTN_K_BF16 | RT_CUDA_ATTN_V_BF16 |
                       RT_CUDA_ATTN_DY_BF16 | RT_CUDA_ATTN_O_BF16;
  AtIo x = {{0}, {0}, {0}, {0}, NULL, dev_copy(lse, 4 * (size_t)nl),
            dev_copy(d, 4 * (size_t)nl), dev_copy(NULL, 4 * (size_t)ng), B, H, KV, T, hd,
            1.0f / sqrtf((float)hd), causal, all};
  at_io_upload(&x, h, len);
  char shape[96];
  snprintf(shape, sizeof shape, "B%lld H%lld KV%lld T%lld hd%lld%s", (long long)B, (long long)H,
           (long long)KV, (long long)T, (long long)hd, causal ? " causal" : "");
  uint16_t *a = malloc(2 * (size_t)ng), *b = malloc(2 * (size_t)ng);
  double err0 = at_io_bwd(cb, &x) ? INFINITY : 0;
  to_host(a, x.dqkv, 2 * (size_t)ng);
  const int64_t group = rt_cuda_attn_dq_group(H, KV, T, hd, causal, 128);
  for (int k = 0; k < 2; k++) {
    RtCudaSetup s = *s0;
    s.attn_dq_bytes = k ? group - 4 : group;
    RtCuda *c = NULL;
    double err = err0;
    cudaMemset(x.dqkv, 0, 2 * (size_t)ng); /* (the result is this context's) */
    if (err == 0 && (rt_cuda_open(&c, &s, NULL, NULL) || at_io_bwd(c, &x))) {
      fprintf(stderr, "%s\n", rt_last_error());
      err = INFINITY;
    }
    if (err == 0) {
      to_host(b, x.dqkv, 2 * (size_t)ng);
      err = k ? dqkv_bf16_vs(&x, b, a) : memcmp(a, b, 2 * (size_t)ng) != 0;
    }
    rt_cuda_close(c);
    row(k ? "sdpa_grad (dq scratch too small)" : "sdpa_grad (dq a launch a group)", shape, err,
        k ? 1e-2 : 0, 0, 0, 0);
  }
  at_io_free(&x);
  for (int i = 0; i < 4; i++) free(h[i]);
  free(d), free(lse), free(a), free(b);
}

/* The share of n bytes where a and b differ. */
static double bytes_differ(const void *a, const void *b, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((const unsigned char *)a)[i] != ((const unsigned char *)b)[i];
  return n ? (double)k / (double)n : 0;
}

/* Token-major attention (RT_CUDA_ATTN_O_TOKENS, _DY_TOKENS, _QKV_TOKENS;
 * passes/attn_layout.c): the forward's out [B, T, H hd] and the backward's
 * dqkv [B, T, (H + 2 KV) hd], dy read as [B, T, H hd], q, k, v read from one
 * packed [B, T, H + 2 KV, hd], against the head-major calls with the same
 * flags `bf` (bf16 inputs and result, or none) on the same values: the
 * results moved, bit for bit (share of bytes differing, tolerance 0), lse
 * the same bits; every combination of the flags.  `family` names the kernels
 * c runs (the fp32 ones, mma, or wmma under PARC_CUDA_ATTN). */
static void check_attn_layout(RtCuda *c, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                              int causal, unsigned bf, const char *family) {
  const int64_t nq = B * H * T * hd, nk = B * KV * T * hd, C = H + 2 * KV, ng = B * C * T * hd;
  const int64_t nl = B * H * T, len[4] = {nq, nk, nk, nq};
  const size_t esz = bf & RT_CUDA_ATTN_O_BF16 ? 2 : 4;
  float *h[4] = {rnd(nq, 1), rnd(nk, 1), rnd(nk, 1), rnd(nq, 1)}, *d = rnd(nl, 0.1f);
  AtIo x = {{0}, {0}, {0}, {0}, dev_copy(NULL, 4 * (size_t)nq), dev_copy(NULL, 4 * (size_t)nl),
            dev_copy(d, 4 * (size_t)nl), dev_copy(NULL, 4 * (size_t)ng), B, H, KV, T, hd,
            1.0f / sqrtf((float)hd), causal, 0};
  at_io_upload(&x, h, len);
  void *dyh[2] = {x.dy[0], x.dy[1]}, *dyt[2]; /* dy head-major, token-major */
  float *mdy = malloc(4 * (size_t)nq), *r = bf16_values(h[3], nq);
  merge_bytes(mdy, r, B, H, T, hd, 4);
  dyt[0] = dev_copy(mdy, 4 * (size_t)nq);
  merge_bytes(mdy, h[3], B, H, T, hd, 4);
  dyt[1] = dev_bf16(mdy, 1, nq, nq);
  free(mdy), free(r);
  /* q|k|v packed: [0] fp32 of the bf16 values, [1] bf16, as at_io_upload's */
  void *pk[2], *hq[3][2]; /* the packed copies; x's own q, k, v */
  float *hm = malloc(4 * (size_t)ng), *pm = malloc(4 * (size_t)ng);
  for (int k = 0; k < 2; k++) {
    for (int j = 0; j < 3; j++) {
      const int64_t heads = j ? KV : H, at = j == 0 ? 0 : j == 1 ? H : H + KV;
      float *src = k ? h[j] : bf16_values(h[j], len[j]);
      for (int64_t b = 0; b < B; b++)
        memcpy(hm + (b * C + at) * T * hd, src + b * heads * T * hd, 4 * (size_t)(heads * T * hd));
      if (!k) free(src);
    }
    merge_bytes(pm, hm, B, C, T, hd, 4);
    pk[k] = k ? dev_bf16(pm, 1, ng, ng) : dev_copy(pm, 4 * (size_t)ng);
  }
  free(hm), free(pm);
  for (int k = 0; k < 2; k++) hq[0][k] = x.q[k], hq[1][k] = x.k[k], hq[2][k] = x.v[k];
  char *ref = malloc(4 * (size_t)ng), *want = malloc(4 * (size_t)ng), *got = malloc(4 * (size_t)ng);
  float *lref = malloc(4 * (size_t)nl), *lgot = malloc(4 * (size_t)nl);
  double err = 0;
  /* the forward */
  x.io = bf & ~(unsigned)RT_CUDA_ATTN_DY_BF16;
  if (at_io_fwd(c, &x)) err = INFINITY;
  to_host(ref, x.out, esz * (size_t)nq);
  to_host(lref, x.lse, 4 * (size_t)nl);
  x.io |= RT_CUDA_ATTN_O_TOKENS;
  cudaMemset(x.out, 0xff, 4 * (size_t)nq);
  if (err == 0 && at_io_fwd(c, &x)) err = INFINITY;
  to_host(got, x.out, esz * (size_t)nq);
  to_host(lgot, x.lse, 4 * (size_t)nl);
  merge_bytes(want, ref, B, H, T, hd, esz);
  err = fmax(err, fmax(bytes_differ(got, want, esz * (size_t)nq), differing(lgot, lref, nl)));
  /* packed q|k|v, out head-major and token-major */
  for (int k = 0; k < 2; k++) x.q[k] = x.k[k] = x.v[k] = pk[k];
  for (int tok = 0; tok < 2 && err == 0; tok++) {
    x.io = (bf & ~(unsigned)RT_CUDA_ATTN_DY_BF16) | RT_CUDA_ATTN_QKV_TOKENS |
           (tok ? (unsigned)RT_CUDA_ATTN_O_TOKENS : 0u);
    cudaMemset(x.out, 0xff, 4 * (size_t)nq);
    cudaMemset(x.lse, 0xff, 4 * (size_t)nl);
    if (at_io_fwd(c, &x)) err = INFINITY;
    to_host(got, x.out, esz * (size_t)nq);
    to_host(lgot, x.lse, 4 * (size_t)nl);
    err = fmax(err, fmax(bytes_differ(got, tok ? want : ref, esz * (size_t)nq),
                         differing(lgot, lref, nl)));
  }
  for (int k = 0; k < 2; k++) x.q[k] = hq[0][k], x.k[k] = hq[1][k], x.v[k] = hq[2][k];
  /* the backward: head-major, then every combination of the layout flags */
  x.io = bf;
  if (err == 0 && at_io_bwd(c, &x)) err = INFINITY;
  to_host(ref, x.dqkv, esz * (size_t)ng);
  merge_bytes(want, ref, B, C, T, hd, esz);
  for (unsigned i = 1; i < 8 && err == 0; i++) {
    const unsigned lay = (i & 1 ? (unsigned)RT_CUDA_ATTN_O_TOKENS : 0u) |
                         (i & 2 ? (unsigned)RT_CUDA_ATTN_DY_TOKENS : 0u) |
                         (i & 4 ? (unsigned)RT_CUDA_ATTN_QKV_TOKENS : 0u);
    x.io = bf | lay;
    x.dy[0] = lay & RT_CUDA_ATTN_DY_TOKENS ? dyt[0] : dyh[0];
    x.dy[1] = lay & RT_CUDA_ATTN_DY_TOKENS ? dyt[1] : dyh[1];
    for (int k = 0; k < 2; k++)
      for (int j = 0; j < 3; j++) *(j == 0 ? &x.q[k] : j == 1 ? &x.k[k] : &x.v[k]) =
          lay & RT_CUDA_ATTN_QKV_TOKENS ? pk[k] : hq[j][k];
    cudaMemset(x.dqkv, 0xff, 4 * (size_t)ng);
    if (at_io_bwd(c, &x)) {
      err = INFINITY;
      break;
    }
    to_host(got, x.dqkv, esz * (size_t)ng);
    err = fmax(err, bytes_differ(got, lay & RT_CUDA_ATTN_O_TOKENS ? want : ref, esz * (size_t)ng));
  }
  for (int k = 0; k < 2; k++) x.q[k] = hq[0][k], x.k[k] = hq[1][k], x.v[k] = hq[2][k];
  if (err == INFINITY) fprintf(stderr, "%s\n", rt_last_error());
  char shape[96], name[64];
  snprintf(shape, sizeof shape, "B%lld H%lld KV%lld T%lld hd%lld%s", (long long)B, (long long)H,
           (long long)KV, (long long)T, (long long)hd, causal ? " causal" : "");
  snprintf(name, sizeof name, "sdpa (token-major, %s)", family);
  row(name, shape, err, 0, 0, 0, 0);
  x.dy[0] = dyh[0], x.dy[1] = dyh[1];
  at_io_free(&x);
  for (int i = 0; i < 4; i++) free(h[i]);
  cudaFree(dyt[0]), cudaFree(dyt[1]), cudaFree(pk[0]), cudaFree(pk[1]);
  free(d), free(ref), free(want), free(got), free(lref), free(lgot);
}

/* ---- embedding and cross-entropy ---- */
typedef struct {
  float *out, *table, *dy, *logits, *dlogits, *loss, *dloss;
  int32_t *ids;
  int64_t count, V, D;
} Em;
static int em_fwd(RtCuda *c, void *p) {
  Em *x = p;
  return rt_cuda_embedding(c, x->out, x->ids, x->table, x->count, x->V, x->D);
}
static int em_bwd(RtCuda *c, void *p) {
  Em *x = p;
  return rt_cuda_embedding_grad(c, x->out, x->ids, x->dy, x->count, x->V, x->D);
}
static int ce_fwd(RtCuda *c, void *p) {
  Em *x = p;
  return rt_cuda_cross_entropy(c, x->loss, x->logits, x->ids, x->count, x->V);
}
static int ce_bwd(RtCuda *c, void *p) {
  Em *x = p;
  return rt_cuda_cross_entropy_grad(c, x->dlogits, x->logits, x->ids, x->dloss, x->count, x->V);
}
static void check_embed_xent(RtCuda *c, int64_t count, int64_t V, int64_t D) {
  int32_t *ids = malloc(4 * (size_t)count);
  for (int64_t i = 0; i < count; i++) ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
  ids[count - 1] = ids[0]; /* repeats */
  float *table = rnd(V * D, 1), *dy = rnd(count * D, 1), *logits = rnd(count * V, 4);
  int64_t big = count * V > V * D ? count * V : V * D;
  float *ref = malloc(4 * (size_t)big), *got = malloc(4 * (size_t)big), dloss = 1.0f;
  Em x = {dev_copy(NULL, 4 * (size_t)big), dev_copy(table, 4 * (size_t)(V * D)),
          dev_copy(dy, 4 * (size_t)(count * D)), dev_copy(logits, 4 * (size_t)(count * V)),
          dev_copy(NULL, 4 * (size_t)(count * V)), dev_copy(NULL, 4), dev_copy(&dloss, 4),
          dev_copy(ids, 4 * (size_t)count), count, V, D};
  char shape[96];
  snprintf(shape, sizeof shape, "count %lld V %lld D %lld", (long long)count, (long long)V,
           (long long)D);
  rt_embedding(ref, ids, table, count, V, D);
  double err = em_fwd(c, &x) ? INFINITY : 0;
  to_host(got, x.out, 4 * (size_t)(count * D));
  if (err == 0) err = rel_l2(got, ref, count * D);
  row("embedding", shape, err, 0, time_op(c, em_fwd, &x, 10), 0, 8.0 * count * D);
  rt_embedding_grad(ref, ids, dy, count, V, D);
  err = em_bwd(c, &x) ? INFINITY : 0;
  to_host(got, x.out, 4 * (size_t)(V * D));
  if (err == 0) err = rel_l2(got, ref, V * D);
  row("embedding_grad", shape, err, 0, time_op(c, em_bwd, &x, 10), 0, 4.0 * (V * D + count * D));
  snprintf(shape, sizeof shape, "N %lld V %lld", (long long)count, (long long)V);
  rt_cross_entropy(ref, logits, ids, count, V);
  err = ce_fwd(c, &x) ? INFINITY : 0;
  to_host(got, x.loss, 4);
  if (err == 0) err = rel_l2(got, ref, 1);
  row("cross_entropy", shape, err, 1e-6, time_op(c, ce_fwd, &x, 10), 0, 4.0 * count * V);
  rt_cross_entropy_grad(ref, logits, ids, &dloss, count, V);
  err = ce_bwd(c, &x) ? INFINITY : 0;
  to_host(got, x.dlogits, 4 * (size_t)(count * V));
  if (err == 0) err = rel_l2(got, ref, count * V);
  row("cross_entropy_grad", shape, err, 1e-5, time_op(c, ce_bwd, &x, 10), 0, 8.0 * count * V);
  /* in place (dlogits == logits, as the buffer plan calls it): the out-of-place
   * device bits (got), compared after time_op's calls wrote the same again */
  to_host(got, x.dlogits, 4 * (size_t)(count * V));
  float *ip = dev_copy(logits, 4 * (size_t)(count * V));
  err = rt_cuda_cross_entropy_grad(c, ip, ip, x.ids, x.dloss, count, V) ? INFINITY : 0;
  to_host(ref, ip, 4 * (size_t)(count * V));
  if (err == 0) err = differing(ref, got, count * V);
  row("xent_grad in place", shape, err, 0, 0, 0, 0);
  cudaFree(ip);
  cudaFree(x.out), cudaFree(x.table), cudaFree(x.dy), cudaFree(x.logits), cudaFree(x.dlogits);
  cudaFree(x.loss), cudaFree(x.dloss), cudaFree(x.ids);
  free(ids), free(table), free(dy), free(logits), free(ref), free(got);
}

/* The embedding gradient on skewed ids, as a byte corpus gives them: id V-1
 * at half the positions plus 3 (a run of count/2 + 3 slots, the last one, so
 * its end is count), runs of ~20%, 8%, 3% of the slots and of 17, 9 and 2 (id
 * 0, slot 0), the rest random ids (mostly runs of 1), all shuffled.  The run
 * lengths are not multiples of the kernel's batch (16) or of 8, and the long
 * runs cross its 256-row chunks.  Against rt_embedding_grad at tolerance 0:
 * same order of adds, same bits.  `off` floats into dy's device buffer (1:
 * not 16-byte aligned, so the scalar path even when D % 4 == 0); D % 4 != 0
 * takes the scalar path too, D > 4 * 64 more than one column slice. */
static void check_embed_grad_skewed(RtCuda *c, int64_t count, int64_t V, int64_t D, int off,
                                    int timed) {
  int32_t *ids = malloc(4 * (size_t)count);
  int64_t runs[][2] = {{V - 1, count / 2 + 3}, {V / 2, count / 5 + 1}, {V / 3, count / 12 + 5},
                       {V / 4, count / 33 + 1},  {V / 5, 17},           {V / 6, 9},
                       {0, 2}};
  int64_t n = 0;
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++)
    for (int64_t i = 0; i < runs[k][1] && n < count; i++) ids[n++] = (int32_t)runs[k][0];
  for (; n < count; n++) ids[n] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
  for (int64_t i = count - 1; i > 0; i--) { /* Fisher-Yates */
    int64_t j = (int64_t)((frand() * 0.5f + 0.5f) * (float)i + 0.5f);
    int32_t t = ids[i];
    ids[i] = ids[j], ids[j] = t;
  }
  float *dy = rnd(count * D, 1), *ref = malloc(4 * (size_t)(V * D));
  float *got = malloc(4 * (size_t)(V * D));
  float *ddy = dev_copy(NULL, 4 * (size_t)(count * D + off));
  cudaMemcpy(ddy + off, dy, 4 * (size_t)(count * D), cudaMemcpyHostToDevice);
  Em x = {.out = dev_copy(NULL, 4 * (size_t)(V * D)), .dy = ddy + off,
          .ids = dev_copy(ids, 4 * (size_t)count), .count = count, .V = V, .D = D};
  char shape[96];
  snprintf(shape, sizeof shape, "skewed %lld V %lld D %lld%s", (long long)count, (long long)V,
           (long long)D, off ? " dy+1" : "");
  rt_embedding_grad(ref, ids, dy, count, V, D);
  double err = em_bwd(c, &x) ? INFINITY : 0;
  to_host(got, x.out, 4 * (size_t)(V * D));
  if (err == 0) err = rel_l2(got, ref, V * D);
  row("embedding_grad", shape, err, 0, timed ? time_op(c, em_bwd, &x, 10) : 0, 0,
      timed ? 4.0 * (V * D + count * D) : 0);
  cudaFree(x.out), cudaFree(ddy), cudaFree(x.ids);
  free(ids), free(dy), free(ref), free(got);
}

static int ce_bwd_bf16(RtCuda *c, void *p) {
  Em *x = p; /* in place, as the trainers call it: the logits are gone after one call */
  return rt_cuda_cross_entropy_grad_bf16(c, x->dlogits, x->dlogits, x->ids, x->dloss, x->count,
                                         x->V);
}

/* rt_cuda_cross_entropy_grad_bf16 in place: the fp32 gradient's bits rounded
 * (V above the kernel's tile of 1024 columns: several tiles per row). */
static void check_xent_bf16(RtCuda *c, int64_t N, int64_t V) {
  int32_t *ids = malloc(4 * (size_t)N);
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
  float *logits = rnd(N * V, 4), *ref = malloc(4 * (size_t)(N * V)), dloss = 1.0f;
  float *back = malloc(4 * (size_t)(N * V));
  Em x = {NULL, NULL, NULL, dev_copy(logits, 4 * (size_t)(N * V)),
          dev_copy(logits, 4 * (size_t)(N * V)), NULL, dev_copy(&dloss, 4),
          dev_copy(ids, 4 * (size_t)N), N, V, 0};
  double err = rt_cuda_cross_entropy_grad(c, x.dlogits, x.logits, x.ids, x.dloss, N, V) ? INFINITY
                                                                                        : 0;
  to_host(ref, x.dlogits, 4 * (size_t)(N * V)); /* the fp32 bits */
  float *fresh = dev_copy(logits, 4 * (size_t)(N * V));
  cudaFree(x.dlogits);
  x.dlogits = fresh;
  if (err == 0) err = ce_bwd_bf16(c, &x) ? INFINITY : 0;
  to_host(back, x.dlogits, 4 * (size_t)(N * V));
  if (err == 0) err = bf16_rows_differ(back, 2 * V, ref, N, V);
  char shape[64];
  snprintf(shape, sizeof shape, "N %lld V %lld, in place", (long long)N, (long long)V);
  row("xent_grad bf16 out", shape, err, 0, time_op(c, ce_bwd_bf16, &x, 10), 0, 6.0 * N * V);
  cudaFree(x.logits), cudaFree(x.dlogits), cudaFree(x.dloss), cudaFree(x.ids);
  free(ids), free(logits), free(ref), free(back);
}

static int ce_bwd_bf16io(RtCuda *c, void *p) {
  Em *x = p; /* in place: logits and dlogits bf16 */
  return rt_cuda_cross_entropy_grad_bf16io(c, x->dlogits, x->dlogits, x->ids, x->dloss, x->count,
                                           x->V);
}
/* Logits stored as bf16 (rt_cuda_cross_entropy_bf16; _grad_bf16io writes
 * dlogits as bf16 over them) against the fp32 ops on the same values: the
 * loss's bits, and dlogits the fp32 ones rounded to bf16 (share differing). */
static void check_xent_bf16io(RtCuda *c, int64_t N, int64_t V) {
  int32_t *ids = malloc(4 * (size_t)N);
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
  float *logits = rnd(N * V, 4), *ref = malloc(4 * (size_t)(N * V)), dloss = 1.0f;
  uint16_t *back = malloc(2 * (size_t)(N * V));
  for (int64_t i = 0; i < N * V; i++) { /* values a bf16 holds */
    uint32_t u = (uint32_t)bf16_rn(logits[i]) << 16;
    memcpy(&logits[i], &u, 4);
  }
  float loss_ref = 0, loss_got = 1;
  Em x = {NULL, NULL, NULL, dev_copy(logits, 4 * (size_t)(N * V)), dev_bf16(logits, N, V, V),
          dev_copy(NULL, 4), dev_copy(&dloss, 4), dev_copy(ids, 4 * (size_t)N), N, V, 0};
  int rc = rt_cuda_cross_entropy(c, x.loss, x.logits, x.ids, N, V);
  if (!rc) to_host(&loss_ref, x.loss, 4);
  rc = rc || rt_cuda_cross_entropy_bf16(c, x.loss, x.dlogits, x.ids, N, V);
  if (!rc) to_host(&loss_got, x.loss, 4);
  double e_fwd = rc ? INFINITY : differing(&loss_got, &loss_ref, 1);
  rc = rc || rt_cuda_cross_entropy_grad(c, x.logits, x.logits, x.ids, x.dloss, N, V) ||
       ce_bwd_bf16io(c, &x);
  if (!rc) {
    to_host(ref, x.logits, 4 * (size_t)(N * V));
    to_host(back, x.dlogits, 2 * (size_t)(N * V));
  }
  double err = rc ? INFINITY : bf16_rows_differ(back, V, ref, N, V);
  if (rc) fprintf(stderr, "%s\n", rt_last_error());
  char shape[64];
  snprintf(shape, sizeof shape, "N %lld V %lld, in place", (long long)N, (long long)V);
  row("xent bf16 in", shape, e_fwd, 0, 0, 0, 0);
  row("xent_grad bf16 io", shape, err, 0, time_op(c, ce_bwd_bf16io, &x, 10), 0, 4.0 * N * V);
  cudaFree(x.logits), cudaFree(x.dlogits), cudaFree(x.loss), cudaFree(x.dloss), cudaFree(x.ids);
  free(ids), free(logits), free(ref), free(back);
}

/* ---- vocabulary cross-entropy at one member (the one-rank trainer's padded
 * vocabulary): rt_cuda_ops.cu's one-member kernels against the gathered path
 * (PARC_CUDA_XENT=gathered), bit for bit, in every form the trainer calls --
 * the gradients in place as its buffer plan runs them -- and against the
 * CPU's rt_vocab_cross_entropy(_grad); timed both ways on the bf16 forms
 * (GPT-2's). ---- */
typedef struct {
  void *logits, *hb;  /* fp32 logits [N, Vl], and their bf16 [N, Vl] */
  void *ip;           /* the in-place gradient's buffer (4 N Vl bytes) */
  float *loss, *dloss;
  int32_t *ids;
  int64_t N, Vl, V;
} Vo;
static int vo_fwd_bf16(RtCuda *c, void *p) {
  Vo *x = p;
  return rt_cuda_vocab_cross_entropy_bf16(c, RT_CUDA_TP, x->loss, x->hb, x->ids, x->N, x->Vl,
                                          x->V);
}
static int vo_bwd_bf16io(RtCuda *c, void *p) { /* (timed: run again over its own result) */
  Vo *x = p;
  return rt_cuda_vocab_cross_entropy_grad_bf16io(c, RT_CUDA_TP, x->ip, x->ip, x->ids, x->dloss,
                                                 x->N, x->Vl, x->V);
}
/* One run of every form into out[0..5): loss, dlogits fp32 (in place), dlogits
 * bf16 wide (in place), the bf16 logits' loss, and their dlogits (bf16 io, in
 * place); 0, or -1. */
static int vo_run(RtCuda *c, Vo *x, const float *logits, void *out[5]) {
  size_t n4 = 4 * (size_t)(x->N * x->Vl);
  int rc = rt_cuda_vocab_cross_entropy(c, RT_CUDA_TP, x->loss, x->logits, x->ids, x->N, x->Vl,
                                       x->V);
  if (!rc) to_host(out[0], x->loss, 4);
  cudaMemcpy(x->ip, logits, n4, cudaMemcpyHostToDevice);
  rc = rc || rt_cuda_vocab_cross_entropy_grad(c, RT_CUDA_TP, x->ip, x->ip, x->ids, x->dloss,
                                              x->N, x->Vl, x->V);
  if (!rc) to_host(out[1], x->ip, n4);
  cudaMemcpy(x->ip, logits, n4, cudaMemcpyHostToDevice);
  rc = rc || rt_cuda_vocab_cross_entropy_grad_bf16(c, RT_CUDA_TP, x->ip, x->ip, x->ids, x->dloss,
                                                   x->N, x->Vl, x->V);
  if (!rc) to_host(out[2], x->ip, n4);
  rc = rc || vo_fwd_bf16(c, x);
  if (!rc) to_host(out[3], x->loss, 4);
  cudaMemcpy(x->ip, x->hb, n4 / 2, cudaMemcpyDeviceToDevice);
  rc = rc || vo_bwd_bf16io(c, x);
  if (!rc) to_host(out[4], x->ip, n4 / 2);
  return rc;
}
/* One form of the cross-entropy as a trainer calls it -- group < 0 dense
 * (Vl == V), else vocab over tp; io as rt_cuda_cross_entropy_fused's --
 * either separately (the forward, then the gradient in place) or fused (in
 * place): the loss and the gradient's bytes into loss and grad; 0, or -1. */
static int xent_form(RtCuda *c, Vo *x, const float *logits, int group, unsigned io, int fused,
                     float *loss, void *grad) {
  const int64_t N = x->N, Vl = x->Vl, V = x->V;
  const size_t n4 = 4 * (size_t)(N * Vl), gb = io == RT_CUDA_XENT_BF16IO ? n4 / 2 : n4;
  const int b = io == RT_CUDA_XENT_BF16IO;
  const void *lg = b ? x->hb : x->logits; /* the forward's (unmodified) logits */
  if (b) cudaMemcpy(x->ip, x->hb, gb, cudaMemcpyDeviceToDevice);
  else cudaMemcpy(x->ip, logits, n4, cudaMemcpyHostToDevice);
  int rc;
  if (fused) {
    rc = rt_cuda_cross_entropy_fused(c, group, io, x->loss, x->ip, x->ip, x->ids, x->dloss, N, Vl,
                                     V);
  } else if (group < 0) {
    rc = (b ? rt_cuda_cross_entropy_bf16 : rt_cuda_cross_entropy)(c, x->loss, lg, x->ids, N, V);
    rc = rc || (b ? rt_cuda_cross_entropy_grad_bf16io
                : io ? rt_cuda_cross_entropy_grad_bf16
                     : rt_cuda_cross_entropy_grad)(c, x->ip, x->ip, x->ids, x->dloss, N, V);
  } else {
    rc = (b ? rt_cuda_vocab_cross_entropy_bf16 : rt_cuda_vocab_cross_entropy)(
        c, group, x->loss, lg, x->ids, N, Vl, V);
    rc = rc || (b ? rt_cuda_vocab_cross_entropy_grad_bf16io
                : io ? rt_cuda_vocab_cross_entropy_grad_bf16
                     : rt_cuda_vocab_cross_entropy_grad)(c, group, x->ip, x->ip, x->ids, x->dloss,
                                                         N, Vl, V);
  }
  if (rc) return -1;
  to_host(loss, x->loss, 4);
  to_host(grad, x->ip, gb);
  return 0;
}

/* rt_cuda_cross_entropy_fused against the forward and gradient calls it
 * stands for, bit for bit (the loss and dlogits), in every form: dense where
 * Vl == V, vocab at one member through its kernels and through the gathered
 * path (PARC_CUDA_XENT=gathered); fp32, bf16 io, bf16 out; in place, as the
 * trainer runs it (the row loss reads the target's logit before the row is
 * overwritten). */
static void check_xent_fused(RtCuda *c, int64_t N, int64_t Vl, int64_t V) {
  size_t n4 = 4 * (size_t)(N * Vl);
  int32_t *ids = malloc(4 * (size_t)N);
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
  float *logits = rnd(N * Vl, 4), dloss = 0.75f, l0, l1;
  Vo x = {dev_copy(logits, n4), dev_bf16(logits, N, Vl, Vl), dev_copy(NULL, n4), dev_copy(NULL, 4),
          dev_copy(&dloss, 4), dev_copy(ids, 4 * (size_t)N), N, Vl, V};
  void *g0 = malloc(n4), *g1 = malloc(n4);
  static const unsigned ios[3] = {0, RT_CUDA_XENT_BF16IO, RT_CUDA_XENT_BF16OUT};
  static const char *const ion[3] = {"fp32", "bf16 io", "bf16 out"};
  char shape[96];
  for (int form = Vl == V ? 0 : 1; form < 3; form++) { /* dense, vocab, vocab gathered */
    if (form == 2) setenv("PARC_CUDA_XENT", "gathered", 1);
    for (int k = 0; k < 3; k++) {
      size_t gb = ios[k] == RT_CUDA_XENT_BF16IO ? n4 / 2 : n4;
      int g = form ? RT_CUDA_TP : -1;
      double err = xent_form(c, &x, logits, g, ios[k], 0, &l0, g0) ||
                           xent_form(c, &x, logits, g, ios[k], 1, &l1, g1)
                       ? INFINITY
                       : (double)(memcmp(&l0, &l1, 4) != 0) + (memcmp(g0, g1, gb) != 0);
      if (isinf(err)) fprintf(stderr, "%s\n", rt_last_error());
      snprintf(shape, sizeof shape, "%s, %s, N %lld Vl %lld V %lld",
               form == 0 ? "dense" : form == 1 ? "vocab" : "gathered", ion[k], (long long)N,
               (long long)Vl, (long long)V);
      row("xent fused = fwd + grad", shape, err, 0, 0, 0, 0);
    }
    unsetenv("PARC_CUDA_XENT");
  }
  free(g0), free(g1);
  cudaFree(x.logits), cudaFree(x.hb), cudaFree(x.ip), cudaFree(x.loss), cudaFree(x.dloss);
  cudaFree(x.ids);
  free(ids), free(logits);
}

static void check_vocab_one(RtCuda *c, int64_t N, int64_t Vl, int64_t V) {
  size_t n4 = 4 * (size_t)(N * Vl);
  int32_t *ids = malloc(4 * (size_t)N);
  for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (float)(V - 1));
  float *logits = rnd(N * Vl, 4), *ref = malloc(n4), dloss = 1.0f, loss_ref = 0;
  for (int64_t i = 0; i < N * Vl; i++) { /* values a bf16 holds: the bf16 forms see them too */
    uint32_t u = (uint32_t)bf16_rn(logits[i]) << 16;
    memcpy(&logits[i], &u, 4);
  }
  Vo x = {dev_copy(logits, n4), dev_bf16(logits, N, Vl, Vl), dev_copy(NULL, n4), dev_copy(NULL, 4),
          dev_copy(&dloss, 4), dev_copy(ids, 4 * (size_t)N), N, Vl, V};
  void *out[3][5]; /* one member's kernels (rows staged), the gathered path, unstaged rows */
  size_t bytes[5] = {4, n4, n4, 4, n4 / 2};
  for (int m = 0; m < 3; m++)
    for (int k = 0; k < 5; k++) out[m][k] = calloc(1, bytes[k]);
  static const char *const how[3] = {NULL, "gathered", "unstaged"};
  double ms[3][2] = {{0, 0}, {0, 0}, {0, 0}};
  int rc = 0;
  for (int m = 0; m < 3; m++) {
    if (how[m]) setenv("PARC_CUDA_XENT", how[m], 1);
    else unsetenv("PARC_CUDA_XENT");
    rc = rc || vo_run(c, &x, logits, out[m]);
    if (!rc) ms[m][0] = time_op(c, vo_fwd_bf16, &x, 5), ms[m][1] = time_op(c, vo_bwd_bf16io, &x, 5);
  }
  unsetenv("PARC_CUDA_XENT");
  if (rc) fprintf(stderr, "%s\n", rt_last_error());
  double e[5], eu[5];
  for (int k = 0; k < 5; k++) {
    e[k] = rc ? INFINITY : memcmp(out[0][k], out[1][k], bytes[k]) != 0;
    eu[k] = rc ? INFINITY : memcmp(out[0][k], out[2][k], bytes[k]) != 0;
  }
  double e_loss = INFINITY, e_grad = INFINITY;
  if (!rc && !rt_vocab_cross_entropy(NULL, NULL, 0, &loss_ref, logits, ids, N, Vl, V) &&
      !rt_vocab_cross_entropy_grad(NULL, NULL, 0, ref, logits, ids, &dloss, N, Vl, V)) {
    e_loss = rel_l2(out[0][0], &loss_ref, 1);
    e_grad = rel_l2(out[0][1], ref, N * Vl);
  }
  char shape[64];
  snprintf(shape, sizeof shape, "N %lld Vl %lld V %lld", (long long)N, (long long)Vl,
           (long long)V);
  row("vocab_xent 1 member", shape, e_loss, 1e-6, 0, 0, 0);
  row("vocab_xent_grad 1 member", shape, e_grad, 1e-5, 0, 0, 0);
  static const char *const names[5] = {"= gathered: loss", "= gathered: grad", "= gathered: grad bf16",
                                       "= gathered: bf16 in", "= gathered: grad bf16io"};
  for (int k = 0; k < 5; k++) row(names[k], shape, e[k], 0, 0, 0, 0);
  /* the gradients' rows staged in shared memory (the default) against read
   * in place three times (PARC_CUDA_XENT=unstaged): the same bits */
  static const char *const unames[3] = {"= unstaged: grad", "= unstaged: grad bf16",
                                        "= unstaged: grad bf16io"};
  for (int k = 0; k < 3; k++) row(unames[k], shape, eu[k == 2 ? 4 : k + 1], 0, 0, 0, 0);
  /* the bf16 forms' time: one member's kernels, the gathered path's, unstaged */
  double rd = 2.0 * (double)(N * Vl); /* a pass over the bf16 logits */
  row("vocab_xent bf16 in", "one-member kernels", 0, 0, ms[0][0], 0, rd);
  row("vocab_xent bf16 in", "gathered path", 0, 0, ms[1][0], 0, rd);
  row("vocab_xent_grad bf16io", "one-member kernels", 0, 0, ms[0][1], 0, 2 * rd);
  row("vocab_xent_grad bf16io", "gathered path", 0, 0, ms[1][1], 0, 2 * rd);
  row("vocab_xent_grad bf16io", "one member, unstaged", 0, 0, ms[2][1], 0, 2 * rd);
  for (int m = 0; m < 3; m++)
    for (int k = 0; k < 5; k++) free(out[m][k]);
  cudaFree(x.logits), cudaFree(x.hb), cudaFree(x.ip), cudaFree(x.loss), cudaFree(x.dloss);
  cudaFree(x.ids);
  free(ids), free(logits), free(ref);
}

/* ---- vocabulary parallelism at two members (two threads, one GPU) ---- */
enum { VN = 96, VL = 300, VV = 590, VD = 48 }; /* V < 2 Vl: padding on member 1 */
static float *v_logits, *v_table;
static int32_t *v_ids;

static int vocab_rank(RtComm *world, void *arg) {
  (void)arg;
  RtMesh mesh;
  if (rt_comm_mesh(world, 2, 1, 1, 1, &mesh)) return -1;
  int part = mesh.tp_rank;
  RtCudaSetup s = {.params_numel = 1, .state_numel = 1, .arena_bytes = 64, .rows = 1, .seq = 1,
                   .tp = 2, .dp = 1, .tp_group = mesh.tp_comm, .dp_group = mesh.dp_comm,
                   .tp_rank = part, .dp_rank = 0, .gemm = RT_CUDA_GEMM_FP32, .model = "ops"};
  RtCuda *c;
  if (rt_cuda_open(&c, &s, NULL, NULL)) {
    fprintf(stderr, "rank %d: %s\n", part, rt_last_error());
    rt_cuda_close(c);
    return -1;
  }
  /* the member's columns of the logits [VN, VL] */
  float *mine = malloc(4 * VN * VL), *ref = malloc(4 * VN * VL), *got = malloc(4 * VN * VL);
  for (int p = 0; p < VN; p++)
    for (int v = 0; v < VL; v++) mine[p * VL + v] = v_logits[p * 2 * VL + part * VL + v];
  float dloss = 1.0f, loss_ref = 0, loss_got = 0;
  float *dl = dev_copy(mine, 4 * VN * VL), *dg = dev_copy(NULL, 4 * VN * VL);
  float *dloss_d = dev_copy(&dloss, 4), *loss_d = dev_copy(NULL, 4);
  int32_t *ids_d = dev_copy(v_ids, 4 * VN);
  int rc = rt_vocab_cross_entropy(mesh.tp_comm, NULL, 0, &loss_ref, mine, v_ids, VN, VL, VV) ||
           rt_cuda_vocab_cross_entropy(c, RT_CUDA_TP, loss_d, dl, ids_d, VN, VL, VV) ||
           rt_vocab_cross_entropy_grad(mesh.tp_comm, NULL, 0, ref, mine, v_ids, &dloss, VN, VL,
                                       VV) ||
           rt_cuda_vocab_cross_entropy_grad(c, RT_CUDA_TP, dg, dl, ids_d, dloss_d, VN, VL, VV);
  double e1 = INFINITY, e2 = INFINITY, e3 = INFINITY, e4 = INFINITY, e5 = INFINITY;
  double e6 = INFINITY, e7 = INFINITY;
  if (!rc) {
    to_host(&loss_got, loss_d, 4);
    to_host(got, dg, 4 * VN * VL);
    e1 = rel_l2(&loss_got, &loss_ref, 1);
    e2 = rel_l2(got, ref, VN * VL);
    /* in place (dlogits == logits): the out-of-place device bits; both members
     * call it (the gathers inside), whatever the errors so far */
    float *ip = dev_copy(mine, 4 * VN * VL), *back = malloc(4 * VN * VL);
    if (!rt_cuda_vocab_cross_entropy_grad(c, RT_CUDA_TP, ip, ip, ids_d, dloss_d, VN, VL, VV)) {
      to_host(back, ip, 4 * VN * VL);
      e4 = differing(back, got, VN * VL);
    }
    cudaFree(ip);
    ip = dev_copy(mine, 4 * VN * VL); /* as bf16 rows of 2 VL, in place */
    if (!rt_cuda_vocab_cross_entropy_grad_bf16(c, RT_CUDA_TP, ip, ip, ids_d, dloss_d, VN, VL, VV)) {
      to_host(back, ip, 4 * VN * VL);
      e5 = bf16_rows_differ(back, 2 * VL, got, VN, VL);
    }
    cudaFree(ip);
    /* logits stored as bf16 (_bf16io, in place): against the fp32 ops on the same
     * values, the loss's bits and dlogits rounded */
    float *mr = malloc(4 * VN * VL), lb_ref = 0, lb_got = 1;
    for (int i = 0; i < VN * VL; i++) {
      uint32_t u = (uint32_t)bf16_rn(mine[i]) << 16;
      memcpy(&mr[i], &u, 4);
    }
    float *fp = dev_copy(mr, 4 * VN * VL);
    void *hb = dev_bf16(mr, VN, VL, VL);
    if (!rt_cuda_vocab_cross_entropy(c, RT_CUDA_TP, loss_d, fp, ids_d, VN, VL, VV))
      to_host(&lb_ref, loss_d, 4);
    if (!rt_cuda_vocab_cross_entropy_bf16(c, RT_CUDA_TP, loss_d, hb, ids_d, VN, VL, VV)) {
      to_host(&lb_got, loss_d, 4);
      e6 = differing(&lb_got, &lb_ref, 1);
    }
    if (!rt_cuda_vocab_cross_entropy_grad(c, RT_CUDA_TP, fp, fp, ids_d, dloss_d, VN, VL, VV) &&
        !rt_cuda_vocab_cross_entropy_grad_bf16io(c, RT_CUDA_TP, hb, hb, ids_d, dloss_d, VN, VL,
                                                 VV)) {
      to_host(mr, fp, 4 * VN * VL);
      to_host(back, hb, 2 * VN * VL);
      e7 = bf16_rows_differ(back, VL, mr, VN, VL);
    }
    cudaFree(fp), cudaFree(hb), free(mr), free(back);
    float *tb = dev_copy(v_table + part * VL * VD, 4 * VL * VD), *o = dev_copy(NULL, 4 * VN * VD);
    rc = rt_vocab_embedding(ref, v_ids, v_table + part * VL * VD, VN, VL, VD, part, 2) ||
         rt_cuda_vocab_embedding(c, o, ids_d, tb, VN, VL, VD, part, 2);
    if (!rc) {
      to_host(got, o, 4 * VN * VD);
      e3 = rel_l2(got, ref, VN * VD);
    }
    cudaFree(tb), cudaFree(o);
  }
  if (rc) fprintf(stderr, "rank %d: %s\n", part, rt_last_error());
  if (part == 0) {
    char shape[64];
    snprintf(shape, sizeof shape, "N %d Vl %d V %d, 2 members", VN, VL, VV);
    row("vocab_cross_entropy", shape, e1, 1e-6, 0, 0, 0);
    row("vocab_xent_grad", shape, e2, 1e-5, 0, 0, 0);
    row("vocab_xent_grad in pl.", shape, e4, 0, 0, 0, 0);
    row("vocab_xent_grad bf16", shape, e5, 0, 0, 0, 0);
    row("vocab_xent bf16 in", shape, e6, 0, 0, 0, 0);
    row("vocab_xent_grad bf16 io", shape, e7, 0, 0, 0, 0);
    row("vocab_embedding", shape, e3, 0, 0, 0, 0);
  }
  cudaFree(dl), cudaFree(dg), cudaFree(dloss_d), cudaFree(loss_d), cudaFree(ids_d);
  free(mine), free(ref), free(got);
  rt_cuda_close(c);
  rt_comm_mesh_free(&mesh);
  return rc ? -1 : 0;
}

int main(int argc, char **argv) {
  int small = argc == 2 && strcmp(argv[1], "--small") == 0; /* no GPT-2-sized cases */
  if (argc > 2 || (argc == 2 && !small)) {
    fprintf(stderr, "usage: gpu_ops_check [--small]\n");
    return 2;
  }
  rt_pool_init(4);
  RtCudaSetup s = {.params_numel = 1, .state_numel = 1, .arena_bytes = 64, .rows = 1, .seq = 1,
                   .tp = 1, .dp = 1, .gemm = RT_CUDA_GEMM_FP32, .model = "ops"};
  RtCuda *c;
  if (rt_cuda_open(&c, &s, NULL, NULL)) {
    fprintf(stderr, "gpu_ops_check: %s\n", rt_last_error());
    return 2;
  }
  printf("gpu_ops_check on %s\n", rt_cuda_describe(c));
  printf("%-22s %-30s %10s %-4s %12s  %s\n", "op", "shape", "rel err", "", "time", "achieved");
  check_mm(c, 4, 128, 64, 96, 0, 0, 1e-5);
  check_mm(c, 4, 128, 64, 96, RT_MM_TRANSPOSE_B, 0, 1e-5);
  check_mm(c, 4, 64, 32, 48, RT_MM_B_BATCHED, 0, 1e-5);
  check_mm(c, 4, 64, 32, 48, RT_MM_B_BATCHED | RT_MM_TRANSPOSE_B, 0, 1e-5);
  check_mm(c, 1, 96, 128, 80, 0, 1, 1e-5);
  check_mm(c, 3, 64, 48, 32, RT_MM_B_BATCHED, 1, 1e-5);
  if (!small)
    check_mm(c, 8, 1024, 768, 2304, 0, 0, 1e-5); /* GPT-2 small's qkv, fp32 */
  check_mm_bgrad(c, 96, 200, 72, 0, 1e-5); /* a weight and bias gradient, fp32 */
  check_mm_bias(c, 96, 200, 72, 0);       /* a product with its bias, fp32 */
  check_mm_gelu(c, 96, 64, 256, 0, 0);     /* GPT-2's MLP up-projection with gelu, fp32 */
  check_mm_gelu(c, 96, 64, 256, 0, 1);     /* its dg = dy W^T times gelu'(h) */
  check_mm_gelu(c, 32, 64, 100, 0, 0);     /* rows not of a multiple of 8: by the caller */
  check_attn(c, 2, 4, 4, 100, 16, 1);
  check_attn(c, 2, 4, 2, 130, 64, 1);
  check_attn(c, 1, 4, 1, 70, 128, 0);
  check_attn(c, 1, 2, 2, 64, 256, 1);
  check_attn_layout(c, 2, 4, 2, 100, 16, 1, 0, "fp32");
  check_attn_layout(c, 1, 2, 1, 70, 96, 0, 0, "fp32");
  if (!small)
    check_attn(c, 8, 12, 12, 1024, 64, 1); /* GPT-2 small */
  check_embed_xent(c, 256, 256, 64);
  check_xent_bf16(c, 64, 3000);
  check_xent_bf16io(c, 64, 3000);
  if (!small) { /* GPT-2 small's padded vocabulary, 2048 rows */
    check_xent_bf16(c, 2048, 50304);
    check_xent_bf16io(c, 2048, 50304);
  }
  if (!small)
    check_embed_xent(c, 2048, 50257, 64);
  check_vocab_one(c, 64, 320, 257); /* gpt2_tiny's -D vocab=257 padded to 320 */
  check_xent_fused(c, 64, 3000, 3000);
  check_xent_fused(c, 64, 320, 257);
  if (!small)
    check_vocab_one(c, 2048, 50304, 50257); /* GPT-2 small's, 2048 of its 8192 rows */
  check_embed_grad_skewed(c, 1200, 300, 64, 0, !small);  /* float4, one column slice */
  check_embed_grad_skewed(c, 1200, 300, 520, 0, !small); /* float4, three slices */
  check_embed_grad_skewed(c, 1200, 300, 67, 0, !small);  /* scalar (D % 4), two slices */
  check_embed_grad_skewed(c, 1200, 300, 64, 1, !small);  /* scalar (dy unaligned) */
  check_embed_grad_skewed(c, 600, 50, 1, 0, !small);     /* one column */
  if (!small) /* GPT-2 small's batch (8 x 1024) and padded vocabulary */
    check_embed_grad_skewed(c, 8192, 50304, 768, 0, 1);
  rt_cuda_close(c);
  s.gemm = RT_CUDA_GEMM_BF16; /* attention on tensor cores */
  if (rt_cuda_open(&c, &s, NULL, NULL)) {
    fprintf(stderr, "gpu_ops_check (bf16): %s\n", rt_last_error());
    rt_cuda_close(c);
    failures++;
  } else {
    /* bf16 GEMMs: operands converted to bf16 (dims multiples of 8, no batch) or
     * rounded by cuBLASLt (the others) */
    if (!small)
      check_mm(c, 8, 1024, 768, 2304, 0, 0, 1e-2);              /* GPT-2 qkv */
    if (!small)
      check_mm(c, 1, 8192, 768, 3072, RT_MM_TRANSPOSE_B, 0, 1e-2); /* dx of the MLP */
    if (!small)
      check_mm(c, 1, 768, 8192, 3072, 0, 1, 1e-2);              /* a weight gradient */
    check_mm(c, 1, 256, 64, 1001, RT_MM_TRANSPOSE_B, 0, 1e-2); /* odd vocabulary: logits */
    check_mm(c, 1, 256, 64, 1001, RT_MM_TRANSPOSE_B | RT_MM_ACCUMULATE, 0, 1e-2);
    check_mm(c, 1, 256, 1001, 64, 0, 0, 1e-2);               /* its dx (odd k) */
    check_mm(c, 1, 1001, 256, 64, 0, 1, 1e-2);               /* its weight gradient */
    check_mm(c, 1, 1001, 256, 64, RT_MM_ACCUMULATE, 1, 1e-2);
    check_mm(c, 4, 64, 32, 48, RT_MM_B_BATCHED, 0, 1e-2);    /* batched */
    /* operands stored as bf16 (codegen/cuda_store.h): a layer norm's output into
     * qkv, dlogits (wide rows) into the head's dx and weight gradient */
    check_mm_stored(c, 256, 64, 192, 0, 0, RT_CUDA_MM_A_BF16);
    check_mm_stored(c, 256, 320, 64, 0, 0, RT_CUDA_MM_A_BF16 | RT_CUDA_MM_A_WIDE);
    check_mm_stored(c, 320, 256, 64, 0, 1,
                    RT_CUDA_MM_A_BF16 | RT_CUDA_MM_A_WIDE | RT_CUDA_MM_B_BF16);
    if (!small) /* GPT-2 small's tied head (2048 of its 8192 rows): dx, the table's gradient */
      check_mm_stored(c, 2048, 50304, 768, 0, 0, RT_CUDA_MM_A_BF16 | RT_CUDA_MM_A_WIDE);
    if (!small)
      check_mm_stored(c, 50304, 2048, 768, 0, 1,
                      RT_CUDA_MM_A_BF16 | RT_CUDA_MM_A_WIDE | RT_CUDA_MM_B_BF16);
    /* weights from the params' bf16 copy: qkv's, a dx (b transposed) */
    check_params_bf16(256, 64, 192, 0);
    check_params_bf16(256, 192, 64, RT_MM_TRANSPOSE_B);
    if (!small) /* GPT-2 small's MLP up-projection, 2048 of its 8192 rows */
      check_params_bf16(2048, 768, 3072, 0);
    /* results stored as bf16: qkv's, a dx (b transposed), a weight gradient's shape */
    check_mm_out(c, 256, 64, 192, 0, 0);
    check_mm_out(c, 256, 192, 64, RT_MM_TRANSPOSE_B, 0);
    check_mm_out(c, 64, 256, 192, 0, 1);
    /* a weight gradient with its bias's from dy stored as bf16 (GPT-2 small's
     * MLP up-projection: 768 x 8192 x 3072) */
    check_mm_bgrad(c, 64, 256, 192, 1, 1e-2);
    if (!small)
      check_mm_bgrad(c, 768, 8192, 3072, 1, 1e-2);
    /* a product with its bias, bf16 (GPT-2 small's q|k|v: 8192 x 768 x 2304) */
    check_mm_bias(c, 64, 256, 192, 1);
    if (!small)
      check_mm_bias(c, 8192, 768, 2304, 1);
    /* GPT-2 small's MLP with gelu in the epilogue, bf16 (8192 x 768 x 3072: the
     * up-projection, and its dg = dy W^T times gelu'(h)) */
    check_mm_gelu(c, 64, 96, 384, 1, 0);
    check_mm_gelu(c, 64, 96, 384, 1, 1);
    if (!small) {
      check_mm_gelu(c, 8192, 768, 3072, 1, 0);
      check_mm_gelu(c, 8192, 768, 3072, 1, 1);
    }
    if (!small) /* GPT-2 small's MLP up-projection, 2048 of its 8192 rows */
      check_mm_out(c, 2048, 768, 3072, 0, 0);
    check_attn_bf16(c, 2, 4, 2, 130, 64, 1);
    check_attn_bf16(c, 1, 4, 1, 70, 128, 0);
    check_attn_bf16(c, 2, 4, 4, 100, 32, 1);
    check_attn_bf16(c, 1, 6, 2, 200, 80, 0);
    /* the fused backward's other shapes: hd 48 (3 column blocks a warp), hd 96 with
     * fp32 tensors (its next query tile not held in registers: MmaShape::hold_kvq) */
    check_attn_bf16(c, 1, 2, 1, 150, 48, 1);
    check_attn_bf16(c, 1, 4, 2, 90, 96, 1);
    if (!small)
      check_attn_bf16(c, 8, 12, 12, 1024, 64, 1); /* GPT-2 small */
    /* attention's tensors stored as bf16: all inputs, some (per-tensor flags),
     * hd 112 and 128 (the kernels' other register choices) */
    const unsigned all = RT_CUDA_ATTN_Q_BF16 | RT_CUDA_ATTN_K_BF16 | RT_CUDA_ATTN_V_BF16 |
                         RT_CUDA_ATTN_DY_BF16;
    check_attn_io(c, 2, 4, 2, 130, 64, 1, all);
    check_attn_io(c, 1, 4, 1, 70, 128, 0, RT_CUDA_ATTN_Q_BF16 | RT_CUDA_ATTN_V_BF16);
    check_attn_io(c, 1, 2, 2, 96, 112, 1, all);
    check_attn_io(c, 2, 4, 4, 64, 16, 1, RT_CUDA_ATTN_K_BF16 | RT_CUDA_ATTN_DY_BF16);
    if (!small)
      check_attn_io(c, 8, 12, 12, 1024, 64, 1, all); /* GPT-2 small */
    check_attn_dq_launches(c, &s, 2, 4, 2, 300, 64, 1);
    check_attn_dq_launches(c, &s, 2, 2, 2, 130, 32, 0);
    /* token-major attention: the mma kernels with fp32 and with bf16 tensors, the
     * WMMA ones (fp32 tensors only) */
    check_attn_layout(c, 2, 4, 2, 130, 64, 1, 0, "mma");
    check_attn_layout(c, 1, 6, 2, 96, 128, 0, all | RT_CUDA_ATTN_O_BF16, "mma, bf16 io");
    check_attn_layout(c, 2, 4, 4, 64, 16, 1, all | RT_CUDA_ATTN_O_ROUND, "mma, rounded");
    setenv("PARC_CUDA_ATTN", "wmma", 1);
    check_attn_layout(c, 2, 4, 2, 130, 64, 1, 0, "wmma");
    check_attn_layout(c, 1, 4, 1, 70, 128, 0, 0, "wmma");
    unsetenv("PARC_CUDA_ATTN");
    rt_cuda_close(c);
  }
  v_logits = rnd(VN * 2 * VL, 4);
  v_table = rnd(2 * VL * VD, 1);
  v_ids = malloc(4 * VN);
  for (int i = 0; i < VN; i++) v_ids[i] = (int32_t)((frand() * 0.5f + 0.5f) * (VV - 1));
  setenv("PARC_CUDA_COMM", "host", 1);
  if (rt_comm_threads_run(2, vocab_rank, NULL)) {
    fprintf(stderr, "vocab checks: %s\n", rt_last_error());
    failures++;
  }
  printf("gpu_ops_check: %s (%d failure%s)\n", failures ? "FAIL" : "ok", failures,
         failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
