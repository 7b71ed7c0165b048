/* codegen/step_model.c -- a rank's predicted compute time a step
 * (codegen/step_model.h). */
#include "codegen/step_model.h"
#include "codegen/arena_plan.h"

#include "codegen/host.h"
#include "codegen/cuda_batch.h"
#include "codegen/cuda_store.h"
#include "codegen/host_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* n's bytes; stored: the values held as bf16 (cg_step_times), or NULL */
static double node_bytes(const IrNode *n, const unsigned char *stored) {
  return (stored && stored[n->id] ? 2.0 : 4.0) * (double)ir_numel(n);
}

/* A collective or a rank-coordinate op: communication, not compute. */
static int is_comm(IrOp op) {
  switch (op) {
  case IR_OP_ALL_REDUCE: case IR_OP_GROUP_COPY: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER:
  case IR_OP_REPLICATE: case IR_OP_EXPERT_ALL_TO_ALL:
    return 1;
  default:
    return 0;
  }
}

/* FLOPs of a runtime op's products (0 for a memory-bound op); *attn set
 * when they run at the attention rate. */
static double op_flops(const IrNode *n, int *attn) {
  *attn = 0;
  const IrNode *a = n->ninputs ? n->inputs[0] : NULL;
  switch (n->op) {
  case IR_OP_MATMUL: /* a[..., m, k] */
    return 2.0 * (double)ir_numel(n) * (double)a->shape[a->rank - 1];
  case IR_OP_MATMUL_TA: /* a[..., k, m] */
    return 2.0 * (double)ir_numel(n) * (double)a->shape[a->rank - 2];
  case IR_OP_ATTENTION:
  case IR_OP_ATTENTION_GRAD: {
    const IrSdpaDims d = ir_sdpa_dims(n);
    double f = 4.0 * (double)d.B * (double)d.H * (double)d.T * (double)d.T * (double)d.hd;
    if (n->ia[0]) f *= 0.5; /* causal */
    *attn = 1;
    return n->op == IR_OP_ATTENTION ? f : 2.5 * f;
  }
  default:
    return 0;
  }
}

/* What a call costs more for splitting over threads: its largest value or
 * operand (bytes) reaches the machine's parallel_min_elements. */
static double split_cost(const Machine *mc, double largest_bytes) {
  return mc->parallel_call_s > 0 && largest_bytes / 4 >= mc->parallel_min_elements
             ? mc->parallel_call_s : 0;
}

/* The time of generated kernel k (0 for a reshape, a range of a bucket or a
 * bucket assembled, the host aliases); a batch
 * member's (member: it runs in another's launch) without the call's cost. */
static double kernel_time(const IrModule *m, const CgKernelPlan *kp, const Machine *mc, int k,
                          const unsigned char *stored, int member, StepTime *st) {
  const CgKernel *kr = &kp->kernels[k];
  if ((kr->nnodes == 1 && kp->view_of[kr->nodes[0]] >= 0) || kr->range_view || kr->assembles)
    return 0;
  /* an argument larger than every value the kernel computes is read in
   * part (a slice of a flat gradient bucket): count at most that much */
  double bytes = 0, cap = 0;
  for (int j = 0; j < kr->nnodes; j++)
    if (node_bytes(m->nodes[kr->nodes[j]], stored) > cap)
      cap = node_bytes(m->nodes[kr->nodes[j]], stored);
  for (int a = 0; a < kr->nargs; a++) {
    int id = kr->arg_node[a];
    double b = id >= 0 ? node_bytes(m->nodes[id], stored) : 4.0 * (double)kp->temps[-1 - id].numel;
    bytes += cap > 0 && b > cap ? cap : b;
  }
  st->bytes += bytes;
  /* a batch member (cuda_batch.h) is part of its batch's call: its bytes only */
  return (member ? 0 : mc->kernel_s + split_cost(mc, cap)) + bytes / mc->mem_bytes_per_s;
}

/* The time of runtime op n (0 for a leaf, a collective or a generated
 * kernel's node); *kind 0 memory-bound, 1 GEMM, 2 attention.  tp: the
 * module's tp degree (m->mesh_tp; 0 or 1: one rank). */
