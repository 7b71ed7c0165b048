/* codegen/host.c -- emit train.c for one rank program.
 *
 * Every value the step computes lives at its planned offset in the arena
 * (passes/bufplan.c); parameters and optimizer state live in their own
 * buffers at the offsets cg_plan_leaves gives.  The step runs the IR's
 * nodes in order: a node is either computed by a fused kernel (emitted at
 * its kernel's root), by a runtime routine, or is a leaf.  At the end the
 * module's updates are copied into the parameter and state buffers. */
#include "codegen/host.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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

unsigned char *cg_results(IrModule *m) {
  unsigned char *keep = arena_alloc(&m->arena, (size_t)m->nnodes + 1);
  if (m->loss) keep[m->loss->id] = 1;
  if (m->ce_loss) keep[m->ce_loss->id] = 1;
  if (m->grad_norm) keep[m->grad_norm->id] = 1;
  for (int i = 0; i < m->nupdates; i++) keep[m->updates[i].value->id] = 1;
  return keep;
}

/* ---- emission helpers ------------------------------------------------------ */

int64_t cg_arena_bytes(const CgKernelPlan *kp, const BufPlan *bp, int64_t *temp_off) {
  int64_t end = bp->peak;
  for (int t = 0; t < kp->ntemps; t++) {
    if (temp_off) temp_off[t] = end;
    end += (kp->temps[t].numel * 4 + BUFPLAN_ALIGN - 1) / BUFPLAN_ALIGN * BUFPLAN_ALIGN;
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
} Emit;

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

/* The C expression for node n's buffer. */
static const char *buf(Emit *e, const IrNode *n, char *s, size_t len) {
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

static int64_t lead(const IrNode *x, int keep) {
  int64_t p = 1;
  for (int i = 0; i < x->rank - keep; i++) p *= x->shape[i];
  return p;
}

static int64_t dim(const IrNode *x, int i) { return x->shape[i < 0 ? x->rank + i : i]; }

/* all_gather, replicate, reduce_scatter or local_slice along dimension
 * ia[2] of [outer, n, inner] (n the whole size): the strided forms in
 * rt_route.h; local_slice takes the rank's coordinate at run time. */
static void emit_dim_collective(Emit *e, const IrNode *n, const char *x, const char *out) {
  int cut = n->op == IR_OP_REDUCE_SCATTER || n->op == IR_OP_LOCAL_SLICE;
  const IrNode *whole = cut ? n->inputs[0] : n;
  int d = (int)n->ia[2];
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < d; k++) outer *= whole->shape[k];
  for (int k = d + 1; k < whole->rank; k++) inner *= whole->shape[k];
  const char *grp = n->ia[0] ? "dp" : "tp";
  if (n->op == IR_OP_LOCAL_SLICE)
    fprintf(e->out, "  CHECK(rt_local_slice(%s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_comm_rank(io->%s_group), %" PRId64 "));\n", out, x, outer, whole->shape[d],
            inner, grp, n->ia[1]);
  else
    fprintf(e->out, "  CHECK(%s(io->%s_group, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n",
            n->op == IR_OP_REDUCE_SCATTER ? "rt_reduce_scatter_dim" : "rt_all_gather_dim", grp,
            x, out, outer, whole->shape[d], inner);
}

/* One runtime call for a node the kernels do not compute. */
static void emit_runtime(Emit *e, const IrNode *n) {
  char o[96], a0[96], a1[96], a2[96], a3[96], fl[48];
  IrNode *const *in = n->inputs;
  const char *out = buf(e, n, o, sizeof o);
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
    fprintf(f, "  CHECK(%s(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %s%s0));\n",
            ta ? "rt_matmul_ta" : "rt_matmul", out, x, y, lead(a, 2), m, k, nn,
            n->ia[0] ? "RT_MM_TRANSPOSE_B | " : "", b->rank > 2 ? "RT_MM_B_BATCHED | " : "");
    return;
  }
  case IR_OP_ATTENTION:
    fprintf(f, "  CHECK(rt_sdpa(%s, NULL, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 ", %s, %d));\n", out, x, y, z, dim(in[0], 0), dim(in[0], 1),
            dim(in[1], 1), dim(in[0], 2), dim(in[0], 3), flit(fl, sizeof fl, n->fa),
            (int)n->ia[0]);
    return;
  case IR_OP_ATTENTION_GRAD:
    fprintf(f, "  CHECK(rt_sdpa_grad(%s, %s, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 ", %s, %d));\n", out, x, y, z, w, dim(in[0], 0),
            dim(in[0], 1), dim(in[1], 1), dim(in[0], 2), dim(in[0], 3), flit(fl, sizeof fl, n->fa),
            (int)n->ia[0]);
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
    fprintf(f, "  CHECK(rt_embedding_grad(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n",
            out, x, y, ir_numel(in[0]), n->ia[0], dim(in[1], -1));
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
            dim(in[1], 0), dim(in[1], 1), n->ia[0] ? "dp" : "tp", n->ia[1]);
    return;
  case IR_OP_VOCAB_EMBEDDING_GRAD:
    fprintf(f, "  CHECK(rt_vocab_embedding_grad(%s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_comm_rank(io->%s_group), %" PRId64 "));\n", out, x, y, ir_numel(in[0]),
            n->ia[0], dim(in[1], -1), n->ia[1] ? "dp" : "tp", n->ia[2]);
    return;
  case IR_OP_VOCAB_CROSS_ENTROPY:
    fprintf(f, "  CHECK(rt_vocab_cross_entropy(io->%s_group, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 "));\n", n->ia[0] ? "dp" : "tp", out, x, y, lead(in[0], 1),
            dim(in[0], -1), n->ia[2]);
    return;
  case IR_OP_VOCAB_CROSS_ENTROPY_GRAD:
    fprintf(f, "  CHECK(rt_vocab_cross_entropy_grad(io->%s_group, %s, %s, %s, %s, %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", n->ia[0] ? "dp" : "tp", out, x, y, z,
            lead(in[0], 1), dim(in[0], -1), n->ia[2]);
    return;
  case IR_OP_ALL_REDUCE:
    fprintf(f, "  CHECK(rt_comm_all_reduce(io->%s_group, %s, %s, %" PRId64 "));\n",
            n->ia[0] ? "dp" : "tp", x, out, ir_numel(n));
    return;
  case IR_OP_ALL_GATHER:
  case IR_OP_REDUCE_SCATTER: { /* the communicator's blocks are contiguous: dim 0 only */
    int gather = n->op == IR_OP_ALL_GATHER;
    const IrNode *whole = gather ? n : in[0], *piece = gather ? in[0] : n;
    if (lead(whole, whole->rank - (int)n->ia[2]) != 1) { /* not contiguous per rank */
      emit_dim_collective(e, n, x, out);
      return;
    }
    fprintf(f, "  CHECK(rt_comm_%s(io->%s_group, %s, %s, (const int64_t[]){", ir_op_info[n->op].name,
            n->ia[0] ? "dp" : "tp", x, out);
    for (int64_t r = 0; r < n->ia[1]; r++)
      fprintf(f, "%s%" PRId64, r ? ", " : "", ir_numel(piece));
    fprintf(f, "}));\n");
    return;
  }
  case IR_OP_FLAT_SHARD: /* ZeRO-1: this rank's piece, zero-padded */
    fprintf(f, "  CHECK(rt_comm_flat_piece(io->%s_group, %s, %" PRId64 ", %s, %" PRId64 "));\n",
            n->ia[0] ? "dp" : "tp", x, ir_numel(in[0]), out, ir_numel(n));
    return;
  case IR_OP_REPLICATE: case IR_OP_LOCAL_SLICE:
    emit_dim_collective(e, n, x, out);
    return;
  case IR_OP_GROUP_COPY: /* identity forward; its gradient is the all-reduce */
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

