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
 *   TRAIN_BREAK=what   breaks the description: overlap, numel, dup, state */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_err.h"
#include "runtime/rt_model.h"

enum { V = 256, B = 4, T = 32 };
/* A gap between the two parameters exercises non-contiguous offsets. */
enum { OFF_W = 0, OFF_B = V * V + 16, NPARAM = OFF_B + V };
enum { S_WM = 0, S_WV = V * V, S_BM = 2 * V * V, S_BV = 2 * V * V + V, NSTATE = 2 * V * V + 2 * V };
/* Arena: gradients laid out like the parameters, then one row of probabilities. */
enum { A_GRAD = 0, A_PROB = NPARAM, ARENA_FLOATS = NPARAM + V };

static RtParamDesc params[2] = {
    {"wte.weight", 2, {V, V}, OFF_W, V * V, RT_INIT_NORMAL, 0.02f},
    {"bias", 1, {V}, OFF_B, V, RT_INIT_ZEROS, 0.0f},
};
static RtStateDesc state[4] = {
    {"wte.weight.exp_avg", S_WM, V * V},
    {"wte.weight.exp_avg_sq", S_WV, V * V},
    {"bias.exp_avg", S_BM, V},
    {"bias.exp_avg_sq", S_BV, V},
};
static const char *const config_names[] = {"vocab", "d"};
static const double config_values[] = {V, V};

static long fail_at = -1;
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

static int bigram_step(RtStepIO *io) {
  if (fail_at > 0 && io->step == (float)fail_at)
    return rt_fail("bigram step %ld: injected failure (TRAIN_FAIL_AT)", fail_at);
  float *w = io->params + OFF_W, *bias = io->params + OFF_B;
  float *arena = io->arena, *gw = arena + A_GRAD + OFF_W, *gb = arena + A_GRAD + OFF_B;
  float *prob = arena + A_PROB;
  memset(arena, 0, sizeof(float) * NPARAM);

  /* forward and backward of mean cross-entropy over B*T positions */
  const float inv_n = 1.0f / (B * T);
  double ce = 0.0;
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
  double loss = ce;
  if (aux) {
    for (int k = 0; k < V; k++) {
      loss += 1e-3 * ((double)bias[k] + 1) * ((double)bias[k] + 1);
      gb[k] += 2e-3f * (bias[k] + 1.0f);
    }
  }

  /* global-norm clipping */
  double sq = 0.0;
  for (int64_t i = 0; i < V * V; i++) sq += (double)gw[i] * gw[i];
  for (int k = 0; k < V; k++) sq += (double)gb[k] * gb[k];
  float norm = (float)sqrt(sq);
  if (model.clip > 0 && norm > model.clip) {
    float scale = (float)model.clip / (norm + 1e-6f);
    for (int64_t i = 0; i < V * V; i++) gw[i] *= scale;
    for (int k = 0; k < V; k++) gb[k] *= scale;
  }

  float *st = io->state;
  adamw(w, gw, st + S_WM, st + S_WV, V * V, io->lr, io->step, 1);
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
  model = (RtModelDesc){
      .name = "bigram",
      .source = "tests/runtime/train_bigram.c",
      .vocab = V, .batch = B, .seq = T,
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
      .step = bigram_step};
  if (brk && !strcmp(brk, "overlap")) params[1].offset = V * V - 1;
  if (brk && !strcmp(brk, "numel")) params[1].numel = V + 1;
  if (brk && !strcmp(brk, "dup")) params[1].name = "wte.weight";
  if (brk && !strcmp(brk, "state")) state[3].offset = NSTATE - V + 1;
  return rt_train_main(argc, argv, &model);
}
