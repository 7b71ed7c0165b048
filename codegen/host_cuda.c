/* codegen/host_cuda.c -- emit train_cuda.c, the GPU trainer of one rank
 * program (codegen/host_cuda.h).
 *
 * Invariants shared with host.c's train.c (and relied on by the tests that
 * compare the two trainers): the nodes run in IR order, each kernel at its
 * root's position; every value is at the same arena offset; parameters and
 * state use the same offsets; the tables and the RtModelDesc are host.c's
 * own (cg_emit_host_desc).  Device pointers replace host ones one for one:
 * `P + off`, `S + off`, `F(off)`, `I(off)` read the same in both files.
 * A pipelined module (info->pipe) gets host.c's stage functions, action,
 * boundary and stage-buffer tables through cg_emit_pipe, this file's hooks
 * writing their statements on device memory; its step is rt_cuda_pipe_step
 * (the same slots, accumulator and order as rt_pipe_step).
 * The graph (PARC_CUDA_GRAPH, runtime/cuda/rt_cuda_graph.h): the unpipelined
 * step's device work is its own function, step_body, reading every input
 * from device memory, so that rt_cuda_graph_step may capture and replay it.
 * The profile (PARC_CUDA_PROFILE, runtime/cuda/rt_cuda_prof.h): each kernel
 * launch is bracketed by PROF_BEGIN() and LAUNCHED(name, bytes), the bytes
 * from the kernel's KIR (kernel_bytes); prof_, read once per step or stage
 * function, keeps the cost a branch when the profile is off.  Runtime ops
 * time themselves. */
#include "codegen/host_cuda.h"
#include "codegen/cuda_batch.h"
#include "codegen/cuda_store.h"
#include "passes/machine.h"
#include "runtime/cuda/rt_cuda_ws_plan.h"
#include "runtime/rt_gemm.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* A GEMM call of stage `stage` (rt_cuda_ws_plan.h: its bf16 operand workspace). */
typedef struct {
  int stage;
  RtCudaGemm g;
} CuGemm;

typedef struct {
  FILE *out;
  const IrModule *m;
  const CgKernelPlan *kp;
  const CgCudaStore *store; /* the bf16 buffers; store->code[store->canon[k]]: kernel k's code */
  const CgCudaBatches *batches; /* the batched launches and the kernels GEMM calls compute
                                   (NULL: none; a pipelined trainer's plan batches none,
                                   and its GEMMs' bias sums go through rt_cuda_bgrad_ws) */
  const BufPlan *bp;
  const CgLeafPlan *lp;
  const int64_t *temp_off;
  const int *grad_of;  /* per node id: the PARAM whose gradient it is, else -1 */
  char *err;
  size_t errlen;
  int failed;
  int stage;            /* the pipeline stage whose function is being written (else 0) */
  CuGemm *gemms;        /* the GEMM calls written, distinct per stage (gemm_table) */
  int ngemms, capgemms;
  int grads_in_acc;     /* it is an optimizer function: a gradient (p->grad) is read
                           from G (host.h, cg_pipe_grads_in_acc) */
  int fuse_step;        /* the unpipelined step: cross-entropy fused into its gradient
                           (cg_cuda_xent_fused) */
  int epilogues;        /* some kernel is computed by its GEMM's call (batches->in_gemm) */
  const PpProgram *pipe; /* while writing stage programs (cg_emit_pipe's hooks): m's */
  const IrNode *redir;  /* while set, buf() of this node is redir_expr (a bias sum
                           written to the runtime's scratch: emit_runtime) */
  const char *redir_expr;
} Cu;

