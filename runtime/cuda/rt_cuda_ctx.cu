/* runtime/cuda/rt_cuda_ctx.cu -- a rank's device context: device choice,
 * start-up checks, buffers, streams, communicators (NCCL or host-staged)
 * and the NCCL watchdog.  See rt_cuda.h for the design. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/cuda/rt_cuda_graph.h"
#include "runtime/cuda/rt_cuda_impl.h"
#include "runtime/cuda/rt_cuda_local.h"
#include "runtime/cuda/rt_cuda_memcheck.h"

/* ---- errors ---- */

int rt_cuda_fail_at(const RtCuda *c, const char *file, int line, const char *op,
                    const char *what) {
  const char *base = strrchr(file, '/');
  return rt_fail("%s:%d: rank %d%s%s: %s: %s", base ? base + 1 : file, line, c ? c->wrank : -1,
                 c && c->name[0] ? " on " : "", c ? c->name : "", op, what);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- workspace ---- */

void *rt_cuda_ws(RtCuda *c, int slot, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (c->ws_bytes[slot] >= bytes) return c->ws[slot];
  if (c->ws_plan[slot]) { /* planned at open: the plan and the op disagree */
    char what[200];
    snprintf(what, sizeof what, "workspace slot %d needs %zu bytes, planned %zu "
             "(rt_cuda_ws_plan.c does not match the op)", slot, bytes, c->ws_plan[slot]);
    rt_cuda_fail_at(c, __FILE__, __LINE__, "rt_cuda_ws", what);
    return NULL;
  }
  if (c->graph_capturing) { /* growing waits for the stream: not in a capture */
    char what[160];
    snprintf(what, sizeof what, "workspace slot %d grows to %zu bytes during the graph capture",
             slot, bytes);
    rt_cuda_fail_at(c, __FILE__, __LINE__, "rt_cuda_ws", what);
    return NULL;
  }
  /* grows once per size (the first step): wait for users of the old buffer */
  cudaError_t e = cudaStreamSynchronize(c->compute);
  if (e == cudaSuccess && c->ws[slot]) e = cudaFree(c->ws[slot]);
  c->ws[slot] = NULL;
  c->ws_bytes[slot] = 0;
  if (e == cudaSuccess) e = cudaMalloc(&c->ws[slot], bytes);
  if (e != cudaSuccess) {
    char what[256];
    snprintf(what, sizeof what, "workspace of %zu bytes: %s", bytes, cudaGetErrorString(e));
    rt_cuda_fail_at(c, __FILE__, __LINE__, "cudaMalloc", what);
    c->ws[slot] = NULL;
    return NULL;
  }
  c->ws_bytes[slot] = bytes;
  return c->ws[slot];
}

void *rt_cuda_host_stage(RtCuda *c, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (c->host_stage_bytes >= bytes) return c->host_stage;
  if (c->graph_capturing) {
    rt_cuda_fail_at(c, __FILE__, __LINE__, "rt_cuda_host_stage",
                    "the host staging buffer grows during the graph capture");
    return NULL;
  }
  if (c->host_stage) cudaFreeHost(c->host_stage);
  c->host_stage = NULL;
  c->host_stage_bytes = 0;
  cudaError_t e = cudaMallocHost(&c->host_stage, bytes);
  if (e != cudaSuccess) {
    rt_cuda_fail_at(c, __FILE__, __LINE__, "cudaMallocHost", cudaGetErrorString(e));
    c->host_stage = NULL;
    return NULL;
  }
  c->host_stage_bytes = bytes;
  return c->host_stage;
}

/* ---- accessors ---- */

float *rt_cuda_params(RtCuda *c) { return c->params; }
float *rt_cuda_state(RtCuda *c) { return c->state; }
char *rt_cuda_arena(RtCuda *c) { return c->arena; }
int32_t *rt_cuda_tokens(RtCuda *c) { return c->tokens; }
int32_t *rt_cuda_targets(RtCuda *c) { return c->targets; }
float *rt_cuda_scalar(RtCuda *c, int i) { return c->scalars + i; }
struct CUstream_st *rt_cuda_stream(RtCuda *c) { return c->compute; }
int rt_cuda_group_rank(RtCuda *c, int group) { return c->grank[group]; }
int rt_cuda_group_size(RtCuda *c, int group) { return c->gsize[group]; }
const char *rt_cuda_describe(RtCuda *c) { return c->desc; }

/* ---- the watchdog ---- */

#ifdef PARC_HAVE_NCCL
static void abort_all(RtCuda *c, const char *why) {
  fprintf(stderr, "train_cuda: rank %d on %s: %s; aborting the NCCL communicators\n", c->wrank,
          c->name, why);
  fflush(stderr);
  for (int g = 0; g < RT_CUDA_NGROUPS; g++)
    if (c->gcomm[g]) ncclCommAbort(c->gcomm[g]);
  if (c->world_comm) ncclCommAbort(c->world_comm);
  _exit(3);
}

/* Polls the last collective: done, failed (asynchronous NCCL error) or late. */
static void *watchdog_main(void *arg) {
  RtCuda *c = (RtCuda *)arg;
  cudaSetDevice(c->device);
  for (;;) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&c->mu);
    if (c->stop) {
      pthread_mutex_unlock(&c->mu);
      return NULL;
    }
    if (c->pending) {
      cudaError_t q = cudaEventQuery(c->pending_ev);
      char why[320];
      why[0] = 0;
      if (q == cudaSuccess) {
        c->pending = 0;
      } else if (q != cudaErrorNotReady) {
        snprintf(why, sizeof why, "%s: CUDA error %s", c->pending_what, cudaGetErrorString(q));
      } else {
        for (int g = 0; g < RT_CUDA_NGROUPS && !why[0]; g++) {
          ncclResult_t ae = ncclSuccess;
          if (c->gcomm[g] && ncclCommGetAsyncError(c->gcomm[g], &ae) == ncclSuccess &&
              ae != ncclSuccess && ae != ncclInProgress)
            snprintf(why, sizeof why, "%s: NCCL asynchronous error on group %s: %s",
                     c->pending_what, rt_cuda_group_name[g], ncclGetErrorString(ae));
        }
        double late = now_s() - c->pending_since;
        if (!why[0] && late > rt_comm_timeout())
          snprintf(why, sizeof why, "%s did not finish within %.0f s (a peer stopped, or hangs)",
                   c->pending_what, rt_comm_timeout());
      }
      if (why[0]) abort_all(c, why); /* does not return */
    }
    pthread_mutex_unlock(&c->mu);
  }
}
#endif

