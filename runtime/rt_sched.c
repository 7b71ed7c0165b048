/* runtime/rt_sched.c -- the learning-rate schedule (semantics in rt_sched.h). */
#include "runtime/rt_sched.h"

#include <math.h>
#include <string.h>

#define RT_PI 3.14159265358979323846

int rt_sched_parse(const char *name) {
  static const char *const names[RT_SCHED_COUNT] = {"constant", "warmup", "cosine"};
  for (int k = 0; name && k < RT_SCHED_COUNT; k++)
    if (!strcmp(names[k], name)) return k;
  return -1;
}

double rt_lr_at(RtSched kind, double lr, int64_t warmup, double min_lr, int64_t steps, int64_t t) {
  if (t < 0) t = 0;
  if (warmup < 0) warmup = 0;
  if (kind == RT_SCHED_CONSTANT) return lr;
  if (t < warmup) return lr * (double)(t + 1) / (double)warmup;
  if (kind == RT_SCHED_WARMUP) return lr;
  int64_t span = steps - warmup > 1 ? steps - warmup : 1;
  double q = (double)(t - warmup) / (double)span;
  if (q > 1) q = 1;
  return min_lr + 0.5 * (lr - min_lr) * (1 + cos(RT_PI * q));
}
