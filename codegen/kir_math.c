/* codegen/kir_math.c -- inline f32 exp, log and tanh for the CPU lowering.
 *
 * All three reduce the argument by powers of two and evaluate a short
 * polynomial on what is left; the power of two is rebuilt from integer bits.
 * No tables, no branches: special inputs (NaN, infinities, zero, overflow,
 * denormals) are fixed up with selects, so every lane of a vector computes
 * the same instructions.
 *
 *   exp(x)  = 2^k * p(r),  k = round(x / ln2),  r = x - k ln2 (Cody-Waite,
 *             |r| <= ln2/2), p = Taylor series of e^r to degree 7 (the
 *             truncation error r^8/8! < 1e-8 relative, well under an ulp).
 *             2^k is applied as two factors, so results that overflow,
 *             underflow or land in the denormal range round once, correctly.
 *   log(x)  = e ln2 + log1p(f),  x = 2^e (1 + f),  1 + f in [sqrt(1/2),
 *             sqrt(2)); log1p(f) = 2 atanh(s) with s = f / (2 + f), written
 *             as f - s (f - R(s^2)) so the leading term f is exact.
 *   tanh(x) = sign(x) * m / (m + 2),  m = expm1(2|x|), with expm1 by the
 *             same reduction as exp (2^k (1 + q) - 1, q = expm1(r)), which
 *             keeps full relative accuracy near zero; |x| >= 10 gives +-1.
 */
#include "codegen/kir_math.h"

#include <string.h>

typedef struct {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef f32, i32;
} Fn;

static const char *const fn_name[KIR_FN_COUNT] = {"kir.exp", "kir.log", "kir.tanh"};

#define LOG2E 1.44269504088896340736
#define LN2_HI 0.693145751953125          /* 15 significant bits: k * LN2_HI is exact */
#define LN2_LO 1.42860682030941723212e-6  /* ln 2 - LN2_HI */
#define ROUNDER 12582912.0                /* 1.5 * 2^23: adding it rounds to an integer */

LLVMValueRef kir_math_intrinsic(LLVMModuleRef mod, LLVMBuilderRef b, const char *name,
                                LLVMValueRef *args, unsigned nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef t = LLVMTypeOf(args[0]);
  LLVMValueRef decl = LLVMGetIntrinsicDeclaration(mod, id, &t, 1);
  LLVMTypeRef ft = LLVMIntrinsicGetType(LLVMGetModuleContext(mod), id, &t, 1);
  return LLVMBuildCall2(b, ft, decl, args, nargs, "");
}

static LLVMValueRef cf(Fn *f, double v) { return LLVMConstReal(f->f32, v); }
static LLVMValueRef ci(Fn *f, int v) {
  return LLVMConstInt(f->i32, (unsigned long long)(long long)v, 1);
}

static LLVMValueRef fma_(Fn *f, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
  LLVMValueRef args[3] = {a, b, c};
  return kir_math_intrinsic(f->mod, f->b, "llvm.fmuladd", args, 3);
}

static LLVMValueRef fsel(Fn *f, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b,
                         LLVMValueRef then, LLVMValueRef other) {
  return LLVMBuildSelect(f->b, LLVMBuildFCmp(f->b, p, a, b, ""), then, other, "");
}

/* c[0] + r*(c[1] + r*(... + r*c[n-1])). */
static LLVMValueRef horner(Fn *f, LLVMValueRef r, const double *c, int n) {
  LLVMValueRef p = cf(f, c[n - 1]);
  for (int i = n - 2; i >= 0; i--) p = fma_(f, p, r, cf(f, c[i]));
  return p;
}

/* 2^k for an i32 k in [-126, 127]. */
static LLVMValueRef pow2(Fn *f, LLVMValueRef k) {
  LLVMValueRef e = LLVMBuildShl(f->b, LLVMBuildAdd(f->b, k, ci(f, 127), ""), ci(f, 23), "");
  return LLVMBuildBitCast(f->b, e, f->f32, "");
}

/* k = round(x / ln2) as f32 and i32, r = x - k ln2; x must be finite and
 * |x| < 2^22 ln2. */
