/* passes/dp_grads.c -- data-parallel gradient averaging in buckets, issued
 * as soon as each bucket is complete in the backward pass.
 *
 * Every parameter gradient of a module pass_shard made for dp > 1 is the
 * gradient of the rank's local batch; the gradient of the global batch is
 * their mean over the dp ranks (axis 1).  Rather than one collective per
 * parameter, the gradients are grouped into buckets and each bucket is
 * reduced with ONE collective over a flat buffer:
 *
 *   order     parameters by the position of their final gradient (p->grad)
 *             in the node list, i.e. the order they become final in the
 *             backward pass (the last layers' first);
 *   buckets   consecutive parameters in that order; a bucket closes once it
 *             holds at least m->dp_bucket_bytes (0: DP_BUCKET_BYTES_DEFAULT)
 *             of gradient, and a parameter of that much or more has one
 *             alone (no concat: the collective reads its gradient where it
 *             is, GPT-2's tied embedding table's among them);
 *   issue     the flat buffer and its collective are placed right after the
 *             bucket's last gradient (its anchor) in node order, so the
 *             collective can run while the backward pass goes on;
 *   finish    the per-parameter pieces are appended after the whole
 *             backward pass, bucket by bucket: the first reader of a
 *             collective's result is there, never before, so an asynchronous
 *             collective (codegen) overlaps everything in between.
 *
 * The mean is taken before the sum: the loss's seed (m->seed, pass_autodiff's
 * fill of 1) becomes 1/dp, so every gradient of the rank's loss comes out
 * divided by dp (the backward is linear in the seed) and the collective's
 * sum is the mean: each piece is a contiguous range of its result, which the
 * buffer plan makes a view (bufplan.h, Sub-range views), and no pass over
 * the gradients follows the collective.  (For a power of two dp, the same
 * bits as the sum scaled after: scaling by 2^-k is exact, overflow and
 * subnormals aside.)  Expert gradients likewise (pass_ep_grads).
 *
 * Without ZeRO (m->mesh_zero <= 1), for gradients g_1..g_k of a bucket:
 *   flat   = concat(reshape(g_1, [n_1]), ..., reshape(g_k, [n_k])) axis 0
 *   red    = all_reduce(flat) axis=1 size=dp            (issue)
 *   g_i'   = reshape(slice(red, 0, o_i, n_i), shape of p_i)   (finish)
 * (a parameter alone in its bucket: red = all_reduce(g_1), g_1' = red).
 * and p_i->grad = g_i': the same values, bit for bit, as an all_reduce per
 * parameter (the sums are elementwise in rank order).
 *
 * ZeRO-1 (m->mesh_zero == dp): each rank keeps only its piece of every
 * gradient, s_i = ceil(n_i / dp) elements of the flattened gradient padded
 * with zeros to dp * s_i (ir/ir.h flat_shards).  The bucket is laid out
 * rank-major so that one reduce_scatter hands every rank exactly its pieces:
 *   r_i    = reshape(concat(reshape(g_i, [n_i]), fill(0, [dp s_i - n_i])), [dp, s_i])
 *   flat   = concat(r_1, ..., r_k) axis 1                    [dp, S], S = sum s_i
 *   red    = reduce_scatter(flat) axis=1 size=dp dim=0      [1, S]   (issue)
 *   g_i'   = reshape(slice(red, 1, o_i, s_i), [s_i])                 (finish)
 * and p_i->grad = g_i', the rank's piece of the averaged gradient.  Sizes
 * not divisible by dp only add zero padding (the last ranks' pieces end in
 * zeros), so every rank runs the same shapes.  Expert-parallel weights are
 * not in these buckets: pass_ep_grads reduces them over their ep_dp group
 * (under ZeRO-1 into pieces over that group, ir_zero_pieces).
 *
 * Every new node is W-phase; bucket nodes take the anchor's layer and
 * location, per-parameter nodes their gradient's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  IrModule *m;
  const IrNode *at;   /* layer and location of the nodes being made */
  int failed;
} Mk;

/* Appends an op on in[0..nin) with attributes ia[0..2] and fa; shape-directed
 * ops (reshape, fill) take the shape given (rank >= 0). */
