/* tests/gpu/local_check.c -- the device-local collectives
 * (PARC_CUDA_LOCAL=device, runtime/cuda/rt_cuda_local.cu) against the thread
 * communicator (rt_comm.h), bit for bit.  Needs a GPU: run by
 * tests/gpu/check.sh, built (not run) by ctest everywhere CUDA is found.
 *
 *   gpu_local_check          one line per mesh; exit 0 iff every result is equal
 *
 * Meshes, every rank a thread on the one GPU: tp 3 (an odd group, one
 * reduction pass), tp 2 x dp 2 (two groups per rank, used alternately) and
 * tp 10 (two reduction passes).  For all_reduce, all_gather and
 * reduce_scatter, out of place and in place (rt_comm.h's forms), counts of 1,
 * 1000 and 2^18 + 3 floats, inputs spanning 2^-20 .. 2^20 (so the order of
 * the sums shows in the bits): ROUNDS collectives back to back with no host
 * synchronisation, the out-of-place send buffer refilled on the rank's stream
 * right after each (a peer still reading it would see the next round's
 * values), each round's result compared with memcmp against rt_comm_*'s on
 * the same inputs.  And rt_cuda_all_reduce_bf16 (its reduce-scatter, rounding
 * pass and all-gather), both forms, on counts of 2 members x (1, 500,
 * 2^17 + 1): the thread communicator's f32 sum rounded to nearest even, as
 * bf16 elements and as f32 values; a count that does not split into even
 * pieces, or a piece past the setup's scratch, is an error naming it. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_runtime.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda.h"
#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"

#define ROUNDS 3
#define AR16_PIECES 3 /* pieces of rt_cuda_all_reduce_bf16 checked: 2 (1, 500, 2^17 + 1) */
static const int64_t ar16_piece[AR16_PIECES] = {2, 1000, (1 << 18) + 2};
enum { OP_AR, OP_AG, OP_RS, NOPS };
static const char *const opname[] = {"all_reduce", "all_gather", "reduce_scatter"};
static const int64_t counts[] = {1, 1000, (1 << 18) + 3};

static _Atomic int mismatches, cases, errors;

typedef struct {
  int tp, dp;
} Mesh;

static float val(uint64_t *s) { /* [-1, 1) times 2^(-20 .. 20) */
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  float x = (float)((*s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
  int e = (int)(*s % 41) - 20;
  for (; e > 0; e--) x *= 2.0f;
  for (; e < 0; e++) x *= 0.5f;
  return x;
}

#define CU(call)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "local_check: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,           \
              cudaGetErrorString(e_));                                                      \
      return -1;                                                                            \
    }                                                                                       \
  } while (0)

/* One op of `count` over group g (RT_CUDA_*; host group hg) in `mode` (0 out
 * of place, 1 in place), ROUNDS times: 0 when the rank's results were
 * compared (mismatches counted), -1 on an error. */
