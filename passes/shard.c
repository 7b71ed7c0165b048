/* passes/shard.c -- tensor-, sequence- and data-parallel partitioning of
 * the forward module (Megatron: column- then row-parallel, optionally with
 * sequence parallelism), before autodiff.
 *
 * pass_shard rewrites the module in place into the rank-local module that
 * every rank of a tp x dp mesh runs: the same nodes on every rank, local
 * shapes, collectives (ir/ops.def) where a consumer needs another layout
 * than its producer gives.  A rank's coordinates are never baked in: the
 * runtime gives each rank its parameter slices and its data slice.
 *
 * Layouts.  Each value has one layout on the tp axis:
 *   R        replicated: the whole tensor on every rank;
 *   S(d, B)  sharded on dimension d, which is B equal blocks each split
 *            over the tp ranks (B = 1: plain contiguous split); the local
 *            tensor is the rank's piece of every block, in block order;
 *            a padded vocabulary (below) is S(d, 1) with its true size;
 *   P        partial sum: the tensor is the sum of the ranks' local ones.
 * On the dp axis every value derived from an INPUT has its leading (batch)
 * dimension split (local batch = batch / dp; the INPUT records shard_dim 0,
 * shard_degree dp and its global shape); parameters are replicated.
 *
 * Propagation: one rule per op in `rule` below.  Where a P value meets a
 * consumer that needs R, an all_reduce(tp) is inserted (one per producer,
 * shared by its consumers): that is Megatron's "g", and with column then
 * row weights it comes out once per attention and once per MLP.  Where an R
 * float value enters an op whose result is S (a column-parallel matmul's
 * input, a bias broadcast over a sharded dimension), each rank's gradient of
 * that input is only partial; a group_copy(tp) is inserted (one per
 * producer), Megatron's "f", whose VJP all-reduces the gradient.  The
 * intents come from parameters (pass_intent): column/row weights are S on
 * their resolved shard_dim, expert(d) weights S(d); everything else is R.
 *
 * Other conversions (each once per producer): an S value (one block, no
 * padding) needed whole is replicated (an all_gather whose VJP takes the
 * rank's piece of the whole gradient); an R value broadcast against an S
 * one along the sharded dimension is cut to the rank's piece by local_slice
 * (no communication; its VJP all-gathers the gradient); a mean over a
 * sharded dimension replicates its operand first.
 *
 * Sequence parallelism (Megatron, --sp, tp > 1).  [batch, seq, width]
 * activations outside the column/row regions live on sequence shards,
 * S(1): where a P value of that kind meets a pointwise op or a norm, it is
 * reduce_scattered onto S(1) instead of all-reduced (a sum of P values
 * there is reduced too, so the residual stream is S(1), never P); norms
 * and pointwise work run on the shards, their replicated weights entering
 * through group_copy (gradients summed over the shards); a column-parallel
 * matmul's S(1) input is all_gathered on dimension 1 (standing where
 * group_copy would: its VJP reduce_scatters).  The same count of
 * collectives as all-reduce TP, each moving half the bytes of an
 * all-reduce.  GPT-2's learned positions [seq, d] reach the shards through
 * local_slice.  The sequence must split evenly: seq % tp == 0, else a
 * one-line error.  With tp == 1, --sp changes nothing.
 *
 * GPT-2's fused q|k|v.  A column weight whose output is cut by slices along
 * its sharded (last) dimension is sharded blockwise: B is the number of
 * blocks of width g = gcd(width, every slice start and length downstream)
 * (3 for c_attn's q|k|v), so each rank holds its heads' q, k and v and the
 * slices stay local (a slice of whole blocks is S with fewer blocks).  The
 * global layout of the weight stays Hugging Face's [d, 3d].
 *
 * Vocabulary parallelism (Megatron).  A `vocab` table [V, D] is split by
 * rows over tp, padded to Vp = ir_padded_vocab(V, tp, m->pad_vocab) rows,
 * the smallest multiple of pad_vocab * tp >= V (pad_vocab 0 or 1: of tp),
 * so every rank's Vp / tp rows are a multiple of pad_vocab (GEMM-friendly
 * logits): rank c holds rows [c Vp/tp, (c + 1) Vp/tp), and the rows >= V
 * are padding, exactly 0 (the runtime initialises them so and never reads
 * or writes them in files; the PARAM keeps global_shape [V, D], its local
 * shape says Vp / tp).  At tp 1 the table is padded the same way when Vp >
 * V (shard_degree 1, S(0) with padding): the lookup stays a plain
 * embedding (R; the padded rows are never looked up) and no collective is
 * inserted (a tp-1 group_copy or all_reduce would be a no-op), but the head
 * and the loss are the padded ones below.  With tp > 1:
 * Embedding becomes vocab_embedding (the rank's rows, zero elsewhere: P,
 * reduced by its consumers), a head matmul with the table (tied) or a
 * vocab lm_head is column-parallel (logits S on the last dimension, padded
 * columns included), and cross_entropy of such logits becomes
 * vocab_cross_entropy with the true V, whose max / sum-of-exp / target
 * logit reductions happen inside the op with the padded columns masked
 * (zero gradient there): no rank holds [.., V] logits.  Padded rows then
 * get zero gradients, so AdamW keeps them 0.  Slices and reductions over a
 * padded dimension are refused.
 *
 * Statistics of the global batch under dp: a sum or mean over the
 * dp-split batch dimension is the rank's share (dpk), made whole where it
 * is read by an all_reduce over dp (and 1/dp for a mean): the MoE
 * load-balancing loss's routed fractions and mean router probabilities are
 * those of the whole batch on every rank.  That all_reduce's VJP is an
 * all_reduce over dp (ir/ops.def).  A reshape of a dp-split value splits
 * dimension 0 again when dp divides it (row-major order is kept).
 * Mixture of experts, experts over tp and expert parallelism: see
 * rule_dispatch.
 *
 * Not yet (rejected with a one-line error, never silently replicated):
 * gathering a value sharded in blocks or with padding, reshapes of sharded
 * values (they are replicated first), sequence parallelism with seq % tp
 * != 0, anything but matmuls, pointwise ops and combine on expert-parallel
 * values. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

typedef enum { L_REP, L_SHARD, L_PARTIAL } LKind;

typedef struct {
  LKind kind;
  int dim;     /* L_SHARD: the dimension */
  int blocks;  /* L_SHARD: blocks of dim, each split over tp */
  int64_t vocab; /* L_SHARD of a padded vocabulary: the true global size of
                    dim (0: local size * tp exactly, no padding) */
} Lay;

