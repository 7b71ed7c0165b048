/* tests/runtime/test_expert.c -- rt_expert_all_to_all (rt_expert.h) on 1-4
 * thread ranks against its definition, written out here per element.
 *
 * Every member's inputs are pure functions of (seed, rank, index) (comm_util.h),
 * so each rank computes the other members' inputs and the expected result
 * itself.  Choices: random experts, some -1 (dropped), and some experts chosen
 * more often than the capacity C holds (the op keeps the first C slots).  The
 * input rows past the filled slots hold values too: the results must show
 * zeros there (nothing but filled rows travels).  Checked bit for bit:
 *   forward   out[l, i C + c] = x_i[me El + l, c], c < n_i(me El + l), else 0
 *   back      out[e, c] = y_o[e % El, me C + c], o = e / El, c < n_me(e), else 0
 *   round trip back(forward(x)) = x with its unfilled rows zeroed
 * plus the argument errors on one member. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_expert.h"
#include "tests/runtime/check.h"
#include "tests/runtime/comm_util.h"

typedef struct {
  int size;                /* members */
  int64_t E, C, inner, nk; /* experts, capacity, row width, choices a member */
  int drop;                /* one choice in `drop` is -1 (0: none) */
  uint64_t seed;
} Case;

/* Member r's choices: idx[p] in [-1, E), skewed to expert 0 so that its count
 * overflows C (with nk > C). */
static void choices(const Case *t, int r, int32_t *idx) {
  for (int64_t p = 0; p < t->nk; p++) {
    uint64_t h = cu_mix(cu_mix(t->seed ^ 0x1234u ^ ((uint64_t)r << 40)) ^ (uint64_t)p);
    if (t->drop && h % (uint64_t)t->drop == 0) idx[p] = -1;
    else if ((h >> 8) % 3 == 0) idx[p] = 0;
    else idx[p] = (int32_t)((h >> 16) % (uint64_t)t->E);
  }
}

/* n_r(e): member r's filled slots of expert e. */
static int64_t filled(const Case *t, int r, int64_t e) {
  int32_t *idx = malloc(sizeof *idx * (size_t)t->nk);
  choices(t, r, idx);
  int64_t n = 0;
  for (int64_t p = 0; p < t->nk; p++) n += idx[p] == e;
  free(idx);
  return n < t->C ? n : t->C;
}

static int run_case(RtComm *world, void *arg) {
  const Case *t = arg;
  int me = rt_comm_rank(world), size = t->size;
  RtComm *g = size > 1 ? world : NULL;
  int64_t E = t->E, C = t->C, inner = t->inner, El = E / size, n = E * C * inner;
  float *x = malloc(sizeof *x * (size_t)n), *y = malloc(sizeof *y * (size_t)n);
  float *out = malloc(sizeof *out * (size_t)n), *want = malloc(sizeof *want * (size_t)n);
  float *back = malloc(sizeof *back * (size_t)n);
  int32_t *idx = malloc(sizeof *idx * (size_t)t->nk);
  int64_t *cnt = malloc(sizeof *cnt * (size_t)(size * E));
  if (!x || !y || !out || !want || !back || !idx || !cnt) return RT_ERR;
  for (int i = 0; i < size; i++)
    for (int64_t e = 0; e < E; e++) cnt[i * E + e] = filled(t, i, e);
  choices(t, me, idx);
  cu_fill(x, n, t->seed, me, 0);
  cu_fill(y, n, t->seed + 1, me, 0);
  /* forward against the definition */
  memset(out, 0xff, sizeof *out * (size_t)n); /* every element must be written */
  CHECK_OK(rt_expert_all_to_all(g, out, x, idx, t->nk, E, C, inner, 0));
  for (int64_t l = 0; l < El; l++)
    for (int i = 0; i < size; i++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t k = 0; k < inner; k++) {
          int64_t e = me * El + l;
          want[((l * size + i) * C + c) * inner + k] =
              c < cnt[i * E + e] ? cu_value(t->seed, i, (e * C + c) * inner + k) : 0.0f;
        }
  CHECK(cu_first_diff(out, want, n) < 0);
  /* back against the definition, from independent inputs y */
  memset(out, 0xff, sizeof *out * (size_t)n);
  CHECK_OK(rt_expert_all_to_all(g, out, y, idx, t->nk, E, C, inner, 1));
  for (int64_t e = 0; e < E; e++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t k = 0; k < inner; k++) {
        int o = (int)(e / El);
        int64_t l = e % El;
        want[(e * C + c) * inner + k] =
            c < cnt[me * E + e] ? cu_value(t->seed + 1, o, ((l * size + me) * C + c) * inner + k)
                                : 0.0f;
      }
  CHECK(cu_first_diff(out, want, n) < 0);
  /* the round trip restores the filled rows */
  CHECK_OK(rt_expert_all_to_all(g, out, x, idx, t->nk, E, C, inner, 0));
  CHECK_OK(rt_expert_all_to_all(g, back, out, idx, t->nk, E, C, inner, 1));
  for (int64_t e = 0; e < E; e++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t k = 0; k < inner; k++) {
        int64_t at = (e * C + c) * inner + k;
        want[at] = c < cnt[me * E + e] ? x[at] : 0.0f;
      }
  CHECK(cu_first_diff(back, want, n) < 0);
  free(x), free(y), free(out), free(want), free(back), free(idx), free(cnt);
  return RT_OK;
}

static void errors(void) {
  float x[24] = {0}, out[24];
  int32_t idx[4] = {0, 1, -1, 1};
  CHECK_FAILS(rt_expert_all_to_all(NULL, NULL, x, idx, 4, 2, 3, 4, 0), "NULL output");
  CHECK_FAILS(rt_expert_all_to_all(NULL, out, x, idx, 4, 0, 3, 4, 0), "must all be >= 1");
  CHECK_FAILS(rt_expert_all_to_all(NULL, x, x + 4, idx, 4, 2, 3, 4, 0), "overlap");
  idx[1] = 2;
  CHECK_FAILS(rt_expert_all_to_all(NULL, out, x, idx, 4, 2, 3, 4, 0), "outside [-1, 2)");
  idx[1] = -2;
  CHECK_FAILS(rt_expert_all_to_all(NULL, out, x, idx, 4, 2, 3, 4, 0), "outside [-1, 2)");
}

int main(void) {
  static const Case cases[] = {
      {1, 4, 8, 3, 16, 5, 11},  {2, 4, 8, 3, 24, 5, 12},  {2, 2, 5, 1, 12, 0, 13},
      {3, 6, 4, 2, 18, 4, 14},  {4, 4, 8, 5, 32, 7, 15},  {4, 8, 3, 2, 10, 3, 16},
      {2, 8, 16, 4, 64, 6, 17}, {4, 4, 1, 1, 4, 2, 18},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Case t = cases[i];
    if (rt_comm_threads_run(t.size, run_case, &t)) {
      char m[1200];
      snprintf(m, sizeof m, "case %zu (%d ranks): %s", i, t.size, rt_last_error());
      check_report(__FILE__, __LINE__, m);
    }
  }
  errors();
  return check_result("test_expert");
}
