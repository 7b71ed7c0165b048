/* codegen/report.c -- human-readable compile report.
 *
 * Bytes per parameter: fp32 training keeps weights, gradients (4 each) and
 * Adam's two moments (8): 16.  bf16 mixed precision keeps bf16 weights and
 * gradients (2 each), an fp32 master copy (4) and fp32 Adam moments (8):
 * also 16, as in the ZeRO paper's accounting. */
#include "codegen/report.h"

#include <inttypes.h>

static const char *bytes(char *buf, size_t len, double b) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) b /= 1024, u++;
  snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

static const char *flops(char *buf, size_t len, double f) {
  static const char *const unit[] = {"", "K", "M", "G", "T", "P", "E"};
  int u = 0;
  while (f >= 1000 && u < 6) f /= 1000, u++;
  snprintf(buf, len, "%.3f %sFLOP", f, unit[u]);
  return buf;
}

static void row(FILE *out, const char *what, double p, double w, double g, double master,
                double opt) {
  char a[32], b[32], c[32], d[32], e[32];
  fprintf(out, "    %-11s weights %10s  grads %10s  master %10s  adam %10s  total %10s\n", what,
          bytes(a, sizeof a, p * w), bytes(b, sizeof b, p * g), bytes(c, sizeof c, p * master),
          bytes(d, sizeof d, p * opt), bytes(e, sizeof e, p * (w + g + master + opt)));
}

/* The pipeline section (--pp above 1): per stage its chunks' layers, FLOPs
 * and activations of one microbatch, the simulated peak of stashed
 * activations, and the bubble simulated next to the analytic value. */
static void pipeline(FILE *out, const PpPlan *p, int tp) {
  const PpStages *st = &p->st;
  const PpSim *sim = &p->sim;
  int P = st->nstages, V = st->nvirtual;
  char a[32], b[32], c[32], d[32], e[32];
  fprintf(out, "pipeline: %s, %d stages", pp_schedule_name[p->req.schedule], P);
  if (V > 1) fprintf(out, " x %d virtual (%d chunks, chunk c on stage c %% %d)", V, st->nchunks, P);
  fprintf(out, ", %d microbatches\n", st->microbatches);
  fprintf(out, "  simulated at %.0f TFLOP/s per rank, %.0f GB/s and %.0f us a transfer between "
          "stages\n", PP_SIM_FLOPS_PER_S / 1e12, PP_SIM_LINK_BYTES_PER_S / 1e9,
          PP_SIM_LINK_LATENCY_S * 1e6);
  if (tp > 1)
    fprintf(out, "  (FLOPs are per tp rank; stashed activations are whole over the tp group, an "
            "upper bound)\n");
  for (int s = 0; s < P; s++) {
    fprintf(out, "  stage %d:%s", s, V > 1 ? "\n" : "");
    for (int k = s; k < st->nchunks; k += P) {
      const PpChunk *ch = &st->chunks[k];
      if (V > 1) fprintf(out, "    chunk %d:", k);
      fprintf(out, " layers %d-%d%s%s, %" PRId64 " parameters\n", ch->first_layer,
              ch->first_layer + ch->nlayers - 1, ch->embedding ? " + embedding" : "",
              ch->head ? " + head and loss" : "", ch->params);
      fprintf(out, "    %sper microbatch: F %s, B %s, W %s; stash %s, sends %s\n",
              V > 1 ? "  " : "", flops(a, sizeof a, ch->flops_f), flops(b, sizeof b, ch->flops_b),
              flops(c, sizeof c, ch->flops_w), bytes(d, sizeof d, (double)ch->stash_bytes),
              bytes(e, sizeof e, (double)ch->boundary_bytes));
    }
    fprintf(out, "    peak %d microbatch%s in flight: %s of activations; busy %.4g of %.4g ms\n",
            sim->peak_inflight[s], V > 1 ? "-chunk(s)" : sim->peak_inflight[s] == 1 ? "" : "es",
            bytes(a, sizeof a, (double)sim->peak_stash_bytes[s]), sim->busy[s] * 1e3,
            sim->makespan * 1e3);
  }
  static const char *const formula[PP_NSCHEDULES] = {"(P-1)/M", "(P-1)/M", "(P-1)/(V M)",
                                                     "(P-1)(F+B-W)/(M(F+B+W))"};
  fprintf(out, "  bubble (idle / busy): simulated %.4f, analytic %.4f = %s\n", sim->bubble,
          p->analytic_bubble, formula[p->req.schedule]);
}

/* A predicted step time for one pipeline stage's ranks (pp = 1): the forward +
 * backward FLOPs split evenly over the tp x dp ranks at the simulator's
 * sustained rate, plus every collective of the rank-local plan at its ring
 * bytes over the simulator's link bandwidth and latency, without overlap.  A
 * model to compare layouts by, not a measurement. */
