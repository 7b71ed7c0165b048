/* tests/optim/optim_test.c -- the optimizer step as IR (passes/optimizer.c)
 * and its reference semantics (ir/interp.c).
 *
 *   optim_test interp        five steps of every case in the interpreter,
 *                            updates fed back, against plain C below
 *   optim_test dump FILE     the same runs as JSON for torch_oracle.py
 *   optim_test structure     what the pass appends, phases, names, IR text
 *   optim_test errors        the pass refuses what it cannot compile
 *   optim_test verify        ir_verify rejects broken update lists/phases
 *   optim_test model F.dsl [NAME=VALUE ...]
 *                            a whole model: frontend, autodiff, optimizer,
 *                            three interpreted AdamW steps lower the loss
 *
 * The test module has parameters of rank 1, 2 and 3, one parameter the loss
 * does not reach (no gradient: no update, no state), and a loss that is not
 * linear in any parameter, so gradients change from step to step. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/rt_sched.h"
#include "tests/support/load.h"

#define NSTEPS 5

static int fails;

static void expect(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void expect(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fails += !ok;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "FAIL: %s: %s\n", what, why);
  exit(1);
}

/* ---- a small module ------------------------------------------------------------ */

typedef struct {
  const char *name;
  const char *optimizer;   /* "adamw" or "sgd" */
  double beta1, beta2, eps, wd, momentum, clip;
  double lr;               /* the base rate; the steps follow a cosine schedule */
  int clip_active;         /* 1: some step must clip, 0: none may, -1: clip = 0 */
} Case;

static const Case cases[] = {
    {"adamw_clip", "adamw", 0.9, 0.95, 1e-8, 0.1, 0, 1.0, 2e-2, 1},
    {"adamw_noclip", "adamw", 0.8, 0.999, 1e-6, 0.0, 0, 0.0, 1e-2, -1},
    {"adamw_clip_inactive", "adamw", 0.9, 0.95, 1e-8, 0.3, 0, 1e4, 3e-2, 0},
    {"sgd_clip", "sgd", 0, 0, 0, 0.1, 0.0, 1.0, 5e-2, 1},
    {"sgd_momentum", "sgd", 0, 0, 0, 0.05, 0.9, 0.0, 2e-2, -1},
    {"sgd_momentum_clip", "sgd", 0, 0, 0, 0.0, 0.9, 0.5, 3e-2, 1},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

typedef struct {
  IrModule *m;
  IrNode *x, *r;            /* inputs */
  IrNode *params[4];        /* l.w [3, 5], l.b [5], l.t [2, 4, 5], unused [6] */
  int nparams;
} Small;

static IrNode *leaf(IrModule *m, IrOp op, const char *name, int rank, const int64_t *shape) {
  IrNode *n = ir_add(m, op, NULL, 0);
  n->dtype = IR_F32;
  n->rank = rank;
  memcpy(n->shape, shape, sizeof(int64_t) * (size_t)rank);
  n->name = name;
  n->shard_dim = -1;
  return n;
}

static IrNode *node(IrModule *m, IrOp op, IrNode *a, IrNode *b, int64_t ia0) {
  IrNode *in[2] = {a, b};
  IrNode p = {.op = op, .inputs = in, .ninputs = b ? 2 : 1, .ia = {ia0}};
  char why[512];
  if (!ir_infer(&p, why, sizeof why)) die("building the test module", why);
  return ir_add_like(m, &p);
}

/* Appends a float setting to a list of at most 8. */
static void set_setting(IrModule *m, IrSetting **s, int *n, const char *name, double v) {
  if (!*s) *s = arena_alloc(&m->arena, 8 * sizeof(IrSetting));
  if (*n == 8) die("set_setting", "too many settings");
  (*s)[(*n)++] = (IrSetting){.name = name, .is_float = 1, .f = v};
}

/* loss = sum(z * z * r), z = gelu(x @ w + b) * t. */
static Small build_small(const Case *c) {
  Small s = {0};
  IrModule *m = s.m = ir_module_new(c ? c->name : "small");
  s.x = leaf(m, IR_OP_INPUT, "x", 2, (int64_t[]){4, 3});
  s.params[0] = leaf(m, IR_OP_PARAM, "l.w", 2, (int64_t[]){3, 5});
  s.params[1] = leaf(m, IR_OP_PARAM, "l.b", 1, (int64_t[]){5});
  s.params[2] = leaf(m, IR_OP_PARAM, "l.t", 3, (int64_t[]){2, 4, 5});
  s.params[3] = leaf(m, IR_OP_PARAM, "unused", 1, (int64_t[]){6});
  s.nparams = 4;
  s.r = leaf(m, IR_OP_INPUT, "r", 3, (int64_t[]){2, 4, 5});
  IrNode *h = node(m, IR_OP_GELU,
                   node(m, IR_OP_ADD, node(m, IR_OP_MATMUL, s.x, s.params[0], 0), s.params[1], 0),
                   NULL, 0);
  IrNode *z = node(m, IR_OP_MUL, h, s.params[2], 0);
  IrNode *l = node(m, IR_OP_MUL, node(m, IR_OP_MUL, z, z, 0), s.r, 0);
  while (l->rank > 0) l = node(m, IR_OP_SUM, l, NULL, 0);
  m->loss = l;
  if (c) {
    m->optimizer = c->optimizer;
    int n = 0;
    if (!strcmp(c->optimizer, "adamw")) {
      set_setting(m, &m->optim, &n, "beta1", c->beta1);
      set_setting(m, &m->optim, &n, "beta2", c->beta2);
      set_setting(m, &m->optim, &n, "eps", c->eps);
    } else {
      set_setting(m, &m->optim, &n, "momentum", c->momentum);
    }
    set_setting(m, &m->optim, &n, "wd", c->wd);
    m->noptim = n;
    n = 0;
    set_setting(m, &m->train, &n, "lr", c->lr);
    set_setting(m, &m->train, &n, "clip", c->clip);
    m->ntrain = n;
  }
  return s;
}

static void must_verify(const IrModule *m, const char *when) {
  char why[512];
  if (ir_verify(m, why, sizeof why)) die(when, why);
}

static Small build_trained(const Case *c) {
  Small s = build_small(c);
  must_verify(s.m, "after building");
  if (pass_autodiff(s.m)) die("autodiff", "failed");
  if (pass_optimizer(s.m)) die("optimizer", "failed");
  must_verify(s.m, "after pass_optimizer");
  return s;
}

static IrNode *named(const IrModule *m, const char *name) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->name && !strcmp(m->nodes[i]->name, name)) return m->nodes[i];
  return NULL;
}

