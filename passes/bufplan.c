/* passes/bufplan.c -- liveness-based offset assignment.
 *
 * Greedy best fit over a free list kept sorted by offset: each node, in
 * order, takes the smallest free gap that holds it (or the arena grows at
 * its end); buffers whose last reader has run are returned to the free
 * list and coalesced with their neighbours.  A node written in place
 * (bufplan.h) takes its input's bytes instead, and they return to the free
 * list when the node dies, not when the input does.  A shared view joins
 * its input's byte group: the group's root returns the bytes once every
 * member has died.  Then repack places the same groups again largest first
 * (and, for several arenas, in three more orders) and keeps the layout that
 * costs least (bufplan.h). */
#include "passes/bufplan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t off, len;
} Gap;

typedef struct {
  Gap *gaps;
  int n, cap;
  int64_t end;  /* arena size so far */
} FreeList;

static int64_t take(FreeList *f, int64_t size) {
  int best = -1;
  for (int i = 0; i < f->n; i++)
    if (f->gaps[i].len >= size && (best < 0 || f->gaps[i].len < f->gaps[best].len)) best = i;
  if (best < 0) {
    /* grow: a gap at the very end is extended rather than skipped */
    if (f->n && f->gaps[f->n - 1].off + f->gaps[f->n - 1].len == f->end) {
      int64_t off = f->gaps[f->n - 1].off;
      f->end = off + size;
      f->n--;
      return off;
    }
    int64_t off = f->end;
    f->end += size;
    return off;
  }
  int64_t off = f->gaps[best].off;
  f->gaps[best].off += size;
  f->gaps[best].len -= size;
  if (f->gaps[best].len == 0) {
    memmove(&f->gaps[best], &f->gaps[best + 1], sizeof(Gap) * (size_t)(f->n - best - 1));
    f->n--;
  }
  return off;
}

static void give(Arena *a, FreeList *f, int64_t off, int64_t len) {
  int i = 0;
  while (i < f->n && f->gaps[i].off < off) i++;
  arena_grow(a, (void **)&f->gaps, &f->cap, f->n + 1, sizeof(Gap));
  memmove(&f->gaps[i + 1], &f->gaps[i], sizeof(Gap) * (size_t)(f->n - i));
  f->gaps[i] = (Gap){off, len};
  f->n++;
  if (i + 1 < f->n && f->gaps[i].off + f->gaps[i].len == f->gaps[i + 1].off) {
    f->gaps[i].len += f->gaps[i + 1].len;
    memmove(&f->gaps[i + 1], &f->gaps[i + 2], sizeof(Gap) * (size_t)(f->n - i - 2));
    f->n--;
  }
  if (i > 0 && f->gaps[i - 1].off + f->gaps[i - 1].len == f->gaps[i].off) {
    f->gaps[i - 1].len += f->gaps[i].len;
    memmove(&f->gaps[i], &f->gaps[i + 1], sizeof(Gap) * (size_t)(f->n - i - 1));
    f->n--;
  }
}

static int has_buffer(const IrNode *n, const unsigned char *materialize) {
  if (ir_op_info[n->op].flags & IR_F_LEAF) return 0;
  return !materialize || materialize[n->id];
}

static int at(const int *pos, int i) { return pos ? pos[i] : i; }

/* node n's bytes: 4 an element, 2 where narrow[id] (an aux part, sdpa's
 * lse, 4 in either case) */
static int64_t node_bytes(const IrNode *n, const unsigned char *narrow) {
  int64_t aux = ir_aux_numel(n);
  return (narrow && narrow[n->id] ? 2 : 4) * ir_numel(n) + 4 * aux;
}

/* 1 if node i's buffer may be x's bytes (In place, a shared view): the same
 * element count, dtype and bytes an element; and the same size, except that
 * a view (a reshape) of a value with an aux part after its elements (sdpa's
 * out, its lse after it) may take the bytes of the elements and the aux part
 * both: it reads the elements only (the plan then gives it x's size, so the
 * group's bytes are one range). */
static int fits_over(const IrModule *m, const BufPlan *p, int x, int i, int view) {
  const IrNode *a = m->nodes[x], *n = m->nodes[i];
  if (a->dtype != n->dtype || ir_numel(a) != ir_numel(n)) return 0;
  if (p->size[x] == p->size[i] && ir_aux_numel(a) == ir_aux_numel(n)) return 1;
  return view && ir_aux_numel(n) == 0 && ir_aux_numel(a) > 0 &&
         node_bytes(a, p->narrow) - 4 * ir_aux_numel(a) == node_bytes(n, p->narrow);
}

/* In place (bufplan.h): the input whose bytes node i may take, or -1.  i is
 * being planned at position t = pos[i], after every node of an earlier
 * position.  Input 0, x, qualifies when
 *   (a) i's op allows it (IR_F_INPLACE0: its kernels read each element of x
 *       before writing the result's element at the same offset), or i is a
 *       view of x (view_of[i] == x: x's bytes are already i's value, and
 *       the host runs no kernel for i),
 *   (b) x has a buffer of exactly i's size, element count and dtype, written
 *       at an earlier position (an arena value: leaves and values fused away
 *       have none; x may itself be an in-place result),
 *   (c) i is x's last reader: x's life ends at t (not kept, not the loss),
 *       every other reader runs at an earlier position and no asynchronous
 *       one is still reading at t, and i reads x as input 0 only,
 *   (d) i itself is synchronous (its kernel is done with x when it returns).
 * Then nothing reads x's bytes as x after i has started, and i's result is
 * the next value they hold. */
