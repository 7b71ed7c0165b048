/* tests/runtime/shard_test.c -- rt_shard.h case by case: `shard_test CASE` runs one
 * case (index, init, roundtrip, gpt2, safetensors, errors,
 * padded, experts), no argument runs all.
 *
 * The sweeps cover ranks 1..4, every dim, degrees 1..4, blocks 1..3 and every
 * coordinate; combinations whose degree or blocks do not divide the dimension must
 * be rejected, the others must satisfy the case's property. Expected indices come
 * from an independent brute force (global -> owner and local position), not from the
 * formula the runtime uses (local -> global). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_rng.h"
#include "runtime/rt_safetensors.h"
#include "runtime/rt_shard.h"
#include "tests/runtime/check.h"

typedef struct {
  int rank;
  int64_t shape[4];
} Shape;

static const Shape shapes[] = {
  {1, {24}},         {1, {12}},         {1, {7}},
  {2, {8, 24}},      {2, {6, 12}},      {2, {0, 12}},
  {3, {4, 6, 12}},   {3, {3, 8, 6}},    {3, {2, 0, 6}},
  {4, {2, 6, 4, 12}}, {4, {3, 2, 6, 4}},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static int64_t numel_of(const Shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->shape[i];
  return n;
}

static float *alloc_floats(int64_t n) { return malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)); }

static const uint32_t SENTINEL = 0xffffffffu;   /* a NaN no init or test value produces */

static void fill_sentinel(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) memcpy(&x[i], &SENTINEL, sizeof SENTINEL);
}

static int is_sentinel(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u == SENTINEL;
}

/* Whether (degree, blocks) fits dimension dim of s. */
static int fits(const Shape *s, int dim, int degree, int blocks) {
  int64_t G = s->shape[dim];
  return G % blocks == 0 && (G / blocks) % degree == 0;
}

/* Brute force: for shard sh of s, map[L] = global linear index of local element L,
 * by walking all global elements and keeping those whose position along dim lies in
 * sh's piece of its block. Returns the number of elements kept. */
static int64_t brute_map(const Shape *s, const RtShard *sh, int64_t *map) {
  int64_t n = numel_of(s);
  int64_t G = s->shape[sh->dim], B = G / sh->blocks, b = B / sh->degree;
  int64_t lshape[4];
  for (int i = 0; i < s->rank; i++) lshape[i] = s->shape[i];
  lshape[sh->dim] = sh->blocks * b;
  int64_t kept = 0;
  for (int64_t gi = 0; gi < n; gi++) {
    int64_t idx[4] = {0, 0, 0, 0}, rem = gi;
    for (int i = s->rank - 1; i >= 0; i--) {
      idx[i] = rem % s->shape[i];
      rem /= s->shape[i];
    }
    int64_t gd = idx[sh->dim];
    if ((gd % B) / b != sh->coord) continue;
    idx[sh->dim] = (gd / B) * b + gd % b;
    int64_t L = 0;
    for (int i = 0; i < s->rank; i++) L = L * lshape[i] + idx[i];
    map[L] = gi;
    kept++;
  }
  return kept;
}

/* Calls fn for every valid (shape, sharded descriptor) of the sweep, and checks that
 * every invalid one is rejected by rt_shard_check and rt_shard_numel. */
typedef void (*ConfigFn)(const Shape *s, const RtShard *sh, void *ctx);

static long sweep(ConfigFn fn, void *ctx) {
  long valid = 0;
  for (int si = 0; si < NSHAPES; si++) {
    const Shape *s = &shapes[si];
    for (int dim = 0; dim < s->rank; dim++)
      for (int degree = 1; degree <= 4; degree++)
        for (int blocks = 1; blocks <= 3; blocks++)
          for (int coord = 0; coord < degree; coord++) {
            RtShard sh = {dim, degree, blocks, coord, 0, 0, 0};
            if (!fits(s, dim, degree, blocks)) {
              CHECK(rt_shard_check(s->rank, s->shape, &sh) == RT_ERR);
              CHECK(rt_shard_numel(s->rank, s->shape, &sh) == -1);
              continue;
            }
            CHECK_OK(rt_shard_check(s->rank, s->shape, &sh));
            fn(s, &sh, ctx);
            valid++;
          }
  }
  return valid;
}