/* xorshift64*: the same values on every platform. */
static uint64_t rng_s = 88172645463325252ULL;
static double uniform(double lo, double hi) {
  rng_s ^= rng_s >> 12, rng_s ^= rng_s << 25, rng_s ^= rng_s >> 27;
  return lo + (hi - lo) * (double)((rng_s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

/* ---- the reference: PyTorch's update, written out plainly ------------------------ */

/* One tensor's state in the reference. */
typedef struct {
  int64_t n;
  int rank;
  double *p, *m, *v, *buf;  /* buf: SGD momentum, NULL before the first step */
} Ref;

/* torch.nn.utils.clip_grad_norm_ (total norm = norm of the per-tensor norms)
 * then one torch.optim.AdamW / SGD step with lr, step t (1-based); decay only
 * on rank >= 2.  Returns the total norm before clipping. */
static double ref_step(const Case *c, Ref *r, double *const *grad, int n, double lr, int t) {
  double norms_sq = 0;
  for (int k = 0; k < n; k++) {
    if (!grad[k]) continue;
    double s = 0;
    for (int64_t e = 0; e < r[k].n; e++) s += grad[k][e] * grad[k][e];
    norms_sq += sqrt(s) * sqrt(s);
  }
  double total = sqrt(norms_sq), coef = 1;
  if (c->clip > 0) {
    coef = c->clip / (total + 1e-6);
    if (coef > 1) coef = 1;
  }
  int adamw = !strcmp(c->optimizer, "adamw");
  for (int k = 0; k < n; k++) {
    if (!grad[k]) continue;
    Ref *q = &r[k];
    double wd = q->rank >= 2 ? c->wd : 0;
    for (int64_t e = 0; e < q->n; e++) {
      double g = grad[k][e] * coef;
      if (adamw) {
        q->p[e] *= 1 - lr * wd;
        q->m[e] = q->m[e] * c->beta1 + (1 - c->beta1) * g;
        q->v[e] = q->v[e] * c->beta2 + (1 - c->beta2) * g * g;
        double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
        double step_size = lr / bc1;
        double denom = sqrt(q->v[e]) / sqrt(bc2) + c->eps;
        q->p[e] += -step_size * q->m[e] / denom;
      } else {
        double d = g;
        if (wd != 0) d = d + wd * q->p[e];
        if (c->momentum != 0) {
          q->buf[e] = t == 1 ? d : q->buf[e] * c->momentum + d;
          d = q->buf[e];
        }
        q->p[e] += -lr * d;
      }
    }
  }
  return total;
}

/* ---- interpreter runs ------------------------------------------------------------ */

/* What a run records, for the comparisons and the JSON dump. */
typedef struct {
  double *init[4];                    /* initial parameter values */
  double *grad[NSTEPS][4];            /* gradient at each step (NULL: none) */
  double *after[NSTEPS][4];           /* parameters after each step */
  double lr[NSTEPS], norm[NSTEPS], coef[NSTEPS];
} Trace;

static double *dup(const double *x, int64_t n) {
  double *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
  memcpy(y, x, sizeof(double) * (size_t)n);
  return y;
}

static void run_or_die(IrInterp *it) {
  char why[512];
  if (ir_interp_run(it, 0, it->m->nnodes, why, sizeof why)) die("interpreter", why);
}

/* Relative difference, with 1e-300 guarding 0 against 0. */
static double rel(double a, double b) {
  double d = fabs(a - b), s = fmax(fabs(a), fabs(b));
  return d == 0 ? 0 : d / fmax(s, 1e-300);
}

/* Runs case c for NSTEPS steps in the interpreter and in the reference; returns
 * the largest relative difference of parameters and state.  Fills tr. */
static double run_case(const Case *c, Trace *tr) {
  Small s = build_trained(c);
  IrModule *m = s.m;
  IrInterp *it = ir_interp_new(m);
  rng_s = 88172645463325252ULL;
  for (int64_t e = 0; e < ir_numel(s.x); e++) it->f[s.x->id][e] = uniform(-1, 1);
  for (int64_t e = 0; e < ir_numel(s.r); e++) it->f[s.r->id][e] = uniform(0.5, 1.5);
  Ref ref[4];
  for (int k = 0; k < s.nparams; k++) {
    IrNode *p = s.params[k];
    for (int64_t e = 0; e < ir_numel(p); e++) it->f[p->id][e] = uniform(-1.5, 1.5);
    tr->init[k] = dup(it->f[p->id], ir_numel(p));
    ref[k] = (Ref){ir_numel(p), p->rank, dup(it->f[p->id], ir_numel(p)),
                   calloc((size_t)ir_numel(p), sizeof(double)),
                   calloc((size_t)ir_numel(p), sizeof(double)),
                   calloc((size_t)ir_numel(p), sizeof(double))};
  }
  IrNode *lr = named(m, "lr"), *step = named(m, "step");
  IrNode *coef = NULL;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_CLIP_COEF) coef = m->nodes[i];
  if (!lr || !step || !coef || !m->grad_norm) die(c->name, "lr, step, clip_coef or grad_norm missing");

  double worst = 0;
  for (int t = 0; t < NSTEPS; t++) {
    tr->lr[t] = rt_lr_at(RT_SCHED_COSINE, c->lr, 2, c->lr / 10, NSTEPS, t);
    it->f[lr->id][0] = tr->lr[t];
    it->f[step->id][0] = t + 1;
    run_or_die(it);
    tr->norm[t] = it->f[m->grad_norm->id][0];
    tr->coef[t] = it->f[coef->id][0];
    for (int k = 0; k < s.nparams; k++) {
      IrNode *g = s.params[k]->grad;
      tr->grad[t][k] = g ? dup(it->f[g->id], ir_numel(g)) : NULL;
    }
    double total = ref_step(c, ref, tr->grad[t], s.nparams, tr->lr[t], t + 1);
    worst = fmax(worst, rel(total, tr->norm[t]));
    ir_interp_end_step(it);
    for (int k = 0; k < s.nparams; k++) {
      IrNode *p = s.params[k];
      tr->after[t][k] = dup(it->f[p->id], ir_numel(p));
      const char *keys[3] = {"exp_avg", "exp_avg_sq", "momentum_buffer"};
      double *refs[3] = {ref[k].m, ref[k].v, ref[k].buf};
      for (int64_t e = 0; e < ir_numel(p); e++) worst = fmax(worst, rel(it->f[p->id][e], ref[k].p[e]));
      for (int j = 0; j < 3; j++) {
        char name[96];
        snprintf(name, sizeof name, "%s.%s", p->name, keys[j]);
        IrNode *st = named(m, name);
        for (int64_t e = 0; st && e < ir_numel(p); e++)
          worst = fmax(worst, rel(it->f[st->id][e], refs[j][e]));
      }
    }
  }
  for (int k = 0; k < s.nparams; k++) {
    free(ref[k].p), free(ref[k].m), free(ref[k].v), free(ref[k].buf);
  }
  ir_interp_free(it);
  ir_module_free(m);
  return worst;
}

static void free_trace(Trace *tr) {
  for (int k = 0; k < 4; k++) {
    free(tr->init[k]);
    for (int t = 0; t < NSTEPS; t++) free(tr->grad[t][k]), free(tr->after[t][k]);
  }
}

static int test_interp(void) {
  for (int i = 0; i < NCASES; i++) {
    const Case *c = &cases[i];
    Trace tr = {0};
    double worst = run_case(c, &tr);
    int clipped = 0, unit = 1;
    for (int t = 0; t < NSTEPS; t++) clipped |= tr.coef[t] < 1, unit &= tr.coef[t] == 1;
    expect(worst <= 1e-12, "%s: %d steps match the C reference (max rel %.2e)", c->name, NSTEPS,
           worst);
    if (c->clip_active == 1) expect(clipped, "%s: clipping is active", c->name);
    else expect(unit, "%s: the clip coefficient stays 1 (%s)", c->name,
                c->clip_active ? "clip = 0" : "norm below clip");
    int moved = 1, same = 1;
    for (int k = 0; k < 3; k++) moved &= memcmp(tr.after[NSTEPS - 1][k], tr.init[k], sizeof(double)) != 0;
    same = !memcmp(tr.after[NSTEPS - 1][3], tr.init[3], 6 * sizeof(double));
    expect(moved && same, "%s: parameters with gradients move, the unused one does not", c->name);
    free_trace(&tr);
  }
  return fails != 0;
}

/* ---- the JSON dump for torch_oracle.py -------------------------------------------- */

static void json_array(FILE *f, const double *x, int64_t n) {
  if (!x) {
    fprintf(f, "null");
    return;
  }
  fputc('[', f);
  for (int64_t e = 0; e < n; e++) fprintf(f, "%s%.17g", e ? "," : "", x[e]);
  fputc(']', f);
}

static int dump(const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) die(path, "cannot write");
  fprintf(f, "[\n");
  for (int i = 0; i < NCASES; i++) {
    const Case *c = &cases[i];
    Trace tr = {0};
    run_case(c, &tr);
    Small s = build_small(NULL);
    fprintf(f, "%s{\"name\": \"%s\", \"optimizer\": \"%s\", \"beta1\": %.17g, \"beta2\": %.17g, "
               "\"eps\": %.17g, \"wd\": %.17g, \"momentum\": %.17g, \"clip\": %.17g,\n",
            i ? ",\n" : "", c->name, c->optimizer, c->beta1, c->beta2, c->eps, c->wd, c->momentum,
            c->clip);
    fprintf(f, " \"params\": [");
    for (int k = 0; k < s.nparams; k++) {
      IrNode *p = s.params[k];
      fprintf(f, "%s{\"name\": \"%s\", \"shape\": [", k ? ", " : "", p->name);
      for (int d = 0; d < p->rank; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
      fprintf(f, "], \"init\": ");
      json_array(f, tr.init[k], ir_numel(p));
      fprintf(f, "}");
    }
    fprintf(f, "],\n \"steps\": [");
    for (int t = 0; t < NSTEPS; t++) {
      fprintf(f, "%s{\"lr\": %.17g, \"grad_norm\": %.17g, \"grads\": [", t ? ",\n  " : "\n  ",
              tr.lr[t], tr.norm[t]);
      for (int k = 0; k < s.nparams; k++) {
        fprintf(f, "%s", k ? ", " : "");
        json_array(f, tr.grad[t][k], ir_numel(s.params[k]));
      }
      fprintf(f, "], \"after\": [");
      for (int k = 0; k < s.nparams; k++) {
        fprintf(f, "%s", k ? ", " : "");
        json_array(f, tr.after[t][k], ir_numel(s.params[k]));
      }
      fprintf(f, "]}");
    }
    fprintf(f, "]}");
    ir_module_free(s.m);
    free_trace(&tr);
  }
  fprintf(f, "\n]\n");
  return fclose(f) != 0;
}

/* ---- structure ------------------------------------------------------------------- */

static int count_op(const IrModule *m, IrOp op) {
  int k = 0;
  for (int i = 0; i < m->nnodes; i++) k += m->nodes[i]->op == op;
  return k;
}

static const IrNode *update_of(const IrModule *m, const char *name) {
  for (int k = 0; k < m->nupdates; k++)
    if (!strcmp(m->updates[k].leaf->name, name)) return m->updates[k].value;
  return NULL;
}

static int test_structure(void) {
  /* AdamW with decay: three updates per trained parameter, decay on rank >= 2 */
  Small s = build_small(&cases[0]);
  if (pass_autodiff(s.m)) die("autodiff", "failed");
  int before = s.m->nnodes;
  if (pass_optimizer(s.m)) die("optimizer", "failed");
  IrModule *m = s.m;
  must_verify(m, "after pass_optimizer");
  int opt_only = 1;
  for (int i = 0; i < m->nnodes; i++) opt_only &= (i < before) == (m->nodes[i]->phase != IR_PHASE_OPT);
  expect(opt_only, "adamw: every appended node, and only those, is in phase opt");
  expect(m->nupdates == 9, "adamw: 9 updates for 3 trained parameters (got %d)", m->nupdates);
  expect(count_op(m, IR_OP_STATE) == 6 && named(m, "l.w.exp_avg") && named(m, "l.t.exp_avg_sq") &&
             !named(m, "unused.exp_avg"),
         "adamw: exp_avg and exp_avg_sq per trained parameter, none for the unused one");
  expect(!update_of(m, "unused"), "adamw: the parameter without a gradient is not updated");
  expect(count_op(m, IR_OP_WEIGHT_DECAY) == 2 &&
             update_of(m, "l.b")->inputs[0] == s.params[1] &&
             update_of(m, "l.w")->inputs[0]->op == IR_OP_WEIGHT_DECAY &&
             update_of(m, "l.t")->inputs[0]->op == IR_OP_WEIGHT_DECAY,
         "adamw: decoupled decay on the rank-2 and rank-3 tensors, not on the bias");
  expect(count_op(m, IR_OP_SUMSQ) == 3 && m->grad_norm && m->grad_norm->op == IR_OP_GRAD_NORM &&
             m->grad_norm->ninputs == 3,
         "adamw: grad_norm over one sumsq per gradient, recorded on the module");
  expect(count_op(m, IR_OP_BIAS_CORRECTION) == 2 && count_op(m, IR_OP_CLIP_COEF) == 1,
         "adamw: one clip coefficient, two bias corrections, shared");
  int layer_ok = 1;
  for (int i = before; i < m->nnodes; i++) layer_ok &= m->nodes[i]->layer == -1;
  expect(layer_ok, "adamw: nodes take their parameter's layer (-1 here)");
  FILE *f = tmpfile();
  if (!f) die("tmpfile", "cannot create");
  ir_print(f, m);
  long len = ftell(f);
  char *text = calloc((size_t)len + 1, 1);
  rewind(f);
  if (fread(text, 1, (size_t)len, f) != (size_t)len) die("tmpfile", "short read");
  fclose(f);
  char want[64];
  snprintf(want, sizeof want, "update l.w = %%%d\n", update_of(m, "l.w")->id);
  expect(strstr(text, want) && strstr(text, "update l.w.exp_avg = %") &&
             strstr(text, "grad_norm = %") && strstr(text, "# phase opt,") &&
             strstr(text, "= state l.t.exp_avg_sq : f32[2, 4, 5]") &&
             strstr(text, "adam_moment %") && strstr(text, "square=1 beta=0.95"),
         "adamw: the IR text shows state, phases, grad_norm and updates");
  free(text);
  ir_module_free(m);

  /* SGD: momentum state only when momentum > 0 */
  s = build_trained(&cases[3]);
  expect(s.m->nupdates == 3 && count_op(s.m, IR_OP_STATE) == 0 && count_op(s.m, IR_OP_SGD_MOMENTUM) == 0,
         "sgd, momentum 0: 3 updates, no state");
  int wd_ok = 1;
  for (int i = 0; i < s.m->nnodes; i++) {
    const IrNode *n = s.m->nodes[i];
    if (n->op == IR_OP_SGD_GRAD) wd_ok &= n->fa == (n->inputs[2]->rank >= 2 ? 0.1 : 0.0);
  }
  expect(wd_ok, "sgd: coupled decay on rank >= 2 only");
  ir_module_free(s.m);
  s = build_trained(&cases[4]);
  expect(s.m->nupdates == 6 && count_op(s.m, IR_OP_STATE) == 3 && named(s.m, "l.b.momentum_buffer"),
         "sgd, momentum 0.9: a momentum_buffer per trained parameter");
  ir_module_free(s.m);

  /* a loss no parameter reaches: nothing to append */
  IrModule *e = ir_module_new("e");
  IrNode *x = leaf(e, IR_OP_INPUT, "x", 1, (int64_t[]){3});
  leaf(e, IR_OP_PARAM, "p", 1, (int64_t[]){3});
  e->loss = node(e, IR_OP_SUM, x, NULL, 0);
  e->optimizer = "sgd";
  int n = 0;
  set_setting(e, &e->optim, &n, "momentum", 0.9);
  set_setting(e, &e->optim, &n, "wd", 0);
  e->noptim = n, n = 0;
  set_setting(e, &e->train, &n, "clip", 1);
  e->ntrain = n;
  int nn = e->nnodes;
  expect(pass_autodiff(e) == 0 && pass_optimizer(e) == 0 && e->nnodes == nn && !e->nupdates &&
             !e->grad_norm,
         "no gradients: the pass appends nothing");
  ir_module_free(e);
  return fails != 0;
}

/* ---- errors ---------------------------------------------------------------------- */

static void set_f(IrSetting *s, int n, const char *name, double v) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s[i].name, name)) s[i].f = v;
}

