/* tests/codegen/cg_explain.c -- `parc --explain` (codegen/explain.h) against
 * the plans it explains.
 *
 *   cg_explain [--tp N] [--no-fuse] [--tied] MODEL.dsl [NAME=VALUE ...]
 *
 * The model goes through every pass as `parc -o` compiles it (sharded over
 * tp first with --tp), and is planned as codegen/project.c plans it.  For
 * train.c's arena and, where the GPU trainer has one of its own (bf16), for
 * that one:
 *   - the peak cg_explain_peak finds is the one the planner counted while it
 *     placed the buffers (BufPlan.live_peak, freed from a free list: another
 *     computation of the same lives), and no arena is smaller than it;
 *   - at that position, the bytes of every buffer whose owner is written at
 *     or before it and read at or after it (a brute-force scan over nodes,
 *     the lives taken from last_use of all the nodes sharing a buffer) sum
 *     to the same, and the groups' bytes and values add up to it and to the
 *     buffers counted;
 *   - a group holds nodes of one op, phase and source location, and no two
 *     groups have the same key;
 *   - the buffers cut in two halves (cg_explain_peak's only): each half peaks
 *     at no more than the whole, and the two peaks add up to no less.
 * For the predicted step: the groups' seconds plus the params' bf16 copy
 * (its one call outside every node) are the step model's compute time, and
 * the groups' calls are the nodes with a call.  cg_explain itself must print
 * each part it is asked for and nothing else.  A weight's two gradient terms,
 * one an embedding's (the tied token table: --tied asks for one), are summed
 * by the embedding gradient's call onto the other's bytes
 * (codegen/grad_onto.h), as the step model counts it. */
#define _GNU_SOURCE /* open_memstream */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/arena_plan.h"
#include "codegen/explain.h"
#include "codegen/host_cuda.h"
#include "codegen/step_model.h"
#include "passes/machine.h"
#include "passes/passes.h"
#include "tests/support/load.h"

static int fails;

