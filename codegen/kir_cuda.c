/* codegen/kir_cuda.c -- lowering the kernel IR to CUDA C source.
 *
 * Per kernel: an analysis (which loads and stores are affine in the column,
 * which loops are parallel-safe and which may take float4 accesses), a
 * mapping (kir_cuda.h), then the text: a comment with the shapes, the
 * mapping and the kernel IR; the `__global__` function; its launcher.
 *
 * The body is emitted in the order the CPU lowering (kir_llvm.c) executes
 * it: row-level values and row-level stores between loops where they were
 * built, a loop's row-level values just before it, then its body in build
 * order.  Every emitted value is a `const` local named after its node
 * (v12_: node 12); constants and scalar params appear inline.  Generated
 * locals end in '_' and params never do (unsafe names are renamed p_NAME_),
 * so the two cannot clash.
 *
 * Invariant of the ROW_GROUP barrier placement: at every point of the row
 * body, loaded[] / stored_all[] / stored_lead[] hold the buffers some thread
 * of the group may have loaded / stored in a column loop / stored as the
 * group's first thread since the last group barrier.  A barrier is emitted
 * before any access that could then read what another thread wrote, or
 * overwrite what another thread read or wrote, and clears the sets.
 *
 * The split reductions (ROW_SPLIT, COL_TILE; plan_split, emit_split,
 * emit_tile) have a frame of their own: their one loop stores nothing, so
 * they need no group barriers, and their epilogue runs on one thread per row
 * (the row's lane of slice 0, or thread 0 of the row's last block),
 * sequentially.  The scratch, its per-stream lanes and the last-block
 * protocol are split_prelude's, written into kernels.cu only when some
 * kernel uses them.  LOOPS (emit_loops) has no group either: its loops are
 * independent (loops_independent), each step computing the row-level values
 * its loop reads. */
#define _POSIX_C_SOURCE 200809L
#include "codegen/kir_cuda.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const kir_cuda_mapping_name[] = {"flat", "row_group", "thread_row", "row_split",
                                              "col_tile", "loops"};

enum {
  KC_FLAT_BLOCK = 256,    /* threads per block, FLAT and LOOPS */
  KC_LOOPS_ROWS = 256,    /* LOOPS: fewer rows than this */
  KC_THREAD_BLOCK = 128,  /* threads per block, THREAD_ROW */
  KC_WARP_BLOCK = 256,    /* threads per block, ROW_GROUP of one warp (8 rows) */
  KC_MAX_GROUP = 256,     /* largest ROW_GROUP (one block per row) */
  KC_UNROLL_PASSES = 8,   /* ROW_GROUP: a constant loop of at most this many passes of
                             the group's threads is unrolled whole */
  KC_NARROW_ROWS = 1024,  /* ROW_GROUP: from this many rows, groups of several passes
                             (8 warps on each of 128 SMs: every SM busy) */
  /* split reductions (kir_cuda.h: ROW_SPLIT, COL_TILE) */
  KC_SPLIT_ROWS = 32,       /* ROW_SPLIT: fewer rows than this (below the SM count) */
  KC_SPLIT_MIN_LOOP = 4096, /* ROW_SPLIT: loops of at least this many columns */
  KC_SPLIT_BLOCKS = 1024,   /* blocks a split launch aims at (8 per SM of 132 SMs) */
  KC_SPLIT_ALIGN = 1024,    /* ROW_SPLIT chunks: multiples of 4 columns x 256 threads */
  KC_SPLIT_MIN_CHUNK = 2048, /* ROW_SPLIT: columns per block at least */
  KC_TILE_ROWS = 32,        /* COL_TILE: rows per tile (one per lane of a warp) */
  KC_TILE_SLICES = 8,       /* COL_TILE: slices of the loop per tile (warps) */
  KC_TILE_MIN_INNER = 8,    /* COL_TILE: innermost row dim at least this */
  KC_TILE_MIN_CHUNK = 64,   /* COL_TILE: loop columns per block at least, when split */
  KC_TILE_VEC = 4,          /* COL_TILE, VEC: consecutive rows a lane (plan_tile_vector) */
  KC_LANE_PARTS = 65536,    /* partials per scratch lane (kcu_part_, the prelude) */
  KC_LANE_COUNTS = 1024,    /* counters per scratch lane (kcu_count_) */
};
_Static_assert(KC_TILE_VEC == 4, "emit_tile, tiles_expr and vec_rows write the 4 out");

typedef struct {
  const KirKernel *k;
  KirCudaLaunch L;
  unsigned char *live;      /* kir_fill_live */
  unsigned char *need;      /* emitted: live, less index math only float4 accesses use */
  unsigned char *aff;       /* index node: affine in its loop's column, constant stride */
  int64_t *stride;          /* that stride (0 for row-level nodes) */
  unsigned char *al4;       /* index node: a multiple of 4 whenever the column is */
  unsigned char *vacc;      /* load/store: a float4 access in the VEC instantiation */
  unsigned char *loop_vec;  /* per loop: steps 4 columns per thread when VEC */
  unsigned char *vbuf;      /* per param: has a float4 access (alignment checked) */
  char **pname;             /* per param: its identifier in the CUDA source */
  int nsum, nkey;           /* reductions: sums; max/min (order keys) */
  /* emission state (ROW_GROUP barriers; see the invariant above) */
  unsigned char *loaded, *stored_all, *stored_lead;
  int nsync;
  int multi;                /* also NAME_multi (kir_cuda_write_multi; no split scratch) */
} Kc;

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  return p;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xcalloc(n, 1), s, n);
}

/* ---- names ---------------------------------------------------------------- */

/* C++ keywords and the identifiers kernels.cu uses unqualified: a param of
 * that name would not compile or would shadow them. */
static const char *const reserved[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break",
    "case", "catch", "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept",
    "const", "consteval", "constexpr", "constinit", "const_cast", "continue", "co_await",
    "co_return", "co_yield", "decltype", "default", "delete", "do", "double", "dynamic_cast",
    "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto",
    "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register",
    "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static",
    "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local",
    "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using",
    "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq",
    /* CUDA and the C library names the source uses */
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "dim3", "float4",
    "make_float4", "cudaStream_t", "int64_t", "int32_t", "uintptr_t", "fabsf", "fmaf",
    "copysignf", "stream", "main", "std"};

static int is_reserved(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || s[n - 1] == '_' || !strncmp(s, "kcu_", 4) || !strncmp(s, "KCU_", 4) ||
      !strncmp(s, "__", 2))
    return 1;
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
    if (!strcmp(s, reserved[i])) return 1;
  return 0;
}

/* Param identifiers: the KIR name, or p_NAME_ when that is reserved; kept
 * names never end in '_' and renamed ones always do, so all are distinct. */
static void name_params(Kc *c) {
  const KirKernel *k = c->k;
  c->pname = xcalloc((size_t)k->nparams + 1, sizeof *c->pname);
  for (int i = 0; i < k->nparams; i++) {
    const char *n = k->params[i].name;
    if (!is_reserved(n)) {
      c->pname[i] = xstrdup(n);
    } else {
      size_t len = strlen(n) + 4;
      c->pname[i] = xcalloc(len, 1);
      snprintf(c->pname[i], len, "p_%s_", n);
    }
  }
}

/* ---- analysis --------------------------------------------------------------- */

static int is_iconst(const KirKernel *k, KirVal v) { return k->nodes[v].op == KIR_OP_ICONST; }

/* Index nodes: affine form in the column of their loop, and alignment. */
static void affine(Kc *c) {
  const KirKernel *k = c->k;
  for (KirVal v = 0; v < k->nnodes; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->type != KIR_TY_INDEX) continue;
    KirVal a = d->arg[0], b = d->arg[1];
    switch (d->op) {
    case KIR_OP_ICONST: c->al4[v] = d->imm % 4 == 0; break;
    case KIR_OP_COL: c->al4[v] = 1; break;  /* the column base of a float4 step */
    case KIR_OP_IADD:
    case KIR_OP_ISUB: c->al4[v] = c->al4[a] && c->al4[b]; break;
    case KIR_OP_IMUL: c->al4[v] = c->al4[a] || c->al4[b]; break;
    default: c->al4[v] = 0; break;
    }
    if (d->loop < 0) {
      c->aff[v] = 1;
      c->stride[v] = 0;
      continue;
    }
    int64_t s = 0;
    int ok = 0;
    switch (d->op) {
    case KIR_OP_COL: s = 1, ok = 1; break;
    case KIR_OP_IADD:
      ok = c->aff[a] && c->aff[b] && !__builtin_add_overflow(c->stride[a], c->stride[b], &s);
      break;
    case KIR_OP_ISUB:
      ok = c->aff[a] && c->aff[b] && !__builtin_sub_overflow(c->stride[a], c->stride[b], &s);
      break;
    case KIR_OP_IMUL:
      if (c->aff[a] && c->aff[b] && is_iconst(k, b))
        ok = !__builtin_mul_overflow(c->stride[a], k->nodes[b].imm, &s);
      else if (c->aff[a] && c->aff[b] && is_iconst(k, a))
        ok = !__builtin_mul_overflow(c->stride[b], k->nodes[a].imm, &s);
      break;
    default: break;
    }
    c->aff[v] = (unsigned char)ok;
    c->stride[v] = ok ? s : 0;
  }
}

/* Per loop: is it parallel-safe (kir_cuda.h), and which accesses take
 * float4.  Returns 1 if every loop is parallel-safe. */
static int loops(Kc *c) {
  const KirKernel *k = c->k;
  int np = k->nparams, safe = 1;
  int *nst = xcalloc((size_t)np + 1, sizeof *nst), *nld = xcalloc((size_t)np + 1, sizeof *nld);
  KirVal *idx = xcalloc((size_t)np + 1, sizeof *idx);
  KirVal *last_load = xcalloc((size_t)np + 1, sizeof *last_load);
  KirVal *first_store = xcalloc((size_t)np + 1, sizeof *first_store);
  unsigned char *mixed = xcalloc((size_t)np + 1, 1);
  for (int l = 0; l < k->nloops; l++) {
    const KirLoop *lp = &k->loops[l];
    for (int b = 0; b < np; b++)
      nst[b] = nld[b] = 0, idx[b] = last_load[b] = first_store[b] = KIR_NONE, mixed[b] = 0;
    for (KirVal v = lp->first; v < lp->end; v++) {
      const KirNode *d = &k->nodes[v];
      int st = d->op == KIR_OP_STORE, ld = d->op == KIR_OP_LOAD && d->loop == l;
      if (!c->live[v] || (!st && !ld)) continue;
      int b = (int)d->imm;
      if (st && k->nodes[d->arg[0]].loop != l) safe = 0;  /* every iteration, one element */
      (st ? nst : nld)[b]++;
      if (st && first_store[b] == KIR_NONE) first_store[b] = v;
      if (ld) last_load[b] = v;
      if (idx[b] == KIR_NONE) idx[b] = d->arg[0];
      else if (idx[b] != d->arg[0]) mixed[b] = 1;
    }
    for (int b = 0; b < np; b++)
      if (nst[b] && nld[b] && mixed[b]) safe = 0;
    const KirNode *e = &k->nodes[lp->extent];
    if (e->op != KIR_OP_ICONST || e->imm <= 0 || e->imm % 4) continue;
    for (KirVal v = lp->first; v < lp->end; v++) {
      const KirNode *d = &k->nodes[v];
      if (!c->live[v] || (d->op != KIR_OP_LOAD && d->op != KIR_OP_STORE) || d->loop != l) continue;
      int b = (int)d->imm;
      KirVal i = d->arg[0];
      if (k->params[b].elem == KIR_I32 || !c->aff[i] || c->stride[i] != 1 || !c->al4[i]) continue;
      /* a buffer the loop stores: one store, loads of that element only and
       * all before it (read-modify-write), so the float4 load may come first */
      int rmw = nst[b] == 1 && !mixed[b] && (nld[b] == 0 || last_load[b] < first_store[b]);
      if (d->op == KIR_OP_LOAD ? nst[b] == 0 || rmw : rmw) {
        c->vacc[v] = 1;
        c->loop_vec[l] = 1;
        c->vbuf[b] = 1;
      }
    }
  }
  free(nst);
  free(nld);
  free(idx);
  free(last_load);
  free(first_store);
  free(mixed);
  return safe;
}

/* Marks the row-level nodes a float4 access's index needs (it is printed
 * inline at the column base, see index_at). */
static void need_index_at(Kc *c, KirVal v) {
  const KirNode *d = &c->k->nodes[v];
  if (d->loop < 0) {
    c->need[v] = 1;
    return;
  }
  for (int i = 0; i < kir_op_nargs[d->op]; i++) need_index_at(c, d->arg[i]);
}

/* The shape the split reductions take (kir_cuda.h): one parallel-safe loop
 * of constant extent with a reduction and no store, no row-level store
 * before it.  Everything after the loop is the epilogue of the row. */
static int split_shape(const Kc *c, int safe) {
  const KirKernel *k = c->k;
  if (k->nloops != 1 || !safe || c->nsum + c->nkey == 0) return 0;
  const KirLoop *lp = &k->loops[0];
  if (!is_iconst(k, lp->extent) || k->nodes[lp->extent].imm <= 0) return 0;
  for (KirVal v = 0; v < lp->end; v++)
    if (c->live[v] && k->nodes[v].op == KIR_OP_STORE) return 0;
  return 1;
}

/* COL_TILE's condition on the loads: every live load of loop 0 is at an
 * index that steps by 1 from one row to the next (row stride 1 in the
 * innermost row dim; outer row dims count as constant: a warp's 32 lanes
 * read one 128-byte line) or not at all (row stride 0: one address a warp,
 * e.g. layernorm's per-token mean and rstd in its weight gradient), and at
 * least one steps by 1. */
/* Index nodes affine in the innermost row: ok[v], and rs[v] the stride from
 * one row to the next (outer row dims count as constant); ok[v] 0 for
 * anything else.  rows_contiguous's and plan_tile_vector's common part. */
static void row_strides(const KirKernel *k, unsigned char *ok, int64_t *rs) {
  for (KirVal v = 0; v < k->nnodes; v++) {
    const KirNode *d = &k->nodes[v];
    KirVal a = d->arg[0], b = d->arg[1];
    switch (d->op) {
    case KIR_OP_ICONST:
    case KIR_OP_PARAM:
    case KIR_OP_COL: ok[v] = 1, rs[v] = 0; break;
    case KIR_OP_ROW: ok[v] = 1, rs[v] = d->imm == k->nrows - 1; break;
    case KIR_OP_IADD: ok[v] = ok[a] && ok[b] && !__builtin_add_overflow(rs[a], rs[b], &rs[v]); break;
    case KIR_OP_ISUB: ok[v] = ok[a] && ok[b] && !__builtin_sub_overflow(rs[a], rs[b], &rs[v]); break;
    case KIR_OP_IMUL:
      if (ok[a] && ok[b] && is_iconst(k, b))
        ok[v] = !__builtin_mul_overflow(rs[a], k->nodes[b].imm, &rs[v]);
      else if (ok[a] && ok[b] && is_iconst(k, a))
        ok[v] = !__builtin_mul_overflow(rs[b], k->nodes[a].imm, &rs[v]);
      break;
    default: break; /* not affine in the row: ok[v] stays 0 */
    }
  }
}

