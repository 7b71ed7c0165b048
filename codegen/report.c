/* codegen/report.c -- human-readable compile report.
 *
 * Bytes per parameter: fp32 training keeps weights, gradients (4 each) and
 * Adam's two moments (8): 16.  bf16 mixed precision keeps bf16 weights and
 * gradients (2 each), an fp32 master copy (4) and fp32 Adam moments (8):
 * also 16, as in the ZeRO paper's accounting. */
#include "codegen/report.h"

#include <inttypes.h>
#include <stdlib.h>

const char *cg_bytes_text(char *buf, size_t len, double b) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) b /= 1024, u++;
  snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

static const char *bytes(char *buf, size_t len, double b) { return cg_bytes_text(buf, len, b); }

static const char *flops(char *buf, size_t len, double f) {
  static const char *const unit[] = {"", "K", "M", "G", "T", "P", "E"};
  int u = 0;
  while (f >= 1000 && u < 6) f /= 1000, u++;
  snprintf(buf, len, "%.3f %sFLOP", f, unit[u]);
  return buf;
}

/* "989 TFLOP/s", "123 GFLOP/s"; "3.00 TB/s", "8.00 GB/s" */
static const char *rate(char *buf, size_t len, double r, const char *what) {
  static const char *const unit[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (r >= 1000 && u < 5) r /= 1000, u++;
  snprintf(buf, len, "%.3g %s%s/s", r, unit[u], what);
  return buf;
}

/* The norms the backward recomputes (passes/remat_norm.c: the only norms
 * in its phases), and the pointwise values (passes/remat_act.c), if any.
 * (m is the report's module, sharded only with -o: the gathers --sp runs
 * again are counted in the communication lines, which see the shards.) */
static void recomputed(FILE *out, const IrModule *m) {
  unsigned char *seen = calloc((size_t)m->nnodes + 1, 1); /* per layer (fewer than nodes) */
  int n = 0, layers = 0;
  for (int i = 0; seen && i < m->nnodes; i++) {
    const IrNode *x = m->nodes[i];
    if (!ir_op_is_norm(x->op) || !ir_backward(x)) continue;
    n++;
    if (x->layer >= 0 && !seen[x->layer]) seen[x->layer] = 1, layers++;
  }
  free(seen);
  if (n && !m->remat_layers) /* (the norms of the layers run again are theirs) */
    fprintf(out, "recomputed in the backward (--recompute norms): %d norm outputs in %d layers, "
            "not kept from the forward (each a [tokens, d] value at the peak; one more kernel "
            "each, and with --sp one more all-gather)\n", n, layers);
  if (m->remat_layers)
    fprintf(out, "recomputed in the backward (--recompute layers): %d layers, their forward's "
            "%d values run again before each layer's backward (only the layers' inputs kept "
            "from the forward; about a third more compute)\n", m->remat_layers,
            m->remat_layer_nodes);
  if (m->remat_act)
    fprintf(out, "recomputed in the backward (--recompute pointwise): %d pointwise values, "
            "not kept from the forward (from values the backward keeps anyway)\n",
            m->remat_act);
}

static void row(FILE *out, const char *what, double p, double w, double g, double master,
                double opt) {
  char a[32], b[32], c[32], d[32], e[32];
  fprintf(out, "    %-11s weights %10s  grads %10s  master %10s  adam %10s  total %10s\n", what,
          bytes(a, sizeof a, p * w), bytes(b, sizeof b, p * g), bytes(c, sizeof c, p * master),
          bytes(d, sizeof d, p * opt), bytes(e, sizeof e, p * (w + g + master + opt)));
}

static const char *duration(char *buf, size_t len, double s);

/* --stage-layers memory: the split chosen, against the one balanced by FLOPs
 * it started from (driver/main.c, passes/stage_search.c). */
static void split_search(FILE *out, const PpPlan *p, int nchunks) {
  const PpSplitSearch *r = p->req.search;
  int64_t most[3] = {0, 0, 0}; /* chosen, start, least */
  for (int s = 0; s < p->st.nstages && s < PP_MAX_STAGES; s++) {
    if (r->best.stage_bytes[s] > most[0]) most[0] = r->best.stage_bytes[s];
    if (r->start.stage_bytes[s] > most[1]) most[1] = r->start.stage_bytes[s];
    if (r->least.stage_bytes[s] > most[2]) most[2] = r->least.stage_bytes[s];
  }
  char a[32], b[32], c[32], d[32];
  fprintf(out, "  layers per %s chosen for memory (--stage-layers memory): ",
          p->st.nvirtual > 1 ? "chunk" : "stage");
  for (int k = 0; k < nchunks; k++) fprintf(out, "%s%d", k ? "," : "", p->req.stage_layers[k]);
  fprintf(out, ", the largest rank %s", bytes(a, sizeof a, (double)most[0]));
  if (most[2] != most[0])
    fprintf(out, " (the fastest split found within %g%% of the least, %s)", PP_SPLIT_SLACK * 100,
            bytes(a, sizeof a, (double)most[2]));
  fprintf(out, " against %s split by FLOPs (", bytes(b, sizeof b, (double)most[1]));
  for (int k = 0; k < nchunks; k++) fprintf(out, "%s%d", k ? "," : "", p->req.time_layers[k]);
  fprintf(out, "), predicted step %s against %s; %d splits planned%s\n",
          duration(c, sizeof c, r->best.step_s), duration(d, sizeof d, r->start.step_s), r->evals,
          r->capped ? ", stopped at the limit" : "");
}

/* The pipeline section (--pp above 1): per stage its chunks' layers, FLOPs
 * and boundary bytes of one microbatch, the simulated peak of microbatches
 * in flight, and the bubble simulated next to the analytic value.  The
 * activations are the planned arena's where g holds it (g->nstages: the
 * GPU trainer's slots, a rank's, as it allocates them), else the schedule's
 * estimate from pass_stages (whole over the tp group, 4 bytes an element). */
static void pipeline(FILE *out, const PpPlan *p, const GpuBytes *g, int tp, int bf16) {
  const PpStages *st = &p->st;
  const PpSim *sim = &p->sim;
  int P = st->nstages, V = st->nvirtual, planned = g->nstages == P && g->slot > 0;
  char a[32], b[32], c[32], d[32], e[32];
  fprintf(out, "pipeline: %s, %d stages", pp_schedule_name[p->req.schedule], P);
  if (V > 1) fprintf(out, " x %d virtual (%d chunks, chunk c on stage c %% %d)", V, st->nchunks, P);
  fprintf(out, ", %d microbatches\n", st->microbatches);
  if (p->req.memory && p->req.search && p->req.time_layers) /* --stage-layers memory */
    split_search(out, p, st->nchunks);
  if (p->kernel_timed)
    fprintf(out, "  simulated with each chunk's kernels timed as the predicted step below, "
            "%s and %.3g us a transfer between stages\n",
            rate(b, sizeof b, p->link_bytes_per_s, "B"), p->latency_s * 1e6);
  else
    fprintf(out, "  simulated at %s per rank (the machine's GEMM rate), %s and %.3g us a "
            "transfer between stages\n", rate(a, sizeof a, p->flops_per_s, "FLOP"),
            rate(b, sizeof b, p->link_bytes_per_s, "B"), p->latency_s * 1e6);
  if (planned)
    fprintf(out, "  activations (planned, a rank's, as %s): slots of up to %s (%" PRId64
            " bytes), each a microbatch's values, as many on a stage as it holds at once, each "
            "stage's as large as its values reach; FLOPs are per tp rank\n",
            g->arena ? "the GPU trainer allocates them, bf16 values at 2 bytes"
                     : "the trainers allocate them",
            bytes(a, sizeof a, (double)g->slot), g->slot);
  else {
    if (tp > 1)
      fprintf(out, "  (FLOPs are per tp rank; stashed activations are whole over the tp group, "
              "an upper bound)\n");
    if (bf16)
      fprintf(out, "  (stashed activations: the schedule's estimate, at 4 bytes an element; "
              "what each stage's rank allocates, most values bf16, is the \"GPU trainer\" "
              "lines above)\n");
  }
  for (int s = 0; s < P; s++) {
    fprintf(out, "  stage %d:%s", s, V > 1 ? "\n" : "");
    for (int k = s; k < st->nchunks; k += P) {
      const PpChunk *ch = &st->chunks[k];
      if (V > 1) fprintf(out, "    chunk %d:", k);
      fprintf(out, " layers %d-%d%s%s, %" PRId64 " parameters\n", ch->first_layer,
              ch->first_layer + ch->nlayers - 1, ch->embedding ? " + embedding" : "",
              ch->head ? " + head and loss" : "", ch->params);
      fprintf(out, "    %sper microbatch: F %s, B %s, W %s; ", V > 1 ? "  " : "",
              flops(a, sizeof a, ch->flops_f), flops(b, sizeof b, ch->flops_b),
              flops(c, sizeof c, ch->flops_w));
      if (!planned) fprintf(out, "stash %s, ", bytes(d, sizeof d, (double)ch->stash_bytes));
      fprintf(out, "sends %s", bytes(e, sizeof e, (double)ch->boundary_bytes));
      if (p->timing[k].send_bytes != ch->boundary_bytes) /* cg_pipe_step_model's bf16 values */
        fprintf(out, " (the GPU trainer's, bf16 values: %s)",
                bytes(e, sizeof e, (double)p->timing[k].send_bytes));
      fprintf(out, "\n");
    }
    fprintf(out, "    peak %d microbatch%s in flight", sim->peak_inflight[s],
            V > 1 ? "-chunk(s)" : sim->peak_inflight[s] == 1 ? "" : "es");
    if (planned && s < PP_MAX_STAGES)
      fprintf(out, ", %d slot%s of %s; a microbatch's values at most %s live in its slot",
              g->stage_slots[s], g->stage_slots[s] == 1 ? "" : "s",
              bytes(b, sizeof b, (double)g->stage_slot[s]),
              bytes(a, sizeof a, (double)g->stage_live[s]));
    else
      fprintf(out, ": %s of activations", bytes(a, sizeof a, (double)sim->peak_stash_bytes[s]));
    fprintf(out, "; busy %.4g of %.4g ms\n", sim->busy[s] * 1e3, sim->makespan * 1e3);
  }
  static const char *const formula[PP_NSCHEDULES] = {"(P-1)/M", "(P-1)/M", "(P-1)/(V M)",
                                                     "(P-1)(F+B-W)/(M(F+B+W))"};
  fprintf(out, "  bubble (idle / busy): simulated %.4f, analytic %.4f = %s\n", sim->bubble,
          p->analytic_bubble, formula[p->req.schedule]);
}

static const char *duration(char *buf, size_t len, double s) {
  static const char *const unit[] = {"s", "ms", "us", "ns"};
  int u = 0;
  while (s < 1 && s > 0 && u < 3) s *= 1000, u++;
  snprintf(buf, len, "%.4g %s", s, unit[u]);
  return buf;
}

/* The consecutive world ranks a group spans (ranks: tp fastest, then dp,
 * then pp; ep is ep consecutive dp ranks, ep_dp every ep-th). */
static int group_span(const Layout *lay, int g) {
  const int span[COMM_GROUPS] = {lay->tp, lay->tp * lay->dp, lay->tp * lay->ep, lay->tp * lay->dp,
                                 lay->tp * lay->dp * lay->pp};
  return span[g];
}

/* The time of one rank's collectives in cc on mc, as the GPU trainer runs
 * them (gpu: where they differ; NULL: as planned) (groups with skip_pp: all
 * but the pp group, whose transfers the pipeline simulation holds); the dp
 * group's part into *dp_s, the count into *n. */
static double comm_time(const Layout *lay, const CommCost *cc, const CommGpu *gpu,
                        const Machine *mc, int skip_pp, double *dp_s, int *n) {
  double total = 0;
  *dp_s = 0, *n = 0;
  for (int g = 0; g < COMM_GROUPS - (skip_pp ? 1 : 0); g++) {
    double link = machine_link_bytes_per_s(mc, group_span(lay, g)), t = 0;
    for (int k = 0; k < COMM_KINDS; k++) {
      t += cc->e[g][k].sent_bytes / link + cc->e[g][k].count * mc->latency_s;
      *n += cc->e[g][k].count;
    }
    if (gpu) {
      t += (gpu->sums[g] - gpu->fused[g]) * mc->latency_s - gpu->saved_bytes[g] / link;
      *n += gpu->sums[g] - gpu->fused[g];
    }
    total += t;
    if (g == 1) *dp_s = t;
  }
  if (cc->a2a_count) { /* at their upper bound: every slot filled */
    total += cc->a2a_sent_bytes / machine_link_bytes_per_s(mc, group_span(lay, 2)) +
             cc->a2a_count * mc->latency_s;
    *n += cc->a2a_count;
  }
  return total;
}

void cg_predict_step(const Layout *lay, const Cost *c, CgPredicted *o) {
  const Machine *mc = c->machine ? c->machine : machine_default;
  int p = c->bf16 ? 1 : 0;
  double model = 3 * c->flops_fwd / ((double)lay->tp * lay->dp * (c->pipe ? lay->pp : 1)), dp_s = 0;
  *o = (CgPredicted){0};
  const PpPlan *pl = c->pipe ? c->pipe : c->accum;
  if (pl) { /* the simulated schedule, the optimizer, the busiest stage's collectives */
    o->pipeline_s = pl->sim.makespan, o->opt_s = pl->opt_s;
    o->compute_s = o->pipeline_s + o->opt_s;
    for (int s = 0; c->has_comm && c->stage_comm && s < c->nstage_comm; s++) {
      int k;
      double t = comm_time(lay, &c->stage_comm[s], s < PP_MAX_STAGES ? &pl->stage_comm[s] : NULL,
                           mc, 1, &dp_s, &k);
      if (t > o->comm_s) o->comm_s = t, o->collectives = k;
    }
    if (c->has_comm && !c->stage_comm) /* one stage: the rank's collectives */
      o->comm_s = comm_time(lay, &c->comm, &pl->stage_comm[0], mc, 1, &dp_s, &o->collectives);
  } else {
    o->compute_s = c->step.valid ? c->step.fwd_s + c->step.bwd_s + c->step.opt_s
                                 : model / mc->gemm_flops[p];
    if (c->has_comm)
      o->comm_s = comm_time(lay, &c->comm, c->step.valid ? &c->step.comm : NULL, mc, 0, &dp_s,
                            &o->collectives);
    if (c->overlap_dp && c->step.valid) o->hidden_s = dp_s < c->step.bwd_s ? dp_s : c->step.bwd_s;
  }
  o->total_s = o->compute_s + o->comm_s - o->hidden_s;
  o->mfu = o->total_s > 0 ? model / o->total_s / mc->peak_flops[p] : 0;
}

/* A pipelined trainer's predicted step (cg_predict_step with c->pipe or
 * c->accum). */
static void predicted_pipe_step(FILE *out, const Layout *lay, const Cost *c) {
  const Machine *mc = c->machine ? c->machine : machine_default;
  int prec = c->bf16 ? 1 : 0;
  CgPredicted pr;
  cg_predict_step(lay, c, &pr);
  char a[32], b[32], d[32], e[32], r[32];
  int acc = !c->pipe; /* a routed model's microbatches accumulated on one stage */
  fprintf(out, "predicted step time on %s (%s): %s, %.1f%% MFU (of %s)\n  = %s %s + "
          "optimizer %s%s", mc->name, prec ? "bf16 mixed" : "fp32",
          duration(a, sizeof a, pr.total_s), 100 * pr.mfu,
          rate(r, sizeof r, mc->peak_flops[prec], "FLOP"),
          acc ? "the microbatches (kernel by kernel)" : "pipeline",
          duration(b, sizeof b, pr.pipeline_s), duration(d, sizeof d, pr.opt_s),
          acc ? "" : " (the slowest stage's)");
  if (pr.collectives)
    fprintf(out, " + %d collective%s %s (%s, not overlapped)", pr.collectives,
            pr.collectives == 1 ? "" : "s", duration(e, sizeof e, pr.comm_s),
            acc ? "tp/dp/ep" : "the busiest stage's tp/dp/ep");
  fprintf(out, "\n");
}

/* The predicted step time (cg_predict_step) and what it is made of. */
static void predicted_step(FILE *out, const Layout *lay, const Cost *c) {
  const Machine *mc = c->machine ? c->machine : machine_default;
  int p = c->bf16 ? 1 : 0;
  CgPredicted pr;
  cg_predict_step(lay, c, &pr);
  char a[32], b[32], d[32], e[32], f[32], g[32], h[32], r1[32], r2[32], r3[32];
  fprintf(out, "predicted step time on %s (%s): %s, %.1f%% MFU (of %s)\n", mc->name,
          p ? "bf16 mixed" : "fp32", duration(a, sizeof a, pr.total_s), 100 * pr.mfu,
          rate(r1, sizeof r1, mc->peak_flops[p], "FLOP"));
  const StepTime *st = &c->step;
  if (st->valid) {
    fprintf(out, "  compute %s: GEMMs %s (%s at %s)", duration(a, sizeof a, pr.compute_s),
            duration(b, sizeof b, st->gemm_s), flops(d, sizeof d, st->gemm_flops),
            rate(r1, sizeof r1, mc->gemm_flops[p], "FLOP"));
    if (st->attn_flops > 0)
      fprintf(out, ", attention %s (%s at %s)", duration(e, sizeof e, st->attn_s),
              flops(f, sizeof f, st->attn_flops), rate(r2, sizeof r2, mc->attn_flops[p], "FLOP"));
    fprintf(out, ",\n    memory-bound %s (%d calls in all moving %s at %s, %.3g us a call)\n",
            duration(g, sizeof g, st->mem_s), st->calls, bytes(h, sizeof h, st->bytes),
            rate(r3, sizeof r3, mc->mem_bytes_per_s, "B"), mc->kernel_s * 1e6);
  }
  else
    fprintf(out, "  compute %s: %s at %s (no kernel plan: FLOPs only)\n",
            duration(a, sizeof a, pr.compute_s),
            flops(b, sizeof b, 3 * c->flops_fwd / (lay->tp * lay->dp)),
            rate(r1, sizeof r1, mc->gemm_flops[p], "FLOP"));
  if (pr.collectives)
    fprintf(out, "  communication %s: %d collective%s (%s within a node, %s between nodes of %d "
            "ranks, %.3g us each)%s%s%s\n", duration(a, sizeof a, pr.comm_s), pr.collectives,
            pr.collectives == 1 ? "" : "s",
            rate(r1, sizeof r1, mc->intra_bytes_per_s, "B"),
            rate(r2, sizeof r2, mc->inter_bytes_per_s, "B"), mc->ranks_per_node,
            mc->latency_s * 1e6, pr.hidden_s > 0 ? ";\n    " : "",
            pr.hidden_s > 0 ? duration(b, sizeof b, pr.hidden_s) : "",
            pr.hidden_s > 0 ? " of the dp part hidden behind the backward" : "");
}

static const char *const comm_group[COMM_GROUPS] = {"tp", "dp", "ep", "ep_dp", "pp"};

/* The GPU trainer's collectives where they differ from the table's (CommGpu),
 * a line a group; stage as communication's. */
static void communication_gpu(FILE *out, const CommGpu *d, int stage) {
  for (int g = 0; g < COMM_GROUPS; g++) {
    const int bf16 = d->sums[g] || d->gathers[g] || d->sends[g];
    if (!bf16 && !d->fused[g]) continue;
    char s[32], at[48] = "";
    if (stage >= 0) snprintf(at, sizeof at, " (a rank of stage %d)", stage);
    fprintf(out, "GPU trainer%s%s, %s group: ", bf16 ? " (bf16)" : "", at, comm_group[g]);
    if (d->sums[g])
      fprintf(out, "%d all-reduces store their sums as bf16 (each a reduce-scatter of the f32 "
              "partials and an all-gather of the bf16 pieces)%s", d->sums[g],
              d->gathers[g] || d->sends[g] ? ", " : "");
    if (d->gathers[g])
      fprintf(out, "%d all-gathers move bf16 values%s", d->gathers[g], d->sends[g] ? ", " : "");
    if (d->sends[g]) fprintf(out, "%d sends move bf16 values", d->sends[g]);
    if (d->fused[g])
      fprintf(out, "%sthe loss's cross-entropy is computed in its gradient's call, which "
              "gathers the statistics once for both: %d collective%s fewer", bf16 ? "; " : "",
              d->fused[g], d->fused[g] == 1 ? "" : "s");
    fprintf(out, "%s %s less sent a step\n", bf16 ? ":" : ",",
            bytes(s, sizeof s, d->saved_bytes[g]));
  }
}

/* The collectives one rank runs a step (stage >= 0: a rank of that pipeline
 * stage), by group and kind, as passes/comm_cost.c counts them. */
static void communication(FILE *out, const CommCost *cc, int stage) {
  static const char *const kind[COMM_KINDS] = {"all-reduce", "all-gather", "reduce-scatter",
                                               "send", "receive"};
  for (int g = 0; g < COMM_GROUPS; g++) {
    int a2a = g == 2 ? cc->a2a_count : 0; /* the expert all-to-alls run on the ep group */
    if (!cc->group_size[g] && !a2a) continue;
    if (stage >= 0) fprintf(out, "communication per step, a rank of stage %d, ", stage);
    else fprintf(out, "communication per step and rank, ");
    fprintf(out, "%s group of %d ranks:\n", comm_group[g], a2a ? cc->a2a_group : cc->group_size[g]);
    for (int k = 0; k < COMM_KINDS; k++) {
      const CommEntry *e = &cc->e[g][k];
      char p[32], s[32];
      if (e->count)
        fprintf(out, "    %-15s %4d x, payload %10s, sent %10s (%s)\n", kind[k], e->count,
                bytes(p, sizeof p, e->payload_bytes), bytes(s, sizeof s, e->sent_bytes),
                k >= COMM_SEND ? "point to point" : "ring");
    }
    if (a2a) {
      char p[32], s[32];
      fprintf(out, "    %-15s %4d x, payload %10s, sent %10s (at most: filled slots only)\n",
              "all-to-all", a2a, bytes(p, sizeof p, cc->a2a_payload_bytes),
              bytes(s, sizeof s, cc->a2a_sent_bytes));
    }
  }
}

/* ---- mixture of experts ----------------------------------------------------
 * A dispatch writes each token's choices into an [experts, C, d_model]
 * buffer, C slots an expert; the expert GEMMs run over every slot, filled or
 * not, and under ep the buffer is what each all-to-all moves.  C is the
 * capacity: the lowering's ceil(factor x tokens x top_k / experts), at most
 * the tokens, for the tokens one dispatch routes (the whole microbatch over
 * every dp rank); dropless when it reaches them.  A rank's buffer holds
 * min(C, its own tokens) slots an expert (passes/shard.c rule_dispatch): a
 * rank can never fill more.  With M microbatches the capacity is that of a
 * microbatch's tokens: ceil(ceil(f t k / E) / M) = ceil(f (t / M) k / E). */
int cg_moe_layers(const IrModule *m, const Layout *lay, int microbatches, int whole_batch,
                  CgMoeLayer *out, int max) {
  int M = microbatches > 1 ? microbatches : 1, split = whole_batch ? M : 1, backward = 0, n = 0;
  int dp = lay->dp > 1 ? lay->dp : 1, ep = lay->ep > 1 ? lay->ep : 1;
  int sharded = m->mesh_dp > 1 ? m->mesh_dp : 1; /* the dp the module is already split over */
  for (int i = 0; i < m->nnodes; i++) backward |= m->nodes[i]->phase == IR_PHASE_B;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *d = m->nodes[i];
    if (d->op != IR_OP_DISPATCH || d->phase != IR_PHASE_FWD) continue;
    const IrNode *x = d->inputs[0], *idx = d->inputs[1];
    int64_t t = x->shape[0] * sharded, cap;
    if (idx->op == IR_OP_CAPACITY_DROP) cap = idx->ia[1]; /* dropping over the dp group */
    else cap = sharded > 1 ? t : d->ia[1];                  /* sharded without a drop: dropless */
    t /= split;
    cap = (cap + split - 1) / split;
    if (cap > t) cap = t;
    if (cap < 1) cap = 1;
    if (n < max) {
      CgMoeLayer *l = &out[n];
      int64_t tokens = t / dp, D = ir_numel(x) / x->shape[0];
      *l = (CgMoeLayer){.layer = d->layer, .experts = d->ia[0], .top_k = idx->shape[1],
                        .d_model = D, .microbatches = M, .batch_tokens = t, .tokens = tokens,
                        .dropless = cap >= t, .capacity = cap,
                        .rank_capacity = cap < tokens ? cap : tokens, .ep = ep};
      l->dispatch_bytes = 4.0 * (double)l->experts * (double)l->rank_capacity * (double)D;
      l->dropless_bytes = 4.0 * (double)l->experts * (double)tokens * (double)D;
      if (ep > 1) {
        l->a2a_count = M * (backward ? 4 : 2);
        l->a2a_payload_bytes = l->a2a_count * l->dispatch_bytes;
        l->a2a_sent_bytes = l->a2a_payload_bytes * (ep - 1) / ep;
      }
    }
    n++;
  }
  return n;
}