/* ---- device choice and start-up checks ---- */

/* This process's rank among the processes on its node, or -1 if not launched by
 * an MPI/Slurm launcher. */
static int local_rank_env(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                     "SLURM_LOCALID", "PMI_LOCAL_RANK", NULL};
  for (int i = 0; vars[i]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return -1;
}

/* This rank's GPU and collectives backend from the GPU count and the PARC_CUDA_*
 * settings.  A refusal of the user's setup (no GPU, too few for NCCL, a bad
 * or conflicting setting) is RT_ERR_SETUP with what to do; a failing CUDA
 * call RT_ERR.  Local: no collective. */
static int choose_device(RtCuda *c, const RtCudaSetup *s) {
  int ngpu = 0;
  cudaError_t e = cudaGetDeviceCount(&ngpu);
  if (e != cudaSuccess || ngpu < 1)
    return rt_fail_setup("rank %d: no usable CUDA GPU (cudaGetDeviceCount: %s); run train_cuda "
                         "where a GPU and its driver are visible (CUDA_VISIBLE_DEVICES), or "
                         "train on the CPU with `train`", c->wrank,
                         e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
  int mpi = rt_comm_mpi_launched();
  int local = mpi ? local_rank_env() : c->wrank;
  if (local < 0) local = c->wrank;
  const char *want = getenv("PARC_CUDA_COMM");
  int own_gpu = mpi ? local < ngpu : c->ranks <= ngpu;
  if (want && strcmp(want, "nccl") && strcmp(want, "host"))
    return rt_fail_setup("PARC_CUDA_COMM='%s': expected nccl or host", want);
  c->use_nccl = want ? !strcmp(want, "nccl") : own_gpu;
  if (c->ranks == 1) c->use_nccl = 0; /* nothing to communicate */
#ifndef PARC_HAVE_NCCL
  if (c->use_nccl && want)
    return rt_fail_setup("PARC_CUDA_COMM=nccl: this libparcrt_cuda was built without NCCL; "
                         "use PARC_CUDA_COMM=host");
  c->use_nccl = 0;
#endif
  if (c->use_nccl && !own_gpu)
    return rt_fail_setup("mesh of %d ranks (tp %d x dp %d x pp %d) needs a GPU per rank with "
                         "NCCL, but %s sees %d GPU%s; run on as many GPUs as ranks, or "
                         "PARC_CUDA_COMM=host runs several ranks on one GPU",
                         c->ranks, s->tp, s->dp, c->gsize[RT_CUDA_PP],
                         mpi ? "this node" : "this process", ngpu, ngpu == 1 ? "" : "s");
  /* without NCCL: device-local collectives (PARC_CUDA_LOCAL=device) or
   * host-staged ones (the default, or =host) */
  const char *loc = getenv("PARC_CUDA_LOCAL");
  if (loc && *loc && strcmp(loc, "device") && strcmp(loc, "host"))
    return rt_fail_setup("PARC_CUDA_LOCAL='%s': expected device or host", loc);
  if (loc && *loc) {
    if (want && !strcmp(want, "nccl"))
      return rt_fail_setup("PARC_CUDA_LOCAL=%s and PARC_CUDA_COMM=nccl: the device-local "
                           "backend does not use NCCL; unset one of them", loc);
    c->use_nccl = 0;
    c->local_dev = c->ranks > 1 && !strcmp(loc, "device");
  }
  /* NCCL's pipeline transfers on their own stream (1, the default) or on the
   * compute stream (0: no overlap, as before; rt_cuda_pipe.cu) */
  const char *ps = getenv("PARC_CUDA_PIPE_STREAM");
  if (ps && *ps && strcmp(ps, "0") && strcmp(ps, "1"))
    return rt_fail_setup("PARC_CUDA_PIPE_STREAM='%s': expected 1 (NCCL pipeline transfers on "
                         "their own stream, overlapping compute) or 0 (on the compute stream)",
                         ps);
  c->p2p_off = ps && !strcmp(ps, "0");
  if (c->local_dev && mpi) /* (rt_cuda_local_open's own check, before any allocation) */
    return rt_fail_setup("PARC_CUDA_LOCAL=device needs the ranks as threads of one process, "
                         "not under mpirun; use PARC_CUDA_LOCAL=host");
  /* device-local collectives read the peers' buffers: every rank on the first
   * visible GPU (CUDA_VISIBLE_DEVICES chooses it) */
  c->device = c->local_dev ? 0 : local % ngpu;
  CU_CHECK(c, cudaSetDevice(c->device), "cudaSetDevice");
  cudaDeviceProp prop;
  CU_CHECK(c, cudaGetDeviceProperties(&prop, c->device), "cudaGetDeviceProperties");
  snprintf(c->name, sizeof c->name, "GPU %d (%.100s)", c->device, prop.name);
  snprintf(c->desc, sizeof c->desc, "%s, sm_%d%d, %d rank%s, collectives %s", c->name,
           prop.major, prop.minor, c->ranks, c->ranks == 1 ? "" : "s",
           c->ranks == 1   ? "none"
           : c->use_nccl   ? "NCCL"
           : c->local_dev  ? "device-local (device copies, reduction kernels)"
                           : "host-staged (device-local)");
  return RT_OK;
}

/* The plan fits in the free memory of this rank's GPU, together with the
 * plans of the other ranks on it (rt_cuda_memcheck.h).  Every rank calls it,
 * before any rank allocates, with the status of its checks so far (`rc`): a
 * rank that failed them joins the gather with an empty record (no GPU) and
 * returns rc.  A plan that does not fit is RT_ERR_SETUP with planned and free
 * bytes and what to change. */
static int check_memory(RtCuda *c, int rc) {
  size_t free_b = 0, total_b = 0;
  cudaError_t e = rc == RT_OK ? cudaMemGetInfo(&free_b, &total_b) : cudaSuccess;
  if (e != cudaSuccess)
    rc = rt_cuda_fail_at(c, __FILE__, __LINE__, "cudaMemGetInfo", cudaGetErrorString(e));
  /* (ws_planned counts the params' bf16 copy, which only GEMMs read) */
  int64_t need = rt_cuda_planned_bytes(c->params_numel, c->state_numel, c->arena_bytes, c->ntok,
                                       c->ws_planned);
  char host[256] = "";
  if (gethostname(host, sizeof host - 1)) host[0] = 0;
  /* a rank without a GPU shares no device with anyone (device -1, nothing needed) */
  RtDeviceNeed mine = {rc == RT_OK ? need : 0, rc == RT_OK ? c->device : -1,
                       rt_cuda_host_hash(host)};
  RtDeviceNeed *all = (RtDeviceNeed *)calloc((size_t)c->ranks, sizeof *all);
  if (!all) return rt_fail("rank %d: out of host memory", c->wrank);
  /* records travel as raw bytes in float slots, as share_id's id does */
  float rec[RT_DEVICE_NEED_FLOATS] = {0};
  memcpy(rec, &mine, sizeof mine);
  RtComm *g[3] = {c->hgroup[RT_CUDA_TP], c->hgroup[RT_CUDA_DP], c->hgroup[RT_CUDA_PP]};
  int grc = RT_OK, sharers = 1;
  if (c->ranks == 1) all[0] = mine;
  else grc = rt_cuda_gather_world(g, rec, RT_DEVICE_NEED_FLOATS, c->ranks, (float *)(void *)all);
  c->planned = need;
  c->checked_free = free_b;
  int64_t together = grc == RT_OK ? rt_cuda_device_need(all, c->ranks, c->wrank, &sharers) : 0;
  free(all);
  if (grc != RT_OK) return grc;
  if (rc != RT_OK) return rc;
  if (together < 0) return rt_fail("rank %d: the ranks' planned bytes overflow", c->wrank);
  if ((uint64_t)together > (uint64_t)free_b && sharers == 1)
    return rt_fail_setup("rank %d on %s: the plan does not fit: planned %lld bytes (parameters "
                         "%lld, optimizer state %lld, arena %lld, GEMM workspaces %lld) but "
                         "only %zu bytes are free of %zu; use a smaller batch (-D batch=N) or "
                         "more microbatches, more tp or pp ranks, or a GPU with more free memory",
                         c->wrank, c->name, (long long)need, (long long)(4 * c->params_numel),
                         (long long)(4 * c->state_numel), (long long)c->arena_bytes,
                         (long long)(RT_CUDA_GEMM_WORKSPACE + c->ws_planned), free_b, total_b);
  if ((uint64_t)together > (uint64_t)free_b)
    return rt_fail_setup("rank %d on %s: the plans of the %d ranks sharing this GPU do not fit: "
                         "planned %lld bytes together (this rank %lld: parameters %lld, "
                         "optimizer state %lld, arena %lld, GEMM workspaces %lld) but only "
                         "%zu bytes are free of %zu; give each rank its own GPU (fewer ranks "
                         "per GPU) or use a smaller batch",
                         c->wrank, c->name, sharers, (long long)together, (long long)need,
                         (long long)(4 * c->params_numel), (long long)(4 * c->state_numel),
                         (long long)c->arena_bytes,
                         (long long)(RT_CUDA_GEMM_WORKSPACE + c->ws_planned), free_b, total_b);
  return RT_OK;
}

/* ---- NCCL bootstrap ---- */

#ifdef PARC_HAVE_NCCL
/* World rank 0 makes the unique id; it reaches every rank over the harness's
 * host groups: over pp from stage 0 (world rank 0 is tp 0, dp 0, pp 0), then
 * over dp from dp rank 0 (so every tp rank 0 has it), then over tp from tp
 * rank 0.  Works for the thread and the MPI backends alike. */
static int share_id(RtCuda *c, ncclUniqueId *id) {
  enum { N = (int)((sizeof(ncclUniqueId) + sizeof(float) - 1) / sizeof(float)) };
  float buf[N];
  memset(buf, 0, sizeof buf);
  if (c->wrank == 0) {
    NC_CHECK(c, ncclGetUniqueId(id), "ncclGetUniqueId");
    memcpy(buf, id, sizeof *id);
  }
  if (c->hgroup[RT_CUDA_PP] && rt_comm_broadcast(c->hgroup[RT_CUDA_PP], buf, N, 0)) return RT_ERR;
  if (c->hgroup[RT_CUDA_DP] && rt_comm_broadcast(c->hgroup[RT_CUDA_DP], buf, N, 0)) return RT_ERR;
  if (c->hgroup[RT_CUDA_TP] && rt_comm_broadcast(c->hgroup[RT_CUDA_TP], buf, N, 0)) return RT_ERR;
  memcpy(id, buf, sizeof *id);
  return RT_OK;
}

static int nccl_open(RtCuda *c) {
  ncclUniqueId id;
  if (share_id(c, &id)) return RT_ERR;
  NC_CHECK(c, ncclCommInitRank(&c->world_comm, c->ranks, id, c->wrank), "ncclCommInitRank(world)");
  /* every group of more than one member, split as rt_comm_mesh splits the host
   * world (gcolor, key = the group rank): the same members in the same order.
   * Group sizes are the same on every rank, so every rank makes the same calls. */
  for (int g = 0; g < RT_CUDA_NGROUPS; g++) {
    if (c->gsize[g] < 2) continue;
    char op[64];
    snprintf(op, sizeof op, "ncclCommSplit(%s)", rt_cuda_group_name[g]);
    NC_CHECK(c, ncclCommSplit(c->world_comm, c->gcolor[g], c->grank[g], &c->gcomm[g], NULL), op);
  }
  CU_CHECK(c, cudaEventCreateWithFlags(&c->pending_ev, cudaEventDisableTiming), "cudaEventCreate");
  if (pthread_create(&c->watchdog, NULL, watchdog_main, c))
    return rt_fail("rank %d: cannot start the NCCL watchdog thread", c->wrank);
  c->watchdog_on = 1;
  return RT_OK;
}
#endif

/* ---- start-up allocations ---- */

/* A start-up allocation that failed after the agreed memory check.  Out of
 * memory (`oom`) is the user's environment -- another process took memory since
 * the check, or what is free is too fragmented -- so it is RT_ERR_SETUP naming
 * the rank, the GPU, the bytes asked (0: a handle of unknown size) and what is
 * free now, and saying what to do; any other failure is RT_ERR. */
static int alloc_failed(RtCuda *c, int line, const char *op, size_t bytes, int oom,
                        const char *err) {
  if (!oom) return rt_cuda_fail_at(c, __FILE__, line, op, err);
  cudaGetLastError(); /* out of memory is not sticky: clear it for the calls to come */
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0;
  char asked[64] = "";
  if (bytes) snprintf(asked, sizeof asked, " of %zu bytes", bytes);
  return rt_fail_setup("rank %d on %s: out of GPU memory at start-up: %s%s failed with %zu "
                       "bytes free of %zu (the start-up check saw %zu free for this rank's "
                       "plan of %lld bytes): another process took GPU memory since, or the "
                       "free memory is fragmented; free the GPU (nvidia-smi lists what uses "
                       "it) and run again, or use a smaller batch (-D batch=N) or more tp or "
                       "pp ranks", c->wrank, c->name, op, asked, free_b, total_b,
                       c->checked_free, (long long)c->planned);
}

#define ALLOC_CHECK(c, call, op, bytes)                                                     \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess)                                                                  \
      return alloc_failed((c), __LINE__, (op), (bytes), e_ == cudaErrorMemoryAllocation,    \
                          cudaGetErrorString(e_));                                          \
  } while (0)

