/* codegen/grad_onto.h -- a tied embedding's gradient added onto the head's
 * by the embedding gradient's own call, not by an add kernel.
 *
 * A weight read twice -- GPT-2's token table, the embedding and the tied
 * head -- gets the sum of two terms: z = add(x, y), x the head's weight
 * gradient (a GEMM's [V, D] product) and y = embedding_grad(ids, dy).  The
 * runtime computes y by zeroing a [V, D] table and adding the dy rows of
 * each token to its id's row; the add kernel then reads x and y and writes
 * z: three passes of [V, D] floats (GPT-2: 154 MB each) besides the zeroing.
 * The embedding gradient's _acc form adds the dy rows onto what the table
 * already holds.  Where the plans put z over x's bytes (in place) and
 * nothing reads x between y's call and z, y's call adds its rows onto x's
 * bytes: they then hold z, and z's kernel runs nothing (a view of x, as a
 * reshape over its input's bytes).  Row r of z is then
 *     ((x[r] + dy[p0]) + dy[p1]) + ...,  p0 < p1 < ... the tokens of id r,
 * not x[r] + ((0 + dy[p0]) + dy[p1] + ...): the same sum, rounded
 * differently, and the same on the CPU and GPU trainers, which share the
 * plan's choice.
 *
 * Conditions, for y an embedding_grad or vocab_embedding_grad (runtime op,
 * phase W) and z = add(x, y) its one reader (x input 0: the input a node
 * is written over, passes/bufplan.h):
 *   - z is a kernel of its own (one node), the node right after y;
 *   - x is read by z alone, computed before y, with a buffer;
 *   - x, y and z are f32 weight-gradient terms of one shape (phase W: the GPU
 *     trainer stores none of them as bf16, codegen/cuda_store.h), and no
 *     pipeline accumulates them (kp->acc_into NULL: its terms go into G);
 *   - both trainers' buffer plans write z over x.
 * The last is the buffer plans' choice: cg_onto_candidates marks z a view of
 * x (kp->view_of[z] = x) before they are made, which lets In place write z
 * over x though add's kernels do not promise IR_F_INPLACE0
 * (passes/bufplan.c: a view runs no kernel); cg_plan_onto, after both, sets
 * kp->onto where they did and clears the mark where neither did (then z's
 * add kernel runs as before). */
#ifndef PARC_CG_GRAD_ONTO_H
#define PARC_CG_GRAD_ONTO_H

#include "codegen/cg_kernels.h"
#include "codegen/cuda_store.h"
#include "passes/bufplan.h"

#include <stddef.h>

/* Marks the candidates (the conditions but the last); returns how many. */
int cg_onto_candidates(IrModule *m, CgKernelPlan *kp);
/* Sets kp->onto (in m's arena; NULL where none) from the plans bp (train.c's)
 * and gbp (the GPU trainer's) and store (its bf16 values); returns how many
 * gradients go onto another's bytes, or -1 with a reason in err where the
 * two plans disagree (an internal error: cuda_arena.h plans gbp like bp). */
int cg_plan_onto(IrModule *m, CgKernelPlan *kp, const BufPlan *bp, const BufPlan *gbp,
                 const CgCudaStore *store, char *err, size_t len);

#endif
