/* codegen/host.c -- emit train.c for one rank program.
 *
 * Every value the step computes lives at its planned offset in the arena
 * (passes/bufplan.c); parameters and optimizer state live in their own
 * buffers at the offsets cg_plan_leaves gives.  The step runs the IR's
 * nodes in order: a node is either computed by a fused kernel (emitted at
 * its kernel's root), by a runtime routine, or is a leaf.  At the end the
 * module's updates are copied into the parameter and state buffers, except
 * those their kernels stored there in place (cg_kernels.h). */
#include "codegen/host.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_attention.h"

/* the trainers pass sdpa's IR layout bits to the runtimes as they are */
_Static_assert((int)IR_SDPA_OUT_TOKENS == (int)RT_SDPA_OUT_TOKENS &&
                   (int)IR_SDPA_DY_TOKENS == (int)RT_SDPA_DY_TOKENS &&
                   (int)IR_SDPA_QKV_TOKENS == (int)RT_SDPA_QKV_TOKENS,
               "IR_SDPA_* and RT_SDPA_* differ");

#define LEAF_ALIGN 16 /* floats: 64 bytes */

void cg_plan_leaves(IrModule *m, CgLeafPlan *lp) {
  lp->offset = arena_alloc(&m->arena, sizeof(int64_t) * (size_t)(m->nnodes + 1));
  lp->params_numel = lp->state_numel = 0;
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *n = m->nodes[i];
    int64_t *end = n->op == IR_OP_PARAM ? &lp->params_numel
                   : n->op == IR_OP_STATE ? &lp->state_numel : NULL;
    lp->offset[i] = -1;
    if (!end) continue;
    lp->offset[i] = *end;
    *end += (ir_numel(n) + LEAF_ALIGN - 1) / LEAF_ALIGN * LEAF_ALIGN;
  }
}

int64_t cg_params_numel(const IrModule *m) {
  int64_t n = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM)
      n += (ir_numel(m->nodes[i]) + LEAF_ALIGN - 1) / LEAF_ALIGN * LEAF_ALIGN;
  return n;
}

const IrNode *cg_tokens_input(const IrModule *m) {
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op == IR_OP_INPUT && !strcmp(n->name, "tokens") && n->rank == 2) return n;
  }
  return NULL;
}

int *cg_grad_of(const IrModule *m) {
  int *grad_of = malloc(sizeof(int) * ((size_t)m->nnodes + 1));
  if (!grad_of) return NULL;
  for (int i = 0; i < m->nnodes; i++) grad_of[i] = -1;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad) grad_of[m->nodes[i]->grad->id] = i;
  return grad_of;
}

unsigned char *cg_results(IrModule *m) {
  unsigned char *keep = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  if (m->loss) keep[m->loss->id] = 1;
  if (m->ce_loss) keep[m->ce_loss->id] = 1;
  if (m->grad_norm) keep[m->grad_norm->id] = 1;
  for (int i = 0; i < m->nupdates; i++) keep[m->updates[i].value->id] = 1;
  return keep;
}

int cg_runtime_is_view(const CgKernelPlan *kp, const BufPlan *bp, int id) {
  return kp->view_of[id] >= 0 && bp->alias[id] == kp->view_of[id] && kp->kernel_of[id] < 0;
}

int cg_runtime_view_note(FILE *out, const CgKernelPlan *kp, const BufPlan *bp, int id) {
  if (!cg_runtime_is_view(kp, bp, id)) return 0;
  fprintf(out, "  /* a view: %%%d is written over %%%d, whose bytes already hold it */\n", id,
          kp->view_of[id]);
  return 1;
}

int cg_kernel_is_view(const CgKernelPlan *kp, const BufPlan *bp, int k) {
  const CgKernel *kk = &kp->kernels[k];
  if (kk->assembles && bp->part_of && bp->part_of[kk->root] == kk->root) return 1;
  return ((kk->nnodes == 1 && kk->nodes[0] == kk->root) || kk->range_view) &&
         kp->view_of[kk->root] >= 0 && bp->alias[kk->root] == kp->view_of[kk->root];
}

/* ---- emission helpers ------------------------------------------------------ */

/* temporary t's bytes in the arena */
static int64_t temp_bytes(const CgKernelPlan *kp, int t) {
  return (kp->temps[t].numel * 4 + BUFPLAN_ALIGN - 1) / BUFPLAN_ALIGN * BUFPLAN_ALIGN;
}

int64_t cg_arena_bytes(const CgKernelPlan *kp, const BufPlan *bp, int64_t *temp_off) {
  int64_t end = bp->peak;
  for (int t = 0; t < kp->ntemps; t++) {
    if (temp_off) temp_off[t] = end;
    end += temp_bytes(kp, t);
  }
  return end;
}

typedef struct {
  FILE *out;
  const IrModule *m;
  const CgKernelPlan *kp;
  const int *canon;    /* see CgHostInfo */
  const BufPlan *bp;
  const CgLeafPlan *lp;
  int64_t *temp_off;   /* arena offsets of the plan's temporaries */
  int *param_index;    /* per node id: index in params[] of a PARAM, else -1 */
  char *err;
  size_t errlen;
  int failed;
  int *grad_of;        /* per node id: the node id of the PARAM whose p->grad it is, else -1 */
  const PpProgram *pipe; /* CgHostInfo's */
  /* asynchronous dp bucket collectives (straight-line step only; else NULL) */
  const int *wait_at;  /* per node id: cg_async_waits, -1 for a blocking node */
  int *slot;           /* per node id: its request, dp_req[slot] */
  int *async_ids;      /* the asynchronous nodes in order, nasync of them */
  int nasync, nslots, nwaited;
  const CgPipeHooks *hooks; /* NULL: train.c's statements; else the GPU trainer's
                               (pipelined section only, cg_emit_pipe) */
  int traced;          /* the straight-line step: collectives through COMM (--trace) */
  int grads_in_acc;     /* writing a pipeline's optimizer function: a gradient
                           (p->grad) is read from G (cg_pipe_grads_in_acc) */
} Emit;

/* 1 if the step runs kernel i (a pipelined trainer skips the gradient sums). */
static int kernel_runs(const Emit *e, int i) {
  return !e->pipe || e->pipe->chunk[e->kp->kernels[i].root] != PP_NODE_SKIP;
}

/* The PARAM into whose accumulator node n's GEMM adds its product
 * (cg_pipe_acc_into), or -1 */
static int acc_into(const CgKernelPlan *kp, const IrNode *n) {
  return kp->acc_into ? kp->acc_into[n->id] : -1;
}

static void fail(Emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(Emit *e, const char *fmt, ...) {
  if (e->failed++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->err, e->errlen, fmt, ap);
  va_end(ap);
}

static const char *base_name(const char *path) {
  const char *s = path ? strrchr(path, '/') : NULL;
  return s ? s + 1 : path ? path : "?";
}

/* A C string literal for s (names are identifiers and dots; be safe anyway). */
static void put_str(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
    else if (c < 32 || c > 126) fprintf(out, "\\%03o", c);
    else fputc(c, out);
  }
  fputc('"', out);
}

/* A float literal C accepts: "0.02f", "1e-05f", "0.0f" (never "0f"). */
static const char *flit(char *s, size_t len, double v) {
  int k = snprintf(s, len, "%.9g", v);
  if (!strpbrk(s, ".en") && k + 3 < (int)len) strcat(s, ".0");
  if (strlen(s) + 2 < len) strcat(s, "f");
  return s;
}

const char *cg_sdpa_dims(const IrNode *n, char *s, size_t len) {
  const IrSdpaDims d = ir_sdpa_dims(n);
  char fl[32];
  snprintf(s, len, "%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %s, %d",
           d.B, d.H, d.KV, d.T, d.hd, flit(fl, sizeof fl, n->fa), (int)n->ia[0]);
  return s;
}

/* The C expression for node n's buffer (an update value written in place:
 * its leaf's). */
static const char *buf(Emit *e, const IrNode *n, char *s, size_t len) {
  if (e->kp && e->kp->inplace_of[n->id] >= 0) n = e->m->nodes[e->kp->inplace_of[n->id]];
  if (e->grads_in_acc && e->grad_of[n->id] >= 0) { /* summed into G by the microbatches */
    snprintf(s, len, "G + %" PRId64, e->lp->offset[e->grad_of[n->id]]);
    return s;
  }
  if ((n->op == IR_OP_PARAM || n->op == IR_OP_STATE) && e->lp->offset[n->id] < 0)
    fail(e, "%s is not in this rank's buffers (a pipeline stage reads a parameter of another)",
         n->name);
  switch (n->op) {
  case IR_OP_PARAM:
    snprintf(s, len, "P + %" PRId64, e->lp->offset[n->id]);
    return s;
  case IR_OP_STATE:
    snprintf(s, len, "S + %" PRId64, e->lp->offset[n->id]);
    return s;
  case IR_OP_INPUT:
    if (!strcmp(n->name, "tokens") && n->dtype == IR_I32) return "io->tokens";
    if (!strcmp(n->name, "targets") && n->dtype == IR_I32) return "io->targets";
    if (!strcmp(n->name, "lr") && n->rank == 0) return "&lr";
    if (!strcmp(n->name, "step") && n->rank == 0) return "&t";
    fail(e, "input '%s': the trainer feeds i32 'tokens' and 'targets' only", n->name);
    return "NULL";
  default:
    if (e->bp->offset[n->id] < 0) {
      fail(e, "node %%%d (%s) has no buffer", n->id, ir_op_info[n->op].name);
      return "NULL";
    }
    snprintf(s, len, "%s(%" PRId64 ")", n->dtype == IR_I32 ? "I" : "F", e->bp->offset[n->id]);
    return s;
  }
}

/* "%12 = gelu %11 : f32[4, 64, 256]  (prelude.dsl:74)" as a comment. */
static void comment(Emit *e, const IrNode *n, const char *indent) {
  char ty[160];
  fprintf(e->out, "%s/* %%%d = %s", indent, n->id, ir_op_info[n->op].name);
  for (int j = 0; j < n->ninputs; j++) fprintf(e->out, "%s%%%d", j ? ", " : " ", n->inputs[j]->id);
  fprintf(e->out, " : %s", ir_type_str(n, ty, sizeof ty));
  if (n->loc.line) fprintf(e->out, "  (%s:%d)", base_name(n->loc.file), n->loc.line);
  fprintf(e->out, " */\n");
}

static int64_t lead(const IrNode *x, int keep) { return ir_dims_product(x, 0, x->rank - keep); }

static int64_t dim(const IrNode *x, int i) { return x->shape[i < 0 ? x->rank + i : i]; }

/* The RtStepIO group of mesh axis `axis` (ir/ops.def): io->tp_group, ... */
static const char *group_of(int64_t axis) {
  static const char *const name[] = {"tp", "dp", "ep", "ep_dp"};
  return axis >= 0 && axis < 4 ? name[axis] : "tp";
}

/* all_gather, replicate, reduce_scatter or local_slice along dimension
 * ia[2] of [outer, n, inner] (n the whole size): the strided forms in
 * rt_route.h; local_slice takes the rank's coordinate at run time. */
void cg_dim_split(const IrNode *n, int64_t *outer, int64_t *len, int64_t *inner) {
  int cut = n->op == IR_OP_REDUCE_SCATTER || n->op == IR_OP_LOCAL_SLICE;
  const IrNode *whole = cut ? n->inputs[0] : n;
  int d = (int)n->ia[2];
  *outer = ir_dims_product(whole, 0, d);
  *inner = ir_dims_product(whole, d + 1, whole->rank);
  *len = whole->shape[d];
}

/* rt_trace.h's name of the group of axis (an IR collective's ia[0]) */
static const char *trace_group(int64_t axis) {
  static const char *const group[] = {"TP", "DP", "EP", "EP_DP"};
  return axis >= 0 && axis < 4 ? group[axis] : "TP";
}