static int rows_contiguous(const Kc *c) {
  const KirKernel *k = c->k;
  if (k->nrows < 1 || k->rows[k->nrows - 1] < KC_TILE_MIN_INNER) return 0;
  size_t n = (size_t)k->nnodes + 1;
  unsigned char *ok = xcalloc(n, 1);
  int64_t *rs = xcalloc(n, sizeof *rs);
  row_strides(k, ok, rs);
  int ones = 0, all = 1;
  for (KirVal v = 0; v < k->nnodes; v++) {
    const KirNode *d = &k->nodes[v];
    KirVal a = d->arg[0];
    if (d->op != KIR_OP_LOAD || !c->live[v] || d->loop != 0) continue;
    if (!ok[a] || (rs[a] != 0 && rs[a] != 1)) all = 0;
    ones += ok[a] && rs[a] == 1;
  }
  free(ok);
  free(rs);
  return ones > 0 && all;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* COL_TILE's VEC instantiation (kir_cuda.h): a lane takes KC_TILE_VEC
 * consecutive rows and reads each load that steps by 1 from row to row as
 * one access of that many elements.  It applies when the innermost row dim
 * is a multiple of KC_TILE_VEC, each such load's index is a multiple of it
 * at a lane's first row (so the lane's rows share their outer row
 * coordinates, and the access is aligned where the buffer is), and the loop
 * reads the innermost row nowhere else: every other value of the loop is
 * the same for the lane's rows (a load at a row stride of 0, the column's
 * index math) or comes from one of the loaded elements.  Sets vacc on those
 * loads, vbuf on their params and loop_vec[0]. */
static void plan_tile_vector(Kc *c) {
  const KirKernel *k = c->k;
  const KirLoop *lp = &k->loops[0];
  if (k->rows[k->nrows - 1] % KC_TILE_VEC) return;
  size_t n = (size_t)k->nnodes + 1;
  unsigned char *ok = xcalloc(n, 1), *al = xcalloc(n, 1), *dep = xcalloc(n, 1);
  unsigned char *vec = xcalloc(n, 1);
  int64_t *rs = xcalloc(n, sizeof *rs);
  int fine = 1, nvec = 0;
  /* ok, rs: affine in the innermost row with that stride (row_strides); al: a
   * multiple of KC_TILE_VEC where the innermost row is; dep: varies with the
   * innermost row (through index math or a row-level load) */
  row_strides(k, ok, rs);
  for (KirVal v = 0; v < k->nnodes && fine; v++) {
    const KirNode *d = &k->nodes[v];
    KirVal a = d->arg[0], b = d->arg[1];
    int in_loop = v >= lp->first && v < lp->end && (d->loop == 0 || d->op == KIR_OP_REDUCE);
    switch (d->op) {
    case KIR_OP_ICONST: al[v] = d->imm % KC_TILE_VEC == 0; break;
    case KIR_OP_PARAM:
    case KIR_OP_COL: break;
    case KIR_OP_ROW: al[v] = dep[v] = d->imm == k->nrows - 1; break;
    case KIR_OP_IADD:
    case KIR_OP_ISUB:
      al[v] = al[a] && al[b];
      dep[v] = dep[a] || dep[b];
      break;
    case KIR_OP_IMUL:
      al[v] = al[a] || al[b];
      dep[v] = dep[a] || dep[b];
      break;
    case KIR_OP_LOAD:
      if (in_loop && c->live[v] && dep[a]) {
        if (!ok[a] || rs[a] != 1 || !al[a] || k->params[d->imm].elem == KIR_I32) fine = 0;
        vec[v] = 1, nvec++;
      }
      dep[v] = !in_loop && dep[a]; /* a row-level load: one value a row */
      break;
    default:
      for (int i = 0; i < kir_op_nargs[d->op]; i++) dep[v] |= dep[d->arg[i]];
      if (in_loop && c->live[v] && dep[v]) fine = 0; /* the row in a value of the loop */
      if (d->op == KIR_OP_REDUCE) dep[v] = 0;       /* a value a row, after the loop */
      break;
    }
  }
  if (fine && nvec) {
    for (KirVal v = 0; v < k->nnodes; v++)
      if (vec[v]) c->vacc[v] = 1, c->vbuf[k->nodes[v].imm] = 1;
    c->loop_vec[0] = 1;
  }
  free(ok);
  free(al);
  free(dep);
  free(vec);
  free(rs);
}

/* ROW_SPLIT or COL_TILE with their parts and chunk, when they apply. */
static void plan_split(Kc *c, int safe) {
  const KirKernel *k = c->k;
  KirCudaLaunch *L = &c->L;
  if (!split_shape(c, safe)) return;
  int64_t E = k->nodes[k->loops[0].extent].imm, R = kir_kernel_rows(k), nred = c->nsum + c->nkey;
  if (rows_contiguous(c)) {
    L->mapping = KIR_CUDA_COL_TILE;
    L->row_threads = 1;
    L->block_threads = KC_TILE_ROWS * KC_TILE_SLICES;
    L->parts = 1;
    L->chunk = E; /* the parts: plan_tile_parts, once the tile's width is known */
    return;
  }
  if (R >= KC_SPLIT_ROWS || R > KC_LANE_COUNTS || E < KC_SPLIT_MIN_LOOP) return;
  int64_t most = KC_SPLIT_BLOCKS / R;
  if (most > KC_LANE_PARTS / (nred * R)) most = KC_LANE_PARTS / (nred * R);
  int64_t chunk = cdiv(cdiv(E, most), KC_SPLIT_ALIGN) * KC_SPLIT_ALIGN;
  if (chunk < KC_SPLIT_MIN_CHUNK) chunk = KC_SPLIT_MIN_CHUNK;
  if (cdiv(E, chunk) < 2) return;
  L->mapping = KIR_CUDA_ROW_SPLIT;
  L->row_threads = L->block_threads = KC_MAX_GROUP;
  L->parts = cdiv(E, chunk);
  L->chunk = chunk;
}

/* An index as column + off + row-level terms, summed by IADD: 1 and the
 * parts (the terms in node order, at most 4), else 0. */
typedef struct {
  int ncol, nterms;
  int64_t off;
  KirVal terms[4];
} IndexTerms;

static int index_terms(const KirKernel *k, KirVal v, IndexTerms *t) {
  const KirNode *d = &k->nodes[v];
  switch (d->op) {
  case KIR_OP_COL: t->ncol++; return 1;
  case KIR_OP_ICONST: return !__builtin_add_overflow(t->off, d->imm, &t->off);
  case KIR_OP_IADD: return index_terms(k, d->arg[0], t) && index_terms(k, d->arg[1], t);
  default:
    if (d->loop >= 0 || t->nterms == 4) return 0;
    int i = t->nterms++;
    for (; i > 0 && t->terms[i - 1] > v; i--) t->terms[i] = t->terms[i - 1];
    t->terms[i] = v;
    return 1;
  }
}

/* Whether stores s (loop l) and s2 (loop m) of one buffer write disjoint
 * elements of a row: each at column + constant + the same row-level terms,
 * the constants' ranges over the loops' extents apart. */
static int stores_disjoint(const KirKernel *k, KirVal s, int l, KirVal s2, int m) {
  IndexTerms a = {0}, b = {0};
  if (!index_terms(k, k->nodes[s].arg[0], &a) || !index_terms(k, k->nodes[s2].arg[0], &b) ||
      a.ncol != 1 || b.ncol != 1 || a.nterms != b.nterms)
    return 0;
  for (int i = 0; i < a.nterms; i++)
    if (a.terms[i] != b.terms[i]) return 0;
  int64_t ea = k->nodes[k->loops[l].extent].imm, eb = k->nodes[k->loops[m].extent].imm;
  return a.off + ea <= b.off || b.off + eb <= a.off;
}

/* LOOPS's condition (kir_cuda.h) beyond the plan's own: the loops'
 * independence.  safe: every loop is parallel-safe. */
static int loops_independent(const Kc *c, int safe) {
  const KirKernel *k = c->k;
  if (k->nloops < 2 || !safe) return 0;
  for (int l = 0; l < k->nloops; l++) {
    const KirNode *e = &k->nodes[k->loops[l].extent];
    if (e->op != KIR_OP_ICONST || e->imm <= 0) return 0;
  }
  for (KirVal s = 0; s < k->nnodes; s++) {
    const KirNode *d = &k->nodes[s];
    if (!c->live[s] || d->op != KIR_OP_STORE) continue;
    int l = d->loop; /* (no row-level stores: the plan's condition) */
    for (KirVal v = 0; v < k->nnodes; v++) {
      const KirNode *e = &k->nodes[v];
      if (v == s || !c->live[v] || e->imm != d->imm) continue;
      if (e->op == KIR_OP_LOAD && e->loop != l) return 0; /* another loop's, or a row's */
      if (e->op == KIR_OP_STORE && e->loop != l && !stores_disjoint(k, s, l, v, e->loop)) return 0;
    }
  }
  return 1;
}

/* COL_TILE's parts and chunk: the loop split where there are too few tiles
 * for about KC_SPLIT_BLOCKS blocks, counting the tiles of the instantiation
 * that runs where it can (128 rows with VEC, else 32); the scratch has a
 * counter per tile of 32 rows (the scalar instantiation's) and room for
 * every row's partials.  Both instantiations take the same parts. */
static void plan_tile_parts(Kc *c) {
  const KirKernel *k = c->k;
  KirCudaLaunch *L = &c->L;
  int64_t E = k->nodes[k->loops[0].extent].imm, R = kir_kernel_rows(k), nred = c->nsum + c->nkey;
  int64_t tiles = cdiv(R, KC_TILE_ROWS * (L->vector ? KC_TILE_VEC : 1));
  if (tiles >= KC_SPLIT_BLOCKS / 2 || cdiv(R, KC_TILE_ROWS) > KC_LANE_COUNTS) return;
  int64_t most = cdiv(KC_SPLIT_BLOCKS, tiles);
  if (most > E / KC_TILE_MIN_CHUNK) most = E / KC_TILE_MIN_CHUNK;
  if (most > KC_LANE_PARTS / (nred * R)) most = KC_LANE_PARTS / (nred * R);
  if (most < 2) return;
  int64_t chunk = cdiv(cdiv(E, most), KC_TILE_SLICES) * KC_TILE_SLICES;
  if (cdiv(E, chunk) < 2) return;
  L->parts = cdiv(E, chunk);
  L->chunk = chunk;
}

static void plan(Kc *c) {
  const KirKernel *k = c->k;
  size_t n = (size_t)k->nnodes + 1, np = (size_t)k->nparams + 1;
  c->live = xcalloc(n, 1);
  c->need = xcalloc(n, 1);
  c->aff = xcalloc(n, 1);
  c->stride = xcalloc(n, sizeof *c->stride);
  c->al4 = xcalloc(n, 1);
  c->vacc = xcalloc(n, 1);
  c->loop_vec = xcalloc((size_t)k->nloops + 1, 1);
  c->vbuf = xcalloc(np, 1);
  c->loaded = xcalloc(np, 1);
  c->stored_all = xcalloc(np, 1);
  c->stored_lead = xcalloc(np, 1);
  kir_fill_live(k, c->live);
  affine(c);
  int safe = loops(c);

  int row_store = 0, row_load_conflict = 0;
  c->nsum = c->nkey = 0;
  for (KirVal v = 0; v < k->nnodes; v++) {
    const KirNode *d = &k->nodes[v];
    if (!c->live[v]) continue;
    if (d->op == KIR_OP_REDUCE) *(d->imm == KIR_SUM ? &c->nsum : &c->nkey) += 1;
    if (d->op == KIR_OP_STORE && d->loop < 0) row_store = 1;
    /* a row-level load of a buffer loop 0 stores: ordered before the loop */
    if (d->op == KIR_OP_LOAD && d->loop < 0 && k->nloops == 1)
      for (KirVal s = k->loops[0].first; s < k->loops[0].end; s++)
        if (k->nodes[s].op == KIR_OP_STORE && k->nodes[s].imm == d->imm && c->live[s])
          row_load_conflict = 1;
  }
  KirCudaLaunch *L = &c->L;
  L->row_threads = 1;
  L->parts = 1;
  L->chunk = 0;
  if (k->nloops == 0 || !safe) {
    L->mapping = KIR_CUDA_THREAD_ROW;
    L->block_threads = KC_THREAD_BLOCK;
  } else if (k->nloops == 1 && !c->nsum && !c->nkey && !row_store && !row_load_conflict &&
             is_iconst(k, k->loops[0].extent)) {
    L->mapping = KIR_CUDA_FLAT;
    L->block_threads = KC_FLAT_BLOCK;
  } else if (!c->nsum && !c->nkey && !row_store && kir_kernel_rows(k) < KC_LOOPS_ROWS &&
             loops_independent(c, safe)) {
    L->mapping = KIR_CUDA_LOOPS;
    L->block_threads = KC_FLAT_BLOCK;
  } else {
    L->mapping = KIR_CUDA_ROW_GROUP;
    int64_t items = 1;
    for (int l = 0; l < k->nloops; l++) {
      const KirNode *e = &k->nodes[k->loops[l].extent];
      int64_t w = c->loop_vec[l] ? 4 : 1;
      int64_t it = e->op == KIR_OP_ICONST ? (e->imm + w - 1) / w : KC_MAX_GROUP;
      if (it > items) items = it;
    }
    /* enough rows to fill the GPU with warps: a warp per row, its lanes
     * running up to KC_UNROLL_PASSES passes (shuffle reductions, no block
     * barrier, every lane busy: 768 columns as float4 are 6 passes of 32
     * lanes where a 256-thread block left 64 lanes idle); wider groups only
     * for longer rows.  Fewer rows: the narrowest group covering the row in
     * one pass, so that a short launch still spreads over the SMs */
    const int64_t passes = kir_kernel_rows(k) >= KC_NARROW_ROWS ? KC_UNROLL_PASSES : 1;
    int t = 32;
    while (t < KC_MAX_GROUP && items > t * passes) t *= 2;
    L->row_threads = t;
    L->block_threads = t == 32 ? KC_WARP_BLOCK : t;
  }
  plan_split(c, safe);
  /* sequential rows: no float4; a lane per row (COL_TILE): rows, not columns */
  if (L->mapping == KIR_CUDA_THREAD_ROW || L->mapping == KIR_CUDA_COL_TILE) {
    memset(c->vacc, 0, n);
    memset(c->loop_vec, 0, (size_t)k->nloops + 1);
    memset(c->vbuf, 0, np);
  }
  if (L->mapping == KIR_CUDA_COL_TILE) plan_tile_vector(c);
  L->vector = 0;
  for (int l = 0; l < k->nloops; l++) L->vector |= c->loop_vec[l];
  if (L->mapping == KIR_CUDA_COL_TILE) plan_tile_parts(c);

  /* need: liveness where a float4 access does not use its index node (it
   * is printed inline at the column base) */
  for (int l = 0; l < k->nloops; l++) c->need[k->loops[l].extent] = 1;
  for (KirVal v = k->nnodes - 1; v >= 0; v--) {
    const KirNode *d = &k->nodes[v];
    if (d->op == KIR_OP_STORE || d->op == KIR_OP_REDUCE) c->need[v] = c->live[v];
    if (!c->need[v]) continue;
    for (int i = 0; i < kir_op_nargs[d->op]; i++) {
      if (c->vacc[v] && i == 0) {  /* the index of a float4 load or store */
        need_index_at(c, d->arg[0]);
        continue;
      }
      c->need[d->arg[i]] = 1;
    }
  }
}

