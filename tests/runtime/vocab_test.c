/* tests/runtime/vocab_test.c -- the vocabulary-parallel routines (rt_route.h):
 * rt_vocab_embedding(_grad) and rt_vocab_cross_entropy(_grad) on 1, 2, 3 and 4
 * thread ranks against the whole-vocabulary routines on one rank.
 *   - embedding: the members' partial rows all-reduced equal rt_embedding bit
 *     for bit; each member's table gradient equals its rows of rt_embedding_grad
 *     bit for bit;
 *   - cross-entropy: every member gets the same loss bits, within 1e-6 of
 *     rt_cross_entropy (logits up to +-40, so the max matters); each member's
 *     gradient columns within 1e-6 (relative to the largest) of
 *     rt_cross_entropy_grad's;
 *   - a target outside the vocabulary fails on every member with one line;
 *   - padding: a true vocabulary of VL parts - (parts - 1) columns, and of
 *     VL parts - 13 (parc --pad-vocab's padding, beyond the member count, one
 *     member included), the padded columns holding 1000 (they would dominate
 *     if not masked): loss and real gradient columns as against the whole true
 *     vocabulary, the padded gradient columns exactly 0;
 *   - one member: the NULL group (a one-rank trainer's tp group) gives the
 *     one-member communicator's loss and gradient bits;
 *   - in place: the gradient written over the member's logits (dlogits ==
 *     logits, as the buffer plan calls it) equals the out-of-place one bit
 *     for bit, padding included. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_route.h"
#include "tests/runtime/comm_util.h"

#define N 37
#define VL 50
#define D 24

typedef struct {
  int parts;
  int bad; /* a target out of range */
  int pad; /* padding columns at the end of the last members */
} Case;

/* Logits in [-40, 40): the row maximum matters. */
static float logit(int64_t p, int64_t v) {
  uint64_t h = cu_mix(cu_mix(7) ^ (uint64_t)(p * 100000 + v));
  return 80.0f * ((float)(h >> 40) / 16777216.0f - 0.5f);
}

