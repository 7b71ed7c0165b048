/* codegen/cg_kernels.c -- which IR nodes each kernel computes (fusion), and
 * the plan that lists the kernels in execution order (see cg_kernels.h).
 *
 * Grouping runs consumers-first (descending ids): a node either joins the
 * kernel of its consumers or starts a kernel of its own, whose root it is.
 * A group's root never changes and only nodes with smaller ids join later,
 * so when a node is decided every consumer's kernel (and its root, the
 * position it runs at) is final.  That is what the ordering rule checks:
 * a node may join kernel G only if every consumer it has outside G runs
 * after G's root.  Then every kernel reads only values computed before it
 * runs and no kernel depends on itself.  Two passes after grouping move a
 * root later under the same rule (merge_bias_sums, link_stats). */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg_internal.h"
#include "passes/bufplan.h"
#include "passes/passes.h"

int cg_runtime_op(IrOp op) {
  switch (op) {
  case IR_OP_MATMUL: case IR_OP_MATMUL_TA: case IR_OP_ATTENTION: case IR_OP_ATTENTION_GRAD:
  case IR_OP_ATTENTION_LSE: case IR_OP_ATTENTION_DELTA:
  case IR_OP_TOPK: case IR_OP_GATHER: case IR_OP_SCATTER_ADD: case IR_OP_ONEHOT:
  case IR_OP_DISPATCH: case IR_OP_COMBINE: case IR_OP_COMBINE_GRAD_Y: case IR_OP_COMBINE_GRAD_W:
  case IR_OP_CAPACITY_DROP: case IR_OP_EXPERT_ALL_TO_ALL:
  case IR_OP_EMBEDDING: case IR_OP_EMBEDDING_GRAD: case IR_OP_CROSS_ENTROPY:
  case IR_OP_CROSS_ENTROPY_GRAD:
  case IR_OP_VOCAB_EMBEDDING: case IR_OP_VOCAB_EMBEDDING_GRAD: case IR_OP_VOCAB_CROSS_ENTROPY:
  case IR_OP_VOCAB_CROSS_ENTROPY_GRAD: /* collectives inside (rt_route.h) */
  case IR_OP_ALL_REDUCE: case IR_OP_GROUP_COPY: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER:
  case IR_OP_LOCAL_SLICE: case IR_OP_REPLICATE: /* rt_route.h, the rank's coordinate */
  case IR_OP_FLAT_SHARD: /* reads the rank's coordinate */
    return 1; /* collectives: communicator calls, not kernels */
  default:
    return 0;
  }
}

int cg_kernel_op(IrOp op) {
  return (unsigned)op < IR_OP_COUNT && !(ir_op_info[op].flags & IR_F_LEAF) && !cg_runtime_op(op);
}

int cg_pure_op(IrOp op) {
  return (ir_op_info[op].flags & IR_F_POINTWISE) || op == IR_OP_FILL || op == IR_OP_BROADCAST ||
         op == IR_OP_GRAD_NORM;
}

int cg_inline_op(IrOp op) {
  switch (op) {
  case IR_OP_RESHAPE: case IR_OP_SPLIT_HEADS: case IR_OP_MERGE_HEADS: case IR_OP_TRANSPOSE:
  case IR_OP_SLICE: case IR_OP_ROPE: case IR_OP_ROPE_GRAD:
    return 1;
  default:
    return cg_pure_op(op);
  }
}

int cg_row_op(IrOp op) {
  switch (op) {
  case IR_OP_SOFTMAX: case IR_OP_SOFTMAX_GRAD: case IR_OP_LAYERNORM: case IR_OP_RMSNORM:
  case IR_OP_LAYERNORM_GRAD: case IR_OP_RMSNORM_GRAD:
    return 1;
  default:
    return 0;
  }
}

int cg_template_of(IrOp op) {
  if (cg_inline_op(op)) return CG_ELEM;
  if (cg_row_op(op)) return CG_ROW;
  switch (op) {
  case IR_OP_SUM: case IR_OP_MEAN: case IR_OP_SUM_TO: case IR_OP_SUMSQ:
  case IR_OP_LAYERNORM_WGRAD: case IR_OP_RMSNORM_WGRAD:
    return CG_REDUCE;
  case IR_OP_CONCAT:
    return CG_CONCAT;
  default:
    return -1;
  }
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "parc: out of memory (kernel plan, %zu x %zu bytes)\n", n, size);
    exit(3);
  }
  return p;
}

