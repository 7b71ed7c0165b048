/* tests/autodiff/ad_check.c -- builders and the finite-difference check. */
#include "ad_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t rng_next(Rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1DULL;
}

double rng_uniform(Rng *r, double lo, double hi) {
  return lo + (hi - lo) * (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double rng_normal(Rng *r) {
  double u = rng_uniform(r, 1e-12, 1.0), v = rng_uniform(r, 0.0, 1.0);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int64_t rng_int(Rng *r, int64_t n) { return (int64_t)(rng_next(r) % (uint64_t)n); }

void build_init(Build *b, const char *name, uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->m = ir_module_new(name);
  b->rng.s = seed * 0x9E3779B97F4A7C15ULL + 1;
}

static IrNode *leaf(Build *b, IrOp op, IrDType dt, LeafKind kind, double a, double c,
                    const int64_t *shape) {
  IrNode *n = ir_add(b->m, op, NULL, 0);
  n->dtype = dt;
  for (int d = 0; shape[d] >= 0; d++) n->shape[n->rank++] = shape[d];
  n->name = arena_printf(&b->m->arena, "%s%d", op == IR_OP_PARAM ? "p" : "in", n->id);
  n->shard_dim = -1;
  if (b->nspec == (int)(sizeof b->spec / sizeof b->spec[0])) {
    fprintf(stderr, "too many leaves\n");
    exit(2);
  }
  b->spec[b->nspec++] = (LeafSpec){n->id, kind, a, c};
  return n;
}

IrNode *t_param(Build *b, LeafKind kind, double a, double c, const int64_t *shape) {
  return leaf(b, IR_OP_PARAM, IR_F32, kind, a, c, shape);
}

IrNode *t_input(Build *b, LeafKind kind, double a, double c, const int64_t *shape) {
  return leaf(b, IR_OP_INPUT, kind == LEAF_IDS ? IR_I32 : IR_F32, kind, a, c, shape);
}

IrNode *t_fixed_ids(Build *b, const int64_t *shape) {
  return leaf(b, IR_OP_INPUT, IR_I32, LEAF_FIXED, 0, 0, shape);
}

static IrNode *add_checked(Build *b, IrNode *p) {
  char why[512];
  if (!ir_infer(p, why, sizeof why)) {
    fprintf(stderr, "test module does not type-check: %s\n", why);
    exit(2);
  }
  return ir_add_like(b->m, p);
}

IrNode *t_op(Build *b, IrOp op, IrNode **in, int nin, int64_t ia0, int64_t ia1, int64_t ia2,
             double fa) {
  IrNode p = {.op = op, .inputs = in, .ninputs = nin, .ia = {ia0, ia1, ia2}, .fa = fa};
  return add_checked(b, &p);
}

IrNode *t_op1(Build *b, IrOp op, IrNode *x, int64_t ia0, int64_t ia1, int64_t ia2, double fa) {
  return t_op(b, op, &x, 1, ia0, ia1, ia2, fa);
}

IrNode *t_op2(Build *b, IrOp op, IrNode *x, IrNode *y, int64_t ia0, double fa) {
  IrNode *in[2] = {x, y};
  return t_op(b, op, in, 2, ia0, 0, 0, fa);
}

IrNode *t_shaped(Build *b, IrOp op, IrNode *x, const int64_t *shape) {
  IrNode p = {.op = op, .inputs = &x, .ninputs = 1};
  for (int d = 0; shape[d] >= 0; d++) p.shape[p.rank++] = shape[d];
  return add_checked(b, &p);
}

IrNode *t_weighted_sum(Build *b, IrNode *y) {
  IrNode *r = ir_add(b->m, IR_OP_INPUT, NULL, 0);
  r->dtype = IR_F32;
  r->rank = y->rank;
  memcpy(r->shape, y->shape, sizeof r->shape);
  r->name = arena_printf(&b->m->arena, "weights%d", r->id);
  r->shard_dim = -1;
  IrNode *s = t_op2(b, IR_OP_MUL, y, r, 0, 0);
  while (s->rank > 0) s = t_op1(b, IR_OP_SUM, s, 0, 0, 0, 0);
  return s;
}

void fill_leaves(Build *b, IrInterp *it) {
  const IrModule *m = b->m;
  for (int k = 0; k < m->nnodes; k++) {
    const IrNode *n = m->nodes[k];
    if (n->op != IR_OP_INPUT && n->op != IR_OP_PARAM) continue;
    LeafSpec sp = {k, n->dtype == IR_I32 ? LEAF_IDS : LEAF_NORMAL, 1, 0};
    if (n->dtype == IR_I32) sp.a = 1;
    for (int s = 0; s < b->nspec; s++)
      if (b->spec[s].id == k) sp = b->spec[s];
    for (int64_t e = 0; e < ir_numel(n); e++) {
      switch (sp.kind) {
      case LEAF_NORMAL: it->f[k][e] = sp.a * rng_normal(&b->rng) + sp.b; break;
      case LEAF_UNIFORM: it->f[k][e] = rng_uniform(&b->rng, sp.a, sp.b); break;
      case LEAF_AWAY:
        it->f[k][e] = rng_uniform(&b->rng, sp.a, sp.b) * (rng_next(&b->rng) & 1 ? 1 : -1);
        break;
      case LEAF_IDS: it->i[k][e] = (int32_t)rng_int(&b->rng, (int64_t)sp.a); break;
      case LEAF_FIXED: break;
      }
    }
  }
}

int first_backward(const IrModule *m) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->phase != IR_PHASE_FWD) return i;
  return m->nnodes;
}

void must_verify(const IrModule *m, const char *when) {
  char why[512];
  if (ir_verify(m, why, sizeof why) == 0) return;
  fprintf(stderr, "FAIL: IR invalid %s: %s\n", when, why);
  exit(1);
}

static void run_or_die(IrInterp *it, int first, int end) {
  char why[512];
  if (ir_interp_run(it, first, end, why, sizeof why) == 0) return;
  fprintf(stderr, "FAIL: interpreter: %s\n", why);
  exit(1);
}

/* Whether every topk node in [0, end) still holds the values in saved. */
static int topk_same(const IrInterp *it, int end, int32_t **saved) {
  for (int k = 0; k < end; k++)
    if (saved[k] && memcmp(saved[k], it->i[k], sizeof(int32_t) * (size_t)ir_numel(it->m->nodes[k])))
      return 0;
  return 1;
}

/* The elements of p to check: all, or n uniform picks plus n picks among
 * the elements with a nonzero gradient (sparse gradients, e.g. embedding
 * tables, would otherwise be checked mostly where both sides are 0). */
static int pick(Rng *rng, const double *g, int64_t numel, int n, int64_t *out) {
  if (n <= 0 || numel <= 2 * n) {
    for (int64_t e = 0; e < numel; e++) out[e] = e;
    return (int)numel;
  }
  int k = 0;
  for (int i = 0; i < n; i++) out[k++] = rng_int(rng, numel);
  int64_t nz = 0;
  for (int64_t e = 0; e < numel; e++) nz += g && g[e] != 0;
  for (int i = 0; i < n && nz; i++) {
    int64_t want = rng_int(rng, nz);
    for (int64_t e = 0; e < numel; e++)
      if (g[e] != 0 && want-- == 0) {
        out[k++] = e;
        break;
      }
  }
  return k;
}

int fd_check(IrModule *m, IrInterp *it, Rng *rng, const FdOptions *o, FdStats *st) {
  memset(st, 0, sizeof *st);
  int nfwd = first_backward(m);
  run_or_die(it, 0, m->nnodes);
  const IrNode *loss = m->loss;
  int32_t **saved = calloc((size_t)nfwd + 1, sizeof *saved);
  for (int k = 0; k < nfwd; k++)
    if (m->nodes[k]->op == IR_OP_TOPK) {
      size_t bytes = sizeof(int32_t) * (size_t)ir_numel(m->nodes[k]);
      saved[k] = malloc(bytes);
      memcpy(saved[k], it->i[k], bytes);
    }
  for (int k = 0; k < nfwd; k++) {
    const IrNode *p = m->nodes[k];
    if (p->op != IR_OP_PARAM) continue;
    int64_t numel = ir_numel(p);
    double *grad = calloc((size_t)numel, sizeof *grad);
    if (p->grad) memcpy(grad, it->f[p->grad->id], sizeof(double) * (size_t)numel);
    int64_t *elems = calloc((size_t)numel + 2 * (size_t)o->per_param + 1, sizeof *elems);
    int ne = pick(rng, grad, numel, o->per_param, elems);
    for (int i = 0; i < ne; i++) {
      int64_t e = elems[i];
      double v = it->f[k][e], lp, lm;
      it->f[k][e] = v + o->eps;
      run_or_die(it, k + 1, nfwd);
      lp = it->f[loss->id][0];
      int stable = topk_same(it, nfwd, saved);
      it->f[k][e] = v - o->eps;
      run_or_die(it, k + 1, nfwd);
      lm = it->f[loss->id][0];
      stable = stable && topk_same(it, nfwd, saved);
      it->f[k][e] = v;
      if (!stable) {
        st->skipped++;
        continue;
      }
      double fd = (lp - lm) / (2 * o->eps), ad = grad[e];
      double diff = fabs(fd - ad), big = fmax(fabs(fd), fabs(ad));
      double rel = diff / fmax(big, 1e-30);
      st->checked++;
      if (diff > st->max_abs) st->max_abs = diff;
      if (big >= 1e-3 && rel > st->max_rel) st->max_rel = rel;
      int ok = diff <= o->rtol * big + o->atol;
      if (!ok) st->failed++;
      if (!ok || o->verbose)
        printf("  %s %s[%lld]: autodiff %.12g, finite difference %.12g (abs %.3g, rel %.3g)\n",
               ok ? "ok  " : "FAIL", p->name, (long long)e, ad, fd, diff, rel);
    }
    run_or_die(it, k + 1, nfwd); /* later parameters start from the unperturbed values */
    free(grad);
    free(elems);
  }
  run_or_die(it, 0, m->nnodes); /* leave every value consistent again */
  for (int k = 0; k < nfwd; k++) free(saved[k]);
  free(saved);
  return st->failed ? -1 : 0;
}