/* ---- index: local shape, numel and the local -> global formula ---- */

static void index_one(const Shape *s, const RtShard *sh, void *ctx) {
  (void)ctx;
  int64_t n = numel_of(s);
  int64_t lshape[4];
  CHECK_OK(rt_shard_local_shape(s->rank, s->shape, sh, lshape));
  int64_t ln = 1;
  for (int i = 0; i < s->rank; i++) {
    CHECK(lshape[i] == (i == sh->dim ? s->shape[i] / sh->degree : s->shape[i]));
    ln *= lshape[i];
  }
  CHECK(rt_shard_numel(s->rank, s->shape, sh) == ln && ln * sh->degree == n);
  int64_t *map = malloc(sizeof(int64_t) * (size_t)(ln + 1));
  CHECK(brute_map(s, sh, map) == ln);
  for (int64_t L = 0; L < ln; L++)
    CHECK(rt_shard_global_index(s->rank, s->shape, sh, L) == map[L]);
  /* The local element order is increasing in the global index (row-major both). */
  for (int64_t L = 1; L < ln; L++) CHECK(map[L - 1] < map[L]);
  free(map);
}

/* The coordinates of one layout partition the tensor: each element has one owner. */
static void test_partition(void) {
  for (int si = 0; si < NSHAPES; si++) {
    const Shape *s = &shapes[si];
    int64_t n = numel_of(s);
    int *owners = calloc((size_t)(n + 1), sizeof *owners);
    int64_t *map = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int dim = 0; dim < s->rank; dim++)
      for (int degree = 1; degree <= 4; degree++)
        for (int blocks = 1; blocks <= 3; blocks++) {
          if (!fits(s, dim, degree, blocks)) continue;
          memset(owners, 0, sizeof *owners * (size_t)(n + 1));
          for (int c = 0; c < degree; c++) {
            RtShard sh = {dim, degree, blocks, c, 0, 0, 0};
            int64_t ln = rt_shard_numel(s->rank, s->shape, &sh);
            for (int64_t L = 0; L < ln; L++) {
              int64_t gi = rt_shard_global_index(s->rank, s->shape, &sh, L);
              CHECK(gi >= 0 && gi < n);
              if (gi >= 0 && gi < n) owners[gi]++;
            }
          }
          for (int64_t gi = 0; gi < n; gi++) CHECK(owners[gi] == 1);
        }
    /* Not sharded: the identity. */
    RtShard none = {-1, 0, 0, 0, 0, 0, 0};
    CHECK(rt_shard_numel(s->rank, s->shape, &none) == n);
    CHECK(rt_shard_numel(s->rank, s->shape, NULL) == n);
    for (int64_t gi = 0; gi < n; gi++)
      CHECK(rt_shard_global_index(s->rank, s->shape, &none, gi) == gi);
    free(owners);
    free(map);
  }
}

static void test_index(void) {
  long valid = sweep(index_one, NULL);
  CHECK(valid > 300);
  test_partition();
  /* A scalar is its own (unsharded) shard. */
  RtShard none = {-1, 1, 1, 0, 0, 0, 0};
  CHECK(rt_shard_numel(0, NULL, &none) == 1 && rt_shard_global_index(0, NULL, &none, 0) == 0);
}

/* ---- init: the shards' inits reassemble the unsharded init bit for bit ---- */

typedef struct {
  uint64_t seed, stream;
  float std;
} InitCtx;

