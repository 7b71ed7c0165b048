/* runtime/rt_shard.c -- blocked tensor-parallel shards: shapes, indices, init, copies
 * and safetensors reads; see rt_shard.h. */
#include "runtime/rt_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_err.h"
#include "runtime/rt_rng.h"

/* A validated shard as outer x G x inner, the shard being, for each of the outer
 * indices and each of the `blocks` blocks, one run of `run` = real * inner contiguous
 * global floats starting at global offset (o * G + k * B + coord * b) * inner, at
 * local offset (o * blocks + k) * lrun. Without padding real = b and run = lrun; with
 * padding (blocks 1) the last lrun - run floats of each local run are padding. An
 * unsharded tensor is outer = 1, G = numel, inner = 1, blocks = 1, b = B = G. */
typedef struct {
  int64_t outer, G, inner;
  int64_t o0;       /* the first outer index the shard holds (experts: edegree > 1) */
  int64_t blocks, B, b, coord;
  int64_t real;     /* entries of the piece inside the global tensor (<= b) */
  int64_t run;      /* real * inner: global floats per run */
  int64_t lrun;     /* b * inner: local floats per run */
  int64_t numel;    /* local elements: outer * blocks * lrun */
} Geo;

/* "{dim 1, degree 2, blocks 3, coord 0} of shape [8, 24]" for messages. */
static const char *describe(char *buf, size_t cap, int rank, const int64_t *shape,
                            const RtShard *sh) {
  size_t k = (size_t)snprintf(buf, cap, "shard {dim %d, degree %d, blocks %d, coord %d", sh->dim,
                              sh->degree, sh->blocks, sh->coord);
  if (sh->edegree > 1 && k < cap)
    k += (size_t)snprintf(buf + k, cap - k, ", experts %d of %d", sh->ecoord, sh->edegree);
  if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "} of shape [");
  for (int i = 0; i < rank && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* Validates (rank, shape, sh) and fills g. `what` prefixes messages (may be NULL). */
static int geometry(int rank, const int64_t *shape, const RtShard *sh, const char *what,
                    Geo *g) {
  const char *pre = what ? what : "", *sep = what ? ": " : "";
  if (rank < 0 || rank > RT_SHARD_MAXRANK)
    return rt_fail("%s%sshard: rank %d is outside 0..%d; pass the tensor's number of dims",
                   pre, sep, rank, RT_SHARD_MAXRANK);
  if (rank > 0 && !shape) return rt_fail("%s%sshard: rank %d but no shape given", pre, sep, rank);
  int64_t total = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0)
      return rt_fail("%s%sshard: dimension %d of the global shape has negative size %lld", pre,
                     sep, i, (long long)shape[i]);
    if (shape[i] != 0 && total > INT64_MAX / shape[i])
      return rt_fail("%s%sshard: tensor of rank %d has more than 2^63 elements", pre, sep,
                     rank);
    total *= shape[i];
  }
  if (!sh || sh->dim == -1) {
    *g = (Geo){.outer = 1, .G = total, .inner = 1, .blocks = 1, .B = total, .b = total,
               .coord = 0, .real = total, .run = total, .lrun = total, .numel = total};
    return RT_OK;
  }
  char d[400];
  if (sh->dim < 0 || sh->dim >= rank)
    return rt_fail("%s%s%s: dim %d is not a dimension of a rank-%d tensor (use -1 for an "
                   "unsharded tensor)", pre, sep, describe(d, sizeof d, rank, shape, sh),
                   sh->dim, rank);
  if (sh->degree < 1 || sh->blocks < 1)
    return rt_fail("%s%s%s: degree and blocks must be at least 1 (use dim -1 for a tensor "
                   "that is whole on every rank)", pre, sep,
                   describe(d, sizeof d, rank, shape, sh));
  if (sh->coord < 0 || sh->coord >= sh->degree)
    return rt_fail("%s%s%s: coord %d is outside 0..%d; pass the rank's coordinate on the "
                   "tensor-parallel axis", pre, sep, describe(d, sizeof d, rank, shape, sh),
                   sh->coord, sh->degree - 1);
  int64_t G = shape[sh->dim], E = rank ? shape[0] : 0;
  if (sh->edegree > 1 && (sh->dim < 1 || sh->padded || E % sh->edegree))
    return rt_fail("%s%s%s: the experts (dim 0, %lld) must split evenly over %d, with the "
                   "tensor-parallel split on a later dimension, unpadded", pre, sep,
                   describe(d, sizeof d, rank, shape, sh), (long long)E, sh->edegree);
  if (sh->edegree > 1 && (sh->ecoord < 0 || sh->ecoord >= sh->edegree))
    return rt_fail("%s%s%s: ecoord %d is outside 0..%d; pass the rank's coordinate on the "
                   "expert-parallel axis", pre, sep, describe(d, sizeof d, rank, shape, sh),
                   sh->ecoord, sh->edegree - 1);
  if (sh->padded && (sh->padded <= G || sh->padded % sh->degree ||
                     sh->padded - G >= (int64_t)RT_SHARD_PAD_MAX * sh->degree || sh->blocks != 1))
    return rt_fail("%s%s%s: padded size %lld of dim %d must be a multiple of the degree "
                   "above %lld by less than %d times the degree, in one block", pre, sep,
                   describe(d, sizeof d, rank, shape, sh), (long long)sh->padded, sh->dim,
                   (long long)G, RT_SHARD_PAD_MAX);
  if (sh->padded) { /* cut as if the dimension had `padded` entries */
    int64_t outer = 1, inner = 1, b = sh->padded / sh->degree;
    for (int i = 0; i < sh->dim; i++) outer *= shape[i];
    for (int i = sh->dim + 1; i < rank; i++) inner *= shape[i];
    int64_t real = G - sh->coord * b;
    real = real < 0 ? 0 : real > b ? b : real;
    *g = (Geo){.outer = outer, .G = G, .inner = inner, .blocks = 1, .B = G, .b = b,
               .coord = sh->coord, .real = real, .run = real * inner, .lrun = b * inner,
               .numel = outer * b * inner};
    return RT_OK;
  }
  if (G % sh->blocks != 0)
    return rt_fail("%s%s%s: size %lld of dim %d is not divisible into %d equal blocks; the "
                   "layout does not fit this shape", pre, sep,
                   describe(d, sizeof d, rank, shape, sh), (long long)G, sh->dim, sh->blocks);
  int64_t B = G / sh->blocks;
  if (B % sh->degree != 0)
    return rt_fail("%s%s%s: block width %lld of dim %d is not divisible by degree %d; the "
                   "layout does not fit this shape", pre, sep,
                   describe(d, sizeof d, rank, shape, sh), (long long)B, sh->dim, sh->degree);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < sh->dim; i++) outer *= shape[i];
  for (int i = sh->dim + 1; i < rank; i++) inner *= shape[i];
  int64_t b = B / sh->degree, o0 = 0;
  if (sh->edegree > 1) { /* the rank's experts: a contiguous range of the outer indices */
    outer /= sh->edegree;
    o0 = sh->ecoord * outer;
  }
  *g = (Geo){.outer = outer, .G = G, .inner = inner, .o0 = o0, .blocks = sh->blocks, .B = B,
             .b = b, .coord = sh->coord, .real = b, .run = b * inner, .lrun = b * inner,
             .numel = outer * sh->blocks * b * inner};
  return RT_OK;
}

