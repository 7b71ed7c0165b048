/* codegen/kir_llvm.h -- CPU code for the kernel IR, through the LLVM C API.
 *
 * kir_llvm_emit lowers every kernel of a module into one LLVM module, runs
 * LLVM's O3 pipeline for the chosen CPU, and writes the object file and the
 * optimized .ll beside it.  Each kernel becomes an external C function
 *
 *   void NAME(params in declaration order, int64_t row_begin, int64_t row_end)
 *
 * (buffers as float* / int32_t*, scalars as int64_t / float), declared by
 * kir_write_header (codegen/kir.h), with the contract stated there.
 *
 * WHAT THE LOWERING GUARANTEES
 *
 *   - Every buffer parameter is `noalias nocapture`, plus `readonly` when the
 *     kernel never stores to it and `writeonly` when it never loads from it;
 *     valid under the caller contract of kir.h (a written buffer overlaps no
 *     other argument).  The functions are `nounwind` and carry their
 *     target-cpu / target-features.  Index arithmetic is `nsw`, addresses
 *     are `inbounds` GEPs, the column counter is `nuw`, the row counter
 *     `nsw`.  Objects are position independent (PIC).
 *   - Loops are emitted in rotated form with phi nodes (a guard, one body
 *     block, a latch that compares the next index with the extent), which is
 *     what LLVM's loop vectorizer wants; column loops of pointwise work and
 *     sum reductions vectorize (tests/kir checks the .ll for vector code).
 *   - Floating point: no fast-math flags on user arithmetic; every f32 op is
 *     rounded as written (no contraction, no reassociation, NaN and infinity
 *     kept), so pointwise kernels made of + - * / sqrt agree bitwise with C
 *     compiled without -ffast-math.  The single exception is the
 *     accumulation of a sum reduction, which carries `reassoc` and nothing
 *     else: that licenses the vectorizer to keep VF x interleave partial
 *     sums and add them up at the end, which is what makes reductions fast
 *     and is usually more accurate than one serial sum.  The order is fixed
 *     when the object is compiled: results are bitwise reproducible from run
 *     to run and independent of how rows are split across calls or threads,
 *     but may differ in the last bits between KIR_CPU_HOST and
 *     KIR_CPU_GENERIC objects (different vector widths).  (LLVM 14's C API
 *     cannot set fast-math flags, so that one instruction comes from a tiny
 *     textual-IR helper, inlined away by the pipeline.)
 *   - max/min reductions are exact and need no reassociation: each f32 maps
 *     to an int32 key whose signed order is the float order (NaN mapped to
 *     the extreme that makes it win), reduced with integer max/min, which
 *     vectorizes, and mapped back.  NaN propagates.
 *   - exp, log, tanh (KIR_MATH_INLINE, the default) are emitted inline as
 *     straight-line f32 code (range reduction + polynomial; no table, no
 *     branch, no libm call), so loops that use them vectorize, and results
 *     do not depend on the machine's libm (they may differ in the last bit
 *     between CPUs with and without FMA).  Largest error against the exact
 *     value over all 2^32 inputs (`kir_check exhaustive`): exp 0.94 ulp
 *     (1.22 without FMA), log 0.95 ulp, tanh 2.42 ulp, with IEEE special
 *     cases: exp(-inf) = 0, overflow to inf, correctly rounded denormal
 *     results; log(0) = -inf, log(x < 0) = NaN; tanh(+-inf) = +-1, tanh(-0)
 *     = -0; NaN in, NaN out.  The unit tests hold them to 2, 2 and 3 ulp
 *     on 4M samples.  KIR_MATH_LIBM calls expf/logf/tanhf instead (scalar
 *     loops; for reference runs).  sqrt is IEEE (llvm.sqrt); rsqrt is
 *     1/sqrt, two correctly rounded steps (< 1.5 ulp).
 *
 * Not thread-safe with other LLVM users in the process (it initialises the
 * native target once).  Nothing aborts: every failure, LLVM's included,
 * comes back as one line in err.
 */
#ifndef PARC_KIR_LLVM_H
#define PARC_KIR_LLVM_H

#include <stddef.h>

#include "codegen/kir.h"

typedef enum {
  KIR_CPU_HOST,     /* this machine's CPU and features (fastest; not portable) */
  KIR_CPU_GENERIC,  /* baseline x86-64 (SSE2), or "generic" on other targets */
} KirCpu;

typedef enum { KIR_MATH_INLINE, KIR_MATH_LIBM } KirMath;

typedef struct {
  KirCpu cpu;
  KirMath math;
  int opt_level;    /* 0..3: the "default<On>" pipeline */
} KirLlvmOptions;

void kir_llvm_defaults(KirLlvmOptions *o);   /* host CPU, inline math, O3 */

/* Lowers m, verifies the LLVM module, optimizes it, writes ll_path (the
 * optimized IR) and obj_path (a relocatable PIC object); either path may be
 * NULL.  0, or -1 with a one-line message in err. */
int kir_llvm_emit(const KirModule *m, const KirLlvmOptions *o, const char *obj_path,
                  const char *ll_path, char *err, size_t errlen);

#endif
