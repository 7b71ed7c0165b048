/* passes/bufplan.h -- static memory planning: one arena per rank.
 *
 * Every materialised non-leaf node gets a byte range [offset, offset+size)
 * in the activation arena.  Invariant (checked by bufplan_check): two nodes
 * whose live ranges overlap never share a byte.  A node is live from its
 * definition to its last use in node order; nodes in `keep` (the loss,
 * gradients the optimizer reads) stay live to the end of the step.  A
 * node's output never aliases its own inputs.
 *
 * Time is execution position, not node id: a fused kernel computes all its
 * nodes, and reads all its inputs, at the position of its root.  pos[id]
 * gives that position (NULL: pos[id] = id); a node is written at pos[id]
 * and read at pos[c] of each consumer c. */
#ifndef PARC_BUFPLAN_H
#define PARC_BUFPLAN_H

#include <stdint.h>

#include "ir/ir.h"

#define BUFPLAN_ALIGN 64

typedef struct {
  int64_t *offset;     /* per node id; -1 when the node has no buffer */
  int64_t *size;       /* per node id, bytes rounded up to BUFPLAN_ALIGN */
  int *last_use;       /* per node id: the last position that reads it */
  int64_t peak;        /* arena bytes: the largest offset + size */
  int64_t live_peak;   /* the most bytes live at once: a lower bound on peak */
} BufPlan;

/* Plans buffers for every non-leaf node with materialize[id] != 0 (NULL:
 * all non-leaf nodes).  keep[id] != 0 extends a node's life to the end
 * (NULL: only the loss).  Arrays live in the module's arena.  Returns 0. */
int bufplan_build(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                  const int *pos, BufPlan *out);

/* bufplan_build for a step with asynchronous operations: held[id] >= 0 says
 * node id keeps reading its inputs after it starts at pos[id], up to position
 * held[id] (an asynchronous collective and its wait): each input stays live
 * through held[id].  Its output is live from pos[id] as always (the operation
 * writes it in the background), to its last reader, which comes at or after
 * the wait.  held NULL, or every entry -1: bufplan_build. */
int bufplan_build_held(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                       const int *pos, const int *held, BufPlan *out);

/* Checks the invariant above (with the same pos); 0 or -1 with a reason. */
int bufplan_check(const IrModule *m, const BufPlan *p, const int *pos, char *why, size_t len);

#endif
