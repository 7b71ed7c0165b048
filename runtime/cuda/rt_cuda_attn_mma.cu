/* runtime/cuda/rt_cuda_attn_mma.cu -- flash attention, forward and backward, on
 * tensor cores with the score tiles in registers (mma.sync m16n8k16 and
 * ldmatrix through rt_cuda_mma.h): the default kernels of the bf16 mode;
 * rt_cuda_attn_tc.cu's WMMA kernels stay for comparison (PARC_CUDA_ATTN=wmma)
 * and compute the backward's row statistics when the caller kept none.  Same semantics,
 * layouts and precision as rt_cuda_attn_tc.cu (its head comment): q, k, v, dy
 * rounded to bf16 in shared memory, p and ds rounded to bf16 as operands, every
 * product accumulated in fp32, 2^x of log2e-scaled scores in fp32 (rt_ex2: the
 * SFU's ex2 with a result below 2^-126 flushed to 0).
 *
 * Why: the WMMA kernels must store each 16 x 64 product to shared memory and
 * read it back (WMMA's fragment layout is unspecified), once per tile in the
 * forward and twice in the backward; here the products S, dP stay in the accumulator registers, where
 * the softmax gradient is applied, and are fed back as A operands (the C
 * tiles of two adjacent 8-column blocks are the A operand of those 16 columns,
 * rt_mma_c2a) -- the FlashAttention-2 structure.
 *
 * Mapping.  A block is 8 warps (MMA_WARPS: why there); a warp owns 16 rows
 * (queries in mma_fwd and mma_bwd_q, keys in mma_bwd_kv) of its block's 128;
 * lane L holds rows g = L / 4 and g + 8 of them and columns 8 n + 2 t, + 1 (t
 * = L % 4) of every 8-column block n of a product (rt_cuda_mma.h).  The other
 * operand streams through in tiles of 64 rows (32 in mma_bwd_kv for hd > 64);
 * causal, a warp skips a streamed tile masked for all its rows.  Tiles of q,
 * k, v, dy sit in shared memory as bf16 [rows][hd + 8] (row stride 2 hd + 16
 * bytes: 16-byte aligned rows for ldmatrix, and 8 rows on distinct banks).
 *
 *   mma_fwd    grid (T / 128 query tiles, last first, B H): out, lse of 128 rows.
 *              Per key tile (causal: up to the diagonal): S = Q_w K^T in
 *              registers, masked to -inf, the online softmax (row max and
 *              rescale over the 4 lanes of a row: two shuffles; each lane sums
 *              its own columns, the row's sum is taken once at the end), O_w =
 *              alpha O_w + P V with P the bf16 of the C registers.
 *   The backward is fused by default: mma_bwd_kv<.., true> also writes each
 *   query tile's share of dq from the block's keys (dS^T through shared memory,
 *   dQ_p = dS K by the block's warps over a row tile each), as fp32 rows of
 *   a scratch (rt_cuda_ws_plan.h's rt_cuda_attn_dq_rows: a key block's rows
 *   from its first key on, causal), and mma_dq_sum adds a row's shares in the
 *   order of the key blocks: five products a tile pair instead of the split
 *   kernels' seven, for a write and a read of the scratch.  The scratch holds
 *   the kv groups a launch takes (RtCudaSetup.attn_dq_bytes; where none fits,
 *   or PARC_CUDA_ATTN=split, the split kernels run: mma_bwd_kv, mma_bwd_q).
 *   mma_bwd_q  grid (T / 128 query tiles, last first, B H): dq of 128 rows.  Q,
 *              dY tiles loaded once; per key tile (causal: up to the diagonal):
 *              S = Q_w K^T, dP = dY_w V^T (16 x 64 each, registers), p =
 *              exp2(S scale log2e - lse log2e) masked to 0, dS = p (dP - D),
 *              dQ_w += dS K (16 x hd in registers); dq = scale dQ.
 *   mma_bwd_kv grid (T / 128 key tiles, B KV): dk, dv of 128 keys over every
 *              query of the kv head's H / KV query heads, in tiles of QT rows
 *              (64; 32 for hd > 64, where dK, dV take hd registers a lane):
 *              S^T = K_w Q^T, dP^T = V_w dY^T (16 x QT), p, dS as above with
 *              the statistics of the columns' queries (shared memory), dV_w +=
 *              P^T dY, dK_w += dS^T Q; dk = scale dK.
 * Every output element is written once, by one lane, after a fixed sequence of
 * sums: no atomics, the same bits every run.  Where the trainer stores them as
 * bf16 (MmaArgs.io, rt_cuda_ws_plan.h's RT_CUDA_ATTN_*), q, k, v, dy are
 * read as bf16 (the tiles' bytes, no rounding: so the results' bits are the
 * same as from their fp32 values) and out or dqkv are written as bf16 or
 * rounded so.  Rows >= T are zeros in the
 * tiles, and masked probabilities are exactly 0, so they add nothing.
 * Synchronisation: __syncthreads around every tile copy (block-uniform loops);
 * the products read shared memory only through ldmatrix, every lane of a warp
 * together.  Shared memory (MmaShape): forward 128 + 2 x 64 rows (hd 64:
 * 36 KiB, hd 128: 68 KiB), dq 2 x 128 + 2 x 64 rows (54 / 102 KiB), dk, dv
 * 2 x 128 + 2 QT rows + 2 QT floats (54.5 / 85.3 KiB), fused + dS^T [128][QT +
 * 8] (72.5 / 95.3 KiB). */
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include <cuda_bf16.h>

#include "runtime/cuda/rt_cuda_attn_tile.h"
#include "runtime/cuda/rt_cuda_impl.h"
#include "runtime/cuda/rt_cuda_mma.h"

typedef __nv_bfloat16 bf16;

/* A block is 8 warps owning 128 rows (16 a warp) and streams tiles of 64 rows
 * of the other operand: each streamed tile serves twice the rows that 4 warps
 * would, halving the global (L2) traffic of the streamed operands, which
 * bounds these kernels (64 rows: 64 FLOP a byte loaded; the H200 has ~200 at
 * HBM).  One block an SM at up to 255 registers a thread (65536 / 256 = 256),
 * the same 8 warps an SM as two 4-warp blocks.  (Reasoned, not measured: 4-warp
 * blocks synchronise half as many warps, and one block's softmax can run
 * beside the other's products; PARC_CUDA_ATTN=mma4 runs them for the
 * comparison on a GPU.) */
