/* runtime/rt_attention.h -- scaled dot-product attention on the CPU, forward and
 * backward (the IR ops sdpa and sdpa_grad; the spec is ir/interp.c).
 *
 * Layouts (dense row-major, last dimension fastest):
 *   q, dy, out  [B, H, T, hd]
 *   k, v        [B, KV, T, hd]     H % KV == 0; query head h reads kv head
 *                                  h / (H / KV) (grouped-query attention)
 *   lse         [B, H, T]          optional: logsumexp_u of the scaled scores
 *   dqkv        [B, H + 2 KV, T, hd]: along dimension 1, channels [0, H) hold dq,
 *                                  [H, H + KV) dk, [H + KV, H + 2 KV) dv
 * Scores are scale * q . k; with `causal`, query t sees keys u <= t only.
 *
 * Method (flash attention, on the CPU): a block of RT_SDPA_BLOCK query rows at a
 * time streams over key blocks of RT_SDPA_BLOCK rows with an online softmax
 * (running max and sum, rescaling the partial output), so no T x T matrix exists;
 * scratch is O(RT_SDPA_BLOCK * (RT_SDPA_BLOCK + hd)) floats per chunk.  The backward
 * needs each query row's statistics lse = m + log l (row max m, sum l) and
 * D = dy . o (o the output row; D equals sum_u p[u] dp[u]): given lse and D
 * (rt_sdpa_grad_stats: the trainers keep lse and compute D from the merged
 * output, passes/attn_delta.c), or from the forward's out and lse (the IR's sdpa
 * buffer holds lse after out), else recomputed by the forward's own block loop,
 * the same bits every way.  Then it walks the key blocks: p = exp(s - lse),
 * dp = dy . v, ds = p (dp - D), dq += scale ds k, dk += scale ds q, dv += p dy.
 *
 * Parallelism and determinism: the forward runs one task per (b, h, query block);
 * the backward one task per (b, kv head), which owns dq of its H/KV query heads
 * and dk, dv of its kv head and sums the heads' contributions in head order, then
 * query-block order, then row order.  Every output element is written by exactly
 * one task in a fixed order, so results are bit-identical for any rt_pool size.
 * The backward's parallelism is B*KV tasks (not B*H): that keeps the dk/dv sums in
 * the output itself, without per-head scratch the size of k and v.
 *
 * Precision: all arithmetic in float (scores, softmax statistics, accumulators),
 * exponentials through rt_exp_nonpos (rt_vmath.h, relative error < 8.2e-8).  The
 * online softmax is exact up to rounding (every exponent is <= 0 after the max
 * shift), and every sum has at most T or hd terms; tests hold both routines
 * within 1e-5 relative L2 of the double-precision interpreter.  A score of size S
 * carries S * 2^-24 of rounding into its exponential, so inputs with scores in the
 * hundreds (a saturated softmax) lose accuracy in proportion (1e-4 at |S| ~ 200).
 *
 * Speed: the block products run register-tiled (an AVX2 clone is chosen at run
 * time on x86-64), ~25-30 GFLOP/s per core forward and backward on a Xeon at GPT-2
 * sizes (bench/attention_cpu.c).
 *
 * Both return RT_OK, or RT_ERR (NULL pointer, dimension < 1, H not a multiple of
 * KV, out of memory for the scratch). */
#ifndef PARC_RT_ATTENTION_H
#define PARC_RT_ATTENTION_H

#include <stdint.h>

#define RT_SDPA_BLOCK 64  /* query and key rows per block */

/* out = sdpa(q, k, v) causal scale; also lse when lse != NULL. */
int rt_sdpa(float *out, float *lse, const float *q, const float *k, const float *v,
            int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale, int causal);

/* dqkv = sdpa_grad(q, k, v, dy) causal scale (layout above).  out and lse are
 * rt_sdpa's results for the same q, k, v, scale and causal (then no forward is
 * recomputed), or both NULL (recomputed: the cost of a forward more). */
int rt_sdpa_grad(float *dqkv, const float *q, const float *k, const float *v,
                 const float *dy, const float *out, const float *lse, int64_t B, int64_t H,
                 int64_t KV, int64_t T, int64_t hd, float scale, int causal);

/* dqkv = sdpa_grad(q, k, v, dy) from the row statistics alone: lse (rt_sdpa's)
 * and d [B, H, T], d[row] = dy[row, :] . out[row, :] (rt_sdpa_delta); out is
 * not read.  The same bits as rt_sdpa_grad given out and lse. */
int rt_sdpa_grad_stats(float *dqkv, const float *q, const float *k, const float *v,
                       const float *dy, const float *lse, const float *d, int64_t B, int64_t H,
                       int64_t KV, int64_t T, int64_t hd, float scale, int causal);

/* Layout bits (ir/ir.h's IR_SDPA_*, the same values): RT_SDPA_OUT_TOKENS,
 * the result token-major: out [B, T, H hd], dqkv [B, T, (H + 2 KV) hd] (row
 * b, t: dq's H heads, dk's KV, dv's KV, hd each); RT_SDPA_DY_TOKENS, dy
 * [B, T, H hd]; RT_SDPA_QKV_TOKENS, q, k, v one packed [B, T, H + 2 KV, hd]
 * tensor (row b, t: q's H heads, k's KV, v's KV, hd each; the layout of the
 * token-major dqkv), each of q, k, v pointing at its start.  The values, and
 * the order of every sum, do not change. */
enum { RT_SDPA_OUT_TOKENS = 1, RT_SDPA_DY_TOKENS = 2, RT_SDPA_QKV_TOKENS = 4 };
int rt_sdpa_layout(float *out, float *lse, const float *q, const float *k, const float *v,
                   int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                   int causal, unsigned layout);
int rt_sdpa_grad_stats_layout(float *dqkv, const float *q, const float *k, const float *v,
                              const float *dy, const float *lse, const float *d, int64_t B,
                              int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                              int causal, unsigned layout);

/* d[b, h, t] = sum_i dm[b, t, h hd + i] m[b, t, h hd + i], i ascending, for
 * m, dm [B, T, H hd] (the IR op sdpa_delta): with m = merge_heads(out) and
 * dy = split_heads(dm), rt_sdpa_grad's D, term for term and in its order,
 * so the same bits.  RT_ERR on a NULL pointer or a dimension < 1. */
int rt_sdpa_delta(float *d, const float *m, const float *dm, int64_t B, int64_t H, int64_t T,
                  int64_t hd);

#endif