/* Global offset of run (o, k). */
static inline int64_t run_start(const Geo *g, int64_t o, int64_t k) {
  return ((g->o0 + o) * g->G + k * g->B + g->coord * g->b) * g->inner;
}

int rt_shard_check(int rank, const int64_t *global_shape, const RtShard *sh) {
  Geo g;
  return geometry(rank, global_shape, sh, NULL, &g);
}

int rt_shard_local_shape(int rank, const int64_t *global_shape, const RtShard *sh,
                         int64_t *local_shape) {
  Geo g;
  if (geometry(rank, global_shape, sh, NULL, &g)) return RT_ERR;
  for (int i = 0; i < rank; i++) local_shape[i] = global_shape[i];
  if (sh && sh->dim >= 0) local_shape[sh->dim] = g.blocks * g.b;
  if (sh && sh->dim >= 1 && sh->edegree > 1) local_shape[0] /= sh->edegree;
  return RT_OK;
}

int64_t rt_shard_numel(int rank, const int64_t *global_shape, const RtShard *sh) {
  Geo g;
  return geometry(rank, global_shape, sh, NULL, &g) ? -1 : g.numel;
}

int64_t rt_shard_global_index(int rank, const int64_t *global_shape, const RtShard *sh,
                              int64_t local_index) {
  Geo g;
  if (geometry(rank, global_shape, sh, NULL, &g)) return -1;
  if (local_index < 0 || local_index >= g.numel) {
    rt_fail("shard: local index %lld is outside the shard's %lld elements", (long long)local_index,
            (long long)g.numel);
    return -1;
  }
  int64_t L = g.blocks * g.b;
  int64_t i = local_index % g.inner, j = local_index / g.inner % L;
  int64_t o = local_index / (L * g.inner);
  if (j % g.b >= g.real) return -2; /* padding */
  return ((g.o0 + o) * g.G + (j / g.b) * g.B + g.coord * g.b + j % g.b) * g.inner + i;
}

