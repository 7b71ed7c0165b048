/* runtime/cuda/rt_cuda_ws_plan.c -- see rt_cuda_ws_plan.h.  The arithmetic
 * mirrors rt_cuda_gemm.cu's gemm(): batch folded into m unless ta or b is
 * batched; a [ar, ac] and b [br, bc] row-major as cuBLASLt reads them. */
#include "runtime/cuda/rt_cuda_ws_plan.h"

#include "runtime/rt_gemm.h" /* RT_MM_* */

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

int rt_cuda_gemm_bf16ops(int mode, int operands, int64_t batch, int64_t k, int64_t n) {
  if (mode != RT_CUDA_GEMM_BF16 || operands == RT_CUDA_OPERANDS_FP32 || batch != 1) return 0;
  return operands == RT_CUDA_OPERANDS_BF16 || (k % 8 == 0 && n % 4 == 0);
}

/* a [ar, ac] and b [br, bc] as cuBLASLt reads them; returns the folded m */
static int64_t shapes(const RtCudaGemm *g, int64_t *batch, int64_t rc[4]) {
  int64_t m = g->m, k = g->k, n = g->n;
  *batch = g->batch;
  if (!g->ta && !(g->flags & RT_MM_B_BATCHED)) m *= *batch, *batch = 1;
  int tb = (g->flags & RT_MM_TRANSPOSE_B) != 0;
  rc[0] = g->ta ? k : m, rc[1] = g->ta ? m : k, rc[2] = tb ? n : k, rc[3] = tb ? k : n;
  return m;
}

int rt_cuda_gemm_stored_ok(const RtCudaGemm *g, int which) {
  int64_t batch, rc[4];
  shapes(g, &batch, rc);
  return rt_cuda_gemm_bf16ops(RT_CUDA_GEMM_BF16, RT_CUDA_OPERANDS_ALIGNED, batch, g->k, g->n) &&
         rc[2 * which + 1] % 8 == 0;
}

int rt_cuda_gemm_out_stored_ok(const RtCudaGemm *g) {
  int64_t batch, rc[4];
  shapes(g, &batch, rc);
  return rt_cuda_gemm_bf16ops(RT_CUDA_GEMM_BF16, RT_CUDA_OPERANDS_ALIGNED, batch, g->k, g->n) &&
         g->n % 8 == 0 && !(g->flags & RT_MM_ACCUMULATE);
}

int rt_cuda_attn_stored_ok(int64_t hd, int64_t T) {
  return hd >= 16 && hd <= 128 && hd % 16 == 0 && T >= 1 && T <= ((int64_t)1 << 30);
}

int64_t rt_cuda_attn_dq_rows(int64_t T, int64_t keys, int causal) {
  const int64_t tiles = (T + keys - 1) / keys;
  return tiles * T - (causal ? keys * tiles * (tiles - 1) / 2 : 0);
}

int64_t rt_cuda_attn_dq_group(int64_t H, int64_t KV, int64_t T, int64_t hd, int causal,
                              int64_t keys) {
  return H / KV * rt_cuda_attn_dq_rows(T, keys, causal) * hd * 4;
}

int64_t rt_cuda_attn_dq_groups(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                               int causal, int64_t keys, int64_t avail) {
  const int64_t per = rt_cuda_attn_dq_group(H, KV, T, hd, causal, keys), groups = B * KV;
  if (per <= 0 || groups <= 0 || avail < per) return 0;
  const int64_t most = avail / per < groups ? avail / per : groups;
  const int64_t launches = (groups + most - 1) / most;
  return (groups + launches - 1) / launches;
}

int64_t rt_cuda_attn_dq_ws(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, int causal) {
  if (!rt_cuda_attn_stored_ok(hd, T) || KV < 1 || H % KV) return 0;
  const int64_t per = rt_cuda_attn_dq_group(H, KV, T, hd, causal, 128);
  const int64_t avail = per > RT_CUDA_ATTN_DQ_MAX ? per : RT_CUDA_ATTN_DQ_MAX;
  return rt_cuda_attn_dq_groups(B, H, KV, T, hd, causal, 128, avail) * per;
}

void rt_cuda_gemm_ws(const RtCudaGemm *g, int mode, int operands, int64_t need[3]) {
  int64_t batch, rc[4], n = g->n;
  int64_t m = shapes(g, &batch, rc);
  int stored = g->flags & (RT_CUDA_MM_A_BF16 | RT_CUDA_MM_B_BF16 | RT_CUDA_MM_C_BF16 |
                           RT_CUDA_MM_C_ROUND);
  need[0] = need[1] = need[2] = 0;
  if (!stored && !rt_cuda_gemm_bf16ops(mode, operands, batch, g->k, n)) return;
  need[0] = (g->flags & RT_CUDA_MM_A_BF16) ? 0 : rc[0] * round8(rc[1]) * 2;
  need[1] = (g->flags & RT_CUDA_MM_B_BF16) ? 0 : rc[2] * round8(rc[3]) * 2;
  if (n % 4) need[2] = m * round8(n) * 4;
}

int64_t rt_cuda_gemms_ws(const RtCudaGemm *g, int n, int mode, int operands, int64_t need[3]) {
  need[0] = need[1] = need[2] = 0;
  for (int i = 0; i < n; i++) {
    int64_t x[3];
    rt_cuda_gemm_ws(&g[i], mode, operands, x);
    for (int s = 0; s < 3; s++)
      if (x[s] > need[s]) need[s] = x[s];
  }
  return need[0] + need[1] + need[2];
}

int64_t rt_cuda_planned_bytes(int64_t params_numel, int64_t state_numel, int64_t arena_bytes,
                              int64_t ntok, int64_t ws) {
  return 4 * params_numel + 4 * state_numel + arena_bytes + 2 * 4 * ntok + 16 * 4 +
         RT_CUDA_GEMM_WORKSPACE + ws;
}
