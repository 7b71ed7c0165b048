/* runtime/rt_rng.h -- counter-based random numbers for parameter initialisation.
 *
 * Invariants:
 *  - Every value is a pure function of (seed, stream, index): no state, no order
 *    dependence, so any rank, thread or layout computes the same number for the
 *    same global element.
 *  - stream = rt_param_stream(full dotted parameter name); index = the element's
 *    row-major linear index in the UNSHARDED (global) tensor. Hence a shard
 *    initialised with rt_init_normal_slice holds exactly its slice of the tensor
 *    that a one-rank trainer initialises.
 *  - Philox4x32-10 (Salmon et al., SC'11): key = seed (low word first); counter =
 *    (index lo, index hi, stream lo, stream hi). For a fixed key Philox is a
 *    bijection of the counter, so distinct (stream, index) pairs never share a block.
 *  - rt_rng_normal: Box-Muller on the first two 32-bit words x0, x1 of the block:
 *    u1 = (x0 + 1) / 2^32 in (0, 1], u2 = x1 / 2^32 in [0, 1),
 *    z = sqrt(-2 ln u1) * cos(2 pi u2), computed in double, rounded to float. */
#ifndef PARC_RT_RNG_H
#define PARC_RT_RNG_H

#include <stdint.h>

/* One Philox4x32 block with 10 rounds. */
void rt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* FNV-1a 64-bit hash of the full dotted parameter name ("h.0.attn.c_attn.weight"). */
uint64_t rt_param_stream(const char *param_name);

/* A standard normal for element `index`. */
float rt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* A uniform in [0, 1) for element `index` (24 bits of x0). */
float rt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* Fills dst with the sub-tensor of the row-major global tensor (rank dims of
 * global_shape) in which dimension `dim` is restricted to [start, start+len);
 * dim = -1 means the whole tensor (start and len are then ignored). Elements are
 * written in row-major order of the slice, each equal to
 * std * rt_rng_normal(seed, stream, global linear index).
 * Returns RT_OK, or RT_ERR (bad rank, dim, negative size, slice out of range). */
int rt_init_normal_slice(float *dst, uint64_t seed, uint64_t stream, float std, int rank,
                         const int64_t *global_shape, int dim, int64_t start, int64_t len);

/* The first run's global index of run r (rt_init_normal_runs). */
typedef int64_t (*RtRunStartFn)(const void *ctx, int64_t r);

/* Fills nruns runs of lrun elements, run r at dst + r lrun: its first `run`
 * (<= lrun) elements std * rt_rng_normal(seed, stream, start(ctx, r) + t) for
 * t < run, the rest 0 (a shard's padding).  Runs on the thread pool
 * (rt_pool.h) in chunks of whole elements; each element is a pure function of
 * its global index, so the values never depend on the pool's size. */
void rt_init_normal_runs(float *dst, uint64_t seed, uint64_t stream, float std, int64_t nruns,
                         int64_t run, int64_t lrun, RtRunStartFn start, const void *ctx);

/* Number of elements of the slice described as above (-1 on invalid arguments). */
int64_t rt_slice_numel(int rank, const int64_t *global_shape, int dim, int64_t start,
                       int64_t len);

void rt_fill(float *dst, int64_t n, float value);
void rt_fill_zeros(float *dst, int64_t n);
void rt_fill_ones(float *dst, int64_t n);

#endif
