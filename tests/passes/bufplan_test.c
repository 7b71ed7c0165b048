/* tests/passes/bufplan_test.c -- the buffer planner never lets a live value
 * be overwritten.  Each plan is checked twice: by bufplan_check, and by
 * running it: every node stamps its bytes with its id in a real arena of the
 * planned size, and every read verifies its operand's stamp is intact. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/bufplan.h"
#include "tests/support/load.h"

static int failures, checks;

static void fail(const char *what, const char *why) {
  printf("FAIL %s: %s\n", what, why);
  failures++;
}

/* A view (a reshape or a slice with an alias) writes nothing: its bytes hold
 * the stamp of the first node up its chain of views that wrote them. */
static int writer(const IrModule *m, const BufPlan *p, int j) {
  while (p->alias[j] >= 0 &&
         (m->nodes[j]->op == IR_OP_RESHAPE || m->nodes[j]->op == IR_OP_SLICE))
    j = p->alias[j];
  return j;
}

/* 1 if assembled concat c (part_of[c] == c) writes nothing */
static int assembled(const BufPlan *p, int c) { return p->part_of && p->part_of[c] == c; }

/* 1 if operand j's stamp is intact (or it has no buffer); an assembled
 * concat's bytes hold its parts', each part's its own. */
static int intact(const IrModule *m, const BufPlan *p, const uint32_t *mem, int j) {
  if (p->offset[j] < 0) return 1;
  if (assembled(p, j)) {
    int64_t covered = 0;
    for (int i = 0; i < m->nnodes; i++)
      if (i != j && p->part_of[i] == j && p->alias[i] < 0) {
        if (!intact(m, p, mem, i)) return 0;
        covered += 4 * ir_numel(m->nodes[i]);
      }
    return covered == 4 * ir_numel(m->nodes[j]);
  }
  uint32_t stamp = (uint32_t)writer(m, p, j) + 1;
  for (int64_t w = p->offset[j] / 4; w < (p->offset[j] + p->size[j]) / 4; w++)
    if (mem[w] != stamp) return 0;
  return 1;
}

/* Executes the plan on stamps, position by position (in id order within
 * one): each node first checks its operands' stamps, then stamps its own
 * bytes (a view stamps nothing); a node with held[i] >= 0 (an asynchronous reader) also checks them
 * after every position up to held[i].  Returns 0 if no value was clobbered
 * before its last read. */
static int simulate(const IrModule *m, const BufPlan *p, const int *pos, const int *held,
                    const char *what) {
  uint32_t *mem = calloc((size_t)p->peak / 4 + 1, 4);
  int bad = 0, end = 0;
  char why[160];
  for (int i = 0; i < m->nnodes; i++)
    if ((pos ? pos[i] : i) + 1 > end) end = (pos ? pos[i] : i) + 1;
  for (int t = 0; t < end && !bad; t++) {
    for (int i = 0; i < m->nnodes && !bad; i++) {
      if ((pos ? pos[i] : i) != t) continue;
      const IrNode *n = m->nodes[i];
      for (int k = 0; k < n->ninputs && !bad; k++) {
        int j = n->inputs[k]->id;
        if (!intact(m, p, mem, j)) {
          snprintf(why, sizeof why, "node %%%d read %%%d after it was overwritten", i, j);
          fail(what, why);
          bad = 1;
        }
      }
      if (p->offset[i] >= 0 && writer(m, p, i) == i && !assembled(p, i))
        for (int64_t w = p->offset[i] / 4; w < (p->offset[i] + p->size[i]) / 4; w++)
          mem[w] = (uint32_t)i + 1;
    }
    /* the asynchronous readers still running after position t */
    for (int i = 0; held && i < m->nnodes && !bad; i++) {
      if ((pos ? pos[i] : i) > t || held[i] < t) continue;
      for (int k = 0; k < m->nodes[i]->ninputs && !bad; k++)
        if (!intact(m, p, mem, m->nodes[i]->inputs[k]->id)) {
          snprintf(why, sizeof why, "asynchronous %%%d: input %%%d overwritten at position %d",
                   i, m->nodes[i]->inputs[k]->id, t);
          fail(what, why);
          bad = 1;
        }
    }
  }
  free(mem);
  return bad;
}

static int aliases; /* nodes written over an input, over all the plans checked */
static int shared;  /* of them, views whose input is read after them */

