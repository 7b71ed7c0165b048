/* tests/pipeline/split_search_test.c -- pp_split_search (--stage-layers
 * memory) against every split, on synthetic costs: a stage's bytes its own
 * (params a layer, slots x activations a layer) plus a fixed part, as a
 * pipeline's stages are; the step the slowest stage's layers.
 *   - the split found needs no more than the least of all splits (these
 *     costs are separable and increasing: moving one layer at a time
 *     reaches the optimum), the choice is within the slack of it, never
 *     above the start, and of shortest step among the splits so close
 *   - two stages tied at the top still make progress
 *   - counts keep the total, each at least 1; the limit on evaluations
 *     holds and says so; a failing evaluation fails the search, counts
 *     untouched; interleaved chunks (chunk c on stage c % P) too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "tests/support/check_msg.h"


typedef struct {
  int nchunks, nstages;
  int64_t fixed[8], per_layer[8]; /* per stage */
  double time_per_layer;
  int evals, fail_after;          /* fail_after > 0: the eval after that many fails */
} Model;

static int eval(void *ctx, const int *counts, PpSplitCost *out) {
  Model *md = ctx;
  if (md->fail_after && md->evals >= md->fail_after) return -1;
  md->evals++;
  memset(out, 0, sizeof *out);
  double most = 0;
  for (int s = 0; s < md->nstages; s++) out->stage_bytes[s] = md->fixed[s];
  for (int c = 0; c < md->nchunks; c++) {
    int s = c % md->nstages;
    out->stage_bytes[s] += counts[c] * md->per_layer[s];
  }
  for (int s = 0; s < md->nstages; s++) {
    int layers = 0;
    for (int c = s; c < md->nchunks; c += md->nstages) layers += counts[c];
    /* a stage with more bytes a layer also computes a little more */
    double t = layers * md->time_per_layer * (1 + 0.01 * (double)md->per_layer[s] / 1000);
    if (t > most) most = t;
  }
  out->step_s = most;
  return 0;
}

static int64_t largest(const Model *md, const int *counts, double *step) {
  PpSplitCost c;
  Model copy = *md;
  copy.fail_after = 0;
  eval(&copy, counts, &c);
  int64_t most = 0;
  for (int s = 0; s < md->nstages; s++)
    if (c.stage_bytes[s] > most) most = c.stage_bytes[s];
  if (step) *step = c.step_s;
  return most;
}

/* The least largest rank over every split of L layers into n chunks. */
static void brute(const Model *md, int *counts, int at, int left, int64_t *best) {
  if (at == md->nchunks - 1) {
    counts[at] = left;
    if (left < 1) return;
    int64_t b = largest(md, counts, NULL);
    if (b < *best) *best = b;
    return;
  }
  for (int k = 1; k <= left - (md->nchunks - 1 - at); k++) {
    counts[at] = k;
    brute(md, counts, at + 1, left - k, best);
  }
}

static void one(Model *md, int L, unsigned seed) {
  int n = md->nchunks, start[16], counts[16], total = 0;
  for (int c = 0; c < n; c++) start[c] = L / n + (c < L % n);
  memcpy(counts, start, sizeof start);
  PpSplitSearch r;
  md->evals = 0;
  int rc = pp_split_search(n, md->nstages, counts, 1000, eval, md, &r, NULL);
  CHECK(rc == 0, "seed %u: search failed", seed);
  if (rc) return;
  int ok = 1;
  for (int c = 0; c < n; c++) total += counts[c], ok &= counts[c] >= 1;
  CHECK(ok && total == L, "seed %u: counts lose layers or empty a chunk (total %d of %d)", seed,
        total, L);
  int64_t least = INT64_MAX;
  int scratch[16];
  brute(md, scratch, 0, L, &least);
  double step, start_step;
  int64_t got = largest(md, counts, &step), was = largest(md, start, &start_step);
  int64_t found = 0;
  for (int s = 0; s < md->nstages; s++)
    if (r.least.stage_bytes[s] > found) found = r.least.stage_bytes[s];
  CHECK(found == least, "seed %u: the search's least %lld, every split's least %lld", seed,
        (long long)found, (long long)least);
  CHECK(got <= least + (int64_t)(least * PP_SPLIT_SLACK) && got <= was,
        "seed %u: chose %lld, least %lld, start %lld", seed, (long long)got, (long long)least,
        (long long)was);
  CHECK(r.best.step_s == step && r.evals == md->evals && !r.capped,
        "seed %u: outcome disagrees (step %g vs %g, evals %d vs %d, capped %d)", seed,
        r.best.step_s, step, r.evals, md->evals, r.capped);
  CHECK(r.start.step_s == start_step, "seed %u: start step %g vs %g", seed, r.start.step_s,
        start_step);
}

