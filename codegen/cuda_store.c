/* codegen/cuda_store.c -- see cuda_store.h. */
#include "codegen/cuda_store.h"

#include <stdio.h>
#include <string.h>

#include "codegen/host.h"
#include "codegen/host_cuda.h"
#include "runtime/cuda/rt_cuda_ws_plan.h"

/* A reshape (or group_copy) of x whose buffer is x's (a view: no kernel or
 * call copies it); for a value stored wide (rows of 2 cols), one that keeps
 * the rows. */
static int is_view_of(const CgKernelPlan *kp, const BufPlan *bp, const IrNode *q, const IrNode *x,
                      int wide) {
  return (q->op == IR_OP_RESHAPE || q->op == IR_OP_GROUP_COPY) && kp->view_of[q->id] == x->id &&
         bp->alias[q->id] >= 0 &&
         bp->offset[q->id] == bp->offset[x->id] &&
         (!wide || q->shape[q->rank - 1] == x->shape[x->rank - 1]);
}

enum { READ_GEMM = 1, READ_KERNEL = 2, READ_XENT = 4, READ_ATTN = 8, READ_OTHER = 16 };

/* 1 for the gradient forms of the ops that read logits, 2 for the forward ones */
static int xent(IrOp op) {
  return op == IR_OP_CROSS_ENTROPY_GRAD || op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD ? 1
         : op == IR_OP_CROSS_ENTROPY || op == IR_OP_VOCAB_CROSS_ENTROPY         ? 2
                                                                                : 0;
}

/* Nodes marked (on[id] = 1), listed in ids[0 .. n) so that clearing them
 * costs what marking did. */
typedef struct {
  unsigned char *on;
  int *ids, n;
} Marks;

static void marks_clear(Marks *mk) {
  for (int k = 0; k < mk->n; k++) mk->on[mk->ids[k]] = 0;
  mk->n = 0;
}

/* What the plan reads: m and its kernel and buffer plans, the values that
 * stay f32 (keep), and who reads each node: its uses u in
 * [first[id], first[id + 1]), each the reader's id and the input's index,
 * in node order (uses()). */
typedef struct {
  IrModule *m;
  const CgKernelPlan *kp;
  const BufPlan *bp;
  const unsigned char *keep;
  int *first, *reader, *input;
} Store;

/* Fills c's uses of every node from m's inputs (m's arena). */
static void uses(Store *c) {
  IrModule *m = c->m;
  int n = m->nnodes;
  c->first = arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 2));
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) c->first[m->nodes[i]->inputs[j]->id + 1]++;
  for (int i = 0; i < n; i++) c->first[i + 1] += c->first[i];
  int total = c->first[n];
  c->reader = arena_alloc(&m->arena, sizeof(int) * (size_t)(total + 1));
  c->input = arena_alloc(&m->arena, sizeof(int) * (size_t)(total + 1));
  int *fill = arena_alloc(&m->arena, sizeof(int) * (size_t)(n + 1));
  for (int i = 0; i < n; i++) fill[i] = c->first[i];
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m->nodes[i]->ninputs; j++) {
      int a = m->nodes[i]->inputs[j]->id, at = fill[a]++;
      c->reader[at] = i, c->input[at] = j;
    }
}

/* 1 if q moves n's elements as they are, with a buffer of its own, in
 * pairs (n dense): a group_copy of n (tp's identity forward, its gradient
 * the all-reduce) of an even number of elements, or an all-gather of n
 * whose pieces' rows (the elements past the cut dimension) are of an even
 * number.  The trainer moves n's bytes (the float counts halved where n is
 * stored as bf16: host_cuda.c), so q is stored as n is. */
static int copy_of(const Store *c, const IrNode *q, const IrNode *n, int wide) {
  if (q->inputs[0] != n || wide || q->dtype != IR_F32 || c->bp->offset[q->id] < 0 ||
      c->bp->alias[q->id] >= 0 || c->kp->view_of[q->id] >= 0)
    return 0;
  int64_t outer, len, inner;
  if (q->op == IR_OP_GROUP_COPY) return ir_numel(q) % 2 == 0;
  if (q->op != IR_OP_ALL_GATHER) return 0;
  cg_dim_split(q, &outer, &len, &inner);
  return inner % 2 == 0;
}

