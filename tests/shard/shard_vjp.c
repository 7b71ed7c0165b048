/* tests/shard/shard_vjp.c -- the VJPs of the collectives (passes/autodiff.c)
 * against central finite differences on a tp = 2 mesh (ir_interp_run_mesh).
 *
 * The rank-local module, with x, w1, w2, w3 sharded (each rank its own
 * values) and u replicated (the same values on every rank):
 *   y  = all_gather(x, dim 0)            sequence-parallel style entry
 *   o  = matmul(matmul(y, w1), w2)       column then row: partial
 *   r  = reduce_scatter(o, dim 0)        partial -> sharded
 *   L1 = all_reduce(sum(r * r))          partial -> replicated
 *   L2 = all_reduce(sum(matmul(group_copy(u), w3) ^ 2))   Megatron f / g
 *   L3 = sum(replicate(local_slice(v, dim 0) * z, dim 0) ^ 2)   outside a
 *        region: v replicated, z sharded, L3 computed whole on every rank
 *   loss = L1 + L2 + L3
 * The loss is one number, the same on both ranks, a function of every
 * rank's local values: the gradient each rank computes for its own leaves
 * must be the derivative of that number (replicated u: its gradient must be
 * whole, equal on both ranks).  This exercises all six rules, including
 * all_gather <-> reduce_scatter and local_slice <-> replicate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autodiff/ad_check.h"
#include "ir/interp.h"
#include "passes/passes.h"

#define TP 2

static double run(IrInterp **rk, const IrModule *m) {
  char why[512];
  if (ir_interp_run_mesh(rk, TP, 1, 0, m->nnodes, why, sizeof why)) {
    printf("FAIL: %s\n", why);
    exit(1);
  }
  return rk[0]->f[m->loss->id][0];
}

int main(int argc, char **argv) {
  Build b;
  build_init(&b, "collectives", 0x5eed0077);
  IrNode *x = t_param(&b, LEAF_NORMAL, 1, 0, S(2, 3));
  IrNode *w1 = t_param(&b, LEAF_NORMAL, 1, 0, S(3, 2));
  IrNode *w2 = t_param(&b, LEAF_NORMAL, 1, 0, S(2, 3));
  IrNode *u = t_param(&b, LEAF_NORMAL, 1, 0, S(4, 3));
  IrNode *w3 = t_param(&b, LEAF_NORMAL, 1, 0, S(3, 2));
  IrNode *v = t_param(&b, LEAF_NORMAL, 1, 0, S(4, 3));
  IrNode *z = t_param(&b, LEAF_NORMAL, 1, 0, S(2, 3));
  IrNode *y = t_op1(&b, IR_OP_ALL_GATHER, x, 0, TP, 0, 0);
  IrNode *o = t_op2(&b, IR_OP_MATMUL, t_op2(&b, IR_OP_MATMUL, y, w1, 0, 0), w2, 0, 0);
  IrNode *r = t_op1(&b, IR_OP_REDUCE_SCATTER, o, 0, TP, 0, 0);
  IrNode *s1 = t_op2(&b, IR_OP_MUL, r, r, 0, 0);
  s1 = t_op1(&b, IR_OP_SUM, t_op1(&b, IR_OP_SUM, s1, 1, 0, 0, 0), 0, 0, 0, 0);
  IrNode *l1 = t_op1(&b, IR_OP_ALL_REDUCE, s1, 0, TP, 0, 0);
  IrNode *h = t_op2(&b, IR_OP_MATMUL, t_op1(&b, IR_OP_GROUP_COPY, u, 0, TP, 0, 0), w3, 0, 0);
  IrNode *s2 = t_op2(&b, IR_OP_MUL, h, h, 0, 0);
  s2 = t_op1(&b, IR_OP_SUM, t_op1(&b, IR_OP_SUM, s2, 1, 0, 0, 0), 0, 0, 0, 0);
  IrNode *l2 = t_op1(&b, IR_OP_ALL_REDUCE, s2, 0, TP, 0, 0);
  IrNode *vz = t_op2(&b, IR_OP_MUL, t_op1(&b, IR_OP_LOCAL_SLICE, v, 0, TP, 0, 0), z, 0, 0);
  IrNode *g3 = t_op1(&b, IR_OP_REPLICATE, vz, 0, TP, 0, 0);
  IrNode *s3 = t_op2(&b, IR_OP_MUL, g3, g3, 0, 0);
  s3 = t_op1(&b, IR_OP_SUM, t_op1(&b, IR_OP_SUM, s3, 1, 0, 0, 0), 0, 0, 0, 0);
  b.m->loss = t_op2(&b, IR_OP_ADD, t_op2(&b, IR_OP_ADD, l1, l2, 0, 0), s3, 0, 0);
  must_verify(b.m, "forward");
  if (pass_autodiff(b.m)) return 1;
  must_verify(b.m, "after autodiff");
  IrModule *m = b.m;
  IrNode *leaves[] = {x, w1, w2, u, w3, v, z};
  int replicated[] = {0, 0, 0, 1, 0, 1, 0};
  enum { NLEAVES = sizeof leaves / sizeof *leaves };

  IrInterp *rk[TP];
  for (int k = 0; k < TP; k++) {
    rk[k] = ir_interp_new(m);
    for (int j = 0; j < NLEAVES; j++)
      for (int64_t e = 0; e < ir_numel(leaves[j]); e++)
        rk[k]->f[leaves[j]->id][e] = replicated[j] && k ? rk[0]->f[leaves[j]->id][e]
                                                         : rng_normal(&b.rng);
  }
  run(rk, m);
  int bad = 0;
  double worst = 0;
  if (rk[0]->f[m->loss->id][0] != rk[1]->f[m->loss->id][0]) {
    printf("FAIL: the loss differs between the ranks\n");
    bad++;
  }
  const double eps = argc > 1 ? atof(argv[1]) : 1e-6;
  for (int j = 0; j < NLEAVES; j++) {
    IrNode *p = leaves[j];
    for (int k = 0; k < TP; k++)
      for (int64_t e = 0; e < ir_numel(p); e++) {
        double ad = rk[k]->f[p->grad->id][e];
        double save[TP];
        /* a replicated leaf moves on every rank at once: it is one value */
        for (int q = 0; q < TP; q++) save[q] = rk[q]->f[p->id][e];
        for (int q = 0; q < TP; q++)
          if (replicated[j] || q == k) rk[q]->f[p->id][e] = save[q] + eps;
        double lp = run(rk, m);
        for (int q = 0; q < TP; q++)
          if (replicated[j] || q == k) rk[q]->f[p->id][e] = save[q] - eps;
        double lm = run(rk, m);
        for (int q = 0; q < TP; q++) rk[q]->f[p->id][e] = save[q];
        run(rk, m); /* back to the unperturbed values for the next element's gradient */
        double fd = (lp - lm) / (2 * eps);
        double err = fabs(fd - ad) / fmax(1.0, fmax(fabs(fd), fabs(ad)));
        worst = fmax(worst, err);
        if (err > 1e-6) {
          printf("FAIL: leaf %d rank %d element %lld: ad %.9g fd %.9g\n", j, k, (long long)e, ad,
                 fd);
          bad++;
        }
      }
  }
  run(rk, m);
  int nar = 0, nag = 0, nrs = 0, nls = 0;
  for (int i = 0; i < m->nnodes; i++) {
    if (m->nodes[i]->phase == IR_PHASE_FWD) continue;
    nar += m->nodes[i]->op == IR_OP_ALL_REDUCE;
    nag += m->nodes[i]->op == IR_OP_ALL_GATHER;
    nrs += m->nodes[i]->op == IR_OP_REDUCE_SCATTER;
    nls += m->nodes[i]->op == IR_OP_LOCAL_SLICE;
  }
  printf("     backward: %d all_reduce (group_copy's), %d all_gather (reduce_scatter's and "
         "local_slice's), %d reduce_scatter (all_gather's), %d local_slice (replicate's)\n",
         nar, nag, nrs, nls);
  if (nar != 1 || nag != 2 || nrs != 1 || nls != 1) bad++;
  printf("%s collective VJPs match central differences on a %d-rank mesh (max rel %.2e)\n",
         bad ? "FAIL" : "ok  ", TP, worst);
  for (int k = 0; k < TP; k++) ir_interp_free(rk[k]);
  ir_module_free(m);
  return bad != 0;
}
