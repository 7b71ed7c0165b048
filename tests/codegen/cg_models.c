/* tests/codegen/cg_models.c -- whole models through the kernel plan.
 *
 *   cg_models [--plan|--kir|--ll FILE] MODEL.dsl [NAME=VALUE ...]
 *   cg_models --compile MODEL.dsl [NAME=VALUE ...]
 *
 * The model is loaded as the driver does (prelude, -D overrides, default
 * passes), then pass_autodiff, pass_attn_delta and pass_optimizer append
 * the backward pass (sdpa_grad from lse and D, as the trainers have it) and
 * the AdamW/SGD step.  Leaves get random values (parameters around their
 * init, optimizer state as after a few steps, lr and step), the double
 * interpreter evaluates every node, and each plan (fuse = 0 and 1) runs in
 * node order: runtime ops (GEMMs, attention, routing, embedding, cross-
 * entropy) take the interpreter's value rounded to f32, every other node is
 * computed by the plan's kernels from f32 buffers.  Every materialised
 * kernel node must match the interpreter, and the fused and unfused runs
 * must agree where both materialise a node.  A third plan fuses under
 * colours (layer, phase), as a pipelined trainer's stage functions need
 * (codegen/host.c cg_pipe_colours): it too must match the interpreter, no
 * kernel may hold nodes of two colours, a node read by another colour must
 * be materialised, and it must still fuse (fewer kernels than unfused, more
 * than uncoloured).  Prints the kernel counts, and the fused plan's arena
 * with the updates in place and with a buffer each.
 *
 * --plan prints the fused plan (one line per kernel), --kir its KIR text,
 * --ll writes its optimized LLVM IR to FILE.  --compile only plans and
 * compiles (LLVM, O3) both ways and prints the kernel counts and times: for
 * full-size models, which the interpreter is too slow to run.
 *
 * Tolerance: 1e-4 relative L2.  Errors do not cross runtime ops (their
 * outputs are reset to the reference), but between them kernels feed
 * kernels in f32: a layer's backward chains norm gradients, residual adds
 * and reductions (~1e-6 each), and the optimizer divides by sqrt(v) of
 * small second moments.  Fused and unfused differ by rounding only
 * (1e-4 as well). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cg_harness.h"
#include "codegen/host.h"
#include "codegen/kir_llvm.h"
#include "passes/passes.h"
#include "tests/support/load.h"

#define TOL 1e-4

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void init_leaves(const IrModule *m, IrInterp *it, CgRng *rng) {
  int64_t vocab = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_EMBEDDING) vocab = m->nodes[i]->inputs[1]->shape[0];
  for (int k = 0; k < m->nnodes; k++) {
    const IrNode *n = m->nodes[k];
    if (!(ir_op_info[n->op].flags & IR_F_LEAF)) continue;
    int sq = n->name && strstr(n->name, "exp_avg_sq") != NULL;
    for (int64_t e = 0; e < ir_numel(n); e++) {
      double v;
      if (n->dtype == IR_I32) {
        it->i[k][e] = (int32_t)cg_randint(rng, vocab > 0 ? vocab : 2);
        continue;
      }
      if (n->op == IR_OP_INPUT && n->name && !strcmp(n->name, "lr")) v = 3e-4;
      else if (n->op == IR_OP_INPUT && n->name && !strcmp(n->name, "step")) v = 4;
      else if (n->op == IR_OP_INPUT) v = cg_normal(rng);
      else if (n->op == IR_OP_STATE) v = sq ? cg_uniform(rng, 1e-6, 1e-4) : 1e-2 * cg_normal(rng);
      else if (n->init == IR_INIT_ONES) v = 1 + 0.2 * cg_normal(rng);
      else if (n->init == IR_INIT_ZEROS) v = 0.2 * cg_normal(rng);
      else v = 0.3 * cg_normal(rng);
      it->f[k][e] = (double)(float)v;
    }
  }
}

/* One line per kernel: name, rows, the nodes it computes (* materialised). */
static void print_plan(const IrModule *m, const CgKernelPlan *p) {
  for (int i = 0; i < p->nkernels; i++) {
    const CgKernel *ck = &p->kernels[i];
    printf("%-36s rows %8lld:", ck->k->name, (long long)kir_kernel_rows(ck->k));
    for (int j = 0; j < ck->nnodes; j++)
      printf(" %%%d%s %s", ck->nodes[j], p->materialize[ck->nodes[j]] ? "*" : "",
             ir_op_info[m->nodes[ck->nodes[j]]->op].name);
    printf("\n");
  }
}