static void unplan(Kc *c) {
  free(c->live);
  free(c->need);
  free(c->aff);
  free(c->stride);
  free(c->al4);
  free(c->vacc);
  free(c->loop_vec);
  free(c->vbuf);
  free(c->loaded);
  free(c->stored_all);
  free(c->stored_lead);
  if (c->pname)
    for (int i = 0; i < c->k->nparams; i++) free(c->pname[i]);
  free(c->pname);
}

void kir_cuda_plan(const KirKernel *k, KirCudaLaunch *out) {
  Kc c;
  memset(&c, 0, sizeof c);
  c.k = k;
  plan(&c);
  *out = c.L;
  unplan(&c);
}

/* ---- text ------------------------------------------------------------------ */

/* An f32 literal that reads back as exactly f (9 significant digits); the
 * bits themselves for NaN, infinities and denormals. */
static void fmt_f32(char *buf, size_t n, float f) {
  if (isnan(f) || isinf(f) || fpclassify(f) == FP_SUBNORMAL) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    snprintf(buf, n, "__int_as_float(0x%08" PRIx32 ")", u);
    return;
  }
  char t[40];
  snprintf(t, sizeof t, "%.9g", (double)f);
  int neg = signbit(f) != 0;  /* parenthesised: safe after any operator */
  snprintf(buf, n, "%s%s%sf%s", neg ? "(" : "", t, strpbrk(t, ".e") ? "" : ".0", neg ? ")" : "");
}

static void fmt_i64(char *buf, size_t n, int64_t v) {
  if (v == INT64_MIN) snprintf(buf, n, "(-9223372036854775807LL - 1)");
  else if (v < INT32_MIN) snprintf(buf, n, "(%" PRId64 "LL)", v);
  else if (v < 0) snprintf(buf, n, "(%" PRId64 ")", v);
  else if (v > INT32_MAX) snprintf(buf, n, "%" PRId64 "LL", v);
  else snprintf(buf, n, "%" PRId64, v);
}

/* Prints node v as an operand: a literal, a param, a column, or its local. */
static void opnd(const Kc *c, FILE *f, KirVal v) {
  const KirNode *d = &c->k->nodes[v];
  char buf[64];
  switch (d->op) {
  case KIR_OP_ICONST: fmt_i64(buf, sizeof buf, d->imm); fputs(buf, f); break;
  case KIR_OP_FCONST: fmt_f32(buf, sizeof buf, d->fimm); fputs(buf, f); break;
  case KIR_OP_PARAM: fputs(c->pname[d->imm], f); break;
  case KIR_OP_COL: fprintf(f, "c%d_", d->loop); break;
  default: fprintf(f, "v%d_", v); break;
  }
}

/* Nodes printed inline (no local of their own). */
static int is_inline(const KirNode *d) {
  return d->op == KIR_OP_ICONST || d->op == KIR_OP_FCONST || d->op == KIR_OP_PARAM ||
         d->op == KIR_OP_COL;
}

/* An affine index with the column replaced by the float4 step's base cb_
 * (COL_TILE: at the lane's first row, the column c0_). */
static void index_at(const Kc *c, FILE *f, KirVal v) {
  const KirNode *d = &c->k->nodes[v];
  if (d->loop < 0) {
    opnd(c, f, v);
    return;
  }
  if (d->op == KIR_OP_COL) { /* COL_TILE: the column itself (its vectors run over rows) */
    fputs(c->L.mapping == KIR_CUDA_COL_TILE ? "c0_" : "cb_", f);
    return;
  }
  /* IADD, ISUB or IMUL by a constant (aff[v] holds) */
  fputc('(', f);
  index_at(c, f, d->arg[0]);
  fputs(d->op == KIR_OP_IADD ? " + " : d->op == KIR_OP_ISUB ? " - " : " * ", f);
  index_at(c, f, d->arg[1]);
  fputc(')', f);
}

static const char *ctype(KirType t) {
  return t == KIR_TY_INDEX ? "int64_t" : t == KIR_TY_F32 ? "float" : "bool";
}

/* `const T vN_ = expr;` for a value node (not a statement, not inline). */
static void emit_value(const Kc *c, FILE *f, KirVal v, const char *ind) {
  const KirKernel *k = c->k;
  const KirNode *d = &k->nodes[v];
  KirVal a = d->arg[0], b = d->arg[1];
  fprintf(f, "%sconst %s v%d_ = ", ind, ctype(d->type), v);
  static const char *const fbin[] = {"__fadd_rn", "__fsub_rn", "__fmul_rn", "__fdiv_rn"};
  static const char *const cmp[] = {" < ", " <= ", " > ", " >= ", " == ", " != "};  /* ORDER KirCmp */
  switch (d->op) {
  case KIR_OP_ROW: {
    int64_t inner = 1;
    for (int r = (int)d->imm + 1; r < k->nrows; r++) inner *= k->rows[r];
    fputs(inner > 1 && d->imm > 0 ? "(r_" : "r_", f);
    if (inner > 1) fprintf(f, " / %" PRId64 "%s", inner, d->imm > 0 ? ")" : "");
    if (d->imm > 0) fprintf(f, " %% %" PRId64, k->rows[d->imm]);
    break;
  }
  case KIR_OP_IADD:
  case KIR_OP_ISUB:
  case KIR_OP_IMUL:
    opnd(c, f, a);
    fputs(d->op == KIR_OP_IADD ? " + " : d->op == KIR_OP_ISUB ? " - " : " * ", f);
    opnd(c, f, b);
    break;
  case KIR_OP_IDIV:
  case KIR_OP_IMOD:
    opnd(c, f, a);
    fprintf(f, " %c %" PRId64 "%s", d->op == KIR_OP_IDIV ? '/' : '%', d->imm,
            d->imm > INT32_MAX ? "LL" : "");
    break;
  case KIR_OP_IMIN:
  case KIR_OP_IMAX:
    opnd(c, f, a);
    fputs(d->op == KIR_OP_IMIN ? " < " : " > ", f);
    opnd(c, f, b);
    fputs(" ? ", f);
    opnd(c, f, a);
    fputs(" : ", f);
    opnd(c, f, b);
    break;
  case KIR_OP_LOAD:
    if (k->params[d->imm].elem == KIR_I32) fputs("(int64_t)", f);
    if (k->params[d->imm].elem == KIR_BF16) fputs("__bfloat162float(", f);
    fprintf(f, "%s[", c->pname[d->imm]);
    opnd(c, f, a);
    fputc(']', f);
    if (k->params[d->imm].elem == KIR_BF16) fputc(')', f);
    break;
  case KIR_OP_FADD:
  case KIR_OP_FSUB:
  case KIR_OP_FMUL:
  case KIR_OP_FDIV:
  case KIR_OP_FMAX:
  case KIR_OP_FMIN:
    fputs(d->op == KIR_OP_FMAX   ? "kcu_fmax("
          : d->op == KIR_OP_FMIN ? "kcu_fmin("
                                 : fbin[d->op - KIR_OP_FADD],
          f);
    if (d->op != KIR_OP_FMAX && d->op != KIR_OP_FMIN) fputc('(', f);
    opnd(c, f, a);
    fputs(", ", f);
    opnd(c, f, b);
    fputc(')', f);
    break;
  case KIR_OP_FNEG:
    fputs("-(", f);
    opnd(c, f, a);
    fputc(')', f);
    break;
  case KIR_OP_FABS:
  case KIR_OP_EXP:
  case KIR_OP_LOG:
  case KIR_OP_TANH:
  case KIR_OP_SQRT:
  case KIR_OP_RSQRT:
  case KIR_OP_ITOF: {
    static const char *const fn[] = {"fabsf", "kcu_exp", "kcu_log", "kcu_tanh",
                                     "__fsqrt_rn", "kcu_rsqrt", "__ll2float_rn"};
    fprintf(f, "%s(", fn[d->op - KIR_OP_FABS]);
    opnd(c, f, a);
    fputc(')', f);
    break;
  }
  case KIR_OP_CMP:
    opnd(c, f, a);
    fputs(cmp[d->imm], f);
    opnd(c, f, b);
    break;
  case KIR_OP_SELECT:
    opnd(c, f, a);
    fputs(" ? ", f);
    opnd(c, f, b);
    fputs(" : ", f);
    opnd(c, f, d->arg[2]);
    break;
  default: break;  /* inline nodes and statements never get here */
  }
  fputs(";\n", f);
}

static void emit_store_to(const Kc *c, FILE *f, const KirNode *d) {
  fprintf(f, "%s[", c->pname[d->imm]);
  opnd(c, f, d->arg[0]);
  fputs("] = ", f);
  if (c->k->params[d->imm].elem == KIR_I32) fputs("(int32_t)", f);
  KirElem e = c->k->params[d->imm].elem;
  if (e == KIR_BF16 || e == KIR_BF16R)
    fputs(e == KIR_BF16 ? "__float2bfloat16_rn(" : "kcu_round_bf16(", f);
  opnd(c, f, d->arg[1]);
  fputs(e == KIR_BF16 || e == KIR_BF16R ? ");\n" : ";\n", f);
}

/* ---- ROW_GROUP barriers ------------------------------------------------------ */

static int grouped(const Kc *c) { return c->L.mapping == KIR_CUDA_ROW_GROUP; }

static void sync_group(Kc *c, FILE *f, const char *ind) {
  size_t np = (size_t)c->k->nparams + 1;
  fprintf(f, "%s%s\n", ind, c->L.row_threads == 32 ? "__syncwarp();" : "__syncthreads();");
  memset(c->loaded, 0, np);
  memset(c->stored_all, 0, np);
  memset(c->stored_lead, 0, np);
  c->nsync++;
}

/* Before a row-level load of b (every thread): after others' stores. */
static void before_row_load(Kc *c, FILE *f, int b, const char *ind) {
  if (!grouped(c)) return;
  if (c->stored_all[b] || c->stored_lead[b]) sync_group(c, f, ind);
  c->loaded[b] = 1;
}

/* Before a row-level store to b (the first thread only). */
static void before_row_store(Kc *c, FILE *f, int b, const char *ind) {
  if (!grouped(c)) return;
  if (c->loaded[b] || c->stored_all[b]) sync_group(c, f, ind);
  c->stored_lead[b] = 1;
}

/* Before column loop l (all threads, any element of the row). */
static void before_loop(Kc *c, FILE *f, int l, const char *ind) {
  if (!grouped(c)) return;
  const KirKernel *k = c->k;
  const KirLoop *lp = &k->loops[l];
  int need = 0;
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (!c->live[v]) continue;
    int b = (int)d->imm;
    if (d->op == KIR_OP_LOAD && d->loop == l && (c->stored_all[b] || c->stored_lead[b])) need = 1;
    if (d->op == KIR_OP_STORE && (c->loaded[b] || c->stored_all[b] || c->stored_lead[b]))
      need = 1;
  }
  if (need) sync_group(c, f, ind);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (!c->live[v]) continue;
    if (d->op == KIR_OP_LOAD && d->loop == l) c->loaded[d->imm] = 1;
    if (d->op == KIR_OP_STORE) c->stored_all[d->imm] = 1;
  }
}

/* ---- the body ----------------------------------------------------------------- */

/* A row-level node at a row point: a value, or a row-level store. */
static void emit_row_point(Kc *c, FILE *f, KirVal v, const char *ind) {
  const KirNode *d = &c->k->nodes[v];
  if (d->op == KIR_OP_STORE) {
    before_row_store(c, f, (int)d->imm, ind);
    fputs(ind, f);
    if (grouped(c)) fputs("if (lane_ == 0) ", f);
    emit_store_to(c, f, d);
    return;
  }
  if (!c->need[v] || d->loop >= 0 || d->op == KIR_OP_REDUCE || is_inline(d)) return;
  if (d->op == KIR_OP_LOAD) before_row_load(c, f, (int)d->imm, ind);
  emit_value(c, f, v, ind);
}

/* The statements and loop-varying values of loop l, for one column. */
static void emit_column(Kc *c, FILE *f, int l, int vec, const char *ind) {
  const KirKernel *k = c->k;
  const KirLoop *lp = &k->loops[l];
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op == KIR_OP_STORE) {
      if (vec && c->vacc[v]) {  /* (a KIR_BF16 buffer's kcu_st rounds) */
        int r = k->params[d->imm].elem == KIR_BF16R;
        fprintf(f, "%ss%d_[j_] = %s", ind, v, r ? "kcu_round_bf16(" : "");
        opnd(c, f, d->arg[1]);
        fputs(r ? ");\n" : ";\n", f);
      } else {
        fputs(ind, f);
        emit_store_to(c, f, d);
      }
    } else if (d->op == KIR_OP_REDUCE) { /* COL_TILE: the lane's row j_'s accumulator */
      const char *j = c->L.mapping == KIR_CUDA_COL_TILE ? "[j_]" : "";
      fprintf(f, "%sa%d_%s = ", ind, v, j);
      fprintf(f, d->imm == KIR_SUM ? "__fadd_rn(a%d_%s, " : d->imm == KIR_MAX ? "kcu_key_max(a%d_%s, "
                                                                               : "kcu_key_min(a%d_%s, ",
              v, j);
      opnd(c, f, d->arg[0]);
      fputs(");\n", f);
    } else if (c->need[v] && d->loop == l && !is_inline(d)) {
      if (vec && c->vacc[v]) fprintf(f, "%sconst float v%d_ = l%d_[j_];\n", ind, v, v);
      else emit_value(c, f, v, ind);
    }
  }
}

/* A float4-capable loop body at column base cb_: vector loads, the columns
 * cb_ .. cb_ + W_ - 1, vector stores. */
static void emit_lanes(Kc *c, FILE *f, int l, const char *ind) {
  const KirKernel *k = c->k;
  const KirLoop *lp = &k->loops[l];
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (!c->vacc[v]) continue;
    if (d->op == KIR_OP_LOAD) {
      fprintf(f, "%sfloat l%d_[W_];\n%s%s<W_>(l%d_, %s + ", ind, v, ind,
              k->params[d->imm].access == KIR_IN ? "kcu_ldg" : "kcu_ld", v, c->pname[d->imm]);
      index_at(c, f, d->arg[0]);
      fputs(");\n", f);
    } else {
      fprintf(f, "%sfloat s%d_[W_];\n", ind, v);
    }
  }
  char in2[64];
  snprintf(in2, sizeof in2, "%s  ", ind);
  fprintf(f, "#pragma unroll\n%sfor (int j_ = 0; j_ < W_; j_++) {\n", ind);
  if (lp->col != KIR_NONE && c->need[lp->col]) fprintf(f, "%sconst int64_t c%d_ = cb_ + j_;\n", in2, l);
  emit_column(c, f, l, 1, in2);
  fprintf(f, "%s}\n", ind);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (!c->vacc[v] || d->op != KIR_OP_STORE) continue;
    fprintf(f, "%skcu_st<W_>(%s + ", ind, c->pname[d->imm]);
    index_at(c, f, d->arg[0]);
    fprintf(f, ", s%d_);\n", v);
  }
}

