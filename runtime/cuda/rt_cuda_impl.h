/* runtime/cuda/rt_cuda_impl.h -- shared by the .cu files of libparcrt_cuda;
 * not a public header (CUDA C++ only). */
#ifndef PARC_RT_CUDA_IMPL_H
#define PARC_RT_CUDA_IMPL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include <stdarg.h>
#include <stdio.h>

#include "runtime/cuda/rt_cuda.h"
#include "runtime/cuda/rt_cuda_prof.h"
extern "C" { /* the runtime's C headers */
#include "runtime/rt_err.h"
}

#ifdef PARC_HAVE_NCCL
#include <nccl.h>
#endif

/* Workspace slots: each a device buffer grown on demand (see rt_cuda.h). */
enum {
  WS_ATTN,       /* attention statistics: lse and D, 2 floats per query row */
  WS_ROWS,       /* cross-entropy: per-row losses, maxima, sums */
  WS_GATHER,     /* vocab cross-entropy: the group's gathered statistics */
  WS_SORT,       /* embedding_grad: sorted ids and positions, cub scratch */
  WS_STAGE,      /* collectives: contiguous pieces of strided tensors */
  WS_SCALARS,    /* rt_cuda_sum_scalars: the floats gathered into one vector */
  WS_BF16_A,     /* bf16 GEMMs: our a (activations) rounded to bf16 */
  WS_BF16_B,     /* bf16 GEMMs: our b (weights, or the other activation) rounded to bf16 */
  WS_GEMM_OUT,   /* bf16 GEMMs: a result with rows padded to 16 bytes */
  WS_LOCAL,      /* device-local collectives: an in-place result before it is copied */
  WS_REDUCE,     /* rt_cuda_all_reduce_bf16: a piece's f32 sum (RtCudaSetup.reduce_piece) */
  WS_ATTN_DQ,    /* the fused attention backward's dq partials (RtCudaSetup.attn_dq_bytes) */
  WS_BGRAD,      /* a stage program's bias gradient term (rt_cuda_bgrad_ws) */
  WS_COUNT
};

#define RT_CUDA_GEMM_CACHE 128
#define RT_CUDA_TUNE_ALGOS 8 /* cuBLASLt's candidates a plan times (PARC_CUDA_GEMM_TUNE) */

typedef struct {
  int used;
  int64_t batch, m, k, n;
  int flags, ta, mode;
  int bf16ops;               /* operands converted to bf16 (see rt_cuda_gemm.cu) */
  int64_t ld[3];             /* row lengths cuBLASLt sees for a, b, out (elements) */
  int al[3];                 /* alignment of a, b, out (bytes, <= 256) */
  int want_epi, al_bias, al_aux; /* the epilogue asked for (GEMM_EPI_*, rt_cuda_gemm.cu), its
                                     vector's and its aux matrix's alignment (0: none): part
                                     of the key */
  int epi;                   /* the plan has it; else the caller sums, adds the bias or
                                applies gelu (or its gradient) */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
  int tune;                  /* PARC_CUDA_GEMM_TUNE: candidates to time at the next call outside
                                a graph capture (0: none; then algo is final) */
  cublasLtMatmulAlgo_t *cand; /* they, in the heuristic's order (malloc'd until timed) */
} GemmPlan;

typedef struct RtGemmTune RtGemmTune; /* rt_cuda_gemm_tune.cu */

