/* codegen/kir_llvm.c -- lowering the kernel IR to native code with LLVM.
 *
 * Per kernel: one function whose body is the row loop.  Inside it, nodes
 * are emitted in the order they were built (operands always come first):
 * row-level values and row-level stores between loops where they were
 * built; for each loop, a preheader with the row-level values built while
 * it was open, a guard, a single-block rotated column loop (phi for the
 * column, one phi per reduction), and an exit block where reductions
 * become row-level values.  Dead values are not emitted.
 *
 * Invariant while emitting a kernel: val[v] != NULL iff v has been emitted
 * in a block that dominates everything emitted after it in this row
 * iteration (row-level values, finished reductions), or v varies in the
 * loop being emitted and sits in its body.  Row-level values are emitted
 * only at row points (the straight-line spine of the row body), never in a
 * column loop.  What the lowering guarantees is listed in kir_llvm.h.
 */
#include "codegen/kir_llvm.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/IRReader.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kir_math.h"

/* The accumulation of a sum reduction, with the one fast-math flag we
 * allow (see kir_llvm.h).  LLVM 14's C API cannot set fast-math flags, so
 * this instruction is parsed from text; the module starts as this helper. */
static const char prelude_ir[] =
    "define internal float @kir.sum.acc(float %acc, float %x) #0 {\n"
    "  %r = fadd reassoc float %acc, %x\n"
    "  ret float %r\n"
    "}\n"
    "attributes #0 = { alwaysinline nounwind readnone willreturn }\n";

typedef struct {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef f32, i32, i64, i1, vd;
  const KirLlvmOptions *opt;
  const char *cpu, *features;
  KirMathFn sum_acc;
  KirMathFn math[KIR_FN_COUNT];  /* filled on first use */
  char diag[320];                /* first error LLVM reported */
} Cg;

typedef struct {
  Cg *cg;
  const KirKernel *k;
  LLVMValueRef fn;
  LLVMValueRef row;      /* flat row index of the current iteration */
  LLVMValueRef *val;     /* per node; see the invariant above */
  unsigned char *live;   /* kir_fill_live */
} Kg;

void kir_llvm_defaults(KirLlvmOptions *o) {
  o->cpu = KIR_CPU_HOST;
  o->math = KIR_MATH_INLINE;
  o->opt_level = 3;
}

/* Copies msg into err as one line ("a\nb" -> "a; b"). */
static void one_line(char *err, size_t errlen, const char *what, const char *msg) {
  size_t n = 0;
  int w = snprintf(err, errlen, "%s: ", what);
  if (w < 0 || (size_t)w >= errlen) return;
  n = (size_t)w;
  for (const char *p = msg ? msg : "(no message)"; *p && n + 3 < errlen; p++) {
    if (*p == '\n') {
      if (p[1] == 0) break;
      err[n++] = ';';
      err[n++] = ' ';
    } else {
      err[n++] = *p;
    }
  }
  err[n] = 0;
}

static void diag_handler(LLVMDiagnosticInfoRef di, void *ctx) {
  Cg *cg = ctx;
  if (LLVMGetDiagInfoSeverity(di) != LLVMDSError || cg->diag[0]) return;
  char *msg = LLVMGetDiagInfoDescription(di);
  one_line(cg->diag, sizeof cg->diag, "LLVM", msg);
  LLVMDisposeMessage(msg);
}

static void add_attr(Cg *cg, LLVMValueRef fn, unsigned idx, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(cg->ctx, kind, 0));
}

static void add_str_attr(Cg *cg, LLVMValueRef fn, const char *key, const char *value) {
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                          LLVMCreateStringAttribute(cg->ctx, key, (unsigned)strlen(key), value,
                                                    (unsigned)strlen(value)));
}

static LLVMValueRef i64c(Cg *cg, int64_t v) {
  return LLVMConstInt(cg->i64, (unsigned long long)v, 1);
}
static LLVMValueRef i32c(Cg *cg, int32_t v) {
  return LLVMConstInt(cg->i32, (unsigned long long)(long long)v, 1);
}

