/* runtime/rt_comm.h -- communicators: one API, backends chosen at run time.
 *
 * A rank program is written once against RtComm and runs unchanged on either
 * backend:
 *   - threads (default): every rank a thread of one process (rt_comm_threads_run);
 *     collectives run through shared memory.
 *   - MPI: one process per rank under mpirun / srun (rt_comm_mpi_init); collectives
 *     run over MPI point-to-point and non-blocking collectives.  Compiled in when
 *     CMake found MPI; otherwise rt_comm_mpi_init fails with a message.
 *
 * Data: every buffer holds float32; counts and offsets count floats (int64_t).
 * "Block" layouts are contiguous blocks in rank order: with per-rank counts
 * counts[0..size-1], block r starts at counts[0] + ... + counts[r-1].
 * rt_comm_block_counts gives the standard uneven split.
 *
 * Invariants:
 *  - Deterministic sums: every reduction adds the ranks' contributions element by
 *    element in group rank order, ((x0 + x1) + x2) + ..., in float32, with no other
 *    rounding.  Results are therefore bit-identical from run to run, for every
 *    backend (threads and MPI share the summation code), and equal to a serial
 *    loop over the ranks in order.  Copies (gather, broadcast, all_to_all, send /
 *    recv) are bit-exact.
 *  - Collectives are called by every member of the group in the same order with
 *    agreeing arguments (same op, count, root, counts arrays; all_to_all: what j
 *    sends to i is what i expects from j).  The thread backend checks this at
 *    entry and fails every member with a message naming the disagreement; the MPI
 *    backend checks all_to_all counts and otherwise relies on the timeout.
 *  - No silent hang: every blocking call has a deadline, rt_comm_timeout()
 *    seconds after it starts.  Past it the call fails with one line:
 *      rank 3 (group dp, 2 ranks): all_reduce of 1024 floats timed out after 5 s
 *      waiting for rank 1
 *    Ranks in messages are world ranks.
 *  - Thread backend: the first failing rt_comm_ call (or rank_main returning
 *    nonzero) aborts the world: every blocked call of every other rank returns
 *    RT_ERR at once, naming its own rank, group and op and quoting the first
 *    failure, and every later call fails the same way.  A rank that returns from
 *    rank_main while others wait for it fails them at once too.  A rank stuck in
 *    its own code (never calling the communicator) cannot be interrupted: the
 *    others fail at their deadline and rt_comm_threads_run returns once it does.
 *  - MPI backend: a failed call marks the world failed; later calls fail at once,
 *    and rt_comm_mpi_finalize then refuses to finalize: the program should exit
 *    with a nonzero status, and mpirun stops the other ranks.
 *  - Buffers of different ranks never overlap (thread backend: they are in one
 *    address space); a call's send and receive buffers overlap only where a
 *    function says so (in place).
 *  - A communicator handle belongs to its rank: one thread uses it at a time.
 *    Groups are independent: collectives on different groups (say the dp groups
 *    of different tp ranks) run concurrently.  As with MPI, ranks must not wait on
 *    each other in a cycle across groups.  MPI is initialised FUNNELED: under MPI
 *    only the thread that called rt_comm_mpi_init uses communicators.
 *  - All functions return RT_OK or RT_ERR with one line in rt_last_error(). */
#ifndef PARC_RT_COMM_H
#define PARC_RT_COMM_H

#include <stdint.h>

typedef struct RtComm RtComm;

#define RT_COMM_DEFAULT_TIMEOUT_S 300.0
#define RT_COMM_NAME_MAX 32       /* group names are cut to 31 characters */
#define RT_COMM_NO_GROUP (-1)     /* rt_comm_split color: join no group */
#define RT_COMM_MAX_RANKS 4096    /* thread backend */

/* ---- launching ---- */

/* Starts nranks threads, each running rank_main(world, arg) with its own handle on
 * a world communicator of nranks ranks, joins them all and frees every
 * communicator they made.  Returns RT_OK when every rank returned 0, else RT_ERR
 * with the first failure (in time), prefixed "rank R: " unless it names its rank
 * already.  Each rank's own message stays in that thread's rt_last_error(). */
int rt_comm_threads_run(int nranks, int (*rank_main)(RtComm *world, void *arg), void *arg);

/* The one entry point generated trainers call: under mpirun / srun
 * (rt_comm_mpi_launched) it runs rank_main once in this process on the MPI world
 * (nranks must be 0 or the world size) and finalises MPI after a success; otherwise
 * it is rt_comm_threads_run(nranks, ...).  On failure it returns RT_ERR with the
 * rank's message ("rank R: " prefixed as above); under MPI it then leaves MPI
 * unfinalised: exit with a nonzero status (a rank that failed alone must not
 * wait in MPI_Finalize for peers that may never get there).
 * A rank_main that returns RT_COMM_STOP_AGREED says that every rank returns it
 * at the same point, having agreed to stop (a refused setup, all ranks knowing
 * it): under MPI, MPI is then finalised as after a success (MPI_Finalize is
 * collective, and every rank reaches it) and rt_comm_run returns
 * RT_COMM_STOP_AGREED, rt_last_error() still rank_main's message (RT_ERR with
 * the reason if finalising fails); with threads it is a failure like any other
 * nonzero return.  Exit with a nonzero status then too. */
