/* tests/cuda/cu_split.c -- the split reductions of the CUDA lowering
 * (codegen/kir_cuda.h: ROW_SPLIT, COL_TILE) on kernels built here: which
 * kernels get them (and which must not), their parts and chunks, and what
 * their source must say.  Writes DIR/kernels.cu and DIR/kernels_cuda.h,
 * which split_emu.sh runs on the CPU (cu_split_emu.cpp, the same kernels by
 * name) and nvcc.sh compiles.  No GPU and no nvcc needed here.
 *
 *   cu_split DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kir_cuda.h"
#include "tests/cuda/cu_test.h"

static KirVal C(KirKernel *k, int64_t v) { return kir_iconst(k, v); }

/* out[0] = sum_c x[c]^2 over 100000 columns: the gradient norm's sumsq */
static void sumsq(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "sumsq");
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  kir_loop(k, C(k, 100000));
  KirVal v = kir_load(k, x, kir_col(k));
  KirVal s = kir_reduce(k, KIR_SUM, kir_mul(k, v, v));
  kir_end(k);
  kir_store(k, out, C(k, 0), s);
}

/* rows [3] of 50001 (no float4): v = x[r, c] * scale[r]; out[r] = (max v,
 * min v), acc[r] += sum v.  A row-level load before the loop, three
 * reductions, a read-modify-write epilogue. */
static void rowstats(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "rowstats");
  kir_row_dim(k, 3);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), scale = kir_buf(k, "scale", KIR_F32, KIR_IN);
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), acc = kir_buf(k, "acc", KIR_F32, KIR_INOUT);
  KirVal r = kir_row(k, 0), sc = kir_load(k, scale, r);
  KirVal base = kir_mul(k, r, C(k, 50001));
  kir_loop(k, C(k, 50001));
  KirVal v = kir_mul(k, kir_load(k, x, kir_add(k, base, kir_col(k))), sc);
  KirVal mx = kir_reduce(k, KIR_MAX, v), mn = kir_reduce(k, KIR_MIN, v), s = kir_reduce(k, KIR_SUM, v);
  kir_end(k);
  KirVal o = kir_mul(k, r, C(k, 2));
  kir_store(k, out, o, mx);
  kir_store(k, out, kir_add(k, o, C(k, 1)), mn);
  kir_store(k, acc, r, kir_add(k, kir_load(k, acc, r), s));
}

/* db[r] += sum_c dy[c * 200 + r]: sum_to over the leading rows (bias gradient) */
static void colsum(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "colsum");
  kir_row_dim(k, 200);
  int dy = kir_buf(k, "dy", KIR_F32, KIR_IN), db = kir_buf(k, "db", KIR_F32, KIR_INOUT);
  KirVal r = kir_row(k, 0);
  kir_loop(k, C(k, 4096));
  KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, dy, kir_add(k, kir_mul(k, kir_col(k), C(k, 200)), r)));
  kir_end(k);
  kir_store(k, db, r, kir_add(k, kir_load(k, db, r), s));
}

/* rows [2, 40], loop 300: x[c * 80 + r0 * 40 + r1]; out[row] = (max, sum) */
static void colstats(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "colstats");
  kir_row_dim(k, 2);
  kir_row_dim(k, 40);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), out = kir_buf(k, "out", KIR_F32, KIR_OUT);
  KirVal row = kir_add(k, kir_mul(k, kir_row(k, 0), C(k, 40)), kir_row(k, 1));
  kir_loop(k, C(k, 300));
  KirVal v = kir_load(k, x, kir_add(k, kir_mul(k, kir_col(k), C(k, 80)), row));
  KirVal mx = kir_reduce(k, KIR_MAX, v), s = kir_reduce(k, KIR_SUM, v);
  kir_end(k);
  KirVal o = kir_mul(k, row, C(k, 2));
  kir_store(k, out, o, mx);
  kir_store(k, out, kir_add(k, o, C(k, 1)), s);
}

