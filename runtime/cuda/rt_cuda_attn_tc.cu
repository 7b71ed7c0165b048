/* runtime/cuda/rt_cuda_attn_tc.cu -- flash attention on tensor cores (bf16
 * products, fp32 accumulation and softmax), forward and backward, for the
 * bf16 GEMM mode (RtCuda.gemm == RT_CUDA_GEMM_BF16).  Same semantics and
 * layouts as rt_cuda_attn.cu (rt_attention.h): q, dy, out [B, H, T, hd], k, v
 * [B, KV, T, hd], query head h reads kv head h / (H / KV), lse [B, H, T]
 * (natural log of the sum of exp of the scaled scores), dqkv [B, H + 2 KV, T,
 * hd] holding dq, dk, dv.  rt_cuda_attn.cu calls these when rt_cuda_attn_tc()
 * says so: gemm mode bf16, hd a multiple of 16 up to 128, a GPU of compute
 * capability 8.0 or more, and PARC_CUDA_ATTN is not "fp32" (which keeps the
 * fp32 kernels, for comparison).  The fp32 mode never comes here.  This file's
 * WMMA kernels run with PARC_CUDA_ATTN=wmma; by default tc_run hands the
 * forward and the backward (after tc_fwd's statistics, when the caller kept
 * none) to rt_cuda_attn_mma.cu's, which keep the score tiles in registers.
 *
 * Precision: q, k, v, dy are rounded to bf16 when a tile is copied into shared
 * memory; the probabilities p and the score gradients ds are rounded to bf16
 * as the A operands of the second products.  Every product accumulates in
 * fp32 (WMMA 16x16x16 bf16 fragments, fp32 accumulators); the softmax, its row
 * statistics (max, sum, lse, D) and exp run in fp32 (exp2f of log2e-scaled
 * scores).  Expect ~1e-2 relative to the fp32 kernels, not 1e-5.
 *
 * Mapping.  A block is 4 warps (128 threads); tiles are 64 rows; a warp owns
 * 16 rows of its block's tile.  Tiles of q, k, v, dy sit in shared memory as
 * bf16 [64][hd + 8] (the pad staggers banks; rows past T are zeros).  A warp's
 * 16 x 64 fp32 product tile is stored from the accumulator fragments to its
 * own shared scratch (row-major), where lane L owns row L / 2 and the 32
 * columns 4 i + 2 (L % 2) + {0, 1}, i < 16 (16 x QT and QT / 2 columns in
 * tc_bwd_kv; the pair of lanes of a row combines row statistics with one
 * shuffle); that is where masking, scale, exp and the online softmax happen,
 * so no fragment layout is assumed anywhere.
 *
 *   tc_fwd     grid (T / 64 query tiles, B H); the tiles run last to first
 *              (causal: the longest first).  Streams key/value tiles j0 = 0,
 *              64, ... up to the end (causal: up to and including the diagonal
 *              tile; later tiles are fully masked and skipped).  Per tile, warp
 *              w: S = Q_w K^T (16 x 64), masked (key >= T; causal key > row)
 *              to -inf; m' = max(m, rowmax S), p = exp2(S - m'), l = l a + sum
 *              p with a = exp2(m - m'); then O_w = a O_w + P V, the product
 *              P V (16 x hd) going through the scratch into the lane's row of
 *              O held in registers (hd / 2 floats: the same lane mapping over hd
 *              columns).  out = O / l; lse = (m + log2 l) ln 2.  With STATS
 *              it writes lse and D = dy . out per row to the workspace instead
 *              of out: the backward's first kernel, only when the caller has
 *              kept neither lse and D nor the forward's out and lse (the
 *              trainers keep lse and give D from rt_cuda_sdpa_delta, or keep
 *              out and rt_cuda_attn.cu's attn_rowdot computes D from it; then
 *              the backward is the two kernels below).
 *   tc_bwd_kv  grid (T / 64 key tiles, B KV): dk, dv of 64 keys of one kv head,
 *              over every query of its H / KV query heads in tiles of QT rows
 *              (64; 16 for hd > 64, to stay within registers), causal: from
 *              the key tile's first row on; heads, then tiles ascending.  Warp
 *              w owns keys k0 + 16 w ..: S^T = K_w Q^T (16 x QT), p = exp2(S^T -
 *              lse) (masked: query >= T, key >= T, causal key > query: 0),
 *              dP^T = V_w dY^T, ds = p (dP^T - D); dV_w += P^T dY, dK_w +=
 *              dS^T Q in accumulator fragments held across the whole loop;
 *              dk = scale dK.  Its scratch rows hold S^T, overwritten in place
 *              by p (fp32), in columns [0, QT) and dP^T in [QT, 2 QT).
 *   tc_bwd_q   grid (T / 64 query tiles, B H): dq of 64 query rows, streaming
 *              key tiles as tc_fwd: S (then p) and dP = dY_w V^T side by side
 *              in the scratch, ds as above, dQ_w += dS K; dq = scale dQ.
 * Every output element is written by one lane of one block, after a fixed
 * sequence of sums: no atomics, results reproducible run to run.
 *
 * Invariants the code relies on: tiles start at multiples of 64, so causal
 * masking is only ever partial in the diagonal tile; every query row sees key
 * 0 in the first key tile (and, causal, its own key in the diagonal one), so a
 * row's running max is finite from the first tile on and l > 0 at the end for
 * every row < T (the -inf guards below are for safety only); rows >= T are
 * computed on zero inputs and never written (and masked out of dk, dv);
 * masked probabilities are exactly 0, so they add nothing to l, dV or dK.
 * Synchronisation: __syncthreads around every tile copy (all loops are
 * block-uniform); __syncwarp between a warp's fragment stores to its scratch
 * and its lanes' reads, and between its lanes' writes of P / dS and the
 * fragment loads that read them.  Shared memory (TcShape): forward 3 tiles
 * + P + fp32 scratch 64 x max(64, hd) (hd 64: 53 KiB, hd 128: 93 KiB); dk, dv
 * 2 key tiles + 2 query tiles + P + dS + scratch 64 x 2 QT + lse, D (87.5 /
 * 57.6 KiB); dq 4 tiles + dS + scratch 64 x 128 + lse, D (78.5 / 110.5 KiB):
 * two blocks fit an SM (__launch_bounds__ promises ptxas two, i.e. up to 255
 * registers; no instantiation spills with nvcc 13.0, sm_80 or sm_90). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <mma.h>

#include "runtime/cuda/rt_cuda_attn_tile.h"
#include "runtime/cuda/rt_cuda_impl.h"

using namespace nvcuda;

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragBRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBCol;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

#define TC_THREADS 128            /* 4 warps */
/* Blocks per SM promised to ptxas: 2 lets it use up to 255 registers a thread.
 * Without it ptxas aims at higher occupancy and spills a few bytes in several
 * instantiations (nvcc 13.0); with it none spills. */