/* cudaMalloc of `bytes` into *p (a typed pointer), checked as ALLOC_CHECK */
#define DEV_MALLOC(c, p, bytes, op) ALLOC_CHECK(c, cudaMalloc((void **)(p), (bytes)), op, (bytes))

/* The device buffers, streams, events and cuBLASLt handle of a rank that
 * passed the start-up checks.  A failure is reported as alloc_failed says;
 * rt_cuda_close frees what was made. */
static int alloc_device(RtCuda *c) {
  ALLOC_CHECK(c, cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking),
              "cudaStreamCreate", 0);
  ALLOC_CHECK(c, cudaStreamCreateWithFlags(&c->comm, cudaStreamNonBlocking), "cudaStreamCreate",
              0);
  ALLOC_CHECK(c, cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming), "cudaEventCreate",
              0);
  ALLOC_CHECK(c, cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming), "cudaEventCreate",
              0);
  /* (an empty buffer still gets 4 bytes: a valid pointer) */
  size_t pb = c->params_numel ? (size_t)c->params_numel * 4 : 4;
  size_t sb = c->state_numel ? (size_t)c->state_numel * 4 : 4;
  size_t ab = c->arena_bytes ? (size_t)c->arena_bytes : 64, tb = c->ntok ? (size_t)c->ntok * 4 : 4;
  DEV_MALLOC(c, &c->params, pb, "cudaMalloc(params)");
  DEV_MALLOC(c, &c->state, sb, "cudaMalloc(state)");
  DEV_MALLOC(c, &c->arena, ab, "cudaMalloc(arena)");
  DEV_MALLOC(c, &c->tokens, tb, "cudaMalloc(tokens)");
  DEV_MALLOC(c, &c->targets, tb, "cudaMalloc(targets)");
  DEV_MALLOC(c, &c->scalars, 16 * sizeof(float), "cudaMalloc(scalars)");
  DEV_MALLOC(c, &c->lt_ws, (size_t)RT_CUDA_GEMM_WORKSPACE, "cudaMalloc(GEMM workspace)");
  if (c->want_params_bf16)
    DEV_MALLOC(c, &c->params_bf16, (size_t)(c->params_numel ? c->params_numel : 8) * 2,
               "cudaMalloc(bf16 params)");
  for (int w = 0; w < WS_COUNT; w++)
    if (c->ws_plan[w]) {
      DEV_MALLOC(c, &c->ws[w], c->ws_plan[w],
                 w == WS_REDUCE    ? "cudaMalloc(all-reduce scratch)"
                 : w == WS_ATTN_DQ ? "cudaMalloc(attention dq partials)"
                                   : "cudaMalloc(GEMM operand workspace)");
      c->ws_bytes[w] = c->ws_plan[w];
    }
  cublasStatus_t st = cublasLtCreate(&c->lt);
  if (st != CUBLAS_STATUS_SUCCESS)
    return alloc_failed(c, __LINE__, "cublasLtCreate", 0, st == CUBLAS_STATUS_ALLOC_FAILED,
                        cublasLtGetStatusString(st));
  return RT_OK;
}

