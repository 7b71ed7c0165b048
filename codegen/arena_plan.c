/* codegen/arena_plan.c -- see arena_plan.h. */
#include "codegen/arena_plan.h"

#include <stdlib.h>

#include "codegen/cg_kernels.h"
#include "codegen/cuda_arena.h"
#include "codegen/cuda_batch.h"
#include "codegen/cuda_store.h"
#include "codegen/grad_onto.h"
#include "codegen/host.h"
#include "codegen/host_cuda.h"
#include "codegen/step_model.h"
#include "passes/bufplan.h"
#include "runtime/rt_gemm.h"

int cg_plan_step(IrModule *m, int fuse, const PpProgram *pp, CgKernelPlan *kp, int **pos,
                 BufPlan *bp, int **held, char *err, size_t len) {
  /* stage programs run a chunk's nodes apart from the others' (one chunk
   * and phase, one optimizer part, at a time): kernels keep to one colour;
   * each stage's arena holds its own values (pp_node_arenas) */
  int *colour = NULL;
  BufArenas ar = {0};
  if (pp) {
    size_t n = (size_t)m->nnodes + 1;
    colour = arena_alloc(&m->arena, sizeof(int) * n);
    uint64_t *where = arena_alloc(&m->arena, sizeof(uint64_t) * n);
    unsigned char *unread = arena_alloc(&m->arena, n);
    cg_pipe_colours(m, pp, colour);
    pp_node_arenas(m, pp, where, unread);
    /* a stage's slots weigh its end; the optimizer reads the gradients from
     * the accumulator (codegen/host.h, cg_pipe_grads_in_acc) */
    unsigned char *via_acc = arena_alloc(&m->arena, n), *opt = arena_alloc(&m->arena, n);
    cg_pipe_grads_in_acc(m, pp, via_acc, opt);
    ar = (BufArenas){.where = where, .unread = unread, .weight = pp->stage_slots,
                     .via_acc = via_acc, .acc_reader = opt};
  }
  if (cg_plan_kernels(m, fuse, colour, kp, err, len)) return -1;
  if (!pp) cg_onto_candidates(m, kp); /* (codegen/grad_onto.h) */
  if (!pp) ar.parts = kp->parts; /* dp buckets' gradients in the bucket (bufplan.h) */
  if (pp) { /* no buffer for a gradient only the accumulator holds (host.h) */
    int *into = cg_pipe_acc_into(m, pp, cg_results(m), ar.via_acc);
    for (int i = 0; i < m->nnodes; i++)
      if (into[i] >= 0 || (ar.via_acc[i] && pp->chunk[i] == PP_NODE_SKIP)) kp->materialize[i] = 0;
    kp->acc_into = into;
  }
  *pos = arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1));
  for (int i = 0; i < m->nnodes; i++)
    (*pos)[i] = kp->kernel_of[i] >= 0 ? kp->kernels[kp->kernel_of[i]].root : i;
  int *h = pp ? NULL : cg_async_waits(m, kp);
  bufplan_build_arenas(m, kp->materialize, cg_results(m), *pos, h, kp->view_of, NULL, &ar, bp);
  for (int k = 0; k < kp->nkernels; k++) { /* (what the buffer plan did not make a view copies) */
    CgKernel *kk = &kp->kernels[k];
    if (kk->assembles && bp->part_of[kk->root] != kk->root) kk->assembles = 0;
    if (kk->range_view && bp->alias[kk->root] != kp->view_of[kk->root]) kk->range_view = 0;
  }
  if (held) *held = h;
  else free(h);
  return 0;
}

int cg_plan_whole_step(IrModule *m, int fuse, const PpProgram *pp, int bf16, int store, int batch,
                       CgStepPlan *sp, char *err, size_t len) {
  if (cg_plan_step(m, fuse, pp, &sp->kp, &sp->pos, &sp->bp, &sp->held, err, len)) return -1;
  sp->canon = arena_alloc(&m->arena, sizeof(int) * (size_t)(sp->kp.nkernels + 1));
  cg_dedup_kernels(&sp->kp, sp->canon);
  /* the GPU's code: the same kernels, some storing bf16 (codegen/cuda_store.h),
   * and its arena: those values at 2 bytes an element (codegen/cuda_arena.h) */
  cg_cuda_store_plan(m, &sp->kp, &sp->bp, sp->canon, bf16, (CgStoreMode)store, pp, &sp->store);
  cg_cuda_arena_plan(m, &sp->kp, sp->pos, sp->held, &sp->bp, &sp->store, &sp->gbp);
  cg_plan_leaves(m, &sp->lp);
  /* a tied embedding's gradient added onto the head's (codegen/grad_onto.h) */
  if (cg_plan_onto(m, &sp->kp, &sp->bp, &sp->gbp, &sp->store, err, len) < 0) {
    cg_step_plan_free(sp);
    return -1;
  }
  /* launches of one code run together where independent (codegen/cuda_batch.h) */
  cg_cuda_batch_plan(m, &sp->kp, &sp->gbp, &sp->lp, &sp->store, batch, pp, &sp->batches);
  return 0;
}

void cg_step_plan_free(CgStepPlan *sp) {
  free(sp->held);
  sp->held = NULL;
  cg_plan_free(&sp->kp);
}

