/* passes/bufplan.h -- static memory planning: one arena per rank.
 *
 * Every materialised non-leaf node gets a byte range [offset, offset+size)
 * in the activation arena: best fit in time order, or the same buffers
 * placed largest first where that is smaller (bufplan.c, repack).  Invariant (checked by bufplan_check): two nodes
 * whose live ranges overlap never share a byte.  A node is live from its
 * definition to its last use in node order; nodes in `keep` (the loss,
 * gradients the optimizer reads) stay live to the end of the step.  A
 * node's output never aliases its own inputs.
 *
 * Time is execution position, not node id: a fused kernel computes all its
 * nodes, and reads all its inputs, at the position of its root.  pos[id]
 * gives that position (NULL: pos[id] = id); a node is written at pos[id]
 * and read at pos[c] of each consumer c.
 *
 * In place.  The one exception to "never aliases its own inputs": a node
 * whose op has IR_F_INPLACE0 (ir/ir.h; cross_entropy_grad and its
 * vocabulary-parallel form), or a reshape that is a view of its input
 * (bufplan_build_views), or a node the kernel plan marks a view of its
 * input 0 (view_of: an add an embedding gradient's call makes onto x's bytes,
 * codegen/grad_onto.h), takes the bytes of its input 0, x, when it is x's
 * last reader (every other reader runs at an earlier position, none
 * asynchronously past it, x not kept), x has a buffer of the same size,
 * element count and dtype written at an earlier position, and the node is
 * synchronous.  (A view may also take the bytes of a value with an aux part
 * after its elements, sdpa's out with its lse: the same element bytes, and
 * the view's size becomes x's; it reads the elements only.  So the weight
 * gradient of the projection after attention reads sdpa's out in place.)
 * alias[id] = x then, offset[id] = offset[x], and the bytes return to the
 * free list at the node's death, not at x's.  The node's
 * kernel overwrites x while reading it, which IR_F_INPLACE0 promises is
 * sound (a view runs no kernel).  So, as llm.c does, dlogits are written
 * over the logits and the weight gradient's reshape of them is a view: at
 * GPT-2's vocabulary the step's largest buffers, three live at once
 * otherwise.  Best fit being a heuristic, the plan with aliases can come out
 * larger than the one without (fragmentation, on tiny models): then the
 * one without is the plan (no alias at all), so In place never grows peak
 * (with several arenas: the layout's cost, below).
 *
 * Shared views.  A view that is not x's last reader (x read again later,
 * by a reader at its own position, or asynchronously) still takes x's
 * bytes, alias[id] = x, when x has a buffer of the same size (or aux part,
 * as above), element count and dtype written at an earlier position: a
 * view writes nothing, so x's later readers still find x there.  The bytes stay taken until every node
 * sharing them has died, and no node is written in place over them (over x
 * or any view of it) while shared.  So a reshape feeding a weight
 * gradient's GEMM costs no copy even where its input, a residual gradient,
 * is read again after it.  Like In place, shared views never grow the peak
 * (the cost): where the plan without them (In place only) is smaller, it is
 * the plan, and those reshapes copy.
 *
 * Several arenas (BufArenas: a pipeline's stages, each rank allocating its
 * stage's).  One offset per node serves every arena that holds its bytes,
 * so a value sent between two stages sits at the same offset on both.  Two
 * byte groups (a buffer with the nodes written over it or sharing it) may
 * share bytes where their lives are apart, as above, or where no arena
 * holds both (their groups' where bits are disjoint).  Arena s ends where the
 * last byte group it holds does (peak: the largest end), and a rank
 * allocates weight[s] copies of it; of the layouts tried (bufplan.c), the
 * plan is the one whose weighted ends (weight[s] x end) sum least with the
 * largest of them counted twice, so one stage's values are not laid out
 * around another's at no gain, nor the largest rank's lowered a little at
 * a far larger cost to the others.  live_peak is the most any one arena
 * holds at once. */
