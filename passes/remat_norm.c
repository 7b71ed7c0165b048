/* passes/remat_norm.c -- a layer's normalised inputs recomputed in the
 * backward instead of kept from the forward (parc --recompute norms).
 *
 * A pre-norm block reads y = norm(x, w..) (layer_norm, rms_norm) in its
 * forward GEMMs, and their weight gradients read y again in the backward:
 * so y, or at tp its group_copy (the identity forward ahead of the
 * column-parallel GEMMs), is kept from the forward to the backward, one
 * [tokens, d] value a norm and layer.  The norm's own gradient reads x, so x
 * is kept anyway; recomputing y from x in the backward costs one
 * memory-bound kernel a norm and frees those values (Llama 3 8B at tp 8: a
 * third of the GPU arena's peak, parc --explain memory).
 *
 * For every norm p = NORM(x, l..) computed in the forward inside a repeat
 * (a layer: its value would be kept over the later layers' forward and
 * backward) whose other inputs l.. are leaves, the values V = {p} and every
 * group_copy of p computed in the forward (the same values: group_copy is the
 * identity forward) are read in the backward (phases B, W) through p' =
 * NORM(x, l..) (same attributes), placed right before the first of those
 * readers, in its phase, with p's layer and location; and a forward reshape
 * of p (a view: MoE's tokens, [B, T, d] as [B T, d]) through the same reshape
 * of p', right after p'; when
 *   - no member of V is held otherwise (ir_node_held: the loss, an update,
 *     a parameter's gradient);
 *   - x is read after that place, in phase W or where p' runs in phase B
 *     (so p' never keeps x longer: a zero-bubble schedule runs the W phase
 *     last);
 * Other readers (an --sp all_gather of p, say) keep their values.  p'
 * computes p's bits: the kernel planner gives a norm with such a twin a
 * kernel of its own, no fused prologue (codegen/cg_kernels.h, FUSION), so
 * both run one kernel code on the same buffers (tests/codegen/cg_remat_norm.c;
 * the bf16 GPU trainer stores p' as bf16 as it stored p, codegen/cuda_store.h).
 * Against the default trainer, whose forward norms fuse the residual add
 * before them, the row sums run in another order: the trainers agree to
 * rounding, not bit for bit (tests/trainer/trainer_test.py recompute_norms).
 * Runs after autodiff, before attn_delta, on the module codegen writes
 * (pipelined trainers' too). */
#include <stdlib.h>

#include "passes/passes.h"

/* 1 if node r reads x among its inputs */
static int reads(const IrNode *r, const IrNode *x) {
  for (int j = 0; j < r->ninputs; j++)
    if (r->inputs[j] == x) return 1;
  return 0;
}

/* 1 if v is p or a forward group_copy of p (the same values) */
static int same_value(const IrNode *v, const IrNode *p) {
  return v == p || (v->op == IR_OP_GROUP_COPY && v->phase == IR_PHASE_FWD && v->inputs[0] == p);
}

/* 1 if v is a forward reshape of p (its values, in another shape: a view) */
static int view_of(const IrNode *v, const IrNode *p) {
  return v->op == IR_OP_RESHAPE && v->phase == IR_PHASE_FWD && v->inputs[0] == p;
}

int pass_remat_norm(IrModule *m) {
  int nold = m->nnodes, nmade = 0, rc = 0;
  /* the copies in order, at most two a node (a norm's, a view's) */
  IrNode **made = ir_xcalloc((size_t)nold * 2, sizeof *made);
  int *at = ir_xcalloc((size_t)nold * 2, sizeof *at); /* copy k goes before node at[k] */
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *p = m->nodes[i];
    if (!ir_op_is_norm(p->op) || p->phase != IR_PHASE_FWD || p->layer < 0 || ir_node_held(m, p))
      continue;
    int leaves = 1;
    for (int j = 1; j < p->ninputs; j++)
      leaves &= (ir_op_info[p->inputs[j]->op].flags & IR_F_LEAF) != 0;
    if (!leaves) continue;
    /* the first backward reader of a member of V; a held copy rules p out */
    int first = -1, held = 0;
    for (int r = i + 1; r < nold; r++) {
      const IrNode *n = m->nodes[r];
      if ((same_value(n, p) && n != p) || view_of(n, p)) held |= ir_node_held(m, n);
      if (first < 0 && ir_backward(n))
        for (int j = 0; j < n->ninputs && first < 0; j++)
          if (same_value(n->inputs[j], p) || view_of(n->inputs[j], p)) first = r;
    }
    if (first < 0 || held) continue;
    IrPhase phase = m->nodes[first]->phase;
    int later = 0; /* x read after p' in a phase that runs no earlier */
    for (int r = first; r < nold && !later; r++) {
      const IrNode *n = m->nodes[r];
      later = reads(n, p->inputs[0]) &&
              (n->phase == IR_PHASE_W || (phase == IR_PHASE_B && ir_backward(n)));
    }
    if (!later) continue;
    IrNode proto = {.op = p->op, .inputs = p->inputs, .ninputs = p->ninputs,
                    .ia = {p->ia[0], p->ia[1], p->ia[2]}, .fa = p->fa};
    IrNode *c = ir_add_inferred(m, &proto, p, phase, "remat_norm");
    if (!c) {
      rc = -1;
      break;
    }
    at[nmade] = first;
    made[nmade++] = c;
    /* a forward view of p read by the backward: the same view of p', after it */
    for (int v = i + 1; v < first && !rc; v++) {
      IrNode *w = m->nodes[v], *in = c;
      int read = 0;
      for (int r = first; r < nold && !read; r++)
        read = ir_backward(m->nodes[r]) && reads(m->nodes[r], w);
      if (!view_of(w, p) || !read) continue;
      IrNode vp = {.op = IR_OP_RESHAPE, .inputs = &in, .ninputs = 1, .rank = w->rank};
      for (int d = 0; d < w->rank; d++) vp.shape[d] = w->shape[d];
      IrNode *cv = ir_add_inferred(m, &vp, w, phase, "remat_norm");
      if (!cv) {
        rc = -1;
        break;
      }
      for (int r = first; r < nold; r++)
        if (ir_backward(m->nodes[r]))
          for (int j = 0; j < m->nodes[r]->ninputs; j++)
            if (m->nodes[r]->inputs[j] == w) m->nodes[r]->inputs[j] = cv;
      at[nmade] = first;
      made[nmade++] = cv;
    }
    for (int r = first; r < nold; r++) {
      IrNode *n = m->nodes[r];
      if (!ir_backward(n)) continue;
      for (int j = 0; j < n->ninputs; j++)
        if (same_value(n->inputs[j], p)) n->inputs[j] = c;
    }
  }
  if (!rc && nmade) { /* the copies into place; ids follow */
    /* (at is not sorted: a later norm's first backward reader comes earlier) */
    IrNode **order = ir_xcalloc((size_t)m->nnodes, sizeof *order);
    int k = 0;
    for (int i = 0; i < nold; i++) {
      for (int c = 0; c < nmade; c++)
        if (at[c] == i) order[k++] = made[c];
      order[k++] = m->nodes[i];
    }
    ir_set_order(m, order, k);
    free(order);
  }
  free(made);
  free(at);
  return rc;
}
