/* passes/remat_act.c -- a layer's pointwise activations recomputed in the
 * backward from values it keeps anyway (parc --recompute pointwise).
 *
 * GPT-2's MLP keeps gelu(h) from the forward for c_proj's weight gradient,
 * while gelu's own gradient reads h, which the backward has anyway; Llama's
 * keeps silu(g) (for the product's gradient) and silu(g) * u (for the down
 * projection's weight gradient), while g and u are kept for silu's and the
 * product's gradients.  Recomputing those in the backward costs one
 * memory-bound kernel a layer and frees a [tokens, ffn] value or two at the
 * arena's peak (GPT-2: 17.5% of its GPU arena).
 *
 * In forward order, a node p computed in the forward inside a repeat (a
 * layer), pointwise (IR_F_POINTWISE), f32, held by nothing
 * (ir_node_held), read in the backward (phases B, W), is read there
 * through p' = OP(x'..) (same attributes, p's layer and location, phase B),
 * placed right before the first of those readers (or before an earlier
 * copy that reads it), when every input x of p is
 *   - a leaf (a parameter, an input: alive all step), or
 *   - an earlier such p (then x' is its copy), or
 *   - read by a backward node at or after that place (kept anyway: p'
 *     keeps no value longer than the plan without it did).
 * Forward readers keep p.  Every copy lives within its original's life
 * and is computed by the same op on the same operands (or their copies),
 * in phase B: a zero-bubble schedule runs it with the B action, not after
 * it, and the bf16 GPU trainer may store it as bf16 as it stored p
 * (codegen/cuda_store.h; a W reshape of it, a weight gradient's operand,
 * too).  The CPU kernels compute each element by one formula wherever it
 * stands: the fp32 trainers' steps are the same bits with or without this
 * pass (tests/trainer/trainer_test.py recompute_pointwise).  The bf16 GPU
 * trainer's agree to rounding: GPT-2's h = a + b, which the copy of gelu(h)
 * reads beside gelu's gradient, gets a copy of its own for each from
 * passes/remat.c and is computed inside both kernels, as the plan without
 * this pass computed it, but the buffer plan around the copies may differ
 * in what it stores as bf16 (tests/cuda/trainer_emu.py pointwise).
 * Runs after autodiff and remat_norm, before remat (which then gives the
 * bias add under gelu a backward copy of its own). */
#include <stdlib.h>

#include "passes/passes.h"

#define MAX_IN 4 /* the most inputs of a forward pointwise op (add .. gelu: 1 or 2) */

static int pointwise(const IrNode *n) { return (ir_op_info[n->op].flags & IR_F_POINTWISE) != 0; }

/* Moves the copy of original x (and, through its inputs, every copy it
 * reads) to go before node `at` at the latest. */
static void pull(const IrModule *m, IrNode *const *copy, int *copy_at, int nold, int x, int at) {
  if (x >= nold || !copy[x] || copy_at[x] <= at) return;
  copy_at[x] = at;
  for (int j = 0; j < m->nodes[x]->ninputs; j++)
    pull(m, copy, copy_at, nold, m->nodes[x]->inputs[j]->id, at);
}

/* 1 if p may have a copy by itself (the head comment's first conditions but
 * its backward readers) */
static int candidate(const IrModule *m, const IrNode *p) {
  return p->phase == IR_PHASE_FWD && p->layer >= 0 && pointwise(p) && p->dtype == IR_F32 &&
         p->ninputs <= MAX_IN && !ir_node_held(m, p);
}

/* first[id], last[id]: the first and the last backward node reading node id,
 * or -1 (both malloc'd, one sweep) */
static void backward_readers(const IrModule *m, int **first, int **last) {
  *first = ir_xcalloc((size_t)m->nnodes + 1, sizeof **first);
  *last = ir_xcalloc((size_t)m->nnodes + 1, sizeof **last);
  for (int i = 0; i < m->nnodes; i++) (*first)[i] = (*last)[i] = -1;
  for (int r = 0; r < m->nnodes; r++)
    if (ir_backward(m->nodes[r]))
      for (int j = 0; j < m->nodes[r]->ninputs; j++) {
        int x = m->nodes[r]->inputs[j]->id;
        if ((*first)[x] < 0) (*first)[x] = r;
        (*last)[x] = r;
      }
}

