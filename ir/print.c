/* ir/print.c -- the stable text form of a module, and its Graphviz form.
 *
 * Text form, one line per node in topological order:
 *   %ID = OP %IN, %IN [attr=value ...] : TYPE [name] [init ...] [shard ...]  # layer L, FILE:LINE:COL
 * where backward and optimizer nodes say their phase first: `# phase B,`,
 * `# phase W,` or `# phase opt,`.  Then `loss = %ID`; after autodiff, one
 * `grad NAME = %ID` line per parameter gradient; after the optimizer,
 * `grad_norm = %ID` and one `update NAME = %ID` line per update, in order.
 * Files are printed by base name so that output does not depend on where
 * the compiler was run from. */
#include <string.h>

#include "ir/ir.h"

static const char *base_name(const char *path) {
  const char *s = path ? strrchr(path, '/') : NULL;
  return s ? s + 1 : path ? path : "?";
}

static void print_setting(FILE *out, const IrSetting *s) {
  if (s->sym) fprintf(out, "%s = %s", s->name, s->sym);
  else if (s->is_float) fprintf(out, "%s = %.9g", s->name, s->f);
  else fprintf(out, "%s = %lld", s->name, (long long)s->i);
}

static void print_settings(FILE *out, const char *head, const IrSetting *s, int n) {
  fprintf(out, "%s", head);
  for (int i = 0; i < n; i++) {
    fputs(i ? ", " : " ", out);
    print_setting(out, &s[i]);
  }
  fputc('\n', out);
}

static void print_attrs(FILE *out, const IrNode *n) {
  const IrOpInfo *info = &ir_op_info[n->op];
  for (int i = 0; i < 3; i++)
    if (info->iattr[i]) fprintf(out, " %s=%lld", info->iattr[i], (long long)n->ia[i]);
  if ((n->op == IR_OP_ATTENTION || n->op == IR_OP_ATTENTION_GRAD) && n->ia[1])
    fprintf(out, " layout=%lld", (long long)n->ia[1]); /* IR_SDPA_*: no DSL name */
  if ((n->op == IR_OP_ATTENTION || n->op == IR_OP_ATTENTION_GRAD) && n->ia[2])
    fprintf(out, " kv=%lld", (long long)n->ia[2]); /* IR_SDPA_QKV_TOKENS's kv heads */
  if (info->fattr) fprintf(out, " %s=%.9g", info->fattr, n->fa);
}

void ir_print(FILE *out, const IrModule *m) {
  char ty[256];
  fprintf(out, "module %s\n", m->name);
  print_settings(out, "config", m->config, m->nconfig);
  print_settings(out, "train", m->train, m->ntrain);
  if (m->optimizer) {
    fprintf(out, "optimizer %s", m->optimizer);
    print_settings(out, "", m->optim, m->noptim);
  }
  if (m->schedule) {
    fprintf(out, "schedule %s", m->schedule);
    print_settings(out, "", m->sched, m->nsched);
  }
  if (m->mesh_tp)
    fprintf(out, "mesh tp = %d, dp = %d%s (rank-local shapes)\n", m->mesh_tp, m->mesh_dp,
            m->mesh_zero > 1 ? ", zero 1" : "");
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    fprintf(out, "%%%d = %s", n->id, ir_op_info[n->op].name);
    if (n->name) fprintf(out, " %s", n->name);
    for (int j = 0; j < n->ninputs; j++) fprintf(out, "%s%%%d", j ? ", " : " ", n->inputs[j]->id);
    print_attrs(out, n);
    fprintf(out, " : %s", ir_type_str(n, ty, sizeof ty));
    if (n->op == IR_OP_PARAM) {
      if (n->init == IR_INIT_NORMAL) fprintf(out, " init normal(%.9g)", n->init_std);
      else fprintf(out, " init %s", ir_init_name[n->init]);
    }
    if (n->op == IR_OP_PARAM || n->op == IR_OP_STATE) {
      if (n->shard != IR_SHARD_REPLICATED) fprintf(out, " shard %s", ir_shard_name[n->shard]);
      if (n->shard_dim >= 0) fprintf(out, "(%d)", n->shard_dim);
      if (n->op == IR_OP_PARAM && (n->shard_degree > 1 || n->ep_degree > 1 ||
                                   ir_param_padded(n))) {
        if (n->ep_degree > 1) fprintf(out, " experts over ep %d", n->ep_degree);
        if (n->shard_degree > 1 || ir_param_padded(n)) fprintf(out, " over %d", n->shard_degree);
        if (n->shard_blocks > 1) fprintf(out, " blocks %d", n->shard_blocks);
        fprintf(out, " global [");
        for (int d = 0; d < n->rank; d++)
          fprintf(out, "%s%lld", d ? ", " : "", (long long)n->global_shape[d]);
        fprintf(out, "]");
      }
      if (n->flat_shards > 1) fprintf(out, " zero piece of %d", n->flat_shards);
    }
    if (n->op == IR_OP_INPUT && n->shard_degree > 1)
      fprintf(out, " batch over %d global [%lld, ...]", n->shard_degree,
              (long long)n->global_shape[0]);
    fprintf(out, "  #");
    if (n->phase != IR_PHASE_FWD) fprintf(out, " phase %s,", ir_phase_name[n->phase]);
    if (n->layer >= 0) fprintf(out, " layer %d,", n->layer);
    fprintf(out, " %s:%d:%d\n", base_name(n->loc.file), n->loc.line, n->loc.col);
  }
  if (m->loss) fprintf(out, "loss = %%%d\n", m->loss->id);
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->grad)
      fprintf(out, "grad %s = %%%d\n", m->nodes[i]->name, m->nodes[i]->grad->id);
  if (m->grad_norm) fprintf(out, "grad_norm = %%%d\n", m->grad_norm->id);
  for (int k = 0; k < m->nupdates; k++)
    fprintf(out, "update %s = %%%d\n", m->updates[k].leaf->name, m->updates[k].value->id);
}

void ir_print_dot(FILE *out, const IrModule *m) {
  char ty[256];
  fprintf(out, "digraph \"%s\" {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n",
          m->name);
  for (int i = 0; i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    const char *shape = n->op == IR_OP_PARAM   ? "box"
                        : n->op == IR_OP_STATE ? "box3d"
                        : n->op == IR_OP_INPUT ? "invhouse"
                                               : "ellipse";
    fprintf(out, "  n%d [shape=%s, label=\"%%%d %s%s%s\\n%s\"%s%s];\n", n->id, shape, n->id,
            ir_op_info[n->op].name, n->name ? " " : "", n->name ? n->name : "",
            ir_type_str(n, ty, sizeof ty), n == m->loss ? ", style=bold" : "",
            n->phase == IR_PHASE_B     ? ", color=blue"
            : n->phase == IR_PHASE_W   ? ", color=gray"
            : n->phase == IR_PHASE_OPT ? ", color=darkgreen"
                                       : "");
    for (int j = 0; j < n->ninputs; j++) fprintf(out, "  n%d -> n%d;\n", n->inputs[j]->id, n->id);
  }
  for (int k = 0; k < m->nupdates; k++) /* the step's results feed the next step */
    fprintf(out, "  n%d -> n%d [style=dashed, constraint=false];\n", m->updates[k].value->id,
            m->updates[k].leaf->id);
  fprintf(out, "}\n");
}