static int check_op(RtCuda *c, RtComm *hg, int g, int op, int64_t count, int mode,
                    uint64_t seed) {
  int m = rt_comm_size(hg), me = rt_comm_rank(hg);
  int64_t in = op == OP_RS ? count * m : count, out = op == OP_AG ? count * m : count;
  int64_t span = in > out ? in : out; /* an in-place buffer holds the larger side */
  int64_t cnt[64];
  for (int r = 0; r < m; r++) cnt[r] = count;
  float *h_in[ROUNDS], *h_ref[ROUNDS], *h_got = malloc(sizeof(float) * (size_t)span);
  float *d_in[ROUNDS], *d_res[ROUNDS], *d_send = NULL;
  uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rt_comm_world_rank(hg) + 1));
  int rc = 0;
  for (int k = 0; k < ROUNDS; k++) {
    h_in[k] = malloc(sizeof(float) * (size_t)in);
    h_ref[k] = malloc(sizeof(float) * (size_t)span);
    for (int64_t i = 0; i < in; i++) h_in[k][i] = val(&s);
    /* the reference, with the same in-place form */
    float *buf = h_ref[k];
    const float *snd = h_in[k];
    if (mode) {
      int64_t at = op == OP_AG ? me * count : 0;
      memcpy(buf + at, h_in[k], sizeof(float) * (size_t)in);
      snd = buf + at;
    }
    float *rcv = op == OP_RS && mode ? buf + me * count : buf;
    rc |= op == OP_AR   ? rt_comm_all_reduce(hg, snd, rcv, count)
          : op == OP_AG ? rt_comm_all_gather(hg, snd, rcv, cnt)
                        : rt_comm_reduce_scatter(hg, snd, rcv, cnt);
    if (rcv != buf) memmove(buf, rcv, sizeof(float) * (size_t)out);
  }
  if (rc) return -1;
  CU(cudaMalloc((void **)&d_send, sizeof(float) * (size_t)span));
  for (int k = 0; k < ROUNDS; k++) {
    CU(cudaMalloc((void **)&d_in[k], sizeof(float) * (size_t)in));
    CU(cudaMalloc((void **)&d_res[k], sizeof(float) * (size_t)span));
    CU(cudaMemcpy(d_in[k], h_in[k], sizeof(float) * (size_t)in, cudaMemcpyHostToDevice));
  }
  cudaStream_t st = (cudaStream_t)rt_cuda_stream(c);
  CU(cudaStreamSynchronize(st));
  for (int k = 0; k < ROUNDS && !rc; k++) {
    float *snd, *rcv;
    if (mode) { /* in place in this round's own buffer */
      int64_t at = op == OP_AG ? me * count : 0;
      CU(cudaMemcpyAsync(d_res[k] + at, d_in[k], sizeof(float) * (size_t)in,
                         cudaMemcpyDeviceToDevice, st));
      snd = d_res[k] + at;
      rcv = op == OP_RS ? d_res[k] + me * count : d_res[k];
    } else { /* the one send buffer, refilled on the stream right after the last use */
      CU(cudaMemcpyAsync(d_send, d_in[k], sizeof(float) * (size_t)in, cudaMemcpyDeviceToDevice,
                         st));
      snd = d_send;
      rcv = d_res[k];
    }
    rc = op == OP_AR   ? rt_cuda_all_reduce(c, g, snd, rcv, count)
         : op == OP_AG ? rt_cuda_all_gather(c, g, snd, rcv, count)
                       : rt_cuda_reduce_scatter(c, g, snd, rcv, count);
    if (mode && op == OP_RS && !rc && me > 0) /* the result to the buffer's start */
      CU(cudaMemcpyAsync(d_res[k], rcv, sizeof(float) * (size_t)out, cudaMemcpyDeviceToDevice,
                         st));
  }
  if (rc) fprintf(stderr, "local_check: rank %d: %s\n", rt_comm_world_rank(hg), rt_last_error());
  CU(cudaStreamSynchronize(st));
  for (int k = 0; k < ROUNDS && !rc; k++) {
    CU(cudaMemcpy(h_got, d_res[k], sizeof(float) * (size_t)out, cudaMemcpyDeviceToHost));
    atomic_fetch_add(&cases, 1);
    if (memcmp(h_got, h_ref[k], sizeof(float) * (size_t)out)) {
      int64_t i = 0;
      while (!memcmp(h_got + i, h_ref[k] + i, sizeof(float))) i++;
      fprintf(stderr, "local_check: rank %d, group %s: %s of %lld floats %s, round %d: element "
              "%lld is %.9g, the thread communicator's %.9g\n", rt_comm_world_rank(hg),
              rt_comm_name(hg), opname[op], (long long)count, mode ? "in place" : "out of place",
              k, (long long)i, h_got[i], h_ref[k][i]);
      atomic_fetch_add(&mismatches, 1);
    }
  }
  cudaFree(d_send);
  for (int k = 0; k < ROUNDS; k++) cudaFree(d_in[k]), cudaFree(d_res[k]), free(h_in[k]), free(h_ref[k]);
  free(h_got);
  return rc ? -1 : 0;
}