static void init_layout(const Shape *s, const RtShard *sh, void *vctx) {
  if (sh->coord != 0) return;   /* one call per layout; it walks all coordinates */
  const InitCtx *ctx = vctx;
  int64_t n = numel_of(s);
  float *full = alloc_floats(n), *assembled = alloc_floats(n), *local = alloc_floats(n);
  float *cut = alloc_floats(n);
  CHECK_OK(rt_init_normal_slice(full, ctx->seed, ctx->stream, ctx->std, s->rank, s->shape, -1,
                                0, 0));
  fill_sentinel(assembled, n);
  for (int c = 0; c < sh->degree; c++) {
    RtShard me = *sh;
    me.coord = c;
    int64_t ln = rt_shard_numel(s->rank, s->shape, &me);
    fill_sentinel(local, n);
    CHECK_OK(rt_shard_init_normal(local, ctx->seed, ctx->stream, ctx->std, s->rank, s->shape,
                                  &me));
    for (int64_t L = ln; L < n; L++) CHECK(is_sentinel(local[L]));   /* no overrun */
    for (int64_t L = 0; L < ln; L++) {
      int64_t gi = rt_shard_global_index(s->rank, s->shape, &me, L);
      CHECK(local[L] == ctx->std * rt_rng_normal(ctx->seed, ctx->stream, (uint64_t)gi));
    }
    CHECK_OK(rt_shard_extract(full, cut, s->rank, s->shape, &me));
    CHECK(memcmp(cut, local, sizeof(float) * (size_t)ln) == 0);
    CHECK_OK(rt_shard_insert(assembled, local, s->rank, s->shape, &me));
  }
  CHECK(memcmp(assembled, full, sizeof(float) * (size_t)n) == 0);
  /* blocks = 1 agrees with the existing contiguous slice init. */
  if (sh->blocks == 1 && n > 0) {
    int64_t w = s->shape[sh->dim] / sh->degree;
    for (int c = 0; c < sh->degree; c++) {
      RtShard me = *sh;
      me.coord = c;
      int64_t ln = rt_shard_numel(s->rank, s->shape, &me);
      CHECK_OK(rt_shard_init_normal(local, ctx->seed, ctx->stream, ctx->std, s->rank,
                                    s->shape, &me));
      CHECK_OK(rt_init_normal_slice(cut, ctx->seed, ctx->stream, ctx->std, s->rank, s->shape,
                                    sh->dim, c * w, w));
      CHECK(memcmp(cut, local, sizeof(float) * (size_t)ln) == 0);
    }
  }
  free(full);
  free(assembled);
  free(local);
  free(cut);
}

static void test_init(void) {
  InitCtx ctx = {20260407, rt_param_stream("h.3.attn.c_attn.weight"), 0.02f};
  sweep(init_layout, &ctx);
  /* Not sharded: exactly the whole-tensor init. */
  const Shape *s = &shapes[9];
  int64_t n = numel_of(s);
  float *a = alloc_floats(n), *b = alloc_floats(n);
  RtShard none = {-1, 4, 3, 2, 0, 0, 0};   /* the other fields are ignored */
  CHECK_OK(rt_shard_init_normal(a, ctx.seed, ctx.stream, ctx.std, s->rank, s->shape, &none));
  CHECK_OK(rt_init_normal_slice(b, ctx.seed, ctx.stream, ctx.std, s->rank, s->shape, -1, 0, 0));
  CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0);
  CHECK_OK(rt_shard_init_normal(a, ctx.seed, ctx.stream, ctx.std, s->rank, s->shape, NULL));
  CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0);
  free(a);
  free(b);
}

/* ---- roundtrip: extract(insert(x)) == x, insert touches only the shard ---- */

static void roundtrip_one(const Shape *s, const RtShard *sh, void *ctx) {
  (void)ctx;
  int64_t n = numel_of(s), ln = rt_shard_numel(s->rank, s->shape, sh);
  float *global = alloc_floats(n), *x = alloc_floats(n), *y = alloc_floats(n);
  int64_t *map = malloc(sizeof(int64_t) * (size_t)(n + 1));
  brute_map(s, sh, map);
  for (int64_t L = 0; L < ln; L++) x[L] = (float)(1000 * sh->coord) + (float)L * 0.5f - 3.0f;
  fill_sentinel(global, n);
  CHECK_OK(rt_shard_insert(global, x, s->rank, s->shape, sh));
  int64_t touched = 0;
  for (int64_t gi = 0; gi < n; gi++) touched += !is_sentinel(global[gi]);
  CHECK(touched == ln);
  for (int64_t L = 0; L < ln; L++) CHECK(global[map[L]] == x[L]);
  fill_sentinel(y, n);
  CHECK_OK(rt_shard_extract(global, y, s->rank, s->shape, sh));
  CHECK(memcmp(x, y, sizeof(float) * (size_t)ln) == 0);
  for (int64_t L = ln; L < n; L++) CHECK(is_sentinel(y[L]));
  free(global);
  free(x);
  free(y);
  free(map);
}

