/* runtime/cuda/rt_cuda_attn.cu -- flash-style scaled dot-product attention,
 * forward and backward, on the GPU (the semantics of rt_attention.h: layouts
 * [B, H, T, hd] / [B, KV, T, hd], causal, grouped-query heads h -> h / (H/KV),
 * dqkv [B, H + 2 KV, T, hd]).  No T x T matrix exists anywhere: scores live in
 * registers, one key tile at a time.
 *
 * Mapping ("a warp per query row, a lane per key"): a block of WARPS warps
 * holds QR query rows per warp in shared memory and streams the keys and
 * values in tiles of 32 rows through shared memory.  For a tile, lane j
 * computes the score of key j against each of the warp's rows (a dot product
 * over hd, q broadcast from shared memory, k read at row stride hd + 1 so the
 * 32 lanes hit 32 banks); the online softmax takes the tile's max and sum by
 * warp shuffles; the output accumulates p_j v_j with lane l owning head
 * dimensions l, l + 32, ... (NC of them: hd <= 32 NC) and p_j broadcast by a
 * shuffle.  Every sum runs in a fixed order: results are reproducible.
 *
 * Backward (three kernels, no atomics, each output written by one warp):
 *   stats   per query row lse = m + log l and D = dy . o (2 floats per row of
 *           workspace).  Given lse and D (rt_cuda_sdpa_grad_stats: the
 *           trainers keep lse and compute D from the merged output by
 *           rt_cuda_sdpa_delta, passes/attn_delta.c) both are read where
 *           they are; given the forward's out and lse (the IR's sdpa buffer
 *           holds lse after out), attn_rowdot computes D = dy . out, a warp
 *           per row; without either, the forward runs again
 *           (attn_fwd<.., true>);
 *   dk, dv  a warp per KR keys of one kv head, streaming the query rows of its
 *           H/KV heads in tiles of 32 (lane i a query row):
 *           p = exp(scale q.k - lse), ds = p (dy.v - D),
 *           dv += p dy, dk += scale ds q   (heads, then rows, ascending);
 *   dq      a warp per QR query rows, streaming key tiles as the forward:
 *           dq = scale sum_u ds_u k_u.
 * hd up to 256; shared memory above 48 KiB is requested per kernel.
 * Every kernel family here and in rt_cuda_attn_tc.cu / _mma.cu also writes its
 * result (out, dqkv) and reads dy token-major when asked (RT_CUDA_ATTN_O_TOKENS,
 * _DY_TOKENS: rows H hd or (H + 2 KV) hd apart, rt_attn_row), the same values. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

#include "runtime/cuda/rt_cuda_attn_tile.h"
#include "runtime/cuda/rt_cuda_impl.h"

#define WARPS 4
#define QR 4              /* query rows per warp (forward, dq) */
#define KR 4              /* keys per warp (dk, dv) */
#define TILE 32           /* keys (or query rows) per streamed tile */
#define ROWS (WARPS * QR) /* query rows per block */
#define FULL 0xffffffffu

static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
  return v;
}

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  return v;
}

/* Rows [r0, r0 + n) of a [T, hd] matrix of row stride sld (0: hd) into shared
 * rows of stride ld (rows past T are zero). */
static __device__ __forceinline__ void load_rows(float *dst, int ld, const float *src, int64_t r0,
                                                 int n, int64_t T, int hd, int sld = 0) {
  const int64_t st = sld ? sld : hd;
  for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    dst[r * ld + d] = r0 + r < T ? src[(r0 + r) * st + d] : 0.0f;
  }
}

struct AttnArgs {
  const float *q, *k, *v, *dy;
  float *out, *lse, *stat_lse, *stat_d, *dqkv;
  int64_t B, H, KV, T;
  int hd;
  float scale;
  int causal;
  bool otok, dytok; /* out / dqkv token-major, dy token-major (RT_CUDA_ATTN_*_TOKENS) */
  bool qkvtok;      /* q, k, v packed token-major (RT_CUDA_ATTN_QKV_TOKENS) */
  int ldi;          /* q's, k's, v's row stride (rt_attn_in_ld): every load of them */
};

/* row 0 of operand j's (0 q, 1 k, 2 v) head h in batch b (rt_attn_in) */
static __device__ __forceinline__ const float *attn_in(const AttnArgs &a, int j, int64_t b,
                                                       int64_t h) {
  const float *p = j == 0 ? a.q : j == 1 ? a.k : a.v;
  /* (head-major spelled out: rt_attn_in's select made ptxas spill attn_fwd) */
  if (!a.qkvtok) return p + (b * (j ? a.KV : a.H) + h) * a.T * a.hd;
  return p + rt_attn_in(true, j, b, h, a.H, a.KV, a.T, a.hd);
}