typedef struct {
  const IrModule *m;
  int *cons_start, *cons;     /* consumers of node i: cons[cons_start[i] .. cons_start[i+1]) */
  unsigned char *forced;      /* results: loss, ce_loss, gradients, updates, grad_norm,
                                 the auxiliary loss terms */
  int *group_of;
  CgGroup *groups;
  int ngroups;
  unsigned char *at_s;        /* member computed at its kernel's iteration shape, elementwise */
  unsigned char *writes_stats;/* norm gradients whose kernel writes a wgrad's statistics */
  const int *colour;          /* cg_plan_kernels's, or NULL: one colour */
} Planner;

static const IrNode *nd(const Planner *P, int id) { return P->m->nodes[id]; }

/* Whether nodes a and b may share a kernel (and one run at the other's root). */
static int same_colour(const Planner *P, int a, int b) {
  return !P->colour || P->colour[a] == P->colour[b];
}

static void fill_consumers(Planner *P) {
  const IrModule *m = P->m;
  P->cons_start = xcalloc((size_t)m->nnodes + 1, sizeof(int));
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) P->cons_start[m->nodes[i]->inputs[j]->id + 1]++;
  for (int i = 0; i < m->nnodes; i++) P->cons_start[i + 1] += P->cons_start[i];
  P->cons = xcalloc((size_t)P->cons_start[m->nnodes], sizeof(int));
  int *fill = xcalloc((size_t)m->nnodes, sizeof(int));
  for (int i = 0; i < m->nnodes; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      int x = m->nodes[i]->inputs[j]->id;
      P->cons[P->cons_start[x] + fill[x]++] = i;
    }
  free(fill);
}

static void fill_forced(Planner *P) {
  const IrModule *m = P->m;
  P->forced = xcalloc((size_t)m->nnodes, 1);
  if (m->loss) P->forced[m->loss->id] = 1;
  if (m->ce_loss) P->forced[m->ce_loss->id] = 1;
  if (m->grad_norm) P->forced[m->grad_norm->id] = 1;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->grad) P->forced[m->nodes[i]->grad->id] = 1;
  for (int i = 0; i < m->nupdates; i++) P->forced[m->updates[i].value->id] = 1;
  for (int i = 0; i < m->nnodes; i++) /* read for the trainer's MoE statistics */
    if (ir_is_aux_term(m, m->nodes[i])) P->forced[m->nodes[i]->id] = 1;
}

/* Where a consumer runs: its kernel's root, or itself (runtime op). */
static int position(const Planner *P, int q) {
  return P->group_of[q] >= 0 ? P->groups[P->group_of[q]].root : q;
}

