/* codegen/explain.c -- see explain.h. */
#include "codegen/explain.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/arena_plan.h"
#include "codegen/cuda_arena.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "codegen/report.h"
#include "codegen/step_model.h"

/* ---- grouping ----------------------------------------------------------- */

static int same_key(const IrNode *a, const IrNode *b) {
  return a->op == b->op && a->phase == b->phase && a->loc.line == b->loc.line &&
         a->loc.col == b->loc.col &&
         (a->loc.file == b->loc.file ||
          (a->loc.file && b->loc.file && !strcmp(a->loc.file, b->loc.file)));
}

/* Adds amount for node n to its group among g[0..*ng) (a new one at the end
 * when it has none). */
static void add(CgExplainGroup *g, int *ng, const IrNode *n, double amount, int runtime) {
  int k = 0;
  while (k < *ng && !(same_key(g[k].first, n) && g[k].runtime == runtime)) k++;
  if (k == *ng) g[(*ng)++] = (CgExplainGroup){n, 0, 0, INT_MAX, -1, 0, runtime};
  g[k].amount += amount;
  g[k].count++;
  if (n->layer < 0) g[k].outside = 1;
  else if (n->layer < g[k].lo) g[k].lo = n->layer;
  if (n->layer > g[k].hi) g[k].hi = n->layer;
}

static int by_amount(const void *a, const void *b) {
  const CgExplainGroup *x = a, *y = b;
  if (x->amount != y->amount) return x->amount < y->amount ? 1 : -1;
  return x->first->id - y->first->id; /* (a total order: the earlier made first) */
}

static int pos_of(const int *pos, int i) { return pos ? pos[i] : i; }

/* A buffer's bytes (its owner: a node with a buffer and no alias) are live
 * from the owner's write to the last read of any node sharing them (written
 * in place over it, or a view: alias chains end at the owner), as the
 * planner frees them (passes/bufplan.c). */
int cg_explain_peak(const IrModule *m, const BufPlan *p, const int *pos,
                    const unsigned char *only, int *at, int64_t *live, int *buffers,
                    CgExplainGroup *g) {
  int n = m->nnodes, end = 1;
  for (int i = 0; i < n; i++) {
    if (pos_of(pos, i) + 1 > end) end = pos_of(pos, i) + 1;
    if (p->offset[i] >= 0 && p->last_use[i] + 1 > end) end = p->last_use[i] + 1;
  }
  int *owner = malloc(sizeof *owner * (size_t)(n + 1));
  int *until = malloc(sizeof *until * (size_t)(n + 1));
  int *holder = malloc(sizeof *holder * (size_t)(n + 1));
  int64_t *delta = calloc((size_t)end + 2, sizeof *delta);
  if (!owner || !until || !holder || !delta) {
    free(owner), free(until), free(holder), free(delta);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    int r = i;
    for (int hops = 0; p->offset[r] >= 0 && p->alias[r] >= 0 && hops <= n; hops++)
      r = p->alias[r];
    owner[i] = p->offset[i] >= 0 ? r : -1;
    until[i] = -1;
  }
  for (int i = 0; i < n; i++)
    if (owner[i] >= 0 && p->last_use[i] > until[owner[i]]) until[owner[i]] = p->last_use[i];
  for (int r = 0; r < n; r++)
    if (owner[r] == r && (!only || only[r])) {
      delta[pos_of(pos, r)] += p->size[r];
      delta[until[r] + 1] -= p->size[r];
    }
  int64_t now = 0, best = 0;
  int peak = 0;
  for (int t = 0; t < end; t++) {
    now += delta[t];
    if (now > best) best = now, peak = t;
  }
  /* the value each live buffer holds at the peak: of the nodes sharing it,
   * the last written at or before the peak, views aside (GPT-2's dlogits,
   * written over the logits and read as a reshape by the head's weight
   * gradient, count as the cross-entropy's gradient) */
  for (int r = 0; r < n; r++)
    holder[r] = owner[r] == r && (!only || only[r]) && pos_of(pos, r) <= peak && until[r] >= peak
                    ? r
                    : -1;
  for (int i = 0; i < n; i++) {
    int r = owner[i];
    int view = p->alias[i] >= 0 && m->nodes[i]->op == IR_OP_RESHAPE;
    if (r < 0 || holder[r] < 0 || view || pos_of(pos, i) > peak) continue;
    if (pos_of(pos, i) >= pos_of(pos, holder[r])) holder[r] = i;
  }
  int ng = 0;
  *buffers = 0;
  for (int r = 0; r < n; r++)
    if (holder[r] >= 0) {
      add(g, &ng, m->nodes[holder[r]], (double)p->size[r], 1);
      ++*buffers;
    }
  qsort(g, (size_t)ng, sizeof *g, by_amount);
  *at = peak;
  *live = best;
  free(owner), free(until), free(holder), free(delta);
  return ng;
}