static int moe_same(const CgMoeLayer *a, const CgMoeLayer *b) {
  return a->experts == b->experts && a->top_k == b->top_k && a->d_model == b->d_model &&
         a->microbatches == b->microbatches && a->batch_tokens == b->batch_tokens &&
         a->tokens == b->tokens && a->dropless == b->dropless && a->capacity == b->capacity &&
         a->rank_capacity == b->rank_capacity && a->ep == b->ep && a->a2a_count == b->a2a_count;
}

/* The microbatches a step routes: the pipeline's, else (pp 1) the driver's
 * (Cost.microbatches: the train section's or --microbatches, which a routed
 * model honours on one stage too, passes/pp_plan.c), else the train section's. */
static int step_microbatches(const IrModule *m, const Cost *c) {
  if (c->pipe) return c->pipe->st.microbatches;
  if (c->microbatches > 0) return c->microbatches;
  const IrSetting *s = ir_setting(m->train, m->ntrain, "microbatches");
  return s && !s->is_float && !s->sym && s->i > 1 && s->i < (1 << 20) ? (int)s->i : 1;
}

/* The MoE section: per run of identical layers, the capacity, the dispatch
 * buffer a rank holds against the dropless worst case, and the all-to-all. */
static void moe(FILE *out, const IrModule *m, const Layout *lay, const Cost *c) {
  int M = step_microbatches(m, c);
  int n = cg_moe_layers(m, lay, M, 1, NULL, 0);
  if (!n) return;
  CgMoeLayer *v = calloc((size_t)n, sizeof *v);
  if (!v) return;
  cg_moe_layers(m, lay, M, 1, v, n);
  char a[32], b[32], e[32];
  double buf = 0, worst = 0, payload = 0, sent = 0;
  int count = 0, xtp = 0; /* xtp: the tp degree each expert is split over */
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    if (p->op == IR_OP_PARAM && p->shard == IR_SHARD_EXPERT && p->shard_degree > 1)
      xtp = p->shard_degree;
  }
  fprintf(out, "mixture of experts, per rank (dispatch buffers: experts x slots x d_model, "
          "fp32):\n");
  for (int i = 0, j; i < n; i = j) {
    const CgMoeLayer *l = &v[i];
    for (j = i + 1; j < n && moe_same(&v[j], l) && v[j].layer == v[j - 1].layer + 1; j++) {}
    for (int k = i; k < j; k++) {
      buf += v[k].dispatch_bytes, worst += v[k].dropless_bytes;
      payload += v[k].a2a_payload_bytes, sent += v[k].a2a_sent_bytes, count += v[k].a2a_count;
    }
    if (l->layer < 0) fprintf(out, "  outside the layers:");
    else if (j - i == 1) fprintf(out, "  layer %d:", l->layer);
    else fprintf(out, "  layers %d-%d:", l->layer, v[j - 1].layer);
    fprintf(out, " %" PRId64 " experts, top-%" PRId64 ", d_model %" PRId64 "; ", l->experts,
            l->top_k, l->d_model);
    const char *what = M > 1 ? "a microbatch" : "the batch";
    if (l->tokens == l->batch_tokens) fprintf(out, "a rank routes %s's %" PRId64 " tokens", what,
                                              l->tokens);
    else fprintf(out, "a rank routes %" PRId64 " of %s's %" PRId64 " tokens", l->tokens, what,
                 l->batch_tokens);
    if (M > 1) fprintf(out, " (%d microbatches a step)", M);
    fprintf(out, "\n");
    if (l->dropless) {
      fprintf(out, "    capacity: dropless; a rank's buffer has a slot for each of its tokens in "
              "every expert\n");
    } else {
      double balanced = (double)l->batch_tokens * (double)l->top_k / (double)l->experts;
      fprintf(out, "    capacity: %" PRId64 " slots an expert for %s (%.3g x the balanced %.4g "
              "= tokens x top-k / experts); a rank's buffer holds min(%" PRId64 ", its %" PRId64
              " tokens) = %" PRId64 "\n", l->capacity, what, (double)l->capacity / balanced,
              balanced, l->capacity, l->tokens, l->rank_capacity);
    }
    fprintf(out, "    dispatch buffer %" PRId64 " x %" PRId64 " x %" PRId64 " = %s, dropless "
            "worst case %" PRId64 " x %" PRId64 " x %" PRId64 " = %s: %.3f of it\n", l->experts,
            l->rank_capacity, l->d_model, bytes(a, sizeof a, l->dispatch_bytes), l->experts,
            l->tokens, l->d_model, bytes(b, sizeof b, l->dropless_bytes),
            l->dropless_bytes > 0 ? l->dispatch_bytes / l->dropless_bytes : 1.0);
    int64_t slots = l->experts * l->rank_capacity, filled = l->tokens * l->top_k;
    if (filled > slots) filled = slots;
    fprintf(out, "    slots filled: at most %" PRId64 " of %" PRId64 " (%.3f); the expert GEMMs "
            "run over all of them\n", filled, slots,
            slots ? (double)filled / (double)slots : 0.0);
    if (l->ep > 1)
      fprintf(out, "    all-to-all, ep group of %d: the buffer out, its %" PRId64 " experts' %"
              PRId64 " x %" PRId64 " x %" PRId64 " slots in; %d a step (dispatch, combine%s), "
              "%s each: %s a step, sent at most %s\n", l->ep, l->experts / l->ep,
              l->experts / l->ep, l->ep * l->rank_capacity, l->d_model, l->a2a_count,
              l->a2a_count > 2 * M ? " and their gradients" : "",
              bytes(a, sizeof a, l->dispatch_bytes), bytes(b, sizeof b, l->a2a_payload_bytes),
              bytes(e, sizeof e, l->a2a_sent_bytes));
    else
      fprintf(out, "    no all-to-all: ep 1, every rank holds all %" PRId64 " experts\n",
              l->experts);
    if (xtp > 1)
      fprintf(out, "    each expert split over tp %d (w1, w3 by hidden output, w2 by hidden "
              "input): a rank holds 1/%d of its experts' weights; one tp all-reduce of the "
              "combined output (and one of its input's gradient)\n", xtp, xtp);
  }
  if (n > 1) {
    fprintf(out, "  all %d MoE layers%s: dispatch buffers %s (dropless worst case %s)", n,
            lay->pp > 1 ? " (over the stages)" : "", bytes(a, sizeof a, buf),
            bytes(b, sizeof b, worst));
    if (count)
      fprintf(out, "; %d all-to-alls a step, %s, sent at most %s", count,
              bytes(e, sizeof e, payload), bytes(a, sizeof a, sent));
    fprintf(out, "\n");
  }
  free(v);
}

