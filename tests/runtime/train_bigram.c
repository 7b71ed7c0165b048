/* tests/runtime/train_bigram.c -- a hand-written trainer for rt_train_main: a bigram
 * model over bytes (logits = W[token] + bias), what a generated trainer looks like
 * when the model is small enough to write by hand.
 *
 * step: softmax cross-entropy over the batch, its gradient, global-norm clipping
 * (PyTorch's clip_grad_norm_: scale clip / (norm + 1e-6) when norm > clip) and a
 * PyTorch-style AdamW update (bias correction; decoupled decay on rank >= 2 only).
 * All buffers come from the harness: gradients and scratch live in the arena.
 *
 * Knobs for the tests (environment variables, read once in main):
 *   TRAIN_SCHEDULE=s   the DSL schedule (constant / warmup / cosine; default cosine)
 *   TRAIN_AUX=1        adds an auxiliary loss 1e-3 * sum((bias + 1)^2), so loss != ce_loss
 *   TRAIN_FAIL_AT=n    step n (1-based) fails, as a broken kernel would
 *   TRAIN_STALL=r      on a mesh, world rank r sleeps 5 s before step 2, as a stuck
 *                      peer would (the others' collectives time out)
 *   TRAIN_BREAK=what   breaks the description: overlap, numel, dup, state
 *   TRAIN_START=how    a start hook (RtModelDesc.start, as a GPU trainer's device):
 *                      ok (every step checks that it ran once on its rank, before
 *                      it), setup (every rank refuses the setup: RT_ERR_SETUP),
 *                      internal (every rank fails: RT_ERR)
 *   TRAIN_TP=n, TRAIN_DP=m  a tp x dp mesh (default 1 x 1)
 *
 * On a mesh, wte.weight [V, V] is column-sharded over tp (shard_dim 1): each rank
 * computes its logit columns, the rows are made whole with an all_gather over tp
 * for the softmax, and each rank takes the gradient of its own columns.  Data
 * parallelism all_gathers the logit gradients (with their tokens) over dp so that
 * every rank accumulates the weight gradient over the global batch in the one-rank
 * order, and the global norm is taken over the tp-gathered whole gradient in the
 * one-rank order: the weights then stay bit-identical to the one-rank run's on
 * every layout (only the logged loss, averaged over dp by the harness, may differ
 * in its last bits). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_model.h"
#include "runtime/rt_shard.h"

enum { V = 256, B = 4, T = 32 };
/* The mesh and the local width of wte.weight (V / tp columns); set in main. */
static int tp = 1, dp = 1, VL = V;
/* A gap between the two parameters exercises non-contiguous offsets. */
static int64_t OFF_W, OFF_B, NPARAM;
static int64_t S_WM, S_WV, S_BM, S_BV, NSTATE;
/* Arena: gradients laid out like the parameters, then one row of probabilities; on a
 * mesh also the local logits [n, VL], their tp gather [tp][n][VL], the logit
 * gradients with their token [n, V + 1] and their dp gather [B*T, V + 1], and the
 * whole weight gradient [V, V] with its gather buffer. */
static int64_t A_GRAD, A_PROB, A_LOC, A_ALL, A_DL, A_DALL, A_GFULL, A_GSC, ARENA_FLOATS;

static void layout(void) {
  const int64_t n = (int64_t)B * T / dp;
  OFF_W = 0, OFF_B = (int64_t)V * VL + 16, NPARAM = OFF_B + V;
  S_WM = 0, S_WV = (int64_t)V * VL, S_BM = 2 * S_WV, S_BV = S_BM + V, NSTATE = S_BV + V;
  A_GRAD = 0, A_PROB = NPARAM, ARENA_FLOATS = NPARAM + V;
  if (tp * dp > 1) {
    A_LOC = ARENA_FLOATS;
    A_ALL = A_LOC + n * VL;
    A_DL = A_ALL + n * V;
    A_DALL = A_DL + n * (V + 1);
    A_GFULL = A_DALL + (int64_t)B * T * (V + 1);
    A_GSC = A_GFULL + (int64_t)V * V;
    ARENA_FLOATS = A_GSC + (int64_t)V * V;
  }
}

