/* passes/stage_search.c -- layers per chunk chosen for memory
 * (--stage-layers memory).
 *
 * The default split balances FLOPs (passes/stages.c).  A pipeline's stages
 * do not hold the same number of microbatches, though: under 1F1B stage s
 * holds P - s of them, so a split balanced for time leaves the first stage
 * needing most memory (GPT-2 small --pp 4: 2.27 GiB against 1.26 to 1.55 on
 * the others).  This finds a split whose largest rank needs less: a local
 * search from a given split (the caller's: the one balanced by FLOPs), each
 * candidate planned exactly by the caller (PpSplitEval: the GPU trainer's
 * device bytes of a rank of each stage, and the predicted step).
 *
 * Order: splits compare by their stages' bytes sorted largest first, taken
 * lexicographically (the largest rank first, then the next: with two stages
 * tied at the top, lowering either is progress), then by the step.
 * Move: one layer from chunk i to chunk j (i != j; each count stays at
 * least 1), the chunks between shifting by one layer.  Each round tries the
 * moves out of the chunks of the stages needing most first, into those
 * needing least first, takes the first split better than the current one,
 * and the search stops when no move is better or max_evals splits were
 * planned.  Splits planned once are remembered, not planned again.
 * Choice: the split so found needs least; of every split planned whose
 * largest rank is within PP_SPLIT_SLACK of that (and no more than the
 * start's), the one with the shortest step is chosen, so that a split 0.7%
 * lower is not taken at 12% more time (GPT-2 small --pp 4 zb).
 *
 * Invariants: the result is never worse than the start in that order; its
 * counts add up to the start's, each at least 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  int *counts;  /* nchunks */
  PpSplitCost cost;
  int64_t *sorted; /* nstages, largest first */
} Tried;

typedef struct {
  int nchunks, nstages;
  PpSplitEval eval;
  void *ctx;
  Tried *tried;
  int ntried, cap;
} Search;

static int by_bytes_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x > y ? -1 : x < y;
}

/* <0 if a is better than b, >0 if worse, 0 the same. */
static int compare(const Search *S, const Tried *a, const Tried *b) {
  for (int s = 0; s < S->nstages; s++)
    if (a->sorted[s] != b->sorted[s]) return a->sorted[s] < b->sorted[s] ? -1 : 1;
  if (a->cost.step_s != b->cost.step_s) return a->cost.step_s < b->cost.step_s ? -1 : 1;
  return 0;
}

/* The split `counts`, planned (or found planned before): its entry, or NULL
 * (eval failed, or out of memory). */
static const Tried *plan(Search *S, const int *counts) {
  size_t cb = sizeof(int) * (size_t)S->nchunks;
  for (int i = 0; i < S->ntried; i++)
    if (!memcmp(S->tried[i].counts, counts, cb)) return &S->tried[i];
  if (S->ntried == S->cap) {
    int cap = S->cap ? 2 * S->cap : 16;
    Tried *t = realloc(S->tried, sizeof *t * (size_t)cap);
    if (!t) return NULL;
    S->tried = t, S->cap = cap;
  }
  Tried *t = &S->tried[S->ntried];
  memset(t, 0, sizeof *t);
  t->counts = malloc(cb);
  t->sorted = malloc(sizeof(int64_t) * (size_t)S->nstages);
  if (!t->counts || !t->sorted || (memcpy(t->counts, counts, cb), S->eval(S->ctx, counts, &t->cost))) {
    free(t->counts);
    free(t->sorted);
    return NULL;
  }
  memcpy(t->sorted, t->cost.stage_bytes, sizeof(int64_t) * (size_t)S->nstages);
  qsort(t->sorted, (size_t)S->nstages, sizeof(int64_t), by_bytes_desc);
  S->ntried++;
  return t;
}

/* order[0..nchunks): the chunks by their stage's bytes, most first (desc)
 * or least first; ties by chunk index. */
