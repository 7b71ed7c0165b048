/* codegen/kir.h -- the kernel IR: fused pointwise and row-reduction kernels.
 *
 * The fusion pass builds each fused kernel here with the kir_ builder; the
 * kernel is then lowered twice, to CUDA C and, through the LLVM C API, to
 * native CPU code (codegen/kir_llvm.h).  This file is the whole contract.
 *
 * SHAPE OF A KERNEL
 *
 *   void NAME(params..., int64_t row_begin, int64_t row_end)
 *   for r in [row_begin, row_end):          -- parallel: rows are independent
 *     row indices (i0, ..., in-1) = r decomposed over the row dims
 *     loop 0: for c in [0, extent0): stores; reductions
 *     row-level stores
 *     loop 1: for c in [0, extent1): ...     -- may use loop 0's reductions
 *     ...
 *
 *   Params, in declaration order, are buffers (f32 or i32 pointers) and
 *   scalars (int64 or f32).  The row space is the product of the row dims
 *   (outermost first; no dims means one row).  Inside one row, loops run one
 *   after another; each is a column loop over its own extent (an index
 *   expression that may depend on rows, scalars and earlier reductions).  A
 *   loop may store and may reduce (sum, max, min); a reduction's result is a
 *   per-row f32 usable after its loop ends.  This covers fused pointwise
 *   chains, softmax, layernorm/rmsnorm forward and backward, cross-entropy,
 *   bias + GELU, residual adds, SwiGLU, broadcasts and reductions over an
 *   axis (make the reduced axis the column loop, the kept axes the rows).
 *
 * VALUES
 *
 *   Every value is a node of its kernel, named by a KirVal (its index).  A
 *   node has one type: index (int64; loop indices and address arithmetic),
 *   f32, or pred (a comparison, consumed by select).  Nodes are pure and
 *   may be shared by any number of users; codegen emits each once.  The
 *   builder numbers values: asking twice for the same operation on the
 *   same operands returns the same node (loads only until their buffer is
 *   stored to; stores and reductions never merge).
 *
 *   Scope.  A node either varies in one loop (it depends on that loop's
 *   column index: node.loop = that loop) or is row-level (node.loop = -1:
 *   constant within a row).  A row-level node also has node.avail, the
 *   number of loops that must have finished before it exists (it depends on
 *   the reduction of loop avail-1).  The builder enforces, at each use:
 *     - a loop-varying node is used only inside its own loop;
 *     - a row-level node is used only where avail <= the loops finished so
 *       far (inside loop L: avail <= L; outside loops: avail <= nloops);
 *   so every value is defined before it is used, on every path.
 *
 * SEMANTICS
 *
 *   Execution is the sequential loop nest above, in the order things were
 *   built, so a loop may read what an earlier loop of the same row wrote
 *   (softmax stores exp(x - max) and rescales it in a later loop).  Stores
 *   and reductions are statements; every other node is a value, computed
 *   once where it was built: a row-level value built between loops there
 *   (before any later row-level store), one built while loop L was open just
 *   before loop L starts, a loop-varying value in its iteration, in build
 *   order with that loop's stores.  So a load observes every store built
 *   before it, except that a row-level load built inside loop L is taken
 *   before L runs.
 *
 *   Index arithmetic is int64 and must not overflow; idiv and imod take a
 *   positive constant divisor and truncate as C does (exact floor division
 *   for the non-negative indices they are meant for).  Loads and stores
 *   index in elements.  f32 arithmetic is IEEE single precision, each op
 *   rounded as written (no contraction, no reassociation); exp, log, tanh
 *   are accurate to a few ulp (see kir_llvm.h for the CPU bound); max and
 *   min propagate NaN (the sign of a zero result of max(-0, +0) is
 *   unspecified).  Reductions: sum starts at 0, max at -inf, min at +inf;
 *   a sum's order of accumulation is unspecified (lowerings vectorize it)
 *   but fixed for a given compiled kernel; max and min are exact, order
 *   -0 below +0, and propagate NaN.
 *
 * CALLER CONTRACT (the ABI of every lowering)
 *
 *   - 0 <= row_begin <= row_end <= kir_kernel_rows(k);
 *   - rows are independent: no row reads or writes what another row writes,
 *     so disjoint row ranges may run on different threads.  The builder of
 *     a kernel guarantees this by construction; it is not checked;
 *   - a buffer that the kernel stores to overlaps no other buffer argument
 *     of the same call (read-only buffers may alias each other).  In-place
 *     updates use one KIR_INOUT buffer, not two arguments.  This is what
 *     makes every buffer parameter `restrict` / LLVM `noalias`;
 *   - every index a kernel loads or stores is inside its buffer.
 *
 * ERRORS
 *
 *   Builder calls never abort.  The first misuse is recorded in the module
 *   (kir_error) and the call returns KIR_NONE; calls given KIR_NONE return
 *   KIR_NONE quietly, so a builder can run to the end and check once.
 *   Memory exhaustion exits with status 3, as the IR arena does.
 */
