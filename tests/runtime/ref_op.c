/* tests/runtime/ref_op.c -- see ref_op.h. */
#include "tests/runtime/ref_op.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp.h"

static RefArg ref_arg(IrDType dt, const float *f, const int32_t *i, int rank,
                      const int64_t *shape) {
  RefArg a = {.dtype = dt, .rank = rank, .f = f, .i = i};
  memcpy(a.shape, shape, sizeof(int64_t) * (size_t)rank);
  return a;
}

RefArg ref_f32(const float *p, int rank, const int64_t *shape) {
  return ref_arg(IR_F32, p, NULL, rank, shape);
}

RefArg ref_i32(const int32_t *p, int rank, const int64_t *shape) {
  return ref_arg(IR_I32, NULL, p, rank, shape);
}

int ref_op(IrOp op, const RefArg *args, int nargs, int64_t ia0, int64_t ia1, int64_t ia2,
           double fa, RefOut *out, char *why, size_t len) {
  memset(out, 0, sizeof *out);
  IrModule *m = ir_module_new("ref");
  IrNode *in[8];
  for (int k = 0; k < nargs; k++) {
    IrNode *n = in[k] = ir_add(m, IR_OP_INPUT, NULL, 0);
    n->dtype = args[k].dtype;
    n->rank = args[k].rank;
    memcpy(n->shape, args[k].shape, sizeof n->shape);
    n->name = arena_printf(&m->arena, "in%d", k);
    n->shard_dim = -1;
  }
  if (op == IR_OP_ATTENTION_GRAD && nargs == 4) { /* its fifth operand: sdpa of the first three */
    in[4] = ir_add(m, IR_OP_ATTENTION, in, 3);
    in[4]->ia[0] = ia0, in[4]->fa = fa;
    if (!ir_infer(in[4], why, len)) {
      ir_module_free(m);
      return -1;
    }
    nargs = 5;
  }
  IrNode *y = ir_add(m, op, in, nargs);
  y->ia[0] = ia0, y->ia[1] = ia1, y->ia[2] = ia2;
  y->fa = fa;
  if (!ir_infer(y, why, len)) {
    ir_module_free(m);
    return -1;
  }
  IrInterp *it = ir_interp_new(m);
  for (int k = 0; k < nargs && in[k]->op == IR_OP_INPUT; k++) {
    int64_t n = ir_numel(in[k]);
    for (int64_t e = 0; e < n; e++) {
      if (args[k].dtype == IR_I32) it->i[k][e] = args[k].i[e];
      else it->f[k][e] = args[k].f[e];
    }
  }
  int rc = ir_interp_run(it, 0, m->nnodes, why, len);
  if (rc == 0) {
    out->dtype = y->dtype;
    out->rank = y->rank;
    memcpy(out->shape, y->shape, sizeof out->shape);
    out->numel = ir_numel(y);
    size_t bytes = (size_t)out->numel * (y->dtype == IR_I32 ? sizeof(int32_t) : sizeof(double));
    void *buf = malloc(bytes);
    if (!buf) {
      fprintf(stderr, "ref_op: out of memory\n");
      exit(3);
    }
    memcpy(buf, y->dtype == IR_I32 ? (void *)it->i[y->id] : (void *)it->f[y->id], bytes);
    if (y->dtype == IR_I32) out->i = buf;
    else out->f = buf;
  }
  ir_interp_free(it);
  ir_module_free(m);
  return rc;
}

void ref_out_free(RefOut *out) {
  free(out->f);
  free(out->i);
  memset(out, 0, sizeof *out);
}

uint64_t trng_next(TRng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1Dull;
}

double trng_uniform(TRng *r) { return (double)(trng_next(r) >> 11) / 9007199254740992.0; }

float trng_normal(TRng *r) {
  double u1 = 1.0 - trng_uniform(r), u2 = trng_uniform(r);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int32_t trng_int(TRng *r, int64_t n) { return (int32_t)(trng_next(r) % (uint64_t)n); }

void trng_fill(TRng *r, float *x, int64_t n, float scale) {
  for (int64_t e = 0; e < n; e++) x[e] = scale * trng_normal(r);
}

double rel_l2(const float *got, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t e = 0; e < n; e++) {
    double d = (double)got[e] - ref[e];
    num += d * d;
    den += ref[e] * ref[e];
  }
  if (isnan(num)) return INFINITY;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

int exact(const float *got, const double *ref, int64_t n) {
  for (int64_t e = 0; e < n; e++)
    if (got[e] != (float)ref[e]) return 0;
  return 1;
}
