/* codegen/cuda_store.c -- see cuda_store.h. */
#include "codegen/cuda_store.h"

#include <stdio.h>
#include <string.h>

#include "codegen/host.h"
#include "codegen/host_cuda.h"
#include "runtime/cuda/rt_cuda_ws_plan.h"

/* A reshape of x whose buffer is x's (a view: no kernel copies it); for a
 * value stored wide (rows of 2 cols), one that keeps the rows. */
static int is_view_of(const CgKernelPlan *kp, const BufPlan *bp, const IrNode *q, const IrNode *x,
                      int wide) {
  return q->op == IR_OP_RESHAPE && kp->view_of[q->id] == x->id && bp->alias[q->id] >= 0 &&
         bp->offset[q->id] == bp->offset[x->id] &&
         (!wide || q->shape[q->rank - 1] == x->shape[x->rank - 1]);
}

/* 1 if every reader of n is a GEMM that may read it stored as bf16, or a view
 * of n whose readers are (recursively); mark[] gets n's views. */
static int gemm_readers_only(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                             const IrNode *n, int wide, unsigned char *mark) {
  int readers = 0;
  for (int i = n->id + 1; i < m->nnodes; i++) {
    const IrNode *q = m->nodes[i];
    for (int j = 0; j < q->ninputs; j++) {
      if (q->inputs[j] != n) continue;
      readers++;
      if (is_view_of(kp, bp, q, n, wide)) {
        if (!gemm_readers_only(m, kp, bp, q, wide, mark)) return 0;
        mark[q->id] = 1;
        continue;
      }
      if ((q->op != IR_OP_MATMUL && q->op != IR_OP_MATMUL_TA) || j > 1) return 0;
      const RtCudaGemm g = cg_cuda_gemm(q);
      if (!rt_cuda_gemm_stored_ok(&g, j)) return 0;
    }
  }
  return readers > 0;
}

/* Stores n as bf16 (how: 1 dense, 2 wide), and its views, if every reader
 * is a GEMM that may read it so. */
static void mark(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, const IrNode *n,
                 int how, unsigned char *views, unsigned char *bf16) {
  memset(views, 0, (size_t)m->nnodes);
  if (!gemm_readers_only(m, kp, bp, n, how == 2, views)) return;
  bf16[n->id] = (unsigned char)how;
  for (int v = n->id + 1; v < m->nnodes; v++)
    if (views[v]) bf16[v] = (unsigned char)how;
}

/* The bf16 params of kernel instance k, as a mask (params past 63: never). */
static uint64_t mask_of(const CgKernel *k, const unsigned char *bf16) {
  uint64_t mask = 0;
  for (int p = 0; p < k->nargs && p < 64; p++)
    if (k->arg_node[p] >= 0 && bf16[k->arg_node[p]]) mask |= (uint64_t)1 << p;
  return mask;
}

void cg_cuda_store_plan(IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, const int *canon,
                        int bf16, int pipelined, CgCudaStore *out) {
  memset(out, 0, sizeof *out);
  out->bf16 = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  out->canon = arena_alloc(&m->arena, sizeof(int) * (size_t)(kp->nkernels + 1));
  out->code = arena_alloc(&m->arena, sizeof(KirKernel *) * (size_t)(kp->nkernels + 1));
  unsigned char *keep = cg_results(m);
  unsigned char *views = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  /* the candidates: stored by a kernel as an out param (at most 64 params) */
  for (int i = 0; bf16 && !pipelined && i < kp->nkernels; i++) {
    const CgKernel *k = &kp->kernels[i];
    if (cg_kernel_is_view(kp, bp, i)) continue;
    for (int p = 0; p < k->nargs && p < 64; p++) {
      int a = k->arg_node[p];
      const KirParam *q = &k->k->params[p];
      if (a < 0 || q->access != KIR_OUT || q->elem != KIR_F32) continue;
      const IrNode *n = m->nodes[a];
      if (n->dtype != IR_F32 || keep[a] || kp->inplace_of[a] >= 0 || kp->view_of[a] >= 0 ||
          bp->alias[a] >= 0 || bp->offset[a] < 0)
        continue;
      mark(m, kp, bp, n, 1, views, out->bf16);
    }
  }
  /* (vocab_)cross_entropy_grad's dlogits: rt_cuda_(vocab_)cross_entropy_grad_bf16
   * store them wide, in place of the logits or not */
  for (int i = 0; bf16 && !pipelined && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if ((n->op == IR_OP_CROSS_ENTROPY_GRAD || n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD) &&
        !keep[i] && bp->offset[i] >= 0 &&
        kp->view_of[i] < 0)
      mark(m, kp, bp, n, 2, views, out->bf16);
  }
  for (int i = 0; i < m->nnodes; i++) /* (a view is its value's buffer: not counted again) */
    if (out->bf16[i] && kp->view_of[i] < 0) out->count++, out->elements += ir_numel(m->nodes[i]);
  /* the code of each instance: its shared code, retyped where it stores bf16 */
  uint64_t *mask = arena_alloc(&m->arena, sizeof(uint64_t) * (size_t)(kp->nkernels + 1));
  for (int i = 0; i < kp->nkernels; i++) {
    /* (a view's kernel launches nothing: it keeps its f32 code) */
    mask[i] = cg_kernel_is_view(kp, bp, i) ? 0 : mask_of(&kp->kernels[i], out->bf16);
    int base = canon ? canon[i] : i;
    out->canon[i] = i;
    for (int j = 0; j < i; j++)
      if (out->canon[j] == j && (canon ? canon[j] : j) == base && mask[j] == mask[i]) {
        out->canon[i] = j;
        break;
      }
    if (out->canon[i] != i) continue;
    const KirKernel *src = kp->kernels[base].k;
    if (!mask[i]) {
      out->code[i] = kp->kernels[base].k;
      continue;
    }
    KirKernel *c = arena_alloc(&m->arena, sizeof *c);
    *c = *src; /* a view of src's nodes, rows and loops; its own params and name */
    c->params = arena_alloc(&m->arena, sizeof(KirParam) * (size_t)src->nparams);
    memcpy(c->params, src->params, sizeof(KirParam) * (size_t)src->nparams);
    for (int p = 0; p < c->nparams && p < 64; p++)
      if (mask[i] >> p & 1) c->params[p].elem = KIR_BF16;
    size_t len = strlen(kp->kernels[i].k->name) + 6;
    c->name = arena_alloc(&m->arena, len);
    snprintf(c->name, len, "%s_bf16", kp->kernels[i].k->name);
    out->code[i] = c;
  }
}