/* The opening of a collective's statement: "  CHECK(" or, in a traced step,
 * "  COMM(KIND, GROUP, HOW, count, " (train.c's COMM: the call timed into
 * io->trace when --trace is given); the caller prints the call and "));". */
static void comm_begin(Emit *e, const char *kind, int64_t axis, const char *how,
                       const char *count) {
  if (!e->traced) {
    fputs("  CHECK(", e->out);
    return;
  }
  fprintf(e->out, "  COMM(%s, %s, %s, %s, ", kind, trace_group(axis), how, count);
}

/* The trace arguments of a vocab-parallel cross-entropy (whose gathers the
 * runtime records itself, rt_route.h): "io->trace, RT_TRACE_TP" in a traced
 * step (by the node's group), else "NULL, 0"; into s. */
static const char *vocab_trace(const Emit *e, const IrNode *n, char *s, size_t len) {
  if (!e->traced) snprintf(s, len, "NULL, 0");
  else snprintf(s, len, "io->trace, RT_TRACE_%s", trace_group(n->ia[0]));
  return s;
}

static void comm_begin_n(Emit *e, const char *kind, int64_t axis, const char *how,
                         int64_t count) {
  char c[32];
  snprintf(c, sizeof c, "%" PRId64, count);
  comm_begin(e, kind, axis, how, c);
}

/* The traced kind of an all_reduce, all_gather or reduce_scatter node, and its
 * floats (the whole vector). */
static const char *comm_kind(const IrNode *n) {
  return n->op == IR_OP_ALL_REDUCE ? "ALL_REDUCE"
         : n->op == IR_OP_REDUCE_SCATTER ? "REDUCE_SCATTER" : "ALL_GATHER";
}

static int64_t comm_count(const IrNode *n) {
  return ir_numel(n->op == IR_OP_REDUCE_SCATTER ? n->inputs[0] : n);
}

static void emit_dim_collective(Emit *e, const IrNode *n, const char *x, const char *out) {
  int64_t outer, len, inner;
  cg_dim_split(n, &outer, &len, &inner);
  const char *grp = group_of(n->ia[0]);
  if (n->op == IR_OP_LOCAL_SLICE)
    fprintf(e->out, "  CHECK(rt_local_slice(%s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_comm_rank(io->%s_group), %" PRId64 "));\n", out, x, outer, len,
            inner, grp, n->ia[1]);
  else {
    comm_begin_n(e, n->op == IR_OP_REDUCE_SCATTER ? "REDUCE_SCATTER" : "ALL_GATHER", n->ia[0],
                 "BLOCKING", outer * len * inner);
    fprintf(e->out, "%s(io->%s_group, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n",
            n->op == IR_OP_REDUCE_SCATTER ? "rt_reduce_scatter_dim" : "rt_all_gather_dim", grp,
            x, out, outer, len, inner);
  }
}

/* ---- asynchronous dp bucket collectives ------------------------------------ */

/* 1 if the step starts n and waits for it later: a dp bucket's collective
 * (passes/dp_grads.c), unless --no-overlap, in the communicator's contiguous
 * form (emit_runtime's; the strided rt_route.h forms stay blocking). */
static int async_form(const IrModule *m, const IrNode *n) {
  if (m->dp_blocking || !dp_grads_is_bucket(n)) return 0;
  if (n->op == IR_OP_REDUCE_SCATTER)
    return lead(n->inputs[0], n->inputs[0]->rank - (int)n->ia[2]) == 1;
  return 1;
}

int *cg_async_waits(const IrModule *m, const CgKernelPlan *kp) {
  int n = m->nnodes, any = 0;
  for (int i = 0; i < n && !any; i++) any = kp->kernel_of[i] < 0 && async_form(m, m->nodes[i]);
  if (!any) return NULL;
  int *pos = malloc(sizeof(int) * ((size_t)n + 1)), *wait = malloc(sizeof(int) * ((size_t)n + 1));
  if (!pos || !wait) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  int end = 0;
  for (int i = 0; i < n; i++) {
    pos[i] = kp->kernel_of[i] >= 0 ? kp->kernels[kp->kernel_of[i]].root : i;
    if (pos[i] + 1 > end) end = pos[i] + 1;
  }
  for (int i = 0; i < n; i++)
    wait[i] = kp->kernel_of[i] < 0 && async_form(m, m->nodes[i]) ? end : -1;
  /* the first position that reads the result (a kernel reads where its root runs) */
  for (int j = 0; j < n; j++)
    for (int k = 0; k < m->nodes[j]->ninputs; k++) {
      int c = m->nodes[j]->inputs[k]->id;
      if (wait[c] >= 0 && pos[j] < wait[c]) wait[c] = pos[j];
    }
  free(pos);
  return wait;
}

/* Request slots: a collective takes the lowest slot free at its start; slots
 * come free at their waits (which run before anything else at a position). */
static int plan_async(Emit *e) {
  const IrModule *m = e->m;
  int n = m->nnodes;
  e->slot = malloc(sizeof(int) * ((size_t)n + 1));
  e->async_ids = malloc(sizeof(int) * ((size_t)n + 1));
  unsigned char *busy = calloc((size_t)n + 1, 1);
  if (!e->slot || !e->async_ids || !busy) {
    free(busy);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    e->slot[i] = -1;
    for (int k = 0; k < e->nasync; k++) {
      int c = e->async_ids[k];
      if (e->wait_at[c] == i) busy[e->slot[c]] = 0;
    }
    if (e->wait_at[i] < 0) continue;
    int s = 0;
    while (busy[s]) s++;
    busy[s] = 1;
    e->slot[i] = s;
    if (s + 1 > e->nslots) e->nslots = s + 1;
    e->async_ids[e->nasync++] = i;
  }
  free(busy);
  return 0;
}

static void emit_async_decl(Emit *e) {
  if (!e->nasync) return;
  fprintf(e->out,
          "  /* The dp gradient buckets' collectives run asynchronously: each is started\n"
          "   * as soon as its bucket is complete and overlaps the rest of the backward\n"
          "   * pass; its wait comes right before the first use of its result.  One\n"
          "   * request per collective in flight (%d buckets). */\n"
          "  RtCommReq dp_req[%d] = {{0}};\n", e->nasync, e->nslots);
}

/* After the call that computes n: if n is a parameter's gradient as the
 * optimizer reads it (p->grad, materialised by the kernel plan), its copy for
 * --save-grads; for an asynchronous collective's result (a parameter alone in
 * its dp bucket), after its wait (emit_waits). */
static void emit_save_grad(Emit *e, const IrNode *n) {
  int i = e->grad_of[n->id];
  if (i < 0 || (e->wait_at && e->wait_at[n->id] >= 0 && e->slot[n->id] >= 0)) return;
  char b[96];
  fprintf(e->out, "  SAVE_GRAD(%" PRId64 ", %s, %" PRId64 "); /* %s */\n", e->lp->offset[i],
          buf(e, n, b, sizeof b), ir_numel(n), e->m->nodes[i]->name);
}

/* The waits due before position i (INT_MAX: every one left). */
static void emit_waits(Emit *e, int i) {
  for (int k = e->nwaited; k < e->nasync; k++) {
    int c = e->async_ids[k];
    if (e->wait_at[c] > i) continue;
    if (e->slot[c] < 0) continue;  /* waited for already */
    const IrNode *n = e->m->nodes[c];
    comm_begin_n(e, comm_kind(n), n->ia[0], "WAIT", comm_count(n));
    fprintf(e->out, "rt_comm_wait(&dp_req[%d])); /* dp bucket %d (%%%d) complete */\n",
            e->slot[c], k, c);
    e->slot[c] = -1 - e->slot[c];    /* marks it waited, keeps the slot readable */
    emit_save_grad(e, n);
  }
  while (e->nwaited < e->nasync && e->slot[e->async_ids[e->nwaited]] < 0) e->nwaited++;
}

/* The start form of n's collective, if the step runs it asynchronously. */
static int emit_async_start(Emit *e, const IrNode *n, const char *x, const char *out) {
  if (!e->wait_at || e->wait_at[n->id] < 0) return 0;
  int k = 0;
  while (k < e->nasync && e->async_ids[k] != n->id) k++;
  int w = e->wait_at[n->id];
  char when[64];
  if (w < e->m->nnodes) snprintf(when, sizeof when, "before %%%d", w);
  else snprintf(when, sizeof when, "at the end of the step");
  fprintf(e->out, "  /* dp bucket %d: started now, it runs while the backward pass goes on; "
                  "waited for %s */\n", k, when);
  comm_begin_n(e, comm_kind(n), n->ia[0], "START", comm_count(n));
  if (n->op == IR_OP_ALL_REDUCE) {
    fprintf(e->out, "rt_comm_all_reduce_start(io->%s_group, %s, %s, %" PRId64
            ", &dp_req[%d]));\n", group_of(n->ia[0]), x, out, ir_numel(n), e->slot[n->id]);
    return 1;
  }
  fprintf(e->out, "rt_comm_reduce_scatter_start(io->%s_group, %s, %s, (const int64_t[]){",
          group_of(n->ia[0]), x, out);
  for (int64_t r = 0; r < n->ia[1]; r++) fprintf(e->out, "%s%" PRId64, r ? ", " : "", ir_numel(n));
  fprintf(e->out, "}, &dp_req[%d]));\n", e->slot[n->id]);
  return 1;
}