static int refuses(Small s, const char *what) {
  int rc = pass_autodiff(s.m) == 0 ? pass_optimizer(s.m) : 0;
  expect(rc == -1, "refuses %s", what);
  ir_module_free(s.m);
  return rc;
}

static int test_errors(void) {
  Small s = build_trained(&cases[0]);
  expect(pass_optimizer(s.m) == -1, "refuses a module that already has its optimizer");
  ir_module_free(s.m);

  s = build_small(&cases[0]);
  s.m->optimizer = NULL;
  refuses(s, "a module without optimizer settings");
  s = build_small(&cases[0]);
  s.m->optimizer = "lion";
  refuses(s, "an unknown optimizer");
  s = build_small(&cases[0]);
  s.m->noptim = 2; /* no eps, no wd */
  refuses(s, "missing settings");
  s = build_small(&cases[0]);
  s.m->ntrain = 1; /* no clip */
  refuses(s, "a missing clip setting");
  s = build_small(&cases[0]);
  set_f(s.m->optim, s.m->noptim, "beta1", 1.0);
  refuses(s, "beta1 = 1 (bias correction 0)");
  s = build_small(&cases[0]);
  set_f(s.m->optim, s.m->noptim, "beta2", NAN);
  refuses(s, "beta2 = nan");
  s = build_small(&cases[3]);
  set_f(s.m->optim, s.m->noptim, "wd", -0.1);
  refuses(s, "negative weight decay");
  s = build_small(&cases[0]);
  s.r->name = "lr";
  refuses(s, "a model value named lr");
  s = build_small(&cases[0]);
  s.params[3]->name = "l.w.exp_avg";
  refuses(s, "a model value with a state's name");
  return fails != 0;
}

