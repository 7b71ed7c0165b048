/* codegen/kir_cuda.h -- the kernel IR as CUDA C source (kernels.cu).
 *
 * kir_cuda_write lowers every kernel of a module to one `__global__`
 * function plus a host-callable launcher
 *
 *   extern "C" void NAME_launch(params in declaration order,
 *                               int64_t row_begin, int64_t row_end, cudaStream_t stream);
 *
 * with the caller contract of kir.h (same params, same row range, same
 * meaning), and writes the launchers' C prototypes to a header.  Launchers
 * only enqueue work on `stream` (nothing when row_begin == row_end); they
 * do not check errors: the caller checks cudaGetLastError / the stream.
 *
 * THREAD MAPPINGS (chosen per kernel by kir_cuda_plan)
 *
 *   FLAT        one loop, no reductions, no row-level stores, constant
 *               extent: a grid-stride loop over the elements of
 *               [row_begin, row_end) x [0, extent), one thread per element
 *               (or per 4 consecutive elements of a row, see VECTOR).
 *   LOOPS       FLAT over several loops: fewer than 256 rows (a block a row
 *               would leave most of the GPU idle: a bucket's concat, the
 *               ZeRO optimizer's update into its gather buffer, one row of
 *               millions of elements), no reductions, no row-level stores,
 *               constant extents, parallel-safe loops that are independent
 *               of each other: a buffer one loop stores is loaded by no
 *               other loop nor at row level, and stored by another loop only
 *               at an index range of the row disjoint from its own (index =
 *               column + constant + the same row-level terms, as a concat's
 *               parts).  A grid-stride loop over the steps of every loop of
 *               [row_begin, row_end) (a step: one column, or 4 where the loop
 *               takes float4), each step running its loop's body with the
 *               row-level values that loop reads.
 *   ROW_GROUP   everything else with parallel-safe loops: a group of
 *               row_threads threads per row (32: one warp per row, 8 rows
 *               per 256-thread block; 64..256: one block per row), grid-
 *               stride over rows; the narrowest group whose lanes cover
 *               the longest loop in one pass, or, from 1024 rows, in at
 *               most 8 (a warp per row up to 1024 float4 columns).
 *               Column loops are strided over the group; reductions are
 *               per-thread partials combined by warp shuffles (xor
 *               butterfly) and, above one warp, through shared memory;
 *               row-level values are computed by every thread of the
 *               group, row-level stores by its first thread.  Group barriers
 *               (__syncwarp / __syncthreads) are placed wherever one thread
 *               may read or overwrite what another wrote or read, so the
 *               result is that of the sequential loop nest.
 *   THREAD_ROW  one thread per row, loops run sequentially exactly as the CPU
 *               lowering does: kernels without loops, and the fallback for a
 *               loop that is not parallel-safe (below).
 *
 *   Two mappings for REDUCTIONS that the row count alone cannot spread over
 *   the GPU.  Both take only kernels of the shape "one parallel-safe loop
 *   with a constant extent, at least one reduction, no store in the loop, no
 *   row-level store before it" (a second loop would read the reduced value,
 *   so kernels with more loops keep ROW_GROUP), and both split a row's loop
 *   over several blocks when it pays: each block reduces a contiguous chunk
 *   of the loop into a partial in global scratch, the last block to finish
 *   (an atomic counter after __threadfence; it resets the counter for the
 *   next launch) combines the partials in part order and runs the row's
 *   epilogue (the values and stores after the loop) with one thread.
 *
 *   ROW_SPLIT   fewer than 32 rows (below the SM count) and a loop of at
 *               least 4096 columns (e.g. the gradient norm's sumsq: one row,
 *               a whole parameter): `parts` 256-thread blocks per row, each
 *               over `chunk` consecutive columns (float4 as in ROW_GROUP),
 *               parts * rows about 1024 blocks, chunks a multiple of 1024
 *               columns and at least 2048.
 *   COL_TILE    (tried first) the loads of the loop are contiguous across
 *               consecutive rows (row stride 1: sum_to's column sums of
 *               [N, R], index c * R + r; layernorm's weight gradients) or
 *               the same for all rows (row stride 0), at least one of them
 *               contiguous, and the innermost row dim has at least 8 rows:
 *               a 256-thread block takes a tile of 32 consecutive rows (one
 *               per lane: a warp's load is one 128-byte line) times 8
 *               slices of the loop (columns slice, slice + 8, ... of its
 *               chunk), the slices added through shared memory in slice
 *               order; when there are fewer than 512 tiles, the loop is
 *               split in `parts` chunks of at least 64 columns (tiles x
 *               parts about 1024 blocks).  The epilogue runs on the row's
 *               lane of slice 0.  VEC instantiation (`vector`), where the
 *               innermost row dim is a multiple of 4, each row-contiguous
 *               load's index a multiple of 4 at a multiple-of-4 row, and
 *               the loop reads the row nowhere else: a lane takes 4
 *               consecutive rows (tiles of 128) and reads them with one
 *               4-element access (16 bytes f32, 8 bytes bf16: a warp's load
 *               4 lines instead of one); launched where those buffers are
 *               16-byte aligned and the row range starts and ends at a
 *               multiple of 4.  The parts, chunks and order of every sum
 *               are those of a row a lane: the same bits either way.
 *
 *   Scratch: file-scope __device__ arrays of kernels.cu, 16 lanes of 65536
 *   partials and 1024 counters; the launcher takes its stream's lane
 *   (kcu_lane: the first 16 streams that launch a split kernel get one each),
 *   so launches on different streams of one GPU (ranks as threads) never
 *   share scratch, and launches on one stream run one after another.  A
 *   stream without a lane runs the same kernel unsplit (parts = 1).
 *   Determinism: chunk boundaries are constants of the kernel and partials
 *   are combined in a fixed order, whichever block finishes last; a row's
 *   result does not depend on the row range of the launch.
 *
 *   A column loop is parallel-safe when every store in it has an index that
 *   varies with the column, and every buffer it both loads and stores is
 *   accessed at one and the same index node (read-modify-write of one
 *   element).  What the lowering assumes and cannot check: distinct
 *   iterations of a column loop store distinct elements (every store of
 *   codegen/cg_kernels.c writes one element of its shape per iteration).
 *
 * VECTOR (float4)
 *
 *   In a loop with a constant extent divisible by 4, f32 loads and stores
 *   whose index is `column + c`, c a row-level value provably divisible by
 *   4, use 16-byte accesses (each thread takes 4 consecutive columns) when
 *   the loop does not store the buffer, or stores it once at that same index
 *   after every load of it (read-modify-write: loads first, store last).  Such kernels are a
 *   template on VEC; the launcher takes VEC = true when every buffer with a
 *   vector access is 16-byte aligned, else the scalar instantiation.
 *   COL_TILE kernels vectorise over rows instead (see COL_TILE above).
 *
 * NUMERICS (fp32, to match the CPU lowering of kir_llvm.h)
 *
 *   + - * / and sqrt are written as __fadd_rn, __fsub_rn, __fmul_rn,
 *   __fdiv_rn, __fsqrt_rn: IEEE round-to-nearest whatever the nvcc flags
 *   (never contracted to FMA, not changed by --use_fast_math), so pointwise
 *   chains of them agree bitwise with the CPU; rsqrt is 1/sqrt as on the CPU;
 *   exp, log, tanh are the algorithms of kir_math.c (same reduction, same
 *   polynomials, fmaf where the CPU has fmuladd), so they agree bitwise with
 *   CPU objects built for FMA hosts; max/min (values and reductions) use the
 *   same NaN-propagating order-key scheme.  Sum reductions differ from the
 *   CPU only in their (unspecified) order of accumulation, which is fixed
 *   for a given mapping and VEC instantiation: results are reproducible run
 *   to run.
 *
 * The output is deterministic: the same module gives the same bytes. */