/* ---- open / close ---- */

int rt_cuda_open(RtCuda **out, const RtCudaSetup *s, const float *params, const float *state) {
  *out = NULL;
  RtCuda *c = (RtCuda *)calloc(1, sizeof *c);
  if (!c) return rt_fail("out of memory for the device context");
  pthread_mutex_init(&c->mu, NULL);
  c->model = s->model;
  int tp = s->tp > 0 ? s->tp : 1, dp = s->dp > 0 ? s->dp : 1, pp = s->pp > 0 ? s->pp : 1;
  int ep = s->ep > 0 ? s->ep : 1;
  int t = s->tp_rank, d = s->dp_rank, p = pp > 1 ? s->pp_rank : 0;
  if (dp % ep) {
    free(c);
    return rt_fail("rt_cuda_open: ep %d does not divide dp %d", ep, dp);
  }
  c->ranks = tp * dp * pp;
  c->wrank = t + tp * (d + dp * p);
  /* rt_comm_mesh's groups: size, this rank's place, the split's colour */
  RtComm *hg[RT_CUDA_NGROUPS] = {s->tp_group, s->dp_group, s->ep_group, s->ep_dp_group,
                                 s->pp_group};
  /* ep 1: ep_dp is dp (same members, same order); a trainer without experts
   * passes no ep_dp group, which the device-local backend would refuse */
  if (ep == 1 && !hg[RT_CUDA_EP_DP]) hg[RT_CUDA_EP_DP] = s->dp_group;
  int sz[RT_CUDA_NGROUPS] = {tp, dp, ep, dp / ep, pp};
  int rk[RT_CUDA_NGROUPS] = {t, d, d % ep, d / ep, p};
  int col[RT_CUDA_NGROUPS] = {d + dp * p, t + tp * p, t + tp * (d / ep + dp / ep * p),
                              t + tp * (d % ep + ep * p), t + tp * d};
  for (int g = 0; g < RT_CUDA_NGROUPS; g++)
    c->hgroup[g] = hg[g], c->gsize[g] = sz[g], c->grank[g] = rk[g], c->gcolor[g] = col[g];
  c->params_numel = s->params_numel;
  c->state_numel = s->state_numel;
  c->arena_bytes = s->arena_bytes;
  c->ntok = s->rows * s->seq;
  c->gemm = s->gemm;
  *out = c; /* from here on rt_cuda_close frees what was made */
  /* the start-up checks: the settings, the device, the memory; every rank
   * runs them all and the ranks agree on the verdict (rt_cuda_agree) before
   * anything is allocated or any NCCL call waits for a peer */
  int rc = rt_cuda_graph_parse(getenv("PARC_CUDA_GRAPH"), &c->graph_on);
  const char *g = getenv("PARC_CUDA_GEMM");
  if (rc == RT_OK && g && *g) {
    if (!strcmp(g, "fp32")) c->gemm = RT_CUDA_GEMM_FP32;
    else if (!strcmp(g, "bf16")) c->gemm = RT_CUDA_GEMM_BF16;
    else if (!strcmp(g, "tf32")) c->gemm = RT_CUDA_GEMM_TF32;
    else rc = rt_fail_setup("PARC_CUDA_GEMM='%s': expected fp32, bf16 or tf32", g);
  }
  for (int i = 0; rc == RT_OK && c->gemm != RT_CUDA_GEMM_BF16 && s->gemms && i < s->ngemms; i++)
    if (s->gemms[i].flags & (RT_CUDA_MM_A_BF16 | RT_CUDA_MM_B_BF16 | RT_CUDA_MM_C_BF16 |
                             RT_CUDA_MM_C_ROUND)) /* codegen/cuda_store.h */
      rc = rt_fail_setup("PARC_CUDA_GEMM=%s: this trainer's GEMMs read or write bf16 values "
                         "(precision bf16); run it in GEMM mode bf16, or generate it with "
                         "-D precision=fp32",
                         g && *g ? g : "?");
  if (rc == RT_OK) rc = choose_device(c, s);
  if (rc == RT_OK) rc = rt_cuda_tune_open(c); /* PARC_CUDA_GEMM_TUNE and its file */
  if (rc == RT_OK) { /* the GEMMs' operand workspaces, in the mode chosen (rt_cuda_ws_plan.h) */
    int64_t need[3];
    c->ws_planned = rt_cuda_gemms_ws(s->gemms, s->gemms ? s->ngemms : 0, c->gemm,
                                     rt_cuda_gemm_operands(), need);
    c->ws_plan[WS_BF16_A] = (size_t)need[0];
    c->ws_plan[WS_BF16_B] = (size_t)need[1];
    c->ws_plan[WS_GEMM_OUT] = (size_t)need[2];
    c->want_params_bf16 = s->params_bf16 != 0;
    if (c->want_params_bf16) c->ws_planned += 2 * (c->params_numel ? c->params_numel : 8);
    c->reduce_piece = s->reduce_piece > 0 ? s->reduce_piece : 0;
    c->ws_plan[WS_REDUCE] = (size_t)c->reduce_piece * 4;
    c->ws_planned += 4 * c->reduce_piece;
    c->ws_plan[WS_ATTN_DQ] = (size_t)(s->attn_dq_bytes > 0 ? s->attn_dq_bytes : 0);
    c->ws_planned += (int64_t)c->ws_plan[WS_ATTN_DQ];
  }
  rc = check_memory(c, rc);
  RtComm *world[3] = {c->hgroup[RT_CUDA_TP], c->hgroup[RT_CUDA_DP], c->hgroup[RT_CUDA_PP]};
  if ((rc = rt_cuda_agree(world, c->ranks, rc)) != RT_OK) return rc;
  /* the allocations, agreed like the checks: out of memory now (RT_ERR_SETUP) or
   * a CUDA failure (RT_ERR) on any rank stops every rank here, with its message */
  if ((rc = rt_cuda_agree(world, c->ranks, alloc_device(c))) != RT_OK) return rc;
  size_t pb = (size_t)c->params_numel * 4, sb = (size_t)c->state_numel * 4;
  if (params) CU_CHECK(c, cudaMemcpy(c->params, params, pb, cudaMemcpyHostToDevice), "upload params");
  else CU_CHECK(c, cudaMemset(c->params, 0, pb), "cudaMemset(params)");
  if (state) CU_CHECK(c, cudaMemcpy(c->state, state, sb, cudaMemcpyHostToDevice), "upload state");
  else CU_CHECK(c, cudaMemset(c->state, 0, sb), "cudaMemset(state)");
  /* the arena starts zeroed, as no planned value may rely on it: reproducible garbage */
  CU_CHECK(c, cudaMemset(c->arena, 0, (size_t)c->arena_bytes), "cudaMemset(arena)");
#ifdef PARC_HAVE_NCCL
  if (c->use_nccl && nccl_open(c)) return RT_ERR;
#endif
  if (c->local_dev && rt_cuda_local_open(c)) return RT_ERR;
  /* an explicit PARC_CUDA_LOCAL is confirmed by one line of world rank 0 */
  const char *loc = getenv("PARC_CUDA_LOCAL");
  if (loc && *loc && c->wrank == 0) fprintf(stderr, "parcrt_cuda: %s\n", c->desc);
  /* the params' bf16 copy of the uploaded params: a step whose optimizer
   * keeps it (codegen/cuda_store.h mirror_all) makes none of its own */
  if (c->params_bf16 && rt_cuda_params_to_bf16(c) != RT_OK) return RT_ERR;
  return rt_cuda_prof_open(c);
}

