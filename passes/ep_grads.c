/* passes/ep_grads.c -- gradient averaging of expert-parallel weights.
 *
 * Under expert parallelism (passes/shard.c) a PARAM with shard
 * IR_SHARD_EXPERT and ep_degree ep > 1 holds experts / ep experts (each
 * whole, or its tp piece: the sums below are elementwise either way), and the
 * rank's gradient of it already sums the contributions of every token its
 * ep group routed there (expert_all_to_all's adjoint brings them back).
 * The ranks holding the same experts are the ep_dp group (axis 3, dp / ep
 * members); the gradient of the global objective (the mean of the dp
 * ranks' losses) is the sum over that group divided by dp, and the division
 * is the loss's seed's (1/dp, set by pass_dp_grads): every term g sums is
 * already divided, so
 *   g' = all_reduce(g) axis=3 size=dp/ep
 * (g itself when dp == ep).  Dense gradients stay with pass_dp_grads,
 * which leaves these alone (ep_sharded) and calls this first.  New nodes
 * are W-phase, appended, with their gradient's layer and location.
 *
 * ZeRO-1 (m->mesh_zero == dp > 1): the expert state is sharded over the
 * ep_dp group, z = dp / ep pieces (ir_zero_pieces), so the rank keeps only
 * its piece of the summed gradient, s = ceil(n / z) elements of the
 * flattened tensor padded with zeros to z s:
 *   r  = reshape(concat(reshape(g, [n]), fill(0, [z s - n])), [z, s])
 *   g' = reshape(reduce_scatter(r) axis=3 size=z dim=0, [s])
 * (the same sums, in the same member order, as the all_reduce).  With
 * dp == ep (z = 1) the rank holds its experts' whole state: g' as above. */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

int ep_sharded(const IrNode *p) {
  return p->op == IR_OP_PARAM && p->shard == IR_SHARD_EXPERT && p->ep_degree > 1;
}

/* Appends op on in[0..nin) (attributes ia0..ia2, fa; a reshape or fill takes
 * rank and shape); NULL after an internal error. */
static IrNode *mk(IrModule *m, const IrNode *at, IrOp op, IrNode **in, int nin, int64_t ia0,
                  int64_t ia1, int64_t ia2, double fa, int rank, const int64_t *shape) {
  IrNode p = {.op = op, .inputs = in, .ninputs = nin, .ia = {ia0, ia1, ia2}, .fa = fa};
  if (rank >= 0) {
    p.rank = rank;
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
  }
  return ir_add_inferred(m, &p, at, IR_PHASE_W, "expert gradients");
}

static IrNode *add(IrModule *m, IrOp op, IrNode *x, int64_t ia0, int64_t ia1, double fa) {
  return mk(m, x, op, &x, 1, ia0, ia1, 0, fa, -1, NULL);
}

static IrNode *reshape(IrModule *m, IrNode *x, int rank, const int64_t *shape) {
  if (!x || (x->rank == rank && !memcmp(x->shape, shape, sizeof(int64_t) * (size_t)rank)))
    return x;
  return mk(m, x, IR_OP_RESHAPE, &x, 1, 0, 0, 0, 0, rank, shape);
}

/* ZeRO-1: the rank's piece (over the ep_dp group of z) of the sum of g over
 * that group, [1, s]. */
static IrNode *scatter_piece(IrModule *m, IrNode *g, int z) {
  int64_t n = ir_numel(g), s = (n + z - 1) / z;
  IrNode *flat = reshape(m, g, 1, &n);
  if (flat && s * z > n) {
    IrNode *pad = mk(m, g, IR_OP_FILL, NULL, 0, 0, 0, 0, 0.0, 1, (int64_t[]){s * z - n});
    flat = pad ? mk(m, g, IR_OP_CONCAT, (IrNode *[]){flat, pad}, 2, 0, 0, 0, 0, -1, NULL) : NULL;
  }
  IrNode *r = reshape(m, flat, 2, (int64_t[]){z, s});
  return r ? mk(m, g, IR_OP_REDUCE_SCATTER, &r, 1, 3, z, 0, 0, -1, NULL) : NULL;
}

int pass_ep_grads(IrModule *m, int dp) {
  int nold = m->nnodes;
  for (int i = 0; i < nold; i++) {
    IrNode *p = m->nodes[i];
    if (!ep_sharded(p) || !p->grad) continue;
    int ep = p->ep_degree;
    if (dp % ep) {
      fprintf(stderr, "parc: internal error: %s split over ep = %d, which does not divide "
                      "dp = %d\n", p->name, ep, dp);
      return -1;
    }
    IrNode *g = p->grad;
    int z = ir_zero_pieces(m, p); /* > 1: ZeRO-1 pieces over ep_dp */
    if (z > 1) {
      int64_t s = ir_zero_piece_numel(m, p); /* g is shaped like p */
      if (!(g = scatter_piece(m, g, z)) || !(g = reshape(m, g, 1, &s)))
        return -1;
      p->grad = g;
      continue;
    }
    if (dp / ep > 1 && !(g = add(m, IR_OP_ALL_REDUCE, g, 3, dp / ep, 0))) return -1;
    p->grad = g;
  }
  return 0;
}
