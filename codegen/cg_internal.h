/* codegen/cg_internal.h -- shared by cg_kernels.c (grouping, the plan) and
 * cg_emit.c (building each group's KIR kernel).  Not a public header. */
#ifndef PARC_CG_INTERNAL_H
#define PARC_CG_INTERNAL_H

#include "codegen/cg_kernels.h"

/* The loop structure a group's kernel takes, chosen by its root op. */
typedef enum {
  CG_ELEM,    /* one store per element of the root's shape: pointwise and views */
  CG_ROW,     /* a row op over the last dim, with prologue and epilogue */
  CG_REDUCE,  /* rows = kept elements, one column loop over the reduced ones */
  CG_CONCAT,  /* rows = dims before the axis, one loop per part */
} CgTmpl;

typedef struct {
  int root;       /* where the kernel runs: its largest member, or for a wgrad
                     deferred to read statistics, the root of their writer */
  int deferred;   /* root is the writer's: run right after the writer */
  CgTmpl tmpl;
  int rowop;      /* CG_ROW: the row op (the root or an epilogue's producer); else -1 */
  int stats;      /* a wgrad's group: the norm gradient whose (earlier) row kernel
                     writes the statistics, or -1 for a _stats kernel of its own */
} CgGroup;

/* What the emitter needs to know about the whole plan. */
typedef struct {
  const IrModule *m;
  const int *group_of;              /* per node: group index, -1 for leaves and runtime */
  const unsigned char *materialize;
  const int *inplace_of;            /* per node: the leaf an update value is stored
                                       into (CgKernelPlan.inplace_of), or -1 */
  const unsigned char *writes_stats;/* per node: a norm gradient whose kernel writes its
                                       row statistics for a wgrad (CgGroup.stats) */
  int *stats_temp;                  /* per node: the temporary it wrote them to, or -1 */
} CgView;

/* The template of a kernel rooted at op (a CgTmpl), or -1 if op has none. */
int cg_template_of(IrOp op);

/* Ops computed inline wherever they are read (pointwise, views, fill, rope). */
int cg_inline_op(IrOp op);
/* Row ops: the CG_ROW template's op. */
int cg_row_op(IrOp op);
/* Ops whose inline value is made only of broadcasting pointwise arithmetic
 * (no index remapping): groups of these alone may flatten dimensions. */
int cg_pure_op(IrOp op);

/* Builds the kernel(s) of group gi, appending to p->kernels (which has room
 * for two more) and allocating temporaries in p.  0, or -1 with err. */
int cg_emit_group(CgKernelPlan *p, const CgView *v, const CgGroup *g, int gi, char *err,
                  size_t errlen);

#endif