/* Who reads n: READ_GEMM, a GEMM that may read it stored as bf16; READ_KERNEL,
 * a generated kernel (through a param of it, which the store retypes);
 * READ_XENT, (vocab_)cross_entropy or its gradient as their logits;
 * READ_ATTN, attention (or its gradient from the row statistics) as q, k, v
 * (dy) where cg_cuda_attn_stored_ok, sdpa_delta (rt_cuda_sdpa_delta_io reads
 * bf16 in any mode), or sdpa_lse (it copies the lse after sdpa's out, which
 * stays f32); READ_OTHER, anything else (a runtime op, a GEMM that could not, the
 * optimizer: what it reads are parameter gradients).  A view of n, or a
 * group_copy or all-gather of it (copy_of), counts as its readers (recursively), or as
 * OTHER where keep[] has it; wide values
 * (rows of 2 cols) admit views that keep the rows only, and their kernel
 * readers count as OTHER (a kernel indexes dense rows).  mark gets n's
 * views and copies. */
static int readers(const Store *c, const IrNode *n, int wide, Marks *mark) {
  const CgKernelPlan *kp = c->kp;
  int who = 0;
  for (int u = c->first[n->id]; u < c->first[n->id + 1]; u++) {
    const IrNode *q = c->m->nodes[c->reader[u]];
    int j = c->input[u];
    if (is_view_of(kp, c->bp, q, n, wide) || copy_of(c, q, n, wide)) {
      /* (a view that stays f32 keeps its value f32: its bytes are the value's) */
      who |= c->keep[q->id] ? READ_OTHER : readers(c, q, wide, mark);
      if (!mark->on[q->id]) mark->on[q->id] = 1, mark->ids[mark->n++] = q->id;
    } else if (q->phase == IR_PHASE_OPT) {
      who |= READ_OTHER; /* a parameter gradient: f32 for the optimizer */
    } else if (!cg_runtime_op(q->op)) {
      who |= wide || kp->kernel_of[q->id] < 0 ? READ_OTHER : READ_KERNEL;
    } else if (xent(q->op) && j == 0 && !wide) {
      who |= READ_XENT;
    } else if (!wide && ((cg_cuda_attn_stored_ok(q) && j < 4) ||
                         (q->op == IR_OP_ATTENTION_LSE && j == 0) ||
                         (q->op == IR_OP_ATTENTION_DELTA && j < 2))) {
      who |= READ_ATTN; /* (an attention's inputs are q, k, v and, its gradient's, dy first) */
    } else if ((q->op == IR_OP_MATMUL || q->op == IR_OP_MATMUL_TA) && j <= 1) {
      const RtCudaGemm g = cg_cuda_gemm(q);
      who |= rt_cuda_gemm_stored_ok(&g, j) ? READ_GEMM : READ_OTHER;
    } else {
      who |= READ_OTHER;
    }
  }
  return who;
}

/* Stores n as bf16 (how: 1 dense, 2 wide), and its views, if nothing but
 * GEMMs that may, kernels and cross-entropy read it; small: n is a
 * reduction's result (fewer elements than a buffer its kernel reads), which a
 * kernel may not read as bf16 (row statistics stay f32).  Logits go bf16 with
 * their gradients (rt_cuda_(vocab_)cross_entropy_grad_bf16io reads and writes
 * both, in place): only if GEMMs that may are all that read each gradient.
 * views, gv: scratch, clear on entry and on return. */
