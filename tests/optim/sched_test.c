/* tests/optim/sched_test.c -- rt_lr_at against values worked out by hand
 * (the decimal expansions come from the closed forms in the comments, not
 * from the function under test), plus the properties the pinned semantics
 * promise: continuity at the end of warmup, monotone decay, the clamp. */
#include <math.h>
#include <stdio.h>

#include "runtime/rt_sched.h"

static int fails, checks;

static void near(const char *what, double got, double want) {
  checks++;
  if (fabs(got - want) <= 1e-15 * fmax(1, fabs(want))) return;
  printf("FAIL %s: got %.17g, want %.17g\n", what, got, want);
  fails++;
}

int main(void) {
  /* constant: the base rate at every step, warmup ignored */
  near("constant t=0", rt_lr_at(RT_SCHED_CONSTANT, 3e-4, 10, 0, 100, 0), 3e-4);
  near("constant t=99", rt_lr_at(RT_SCHED_CONSTANT, 3e-4, 10, 0, 100, 99), 3e-4);
  near("constant past the end", rt_lr_at(RT_SCHED_CONSTANT, 3e-4, 0, 0, 100, 1000), 3e-4);

  /* warmup 4, lr 1: 1/4, 2/4, 3/4, then 1 */
  near("warmup t=0", rt_lr_at(RT_SCHED_WARMUP, 1, 4, 0, 100, 0), 0.25);
  near("warmup t=1", rt_lr_at(RT_SCHED_WARMUP, 1, 4, 0, 100, 1), 0.5);
  near("warmup t=2", rt_lr_at(RT_SCHED_WARMUP, 1, 4, 0, 100, 2), 0.75);
  near("warmup t=3", rt_lr_at(RT_SCHED_WARMUP, 1, 4, 0, 100, 3), 1);
  near("warmup t=50", rt_lr_at(RT_SCHED_WARMUP, 1, 4, 0, 100, 50), 1);
  near("warmup 0", rt_lr_at(RT_SCHED_WARMUP, 6e-4, 0, 0, 100, 0), 6e-4);
  near("warmup 3, lr 6e-4, t=0", rt_lr_at(RT_SCHED_WARMUP, 6e-4, 3, 0, 100, 0), 2e-4);

  /* cosine, lr 1, min_lr 0.1, warmup 2, steps 10: decay over t - 2 in [0, 8] */
  near("cosine t=0", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 0), 0.5);
  near("cosine t=1", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 1), 1);
  near("cosine t=2 (q=0)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 2), 1);
  /* q = 1/4: 0.1 + 0.45 (1 + sqrt(2)/2) */
  near("cosine t=4 (q=1/4)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 4), 0.86819805153394639);
  /* q = 1/2: 0.1 + 0.45 */
  near("cosine t=6 (q=1/2)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 6), 0.55);
  /* q = 3/4: 0.1 + 0.45 (1 - sqrt(2)/2) */
  near("cosine t=8 (q=3/4)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 8), 0.23180194846605361);
  near("cosine t=10 (end)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 10), 0.1);
  near("cosine t=11 (clamped)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 11), 0.1);
  near("cosine t=1000 (clamped)", rt_lr_at(RT_SCHED_COSINE, 1, 2, 0.1, 10, 1000), 0.1);
  /* no warmup, steps 3, min 0: q = t/3; t=1: 0.5 (1 + cos(pi/3)) = 0.75 */
  near("cosine no warmup t=0", rt_lr_at(RT_SCHED_COSINE, 1, 0, 0, 3, 0), 1);
  near("cosine no warmup t=1", rt_lr_at(RT_SCHED_COSINE, 1, 0, 0, 3, 1), 0.75);
  near("cosine no warmup t=2", rt_lr_at(RT_SCHED_COSINE, 1, 0, 0, 3, 2), 0.25);
  /* warmup >= steps: the span is max(1, steps - warmup) = 1 */
  near("cosine warmup 5 of 3 steps, t=3", rt_lr_at(RT_SCHED_COSINE, 1, 5, 0.2, 3, 3), 0.8);
  near("cosine warmup 5 of 3 steps, t=5", rt_lr_at(RT_SCHED_COSINE, 1, 5, 0.2, 3, 5), 1);
  near("cosine warmup 5 of 3 steps, t=6", rt_lr_at(RT_SCHED_COSINE, 1, 5, 0.2, 3, 6), 0.2);
  near("negative t counts as 0", rt_lr_at(RT_SCHED_WARMUP, 1, 4, 0, 10, -3), 0.25);

  /* properties over a GPT-2-like run: lr 6e-4, warmup 700, min 6e-5, 5000 steps */
  double prev = 0;
  int rising = 1, falling = 1, bounded = 1;
  for (int64_t t = 0; t < 6000; t++) {
    double v = rt_lr_at(RT_SCHED_COSINE, 6e-4, 700, 6e-5, 5000, t);
    if (t < 700) rising &= v > prev;
    else falling &= v <= prev;
    /* warmup in (0, lr], then [min_lr, lr], up to rounding */
    bounded &= v >= (t < 700 ? 0 : 6e-5 * (1 - 1e-15)) && v > 0 && v <= 6e-4 * (1 + 1e-15);
    prev = v;
  }
  checks += 3;
  if (!rising || !falling || !bounded) {
    printf("FAIL cosine properties: rising %d, non-increasing %d, bounded %d\n",
           rising, falling, bounded);
    fails++;
  }
  near("cosine reaches lr at the end of warmup",
       rt_lr_at(RT_SCHED_COSINE, 6e-4, 700, 6e-5, 5000, 699), 6e-4);

  /* names as the train section spells them */
  checks++;
  if (rt_sched_parse("constant") != RT_SCHED_CONSTANT || rt_sched_parse("warmup") != RT_SCHED_WARMUP ||
      rt_sched_parse("cosine") != RT_SCHED_COSINE || rt_sched_parse("linear") != -1 ||
      rt_sched_parse(NULL) != -1) {
    printf("FAIL rt_sched_parse\n");
    fails++;
  }
  printf("%s %d schedule checks\n", fails ? "FAIL" : "ok  ", checks);
  return fails != 0;
}