static void fail(Cu *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(Cu *e, const char *fmt, ...) {
  if (e->failed++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->err, e->errlen, fmt, ap);
  va_end(ap);
}

/* The C expression of node n's device buffer (host.c's, with the inputs on
 * the device: tokens, targets, and lr / t as device scalars; an update value
 * written in place: its leaf's). */
static const char *buf(Cu *e, const IrNode *n, char *s, size_t len) {
  if (n == e->redir) return e->redir_expr;
  if (e->kp->inplace_of[n->id] >= 0) n = e->m->nodes[e->kp->inplace_of[n->id]];
  if (e->grads_in_acc && e->grad_of[n->id] >= 0) { /* summed into G by the microbatches */
    snprintf(s, len, "G + %" PRId64, e->lp->offset[e->grad_of[n->id]]);
    return s;
  }
  switch (n->op) {
  case IR_OP_PARAM:
    snprintf(s, len, "P + %" PRId64, e->lp->offset[n->id]);
    return s;
  case IR_OP_STATE:
    snprintf(s, len, "S + %" PRId64, e->lp->offset[n->id]);
    return s;
  case IR_OP_INPUT:
    if (!strcmp(n->name, "tokens") && n->dtype == IR_I32) return "tokens";
    if (!strcmp(n->name, "targets") && n->dtype == IR_I32) return "targets";
    if (!strcmp(n->name, "lr") && n->rank == 0) return "lr";
    if (!strcmp(n->name, "step") && n->rank == 0) return "t";
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

/* The C expression of the aux part of node n's buffer (sdpa's lse, f32): after
 * its ir_numel(n) elements, of 2 bytes each where the plan has n narrow
 * (passes/bufplan.h, codegen/cuda_arena.h), else of 4. */
static const char *aux_buf(Cu *e, const IrNode *n, char *s, size_t len) {
  if (e->bp->offset[n->id] < 0) return buf(e, n, s, len); /* (fails) */
  int64_t w = e->bp->narrow && e->bp->narrow[n->id] ? 2 : 4;
  snprintf(s, len, "F(%" PRId64 ")", e->bp->offset[n->id] + w * ir_numel(n));
  return s;
}

static int64_t lead(const IrNode *x, int keep) { return ir_dims_product(x, 0, x->rank - keep); }

static int64_t dim(const IrNode *x, int i) { return x->shape[i < 0 ? x->rank + i : i]; }

/* The rt_cuda.h group of mesh axis `axis` (ir/ops.def: tp, dp, ep, ep_dp). */
static const char *grp(int64_t axis) {
  static const char *const name[] = {"RT_CUDA_TP", "RT_CUDA_DP", "RT_CUDA_EP", "RT_CUDA_EP_DP"};
  return axis >= 0 && axis < 4 ? name[axis] : "RT_CUDA_TP";
}

/* After a collective that moves bf16 elements two to a float (cuda_store.h) */
#define BF16_PAIRS " /* bf16: 2 elements a float */"

/* all_gather / reduce_scatter along dimension ia[2], replicate, local_slice:
 * [outer, n, inner] with n the whole size (rt_cuda.h). */

static void emit_dim_collective(Cu *e, const IrNode *n, const char *x, const char *out) {
  int64_t outer, len, inner;
  cg_dim_split(n, &outer, &len, &inner);
  int pairs = e->store->bf16[n->id] && n->op == IR_OP_ALL_GATHER; /* cuda_store.h */
  if (pairs) inner /= 2;
  if (n->op == IR_OP_LOCAL_SLICE)
    fprintf(e->out, "  CHECK(rt_cuda_local_slice(dev, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_cuda_group_rank(dev, %s), %" PRId64 "));\n", out, x, outer, len,
            inner, grp(n->ia[0]), n->ia[1]);
  else
    fprintf(e->out, "  CHECK(%s(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));%s\n",
            n->op == IR_OP_REDUCE_SCATTER ? "rt_cuda_reduce_scatter_dim" : "rt_cuda_all_gather_dim",
            grp(n->ia[0]), x, out, outer, len, inner, pairs ? BF16_PAIRS : "");
}

int cg_cuda_gemm_weight(const IrNode *n, int j, int weights) {
  const RtCudaGemm g = cg_cuda_gemm(n);
  return weights && n->inputs[j]->op == IR_OP_PARAM && n->inputs[j]->dtype == IR_F32 &&
         rt_cuda_gemm_stored_ok(&g, j);
}

int cg_cuda_weights_read(const IrModule *m, int weights) {
  for (int i = 0; weights && i < m->nnodes; i++)
    if ((m->nodes[i]->op == IR_OP_MATMUL || m->nodes[i]->op == IR_OP_MATMUL_TA) &&
        (cg_cuda_gemm_weight(m->nodes[i], 0, 1) || cg_cuda_gemm_weight(m->nodes[i], 1, 1)))
      return 1;
  return 0;
}

int cg_cuda_stored_flags(const IrNode *n, const unsigned char *bf16, const unsigned char *rounded,
                         int weights) {
  int a = bf16 ? bf16[n->inputs[0]->id] : 0, b = bf16 ? bf16[n->inputs[1]->id] : 0;
  a = a ? a : cg_cuda_gemm_weight(n, 0, weights);
  b = b ? b : cg_cuda_gemm_weight(n, 1, weights);
  return (a ? RT_CUDA_MM_A_BF16 : 0) | (a == 2 ? RT_CUDA_MM_A_WIDE : 0) |
         (b ? RT_CUDA_MM_B_BF16 : 0) | (b == 2 ? RT_CUDA_MM_B_WIDE : 0) |
         (bf16 && bf16[n->id] ? RT_CUDA_MM_C_BF16 : 0) |
         (rounded && rounded[n->id] ? RT_CUDA_MM_C_ROUND : 0);
}

int cg_cuda_xent_fused(const IrModule *m, int i) {
  const IrNode *c = m->nodes[i];
  int vocab = c->op == IR_OP_VOCAB_CROSS_ENTROPY;
  if ((c->op != IR_OP_CROSS_ENTROPY && !vocab) || (c != m->loss && c != m->ce_loss)) return -1;
  int grad = -1;
  for (int j = 0; j < m->nnodes; j++) {
    const IrNode *n = m->nodes[j];
    for (int k = 0; k < n->ninputs; k++)
      if (n->inputs[k] == c) return -1; /* read in the step: the loss must exist there */
    if (grad < 0 && j > i &&
        n->op == (vocab ? IR_OP_VOCAB_CROSS_ENTROPY_GRAD : IR_OP_CROSS_ENTROPY_GRAD) &&
        n->inputs[0] == c->inputs[0] && n->inputs[1] == c->inputs[1] &&
        (!vocab || (n->ia[0] == c->ia[0] && n->ia[2] == c->ia[2])))
      grad = j;
  }
  return grad;
}

/* The cross-entropy whose loss gradient node g's call also computes
 * (cg_cuda_xent_fused), else NULL. */
static const IrNode *xent_loss_of(const IrModule *m, const IrNode *g) {
  if (g->op != IR_OP_CROSS_ENTROPY_GRAD && g->op != IR_OP_VOCAB_CROSS_ENTROPY_GRAD) return NULL;
  for (int i = 0; i < g->id; i++)
    if (cg_cuda_xent_fused(m, i) == g->id) return m->nodes[i];
  return NULL;
}

int cg_cuda_attn_stored_ok(const IrNode *n) {
  if (n->op != IR_OP_ATTENTION && (n->op != IR_OP_ATTENTION_GRAD || n->ninputs != 6)) return 0;
  if (n->inputs[0]->rank != 4) return 0;
  const IrSdpaDims d = ir_sdpa_dims(n);
  return rt_cuda_attn_stored_ok(d.hd, d.T);
}

unsigned cg_cuda_attn_flags(const IrNode *n, const unsigned char *bf16,
                            const unsigned char *rounded) {
  static const unsigned in[4] = {RT_CUDA_ATTN_Q_BF16, RT_CUDA_ATTN_K_BF16, RT_CUDA_ATTN_V_BF16,
                                 RT_CUDA_ATTN_DY_BF16};
  unsigned io = 0;
  if (n->op == IR_OP_ATTENTION_DELTA) /* reads m, dm; writes f32 */
    return bf16 ? (bf16[n->inputs[0]->id] ? RT_CUDA_ATTN_M_BF16 : 0u) |
                      (bf16[n->inputs[1]->id] ? RT_CUDA_ATTN_DM_BF16 : 0u)
                : 0u;
  for (int j = 0; bf16 && j < 4 && j < (n->op == IR_OP_ATTENTION ? 3 : 4); j++)
    if (bf16[n->inputs[j]->id]) io |= in[j];
  if (bf16 && bf16[n->id]) io |= RT_CUDA_ATTN_O_BF16;
  if (rounded && rounded[n->id]) io |= RT_CUDA_ATTN_O_ROUND;
  if (n->ia[1] & IR_SDPA_OUT_TOKENS) io |= RT_CUDA_ATTN_O_TOKENS; /* passes/attn_layout.c */
  if (n->ia[1] & IR_SDPA_DY_TOKENS) io |= RT_CUDA_ATTN_DY_TOKENS;
  if (n->ia[1] & IR_SDPA_QKV_TOKENS) io |= RT_CUDA_ATTN_QKV_TOKENS;
  return io;
}

/* " | "-joined names of the RT_CUDA_ATTN_* flags in io, into s */
static const char *attn_flag_names(unsigned io, char *s, size_t len) {
  static const struct { unsigned bit; const char *name; } flag[] = {
      {RT_CUDA_ATTN_Q_BF16, "RT_CUDA_ATTN_Q_BF16"}, {RT_CUDA_ATTN_K_BF16, "RT_CUDA_ATTN_K_BF16"},
      {RT_CUDA_ATTN_V_BF16, "RT_CUDA_ATTN_V_BF16"}, {RT_CUDA_ATTN_DY_BF16, "RT_CUDA_ATTN_DY_BF16"},
      {RT_CUDA_ATTN_O_BF16, "RT_CUDA_ATTN_O_BF16"}, {RT_CUDA_ATTN_O_ROUND, "RT_CUDA_ATTN_O_ROUND"},
      {RT_CUDA_ATTN_M_BF16, "RT_CUDA_ATTN_M_BF16"}, {RT_CUDA_ATTN_DM_BF16, "RT_CUDA_ATTN_DM_BF16"},
      {RT_CUDA_ATTN_O_TOKENS, "RT_CUDA_ATTN_O_TOKENS"},
      {RT_CUDA_ATTN_DY_TOKENS, "RT_CUDA_ATTN_DY_TOKENS"},
      {RT_CUDA_ATTN_QKV_TOKENS, "RT_CUDA_ATTN_QKV_TOKENS"}};
  s[0] = 0;
  for (size_t i = 0; i < sizeof flag / sizeof flag[0]; i++)
    if (io & flag[i].bit)
      snprintf(s + strlen(s), len - strlen(s), "%s%s", s[0] ? " | " : "", flag[i].name);
  return s;
}

RtCudaGemm cg_cuda_gemm(const IrNode *n) {
  const IrNode *a = n->inputs[0], *b = n->inputs[1];
  int ta = n->op == IR_OP_MATMUL_TA;
  return (RtCudaGemm){ta, (n->ia[0] ? RT_MM_TRANSPOSE_B : 0) | (b->rank > 2 ? RT_MM_B_BATCHED : 0),
                      lead(a, 2), ta ? dim(a, -1) : dim(a, -2), ta ? dim(a, -2) : dim(a, -1),
                      dim(n, -1)};
}

/* Records GEMM call g of the current stage (once per distinct call). */
static void add_gemm(Cu *e, RtCudaGemm g) {
  for (int i = 0; i < e->ngemms; i++)
    if (e->gemms[i].stage == e->stage && !memcmp(&e->gemms[i].g, &g, sizeof g)) return;
  if (e->ngemms == e->capgemms) {
    int cap = e->capgemms ? 2 * e->capgemms : 32;
    CuGemm *t = realloc(e->gemms, sizeof *t * (size_t)cap);
    if (!t) {
      fail(e, "out of memory");
      return;
    }
    e->gemms = t, e->capgemms = cap;
  }
  e->gemms[e->ngemms++] = (CuGemm){e->stage, g};
}

/* gemm_table (declared in the file's head, used by start): the GEMM calls of
 * each of the `stages` stages, which rt_cuda_open plans the bf16 operand
 * workspaces of (rt_cuda_ws_plan.h). */
static void emit_gemm_table(Cu *e, int stages) {
  FILE *f = e->out;
  fprintf(f, "\n/* The GEMM calls of each stage, distinct {ta, flags, batch, m, k, n}: start plans "
             "their\n * bf16 operand workspaces (runtime/cuda/rt_cuda_ws_plan.h). */\n");
  for (int s = 0; s < stages; s++) {
    int n = 0;
    fprintf(f, "static const RtCudaGemm gemms_%d[] = {", s);
    for (int i = 0; i < e->ngemms; i++) {
      const RtCudaGemm *g = &e->gemms[i].g;
      if (e->gemms[i].stage != s) continue;
      fprintf(f, "%s{%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "}",
              n++ ? ",\n    " : "\n    ", g->ta, g->flags, g->batch, g->m, g->k, g->n);
    }
    fprintf(f, "%s};\n", n ? "" : "{0, 0, 0, 0, 0, 0}");
    fprintf(f, "static const int ngemms_%d = %d;\n", s, n);
  }
  /* the last stage is the switch's default: every path returns */
  fprintf(f, "static const RtCudaGemm *gemm_table(int stage, int *n) {\n  switch (stage) {\n");
  for (int s = 0; s + 1 < stages; s++)
    fprintf(f, "  case %d: *n = ngemms_%d; return gemms_%d;\n", s, s, s);
  fprintf(f, "  default: *n = ngemms_%d; return gemms_%d;\n  }\n}\n", stages - 1, stages - 1);
}

static void emit_launch(Cu *e, int index, const char *ind);
static void emit_save_grad(Cu *e, const IrNode *n);

/* The runtime call of a GEMM computing a kernel in its epilogue, by CG_EPI_*. */
static const char *const epilogue_fn[] = {NULL, "rt_cuda_matmul_ta_bgrad", "rt_cuda_matmul_bias",
                                          "rt_cuda_matmul_gelu", "rt_cuda_matmul_dgelu"};

/* The kernel instance whose bias sum (a matmul_ta), bias add, GELU or GELU
 * gradient (a matmul) GEMM node g's call computes (codegen/cuda_batch.h,
 * in_gemm), else -1. */
static int epilogue_kernel_of(const Cu *e, const IrNode *g) {
  if (!e->batches || (g->op != IR_OP_MATMUL_TA && g->op != IR_OP_MATMUL))
    return -1;
  for (int k = 0; k < e->kp->nkernels; k++)
    if (e->batches->in_gemm[k] == g->id) return k;
  return -1;
}

/* One runtime call for a node the kernels do not compute (host.c's
 * emit_runtime, op for op, on rt_cuda.h). */
static void emit_runtime(Cu *e, const IrNode *n) {
  char o[96], a0[96], a1[96], a2[96], a3[96], ds[160];
  IrNode *const *in = n->inputs;
  /* a GEMM adding its product into the accumulator (host.h, cg_pipe_acc_into) */
  int acc = e->kp->acc_into ? e->kp->acc_into[n->id] : -1;
  if (acc >= 0) snprintf(o, sizeof o, "G + %" PRId64, e->lp->offset[acc]);
  /* an embedding's gradient added onto another term's bytes (codegen/grad_onto.h) */
  const int onto = e->kp->onto ? e->kp->onto[n->id] : -1;
  const char *out = acc >= 0 ? o : buf(e, onto >= 0 ? e->m->nodes[onto] : n, o, sizeof o);
  const char *x = n->ninputs > 0 ? buf(e, in[0], a0, sizeof a0) : NULL;
  const char *y = n->ninputs > 1 ? buf(e, in[1], a1, sizeof a1) : NULL;
  const char *z = n->ninputs > 2 ? buf(e, in[2], a2, sizeof a2) : NULL;
  const char *w = n->ninputs > 3 ? buf(e, in[3], a3, sizeof a3) : NULL;
  FILE *f = e->out;
  const IrNode *xl = e->fuse_step ? xent_loss_of(e->m, n) : NULL;
  if (xl) { /* the forward's loss too, in the gradient's call */
    char lb[96];
    int wide = e->store->bf16[n->id] && !e->store->bf16[in[0]->id];
    fprintf(f, "  CHECK(rt_cuda_cross_entropy_fused(dev, %s, %s, %s, %s, %s, %s, %s, %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n",
            n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD ? grp(n->ia[0]) : "-1",
            e->store->bf16[in[0]->id] ? "RT_CUDA_XENT_BF16IO"
            : wide                    ? "RT_CUDA_XENT_BF16OUT"
                                      : "0",
            buf(e, xl, lb, sizeof lb), out, x, y, z, lead(in[0], 1), dim(in[0], -1),
            n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD ? n->ia[2] : dim(in[0], -1));
    return;
  }
  int fused = e->fuse_step ? cg_cuda_xent_fused(e->m, n->id) : -1;
  if (fused >= 0) { /* a cross-entropy whose loss its gradient's call writes */
    fprintf(f, "  /* computed with its gradient, %%%d (rt_cuda_cross_entropy_fused) */\n", fused);
    return;
  }
  switch (n->op) {
  case IR_OP_MATMUL:
  case IR_OP_MATMUL_TA: {
    static const struct { int bit; const char *name; } flag[] = {
        {RT_MM_TRANSPOSE_B, "RT_MM_TRANSPOSE_B"}, {RT_MM_B_BATCHED, "RT_MM_B_BATCHED"},
        {RT_CUDA_MM_A_BF16, "RT_CUDA_MM_A_BF16"}, {RT_CUDA_MM_A_WIDE, "RT_CUDA_MM_A_WIDE"},
        {RT_CUDA_MM_B_BF16, "RT_CUDA_MM_B_BF16"}, {RT_CUDA_MM_B_WIDE, "RT_CUDA_MM_B_WIDE"},
        {RT_CUDA_MM_C_BF16, "RT_CUDA_MM_C_BF16"}, {RT_CUDA_MM_C_ROUND, "RT_CUDA_MM_C_ROUND"},
        {RT_MM_ACCUMULATE, "RT_MM_ACCUMULATE"}};
    RtCudaGemm g = cg_cuda_gemm(n);
    g.flags |= cg_cuda_stored_flags(n, e->store->bf16, e->store->rounded, e->store->weights);
    if (acc >= 0) g.flags |= RT_MM_ACCUMULATE; /* (an f32 gradient: no C_BF16 / C_ROUND) */
    /* a weight read from the params' bf16 copy (PB: the file's head) */
    for (int j = 0; j < 2; j++)
      if (cg_cuda_gemm_weight(n, j, e->store->weights))
        snprintf(j ? a1 : a0, sizeof a0, "PB(%" PRId64 ")", e->lp->offset[in[j]->id]);
    /* a kernel the call computes in its epilogue (cuda_batch.h): the bias
     * sum, bias add, GELU or GELU gradient; its vector, aux and result */
    const int bk = epilogue_kernel_of(e, n);
    const int epi = bk >= 0 ? e->batches->epi[bk] : CG_EPI_NONE;
    const IrNode *vec = NULL, *aux = NULL, *res = NULL;
    if (bk >= 0) cg_cuda_epilogue_parts(e->m, e->kp, bk, epi, &vec, &aux, &res);
    char vb[96], xb[96], rb[96];
    /* a stage program's bias sum (cuda_batch.h): into the runtime's scratch bg_,
     * by the epilogue or by its kernel, and from there into the accumulator */
    const int stage_bgrad = epi == CG_EPI_BGRAD && e->pipe;
    const int gp = stage_bgrad ? e->pipe->grad_param[vec->id] : -1; /* (cuda_batch.c: >= 0) */
    if (stage_bgrad) {
      fprintf(f, "  /* %%%d, a term of %s's gradient: its sums in bg_, then into G */\n"
              "  CHECK(rt_cuda_bgrad_ws(dev, %" PRId64 ", &bg_));\n",
              vec->id, e->m->nodes[gp]->name, ir_numel(vec));
      e->redir = vec, e->redir_expr = "bg_";
    }
    fprintf(f, "  CHECK(%s(dev, ", epi ? epilogue_fn[epi] : g.ta ? "rt_cuda_matmul_ta"
                                                              : "rt_cuda_matmul");
    if (res) fprintf(f, "%s, ", buf(e, res, rb, sizeof rb));
    if (epi == CG_EPI_GELU) fprintf(f, "%s, ", buf(e, aux, xb, sizeof xb));
    fprintf(f, "%s, %s, %s, ", out, x, y);
    if (vec) fprintf(f, "%s, ", buf(e, vec, vb, sizeof vb));
    if (epi == CG_EPI_DGELU) fprintf(f, "%s, ", buf(e, aux, xb, sizeof xb));
    fprintf(f, "%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", ", g.batch, g.m, g.k, g.n);
    for (size_t i = 0; i < sizeof flag / sizeof flag[0]; i++)
      if (g.flags & flag[i].bit) fprintf(f, "%s | ", flag[i].name);
    if (res) /* the result's own storage (codegen/cuda_store.h) */
      fprintf(f, "0, %s, &summed_));\n", e->store->bf16[res->id] ? "RT_CUDA_MM_C_BF16"
                                         : e->store->rounded && e->store->rounded[res->id]
                                             ? "RT_CUDA_MM_C_ROUND"
                                             : "0");
    else
      fputs(epi ? "0, &summed_));\n" : "0));\n", f);
    add_gemm(e, g);
    if (epi) { /* the kernel where the epilogue did not compute it (rt_cuda.h) */
      const int first = e->kp->kernels[bk].nodes[0];
      fprintf(f, "  if (!summed_) { /* %%%d by its kernel, after the GEMM */\n", first);
      emit_launch(e, bk, "    ");
      fputs("  }\n", f);
      if (stage_bgrad) {
        fprintf(f, "  ACC_GRAD(%" PRId64 ", bg_, %" PRId64 "); /* %s */\n",
                e->lp->offset[gp], ir_numel(vec), e->m->nodes[gp]->name);
        e->redir = NULL, e->redir_expr = NULL;
      } else if (epi == CG_EPI_BGRAD) {
        emit_save_grad(e, vec);
      }
    }
    return;
  }
  case IR_OP_ATTENTION: { /* lse [B, H, T] right after out (ir_aux_numel) */
    char io[256], lse[96]; /* io: RT_CUDA_ATTN_* of the tensors stored as bf16 (or rounded) */
    attn_flag_names(cg_cuda_attn_flags(n, e->store->bf16, e->store->rounded), io, sizeof io);
    fprintf(f, "  CHECK(rt_cuda_sdpa%s(dev, %s, %s, %s, %s, %s, %s%s%s));\n", io[0] ? "_io" : "",
            out, aux_buf(e, n, lse, sizeof lse), x, y, z, cg_sdpa_dims(n, ds, sizeof ds),
            io[0] ? ", " : "", io);
    return;
  }
  case IR_OP_ATTENTION_GRAD: {
    if (n->ninputs == 6) { /* lse and D on their own (passes/attn_delta.c) */
      char lo[96], dl[96], io[256];
      attn_flag_names(cg_cuda_attn_flags(n, e->store->bf16, e->store->rounded), io, sizeof io);
      fprintf(f, "  CHECK(rt_cuda_sdpa_grad_stats%s(dev, %s, %s, %s, %s, %s, %s, %s, %s%s%s));\n",
              io[0] ? "_io" : "", out, x, y, z, w, buf(e, in[4], lo, sizeof lo),
              buf(e, in[5], dl, sizeof dl), cg_sdpa_dims(n, ds, sizeof ds), io[0] ? ", " : "",
              io);
      return;
    }
    char yo[96], lse[96]; /* the forward's out and lse from in[4]'s buffer */
    fprintf(f, "  CHECK(rt_cuda_sdpa_grad(dev, %s, %s, %s, %s, %s, %s, %s, %s));\n", out, x, y,
            z, w, buf(e, in[4], yo, sizeof yo), aux_buf(e, in[4], lse, sizeof lse),
            cg_sdpa_dims(n, ds, sizeof ds));
    return;
  }
  case IR_OP_ATTENTION_LSE: { /* sdpa's lse, after its out (ir_aux_numel) */
    char lse[96];
    fprintf(f, "  CHECK(rt_cuda_copy(dev, %s, %s, %" PRId64 "));\n", out,
            aux_buf(e, in[0], lse, sizeof lse), ir_numel(n));
    return;
  }
  case IR_OP_ATTENTION_DELTA: { /* [B, T, H hd] x2 -> D [B, H, T] */
    char io[96];
    attn_flag_names(cg_cuda_attn_flags(n, e->store->bf16, NULL), io, sizeof io);
    fprintf(f, "  CHECK(rt_cuda_sdpa_delta%s(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 "%s%s));\n", io[0] ? "_io" : "", out, x, y, dim(n, 0), dim(n, 1),
            dim(n, 2), dim(in[0], -1) / dim(n, 1), io[0] ? ", " : "", io);
    return;
  }
  case IR_OP_TOPK:
    fprintf(f, "  CHECK(rt_cuda_topk(dev, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n", out,
            x, lead(in[0], 1), dim(in[0], -1), n->ia[0]);
    return;
  case IR_OP_GATHER:
    fprintf(f, "  CHECK(rt_cuda_gather(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64 "));\n",
            out, x, y, lead(in[0], 1), dim(in[0], -1), dim(in[1], -1));
    return;
  case IR_OP_SCATTER_ADD:
    fprintf(f, "  CHECK(rt_cuda_scatter_add(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            "));\n", out, x, y, lead(in[0], 1), dim(in[0], -1), n->ia[0]);
    return;
  case IR_OP_ONEHOT:
    fprintf(f, "  CHECK(rt_cuda_onehot(dev, %s, %s, %" PRId64 ", %" PRId64 "));\n", out, x,
            ir_numel(in[0]), n->ia[0]);
    return;
  case IR_OP_DISPATCH:
    fprintf(f, "  CHECK(rt_cuda_dispatch(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", out, x, y, dim(in[0], 0), dim(in[1], 1),
            dim(in[0], 1), n->ia[0], n->ia[1]);
    return;
  case IR_OP_CAPACITY_DROP:
    fprintf(f, "  CHECK(rt_cuda_capacity_drop(dev, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 "));\n", out, x, dim(in[0], 0), dim(in[0], 1), n->ia[0], n->ia[1]);
    return;
  case IR_OP_EXPERT_ALL_TO_ALL: { /* host-staged (rt_cuda.h): rt_expert_all_to_all */
    const IrNode *slots = n->ia[2] ? n : in[0]; /* [E, C, ...] */
    int64_t inner = ir_numel(slots) / (dim(slots, 0) * dim(slots, 1));
    fprintf(f, "  CHECK(rt_cuda_expert_all_to_all(dev, %s, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 ", %d));\n", grp(n->ia[0]), out, x, y, ir_numel(in[1]),
            dim(slots, 0), dim(slots, 1), inner, n->ia[2] != 0);
    return;
  }
  case IR_OP_COMBINE:
    fprintf(f, "  CHECK(rt_cuda_combine(dev, %s, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n", out, x, y, z, dim(in[1], 0), dim(in[1], 1),
            dim(in[0], 2), dim(in[0], 0), dim(in[0], 1));
    return;
  case IR_OP_COMBINE_GRAD_Y:
    fprintf(f, "  CHECK(rt_cuda_combine_grad_y(dev, %s, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 ", %" PRId64 "));\n", out, x, y, z, dim(in[1], 0),
            dim(in[1], 1), dim(in[0], 1), dim(n, 0), dim(n, 1));
    return;
  case IR_OP_COMBINE_GRAD_W:
    fprintf(f, "  CHECK(rt_cuda_combine_grad_w(dev, %s, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 ", %" PRId64 ", %" PRId64 "));\n", out, x, y, z, dim(in[2], 0),
            dim(in[2], 1), dim(in[0], 1), dim(in[1], 0), dim(in[1], 1));
    return;
  case IR_OP_EMBEDDING:
    fprintf(f, "  CHECK(rt_cuda_embedding(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            "));\n", out, x, y, ir_numel(in[0]), dim(in[1], 0), dim(in[1], 1));
    return;
  case IR_OP_EMBEDDING_GRAD:
    fprintf(f, "  CHECK(rt_cuda_embedding_grad%s(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            "));\n", acc >= 0 || onto >= 0 ? "_acc" : "", out, x, y, ir_numel(in[0]), n->ia[0],
            dim(in[1], -1));
    return;
  case IR_OP_CROSS_ENTROPY: /* logits as bf16 where their GEMM writes them so */
    fprintf(f, "  CHECK(rt_cuda_cross_entropy%s(dev, %s, %s, %s, %" PRId64 ", %" PRId64 "));\n",
            e->store->bf16[in[0]->id] ? "_bf16" : "", out, x, y, lead(in[0], 1), dim(in[0], -1));
    return;
  case IR_OP_CROSS_ENTROPY_GRAD: /* logits and dlogits as bf16, or dlogits (wide) */
    fprintf(f, "  CHECK(rt_cuda_cross_entropy_grad%s(dev, %s, %s, %s, %s, %" PRId64 ", %" PRId64
            "));\n", e->store->bf16[in[0]->id] ? "_bf16io" : e->store->bf16[n->id] ? "_bf16" : "",
            out, x, y, z, lead(in[0], 1), dim(in[0], -1));
    return;
  case IR_OP_VOCAB_EMBEDDING:
    fprintf(f, "  CHECK(rt_cuda_vocab_embedding(dev, %s, %s, %s, %" PRId64 ", %" PRId64 ", %" PRId64
            ", rt_cuda_group_rank(dev, %s), %" PRId64 "));\n", out, x, y, ir_numel(in[0]),
            dim(in[1], 0), dim(in[1], 1), grp(n->ia[0]), n->ia[1]);
    return;
  case IR_OP_VOCAB_EMBEDDING_GRAD:
    fprintf(f, "  CHECK(rt_cuda_vocab_embedding_grad%s(dev, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 ", rt_cuda_group_rank(dev, %s), %" PRId64 "));\n",
            acc >= 0 || onto >= 0 ? "_acc" : "", out, x, y, ir_numel(in[0]), n->ia[0],
            dim(in[1], -1), grp(n->ia[1]), n->ia[2]);
    return;
  case IR_OP_VOCAB_CROSS_ENTROPY: /* as cross_entropy */
    fprintf(f, "  CHECK(rt_cuda_vocab_cross_entropy%s(dev, %s, %s, %s, %s, %" PRId64 ", %" PRId64
            ", %" PRId64 "));\n", e->store->bf16[in[0]->id] ? "_bf16" : "", grp(n->ia[0]), out, x,
            y, lead(in[0], 1), dim(in[0], -1), n->ia[2]);
    return;
  case IR_OP_VOCAB_CROSS_ENTROPY_GRAD:
    fprintf(f, "  CHECK(rt_cuda_vocab_cross_entropy_grad%s(dev, %s, %s, %s, %s, %s, %" PRId64
            ", %" PRId64 ", %" PRId64 "));\n",
            e->store->bf16[in[0]->id] ? "_bf16io" : e->store->bf16[n->id] ? "_bf16" : "",
            grp(n->ia[0]), out, x, y, z, lead(in[0], 1), dim(in[0], -1), n->ia[2]);
    return;
  case IR_OP_ALL_REDUCE: { /* the sum stored as bf16 (or rounded so): codegen/cuda_store.h */
    int round = e->store->rounded && e->store->rounded[n->id];
    if (e->store->bf16[n->id] || round)
      fprintf(f, "  CHECK(rt_cuda_all_reduce_bf16(dev, %s, %s, %s, %" PRId64 ", %d));\n",
              grp(n->ia[0]), x, out, ir_numel(n), round);
    else
      fprintf(f, "  CHECK(rt_cuda_all_reduce(dev, %s, %s, %s, %" PRId64 "));\n", grp(n->ia[0]), x,
              out, ir_numel(n));
    return;
  }
  case IR_OP_ALL_GATHER:
  case IR_OP_REDUCE_SCATTER: { /* contiguous blocks when the cut is the leading dims' */
    int gather = n->op == IR_OP_ALL_GATHER;
    const IrNode *whole = gather ? n : in[0], *piece = gather ? in[0] : n;
    if (lead(whole, whole->rank - (int)n->ia[2]) != 1) {
      emit_dim_collective(e, n, x, out);
      return;
    }
    int pairs = gather && e->store->bf16[n->id]; /* cuda_store.h */
    fprintf(f, "  CHECK(rt_cuda_%s(dev, %s, %s, %s, %" PRId64 "));%s\n", ir_op_info[n->op].name,
            grp(n->ia[0]), x, out, pairs ? ir_numel(piece) / 2 : ir_numel(piece),
            pairs ? BF16_PAIRS : "");
    return;
  }
  case IR_OP_FLAT_SHARD:
    fprintf(f, "  CHECK(rt_cuda_flat_piece(dev, %s, %s, %" PRId64 ", %s, %" PRId64 "));\n",
            grp(n->ia[0]), x, ir_numel(in[0]), out, ir_numel(n));
    return;
  case IR_OP_REPLICATE: case IR_OP_LOCAL_SLICE:
    emit_dim_collective(e, n, x, out);
    return;
  case IR_OP_GROUP_COPY: /* a value stored as bf16, as its copy (cuda_store.c copy_of): its bytes */
    if (cg_runtime_view_note(f, e->kp, e->bp, n->id)) return;
    fprintf(f, "  CHECK(rt_cuda_copy(dev, %s, %s, %" PRId64 "));%s\n", out, x,
            e->store->bf16[n->id] ? ir_numel(n) / 2 : ir_numel(n),
            e->store->bf16[n->id] ? BF16_PAIRS : "");
    return;
  default:
    fail(e, "the GPU trainer has no routine for %s", ir_op_info[n->op].name);
  }
}