static int same_shape(const IrNode *a, const IrNode *b) {
  if (a->rank != b->rank) return 0;
  for (int d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* Whether n would be computed at group g's iteration shape S, elementwise:
 * n has shape S and every consumer of n in g is at S and reads n at its own
 * coordinates (pointwise or row op, n not broadcast). */
static int at_shape(const Planner *P, const IrNode *n, int g) {
  const CgGroup *G = &P->groups[g];
  if (G->tmpl != CG_ELEM && G->tmpl != CG_ROW) return 0;
  const IrNode *S = nd(P, G->tmpl == CG_ROW ? G->rowop : G->root);
  if (!same_shape(n, S)) return 0;
  for (int i = P->cons_start[n->id]; i < P->cons_start[n->id + 1]; i++) {
    const IrNode *q = nd(P, P->cons[i]);
    if (P->group_of[q->id] != g) continue;
    if (!P->at_s[q->id] || !same_shape(n, q)) return 0;
    if (!cg_pure_op(q->op) && !cg_row_op(q->op)) return 0;
  }
  return 1;
}

/* 1 if norm node r (a group's root) has a twin: another norm of its op on
 * the same inputs (the backward's recomputation, passes/remat_norm.c).
 * Then r's kernel takes no prologue and joins no other, so that both run one
 * kernel code on one buffer and store the same bits (FUSION in
 * cg_kernels.h). */
static int recomputed_norm(const Planner *P, const IrNode *r) {
  if (!ir_op_is_norm(r->op)) return 0;
  const IrNode *x = r->inputs[0];
  for (int i = P->cons_start[x->id]; i < P->cons_start[x->id + 1]; i++) {
    const IrNode *q = nd(P, P->cons[i]);
    int same = q != r && q->op == r->op && q->ninputs == r->ninputs;
    for (int j = 0; same && j < r->ninputs; j++) same = q->inputs[j] == r->inputs[j];
    if (same) return 1;
  }
  return 0;
}

/* 1 if c is a concat of weight gradients (a dp bucket) or of the optimizer's
 * updates (ZeRO-1's pieces the all-gather sends) whose inputs are contiguous
 * in it (one row before its axis): its parts may be written into it
 * (mark_parts, bufplan.h Assembled concats) */
static int bucket_concat(const IrNode *c) {
  return c->op == IR_OP_CONCAT && (c->phase == IR_PHASE_W || c->phase == IR_PHASE_OPT) &&
         c->dtype == IR_F32 && ir_dims_product(c, 0, (int)c->ia[0]) == 1;
}

/* Puts n into the kernel of its consumers if it may (see the file comment
 * and cg_kernels.h); 1 if it did. */
static int try_join(Planner *P, const IrNode *n) {
  int g = -1, best = INT_MAX;
  for (int i = P->cons_start[n->id]; i < P->cons_start[n->id + 1]; i++) {
    int q = P->cons[i];
    if (P->group_of[q] >= 0 && P->groups[P->group_of[q]].root < best)
      g = P->group_of[q], best = P->groups[g].root;
  }
  if (g >= 0 && !same_colour(P, n->id, P->groups[g].root)) return 0;
  if (g < 0) return 0;
  CgGroup *G = &P->groups[g];
  int outside = 0;
  for (int i = P->cons_start[n->id]; i < P->cons_start[n->id + 1]; i++) {
    int q = P->cons[i];
    if (P->group_of[q] == g) continue;
    outside = 1;
    if (position(P, q) <= G->root) return 0;
  }
  int need_store = outside || P->forced[n->id];
  int at = at_shape(P, n, g);
  const IrNode *root = nd(P, G->root);
  if (recomputed_norm(P, root) || recomputed_norm(P, n)) return 0;
  if (cg_inline_op(n->op)) {
    if (root->op == IR_OP_LAYERNORM_WGRAD || root->op == IR_OP_RMSNORM_WGRAD) return 0;
    /* a dp bucket's concat copies the gradients as they are, ZeRO's gather
     * buffer the updates: a computation in it would keep its inputs out of
     * its bytes (mark_parts), and an update is better fused with its moments
     * (at their shape, which a concat's parts are not) */
    if (n->op != IR_OP_RESHAPE && bucket_concat(root)) return 0;
    if (need_store && !at) return 0;
  } else if (cg_row_op(n->op)) {
    if (G->tmpl != CG_ELEM || !at) return 0;
    G->tmpl = CG_ROW;
    G->rowop = n->id;
  } else {
    return 0;
  }
  P->group_of[n->id] = g;
  P->at_s[n->id] = (unsigned char)at;
  return 1;
}

static int failf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

static int is_wgrad(IrOp op) { return op == IR_OP_LAYERNORM_WGRAD || op == IR_OP_RMSNORM_WGRAD; }

static int group_size(const Planner *P, int g) {
  int n = 0;
  for (int i = 0; i <= P->groups[g].root; i++) n += P->group_of[i] == g;
  return n;
}

/* A bias gradient sum_to(dy) -> [D] joins the kernel of the norm wgrad that
 * reduces the same dy over the same rows: one loop, two sums.  The merged
 * kernel runs at the later root, so the earlier node's consumers must all
 * run after it. */
static void merge_bias_sums(Planner *P) {
  const IrModule *m = P->m;
  for (int w = 0; w < m->nnodes; w++) {
    const IrNode *W = nd(P, w);
    int g = P->group_of[w];
    if (!is_wgrad(W->op) || g < 0 || group_size(P, g) != 1) continue;
    const IrNode *dy = W->inputs[1];
    for (int i = P->cons_start[dy->id]; i < P->cons_start[dy->id + 1]; i++) {
      const IrNode *U = nd(P, P->cons[i]);
      int gu = P->group_of[U->id];
      if (U->op != IR_OP_SUM_TO || U->inputs[0] != dy || U->rank != 1 ||
          !same_colour(P, w, U->id) ||
          U->shape[0] != dy->shape[dy->rank - 1] || gu < 0 || gu == g || group_size(P, gu) != 1)
        continue;
      int late = w > U->id ? w : U->id, early = w > U->id ? U->id : w, ok = 1;
      for (int c = P->cons_start[early]; ok && c < P->cons_start[early + 1]; c++)
        ok = position(P, P->cons[c]) > late;
      if (!ok) continue;
      P->group_of[U->id] = g;
      P->groups[g].root = late;
      P->groups[gu].root = -1; /* dead */
      break;
    }
  }
}

/* Whether every consumer outside group g of g's members runs after pos. */
static int consumers_after(const Planner *P, int g, int pos) {
  for (int i = 0; i <= P->groups[g].root; i++) {
    if (P->group_of[i] != g) continue;
    for (int c = P->cons_start[i]; c < P->cons_start[i + 1]; c++)
      if (P->group_of[P->cons[c]] != g && position(P, P->cons[c]) <= pos) return 0;
  }
  return 1;
}

/* A wgrad reads its row statistics from the kernel of the norm gradient of
 * the same x and eps (Temporaries).  When that kernel runs later (an
 * epilogue moved its root past the wgrad), the wgrad's kernel is deferred
 * to run right after it, if its results are needed only later still. */
static void link_stats(Planner *P) {
  const IrModule *m = P->m;
  for (int w = 0; w < m->nnodes; w++) {
    const IrNode *W = nd(P, w);
    if (!is_wgrad(W->op) || P->group_of[w] < 0) continue;
    IrOp want = W->op == IR_OP_LAYERNORM_WGRAD ? IR_OP_LAYERNORM_GRAD : IR_OP_RMSNORM_GRAD;
    const IrNode *x = W->inputs[0];
    for (int i = P->cons_start[x->id]; i < P->cons_start[x->id + 1]; i++) {
      const IrNode *G = nd(P, P->cons[i]);
      int gg = P->group_of[G->id];
      if (G->op != want || G->inputs[0] != x || G->fa != W->fa || gg < 0 ||
          !same_colour(P, w, G->id) ||
          P->groups[gg].tmpl != CG_ROW || P->groups[gg].rowop != G->id)
        continue;
      CgGroup *gw = &P->groups[P->group_of[w]];
      if (P->groups[gg].root >= gw->root) {
        /* one deferred kernel per writer: names stay unique */
        if (P->groups[gg].deferred || P->writes_stats[G->id] ||
            !consumers_after(P, P->group_of[w], P->groups[gg].root))
          continue;
        gw->root = P->groups[gg].root;
        gw->deferred = 1;
      }
      gw->stats = G->id;
      P->writes_stats[G->id] = 1;
      break;
    }
  }
}

/* Drops dead groups and numbers the rest by ascending root. */
/* Group order: ascending root, then deferred, then the group's number (a
 * stable sort: equal keys keep their order). */
typedef struct {
  int root, deferred, g;
} GroupKey;
static int by_root(const void *a, const void *b) {
  const GroupKey *x = a, *y = b;
  if (x->root != y->root) return x->root < y->root ? -1 : 1;
  if (x->deferred != y->deferred) return x->deferred < y->deferred ? -1 : 1;
  return (x->g > y->g) - (x->g < y->g);
}

static void sort_groups(Planner *P) {
  int n = 0;
  int *order = xcalloc((size_t)P->ngroups, sizeof(int));
  int *renum = xcalloc((size_t)P->ngroups, sizeof(int));
  GroupKey *key = xcalloc((size_t)P->ngroups + 1, sizeof(GroupKey));
  for (int g = 0; g < P->ngroups; g++)
    if (P->groups[g].root >= 0) key[n++] = (GroupKey){P->groups[g].root, P->groups[g].deferred, g};
  /* (groups were made in descending root order: an insertion sort would be
   * quadratic, seconds on GPT-3's unfused microbatch module) */
  if (n > 1) qsort(key, (size_t)n, sizeof *key, by_root);
  for (int i = 0; i < n; i++) order[i] = key[i].g;
  free(key);
  CgGroup *sorted = xcalloc((size_t)(n ? n : 1), sizeof(CgGroup));
  for (int i = 0; i < n; i++) sorted[i] = P->groups[order[i]], renum[order[i]] = i;
  for (int i = 0; i < P->m->nnodes; i++)
    if (P->group_of[i] >= 0) P->group_of[i] = renum[P->group_of[i]];
  free(P->groups);
  P->groups = sorted;
  P->ngroups = n;
  free(order);
  free(renum);
}

/* Binds update values to their leaves' buffers (cg_kernels.h, In-place
 * updates) where (a) and (b) hold; run once the kernels' roots are final.
 * Invariant: inplace_of[v] = L only if every member of v's kernel that
 * reads L reads it elementwise at the kernel's coordinates, and every other
 * reader of L runs before that kernel (synchronously). */
static void plan_inplace(const Planner *P, int *inplace_of) {
  const IrModule *m = P->m;
  for (int i = 0; i < m->nnodes; i++) inplace_of[i] = -1;
  for (int u = 0; u < m->nupdates; u++) {
    const IrNode *L = m->updates[u].leaf, *v = m->updates[u].value;
    int g = P->group_of[v->id];
    if (g < 0) continue; /* a runtime op's result or a leaf: copied */
    const CgGroup *G = &P->groups[g];
    const IrNode *root = nd(P, G->root);
    /* (a) one store per element of L's shape, at the iteration's coordinates
     * (a rope root stores two elements per iteration) */
    if (G->tmpl != CG_ELEM || G->deferred || root->op == IR_OP_ROPE ||
        root->op == IR_OP_ROPE_GRAD || !same_shape(v, root) || !same_shape(L, v) ||
        L->dtype != v->dtype)
      continue;
    int ok = 1;
    for (int c = P->cons_start[L->id]; ok && c < P->cons_start[L->id + 1]; c++) {
      const IrNode *q = nd(P, P->cons[c]);
      if (P->group_of[q->id] == g) /* (a): element i of L read where i of v is stored */
        ok = (ir_op_info[q->op].flags & IR_F_POINTWISE) && same_shape(q, L) && P->at_s[q->id];
      else /* (b): L's old value is dead once K has run */
        ok = position(P, q->id) < G->root && !dp_grads_is_bucket(q);
    }
    if (ok) inplace_of[v->id] = L->id;
  }
}

/* A kernel that only copies a contiguous range of one materialised value x:
 * its members a chain of reshapes and slices from its root down to x
 * (bufplan_view_offset).  Only over a weight-gradient value (W or OPT phase,
 * no norm, no reshape: the GPU trainer never stores it as bf16,
 * codegen/cuda_store.c), whose elements are 4 bytes on every host: a
 * data-parallel bucket's pieces (passes/dp_grads.c).  Returns x, or -1. */
static int range_view_of(const Planner *P, const unsigned char *materialize, int g, int members) {
  const IrNode *root = nd(P, P->groups[g].root), *x = root;
  int chain = 0;
  while (P->group_of[x->id] == g) {
    if ((x->op != IR_OP_RESHAPE && x->op != IR_OP_SLICE) || x->ninputs != 1) return -1;
    chain++;
    x = x->inputs[0];
  }
  if (chain != members || !materialize[x->id] || x->dtype != IR_F32 ||
      (x->phase != IR_PHASE_W && x->phase != IR_PHASE_OPT) || ir_op_is_norm(x->op) ||
      x->op == IR_OP_RESHAPE || bufplan_view_offset(root, x) < 0)
    return -1;
  return x->id;
}

/* The parts of concat group g (cg_kernels.h, parts): its root a bucket
 * concat (bucket_concat), its other members reshapes, each
 * input's chain of them down to a distinct materialised f32 node of its phase
 * that nothing else reads.  Marks them parts[x] = the concat and returns 1,
 * or marks none and returns 0. */
static int mark_parts(const Planner *P, const unsigned char *materialize, int g, int members,
                      int *parts) {
  const IrModule *m = P->m;
  const IrNode *c = nd(P, P->groups[g].root);
  if (!bucket_concat(c) || !materialize[c->id]) return 0;
  int ok = 1;
  int chain = 1; /* (c itself) */
  for (int k = 0; ok && k < c->ninputs; k++) {
    const IrNode *x = c->inputs[k];
    while (P->group_of[x->id] == g && x->op == IR_OP_RESHAPE && x->ninputs == 1) {
      chain++;
      x = x->inputs[0];
    }
    int readers = P->cons_start[x->id + 1] - P->cons_start[x->id];
    if (P->group_of[x->id] == g || !materialize[x->id] || x->dtype != IR_F32 ||
        x->phase != c->phase || readers != 1 || parts[x->id] >= 0)
      ok = 0; /* (not a part: none) */
    else
      parts[x->id] = c->id;
  }
  if (ok && chain == members) return 1;
  for (int i = 0; i < m->nnodes; i++) /* all or nothing */
    if (parts[i] == c->id) parts[i] = -1;
  return 0;
}

void cg_plan_free(CgKernelPlan *p) {
  if (!p) return;
  for (int i = 0; i < p->nkernels; i++) {
    free(p->kernels[i].arg_node);
    free(p->kernels[i].nodes);
  }
  free(p->kernels);
  free(p->kernel_of);
  free(p->materialize);
  free(p->view_of);
  free(p->parts);
  free(p->inplace_of);
  free(p->temps);
  kir_module_free(p->km);
  memset(p, 0, sizeof *p);
}

int cg_plan_kernels(const IrModule *m, int fuse, const int *colour, CgKernelPlan *out,
                    char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  Planner P = {.m = m, .colour = colour};
  fill_consumers(&P);
  fill_forced(&P);
  P.group_of = xcalloc((size_t)m->nnodes, sizeof(int));
  P.groups = xcalloc((size_t)m->nnodes, sizeof(CgGroup));
  P.at_s = xcalloc((size_t)m->nnodes, 1);
  P.writes_stats = xcalloc((size_t)m->nnodes, 1);
  int rc = 0;
  for (int id = m->nnodes - 1; id >= 0 && rc == 0; id--) {
    const IrNode *n = m->nodes[id];
    P.group_of[id] = -1;
    if (!cg_kernel_op(n->op)) continue;
    if (fuse && try_join(&P, n)) continue;
    int t = cg_template_of(n->op);
    if (t < 0) {
      rc = failf(err, errlen, "%%%d: no kernel lowering for op %s", id, ir_op_info[n->op].name);
      break;
    }
    CgGroup *G = &P.groups[P.ngroups];
    G->root = id;
    G->tmpl = (CgTmpl)t;
    G->rowop = t == CG_ROW ? id : -1;
    G->stats = -1;
    P.group_of[id] = P.ngroups++;
    P.at_s[id] = t == CG_ELEM || t == CG_ROW;
  }

  if (rc == 0 && fuse) {
    merge_bias_sums(&P);
    link_stats(&P);
  }
  if (rc == 0) sort_groups(&P);

  if (rc == 0) {
    out->nnodes = m->nnodes;
    out->kernel_of = xcalloc((size_t)m->nnodes, sizeof(int));
    out->materialize = xcalloc((size_t)m->nnodes, 1);
    for (int i = 0; i < m->nnodes; i++) {
      int g = P.group_of[i], mat = g < 0 || P.forced[i] || P.cons_start[i] == P.cons_start[i + 1];
      for (int c = P.cons_start[i]; !mat && c < P.cons_start[i + 1]; c++)
        mat = P.group_of[P.cons[c]] != g;
      out->materialize[i] = (unsigned char)mat;
      /* a stored member must be where its kernel visits each element once:
       * at the kernel's shape, or one of a reduction kernel's sums */
      if (mat && g >= 0 && i != P.groups[g].root && !P.at_s[i] &&
          cg_template_of(m->nodes[i]->op) != CG_REDUCE)
        rc = failf(err, errlen, "internal: %%%d is materialised inside kernel of %%%d", i,
                   P.groups[g].root);
    }
  }
  if (rc == 0) { /* an update value written into its leaf has no buffer of its own */
    out->inplace_of = xcalloc((size_t)m->nnodes, sizeof(int));
    plan_inplace(&P, out->inplace_of);
    for (int i = 0; i < m->nnodes; i++)
      if (out->inplace_of[i] >= 0) out->materialize[i] = 0;
  }
  /* per group: its kernel copies a range of a value (range_view_of), or is a
   * bucket's concat whose parts are marked (mark_parts) */
  unsigned char *range_g = xcalloc((size_t)P.ngroups + 1, 1);
  unsigned char *parts_g = xcalloc((size_t)P.ngroups + 1, 1);
  if (rc == 0) {
    out->view_of = xcalloc((size_t)m->nnodes, sizeof(int));
    int *members = xcalloc((size_t)P.ngroups + 1, sizeof(int)); /* group_size, all at once */
    for (int i = 0; i < m->nnodes; i++)
      if (P.group_of[i] >= 0) members[P.group_of[i]]++;
    for (int i = 0; i < m->nnodes; i++) {
      const IrNode *n = m->nodes[i];
      int g = P.group_of[i];
      /* a reshape alone in its kernel; a group_copy (tp's identity forward: its
       * value is its input's, the copy a runtime op's) */
      out->view_of[i] = ((n->op == IR_OP_RESHAPE && g >= 0 && P.groups[g].root == i &&
                          members[g] == 1) ||
                         (n->op == IR_OP_GROUP_COPY && out->materialize[i])) &&
                                out->materialize[n->inputs[0]->id]
                            ? n->inputs[0]->id
                            : -1;
      if (out->view_of[i] < 0 && g >= 0 && P.groups[g].root == i &&
          (out->view_of[i] = range_view_of(&P, out->materialize, g, members[g])) >= 0)
        range_g[g] = 1;
    }
    out->parts = xcalloc((size_t)m->nnodes, sizeof(int));
    for (int i = 0; i < m->nnodes; i++) out->parts[i] = -1;
    for (int g = 0; g < P.ngroups; g++)
      parts_g[g] = (unsigned char)mark_parts(&P, out->materialize, g, members[g], out->parts);
    free(members);
  }
  if (rc == 0) {
    out->km = kir_module_new();
    out->kernels = xcalloc((size_t)(2 * P.ngroups), sizeof(CgKernel));
    int *stats_temp = xcalloc((size_t)m->nnodes, sizeof(int));
    for (int i = 0; i < m->nnodes; i++) stats_temp[i] = -1;
    int *main_kernel = xcalloc((size_t)P.ngroups + 1, sizeof(int));
    CgView v = {m, P.group_of, out->materialize, out->inplace_of, P.writes_stats, stats_temp};
    for (int g = 0; g < P.ngroups && rc == 0; g++) {
      rc = cg_emit_group(out, &v, &P.groups[g], g, err, errlen);
      main_kernel[g] = out->nkernels - 1;  /* after a group's _stats kernel */
    }
    for (int i = 0; rc == 0 && i < m->nnodes; i++)
      out->kernel_of[i] = P.group_of[i] < 0 ? -1 : main_kernel[P.group_of[i]];
    for (int g = 0; rc == 0 && g < P.ngroups; g++) { /* (range_view_of's, mark_parts') */
      out->kernels[main_kernel[g]].range_view = range_g[g];
      out->kernels[main_kernel[g]].assembles = parts_g[g];
    }
    free(stats_temp);
    free(main_kernel);
  }
  free(range_g);
  free(parts_g);
  if (rc == 0) {
    for (int i = 0; i < out->nkernels; i++) out->kernels[i].nargs = out->kernels[i].k->nparams;
    if (out->nkernels && kir_verify(out->km, err, errlen)) rc = -1;
  }
  free(P.cons_start);
  free(P.cons);
  free(P.forced);
  free(P.group_of);
  free(P.groups);
  free(P.at_s);
  free(P.writes_stats);
  if (rc) cg_plan_free(out);
  return rc;
}
