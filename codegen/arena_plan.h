/* codegen/arena_plan.h -- the activation arena a trainer would allocate,
 * without writing the trainer (for the report of a compile without -o). */
#ifndef PARC_CG_ARENA_PLAN_H
#define PARC_CG_ARENA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"
#include "passes/passes.h"

/* m must have been through every pass (autodiff and the optimizer), as for
 * cg_write_project.  Plans the kernels (fused when fuse) and the buffers
 * exactly as cg_write_project does, so *arena_bytes equals the ARENA_BYTES
 * of the trainer `-o` would write for the same module; with st, also its
 * predicted compute time on mc (codegen/step_model.h; bf16: the bf16 rates).
 * Returns 0, or -1 with a one-line reason in err. */
int cg_plan_arena(IrModule *m, int fuse, int64_t *arena_bytes, const Machine *mc, int bf16,
                  StepTime *st, char *err, size_t len);

#endif