static void check_plan_views(IrModule *m, const unsigned char *mat, const unsigned char *keep,
                             const int *pos, const int *held, const int *view_of,
                             const char *what) {
  BufPlan p;
  char why[256];
  bufplan_build_views(m, mat, keep, pos, held, view_of, &p);
  for (int i = 0; i < m->nnodes; i++) {
    aliases += p.alias[i] >= 0;
    shared += p.alias[i] >= 0 && p.last_use[p.alias[i]] > (pos ? pos[i] : i);
  }
  checks++;
  if (bufplan_check(m, &p, pos, why, sizeof why)) fail(what, why);
  checks++;
  simulate(m, &p, pos, held, what);
  checks++;
  int64_t total = 0;
  for (int i = 0; i < m->nnodes; i++) total += p.offset[i] >= 0 ? p.size[i] : 0;
  if (p.peak < p.live_peak || p.peak > total) {
    snprintf(why, sizeof why, "peak %lld outside [live peak %lld, sum %lld]", (long long)p.peak,
             (long long)p.live_peak, (long long)total);
    fail(what, why);
  }
  /* In place never costs bytes: each alias saves its node's, at no later death */
  BufPlan apart;
  bufplan_build_apart(m, mat, keep, pos, held, NULL, &apart);
  checks++;
  if (p.live_peak > apart.live_peak) {
    snprintf(why, sizeof why, "live peak %lld in place, %lld apart", (long long)p.live_peak,
             (long long)apart.live_peak);
    fail(what, why);
  }
}

static void check_plan(IrModule *m, const unsigned char *mat, const unsigned char *keep,
                       const int *pos, const int *held, const char *what) {
  check_plan_views(m, mat, keep, pos, held, NULL, what);
}

static IrNode *leaf(IrModule *m, int64_t len, int id) {
  IrNode *n = ir_add(m, IR_OP_INPUT, NULL, 0);
  char *name = arena_printf(&m->arena, "x%d", id);
  n->name = name;
  n->dtype = IR_F32;
  n->rank = 1;
  n->shape[0] = len;
  return n;
}

/* A random DAG of elementwise ops over a few shape families. */
static IrModule *random_dag(unsigned seed, int nodes) {
  srand(seed);
  IrModule *m = ir_module_new("random");
  enum { FAMILIES = 4 };
  IrNode *last[FAMILIES][8];
  int count[FAMILIES] = {0};
  for (int f = 0; f < FAMILIES; f++) last[f][count[f]++] = leaf(m, 16 * (f + 1) + f, f);
  for (int i = 0; i < nodes; i++) {
    int f = rand() % FAMILIES;
    IrNode *a = last[f][rand() % count[f]], *b = last[f][rand() % count[f]];
    IrNode *in[2] = {a, b};
    int binary = rand() % 2;
    IrNode *n = ir_add(m, binary ? IR_OP_ADD : IR_OP_GELU, in, binary ? 2 : 1);
    char why[128];
    ir_infer(n, why, sizeof why);
    if (count[f] < 8) last[f][count[f]++] = n;
    else last[f][rand() % 8] = n;
  }
  return m;
}

static IrNode *leaf2(IrModule *m, IrDType t, int rank, int64_t d0, int64_t d1, const char *name) {
  IrNode *n = ir_add(m, IR_OP_INPUT, NULL, 0);
  n->name = name;
  n->dtype = t;
  n->rank = rank;
  n->shape[0] = d0;
  n->shape[1] = d1;
  return n;
}

/* A random DAG over logits-like [6, 10] values: gelu, add, reshape to [60] and
 * back, and cross_entropy_grad (IR_F_INPLACE0), which may write over its
 * logits.  view_of marks some reshapes as views (as codegen's view_of does).
 * Each op's reads come before its writes, as simulate models them: so a plan
 * with aliases is checked by running it like any other. */
