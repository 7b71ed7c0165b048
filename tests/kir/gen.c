/* tests/kir/gen.c -- builds the test kernels and writes PREFIX.o, PREFIX.ll
 * and PREFIX.h, or prints them.
 *
 *   kir_gen [--cpu host|generic] [--math inline|libm] [-O N] PREFIX
 *   kir_gen --print        (the golden subset, as text, to stdout) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kir_llvm.h"
#include "kernels.h"

static int usage(void) {
  fprintf(stderr, "usage: kir_gen [--cpu host|generic] [--math inline|libm] [-O N] PREFIX\n"
                  "       kir_gen --print\n");
  return 2;
}

int main(int argc, char **argv) {
  KirLlvmOptions o;
  kir_llvm_defaults(&o);
  const char *prefix = NULL;
  int print = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--print") == 0) print = 1;
    else if (strcmp(a, "--cpu") == 0 && v && (!strcmp(v, "host") || !strcmp(v, "generic")))
      o.cpu = strcmp(v, "host") ? KIR_CPU_GENERIC : KIR_CPU_HOST, i++;
    else if (strcmp(a, "--math") == 0 && v && (!strcmp(v, "inline") || !strcmp(v, "libm")))
      o.math = strcmp(v, "inline") ? KIR_MATH_LIBM : KIR_MATH_INLINE, i++;
    else if (strcmp(a, "-O") == 0 && v) o.opt_level = atoi(v), i++;
    else if (a[0] != '-' && !prefix) prefix = a;
    else return usage();
  }
  if (!print && !prefix) return usage();

  KirModule *m = kir_module_new();
  kt_build(m, !print);
  char err[512];
  int rc = 0;
  if (kir_verify(m, err, sizeof err)) {
    fprintf(stderr, "kir_gen: %s\n", err);
    rc = 1;
  } else if (print) {
    kir_print(stdout, m);
  } else {
    size_t n = strlen(prefix) + 4;
    char *obj = malloc(n), *ll = malloc(n + 1), *h = malloc(n);
    if (!obj || !ll || !h) return 3;
    snprintf(obj, n, "%s.o", prefix);
    snprintf(ll, n + 1, "%s.ll", prefix);
    snprintf(h, n, "%s.h", prefix);
    if (kir_write_header(m, h, err, sizeof err) ||
        kir_llvm_emit(m, &o, obj, ll, err, sizeof err)) {
      fprintf(stderr, "kir_gen: %s\n", err);
      rc = 1;
    }
    free(obj);
    free(ll);
    free(h);
  }
  kir_module_free(m);
  return rc;
}
