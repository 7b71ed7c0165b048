/* tests/kir/kernels.h -- the kernels tests/kir builds, compiles and checks.
 *
 * Kernel NAME_R_C works on R rows of C columns; every kind is built for
 * every size in KT_SIZES, so check.c can walk the same list. */
#ifndef PARC_TESTS_KIR_KERNELS_H
#define PARC_TESTS_KIR_KERNELS_H

#include "codegen/kir.h"

/* (rows, columns): one row and several, columns that are not a multiple of
 * any vector width, and one long row. */
#define KT_SIZES(X) \
  X(1, 1) X(1, 7) X(1, 33) X(1, 1000) X(13, 1) X(13, 7) X(13, 33) X(13, 1000)

/* T of the causal softmax, whose rows are [2, T] and columns T. */
#define KT_CAUSAL(X) X(1) X(7) X(33)

#define KT_EPS 1e-5f   /* layernorm and rmsnorm epsilon */
#define KT_AXPY_ROWS 16

/* Adds the test kernels to m; all = 0 keeps only size 13 x 7 (and causal
 * T = 7), which is what the golden print shows. */
void kt_build(KirModule *m, int all);

#endif