/* Expert parameters one rank of stage st holds (experts / ep of each expert
 * tensor of its layers): m is the global module, or the rank-local one whose
 * expert tensors already hold experts / ep. */
static double expert_share(const IrModule *m, const Layout *lay, const Cost *c,
                           const StageCost *st) {
  double n = 0;
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *p = m->nodes[i];
    if (p->op != IR_OP_PARAM || p->shard != IR_SHARD_EXPERT) continue;
    if (c->nstages > 1 &&
        (p->layer < st->first_layer || p->layer >= st->first_layer + st->nlayers))
      continue;
    /* the rank-local module's already hold their share (ep_degree, shard_degree) */
    int local = p->ep_degree > 1 || p->shard_degree > 1;
    n += (double)ir_numel(p) / (local || lay->ep < 1 ? 1 : lay->ep) /
         (local || p->shard_dim < 0 || lay->tp < 1 ? 1 : lay->tp);
  }
  return n;
}

/* 1 if m keeps norm outputs from the forward that --recompute norms would
 * recompute (passes/remat_norm.c): the backward reads a forward norm of a
 * repeat, or its forward group_copy, all_gather (--sp) or reshape, and
 * recomputes none.  (m is the report's module, sharded only with -o.) */
static int norms_kept(const IrModule *m) {
  unsigned char *norm = calloc((size_t)m->nnodes + 1, 1); /* a norm's value, forward */
  int kept = 0;
  for (int i = 0; norm && i < m->nnodes; i++) {
    const IrNode *x = m->nodes[i];
    int is = ir_op_is_norm(x->op);
    if (is && ir_backward(x)) {
      kept = 0; /* recomputed already */
      break;
    }
    if (x->phase == IR_PHASE_FWD)
      norm[i] = (is && x->layer >= 0) ||
                ((x->op == IR_OP_GROUP_COPY || x->op == IR_OP_RESHAPE ||
                  x->op == IR_OP_ALL_GATHER) &&
                 norm[x->inputs[0]->id]);
    else if (ir_backward(x))
      for (int j = 0; j < x->ninputs; j++) kept |= norm[x->inputs[j]->id];
  }
  free(norm);
  return kept;
}

