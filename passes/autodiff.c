/* passes/autodiff.c -- reverse-mode differentiation of the loss.
 *
 * Appends to the module the nodes that compute d(loss)/d(p) for every
 * parameter p the loss depends on, and records each as p->grad (ir/ir.h).
 * The loss's own gradient (the seed, m->seed) is a scalar fill of 1.
 *
 * One table, vjp[op], holds the rule of every differentiable op: given the
 * forward node y and dy = d(loss)/dy it emits nodes computing the
 * contribution to each input's gradient and hands them to `give`.  A
 * forward node's gradient is the sum of the contributions of its consumers;
 * since nodes are visited in reverse topological order, every consumer has
 * contributed before the node itself is visited.
 *
 * Only what the parameters need is built: a node "wants" a gradient when it
 * is a parameter or a differentiable op with an input that wants one; i32
 * values and the results of non-differentiable ops (topk, onehot) never do.
 *
 * Afterwards every appended node is tagged B or W (see IrPhase): B for the
 * nodes that some activation gradient depends on, W for the rest.  New
 * nodes take the layer and source location of the forward node whose rule
 * (or gradient sum) made them. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* A pending contribution to a forward node's gradient.  With axis < 0, g
 * has the node's shape; else g is the gradient of the node's slice
 * [start, start + len) along axis (zero elsewhere), kept apart so that the
 * slices of one tensor sum by concatenation. */
typedef struct Contrib {
  IrNode *g;
  int axis;
  int64_t start;
  int seq;                   /* arrival order: keeps the sum deterministic */
  struct Contrib *next;
} Contrib;

typedef struct {
  IrModule *m;
  int nfwd;                  /* nodes [0, nfwd) are the forward pass */
  unsigned char *want;       /* want[id]: node id of the forward pass wants a gradient */
  Contrib **pending;         /* pending[id]: contributions to forward node id */
  IrNode **adj;              /* adj[id]: d(loss)/d(forward node id), once summed */
  const IrNode *at;          /* forward node being differentiated */
  int nseq;
  int failed;
} Ad;

typedef void (*Vjp)(Ad *ad, IrNode *y, IrNode *dy);

/* ---- building nodes --------------------------------------------------------- */

/* Appends a node like proto (op, inputs, attributes; for shape-directed ops
 * also the shape) after inferring its type.  Returns NULL when an input is
 * NULL or the type does not check (an internal error, reported once). */
static IrNode *emit(Ad *ad, IrNode *proto) {
  for (int i = 0; i < proto->ninputs; i++)
    if (!proto->inputs[i]) return NULL;
  char why[512];
  if (!ir_infer(proto, why, sizeof why)) {
    if (!ad->failed)
      fprintf(stderr, "parc: internal error: autodiff of node %%%d (%s): %s\n", ad->at->id,
              ir_op_info[ad->at->op].name, why);
    ad->failed = 1;
    return NULL;
  }
  IrNode *n = ir_add_like(ad->m, proto);
  n->layer = ad->at->layer;
  n->loc = ad->at->loc;
  n->phase = IR_PHASE_B; /* B or W is decided once the backward graph is whole */
  return n;
}

/* A fixed-arity op on inputs in[0..arity) with integer attributes ia0, ia1
 * and float attribute fa. */
static IrNode *mk(Ad *ad, IrOp op, IrNode *const *in, int64_t ia0, int64_t ia1, double fa) {
  IrNode p = {.op = op, .inputs = (IrNode **)in, .ninputs = ir_op_info[op].arity,
              .ia = {ia0, ia1, 0}, .fa = fa};
  return emit(ad, &p);
}

static IrNode *mk1(Ad *ad, IrOp op, IrNode *x, int64_t ia0, double fa) {
  return mk(ad, op, (IrNode *[]){x}, ia0, 0, fa);
}

