/* runtime/cuda/rt_cuda_prof.h -- the GPU trainer's per-kernel profile
 * (PARC_CUDA_PROFILE): recording, aggregation, the table and the JSON lines.
 *
 * Plain C without CUDA: the device side (rt_cuda_prof.cu) gives the events
 * through RtProfEvents (cudaEventRecord on the compute stream,
 * cudaEventElapsedTime); tests/cuda/cu_prof.c gives fake ones.
 *
 * Switch: PARC_CUDA_PROFILE unset, "" or "0": off (RtCuda.prof is NULL; a
 * generated kernel costs one branch on a local flag, a runtime op one on
 * that pointer).  Any other value: on, and the table is printed at exit;
 * a value ending in .json or .jsonl also names the file the JSON lines are
 * written to (rt_prof_config).
 *
 * What is recorded.  A step has a start and an end event (rt_prof_step_begin,
 * rt_prof_step_end); every op of the step, a generated kernel or a runtime
 * call (GEMM, attention, embedding, cross-entropy, copies, collectives,
 * pipeline transfers), is bracketed by an event before and one after it on
 * the compute stream (rt_prof_begin, rt_prof_end).  The stream is serial, so
 * the difference is the op's time, a collective's included (the compute
 * stream waits for it).  Ops nest (a runtime op calling another): only the
 * outermost records.  The first step is the warm-up (plans, workspace,
 * cuBLASLt heuristics): it only counts its ops, so that every event the
 * later steps need is made before them; every later step records.  After the
 * host has waited for the step (rt_prof_step_done) the events are read and
 * each op's time, call, bytes and FLOPs go to its name's entry.
 *
 * Bytes and FLOPs are the caller's model of the op (rt_cuda.h and
 * codegen/host_cuda.c say which): bytes the compulsory traffic (each input
 * read once, each output written once), FLOPs the model's (2 m n k per GEMM;
 * attention 4 B H pairs hd forward, 2.5 times that backward, pairs = T^2, or
 * T (T + 1) / 2 causal).  GB/s = bytes / time, TFLOP/s = FLOPs / time.
 *
 * The table (rt_prof_table), one per rank, sorted by total time:
 *   ms/step  %step  calls/step  GB/s  TFLOP/s  kind  name
 * %step is against the step's device time (its start to end events); the
 * last line is the time outside every op (uploads, host waits, launch gaps).
 * The JSON lines (rt_prof_jsonl): one {"profile": "step", ...} line per rank
 * then one {"profile": "op", ...} line per entry, in table order; the
 * "ceiling" field says which peak a row is measured against (hbm: bytes;
 * tensor, fp32: FLOPs; none).  tests/gpu/compare.py profile reads them. */
#ifndef PARC_RT_CUDA_PROF_H
#define PARC_RT_CUDA_PROF_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Kinds of op, and the ceiling each is measured against. */
enum {
  RT_PROF_KERNEL,    /* a generated fused kernel: bytes, hbm */
  RT_PROF_GEMM,      /* cuBLASLt on tensor cores (bf16, tf32 products): FLOPs, tensor */
  RT_PROF_GEMM_FP32, /* cuBLASLt in fp32 (CUDA cores): FLOPs, fp32 */
  RT_PROF_ATTENTION, /* the flash kernels (fp32, CUDA cores): FLOPs, fp32 */
  RT_PROF_OP,        /* a runtime memory op (embedding, cross-entropy, copies): bytes, hbm */
  RT_PROF_COMM,      /* a collective or pipeline transfer: payload bytes, no ceiling */
  RT_PROF_HOST,      /* staged through the host (routing, --save-grads): no ceiling */
  RT_PROF_ATTENTION_TC, /* the flash kernels on tensor cores (bf16 products): FLOPs, tensor */
  RT_PROF_NKINDS
};
extern const char *const rt_prof_kind_name[RT_PROF_NKINDS];    /* "kernel", "gemm", ... */
extern const char *const rt_prof_ceiling_name[RT_PROF_NKINDS]; /* "hbm", "tensor", ... */

#define RT_PROF_NAME 72 /* longest name kept, with its NUL */

