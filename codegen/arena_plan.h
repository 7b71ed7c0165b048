/* codegen/arena_plan.h -- the activation arena a trainer would allocate,
 * without writing the trainer (for the report of a compile without -o). */
#ifndef PARC_CG_ARENA_PLAN_H
#define PARC_CG_ARENA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

/* m must have been through every pass (autodiff and the optimizer), as for
 * cg_write_project.  Plans the kernels (fused when fuse) and the buffers
 * exactly as cg_write_project does, so *arena_bytes equals the ARENA_BYTES
 * of the trainer `-o` would write for the same module.  Returns 0, or -1
 * with a one-line reason in err. */
int cg_plan_arena(IrModule *m, int fuse, int64_t *arena_bytes, char *err, size_t len);

#endif
