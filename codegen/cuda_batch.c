/* codegen/cuda_batch.c -- see cuda_batch.h. */
#include "codegen/cuda_batch.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/host_cuda.h"
#include "codegen/kir_cuda.h"
#include "passes/passes.h"
#include "runtime/rt_gemm.h"

enum { SP_ARENA, SP_PARAMS, SP_STATE, SP_INPUT }; /* an input: SP_INPUT + its node id */

/* One buffer argument of a launch: bytes [lo, hi) of a space, read and/or written. */
typedef struct {
  int64_t space, lo, hi;
  int read, write;
} Range;

typedef struct {
  Range *r;
  int n;
} Ranges;

/* The bytes of kernel instance k's arguments. */
static Ranges ranges_of(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                        const CgLeafPlan *lp, const int64_t *temp_off, int k) {
  const CgKernel *kk = &kp->kernels[k];
  Ranges out = {calloc((size_t)kk->nargs + 1, sizeof(Range)), 0};
  for (int p = 0; p < kk->nargs; p++) {
    int a = kk->arg_node[p];
    KirAccess acc = kk->k->params[p].access;
    Range r = {SP_ARENA, 0, 0, acc != KIR_OUT, acc != KIR_IN};
    if (a < 0) {
      int t = CG_ARG_TEMP(a);
      r.lo = temp_off[t], r.hi = temp_off[t] + 4 * kp->temps[t].numel;
    } else {
      const IrNode *n = m->nodes[a];
      if (kp->inplace_of[a] >= 0) n = m->nodes[kp->inplace_of[a]];
      if (n->op == IR_OP_PARAM || n->op == IR_OP_STATE) {
        r.space = n->op == IR_OP_PARAM ? SP_PARAMS : SP_STATE;
        r.lo = 4 * lp->offset[n->id], r.hi = r.lo + 4 * ir_numel(n);
      } else if (n->op == IR_OP_INPUT || bp->offset[n->id] < 0) {
        r.space = SP_INPUT + n->id, r.lo = 0, r.hi = 1;
      } else {
        r.lo = bp->offset[n->id], r.hi = r.lo + bp->size[n->id];
      }
    }
    out.r[out.n++] = r;
  }
  return out;
}

/* 1 if neither of a, b writes a byte the other reads or writes. */
static int independent(const Ranges *a, const Ranges *b) {
  for (int i = 0; i < a->n; i++)
    for (int j = 0; j < b->n; j++) {
      const Range *x = &a->r[i], *y = &b->r[j];
      if (x->space != y->space || x->hi <= y->lo || y->hi <= x->lo) continue;
      if (x->write || y->write) return 0;
    }
  return 1;
}

/* 1 if k is independent of every member of the batch led by lead. */
static int independent_of_batch(const CgCudaBatches *b, const Ranges *rg, int k, int lead) {
  for (int j = lead; j >= 0; j = b->next[j])
    if (!independent(&rg[k], &rg[j])) return 0;
  return 1;
}

static int64_t last_dim(const IrNode *x) { return x->shape[x->rank - 1]; }

/* The matmul_ta node whose b is dy, [.., n] of sum_to node s, or a view
 * sharing dy's bytes (bp), after s: the weight gradient of s's linear layer,
 * one member, b not transposed, not a kernel's (in stage programs: adding
 * into the accumulator, acc_into, or not); else -1. */
static int weight_gemm_of(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                          const IrNode *s) {
  const IrNode *dy = s->inputs[0];
  for (int j = s->id + 1; j < m->nnodes; j++) {
    const IrNode *n = m->nodes[j];
    if (n->op != IR_OP_MATMUL_TA || n->ia[0] || n->inputs[0]->rank != 2 ||
        kp->kernel_of[j] >= 0)
      continue;
    const IrNode *b = n->inputs[1];
    if (b->rank == 2 && last_dim(b) == s->shape[0] &&
        (b == dy || (b->op == IR_OP_RESHAPE && b->inputs[0] == dy && bp->alias[b->id] == dy->id)))
      return j;
  }
  return -1;
}

