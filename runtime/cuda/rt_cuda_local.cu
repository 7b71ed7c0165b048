/* runtime/cuda/rt_cuda_local.cu -- the device-local backend's collectives
 * and pipeline transfers (PARC_CUDA_LOCAL=device): the ranks of a group are
 * threads of this process on one GPU (one CUDA context), each with its own
 * compute stream.  The ranges and the order of the sums are rt_cuda_local.h's.
 *
 * One collective of member i over group g, all on i's compute stream, with
 * no host synchronisation of any stream:
 *   1. i records its `ready` event (its send buffer is complete at it), then
 *      the members exchange descriptors (send address, ready and done events,
 *      op, count, GPU) through the host group (rt_comm_all_gather: the
 *      thread communicator's rendezvous, with its deadline and its abort when
 *      a rank fails).  Every member checks every descriptor: same op and
 *      count, same GPU; all see the same ones, so all reach the same verdict.
 *   2. i's stream waits for every peer's ready event, then reads the peers'
 *      send buffers in place: a reduction kernel per pass (the sums in group
 *      rank order) or a device-to-device copy per block, into recv or, in
 *      place, into a per-rank scratch (WS_LOCAL).
 *   3. i records its `done` event (it has finished reading the peers' send
 *      buffers at it), the members meet again (rt_comm_barrier), and i's
 *      stream waits for every peer's done event before anything after the
 *      collective (which may write i's send buffer); then the scratch is
 *      copied into recv.
 * Events are per (rank, group), recorded once per collective: a peer waits on
 * i's ready event before the barrier of step 3, and on its done event before
 * the next collective's exchange, which i must reach before it records either
 * again, so every wait sees the record of its own collective.  Every wait is
 * on work already enqueued, so a stream never waits for anything a host
 * thread has still to do: host waits (cudaStreamSynchronize) always end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_impl.h"
#include "runtime/cuda/rt_cuda_local.h"

#define LOCAL_BLOCK 256

/* What a member publishes for one collective (exchanged as floats, bit for bit). */
typedef struct {
  uint64_t send;            /* device address of its send buffer */
  uint64_t ready, done;     /* its cudaEvent_t handles for this group */
  int64_t op, count, device, wrank;
} LocalDesc;
#define DESC_FLOATS ((int)(sizeof(LocalDesc) / sizeof(float)))
static_assert(sizeof(LocalDesc) % sizeof(float) == 0, "a descriptor is whole floats");

typedef struct {
  const float *p[RT_LOCAL_ADDS];
} LocalAdds;

/* out[i] = (...((start[i] + a.p[0][i]) + a.p[1][i]) + ...) + a.p[nadd - 1][i]
 * in float32 (no contraction: additions only).  out may be start. */
__global__ void __launch_bounds__(LOCAL_BLOCK)
    local_sum_kernel(float *out, const float *start, LocalAdds a, int nadd, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float acc = start[i];
#pragma unroll
    for (int j = 0; j < RT_LOCAL_ADDS; j++)
      if (j < nadd) acc += a.p[j][i];
    out[i] = acc;
  }
}

int rt_cuda_local_open(RtCuda *c) {
  int most = 1;
  for (int g = 0; g < RT_CUDA_NGROUPS; g++) {
    if (c->gsize[g] < 2) continue;
    RtComm *hg = c->hgroup[g];
    if (!hg)
      return rt_fail("rank %d: PARC_CUDA_LOCAL=device: group %s of %d ranks has no host group",
                     c->wrank, rt_cuda_group_name[g], c->gsize[g]);
    if (strcmp(rt_comm_backend(hg), "threads"))
      return rt_fail("rank %d: PARC_CUDA_LOCAL=device needs the ranks as threads of one "
                     "process (this one runs on the '%s' communicator); use "
                     "PARC_CUDA_LOCAL=host", c->wrank, rt_comm_backend(hg));
    char op[64];
    snprintf(op, sizeof op, "cudaEventCreate(device-local %s)", rt_cuda_group_name[g]);
    CU_CHECK(c, cudaEventCreateWithFlags(&c->lready[g], cudaEventDisableTiming), op);
    CU_CHECK(c, cudaEventCreateWithFlags(&c->ldone[g], cudaEventDisableTiming), op);
    if (c->gsize[g] > most) most = c->gsize[g];
  }
  if (c->gsize[RT_CUDA_PP] > 1) {
    /* the pipeline transfers' buffers come from the device's default pool: keep
     * what it has between steps (its release threshold is 0 by default, which
     * hands the memory back at every synchronisation and maps it again at the
     * next cudaMallocAsync); it holds at most the transfers in flight */
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CU_CHECK(c, cudaDeviceGetDefaultMemPool(&pool, c->device), "cudaDeviceGetDefaultMemPool");
    CU_CHECK(c, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
             "cudaMemPoolSetAttribute(release threshold)");
  }
  c->ldesc = calloc((size_t)most, sizeof(LocalDesc));
  c->lcounts = (int64_t *)calloc((size_t)most, sizeof(int64_t));
  if (!c->ldesc || !c->lcounts) return rt_fail("rank %d: out of memory", c->wrank);
  return RT_OK;
}

