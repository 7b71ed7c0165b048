/* runtime/rt_route.h -- the irregular ops: top-k routing, gather / scatter, one-hot,
 * mixture-of-experts dispatch and combine (and their gradients), token embedding
 * (and its gradient), cross-entropy (and its gradient).  The spec of each is the
 * op of the same name in ir/interp.c.
 *
 * Conventions:
 *  - Tensors are dense row-major, last dimension fastest; a tensor with leading
 *    dimensions [...] is passed flattened to `rows` (or N) rows.
 *  - Every index (embedding id, target, gather index, expert choice) is checked
 *    before anything is written; one out of range gives RT_ERR with a message
 *    naming the value, its flat position and the valid range.
 *  - Outputs never overlap inputs.
 *  - Work is split over output rows (or, for embedding_grad, output columns) with
 *    rt_parallel_for; every output element is computed by one task, and every sum
 *    runs in the order the spec gives (positions ascending, choices ascending), so
 *    results are bit-identical for any rt_pool size.
 *  - Routing slots (dispatch, combine and their gradients): choices (token n,
 *    choice j) in ascending order, n major, take the next free slot of expert
 *    idx[n, j]; once an expert holds C tokens its later choices are dropped.
 *    A choice of -1 was dropped before (rt_capacity_drop): it takes no slot.  Each
 *    routing call recomputes them serially into a transient N*K (or E*C) array.
 *  - Functions return RT_OK, or RT_ERR (NULL pointer, dimension < 1, index out of
 *    range, out of memory for the routing scratch). */
#ifndef PARC_RT_ROUTE_H
#define PARC_RT_ROUTE_H

#include <stdint.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_trace.h"

/* topk: x [rows, n] -> out i32 [rows, k], 1 <= k <= n: per row, the indices of the
 * k largest values in descending value order, equal values lower index first
 * (exactly the spec's selection, NaN included). */
int rt_topk(int32_t *out, const float *x, int64_t rows, int64_t n, int64_t k);

/* gather: x [rows, n], idx i32 [rows, k] -> out [rows, k]:
 * out[r, j] = x[r, idx[r, j]]. */
int rt_gather(float *out, const float *x, const int32_t *idx, int64_t rows, int64_t n,
              int64_t k);

/* scatter_add: idx i32 [rows, k], dy [rows, k] -> out [rows, n], zeroed, then
 * out[r, idx[r, j]] += dy[r, j] for j ascending. */
int rt_scatter_add(float *out, const int32_t *idx, const float *dy, int64_t rows, int64_t k,
                   int64_t n);

/* onehot: idx i32 [count] -> out [count, n]: out[p, v] = (idx[p] == v). */
int rt_onehot(float *out, const int32_t *idx, int64_t count, int64_t n);

/* dispatch: x [N, D], idx i32 [N, K] -> out [E, C, D]: x[n, :] copied to
 * out[idx[n, j], slot(n, j), :] for every kept choice; empty slots are zero. */
int rt_dispatch(float *out, const float *x, const int32_t *idx, int64_t N, int64_t K,
                int64_t D, int64_t E, int64_t C);

/* combine: y [E, C, D], idx i32 [N, K], w [N, K] -> out [N, D]:
 * out[n, :] = sum over kept choices j (ascending) of w[n, j] * y[idx[n, j], slot, :]. */
int rt_combine(float *out, const float *y, const int32_t *idx, const float *w, int64_t N,
               int64_t K, int64_t D, int64_t E, int64_t C);

/* combine_grad_y: dout [N, D], idx i32 [N, K], w [N, K] -> dy [E, C, D]: the slot of
 * kept choice (n, j) holds w[n, j] * dout[n, :]; empty slots are zero. */
int rt_combine_grad_y(float *dy, const float *dout, const int32_t *idx, const float *w,
                      int64_t N, int64_t K, int64_t D, int64_t E, int64_t C);

/* combine_grad_w: dout [N, D], y [E, C, D], idx i32 [N, K] -> dw [N, K]:
 * dw[n, j] = dout[n, :] . y[idx[n, j], slot(n, j), :], 0 for dropped choices. */
int rt_combine_grad_w(float *dw, const float *dout, const float *y, const int32_t *idx,
                      int64_t N, int64_t K, int64_t D, int64_t E, int64_t C);

/* embedding: ids i32 [count], table [V, D] -> out [count, D]:
 * out[p, :] = table[ids[p], :]. */
int rt_embedding(float *out, const int32_t *ids, const float *table, int64_t count,
                 int64_t V, int64_t D);

/* embedding_grad: ids i32 [count], dy [count, D] -> dtable [V, D], zeroed, then
 * dtable[ids[p], :] += dy[p, :] for p ascending (split over columns of D). */
int rt_embedding_grad(float *dtable, const int32_t *ids, const float *dy, int64_t count,
                      int64_t V, int64_t D);
/* The same onto what dtable holds (not zeroed first): a pipeline's gradient
 * accumulator, summing the microbatches (codegen/host.h, cg_pipe_acc_into). */
int rt_embedding_grad_acc(float *dtable, const int32_t *ids, const float *dy, int64_t count,
                          int64_t V, int64_t D);

/* cross_entropy: logits [N, V], targets i32 [N] -> *loss (one float): the mean over
 * the N positions of logsumexp(logits[p, :]) - logits[p, targets[p]].  Per row,
 * exp(x - max) in float (rt_exp_nonpos, rt_vmath.h), summed in double in 8 fixed
 * lanes; the positions' losses in double, in position order.  Scratch: one row of
 * V floats per task. */
int rt_cross_entropy(float *loss, const float *logits, const int32_t *targets, int64_t N,
                     int64_t V);

