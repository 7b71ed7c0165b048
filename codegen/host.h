/* codegen/host.h -- the generated host C: one readable file per rank program.
 *
 * The file holds the model's description for the runtime's harness
 * (runtime/rt_model.h: parameters, optimizer state, buffer plan, settings)
 * and `step`: forward, backward, clipping and the optimizer update as
 * straight-line calls -- GEMMs and the irregular ops into libparcrt, fused
 * kernels from kernels.h over rows split across the thread pool -- each
 * preceded by the IR line it implements. */
#ifndef PARC_CG_HOST_H
#define PARC_CG_HOST_H

#include <stdio.h>

#include "codegen/cg_kernels.h"
#include "passes/bufplan.h"
#include "passes/passes.h"

typedef struct {
  const char *source;        /* the DSL file, as given */
  const char *version;       /* parc's version */
  double flops_per_step;     /* forward + backward */
  const int *canon;          /* per kernel: the kernel whose code it runs (the
                                same code compiled once); NULL: itself */
} CgHostInfo;

/* Offsets (in floats) of every PARAM and STATE leaf in their buffers, in
 * node order, each 16-float aligned; -1 for other nodes. */
typedef struct {
  int64_t *offset;           /* per node id */
  int64_t params_numel, state_numel;
} CgLeafPlan;

void cg_plan_leaves(IrModule *m, CgLeafPlan *out);

/* Nodes whose buffers must survive to the end of the step: the loss, the
 * cross-entropy, the gradient norm and every update value (keep[id] = 1). */
unsigned char *cg_results(IrModule *m);

/* Places the plan's temporaries after the planned peak (temp_off[t], bytes,
 * 64-byte aligned; temp_off may be NULL) and returns the whole arena size. */
int64_t cg_arena_bytes(const CgKernelPlan *kp, const BufPlan *bp, int64_t *temp_off);

/* Writes train.c.  Returns 0, or -1 with a one-line reason in err (an op
 * or an input the trainer cannot feed). */
int cg_emit_host(FILE *out, const IrModule *m, const CgKernelPlan *kp, const BufPlan *bp,
                 const CgLeafPlan *lp, const CgHostInfo *info, char *err, size_t errlen);

#endif