static int in_place_input(const IrModule *m, const BufPlan *p, const int *pos, const int *held,
                          const int *view_of, int i) {
  const IrNode *n = m->nodes[i];
  int t = at(pos, i);
  /* (a node that never runs reads nothing: its inputs may be gone) */
  if (n->ninputs < 1 || (held && held[i] >= 0) || (p->arenas.unread && p->arenas.unread[i]))
    return -1;
  const IrNode *x = n->inputs[0];
  /* (a reshape over its input, or an add whose other term a runtime op adds
   * onto x's bytes: codegen/grad_onto.h) */
  int view = view_of && view_of[i] == x->id;
  if (!(ir_op_info[n->op].flags & IR_F_INPLACE0) && !view) return -1;
  if (p->offset[x->id] < 0 || at(pos, x->id) >= t || p->last_use[x->id] != t ||
      !fits_over(m, p, x->id, i, view))
    return -1;
  for (int k = 1; k < n->ninputs; k++)
    if (n->inputs[k] == x) return -1;
  for (int r = 0; r < m->nnodes; r++) {
    if (r == i) continue;
    for (int k = 0; k < m->nodes[r]->ninputs; k++)
      if (m->nodes[r]->inputs[k] == x && (at(pos, r) >= t || (held && held[r] >= t))) return -1;
  }
  return x->id;
}

int64_t bufplan_view_offset(const IrNode *n, const IrNode *x) {
  int64_t off = 0; /* (a contiguous range of a contiguous range: offsets add) */
  for (; n != x; n = n->inputs[0]) {
    if (n->ninputs != 1 || (n->op != IR_OP_RESHAPE && n->op != IR_OP_SLICE)) return -1;
    if (n->op == IR_OP_RESHAPE) continue;
    const IrNode *y = n->inputs[0];
    int axis = (int)n->ia[0];
    int64_t outer = ir_dims_product(y, 0, axis), inner = ir_dims_product(y, axis + 1, y->rank);
    if (outer != 1 && n->ia[2] != y->shape[axis]) return -1; /* rows apart */
    off += n->ia[1] * inner;
  }
  return off;
}

/* Where sub-range view i of x starts in x's bytes (bufplan.h), or -1 where it
 * may not share them: no range, a misaligned start, narrow elements, x's
 * bytes written at position t or later. */
static int64_t sub_view_start(const IrModule *m, const BufPlan *p, const int *pos, int x, int i) {
  const IrNode *a = m->nodes[x], *n = m->nodes[i];
  int64_t off = bufplan_view_offset(n, a);
  if (off < 0 || a->dtype != n->dtype || off + ir_numel(n) > ir_numel(a) ||
      (4 * off) % BUFPLAN_ALIGN || (p->narrow && (p->narrow[x] || p->narrow[i])) ||
      p->offset[x] < 0 || at(pos, x) >= at(pos, i))
    return -1;
  return 4 * off;
}

/* Shared view (bufplan.h): the input whose bytes view i shares, or -1: i is
 * a view of x (a reshape or a group_copy, view_of[i] == x, no copy) that is not x's last
 * reader, and x has a buffer of i's size, element count and dtype written at
 * an earlier position (x may itself be in place, or a shared view).  Nothing
 * writes a view, so x's other readers still see x; the bytes stay taken
 * until the group's last member dies.  A sub-range view (reshapes and slices
 * down to x) shares them from *start on (else *start = 0). */
static int shared_view_input(const IrModule *m, const BufPlan *p, const int *pos,
                             const int *view_of, int i, int64_t *start) {
  const IrNode *n = m->nodes[i];
  *start = 0;
  if (!view_of || view_of[i] < 0 || n->ninputs != 1 ||
      (n->op != IR_OP_RESHAPE && n->op != IR_OP_GROUP_COPY && n->op != IR_OP_SLICE) ||
      (p->arenas.unread && p->arenas.unread[i]))
    return -1;
  int x = view_of[i];
  if (x != n->inputs[0]->id || n->op == IR_OP_SLICE) {
    *start = sub_view_start(m, p, pos, x, i);
    return *start >= 0 ? x : -1;
  }
  if (p->offset[x] < 0 || at(pos, x) >= at(pos, i) || !fits_over(m, p, x, i, 1)) return -1;
  return x;
}

/* A byte group for repack: a buffer that took bytes of its own (root) with
 * the nodes written over it or sharing it, alive over positions [s, e]. */
typedef struct {
  int root, s, e;
  int rank;       /* placing order's first key (repack's variants) */
  int64_t size, off;
  uint64_t where; /* the arenas holding it (bufplan_group_where) */
} Block;

static int by_rank_size(const void *a, const void *b) {
  const Block *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  return x->s != y->s ? (x->s < y->s ? -1 : 1) : x->root - y->root;
}

/* A layout's cost (bufplan.h): arena s's end (the most offset + size of the
 * groups it holds) times its weight; the sum of those plus the largest (the
 * rank allocating most counts twice: lowering it is worth raising the others
 * as much, twice over), then the largest, then the largest end, compared in
 * that order.  Without arenas: the peak. */