#define MMA_WARPS 8 /* the kernels' W: 4 for comparison (PARC_CUDA_ATTN=mma4, mma_warps4) */
#define MMA_TILE 64 /* rows of a streamed key tile (fwd, dq), query tile (dk, dv: MmaShape::QT) */
#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define MMA_NONE 1 /* bf16 mma.sync needs sm_80; the host never launches these there */
#endif
/* Whether the fused backward (mma_bwd_kv<.., true>) holds its next query tile
 * in registers (MmaShape::hold_kv, hold_kvq): sm_80's ptxas spills it where
 * sm_90's does not, so there it copies each tile after the barrier. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MMA_DQ_HOLD false
#else
#define MMA_DQ_HOLD true
#endif

struct MmaArgs {
  const void *q, *k, *v, *dy; /* fp32, or bf16 where io says (RT_CUDA_ATTN_*_BF16) */
  const float *lse, *d;       /* [B, H, T]: the forward's lse (natural log), D = dy . out */
  void *dqkv;                 /* [B, H + 2 KV, T, hd]: fp32, bf16 or rounded (io, O_*) */
  void *out;                  /* the forward's result, likewise */
  float *out_lse;             /* and its lse (may be NULL) */
  int64_t H, KV;
  int T;
  float scale;
  int causal;
  unsigned io; /* RT_CUDA_ATTN_* (rt_cuda_ws_plan.h) */
  bool otok, dytok; /* out / dqkv token-major, dy token-major (RT_CUDA_ATTN_*_TOKENS: kept
                       apart from io, which the fp32 kernels fold to 0) */
  bool qkvtok;      /* q, k, v packed token-major (RT_CUDA_ATTN_QKV_TOKENS) */
  int ldi;          /* q's, k's, v's row stride, rt_attn_in_ld (a parameter, not a value the
                       kernels keep in a register: the GPT-2 dk, dv kernel has none spare) */
};

/* The fused backward's (mma_bwd_kv<.., true>, mma_dq_sum): a parameter of its
 * own, since one more field in MmaArgs made ptxas spill in the GPT-2 dk, dv
 * kernel, which has every register in use. */
struct MmaDq {
  float *p;     /* the dq partial sums of this launch's groups (rt_cuda_ws_plan.h) */
  int g0;       /* the launch's first kv group (b KV + kv head); blockIdx.y adds */
  int ngroups;  /* the groups a launch takes (0: the split kernels, mma_bwd_q) */
  int64_t rows; /* a query head's rows of p, rt_cuda_attn_dq_rows */
};

/* The first row of key tile j's dq partials in a query head's dqp rows
 * (rt_cuda_attn_dq_rows' arithmetic: tile j holds rows [begin, T), begin =
 * keys j causal, else 0). */
static __host__ __device__ __forceinline__ int64_t mma_dq_off(int64_t j, int64_t T, int64_t keys,
                                                              bool causal) {
  return j * T - (causal ? keys * j * (j - 1) / 2 : 0);
}

/* p + e elements, of bf16 where io has bit, else of fp32 */
static __device__ __forceinline__ const void *mma_at(const void *p, unsigned io, unsigned bit,
                                                     int64_t e) {
  return io & bit ? (const void *)((const bf16 *)p + e) : (const void *)((const float *)p + e);
}

/* row 0 of operand j's (0 q, 1 k, 2 v) head h in batch b (rt_attn_in), of
 * bf16 or fp32 as io says; the operands' rows are a.ldi apart */
static __device__ __forceinline__ const void *mma_in(const MmaArgs &a, unsigned io, int j,
                                                     int64_t b, int64_t h, int hd) {
  return mma_at(j == 0 ? a.q : j == 1 ? a.k : a.v, io,
                j == 0 ? RT_CUDA_ATTN_Q_BF16 : j == 1 ? RT_CUDA_ATTN_K_BF16 : RT_CUDA_ATTN_V_BF16,
                rt_attn_in(a.qkvtok, j, b, h, a.H, a.KV, a.T, hd));
}

template <int HD, int W = MMA_WARPS> struct MmaShape {
  static constexpr int THREADS = 32 * W, ROWS = 16 * W; /* a block's threads, own rows */
  static constexpr int LDH = HD + 8;              /* bf16 row stride of every tile */
  static constexpr int QT = HD > 64 ? 32 : 64;    /* mma_bwd_kv's query tile rows */
  static constexpr size_t ROW = LDH * sizeof(bf16);
  static constexpr size_t fwd = (ROWS + 2 * MMA_TILE) * ROW;
  static constexpr size_t dq = 2 * (ROWS + MMA_TILE) * ROW;
  static constexpr size_t kv = 2 * (ROWS + QT) * ROW + 2 * QT * sizeof(float);
  /* the fused backward: dS^T of the block's keys, bf16 [ROWS][QT + 8], after kv's */
  static constexpr int LDS = QT + 8;
  static constexpr size_t kvq = kv + (size_t)ROWS * LDS * sizeof(bf16);
  /* its dq products: QT / 16 row tiles of 16 queries, W / MT warps a tile, each
   * warp the 8-column blocks c0, c0 + W / MT, ... of HD (at most NB of them) */
  static constexpr int MT = QT / 16, WPM = W / MT, NB = (HD / 8 + WPM - 1) / WPM;
  /* the blocks a pass of those products accumulates (where dK, dV take 2 HD
   * registers a lane, or a 4-warp block's 8 a warp, fewer: else ptxas spills) */
  static constexpr int NP = HD > 96 || NB > 4 ? 2 : NB;
  static_assert(W % MT == 0, "a whole number of warps a row tile");
  /* whether the next streamed tile waits in registers (RtAttnTileRegs HOLD):
   * where ptxas (sm_90, 255 a thread) finds the registers without spilling;
   * IO, the kernels that read bf16 tensors too, need a few more, and 4-warp
   * blocks twice as many for the same tile */
  static constexpr bool hold_q = HD <= 112, hold_q_io = HD <= 96; /* mma_fwd's k, v tiles */
  static constexpr bool hold_dq = hold_q, hold_dq_io = HD <= (W == 4 ? 48 : 80); /* dq */
  static constexpr bool hold_kv = HD <= (W == 4 ? 48 : 96); /* mma_bwd_kv's q, dy tiles */
  /* and the fused one's, reading fp32 tensors (IO false) */
  static constexpr bool hold_kvq = HD <= (W == 4 ? 48 : 80);
  /* mma_bwd_kv IO or fused, hd > 96: its q, dy copies one load at a time (else ptxas
   * spills) */
  static constexpr int kv_unroll_io = HD > 96 ? 1 : 0;
};