int cg_explain_calls(const IrModule *m, const CgKernelPlan *kp, const double *node_s,
                     CgExplainGroup *g) {
  int ng = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (node_s[i] > 0) add(g, &ng, m->nodes[i], node_s[i], kp->kernel_of[i] < 0);
  qsort(g, (size_t)ng, sizeof *g, by_amount);
  return ng;
}

/* ---- printing ----------------------------------------------------------- */

static const char *phase_word(IrPhase p) {
  static const char *const w[IR_PHASE_COUNT] = {"forward", "backward", "weight grad",
                                                "optimizer"};
  return p < IR_PHASE_COUNT ? w[p] : "?";
}

static const char *base_name(const char *path) {
  const char *s = path ? strrchr(path, '/') : NULL;
  return s ? s + 1 : path ? path : "?";
}

/* Line `loc.line` of loc's file, trimmed, cut with "..." to fit buf ("" when
 * the file's text is not among srcs). */
static const char *source_line(char *buf, size_t len, IrLoc loc, const CgSourceText *srcs,
                               int nsrc) {
  buf[0] = 0;
  const CgSourceText *s = NULL;
  for (int i = 0; i < nsrc && !s && loc.file; i++)
    if (srcs[i].path == loc.file || (srcs[i].path && !strcmp(srcs[i].path, loc.file)))
      s = &srcs[i];
  if (!s || loc.line < 1) return buf;
  size_t at = 0;
  for (int l = 1; l < loc.line && at < s->len; at++)
    if (s->text[at] == '\n') l++;
  while (at < s->len && (s->text[at] == ' ' || s->text[at] == '\t')) at++;
  size_t k = 0;
  while (at + k < s->len && s->text[at + k] != '\n' && s->text[at + k] != '\r') k++;
  int cut = k >= len;
  if (cut) k = len - 1;
  for (size_t i = 0; i < k; i++) /* the user's bytes: control characters as spaces */
    buf[i] = (unsigned char)s->text[at + i] < 0x20 ? ' ' : s->text[at + i];
  buf[k] = 0;
  if (cut && len > 4) memcpy(buf + len - 4, "...", 4);
  return buf;
}


static const char *ms(char *buf, size_t len, double s) {
  if (s >= 1e-3) snprintf(buf, len, "%.3f ms", s * 1e3);
  else snprintf(buf, len, "%.1f us", s * 1e6);
  return buf;
}

static const char *layers(char *buf, size_t len, const CgExplainGroup *g) {
  const char *out = g->outside ? ",-" : ""; /* "-": outside every repeat */
  if (g->hi < 0) snprintf(buf, len, "-");
  else if (g->lo == g->hi) snprintf(buf, len, "%d%s", g->lo, out);
  else snprintf(buf, len, "%d-%d%s", g->lo, g->hi, out);
  return buf;
}

/* The first `rows` of g[0..ng) (sorted; rows 0: all), amounts printed by fmt,
 * each a share of total; `what` names a group's members in the header;
 * other (or NULL): one line for what total holds beyond the groups; then the
 * rest of the groups, summed. */