/* The event source.  Each returns NULL, or a message saying why it failed
 * (the profile then stops and says so; training goes on). */
typedef struct {
  void *ctx;
  const char *(*reserve)(void *ctx, int n);      /* events 0 .. n-1 exist */
  const char *(*record)(void *ctx, int ev);      /* event ev at this point of the stream */
  const char *(*elapsed)(void *ctx, int a, int b, double *ms); /* from a to b, both done */
  double (*wall_ms)(void *ctx);                  /* the host's clock */
} RtProfEvents;

typedef struct {
  char name[RT_PROF_NAME];
  int kind;
  int64_t calls;
  double ms, bytes, flops; /* totals over the recorded steps */
} RtProfEntry;

typedef struct {
  int entry, ev;           /* events ev (before) and ev + 1 (after) */
  double bytes, flops, ms;
} RtProfRec;

typedef struct RtProf {
  int on;                  /* begin/end do anything: the step counts or records */
  int warm;                /* this step is the warm-up: count the ops only */
  int depth;               /* open begin/end pairs */
  int open_ev;             /* the outermost open record's first event, or -1 */
  int warm_ops;            /* ops the warm-up counted */
  int nev;                 /* events this step used (0, 1: the step's own) */
  int ended;               /* rt_prof_step_end recorded this step's end */
  int64_t begun, steps;    /* steps begun; steps recorded */
  double step_ms, wall_ms, wall0;
  RtProfEntry *e;
  int ne, cap_e;
  int *hash;               /* open addressing: entry index + 1, 0 empty */
  int cap_hash;
  RtProfRec *rec;          /* this step's records, in order */
  int nrec, cap_rec;
  RtProfEvents ev;
  int failed;
  char why[192];
  int rank, ranks;         /* world rank and size */
  char device[192], model[96], gemm[8];
} RtProf;

/* PARC_CUDA_PROFILE's value: 0 off, 1 on; path gets the JSON lines' file
 * ("" for none: the value does not end in .json or .jsonl). */
int rt_prof_config(const char *value, char *path, size_t len);

/* A rank's profile (NULL when out of memory).  ev is copied. */
RtProf *rt_prof_new(const RtProfEvents *ev, int rank, int ranks, const char *device,
                    const char *model, const char *gemm);
void rt_prof_free(RtProf *p);

/* The step's start: the first step begun is the warm-up. */
void rt_prof_step_begin(RtProf *p);
/* An op starts: 1 if this call records (outermost, not the warm-up), else 0. */
int rt_prof_begin(RtProf *p);
/* The op ends (every rt_prof_begin has one): name, kind, bytes and FLOPs are
 * read only when its begin recorded. */
void rt_prof_end(RtProf *p, int kind, double bytes, double flops, const char *name);
/* The step's last work is enqueued: its end event. */
void rt_prof_step_end(RtProf *p);
/* The host has waited for the step: reads its events into the entries. */
void rt_prof_step_done(RtProf *p);
/* The events are going away (the context closes): the profile keeps its
 * totals and records nothing more. */
void rt_prof_detach(RtProf *p);

/* Entries sorted by total time, longest first (ties by name): fills order
 * with p->ne indices. */
void rt_prof_sorted(const RtProf *p, int *order);
void rt_prof_table(FILE *out, const RtProf *p);
void rt_prof_jsonl(FILE *out, const RtProf *p);

/* At exit, every profile registered in the process: the tables (world rank
 * order) to stdout, and the JSON lines to the path of the first registration
 * when it names one (under MPI, a process without world rank 0 inserts
 * ".rankR" before the extension, R its lowest rank).  p stays owned by the
 * registry. */
void rt_prof_register(RtProf *p, const char *path);
/* What the exit handler does, on given profiles and streams (json may be NULL). */
void rt_prof_report(FILE *out, FILE *json, RtProf *const *ps, int n);
/* The JSON lines' file of a process whose lowest world rank is `lowest`. */
void rt_prof_json_path(char *dst, size_t len, const char *path, int lowest);

#ifdef __cplusplus
}
#endif

#endif