/* One runtime call for a node the kernels do not compute. */
static void emit_runtime(Emit *e, const IrNode *n) {
  char o[96], a0[96], a1[96], a2[96], a3[96], ds[160], tr[48];
  IrNode *const *in = n->inputs;
  /* a gradient term its op adds into the accumulator itself (cg_pipe_acc_into) */
  int acc = acc_into(e->kp, n);
  if (acc >= 0) snprintf(o, sizeof o, "G + %" PRId64, e->lp->offset[acc]);
  /* an embedding's gradient added onto another term's bytes (codegen/grad_onto.h) */
  const int onto = e->kp->onto ? e->kp->onto[n->id] : -1;
  const char *out = acc >= 0 ? o : buf(e, onto >= 0 ? e->m->nodes[onto] : n, o, sizeof o);
  const char *x = n->ninputs > 0 ? buf(e, in[0], a0, sizeof a0) : NULL;
  const char *y = n->ninputs > 1 ? buf(e, in[1], a1, sizeof a1) : NULL;
  const char *z = n->ninputs > 2 ? buf(e, in[2], a2, sizeof a2) : NULL;
  const char *w = n->ninputs > 3 ? buf(e, in[3], a3, sizeof a3) : NULL;
  FILE *f = e->out;
  switch (n->op) {
  case IR_OP_MATMUL:
  case IR_OP_MATMUL_TA: {
    const IrNode *a = in[0], *b = in[1];
    int ta = n->op == IR_OP_MATMUL_TA;
    int64_t m = ta ? dim(a, -1) : dim(a, -2), k = ta ? dim(a, -2) : dim(a, -1);
    int64_t nn = dim(n, -1);
    fprintf(f, "  CHECK(%s(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %s%s%s0));"
            "%s\n", ta ? "rt_matmul_ta" : "rt_matmul", out, x, y, lead(a, 2), m, k, nn,
            n->ia[0] ? "RT_MM_TRANSPOSE_B | " : "", b->rank > 2 ? "RT_MM_B_BATCHED | " : "",
            acc >= 0 ? "RT_MM_ACCUMULATE | " : "", acc >= 0 ? " /* += gradient term */" : "");
    return;
  }
  case IR_OP_ATTENTION: /* lse [B, H, T] right after out (ir_aux_numel) */
    if (n->ia[1]) /* token-major out (IR_SDPA_OUT_TOKENS = RT_SDPA_OUT_TOKENS) */
      fprintf(f, "  CHECK(rt_sdpa_layout(%s, %s + %" PRId64 ", %s, %s, %s, %s, %u));\n", out, out,
              ir_numel(n), x, y, z, cg_sdpa_dims(n, ds, sizeof ds), (unsigned)n->ia[1]);
    else
      fprintf(f, "  CHECK(rt_sdpa(%s, %s + %" PRId64 ", %s, %s, %s, %s));\n", out, out,
              ir_numel(n), x, y, z, cg_sdpa_dims(n, ds, sizeof ds));
    return;
  case IR_OP_ATTENTION_GRAD: {
    if (n->ninputs == 6) { /* lse and D on their own (passes/attn_delta.c) */
      char lo[96], dl[96];
      if (n->ia[1]) /* token-major dy and / or dqkv (IR_SDPA_* = RT_SDPA_*) */
        fprintf(f, "  CHECK(rt_sdpa_grad_stats_layout(%s, %s, %s, %s, %s, %s, %s, %s, %u));\n",
                out, x, y, z, w, buf(e, in[4], lo, sizeof lo), buf(e, in[5], dl, sizeof dl),
                cg_sdpa_dims(n, ds, sizeof ds), (unsigned)n->ia[1]);
      else
        fprintf(f, "  CHECK(rt_sdpa_grad_stats(%s, %s, %s, %s, %s, %s, %s, %s));\n", out, x, y,
                z, w, buf(e, in[4], lo, sizeof lo), buf(e, in[5], dl, sizeof dl),
                cg_sdpa_dims(n, ds, sizeof ds));
      return;
    }
    char yo[96]; /* the forward's out and lse from in[4]'s buffer */
    const char *yb = buf(e, in[4], yo, sizeof yo);
    fprintf(f, "  CHECK(rt_sdpa_grad(%s, %s, %s, %s, %s, %s, %s + %" PRId64 ", %s));\n", out, x,
            y, z, w, yb, yb, ir_numel(in[4]), cg_sdpa_dims(n, ds, sizeof ds));
    return;
  }
  case IR_OP_ATTENTION_LSE: /* sdpa's lse, after its out (ir_aux_numel) */
    fprintf(f, "  memcpy(%s, %s + %" PRId64 ", %" PRId64 " * sizeof(float));\n", out, x,
            ir_numel(in[0]), ir_numel(n));
    return;
  case IR_OP_ATTENTION_DELTA: /* [B, T, H hd] x2 -> D [B, H, T] */
    fprintf(f, "  CHECK(rt_sdpa_delta(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
            "));\n", out, x, y, dim(n, 0), dim(n, 1), dim(n, 2), dim(in[0], -1) / dim(n, 1));
    return;
  case IR_OP_TOPK:
    fprintf(f, "  CHECK(rt_topk(%s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n", out, x,
            lead(in[0], 1), dim(in[0], -1), n->ia[0]);
    return;
  case IR_OP_GATHER:
    fprintf(f, "  CHECK(rt_gather(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n", out, x,
            y, lead(in[0], 1), dim(in[0], -1), dim(in[1], -1));
    return;
  case IR_OP_SCATTER_ADD:
    fprintf(f, "  CHECK(rt_scatter_add(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n",
            out, x, y, lead(in[0], 1), dim(in[0], -1), n->ia[0]);
    return;
  case IR_OP_ONEHOT:
    fprintf(f, "  CHECK(rt_onehot(%s, %s, %" PRId64 ", %" PRId64 "));\n", out, x, ir_numel(in[0]),
            n->ia[0]);
    return;
  case IR_OP_DISPATCH:
    fprintf(f, "  CHECK(rt_dispatch(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 "));\n", out, x, y, dim(in[0], 0), dim(in[1], 1), dim(in[0], 1), n->ia[0],
            n->ia[1]);
    return;
  case IR_OP_CAPACITY_DROP: /* drops decided in global token order over dp */
    fprintf(f, "  CHECK(rt_capacity_drop(io->dp_group, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 "));\n", out, x, dim(in[0], 0), dim(in[0], 1), n->ia[0], n->ia[1]);
    return;
  case IR_OP_EXPERT_ALL_TO_ALL: { /* slots to the ranks holding their experts, or back */
    const IrNode *slots = n->ia[2] ? n : in[0]; /* [E, C, ...] */
    int64_t inner = ir_numel(slots) / (dim(slots, 0) * dim(slots, 1));
    if (!e->traced) {
      fprintf(f, "  CHECK(rt_expert_all_to_all(io->%s_group, %s, %s, %s, %" PRId64 ", %" PRId64
              ", %" PRId64 ", %" PRId64 ", %d));\n", group_of(n->ia[0]), out, x, y,
              ir_numel(in[1]), dim(slots, 0), dim(slots, 1), inner, n->ia[2] != 0);
      return;
    }
    fputs("  {\n    int64_t sent_ = 0;\n  ", f);
    comm_begin(e, "ALL_TO_ALL", n->ia[0], "BLOCKING", "sent_");
    fprintf(f, "rt_expert_all_to_all_n(io->%s_group, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 ", %d, &sent_));\n  }\n", group_of(n->ia[0]), out, x, y,
            ir_numel(in[1]), dim(slots, 0), dim(slots, 1), inner, n->ia[2] != 0);
    return;
  }
  case IR_OP_COMBINE:
    fprintf(f, "  CHECK(rt_combine(%s, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 "));\n", out, x, y, z, dim(in[1], 0), dim(in[1], 1), dim(in[0], 2),
            dim(in[0], 0), dim(in[0], 1));
    return;
  case IR_OP_COMBINE_GRAD_Y:
    fprintf(f, "  CHECK(rt_combine_grad_y(%s, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", out, x, y, z, dim(in[1], 0), dim(in[1], 1),
            dim(in[0], 1), dim(n, 0), dim(n, 1));
    return;
  case IR_OP_COMBINE_GRAD_W:
    fprintf(f, "  CHECK(rt_combine_grad_w(%s, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", out, x, y, z, dim(in[2], 0), dim(in[2], 1),
            dim(in[0], 1), dim(in[1], 0), dim(in[1], 1));
    return;
  case IR_OP_EMBEDDING:
    fprintf(f, "  CHECK(rt_embedding(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n", out,
            x, y, ir_numel(in[0]), dim(in[1], 0), dim(in[1], 1));
    return;
  case IR_OP_EMBEDDING_GRAD:
    fprintf(f, "  CHECK(rt_embedding_grad%s(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n",
            acc >= 0 || onto >= 0 ? "_acc" : "", out, x, y, ir_numel(in[0]), n->ia[0],
            dim(in[1], -1));
    return;
  case IR_OP_CROSS_ENTROPY:
    fprintf(f, "  CHECK(rt_cross_entropy(%s, %s, %s, %" PRId64 ", %" PRId64 "));\n", out, x, y,
            lead(in[0], 1), dim(in[0], -1));
    return;
  case IR_OP_CROSS_ENTROPY_GRAD:
    fprintf(f, "  CHECK(rt_cross_entropy_grad(%s, %s, %s, %s, %" PRId64 ", %" PRId64 "));\n", out,
            x, y, z, lead(in[0], 1), dim(in[0], -1));
    return;
  case IR_OP_VOCAB_EMBEDDING: /* the member's rows: its coordinate at run time */
    fprintf(f, "  CHECK(rt_vocab_embedding(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_comm_rank(io->%s_group), %" PRId64 "));\n", out, x, y, ir_numel(in[0]),
            dim(in[1], 0), dim(in[1], 1), group_of(n->ia[0]), n->ia[1]);
    return;
  case IR_OP_VOCAB_EMBEDDING_GRAD:
    fprintf(f, "  CHECK(rt_vocab_embedding_grad%s(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_comm_rank(io->%s_group), %" PRId64 "));\n", acc >= 0 || onto >= 0 ? "_acc" : "",
            out, x, y, ir_numel(in[0]), n->ia[0], dim(in[1], -1), group_of(n->ia[1]), n->ia[2]);
    return;
  case IR_OP_VOCAB_CROSS_ENTROPY: /* (its two gathers traced inside it) */
    fprintf(f, "  CHECK(rt_vocab_cross_entropy(io->%s_group, %s, %s, %s, %s, %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", group_of(n->ia[0]), vocab_trace(e, n, tr, sizeof tr),
            out, x, y, lead(in[0], 1), dim(in[0], -1), n->ia[2]);
    return;
  case IR_OP_VOCAB_CROSS_ENTROPY_GRAD:
    fprintf(f, "  CHECK(rt_vocab_cross_entropy_grad(io->%s_group, %s, %s, %s, %s, %s, %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", group_of(n->ia[0]), vocab_trace(e, n, tr, sizeof tr),
            out, x, y, z, lead(in[0], 1), dim(in[0], -1), n->ia[2]);
    return;
  case IR_OP_ALL_REDUCE:
    if (emit_async_start(e, n, x, out)) return;
    comm_begin_n(e, "ALL_REDUCE", n->ia[0], "BLOCKING", ir_numel(n));
    fprintf(f, "rt_comm_all_reduce(io->%s_group, %s, %s, %" PRId64 "));\n",
            group_of(n->ia[0]), x, out, ir_numel(n));
    return;
  case IR_OP_ALL_GATHER:
  case IR_OP_REDUCE_SCATTER: { /* the communicator's blocks are contiguous: dim 0 only */
    int gather = n->op == IR_OP_ALL_GATHER;
    const IrNode *whole = gather ? n : in[0], *piece = gather ? in[0] : n;
    if (lead(whole, whole->rank - (int)n->ia[2]) != 1) { /* not contiguous per rank */
      emit_dim_collective(e, n, x, out);
      return;
    }
    if (emit_async_start(e, n, x, out)) return;
    comm_begin_n(e, comm_kind(n), n->ia[0], "BLOCKING", ir_numel(whole));
    fprintf(f, "rt_comm_%s(io->%s_group, %s, %s, (const int64_t[]){", ir_op_info[n->op].name,
            group_of(n->ia[0]), x, out);
    for (int64_t r = 0; r < n->ia[1]; r++)
      fprintf(f, "%s%" PRId64, r ? ", " : "", ir_numel(piece));
    fprintf(f, "}));\n");
    return;
  }
  case IR_OP_FLAT_SHARD: /* ZeRO-1: this rank's piece, zero-padded */
    fprintf(f, "  CHECK(rt_comm_flat_piece(io->%s_group, %s, %" PRId64 ", %s, %" PRId64 "));\n",
            group_of(n->ia[0]), x, ir_numel(in[0]), out, ir_numel(n));
    return;
  case IR_OP_REPLICATE: case IR_OP_LOCAL_SLICE:
    emit_dim_collective(e, n, x, out);
    return;
  case IR_OP_GROUP_COPY: /* identity forward; its gradient is the all-reduce */
    if (cg_runtime_view_note(f, e->kp, e->bp, n->id)) return;
    fprintf(f, "  memcpy(%s, %s, %" PRId64 " * sizeof(float));\n", out, x, ir_numel(n));
    return;
  default:
    fail(e, "no runtime routine for %s", ir_op_info[n->op].name);
  }
}

/* Rows per task: at least ~16K elements of work, so small kernels run on
 * one thread instead of paying for a wake-up. */
static int64_t grain(const IrModule *m, const CgKernel *k) {
  int64_t rows = kir_kernel_rows(k->k);
  int64_t work = ir_numel(m->nodes[k->root]);
  int64_t per_row = rows ? (work + rows - 1) / rows : 1;
  if (per_row < 1) per_row = 1;
  int64_t g = 16384 / per_row;
  return g < 1 ? 1 : g;
}

/* The name of the compiled code kernel i runs. */
static const char *code_name(const Emit *e, int i) {
  return e->kp->kernels[e->canon ? e->canon[i] : i].k->name;
}