/* STATS == false: out (and lse when given).  STATS == true: stat_lse, stat_d. */
template <int NC, bool STATS>
__global__ void __launch_bounds__(WARPS * 32) attn_fwd(AttnArgs a) {
  extern __shared__ float sh[];
  const int hd = a.hd, ldk = hd + 1, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  float *qs = sh, *ks = qs + ROWS * hd, *vs = ks + TILE * ldk;
  const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  const int64_t T = a.T, row0 = (int64_t)blockIdx.x * ROWS;
  const float *qh = attn_in(a, 0, b, h), *kh = attn_in(a, 1, b, g), *vh = attn_in(a, 2, b, g);
  load_rows(qs, hd, qh, row0, ROWS, T, hd, a.ldi);
  float m[QR], l[QR], o[QR][NC];
  for (int i = 0; i < QR; i++) {
    m[i] = -INFINITY, l[i] = 0.0f;
    for (int c = 0; c < NC; c++) o[i][c] = 0.0f;
  }
  int64_t last = row0 + ROWS < T ? row0 + ROWS : T; /* rows [row0, last) */
  int64_t kend = a.causal ? last : T;
  for (int64_t j0 = 0; j0 < kend; j0 += TILE) {
    __syncthreads(); /* the previous tile is consumed (and qs is loaded) */
    load_rows(ks, ldk, kh, j0, TILE, kend, hd, a.ldi);
    load_rows(vs, ldk, vh, j0, TILE, kend, hd, a.ldi);
    __syncthreads();
    float s[QR];
    for (int i = 0; i < QR; i++) s[i] = 0.0f;
    for (int d = 0; d < hd; d++) {
      float kv = ks[lane * ldk + d];
      for (int i = 0; i < QR; i++) s[i] += qs[(w * QR + i) * hd + d] * kv;
    }
    int64_t j = j0 + lane;
    for (int i = 0; i < QR; i++) {
      int64_t row = row0 + w * QR + i;
      bool ok = j < kend && row < T && (!a.causal || j <= row);
      float sc = ok ? s[i] * a.scale : -INFINITY;
      float mn = fmaxf(m[i], warp_max(sc));
      float p = ok ? expf(sc - mn) : 0.0f;
      float alpha = mn == -INFINITY ? 1.0f : expf(m[i] - mn); /* 0 on the first tile */
      l[i] = l[i] * alpha + warp_sum(p);
      m[i] = mn;
      for (int c = 0; c < NC; c++) o[i][c] *= alpha;
      for (int jj = 0; jj < TILE; jj++) {
        float pj = __shfl_sync(FULL, p, jj);
        for (int c = 0; c < NC; c++) {
          int d = lane + 32 * c;
          if (d < hd) o[i][c] += pj * vs[jj * ldk + d];
        }
      }
    }
  }
  for (int i = 0; i < QR; i++) {
    int64_t row = row0 + w * QR + i;
    if (row >= T) continue;
    float inv = 1.0f / l[i];
    if (STATS) {
      const int64_t ybase = rt_attn_row(a.dytok, b, h, a.H, row, T, hd);
      float dd = 0.0f;
      for (int c = 0; c < NC; c++) {
        int d = lane + 32 * c;
        if (d < hd) dd += a.dy[ybase + d] * (o[i][c] * inv);
      }
      dd = warp_sum(dd);
      if (lane == 0) {
        a.stat_lse[bh * T + row] = m[i] + logf(l[i]);
        a.stat_d[bh * T + row] = dd;
      }
    } else {
      const int64_t base = rt_attn_row(a.otok, b, h, a.H, row, T, hd);
      for (int c = 0; c < NC; c++) {
        int d = lane + 32 * c;
        if (d < hd) a.out[base + d] = o[i][c] * inv;
      }
      if (a.lse && lane == 0) a.lse[bh * T + row] = m[i] + logf(l[i]);
    }
  }
}

static __device__ __forceinline__ float rowdot_ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float rowdot_ld(const __nv_bfloat16 *p, int64_t i) {
  return __bfloat162float(p[i]); /* exact */
}

/* d[.] = dy[r, :] . out[r, :] for rows r < rows of [rows, hd] (a warp per row,
 * lanes over hd, a fixed shuffle tree: reproducible).  H == 0: d[r]; else the
 * rows are merged ones, r = (b T + t) H + h of [B, T, H hd], and the result
 * goes to d[(b H + h) T + t] (sdpa_delta).  DY, OUT: float, or __nv_bfloat16
 * where sdpa_delta's tensors are stored so (widened exactly: the result is
 * that of their fp32 values). */