/* ---- the verifier ---------------------------------------------------------------- */

static void rejects(Small s, const char *what, const char *needle) {
  char why[512] = "";
  int rc = ir_verify(s.m, why, sizeof why);
  expect(rc != 0 && strstr(why, needle), "verify rejects %s (%s)", what, rc ? why : "accepted");
  ir_module_free(s.m);
}

static IrNode *find_op(const IrModule *m, IrOp op) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == op) return m->nodes[i];
  return NULL;
}

static int test_verify(void) {
  Small s = build_trained(&cases[0]);
  char why[512];
  expect(ir_verify(s.m, why, sizeof why) == 0, "verify accepts the optimizer's module");
  ir_module_free(s.m);

  s = build_trained(&cases[0]);
  s.m->updates[0].leaf = s.x;
  s.m->updates[0].value = find_op(s.m, IR_OP_MATMUL);
  rejects(s, "an update of an input", "not a parameter or optimizer state");

  s = build_trained(&cases[0]);
  s.m->updates[0].leaf = find_op(s.m, IR_OP_GELU);
  rejects(s, "an update of an op node", "not a parameter or optimizer state");

  s = build_trained(&cases[0]);
  s.m->updates[1].leaf = s.m->updates[0].leaf;
  s.m->updates[1].value = s.m->updates[0].value;
  rejects(s, "a leaf updated twice", "updated more than once");

  s = build_trained(&cases[0]);
  for (int k = 0; k < s.m->nupdates; k++)
    if (s.m->updates[k].leaf == s.params[1]) s.m->updates[k].value = find_op(s.m, IR_OP_MATMUL);
  rejects(s, "a value of another shape", "value %");

  s = build_trained(&cases[0]);
  {
    IrNode *ids = leaf(s.m, IR_OP_INPUT, "ids", 1, (int64_t[]){5});
    ids->dtype = IR_I32;
    for (int k = 0; k < s.m->nupdates; k++)
      if (s.m->updates[k].leaf == s.params[1]) s.m->updates[k].value = ids;
  }
  rejects(s, "a value of another dtype", "i32[5]");

  s = build_trained(&cases[0]);
  s.m->updates[2].value = NULL;
  rejects(s, "a missing value", "not a node of this module");

  s = build_trained(&cases[0]);
  {
    IrNode stray = *s.params[0];
    stray.id = 3; /* a copy: same id, not the module's node */
    s.m->updates[2].leaf = &stray;
    rejects(s, "a leaf from elsewhere", "not a node of this module");
  }

  s = build_trained(&cases[0]);
  s.m->grad_norm = s.params[0]->grad;
  rejects(s, "a grad_norm that is not a scalar", "grad_norm");

  s = build_trained(&cases[0]);
  named(s.m, "l.w.exp_avg")->dtype = IR_I32;
  rejects(s, "optimizer state that is not f32", "not f32");

  s = build_trained(&cases[0]);
  node(s.m, IR_OP_ADD, s.m->loss, named(s.m, "lr"), 0); /* phase fwd */
  rejects(s, "a forward node reading an optimizer node", "reads an optimizer node");

  s = build_trained(&cases[0]);
  node(s.m, IR_OP_ADD, s.params[0]->grad, find_op(s.m, IR_OP_CLIP_COEF), 0)->phase = IR_PHASE_W;
  rejects(s, "a W node reading an optimizer node", "reads an optimizer node");

  s = build_trained(&cases[0]);
  find_op(s.m, IR_OP_BIAS_CORRECTION)->fa = 1.0;
  rejects(s, "beta = 1 on bias_correction", "beta = 1");

  s = build_trained(&cases[0]);
  {
    IrNode *mom = find_op(s.m, IR_OP_ADAM_MOMENT);
    mom->inputs[2] = mom->inputs[1]; /* coef replaced by a tensor */
  }
  rejects(s, "a tensor where adam_moment takes a scalar", "must be a scalar");

  s = build_trained(&cases[0]);
  find_op(s.m, IR_OP_ADAM_UPDATE)->inputs[1] = s.params[1];
  rejects(s, "adam_update with a moment of another shape", "must have the shape of operand 1");
  return fails != 0;
}