#define TC_MIN_BLOCKS 2
#define TC_TILE 64                /* rows of a query or key tile; 16 per warp */
#define TC_LDP (TC_TILE + 8)      /* bf16 row stride of P, dS */
#define TC_LDS (2 * TC_TILE + 4)  /* fp32 row stride of tc_bwd_q's scratch: S, dP */
#define TC_FULL 0xffffffffu
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

/* bf16 WMMA needs sm_80: for older targets the kernels compile empty (the host
 * never launches them there: rt_cuda_attn_tc checks the device). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TC_NO_MMA 1
#endif

struct TcArgs {
  const float *q, *k, *v, *dy;
  float *out, *lse;       /* forward (lse may be NULL) */
  float *st_lse, *st_d;   /* backward statistics: [B, H, T] each (st_lse only read when
                             the caller passed the forward's: tc_fwd<.., true> is not run) */
  float *dqkv;
  int64_t H, KV;
  int T;
  float scale;
  int causal;
  bool otok, dytok; /* out / dqkv token-major, dy token-major (RT_CUDA_ATTN_*_TOKENS) */
  bool qkvtok;      /* q, k, v packed token-major (RT_CUDA_ATTN_QKV_TOKENS) */
};

/* row 0 of operand j's (0 q, 1 k, 2 v) head h in batch b (rt_attn_in), and
 * the operands' row stride */
static __device__ __forceinline__ const float *tc_in(const TcArgs &a, int j, int64_t b,
                                                     int64_t h, int hd) {
  return (j == 0 ? a.q : j == 1 ? a.k : a.v) + rt_attn_in(a.qkvtok, j, b, h, a.H, a.KV, a.T, hd);
}
static __device__ __forceinline__ int tc_in_ld(const TcArgs &a, int hd) {
  return rt_attn_in_ld(a.qkvtok, a.H, a.KV, hd);
}