/* Order-preserving int32 key of a float: signed key order is float order,
 * -0 just below +0.  Its own inverse. */
static int32_t float_key(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (int32_t)(u ^ ((u >> 31) ? 0x7fffffffu : 0u));
}

static LLVMValueRef key_flip(Cg *cg, LLVMValueRef bits) {
  LLVMValueRef sign = LLVMBuildAShr(cg->b, bits, i32c(cg, 31), "");
  return LLVMBuildXor(cg->b, bits, LLVMBuildAnd(cg->b, sign, i32c(cg, 0x7fffffff), ""), "");
}

static LLVMValueRef call_math(Kg *g, KirMathKind kind, LLVMValueRef x) {
  Cg *cg = g->cg;
  if (cg->opt->math == KIR_MATH_LIBM) {
    if (kind == KIR_FN_EXP) return kir_math_intrinsic(cg->mod, cg->b, "llvm.exp", &x, 1);
    if (kind == KIR_FN_LOG) return kir_math_intrinsic(cg->mod, cg->b, "llvm.log", &x, 1);
    if (!cg->math[kind].fn) {
      cg->math[kind].type = LLVMFunctionType(cg->f32, &cg->f32, 1, 0);
      cg->math[kind].fn = LLVMAddFunction(cg->mod, "tanhf", cg->math[kind].type);
      add_attr(cg, cg->math[kind].fn, LLVMAttributeFunctionIndex, "nounwind");
      add_attr(cg, cg->math[kind].fn, LLVMAttributeFunctionIndex, "readnone");
    }
  } else if (!cg->math[kind].fn) {
    cg->math[kind] = kir_math_inline(cg->mod, kind);
  }
  return LLVMBuildCall2(cg->b, cg->math[kind].type, cg->math[kind].fn, &x, 1, "");
}

static LLVMValueRef address(Kg *g, int buf, LLVMValueRef index) {
  LLVMTypeRef et = g->k->params[buf].elem == KIR_F32 ? g->cg->f32 : g->cg->i32;
  return LLVMBuildInBoundsGEP2(g->cg->b, et, LLVMGetParam(g->fn, (unsigned)buf), &index, 1, "");
}

static LLVMValueRef row_index(Kg *g, int dim) {
  Cg *cg = g->cg;
  const KirKernel *k = g->k;
  int64_t inner = 1;
  for (int d = dim + 1; d < k->nrows; d++) inner *= k->rows[d];
  LLVMValueRef v = g->row;  /* non-negative, so unsigned division is exact */
  if (inner > 1) v = LLVMBuildUDiv(cg->b, v, i64c(cg, inner), "");
  if (dim > 0) v = LLVMBuildURem(cg->b, v, i64c(cg, k->rows[dim]), "");
  return v;
}

/* Emits node v (operands already emitted) at the builder's position.
 * STORE, REDUCE and COL are emitted by their loop, not here. */