static void print_groups(FILE *out, const CgExplainGroup *g, int ng, double total,
                         const char *what, const char *(*fmt)(char *, size_t, double),
                         const CgSourceText *srcs, int nsrc, int rows, const char *other) {
  fprintf(out, "    %12s  %6s  %6s  %-7s  %-40s  %s\n", "", "share", what, "layers",
          "op (phase)", "made at");
  double sum = 0, rest = 0;
  int nrest = 0;
  char a[32];
  for (int k = 0; k < ng; k++) {
    sum += g[k].amount;
    if (rows > 0 && k >= rows) {
      rest += g[k].amount;
      nrest += g[k].count;
      continue;
    }
    const IrNode *n = g[k].first;
    char l[32], op[80], where[128], line[72];
    snprintf(op, sizeof op, "%s%s (%s)", g[k].runtime ? "" : "kernel: ", ir_op_info[n->op].name,
             phase_word(n->phase));
    snprintf(where, sizeof where, "%s:%d:%d", base_name(n->loc.file), n->loc.line, n->loc.col);
    fprintf(out, "    %12s  %5.1f%%  %6d  %-7s  %-40s  %-20s %s\n", fmt(a, sizeof a, g[k].amount),
            total > 0 ? 100 * g[k].amount / total : 0.0, g[k].count, layers(l, sizeof l, &g[k]),
            op, where, source_line(line, sizeof line, n->loc, srcs, nsrc));
  }
  if (other)
    fprintf(out, "    %12s  %5.1f%%  %6d  %-7s  %s\n", fmt(a, sizeof a, total - sum),
            total > 0 ? 100 * (total - sum) / total : 0.0, 1, "-", other);
  if (nrest)
    fprintf(out, "    %12s  %5.1f%%  %6d  (%d more group%s)\n", fmt(a, sizeof a, rest),
            total > 0 ? 100 * rest / total : 0.0, nrest, ng - rows, ng - rows > 1 ? "s" : "");
}

/* "op (phase, layer N)" of the node that runs at position at */
static const char *running(char *buf, size_t len, const IrModule *m, int at) {
  const IrNode *x = m->nodes[at < m->nnodes ? at : m->nnodes - 1];
  char l[32] = "";
  if (x->layer >= 0) snprintf(l, sizeof l, ", layer %d", x->layer);
  snprintf(buf, len, "%s (%s%s)", ir_op_info[x->op].name, phase_word(x->phase), l);
  return buf;
}

/* The peak of arena p over the buffers only[] selects (NULL: all; who names
 * them after "the buffers' peak", or "") and what is live there by group. */
static int explain_peak(FILE *out, const IrModule *m, const BufPlan *p, const int *pos,
                        const unsigned char *only, const char *who, const CgSourceText *srcs,
                        int nsrc, int rows) {
  CgExplainGroup *g = malloc(sizeof *g * (size_t)(m->nnodes + 1));
  int at, buffers;
  int64_t live;
  int ng = g ? cg_explain_peak(m, p, pos, only, &at, &live, &buffers, g) : -1;
  if (ng < 0) {
    free(g);
    return -1;
  }
  char b[32], c[32], r[96];
  const IrNode *x = m->nodes[at < m->nnodes ? at : m->nnodes - 1];
  fprintf(out, "  the buffers' peak%s: %s live in %d buffers (%.1f%% of their %s; the rest is "
               "room between buffers), while %s at %s:%d:%d runs\n",
          who, cg_bytes_text(b, sizeof b, (double)live), buffers,
          p->peak ? 100 * (double)live / (double)p->peak : 0.0,
          cg_bytes_text(c, sizeof c, (double)p->peak), running(r, sizeof r, m, at),
          base_name(x->loc.file), x->loc.line, x->loc.col);
  fprintf(out, "  live at the peak, by the op and line that made them:\n");
  print_groups(out, g, ng, (double)live, "values", cg_bytes_text, srcs, nsrc, rows, NULL);
  free(g);
  return 0;
}

/* Arena p's size under title; pp (stage programs): the largest stage's slot
 * (each stage's, slot[s], cg_pipe_slot_bytes). */
static void arena_head(FILE *out, const IrModule *m, const PpProgram *pp, const CgKernelPlan *kp,
                       const BufPlan *p, const char *title, int64_t *slot) {
  char a[32], b[32];
  if (pp) {
    cg_pipe_slot_bytes(m, pp, kp, p, slot, NULL);
    int big = 0;
    for (int s = 1; s < pp->nstages; s++)
      if (slot[s] > slot[big]) big = s;
    fprintf(out, "%s: %s (%lld bytes), stage %d's, the largest; each stage's slot ends where "
            "its values and kernel temporaries do\n", title,
            cg_bytes_text(a, sizeof a, (double)slot[big]), (long long)slot[big], big);
    return;
  }
  int64_t whole = cg_arena_bytes(kp, p, NULL);
  fprintf(out, "%s: %s (%lld bytes)", title, cg_bytes_text(a, sizeof a, (double)whole),
          (long long)whole);
  if (whole > p->peak)
    fprintf(out, ", of which %s of kernel temporaries after the buffers",
            cg_bytes_text(b, sizeof b, (double)(whole - p->peak)));
  fputc('\n', out);
}

