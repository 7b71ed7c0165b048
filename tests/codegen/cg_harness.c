/* tests/codegen/cg_harness.c -- see cg_harness.h. */
#define _POSIX_C_SOURCE 200809L
#include "cg_harness.h"

#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/kir_llvm.h"

#ifndef CG_TEST_CC
#define CG_TEST_CC "cc"
#endif

#define CANARY 16  /* elements after each buffer that no kernel may touch */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int failf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

/* One trampoline per kernel, so the test calls any arity through one type. */
static int write_wrappers(const KirModule *km, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "#include <stdint.h>\n#include \"kernels.h\"\n"
             "typedef void (*cg_fn)(void **, int64_t, int64_t);\n");
  for (int i = 0; i < km->nkernels; i++) {
    const KirKernel *k = km->kernels[i];
    fprintf(f, "static void w%d(void **a, int64_t b, int64_t e) { %s(", i, k->name);
    for (int p = 0; p < k->nparams; p++) fprintf(f, "a[%d], ", p);
    fprintf(f, "b, e); }\n");
  }
  fprintf(f, "const cg_fn cg_table[] = {");
  for (int i = 0; i < km->nkernels; i++) fprintf(f, "%sw%d", i ? ", " : "", i);
  fprintf(f, "%s};\n", km->nkernels ? "" : "0");
  return fclose(f);
}

int cg_lib_open(CgLib *L, const KirModule *km, char *err, size_t errlen) {
  memset(L, 0, sizeof *L);
  const char *tmp = getenv("TMPDIR");
  snprintf(L->dir, sizeof L->dir, "%s/parc_cg_XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
  if (!mkdtemp(L->dir)) return failf(err, errlen, "mkdtemp %s failed", L->dir);
  char obj[128], ll[128], hdr[128], wrap[128], so[128], cmd[1024];
  snprintf(obj, sizeof obj, "%s/kernels.o", L->dir);
  snprintf(ll, sizeof ll, "%s/kernels.ll", L->dir);
  snprintf(hdr, sizeof hdr, "%s/kernels.h", L->dir);
  snprintf(wrap, sizeof wrap, "%s/wrap.c", L->dir);
  snprintf(so, sizeof so, "%s/kernels.so", L->dir);
  double t0 = now();
  KirLlvmOptions o;
  kir_llvm_defaults(&o);
  if (kir_write_header(km, hdr, err, errlen) || kir_llvm_emit(km, &o, obj, ll, err, errlen))
    return -1;
  if (write_wrappers(km, wrap)) return failf(err, errlen, "cannot write %s", wrap);
  snprintf(cmd, sizeof cmd, "%s -std=c11 -shared -fPIC -O1 -o %s %s %s", CG_TEST_CC, so, wrap, obj);
  if (system(cmd) != 0) return failf(err, errlen, "failed: %s", cmd);
  L->compile_s = now() - t0;
  L->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!L->dl) return failf(err, errlen, "dlopen: %s", dlerror());
  L->fns = (const CgFn *)dlsym(L->dl, "cg_table");
  if (!L->fns) return failf(err, errlen, "dlsym cg_table: %s", dlerror());
  L->nfns = km->nkernels;
  return 0;
}

void cg_lib_close(CgLib *L) {
  if (L->dl) dlclose(L->dl);
  if (L->dir[0]) {
    DIR *d = opendir(L->dir);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      snprintf(path, sizeof path, "%s/%s", L->dir, e->d_name);
      unlink(path);
    }
    if (d) closedir(d);
    rmdir(L->dir);
  }
  memset(L, 0, sizeof *L);
}

/* ---- running ----------------------------------------------------------------- */

static const uint32_t canary_bits = 0x7fc0abcdu;

static void *alloc_buf(int64_t n, size_t elem) {
  unsigned char *p = malloc((size_t)(n + CANARY) * elem);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(3);
  }
  for (int64_t e = 0; e < n + CANARY; e++) {
    uint32_t bits = e < n ? 0x7fc00000u : canary_bits;  /* NaN: "never written" */
    memcpy(p + (size_t)e * elem, &bits, sizeof bits);
  }
  return p;
}

static int canary_ok(const void *p, int64_t n, size_t elem) {
  for (int64_t e = n; e < n + CANARY; e++) {
    uint32_t bits;
    memcpy(&bits, (const unsigned char *)p + (size_t)e * elem, sizeof bits);
    if (bits != canary_bits) return 0;
  }
  return 1;
}

void cg_bufs_free(CgBufs *b) {
  for (int i = 0; i < b->nnodes; i++) {
    if (b->f) free(b->f[i]);
    if (b->i) free(b->i[i]);
  }
  free(b->f);
  free(b->i);
  memset(b, 0, sizeof *b);
}