int cg_plan_arena(IrModule *m, int fuse, const PpProgram *pp, int64_t *arena_bytes,
                  const Machine *mc, int bf16, StepTime *st, int store, int batch, GpuBytes *gpu,
                  char *err, size_t len) {
  CgStepPlan sp;
  if (cg_plan_whole_step(m, fuse, pp, bf16, store, batch, &sp, err, len)) return -1;
  *arena_bytes = cg_trainer_arena_bytes(m, pp, &sp.kp, &sp.bp);
  if (gpu) cg_gpu_bytes(m, &sp.kp, &sp.gbp, &sp.lp, &sp.store, bf16, pp, gpu);
  if (st && !pp)
    cg_step_model(m, &sp.kp, mc ? mc : machine_default, bf16, &sp.store, &sp.batches, st);
  cg_step_plan_free(&sp);
  return 0;
}

/* The bf16 operand workspaces of m's GEMMs (cg_gemm_ws_bytes' arithmetic),
 * over those of stage `stage` where pp is not NULL (a chunk's nodes run on
 * stage chunk % P: the GEMM table that stage's start gives rt_cuda_open). */
static int64_t gemm_ws(const IrModule *m, const CgKernelPlan *kp, int bf16,
                       const unsigned char *stored, int weights, const PpProgram *pp, int stage) {
  RtCudaGemm *g = calloc((size_t)m->nnodes + 1, sizeof *g);
  if (!g) return 0;
  int n = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *x = m->nodes[i];
    if (x->op != IR_OP_MATMUL && x->op != IR_OP_MATMUL_TA) continue;
    if (pp && (pp->chunk[i] < 0 || pp->chunk[i] % pp->nstages != stage)) continue;
    g[n] = cg_cuda_gemm(x);
    /* (C_ROUND, round mode's, takes what bf16 operands take: no rounded[] here) */
    g[n].flags |= cg_cuda_stored_flags(x, stored, NULL, weights);
    if (kp && kp->acc_into && kp->acc_into[i] >= 0) g[n].flags |= RT_MM_ACCUMULATE; /* (host.h) */
    n++;
  }
  int64_t need[3];
  int64_t bytes = rt_cuda_gemms_ws(g, n, bf16 ? RT_CUDA_GEMM_BF16 : RT_CUDA_GEMM_FP32,
                                   RT_CUDA_OPERANDS_ALIGNED, need);
  free(g);
  /* the params' bf16 copy, which rt_cuda_open counts with the workspaces (a
   * stage: of its own params, on every stage where a GEMM reads a weight) */
  int64_t params = pp ? pp->stage_params_numel[stage] : cg_params_numel(m);
  return bytes + (bf16 && cg_cuda_weights_read(m, weights) ? 2 * (params ? params : 8) : 0);
}

int64_t cg_gemm_ws_bytes(const IrModule *m, int bf16, const unsigned char *stored, int weights) {
  return gemm_ws(m, NULL, bf16, stored, weights, NULL, 0);
}

void cg_gpu_bytes(const IrModule *m, const CgKernelPlan *kp, const BufPlan *gbp,
                  const CgLeafPlan *lp, const CgCudaStore *store, int bf16, const PpProgram *pp,
                  GpuBytes *out) {
  int64_t arena = cg_arena_bytes(kp, gbp, NULL);
  const IrNode *tok = cg_tokens_input(m);
  int64_t ntok = tok ? ir_numel(tok) : 0;
  out->nstages = 0;
  /* (the same on every stage: the module's largest piece, RtCudaSetup.reduce_piece) */
  out->reduce_ws = 4 * store->reduce_piece;
  out->attn_dq_ws = store->attn_dq; /* (likewise the module's largest) */
  if (!pp) {
    out->gemm_ws = cg_gemm_ws_bytes(m, bf16, store->bf16, store->weights);
    out->arena = gbp->narrow ? arena : 0;
    out->device = rt_cuda_planned_bytes(lp->params_numel, lp->state_numel, arena, ntok,
                                        out->gemm_ws + out->reduce_ws + out->attn_dq_ws);
    return;
  }
  /* a stage's rank: its own parameters and state, its slots' arena (gbp plans
   * them at once, each stage's slot as far as its values reach), every
   * microbatch's tokens, its own GEMMs' workspaces */
  int64_t *slot = out->stage_slot;
  cg_pipe_slot_bytes(m, pp, kp, gbp, slot, NULL);
  out->arena = gbp->narrow ? cg_pipe_arena_bytes(pp, slot, -1) : 0;
  out->gemm_ws = out->device = out->slot = 0;
  out->nstages = pp->nstages;
  for (int s = 0; s < pp->nstages && s < PP_MAX_STAGES; s++) {
    out->stage_slots[s] = pp->stage_slots[s];
    if (slot[s] > out->slot) out->slot = slot[s];
    /* (a stage whose arena no value names, were there one: the largest, a bound) */
    out->stage_live[s] = s < gbp->narenas ? gbp->arena_live[s] : gbp->live_peak;
    int64_t ws = gemm_ws(m, kp, bf16, store->bf16, store->weights, pp, s);
    out->stage_device[s] = rt_cuda_planned_bytes(pp->stage_params_numel[s],
                                                 pp->stage_state_numel[s],
                                                 cg_pipe_arena_bytes(pp, slot, s),
                                                 ntok * pp->microbatches,
                                                 ws + out->reduce_ws + out->attn_dq_ws);
    if (out->stage_device[s] > out->device) out->device = out->stage_device[s];
    if (ws > out->gemm_ws) out->gemm_ws = ws;
  }
}
