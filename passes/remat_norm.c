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
 * backward) whose other inputs l.. are weights (leaves, or a leaf's forward
 * group_copy: --sp's identity copy of a replicated weight, whose d elements
 * p' may keep longer), the values V = {p} and every group_copy of p computed
 * in the forward (the same values: group_copy is the identity forward) are
 * read in the backward (phases B, W) through p' = NORM(x, l..) (same
 * attributes), placed right before the first backward reader of p's
 * values, in its phase, with p's layer and location; right after p' go
 *   - for a forward reshape of p (a view: MoE's tokens, [B, T, d] as
 *     [B T, d]) read in the backward, the same reshape of p';
 *   - for a forward all_gather or replicate g of p (--sp: p is the rank's
 *     sequence shard, g the whole sequence the column-parallel GEMMs or an
 *     MoE block's router read) read in the backward, directly or through a
 *     forward reshape of it, g' = the same gather of p', and that reshape
 *     of g': the backward gathers the sequence again (one all-gather more a
 *     norm, in the tp group) instead of keeping g, tp times p's size, from
 *     the forward;
 * which the backward then reads in their place; when
 *   - no member of V, view or gather of p is held otherwise
 *     (ir_node_held: the loss, an update, a parameter's gradient);
 *   - x is read after that place, in phase W or where p' runs in phase B
 *     (so p' never keeps x longer: a zero-bubble schedule runs the W phase
 *     last).
 * Every tp rank makes the same copies in the same order, so the gathers
 * pair up as the forward's do.  p' computes p's bits: the kernel planner
 * gives a norm with such a twin a kernel of its own, no fused prologue
 * (codegen/cg_kernels.h, FUSION), so both run one kernel code on the same
 * buffers (tests/codegen/cg_remat_norm.c; the bf16 GPU trainer stores p' as
 * bf16 as it stored p, codegen/cuda_store.h), and g' moves those bits.
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

/* 1 if v is a forward all_gather of p (--sp: the whole sequence of p's
 * shards), or a replicate (the same gather, for an MoE block's router, whose
 * gradient is the rank's slice, not a reduce-scatter) */
static int gather_of(const IrNode *v, const IrNode *p) {
  return (v->op == IR_OP_ALL_GATHER || v->op == IR_OP_REPLICATE) && v->phase == IR_PHASE_FWD &&
         v->inputs[0] == p;
}

/* What forward node v is to norm p: 0 nothing; 1 the same value (p or a
 * group_copy); 2 a view of p; 3 a gather of p; 4 a view of such a gather */
static int kin(const IrNode *v, const IrNode *p) {
  if (same_value(v, p)) return 1;
  if (view_of(v, p)) return 2;
  if (gather_of(v, p)) return 3;
  return v->op == IR_OP_RESHAPE && v->phase == IR_PHASE_FWD && gather_of(v->inputs[0], p) ? 4 : 0;
}

/* 1 if l is a norm's weight: a leaf, or a leaf's forward group_copy (the
 * same values: --sp replicates a norm's weights through one, whose gradient
 * is the tp all-reduce) */
static int weight(const IrNode *l) {
  if (l->op == IR_OP_GROUP_COPY && l->phase == IR_PHASE_FWD) l = l->inputs[0];
  return (ir_op_info[l->op].flags & IR_F_LEAF) != 0;
}

/* 1 if node r >= first of m's reads x in a phase that runs no earlier
 * than a copy placed before `first` in `phase` (so the copy never keeps x
 * longer: a zero-bubble schedule runs the W phase last) */
static int read_after(const IrModule *m, const IrNode *x, int first, IrPhase phase) {
  for (int r = first; r < m->nnodes; r++) {
    const IrNode *n = m->nodes[r];
    if (reads(n, x) && (n->phase == IR_PHASE_W || (phase == IR_PHASE_B && ir_backward(n))))
      return 1;
  }
  return 0;
}

int pass_remat_norm(IrModule *m) {
  int nold = m->nnodes, nmade = 0, rc = 0;
  /* the copies in order, at most one a node (a norm's, a view's, a gather's) */
  IrNode **made = ir_xcalloc((size_t)nold + 1, sizeof *made);
  int *at = ir_xcalloc((size_t)nold + 1, sizeof *at); /* copy k goes before node at[k] */
  IrNode **twin = ir_xcalloc((size_t)nold + 1, sizeof *twin); /* per p's value: its copy */
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *p = m->nodes[i];
    if (!ir_op_is_norm(p->op) || p->phase != IR_PHASE_FWD || p->layer < 0 || ir_node_held(m, p))
      continue;
    /* the first backward reader of p's values (kin); a held one rules p out */
    int first = -1, held = 0;
    for (int r = i + 1; r < nold; r++) {
      const IrNode *n = m->nodes[r];
      if (n != p && kin(n, p)) held |= ir_node_held(m, n);
      if (first < 0 && ir_backward(n))
        for (int j = 0; j < n->ninputs && first < 0; j++)
          if (kin(n->inputs[j], p)) first = r;
    }
    if (first < 0 || held) continue;
    IrPhase phase = m->nodes[first]->phase;
    /* p' reads p's inputs: x, and any other that is neither a weight (a
     * leaf, or a leaf's forward group_copy: --sp's copy of a replicated
     * weight, d elements) nor read after p' anyway, would live longer */
    int later = 1;
    for (int j = 0; j < p->ninputs && later; j++)
      later = (j > 0 && weight(p->inputs[j])) || read_after(m, p->inputs[j], first, phase);
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
    twin[p->id] = c;
    /* p's other forward values the backward reads, in node order (a gather
     * before its views): a group_copy reads as p'; a view of p, the same
     * view of p'; a gather of p, the same gather of p' (--sp: the backward
     * gathers the sequence again instead of keeping it whole); a view of a
     * gather, the same view of the gather's copy.  All right after p'. */
    for (int v = i + 1; v < first && !rc; v++) {
      IrNode *w = m->nodes[v];
      int k = kin(w, p);
      if (k == 1) twin[v] = c;
      if (k < 2) continue;
      int read = 0;
      for (int r = first; r < nold && !read; r++)
        read = ir_backward(m->nodes[r]) && reads(m->nodes[r], w);
      for (int r = v + 1; k == 3 && r < first && !read; r++) /* a view of w the backward reads */
        if (kin(m->nodes[r], p) == 4 && m->nodes[r]->inputs[0] == w)
          for (int q = first; q < nold && !read; q++)
            read = ir_backward(m->nodes[q]) && reads(m->nodes[q], m->nodes[r]);
      if (!read) continue;
      IrNode *in = k == 4 ? twin[w->inputs[0]->id] : c;
      IrNode cp = {.op = w->op, .inputs = &in, .ninputs = 1, .rank = w->rank,
                   .ia = {w->ia[0], w->ia[1], w->ia[2]}, .fa = w->fa};
      for (int d = 0; d < w->rank; d++) cp.shape[d] = w->shape[d];
      IrNode *cw = in ? ir_add_inferred(m, &cp, w, phase, "remat_norm") : NULL;
      if (!cw) {
        rc = -1;
        break;
      }
      twin[v] = cw;
      at[nmade] = first;
      made[nmade++] = cw;
    }
    for (int r = first; r < nold && !rc; r++) {
      IrNode *n = m->nodes[r];
      if (!ir_backward(n)) continue;
      for (int j = 0; j < n->ninputs; j++)
        if (kin(n->inputs[j], p) && twin[n->inputs[j]->id]) n->inputs[j] = twin[n->inputs[j]->id];
    }
  }
  /* the copies into place (at is not sorted: a later norm's first backward
   * reader may come earlier; a norm's copies share one place, in order) */
  if (!rc && nmade) ir_insert_before(m, nold, made, at, nmade);
  free(made);
  free(at);
  free(twin);
  return rc;
}