typedef struct {
  int64_t most, sum, peak;
} Cost;

static int cheaper(Cost a, Cost b) {
  if (a.most + a.sum != b.most + b.sum) return a.most + a.sum < b.most + b.sum;
  if (a.most != b.most) return a.most < b.most;
  return a.peak < b.peak;
}

static int narenas_of(const BufPlan *p) { return p->narenas > 0 ? p->narenas : 1; }

/* end[s] for s < na: at least top where `where` holds arena s */
static void reach(int64_t *end, int na, uint64_t where, int64_t top) {
  for (int s = 0; s < na; s++)
    if ((where >> s & 1) && top > end[s]) end[s] = top;
}

static Cost weigh(const BufPlan *p, const int64_t *end) {
  Cost c = {0, 0, 0};
  for (int s = 0; s < narenas_of(p); s++) {
    int64_t w = (p->arenas.weight ? p->arenas.weight[s] : 1) * end[s];
    if (w > c.most) c.most = w;
    c.sum += w;
    if (end[s] > c.peak) c.peak = end[s];
  }
  return c;
}

/* The cost of p's layout as it stands (p->narenas set) */
static Cost plan_cost(IrModule *m, const BufPlan *p) {
  int na = narenas_of(p);
  uint64_t *gw = arena_alloc(&m->arena, sizeof(uint64_t) * (size_t)(m->nnodes + 1));
  int64_t *end = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)na);
  memset(end, 0, sizeof(int64_t) * (size_t)na);
  bufplan_group_where(m, p, gw);
  for (int i = 0; i < m->nnodes; i++)
    if (p->offset[i] >= 0) reach(end, na, gw[i], p->offset[i] + p->size[i]);
  return weigh(p, end);
}

/* Places b[0..nb) in their order, each at the lowest offset clear of every
 * group already placed whose life, and one of whose arenas, it shares
 * (order: nb pointers of room).  Lives are inclusive: a group born at t and
 * one dying at t never share a byte (a kernel reads its inputs while it
 * writes), as in the time-order pass. */
static void place(Block *b, int nb, Block **order) {
  /* `order`: the groups placed so far by offset (ties: placing order), kept
   * sorted by insertion, so each group scans them once: O(nb^2) in all */
  for (int k = 0; k < nb; k++) {
    int64_t off = 0;
    for (int j = 0; j < k; j++) {
      const Block *q = order[j];
      if (!(q->s <= b[k].e && b[k].s <= q->e) || !(q->where & b[k].where))
        continue; /* lives (or arenas) apart */
      if (q->off >= off + b[k].size) break;
      if (q->off + q->size > off) off = q->off + q->size;
    }
    b[k].off = off;
    int at_k = k; /* after every group at an offset <= off */
    while (at_k > 0 && order[at_k - 1]->off > off) {
      order[at_k] = order[at_k - 1];
      at_k--;
    }
    order[at_k] = &b[k];
  }
}

/* Best fit in time order places each buffer knowing only the past, and can
 * leave gaps no later buffer fits (GPT-2: 4% above the live peak).  This
 * places the same byte groups again, largest first, each at the lowest
 * offset clear of every group already placed whose life overlaps its own
 * (greedy by size), and keeps whichever layout costs less.  Groups no arena
 * holds together (BufArenas) are apart whatever their lives: the one pass
 * that lets a pipeline's stages reuse each other's bytes.  With arenas, a
 * group two stages hold (a value sent between them) sits at one offset on
 * both, where the first stage to place it put it; largest first can put it
 * high for one stage's sake and so lift the other's end (GPT-2 --pp 4: stage
 * 2's slot 64% above its values).  So three more orders are tried, by a
 * first key before size: the groups of several arenas first; the arenas by
 * weight, heaviest first (each group with the first of its arenas in that
 * order); and both, those keys in that order. */