int cg_view_note(FILE *out, const CgKernelPlan *kp, const BufPlan *bp, int index) {
  if (!cg_kernel_is_view(kp, bp, index)) return 0;
  int r = kp->kernels[index].root;
  if (bp->part_of && bp->part_of[r] == r)
    fprintf(out, "  /* %%%d is assembled: its parts were written in its bytes */\n", r);
  else if (kp->onto && r > 0 && kp->onto[r - 1] == kp->view_of[r]) /* (codegen/grad_onto.h) */
    fprintf(out, "  /* %%%d is written over %%%d, onto whose bytes %%%d's call added "
                 "itself */\n", r, kp->view_of[r], r - 1);
  else if (kp->kernels[index].range_view)
    fprintf(out, "  /* a view: %%%d is %%%d's elements from %" PRId64 " on, whose bytes already "
                 "hold it */\n", r, kp->view_of[r],
            (bp->offset[r] - bp->offset[kp->view_of[r]]) / 4);
  else
    fprintf(out, "  /* a view: %%%d is written over %%%d, whose bytes already hold it */\n", r,
            kp->view_of[r]);
  return 1;
}

static void emit_kernel_call(Emit *e, int index) {
  const CgKernel *k = &e->kp->kernels[index];
  char b[96];
  if (cg_view_note(e->out, e->kp, e->bp, index)) return;
  fprintf(e->out, "  {\n    void *a[] = {");
  for (int i = 0; i < k->nargs; i++) {
    int a = k->arg_node[i];
    if (a < 0) snprintf(b, sizeof b, "F(%" PRId64 ")", e->temp_off[CG_ARG_TEMP(a)]);
    fprintf(e->out, "%s%s", i ? ", " : "", a < 0 ? b : buf(e, e->m->nodes[a], b, sizeof b));
  }
  fprintf(e->out, "};\n    rt_parallel_for(%" PRId64 ", %" PRId64 ", run_%s, a);\n  }\n",
          kir_kernel_rows(k->k), grain(e->m, k), code_name(e, index));
}

/* Thunks adapt a kernel to rt_parallel_for's (ctx, begin, end). */
static void emit_thunks(Emit *e) {
  for (int i = 0; i < e->kp->nkernels; i++) {
    const CgKernel *k = &e->kp->kernels[i];
    if (e->canon && e->canon[i] != i) continue; /* runs another kernel's code */
    int used = 0;
    for (int j = i; j < e->kp->nkernels && !used; j++)
      used = (e->canon ? e->canon[j] : j) == i && kernel_runs(e, j) &&
             !cg_kernel_is_view(e->kp, e->bp, j);
    if (!used) continue;
    fprintf(e->out, "static void run_%s(void *c, int64_t b, int64_t e) {\n  void **a = c;\n  %s(",
            k->k->name, k->k->name);
    for (int j = 0; j < k->nargs; j++) fprintf(e->out, "a[%d], ", j);
    fprintf(e->out, "b, e);\n}\n");
  }
  if (e->kp->nkernels) fputc('\n', e->out);
}

static int state_param(const Emit *e, const IrNode *st);

static void emit_tables(Emit *e) {
  const IrModule *m = e->m;
  FILE *f = e->out;
  fprintf(f, "/* Parameters: one buffer, offsets in floats. */\nstatic const RtParamDesc params[] = {\n");
  int np = 0, ns = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_PARAM) continue;
    fprintf(f, "  {");
    put_str(f, n->name);
    fprintf(f, ", %d, {", n->rank);
    for (int d = 0; d < n->rank; d++) fprintf(f, "%s%" PRId64, d ? ", " : "", n->shape[d]);
    static const char *const init[] = {"RT_INIT_NORMAL", "RT_INIT_ZEROS", "RT_INIT_ONES"};
    char fl[48];
    int tps = n->shard_degree > 1 || ir_param_padded(n); /* padded at tp 1: global V */
    int sharded = tps || n->ep_degree > 1;
    fprintf(f, "}, %" PRId64 ", %" PRId64 ", %s, %s,\n   {", e->lp->offset[i], ir_numel(n),
            init[n->init], flit(fl, sizeof fl, n->init == IR_INIT_NORMAL ? n->init_std : 0.0));
    for (int d = 0; d < n->rank; d++)
      fprintf(f, "%s%" PRId64, d ? ", " : "", sharded ? n->global_shape[d] : n->shape[d]);
    /* ep: the experts (dimension 0) split over the ep group (0: not
     * expert-parallel); shard_dim then the tp split of each expert, or 0
     * when they are whole over tp (runtime/rt_model.h) */
    int ep = n->shard == IR_SHARD_EXPERT && n->ep_degree > 1 ? n->ep_degree : 0;
    fprintf(f, "}, %d, %d, %d},%s\n", tps ? n->shard_dim : ep ? 0 : -1,
            tps && n->shard_blocks > 1 ? n->shard_blocks : 1, ep,
            ep && tps ? " /* experts over the ep group, each over tp */"
            : ep      ? " /* experts over the ep group */"
                      : "");
    e->param_index[i] = np;
    np++;
  }
  if (!np) fprintf(f, "  {0}\n");
  fprintf(f, "};\n\n/* Optimizer state: one buffer, zero at the start. */\n"
             "static const RtStateDesc state[] = {\n");
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op != IR_OP_STATE) continue;
    int param = state_param(e, n);
    if (param < 0) fail(e, "optimizer state '%s' has no parameter", n->name);
    fprintf(f, "  {");
    put_str(f, n->name);
    fprintf(f, ", %" PRId64 ", %" PRId64 ", %d},\n", e->lp->offset[i], ir_numel(n), param);
    ns++;
  }
  if (!ns) fprintf(f, "  {0}\n");
  fprintf(f, "};\n\n");
}

/* The parameter a STATE node belongs to: its name is "<param>.<key>". */
static int state_param(const Emit *e, const IrNode *st) {
  size_t len = strlen(st->name);
  for (int i = 0; i < e->m->nnodes; i++) {
    const IrNode *p = e->m->nodes[i];
    size_t k = p->op == IR_OP_PARAM ? strlen(p->name) : 0;
    if (k && k < len && st->name[k] == '.' && !strncmp(st->name, p->name, k) &&
        !strchr(st->name + k + 1, '.'))
      return e->param_index[i];
  }
  return -1;
}

static double setting(const IrSetting *s, int n, const char *name, double def) {
  const IrSetting *x = ir_setting(s, n, name);
  return x ? (x->is_float ? x->f : (double)x->i) : def;
}

/* The trainer's MoE statistics (runtime/rt_model.h RtMoeDesc): one entry per
 * layer (-1: outside the repeat, then 0, 1, ...) holding a forward dispatch,
 * experts + 2 floats each, in layer order; a layer's dispatches of its first
 * one's expert count add into it (others are not counted).  Returns the
 * offset of layer's entry (and its experts), -1 when the layer has none;
 * layer MOE_TOTAL: the total floats. */
#define MOE_TOTAL INT_MIN
static int64_t moe_offset(const IrModule *m, int layer, int *experts) {
  int64_t off = 0;
  for (int l = -1; l < m->nlayers; l++) {
    int E = 0;
    for (int i = 0; i < m->nnodes && !E; i++) {
      const IrNode *n = m->nodes[i];
      if (n->op == IR_OP_DISPATCH && n->phase == IR_PHASE_FWD && n->layer == l) E = (int)n->ia[0];
    }
    if (!E) continue;
    if (l == layer) {
      if (experts) *experts = E;
      return off;
    }
    off += E + 3;
  }
  return layer == MOE_TOTAL ? off : -1;
}

/* 1 if the auxiliary loss term n is a router z-loss (prelude.dsl's moe:
 * logsumexp(logits)^2): its inputs, up the graph, hold no onehot, which the
 * load-balancing term counts the choices with. */
static int is_z_term(const IrModule *m, const IrNode *n) {
  unsigned char *seen = calloc((size_t)m->nnodes + 1, 1);
  const IrNode **stack = malloc(sizeof *stack * ((size_t)m->nnodes + 1));
  int sp = 0, onehot = 0;
  if (!seen || !stack) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  stack[sp++] = n, seen[n->id] = 1;
  while (sp && !onehot) {
    const IrNode *x = stack[--sp];
    if (x->op == IR_OP_ONEHOT) onehot = 1;
    for (int k = 0; k < x->ninputs; k++)
      if (!seen[x->inputs[k]->id]) seen[x->inputs[k]->id] = 1, stack[sp++] = x->inputs[k];
  }
  free(seen), free(stack);
  return !onehot;
}

/* 1 if layer l has a router z-loss term. */
static int layer_has_z(const IrModule *m, int l) {
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->layer == l && n->phase == IR_PHASE_FWD && ir_is_aux_term(m, n) && is_z_term(m, n))
      return 1;
  }
  return 0;
}

/* After the call computing n (CPU trainer only): a forward dispatch's kept
 * choices, or an auxiliary loss term (load balancing or router z-loss), added
 * to the step's MoE statistics. */
static void emit_moe_stat(Emit *e, const IrNode *n) {
  if (e->hooks) return; /* the GPU trainer's stage functions (cg_emit_pipe): none */
  int E = 0;
  char b[96];
  if (e->hooks || n->phase != IR_PHASE_FWD) return;
  int64_t off = moe_offset(e->m, n->layer, &E);
  if (off < 0) return;
  if (n->op == IR_OP_DISPATCH && n->ia[0] == E) {
    const IrNode *x = n->inputs[0], *idx = n->inputs[1];
    fprintf(e->out, "  if (io->moe) CHECK(rt_route_stats(io->moe + %" PRId64 ", %s, %" PRId64
            ", %" PRId64 ", %d, %" PRId64 ")); /* layer %d: kept choices per expert */\n",
            off, buf(e, idx, b, sizeof b), dim(x, 0), dim(idx, 1), E, n->ia[1], n->layer);
  } else if (ir_is_aux_term(e->m, n)) {
    int z = is_z_term(e->m, n);
    fprintf(e->out, "  if (io->moe) io->moe[%" PRId64 "] += *%s; /* layer %d: %s */\n",
            off + E + 1 + z, buf(e, n, b, sizeof b), n->layer, z ? "router z-loss" : "aux loss");
  }
}

/* stats: the CPU trainer, which records the MoE statistics (emit_moe_stat). */
static void emit_moe_desc(Emit *e, int stats) {
  const IrModule *m = e->m;
  if (!stats || !moe_offset(m, MOE_TOTAL, NULL)) return;
  fprintf(e->out, "/* MoE layers' routing statistics in io->moe: {layer, experts, offset,\n"
                  " * router z-loss} */\n"
                  "static const RtMoeDesc moe_layers[] = {");
  for (int l = -1, k = 0; l < m->nlayers; l++) {
    int E = 0;
    int64_t off = moe_offset(m, l, &E);
    if (off >= 0)
      fprintf(e->out, "%s{%d, %d, %" PRId64 ", %d}", k++ ? ", " : "", l, E, off,
              layer_has_z(m, l));
  }
  fprintf(e->out, "};\n\n");
}