void rt_cuda_close(RtCuda *c) {
  if (!c) return;
  if (c->watchdog_on) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->watchdog, NULL);
  }
  if (c->compute) cudaStreamSynchronize(c->compute);
  if (c->comm) cudaStreamSynchronize(c->comm);
  rt_cuda_prof_close(c);
#ifdef PARC_HAVE_NCCL
  for (int g = 0; g < RT_CUDA_NGROUPS; g++)
    if (c->gcomm[g]) ncclCommDestroy(c->gcomm[g]);
  if (c->world_comm) ncclCommDestroy(c->world_comm);
  if (c->pending_ev) cudaEventDestroy(c->pending_ev);
#endif
  rt_cuda_local_close(c);
  rt_cuda_pipe_close(c);
  if (c->graph_exec) cudaGraphExecDestroy(c->graph_exec);
  rt_cuda_tune_close(c);
  for (int i = 0; i < RT_CUDA_GEMM_CACHE; i++) {
    GemmPlan *p = &c->plans[i];
    if (!p->used) continue;
    free(p->cand);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
  }
  if (c->lt) cublasLtDestroy(c->lt);
  for (int i = 0; i < WS_COUNT; i++) cudaFree(c->ws[i]);
  cudaFree(c->lt_ws);
  cudaFree(c->params);
  cudaFree(c->params_bf16);
  cudaFree(c->state);
  cudaFree(c->arena);
  cudaFree(c->tokens);
  cudaFree(c->targets);
  cudaFree(c->scalars);
  if (c->host_stage) cudaFreeHost(c->host_stage);
  if (c->pipe_host) cudaFreeHost(c->pipe_host);
  if (c->ready) cudaEventDestroy(c->ready);
  if (c->done) cudaEventDestroy(c->done);
  if (c->compute) cudaStreamDestroy(c->compute);
  if (c->comm) cudaStreamDestroy(c->comm);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* ---- steps ---- */

