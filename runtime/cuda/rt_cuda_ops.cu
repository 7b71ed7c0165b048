/* runtime/cuda/rt_cuda_ops.cu -- embedding, cross-entropy (fused with its
 * softmax: the probabilities never reach memory), their gradients, the
 * vocabulary-parallel variants, and the routing ops (staged through the
 * host).  Semantics: rt_route.h.
 *
 * Determinism: every sum has a fixed order.  Cross-entropy rows reduce in a
 * fixed tree (double for the sums of exponentials, as the CPU), the mean
 * over rows in one block in a fixed tree; the embedding gradient sorts the
 * (id, position) pairs with a stable radix sort and adds each id's rows in
 * position order, exactly the CPU's order (so it agrees bitwise). */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/rt_cuda_impl.h"
extern "C" {
#include "runtime/rt_expert.h"
#include "runtime/rt_route.h"
}

#define BLOCK 256
#define FULL 0xffffffffu

/* ---- block reductions (BLOCK threads; every thread gets the result) ---- */

template <typename T>
static __device__ __forceinline__ T block_reduce(T v, T *sh, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    T u = __shfl_xor_sync(FULL, v, o);
    v = is_max ? (u > v ? u : v) : v + u;
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads(); /* sh may still be read by an earlier reduction */
  if (lane == 0) sh[w] = v;
  __syncthreads();
  T r = sh[0];
  for (int i = 1; i < BLOCK / 32; i++) r = is_max ? (sh[i] > r ? sh[i] : r) : r + sh[i];
  return r;
}

/* ---- embedding ---- */

__global__ void embed_kernel(float *out, const int32_t *ids, const float *table, int64_t count,
                             int64_t V, int64_t D, int64_t lo) {
  int64_t n = count * D;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t p = e / D, d = e % D, r = (int64_t)ids[p] - lo;
    out[e] = r >= 0 && r < V ? table[r * D + d] : 0.0f;
  }
}

__global__ void iota_kernel(int32_t *x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = (int32_t)i;
}

/* The embedding gradient.  After the stable sort, keys (the ids ascending)
 * and pos (their positions) lie in runs, one per id, positions ascending in
 * each.  For every id in [lo, lo + V) the kernel writes
 *
 *     dtable[id - lo][d] = ((0.0f + dy[p0][d]) + dy[p1][d]) + ... ,  p0 < p1 < ...
 *
 * one fp32 add at a time in ascending position order: rt_embedding_grad's
 * order (it zeroes the table, then adds the dy rows position by position), so
 * the bits equal the CPU's (no FMA: only adds; the loads ahead of the adds
 * below change when a value arrives, never which value is added when).  Rows
 * with no id keep the memset's zeros.
 *
 * Grid (count, column slices): block (s, y) does nothing unless slot s
 * starts a run (s == 0 or keys[s] != keys[s-1]); then it finds the run's end
 * e by a binary search (upper bound of keys[s] in keys[s+1 .. count): keys are
 * sorted, so no dependent walk) and sums rows pos[s .. e) into its columns.
 * A thread owns a column of W floats (W = 4: float4 loads, when D % 4 == 0 and
 * dy, dtable are 16-byte aligned; W = 1 otherwise), in slice y and every
 * gridDim.y-th slice after it (only for D past 65535 slices).
 *
 * Speed: a run's adds are a serial chain per column, and the trainers' byte
 * corpora give runs of ~1000 rows (space, 'e'), so a run costs its length /
 * rows in flight times the memory latency.  Hence (1) the dy row offsets of
 * up to EG_CHUNK slots are staged in shared memory by the whole block at once,
 * so a dy load never waits on a pos load, and (2) each thread issues EG_BATCH
 * row loads before adding them in order (EG_BATCH rows in flight per column).
 * Slicing the columns (EG_THREADS per block: 3 blocks per run at GPT-2's
 * D 768) does not shorten that chain, but spreads a long run's traffic over
 * several SMs and keeps blocks small, so the few long runs and the many short
 * ones balance over the SMs; the cost is count x slices blocks, most of which
 * read two keys and exit. */
#define EG_BATCH 16
#define EG_CHUNK 256
#define EG_THREADS 64

template <int W> struct EgVec;
template <> struct EgVec<1> {
  typedef float T;
  static __device__ __forceinline__ T zero() { return 0.0f; }
  static __device__ __forceinline__ void add(T &a, T b) { a += b; }
};
template <> struct EgVec<4> {
  typedef float4 T;
  static __device__ __forceinline__ T zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
  static __device__ __forceinline__ void add(T &a, T b) { /* four columns, each its own chain */
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
  }
};

/* __launch_bounds__(EG_THREADS, 1): without it ptxas keeps the kernel at 32
 * registers and interleaves a batch's loads with its adds (2-5 loads in
 * flight, not EG_BATCH); with it, a full batch's EG_BATCH loads all issue
 * before its adds (sm_90 SASS, CUDA 13.0: 118 registers at W = 4, 56 at
 * W = 1; the partial last batch of a run still interleaves at W = 1).  The
 * price: 8 resident blocks per SM (at W = 4), so the blocks that only read
 * two keys drain more slowly. */
template <int W>
__global__ void __launch_bounds__(EG_THREADS, 1)
    embed_grad_kernel(float *dtable, const int32_t *keys, const int32_t *pos, const float *dy,
                      int64_t count, int64_t V, int64_t D, int64_t lo, int onto) {
  typedef EgVec<W> Vec;
  typedef typename Vec::T T;
  __shared__ int64_t sp[EG_CHUNK]; /* one chunk of the run: its dy rows' offsets in T */
  int64_t s = blockIdx.x;
  int32_t key = keys[s];
  if (s > 0 && keys[s - 1] == key) return; /* not a run's start: the whole block leaves */
  int64_t r = (int64_t)key - lo;
  if (r < 0 || r >= V) return; /* another member's row (vocabulary-parallel) */
  int64_t a = s + 1, b = count; /* the run's end: the first slot past s whose key differs */
  while (a < b) {
    int64_t m = a + (b - a) / 2;
    if (keys[m] == key) a = m + 1; /* keys[m] >= key (sorted): == means inside the run */
    else b = m;
  }
  int64_t e = a, ncols = D / W;
  const T *g = (const T *)dy;
  T *o = (T *)dtable + r * ncols;
  /* block-uniform loops (the __syncthreads): the column loop over slices, the
   * chunk loop over the run; a thread past the last column only stages */
  for (int64_t base = (int64_t)blockIdx.y * blockDim.x; base < ncols;
       base += (int64_t)gridDim.y * blockDim.x) {
    int64_t j = base + threadIdx.x;
    bool on = j < ncols;
    T acc = on && onto ? o[j] : Vec::zero(); /* _acc: onto the row's sum so far */
    for (int64_t c0 = s; c0 < e; c0 += EG_CHUNK) {
      int n = e - c0 < EG_CHUNK ? (int)(e - c0) : EG_CHUNK;
      __syncthreads(); /* the previous chunk's sp is read */
      for (int i = threadIdx.x; i < n; i += blockDim.x) sp[i] = (int64_t)pos[c0 + i] * ncols;
      __syncthreads();
      if (on)
        for (int t = 0; t < n; t += EG_BATCH) {
          /* rows t .. t + EG_BATCH - 1 of the chunk: all loaded, then added in
           * position order */
          T v[EG_BATCH];
          if (t + EG_BATCH <= n) {
#pragma unroll
            for (int k = 0; k < EG_BATCH; k++) v[k] = g[sp[t + k] + j];
#pragma unroll
            for (int k = 0; k < EG_BATCH; k++) Vec::add(acc, v[k]);
          } else { /* the run's last, partial batch: past its end, its last row
                    * again, loaded (so no load waits behind a branch), not added */
#pragma unroll
            for (int k = 0; k < EG_BATCH; k++) v[k] = g[sp[t + k < n ? t + k : n - 1] + j];
#pragma unroll
            for (int k = 0; k < EG_BATCH; k++)
              if (t + k < n) Vec::add(acc, v[k]);
          }
        }
    }
    if (on) o[j] = acc;
  }
}

