/* codegen/explain.h -- `parc --explain`: what fills a rank's activation
 * arena at its peak, and where a rank's predicted step time goes, each
 * traced back to the DSL line that made the values and calls.
 *
 * Memory.  A trainer's arena (passes/bufplan.h) holds each materialised
 * value from its write to its last read; values written in place, and views,
 * share their input's bytes.  The peak is the position where the most bytes
 * are live; what is live there, grouped by (op, phase, source location),
 * is what a user must shrink for a smaller arena.  The arena's size is at
 * least that peak; the rest is room between buffers (fragmentation).
 *
 * Step.  The predicted compute time of each call (codegen/step_model.h,
 * cg_step_times), grouped the same way: a generated kernel by its root's
 * node, a GEMM with the bf16 copies of its operands.
 *
 * Groups are sorted largest first; the first `rows` are printed (parc
 * --explain-rows; CG_EXPLAIN_ROWS by default, 0 all), the rest summed on
 * one line.  Output only: nothing here changes a plan. */
#ifndef PARC_CG_EXPLAIN_H
#define PARC_CG_EXPLAIN_H

#include <stddef.h>
#include <stdio.h>

#include "codegen/cg_kernels.h"
#include "ir/ir.h"
#include "passes/bufplan.h"
#include "passes/passes.h"

#define CG_EXPLAIN_ROWS 15

enum { CG_EXPLAIN_MEMORY = 1, CG_EXPLAIN_STEP = 2 };

/* A source file's text, for printing the lines values come from (matched
 * by IrLoc.file, the same pointer or the same string). */
typedef struct {
  const char *path;
  const char *text;
  size_t len;
} CgSourceText;

/* A group: the values (memory) or calls (step) made by one op in one phase
 * at one source location, over every layer. */
typedef struct {
  const IrNode *first;  /* its first node: the key (op, phase, loc) */
  double amount;        /* bytes, or seconds */
  int count;            /* values, or calls */
  int lo, hi;           /* the layers of its nodes in a repeat (hi -1: none) */
  int outside;          /* some of its nodes are outside every repeat */
  int runtime;          /* step: a runtime op's calls (not a generated kernel's) */
} CgExplainGroup;

/* The peak of arena plan p (pos: its positions, NULL: node ids) over the
 * buffers whose owner (the node with the bytes) has only[owner] != 0 (only
 * NULL: all): *at the first position where the most of those bytes are live,
 * *live those bytes (over all buffers: the planner's BufPlan.live_peak),
 * *buffers how many buffers hold them; g (room for m->nnodes groups) gets
 * them by group, largest first, each buffer counted for the value it holds
 * there (of the nodes sharing its bytes, the last written at or before *at;
 * a view holds its input's value).  Returns the number of groups, or -1
 * when out of memory. */
int cg_explain_peak(const IrModule *m, const BufPlan *p, const int *pos,
                    const unsigned char *only, int *at, int64_t *live, int *buffers,
                    CgExplainGroup *g);

/* The calls of node_s (cg_step_times' per-node seconds; kp's kernels) by
 * group into g (room for m->nnodes), largest first; the number of groups. */
int cg_explain_calls(const IrModule *m, const CgKernelPlan *kp, const double *node_s,
                     CgExplainGroup *g);

/* Explains the step of m (every pass done) into out: what (CG_EXPLAIN_*),
 * the kernels planned as cg_write_project plans them (cg_plan_whole_step:
 * fuse, pp, bf16, store -- a CgStoreMode --, batch), the step predicted on mc
 * (NULL: the default machine).  pp: m is the module of a trainer of stage
 * programs (a pipeline's, or a routed model's accumulated microbatches), its
 * stage programs: the arenas are a slot's (one plan for every stage, a
 * stage's slot holding its values of one microbatch; a stage's arena holds
 * pp->slots of them): each stage's values' peak, then what is live at the
 * largest, and the step is each stage's calls, a chunk's once a microbatch.
 * srcs: the texts of the files IrLoc names (nsrc of them; a file not among
 * them prints no line).  rows: the groups each table prints (0: all).  0,
 * or -1 with a one-line reason in err. */
int cg_explain(FILE *out, IrModule *m, const PpProgram *pp, unsigned what, int fuse,
               const Machine *mc, int bf16, int store, int batch, const CgSourceText *srcs,
               int nsrc, int rows, char *err, size_t len);

#endif