static void emit_kernel_call(Emit *e, int index) {
  const CgKernel *k = &e->kp->kernels[index];
  char b[96];
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
    int sharded = n->shard_degree > 1;
    fprintf(f, "}, %" PRId64 ", %" PRId64 ", %s, %s,\n   {", e->lp->offset[i], ir_numel(n),
            init[n->init], flit(fl, sizeof fl, n->init == IR_INIT_NORMAL ? n->init_std : 0.0));
    for (int d = 0; d < n->rank; d++)
      fprintf(f, "%s%" PRId64, d ? ", " : "", sharded ? n->global_shape[d] : n->shape[d]);
    fprintf(f, "}, %d, %d},\n", sharded ? n->shard_dim : -1,
            sharded && n->shard_blocks > 1 ? n->shard_blocks : 1);
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

static void emit_desc(Emit *e, const CgHostInfo *info) {
  const IrModule *m = e->m;
  FILE *f = e->out;
  int np = 0, ns = 0;
  for (int i = 0; i < m->nnodes; i++) {
    np += m->nodes[i]->op == IR_OP_PARAM;
    ns += m->nodes[i]->op == IR_OP_STATE;
  }
  int64_t batch = 0, seq = 0, vocab = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op == IR_OP_INPUT && !strcmp(n->name, "tokens") && n->rank == 2)
      batch = n->shape[0], seq = n->shape[1];
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
  fprintf(f, "static const RtModelDesc model = {\n");
  fprintf(f, "    .name = ");
  put_str(f, m->name);
  fprintf(f, ",\n    .source = ");
  put_str(f, base_name(info->source));
  int dp = m->mesh_dp > 1 ? m->mesh_dp : 1;
  fprintf(f, ",\n    .vocab = %" PRId64 ", .batch = %" PRId64 ", .seq = %" PRId64 ",\n", vocab,
          batch * dp, seq);
  fprintf(f, "    .tp = %d, .dp = %d, .zero = %d,\n", m->mesh_tp > 1 ? m->mesh_tp : 1, dp,
          m->mesh_zero > 1 ? m->mesh_zero : 0);
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
  fprintf(f, "    .step = step,\n};\n\n");
  fprintf(f, "int main(int argc, char **argv) { return rt_train_main(argc, argv, &model); }\n");
}