#ifndef PARC_KIR_CUDA_H
#define PARC_KIR_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/kir.h"

typedef enum {
  KIR_CUDA_FLAT,
  KIR_CUDA_ROW_GROUP,
  KIR_CUDA_THREAD_ROW,
  KIR_CUDA_ROW_SPLIT,
  KIR_CUDA_COL_TILE,
  KIR_CUDA_LOOPS
} KirCudaMapping;

typedef struct {
  KirCudaMapping mapping;
  int row_threads;    /* ROW_GROUP and ROW_SPLIT: threads per row (32, 64, 128 or 256); else 1 */
  int block_threads;  /* blockDim.x of every launch (the __launch_bounds__) */
  int vector;         /* 1: a float4 instantiation exists (template on VEC; COL_TILE: 4 rows a lane) */
  int64_t parts;      /* ROW_SPLIT: blocks per row; COL_TILE: blocks per tile; else 1 */
  int64_t chunk;      /* loop columns per block when parts > 1; else the extent (or 0) */
} KirCudaLaunch;

extern const char *const kir_cuda_mapping_name[];   /* by KirCudaMapping */

/* The mapping kir_cuda_write uses for k (k must be valid: kir_verify). */
void kir_cuda_plan(const KirKernel *k, KirCudaLaunch *out);

/* Writes the CUDA source of every kernel of m to cu_path and, when h_path
 * is not NULL, the launchers' C prototypes to h_path (includable from C:
 * the stream is `struct CUstream_st *`, which is cudaStream_t).  0, or -1
 * with a one-line message in err. */
int kir_cuda_write(const KirModule *m, const char *cu_path, const char *h_path, char *err,
                   size_t errlen);

/* Batched launches (horizontal fusion).  Kernel NAME with multi[i] != 0
 * (and kir_cuda_multi_max > 0) also gets
 *   typedef struct { T param[MAX]; ... } NAME_multi_t;      (kernels_cuda.h)
 *   void NAME_multi_launch(const NAME_multi_t *a, int count, int64_t row_begin,
 *                          int64_t row_end, struct CUstream_st *stream);
 * which runs count independent instances of NAME over the same rows in one
 * launch: instance j (blockIdx.y) takes the j-th entry of every array, and
 * computes what NAME_launch with those arguments computes, bit for bit (the
 * same body, float4 where every instance's buffers allow it; where some do
 * and some do not, a launch each, as NAME_launch would choose).  The
 * struct travels by value as the kernel's parameter: MAX is the most
 * instances whose pointers fit KIR_CUDA_MULTI_BYTES, at most
 * KIR_CUDA_MULTI_MAX.  A kernel with a split scratch (ROW_SPLIT, COL_TILE
 * with parts) gives instance j the j-th share of the stream's lane, a share
 * being what one launch of its rows uses (its partials and block counters),
 * so MAX is also at most the shares a lane holds (none where fewer than 2);
 * on a stream without a lane, NAME_multi_launch makes a NAME_launch each
 * (unsplit, as NAME_launch runs there).  The caller guarantees the instances
 * are independent (no instance writes what another reads or writes). */
#define KIR_CUDA_MULTI_BYTES 4000 /* of the 4096 bytes of kernel parameters */
#define KIR_CUDA_MULTI_MAX 64
int kir_cuda_write_multi(const KirModule *m, const unsigned char *multi, const char *cu_path,
                         const char *h_path, char *err, size_t errlen);
/* MAX for k, or 0 when k has no batched form (a split scratch too large for
 * two shares of a lane). */
int kir_cuda_multi_max(const KirKernel *k);

#endif