static void test_roundtrip(void) { sweep(roundtrip_one, NULL); }

/* ---- gpt2: the fused q|k|v weight [d, 3d], dim 1, blocks 3 ---- */

static void test_gpt2(void) {
  const int64_t shape[2] = {8, 24};
  float full[8 * 24], local[8 * 12];
  for (int r = 0; r < 8; r++)
    for (int col = 0; col < 24; col++) full[r * 24 + col] = (float)(100 * r + col);
  static const int cols[2][12] = {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19},
                                  {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23}};
  for (int c = 0; c < 2; c++) {
    RtShard sh = {1, 2, 3, c, 0, 0, 0};
    int64_t lshape[2];
    CHECK_OK(rt_shard_local_shape(2, shape, &sh, lshape));
    CHECK(lshape[0] == 8 && lshape[1] == 12);
    CHECK_OK(rt_shard_extract(full, local, 2, shape, &sh));
    for (int r = 0; r < 8; r++)
      for (int j = 0; j < 12; j++) {
        CHECK(local[r * 12 + j] == (float)(100 * r + cols[c][j]));
        CHECK(rt_shard_global_index(2, shape, &sh, r * 12 + j) == r * 24 + cols[c][j]);
      }
  }
  /* Full size (d = 768, tp 2 and 4): each rank's init is its slice of the whole. */
  const int64_t big[2] = {768, 3 * 768};
  const int64_t n = big[0] * big[1];
  const uint64_t seed = 1337, stream = rt_param_stream("h.0.attn.c_attn.weight");
  float *whole = alloc_floats(n), *assembled = alloc_floats(n), *part = alloc_floats(n);
  CHECK_OK(rt_init_normal_slice(whole, seed, stream, 0.02f, 2, big, -1, 0, 0));
  for (int degree = 2; degree <= 4; degree += 2) {
    fill_sentinel(assembled, n);
    for (int c = 0; c < degree; c++) {
      RtShard sh = {1, degree, 3, c, 0, 0, 0};
      CHECK_OK(rt_shard_init_normal(part, seed, stream, 0.02f, 2, big, &sh));
      CHECK(part[0] == 0.02f * rt_rng_normal(seed, stream, (uint64_t)(c * 768 / degree)));
      CHECK_OK(rt_shard_insert(assembled, part, 2, big, &sh));
    }
    CHECK(memcmp(assembled, whole, sizeof(float) * (size_t)n) == 0);
  }
  free(whole);
  free(assembled);
  free(part);
}

/* ---- safetensors: rt_st_read_shard of a whole-tensor file == extract ---- */

/* Each case writes its own file: ctest -j runs the cases of this binary at once in
 * one directory. */
#define ST_PATH "shard_full.safetensors"
#define ST_PADDED_PATH "shard_padded.safetensors"

typedef struct {
  const RtSt *st;
  float *const *data;   /* the tensors written, by shape index */
} StCtx;

static int shape_index(const Shape *s) { return (int)(s - shapes); }

static void st_one(const Shape *s, const RtShard *sh, void *vctx) {
  const StCtx *ctx = vctx;
  int si = shape_index(s);
  char name[32];
  snprintf(name, sizeof name, "t%d", si);
  int64_t n = numel_of(s), ln = rt_shard_numel(s->rank, s->shape, sh);
  float *got = alloc_floats(n), *want = alloc_floats(n);
  fill_sentinel(got, n);
  CHECK_OK(rt_st_read_shard(ctx->st, name, got, s->rank, s->shape, sh));
  CHECK_OK(rt_shard_extract(ctx->data[si], want, s->rank, s->shape, sh));
  CHECK(memcmp(got, want, sizeof(float) * (size_t)ln) == 0);
  for (int64_t L = ln; L < n; L++) CHECK(is_sentinel(got[L]));
  free(got);
  free(want);
}