static IrNode *mk2(Ad *ad, IrOp op, IrNode *a, IrNode *b, int64_t ia0, double fa) {
  return mk(ad, op, (IrNode *[]){a, b}, ia0, 0, fa);
}

static IrNode *mk3(Ad *ad, IrOp op, IrNode *a, IrNode *b, IrNode *c, int64_t ia0, int64_t ia1,
                   double fa) {
  return mk(ad, op, (IrNode *[]){a, b, c}, ia0, ia1, fa);
}

/* A shape-directed op (reshape, broadcast, sum_to, fill): x (NULL for fill)
 * to the given shape. */
static IrNode *shaped(Ad *ad, IrOp op, IrNode *x, int rank, const int64_t *shape, double fa) {
  IrNode p = {.op = op, .inputs = &x, .ninputs = x ? 1 : 0, .rank = rank, .fa = fa};
  if (rank) memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
  if (op == IR_OP_FILL) p.inputs = NULL;
  return emit(ad, &p);
}

static IrNode *slice(Ad *ad, IrNode *x, int64_t axis, int64_t start, int64_t len) {
  IrNode p = {.op = IR_OP_SLICE, .inputs = &x, .ninputs = 1, .ia = {axis, start, len}};
  return emit(ad, &p);
}

/* g reshaped to like's shape (g itself if it has it already). */
static IrNode *reshape_like(Ad *ad, IrNode *g, const IrNode *like) {
  if (!g || ir_same_shape(g, like)) return g;
  return shaped(ad, IR_OP_RESHAPE, g, like->rank, like->shape, 0);
}

/* g summed down to like's shape: the gradient of a broadcast operand. */
static IrNode *sum_to(Ad *ad, IrNode *g, const IrNode *like) {
  if (!g || ir_same_shape(g, like)) return g;
  return shaped(ad, IR_OP_SUM_TO, g, like->rank, like->shape, 0);
}

/* g broadcast to like's shape (g itself if it has it already). */
static IrNode *broadcast_like(Ad *ad, IrNode *g, const IrNode *like) {
  if (!g || ir_same_shape(g, like)) return g;
  return shaped(ad, IR_OP_BROADCAST, g, like->rank, like->shape, 0);
}

/* ---- contributions ---------------------------------------------------------- */

static int wants(const Ad *ad, const IrNode *x) { return ad->want[x->id]; }

static void give_slice(Ad *ad, IrNode *x, IrNode *g, int axis, int64_t start) {
  if (!g || !wants(ad, x)) return;
  int ok = g->rank == x->rank && g->dtype == IR_F32;
  for (int d = 0; ok && d < x->rank; d++)
    ok = d == axis ? start >= 0 && g->shape[d] <= x->shape[d] - start : g->shape[d] == x->shape[d];
  if (!ok) {
    char a[160], b[160];
    fprintf(stderr, "parc: internal error: autodiff of node %%%d (%s): gradient %s for %s\n",
            ad->at->id, ir_op_info[ad->at->op].name, ir_type_str(g, a, sizeof a),
            ir_type_str(x, b, sizeof b));
    ad->failed = 1;
    return;
  }
  Contrib *c = arena_alloc(&ad->m->arena, sizeof *c);
  *c = (Contrib){g, axis, start, ad->nseq++, ad->pending[x->id]};
  ad->pending[x->id] = c;
}

/* Adds g, shaped like x, to x's gradient (if x wants one). */
static void give(Ad *ad, IrNode *x, IrNode *g) { give_slice(ad, x, g, -1, 0); }

