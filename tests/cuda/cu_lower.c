/* tests/cuda/cu_lower.c -- the CUDA lowering (codegen/kir_cuda.h) on small
 * kernels built here: the mapping each gets, and what its source must say
 * (float4 accesses and their alignment check, group reductions, barriers,
 * leader-only row stores, renamed params, exact constants), plus
 * determinism and name errors.  No GPU and no nvcc needed: nvcc.sh compiles
 * the same forms (tests/kir's kernels) and whole models.
 *
 *   cu_lower DIR      (scratch files go to DIR) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kir_cuda.h"
#include "tests/cuda/cu_test.h"

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

/* y[r, c] = x[r, c] * x[r, c] + offset-shifted read when off != 0 */
static void pointwise(KirModule *m, const char *name, int64_t rows, int64_t cols, int64_t off) {
  KirKernel *k = kir_kernel_new(m, name);
  kir_row_dim(k, rows);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  KirVal base = kir_mul(k, kir_row(k, 0), kir_iconst(k, cols + off));
  kir_loop(k, kir_iconst(k, cols));
  KirVal i = kir_add(k, base, kir_col(k));
  KirVal v = kir_load(k, x, kir_add(k, i, kir_iconst(k, off)));
  kir_store(k, y, i, kir_mul(k, v, v));
  kir_end(k);
}

static void softmax(KirModule *m, const char *name, int64_t rows, int64_t cols) {
  KirKernel *k = kir_kernel_new(m, name);
  kir_row_dim(k, rows);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  KirVal base = kir_mul(k, kir_row(k, 0), kir_iconst(k, cols)), n = kir_iconst(k, cols);
  kir_loop(k, n);
  KirVal mx = kir_reduce(k, KIR_MAX, kir_load(k, x, kir_add(k, base, kir_col(k))));
  kir_end(k);
  kir_loop(k, n);
  KirVal i = kir_add(k, base, kir_col(k));
  KirVal e = kir_exp(k, kir_sub(k, kir_load(k, x, i), mx));
  kir_store(k, y, i, e);
  KirVal s = kir_reduce(k, KIR_SUM, e);
  kir_end(k);
  KirVal inv = kir_div(k, kir_fconst(k, 1.0f), s);
  kir_loop(k, n);
  i = kir_add(k, base, kir_col(k));
  kir_store(k, y, i, kir_mul(k, kir_load(k, y, i), inv));
  kir_end(k);
}

/* dw[r] += sum_c dy[c * R + r]: strided column sum, row-level read-modify-write */
static void colsum_rmw(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "colsum_rmw");
  kir_row_dim(k, 7);
  int dy = kir_buf(k, "dy", KIR_F32, KIR_IN), dw = kir_buf(k, "dw", KIR_F32, KIR_INOUT);
  KirVal r = kir_row(k, 0);
  kir_loop(k, kir_iconst(k, 13));
  KirVal s = kir_reduce(k, KIR_SUM, kir_load(k, dy, kir_add(k, kir_mul(k, kir_col(k), kir_iconst(k, 7)), r)));
  kir_end(k);
  kir_store(k, dw, r, kir_add(k, kir_load(k, dw, r), s));
}

/* y[c + 1] = 2 y[c]: iterations depend on each other (not parallel-safe) */
static void shift(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "shift");
  int y = kir_buf(k, "y", KIR_F32, KIR_INOUT);
  kir_loop(k, kir_iconst(k, 6));
  KirVal c = kir_col(k);
  kir_store(k, y, kir_add(k, c, kir_iconst(k, 1)), kir_mul(k, kir_load(k, y, c), kir_fconst(k, 2)));
  kir_end(k);
}

/* no loop; reserved param names; constants that need care */
static void noloop(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "noloop");
  kir_row_dim(k, 5);
  int in = kir_buf(k, "new", KIR_F32, KIR_IN), out = kir_buf(k, "x_", KIR_F32, KIR_OUT);
  int s = kir_scalar(k, "stream", KIR_TY_F32);
  KirVal r = kir_row(k, 0);
  KirVal v = kir_add(k, kir_load(k, in, r), kir_param(k, s));
  v = kir_add(k, kir_mul(k, v, kir_fconst(k, -0.0f)), kir_fconst(k, __builtin_inff()));
  v = kir_max(k, v, kir_fconst(k, __builtin_nanf("")));
  kir_store(k, out, r, kir_add(k, v, kir_fconst(k, 1e-5f)));
}