static void emit_desc(Emit *e, const CgHostInfo *info, int stats) {
  const IrModule *m = e->m;
  FILE *f = e->out;
  int np = 0, ns = 0;
  for (int i = 0; i < m->nnodes; i++) {
    np += m->nodes[i]->op == IR_OP_PARAM;
    ns += m->nodes[i]->op == IR_OP_STATE;
  }
  const IrNode *tok = cg_tokens_input(m);
  int64_t batch = tok ? tok->shape[0] : 0, seq = tok ? tok->shape[1] : 0, vocab = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op == IR_OP_CROSS_ENTROPY && n->phase == IR_PHASE_FWD) vocab = dim(n->inputs[0], -1);
    if (n->op == IR_OP_VOCAB_CROSS_ENTROPY && n->phase == IR_PHASE_FWD)
      vocab = n->ia[2]; /* the whole vocabulary, padding left out */
  }
  fprintf(f, "static const char *const config_names[] = {");
  for (int i = 0; i < m->nconfig; i++) {
    fprintf(f, "%s", i ? ", " : "");
    put_str(f, m->config[i].name);
  }
  fprintf(f, "%s};\nstatic const double config_values[] = {", m->nconfig ? "" : "NULL");
  for (int i = 0; i < m->nconfig; i++)
    fprintf(f, "%s%.17g", i ? ", " : "", m->config[i].sym ? 0.0 : m->config[i].f);
  fprintf(f, "%s};\n\n", m->nconfig ? "" : "0");
  const IrSetting *tr = m->train, *op = m->optim, *sc = m->sched;
  int ntr = m->ntrain, nop = m->noptim, nsc = m->nsched;
  emit_moe_desc(e, stats);
  fprintf(f, "static const RtModelDesc model = {\n");
  fprintf(f, "    .name = ");
  put_str(f, m->name);
  fprintf(f, ",\n    .source = ");
  put_str(f, base_name(info->source));
  int dp = m->mesh_dp > 1 ? m->mesh_dp : 1;
  int mbs = info->pipe ? info->pipe->microbatches : 1; /* the module is one microbatch */
  fprintf(f, ",\n    .vocab = %" PRId64 ", .batch = %" PRId64 ", .seq = %" PRId64 ",\n", vocab,
          batch * dp * mbs, seq);
  if (stats && moe_offset(m, MOE_TOTAL, NULL) > 0) {
    int k = 0;
    for (int l = -1; l < m->nlayers; l++) k += moe_offset(m, l, NULL) >= 0;
    fprintf(f, "    .nmoe = %d, .moe = moe_layers, .moe_numel = %" PRId64 ",\n", k,
            moe_offset(m, MOE_TOTAL, NULL));
  }
  if (mbs > 1)
    fprintf(f, "    .microbatches = %d, /* microbatch mb: the global rows [mb B/M, (mb+1) B/M) */\n",
            mbs);
  if (m->mesh_ep > 1) fprintf(f, "    .ep = %d, /* experts over ep of the dp ranks */\n", m->mesh_ep);
  fprintf(f, "    .tp = %d, .dp = %d, .zero = %d,\n", m->mesh_tp > 1 ? m->mesh_tp : 1, dp,
          m->mesh_zero > 1 ? m->mesh_zero : 0);
  if (info->pipe)
    fprintf(f, "    .pp = %d, /* each stage holds its own parameters and state */\n"
               "    .pp_param_offset = pp_param_offset, .pp_params_numel = pp_param_numel,\n"
               "    .pp_state_offset = pp_state_offset, .pp_state_numel = pp_state_numel,\n"
               "    .pp_arena_bytes = pp_arena_bytes,\n",
            info->pipe->nstages);
  fprintf(f, "    .nparams = %d, .params = params, .params_numel = %" PRId64 ",\n", np,
          e->lp->params_numel);
  fprintf(f, "    .nstate = %d, .state = state, .state_numel = %" PRId64 ",\n", ns,
          e->lp->state_numel);
  fprintf(f, "    .arena_bytes = ARENA_BYTES,\n    .flops_per_step = %.17g,\n", info->flops_per_step);
  fprintf(f, "    .steps = %" PRId64 ", .lr = %.17g, .clip = %.17g,\n",
          (int64_t)setting(tr, ntr, "steps", 0), setting(tr, ntr, "lr", 0), setting(tr, ntr, "clip", 0));
  fprintf(f, "    .optimizer = \"%s\", .beta1 = %.17g, .beta2 = %.17g, .eps = %.17g,\n",
          m->optimizer ? m->optimizer : "adamw", setting(op, nop, "beta1", 0.9),
          setting(op, nop, "beta2", 0.999), setting(op, nop, "eps", 1e-8));
  fprintf(f, "    .weight_decay = %.17g, .momentum = %.17g,\n", setting(op, nop, "wd", 0),
          setting(op, nop, "momentum", 0));
  fprintf(f, "    .schedule = \"%s\", .warmup = %" PRId64 ", .min_lr = %.17g,\n",
          m->schedule ? m->schedule : "constant", (int64_t)setting(sc, nsc, "warmup", 0),
          setting(sc, nsc, "min_lr", 0));
  fprintf(f, "    .seed = %" PRIu64 "u,\n", (uint64_t)setting(tr, ntr, "seed", 1337));
  fprintf(f, "    .nconfig = %d, .config_names = config_names, .config_values = config_values,\n",
          m->nconfig);
  if (info->desc_extra) fputs(info->desc_extra, f); /* host_cuda.c's fields */
  fprintf(f, "    .step = step,\n};\n\n");
  fprintf(f, "int main(int argc, char **argv) { return rt_train_main(argc, argv, &model); }\n");
}

/* The end of the step for the updates (of the leaves stage holds; stage -1:
 * every one): a copy of each value into its leaf, but for the values their
 * kernels stored into the leaf in place (cg_kernels.h, In-place updates),
 * which only a comment counts.  Through the hooks when the GPU trainer's. */
static void emit_update_copies(Emit *e, int stage) {
  const IrModule *m = e->m;
  int total = 0, inplace = 0;
  for (int i = 0; i < m->nupdates; i++) {
    const IrUpdate *u = &m->updates[i];
    if (stage >= 0 && !(e->pipe->holders[u->leaf->id] >> stage & 1)) continue;
    total++;
    inplace += e->kp->inplace_of[u->value->id] == u->leaf->id;
  }
  if (inplace)
    fprintf(e->out, "  /* %d of %d updates were stored into their parameter or state by their "
                    "kernels (in place)%s */\n", inplace, total,
            inplace < total ? "; the others are copied" : "");
  for (int i = 0; i < m->nupdates; i++) {
    const IrUpdate *u = &m->updates[i];
    char dst[96], src[96];
    if (stage >= 0 && !(e->pipe->holders[u->leaf->id] >> stage & 1)) continue;
    if (e->kp->inplace_of[u->value->id] == u->leaf->id) continue;
    if (e->hooks)
      e->hooks->copy(e->hooks->ctx, buf(e, u->leaf, dst, sizeof dst),
                     buf(e, u->value, src, sizeof src), ir_numel(u->leaf), u->leaf->name);
    else
      fprintf(e->out, "  memcpy(%s, %s, %" PRId64 " * sizeof(float)); /* %s */\n",
              buf(e, u->leaf, dst, sizeof dst), buf(e, u->value, src, sizeof src),
              ir_numel(u->leaf), u->leaf->name);
  }
}

/* ---- pipelined trainers (info->pipe): stage programs and their tables ---- */

#define ROUND64(x) (((x) + 63) / 64 * 64)

/* the stage temporary t's kernels run on, or -1: not one stage's */
static int temp_stage(const PpProgram *pp, const CgKernelPlan *kp, int t) {
  int cw = pp->chunk[kp->kernels[kp->temps[t].writer].root];
  int cr = pp->chunk[kp->kernels[kp->temps[t].reader].root];
  return cw >= 0 && cr >= 0 && cw % pp->nstages == cr % pp->nstages ? cw % pp->nstages : -1;
}

/* The invariant the trainers rely on, checked from the readers' side (the
 * nodes each stage runs, not the plan's arenas): every buffer a node of a
 * chunk writes or reads ends inside the slot of the chunk's stage (an
 * optimizer node's: of each stage holding its parameter, or every stage),
 * and a stage's temporaries lie after all of them, inside the slot.  A
 * failure is parc's bug: "internal error", exit 3. */
static void check_slots(const IrModule *m, const PpProgram *pp, const CgKernelPlan *kp,
                        const BufPlan *bp, const int64_t *slot_bytes, const int64_t *toff) {
  int64_t need[PP_MAX_STAGES] = {0};
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *x = m->nodes[i];
    int c = pp->chunk[i], own = pp->opt_owner[i];
    uint64_t on = c >= 0 ? (uint64_t)1 << (c % pp->nstages)
                  : c != PP_NODE_OPT ? 0
                  : own >= 0 ? pp->holders[own] : ~(uint64_t)0;
    for (int j = -1; on && j < x->ninputs; j++) {
      int v = j < 0 ? i : x->inputs[j]->id;
      for (int s = 0; s < pp->nstages && bp->offset[v] >= 0; s++)
        if (on >> s & 1 && bp->offset[v] + bp->size[v] > need[s])
          need[s] = bp->offset[v] + bp->size[v];
    }
  }
  for (int s = 0; s < pp->nstages; s++)
    if (need[s] > slot_bytes[s]) {
      fprintf(stderr, "parc: internal error: stage %d reads buffers up to byte %" PRId64
              ", past its slot of %" PRId64 "\n", s, need[s], slot_bytes[s]);
      exit(3);
    }
  for (int t = 0; t < kp->ntemps; t++) {
    int s = temp_stage(pp, kp, t);
    for (int k = 0; k < pp->nstages; k++)
      if ((s < 0 || k == s) &&
          (toff[t] < need[k] || toff[t] + temp_bytes(kp, t) > slot_bytes[k])) {
        fprintf(stderr, "parc: internal error: temporary %d at byte %" PRId64 " overlaps stage "
                "%d's buffers (to %" PRId64 ") or its slot's end (%" PRId64 ")\n", t, toff[t],
                k, need[k], slot_bytes[k]);
        exit(3);
      }
  }
}

void cg_pipe_slot_bytes(const IrModule *m, const PpProgram *pp, const CgKernelPlan *kp,
                        const BufPlan *bp, int64_t *slot_bytes, int64_t *temp_off) {
  int P = pp->nstages, n = m->nnodes;
  uint64_t *gw = malloc(sizeof *gw * ((size_t)n + 1));
  int64_t *toff = malloc(sizeof *toff * ((size_t)kp->ntemps + 1));
  if (!gw || !toff) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  bufplan_group_where(m, bp, gw);
  for (int s = 0; s < P; s++) slot_bytes[s] = 0;
  for (int i = 0; i < n; i++)
    for (int s = 0; s < P && bp->offset[i] >= 0; s++)
      if (gw[i] >> s & 1 && bp->offset[i] + bp->size[i] > slot_bytes[s])
        slot_bytes[s] = bp->offset[i] + bp->size[i];
  free(gw);
  for (int t = 0; t < kp->ntemps; t++) {
    int s = temp_stage(pp, kp, t);
    if (s >= 0) { /* one stage's */
      toff[t] = slot_bytes[s];
      slot_bytes[s] += temp_bytes(kp, t);
      continue;
    }
    int64_t end = 0; /* after every stage's */
    for (int k = 0; k < P; k++)
      if (slot_bytes[k] > end) end = slot_bytes[k];
    toff[t] = end;
    for (int k = 0; k < P; k++) slot_bytes[k] = end + temp_bytes(kp, t);
  }
  for (int s = 0; s < P; s++) slot_bytes[s] = ROUND64(slot_bytes[s]);
  check_slots(m, pp, kp, bp, slot_bytes, toff);
  for (int t = 0; t < kp->ntemps && temp_off; t++) temp_off[t] = toff[t];
  free(toff);
}