static const char *duration(char *buf, size_t len, double s) {
  static const char *const unit[] = {"s", "ms", "us", "ns"};
  int u = 0;
  while (s < 1 && s > 0 && u < 3) s *= 1000, u++;
  snprintf(buf, len, "%.4g %s", s, unit[u]);
  return buf;
}

static void predicted_step(FILE *out, const Layout *lay, const Cost *c) {
  double compute = 3 * c->flops_fwd / (lay->tp * lay->dp) / PP_SIM_FLOPS_PER_S, comm = 0;
  int n = 0;
  for (size_t g = 0; c->has_comm && g < sizeof c->comm.e / sizeof c->comm.e[0]; g++)
    for (int k = 0; k < COMM_KINDS; k++) {
      comm += c->comm.e[g][k].sent_bytes / PP_SIM_LINK_BYTES_PER_S +
              c->comm.e[g][k].count * PP_SIM_LINK_LATENCY_S;
      n += c->comm.e[g][k].count;
    }
  char a[32], b[32], d[32];
  if (!n) {
    fprintf(out, "predicted step time: %s (compute at %.0f TFLOP/s a rank; no communication)\n",
            duration(a, sizeof a, compute), PP_SIM_FLOPS_PER_S / 1e12);
    return;
  }
  fprintf(out, "predicted step time: %s = compute %s (%.0f TFLOP/s a rank) + %d collectives %s "
          "(%.0f GB/s, %.0f us each, not overlapped)\n", duration(a, sizeof a, compute + comm),
          duration(b, sizeof b, compute), PP_SIM_FLOPS_PER_S / 1e12, n,
          duration(d, sizeof d, comm), PP_SIM_LINK_BYTES_PER_S / 1e9, PP_SIM_LINK_LATENCY_S * 1e6);
}

void cg_report(FILE *out, const IrModule *m, const Layout *lay, const Cost *c) {
  char a[64], b[64];
  int ranks = lay->tp * lay->pp * lay->dp;
  fprintf(out, "model %s: %d layers, %d parameter tensors, %d IR nodes\n", m->name, m->nlayers,
          c->nparam_tensors, m->nnodes);
  fprintf(out, "parameters: %" PRId64 "\n", c->params);
  if (c->padding_params)
    fprintf(out, "vocab padding for --tp %d: %" PRId64 " -> %" PRId64 " rows, +%" PRId64
            " parameters\n", lay->tp, c->vocab, c->padded_vocab, c->padding_params);
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
    /* ZeRO-1: each dp rank keeps 1/dp of the optimizer state (and master) */
    double z = lay->zero >= 1 && lay->dp > 1 ? lay->dp : 1;
    row(out, "fp32", p, 4, 4, 0, 8 / z);
    row(out, "bf16 mixed", p, 2, 2, 4 / z, 8 / z);
    if (z > 1) fprintf(out, "    (--zero 1: optimizer state sharded over the %d dp ranks)\n", lay->dp);
  }
  static const char *const group[] = {"tp", "dp"};
  static const char *const kind[] = {"all-reduce", "all-gather", "reduce-scatter"};
  for (int g = 0; c->has_comm && g < 2; g++) {
    if (!c->comm.group_size[g]) continue;
    fprintf(out, "communication per step and rank, %s group of %d ranks:\n", group[g],
            c->comm.group_size[g]);
    for (int k = 0; k < COMM_KINDS; k++) {
      const CommEntry *e = &c->comm.e[g][k];
      char p[32], s[32];
      if (e->count)
        fprintf(out, "    %-15s %4d x, payload %10s, sent %10s (ring)\n", kind[k], e->count,
                bytes(p, sizeof p, e->payload_bytes), bytes(s, sizeof s, e->sent_bytes));
    }
  }
  if (c->has_comm && c->comm.a2a_count) {
    char p[32], s[32];
    fprintf(out, "communication per step and rank, ep group of %d ranks:\n", c->comm.a2a_group);
    fprintf(out, "    %-15s %4d x, payload %10s, sent %10s (at most: filled slots only)\n",
            "all-to-all", c->comm.a2a_count, bytes(p, sizeof p, c->comm.a2a_payload_bytes),
            bytes(s, sizeof s, c->comm.a2a_sent_bytes));
  }
  if (c->arena_bytes)
    fprintf(out, "activation arena (planned, fp32): %s (%" PRId64 " bytes), allocated exactly by "
            "the trainer\n", bytes(a, sizeof a, (double)c->arena_bytes), c->arena_bytes);
  if (c->pipe) pipeline(out, c->pipe, lay->tp);
  else if (c->tokens && (c->has_comm || lay->tp * lay->dp == 1)) predicted_step(out, lay, c);
}
