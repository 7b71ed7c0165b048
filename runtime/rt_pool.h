/* runtime/rt_pool.h -- the runtime's persistent thread pool for data-parallel loops.
 *
 * One process-wide pool of `threads` compute threads: the thread that calls
 * rt_parallel_for works too, so the pool owns threads - 1 workers.  Idle workers
 * sleep on a condition variable; nothing spins.
 *
 * Invariants:
 *  - Chunking is deterministic and independent of the pool size: rt_parallel_for
 *    splits [0, n) into rt_parallel_chunks(n, grain) contiguous chunks whose bounds
 *    (rt_parallel_chunk) depend on n and grain only.  Which thread runs which chunk
 *    is decided at run time, so `fn` must compute the same result for a chunk
 *    whatever thread runs it and in whatever order chunks run (each output element
 *    written by one chunk).  Then results are bit-identical for every pool size,
 *    including no pool at all.
 *  - rt_parallel_for returns after every chunk has finished (a full barrier).
 *  - Never deadlocks on reentry: a call made while the pool is busy -- from inside
 *    `fn` (nested), or from another application thread (ranks that are threads) --
 *    runs its chunks on the calling thread, in order, with the same bounds.
 *  - rt_pool_init / rt_pool_shutdown wait for a loop in flight; call them from the
 *    main thread, not from inside `fn`.
 *
 * BLAS: rt_gemm (rt_gemm.h) runs OpenBLAS single-threaded on this pool's
 * chunks; see rt_gemm.h. */
#ifndef PARC_RT_POOL_H
#define PARC_RT_POOL_H

#include <stdint.h>

#define RT_POOL_MAX_THREADS 256
/* Upper bound on the chunks of one loop: enough for load balance on any pool, few
 * enough that taking a chunk (one atomic add) is never the cost. */
#define RT_POOL_MAX_CHUNKS 256

/* Starts the pool with `threads` compute threads in all (the caller included);
 * 0 means one per online CPU.  Calling it again resizes the pool (a no-op for the
 * same size).  Returns RT_OK, or RT_ERR: threads outside [0, RT_POOL_MAX_THREADS],
 * or a worker could not be created (the pool is then left with 1 thread). */
int rt_pool_init(int threads);

/* Joins the workers; later loops run on the caller alone.  Safe to call twice. */
void rt_pool_shutdown(void);

/* Compute threads in the pool (the caller included); 1 when not started. */
int rt_pool_threads(void);

typedef void (*RtRangeFn)(void *ctx, int64_t begin, int64_t end);

/* Calls fn(ctx, begin, end) once per chunk of [0, n) (see above), chunks
 * running concurrently on the pool.  grain is the smallest chunk worth its own
 * task (values < 1 mean 1): every chunk holds at least min(grain, n) indices.
 * Nothing happens when n <= 0. */
void rt_parallel_for(int64_t n, int64_t grain, RtRangeFn fn, void *ctx);

/* Number of chunks rt_parallel_for cuts [0, n) into:
 * clamp(n / grain, 1, RT_POOL_MAX_CHUNKS); 0 when n <= 0. */
int64_t rt_parallel_chunks(int64_t n, int64_t grain);

/* Bounds of chunk j of nchunks over [0, n): the first n % nchunks chunks hold
 * n / nchunks + 1 indices, the rest n / nchunks, in order. */
void rt_parallel_chunk(int64_t n, int64_t nchunks, int64_t j, int64_t *begin, int64_t *end);

#endif
