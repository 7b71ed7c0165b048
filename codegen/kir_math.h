/* codegen/kir_math.h -- f32 exp, log, tanh as LLVM IR the vectorizer can widen.
 *
 * Internal to the CPU lowering (kir_llvm.c).  Each function is defined once
 * per LLVM module as `internal float kir.NAME(float)`, alwaysinline and
 * readnone, built from straight-line arithmetic, integer bit tricks and
 * selects only, so a loop calling it vectorizes after inlining.  Error
 * bounds are stated in kir_llvm.h and measured by tests/kir. */
#ifndef PARC_KIR_MATH_H
#define PARC_KIR_MATH_H

#include <llvm-c/Core.h>

typedef struct {
  LLVMValueRef fn;
  LLVMTypeRef type;
} KirMathFn;

typedef enum { KIR_FN_EXP, KIR_FN_LOG, KIR_FN_TANH, KIR_FN_COUNT } KirMathKind;

/* The inline definition of `kind` in mod, made on first use. */
KirMathFn kir_math_inline(LLVMModuleRef mod, KirMathKind kind);

/* Calls the overloaded intrinsic `name` (e.g. "llvm.fmuladd") at type of
 * args[0]. */
LLVMValueRef kir_math_intrinsic(LLVMModuleRef mod, LLVMBuilderRef b, const char *name,
                                LLVMValueRef *args, unsigned nargs);

#endif