static int embed(RtCuda *c, const char *op, float *out, const int32_t *ids, const float *table,
                 int64_t count, int64_t V, int64_t D, int64_t lo) {
  if (!out || !ids || !table) return rt_fail("%s: NULL pointer", op);
  if (count < 1 || V < 1 || D < 1) return rt_fail("%s: dimensions must be >= 1", op);
  RtProfScope ps(c); /* ids, the rows read, out */
  if (ps.on()) ps.set(RT_PROF_OP, 4.0 * (double)count * (double)(1 + 2 * D), 0, "%s", op);
  embed_kernel<<<rt_cuda_blocks(count * D, BLOCK), BLOCK, 0, c->compute>>>(out, ids, table, count,
                                                                           V, D, lo);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}

static size_t up256(size_t x) { return (x + 255) / 256 * 256; }

static int embed_grad(RtCuda *c, const char *op, float *dtable, const int32_t *ids,
                      const float *dy, int64_t count, int64_t V, int64_t D, int64_t lo,
                      int onto) {
  if (!dtable || !ids || !dy) return rt_fail("%s: NULL pointer", op);
  if (count < 1 || V < 1 || D < 1 || count > 0x7fffffff)
    return rt_fail("%s: dimensions out of range", op);
  /* the bytes the op must move: ids and dy read, the table written, once each
   * (not counted: the sort's passes, the sorted keys and positions read back,
   * the rows with ids written a second time after the memset) */
  RtProfScope ps(c);
  if (ps.on())
    ps.set(RT_PROF_OP, 4.0 * ((double)count * (double)(1 + D) + (double)V * (double)D), 0, "%s",
           op);
  size_t temp = 0;
  CU_CHECK(c, cub::DeviceRadixSort::SortPairs(NULL, temp, (const int32_t *)NULL, (int32_t *)NULL,
                                              (const int32_t *)NULL, (int32_t *)NULL, (int)count,
                                              0, 32, c->compute), op);
  size_t arr = up256((size_t)count * 4);
  char *ws = (char *)rt_cuda_ws(c, WS_SORT, 3 * arr + temp);
  if (!ws) return RT_ERR;
  int32_t *pos_in = (int32_t *)ws, *keys = (int32_t *)(ws + arr), *pos = (int32_t *)(ws + 2 * arr);
  iota_kernel<<<rt_cuda_blocks(count, BLOCK), BLOCK, 0, c->compute>>>(pos_in, count);
  LAUNCH_CHECK(c, op);
  CU_CHECK(c, cub::DeviceRadixSort::SortPairs(ws + 3 * arr, temp, ids, keys, pos_in, pos,
                                              (int)count, 0, 32, c->compute), op);
  if (!onto) CU_CHECK(c, cudaMemsetAsync(dtable, 0, (size_t)(V * D) * 4, c->compute), op);
  /* float4 columns where D % 4 == 0 and both buffers are 16-byte aligned (a
   * row then starts on 16 bytes too); EG_THREADS threads a block at most, 32
   * at least (tiny D), one block per (slot, slice), slices capped at 65535
   * (the kernel loops over the rest) */
  int vec = D % 4 == 0 && ((uintptr_t)dy | (uintptr_t)dtable) % 16 == 0;
  int64_t ncols = vec ? D / 4 : D, tb = (ncols + 31) / 32 * 32, slices;
  if (tb > EG_THREADS) tb = EG_THREADS;
  slices = (ncols + tb - 1) / tb;
  dim3 grid((unsigned)count, (unsigned)(slices > 65535 ? 65535 : slices));
  if (vec)
    embed_grad_kernel<4><<<grid, (unsigned)tb, 0, c->compute>>>(dtable, keys, pos, dy, count, V,
                                                                 D, lo, onto);
  else
    embed_grad_kernel<1><<<grid, (unsigned)tb, 0, c->compute>>>(dtable, keys, pos, dy, count, V,
                                                                 D, lo, onto);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}

extern "C" int rt_cuda_embedding(RtCuda *c, float *out, const int32_t *ids, const float *table,
                                 int64_t count, int64_t V, int64_t D) {
  return embed(c, "embedding", out, ids, table, count, V, D, 0);
}

extern "C" int rt_cuda_embedding_grad(RtCuda *c, float *dtable, const int32_t *ids,
                                      const float *dy, int64_t count, int64_t V, int64_t D) {
  return embed_grad(c, "embedding_grad", dtable, ids, dy, count, V, D, 0, 0);
}

extern "C" int rt_cuda_embedding_grad_acc(RtCuda *c, float *dtable, const int32_t *ids,
                                          const float *dy, int64_t count, int64_t V, int64_t D) {
  return embed_grad(c, "embedding_grad_acc", dtable, ids, dy, count, V, D, 0, 1);
}

extern "C" int rt_cuda_vocab_embedding(RtCuda *c, float *out, const int32_t *ids,
                                       const float *table, int64_t count, int64_t Vl, int64_t D,
                                       int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts)
    return rt_fail("vocab_embedding: member %d of %d out of range", part, parts);
  return embed(c, "vocab_embedding", out, ids, table, count, Vl, D, (int64_t)part * Vl);
}

extern "C" int rt_cuda_vocab_embedding_grad(RtCuda *c, float *dtable, const int32_t *ids,
                                            const float *dy, int64_t count, int64_t Vl, int64_t D,
                                            int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts)
    return rt_fail("vocab_embedding_grad: member %d of %d out of range", part, parts);
  return embed_grad(c, "vocab_embedding_grad", dtable, ids, dy, count, Vl, D, (int64_t)part * Vl,
                    0);
}

extern "C" int rt_cuda_vocab_embedding_grad_acc(RtCuda *c, float *dtable, const int32_t *ids,
                                                const float *dy, int64_t count, int64_t Vl,
                                                int64_t D, int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts)
    return rt_fail("vocab_embedding_grad_acc: member %d of %d out of range", part, parts);
  return embed_grad(c, "vocab_embedding_grad_acc", dtable, ids, dy, count, Vl, D,
                    (int64_t)part * Vl, 1);
}

/* ---- cross-entropy ---- */

/* Logits and their gradients are fp32, or bf16 where their GEMM writes them
 * so (rt_cuda_cross_entropy_bf16, rt_cuda_cross_entropy_grad_bf16io): an
 * element as a float (a bf16 widens exactly), and a float stored as one
 * (bf16: rounded to nearest even). */
typedef __nv_bfloat16 bf16;
static __device__ __forceinline__ float logit(const float *row, int64_t v) { return row[v]; }
static __device__ __forceinline__ float logit(const bf16 *row, int64_t v) {
  return __bfloat162float(row[v]);
}
static __device__ __forceinline__ void put(float *e, float x) { *e = x; }
static __device__ __forceinline__ void put(bf16 *e, float x) { *e = __float2bfloat16_rn(x); }

/* A bf16 row that starts on 16 bytes goes 8 columns a thread at a time (one
 * 16-byte load or store: a warp moves 512 contiguous bytes, not 64 -- GPT-2's
 * logits are 8192 rows of 50304 bf16, read three times and written once by
 * the gradient); fp32 rows, and the columns past a bf16 row's last whole 8,
 * one at a time.  vec_cols: how many leading columns of a row of n take the
 * 8-wide path (a multiple of 8; 0 for fp32, which keeps its bits). */