/* acc[2 np], acc[2 np + 1] (np < N / 16) += A B^T over HD: A the warp's 16 rows
 * at a, B the N rows at bm, both bf16 [.][HD + 8]. */
template <int HD, int N>
static __device__ __forceinline__ void mma_abt(float (*acc)[4], const bf16 *a, const bf16 *bm) {
  constexpr int LDH = HD + 8;
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    uint32_t fa[4];
    rt_ldsm_a(fa, a + kk * 16, LDH);
#pragma unroll
    for (int np = 0; np < N / 16; np++) {
      uint32_t fb[4];
      rt_ldsm_bt(fb, bm + np * 16 * LDH + kk * 16, LDH);
      rt_mma16816(acc[2 * np], fa, fb);
      rt_mma16816(acc[2 * np + 1], fa, fb + 2);
    }
  }
}

/* acc[HD / 8] += P B over K = 16 kk2 .. 16 kk2 + 15: P the C tiles p[2 kk2],
 * p[2 kk2 + 1] (16 x 16), B rows [16 kk2, + 16) of bm (bf16 [.][HD + 8]). */
template <int HD>
static __device__ __forceinline__ void mma_pb(float (*acc)[4], const float (*p)[4], int kk2,
                                              const bf16 *bm) {
  constexpr int LDH = HD + 8;
  uint32_t fa[4];
  rt_mma_c2a(fa, p[2 * kk2], p[2 * kk2 + 1]);
#pragma unroll
  for (int nn = 0; nn < HD / 16; nn++) {
    uint32_t fb[4];
    rt_ldsm_b(fb, bm + kk2 * 16 * LDH + nn * 16, LDH);
    rt_mma16816(acc[2 * nn], fa, fb);
    rt_mma16816(acc[2 * nn + 1], fa, fb + 2);
  }
}

/* x, y at element e of dst: fp32 (M 0), bf16 (M 1, RT_CUDA_ATTN_O_BF16) or
 * fp32 rounded to bf16 values (M 2, RT_CUDA_ATTN_O_ROUND); bf16's round to
 * nearest even */
template <int M>
static __device__ __forceinline__ void mma_put2(void *dst, int64_t e, float x, float y) {
  if constexpr (M == 1) {
    *(__nv_bfloat162 *)((bf16 *)dst + e) = __floats2bfloat162_rn(x, y);
  } else {
    if constexpr (M == 2)
      x = __bfloat162float(__float2bfloat16_rn(x)), y = __bfloat162float(__float2bfloat16_rn(y));
    *(float2 *)((float *)dst + e) = make_float2(x, y);
  }
}

template <int HD, int M>
static __device__ __forceinline__ void mma_store_m(void *dst, int64_t off, int ld,
                                                   const float (*c)[4], int r0, int T, float s0,
                                                   float s1) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    const int col = 8 * n + 2 * t;
    if (r0 < T) mma_put2<M>(dst, off + (int64_t)r0 * ld + col, s0 * c[n][0], s0 * c[n][1]);
    if (r0 + 8 < T)
      mma_put2<M>(dst, off + (int64_t)(r0 + 8) * ld + col, s1 * c[n][2], s1 * c[n][3]);
  }
}

/* rows r0 (c[.][0..1]) times s0 and r0 + 8 (c[.][2..3]) times s1 of a 16 x HD
 * product into the [T, HD] matrix of row stride ld at element off of dst (rows
 * >= T skipped; io: how dst holds its elements, mma_put2) */
template <int HD>
static __device__ __forceinline__ void mma_store(void *dst, unsigned io, int64_t off, int ld,
                                                 const float (*c)[4], int r0, int T, float s0,
                                                 float s1) {
  if (io & RT_CUDA_ATTN_O_BF16) mma_store_m<HD, 1>(dst, off, ld, c, r0, T, s0, s1);
  else if (io & RT_CUDA_ATTN_O_ROUND) mma_store_m<HD, 2>(dst, off, ld, c, r0, T, s0, s1);
  else mma_store_m<HD, 0>(dst, off, ld, c, r0, T, s0, s1);
}

/* the maximum (sum) of v over the 4 lanes holding a row (lanes 4 g .. 4 g + 3) */
static __device__ __forceinline__ float mma_row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float mma_row_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Masking, for the tiles that hold a masked element (the callers test that
 * warp-uniformly, so a tile inside the sequence and below the diagonal runs
 * none of this).  c[n][i] is the score of row r0 + 8 (i / 2) and column c0 +
 * 8 n + 2 t + i % 2; row and column are query and key, or, KEY_ROWS (mma_bwd_kv's
 * transposed tiles), key and query.  It becomes x where the column is >= T, or,
 * causal, the key is after the query, or the row is >= T: for x = 0 only (a
 * probability; the forward's -inf rows >= T are never stored, nor need be). */
template <int N, bool KEY_ROWS>
static __device__ __forceinline__ void mma_mask(float (*c)[4], int r0, int c0, int T, bool causal,
                                                float x) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < N / 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int row = r0 + 8 * (i >> 1), col = c0 + 8 * n + 2 * t + (i & 1);
      const bool late = KEY_ROWS ? row > col : col > row; /* the key after the query */
      if (col >= T || (x == 0.0f && row >= T) || (causal && late)) c[n][i] = x;
    }
}