struct RtCuda {
  int device, wrank, ranks;
  char name[128];            /* "GPU 0 (NVIDIA H200)" */
  char desc[256];
  const char *model;
  float *params, *state, *scalars;
  void *params_bf16;         /* the params' bf16 copy (RtCudaSetup.params_bf16), or NULL */
  int want_params_bf16;
  int64_t reduce_piece;      /* RtCudaSetup.reduce_piece */
  char *arena;
  int32_t *tokens, *targets;
  int64_t params_numel, state_numel, arena_bytes, ntok;
  cudaStream_t compute, comm;
  cudaEvent_t ready, done;   /* compute -> comm, comm -> compute */
  cublasLtHandle_t lt;
  void *lt_ws;
  int gemm;
  GemmPlan plans[RT_CUDA_GEMM_CACHE];
  RtGemmTune *tune;          /* PARC_CUDA_GEMM_TUNE's table; NULL: off */
  void *ws[WS_COUNT];
  size_t ws_bytes[WS_COUNT];
  size_t ws_plan[WS_COUNT];  /* planned bytes (rt_cuda_ws_plan.h; 0: grows on demand) */
  int64_t ws_planned;        /* their sum */
  int64_t planned;           /* the start-up memory check: this rank's planned bytes */
  size_t checked_free;       /* and its GPU's free bytes then (out-of-memory messages) */
  /* host staging (routing ops, the host collective backend) */
  void *host_stage;
  size_t host_stage_bytes;
  /* collectives */
  RtComm *hgroup[RT_CUDA_NGROUPS]; /* the harness's groups (NULL: size 1) */
  int grank[RT_CUDA_NGROUPS], gsize[RT_CUDA_NGROUPS];
  int gcolor[RT_CUDA_NGROUPS];     /* rt_comm_mesh's split: colour, key = grank */
  int use_nccl;
  int local_dev;             /* not NCCL: 1 device-local collectives (rt_cuda_local.cu),
                                0 host-staged (PARC_CUDA_LOCAL) */
  cudaEvent_t lready[RT_CUDA_NGROUPS], ldone[RT_CUDA_NGROUPS]; /* device-local, per group
                                of 2 or more: this rank's send is ready / read by it */
  void *ldesc;               /* device-local: the members' descriptors of a collective */
  int64_t *lcounts;          /* device-local: the descriptors' sizes, for rt_comm_all_gather */
#ifdef PARC_HAVE_NCCL
  ncclComm_t world_comm, gcomm[RT_CUDA_NGROUPS]; /* NULL where the group has one member */
#endif
  /* pipelined steps (rt_cuda_pipe.cu) */
  float *pipe_host;          /* pinned: [0] grad norm, [2 + 2k], [3 + 2k] microbatch k's
                                loss and cross-entropy, read when the step ends */
  int pipe_host_n, pipe_nloss, pipe_norm;
  const RtPipeDesc *pipe_desc; /* the desc pipe_p2p was decided for */
  int pipe_p2p;              /* 1: boundary values over NCCL send/recv; 0: host-staged */
  /* NCCL's transfers run on p2p (made with the first such step): after the
   * compute stream's work so far (p2p_ready); slot_ev[k], recorded after those
   * touching slot k, which the compute stream waits for before it next runs
   * on slot k (slot_wait[k]); p2p_done, joined before the step's collectives */
  cudaStream_t p2p;
  cudaEvent_t p2p_ready, p2p_done, *slot_ev;
  unsigned char *slot_wait;
  int nslot_ev, p2p_used;
  int p2p_off;               /* PARC_CUDA_PIPE_STREAM=0: NCCL's transfers on compute */
  /* watchdog: the last collective enqueued */
  pthread_t watchdog;
  int watchdog_on;
  pthread_mutex_t mu;
  int pending, stop;
  double pending_since;
  cudaEvent_t pending_ev;
  char pending_what[160];
  /* the profile (PARC_CUDA_PROFILE; rt_cuda_prof.cu): NULL when off */
  RtProf *prof;
  cudaEvent_t *prof_ev;      /* its events, on the compute stream */
  int prof_nev, prof_cap;
  /* the step as a CUDA graph (PARC_CUDA_GRAPH; rt_cuda_graph.h, rt_cuda_graph.cu) */
  int graph_on;              /* RT_GRAPH_ON or _AUTO: switched on and not refused */
  int graph_checked;         /* the blockers were looked at (the first step) */
  int graph_capturing;       /* inside the capture: nothing may allocate or wait */
  int64_t graph_steps;       /* steps run through rt_cuda_graph_step */
  cudaGraphExec_t graph_exec; /* the captured step; NULL before the capture */
};