/* out[r] = 2 sum_c x[c * 5000 + r], loop of 3: tiles without a split */
static void colshort(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "colshort");
  kir_row_dim(k, 5000);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), out = kir_buf(k, "out", KIR_F32, KIR_OUT);
  KirVal r = kir_row(k, 0);
  kir_loop(k, C(k, 3));
  KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, x, kir_add(k, kir_mul(k, kir_col(k), C(k, 5000)), r)));
  kir_end(k);
  kir_store(k, out, r, kir_mul(k, s, kir_fconst(k, 2.0f)));
}

/* out[r] = sum_c x[c * R + r + off] * (scale_by_row ? r : 1), rows [R], loop E:
 * column tiles whose VEC instantiation (4 rows a lane) applies only where
 * the row is read through a load's index alone, at a multiple of 4 */
static void coltile(KirModule *m, const char *name, int64_t R, int64_t E, int64_t off,
                    int scale_by_row) {
  KirKernel *k = kir_kernel_new(m, name);
  kir_row_dim(k, R);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), out = kir_buf(k, "out", KIR_F32, KIR_OUT);
  KirVal r = kir_row(k, 0), rf = kir_itof(k, r);
  kir_loop(k, C(k, E));
  KirVal v = kir_load(k, x, kir_add(k, kir_add(k, kir_mul(k, kir_col(k), C(k, R)), r), C(k, off)));
  KirVal s = kir_reduce(k, KIR_SUM, scale_by_row ? kir_mul(k, v, rf) : v);
  kir_end(k);
  kir_store(k, out, r, s);
}

/* rows [R] of a concat: out[r, off_i + c] = a_i[r, c] (* 2 for the middle
 * one), parts of 1024, 6 and 2048 columns (the second not float4), as the
 * gradient buckets' concat; conflict: 0 none, 1 the middle part's range
 * overlaps the last's, 2 the last part reads what the first stores, 3 a
 * row-level load of out before the loops */
static void concat3(KirModule *m, const char *name, int64_t R, int conflict) {
  KirKernel *k = kir_kernel_new(m, name);
  kir_row_dim(k, R);
  const int64_t E[3] = {1024, 6, 2048}, W = 1024 + 6 + 2048;
  int64_t off[3] = {0, 1024, 1030};
  if (conflict == 1) off[1] = 1028;
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), a[3];
  for (int i = 0; i < 3; i++) {
    char nm[8];
    snprintf(nm, sizeof nm, "a%d", i);
    a[i] = kir_buf(k, nm, KIR_F32, KIR_IN);
  }
  KirVal r = kir_row(k, 0), base = kir_mul(k, r, C(k, W));
  KirVal first = conflict == 3 ? kir_load(k, out, base) : KIR_NONE;
  for (int i = 0; i < 3; i++) {
    kir_loop(k, C(k, E[i]));
    KirVal v = kir_load(k, a[i], kir_add(k, kir_mul(k, r, C(k, E[i])), kir_col(k)));
    if (i == 1) v = kir_mul(k, v, kir_fconst(k, 2.0f));
    if (i == 2 && conflict == 2) v = kir_add(k, v, kir_load(k, out, kir_add(k, base, kir_col(k))));
    if (i == 2 && conflict == 3) v = kir_add(k, v, first);
    kir_store(k, out, kir_add(k, base, kir_add(k, C(k, off[i]), kir_col(k))), v);
    kir_end(k);
  }
}

/* ---- kernels that must keep their mapping ---- */

/* out[0] = sum exp(x - max x): the second loop reads the first's reduction */
static void twoloop(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "twoloop");
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  kir_loop(k, C(k, 8192));
  KirVal mx = kir_reduce(k, KIR_MAX, kir_load(k, x, kir_col(k)));
  kir_end(k);
  kir_loop(k, C(k, 8192));
  KirVal s = kir_reduce(k, KIR_SUM, kir_exp(k, kir_sub(k, kir_load(k, x, kir_col(k)), mx)));
  kir_end(k);
  kir_store(k, out, C(k, 0), s);
}

/* y[c] = 2 x[c] and out[0] = sum x: a store in the loop */
static void loopstore(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "loopstore");
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  int y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  kir_loop(k, C(k, 8192));
  KirVal v = kir_load(k, x, kir_col(k));
  kir_store(k, y, kir_col(k), kir_add(k, v, v));
  KirVal s = kir_reduce(k, KIR_SUM, v);
  kir_end(k);
  kir_store(k, out, C(k, 0), s);
}