/* Strides (elements) and dynamic shared memory (bytes) of the kernels.  The
 * regions are laid out in the order below, each but the last (lse, D) a
 * multiple of 128 bytes long: every region WMMA reads or writes starts
 * 128-byte aligned (it needs 32). */
template <int HD> struct TcShape {
  static constexpr size_t H2 = sizeof(bf16), F4 = sizeof(float);
  static constexpr int LDH = HD + 8;                           /* q, k, v, dy tiles (bf16) */
  static constexpr int SW = (HD > TC_TILE ? HD : TC_TILE) + 4; /* tc_fwd's scratch (fp32) */
  static constexpr int QT = HD > 64 ? 16 : TC_TILE;            /* tc_bwd_kv's query tile */
  static constexpr int LDQ = QT + 8;                           /* its P, dS (bf16) */
  static constexpr int LDX = 2 * QT + 4;                       /* its scratch (fp32) */
  static constexpr size_t TILE = TC_TILE * LDH * H2;
  static constexpr size_t fwd = 3 * TILE + TC_TILE * TC_LDP * H2 + TC_TILE * SW * F4;
  static constexpr size_t kv = 2 * TILE + 2 * QT * LDH * H2 + 2 * TC_TILE * LDQ * H2 +
                               TC_TILE * LDX * F4 + 2 * QT * F4;
  static constexpr size_t dq = 4 * TILE + TC_TILE * TC_LDP * H2 + TC_TILE * TC_LDS * F4 +
                               2 * TC_TILE * F4;
};

/* rows [r0, r0 + ROWS) of a [T, HD] fp32 matrix of row stride ld as a bf16 tile
 * (rt_cuda_attn_tile.h) */
template <int HD, int ROWS = TC_TILE, int UNROLL = 0>
static __device__ __forceinline__ void tc_load(bf16 *dst, const float *src, int r0, int T,
                                               int ld = HD) {
  rt_attn_tile_load<HD, ROWS, TC_THREADS, UNROLL>(dst, src, r0, T, ld);
}

/* One warp: sc[16][N] (row stride ld, fp32) = A B^T, A the 16 rows at a and
 * B the N rows at bm, both bf16 [.][HD] of row stride HD + 8. */
template <int HD, int N = TC_TILE>
static __device__ __forceinline__ void tc_scores(float *sc, int ld, const bf16 *a,
                                                 const bf16 *bm) {
  constexpr int LDH = HD + 8;
  FragC s[N / 16];
#pragma unroll
  for (int n = 0; n < N / 16; n++) wmma::fill_fragment(s[n], 0.0f);
#pragma unroll 2 /* full unrolling hoists every fragment load: register spills */
  for (int kk = 0; kk < HD / 16; kk++) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, LDH);