/* cross_entropy_grad: logits [N, V], targets i32 [N], dloss (one float) ->
 * dlogits [N, V] = *dloss / N * (softmax(logits[p, :]) - onehot(targets[p])).
 * dlogits may be logits (in place, the same bits): a row's logits are read
 * for its max, then each element once more just before it is overwritten. */
int rt_cross_entropy_grad(float *dlogits, const float *logits, const int32_t *targets,
                          const float *dloss, int64_t N, int64_t V);

/* capacity_drop (ir/ops.def): idx i32 [N, K], this member's choices; out i32
 * [N, K] = idx with the choices the capacity C drops set to -1, deciding in
 * global order: the members of g (the dp group; NULL: one rank) in rank
 * order, each holding its tokens, then (n, j) ascending.  The members'
 * per-expert counts are all-gathered (E floats each, exact: N K <= 2^24).
 * Routing ops (dispatch, combine and their gradients) skip -1 choices. */
int rt_capacity_drop(RtComm *g, int32_t *out, const int32_t *idx, int64_t N, int64_t K,
                     int64_t E, int64_t C);

/* route_stats: idx i32 [N, K] as a dispatch with E experts of C slots reads it
 * -> stats[e] += the choices expert e keeps (the slot rule above: -1 skipped,
 * at most C each), stats[E] += N K (the choices routed).  Counts are exact in
 * float up to 2^24 a step.  The trainer's per-layer log (RtMoeDesc). */
int rt_route_stats(float *stats, const int32_t *idx, int64_t N, int64_t K, int64_t E,
                   int64_t C);

/* ---- vocabulary parallelism (Megatron): the table / logits split by rows /
 * columns over the `parts` members of a group; member `part` holds vocabulary
 * entries [part Vl, (part + 1) Vl).  Specs: vocab_embedding(_grad) and
 * vocab_cross_entropy(_grad) in ir/interp.c. */

/* ids in [0, Vl parts): out[p, :] = table[ids[p] - part Vl, :] for the member's
 * ids, zero rows for the others (a partial sum over the group). */
int rt_vocab_embedding(float *out, const int32_t *ids, const float *table, int64_t count,
                       int64_t Vl, int64_t D, int part, int parts);

/* dtable [Vl, D], zeroed, then the dy rows of the member's ids added at
 * ids[p] - part Vl, p ascending. */
int rt_vocab_embedding_grad(float *dtable, const int32_t *ids, const float *dy, int64_t count,
                            int64_t Vl, int64_t D, int part, int parts);
/* The same onto what dtable holds (not zeroed first), as rt_embedding_grad_acc. */
int rt_vocab_embedding_grad_acc(float *dtable, const int32_t *ids, const float *dy,
                                int64_t count, int64_t Vl, int64_t D, int part, int parts);

/* cross_entropy of the group's logits [N, Vl parts] cut to their first V
 * columns (V <= Vl parts; the columns >= V are vocabulary padding, masked as
 * if -inf: out of the max and the sum of exp), each member holding its
 * columns [N, Vl]; targets in [0, V); every member of g calls it and gets
 * the same *loss (g NULL: one member, the one-rank trainer's tp group, with
 * a padded vocabulary).  Two all_gathers: the row maxima, then per row the local
 * sum of exp(x - max) (a double sent as two floats) and the target logit
 * (0 off its owner); summed in member order in double.  No member holds a
 * whole row.  trace (NULL: none; a trainer's --trace): each gather recorded
 * as a blocking all-gather of group trace_group (RT_TRACE_TP..,
 * rt_trace_comm), N floats a member, then 3 N: what plan.json counts. */
int rt_vocab_cross_entropy(RtComm *g, RtTrace *trace, int trace_group, float *loss,
                           const float *logits, const int32_t *targets, int64_t N, int64_t Vl,
                           int64_t V);

/* The member's columns of cross_entropy_grad: *dloss / N (softmax - onehot),
 * with the group's max and sum of exp gathered as in rt_vocab_cross_entropy;
 * exactly 0 in the padding columns (global index >= V).  dlogits may be
 * logits (in place, the same bits): the statistics are gathered before the
 * first write, then each element is read just before it is overwritten.
 * trace, trace_group: as rt_vocab_cross_entropy's. */
int rt_vocab_cross_entropy_grad(RtComm *g, RtTrace *trace, int trace_group, float *dlogits,
                                const float *logits, const int32_t *targets, const float *dloss,
                                int64_t N, int64_t Vl, int64_t V);

/* ---- sequence parallelism: collectives along one dimension ----------------
 * x viewed as [outer, n, inner] (n the cut dimension): each member of g holds
 * its piece [outer, n / parts, inner] of the whole [outer, n, inner], member
 * c the c-th; the pieces are not contiguous when outer > 1, so these go
 * through a scratch buffer (malloc'd per call) of the whole tensor.  Every
 * member of g calls them with the same sizes; n % parts == 0 is required
 * (else a one-line error). */

/* out [outer, n, inner] = the members' pieces x [outer, n / parts, inner]
 * concatenated along the dimension (all_gather). */
int rt_all_gather_dim(RtComm *g, const float *x, float *out, int64_t outer, int64_t n,
                      int64_t inner);

/* out [outer, n / parts, inner] = the member's piece of the sum over the
 * members of x [outer, n, inner] (reduce_scatter; sums as the communicator
 * makes them, in member order). */
int rt_reduce_scatter_dim(RtComm *g, const float *x, float *out, int64_t outer, int64_t n,
                          int64_t inner);

/* out [outer, n / parts, inner] = piece `part` of x [outer, n, inner] (no
 * communication: a replicated value cut to the member's piece). */
int rt_local_slice(float *out, const float *x, int64_t outer, int64_t n, int64_t inner, int part,
                   int parts);

#endif
