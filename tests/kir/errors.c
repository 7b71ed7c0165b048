/* tests/kir/errors.c -- every builder misuse is caught at the call that
 * makes it, with a one-line message, and lowering failures come back as
 * one line too; nothing aborts.
 *
 *   kir_errors DIR     (DIR: where the lowering may write its files) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kir_llvm.h"

static int failures;

#define EXPECT(cond)                                                  \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                     \
    }                                                                 \
  } while (0)

/* The module's first error contains want, and is one line. */
static void expect_error(KirModule *m, const char *want, int line) {
  const char *e = kir_error(m);
  if (!e || !strstr(e, want) || strchr(e, '\n')) {
    fprintf(stderr, "%s:%d: error \"%s\", want one containing \"%s\"\n", __FILE__, line,
            e ? e : "(none)", want);
    failures++;
  }
  kir_module_free(m);
}
#define EXPECT_ERROR(m, want) expect_error(m, want, __LINE__)

/* A kernel with one row dim of 4, buffers x (f32 in), y (f32 out),
 * t (i32 in), and an open loop over 8 columns. */
typedef struct {
  KirModule *m;
  KirKernel *k;
  int x, y, t;
  KirVal col;
} Fixture;

static Fixture fixture(void) {
  Fixture f;
  f.m = kir_module_new();
  f.k = kir_kernel_new(f.m, "k");
  kir_row_dim(f.k, 4);
  f.x = kir_buf(f.k, "x", KIR_F32, KIR_IN);
  f.y = kir_buf(f.k, "y", KIR_F32, KIR_OUT);
  f.t = kir_buf(f.k, "t", KIR_I32, KIR_IN);
  kir_loop(f.k, kir_iconst(f.k, 8));
  f.col = kir_col(f.k);
  return f;
}