static int by_axis_start(const void *pa, const void *pb) {
  const Contrib *a = *(Contrib *const *)pa, *b = *(Contrib *const *)pb;
  if (a->axis != b->axis) return a->axis < b->axis ? -1 : 1;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static IrNode *add(Ad *ad, IrNode *a, IrNode *b) {
  return a ? mk2(ad, IR_OP_ADD, a, b, 0, 0) : b;
}

/* x's shape with dimension axis set to len, as zeros. */
static IrNode *zeros_along(Ad *ad, const IrNode *x, int axis, int64_t len) {
  int64_t s[IR_MAX_RANK];
  memcpy(s, x->shape, sizeof s);
  s[axis] = len;
  return shaped(ad, IR_OP_FILL, NULL, x->rank, s, 0.0);
}

/* Joins slice gradients c[0..n) of x (one axis, ascending, not overlapping)
 * into one tensor shaped like x, zero-filling the gaps. */
static IrNode *join_slices(Ad *ad, const IrNode *x, Contrib **c, int n) {
  int axis = c[0]->axis;
  int64_t at = 0, full = x->shape[axis];
  IrNode **parts = arena_alloc(&ad->m->arena, sizeof(IrNode *) * (size_t)(2 * n + 1));
  int np = 0;
  for (int i = 0; i < n; i++) {
    if (c[i]->start > at) parts[np++] = zeros_along(ad, x, axis, c[i]->start - at);
    parts[np++] = c[i]->g;
    at = c[i]->start + c[i]->g->shape[axis];
  }
  if (at < full) parts[np++] = zeros_along(ad, x, axis, full - at);
  if (np == 1) return parts[0];
  IrNode p = {.op = IR_OP_CONCAT, .inputs = parts, .ninputs = np, .ia = {axis}};
  return emit(ad, &p);
}

/* The sum of x's pending contributions, in a fixed order: whole-tensor
 * contributions in arrival order, then slice contributions, grouped so that
 * each group's slices share an axis and do not overlap (the three slices of
 * a fused qkv projection become one concat, no adds). */
static IrNode *sum_pending(Ad *ad, IrNode *x) {
  int n = 0;
  for (Contrib *c = ad->pending[x->id]; c; c = c->next) n++;
  Contrib **all = arena_alloc(&ad->m->arena, sizeof *all * (size_t)(n + 1));
  int nw = 0, ns = 0;
  for (Contrib *c = ad->pending[x->id]; c; c = c->next) all[c->axis < 0 ? nw++ : n - 1 - ns++] = c;
  /* whole contributions arrived newest first: sum them oldest first */
  IrNode *sum = NULL;
  for (int i = nw - 1; i >= 0; i--) sum = add(ad, sum, all[i]->g);
  Contrib **sl = all + nw;
  qsort(sl, (size_t)ns, sizeof *sl, by_axis_start);
  unsigned char *used = arena_alloc(&ad->m->arena, (size_t)ns + 1);
  Contrib **group = arena_alloc(&ad->m->arena, sizeof *group * (size_t)(ns + 1));
  for (int i = 0; i < ns; i++) {
    if (used[i]) continue;
    int ng = 0;
    int64_t end = -1;
    for (int j = i; j < ns; j++) {
      if (used[j] || sl[j]->axis != sl[i]->axis || sl[j]->start < end) continue;
      used[j] = 1;
      group[ng++] = sl[j];
      end = sl[j]->start + sl[j]->g->shape[sl[j]->axis];
    }
    sum = add(ad, sum, join_slices(ad, x, group, ng));
  }
  return sum;
}

/* ---- VJP rules, one per differentiable op (ORDER-OPS) ----------------------- */

/* y = a[..., m, k] @ b[..., k, n] (b read as [..., n, k] when transposed).
 * da = dy @ b^T.  db = a^T @ dy, contracted over a's batch dimensions too
 * when a rank-2 b was broadcast (a and dy viewed as [M, k] and [M, n]). */
static void vjp_matmul(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *a = y->inputs[0], *b = y->inputs[1];
  int tb = y->ia[0] != 0;
  if (wants(ad, a)) give(ad, a, mk2(ad, IR_OP_MATMUL, dy, b, !tb, 0));
  if (!wants(ad, b)) return;
  IrNode *a2 = a, *dy2 = dy;
  if (b->rank == 2 && a->rank > 2) {
    int64_t k = a->shape[a->rank - 1], n = y->shape[y->rank - 1], M = ir_numel(a) / k;
    a2 = shaped(ad, IR_OP_RESHAPE, a, 2, (int64_t[]){M, k}, 0);
    dy2 = shaped(ad, IR_OP_RESHAPE, dy, 2, (int64_t[]){M, n}, 0);
  }
  /* db [k, n] = a^T dy;  transposed, db [n, k] = dy^T a */
  give(ad, b, tb ? mk2(ad, IR_OP_MATMUL_TA, dy2, a2, 0, 0)
                 : mk2(ad, IR_OP_MATMUL_TA, a2, dy2, 0, 0));
}

/* Elementwise with broadcasting; each operand's gradient is summed down to
 * its shape.  y = a / b: da = dy / b, db = -(dy / b) * y. */
static void vjp_binary(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *a = y->inputs[0], *b = y->inputs[1];
  switch (y->op) {
  case IR_OP_ADD:
  case IR_OP_SUB:
    give(ad, a, sum_to(ad, dy, a));
    if (wants(ad, b)) {
      IrNode *g = sum_to(ad, dy, b);
      give(ad, b, y->op == IR_OP_SUB ? mk1(ad, IR_OP_SCALE, g, 0, -1.0) : g);
    }
    return;
  case IR_OP_MUL:
    if (wants(ad, a)) give(ad, a, sum_to(ad, mk2(ad, IR_OP_MUL, dy, b, 0, 0), a));
    if (wants(ad, b)) give(ad, b, sum_to(ad, mk2(ad, IR_OP_MUL, dy, a, 0, 0), b));
    return;
  default: {
    IrNode *t = mk2(ad, IR_OP_DIV, dy, b, 0, 0);
    if (wants(ad, a)) give(ad, a, sum_to(ad, t, a));
    if (wants(ad, b))
      give(ad, b, mk1(ad, IR_OP_SCALE, sum_to(ad, mk2(ad, IR_OP_MUL, t, y, 0, 0), b), 0, -1.0));
    return;
  }
  }
}

static void vjp_scale(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk1(ad, IR_OP_SCALE, dy, 0, y->fa));
}

