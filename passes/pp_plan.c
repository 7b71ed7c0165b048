/* passes/pp_plan.c -- the pipeline request (checked against the model,
 * defaults filled in) and the plan: stages, schedule, checked simulation.
 *
 * Defaults: --schedule 1f1b; --microbatches: the train section's
 * `microbatches` when above 1 (gradient accumulation the model asks for
 * anyway), else P (the fewest every schedule accepts); --virtual-stages 2
 * for interleaved, 1 otherwise.
 *
 * Routed models (pp_split_matters: MoE's top-k and dispatch see a whole
 * microbatch at once, for the load-balancing statistics and the capacity)
 * compute a different function for each split of the batch, so for them
 * the microbatches are part of the model: M is the train section's value
 * (or --microbatches) on every layout, never defaulted to P, and with
 * pp == 1 and M > 1 the trainer is a one-stage pipeline (gradient
 * accumulation over the M microbatches) rather than one whole-batch step.
 *
 * Durations for the simulation, on the request's machine (passes/machine.h;
 * the default without one): a chunk's FLOPs at the machine's GEMM rate for
 * the model's precision (memory-bound kernels not counted); a boundary
 * transfer: the machine's latency + bytes over the link between two
 * adjacent stages (ranks tp dp apart: one node when 2 tp dp ranks fit). */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

static int64_t train_int(const IrModule *m, const char *name, int64_t def) {
  const IrSetting *s = ir_setting(m->train, m->ntrain, name);
  return s && !s->is_float && !s->sym ? s->i : def;
}

int pp_split_matters(const IrModule *m) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_TOPK || m->nodes[i]->op == IR_OP_DISPATCH) return 1;
  return 0;
}

int pp_request_check(const IrModule *m, const Layout *lay, PpRequest *req, FILE *err) {
  int P = lay->pp, L = m->nlayers, bad = 0;
  const char *sched = pp_schedule_name[req->schedule];
  int wants_pipe = req->emit && (!strcmp(req->emit, "timeline") || !strcmp(req->emit, "trace"));
  int routed = pp_split_matters(m);
  int64_t batch = train_int(m, "batch", 1) / lay->dp, from_train = train_int(m, "microbatches", 1);
  if (P == 1) {
    /* a routed model honours its microbatches on one stage too (one-stage
     * pipeline); a dense one ignores them (accumulation changes nothing) */
    const char *flag = req->schedule_given ? "--schedule"
                       : req->microbatches && !routed ? "--microbatches"
                       : req->virtual_stages ? "--virtual-stages" : req->stage_layers || req->memory ? "--stage-layers"
                       : NULL;
    if (flag) fprintf(err, "parc: error: %s needs a pipeline: add --pp 2 or more\n", flag), bad++;
    if (wants_pipe)
      fprintf(err, "parc: error: --emit %s draws a pipeline schedule: add --pp 2 or more\n",
              req->emit), bad++;
    if (!routed || bad) return bad;
    int given = req->microbatches > 0;
    if (!given) req->microbatches = from_train > 1 ? (int)from_train : 1;
    req->schedule = PP_1F1B;
    req->virtual_stages = 1;
    if (batch % req->microbatches) {
      fprintf(err, "parc: error: %s%d must divide the batch per data-parallel rank (%lld "
              "sequences)\n", given ? "--microbatches " : "microbatches = ", req->microbatches,
              (long long)batch);
      bad++;
    } else if (req->microbatches > 1 && L == 0) {
      fprintf(err, "parc: error: %d microbatches of a routed model need its layers in a "
              "repeat (the accumulating trainer is a one-stage pipeline)\n", req->microbatches);
      bad++;
    }
    return bad;
  }
  if (!req->schedule_given) req->schedule = PP_1F1B;
  sched = pp_schedule_name[req->schedule];
  if (L < P) return 0; /* layout_check has said so */
  if (req->virtual_stages > 1 && req->schedule != PP_INTERLEAVED) {
    fprintf(err, "parc: error: --virtual-stages %d needs --schedule interleaved (%s runs one "
            "chunk per stage)\n", req->virtual_stages, sched);
    return 1;
  }
  if (req->schedule == PP_INTERLEAVED && !req->virtual_stages) req->virtual_stages = 2;
  if (!req->virtual_stages) req->virtual_stages = 1;
  int V = req->virtual_stages;
  if ((int64_t)P * V > L) { /* also keeps P * V within int below */
    fprintf(err, "parc: error: --pp %d with --virtual-stages %d makes %lld chunks, more than the "
            "%d layers\n", P, V, (long long)P * V, L);
    return 1;
  }
  int n = P * V;
  if (req->schedule == PP_INTERLEAVED && V < 2) {
    fprintf(err, "parc: error: --schedule interleaved needs --virtual-stages 2 or more (with 1 "
            "it is --schedule 1f1b)\n");
    return 1;
  }
  if (req->stage_layers) {
    int sum = 0;
    for (int i = 0; i < req->nstage_layers; i++) sum += req->stage_layers[i];
    if (req->nstage_layers != n) {
      if (V > 1)
        fprintf(err, "parc: error: --stage-layers has %d entries; --pp %d with --virtual-stages "
                "%d needs one per chunk: %d\n", req->nstage_layers, P, V, n);
      else
        fprintf(err, "parc: error: --stage-layers has %d entries; --pp %d needs %d\n",
                req->nstage_layers, P, P);
      bad++;
    } else if (sum != L) {
      fprintf(err, "parc: error: --stage-layers adds up to %d layers; the model has %d\n", sum, L);
      bad++;
    }
  } else if (req->schedule == PP_INTERLEAVED && L % n) {
    fprintf(err, "parc: error: --schedule interleaved with --pp %d --virtual-stages %d needs the "
            "%d layers to divide into %d equal chunks (or --stage-layers with %d entries)\n",
            P, V, L, n, n);
    bad++;
  }
  int given = req->microbatches > 0;
  /* a routed model's microbatches are part of the model: never defaulted to P */
  if (!given) req->microbatches = from_train > 1 ? (int)from_train : routed ? 1 : P;
  int M = req->microbatches;
  char src[96]; /* where M came from, for the messages */
  if (given) snprintf(src, sizeof src, "--microbatches %d", M);
  else if (from_train > 1 || routed) snprintf(src, sizeof src, "microbatches = %d (train section)", M);
  else snprintf(src, sizeof src, "%d microbatches (the default: --pp)", M);
  if (routed && !given && req->schedule != PP_GPIPE && M < P) {
    fprintf(err, "parc: error: %s routes tokens to experts per microbatch, so its microbatches "
            "are part of the model and are not defaulted to --pp: %s is fewer than --pp %d "
            "stages; set microbatches in the train section (or -D microbatches=%d, or "
            "--microbatches %d; the one-rank trainer then splits the batch alike)\n", m->name,
            src, P, P, P);
    bad++;
  } else if (batch % M) {
    fprintf(err, "parc: error: %s must divide the batch per data-parallel rank (%lld "
            "sequences)%s\n", src, (long long)batch, given ? "" : "; set --microbatches or "
            "-D batch=...");
    bad++;
  } else if (req->schedule != PP_GPIPE && M < P) {
    fprintf(err, "parc: error: --schedule %s needs at least as many microbatches as stages: %s "
            "is fewer than --pp %d\n", sched, src, P);
    bad++;
  } else if (req->schedule == PP_INTERLEAVED && M % P) {
    fprintf(err, "parc: error: --schedule interleaved needs the microbatches to be a multiple of "
            "--pp %d, as Megatron's schedule does; %s is not\n", P, src);
    bad++;
  }
  return bad;
}