static void builder_errors(void) {
  Fixture f = fixture();
  kir_add(f.k, f.col, kir_load(f.k, f.x, f.col));
  EXPECT_ERROR(f.m, "kernel 'k': add: operands are index and f32");

  f = fixture();
  KirVal v = kir_load(f.k, f.x, f.col);
  kir_end(f.k);
  kir_store(f.k, f.y, kir_iconst(f.k, 0), v);
  EXPECT_ERROR(f.m, "store: %2 varies in loop 0 but is used outside it");

  f = fixture();
  v = kir_load(f.k, f.x, f.col);
  kir_end(f.k);
  kir_loop(f.k, kir_iconst(f.k, 8));
  kir_exp(f.k, v);
  EXPECT_ERROR(f.m, "varies in loop 0 but is used in loop 1");

  f = fixture();
  v = kir_reduce(f.k, KIR_SUM, kir_load(f.k, f.x, f.col));
  kir_store(f.k, f.y, f.col, v);
  EXPECT_ERROR(f.m, "needs loop 0's reduction, which has not finished here");

  f = fixture();  /* ... and as the extent of the next loop it is fine */
  v = kir_reduce(f.k, KIR_MAX, kir_load(f.k, f.x, f.col));
  kir_end(f.k);
  kir_store(f.k, f.y, kir_row(f.k, 0), v);
  EXPECT(kir_error(f.m) == NULL);
  kir_module_free(f.m);

  f = fixture();
  kir_store(f.k, f.x, f.col, kir_fconst(f.k, 1));
  EXPECT_ERROR(f.m, "store: buffer 'x' is declared in (read-only)");

  f = fixture();
  kir_store(f.k, f.t, f.col, kir_fconst(f.k, 1));  /* t is in, checked first */
  EXPECT_ERROR(f.m, "read-only");

  f = fixture();
  kir_loop(f.k, kir_iconst(f.k, 2));
  EXPECT_ERROR(f.m, "loop 0 is still open (loops do not nest)");

  f = fixture();
  kir_end(f.k);
  kir_col(f.k);
  EXPECT_ERROR(f.m, "col: no loop is open");

  f = fixture();
  kir_end(f.k);
  kir_end(f.k);
  EXPECT_ERROR(f.m, "end: no loop is open");

  f = fixture();
  kir_reduce(f.k, KIR_SUM, f.col);
  EXPECT_ERROR(f.m, "reduce: %1 is index, expected f32");

  f = fixture();
  kir_idiv(f.k, f.col, 0);
  EXPECT_ERROR(f.m, "idiv: divisor 0 is not positive");

  f = fixture();
  kir_select(f.k, kir_fconst(f.k, 1), f.col, f.col);
  EXPECT_ERROR(f.m, "is f32, expected pred");

  f = fixture();
  kir_select(f.k, kir_cmp(f.k, KIR_LT, f.col, f.col), f.col, kir_fconst(f.k, 0));
  EXPECT_ERROR(f.m, "select: arms are index and f32");

  f = fixture();
  kir_cmp(f.k, KIR_LT, f.col, kir_fconst(f.k, 0));
  EXPECT_ERROR(f.m, "cmp: operands are index and f32");

  f = fixture();
  kir_div(f.k, f.col, f.col);
  EXPECT_ERROR(f.m, "div: operands are index and index");

  f = fixture();
  kir_row(f.k, 1);
  EXPECT_ERROR(f.m, "row: dim 1 out of range (1 row dims)");

  f = fixture();
  kir_row_dim(f.k, 3);
  EXPECT_ERROR(f.m, "row dims must be declared before any value");

  f = fixture();
  kir_load(f.k, 7, f.col);
  EXPECT_ERROR(f.m, "load: 7 is not a buffer param");

  f = fixture();
  kir_param(f.k, f.x);
  EXPECT_ERROR(f.m, "param: 0 is not a scalar param");

  f = fixture();
  kir_mul(f.k, kir_iconst(f.k, INT64_MAX), kir_iconst(f.k, 2));
  EXPECT_ERROR(f.m, "constant index arithmetic overflows int64");

  f = fixture();
  kir_end(f.k);
  kir_loop(f.k, kir_fconst(f.k, 3));
  EXPECT_ERROR(f.m, "loop extent: %2 is f32, expected index");

  f = fixture();
  kir_exp(f.k, 99);
  EXPECT_ERROR(f.m, "exp: %99 is not a value of this kernel");

  KirModule *m = kir_module_new();
  KirKernel *k = kir_kernel_new(m, "k");
  kir_buf(k, "a", KIR_F32, KIR_IN);
  kir_buf(k, "a", KIR_F32, KIR_IN);
  EXPECT_ERROR(m, "param name 'a' used twice");

  m = kir_module_new();
  kir_scalar(kir_kernel_new(m, "k"), "row_end", KIR_TY_INDEX);
  EXPECT_ERROR(m, "param name 'row_end' is reserved");

  m = kir_module_new();
  kir_kernel_new(m, "k");
  kir_kernel_new(m, "k");
  EXPECT_ERROR(m, "kernel 'k': kernel name used twice");

  m = kir_module_new();
  kir_kernel_new(m, "9lives");
  EXPECT_ERROR(m, "kernel name is not a C identifier");

  m = kir_module_new();
  kir_row_dim(kir_kernel_new(m, "k"), 0);
  EXPECT_ERROR(m, "row dim extent 0 is not positive");

  /* After the first error, calls given KIR_NONE stay quiet and the first
   * message is kept. */
  f = fixture();
  v = kir_add(f.k, f.col, kir_fconst(f.k, 1));
  EXPECT(v == KIR_NONE);
  EXPECT(kir_exp(f.k, kir_mul(f.k, v, v)) == KIR_NONE);
  kir_store(f.k, f.y, v, v);
  EXPECT_ERROR(f.m, "add: operands are index and f32");
}

