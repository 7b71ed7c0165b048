/* codegen/arena_plan.c -- see arena_plan.h. */
#include "codegen/arena_plan.h"

#include <stdlib.h>

#include "codegen/cg_kernels.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "codegen/host_cuda.h"
#include "codegen/step_model.h"
#include "passes/bufplan.h"

int cg_plan_arena(IrModule *m, int fuse, int64_t *arena_bytes, const Machine *mc, int bf16,
                  StepTime *st, int store, int64_t *gemm_ws, char *err, size_t len) {
  CgKernelPlan kp;
  if (cg_plan_kernels(m, fuse, NULL, &kp, err, len)) return -1;
  /* as in cg_write_project: a kernel's nodes live from where its root runs */
  int *pos = arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1));
  for (int i = 0; i < m->nnodes; i++)
    pos[i] = kp.kernel_of[i] >= 0 ? kp.kernels[kp.kernel_of[i]].root : i;
  BufPlan bp;
  int *held = cg_async_waits(m, &kp); /* as cg_write_project: async dp buckets */
  bufplan_build_views(m, kp.materialize, cg_results(m), pos, held, kp.view_of, &bp);
  free(held);
  *arena_bytes = cg_arena_bytes(&kp, &bp, NULL);
  CgCudaStore plan;
  cg_cuda_store_plan(m, &kp, &bp, NULL, bf16, (CgStoreMode)store, 0, &plan);
  if (st) cg_step_model(m, &kp, mc ? mc : machine_default, bf16, plan.bf16, st);
  if (gemm_ws) *gemm_ws = cg_gemm_ws_bytes(m, bf16, plan.bf16);
  cg_plan_free(&kp);
  return 0;
}

int64_t cg_gemm_ws_bytes(const IrModule *m, int bf16, const unsigned char *stored) {
  RtCudaGemm *g = malloc(sizeof *g * (size_t)(m->nnodes + 1));
  if (!g) return 0;
  int n = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *x = m->nodes[i];
    if (x->op != IR_OP_MATMUL && x->op != IR_OP_MATMUL_TA) continue;
    g[n] = cg_cuda_gemm(x);
    /* (C_ROUND, round mode's, takes what bf16 operands take: no rounded[] here) */
    g[n++].flags |= cg_cuda_stored_flags(x, stored, NULL);
  }
  int64_t need[3];
  int64_t bytes = rt_cuda_gemms_ws(g, n, bf16 ? RT_CUDA_GEMM_BF16 : RT_CUDA_GEMM_FP32,
                                   RT_CUDA_OPERANDS_ALIGNED, need);
  free(g);
  return bytes;
}
