/* passes/gelu_epilogue.c -- a GELU of a linear layer, arranged so that the
 * GPU trainer's GEMMs compute it and its gradient in their epilogues.
 *
 * GPT-2's MLP computes h = add(matmul(x, w), b), gelu(h), and in the
 * backward dh = gelu_grad(h, dg) with dg = matmul(dy, w2^T).  cuBLASLt can
 * write gelu(h) and h itself (its aux output) from the GEMM of h
 * (GELU_AUX_BIAS), and dh from the GEMM of dg, reading h as its aux input
 * (DGELU): two memory-bound kernels a layer fewer (codegen/cuda_batch.h says
 * when the trainer asks for them).  Both need h stored, and dh computed
 * right where dg is.  So, in a module of bf16 mixed precision (machine_bf16:
 * the precision whose GPU trainer asks for the epilogues), for every such h:
 *   - h is kept from the forward for its gradients: passes/remat.c, which
 *     would otherwise have the backward recompute h from the matmul's result
 *     (the same bytes kept, one kernel write more where no epilogue runs),
 *     leaves it (gelu_epilogue_input);
 *   - each dg's matmul moves to right before its gelu_grad(h, dg) (past the
 *     layer's other weight-gradient GEMM, which autodiff put between them).
 *     Its operands are computed earlier still, and its one reader comes
 *     right after it: dg lives shorter, nothing else longer.  (Moving the
 *     gelu_grad up instead would keep the GELU's output, which that other
 *     GEMM reads, alive beside dg and dh.)
 * h qualifies (gelu_epilogue_input) when it is add(mm, b), f32, in the
 * forward (or in the backward: --recompute layers' copy of the forward,
 * passes/remat_layer.c), mm a matmul of h's phase and shape that h alone
 * reads, b a parameter [last dim]; its readers are one gelu of h's phase,
 * one or more backward gelu_grad(h, dg), each dg a backward matmul that its
 * gelu_grad alone reads, and any later gelu (--recompute pointwise's copy
 * of the forward's, passes/remat_act.c: its kernel reads the kept h);
 * nothing else reads h or holds it (ir_node_held).  Values are the
 * same whichever way (h recomputed or kept: the same op on the same
 * operands).  Runs after autodiff and the other remat passes, before remat. */
#include <stdlib.h>

#include "passes/machine.h"
#include "passes/passes.h"

/* How many readers each node has (an input read twice counts twice). */
static int *reader_counts(const IrModule *m) {
  int *count = ir_xcalloc((size_t)m->nnodes + 1, sizeof *count);
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) count[m->nodes[i]->inputs[j]->id]++;
  return count;
}

/* 1 if p qualifies (the head comment), with count[] its module's reader counts. */
static int qualifies(const IrModule *m, const IrNode *p, const int *count) {
  if (p->op != IR_OP_ADD || (p->phase != IR_PHASE_FWD && p->phase != IR_PHASE_B) ||
      p->dtype != IR_F32 || p->ninputs != 2 || p->rank < 2 || ir_node_held(m, p))
    return 0;
  const int j = p->inputs[0]->op == IR_OP_MATMUL ? 0 : 1;
  const IrNode *mm = p->inputs[j], *b = p->inputs[1 - j];
  if (mm->op != IR_OP_MATMUL || mm->phase != p->phase || !ir_same_shape(mm, p) ||
      count[mm->id] != 1 || b->op != IR_OP_PARAM || b->rank != 1 ||
      b->shape[0] != p->shape[p->rank - 1])
    return 0;
  int gelus = 0, grads = 0, again = 0;
  for (int i = p->id + 1; i < m->nnodes; i++) {
    const IrNode *r = m->nodes[i];
    for (int q = 0; q < r->ninputs; q++) {
      if (r->inputs[q] != p) continue;
      if (r->op == IR_OP_GELU) { /* the forward's, or its copy (remat_act) */
        gelus += r->phase == p->phase;
        again += r->phase != p->phase && (r->phase == IR_PHASE_B || r->phase == IR_PHASE_W);
        continue;
      }
      const IrNode *dg = r->ninputs == 2 ? r->inputs[1] : NULL;
      if (r->op != IR_OP_GELU_GRAD || q != 0 || r->phase != IR_PHASE_B || !dg || dg == p ||
          dg->op != IR_OP_MATMUL || dg->phase != IR_PHASE_B || count[dg->id] != 1)
        return 0;
      grads++;
    }
  }
  return gelus == 1 && grads >= 1 && gelus + grads + again == count[p->id];
}

int gelu_epilogue_input(const IrModule *m, const IrNode *p) {
  if (!machine_bf16(m) || p->op != IR_OP_ADD) return 0;
  int *count = reader_counts(m);
  int ok = qualifies(m, p, count);
  free(count);
  return ok;
}

int pass_gelu_epilogue(IrModule *m) {
  if (!machine_bf16(m)) return 0;
  int n = m->nnodes, moved = 0;
  int *count = reader_counts(m);
  /* before[i]: the dg matmul to place right before node i (its gelu_grad), else -1 */
  int *before = ir_xcalloc((size_t)n + 1, sizeof *before);
  unsigned char *moves = ir_xcalloc((size_t)n + 1, 1);
  for (int i = 0; i < n; i++) before[i] = -1;
  for (int i = 0; i < n; i++) {
    const IrNode *p = m->nodes[i];
    if (p->op != IR_OP_ADD || !qualifies(m, p, count)) continue;
    for (int r = i + 1; r < n; r++) {
      const IrNode *g = m->nodes[r];
      if (g->op != IR_OP_GELU_GRAD || g->inputs[0] != p) continue;
      const int dg = g->inputs[1]->id;
      if (dg == r - 1) continue; /* in place already */
      before[r] = dg, moves[dg] = 1, moved++;
    }
  }
  if (moved) {
    IrNode **order = ir_xcalloc((size_t)n, sizeof *order);
    int k = 0;
    for (int i = 0; i < n; i++) {
      if (moves[i]) continue;
      if (before[i] >= 0) order[k++] = m->nodes[before[i]];
      order[k++] = m->nodes[i];
    }
    ir_set_order(m, order, k);
    free(order);
  }
  free(count);
  free(before);
  free(moves);
  return 0;
}
