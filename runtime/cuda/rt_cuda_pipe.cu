/* runtime/cuda/rt_cuda_pipe.cu -- pipelined steps on the device: rt_pipe_step
 * (runtime/rt_pipe.c) with the arena slots, the gradient accumulator and the
 * boundary values in device memory.  See rt_cuda.h (rt_cuda_pipe_step).
 *
 * Invariants shared with rt_pipe.c (so train_cuda and train agree):
 *   - the arena is `slots` slots of slot_bytes[s] (s: the rank's stage), then
 *     the accumulator (room for the largest stage's parameters, 64-byte
 *     rounded), then two scratch vectors of shared_max floats; microbatch mb
 *     runs on slot rt_pipe_slot(p, s, mb) of stage s's rt_pipe_slots(p, s)
 *     (checked once per desc, rt_pipe_check_slots);
 *   - actions run in the stage's list order, on the compute stream (NCCL's
 *     transfers on their own stream, p2p: the compute stream waits for them
 *     per slot); a schedule without W actions runs wgt right after bwd;
 *   - the accumulator is summed over dp (reduce_grads: the expert-parallel
 *     parameters' regions over ep_dp instead, RtPipeDesc.expert; the same
 *     pieces, groups and order as rt_pipe.c's) or, under ZeRO-1,
 *     reduce-scattered in rt_pipe.c's buckets (zero_buckets), then each shared
 *     parameter's parts (its rank's piece under ZeRO-1) are summed in stage
 *     order on every holder (the same additions on each: the same bits): the
 *     mean, each term already divided by M dp (the loss's seed, driver/main.c);
 *   - the loss is the double sum of the microbatches' losses in action order
 *     over M, summed over pp (only the last chunk's stage adds a non-zero). */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_impl.h"

#define PIPE_BLOCK 256

__global__ void __launch_bounds__(PIPE_BLOCK) acc_kernel(float *dst, const float *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] += src[i];
}

extern "C" int rt_cuda_zero(RtCuda *c, float *x, int64_t n) {
  if (n <= 0) return RT_OK;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_OP, 4.0 * (double)n, 0, "zero");
  CU_CHECK(c, cudaMemsetAsync(x, 0, (size_t)n * 4, c->compute), "zero");
  return RT_OK;
}

extern "C" int rt_cuda_acc(RtCuda *c, float *dst, const float *src, int64_t n) {
  if (n <= 0) return RT_OK;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_OP, 12.0 * (double)n, 0, "acc");
  acc_kernel<<<rt_cuda_blocks(n, PIPE_BLOCK), PIPE_BLOCK, 0, c->compute>>>(dst, src, n);
  LAUNCH_CHECK(c, "gradient accumulation");
  return RT_OK;
}


extern "C" int rt_cuda_sum_scalars(RtCuda *c, int group, float *const *x, int n) {
  if (n <= 0 || c->gsize[group] < 2) return RT_OK;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_COMM, 4.0 * n, 0, "sum_scalars %s", rt_cuda_group_name[group]);
  float *v = (float *)rt_cuda_ws(c, WS_SCALARS, (size_t)n * 4);
  if (!v) return RT_ERR;
  for (int i = 0; i < n; i++)
    if (rt_cuda_copy(c, v + i, x[i], 1)) return RT_ERR;
  if (rt_cuda_all_reduce(c, group, v, v, n)) return RT_ERR;
  for (int i = 0; i < n; i++)
    if (rt_cuda_copy(c, x[i], v + i, 1)) return RT_ERR;
  return RT_OK;
}

/* The pinned result buffer for M microbatches (grown once, before any copy). */
static int pipe_host(RtCuda *c, int M) {
  int need = 2 + 2 * M;
  if (c->pipe_host_n >= need) return RT_OK;
  if (c->pipe_host) CU_CHECK(c, cudaFreeHost(c->pipe_host), "cudaFreeHost");
  c->pipe_host = NULL;
  c->pipe_host_n = 0;
  CU_CHECK(c, cudaMallocHost((void **)&c->pipe_host, (size_t)need * 4), "cudaMallocHost");
  c->pipe_host_n = need;
  return RT_OK;
}