static double op_time(const IrNode *n, const Machine *mc, int p, const unsigned char *stored,
                      int tp, int onto, int *kind, StepTime *st) {
  *kind = 0;
  if (n->op == IR_OP_ALL_REDUCE && stored && stored[n->id]) {
    /* rt_cuda_all_reduce_bf16: a pass rounding the member's piece of the f32
     * sum (4 bytes read and 2 written an element) */
    double piece = (double)ir_numel(n) / (double)(n->ia[1] > 1 ? n->ia[1] : 1);
    st->bytes += 6 * piece;
    return mc->kernel_s + split_cost(mc, 4 * piece) + 6 * piece / mc->mem_bytes_per_s;
  }
  if (n->op == IR_OP_GROUP_COPY) { /* (the GPU trainer copies the value: rt_cuda_copy) */
    double bytes = 2 * node_bytes(n, stored);
    st->bytes += bytes;
    return mc->kernel_s + split_cost(mc, bytes / 2) + bytes / mc->mem_bytes_per_s;
  }
  if (!cg_runtime_op(n->op) || is_comm(n->op)) return 0;
  double bytes = node_bytes(n, stored), big = node_bytes(n, stored);
  if (onto) { /* an embedding's gradient onto another term (codegen/grad_onto.h): the
               * rows of its ids read and written, not the table zeroed and written */
    const double rows = 4.0 * (double)ir_numel(n->inputs[1]);
    bytes = 2 * (rows < bytes ? rows : bytes);
  }
  for (int j = 0; j < n->ninputs; j++) {
    int again = 0; /* an operand given twice is read once (sdpa's packed q|k|v) */
    for (int i = 0; i < j; i++) again |= n->inputs[i] == n->inputs[j];
    if (again) continue;
    double b = node_bytes(n->inputs[j], stored);
    /* an embedding reads the table's rows its ids name, one a token, not
     * the table (as rt_cuda_embedding's profile counts it) */
    if (j == 1 && (n->op == IR_OP_EMBEDDING || n->op == IR_OP_VOCAB_EMBEDDING) &&
        4.0 * (double)ir_numel(n) < b)
      b = 4.0 * (double)ir_numel(n);
    bytes += b;
    if (b > big) big = b;
  }
  /* a vocabulary-parallel cross-entropy over several members reads the logits
   * once more for its gathered statistics (the row maxima, then the sums),
   * each pass a kernel of its own (runtime/cuda/rt_cuda_ops.cu); one member
   * takes its statistics in the pass that uses them */
  if ((n->op == IR_OP_VOCAB_CROSS_ENTROPY || n->op == IR_OP_VOCAB_CROSS_ENTROPY_GRAD) && tp > 1)
    bytes += (n->op == IR_OP_VOCAB_CROSS_ENTROPY ? 1 : 2) * node_bytes(n->inputs[0], stored);
  int attn;
  double f = op_flops(n, &attn), rate = attn ? mc->attn_flops[p] : mc->gemm_flops[p];
  double tf = f / rate, tm = bytes / mc->mem_bytes_per_s;
  st->bytes += bytes;
  if (attn) st->attn_flops += f;
  else st->gemm_flops += f;
  *kind = f > 0 ? 1 + attn : 0;
  return mc->kernel_s + split_cost(mc, big) + (tf > tm ? tf : tm);
}

/* The bf16 GPU trainer's copies of GEMM n's operands (rt_cuda_ws_plan.h: a
 * pass each over an operand not stored as bf16, 4 bytes read and 2 written an
 * element): their time, *calls of them.  None in fp32 (p 0). */
static double copy_time(const IrNode *n, const Machine *mc, int p, const unsigned char *stored,
                        int weights, int *calls, StepTime *st) {
  *calls = 0;
  if (!p || (n->op != IR_OP_MATMUL && n->op != IR_OP_MATMUL_TA)) return 0;
  RtCudaGemm g = cg_cuda_gemm(n);
  g.flags |= cg_cuda_stored_flags(n, stored, NULL, weights);
  int64_t need[3];
  rt_cuda_gemm_ws(&g, RT_CUDA_GEMM_BF16, RT_CUDA_OPERANDS_ALIGNED, need);
  double t = 0;
  for (int j = 0; j < 2; j++) {
    if (!need[j]) continue;
    double bytes = 6.0 * (double)ir_numel(n->inputs[j]);
    st->bytes += bytes;
    t += mc->kernel_s + split_cost(mc, 4.0 * (double)ir_numel(n->inputs[j])) +
         bytes / mc->mem_bytes_per_s;
    ++*calls;
  }
  return t;
}

/* Time of a memory-bound part of another call (a batch member): no call. */
static void add_bytes_time(StepTime *st, IrPhase phase, double t) {
  st->mem_s += t;
  if (phase == IR_PHASE_FWD) st->fwd_s += t;
  else if (phase == IR_PHASE_OPT) st->opt_s += t;
  else st->bwd_s += t;
}