/* 1 if node i is a sum_to of a dy [.., n] to f32 [n], alone in its kernel. */
static int bias_sum(const IrModule *m, const CgKernelPlan *kp, int i) {
  const IrNode *s = m->nodes[i];
  if (s->op != IR_OP_SUM_TO || s->rank != 1 || s->dtype != IR_F32) return 0;
  const IrNode *dy = s->inputs[0];
  int k = kp->kernel_of[i];
  return dy->rank >= 2 && last_dim(dy) == s->shape[0] && k >= 0 && kp->kernels[k].root == i &&
         kp->kernels[k].nnodes == 1;
}

/* The stage-program form (cuda_batch.h): sum_to node i a parameter's
 * gradient term (pp->grad_param) that nothing reads but the skipped gradient
 * sums and, the whole gradient, the optimizer (both from the accumulator,
 * which ACC_GRAD adds it into); its weight gradient's GEMM, else -1 (the
 * caller keeps it where it runs in the sum's own program: same_program). */
static int bias_in_stage_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                              const PpProgram *pp, int i) {
  if (!bias_sum(m, kp, i) || pp->grad_param[i] < 0 || pp->chunk[i] < 0) return -1;
  const IrNode *s = m->nodes[i];
  /* the optimizer reads a whole gradient from G (host.h, cg_pipe_grads_in_acc) */
  const int whole = m->nodes[pp->grad_param[i]]->grad == s;
  for (int j = i + 1; j < m->nnodes; j++)
    for (int q = 0; q < m->nodes[j]->ninputs; q++)
      if (m->nodes[j]->inputs[q] == s && pp->chunk[j] != PP_NODE_SKIP &&
          !(whole && pp->chunk[j] == PP_NODE_OPT))
        return -1;
  return weight_gemm_of(m, kp, bp, s);
}

int cg_cuda_bias_in_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, int i) {
  if (!bias_sum(m, kp, i)) return -1;
  const IrNode *s = m->nodes[i];
  const int gemm = weight_gemm_of(m, kp, bp, s);
  if (gemm < 0) return -1;
  int read_after = 0; /* read after the GEMM, by something, and not before */
  for (int j = i + 1; j < m->nnodes; j++)
    for (int q = 0; q < m->nodes[j]->ninputs; q++)
      if (m->nodes[j]->inputs[q] == s) {
        if (j < gemm) return -1;
        read_after = 1;
      }
  return read_after ? gemm : -1;
}

/* 1 if arena values x and y (bp) share a byte. */
static int overlap(const BufPlan *bp, const IrNode *x, const IrNode *y) {
  const int64_t xo = bp->offset[x->id], yo = bp->offset[y->id];
  return xo >= 0 && yo >= 0 && xo < yo + bp->size[y->id] && yo < xo + bp->size[x->id];
}

/* 1 if GEMM node mm can run with an epilogue that writes kernel k's results:
 * computed alone by cuBLASLt (no kernel, no accumulation, b shared by the
 * batch), nothing between mm and k's root but k's nodes and leaves. */
static int epilogue_gemm(const IrModule *m, const CgKernelPlan *kp, const IrNode *mm, int k) {
  if ((mm->op != IR_OP_MATMUL) || kp->kernel_of[mm->id] >= 0 ||
      (kp->acc_into && kp->acc_into[mm->id] >= 0) || ir_node_held(m, mm) ||
      (cg_cuda_gemm(mm).flags & RT_MM_B_BATCHED))
    return 0;
  for (int i = mm->id + 1; i <= kp->kernels[k].root; i++)
    if (kp->kernel_of[i] != k && !(ir_op_info[m->nodes[i]->op].flags & IR_F_LEAF)) return 0;
  return 1;
}