/* 1 if the backward could have x's values at node `first` without keeping
 * anything longer: x is a leaf, read by the backward at or after first, or
 * a forward pointwise value of a layer of such inputs (a few levels deep:
 * later passes give pointwise values copies of their own, passes/remat.c,
 * so the module a report reads may keep silu(g) * u through g and u alone) */
static int recomputable(const IrModule *m, const int *last_bwd, const IrNode *x, int first,
                        int depth) {
  if ((ir_op_info[x->op].flags & IR_F_LEAF) || last_bwd[x->id] >= first) return 1;
  if (depth >= 4 || x->phase != IR_PHASE_FWD || x->layer < 0 || !pointwise(x)) return 0;
  for (int j = 0; j < x->ninputs; j++)
    if (!recomputable(m, last_bwd, x->inputs[j], first, depth + 1)) return 0;
  return 1;
}

int remat_act_candidates(const IrModule *m) {
  int *first_bwd, *last_bwd, n = 0;
  backward_readers(m, &first_bwd, &last_bwd);
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    int first = first_bwd[i], ok = first >= 0 && candidate(m, p);
    for (int j = 0; ok && j < p->ninputs; j++)
      ok = recomputable(m, last_bwd, p->inputs[j], first, 0);
    n += ok;
  }
  free(first_bwd);
  free(last_bwd);
  return n;
}

int pass_remat_act(IrModule *m) {
  int nold = m->nnodes, nmade = 0, rc = 0;
  /* as the module stood; a node's readers change only after it was visited,
   * and the copies read no later original */
  int *first_bwd, *last_bwd;
  backward_readers(m, &first_bwd, &last_bwd);
  IrNode **copy = ir_xcalloc((size_t)nold, sizeof *copy); /* per p: p' */
  int *copy_at = ir_xcalloc((size_t)nold, sizeof *copy_at); /* per p: p' goes before it */
  IrNode **made = ir_xcalloc((size_t)nold, sizeof *made);  /* the copies, made in order */
  int *made_of = ir_xcalloc((size_t)nold, sizeof *made_of); /* their originals' ids */
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *p = m->nodes[i];
    int first = first_bwd[i];
    if (first < 0 || !candidate(m, p)) continue;
    int ok = 1;
    IrNode *in[MAX_IN];
    for (int j = 0; j < p->ninputs && ok; j++) {
      IrNode *x = p->inputs[j];
      in[j] = x;
      if (ir_op_info[x->op].flags & IR_F_LEAF) continue;
      if (x->id < nold && copy[x->id]) in[j] = copy[x->id];
      else ok = last_bwd[x->id] >= first;
    }
    if (!ok) continue;
    IrNode proto = {.op = p->op, .inputs = in, .ninputs = p->ninputs,
                    .ia = {p->ia[0], p->ia[1], p->ia[2]}, .fa = p->fa};
    IrNode *c = ir_add_inferred(m, &proto, p, IR_PHASE_B, "remat_act");
    if (!c) {
      rc = -1;
      break;
    }
    copy[i] = c;
    copy_at[i] = first;
    made_of[nmade] = i;
    made[nmade++] = c;
    /* a copy it reads goes no later than it */
    for (int j = 0; j < p->ninputs; j++) pull(m, copy, copy_at, nold, p->inputs[j]->id, first);
    for (int r = first; r < nold; r++) {
      IrNode *n = m->nodes[r];
      if (!ir_backward(n)) continue;
      for (int j = 0; j < n->ninputs; j++)
        if (n->inputs[j] == p) n->inputs[j] = c;
    }
  }
  /* the copies into place (made in forward order, so within one place a
   * copy comes after every copy it reads); made_of becomes each one's place */
  for (int c = 0; c < nmade; c++) made_of[c] = copy_at[made_of[c]];
  if (!rc && nmade) ir_insert_before(m, nold, made, made_of, nmade);
  m->remat_act = nmade;
  free(first_bwd);
  free(last_bwd);
  free(copy);
  free(copy_at);
  free(made);
  free(made_of);
  return rc;
}