/* The fused plan's buffers as the trainer plans them (codegen/project.c, one
 * rank: no asynchronous collectives), and as they were planned when every
 * update value had a buffer of its own, kept to the end of the step for its
 * copy.  An update written in place must have no buffer, every other one
 * must; the most bytes live at once cannot grow.  Prints both arenas. */
static int arena_check(IrModule *m, const CgKernelPlan *kp) {
  int *pos = arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1));
  unsigned char *copied = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  for (int i = 0; i < m->nnodes; i++) {
    pos[i] = kp->kernel_of[i] >= 0 ? kp->kernels[kp->kernel_of[i]].root : i;
    copied[i] = kp->materialize[i] || kp->inplace_of[i] >= 0;
  }
  BufPlan now_bp, then_bp;
  bufplan_build(m, kp->materialize, cg_results(m), pos, &now_bp);
  bufplan_build(m, copied, cg_results(m), pos, &then_bp);
  int fails = 0, inplace = 0;
  for (int u = 0; u < m->nupdates; u++) {
    const IrNode *v = m->updates[u].value;
    int in = kp->inplace_of[v->id] == m->updates[u].leaf->id;
    inplace += in;
    if (in != (now_bp.offset[v->id] < 0) && cg_kernel_op(v->op)) {
      printf("FAIL: update %%%d (%s) is %s but has %s buffer\n", v->id,
             m->updates[u].leaf->name, in ? "in place" : "copied", in ? "a" : "no");
      fails++;
    }
  }
  int64_t a_now = cg_arena_bytes(kp, &now_bp, NULL), a_then = cg_arena_bytes(kp, &then_bp, NULL);
  if (now_bp.live_peak > then_bp.live_peak) {
    printf("FAIL: %lld bytes live at once with updates in place, %lld without\n",
           (long long)now_bp.live_peak, (long long)then_bp.live_peak);
    fails++;
  }
  printf("%s %s arena: %d of %d updates in place: %lld bytes (live peak %lld); with a buffer "
         "each: %lld (live peak %lld)\n", fails ? "FAIL" : "ok  ", m->name, inplace,
         m->nupdates, (long long)a_now, (long long)now_bp.live_peak, (long long)a_then,
         (long long)then_bp.live_peak);
  return fails;
}

/* The coloured plan p (cg_plan_kernels's colour rule): every kernel's nodes
 * of one colour, and its root's; a node read by a node of another colour
 * (kernel or runtime op) materialised or written in place; fused, but less
 * than without colours (unfused and plain fused kernel counts given). */
static int colour_check(const IrModule *m, const CgKernelPlan *p, const int *colour, int unfused,
                        int fused) {
  int fails = 0;
  for (int k = 0; k < p->nkernels; k++) {
    const CgKernel *K = &p->kernels[k];
    for (int j = 0; j < K->nnodes; j++)
      if (colour[K->nodes[j]] != colour[K->root]) {
        printf("FAIL (colours): kernel %d (root %%%d) holds %%%d of another colour\n", k,
               K->root, K->nodes[j]);
        fails++;
      }
  }
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    for (int j = 0; j < n->ninputs; j++) {
      const IrNode *x = n->inputs[j];
      if (colour[x->id] != colour[i] && p->kernel_of[x->id] >= 0 && !p->materialize[x->id] &&
          p->inplace_of[x->id] < 0) {
        printf("FAIL (colours): %%%d is read by %%%d of another colour but has no buffer\n",
               x->id, i);
        fails++;
      }
    }
  }
  if (!(p->nkernels < unfused && p->nkernels > fused)) {
    printf("FAIL (colours): %d kernels; unfused %d, fused without colours %d\n", p->nkernels,
           unfused, fused);
    fails++;
  }
  return fails;
}

