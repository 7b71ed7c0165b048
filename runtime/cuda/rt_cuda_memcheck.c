/* runtime/cuda/rt_cuda_memcheck.c -- the start-up memory check's sums
 * (rt_cuda_memcheck.h).  Plain C: tests/cuda builds it without CUDA. */
#include "runtime/cuda/rt_cuda_memcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"

/* a record fills its float slots exactly: all[] of records is all[] of floats */
_Static_assert(sizeof(RtDeviceNeed) == RT_DEVICE_NEED_FLOATS * sizeof(float),
               "RtDeviceNeed is a whole number of floats");

int64_t rt_cuda_device_need(const RtDeviceNeed *all, int ranks, int me, int *sharers) {
  if (!all || ranks < 1 || me < 0 || me >= ranks) return -1;
  int64_t sum = 0;
  int n = 0;
  for (int r = 0; r < ranks; r++) {
    if (all[r].device != all[me].device || all[r].host != all[me].host) continue;
    if (all[r].need < 0 || sum > INT64_MAX - all[r].need) return -1;
    sum += all[r].need;
    n++;
  }
  if (sharers) *sharers = n;
  return sum;
}

int64_t rt_cuda_host_hash(const char *name) {
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char *p = (const unsigned char *)(name ? name : ""); *p; p++)
    h = (h ^ *p) * 1099511628211ull;
  return (int64_t)(h >> 1); /* non-negative */
}

int rt_cuda_gather_world(struct RtComm *const group[3], const float *mine, int floats, int ranks,
                         float *all) {
  if (floats < 1 || ranks < 1) return rt_fail("gather_world: bad arguments");
  float *a = calloc((size_t)ranks * (size_t)floats, sizeof(float));
  float *b = calloc((size_t)ranks * (size_t)floats, sizeof(float));
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)ranks);
  int rc = RT_OK, have = 1; /* records gathered so far: this rank's block */
  if (!a || !b || !counts) rc = rt_fail("gather_world: out of host memory");
  else memcpy(a, mine, sizeof(float) * (size_t)floats);
  for (int g = 0; g < 3 && rc == RT_OK; g++) {
    int n = group[g] ? rt_comm_size(group[g]) : 1;
    if (n < 2) continue;
    if ((int64_t)have * n > ranks) {
      rc = rt_fail("gather_world: the groups hold more than %d ranks", ranks);
      break;
    }
    for (int r = 0; r < n; r++) counts[r] = (int64_t)have * floats;
    if (rt_comm_all_gather(group[g], a, b, counts)) rc = RT_ERR;
    float *t = a;
    a = b, b = t;
    have *= n;
  }
  if (rc == RT_OK && have != ranks)
    rc = rt_fail("gather_world: the groups hold %d ranks, not %d", have, ranks);
  if (rc == RT_OK) memcpy(all, a, sizeof(float) * (size_t)ranks * (size_t)floats);
  free(a), free(b), free(counts);
  return rc;
}

/* rt_cuda_agree's record: the status and the message's bytes, in float slots */
typedef struct {
  int32_t status;
  char msg[RT_ERR_MAX];
} Verdict;
_Static_assert(sizeof(Verdict) % sizeof(float) == 0, "a Verdict is a whole number of floats");
enum { VERDICT_FLOATS = (int)(sizeof(Verdict) / sizeof(float)) };

int rt_cuda_agree(struct RtComm *const group[3], int ranks, int status) {
  if (ranks <= 1) return status;
  Verdict mine, *all = calloc((size_t)ranks, sizeof *all);
  memset(&mine, 0, sizeof mine);
  mine.status = status;
  if (status != RT_OK) snprintf(mine.msg, sizeof mine.msg, "%s", rt_last_error());
  if (!all) return rt_fail("start-up checks: out of host memory");
  if (rt_cuda_gather_world(group, (const float *)(const void *)&mine, VERDICT_FLOATS, ranks,
                           (float *)(void *)all)) {
    free(all);
    return RT_ERR;
  }
  int rc = RT_OK;
  for (int r = 0; r < ranks && rc == RT_OK; r++) {
    if (all[r].status == RT_OK) continue;
    all[r].msg[sizeof all[r].msg - 1] = 0;
    rc = all[r].status == RT_ERR_SETUP ? RT_ERR_SETUP : RT_ERR;
    if (rc == RT_ERR_SETUP) rt_fail_setup("%s", all[r].msg);
    else rt_fail("%s", all[r].msg);
  }
  free(all);
  return rc;
}
