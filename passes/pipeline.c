/* passes/pipeline.c -- the pass list, in order.  The IR verifier runs after
 * every pass when asked (tests and debug builds). */
#include <string.h>

#include "passes/passes.h"

typedef struct {
  const char *name;
  int (*run)(IrModule *m);
} Pass;

/* Averages the gradients over data-parallel ranks, on a module pass_shard
 * made for dp > 1 (the driver runs pass_shard between dce and autodiff,
 * because it needs the degrees and reports the layout's errors itself). */
static int dp_grads(IrModule *m) { return m->mesh_dp > 1 ? pass_dp_grads(m, m->mesh_dp) : 0; }

static const Pass passes[] = {
    {"intent", pass_intent},       /* sharding intents -> tensor dimensions */
    {"dce", pass_dce},             /* drop what the loss does not need */
    {"autodiff", pass_autodiff},   /* gradients of the loss, B/W phases */
    {"remat_layer", pass_remat_layer}, /* --recompute layers: each layer's forward again */
    {"remat_norm", pass_remat_norm}, /* --recompute norms: layers' norms again in the backward */
    {"remat_act", pass_remat_act}, /* --recompute pointwise: gelu(h), silu(g) * u likewise */
    {"attn_delta", pass_attn_delta}, /* sdpa_grad from lse and D: sdpa's out dies early */
    {"gelu_epilogue", pass_gelu_epilogue}, /* bf16: GELU's input kept, its grad at dg's GEMM */
    {"remat", pass_remat},         /* a bias add recomputed in the backward, not stored */
    {"dp_grads", dp_grads},        /* data-parallel gradient averaging */
    {"optimizer", pass_optimizer}, /* clipping and the update, as IR */
    {"attn_layout", pass_attn_layout}, /* attention in token-major: no head copies */
    {"slice_sink", pass_slice_sink}, /* slices above pointwise ops: no pass to store them */
};

#define NPASSES ((int)(sizeof passes / sizeof passes[0]))

const char *pass_name(int i) { return i >= 0 && i < NPASSES ? passes[i].name : NULL; }

static int verify(IrModule *m, const char *after) {
  char why[512];
  if (ir_verify(m, why, sizeof why) == 0) return 0;
  fprintf(stderr, "parc: internal error: IR invalid after %s: %s\n", after, why);
  return -1;
}

int pass_run_all(IrModule *m, const PassOptions *opt) {
  int first = 0;
  for (int i = 0; opt->start_after && i < NPASSES; i++)
    if (!strcmp(opt->start_after, passes[i].name)) first = i + 1;
  if (!first && opt->verify && verify(m, "lowering")) return -1;
  if (!first && opt->dump_after && !strcmp(opt->dump_after, "lower")) ir_print(opt->dump, m);
  for (int i = first; i < NPASSES; i++) {
    if (passes[i].run == dp_grads) { /* the dp options, as dp_grads reads them */
      m->mesh_zero = opt->zero >= 1 && m->mesh_dp > 1 ? m->mesh_dp : 0;
      m->dp_bucket_bytes = opt->bucket_bytes;
      m->dp_blocking = opt->no_overlap;
    }
    int skip = (passes[i].run == pass_attn_delta && opt->keep_attn_out) ||
               (passes[i].run == pass_attn_layout && opt->head_major_attn) ||
               (passes[i].run == pass_remat_norm && !opt->recompute_norms) ||
               (passes[i].run == pass_remat_act && !opt->recompute_pointwise) ||
               (passes[i].run == pass_remat_layer && !opt->recompute_layers);
    if (!skip && passes[i].run(m)) {
      fprintf(stderr, "parc: internal error: pass %s failed\n", passes[i].name);
      return -1;
    }
    if (opt->verify && verify(m, passes[i].name)) return -1;
    if (opt->dump_after && !strcmp(opt->dump_after, passes[i].name)) ir_print(opt->dump, m);
    if (opt->stop_after && !strcmp(opt->stop_after, passes[i].name)) break;
  }
  return 0;
}