int64_t cg_pipe_arena_bytes(const PpProgram *pp, const int64_t *slot_bytes, int s) {
  if (s < 0) { /* the largest */
    int64_t most = 0;
    for (int k = 0; k < pp->nstages; k++) {
      int64_t b = cg_pipe_arena_bytes(pp, slot_bytes, k);
      if (b > most) most = b;
    }
    return most;
  }
  /* the accumulator has room for the largest stage's parameters (rt_pipe.h) */
  int64_t most = 0;
  for (int k = 0; k < pp->nstages; k++)
    if (pp->stage_params_numel[k] > most) most = pp->stage_params_numel[k];
  int64_t slots = (int64_t)pp->stage_slots[s] * ROUND64(slot_bytes[s]);
  int64_t scratch = ROUND64(pp->zero_bucket_max * 4); /* over the slots when they hold it */
  return slots + ROUND64(most * 4) + 2 * ROUND64(pp->shared_numel_max * 4) +
         (scratch > slots ? scratch : 0);
}

int64_t cg_trainer_arena_bytes(const IrModule *m, const PpProgram *pp, const CgKernelPlan *kp,
                               const BufPlan *bp) {
  if (!pp) return cg_arena_bytes(kp, bp, NULL);
  int64_t slot[PP_MAX_STAGES];
  cg_pipe_slot_bytes(m, pp, kp, bp, slot, NULL);
  return cg_pipe_arena_bytes(pp, slot, -1);
}

void cg_pipe_grads_in_acc(const IrModule *m, const PpProgram *pp, unsigned char *via_acc,
                          unsigned char *opt) {
  for (int i = 0; i < m->nnodes; i++) {
    via_acc[i] = 0;
    opt[i] = pp->chunk[i] == PP_NODE_OPT;
  }
  for (int i = 0; i < m->nnodes; i++) /* (cg_grad_of's nodes) */
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad) via_acc[m->nodes[i]->grad->id] = 1;
}

int *cg_pipe_acc_into(IrModule *m, const PpProgram *pp, const unsigned char *keep,
                      const unsigned char *via_acc) {
  int n = m->nnodes;
  int *d = arena_alloc(&m->arena, sizeof(int) * ((size_t)n + 1));
  for (int i = 0; i < n; i++) {
    IrOp op = m->nodes[i]->op;
    int adds = op == IR_OP_MATMUL || op == IR_OP_MATMUL_TA || op == IR_OP_EMBEDDING_GRAD ||
               op == IR_OP_VOCAB_EMBEDDING_GRAD; /* (RT_MM_ACCUMULATE, _acc) */
    d[i] = pp->chunk[i] >= 0 && adds && !keep[i] ? pp->grad_param[i] : -1;
  }
  /* read by anything that runs, other than the optimizer from G: a buffer of its own */
  for (int r = 0; r < n; r++)
    for (int k = 0; k < m->nodes[r]->ninputs && pp->chunk[r] != PP_NODE_SKIP; k++) {
      int j = m->nodes[r]->inputs[k]->id;
      if (!(via_acc[j] && pp->chunk[r] == PP_NODE_OPT)) d[j] = -1;
    }
  return d;
}

/* A parameter-gradient term n into the accumulator, once n's kernel (or
 * runtime op) has run: a term is read by its skipped gradient sum, of
 * another colour (cg_pipe_colours), so it is always materialised, unless its
 * GEMM added it there itself (acc_into). */
static void acc_grad(Emit *e, const PpProgram *pp, const IrNode *n) {
  int p = pp->grad_param[n->id]; /* n is a term of p's gradient */
  char b[96];
  if (p < 0 || acc_into(e->kp, n) >= 0) return;
  if (!e->kp->materialize[n->id]) fail(e, "gradient term %%%d has no buffer", n->id);
  fprintf(e->out, "  ACC_GRAD(%" PRId64 ", %s, %" PRId64 "); /* %s */\n", e->lp->offset[p],
          buf(e, n, b, sizeof b), ir_numel(n), e->m->nodes[p]->name);
}

/* Nodes of two colours never share a kernel (cg_plan_kernels): the stage
 * functions below run the kernels of one chunk and phase, or of one
 * optimizer part, apart from the others'.  Colours: chunk c, phase ph;
 * the skipped gradient sums; leaves; an optimizer node's (parameter,
 * opt_pub, phase), an opt_pub 1 node one of its own (zeroed or summed over
 * pp alone). */
void cg_pipe_colours(const IrModule *m, const PpProgram *pp, int *colour) {
  int ph = IR_PHASE_COUNT, k = pp->nchunks * ph;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    int c = pp->chunk[i], owner = pp->opt_owner[i];
    if (c >= 0) colour[i] = c * ph + (int)n->phase;
    else if (c == PP_NODE_SKIP) colour[i] = k;
    else if (c == PP_NODE_LEAF) colour[i] = k + 1;
    else if (pp->opt_pub[i] == 1) colour[i] = k + 2 + ph * 2 * (m->nnodes + 1) + i;
    else colour[i] = k + 2 + ph * (2 * (owner + 1) + (pp->opt_pub[i] == 2)) + (int)n->phase;
  }
}

/* 1 if a node of phase x runs in a chunk's function of phase ph: a schedule
 * that does not split W runs W(c) in B(c)'s function, in node order (the
 * weight gradients' function is empty then; passes/pp_split.c). */
static int in_phase(const PpProgram *pp, IrPhase x, IrPhase ph) {
  if (!pp->split_w && ph == IR_PHASE_B) return x == IR_PHASE_B || x == IR_PHASE_W;
  if (!pp->split_w && ph == IR_PHASE_W) return 0;
  return x == ph;
}

/* The nodes of chunk c in phase ph, in node order (a kernel where its root
 * is), each term of a parameter's gradient accumulated once computed
 * (acc_grad).  stage >= 0 (the optimizer, c == PP_NODE_OPT): stage's part
 * of it (pp_split.c's head comment): an owned node where the stage holds its parameter, a shared one
 * always; an opt_pub node on its parameter's lowest holder (1: set to zero
 * on the others; 2: skipped there), and the opt_pub 1 values not yet summed
 * over pp summed (one all-reduce) right before the first shared node that
 * reads one of them. */
static void emit_group(Emit *e, const PpProgram *pp, int c, IrPhase ph, int stage) {
  const IrModule *m = e->m;
  const CgKernelPlan *kp = e->kp;
  int next = 0, npend = 0;
  int *pend = stage >= 0 ? malloc(sizeof(int) * ((size_t)m->nnodes + 1)) : NULL;
  if (stage >= 0 && !pend) fail(e, "out of memory");
  for (int i = 0; i < m->nnodes && !e->failed; i++) {
    const IrNode *n = m->nodes[i];
    int mine = pp->chunk[i] == c && in_phase(pp, n->phase, ph);
    int runtime = !(ir_op_info[n->op].flags & IR_F_LEAF) && kp->kernel_of[i] < 0;
    for (; next < kp->nkernels && kp->kernels[next].root < i; next++) {}
    if (!mine) continue;
    if (stage >= 0) {
      int p = pp->opt_owner[i];
      uint64_t h = p >= 0 ? pp->holders[p] : 0;
      char b[96];
      int held = p >= 0 && (h >> stage & 1);
      int lowest = held && !(h & ((UINT64_C(1) << stage) - 1));
      if (pp->opt_pub[i] == 2 && !lowest) continue; /* feeds a value counted elsewhere */
      if (pp->opt_pub[i] == 1 && !lowest) {
        comment(e, n, "  ");
        if (e->hooks)
          e->hooks->zero(e->hooks->ctx, buf(e, n, b, sizeof b),
                         held ? "a lower stage" : "the stage holding", m->nodes[p]->name);
        else
          fprintf(e->out, "  *%s = 0.0f; /* %s counts %s */\n", buf(e, n, b, sizeof b),
                  held ? "a lower stage" : "the stage holding", m->nodes[p]->name);
        pend[npend++] = i;
        continue;
      }
      if (p >= 0 && !held) continue; /* another stage's parameter */
      int reads = 0;
      for (int k = 0; p < 0 && k < n->ninputs; k++)
        reads |= pp->opt_pub[n->inputs[k]->id] == 1;
      if (reads && npend && e->hooks) { /* the same point and list on every stage */
        e->hooks->pp_sum(e->hooks->ctx, pend, npend);
        npend = 0;
      }
      if (reads && npend) { /* every stage reaches this point with the same list */
        fprintf(e->out, "  { /* the per-parameter values above, summed over the stages */\n"
                        "    float v_[%d];\n", npend);
        for (int k = 0; k < npend; k++)
          fprintf(e->out, "    v_[%d] = *%s;\n", k, buf(e, m->nodes[pend[k]], b, sizeof b));
        fprintf(e->out, "    if (io->pp_group) CHECK(rt_comm_all_reduce(io->pp_group, v_, v_, "
                        "%d));\n", npend);
        for (int k = 0; k < npend; k++)
          fprintf(e->out, "    *%s = v_[%d];\n", buf(e, m->nodes[pend[k]], b, sizeof b), k);
        fprintf(e->out, "  }\n");
        npend = 0;
      }
      if (pp->opt_pub[i] == 1) pend[npend++] = i;
    }
    if (runtime) {
      comment(e, n, "  ");
      if (e->hooks) e->hooks->runtime(e->hooks->ctx, e->lp, n);
      else emit_runtime(e, n);
      emit_moe_stat(e, n);
    }
    for (; next < kp->nkernels && kp->kernels[next].root == i; next++) {
      const CgKernel *kk = &kp->kernels[next];
      for (int j = 0; j < kk->nnodes; j++) {
        const IrNode *x = m->nodes[kk->nodes[j]];
        if (pp->chunk[x->id] != c || !in_phase(pp, x->phase, ph))
          fail(e, "kernel %d mixes pipeline chunks or phases", next);
        comment(e, x, "  ");
      }
      if (!kk->nnodes) fprintf(e->out, "  /* statistics for a later weight gradient */\n");
      int deferred = 0; /* its GEMM adds its gradient terms (CgPipeHooks.kernel) */
      if (e->hooks) deferred = e->hooks->kernel(e->hooks->ctx, e->lp, next);
      else emit_kernel_call(e, next);
      for (int j = 0; j < kk->nnodes; j++) emit_moe_stat(e, m->nodes[kk->nodes[j]]);
      for (int j = 0; j < kk->nnodes && stage < 0 && !deferred; j++)
        acc_grad(e, pp, m->nodes[kk->nodes[j]]);
    }
    if (runtime && stage < 0) acc_grad(e, pp, n);
  }
  if (npend) fail(e, "optimizer values summed over the stages but read by nothing shared");
  free(pend);
}

static void emit_fn_head(Emit *e, const char *name, const char *what, int stage) {
  if (e->hooks) {
    e->hooks->fn_head(e->hooks->ctx, name, what, stage, e->grads_in_acc);
    return;
  }
  fprintf(e->out, "/* %s */\nstatic int %s(RtStepIO *io) {\n"
                  "  char *A = io->arena;\n  float *P = io->params, *S = io->state, *G = io->gacc;\n"
                  "  float lr = io->lr, t = io->step;\n"
                  "  (void)A, (void)P, (void)S, (void)G, (void)lr, (void)t;\n", what, name);
}

/* A boundary value's 4-byte words (RtPipeValue.count): its elements and an
 * aux part's (sdpa: the lse too); a narrow value's elements (the GPU plan's
 * bf16 ones, bufplan.h) 2 bytes each, in pairs, the last word's spare half
 * inside the value's buffer (sizes are multiples of BUFPLAN_ALIGN). */
static int64_t value_words(const BufPlan *bp, const IrNode *v) {
  if (!bp->narrow || !bp->narrow[v->id]) return ir_buf_numel(v);
  return (2 * ir_numel(v) + 4 * ir_aux_numel(v) + 3) / 4;
}