extern "C" int rt_cuda_pipe_loss(RtCuda *c, const float *loss, const float *ce) {
  int k = c->pipe_nloss;
  if (!c->pipe_host || 3 + 2 * k >= c->pipe_host_n)
    return rt_fail("rank %d: rt_cuda_pipe_loss outside rt_cuda_pipe_step, or more losses than "
                   "microbatches", c->wrank);
  float *h = c->pipe_host + 2 + 2 * k;
  CU_CHECK(c, cudaMemcpyAsync(h, loss, 4, cudaMemcpyDeviceToHost, c->compute), "read a loss");
  CU_CHECK(c, cudaMemcpyAsync(h + 1, ce ? ce : loss, 4, cudaMemcpyDeviceToHost, c->compute),
           "read a loss");
  c->pipe_nloss = k + 1;
  return RT_OK;
}

extern "C" int rt_cuda_pipe_norm(RtCuda *c, const float *grad_norm) {
  if (!c->pipe_host) return rt_fail("rank %d: rt_cuda_pipe_norm outside rt_cuda_pipe_step", c->wrank);
  c->pipe_norm = grad_norm != NULL;
  if (grad_norm)
    CU_CHECK(c, cudaMemcpyAsync(c->pipe_host, grad_norm, 4, cudaMemcpyDeviceToHost, c->compute),
             "read the gradient norm");
  return RT_OK;
}

/* ---- point to point over the pp group ---- */

/* Host-staged: the device value to the host and rt_comm_send (buffered), or
 * rt_comm_recv and to the device.  Synchronous: the stage buffer is reused.
 * On the device-local backend (PARC_CUDA_LOCAL=device) the same semantics
 * with device copies instead (rt_cuda_local_p2p: no host synchronisation). */
static int host_p2p(RtCuda *c, int send, float *x, int64_t n, int peer, int tag) {
  if (n <= 0) return RT_OK;
  if (c->local_dev) return rt_cuda_local_p2p(c, send, x, n, peer, tag);
  float *h = (float *)rt_cuda_host_stage(c, (size_t)n * 4);
  if (!h) return RT_ERR;
  RtComm *g = c->hgroup[RT_CUDA_PP];
  if (!g) return rt_fail("rank %d: a pipeline transfer without a pp group", c->wrank);
  if (send) {
    CU_CHECK(c, cudaMemcpyAsync(h, x, (size_t)n * 4, cudaMemcpyDeviceToHost, c->compute),
             "stage a pipeline send");
    CU_CHECK(c, cudaStreamSynchronize(c->compute), "stage a pipeline send");
    return rt_comm_send(g, h, n, peer, tag);
  }
  if (rt_comm_recv(g, h, n, peer, tag)) return RT_ERR;
  CU_CHECK(c, cudaMemcpyAsync(x, h, (size_t)n * 4, cudaMemcpyHostToDevice, c->compute),
           "unstage a pipeline receive");
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "unstage a pipeline receive");
  return RT_OK;
}

/* The boundary values of transfer action a (RT_PIPE_SEND_ACT ... RECV_GRAD):
 * its list, count, peer stage, tag (rt_pipe.h's) and direction. */
typedef struct {
  const RtPipeValue *v;
  int n, peer, tag, send;
} Xfer;

static Xfer xfer_of(const RtPipeDesc *p, const RtPipeAction *a) {
  int c = a->chunk, mb = a->mb, P = p->stages, M = p->microbatches;
  Xfer x = {NULL, 0, 0, 0, 0};
  switch ((RtPipeKind)a->kind) {
  case RT_PIPE_SEND_ACT:
    x = (Xfer){p->act[c], p->nact[c], (c + 1) % P, (c * M + mb) * 2, 1};
    break;
  case RT_PIPE_RECV_ACT:
    x = (Xfer){p->act[c - 1], p->nact[c - 1], (c - 1) % P, ((c - 1) * M + mb) * 2, 0};
    break;
  case RT_PIPE_SEND_GRAD:
    x = (Xfer){p->grad[c - 1], p->ngrad[c - 1], (c - 1) % P, ((c - 1) * M + mb) * 2 + 1, 1};
    break;
  case RT_PIPE_RECV_GRAD:
    x = (Xfer){p->grad[c], p->ngrad[c], (c + 1) % P, (c * M + mb) * 2 + 1, 0};
    break;
  default:
    break;
  }
  return x;
}