#pragma unroll
    for (int n = 0; n < N / 16; n++) {
      FragBCol fb; /* B^T(d, j) = bm[j][d]: column-major with stride LDH */
      wmma::load_matrix_sync(fb, bm + n * 16 * LDH + kk * 16, LDH);
      wmma::mma_sync(s[n], fa, fb, s[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < N / 16; n++) wmma::store_matrix_sync(sc + n * 16, s[n], ld, wmma::mem_row_major);
}

/* Forward (STATS false: out, lse) or the backward's statistics (STATS true:
 * st_lse, st_d) of query rows [q0, q0 + 64) of head (b, h). */
template <int HD, bool STATS>
__global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS) tc_fwd(TcArgs a) {
#ifndef TC_NO_MMA
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int LDH = TcShape<HD>::LDH, SW = TcShape<HD>::SW;
  bf16 *qs = (bf16 *)tc_smem, *ks = qs + TC_TILE * LDH, *vs = ks + TC_TILE * LDH;
  bf16 *ps = vs + TC_TILE * LDH;
  float *sc = (float *)(ps + TC_TILE * TC_LDP);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int T = a.T, q0 = (int)(gridDim.x - 1 - blockIdx.x) * TC_TILE, row = q0 + w * 16 + r;
  const int64_t bh = blockIdx.y, b = bh / a.H, g = bh % a.H / (a.H / a.KV);
  const float *kh = tc_in(a, 1, b, g, HD), *vh = tc_in(a, 2, b, g, HD);
  const int ld = tc_in_ld(a, HD);
  bf16 *pw = ps + w * 16 * TC_LDP;
  float *scw = sc + w * 16 * SW, *srow = scw + r * SW;
  const float sl2 = a.scale * TC_LOG2E;
  tc_load<HD>(qs, tc_in(a, 0, b, bh % a.H, HD), q0, T, ld);
  float m = -INFINITY, l = 0.0f, o[HD / 2]; /* o[2i], o[2i+1]: columns 4i + 2 half + {0, 1} */
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
  const int kend = a.causal && q0 + TC_TILE < T ? q0 + TC_TILE : T; /* keys [0, kend) */
  for (int j0 = 0; j0 < kend; j0 += TC_TILE) {
    __syncthreads(); /* the previous tile is consumed (the first time: nothing) */
    tc_load<HD>(ks, kh, j0, T, ld);
    tc_load<HD>(vs, vh, j0, T, ld);
    __syncthreads(); /* the tiles (and, the first time, qs) are in */
    tc_scores<HD>(scw, SW, qs + w * 16 * LDH, ks);
    __syncwarp();
    float x[32], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int c = 4 * i + 2 * half, j = j0 + c;
      const float2 s2 = *(const float2 *)(srow + c);
      x[2 * i] = j < T && (!a.causal || j <= row) ? s2.x * sl2 : -INFINITY;
      x[2 * i + 1] = j + 1 < T && (!a.causal || j + 1 <= row) ? s2.y * sl2 : -INFINITY;
      mx = fmaxf(mx, fmaxf(x[2 * i], x[2 * i + 1]));
    }
    mx = fmaxf(mx, __shfl_xor_sync(TC_FULL, mx, 1));
    const float mn = fmaxf(m, mx), base = mn == -INFINITY ? 0.0f : mn;
    const float alpha = exp2f(m - base); /* 0 while m is -inf */
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int c = 4 * i + 2 * half;
      const float p0 = exp2f(x[2 * i] - base), p1 = exp2f(x[2 * i + 1] - base);
      sum += p0 + p1;
      *(__nv_bfloat162 *)(pw + r * TC_LDP + c) = __floats2bfloat162_rn(p0, p1);
    }
    sum += __shfl_xor_sync(TC_FULL, sum, 1);
    l = l * alpha + sum;
    m = mn;
    __syncwarp(); /* P is written, S is read: the scratch takes P V */
#pragma unroll
    for (int n = 0; n < HD / 16; n++) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < TC_TILE / 16; kk++) {
        FragA fa;
        FragBRow fb;
        wmma::load_matrix_sync(fa, pw + kk * 16, TC_LDP);
        wmma::load_matrix_sync(fb, vs + kk * 16 * LDH + n * 16, LDH);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(scw + n * 16, acc, SW, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < HD / 4; i++) {
      const float2 t = *(const float2 *)(srow + 4 * i + 2 * half);
      o[2 * i] = o[2 * i] * alpha + t.x;
      o[2 * i + 1] = o[2 * i + 1] * alpha + t.y;
    }
  }
  /* the warp's rows of out = O / l through the scratch, then out coalesced */
  __syncwarp();
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < HD / 4; i++)
    *(float2 *)(srow + 4 * i + 2 * half) = make_float2(o[2 * i] * inv, o[2 * i + 1] * inv);
  __syncwarp();
  const int wrow = q0 + w * 16;
  const float lse2 = m + log2f(l); /* log2 of the row's sum (valid rows: l > 0) */
  if (!STATS) {
    const int64_t obase = rt_attn_row(a.otok, b, bh % a.H, a.H, wrow, T, HD);
    const int ld = rt_attn_ld(a.otok, a.H, HD);
    for (int e = lane; e < 16 * HD; e += 32) {
      const int rr = e / HD, cc = e % HD;
      if (wrow + rr < T) a.out[obase + (int64_t)rr * ld + cc] = scw[rr * SW + cc];
    }
    if (a.lse && half == 0 && row < T) a.lse[bh * T + row] = lse2 * TC_LN2;
  } else {
    const int64_t ybase = rt_attn_row(a.dytok, b, bh % a.H, a.H, wrow, T, HD);
    const int ld = rt_attn_ld(a.dytok, a.H, HD);
    for (int e = lane; e < 16 * HD; e += 32) {
      const int rr = e / HD, cc = e % HD;
      if (wrow + rr < T) scw[rr * SW + cc] *= a.dy[ybase + (int64_t)rr * ld + cc];
    }
    __syncwarp();
    float dd = 0.0f;
#pragma unroll
    for (int i = 0; i < HD / 4; i++) {
      const float2 t = *(const float2 *)(srow + 4 * i + 2 * half);
      dd += t.x + t.y;
    }
    dd += __shfl_xor_sync(TC_FULL, dd, 1);
    if (half == 0 && row < T) {
      a.st_lse[bh * T + row] = lse2 * TC_LN2;
      a.st_d[bh * T + row] = dd;
    }
  }
