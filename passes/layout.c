/* passes/layout.c -- are the parallel degrees valid for this model?
 * One line per problem, each naming the flag, its value and the model
 * quantity it must fit. */
#include <string.h>

#include "passes/passes.h"

static int64_t setting_int(const IrModule *m, const char *name, int64_t def) {
  const IrSetting *s = ir_setting(m->train, m->ntrain, name);
  return s && !s->is_float && !s->sym ? s->i : def;
}

/* Number of experts: the leading dimension of expert-sharded parameters. */
static int64_t expert_count(const IrModule *m) {
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->shard == IR_SHARD_EXPERT)
      return m->nodes[i]->shape[0];
  return 0;
}

int layout_check(const IrModule *m, const Layout *lay, FILE *err) {
  int bad = 0;
  int64_t seen_width[16];
  int nseen = 0, heads_done = 0, kv_done = 0;
  for (int i = 0; i < m->nnodes && lay->tp > 1; i++) {
    const IrNode *n = m->nodes[i];
    if (n->op == IR_OP_ATTENTION) {
      int64_t h = ir_sdpa_dims(n).H, kv = ir_sdpa_dims(n).KV;
      if (h % lay->tp && !heads_done++) {
        fprintf(err, "parc: error: --tp %d must divide the %lld attention heads\n", lay->tp,
                (long long)h);
        bad++;
      }
      if (kv != h && kv % lay->tp && !kv_done++) {
        fprintf(err, "parc: error: --tp %d must divide the %lld KV heads\n", lay->tp,
                (long long)kv);
        bad++;
      }
    }
    if (n->op != IR_OP_PARAM || n->shard_dim < 0) continue;
    if (n->shard != IR_SHARD_COLUMN && n->shard != IR_SHARD_ROW &&
        !(n->shard == IR_SHARD_EXPERT && n->shard_dim >= 1))
      continue;
    int64_t w = n->shape[n->shard_dim];
    if (w % lay->tp == 0) continue;
    int dup = 0;
    for (int k = 0; k < nseen; k++) dup |= seen_width[k] == w;
    if (dup) continue;
    if (nseen < 16) seen_width[nseen++] = w;
    fprintf(err, "parc: error: --tp %d must divide the width %lld that %s splits (%s)\n",
            lay->tp, (long long)w, n->name,
            n->shard == IR_SHARD_EXPERT ? "each expert over tp"
            : n->shard == IR_SHARD_COLUMN ? "column-parallel" : "row-parallel");
    bad++;
  }
  if (lay->pp > 1 && m->nlayers == 0) {
    fprintf(err, "parc: error: --pp %d needs layers to split, and the model has no repeat\n",
            lay->pp);
    bad++;
  } else if (lay->pp > m->nlayers && m->nlayers > 0) {
    fprintf(err, "parc: error: --pp %d is more than the %d layers; use at most --pp %d\n",
            lay->pp, m->nlayers, m->nlayers);
    bad++;
  }
  int64_t experts = expert_count(m);
  if (lay->ep > 1 && experts == 0) {
    fprintf(err, "parc: error: --ep %d needs a model with experts, and this one has none\n",
            lay->ep);
    bad++;
  } else if (lay->ep > 1 && experts % lay->ep) {
    fprintf(err, "parc: error: --ep %d must divide the %lld experts\n", lay->ep,
            (long long)experts);
    bad++;
  }
  if (lay->dp % lay->ep) {
    fprintf(err, "parc: error: --ep %d must divide --dp %d (expert-parallel ranks are carved "
            "from the data-parallel ones)\n", lay->ep, lay->dp);
    bad++;
  }
  int64_t batch = setting_int(m, "batch", 1), micro = setting_int(m, "microbatches", 1);
  if (batch % lay->dp) {
    fprintf(err, "parc: error: --dp %d must divide the batch of %lld sequences\n", lay->dp,
            (long long)batch);
    bad++;
  } else if ((batch / lay->dp) % micro) {
    fprintf(err, "parc: error: microbatches = %lld must divide the batch per data-parallel rank "
            "(%lld = batch %lld / dp %d)\n", (long long)micro, (long long)(batch / lay->dp),
            (long long)batch, lay->dp);
    bad++;
  }
  return bad;
}
