/* tests/support/load.h -- compile a DSL file to IR inside a test, as the
 * driver does (prelude first, then the file, then the pass pipeline). */
#ifndef PARC_TEST_LOAD_H
#define PARC_TEST_LOAD_H

#include "frontend/lower.h"

/* Runs the passes up to and including dce: the forward module, before
 * autodiff and the optimizer, which tests run themselves.
 * Returns the module or NULL after printing diagnostics to stderr.
 * defines: "NAME=VALUE" strings, n of them. */
IrModule *test_load(const char *path, const char *const *defines, int n);

/* test_load, then autodiff and the optimizer (the step a trainer runs),
 * verified: the module, or NULL after printing "FAIL: PATH does not compile". */
IrModule *test_load_step(const char *path, const char *const *defines, int n);

/* test_load, then every pass of the pipeline after dce (autodiff, attn_delta,
 * remat, the optimizer, slice_sink, attn_layout ...): the one-rank module
 * `parc -o` writes its trainers from, verified; or NULL as test_load_step. */
IrModule *test_load_full(const char *path, const char *const *defines, int n);

#endif