/* ": N% of a GPU's X (machine)" or what to change where `device` bytes do
 * not fit the machine's GPU (recompute: bit 1, --recompute norms would
 * help; bit 2, the backward recomputes no pointwise value: --recompute
 * pointwise might; bit 4, tp without --sp: sequence parallelism would split
 * the values outside the tp regions; bit 8, the layers' forward is not run
 * again: --recompute layers keeps only their inputs); nothing where the
 * machine gives no memory. */
static void gpu_fit(FILE *out, int64_t device, const Machine *mc, int stages, int recompute) {
  static const char *const hint[4] = {
      "",
      "--recompute norms (the layers' norm outputs computed again in the backward, not kept; "
      "with --sp, gathered again), ",
      "--recompute pointwise (the layers' pointwise values the backward reads, gelu(h) or "
      "silu(g) * u, computed again there, not kept), ",
      "--recompute all (the layers' norm outputs and pointwise values the backward reads "
      "computed again there, not kept; with --sp, the norms gathered again), "};
  char cap[32];
  double share = mc->device_bytes > 0 ? (double)device / mc->device_bytes : 0;
  bytes(cap, sizeof cap, mc->device_bytes);
  if (share > 1)
    fprintf(out, ": does not fit a GPU's %s (%s): %.0f%% of it; use more tp or pp ranks, %s%s%s%sor a "
            "smaller batch (-D batch=N)", cap, mc->name, 100 * share,
            stages ? "more microbatches (--microbatches M), " : "",
            recompute & 4 ? "--sp (sequence parallelism: the norms and the residual stream "
                            "split over the tp ranks), " : "",
            hint[recompute & 3],
            recompute & 8 ? "--recompute layers (each layer's forward run again in the "
                            "backward, only the layers' inputs kept: about a third more "
                            "compute), " : "");
  else if (share > 0)
    fprintf(out, ": %.1f%% of a GPU's %s (%s)", 100 * share, cap, mc->name);
  fputc('\n', out);
}