static int compile_both(IrModule *m) {
  char err[512];
  int n[2];
  for (int fuse = 0; fuse < 2; fuse++) {
    CgKernelPlan plan;
    double t0 = now();
    if (cg_plan_kernels(m, fuse, NULL, &plan, err, sizeof err)) {
      printf("FAIL (fuse=%d): plan: %s\n", fuse, err);
      return 1;
    }
    double t_plan = now() - t0;
    KirLlvmOptions o;
    kir_llvm_defaults(&o);
    t0 = now();
    char obj[] = "/tmp/parc_cg_compile_XXXXXX";
    int fd = mkstemp(obj);
    if (fd < 0 || kir_llvm_emit(plan.km, &o, obj, NULL, err, sizeof err)) {
      printf("FAIL (fuse=%d): %s\n", fuse, err);
      return 1;
    }
    close(fd);
    unlink(obj);
    n[fuse] = plan.nkernels;
    printf("     fuse=%d: %d kernels; plan %.3fs, LLVM O3 %.2fs\n", fuse, plan.nkernels, t_plan,
           now() - t0);
    cg_plan_free(&plan);
  }
  printf("ok   %s: %d nodes; kernels %d unfused, %d fused: fusion saves %d\n", m->name, m->nnodes,
         n[0], n[1], n[0] - n[1]);
  ir_module_free(m);
  return 0;
}