static void chunk_order(const Search *S, const Tried *t, int desc, int *order) {
  for (int c = 0; c < S->nchunks; c++) order[c] = c;
  for (int i = 1; i < S->nchunks; i++) /* insertion sort: stable, nchunks small */
    for (int k = i; k > 0; k--) {
      int64_t a = t->cost.stage_bytes[order[k - 1] % S->nstages];
      int64_t b = t->cost.stage_bytes[order[k] % S->nstages];
      if (desc ? a >= b : a <= b) break;
      int x = order[k];
      order[k] = order[k - 1], order[k - 1] = x;
    }
}

static void say(FILE *log, const Search *S, const Tried *t, const char *what) {
  if (!log) return;
  fprintf(log, "parc: --stage-layers memory: %s ", what);
  for (int c = 0; c < S->nchunks; c++) fprintf(log, "%s%d", c ? "," : "", t->counts[c]);
  fprintf(log, ": the largest rank %.1f MiB, step %.3f ms (%d splits planned)\n",
          (double)t->sorted[0] / (1 << 20), t->cost.step_s * 1e3, S->ntried);
}

int pp_split_search(int nchunks, int nstages, int *counts, int max_evals, PpSplitEval eval,
                    void *ctx, PpSplitSearch *out, FILE *log) {
  Search S = {nchunks, nstages, eval, ctx, NULL, 0, 0};
  int rc = -1;
  int *order_from = malloc(sizeof(int) * (size_t)nchunks);
  int *order_to = malloc(sizeof(int) * (size_t)nchunks);
  int *trial = malloc(sizeof(int) * (size_t)nchunks);
  memset(out, 0, sizeof *out);
  const Tried *cur = order_from && order_to && trial ? plan(&S, counts) : NULL;
  if (!cur) goto done;
  out->start = cur->cost;
  say(log, &S, cur, "from");
  int optimum = 0; /* a round tried every move and none was better */
  while (!optimum && S.ntried < max_evals) {
    int better = 0, cut = 0;
    chunk_order(&S, cur, 1, order_from);
    chunk_order(&S, cur, 0, order_to);
    for (int a = 0; a < nchunks && !better && !cut; a++) {
      int i = order_from[a];
      if (cur->counts[i] < 2) continue;
      for (int b = 0; b < nchunks && !better && !cut; b++) {
        int j = order_to[b];
        if (j == i) continue;
        if (S.ntried >= max_evals) {
          cut = 1;
          break;
        }
        /* one layer from i to j: the chunks between i and j pass it on */
        memcpy(trial, cur->counts, sizeof(int) * (size_t)nchunks);
        trial[i]--, trial[j]++;
        int cur_index = (int)(cur - S.tried); /* (plan may move the array) */
        const Tried *t = plan(&S, trial);
        cur = &S.tried[cur_index];
        if (!t) goto done;
        if (compare(&S, t, cur) < 0) {
          cur = t;
          better = 1;
          say(log, &S, cur, "now");
        }
      }
    }
    optimum = !better && !cut;
  }
  /* the choice: of the splits planned within PP_SPLIT_SLACK of the least
   * largest rank (and not above the start's), the shortest step */
  const Tried *pick = cur;
  int64_t limit = cur->sorted[0] + (int64_t)((double)cur->sorted[0] * PP_SPLIT_SLACK);
  if (limit > S.tried[0].sorted[0]) limit = S.tried[0].sorted[0];
  for (int i = 0; i < S.ntried; i++) {
    const Tried *t = &S.tried[i];
    if (t->sorted[0] <= limit && (t->cost.step_s < pick->cost.step_s ||
                                  (t->cost.step_s == pick->cost.step_s && compare(&S, t, pick) < 0)))
      pick = t;
  }
  if (pick != cur) say(log, &S, pick, "chose");
  memcpy(counts, pick->counts, sizeof(int) * (size_t)nchunks);
  out->best = pick->cost;
  out->least = cur->cost;
  out->evals = S.ntried;
  out->capped = !optimum; /* stopped by max_evals, not for want of a better move */
  rc = 0;
done:
  for (int i = 0; i < S.ntried; i++) {
    free(S.tried[i].counts);
    free(S.tried[i].sorted);
  }
  free(S.tried);
  free(order_from);
  free(order_to);
  free(trial);
  return rc;
}