/* ---- the bytes a fused kernel moves (the profile's, rt_cuda.h) ----
 * Per buffer argument, the elements it touches, 4 bytes each (f32, i32),
 * twice when read and written (KIR_INOUT): compulsory traffic, each buffer
 * through DRAM once, re-reads from cache.  Touched: at most the buffer's
 * elements, and at most, per row, one element for each row-level access
 * plus, per loop, the distinct elements its accesses in that loop cover.
 * An access whose index is affine in the loop's column -- k + s col + a sum
 * of row-level values -- covers k + s [0, extent); accesses with the same
 * row-level part and step cover the union of theirs (rope's i and
 * i + hd/2: hd elements; a slice of a wider buffer: its own columns; a
 * broadcast operand: capped by its buffer); any other index (div, mod:
 * merged and permuted views) counts the loop's extent once per loop, for
 * all such accesses together (they are taken to overlap).  A loop of a
 * non-constant extent leaves the buffer's size as the bound. */

#define LIN_TERMS 8
typedef struct {
  int n;
  KirVal v[LIN_TERMS];   /* row-level values, ascending */
  int64_t c[LIN_TERMS];  /* their coefficients, non-zero */
  int64_t col, k;        /* the column's coefficient, the constant */
} Lin;

static int lin_add(Lin *a, const Lin *b, int64_t sign) {
  for (int j = 0; j < b->n; j++) {
    int at = 0;
    while (at < a->n && a->v[at] < b->v[j]) at++;
    if (at < a->n && a->v[at] == b->v[j]) {
      a->c[at] += sign * b->c[j];
      if (!a->c[at]) { /* cancelled */
        memmove(a->v + at, a->v + at + 1, sizeof a->v[0] * (size_t)(a->n - at - 1));
        memmove(a->c + at, a->c + at + 1, sizeof a->c[0] * (size_t)(a->n - at - 1));
        a->n--;
      }
      continue;
    }
    if (a->n == LIN_TERMS) return -1;
    memmove(a->v + at + 1, a->v + at, sizeof a->v[0] * (size_t)(a->n - at));
    memmove(a->c + at + 1, a->c + at, sizeof a->c[0] * (size_t)(a->n - at));
    a->v[at] = b->v[j];
    a->c[at] = sign * b->c[j];
    a->n++;
  }
  a->col += sign * b->col;
  a->k += sign * b->k;
  return 0;
}