static int vocab_rank(RtComm *w, void *arg) {
  const Case *c = arg;
  int parts = c->parts, me = rt_comm_rank(w);
  int64_t V = (int64_t)VL * parts, Vr = V - c->pad; /* Vr: the true vocabulary */
  int32_t ids[N], tg[N];
  for (int p = 0; p < N; p++) {
    ids[p] = (int32_t)((p * 7919 + 3) % Vr);
    tg[p] = (int32_t)((p * 104729 + 11) % Vr);
  }
  if (c->bad) tg[N - 1] = (int32_t)Vr;
  float *table = malloc(sizeof(float) * (size_t)(V * D)), *dy = malloc(sizeof(float) * N * D);
  float *whole = malloc(sizeof(float) * N * D), *part = malloc(sizeof(float) * N * D);
  float *dtab = malloc(sizeof(float) * (size_t)(V * D)), *dpart = malloc(sizeof(float) * VL * D);
  float *lg = malloc(sizeof(float) * (size_t)(N * V)), *lp = malloc(sizeof(float) * N * VL);
  float *dl = malloc(sizeof(float) * (size_t)(N * V)), *dlp = malloc(sizeof(float) * N * VL);
  float *losses = malloc(sizeof(float) * (size_t)parts);
  int rc = RT_OK;
  cu_fill(table, V * D, 1, 0, 0);
  cu_fill(dy, N * D, 2, 0, 0);
  for (int64_t p = 0; p < N; p++)
    for (int64_t v = 0; v < V; v++) lg[p * V + v] = logit(p, v);
  for (int64_t p = 0; p < N; p++)
    for (int64_t v = 0; v < VL; v++)
      lp[p * VL + v] = me * VL + v < Vr ? lg[p * V + me * VL + v] : 1000.0f;
  for (int64_t p = 0; p < N; p++) /* lg as [N, Vr]: the true vocabulary only */
    memmove(lg + p * Vr, lg + p * V, sizeof(float) * (size_t)Vr);
  float loss = 0, lw = 0, dloss = 0.75f;
  if (c->bad) {
    int r = rt_vocab_cross_entropy(w, NULL, 0, &loss, lp, tg, N, VL, Vr);
    const char *msg = rt_last_error();
    if (r == RT_OK || !strstr(msg, "target") || strchr(msg, '\n'))
      rc = rt_fail("rank %d: a bad target was not refused (%s)", me, msg);
    goto out;
  }
  /* embedding */
  if (rt_embedding(whole, ids, table, N, V, D) ||
      rt_vocab_embedding(part, ids, table + (int64_t)me * VL * D, N, VL, D, me, parts) ||
      rt_comm_all_reduce(w, part, part, N * D)) {
    rc = RT_ERR;
    goto out;
  }
  if (memcmp(whole, part, sizeof(float) * N * D)) {
    rc = rt_fail("rank %d: vocab_embedding all-reduced differs from embedding", me);
    goto out;
  }
  if (rt_embedding_grad(dtab, ids, dy, N, V, D) ||
      rt_vocab_embedding_grad(dpart, ids, dy, N, VL, D, me, parts)) {
    rc = RT_ERR;
    goto out;
  }
  if (memcmp(dtab + (int64_t)me * VL * D, dpart, sizeof(float) * VL * D)) {
    rc = rt_fail("rank %d: vocab_embedding_grad differs from its rows of embedding_grad", me);
    goto out;
  }
  /* cross-entropy */
  if (rt_cross_entropy(&lw, lg, tg, N, Vr) ||
      rt_vocab_cross_entropy(w, NULL, 0, &loss, lp, tg, N, VL, Vr) ||
      rt_cross_entropy_grad(dl, lg, tg, &dloss, N, Vr) ||
      rt_vocab_cross_entropy_grad(w, NULL, 0, dlp, lp, tg, &dloss, N, VL, Vr)) {
    rc = RT_ERR;
    goto out;
  }
  /* in place, as the buffer plan calls it (IR_F_INPLACE0): the gradient
   * written over the member's logits is the out-of-place one, bit for bit
   * (judged after the collectives below, which every member must reach) */
  float *ip = malloc(sizeof(float) * N * VL);
  int ip_same = 0;
  if (ip) {
    memcpy(ip, lp, sizeof(float) * N * VL);
    if (rt_vocab_cross_entropy_grad(w, NULL, 0, ip, ip, tg, &dloss, N, VL, Vr)) {
      free(ip);
      rc = RT_ERR;
      goto out;
    }
    ip_same = memcmp(ip, dlp, sizeof(float) * N * VL) == 0;
    free(ip);
  }
  int64_t cnt[64];
  for (int k = 0; k < parts; k++) cnt[k] = 1;
  if (rt_comm_all_gather(w, &loss, losses, cnt)) {
    rc = RT_ERR;
    goto out;
  }
  for (int k = 0; k < parts; k++)
    if (memcmp(&losses[k], &loss, sizeof loss)) {
      rc = rt_fail("rank %d: loss %.9g, rank %d has %.9g", me, loss, k, losses[k]);
      goto out;
    }
  double lerr = fabs((double)loss - lw) / fabs((double)lw);
  double gmax = 0, gerr = 0, padg = 0;
  for (int64_t p = 0; p < N; p++)
    for (int64_t v = 0; v < VL; v++) {
      int64_t col = me * VL + v;
      if (col >= Vr) {
        padg = fmax(padg, fabs((double)dlp[p * VL + v]));
        continue;
      }
      gmax = fmax(gmax, fabs(dl[p * Vr + col]));
      gerr = fmax(gerr, fabs((double)dlp[p * VL + v] - dl[p * Vr + col]));
    }
  gerr /= gmax;
  if (padg != 0) {
    rc = rt_fail("rank %d: gradient %g in a padding column", me, padg);
    goto out;
  }
  if (me == 0)
    printf("  %d members: loss %.7f (whole %.7f, rel %.1e), grad max rel %.1e\n", parts, loss,
           lw, lerr, gerr);
  if (lerr > 1e-6 || gerr > 1e-6)
    rc = rt_fail("rank %d: loss rel err %.2e, grad rel err %.2e", me, lerr, gerr);
  if (rc == RT_OK && !ip_same)
    rc = rt_fail("rank %d: the gradient written over the logits differs from out of place", me);
  if (rc == RT_OK && parts == 1) { /* the NULL group: one member, no communicator */
    float l0 = 0;
    float *d0 = malloc(sizeof(float) * N * VL);
    if (!d0 || rt_vocab_cross_entropy(NULL, NULL, 0, &l0, lp, tg, N, VL, Vr) ||
        rt_vocab_cross_entropy_grad(NULL, NULL, 0, d0, lp, tg, &dloss, N, VL, Vr))
      rc = d0 ? RT_ERR : rt_fail("out of memory");
    else if (memcmp(&l0, &loss, sizeof loss) || memcmp(d0, dlp, sizeof(float) * N * VL))
      rc = rt_fail("the NULL group's loss %.9g or gradient differs from one member's %.9g", l0,
                   loss);
    free(d0);
  }
out:
  free(table), free(dy), free(whole), free(part), free(dtab), free(dpart);
  free(lg), free(lp), free(dl), free(dlp), free(losses);
  return rc;
}

int main(void) {
  int fails = 0;
  for (int parts = 1; parts <= 4; parts++)
    for (int bad = 0; bad < 2; bad++)
      for (int pad = 0; pad < 3; pad++) {
        if (pad == 1 && parts == 1) continue; /* no padding: the first case */
        Case c = {parts, bad, pad == 2 ? 13 : pad ? parts - 1 : 0};
        int rc = rt_comm_threads_run(parts, vocab_rank, &c);
        char padded[48] = "";
        if (c.pad) snprintf(padded, sizeof padded, " (%d padding columns, masked)", c.pad);
        printf("%s %d members%s%s%s%s\n", rc ? "FAIL" : "ok  ", parts,
               bad ? ": a bad target refused on every member" : ": equal the whole vocabulary",
               padded, rc ? ": " : "", rc ? rt_last_error() : "");
        fails += rc != 0;
      }
  return fails != 0;
}