/* The forward: out, lse (may be NULL) of query rows [q0, q0 + 16 W) of head (b, h). */
template <int HD, bool IO, int W>
__global__ void __launch_bounds__(32 * W, MMA_WARPS / W) mma_fwd(MmaArgs a) {
#ifndef MMA_NONE
  const unsigned io = IO ? a.io : 0u; /* IO false: every tensor fp32, the branches folded */
  constexpr int ROWS = MmaShape<HD, W>::ROWS, THREADS = MmaShape<HD, W>::THREADS;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDH = MmaShape<HD, W>::LDH;
  bf16 *qs = (bf16 *)mma_smem, *ks = qs + ROWS * LDH, *vs = ks + MMA_TILE * LDH;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int T = a.T, q0 = (int)(gridDim.x - 1 - blockIdx.x) * ROWS, r0 = q0 + 16 * w + g;
  const int wlast = a.causal ? q0 + 16 * w + 15 : T; /* causal: the warp's keys end here */
  const int64_t bh = blockIdx.y, b = bh / a.H, kvh = bh % a.H / (a.H / a.KV);
  const bool qb = io & RT_CUDA_ATTN_Q_BF16, kb = io & RT_CUDA_ATTN_K_BF16,
             vb = io & RT_CUDA_ATTN_V_BF16;
  const void *kh = mma_in(a, io, 1, b, kvh, HD), *vh = mma_in(a, io, 2, b, kvh, HD);
  const float sl2 = a.scale * MMA_LOG2E;
  rt_attn_tile_load<HD, ROWS, THREADS>(qs, mma_in(a, io, 0, b, bh % a.H, HD), qb, q0, T, a.ldi);
  /* rows r0, r0 + 8: running max (log2 units), this lane's part of the sum */
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int kend = a.causal && q0 + ROWS < T ? q0 + ROWS : T; /* keys [0, kend) */
  constexpr bool hold = IO ? MmaShape<HD, W>::hold_q_io : MmaShape<HD, W>::hold_q;
  RtAttnTileRegs<HD, MMA_TILE, THREADS, hold> kr, vr; /* the next key tile, in flight */
  kr.load(kh, kb, 0, T, a.ldi), vr.load(vh, vb, 0, T, a.ldi);
  for (int j0 = 0; j0 < kend; j0 += MMA_TILE) {
    __syncthreads(); /* the previous key tile is consumed */
    kr.put(ks, kh, kb, j0, T, a.ldi), vr.put(vs, vh, vb, j0, T, a.ldi);
    __syncthreads(); /* the tiles (and, the first time, qs) are in */
    if (j0 + MMA_TILE < kend)
      kr.load(kh, kb, j0 + MMA_TILE, T, a.ldi), vr.load(vh, vb, j0 + MMA_TILE, T, a.ldi);
    if (j0 > wlast) continue; /* every key masked for the warp's rows (warp-uniform) */
    float s[MMA_TILE / 8][4];
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    mma_abt<HD, MMA_TILE>(s, qs + 16 * w * LDH, ks); /* S = Q_w K^T */
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] *= sl2; /* log2 units (any sign of the scale) */
    /* masked keys to -inf: only in a tile that has some (warp-uniform) */
    if (j0 + MMA_TILE > T || (a.causal && j0 + MMA_TILE - 1 > q0 + 16 * w))
      mma_mask<MMA_TILE, false>(s, r0, j0, T, a.causal, -INFINITY);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
    float base[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float mn = fmaxf(m[r], mma_row_max(mx[r]));
      base[r] = mn == -INFINITY ? 0.0f : mn;
      alpha[r] = rt_ex2(m[r] - base[r]); /* 0 while m is -inf */
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        s[n][i] = rt_ex2(s[n][i] - base[i >> 1]); /* P (masked: exp2(-inf) = 0) */
        l[i >> 1] += s[n][i];
      }
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      o[n][0] *= alpha[0], o[n][1] *= alpha[0];
      o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int kk2 = 0; kk2 < MMA_TILE / 16; kk2++) mma_pb<HD>(o, s, kk2, vs); /* O += P V */
  }
  const float l0 = mma_row_sum(l[0]), l1 = mma_row_sum(l[1]);
  mma_store<HD>(a.out, io, rt_attn_row(a.otok, b, bh % a.H, a.H, 0, T, HD),
                rt_attn_ld(a.otok, a.H, HD), o, r0, T, l0 > 0.0f ? 1.0f / l0 : 0.0f,
                l1 > 0.0f ? 1.0f / l1 : 0.0f);
  if (a.out_lse && t == 0) { /* natural log of the row's sum (valid rows: l > 0) */
    if (r0 < T) a.out_lse[bh * T + r0] = (m[0] + log2f(l0)) * MMA_LN2;
    if (r0 + 8 < T) a.out_lse[bh * T + r0 + 8] = (m[1] + log2f(l1)) * MMA_LN2;
  }
#endif
}

