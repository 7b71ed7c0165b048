/* tests/codegen/cg_batch.c -- the GPU trainer's batched launches
 * (codegen/cuda_batch.h) change no value any launch reads.
 *
 *   cg_batch [--no-fuse] MODEL.dsl [NAME=VALUE ...]
 *
 * The model is loaded as the driver does, through every pass (test_load_full),
 * and planned as codegen/project.c plans it (fused kernels, the
 * buffer plan with views, the leaf plan, the shared code, the bf16 stores,
 * the GPU trainer's arena, then the batches).  The test then runs the
 * step's kernel launches twice on a shadow of the memory -- for every 4-byte
 * word of the arena, the params
 * and the state, the launch that last wrote it -- first in the plan's order,
 * one launch each, then as the trainer runs them (a batch where its first
 * member ran: all its members read, then all write; members elsewhere run
 * nothing).  Every launch must read words last written by the same launches
 * in both runs, and the memory must end the same.  The bytes are worked out
 * here, independently of the planner's.  Also: no batch spans a runtime op
 * or a change of phase, no batch has more members than its code's batched
 * form takes, and the model has batches at all (its optimizer's small
 * parameters).  The bias sums computed with a GEMM (in_gemm) run, in the
 * trainer's order, where that GEMM runs (before the first kernel rooted
 * after it), so the same comparison holds their input's bytes unchanged
 * until then and their result's bytes written by nobody else between; each
 * such kernel is one sum_to, alone, whose GEMM is a later matmul_ta, a
 * bias add whose GEMM is the earlier matmul it adds to, that add with the
 * GELU of its result, or a GELU's gradient whose GEMM is the earlier matmul
 * of its dy (and the plan says which: CgCudaBatches.epi).  --no-fuse plans one kernel per node (parc --no-fuse): short-lived
 * buffers whose bytes the arena hands on within a batch's reach, which a
 * launch moved too early would clobber.  Prints the batches and the launches
 * they absorb. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/arena_plan.h"
#include "codegen/cg_kernels.h"
#include "codegen/cuda_arena.h"
#include "codegen/cuda_batch.h"
#include "codegen/cuda_store.h"
#include "codegen/host.h"
#include "codegen/kir_cuda.h"
#include "passes/bufplan.h"
#include "passes/machine.h"
#include "passes/passes.h"
#include "tests/support/load.h"

/* Shadow memory: word w of space s holds the id + 1 of its last writer (0: none). */
typedef struct {
  uint32_t *w[3]; /* arena, params, state */
  int64_t n[3];
} Shadow;

typedef struct {
  int space; /* 0 arena, 1 params, 2 state, -1 nothing to shadow (an input) */
  int64_t lo, hi; /* words */
  int read, write;
} BArg;

static BArg arg_of(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                  const CgLeafPlan *lp, const int64_t *temp_off, int k, int p) {
  const CgKernel *kk = &kp->kernels[k];
  int a = kk->arg_node[p];
  KirAccess acc = kk->k->params[p].access;
  BArg r = {-1, 0, 0, acc != KIR_OUT, acc != KIR_IN};
  if (a < 0) {
    int t = -1 - a;
    r.space = 0, r.lo = temp_off[t] / 4, r.hi = r.lo + kp->temps[t].numel;
    return r;
  }
  const IrNode *n = m->nodes[a];
  if (kp->inplace_of[a] >= 0) n = m->nodes[kp->inplace_of[a]];
  if (n->op == IR_OP_PARAM || n->op == IR_OP_STATE) {
    r.space = n->op == IR_OP_PARAM ? 1 : 2;
    r.lo = lp->offset[n->id], r.hi = r.lo + ir_numel(n);
  } else if (n->op != IR_OP_INPUT && bp->offset[n->id] >= 0) {
    r.space = 0, r.lo = bp->offset[n->id] / 4, r.hi = r.lo + bp->size[n->id] / 4;
  }
  return r;
}

/* One launch's reads into a checksum of (word, writer), then (apply) its writes. */
static uint64_t reads_of(const Shadow *s, const BArg *args, int nargs) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < nargs; i++) {
    if (args[i].space < 0 || !args[i].read) continue;
    for (int64_t w = args[i].lo; w < args[i].hi; w++)
      h = (h ^ ((uint64_t)w * 31 + s->w[args[i].space][w] + (uint64_t)args[i].space)) *
          1099511628211ull;
  }
  return h;
}