template <typename DY, typename OUT>
__global__ void __launch_bounds__(WARPS * 32) attn_rowdot(const DY *dy, const OUT *out, float *d,
                                                          int64_t rows, int hd, int64_t H,
                                                          int64_t T) {
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (r >= rows) return; /* warp-uniform */
  float s = 0.0f;
  for (int c = lane; c < hd; c += 32) s += rowdot_ld(dy, r * hd + c) * rowdot_ld(out, r * hd + c);
  s = warp_sum(s);
  if (lane == 0) d[H ? (r / H / T * H + r % H) * T + r / H % T : r] = s;
}

/* Eight consecutive elements at p widened exactly: one 16-byte load for bf16
 * (p 16-byte aligned), two for float. */
static __device__ __forceinline__ void rowdot_ld8(const float *p, float x[8]) {
  const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
static __device__ __forceinline__ void rowdot_ld8(const __nv_bfloat16 *p, float x[8]) {
  const int4 u = *(const int4 *)(const void *)p;
  __nv_bfloat162 h[4];
  memcpy(h, &u, sizeof h);
  for (int k = 0; k < 4; k++) x[2 * k] = __low2float(h[k]), x[2 * k + 1] = __high2float(h[k]);
}

/* attn_rowdot with 8-wide loads (hd a multiple of 8, both tensors 16-byte
 * aligned): a row takes G lanes of a warp (G a power of two, G 8 >= hd or
 * the lanes loop), a warp 32 / G rows.  Lane j of a row sums columns
 * [8 j, 8 j + 8), [8 (j + G), ...) in order, then the row's lanes add by a
 * fixed xor tree within their G: one order for every DY, OUT pair, so the
 * bf16 variants give the bits of the float one on the same values. */
template <typename DY, typename OUT>
__global__ void __launch_bounds__(WARPS * 32) attn_rowdot8(const DY *dy, const OUT *out, float *d,
                                                           int64_t rows, int hd, int G, int64_t H,
                                                           int64_t T) {
  const int lane = threadIdx.x & 31, j = lane & (G - 1);
  const int64_t r = ((int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5)) * (32 / G) + lane / G;
  float s = 0.0f;
  if (r < rows) /* (not warp-uniform: every lane still shuffles below) */
    for (int c = 8 * j; c < hd; c += 8 * G) {
      float a[8], b[8];
      rowdot_ld8(dy + r * hd + c, a);
      rowdot_ld8(out + r * hd + c, b);
      for (int k = 0; k < 8; k++) s += a[k] * b[k];
    }
  for (int o = G / 2; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
  if (r < rows && j == 0) d[H ? (r / H / T * H + r % H) * T + r / H % T : r] = s;
}

/* dk, dv of keys [k0, k0 + WARPS KR) of kv head (b, g). */
template <int NC>
__global__ void __launch_bounds__(WARPS * 32) attn_bwd_kv(AttnArgs a) {
  extern __shared__ float sh[];
  const int hd = a.hd, ld = hd + 1, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int KB = WARPS * KR;
  float *ks = sh, *vs = ks + KB * hd, *qs = vs + KB * hd, *dys = qs + TILE * ld;
  float *ls = dys + TILE * ld, *ds_ = ls + TILE;
  const int64_t bg = blockIdx.y, b = bg / a.KV, g = bg % a.KV, T = a.T;
  const int64_t k0 = (int64_t)blockIdx.x * KB, rep = a.H / a.KV, C = a.H + 2 * a.KV;
  const float *kh = attn_in(a, 1, b, g), *vh = attn_in(a, 2, b, g);
  load_rows(ks, hd, kh, k0, KB, T, hd, a.ldi);
  load_rows(vs, hd, vh, k0, KB, T, hd, a.ldi);
  float dk[KR][NC], dv[KR][NC];
  for (int r = 0; r < KR; r++)
    for (int c = 0; c < NC; c++) dk[r][c] = dv[r][c] = 0.0f;
  int64_t i_begin = a.causal ? k0 / TILE * TILE : 0;
  for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
    const int64_t bh = b * a.H + h;
    const float *qh = attn_in(a, 0, b, h), *dyh = a.dy + rt_attn_row(a.dytok, b, h, a.H, 0, T, hd);
    for (int64_t i0 = i_begin; i0 < T; i0 += TILE) {
      __syncthreads();
      load_rows(qs, ld, qh, i0, TILE, T, hd, a.ldi);
      load_rows(dys, ld, dyh, i0, TILE, T, hd, rt_attn_ld(a.dytok, a.H, hd));
      if (threadIdx.x < TILE) {
        int64_t i = i0 + threadIdx.x;
        ls[threadIdx.x] = i < T ? a.stat_lse[bh * T + i] : 0.0f;
        ds_[threadIdx.x] = i < T ? a.stat_d[bh * T + i] : 0.0f;
      }
      __syncthreads();
      int64_t i = i0 + lane;
      for (int r = 0; r < KR; r++) {
        int kr = w * KR + r;
        int64_t u = k0 + kr;
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < hd; d++) {
          s += qs[lane * ld + d] * ks[kr * hd + d];
          dp += dys[lane * ld + d] * vs[kr * hd + d];
        }
        bool ok = i < T && u < T && (!a.causal || u <= i);
        float p = ok ? expf(s * a.scale - ls[lane]) : 0.0f;
        float ds = p * (dp - ds_[lane]);
        for (int jj = 0; jj < TILE; jj++) {
          float pj = __shfl_sync(FULL, p, jj), dsj = __shfl_sync(FULL, ds, jj);
          for (int c = 0; c < NC; c++) {
            int d = lane + 32 * c;
            if (d < hd) {
              dv[r][c] += pj * dys[jj * ld + d];
              dk[r][c] += dsj * qs[jj * ld + d];
            }
          }
        }
      }
    }
  }
  for (int r = 0; r < KR; r++) {
    int64_t u = k0 + w * KR + r;
    if (u >= T) continue;
    float *dkr = a.dqkv + rt_attn_row(a.otok, b, a.H + g, C, u, T, hd);
    float *dvr = a.dqkv + rt_attn_row(a.otok, b, a.H + a.KV + g, C, u, T, hd);
    for (int c = 0; c < NC; c++) {
      int d = lane + 32 * c;
      if (d < hd) {
        dkr[d] = a.scale * dk[r][c];
        dvr[d] = dv[r][c];
      }
    }
  }
}