static void repack(IrModule *m, BufPlan *p, const int *pos) {
  int n = m->nnodes, nb = 0;
  int *root = arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 1));
  int *slot = arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 1));
  Block *b = arena_alloc(&m->arena, sizeof(Block) * (size_t)(n + 1));
  uint64_t *gw = arena_alloc(&m->arena, sizeof(uint64_t) * (size_t)(n + 1));
  bufplan_group_where(m, p, gw);
  /* aliases point at earlier nodes: roots come first; an assembled concat's
   * parts (bufplan.h) are in its group, the concat a later node */
  for (int i = 0; i < n; i++) {
    slot[i] = -1;
    if (p->offset[i] >= 0)
      root[i] = p->part_of[i] >= 0 ? p->part_of[i] : p->alias[i] >= 0 ? root[p->alias[i]] : i;
  }
  for (int i = 0; i < n; i++)
    if (p->offset[i] >= 0 && root[i] == i) {
      slot[i] = nb;
      b[nb++] = (Block){i, at(pos, i), p->last_use[i], 0, p->size[i], 0, gw[i]};
    }
  for (int i = 0; i < n; i++) {
    if (p->offset[i] < 0 || root[i] == i) continue;
    Block *g = &b[slot[root[i]]];
    if (at(pos, i) < g->s) g->s = at(pos, i);
    if (p->last_use[i] > g->e) g->e = p->last_use[i];
  }
  if (nb < 2) return;
  int na = narenas_of(p);
  /* prio[s]: arena s's place in the heaviest-first order (ties: by index) */
  int prio[64];
  for (int s = 0; s < na; s++) {
    prio[s] = 0;
    for (int t = 0; t < na; t++) {
      int ws = p->arenas.weight ? p->arenas.weight[s] : 1;
      int wt = p->arenas.weight ? p->arenas.weight[t] : 1;
      prio[s] += wt > ws || (wt == ws && t < s);
    }
  }
  Block **order = arena_alloc(&m->arena, sizeof(Block *) * (size_t)nb);
  Block *trial = arena_alloc(&m->arena, sizeof(Block) * (size_t)nb);
  Block *best = arena_alloc(&m->arena, sizeof(Block) * (size_t)nb);
  int64_t *end = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)na);
  Cost best_cost = plan_cost(m, p);
  int found = 0;
  for (int v = 0; v < (p->arenas.where ? 4 : 1); v++) {
    memcpy(trial, b, sizeof(Block) * (size_t)nb);
    for (int k = 0; k < nb; k++) {
      uint64_t w = trial[k].where;
      int first = na; /* the first of its arenas, heaviest first */
      for (int s = 0; s < na; s++)
        if ((w >> s & 1) && prio[s] < first) first = prio[s];
      int several = (w & (w - 1)) != 0;
      trial[k].rank = (v & 1 ? !several * (na + 1) : 0) + (v & 2 ? first : 0);
    }
    qsort(trial, (size_t)nb, sizeof *trial, by_rank_size);
    place(trial, nb, order);
    memset(end, 0, sizeof(int64_t) * (size_t)na);
    for (int k = 0; k < nb; k++) reach(end, na, trial[k].where, trial[k].off + trial[k].size);
    Cost c = weigh(p, end);
    if (cheaper(c, best_cost)) {
      Block *t = best;
      best = trial, trial = t;
      best_cost = c;
      found = 1;
    }
  }
  if (!found) return;
  for (int k = 0; k < nb; k++) slot[best[k].root] = k;
  /* (members keep their place in the group: a sub-range view past its start,
   * an assembled concat's parts) */
  int64_t *rel = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)(n + 1));
  for (int i = 0; i < n; i++)
    if (p->offset[i] >= 0) rel[i] = p->offset[i] - p->offset[root[i]];
  for (int i = 0; i < n; i++)
    if (p->offset[i] >= 0) p->offset[i] = best[slot[root[i]]].off + rel[i];
  p->peak = best_cost.peak;
}

/* The first element of concat c that node x's elements take (x the first
 * node with bytes of its own down input k's reshapes), or -1; c's elements
 * before its axis must be one row (outer 1): its inputs' are then
 * contiguous, one after another. */
static int64_t part_start(const IrNode *c, const IrNode *x) {
  int64_t off = 0;
  if (c->op != IR_OP_CONCAT || ir_dims_product(c, 0, (int)c->ia[0]) != 1) return -1;
  for (int k = 0; k < c->ninputs; k++) {
    const IrNode *y = c->inputs[k];
    while (y != x && y->op == IR_OP_RESHAPE && y->ninputs == 1) y = y->inputs[0];
    if (y == x) return off;
    off += ir_numel(c->inputs[k]);
  }
  return -1;
}

/* Assembled concats while planning (bufplan.h): into[r] = c where node r, a
 * part's byte-group root, is to take c's bytes from byte start[r] on;
 * base[c], c's bytes once its first part took them (else -1); placed[c],
 * its parts placed so far, of nparts[c]; die[c], the last read of any node
 * in them; broken: a part took bytes otherwise (the plan is made again
 * without). */
typedef struct {
  int *into, *nparts, *placed, *die;
  int64_t *start, *base;
  int broken;
} Parts;

/* Fills *q from p->arenas.parts (all or nothing per concat, bufplan.h);
 * returns 0 where no concat qualifies. */
static int plan_parts(IrModule *m, const BufPlan *p, const unsigned char *materialize,
                      const int *view_of, Parts *q) {
  int n = m->nnodes, any = 0;
  const int *parts = p->arenas.parts;
  Arena *a = &m->arena;
  q->into = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  q->nparts = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  q->placed = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  q->die = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  q->start = arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1));
  q->base = arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1));
  q->broken = 0;
  for (int i = 0; i < n; i++) q->into[i] = -1, q->base[i] = -1;
  /* each part's byte-group root r takes its place; nparts[c] counts them, -1
   * once one may not (the concat then has none) */
  for (int i = 0; i < n; i++) {
    int c = parts[i];
    if (c < 0 || q->nparts[c] < 0) continue;
    const IrNode *cn = m->nodes[c];
    int64_t o = part_start(cn, m->nodes[i]);
    int r = i; /* down the views it is to be written over */
    while (view_of && view_of[r] >= 0 && view_of[r] < r) r = view_of[r];
    const IrNode *rn = m->nodes[r];
    int ok = o >= 0 && (4 * o) % BUFPLAN_ALIGN == 0 && q->into[r] < 0 && c > i &&
             has_buffer(cn, materialize) && !(p->narrow && p->narrow[c]) &&
             has_buffer(rn, materialize) && has_buffer(m->nodes[i], materialize) &&
             !(ir_op_info[rn->op].flags & IR_F_INPLACE0) &&
             !(p->narrow && (p->narrow[r] || p->narrow[i])) &&
             node_bytes(rn, p->narrow) == node_bytes(m->nodes[i], p->narrow) &&
             ir_aux_numel(rn) == 0;
    if (!ok) {
      q->nparts[c] = -1;
      continue;
    }
    q->into[r] = c, q->start[r] = 4 * o, q->nparts[c]++;
  }
  for (int r = 0; r < n; r++) { /* all or nothing */
    int c = q->into[r];
    if (c >= 0 && q->nparts[c] != m->nodes[c]->ninputs) q->into[r] = -1;
  }
  for (int c = 0; c < n; c++)
    if (q->nparts[c] > 0 && q->nparts[c] == m->nodes[c]->ninputs) any = 1;
  return any;
}