int cg_cuda_bias_add_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                          const CgCudaStore *store, int k) {
  const CgKernel *kk = &kp->kernels[k];
  if (kk->nnodes < 1 || kk->nnodes > 2) return -1;
  const IrNode *a = m->nodes[kk->nodes[0]], *o = m->nodes[kk->nodes[kk->nnodes - 1]];
  if (a->op != IR_OP_ADD || (a->phase != IR_PHASE_FWD && a->phase != IR_PHASE_B) ||
      !kp->materialize[o->id] ||
      (o != a && (o->op != IR_OP_RESHAPE || o->inputs[0] != a || kp->materialize[a->id])))
    return -1;
  int j = a->inputs[0]->op == IR_OP_MATMUL ? 0 : 1;
  const IrNode *mm = a->inputs[j], *b = a->inputs[1 - j];
  if (b->rank != 1 || b->dtype != IR_F32 || b->shape[0] != last_dim(mm) ||
      !ir_same_shape(a, mm) || store->bf16[b->id] || (store->rounded && store->rounded[b->id]) ||
      !epilogue_gemm(m, kp, mm, k))
    return -1;
  /* a bf16 result in rows of a multiple of 8 (rt_cuda_matmul_bias) */
  if (store->bf16[o->id] && last_dim(mm) % 8) return -1;
  /* mm read by a alone */
  for (int i = mm->id + 1; i < m->nnodes; i++)
    for (int q = 0; q < m->nodes[i]->ninputs; q++)
      if (m->nodes[i]->inputs[q] == mm && m->nodes[i] != a) return -1;
  /* the GEMM writes o's bytes while it reads its operands and the bias */
  if (overlap(bp, o, mm->inputs[0]) || overlap(bp, o, mm->inputs[1]) || overlap(bp, o, b))
    return -1;
  return mm->id;
}

/* 1 if x and y are stored alike: both bf16, both rounded fp32, or both fp32
 * (the GELU epilogues write or read one as the other: rt_cuda.h). */
static int stored_alike(const CgCudaStore *store, const IrNode *x, const IrNode *y) {
  const int rx = store->rounded && store->rounded[x->id], ry = store->rounded && store->rounded[y->id];
  return store->bf16[x->id] == store->bf16[y->id] && rx == ry;
}

/* The forward GELU (cuda_batch.h): kernel k is [h = add(mm, b), gelu(h)], h a
 * GELU input passes/gelu_epilogue.c kept; the matmul mm, else -1. */
static int gelu_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                     const CgCudaStore *store, int k) {
  const CgKernel *kk = &kp->kernels[k];
  if (kk->nnodes != 2) return -1;
  const IrNode *h = m->nodes[kk->nodes[0]], *g = m->nodes[kk->nodes[1]];
  if (g->op != IR_OP_GELU || g->inputs[0] != h || !kp->materialize[h->id] ||
      !kp->materialize[g->id] || !gelu_epilogue_input(m, h) || !stored_alike(store, h, g))
    return -1;
  const int j = h->inputs[0]->op == IR_OP_MATMUL ? 0 : 1;
  const IrNode *mm = h->inputs[j], *b = h->inputs[1 - j];
  if (store->bf16[b->id] || !epilogue_gemm(m, kp, mm, k) || last_dim(mm) % 8) return -1;
  /* the GEMM writes h's and g's bytes while it reads its operands and b */
  for (int q = 0; q < 3; q++) {
    const IrNode *in = q < 2 ? mm->inputs[q] : b;
    if (overlap(bp, h, in) || overlap(bp, g, in)) return -1;
  }
  return mm->id;
}

/* The GELU's gradient (cuda_batch.h): kernel k is [gelu_grad(h, dg)], h a
 * kept GELU input, dg's matmul right before it; that matmul, else -1. */
static int dgelu_gemm(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                      const CgCudaStore *store, int k) {
  const CgKernel *kk = &kp->kernels[k];
  if (kk->nnodes != 1) return -1;
  const IrNode *r = m->nodes[kk->nodes[0]];
  if (r->op != IR_OP_GELU_GRAD || !kp->materialize[r->id]) return -1;
  const IrNode *h = r->inputs[0], *dg = r->inputs[1];
  if (!gelu_epilogue_input(m, h) || !stored_alike(store, h, r) ||
      !epilogue_gemm(m, kp, dg, k) || last_dim(dg) % 8)
    return -1;
  /* the GEMM writes r's bytes while it reads its operands and h */
  if (overlap(bp, r, dg->inputs[0]) || overlap(bp, r, dg->inputs[1]) || overlap(bp, r, h))
    return -1;
  return dg->id;
}