#define RT_COMM_STOP_AGREED (-1000)
int rt_comm_run(int nranks, int (*rank_main)(RtComm *world, void *arg), void *arg);

/* 1 if this libparcrt was built with MPI, else 0. */
int rt_comm_mpi_available(void);

/* 1 if the environment says this process was started by mpirun or srun
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or MPI_LOCALNRANKS is set), else 0. */
int rt_comm_mpi_launched(void);

/* Initialises MPI (unless already initialised) and returns this process's handle
 * on MPI_COMM_WORLD.  RT_ERR when built without MPI. */
int rt_comm_mpi_init(RtComm **world);

/* Frees world (free the groups split from it first) and finalises MPI if
 * rt_comm_mpi_init initialised it; sends still in flight complete first.  If any
 * call on this world failed it frees nothing and returns RT_ERR without finalising
 * (a collective may be left half-done): exit with a nonzero status, which makes
 * mpirun stop every rank. */
int rt_comm_mpi_finalize(RtComm *world);

/* ---- timeouts ---- */

/* Sets the deadline of every later blocking call (all backends, process-wide).
 * RT_ERR unless 0 < seconds <= 1e6.  Default RT_COMM_DEFAULT_TIMEOUT_S, or the
 * environment variable PARC_COMM_TIMEOUT (seconds) when set. */
int rt_comm_set_timeout(double seconds);
double rt_comm_timeout(void);

/* ---- communicators ---- */

int rt_comm_rank(const RtComm *c);        /* 0 .. size-1 in this group */
int rt_comm_size(const RtComm *c);
int rt_comm_world_rank(const RtComm *c);  /* this rank in the world */
const char *rt_comm_name(const RtComm *c); /* "world", "tp", ... */
const char *rt_comm_backend(const RtComm *c); /* "threads" or "mpi" */

/* Collective over c: ranks passing the same color >= 0 form one new group, ordered
 * by key, ties by rank in c; *group is this rank's handle on it, named `name`.
 * color RT_COMM_NO_GROUP joins none and sets *group = NULL. */
int rt_comm_split(RtComm *c, int color, int key, const char *name, RtComm **group);

/* Frees a handle from rt_comm_split (not the world).  NULL is a no-op. */
void rt_comm_free(RtComm *c);

/* The device mesh: world rank r = tp_rank + tp * (dp_rank + dp * pp_rank) (tp
 * fastest, then dp, then pp).  Expert parallelism is carved from dp: the ep group
 * holds ep consecutive dp ranks (ep_rank = dp_rank % ep), and the ep_dp group the
 * dp ranks with the same ep_rank (they hold the same experts).  Groups are named
 * "tp", "dp", "pp", "ep", "ep_dp"; every rank has all five (size 1 for a degree
 * of 1). */
typedef struct {
  int tp, dp, pp, ep;                     /* degrees */
  int tp_rank, dp_rank, pp_rank, ep_rank; /* this rank's coordinates */
  RtComm *tp_comm, *dp_comm, *pp_comm, *ep_comm, *ep_dp_comm;
} RtMesh;

/* Collective over world: RT_ERR unless all degrees >= 1, tp * dp * pp equals the
 * world size and ep divides dp. */
int rt_comm_mesh(RtComm *world, int tp, int dp, int pp, int ep, RtMesh *mesh);
void rt_comm_mesh_free(RtMesh *mesh);

/* counts[0..parts-1] of the standard uneven split of `total` units of `unit` floats
 * each (e.g. rows of `unit` columns): the first total % parts parts hold
 * total / parts + 1 units, the rest total / parts (rt_parallel_chunk's split),
 * times unit. */
void rt_comm_block_counts(int64_t total, int parts, int64_t unit, int64_t *counts);

/* ZeRO-1's local shard, no communication: out[0..s) = elements [r s, (r + 1) s) of
 * x (n floats), zeros past n, r = rt_comm_rank(c) (0 when c is NULL). */
int rt_comm_flat_piece(const RtComm *c, const float *x, int64_t n, float *out, int64_t s);

/* ---- collectives (every member of c calls them, in the same order) ---- */

/* recv[i] = sum over ranks r in order of send_r[i], i < count, on every rank.
 * In place when send == recv. */
int rt_comm_all_reduce(RtComm *c, const float *send, float *recv, int64_t count);