/* in_place: 0 nothing written over anything (apart), 1 In place, 2 In place
 * and shared views (bufplan.h) */
static int plan_one(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                    const int *pos, const int *held, int in_place, const int *view_of,
                    const unsigned char *narrow, const BufArenas *ar, int fallback, BufPlan *p);
static int plan(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                const int *pos, const int *held, int in_place, const int *view_of,
                const unsigned char *narrow, const BufArenas *ar, int fallback, BufPlan *p);

int bufplan_build(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                  const int *pos, BufPlan *p) {
  return plan(m, materialize, keep, pos, NULL, 1, NULL, NULL, NULL, 1, p);
}

int bufplan_build_views(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                        const int *pos, const int *held, const int *view_of, BufPlan *p) {
  return plan(m, materialize, keep, pos, held, 2, view_of, NULL, NULL, 1, p);
}

int bufplan_build_arenas(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                         const int *pos, const int *held, const int *view_of,
                         const unsigned char *narrow, const BufArenas *ar, BufPlan *p) {
  plan(m, materialize, keep, pos, held, 2, view_of, narrow, ar, 1, p);
  p->narrow = narrow;
  return 0;
}

int bufplan_build_like(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                       const int *pos, const int *held, const int *view_of,
                       const unsigned char *narrow, const BufPlan *like, BufPlan *p) {
  plan(m, materialize, keep, pos, held, like->mode, like->mode ? view_of : NULL, narrow,
       &like->arenas, 0, p);
  p->narrow = narrow;
  return 0;
}

int bufplan_build_apart(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                        const int *pos, const int *held, const BufArenas *ar, BufPlan *p) {
  return plan(m, materialize, keep, pos, held, 0, NULL, NULL, ar, 1, p);
}

/* The node that took the bytes node i (with a buffer) is written over or
 * shares: the root of its byte group. */
static int group_root(const BufPlan *p, int i) {
  while (p->alias[i] >= 0) i = p->alias[i];
  return i;
}

void bufplan_group_where(const IrModule *m, const BufPlan *p, uint64_t *out) {
  const uint64_t *w = p->arenas.where;
  int n = m->nnodes;
  for (int i = 0; i < n; i++) out[i] = 0;
  for (int i = 0; i < n; i++)
    if (p->offset[i] >= 0) out[group_root(p, i)] |= !w || !w[i] ? ~(uint64_t)0 : w[i];
  for (int i = 0; i < n; i++)
    if (p->offset[i] >= 0) out[i] = out[group_root(p, i)];
}

/* The most bytes any one arena holds at once: per arena (into
 * p->arena_live), the groups it holds, each live from its root's write to
 * its last member's read. */
static int64_t arenas_live_peak(IrModule *m, BufPlan *p, const int *pos, int end) {
  int n = m->nnodes;
  uint64_t *gw = arena_alloc(&m->arena, sizeof(uint64_t) * (size_t)(n + 1));
  int *die = arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 1));
  int64_t *delta = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)(end + 2));
  bufplan_group_where(m, p, gw);
  uint64_t any = 1; /* the arenas named (bit 0 at least) */
  for (int i = 0; i < n; i++) die[i] = -1;
  for (int i = 0; i < n; i++) {
    if (p->offset[i] < 0) continue;
    int r = group_root(p, i);
    if (p->last_use[i] > die[r]) die[r] = p->last_use[i];
    if (gw[i] != ~(uint64_t)0) any |= gw[i];
  }
  int64_t best = 0;
  p->narenas = 0;
  while (p->narenas < 64 && any >> p->narenas) p->narenas++;
  p->arena_live = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)p->narenas);
  for (int s = 0; s < p->narenas; s++) {
    memset(delta, 0, sizeof(int64_t) * (size_t)(end + 2));
    for (int r = 0; r < n; r++)
      if (p->offset[r] >= 0 && p->alias[r] < 0 && (gw[r] >> s & 1)) {
        delta[at(pos, r)] += p->size[r];
        delta[die[r] + 1] -= p->size[r];
      }
    int64_t now = 0;
    p->arena_live[s] = 0;
    for (int t = 0; t <= end; t++) {
      now += delta[t];
      if (now > p->arena_live[s]) p->arena_live[s] = now;
    }
    if (p->arena_live[s] > best) best = p->arena_live[s];
  }
  return best;
}