/* The leaf or runtime value of node id, from the interpreter. */
static void copy_ref(const IrModule *m, const IrInterp *ref, CgBufs *b, int id) {
  const IrNode *n = m->nodes[id];
  for (int64_t e = 0; e < ir_numel(n); e++) {
    if (n->dtype == IR_I32) b->i[id][e] = ref->i[id][e];
    else b->f[id][e] = (float)ref->f[id][e];
  }
}

int cg_execute(const IrModule *m, const CgKernelPlan *plan, const CgLib *L, const IrInterp *ref,
               CgBufs *out, char *err, size_t errlen) {
  out->nnodes = m->nnodes;
  out->f = calloc((size_t)m->nnodes, sizeof(float *));
  out->i = calloc((size_t)m->nnodes, sizeof(int32_t *));
  unsigned char *ready = calloc((size_t)m->nnodes, 1);
  int *writes = calloc((size_t)m->nnodes, sizeof(int));
  float **temps = calloc((size_t)plan->ntemps + 1, sizeof(float *));
  if (!out->f || !out->i || !ready || !writes || !temps) return failf(err, errlen, "out of memory");
  int rc = 0;
  if (plan->nnodes != m->nnodes) rc = failf(err, errlen, "plan is for another module");
  if (L->nfns != plan->nkernels) rc = failf(err, errlen, "library does not match the plan");
  for (int i = 0; rc == 0 && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    int is_kernel = cg_kernel_op(n->op);
    if (is_kernel != (plan->kernel_of[i] >= 0))
      rc = failf(err, errlen, "%%%d (%s): kernel_of is %d", i, ir_op_info[n->op].name,
                 plan->kernel_of[i]);
    else if (!is_kernel && !plan->materialize[i])
      rc = failf(err, errlen, "%%%d (%s) is a leaf or runtime op but not materialised", i,
                 ir_op_info[n->op].name);
    if (!plan->materialize[i]) continue;
    if (n->dtype == IR_I32) out->i[i] = alloc_buf(ir_numel(n), sizeof(int32_t));
    else out->f[i] = alloc_buf(ir_numel(n), sizeof(float));
  }
  for (int t = 0; t < plan->ntemps; t++) {
    const CgTemp *T = &plan->temps[t];
    if (T->writer < 0 || T->writer >= T->reader || T->reader >= plan->nkernels)
      rc = failf(err, errlen, "temporary %d: writer %d, reader %d", t, T->writer, T->reader);
    temps[t] = alloc_buf(T->numel, sizeof(float));
  }

  int kk = 0;
  void *args[4096];
  for (int id = 0; rc == 0 && id < m->nnodes; id++) {
    const IrNode *n = m->nodes[id];
    if (!cg_kernel_op(n->op)) {
      copy_ref(m, ref, out, id);
      ready[id] = 1;
      continue;
    }
    if (kk < plan->nkernels && plan->kernels[kk].root < id)
      rc = failf(err, errlen, "kernel %d is out of order", kk);
    for (; rc == 0 && kk < plan->nkernels && plan->kernels[kk].root == id; kk++) {
      const CgKernel *ck = &plan->kernels[kk];
      if (ck->nargs != ck->k->nparams || ck->nargs > 4096) {
        rc = failf(err, errlen, "%s: nargs %d", ck->k->name, ck->nargs);
        break;
      }
      for (int a = 0; rc == 0 && a < ck->nargs; a++) {
        int x = ck->arg_node[a];
        const KirParam *p = &ck->k->params[a];
        if (p->kind != KIR_PARAM_BUF) {
          rc = failf(err, errlen, "%s: param %d is not a buffer", ck->k->name, a);
        } else if (x < 0) {
          int t = CG_ARG_TEMP(x);
          if (t >= plan->ntemps) {
            rc = failf(err, errlen, "%s: bad temp %d", ck->k->name, t);
          } else if (p->access == KIR_IN ? kk <= plan->temps[t].writer || kk > plan->temps[t].reader
                                         : kk != plan->temps[t].writer) {
            rc = failf(err, errlen, "%s uses temporary %d outside its life", ck->k->name, t);
          } else {
            args[a] = temps[t];
          }
        } else if (x >= m->nnodes || (!out->f[x] && !out->i[x])) {
          rc = failf(err, errlen, "%s: param %s is %%%d, which has no buffer", ck->k->name,
                     p->name, x);
        } else {
          args[a] = out->f[x] ? (void *)out->f[x] : (void *)out->i[x];
          int is_out = p->access != KIR_IN;
          if (!is_out && !ready[x])
            rc = failf(err, errlen, "%s reads %%%d before it is computed", ck->k->name, x);
          if (is_out) {
            int mine = 0; /* a member, or the leaf a member is written into */
            for (int j = 0; j < ck->nnodes; j++)
              mine |= ck->nodes[j] == x || plan->inplace_of[ck->nodes[j]] == x;
            if (!mine) rc = failf(err, errlen, "%s writes %%%d, not its own", ck->k->name, x);
            if ((m->nodes[x]->dtype == IR_I32) != (p->elem == KIR_I32))
              rc = failf(err, errlen, "%s: %%%d has the wrong element type", ck->k->name, x);
            writes[x]++;
          }
        }
      }
      if (rc) break;
      /* rows are independent: the upper half first, then the rest one row at
       * a time, last row first */
      int64_t rows = kir_kernel_rows(ck->k), mid = rows / 2;
      L->fns[kk](args, mid, rows);
      for (int64_t r = mid - 1; r >= 0; r--) L->fns[kk](args, r, r + 1);
      for (int a = 0; a < ck->nargs; a++)
        if (ck->arg_node[a] >= 0 && ck->k->params[a].access != KIR_IN) ready[ck->arg_node[a]] = 1;
      /* an update written in place now owns its leaf's buffer: the leaf's old
       * value is gone, and a later kernel reading the leaf finds no buffer */
      for (int j = 0; j < ck->nnodes; j++) {
        int v = ck->nodes[j], leaf = plan->inplace_of[v];
        if (leaf < 0) continue;
        out->f[v] = out->f[leaf];
        out->f[leaf] = NULL;
        ready[v] = 1;
      }
    }
  }
  if (rc == 0 && kk != plan->nkernels) rc = failf(err, errlen, "kernel %d never ran", kk);
  for (int i = 0; rc == 0 && i < m->nnodes; i++) {
    const IrNode *n = m->nodes[i];
    if (plan->materialize[i] && cg_kernel_op(n->op) && writes[i] != 1)
      rc = failf(err, errlen, "%%%d (%s) is written by %d kernels", i, ir_op_info[n->op].name,
                 writes[i]);
    if (rc == 0 && plan->inplace_of[i] >= 0 && writes[plan->inplace_of[i]] != 1)
      rc = failf(err, errlen, "%%%d (%s), written in place, is written by %d kernels", i,
                 ir_op_info[n->op].name, writes[plan->inplace_of[i]]);
    void *p = out->f[i] ? (void *)out->f[i] : (void *)out->i[i];
    if (rc == 0 && p && !canary_ok(p, ir_numel(n), out->f[i] ? sizeof(float) : sizeof(int32_t)))
      rc = failf(err, errlen, "a kernel wrote past the end of %%%d (%s)", i,
                 ir_op_info[n->op].name);
  }
  /* a reshape marked as a view holds exactly the bytes of its source */
  for (int i = 0; rc == 0 && i < m->nnodes; i++) {
    int x = plan->view_of[i];
    if (x < 0) continue;
    const IrNode *n = m->nodes[i];
    size_t bytes = (size_t)ir_numel(n) * (n->dtype == IR_I32 ? sizeof(int32_t) : sizeof(float));
    const void *a = out->f[i] ? (void *)out->f[i] : (void *)out->i[i];
    const void *b = out->f[x] ? (void *)out->f[x] : (void *)out->i[x];
    if (n->op != IR_OP_RESHAPE || !a || !b || memcmp(a, b, bytes))
      rc = failf(err, errlen, "%%%d is not a copy of %%%d (view_of)", i, x);
  }
  for (int t = 0; t < plan->ntemps; t++) {
    if (rc == 0 && !canary_ok(temps[t], plan->temps[t].numel, sizeof(float)))
      rc = failf(err, errlen, "a kernel wrote past the end of temporary %d", t);
    free(temps[t]);
  }
  free(temps);
  free(ready);
  free(writes);
  return rc;
}

/* ---- comparison ---------------------------------------------------------------- */

double cg_rel_l2(const float *got, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t e = 0; e < n; e++) {
    if (!isfinite(got[e]) && isfinite(ref[e])) return INFINITY;
    if (!isfinite(ref[e])) {
      if (!(got[e] == ref[e] || (isnan(got[e]) && isnan(ref[e])))) return INFINITY;
      continue;
    }
    double d = (double)got[e] - ref[e];
    num += d * d;
    den += ref[e] * ref[e];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

double cg_rel_l2_ff(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t e = 0; e < n; e++) {
    if (isfinite(a[e]) != isfinite(b[e])) return INFINITY;
    if (!isfinite(a[e])) continue;
    double d = (double)a[e] - (double)b[e];
    num += d * d;
    den += (double)b[e] * (double)b[e];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- random numbers ------------------------------------------------------------ */

static uint64_t next(CgRng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}

double cg_uniform(CgRng *r, double lo, double hi) {
  return lo + (hi - lo) * (double)(next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double cg_normal(CgRng *r) {
  double u1 = cg_uniform(r, 1e-12, 1), u2 = cg_uniform(r, 0, 1);
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t cg_randint(CgRng *r, int64_t n) { return (int64_t)(next(r) % (uint64_t)n); }