static void fail(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(const char *what, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: %s: ", what);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fails++;
}

/* The brute-force live bytes of p at position t. */
static int64_t live_at(const IrModule *m, const BufPlan *p, const int *pos, int t) {
  int64_t sum = 0;
  for (int r = 0; r < m->nnodes; r++) {
    if (p->offset[r] < 0 || p->alias[r] >= 0) continue;
    int last = p->last_use[r];
    for (int i = 0; i < m->nnodes; i++) { /* the nodes whose alias chain ends at r */
      int o = i;
      while (o >= 0 && p->offset[o] >= 0 && p->alias[o] >= 0) o = p->alias[o];
      if (o == r && p->offset[i] >= 0 && p->last_use[i] > last) last = p->last_use[i];
    }
    if (pos[r] <= t && t <= last) sum += p->size[r];
  }
  return sum;
}

static void check_arena(const IrModule *m, const CgKernelPlan *kp, const BufPlan *p,
                        const int *pos, const char *which) {
  CgExplainGroup *g = malloc(sizeof *g * (size_t)(m->nnodes + 1));
  int at = -1, buffers = -1;
  int64_t live = -1;
  int ng = cg_explain_peak(m, p, pos, NULL, &at, &live, &buffers, g);
  if (ng <= 0) {
    fail(which, "%d groups", ng);
    free(g);
    return;
  }
  if (live != p->live_peak)
    fail(which, "peak %lld bytes live, the planner counted %lld", (long long)live,
         (long long)p->live_peak);
  if (live > p->peak) fail(which, "peak %lld bytes live in an arena of %lld", (long long)live,
                                 (long long)p->peak);
  int64_t brute = live_at(m, p, pos, at);
  if (brute != live) fail(which, "at the peak %lld bytes live by a scan, %lld explained",
                          (long long)brute, (long long)live);
  double sum = 0;
  int values = 0;
  for (int k = 0; k < ng; k++) {
    sum += g[k].amount;
    values += g[k].count;
    if (k && g[k].amount > g[k - 1].amount) fail(which, "group %d larger than group %d", k, k - 1);
    for (int j = 0; j < k; j++) {
      const IrNode *a = g[j].first, *b = g[k].first;
      if (a->op == b->op && a->phase == b->phase && a->loc.line == b->loc.line &&
          a->loc.col == b->loc.col && a->loc.file == b->loc.file)
        fail(which, "groups %d and %d have one key", j, k);
    }
  }
  if ((int64_t)sum != live) fail(which, "the groups hold %.0f bytes of %lld", sum, (long long)live);
  if (values != buffers) fail(which, "the groups hold %d values of %d buffers", values, buffers);
  /* two halves of the buffers (owners by id parity): each peaks at no more
   * than the whole, and together at no less (at the whole's peak they hold
   * all of it) */
  unsigned char *half = malloc((size_t)m->nnodes + 1);
  int64_t part[2];
  for (int h = 0; h < 2; h++) {
    for (int i = 0; i < m->nnodes; i++) half[i] = (i & 1) == h;
    int a2, b2;
    cg_explain_peak(m, p, pos, half, &a2, &part[h], &b2, g);
  }
  if (part[0] > live || part[1] > live || part[0] + part[1] < live || !part[0] || !part[1])
    fail(which, "halves peak at %lld and %lld bytes, the whole at %lld", (long long)part[0],
         (long long)part[1], (long long)live);
  free(half);
  printf("  %s: peak %lld bytes live at position %d (%s), arena %lld, %d groups\n", which,
         (long long)live, at, ir_op_info[m->nodes[at]->op].name, (long long)p->peak, ng);
  free(g);
}

static void check_step(const IrModule *m, const CgStepPlan *sp) {
  double *t = calloc((size_t)m->nnodes + 1, sizeof *t);
  CgExplainGroup *g = malloc(sizeof *g * (size_t)(m->nnodes + 1));
  StepTime st;
  int bf16 = machine_bf16(m);
  cg_step_times(m, &sp->kp, machine_default, bf16, &sp->store, &sp->batches, 1, &st, t);
  int ng = cg_explain_calls(m, &sp->kp, t, g), calls = 0, nodes = 0;
  double sum = 0;
  for (int k = 0; k < ng; k++) sum += g[k].amount, calls += g[k].count;
  for (int i = 0; i < m->nnodes; i++) nodes += t[i] > 0;
  double compute = st.fwd_s + st.bwd_s + st.opt_s, copy = 0;
  if (bf16 && cg_cuda_weights_read(m, sp->store.weights) && /* step_model.c's arithmetic */
      !sp->store.mirror_all) { /* (else the kernels that update the params store it) */
    double params = (double)cg_params_numel(m);
    copy = machine_default->kernel_s + 6 * params / machine_default->mem_bytes_per_s;
  }
  if (sum + copy < compute * (1 - 1e-9) || sum + copy > compute * (1 + 1e-9))
    fail("step", "the groups' %.9f s and the params' copy's %.9f s, a step of %.9f s", sum,
         copy, compute);
  if (calls != nodes) fail("step", "the groups hold %d calls of %d", calls, nodes);
  /* an embedding moves its ids, the table rows they name and its f32 result,
   * as the GPU profile counts it (runtime/cuda/rt_cuda_ops.cu embed): not the
   * table (an 8 B Llama's is 2 GB, its rows a step 134 MB), nor more than
   * the table (a vocabulary-parallel member's slice, smaller than the rows) */
  const Machine *mc = machine_default;
  for (int i = 0; i < m->nnodes && mc->parallel_call_s == 0; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_EMBEDDING && n->op != IR_OP_VOCAB_EMBEDDING) continue;
    double rows = 4.0 * (double)ir_numel(n), table = 4.0 * (double)ir_numel(n->inputs[1]);
    double bytes = 4.0 * (double)ir_numel(n->inputs[0]) + (rows < table ? rows : table) + rows;
    double want = mc->kernel_s + bytes / mc->mem_bytes_per_s;
    if (t[i] < want * (1 - 1e-9) || t[i] > want * (1 + 1e-9))
      fail("step", "embedding %%%d: %.9f s, its ids, rows and result %.9f s", i, t[i], want);
  }
  printf("  step: %.3f ms in %d groups of %d nodes' calls\n", compute * 1e3, ng, nodes);
  free(t), free(g);
}

/* A weight's two gradient terms, z = add(x, embedding_grad(ids, dy)) with
 * nothing else reading x or y (GPT-2's tied token table): y's call adds onto
 * x's bytes (codegen/grad_onto.h), z is x's bytes in both trainers' plans
 * and runs no kernel, and the step model charges z nothing and y the rows
 * of its ids read and written (ids, dy, 2 x the rows, at most the table),
 * not the table zeroed and written.  Returns how many. */