int rt_cuda_step_begin(RtCuda *c, const int32_t *tokens, const int32_t *targets, float lr,
                       float step) {
  if (c->prof) rt_prof_step_begin(c->prof);
  size_t tb = (size_t)c->ntok * sizeof(int32_t);
  float sc[2] = {lr, step};
  CU_CHECK(c, cudaMemcpyAsync(c->tokens, tokens, tb, cudaMemcpyHostToDevice, c->compute),
           "upload tokens");
  CU_CHECK(c, cudaMemcpyAsync(c->targets, targets, tb, cudaMemcpyHostToDevice, c->compute),
           "upload targets");
  CU_CHECK(c, cudaMemcpyAsync(c->scalars, sc, sizeof sc, cudaMemcpyHostToDevice, c->compute),
           "upload lr and step");
  /* pageable sources: the copies above have been staged when they return */
  return RT_OK;
}

int rt_cuda_step_end(RtCuda *c, const float *loss, const float *ce_loss, const float *grad_norm,
                     float *loss_out, float *ce_out, float *grad_norm_out) {
  const float *src[3] = {loss, ce_loss, grad_norm};
  float val[3] = {__builtin_nanf(""), __builtin_nanf(""), 0.0f};
  if (c->prof) rt_prof_step_end(c->prof);
  rt_cuda_tune_step_end(c); /* PARC_CUDA_GEMM_TUNE: what this step planned */
  for (int i = 0; i < 3; i++)
    if (src[i])
      CU_CHECK(c, cudaMemcpyAsync(&val[i], src[i], sizeof(float), cudaMemcpyDeviceToHost,
                                  c->compute), "read the step's results");
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "the step (an earlier kernel or copy failed)");
  if (c->prof) rt_prof_step_done(c->prof);
  *loss_out = val[0];
  *ce_out = ce_loss ? val[1] : val[0];
  *grad_norm_out = val[2];
  return RT_OK;
}

int rt_cuda_launched(RtCuda *c, const char *kernel) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return RT_OK;
  char op[160];
  snprintf(op, sizeof op, "launch of kernel %s", kernel);
  return rt_cuda_fail_at(c, __FILE__, __LINE__, op, cudaGetErrorString(e));
}

int rt_cuda_download(RtCuda *c, float *params, float *state) {
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "synchronise before download");
  if (params && c->params_numel)
    CU_CHECK(c, cudaMemcpy(params, c->params, (size_t)c->params_numel * 4, cudaMemcpyDeviceToHost),
             "download params");
  if (state && c->state_numel)
    CU_CHECK(c, cudaMemcpy(state, c->state, (size_t)c->state_numel * 4, cudaMemcpyDeviceToHost),
             "download state");
  return RT_OK;
}

int rt_cuda_to_host(RtCuda *c, float *dst, const float *src, int64_t n) {
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_HOST, 4.0 * (double)n, 0, "to_host");
  CU_CHECK(c, cudaMemcpyAsync(dst, src, (size_t)n * 4, cudaMemcpyDeviceToHost, c->compute),
           "copy to host");
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "copy to host");
  return RT_OK;
}

int rt_cuda_copy(RtCuda *c, float *dst, const float *src, int64_t n) {
  if (dst == src || n <= 0) return RT_OK;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_OP, 8.0 * (double)n, 0, "copy");
  CU_CHECK(c, cudaMemcpyAsync(dst, src, (size_t)n * 4, cudaMemcpyDeviceToDevice, c->compute),
           "device copy");
  return RT_OK;
}

/* ---- collectives ---- */

enum { /* rt_cuda_local.h's RT_CUDA_OP_ */
  OP_ALL_REDUCE = RT_CUDA_OP_ALL_REDUCE,
  OP_ALL_GATHER = RT_CUDA_OP_ALL_GATHER,
  OP_REDUCE_SCATTER = RT_CUDA_OP_REDUCE_SCATTER
};
static const char *const op_name[] = {"all_reduce", "all_gather", "reduce_scatter"};
const char *const rt_cuda_group_name[RT_CUDA_NGROUPS] = {"tp", "dp", "ep", "ep_dp", "pp"};
#define group_name rt_cuda_group_name

/* The host-staged (device-local) backend: exact, the CPU communicator's sums.
 * The device-local one (rt_cuda_local.cu, PARC_CUDA_LOCAL=device) gives the
 * same bits without leaving the device. */
static int host_collective(RtCuda *c, int op, int g, const float *send, float *recv,
                           int64_t count, const int64_t *counts_v) {
  int p = c->gsize[g];
  int64_t total = 0; /* with counts_v (unequal pieces): their sum */
  for (int r = 0; counts_v && r < p; r++) total += counts_v[r];
  int64_t whole = counts_v ? total : count * p, mine = counts_v ? counts_v[c->grank[g]] : count;
  int64_t in = op == OP_REDUCE_SCATTER ? whole : op == OP_ALL_GATHER ? mine : count;
  int64_t outn = op == OP_ALL_GATHER ? whole : op == OP_REDUCE_SCATTER ? mine : count;
  size_t floats = (size_t)(in + outn + 1) / 2 * 2; /* the counts after them, 8-aligned */
  float *h = (float *)rt_cuda_host_stage(c, floats * 4 + (size_t)p * 8);
  if (!h) return RT_ERR;
  float *hout = h + in;
  int64_t *counts = (int64_t *)(h + floats);
  for (int r = 0; r < p; r++) counts[r] = counts_v ? counts_v[r] : count;
  CU_CHECK(c, cudaMemcpyAsync(h, send, (size_t)in * 4, cudaMemcpyDeviceToHost, c->compute),
           "stage a collective");
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "stage a collective");
  RtComm *hg = c->hgroup[g];
  int rc = op == OP_ALL_REDUCE    ? rt_comm_all_reduce(hg, h, hout, count)
           : op == OP_ALL_GATHER ? rt_comm_all_gather(hg, h, hout, counts)
                                 : rt_comm_reduce_scatter(hg, h, hout, counts);
  if (rc) return RT_ERR;
  CU_CHECK(c, cudaMemcpyAsync(recv, hout, (size_t)outn * 4, cudaMemcpyHostToDevice, c->compute),
           "unstage a collective");
  /* the host buffer is reused by the next call: the copy must be done */
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "unstage a collective");
  return RT_OK;
}

