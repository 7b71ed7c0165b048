/* runtime/cuda/rt_cuda_local.h -- the device-local collectives' arithmetic:
 * which ranges a member reads and writes, and the order of its sums.  Plain C
 * (rt_cuda_local_plan.c), shared by the device code (rt_cuda_local.cu) and
 * the CPU test that emulates it (tests/cuda/cu_local.c).
 *
 * The device-local backend (PARC_CUDA_LOCAL=device; rt_cuda.h): the ranks of
 * a group are threads of one process sharing one GPU.  A collective reads
 * the peers' send buffers in place (device pointers exchanged through the
 * host group) and writes only the caller's own receive buffer or scratch.
 *
 * Invariants:
 *  - Sums are the CPU communicator's (rt_comm.h, rt_comm_reduce_ordered):
 *    element by element, in group rank order, left to right in float32,
 *    ((s0 + s1) + s2) + ... + s(n-1), so results are bit-identical to the
 *    host-staged backend and to the CPU trainer.  A reduction runs in passes
 *    of at most RT_LOCAL_ADDS additions (the sources of one pass are one
 *    kernel's parameters): pass 0 starts from s0 and adds s1 ...; pass k > 0
 *    starts from the previous pass's output, stored as a float32, which is
 *    the same value the running sum has at that point, so the passes do not
 *    change a bit.
 *  - A member never writes a range a peer reads: peers read only send
 *    buffers.  When the caller's receive range overlaps its own send range
 *    (in place), the result goes first to a per-rank scratch (plan.scratch)
 *    and is copied into recv once every peer has finished reading; the one
 *    exception is the in-place all_gather (send is this member's block of
 *    recv), where the peers read only that block and the member writes only
 *    the others (plan.skip_own). */
#ifndef PARC_RT_CUDA_LOCAL_H
#define PARC_RT_CUDA_LOCAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* grep RT_CUDA_OP_ if you change this enum: rt_cuda_ctx.cu names them */
enum { RT_CUDA_OP_ALL_REDUCE, RT_CUDA_OP_ALL_GATHER, RT_CUDA_OP_REDUCE_SCATTER };

#define RT_LOCAL_ADDS 8 /* additions per reduction pass */

typedef struct {
  int64_t in;       /* floats of every member's send buffer */
  int64_t out;      /* floats of the caller's receive buffer */
  int64_t src_off;  /* reductions: the summed range's start in every send buffer
                       (reduce_scatter: rank * count; all_reduce: 0) */
  int64_t n;        /* reductions: floats summed; all_gather: floats per block */
  int scratch;      /* 1: the result goes to a scratch of `out` floats first and is
                       copied into recv after the peers are done reading */
  int skip_own;     /* all_gather in place: the caller's own block is already there */
} RtLocalPlan;

/* The plan of member `rank` of `members` for op RT_CUDA_OP_* of `count`
 * floats per member (rt_cuda_all_reduce etc.'s count), send and recv being
 * the caller's device addresses.  0, or -1 for arguments out of range. */
int rt_cuda_local_plan(int op, int members, int rank, int64_t count, const void *send,
                       const void *recv, RtLocalPlan *plan);

/* Reduction passes over `members` >= 2 sources: how many. */
int rt_cuda_local_passes(int members);

/* Pass k adds sources [*lo, *hi) to its start value: source 0 for k = 0, the
 * previous pass's output after that. */
void rt_cuda_local_pass(int members, int k, int *lo, int *hi);

#ifdef __cplusplus
}
#endif

#endif