static __device__ __forceinline__ int64_t vec_cols(const float *, int64_t) { return 0; }
static __device__ __forceinline__ int64_t vec_cols(const bf16 *row, int64_t n) {
  return ((uintptr_t)row & 15) ? 0 : n & ~(int64_t)7;
}
static __device__ __forceinline__ void load8(const float *p, float x[8]) {
#pragma unroll
  for (int k = 0; k < 8; k++) x[k] = p[k];
}
static __device__ __forceinline__ void load8(const bf16 *p, float x[8]) {
  int4 u = *(const int4 *)(const void *)p;
  __nv_bfloat162 h[4];
  memcpy(h, &u, sizeof h);
#pragma unroll
  for (int k = 0; k < 4; k++) x[2 * k] = __low2float(h[k]), x[2 * k + 1] = __high2float(h[k]);
}
static __device__ __forceinline__ void store8(float *p, const float x[8]) {
#pragma unroll
  for (int k = 0; k < 8; k++) p[k] = x[k];
}
static __device__ __forceinline__ void store8(bf16 *p, const float x[8]) {
  __nv_bfloat162 h[4];
#pragma unroll
  for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
  int4 u;
  memcpy(&u, h, sizeof u);
  *(int4 *)(void *)p = u;
}

/* fn(x) for each logit x of columns [0, nv) of a row that this thread owns,
 * in increasing column order: its 8-wide chunks, then its tail columns. */
template <typename L, typename F>
static __device__ __forceinline__ void row_each(const L *row, int64_t nv, F fn) {
  int64_t nvec = vec_cols(row, nv);
  for (int64_t v = 8 * (int64_t)threadIdx.x; v < nvec; v += 8 * BLOCK) {
    float x[8];
    load8(row + v, x);
#pragma unroll
    for (int k = 0; k < 8; k++) fn(x[k]);
  }
  for (int64_t v = nvec + threadIdx.x; v < nv; v += BLOCK) fn(logit(row, v));
}

/* Row p's max over columns [0, nv) of a row (exact in any order). */
template <typename L> static __device__ float row_max(const L *row, int64_t nv, float *sh) {
  float m = -INFINITY;
  row_each(row, nv, [&](float x) { m = fmaxf(m, x); });
  return block_reduce<float>(m, sh, true);
}

/* Row p's sum of exp(x - mx) over [0, nv), in double: a thread sums its
 * columns in row_each's order, then block_reduce's fixed tree (so the one-
 * member and gathered paths, which both come here, have the same bits). */
template <typename L>
static __device__ double row_sumexp(const L *row, int64_t nv, float mx, double *sh) {
  double s = 0.0;
  row_each(row, nv, [&](float x) { s += (double)expf(x - mx); });
  return block_reduce<double>(s, sh, false);
}

/* Forward: per-row losses (double). */
template <typename L>
__global__ void __launch_bounds__(BLOCK) xent_rows(double *loss_rows, const L *logits,
                                                   const int32_t *targets, int64_t N, int64_t V) {
  __shared__ float shf[BLOCK / 32];
  __shared__ double shd[BLOCK / 32];
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    const L *row = logits + p * V;
    float mx = row_max(row, V, shf);
    double s = row_sumexp(row, V, mx, shd);
    if (threadIdx.x == 0) {
      int32_t t = targets[p];
      double tl = t >= 0 && t < V ? (double)logit(row, t) : 0.0;
      loss_rows[p] = (double)mx + log(s) - tl;
    }
  }
}

/* *loss = mean of the N row losses (one block, fixed order). */
__global__ void __launch_bounds__(BLOCK) mean_rows(float *loss, const double *rows, int64_t N) {
  __shared__ double shd[BLOCK / 32];
  double s = 0.0;
  for (int64_t p = threadIdx.x; p < N; p += BLOCK) s += rows[p];
  s = block_reduce<double>(s, shd, false);
  if (threadIdx.x == 0) *loss = (float)(s / (double)N);
}

/* The gradient kernels' row losses (rows != NULL: the forward fused into the
 * gradient, rt_cuda_cross_entropy_fused): thread 0's target logit, read
 * before the row's statistics, so before any thread passes their barriers
 * to write the row (in place); the forward's value (xent_rows). */
template <typename L>
static __device__ double target_logit(const double *rows, const L *row, int32_t t, int64_t V) {
  return rows && threadIdx.x == 0 && t >= 0 && t < V ? (double)logit(row, t) : 0.0;
}

/* Row values of the cross-entropy gradient: column v of a row whose logits
 * are row, maximum mx, f = dloss / (N sum), target column t (any value off
 * the row); columns past nv (vocabulary padding) are 0.  The expression of
 * xent_grad and vxent_grad. */
template <typename L> struct XentVal {
  const L *row;
  float mx, f, scale;
  int64_t nv, t;
  /* column v whose logit x is already read (any x past nv: 0) */
  __device__ float at(float x, int64_t v) const {
    return v < nv ? expf(x - mx) * f - (v == t ? scale : 0.0f) : 0.0f;
  }
  __device__ float operator()(int64_t v) const { return v < nv ? at(logit(row, v), v) : 0.0f; }
};

/* Writes columns [0, n) of a gradient row at e, as put(e + v, val(v)) would:
 * 8 at a time where both rows take the 8-wide path (a thread reads the
 * logits of the 8 columns it then writes itself, so in place is as safe as
 * the scalar loop: see xent_grad). */
template <typename L>
static __device__ void store_row(L *e, int64_t n, const XentVal<L> &val) {
  int64_t nvec = vec_cols(e, n);
  if (vec_cols(val.row, n) != nvec) nvec = 0;
  for (int64_t v = 8 * (int64_t)threadIdx.x; v < nvec; v += 8 * BLOCK) {
    float x[8];
    load8(val.row + v, x);
#pragma unroll
    for (int k = 0; k < 8; k++) x[k] = val.at(x[k], v + k);
    store8(e + v, x);
  }
  for (int64_t v = nvec + threadIdx.x; v < n; v += BLOCK) put(e + v, val(v));
}

/* Backward: dlogits = dloss / N (softmax - onehot), the softmax recomputed.
 * In place (dlogits == logits; the buffer plan does this: IR_F_INPLACE0):
 * row p belongs to one block; both of its reductions end in block_reduce's
 * second __syncthreads, which every thread passes only after its last read
 * of the row for them; after that, thread x reads row[v] only for the v it
 * then writes itself (e[v], same index, same thread).  No element is
 * overwritten before every read of it, and no pointer is __restrict__.  L:
 * float, or bf16 for logits and dlogits both (the same element size, so the
 * same argument holds in place). */
template <typename L>
__global__ void __launch_bounds__(BLOCK) xent_grad(L *dlogits, const L *logits,
                                                   const int32_t *targets, const float *dloss,
                                                   int64_t N, int64_t V, double *rows) {
  __shared__ float shf[BLOCK / 32];
  __shared__ double shd[BLOCK / 32];
  float scale = (float)((double)*dloss / (double)N);
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    const L *row = logits + p * V;
    L *e = dlogits + p * V;
    const double tl = target_logit(rows, row, targets[p], V);
    float mx = row_max(row, V, shf);
    double s = row_sumexp(row, V, mx, shd);
    if (rows && threadIdx.x == 0) rows[p] = (double)mx + log(s) - tl;
    XentVal<L> val = {row, mx, (float)(1.0 / s) * scale, scale, V, (int64_t)targets[p]};
    store_row(e, V, val);
  }
}