static void reduce_ln2(Fn *f, LLVMValueRef x, LLVMValueRef *kf, LLVMValueRef *ki,
                       LLVMValueRef *r) {
  LLVMValueRef t = fma_(f, x, cf(f, LOG2E), cf(f, ROUNDER));
  *kf = LLVMBuildFSub(f->b, t, cf(f, ROUNDER), "k");
  *ki = LLVMBuildFPToSI(f->b, *kf, f->i32, "");
  LLVMValueRef rr = fma_(f, *kf, cf(f, -LN2_HI), x);
  *r = fma_(f, *kf, cf(f, -LN2_LO), rr);
}

static LLVMValueRef build_exp(Fn *f, LLVMValueRef x) {
  /* e^-104 rounds to 0 and e^88.8 overflows: clamping changes nothing else.
   * ult sends NaN to the clamp so no NaN reaches fptosi; it is put back last. */
  LLVMValueRef xc = fsel(f, LLVMRealULT, x, cf(f, -104.0), cf(f, -104.0), x);
  xc = fsel(f, LLVMRealOGT, xc, cf(f, 88.8), cf(f, 88.8), xc);
  LLVMValueRef kf, ki, r;
  reduce_ln2(f, xc, &kf, &ki, &r);
  static const double c[] = {1.0, 1.0, 1 / 2.0, 1 / 6.0, 1 / 24.0, 1 / 120.0, 1 / 720.0,
                             1 / 5040.0};
  LLVMValueRef p = horner(f, r, c, 8);
  /* k in [-150, 128]: halves in [-75, 64], each a normal power of two. */
  LLVMValueRef k1 = LLVMBuildAShr(f->b, ki, ci(f, 1), "");
  LLVMValueRef k2 = LLVMBuildSub(f->b, ki, k1, "");
  LLVMValueRef y = LLVMBuildFMul(f->b, LLVMBuildFMul(f->b, p, pow2(f, k1), ""), pow2(f, k2), "");
  return fsel(f, LLVMRealUNO, x, x, x, y);
}

static LLVMValueRef build_log(Fn *f, LLVMValueRef x) {
  /* Denormals: scale into the normal range first. */
  LLVMValueRef tiny = LLVMBuildFCmp(f->b, LLVMRealOLT, x, cf(f, 0x1p-126), "");
  LLVMValueRef xs = LLVMBuildSelect(f->b, tiny, LLVMBuildFMul(f->b, x, cf(f, 0x1p23), ""), x, "");
  LLVMValueRef bits = LLVMBuildBitCast(f->b, xs, f->i32, "");
  LLVMValueRef e = LLVMBuildSub(f->b, LLVMBuildLShr(f->b, bits, ci(f, 23), ""), ci(f, 127), "");
  e = LLVMBuildAdd(f->b, e, LLVMBuildSelect(f->b, tiny, ci(f, -23), ci(f, 0), ""), "");
  LLVMValueRef mbits =
      LLVMBuildOr(f->b, LLVMBuildAnd(f->b, bits, ci(f, 0x7fffff), ""), ci(f, 0x3f800000), "");
  LLVMValueRef m = LLVMBuildBitCast(f->b, mbits, f->f32, "");  /* [1, 2) */
  LLVMValueRef big = LLVMBuildFCmp(f->b, LLVMRealOGT, m, cf(f, 1.41421356237309504880), "");
  m = LLVMBuildSelect(f->b, big, LLVMBuildFMul(f->b, m, cf(f, 0.5), ""), m, "");
  e = LLVMBuildSelect(f->b, big, LLVMBuildAdd(f->b, e, ci(f, 1), ""), e, "");
  LLVMValueRef fr = LLVMBuildFSub(f->b, m, cf(f, 1.0), "");  /* exact */
  LLVMValueRef s = LLVMBuildFDiv(f->b, fr, LLVMBuildFAdd(f->b, fr, cf(f, 2.0), ""), "");
  LLVMValueRef z = LLVMBuildFMul(f->b, s, s, "");
  static const double c[] = {2 / 3.0, 2 / 5.0, 2 / 7.0, 2 / 9.0};
  LLVMValueRef R = LLVMBuildFMul(f->b, z, horner(f, z, c, 4), "");
  LLVMValueRef l1p = LLVMBuildFSub(
      f->b, fr, LLVMBuildFMul(f->b, s, LLVMBuildFSub(f->b, fr, R, ""), ""), "");
  LLVMValueRef ef = LLVMBuildSIToFP(f->b, e, f->f32, "");
  LLVMValueRef y = fma_(f, ef, cf(f, LN2_HI), fma_(f, ef, cf(f, LN2_LO), l1p));
  y = fsel(f, LLVMRealOEQ, x, cf(f, __builtin_inf()), x, y);
  y = fsel(f, LLVMRealOEQ, x, cf(f, 0.0), cf(f, -__builtin_inf()), y);
  return fsel(f, LLVMRealULT, x, cf(f, 0.0), cf(f, __builtin_nan("")), y);
}