/* Records "FILE:LINE: rank R: op: what" and returns RT_ERR. */
int rt_cuda_fail_at(const RtCuda *c, const char *file, int line, const char *op, const char *what);

#define CU_CHECK(c, call, op)                                                              \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) return rt_cuda_fail_at((c), __FILE__, __LINE__, (op),            \
                                                  cudaGetErrorString(e_));                  \
  } while (0)
#define LT_CHECK(c, call, op)                                                              \
  do {                                                                                      \
    cublasStatus_t e_ = (call);                                                             \
    if (e_ != CUBLAS_STATUS_SUCCESS)                                                        \
      return rt_cuda_fail_at((c), __FILE__, __LINE__, (op), cublasLtGetStatusString(e_));     \
  } while (0)
#ifdef PARC_HAVE_NCCL
#define NC_CHECK(c, call, op)                                                              \
  do {                                                                                      \
    ncclResult_t e_ = (call);                                                               \
    if (e_ != ncclSuccess) return rt_cuda_fail_at((c), __FILE__, __LINE__, (op),            \
                                                  ncclGetErrorString(e_));                  \
  } while (0)
#endif
#ifdef PARC_HAVE_NCCL
/* After NCCL work enqueued on stream st: the watchdog watches it (the latest). */
int rt_cuda_watch(RtCuda *c, cudaStream_t st, const char *what);
#endif
/* After a kernel launch. */
#define LAUNCH_CHECK(c, op) CU_CHECK(c, cudaGetLastError(), op)

/* Blocks of `threads` for n items, capped for grid-stride loops. */
static inline unsigned rt_cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

/* Workspace slot `slot` of at least `bytes` (contents undefined); NULL with
 * the error recorded on failure.  Growing synchronises the device. */
void *rt_cuda_ws(RtCuda *c, int slot, size_t bytes);
/* PARC_CUDA_GEMM_OPERANDS as RT_CUDA_OPERANDS_* (rt_cuda_gemm.cu; read once) */
int rt_cuda_gemm_operands(void);
/* Host staging buffer of at least `bytes`; NULL with the error recorded. */
void *rt_cuda_host_stage(RtCuda *c, size_t bytes);

extern const char *const rt_cuda_group_name[RT_CUDA_NGROUPS]; /* "tp", "dp", ... */

/* The tensor-core attention with the score tiles in registers
 * (rt_cuda_attn_mma.cu; arguments checked by rt_cuda_attn.cu): the bf16 mode's
 * default kernels, and the only ones that read and write bf16 tensors (io:
 * RT_CUDA_ATTN_* flags).  rt_cuda_attn_mma (rt_cuda_attn_tc.cu): whether
 * rt_cuda_sdpa and rt_cuda_sdpa_grad take them for this shape. */
int rt_cuda_sdpa_mma(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                     const float *v, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                     float scale, int causal, unsigned io);
int rt_cuda_sdpa_grad_mma(RtCuda *c, float *dqkv, const float *q, const float *k, const float *v,
                          const float *dy, const float *lse, const float *d, int64_t B,
                          int64_t H, int64_t KV, int64_t T, int64_t hd, float scale, int causal,
                          unsigned io);
int rt_cuda_attn_mma(RtCuda *c, int64_t T, int64_t hd);
/* Whether PARC_CUDA_ATTN is `want` (rt_cuda_attn_tc.cu: "fp32", "wmma", "mma4";
 * read at each call, as the checks set it between calls) */
bool rt_cuda_attn_env(const char *want);

/* rt_cuda_gemm.cu: x[0, n) rounded to bf16 (to nearest even) into y[0, n)
 * (y 4-byte aligned), and in place as f32 values; on the compute stream. */
int rt_cuda_to_bf16(RtCuda *c, void *y, const float *x, int64_t n);
int rt_cuda_round_bf16(RtCuda *c, float *x, int64_t n);

/* The device-local collectives (rt_cuda_local.cu; PARC_CUDA_LOCAL=device):
 * open makes the per-group events (RT_OK, or RT_ERR with the error recorded),
 * close frees them; a collective is op RT_CUDA_OP_* (rt_cuda_local.h) over
 * group g of two or more members, count > 0 as rt_cuda_all_reduce etc. */