static void emit_values(Emit *e, const char *name, int c, const int *ids, int n) {
  fprintf(e->out, "static const RtPipeValue %s_%d[] = {", name, c);
  for (int i = 0; i < n; i++) {
    const IrNode *v = e->m->nodes[ids[i]];
    char ty[160];
    int narrow = e->bp->narrow && e->bp->narrow[v->id];
    fprintf(e->out, "\n    {%" PRId64 ", %" PRId64 "}, /* %%%d : %s%s */", e->bp->offset[v->id],
            value_words(e->bp, v), v->id, ir_type_str(v, ty, sizeof ty),
            narrow ? ", bf16" : "");
    if (e->bp->offset[v->id] < 0) fail(e, "boundary value %%%d has no buffer", v->id);
  }
  fprintf(e->out, "%s};\n", n ? "\n" : "{0, 0}");
}

static void emit_pipe(Emit *e, const CgHostInfo *info, const int64_t *slot_bytes) {
  const PpProgram *pp = info->pipe;
  const IrModule *m = e->m;
  FILE *f = e->out;
  int C = pp->nchunks, P = pp->nstages;
  /* (a schedule that does not split W: bwd_c runs W(c) too, wgt_c nothing) */
  static const char *const titles[2][3] = {
      {"forward", "backward: input and weight gradients",
       "backward: nothing (bwd_%d ran its weight gradients)"},
      {"forward", "backward: input gradients", "backward: weight gradients"}};
  const char *const *title = titles[pp->split_w != 0];
  static const char *const fn[] = {"fwd", "bwd", "wgt"};
  if (!e->hooks)
    fprintf(f, "#define ACC_GRAD(off, g, n) \\\n"
               "  do { for (int64_t i_ = 0; i_ < (n); i_++) G[(off) + i_] += (g)[i_]; } while (0)\n\n");
  /* Stage s's functions address its own buffers (P, S, G): its leaf plan. */
  CgLeafPlan *slp = malloc(sizeof *slp * (size_t)P);
  if (!slp) {
    fail(e, "out of memory");
    return;
  }
  for (int s = 0; s < P; s++)
    slp[s] = (CgLeafPlan){pp->stage_offset[s], pp->stage_params_numel[s],
                          pp->stage_state_numel[s]};
  const CgLeafPlan *whole = e->lp;
  for (int c = 0; c < C; c++)
    for (int ph = IR_PHASE_FWD; ph <= IR_PHASE_W; ph++) {
      char name[32], what[224];
      snprintf(name, sizeof name, "%s_%d", fn[ph], c);
      char t[96];
      snprintf(t, sizeof t, title[ph], c);
      snprintf(what, sizeof what, "chunk %d (stage %d): %s of one microbatch", c, c % P, t);
      emit_fn_head(e, name, what, c % P);
      e->lp = &slp[c % P];
      emit_group(e, pp, c, (IrPhase)ph, -1);
      char b[96];
      if (ph == IR_PHASE_FWD && c == C - 1 && e->hooks) {
        char b2[96];
        e->hooks->loss(e->hooks->ctx, buf(e, m->loss, b, sizeof b),
                       m->ce_loss ? buf(e, m->ce_loss, b2, sizeof b2) : NULL);
      } else if (ph == IR_PHASE_FWD && c == C - 1) {
        fprintf(f, "  io->loss = *%s;\n", buf(e, m->loss, b, sizeof b));
        if (m->ce_loss) fprintf(f, "  io->ce_loss = *%s;\n", buf(e, m->ce_loss, b, sizeof b));
        else fprintf(f, "  io->ce_loss = io->loss;\n");
      }
      fprintf(f, "  return 0;\n}\n\n");
    }
  for (int s = 0; s < P; s++) {
    char name[32], what[320];
    snprintf(name, sizeof name, "optimizer_%d", s);
    snprintf(what, sizeof what, "stage %d, after the microbatches: clipping (the global norm "
             "over every stage) and the update of its parameters, reading their summed "
             "gradients from G", s);
    e->grads_in_acc = 1;
    emit_fn_head(e, name, what, s);
    e->lp = &slp[s];
    emit_group(e, pp, PP_NODE_OPT, IR_PHASE_OPT, s);
    char b[96];
    if (e->hooks)
      e->hooks->grad_norm(e->hooks->ctx, m->grad_norm ? buf(e, m->grad_norm, b, sizeof b) : NULL);
    else
      fprintf(f, "  io->grad_norm = %s%s;\n", m->grad_norm ? "*" : "0",
              m->grad_norm ? buf(e, m->grad_norm, b, sizeof b) : "");
    emit_update_copies(e, s);
    e->grads_in_acc = 0;
    fprintf(f, "  return 0;\n}\n\n");
  }
  e->lp = whole;

  /* the stages' buffers, for the harness (RtModelDesc.pp_*) and the step */
  int np = 0, ns = 0, nshared = 0;
  for (int i = 0; i < m->nnodes; i++) {
    np += m->nodes[i]->op == IR_OP_PARAM;
    ns += m->nodes[i]->op == IR_OP_STATE;
  }
  static const char *const what[2] = {"param", "state"};
  for (int k = 0; k < 2; k++) {
    IrOp op = k ? IR_OP_STATE : IR_OP_PARAM;
    fprintf(f, "/* Stage s's %s buffer: entry [s * n%s + i] is %s[i]'s offset there, -1 "
               "where the stage does not hold it. */\nstatic const int64_t pp_%s_offset[] = {",
            what[k], what[k], k ? "state" : "params", what[k]);
    int any = 0;
    for (int s = 0; s < P; s++) {
      fprintf(f, "\n   ");
      for (int i = 0; i < m->nnodes; i++)
        if (m->nodes[i]->op == op)
          fprintf(f, " %" PRId64 ",", pp->stage_offset[s][i]), any = 1;
    }
    fprintf(f, "%s};\nstatic const int64_t pp_%s_numel[] = {", any ? "" : "0", what[k]);
    for (int s = 0; s < P; s++)
      fprintf(f, "%s%" PRId64, s ? ", " : "",
              k ? pp->stage_state_numel[s] : pp->stage_params_numel[s]);
    fprintf(f, "};\n");
  }
  (void)np, (void)ns;
  fprintf(f, "/* Stage s's slot: where the values its arena holds end, then its "
             "kernels' temporaries. */\nstatic const int64_t pp_slot_bytes[] = {");
  for (int s = 0; s < P; s++) fprintf(f, "%s%" PRId64, s ? ", " : "", slot_bytes[s]);
  fprintf(f, "};\n");
  fprintf(f, "/* Stage s's arena: its slots of a microbatch each, the gradient accumulator "
             "and\n * its scratch (rt_pipe.h; ARENA_BYTES is the largest). */\n"
             "static const int64_t pp_arena_bytes[] = {");
  for (int s = 0; s < P; s++)
    fprintf(f, "%s%" PRId64, s ? ", " : "", cg_pipe_arena_bytes(pp, slot_bytes, s));
  fprintf(f, "};\n");
  fprintf(f, "/* Parameters held by several stages (the tied embedding): numel, then per "
             "stage its offset in that stage's accumulator, -1 where not held. */\n"
             "static const int64_t pp_shared[] = {");
  for (int i = 0; i < m->nnodes; i++) {
    uint64_t h = pp->holders[i];
    if (m->nodes[i]->op != IR_OP_PARAM || !(h & (h - 1))) continue;
    fprintf(f, "\n    %" PRId64 ",", ir_numel(m->nodes[i]));
    for (int s = 0; s < P; s++) fprintf(f, " %" PRId64 ",", pp->stage_offset[s][i]);
    fprintf(f, " /* %s */", m->nodes[i]->name);
    nshared++;
  }
  fprintf(f, "%s};\n", nshared ? "\n" : "0");
  int nexpert = 0; /* summed over ep_dp, not dp (rt_pipe_step) */
  fprintf(f, "/* Expert-parallel parameters (their gradients are summed over the ep_dp group): "
             "numel, then per stage its offset in that stage's accumulator, -1 where not "
             "held. */\nstatic const int64_t pp_expert[] = {");
  for (int i = 0; i < m->nnodes; i++) {
    if (!ep_sharded(m->nodes[i])) continue;
    fprintf(f, "\n    %" PRId64 ",", ir_numel(m->nodes[i]));
    for (int s = 0; s < P; s++) fprintf(f, " %" PRId64 ",", pp->stage_offset[s][i]);
    fprintf(f, " /* %s */", m->nodes[i]->name);
    nexpert++;
  }
  fprintf(f, "%s};\n\n", nexpert ? "\n" : "0");
  /* ZeRO-1: every parameter with a gradient, reduce-scattered over its group
   * in the buckets of passes/pp_zero.c (rt_pipe_step, and rt_cuda_pipe_step
   * for the GPU trainer) */
  int zero = m->mesh_zero > 1 && pp->zero_bucket, ngrads = 0;
  if (zero) {
    fprintf(f, "/* ZeRO-1: the parameters' gradients, reduce-scattered over their group in "
               "buckets (one collective each): numel, group (1 dp, 3 ep_dp), then per stage "
               "its offset in that stage's accumulator (-1 where not held), then per stage "
               "its bucket there (-1: none). */\nstatic const int64_t pp_grads[] = {");
    for (int i = 0; i < m->nnodes; i++) {
      const IrNode *p = m->nodes[i];
      if (p->op != IR_OP_PARAM || !p->grad) continue;
      fprintf(f, "\n    %" PRId64 ", %d,", ir_numel(p), ep_sharded(p) ? 3 : 1);
      for (int s = 0; s < P; s++) fprintf(f, " %" PRId64 ",", pp->stage_offset[s][i]);
      for (int s = 0; s < P; s++) fprintf(f, " %d,", pp->zero_bucket[s][i]);
      fprintf(f, " /* %s */", p->name);
      ngrads++;
    }
    fprintf(f, "%s};\n\n", ngrads ? "\n" : "0");
  }

  /* the schedule: one action list per stage */
  static const char *const kind[] = {"RT_PIPE_F", "RT_PIPE_B", "RT_PIPE_W", "RT_PIPE_SEND_ACT",
                                     "RT_PIPE_RECV_ACT", "RT_PIPE_SEND_GRAD", "RT_PIPE_RECV_GRAD"};
  const PpSchedule *sc = pp->sched;
  fprintf(f, "/* The %s schedule, %d microbatches: each stage's actions {kind, chunk, "
             "microbatch}. */\n", pp_schedule_name[sc->kind], sc->microbatches);
  for (int s = 0; s < P; s++) {
    fprintf(f, "static const RtPipeAction actions_%d[] = {", s);
    for (int i = 0; i < sc->nactions[s]; i++) {
      const PpAction *a = &sc->actions[s][i];
      fprintf(f, "%s{%s, %d, %d}", !i ? "\n    " : i % 4 ? ", " : ",\n    ", kind[a->kind],
              a->chunk, a->mb);
    }
    fprintf(f, "\n};\n");
  }
  fprintf(f, "static const RtPipeAction *const actions[] = {");
  for (int s = 0; s < P; s++) fprintf(f, "%sactions_%d", s ? ", " : "", s);
  fprintf(f, "};\nstatic const int nactions[] = {");
  for (int s = 0; s < P; s++) fprintf(f, "%s%d", s ? ", " : "", sc->nactions[s]);
  fprintf(f, "};\n\n/* Stage s's slot of microbatch mb: pipe_slot[s * %d + mb] (one slot a "
             "microbatch the stage\n * holds at once, from its first action there to its "
             "last). */\nstatic const int pipe_slot[] = {", pp->microbatches);
  for (int k = 0; k < P * pp->microbatches; k++)
    fprintf(f, "%s%d", !k ? "" : k % pp->microbatches ? ", " : ",\n    ", pp->slot[k]);
  fprintf(f, "};\n\n/* Boundary c: what chunk c sends to chunk c + 1 (act) and chunk c + 1 "
             "back to c (grad), {arena offset, elements}. */\n");
  for (int c = 0; c + 1 < C; c++) {
    emit_values(e, "act", c, pp->act[c], pp->nact[c]);
    emit_values(e, "grad", c, pp->grad[c], pp->ngrad[c]);
  }
  const char *lists[] = {"act", "grad"};
  for (int l = 0; l < 2; l++) {
    fprintf(f, "static const RtPipeValue *const %s[] = {", lists[l]);
    for (int c = 0; c + 1 < C; c++) fprintf(f, "%s%s_%d", c ? ", " : "", lists[l], c);
    fprintf(f, "%s};\nstatic const int n%s[] = {", C > 1 ? "" : "NULL", lists[l]);
    for (int c = 0; c + 1 < C; c++)
      fprintf(f, "%s%d", c ? ", " : "", l ? pp->ngrad[c] : pp->nact[c]);
    fprintf(f, "%s};\n", C > 1 ? "" : "0");
  }
  for (int ph = 0; ph < 3; ph++) {
    fprintf(f, "static const RtPipeFn %s[] = {", fn[ph]);
    for (int c = 0; c < C; c++) fprintf(f, "%s%s_%d", c ? ", " : "", fn[ph], c);
    fprintf(f, "};\n");
  }
  fprintf(f, "static const RtPipeFn optimizer[] = {");
  for (int s = 0; s < P; s++) fprintf(f, "%soptimizer_%d", s ? ", " : "", s);
  fprintf(f, "};\n");
  char zbuf[160] = "";
  if (zero)
    snprintf(zbuf, sizeof zbuf, "    .zero = %d, .ngrads = %d, .grads = pp_grads, "
             ".bucket_max = %" PRId64 ",\n", m->mesh_zero, ngrads, pp->zero_bucket_max);
  int64_t mb_tokens = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_INPUT && !strcmp(m->nodes[i]->name, "tokens"))
      mb_tokens = ir_numel(m->nodes[i]);
  fprintf(f, "\nstatic const RtPipeDesc pipe = {\n"
             "    .schedule = \"%s\",\n"
             "    .stages = %d, .chunks = %d, .microbatches = %d, .slots = %d, .split_w = %d,\n"
             "    .slot_bytes = pp_slot_bytes, .slot = pipe_slot, .grad_numel = pp_param_numel,\n"
             "    .mb_tokens = %" PRId64 ",\n"
             "    .nshared = %d, .shared = pp_shared, .shared_max = %" PRId64 ",\n"
             "    .nexpert = %d, .expert = pp_expert,\n"
             "%s"
             "    .nactions = nactions, .actions = actions, .nact = nact, .act = act,\n"
             "    .ngrad = ngrad, .grad = grad, .fwd = fwd, .bwd = bwd, .wgt = wgt,\n"
             "    .optimizer = optimizer,\n};\n\n%s\n",
          pp_schedule_name[sc->kind], P, C, pp->microbatches, pp->slots, pp->split_w,
          mb_tokens, nshared, pp->shared_numel_max, nexpert, zbuf,
          e->hooks ? e->hooks->step
                   : "static int step(RtStepIO *io) { return rt_pipe_step(io, &pipe); }\n");
  free(slp);
}