/* The rules of the epilogues that make a kernel's result, in CG_EPI_BIAS,
 * _GELU, _DGELU order: each the GEMM node whose call computes kernel k, else -1. */
typedef int (*EpilogueRule)(const IrModule *, const CgKernelPlan *, const BufPlan *,
                            const CgCudaStore *, int);
static const EpilogueRule epilogue_rule[] = {cg_cuda_bias_add_gemm, gelu_gemm, dgelu_gemm};
#define NRULES ((int)(sizeof epilogue_rule / sizeof epilogue_rule[0]))

void cg_cuda_epilogue_parts(const IrModule *m, const CgKernelPlan *kp, int k, int epi,
                            const IrNode **vec, const IrNode **aux, const IrNode **out) {
  const CgKernel *kk = &kp->kernels[k];
  const IrNode *first = m->nodes[kk->nodes[0]], *last = m->nodes[kk->nodes[kk->nnodes - 1]];
  *vec = *aux = NULL;
  *out = last;
  switch (epi) {
  case CG_EPI_BGRAD: /* the sum is the vector */
    *vec = first, *out = NULL;
    break;
  case CG_EPI_BIAS:
  case CG_EPI_GELU: /* add(mm, b): b; GELU's input h is the aux output */
    *vec = first->inputs[first->inputs[0]->op == IR_OP_MATMUL ? 1 : 0];
    if (epi == CG_EPI_GELU) *aux = first;
    break;
  case CG_EPI_DGELU: /* gelu_grad(h, dg): h is the aux input */
    *aux = first->inputs[0];
    break;
  default:
    *out = NULL;
  }
}

/* 1 if GEMM node g and kernel k's root run in one stage program of pp (the
 * same chunk and phase: they are adjacent in node order, cuda_batch.h), or
 * pp is NULL (the unpipelined step). */
static int same_program(const IrModule *m, const CgKernelPlan *kp, const PpProgram *pp, int g,
                        int k) {
  const int r = kp->kernels[k].root;
  return !pp || (pp->chunk[g] >= 0 && pp->chunk[g] == pp->chunk[r] &&
                 m->nodes[g]->phase == m->nodes[r]->phase);
}

/* Stage programs (cuda_batch.h): an optimizer node i's batch signature, the
 * stage functions that run its kernel as they run it: for a parameter one
 * stage holds, stage x 4 + opt_pub (host.c's emit_group runs an owned node on
 * its parameter's holders, an opt_pub node on the lowest only, zeroing or
 * skipping it on the others); else -1, batched with none (a parameter several
 * stages hold; a shared node, which every stage runs). */
static int opt_signature(const PpProgram *pp, int i) {
  const int p = pp->opt_owner[i];
  if (p < 0) return -1;
  const uint64_t h = pp->holders[p];
  if (!h || (h & (h - 1))) return -1;
  return __builtin_ctzll(h) * 4 + pp->opt_pub[i];
}

/* 1 if node n reads an opt_pub 1 value (the stages' per-parameter values,
 * summed over pp right before the first shared node reading one: host.c). */
static int reads_pp_summed(const PpProgram *pp, const IrNode *n) {
  for (int q = 0; q < n->ninputs; q++)
    if (pp->opt_pub[n->inputs[q]->id] == 1) return 1;
  return 0;
}

