/* codegen/kir_print.c -- the kernel IR as readable text.
 *
 *   kernel softmax(x: f32 in, y: f32 out) rows [13] {
 *     %0:index = row 0
 *     %1:index = mul %0, 7
 *     loop 0 to 7 {
 *       %2:index = col
 *       ...
 *       %5:f32 = reduce.max %4
 *     }
 *     store y[%9], %10
 *   }
 *
 * The text shows what the lowering executes, where it executes it (see
 * "Semantics" in kir.h): row-level values at the row point where they are
 * computed, a loop's row-level values just before its header, statements
 * (stores, reductions) in build order.  Between two statements, values are
 * listed operands first in a canonical order (depth-first from the
 * statements, operands left to right), and %N numbers them in print order;
 * they are not KirVal ids.  So the text depends only on the kernel's
 * dataflow and statement order, not on the order in which C evaluated the
 * arguments of nested builder calls, and golden files do not depend on the
 * compiler.  Dead values are not shown; constants appear inline. */
#include "codegen/kir.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

static const char *const param_kind[] = {"buf", "i64", "f32"};
static const char *const access_name[] = {"", "in", "out", "inout"};
/* KirElem's order; KIR_BF16R: an f32 buffer holding bf16 values (kir.h) */
static const char *const elem_name[] = {"f32", "i32", "bf16", "f32(bf16)"};
static const char *const short_type[] = {"void", "index", "f32", "pred"};

typedef struct {
  FILE *out;
  const KirKernel *k;
  unsigned char *live;
  int *rank;      /* canonical position of each live node */
  int *num;       /* print number, -1 until printed */
  int next;
  KirVal *pend;   /* values waiting for the next statement or loop */
  int npend;
} Printer;

static void operand(Printer *p, KirVal v) {
  const KirNode *n = &p->k->nodes[v];
  if (n->op == KIR_OP_ICONST) {
    fprintf(p->out, "%" PRId64, n->imm);
  } else if (n->op == KIR_OP_FCONST) {
    if (isnan(n->fimm)) fputs("nan", p->out);
    else if (isinf(n->fimm)) fputs(n->fimm < 0 ? "-inf" : "inf", p->out);
    else fprintf(p->out, "%.9g", (double)n->fimm);
  } else {
    fprintf(p->out, "%%%d", p->num[v]);
  }
}

static void line(Printer *p, KirVal v, int indent) {
  const KirKernel *k = p->k;
  const KirNode *n = &k->nodes[v];
  FILE *out = p->out;
  fprintf(out, "%*s", indent, "");
  if (n->op != KIR_OP_STORE) {
    p->num[v] = p->next++;
    fprintf(out, "%%%d:%s = ", p->num[v], short_type[n->type]);
  }
  fputs(kir_op_name[n->op], out);
  switch (n->op) {
  case KIR_OP_ROW: fprintf(out, " %" PRId64, n->imm); break;
  case KIR_OP_PARAM: fprintf(out, " %s", k->params[n->imm].name); break;
  case KIR_OP_LOAD:
    fprintf(out, " %s[", k->params[n->imm].name);
    operand(p, n->arg[0]);
    fputc(']', out);
    break;
  case KIR_OP_STORE:
    fprintf(out, " %s[", k->params[n->imm].name);
    operand(p, n->arg[0]);
    fputs("], ", out);
    operand(p, n->arg[1]);
    break;
  case KIR_OP_IDIV:
  case KIR_OP_IMOD:
    fputc(' ', out);
    operand(p, n->arg[0]);
    fprintf(out, ", %" PRId64, n->imm);
    break;
  case KIR_OP_CMP:
  case KIR_OP_REDUCE:
    fprintf(out, ".%s", n->op == KIR_OP_CMP ? kir_cmp_name[n->imm] : kir_red_name[n->imm]);
    /* fall through */
  default:
    for (int i = 0; i < kir_op_nargs[n->op]; i++) {
      fputs(i ? ", " : " ", out);
      operand(p, n->arg[i]);
    }
    break;
  }
  fputc('\n', out);
}

static int is_stmt(const KirNode *n) { return n->op == KIR_OP_STORE || n->op == KIR_OP_REDUCE; }

/* Ranks root's unranked operands depth-first, left to right, then root. */
static void rank_from(Printer *p, KirVal root, int *next, KirVal *stack, int *argi) {
  if (p->rank[root] >= 0) return;
  int sp = 0;
  stack[sp] = root;
  argi[sp++] = 0;
  while (sp > 0) {
    KirVal v = stack[sp - 1];
    const KirNode *n = &p->k->nodes[v];
    int i = argi[sp - 1]++;
    if (i < kir_op_nargs[n->op]) {
      KirVal a = n->arg[i];
      if (p->rank[a] == -1) {
        p->rank[a] = -2;  /* on the stack */
        stack[sp] = a;
        argi[sp++] = 0;
      }
      continue;
    }
    p->rank[v] = (*next)++;
    sp--;
  }
}