static void add_call(StepTime *st, IrPhase phase, double t, int kind) {
  if (t == 0) return;
  st->calls++;
  double *by_kind[] = {&st->mem_s, &st->gemm_s, &st->attn_s};
  *by_kind[kind] += t;
  if (phase == IR_PHASE_FWD) st->fwd_s += t;
  else if (phase == IR_PHASE_OPT) st->opt_s += t;
  else st->bwd_s += t;
}

/* rt_cuda_params_to_bf16 over `params` floats: read 4, write 2 bytes each */
static double params_copy_s(const Machine *mc, double params) {
  return mc->kernel_s + split_cost(mc, 4 * params) + 6 * params / mc->mem_bytes_per_s;
}

void cg_step_times(const IrModule *m, const CgKernelPlan *kp, const Machine *mc, int bf16,
                   const CgCudaStore *store, const CgCudaBatches *batches, int unpipelined,
                   StepTime *st, double *node_s) {
  const unsigned char *stored = store ? store->bf16 : NULL;
  int weights = store ? store->weights : 0;
  *st = (StepTime){0};
  st->valid = 1;
  if (node_s)
    for (int i = 0; i < m->nnodes; i++) node_s[i] = 0;
  /* the params' bf16 copy (rt_cuda_params_to_bf16), first in the step;
   * where the optimizer's kernels store it (cuda_store.h mirror_all), their
   * 2 bytes an element, below */
  if (bf16 && cg_cuda_weights_read(m, weights) && !store->mirror_all) {
    double params = (double)cg_params_numel(m);
    st->bytes += 6 * params;
    add_call(st, IR_PHASE_FWD, params_copy_s(mc, params), 0);
  }
  for (int k = 0; k < kp->nkernels; k++) { /* generated kernels (a _stats one too), at roots */
    int r = kp->kernels[k].root;
    if (batches && batches->in_gemm[k] >= 0) { /* in its GEMM's call (cuda_batch.h) */
      const IrNode *vec, *aux, *res;
      cg_cuda_epilogue_parts(m, kp, k, batches->epi[k], &vec, &aux, &res);
      if (aux) { /* a GELU's input, written or read by the epilogue besides D */
        double b = (stored && stored[aux->id] ? 2 : 4) * (double)ir_numel(aux);
        st->bytes += b;
        add_bytes_time(st, m->nodes[r]->phase, b / mc->mem_bytes_per_s);
        if (node_s) node_s[batches->in_gemm[k]] += b / mc->mem_bytes_per_s;
      }
      continue;
    }
    int member = batches && batches->lead[k] >= 0 && batches->lead[k] != k;
    double t = kernel_time(m, kp, mc, k, stored, member, st);
    if (store && store->mirror[k] >= 0) { /* the params' bf16 copy, written */
      double copy = 2 * (double)ir_numel(m->nodes[store->mirror[k]]);
      st->bytes += copy;
      t += copy / mc->mem_bytes_per_s;
    }
    if (member) { /* in another's launch: no call */
      add_bytes_time(st, m->nodes[r]->phase, t);
      if (node_s) node_s[r] += t;
      continue;
    }
    add_call(st, m->nodes[r]->phase, t, 0);
    if (node_s) node_s[r] += t;
  }
  for (int i = 0; i < m->nnodes; i++) { /* runtime ops (a GEMM's operand copies first) */
    int kind = 0, copies = 0;
    if (kp->view_of[i] >= 0 && kp->kernel_of[i] < 0)
      continue; /* a view of its input (a group_copy): no call, as a reshape's kernel above */
    if (unpipelined && cg_cuda_xent_fused(m, i) >= 0) { /* in its gradient's call */
      if (m->mesh_tp > 1) comm_gpu_fused(&st->comm, m->nodes[i]); /* its gathers with it */
      continue;
    }
    double c = copy_time(m->nodes[i], mc, bf16 ? 1 : 0, stored, weights, &copies, st);
    for (int j = 0; j < copies; j++) add_call(st, m->nodes[i]->phase, c / copies, 0);
    double t = kp->kernel_of[i] >= 0
                   ? 0
                   : op_time(m->nodes[i], mc, bf16 ? 1 : 0, stored, m->mesh_tp,
                             kp->onto && kp->onto[i] >= 0, &kind, st);
    add_call(st, m->nodes[i]->phase, t, kind);
    if (node_s) node_s[i] += c + t;
    if (stored && stored[i]) comm_gpu_bf16(&st->comm, m->nodes[i], 1);
  }
}

void cg_step_model(const IrModule *m, const CgKernelPlan *kp, const Machine *mc, int bf16,
                   const CgCudaStore *store, const CgCudaBatches *batches, StepTime *st) {
  cg_step_times(m, kp, mc, bf16, store, batches, 1, st, NULL);
}