#ifndef PARC_KIR_H
#define PARC_KIR_H

#include <stdint.h>
#include <stdio.h>

typedef int KirVal;   /* node index within its kernel */
#define KIR_NONE (-1)

typedef enum { KIR_TY_VOID, KIR_TY_INDEX, KIR_TY_F32, KIR_TY_PRED } KirType;

/* Buffer element type.  KIR_BF16 stores f32 values as bfloat16: a load widens
 * to f32 exactly, a store rounds to nearest even.  KIR_BF16R is its
 * verification twin: an f32 buffer whose stores round to the nearest bf16
 * value, so it holds exactly the f32 widening of what a KIR_BF16 buffer would
 * hold (loads and in-register uses are the same too).  The builder makes
 * neither (kir_buf takes f32 and i32); the GPU trainer retypes the f32
 * params of built kernels whose buffers it stores as bf16
 * (codegen/cuda_store.h), and only the CUDA lowering takes them. */
typedef enum { KIR_F32, KIR_I32, KIR_BF16, KIR_BF16R } KirElem;

/* How a kernel uses a buffer.  KIR_OUT buffers may be read back after the
 * kernel stored them (its prior contents are not inputs); KIR_INOUT says
 * prior contents are read.  Stores to KIR_IN buffers are errors. */
typedef enum { KIR_IN = 1, KIR_OUT = 2, KIR_INOUT = 3 } KirAccess;

typedef enum { KIR_PARAM_BUF, KIR_PARAM_I64, KIR_PARAM_F32 } KirParamKind;

/* Comparisons.  On f32 they are C's: false when either side is NaN, except
 * KIR_NE, which is true.  grep ORDER KirCmp if you change this enum. */
typedef enum { KIR_LT, KIR_LE, KIR_GT, KIR_GE, KIR_EQ, KIR_NE } KirCmp;

/* grep ORDER KirRed if you change this enum. */
typedef enum { KIR_SUM, KIR_MAX, KIR_MIN } KirRed;

/* Opcodes, declared once: X(enum, text, operands).  Operands are in
 * node.arg[0..n); immediates in node.imm / node.fimm as noted. */