/* Index node x as a Lin: row-level values are opaque terms, the column that
 * of the loop x varies in; -1 when it is not affine in the column. */
static int lin_of(const KirKernel *kk, KirVal x, Lin *out, int depth) {
  const KirNode *n = &kk->nodes[x];
  memset(out, 0, sizeof *out);
  if (n->op == KIR_OP_ICONST) {
    out->k = n->imm;
    return 0;
  }
  if (n->loop < 0) { /* row-level: one opaque term */
    out->n = 1, out->v[0] = x, out->c[0] = 1;
    return 0;
  }
  if (depth > 64) return -1;
  Lin a, b;
  switch (n->op) {
  case KIR_OP_COL:
    out->col = 1;
    return 0;
  case KIR_OP_IADD:
  case KIR_OP_ISUB:
    if (lin_of(kk, n->arg[0], &a, depth + 1) || lin_of(kk, n->arg[1], &b, depth + 1)) return -1;
    *out = a;
    return lin_add(out, &b, n->op == KIR_OP_IADD ? 1 : -1);
  case KIR_OP_IMUL: {
    const KirNode *p = &kk->nodes[n->arg[0]], *q = &kk->nodes[n->arg[1]];
    int64_t f;
    if (p->op == KIR_OP_ICONST) f = p->imm, x = n->arg[1];
    else if (q->op == KIR_OP_ICONST) f = q->imm, x = n->arg[0];
    else return -1;
    if (lin_of(kk, x, out, depth + 1)) return -1;
    if (!f) {
      memset(out, 0, sizeof *out);
      return 0;
    }
    for (int j = 0; j < out->n; j++) out->c[j] *= f;
    out->col *= f, out->k *= f;
    return 0;
  }
  default:
    return -1;
  }
}

