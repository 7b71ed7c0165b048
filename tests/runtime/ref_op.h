/* tests/runtime/ref_op.h -- the reference side of the compute-kernel tests: one IR
 * op evaluated by the double-precision interpreter (ir/interp.c, the spec), plus a
 * seeded RNG and error measures shared by test_gemm, test_attention and test_route. */
#ifndef PARC_TESTS_RUNTIME_REF_OP_H
#define PARC_TESTS_RUNTIME_REF_OP_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

/* An operand: float values (f) or int32 values (i), with its shape. */
typedef struct {
  IrDType dtype;
  int rank;
  int64_t shape[IR_MAX_RANK];
  const float *f;
  const int32_t *i;
} RefArg;

/* The op's result: doubles (f32 ops) or int32 (i32 ops); free with ref_out_free. */
typedef struct {
  IrDType dtype;
  int rank;
  int64_t shape[IR_MAX_RANK];
  int64_t numel;
  double *f;
  int32_t *i;
} RefOut;

/* Operands from a pointer and a shape literal: RF(x, 2, 3, 4), RI(ids, 5). */
RefArg ref_f32(const float *p, int rank, const int64_t *shape);
RefArg ref_i32(const int32_t *p, int rank, const int64_t *shape);
#define RSHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define RF(p, ...) ref_f32(p, RSHAPE(__VA_ARGS__))
#define RI(p, ...) ref_i32(p, RSHAPE(__VA_ARGS__))

/* Evaluates op(args) with integer attributes ia0..ia2 and float attribute fa
 * (sdpa_grad takes q, k, v, dy: its fifth operand, their sdpa, is added here).
 * Returns 0 with *out filled, or -1 with the checker's or interpreter's one-line
 * reason in why (a bad shape, an index out of range). */
int ref_op(IrOp op, const RefArg *args, int nargs, int64_t ia0, int64_t ia1, int64_t ia2,
           double fa, RefOut *out, char *why, size_t len);
void ref_out_free(RefOut *out);

/* xorshift64*: the same numbers on every platform. */
typedef struct {
  uint64_t s;
} TRng;
uint64_t trng_next(TRng *r);
double trng_uniform(TRng *r);                     /* [0, 1) */
float trng_normal(TRng *r);                       /* N(0, 1), rounded to float */
int32_t trng_int(TRng *r, int64_t n);             /* [0, n) */
void trng_fill(TRng *r, float *x, int64_t n, float scale);  /* scale * N(0, 1) */

/* ||got - ref|| / ||ref|| (absolute when ||ref|| == 0). */
double rel_l2(const float *got, const double *ref, int64_t n);
/* Whether got equals ref rounded to float, element for element. */
int exact(const float *got, const double *ref, int64_t n);

#endif
