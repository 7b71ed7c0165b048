/* codegen/project.h -- write a trainer project into a directory.
 *
 *   DIR/CMakeLists.txt   builds DIR/build/train against parc's build tree
 *   DIR/train.c          the host program (codegen/host.c)
 *   DIR/kernels.h        the fused kernels' prototypes
 *   DIR/kernels_cpu.o    the fused kernels, native code through LLVM
 *   DIR/kernels_cpu.ll   the same, as optimized LLVM IR to read
 *   DIR/plan.json        everything the compiler decided
 *   DIR/kernels.cu       with CG_TARGET_CUDA: the kernels as CUDA C (codegen/kir_cuda.h),
 *   DIR/kernels_cuda.h   their launchers' prototypes, DIR/nvcc_report.cmake (saves
 *                        ptxas -v to build/ptxas_report.txt); CMakeLists.txt builds
 *                        them into parc_kernels_cuda when configured -DPARC_CUDA=ON
 *   (train.c, kernels.h and kernels_cpu.* are written only with CG_TARGET_CPU)
 *
 * The module must have been through autodiff and the optimizer pass. */
#ifndef PARC_CG_PROJECT_H
#define PARC_CG_PROJECT_H

#include <stddef.h>
#include <stdint.h>

#include "passes/passes.h"

typedef struct {
  const char *dir;
  const char *source;      /* the DSL file, as given */
  const char *version;
  int fuse;                /* 0: one kernel per op (--no-fuse) */
  int generic_cpu;         /* 1: baseline x86-64 kernels, portable */
  const Cost *cost;
  const Layout *layout;
  int targets;             /* CG_TARGET_* bits; 0 means CG_TARGET_CPU */
  const char *cuda_arch;   /* CMake CUDA architectures, "80;90" when NULL */
  const PpProgram *pipe;   /* NULL, or the module is one microbatch of a pipelined
                              (or gradient-accumulating) trainer: codegen/host.h */
  StepTime *step_out;      /* when not NULL and not pipe: the predicted compute time
                              (codegen/step_model.h, on cost->machine), also in plan.json */
  GpuBytes *gpu_out;       /* when not NULL: the GPU trainer's bytes (cg_gpu_bytes) */
  int bf16_store;          /* CgStoreMode (codegen/cuda_store.h): what the bf16 GPU trainer
                              does with the values it may store as bf16 (--bf16-store) */
  int batch;               /* 1: the GPU trainer batches independent launches of one
                              code (codegen/cuda_batch.h); 0: --no-batch */
} CgProject;

enum { CG_TARGET_CPU = 1, CG_TARGET_CUDA = 2 };

/* Returns 0 and the trainer's arena size in *arena_bytes, or -1 with a
 * one-line reason in err. */
int cg_write_project(IrModule *m, const CgProject *p, int64_t *arena_bytes, char *err,
                     size_t errlen);

#endif