static void folding(void) {
  Fixture f = fixture();
  EXPECT(kir_add(f.k, f.col, kir_iconst(f.k, 0)) == f.col);
  EXPECT(kir_mul(f.k, kir_iconst(f.k, 1), f.col) == f.col);
  EXPECT(kir_idiv(f.k, f.col, 1) == f.col);
  KirVal c = kir_affine(f.k, kir_iconst(f.k, 6), 7, -2);
  EXPECT(f.k->nodes[c].op == KIR_OP_ICONST && f.k->nodes[c].imm == 40);
  EXPECT(kir_error(f.m) == NULL);
  kir_module_free(f.m);
}

static int one_line(const char *err) { return err[0] && !strchr(err, '\n'); }

static void lowering(const char *dir) {
  char err[512], obj[1024], ll[1024], h[1024];
  KirLlvmOptions o;
  kir_llvm_defaults(&o);

  KirModule *m = kir_module_new();
  EXPECT(kir_llvm_emit(m, &o, NULL, NULL, err, sizeof err) == -1);
  EXPECT(strcmp(err, "module has no kernels") == 0);
  kir_module_free(m);

  Fixture f = fixture();  /* loop never ended */
  EXPECT(kir_verify(f.m, err, sizeof err) == -1 && strstr(err, "loop 0 is never ended"));
  EXPECT(kir_llvm_emit(f.m, &o, NULL, NULL, err, sizeof err) == -1 && one_line(err));
  EXPECT(kir_write_header(f.m, "/nonexistent/x.h", err, sizeof err) == -1);
  kir_end(f.k);
  kir_store(f.k, f.y, kir_row(f.k, 0), kir_fconst(f.k, 2));
  EXPECT(kir_verify(f.m, err, sizeof err) == 0);

  /* Unwritable paths: one line each, nothing aborts. */
  EXPECT(kir_llvm_emit(f.m, &o, "/nonexistent/dir/k.o", NULL, err, sizeof err) == -1);
  EXPECT(one_line(err) && strstr(err, "writing the object file"));
  EXPECT(kir_llvm_emit(f.m, &o, NULL, "/nonexistent/dir/k.ll", err, sizeof err) == -1);
  EXPECT(one_line(err) && strstr(err, "writing the .ll"));
  EXPECT(kir_write_header(f.m, "/nonexistent/dir/k.h", err, sizeof err) == -1);
  EXPECT(one_line(err) && strstr(err, "cannot write '/nonexistent/dir/k.h'"));
  o.opt_level = 4;
  EXPECT(kir_llvm_emit(f.m, &o, NULL, NULL, err, sizeof err) == -1 && one_line(err));

  /* Every level, both CPUs, both math modes write the three files. */
  snprintf(obj, sizeof obj, "%s/errors_k.o", dir);
  snprintf(ll, sizeof ll, "%s/errors_k.ll", dir);
  snprintf(h, sizeof h, "%s/errors_k.h", dir);
  for (int level = 0; level <= 3; level++)
    for (int cpu = 0; cpu < 2; cpu++) {
      o.opt_level = level;
      o.cpu = cpu ? KIR_CPU_GENERIC : KIR_CPU_HOST;
      o.math = level % 2 ? KIR_MATH_LIBM : KIR_MATH_INLINE;
      remove(obj);
      int rc = kir_llvm_emit(f.m, &o, obj, ll, err, sizeof err);
      if (rc) fprintf(stderr, "O%d cpu %d: %s\n", level, cpu, err);
      EXPECT(rc == 0);
      FILE *fp = fopen(obj, "rb");
      EXPECT(fp != NULL);
      if (fp) fclose(fp);
    }
  EXPECT(kir_write_header(f.m, h, err, sizeof err) == 0);
  kir_module_free(f.m);
}

int main(int argc, char **argv) {
  builder_errors();
  folding();
  lowering(argc > 1 ? argv[1] : ".");
  if (failures) fprintf(stderr, "%d failures\n", failures);
  else printf("ok\n");
  return failures != 0;
}