static void mark(const Store *c, const IrNode *n, int how, int small, Marks *views, Marks *gv,
                 unsigned char *bf16) {
  IrModule *m = c->m;
  int who = readers(c, n, how == 2, views);
  if (!who || who & READ_OTHER || (small && who & READ_KERNEL)) {
    marks_clear(views);
    return;
  }
  /* n's cross_entropy_grads and their views, into gv */
  for (int i = n->id + 1; who & READ_XENT && i < m->nnodes; i++) {
    const IrNode *q = m->nodes[i];
    if (xent(q->op) != 1 || (q->inputs[0] != n && !views->on[q->inputs[0]->id])) continue;
    if (readers(c, q, 0, gv) != READ_GEMM) {
      marks_clear(views), marks_clear(gv);
      return;
    }
    if (!gv->on[i]) gv->on[i] = 1, gv->ids[gv->n++] = i;
  }
  bf16[n->id] = (unsigned char)how;
  for (int k = 0; k < views->n; k++) bf16[views->ids[k]] = (unsigned char)how;
  for (int k = 0; k < gv->n; k++) bf16[gv->ids[k]] = (unsigned char)how;
  marks_clear(views), marks_clear(gv);
}

/* The params of kernel instance k to retype, as a mask (params past 63:
 * never): those of a bf16 buffer; round: only those it stores. */
static uint64_t mask_of(const CgKernel *k, const unsigned char *bf16, int round) {
  uint64_t mask = 0;
  for (int p = 0; p < k->nargs && p < 64; p++)
    if (k->arg_node[p] >= 0 && bf16[k->arg_node[p]] && (!round || k->k->params[p].access != KIR_IN))
      mask |= (uint64_t)1 << p;
  return mask;
}

/* 1 if kernel k reads a node buffer of more elements than n has. */
static int reduces(const IrModule *m, const CgKernel *k, const IrNode *n) {
  for (int p = 0; p < k->nargs; p++)
    if (k->arg_node[p] >= 0 && k->k->params[p].access != KIR_OUT &&
        ir_numel(m->nodes[k->arg_node[p]]) > ir_numel(n))
      return 1;
  return 0;
}

/* 1 if node a may be stored as bf16 as far as it goes (the header's second
 * rule): f32, an activation or an activation's gradient (phase FWD or B: not
 * W, a weight gradient's part, nor OPT; but a norm in W is an activation, the
 * backward's recomputation of a forward one, passes/remat_norm.c, and so is
 * a reshape in W of an activation: a weight gradient's operand, which a
 * kernel stores where it computes the activation inline, as for a
 * recomputation of passes/remat_act.c) with a buffer of its own, no
 * result. */
static int candidate(const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                     const unsigned char *keep, int a) {
  const IrNode *n = m->nodes[a];
  int act_view = n->op == IR_OP_RESHAPE && (n->inputs[0]->phase == IR_PHASE_FWD ||
                                            n->inputs[0]->phase == IR_PHASE_B);
  return n->dtype == IR_F32 &&
         (n->phase == IR_PHASE_FWD || n->phase == IR_PHASE_B ||
          (n->phase == IR_PHASE_W && (ir_op_is_norm(n->op) || act_view))) &&
         !keep[a] &&
         kp->inplace_of[a] < 0 &&
         kp->view_of[a] < 0 && bp->alias[a] < 0 && bp->offset[a] >= 0;
}

/* A trainer of stage programs (pp): the parameter-gradient terms its stage
 * functions add to the accumulator outside kernels (rt_cuda_acc) stay f32,
 * and so do the nodes of no chunk (leaves, the optimizer, the gradient sums
 * the accumulator replaces).  The values sent between chunks may be stored
 * as bf16: rt_cuda_pipe_step's transfers move a value's bytes as they are
 * (RtPipeValue.count words of 4 bytes, its bf16 elements in pairs), and the
 * receiving stage's readers widen them as any reader of a stored value. */
static void keep_pipe(const IrModule *m, const PpProgram *pp, unsigned char *keep) {
  for (int i = 0; i < m->nnodes; i++)
    if (pp->chunk[i] < 0 || pp->grad_param[i] >= 0) keep[i] = 1;
}

/* The kernel instance that stores param leaf's update in place (arg p of
 * access inout: cg_kernels.h, IN-PLACE UPDATES), with *arg = p; -1 where
 * none does (an update copied in at the end of the step, a collective's,
 * no update). */