static void test_safetensors(void) {
  RtStTensor t[NSHAPES];
  float *data[NSHAPES];
  char names[NSHAPES][32];
  for (int si = 0; si < NSHAPES; si++) {
    int64_t n = numel_of(&shapes[si]);
    data[si] = alloc_floats(n);
    for (int64_t i = 0; i < n; i++) data[si][i] = (float)si * 10000.0f + (float)i * 0.25f;
    snprintf(names[si], sizeof names[si], "t%d", si);
    t[si] = (RtStTensor){.name = names[si], .rank = shapes[si].rank, .data = data[si]};
    memcpy(t[si].shape, shapes[si].shape, sizeof shapes[si].shape);
  }
  CHECK_OK(rt_st_write(ST_PATH, t, NSHAPES, NULL, 0));
  RtSt *st = NULL;
  CHECK_OK(rt_st_open(&st, ST_PATH));
  if (st) {
    StCtx ctx = {st, data};
    sweep(st_one, &ctx);
    /* Not sharded: the whole tensor. */
    const Shape *s = &shapes[9];
    int64_t n = numel_of(s);
    float *got = alloc_floats(n);
    CHECK_OK(rt_st_read_shard(st, "t9", got, s->rank, s->shape, NULL));
    CHECK(memcmp(got, data[9], sizeof(float) * (size_t)n) == 0);
    /* A file made for another shape, or without the tensor, says so; dst untouched. */
    const int64_t wrong[2] = {12, 24};
    RtShard sh = {1, 2, 3, 0, 0, 0, 0};
    fill_sentinel(got, n);
    CHECK_FAILS(rt_st_read_shard(st, "t3", got, 2, wrong, &sh),
                "tensor 't3' has shape [8, 24] but the model expects [12, 24]");
    CHECK_FAILS(rt_st_read_shard(st, "wte.weight", got, 2, shapes[3].shape, &sh),
                "has no tensor 'wte.weight'");
    RtShard bad = {1, 5, 3, 0, 0, 0, 0};
    CHECK_FAILS(rt_st_read_shard(st, "t3", got, 2, shapes[3].shape, &bad),
                "tensor 't3': shard {dim 1, degree 5, blocks 3, coord 0} of shape [8, 24]: "
                "block width 8 of dim 1 is not divisible by degree 5");
    for (int64_t i = 0; i < n; i++) CHECK(is_sentinel(got[i]));
    free(got);
    rt_st_close(st);
  }
  for (int si = 0; si < NSHAPES; si++) free(data[si]);
  remove(ST_PATH);
}

/* ---- padded: a vocabulary of 7 rows over 2, 3 and 4 ranks ---- */

/* For [7, 3] (dim 0) and [2, 7] (dim 1), degrees 2..4 (padded 8, 9, 8), and
 * parc's --pad-vocab paddings of at least the degree: degree 1 (padded 8, the
 * one-rank trainer's), 2 and 3 (padded 12, a multiple of 6 and of 4): each
 * coordinate holds padded / degree entries of dim, coord * b + j global, the
 * ones >= 7 padding; init, extract and safetensors reads give the global
 * values there and exactly 0 on padding; global_index says -2 on padding;
 * inserting every coordinate's shard rebuilds the tensor and writes nothing
 * past it (a sentinel just after the buffer stays). */