/* The device bytes the GPU trainer plans for a rank (passes.h GpuBytes),
 * which its start-up check compares with the GPU's free memory: one line,
 * or one a stage for a pipeline's stage programs. */
static void gpu_device(FILE *out, const IrModule *m, const Layout *lay, const Cost *c) {
  const GpuBytes *g = &c->gpu;
  const Machine *mc = c->machine ? c->machine : machine_default;
  const char *what = "(parameters, optimizer state, arena, batch, workspaces; CUDA's, "
                     "cuBLASLt's and NCCL's own aside), checked against free memory at start";
  /* (a zero-bubble stage holds its W inputs to the end: the pointwise copies,
   * made in B, live as long as what they replace, passes/remat_act.c) */
  int zb = c->pipe && c->pipe->req.schedule == PP_ZB_H1;
  int kept = norms_kept(m) | (!m->remat_act && !zb && remat_act_candidates(m) ? 2 : 0) |
             (lay->tp > 1 && !c->sp ? 4 : 0) | (!m->remat_layers && m->nlayers > 0 ? 8 : 0);
  char a[32];
  if (g->nstages <= 1) {
    fprintf(out, "GPU trainer: %s (%" PRId64 " bytes) of device memory a rank %s",
            bytes(a, sizeof a, (double)g->device), g->device, what);
    gpu_fit(out, g->device, mc, g->nstages, kept);
    return;
  }
  fprintf(out, "GPU trainer: device memory a rank of each stage %s:\n", what);
  for (int s = 0; s < g->nstages && s < PP_MAX_STAGES; s++) {
    fprintf(out, "    stage %d: %s (%" PRId64 " bytes)", s,
            bytes(a, sizeof a, (double)g->stage_device[s]), g->stage_device[s]);
    gpu_fit(out, g->stage_device[s], mc, g->nstages, kept);
  }
}