static int param_writer(const IrModule *m, const CgKernelPlan *kp, const IrNode *leaf, int *arg) {
  for (int u = 0; u < m->nupdates; u++) {
    const IrNode *v = m->updates[u].value;
    if (m->updates[u].leaf != leaf || kp->inplace_of[v->id] != leaf->id) continue;
    int k = kp->kernel_of[v->id];
    if (k < 0) return -1;
    const CgKernel *kk = &kp->kernels[k];
    for (int p = 0; p < kk->nargs; p++)
      if (kk->arg_node[p] == leaf->id && kk->k->params[p].access == KIR_INOUT) {
        *arg = p;
        return k;
      }
    return -1;
  }
  return -1;
}

/* mirror and mirror_all (cuda_store.h); arg[i]: the param of instance i's
 * code that mirror[i] names, else -1.  All or nothing: a copy kept for some
 * params would still need the step's pass for the others. */
static void plan_mirror(const IrModule *m, const CgKernelPlan *kp, int weights, CgCudaStore *out,
                        int *arg) {
  for (int i = 0; i < kp->nkernels; i++) out->mirror[i] = arg[i] = -1;
  if (!weights) return;
  int any = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_PARAM || ir_numel(n) == 0) continue;
    int p = -1, k = param_writer(m, kp, n, &p);
    if (k < 0 || out->mirror[k] >= 0) { /* no kernel, or one storing two params */
      for (int j = 0; j < kp->nkernels; j++) out->mirror[j] = arg[j] = -1;
      return;
    }
    out->mirror[k] = i, arg[k] = p, any = 1;
  }
  out->mirror_all = any;
}

/* src with param p's stores repeated, each right after itself, into a new
 * last param: a bf16 out buffer (the params' copy), so that both get the
 * same value at the same index in the same iteration; named NAME_pbP.
 * Nodes are renumbered (loops own contiguous ranges, kir.h); the clone is
 * finished: no builder call may extend it (no value numbering table). */
static KirKernel *with_mirror(IrModule *m, const KirKernel *src, int p, const char *name) {
  int extra = 0;
  for (int v = 0; v < src->nnodes; v++)
    extra += src->nodes[v].op == KIR_OP_STORE && src->nodes[v].imm == p;
  KirKernel *c = arena_alloc(&m->arena, sizeof *c);
  *c = *src;
  c->nodes = arena_alloc(&m->arena, sizeof(KirNode) * (size_t)(src->nnodes + extra));
  int *map = arena_alloc(&m->arena, sizeof(int) * (size_t)(src->nnodes + 1));
  int j = 0;
  for (int v = 0; v < src->nnodes; v++) {
    map[v] = j;
    c->nodes[j++] = src->nodes[v];
    if (src->nodes[v].op == KIR_OP_STORE && src->nodes[v].imm == p) {
      c->nodes[j] = src->nodes[v];
      c->nodes[j++].imm = src->nparams;
    }
  }
  map[src->nnodes] = j;
  for (int v = 0; v < j; v++)
    for (int a = 0; a < 3; a++)
      if (c->nodes[v].arg[a] != KIR_NONE) c->nodes[v].arg[a] = map[c->nodes[v].arg[a]];
  c->nnodes = c->cap_nodes = j;
  c->loops = arena_alloc(&m->arena, sizeof(KirLoop) * (size_t)(src->nloops + 1));
  for (int l = 0; l < src->nloops; l++) {
    KirLoop L = src->loops[l];
    L.extent = map[L.extent];
    if (L.col != KIR_NONE) L.col = map[L.col];
    L.first = map[L.first], L.end = map[L.end];
    c->loops[l] = L;
  }
  c->cap_loops = src->nloops;
  c->params = arena_alloc(&m->arena, sizeof(KirParam) * (size_t)(src->nparams + 1));
  memcpy(c->params, src->params, sizeof(KirParam) * (size_t)src->nparams);
  size_t len = strlen(src->params[p].name) + 6;
  char *pname = arena_alloc(&m->arena, len);
  snprintf(pname, len, "%s_bf16", src->params[p].name);
  c->params[src->nparams] = (KirParam){pname, KIR_PARAM_BUF, KIR_BF16, KIR_OUT, 0, extra};
  c->nparams = c->cap_params = src->nparams + 1;
  c->cse = NULL, c->ncse = c->cap_cse = 0;
  len = strlen(name) + 16; /* (the param's index in the name: instances of one code
                              mirroring different params get codes of their own) */
  c->name = arena_alloc(&m->arena, len);
  snprintf(c->name, len, "%s_pb%d", name, p);
  return c;
}