static void emit_loop(Kc *c, FILE *f, int l, const char *ind) {
  const KirKernel *k = c->k;
  const KirLoop *lp = &k->loops[l];
  int T = c->L.row_threads;
  /* the preheader: row-level values built while the loop was open */
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_STORE && d->loop < 0) emit_row_point(c, f, v, ind);
  }
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    if (d->imm == KIR_SUM) fprintf(f, "%sfloat a%d_ = 0.0f;\n", ind, v);
    else fprintf(f, "%sint a%d_ = %s;\n", ind, v, d->imm == KIR_MAX ? "KCU_KEY_NEG_INF" : "KCU_KEY_POS_INF");
  }
  before_loop(c, f, l, ind);
  /* E > 0: a ROW_GROUP loop's constant extent that a lane covers in at most
   * KC_UNROLL_PASSES passes of T columns, or of 4 T under float4 (else 0: a
   * loop to the extent) */
  const KirNode *ext = &k->nodes[lp->extent];
  int64_t wide = c->loop_vec[l] ? 4 * (int64_t)T : T;
  int64_t E = ext->op == KIR_OP_ICONST && ext->imm > 0 &&
              (ext->imm + wide - 1) / wide <= KC_UNROLL_PASSES ? ext->imm : 0;
  char in2[64], in3[64];
  snprintf(in2, sizeof in2, "%s  ", ind);
  snprintf(in3, sizeof in3, "%s    ", ind);
  if (c->L.mapping == KIR_CUDA_FLAT) {  /* the kernel frame steps over columns */
    if (c->loop_vec[l]) emit_lanes(c, f, l, ind);
    else emit_column(c, f, l, 0, ind);
    return;
  }
  if (c->L.mapping == KIR_CUDA_THREAD_ROW) {
    fprintf(f, "%sfor (int64_t c%d_ = 0; c%d_ < ", ind, l, l);
    opnd(c, f, lp->extent);
    fprintf(f, "; c%d_++) {\n", l);
    emit_column(c, f, l, 0, in2);
    fprintf(f, "%s}\n", ind);
  } else if (c->loop_vec[l] && E > 0) {
    /* few passes over a constant extent: a trip count the compiler sees (no
     * 64-bit trip arithmetic, no remainder loop), fully unrolled */
    fprintf(f, "%s{\n%sconstexpr int W_ = VEC ? 4 : 1;\n", ind, in2);
    fprintf(f, "%sconstexpr int N_ = (%" PRId64 " + W_ * %d - 1) / (W_ * %d); /* passes a lane "
            "runs at most */\n", in2, E, T, T);
    /* (the single-column fallback's passes may be 4 times as many: by 4 then) */
    fprintf(f, "#pragma unroll (N_ <= %d ? N_ : 4)\n%sfor (int pass_ = 0; pass_ < N_; pass_++) {\n",
            KC_UNROLL_PASSES, in2);
    fprintf(f, "%sconst int64_t cb_ = (int64_t)W_ * lane_ + (int64_t)pass_ * (W_ * %d);\n", in3, T);
    fprintf(f, "%sif (%" PRId64 " %% (W_ * %d) != 0 && cb_ >= %" PRId64 ") break;\n", in3, E, T,
            E);
    emit_lanes(c, f, l, in3);
    fprintf(f, "%s}\n%s}\n", in2, ind);
  } else if (c->loop_vec[l]) {
    fprintf(f, "%s{\n%sconstexpr int W_ = VEC ? 4 : 1;\n", ind, in2);
    fprintf(f, "%sfor (int64_t cb_ = (int64_t)W_ * lane_; cb_ < ", in2);
    opnd(c, f, lp->extent);
    fprintf(f, "; cb_ += (int64_t)W_ * %d) {\n", T);
    emit_lanes(c, f, l, in3);
    fprintf(f, "%s}\n%s}\n", in2, ind);
  } else if (E > 0) {
    fprintf(f, "#pragma unroll\n%sfor (int pass_ = 0; pass_ < %" PRId64 "; pass_++) {\n", ind,
            (E + T - 1) / T);
    fprintf(f, "%sconst int64_t c%d_ = lane_ + (int64_t)pass_ * %d;\n", in2, l, T);
    if (E % T) fprintf(f, "%sif (c%d_ >= %" PRId64 ") break;\n", in2, l, E);
    emit_column(c, f, l, 0, in2);
    fprintf(f, "%s}\n", ind);
  } else {
    fprintf(f, "%sfor (int64_t c%d_ = lane_; c%d_ < ", ind, l, l);
    opnd(c, f, lp->extent);
    fprintf(f, "; c%d_ += %d) {\n", l, T);
    emit_column(c, f, l, 0, in2);
    fprintf(f, "%s}\n", ind);
  }
  /* reductions: row-level values from here on */
  int reduced = 0;
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    reduced = 1;
    if (!grouped(c))
      fprintf(f, d->imm == KIR_SUM ? "%sconst float v%d_ = a%d_;\n"
                                   : "%sconst float v%d_ = kcu_unkey(a%d_);\n",
              ind, v, v);
    else if (d->imm == KIR_SUM)
      fprintf(f, "%sconst float v%d_ = kcu_row_sum<%d>(a%d_, %s);\n", ind, v, T, v,
              T > 32 ? "red_f_" : "nullptr");
    else
      fprintf(f, "%sconst float v%d_ = kcu_unkey(kcu_row_key<%d, %s>(a%d_, %s));\n", ind, v, T,
              d->imm == KIR_MAX ? "true" : "false", v, T > 32 ? "red_k_" : "nullptr");
  }
  /* above one warp, a reduction is a block barrier (kcu_row_sum) */
  if (grouped(c) && reduced && T > 32) {
    size_t np = (size_t)k->nparams + 1;
    memset(c->loaded, 0, np);
    memset(c->stored_all, 0, np);
    memset(c->stored_lead, 0, np);
  }
}

/* The row body, in the CPU lowering's order. */
static void emit_row(Kc *c, FILE *f, const char *ind) {
  const KirKernel *k = c->k;
  KirVal v = 0;
  for (int l = 0; l <= k->nloops; l++) {
    KirVal stop = l < k->nloops ? k->loops[l].first : k->nnodes;
    for (; v < stop; v++) emit_row_point(c, f, v, ind);
    if (l == k->nloops) break;
    emit_loop(c, f, l, ind);
    v = k->loops[l].end;
  }
}

/* ---- split reductions (ROW_SPLIT, COL_TILE) ------------------------------------------ */

/* The body of a ROW_SPLIT kernel (kir_cuda.h): row-level values, the loop
 * over this block's chunk, the block's partials, the split protocol, then
 * the epilogue on one thread per row.  Not grouped(): the loop stores
 * nothing and the epilogue is sequential. */
static void emit_split(Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  const KirCudaLaunch *L = &c->L;
  const KirLoop *lp = &k->loops[0];
  int64_t E = k->nodes[lp->extent].imm;
  int T = L->block_threads;
  const char *ind = "  ", *in2 = "    ", *in3 = "      ";

  /* the frame: which row and which chunk of the loop this block takes */
  if (c->nsum) fputs("  __shared__ float red_f_[8];  /* kcu_row_sum, kcu_split_sum */\n", f);
  if (c->nkey) fputs("  __shared__ int red_k_[8];    /* kcu_row_key, kcu_split_key */\n", f);
  fputs("  __shared__ bool last_;       /* kcu_split_last */\n"
        "  const int lane_ = (int)threadIdx.x;\n",
        f);
  fprintf(f,
          "  const int64_t parts_ = slot_ >= 0 ? %" PRId64 " : 1;  /* blocks per row */\n"
          "  const int64_t r_ = row_begin + (int64_t)blockIdx.x / parts_;\n"
          "  const int64_t part_ = (int64_t)blockIdx.x %% parts_;\n"
          "  const int64_t cbeg_ = part_ * %" PRId64 ";\n"
          "  const int64_t cend_ = parts_ > 1 && cbeg_ + %" PRId64 " < %" PRId64 " ? cbeg_ + %" PRId64
          " : %" PRId64 ";\n",
          L->parts, L->chunk, L->chunk, E, L->chunk, E);

  /* row-level values before the loop and in its preheader (no stores: split_shape) */
  for (KirVal v = 0; v < lp->end; v++)
    if (v < lp->first || k->nodes[v].loop < 0) emit_row_point(c, f, v, ind);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    if (d->imm == KIR_SUM) fprintf(f, "%sfloat a%d_ = 0.0f;\n", ind, v);
    else fprintf(f, "%sint a%d_ = %s;\n", ind, v, d->imm == KIR_MAX ? "KCU_KEY_NEG_INF" : "KCU_KEY_POS_INF");
  }

  /* the loop over this block's chunk */
  if (c->loop_vec[0]) {
    fprintf(f, "%s{\n%sconstexpr int W_ = VEC ? 4 : 1;\n#pragma unroll 4\n", ind, in2);
    fprintf(f, "%sfor (int64_t cb_ = cbeg_ + (int64_t)W_ * lane_; cb_ < cend_; cb_ += (int64_t)W_ * %d) {\n",
            in2, T);
    emit_lanes(c, f, 0, in3);
    fprintf(f, "%s}\n%s}\n", in2, ind);
  } else {
    fprintf(f, "#pragma unroll 4\n%sfor (int64_t c0_ = cbeg_ + lane_; c0_ < cend_; c0_ += %d) {\n", ind, T);
    emit_column(c, f, 0, 0, in2);
    fprintf(f, "%s}\n", ind);
  }

  /* the block's partials */
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    const char *mx = d->imm == KIR_MAX ? "true" : "false";
    if (d->imm == KIR_SUM) fprintf(f, "%sfloat t%d_ = kcu_row_sum<%d>(a%d_, red_f_);\n", ind, v, T, v);
    else fprintf(f, "%sint t%d_ = kcu_row_key<%d, %s>(a%d_, red_k_);\n", ind, v, T, mx, v);
  }

  /* the split: post the partials, the last block combines them in part order */
  fprintf(f,
          "%sif (parts_ > 1) {  /* the row's last block combines the partials */\n"
          "%sfloat *const pp_ = kpart_ + r_ * parts_;  /* [reduction][row][part] */\n"
          "%sif (lane_ == 0) {\n",
          ind, in2, in2);
  int64_t R = kir_kernel_rows(k);
  int j = 0;
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    fprintf(f, "%spp_[", in3);
    if (j) fprintf(f, "%" PRId64 " * parts_ + part_", (int64_t)j * R);
    else fputs("part_", f);
    fprintf(f, d->imm == KIR_SUM ? "] = t%d_;\n" : "] = __int_as_float(t%d_);\n", v);
    j++;
  }
  fprintf(f, "%s}\n%sif (!kcu_split_last(&kcount_[r_], parts_, &last_)) return;\n", in2, in2);
  j = 0;
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    const char *mx = d->imm == KIR_MAX ? "true" : "false";
    char at[64];
    if (j) snprintf(at, sizeof at, "pp_ + %" PRId64 " * parts_", (int64_t)j * R);
    else snprintf(at, sizeof at, "pp_");
    if (d->imm == KIR_SUM) fprintf(f, "%st%d_ = kcu_split_sum<%d>(%s, parts_, red_f_);\n", in2, v, T, at);
    else fprintf(f, "%st%d_ = kcu_split_key<%d, %s>(%s, parts_, red_k_);\n", in2, v, T, mx, at);
    j++;
  }
  fprintf(f, "%s}\n", ind);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    fprintf(f, d->imm == KIR_SUM ? "%sconst float v%d_ = t%d_;\n" : "%sconst float v%d_ = kcu_unkey(t%d_);\n",
            ind, v, v);
  }

  /* the epilogue: one thread per row */
  fprintf(f, "%sif (lane_ == 0) {\n", ind);
  for (KirVal v = lp->end; v < k->nnodes; v++) emit_row_point(c, f, v, in2);
  fprintf(f, "%s}\n", ind);
}

/* Marks in mask the row-level values before the loop's end (lp_end) that v
 * reads, directly or through other such values or through the index math a
 * 4-row load prints inline; not the reductions (values of the loop). */
static void mark_row_args(const Kc *c, KirVal v, KirVal lp_end, unsigned char *mask) {
  const KirNode *d = &c->k->nodes[v];
  for (int i = 0; i < kir_op_nargs[d->op]; i++) {
    KirVal a = d->arg[i];
    const KirNode *e = &c->k->nodes[a];
    if (a >= lp_end || is_inline(e) || e->op == KIR_OP_REDUCE || mask[a]) continue;
    if (e->loop < 0) mask[a] = 1;
    mark_row_args(c, a, lp_end, mask);
  }
}

/* The body of a COL_TILE kernel (kir_cuda.h).  A lane takes V_ consecutive
 * rows of its block's tile (KC_TILE_VEC in the VEC instantiation, else 1),
 * each with an accumulator per reduction: the loop over its slice of the
 * block's chunk, the slices added in slice order (kcu_tile_sum), the split
 * protocol, then each row's epilogue on the lane of slice 0.  Row-level
 * values are emitted in two scopes: where the loop needs them, at the
 * lane's first row (the loop reads the innermost row only through its
 * 4-row loads' indexes: plan_tile_vector), and in the epilogue, at each
 * row.  V_ changes which rows a lane takes, never the order of the sums:
 * both instantiations give the same bits. */
