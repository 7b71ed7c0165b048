/* passes/attn_delta.c -- sdpa_grad from the row statistics, so that sdpa's
 * out need not live until the backward.
 *
 * sdpa_grad(q, k, v, dy, y) reads the forward's y: its lse (the aux part of
 * y's buffer) and its out, for D = dy . out per row.  Reading y keeps out
 * [B, H, T, hd] alive from the forward to the backward.  An attention block
 * whose output projection reads m = merge_heads(y) keeps m alive anyway (the
 * projection's weight gradient needs it), and there dy is split_heads(dm),
 * dm the gradient arriving at m.  Then D is a row sum over the merged
 * tensors, the same products summed in the same order (i ascending):
 *
 *   D[b,h,t] = sum_i dy[b,h,t,i] out[b,h,t,i] = sum_i dm[b,t,h hd+i] m[b,t,h hd+i]
 *
 * For every sdpa_grad(q, k, v, dy, y) with dy = split_heads(dm) and a
 * merge_heads(y) node m, this pass adds
 *
 *   lse = sdpa_lse(y)                  right after y (forward): its own value
 *   d   = sdpa_delta(m, dm) heads=H    right before dy (the sdpa_grad's phase)
 *
 * and makes it sdpa_grad(q, k, v, dy, lse, d).  y's last readers are then
 * forward nodes (m and lse), so the buffer plan frees out (and the lse
 * tail it carries) in the forward, and keeps only lse [B, H, T], 1/hd of
 * out, until the backward.  Where out has no merged copy or dy arrives
 * otherwise (another reader of y adds to its gradient), sdpa_grad keeps
 * reading y.  d comes where dy does, not at the sdpa_grad, so that dm lives
 * no longer than before (its own readers, dy and the projection's weight
 * gradient, may all come earlier: a pipeline stage's peak is there).  The
 * new nodes take the layer and location of y and of the sdpa_grad.  Runs after autodiff on the rank-local module (shapes are
 * local: H is the rank's heads). */
#include <stdio.h>
#include <stdlib.h>

#include "passes/passes.h"

/* Appends op on in[0..nin) with attribute ia0, typed by ir_infer; NULL after
 * printing why when the types do not fit (an internal error). */
static IrNode *mk(IrModule *m, IrOp op, IrNode **in, int nin, int64_t ia0, const IrNode *at,
                  IrPhase phase) {
  IrNode p = {.op = op, .inputs = in, .ninputs = nin, .ia = {ia0, 0, 0}};
  return ir_add_inferred(m, &p, at, phase, "attn_delta");
}

int pass_attn_delta(IrModule *m) {
  int nold = m->nnodes;
  /* merged[i]: a merge_heads reading node i; after[i] / before[i]: the new
   * node placed right after / before node i */
  IrNode **merged = ir_xcalloc((size_t)nold, sizeof *merged);
  IrNode **after = ir_xcalloc((size_t)nold, sizeof *after);
  IrNode **before = ir_xcalloc((size_t)nold, sizeof *before);
  int rc = 0, nnew = 0;
  for (int i = 0; i < nold; i++) {
    IrNode *n = m->nodes[i];
    if (n->op == IR_OP_MERGE_HEADS && !merged[n->inputs[0]->id]) merged[n->inputs[0]->id] = n;
  }
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *g = m->nodes[i];
    if (g->op != IR_OP_ATTENTION_GRAD || g->ninputs != 5) continue;
    IrNode *y = g->inputs[4], *dy = g->inputs[3], *mh = merged[y->id];
    if (!mh || dy->op != IR_OP_SPLIT_HEADS || after[y->id] || before[dy->id]) continue;
    IrNode *lse = mk(m, IR_OP_ATTENTION_LSE, &y, 1, 0, y, y->phase);
    IrNode *d = lse ? mk(m, IR_OP_ATTENTION_DELTA, (IrNode *[]){mh, dy->inputs[0]}, 2,
                         y->shape[1], g, g->phase)
                    : NULL;
    if (!d) {
      rc = -1;
      break;
    }
    IrNode **in = arena_alloc(&m->arena, sizeof *in * 6);
    for (int k = 0; k < 4; k++) in[k] = g->inputs[k];
    in[4] = lse, in[5] = d;
    g->inputs = in;
    g->ninputs = 6;
    after[y->id] = lse, before[dy->id] = d;
    nnew += 2;
  }
  if (!rc && nnew) { /* the new nodes into place; ids follow */
    IrNode **order = ir_xcalloc((size_t)m->nnodes, sizeof *order);
    int k = 0;
    for (int i = 0; i < nold; i++) {
      if (before[i]) order[k++] = before[i];
      order[k++] = m->nodes[i];
      if (after[i]) order[k++] = after[i];
    }
    ir_set_order(m, order, k);
    free(order);
  }
  free(merged);
  free(after);
  free(before);
  return rc;
}