template <int HD, bool IO, int W>
__global__ void __launch_bounds__(32 * W, MMA_WARPS / W) mma_bwd_q(MmaArgs a) {
#ifndef MMA_NONE
  const unsigned io = IO ? a.io : 0u; /* IO false: every tensor fp32, the branches folded */
  constexpr int ROWS = MmaShape<HD, W>::ROWS, THREADS = MmaShape<HD, W>::THREADS;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDH = MmaShape<HD, W>::LDH;
  bf16 *qs = (bf16 *)mma_smem, *dys = qs + ROWS * LDH, *ks = dys + ROWS * LDH;
  bf16 *vs = ks + MMA_TILE * LDH;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2;
  const int T = a.T, q0 = (int)(gridDim.x - 1 - blockIdx.x) * ROWS, r0 = q0 + 16 * w + g;
  const int wlast = a.causal ? q0 + 16 * w + 15 : T; /* causal: the warp's keys end here */
  const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, kvh = h / (a.H / a.KV);
  const bool kb = io & RT_CUDA_ATTN_K_BF16, vb = io & RT_CUDA_ATTN_V_BF16;
  const void *kh = mma_in(a, io, 1, b, kvh, HD), *vh = mma_in(a, io, 2, b, kvh, HD);
  const float sl2 = a.scale * MMA_LOG2E;
  float lr[2], dr[2]; /* rows r0, r0 + 8: lse log2e, D */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = r0 + 8 * i;
    lr[i] = row < T ? a.lse[bh * T + row] * MMA_LOG2E : 0.0f;
    dr[i] = row < T ? a.d[bh * T + row] : 0.0f;
  }
  rt_attn_tile_load<HD, ROWS, THREADS>(qs, mma_in(a, io, 0, b, h, HD), io & RT_CUDA_ATTN_Q_BF16,
                                       q0, T, a.ldi);
  rt_attn_tile_load<HD, ROWS, THREADS>(
      dys, mma_at(a.dy, io, RT_CUDA_ATTN_DY_BF16, rt_attn_row(a.dytok, b, h, a.H, 0, T, HD)),
      io & RT_CUDA_ATTN_DY_BF16, q0, T, rt_attn_ld(a.dytok, a.H, HD));
  float dq[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const int kend = a.causal && q0 + ROWS < T ? q0 + ROWS : T; /* keys [0, kend) */
  constexpr bool hold = IO ? MmaShape<HD, W>::hold_dq_io : MmaShape<HD, W>::hold_dq;
  RtAttnTileRegs<HD, MMA_TILE, THREADS, hold> kr, vr; /* the next key tile, in flight */
  kr.load(kh, kb, 0, T, a.ldi), vr.load(vh, vb, 0, T, a.ldi);
  for (int j0 = 0; j0 < kend; j0 += MMA_TILE) {
    __syncthreads(); /* the previous key tile is consumed */
    kr.put(ks, kh, kb, j0, T, a.ldi), vr.put(vs, vh, vb, j0, T, a.ldi);
    __syncthreads(); /* the tiles (and, the first time, qs and dys) are in */
    if (j0 + MMA_TILE < kend)
      kr.load(kh, kb, j0 + MMA_TILE, T, a.ldi), vr.load(vh, vb, j0 + MMA_TILE, T, a.ldi);
    if (j0 > wlast) continue; /* every key masked for the warp's rows (warp-uniform) */
    float s[MMA_TILE / 8][4], dp[MMA_TILE / 8][4];
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] = dp[n][i] = 0.0f;
    mma_abt<HD, MMA_TILE>(s, qs + 16 * w * LDH, ks);   /* S = Q_w K^T */
    mma_abt<HD, MMA_TILE>(dp, dys + 16 * w * LDH, vs); /* dP = dY_w V^T */
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] = rt_ex2(s[n][i] * sl2 - lr[i >> 1]); /* P */
    /* masked probabilities to 0: only in a tile that has some (warp-uniform; rows
     * >= T too, though their dq is never stored) */
    if (j0 + MMA_TILE > T || r0 - g + 15 >= T || (a.causal && j0 + MMA_TILE - 1 > q0 + 16 * w))
      mma_mask<MMA_TILE, false>(s, r0, j0, T, a.causal, 0.0f);
#pragma unroll
    for (int n = 0; n < MMA_TILE / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] *= dp[n][i] - dr[i >> 1]; /* dS = P (dP - D) */
#pragma unroll
    for (int kk2 = 0; kk2 < MMA_TILE / 16; kk2++) mma_pb<HD>(dq, s, kk2, ks); /* dQ += dS K */
  }
  const int64_t C = a.H + 2 * a.KV;
  mma_store<HD>(a.dqkv, io, rt_attn_row(a.otok, b, h, C, 0, T, HD), rt_attn_ld(a.otok, C, HD),
                dq, r0, T, a.scale, a.scale);
#endif
}

/* The warp's 16 rows of dS^T (its keys; columns the QT queries) into dst
 * (bf16, row stride LDS), from the C tiles dp, rounded as the dK product's
 * operand is (rt_mma_c2a); dp NULL: zeros (a warp whose keys no query sees). */
template <int LDS, int QT>
static __device__ __forceinline__ void mma_dst_put(bf16 *dst, const float (*dp)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < QT / 8; n++) {
    uint32_t *r = (uint32_t *)(dst + g * LDS + 8 * n + 2 * t);
    r[0] = dp ? rt_pk_bf16(dp[n][0], dp[n][1]) : 0u;
    r[4 * LDS] = dp ? rt_pk_bf16(dp[n][2], dp[n][3]) : 0u; /* row g + 8 (8 LDS bf16 on) */
  }
}

/* The fused backward's dq share of the block's keys for query tile i0 (QT
 * rows): dQ_p = dS K over the ROWS keys, dS^T in dst (bf16 [ROWS][QT + 8],
 * every warp's rows written), K in ks; the warp's row tile and column blocks
 * (MmaShape::MT, WPM, NB) written as fp32 to the rows of dq (i0 on; rows >= T
 * skipped).  Causal, 32-key steps whose keys all follow the tile's queries
 * add nothing (their dS is 0) and are skipped, block-uniformly. */
template <int HD, int W>
static __device__ __forceinline__ void mma_dq_part(float *dq, const bf16 *dst, const bf16 *ks,
                                                   int i0, int k0, int T, bool causal) {
  typedef MmaShape<HD, W> S;
  constexpr int LDH = S::LDH, LDS = S::LDS, NB = S::NB, NP = S::NP;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int mt = w % S::MT, c0 = w / S::MT, r = i0 + 16 * mt + g;
#pragma unroll
  for (int n0 = 0; n0 < NB; n0 += NP) { /* NP column blocks at a time (registers) */
    float acc[NP][4];
#pragma unroll
    for (int n = 0; n < NP; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int p = 0; p < S::ROWS / 32; p++) {
      if (causal && i0 + S::QT <= k0 + 32 * p) break; /* these keys and the later ones: dS 0 */
      uint32_t fa[2][4];
      rt_ldsm_at(fa[0], dst + 32 * p * LDS + 16 * mt, LDS);
      rt_ldsm_at(fa[1], dst + (32 * p + 16) * LDS + 16 * mt, LDS);
#pragma unroll
      for (int n = 0; n < NP; n++) {
        const int nb = c0 + (n0 + n) * S::WPM;
        if (n0 + n >= NB || nb >= HD / 8) break; /* (warp-uniform) */
        uint32_t fb[4];
        rt_ldsm_bk(fb, ks + 32 * p * LDH + 8 * nb, LDH);
        rt_mma16816(acc[n], fa[0], fb);
        rt_mma16816(acc[n], fa[1], fb + 2);
      }
    }
#pragma unroll
    for (int n = 0; n < NP; n++) {
      const int nb = c0 + (n0 + n) * S::WPM;
      if (n0 + n >= NB || nb >= HD / 8) break;
      float *o = dq + (int64_t)(r - i0) * HD + 8 * nb + 2 * t;
      if (r < T) *(float2 *)o = make_float2(acc[n][0], acc[n][1]);
      if (r + 8 < T) *(float2 *)(o + 8 * HD) = make_float2(acc[n][2], acc[n][3]);
    }
  }
}

/* dk, dv of a block's ROWS keys; DQ (the fused backward): dq's shares too,
 * into q.p (mma_dq_part), which mma_dq_sum adds up. */
