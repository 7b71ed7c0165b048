/* tests/shard/shard_util.c -- see shard_util.h. */
#include "tests/shard/shard_util.h"

#include <stdio.h>
#include <string.h>

#include "../autodiff/ad_check.h"

int shard_fails;
int shard_ep = 1;

void shard_expect(int ok, const char *fmt, const char *what, double v) {
  printf("%s ", ok ? "ok  " : "FAIL");
  printf(fmt, what, v);
  printf("\n");
  shard_fails += !ok;
}

IrNode *shard_find_leaf(IrModule *m, IrOp op, const char *name) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == op && m->nodes[i]->name && !strcmp(m->nodes[i]->name, name))
      return m->nodes[i];
  return NULL;
}

int64_t shard_global_index(const IrNode *p, int64_t e, int dc, int c) {
  int64_t idx[IR_MAX_RANK];
  for (int d = p->rank - 1; d >= 0; d--) idx[d] = e % p->shape[d], e /= p->shape[d];
  int epd = p->shard == IR_SHARD_EXPERT && p->ep_degree > 1;
  int sharded = p->shard_degree > 1 || ir_param_padded(p) || epd;
  if (epd) idx[0] += (int64_t)(dc % shard_ep) * p->shape[0]; /* the rank's experts */
  if (p->shard_degree > 1 || ir_param_padded(p)) {
    /* b: the local piece of a block; a padded vocabulary (one block, at any
     * degree) has pieces of Vp / degree and no global index past V */
    int d = p->shard_dim;
    int64_t B = p->global_shape[d] / p->shard_blocks, b = p->shape[d] / p->shard_blocks;
    int64_t j = idx[d];
    idx[d] = (j / b) * B + c * b + j % b;
    if (idx[d] >= p->global_shape[d]) return -1;
  }
  int64_t g = 0;
  for (int d = 0; d < p->rank; d++)
    g = g * (sharded ? p->global_shape[d] : p->shape[d]) + idx[d];
  return g;
}

int shard_take_flag(int *argc, char **argv, const char *flag) {
  int k = 1, found = 0;
  for (int i = 1; i < *argc; i++) {
    if (!strcmp(argv[i], flag)) found = 1;
    else argv[k++] = argv[i];
  }
  *argc = k;
  return found;
}

static int skipped(const IrNode *n, IrNode *const *skip, int nskip) {
  for (int i = 0; i < nskip; i++)
    if (skip[i] == n) return 1;
  return 0;
}

void shard_fill_reference(const IrModule *ref, IrInterp *it, int64_t vocab,
                          IrNode *const *skip, int nskip) {
  Rng rng = {0x5eed0042};
  for (int k = 0; k < ref->nnodes; k++) {
    const IrNode *n = ref->nodes[k];
    if (skipped(n, skip, nskip)) continue;
    for (int64_t e = 0; n->op == IR_OP_INPUT || n->op == IR_OP_PARAM ? e < ir_numel(n) : 0; e++) {
      if (n->op == IR_OP_INPUT && n->dtype == IR_I32) it->i[k][e] = (int32_t)rng_int(&rng, vocab);
      else if (n->op == IR_OP_INPUT) it->f[k][e] = rng_normal(&rng);
      else if (n->init == IR_INIT_ONES) it->f[k][e] = 1 + 0.2 * rng_normal(&rng);
      else if (n->init == IR_INIT_ZEROS) it->f[k][e] = 0.2 * rng_normal(&rng);
      else it->f[k][e] = 0.3 * rng_normal(&rng);
    }
  }
}

int shard_fill_ranks(IrModule *ref, const IrInterp *it, IrModule *sh, IrInterp **rk, int tp,
                     int dp, IrNode *const *skip, int nskip) {
  for (int r = 0; r < tp * dp; r++) {
    int c = r % tp, d = r / tp;
    rk[r] = ir_interp_new(sh);
    for (int k = 0; k < sh->nnodes; k++) {
      const IrNode *n = sh->nodes[k];
      if ((n->op != IR_OP_INPUT && n->op != IR_OP_PARAM) || skipped(n, skip, nskip)) continue;
      const IrNode *g = shard_find_leaf(ref, n->op, n->name);
      if (!g) {
        printf("FAIL: %s has no counterpart\n", n->name);
        return -1;
      }
      int64_t ne = ir_numel(n);
      for (int64_t e = 0; e < ne; e++) {
        int64_t src = n->op == IR_OP_PARAM ? shard_global_index(n, e, d, c)
                                           : (int64_t)d * ne + e;
        if (src < 0) rk[r]->f[k][e] = 0; /* padding: 0, as the runtime initialises it */
        else if (n->dtype == IR_I32) rk[r]->i[k][e] = it->i[g->id][src];
        else rk[r]->f[k][e] = it->f[g->id][src];
      }
    }
  }
  return 0;
}