static IrModule *random_inplace_dag(unsigned seed, int nodes, int **view_of) {
  srand(seed);
  IrModule *m = ir_module_new("random_inplace");
  IrNode *tg = leaf2(m, IR_I32, 1, 6, 0, "targets"), *dl = leaf2(m, IR_F32, 0, 0, 0, "dloss");
  IrNode *last[8];
  int count = 0;
  last[count++] = leaf2(m, IR_F32, 2, 6, 10, "logits");
  char why[128];
  for (int i = 0; i < nodes; i++) {
    IrNode *a = last[rand() % count], *b = last[rand() % count], *n;
    int kind = rand() % 4;
    if (kind == 0) {
      IrNode *in[3] = {a, tg, dl};
      n = ir_add(m, IR_OP_CROSS_ENTROPY_GRAD, in, 3);
    } else if (kind == 1) { /* a round trip through [60]: two reshapes */
      IrNode *flat = ir_add(m, IR_OP_RESHAPE, &a, 1);
      flat->rank = 1, flat->shape[0] = 60;
      ir_infer(flat, why, sizeof why);
      n = ir_add(m, IR_OP_RESHAPE, &flat, 1);
      n->rank = 2, n->shape[0] = 6, n->shape[1] = 10;
    } else {
      IrNode *in[2] = {a, b};
      n = ir_add(m, kind == 2 ? IR_OP_ADD : IR_OP_GELU, in, kind == 2 ? 2 : 1);
    }
    if (!ir_infer(n, why, sizeof why)) fail("random in-place dag", why);
    if (count < 8) last[count++] = n;
    else last[rand() % 8] = n;
  }
  *view_of = calloc((size_t)m->nnodes, sizeof(int));
  for (int i = 0; i < m->nnodes; i++)
    (*view_of)[i] = m->nodes[i]->op == IR_OP_RESHAPE && rand() % 2 ? m->nodes[i]->inputs[0]->id
                                                                   : -1;
  return m;
}

/* Several arenas (BufArenas): each node runs on one of three arenas
 * (run[i]), holds its bytes there and on every arena whose nodes read it
 * (a pipeline's sent and received values), and a few never run (unread).
 * Each arena is executed on stamps apart from the others, over the one plan:
 * its nodes check their operands and stamp their bytes (a view, its
 * input's stamp), and a value it holds but another arena computes is stamped
 * where it is defined (received as early as it can be).  Returns 1 if some arena's value was clobbered. */
static int simulate_arenas(const IrModule *m, const BufPlan *p, const int *pos, const int *run,
                           const char *what) {
  const uint64_t *where = p->arenas.where;
  const unsigned char *unread = p->arenas.unread;
  int end = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (pos[i] + 1 > end) end = pos[i] + 1;
  for (int s = 0; s < 3; s++) {
    uint32_t *mem = calloc((size_t)p->peak / 4 + 1, 4);
    for (int t = 0; t < end; t++)
      for (int i = 0; i < m->nnodes; i++) {
        if (pos[i] != t) continue;
        const IrNode *n = m->nodes[i];
        for (int k = 0; run[i] == s && !unread[i] && k < n->ninputs; k++) {
          int j = n->inputs[k]->id;
          if (!intact(m, p, mem, j)) {
            char why[160];
            snprintf(why, sizeof why, "arena %d: node %%%d read %%%d after it was overwritten",
                     s, i, j);
            fail(what, why);
            free(mem);
            return 1;
          }
        }
        /* (a view another arena made arrives like any value it receives) */
        int own = writer(m, p, i) == i || run[i] != s;
        if (p->offset[i] >= 0 && own && (where[i] >> s & 1))
          for (int64_t w = p->offset[i] / 4; w < (p->offset[i] + p->size[i]) / 4; w++)
            mem[w] = (uint32_t)writer(m, p, i) + 1;
      }
    free(mem);
  }
  return 0;
}

/* Each arena's live peak, counted plainly: at every position, the bytes of
 * the byte groups (a root and the nodes written over it or sharing it) it
 * holds that are live then, from the root's write to the last read of any
 * member.  Fails what where p->arena_live or p->live_peak differ. */
static void check_arena_live(const IrModule *m, const BufPlan *p, const int *pos,
                             const char *what) {
  int n = m->nnodes, end = 0;
  for (int i = 0; i < n; i++)
    if (pos[i] + 1 > end) end = pos[i] + 1;
  int64_t most = 0;
  for (int s = 0; s < p->narenas; s++) {
    int64_t peak = 0;
    for (int t = 0; t < end; t++) {
      int64_t live = 0;
      for (int r = 0; r < n; r++) {
        if (p->offset[r] < 0 || p->alias[r] >= 0) continue;
        int holds = 0, die = -1;
        for (int j = 0; j < n; j++) {
          int x = j;
          while (p->offset[x] >= 0 && p->alias[x] >= 0) x = p->alias[x];
          if (x != r || p->offset[j] < 0) continue;
          holds |= !p->arenas.where[j] || (p->arenas.where[j] >> s & 1);
          if (p->last_use[j] > die) die = p->last_use[j];
        }
        if (holds && pos[r] <= t && t <= die) live += p->size[r];
      }
      if (live > peak) peak = live;
    }
    if (peak != p->arena_live[s]) {
      char why[128];
      snprintf(why, sizeof why, "arena %d: live peak %lld, counted %lld", s,
               (long long)p->arena_live[s], (long long)peak);
      fail(what, why);
    }
    if (peak > most) most = peak;
  }
  if (most != p->live_peak) fail(what, "live_peak is not the largest arena's");
}