template <int HD, bool IO, int W, bool DQ>
__global__ void __launch_bounds__(32 * W, MMA_WARPS / W) mma_bwd_kv(MmaArgs a, MmaDq dq) {
#ifndef MMA_NONE
  const unsigned io = IO ? a.io : 0u; /* IO false: every tensor fp32, the branches folded */
  constexpr int ROWS = MmaShape<HD, W>::ROWS, THREADS = MmaShape<HD, W>::THREADS;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDH = MmaShape<HD, W>::LDH, QT = MmaShape<HD, W>::QT;
  constexpr int LDS = MmaShape<HD, W>::LDS;
  bf16 *ks = (bf16 *)mma_smem, *vs = ks + ROWS * LDH, *qs = vs + ROWS * LDH;
  bf16 *dys = qs + QT * LDH;
  float *ls = (float *)(dys + QT * LDH), *ds_ = ls + QT; /* the tile's lse log2e, D */
  bf16 *dst = (bf16 *)(ds_ + QT); /* DQ: dS^T of the block's keys */
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int T = a.T, k0 = (int)blockIdx.x * ROWS, u0 = k0 + 16 * w + g; /* keys u0, u0 + 8 */
  const int wfirst = a.causal ? k0 + 16 * w : 0; /* causal: the warp's first query */
  int64_t b, kvh; /* the kv group's batch and head */
  /* (DQ: 32-bit, as a 64-bit division is a call whose registers the fused kernel has
   * not; the split one spills with the 32-bit form, so it keeps its own) */
  if constexpr (DQ) {
    const unsigned bg = (unsigned)dq.g0 + blockIdx.y, kv = (unsigned)a.KV;
    b = bg / kv, kvh = bg % kv;
  } else {
    const int64_t bg = blockIdx.y;
    b = bg / a.KV, kvh = bg % a.KV;
  }
  const int64_t rep = a.H / a.KV;
  const int64_t C = a.H + 2 * a.KV;
  const float sl2 = a.scale * MMA_LOG2E;
  const bool qb = io & RT_CUDA_ATTN_Q_BF16, yb = io & RT_CUDA_ATTN_DY_BF16;
  rt_attn_tile_load<HD, ROWS, THREADS>(ks, mma_in(a, io, 1, b, kvh, HD), io & RT_CUDA_ATTN_K_BF16,
                                       k0, T, a.ldi);
  rt_attn_tile_load<HD, ROWS, THREADS>(vs, mma_in(a, io, 2, b, kvh, HD), io & RT_CUDA_ATTN_V_BF16,
                                       k0, T, a.ldi);
  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) dk[n][i] = dv[n][i] = 0.0f;
  /* The query tiles stream as one sequence over the kv head's query heads h
   * and their tiles i0 (causal: from the block's first key on), the next
   * tile's q, dy, lse and D in flight in registers while this one's products
   * run. */
  const int i_begin = a.causal ? k0 : 0; /* causal: earlier queries see none of these keys */
  RtAttnTileRegs<HD, QT, THREADS,
                 DQ ? MMA_DQ_HOLD && (IO ? MmaShape<HD, W>::hold_kv : MmaShape<HD, W>::hold_kvq)
                    : MmaShape<HD, W>::hold_kv,
                 IO || DQ ? MmaShape<HD, W>::kv_unroll_io : 0>
      qr, dyr;
  float lnext = 0.0f, dnext = 0.0f; /* threads < QT: the next tile's row statistics */
  const int64_t bh0 = b * a.H + kvh * rep; /* the kv head's first query head */
  const int ldy = rt_attn_ld(a.dytok, a.H, HD);
  /* query head bh0 + h's dy */
  auto dy_at = [&](int64_t h) {
    return mma_at(a.dy, io, RT_CUDA_ATTN_DY_BF16,
                  rt_attn_row(a.dytok, b, kvh * rep + h, a.H, 0, T, HD));
  };
  /* the tile of query head bh0 + h, rows [i0, i0 + QT): its loads (q, dy, lse, D) */
  auto fetch = [&](int64_t h, int i0) {
    const int64_t bh = bh0 + h;
    const int i = i0 + (int)threadIdx.x;
    /* (two calls: a run-time row stride in the one load made ptxas spill on sm_80) */
    if (a.qkvtok) qr.load(mma_in(a, io, 0, b, kvh * rep + h, HD), qb, i0, T, a.ldi);
    else qr.load(mma_in(a, io, 0, b, kvh * rep + h, HD), qb, i0, T);
    dyr.load(dy_at(h), yb, i0, T, ldy);
    lnext = dnext = 0.0f;
    if (threadIdx.x < QT && i < T) lnext = a.lse[bh * T + i] * MMA_LOG2E, dnext = a.d[bh * T + i];
  };
  fetch(0, i_begin);
  int64_t h = 0;
  int i0 = i_begin;
  for (bool more = true; more;) {
    __syncthreads(); /* the previous query tile is consumed */
    if (a.qkvtok) qr.put(qs, mma_in(a, io, 0, b, kvh * rep + h, HD), qb, i0, T, a.ldi);
    else qr.put(qs, mma_in(a, io, 0, b, kvh * rep + h, HD), qb, i0, T);
    dyr.put(dys, dy_at(h), yb, i0, T, ldy);
    if (threadIdx.x < QT) ls[threadIdx.x] = lnext, ds_[threadIdx.x] = dnext;
    __syncthreads(); /* the tiles (and, the first time, ks and vs) are in */
    const int icur = i0;
    const int64_t hcur = h;
    i0 += QT; /* the next tile: the head's next rows, or the next head's first */
    if (i0 >= T) i0 = i_begin, h++;
    more = h < rep;
    if (more) fetch(h, i0); /* in flight during this tile's products */
    /* DQ: the block's dS^T rows in (dst), its share of the tile's dq */
    auto dq_part = [&]() {
      __syncthreads(); /* every warp's dS^T rows are in */
      mma_dq_part<HD, W>(dq.p + (((int64_t)blockIdx.y * rep + hcur) * dq.rows +
                                  mma_dq_off(blockIdx.x, T, ROWS, a.causal) + icur - i_begin) *
                                     HD,
                         dst, ks, icur, k0, T, a.causal);
    };
    if (icur + QT <= wfirst) { /* every query masked for the warp's keys (warp-uniform) */
      if constexpr (DQ) {
        mma_dst_put<LDS, QT>(dst + 16 * w * LDS, nullptr); /* zeros */
        dq_part();
      }
      continue;
    }
    float s[QT / 8][4], dp[QT / 8][4];
#pragma unroll
    for (int n = 0; n < QT / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] = dp[n][i] = 0.0f;
    mma_abt<HD, QT>(s, ks + 16 * w * LDH, qs);   /* S^T = K_w Q^T */
    mma_abt<HD, QT>(dp, vs + 16 * w * LDH, dys); /* dP^T = V_w dY^T */
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const float2 lc = *(const float2 *)(ls + 8 * n + 2 * t); /* columns 8 n + 2 t, + 1 */
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] = rt_ex2(s[n][i] * sl2 - (i & 1 ? lc.y : lc.x)); /* P^T */
    }
    /* masked probabilities to 0 (P^T), only in a tile that has some (warp-uniform;
     * keys >= T too, though their dk, dv are never stored) */
    if (icur + QT > T || u0 - g + 15 >= T || (a.causal && u0 - g + 15 > icur))
      mma_mask<QT, true>(s, u0, icur, T, a.causal, 0.0f);
