/* passes/remat.c -- a pointwise op of one activation and parameters,
 * recomputed in the backward instead of stored by the forward.
 *
 * GPT-2's MLP computes h = add(matmul(x, w), b) and gelu(h); gelu's gradient
 * reads h again.  So the forward kernel stored h beside gelu(h): a write of
 * [B, T, 4C] a layer that only the backward reads.  The matmul's result a is
 * all h needs besides the bias, and it has the same size: keeping a alive
 * instead of h costs the same bytes, and the backward kernel can compute
 * add(a, b) as it loads it.  This pass rewrites every such p = OP(a, l..)
 * (pointwise, f32, computed in the forward) where
 *   - a is its one input that is not a leaf, of p's element count, and every
 *     other input is a leaf (a parameter, an input: alive all step anyway);
 *   - p has readers in the forward and in the backward (phases B, W), all of
 *     them pointwise ops, so that p and its copy are each computed inside
 *     their readers' kernels (codegen/cg_kernels.h, Fusion) and neither is
 *     stored;
 *   - nothing else holds p (the loss, an update, a parameter's gradient);
 * into p for the forward readers and, for each backward reader r, a copy
 * p' = OP(a, l..) (same attributes) of its own, placed right before r, in
 * r's phase and with p's layer and location.  A copy per reader: one copy
 * with readers in two kernels would be stored for both (GPT-2's gelu(h)
 * under --recompute pointwise, passes/remat_act.c, reads h beside gelu's
 * gradient; they are two kernels, one of them the weight gradient's
 * operand), while a copy with one reader is computed inside its kernel.  a
 * lives until the last copy is read, as the one copy did, with p's element
 * count.  Each p' computes p's values from the same
 * operands by the same op: the same bits where nothing is rounded on the way
 * (the bf16 trainer stored h rounded to bf16; p' is not rounded: codegen/
 * cuda_store.h).  A GELU's input that the GPU trainer's GEMM epilogues
 * store and read (passes/gelu_epilogue.c, bf16 mixed precision) stays as it
 * is.  Runs after autodiff, on the module codegen writes. */
#include <stdlib.h>

#include "passes/passes.h"

static int pointwise(const IrNode *n) { return (ir_op_info[n->op].flags & IR_F_POINTWISE) != 0; }

/* 1 if p qualifies by its inputs (the head comment's first point) */
static int one_activation(const IrNode *p) {
  int acts = 0;
  for (int j = 0; j < p->ninputs; j++) {
    const IrNode *x = p->inputs[j];
    if (ir_op_info[x->op].flags & IR_F_LEAF) continue;
    if (x->dtype != IR_F32 || ir_numel(x) != ir_numel(p)) return 0;
    acts++;
  }
  return acts == 1;
}

int pass_remat(IrModule *m) {
  int nold = m->nnodes;
  /* per node: readers in the forward, in the backward, and not pointwise */
  int *fwd = ir_xcalloc((size_t)nold, sizeof *fwd), *bwd = ir_xcalloc((size_t)nold, sizeof *bwd);
  int *other = ir_xcalloc((size_t)nold, sizeof *other);
  for (int i = 0; i < nold; i++) {
    const IrNode *n = m->nodes[i];
    for (int j = 0; j < n->ninputs; j++) {
      int x = n->inputs[j]->id;
      if (n->phase == IR_PHASE_FWD) fwd[x]++;
      else if (n->phase == IR_PHASE_B || n->phase == IR_PHASE_W) bwd[x]++;
      else other[x]++;
      if (!pointwise(n)) other[x]++;
    }
  }
  IrNode **copy = ir_xcalloc((size_t)nold, sizeof *copy); /* per p: its latest p' */
  int *copy_for = ir_xcalloc((size_t)nold, sizeof *copy_for); /* per p: that p''s reader */
  size_t edges = 1; /* a copy per (reader, input) at most */
  for (int i = 0; i < nold; i++) edges += (size_t)m->nodes[i]->ninputs;
  int *at = ir_xcalloc(edges, sizeof *at);            /* per p': placed before node at */
  IrNode **made = ir_xcalloc(edges, sizeof *made);    /* the copies, made in order */
  int rc = 0, nmade = 0;
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *r = m->nodes[i];
    if (r->phase != IR_PHASE_B && r->phase != IR_PHASE_W) continue;
    for (int j = 0; j < r->ninputs; j++) {
      IrNode *p = r->inputs[j];
      if (p->id >= nold || p->phase != IR_PHASE_FWD || !pointwise(p) || p->dtype != IR_F32 ||
          !fwd[p->id] || !bwd[p->id] || other[p->id] || !one_activation(p) || ir_node_held(m, p) ||
          gelu_epilogue_input(m, p))
        continue;
      if (!copy[p->id] || copy_for[p->id] != i) { /* p's next backward reader: a p' before it */
        IrNode proto = {.op = p->op, .inputs = p->inputs, .ninputs = p->ninputs,
                        .ia = {p->ia[0], p->ia[1], p->ia[2]}, .fa = p->fa};
        IrNode *c = ir_add_inferred(m, &proto, p, r->phase, "remat");
        if (!c) {
          rc = -1;
          break;
        }
        copy[p->id] = c;
        copy_for[p->id] = i;
        at[nmade] = i;
        made[nmade++] = c;
      }
      r->inputs[j] = copy[p->id];
    }
  }
  if (!rc && nmade) ir_insert_before(m, nold, made, at, nmade); /* the copies into place */
  free(at);
  free(made);
  free(fwd);
  free(bwd);
  free(other);
  free(copy);
  free(copy_for);
  return rc;
}