/* gelu, silu, relu: a pointwise *_grad(x, dy) primitive each. */
static void vjp_activation(Ad *ad, IrNode *y, IrNode *dy) {
  IrOp g = y->op == IR_OP_GELU ? IR_OP_GELU_GRAD : y->op == IR_OP_SILU ? IR_OP_SILU_GRAD
                                                                        : IR_OP_RELU_GRAD;
  give(ad, y->inputs[0], mk2(ad, g, y->inputs[0], dy, 0, 0));
}

/* y = exp(x): dx = dy * y. */
static void vjp_exp(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk2(ad, IR_OP_MUL, dy, y, 0, 0));
}

/* y = log(x): dx = dy / x. */
static void vjp_log(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk2(ad, IR_OP_DIV, dy, y->inputs[0], 0, 0));
}

/* layer_norm(x, w, b) and rms_norm(x, w): dx (B work) by one primitive that
 * recomputes the row statistics; dw by a row reduction of dy * xhat; db by
 * summing dy over the rows. */
static void vjp_norm(Ad *ad, IrNode *y, IrNode *dy) {
  int rms = y->op == IR_OP_RMSNORM;
  IrNode *x = y->inputs[0], *w = y->inputs[1];
  if (wants(ad, x))
    give(ad, x, mk3(ad, rms ? IR_OP_RMSNORM_GRAD : IR_OP_LAYERNORM_GRAD, x, w, dy, 0, 0, y->fa));
  if (wants(ad, w))
    give(ad, w, mk2(ad, rms ? IR_OP_RMSNORM_WGRAD : IR_OP_LAYERNORM_WGRAD, x, dy, 0, y->fa));
  if (!rms) give(ad, y->inputs[2], sum_to(ad, dy, y->inputs[2]));
}