static int is_xfer(const RtPipeAction *a) {
  return a->kind >= RT_PIPE_SEND_ACT && a->kind <= RT_PIPE_RECV_GRAD;
}

/* 1 if NCCL's rendezvous point-to-point runs every stage's list without a
 * deadlock when each run of consecutive transfer actions is one NCCL group
 * (ncclGroupStart .. End, enqueued together).  Simulates every stage: an
 * operation completes once it and its partner are both posted (in their
 * stages' current groups), and NCCL's matching order holds (between two
 * stages, the k-th send meets the k-th receive: each operation must be the
 * first pending one of its stage towards that peer and direction, and its
 * partner must carry the same tag); a group ends when all its operations
 * have completed.  Every rank computes the same answer from the same desc. */
static int rendezvous_safe(const RtPipeDesc *p) {
  int P = p->stages, total = 0, ok = 1;
  for (int s = 0; s < P; s++) total += p->nactions[s];
  int *pos = (int *)calloc((size_t)P, sizeof(int));
  unsigned char *done = (unsigned char *)calloc((size_t)total + 1, 1);
  int *base = (int *)calloc((size_t)P + 1, sizeof(int));
  if (!pos || !done || !base) {
    free(pos), free(done), free(base);
    return 0;
  }
  for (int s = 0; s < P; s++) base[s + 1] = base[s] + p->nactions[s];
  for (;;) {
    int progress = 0, finished = 1;
    for (int s = 0; s < P; s++) { /* compute runs freely */
      while (pos[s] < p->nactions[s] && !is_xfer(&p->actions[s][pos[s]])) pos[s]++, progress = 1;
      finished &= pos[s] == p->nactions[s];
    }
    if (finished) break;
    for (int s = 0; s < P; s++) { /* match the posted operations */
      for (int i = pos[s]; i < p->nactions[s] && is_xfer(&p->actions[s][i]); i++) {
        if (done[base[s] + i]) continue;
        Xfer x = xfer_of(p, &p->actions[s][i]);
        if (!x.send) continue; /* matched from the sender's side */
        /* the first pending send of s to x.peer */
        int first = 1;
        for (int j = pos[s]; j < i && first; j++) {
          Xfer y = xfer_of(p, &p->actions[s][j]);
          if (!done[base[s] + j] && y.send && y.peer == x.peer) first = 0;
        }
        if (!first) continue;
        /* the peer's first pending receive from s, in its current group */
        int q = x.peer;
        for (int j = pos[q]; j < p->nactions[q] && is_xfer(&p->actions[q][j]); j++) {
          Xfer y = xfer_of(p, &p->actions[q][j]);
          if (done[base[q] + j] || y.send || y.peer != s) continue;
          if (y.tag == x.tag && y.n == x.n) {
            done[base[s] + i] = done[base[q] + j] = 1;
            progress = 1;
          }
          break;
        }
      }
    }
    for (int s = 0; s < P; s++) { /* groups whose operations all completed end */
      int e = pos[s], all = 1;
      while (e < p->nactions[s] && is_xfer(&p->actions[s][e])) all &= done[base[s] + e++];
      if (e > pos[s] && all) pos[s] = e, progress = 1;
    }
    if (!progress) {
      ok = 0;
      break;
    }
  }
  free(pos), free(done), free(base);
  return ok;
}

