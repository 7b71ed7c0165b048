/* tests/codegen/cg_remat_norm.c -- parc --recompute norms (passes/remat_norm.c)
 * and the kernels it gets (codegen/cg_kernels.h, FUSION).
 *
 *   cg_remat_norm [--tp N [--sp]] MODEL.dsl [NAME=VALUE ...]
 *
 * The model goes through every pass twice as `parc -o` compiles it (sharded
 * over tp first with --tp, with sequence parallelism with --sp), without
 * and with the pass.  With it:
 *   - every norm the forward computes inside a repeat has exactly one twin
 *     in the backward (phase B or W): the same op on the same inputs with
 *     the same eps, in the same layer, after every forward node, in the
 *     phase of its first reader;
 *   - no backward node reads a forward norm, or a forward group_copy,
 *     reshape, all_gather or replicate of one, or a reshape of that gather,
 *     any more (they read the twins and the twins' gathers, one gather a
 *     twin with --sp); the forward is the same ops as without the pass;
 *   - each norm and its twin are kernels of their own (no fused prologue or
 *     epilogue) of one canonical code, reading the same buffers: the twin
 *     stores the forward's bits;
 *   - the arena's live peak (train.c's plan) is smaller than without the
 *     pass, by at least one norm output (the backward's first layer keeps
 *     its own), and the IR verifies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/arena_plan.h"
#include "codegen/cg_kernels.h"
#include "passes/passes.h"
#include "tests/support/load.h"

static int is_norm(const IrNode *n) { return n->op == IR_OP_LAYERNORM || n->op == IR_OP_RMSNORM; }

static int backward(const IrNode *n) { return n->phase == IR_PHASE_B || n->phase == IR_PHASE_W; }

static IrModule *compile(const char *path, const char *const *defs, int n, int tp, int sp,
                         int recompute) {
  IrModule *m = test_load(path, defs, n);
  if (!m) return NULL;
  char err[512] = "";
  if (tp > 1 && pass_shard(m, tp, 1, sp, err, sizeof err)) {
    printf("FAIL: sharding over tp %d: %s\n", tp, err);
    return NULL;
  }
  PassOptions popt = {.verify = 1, .start_after = "dce", .recompute_norms = recompute};
  if (pass_run_all(m, &popt)) {
    printf("FAIL: the passes\n");
    return NULL;
  }
  return m;
}

/* train.c's arena plan of m: its live peak; *kp and *canon kept */
static int64_t plan(IrModule *m, CgKernelPlan *kp, int **canon) {
  int *pos, *held;
  BufPlan bp;
  char err[256];
  if (cg_plan_step(m, 1, NULL, kp, &pos, &bp, &held, err, sizeof err)) {
    printf("FAIL: the step's plan: %s\n", err);
    return -1;
  }
  free(held);
  *canon = arena_alloc(&m->arena, sizeof(int) * (size_t)(kp->nkernels + 1));
  cg_dedup_kernels(kp, *canon);
  return bp.live_peak;
}