/* Stores the V values of a row as bf16 (rounded to nearest even: the bits a
 * GEMM's operand copy of the fp32 values has) at e, the first half of the
 * bytes of the row's own fp32 row, which may hold the logits val reads (in
 * place).  The block goes through the columns in tiles of XENT_TILE: every
 * thread computes its values of the tile, __syncthreads, then stores them.
 * Tile k's stores land on fp32 columns [k T / 2, (k + 1) T / 2) of the row,
 * which every thread read before the barrier of tile k or an earlier one;
 * the reads of tile k + 1, [(k + 1) T, (k + 2) T), lie past every store so
 * far.  The caller's reductions over the row end in a barrier too. */
enum { XENT_TILE = 4 * BLOCK };
template <typename L>
static __device__ void store_row_bf16(__nv_bfloat16 *e, int64_t V, const XentVal<L> &val) {
  for (int64_t c0 = 0; c0 < V; c0 += XENT_TILE) {
    float x[XENT_TILE / BLOCK];
#pragma unroll
    for (int j = 0; j < XENT_TILE / BLOCK; j++) {
      int64_t v = c0 + j * BLOCK + threadIdx.x;
      x[j] = v < V ? val(v) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < XENT_TILE / BLOCK; j++) {
      int64_t v = c0 + j * BLOCK + threadIdx.x;
      if (v < V) e[v] = __float2bfloat16_rn(x[j]);
    }
  }
}

/* xent_grad with dlogits stored as bf16: row p at dlogits + 2 p V (rt_cuda.h). */
__global__ void __launch_bounds__(BLOCK) xent_grad_bf16(__nv_bfloat16 *dlogits,
                                                        const float *logits,
                                                        const int32_t *targets,
                                                        const float *dloss, int64_t N,
                                                        int64_t V, double *rows) {
  __shared__ float shf[BLOCK / 32];
  __shared__ double shd[BLOCK / 32];
  float scale = (float)((double)*dloss / (double)N);
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    const float *row = logits + p * V;
    const double tl = target_logit(rows, row, targets[p], V);
    float mx = row_max(row, V, shf);
    double s = row_sumexp(row, V, mx, shd);
    if (rows && threadIdx.x == 0) rows[p] = (double)mx + log(s) - tl;
    XentVal<float> val = {row, mx, (float)(1.0 / s) * scale, scale, V, (int64_t)targets[p]};
    store_row_bf16(dlogits + p * 2 * V, V, val);
  }
}

static unsigned row_blocks(int64_t N) { return (unsigned)(N < 65535 * 4 ? N : 65535 * 4); }

/* cross_entropy and its gradient on logits (and dlogits) of element L: op
 * names the call in errors and the profile. */
template <typename L>
static int xent_fwd(RtCuda *c, const char *op, float *loss, const L *logits,
                    const int32_t *targets, int64_t N, int64_t V) {
  if (!loss || !logits || !targets) return rt_fail("%s: NULL pointer", op);
  if (N < 1 || V < 1) return rt_fail("%s: dimensions must be >= 1", op);
  RtProfScope ps(c); /* logits, targets */
  if (ps.on()) ps.set(RT_PROF_OP, (double)N * ((double)sizeof(L) * (double)V + 4), 0, "%s", op);
  double *rows = (double *)rt_cuda_ws(c, WS_ROWS, (size_t)N * sizeof(double));
  if (!rows) return RT_ERR;
  xent_rows<L><<<row_blocks(N), BLOCK, 0, c->compute>>>(rows, logits, targets, N, V);
  LAUNCH_CHECK(c, op);
  mean_rows<<<1, BLOCK, 0, c->compute>>>(loss, rows, N);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}

/* The row-loss workspace of a fused call (loss != NULL), else NULL with
 * *ok 1; *ok 0 when it could not be had. */
static double *fused_rows(RtCuda *c, const float *loss, int64_t N, int *ok) {
  double *rows = loss ? (double *)rt_cuda_ws(c, WS_ROWS, (size_t)N * sizeof(double)) : NULL;
  *ok = !loss || rows;
  return rows;
}

/* loss != NULL: also the forward's loss (rt_cuda_cross_entropy_fused). */
template <typename L>
static int xent_bwd(RtCuda *c, const char *op, L *dlogits, const L *logits,
                    const int32_t *targets, const float *dloss, int64_t N, int64_t V,
                    float *loss = NULL) {
  if (!dlogits || !logits || !targets || !dloss) return rt_fail("%s: NULL pointer", op);
  if (N < 1 || V < 1) return rt_fail("%s: dimensions must be >= 1", op);
  RtProfScope ps(c); /* logits, targets, dlogits */
  if (ps.on())
    ps.set(RT_PROF_OP, (double)N * (2.0 * (double)sizeof(L) * (double)V + 4), 0, "%s", op);
  int ok;
  double *rows = fused_rows(c, loss, N, &ok);
  if (!ok) return RT_ERR;
  xent_grad<L><<<row_blocks(N), BLOCK, 0, c->compute>>>(dlogits, logits, targets, dloss, N, V,
                                                          rows);
  LAUNCH_CHECK(c, op);
  if (loss) {
    mean_rows<<<1, BLOCK, 0, c->compute>>>(loss, rows, N);
    LAUNCH_CHECK(c, op);
  }
  return RT_OK;
}

extern "C" int rt_cuda_cross_entropy(RtCuda *c, float *loss, const float *logits,
                                     const int32_t *targets, int64_t N, int64_t V) {
  return xent_fwd(c, "cross_entropy", loss, logits, targets, N, V);
}

/* xent_bwd with fp32 logits and dlogits as bf16 wide rows (xent_grad_bf16). */
static int xent_bwd_wide(RtCuda *c, const char *op, float *dlogits, const float *logits,
                         const int32_t *targets, const float *dloss, int64_t N, int64_t V,
                         float *loss = NULL) {
  if (!dlogits || !logits || !targets || !dloss) return rt_fail("%s: NULL pointer", op);
  if (N < 1 || V < 1) return rt_fail("%s: dimensions must be >= 1", op);
  RtProfScope ps(c); /* logits, targets, dlogits as bf16 */
  if (ps.on()) ps.set(RT_PROF_OP, (double)N * (double)(6 * V + 4), 0, "%s (bf16 out)", op);
  int ok;
  double *rows = fused_rows(c, loss, N, &ok);
  if (!ok) return RT_ERR;
  xent_grad_bf16<<<row_blocks(N), BLOCK, 0, c->compute>>>((__nv_bfloat16 *)(void *)dlogits,
                                                          logits, targets, dloss, N, V, rows);
  LAUNCH_CHECK(c, op);
  if (loss) {
    mean_rows<<<1, BLOCK, 0, c->compute>>>(loss, rows, N);
    LAUNCH_CHECK(c, op);
  }
  return RT_OK;
}

extern "C" int rt_cuda_cross_entropy_grad_bf16(RtCuda *c, float *dlogits, const float *logits,
                                               const int32_t *targets, const float *dloss,
                                               int64_t N, int64_t V) {
  return xent_bwd_wide(c, "cross_entropy_grad_bf16", dlogits, logits, targets, dloss, N, V);
}

extern "C" int rt_cuda_cross_entropy_grad(RtCuda *c, float *dlogits, const float *logits,
                                          const int32_t *targets, const float *dloss, int64_t N,
                                          int64_t V) {
  return xent_bwd(c, "cross_entropy_grad", dlogits, logits, targets, dloss, N, V);
}

extern "C" int rt_cuda_cross_entropy_bf16(RtCuda *c, float *loss, const float *logits,
                                          const int32_t *targets, int64_t N, int64_t V) {
  return xent_fwd(c, "cross_entropy_bf16", loss, (const bf16 *)(const void *)logits, targets, N,
                  V);
}