/* ---- NCCL transfers on their own stream (RtCuda.p2p) ----
 * A group of transfers waits for the compute stream's work so far (its sends'
 * values are written, its receives' buffers free); the compute stream waits
 * for it only before it next runs on a slot the group touched (wait_slot), and
 * for all of them before the step's collectives (p2p_join): a send, which
 * NCCL completes only once its peer receives, no longer holds up the next
 * microbatch's compute.  Relative to one stream this drops dependencies and
 * adds none, so a schedule rendezvous_safe accepts stays deadlock-free. */

/* The stream and events for a desc of `slots` slots (made once, grown). */
static int p2p_open(RtCuda *c, int slots) {
  if (!c->p2p) {
    CU_CHECK(c, cudaStreamCreateWithFlags(&c->p2p, cudaStreamNonBlocking), "cudaStreamCreate");
    CU_CHECK(c, cudaEventCreateWithFlags(&c->p2p_ready, cudaEventDisableTiming),
             "cudaEventCreate");
    CU_CHECK(c, cudaEventCreateWithFlags(&c->p2p_done, cudaEventDisableTiming),
             "cudaEventCreate");
  }
  if (slots <= c->nslot_ev) return RT_OK;
  cudaEvent_t *ev = (cudaEvent_t *)realloc(c->slot_ev, sizeof *ev * (size_t)slots);
  if (ev) c->slot_ev = ev;
  unsigned char *w = (unsigned char *)realloc(c->slot_wait, (size_t)slots);
  if (w) c->slot_wait = w;
  if (!ev || !w) return rt_fail("rank %d: out of host memory", c->wrank);
  for (; c->nslot_ev < slots; c->nslot_ev++) {
    c->slot_wait[c->nslot_ev] = 0;
    CU_CHECK(c, cudaEventCreateWithFlags(&c->slot_ev[c->nslot_ev], cudaEventDisableTiming),
             "cudaEventCreate");
  }
  return RT_OK;
}

void rt_cuda_pipe_close(RtCuda *c) {
  if (c->p2p) cudaStreamSynchronize(c->p2p);
  for (int k = 0; k < c->nslot_ev; k++) cudaEventDestroy(c->slot_ev[k]);
  free(c->slot_ev), free(c->slot_wait);
  if (c->p2p_ready) cudaEventDestroy(c->p2p_ready);
  if (c->p2p_done) cudaEventDestroy(c->p2p_done);
  if (c->p2p) cudaStreamDestroy(c->p2p);
}

/* Before the compute stream runs on slot k: the transfers touching it done. */
static int wait_slot(RtCuda *c, int k) {
  if (k >= c->nslot_ev || !c->slot_wait[k]) return RT_OK;
  c->slot_wait[k] = 0;
  CU_CHECK(c, cudaStreamWaitEvent(c->compute, c->slot_ev[k], 0), "wait for a pipeline transfer");
  return RT_OK;
}

/* Before the step's collectives: every transfer done (NCCL's kernels of one
 * communicator must not run out of their issue order on two streams). */
static int p2p_join(RtCuda *c) {
  if (!c->p2p_used) return RT_OK;
  c->p2p_used = 0;
  for (int k = 0; k < c->nslot_ev; k++) c->slot_wait[k] = 0;
  CU_CHECK(c, cudaEventRecord(c->p2p_done, c->p2p), "join the pipeline transfers");
  CU_CHECK(c, cudaStreamWaitEvent(c->compute, c->p2p_done, 0), "join the pipeline transfers");
  return RT_OK;
}

/* Runs the transfer actions [i, end) of stage s's list, one NCCL group (on
 * RtCuda.p2p; on the compute stream while PARC_CUDA_PROFILE times them), or one
 * by one through the host. */