static IrNode *mk(Mk *k, IrOp op, IrNode **in, int nin, int64_t ia0, int64_t ia1, int64_t ia2,
                  double fa, int rank, const int64_t *shape) {
  if (k->failed) return NULL;
  IrNode p = {.op = op, .inputs = in, .ninputs = nin, .ia = {ia0, ia1, ia2}, .fa = fa};
  if (rank >= 0) {
    p.rank = rank;
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
  }
  IrNode *n = ir_add_inferred(k->m, &p, k->at, IR_PHASE_W, "dp gradients");
  if (!n) k->failed = 1;
  return n;
}

static IrNode *reshape(Mk *k, IrNode *x, int rank, const int64_t *shape) {
  if (!x) return NULL;
  if (x->rank == rank && !memcmp(x->shape, shape, sizeof(int64_t) * (size_t)rank)) return x;
  return mk(k, IR_OP_RESHAPE, &x, 1, 0, 0, 0, 0, rank, shape);
}

static IrNode *concat(Mk *k, IrNode **xs, int n, int axis) {
  for (int i = 0; i < n; i++)
    if (!xs[i]) return NULL;
  return n == 1 ? xs[0] : mk(k, IR_OP_CONCAT, xs, n, axis, 0, 0, 0, -1, NULL);
}

static IrNode *slice(Mk *k, IrNode *x, int axis, int64_t start, int64_t len) {
  if (!x || (start == 0 && len == x->shape[axis])) return x;
  return mk(k, IR_OP_SLICE, &x, 1, axis, start, len, 0, -1, NULL);
}

static int by_grad_position(const void *a, const void *b) {
  const IrNode *x = *(IrNode *const *)a, *y = *(IrNode *const *)b;
  return (x->grad->id > y->grad->id) - (x->grad->id < y->grad->id);
}

/* Moves the issue nodes of each bucket, ids [first[b], end[b]), to right
 * after its anchor; the nodes after issue_end (the finish part) stay last. */
static void place(IrModule *m, int nold, int nb, const int *anchor, const int *first,
                  const int *end, int issue_end) {
  IrNode **order = malloc(sizeof *order * (size_t)m->nnodes);
  if (!order) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  int k = 0;
  for (int i = 0; i < nold; i++) {
    order[k++] = m->nodes[i];
    for (int b = 0; b < nb; b++)
      if (anchor[b] == i)
        for (int j = first[b]; j < end[b]; j++) order[k++] = m->nodes[j];
  }
  for (int j = issue_end; j < m->nnodes; j++) order[k++] = m->nodes[j];
  for (int i = 0; i < m->nnodes; i++) {
    m->nodes[i] = order[i];
    m->nodes[i]->id = i;
  }
  free(order);
}

int dp_grads_is_bucket(const IrNode *n) {
  return (n->op == IR_OP_ALL_REDUCE || n->op == IR_OP_REDUCE_SCATTER) && n->ia[0] == 1 &&
         n->phase == IR_PHASE_W;
}

