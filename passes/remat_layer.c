/* passes/remat_layer.c -- each layer's forward recomputed at the start of its
 * backward instead of kept (parc --recompute layers: activation
 * checkpointing at layer granularity).
 *
 * A layer's backward reads many of its forward values: the norm outputs,
 * q, k, v, attention's output and statistics, the MLP's pre-activations.
 * They are kept from the forward to the backward, every layer's at once at
 * the arena's peak.  Here only what a layer reads from outside it (its input
 * x, the residual stream, which the norm's gradient keeps anyway, and the
 * parameters) stays; the backward runs the layer's forward again, GEMMs,
 * attention and collectives included, right before the first node of the
 * layer's backward that reads a value of its forward.  That costs about one
 * more forward a step (a third more compute) and leaves one layer's values
 * at a time.
 *
 * For each layer L (repeat iteration), let R be the backward nodes (phases
 * B, W) of layer L that read a forward node of layer L (not a leaf), and
 * first the first of them.  The needed set N is every forward node of layer
 * L that R reads, and, transitively, every forward node of layer L that a
 * member of N reads.  Each member gets a copy (same op, attributes and
 * shape, the copies of its inputs in N, its other inputs as they are), in
 * forward order, placed right before `first`, in phase B (B nodes read
 * them, even where `first` is a W node), with the original's layer and
 * location; then the nodes of R, and every later backward node of layer L,
 * read the copies instead.  What the copies read
 * from outside N stays until they run: the parameters, and the layer's
 * input, which its first norm's gradient reads anyway (under tp the
 * residual stream also as the partial sum the layer adds to, whose
 * all-reduce the norm reads: one more [tokens, d] value a layer).
 * Forward readers keep the originals, which then die in the forward.  Every
 * rank of a tp, dp or ep group makes the same copies in the same order, so
 * the copied collectives pair up as the forward's do.  The copies compute
 * the forward's values from the same operands by the same ops: the fp32
 * trainers agree with the plan without this pass to the rounding of the
 * forward norms, which lose their fused prologue once they have a twin
 * (codegen/cg_kernels.h, FUSION), and bit for bit where there is none.
 * Runs after autodiff, before remat_norm and remat_act (which then find
 * nothing of those layers' forward read by the backward). */
#include <stdlib.h>

#include "passes/passes.h"

static int leaf(const IrNode *n) { return (ir_op_info[n->op].flags & IR_F_LEAF) != 0; }

/* 1 if n is a forward value of layer L that a copy could compute */
static int of_layer(const IrNode *n, int L) {
  return n->phase == IR_PHASE_FWD && n->layer == L && L >= 0 && !leaf(n);
}

int pass_remat_layer(IrModule *m) {
  int nold = m->nnodes, rc = 0, layers = 0, nmade = 0, nlayers = 0;
  for (int i = 0; i < nold; i++)
    if (m->nodes[i]->layer + 1 > nlayers) nlayers = m->nodes[i]->layer + 1;
  /* per layer: the first backward node of that layer reading its forward */
  int *first = ir_xcalloc((size_t)nlayers + 1, sizeof *first);
  for (int L = 0; L < nlayers; L++) first[L] = -1;
  unsigned char *need = ir_xcalloc((size_t)nold + 1, 1);
  for (int r = 0; r < nold; r++) {
    const IrNode *n = m->nodes[r];
    if (!ir_backward(n)) continue;
    for (int j = 0; j < n->ninputs; j++) {
      const IrNode *x = n->inputs[j];
      if (n->layer >= 0 && of_layer(x, n->layer)) {
        need[x->id] = 1;
        if (first[n->layer] < 0) first[n->layer] = r;
      }
    }
  }
  /* the needed set closed over inputs of the same layer (descending ids:
   * inputs come first) */
  for (int i = nold - 1; i >= 0; i--)
    if (need[i])
      for (int j = 0; j < m->nodes[i]->ninputs; j++) {
        const IrNode *x = m->nodes[i]->inputs[j];
        if (of_layer(x, m->nodes[i]->layer)) need[x->id] = 1;
      }
  IrNode **copy = ir_xcalloc((size_t)nold + 1, sizeof *copy);
  IrNode **made = ir_xcalloc((size_t)nold + 1, sizeof *made);
  int *at = ir_xcalloc((size_t)nold + 1, sizeof *at); /* copy k goes before node at[k] */
  for (int i = 0; i < nold && !rc; i++) {
    IrNode *f = m->nodes[i];
    int L = f->layer;
    if (!need[i]) continue;
    IrNode **in = ir_xcalloc((size_t)f->ninputs + 1, sizeof *in);
    for (int j = 0; j < f->ninputs; j++)
      in[j] = copy[f->inputs[j]->id] ? copy[f->inputs[j]->id] : f->inputs[j];
    IrNode proto = *f;
    proto.inputs = in;
    IrNode *c = ir_add_inferred(m, &proto, f, IR_PHASE_B, "remat_layer");
    free(in);
    if (!c) {
      rc = -1;
      break;
    }
    copy[i] = c;
    at[nmade] = first[L];
    made[nmade++] = c;
  }
  /* the layer's backward reads the copies */
  for (int r = 0; r < nold && !rc; r++) {
    IrNode *n = m->nodes[r];
    if (!ir_backward(n) || n->layer < 0 || r < first[n->layer]) continue;
    for (int j = 0; j < n->ninputs; j++)
      if (n->inputs[j]->id < nold && copy[n->inputs[j]->id] &&
          n->inputs[j]->layer == n->layer)
        n->inputs[j] = copy[n->inputs[j]->id];
  }
  for (int L = 0; L < nlayers; L++) layers += first[L] >= 0;
  /* the copies into place (made is in forward order; a layer's copies share
   * one place) */
  if (!rc && nmade) ir_insert_before(m, nold, made, at, nmade);
  m->remat_layers = rc ? 0 : layers;
  m->remat_layer_nodes = rc ? 0 : nmade;
  free(first);
  free(need);
  free(copy);
  free(made);
  free(at);
  return rc;
}