static int transfers(RtCuda *c, const RtPipeDesc *p, int s, int i, int end, char *base) {
  RtProfScope ps(c);
  if (ps.on()) {
    double bytes = 0;
    for (int j = i; j < end; j++) {
      Xfer x = xfer_of(p, &p->actions[s][j]);
      for (int k = 0; k < x.n; k++) bytes += 4.0 * (double)x.v[k].count;
    }
    ps.set(RT_PROF_COMM, bytes, 0, "pipeline transfers pp (%s)",
           c->pipe_p2p ? "NCCL" : c->local_dev ? "device-local" : "host-staged");
  }
  if (!c->pipe_p2p) {
    for (; i < end; i++) {
      const RtPipeAction *a = &p->actions[s][i];
      Xfer x = xfer_of(p, a);
      char *slot = base + (int64_t)rt_pipe_slot(p, s, a->mb) * p->slot_bytes[s];
      for (int k = 0; k < x.n; k++)
        if (host_p2p(c, x.send, (float *)(void *)(slot + x.v[k].offset), x.v[k].count, x.peer,
                     x.tag))
          return RT_ERR;
    }
    return RT_OK;
  }
#ifdef PARC_HAVE_NCCL
  char what[160];
  snprintf(what, sizeof what, "pipeline transfers (%d actions) over group pp (%d stages)",
           end - i, p->stages);
  ncclComm_t nc = c->gcomm[RT_CUDA_PP];
  cudaStream_t st = c->p2p && !c->prof ? c->p2p : c->compute;
  if (st != c->compute) {
    CU_CHECK(c, cudaEventRecord(c->p2p_ready, c->compute), what);
    CU_CHECK(c, cudaStreamWaitEvent(st, c->p2p_ready, 0), what);
  }
  NC_CHECK(c, ncclGroupStart(), what);
  for (int j = i; j < end; j++) {
    const RtPipeAction *a = &p->actions[s][j];
    Xfer x = xfer_of(p, a);
    char *slot = base + (int64_t)rt_pipe_slot(p, s, a->mb) * p->slot_bytes[s];
    for (int k = 0; k < x.n; k++) {
      void *ptr = slot + x.v[k].offset; /* 4-byte words (f32, i32, bf16 pairs), as they are */
      size_t cnt = (size_t)x.v[k].count;
      if (x.send) NC_CHECK(c, ncclSend(ptr, cnt, ncclFloat, x.peer, nc, st), what);
      else NC_CHECK(c, ncclRecv(ptr, cnt, ncclFloat, x.peer, nc, st), what);
    }
  }
  NC_CHECK(c, ncclGroupEnd(), what);
  for (int j = i; st != c->compute && j < end; j++) { /* the slots the group touched */
    int k = rt_pipe_slot(p, s, p->actions[s][j].mb);
    CU_CHECK(c, cudaEventRecord(c->slot_ev[k], st), what);
    c->slot_wait[k] = 1;
    c->p2p_used = 1;
  }
  return rt_cuda_watch(c, st, what);
#else
  (void)s, (void)base;
  return rt_fail("rank %d: built without NCCL", c->wrank);
#endif
}

/* Shared parameter j's gradient: the parts of its holders summed in stage
 * order into g + off[s] (sum and part: the arena's two scratch vectors). */