int main(int argc, char **argv) {
  int show = 0; /* 1 plan, 2 kir */
  if (argc > 1 && !strcmp(argv[1], "--plan")) show = 1, argc--, argv++;
  else if (argc > 1 && !strcmp(argv[1], "--kir")) show = 2, argc--, argv++;
  const char *ll = NULL;
  if (argc > 2 && !strcmp(argv[1], "--ll")) ll = argv[2], argc -= 2, argv += 2;
  if (argc < 2) {
    fprintf(stderr, "usage: cg_models [--plan|--kir] MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  int compile_only = 0;
  if (argc > 1 && !strcmp(argv[1], "--compile")) compile_only = 1, argc--, argv++;
  if (argc < 2) return 2;
  IrModule *m = test_load(argv[1], (const char *const *)argv + 2, argc - 2);
  if (!m) return 1;
  char err[512];
  if (pass_autodiff(m) || pass_attn_delta(m) || pass_optimizer(m) ||
      ir_verify(m, err, sizeof err)) {
    printf("FAIL: passes\n");
    return 1;
  }
  if (compile_only) return compile_both(m);
  IrInterp *ref = ir_interp_new(m);
  CgRng rng = {0x5eed5eed1234ull};
  init_leaves(m, ref, &rng);
  double t0 = now();
  if (ir_interp_run(ref, 0, m->nnodes, err, sizeof err)) {
    printf("FAIL: interpreter: %s\n", err);
    return 1;
  }
  double t_interp = now() - t0;
  int nkernel_nodes = 0;
  for (int i = 0; i < m->nnodes; i++) nkernel_nodes += cg_kernel_op(m->nodes[i]->op);

  CgKernelPlan plan[3];
  CgBufs bufs[3];
  int fails = 0;
  double worst[3] = {0, 0, 0};
  int *colour = malloc(sizeof(int) * ((size_t)m->nnodes + 1));
  for (int i = 0; colour && i < m->nnodes; i++)
    colour[i] = (m->nodes[i]->layer + 1) * IR_PHASE_COUNT + (int)m->nodes[i]->phase;
  for (int v = 0; v < 3 && colour; v++) { /* unfused, fused, fused under colours */
    int fuse = v > 0;
    CgLib lib;
    t0 = now();
    if (cg_plan_kernels(m, fuse, v == 2 ? colour : NULL, &plan[v], err, sizeof err)) {
      printf("FAIL (fuse=%d): plan: %s\n", fuse, err);
      return 1;
    }
    double t_plan = now() - t0;
    if (v == 1 && show == 1) print_plan(m, &plan[v]);
    if (v == 1 && show == 2) kir_print(stdout, plan[v].km);
    KirLlvmOptions o;
    kir_llvm_defaults(&o);
    if (v == 1 && ll && kir_llvm_emit(plan[v].km, &o, NULL, ll, err, sizeof err)) {
      printf("FAIL: %s\n", err);
      return 1;
    }
    if (cg_lib_open(&lib, plan[v].km, err, sizeof err)) {
      printf("FAIL (fuse=%d): %s\n", fuse, err);
      return 1;
    }
    t0 = now();
    if (cg_execute(m, &plan[v], &lib, ref, &bufs[v], err, sizeof err)) {
      printf("FAIL (fuse=%d): %s\n", fuse, err);
      return 1;
    }
    double t_run = now() - t0;
    int checked = 0;
    for (int i = 0; i < m->nnodes; i++) {
      const IrNode *n = m->nodes[i];
      if ((!plan[v].materialize[i] && plan[v].inplace_of[i] < 0) ||
          plan[v].kernel_of[i] < 0)
        continue;
      double e;
      if (n->dtype == IR_I32) {
        e = 0;
        for (int64_t j = 0; j < ir_numel(n); j++) e += bufs[v].i[i][j] != ref->i[i][j];
      } else {
        e = cg_rel_l2(bufs[v].f[i], ref->f[i], ir_numel(n));
      }
      checked++;
      if (e > worst[v] || e != e) worst[v] = e;
      if (!(e <= TOL)) {
        char ty[128];
        printf("FAIL (fuse=%d): %%%d (%s %s) rel L2 %.3g > %.0e\n", fuse, i,
               ir_op_info[n->op].name, ir_type_str(n, ty, sizeof ty), e, TOL);
        fails++;
      }
    }
    int inplace = 0;
    for (int i = 0; i < m->nnodes; i++) inplace += plan[v].inplace_of[i] >= 0;
    printf("     fuse=%d%s: %d kernels, %d nodes checked (%d of %d updates written in place), "
           "max rel L2 %.2e; plan %.3fs, LLVM+cc %.2fs, run %.3fs\n",
           fuse, v == 2 ? " (colours: layer, phase)" : "", plan[v].nkernels, checked, inplace, m->nupdates, worst[v], t_plan,
           lib.compile_s, t_run);
    cg_lib_close(&lib);
  }
  if (!colour) {
    printf("FAIL: out of memory\n");
    return 1;
  }
  fails += colour_check(m, &plan[2], colour, plan[0].nkernels, plan[1].nkernels);
  free(colour);
  int views = 0;
  for (int i = 0; i < m->nnodes; i++) views += plan[1].view_of[i] >= 0;
  int both = 0;
  double worst_ff = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (plan[0].kernel_of[i] < 0 || !bufs[0].f[i] || !bufs[1].f[i]) continue;
    double e = cg_rel_l2_ff(bufs[1].f[i], bufs[0].f[i], ir_numel(n));
    both++;
    if (e > worst_ff || e != e) worst_ff = e;
    if (!(e <= TOL)) {
      printf("FAIL: fused and unfused differ at %%%d (%s): %.3g\n", i, ir_op_info[n->op].name, e);
      fails++;
    }
  }
  printf("%s %s: %d nodes (%d with kernels); kernels %d unfused, %d fused: fusion saves %d "
         "(%d fused kernels are reshape copies a view-aware host skips); %d nodes compared "
         "fused vs unfused, max rel L2 %.2e; interpreter %.2fs\n",
         fails ? "FAIL" : "ok  ", m->name, m->nnodes, nkernel_nodes, plan[0].nkernels,
         plan[1].nkernels, plan[0].nkernels - plan[1].nkernels, views, both, worst_ff, t_interp);
  fails += arena_check(m, &plan[1]);
  for (int f = 0; f < 3; f++) {
    cg_bufs_free(&bufs[f]);
    cg_plan_free(&plan[f]);
  }
  ir_interp_free(ref);
  ir_module_free(m);
  return fails != 0;
}