extern "C" int rt_cuda_cross_entropy_grad_bf16io(RtCuda *c, float *dlogits, const float *logits,
                                                 const int32_t *targets, const float *dloss,
                                                 int64_t N, int64_t V) {
  return xent_bwd(c, "cross_entropy_grad_bf16io", (bf16 *)(void *)dlogits,
                  (const bf16 *)(const void *)logits, targets, dloss, N, V);
}

/* ---- vocabulary-parallel cross-entropy (rt_route.h): the group's row maxima,
 * then per row the local sum of exp (a double sent as two floats) and the
 * target logit (0 off its owner), gathered and summed in member order. ---- */

template <typename L>
__global__ void __launch_bounds__(BLOCK) vxent_max(float *mx, const L *logits, int64_t N,
                                                   int64_t Vl, int64_t nv) {
  __shared__ float shf[BLOCK / 32];
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    float m = row_max(logits + p * Vl, nv, shf);
    if (threadIdx.x == 0) mx[p] = m;
  }
}

/* allmx [parts, N] -> mx [N]; send [N, 3] = (sum hi, sum lo, target logit). */
template <typename L>
__global__ void __launch_bounds__(BLOCK) vxent_stats(float *send, float *mx, const float *allmx,
                                                     const L *logits, const int32_t *targets,
                                                     int64_t N, int64_t Vl, int64_t nv, int64_t lo,
                                                     int parts) {
  __shared__ double shd[BLOCK / 32];
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    float m = allmx[p];
    for (int k = 1; k < parts; k++) m = fmaxf(m, allmx[(int64_t)k * N + p]);
    const L *row = logits + p * Vl;
    double t = row_sumexp(row, nv, m, shd);
    if (threadIdx.x == 0) {
      float hi = (float)t;
      int64_t r = (int64_t)targets[p] - lo;
      send[3 * p] = hi;
      send[3 * p + 1] = (float)(t - (double)hi);
      send[3 * p + 2] = r >= 0 && r < Vl ? logit(row, r) : 0.0f;
      mx[p] = m;
    }
  }
}

/* all [parts, N, 3] -> s [N] (double) and, when rows != NULL, the row losses. */
__global__ void vxent_sum(double *s, double *rows, const float *all, const float *mx,
                          const int32_t *targets, int64_t N, int64_t Vl, int parts) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < N;
       p += (int64_t)gridDim.x * blockDim.x) {
    double sum = 0.0, tl = 0.0;
    for (int k = 0; k < parts; k++) {
      const float *q = all + (int64_t)k * 3 * N + 3 * p;
      sum += (double)q[0] + (double)q[1];
      if (targets[p] / Vl == k) tl = (double)q[2];
    }
    s[p] = sum;
    if (rows) rows[p] = (double)mx[p] + log(sum) - tl;
  }
}

/* In place (dlogits == logits, as xent_grad): the statistics kernels that
 * read the logits (vxent_max, vxent_stats) ran before it on the same stream;
 * here thread x reads row[v] only for the e[v] it then writes itself, and
 * writes the padding columns as 0 (store_row's 8-wide path reads them first,
 * within the row, like any other column it then writes). */
template <typename L>
__global__ void __launch_bounds__(BLOCK) vxent_grad(L *dlogits, const L *logits,
                                                    const int32_t *targets, const float *dloss,
                                                    const float *mx, const double *s, int64_t N,
                                                    int64_t Vl, int64_t nv, int64_t lo) {
  float scale = (float)((double)*dloss / (double)N);
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    L *e = dlogits + p * Vl;
    XentVal<L> val = {logits + p * Vl, mx[p], (float)(1.0 / s[p]) * scale, scale, nv,
                      (int64_t)targets[p] - lo}; /* padding columns: 0 */
    store_row(e, Vl, val);
  }
}

/* vxent_grad with dlogits stored as bf16: row p at dlogits + 2 p Vl (rt_cuda.h).
 * The barrier before a row's first store (store_row_bf16) also orders it
 * after the previous row's stores of the block: rows are disjoint anyway. */
__global__ void __launch_bounds__(BLOCK) vxent_grad_bf16(__nv_bfloat16 *dlogits,
                                                         const float *logits,
                                                         const int32_t *targets,
                                                         const float *dloss, const float *mx,
                                                         const double *s, int64_t N, int64_t Vl,
                                                         int64_t nv, int64_t lo) {
  float scale = (float)((double)*dloss / (double)N);
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    XentVal<float> val = {logits + p * Vl, mx[p], (float)(1.0 / s[p]) * scale, scale, nv,
                   (int64_t)targets[p] - lo};
    store_row_bf16(dlogits + p * 2 * Vl, Vl, val);
  }
}

/* ---- one member (the one-rank trainer's padded vocabulary: GPT-2's 50257 as
 * 50304 columns).  Above, the statistics take two kernels that each read every
 * row (vxent_max, vxent_stats, with the gathers between them), and the
 * gradient a third: three passes over the logits, each larger than L2 in
 * GPT-2 (824 MB of bf16), before its own.  With one member nothing needs
 * gathering: a block takes its row's max and sum of exp, then (gradient)
 * writes its row, the way xent_rows and xent_grad do (the gradient from a
 * copy of the row in shared memory where it fits: staged, below).  The
 * values are the gathered path's: the sum goes through the two floats that
 * path sends (hi, lo) and is summed as vxent_sum sums one member's, so the
 * loss and dlogits have the same bits (gpu_ops_check compares them with
 * PARC_CUDA_XENT=gathered, which keeps the gathered path at one member for
 * comparison). */
template <typename L>
static __device__ void vxent_one_stats(const L *row, int64_t nv, float *shf, double *shd,
                                       float *mx, double *s) {
  float m = row_max(row, nv, shf);
  double t = row_sumexp(row, nv, m, shd);
  float hi = (float)t, lo = (float)(t - (double)hi);
  *mx = m;
  *s = 0.0 + ((double)hi + (double)lo);
}

/* The gradient's values of row p, whose logits are read at row (the row
 * itself, or its staged copy), as vxent_grad takes them (scale: dloss / N). */
template <typename L>
static __device__ XentVal<L> vxent_one_row(const L *row, const int32_t *targets, float scale,
                                           int64_t p, int64_t nv, float *shf, double *shd,
                                           float *mx, double *s) {
  vxent_one_stats(row, nv, shf, shd, mx, s);
  return XentVal<L>{row, *mx, (float)(1.0 / *s) * scale, scale, nv, (int64_t)targets[p]};
}

/* Staging a row in shared memory (vxent_one_grad's staged form): the two
 * statistics and the gradient then read the row there, so HBM sees the
 * logits once and dlogits once -- not the three reads of the row above, of
 * which the second and third miss L2 as often as not (GPT-2: 8192 rows of
 * 100 KB, a few hundred in flight, L2 50 MB).  The copy sits at the row's own
 * address mod 16, so every read of it takes the 8-wide or the scalar path
 * (vec_cols) the row itself would: the same values summed in the same order,
 * the same bits.  The block's threads copy n elements from src to dst, 16
 * bytes a thread at a time where src is 16-byte aligned; the caller
 * synchronises. */
template <typename L> static __device__ L *staged_at(unsigned char *smem, const L *src) {
  return (L *)(void *)(smem + ((uintptr_t)src & 15));
}
template <typename L> static __device__ void stage_row(L *dst, const L *src, int64_t n) {
  int64_t done = 0;
  if (!((uintptr_t)src & 15)) {
    const int64_t chunks = n * (int64_t)sizeof(L) / 16;
    const int4 *from = (const int4 *)(const void *)src;
    int4 *to = (int4 *)(void *)dst;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < chunks; i += BLOCK) to[i] = from[i];
    done = chunks * 16 / (int64_t)sizeof(L);
  }
  for (int64_t v = done + threadIdx.x; v < n; v += BLOCK) dst[v] = src[v];
}