static int shared_sum(RtCuda *c, const RtPipeDesc *p, int j, int s, float *gacc, float *sum,
                      float *part, bool zero) {
  const int64_t *sh = p->shared + (int64_t)j * (p->stages + 1), *off = sh + 1;
  int64_t n = sh[0];
  float *g = gacc; /* under ZeRO-1 the rank's piece alone: g + off[s] is its start */
  if (zero) g += rt_pipe_zero_piece(n, c->gsize[RT_CUDA_DP], c->grank[RT_CUDA_DP], &n);
  int tag = p->chunks * p->microbatches * 2 + j, holders = 0, other = -1;
  if (off[s] < 0) return RT_OK;
  for (int k = 0; k < p->stages; k++)
    if (off[k] >= 0) holders++, other = k != s ? k : other;
  if (holders < 2) return RT_OK;
  RtProfScope ps(c); /* the parts exchanged, summed and stored */
  if (ps.on()) ps.set(RT_PROF_COMM, 4.0 * (double)n * holders, 0, "shared gradient sum pp");
#ifdef PARC_HAVE_NCCL
  if (c->pipe_p2p && holders == 2) { /* one group: send mine, receive the other's */
    char what[128];
    snprintf(what, sizeof what, "shared parameter %d's gradient (%lld floats) over group pp", j,
             (long long)n);
    ncclComm_t nc = c->gcomm[RT_CUDA_PP];
    NC_CHECK(c, ncclGroupStart(), what);
    NC_CHECK(c, ncclSend(g + off[s], (size_t)n, ncclFloat, other, nc, c->compute), what);
    NC_CHECK(c, ncclRecv(part, (size_t)n, ncclFloat, other, nc, c->compute), what);
    NC_CHECK(c, ncclGroupEnd(), what);
    if (rt_cuda_watch(c, c->compute, what)) return RT_ERR;
  } else
#endif
  {
    /* host-staged: every part to the other holders first (buffered sends),
     * then the others' parts one by one into part */
    for (int k = 0; k < p->stages; k++)
      if (k != s && off[k] >= 0 && host_p2p(c, 1, g + off[s], n, k, tag)) return RT_ERR;
  }
  int first = 1;
  for (int k = 0; k < p->stages; k++) {
    if (off[k] < 0) continue;
    const float *x = g + off[s];
    if (k != s) {
      if (!(c->pipe_p2p && holders == 2) && host_p2p(c, 0, part, n, k, tag)) return RT_ERR;
      x = part;
    }
    if (first ? rt_cuda_copy(c, sum, x, n) : rt_cuda_acc(c, sum, x, n)) return RT_ERR;
    first = 0;
  }
  return rt_cuda_copy(c, g + off[s], sum, n);
}

/* The accumulator's sum over dp (rt_pipe.c's reduce_grads, piece for piece):
 * one all-reduce of all of it over dp, or, with expert-parallel parameters on
 * stage s, each part between their regions over dp and each run of adjacent
 * regions over ep_dp (nothing over an ep_dp group of one rank).  Every rank of
 * a dp group walks the same desc, so they make the same calls in the same
 * order (NCCL's requirement); the ep_dp groups of one dp group run theirs
 * side by side, each over its own members. */
static int reduce_grads(RtCuda *c, const RtPipeDesc *p, int s, float *g, int64_t gn) {
  int dp = c->gsize[RT_CUDA_DP], ep_dp = c->gsize[RT_CUDA_EP_DP];
  int64_t at = 0; /* g[0, at) is done */
  while (at < gn) {
    int64_t lo, hi;
    if (rt_pipe_expert_run(p, s, at, gn, &lo, &hi)) return RT_ERR;
    if (lo > at && dp > 1 && rt_cuda_all_reduce(c, RT_CUDA_DP, g + at, g + at, lo - at))
      return RT_ERR;
    if (hi > lo && ep_dp > 1 && rt_cuda_all_reduce(c, RT_CUDA_EP_DP, g + lo, g + lo, hi - lo))
      return RT_ERR;
    at = hi;
  }
  return RT_OK;
}

/* ZeRO-1 (rt_pipe.c's scatter_grads and gather_grads, bucket for bucket; the
 * same pieces, groups, order and sums): a bucket of one parameter goes in
 * place, one of several is packed rank by rank into the bucket scratch x
 * (block k: each row's piece k, rt_pipe_bucket_block), its pieces copied back
 * after the collective.  Collectives of unequal pieces (rt_cuda_*_v). */
typedef struct {
  RtCuda *c;
  float *g, *x;
  int dir; /* 1: g into the block x, -1: back */
  int rc;
} ZeroCopy;
static void zero_copy(void *ctx, int64_t at, int64_t off, int64_t count) {
  ZeroCopy *z = (ZeroCopy *)ctx;
  if (!z->rc)
    z->rc = z->dir > 0 ? rt_cuda_copy(z->c, z->x + at, z->g + off, count)
                       : rt_cuda_copy(z->c, z->g + off, z->x + at, count);
}

/* rank k's block of bucket b between g and x (dir as ZeroCopy's) */
static int zero_block(RtCuda *c, const RtPipeDesc *p, int s, const RtPipeBucket *b, int grp, int k,
                      float *g, float *x, int dir) {
  ZeroCopy z = {c, g, x, dir, RT_OK};
  rt_pipe_bucket_block(p, s, b, c->gsize[grp], k, zero_copy, &z);
  return z.rc;
}