int pass_dp_grads(IrModule *m, int dp) {
  if (m->mesh_dp && dp != m->mesh_dp) {
    fprintf(stderr, "parc: internal error: dp gradients over %d ranks for a module sharded "
                    "for dp = %d\n", dp, m->mesh_dp);
    return -1;
  }
  int zero = m->mesh_zero > 1;
  if (zero && m->mesh_zero != dp) {
    fprintf(stderr, "parc: internal error: ZeRO-1 over %d ranks for dp = %d\n", m->mesh_zero,
            dp);
    return -1;
  }
  if (dp <= 1) return 0;
  IrNode *seed = m->seed;
  if (!seed || seed->id >= m->nnodes || m->nodes[seed->id] != seed || seed->op != IR_OP_FILL ||
      seed->rank != 0 || seed->fa != 1.0) {
    fprintf(stderr, "parc: internal error: dp gradients without the loss's seed of 1\n");
    return -1;
  }
  seed->fa = 1.0 / dp; /* the sums below are the means */
  if (pass_ep_grads(m, dp)) return -1; /* expert-parallel weights: passes/ep_grads.c */
  int nold = m->nnodes, np = 0;
  for (int i = 0; i < nold; i++)
    np += m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad && !ep_sharded(m->nodes[i]);
  if (!np) return 0;
  IrNode **ps = arena_alloc(&m->arena, sizeof *ps * (size_t)np);
  np = 0;
  for (int i = 0; i < nold; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad && !ep_sharded(m->nodes[i]))
      ps[np++] = m->nodes[i];
  qsort(ps, (size_t)np, sizeof *ps, by_grad_position);

  /* buckets: [bstart[b], bstart[b + 1]) of ps */
  int64_t cap = m->dp_bucket_bytes > 0 ? m->dp_bucket_bytes : DP_BUCKET_BYTES_DEFAULT;
  int *bstart = arena_alloc(&m->arena, sizeof(int) * (size_t)(np + 1));
  int nb = 0;
  int64_t bytes = 0;
  for (int i = 0; i < np; i++) {
    int64_t n = ir_numel(ps[i]), b = 4 * (zero ? (n + dp - 1) / dp * dp : n);
    if (b >= cap) bytes = 0; /* (alone) */
    if (bytes == 0) bstart[nb++] = i;
    bytes += b;
    if (bytes >= cap) bytes = 0;
  }
  bstart[nb] = np;

  int *anchor = arena_alloc(&m->arena, sizeof(int) * (size_t)nb);
  int *first = arena_alloc(&m->arena, sizeof(int) * (size_t)nb);
  int *end = arena_alloc(&m->arena, sizeof(int) * (size_t)nb);
  IrNode **red = arena_alloc(&m->arena, sizeof *red * (size_t)nb);
  IrNode **parts = arena_alloc(&m->arena, sizeof *parts * (size_t)np);
  Mk k = {.m = m};
  /* issue: one flat buffer and one collective per bucket */
  for (int b = 0; b < nb && !k.failed; b++) {
    int lo = bstart[b], hi = bstart[b + 1];
    k.at = ps[hi - 1]->grad;
    anchor[b] = ps[hi - 1]->grad->id;
    first[b] = m->nnodes;
    int alone = !zero && hi - lo == 1; /* (its gradient as it is: no flat copy) */
    for (int i = lo; i < hi && !alone; i++) {
      int64_t n = ir_numel(ps[i]), s = (n + dp - 1) / dp;
      IrNode *flat = reshape(&k, ps[i]->grad, 1, &n);
      if (zero && s * dp > n) {
        IrNode *pad = mk(&k, IR_OP_FILL, NULL, 0, 0, 0, 0, 0.0, 1, (int64_t[]){s * dp - n});
        flat = concat(&k, (IrNode *[]){flat, pad}, 2, 0);
      }
      parts[i] = zero ? reshape(&k, flat, 2, (int64_t[]){dp, s}) : flat;
    }
    IrNode *buf = alone ? ps[lo]->grad : concat(&k, parts + lo, hi - lo, zero);
    red[b] = zero ? mk(&k, IR_OP_REDUCE_SCATTER, &buf, 1, 1, dp, 0, 0, -1, NULL)
                  : mk(&k, IR_OP_ALL_REDUCE, &buf, 1, 1, dp, 0, 0, -1, NULL);
    end[b] = m->nnodes;
  }
  /* finish: after the backward pass, hand each parameter its piece */
  int issue_end = m->nnodes;
  for (int b = 0; b < nb && !k.failed; b++) {
    int lo = bstart[b], hi = bstart[b + 1];
    IrNode *avg = red[b];
    int64_t off = 0;
    if (!zero && hi - lo == 1 && avg) { /* (alone: the sum is its gradient) */
      ps[lo]->grad = avg;
      continue;
    }
    for (int i = lo; i < hi && !k.failed; i++) {
      IrNode *p = ps[i];
      int64_t n = ir_numel(p), s = (n + dp - 1) / dp;
      k.at = p->grad;
      IrNode *g = zero ? reshape(&k, slice(&k, avg, 1, off, s), 1, &s)
                       : reshape(&k, slice(&k, avg, 0, off, n), p->rank, p->shape);
      off += zero ? s : n;
      if (g) p->grad = g;
    }
  }
  if (k.failed) return -1;
  place(m, nold, nb, anchor, first, end, issue_end);
  return 0;
}
