/* runtime/rt_sched.h -- the learning-rate schedule: what the host writes
 * into the optimizer's `lr` input before each step (see passes/optimizer.c).
 *
 * Pinned semantics, t the 0-based step, lr the base rate, W = warmup:
 *   constant  lr
 *   warmup    lr * (t + 1) / W          for t < W (linear, reaching lr at t = W - 1)
 *             lr                        for t >= W
 *   cosine    lr * (t + 1) / W          for t < W
 *             min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * q))   for t >= W, with
 *             q = min(1, (t - W) / max(1, steps - W))
 *             so lr at t = W, min_lr from t = steps on (clamped past the end)
 * W = 0 means no warmup.  Every expression is evaluated in double in the
 * order written; a negative t counts as 0. */
#ifndef PARC_RT_SCHED_H
#define PARC_RT_SCHED_H

#include <stdint.h>

typedef enum { RT_SCHED_CONSTANT, RT_SCHED_WARMUP, RT_SCHED_COSINE, RT_SCHED_COUNT } RtSched;

/* The schedule's name as the train section spells it ("constant",
 * "warmup", "cosine"); -1 for anything else. */
int rt_sched_parse(const char *name);

/* The learning rate of 0-based step t (see above).  min_lr is read by
 * cosine only, steps by cosine only, warmup by warmup and cosine. */
double rt_lr_at(RtSched kind, double lr, int64_t warmup, double min_lr, int64_t steps, int64_t t);

#endif