#endif
}

/* dk, dv of keys [k0, k0 + 64) of kv head (b, g), streaming query tiles of
 * QT rows (TcShape: 64, or 16 for hd > 64, where the dk, dv accumulators take
 * hd registers a lane and wider score tiles made ptxas spill). */
template <int HD>
__global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS) tc_bwd_kv(TcArgs a) {
#ifndef TC_NO_MMA
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int LDH = TcShape<HD>::LDH, QT = TcShape<HD>::QT, LDQ = TcShape<HD>::LDQ;
  constexpr int LDX = TcShape<HD>::LDX;
  bf16 *ks = (bf16 *)tc_smem, *vs = ks + TC_TILE * LDH, *qs = vs + TC_TILE * LDH;
  bf16 *dys = qs + QT * LDH, *ps = dys + QT * LDH, *dss = ps + TC_TILE * LDQ;
  float *sc = (float *)(dss + TC_TILE * LDQ), *ls = sc + TC_TILE * LDX, *ds_ = ls + QT;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int T = a.T, k0 = (int)blockIdx.x * TC_TILE, u = k0 + w * 16 + r; /* the lane's key */
  const int64_t bg = blockIdx.y, b = bg / a.KV, g = bg % a.KV, rep = a.H / a.KV;
  const int64_t C = a.H + 2 * a.KV;
  bf16 *pw = ps + w * 16 * LDQ, *dsw = dss + w * 16 * LDQ;
  float *scw = sc + w * 16 * LDX, *srow = scw + r * LDX;
  const float sl2 = a.scale * TC_LOG2E;
  const int ld = tc_in_ld(a, HD);
  tc_load<HD>(ks, tc_in(a, 1, b, g, HD), k0, T, ld);
  tc_load<HD>(vs, tc_in(a, 2, b, g, HD), k0, T, ld);
  FragC dk[HD / 16], dv[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int i_begin = a.causal ? k0 : 0; /* causal: earlier queries see none of these keys */
  for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
    const int64_t bh = b * a.H + h;
    const float *qh = tc_in(a, 0, b, h, HD), *dyh = a.dy + rt_attn_row(a.dytok, b, h, a.H, 0, T, HD);
    for (int i0 = i_begin; i0 < T; i0 += QT) {
      __syncthreads(); /* the previous query tile is consumed */
      /* (two calls: a run-time row stride in the one load made ptxas spill at hd 64;
       * packed, one load at a time, or it spills on sm_80) */
      if (a.qkvtok) tc_load<HD, QT, 1>(qs, qh, i0, T, ld);
      else tc_load<HD, QT>(qs, qh, i0, T);
      if (a.dytok) tc_load<HD, QT>(dys, dyh, i0, T, (int)a.H * HD);
      else tc_load<HD, QT>(dys, dyh, i0, T);
      if (threadIdx.x < QT) {
        const int i = i0 + threadIdx.x;
        ls[threadIdx.x] = i < T ? a.st_lse[bh * T + i] * TC_LOG2E : 0.0f;
        ds_[threadIdx.x] = i < T ? a.st_d[bh * T + i] : 0.0f;
      }
      __syncthreads(); /* the tiles (and, the first time, ks, vs) are in */
      tc_scores<HD, QT>(scw, LDX, ks + w * 16 * LDH, qs); /* S^T: keys x queries */
      __syncwarp();
      /* scratch columns [0, QT): S^T, replaced (each lane its own) by p in fp32 */
#pragma unroll
      for (int i = 0; i < QT / 4; i++) {
        const int c = 4 * i + 2 * half, iq = i0 + c; /* queries iq, iq + 1 */
        const float2 s2 = *(const float2 *)(srow + c);
        const float p0 = iq < T && u < T && (!a.causal || u <= iq) ? exp2f(s2.x * sl2 - ls[c]) : 0.0f;
        const float p1 = iq + 1 < T && u < T && (!a.causal || u <= iq + 1)
                             ? exp2f(s2.y * sl2 - ls[c + 1]) : 0.0f;
        *(float2 *)(srow + c) = make_float2(p0, p1);
        *(__nv_bfloat162 *)(pw + r * LDQ + c) = __floats2bfloat162_rn(p0, p1);
      }
      /* columns [QT, 2 QT): dP^T = V_w dY^T (no lane reads or writes them above) */
      tc_scores<HD, QT>(scw + QT, LDX, vs + w * 16 * LDH, dys);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < QT / 4; i++) {
        const int c = 4 * i + 2 * half;
        const float2 p2 = *(const float2 *)(srow + c), d2 = *(const float2 *)(srow + QT + c);
        *(__nv_bfloat162 *)(dsw + r * LDQ + c) =
            __floats2bfloat162_rn(p2.x * (d2.x - ds_[c]), p2.y * (d2.y - ds_[c + 1]));
      }
      __syncwarp(); /* P^T, dS^T are written */
#pragma unroll
      for (int kk = 0; kk < QT / 16; kk++) {
        FragA fp, fs;
        wmma::load_matrix_sync(fp, pw + kk * 16, LDQ);
        wmma::load_matrix_sync(fs, dsw + kk * 16, LDQ);
#pragma unroll
        for (int n = 0; n < HD / 16; n++) {
          FragBRow fb;
          wmma::load_matrix_sync(fb, dys + kk * 16 * LDH + n * 16, LDH);
          wmma::mma_sync(dv[n], fp, fb, dv[n]);
          wmma::load_matrix_sync(fb, qs + kk * 16 * LDH + n * 16, LDH);
          wmma::mma_sync(dk[n], fs, fb, dk[n]);
        }
      }
    }
  }
  /* out: 16-column slabs of dk (scratch columns 0..15) and dv (16..31) */
  float *dkg = a.dqkv + rt_attn_row(a.otok, b, a.H + g, C, 0, T, HD);
  float *dvg = a.dqkv + rt_attn_row(a.otok, b, a.H + a.KV + g, C, 0, T, HD);
  const int ldo = rt_attn_ld(a.otok, C, HD);
  const int wkey = k0 + w * 16;
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    __syncwarp(); /* the scratch's last readers are done */
    wmma::store_matrix_sync(scw, dk[n], LDX, wmma::mem_row_major);
    wmma::store_matrix_sync(scw + 16, dv[n], LDX, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int rr = e >> 4, cc = e & 15;
      if (wkey + rr < T) {
        const int64_t at = (int64_t)(wkey + rr) * ldo + n * 16 + cc;
        dkg[at] = a.scale * scw[rr * LDX + cc];
        dvg[at] = scw[rr * LDX + 16 + cc];
      }
    }
  }