static LLVMValueRef build_tanh(Fn *f, LLVMValueRef x) {
  LLVMValueRef a = kir_math_intrinsic(f->mod, f->b, "llvm.fabs", &x, 1);
  LLVMValueRef y = LLVMBuildFMul(f->b, a, cf(f, 2.0), "");
  /* tanh(10) rounds to 1; ugt also sends NaN to the clamp. */
  y = fsel(f, LLVMRealUGT, y, cf(f, 20.0), cf(f, 20.0), y);
  LLVMValueRef kf, ki, r;
  reduce_ln2(f, y, &kf, &ki, &r);
  static const double c[] = {1 / 2.0,   1 / 6.0,    1 / 24.0,   1 / 120.0,
                             1 / 720.0, 1 / 5040.0, 1 / 40320.0};
  LLVMValueRef q = fma_(f, LLVMBuildFMul(f->b, r, r, ""), horner(f, r, c, 7), r);
  LLVMValueRef s = pow2(f, ki);  /* k in [0, 29] */
  LLVMValueRef m = fma_(f, s, q, LLVMBuildFSub(f->b, s, cf(f, 1.0), ""));
  LLVMValueRef t = LLVMBuildFDiv(f->b, m, LLVMBuildFAdd(f->b, m, cf(f, 2.0), ""), "");
  LLVMValueRef args[2] = {t, x};
  LLVMValueRef res = kir_math_intrinsic(f->mod, f->b, "llvm.copysign", args, 2);
  return fsel(f, LLVMRealUNO, x, x, x, res);
}

static void fn_attr(LLVMContextRef ctx, LLVMValueRef fn, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(ctx, kind, 0));
}

KirMathFn kir_math_inline(LLVMModuleRef mod, KirMathKind kind) {
  Fn f = {.ctx = LLVMGetModuleContext(mod), .mod = mod};
  f.f32 = LLVMFloatTypeInContext(f.ctx);
  f.i32 = LLVMInt32TypeInContext(f.ctx);
  KirMathFn r = {LLVMGetNamedFunction(mod, fn_name[kind]), LLVMFunctionType(f.f32, &f.f32, 1, 0)};
  if (r.fn) return r;
  r.fn = LLVMAddFunction(mod, fn_name[kind], r.type);
  LLVMSetLinkage(r.fn, LLVMInternalLinkage);
  static const char *const attrs[] = {"alwaysinline", "nounwind", "readnone", "willreturn"};
  for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++) fn_attr(f.ctx, r.fn, attrs[i]);
  f.b = LLVMCreateBuilderInContext(f.ctx);
  LLVMPositionBuilderAtEnd(f.b, LLVMAppendBasicBlockInContext(f.ctx, r.fn, "entry"));
  LLVMValueRef x = LLVMGetParam(r.fn, 0);
  LLVMValueRef y = kind == KIR_FN_EXP   ? build_exp(&f, x)
                   : kind == KIR_FN_LOG ? build_log(&f, x)
                                        : build_tanh(&f, x);
  LLVMBuildRet(f.b, y);
  LLVMDisposeBuilder(f.b);
  return r;
}