#pragma unroll
    for (int n = 0; n < QT / 8; n++) {
      const float2 dc = *(const float2 *)(ds_ + 8 * n + 2 * t);
#pragma unroll
      for (int i = 0; i < 4; i++) /* dS^T = P^T (dP^T - D) */
        dp[n][i] = s[n][i] * (dp[n][i] - (i & 1 ? dc.y : dc.x));
    }
#pragma unroll
    for (int kk2 = 0; kk2 < QT / 16; kk2++) {
      mma_pb<HD>(dv, s, kk2, dys); /* dV += P^T dY */
      mma_pb<HD>(dk, dp, kk2, qs); /* dK += dS^T Q */
    }
    if constexpr (DQ) {
      mma_dst_put<LDS, QT>(dst + 16 * w * LDS, dp);
      dq_part();
    }
  }
  const int ldo = rt_attn_ld(a.otok, C, HD);
  mma_store<HD>(a.dqkv, io, rt_attn_row(a.otok, b, a.H + kvh, C, 0, T, HD), ldo, dk, u0, T,
                a.scale, a.scale);
  mma_store<HD>(a.dqkv, io, rt_attn_row(a.otok, b, a.H + a.KV + kvh, C, 0, T, HD), ldo, dv, u0,
                T, 1.0f, 1.0f);
#endif
}

/* The fused backward's second kernel: dq of a launch's dq.ngroups groups from
 * their partials.  Row i of a query head sums key tiles j = 0 .. (causal: i /
 * KEYS; else the last) in the order of j, in fp32, times the scale, stored as
 * io says (mma_put2 M).  A thread: 8 columns of a row; grid.y: the launch's
 * query heads. */
template <int HD, int KEYS, int M>
__global__ void __launch_bounds__(256) mma_dq_sum(MmaArgs a, MmaDq dq) {
  constexpr int G = HD / 8;
  /* (divisions by constants or of 32 bits: a 64-bit division's call spills) */
  const int rep = (int)a.H / (int)a.KV, hh = (int)blockIdx.y; /* the launch's query head hh */
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, T = a.T;
  if (e >= T * G) return;
  const int c = (int)(e % G) * 8;
  const int64_t i = e / G;
  const int bg = dq.g0 + hh / rep, kv = (int)a.KV;
  const int64_t b = bg / kv, h = bg % kv * rep + hh % rep;
  const int64_t last = a.causal ? i / KEYS : (T + KEYS - 1) / KEYS - 1;
  const float *p = dq.p + hh * dq.rows * HD + c;
  float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int64_t j = 0; j <= last; j++) {
    const float *r = p + (mma_dq_off(j, T, KEYS, a.causal) + i - (a.causal ? j * KEYS : 0)) * HD;
    const float4 u = *(const float4 *)r, v = *(const float4 *)(r + 4);
    x[0] += u.x, x[1] += u.y, x[2] += u.z, x[3] += u.w;
    x[4] += v.x, x[5] += v.y, x[6] += v.z, x[7] += v.w;
  }
  const int64_t C = a.H + 2 * a.KV;
  const int64_t off = rt_attn_row(a.otok, b, h, C, 0, T, HD) + i * rt_attn_ld(a.otok, C, HD) + c;
#pragma unroll
  for (int k = 0; k < 8; k++) x[k] *= a.scale;
  if constexpr (M == 1) { /* 8 bf16: one 16-byte store (off is a multiple of 8) */
    *(int4 *)((bf16 *)a.dqkv + off) =
        make_int4((int)rt_pk_bf16(x[0], x[1]), (int)rt_pk_bf16(x[2], x[3]),
                  (int)rt_pk_bf16(x[4], x[5]), (int)rt_pk_bf16(x[6], x[7]));
  } else {
#pragma unroll
    for (int k = 0; k < 4; k++) mma_put2<M>(a.dqkv, off + 2 * k, x[2 * k], x[2 * k + 1]);
  }
}

/* ---- launching ---- */

template <typename K, typename... A>
static int mma_launch(RtCuda *c, const char *op, K kern, dim3 grid, int threads, size_t bytes,
                      const A &...args) {
  if (bytes > 48 * 1024)
    CU_CHECK(c, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
             op);
  kern<<<grid, threads, bytes, c->compute>>>(args...);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}

