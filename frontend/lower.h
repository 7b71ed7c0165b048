/* frontend/lower.h -- check and lower a parsed program into IR.
 *
 * Lowering evaluates the model: configuration arithmetic is done here,
 * blocks are instantiated at each call with their concrete shapes (so every
 * IR shape is static), `repeat` unrolls into layers with their own
 * parameters, and every node gets the source location of the expression
 * that made it. */
#ifndef PARC_LOWER_H
#define PARC_LOWER_H

#include "frontend/ast.h"
#include "ir/ir.h"

typedef struct {
  const char *name;
  const char *value;   /* as given on the command line */
} Override;

/* Returns the module, or NULL after reporting errors through prog->diag.
 * The prelude's blocks come first in prog; the user's model is the one
 * model in it. */
IrModule *lower_program(Program *prog, const Override *ov, int nov);

#endif
