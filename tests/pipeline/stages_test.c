/* tests/pipeline/stages_test.c -- the stage split: equal layers split
 * equally, --stage-layers honoured, the embedding on the first stage and
 * head and loss on the last, a heavy head moves layers off the last stage,
 * and the per-chunk costs add up to the cost model's. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"
#include "tests/support/check_msg.h"
#include "tests/support/load.h"

static const char *model;

/* The differentiated module, with optional -D overrides. */
static IrModule *load(const char *const *defs, int n) {
  IrModule *m = test_load(model, defs, n);
  PassOptions opt = {.verify = 1, .dump = stderr, .start_after = "dce"};
  if (m && pass_run_all(m, &opt)) {
    ir_module_free(m);
    m = NULL;
  }
  CHECK(m != NULL, "loading %s", model);
  return m;
}

/* Splits m for the request; 0 on success. */
static int split(IrModule *m, int P, PpRequest *req, PpStages *st) {
  Layout lay = {.tp = 1, .pp = P, .dp = 1, .ep = 1};
  char err[256];
  if (pp_request_check(m, &lay, req, stderr)) {
    CHECK(0, "request refused");
    return -1;
  }
  if (pass_stages(m, &lay, req, st, err, sizeof err)) {
    CHECK(0, "pass_stages: %s", err);
    return -1;
  }
  return 0;
}

static void expect_counts(const PpStages *st, const int *want, const char *what) {
  char got[128] = "";
  int same = 1;
  for (int c = 0; c < st->nchunks; c++) {
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", c ? "," : "", st->chunks[c].nlayers);
    same &= st->chunks[c].nlayers == want[c];
  }
  CHECK(same, "%s: layers %s", what, got);
  printf("%s: %s\n", what, got);
}

static void test_uniform(void) {
  IrModule *m = load(NULL, 0);
  if (!m) return;
  static const int two[] = {4, 4}, four[] = {2, 2, 2, 2};
  for (int P = 2; P <= 4; P += 2) {
    PpRequest req = {.schedule = PP_1F1B, .schedule_given = 1, .microbatches = 4};
    PpStages st;
    if (split(m, P, &req, &st)) continue;
    expect_counts(&st, P == 2 ? two : four, P == 2 ? "uniform pp 2" : "uniform pp 4");
    CHECK(st.chunks[0].embedding && !st.chunks[0].head, "chunk 0 holds the embedding");
    CHECK(st.chunks[P - 1].head && !st.chunks[P - 1].embedding, "last chunk holds the head");
    for (int c = 1; c < P - 1; c++)
      CHECK(!st.chunks[c].head && !st.chunks[c].embedding, "middle chunk %d holds no end", c);
    /* FLOPs: the chunks' forward adds up to the cost model's, backward is twice it */
    Cost cost;
    Layout lay = {.tp = 1, .pp = P, .dp = 1, .ep = 1};
    cost_analyze(m, &lay, &cost);
    double f = 0;
    for (int c = 0; c < P; c++) {
      const PpChunk *k = &st.chunks[c];
      f += k->flops_f * 4;
      CHECK(fabs(k->flops_b + k->flops_w - 2 * k->flops_f) <= 1e-9 * k->flops_f, "B + W = 2F");
      CHECK(k->flops_b > k->flops_w, "attention backward is B: B > W");
      CHECK(k->stash_bytes > 0, "chunk %d stashes something", c);
    }
    CHECK(fabs(f - cost.flops_fwd) <= 1e-9 * f, "forward FLOPs %g vs the cost model's %g", f,
          cost.flops_fwd);
    /* the residual stream crosses each boundary: batch / M x seq x d floats */
    for (int c = 0; c < P - 1; c++)
      CHECK(st.chunks[c].boundary_bytes == 4 * 8 * 32 * 4, "boundary %d: %lld bytes", c,
            (long long)st.chunks[c].boundary_bytes);
    CHECK(st.chunks[P - 1].boundary_bytes == 0, "the last chunk sends nothing");
    for (int c = 2; c < P - 1; c++)
      CHECK(st.chunks[c].stash_bytes == st.chunks[1].stash_bytes, "middle stashes equal");
    /* the embedding table (vocab x d) is the first chunk's only extra */
    if (P == 4)
      CHECK(st.chunks[0].params - st.chunks[1].params == 16 * 32, "chunk 0 params %lld vs %lld",
            (long long)st.chunks[0].params, (long long)st.chunks[1].params);
  }
  /* --stage-layers */
  static const int fixed[] = {1, 3, 2, 2};
  PpRequest req = {.schedule = PP_GPIPE, .schedule_given = 1, .microbatches = 4,
                   .stage_layers = fixed, .nstage_layers = 4};
  PpStages st;
  if (!split(m, 4, &req, &st)) {
    expect_counts(&st, fixed, "--stage-layers 1,3,2,2");
    CHECK(st.chunks[1].first_layer == 1 && st.chunks[3].first_layer == 6, "first layers");
  }
  /* interleaved: equal chunks, chunk c on stage c % P */
  static const int eq[] = {2, 2, 2, 2};
  PpRequest il = {.schedule = PP_INTERLEAVED, .schedule_given = 1, .microbatches = 4};
  if (!split(m, 2, &il, &st)) {
    expect_counts(&st, eq, "interleaved pp 2 x 2");
    for (int c = 0; c < 4; c++) CHECK(st.chunks[c].stage == c % 2, "chunk %d on stage %d", c, c % 2);
  }
  /* every schedule plans and checks on the real module; 1F1B's memory profile */
  for (int k = 0; k < PP_NSCHEDULES; k++) {
    PpRequest r = {.schedule = (PpScheduleKind)k, .schedule_given = 1, .microbatches = 8};
    Layout lay = {.tp = 1, .pp = 4, .dp = 1, .ep = 1};
    PpPlan plan;
    char err[256];
    if (pp_request_check(m, &lay, &r, stderr)) {
      CHECK(0, "%s: request", pp_schedule_name[k]);
      continue;
    }
    if (pp_plan(m, &lay, &r, &plan, err, sizeof err)) {
      CHECK(0, "%s: %s", pp_schedule_name[k], err);
      continue;
    }
    if (k == PP_1F1B)
      for (int s = 0; s < 4; s++)
        CHECK(plan.sim.peak_inflight[s] == 4 - s, "1f1b stage %d: %d in flight", s,
              plan.sim.peak_inflight[s]);
    pp_plan_free(&plan);
  }
  ir_module_free(m);
}

/* A vocabulary of 1024 makes the head cost about 2.5 layers: the last stage
 * keeps one layer (3.5 layers' worth, the least possible maximum), and the
 * other seven split as evenly as they can, earlier stages taking more. */
static void test_heavy_head(void) {
  const char *defs[] = {"vocab=1024"};
  IrModule *m = load(defs, 1);
  if (!m) return;
  PpRequest req = {.schedule = PP_1F1B, .schedule_given = 1, .microbatches = 4};
  PpStages st;
  if (!split(m, 4, &req, &st)) {
    static const int want[] = {3, 2, 2, 1};
    expect_counts(&st, want, "heavy head pp 4");
    CHECK(st.chunks[3].nlayers < st.chunks[0].nlayers, "the head's stage has fewer layers");
  }
  ir_module_free(m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: stages_test pp_model.dsl\n");
    return 2;
  }
  model = argv[1];
  test_uniform();
  test_heavy_head();
  printf("%d checks, %d failures\n", checks, failures);
  return failures != 0;
}