static void emit_tile(Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  const KirCudaLaunch *L = &c->L;
  const KirLoop *lp = &k->loops[0];
  int64_t E = k->nodes[lp->extent].imm, R = kir_kernel_rows(k);
  int split = L->parts > 1;
  size_t n = (size_t)k->nnodes + 1;
  unsigned char *in_loop = xcalloc(n, 1), *in_epi = xcalloc(n, 1);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op == KIR_OP_REDUCE || (d->loop == 0 && c->need[v] && !is_inline(d)))
      mark_row_args(c, v, lp->end, in_loop);
  }
  for (KirVal v = lp->end; v < k->nnodes; v++)
    if (k->nodes[v].op == KIR_OP_STORE || c->need[v]) mark_row_args(c, v, lp->end, in_epi);
  int row_loop = 0, row_epi = 0;
  for (KirVal v = 0; v < lp->end; v++) {
    row_loop |= in_loop[v] && k->nodes[v].op == KIR_OP_ROW;
    row_epi |= in_epi[v] && k->nodes[v].op == KIR_OP_ROW;
  }

  /* the frame: which rows and which chunk of the loop this block takes */
  fprintf(f, "  constexpr int V_ = %s;  /* rows a lane, consecutive */\n",
          L->vector ? "VEC ? 4 : 1" : "1");
  if (c->nsum) fputs("  __shared__ float red_t_[8][32 * V_];  /* kcu_tile_sum */\n", f);
  if (c->nkey) fputs("  __shared__ int red_tk_[8][32 * V_];   /* kcu_tile_key */\n", f);
  if (split) fputs("  __shared__ bool last_;                /* kcu_split_last */\n", f);
  fputs("  const int tx_ = (int)(threadIdx.x % 32);  /* the lane: the tile's rows V_ tx_ .. */\n"
        "  const int ty_ = (int)(threadIdx.x / 32);  /* the loop's slice */\n",
        f);
  if (split)
    fprintf(f,
            "  const int64_t parts_ = slot_ >= 0 ? %" PRId64 " : 1;  /* blocks per tile */\n"
            "  const int64_t chunk_ = slot_ >= 0 ? %" PRId64 " : %" PRId64
            ";  /* loop columns per block */\n",
            L->parts, L->chunk, E);
  fputs("  const int64_t tiles_ = (row_end - row_begin + 32 * V_ - 1) / (32 * V_);\n", f);
  if (split)
    fputs("  for (int64_t b_ = blockIdx.x; b_ < tiles_ * parts_; b_ += gridDim.x) {\n"
          "    const int64_t tile_ = b_ / parts_, part_ = b_ % parts_;\n",
          f);
  else
    fputs("  for (int64_t tile_ = blockIdx.x; tile_ < tiles_; tile_ += gridDim.x) {\n", f);
  fputs("    const int64_t rt_ = row_begin + tile_ * (32 * V_) + (int64_t)tx_ * V_;  /* the lane's first row */\n"
        "    const bool in_ = rt_ < row_end;\n",
        f);
  if (split || row_loop || row_epi)
    fputs("    const int64_t r0_ = in_ ? rt_ : row_end - V_;  /* past the end: copies of the last "
          "rows, storing nothing */\n",
          f);
  if (split)
    fprintf(f,
            "    const int64_t cbeg_ = part_ * chunk_;\n"
            "    const int64_t cend_ = cbeg_ + chunk_ < %" PRId64 " ? cbeg_ + chunk_ : %" PRId64 ";\n",
            E, E);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op == KIR_OP_REDUCE) fprintf(f, "    %s t%d_[V_];\n", d->imm == KIR_SUM ? "float" : "int", v);
  }

  /* the loop's scope: row-level values at the lane's first row, the
   * accumulators, the loop over the slice, the slices' sums */
  fputs("    {\n", f);
  if (row_loop) fputs("      const int64_t r_ = r0_;\n", f);
  for (KirVal v = 0; v < lp->end; v++)
    if (in_loop[v]) emit_row_point(c, f, v, "      ");
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    if (d->imm == KIR_SUM) fprintf(f, "      float a%d_[V_] = {};\n", v);
    else
      fprintf(f, "      int a%d_[V_];\n      for (int j_ = 0; j_ < V_; j_++) a%d_[j_] = %s;\n", v, v,
              d->imm == KIR_MAX ? "KCU_KEY_NEG_INF" : "KCU_KEY_POS_INF");
  }
  fputs("      if (in_) {\n#pragma unroll 4\n", f);
  fprintf(f, "        for (int64_t c0_ = %sty_; c0_ < ", split ? "cbeg_ + " : "");
  if (split) fputs("cend_", f);
  else fprintf(f, "%" PRId64, E);
  fputs("; c0_ += 8) {\n", f);
  for (KirVal v = lp->first; v < lp->end; v++) { /* the lane's rows' elements at once */
    const KirNode *d = &k->nodes[v];
    if (!c->vacc[v]) continue;
    fprintf(f, "          float l%d_[V_];\n          %s<V_>(l%d_, %s + ", v,
            k->params[d->imm].access == KIR_IN ? "kcu_ldg" : "kcu_ld", v, c->pname[d->imm]);
    index_at(c, f, d->arg[0]);
    fputs(");\n", f);
  }
  fputs("#pragma unroll\n          for (int j_ = 0; j_ < V_; j_++) {\n", f);
  emit_column(c, f, 0, 1, "            ");
  fputs("          }\n        }\n      }\n", f);
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    if (d->imm == KIR_SUM) fprintf(f, "      kcu_tile_sum<V_>(a%d_, t%d_, red_t_);\n", v, v);
    else
      fprintf(f, "      kcu_tile_key<%s, V_>(a%d_, t%d_, red_tk_);\n",
              d->imm == KIR_MAX ? "true" : "false", v, v);
  }
  fputs("    }\n", f);

  /* the split: post the partials, the tile's last block combines them in part order */
  if (split) {
    fputs("    if (parts_ > 1) {  /* the tile's last block combines the partials */\n"
          "      float *const pp_ = kpart_ + r0_;  /* [reduction][part][row] */\n"
          "      if (ty_ == 0 && in_)\n"
          "        for (int j_ = 0; j_ < V_; j_++) {\n",
          f);
    int j = 0;
    for (KirVal v = lp->first; v < lp->end; v++) {
      const KirNode *d = &k->nodes[v];
      if (d->op != KIR_OP_REDUCE) continue;
      fputs("          pp_[", f);
      if (j) fprintf(f, "(%d * parts_ + part_) * %" PRId64, j, R);
      else fprintf(f, "part_ * %" PRId64, R);
      fprintf(f, d->imm == KIR_SUM ? " + j_] = t%d_[j_];\n" : " + j_] = __int_as_float(t%d_[j_]);\n", v);
      j++;
    }
    fputs("        }\n      if (!kcu_split_last(&kcount_[tile_], parts_, &last_)) continue;\n", f);
    j = 0;
    for (KirVal v = lp->first; v < lp->end; v++) {
      const KirNode *d = &k->nodes[v];
      if (d->op != KIR_OP_REDUCE) continue;
      char at[64];
      if (j) snprintf(at, sizeof at, "pp_ + %d * parts_ * %" PRId64, j, R);
      else snprintf(at, sizeof at, "pp_");
      if (d->imm == KIR_SUM)
        fprintf(f, "      kcu_tile_split_sum<V_>(%s, parts_, %" PRId64 ", t%d_, red_t_);\n", at, R, v);
      else
        fprintf(f, "      kcu_tile_split_key<%s, V_>(%s, parts_, %" PRId64 ", t%d_, red_tk_);\n",
                d->imm == KIR_MAX ? "true" : "false", at, R, v);
      j++;
    }
    fputs("    }\n", f);
  }

  /* the epilogue: each of the lane's rows on slice 0 */
  fputs("    if (ty_ == 0 && in_) {\n#pragma unroll\n      for (int j_ = 0; j_ < V_; j_++) {\n", f);
  if (row_epi) fputs("        const int64_t r_ = r0_ + j_;\n", f);
  for (KirVal v = 0; v < lp->end; v++)
    if (in_epi[v]) emit_row_point(c, f, v, "        ");
  for (KirVal v = lp->first; v < lp->end; v++) {
    const KirNode *d = &k->nodes[v];
    if (d->op != KIR_OP_REDUCE) continue;
    fprintf(f, d->imm == KIR_SUM ? "        const float v%d_ = t%d_[j_];\n"
                                 : "        const float v%d_ = kcu_unkey(t%d_[j_]);\n",
            v, v);
  }
  for (KirVal v = lp->end; v < k->nnodes; v++) emit_row_point(c, f, v, "        ");
  fputs("      }\n    }\n  }\n", f);
  free(in_loop);
  free(in_epi);
}

static int has_row_node(const Kc *c) {
  for (KirVal v = 0; v < c->k->nnodes; v++)
    if (c->need[v] && c->k->nodes[v].op == KIR_OP_ROW) return 1;
  return 0;
}

/* LOOPS's steps a row of loop l: its extent, in W_ columns where it takes
 * float4 (the kernel's at<l + 1>_ - at<l>_) */
static void loop_steps(const Kc *c, FILE *f, int l) {
  fprintf(f, "%" PRId64 "%s", c->k->nodes[c->k->loops[l].extent].imm, c->loop_vec[l] ? " / W_" : "");
}

/* The body of a LOOPS kernel (kir_cuda.h): a grid-stride loop over the
 * steps of [row_begin, row_end), a row's steps loop 0's, then loop 1's, ...;
 * a step runs its loop's body on its column (cb_ .. cb_ + W_ - 1 under
 * float4) after the row-level values that loop reads, in build order (no
 * reductions, no row-level stores, and no loop stores what another loop or
 * a row-level load reads: every row-level value is the same wherever it is
 * computed). */
static void emit_loops(Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  size_t n = (size_t)k->nnodes + 1;
  unsigned char *mask = xcalloc(n, 1);
  if (c->L.vector) fputs("  constexpr int W_ = VEC ? 4 : 1;\n", f);
  fputs("  /* where each loop's steps start in a row */\n  constexpr int64_t at0_ = 0", f);
  for (int l = 0; l < k->nloops; l++) {
    fprintf(f, ", at%d_ = at%d_ + ", l + 1, l);
    loop_steps(c, f, l);
  }
  fprintf(f, ";\n"
             "  const int64_t end_ = row_end * at%d_;\n"
             "  for (int64_t u_ = row_begin * at%d_ + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; "
             "u_ < end_;\n"
             "       u_ += (int64_t)gridDim.x * blockDim.x) {\n",
          k->nloops, k->nloops);
  if (has_row_node(c)) fprintf(f, "    const int64_t r_ = u_ / at%d_;\n", k->nloops);
  fprintf(f, "    const int64_t q_ = u_ %% at%d_;  /* the step in the row */\n", k->nloops);
  for (int l = 0; l < k->nloops; l++) {
    const KirLoop *lp = &k->loops[l];
    if (l == k->nloops - 1) fputs("    } else {\n", f);
    else fprintf(f, "    %sif (q_ < at%d_) {\n", l ? "} else " : "", l + 1);
    memset(mask, 0, n);
    for (KirVal v = lp->first; v < lp->end; v++) {
      const KirNode *d = &k->nodes[v];
      if (d->loop == l && (d->op == KIR_OP_STORE || (c->need[v] && !is_inline(d))))
        mark_row_args(c, v, lp->end, mask);
    }
    for (KirVal v = 0; v < lp->end; v++)
      if (mask[v]) emit_row_point(c, f, v, "      ");
    if (c->loop_vec[l]) {
      fprintf(f, "      const int64_t cb_ = (q_ - at%d_) * W_;\n", l);
      emit_lanes(c, f, l, "      ");
    } else {
      if (lp->col != KIR_NONE && c->need[lp->col]) fprintf(f, "      const int64_t c%d_ = q_ - at%d_;\n", l, l);
      emit_column(c, f, l, 0, "      ");
    }
  }
  fputs("    }\n  }\n", f);
  free(mask);
}

/* ---- kernels, launchers, the file ------------------------------------------------- */

/* A buffer param's element type: in the kernel (device), or in the launcher
 * and the C header (a bf16 buffer is uint16_t there: C has no bfloat16). */
static const char *elem_type(KirElem e, int device) {
  return e == KIR_F32 || e == KIR_BF16R ? "float"
         : e == KIR_I32                ? "int32_t"
         : device                      ? "__nv_bfloat16"
                                       : "uint16_t";
}

/* The params of the kernel (device 1: with __restrict__) or of its launcher. */
static void params(const Kc *c, FILE *f, int device) {
  const KirKernel *k = c->k;
  for (int i = 0; i < k->nparams; i++) {
    const KirParam *p = &k->params[i];
    if (p->kind == KIR_PARAM_BUF)
      fprintf(f, "%s%s *%s%s, ", p->access == KIR_IN ? "const " : "", elem_type(p->elem, device),
              device ? "__restrict__ " : "", c->pname[i]);
    else
      fprintf(f, "%s %s, ", p->kind == KIR_PARAM_I64 ? "int64_t" : "float", c->pname[i]);
  }
}

/* The comment above a kernel: shapes, mapping, the kernel IR. */
static void comment(const Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  const KirCudaLaunch *L = &c->L;
  fprintf(f, "\n/* ---- %s: rows [", k->name);
  for (int d = 0; d < k->nrows; d++) fprintf(f, "%s%" PRId64, d ? ", " : "", k->rows[d]);
  fprintf(f, "] = %" PRId64 ", %d loop%s", kir_kernel_rows(k), k->nloops, k->nloops == 1 ? "" : "s");
  for (int l = 0; l < k->nloops; l++) {
    const KirNode *e = &k->nodes[k->loops[l].extent];
    if (e->op == KIR_OP_ICONST) fprintf(f, "%s%" PRId64, l ? ", " : " of ", e->imm);
    else fprintf(f, "%srow-dependent", l ? ", " : " of ");
  }
  fputs("\n * mapping: ", f);
  if (L->mapping == KIR_CUDA_FLAT)
    fprintf(f, "flat, one thread per %s, %d-thread blocks",
            L->vector ? "4 columns (1 when unaligned)" : "element",
            L->block_threads);
  else if (L->mapping == KIR_CUDA_THREAD_ROW)
    fprintf(f, "one thread per row (sequential loops), %d-thread blocks", L->block_threads);
  else if (L->mapping == KIR_CUDA_LOOPS)
    fprintf(f, "flat over every loop, one thread per %s of a loop of a row, %d-thread blocks",
            L->vector ? "column (4 where the loop takes float4 and they are aligned)" : "column",
            L->block_threads);
  else if (L->mapping == KIR_CUDA_ROW_SPLIT)
    fprintf(f,
            "split rows, %" PRId64 " blocks of %d threads per row, each over %" PRId64
            " consecutive columns\n *   into a partial (kcu_part_); the row's last block (kcu_split_last) "
            "adds the partials\n *   in part order and runs the epilogue on one thread; "
            "one block per row without a\n *   scratch lane",
            L->parts, L->block_threads, L->chunk);
  else if (L->mapping == KIR_CUDA_COL_TILE && L->parts > 1)
    fprintf(f,
            "column tiles, a %d-thread block per 32 consecutive rows (one per lane: coalesced)\n"
            " *   x 8 slices of the loop, slices added in order; %" PRId64 " blocks per tile, each over "
            "%" PRId64 "\n *   consecutive columns into partials (kcu_part_); the tile's last block "
            "(kcu_split_last)\n *   adds them in part order and runs the epilogue, one thread per row; "
            "unsplit without\n *   a scratch lane",
            L->block_threads, L->parts, L->chunk);
  else if (L->mapping == KIR_CUDA_COL_TILE)
    fprintf(f,
            "column tiles, a %d-thread block per 32 consecutive rows (one per lane: coalesced)\n"
            " *   x 8 slices of the loop, slices added in order, the epilogue one thread per row",
            L->block_threads);
  else if (L->row_threads == 32)
    fprintf(f, "one warp per row, %d rows per %d-thread block", L->block_threads / 32, L->block_threads);
  else
    fprintf(f, "one %d-thread block per row", L->row_threads);
  if (L->vector && L->mapping == KIR_CUDA_COL_TILE) {
    fputs("\n * 4 consecutive rows a lane (one 4-element load) when the rows start and end at a\n"
          " * multiple of 4 and these are 16-byte aligned:", f);
    for (int i = 0; i < k->nparams; i++)
      if (c->vbuf[i]) fprintf(f, " %s", c->pname[i]);
  } else if (L->vector) {
    fputs("\n * float4 when these are 16-byte aligned:", f);
    for (int i = 0; i < k->nparams; i++)
      if (c->vbuf[i]) fprintf(f, " %s", c->pname[i]);
  }
  if (c->nsync) fprintf(f, "\n * %d group barrier%s for memory order", c->nsync, c->nsync == 1 ? "" : "s");
  fputs("\n *\n", f);
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  if (m) {
    kir_print_kernel(m, k);
    fclose(m);
  }
  for (char *p = text, *nl; p && *p; p = nl + 1) {
    nl = strchr(p, '\n');
    if (!nl) nl = p + strlen(p) - 1;
    fprintf(f, " *   %.*s\n", (int)(nl - p), p);
  }
  free(text);
  fputs(" */\n", f);
}

/* A COL_TILE launcher's tiles: of 32 rows, or of 32 KC_TILE_VEC rows where
 * the VEC instantiation runs (vec_) */
static const char *tiles_expr(const Kc *c) {
  return c->L.vector ? "(row_end - row_begin + (vec_ ? 127 : 31)) / (vec_ ? 128 : 32)"
                     : "(row_end - row_begin + 31) / 32";
}

/* grid_ of a launcher without a split scratch (vec_ decided before, where the
 * kernel has a float4 instantiation) */