/* Random in-place DAGs over three arenas: sound by bufplan_check and by
 * running each arena; no larger than one arena's plan, and smaller over all
 * of them (arenas share bytes); unread readers keep nothing alive. */
static void check_arenas(void) {
  int64_t one = 0, three = 0, reading = 0;
  for (unsigned seed = 1; seed <= 200; seed++) {
    int *view_of;
    IrModule *m = random_inplace_dag(seed, 6 + (int)(seed % 40), &view_of);
    int n = m->nnodes;
    int *run = calloc((size_t)n, sizeof(int)), *pos = calloc((size_t)n, sizeof(int));
    uint64_t *where = calloc((size_t)n, sizeof(uint64_t));
    unsigned char *unread = calloc((size_t)n, 1), *keep = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
      run[i] = rand() % 3;
      unread[i] = rand() % 10 == 0;
      keep[i] = rand() % 13 == 0;
      where[i] |= (uint64_t)1 << run[i];
      pos[i] = i + rand() % 3;
      for (int k = 0; k < m->nodes[i]->ninputs; k++) {
        int j = m->nodes[i]->inputs[k]->id;
        if (pos[j] > pos[i]) pos[i] = pos[j];
        if (!unread[i]) where[j] |= (uint64_t)1 << run[i];
      }
    }
    char what[64], why[256];
    snprintf(what, sizeof what, "random dag over arenas %u", seed);
    /* (weights: a pipeline's slots a stage, which the layout's choice weighs) */
    int weight[3] = {1 + rand() % 4, 1 + rand() % 4, 1 + rand() % 4};
    BufArenas ar = {.where = where, .unread = unread}, ar1 = {.unread = unread}, ar0 = {0};
    BufArenas arw = {.where = where, .unread = unread, .weight = weight};
    BufPlan p, p1, p0, pw;
    bufplan_build_arenas(m, NULL, keep, pos, NULL, view_of, NULL, &ar, &p);
    bufplan_build_arenas(m, NULL, keep, pos, NULL, view_of, NULL, &ar1, &p1);
    bufplan_build_arenas(m, NULL, keep, pos, NULL, view_of, NULL, &ar0, &p0);
    bufplan_build_arenas(m, NULL, keep, pos, NULL, view_of, NULL, &arw, &pw);
    checks += 8;
    if (bufplan_check(m, &p, pos, why, sizeof why)) fail(what, why);
    simulate_arenas(m, &p, pos, run, what);
    check_arena_live(m, &p, pos, what);
    if (bufplan_check(m, &pw, pos, why, sizeof why)) fail(what, why);
    simulate_arenas(m, &pw, pos, run, what);
    check_arena_live(m, &pw, pos, what);
    if (p.live_peak > p.peak || p.peak > p1.peak) {
      snprintf(why, sizeof why, "live peak %lld, peak %lld, one arena's peak %lld",
               (long long)p.live_peak, (long long)p.peak, (long long)p1.peak);
      fail(what, why);
    }
    /* an unread node's inputs live past it only for another reason */
    for (int i = 0; i < n; i++)
      for (int k = 0; unread[i] && k < m->nodes[i]->ninputs; k++) {
        int j = m->nodes[i]->inputs[k]->id, later = keep[j];
        for (int r = 0; r < n; r++)
          for (int q = 0; !unread[r] && q < m->nodes[r]->ninputs; q++)
            later |= m->nodes[r]->inputs[q]->id == j && pos[r] >= pos[i];
        if (p.offset[j] >= 0 && !later && p.last_use[j] >= pos[i] && p.last_use[j] > pos[j]) {
          snprintf(why, sizeof why, "%%%d lives to %d for unread %%%d at %d", j,
                   p.last_use[j], i, pos[i]);
          fail(what, why);
        }
      }
    one += p1.peak, three += p.peak, reading += p0.peak;
    free(run), free(pos), free(where), free(unread), free(keep), free(view_of);
    ir_module_free(m);
  }
  printf("random dags over 3 arenas: %lld bytes of plans, %lld in one arena, %lld with every "
         "reader read\n", (long long)three, (long long)one, (long long)reading);
  checks += 2;
  if (three >= one) fail("random dags over 3 arenas", "the arenas shared no bytes");
  if (one > reading) fail("random dags over 3 arenas", "unread readers made plans larger");
}