#define KIR_OPS(X)                                                          \
  X(ICONST, "iconst", 0)   /* imm: the value */                              \
  X(FCONST, "fconst", 0)   /* fimm: the value */                             \
  X(ROW, "row", 0)         /* imm: row dim */                                \
  X(COL, "col", 0)         /* the column index of the loop it varies in */  \
  X(PARAM, "param", 0)     /* imm: scalar param index; type index or f32 */ \
  X(IADD, "add", 2)                                                         \
  X(ISUB, "sub", 2)                                                         \
  X(IMUL, "mul", 2)                                                         \
  X(IDIV, "div", 1)        /* imm: divisor > 0 */                            \
  X(IMOD, "mod", 1)        /* imm: divisor > 0 */                            \
  X(IMIN, "min", 2)                                                         \
  X(IMAX, "max", 2)                                                         \
  X(LOAD, "load", 1)       /* imm: buffer param; f32, or index for i32 */    \
  X(FADD, "fadd", 2)                                                        \
  X(FSUB, "fsub", 2)                                                        \
  X(FMUL, "fmul", 2)                                                        \
  X(FDIV, "fdiv", 2)                                                        \
  X(FNEG, "fneg", 1)                                                        \
  X(FMAX, "fmax", 2)                                                        \
  X(FMIN, "fmin", 2)                                                        \
  X(FABS, "fabs", 1)                                                        \
  X(EXP, "exp", 1)                                                          \
  X(LOG, "log", 1)                                                          \
  X(TANH, "tanh", 1)                                                        \
  X(SQRT, "sqrt", 1)                                                        \
  X(RSQRT, "rsqrt", 1)                                                      \
  X(ITOF, "itof", 1)       /* index -> f32, round to nearest */              \
  X(CMP, "cmp", 2)         /* imm: KirCmp; operands both index or both f32 */\
  X(SELECT, "select", 3)   /* arg0 pred; arg1, arg2 of one type */          \
  X(REDUCE, "reduce", 1)   /* imm: KirRed; row-level result of its loop */   \
  X(STORE, "store", 2)     /* imm: buffer param; arg0 index, arg1 value */

typedef enum {
#define X(e, text, n) KIR_OP_##e,
  KIR_OPS(X)
#undef X
  KIR_OP_COUNT
} KirOp;

extern const char *const kir_op_name[KIR_OP_COUNT];
extern const int kir_op_nargs[KIR_OP_COUNT];
extern const char *const kir_cmp_name[];   /* by KirCmp */
extern const char *const kir_red_name[];   /* by KirRed */

typedef struct {
  KirOp op;
  KirType type;
  KirVal arg[3];   /* operands (all < this node's index); KIR_NONE past nargs */
  int64_t imm;
  float fimm;
  int scope;       /* loop the node was created in (-1: outside loops) */
  int loop;        /* loop it varies in; -1: row-level (see "Scope") */
  int avail;       /* row-level: loops that must finish before it exists */
} KirNode;

typedef struct {
  char *name;
  KirParamKind kind;
  KirElem elem;         /* buffers only */
  KirAccess access;     /* buffers only */
  int nloads, nstores;  /* uses, counted by the builder */
} KirParam;

/* Loop i owns the nodes created while it was open: [first, end).  Its STORE
 * and REDUCE nodes are what it executes; the others are values. */
typedef struct {
  KirVal extent;   /* row-level index node */
  KirVal col;      /* its COL node, KIR_NONE until kir_col asks */
  KirVal first, end;
} KirLoop;

typedef struct KirModule KirModule;

typedef struct {
  KirModule *mod;
  char *name;
  KirParam *params;
  int nparams;
  int64_t *rows;       /* row dim extents, outermost first, each >= 1 */
  int nrows;
  KirNode *nodes;      /* in creation order: operands precede users */
  int nnodes;
  KirLoop *loops;
  int nloops;
  int open;            /* the open loop, or -1 */
  int cap_params, cap_rows, cap_nodes, cap_loops;
  KirVal *cse;         /* value numbering: open-addressed table of nodes */
  int ncse, cap_cse;
} KirKernel;

struct KirModule {
  KirKernel **kernels;
  int nkernels, cap_kernels;
  int *names, cap_names; /* kir.c: kernel indices hashed by name (open
                            addressing, -1 empty, load <= 1/2), for the
                            unique-name check */
  char error[320];     /* first builder error; "" if none */
};

/* Module: owns its kernels; one free releases everything. */
KirModule *kir_module_new(void);
void kir_module_free(KirModule *m);
const char *kir_error(const KirModule *m);       /* NULL while no error */