static void emit_grid(const Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  const KirCudaLaunch *L = &c->L;
  int T = L->row_threads, B = L->block_threads;
  if (L->mapping == KIR_CUDA_FLAT) {
    int64_t e = k->nodes[k->loops[0].extent].imm;
    if (L->vector)
      fprintf(f, "  const unsigned grid_ = kcu_grid((row_end - row_begin) * (vec_ ? %" PRId64
                 " : %" PRId64 "), %d);\n", e / 4, e, B);
    else
      fprintf(f, "  const unsigned grid_ = kcu_grid((row_end - row_begin) * %" PRId64 ", %d);\n", e, B);
  } else if (L->mapping == KIR_CUDA_COL_TILE) {
    fprintf(f, "  const unsigned grid_ = kcu_grid(%s, 1);\n", tiles_expr(c));
  } else if (L->mapping == KIR_CUDA_LOOPS) { /* a row's steps: every loop's (the kernel's at<nloops>_) */
    int64_t steps = 0, steps4 = 0;
    for (int l = 0; l < k->nloops; l++) {
      int64_t e = k->nodes[k->loops[l].extent].imm;
      steps += e;
      steps4 += c->loop_vec[l] ? e / 4 : e;
    }
    if (L->vector)
      fprintf(f, "  const unsigned grid_ = kcu_grid((row_end - row_begin) * (vec_ ? %" PRId64 " : %" PRId64
                 "), %d);\n", steps4, steps, B);
    else
      fprintf(f, "  const unsigned grid_ = kcu_grid((row_end - row_begin) * %" PRId64 ", %d);\n", steps, B);
  } else {
    fprintf(f, "  const unsigned grid_ = kcu_grid(row_end - row_begin, %d);\n",
            L->mapping == KIR_CUDA_ROW_GROUP ? B / T : B);
  }
}

/* The VEC instantiation's condition on the rows, after the buffers'
 * alignment: COL_TILE's lanes take KC_TILE_VEC rows from a multiple of it
 * on, all inside the range. */
static const char *vec_rows(const Kc *c) {
  return c->L.mapping == KIR_CUDA_COL_TILE ? " && row_begin % 4 == 0 && row_end % 4 == 0" : "";
}

/* Whether k planned as L reduces through the split scratch (kcu_part_). */
static int uses_scratch(const KirCudaLaunch *L) {
  return L->mapping == KIR_CUDA_ROW_SPLIT || (L->mapping == KIR_CUDA_COL_TILE && L->parts > 1);
}

/* A split launch's share of its lane (uses_scratch): the partials
 * ([reduction][row][part] or [reduction][part][row]) and the block counters
 * (one a row, ROW_SPLIT; one a tile of 32 rows, COL_TILE) of k's rows.  A
 * batched launch gives instance j the j-th such share (kpart_, kcount_). */
static void scratch_share(const KirKernel *k, const KirCudaLaunch *L, int64_t *parts,
                          int64_t *counts) {
  int64_t R = kir_kernel_rows(k), nred = 0;
  const KirLoop *lp = &k->loops[0];
  for (KirVal v = lp->first; v < lp->end; v++) nred += k->nodes[v].op == KIR_OP_REDUCE;
  *parts = nred * L->parts * R;
  *counts = L->mapping == KIR_CUDA_ROW_SPLIT ? R : (R + 31) / 32;
}

/* kir_cuda_multi_max of k planned as L: the instances whose pointers fit the
 * parameter space and, with a split scratch, whose shares fit a lane */
static int multi_max(const KirKernel *k, const KirCudaLaunch *L) {
  int64_t n = KIR_CUDA_MULTI_BYTES / (8 * (k->nparams ? k->nparams : 1));
  if (n > KIR_CUDA_MULTI_MAX) n = KIR_CUDA_MULTI_MAX;
  if (uses_scratch(L)) {
    int64_t parts, counts;
    scratch_share(k, L, &parts, &counts);
    if (KC_LANE_PARTS / parts < n) n = KC_LANE_PARTS / parts;
    if (KC_LANE_COUNTS / counts < n) n = KC_LANE_COUNTS / counts;
    if (n < 2) n = 0; /* a batch of one is no batch */
  }
  return (int)n;
}

int kir_cuda_multi_max(const KirKernel *k) {
  KirCudaLaunch L;
  kir_cuda_plan(k, &L);
  return multi_max(k, &L);
}

/* NAME_multi: the kernel's body once more, its params now locals read from
 * instance blockIdx.y's entries of NAME_multi_t (kernels_cuda.h), passed by
 * value (kernel parameter space: KIR_CUDA_MULTI_BYTES at most). */
static void emit_multi_kernel(const Kc *c, FILE *f, const char *body) {
  const KirKernel *k = c->k;
  fprintf(f, "\n/* %s_multi: up to %d instances of %s in one launch, instance blockIdx.y\n"
             " * with the arguments at that index of each array of %s_multi_t */\n",
          k->name, multi_max(k, &c->L), k->name, k->name);
  if (c->L.vector) fputs("template <bool VEC>\n", f);
  fprintf(f, "__global__ void __launch_bounds__(%d) %s_multi(const %s_multi_t a_, int64_t row_begin, "
             "int64_t row_end%s) {\n", c->L.block_threads, k->name, k->name,
          uses_scratch(&c->L) ? ", int slot_" : "");
  if (uses_scratch(&c->L)) { /* instance blockIdx.y's share of the lane */
    int64_t parts, counts;
    scratch_share(k, &c->L, &parts, &counts);
    fprintf(f, "  float *const kpart_ = kcu_part_[slot_] + (int64_t)blockIdx.y * %" PRId64 ";\n"
               "  unsigned *const kcount_ = kcu_count_[slot_] + blockIdx.y * %" PRId64 ";\n",
            parts, counts);
  }
  for (int i = 0; i < k->nparams; i++) {
    const KirParam *p = &k->params[i];
    const char *cst = p->access == KIR_IN ? "const " : "";
    if (p->kind == KIR_PARAM_BUF && p->elem == KIR_BF16) /* uint16_t in the struct */
      fprintf(f, "  %s__nv_bfloat16 *__restrict__ const %s = (%s__nv_bfloat16 *)a_.%s[blockIdx.y];\n",
              cst, c->pname[i], cst, c->pname[i]);
    else if (p->kind == KIR_PARAM_BUF)
      fprintf(f, "  %s%s *__restrict__ const %s = a_.%s[blockIdx.y];\n", cst,
              elem_type(p->elem, 1), c->pname[i], c->pname[i]);
    else
      fprintf(f, "  const %s %s = a_.%s[blockIdx.y];\n",
              p->kind == KIR_PARAM_I64 ? "int64_t" : "float", c->pname[i], c->pname[i]);
  }
  fputs(body, f);
  fputs("}\n", f);
}

/* In NAME_multi_launch, the end of a block the caller opened: NAME_launch of
 * each instance, then return. */
static void emit_launch_each(const Kc *c, FILE *f) {
  fprintf(f, "    for (int i_ = 0; i_ < count; i_++)\n      %s_launch(", c->k->name);
  for (int i = 0; i < c->k->nparams; i++) fprintf(f, "a->%s[i_], ", c->pname[i]);
  fputs("row_begin, row_end, stream);\n    return;\n  }\n", f);
}

/* grid_ of a launcher with a split scratch (uses_scratch), its lane slot_
 * taken before (-1: unsplit, a block a row or grid-stride tiles) */
static void emit_split_grid(const Kc *c, FILE *f) {
  if (c->L.mapping == KIR_CUDA_ROW_SPLIT)
    fprintf(f, "  const unsigned grid_ = (unsigned)((row_end - row_begin) * (slot_ >= 0 ? %" PRId64
               " : 1));\n", c->L.parts);
  else
    fprintf(f, "  const int64_t tiles_ = %s;\n"
               "  const unsigned grid_ = slot_ >= 0 ? (unsigned)(tiles_ * %" PRId64
               ") : kcu_grid(tiles_, 1);\n", tiles_expr(c), c->L.parts);
}

/* NAME_multi_launch: count instances (1 .. the max) of the same rows */
static void emit_multi_launcher(const Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  int B = c->L.block_threads;
  fprintf(f, "\nextern \"C\" void %s_multi_launch(const %s_multi_t *a, int count, int64_t row_begin, "
             "int64_t row_end, cudaStream_t stream) {\n"
             "  if (row_begin >= row_end || count < 1) return;\n", k->name, k->name);
  if (c->L.vector) { /* float4 in all instances or in none: NAME_launch's bits */
    fputs("  int nvec_ = 0;\n  for (int i_ = 0; i_ < count; i_++)\n    nvec_ +=", f);
    const char *sep = " ";
    for (int i = 0; i < k->nparams; i++)
      if (c->vbuf[i]) fprintf(f, "%skcu_aligned16(a->%s[i_])", sep, c->pname[i]), sep = " && ";
    fputs(";\n  if (nvec_ != 0 && nvec_ != count) { /* mixed: one launch each */\n", f);
    emit_launch_each(c, f);
    fprintf(f, "  const bool vec_ = nvec_ == count%s;\n", vec_rows(c));
  }
  const char *tail = "";
  if (!uses_scratch(&c->L)) {
    emit_grid(c, f);
  } else { /* a lane for the batch, else a launch each, unsplit as NAME_launch runs then */
    fputs("  const int slot_ = kcu_lane(stream);  /* the stream's split scratch */\n"
          "  if (slot_ < 0) {\n", f);
    emit_launch_each(c, f);
    emit_split_grid(c, f);
    tail = ", slot_";
  }
  fputs("  const dim3 grid2_(grid_, (unsigned)count);\n", f);
  if (c->L.vector) {
    fprintf(f, "  if (vec_)\n    %s_multi<true><<<grid2_, %d, 0, stream>>>(*a, row_begin, row_end%s);\n",
            k->name, B, tail);
    fprintf(f, "  else\n    %s_multi<false><<<grid2_, %d, 0, stream>>>(*a, row_begin, row_end%s);\n",
            k->name, B, tail);
  } else {
    fprintf(f, "  %s_multi<<<grid2_, %d, 0, stream>>>(*a, row_begin, row_end%s);\n", k->name, B, tail);
  }
  fputs("}\n", f);
}

static void emit_kernel(Kc *c, FILE *f) {
  const KirKernel *k = c->k;
  const KirCudaLaunch *L = &c->L;
  int T = L->row_threads, B = L->block_threads;
  /* the body first (into memory): the comment reports its barriers */
  char *body = NULL;
  size_t blen = 0;
  FILE *bf = open_memstream(&body, &blen);
  if (!bf) {
    fprintf(stderr, "parc: out of memory\n");
    exit(3);
  }
  c->nsync = 0;
  int slot = uses_scratch(L);
  if (L->mapping == KIR_CUDA_ROW_SPLIT) {
    emit_split(c, bf);
  } else if (L->mapping == KIR_CUDA_COL_TILE) {
    emit_tile(c, bf);
  } else if (L->mapping == KIR_CUDA_LOOPS) {
    emit_loops(c, bf);
  } else if (L->mapping == KIR_CUDA_FLAT) {
    const KirNode *e = &k->nodes[k->loops[0].extent];
    if (L->vector) fputs("  constexpr int W_ = VEC ? 4 : 1;\n", bf);
    fprintf(bf, "  constexpr int64_t per_row_ = %" PRId64 "%s;  /* steps per row */\n", e->imm,
            L->vector ? " / W_" : "");
    fputs("  const int64_t end_ = row_end * per_row_;\n"
          "  for (int64_t u_ = row_begin * per_row_ + (int64_t)blockIdx.x * blockDim.x + "
          "threadIdx.x; u_ < end_;\n"
          "       u_ += (int64_t)gridDim.x * blockDim.x) {\n",
          bf);
    if (has_row_node(c)) fputs("    const int64_t r_ = u_ / per_row_;\n", bf);
    const KirLoop *lp = &k->loops[0];
    if (L->vector) fputs("    const int64_t cb_ = u_ % per_row_ * W_;\n", bf);
    else if (lp->col != KIR_NONE && c->need[lp->col]) fputs("    const int64_t c0_ = u_ % per_row_;\n", bf);
    emit_row(c, bf, "    ");
    fputs("  }\n", bf);
  } else if (L->mapping == KIR_CUDA_THREAD_ROW) {
    fputs("  for (int64_t r_ = row_begin + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; "
          "r_ < row_end;\n"
          "       r_ += (int64_t)gridDim.x * blockDim.x) {\n",
          bf);
    emit_row(c, bf, "    ");
    fputs("  }\n", bf);
  } else if (T == 32) {
    fprintf(bf,
            "  const int lane_ = (int)(threadIdx.x %% 32);\n"
            "  for (int64_t r_ = row_begin + (int64_t)blockIdx.x * %d + threadIdx.x / 32; "
            "r_ < row_end;\n"
            "       r_ += (int64_t)gridDim.x * %d) {\n",
            B / 32, B / 32);
    emit_row(c, bf, "    ");
    fputs("  }\n", bf);
  } else {
    if (c->nsum) fprintf(bf, "  __shared__ float red_f_[%d];  /* kcu_row_sum */\n", T / 32);
    if (c->nkey) fprintf(bf, "  __shared__ int red_k_[%d];    /* kcu_row_key */\n", T / 32);
    fputs("  const int lane_ = (int)threadIdx.x;\n"
          "  for (int64_t r_ = row_begin + blockIdx.x; r_ < row_end; r_ += gridDim.x) {\n",
          bf);
    emit_row(c, bf, "    ");
    fputs("  }\n", bf);
  }
  fclose(bf);

  comment(c, f);
  if (L->vector) fputs("template <bool VEC>\n", f);
  fprintf(f, "__global__ void __launch_bounds__(%d) %s(", B, k->name);
  params(c, f, 1);
  fputs(slot ? "int64_t row_begin, int64_t row_end, int slot_) {\n" : "int64_t row_begin, int64_t row_end) {\n", f);
  if (slot) /* the lane's scratch (slot_ -1: unsplit, parts_ 1, never touched) */
    fputs("  float *const kpart_ = kcu_part_[slot_ >= 0 ? slot_ : 0];\n"
          "  unsigned *const kcount_ = kcu_count_[slot_ >= 0 ? slot_ : 0];\n", f);
  fputs(body, f);
  fputs("}\n", f);
  if (c->multi) emit_multi_kernel(c, f, body);
  free(body);

  /* the launcher */
  fprintf(f, "\nextern \"C\" void %s_launch(", k->name);
  params(c, f, 0);
  fputs("int64_t row_begin, int64_t row_end, cudaStream_t stream) {\n"
        "  if (row_begin >= row_end) return;\n",
        f);
  if (L->vector) {
    fputs("  const bool vec_ =", f);
    const char *sep = " ";
    for (int i = 0; i < k->nparams; i++)
      if (c->vbuf[i]) fprintf(f, "%skcu_aligned16(%s)", sep, c->pname[i]), sep = " && ";
    fprintf(f, "%s;\n", vec_rows(c));
  }
  if (!slot) {
    emit_grid(c, f);
  } else {
    fputs("  const int slot_ = kcu_lane(stream);  /* the stream's split scratch; -1: unsplit */\n", f);
    emit_split_grid(c, f);
  }
  char args[4096];
  size_t at = 0;
  for (int i = 0; i < k->nparams && at < sizeof args; i++) {
    const KirParam *p = &k->params[i];
    int bits = p->kind == KIR_PARAM_BUF && p->elem == KIR_BF16; /* uint16_t to the type */
    int w = snprintf(args + at, sizeof args - at, bits ? "(%s__nv_bfloat16 *)%s, " : "%.0s%s, ",
                     p->access == KIR_IN ? "const " : "", c->pname[i]);
    if (w > 0) at += (size_t)w;
  }
  if (at >= sizeof args) at = sizeof args - 1;
  args[at] = 0;
  const char *tail = slot ? "row_begin, row_end, slot_" : "row_begin, row_end";
  if (L->vector) {
    fprintf(f, "  if (vec_)\n    %s<true><<<grid_, %d, 0, stream>>>(%s%s);\n", k->name, B, args, tail);
    fprintf(f, "  else\n    %s<false><<<grid_, %d, 0, stream>>>(%s%s);\n", k->name, B, args, tail);
  } else {
    fprintf(f, "  %s<<<grid_, %d, 0, stream>>>(%s%s);\n", k->name, B, args, tail);
  }
  fputs("}\n", f);
  if (c->multi) emit_multi_launcher(c, f);
}