/* PARC_CUDA_XENT is `want` (the cross-entropy's forms kept for comparison) */
static bool xent_env(const char *want) {
  const char *e = getenv("PARC_CUDA_XENT");
  return e && !strcmp(e, want);
}

/* The dynamic shared memory a staged row of n elements of size `elem` takes:
 * the row at its address mod 16 (staged_at); 0 where it does not fit the
 * device's per-block limit beside the kernel's own reduction scratch, or
 * PARC_CUDA_XENT=unstaged asks for the rows read in place (the form before,
 * for gpu_ops_check's comparison). */
static size_t staged_bytes(RtCuda *c, int64_t n, size_t elem) {
  static int limit = -1; /* the device's opt-in limit, read once (every rank's GPU alike) */
  if (limit < 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device) !=
        cudaSuccess)
      v = 48 * 1024, (void)cudaGetLastError();
    limit = v;
  }
  size_t bytes = (size_t)n * elem + 16;
  if (xent_env("unstaged") || bytes + 1024 > (size_t)limit) return 0;
  return bytes;
}

/* Forward: the row losses, as vxent_sum writes them. */
template <typename L>
__global__ void __launch_bounds__(BLOCK) vxent_one_rows(double *rows, const L *logits,
                                                        const int32_t *targets, int64_t N,
                                                        int64_t Vl, int64_t nv) {
  __shared__ float shf[BLOCK / 32];
  __shared__ double shd[BLOCK / 32];
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    const L *row = logits + p * Vl;
    float mx;
    double s;
    vxent_one_stats(row, nv, shf, shd, &mx, &s);
    if (threadIdx.x == 0) {
      int64_t r = targets[p];
      float tl = r >= 0 && r < Vl ? logit(row, r) : 0.0f;
      rows[p] = (double)mx + log(s) - (double)tl;
    }
  }
}

/* Gradient, in place or not (as xent_grad: both reductions end in a barrier
 * before any write, then each thread reads only the elements it writes);
 * wide: dlogits as bf16 rows of 2 Vl (store_row_bf16's argument; L float).
 * staged: the row is read into the launch's dynamic shared memory first
 * (staged_bytes of it) and everything after reads it there; every read of
 * the row then precedes the barrier after the copy, and the barrier after
 * the row's stores keeps the next row's copy off the one still read. */
template <typename L, bool wide, bool staged>
__global__ void __launch_bounds__(BLOCK) vxent_one_grad(L *dlogits, const L *logits,
                                                        const int32_t *targets,
                                                        const float *dloss, int64_t N,
                                                        int64_t Vl, int64_t nv, double *rows) {
  __shared__ float shf[BLOCK / 32];
  __shared__ double shd[BLOCK / 32];
  extern __shared__ __align__(16) unsigned char xent_stage[];
  float scale = (float)((double)*dloss / (double)N);
  for (int64_t p = blockIdx.x; p < N; p += gridDim.x) {
    const L *row = logits + p * Vl;
    const double tl = target_logit(rows, row, targets[p], Vl); /* vxent_one_rows' */
    if (staged) {
      L *copy = staged_at(xent_stage, row);
      stage_row(copy, row, Vl); /* (the padding columns too: store_row's 8-wide reads) */
      __syncthreads();
      row = copy;
    }
    float mx;
    double s;
    XentVal<L> val = vxent_one_row(row, targets, scale, p, nv, shf, shd, &mx, &s);
    if (rows && threadIdx.x == 0) rows[p] = (double)mx + log(s) - tl;
    if (wide)
      store_row_bf16((__nv_bfloat16 *)(void *)dlogits + p * 2 * Vl, Vl, val);
    else
      store_row(dlogits + p * Vl, Vl, val);
    if (staged) __syncthreads();
  }
}