static int lin_same_part(const Lin *a, const Lin *b) {
  if (a->n != b->n || a->col != b->col) return 0;
  for (int j = 0; j < a->n; j++)
    if (a->v[j] != b->v[j] || a->c[j] != b->c[j]) return 0;
  return 1;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Distinct elements the accesses sites[0, n) (Lins) of one loop of `extent`
 * cover in a row; other: some access of the loop is not affine. */
static int64_t loop_elements(Lin *sites, int n, int other, int64_t extent, int64_t *ks) {
  int64_t total = other ? extent : 0;
  unsigned char *done = calloc((size_t)n + 1, 1);
  if (!done) return extent * (n + other);
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    int m = 0; /* the group of i: the same row-level part and step */
    for (int j = i; j < n; j++)
      if (!done[j] && lin_same_part(&sites[i], &sites[j])) done[j] = 1, ks[m++] = sites[j].k;
    int64_t step = sites[i].col < 0 ? -sites[i].col : sites[i].col;
    qsort(ks, (size_t)m, sizeof *ks, cmp_i64);
    if (step == 1) { /* intervals [k, k + extent) (a step of -1 mirrors them) */
      int64_t end = INT64_MIN;
      for (int j = 0; j < m; j++) {
        int64_t lo = sites[i].col < 0 ? ks[j] - extent + 1 : ks[j], hi = lo + extent;
        if (lo < end) lo = end;
        if (hi > lo) total += hi - lo, end = hi;
      }
    } else { /* step 0 (a store at a row-level index), or strided: per distinct k */
      for (int j = 0; j < m; j++)
        if (!j || ks[j] != ks[j - 1]) total += step ? extent : 1;
    }
  }
  free(done);
  return total;
}

static int64_t kernel_bytes(Cu *e, const CgKernel *k) {
  const KirKernel *kk = k->k;
  int64_t rows = kir_kernel_rows(kk), total = 0;
  unsigned char *live = malloc((size_t)kk->nnodes + 1);
  Lin *sites = malloc(sizeof *sites * ((size_t)kk->nnodes + 1));
  int64_t *ks = malloc(sizeof *ks * ((size_t)kk->nnodes + 1));
  if (!live || !sites || !ks) {
    free(live), free(sites), free(ks);
    fail(e, "out of memory");
    return 0;
  }
  kir_fill_live(kk, live);
  for (int i = 0; i < k->nargs && i < kk->nparams; i++) {
    if (kk->params[i].kind != KIR_PARAM_BUF) continue;
    int a = k->arg_node[i];
    int64_t numel = a < 0 ? e->kp->temps[CG_ARG_TEMP(a)].numel : ir_numel(e->m->nodes[a]);
    int64_t per_row = 0;
    int bounded = 1;
    for (int l = -1; l < kk->nloops && bounded; l++) {
      int n = 0, other = 0;
      for (int v = 0; v < kk->nnodes; v++) {
        const KirNode *x = &kk->nodes[v];
        if (!live[v] || (x->op != KIR_OP_LOAD && x->op != KIR_OP_STORE) || x->imm != i) continue;
        int in = x->loop >= 0 && x->loop < kk->nloops ? x->loop : -1;
        if (in != l) continue;
        if (l < 0) per_row++; /* row-level: one element a row */
        else if (lin_of(kk, x->arg[0], &sites[n], 0)) other = 1;
        else n++;
      }
      if (l < 0 || (!n && !other)) continue;
      const KirNode *x = &kk->nodes[kk->loops[l].extent];
      if (x->op != KIR_OP_ICONST || x->imm < 0) {
        bounded = 0;
        break;
      }
      int64_t c = loop_elements(sites, n, other, x->imm, ks);
      if (c > INT64_MAX / 4 - per_row) bounded = 0;
      else per_row += c;
    }
    int64_t touched = numel;
    if (bounded && rows > 0 && per_row <= INT64_MAX / 8 / rows && rows * per_row < numel)
      touched = rows * per_row;
    int size = a >= 0 && e->store->bf16[a] ? 2 : 4; /* stored as bf16 (cuda_store.h) */
    total += size * touched * (kk->params[i].access == KIR_INOUT ? 2 : 1);
  }
  free(live), free(sites), free(ks);
  int mirror = e->store->mirror[k - e->kp->kernels]; /* the params' bf16 copy, written */
  return total + (mirror >= 0 ? 2 * ir_numel(e->m->nodes[mirror]) : 0);
}

/* The arguments of kernel instance index's code: its instance's, and the
 * params' bf16 copy where it stores it too (the last: cuda_store.h mirror). */
static int code_args(const Cu *e, int index) {
  return e->store->code[e->store->canon[index]]->nparams;
}

/* The expression of argument i of kernel instance k, into b. */
static const char *arg_expr(Cu *e, const CgKernel *k, int i, char *b, size_t len) {
  if (i >= k->nargs) { /* the mirrored param's bf16 copy */
    const IrNode *p = e->m->nodes[e->store->mirror[k - e->kp->kernels]];
    snprintf(b, len, "(uint16_t *)PB(%" PRId64 ")", e->lp->offset[p->id]);
    return b;
  }
  int a = k->arg_node[i];
  if (a < 0) snprintf(b, len, "F(%" PRId64 ")", e->temp_off[CG_ARG_TEMP(a)]);
  else if (e->store->bf16[a]) snprintf(b, len, "H(%" PRId64 ")", e->bp->offset[a]);
  return a < 0 || e->store->bf16[a] ? b : buf(e, e->m->nodes[a], b, len);
}