#endif
}

/* dq of query rows [q0, q0 + 64) of head (b, h). */
template <int HD>
__global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS) tc_bwd_q(TcArgs a) {
#ifndef TC_NO_MMA
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int LDH = TcShape<HD>::LDH;
  bf16 *qs = (bf16 *)tc_smem, *dys = qs + TC_TILE * LDH, *ks = dys + TC_TILE * LDH;
  bf16 *vs = ks + TC_TILE * LDH, *dss = vs + TC_TILE * LDH;
  float *sc = (float *)(dss + TC_TILE * TC_LDP), *ls = sc + TC_TILE * TC_LDS, *ds_ = ls + TC_TILE;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int T = a.T, q0 = (int)(gridDim.x - 1 - blockIdx.x) * TC_TILE, row = q0 + w * 16 + r;
  const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  const int64_t C = a.H + 2 * a.KV;
  const float *kh = tc_in(a, 1, b, g, HD), *vh = tc_in(a, 2, b, g, HD);
  const int ld = tc_in_ld(a, HD);
  bf16 *dsw = dss + w * 16 * TC_LDP;
  float *scw = sc + w * 16 * TC_LDS, *srow = scw + r * TC_LDS;
  const float sl2 = a.scale * TC_LOG2E;
  tc_load<HD>(qs, tc_in(a, 0, b, h, HD), q0, T, ld);
  tc_load<HD>(dys, a.dy + rt_attn_row(a.dytok, b, h, a.H, 0, T, HD), q0, T,
              rt_attn_ld(a.dytok, a.H, HD));
  if (threadIdx.x < TC_TILE) {
    const int i = q0 + threadIdx.x;
    ls[threadIdx.x] = i < T ? a.st_lse[bh * T + i] * TC_LOG2E : 0.0f;
    ds_[threadIdx.x] = i < T ? a.st_d[bh * T + i] : 0.0f;
  }
  FragC dq[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
  const int kend = a.causal && q0 + TC_TILE < T ? q0 + TC_TILE : T;
  for (int j0 = 0; j0 < kend; j0 += TC_TILE) {
    __syncthreads(); /* the previous key tile is consumed */
    tc_load<HD>(ks, kh, j0, T, ld);
    tc_load<HD>(vs, vh, j0, T, ld);
    __syncthreads(); /* the tiles (and, the first time, qs, dys, ls, ds_) are in */
    const float lr = ls[w * 16 + r], dr = ds_[w * 16 + r];
    tc_scores<HD>(scw, TC_LDS, qs + w * 16 * LDH, ks); /* S = Q_w K^T */
    __syncwarp();
    /* scratch columns [0, 64): S, replaced (each lane its own) by p in fp32 */
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int c = 4 * i + 2 * half, j = j0 + c; /* keys j, j + 1 */
      const float2 s2 = *(const float2 *)(srow + c);
      const float p0 = row < T && j < T && (!a.causal || j <= row) ? exp2f(s2.x * sl2 - lr) : 0.0f;
      const float p1 = row < T && j + 1 < T && (!a.causal || j + 1 <= row)
                           ? exp2f(s2.y * sl2 - lr) : 0.0f;
      *(float2 *)(srow + c) = make_float2(p0, p1);
    }
    /* columns [64, 128): dP = dY_w V^T (no lane reads or writes them above) */
    tc_scores<HD>(scw + TC_TILE, TC_LDS, dys + w * 16 * LDH, vs);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int c = 4 * i + 2 * half;
      const float2 p2 = *(const float2 *)(srow + c), d2 = *(const float2 *)(srow + TC_TILE + c);
      *(__nv_bfloat162 *)(dsw + r * TC_LDP + c) =
          __floats2bfloat162_rn(p2.x * (d2.x - dr), p2.y * (d2.y - dr));
    }
    __syncwarp(); /* dS is written */
#pragma unroll
    for (int kk = 0; kk < TC_TILE / 16; kk++) {
      FragA fs;
      wmma::load_matrix_sync(fs, dsw + kk * 16, TC_LDP);
#pragma unroll
      for (int n = 0; n < HD / 16; n++) {
        FragBRow fb;
        wmma::load_matrix_sync(fb, ks + kk * 16 * LDH + n * 16, LDH);
        wmma::mma_sync(dq[n], fs, fb, dq[n]);
      }
    }
  }
  float *dqg = a.dqkv + rt_attn_row(a.otok, b, h, C, 0, T, HD);
  const int wrow = q0 + w * 16, ldo = rt_attn_ld(a.otok, C, HD);
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    __syncwarp(); /* the scratch's last readers are done */
    wmma::store_matrix_sync(scw, dq[n], TC_LDS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int rr = e >> 4, cc = e & 15;
      if (wrow + rr < T) dqg[(int64_t)(wrow + rr) * ldo + n * 16 + cc] = a.scale * scw[rr * TC_LDS + cc];
    }
  }