/* run_start of run r = o blocks + blk (rt_init_normal_runs). */
static int64_t geo_run_start(const void *ctx, int64_t r) {
  const Geo *g = ctx;
  return run_start(g, r / g->blocks, r % g->blocks);
}

int rt_shard_init_normal(float *dst, uint64_t seed, uint64_t stream, float std, int rank,
                         const int64_t *global_shape, const RtShard *sh) {
  Geo g;
  if (geometry(rank, global_shape, sh, "init", &g)) return RT_ERR;
  /* run r = (o, blk) in row-major order: g.run values, then padding to g.lrun */
  rt_init_normal_runs(dst, seed, stream, std, g.outer * g.blocks, g.run, g.lrun, geo_run_start,
                      &g);
  return RT_OK;
}

/* Copies between the full tensor and the shard: to_local = 1 gathers, 0 scatters. */
static void copy_runs(const Geo *g, float *global, float *local, int to_local) {
  if (g->numel == 0) return;
  /* Pieces of a block that make up the whole block (degree 1) join into one run. */
  int64_t blocks = g->blocks, run = g->run, lrun = g->lrun;
  if (g->b == g->B && run == lrun) {
    run *= blocks;
    lrun = run;
    blocks = 1;
  }
  size_t bytes = sizeof(float) * (size_t)run;
  int64_t k = 0;
  for (int64_t o = 0; o < g->outer; o++)
    for (int64_t blk = 0; blk < blocks; blk++, k += lrun) {
      float *gp = global + run_start(g, o, blk);
      if (to_local) {
        if (run) memcpy(local + k, gp, bytes);
        if (lrun > run) memset(local + k + run, 0, sizeof(float) * (size_t)(lrun - run));
      } else if (run) {
        memcpy(gp, local + k, bytes); /* padding stays out of the global tensor */
      }
    }
}

int rt_shard_extract(const float *global, float *local, int rank,
                     const int64_t *global_shape, const RtShard *sh) {
  Geo g;
  if (geometry(rank, global_shape, sh, "extract", &g)) return RT_ERR;
  copy_runs(&g, (float *)global, local, 1);   /* gathers only read from global */
  return RT_OK;
}

int rt_shard_insert(float *global, const float *local, int rank,
                    const int64_t *global_shape, const RtShard *sh) {
  Geo g;
  if (geometry(rank, global_shape, sh, "insert", &g)) return RT_ERR;
  copy_runs(&g, global, (float *)local, 0);   /* scatters only read from local */
  return RT_OK;
}