int main(int argc, char **argv) {
  int tp = 1, sp = 0, a = 1;
  if (a + 1 < argc && !strcmp(argv[a], "--tp")) tp = atoi(argv[a + 1]), a += 2;
  if (a < argc && !strcmp(argv[a], "--sp")) sp = 1, a++;
  if (a >= argc || tp < 1 || (sp && tp < 2)) {
    fprintf(stderr, "usage: cg_remat_norm [--tp N [--sp]] MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  const char *const *defs = (const char *const *)argv + a + 1;
  int ndefs = argc - a - 1;
  IrModule *m0 = compile(argv[a], defs, ndefs, tp, sp, 0);
  IrModule *m = compile(argv[a], defs, ndefs, tp, sp, 1);
  if (!m0 || !m) return 1;
  int fails = 0, norms = 0, twins = 0, last_fwd = -1;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->phase == IR_PHASE_FWD) last_fwd = i;
  int *twin = malloc(sizeof *twin * (size_t)m->nnodes);
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    twin[i] = -1;
    if (!is_norm(p) || p->phase != IR_PHASE_FWD || p->layer < 0) continue;
    norms++;
    int found = 0;
    for (int j = 0; j < m->nnodes; j++) {
      const IrNode *q = m->nodes[j];
      int same = is_norm(q) && backward(q) && q->op == p->op && q->ninputs == p->ninputs &&
                 q->fa == p->fa && q->layer == p->layer;
      for (int k = 0; same && k < p->ninputs; k++) same = q->inputs[k] == p->inputs[k];
      if (!same) continue;
      found++;
      twin[i] = j;
      if (j < last_fwd) {
        printf("FAIL: the twin %%%d of %%%d runs before the forward ends (%%%d)\n", j, i,
               last_fwd);
        fails++;
      }
      int first = -1; /* its first reader: in its phase */
      for (int r = j + 1; r < m->nnodes && first < 0; r++)
        for (int k = 0; k < m->nodes[r]->ninputs; k++)
          if (m->nodes[r]->inputs[k] == q) first = r;
      if (first < 0 || m->nodes[first]->phase != q->phase) {
        printf("FAIL: the twin %%%d of %%%d has no reader in its phase (%%%d)\n", j, i, first);
        fails++;
      }
    }
    if (found != 1) {
      printf("FAIL: the forward norm %%%d (layer %d) has %d twins in the backward\n", i,
             p->layer, found);
      fails++;
    }
    twins += found == 1;
  }
  /* no backward reader of a forward norm or of its forward group_copy,
   * view or gather (or the gather's view) */
  int gathers = 0; /* the backward's gathers of twins */
  for (int r = 0; r < m->nnodes; r++) {
    const IrNode *n = m->nodes[r];
    if (!backward(n)) continue;
    gathers += (n->op == IR_OP_ALL_GATHER || n->op == IR_OP_REPLICATE) &&
               is_norm(n->inputs[0]) && backward(n->inputs[0]);
    for (int k = 0; k < n->ninputs; k++) {
      const IrNode *v = n->inputs[k], *p = v;
      for (int up = 0; up < 2; up++) /* its copy, view, gather, or the gather's view */
        if ((p->op == IR_OP_GROUP_COPY || p->op == IR_OP_RESHAPE ||
             p->op == IR_OP_ALL_GATHER || p->op == IR_OP_REPLICATE) && p->phase == IR_PHASE_FWD)
          p = p->inputs[0];
      if (is_norm(p) && p->phase == IR_PHASE_FWD && p->layer >= 0) {
        printf("FAIL: the backward's %%%d (%s) still reads %%%d (%s)\n", r,
               ir_op_info[n->op].name, v->id, ir_op_info[v->op].name);
        fails++;
      }
    }
  }
  /* the forward reads what it read without the pass: the same ops in the
   * same order up to the forward's end */
  int same_fwd = 1;
  for (int i = 0, j = 0; i < m0->nnodes && j < m->nnodes && same_fwd; i++, j++) {
    while (j < m->nnodes && backward(m->nodes[j]) && is_norm(m->nodes[j])) j++;
    if (j < m->nnodes && m0->nodes[i]->phase == IR_PHASE_FWD)
      same_fwd = m0->nodes[i]->op == m->nodes[j]->op;
  }
  if (!same_fwd) {
    printf("FAIL: the forward changed\n");
    fails++;
  }
  CgKernelPlan k0, k1;
  int *c0, *c1;
  int64_t peak0 = plan(m0, &k0, &c0), peak1 = plan(m, &k1, &c1);
  for (int i = 0; i < m->nnodes && peak1 >= 0; i++) {
    if (twin[i] < 0) continue;
    int a0 = k1.kernel_of[i], a1 = k1.kernel_of[twin[i]];
    if (a0 < 0 || a1 < 0 || k1.kernels[a0].nnodes != 1 || k1.kernels[a1].nnodes != 1 ||
        c1[a0] != c1[a1] || k1.kernels[a0].nargs != k1.kernels[a1].nargs) {
      printf("FAIL: norm %%%d and its twin %%%d are not kernels of one code of their own\n", i,
             twin[i]);
      fails++;
      continue;
    }
    for (int p = 0; p < k1.kernels[a0].nargs; p++) {
      int x = k1.kernels[a0].arg_node[p], y = k1.kernels[a1].arg_node[p];
      if (x != y && !(x == i && y == twin[i])) {
        printf("FAIL: norm %%%d reads buffer %d, its twin %%%d buffer %d\n", i, x, twin[i], y);
        fails++;
      }
    }
  }
  int64_t one = 0; /* a norm output's bytes */
  for (int i = 0; i < m->nnodes && !one; i++)
    if (twin[i] >= 0) one = 4 * ir_numel(m->nodes[i]);
  if (!twins || peak0 < 0 || peak1 < 0 || peak0 - peak1 < one) {
    printf("FAIL: %d norms recomputed; live peak %lld bytes, %lld without the pass\n", twins,
           (long long)peak1, (long long)peak0);
    fails++;
  }
  if (sp && gathers != twins) { /* --sp: each twin gathered again for the weight gradients */
    printf("FAIL: %d twins, %d gathered again in the backward\n", twins, gathers);
    fails++;
  }
  printf("%s %s tp %d%s: %d of %d norms recomputed (%d gathered again); live peak %lld -> "
         "%lld bytes\n", fails ? "FAIL" : "ok  ", m->name, tp, sp ? " sp" : "", twins, norms,
         gathers, (long long)peak0, (long long)peak1);
  cg_plan_free(&k0);
  cg_plan_free(&k1);
  free(twin);
  ir_module_free(m0);
  ir_module_free(m);
  return fails != 0;
}