#endif
}

/* ---- launching ---- */

template <typename K>
static int tc_launch(RtCuda *c, const char *op, K kern, dim3 grid, size_t bytes,
                     const TcArgs &a) {
  if (bytes > 48 * 1024)
    CU_CHECK(c, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
             op);
  kern<<<grid, TC_THREADS, bytes, c->compute>>>(a);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}


/* PARC_CUDA_ATTN=wmma: this file's kernels (for comparison) instead of
 * rt_cuda_attn_mma.cu's (which have no statistics kernel: tc_fwd<.., true> runs
 * either way when the caller kept nothing) */
static bool tc_wmma() { return rt_cuda_attn_env("wmma"); }

bool rt_cuda_attn_env(const char *want) {
  const char *e = getenv("PARC_CUDA_ATTN");
  return e && !strcmp(e, want);
}

/* a's layout as RT_CUDA_ATTN_*_TOKENS flags (for the mma kernels) */
static unsigned tc_layout(const TcArgs &a) {
  return (a.otok ? (unsigned)RT_CUDA_ATTN_O_TOKENS : 0u) |
         (a.dytok ? (unsigned)RT_CUDA_ATTN_DY_TOKENS : 0u) |
         (a.qkvtok ? (unsigned)RT_CUDA_ATTN_QKV_TOKENS : 0u);
}