/* dq of query rows [row0, row0 + ROWS) of head (b, h). */
template <int NC>
__global__ void __launch_bounds__(WARPS * 32) attn_bwd_q(AttnArgs a) {
  extern __shared__ float sh[];
  const int hd = a.hd, ldk = hd + 1, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  float *qs = sh, *dys = qs + ROWS * hd, *ks = dys + ROWS * hd, *vs = ks + TILE * ldk;
  const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  const int64_t T = a.T, row0 = (int64_t)blockIdx.x * ROWS, C = a.H + 2 * a.KV;
  const float *kh = attn_in(a, 1, b, g), *vh = attn_in(a, 2, b, g);
  load_rows(qs, hd, attn_in(a, 0, b, h), row0, ROWS, T, hd, a.ldi);
  load_rows(dys, hd, a.dy + rt_attn_row(a.dytok, b, h, a.H, 0, T, hd), row0, ROWS, T, hd,
            rt_attn_ld(a.dytok, a.H, hd));
  float lse[QR], dd[QR], dq[QR][NC];
  for (int i = 0; i < QR; i++) {
    int64_t row = row0 + w * QR + i;
    lse[i] = row < T ? a.stat_lse[bh * T + row] : 0.0f;
    dd[i] = row < T ? a.stat_d[bh * T + row] : 0.0f;
    for (int c = 0; c < NC; c++) dq[i][c] = 0.0f;
  }
  int64_t last = row0 + ROWS < T ? row0 + ROWS : T;
  int64_t kend = a.causal ? last : T;
  for (int64_t j0 = 0; j0 < kend; j0 += TILE) {
    __syncthreads();
    load_rows(ks, ldk, kh, j0, TILE, kend, hd, a.ldi);
    load_rows(vs, ldk, vh, j0, TILE, kend, hd, a.ldi);
    __syncthreads();
    float s[QR], dp[QR];
    for (int i = 0; i < QR; i++) s[i] = dp[i] = 0.0f;
    for (int d = 0; d < hd; d++) {
      float kv = ks[lane * ldk + d], vv = vs[lane * ldk + d];
      for (int i = 0; i < QR; i++) {
        s[i] += qs[(w * QR + i) * hd + d] * kv;
        dp[i] += dys[(w * QR + i) * hd + d] * vv;
      }
    }
    int64_t j = j0 + lane;
    for (int i = 0; i < QR; i++) {
      int64_t row = row0 + w * QR + i;
      bool ok = j < kend && row < T && (!a.causal || j <= row);
      float p = ok ? expf(s[i] * a.scale - lse[i]) : 0.0f;
      float ds = p * (dp[i] - dd[i]);
      for (int jj = 0; jj < TILE; jj++) {
        float dsj = __shfl_sync(FULL, ds, jj);
        for (int c = 0; c < NC; c++) {
          int d = lane + 32 * c;
          if (d < hd) dq[i][c] += dsj * ks[jj * ldk + d];
        }
      }
    }
  }
  for (int i = 0; i < QR; i++) {
    int64_t row = row0 + w * QR + i;
    if (row >= T) continue;
    float *dst = a.dqkv + rt_attn_row(a.otok, b, h, C, row, T, hd);
    for (int c = 0; c < NC; c++) {
      int d = lane + 32 * c;
      if (d < hd) dst[d] = a.scale * dq[i][c];
    }
  }
}