/* A peer's stream may still have to enqueue its wait on this rank's done
 * event of the last collective (step 3 waits after the barrier): every member
 * meets once more before the events go (a failed rank's group is aborted, so
 * the barrier returns at once, and the events go anyway). */
void rt_cuda_local_close(RtCuda *c) {
  for (int g = 0; g < RT_CUDA_NGROUPS; g++)
    if (c->ldone[g] && c->hgroup[g]) (void)rt_comm_barrier(c->hgroup[g]);
  for (int g = 0; g < RT_CUDA_NGROUPS; g++) {
    if (c->lready[g]) cudaEventDestroy(c->lready[g]);
    if (c->ldone[g]) cudaEventDestroy(c->ldone[g]);
  }
  free(c->ldesc);
  free(c->lcounts);
}

static const char *const local_op_name[] = {"all_reduce", "all_gather", "reduce_scatter"};

static const float *peer_send(const LocalDesc *d, int64_t off) {
  return (const float *)(uintptr_t)d->send + off;
}

static cudaEvent_t peer_event(uint64_t e) { return (cudaEvent_t)(uintptr_t)e; }

int rt_cuda_local_collective(RtCuda *c, int op, int g, const float *send, float *recv,
                             int64_t count) {
  int p = c->gsize[g], me = c->grank[g];
  RtComm *hg = c->hgroup[g];
  char what[192];
  snprintf(what, sizeof what, "device-local %s of %lld floats over group %s (%d ranks)",
           local_op_name[op], (long long)count, rt_cuda_group_name[g], p);
  RtLocalPlan pl;
  if (!hg || !c->ldesc || rt_cuda_local_plan(op, p, me, count, send, recv, &pl))
    return rt_fail("rank %d: %s: no device-local group, or arguments out of range", c->wrank,
                   what);
  float *out = recv;
  if (pl.scratch && !(out = (float *)rt_cuda_ws(c, WS_LOCAL, (size_t)pl.out * 4))) return RT_ERR;

  /* 1. ready, and the exchange */
  CU_CHECK(c, cudaEventRecord(c->lready[g], c->compute), what);
  LocalDesc mine = {(uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)c->lready[g],
                    (uint64_t)(uintptr_t)c->ldone[g], op, count, c->device, c->wrank};
  float buf[DESC_FLOATS];
  memcpy(buf, &mine, sizeof mine);
  for (int r = 0; r < p; r++) c->lcounts[r] = DESC_FLOATS;
  LocalDesc *all = (LocalDesc *)c->ldesc;
  if (rt_comm_all_gather(hg, buf, (float *)(void *)all, c->lcounts)) return RT_ERR;
  for (int r = 0; r < p; r++) {
    const LocalDesc *d = &all[r];
    if (d->op != op || d->count != count)
      return rt_fail("rank %d: %s: member %d (rank %lld) called %s of %lld floats", c->wrank,
                     what, r, (long long)d->wrank,
                     d->op >= 0 && d->op <= RT_CUDA_OP_REDUCE_SCATTER ? local_op_name[d->op]
                                                                      : "?",
                     (long long)d->count);
    if (d->device != c->device)
      return rt_fail("rank %d: %s: member %d (rank %lld) is on GPU %lld, this rank on GPU %d; "
                     "PARC_CUDA_LOCAL=device needs every group on one GPU", c->wrank, what, r,
                     (long long)d->wrank, (long long)d->device, c->device);
  }

  /* 2. read the peers' send buffers once they are ready */
  for (int r = 0; r < p; r++)
    if (r != me) CU_CHECK(c, cudaStreamWaitEvent(c->compute, peer_event(all[r].ready), 0), what);
  if (op == RT_CUDA_OP_ALL_GATHER) {
    for (int r = 0; r < p; r++) {
      if (r == me && pl.skip_own) continue;
      CU_CHECK(c, cudaMemcpyAsync(out + (int64_t)r * count, peer_send(&all[r], 0),
                                  (size_t)count * 4, cudaMemcpyDeviceToDevice, c->compute),
               what);
    }
  } else {
    for (int k = 0, passes = rt_cuda_local_passes(p); k < passes; k++) {
      int lo, hi;
      rt_cuda_local_pass(p, k, &lo, &hi);
      LocalAdds a;
      memset(&a, 0, sizeof a);
      for (int j = lo; j < hi; j++) a.p[j - lo] = peer_send(&all[j], pl.src_off);
      const float *start = k == 0 ? peer_send(&all[0], pl.src_off) : out;
      local_sum_kernel<<<rt_cuda_blocks(pl.n, LOCAL_BLOCK), LOCAL_BLOCK, 0, c->compute>>>(
          out, start, a, hi - lo, pl.n);
      LAUNCH_CHECK(c, what);
    }
  }

  /* 3. done reading, and nothing after this collective before the peers are */
  CU_CHECK(c, cudaEventRecord(c->ldone[g], c->compute), what);
  if (rt_comm_barrier(hg)) return RT_ERR;
  for (int r = 0; r < p; r++)
    if (r != me) CU_CHECK(c, cudaStreamWaitEvent(c->compute, peer_event(all[r].done), 0), what);
  if (pl.scratch)
    CU_CHECK(c, cudaMemcpyAsync(recv, out, (size_t)pl.out * 4, cudaMemcpyDeviceToDevice,
                                c->compute), what);
  return RT_OK;
}