void cg_cuda_store_plan(IrModule *m, const CgKernelPlan *kp, const BufPlan *bp, const int *canon,
                        int bf16, CgStoreMode mode, const PpProgram *pp, CgCudaStore *out) {
  memset(out, 0, sizeof *out);
  /* the attention backwards' dq scratch: GEMM mode bf16 (precision bf16, stored or not) */
  for (int i = 0; bf16 && i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_ATTENTION_GRAD) {
      const IrSdpaDims d = ir_sdpa_dims(m->nodes[i]);
      const int64_t ws = rt_cuda_attn_dq_ws(d.B, d.H, d.KV, d.T, d.hd, (int)m->nodes[i]->ia[0]);
      if (ws > out->attn_dq) out->attn_dq = ws;
    }
  bf16 = bf16 && mode != CG_STORE_OFF;
  out->bf16 = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  out->canon = arena_alloc(&m->arena, sizeof(int) * (size_t)(kp->nkernels + 1));
  out->mirror = arena_alloc(&m->arena, sizeof(int) * (size_t)(kp->nkernels + 1));
  out->code = arena_alloc(&m->arena, sizeof(KirKernel *) * (size_t)(kp->nkernels + 1));
  unsigned char *keep = cg_results(m);
  if (pp) keep_pipe(m, pp, keep);
  Store st = {m, kp, bp, keep, NULL, NULL, NULL};
  uses(&st);
  Marks views = {arena_alloc(&m->arena, (size_t)m->nnodes + 1),
                 arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1)), 0};
  Marks gv = {arena_alloc(&m->arena, (size_t)m->nnodes + 1),
              arena_alloc(&m->arena, sizeof(int) * (size_t)(m->nnodes + 1)), 0};
  /* the candidates: stored by a kernel as an out param (at most 64 params) */
  for (int i = 0; bf16 && i < kp->nkernels; i++) {
    const CgKernel *k = &kp->kernels[i];
    if (cg_kernel_is_view(kp, bp, i)) continue;
    for (int p = 0; p < k->nargs && p < 64; p++) {
      int a = k->arg_node[p];
      const KirParam *q = &k->k->params[p];
      if (a < 0 || q->access != KIR_OUT || q->elem != KIR_F32 || !candidate(m, kp, bp, keep, a))
        continue;
      mark(&st, m->nodes[a], 1, reduces(m, k, m->nodes[a]), &views, &gv, out->bf16);
    }
  }
  /* GEMM results: cuBLASLt writes them bf16 (RT_CUDA_MM_C_BF16) */
  for (int i = 0; bf16 && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_MATMUL && n->op != IR_OP_MATMUL_TA) continue;
    const RtCudaGemm g = cg_cuda_gemm(n);
    if (rt_cuda_gemm_out_stored_ok(&g) && candidate(m, kp, bp, keep, i))
      mark(&st, n, 1, 0, &views, &gv, out->bf16);
  }
  /* attention's results: the mma kernels write out (dqkv) bf16 (RT_CUDA_ATTN_O_BF16) */
  for (int i = 0; bf16 && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (cg_cuda_attn_stored_ok(n) && candidate(m, kp, bp, keep, i))
      mark(&st, n, 1, 0, &views, &gv, out->bf16);
  }
  /* all-reduce results: rt_cuda_all_reduce_bf16 rounds the f32 sum as it
   * stores it (in pieces of an even number of elements, one a member);
   * small: the partials are a kernel's reduction (row statistics) */
  for (int i = 0; bf16 && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_ALL_REDUCE || n->ia[1] < 1 || ir_numel(n) % (2 * n->ia[1]) ||
        !candidate(m, kp, bp, keep, i))
      continue;
    int k = kp->kernel_of[n->inputs[0]->id];
    mark(&st, n, 1, k >= 0 && reduces(m, &kp->kernels[k], n->inputs[0]), &views, &gv, out->bf16);
  }
  /* (vocab_)cross_entropy_grad's dlogits: rt_cuda_(vocab_)cross_entropy_grad_bf16
   * store them wide, in place of the logits or not */
  for (int i = 0; bf16 && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if ((n->op == IR_OP_CROSS_ENTROPY_GRAD || n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD) &&
        !keep[i] && bp->offset[i] >= 0 && kp->view_of[i] < 0 &&
        !out->bf16[i]) /* (not stored with its logits already) */
      mark(&st, n, 2, 0, &views, &gv, out->bf16);
  }
  for (int i = 0; i < m->nnodes; i++) /* (a view is its value's buffer: not counted again) */
    if (out->bf16[i] && kp->view_of[i] < 0) out->count++, out->elements += ir_numel(m->nodes[i]);
  /* the code of each instance: its shared code, retyped where it stores bf16
   * (round: where it stores a value rounded so) */
  int round = mode == CG_STORE_ROUND;
  /* the weights' bf16 copy: round mode's GEMMs convert the f32 params, as
   * the copy rounds them (the store check compares the two); a stage
   * program's, of its stage's own params */
  out->weights = bf16 && !round;
  int *marg = arena_alloc(&m->arena, sizeof(int) * (size_t)(kp->nkernels + 1));
  plan_mirror(m, kp, out->weights && cg_cuda_weights_read(m, 1), out, marg);
  uint64_t *mask = arena_alloc(&m->arena, sizeof(uint64_t) * (size_t)(kp->nkernels + 1));
  for (int i = 0; i < kp->nkernels; i++) {
    /* (a view's kernel launches nothing: it keeps its f32 code) */
    mask[i] = cg_kernel_is_view(kp, bp, i) ? 0 : mask_of(&kp->kernels[i], out->bf16, round);
    int base = canon ? canon[i] : i;
    out->canon[i] = i;
    for (int j = 0; j < i; j++)
      if (out->canon[j] == j && (canon ? canon[j] : j) == base && mask[j] == mask[i] &&
          marg[j] == marg[i]) {
        out->canon[i] = j;
        break;
      }
    if (out->canon[i] != i) continue;
    const KirKernel *src = kp->kernels[base].k;
    if (!mask[i]) {
      out->code[i] = marg[i] >= 0 ? with_mirror(m, src, marg[i], src->name) : kp->kernels[base].k;
      continue;
    }
    KirKernel *c = arena_alloc(&m->arena, sizeof *c);
    *c = *src; /* a view of src's nodes, rows and loops; its own params and name */
    c->params = arena_alloc(&m->arena, sizeof(KirParam) * (size_t)src->nparams);
    memcpy(c->params, src->params, sizeof(KirParam) * (size_t)src->nparams);
    for (int p = 0; p < c->nparams && p < 64; p++)
      if (mask[i] >> p & 1) c->params[p].elem = round ? KIR_BF16R : KIR_BF16;
    size_t len = strlen(kp->kernels[i].k->name) + 7;
    c->name = arena_alloc(&m->arena, len);
    snprintf(c->name, len, "%s_%s", kp->kernels[i].k->name, round ? "bf16r" : "bf16");
    out->code[i] = marg[i] >= 0 ? with_mirror(m, c, marg[i], c->name) : c;
  }
  /* the all-reduces' scratch: their largest piece, bf16 and round alike */
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_ALL_REDUCE && out->bf16[i] &&
        ir_numel(m->nodes[i]) / m->nodes[i]->ia[1] > out->reduce_piece)
      out->reduce_piece = ir_numel(m->nodes[i]) / m->nodes[i]->ia[1];
  /* round: the buffers hold f32 (GEMMs convert them, dlogits are written f32) */
  if (round) {
    out->rounded = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
    memcpy(out->rounded, out->bf16, (size_t)m->nnodes + 1);
    memset(out->bf16, 0, (size_t)m->nnodes + 1);
    out->round = 1;
  }
}