/* ---- launching ---- */

static int check_args(const char *op, const void *out, const float *q, const float *k,
                      const float *v, const float *dy, int grad, int64_t B, int64_t H,
                      int64_t KV, int64_t T, int64_t hd) {
  if (!out || !q || !k || !v || (grad && !dy))
    return rt_fail("%s: NULL %s pointer", op,
                   !out ? "output" : !q ? "q" : !k ? "k" : !v ? "v" : "dy");
  if (B < 1 || H < 1 || KV < 1 || T < 1 || hd < 1)
    return rt_fail("%s: dimensions must be >= 1, got B %lld, H %lld, KV %lld, T %lld, hd %lld",
                   op, (long long)B, (long long)H, (long long)KV, (long long)T, (long long)hd);
  if (H % KV)
    return rt_fail("%s: %lld query heads are not a multiple of %lld kv heads", op,
                   (long long)H, (long long)KV);
  if (hd > 256)
    return rt_fail("%s: head dimension %lld: the GPU kernels take at most 256", op,
                   (long long)hd);
  if (B * H > 65535 || B * KV > 65535)
    return rt_fail("%s: batch x heads %lld above 65535", op, (long long)(B * H));
  return RT_OK;
}

/* Launches kernel k with `bytes` of dynamic shared memory (raising the limit
 * above 48 KiB when needed). */
template <typename K>
static int launch(RtCuda *c, const char *op, K k, dim3 grid, size_t bytes, const AttnArgs &a) {
  if (bytes > 48 * 1024)
    CU_CHECK(c, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
             op);
  k<<<grid, WARPS * 32, bytes, c->compute>>>(a);
  LAUNCH_CHECK(c, op);
  return RT_OK;
}

