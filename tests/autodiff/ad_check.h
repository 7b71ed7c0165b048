/* tests/autodiff/ad_check.h -- shared by the autodiff tests: a seeded RNG,
 * builders for hand-made modules, leaf value specs, and the central
 * finite-difference check of every parameter gradient. */
#ifndef PARC_TESTS_AD_CHECK_H
#define PARC_TESTS_AD_CHECK_H

#include <stdint.h>

#include "ir/interp.h"
#include "ir/ir.h"

/* xorshift64*: deterministic across platforms. */
typedef struct {
  uint64_t s;
} Rng;

uint64_t rng_next(Rng *r);
double rng_uniform(Rng *r, double lo, double hi);
double rng_normal(Rng *r);
int64_t rng_int(Rng *r, int64_t n); /* in [0, n) */

/* How the harness fills a leaf (INPUT or PARAM) before running. */
typedef enum {
  LEAF_NORMAL,   /* f32: a * N(0, 1) + b */
  LEAF_UNIFORM,  /* f32: uniform in [a, b) */
  LEAF_AWAY,     /* f32: |x| uniform in [a, b), random sign (away from kinks and poles) */
  LEAF_IDS,      /* i32: uniform in [0, a) */
  LEAF_FIXED,    /* caller writes the values */
} LeafKind;

typedef struct {
  int id;
  LeafKind kind;
  double a, b;
} LeafSpec;

/* A module under construction with the specs of its leaves. */
typedef struct {
  IrModule *m;
  LeafSpec spec[64];
  int nspec;
  Rng rng;
} Build;

void build_init(Build *b, const char *name, uint64_t seed);

/* A shape literal: S(2, 3, 4). */
#define S(...) ((const int64_t[]){__VA_ARGS__, -1})

/* Leaves: f32 parameter, or input (i32 when kind is LEAF_IDS); shape from S(). */
IrNode *t_param(Build *b, LeafKind kind, double a, double c, const int64_t *shape);
IrNode *t_input(Build *b, LeafKind kind, double a, double c, const int64_t *shape);
/* An i32 input whose values the caller writes. */
IrNode *t_fixed_ids(Build *b, const int64_t *shape);

/* An op node: type inferred, test aborts if it does not check. */
IrNode *t_op(Build *b, IrOp op, IrNode **in, int nin, int64_t ia0, int64_t ia1, int64_t ia2,
             double fa);
IrNode *t_op1(Build *b, IrOp op, IrNode *x, int64_t ia0, int64_t ia1, int64_t ia2, double fa);
IrNode *t_op2(Build *b, IrOp op, IrNode *x, IrNode *y, int64_t ia0, double fa);
/* Shape-directed ops (reshape, broadcast, sum_to) to a shape from S(). */
IrNode *t_shaped(Build *b, IrOp op, IrNode *x, const int64_t *shape);

/* sum(y * R) over every element, R a fixed random input like y. */
IrNode *t_weighted_sum(Build *b, IrNode *y);

/* Fills every leaf: by its spec where it has one, else parameters N(0,1)
 * and inputs N(0,1) (f32) or 0 (i32). */
void fill_leaves(Build *b, IrInterp *it);

/* Index of the first backward node (m->nnodes if none). */
int first_backward(const IrModule *m);

typedef struct {
  int per_param;          /* elements checked per parameter; 0 = all */
  double eps;             /* central difference step */
  double rtol, atol;      /* pass: |fd - ad| <= rtol * max(|fd|, |ad|) + atol */
  int verbose;
} FdOptions;

typedef struct {
  int checked, skipped, failed;
  double max_rel;         /* largest |fd - ad| / max(|fd|, |ad|) where that max >= 1e-3 */
  double max_abs;
} FdStats;

/* Runs forward and backward once, then compares every parameter's gradient
 * (sampled elements) with (L(p + eps) - L(p - eps)) / 2 eps.  Perturbations
 * that change any topk result are skipped (the loss is not smooth there).
 * Returns 0 when every checked element passes; prints failures. */
int fd_check(IrModule *m, IrInterp *it, Rng *rng, const FdOptions *o, FdStats *st);

/* Prints why and exits 1 when ir_verify fails. */
void must_verify(const IrModule *m, const char *when);

#endif
