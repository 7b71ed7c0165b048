/* tests/autodiff/ad_models.c -- whole models against finite differences.
 *
 *   ad_models MODEL.dsl [NAME=VALUE ...]           gradient check
 *   ad_models --phases MODEL.dsl [NAME=VALUE ...]  B/W split check
 *   ad_models --ir MODEL.dsl [NAME=VALUE ...]      print the IR after autodiff
 *
 * The model is parsed with the prelude, lowered with the overrides (as the
 * driver's -D), run through the default passes, pass_autodiff and
 * pass_attn_delta (sdpa_grad from lse and D, as the trainers have it), then
 * evaluated by the double interpreter with random parameters and tokens.
 * For every parameter, sampled elements of its gradient (uniform picks and
 * picks among the nonzero entries) are compared with central differences.
 * Perturbations that change a top-k routing choice are detected and
 * skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ad_check.h"
#include "frontend/build.h"
#include "frontend/lower.h"
#include "passes/passes.h"

extern const char parc_prelude[];
extern const unsigned long parc_prelude_len;

static IrModule *load(const char *path, char **ovs, int nov, Arena *parse_arena, Source *user) {
  Source prelude = {"prelude.dsl", parc_prelude, parc_prelude_len};
  if (!source_load(user, path)) return NULL;
  Diag diag;
  diag_init(&diag, stderr);
  Program prog = {.arena = parse_arena, .diag = &diag, .main_src = user};
  parse_source(&prog, &prelude);
  parse_source(&prog, user);
  Override ov[32];
  for (int i = 0; i < nov && i < 32; i++) {
    char *eq = strchr(ovs[i], '=');
    if (!eq) {
      fprintf(stderr, "override '%s' is not NAME=VALUE\n", ovs[i]);
      return NULL;
    }
    *eq = 0;
    ov[i] = (Override){ovs[i], eq + 1};
  }
  IrModule *m = diag.errors ? NULL : lower_program(&prog, ov, nov < 32 ? nov : 32);
  if (!m) diag_finish(&diag);
  return m;
}

/* Parameters and tokens: parameters drawn around their declared init but
 * larger than a trainer's, so that every gradient is well above the finite
 * difference noise; tokens and targets uniform over the vocabulary. */
static void init_values(IrModule *m, IrInterp *it, Rng *rng) {
  int64_t vocab = 0;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_EMBEDDING) vocab = m->nodes[i]->inputs[1]->shape[0];
  for (int k = 0; k < m->nnodes; k++) {
    const IrNode *n = m->nodes[k];
    for (int64_t e = 0; e < ir_numel(n); e++) {
      if (n->op == IR_OP_INPUT && n->dtype == IR_I32) it->i[k][e] = (int32_t)rng_int(rng, vocab);
      else if (n->op == IR_OP_INPUT) it->f[k][e] = rng_normal(rng);
      else if (n->op != IR_OP_PARAM) break;
      else if (n->init == IR_INIT_ONES) it->f[k][e] = 1 + 0.2 * rng_normal(rng);
      else if (n->init == IR_INIT_ZEROS) it->f[k][e] = 0.2 * rng_normal(rng);
      else it->f[k][e] = 0.3 * rng_normal(rng);
    }
  }
}

static int gradient_check(IrModule *m) {
  Rng rng = {0x5eed0001};
  IrInterp *it = ir_interp_new(m);
  init_values(m, it, &rng);
  FdOptions o = {.per_param = 8, .eps = 1e-6, .rtol = 1e-6, .atol = 1e-8};
  FdStats st;
  int rc = fd_check(m, it, &rng, &o, &st);
  int nparams = 0, ngrads = 0;
  for (int i = 0; i < m->nnodes; i++) {
    nparams += m->nodes[i]->op == IR_OP_PARAM;
    ngrads += m->nodes[i]->grad != NULL;
  }
  printf("%s %s: loss %.6f, %d/%d parameters with gradients, %d elements checked, %d skipped "
         "(top-k flips), max rel %.2e, max abs %.2e\n",
         rc ? "FAIL" : "ok  ", m->name, it->f[m->loss->id][0], ngrads, nparams, st.checked,
         st.skipped, st.max_rel, st.max_abs);
  if (ngrads != nparams) {
    printf("FAIL: every parameter of %s should reach the loss\n", m->name);
    rc = -1;
  }
  if (st.checked < 8 * nparams) {
    printf("FAIL: too few elements checked\n");
    rc = -1;
  }
  ir_interp_free(it);
  return rc != 0;
}

static int fails;

static void expect(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  fails += !ok;
}

/* The B/W split: parameter gradients are all W; activation-gradient work
 * (sdpa_grad, the input-gradient matmuls) is B; and evaluating forward,
 * then every B node, then every W node gives the same gradients as program
 * order, i.e. W work can be deferred past all of B. */