int cg_pipe_step_model(IrModule *m, const PpProgram *pp, int fuse, const Machine *mc, int bf16,
                       int store, int batch, PpPlan *plan, char *err, size_t len) {
  /* planned as cg_write_project plans a pipelined module: fused within a
   * (chunk, phase) colour, the values it stores as bf16 and the kernels its
   * GEMMs' calls compute (cuda_batch.h) from that plan */
  double *t = calloc((size_t)m->nnodes + 1, sizeof *t);
  if (!t) {
    snprintf(err, len, "out of memory");
    return -1;
  }
  CgStepPlan sp;
  if (cg_plan_whole_step(m, fuse, pp, bf16, store, batch, &sp, err, len)) {
    free(t);
    return -1;
  }
  const CgCudaStore *stored = &sp.store;
  StepTime st;
  cg_step_times(m, &sp.kp, mc, bf16, stored, &sp.batches, 0, &st, t);
  for (int c = 0; c < plan->st.nchunks; c++)
    plan->timing[c].f = plan->timing[c].b = plan->timing[c].w = 0;
  /* the optimizer: each stage updates the parameters it holds (an owned
   * node runs on its parameter's holders, a shared one on every stage), the
   * stages at once; the step waits for the slowest */
  double opt[PP_MAX_STAGES] = {0};
  int P = pp->nstages < PP_MAX_STAGES ? pp->nstages : PP_MAX_STAGES;
  memset(plan->stage_comm, 0, sizeof plan->stage_comm);
  for (int i = 0; i < m->nnodes; i++) {
    int c = pp->chunk[i];
    IrPhase ph = m->nodes[i]->phase;
    /* (a chunk's nodes run on stage chunk % P, once a microbatch: comm_analyze_pipe) */
    if (c >= 0 && ph != IR_PHASE_OPT && stored->bf16[i])
      comm_gpu_bf16(&plan->stage_comm[c % P], m->nodes[i], pp->microbatches);
    if (ph == IR_PHASE_OPT || c == PP_NODE_OPT) {
      int own = pp->opt_owner ? pp->opt_owner[i] : -1;
      uint64_t on = own >= 0 && pp->holders[own] ? pp->holders[own] : ~(uint64_t)0;
      for (int s = 0; s < P; s++)
        if (on >> s & 1) opt[s] += t[i];
    } else if (c >= 0 && c < plan->st.nchunks) {
      PpTiming *tc = &plan->timing[c];
      *(ph == IR_PHASE_FWD ? &tc->f : ph == IR_PHASE_B ? &tc->b : &tc->w) += t[i];
    }
  }
  /* the values sent between chunks that the GPU trainer stores as bf16
   * (codegen/cuda_store.h): their transfers move 2 bytes an element, chunk c's
   * activations from its stage, their gradients back from chunk c + 1's */
  for (int c = 0; c + 1 < pp->nchunks && c < plan->st.nchunks; c++) {
    int64_t saved = 0;
    for (int pass = 0; pass < 2; pass++) {
      const int *v = pass ? pp->grad[c] : pp->act[c];
      int nv = pass ? pp->ngrad[c] : pp->nact[c], from = (pass ? c + 1 : c) % P;
      for (int k = 0; k < nv; k++) {
        if (!stored->bf16[v[k]]) continue;
        int64_t less = 2 * ir_numel(m->nodes[v[k]]);
        plan->stage_comm[from].sends[COMM_PP] += pp->microbatches;
        plan->stage_comm[from].saved_bytes[COMM_PP] += (double)less * pp->microbatches;
        if (!pass) saved += less;
      }
    }
    PpTiming *tc = &plan->timing[c];
    int64_t whole = plan->st.chunks[c].boundary_bytes; /* (an estimate: at most it) */
    tc->send_bytes = whole - (saved < whole ? saved : whole);
    tc->send = plan->latency_s + (double)tc->send_bytes / plan->link_bytes_per_s;
  }
  /* each stage's params' bf16 copy, first in its step, outside the schedule
   * as the optimizer is: counted with it (where the kernels that update the
   * params store it, its bytes are in theirs: cuda_store.h mirror_all) */
  for (int s = 0; s < P && bf16 && cg_cuda_weights_read(m, stored->weights) && !stored->mirror_all;
       s++)
    opt[s] += params_copy_s(mc, (double)pp->stage_params_numel[s]);
  plan->opt_s = 0;
  for (int s = 0; s < P; s++)
    if (opt[s] > plan->opt_s) plan->opt_s = opt[s];
  free(t);
  cg_step_plan_free(&sp);
  plan->kernel_timed = 1;
  return pp_plan_simulate(plan, err, len);
}