int rt_cuda_local_open(RtCuda *c);
void rt_cuda_local_close(RtCuda *c);
int rt_cuda_local_collective(RtCuda *c, int op, int g, const float *send, float *recv,
                             int64_t count);
/* A pipeline transfer over pp on the device-local backend: rt_comm_send's
 * buffered semantics (send: x may change once it returns) on device values;
 * n > 0 floats, the same on both sides. */
int rt_cuda_local_p2p(RtCuda *c, int send, float *x, int64_t n, int peer, int tag);

/* GEMM tuning (rt_cuda_gemm_tune.cu, PARC_CUDA_GEMM_TUNE).  open: reads the
 * setting and its file (RT_OK; RT_ERR_SETUP for a bad value); step_end: at
 * the end of a step that planned GEMMs, one summary line (world rank 0);
 * close: frees.
 * rt_cuda_tune_plan: a new plan p with cuBLASLt's found heuristic results
 * res: the algorithm the file names for it where that is one of them, else
 * (unpipelined) p->tune, p->cand armed to time them.  rt_cuda_tune_time: at
 * the plan's first call (A, B, C: cuBLASLt's operands, C also the result),
 * the candidates timed, p->algo the fastest, p->tune 0, the choice appended
 * to the file (RT_ERR with the error recorded if the device fails). */
int rt_cuda_tune_open(RtCuda *c);
void rt_cuda_tune_step_end(RtCuda *c);
void rt_cuda_tune_close(RtCuda *c);
void rt_cuda_tune_plan(RtCuda *c, GemmPlan *p, const cublasLtMatmulHeuristicResult_t *res,
                       int found);
int rt_cuda_tune_time(RtCuda *c, GemmPlan *p, const void *A, const void *B, const void *C,
                      float beta);

/* rt_cuda_pipe.cu: frees the NCCL transfers' stream and events (RtCuda.p2p). */
void rt_cuda_pipe_close(RtCuda *c);

/* PARC_CUDA_GRAPH (rt_cuda_graph.cu): at a step's start, whether anything
 * keeps the run's steps out of a graph; the first call looks (pipelined:
 * rt_cuda_pipe_step's, host_ops: the step's host-staged ops) and, when
 * something does, world rank 0 prints one notice line and graph_on drops. */
void rt_cuda_graph_check(RtCuda *c, int pipelined, int host_ops);

/* The profile (rt_cuda_prof.cu): made at the end of rt_cuda_open when
 * PARC_CUDA_PROFILE asks for it (0, or -1 with the error recorded), and its
 * events destroyed by rt_cuda_close (the totals stay for the exit report). */
int rt_cuda_prof_open(RtCuda *c);
void rt_cuda_prof_close(RtCuda *c);

/* A runtime op's profile record: events around it when the step records
 * (rt_cuda_prof.h), nested ops counting as their outermost one.  Off, it
 * costs one branch:
 *     RtProfScope ps(c);
 *     if (ps.on()) ps.set(RT_PROF_OP, bytes, flops, "name %d", ...);
 *     return the_work(...);    // the end event is recorded after it */
struct RtProfScope {
  RtProf *p;
  int rec, kind;
  double bytes, flops;
  char name[RT_PROF_NAME];
  explicit RtProfScope(RtCuda *c) : p(c->prof && c->prof->on ? c->prof : NULL), rec(0) {
    if (p) {
      kind = RT_PROF_OP, bytes = flops = 0, name[0] = 0;
      rec = rt_prof_begin(p);
    }
  }
  bool on() const { return rec != 0; }
  void set(int k, double b, double f, const char *fmt, ...) __attribute__((format(printf, 5, 6))) {
    kind = k, bytes = b, flops = f;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
  }
  ~RtProfScope() {
    if (p) rt_prof_end(p, kind, bytes, flops, name);
  }
  RtProfScope(const RtProfScope &) = delete;
  RtProfScope &operator=(const RtProfScope &) = delete;
};

#endif