static int plan_one(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                const int *pos, const int *held, int in_place, const int *view_of,
                const unsigned char *narrow, const BufArenas *ar, int fallback, BufPlan *p) {
  int n = m->nnodes;
  Arena *a = &m->arena;
  memset(p, 0, sizeof *p);
  p->mode = in_place;
  p->view_of = in_place ? view_of : NULL;
  p->narrow = narrow; /* (fits_over reads it while planning) */
  if (ar) p->arenas = *ar;
  const unsigned char *unread = p->arenas.unread;
  p->offset = arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1));
  p->size = arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1));
  p->last_use = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  p->alias = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  p->part_of = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  /* handed[x]: x's bytes went to its in-place result, which frees them */
  unsigned char *handed = arena_alloc(a, (size_t)n + 1);
  /* byte groups of shared views: root[i], the node that took the bytes
   * (itself when none is shared); gdie[r], the last death in r's group;
   * grouped[r], r's bytes are shared (no node is written over them) */
  int *root = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *gdie = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  unsigned char *grouped = arena_alloc(a, (size_t)n + 1);
  int end = 0; /* one past the last position */
  for (int i = 0; i < n; i++) {
    p->offset[i] = -1;
    p->alias[i] = -1;
    p->part_of[i] = -1;
    p->last_use[i] = at(pos, i);
    root[i] = i;
    if (at(pos, i) + 1 > end) end = at(pos, i) + 1;
  }
  const unsigned char *via_acc = p->arenas.via_acc, *acc_reader = p->arenas.acc_reader;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < m->nodes[i]->ninputs && !(unread && unread[i]); k++) {
      int j = m->nodes[i]->inputs[k]->id;
      if (via_acc && acc_reader && via_acc[j] && acc_reader[i]) continue; /* not its bytes */
      if (at(pos, i) > p->last_use[j]) p->last_use[j] = at(pos, i);
      /* an asynchronous reader: its input until its wait (bufplan_check then
       * keeps every later write off it, as for any live buffer) */
      if (held && held[i] > p->last_use[j]) p->last_use[j] = held[i] < end ? held[i] : end;
    }
  for (int i = 0; i < n; i++)
    if ((keep && keep[i]) || m->nodes[i] == m->loss) p->last_use[i] = end;

  /* nodes by position (stable in id), and buffers by the position after
   * which they die, as linked lists */
  int *def_head = arena_alloc(a, sizeof(int) * (size_t)(end + 1));
  int *def_next = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *die_head = arena_alloc(a, sizeof(int) * (size_t)(end + 1));
  int *die_next = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  for (int t = 0; t <= end; t++) def_head[t] = die_head[t] = -1;
  for (int i = n - 1; i >= 0; i--) {
    def_next[i] = def_head[at(pos, i)];
    def_head[at(pos, i)] = i;
  }
  /* assembled concats (bufplan.h): with In place, one arena, parts named */
  Parts q = {0};
  int parts = in_place && p->arenas.parts && !p->arenas.where &&
              plan_parts(m, p, materialize, view_of, &q);
  FreeList f = {0};
  int64_t live = 0;
  for (int t = 0; t < end; t++) {
    for (int i = def_head[t]; i >= 0; i = def_next[i]) {
      if (!has_buffer(m->nodes[i], materialize)) continue;
      int64_t bytes = node_bytes(m->nodes[i], narrow); /* sdpa: lse after out */
      p->size[i] = (bytes + BUFPLAN_ALIGN - 1) / BUFPLAN_ALIGN * BUFPLAN_ALIGN;
      int x = in_place ? in_place_input(m, p, pos, held, view_of, i) : -1;
      if (x >= 0 && grouped[root[x]]) x = -1; /* a shared view may still read them */
      int64_t start = 0; /* (a sub-range view's first byte in s's) */
      int s = in_place == 2 && x < 0 ? shared_view_input(m, p, pos, view_of, i, &start) : -1;
      if (x >= 0 || (s >= 0 && !start && fits_over(m, p, s, i, 1)))
        p->size[i] = p->size[x >= 0 ? x : s]; /* (fits_over) */
      /* (a part, or its concat, written over or sharing other bytes; or a view
       * sharing a part's) */
      if (parts && (((x >= 0 || s >= 0) && (q.into[i] >= 0 || q.base[i] >= 0)) ||
                    (s >= 0 && p->part_of[root[s]] >= 0)))
        q.broken = 1;
      if (x >= 0) {
        p->offset[i] = p->offset[x];
        p->alias[i] = x;
        handed[x] = 1;
      } else if (s >= 0) { /* joins s's group; the root frees the bytes */
        int r = root[s];
        p->offset[i] = p->offset[s] + start;
        p->alias[i] = s;
        root[i] = r;
        grouped[r] = 1;
        if (p->last_use[i] > gdie[r]) gdie[r] = p->last_use[i];
        continue;
      } else if (parts && q.into[i] >= 0) { /* a part: its concat's bytes */
        int c = q.into[i];
        if (q.base[c] < 0) { /* (the first: the concat's whole range taken now) */
          int64_t cb = node_bytes(m->nodes[c], narrow);
          p->size[c] = (cb + BUFPLAN_ALIGN - 1) / BUFPLAN_ALIGN * BUFPLAN_ALIGN;
          q.base[c] = take(&f, p->size[c]);
          live += p->size[c];
          if (live > p->live_peak) p->live_peak = live;
        }
        p->offset[i] = q.base[c] + q.start[i];
        q.placed[c]++;
      } else if (parts && q.base[i] >= 0) { /* the concat: its parts' bytes */
        p->offset[i] = q.base[i];
        p->part_of[i] = i;
        if (q.placed[i] != q.nparts[i]) q.broken = 1;
        int d = p->last_use[i] > q.die[i] ? p->last_use[i] : q.die[i];
        gdie[i] = d; /* (the concat frees its whole range) */
        die_next[i] = die_head[d];
        die_head[d] = i;
        continue;
      } else {
        p->offset[i] = take(&f, p->size[i]);
        live += p->size[i];
        if (live > p->live_peak) p->live_peak = live;
      }
      if (parts && (q.into[i] >= 0 || (x >= 0 && p->part_of[x] >= 0))) {
        /* in a concat's bytes (a part, or written over one): they go with it */
        int c = q.into[i] >= 0 ? q.into[i] : p->part_of[x];
        p->part_of[i] = c;
        if (p->last_use[i] > q.die[c]) q.die[c] = p->last_use[i];
        continue;
      }
      int d = p->last_use[i];
      gdie[i] = d;
      die_next[i] = die_head[d];
      die_head[d] = i;
    }
    for (int j = die_head[t], next; j >= 0; j = next) {
      next = die_next[j];
      if (handed[j]) continue;
      if (gdie[j] > t) { /* a view sharing j's bytes reads on */
        die_next[j] = die_head[gdie[j]];
        die_head[gdie[j]] = j;
        continue;
      }
      give(a, &f, p->offset[j], p->size[j]);
      live -= p->size[j];
    }
  }
  p->peak = f.end;
  if (parts && q.broken) { /* as planned, or not at all: again without */
    BufArenas none = p->arenas;
    none.parts = NULL;
    return plan_one(m, materialize, keep, pos, held, in_place, view_of, narrow, &none, fallback,
                    p);
  }
  /* (the time-order pass placed every arena's buffers in one: sound for
   * each, and repack lets arenas share bytes) */
  if (p->arenas.where) p->live_peak = arenas_live_peak(m, p, pos, end);
  repack(m, p, pos);
  if (!fallback) return 0;
  /* Best fit is a heuristic: another layout can fragment more than the bytes
   * in place saves (tiny models, where no buffer dominates).  Neither shared
   * views nor in place cost arena: where the plan without shared views
   * costs less (Cost), it is the plan (its reshapes copy), and so is the plan
   * apart where that costs less still. */
  int any = 0, shared = 0;
  for (int i = 0; i < n; i++) any |= p->alias[i] >= 0 || p->part_of[i] == i, shared |= grouped[i];
  if (in_place == 2 && shared) {
    BufPlan fewer; /* (itself costing no more than apart) */
    plan_one(m, materialize, keep, pos, held, 1, view_of, narrow, ar, 1, &fewer);
    if (cheaper(plan_cost(m, &fewer), plan_cost(m, p))) *p = fewer;
    return 0;
  }
  if (any) {
    BufPlan apart;
    plan_one(m, materialize, keep, pos, held, 0, NULL, narrow, ar, 1, &apart);
    if (cheaper(plan_cost(m, &apart), plan_cost(m, p))) *p = apart;
  }
  return 0;
}