static RtParamDesc params[2] = {
    {.name = "wte.weight", .rank = 2, .shape = {V, V}, .offset = 0, .numel = V * V,
     .init = RT_INIT_NORMAL, .std = 0.02f, .global_shape = {V, V}, .shard_dim = -1,
     .shard_blocks = 1},
    {.name = "bias", .rank = 1, .shape = {V}, .offset = V * V + 16, .numel = V,
     .init = RT_INIT_ZEROS, .std = 0.0f, .global_shape = {V}, .shard_dim = -1,
     .shard_blocks = 1},
};
static RtStateDesc state[4] = {
    {.name = "wte.weight.exp_avg", .offset = 0, .numel = V * V, .param = 0},
    {.name = "wte.weight.exp_avg_sq", .offset = V * V, .numel = V * V, .param = 0},
    {.name = "bias.exp_avg", .offset = 2 * V * V, .numel = V, .param = 1},
    {.name = "bias.exp_avg_sq", .offset = 2 * V * V + V, .numel = V, .param = 1},
};
static const char *const config_names[] = {"vocab", "d"};
static const double config_values[] = {V, V};

static long fail_at = -1;
static long stall_rank = -1;
static const char *start_how;     /* TRAIN_START, or NULL: no hook */
static _Thread_local int started; /* this rank's start calls (ranks are threads) */
static int aux;
static RtModelDesc model;

/* One AdamW update of n elements (PyTorch's algorithm, float math as torch's CPU loop). */
static void adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                  float step, int decay) {
  const RtModelDesc *d = &model;
  float b1 = (float)d->beta1, b2 = (float)d->beta2, eps = (float)d->eps;
  float bc1 = 1.0f - powf(b1, step), bc2 = 1.0f - powf(b2, step);
  float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
  float keep = decay ? 1.0f - lr * (float)d->weight_decay : 1.0f;
  for (int64_t i = 0; i < n; i++) {
    p[i] *= keep;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * m[i] / denom;
  }
}

/* Sum of squares of the whole weight gradient (row-major, the one-rank order) and the
 * bias gradient, in double. On tp > 1 the column shards are gathered first. */
static int grad_sq(RtStepIO *io, const float *gw, const float *gb, double *out) {
  const float *full = gw;
  if (io->tp_group && tp > 1) {
    float *arena = io->arena, *sc = arena + A_GSC, *g = arena + A_GFULL;
    int64_t counts[16];
    for (int c = 0; c < tp; c++) counts[c] = (int64_t)V * VL;
    if (rt_comm_all_gather(io->tp_group, gw, sc, counts)) return RT_ERR;
    const int64_t shape[2] = {V, V};
    for (int c = 0; c < tp; c++) {
      RtShard sh = {1, tp, 1, c, 0, 0, 0};
      if (rt_shard_insert(g, sc + (size_t)c * V * VL, 2, shape, &sh)) return RT_ERR;
    }
    full = g;
  }
  double sq = 0.0;
  for (int64_t i = 0; i < V * V; i++) sq += (double)full[i] * full[i];
  for (int k = 0; k < V; k++) sq += (double)gb[k] * gb[k];
  *out = sq;
  return RT_OK;
}

/* Forward and backward of the mean cross-entropy on a mesh: returns the sum of the
 * -log p over this rank's rows in *ce; fills gw (local columns) and gb. */