/* Prints the pending values in rank order (insertion sort: the lists are
 * short and mostly sorted already). */
static void flush(Printer *p, int indent) {
  for (int i = 1; i < p->npend; i++) {
    KirVal v = p->pend[i];
    int j = i;
    for (; j > 0 && p->rank[p->pend[j - 1]] > p->rank[v]; j--) p->pend[j] = p->pend[j - 1];
    p->pend[j] = v;
  }
  for (int i = 0; i < p->npend; i++) line(p, p->pend[i], indent);
  p->npend = 0;
}

/* Queues v (a live value) or, for a statement, prints what is queued and
 * then the statement. */
static void visit(Printer *p, KirVal v, int indent) {
  const KirNode *n = &p->k->nodes[v];
  if (!p->live[v] || n->op == KIR_OP_ICONST || n->op == KIR_OP_FCONST) return;
  if (!is_stmt(n)) {
    p->pend[p->npend++] = v;
    return;
  }
  flush(p, indent);
  line(p, v, indent);
}

/* An unended loop (a builder error) runs to the last node. */
static KirVal loop_end(const KirKernel *k, int l) {
  return l == k->open ? k->nnodes : k->loops[l].end;
}

void kir_print_kernel(FILE *out, const KirKernel *k) {
  fprintf(out, "kernel %s(", k->name);
  for (int i = 0; i < k->nparams; i++) {
    const KirParam *q = &k->params[i];
    if (q->kind == KIR_PARAM_BUF)
      fprintf(out, "%s%s: %s %s", i ? ", " : "", q->name, elem_name[q->elem],
              access_name[q->access]);
    else
      fprintf(out, "%s%s: %s", i ? ", " : "", q->name, param_kind[q->kind]);
  }
  fputs(") rows [", out);
  for (int i = 0; i < k->nrows; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", k->rows[i]);
  fputs("] {\n", out);

  size_t n = (size_t)k->nnodes + 1;
  Printer p = {.out = out, .k = k};
  p.live = malloc(n);
  p.rank = malloc(n * sizeof *p.rank);
  p.num = malloc(n * sizeof *p.num);
  p.pend = malloc(n * sizeof *p.pend);
  KirVal *stack = malloc(n * sizeof *stack);
  int *argi = malloc(n * sizeof *argi);
  if (!p.live || !p.rank || !p.num || !p.pend || !stack || !argi) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  kir_fill_live(k, p.live);
  for (int i = 0; i < k->nnodes; i++) p.rank[i] = -1, p.num[i] = -1;
  int nloops = k->nloops;

  /* Ranks: depth first from the statements and extents in program order. */
  int next = 0;
  KirVal v = 0;
  for (int l = 0; l <= nloops; l++) {
    KirVal stop = l < nloops ? k->loops[l].first : k->nnodes;
    for (; v < stop; v++)
      if (is_stmt(&k->nodes[v])) rank_from(&p, v, &next, stack, argi);
    if (l == nloops) break;
    rank_from(&p, k->loops[l].extent, &next, stack, argi);
    for (v = k->loops[l].first; v < loop_end(k, l); v++)
      if (is_stmt(&k->nodes[v])) rank_from(&p, v, &next, stack, argi);
  }
  for (int i = 0; i < k->nnodes; i++)
    if (p.rank[i] < 0) p.live[i] = 0;  /* unreachable from statements */

  /* Print in execution order (kir.h, "Semantics"). */
  v = 0;
  for (int l = 0; l <= nloops; l++) {
    KirVal stop = l < nloops ? k->loops[l].first : k->nnodes;
    for (; v < stop; v++) visit(&p, v, 2);
    if (l == nloops) break;
    for (v = k->loops[l].first; v < loop_end(k, l); v++)  /* the loop's preheader */
      if (k->nodes[v].loop < 0 && !is_stmt(&k->nodes[v])) visit(&p, v, 2);
    flush(&p, 2);
    fprintf(out, "  loop %d to ", l);
    operand(&p, k->loops[l].extent);
    fputs(" {\n", out);
    for (v = k->loops[l].first; v < loop_end(k, l); v++)
      if (k->nodes[v].loop == l || is_stmt(&k->nodes[v])) visit(&p, v, 4);
    flush(&p, 4);  /* values no statement of the loop needed: none when live */
    fputs(l == k->open ? "  } (not ended)\n" : "  }\n", out);
  }
  flush(&p, 2);
  free(p.live);
  free(p.rank);
  free(p.num);
  free(p.pend);
  free(stack);
  free(argi);
  fputs("}\n", out);
}

void kir_print(FILE *out, const KirModule *m) {
  for (int i = 0; i < m->nkernels; i++) {
    if (i) fputc('\n', out);
    kir_print_kernel(out, m->kernels[i]);
  }
}