template <int HD>
static int tc_run(RtCuda *c, const TcArgs &a, int64_t B, bool grad, bool kept) {
  typedef TcShape<HD> S;
  const unsigned tiles = (unsigned)((a.T + TC_TILE - 1) / TC_TILE);
  const dim3 gq(tiles, (unsigned)(B * a.H)), gkv(tiles, (unsigned)(B * a.KV));
  if (!grad && !tc_wmma())
    return rt_cuda_sdpa_mma(c, a.out, a.lse, a.q, a.k, a.v, B, a.H, a.KV, a.T, HD, a.scale,
                            a.causal, tc_layout(a));
  if (!grad) return tc_launch(c, "sdpa (tensor cores)", tc_fwd<HD, false>, gq, S::fwd, a);
  if (!kept &&
      tc_launch(c, "sdpa_grad (statistics, tensor cores)", tc_fwd<HD, true>, gq, S::fwd, a))
    return RT_ERR;
  if (!tc_wmma())
    return rt_cuda_sdpa_grad_mma(c, a.dqkv, a.q, a.k, a.v, a.dy, a.st_lse, a.st_d, B, a.H, a.KV,
                                 a.T, HD, a.scale, a.causal, tc_layout(a));
  if (tc_launch(c, "sdpa_grad (dk, dv, tensor cores)", tc_bwd_kv<HD>, gkv, S::kv, a)) return RT_ERR;
  return tc_launch(c, "sdpa_grad (dq, tensor cores)", tc_bwd_q<HD>, gq, S::dq, a);
}

static int tc_dispatch(RtCuda *c, const TcArgs &a, int64_t B, int64_t hd, bool grad,
                       bool kept) {
  return rt_attn_by_hd(
      hd, [&](auto h) { return tc_run<decltype(h)::value>(c, a, B, grad, kept); },
      [&] { return rt_fail("sdpa (tensor cores): head dimension %lld", (long long)hd); });
}

/* Whether rt_cuda_sdpa / rt_cuda_sdpa_grad take the kernels above. */
bool rt_cuda_attn_tc(RtCuda *c, int64_t T, int64_t hd) {
  if (c->gemm != RT_CUDA_GEMM_BF16 || !rt_cuda_attn_stored_ok(hd, T)) return false;
  if (rt_cuda_attn_env("fp32")) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 8;
}

/* Whether they hand the work to rt_cuda_attn_mma.cu's kernels (rt_cuda_impl.h). */
int rt_cuda_attn_mma(RtCuda *c, int64_t T, int64_t hd) {
  return rt_cuda_attn_tc(c, T, hd) && !tc_wmma();
}

/* The arguments are checked by the callers (rt_cuda_attn.cu's check_args). */
int rt_cuda_sdpa_tc(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                    const float *v, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                    float scale, int causal, unsigned lay) {
  TcArgs a = {q, k, v, NULL, out, lse, NULL, NULL, NULL, H, KV, (int)T, scale, causal != 0,
              (lay & RT_CUDA_ATTN_O_TOKENS) != 0, false, (lay & RT_CUDA_ATTN_QKV_TOKENS) != 0};
  return tc_dispatch(c, a, B, hd, false, false);
}

/* lse, d: the rows' statistics (the forward's lse, D = dy . out: given, or by
 * attn_rowdot from the forward's out), or both NULL
 * (then tc_fwd<.., true> computes them into the workspace). */
int rt_cuda_sdpa_grad_tc(RtCuda *c, float *dqkv, const float *q, const float *k, const float *v,
                         const float *dy, const float *lse, const float *d, int64_t B, int64_t H,
                         int64_t KV, int64_t T, int64_t hd, float scale, int causal,
                         unsigned lay) {
  const bool kept = lse != NULL;
  float *st = kept ? NULL : (float *)rt_cuda_ws(c, WS_ATTN, (size_t)(2 * B * H * T) * sizeof(float));
  if (!kept && !st) return RT_ERR;
  TcArgs a = {q, k, v, dy, NULL, NULL, kept ? (float *)lse : st,
              kept ? (float *)d : st + B * H * T, dqkv, H, KV, (int)T, scale, causal != 0,
              (lay & RT_CUDA_ATTN_O_TOKENS) != 0, (lay & RT_CUDA_ATTN_DY_TOKENS) != 0,
              (lay & RT_CUDA_ATTN_QKV_TOKENS) != 0};
  return tc_dispatch(c, a, B, hd, true, kept);
}