/* f to bf16, to nearest even (a NaN stays a quiet NaN): __float2bfloat16_rn */
static uint16_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* rt_cuda_all_reduce_bf16 of count floats over group g (host group hg), both
 * forms, against rt_comm_all_reduce's sum rounded here: 0 when compared
 * (mismatches counted), -1 on an error. */
static int check_ar16(RtCuda *c, RtComm *hg, int g, int64_t count, uint64_t seed) {
  uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rt_comm_world_rank(hg) + 1));
  size_t bytes = sizeof(float) * (size_t)count;
  float *h_in = malloc(bytes), *h_sum = malloc(bytes), *h_got = malloc(bytes);
  float *d_in = NULL, *d_out = NULL;
  for (int64_t i = 0; i < count; i++) h_in[i] = val(&s);
  int rc = rt_comm_all_reduce(hg, h_in, h_sum, count);
  if (!rc) {
    CU(cudaMalloc((void **)&d_in, bytes));
    CU(cudaMalloc((void **)&d_out, bytes));
    CU(cudaMemcpy(d_in, h_in, bytes, cudaMemcpyHostToDevice));
  }
  for (int round = 0; round <= 1 && !rc; round++) {
    CU(cudaMemset(d_out, 0xff, bytes)); /* NaNs: nothing left unwritten */
    rc = rt_cuda_all_reduce_bf16(c, g, d_in, d_out, count, round);
    if (rc) break;
    CU(cudaStreamSynchronize((cudaStream_t)rt_cuda_stream(c)));
    CU(cudaMemcpy(h_got, d_out, bytes, cudaMemcpyDeviceToHost));
    atomic_fetch_add(&cases, 1);
    const uint16_t *b = (const uint16_t *)(const void *)h_got;
    for (int64_t i = 0; i < count; i++) {
      uint16_t want = bf16_bits(h_sum[i]);
      uint32_t wide = (uint32_t)want << 16, got;
      memcpy(&got, h_got + i, 4);
      if (round ? got == wide : b[i] == want) continue;
      fprintf(stderr, "local_check: rank %d, group %s: all_reduce_bf16 of %lld floats%s: element "
              "%lld is 0x%08x, the thread communicator's sum %.9g rounded 0x%04x\n",
              rt_comm_world_rank(hg), rt_comm_name(hg), (long long)count,
              round ? " (round)" : "", (long long)i, round ? got : b[i], h_sum[i], want);
      atomic_fetch_add(&mismatches, 1);
      break;
    }
  }
  cudaFree(d_in), cudaFree(d_out), free(h_in), free(h_sum), free(h_got);
  return rc ? -1 : 0;
}

/* rt_cuda_all_reduce_bf16's refusals: 0 when both calls failed naming the cause. */
static int check_ar16_refused(RtCuda *c, int g, int members, int64_t scratch) {
  static const char *const why[2] = {"even pieces", "RtCudaSetup.reduce_piece"};
  const int64_t bad[2] = {2 * members + 1, 2 * members * (scratch / 2 + 1)};
  for (int k = 0; k < 2; k++) {
    if (!rt_cuda_all_reduce_bf16(c, g, NULL, NULL, bad[k], 0) || !strstr(rt_last_error(), why[k]))
      return rt_fail("all_reduce_bf16 of %lld floats over %d members: %s (expected a refusal "
                     "naming %s)", (long long)bad[k], members, rt_last_error(), why[k]);
    atomic_fetch_add(&cases, 1);
  }
  return 0;
}