/* ---- a whole model ---------------------------------------------------------------- */

static int test_model(const char *path, const char *const *defines, int ndefines) {
  IrModule *m = test_load(path, defines, ndefines);
  if (!m) die(path, "does not compile");
  if (pass_autodiff(m) || pass_optimizer(m)) die(path, "a pass failed");
  must_verify(m, "after pass_optimizer");
  int ngrad = 0, nstate = 0, names_ok = 1, ndecay = 0, nmatrix = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    ngrad += n->grad != NULL;
    nmatrix += n->grad && n->rank >= 2;
    ndecay += n->op == IR_OP_WEIGHT_DECAY;
    if (n->op != IR_OP_STATE) continue;
    nstate++;
    const char *dot = strrchr(n->name, '.');
    names_ok &= dot && (!strcmp(dot, ".exp_avg") || !strcmp(dot, ".exp_avg_sq"));
  }
  int adamw = !strcmp(m->optimizer, "adamw");
  expect(adamw, "%s: the model trains with adamw", m->name);
  expect(m->nupdates == 3 * ngrad && nstate == 2 * ngrad && names_ok,
         "%s: %d parameters, %d updates, state named after PyTorch's keys", m->name, ngrad,
         m->nupdates);
  const double *wd = NULL;
  for (int i = 0; i < m->noptim; i++)
    if (!strcmp(m->optim[i].name, "wd")) wd = &m->optim[i].f;
  expect(wd && (*wd == 0 ? ndecay == 0 : ndecay == nmatrix),
         "%s: decay on the %d tensors of rank >= 2 (%d weight_decay nodes)", m->name, nmatrix,
         ndecay);
  const IrNode *ln = named(m, "h.0.ln_1.weight");
  expect(!ln || (update_of(m, "h.0.ln_1.weight") && named(m, "h.0.ln_1.weight.exp_avg") &&
                 named(m, "h.0.ln_1.weight.exp_avg")->layer == ln->layer),
         "%s: state keeps its parameter's layer", m->name);

  /* three steps on one fixed batch: the loss goes down */
  IrInterp *it = ir_interp_new(m);
  rng_s = 12345;
  for (int k = 0; k < m->nnodes; k++) {
    const IrNode *n = m->nodes[k];
    for (int64_t e = 0; e < ir_numel(n); e++) {
      if (n->op == IR_OP_INPUT && n->dtype == IR_I32) it->i[k][e] = (int32_t)uniform(0, 200);
      else if (n->op != IR_OP_PARAM) break;
      else if (n->init == IR_INIT_ONES) it->f[k][e] = 1;
      else if (n->init == IR_INIT_ZEROS) it->f[k][e] = 0;
      else it->f[k][e] = n->init_std * sqrt(3) * uniform(-1, 1);
    }
  }
  IrNode *lr = named(m, "lr"), *step = named(m, "step");
  double loss[4];
  for (int t = 0; t < 4; t++) {
    it->f[lr->id][0] = 1e-2;
    it->f[step->id][0] = t + 1;
    run_or_die(it);
    loss[t] = it->f[m->loss->id][0];
    ir_interp_end_step(it);
  }
  expect(loss[3] < loss[2] && loss[2] < loss[1] && loss[1] < loss[0],
         "%s: loss %.4f -> %.4f -> %.4f -> %.4f over three AdamW steps", m->name, loss[0],
         loss[1], loss[2], loss[3]);
  ir_interp_free(it);
  ir_module_free(m);
  return fails != 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "interp")) return test_interp();
  if (argc == 3 && !strcmp(argv[1], "dump")) return dump(argv[2]);
  if (argc >= 2 && !strcmp(argv[1], "structure")) return test_structure();
  if (argc >= 2 && !strcmp(argv[1], "errors")) return test_errors();
  if (argc >= 2 && !strcmp(argv[1], "verify")) return test_verify();
  if (argc >= 3 && !strcmp(argv[1], "model"))
    return test_model(argv[2], (const char *const *)argv + 3, argc - 3);
  fprintf(stderr, "usage: optim_test interp|structure|errors|verify|dump FILE|model F.dsl ...\n");
  return 2;
}