static void vjp_softmax(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk2(ad, IR_OP_SOFTMAX_GRAD, y, dy, 0, 0));
}

/* sdpa: one sdpa_grad computes dq, dk, dv packed along dimension 1 (see
 * ir/interp.c); slices take them apart.  It reads y itself, whose buffer
 * holds the forward's out and lse, so no statistics are recomputed
 * (passes/attn_delta.c then lets it read lse and D alone where it can). */
static void vjp_attention(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *q = y->inputs[0], *k = y->inputs[1], *v = y->inputs[2];
  IrNode p = {.op = IR_OP_ATTENTION_GRAD, .inputs = (IrNode *[]){q, k, v, dy, y}, .ninputs = 5,
              .ia = {y->ia[0], 0, 0}, .fa = y->fa};
  IrNode *g = emit(ad, &p);
  int64_t H = q->shape[1], KV = k->shape[1];
  if (wants(ad, q)) give(ad, q, slice(ad, g, 1, 0, H));
  if (wants(ad, k)) give(ad, k, slice(ad, g, 1, H, KV));
  if (wants(ad, v)) give(ad, v, slice(ad, g, 1, H + KV, KV));
}

static void vjp_rope(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk1(ad, IR_OP_ROPE_GRAD, dy, 0, y->fa));
}

/* embedding(ids, table): the table's gradient scatter-adds dy's rows. */
static void vjp_embedding(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *ids = y->inputs[0], *table = y->inputs[1];
  if (y->op == IR_OP_VOCAB_EMBEDDING) /* the member's rows; dy is the whole sum's gradient */
  {
    IrNode p = {.op = IR_OP_VOCAB_EMBEDDING_GRAD, .inputs = (IrNode *[]){ids, dy}, .ninputs = 2,
                .ia = {table->shape[0], y->ia[0], y->ia[1]}};
    give(ad, table, emit(ad, &p));
  }
  else give(ad, table, mk2(ad, IR_OP_EMBEDDING_GRAD, ids, dy, table->shape[0], 0));
}

static void vjp_reshape(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], reshape_like(ad, dy, y->inputs[0]));
}

static void vjp_split_heads(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk1(ad, IR_OP_MERGE_HEADS, dy, 0, 0));
}

static void vjp_merge_heads(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk1(ad, IR_OP_SPLIT_HEADS, dy, y->inputs[0]->shape[1], 0));
}

static void vjp_transpose(Ad *ad, IrNode *y, IrNode *dy) {
  give(ad, y->inputs[0], mk(ad, IR_OP_TRANSPOSE, (IrNode *[]){dy}, y->ia[0], y->ia[1], 0));
}

/* concat: each input gets its slice of dy. */
static void vjp_concat(Ad *ad, IrNode *y, IrNode *dy) {
  int64_t axis = y->ia[0], at = 0;
  for (int i = 0; i < y->ninputs; i++) {
    IrNode *x = y->inputs[i];
    int64_t len = x->shape[axis];
    if (wants(ad, x)) give(ad, x, slice(ad, dy, axis, at, len));
    at += len;
  }
}

/* slice: dy is the gradient of one slice of x; sum_pending places it. */
static void vjp_slice(Ad *ad, IrNode *y, IrNode *dy) {
  give_slice(ad, y->inputs[0], dy, (int)y->ia[0], y->ia[1]);
}

/* sum and mean over an axis: dy (scaled by 1/n for mean) broadcast back. */
static void vjp_reduce(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *x = y->inputs[0];
  int axis = (int)y->ia[0];
  int64_t kept[IR_MAX_RANK];
  memcpy(kept, x->shape, sizeof kept);
  kept[axis] = 1;
  IrNode *g = dy;
  if (y->op == IR_OP_MEAN) g = mk1(ad, IR_OP_SCALE, g, 0, 1.0 / (double)x->shape[axis]);
  if (!y->ia[1]) g = shaped(ad, IR_OP_RESHAPE, g, x->rank, kept, 0); /* dy with axis kept */
  give(ad, x, broadcast_like(ad, g, x));
}