/* rows [R] of E, row-major (row stride E): a row-sum */
static void rowsum(KirModule *m, const char *name, int64_t R, int64_t E) {
  KirKernel *k = kir_kernel_new(m, name);
  kir_row_dim(k, R);
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  KirVal r = kir_row(k, 0);
  kir_loop(k, C(k, E));
  KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, x, kir_add(k, kir_mul(k, r, C(k, E)), kir_col(k))));
  kir_end(k);
  kir_store(k, out, r, s);
}

/* rows [R] of E, row-major: mean = sum_c x / E; y[r, c] = x - mean; out[r] =
 * sum_c (x - mean)^2.  A norm's shape: a reduction the next loop reads, a
 * loop that stores and reduces */
static void rowcenter(KirModule *m, const char *name, int64_t R, int64_t E) {
  KirKernel *k = kir_kernel_new(m, name);
  kir_row_dim(k, R);
  int out = kir_buf(k, "out", KIR_F32, KIR_OUT), x = kir_buf(k, "x", KIR_F32, KIR_IN);
  int y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  KirVal base = kir_mul(k, kir_row(k, 0), C(k, E));
  kir_loop(k, C(k, E));
  KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, x, kir_add(k, base, kir_col(k))));
  kir_end(k);
  KirVal mean = kir_div(k, s, kir_fconst(k, (float)E));
  kir_loop(k, C(k, E));
  KirVal i = kir_add(k, base, kir_col(k));
  KirVal d = kir_sub(k, kir_load(k, x, i), mean);
  kir_store(k, y, i, d);
  KirVal q = kir_reduce(k, KIR_SUM, kir_mul(k, d, d));
  kir_end(k);
  kir_store(k, out, kir_row(k, 0), q);
}

/* acc[r, c] += 2 x[r, c] over rows [6] of 1000: elementwise (flat, float4),
 * for the batched form (kir_cuda.h, NAME_multi) */
static void axpy(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "axpy");
  kir_row_dim(k, 6);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), acc = kir_buf(k, "acc", KIR_F32, KIR_INOUT);
  KirVal r = kir_row(k, 0);
  kir_loop(k, C(k, 1000));
  KirVal i = kir_add(k, kir_mul(k, r, C(k, 1000)), kir_col(k));
  KirVal v = kir_load(k, x, i);
  kir_store(k, acc, i, kir_add(k, kir_load(k, acc, i), kir_add(k, v, v)));
  kir_end(k);
}