/* Device helpers: the numerics of kir_math.c and kir_llvm.c (kir_cuda.h,
 * "Numerics"); constants are written as double literals cast to float,
 * the same rounding as LLVMConstReal on the CPU side. */
static const char prelude[] =
    "#include <cstdint>\n"
    "#include <cuda_runtime.h>\n"
    "\n"
    "/* ---- helpers: the numerics of parc's CPU kernels (codegen/kir_math.c) ---- */\n"
    "\n"
    "#define KCU_KEY_NEG_INF (-2139095041) /* kcu_key(-inf) */\n"
    "#define KCU_KEY_POS_INF 2139095040    /* kcu_key(+inf) */\n"
    "#define KCU_GRID_MAX 1048576          /* blocks per launch; kernels grid-stride */\n"
    "\n"
    "/* Order key: signed int order is float order, -0 just below +0; an involution. */\n"
    "__device__ __forceinline__ int kcu_key(float x) {\n"
    "  const int u = __float_as_int(x);\n"
    "  return u ^ ((u >> 31) & 0x7fffffff);\n"
    "}\n"
    "__device__ __forceinline__ float kcu_unkey(int k) {\n"
    "  return __int_as_float(k ^ ((k >> 31) & 0x7fffffff));\n"
    "}\n"
    "/* NaN takes the key that wins, so it propagates through max and min. */\n"
    "__device__ __forceinline__ int kcu_key_max(int acc, float x) {\n"
    "  const int k = x != x ? 2147483647 : kcu_key(x);\n"
    "  return k > acc ? k : acc;\n"
    "}\n"
    "__device__ __forceinline__ int kcu_key_min(int acc, float x) {\n"
    "  const int k = x != x ? -2147483647 - 1 : kcu_key(x);\n"
    "  return k < acc ? k : acc;\n"
    "}\n"
    "/* a if it wins or is NaN, else b */\n"
    "__device__ __forceinline__ float kcu_fmax(float a, float b) { return a > b || a != a ? a : b; }\n"
    "__device__ __forceinline__ float kcu_fmin(float a, float b) { return a < b || a != a ? a : b; }\n"
    "__device__ __forceinline__ float kcu_rsqrt(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }\n"
    "\n"
    "/* 2^k for k in [-126, 127] */\n"
    "__device__ __forceinline__ float kcu_pow2(int k) { return __int_as_float((k + 127) << 23); }\n"
    "\n"
    "/* k = round(x / ln2), returns x - k ln2 (Cody-Waite); |x| < 2^22 ln2 */\n"
    "__device__ __forceinline__ float kcu_reduce_ln2(float x, int *k) {\n"
    "  const float t = fmaf(x, (float)1.44269504088896340736, 12582912.0f);\n"
    "  const float kf = __fsub_rn(t, 12582912.0f);\n"
    "  *k = (int)kf;\n"
    "  const float r = fmaf(kf, (float)-0.693145751953125, x);\n"
    "  return fmaf(kf, (float)-1.42860682030941723212e-6, r);\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float kcu_exp(float x) {\n"
    "  float xc = x < -104.0f || x != x ? -104.0f : x; /* NaN is put back last */\n"
    "  xc = xc > (float)88.8 ? (float)88.8 : xc;\n"
    "  int k;\n"
    "  const float r = kcu_reduce_ln2(xc, &k);\n"
    "  float p = (float)(1 / 5040.0);\n"
    "  p = fmaf(p, r, (float)(1 / 720.0));\n"
    "  p = fmaf(p, r, (float)(1 / 120.0));\n"
    "  p = fmaf(p, r, (float)(1 / 24.0));\n"
    "  p = fmaf(p, r, (float)(1 / 6.0));\n"
    "  p = fmaf(p, r, 0.5f);\n"
    "  p = fmaf(p, r, 1.0f);\n"
    "  p = fmaf(p, r, 1.0f);\n"
    "  const int k1 = k >> 1, k2 = k - k1; /* k in [-150, 128]: two normal factors */\n"
    "  const float y = __fmul_rn(__fmul_rn(p, kcu_pow2(k1)), kcu_pow2(k2));\n"
    "  return x != x ? x : y;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float kcu_log(float x) {\n"
    "  const bool tiny = x < __int_as_float(0x00800000); /* denormals: scale up first */\n"
    "  const float xs = tiny ? __fmul_rn(x, 8388608.0f) : x;\n"
    "  const int bits = __float_as_int(xs);\n"
    "  int e = (int)((unsigned)bits >> 23) - 127 + (tiny ? -23 : 0);\n"
    "  float m = __int_as_float((bits & 0x7fffff) | 0x3f800000); /* [1, 2) */\n"
    "  const bool big = m > (float)1.41421356237309504880;\n"
    "  m = big ? __fmul_rn(m, 0.5f) : m;\n"
    "  e = big ? e + 1 : e;\n"
    "  const float f = __fsub_rn(m, 1.0f);\n"
    "  const float s = __fdiv_rn(f, __fadd_rn(f, 2.0f));\n"
    "  const float z = __fmul_rn(s, s);\n"
    "  float R = (float)(2 / 9.0);\n"
    "  R = fmaf(R, z, (float)(2 / 7.0));\n"
    "  R = fmaf(R, z, (float)(2 / 5.0));\n"
    "  R = fmaf(R, z, (float)(2 / 3.0));\n"
    "  R = __fmul_rn(z, R);\n"
    "  const float l1p = __fsub_rn(f, __fmul_rn(s, __fsub_rn(f, R)));\n"
    "  const float ef = __int2float_rn(e);\n"
    "  float y = fmaf(ef, (float)0.693145751953125, fmaf(ef, (float)1.42860682030941723212e-6, l1p));\n"
    "  y = x == __int_as_float(0x7f800000) ? x : y;\n"
    "  y = x == 0.0f ? __int_as_float(0xff800000) : y;\n"
    "  return x < 0.0f || x != x ? __int_as_float(0x7fc00000) : y;\n"
    "}\n"
    "\n"
    "__device__ __forceinline__ float kcu_tanh(float x) {\n"
    "  float y = __fmul_rn(fabsf(x), 2.0f);\n"
    "  y = y > 20.0f || y != y ? 20.0f : y; /* tanh(10) rounds to 1 */\n"
    "  int k;\n"
    "  const float r = kcu_reduce_ln2(y, &k);\n"
    "  float q = (float)(1 / 40320.0);\n"
    "  q = fmaf(q, r, (float)(1 / 5040.0));\n"
    "  q = fmaf(q, r, (float)(1 / 720.0));\n"
    "  q = fmaf(q, r, (float)(1 / 120.0));\n"
    "  q = fmaf(q, r, (float)(1 / 24.0));\n"
    "  q = fmaf(q, r, (float)(1 / 6.0));\n"
    "  q = fmaf(q, r, 0.5f);\n"
    "  q = fmaf(__fmul_rn(r, r), q, r); /* expm1(r) */\n"
    "  const float s = kcu_pow2(k);    /* k in [0, 29] */\n"
    "  const float m = fmaf(s, q, __fsub_rn(s, 1.0f)); /* expm1(2|x|) */\n"
    "  const float t = __fdiv_rn(m, __fadd_rn(m, 2.0f));\n"
    "  return x != x ? x : copysignf(t, x);\n"
    "}\n"
    "\n"
    "/* W consecutive floats; W = 4 needs p 16-byte aligned.  ldg: read-only\n"
    "   for the whole kernel (a KIR_IN buffer). */\n"
    "template <int W> __device__ __forceinline__ void kcu_ld(float (&v)[W], const float *p);\n"
    "template <> __device__ __forceinline__ void kcu_ld<1>(float (&v)[1], const float *p) { v[0] = *p; }\n"
    "template <> __device__ __forceinline__ void kcu_ld<4>(float (&v)[4], const float *p) {\n"
    "  const float4 t = *reinterpret_cast<const float4 *>(p);\n"
    "  v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;\n"
    "}\n"
    "template <int W> __device__ __forceinline__ void kcu_ldg(float (&v)[W], const float *p);\n"
    "template <> __device__ __forceinline__ void kcu_ldg<1>(float (&v)[1], const float *p) { v[0] = __ldg(p); }\n"
    "template <> __device__ __forceinline__ void kcu_ldg<4>(float (&v)[4], const float *p) {\n"
    "  const float4 t = __ldg(reinterpret_cast<const float4 *>(p));\n"
    "  v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;\n"
    "}\n"
    "template <int W> __device__ __forceinline__ void kcu_st(float *p, const float (&v)[W]);\n"
    "template <> __device__ __forceinline__ void kcu_st<1>(float *p, const float (&v)[1]) { *p = v[0]; }\n"
    "template <> __device__ __forceinline__ void kcu_st<4>(float *p, const float (&v)[4]) {\n"
    "  *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);\n"
    "}\n"
    "\n"
    "/* Row reductions over a group of T threads (one warp, or a block of T):\n"
    "   an xor butterfly (every lane ends with the same bits), then, above one\n"
    "   warp, the warps' partials through sh in a fixed order.  The leading\n"
    "   barrier keeps a previous reduction's readers ahead of the writes. */\n"
    "template <int T> __device__ __forceinline__ float kcu_row_sum(float v, float *sh) {\n"
    "#pragma unroll\n"
    "  for (int m = 16; m > 0; m >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, m));\n"
    "  if constexpr (T > 32) {\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;\n"
    "    __syncthreads();\n"
    "    v = sh[0];\n"
    "#pragma unroll\n"
    "    for (int w = 1; w < T / 32; w++) v = __fadd_rn(v, sh[w]);\n"
    "  }\n"
    "  return v;\n"
    "}\n"
    "template <int T, bool MAX> __device__ __forceinline__ int kcu_row_key(int v, int *sh) {\n"
    "#pragma unroll\n"
    "  for (int m = 16; m > 0; m >>= 1) {\n"
    "    const int o = __shfl_xor_sync(0xffffffffu, v, m);\n"
    "    v = MAX ? (o > v ? o : v) : (o < v ? o : v);\n"
    "  }\n"
    "  if constexpr (T > 32) {\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;\n"
    "    __syncthreads();\n"
    "    v = sh[0];\n"
    "#pragma unroll\n"
    "    for (int w = 1; w < T / 32; w++) v = MAX ? (sh[w] > v ? sh[w] : v) : (sh[w] < v ? sh[w] : v);\n"
    "  }\n"
    "  return v;\n"
    "}\n"
    "\n"
    "inline unsigned kcu_grid(int64_t units, int64_t per_block) {\n"
    "  const int64_t g = (units + per_block - 1) / per_block;\n"
    "  return (unsigned)(g < KCU_GRID_MAX ? g : KCU_GRID_MAX);\n"
    "}\n"
    "inline bool kcu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }\n";

/* Buffers stored as bf16, or f32 rounded to bf16 values (kir.h: KIR_BF16,
 * KIR_BF16R; codegen/cuda_store.h).  Written when a kernel has one. */
static const char bf16_prelude[] =
    "\n"
    "#include <cuda_bf16.h>\n"
    "\n"
    "/* ---- bf16 buffers: W consecutive elements as floats (W = 4: 8-byte aligned) ----\n"
    "   Four elements move as one 8-byte word (one load or store instruction, where\n"
    "   a struct of two __nv_bfloat162 compiles to two): element j is bits\n"
    "   [16 j, 16 j + 16) of it (little-endian), and a bf16's f32 value is its bits\n"
    "   in the high half of a word (widening is exact). */\n"
    "__device__ __forceinline__ void kcu_bf16x4_widen(float (&v)[4], unsigned long long t) {\n"
    "  const unsigned lo = (unsigned)t, hi = (unsigned)(t >> 32);\n"
    "  v[0] = __uint_as_float(lo << 16), v[1] = __uint_as_float(lo & 0xffff0000u);\n"
    "  v[2] = __uint_as_float(hi << 16), v[3] = __uint_as_float(hi & 0xffff0000u);\n"
    "}\n"
    "template <int W> __device__ __forceinline__ void kcu_ld(float (&v)[W], const __nv_bfloat16 *p);\n"
    "template <> __device__ __forceinline__ void kcu_ld<1>(float (&v)[1], const __nv_bfloat16 *p) {\n"
    "  v[0] = __bfloat162float(*p);\n"
    "}\n"
    "template <> __device__ __forceinline__ void kcu_ld<4>(float (&v)[4], const __nv_bfloat16 *p) {\n"
    "  kcu_bf16x4_widen(v, *reinterpret_cast<const unsigned long long *>(p));\n"
    "}\n"
    "template <int W> __device__ __forceinline__ void kcu_ldg(float (&v)[W], const __nv_bfloat16 *p);\n"
    "template <> __device__ __forceinline__ void kcu_ldg<1>(float (&v)[1], const __nv_bfloat16 *p) {\n"
    "  kcu_ld<1>(v, p);\n"
    "}\n"
    "template <> __device__ __forceinline__ void kcu_ldg<4>(float (&v)[4], const __nv_bfloat16 *p) {\n"
    "  kcu_bf16x4_widen(v, __ldg(reinterpret_cast<const unsigned long long *>(p)));\n"
    "}\n"
    "/* stores round to nearest even, as __float2bfloat16_rn */\n"
    "__device__ __forceinline__ unsigned long long kcu_bf16_bits(float x) {\n"
    "  const __nv_bfloat16 b = __float2bfloat16_rn(x);\n"
    "  unsigned short u;\n"
    "  memcpy(&u, &b, sizeof u);\n"
    "  return u;\n"
    "}\n"
    "template <int W> __device__ __forceinline__ void kcu_st(__nv_bfloat16 *p, const float (&v)[W]);\n"
    "template <> __device__ __forceinline__ void kcu_st<1>(__nv_bfloat16 *p, const float (&v)[1]) {\n"
    "  *p = __float2bfloat16_rn(v[0]);\n"
    "}\n"
    "template <> __device__ __forceinline__ void kcu_st<4>(__nv_bfloat16 *p, const float (&v)[4]) {\n"
    "  *reinterpret_cast<unsigned long long *>(p) = kcu_bf16_bits(v[0]) | kcu_bf16_bits(v[1]) << 16 |\n"
    "                                               kcu_bf16_bits(v[2]) << 32 | kcu_bf16_bits(v[3]) << 48;\n"
    "}\n"
    "/* the f32 value of x rounded to bf16 (a KIR_BF16R buffer's stores) */\n"
    "__device__ __forceinline__ float kcu_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }\n";