#ifdef PARC_HAVE_NCCL
int rt_cuda_watch(RtCuda *c, cudaStream_t st, const char *what) {
  pthread_mutex_lock(&c->mu); /* the watchdog's view: this one is the latest */
  cudaError_t e = cudaEventRecord(c->pending_ev, st);
  c->pending = e == cudaSuccess;
  c->pending_since = now_s();
  snprintf(c->pending_what, sizeof c->pending_what, "%s", what);
  pthread_mutex_unlock(&c->mu);
  CU_CHECK(c, e, what);
  return RT_OK;
}
#endif

#ifdef PARC_HAVE_NCCL
/* An NCCL collective runs on the comm stream after the compute stream's work
 * so far (nccl_enter) and the compute stream's later work after it, watched
 * (nccl_leave). */
static int nccl_enter(RtCuda *c, const char *what) {
  CU_CHECK(c, cudaEventRecord(c->ready, c->compute), what);
  CU_CHECK(c, cudaStreamWaitEvent(c->comm, c->ready, 0), what);
  return RT_OK;
}
static int nccl_leave(RtCuda *c, const char *what) {
  CU_CHECK(c, cudaEventRecord(c->done, c->comm), what);
  CU_CHECK(c, cudaStreamWaitEvent(c->compute, c->done, 0), what);
  return rt_cuda_watch(c, c->comm, what);
}
#endif

static int collective(RtCuda *c, int op, int g, const float *send, float *recv, int64_t count) {
  if (count <= 0) return RT_OK;
  RtProfScope ps(c); /* the larger side: the result of a gather, the input of a scatter */
  if (ps.on())
    ps.set(RT_PROF_COMM, 4.0 * (double)count * (op == OP_ALL_REDUCE ? 1 : c->gsize[g]), 0,
           "%s %s", op_name[op], group_name[g]);
  if (c->gsize[g] == 1) return rt_cuda_copy(c, recv, send, count);
  if (!c->use_nccl) {
    if (!c->hgroup[g]) return rt_fail("rank %d: %s over group %s: no host group", c->wrank,
                                      op_name[op], group_name[g]);
    return c->local_dev ? rt_cuda_local_collective(c, op, g, send, recv, count)
                        : host_collective(c, op, g, send, recv, count, NULL);
  }
#ifdef PARC_HAVE_NCCL
  char what[160];
  snprintf(what, sizeof what, "%s of %lld floats over group %s (%d ranks)", op_name[op],
           (long long)count, group_name[g], c->gsize[g]);
  if (nccl_enter(c, what)) return RT_ERR;
  ncclComm_t nc = c->gcomm[g];
  size_t n = (size_t)count;
  if (op == OP_ALL_REDUCE)
    NC_CHECK(c, ncclAllReduce(send, recv, n, ncclFloat, ncclSum, nc, c->comm), what);
  else if (op == OP_ALL_GATHER)
    NC_CHECK(c, ncclAllGather(send, recv, n, ncclFloat, nc, c->comm), what);
  else
    NC_CHECK(c, ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, nc, c->comm), what);
  return nccl_leave(c, what);
#else
  return rt_fail("rank %d: built without NCCL", c->wrank);
#endif
}

int rt_cuda_all_reduce(RtCuda *c, int group, const float *send, float *recv, int64_t count) {
  return collective(c, OP_ALL_REDUCE, group, send, recv, count);
}

int rt_cuda_all_reduce_bf16(RtCuda *c, int group, const float *send, float *recv,
                            int64_t count, int round) {
  if (count <= 0) return RT_OK;
  const int p = c->gsize[group], me = c->grank[group];
  const int64_t piece = count / p;
  if (count % (2 * p))
    return rt_fail("rank %d: all_reduce_bf16 of %lld floats over group %s (%d ranks): the "
                   "count does not split into even pieces, one a member", c->wrank,
                   (long long)count, group_name[group], p);
  if (piece > c->reduce_piece)
    return rt_fail("rank %d: all_reduce_bf16 of %lld floats over group %s (%d ranks): a piece "
                   "of %lld floats, past the scratch the setup planned (RtCudaSetup.reduce_piece "
                   "%lld)", c->wrank, (long long)count, group_name[group], p, (long long)piece,
                   (long long)c->reduce_piece);
  RtProfScope ps(c); /* one op: its collectives and pass inside it */
  if (ps.on())
    ps.set(RT_PROF_COMM, 4.0 * (double)count, 0, "all_reduce_bf16 %s", group_name[group]);
  if (round) { /* f32 values: the piece reduced, rounded and gathered in place */
    float *mine = recv + (int64_t)me * piece;
    if (collective(c, OP_REDUCE_SCATTER, group, send, mine, piece) ||
        rt_cuda_round_bf16(c, mine, piece))
      return RT_ERR;
    return p > 1 ? collective(c, OP_ALL_GATHER, group, mine, recv, piece) : RT_OK;
  }
  float *sum = (float *)rt_cuda_ws(c, WS_REDUCE, (size_t)piece * 4);
  uint16_t *mine = (uint16_t *)recv + (int64_t)me * piece; /* bf16, 4-byte aligned */
  if (!sum || collective(c, OP_REDUCE_SCATTER, group, send, sum, piece) ||
      rt_cuda_to_bf16(c, mine, sum, piece))
    return RT_ERR;
  /* (the pieces travel as floats: two bf16 elements each) */
  return p > 1 ? collective(c, OP_ALL_GATHER, group, (const float *)mine, recv, piece / 2)
               : RT_OK;
}

int rt_cuda_all_gather(RtCuda *c, int group, const float *send, float *recv, int64_t count) {
  return collective(c, OP_ALL_GATHER, group, send, recv, count);
}

int rt_cuda_reduce_scatter(RtCuda *c, int group, const float *send, float *recv, int64_t count) {
  return collective(c, OP_REDUCE_SCATTER, group, send, recv, count);
}

/* Unequal pieces (ZeRO-1's buckets, rt_cuda.h): NCCL's reduce-scatter and
 * all-gather take equal counts, so the pieces go as one grouped reduce (or
 * broadcast) per member, rooted at the member the piece belongs to: the same
 * bytes on the wire as a ring reduce-scatter (all-gather).  Without NCCL,
 * staged through the host communicator (also under PARC_CUDA_LOCAL=device:
 * its kernels take equal pieces). */
static int collective_v(RtCuda *c, int op, int g, const float *send, float *recv,
                        const int64_t *counts) {
  int p = c->gsize[g];
  int64_t total = 0;
  for (int r = 0; r < p; r++) total += counts[r];
  if (total <= 0) return RT_OK;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_COMM, 4.0 * (double)total, 0, "%s_v %s", op_name[op], group_name[g]);
  if (p == 1) return rt_cuda_copy(c, recv, send, counts[0]);
  if (!c->use_nccl) {
    if (!c->hgroup[g]) return rt_fail("rank %d: %s over group %s: no host group", c->wrank,
                                      op_name[op], group_name[g]);
    return host_collective(c, op, g, send, recv, 0, counts);
  }