void pp_plan_free(PpPlan *p) {
  pp_sim_free(&p->sim);
  pp_schedule_free(&p->sched);
  free(p->timing);
  p->timing = NULL;
}

int pp_plan(IrModule *m, const Layout *lay, const PpRequest *req, PpPlan *out, char *err,
            size_t len) {
  memset(out, 0, sizeof *out);
  out->req = *req;
  if (pass_stages(m, lay, req, &out->st, err, len)) return -1;
  const PpStages *st = &out->st;
  int P = st->nstages, V = st->nvirtual, M = st->microbatches;
  if (pp_schedule_build(req->schedule, P, V, M, &out->sched)) {
    snprintf(err, len, "schedule %s: cannot build for %d stages, %d chunks, %d microbatches",
             pp_schedule_name[req->schedule], P, st->nchunks, M);
    return -1;
  }
  out->timing = calloc((size_t)st->nchunks, sizeof *out->timing);
  if (!out->timing) {
    snprintf(err, len, "pipeline plan: out of memory");
    pp_plan_free(out);
    return -1;
  }
  const Machine *mc = req->machine ? req->machine : machine_default;
  double rate = mc->gemm_flops[machine_bf16(m)];
  double link = machine_link_bytes_per_s(mc, 2 * lay->tp * lay->dp);
  out->flops_per_s = rate, out->link_bytes_per_s = link, out->latency_s = mc->latency_s;
  for (int c = 0; c < st->nchunks; c++) {
    const PpChunk *k = &st->chunks[c];
    PpTiming *t = &out->timing[c];
    t->f = k->flops_f / rate;
    t->b = k->flops_b / rate;
    t->w = k->flops_w / rate;
    t->send_bytes = k->boundary_bytes;
    t->send = mc->latency_s + (double)k->boundary_bytes / link;
    t->stash_bytes = k->stash_bytes;
  }
  if (pp_plan_simulate(out, err, len)) {
    pp_plan_free(out);
    return -1;
  }
  return 0;
}

int pp_plan_simulate(PpPlan *p, char *err, size_t len) {
  const PpStages *st = &p->st;
  int P = st->nstages, V = st->nvirtual, M = st->microbatches;
  double tf = 0, tb = 0, tw = 0;
  for (int c = 0; c < st->nchunks; c++)
    tf += p->timing[c].f, tb += p->timing[c].b, tw += p->timing[c].w;
  PpSim sim;
  if (pp_simulate(&p->sched, p->timing, 0, &sim, err, len)) return -1;
  pp_sim_free(&p->sim);
  p->sim = sim;
  if (p->req.schedule == PP_ZB_H1)
    p->analytic_bubble = tf + tb + tw > 0 ? (P - 1) * (tf + tb - tw) / (M * (tf + tb + tw)) : 0;
  else
    p->analytic_bubble = (double)(P - 1) / ((double)V * M);
  return 0;
}