static int rank_main(RtComm *world, void *arg) {
  const Mesh *ms = arg;
  RtMesh mesh;
  if (rt_comm_mesh(world, ms->tp, ms->dp, 1, 1, &mesh)) return -1;
  RtCudaSetup s = {.params_numel = 1, .state_numel = 1, .arena_bytes = 64, .rows = 1, .seq = 1,
                   .tp = ms->tp, .dp = ms->dp, .tp_group = mesh.tp_comm,
                   .dp_group = mesh.dp_comm, .tp_rank = mesh.tp_rank, .dp_rank = mesh.dp_rank,
                   .ep_dp_group = mesh.ep_dp_comm, /* ep 1: ep_dp is dp's ranks */
                   .gemm = RT_CUDA_GEMM_FP32, .model = "local_check",
                   .reduce_piece = ar16_piece[AR16_PIECES - 1]};
  RtCuda *c;
  int rc = rt_cuda_open(&c, &s, NULL, NULL);
  if (!rc && rt_comm_world_rank(world) == 0) printf("local_check on %s\n", rt_cuda_describe(c));
  if (!rc && !strstr(rt_cuda_describe(c), "device-local (device copies")) {
    rc = rt_fail("the context does not use the device-local collectives: %s",
                 rt_cuda_describe(c));
  }
  for (int op = 0; op < NOPS && !rc; op++)
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts && !rc; ci++)
      for (int mode = 0; mode <= 1 && !rc; mode++) {
        uint64_t seed = 1000003u * (uint64_t)(op * 16 + (int)ci * 2 + mode + 1);
        if (ms->tp > 1) rc = check_op(c, mesh.tp_comm, RT_CUDA_TP, op, counts[ci], mode, seed);
        if (!rc && ms->dp > 1)
          rc = check_op(c, mesh.dp_comm, RT_CUDA_DP, op, counts[ci], mode, seed + 7);
      }
  for (int ci = 0; ci < AR16_PIECES && !rc; ci++) {
    uint64_t seed = 7000003u * (uint64_t)(ci + 1);
    if (ms->tp > 1)
      rc = check_ar16(c, mesh.tp_comm, RT_CUDA_TP, ar16_piece[ci] * ms->tp, seed);
    if (!rc && ms->dp > 1)
      rc = check_ar16(c, mesh.dp_comm, RT_CUDA_DP, ar16_piece[ci] * ms->dp, seed + 7);
  }
  if (!rc) rc = check_ar16_refused(c, RT_CUDA_TP, ms->tp, ar16_piece[AR16_PIECES - 1]);
  if (rc) {
    fprintf(stderr, "local_check: rank %d: %s\n", rt_comm_world_rank(world), rt_last_error());
    atomic_fetch_add(&errors, 1);
  }
  rt_cuda_close(c);
  rt_comm_mesh_free(&mesh);
  return rc ? -1 : 0;
}

int main(void) {
  static const Mesh meshes[] = {{3, 1}, {2, 2}, {10, 1}};
  setenv("PARC_CUDA_COMM", "host", 1);
  setenv("PARC_CUDA_LOCAL", "device", 1);
  int failed = 0;
  for (size_t i = 0; i < sizeof meshes / sizeof *meshes; i++) {
    atomic_store(&mismatches, 0), atomic_store(&cases, 0), atomic_store(&errors, 0);
    int rc = rt_comm_threads_run(meshes[i].tp * meshes[i].dp, rank_main, (void *)&meshes[i]);
    int bad = rc || atomic_load(&mismatches) || atomic_load(&errors) || !atomic_load(&cases);
    printf("tp %d x dp %d: %d rank results (rank, group, op, count, mode, round), %d differ "
           "from the thread communicator%s: %s\n", meshes[i].tp, meshes[i].dp,
           atomic_load(&cases), atomic_load(&mismatches), rc ? " (a rank failed)" : "",
           bad ? "FAIL" : "ok");
    if (rc) fprintf(stderr, "local_check: %s\n", rt_last_error());
    failed |= bad;
  }
  printf("gpu_local_check: %s\n", failed ? "FAIL" : "ok");
  return failed ? 1 : 0;
}
