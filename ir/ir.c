/* ir/ir.c -- op tables, module and node construction. */
#include "ir/ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const IrOpInfo ir_op_info[IR_OP_COUNT] = {
#define X(e, name, arity, flags, ia0, ia1, ia2, fa0) {name, arity, flags, {ia0, ia1, ia2}, fa0},
#include "ir/ops.def"
#undef X
};

const char *const ir_dtype_name[IR_DTYPE_COUNT] = {"f32", "i32"};
const char *const ir_shard_name[IR_SHARD_COUNT] = {"replicated", "column", "row", "vocab",
                                                   "expert"};
const char *const ir_init_name[IR_INIT_COUNT] = {"normal", "zeros", "ones"};
const char *const ir_phase_name[IR_PHASE_COUNT] = {"fwd", "B", "W", "opt"};

IrModule *ir_module_new(const char *name) {
  Arena a = {0};
  IrModule *m = arena_alloc(&a, sizeof *m);
  m->arena = a;
  m->name = arena_strdup(&m->arena, name);
  return m;
}

void ir_module_free(IrModule *m) {
  if (!m) return;
  Arena a = m->arena;  /* m itself lives in the arena */
  arena_free(&a);
}

IrNode *ir_add(IrModule *m, IrOp op, IrNode **inputs, int ninputs) {
  IrNode *n = arena_alloc(&m->arena, sizeof *n);
  n->op = op;
  n->layer = -1;
  n->shard_dim = -1;
  n->ninputs = ninputs;
  if (ninputs) {
    n->inputs = arena_alloc(&m->arena, sizeof(IrNode *) * (size_t)ninputs);
    memcpy(n->inputs, inputs, sizeof(IrNode *) * (size_t)ninputs);
  }
  arena_grow(&m->arena, (void **)&m->nodes, &m->capnodes, m->nnodes + 1, sizeof(IrNode *));
  n->id = m->nnodes;
  m->nodes[m->nnodes++] = n;
  return n;
}

void ir_add_update(IrModule *m, IrNode *leaf, IrNode *value) {
  arena_grow(&m->arena, (void **)&m->updates, &m->capupdates, m->nupdates + 1, sizeof(IrUpdate));
  m->updates[m->nupdates++] = (IrUpdate){leaf, value};
}

IrNode *ir_add_like(IrModule *m, const IrNode *proto) {
  IrNode *n = ir_add(m, proto->op, proto->inputs, proto->ninputs);
  n->dtype = proto->dtype;
  n->rank = proto->rank;
  memcpy(n->shape, proto->shape, sizeof n->shape);
  memcpy(n->ia, proto->ia, sizeof n->ia);
  n->fa = proto->fa;
  return n;
}

IrNode *ir_add_inferred(IrModule *m, IrNode *proto, const IrNode *at, IrPhase phase,
                        const char *what) {
  char why[512];
  if (!ir_infer(proto, why, sizeof why)) {
    fprintf(stderr, "parc: internal error: %s: %s\n", what, why);
    return NULL;
  }
  IrNode *n = ir_add_like(m, proto);
  n->shard_dim = -1;
  n->layer = at->layer;
  n->loc = at->loc;
  n->phase = phase;
  return n;
}

void ir_set_order(IrModule *m, IrNode *const *order, int n) {
  for (int i = 0; i < n; i++) {
    m->nodes[i] = order[i];
    m->nodes[i]->id = i;
  }
  m->nnodes = n;
}

void ir_insert_before(IrModule *m, int nold, IrNode *const *made, const int *at, int nmade) {
  if (m->nnodes != nold + nmade) {
    fprintf(stderr, "parc: internal error: ir_insert_before: %d nodes, %d old + %d new\n",
            m->nnodes, nold, nmade);
    abort();
  }
  /* a stable bucket sort of the new nodes by place: start[i] is the first
   * slot of place i's nodes in by[] */
  int *start = ir_xcalloc((size_t)nold + 2, sizeof *start);
  for (int c = 0; c < nmade; c++) {
    if (at[c] < 0 || at[c] > nold) {
      fprintf(stderr, "parc: internal error: ir_insert_before: place %d of %d\n", at[c], nold);
      abort();
    }
    start[at[c] + 1]++;
  }
  for (int i = 0; i <= nold; i++) start[i + 1] += start[i];
  IrNode **by = ir_xcalloc((size_t)nmade + 1, sizeof *by);
  for (int c = 0; c < nmade; c++) by[start[at[c]]++] = made[c];
  /* (start[i] is now place i's end, which is place i+1's start) */
  IrNode **order = ir_xcalloc((size_t)m->nnodes + 1, sizeof *order);
  int k = 0;
  for (int i = 0, c = 0; i <= nold; i++) {
    for (; c < start[i]; c++) order[k++] = by[c];
    if (i < nold) order[k++] = m->nodes[i];
  }
  ir_set_order(m, order, k);
  free(order);
  free(by);
  free(start);
}

int ir_node_held(const IrModule *m, const IrNode *n) {
  if (n == m->loss || n == m->ce_loss || n == m->grad_norm) return 1;
  for (int i = 0; i < m->nupdates; i++)
    if (m->updates[i].value == n) return 1;
  for (int i = 0; i < m->nnodes; i++)
    if (m->nodes[i]->op == IR_OP_PARAM && m->nodes[i]->grad == n) return 1;
  return 0;
}

void *ir_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  return p;
}

int64_t ir_numel(const IrNode *n) { return ir_dims_product(n, 0, n->rank); }

int64_t ir_aux_numel(const IrNode *n) {
  if (n->op != IR_OP_ATTENTION || n->ninputs != 3 || n->inputs[0]->rank != 4) return 0;
  const IrSdpaDims d = ir_sdpa_dims(n);
  return d.B * d.H * d.T; /* lse [B, H, T] */
}

const IrSetting *ir_setting(const IrSetting *s, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(s[i].name, name) == 0) return &s[i];
  return NULL;
}

int ir_is_aux_term(const IrModule *m, const IrNode *n) {
  for (const IrNode *a = m->loss; a && a != m->ce_loss && a->op == IR_OP_ADD && a->ninputs == 2;
       a = a->inputs[0])
    if (a->inputs[1] == n) return 1;
  return 0;
}

const char *ir_type_str(const IrNode *n, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "%s[", ir_dtype_name[n->dtype]);
  for (int i = 0; i < n->rank && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)n->shape[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
  return buf;
}