#ifdef PARC_HAVE_NCCL
  char what[160];
  snprintf(what, sizeof what, "%s of %lld floats in unequal pieces over group %s (%d ranks)",
           op_name[op], (long long)total, group_name[g], p);
  if (nccl_enter(c, what)) return RT_ERR;
  ncclComm_t nc = c->gcomm[g];
  const int me = c->grank[g];
  NC_CHECK(c, ncclGroupStart(), what);
  int64_t at = 0;
  for (int r = 0; r < p; at += counts[r++]) {
    if (!counts[r]) continue;
    size_t n = (size_t)counts[r];
    if (op == OP_REDUCE_SCATTER) /* send + at: member r's piece; the root's result into recv */
      NC_CHECK(c, ncclReduce(send + at, r == me ? recv : (float *)(send + at), n, ncclFloat,
                             ncclSum, r, nc, c->comm), what);
    else /* member r's piece (its send) into recv + at on every member */
      NC_CHECK(c, ncclBroadcast(r == me ? send : recv + at, recv + at, n, ncclFloat, r, nc,
                                c->comm), what);
  }
  NC_CHECK(c, ncclGroupEnd(), what);
  return nccl_leave(c, what);
#else
  return rt_fail("rank %d: built without NCCL", c->wrank);
#endif
}

int rt_cuda_reduce_scatter_v(RtCuda *c, int group, const float *send, float *recv,
                             const int64_t *counts) {
  return collective_v(c, OP_REDUCE_SCATTER, group, send, recv, counts);
}

int rt_cuda_all_gather_v(RtCuda *c, int group, const float *send, float *recv,
                         const int64_t *counts) {
  return collective_v(c, OP_ALL_GATHER, group, send, recv, counts);
}

/* [outer, n, inner] pieces: member r's piece is columns [r q, (r + 1) q) of the
 * middle dimension, q = n / parts.  A 2-D copy per member moves it between the
 * strided whole and a contiguous block. */
static int dim_check(RtCuda *c, const char *op, int64_t n, int parts) {
  if (parts < 1 || n % parts)
    return rt_fail("rank %d: %s: dimension %lld does not split over %d members", c->wrank, op,
                   (long long)n, parts);
  return RT_OK;
}

static int copy_piece(RtCuda *c, float *dst, size_t dpitch, const float *src, size_t spitch,
                      size_t width, int64_t rows) {
  CU_CHECK(c, cudaMemcpy2DAsync(dst, dpitch * 4, src, spitch * 4, width * 4, (size_t)rows,
                                cudaMemcpyDeviceToDevice, c->compute), "strided piece copy");
  return RT_OK;
}

int rt_cuda_all_gather_dim(RtCuda *c, int group, const float *x, float *out, int64_t outer,
                           int64_t n, int64_t inner) {
  int parts = c->gsize[group];
  if (dim_check(c, "all_gather_dim", n, parts)) return RT_ERR;
  int64_t q = n / parts, piece = outer * q * inner;
  RtProfScope ps(c);
  if (ps.on())
    ps.set(RT_PROF_COMM, 4.0 * (double)(piece * parts), 0, "all_gather_dim %s",
           group_name[group]);
  if (outer == 1) return rt_cuda_all_gather(c, group, x, out, piece);
  float *st = (float *)rt_cuda_ws(c, WS_STAGE, (size_t)(piece * parts) * 4);
  if (!st) return RT_ERR;
  if (rt_cuda_all_gather(c, group, x, st, piece)) return RT_ERR;
  for (int r = 0; r < parts; r++)
    if (copy_piece(c, out + r * q * inner, (size_t)(n * inner), st + r * piece,
                   (size_t)(q * inner), (size_t)(q * inner), outer))
      return RT_ERR;
  return RT_OK;
}

int rt_cuda_reduce_scatter_dim(RtCuda *c, int group, const float *x, float *out, int64_t outer,
                               int64_t n, int64_t inner) {
  int parts = c->gsize[group];
  if (dim_check(c, "reduce_scatter_dim", n, parts)) return RT_ERR;
  int64_t q = n / parts, piece = outer * q * inner;
  RtProfScope ps(c);
  if (ps.on())
    ps.set(RT_PROF_COMM, 4.0 * (double)(piece * parts), 0, "reduce_scatter_dim %s",
           group_name[group]);
  if (outer == 1) return rt_cuda_reduce_scatter(c, group, x, out, piece);
  float *st = (float *)rt_cuda_ws(c, WS_STAGE, (size_t)(piece * parts) * 4);
  if (!st) return RT_ERR;
  for (int r = 0; r < parts; r++)
    if (copy_piece(c, st + r * piece, (size_t)(q * inner), x + r * q * inner, (size_t)(n * inner),
                   (size_t)(q * inner), outer))
      return RT_ERR;
  return rt_cuda_reduce_scatter(c, group, st, out, piece);
}

int rt_cuda_local_slice(RtCuda *c, float *out, const float *x, int64_t outer, int64_t n,
                        int64_t inner, int part, int parts) {
  if (dim_check(c, "local_slice", n, parts)) return RT_ERR;
  if (part < 0 || part >= parts)
    return rt_fail("rank %d: local_slice: member %d of %d", c->wrank, part, parts);
  int64_t q = n / parts;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_OP, 8.0 * (double)(outer * q * inner), 0, "local_slice");
  return copy_piece(c, out, (size_t)(q * inner), x + part * q * inner, (size_t)(n * inner),
                    (size_t)(q * inner), outer);
}

int rt_cuda_flat_piece(RtCuda *c, int group, const float *x, int64_t n, float *out, int64_t s) {
  int64_t lo = (int64_t)c->grank[group] * s;
  int64_t have = n - lo < 0 ? 0 : n - lo > s ? s : n - lo;
  RtProfScope ps(c);
  if (ps.on()) ps.set(RT_PROF_OP, 4.0 * (double)(have + s), 0, "flat_piece");
  if (have > 0 && rt_cuda_copy(c, out, x + lo, have)) return RT_ERR;
  if (have < s)
    CU_CHECK(c, cudaMemsetAsync(out + have, 0, (size_t)(s - have) * 4, c->compute),
             "flat_piece padding");
  return RT_OK;
}
