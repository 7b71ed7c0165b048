/* codegen/cg_kernels.h -- IR nodes to kernel IR: which nodes each generated
 * kernel computes (fusion), and the kernels themselves.
 *
 * Every IR op is one of three kinds:
 *   - a leaf (input, param, state): a graph value with a buffer, no kernel;
 *   - a runtime op (cg_runtime_op: GEMMs, attention, routing, embedding,
 *     cross-entropy): libparcrt computes it at its position in node order;
 *   - anything else: computed by exactly one KIR kernel of the plan.
 *
 * THE PLAN
 *
 *   kernels[] is in execution order.  Kernel i runs at the position of its
 *   root in node order: after every node with a smaller id, runtime ops
 *   included, and before any node with a larger id; kernels of one root
 *   run in array order (a root has at most two: see "Temporaries").  Every
 *   buffer a kernel reads is a leaf, a runtime op's result, a materialised
 *   node of an earlier kernel, or a temporary an earlier kernel wrote.
 *
 *   A kernel computes its nodes (nodes[], ascending ids; root is the
 *   largest, except for a wgrad kernel deferred to run right after the
 *   kernel that writes its statistics: see Temporaries) and stores exactly
 *   the materialised ones; the others are values it computes internally
 *   (fused away: no buffer, kernel_of names the kernel, materialize is 0).
 *   materialize[n] is 1 for every node that
 *   needs its own buffer: leaves, runtime results, nodes read by a runtime
 *   op or by another kernel, the loss and ce_loss, parameter gradients,
 *   update values and grad_norm, and (defensively) nodes nothing reads --
 *   except an update value written in place (below), which has none.
 *
 *   Kernel params are buffers only, in KIR declaration order; arg_node[i]
 *   is the IR node whose buffer param i is (f32 or i32 as the node's
 *   dtype), or CG_TEMP_ARG(t) for temporary t.  Scalars (lr, step, clip
 *   coefficient, ...) are f32[] nodes read at index 0.  A kernel never reads
 *   a buffer it writes, and the buffers it writes are distinct nodes, so
 *   the KIR caller contract holds as long as distinct nodes get disjoint
 *   buffers.  Rows are independent: the host may split [0, rows) over
 *   threads.
 *
 * IN-PLACE UPDATES
 *
 *   inplace_of[v] = L says that update value v (m->updates: L <- v) has no
 *   buffer of its own: its kernel K stores it straight into the buffer of its
 *   leaf L, and from then on v lives there (a host reads v at L's buffer and
 *   copies nothing at the end of the step).  K takes L as one KIR_INOUT
 *   param (arg_node L), which it both reads (L's old value) and stores (v).
 *   That is sound because the plan binds v to L only when
 *     (a) K is an elementwise kernel whose iteration shape is L's shape, and
 *         every member of K that reads L is pointwise, of L's shape and
 *         computed at K's own coordinates: K reads element i of L only in
 *         the iteration that stores element i of v, and builds every load of
 *         L before its store of v (cg_emit.c checks this on the built
 *         kernel: one index for every access of the param, loads first);
 *     (b) every other reader of L runs before K (its position, as above, is
 *         less than K's root; none is an asynchronous dp bucket collective),
 *         so L's old value is dead once K has run;
 *   readers of v after K read L's buffer, which holds v.  Every other update
 *   (a value computed by a runtime op, read from L at another index, or
 *   with a reader of L after K) keeps its buffer, and the host copies it
 *   into L at the end of the step.  inplace_of is -1 for every other node.
 *
 * TEMPORARIES
 *
 *   layer_norm_wgrad and rms_norm_wgrad need per-row statistics of x (mean
 *   and 1/std) that no IR node holds.  Temporary t (f32, temps[t].numel
 *   elements) carries them from the kernel temps[t].writer to the kernel
 *   temps[t].reader (a later one); it is dead after the reader.  With
 *   fuse = 0, and when no suitable kernel computes them anyway, the writer
 *   is a `..._stats` kernel of the wgrad's own root, run just before it
 *   (one row per row of x, no nodes).  With fuse = 1 the row kernel of the
 *   matching layer_norm_grad / rms_norm_grad (same x, same eps) writes
 *   them, so the statistics are computed once; if that kernel runs later
 *   than the wgrad would (its root moved to an epilogue, e.g. the residual
 *   gradient add), the wgrad's kernel takes the same root and runs right
 *   after it, provided everything that reads the wgrad runs later still.
 *
 * LOOP STRUCTURE (KIR rows and column loops; rows are independent)
 *
 *   elementwise (pointwise ops, views, fill, broadcast, rope; k<id>_<op>):
 *     one store per element of the root's shape.  Pure broadcasting
 *     arithmetic flattens adjacent dims that every operand reads alike
 *     (full or broadcast), column loop over the last flattened dim, cut into
 *     rows of at most 4096 when longer; otherwise rows = leading dims,
 *     column = last dim, views as index arithmetic (div/mod only where an
 *     index crosses blocks).  A rope root loops over hd/2 and stores i and
 *     i + hd/2 together.
 *   row (softmax, layer_norm, rms_norm, their grads, softmax_grad): one row
 *     per vector along the last dim, loops for the statistics, a final loop
 *     that stores the prologue, the op and its epilogue.
 *   reduce (sum, mean, sum_to, sumsq, wgrads): rows = the kept elements,
 *     one column loop over the reduced ones (strided loads when the reduced
 *     dims lead), one store per row; sumsq and full sums are one row.
 *   concat: rows = the dims before the axis, one loop per part over its
 *     contiguous block.
 *
 * FUSION (fuse = 1)
 *
 *   Nodes are grouped consumers-first.  A node joins the kernel of its
 *   consumers when every consumer it has outside that kernel runs later
 *   than the kernel, and
 *     - it is pointwise or a view (reshape, split/merge_heads, transpose,
 *       slice, broadcast, fill, rope): computed inline wherever it is read
 *       (recomputed per loop of a row kernel); if it must also be
 *       materialised, only where the kernel visits each of its elements
 *       once, in its own shape (elementwise and row kernels);
 *     - or it is a row op (softmax, the norms and their gradients) whose
 *       consumers read it elementwise in an elementwise kernel of its shape:
 *       the kernel becomes a row kernel with that epilogue.
 *   A norm the backward computes again (passes/remat_norm.c: another norm
 *   of the same op reads the same input and weights) takes no prologue and
 *   joins no consumer's kernel: it
 *   and its recomputation run the same kernel code on the same buffers, so
 *   they store the same bits (a prologue would change the order of the
 *   row's sums).
 *   Reductions (sum, mean, sum_to, sumsq, the wgrads) and concat start
 *   kernels that take prologues but are never fused into a consumer.  A
 *   bias gradient sum_to(dy) to [D] shares the column loop of the norm
 *   wgrad that reduces the same dy (one kernel, two sums), and the wgrad
 *   reads its statistics from the norm gradient's kernel (Temporaries).
 *   With fuse = 0 every computed node is its own kernel and materialised.
 *
 * NUMERICS (all f32; the reference is ir/interp.c in double)
 *
 *   Each op follows the interpreter's formula and order of operations.
 *   Row statistics are two-pass (mean, then sum of squared deviations).
 *   Sums are KIR sum reductions (vectorised; order fixed per object).
 *   rope: angle = f32(t) * exp(f32(i) * f32(-2 ln(theta) / hd)) in f32, so
 *   |angle error| <~ 1e-7 * t; sin and cos by quadrant reduction (three-part
 *   pi/2) and Taylor polynomials on [-pi/4, pi/4], exact to a few ulp while
 *   angle < 2^13 * pi/2.  bias_correction: 1 - beta^step computed as
 *   -expm1(step * f32(ln beta)) (series for |x| < 1/2) so that
 *   1 - 0.999^1 keeps full relative precision. */