static int explain_step(FILE *out, const IrModule *m, const CgStepPlan *sp, const Machine *mc,
                        int bf16, const CgSourceText *srcs, int nsrc, int rows) {
  double *t = calloc((size_t)m->nnodes + 1, sizeof *t);
  CgExplainGroup *g = malloc(sizeof *g * (size_t)(m->nnodes + 1));
  if (!t || !g) {
    free(t), free(g);
    return -1;
  }
  StepTime st;
  cg_step_times(m, &sp->kp, mc, bf16, &sp->store, &sp->batches, 1, &st, t);
  int ng = cg_explain_calls(m, &sp->kp, t, g);
  double compute = st.fwd_s + st.bwd_s + st.opt_s, sum = 0;
  for (int k = 0; k < ng; k++) sum += g[k].amount;
  char a[32], b[32], c[32], d[32];
  fprintf(out, "predicted step on %s (%s), compute only: %s in %d calls (GEMMs %s, attention "
               "%s, memory-bound %s)\n",
          mc->name[0] ? mc->name : "the given machine", bf16 ? "bf16 mixed" : "fp32",
          ms(a, sizeof a, compute), st.calls, ms(b, sizeof b, st.gemm_s),
          ms(c, sizeof c, st.attn_s), ms(d, sizeof d, st.mem_s));
  fprintf(out, "  by the op and line that made each call (a GEMM with its operands' bf16 copies; "
               "collectives are in the report's communication):\n");
  /* (what no node's call holds: the params' bf16 copy, made once a step) */
  print_groups(out, g, ng, compute, "calls", ms, srcs, nsrc, rows,
               compute - sum > 1e-12 ? "the parameters' bf16 copy" : NULL);
  free(t), free(g);
  return 0;
}

/* ---- trainers of stage programs ---------------------------------------- */

/* A slot plan p of a trainer of stage programs: each stage's values' peak
 * (the buffers its arena holds, bufplan_group_where), then what is live at
 * the largest of them, which sizes the slot. */
static int stage_peaks(FILE *out, const IrModule *m, const PpProgram *pp, const BufPlan *p,
                       const int64_t *slot, const int *pos, const CgSourceText *srcs, int nsrc,
                       int rows) {
  int n = m->nnodes, P = pp->nstages, best = 0;
  int64_t most = -1;
  unsigned char *only = malloc((size_t)n + 1);
  uint64_t *gw = malloc(sizeof *gw * ((size_t)n + 1));
  CgExplainGroup *g = malloc(sizeof *g * (size_t)(n + 1));
  if (!only || !gw || !g) {
    free(only), free(gw), free(g);
    return -1;
  }
  bufplan_group_where(m, p, gw);
  fprintf(out, "  each stage's values (one plan for all: a stage's slot holds its own, and "
               "stages reuse each other's offsets) and its slot:\n");
  int rc = 0;
  for (int s = 0; s < P && !rc; s++) {
    for (int i = 0; i < n; i++) only[i] = gw[i] >> s & 1;
    int at, buffers;
    int64_t live;
    if (cg_explain_peak(m, p, pos, only, &at, &live, &buffers, g) < 0) {
      rc = -1;
      break;
    }
    char a[32], b[32], r[96];
    fprintf(out, "    stage %d: %s in %d buffers, while %s runs; slot %s (%lld bytes, %.1f%% "
            "live at the peak)\n", s, cg_bytes_text(a, sizeof a, (double)live), buffers,
            running(r, sizeof r, m, at), cg_bytes_text(b, sizeof b, (double)slot[s]),
            (long long)slot[s], slot[s] ? 100 * (double)live / (double)slot[s] : 0.0);
    if (live > most) most = live, best = s;
  }
  if (!rc) {
    char who[32];
    snprintf(who, sizeof who, ", stage %d's", best);
    for (int i = 0; i < n; i++) only[i] = gw[i] >> best & 1;
    rc = explain_peak(out, m, p, pos, only, who, srcs, nsrc, rows);
  }
  free(only), free(gw), free(g);
  return rc;
}

