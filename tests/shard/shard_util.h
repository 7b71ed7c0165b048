/* tests/shard/shard_util.h -- what the N-rank-against-one-rank tests share:
 * a pass/fail tally, leaf lookup, the shard index map, and filling the
 * one-rank reference and every rank's slices with the same global values. */
#ifndef PARC_SHARD_UTIL_H
#define PARC_SHARD_UTIL_H

#include <stdint.h>

#include "ir/interp.h"
#include "ir/ir.h"

extern int shard_fails;
extern int shard_ep; /* the expert-parallel degree of the mesh (1: none) */


/* Prints "ok" or "FAIL" with fmt (one %s for what, one %g for v); counts fails. */
void shard_expect(int ok, const char *fmt, const char *what, double v);

IrNode *shard_find_leaf(IrModule *m, IrOp op, const char *name);

/* Removes every argv entry equal to flag (argv[0] kept); returns 1 if there
 * was one.  *argc is updated. */
int shard_take_flag(int *argc, char **argv, const char *flag);

/* Global flat index of local element e of leaf p (a PARAM or STATE, sharded
 * or not) on tp coordinate c (see shard_blocks in ir/ir.h), or -1 for an
 * element of vocabulary padding; written here independently of the
 * runtime's rt_shard_global_index. */
int64_t shard_global_index(const IrNode *p, int64_t e, int dc, int c);

/* Random global values for every INPUT and PARAM of the reference except
 * skip[0..nskip) (token ids below vocab).  Same sequence in every test. */
void shard_fill_reference(const IrModule *ref, IrInterp *it, int64_t vocab,
                          IrNode *const *skip, int nskip);

/* Each rank's slice of those values: parameters by shard (padding 0), inputs
 * by dp rows (rank r has tp coordinate r % tp, dp coordinate r / tp).  rk[r] are new
 * interpreters of sh.  Returns 0, or -1 after printing a leaf with no
 * counterpart. */
int shard_fill_ranks(IrModule *ref, const IrInterp *it, IrModule *sh, IrInterp **rk, int tp,
                     int dp, IrNode *const *skip, int nskip);

#endif