static void vjp_cross_entropy(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *logits = y->inputs[0], *targets = y->inputs[1];
  if (y->op == IR_OP_VOCAB_CROSS_ENTROPY) { /* the member's columns, all local after the op */
    IrNode p = {.op = IR_OP_VOCAB_CROSS_ENTROPY_GRAD, .inputs = (IrNode *[]){logits, targets, dy},
                .ninputs = 3, .ia = {y->ia[0], y->ia[1], y->ia[2]}};
    give(ad, logits, emit(ad, &p));
  } else give(ad, logits, mk3(ad, IR_OP_CROSS_ENTROPY_GRAD, logits, targets, dy, 0, 0, 0));
}

/* gather along the last axis: scatter dy back into zeros. */
static void vjp_gather(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *x = y->inputs[0];
  give(ad, x, mk2(ad, IR_OP_SCATTER_ADD, y->inputs[1], dy, x->shape[x->rank - 1], 0));
}

/* dispatch copies token rows into expert slots; its adjoint gathers them
 * back, which is combine with every weight 1. */
static void vjp_dispatch(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *x = y->inputs[0], *idx = y->inputs[1];
  IrNode *ones = shaped(ad, IR_OP_FILL, NULL, idx->rank, idx->shape, 1.0);
  give(ad, x, mk3(ad, IR_OP_COMBINE, dy, idx, ones, 0, 0, 0));
}

static void vjp_combine(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *e = y->inputs[0], *idx = y->inputs[1], *w = y->inputs[2];
  if (wants(ad, e))
    give(ad, e, mk3(ad, IR_OP_COMBINE_GRAD_Y, dy, idx, w, e->shape[0], e->shape[1], 0));
  if (wants(ad, w)) give(ad, w, mk3(ad, IR_OP_COMBINE_GRAD_W, dy, e, idx, 0, 0, 0));
}

/* expert_all_to_all moves rows between ranks (a permutation, with the
 * unfilled slots zero both ways): its adjoint is the other direction with
 * the same choices. */
static void vjp_expert_all_to_all(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode p = {.op = IR_OP_EXPERT_ALL_TO_ALL, .inputs = (IrNode *[]){dy, y->inputs[1]},
              .ninputs = 2, .ia = {y->ia[0], y->ia[1], !y->ia[2]}};
  give(ad, y->inputs[0], emit(ad, &p));
}

/* broadcast and sum_to are each other's adjoints. */
static void vjp_broadcast(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *x = y->inputs[0];
  give(ad, x, y->op == IR_OP_BROADCAST ? sum_to(ad, dy, x) : broadcast_like(ad, dy, x));
}

/* Collectives (ir/ops.def), in Megatron's convention: a replicated value's
 * gradient is whole on every rank, a partial-sum value's gradient is that of
 * the sum.  all_reduce (partial -> replicated, Megatron's "g"): each
 * member's partial contributes dy itself, so the gradient passes through
 * unchanged.  group_copy (identity into a sharded region, Megatron's "f"):
 * the region leaves each member a partial gradient, summed by an
 * all_reduce.  all_gather <-> reduce_scatter, along the same dim.  Outside
 * a sharded region (the consumers' gradients whole on every member):
 * local_slice -> all_gather (the members' pieces make the whole gradient),
 * replicate -> local_slice (the member's piece of the whole gradient). */