#ifndef PARC_CG_KERNELS_H
#define PARC_CG_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/kir.h"
#include "ir/ir.h"

#define CG_TEMP_ARG(t) (-1 - (t))    /* arg_node value of temporary t */
#define CG_ARG_TEMP(a) (-1 - (a))    /* and back, for a < 0 */

typedef struct {
  int64_t numel;       /* f32 elements */
  int writer, reader;  /* kernel indices, writer < reader */
} CgTemp;

typedef struct {
  KirKernel *k;        /* owned by the plan's km */
  int nargs;           /* == k->nparams: every param is a buffer */
  int *arg_node;       /* per param: IR node id, or CG_TEMP_ARG(t) */
  int root;            /* the IR node at whose position the kernel runs */
  int nnodes;
  int *nodes;          /* IR nodes it computes, ascending (empty for _stats) */
  int range_view;      /* 1: its nodes are reshapes and slices that copy a
                          contiguous range of view_of[root] (see view_of) */
  int assembles;       /* 1: a concat of weight gradients (or of ZeRO's
                          updated pieces) whose parts the buffer plan may
                          place in its bytes (see parts).
                          Both cleared once the buffer plan is made where it
                          did not (cg_plan_step): the kernel then copies */
} CgKernel;

typedef struct {
  KirModule *km;
  CgKernel *kernels;   /* in execution order */
  int nkernels;
  int nnodes;          /* m->nnodes when planned */
  int *kernel_of;      /* per node: index of the kernel computing it, or -1 */
  unsigned char *materialize;  /* per node: has its own buffer (see above) */
  int *view_of;        /* per node: for a reshape whose kernel only copies the
                          buffer of materialised node x (same bytes, same
                          order), x; else -1.  A host that aliases buffers
                          may point the reshape at x's buffer (keeping x
                          alive as long) and skip the copy kernel.  Also a
                          group_copy of x (an identity whose copy is a
                          runtime call: skipped likewise, cg_runtime_is_view),
                          and an add whose other term an embedding gradient's
                          call adds onto x's bytes (codegen/grad_onto.h).
                          Also the root of a kernel of reshapes and slices
                          that copies a contiguous range of a weight
                          gradient's value x (a dp bucket's pieces): a view
                          of a range of x's bytes where the buffer plan
                          makes it one (bufplan.h, Sub-range views). */
  int *parts;          /* per node: for a weight gradient (W phase, f32) that a
                          concat's kernel only copies, through reshapes, to a
                          contiguous range of the concat (a dp bucket,
                          passes/dp_grads.c), that concat; likewise a ZeRO-1
                          update (optimizer phase) and the concat of one row
                          the all-gather sends (passes/optimizer.c); else -1.  All of a
                          concat's inputs or none; the buffer plan may write
                          them in its bytes and skip its kernel (bufplan.h,
                          Assembled concats; BufArenas.parts). */
  int *inplace_of;     /* per node: for an update value written in place, its
                          leaf's id (see In-place updates); else -1 */
  int ntemps;
  CgTemp *temps;
  const int *acc_into;  /* a pipelined trainer's (codegen/host.h, cg_pipe_acc_into):
                          per node, for a GEMM whose product the host adds into
                          the gradient accumulator itself (materialize 0), the
                          PARAM whose gradient it is, else -1; NULL: none (not
                          cg_plan_kernels') */
  const int *onto;      /* per node, for an embedding's gradient whose call adds it
                          onto another gradient term's bytes (codegen/grad_onto.h,
                          cg_plan_onto), that term; else -1; NULL: none */
} CgKernelPlan;