static int check_onto(const IrModule *m, const CgStepPlan *sp) {
  const CgKernelPlan *kp = &sp->kp;
  double *t = calloc((size_t)m->nnodes + 1, sizeof *t);
  StepTime st;
  cg_step_times(m, kp, machine_default, machine_bf16(m), &sp->store, &sp->batches, 1, &st, t);
  int count = 0;
  for (int i = 0; i + 1 < m->nnodes; i++) {
    const IrNode *y = m->nodes[i], *z = m->nodes[i + 1];
    if (y->op != IR_OP_EMBEDDING_GRAD && y->op != IR_OP_VOCAB_EMBEDDING_GRAD) continue;
    if (z->op != IR_OP_ADD || z->inputs[1] != y) continue;
    const IrNode *x = z->inputs[0];
    int readers = 0;
    for (int r = 0; r < m->nnodes; r++)
      for (int q = 0; q < m->nodes[r]->ninputs; q++)
        readers += m->nodes[r]->inputs[q] == x || m->nodes[r]->inputs[q] == y;
    if (readers != 2) continue;
    count++;
    const int k = kp->kernel_of[z->id];
    if (!kp->onto || kp->onto[i] != x->id || k < 0 || !cg_kernel_is_view(kp, &sp->bp, k) ||
        !cg_kernel_is_view(kp, &sp->gbp, k) || sp->bp.offset[z->id] != sp->bp.offset[x->id]) {
      fail("onto", "%%%d's gradient is not added onto %%%d's bytes by %%%d's call", z->id, x->id,
           i);
      continue;
    }
    const Machine *mc = machine_default;
    double rows = 4.0 * (double)ir_numel(y->inputs[1]), table = 4.0 * (double)ir_numel(y);
    double want = mc->kernel_s + (4.0 * (double)ir_numel(y->inputs[0]) + rows +
                                  2 * (rows < table ? rows : table)) / mc->mem_bytes_per_s;
    if (t[z->id] != 0 || (mc->parallel_call_s == 0 &&
                          (t[i] < want * (1 - 1e-9) || t[i] > want * (1 + 1e-9))))
      fail("onto", "%%%d charged %.9f s (want 0), %%%d %.9f s (want %.9f)", z->id, t[z->id], i,
           t[i], want);
  }
  free(t);
  return count;
}

/* cg_explain prints what it is asked for: the arena lines, the step lines. */
static void check_print(IrModule *m, int fuse) {
  for (unsigned what = 1; what <= 3; what++) {
    char *text = NULL, err[256];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = cg_explain(f, m, NULL, what, fuse, NULL, machine_bf16(m), CG_STORE_BF16, 1, NULL, 0,
                        CG_EXPLAIN_ROWS,
                        err, sizeof err);
    fclose(f);
    int mem = strstr(text, "live at the peak") != NULL;
    int step = strstr(text, "predicted step") != NULL;
    if (rc || mem != !!(what & CG_EXPLAIN_MEMORY) || step != !!(what & CG_EXPLAIN_STEP))
      fail("print", "explain %u printed memory %d, step %d (rc %d)", what, mem, step, rc);
    free(text);
  }
}

int main(int argc, char **argv) {
  int tp = 1, fuse = 1, tied = 0, a = 1;
  for (; a < argc && argv[a][0] == '-'; a++) {
    if (!strcmp(argv[a], "--tp") && a + 1 < argc) tp = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--no-fuse")) fuse = 0;
    else if (!strcmp(argv[a], "--tied")) tied = 1;
    else break;
  }
  if (a >= argc || tp < 1) {
    fprintf(stderr, "usage: cg_explain [--tp N] [--no-fuse] [--tied] MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  const char *const *defs = (const char *const *)argv + a + 1;
  IrModule *m = tp > 1 ? test_load(argv[a], defs, argc - a - 1)
                       : test_load_full(argv[a], defs, argc - a - 1);
  if (!m) return 1;
  char err[512];
  if (tp > 1) { /* as the driver: shard after dce, then every later pass */
    PassOptions popt = {.verify = 1, .start_after = "dce"};
    if (pass_shard(m, tp, 1, 0, err, sizeof err) || pass_run_all(m, &popt)) {
      printf("FAIL: sharding over tp %d: %s\n", tp, err);
      return 1;
    }
  }
  CgStepPlan sp;
  if (cg_plan_whole_step(m, fuse, NULL, machine_bf16(m), CG_STORE_BF16, 1, &sp, err, sizeof err)) {
    printf("FAIL: the step's plan: %s\n", err);
    return 1;
  }
  printf("%s tp %d%s (%s):\n", m->name, tp, fuse ? "" : " unfused",
         machine_bf16(m) ? "bf16" : "fp32");
  check_arena(m, &sp.kp, &sp.bp, sp.pos, "train.c's arena");
  if (sp.gbp.narrow) check_arena(m, &sp.kp, &sp.gbp, sp.pos, "the GPU trainer's arena");
  else if (machine_bf16(m)) fail("bf16", "no GPU arena of its own");
  check_step(m, &sp);
  int onto = check_onto(m, &sp);
  if (tied && !onto) fail("onto", "no embedding gradient goes onto the tied head's");
  printf("  %d embedding gradients onto another term's bytes\n", onto);
  cg_step_plan_free(&sp);
  check_print(m, fuse);
  printf("%s\n", fails ? "FAIL" : "ok");
  ir_module_free(m);
  return fails != 0;
}