/* A batch of instances of one kernel's code (codegen/cuda_batch.h): one
 * NAME_multi launch with each member's arguments at its index. */
static void emit_batch_call(Cu *e, int lead) {
  const CgCudaBatches *bt = e->batches;
  const CgKernel *k = &e->kp->kernels[lead];
  const char *name = e->store->code[e->store->canon[lead]]->name;
  char b[96];
  int64_t bytes = 0;
  fprintf(e->out, "  { /* %d launches of %s at once (codegen/cuda_batch.h) */\n"
                  "    const %s_multi_t b_ = {", bt->count[lead], name, name);
  for (int i = 0; i < code_args(e, lead); i++) {
    fputs(i ? ",\n        {" : "{", e->out);
    for (int j = lead; j >= 0; j = bt->next[j])
      fprintf(e->out, "%s%s", j == lead ? "" : ", ",
              arg_expr(e, &e->kp->kernels[j], i, b, sizeof b));
    fputc('}', e->out);
  }
  for (int j = lead; j >= 0; j = bt->next[j]) bytes += kernel_bytes(e, &e->kp->kernels[j]);
  fprintf(e->out, "};\n    PROF_BEGIN();\n    %s_multi_launch(&b_, %d, 0, %" PRId64 ", st);\n"
                  "    LAUNCHED(\"%s_multi\", %" PRId64 ");\n  }\n",
          name, bt->count[lead], kir_kernel_rows(k->k), name, bytes);
}

/* A fused kernel: its launcher over all its rows on the compute stream,
 * between the profile's events when the step records (prof_); or its batch,
 * when it leads one; or a note, when it runs in an earlier one. */
static void emit_kernel_call(Cu *e, int index) {
  const char *name = e->store->code[e->store->canon[index]]->name;
  if (cg_view_note(e->out, e->kp, e->bp, index)) return;
  if (e->batches && e->batches->lead[index] != index) {
    fprintf(e->out, "  /* runs in the batch of %s_multi above */\n", name);
    return;
  }
  if (e->batches && e->batches->count[index] > 1) {
    emit_batch_call(e, index);
    return;
  }
  emit_launch(e, index, "  ");
}

/* Kernel instance `index` launched alone, its lines indented by ind. */
static void emit_launch(Cu *e, int index, const char *ind) {
  const CgKernel *k = &e->kp->kernels[index];
  const char *name = e->store->code[e->store->canon[index]]->name;
  char b[96];
  fprintf(e->out, "%sPROF_BEGIN();\n%s%s_launch(", ind, ind, name);
  for (int i = 0; i < code_args(e, index); i++)
    fprintf(e->out, "%s, ", arg_expr(e, k, i, b, sizeof b));
  fprintf(e->out, "0, %" PRId64 ", st);\n%sLAUNCHED(\"%s\", %" PRId64 ");\n",
          kir_kernel_rows(k->k), ind, name, kernel_bytes(e, k));
}

static void emit_save_grad(Cu *e, const IrNode *n) {
  int i = e->grad_of[n->id];
  if (i < 0) return;
  char b[96];
  fprintf(e->out, "  SAVE_GRAD(%" PRId64 ", %s, %" PRId64 "); /* %s */\n", e->lp->offset[i],
          buf(e, n, b, sizeof b), ir_numel(n), e->m->nodes[i]->name);
}

/* Ops whose runtime routine stages through the host (rt_cuda_ops.cu's routing
 * and expert all-to-all): they wait for the stream, so no graph holds them. */
static int host_staged(const IrNode *n) {
  switch (n->op) {
  case IR_OP_TOPK: case IR_OP_GATHER: case IR_OP_SCATTER_ADD: case IR_OP_ONEHOT:
  case IR_OP_DISPATCH: case IR_OP_CAPACITY_DROP: case IR_OP_EXPERT_ALL_TO_ALL:
  case IR_OP_COMBINE: case IR_OP_COMBINE_GRAD_Y: case IR_OP_COMBINE_GRAD_W:
    return 1;
  default:
    return 0;
  }
}

/* The step in two functions: step_body, the device work between the uploads
 * and the read-backs (plain, or captured and replayed as a CUDA graph by
 * rt_cuda_graph_step: PARC_CUDA_GRAPH), and step around it. */
static void emit_step(Cu *e, int64_t rows, int64_t seq) {
  const IrModule *m = e->m;
  const CgKernelPlan *kp = e->kp;
  FILE *out = e->out;
  int host_ops = 0;
  for (int i = 0; i < m->nnodes; i++)
    host_ops += !(ir_op_info[m->nodes[i]->op].flags & IR_F_LEAF) && kp->kernel_of[i] < 0 &&
                host_staged(m->nodes[i]);
  fprintf(out,
          "/* This rank's device: made by start, before the first step (ranks are threads or\n"
          " * processes). */\n"
          "static _Thread_local RtCuda *dev;\n\n"
          "/* RtModelDesc.to_host: the device's parameters and state into the harness's\n"
          " * buffers, before it saves them. */\n"
          "static int to_host(float *params_host, float *state_host) {\n"
          "  return dev ? rt_cuda_download(dev, params_host, state_host) : 0;\n}\n\n"
          "/* The step's device work, after the uploads of rt_cuda_step_begin and before\n"
          " * the read-backs of rt_cuda_step_end: every pointer is fixed for the run and\n"
          " * lr and step are read from device memory, so a CUDA graph of it replays the\n"
          " * step (rt_cuda_graph_step; PARC_CUDA_GRAPH=0 turns it off). */\n"
          "static int step_body(RtStepIO *io) {\n"
          "  const int prof_ = rt_cuda_profiling(dev); /* PARC_CUDA_PROFILE: this step records */\n"
          "  char *A = rt_cuda_arena(dev);\n"
          "  float *P = rt_cuda_params(dev), *S = rt_cuda_state(dev);\n"
          "  int32_t *tokens = rt_cuda_tokens(dev), *targets = rt_cuda_targets(dev);\n"
          "  float *lr = rt_cuda_scalar(dev, 0), *t = rt_cuda_scalar(dev, 1);\n"
          "  struct CUstream_st *st = rt_cuda_stream(dev);\n"
          "  (void)io, (void)A, (void)P, (void)S, (void)tokens, (void)targets, (void)lr, (void)t,\n"
          "      (void)st, (void)prof_;\n");
  e->fuse_step = 1; /* (until the step's nodes are written) */
  if (e->epilogues)
    fprintf(out, "  int summed_; /* rt_cuda_matmul_ta_bgrad, _bias, _gelu, _dgelu: the "
                 "epilogue computed the kernel */\n");
  int weights = cg_cuda_weights_read(m, e->store->weights);
  if (weights && e->store->mirror_all)
    fprintf(out, "  /* the bf16 weights of the GEMMs marked PB(offset): this step's params\n"
                 "   * rounded to bf16, as the kernels that update the params in place stored\n"
                 "   * them (their PB arguments; rt_cuda_open's pass before the first step) */\n");
  else if (weights)
    fprintf(out, "  /* the bf16 weights of the GEMMs marked PB(offset): this step's params\n"
                 "   * rounded to bf16 (rt_cuda_params_to_bf16) */\n"
                 "  CHECK(rt_cuda_params_to_bf16(dev));\n");
  IrPhase phase = IR_PHASE_COUNT;
  static const char *const phase_title[] = {"forward", "backward: input gradients",
                                            "backward: weight gradients", "optimizer"};
  int next = 0;
  for (int i = 0; i < m->nnodes && !e->failed; i++) {
    const IrNode *n = m->nodes[i];
    int runtime = !(ir_op_info[n->op].flags & IR_F_LEAF) && kp->kernel_of[i] < 0;
    int kernels = next < kp->nkernels && kp->kernels[next].root == i;
    if (!runtime && !kernels) continue;
    if (n->phase != phase && n->phase < IR_PHASE_COUNT) {
      phase = n->phase;
      fprintf(out, "\n  /* ---- %s ---- */\n", phase_title[phase]);
    }
    if (runtime) {
      cg_host_comment(out, n, "  ");
      emit_runtime(e, n);
      emit_save_grad(e, n);
    }
    for (; next < kp->nkernels && kp->kernels[next].root == i; next++) {
      const CgKernel *kk = &kp->kernels[next];
      for (int j = 0; j < kk->nnodes; j++) cg_host_comment(out, m->nodes[kk->nodes[j]], "  ");
      if (!kk->nnodes) fprintf(out, "  /* statistics for a later weight gradient */\n");
      if (e->batches && e->batches->in_gemm[next] >= 0) {
        const int g = e->batches->in_gemm[next];
        fprintf(out, "  /* with %%%d's GEMM: in its epilogue, or launched after it (%s) */\n", g,
                epilogue_fn[e->batches->epi[next]]);
        continue;
      }
      emit_kernel_call(e, next);
      for (int j = 0; j < kk->nnodes; j++) emit_save_grad(e, m->nodes[kk->nodes[j]]);
    }
  }
  e->fuse_step = 0;
  if (next != kp->nkernels) fail(e, "kernel %d runs out of node order", next);
  char b[96], c[96], g[96];
  fprintf(out, "\n  /* ---- results ---- */\n");
  int inplace = 0; /* written into their leaves by their kernels (cg_kernels.h) */
  for (int i = 0; i < m->nupdates; i++)
    inplace += kp->inplace_of[m->updates[i].value->id] == m->updates[i].leaf->id;
  if (inplace)
    fprintf(out, "  /* %d of %d updates were stored into their parameter or state by their "
                 "kernels (in place)%s */\n", inplace, m->nupdates,
            inplace < m->nupdates ? "; the others are copied" : "");
  for (int i = 0; i < m->nupdates; i++) {
    const IrUpdate *u = &m->updates[i];
    if (kp->inplace_of[u->value->id] == u->leaf->id) continue;
    fprintf(out, "  CHECK(rt_cuda_copy(dev, %s, %s, %" PRId64 ")); /* %s */\n",
            buf(e, u->leaf, c, sizeof c), buf(e, u->value, b, sizeof b), ir_numel(u->leaf),
            u->leaf->name);
  }
  fprintf(out, "  return 0;\n}\n\n"
               "static int step_body_(void *io) { return step_body((RtStepIO *)io); }\n\n"
               "/* RtModelDesc.start: the device context, before the first step (its start-up\n"
               " * checks refuse a GPU too small or too few GPUs: RT_ERR_SETUP on every rank) */\n"
               "static int start(RtStepIO *io) {\n"
               "  int ng;\n"
               "  const RtCudaGemm *gl = gemm_table(0, &ng);\n"
               "  RtCudaSetup s = {.params_numel = PARAMS_NUMEL, .state_numel = STATE_NUMEL,\n"
               "                   .arena_bytes = ARENA_BYTES, .rows = %" PRId64 ", .seq = %" PRId64
               ",\n"
               "                   .tp = MESH_TP, .dp = MESH_DP, .tp_group = io->tp_group,\n"
               "                   .dp_group = io->dp_group, .tp_rank = io->tp_rank,\n"
               "                   .dp_rank = io->dp_rank, .ep = MESH_EP, .ep_group = io->ep_group,\n"
               "                   .ep_dp_group = io->ep_dp_group, .gemm = GEMM_MODE,\n"
               "                   .model = \"%s\", .gemms = gl, .ngemms = ng,\n"
               "                   .params_bf16 = %d, .reduce_piece = %" PRId64 ",\n"
               "                   .attn_dq_bytes = %" PRId64 "};\n"
               "  return rt_cuda_open(&dev, &s, io->params, io->state);\n"
               "}\n\n"
               "static int step(RtStepIO *io) {\n"
               "  CHECK(rt_cuda_step_begin(dev, io->tokens, io->targets, io->lr, io->step));\n"
               "  /* %d host-staged op%s (routing, expert all-to-all)%s; --save-grads copies to the\n"
               "   * host mid-step */\n"
               "  CHECK(rt_cuda_graph_step(dev, step_body_, io, %d, io->grads != NULL));\n"
               "  char *A = rt_cuda_arena(dev);\n"
               "  (void)A;\n",
          rows, seq, m->name, weights, e->store->reduce_piece, e->store->attn_dq, host_ops,
          host_ops == 1 ? "" : "s", host_ops ? ": no graph" : "", host_ops);
  if (!m->loss) fail(e, "the module has no loss");
  else
    fprintf(out, "  CHECK(rt_cuda_step_end(dev, %s, %s, %s, &io->loss, &io->ce_loss, "
                 "&io->grad_norm));\n  return 0;\n}\n\n",
            buf(e, m->loss, b, sizeof b), m->ce_loss ? buf(e, m->ce_loss, c, sizeof c) : "NULL",
            m->grad_norm ? buf(e, m->grad_norm, g, sizeof g) : "NULL");
}