/* After the call that computes n: if n is a parameter's gradient as the
 * optimizer reads it (p->grad, materialised by the kernel plan), its copy for
 * --save-grads. */
static void emit_save_grad(Emit *e, const IrNode *n) {
  int i = e->grad_of[n->id];
  if (i < 0) return;
  char b[96];
  fprintf(e->out, "  SAVE_GRAD(%" PRId64 ", %s, %" PRId64 "); /* %s */\n", e->lp->offset[i],
          buf(e, n, b, sizeof b), ir_numel(n), e->m->nodes[i]->name);
}

int cg_emit_host(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                 const CgLeafPlan *lp, const CgHostInfo *info, char *err, size_t errlen) {
  int64_t *temp_off = calloc((size_t)kp->ntemps + 1, sizeof(int64_t));
  if (!temp_off) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int64_t arena = cg_arena_bytes(kp, bp, temp_off);
  int *param_index = calloc((size_t)m->nnodes + 1, sizeof(int));
  if (!param_index) {
    free(temp_off);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int *grad_of = malloc(sizeof(int) * ((size_t)m->nnodes + 1));
  if (!grad_of) {
    free(temp_off);
    free(param_index);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (int i = 0; i < m->nnodes; i++) grad_of[i] = -1;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad)
      grad_of[m->nodes[i]->grad->id] = i;
  Emit e = {out, m, kp, info->canon, bp, lp, temp_off, param_index, err, errlen, 0, grad_of};
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
          "#include \"runtime/rt_model.h\"\n#include \"runtime/rt_pool.h\"\n"
          "#include \"runtime/rt_route.h\"\n\n"
          "#define ARENA_BYTES %" PRId64 "\n"
          "#define CHECK(call) do { if ((call) != 0) return -1; } while (0)\n"
          "#define F(offset) ((float *)(A + (offset)))   /* a value in the arena */\n"
          "#define I(offset) ((int32_t *)(A + (offset)))\n"
          "/* --save-grads: parameter gradient g (n floats) to offset off of io->grads */\n"
          "#define SAVE_GRAD(off, g, n) \\\n"
          "  do { if (io->grads) memcpy(io->grads + (off), (g), (size_t)(n) * sizeof(float)); "
          "} while (0)\n\n",
          info->version, base_name(info->source), m->name, nparams, m->nnodes, kp->nkernels,
          m->optimizer ? m->optimizer : "optimizer", arena);
  emit_tables(&e);
  emit_thunks(&e);
  fprintf(out, "static int step(RtStepIO *io) {\n"
               "  char *A = io->arena;\n  float *P = io->params, *S = io->state;\n"
               "  float lr = io->lr, t = io->step;\n  (void)A, (void)P, (void)S, (void)lr, (void)t;\n");
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
    if (runtime) {
      comment(&e, n, "  ");
      emit_runtime(&e, n);
      emit_save_grad(&e, n);
    }
    for (; next < kp->nkernels && kp->kernels[next].root == i; next++) {
      const CgKernel *kk = &kp->kernels[next];
      for (int j = 0; j < kk->nnodes; j++) comment(&e, m->nodes[kk->nodes[j]], "  ");
      if (!kk->nnodes) fprintf(out, "  /* statistics for a later weight gradient */\n");
      emit_kernel_call(&e, next);
      for (int j = 0; j < kk->nnodes; j++) emit_save_grad(&e, m->nodes[kk->nodes[j]]);
    }
  }
  if (next != kp->nkernels) fail(&e, "kernel %d runs out of node order", next);
  char b[96];
  fprintf(out, "\n  /* ---- results ---- */\n");
  if (m->loss) fprintf(out, "  io->loss = *%s;\n", buf(&e, m->loss, b, sizeof b));
  if (m->ce_loss) fprintf(out, "  io->ce_loss = *%s;\n", buf(&e, m->ce_loss, b, sizeof b));
  fprintf(out, "  io->grad_norm = %s%s;\n", m->grad_norm ? "*" : "0",
          m->grad_norm ? buf(&e, m->grad_norm, b, sizeof b) : "");
  for (int i = 0; i < m->nupdates; i++) {
    const IrUpdate *u = &m->updates[i];
    char dst[96];
    fprintf(out, "  memcpy(%s, %s, %" PRId64 " * sizeof(float)); /* %s */\n",
            buf(&e, u->leaf, dst, sizeof dst), buf(&e, u->value, b, sizeof b), ir_numel(u->leaf),
            u->leaf->name);
  }
  fprintf(out, "  return 0;\n}\n\n");
  emit_desc(&e, info);
  free(temp_off);
  free(param_index);
  free(grad_of);
  return e.failed ? -1 : 0;
}