/* Each stage's calls a step: its chunks' nodes once a microbatch. */
static int explain_stage_steps(FILE *out, const IrModule *m, const PpProgram *pp,
                               const CgKernelPlan *kp, const CgCudaStore *store,
                               const CgCudaBatches *batches, const Machine *mc, int bf16,
                               const CgSourceText *srcs, int nsrc, int rows) {
  int n = m->nnodes, P = pp->nstages, M = pp->microbatches > 0 ? pp->microbatches : 1;
  double *t = calloc((size_t)n + 1, sizeof *t), *ts = calloc((size_t)n + 1, sizeof *ts);
  CgExplainGroup *g = malloc(sizeof *g * (size_t)(n + 1));
  if (!t || !ts || !g) {
    free(t), free(ts), free(g);
    return -1;
  }
  StepTime st;
  cg_step_times(m, kp, mc, bf16, store, batches, 0, &st, t);
  char a[32];
  fprintf(out, "predicted calls of each stage on %s (%s), compute only, a step of %d "
               "microbatches (the schedule's idle time, transfers and optimizer aside):\n",
          mc->name[0] ? mc->name : "the given machine", bf16 ? "bf16 mixed" : "fp32", M);
  for (int s = 0; s < P; s++) {
    double total = 0;
    for (int i = 0; i < n; i++) {
      int on = pp->chunk[i] >= 0 && pp->chunk[i] % P == s && m->nodes[i]->phase != IR_PHASE_OPT;
      ts[i] = on ? t[i] * M : 0;
      total += ts[i];
    }
    int ng = cg_explain_calls(m, kp, ts, g);
    for (int k = 0; k < ng; k++) g[k].count *= M;
    fprintf(out, "  stage %d: %s\n", s, ms(a, sizeof a, total));
    print_groups(out, g, ng, total, "calls", ms, srcs, nsrc, rows, NULL);
  }
  free(t), free(ts), free(g);
  return 0;
}

/* The title of arena p's explanation: train.c's (narrow: the GPU trainer
 * has its own) or the GPU trainer's (gpu), of a slot for stage programs. */
static const char *arena_title(char *buf, size_t len, const PpProgram *pp, int gpu, int narrow) {
  const char *whose = narrow ? " of the CPU trainer (train.c, fp32)"
                             : " (train.c's plan; a GPU trainer's too)";
  if (gpu)
    snprintf(buf, len, "%sactivation arena of the GPU trainer (train_cuda.c, bf16 values at 2 "
             "bytes%s", pp ? "a slot of the " : "", pp ? "; the stages' arenas hold " : ")");
  else
    snprintf(buf, len, "%sactivation arena%s%s", pp ? "a slot of the " : "", whose,
             pp ? " (a stage's values of one microbatch; the stages' arenas hold " : "");
  for (int s = 0; pp && s < pp->nstages; s++)
    snprintf(buf + strlen(buf), len - strlen(buf), "%d%s", pp->stage_slots[s],
             s + 1 < pp->nstages ? ", " : ")");
  return buf;
}

int cg_explain(FILE *out, IrModule *m, const PpProgram *pp, unsigned what, int fuse,
               const Machine *mc, int bf16, int store, int batch, const CgSourceText *srcs,
               int nsrc, int rows, char *err, size_t len) {
  CgStepPlan sp;
  if (cg_plan_whole_step(m, fuse, pp, bf16, store, batch, &sp, err, len)) return -1;
  if (!mc) mc = machine_default;
  char title[512];
  int rc = 0;
  for (int gpu = 0; gpu < 2 && !rc && what & CG_EXPLAIN_MEMORY; gpu++) {
    const BufPlan *p = gpu ? &sp.gbp : &sp.bp;
    if (gpu && !sp.gbp.narrow) break; /* (the GPU trainer takes train.c's plan) */
    int64_t slot[PP_MAX_STAGES];
    arena_head(out, m, pp, &sp.kp, p,
               arena_title(title, sizeof title, pp, gpu, sp.gbp.narrow != NULL), slot);
    rc = pp ? stage_peaks(out, m, pp, p, slot, sp.pos, srcs, nsrc, rows)
            : explain_peak(out, m, p, sp.pos, NULL, "", srcs, nsrc, rows);
  }
  if (!rc && what & CG_EXPLAIN_STEP)
    rc = pp ? explain_stage_steps(out, m, pp, &sp.kp, &sp.store, &sp.batches, mc, bf16, srcs,
                                  nsrc, rows)
            : explain_step(out, m, &sp, mc, bf16, srcs, nsrc, rows);
  cg_step_plan_free(&sp);
  if (rc) snprintf(err, len, "out of memory explaining the plan");
  return rc;
}