void cg_report(FILE *out, const IrModule *m, const Layout *lay, const Cost *c) {
  char a[64], b[64];
  int ranks = lay->tp * lay->pp * lay->dp;
  fprintf(out, "model %s: %d layers, %d parameter tensors, %d IR nodes\n", m->name, m->nlayers,
          c->nparam_tensors, m->nnodes);
  fprintf(out, "parameters: %" PRId64 "\n", c->params);
  if (m->pad_dropped)
    fprintf(out, "vocab padding: none (the default --pad-vocab was dropped: the model needs "
            "the vocabulary dimension whole, %s; give --pad-vocab N to insist)\n",
            m->pad_dropped);
  if (c->padding_params)
    fprintf(out, "vocab padding to a multiple of %d (--pad-vocab %d, --tp %d): %" PRId64 " -> %"
            PRId64 " rows, +%" PRId64 " parameters\n", (m->pad_vocab > 1 ? m->pad_vocab : 1) *
            lay->tp, m->pad_vocab > 1 ? m->pad_vocab : 1, lay->tp, c->vocab, c->padded_vocab,
            c->padding_params);
  if (c->tokens) {
    double t = (double)c->tokens;
    fprintf(out, "flops per token: %s forward+backward (attention %s)\n",
            flops(a, sizeof a, 3 * c->flops_fwd / t), flops(b, sizeof b, 3 * c->flops_attn_fwd / t));
    fprintf(out, "flops per step: %s over %" PRId64 " tokens\n", flops(a, sizeof a, 3 * c->flops_fwd),
            c->tokens);
  }
  fprintf(out, "layout: tp %d, pp %d, dp %d, ep %d: %d rank%s\n", lay->tp, lay->pp, lay->dp,
          lay->ep, ranks, ranks == 1 ? "" : "s");
  for (int s = 0; s < c->nstages; s++) {
    const StageCost *st = &c->stages[s];
    double p = (double)st->params;
    fprintf(out, "  ");
    if (c->nstages > 1) fprintf(out, "stage %d, ", s);
    if (st->nlayers) fprintf(out, "layers %d-%d, ", st->first_layer, st->first_layer + st->nlayers - 1);
    else fprintf(out, "no layers, ");
    fprintf(out, "per rank: %" PRId64 " parameters\n", st->params);
    /* ZeRO-1: each dp rank keeps 1/dp of the dense optimizer state (and master),
     * and 1/(dp/ep) of its experts' (sharded over their ep_dp group) */
    int zero = lay->zero >= 1 && lay->dp > 1;
    double pe = zero ? expert_share(m, lay, c, st) : 0, ez = lay->ep > 1 ? lay->dp / lay->ep : lay->dp;
    double z = zero && p > 0 ? p / ((p - pe) / lay->dp + pe / ez) : 1; /* p over the kept */
    row(out, "fp32", p, 4, 4, 0, 8 / z);
    row(out, "bf16 mixed", p, 2, 2, 4 / z, 8 / z);
    if (zero && pe > 0 && ez > 1)
      fprintf(out, "    (--zero 1: optimizer state sharded over the %d dp ranks, the experts' "
              "over their %g ep_dp ranks)\n", lay->dp, ez);
    else if (zero && pe > 0)
      fprintf(out, "    (--zero 1: optimizer state sharded over the %d dp ranks; the experts' "
              "whole on their rank, ep = dp)\n", lay->dp);
    else if (zero)
      fprintf(out, "    (--zero 1: optimizer state sharded over the %d dp ranks)\n", lay->dp);
  }
  const PpPlan *pl = c->pipe ? c->pipe : c->accum;
  if (c->has_comm && c->stage_comm)
    for (int st = 0; st < c->nstage_comm; st++) {
      communication(out, &c->stage_comm[st], st);
      if (pl && st < PP_MAX_STAGES) communication_gpu(out, &pl->stage_comm[st], st);
    }
  else if (c->has_comm) {
    communication(out, &c->comm, -1);
    if (pl) communication_gpu(out, &pl->stage_comm[0], -1);
    else if (c->step.valid) communication_gpu(out, &c->step.comm, -1);
  }
  moe(out, m, lay, c);
  recomputed(out, m);
  if (c->arena_bytes)
    fprintf(out, "activation arena (planned, fp32%s): %s (%" PRId64 " bytes), allocated exactly "
            "by the trainer\n", c->gpu.nstages > 1 ? "; the largest stage's" : "",
            bytes(a, sizeof a, (double)c->arena_bytes), c->arena_bytes);
  if (c->arena_bytes && c->gpu.arena)
    fprintf(out, "GPU trainer (bf16): %sactivation arena %s (%" PRId64 " bytes): the values it "
            "stores as bf16 at 2 bytes an element\n",
            c->gpu.nstages > 1 ? "the largest stage's " : "",
            bytes(a, sizeof a, (double)c->gpu.arena), c->gpu.arena);
  if (c->arena_bytes && c->gpu.gemm_ws)
    fprintf(out, "GPU trainer (bf16): + %s (%" PRId64 " bytes) of bf16 GEMM operand copies "
            "(weights included)%s, allocated at start\n",
            bytes(a, sizeof a, (double)c->gpu.gemm_ws), c->gpu.gemm_ws,
            c->gpu.nstages > 1 ? " (the stage needing most; a stage's own, per stage below)"
                               : "");
  if (c->arena_bytes && c->gpu.reduce_ws)
    fprintf(out, "GPU trainer (bf16): + %s (%" PRId64 " bytes) of f32 scratch for the all-reduces "
            "whose sums it stores as bf16, allocated at start\n",
            bytes(a, sizeof a, (double)c->gpu.reduce_ws), c->gpu.reduce_ws);
  if (c->arena_bytes && c->gpu.attn_dq_ws)
    fprintf(out, "GPU trainer (bf16): + %s (%" PRId64 " bytes) of f32 scratch for attention's "
            "dq partial sums (the fused backward), allocated at start\n",
            bytes(a, sizeof a, (double)c->gpu.attn_dq_ws), c->gpu.attn_dq_ws);
  if (c->arena_bytes && c->gpu.device) gpu_device(out, m, lay, c);
  if (c->pipe) {
    pipeline(out, c->pipe, &c->gpu, lay->tp, c->bf16);
    predicted_pipe_step(out, lay, c);
  } else if (c->accum) predicted_pipe_step(out, lay, c);
  else if (c->tokens && (c->has_comm || lay->tp * lay->dp == 1)) predicted_step(out, lay, c);
}
