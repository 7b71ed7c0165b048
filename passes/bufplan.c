/* passes/bufplan.c -- liveness-based offset assignment.
 *
 * Greedy best fit over a free list kept sorted by offset: each node, in
 * order, takes the smallest free gap that holds it (or the arena grows at
 * its end); buffers whose last reader has run are returned to the free
 * list and coalesced with their neighbours. */
#include "passes/bufplan.h"

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

int bufplan_build(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                  const int *pos, BufPlan *p) {
  return bufplan_build_held(m, materialize, keep, pos, NULL, p);
}

int bufplan_build_held(IrModule *m, const unsigned char *materialize, const unsigned char *keep,
                       const int *pos, const int *held, BufPlan *p) {
  int n = m->nnodes;
  Arena *a = &m->arena;
  memset(p, 0, sizeof *p);
  p->offset = arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1));
  p->size = arena_alloc(a, sizeof(int64_t) * (size_t)(n + 1));
  p->last_use = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int end = 0; /* one past the last position */
  for (int i = 0; i < n; i++) {
    p->offset[i] = -1;
    p->last_use[i] = at(pos, i);
    if (at(pos, i) + 1 > end) end = at(pos, i) + 1;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < m->nodes[i]->ninputs; k++) {
      int j = m->nodes[i]->inputs[k]->id;
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
  FreeList f = {0};
  int64_t live = 0;
  for (int t = 0; t < end; t++) {
    for (int i = def_head[t]; i >= 0; i = def_next[i]) {
      if (!has_buffer(m->nodes[i], materialize)) continue;
      int64_t bytes = ir_buf_numel(m->nodes[i]) * 4; /* sdpa: lse after out */
      p->size[i] = (bytes + BUFPLAN_ALIGN - 1) / BUFPLAN_ALIGN * BUFPLAN_ALIGN;
      p->offset[i] = take(&f, p->size[i]);
      live += p->size[i];
      if (live > p->live_peak) p->live_peak = live;
      int d = p->last_use[i];
      die_next[i] = die_head[d];
      die_head[d] = i;
    }
    for (int j = die_head[t]; j >= 0; j = die_next[j]) {
      give(a, &f, p->offset[j], p->size[j]);
      live -= p->size[j];
    }
  }
  p->peak = f.end;
  return 0;
}

int bufplan_check(const IrModule *m, const BufPlan *p, const int *pos, char *why, size_t len) {
  for (int i = 0; i < m->nnodes; i++) {
    if (p->offset[i] < 0) continue;
    if (p->offset[i] + p->size[i] > p->peak || p->offset[i] % BUFPLAN_ALIGN) {
      snprintf(why, len, "node %%%d: [%lld, +%lld) outside the arena or misaligned", i,
               (long long)p->offset[i], (long long)p->size[i]);
      return -1;
    }
    for (int j = 0; j < m->nnodes; j++) {
      if (j == i || p->offset[j] < 0) continue;
      /* j is written while i is live: at or after i's write, up to i's last read */
      int ti = at(pos, i), tj = at(pos, j);
      if (tj < ti || tj > p->last_use[i]) continue;
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
