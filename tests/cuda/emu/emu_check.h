/* tests/cuda/emu/emu_check.h -- what the runtime's checks on the emulated GPU
 * share: device buffers made from host data and read back.  Header-only; an
 * infrastructure failure (not a finding of the check) exits 2. */
#ifndef PARC_TESTS_EMU_CHECK_H
#define PARC_TESTS_EMU_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* A device buffer of `bytes`, holding h's bytes unless h is NULL. */
static inline void *emu_dev(const void *h, size_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, bytes) != cudaSuccess ||
      (h && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)) {
    fprintf(stderr, "emulated device: cudaMalloc/cudaMemcpy of %zu bytes failed\n", bytes);
    exit(2);
  }
  return d;
}

/* d's first `bytes` into h, once the device's work so far is done. */
static inline void emu_host(void *h, const void *d, size_t bytes) {
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "emulated device: an error, or reading %zu bytes back failed\n", bytes);
    exit(2);
  }
}

#endif
