/* codegen/cg_dedup.c -- kernels with the same code (cg_kernels.h,
 * cg_dedup_kernels).
 *
 * A kernel is its params' kinds and accesses, its rows, its loops and its
 * nodes; names (of the kernel and its params) are only labels.  Layers of a
 * model give many kernels that differ in nothing else: each distinct code
 * is compiled once and every kernel with it calls that one. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cg_kernels.h"

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

static uint64_t code_hash(const KirKernel *k) {
  uint64_t h = mix(1469598103934665603ull, (uint64_t)k->nparams);
  for (int i = 0; i < k->nparams; i++)
    h = mix(mix(mix(h, k->params[i].kind), k->params[i].elem), k->params[i].access);
  for (int i = 0; i < k->nrows; i++) h = mix(h, (uint64_t)k->rows[i]);
  for (int i = 0; i < k->nnodes; i++) {
    const KirNode *n = &k->nodes[i];
    h = mix(mix(mix(h, n->op), (uint64_t)n->imm), (uint64_t)(n->arg[0] + 7 * n->arg[1]));
  }
  return mix(mix(h, (uint64_t)k->nnodes), (uint64_t)k->nloops);
}

static int same_code(const KirKernel *a, const KirKernel *b) {
  if (a->nparams != b->nparams || a->nrows != b->nrows || a->nnodes != b->nnodes ||
      a->nloops != b->nloops)
    return 0;
  for (int i = 0; i < a->nparams; i++)
    if (a->params[i].kind != b->params[i].kind || a->params[i].elem != b->params[i].elem ||
        a->params[i].access != b->params[i].access)
      return 0;
  for (int i = 0; i < a->nrows; i++)
    if (a->rows[i] != b->rows[i]) return 0;
  for (int i = 0; i < a->nnodes; i++) {
    const KirNode *x = &a->nodes[i], *y = &b->nodes[i];
    if (x->op != y->op || x->type != y->type || x->imm != y->imm ||
        memcmp(&x->fimm, &y->fimm, sizeof x->fimm) || x->scope != y->scope ||
        x->loop != y->loop || x->avail != y->avail || memcmp(x->arg, y->arg, sizeof x->arg))
      return 0;
  }
  for (int i = 0; i < a->nloops; i++)
    if (a->loops[i].extent != b->loops[i].extent || a->loops[i].col != b->loops[i].col ||
        a->loops[i].first != b->loops[i].first || a->loops[i].end != b->loops[i].end)
      return 0;
  return 1;
}

int cg_dedup_kernels(const CgKernelPlan *kp, int *canon) {
  uint64_t *hash = malloc(sizeof(uint64_t) * (size_t)(kp->nkernels + 1));
  if (!hash) {
    for (int i = 0; i < kp->nkernels; i++) canon[i] = i;
    return kp->nkernels;
  }
  int distinct = 0;
  for (int i = 0; i < kp->nkernels; i++) {
    hash[i] = code_hash(kp->kernels[i].k);
    canon[i] = i;
    for (int j = 0; j < i; j++)
      if (canon[j] == j && hash[j] == hash[i] && same_code(kp->kernels[j].k, kp->kernels[i].k)) {
        canon[i] = j;
        break;
      }
    distinct += canon[i] == i;
  }
  free(hash);
  return distinct;
}