static int phase_check(IrModule *m) {
  int nb = 0, nw = 0, grads_w = 1, sdpa_b = 1, nsdpa = 0, ta_w = 1, mm_b = 0, emb_dy_b = 0;
  int nstats = 0, delta_b = 1, lse_fwd = 1;
  for (int i = 0; i < m->nnodes; i++) {
    IrNode *n = m->nodes[i];
    nb += n->phase == IR_PHASE_B;
    nw += n->phase == IR_PHASE_W;
    if (n->grad) grads_w &= n->grad->phase == IR_PHASE_W;
    if (n->op == IR_OP_ATTENTION_GRAD) nsdpa++, sdpa_b &= n->phase == IR_PHASE_B;
    if (n->op == IR_OP_ATTENTION_GRAD && n->ninputs == 6) nstats++;
    if (n->op == IR_OP_ATTENTION_DELTA) delta_b &= n->phase == IR_PHASE_B;
    if (n->op == IR_OP_ATTENTION_LSE) lse_fwd &= n->phase == IR_PHASE_FWD;
    if (n->op == IR_OP_MATMUL_TA) ta_w &= n->phase == IR_PHASE_W;
    if (n->op == IR_OP_MATMUL && n->phase == IR_PHASE_B) mm_b++;
    if (n->op == IR_OP_EMBEDDING_GRAD) emb_dy_b = n->inputs[1]->phase == IR_PHASE_B;
  }
  printf("     %d forward nodes, %d B, %d W\n", m->nnodes - nb - nw, nb, nw);
  expect(nb > 0 && nw > 0, "backward has both B and W nodes");
  expect(grads_w, "every parameter gradient is W");
  expect(nsdpa > 0 && sdpa_b, "sdpa_grad is B");
  expect(nstats == nsdpa && delta_b && lse_fwd,
         "every sdpa_grad reads lse (forward) and D (sdpa_delta, B), not sdpa's out");
  expect(ta_w, "every weight-gradient matmul_ta is W");
  expect(mm_b > 0, "input-gradient matmuls are B");
  expect(emb_dy_b, "the embedding's incoming gradient is B");

  Rng rng = {0x5eed0002};
  IrInterp *a = ir_interp_new(m), *b = ir_interp_new(m);
  init_values(m, a, &rng);
  for (int k = 0; k < m->nnodes; k++) {
    size_t n = (size_t)ir_numel(m->nodes[k]);
    if (a->f[k]) memcpy(b->f[k], a->f[k], n * sizeof(double));
    else memcpy(b->i[k], a->i[k], n * sizeof(int32_t));
  }
  char why[512];
  int ok = ir_interp_run(a, 0, m->nnodes, why, sizeof why) == 0;
  for (int ph = IR_PHASE_FWD; ok && ph < IR_PHASE_COUNT; ph++)
    for (int k = 0; ok && k < m->nnodes; k++)
      if (m->nodes[k]->phase == (IrPhase)ph) ok = ir_interp_run(b, k, k + 1, why, sizeof why) == 0;
  for (int k = 0; ok && k < m->nnodes; k++) {
    IrNode *g = m->nodes[k]->grad;
    if (g) ok = !memcmp(a->f[g->id], b->f[g->id], sizeof(double) * (size_t)ir_numel(g));
  }
  expect(ok, "forward, then all B, then all W gives the same gradients");
  ir_interp_free(a);
  ir_interp_free(b);
  return fails != 0;
}

int main(int argc, char **argv) {
  int mode = 0; /* 0 gradients, 1 phases, 2 print */
  int i = 1;
  if (i < argc && !strcmp(argv[i], "--phases")) mode = 1, i++;
  else if (i < argc && !strcmp(argv[i], "--ir")) mode = 2, i++;
  if (i >= argc) {
    fprintf(stderr, "usage: ad_models [--phases|--ir] MODEL.dsl [NAME=VALUE ...]\n");
    return 2;
  }
  Arena parse_arena = {0};
  Source user = {0};
  IrModule *m = load(argv[i], argv + i + 1, argc - i - 1, &parse_arena, &user);
  if (!m) return 1;
  PassOptions popt = {.verify = 1, .stop_after = "dce"};
  if (pass_run_all(m, &popt) || pass_autodiff(m) || pass_attn_delta(m)) {
    printf("FAIL: passes\n");
    return 1;
  }
  must_verify(m, "after autodiff");
  int rc;
  if (mode == 2) {
    ir_print(stdout, m);
    rc = 0;
  } else {
    rc = mode == 1 ? phase_check(m) : gradient_check(m);
  }
  ir_module_free(m);
  arena_free(&parse_arena);
  source_free(&user);
  return rc;
}