void cg_cuda_batch_plan(IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                        const CgLeafPlan *lp, const CgCudaStore *store, int batch,
                        const PpProgram *pp, CgCudaBatches *out) {
  int nk = kp->nkernels;
  memset(out, 0, sizeof *out);
  out->lead = arena_alloc(&m->arena, sizeof(int) * (size_t)(nk + 1));
  out->next = arena_alloc(&m->arena, sizeof(int) * (size_t)(nk + 1));
  out->count = arena_alloc(&m->arena, sizeof(int) * (size_t)(nk + 1));
  out->multi = arena_alloc(&m->arena, (size_t)nk + 1);
  out->in_gemm = arena_alloc(&m->arena, sizeof(int) * (size_t)(nk + 1));
  out->epi = arena_alloc(&m->arena, (size_t)nk + 1);
  int *last = arena_alloc(&m->arena, sizeof(int) * (size_t)(nk + 1)); /* per lead: last member */
  for (int k = 0; k < nk; k++) {
    out->lead[k] = cg_kernel_is_view(kp, bp, k) ? -1 : k;
    out->next[k] = -1;
    out->count[k] = out->lead[k] >= 0;
    last[k] = k;
    /* (the GEMM writes its sum in fp32: not for a value stored or rounded as bf16) */
    int s = kp->kernels[k].nnodes == 1 ? kp->kernels[k].nodes[0] : -1;
    out->in_gemm[k] = -1;
    if (out->lead[k] >= 0 && s >= 0 && !store->bf16[s] && !(store->rounded && store->rounded[s])) {
      const int g = pp ? bias_in_stage_gemm(m, kp, bp, pp, s) : cg_cuda_bias_in_gemm(m, kp, bp, s);
      if (g >= 0 && same_program(m, kp, pp, g, k)) out->in_gemm[k] = g;
    }
    out->epi[k] = out->in_gemm[k] >= 0 ? CG_EPI_BGRAD : CG_EPI_NONE;
    /* a bias add, GELU or GELU gradient (in a stage program: its GEMM's) */
    for (int r = 0; r < NRULES && out->in_gemm[k] < 0 && out->lead[k] >= 0; r++) {
      const int g = epilogue_rule[r](m, kp, bp, store, k);
      if (g >= 0 && same_program(m, kp, pp, g, k))
        out->in_gemm[k] = g, out->epi[k] = (unsigned char)(CG_EPI_BIAS + r);
    }
  }
  if (!batch || !nk) return;
  int64_t *temp_off = calloc((size_t)kp->ntemps + 1, sizeof(int64_t));
  Ranges *rg = calloc((size_t)nk, sizeof(Ranges));
  int *open = calloc((size_t)nk, sizeof(int)); /* this region's launches, leads in order */
  int *max = calloc((size_t)nk, sizeof(int));
  int *sig = calloc((size_t)nk, sizeof(int)); /* which stage functions run it (opt_signature) */
  cg_arena_bytes(kp, bp, temp_off);
  int nopen = 0, next = 0;
  IrPhase phase = IR_PHASE_COUNT;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (!(ir_op_info[n->op].flags & IR_F_LEAF) && kp->kernel_of[i] < 0) nopen = 0; /* runtime op */
    if (pp && reads_pp_summed(pp, n)) nopen = 0; /* the stages' sums are made before it */
    for (; next < nk && kp->kernels[next].root == i; next++) {
      int k = next;
      if (out->lead[k] < 0 || out->in_gemm[k] >= 0) continue; /* a view launches nothing;
                                                                  a bias sum runs at its GEMM */
      if (n->phase != phase) nopen = 0, phase = n->phase;
      if (pp && pp->chunk[i] != PP_NODE_OPT) { /* a chunk's program: launched alone */
        nopen = 0;
        continue;
      }
      rg[k] = ranges_of(m, kp, bp, lp, temp_off, k);
      int code = store->canon[k];
      max[k] = kir_cuda_multi_max(store->code[code]);
      sig[k] = pp ? opt_signature(pp, i) : 0;
      int chosen = -1;
      for (int e = 0; max[k] >= 2 && sig[k] >= 0 && e < nopen && chosen < 0; e++) {
        int L = open[e];
        if (store->canon[L] != code || out->count[L] >= max[L] || sig[L] != sig[k] ||
            !independent_of_batch(out, rg, k, L))
          continue;
        int ok = 1; /* k moves before every launch placed after the batch */
        for (int f = e + 1; f < nopen && ok; f++) ok = independent_of_batch(out, rg, k, open[f]);
        if (ok) chosen = L;
      }
      if (chosen < 0) {
        open[nopen++] = k;
        continue;
      }
      out->lead[k] = chosen;
      out->next[last[chosen]] = k;
      last[chosen] = k;
      out->count[chosen]++, out->count[k] = 0;
      out->multi[code] = 1;
      out->absorbed++;
      out->batches += out->count[chosen] == 2;
    }
  }
  for (int k = 0; k < nk; k++) free(rg[k].r);
  free(rg), free(open), free(max), free(sig), free(temp_off);
}