static void test_padded(void) {
  static const Shape sh[2] = {{2, {7, 3}}, {2, {2, 7}}};
  float glob[21], back[22], loc[24], ini[24], rd[24];
  RtStTensor t[2];
  float data[2][21];
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 21; i++) data[k][i] = (float)(k * 100 + i) + 0.5f;
    t[k] = (RtStTensor){.name = k ? "b" : "a", .rank = 2, .data = data[k]};
    memcpy(t[k].shape, sh[k].shape, sizeof sh[k].shape);
  }
  CHECK_OK(rt_st_write(ST_PADDED_PATH, t, 2, NULL, 0));
  RtSt *st = NULL;
  CHECK_OK(rt_st_open(&st, ST_PADDED_PATH));
  for (int k = 0; k < 2 && st; k++) {
    const Shape *s = &sh[k];
    int dim = k;
    memcpy(glob, data[k], sizeof glob);
    static const int64_t cut[][2] = {{2, 8}, {3, 9}, {4, 8}, {1, 8}, {2, 12}, {3, 12}};
    for (size_t q = 0; q < sizeof cut / sizeof cut[0]; q++) {
      int degree = (int)cut[q][0];
      int64_t padded = cut[q][1], b = padded / degree;
      fill_sentinel(back, 22);
      for (int c = 0; c < degree; c++) {
        RtShard r = {dim, degree, 1, c, padded, 0, 0};
        int64_t ls[2];
        CHECK_OK(rt_shard_local_shape(2, s->shape, &r, ls));
        CHECK(ls[dim] == b && ls[1 - dim] == s->shape[1 - dim]);
        int64_t n = rt_shard_numel(2, s->shape, &r);
        CHECK(n == s->shape[1 - dim] * b);
        CHECK_OK(rt_shard_extract(glob, loc, 2, s->shape, &r));
        CHECK_OK(rt_shard_init_normal(ini, 9, 4, 0.5f, 2, s->shape, &r));
        fill_sentinel(rd, 24);
        CHECK_OK(rt_st_read_shard(st, t[k].name, rd, 2, s->shape, &r));
        for (int64_t e = 0; e < n; e++) {
          int64_t j = dim ? e % b : e / 3, other = dim ? e / b : e % 3;
          int64_t gj = c * b + j, gi = dim ? other * 7 + gj : gj * 3 + other;
          int64_t idx = rt_shard_global_index(2, s->shape, &r, e);
          if (gj >= 7) {
            CHECK(idx == -2 && loc[e] == 0.0f && ini[e] == 0.0f && rd[e] == 0.0f);
          } else {
            CHECK(idx == gi && loc[e] == glob[gi] && rd[e] == glob[gi]);
            CHECK(ini[e] == 0.5f * rt_rng_normal(9, 4, (uint64_t)gi));
          }
        }
        CHECK_OK(rt_shard_insert(back, loc, 2, s->shape, &r));
      }
      int64_t ng = s->shape[0] * s->shape[1];
      CHECK(memcmp(back, glob, sizeof(float) * (size_t)ng) == 0 && is_sentinel(back[ng]));
    }
  }
  rt_st_close(st);
  remove(ST_PADDED_PATH);
}

/* ---- errors: bad descriptors fail with one line and write nothing ---- */