int main(void) {
  unsigned seed = 12345;
  for (int trial = 0; trial < 60; trial++) {
    Model md = {0};
    md.nstages = 2 + (int)(seed % 3);              /* 2..4 */
    md.nchunks = md.nstages * (trial % 3 == 2 ? 2 : 1); /* some interleaved */
    int L = md.nchunks + (int)((seed >> 4) % 9);   /* up to 8 spare layers */
    for (int s = 0; s < md.nstages; s++) {
      seed = seed * 1103515245u + 12345u;
      md.fixed[s] = 1000 + (seed >> 8) % 5000;
      int slots = md.nstages - s;                  /* 1F1B: P - s microbatches */
      md.per_layer[s] = slots * (100 + (int)((seed >> 20) % 400));
    }
    md.time_per_layer = 1e-3;
    one(&md, L, seed);
    seed = seed * 1103515245u + 12345u;
  }

  /* two stages tied at the top: moving a layer off one leaves the largest
   * as it was, yet is progress (largest first, then the next) */
  Model tie = {.nchunks = 3, .nstages = 3, .per_layer = {100, 100, 10}, .time_per_layer = 1e-3};
  int tied[3] = {5, 5, 2}, scratch[3];
  int64_t least = INT64_MAX;
  brute(&tie, scratch, 0, 12, &least);
  PpSplitSearch tr;
  CHECK(!pp_split_search(3, 3, tied, 100, eval, &tie, &tr, NULL) &&
            largest(&tie, tied, NULL) == least && least < 500,
        "tied stages: chose %d,%d,%d (largest %lld, least %lld)", tied[0], tied[1], tied[2],
        (long long)largest(&tie, tied, NULL), (long long)least);

  /* the limit: with max_evals 3 the search stops there and says so */
  Model md = {.nchunks = 4, .nstages = 4, .fixed = {0, 0, 0, 0}, .per_layer = {4000, 3000, 2000, 1000},
              .time_per_layer = 1e-3};
  int counts[4] = {5, 5, 5, 5};
  PpSplitSearch r;
  CHECK(!pp_split_search(4, 4, counts, 3, eval, &md, &r, NULL) && r.evals == 3 && r.capped &&
            counts[0] + counts[1] + counts[2] + counts[3] == 20 && counts[0] < 5,
        "capped search: evals %d capped %d counts %d,%d,%d,%d", r.evals, r.capped, counts[0],
        counts[1], counts[2], counts[3]);

  /* a failing evaluation fails the search and leaves counts alone */
  md.evals = 0;
  md.fail_after = 2;
  int keep[4] = {5, 5, 5, 5};
  memcpy(counts, keep, sizeof keep);
  CHECK(pp_split_search(4, 4, counts, 100, eval, &md, &r, NULL) == -1 &&
            !memcmp(counts, keep, sizeof keep),
        "a failing evaluation: rc or counts wrong");

  /* one chunk a stage of one layer each: nothing to move, the start stays */
  md.fail_after = 0;
  int ones[4] = {1, 1, 1, 1};
  CHECK(!pp_split_search(4, 4, ones, 100, eval, &md, &r, NULL) && r.evals == 1 && !r.capped &&
            ones[0] == 1 && ones[3] == 1,
        "nothing to move: evals %d", r.evals);

  printf("split_search: %d checks, %d failures\n", checks, failures);
  return failures != 0;
}