/* ---- pipelined trainers: host.c's stage functions and tables (cg_emit_pipe)
 * with these statements on device memory (rt_cuda.h's pipelined section) ---- */

static void pipe_fn_head(void *ctx, const char *name, const char *what, int stage, int opt) {
  Cu *e = ctx;
  e->stage = stage;
  e->grads_in_acc = opt;
  fprintf(e->out,
          "/* %s */\nstatic int %s(RtStepIO *io) {\n"
          "  char *A = (char *)io->arena;\n"
          "  float *P = io->params, *S = io->state, *G = io->gacc;\n"
          "  int32_t *tokens = (int32_t *)io->tokens, *targets = (int32_t *)io->targets;\n"
          "  float *lr = rt_cuda_scalar(dev, 0), *t = rt_cuda_scalar(dev, 1);\n"
          "  struct CUstream_st *st = rt_cuda_stream(dev);\n"
          "  const int prof_ = rt_cuda_profiling(dev); /* PARC_CUDA_PROFILE: this step records */\n"
          "  (void)A, (void)P, (void)S, (void)G, (void)tokens, (void)targets, (void)lr, (void)t,"
          " (void)st,\n      (void)prof_;\n", what, name);
  if (e->epilogues) /* (a stage function without such a GEMM leaves them unread) */
    fprintf(e->out, "  int summed_ = 0; /* rt_cuda_matmul_bias, _gelu, _dgelu: the epilogue "
                    "computed the kernel */\n"
                    "  float *bg_ = NULL; /* a bias gradient term's sums (rt_cuda_bgrad_ws) */\n"
                    "  (void)summed_, (void)bg_;\n");
}

static void pipe_runtime(void *ctx, const CgLeafPlan *lp, const IrNode *n) {
  Cu *e = ctx;
  e->lp = lp;
  emit_runtime(e, n);
}

static int pipe_kernel(void *ctx, const CgLeafPlan *lp, int k) {
  Cu *e = ctx;
  e->lp = lp;
  if (e->batches && e->batches->in_gemm[k] >= 0) { /* (emit_runtime of its GEMM launched it) */
    fprintf(e->out, "  /* with %%%d's GEMM: in its epilogue, or launched after it (%s) */\n",
            e->batches->in_gemm[k], epilogue_fn[e->batches->epi[k]]);
    /* a bias sum: the GEMM's call adds it into G too (emit_runtime) */
    return e->batches->epi[k] == CG_EPI_BGRAD;
  }
  emit_kernel_call(e, k);
  return 0;
}

static void pipe_zero(void *ctx, const char *x, const char *who, const char *param) {
  fprintf(((Cu *)ctx)->out, "  CHECK(rt_cuda_zero(dev, %s, 1)); /* %s counts %s */\n", x, who,
          param);
}

static void pipe_pp_sum(void *ctx, const int *ids, int n) {
  Cu *e = ctx;
  char b[96];
  fprintf(e->out, "  { /* the per-parameter values above, summed over the stages */\n"
                  "    float *const v_[] = {");
  for (int k = 0; k < n; k++)
    fprintf(e->out, "%s%s", k ? ", " : "", buf(e, e->m->nodes[ids[k]], b, sizeof b));
  fprintf(e->out, "};\n    CHECK(rt_cuda_sum_scalars(dev, RT_CUDA_PP, v_, %d));\n  }\n", n);
}

static void pipe_loss(void *ctx, const char *loss, const char *ce) {
  fprintf(((Cu *)ctx)->out, "  CHECK(rt_cuda_pipe_loss(dev, %s, %s));\n", loss, ce ? ce : "NULL");
}

static void pipe_copy(void *ctx, const char *dst, const char *src, int64_t n, const char *name) {
  fprintf(((Cu *)ctx)->out, "  CHECK(rt_cuda_copy(dev, %s, %s, %" PRId64 ")); /* %s */\n", dst,
          src, n, name);
}

static void pipe_grad_norm(void *ctx, const char *x) {
  fprintf(((Cu *)ctx)->out, "  CHECK(rt_cuda_pipe_norm(dev, %s));\n", x ? x : "NULL");
}

/* The pipelined train_cuda's body: the device context, the stage functions and
 * tables, and step = rt_cuda_pipe_step. */