static void test_errors(void) {
  const int64_t sh2[2] = {8, 24};
  float global[8 * 24], local[8 * 24];
  int64_t lshape[2] = {-7, -7};
  fill_sentinel(global, 8 * 24);
  fill_sentinel(local, 8 * 24);
  static const struct {
    RtShard sh;
    const char *needle;
  } bad[] = {
    {{1, 5, 1, 0, 0, 0, 0}, "block width 24 of dim 1 is not divisible by degree 5"},
    {{1, 3, 3, 0, 0, 0, 0}, "block width 8 of dim 1 is not divisible by degree 3"},
    {{0, 2, 3, 0, 0, 0, 0}, "size 8 of dim 0 is not divisible into 3 equal blocks"},
    {{1, 1, 5, 0, 0, 0, 0}, "size 24 of dim 1 is not divisible into 5 equal blocks"},
    {{2, 2, 1, 0, 0, 0, 0}, "dim 2 is not a dimension of a rank-2 tensor"},
    {{-2, 2, 1, 0, 0, 0, 0}, "dim -2 is not a dimension of a rank-2 tensor"},
    {{1, 2, 1, 2, 0, 0, 0}, "coord 2 is outside 0..1"},
    {{1, 2, 1, -1, 0, 0, 0}, "coord -1 is outside 0..1"},
    {{1, 0, 1, 0, 0, 0, 0}, "degree and blocks must be at least 1"},
    {{1, 2, 0, 0, 0, 0, 0}, "degree and blocks must be at least 1"},
    {{1, 5, 1, 0, 24, 0, 0}, "padded size 24 of dim 1 must be a multiple"},
    {{1, 5, 1, 0, 20505, 0, 0}, "padded size 20505 of dim 1 must be a multiple"}, /* 4096 * 5 past */
    {{1, 5, 3, 0, 25, 0, 0}, "padded size 25 of dim 1 must be a multiple"},
    {{1, 5, 1, 0, 26, 0, 0}, "padded size 26 of dim 1 must be a multiple"},
    {{0, 2, 1, 0, 0, 2, 0}, "the experts (dim 0, 8) must split evenly over 2"},
    {{1, 2, 1, 0, 0, 3, 0}, "the experts (dim 0, 8) must split evenly over 3"},
    {{1, 2, 1, 0, 0, 2, 2}, "ecoord 2 is outside 0..1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const RtShard *s = &bad[i].sh;
    const char *nd = bad[i].needle;
    CHECK_FAILS(rt_shard_check(2, sh2, s), nd);
    CHECK_FAILS(rt_shard_local_shape(2, sh2, s, lshape), nd);
    CHECK_FAILS(rt_shard_init_normal(local, 1, 2, 1.0f, 2, sh2, s), nd);
    CHECK_FAILS(rt_shard_extract(global, local, 2, sh2, s), nd);
    CHECK_FAILS(rt_shard_insert(global, local, 2, sh2, s), nd);
    rt_clear_error();
    CHECK(rt_shard_numel(2, sh2, s) == -1 && strstr(rt_last_error(), nd));
    rt_clear_error();
    CHECK(rt_shard_global_index(2, sh2, s, 0) == -1 && strstr(rt_last_error(), nd));
  }
  CHECK(lshape[0] == -7 && lshape[1] == -7);
  for (int i = 0; i < 8 * 24; i++) CHECK(is_sentinel(global[i]) && is_sentinel(local[i]));
  /* The message names the operation, the descriptor and the shape. */
  RtShard five = {1, 5, 1, 0, 0, 0, 0};
  CHECK_FAILS(rt_shard_init_normal(local, 1, 2, 1.0f, 2, sh2, &five),
              "init: shard {dim 1, degree 5, blocks 1, coord 0} of shape [8, 24]: block width "
              "24 of dim 1 is not divisible by degree 5; the layout does not fit this shape");
  CHECK_FAILS(rt_shard_extract(global, local, 2, sh2, &five), "extract: shard {dim 1");
  CHECK_FAILS(rt_shard_insert(global, local, 2, sh2, &five), "insert: shard {dim 1");
  /* Shapes and indices. */
  const int64_t neg[2] = {8, -24};
  RtShard ok = {1, 2, 3, 1, 0, 0, 0};
  CHECK_FAILS(rt_shard_check(2, neg, &ok), "dimension 1 of the global shape has negative size");
  CHECK_FAILS(rt_shard_check(17, sh2, &ok), "rank 17 is outside 0..16");
  CHECK_FAILS(rt_shard_check(2, NULL, &ok), "rank 2 but no shape given");
  const int64_t huge[3] = {INT64_MAX / 2, 4, 1};
  CHECK_FAILS(rt_shard_check(3, huge, &ok), "more than 2^63 elements");
  rt_clear_error();
  CHECK(rt_shard_global_index(2, sh2, &ok, 96) == -1 &&
        strstr(rt_last_error(), "local index 96 is outside the shard's 96 elements"));
  CHECK(rt_shard_global_index(2, sh2, &ok, -1) == -1);
  CHECK(rt_shard_global_index(2, sh2, &ok, 95) == 7 * 24 + 23);
}

/* Experts (edegree > 1): a [E, H, K] tensor with E split over ep and H (or K) over
 * tp. Every (ecoord, coord) pair's shard is, by an independent formula, experts
 * [ecoord E/ep, ...) with their piece [coord b, ...) of the split dimension; the
 * shards partition the tensor; extract / insert, init and safetensors reads agree. */
static void test_experts(void) {
  const int64_t shape[3] = {4, 6, 3};
  float global[72], back[72], local[72], want[72];
  for (int i = 0; i < 72; i++) global[i] = (float)i * 0.5f + 1.0f;
  RtStTensor t = {.name = "w", .rank = 3, .data = global};
  memcpy(t.shape, shape, sizeof shape);
  CHECK_OK(rt_st_write("shard_experts.safetensors", &t, 1, NULL, 0));
  RtSt *st = NULL;
  CHECK_OK(rt_st_open(&st, "shard_experts.safetensors"));
  for (int dim = 1; dim <= 2; dim++)
    for (int ep = 2; ep <= 4; ep += 2)
      for (int tp = 1; tp <= 3; tp++) {
        if (shape[dim] % tp) continue;
        int owners[72] = {0};
        fill_sentinel(back, 72);
        for (int e = 0; e < ep; e++)
          for (int c = 0; c < tp; c++) {
            RtShard sh = {dim, tp, 1, c, 0, ep, e};
            int64_t ls[3], le = 4 / ep, b = shape[dim] / tp, n = 0;
            CHECK_OK(rt_shard_local_shape(3, shape, &sh, ls));
            CHECK(ls[0] == le && ls[dim] == b && ls[3 - dim] == shape[3 - dim]);
            CHECK(rt_shard_numel(3, shape, &sh) == 72 / ep / tp);
            for (int64_t x = 0; x < le; x++) /* expected, in local row-major order */
              for (int64_t y = 0; y < ls[1]; y++)
                for (int64_t z = 0; z < ls[2]; z++) {
                  int64_t gy = dim == 1 ? c * b + y : y, gz = dim == 2 ? c * b + z : z;
                  int64_t gi = ((e * le + x) * 6 + gy) * 3 + gz;
                  CHECK(rt_shard_global_index(3, shape, &sh, n) == gi);
                  want[n++] = global[gi];
                  owners[gi]++;
                }
            CHECK_OK(rt_shard_extract(global, local, 3, shape, &sh));
            CHECK(memcmp(local, want, sizeof(float) * (size_t)n) == 0);
            CHECK_OK(rt_shard_insert(back, local, 3, shape, &sh));
            fill_sentinel(local, 72);
            if (st) CHECK_OK(rt_st_read_shard(st, "w", local, 3, shape, &sh));
            CHECK(memcmp(local, want, sizeof(float) * (size_t)n) == 0);
            CHECK_OK(rt_shard_init_normal(local, 7, 3, 0.5f, 3, shape, &sh));
            for (int64_t L = 0; L < n; L++)
              CHECK(local[L] == 0.5f * rt_rng_normal(7, 3,
                                                     (uint64_t)rt_shard_global_index(3, shape,
                                                                                     &sh, L)));
          }
        for (int i = 0; i < 72; i++) CHECK(owners[i] == 1);
        CHECK(memcmp(back, global, sizeof back) == 0);
      }
  rt_st_close(st);
}

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    void (*fn)(void);
  } cases[] = {{"index", test_index},       {"init", test_init},
               {"roundtrip", test_roundtrip}, {"gpt2", test_gpt2},
               {"safetensors", test_safetensors}, {"errors", test_errors},
               {"padded", test_padded}, {"experts", test_experts}};
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  int ran = 0;
  for (int i = 0; i < ncases; i++)
    if (argc < 2 || !strcmp(argv[1], cases[i].name)) {
      cases[i].fn();
      ran++;
    }
  if (!ran) {
    fprintf(stderr, "shard_test: unknown case '%s'\n", argv[1]);
    return 2;
  }
  return check_result("shard_test");
}