/* Kernel.  name: a C identifier, unique in the module. */
KirKernel *kir_kernel_new(KirModule *m, const char *name);
int kir_row_dim(KirKernel *k, int64_t extent);   /* appends a row dim; its index */
int64_t kir_kernel_rows(const KirKernel *k);     /* product of row dims */
int kir_buf(KirKernel *k, const char *name, KirElem elem, KirAccess access);
int kir_scalar(KirKernel *k, const char *name, KirType type);  /* index or f32 */

/* Loops.  extent: a row-level index value. */
void kir_loop(KirKernel *k, KirVal extent);
void kir_end(KirKernel *k);

/* Leaves. */
KirVal kir_col(KirKernel *k);                    /* the open loop's index */
KirVal kir_row(KirKernel *k, int dim);           /* index along row dim */
KirVal kir_iconst(KirKernel *k, int64_t v);
KirVal kir_fconst(KirKernel *k, float v);
KirVal kir_param(KirKernel *k, int param);       /* a scalar param's value */

/* Arithmetic.  add, sub, mul, neg, max, min take index or f32 operands
 * (both of one type); the rest are as named. */
KirVal kir_add(KirKernel *k, KirVal a, KirVal b);
KirVal kir_sub(KirKernel *k, KirVal a, KirVal b);
KirVal kir_mul(KirKernel *k, KirVal a, KirVal b);
KirVal kir_div(KirKernel *k, KirVal a, KirVal b);        /* f32 */
KirVal kir_neg(KirKernel *k, KirVal a);
KirVal kir_max(KirKernel *k, KirVal a, KirVal b);
KirVal kir_min(KirKernel *k, KirVal a, KirVal b);
KirVal kir_idiv(KirKernel *k, KirVal a, int64_t d);      /* index / d, d > 0 */
KirVal kir_imod(KirKernel *k, KirVal a, int64_t d);      /* index % d, d > 0 */
KirVal kir_affine(KirKernel *k, KirVal a, int64_t stride, int64_t offset);
KirVal kir_abs(KirKernel *k, KirVal a);                  /* f32 */
KirVal kir_exp(KirKernel *k, KirVal a);
KirVal kir_log(KirKernel *k, KirVal a);
KirVal kir_tanh(KirKernel *k, KirVal a);
KirVal kir_sqrt(KirKernel *k, KirVal a);
KirVal kir_rsqrt(KirKernel *k, KirVal a);                /* 1 / sqrt(a) */
KirVal kir_itof(KirKernel *k, KirVal a);                 /* index -> f32 */
KirVal kir_cmp(KirKernel *k, KirCmp c, KirVal a, KirVal b);
KirVal kir_select(KirKernel *k, KirVal pred, KirVal a, KirVal b);

/* Memory.  An f32 buffer loads and stores f32; an i32 buffer loads index
 * values (sign-extended) and stores index values (truncated). */
KirVal kir_load(KirKernel *k, int buf, KirVal index);
void kir_store(KirKernel *k, int buf, KirVal index, KirVal value);

/* A reduction of `value` over the open loop; the result is usable once
 * that loop has ended. */
KirVal kir_reduce(KirKernel *k, KirRed op, KirVal value);

/* Liveness: live[v] = 1 iff node v is a statement (store, reduction), a
 * loop extent, or an operand of a live node; else 0.  live has nnodes
 * entries.  Dead nodes are neither printed nor lowered. */
void kir_fill_live(const KirKernel *k, unsigned char *live);

/* Whole-module checks the builder cannot make call by call (no loop left
 * open, at least one kernel).  0, or -1 with the first error in err. */
int kir_verify(const KirModule *m, char *err, size_t errlen);

/* Readable text, one node a line, loops as blocks, in execution order:
 * for debugging and golden tests.  %N are print numbers, not KirVal ids;
 * the text depends only on dataflow and statement order (kir_print.c). */
void kir_print_kernel(FILE *out, const KirKernel *k);
void kir_print(FILE *out, const KirModule *m);

/* The C header declaring every kernel of m (prototype, row count, contract
 * comment).  0, or -1 with a one-line message in err. */
int kir_write_header(const KirModule *m, const char *path, char *err, size_t errlen);

#endif
