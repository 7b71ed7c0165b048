/* tests/oracle/interp_train.c -- trains a model with parc's reference interpreter, for the
 * oracle to check: parc's whole semantic stack (prelude, lowering, autodiff, optimizer
 * pass, interpreter, runtime data order, learning-rate schedule, safetensors) run in
 * double precision, step by step, as the generated trainer will.
 *
 *   interp_train MODEL.dsl INIT.safetensors DATA OUT.safetensors [NAME=VALUE ...]
 *
 * NAME=VALUE override config and train values as parc's -D. Prints one JSON line of
 * settings ({"settings": {...}}: what torch_ref.py needs to run the same training), then
 * one {"step", "loss", "grad_norm", "lr"} line per step (%.17g), and writes the final
 * parameters (float32) to OUT. INIT "-" prints the settings only. Exit 0, or 1 with a
 * message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/build.h"
#include "frontend/lower.h"
#include "ir/interp.h"
#include "passes/passes.h"
#include "runtime/rt_data.h"
#include "runtime/rt_safetensors.h"
#include "runtime/rt_sched.h"

extern const char parc_prelude[];
extern const unsigned long parc_prelude_len;

static int die(const char *what) {
  fprintf(stderr, "interp_train: %s\n", what);
  return 1;
}

static double setting(const IrSetting *s, int n, const char *name, double dflt) {
  const IrSetting *x = ir_setting(s, n, name);
  return !x ? dflt : x->is_float ? x->f : (double)x->i;
}

static const IrNode *input_named(const IrModule *m, const char *name) {
  for (int k = 0; k < m->nnodes; k++)
    if (m->nodes[k]->op == IR_OP_INPUT && !strcmp(m->nodes[k]->name, name)) return m->nodes[k];
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: interp_train MODEL.dsl INIT.safetensors DATA OUT.safetensors "
                    "[NAME=VALUE ...]\n");
    return 2;
  }
  Source prelude = {"prelude.dsl", parc_prelude, parc_prelude_len};
  Source user = {0};
  Arena parse_arena = {0};
  if (!source_load(&user, argv[1])) return die("cannot read the model");
  Diag diag;
  diag_init(&diag, stderr);
  Program prog = {.arena = &parse_arena, .diag = &diag, .main_src = &user};
  parse_source(&prog, &prelude);
  parse_source(&prog, &user);
  Override ov[32];
  int nov = 0;
  for (int i = 5; i < argc && nov < 32; i++) {
    char *eq = strchr(argv[i], '=');
    if (!eq) return die("overrides are NAME=VALUE");
    *eq = 0;
    ov[nov++] = (Override){argv[i], eq + 1};
  }
  IrModule *m = diag.errors ? NULL : lower_program(&prog, ov, nov);
  arena_free(&parse_arena); /* the module owns everything it needs */
  source_free(&user);
  if (!m) {
    diag_finish(&diag);
    return die("the model does not lower");
  }
  PassOptions popt = {.verify = 1, .stop_after = "dce"};
  if (pass_run_all(m, &popt) || pass_autodiff(m) || pass_optimizer(m))
    return die("a pass failed");

  const IrNode *tok = input_named(m, "tokens"), *tgt = input_named(m, "targets");
  const IrNode *lr_in = input_named(m, "lr"), *step_in = input_named(m, "step");
  if (!tok || !tgt || !lr_in || !step_in || !m->grad_norm || tok->rank != 2)
    return die("the module lacks tokens/targets/lr/step inputs or a grad norm");
  int B = (int)tok->shape[0], T = (int)tok->shape[1];
  int64_t steps = (int64_t)setting(m->train, m->ntrain, "steps", 0);
  double lr = setting(m->train, m->ntrain, "lr", 0);
  int sched = rt_sched_parse(m->schedule ? m->schedule : "constant");
  int64_t warmup = (int64_t)setting(m->sched, m->nsched, "warmup", 0);
  double min_lr = setting(m->sched, m->nsched, "min_lr", 0);
  int vocab = (int)setting(m->config, m->nconfig, "vocab", 0);
  if (sched < 0) return die("unknown schedule");
  if (setting(m->train, m->ntrain, "microbatches", 1) != 1) return die("microbatches != 1");

  printf("{\"settings\": {\"batch\": %d, \"seq\": %d, \"steps\": %lld, \"lr\": %.17g, "
         "\"optimizer\": \"%s\", \"schedule\": \"%s\", \"warmup\": %lld, \"min_lr\": %.17g, "
         "\"clip\": %.17g",
         B, T, (long long)steps, lr, m->optimizer, m->schedule ? m->schedule : "constant",
         (long long)warmup, min_lr, setting(m->train, m->ntrain, "clip", 0));
  for (int i = 0; i < m->noptim; i++)
    printf(", \"%s\": %.17g", !strcmp(m->optim[i].name, "eps") ? "eps_adam" : m->optim[i].name,
           m->optim[i].is_float ? m->optim[i].f : (double)m->optim[i].i);
  for (int i = 0; i < m->nconfig; i++)
    printf(", \"%s\": %.17g", m->config[i].name,
           m->config[i].is_float ? m->config[i].f : (double)m->config[i].i);
  printf("}}\n");
  fflush(stdout);
  if (!strcmp(argv[2], "-")) { /* the settings only */
    ir_module_free(m);
    return 0;
  }

  IrInterp *it = ir_interp_new(m);
  RtSt *st;
  if (rt_st_open(&st, argv[2])) return die("cannot open the initial weights");
  int nparam = 0;
  for (int k = 0; k < m->nnodes; k++) {
    IrNode *n = m->nodes[k];
    if (n->op != IR_OP_PARAM) continue;
    int64_t ne = ir_numel(n);
    float *buf = malloc(sizeof(float) * (size_t)(ne ? ne : 1));
    if (!buf || rt_st_read(st, n->name, buf, n->rank, n->shape)) return die("bad weights");
    for (int64_t e = 0; e < ne; e++) it->f[k][e] = buf[e];
    free(buf);
    nparam++;
  }
  rt_st_close(st);
  RtData *data;
  if (rt_data_open(&data, argv[3], vocab, T)) return die("cannot open the data");

  char why[512];
  for (int64_t t = 0; t < steps; t++) {
    double lr_t = rt_lr_at((RtSched)sched, lr, warmup, min_lr, steps, t);
    if (rt_data_batch(data, t, B, T, it->i[tok->id], it->i[tgt->id])) return die("data");
    it->f[lr_in->id][0] = lr_t;
    it->f[step_in->id][0] = (double)(t + 1);
    if (ir_interp_run(it, 0, m->nnodes, why, sizeof why)) return die(why);
    printf("{\"step\": %lld, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g}\n",
           (long long)t, it->f[m->loss->id][0], it->f[m->grad_norm->id][0], lr_t);
    ir_interp_end_step(it);
  }
  rt_data_close(data);

  RtStTensor *ts = calloc((size_t)nparam, sizeof *ts);
  float **bufs = calloc((size_t)nparam, sizeof *bufs);
  int j = 0;
  for (int k = 0; k < m->nnodes; k++) {
    IrNode *n = m->nodes[k];
    if (n->op != IR_OP_PARAM) continue;
    int64_t ne = ir_numel(n);
    bufs[j] = malloc(sizeof(float) * (size_t)(ne ? ne : 1));
    for (int64_t e = 0; e < ne; e++) bufs[j][e] = (float)it->f[k][e];
    ts[j] = (RtStTensor){.name = n->name, .rank = n->rank, .data = bufs[j]};
    memcpy(ts[j].shape, n->shape, sizeof(int64_t) * (size_t)n->rank);
    j++;
  }
  if (rt_st_write(argv[4], ts, nparam, NULL, 0)) return die("cannot write the weights");
  for (int i = 0; i < nparam; i++) free(bufs[i]);
  free(bufs);
  free(ts);
  ir_interp_free(it);
  ir_module_free(m);
  return 0;
}