static void vjp_collective(Ad *ad, IrNode *y, IrNode *dy) {
  IrNode *x = y->inputs[0];
  switch (y->op) {
  case IR_OP_ALL_REDUCE:
    /* over dp (a global-batch statistic, made before autodiff): every
     * member's objective reads the sum, so its gradient is the sum of the
     * members' (dp gradients are averaged afterwards) */
    if (y->ia[0] == 1) give(ad, x, mk(ad, IR_OP_ALL_REDUCE, (IrNode *[]){dy}, 1, y->ia[1], 0));
    else give(ad, x, dy);
    break;
  case IR_OP_GROUP_COPY:
    give(ad, x, mk(ad, IR_OP_ALL_REDUCE, (IrNode *[]){dy}, y->ia[0], y->ia[1], 0));
    break;
  default: {
    IrOp adj = y->op == IR_OP_ALL_GATHER      ? IR_OP_REDUCE_SCATTER
               : y->op == IR_OP_REPLICATE     ? IR_OP_LOCAL_SLICE
                                              : IR_OP_ALL_GATHER; /* reduce_scatter, local_slice */
    IrNode p = {.op = adj, .inputs = &dy, .ninputs = 1, .ia = {y->ia[0], y->ia[1], y->ia[2]}};
    give(ad, x, emit(ad, &p));
  }
  }
}

static const Vjp vjp[IR_OP_COUNT] = {
    [IR_OP_MATMUL] = vjp_matmul,
    [IR_OP_ADD] = vjp_binary,         [IR_OP_SUB] = vjp_binary,
    [IR_OP_MUL] = vjp_binary,         [IR_OP_DIV] = vjp_binary,
    [IR_OP_SCALE] = vjp_scale,
    [IR_OP_GELU] = vjp_activation,    [IR_OP_SILU] = vjp_activation,
    [IR_OP_RELU] = vjp_activation,    [IR_OP_EXP] = vjp_exp,
    [IR_OP_LOG] = vjp_log,
    [IR_OP_LAYERNORM] = vjp_norm,     [IR_OP_RMSNORM] = vjp_norm,
    [IR_OP_SOFTMAX] = vjp_softmax,
    [IR_OP_ATTENTION] = vjp_attention,
    [IR_OP_ROPE] = vjp_rope,
    [IR_OP_EMBEDDING] = vjp_embedding, [IR_OP_VOCAB_EMBEDDING] = vjp_embedding,
    [IR_OP_RESHAPE] = vjp_reshape,
    [IR_OP_SPLIT_HEADS] = vjp_split_heads,
    [IR_OP_MERGE_HEADS] = vjp_merge_heads,
    [IR_OP_TRANSPOSE] = vjp_transpose,
    [IR_OP_CONCAT] = vjp_concat,
    [IR_OP_SLICE] = vjp_slice,
    [IR_OP_SUM] = vjp_reduce,         [IR_OP_MEAN] = vjp_reduce,
    [IR_OP_CROSS_ENTROPY] = vjp_cross_entropy,
    [IR_OP_VOCAB_CROSS_ENTROPY] = vjp_cross_entropy,
    [IR_OP_GATHER] = vjp_gather,
    [IR_OP_DISPATCH] = vjp_dispatch,
    [IR_OP_COMBINE] = vjp_combine,
    [IR_OP_EXPERT_ALL_TO_ALL] = vjp_expert_all_to_all,
    [IR_OP_BROADCAST] = vjp_broadcast, [IR_OP_SUM_TO] = vjp_broadcast,
    [IR_OP_ALL_REDUCE] = vjp_collective, [IR_OP_GROUP_COPY] = vjp_collective,
    [IR_OP_ALL_GATHER] = vjp_collective, [IR_OP_REDUCE_SCATTER] = vjp_collective,
    [IR_OP_LOCAL_SLICE] = vjp_collective, [IR_OP_REPLICATE] = vjp_collective,
};

/* ---- the pass --------------------------------------------------------------- */

/* want[] over the forward nodes; fails on a backward-only op that would
 * have to pass a gradient on (it has no rule). */