static LLVMValueRef emit(Kg *g, KirVal v) {
  Cg *cg = g->cg;
  LLVMBuilderRef b = cg->b;
  const KirNode *n = &g->k->nodes[v];
  LLVMValueRef a = n->arg[0] >= 0 ? g->val[n->arg[0]] : NULL;
  LLVMValueRef c = n->arg[1] >= 0 ? g->val[n->arg[1]] : NULL;
  LLVMValueRef t, u;
  switch (n->op) {
  case KIR_OP_ICONST: return i64c(cg, n->imm);
  case KIR_OP_FCONST: return LLVMConstReal(cg->f32, n->fimm);
  case KIR_OP_ROW: return row_index(g, (int)n->imm);
  case KIR_OP_PARAM: return LLVMGetParam(g->fn, (unsigned)n->imm);
  case KIR_OP_IADD: return LLVMBuildNSWAdd(b, a, c, "");
  case KIR_OP_ISUB: return LLVMBuildNSWSub(b, a, c, "");
  case KIR_OP_IMUL: return LLVMBuildNSWMul(b, a, c, "");
  case KIR_OP_IDIV: return LLVMBuildSDiv(b, a, i64c(cg, n->imm), "");
  case KIR_OP_IMOD: return LLVMBuildSRem(b, a, i64c(cg, n->imm), "");
  case KIR_OP_IMIN:
    return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, a, c, ""), a, c, "");
  case KIR_OP_IMAX:
    return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSGT, a, c, ""), a, c, "");
  case KIR_OP_LOAD: {
    int f32 = g->k->params[n->imm].elem == KIR_F32;
    t = LLVMBuildLoad2(b, f32 ? cg->f32 : cg->i32, address(g, (int)n->imm, a), "");
    LLVMSetAlignment(t, 4);
    return f32 ? t : LLVMBuildSExt(b, t, cg->i64, "");
  }
  case KIR_OP_FADD: return LLVMBuildFAdd(b, a, c, "");
  case KIR_OP_FSUB: return LLVMBuildFSub(b, a, c, "");
  case KIR_OP_FMUL: return LLVMBuildFMul(b, a, c, "");
  case KIR_OP_FDIV: return LLVMBuildFDiv(b, a, c, "");
  case KIR_OP_FNEG: return LLVMBuildFNeg(b, a, "");
  case KIR_OP_FMAX:
  case KIR_OP_FMIN:
    /* a if it wins or is NaN, else b: NaN on either side gives NaN. */
    t = LLVMBuildFCmp(b, n->op == KIR_OP_FMAX ? LLVMRealOGT : LLVMRealOLT, a, c, "");
    u = LLVMBuildFCmp(b, LLVMRealUNO, a, a, "");
    return LLVMBuildSelect(b, LLVMBuildOr(b, t, u, ""), a, c, "");
  case KIR_OP_FABS: return kir_math_intrinsic(cg->mod, b, "llvm.fabs", &a, 1);
  case KIR_OP_EXP: return call_math(g, KIR_FN_EXP, a);
  case KIR_OP_LOG: return call_math(g, KIR_FN_LOG, a);
  case KIR_OP_TANH: return call_math(g, KIR_FN_TANH, a);
  case KIR_OP_SQRT: return kir_math_intrinsic(cg->mod, b, "llvm.sqrt", &a, 1);
  case KIR_OP_RSQRT:
    t = kir_math_intrinsic(cg->mod, b, "llvm.sqrt", &a, 1);
    return LLVMBuildFDiv(b, LLVMConstReal(cg->f32, 1.0), t, "");
  case KIR_OP_ITOF: return LLVMBuildSIToFP(b, a, cg->f32, "");
  case KIR_OP_CMP:
    if (g->k->nodes[n->arg[0]].type == KIR_TY_INDEX) {
      /* ORDER KirCmp */
      static const LLVMIntPredicate ip[] = {LLVMIntSLT, LLVMIntSLE, LLVMIntSGT,
                                            LLVMIntSGE, LLVMIntEQ,  LLVMIntNE};
      return LLVMBuildICmp(b, ip[n->imm], a, c, "");
    } else {
      /* ORDER KirCmp; C semantics: ordered, except != */
      static const LLVMRealPredicate fp[] = {LLVMRealOLT, LLVMRealOLE, LLVMRealOGT,
                                             LLVMRealOGE, LLVMRealOEQ, LLVMRealUNE};
      return LLVMBuildFCmp(b, fp[n->imm], a, c, "");
    }
  case KIR_OP_SELECT: return LLVMBuildSelect(b, a, c, g->val[n->arg[2]], "");
  case KIR_OP_COL:
  case KIR_OP_REDUCE:
  case KIR_OP_STORE:
  case KIR_OP_COUNT: break;
  }
  return NULL;  /* unreachable: the caller never asks */
}

static void emit_store(Kg *g, const KirNode *n) {
  Cg *cg = g->cg;
  LLVMValueRef v = g->val[n->arg[1]];
  if (g->k->params[n->imm].elem == KIR_I32) v = LLVMBuildTrunc(cg->b, v, cg->i32, "");
  LLVMValueRef s = LLVMBuildStore(cg->b, v, address(g, (int)n->imm, g->val[n->arg[0]]));
  LLVMSetAlignment(s, 4);
}

/* Emits node v where it lives: row-level values and row-level stores at
 * the current row point. */