/* recv (sum of counts floats) = the ranks' send blocks in rank order; rank r sends
 * counts[r] floats.  counts agree on every rank.  In place when send equals this
 * rank's block of recv. */
int rt_comm_all_gather(RtComm *c, const float *send, float *recv, const int64_t *counts);

/* send holds sum of counts floats in blocks (block r: counts[r] floats); rank r
 * receives in recv (counts[r] floats) the sum over ranks in order of their block r.
 * In place when recv equals this rank's block of send. */
int rt_comm_reduce_scatter(RtComm *c, const float *send, float *recv, const int64_t *counts);

/* buf (count floats) of rank `root` is copied to every rank's buf. */
int rt_comm_broadcast(RtComm *c, float *buf, int64_t count, int root);

/* Rank i sends send_counts[j] floats from send + send_displs[j] to rank j, and
 * receives recv_counts[j] floats from rank j at recv + recv_displs[j]; rank j's
 * send_counts[i] must equal rank i's recv_counts[j].  NULL displacements mean
 * contiguous blocks in rank order.  send and recv must not overlap. */
int rt_comm_all_to_all(RtComm *c, const float *send, const int64_t *send_counts,
                       const int64_t *send_displs, float *recv, const int64_t *recv_counts,
                       const int64_t *recv_displs);

/* Returns once every member has entered it. */
int rt_comm_barrier(RtComm *c);

/* ---- non-blocking collectives ----
 *
 * rt_comm_*_start begins the collective its blocking twin performs, with the same
 * arguments, checks and results (bit for bit: the same rank-ordered sums), and
 * returns without waiting for the other members; rt_comm_wait(req) returns once it
 * is complete.  Between the two, the caller must not write `send` nor read or write
 * `recv` (the counts arrays are copied: they may go at once).
 *  - Order: the requests of a communicator run one after another in the order they
 *    were started, and every member starts them in the same order (as for blocking
 *    calls).  Any number may be in flight; they may be waited for in any order.
 *  - A blocking collective (or split, barrier) on c first completes c's requests in
 *    flight (their results stay for their waits).  send / recv do not.  Calls on
 *    other communicators run concurrently with them.
 *  - Deadline: rt_comm_timeout() seconds from the start, as a blocking call's from
 *    its entry.  A request that misses it, disagrees with the other members or is
 *    abandoned after another failure fails with the blocking call's one-line
 *    message ("rank 3 (group dp, 2 ranks): all_reduce of 1024 floats timed out
 *    after 5 s waiting for rank 1"), returned by its rt_comm_wait; a start itself
 *    fails only for bad arguments or an already failed world.  Either failure
 *    aborts the world as a blocking call's does.
 *  - Threads backend: a progress thread per handle runs the requests (started on
 *    the first request); a rank returning from rank_main completes its requests
 *    first.  MPI backend: MPI's own non-blocking operations, advanced at every
 *    start and wait on the communicator; the sums are added at the wait's or a
 *    later start's progress, in rank order.
 *  - rt_comm_free (and rt_comm_mesh_free, rt_comm_mpi_finalize) completes the
 *    handle's requests and discards them: wait for them first.  The buffers of a
 *    request must stay valid until it is complete, also when its rank leaves
 *    rank_main without waiting for it.
 * A zero RtCommReq ({0}, RT_COMM_REQ_NONE) is no request: rt_comm_wait returns
 * RT_OK at once; rt_comm_wait leaves *req zero again. */
typedef struct RtCommPending RtCommPending;
typedef struct {
  RtCommPending *p;          /* opaque; NULL: no request */
} RtCommReq;
#define RT_COMM_REQ_NONE ((RtCommReq){0})

int rt_comm_all_reduce_start(RtComm *c, const float *send, float *recv, int64_t count,
                             RtCommReq *req);
int rt_comm_all_gather_start(RtComm *c, const float *send, float *recv, const int64_t *counts,
                             RtCommReq *req);
int rt_comm_reduce_scatter_start(RtComm *c, const float *send, float *recv,
                                 const int64_t *counts, RtCommReq *req);
int rt_comm_wait(RtCommReq *req);

/* ---- point to point (ranks of c; tags >= 0, under MPI up to its MPI_TAG_UB,
 *      at least 32767) ---- */

/* Sends count floats to rank `peer` with `tag`.  Buffered: returns once buf may be
 * reused, never waiting for the matching recv (so any order of sends and recvs
 * that would not deadlock with unbounded buffers does not deadlock). */
int rt_comm_send(RtComm *c, const float *buf, int64_t count, int peer, int tag);

/* Receives the next message from `peer` with `tag` (messages with one (peer, tag)
 * arrive in the order sent) into buf; it must hold exactly count floats. */
int rt_comm_recv(RtComm *c, float *buf, int64_t count, int peer, int tag);

#endif