static int fill_want(Ad *ad, const unsigned char *live) {
  for (int i = 0; i < ad->nfwd; i++) {
    IrNode *n = ad->m->nodes[i];
    int any = 0;
    for (int j = 0; j < n->ninputs; j++)
      any |= n->inputs[j]->dtype == IR_F32 && ad->want[n->inputs[j]->id];
    int flags = ir_op_info[n->op].flags;
    if (any && live[i] && (flags & IR_F_BACKWARD)) {
      fprintf(stderr, "parc: error: autodiff: node %%%d (%s) has no gradient rule\n", n->id,
              ir_op_info[n->op].name);
      return -1;
    }
    ad->want[i] = n->op == IR_OP_PARAM || (any && (flags & IR_F_DIFF));
  }
  return 0;
}

/* Tags the appended nodes: B if an activation gradient (the gradient of a
 * forward value that depends on an INPUT) depends on it, else W. */
static void fill_phases(Ad *ad) {
  IrModule *m = ad->m;
  unsigned char *data = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  unsigned char *b = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  for (int i = 0; i < ad->nfwd; i++) {
    IrNode *n = m->nodes[i];
    data[i] = n->op == IR_OP_INPUT;
    for (int j = 0; j < n->ninputs; j++) data[i] |= data[n->inputs[j]->id];
    if (data[i] && ad->adj[i] && ad->adj[i]->id >= ad->nfwd) b[ad->adj[i]->id] = 1;
  }
  for (int i = m->nnodes - 1; i >= ad->nfwd; i--) {
    IrNode *n = m->nodes[i];
    n->phase = b[i] ? IR_PHASE_B : IR_PHASE_W;
    if (!b[i]) continue;
    for (int j = 0; j < n->ninputs; j++) b[n->inputs[j]->id] = 1;
  }
}

int pass_autodiff(IrModule *m) {
  for (int op = 0; op < IR_OP_COUNT; op++)
    if (!!(ir_op_info[op].flags & IR_F_DIFF) != !!vjp[op]) {
      fprintf(stderr, "parc: internal error: autodiff: op %s is %sdifferentiable but has %s rule\n",
              ir_op_info[op].name, vjp[op] ? "not " : "", vjp[op] ? "a" : "no");
      return -1;
    }
  if (!m->loss) return 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->phase != IR_PHASE_FWD || m->nodes[i]->grad) {
      fprintf(stderr, "parc: internal error: autodiff: the module is already differentiated\n");
      return -1;
    }
  Ad ad = {.m = m, .nfwd = m->nnodes, .at = m->loss};
  size_t n = (size_t)m->nnodes + 1;
  ad.want = arena_alloc(&m->arena, n);
  ad.pending = arena_alloc(&m->arena, n * sizeof *ad.pending);
  ad.adj = arena_alloc(&m->arena, n * sizeof *ad.adj);
  unsigned char *live = arena_alloc(&m->arena, n);
  live[m->loss->id] = 1;
  for (int i = m->loss->id; i >= 0; i--)
    for (int j = 0; live[i] && j < m->nodes[i]->ninputs; j++) live[m->nodes[i]->inputs[j]->id] = 1;
  if (fill_want(&ad, live)) return -1;
  if (!ad.want[m->loss->id]) return 0; /* no parameter reaches the loss */

  m->seed = shaped(&ad, IR_OP_FILL, NULL, 0, NULL, 1.0);
  give(&ad, m->loss, m->seed);
  for (int i = ad.nfwd - 1; i >= 0 && !ad.failed; i--) {
    IrNode *y = m->nodes[i];
    if (!ad.pending[i]) continue;
    ad.at = y;
    IrNode *dy = ad.adj[i] = sum_pending(&ad, y);
    if (!dy) continue;
    if (y->op == IR_OP_PARAM) y->grad = dy;
    else vjp[y->op](&ad, y, dy);
  }
  if (ad.failed) return -1;
  fill_phases(&ad);
  return 0;
}