int rt_st_read_shard(const RtSt *st, const char *name, float *dst, int rank,
                     const int64_t *global_shape, const RtShard *sh) {
  char what[300];
  snprintf(what, sizeof what, "tensor '%s'", name ? name : "(null)");
  Geo g;
  if (geometry(rank, global_shape, sh, what, &g)) return RT_ERR;
  if (sh && sh->dim >= 0 && sh->edegree > 1 && g.numel > 0) {
    /* the rank's experts (a slice of dim 0), then their tp shard out of it */
    int64_t es[RT_SHARD_MAXRANK], en = 1, E = global_shape[0] / sh->edegree;
    for (int i = 0; i < rank; i++) en *= es[i] = global_shape[i];
    en = en / global_shape[0] * E;
    es[0] = E;
    float *tmp = malloc(sizeof(float) * (size_t)(en + 1));
    if (!tmp)
      return rt_fail("tensor '%s': out of memory for a %lld-float expert read buffer", name,
                     (long long)en);
    RtShard tsh = *sh;
    tsh.edegree = 0, tsh.ecoord = 0;
    int rc = rt_st_read_slice(st, name, tmp, rank, global_shape, 0, sh->ecoord * E, E);
    if (rc == RT_OK) rc = rt_shard_extract(tmp, dst, rank, es, &tsh);
    free(tmp);
    return rc;
  }
  if (g.run < g.lrun) { /* padded: the real rows of each run, then zeros */
    memset(dst, 0, sizeof(float) * (size_t)g.numel);
    /* a piece of padding only still checks the file's tensor (an empty slice at G) */
    int64_t start = g.real ? g.coord * g.b : g.G;
    if (g.outer == 1)
      return rt_st_read_slice(st, name, dst, rank, global_shape, sh->dim, start, g.real);
    float *tmp = malloc(sizeof(float) * (size_t)(g.outer * g.run + 1));
    if (!tmp)
      return rt_fail("tensor '%s': out of memory for a %lld-float shard read buffer", name,
                     (long long)(g.outer * g.run));
    int rc = rt_st_read_slice(st, name, tmp, rank, global_shape, sh->dim, start, g.real);
    for (int64_t o = 0; rc == RT_OK && o < g.outer; o++)
      memcpy(dst + o * g.lrun, tmp + o * g.run, sizeof(float) * (size_t)g.run);
    free(tmp);
    return rc;
  }
  if (!sh || sh->dim == -1 || g.b == g.B || g.numel == 0)   /* the whole (or empty) tensor */
    return rt_st_read(st, name, dst, rank, global_shape);
  if (g.blocks == 1)
    return rt_st_read_slice(st, name, dst, rank, global_shape, sh->dim, g.coord * g.b, g.b);
  if (g.outer == 1) {   /* block k's slice is contiguous in dst */
    for (int64_t blk = 0; blk < g.blocks; blk++)
      if (rt_st_read_slice(st, name, dst + blk * g.run, rank, global_shape, sh->dim,
                           blk * g.B + g.coord * g.b, g.b))
        return RT_ERR;
    return RT_OK;
  }
  /* One block at a time (outer runs of `run` floats), then spread over dst. */
  float *scratch = malloc(sizeof(float) * (size_t)(g.outer * g.run));
  if (!scratch)
    return rt_fail("tensor '%s': out of memory for a %lld-float shard read buffer", name,
                   (long long)(g.outer * g.run));
  int rc = RT_OK;
  for (int64_t blk = 0; rc == RT_OK && blk < g.blocks; blk++) {
    rc = rt_st_read_slice(st, name, scratch, rank, global_shape, sh->dim,
                          blk * g.B + g.coord * g.b, g.b);
    for (int64_t o = 0; rc == RT_OK && o < g.outer; o++)
      memcpy(dst + (o * g.blocks + blk) * g.run, scratch + o * g.run,
             sizeof(float) * (size_t)g.run);
  }
  free(scratch);
  return rc;
}