static void emit_at_row_point(Kg *g, KirVal v) {
  const KirNode *n = &g->k->nodes[v];
  if (n->op == KIR_OP_STORE) emit_store(g, n);
  else g->val[v] = emit(g, v);
}

/* A live row-level value (not a statement): emitted at a row point. */
static int row_value(const Kg *g, KirVal v) {
  const KirNode *n = &g->k->nodes[v];
  return g->live[v] && n->loop < 0 && n->op != KIR_OP_REDUCE && n->op != KIR_OP_STORE;
}

typedef struct {
  KirVal node;
  KirRed op;
  LLVMValueRef phi, next, init;
} Acc;

static void emit_loop(Kg *g, int l) {
  Cg *cg = g->cg;
  const KirKernel *k = g->k;
  const KirLoop *lp = &k->loops[l];
  /* Preheader: the row-level values built while this loop was open. */
  for (KirVal v = lp->first; v < lp->end; v++)
    if (row_value(g, v)) g->val[v] = emit(g, v);

  LLVMValueRef n = g->val[lp->extent];
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(cg->b);
  char name[32];
  snprintf(name, sizeof name, "loop%d", l);
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(cg->ctx, g->fn, name);
  snprintf(name, sizeof name, "loop%d.end", l);
  LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(cg->ctx, g->fn, name);
  LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSGT, n, i64c(cg, 0), ""), body, done);

  LLVMPositionBuilderAtEnd(cg->b, body);
  LLVMValueRef col = LLVMBuildPhi(cg->b, cg->i64, "col");
  if (lp->col != KIR_NONE) g->val[lp->col] = col;
  int nacc = 0;
  for (KirVal v = lp->first; v < lp->end; v++) nacc += k->nodes[v].op == KIR_OP_REDUCE;
  Acc *acc = calloc((size_t)nacc + 1, sizeof *acc);
  if (!acc) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  nacc = 0;
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *nd = &k->nodes[v];
    if (nd->op != KIR_OP_REDUCE) continue;
    Acc *a = &acc[nacc++];
    a->node = v;
    a->op = (KirRed)nd->imm;
    if (a->op == KIR_SUM) {
      a->init = LLVMConstReal(cg->f32, 0.0);
      a->phi = LLVMBuildPhi(cg->b, cg->f32, "sum");
    } else {
      a->init = i32c(cg, float_key(a->op == KIR_MAX ? -__builtin_inff() : __builtin_inff()));
      a->phi = LLVMBuildPhi(cg->b, cg->i32, a->op == KIR_MAX ? "max.key" : "min.key");
    }
  }

  /* The body, in creation order: loop-varying values, stores, reductions.
   * All of them were built while the loop was open, so lie in its range. */
  for (KirVal v = lp->first, ai = 0; v < lp->end; v++) {
    const KirNode *nd = &k->nodes[v];
    if (nd->op == KIR_OP_STORE) {
      emit_store(g, nd);
    } else if (nd->op == KIR_OP_REDUCE) {
      Acc *a = &acc[ai++];
      LLVMValueRef x = g->val[nd->arg[0]];
      if (a->op == KIR_SUM) {
        LLVMValueRef args[2] = {a->phi, x};
        a->next = LLVMBuildCall2(cg->b, cg->sum_acc.type, cg->sum_acc.fn, args, 2, "");
      } else {
        /* NaN gets the key that wins: propagates through max and min. */
        LLVMValueRef key = key_flip(cg, LLVMBuildBitCast(cg->b, x, cg->i32, ""));
        LLVMValueRef nan = LLVMBuildFCmp(cg->b, LLVMRealUNO, x, x, "");
        key = LLVMBuildSelect(cg->b, nan, i32c(cg, a->op == KIR_MAX ? INT32_MAX : INT32_MIN),
                              key, "");
        LLVMValueRef better =
            LLVMBuildICmp(cg->b, a->op == KIR_MAX ? LLVMIntSGT : LLVMIntSLT, key, a->phi, "");
        a->next = LLVMBuildSelect(cg->b, better, key, a->phi, "");
      }
    } else if (g->live[v] && nd->loop == l && nd->op != KIR_OP_COL) {
      g->val[v] = emit(g, v);
    }
  }
  LLVMValueRef next = LLVMBuildNUWAdd(cg->b, col, i64c(cg, 1), "col.next");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(cg->b);
  LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntEQ, next, n, ""), done, body);
  LLVMValueRef zero = i64c(cg, 0);
  LLVMAddIncoming(col, &zero, &pre, 1);
  LLVMAddIncoming(col, &next, &latch, 1);

  /* Phis first (they must head the block), then max/min keys back to f32. */
  LLVMPositionBuilderAtEnd(cg->b, done);
  for (int i = 0; i < nacc; i++) {
    Acc *a = &acc[i];
    LLVMAddIncoming(a->phi, &a->init, &pre, 1);
    LLVMAddIncoming(a->phi, &a->next, &latch, 1);
    LLVMValueRef out = LLVMBuildPhi(cg->b, LLVMTypeOf(a->init), "");
    LLVMAddIncoming(out, &a->init, &pre, 1);
    LLVMAddIncoming(out, &a->next, &latch, 1);
    g->val[a->node] = out;
  }
  for (int i = 0; i < nacc; i++)
    if (acc[i].op != KIR_SUM)
      g->val[acc[i].node] = LLVMBuildBitCast(cg->b, key_flip(cg, g->val[acc[i].node]), cg->f32, "");
  free(acc);
}