#ifndef PARC_BUFPLAN_H
#define PARC_BUFPLAN_H

#include <stdint.h>

#include "ir/ir.h"

#define BUFPLAN_ALIGN 64

/* Arenas planned at once (where NULL: one arena; unread NULL: every node
 * runs).  where[id]: bit s for each arena s holding node id's bytes
 * (0 for a buffered node counts as every arena).  unread[id] != 0: node id
 * never runs, so its reads keep no input alive (a pipeline's skipped
 * gradient sums: their terms go to an accumulator where they are made). */
typedef struct {
  const uint64_t *where;
  const unsigned char *unread;
  const int *weight; /* per arena: the copies of it a rank allocates (a pipeline
                      * stage's slots), which the layout's choice weighs
                      * (bufplan.c, Cost); NULL: one each; as many as
                      * the arenas named */
  /* via_acc[id] != 0 and acc_reader[r] != 0: r reads node id's value from
   * elsewhere, not from id's bytes (a pipeline's optimizer reads a gradient
   * from the accumulator the microbatches summed it into), so that read keeps
   * id's bytes no longer; NULL: none */
  const unsigned char *via_acc, *acc_reader;
  /* parts[id] == c: concat c only copies node id's elements, as they are, to
   * a contiguous range of its own (Assembled concats, below); NULL: none */
  const int *parts;
} BufArenas;

typedef struct {
  int64_t *offset;     /* per node id; -1 when the node has no buffer */
  int64_t *size;       /* per node id, bytes rounded up to BUFPLAN_ALIGN */
  int *last_use;       /* per node id: the last position that reads it */
  int *alias;          /* per node id: the input it is written over (In place) or
                        * shares bytes with (a view), or -1 */
  const unsigned char *narrow; /* per node id: elements of 2 bytes, an aux part after
                        * them at 2 ir_numel bytes (bufplan_build_arenas); NULL: none */
  int64_t peak;        /* arena bytes: the largest offset + size */
  int64_t live_peak;   /* the most bytes live at once (in any one arena): a lower
                        * bound on peak */
  BufArenas arenas;    /* as planned (bufplan_build_arenas; else none) */
  int narenas;         /* with arenas: one past the highest arena named, else 0 */
  int64_t *arena_live; /* with arenas: per arena s (narenas), the most bytes live
                        * at once in it (live_peak is the largest) */
  int mode;            /* what it writes over what: 0 nothing (apart), 1 In place,
                        * 2 In place and shared views */
  int *part_of;        /* per node id: the concat whose bytes hold its value
                        * (Assembled concats: a part, or a node written over
                        * one), the concat itself where assembled, else -1 */
  const int *view_of;  /* the views it was planned with (the caller's, borrowed;
                        * NULL: none): a node written over x with view_of[id] == x
                        * is x's bytes as they are, by no kernel of its own */
} BufPlan;

/* Plans buffers for every non-leaf node with materialize[id] != 0 (NULL:
 * all non-leaf nodes).  keep[id] != 0 extends a node's life to the end
 * (NULL: only the loss).  Arrays live in the module's arena.  Returns 0. */
int bufplan_build(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                  const int *pos, BufPlan *out);

/* bufplan_build for a step with asynchronous operations and views.  held
 * (NULL: none) -- held[id] >= 0 says node id keeps reading its inputs after
 * it starts at pos[id], up to position held[id] (an asynchronous collective
 * and its wait): each input stays live through held[id].  Its output is live
 * from pos[id] as always (the operation writes it in the background), to its
 * last reader, which comes at or after the wait.  view_of (NULL: none) --
 * view_of[id] == x says reshape id is a view of its input x: its kernel would
 * only copy x's bytes, unchanged (or a group_copy of x, tp's identity forward,
 * whose runtime call would).  Such a node is written over x under the
 * conditions of In place, as if its op had IR_F_INPLACE0, or shares x's
 * bytes (Shared views), and then the host runs no kernel or call for it (x's
 * bytes already hold its value: codegen/host.h, cg_kernel_is_view,
 * cg_runtime_is_view). */