/* arena s's end in p: the most offset + size of the nodes it holds */
static int64_t arena_end(const IrModule *m, const BufPlan *p, int s) {
  int64_t end = 0;
  for (int i = 0; i < m->nnodes; i++) {
    uint64_t w = p->arenas.where[i];
    if (p->offset[i] >= 0 && (!w || (w >> s & 1)) && p->offset[i] + p->size[i] > end)
      end = p->offset[i] + p->size[i];
  }
  return end;
}

/* A value two arenas hold sits at one offset on both.  Arena 0 holds B0 (100
 * blocks of 64 bytes), arena 1 B1 (50), both X (10), all three live to the
 * end.  Largest first puts B0 and B1 at 0 and X above B0, at 100: arena 1
 * then ends at 110 for its 60 blocks live.  Placing X first, at 0, ends each
 * arena at its live peak: 110 and 60. */
static void check_shared_value_low(void) {
  IrModule *m = ir_module_new("shared_value");
  IrNode *in[3] = {leaf(m, 1600, 0), leaf(m, 160, 1), leaf(m, 800, 2)};
  uint64_t where[8] = {0};
  unsigned char keep[8] = {0};
  const uint64_t holders[3] = {1, 3, 2}; /* B0, X, B1 */
  for (int k = 0; k < 3; k++) {
    IrNode *n = ir_add(m, IR_OP_GELU, &in[k], 1);
    char why[128];
    ir_infer(n, why, sizeof why);
    where[n->id] = holders[k];
    keep[n->id] = 1;
  }
  BufArenas ar = {.where = where};
  BufPlan p;
  bufplan_build_arenas(m, NULL, keep, NULL, NULL, NULL, NULL, &ar, &p);
  char why[160];
  checks += 2;
  if (bufplan_check(m, &p, NULL, why, sizeof why)) fail("a value two arenas hold", why);
  if (arena_end(m, &p, 0) != p.arena_live[0] || arena_end(m, &p, 1) != p.arena_live[1]) {
    snprintf(why, sizeof why, "arenas end at %lld and %lld bytes for %lld and %lld live",
             (long long)arena_end(m, &p, 0), (long long)arena_end(m, &p, 1),
             (long long)p.arena_live[0], (long long)p.arena_live[1]);
    fail("a value two arenas hold", why);
  }
  ir_module_free(m);
}

/* A view of sdpa's out (its buffer: out, then the lse, ir_aux_numel) takes
 * those bytes, lse and all, both as a shared view (out read again after it)
 * and in place (the view its last reader), in f32 and with both narrow
 * (bf16, 2 bytes an element; the lse stays 4); never where the view's
 * elements are of another width than out's. */