int cg_emit_host(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                 const CgLeafPlan *lp, const CgHostInfo *info, char *err, size_t errlen) {
  int64_t *temp_off = calloc((size_t)kp->ntemps + 1, sizeof(int64_t));
  if (!temp_off) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int64_t arena = cg_arena_bytes(kp, bp, temp_off), slot[PP_MAX_STAGES];
  if (info->pipe) { /* a slot a stage, its temporaries after its own values */
    cg_pipe_slot_bytes(m, info->pipe, kp, bp, slot, temp_off);
    arena = cg_pipe_arena_bytes(info->pipe, slot, -1);
  }
  int *param_index = calloc((size_t)m->nnodes + 1, sizeof(int));
  if (!param_index) {
    free(temp_off);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int *grad_of = cg_grad_of(m);
  if (!grad_of) {
    free(temp_off);
    free(param_index);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  Emit e = {out, m, kp, info->canon, bp, lp, temp_off, param_index, err, errlen, 0, grad_of,
            info->pipe, NULL, NULL, NULL, 0, 0, 0, NULL, 0, 0};
  int64_t nparams = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM) nparams += ir_numel(m->nodes[i]);
  fprintf(out,
          "/* train.c -- generated by parc %s from %s; do not edit.\n"
          " *\n"
          " * model %s: %" PRId64 " parameters, %d IR nodes, %d fused kernels.\n"
          " * One training step: forward, backward (input then weight gradients),\n"
          " * gradient clipping and the %s update, in IR order.  Every intermediate\n"
          " * value lives at a fixed offset of one arena of ARENA_BYTES (the planned\n"
          " * peak); P is the parameter buffer, S the optimizer state. */\n"
          "#include <stdint.h>\n#include <string.h>\n\n"
          "#include \"kernels.h\"\n"
          "#include \"runtime/rt_attention.h\"\n#include \"runtime/rt_comm.h\"\n"
          "#include \"runtime/rt_gemm.h\"\n"
          "#include \"runtime/rt_model.h\"\n#include \"runtime/rt_pipe.h\"\n"
          "#include \"runtime/rt_pool.h\"\n"
          "#include \"runtime/rt_route.h\"\n"
          "#include \"runtime/rt_trace.h\"\n"
          "%s"
          "\n"
          "#define ARENA_BYTES %" PRId64 "\n"
          "#define CHECK(call) do { if ((call) != 0) return -1; } while (0)\n"
          "#define F(offset) ((float *)(A + (offset)))   /* a value in the arena */\n"
          "#define I(offset) ((int32_t *)(A + (offset)))\n"
          "/* --save-grads: parameter gradient g (n floats) to offset off of io->grads */\n"
          "#define SAVE_GRAD(off, g, n) \\\n"
          "  do { if (io->grads) memcpy(io->grads + (off), (g), (size_t)(n) * sizeof(float)); "
          "} while (0)\n"
          "/* A collective (n floats): with --trace, its time and size into io->trace\n"
          " * (runtime/rt_trace.h, rt_trace_comm); without, one test of io->trace. */\n"
          "#define COMM(kind, group, how, n, call) \\\n"
          "  do { \\\n"
          "    double t0_ = io->trace ? rt_trace_clock() : 0; \\\n"
          "    CHECK(call); \\\n"
          "    if (io->trace) rt_trace_comm(io->trace, RT_TRACE_##kind, RT_TRACE_##group, \\\n"
          "                                 RT_TRACE_##how, t0_, (n)); \\\n"
          "  } while (0)\n\n",
          info->version, base_name(info->source), m->name, nparams, m->nnodes, kp->nkernels,
          m->optimizer ? m->optimizer : "optimizer",
          m->mesh_ep > 1 ? "#include \"runtime/rt_expert.h\"\n" : "", arena);
  emit_tables(&e);
  emit_thunks(&e);
  if (info->pipe) { /* stage programs instead of one straight-line step */
    emit_pipe(&e, info, slot);
    emit_desc(&e, info, 1);
    free(temp_off);
    free(param_index);
    free(grad_of);
    return e.failed ? -1 : 0;
  }
  fprintf(out, "static int step(RtStepIO *io) {\n"
               "  char *A = io->arena;\n  float *P = io->params, *S = io->state;\n"
               "  float lr = io->lr, t = io->step;\n  (void)A, (void)P, (void)S, (void)lr, (void)t;\n");
  int *wait_at = cg_async_waits(m, kp); /* the same as the buffer plan's (project.c) */
  e.wait_at = wait_at;
  e.traced = 1;
  if (wait_at && plan_async(&e)) fail(&e, "out of memory");
  emit_async_decl(&e);
  IrPhase phase = IR_PHASE_COUNT;
  static const char *const phase_title[] = {"forward", "backward: input gradients",
                                            "backward: weight gradients", "optimizer"};
  /* Kernels are in execution order: each runs at its root's position. */
  int next = 0;
  for (int i = 0; i < m->nnodes && !e.failed; i++) {
    const IrNode *n = m->nodes[i];
    int runtime = !(ir_op_info[n->op].flags & IR_F_LEAF) && kp->kernel_of[i] < 0;
    int kernels = next < kp->nkernels && kp->kernels[next].root == i;
    if (!runtime && !kernels) continue;
    if (n->phase != phase && n->phase < IR_PHASE_COUNT) {
      phase = n->phase;
      fprintf(out, "\n  /* ---- %s ---- */\n", phase_title[phase]);
    }
    if (e.nasync) emit_waits(&e, i);
    if (runtime) {
      comment(&e, n, "  ");
      emit_runtime(&e, n);
      emit_save_grad(&e, n);
      emit_moe_stat(&e, n);
    }
    for (; next < kp->nkernels && kp->kernels[next].root == i; next++) {
      const CgKernel *kk = &kp->kernels[next];
      for (int j = 0; j < kk->nnodes; j++) comment(&e, m->nodes[kk->nodes[j]], "  ");
      if (!kk->nnodes) fprintf(out, "  /* statistics for a later weight gradient */\n");
      emit_kernel_call(&e, next);
      for (int j = 0; j < kk->nnodes; j++) emit_save_grad(&e, m->nodes[kk->nodes[j]]);
      for (int j = 0; j < kk->nnodes; j++) emit_moe_stat(&e, m->nodes[kk->nodes[j]]);
    }
  }
  if (next != kp->nkernels) fail(&e, "kernel %d runs out of node order", next);
  char b[96];
  if (e.nasync) emit_waits(&e, INT_MAX);
  fprintf(out, "\n  /* ---- results ---- */\n");
  if (m->loss) fprintf(out, "  io->loss = *%s;\n", buf(&e, m->loss, b, sizeof b));
  if (m->ce_loss) fprintf(out, "  io->ce_loss = *%s;\n", buf(&e, m->ce_loss, b, sizeof b));
  fprintf(out, "  io->grad_norm = %s%s;\n", m->grad_norm ? "*" : "0",
          m->grad_norm ? buf(&e, m->grad_norm, b, sizeof b) : "");
  emit_update_copies(&e, -1);
  fprintf(out, "  return 0;\n}\n\n");
  emit_desc(&e, info, 1);
  free(wait_at);
  free(e.slot);
  free(e.async_ids);
  free(temp_off);
  free(param_index);
  free(grad_of);
  return e.failed ? -1 : 0;
}

/* ---- shared with codegen/host_cuda.c (the GPU trainer) -------------------- */

void cg_host_comment(FILE *out, const IrNode *n, const char *indent) {
  Emit e;
  memset(&e, 0, sizeof e);
  e.out = out;
  comment(&e, n, indent);
}

int cg_emit_pipe(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                 const CgLeafPlan *lp, const CgHostInfo *info, const int64_t *slot_bytes,
                 const CgPipeHooks *hooks, char *err, size_t errlen) {
  Emit e;
  memset(&e, 0, sizeof e);
  int *grad_of = cg_grad_of(m);
  if (!grad_of) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  e.out = out, e.m = m, e.kp = kp, e.canon = info->canon, e.bp = bp, e.lp = lp, e.err = err;
  e.errlen = errlen, e.pipe = info->pipe, e.hooks = hooks, e.grad_of = grad_of;
  emit_pipe(&e, info, slot_bytes);
  free(grad_of);
  return e.failed ? -1 : 0;
}

int cg_emit_host_desc(FILE *out, const IrModule *m, const CgLeafPlan *lp,
                      const CgHostInfo *info, char *err, size_t errlen) {
  int *param_index = calloc((size_t)m->nnodes + 1, sizeof(int));
  if (!param_index) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  Emit e;
  memset(&e, 0, sizeof e);
  e.out = out, e.m = m, e.lp = lp, e.param_index = param_index, e.err = err, e.errlen = errlen;
  emit_tables(&e);
  emit_desc(&e, info, 0);
  free(param_index);
  return e.failed ? -1 : 0;
}