static int mesh_fwd_bwd(RtStepIO *io, const float *w, const float *bias, float *gw, float *gb,
                        double *ce) {
  float *arena = io->arena, *prob = arena + A_PROB, *loc = arena + A_LOC;
  float *all = loc, *dl = arena + A_DL, *dall = dl;
  const int n = B * T / dp, c0 = io->tp_rank * VL;
  const float inv_n = 1.0f / (B * T);
  for (int i = 0; i < n; i++) {
    const float *row = w + (size_t)io->tokens[i] * VL;
    for (int k = 0; k < VL; k++) loc[(size_t)i * VL + k] = row[k] + bias[c0 + k];
  }
  int64_t counts[16];
  if (tp > 1) {
    all = arena + A_ALL;
    for (int c = 0; c < tp; c++) counts[c] = (int64_t)n * VL;
    if (rt_comm_all_gather(io->tp_group, loc, all, counts)) return RT_ERR;
  }
  for (int i = 0; i < n; i++) {
    int x = io->tokens[i], y = io->targets[i];
    float mx = -INFINITY;
    for (int k = 0; k < V; k++) {
      prob[k] = all[(size_t)(k / VL) * n * VL + (size_t)i * VL + k % VL];
      if (prob[k] > mx) mx = prob[k];
    }
    float sum = 0.0f;
    for (int k = 0; k < V; k++) sum += prob[k] = expf(prob[k] - mx);
    *ce -= log((double)prob[y] / sum);
    float *d = dl + (size_t)i * (V + 1);
    for (int k = 0; k < V; k++) d[k] = (prob[k] / sum - (k == y ? 1.0f : 0.0f)) * inv_n;
    d[V] = (float)x;
  }
  if (dp > 1) {
    dall = arena + A_DALL;
    for (int c = 0; c < dp; c++) counts[c] = (int64_t)n * (V + 1);
    if (rt_comm_all_gather(io->dp_group, dl, dall, counts)) return RT_ERR;
  }
  /* the global batch in order, as one rank accumulates it */
  for (int i = 0; i < B * T; i++) {
    const float *d = dall + (size_t)i * (V + 1);
    float *grow = gw + (size_t)d[V] * VL;
    for (int k = 0; k < V; k++) {
      if (k >= c0 && k < c0 + VL) grow[k - c0] += d[k];
      gb[k] += d[k];
    }
  }
  return RT_OK;
}

/* RtModelDesc.start under TRAIN_START: every rank gives the same outcome, as
 * the contract asks (rt_model.h). */
static int bigram_start(RtStepIO *io) {
  started++;
  if (!io->params || !io->state || !io->arena)
    return rt_fail("bigram start: the harness passed no buffers");
  if (!strcmp(start_how, "setup"))
    return rt_fail_setup("bigram: injected setup refusal (TRAIN_START): use a bigger device");
  if (!strcmp(start_how, "internal"))
    return rt_fail("bigram: injected start failure (TRAIN_START)");
  return RT_OK;
}

static int bigram_step(RtStepIO *io) {
  if (start_how && started != 1)
    return rt_fail("bigram step %g: start ran %d times before it, not once", (double)io->step,
                   started);
  if (fail_at > 0 && io->step == (float)fail_at)
    return rt_fail("bigram step %ld: injected failure (TRAIN_FAIL_AT)", fail_at);
  if (stall_rank >= 0 && io->step == 2.0f && io->dp_rank * tp + io->tp_rank == stall_rank)
    nanosleep(&(struct timespec){5, 0}, NULL);
  float *w = io->params + OFF_W, *bias = io->params + OFF_B;
  float *arena = io->arena, *gw = arena + A_GRAD + OFF_W, *gb = arena + A_GRAD + OFF_B;
  float *prob = arena + A_PROB;
  memset(arena, 0, sizeof(float) * (size_t)NPARAM);

  /* forward and backward of mean cross-entropy over B*T positions */
  const float inv_n = 1.0f / (B * T);
  double ce = 0.0;
  if (tp * dp > 1) {
    if (mesh_fwd_bwd(io, w, bias, gw, gb, &ce)) return RT_ERR;
    ce /= B * T / dp;
  } else {
    for (int i = 0; i < B * T; i++) {
      int x = io->tokens[i], y = io->targets[i];
      const float *row = w + (size_t)x * V;
      float mx = -INFINITY;
      for (int k = 0; k < V; k++) {
        prob[k] = row[k] + bias[k];
        if (prob[k] > mx) mx = prob[k];
      }
      float sum = 0.0f;
      for (int k = 0; k < V; k++) sum += prob[k] = expf(prob[k] - mx);
      ce -= log((double)prob[y] / sum);
      float *grow = gw + (size_t)x * V;
      for (int k = 0; k < V; k++) {
        float d = (prob[k] / sum - (k == y ? 1.0f : 0.0f)) * inv_n;
        grow[k] += d;
        gb[k] += d;
      }
    }
    ce /= B * T;
  }
  double loss = ce;
  if (aux) {
    for (int k = 0; k < V; k++) {
      loss += 1e-3 * ((double)bias[k] + 1) * ((double)bias[k] + 1);
      gb[k] += 2e-3f * (bias[k] + 1.0f);
    }
  }

  /* --save-grads: the gradients as the optimizer reads them, before clipping */
  if (io->grads) {
    memcpy(io->grads + OFF_W, gw, sizeof(float) * (size_t)V * VL);
    memcpy(io->grads + OFF_B, gb, sizeof(float) * V);
  }

  /* global-norm clipping */
  double sq;
  if (grad_sq(io, gw, gb, &sq)) return RT_ERR;
  float norm = (float)sqrt(sq);
  const int64_t nw = (int64_t)V * VL;
  if (model.clip > 0 && norm > model.clip) {
    float scale = (float)model.clip / (norm + 1e-6f);
    for (int64_t i = 0; i < nw; i++) gw[i] *= scale;
    for (int k = 0; k < V; k++) gb[k] *= scale;
  }

  float *st = io->state;
  adamw(w, gw, st + S_WM, st + S_WV, nw, io->lr, io->step, 1);
  adamw(bias, gb, st + S_BM, st + S_BV, V, io->lr, io->step, 0);
  io->loss = (float)loss;
  io->ce_loss = (float)ce;
  io->grad_norm = norm;
  return 0;
}