/* ---- pipeline transfers (rt_cuda_pipe.cu's host_p2p on this backend) ----
 *
 * rt_comm_send's semantics (buffered: the sender goes on at once, and may
 * overwrite its value) with the data on the device: the sender copies the
 * value into a fresh buffer from the device's stream-ordered pool
 * (cudaMallocAsync) on its stream and records a fresh event after the copy;
 * the buffer's address and the event go to the receiver as a small host
 * message (rt_comm_send over pp: its order per (peer, tag), its deadline).
 * The receiver's stream waits for the event, copies the value out and frees
 * the buffer (cudaFreeAsync, on the receiver's stream: the pool reuses it
 * only after that point); the receiver destroys the event (its resources go
 * once it has completed). */
typedef struct {
  uint64_t buf, ready;
  int64_t count, wrank;
} LocalMsg;
#define MSG_FLOATS ((int)(sizeof(LocalMsg) / sizeof(float)))
static_assert(sizeof(LocalMsg) % sizeof(float) == 0, "a message is whole floats");

int rt_cuda_local_p2p(RtCuda *c, int send, float *x, int64_t n, int peer, int tag) {
  RtComm *g = c->hgroup[RT_CUDA_PP];
  char what[160];
  snprintf(what, sizeof what, "device-local pipeline %s of %lld floats %s stage %d (tag %d)",
           send ? "send" : "receive", (long long)n, send ? "to" : "from", peer, tag);
  if (!g) return rt_fail("rank %d: %s: no pp group", c->wrank, what);
  float buf[MSG_FLOATS];
  LocalMsg m;
  if (send) {
    void *d = NULL;
    cudaEvent_t ev = NULL;
    CU_CHECK(c, cudaMallocAsync(&d, (size_t)n * 4, c->compute), what);
    CU_CHECK(c, cudaMemcpyAsync(d, x, (size_t)n * 4, cudaMemcpyDeviceToDevice, c->compute), what);
    CU_CHECK(c, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), what);
    CU_CHECK(c, cudaEventRecord(ev, c->compute), what);
    m = (LocalMsg){(uint64_t)(uintptr_t)d, (uint64_t)(uintptr_t)ev, n, c->wrank};
    memcpy(buf, &m, sizeof m);
    return rt_comm_send(g, buf, MSG_FLOATS, peer, tag);
  }
  if (rt_comm_recv(g, buf, MSG_FLOATS, peer, tag)) return RT_ERR;
  memcpy(&m, buf, sizeof m);
  if (m.count != n)
    return rt_fail("rank %d: %s: rank %lld sent %lld floats", c->wrank, what, (long long)m.wrank,
                   (long long)m.count);
  cudaEvent_t ev = peer_event(m.ready);
  void *d = (void *)(uintptr_t)m.buf;
  CU_CHECK(c, cudaStreamWaitEvent(c->compute, ev, 0), what);
  CU_CHECK(c, cudaEventDestroy(ev), what);
  CU_CHECK(c, cudaMemcpyAsync(x, d, (size_t)n * 4, cudaMemcpyDeviceToDevice, c->compute), what);
  CU_CHECK(c, cudaFreeAsync(d, c->compute), what);
  return RT_OK;
}