template <int NC>
static int fwd(RtCuda *c, const AttnArgs &a, bool stats) {
  int hd = a.hd;
  dim3 grid((unsigned)((a.T + ROWS - 1) / ROWS), (unsigned)(a.B * a.H));
  size_t bytes = (size_t)(ROWS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
  return stats ? launch(c, "sdpa_grad (statistics)", attn_fwd<NC, true>, grid, bytes, a)
               : launch(c, "sdpa", attn_fwd<NC, false>, grid, bytes, a);
}

/* stat_lse, stat_d filled already (kept) or recomputed by the forward. */
template <int NC>
static int bwd(RtCuda *c, const AttnArgs &a, bool kept) {
  int hd = a.hd, KB = WARPS * KR;
  if (!kept && fwd<NC>(c, a, true)) return RT_ERR;
  dim3 gkv((unsigned)((a.T + KB - 1) / KB), (unsigned)(a.B * a.KV));
  size_t bkv = (size_t)(2 * KB * hd + 2 * TILE * (hd + 1) + 2 * TILE) * sizeof(float);
  if (launch(c, "sdpa_grad (dk, dv)", attn_bwd_kv<NC>, gkv, bkv, a)) return RT_ERR;
  dim3 gq((unsigned)((a.T + ROWS - 1) / ROWS), (unsigned)(a.B * a.H));
  size_t bq = (size_t)(2 * ROWS * hd + 2 * TILE * (hd + 1)) * sizeof(float);
  return launch(c, "sdpa_grad (dq)", attn_bwd_q<NC>, gq, bq, a);
}

/* The profile's unit of attention work: B H hd times the (query, key)
 * pairs scored (T^2, or T (T + 1) / 2 causal); forward FLOPs are 4 of them
 * (scores and the weighted sum), backward 10 (rt_cuda.h). */
static double attn_pairs(int64_t B, int64_t H, int64_t T, int64_t hd, int causal) {
  double t = (double)T, pairs = causal ? t * (t + 1) / 2 : t * t;
  return (double)B * (double)H * (double)hd * pairs;
}

/* rt_cuda_attn_tc.cu: the bf16 tensor-core kernels (gemm mode bf16, hd % 16 == 0, hd <= 128,
 * unless PARC_CUDA_ATTN=fp32) */
bool rt_cuda_attn_tc(RtCuda *c, int64_t T, int64_t hd);
int rt_cuda_sdpa_tc(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                    const float *v, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                    float scale, int causal, unsigned lay);
int rt_cuda_sdpa_grad_tc(RtCuda *c, float *dqkv, const float *q, const float *k, const float *v,
                         const float *dy, const float *lse, const float *d, int64_t B, int64_t H,
                         int64_t KV, int64_t T, int64_t hd, float scale, int causal,
                         unsigned lay);

/* RT_OK if io (RT_CUDA_ATTN_* flags) is 0 or the mma kernels run this shape. */
static int check_io(RtCuda *c, const char *op, unsigned io, int64_t T, int64_t hd) {
  if (io & ~(unsigned)(RT_CUDA_ATTN_Q_BF16 | RT_CUDA_ATTN_K_BF16 | RT_CUDA_ATTN_V_BF16 |
                       RT_CUDA_ATTN_DY_BF16 | RT_CUDA_ATTN_O_BF16 | RT_CUDA_ATTN_O_ROUND |
                       RT_CUDA_ATTN_LAYOUT) ||
      (io & RT_CUDA_ATTN_O_BF16 && io & RT_CUDA_ATTN_O_ROUND))
    return rt_fail("%s: io flags 0x%x not understood", op, io);
  if (io & ~(unsigned)RT_CUDA_ATTN_LAYOUT && !rt_cuda_attn_mma(c, T, hd))
    return rt_fail("%s: this trainer keeps attention's tensors in bf16 (hd %lld), which only the "
                   "mma tensor-core kernels read: they need GEMM mode bf16, a GPU of compute "
                   "capability 8.0 or more and PARC_CUDA_ATTN unset (or mma4); or regenerate "
                   "the trainer with --bf16-store off", op, (long long)hd);
  return RT_OK;
}

/* bytes of an element of a tensor whose bf16 flag in io is bit */
static double esz(unsigned io, unsigned bit) { return io & bit ? 2.0 : 4.0; }

extern "C" int rt_cuda_sdpa_io(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                               const float *v, int64_t B, int64_t H, int64_t KV, int64_t T,
                               int64_t hd, float scale, int causal, unsigned io) {
  if (check_args("sdpa", out, q, k, v, NULL, 0, B, H, KV, T, hd) ||
      check_io(c, "sdpa", io, T, hd))
    return RT_ERR;
  if (io & RT_CUDA_ATTN_DY_TOKENS) return rt_fail("sdpa: a dy layout flag on the forward");
  RtProfScope ps(c); /* reads q, k, v; writes out (and lse) */
  if (ps.on())
    ps.set(rt_cuda_attn_tc(c, T, hd) ? RT_PROF_ATTENTION_TC : RT_PROF_ATTENTION,
           (double)B * T * hd *
                   (H * (esz(io, RT_CUDA_ATTN_Q_BF16) + esz(io, RT_CUDA_ATTN_O_BF16)) +
                    KV * (esz(io, RT_CUDA_ATTN_K_BF16) + esz(io, RT_CUDA_ATTN_V_BF16))) +
               (lse ? 4.0 * (double)(B * H * T) : 0.0),
           4 * attn_pairs(B, H, T, hd, causal), "sdpa %lldx%lldx%lldx%lldx%lld%s", (long long)B,
           (long long)H, (long long)KV, (long long)T, (long long)hd, causal ? " causal" : "");
  if (io & ~(unsigned)RT_CUDA_ATTN_LAYOUT)
    return rt_cuda_sdpa_mma(c, out, lse, q, k, v, B, H, KV, T, hd, scale, causal, io);
  if (rt_cuda_attn_tc(c, T, hd))
    return rt_cuda_sdpa_tc(c, out, lse, q, k, v, B, H, KV, T, hd, scale, causal, io);
  AttnArgs a = {q, k, v, NULL, out, lse, NULL, NULL, NULL, B, H, KV, T, (int)hd, scale,
                causal != 0, (io & RT_CUDA_ATTN_O_TOKENS) != 0, false,
                (io & RT_CUDA_ATTN_QKV_TOKENS) != 0,
                rt_attn_in_ld((io & RT_CUDA_ATTN_QKV_TOKENS) != 0, H, KV, (int)hd)};
  return hd <= 32 ? fwd<1>(c, a, false) : hd <= 64 ? fwd<2>(c, a, false)
         : hd <= 128 ? fwd<4>(c, a, false) : fwd<8>(c, a, false);
}

extern "C" int rt_cuda_sdpa(RtCuda *c, float *out, float *lse, const float *q, const float *k,
                            const float *v, int64_t B, int64_t H, int64_t KV, int64_t T,
                            int64_t hd, float scale, int causal) {
  return rt_cuda_sdpa_io(c, out, lse, q, k, v, B, H, KV, T, hd, scale, causal, 0);
}

/* The backward with the row statistics from out and lse, from lse and d, or
 * (all NULL) recomputed; the arguments are checked (io only with lse and d). */
static int sdpa_grad(RtCuda *c, float *dqkv, const float *q, const float *k, const float *v,
                     const float *dy, const float *out, const float *lse, const float *d,
                     int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                     int causal, unsigned io) {
  const bool kept = lse != NULL, tc = rt_cuda_attn_tc(c, T, hd);
  RtProfScope ps(c); /* reads q, k, v, dy (and out or d, lse); writes dqkv [B, H + 2 KV, T, hd] */
  if (ps.on())
    ps.set(tc ? RT_PROF_ATTENTION_TC : RT_PROF_ATTENTION,
           (double)B * T * hd *
                   (H * (esz(io, RT_CUDA_ATTN_Q_BF16) + esz(io, RT_CUDA_ATTN_DY_BF16)) +
                    KV * (esz(io, RT_CUDA_ATTN_K_BF16) + esz(io, RT_CUDA_ATTN_V_BF16)) +
                    (H + 2 * KV) * esz(io, RT_CUDA_ATTN_O_BF16)) +
               4.0 * (double)B * (out ? H * T * (hd + 1) : kept ? 2 * H * T : 0),
           10 * attn_pairs(B, H, T, hd, causal), "sdpa_grad %lldx%lldx%lldx%lldx%lld%s",
           (long long)B, (long long)H, (long long)KV, (long long)T, (long long)hd,
           causal ? " causal" : "");
  if (io & ~(unsigned)RT_CUDA_ATTN_LAYOUT) /* (check_io: the mma kernels; lse and d given) */
    return rt_cuda_sdpa_grad_mma(c, dqkv, q, k, v, dy, lse, d, B, H, KV, T, hd, scale, causal, io);
  /* workspace: lse (when recomputed), then D (when not given) */
  float *st = (float *)rt_cuda_ws(c, WS_ATTN, (size_t)(2 * B * H * T) * sizeof(float));
  if (!st) return RT_ERR;
  /* kept: the forward's lse (and d when given), only read (AttnArgs' pointers are not
   * const: the statistics kernel, not run then, writes through them); else the
   * workspace that kernel fills */
  float *st_lse = kept ? (float *)lse : st, *st_d = d ? (float *)d : st + B * H * T;
  if (out) {
    const int64_t rows = B * H * T;
    attn_rowdot<float, float><<<(unsigned)((rows + WARPS - 1) / WARPS), WARPS * 32, 0,
                                c->compute>>>(dy, out, st_d, rows, (int)hd, 0, T);
    LAUNCH_CHECK(c, "sdpa_grad (D = dy . out)");
  }
  if (tc)
    return rt_cuda_sdpa_grad_tc(c, dqkv, q, k, v, dy, kept ? lse : NULL, kept ? st_d : NULL, B,
                                H, KV, T, hd, scale, causal, io);
  AttnArgs a = {q, k, v, dy, NULL, NULL, st_lse, st_d, dqkv, B, H, KV, T, (int)hd, scale,
                causal != 0, (io & RT_CUDA_ATTN_O_TOKENS) != 0, (io & RT_CUDA_ATTN_DY_TOKENS) != 0,
                (io & RT_CUDA_ATTN_QKV_TOKENS) != 0,
                rt_attn_in_ld((io & RT_CUDA_ATTN_QKV_TOKENS) != 0, H, KV, (int)hd)};
  return hd <= 32 ? bwd<1>(c, a, kept) : hd <= 64 ? bwd<2>(c, a, kept)
         : hd <= 128 ? bwd<4>(c, a, kept) : bwd<8>(c, a, kept);
}

extern "C" int rt_cuda_sdpa_grad(RtCuda *c, float *dqkv, const float *q, const float *k,
                                 const float *v, const float *dy, const float *out,
                                 const float *lse, int64_t B, int64_t H, int64_t KV, int64_t T,
                                 int64_t hd, float scale, int causal) {
  if (check_args("sdpa_grad", dqkv, q, k, v, dy, 1, B, H, KV, T, hd)) return RT_ERR;
  if (!out != !lse)
    return rt_fail("sdpa_grad: the forward's %s is NULL but not its %s", !out ? "out" : "lse",
                   !out ? "lse" : "out");
  return sdpa_grad(c, dqkv, q, k, v, dy, out, lse, NULL, B, H, KV, T, hd, scale, causal, 0);
}

extern "C" int rt_cuda_sdpa_grad_stats_io(RtCuda *c, float *dqkv, const float *q,
                                          const float *k, const float *v, const float *dy,
                                          const float *lse, const float *d, int64_t B, int64_t H,
                                          int64_t KV, int64_t T, int64_t hd, float scale,
                                          int causal, unsigned io) {
  if (check_args("sdpa_grad", dqkv, q, k, v, dy, 1, B, H, KV, T, hd) ||
      check_io(c, "sdpa_grad", io, T, hd))
    return RT_ERR;
  if (!lse || !d) return rt_fail("sdpa_grad: NULL %s pointer", !lse ? "lse" : "d");
  return sdpa_grad(c, dqkv, q, k, v, dy, NULL, lse, d, B, H, KV, T, hd, scale, causal, io);
}

extern "C" int rt_cuda_sdpa_grad_stats(RtCuda *c, float *dqkv, const float *q, const float *k,
                                       const float *v, const float *dy, const float *lse,
                                       const float *d, int64_t B, int64_t H, int64_t KV,
                                       int64_t T, int64_t hd, float scale, int causal) {
  return rt_cuda_sdpa_grad_stats_io(c, dqkv, q, k, v, dy, lse, d, B, H, KV, T, hd, scale, causal,
                                    0);
}

extern "C" int rt_cuda_sdpa_delta_io(RtCuda *c, float *d, const float *m, const float *dm,
                                     int64_t B, int64_t H, int64_t T, int64_t hd, unsigned io) {
  if (io & ~(unsigned)(RT_CUDA_ATTN_M_BF16 | RT_CUDA_ATTN_DM_BF16))
    return rt_fail("sdpa_delta: io flags 0x%x not understood", io);
  if (!d || !m || !dm)
    return rt_fail("sdpa_delta: NULL %s pointer", !d ? "output" : !m ? "m" : "dm");
  if (B < 1 || H < 1 || T < 1 || hd < 1 || B * H * T > ((int64_t)1 << 36))
    return rt_fail("sdpa_delta: dimensions must be >= 1 and B H T at most 2^36, got B %lld, "
                   "H %lld, T %lld, hd %lld", (long long)B, (long long)H, (long long)T,
                   (long long)hd);
  const int64_t rows = B * T * H;
  RtProfScope ps(c); /* reads m, dm [B, T, H hd]; writes d [B, H, T] */
  if (ps.on())
    ps.set(RT_PROF_OP,
           (double)(rows * hd) * (esz(io, RT_CUDA_ATTN_M_BF16) + esz(io, RT_CUDA_ATTN_DM_BF16)) +
               4.0 * (double)rows,
           0, "sdpa_delta %lldx%lldx%lldx%lld", (long long)B, (long long)H, (long long)T,
           (long long)hd);
  typedef __nv_bfloat16 bf16;
  const bf16 *mb = (const bf16 *)m, *dmb = (const bf16 *)dm;
  if (hd % 8 == 0 && ((uintptr_t)m | (uintptr_t)dm) % 16 == 0) { /* 8-wide loads */
    int G = 1;
    while (G < 32 && 8 * G < hd) G *= 2;
    const int64_t per = (int64_t)WARPS * (32 / G); /* rows per block */
    const unsigned blocks = (unsigned)((rows + per - 1) / per);
    switch (io) { /* (dy, out) of attn_rowdot8: (dm, m) */
    case 0:
      attn_rowdot8<float, float><<<blocks, WARPS * 32, 0, c->compute>>>(dm, m, d, rows, (int)hd, G,
                                                                        H, T);
      break;
    case RT_CUDA_ATTN_M_BF16:
      attn_rowdot8<float, bf16><<<blocks, WARPS * 32, 0, c->compute>>>(dm, mb, d, rows, (int)hd,
                                                                       G, H, T);
      break;
    case RT_CUDA_ATTN_DM_BF16:
      attn_rowdot8<bf16, float><<<blocks, WARPS * 32, 0, c->compute>>>(dmb, m, d, rows, (int)hd,
                                                                       G, H, T);
      break;
    default:
      attn_rowdot8<bf16, bf16><<<blocks, WARPS * 32, 0, c->compute>>>(dmb, mb, d, rows, (int)hd, G,
                                                                      H, T);
    }
    LAUNCH_CHECK(c, "sdpa_delta");
    return RT_OK;
  }
  const unsigned blocks = (unsigned)((rows + WARPS - 1) / WARPS);
  switch (io) { /* (dy, out) of attn_rowdot: (dm, m) */
  case 0:
    attn_rowdot<float, float><<<blocks, WARPS * 32, 0, c->compute>>>(dm, m, d, rows, (int)hd, H, T);
    break;
  case RT_CUDA_ATTN_M_BF16:
    attn_rowdot<float, bf16><<<blocks, WARPS * 32, 0, c->compute>>>(dm, mb, d, rows, (int)hd, H, T);
    break;
  case RT_CUDA_ATTN_DM_BF16:
    attn_rowdot<bf16, float><<<blocks, WARPS * 32, 0, c->compute>>>(dmb, m, d, rows, (int)hd, H, T);
    break;
  default:
    attn_rowdot<bf16, bf16><<<blocks, WARPS * 32, 0, c->compute>>>(dmb, mb, d, rows, (int)hd, H, T);
  }
  LAUNCH_CHECK(c, "sdpa_delta");
  return RT_OK;
}

extern "C" int rt_cuda_sdpa_delta(RtCuda *c, float *d, const float *m, const float *dm,
                                  int64_t B, int64_t H, int64_t T, int64_t hd) {
  return rt_cuda_sdpa_delta_io(c, d, m, dm, B, H, T, hd, 0);
}