/* Every bucket of stage s: reduce-scattered (gather 0) so that the rank's
 * piece of each holds the sum, or (gather 1, --save-grads) all-gathered from
 * the pieces so that g holds every rank's. */
static int zero_buckets(RtCuda *c, const RtPipeDesc *p, int s, float *g, float *x, bool gather) {
  RtPipeBucket b = {};
  b.id = -1;
  int64_t *counts = NULL;
  int rc = RT_OK;
  for (int more; rc == RT_OK && (more = rt_pipe_bucket_next(p, s, &b)) != 0;) {
    if (more < 0) {
      rc = RT_ERR;
      break;
    }
    const int grp = b.group == 3 ? RT_CUDA_EP_DP : RT_CUDA_DP, z = c->gsize[grp], me = c->grank[grp];
    if (z <= 1) continue;
    if (!counts && !(counts = (int64_t *)malloc(sizeof *counts * RT_COMM_MAX_RANKS)))
      return rt_fail("rank %d: out of host memory", c->wrank);
    if (z > RT_COMM_MAX_RANKS) {
      rc = rt_fail("pipeline: a ZeRO-1 group of %d ranks", z);
      break;
    }
    const int64_t mine = rt_pipe_bucket_counts(p, s, &b, z, me, counts);
    if (b.rows == 1) {
      float *at = g + rt_pipe_bucket_offset(p, s, &b);
      rc = gather ? rt_cuda_all_gather_v(c, grp, at + mine, at, counts)
                  : rt_cuda_reduce_scatter_v(c, grp, at, at + mine, counts);
      continue;
    }
    if (gather) {
      rc = zero_block(c, p, s, &b, grp, me, g, x + mine, 1);
      if (!rc) rc = rt_cuda_all_gather_v(c, grp, x + mine, x, counts);
      for (int64_t k = 0, at = 0; !rc && k < z; at += counts[k++])
        rc = zero_block(c, p, s, &b, grp, (int)k, g, x + at, -1);
    } else {
      for (int64_t k = 0, at = 0; !rc && k < z; at += counts[k++])
        rc = zero_block(c, p, s, &b, grp, (int)k, g, x + at, 1);
      if (!rc) rc = rt_cuda_reduce_scatter_v(c, grp, x, x + mine, counts);
      if (!rc) rc = zero_block(c, p, s, &b, grp, me, g, x + mine, -1);
    }
  }
  free(counts);
  return rc;
}