static void check_sdpa_views(void) {
  for (int variant = 0; variant < 5; variant++) {
    IrModule *m = ir_module_new("sdpa_view");
    IrNode *q = ir_add(m, IR_OP_INPUT, NULL, 0);
    q->name = "q", q->dtype = IR_F32, q->rank = 4;
    q->shape[0] = 2, q->shape[1] = 4, q->shape[2] = 8, q->shape[3] = 16;
    IrNode *y = ir_add(m, IR_OP_ATTENTION, (IrNode *[]){q, q, q}, 3);
    y->ia[0] = 1, y->fa = 0.25f;
    char why[256];
    if (!ir_infer(y, why, sizeof why)) fail("sdpa views", why);
    IrNode *r = ir_add(m, IR_OP_RESHAPE, &y, 1);
    r->rank = 2, r->shape[0] = 2 * 4 * 8, r->shape[1] = 16;
    if (!ir_infer(r, why, sizeof why)) fail("sdpa views", why);
    IrNode *g = ir_add(m, IR_OP_GELU, &r, 1); /* the view's reader */
    ir_infer(g, why, sizeof why);
    int shared_view = variant % 2 == 0; /* out read again after the view */
    if (shared_view) {
      IrNode *again = ir_add(m, IR_OP_GELU, &y, 1);
      ir_infer(again, why, sizeof why);
      (void)again;
    }
    int *view_of = calloc((size_t)m->nnodes, sizeof(int));
    unsigned char *narrow = calloc((size_t)m->nnodes, 1);
    for (int i = 0; i < m->nnodes; i++) view_of[i] = -1;
    view_of[r->id] = y->id;
    int narrow_y = variant >= 2, narrow_r = variant == 2 || variant == 3;
    for (int i = 0; i < m->nnodes; i++) narrow[i] = (unsigned char)narrow_y;
    narrow[r->id] = (unsigned char)narrow_r; /* (the plan apart is no smaller: the
                                                 readers are of out's width) */
    BufPlan p;
    bufplan_build_arenas(m, NULL, NULL, NULL, NULL, view_of, narrow, NULL, &p);
    char what[64];
    snprintf(what, sizeof what, "view of sdpa's out, variant %d", variant);
    int want = narrow_y == narrow_r;
    checks++;
    if ((p.alias[r->id] == y->id) != want)
      fail(what, want ? "the reshape copies out" : "a view of elements of another width");
    checks++;
    if (want && (p.offset[r->id] != p.offset[y->id] || p.size[r->id] != p.size[y->id]))
      fail(what, "the view's bytes are not out's buffer");
    checks++;
    if (bufplan_check(m, &p, NULL, why, sizeof why)) fail(what, why);
    checks++;
    simulate(m, &p, NULL, NULL, what);
    free(view_of), free(narrow);
    ir_module_free(m);
  }
}

/* A data-parallel bucket (passes/dp_grads.c): gradients g_k of k parameters
 * (gelu of a leaf, reading an activation kept since the forward, so lives
 * overlap), concat(reshape(g_k)) c read by an asynchronous all_reduce red,
 * and each parameter's piece reshape(slice(red)) a view of a range of red
 * (view_of[piece] = red), kept to the end; BufArenas.parts names the g_k.
 * Aligned (every n_k a multiple of 16 floats) and alone (no activation):
 * c is assembled (part_of[c] == c, each g_k at c + 4 o_k) and each piece
 * is red's range (at red + 4 o_k); misaligned: neither assembled nor those
 * views (a piece's start off BUFPLAN_ALIGN) -- and every plan passes
 * bufplan_check and runs on stamps (an assembled c writes nothing: its
 * bytes must hold every part's stamp when read). */