/* Groups m's nodes into kernels and builds them (KIR module, one kernel
 * per group).  fuse: 0 one kernel per node, 1 fusion.  colour: NULL, or a
 * colour per node id: nodes of two colours never share a kernel, no kernel
 * runs at (takes its root from) a node of another colour, and a wgrad reads
 * statistics only from a kernel of its own colour (a pipelined trainer runs
 * each colour's kernels apart from the others': codegen/project.c).  A node
 * read by a node of another colour is therefore materialised.  With colour
 * NULL every node has the same one.  0, or -1 with a one-line reason in err
 * (an internal error: a KIR builder error names the kernel).  On failure
 * *out is left empty (cg_plan_free is still safe). */
int cg_plan_kernels(const IrModule *m, int fuse, const int *colour, CgKernelPlan *out,
                    char *err, size_t errlen);

/* 1 if libparcrt implements op (no kernel): matmul, matmul_ta, sdpa,
 * sdpa_grad, topk, gather, scatter_add, onehot, dispatch, combine,
 * combine_grad_y, combine_grad_w, embedding, embedding_grad,
 * cross_entropy, cross_entropy_grad. */
int cg_runtime_op(IrOp op);

/* 1 if op lowers to KIR (neither a leaf nor a runtime op). */
int cg_kernel_op(IrOp op);

void cg_plan_free(CgKernelPlan *p);

/* canon[i] (kp->nkernels entries): the first kernel with kernel i's code
 * (its params' kinds and accesses, rows, loops and nodes; names are labels:
 * codegen/cg_dedup.c); returns how many codes differ. */
int cg_dedup_kernels(const CgKernelPlan *kp, int *canon);

#endif
