/* ir/interp.h -- the reference interpreter: evaluates a module's nodes on
 * the CPU in double precision.
 *
 * It is the executable specification of every op (the semantics are
 * written beside each op's implementation in ir/interp.c): generated CPU
 * and CUDA kernels are tested against it, and autodiff's rules are checked
 * against finite differences computed with it.  Written for clarity, not
 * speed.
 *
 * Storage: every node gets a dense row-major buffer (last dimension
 * fastest) of ir_numel(node) elements: doubles for f32 nodes, int32 for i32
 * nodes.  The caller writes the values of INPUT and PARAM nodes into their
 * buffers, then runs the other nodes in topological order.  STATE nodes
 * (optimizer state) start at zero, as the runtime's do; after a step,
 * ir_interp_end_step carries the module's updates into the leaves. */
#ifndef PARC_IR_INTERP_H
#define PARC_IR_INTERP_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

typedef struct {
  const IrModule *m;
  int nnodes;      /* nodes with storage: m->nnodes when the interpreter was made */
  double **f;      /* f[id]: the values of f32 node id; NULL for i32 nodes */
  int32_t **i;     /* i[id]: the values of i32 node id; NULL for f32 nodes */
  int coord[4];    /* the rank's coordinates on the mesh axes (tp, dp, ep,
                      ep_dp; ir/ops.def): 0 unless ir_interp_run_mesh runs it;
                      read by vocab_embedding(_grad), local_slice, flat_shard */
} IrInterp;

/* Storage for every node of m, zeroed.  Allocation failure aborts. */
IrInterp *ir_interp_new(const IrModule *m);
void ir_interp_free(IrInterp *it);

/* Evaluates nodes [first, end) (ids), skipping INPUT and PARAM nodes, whose
 * buffers the caller fills.  Nodes before first must already hold their
 * values.  Returns 0, or -1 with a one-line reason in why naming the node
 * (an index out of range: embedding ids, targets, gather/dispatch choices). */
int ir_interp_run(IrInterp *it, int first, int end, char *why, size_t len);

/* Lockstep evaluation of one rank-local module on a tp x dp mesh (the
 * modules pass_shard makes; every rank runs the same nodes): ranks[r],
 * r = tp coordinate + tp * dp coordinate, are interpreters of one module.
 * Nodes [first, end) run node by node on every rank; a collective combines
 * the ranks of its group (ir/ops.def) in coordinate order.  Returns 0, or -1
 * with a reason in why. */
int ir_interp_run_mesh(IrInterp **ranks, int tp, int dp, int first, int end, char *why,
                       size_t len);

/* The same with expert parallelism: ep (dividing dp) consecutive dp
 * coordinates form an ep group (axis 2), the dp coordinates with one ep
 * coordinate an ep_dp group (axis 3).  ir_interp_run_mesh is ep = 1. */
int ir_interp_run_mesh_ep(IrInterp **ranks, int tp, int dp, int ep, int first, int end,
                          char *why, size_t len);

/* Ends a training step: copies the value of every update (m->updates) into
 * its leaf, so that the next run sees the new parameters and state.  Every
 * update's value node must have been run. */
void ir_interp_end_step(IrInterp *it);

#endif