/* Launches vxent_one_grad, staged where the row fits (staged_bytes). */
template <typename L, bool wide>
static int vxent_one_grad_launch(RtCuda *c, const char *op, unsigned nb, L *dlogits,
                                 const L *logits, const int32_t *targets, const float *dloss,
                                 int64_t N, int64_t Vl, int64_t nv, double *rows) {
  size_t bytes = staged_bytes(c, Vl, sizeof(L));
  if (!bytes) {
    vxent_one_grad<L, wide, false><<<nb, BLOCK, 0, c->compute>>>(dlogits, logits, targets, dloss,
                                                                 N, Vl, nv, rows);
    LAUNCH_CHECK(c, op);
    return RT_OK;
  }
  if (bytes > 48 * 1024)
    CU_CHECK(c, cudaFuncSetAttribute(vxent_one_grad<L, wide, true>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
             op);
  vxent_one_grad<L, wide, true><<<nb, BLOCK, bytes, c->compute>>>(dlogits, logits, targets,
                                                                  dloss, N, Vl, nv, rows);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}

/* PARC_CUDA_XENT=gathered: one member takes the gathered path too. */
static bool xent_gathered(void) { return xent_env("gathered"); }

/* The forward (loss), the gradient (dlogits; as bf16 wide rows where
 * bf16out), or both (rt_cuda_cross_entropy_fused: the same bits as the two
 * calls).  L: the logits' and dlogits' element (bf16: both, dense). */
template <typename L>
static int vxent(RtCuda *c, const char *op, int group, float *loss, L *dlogits, const L *logits,
                 const int32_t *targets, const float *dloss, int64_t N, int64_t Vl, int64_t V,
                 int bf16out = 0) {
  if (!logits || !targets || (!loss && !dlogits) || (dlogits && !dloss))
    return rt_fail("%s: NULL pointer", op);
  int parts = c->gsize[group], part = c->grank[group];
  if (N < 1 || Vl < 1 || V < 1 || V > Vl * parts)
    return rt_fail("%s: vocabulary %lld outside [1, %lld], the group's columns", op,
                   (long long)V, (long long)(Vl * parts));
  int64_t nv = V - (int64_t)part * Vl;
  nv = nv < 0 ? 0 : nv > Vl ? Vl : nv;
  RtProfScope ps(c); /* logits, targets (and dlogits); the gathers' time included */
  if (ps.on())
    ps.set(RT_PROF_OP, (double)N * ((double)sizeof(L) * (dlogits ? 2 : 1) * (double)Vl + 4), 0,
           "%s %s", op, rt_cuda_group_name[group]);
  unsigned nb = row_blocks(N);
  if (parts == 1 && !xent_gathered()) { /* one member: no gathers (above) */
    double *rows = NULL;
    if (loss && !(rows = (double *)rt_cuda_ws(c, WS_ROWS, (size_t)N * sizeof(double))))
      return RT_ERR;
    if (!dlogits) {
      vxent_one_rows<L><<<nb, BLOCK, 0, c->compute>>>(rows, logits, targets, N, Vl, nv);
      LAUNCH_CHECK(c, op);
    } else if (bf16out ? vxent_one_grad_launch<L, true>(c, op, nb, dlogits, logits, targets,
                                                        dloss, N, Vl, nv, rows) /* (L float) */
                       : vxent_one_grad_launch<L, false>(c, op, nb, dlogits, logits, targets,
                                                         dloss, N, Vl, nv, rows)) {
      return RT_ERR;
    }
    if (loss) {
      mean_rows<<<1, BLOCK, 0, c->compute>>>(loss, rows, N);
      LAUNCH_CHECK(c, op);
    }
    return RT_OK;
  }
  /* rows workspace: mx [N], s [N] (double), row losses [N] (double), send [3N] */
  char *w = (char *)rt_cuda_ws(c, WS_ROWS, up256((size_t)N * 4) + 2 * up256((size_t)N * 8) +
                                               up256((size_t)N * 12));
  float *all = (float *)rt_cuda_ws(c, WS_GATHER, (size_t)(3 * N * parts) * 4);
  if (!w || !all) return RT_ERR;
  float *mx = (float *)w;
  double *s = (double *)(w + up256((size_t)N * 4));
  double *rows = (double *)((char *)s + up256((size_t)N * 8));
  float *send = (float *)((char *)rows + up256((size_t)N * 8));
  vxent_max<L><<<nb, BLOCK, 0, c->compute>>>(send, logits, N, Vl, nv);
  LAUNCH_CHECK(c, op);
  if (rt_cuda_all_gather(c, group, send, all, N)) return RT_ERR;
  /* vxent_stats reads the gathered maxima before the second gather overwrites
   * them: the gather is ordered after it on the stream (or by an event) */
  vxent_stats<L><<<nb, BLOCK, 0, c->compute>>>(send, mx, all, logits, targets, N, Vl, nv,
                                               (int64_t)part * Vl, parts);
  LAUNCH_CHECK(c, op);
  if (rt_cuda_all_gather(c, group, send, all, 3 * N)) return RT_ERR;
  vxent_sum<<<rt_cuda_blocks(N, BLOCK), BLOCK, 0, c->compute>>>(s, loss ? rows : NULL, all, mx,
                                                                 targets, N, Vl, parts);
  LAUNCH_CHECK(c, op);
  if (loss) {
    mean_rows<<<1, BLOCK, 0, c->compute>>>(loss, rows, N);
    LAUNCH_CHECK(c, op);
  }
  if (!dlogits) return RT_OK;
  if (bf16out) { /* (L float) */
    vxent_grad_bf16<<<nb, BLOCK, 0, c->compute>>>((__nv_bfloat16 *)(void *)dlogits,
                                                  (const float *)(const void *)logits, targets,
                                                  dloss, mx, s, N, Vl, nv, (int64_t)part * Vl);
    LAUNCH_CHECK(c, op);
  } else {
    vxent_grad<L><<<nb, BLOCK, 0, c->compute>>>(dlogits, logits, targets, dloss, mx, s, N, Vl,
                                                nv, (int64_t)part * Vl);
    LAUNCH_CHECK(c, op);
  }
  return RT_OK;
}

extern "C" int rt_cuda_vocab_cross_entropy(RtCuda *c, int group, float *loss, const float *logits,
                                           const int32_t *targets, int64_t N, int64_t Vl,
                                           int64_t V) {
  return vxent<float>(c, "vocab_cross_entropy", group, loss, NULL, logits, targets, NULL, N, Vl, V);
}

extern "C" int rt_cuda_vocab_cross_entropy_grad(RtCuda *c, int group, float *dlogits,
                                                const float *logits, const int32_t *targets,
                                                const float *dloss, int64_t N, int64_t Vl,
                                                int64_t V) {
  return vxent<float>(c, "vocab_cross_entropy_grad", group, NULL, dlogits, logits, targets,
                      dloss, N, Vl, V);
}

extern "C" int rt_cuda_vocab_cross_entropy_grad_bf16(RtCuda *c, int group, float *dlogits,
                                                     const float *logits, const int32_t *targets,
                                                     const float *dloss, int64_t N, int64_t Vl,
                                                     int64_t V) {
  return vxent<float>(c, "vocab_cross_entropy_grad_bf16", group, NULL, dlogits, logits, targets,
                      dloss, N, Vl, V, 1);
}

extern "C" int rt_cuda_vocab_cross_entropy_bf16(RtCuda *c, int group, float *loss,
                                                const float *logits, const int32_t *targets,
                                                int64_t N, int64_t Vl, int64_t V) {
  return vxent<bf16>(c, "vocab_cross_entropy_bf16", group, loss, NULL,
                     (const bf16 *)(const void *)logits, targets, NULL, N, Vl, V);
}

extern "C" int rt_cuda_vocab_cross_entropy_grad_bf16io(RtCuda *c, int group, float *dlogits,
                                                       const float *logits,
                                                       const int32_t *targets,
                                                       const float *dloss, int64_t N, int64_t Vl,
                                                       int64_t V) {
  return vxent<bf16>(c, "vocab_cross_entropy_grad_bf16io", group, NULL, (bf16 *)(void *)dlogits,
                     (const bf16 *)(const void *)logits, targets, dloss, N, Vl, V);
}

/* The forward and the gradient in one call (rt_cuda.h). */
extern "C" int rt_cuda_cross_entropy_fused(RtCuda *c, int group, unsigned io, float *loss,
                                           float *dlogits, const float *logits,
                                           const int32_t *targets, const float *dloss,
                                           int64_t N, int64_t Vl, int64_t V) {
  const char *op = group < 0 ? "cross_entropy_fused" : "vocab_cross_entropy_fused";
  if (io != 0 && io != RT_CUDA_XENT_BF16IO && io != RT_CUDA_XENT_BF16OUT)
    return rt_fail("%s: io flags 0x%x not understood", op, io);
  if (!loss) return rt_fail("%s: NULL loss pointer", op);
  const bf16 *lb = (const bf16 *)(const void *)logits;
  bf16 *db = (bf16 *)(void *)dlogits;
  if (group >= 0) {
    if (io == RT_CUDA_XENT_BF16IO)
      return vxent<bf16>(c, op, group, loss, db, lb, targets, dloss, N, Vl, V);
    return vxent<float>(c, op, group, loss, dlogits, logits, targets, dloss, N, Vl, V,
                        io == RT_CUDA_XENT_BF16OUT);
  }
  if (Vl != V) return rt_fail("%s: %lld columns a row for a vocabulary of %lld", op,
                              (long long)Vl, (long long)V);
  if (io == RT_CUDA_XENT_BF16IO) return xent_bwd(c, op, db, lb, targets, dloss, N, V, loss);
  if (io == RT_CUDA_XENT_BF16OUT)
    return xent_bwd_wide(c, op, dlogits, logits, targets, dloss, N, V, loss);
  return xent_bwd(c, op, dlogits, logits, targets, dloss, N, V, loss);
}

/* ---- routing: through the host and the CPU routines of rt_route.h ----
 * Each call waits for the compute stream, copies its inputs to host memory,
 * runs the CPU routine and copies the output back (synchronously). */

typedef struct {
  const void *dev;
  size_t bytes;
  void *host;
} Stage;

static int stage_in(RtCuda *c, Stage *s, int n, size_t out_bytes, void **out_host) {
  size_t total = out_bytes;
  for (int i = 0; i < n; i++) total += up256(s[i].bytes);
  char *h = (char *)rt_cuda_host_stage(c, total + 256);
  if (!h) return RT_ERR;
  for (int i = 0; i < n; i++) {
    s[i].host = h;
    CU_CHECK(c, cudaMemcpyAsync(h, s[i].dev, s[i].bytes, cudaMemcpyDeviceToHost, c->compute),
             "routing: stage inputs");
    h += up256(s[i].bytes);
  }
  *out_host = h;
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "routing: stage inputs");
  return RT_OK;
}

static int stage_out(RtCuda *c, void *dev, const void *host, size_t bytes) {
  CU_CHECK(c, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->compute),
           "routing: unstage the output");
  CU_CHECK(c, cudaStreamSynchronize(c->compute), "routing: unstage the output");
  return RT_OK;
}

#define F4(n) ((size_t)(n) * 4)
/* The profile's record of a host-staged op: the bytes staged in and out. */
#define PROF_HOST(name, bytes)                                                              \
  RtProfScope ps(c);                                                                        \
  if (ps.on()) ps.set(RT_PROF_HOST, (double)(bytes), 0, "%s", name)

