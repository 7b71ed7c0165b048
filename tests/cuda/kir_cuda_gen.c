/* tests/cuda/kir_cuda_gen.c -- the test kernels of tests/kir (every kernel IR
 * form: pointwise, broadcasts, softmax, norms and their backward passes,
 * cross-entropy, column sums, row-dependent extents, i32 indexing, exp, log,
 * tanh) lowered to CUDA: writes DIR/kernels.cu and DIR/kernels_cuda.h.
 *
 *   kir_cuda_gen DIR */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/kir_cuda.h"
#include "kernels.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: kir_cuda_gen DIR\n");
    return 2;
  }
  KirModule *m = kir_module_new();
  kt_build(m, 1);
  char cu[4096], h[4096], err[512];
  snprintf(cu, sizeof cu, "%s/kernels.cu", argv[1]);
  snprintf(h, sizeof h, "%s/kernels_cuda.h", argv[1]);
  int rc = kir_cuda_write(m, cu, h, err, sizeof err);
  if (rc) fprintf(stderr, "kir_cuda_gen: %s\n", err);
  kir_module_free(m);
  return rc ? 1 : 0;
}
