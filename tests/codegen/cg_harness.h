/* tests/codegen/cg_harness.h -- runs a kernel plan on the CPU and compares
 * it with the reference interpreter.
 *
 * cg_lib_open lowers the plan's KIR module through LLVM (kir_llvm_emit,
 * host CPU, O3), compiles it with a generated trampoline per kernel into a
 * shared object (the C compiler CMake found) and dlopens it.  cg_execute
 * then walks the module in node order, as generated host code will: leaf
 * and runtime-op values come from the interpreter (rounded to f32), every
 * kernel runs at its root over its rows (the upper half in one call, then
 * the lower half one row per call, last row first),
 * reading and writing f32 buffers.  It checks the plan's promises as it
 * goes: each kernel reads only buffers already computed, writes only its
 * own materialised nodes, writes every element of them (buffers start as
 * NaN) and nothing past their ends (canaries).  An update value written in
 * place (plan->inplace_of) is written into its leaf's buffer, which then
 * becomes the value's: no later kernel may read the leaf. */
#ifndef PARC_TESTS_CG_HARNESS_H
#define PARC_TESTS_CG_HARNESS_H

#include <stdint.h>

#include "codegen/cg_kernels.h"
#include "ir/interp.h"

typedef void (*CgFn)(void **args, int64_t row_begin, int64_t row_end);

typedef struct {
  void *dl;
  const CgFn *fns;    /* per kernel of the plan, in order */
  int nfns;
  char dir[64];       /* scratch directory, removed by cg_lib_close */
  double compile_s;   /* LLVM + C compiler time */
} CgLib;

int cg_lib_open(CgLib *L, const KirModule *km, char *err, size_t errlen);
void cg_lib_close(CgLib *L);

/* f32 buffers of one run: f[id] for materialised f32 nodes and in-place
 * update values, i[id] for i32 nodes (NULL where a node has no buffer, as a
 * leaf updated in place has after its update). */
typedef struct {
  int nnodes;
  float **f;
  int32_t **i;
} CgBufs;

/* Runs plan (compiled as L) over m, with ref already evaluated (ir_interp_run
 * over every node).  0, or -1 with a reason. */
int cg_execute(const IrModule *m, const CgKernelPlan *plan, const CgLib *L, const IrInterp *ref,
               CgBufs *out, char *err, size_t errlen);
void cg_bufs_free(CgBufs *b);

/* ||got - ref||_2 / ||ref||_2 over n elements (absolute when ref is 0);
 * NaN or inf in got where ref is finite gives +inf. */
double cg_rel_l2(const float *got, const double *ref, int64_t n);
/* The same between two f32 runs. */
double cg_rel_l2_ff(const float *a, const float *b, int64_t n);

/* xorshift64*, as the other test areas use. */
typedef struct {
  uint64_t s;
} CgRng;
double cg_uniform(CgRng *r, double lo, double hi);
double cg_normal(CgRng *r);
int64_t cg_randint(CgRng *r, int64_t n);

#endif