extern "C" int rt_cuda_topk(RtCuda *c, int32_t *out, const float *x, int64_t rows, int64_t n,
                            int64_t k) {
  PROF_HOST("topk (host)", F4(rows * n) + F4(rows * k));
  Stage s[1] = {{x, F4(rows * n), NULL}};
  void *o;
  if (stage_in(c, s, 1, F4(rows * k), &o) ||
      rt_topk((int32_t *)o, (const float *)s[0].host, rows, n, k))
    return RT_ERR;
  return stage_out(c, out, o, F4(rows * k));
}

extern "C" int rt_cuda_gather(RtCuda *c, float *out, const float *x, const int32_t *idx,
                              int64_t rows, int64_t n, int64_t k) {
  PROF_HOST("gather (host)", F4(rows * n) + F4(rows * k) * 2);
  Stage s[2] = {{x, F4(rows * n), NULL}, {idx, F4(rows * k), NULL}};
  void *o;
  if (stage_in(c, s, 2, F4(rows * k), &o) ||
      rt_gather((float *)o, (const float *)s[0].host, (const int32_t *)s[1].host, rows, n, k))
    return RT_ERR;
  return stage_out(c, out, o, F4(rows * k));
}

extern "C" int rt_cuda_scatter_add(RtCuda *c, float *out, const int32_t *idx, const float *dy,
                                   int64_t rows, int64_t k, int64_t n) {
  PROF_HOST("scatter_add (host)", F4(rows * k) * 2 + F4(rows * n));
  Stage s[2] = {{idx, F4(rows * k), NULL}, {dy, F4(rows * k), NULL}};
  void *o;
  if (stage_in(c, s, 2, F4(rows * n), &o) ||
      rt_scatter_add((float *)o, (const int32_t *)s[0].host, (const float *)s[1].host, rows, k, n))
    return RT_ERR;
  return stage_out(c, out, o, F4(rows * n));
}

extern "C" int rt_cuda_onehot(RtCuda *c, float *out, const int32_t *idx, int64_t count,
                              int64_t n) {
  PROF_HOST("onehot (host)", F4(count) + F4(count * n));
  Stage s[1] = {{idx, F4(count), NULL}};
  void *o;
  if (stage_in(c, s, 1, F4(count * n), &o) ||
      rt_onehot((float *)o, (const int32_t *)s[0].host, count, n))
    return RT_ERR;
  return stage_out(c, out, o, F4(count * n));
}

extern "C" int rt_cuda_dispatch(RtCuda *c, float *out, const float *x, const int32_t *idx,
                                int64_t N, int64_t K, int64_t D, int64_t E, int64_t C) {
  PROF_HOST("dispatch (host)", F4(N * D) + F4(N * K) + F4(E * C * D));
  Stage s[2] = {{x, F4(N * D), NULL}, {idx, F4(N * K), NULL}};
  void *o;
  if (stage_in(c, s, 2, F4(E * C * D), &o) ||
      rt_dispatch((float *)o, (const float *)s[0].host, (const int32_t *)s[1].host, N, K, D, E, C))
    return RT_ERR;
  return stage_out(c, out, o, F4(E * C * D));
}

extern "C" int rt_cuda_combine(RtCuda *c, float *out, const float *y, const int32_t *idx,
                               const float *w, int64_t N, int64_t K, int64_t D, int64_t E,
                               int64_t C) {
  PROF_HOST("combine (host)", F4(E * C * D) + 2 * F4(N * K) + F4(N * D));
  Stage s[3] = {{y, F4(E * C * D), NULL}, {idx, F4(N * K), NULL}, {w, F4(N * K), NULL}};
  void *o;
  if (stage_in(c, s, 3, F4(N * D), &o) ||
      rt_combine((float *)o, (const float *)s[0].host, (const int32_t *)s[1].host,
                 (const float *)s[2].host, N, K, D, E, C))
    return RT_ERR;
  return stage_out(c, out, o, F4(N * D));
}

extern "C" int rt_cuda_combine_grad_y(RtCuda *c, float *dy, const float *dout, const int32_t *idx,
                                      const float *w, int64_t N, int64_t K, int64_t D, int64_t E,
                                      int64_t C) {
  PROF_HOST("combine_grad_y (host)", F4(N * D) + 2 * F4(N * K) + F4(E * C * D));
  Stage s[3] = {{dout, F4(N * D), NULL}, {idx, F4(N * K), NULL}, {w, F4(N * K), NULL}};
  void *o;
  if (stage_in(c, s, 3, F4(E * C * D), &o) ||
      rt_combine_grad_y((float *)o, (const float *)s[0].host, (const int32_t *)s[1].host,
                        (const float *)s[2].host, N, K, D, E, C))
    return RT_ERR;
  return stage_out(c, dy, o, F4(E * C * D));
}

extern "C" int rt_cuda_combine_grad_w(RtCuda *c, float *dw, const float *dout, const float *y,
                                      const int32_t *idx, int64_t N, int64_t K, int64_t D,
                                      int64_t E, int64_t C) {
  PROF_HOST("combine_grad_w (host)", F4(N * D) + F4(E * C * D) + 2 * F4(N * K));
  Stage s[3] = {{dout, F4(N * D), NULL}, {y, F4(E * C * D), NULL}, {idx, F4(N * K), NULL}};
  void *o;
  if (stage_in(c, s, 3, F4(N * K), &o) ||
      rt_combine_grad_w((float *)o, (const float *)s[0].host, (const float *)s[1].host,
                        (const int32_t *)s[2].host, N, K, D, E, C))
    return RT_ERR;
  return stage_out(c, dw, o, F4(N * K));
}

/* The drops are decided in global order over the dp group: the host routine
 * runs on the harness's host group (every dp member calls this). */
extern "C" int rt_cuda_capacity_drop(RtCuda *c, int32_t *out, const int32_t *idx, int64_t N,
                                     int64_t K, int64_t E, int64_t C) {
  PROF_HOST("capacity_drop (host)", 2 * F4(N * K));
  Stage s[1] = {{idx, F4(N * K), NULL}};
  void *o;
  if (stage_in(c, s, 1, F4(N * K), &o) ||
      rt_capacity_drop(c->hgroup[RT_CUDA_DP], (int32_t *)o, (const int32_t *)s[0].host, N, K, E, C))
    return RT_ERR;
  return stage_out(c, out, o, F4(N * K));
}

/* ---- expert parallelism: staged through the host and rt_expert_all_to_all
 * over the harness's group (collective: every member calls it).  x and out
 * are both E C inner floats ([E, C, inner] one side, [El, size C, inner] the
 * other, El size = E). ---- */
extern "C" int rt_cuda_expert_all_to_all(RtCuda *c, int group, float *out, const float *x,
                                         const int32_t *idx, int64_t nk, int64_t E, int64_t C,
                                         int64_t inner, int back) {
  int64_t n = E * C * inner;
  RtProfScope ps(c); /* x and idx out, out back: the host's all-to-all in between */
  if (ps.on())
    ps.set(RT_PROF_HOST, (double)(F4(2 * n) + F4(nk)), 0, "expert_all_to_all %s%s",
           rt_cuda_group_name[group], back ? " back" : "");
  Stage s[2] = {{x, F4(n), NULL}, {idx, F4(nk), NULL}};
  void *o;
  if (stage_in(c, s, 2, F4(n), &o) ||
      rt_expert_all_to_all(c->hgroup[group], (float *)o, (const float *)s[0].host,
                           (const int32_t *)s[1].host, nk, E, C, inner, back))
    return RT_ERR;
  return stage_out(c, out, o, F4(n));
}
