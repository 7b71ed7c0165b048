/* runtime/rt_expert.h -- expert parallelism: moving dispatched expert slots
 * to the ranks that hold their experts and back (ir/ops.def,
 * expert_all_to_all; the reference is ir/interp.c, a2a_member).
 *
 * The ep group g has `size` members (rt_comm_size; NULL: one member), member
 * q holding experts [q El, (q + 1) El) of E, El = E / size.  Every member
 * routes its own tokens: idx i32 [nk] are its choices (dispatch's [N, K] in
 * order, -1 for a choice capacity_drop dropped), and for expert e its filled
 * slots are the first n_e = min(count of e in idx, C) of the capacity C, in
 * dispatch's order.  Member i's n_e is written n_ie below.
 *
 * Invariants:
 *  - Only filled slots travel: the members' per-expert counts are
 *    all-gathered first (E floats each, exact: nk <= 2^24), then one
 *    all-to-all with variable counts moves exactly the filled rows.
 *  - Every row not filled is zero in the result.
 *  - The two directions are each other's adjoint (and inverse on the filled
 *    rows): back(fwd(x)) is x with its unfilled rows zeroed.
 *  - Deterministic: pure copies, no arithmetic. */
#ifndef PARC_RT_EXPERT_H
#define PARC_RT_EXPERT_H

#include <stdint.h>

#include "runtime/rt_comm.h"

/* back = 0 (dispatch side): x [E, C, inner], this member's slots of every
 * expert -> out [El, size C, inner], for its own experts the slots every
 * member filled: out[l, i C + c] = x_i[me El + l, c] for c < n_i(me El + l),
 * zero elsewhere (me = this member's rank in g).
 * back = 1 (combine side): x [El, size C, inner] -> out [E, C, inner], the
 * rows of this member's slots back from the experts' owners:
 * out[e, c] = x_o[e % El, me C + c] with o = e / El, for c < n_me(e), zero
 * elsewhere.
 * E, C, inner, nk >= 1, size divides E, idx in [-1, E); x and out must not
 * overlap.  Collective over g: every member calls it with the same E, C,
 * inner and back.  RT_OK, or RT_ERR with one line (rt_err.h). */
int rt_expert_all_to_all(RtComm *g, float *out, const float *x, const int32_t *idx, int64_t nk,
                         int64_t E, int64_t C, int64_t inner, int back);
/* The same; *sent (when not NULL) = the floats this member sent to the
 * others (its own rows stay; 0 with one member), for `train --trace`. */
int rt_expert_all_to_all_n(RtComm *g, float *out, const float *x, const int32_t *idx,
                           int64_t nk, int64_t E, int64_t C, int64_t inner, int back,
                           int64_t *sent);

#endif
