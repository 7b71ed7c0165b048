/* runtime/cuda/rt_cuda_memcheck.h -- the start-up memory check's arithmetic:
 * how many bytes the ranks sharing one GPU need together.  Plain C
 * (rt_cuda_memcheck.c): rt_cuda_ctx.cu gathers every rank's record over the
 * host groups (rt_cuda_gather_world); the CPU test tests/cuda/cu_local.c checks the
 * sums.
 *
 * Several ranks share a GPU when the mesh has more ranks on a host than it
 * has GPUs (host-staged collectives, rank r on GPU r % GPUs) or under the
 * device-local backend (every rank on GPU 0).  Their planned buffers
 * (parameters, optimizer state, arena, batch, GEMM workspace) then come out of
 * the same free memory, so the check compares their sum with it, not one
 * rank's need.  Every rank measures the free memory before any rank
 * allocates (the gather is the meeting point), so they all see the same. */
#ifndef PARC_RT_CUDA_MEMCHECK_H
#define PARC_RT_CUDA_MEMCHECK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One rank's record: its planned bytes, its GPU's ordinal and its host (a hash
 * of the host name: equal ordinals on different hosts are different GPUs). */
typedef struct {
  int64_t need, device, host;
} RtDeviceNeed;

/* Floats one record takes in a float all-gather (its bytes, copied). */
#define RT_DEVICE_NEED_FLOATS ((int)((sizeof(RtDeviceNeed) + sizeof(float) - 1) / sizeof(float)))

/* The bytes the ranks on rank me's GPU (same host and device) need together,
 * all[0 .. ranks) by world rank; *sharers gets how many they are (me
 * included).  Returns -1 on bad arguments or a sum above INT64_MAX. */
int64_t rt_cuda_device_need(const RtDeviceNeed *all, int ranks, int me, int *sharers);

/* Every rank's `floats` floats (mine) into all[ranks * floats] in world
 * order, wrank = t + tp (d + dp p): all-gathered over the tp group (group[0]),
 * then the dp group (group[1]: blocks of tp records, in dp order), then the pp
 * group (group[2]); a NULL group or a size of 1 is skipped.  Collective over
 * every group; RT_ERR (rt_last_error) if one fails or the sizes' product is
 * not ranks. */
struct RtComm;
int rt_cuda_gather_world(struct RtComm *const group[3], const float *mine, int floats, int ranks,
                         float *all);

/* The start-up verdict, agreed (rt_cuda_open): every rank's `status` (RT_OK,
 * RT_ERR_SETUP or RT_ERR) and, where it failed, its message (rt_last_error)
 * gathered over the world (rt_cuda_gather_world's groups).  Returns RT_OK when
 * every rank's status is RT_OK; otherwise, on every rank, the status of the
 * lowest world rank that failed, with that rank's message as this rank's last
 * error: the same status and line everywhere, so the ranks stop together
 * (none goes on into a collective the others never reach) and any of them may
 * report it.  RT_ERR if the gather fails.  One rank: `status` itself. */
int rt_cuda_agree(struct RtComm *const group[3], int ranks, int status);

/* FNV-1a hash of a host name, the record's host field. */
int64_t rt_cuda_host_hash(const char *name);

#ifdef __cplusplus
}
#endif

#endif