static void check_buckets(void) {
  int nassembled = 0, nviews = 0;
  for (int variant = 0; variant < 40; variant++) {
    srand(1000u + (unsigned)variant);
    int aligned = variant % 2 == 0, alone = variant < 4, K = 2 + rand() % 5;
    IrModule *m = ir_module_new("bucket");
    char why[256];
    IrNode *act = leaf2(m, IR_F32, 2, 8, 16, "act"), *x = act;
    if (!alone) { /* activations read by the gradients below */
      IrNode *a = ir_add(m, IR_OP_GELU, &act, 1);
      ir_infer(a, why, sizeof why);
      x = a;
    }
    IrNode *g[8], *flat[8];
    int64_t nk[8], off[8], total = 0;
    for (int k = 0; k < K; k++) {
      int64_t rows = 1 + rand() % 6, cols = aligned ? 16 * (1 + rand() % 3) : 16 + 1 + rand() % 5;
      IrNode *w = leaf2(m, IR_F32, 2, rows, cols, "w");
      IrNode *h = ir_add(m, IR_OP_GELU, &w, 1);
      ir_infer(h, why, sizeof why);
      if (!alone && k % 2 == 0) { /* reads the activation: it lives to here */
        IrNode *s = ir_add(m, IR_OP_SUM, &x, 1);
        s->ia[0] = 1;
        ir_infer(s, why, sizeof why);
        IrNode *r = ir_add(m, IR_OP_RESHAPE, &s, 1);
        r->rank = 0;
        ir_infer(r, why, sizeof why);
        IrNode *b = ir_add(m, IR_OP_BROADCAST, &r, 1);
        b->rank = 2, b->shape[0] = rows, b->shape[1] = cols;
        if (!ir_infer(b, why, sizeof why)) b = h;
        IrNode *in[2] = {h, b};
        h = b == h ? h : ir_add(m, IR_OP_ADD, in, 2);
        ir_infer(h, why, sizeof why);
      }
      g[k] = h, nk[k] = rows * cols, off[k] = total, total += nk[k];
      flat[k] = ir_add(m, IR_OP_RESHAPE, &g[k], 1);
      flat[k]->rank = 1, flat[k]->shape[0] = nk[k];
      if (!ir_infer(flat[k], why, sizeof why)) fail("bucket", why);
    }
    IrNode *c = ir_add(m, IR_OP_CONCAT, flat, K);
    c->ia[0] = 0;
    if (!ir_infer(c, why, sizeof why)) fail("bucket", why);
    IrNode *red = ir_add(m, IR_OP_ALL_REDUCE, &c, 1);
    red->ia[0] = 1, red->ia[1] = 2;
    if (!ir_infer(red, why, sizeof why)) fail("bucket", why);
    IrNode *piece[8];
    for (int k = 0; k < K; k++) {
      IrNode *sl = ir_add(m, IR_OP_SLICE, &red, 1);
      sl->ia[0] = 0, sl->ia[1] = off[k], sl->ia[2] = nk[k];
      ir_infer(sl, why, sizeof why);
      piece[k] = ir_add(m, IR_OP_RESHAPE, &sl, 1);
      piece[k]->rank = 2, piece[k]->shape[0] = g[k]->shape[0], piece[k]->shape[1] = g[k]->shape[1];
      if (!ir_infer(piece[k], why, sizeof why)) fail("bucket", why);
    }
    IrNode *after = ir_add(m, IR_OP_GELU, &x, 1); /* (written while the pieces live) */
    ir_infer(after, why, sizeof why);
    int n = m->nnodes;
    unsigned char *mat = calloc((size_t)n, 1), *keep = calloc((size_t)n, 1);
    int *view_of = calloc((size_t)n, sizeof(int)), *parts = calloc((size_t)n, sizeof(int));
    int *held = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++) {
      mat[i] = m->nodes[i]->op != IR_OP_SLICE && m->nodes[i]->op != IR_OP_RESHAPE;
      view_of[i] = parts[i] = held[i] = -1;
    }
    for (int k = 0; k < K; k++) {
      mat[piece[k]->id] = keep[piece[k]->id] = 1;
      view_of[piece[k]->id] = red->id;
      parts[g[k]->id] = c->id;
    }
    held[red->id] = piece[0]->id; /* (waited for where its first piece reads it) */
    BufArenas ar = {.parts = parts};
    BufPlan p;
    bufplan_build_arenas(m, mat, keep, NULL, held, view_of, NULL, &ar, &p);
    char what[64];
    snprintf(what, sizeof what, "dp bucket, variant %d (%s%s, %d parts)", variant,
             aligned ? "aligned" : "misaligned", alone ? ", alone" : "", K);
    checks++;
    if (bufplan_check(m, &p, NULL, why, sizeof why)) fail(what, why);
    checks++;
    simulate(m, &p, NULL, held, what);
    int is = p.part_of[c->id] == c->id, views = 1, places = 1;
    for (int k = 0; k < K; k++) {
      views &= p.alias[piece[k]->id] == red->id &&
               p.offset[piece[k]->id] == p.offset[red->id] + 4 * off[k];
      places &= !is || p.offset[g[k]->id] == p.offset[c->id] + 4 * off[k];
    }
    nassembled += is, nviews += views;
    checks++;
    if (!places) fail(what, "a part is not where the concat holds it");
    checks++;
    if (aligned && alone && (!is || !views))
      fail(what, !is ? "the bucket is not assembled" : "a piece is not a view of its range");
    checks++;
    if (!aligned && (is || views)) fail(what, "misaligned parts in place");
    free(mat), free(keep), free(view_of), free(parts), free(held);
    ir_module_free(m);
  }
  printf("dp buckets: %d of 40 assembled, %d with their pieces views of the sum\n", nassembled,
         nviews);
}