/* Split reductions (ROW_SPLIT, and COL_TILE with parts > 1; kir_cuda.h):
 * the scratch, its lanes, the last-block protocol and the fixed-order
 * combines.  Written when a kernel uses them. */
static const char split_prelude[] =
    "\n"
    "/* ---- split reductions: a row's loop over several blocks (ROW_SPLIT, COL_TILE) ---- */\n"
    "\n"
    "#include <mutex>\n"
    "\n"
    "#define KCU_LANES 16          /* streams with scratch of their own (kcu_lane) */\n"
    "#define KCU_LANE_PARTS 65536  /* partials per lane (KC_LANE_PARTS) */\n"
    "#define KCU_LANE_COUNTS 1024  /* block counters per lane */\n"
    "\n"
    "/* A block posts its partials to kcu_part_[lane] and counts itself in\n"
    "   kcu_count_[lane]; the kernels of one stream run one after another, and\n"
    "   every counter is back at 0 when its kernel ends (the last block resets it). */\n"
    "static __device__ float kcu_part_[KCU_LANES][KCU_LANE_PARTS];\n"
    "static __device__ unsigned kcu_count_[KCU_LANES][KCU_LANE_COUNTS];\n"
    "\n"
    "/* The scratch lane of stream s: the first KCU_LANES streams to ask get one\n"
    "   each, for good (ranks as threads sharing a GPU each have their stream);\n"
    "   -1 after that, and the caller runs the kernel unsplit. */\n"
    "static int kcu_lane(cudaStream_t s) {\n"
    "  static std::mutex mu;\n"
    "  static cudaStream_t owner[KCU_LANES];\n"
    "  static int n = 0;\n"
    "  thread_local cudaStream_t last_s = nullptr;\n"
    "  thread_local int last_l = -2;\n"
    "  if (last_l != -2 && last_s == s) return last_l;\n"
    "  int l = -1;\n"
    "  {\n"
    "    std::lock_guard<std::mutex> g(mu);\n"
    "    for (int i = 0; i < n; i++)\n"
    "      if (owner[i] == s) l = i;\n"
    "    if (l < 0 && n < KCU_LANES) owner[l = n++] = s;\n"
    "  }\n"
    "  last_s = s;\n"
    "  last_l = l;\n"
    "  return l;\n"
    "}\n"
    "\n"
    "/* Called by every thread of the block once it posted its partials (from any\n"
    "   of its threads): true in the last of the `parts` blocks counted in *count,\n"
    "   which may then read every block's partials (with __ldcg: from L2), and\n"
    "   which resets the count for the next launch.  Fence, barrier, fence, atomic:\n"
    "   the partials are visible device-wide before the count says so; the last\n"
    "   block's fence after the atomic orders its reads after the others' posts. */\n"
    "__device__ __forceinline__ bool kcu_split_last(unsigned *count, int64_t parts, bool *last) {\n"
    "  __threadfence();\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    __threadfence();\n"
    "    const bool l = atomicAdd(count, 1u) == (unsigned)(parts - 1);\n"
    "    if (l) {\n"
    "      atomicExch(count, 0u);\n"
    "      __threadfence();\n"
    "    }\n"
    "    *last = l;\n"
    "  }\n"
    "  __syncthreads();\n"
    "  return *last;\n"
    "}\n"
    "\n"
    "/* ROW_SPLIT's combine: the partials p[0..n) of a row in an order fixed by n\n"
    "   (thread i adds p[i], p[i + T], ..., then kcu_row_sum), whichever block\n"
    "   runs it.  Key partials are stored as the float with the key's bits. */\n"
    "template <int T> __device__ __forceinline__ float kcu_split_sum(const float *p, int64_t n, float *sh) {\n"
    "  float v = 0.0f;\n"
    "  for (int64_t i = threadIdx.x; i < n; i += T) v = __fadd_rn(v, __ldcg(p + i));\n"
    "  return kcu_row_sum<T>(v, sh);\n"
    "}\n"
    "template <int T, bool MAX> __device__ __forceinline__ int kcu_split_key(const float *p, int64_t n, int *sh) {\n"
    "  int v = MAX ? KCU_KEY_NEG_INF : KCU_KEY_POS_INF;\n"
    "  for (int64_t i = threadIdx.x; i < n; i += T) {\n"
    "    const int o = __float_as_int(__ldcg(p + i));\n"
    "    v = MAX ? (o > v ? o : v) : (o < v ? o : v);\n"
    "  }\n"
    "  return kcu_row_key<T, MAX>(v, sh);\n"
    "}\n";

/* COL_TILE's reductions over the 8 slices of a tile, and over its parts. */
static const char tile_prelude[] =
    "\n"
    "/* ---- column tiles (COL_TILE): 32 lanes of V rows (lane x) x 8 slices of the loop (warp y) ---- */\n"
    "\n"
    "/* Each of the lane's V rows: the slices' values added in slice order through\n"
    "   sh (row j of lane x at column 32 j + x: no bank conflicts), the result in\n"
    "   s on every slice.  The leading barrier keeps a previous use's readers\n"
    "   ahead of the writes. */\n"
    "template <int V>\n"
    "__device__ __forceinline__ void kcu_tile_sum(const float (&v)[V], float (&s)[V], float (*sh)[32 * V]) {\n"
    "  const int x = threadIdx.x % 32, y = threadIdx.x / 32;\n"
    "  __syncthreads();\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < V; j++) sh[y][32 * j + x] = v[j];\n"
    "  __syncthreads();\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < V; j++) {\n"
    "    float t = sh[0][32 * j + x];\n"
    "#pragma unroll\n"
    "    for (int w = 1; w < 8; w++) t = __fadd_rn(t, sh[w][32 * j + x]);\n"
    "    s[j] = t;\n"
    "  }\n"
    "}\n"
    "template <bool MAX, int V>\n"
    "__device__ __forceinline__ void kcu_tile_key(const int (&v)[V], int (&s)[V], int (*sh)[32 * V]) {\n"
    "  const int x = threadIdx.x % 32, y = threadIdx.x / 32;\n"
    "  __syncthreads();\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < V; j++) sh[y][32 * j + x] = v[j];\n"
    "  __syncthreads();\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < V; j++) {\n"
    "    int t = sh[0][32 * j + x];\n"
    "#pragma unroll\n"
    "    for (int w = 1; w < 8; w++) {\n"
    "      const int o = sh[w][32 * j + x];\n"
    "      t = MAX ? (o > t ? o : t) : (o < t ? o : t);\n"
    "    }\n"
    "    s[j] = t;\n"
    "  }\n"
    "}\n"
    "/* Row j's partials p[j], p[j + stride], ..., p[j + (n - 1) stride] in an\n"
    "   order fixed by n: slice y adds parts y, y + 8, ..., then kcu_tile_sum. */\n"
    "template <int V>\n"
    "__device__ __forceinline__ void kcu_tile_split_sum(const float *p, int64_t n, int64_t stride,\n"
    "                                                   float (&s)[V], float (*sh)[32 * V]) {\n"
    "  float v[V];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < V; j++) v[j] = 0.0f;\n"
    "  for (int64_t i = threadIdx.x / 32; i < n; i += 8)\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < V; j++) v[j] = __fadd_rn(v[j], __ldcg(p + i * stride + j));\n"
    "  kcu_tile_sum<V>(v, s, sh);\n"
    "}\n"
    "template <bool MAX, int V>\n"
    "__device__ __forceinline__ void kcu_tile_split_key(const float *p, int64_t n, int64_t stride,\n"
    "                                                   int (&s)[V], int (*sh)[32 * V]) {\n"
    "  int v[V];\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < V; j++) v[j] = MAX ? KCU_KEY_NEG_INF : KCU_KEY_POS_INF;\n"
    "  for (int64_t i = threadIdx.x / 32; i < n; i += 8)\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < V; j++) {\n"
    "      const int o = __float_as_int(__ldcg(p + i * stride + j));\n"
    "      v[j] = MAX ? (o > v[j] ? o : v[j]) : (o < v[j] ? o : v[j]);\n"
    "    }\n"
    "  kcu_tile_key<MAX, V>(v, s, sh);\n"
    "}\n";

static int fail(char *err, size_t errlen, const char *name, const char *msg) {
  snprintf(err, errlen, "kernel '%s': %s", name, msg);
  return -1;
}

/* Names at file scope: a kernel, its launcher. */
static int check_names(const KirModule *m, char *err, size_t errlen) {
  for (int i = 0; i < m->nkernels; i++) {
    const char *n = m->kernels[i]->name;
    if (is_reserved(n))
      return fail(err, errlen, n, "name is reserved in kernels.cu (C++/CUDA, kcu_*, or ends in '_')");
    size_t len = strlen(n);
    for (int j = 0; j < m->nkernels; j++) {
      const char *o = m->kernels[j]->name;
      if (!strncmp(o, n, len) && (!strcmp(o + len, "_launch") || !strncmp(o + len, "_multi", 6)))
        return fail(err, errlen, n, "its launcher's name is another kernel's");
    }
  }
  return 0;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static int write_header(const KirModule *m, Kc *cs, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    return -1;
  }
  fputs("/* Generated by parc from its kernel IR; do not edit.\n"
        " * Launchers of the CUDA kernels in kernels.cu: each enqueues rows\n"
        " * [row_begin, row_end) of its kernel on stream (a cudaStream_t), with the\n"
        " * contract of the CPU kernels (kernels.h); errors are the caller's to check. */\n"
        "#ifndef KERNELS_CUDA_H\n#define KERNELS_CUDA_H\n\n#include <stdint.h>\n\n"
        "struct CUstream_st;\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n",
        f);
  for (int i = 0; i < m->nkernels; i++) {
    const KirKernel *k = m->kernels[i];
    fprintf(f, "\n/* rows [");
    for (int d = 0; d < k->nrows; d++) fprintf(f, "%s%" PRId64, d ? ", " : "", k->rows[d]);
    fprintf(f, "] = %" PRId64 "; %s */\nvoid %s_launch(", kir_kernel_rows(k),
            kir_cuda_mapping_name[cs[i].L.mapping], k->name);
    params(&cs[i], f, 0);
    fputs("int64_t row_begin, int64_t row_end, struct CUstream_st *stream);\n", f);
    if (!cs[i].multi) continue;
    /* the batched form: instance j's arguments at index j of each array */
    int max = multi_max(k, &cs[i].L);
    fprintf(f, "typedef struct {\n");
    for (int p = 0; p < k->nparams; p++) {
      const KirParam *q = &k->params[p];
      if (q->kind == KIR_PARAM_BUF)
        fprintf(f, "  %s%s *%s[%d];\n", q->access == KIR_IN ? "const " : "", elem_type(q->elem, 0),
                cs[i].pname[p], max);
      else
        fprintf(f, "  %s %s[%d];\n", q->kind == KIR_PARAM_I64 ? "int64_t" : "float",
                cs[i].pname[p], max);
    }
    fprintf(f, "} %s_multi_t;\nvoid %s_multi_launch(const %s_multi_t *a, int count, int64_t row_begin, "
               "int64_t row_end,\n    struct CUstream_st *stream);\n", k->name, k->name, k->name);
  }
  fputs("\n#ifdef __cplusplus\n}\n#endif\n#endif\n", f);
  if (fclose(f)) {
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int kir_cuda_write(const KirModule *m, const char *cu_path, const char *h_path, char *err,
                   size_t errlen) {
  return kir_cuda_write_multi(m, NULL, cu_path, h_path, err, errlen);
}

int kir_cuda_write_multi(const KirModule *m, const unsigned char *multi, const char *cu_path,
                         const char *h_path, char *err, size_t errlen) {
  if (kir_verify(m, err, errlen) || check_names(m, err, errlen)) return -1;
  if (multi && !h_path) {
    snprintf(err, errlen, "kir_cuda_write_multi: the _multi forms need the header (their structs)");
    return -1;
  }
  Kc *cs = xcalloc((size_t)m->nkernels + 1, sizeof *cs);
  for (int i = 0; i < m->nkernels; i++) {
    cs[i].k = m->kernels[i];
    plan(&cs[i]);
    cs[i].multi = multi && multi[i] && multi_max(cs[i].k, &cs[i].L) > 0;
    name_params(&cs[i]);
  }
  int rc = -1;
  if (h_path && write_header(m, cs, h_path, err, errlen)) goto out;
  FILE *f = fopen(cu_path, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write '%s': %s", cu_path, strerror(errno));
    goto out;
  }
  int nflat = 0, ngroup = 0, nthread = 0, nvec = 0, nsplit = 0, ntile = 0, nslot = 0;
  for (int i = 0; i < m->nkernels; i++) {
    const KirCudaLaunch *L = &cs[i].L;
    nflat += L->mapping == KIR_CUDA_FLAT || L->mapping == KIR_CUDA_LOOPS;
    ngroup += L->mapping == KIR_CUDA_ROW_GROUP;
    nthread += L->mapping == KIR_CUDA_THREAD_ROW;
    nsplit += L->mapping == KIR_CUDA_ROW_SPLIT;
    ntile += L->mapping == KIR_CUDA_COL_TILE;
    nslot += L->mapping == KIR_CUDA_ROW_SPLIT || (L->mapping == KIR_CUDA_COL_TILE && L->parts > 1);
    nvec += L->vector;
  }
  fprintf(f,
          "/* Generated by parc from its kernel IR (codegen/kir_cuda.c); do not edit.\n"
          " *\n"
          " * %d kernels (%d flat (over one loop or several), %d row-group, %d thread-per-row, %d row-split,\n"
          " * %d column-tile;\n"
          " * %d with float4 accesses).\n"
          " * Each NAME_launch(params..., row_begin, row_end, stream) computes rows\n"
          " * [row_begin, row_end) of kernel NAME with the contract of the CPU kernels\n"
          " * (kernels.h): rows are independent; a buffer the kernel writes overlaps no\n"
          " * other argument.  f32 arithmetic is IEEE round-to-nearest, never contracted\n"
          " * (__fadd_rn etc.), exp/log/tanh are the CPU kernels' algorithms.\n"
          " *\n"
          " * Build: nvcc -std=c++17 -c kernels.cu (CMake: -DPARC_CUDA=ON). */\n",
          m->nkernels, nflat, ngroup, nthread, nsplit, ntile, nvec);
  fputs(prelude, f);
  int bf16 = 0; /* a param stored as bf16 or rounded so (codegen/cuda_store.h): only then the header */
  for (int i = 0; i < m->nkernels; i++)
    for (int p = 0; p < m->kernels[i]->nparams; p++) {
      const KirParam *q = &m->kernels[i]->params[p];
      bf16 |= q->kind == KIR_PARAM_BUF && (q->elem == KIR_BF16 || q->elem == KIR_BF16R);
    }
  if (bf16) fputs(bf16_prelude, f);
  if (nslot) fputs(split_prelude, f);
  if (ntile) fputs(tile_prelude, f);
  if (h_path) fprintf(f, "\n#include \"%s\" /* the launchers' prototypes, checked here */\n", base_name(h_path));
  for (int i = 0; i < m->nkernels; i++) emit_kernel(&cs[i], f);
  int bad = ferror(f);
  if (fclose(f) || bad) {
    snprintf(err, errlen, "cannot write '%s'", cu_path);
    goto out;
  }
  rc = 0;
out:
  for (int i = 0; i < m->nkernels; i++) unplan(&cs[i]);
  free(cs);
  return rc;
}