static void emit_kernel(Cg *cg, const KirKernel *k) {
  int np = k->nparams;
  LLVMTypeRef *pt = calloc((size_t)np + 2, sizeof *pt);
  Kg g = {.cg = cg, .k = k};
  g.val = calloc((size_t)k->nnodes + 1, sizeof *g.val);
  g.live = calloc((size_t)k->nnodes + 1, 1);
  if (!pt || !g.val || !g.live) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  for (int i = 0; i < np; i++) {
    const KirParam *p = &k->params[i];
    pt[i] = p->kind == KIR_PARAM_BUF ? LLVMPointerType(p->elem == KIR_F32 ? cg->f32 : cg->i32, 0)
            : p->kind == KIR_PARAM_I64 ? cg->i64
                                       : cg->f32;
  }
  pt[np] = pt[np + 1] = cg->i64;
  g.fn = LLVMAddFunction(cg->mod, k->name, LLVMFunctionType(cg->vd, pt, (unsigned)np + 2, 0));
  free(pt);
  add_attr(cg, g.fn, LLVMAttributeFunctionIndex, "nounwind");
  add_str_attr(cg, g.fn, "target-cpu", cg->cpu);
  add_str_attr(cg, g.fn, "target-features", cg->features);
  for (int i = 0; i < np; i++) {
    const KirParam *p = &k->params[i];
    LLVMValueRef arg = LLVMGetParam(g.fn, (unsigned)i);
    LLVMSetValueName2(arg, p->name, strlen(p->name));
    if (p->kind != KIR_PARAM_BUF) continue;
    unsigned idx = (unsigned)i + 1;
    add_attr(cg, g.fn, idx, "noalias");
    add_attr(cg, g.fn, idx, "nocapture");
    if (p->nstores == 0) add_attr(cg, g.fn, idx, "readonly");
    else if (p->nloads == 0) add_attr(cg, g.fn, idx, "writeonly");
  }
  LLVMValueRef rb = LLVMGetParam(g.fn, (unsigned)np), re = LLVMGetParam(g.fn, (unsigned)np + 1);
  LLVMSetValueName2(rb, "row_begin", 9);
  LLVMSetValueName2(re, "row_end", 7);

  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(cg->ctx, g.fn, "entry");
  LLVMBasicBlockRef rows = LLVMAppendBasicBlockInContext(cg->ctx, g.fn, "row");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(cg->ctx, g.fn, "exit");
  LLVMPositionBuilderAtEnd(cg->b, entry);
  LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, rb, re, ""), rows, exit);
  LLVMPositionBuilderAtEnd(cg->b, rows);
  g.row = LLVMBuildPhi(cg->b, cg->i64, "r");

  /* Everything in the order it was built; see "Semantics" in kir.h. */
  kir_fill_live(k, g.live);
  KirVal v = 0;
  for (int l = 0; l <= k->nloops; l++) {
    KirVal stop = l < k->nloops ? k->loops[l].first : k->nnodes;
    for (; v < stop; v++)
      if (row_value(&g, v) || k->nodes[v].op == KIR_OP_STORE) emit_at_row_point(&g, v);
    if (l == k->nloops) break;
    emit_loop(&g, l);
    v = k->loops[l].end;
  }

  LLVMValueRef next = LLVMBuildNSWAdd(cg->b, g.row, i64c(cg, 1), "r.next");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(cg->b);
  LLVMBuildCondBr(cg->b, LLVMBuildICmp(cg->b, LLVMIntSLT, next, re, ""), rows, exit);
  LLVMAddIncoming(g.row, &rb, &entry, 1);
  LLVMAddIncoming(g.row, &next, &latch, 1);
  LLVMPositionBuilderAtEnd(cg->b, exit);
  LLVMBuildRetVoid(cg->b);
  free(g.val);
  free(g.live);
}