/* dq: the fused backward's scratch, or dq.ngroups 0 (the forward; the split kernels) */
template <int HD, bool IO, int W>
static int mma_run_io(RtCuda *c, const MmaArgs &a, const MmaDq &dq, int64_t B, bool grad) {
  typedef MmaShape<HD, W> S;
  const unsigned tiles = (unsigned)((a.T + S::ROWS - 1) / S::ROWS);
  const dim3 gq(tiles, (unsigned)(B * a.H)), gkv(tiles, (unsigned)(B * a.KV));
  if (!grad) return mma_launch(c, "sdpa (mma)", mma_fwd<HD, IO, W>, gq, S::THREADS, S::fwd, a);
  if (!dq.ngroups) { /* the split kernels: dk, dv, then dq (its products again) */
    if (mma_launch(c, "sdpa_grad (dk, dv, mma)", mma_bwd_kv<HD, IO, W, false>, gkv, S::THREADS,
                   S::kv, a, dq))
      return RT_ERR;
    return mma_launch(c, "sdpa_grad (dq, mma)", mma_bwd_q<HD, IO, W>, gq, S::THREADS, S::dq, a);
  }
  /* fused: dk, dv and dq's partials a launch of groups, then their sums */
  const unsigned io = IO ? a.io : 0u;
  auto sum = io & RT_CUDA_ATTN_O_BF16    ? mma_dq_sum<HD, S::ROWS, 1>
             : io & RT_CUDA_ATTN_O_ROUND ? mma_dq_sum<HD, S::ROWS, 2>
                                         : mma_dq_sum<HD, S::ROWS, 0>;
  const int groups = (int)(B * a.KV);
  for (int g0 = 0; g0 < groups; g0 += dq.ngroups) {
    MmaDq l = dq;
    l.g0 = g0;
    l.ngroups = std::min(groups - g0, dq.ngroups);
    if (mma_launch(c, "sdpa_grad (dk, dv, dq parts, mma)", mma_bwd_kv<HD, IO, W, true>,
                   dim3(tiles, (unsigned)l.ngroups), S::THREADS, S::kvq, a, l))
      return RT_ERR;
    const dim3 grid((unsigned)(((int64_t)a.T * (HD / 8) + 255) / 256),
                    (unsigned)(l.ngroups * (a.H / a.KV)));
    if (mma_launch(c, "sdpa_grad (dq sums, mma)", sum, grid, 256, 0, a, l)) return RT_ERR;
  }
  return RT_OK;
}

/* PARC_CUDA_ATTN=mma4: blocks of 4 warps (64 rows, two blocks an SM) instead of
 * MMA_WARPS, for comparison on a GPU (gpu_ops_check's "mma4" rows, check.sh);
 * built for the trainers' case only: bf16 tensors (io) and hd 64 or 128.  A
 * row's sums run in the same order in either, so the results are the same bits. */
static bool mma_warps4(unsigned io, int64_t hd) {
  return rt_cuda_attn_env("mma4") && (io & ~(unsigned)RT_CUDA_ATTN_LAYOUT) &&
         (hd == 64 || hd == 128);
}

int rt_cuda_attn_mma_warps(int64_t hd, unsigned io) {
  return mma_warps4(io, hd) ? 4 : MMA_WARPS;
}

/* the kernels for a.io: with every tensor fp32, those without the io branches */
template <int HD>
static int mma_run(RtCuda *c, const MmaArgs &a, const MmaDq &dq, int64_t B, bool grad) {
  if constexpr (HD == 64 || HD == 128)
    if (mma_warps4(a.io, HD)) return mma_run_io<HD, true, 4>(c, a, dq, B, grad);
  return a.io ? mma_run_io<HD, true, MMA_WARPS>(c, a, dq, B, grad)
              : mma_run_io<HD, false, MMA_WARPS>(c, a, dq, B, grad);
}

static int mma_dispatch(RtCuda *c, const MmaArgs &a, const MmaDq &dq, int64_t B, int64_t hd,
                        bool grad) {
  return rt_attn_by_hd(
      hd, [&](auto h) { return mma_run<decltype(h)::value>(c, a, dq, B, grad); },
      [&] { return rt_fail("sdpa (mma): head dimension %lld", (long long)hd); });
}

/* rt_cuda_attn_tc.cu's shapes (hd a multiple of 16 up to 128): the forward
 * (out, and lse unless NULL) */
int rt_cuda_sdpa_mma(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                     const float *v, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                     float scale, int causal, unsigned io) {
  const MmaArgs a = {q, k, v, NULL, NULL, NULL, NULL, out, lse, H, KV, (int)T, scale, causal != 0,
                     io & ~(unsigned)RT_CUDA_ATTN_LAYOUT, (io & RT_CUDA_ATTN_O_TOKENS) != 0, false,
                     (io & RT_CUDA_ATTN_QKV_TOKENS) != 0,
                     rt_attn_in_ld((io & RT_CUDA_ATTN_QKV_TOKENS) != 0, H, KV, (int)hd)};
  return mma_dispatch(c, a, MmaDq{NULL, 0, 0, 0}, B, hd, false);
}

/* the backward from the rows' statistics lse (natural log) and d = dy . out */
int rt_cuda_sdpa_grad_mma(RtCuda *c, float *dqkv, const float *q, const float *k, const float *v,
                          const float *dy, const float *lse, const float *d, int64_t B,
                          int64_t H, int64_t KV, int64_t T, int64_t hd, float scale, int causal,
                          unsigned io) {
  const MmaArgs a = {q, k, v, dy, lse, d, dqkv, NULL, NULL, H, KV, (int)T, scale, causal != 0,
                     io & ~(unsigned)RT_CUDA_ATTN_LAYOUT, (io & RT_CUDA_ATTN_O_TOKENS) != 0,
                     (io & RT_CUDA_ATTN_DY_TOKENS) != 0, (io & RT_CUDA_ATTN_QKV_TOKENS) != 0,
                     rt_attn_in_ld((io & RT_CUDA_ATTN_QKV_TOKENS) != 0, H, KV, (int)hd)};
  MmaDq dq = {NULL, 0, 0, 0};
  if (!rt_cuda_attn_env("split")) { /* the fused backward where its scratch fits */
    const int64_t keys = 16 * rt_cuda_attn_mma_warps(hd, io);
    const int64_t group = rt_cuda_attn_dq_group(H, KV, T, hd, causal, keys);
    /* the trainer's planned scratch (RtCudaSetup.attn_dq_bytes), or else what the
     * plan would be (grown on first use), one group at least */
    int64_t avail = (int64_t)c->ws_plan[WS_ATTN_DQ];
    if (!avail) avail = std::max(rt_cuda_attn_dq_ws(B, H, KV, T, hd, causal), group);
    dq.ngroups = (int)rt_cuda_attn_dq_groups(B, H, KV, T, hd, causal, keys, avail);
    dq.rows = rt_cuda_attn_dq_rows(T, keys, causal);
    if (dq.ngroups) {
      dq.p = (float *)rt_cuda_ws(c, WS_ATTN_DQ, (size_t)(dq.ngroups * group));
      if (!dq.p) return RT_ERR;
    }
  }
  return mma_dispatch(c, a, dq, B, hd, true);
}
