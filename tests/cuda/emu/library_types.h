/* tests/cuda/emu/library_types.h -- the CUDA libraries' data types (the
 * emulation's subset), with CUDA's numbering. */
#ifndef KCU_EMU_LIBRARY_TYPES_H
#define KCU_EMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

#endif