/* plan_one, and where it may assemble concats (bufplan.h) and fall back,
 * the same without: the one that costs less (a tie: with, no copy), so that
 * assembling never grows the cost either (a bucket's bytes are taken from
 * its first part on, through the backward pass, where the copy took them
 * at its end; and the other choices of plan_one are made again without);
 * in between, fewer concats assembled (GPT-2 --dp 2: all its buckets but
 * the tied embedding's, whose first part, the head's gradient, is the
 * backward's first value). */
static int plan(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                const int *pos, const int *held, int in_place, const int *view_of,
                const unsigned char *narrow, const BufArenas *ar, int fallback, BufPlan *p) {
  plan_one(m, materialize, keep, pos, held, in_place, view_of, narrow, ar, fallback, p);
  if (!fallback || !in_place || !ar || !ar->parts) return 0;
  BufArenas none = *ar;
  none.parts = NULL;
  BufPlan without;
  plan_one(m, materialize, keep, pos, held, in_place, view_of, narrow, &none, 1, &without);
  /* where assembling costs more, the concat whose bytes are taken earliest
   * (its first part written longest before it) is left to copy, one at a
   * time, while that costs more still */
  int n = m->nnodes, *parts = NULL;
  while (cheaper(plan_cost(m, &without), plan_cost(m, p))) {
    int drop = -1, first = INT_MAX;
    for (int i = 0; i < n; i++) {
      int c = p->part_of[i];
      if (c >= 0 && c != i && at(pos, i) < first) first = at(pos, i), drop = c;
    }
    if (drop < 0) {
      *p = without;
      return 0;
    }
    if (!parts) {
      parts = arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 1));
      memcpy(parts, ar->parts, sizeof(int) * (size_t)n);
    }
    for (int i = 0; i < n; i++)
      if (parts[i] == drop) parts[i] = -1;
    BufArenas fewer = *ar;
    fewer.parts = parts;
    plan_one(m, materialize, keep, pos, held, in_place, view_of, narrow, &fewer, fallback, p);
  }
  return 0;
}

static int check(const IrModule *m, const BufPlan *p, const int *pos, const uint64_t *gw,
                 char *why, size_t len);

/* 1 if n, aliased to x, is a sub-range view: a slice (nothing is written
 * over its input), or a reshape of something else than x */
static int sub_view(const IrNode *n, int x) {
  return n->op == IR_OP_SLICE || (n->op == IR_OP_RESHAPE && n->inputs[0]->id != x);
}