int bufplan_build_views(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                        const int *pos, const int *held, const int *view_of, BufPlan *out);

/* bufplan_build_views for the arenas ar (NULL: one; out->arenas keeps them,
 * the arrays are the caller's), with the elements of the nodes where
 * narrow[id] != 0 (narrow NULL: none) taking 2 bytes, not 4 (bf16 values:
 * the GPU trainer's arena, codegen/cuda_arena.h; an aux part after them,
 * sdpa's lse, stays 4 bytes an element, from byte 2 ir_numel: ir_numel must
 * be even there).  out->narrow is narrow.  The invariants and the choices
 * above hold with those sizes; In place and shared views ask for equal
 * sizes, so they take a narrow input only for a narrow node. */
int bufplan_build_arenas(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                         const int *pos, const int *held, const int *view_of,
                         const unsigned char *narrow, const BufArenas *ar, BufPlan *out);

/* bufplan_build_arenas in like's mode and arenas, with no other mode tried
 * (a second plan of the same step at other sizes, codegen/cuda_arena.h: the
 * same nodes written over, or sharing, their inputs where the sizes allow,
 * not a plan that fell back to none where those sizes fragment more). */
int bufplan_build_like(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                       const int *pos, const int *held, const int *view_of,
                       const unsigned char *narrow, const BufPlan *like, BufPlan *out);

/* bufplan_build_views without views, every node in bytes of its own (no In place):
 * what the plan would be without it, for reports and tests (ar: as above). */
int bufplan_build_apart(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                        const int *pos, const int *held, const BufArenas *ar, BufPlan *out);

/* Per node id with a buffer, the arenas of its byte group (the OR of its
 * members' where bits; every arena, ~0, without arenas); 0 for the others. */
void bufplan_group_where(const IrModule *m, const BufPlan *p, uint64_t *out);

/* Assembled concats.  Where BufArenas.parts names the parts of concat c
 * (one arena: no where bits), every part p (or, where p is to be written
 * over x as a view, view_of[p] == x, that x: the part's byte group's root)
 * takes c's bytes from byte 4 o_p on, o_p its first element in c, once the
 * first of them is written: c's bytes are then taken from that position to
 * c's last reader, and c's kernel copies nothing (part_of[c] == c; the host
 * skips it, codegen/host.h cg_kernel_is_view).  All or nothing: every part
 * at a BUFPLAN_ALIGN-aligned start, taking bytes of its own when written
 * (no In place, no view over anything else), none narrow; else c is planned
 * as any node.  A data-parallel bucket (passes/dp_grads.c): the weight
 * gradients are written where the collective reads them. */

/* Sub-range views.  A view (view_of[id] == x) may also be a chain of
 * reshapes and slices from x whose elements are a contiguous range of x's,
 * starting at element bufplan_view_offset(id's node, x): a data-parallel
 * gradient bucket's pieces after the collective (passes/dp_grads.c).  Such a
 * node shares x's bytes (Shared views, never In place) from byte 4 off on,
 * where that is BUFPLAN_ALIGN-aligned and neither is narrow; its size is its
 * own, inside x's range. */
int64_t bufplan_view_offset(const IrNode *n, const IrNode *x);

/* Checks the invariant above (with the same pos; for p->arenas, between
 * groups an arena holds both of), In place included: an
 * alias is to input 0 of an IR_F_INPLACE0 node or of a planned view
 * (p->view_of), the input's last reader, or
 * of a reshape (a view: same offset and size, written after its input;
 * nothing else may write those bytes while the view is live);
 * 0 or -1 with a reason. */
int bufplan_check(const IrModule *m, const BufPlan *p, const int *pos, char *why, size_t len);

#endif