/* rows [2, T]: row t's extent is t + 1 (a row-dependent loop) */
static void causal(KirModule *m) {
  KirKernel *k = kir_kernel_new(m, "causal");
  kir_row_dim(k, 2);
  kir_row_dim(k, 8);
  int x = kir_buf(k, "x", KIR_F32, KIR_IN), y = kir_buf(k, "y", KIR_F32, KIR_OUT);
  KirVal t = kir_row(k, 1);
  KirVal base = kir_mul(k, kir_add(k, kir_mul(k, kir_row(k, 0), kir_iconst(k, 8)), t), kir_iconst(k, 8));
  kir_loop(k, kir_add(k, t, kir_iconst(k, 1)));
  KirVal i = kir_add(k, base, kir_col(k));
  kir_store(k, y, i, kir_tanh(k, kir_log(k, kir_load(k, x, i))));
  kir_end(k);
}

static KirCudaLaunch plan_of(KirModule *m, const char *name) {
  KirCudaLaunch L = {0};
  for (int i = 0; i < m->nkernels; i++)
    if (!strcmp(m->kernels[i]->name, name)) kir_cuda_plan(m->kernels[i], &L);
  return L;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cu_lower DIR\n");
    return 2;
  }
  KirModule *m = kir_module_new();
  pointwise(m, "square_13_1000", 13, 1000, 0);
  pointwise(m, "square_13_7", 13, 7, 0);
  pointwise(m, "square_off1", 13, 1000, 1);
  softmax(m, "softmax_13_1000", 13, 1000);
  softmax(m, "softmax_13_7", 13, 7);
  colsum_rmw(m);
  shift(m);
  noloop(m);
  causal(m);
  char err[512], cu[4096], h[4096], cu2[4096];
  CHECK(!kir_verify(m, err, sizeof err), "%s", err);
  snprintf(cu, sizeof cu, "%s/lower.cu", argv[1]);
  snprintf(cu2, sizeof cu2, "%s/lower2.cu", argv[1]);
  snprintf(h, sizeof h, "%s/lower_cuda.h", argv[1]);
  CHECK(!kir_cuda_write(m, cu, h, err, sizeof err), "%s", err);
  CHECK(!kir_cuda_write(m, cu2, NULL, err, sizeof err), "%s", err);
  char *text = cu_slurp(cu), *text2 = cu_slurp(cu2), *hdr = cu_slurp(h);
  if (!text || !text2 || !hdr) {
    fprintf(stderr, "cu_lower: cannot read back %s\n", cu);
    return 1;
  }

  /* one __global__ and one launcher per kernel, prototypes in the header */
  CHECK(count(text, "__global__ void __launch_bounds__(") == m->nkernels, "kernels");
  for (int i = 0; i < m->nkernels; i++) {
    char want[256];
    snprintf(want, sizeof want, "extern \"C\" void %s_launch(", m->kernels[i]->name);
    CHECK(count(text, want) == 1, "%s", want);
    snprintf(want, sizeof want, "void %s_launch(", m->kernels[i]->name);
    CHECK(count(hdr, want) == 1, "header: %s", want);
  }
  /* determinism: the same module gives the same kernels (the header include aside) */
  const char *k1 = strstr(text, "/* ---- square_13_1000"), *k2 = strstr(text2, "/* ---- square_13_1000");
  CHECK(k1 && k2 && !strcmp(k1, k2), "kernels.cu differs between two writes");

  KirCudaLaunch L = plan_of(m, "square_13_1000");
  CHECK(L.mapping == KIR_CUDA_FLAT && L.vector && L.block_threads == 256, "square_13_1000 plan");
  char *s = cu_section(text, "square_13_1000");
  CHECK(strstr(s, "template <bool VEC>") && strstr(s, "kcu_ldg<W_>(l") &&
            strstr(s, "kcu_st<W_>(y + ") && strstr(s, "kcu_aligned16(x) && kcu_aligned16(y)") &&
            strstr(s, "<true><<<grid_, 256, 0, stream>>>") && strstr(s, "__fmul_rn("),
        "square_13_1000 source:\n%s", s);
  free(s);

  L = plan_of(m, "square_13_7");
  CHECK(L.mapping == KIR_CUDA_FLAT && !L.vector, "square_13_7 plan");
  s = cu_section(text, "square_13_7");
  CHECK(!strstr(s, "template") && strstr(s, "const int64_t c0_ = u_ % per_row_;") &&
            strstr(s, "kcu_grid((row_end - row_begin) * 7, 256)"),
        "square_13_7 source:\n%s", s);
  free(s);

  L = plan_of(m, "square_off1");  /* row * 1001 + col + 1: not 16-byte aligned */
  CHECK(L.mapping == KIR_CUDA_FLAT && !L.vector, "square_off1 must not use float4");

  L = plan_of(m, "softmax_13_1000");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 256 && L.block_threads == 256 &&
            L.vector,
        "softmax_13_1000 plan %d %d", (int)L.mapping, L.row_threads);
  s = cu_section(text, "softmax_13_1000");
  CHECK(strstr(s, "kcu_unkey(kcu_row_key<256, true>(") && strstr(s, "kcu_row_sum<256>(") &&
            strstr(s, "__shared__ float red_f_[8]") && strstr(s, "__shared__ int red_k_[8]") &&
            strstr(s, "kcu_exp(") && strstr(s, "kcu_key_max(") &&
            !strstr(s, "__syncthreads();\n"),  /* the reductions order the loops */
        "softmax_13_1000 source:\n%s", s);
  /* x read in loops 0 and 1 (ldg: read-only), y stored in 1 and read-modify-written in 2 */
  CHECK(count(s, "kcu_st<W_>(y + ") == 2 && count(s, "kcu_ldg<W_>(") == 2 &&
            count(s, "kcu_ld<W_>(") == 1,
        "softmax float4 accesses:\n%s", s);
  free(s);

  L = plan_of(m, "softmax_13_7");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 32 && L.block_threads == 256,
        "softmax_13_7 plan");
  s = cu_section(text, "softmax_13_7");
  /* one warp: shuffles are no memory barrier, so loop 2 waits on __syncwarp */
  CHECK(strstr(s, "kcu_row_sum<32>(a") && strstr(s, "nullptr") && count(s, "__syncwarp();") == 1 &&
            !strstr(s, "__shared__"),
        "softmax_13_7 source:\n%s", s);
  free(s);

  L = plan_of(m, "colsum_rmw");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && !L.vector, "colsum_rmw plan");
  s = cu_section(text, "colsum_rmw");
  const char *st = strstr(s, "if (lane_ == 0) dw[");
  const char *ld = strstr(s, "= dw[");
  const char *sy = ld ? strstr(ld, "__syncwarp();") : NULL;
  CHECK(st && ld && sy && ld < sy && sy < st, "colsum_rmw: load, barrier, leader store:\n%s", s);
  free(s);

  L = plan_of(m, "shift");
  CHECK(L.mapping == KIR_CUDA_THREAD_ROW && !L.vector, "shift must run sequentially");
  s = cu_section(text, "shift");
  CHECK(strstr(s, "for (int64_t c0_ = 0; c0_ < 6; c0_++)"), "shift source:\n%s", s);
  free(s);

  L = plan_of(m, "noloop");
  CHECK(L.mapping == KIR_CUDA_THREAD_ROW, "noloop plan");
  s = cu_section(text, "noloop");
  CHECK(strstr(s, "const float *__restrict__ p_new_") && strstr(s, "float *__restrict__ p_x__") &&
            strstr(s, "float p_stream_, int64_t row_begin") &&
            strstr(s, "cudaStream_t stream)") && strstr(s, "(-0.0f)") &&
            strstr(s, "__int_as_float(0x7f800000)") && strstr(s, "__int_as_float(0x7fc00000)") &&
            strstr(s, "9.99999975e-06f") && strstr(s, "kcu_fmax("),
        "noloop source:\n%s", s);
  free(s);

  L = plan_of(m, "causal");
  CHECK(L.mapping == KIR_CUDA_ROW_GROUP && L.row_threads == 256 && !L.vector, "causal plan");
  s = cu_section(text, "causal");
  CHECK(strstr(s, "row-dependent") && strstr(s, "kcu_tanh(kcu_log(") == NULL &&
            strstr(s, "kcu_log(") && strstr(s, "kcu_tanh(") && strstr(s, "r_ / 8") &&
            strstr(s, "r_ % 8"),
        "causal source:\n%s", s);
  free(s);

  /* names the source cannot use are errors, not silently bad code */
  KirModule *bad = kir_module_new();
  pointwise(bad, "kcu_grid", 2, 4, 0);
  CHECK(kir_cuda_write(bad, cu2, NULL, err, sizeof err) == -1 && strstr(err, "reserved"),
        "reserved kernel name: %s", err);
  kir_module_free(bad);
  bad = kir_module_new();
  pointwise(bad, "a", 2, 4, 0);
  pointwise(bad, "a_launch", 2, 4, 0);
  CHECK(kir_cuda_write(bad, cu2, NULL, err, sizeof err) == -1 && strstr(err, "launcher"),
        "launcher clash: %s", err);
  kir_module_free(bad);

  free(text);
  free(text2);
  free(hdr);
  kir_module_free(m);
  if (failures) fprintf(stderr, "cu_lower: %d failure(s)\n", failures);
  else printf("cu_lower: ok (%s)\n", cu);
  return failures ? 1 : 0;
}