int main(int argc, char **argv) {
  for (unsigned seed = 1; seed <= 200; seed++) {
    IrModule *m = random_dag(seed, 5 + (int)(seed % 60));
    unsigned char *mat = calloc((size_t)m->nnodes, 1), *keep = calloc((size_t)m->nnodes, 1);
    for (int i = 0; i < m->nnodes; i++) mat[i] = rand() % 4 != 0, keep[i] = rand() % 9 == 0;
    char what[64];
    snprintf(what, sizeof what, "random dag %u", seed);
    /* execution positions as fusion makes them: a node may run later than
     * its id (at its kernel's root), never before what it reads */
    int *pos = calloc((size_t)m->nnodes, sizeof(int));
    for (int i = 0; i < m->nnodes; i++) {
      pos[i] = i + rand() % 4;
      for (int k = 0; k < m->nodes[i]->ninputs; k++)
        if (pos[m->nodes[i]->inputs[k]->id] > pos[i]) pos[i] = pos[m->nodes[i]->inputs[k]->id];
    }
    check_plan(m, NULL, NULL, NULL, NULL, what);
    check_plan(m, mat, keep, NULL, NULL, what);
    check_plan(m, mat, keep, pos, NULL, what);
    /* asynchronous nodes (a collective and its wait): inputs read until held[i] */
    int *held = calloc((size_t)m->nnodes, sizeof(int));
    for (int i = 0; i < m->nnodes; i++) held[i] = rand() % 5 == 0 ? pos[i] + rand() % 12 : -1;
    check_plan(m, mat, keep, pos, held, what);
    free(held);
    free(pos);
    free(mat);
    free(keep);
    ir_module_free(m);
  }
  /* In place: the same checks with nodes written over their inputs */
  int before = aliases, before_shared = shared;
  for (unsigned seed = 1; seed <= 200; seed++) {
    int *view_of;
    IrModule *m = random_inplace_dag(seed, 4 + (int)(seed % 40), &view_of);
    unsigned char *mat = calloc((size_t)m->nnodes, 1), *keep = calloc((size_t)m->nnodes, 1);
    for (int i = 0; i < m->nnodes; i++) mat[i] = rand() % 5 != 0, keep[i] = rand() % 11 == 0;
    char what[64];
    snprintf(what, sizeof what, "random in-place dag %u", seed);
    int *pos = calloc((size_t)m->nnodes, sizeof(int)), *held = calloc((size_t)m->nnodes, sizeof(int));
    for (int i = 0; i < m->nnodes; i++) {
      pos[i] = i + rand() % 3;
      for (int k = 0; k < m->nodes[i]->ninputs; k++)
        if (pos[m->nodes[i]->inputs[k]->id] > pos[i]) pos[i] = pos[m->nodes[i]->inputs[k]->id];
      held[i] = rand() % 6 == 0 ? pos[i] + rand() % 8 : -1;
    }
    check_plan_views(m, NULL, NULL, NULL, NULL, view_of, what);
    check_plan_views(m, mat, keep, pos, NULL, view_of, what);
    check_plan_views(m, mat, keep, pos, held, view_of, what);
    free(pos), free(held), free(mat), free(keep), free(view_of);
    ir_module_free(m);
  }
  checks++;
  printf("random in-place dags: %d nodes written over their inputs, %d of them shared views\n",
         aliases - before, shared - before_shared);
  if (aliases - before < 100) fail("random in-place dags", "fewer than 100 aliases: untested");
  checks++;
  if (shared - before_shared < 50) fail("random in-place dags", "fewer than 50 shared views");

  check_arenas();
  check_shared_value_low();
  check_sdpa_views();
  check_buckets();

  /* real models: a plan must also reuse memory, not just stack buffers */
  const char *const defs[] = {"layers=2"};
  for (int i = 1; i < argc; i++) {
    IrModule *m = test_load(argv[i], defs, 1);
    if (!m) {
      fail(argv[i], "does not compile");
      continue;
    }
    check_plan(m, NULL, NULL, NULL, NULL, argv[i]);
    BufPlan p;
    bufplan_build(m, NULL, NULL, NULL, &p);
    /* an sdpa's buffer holds its lse [B, H, T] after out [B, H, T, hd] */
    for (int k = 0; k < m->nnodes; k++) {
      const IrNode *n = m->nodes[k];
      if (n->op != IR_OP_ATTENTION) continue;
      checks++;
      int64_t want = 4 * n->shape[0] * n->shape[1] * n->shape[2] * (n->shape[3] + 1);
      if (p.size[k] < want) fail(argv[i], "an sdpa buffer has no room for its lse");
    }
    int64_t total = 0;
    for (int k = 0; k < m->nnodes; k++) total += p.offset[k] >= 0 ? p.size[k] : 0;
    checks++;
    if (p.peak * 2 > total) fail(argv[i], "the plan reuses less than half of the memory");
    ir_module_free(m);
  }
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}
