/* runtime/cuda/rt_cuda_local_plan.c -- the device-local collectives' ranges
 * and reduction passes (rt_cuda_local.h).  Plain C: tests/cuda builds it
 * without CUDA. */
#include "runtime/cuda/rt_cuda_local.h"

#include <stddef.h>

/* 1 if the byte ranges [a, a + an) and [b, b + bn) share a byte */
static int overlap(const void *a, int64_t an, const void *b, int64_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  if (an <= 0 || bn <= 0) return 0;
  return x < y + (uintptr_t)bn && y < x + (uintptr_t)an;
}

int rt_cuda_local_plan(int op, int members, int rank, int64_t count, const void *send,
                       const void *recv, RtLocalPlan *plan) {
  if (op < RT_CUDA_OP_ALL_REDUCE || op > RT_CUDA_OP_REDUCE_SCATTER || members < 1 ||
      rank < 0 || rank >= members || count < 0 || count > INT64_MAX / 4 / members)
    return -1;
  RtLocalPlan p;
  p.in = op == RT_CUDA_OP_REDUCE_SCATTER ? count * members : count;
  p.out = op == RT_CUDA_OP_ALL_GATHER ? count * members : count;
  p.src_off = op == RT_CUDA_OP_REDUCE_SCATTER ? (int64_t)rank * count : 0;
  p.n = count;
  p.skip_own = op == RT_CUDA_OP_ALL_GATHER && count > 0 &&
               (const float *)send == (const float *)recv + (int64_t)rank * count;
  p.scratch = !p.skip_own && overlap(send, p.in * 4, recv, p.out * 4);
  *plan = p;
  return 0;
}

int rt_cuda_local_passes(int members) {
  return members < 2 ? 0 : (members - 1 + RT_LOCAL_ADDS - 1) / RT_LOCAL_ADDS;
}

void rt_cuda_local_pass(int members, int k, int *lo, int *hi) {
  *lo = 1 + k * RT_LOCAL_ADDS;
  *hi = *lo + RT_LOCAL_ADDS < members ? *lo + RT_LOCAL_ADDS : members;
}
