/* runtime/rt_expert.c -- expert_all_to_all; see rt_expert.h.
 *
 * Both directions pack the rows bound for each peer into one contiguous
 * block, peers in rank order and, within a peer's block, its experts l
 * ascending, then slots c ascending; the receiver unpacks its blocks in
 * the same order.  Sender and receiver compute every block's length from
 * the same gathered counts, so the all-to-all's counts agree by
 * construction. */
#include "runtime/rt_expert.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/rt_err.h"

#define OP "expert_all_to_all"

/* Arguments the op can check on its own (the group's agreement on E, C and
 * inner is the all-to-all's to find: mismatched blocks fail there). */
static int check_args(float *out, const float *x, const int32_t *idx, int64_t nk, int64_t E,
                      int64_t C, int64_t inner, int size) {
  if (!out || !x || !idx)
    return rt_fail(OP ": NULL %s pointer", !out ? "output" : !x ? "input" : "idx");
  if (nk < 1 || E < 1 || C < 1 || inner < 1)
    return rt_fail(OP ": nk %lld, E %lld, C %lld, inner %lld must all be >= 1", (long long)nk,
                   (long long)E, (long long)C, (long long)inner);
  if (nk > (INT64_C(1) << 24))
    return rt_fail(OP ": %lld choices a rank: counts must stay exact in float", (long long)nk);
  int64_t n;
  if (__builtin_mul_overflow(E, C, &n) || __builtin_mul_overflow(n, inner, &n) ||
      n > INT64_MAX / 8)
    return rt_fail(OP ": a tensor of %lld x %lld x %lld elements is too large", (long long)E,
                   (long long)C, (long long)inner);
  if (E % size)
    return rt_fail(OP ": %lld experts do not split over a group of %d ranks", (long long)E,
                   size);
  if (x < out + n && out < x + n) return rt_fail(OP ": input and output overlap");
  for (int64_t p = 0; p < nk; p++)
    if (idx[p] < -1 || idx[p] >= E)
      return rt_fail(OP ": expert %d at position %lld is outside [-1, %lld) (-1: dropped)",
                     idx[p], (long long)p, (long long)E);
  return RT_OK;
}

int rt_expert_all_to_all(RtComm *g, float *out, const float *x, const int32_t *idx, int64_t nk,
                         int64_t E, int64_t C, int64_t inner, int back) {
  return rt_expert_all_to_all_n(g, out, x, idx, nk, E, C, inner, back, NULL);
}

int rt_expert_all_to_all_n(RtComm *g, float *out, const float *x, const int32_t *idx,
                           int64_t nk, int64_t E, int64_t C, int64_t inner, int back,
                           int64_t *sent) {
  if (sent) *sent = 0;
  int size = g ? rt_comm_size(g) : 1, me = g ? rt_comm_rank(g) : 0;
  if (check_args(out, x, idx, nk, E, C, inner, size)) return RT_ERR;
  int64_t El = E / size;
  size_t row = sizeof(float) * (size_t)inner;
  float *mine = calloc((size_t)E, sizeof *mine);
  float *cnt = malloc(sizeof *cnt * (size_t)(E * size)); /* cnt[i E + e]: member i's count */
  int64_t *blocks = malloc(sizeof *blocks * (size_t)size);
  int64_t *sc = calloc((size_t)size, sizeof *sc), *rc = calloc((size_t)size, sizeof *rc);
  float *send = NULL, *recv = NULL;
  int status = RT_OK;
  if (!mine || !cnt || !blocks || !sc || !rc) {
    status = rt_fail(OP ": out of memory for %lld expert counts", (long long)(E * size));
    goto out;
  }
  for (int64_t p = 0; p < nk; p++)
    if (idx[p] >= 0) mine[idx[p]] += 1.0f; /* exact: nk <= 2^24 */
  for (int i = 0; i < size; i++) blocks[i] = E;
  if (size > 1) {
    if ((status = rt_comm_all_gather(g, mine, cnt, blocks)) != RT_OK) goto out;
  } else {
    memcpy(cnt, mine, sizeof *cnt * (size_t)E);
  }
  /* n(i, e): member i's filled slots of expert e */
#define FILLED(i, e) ((int64_t)cnt[(int64_t)(i) * E + (e)] < C ? (int64_t)cnt[(int64_t)(i) * E + (e)] : C)
  /* rows to and from each peer q: forward, this member's slots of q's experts
   * out and q's slots of this member's experts in; back, the reverse */
  int64_t stot = 0, rtot = 0;
  for (int q = 0; q < size; q++) {
    for (int64_t l = 0; l < El; l++) {
      int64_t theirs = FILLED(q, me * El + l), ours = FILLED(me, q * El + l);
      sc[q] += back ? theirs : ours;
      rc[q] += back ? ours : theirs;
    }
    sc[q] *= inner, rc[q] *= inner;
    stot += sc[q], rtot += rc[q];
  }
  send = malloc(sizeof *send * (size_t)(stot + 1));
  recv = size > 1 ? malloc(sizeof *recv * (size_t)(rtot + 1)) : send; /* one member: itself */
  if (!send || !recv) {
    status = rt_fail(OP ": out of memory for %lld + %lld floats in flight", (long long)stot,
                     (long long)rtot);
    goto out;
  }
  float *s = send;
  for (int q = 0; q < size; q++)
    for (int64_t l = 0; l < El; l++) {
      if (!back) { /* x [E, C, inner]: rows [0, n) of expert q El + l */
        int64_t e = q * El + l, n = FILLED(me, e);
        memcpy(s, x + e * C * inner, row * (size_t)n);
        s += n * inner;
      } else { /* x [El, size C, inner]: member q's rows of expert me El + l */
        int64_t n = FILLED(q, me * El + l);
        memcpy(s, x + (l * size * C + q * C) * inner, row * (size_t)n);
        s += n * inner;
      }
    }
  if (size > 1 && (status = rt_comm_all_to_all(g, send, sc, NULL, recv, rc, NULL)) != RT_OK)
    goto out;
  if (sent) *sent = size > 1 ? stot - sc[me] : 0; /* to the other members */
  memset(out, 0, row * (size_t)(E * C));
  const float *r = recv;
  for (int q = 0; q < size; q++)
    for (int64_t l = 0; l < El; l++) {
      if (!back) { /* out [El, size C, inner]: member q's rows of expert me El + l */
        int64_t n = FILLED(q, me * El + l);
        memcpy(out + (l * size * C + q * C) * inner, r, row * (size_t)n);
        r += n * inner;
      } else { /* out [E, C, inner]: this member's rows of expert q El + l, from q */
        int64_t e = q * El + l, n = FILLED(me, e);
        memcpy(out + e * C * inner, r, row * (size_t)n);
        r += n * inner;
      }
    }
#undef FILLED
out:
  if (recv != send) free(recv);
  free(send);
  free(mine), free(cnt), free(blocks), free(sc), free(rc);
  return status;
}