static void emit_pipe_cuda(Cu *e, const CgHostInfo *info, const int64_t *slot_bytes, int64_t rows,
                           int64_t seq) {
  FILE *out = e->out;
  /* the GEMMs read weights from the bf16 copy of the stage's own params */
  int weights = cg_cuda_weights_read(e->m, e->store->weights);
  fprintf(out,
          "/* This rank's device: made by start, before the first step (ranks are threads or\n"
          " * processes). */\n"
          "static _Thread_local RtCuda *dev;\n\n"
          "/* RtModelDesc.to_host: the device's parameters and state (this stage's) into the\n"
          " * harness's buffers, before it saves them. */\n"
          "static int to_host(float *params_host, float *state_host) {\n"
          "  return dev ? rt_cuda_download(dev, params_host, state_host) : 0;\n}\n\n"
          "/* A parameter-gradient term into the device accumulator G (rt_cuda_pipe_step's). */\n"
          "#define ACC_GRAD(off, g, n) CHECK(rt_cuda_acc(dev, G + (off), (g), (n)))\n\n");
  char step[2048];
  snprintf(step, sizeof step,
           "/* RtModelDesc.start: the device context (this stage's buffers; the harness's\n"
           " * stage-local params and state), before the first step (its start-up checks\n"
           " * refuse a GPU too small or too few GPUs: RT_ERR_SETUP on every rank). */\n"
           "static int start(RtStepIO *io) {\n"
           "  int s_ = io->pp_group ? io->pp_rank : 0, ng;\n"
           "  const RtCudaGemm *gl = gemm_table(s_, &ng);\n"
           "  RtCudaSetup s = {.params_numel = pp_param_numel[s_],\n"
           "                   .state_numel = pp_state_numel[s_], .arena_bytes = pp_arena_bytes[s_],\n"
           "                   .rows = %" PRId64 ", .seq = %" PRId64 ", .tp = MESH_TP,\n"
           "                   .dp = MESH_DP, .tp_group = io->tp_group, .dp_group = io->dp_group,\n"
           "                   .tp_rank = io->tp_rank, .dp_rank = io->dp_rank, .pp = MESH_PP,\n"
           "                   .ep = MESH_EP, .pp_group = io->pp_group, .ep_group = io->ep_group,\n"
           "                   .ep_dp_group = io->ep_dp_group, .pp_rank = s_, .gemm = GEMM_MODE,\n"
           "                   .model = \"%s\", .gemms = gl, .ngemms = ng,\n"
           "                   .params_bf16 = %d, .reduce_piece = %" PRId64 ",\n"
           "                   .attn_dq_bytes = %" PRId64 "};\n"
           "  return rt_cuda_open(&dev, &s, io->params, io->state);\n"
           "}\n\n"
           "/* One step: all the rank's microbatches go to the device%s and\n"
           " * rt_cuda_pipe_step runs the stage's action list. */\n"
           "static int step(RtStepIO *io) {\n"
           "  CHECK(rt_cuda_step_begin(dev, io->tokens, io->targets, io->lr, io->step));\n%s"
           "  return rt_cuda_pipe_step(dev, io, &pipe);\n"
           "}\n",
           rows * info->pipe->microbatches, seq, e->m->name, weights,
           e->store->reduce_piece, e->store->attn_dq,
           weights && !e->store->mirror_all
               ? ", the stage's params to bf16 for\n * the GEMMs marked PB(offset)"
               : weights ? " (the kernels that update the\n * stage's params in place store "
                           "their bf16 copy for the GEMMs marked PB(offset))"
                         : "",
           weights && !e->store->mirror_all ? "  CHECK(rt_cuda_params_to_bf16(dev));\n" : "");
  CgPipeHooks h = {e, pipe_fn_head, pipe_runtime, pipe_kernel, pipe_zero, pipe_pp_sum,
                   pipe_loss, pipe_copy, pipe_grad_norm, step};
  const CgLeafPlan *whole = e->lp;
  e->pipe = info->pipe;
  if (cg_emit_pipe(out, e->m, e->kp, e->bp, e->lp, info, slot_bytes, &h, e->err, e->errlen))
    e->failed++;
  e->pipe = NULL;
  e->lp = whole;
}

int cg_emit_host_cuda(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                      const CgLeafPlan *lp, const CgHostInfo *info, char *err, size_t errlen) {
  int64_t *temp_off = calloc((size_t)kp->ntemps + 1, sizeof(int64_t));
  int *grad_of = cg_grad_of(m);
  if (!temp_off || !grad_of) {
    free(temp_off);
    free(grad_of);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int64_t arena = cg_arena_bytes(kp, bp, temp_off), slot[PP_MAX_STAGES];
  if (info->pipe) { /* a slot a stage, its temporaries after its own values */
    cg_pipe_slot_bytes(m, info->pipe, kp, bp, slot, temp_off);
    arena = cg_pipe_arena_bytes(info->pipe, slot, -1);
  }
  if (!info->store) {
    free(temp_off);
    free(grad_of);
    snprintf(err, errlen, "no bf16 storage plan (codegen/cuda_store.h)");
    return -1;
  }
  Cu e = {out,     m,   kp,     info->store, info->batches, bp, lp, temp_off,
          grad_of, err, errlen, 0,           0,    NULL, 0, 0, 0, 0, 0, 0, NULL, NULL};
  for (int k = 0; info->batches && k < kp->nkernels; k++)
    e.epilogues |= info->batches->in_gemm[k] >= 0;
  const IrNode *tok = cg_tokens_input(m);
  int64_t nparams = 0, batch = tok ? tok->shape[0] : 0, seq = tok ? tok->shape[1] : 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM) nparams += ir_numel(m->nodes[i]);
  int bf16 = machine_bf16(m); /* the train section's precision */
  const char *src = info->source ? info->source : "?", *slash = strrchr(src, '/');
  fprintf(out,
          "/* train_cuda.c -- generated by parc %s from %s; do not edit.\n"
          " *\n"
          " * model %s on the GPU: %" PRId64 " parameters, %d IR nodes, %d fused kernels.\n"
          " * The plan of train.c -- the same kernels in the same order, the same buffer\n"
          " * lives; the offsets train.c's, or replanned with the values stored as bf16\n"
          " * at 2 bytes an element (codegen/cuda_arena.h) -- on device buffers:\n"
          " * P (parameters), S (optimizer state) and the\n"
          " * arena A are device memory (runtime/cuda/rt_cuda.h); fused kernels run\n"
          " * through their launchers (kernels_cuda.h) on the rank's compute stream, GEMMs\n"
          " * through cuBLASLt (%s), attention as flash kernels.  The harness\n"
          " * (rt_train_main: options, data, checkpoints, logs) is the CPU trainer's.\n"
          " * A pipelined trainer has train.c's stage functions and schedule tables\n"
          " * (codegen/host.c) on device memory; step = rt_cuda_pipe_step.\n"
          " * PARC_CUDA_PROFILE=1 (or =FILE.jsonl) times every kernel and runtime op of\n"
          " * the steps after the first and prints a table at exit (rt_cuda_prof.h).\n"
          " * Unless PARC_CUDA_GRAPH=0, one rank's unpipelined step_body (the device work)\n"
          " * is captured into a CUDA graph on the second step and replayed after\n"
          " * (rt_cuda_graph.h).\n"
          " * Values %s (codegen/cuda_store.h): %d,\n"
          " * %" PRId64 " elements; %s. */\n"
          "#include <stdint.h>\n#include <string.h>\n\n"
          "#include \"kernels_cuda.h\"\n"
          "#include \"runtime/cuda/rt_cuda.h\"\n"
          "#include \"runtime/rt_gemm.h\"\n"
          "#include \"runtime/rt_model.h\"\n\n"
          "#define ARENA_BYTES %" PRId64 "\n"
          "#define PARAMS_NUMEL %" PRId64 "\n"
          "#define STATE_NUMEL %" PRId64 "\n"
          "#define MESH_TP %d\n#define MESH_DP %d\n#define MESH_PP %d\n#define MESH_EP %d\n"
          "#define GEMM_MODE %s /* precision = %s; PARC_CUDA_GEMM overrides */\n"
          "#define CHECK(call) do { if ((call) != 0) return -1; } while (0)\n"
          "/* the GEMM calls of a stage (defined at the end) */\n"
          "static const RtCudaGemm *gemm_table(int stage, int *n);\n"
          "/* After a kernel's launch: its launch error, and its profile record (the bytes\n"
          " * it moves: codegen/host_cuda.c's kernel_bytes) when the step records (prof_,\n"
          " * PARC_CUDA_PROFILE); PROF_BEGIN before the launch. */\n"
          "#define PROF_BEGIN() do { if (prof_) rt_cuda_prof_begin(dev); } while (0)\n"
          "#define LAUNCHED(kernel, bytes) \\\n"
          "  do { \\\n"
          "    CHECK(rt_cuda_launched(dev, kernel)); \\\n"
          "    if (prof_) rt_cuda_prof_kernel(dev, kernel, bytes); \\\n"
          "  } while (0)\n"
          "#define F(offset) ((float *)(A + (offset)))   /* a value in the device arena */\n"
          "#define I(offset) ((int32_t *)(A + (offset)))\n"
          "/* a value stored as bf16 (codegen/cuda_store.h, cuda_arena.h) */\n"
          "#define H(offset) ((uint16_t *)(A + (offset)))\n"
          "/* the bf16 copy of the parameter at P + offset, which a GEMM reads\n"
          " * (RtCudaSetup.params_bf16, rt_cuda_params_to_bf16) */\n"
          "#define PB(offset) rt_cuda_params_bf16(dev, (offset))\n"
          "/* --save-grads: parameter gradient g (n floats, device) to offset off of io->grads */\n"
          "#define SAVE_GRAD(off, g, n) \\\n"
          "  do { if (io->grads) CHECK(rt_cuda_to_host(dev, io->grads + (off), (g), (n))); } "
          "while (0)\n\n",
          info->version, slash ? slash + 1 : src, m->name, nparams, m->nnodes,
          kp->nkernels, bf16 ? "bf16 products, fp32 accumulation" : "fp32",
          info->store->round ? "rounded to bf16 in fp32 buffers (--bf16-store round)"
                             : "stored as bf16",
          info->store->count, info->store->elements,
          info->store->round ? "the kernels that store them are the _bf16r ones"
                             : "the kernels that store or read them are the _bf16 ones, H(offset)",
          arena,
          lp->params_numel, lp->state_numel, m->mesh_tp > 1 ? m->mesh_tp : 1,
          m->mesh_dp > 1 ? m->mesh_dp : 1, info->pipe ? info->pipe->nstages : 1,
          m->mesh_ep > 1 ? m->mesh_ep : 1, bf16 ? "RT_CUDA_GEMM_BF16" : "RT_CUDA_GEMM_FP32",
          bf16 ? "bf16" : "fp32");
  if (info->pipe) emit_pipe_cuda(&e, info, slot, batch, seq);
  else emit_step(&e, batch, seq);
  emit_gemm_table(&e, info->pipe ? info->pipe->nstages : 1);
  free(e.gemms);
  int rc = e.failed ? -1 : 0;
  if (!rc) {
    CgHostInfo di = *info;
    di.desc_extra = "    .to_host = to_host,\n    .start = start,\n";
    rc = cg_emit_host_desc(out, m, lp, &di, err, errlen);
  }
  free(temp_off);
  free(grad_of);
  return rc;
}