static void writes_of(Shadow *s, const BArg *args, int nargs, int k) {
  for (int i = 0; i < nargs; i++)
    if (args[i].space >= 0 && args[i].write)
      for (int64_t w = args[i].lo; w < args[i].hi; w++) s->w[args[i].space][w] = (uint32_t)k + 1;
}

int main(int argc, char **argv) {
  int fuse = !(argc > 1 && !strcmp(argv[1], "--no-fuse"));
  argv += !fuse, argc -= !fuse;
  if (argc < 2) {
    fprintf(stderr, "usage: cg_batch [--no-fuse] MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  IrModule *m = test_load_full(argv[1], (const char *const *)argv + 2, argc - 2);
  char err[512];
  if (!m) return 1;
  CgKernelPlan kp;
  BufPlan fp32, bp; /* train.c's plan; the GPU trainer's (codegen/cuda_arena.h) */
  int *pos, *held;
  if (cg_plan_step(m, fuse, NULL, &kp, &pos, &fp32, &held, err, sizeof err)) {
    printf("FAIL: the step's plan: %s\n", err);
    return 1;
  }
  int nk = kp.nkernels;
  CgLeafPlan lp;
  cg_plan_leaves(m, &lp);
  int *canon = arena_alloc(&m->arena, sizeof(int) * (size_t)(nk + 1));
  cg_dedup_kernels(&kp, canon);
  CgCudaStore store;
  cg_cuda_store_plan(m, &kp, &fp32, canon, machine_bf16(m), CG_STORE_BF16, NULL, &store);
  cg_cuda_arena_plan(m, &kp, pos, held, &fp32, &store, &bp);
  free(held);
  CgCudaBatches b;
  cg_cuda_batch_plan(m, &kp, &bp, &lp, &store, 1, NULL, &b);

  int fails = 0;
  int64_t *temp_off = calloc((size_t)kp.ntemps + 1, sizeof(int64_t));
  Shadow s = {{NULL}, {cg_arena_bytes(&kp, &bp, temp_off) / 4, lp.params_numel, lp.state_numel}};
  BArg **args = calloc((size_t)nk + 1, sizeof(BArg *));
  for (int k = 0; k < nk; k++) {
    args[k] = calloc((size_t)kp.kernels[k].nargs + 1, sizeof(BArg));
    for (int p = 0; p < kp.kernels[k].nargs; p++)
      args[k][p] = arg_of(m, &kp, &bp, &lp, temp_off, k, p);
  }
  /* the plan's shape: members after their lead, same code and phase, no
   * runtime op between, within the batched form's size */
  for (int k = 0; k < nk; k++) {
    int L = b.lead[k];
    if (L < 0 || L == k) continue;
    int rl = kp.kernels[L].root, rk = kp.kernels[k].root, runtime = 0;
    for (int i = rl + 1; i <= rk; i++)
      runtime |= !(ir_op_info[m->nodes[i]->op].flags & IR_F_LEAF) && kp.kernel_of[i] < 0;
    if (L > k || store.canon[L] != store.canon[k] || runtime ||
        m->nodes[rl]->phase != m->nodes[rk]->phase ||
        b.count[L] > kir_cuda_multi_max(store.code[store.canon[L]])) {
      printf("FAIL: kernel %d in the batch of %d: not after it, another code, across a runtime "
             "op or a phase, or too many (%d)\n", k, L, b.count[L]);
      fails++;
    }
  }
  int in_gemm = 0, gelus = 0;
  for (int k = 0; k < nk; k++) {
    int g = b.in_gemm[k];
    if (g < 0) continue;
    in_gemm++;
    const CgKernel *kk = &kp.kernels[k];
    const IrNode *first = m->nodes[kk->nodes[0]];
    const int sum = kk->nnodes == 1 && first->op == IR_OP_SUM_TO && g > kk->root &&
                    m->nodes[g]->op == IR_OP_MATMUL_TA;
    const int add = first->op == IR_OP_ADD && g < first->id && m->nodes[g]->op == IR_OP_MATMUL &&
                    (first->inputs[0] == m->nodes[g] || first->inputs[1] == m->nodes[g]);
    /* the bias add alone (or its reshape), or with the GELU of its result */
    const IrNode *last = m->nodes[kk->nodes[kk->nnodes - 1]];
    const int bias = add && (kk->nnodes == 1 || last->op == IR_OP_RESHAPE);
    const int gelu = add && kk->nnodes == 2 && last->op == IR_OP_GELU && last->inputs[0] == first;
    const int dgelu = kk->nnodes == 1 && first->op == IR_OP_GELU_GRAD && g < first->id &&
                      first->inputs[1] == m->nodes[g] && m->nodes[g]->op == IR_OP_MATMUL;
    const int want = sum ? CG_EPI_BGRAD : bias ? CG_EPI_BIAS : gelu ? CG_EPI_GELU
                     : dgelu ? CG_EPI_DGELU : -1;
    if (want < 0 || b.epi[k] != want || b.lead[k] != k || b.count[k] != 1) {
      printf("FAIL: kernel %d (%s) with GEMM %%%d: not one sum_to alone with a later "
             "matmul_ta, nor the bias add (and GELU) of an earlier matmul, nor the GELU "
             "gradient of one; its epilogue kind %d (want %d), or batched\n", k, kk->k->name,
             g, b.epi[k], want);
      fails++;
    }
    gelus += gelu + dgelu;
  }
  uint64_t *seen = calloc((size_t)nk + 1, sizeof(uint64_t));
  uint32_t *final[3];
  for (int run = 0; run < 2; run++) {
    for (int sp = 0; sp < 3; sp++) s.w[sp] = calloc((size_t)s.n[sp] + 1, sizeof(uint32_t));
    unsigned char *ran = calloc((size_t)nk + 1, 1); /* run 1: the bias sums run so far */
    for (int k = 0; k <= nk; k++) {
      /* run 1: the bias sums whose GEMM runs before kernel k (the rest at the end) */
      for (int j = 0; run == 1 && j < nk; j++) {
        if (b.in_gemm[j] < 0 || ran[j] || (k < nk && b.in_gemm[j] >= kp.kernels[k].root))
          continue;
        if (reads_of(&s, args[j], kp.kernels[j].nargs) != seen[j]) {
          printf("FAIL: bias sum %d (%s) reads other values at its GEMM %%%d\n", j,
                 kp.kernels[j].k->name, b.in_gemm[j]);
          fails++;
        }
        writes_of(&s, args[j], kp.kernels[j].nargs, j);
        ran[j] = 1;
      }
      if (k == nk) break;
      if (b.lead[k] < 0) continue; /* a view: no launch */
      if (run == 1 && b.in_gemm[k] >= 0) continue; /* runs at its GEMM */
      if (run == 0) {
        seen[k] = reads_of(&s, args[k], kp.kernels[k].nargs);
        writes_of(&s, args[k], kp.kernels[k].nargs, k);
        continue;
      }
      if (b.lead[k] != k) continue; /* ran with its lead */
      for (int j = k; j >= 0; j = b.next[j])
        if (reads_of(&s, args[j], kp.kernels[j].nargs) != seen[j]) {
          printf("FAIL: kernel %d (%s) reads other values when batched with %d\n", j,
                 kp.kernels[j].k->name, k);
          fails++;
        }
      for (int j = k; j >= 0; j = b.next[j]) writes_of(&s, args[j], kp.kernels[j].nargs, j);
    }
    free(ran);
    for (int sp = 0; sp < 3; sp++) {
      if (run == 0) final[sp] = s.w[sp];
      else {
        if (memcmp(final[sp], s.w[sp], sizeof(uint32_t) * (size_t)s.n[sp])) {
          printf("FAIL: space %d ends with other writers when batched\n", sp);
          fails++;
        }
        free(final[sp]), free(s.w[sp]);
      }
    }
  }
  if (!b.batches) {
    printf("FAIL: no batch at all: nothing to test\n");
    fails++;
  }
  /* every GELU input passes/gelu_epilogue.c kept: its GELU and each gradient in an epilogue */
  int kept = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (gelu_epilogue_input(m, m->nodes[i]))
      for (int j = i + 1; j < m->nnodes; j++)
        for (int q = 0; q < m->nodes[j]->ninputs; q++) kept += m->nodes[j]->inputs[q] == m->nodes[i];
  if (gelus != kept) {
    printf("FAIL: %d GELUs and GELU gradients with their GEMMs, %d wanted\n", gelus, kept);
    fails++;
  }
  printf("%s %s: %d launches, %d batches absorbing %d of them, %d bias sums, adds and GELUs "
         "with GEMMs (%d GELUs and gradients)\n",
         fails ? "FAIL" : "ok  ", m->name, nk, b.batches, b.absorbed, in_gemm, gelus);
  for (int k = 0; k < nk; k++) free(args[k]);
  free(args), free(seen), free(temp_off);
  cg_plan_free(&kp);
  ir_module_free(m);
  return fails != 0;
}