typedef struct {
  IrModule *m;
  int tp, dp;
  int sp;              /* sequence parallelism (tp > 1 only) */
  int cap;             /* entries of the per-node arrays (new ids) */
  Lay *lay;            /* lay[id] */
  unsigned char *bat;  /* bat[id]: dimension 0 is the dp-split batch */
  IrNode **ar, **cp;   /* ar[id] / cp[id]: the all_reduce / group_copy of node id */
  IrNode **rs, **ag;   /* rs[id]: node id reduce_scattered onto sequence shards;
                          ag[id]: its all_gather into a sharded region */
  IrNode **rp, **ls;   /* rp[id]: node id replicated (sharded -> replicated);
                          ls[id]: its local_slice (replicated -> sharded) */
  int ep;              /* expert parallelism (m->mesh_ep; divides dp) */
  unsigned char *dpk;  /* dpk[id]: node id is a rank's share of a reduction over
                          the dp-split batch: 1 a sum, 2 a mean; consumers read
                          it through dp_whole (all_reduce over dp) */
  unsigned char *exr;  /* exr[id]: dimension 0 of node id is the rank's experts
                          (experts / ep of them), under ep > 1 */
  unsigned char *ent;  /* ent[id]: node id is replicated and its gradient is
                          already summed over tp upstream (a dispatch of
                          group_copy'd tokens, and its slots on the experts'
                          ranks): enter() adds nothing */
  int split_experts;   /* set for the dispatch being rewritten: every reader
                          of its slots is a matmul with a tp-split expert
                          weight (find_split_experts) */
  IrNode **dw;         /* dw[id]: the dp-whole value of a dpk node */
  IrNode **drop;       /* drop[id]: capacity_drop of the choices node id */
  IrNode **a2a;        /* a2a[id]: a dispatch's slots sent to the experts' ranks */
  int no_batch;        /* set by a rule: the result has no dp-split batch */
  IrNode *at;          /* node being rewritten */
  char *err;
  size_t len;
  int failed;
} Sh;