extern "C" int rt_cuda_pipe_step(RtCuda *c, RtStepIO *io, const RtPipeDesc *p) {
  int s = c->grank[RT_CUDA_PP], M = p->microbatches;
  if (s < 0 || s >= p->stages || c->gsize[RT_CUDA_PP] != p->stages)
    return rt_fail("rank %d: pipeline: stage %d of %d, the device context has %d", c->wrank, s,
                   p->stages, c->gsize[RT_CUDA_PP]);
  rt_cuda_graph_check(c, 1, 0); /* PARC_CUDA_GRAPH: pipelined steps stay plain */
  if (c->pipe_desc != p) { /* decided once: the same on every rank */
    if (rt_pipe_check_slots(p, s)) return RT_ERR;
    c->pipe_desc = p;
    c->pipe_p2p = c->use_nccl && p->stages > 1 && rendezvous_safe(p);
    if (c->pipe_p2p && !c->p2p_off && p2p_open(c, p->slots)) return RT_ERR;
  }
  if (pipe_host(c, M)) return RT_ERR;
  c->pipe_nloss = 0;
  c->pipe_norm = 0;
  int64_t gmax = 0, gn = p->grad_numel[s];
  for (int k = 0; k < p->stages; k++)
    if (p->grad_numel[k] > gmax) gmax = p->grad_numel[k];
  char *base = c->arena;
  float *g = (float *)(void *)(base + (int64_t)rt_pipe_slots(p, s) * p->slot_bytes[s]);
  float *sum = g + (gmax * 4 + 63) / 64 * 16, *part = sum + (p->shared_max * 4 + 63) / 64 * 16;
  if (rt_cuda_zero(c, g, gn)) return RT_ERR;
  /* the generated stage functions see device memory only */
  RtStepIO d = *io;
  d.params = c->params;
  d.state = c->state;
  d.gacc = g;
  d.grads = NULL;
  d.trace = NULL;
  for (int i = 0; i < p->nactions[s];) {
    const RtPipeAction *a = &p->actions[s][i];
    if (is_xfer(a)) {
      int end = i;
      while (end < p->nactions[s] && is_xfer(&p->actions[s][end])) end++;
      if (transfers(c, p, s, i, end, base)) return RT_ERR;
      i = end;
      continue;
    }
    int ch = a->chunk, mb = a->mb;
    int k = rt_pipe_slot(p, s, mb);
    if (wait_slot(c, k)) return RT_ERR;
    d.arena = base + (int64_t)k * p->slot_bytes[s];
    d.tokens = c->tokens + (int64_t)mb * p->mb_tokens;
    d.targets = c->targets + (int64_t)mb * p->mb_tokens;
    int rc = a->kind == RT_PIPE_F   ? p->fwd[ch](&d)
             : a->kind == RT_PIPE_W ? p->wgt[ch](&d)
                                    : p->bwd[ch](&d);
    if (!rc && a->kind == RT_PIPE_B && !p->split_w) rc = p->wgt[ch](&d);
    if (rc) return RT_ERR;
    i++;
  }
  if (p2p_join(c)) return RT_ERR;
  int dp = c->gsize[RT_CUDA_DP];
  const bool zero = p->zero > 1 && dp > 1;
  float *after = part + (p->shared_max * 4 + 63) / 64 * 16;
  float *scratch = zero ? (float *)(void *)(base + rt_pipe_zero_scratch(p, s, (char *)after - base))
                        : NULL;
  if (zero ? zero_buckets(c, p, s, g, scratch, false) : dp > 1 && reduce_grads(c, p, s, g, gn))
    return RT_ERR;
  for (int j = 0; j < p->nshared; j++)
    if (shared_sum(c, p, j, s, g, sum, part, zero)) return RT_ERR;
  /* --save-grads under ZeRO-1: every rank's pieces gathered into g first (the
   * optimizer reads only the rank's own, which stay as they are) */
  if (io->grads && zero && zero_buckets(c, p, s, g, scratch, true)) return RT_ERR;
  if (io->grads && gn && rt_cuda_to_host(c, io->grads, g, gn)) return RT_ERR;
  d.arena = base;
  d.tokens = c->tokens;
  d.targets = c->targets;
  if (p->optimizer[s](&d)) return RT_ERR;
  if (c->prof) rt_prof_step_end(c->prof);
  rt_cuda_tune_step_end(c); /* PARC_CUDA_GEMM_TUNE: what this step planned */
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "the pipelined step (an earlier kernel, copy "
           "or transfer failed)");
  if (c->prof) rt_prof_step_done(c->prof);
  /* the loss: the last stage's mean over microbatches, on every stage */
  double loss = 0, ce = 0;
  for (int k = 0; k < c->pipe_nloss; k++) loss += c->pipe_host[2 + 2 * k], ce += c->pipe_host[3 + 2 * k];
  float both[2] = {0, 0};
  if (s == (p->chunks - 1) % p->stages) {
    if (c->pipe_nloss != M)
      return rt_fail("rank %d: pipeline: %d losses for %d microbatches", c->wrank, c->pipe_nloss, M);
    both[0] = (float)(loss / M), both[1] = (float)(ce / M);
  }
  if (p->stages > 1 && rt_comm_all_reduce(c->hgroup[RT_CUDA_PP], both, both, 2)) return RT_ERR;
  io->loss = both[0];
  io->ce_loss = both[1];
  io->grad_norm = c->pipe_norm ? c->pipe_host[0] : 0.0f;
  return RT_OK;
}