int bufplan_check(const IrModule *m, const BufPlan *p, const int *pos, char *why, size_t len) {
  uint64_t *gw = malloc(sizeof *gw * ((size_t)m->nnodes + 1));
  if (!gw) {
    snprintf(why, len, "out of memory");
    return -1;
  }
  bufplan_group_where(m, p, gw);
  int rc = check(m, p, pos, gw, why, len);
  free(gw);
  return rc;
}

static int check(const IrModule *m, const BufPlan *p, const int *pos, const uint64_t *gw,
                 char *why, size_t len) {
  for (int i = 0; i < m->nnodes; i++) {
    if (p->offset[i] < 0) continue;
    int x = p->alias[i];
    const IrNode *n = m->nodes[i];
    if (x >= 0 && n->op == IR_OP_RESHAPE && n->inputs[0]->id == x &&
        p->offset[x] == p->offset[i]) { /* a view: x's bytes, written before */
      if (!(n->ninputs == 1 && p->size[x] == p->size[i] && at(pos, x) < at(pos, i))) {
        snprintf(why, len, "node %%%d is a view of %%%d, which it may not be", i, x);
        return -1;
      }
    } else if (x >= 0 && sub_view(n, x)) { /* a sub-range view: its range of x's bytes */
      int64_t off = bufplan_view_offset(n, m->nodes[x]);
      if (!(p->view_of && p->view_of[i] == x && off >= 0 &&
            p->offset[i] == p->offset[x] + 4 * off &&
            p->offset[i] + p->size[i] <= p->offset[x] + p->size[x] && at(pos, x) < at(pos, i))) {
        snprintf(why, len, "node %%%d is a view of a range of %%%d, which it may not be", i, x);
        return -1;
      }
    } else if (x >= 0) { /* In place: the conditions in_place_input checked (a
                          * planned view: x's bytes hold it, no kernel writes it) */
      int ok = ((ir_op_info[n->op].flags & IR_F_INPLACE0) || (p->view_of && p->view_of[i] == x)) &&
               n->ninputs > 0 &&
               n->inputs[0]->id == x && p->offset[x] == p->offset[i] &&
               p->size[x] == p->size[i] && p->last_use[x] == at(pos, i) &&
               at(pos, x) < at(pos, i);
      for (int r = 0; ok && r < m->nnodes; r++)
        for (int k = 0; ok && k < m->nodes[r]->ninputs; k++)
          if (m->nodes[r]->inputs[k]->id == x && (r != i || k != 0))
            ok = at(pos, r) < at(pos, i);
      if (!ok) {
        snprintf(why, len, "node %%%d is written over %%%d, which it may not be", i, x);
        return -1;
      }
    }
    if (p->part_of && p->part_of[i] == i) { /* assembled: each part where it goes */
      for (int k = 0; k < n->ninputs; k++) {
        const IrNode *y = n->inputs[k];
        while (p->offset[y->id] < 0 && y->op == IR_OP_RESHAPE && y->ninputs == 1) y = y->inputs[0];
        int64_t o = part_start(n, y);
        if (o < 0 || p->offset[y->id] != p->offset[i] + 4 * o || p->part_of[y->id] != i ||
            at(pos, y->id) >= at(pos, i)) {
          snprintf(why, len, "concat %%%d is not assembled where %%%d is", i, y->id);
          return -1;
        }
      }
    } else if (p->part_of && p->part_of[i] >= 0) { /* in its concat's bytes */
      int c = p->part_of[i];
      if (p->part_of[c] != c || p->offset[i] < p->offset[c] ||
          p->offset[i] + p->size[i] > p->offset[c] + p->size[c] || at(pos, i) >= at(pos, c)) {
        snprintf(why, len, "node %%%d is outside concat %%%d's bytes", i, c);
        return -1;
      }
    }
    if (p->offset[i] + p->size[i] > p->peak || p->offset[i] % BUFPLAN_ALIGN) {
      snprintf(why, len, "node %%%d: [%lld, +%lld) outside the arena or misaligned", i,
               (long long)p->offset[i], (long long)p->size[i]);
      return -1;
    }
    for (int j = 0; j < m->nnodes; j++) {
      if (j == i || p->offset[j] < 0) continue;
      /* j is written while i is live: at or after i's write, up to i's last read
       * (j written over i in place, by i's last reader, is i's successor; a
       * view writes nothing: its bytes hold its input, checked as that) */
      int ti = at(pos, i), tj = at(pos, j);
      if (tj < ti || tj > p->last_use[i] || p->alias[j] == i) continue;
      if (p->alias[j] >= 0 && (m->nodes[j]->op == IR_OP_RESHAPE || m->nodes[j]->op == IR_OP_SLICE))
        continue;
      /* (an assembled concat writes nothing: its bytes hold its parts) */
      if (p->part_of && p->part_of[j] == j && p->part_of[i] == j) continue;
      if (!(gw[i] & gw[j])) continue; /* no arena holds both */
      int overlap = p->offset[i] < p->offset[j] + p->size[j] &&
                    p->offset[j] < p->offset[i] + p->size[i];
      if (overlap) {
        snprintf(why, len, "nodes %%%d and %%%d are live together and share bytes", i, j);
        return -1;
      }
    }
  }
  return 0;
}