static int fail(Sh *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(Sh *s, const char *fmt, ...) {
  if (s->failed) return -1;
  s->failed = 1;
  const IrNode *n = s->at;
  size_t k = 0;
  if (n) {
    k = (size_t)snprintf(s->err, s->len, "shard: %s", ir_op_info[n->op].name);
    if (k < s->len && n->name) k += (size_t)snprintf(s->err + k, s->len - k, " %s", n->name);
    if (k < s->len && n->loc.line)
      k += (size_t)snprintf(s->err + k, s->len - k, " (%s:%d:%d)", n->loc.file ? n->loc.file : "?",
                            n->loc.line, n->loc.col);
    if (k < s->len) k += (size_t)snprintf(s->err + k, s->len - k, ": ");
  }
  if (k < s->len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err + k, s->len - k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a < 0 ? -a : a;
}

/* At tp 1 a padded vocabulary comes from --pad-vocab alone: say how to drop it.
 * Marks the module: the failure is the padding's (IrModule.pad_refused). */
static const char *pad_hint(Sh *s) {
  s->m->pad_refused = 1; /* called exactly where padding is the reason */
  return s->tp == 1 ? PASS_SHARD_PAD_HINT : "";
}

static Lay R(void) { return (Lay){L_REP, -1, 1, 0}; }
static Lay S(int d, int b) { return (Lay){L_SHARD, d, b, 0}; }
static Lay P(void) { return (Lay){L_PARTIAL, -1, 1, 0}; }

static Lay *L(Sh *s, const IrNode *x) { return &s->lay[x->id]; }

/* Appends n (an existing node or a new one) at the end of the new order. */
static void place(Sh *s, IrNode *n) {
  IrModule *m = s->m;
  arena_grow(&m->arena, (void **)&m->nodes, &m->capnodes, m->nnodes + 1, sizeof(IrNode *));
  n->id = m->nnodes;
  m->nodes[m->nnodes++] = n;
}

/* A new node op(in) with attributes ia (shape from ir_infer), laid out as
 * its first input, placed before the node being rewritten. */
static IrNode *node_after(Sh *s, IrOp op, IrNode **in, int nin, int64_t ia0, int64_t ia1,
                          int64_t ia2, double fa) {
  IrNode *x = in[0];
  IrNode *n = ir_add(s->m, op, in, nin);
  n->ia[0] = ia0, n->ia[1] = ia1, n->ia[2] = ia2, n->fa = fa;
  n->layer = x->layer >= 0 ? x->layer : s->at->layer;
  n->loc = x->loc.line ? x->loc : s->at->loc;
  char why[256];
  if (!ir_infer(n, why, sizeof why)) {
    fail(s, "internal error: %s", why);
    return x;
  }
  if (n->id >= s->cap - 1) {
    fail(s, "internal error: too many inserted nodes");
    return x;
  }
  s->lay[n->id] = *L(s, x);
  s->bat[n->id] = s->bat[x->id];
  s->exr[n->id] = s->exr[x->id];
  s->ent[n->id] = s->ent[x->id];
  return n;
}

/* A new collective on x over tp (dim: all_gather, reduce_scatter,
 * local_slice, replicate), typed, laid out as lay, placed before the node
 * being rewritten. */
static IrNode *collective(Sh *s, IrOp op, IrNode *x, int dim, Lay lay) {
  IrNode *n = node_after(s, op, &x, 1, 0, s->tp, dim, 0.0);
  if (n != x) {
    s->lay[n->id] = lay;
    s->exr[n->id] = 0; /* a tp collective's result is not split by experts */
    s->ent[n->id] = 0;
  }
  return n;
}

/* x as a replicated value (once per producer): a partial sum all-reduced, a
 * sharded value (one block, no padding) replicated, an all_gather whose
 * consumers' gradients are whole. */
static IrNode *need_rep(Sh *s, IrNode *x) {
  Lay *l = L(s, x);
  if (l->kind == L_REP) return x;
  if (l->kind == L_SHARD) {
    if (l->blocks != 1 || l->vocab) {
      fail(s, "operand %%%d is sharded on dimension %d %s but needed whole: only a plain "
              "split can be gathered%s",
           x->id, l->dim, l->vocab ? "with vocabulary padding" : "in blocks",
           l->vocab ? pad_hint(s) : "");
      return x;
    }
    if (!s->rp[x->id]) s->rp[x->id] = collective(s, IR_OP_REPLICATE, x, l->dim, R());
    return s->rp[x->id];
  }
  if (!s->ar[x->id]) s->ar[x->id] = collective(s, IR_OP_ALL_REDUCE, x, 0, R());
  return s->ar[x->id];
}


/* x (a rank's share of a reduction over the dp-split batch) made whole:
 * all_reduce over dp, then 1/dp for a mean of equal shares (every rank
 * holds batch / dp rows).  Once per producer. */
static IrNode *dp_whole(Sh *s, IrNode *x) {
  if (!s->dpk[x->id]) return x;
  if (!s->dw[x->id]) {
    IrNode *r = node_after(s, IR_OP_ALL_REDUCE, &x, 1, 1, s->dp, 0, 0);
    s->bat[r->id] = 0;
    if (s->dpk[x->id] == 2) r = node_after(s, IR_OP_SCALE, &r, 1, 0, 0, 0, 1.0 / s->dp);
    s->dw[x->id] = r;
  }
  return s->dw[x->id];
}

/* Sequence parallelism applies to x: a [batch, seq, width] activation under
 * --sp with tp > 1.  Its sequence must split evenly over tp. */
static int seq_value(Sh *s, const IrNode *x) {
  if (!s->sp || s->tp == 1 || x->rank != 3 || x->dtype != IR_F32) return 0;
  if (x->shape[1] % s->tp) {
    fail(s, "--sp: the sequence dimension (%lld) is not divisible by tp = %d",
         (long long)x->shape[1], s->tp);
    return 0;
  }
  return 1;
}

/* x (a partial sum) reduce_scattered onto its sequence shards, S(1), once
 * per producer: sequence parallelism's reduction in place of all_reduce. */
static IrNode *seq_scatter(Sh *s, IrNode *x) {
  if (!s->rs[x->id]) s->rs[x->id] = collective(s, IR_OP_REDUCE_SCATTER, x, 1, S(1, 1));
  return s->rs[x->id];
}

/* x with a partial sum reduced: onto sequence shards where sequence
 * parallelism applies and the consumer allows (seq_ok), else whole. */
static IrNode *reduce_for(Sh *s, IrNode *x, int seq_ok) {
  if (L(s, x)->kind != L_PARTIAL) return x;
  return seq_ok && seq_value(s, x) ? seq_scatter(s, x) : need_rep(s, x);
}

/* x with a partial sum reduced; replicated and sharded values as they are. */
static IrNode *unpartial(Sh *s, IrNode *x) {
  return L(s, x)->kind == L_PARTIAL ? need_rep(s, x) : x;
}

/* x (replicated) entering an op whose result is sharded: Megatron's f. */
static IrNode *enter(Sh *s, IrNode *x) {
  if (x->dtype != IR_F32 || s->tp == 1 || L(s, x)->kind != L_REP || s->ent[x->id]) return x;
  if (!s->cp[x->id]) s->cp[x->id] = collective(s, IR_OP_GROUP_COPY, x, 0, R());
  return s->cp[x->id];
}

/* x (sharded, one block) entering an op whose result is sharded on another
 * dimension (a column-parallel matmul's input on sequence shards): all_gather,
 * which stands where group_copy would (its VJP reduce_scatters the
 * region's partial gradients).  Once per producer. */
static IrNode *enter_gathered(Sh *s, IrNode *x) {
  Lay l = *L(s, x);
  if (l.blocks != 1 || l.vocab) {
    fail(s, "operand %%%d sharded on dimension %d %s cannot be gathered", x->id, l.dim,
         l.vocab ? "with vocabulary padding" : "in blocks");
    return x;
  }
  if (!s->ag[x->id]) s->ag[x->id] = collective(s, IR_OP_ALL_GATHER, x, l.dim, R());
  return s->ag[x->id];
}

/* x (replicated) as the rank's piece along its dimension xd, which a
 * sharded operand splits: local_slice, no communication (once per producer
 * and dimension). */
static IrNode *local_piece(Sh *s, IrNode *x, int xd) {
  if (x->shape[xd] % s->tp) {
    fail(s, "replicated operand %%%d has dimension %d of %lld, not divisible by tp = %d", x->id,
         xd, (long long)x->shape[xd], s->tp);
    return x;
  }
  if (!s->ls[x->id] || s->ls[x->id]->ia[2] != xd)
    s->ls[x->id] = collective(s, IR_OP_LOCAL_SLICE, x, xd, S(xd, 1));
  return s->ls[x->id];
}

/* The output dimension of input x's dimension d under right-aligned
 * broadcasting to rank r. */
static int aligned(const IrNode *x, int d, int r) { return d + r - x->rank; }

/* ---- the blocked column layout (GPT-2's q|k|v) ----------------------------- */

/* gw[id]: gcd of the slice boundaries along the last dimension that node id
 * feeds (0: none), carried back from slices through pointwise ops to the
 * column weight of a matmul.  Returns, per PARAM, the block count. */
static void find_blocks(IrModule *m, int64_t *gw) {
  for (int i = m->nnodes - 1; i >= 0; i--) {
    IrNode *n = m->nodes[i];
    int64_t g = gw[n->id];
    switch (n->op) {
    case IR_OP_SLICE: {
      IrNode *x = n->inputs[0];
      if (n->ia[0] == x->rank - 1)
        gw[x->id] = gcd64(gw[x->id], gcd64(n->ia[1], n->ia[2]));
      break;
    }
    case IR_OP_ADD: case IR_OP_SUB: case IR_OP_MUL: case IR_OP_DIV:
    case IR_OP_SCALE: case IR_OP_GELU: case IR_OP_SILU: case IR_OP_RELU: case IR_OP_EXP:
    case IR_OP_LOG:
      if (!g) break;
      for (int j = 0; j < n->ninputs; j++) {
        IrNode *x = n->inputs[j];
        if (x->rank >= 1 && x->shape[x->rank - 1] == n->shape[n->rank - 1])
          gw[x->id] = gcd64(gw[x->id], g);
      }
      break;
    case IR_OP_MATMUL: {
      IrNode *w = n->inputs[1];
      if (g) gw[w->id] = gcd64(gw[w->id], g);
      break;
    }
    default: break;
    }
  }
}

/* split[id] (old ids): dispatch id feeds only matmuls that read its slots
 * with an expert weight split over tp (expert(d), tp > 1): its tokens
 * enter the tp region before it (rule_dispatch). */
static void find_split_experts(IrModule *m, int tp, unsigned char *split) {
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *n = m->nodes[i];
    for (int j = 0; j < n->ninputs; j++) {
      IrNode *x = n->inputs[j];
      if (x->op != IR_OP_DISPATCH) continue;
      IrNode *w = n->ninputs > 1 ? n->inputs[1] : NULL;
      int ok = tp > 1 && n->op == IR_OP_MATMUL && j == 0 && w->op == IR_OP_PARAM &&
               w->shard == IR_SHARD_EXPERT && w->shard_dim >= 1 && w->shard_dim < w->rank;
      split[x->id] = split[x->id] == 2 || !ok ? 2 : 1; /* 1: all readers so far split */
    }
  }
}

/* ---- rules ------------------------------------------------------------------- */

/* Sets a PARAM's local shape and global record. */
static int shard_param(Sh *s, IrNode *p, int64_t gwid) {
  /* vocab-parallel: padded to Vp = ir_padded_vocab(V, tp, pad_vocab) rows,
   * rows [c Vp/tp, (c + 1) Vp/tp) on tp coordinate c; the rows >= V are
   * padding (global_shape keeps V: see ir/ir.h); at tp 1 only when Vp > V */
  int64_t Vp = p->rank == 2 ? ir_padded_vocab(p->shape[0], s->tp, s->m->pad_vocab) : 0;
  if (p->shard == IR_SHARD_VOCAB && p->rank == 2 && (s->tp > 1 || Vp != p->shape[0])) {
    int64_t V = p->shape[0];
    memcpy(p->global_shape, p->shape, sizeof p->shape);
    p->shard_dim = 0;
    p->shape[0] = Vp / s->tp;
    p->shard_degree = s->tp;
    p->shard_blocks = 1;
    *L(s, p) = S(0, 1);
    if (Vp != V) L(s, p)->vocab = V;
    return 0;
  }
  /* expert weights: dimension 0 (experts) split over the ep group, rank
   * e holding experts [e E/ep, (e + 1) E/ep) (ep_degree); with expert(d),
   * dimension d of each expert split over tp like a column or row weight
   * (S(d)), else each expert whole on every tp rank (R) */
  if (p->shard == IR_SHARD_EXPERT) {
    int d = s->tp > 1 && p->shard_dim >= 1 && p->shard_dim < p->rank ? p->shard_dim : -1;
    if (s->ep <= 1 && d < 0) {
      *L(s, p) = R();
      return 0;
    }
    if (s->ep > 1 && (p->rank < 1 || p->shape[0] % s->ep))
      return fail(s, "%lld experts are not divisible by ep = %d",
                  (long long)(p->rank ? p->shape[0] : 0), s->ep);
    if (d >= 0 && p->shape[d] % s->tp)
      return fail(s, "dimension %d of each expert (%lld) is not divisible by tp = %d", d,
                  (long long)p->shape[d], s->tp);
    memcpy(p->global_shape, p->shape, sizeof p->shape);
    if (s->ep > 1) {
      p->shape[0] /= s->ep;
      p->ep_degree = s->ep;
      s->exr[p->id] = 1;
    }
    *L(s, p) = R();
    if (d >= 0) {
      p->shape[d] /= s->tp;
      p->shard_degree = s->tp;
      p->shard_blocks = 1;
      *L(s, p) = S(d, 1);
    }
    return 0;
  }
  if (s->tp == 1 || p->shard_dim < 0 ||
      (p->shard != IR_SHARD_COLUMN && p->shard != IR_SHARD_ROW)) {
    *L(s, p) = R();
    return 0;
  }
  int d = p->shard_dim;
  int64_t w = p->shape[d];
  int blocks = 1;
  if (gwid > 0 && d == p->rank - 1 && w % gwid == 0) blocks = (int)(w / gwid);
  if (w % ((int64_t)blocks * s->tp))
    return fail(s, "dimension %d (%lld%s) is not divisible by tp = %d", d, (long long)w,
                blocks > 1 ? ", in blocks" : "", s->tp);
  memcpy(p->global_shape, p->shape, sizeof p->shape);
  p->shape[d] = w / s->tp;
  p->shard_degree = s->tp;
  p->shard_blocks = blocks;
  *L(s, p) = S(d, blocks);
  return 0;
}

/* Pointwise with broadcasting (also unary ops: one input). */
static int rule_pointwise(Sh *s, IrNode *n) {
  int linear_add = n->op == IR_OP_ADD || n->op == IR_OP_SUB;
  int linear_one = n->op == IR_OP_SCALE;
  int np = 0, nsh = 0, seq = n->rank == 3; /* partial sums may go to sequence shards */
  for (int j = 0; j < n->ninputs; j++) {
    Lay *l = L(s, n->inputs[j]);
    np += l->kind == L_PARTIAL;
    nsh += l->kind == L_SHARD;
    if (l->kind == L_SHARD && aligned(n->inputs[j], l->dim, n->rank) != 1) seq = 0;
    if (l->kind == L_PARTIAL && n->inputs[j]->rank != 3) seq = 0;
  }
  /* a sum of partial sums stays partial, except on the residual stream
   * under sequence parallelism, which lives on sequence shards */
  if (np && !nsh && ((linear_add && np == n->ninputs) || linear_one) &&
      !(seq && s->sp && s->tp > 1)) {
    *L(s, n) = P();
    return 0;
  }
  for (int j = 0; j < n->ninputs; j++) n->inputs[j] = reduce_for(s, n->inputs[j], seq);
  Lay sh = R();
  const IrNode *shx = NULL; /* a sharded operand */
  nsh = 0;
  for (int j = 0; j < n->ninputs; j++) {
    Lay *l = L(s, n->inputs[j]);
    if (l->kind != L_SHARD) continue;
    Lay t = *l;
    t.dim = aligned(n->inputs[j], l->dim, n->rank);
    if (nsh && (t.dim != sh.dim || t.blocks != sh.blocks || t.vocab != sh.vocab))
      return fail(s, "operands sharded on different dimensions");
    sh = t, shx = n->inputs[j], nsh++;
  }
  if (!nsh) {
    *L(s, n) = R();
    return 0;
  }
  /* a replicated operand broadcast along the sharded dimension is cut to
   * the rank's piece (local_slice); one broadcast over it enters the region */
  for (int j = 0; j < n->ninputs; j++) {
    IrNode *x = n->inputs[j];
    if (L(s, x)->kind != L_REP) continue;
    int xd = sh.dim - (n->rank - x->rank);
    if (xd >= 0 && x->shape[xd] != 1) {
      int64_t whole = shx->shape[sh.dim - (n->rank - shx->rank)] * s->tp; /* global size */
      if (sh.blocks != 1 || sh.vocab || x->shape[xd] != whole)
        return fail(s, "a replicated operand %%%d meets one sharded on dimension %d%s: only a "
                       "plain split can be cut locally",
                    x->id, sh.dim, sh.blocks != 1 ? " in blocks" : sh.vocab ? " with padding" : "");
      n->inputs[j] = local_piece(s, x, xd);
      continue;
    }
    n->inputs[j] = enter(s, x);
  }
  *L(s, n) = sh;
  return 0;
}

static int rule_matmul(Sh *s, IrNode *n) {
  IrNode *a = n->inputs[0], *b = n->inputs[1];
  int r = n->rank, tb = n->ia[0] != 0;
  int bout = tb ? b->rank - 2 : b->rank - 1, bin = tb ? b->rank - 1 : b->rank - 2;
  if (s->dp > 1 && s->bat[b->id] && !s->bat[a->id])
    return fail(s, "the batch on the right operand only: not supported under dp = %d", s->dp);
  if (L(s, a)->kind == L_PARTIAL) a = n->inputs[0] = need_rep(s, a);
  if (L(s, b)->kind == L_PARTIAL) b = n->inputs[1] = need_rep(s, b);
  Lay la = *L(s, a), lb = *L(s, b);
  if (la.kind == L_REP && lb.kind == L_REP) {
    *L(s, n) = R();
    return 0;
  }
  int gathered = 0;
  if (la.kind == L_SHARD && la.dim != a->rank - 1 && lb.kind == L_SHARD && lb.dim == bout) {
    /* column-parallel with its input on (sequence) shards: gathered first */
    a = n->inputs[0] = enter_gathered(s, a);
    la = *L(s, a);
    gathered = 1;
  }
  if (la.kind == L_REP && lb.kind == L_SHARD && lb.dim == bout) { /* column */
    if (!gathered) n->inputs[0] = enter(s, a); /* the all_gather stands for group_copy */
    *L(s, n) = S(r - 1, lb.blocks);
    L(s, n)->vocab = lb.vocab;
    return 0;
  }
  if (la.kind == L_SHARD && la.dim == a->rank - 1 && la.blocks == 1 && lb.kind == L_SHARD &&
      lb.dim == bin && lb.blocks == 1 && !la.vocab && !lb.vocab) { /* row */
    *L(s, n) = P();
    return 0;
  }
  if (la.kind == L_SHARD && la.dim < r - 2 && b->rank == r && lb.kind == L_SHARD &&
      lb.dim == la.dim) { /* batched, both split on one batch dimension */
    *L(s, n) = la;
    return 0;
  }
  if (la.kind == L_SHARD && la.dim < r - 1 && lb.kind == L_REP && b->rank == 2) {
    n->inputs[1] = enter(s, b); /* rows of a split: the weight's gradient is partial */
    *L(s, n) = la;
    return 0;
  }
  return fail(s, "no rule for a %s-%s matmul (a row-parallel weight needs an input sharded on "
                 "its last dimension)",
              la.kind == L_REP ? "replicated" : la.kind == L_SHARD ? "sharded" : "partial",
              lb.kind == L_REP ? "replicated" : "sharded");
}

/* Ops that work along their last dimension (norms, softmax) or along fixed
 * dimensions (rope: positions on 2, features on 3): the operand may be split
 * only elsewhere; the other operands (weights) must be replicated. */
static int rule_rowwise(Sh *s, IrNode *n, int bad0, int bad1) {
  IrNode *x = n->inputs[0] = reduce_for(s, n->inputs[0], bad0 != 1 && bad1 != 1);
  for (int j = 1; j < n->ninputs; j++) n->inputs[j] = need_rep(s, n->inputs[j]);
  Lay lx = *L(s, x);
  if (lx.kind == L_SHARD && (lx.dim == bad0 || lx.dim == bad1)) {
    x = n->inputs[0] = need_rep(s, x); /* whole along the dimension it works on */
    lx = *L(s, x);
  }
  if (lx.kind == L_SHARD)
    for (int j = 1; j < n->ninputs; j++) n->inputs[j] = enter(s, n->inputs[j]);
  *L(s, n) = lx;
  return 0;
}

static int rule_attention(Sh *s, IrNode *n) {
  int nsh = 0;
  for (int j = 0; j < 3; j++) {
    n->inputs[j] = unpartial(s, n->inputs[j]);
    Lay l = *L(s, n->inputs[j]);
    if (l.kind == L_SHARD && l.dim != 1 && l.dim != 0)
      return fail(s, "q, k, v may be sharded on heads or batch only, got dimension %d", l.dim);
    nsh += l.kind == L_SHARD;
  }
  if (!nsh) {
    *L(s, n) = R();
    return 0;
  }
  Lay l0 = *L(s, n->inputs[0]);
  for (int j = 1; j < 3; j++) {
    Lay l = *L(s, n->inputs[j]);
    if (l.kind != L_SHARD || l.dim != l0.dim)
      return fail(s, "q, k and v must be sharded alike (heads and kv heads over tp)");
  }
  *L(s, n) = l0;
  return 0;
}

static int rule_heads(Sh *s, IrNode *n) {
  IrNode *x = n->inputs[0] = unpartial(s, n->inputs[0]);
  Lay l = *L(s, x);
  if (l.kind != L_SHARD || l.dim == 0) {
    *L(s, n) = l;
    return 0;
  }
  if (n->op == IR_OP_SPLIT_HEADS) {
    if (l.dim != 2 || l.blocks != 1)
      return fail(s, "width sharded on dimension %d in %d blocks: heads cannot split", l.dim,
                  l.blocks);
    if (n->ia[0] % s->tp) return fail(s, "%lld heads are not divisible by tp = %d",
                                      (long long)n->ia[0], s->tp);
    n->ia[0] /= s->tp;
    *L(s, n) = S(1, 1);
    return 0;
  }
  if (l.dim != 1) return fail(s, "merge_heads of a value sharded on dimension %d", l.dim);
  *L(s, n) = S(2, 1);
  return 0;
}

static int rule_slice(Sh *s, IrNode *n) {
  IrNode *x = n->inputs[0];
  Lay l = *L(s, x);
  int axis = (int)n->ia[0];
  if (l.kind != L_SHARD || l.dim != axis) {
    if (axis == 0 && s->bat[x->id] && s->dp > 1)
      return fail(s, "slice of the batch dimension under dp = %d", s->dp);
    *L(s, n) = l;
    return 0;
  }
  if (l.vocab) return fail(s, "slice of a padded vocabulary dimension%s", pad_hint(s));
  int64_t w = x->shape[axis] * s->tp, blk = w / l.blocks; /* global width, block */
  if (n->ia[1] % blk || n->ia[2] % blk)
    return fail(s, "slice [%lld, %lld) cuts the sharded blocks of width %lld",
                (long long)n->ia[1], (long long)(n->ia[1] + n->ia[2]), (long long)blk);
  int64_t lblk = blk / s->tp;
  int nb = (int)(n->ia[2] / blk);
  n->ia[1] = n->ia[1] / blk * lblk;
  n->ia[2] = nb * lblk;
  *L(s, n) = S(axis, nb);
  return 0;
}

static int rule_reduce(Sh *s, IrNode *n) {
  IrNode *x = n->inputs[0];
  Lay l = *L(s, x);
  int axis = (int)n->ia[0], keep = n->ia[1] != 0;
  if (s->exr[x->id] && axis == 0)
    return fail(s, "reduction over the experts of an expert-parallel value");
  if (axis == 0 && s->bat[x->id] && s->dp > 1) {
    /* the rank's share of a statistic of the global batch: made whole
     * (all_reduce over dp) where it is read; no batch dimension remains */
    s->dpk[s->at->id] = n->op == IR_OP_MEAN ? 2 : 1;
    s->no_batch = 1;
  }
  if (l.kind == L_SHARD && l.dim == axis && l.vocab)
    return fail(s, "reduction over a padded vocabulary dimension%s", pad_hint(s));
  if (l.kind == L_SHARD && l.dim == axis && n->op == IR_OP_MEAN) {
    x = n->inputs[0] = need_rep(s, x); /* a mean needs the whole dimension */
    l = *L(s, x);
  }
  if (l.kind == L_SHARD && l.dim == axis) {
    *L(s, n) = P();
    return 0;
  }
  if (l.kind == L_SHARD && !keep && l.dim > axis) l.dim--;
  *L(s, n) = l;
  return 0;
}

static int rule_transpose(Sh *s, IrNode *n) {
  Lay l = *L(s, n->inputs[0]);
  int d0 = (int)n->ia[0], d1 = (int)n->ia[1];
  if (s->bat[n->inputs[0]->id] && s->dp > 1 && (d0 == 0 || d1 == 0) && d0 != d1)
    return fail(s, "transpose of the batch dimension under dp = %d", s->dp);
  if (l.kind == L_SHARD) l.dim = l.dim == d0 ? d1 : l.dim == d1 ? d0 : l.dim;
  *L(s, n) = l;
  return 0;
}

/* Every input replicated (partial sums reduced); the result replicated. */
static int rule_whole(Sh *s, IrNode *n) {
  for (int j = 0; j < n->ninputs; j++) n->inputs[j] = need_rep(s, n->inputs[j]);
  *L(s, n) = R();
  return 0;
}

/* The node's own shape (reshape, broadcast, sum_to, fill) under dp: a batch
 * dimension kept in front shrinks with its input's. */
static int own_shape_dp(Sh *s, IrNode *n) {
  if (n->ninputs && s->exr[n->inputs[0]->id])
    return fail(s, "of an expert-parallel value is not supported");
  if (s->dp == 1 || !n->ninputs || !s->bat[n->inputs[0]->id]) return 0;
  IrNode *x = n->inputs[0];
  /* a reshape keeps the row-major order: the rank's contiguous 1/dp of the
   * elements is again a split of dimension 0 when dp divides it (batch and
   * sequence merged into tokens, or split back) */
  if (n->op == IR_OP_RESHAPE && n->rank >= 1 && n->shape[0] % s->dp == 0) {
    n->shape[0] /= s->dp;
    return 0;
  }
  if (n->rank == 0 || (n->op != IR_OP_RESHAPE && n->rank != x->rank) ||
      n->shape[0] != x->shape[0] * s->dp)
    return fail(s, "its shape does not keep the batch dimension in front: not supported "
                   "under dp = %d",
                s->dp);
  n->shape[0] = x->shape[0];
  return 0;
}

/* ---- mixture of experts ---------------------------------------------------
 *
 * Routing is per token, so it shards with the batch: under dp each rank
 * routes its own tokens (batch / dp sequences).  The router, top-k and the
 * routing ops run replicated over tp (their operands made whole).
 *
 * Experts over tp (expert(d) weights, the prelude's w1, w3 expert(1) and w2
 * expert(2)): each expert's MLP is split like a dense one, w1 and w3 on
 * their hidden outputs (column), w2 on its hidden inputs (row), so each tp
 * rank computes a partial sum of every expert's output.  When every reader
 * of a dispatch's slots is such a column matmul (find_split_experts), the
 * tokens enter the region before the dispatch: group_copy on [tokens, d]
 * (its VJP all-reduces that gradient) rather than on the E x C slots, and
 * the dispatch is marked ent so the matmuls add no group_copy of their own.
 * combine is linear in the expert outputs: a partial y gives a partial
 * result, its routing weights entering through group_copy (each rank's
 * gradient of them, from its partial y, is partial), and a reshape of a
 * partial sum stays partial; the one tp all_reduce comes where the block's
 * output is read ([tokens, d], joined with a shared expert's partial sum
 * when there is one; under --sp a reduce_scatter onto the sequence
 * shards).  Plain `expert` weights stay whole over tp.
 *
 * Dropless (capacity >= the global token count): each rank's dispatch has
 * its local token count as capacity; no token is dropped anywhere.  With a
 * capacity factor, capacity is that of the global batch on one rank, and
 * which choices are dropped is decided in global token order by
 * capacity_drop (the dp members' per-expert counts gathered); the routing
 * ops then skip dropped choices (-1), and the rank's dispatch holds
 * min(capacity, local tokens) slots per expert, enough for every choice it
 * keeps.  So the kept choices, and each token's result, are the one-rank
 * module's on every layout -- in exact arithmetic.  In float the layouts differ
 * in the last bits (dp sums gradients in another order; OpenBLAS rounds a row of
 * an NT sgemm differently by the call's size, so a rank's fewer rows are not the
 * one-rank call's bits even at step 0), and a choice within a few ulp of a tie
 * between two experts' router probabilities can flip, after which the layouts
 * train different models (tests/trainer mesh_moe_ties; scripts/moe_route_diff.py
 * finds the flip and its margin).
 *
 * Expert parallelism (ep > 1, ep consecutive dp ranks): the expert weights
 * hold experts / ep experts each (shard_param: ep_degree, on top of any tp
 * split of each expert); the dispatch's slots go to
 * the rank holding their expert and the expert outputs come back through
 * expert_all_to_all (variable counts: filled slots only), both directions
 * each other's adjoints.  Values between the two have the rank's experts
 * on dimension 0 (exr). */
static int rule_dispatch(Sh *s, IrNode *n) {
  rule_whole(s, n);
  if (s->split_experts) { /* Megatron's f on the tokens, not on E x C slots */
    n->inputs[0] = enter(s, n->inputs[0]);
    s->ent[s->at->id] = 1;
  }
  IrNode *x = n->inputs[0], *idx = n->inputs[1];
  s->no_batch = 1;
  if (s->dp == 1) return 0;
  if (!s->bat[x->id] || !s->bat[idx->id])
    return fail(s, "tokens not split over the batch under dp = %d", s->dp);
  int64_t nl = x->shape[0], ng = nl * s->dp, cap = n->ia[1];
  if (cap < ng) { /* dropping: decided in global order */
    if (!s->drop[idx->id]) {
      IrNode *d = node_after(s, IR_OP_CAPACITY_DROP, &idx, 1, n->ia[0], cap, s->dp, 0);
      s->drop[idx->id] = d;
    }
    n->inputs[1] = s->drop[idx->id];
  }
  n->ia[1] = cap < nl ? cap : nl;
  return 0;
}

/* combine(y, idx, w) is linear in the expert outputs y: partial sums of
 * them (tp-split experts) give a partial sum, reduced where it is read
 * (one all_reduce of [tokens, d], not of the E x C slots); the weights w
 * enter through group_copy, as each rank's gradient of them (from its
 * partial y) is only partial. */
static int rule_combine(Sh *s, IrNode *n) {
  int part = L(s, n->inputs[0])->kind == L_PARTIAL;
  if (part) {
    n->inputs[1] = need_rep(s, n->inputs[1]);
    n->inputs[2] = enter(s, need_rep(s, n->inputs[2]));
  } else {
    rule_whole(s, n);
  }
  *L(s, n) = part ? P() : R();
  IrNode *idx = n->inputs[1];
  if (s->drop[idx->id]) n->inputs[1] = idx = s->drop[idx->id];
  if (s->exr[n->inputs[0]->id]) {
    n->inputs[0] = node_after(s, IR_OP_EXPERT_ALL_TO_ALL, (IrNode *[]){n->inputs[0], idx}, 2, 2,
                              s->ep, 1, 0);
    s->exr[n->inputs[0]->id] = 0;
    s->bat[n->inputs[0]->id] = 0;
  }
  return 0;
}

/* Under ep, a dispatch's slots as its consumers read them: on the ranks
 * holding their experts (once per dispatch). */
static IrNode *to_experts(Sh *s, IrNode *x) {
  if (s->ep <= 1 || x->op != IR_OP_DISPATCH) return x;
  if (!s->a2a[x->id]) {
    IrNode *a = node_after(s, IR_OP_EXPERT_ALL_TO_ALL, (IrNode *[]){x, x->inputs[1]}, 2, 2,
                           s->ep, 0, 0);
    s->exr[a->id] = 1;
    s->bat[a->id] = 0;
    s->a2a[x->id] = a;
  }
  return s->a2a[x->id];
}

static int rule(Sh *s, IrNode *n, int64_t gwid) {
  switch (n->op) {
  case IR_OP_INPUT:
    *L(s, n) = R();
    if (s->dp > 1 && n->rank >= 1) {
      if (n->shape[0] % s->dp)
        return fail(s, "batch %lld is not divisible by dp = %d", (long long)n->shape[0], s->dp);
      memcpy(n->global_shape, n->shape, sizeof n->shape);
      n->shape[0] /= s->dp;
      n->shard_dim = 0;
      n->shard_degree = s->dp;
      n->shard_blocks = 1;
      s->bat[n->id] = 1;
    }
    return 0;
  case IR_OP_PARAM: return shard_param(s, n, gwid);
  case IR_OP_FILL: *L(s, n) = R(); return 0;
  case IR_OP_MATMUL: return rule_matmul(s, n);
  case IR_OP_ADD: case IR_OP_SUB: case IR_OP_MUL: case IR_OP_DIV:
  case IR_OP_SCALE: case IR_OP_GELU: case IR_OP_SILU: case IR_OP_RELU: case IR_OP_EXP:
  case IR_OP_LOG:
    return rule_pointwise(s, n);
  case IR_OP_LAYERNORM: case IR_OP_RMSNORM: case IR_OP_SOFTMAX:
    return rule_rowwise(s, n, n->rank - 1, n->rank - 1);
  case IR_OP_ROPE: return rule_rowwise(s, n, 2, 3);
  case IR_OP_ATTENTION: return rule_attention(s, n);
  case IR_OP_SPLIT_HEADS: case IR_OP_MERGE_HEADS: return rule_heads(s, n);
  case IR_OP_SLICE: return rule_slice(s, n);
  case IR_OP_SUM: case IR_OP_MEAN: return rule_reduce(s, n);
  case IR_OP_TRANSPOSE: return rule_transpose(s, n);
  case IR_OP_RESHAPE: case IR_OP_BROADCAST: case IR_OP_SUM_TO:
    if (n->op == IR_OP_RESHAPE && L(s, n->inputs[0])->kind == L_PARTIAL) {
      *L(s, n) = P(); /* linear: reduced where it is read (the MoE output) */
      return own_shape_dp(s, n);
    }
    n->inputs[0] = need_rep(s, n->inputs[0]);
    if (L(s, n->inputs[0])->kind != L_REP)
      return fail(s, "of a sharded value is not supported yet");
    *L(s, n) = R();
    return own_shape_dp(s, n);
  case IR_OP_CONCAT: {
    rule_whole(s, n);
    int ok = 1;
    for (int j = 0; j < n->ninputs; j++) ok &= L(s, n->inputs[j])->kind == L_REP;
    if (!ok) return fail(s, "of sharded values is not supported yet");
    if (n->ia[0] == 0 && s->bat[n->inputs[0]->id] && s->dp > 1)
      return fail(s, "along the batch dimension under dp = %d", s->dp);
    return 0;
  }
  case IR_OP_EMBEDDING: {
    Lay lt = *L(s, n->inputs[1]);
    if (lt.kind != L_SHARD) return rule_whole(s, n);
    if (lt.dim != 0 || lt.blocks != 1)
      return fail(s, "a table sharded on dimension %d: only rows (vocab) are supported", lt.dim);
    if (s->tp == 1) { /* the one rank's whole (padded) table: a plain lookup */
      *L(s, n) = R();
      return 0;
    }
    /* vocab-parallel: each rank looks up its rows, a partial sum */
    n->inputs[0] = need_rep(s, n->inputs[0]);
    n->op = IR_OP_VOCAB_EMBEDDING;
    n->ia[0] = 0, n->ia[1] = s->tp;
    *L(s, n) = P();
    return 0;
  }
  case IR_OP_CROSS_ENTROPY: {
    IrNode *lg = n->inputs[0] = unpartial(s, n->inputs[0]);
    Lay ll = *L(s, lg);
    if (ll.kind != L_SHARD || ll.dim != lg->rank - 1) return rule_whole(s, n);
    if (ll.blocks != 1)
      return fail(s, "logits sharded on the vocabulary in %d blocks", ll.blocks);
    /* vocab-parallel cross-entropy: max, sum of exp and target logit reduced
     * in the op; padded columns (>= the true vocabulary) masked */
    n->inputs[1] = need_rep(s, n->inputs[1]);
    n->op = IR_OP_VOCAB_CROSS_ENTROPY;
    n->ia[0] = 0, n->ia[1] = s->tp;
    n->ia[2] = ll.vocab ? ll.vocab : lg->shape[lg->rank - 1] * s->tp;
    *L(s, n) = R();
    return 0;
  }
  case IR_OP_DISPATCH: return rule_dispatch(s, n);
  case IR_OP_COMBINE: return rule_combine(s, n);
  case IR_OP_TOPK: case IR_OP_GATHER: case IR_OP_ONEHOT:
    return rule_whole(s, n);
  default:
    return fail(s, "pass_shard takes the forward module (before autodiff and the optimizer)");
  }
}

int pass_shard(IrModule *m, int tp, int dp, int sp, char *err, size_t len) {
  if (tp < 1 || dp < 1 || tp > LAYOUT_MAX_DEGREE || dp > LAYOUT_MAX_DEGREE) {
    snprintf(err, len, "shard: degrees tp = %d, dp = %d out of range", tp, dp);
    return -1;
  }
  int fwd = !m->nupdates && !m->mesh_tp;
  for (int i = 0; fwd && i < m->nnodes; i++)
    fwd = m->nodes[i]->phase == IR_PHASE_FWD && m->nodes[i]->op != IR_OP_STATE;
  if (!fwd) {
    snprintf(err, len, "shard: takes the forward module once, before autodiff and the "
                       "optimizer");
    return -1;
  }
  int nold = m->nnodes;
  /* at most 4 collectives per input of a node (need_rep, enter_gathered,
   * local_piece, reduce_for each once per producer) */
  int ep = m->mesh_ep > 1 ? m->mesh_ep : 1;
  if (dp % ep) {
    snprintf(err, len, "shard: ep = %d does not divide dp = %d", ep, dp);
    return -1;
  }
  Sh s = {.m = m, .tp = tp, .dp = dp, .ep = ep, .sp = sp && tp > 1, .cap = 8 * nold + 8,
          .err = err, .len = len};
  s.lay = calloc((size_t)s.cap, sizeof *s.lay);
  s.bat = calloc((size_t)s.cap, 1);
  s.dpk = calloc((size_t)s.cap, 1);
  s.exr = calloc((size_t)s.cap, 1);
  s.ent = calloc((size_t)s.cap, 1);
  unsigned char *split = calloc((size_t)nold + 1, 1);
  IrNode ***caches[] = {&s.ar, &s.cp, &s.rs, &s.ag, &s.rp, &s.ls, &s.dw, &s.drop, &s.a2a};
  int ok = 1;
  for (size_t k = 0; k < sizeof caches / sizeof *caches; k++)
    ok &= (*caches[k] = calloc((size_t)s.cap, sizeof(IrNode *))) != NULL;
  int64_t *gw = calloc((size_t)nold + 1, sizeof *gw);
  IrNode **old = malloc(sizeof *old * ((size_t)nold + 1));
  if (!s.lay || !s.bat || !s.dpk || !s.exr || !s.ent || !split || !ok || !gw || !old) {
    fprintf(stderr, "parc: out of memory (shard)\n");
    exit(3);
  }
  memcpy(old, m->nodes, sizeof *old * (size_t)nold);
  find_blocks(m, gw);
  find_split_experts(m, tp, split);
  m->nnodes = 0;
  for (int i = 0; i < nold && !s.failed; i++) {
    IrNode *n = old[i];
    s.at = n;
    int scratch = s.cap - 1; /* n's slot while its rule inserts collectives */
    n->id = scratch;
    s.lay[scratch] = R();
    s.bat[scratch] = 0;
    s.dpk[scratch] = 0;
    s.exr[scratch] = 0;
    s.ent[scratch] = 0;
    s.split_experts = split[i] == 1;
    s.no_batch = 0;
    /* statistics of the global batch made whole, dispatched slots on their
     * experts' ranks, before any rule reads them */
    for (int j = 0; j < n->ninputs; j++)
      n->inputs[j] = to_experts(&s, dp_whole(&s, n->inputs[j]));
    if (s.failed || rule(&s, n, gw[i]) || s.failed) break;
    s.exr[scratch] = n->op == IR_OP_PARAM ? s.exr[scratch] : 0;
    for (int j = 0; j < n->ninputs; j++) {
      s.bat[scratch] |= s.bat[n->inputs[j]->id];
      s.exr[scratch] |= s.exr[n->inputs[j]->id];
    }
    if (s.exr[scratch] && n->op != IR_OP_MATMUL && !(ir_op_info[n->op].flags & IR_F_POINTWISE))
      if (n->op != IR_OP_COMBINE && n->op != IR_OP_PARAM) {
        fail(&s, "an expert-parallel value (the rank's experts on dimension 0) may only meet "
                 "matmuls, pointwise ops and combine");
        break;
      }
    if (s.exr[scratch] && n->op == IR_OP_COMBINE) s.exr[scratch] = 0;
    /* a scalar (the loss): a mean over the local batch; a batch reduction or
     * a dispatch: no batch dimension left */
    if (n->rank == 0 || s.no_batch) s.bat[scratch] = 0;
    int newid = m->nnodes;
    s.lay[newid] = s.lay[scratch];
    s.bat[newid] = s.bat[scratch];
    s.dpk[newid] = s.dpk[scratch];
    s.exr[newid] = s.exr[scratch];
    s.ent[newid] = s.ent[scratch];
    place(&s, n);
    char why[256];
    if (n->op != IR_OP_INPUT && n->op != IR_OP_PARAM && !ir_infer(n, why, sizeof why)) {
      fail(&s, "internal error: %s", why);
      break;
    }
  }
  if (!s.failed && m->loss) {
    s.at = m->loss;
    if (L(&s, m->loss)->kind != L_REP) fail(&s, "the loss must end replicated");
    if (s.dpk[m->loss->id]) fail(&s, "the loss must not be a sum over the dp-split batch");
  }
  if (!s.failed) m->mesh_tp = tp, m->mesh_dp = dp;
  free(s.lay);
  free(s.bat);
  free(s.dpk);
  free(s.exr);
  free(s.ent);
  free(split);
  for (size_t k = 0; k < sizeof caches / sizeof *caches; k++) free(*caches[k]);
  free(gw);
  free(old);
  return s.failed ? -1 : 0;
}