/* The prelude module: the sum-accumulation helper, parsed from text. */
static int make_module(Cg *cg, char *err, size_t errlen) {
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(
      prelude_ir, sizeof prelude_ir - 1, "kir_prelude");
  char *msg = NULL;
  if (LLVMParseIRInContext(cg->ctx, buf, &cg->mod, &msg)) {  /* takes buf */
    one_line(err, errlen, "parsing the kernel prelude", msg);
    LLVMDisposeMessage(msg);
    return -1;
  }
  LLVMSetModuleIdentifier(cg->mod, "parc_kernels", 12);
  LLVMSetSourceFileName(cg->mod, "parc_kernels", 12);
  cg->sum_acc.fn = LLVMGetNamedFunction(cg->mod, "kir.sum.acc");
  cg->sum_acc.type = LLVMGlobalGetValueType(cg->sum_acc.fn);
  return 0;
}

static int native_ready;

int kir_llvm_emit(const KirModule *m, const KirLlvmOptions *o, const char *obj_path,
                  const char *ll_path, char *err, size_t errlen) {
  if (kir_verify(m, err, errlen)) return -1;
  for (int i = 0; i < m->nkernels; i++)
    for (int p = 0; p < m->kernels[i]->nparams; p++)
      if (m->kernels[i]->params[p].kind == KIR_PARAM_BUF &&
          (m->kernels[i]->params[p].elem == KIR_BF16 ||
           m->kernels[i]->params[p].elem == KIR_BF16R)) { /* kir.h: CUDA only */
        snprintf(err, errlen, "kernel '%s': bf16 buffer '%s' (the CPU lowering has f32 and i32)",
                 m->kernels[i]->name, m->kernels[i]->params[p].name);
        return -1;
      }
  if (o->opt_level < 0 || o->opt_level > 3) {
    snprintf(err, errlen, "optimization level %d is not 0..3", o->opt_level);
    return -1;
  }
  if (!native_ready) {
    if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()) {
      snprintf(err, errlen, "LLVM has no native target for this machine");
      return -1;
    }
    native_ready = 1;
  }
  int rc = -1;
  char *msg = NULL, *triple = LLVMGetDefaultTargetTriple();
  char *host_cpu = NULL, *host_features = NULL;
  LLVMTargetRef target;
  LLVMTargetMachineRef tm = NULL;
  LLVMPassBuilderOptionsRef pbo = NULL;
  Cg cg = {.opt = o};
  cg.ctx = LLVMContextCreate();
  LLVMContextSetDiagnosticHandler(cg.ctx, diag_handler, &cg);
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    one_line(err, errlen, "LLVM target", msg);
    goto out;
  }
  if (o->cpu == KIR_CPU_HOST) {
    host_cpu = LLVMGetHostCPUName();
    host_features = LLVMGetHostCPUFeatures();
    cg.cpu = host_cpu;
    cg.features = host_features;
  } else {
    cg.cpu = strncmp(triple, "x86_64", 6) == 0 ? "x86-64" : "generic";
    cg.features = "";
  }
  tm = LLVMCreateTargetMachine(target, triple, cg.cpu, cg.features,
                               o->opt_level ? LLVMCodeGenLevelAggressive : LLVMCodeGenLevelNone,
                               LLVMRelocPIC, LLVMCodeModelDefault);
  if (!tm) {
    snprintf(err, errlen, "LLVM cannot make a target machine for %s (cpu %s)", triple, cg.cpu);
    goto out;
  }
  if (make_module(&cg, err, errlen)) goto out;
  LLVMSetTarget(cg.mod, triple);
  LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(cg.mod, dl);
  LLVMDisposeTargetData(dl);
  cg.f32 = LLVMFloatTypeInContext(cg.ctx);
  cg.i32 = LLVMInt32TypeInContext(cg.ctx);
  cg.i64 = LLVMInt64TypeInContext(cg.ctx);
  cg.i1 = LLVMInt1TypeInContext(cg.ctx);
  cg.vd = LLVMVoidTypeInContext(cg.ctx);
  cg.b = LLVMCreateBuilderInContext(cg.ctx);
  for (int i = 0; i < m->nkernels; i++) {
    if (LLVMGetNamedFunction(cg.mod, m->kernels[i]->name)) {
      snprintf(err, errlen, "kernel '%s': name clashes with a symbol of the CPU module",
               m->kernels[i]->name);
      goto out;
    }
    emit_kernel(&cg, m->kernels[i]);
  }
  if (LLVMVerifyModule(cg.mod, LLVMReturnStatusAction, &msg)) {
    one_line(err, errlen, "LLVM module does not verify (a kir lowering bug)", msg);
    goto out;
  }
  LLVMDisposeMessage(msg);
  msg = NULL;

  pbo = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(pbo, o->opt_level >= 2);
  LLVMPassBuilderOptionsSetSLPVectorization(pbo, o->opt_level >= 2);
  LLVMPassBuilderOptionsSetLoopInterleaving(pbo, o->opt_level >= 2);
  LLVMPassBuilderOptionsSetLoopUnrolling(pbo, o->opt_level >= 2);
  char pipeline[32];
  snprintf(pipeline, sizeof pipeline, "default<O%d>", o->opt_level);
  LLVMErrorRef e = LLVMRunPasses(cg.mod, pipeline, tm, pbo);
  if (e) {
    char *em = LLVMGetErrorMessage(e);
    one_line(err, errlen, "LLVM optimization", em);
    LLVMDisposeErrorMessage(em);
    goto out;
  }
  if (cg.diag[0]) {
    snprintf(err, errlen, "%s", cg.diag);
    goto out;
  }
  /* Print before emitting: code generation rewrites the IR in place. */
  if (ll_path && LLVMPrintModuleToFile(cg.mod, ll_path, &msg)) {
    one_line(err, errlen, "writing the .ll", msg);
    goto out;
  }
  if (obj_path) {
    size_t len = strlen(obj_path) + 1;
    char *path = malloc(len);  /* the C API wants a mutable string */
    if (path) memcpy(path, obj_path, len);
    if (!path) {
      snprintf(err, errlen, "out of memory");
      goto out;
    }
    LLVMBool bad = LLVMTargetMachineEmitToFile(tm, cg.mod, path, LLVMObjectFile, &msg);
    free(path);
    if (bad) {
      one_line(err, errlen, "writing the object file", msg);
      goto out;
    }
  }
  if (cg.diag[0]) {
    snprintf(err, errlen, "%s", cg.diag);
    goto out;
  }
  rc = 0;
out:
  LLVMDisposeMessage(msg);
  if (pbo) LLVMDisposePassBuilderOptions(pbo);
  if (cg.b) LLVMDisposeBuilder(cg.b);
  if (cg.mod) LLVMDisposeModule(cg.mod);
  if (tm) LLVMDisposeTargetMachine(tm);
  LLVMContextDispose(cg.ctx);
  LLVMDisposeMessage(host_cpu);
  LLVMDisposeMessage(host_features);
  LLVMDisposeMessage(triple);
  return rc;
}