int main(int argc, char **argv) {
  const char *sched = getenv("TRAIN_SCHEDULE");
  const char *fail = getenv("TRAIN_FAIL_AT");
  const char *brk = getenv("TRAIN_BREAK");
  aux = getenv("TRAIN_AUX") && !strcmp(getenv("TRAIN_AUX"), "1");
  if (fail) fail_at = strtol(fail, NULL, 10);
  start_how = getenv("TRAIN_START");
  if (getenv("TRAIN_STALL")) stall_rank = strtol(getenv("TRAIN_STALL"), NULL, 10);
  if (getenv("TRAIN_TP")) tp = (int)strtol(getenv("TRAIN_TP"), NULL, 10);
  if (getenv("TRAIN_DP")) dp = (int)strtol(getenv("TRAIN_DP"), NULL, 10);
  if (tp < 1 || tp > 16 || V % tp || dp < 1 || dp > 16) return 3;
  VL = V / tp;
  layout();
  if (tp > 1) {
    params[0].shape[1] = VL;
    params[0].numel = (int64_t)V * VL;
    params[0].shard_dim = 1;
  }
  params[1].offset = OFF_B;
  for (int i = 0; i < 4; i++) {
    static const int64_t *const offs[4] = {&S_WM, &S_WV, &S_BM, &S_BV};
    state[i].offset = *offs[i];
    state[i].numel = params[state[i].param].numel;
  }
  model = (RtModelDesc){
      .name = "bigram",
      .source = "tests/runtime/train_bigram.c",
      .vocab = V, .batch = B, .seq = T, .tp = tp, .dp = dp,
      .nparams = 2, .params = params, .params_numel = NPARAM,
      .nstate = 4, .state = state, .state_numel = NSTATE,
      .arena_bytes = (int64_t)sizeof(float) * ARENA_FLOATS,
      .flops_per_step = 6.0 * B * T * V,
      .steps = 300, .lr = 3e-2, .clip = 1.0,
      .optimizer = "adamw", .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
      .weight_decay = 0.01, .momentum = 0.0,
      .schedule = sched ? sched : "cosine", .warmup = 10, .min_lr = 3e-3,
      .seed = 1337,
      .nconfig = 2, .config_names = config_names, .config_values = config_values,
      .step = bigram_step,
      .start = start_how ? bigram_start : NULL};
  if (brk && !strcmp(brk, "overlap")) params[1].offset = (int64_t)V * VL - 1;
  if (brk && !strcmp(brk, "numel")) params[1].numel = V + 1;
  if (brk && !strcmp(brk, "dup")) params[1].name = "wte.weight";
  if (brk && !strcmp(brk, "state")) state[3].offset = NSTATE - V + 1;
  return rt_train_main(argc, argv, &model);
}