static KirCudaLaunch plan_of(KirModule *m, const char *name) {
  KirCudaLaunch L;
  memset(&L, 0, sizeof L);
  for (int i = 0; i < m->nkernels; i++)
    if (!strcmp(m->kernels[i]->name, name)) kir_cuda_plan(m->kernels[i], &L);
  return L;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cu_split DIR\n");
    return 2;
  }
  KirModule *m = kir_module_new();
  sumsq(m);
  rowstats(m);
  colsum(m);
  colstats(m);
  colshort(m);
  twoloop(m);
  loopstore(m);
  rowsum(m, "rowsum_4095", 1, 4095);   /* below the loop threshold */
  rowsum(m, "rowsum_4096", 31, 4096);  /* at it, 31 rows */
  rowsum(m, "rowsum_32", 32, 8192);    /* 32 rows: enough rows */
  /* row groups of 256 over a few passes: unrolled whole (a pass of every lane
   * at 768 columns; the last pass partial at 700; float4 rows at both, not at 701) */
  rowsum(m, "rowsum_768", 8, 768);
  rowsum(m, "rowsum_700", 5, 700);
  rowsum(m, "rowsum_701", 3, 701);
  /* from 1024 rows, narrower groups over up to 8 passes: a warp per row of 768
   * float4 columns (6 passes), 128 threads per row of 701 single columns (6) */
  rowcenter(m, "rowcenter_1024x768", 1024, 768);
  rowcenter(m, "rowcenter_1024x701", 1024, 701);
  rowcenter(m, "rowcenter_1023x768", 1023, 768);
  coltile(m, "colrowval", 36, 500, 0, 1); /* the row's value in the loop: a row a lane */
  coltile(m, "coloffset", 40, 300, 2, 0); /* a load 2 past a multiple of 4 */
  coltile(m, "colodd", 38, 300, 0, 0);    /* rows not a multiple of 4 */
  coltile(m, "colwide", 768, 8192, 0, 0); /* parts for 6 tiles of 128 rows */
  concat3(m, "concat3", 3, 0);               /* LOOPS */
  concat3(m, "concat3_overlap", 3, 1);       /* ranges that overlap: a row group */
  concat3(m, "concat3_reads", 3, 2);         /* a loop reading another's stores */
  concat3(m, "concat3_rowload", 3, 3);       /* a row-level load of what loops store */
  concat3(m, "concat3_rows", 256, 0);        /* rows enough for a block a row */
  axpy(m);
  char err[512], cu[4096], h[4096];
  CHECK(!kir_verify(m, err, sizeof err), "%s", err);
  snprintf(cu, sizeof cu, "%s/kernels.cu", argv[1]);
  snprintf(h, sizeof h, "%s/kernels_cuda.h", argv[1]);
  /* batched forms (kir_cuda.h, NAME_multi): a row group, column tiles without
   * a split, a loop that stores, a flat one, flat over loops, and the split
   * ones (ROW_SPLIT, COL_TILE with parts), each instance on its share of the
   * lane */
  const char *batched[] = {"rowsum_768", "colshort", "loopstore", "axpy", "sumsq", "colsum",
                           "concat3"};
  unsigned char *multi = calloc((size_t)m->nkernels, 1);
  for (int i = 0; i < m->nkernels; i++)
    for (size_t j = 0; j < sizeof batched / sizeof *batched; j++)
      multi[i] |= !strcmp(m->kernels[i]->name, batched[j]);
  CHECK(!kir_cuda_write_multi(m, multi, cu, h, err, sizeof err), "%s", err);
  free(multi);
  char *text = cu_slurp(cu), *hdr = cu_slurp(h);
  if (!text || !hdr) {
    fprintf(stderr, "cu_split: cannot read back %s\n", cu);
    return 1;
  }

  /* sumsq: 100000 / 1024 blocks rounds up to the 2048-column minimum: 49 parts */
  KirCudaLaunch L = plan_of(m, "sumsq");
  CHECK(L.mapping == KIR_CUDA_ROW_SPLIT && L.vector && L.block_threads == 256 && L.parts == 49 &&
            L.chunk == 2048,
        "sumsq plan %d parts %lld chunk %lld", (int)L.mapping, (long long)L.parts, (long long)L.chunk);
  char *s = cu_section(text, "sumsq");
  CHECK(strstr(s, "mapping: split rows, 49 blocks of 256 threads per row, each over 2048") &&
            strstr(s, "template <bool VEC>") && strstr(s, "int64_t row_end, int slot_)") &&
            strstr(s, "const int slot_ = kcu_lane(stream);") &&
            strstr(s, "(row_end - row_begin) * (slot_ >= 0 ? 49 : 1)") &&
            strstr(s, "cb_ = cbeg_ + (int64_t)W_ * lane_; cb_ < cend_;") &&
            strstr(s, "kcu_row_sum<256>(a") && strstr(s, "kcu_split_sum<256>(pp_, parts_, red_f_)") &&
            strstr(s, "if (!kcu_split_last(&kcount_[r_], parts_, &last_)) return;") &&
            strstr(s, "<true><<<grid_, 256, 0, stream>>>(out, x, row_begin, row_end, slot_);"),
        "sumsq source:\n%s", s);
  free(s);

  L = plan_of(m, "rowstats");  /* 1024 / 3 blocks: 2048-column chunks, 25 parts */
  CHECK(L.mapping == KIR_CUDA_ROW_SPLIT && !L.vector && L.parts == 25 && L.chunk == 2048,
        "rowstats plan %d parts %lld chunk %lld", (int)L.mapping, (long long)L.parts,
        (long long)L.chunk);
  s = cu_section(text, "rowstats");
  CHECK(strstr(s, "kcu_row_key<256, true>(") && strstr(s, "kcu_row_key<256, false>(") &&
            strstr(s, "kcu_split_key<256, true>(pp_, parts_, red_k_)") &&
            strstr(s, "kcu_split_key<256, false>(pp_ + 3 * parts_, parts_, red_k_)") &&
            strstr(s, "kcu_split_sum<256>(pp_ + 6 * parts_, parts_, red_f_)") &&
            strstr(s, "= __int_as_float(t") && strstr(s, "if (lane_ == 0) {\n") &&
            !strstr(s, "template"),
        "rowstats source:\n%s", s);
  free(s);

  /* 7 tiles, 4096 / 64 = 64 parts of 64 columns; 200 rows: 4 rows a lane in
   * the VEC instantiation, dy read 4 rows at once at the lane's first row */
  L = plan_of(m, "colsum");
  CHECK(L.mapping == KIR_CUDA_COL_TILE && L.vector && L.block_threads == 256 && L.parts == 64 &&
            L.chunk == 64,
        "colsum plan %d parts %lld chunk %lld", (int)L.mapping, (long long)L.parts, (long long)L.chunk);
  s = cu_section(text, "colsum");
  CHECK(strstr(s, "mapping: column tiles") && strstr(s, "template <bool VEC>") &&
            strstr(s, "constexpr int V_ = VEC ? 4 : 1;") &&
            strstr(s, "const int64_t rt_ = row_begin + tile_ * (32 * V_) + (int64_t)tx_ * V_;") &&
            strstr(s, "const int64_t r0_ = in_ ? rt_ : row_end - V_;") &&
            strstr(s, "for (int64_t c0_ = cbeg_ + ty_; c0_ < cend_; c0_ += 8)") &&
            strstr(s, "kcu_ldg<V_>(l") && strstr(s, "for (int j_ = 0; j_ < V_; j_++)") &&
            strstr(s, "kcu_tile_sum<V_>(a") && strstr(s, "pp_[part_ * 200 + j_] = t") &&
            strstr(s, "kcu_tile_split_sum<V_>(pp_, parts_, 200, t") &&
            strstr(s, "if (!kcu_split_last(&kcount_[tile_], parts_, &last_)) continue;") &&
            strstr(s, "if (ty_ == 0 && in_) {\n") && strstr(s, "const int64_t r_ = r0_ + j_;") &&
            strstr(s, "kcu_aligned16(dy) && row_begin % 4 == 0 && row_end % 4 == 0;") &&
            strstr(s, "(row_end - row_begin + (vec_ ? 127 : 31)) / (vec_ ? 128 : 32)") &&
            strstr(s, "(unsigned)(tiles_ * 64) : kcu_grid(tiles_, 1)"),
        "colsum source:\n%s", s);
  free(s);

  L = plan_of(m, "colstats");  /* 3 tiles, 300 / 64 = 4 parts of 80; rows [2, 40]: VEC */
  CHECK(L.mapping == KIR_CUDA_COL_TILE && L.vector && L.parts == 4 && L.chunk == 80,
        "colstats plan %d parts %lld chunk %lld", (int)L.mapping, (long long)L.parts,
        (long long)L.chunk);
  s = cu_section(text, "colstats");
  CHECK(strstr(s, "kcu_tile_key<true, V_>(a") &&
            strstr(s, "kcu_tile_split_key<true, V_>(pp_, parts_, 80, t") &&
            strstr(s, "kcu_tile_split_sum<V_>(pp_ + 1 * parts_ * 80, parts_, 80, t") &&
            strstr(s, "pp_[(1 * parts_ + part_) * 80 + j_] = t"),
        "colstats source:\n%s", s);
  free(s);

  L = plan_of(m, "colshort");  /* a loop of 3: tiles, not split */
  CHECK(L.mapping == KIR_CUDA_COL_TILE && L.parts == 1 && L.vector, "colshort plan %d parts %lld",
        (int)L.mapping, (long long)L.parts);
  s = cu_section(text, "colshort");
  CHECK(!strstr(s, "slot_") && !strstr(s, "kcu_split") &&
            strstr(s, "for (int64_t tile_ = blockIdx.x; tile_ < tiles_; tile_ += gridDim.x)") &&
            strstr(s, "kcu_grid((row_end - row_begin + (vec_ ? 127 : 31)) / (vec_ ? 128 : 32), 1)"),
        "colshort source:\n%s", s);
  free(s);

  /* a row a lane: the row's value read in the loop, a load 2 past a multiple
   * of 4, 38 rows; the same kernels' text then has V_ 1, no template */
  const char *scalar[] = {"colrowval", "coloffset", "colodd"};
  for (size_t i = 0; i < sizeof scalar / sizeof *scalar; i++) {
    L = plan_of(m, scalar[i]);
    CHECK(L.mapping == KIR_CUDA_COL_TILE && !L.vector, "%s plan %d vector %d", scalar[i],
          (int)L.mapping, L.vector);
    s = cu_section(text, scalar[i]);
    CHECK(strstr(s, "constexpr int V_ = 1;") && !strstr(s, "template <bool VEC>") &&
              !strstr(s, "kcu_ldg<V_>"),
          "%s source:\n%s", scalar[i], s);
    free(s);
  }
  /* 768 rows of 8192: 6 tiles of 128 rows, so 1024 / 6 blocks a tile at most,
   * 8192 / 64 and 65536 / 768 partials: 85, chunks of 104 columns, 79 parts
   * (tiles of 32 rows would have asked for 43) */
  L = plan_of(m, "colwide");
  CHECK(L.mapping == KIR_CUDA_COL_TILE && L.vector && L.parts == 79 && L.chunk == 104,
        "colwide plan %d vector %d parts %lld chunk %lld", (int)L.mapping, L.vector,
        (long long)L.parts, (long long)L.chunk);

  /* LOOPS: 3 rows of three independent loops, a grid-stride over every
   * loop's steps (the 6-column loop a column a step, the others 4 under VEC) */
  L = plan_of(m, "concat3");
  CHECK(L.mapping == KIR_CUDA_LOOPS && L.vector && L.block_threads == 256 && L.parts == 1,
        "concat3 plan %d vector %d", (int)L.mapping, L.vector);
  s = cu_section(text, "concat3");
  CHECK(strstr(s, "mapping: flat over every loop") &&
            strstr(s, "constexpr int64_t at0_ = 0, at1_ = at0_ + 1024 / W_, at2_ = at1_ + 6, "
                      "at3_ = at2_ + 2048 / W_;") &&
            strstr(s, "const int64_t q_ = u_ % at3_;") && strstr(s, "if (q_ < at1_) {") &&
            strstr(s, "} else if (q_ < at2_) {") && strstr(s, "} else {") &&
            strstr(s, "const int64_t c1_ = q_ - at1_;") &&
            strstr(s, "const int64_t cb_ = (q_ - at2_) * W_;") &&
            strstr(s, "kcu_grid((row_end - row_begin) * (vec_ ? 774 : 3078), 256)"),
        "concat3 source:\n%s", s);
  free(s);
  CHECK(strstr(hdr, "] = 3; loops */\nvoid concat3_launch("), "header mapping name:\n%s", hdr);
  const char *grouped[] = {"concat3_overlap", "concat3_reads", "concat3_rowload", "concat3_rows"};
  for (size_t i = 0; i < sizeof grouped / sizeof *grouped; i++) {
    L = plan_of(m, grouped[i]);
    CHECK(L.mapping == (i == 1 ? KIR_CUDA_THREAD_ROW : KIR_CUDA_ROW_GROUP),
          "%s: mapping %d (a row group; a thread a row where a loop reads out elsewhere)", grouped[i],
          (int)L.mapping);
  }

  const char *keep[] = {"twoloop", "loopstore", "rowsum_4095", "rowsum_32"};
  for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
    L = plan_of(m, keep[i]);
    CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.parts == 1, "%s must stay row_group (%d)", keep[i],
          (int)L.mapping);
    s = cu_section(text, keep[i]);
    CHECK(!strstr(s, "slot_") && !strstr(s, "kcu_split"), "%s source:\n%s", keep[i], s);
    free(s);
  }
  /* a constant loop of at most 8 passes of the group (of its float4 columns): a
   * trip count nvcc sees, the partial last pass guarded (rowsum_4095: 16 passes
   * of single columns, a loop to the extent) */
  s = cu_section(text, "rowsum_4095");
  CHECK(!strstr(s, "pass_") && strstr(s, "c0_ < 4095; c0_ += 256)"),
        "rowsum_4095 source:\n%s", s);
  free(s);
  s = cu_section(text, "rowsum_768");
  CHECK(strstr(s, "constexpr int N_ = (768 + W_ * 256 - 1) / (W_ * 256);") &&
            strstr(s, "#pragma unroll (N_ <= 8 ? N_ : 4)\n      for (int pass_ = 0; pass_ < N_; pass_++) {") &&
            strstr(s, "const int64_t cb_ = (int64_t)W_ * lane_ + (int64_t)pass_ * (W_ * 256);") &&
            strstr(s, "if (768 % (W_ * 256) != 0 && cb_ >= 768) break;"),
        "rowsum_768 source:\n%s", s);
  free(s);
  /* 8192 float4 columns: 8 passes of 1024 (the single-column fallback's 32 by 4) */
  s = cu_section(text, "rowsum_32");
  CHECK(strstr(s, "constexpr int N_ = (8192 + W_ * 256 - 1) / (W_ * 256);") &&
            strstr(s, "#pragma unroll (N_ <= 8 ? N_ : 4)"),
        "rowsum_32 source:\n%s", s);
  free(s);
  L = plan_of(m, "rowsum_701");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 256 && !L.vector, "rowsum_701 plan");
  s = cu_section(text, "rowsum_701");
  CHECK(strstr(s, "for (int pass_ = 0; pass_ < 3; pass_++) {") &&
            strstr(s, "const int64_t c0_ = lane_ + (int64_t)pass_ * 256;") &&
            strstr(s, "if (c0_ >= 701) break;"),
        "rowsum_701 source:\n%s", s);
  free(s);
  L = plan_of(m, "rowcenter_1024x768");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 32 && L.block_threads == 256 &&
            L.vector,
        "rowcenter_1024x768 plan %d threads %d", (int)L.mapping, L.row_threads);
  s = cu_section(text, "rowcenter_1024x768");
  CHECK(strstr(s, "mapping: one warp per row, 8 rows per 256-thread block") &&
            strstr(s, "constexpr int N_ = (768 + W_ * 32 - 1) / (W_ * 32);") &&
            strstr(s, "kcu_row_sum<32>(a") && !strstr(s, "__shared__") &&
            !strstr(s, "__syncthreads"),
        "rowcenter_1024x768 source:\n%s", s);
  free(s);
  L = plan_of(m, "rowcenter_1024x701");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 128 && L.block_threads == 128 &&
            !L.vector,
        "rowcenter_1024x701 plan %d threads %d", (int)L.mapping, L.row_threads);
  s = cu_section(text, "rowcenter_1024x701");
  CHECK(strstr(s, "for (int pass_ = 0; pass_ < 6; pass_++) {") &&
            strstr(s, "const int64_t c0_ = lane_ + (int64_t)pass_ * 128;") &&
            strstr(s, "if (c0_ >= 701) break;") && strstr(s, "kcu_row_sum<128>(a"),
        "rowcenter_1024x701 source:\n%s", s);
  free(s);
  L = plan_of(m, "rowcenter_1023x768");  /* below 1024 rows: one pass of a block */
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 256 && L.vector,
        "rowcenter_1023x768 plan %d threads %d", (int)L.mapping, L.row_threads);
  L = plan_of(m, "rowsum_4096");  /* 1024 / 31 = 33 blocks: 2048-column chunks */
  CHECK(L.mapping == KIR_CUDA_ROW_SPLIT && L.parts == 2 && L.chunk == 2048, "rowsum_4096 plan %d %lld",
        (int)L.mapping, (long long)L.parts);

  /* the batched forms: a struct of argument arrays in the header, the body
   * again with the params from instance blockIdx.y's entries */
  for (size_t j = 0; j < sizeof batched / sizeof *batched; j++) {
    char want[256];
    snprintf(want, sizeof want, "} %s_multi_t;\nvoid %s_multi_launch(const %s_multi_t *a, int count",
             batched[j], batched[j], batched[j]);
    CHECK(strstr(hdr, want), "header: no %s_multi:\n%s", batched[j], hdr);
    s = cu_section(text, batched[j]);
    snprintf(want, sizeof want, "%s_multi(const %s_multi_t a_, int64_t row_begin", batched[j],
             batched[j]);
    CHECK(strstr(s, want) && strstr(s, "const dim3 grid2_(grid_, (unsigned)count);"),
          "%s source:\n%s", batched[j], s);
    free(s);
  }
  s = cu_section(text, "axpy");
  CHECK(strstr(s, "const float *__restrict__ const x = a_.x[blockIdx.y];") &&
            strstr(s, "float *__restrict__ const acc = a_.acc[blockIdx.y];") &&
            strstr(s, "nvec_ += kcu_aligned16(a->x[i_]) && kcu_aligned16(a->acc[i_]);") &&
            strstr(s, "axpy_launch(a->x[i_], a->acc[i_], row_begin, row_end, stream);"),
        "axpy's batched form:\n%s", s);
  free(s);
  CHECK(strstr(hdr, "  const float *x[64];\n  float *acc[64];\n} axpy_multi_t;"),
        "axpy_multi_t:\n%s", hdr);
  /* the split ones: instance blockIdx.y's share of the lane (sumsq: 49 parts of
   * one row, a counter; colsum: 64 parts of 200 rows, 7 tile counters), a
   * launch each where the stream has no lane; as many instances as shares
   * fit the lane (colsum: 65536 / 12800 = 5) */
  s = cu_section(text, "sumsq");
  CHECK(strstr(s, "sumsq_multi(const sumsq_multi_t a_, int64_t row_begin, int64_t row_end, int slot_)") &&
            strstr(s, "float *const kpart_ = kcu_part_[slot_] + (int64_t)blockIdx.y * 49;") &&
            strstr(s, "unsigned *const kcount_ = kcu_count_[slot_] + blockIdx.y * 1;") &&
            strstr(s, "if (slot_ < 0) {\n    for (int i_ = 0; i_ < count; i_++)\n      sumsq_launch(") &&
            strstr(s, "float *const kpart_ = kcu_part_[slot_ >= 0 ? slot_ : 0];"),
        "sumsq's batched form:\n%s", s);
  free(s);
  s = cu_section(text, "colsum");
  CHECK(strstr(s, "float *const kpart_ = kcu_part_[slot_] + (int64_t)blockIdx.y * 12800;") &&
            strstr(s, "unsigned *const kcount_ = kcu_count_[slot_] + blockIdx.y * 7;") &&
            strstr(s, "up to 5 instances of colsum"),
        "colsum's batched form:\n%s", s);
  free(s);

  /* the scratch and its helpers, once; the header names the mappings */
  CHECK(strstr(text, "static __device__ float kcu_part_[KCU_LANES][KCU_LANE_PARTS];") &&
            strstr(text, "static int kcu_lane(cudaStream_t s)") &&
            strstr(text, "__device__ __forceinline__ void kcu_tile_sum(const float (&v)[V]"),
        "split prelude missing");
  CHECK(strstr(hdr, "] = 1; row_split */\nvoid sumsq_launch(") &&
            strstr(hdr, "] = 200; col_tile */\nvoid colsum_launch("),
        "header mapping names:\n%s", hdr);

  /* no split kernel, no split prelude */
  KirModule *plain = kir_module_new();
  twoloop(plain);
  char cu2[4096];
  snprintf(cu2, sizeof cu2, "%s/plain.cu", argv[1]);
  CHECK(!kir_cuda_write(plain, cu2, NULL, err, sizeof err), "%s", err);
  char *t2 = cu_slurp(cu2);
  CHECK(t2 && !strstr(t2, "kcu_part_") && !strstr(t2, "kcu_tile_sum") && !strstr(t2, "<mutex>"),
        "a module without split kernels has the split prelude");
  free(t2);
  kir_module_free(plain);

  free(text);
  free(hdr);
  kir_module_free(m);
  if (failures) fprintf(stderr, "cu_split: %d failure(s)\n", failures);
  else printf("cu_split: ok (%s)\n", cu);
  return failures ? 1 : 0;
}
