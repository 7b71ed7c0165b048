/* runtime/rt_attention.c -- flash-style sdpa and sdpa_grad on the CPU; see
 * rt_attention.h for the method, the layouts and the determinism argument.
 *
 * Every product between blocks (scores q k^T, p v, dy v^T, ds k, p^T dy, ds^T q)
 * goes through block_mm, a small register-tiled matrix product whose inner loop
 * runs along a row of the result, so the compiler vectorises it without
 * reassociating any sum: each element sums its terms in ascending order.  The
 * transposed operand of q k^T and dy v^T is copied once per key block (kt, vt). */
#include "runtime/rt_attention.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_err.h"
#include "runtime/rt_pool.h"
#include "runtime/rt_vmath.h"

#define BLK RT_SDPA_BLOCK

typedef struct {
  const float *q, *k, *v, *dy;
  float *out, *lse, *dqkv;
  const float *fout, *flse;  /* backward: the forward's out and lse, lse alone (with fd),
                                or both NULL (recomputed) */
  const float *fd;           /* backward: D per row (then fout is NULL, flse given) */
  int64_t B, H, KV, T, hd, nqb;
  float scale;
  int causal;
  unsigned layout; /* RT_SDPA_OUT_TOKENS, RT_SDPA_DY_TOKENS, RT_SDPA_QKV_TOKENS */
  atomic_int oom;  /* a chunk could not allocate its scratch */
} Attn;

/* Row t of channel ch in batch b of a tensor of C channels: head-major
 * [B, C, T, hd], or (tokens) token-major [B, T, C hd], whose rows are C hd
 * apart (attn_ld). */
static int64_t attn_row(int tokens, int64_t b, int64_t ch, int64_t C, int64_t t, int64_t T,
                        int64_t hd) {
  return (tokens ? (b * T + t) * C + ch : (b * C + ch) * T + t) * hd;
}
static int64_t attn_ld(int tokens, int64_t C, int64_t hd) { return tokens ? C * hd : hd; }

/* Row 0 of operand j's (0 q, 1 k, 2 v) head h (k, v: a kv head) in batch b,
 * and (attn_in_ld) the stride between the operands' rows: head-major, or the
 * packed [B, T, H + 2 KV, hd] of RT_SDPA_QKV_TOKENS, whose k heads follow q's
 * and v's k's (each pointer at the packed tensor's start). */
static const float *attn_in(const Attn *a, int j, int64_t b, int64_t h) {
  const float *base = j == 0 ? a->q : j == 1 ? a->k : a->v;
  if (a->layout & RT_SDPA_QKV_TOKENS)
    return base + attn_row(1, b, (j ? a->H + (j - 1) * a->KV : 0) + h, a->H + 2 * a->KV, 0, a->T,
                           a->hd);
  return base + attn_row(0, b, h, j ? a->KV : a->H, 0, a->T, a->hd);
}
static int64_t attn_in_ld(const Attn *a) {
  return attn_ld((a->layout & RT_SDPA_QKV_TOKENS) != 0, a->H + 2 * a->KV, a->hd);
}

/* One chunk's scratch: kt, vt [hd][BLK] (a key / value block transposed, columns
 * past the block zero); s, ds [BLK][BLK] (probabilities and their gradients); st
 * [BLK][BLK] (a transposed copy of either); o, dq [BLK][hd]; per query row m
 * (running max), l (running sum), lse and D (dy . o). */
typedef struct {
  float *kt, *vt, *s, *ds, *st, *o, *dq, *m, *l, *lse, *d;
  float *mem;
} Scratch;

static int scratch_new(Scratch *w, int64_t hd) {
  size_t blk = BLK, h = (size_t)hd;
  size_t n = 2 * h * blk + 3 * blk * blk + 2 * blk * h + 4 * blk;
  w->mem = calloc(n, sizeof(float));
  if (!w->mem) return 0;
  float *p = w->mem;
  w->kt = p, p += h * blk;
  w->vt = p, p += h * blk;
  w->s = p, p += blk * blk;
  w->ds = p, p += blk * blk;
  w->st = p, p += blk * blk;
  w->o = p, p += blk * h;
  w->dq = p, p += blk * h;
  w->m = p, p += blk;
  w->l = p, p += blk;
  w->lse = p, p += blk;
  w->d = p;
  return 1;
}

/* dst[c][r] = src[r][c] for r < rows, c < cols; dst rows are ldd apart.  Columns
 * [rows, ldd) of dst are zeroed, so a product over all ldd columns adds nothing. */
static void transpose(const float *src, int64_t rows, int64_t cols, int64_t lds, float *dst,
                      int64_t ldd) {
  for (int64_t c = 0; c < cols; c++) {
    for (int64_t r = 0; r < rows; r++) dst[c * ldd + r] = src[r * lds + c];
    for (int64_t r = rows; r < ldd; r++) dst[c * ldd + r] = 0;
  }
}

/* Rows [i0, i1) and columns [j0, j1) of block_mm's product, plainly. */
static void block_mm_edge(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k,
                          const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                          int64_t ldc, int acc) {
  for (int64_t i = i0; i < i1; i++) {
    float *c = C + i * ldc;
    if (!acc)
      for (int64_t j = j0; j < j1; j++) c[j] = 0.0f;
    for (int64_t p = 0; p < k; p++) {
      float a = A[i * lda + p];
      const float *b = B + p * ldb;
      for (int64_t j = j0; j < j1; j++) c[j] += a * b[j];
    }
  }
}

/* C[m][n] = (acc ? C : 0) + A[m][k] B[k][n] (row strides lda, ldb, ldc).  Every
 * element sums its k products in ascending order, one rounding per multiply and
 * per add (ISO C: no contraction into FMA), whichever path below computes it, so
 * results depend neither on the tiling nor on the instruction set.  Full TM x TN
 * tiles keep their accumulators in vector registers (GCC / Clang vector types);
 * edges take the plain loop.  On x86-64 an AVX2 copy of the kernel is chosen at
 * run time where the CPU has AVX2 (a plain check, not an ifunc: resolvers run
 * before sanitizer runtimes start). */
#define TM 4
#define TN 16
typedef float vf8 __attribute__((vector_size(32)));

/* Unaligned vector load and store (macros: a function returning a vector type
 * would have a different ABI in the AVX2 copy). */
#define LOAD8(v, p) memcpy(&(v), (p), sizeof(vf8))
#define STORE8(p, v) memcpy((p), &(v), sizeof(vf8))

static inline __attribute__((always_inline)) void block_mm_body(
    int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B, int64_t ldb,
    float *C, int64_t ldc, int acc) {
  int64_t i0 = 0;
  for (; i0 + TM <= m; i0 += TM) {
    int64_t j0 = 0;
    for (; j0 + TN <= n; j0 += TN) {
      vf8 c[TM][2], b0, b1;
      for (int i = 0; i < TM; i++) {
        float *cr = C + (i0 + i) * ldc + j0;
        c[i][0] = c[i][1] = (vf8){0};
        if (acc) LOAD8(c[i][0], cr), LOAD8(c[i][1], cr + 8);
      }
      const float *a = A + i0 * lda;
      for (int64_t p = 0; p < k; p++) {
        LOAD8(b0, B + p * ldb + j0);
        LOAD8(b1, B + p * ldb + j0 + 8);
        for (int i = 0; i < TM; i++) {
          vf8 ai = (vf8){0} + a[i * lda + p];
          c[i][0] += ai * b0;
          c[i][1] += ai * b1;
        }
      }
      for (int i = 0; i < TM; i++) {
        STORE8(C + (i0 + i) * ldc + j0, c[i][0]);
        STORE8(C + (i0 + i) * ldc + j0 + 8, c[i][1]);
      }
    }
    if (j0 < n) block_mm_edge(i0, i0 + TM, j0, n, k, A, lda, B, ldb, C, ldc, acc);
  }
  if (i0 < m) block_mm_edge(i0, m, 0, n, k, A, lda, B, ldb, C, ldc, acc);
}

#if defined(__x86_64__) && !defined(__AVX2__)
__attribute__((target("avx2"))) static void block_mm_avx2(
    int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B, int64_t ldb,
    float *C, int64_t ldc, int acc) {
  block_mm_body(m, n, k, A, lda, B, ldb, C, ldc, acc);
}

static atomic_int cpu_avx2 = -1;  /* -1: not asked yet */
#endif

static void block_mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
#if defined(__x86_64__) && !defined(__AVX2__)
  int avx2 = atomic_load_explicit(&cpu_avx2, memory_order_relaxed);
  if (avx2 < 0) {
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") != 0;
    atomic_store_explicit(&cpu_avx2, avx2, memory_order_relaxed);
  }
  if (avx2) {
    block_mm_avx2(m, n, k, A, lda, B, ldb, C, ldc, acc);
    return;
  }
#endif
  block_mm_body(m, n, k, A, lda, B, ldb, C, ldc, acc);
}

/* Keys row i sees inside key block [j0, j1): [j0, j0 + result). */
static int64_t visible(const Attn *a, int64_t i, int64_t j0, int64_t j1) {
  int64_t end = a->causal && i + 1 < j1 ? i + 1 : j1;
  return end > j0 ? end - j0 : 0;
}

/* The forward of query rows [i0, i1) of one head (qh: the head's [T, hd] rows; kh,
 * vh: its kv head's; rows attn_in_ld apart) with an online softmax over the
 * key blocks.  Leaves the normalised output rows in w->o, the row max in w->m
 * and the row sum of exp(s - m) in w->l. */
static void block_forward(const Attn *a, const float *qh, const float *kh, const float *vh,
                          int64_t i0, int64_t i1, Scratch *w) {
  int64_t hd = a->hd, nq = i1 - i0, kend = a->causal ? i1 : a->T, ld = attn_in_ld(a);
  for (int64_t r = 0; r < nq; r++) w->m[r] = -INFINITY, w->l[r] = 0;
  memset(w->o, 0, sizeof(float) * (size_t)(nq * hd));
  for (int64_t j0 = 0; j0 < kend; j0 += BLK) {
    int64_t j1 = j0 + BLK < kend ? j0 + BLK : kend, nk = j1 - j0;
    transpose(kh + j0 * ld, nk, hd, ld, w->kt, BLK);
    block_mm(nq, nk, hd, qh + i0 * ld, ld, w->kt, BLK, w->s, BLK, 0);
    for (int64_t r = 0; r < nq; r++) {
      int64_t cnt = visible(a, i0 + r, j0, j1);
      float *s = w->s + r * BLK, *o = w->o + r * hd;
      for (int64_t jj = cnt; jj < nk; jj++) s[jj] = 0;
      if (!cnt) continue;
      float mx = w->m[r], sum = 0;
      for (int64_t jj = 0; jj < cnt; jj++) {
        s[jj] *= a->scale;
        mx = s[jj] > mx ? s[jj] : mx;
      }
      float alpha = rt_exp_nonpos(w->m[r] - mx);  /* 0 on the first block (m = -inf) */
      for (int64_t jj = 0; jj < cnt; jj++) s[jj] = rt_exp_nonpos(s[jj] - mx);
      for (int64_t jj = 0; jj < cnt; jj++) sum += s[jj];
      w->l[r] = w->l[r] * alpha + sum;
      w->m[r] = mx;
      for (int64_t d = 0; d < hd; d++) o[d] *= alpha;
    }
    block_mm(nq, hd, nk, w->s, BLK, vh + j0 * ld, ld, w->o, hd, 1);
  }
  for (int64_t r = 0; r < nq; r++) {
    float inv = 1.0f / w->l[r], *o = w->o + r * hd;
    for (int64_t d = 0; d < hd; d++) o[d] *= inv;
  }
}

/* Forward tasks: t = (b * H + h) * nqb + query block. */
static void forward_range(void *ctx, int64_t begin, int64_t end) {
  Attn *a = ctx;
  Scratch w;
  if (!scratch_new(&w, a->hd)) {
    atomic_store(&a->oom, 1);
    return;
  }
  int64_t H = a->H, T = a->T, hd = a->hd;
  for (int64_t t = begin; t < end; t++) {
    int64_t bh = t / a->nqb, b = bh / H, h = bh % H, g = h / (H / a->KV);
    int64_t i0 = t % a->nqb * BLK, i1 = i0 + BLK < T ? i0 + BLK : T;
    block_forward(a, attn_in(a, 0, b, h), attn_in(a, 1, b, g), attn_in(a, 2, b, g), i0, i1, &w);
    const int tok = (a->layout & RT_SDPA_OUT_TOKENS) != 0;
    for (int64_t r = 0; r < i1 - i0; r++)
      memcpy(a->out + attn_row(tok, b, h, H, i0 + r, T, hd), w.o + r * hd,
             sizeof(float) * (size_t)hd);
    if (a->lse)
      for (int64_t r = 0; r < i1 - i0; r++) a->lse[bh * T + i0 + r] = w.m[r] + logf(w.l[r]);
  }
  free(w.mem);
}

/* The backward of query rows [i0, i1) of head h against its kv head: writes those
 * rows of dq (dqh) and adds their contributions into dk, dv (dkh, dvh); the
 * three have rows ldo apart. */
static void block_backward(const Attn *a, int64_t b, int64_t h, int64_t i0, int64_t i1,
                           float *dqh, float *dkh, float *dvh, int64_t ldo, Scratch *w) {
  int64_t H = a->H, T = a->T, hd = a->hd, g = h / (H / a->KV), nq = i1 - i0;
  int64_t kend = a->causal ? i1 : T;
  const int dyt = (a->layout & RT_SDPA_DY_TOKENS) != 0;
  const int64_t ldy = attn_ld(dyt, H, hd);
  const int64_t ld = attn_in_ld(a); /* q's, k's, v's rows */
  const float *qh = attn_in(a, 0, b, h), *dyh = a->dy + attn_row(dyt, b, h, H, 0, T, hd);
  const float *kh = attn_in(a, 1, b, g), *vh = attn_in(a, 2, b, g);
  const float *qb = qh + i0 * ld, *dyb = dyh + i0 * ldy;
  float scale = a->scale;

  /* the row statistics: lse from the forward and D given (rt_sdpa_delta, the
   * same sum as below), or lse and out from the forward (the same bits
   * block_forward would give: forward_range stored exactly these), else
   * recomputed */
  if (!a->flse) block_forward(a, qh, kh, vh, i0, i1, w);
  for (int64_t r = 0; r < nq; r++) {
    int64_t row = (b * H + h) * T + i0 + r;
    if (a->fd) {
      w->d[r] = a->fd[row];
    } else {
      const float *dyr = dyb + r * ldy, *o = a->fout ? a->fout + row * hd : w->o + r * hd;
      float d = 0;
      for (int64_t x = 0; x < hd; x++) d += dyr[x] * o[x];
      w->d[r] = d;
    }
    w->lse[r] = a->flse ? a->flse[row] : w->m[r] + logf(w->l[r]);
  }
  memset(w->dq, 0, sizeof(float) * (size_t)(nq * hd));

  for (int64_t j0 = 0; j0 < kend; j0 += BLK) {
    int64_t j1 = j0 + BLK < kend ? j0 + BLK : kend, nk = j1 - j0;
    transpose(kh + j0 * ld, nk, hd, ld, w->kt, BLK);
    transpose(vh + j0 * ld, nk, hd, ld, w->vt, BLK);
    block_mm(nq, nk, hd, qb, ld, w->kt, BLK, w->s, BLK, 0);    /* q . k */
    block_mm(nq, nk, hd, dyb, ldy, w->vt, BLK, w->ds, BLK, 0);  /* dp = dy . v */
    for (int64_t r = 0; r < nq; r++) {
      int64_t cnt = visible(a, i0 + r, j0, j1);
      float *p = w->s + r * BLK, *ds = w->ds + r * BLK;
      float lse = w->lse[r], d = w->d[r];
      for (int64_t jj = 0; jj < cnt; jj++) p[jj] = rt_exp_nonpos(p[jj] * scale - lse);
      for (int64_t jj = 0; jj < cnt; jj++) ds[jj] = p[jj] * (ds[jj] - d);
      for (int64_t jj = cnt; jj < nk; jj++) p[jj] = ds[jj] = 0;
    }
    block_mm(nq, hd, nk, w->ds, BLK, kh + j0 * ld, ld, w->dq, hd, 1);  /* dq += ds k */
    transpose(w->s, nq, nk, BLK, w->st, BLK);                           /* dv += p^T dy */
    block_mm(nk, hd, nq, w->st, BLK, dyb, ldy, dvh + j0 * ldo, ldo, 1);
    transpose(w->ds, nq, nk, BLK, w->st, BLK);                          /* dk += ds^T q */
    for (int64_t e = 0; e < nk * BLK; e++) w->st[e] *= scale;
    block_mm(nk, hd, nq, w->st, BLK, qb, ld, dkh + j0 * ldo, ldo, 1);
  }
  for (int64_t r = 0; r < nq; r++) {
    float *dst = dqh + (i0 + r) * ldo, *src = w->dq + r * hd;
    for (int64_t x = 0; x < hd; x++) dst[x] = scale * src[x];
  }
}

/* Backward tasks: t = b * KV + g, owning dq of heads g*rep .. g*rep+rep-1 and dk, dv
 * of kv head g. */
static void backward_range(void *ctx, int64_t begin, int64_t end) {
  Attn *a = ctx;
  Scratch w;
  if (!scratch_new(&w, a->hd)) {
    atomic_store(&a->oom, 1);
    return;
  }
  int64_t H = a->H, KV = a->KV, T = a->T, hd = a->hd, C = H + 2 * KV, rep = H / KV;
  const int tok = (a->layout & RT_SDPA_OUT_TOKENS) != 0;
  const int64_t ldo = attn_ld(tok, C, hd);
  for (int64_t t = begin; t < end; t++) {
    int64_t b = t / KV, g = t % KV;
    float *dkh = a->dqkv + attn_row(tok, b, H + g, C, 0, T, hd);
    float *dvh = a->dqkv + attn_row(tok, b, H + KV + g, C, 0, T, hd);
    for (int64_t u = 0; u < T; u++) {
      memset(dkh + u * ldo, 0, sizeof(float) * (size_t)hd);
      memset(dvh + u * ldo, 0, sizeof(float) * (size_t)hd);
    }
    for (int64_t h = g * rep; h < (g + 1) * rep; h++)
      for (int64_t i0 = 0; i0 < T; i0 += BLK)
        block_backward(a, b, h, i0, i0 + BLK < T ? i0 + BLK : T,
                       a->dqkv + attn_row(tok, b, h, C, 0, T, hd), dkh, dvh, ldo, &w);
  }
  free(w.mem);
}

static int check_args(const char *op, const void *out, const float *q, const float *k,
                      const float *v, const float *dy, int grad, int64_t B, int64_t H,
                      int64_t KV, int64_t T, int64_t hd) {
  if (!out || !q || !k || !v || (grad && !dy))
    return rt_fail("%s: NULL %s pointer", op,
                   !out ? "output" : !q ? "q" : !k ? "k" : !v ? "v" : "dy");
  if (B < 1 || H < 1 || KV < 1 || T < 1 || hd < 1)
    return rt_fail("%s: dimensions must be >= 1, got B %lld, H %lld, KV %lld, T %lld, hd %lld",
                   op, (long long)B, (long long)H, (long long)KV, (long long)T, (long long)hd);
  if (H % KV)
    return rt_fail("%s: %lld query heads are not a multiple of %lld kv heads", op,
                   (long long)H, (long long)KV);
  int64_t n;
  if (__builtin_mul_overflow(B, H + 2 * KV, &n) || __builtin_mul_overflow(n, T, &n) ||
      __builtin_mul_overflow(n, hd, &n) || n > INT64_MAX / (int64_t)sizeof(float))
    return rt_fail("%s: [%lld, %lld, %lld, %lld] is too large", op, (long long)B,
                   (long long)(H + 2 * KV), (long long)T, (long long)hd);
  return RT_OK;
}

int rt_sdpa_layout(float *out, float *lse, const float *q, const float *k, const float *v,
                   int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                   int causal, unsigned layout) {
  if (check_args("sdpa", out, q, k, v, NULL, 0, B, H, KV, T, hd)) return RT_ERR;
  if (layout & ~(unsigned)(RT_SDPA_OUT_TOKENS | RT_SDPA_QKV_TOKENS))
    return rt_fail("sdpa: layout bits 0x%x not understood", layout);
  Attn a = {.q = q, .k = k, .v = v, .out = out, .lse = lse, .B = B, .H = H, .KV = KV,
            .T = T, .hd = hd, .nqb = (T + BLK - 1) / BLK, .scale = scale,
            .causal = causal != 0, .layout = layout};
  atomic_init(&a.oom, 0);
  rt_parallel_for(B * H * a.nqb, 1, forward_range, &a);
  if (atomic_load(&a.oom))
    return rt_fail("sdpa: out of memory for the block scratch (head_dim %lld)", (long long)hd);
  return RT_OK;
}

int rt_sdpa(float *out, float *lse, const float *q, const float *k, const float *v,
            int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale, int causal) {
  return rt_sdpa_layout(out, lse, q, k, v, B, H, KV, T, hd, scale, causal, 0);
}

/* The backward with the row statistics from out and lse, from lse and d, or
 * (all NULL) recomputed; layout only with lse and d. */
static int backward(float *dqkv, const float *q, const float *k, const float *v,
                    const float *dy, const float *out, const float *lse, const float *d,
                    int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                    int causal, unsigned layout) {
  Attn a = {.q = q, .k = k, .v = v, .dy = dy, .dqkv = dqkv, .fout = out, .flse = lse, .fd = d,
            .B = B, .H = H, .KV = KV,
            .T = T, .hd = hd, .nqb = (T + BLK - 1) / BLK, .scale = scale,
            .causal = causal != 0, .layout = layout};
  atomic_init(&a.oom, 0);
  rt_parallel_for(B * KV, 1, backward_range, &a);
  if (atomic_load(&a.oom))
    return rt_fail("sdpa_grad: out of memory for the block scratch (head_dim %lld)",
                   (long long)hd);
  return RT_OK;
}

int rt_sdpa_grad(float *dqkv, const float *q, const float *k, const float *v,
                 const float *dy, const float *out, const float *lse, int64_t B, int64_t H,
                 int64_t KV, int64_t T, int64_t hd, float scale, int causal) {
  if (check_args("sdpa_grad", dqkv, q, k, v, dy, 1, B, H, KV, T, hd)) return RT_ERR;
  if (!out != !lse)
    return rt_fail("sdpa_grad: the forward's %s is NULL but not its %s", !out ? "out" : "lse",
                   !out ? "lse" : "out");
  return backward(dqkv, q, k, v, dy, out, lse, NULL, B, H, KV, T, hd, scale, causal, 0);
}

int rt_sdpa_grad_stats_layout(float *dqkv, const float *q, const float *k, const float *v,
                              const float *dy, const float *lse, const float *d, int64_t B,
                              int64_t H, int64_t KV, int64_t T, int64_t hd, float scale,
                              int causal, unsigned layout) {
  if (check_args("sdpa_grad", dqkv, q, k, v, dy, 1, B, H, KV, T, hd)) return RT_ERR;
  if (!lse || !d) return rt_fail("sdpa_grad: NULL %s pointer", !lse ? "lse" : "d");
  if (layout & ~(unsigned)(RT_SDPA_OUT_TOKENS | RT_SDPA_DY_TOKENS | RT_SDPA_QKV_TOKENS))
    return rt_fail("sdpa_grad: layout bits 0x%x not understood", layout);
  return backward(dqkv, q, k, v, dy, NULL, lse, d, B, H, KV, T, hd, scale, causal, layout);
}

int rt_sdpa_grad_stats(float *dqkv, const float *q, const float *k, const float *v,
                       const float *dy, const float *lse, const float *d, int64_t B, int64_t H,
                       int64_t KV, int64_t T, int64_t hd, float scale, int causal) {
  return rt_sdpa_grad_stats_layout(dqkv, q, k, v, dy, lse, d, B, H, KV, T, hd, scale, causal, 0);
}

typedef struct {
  float *d;
  const float *m, *dm;
  int64_t H, T, hd;
} Delta;

/* Rows [begin, end) of the merged tensors, row r = (b T + t) H + h. */
static void delta_range(void *ctx, int64_t begin, int64_t end) {
  const Delta *a = ctx;
  for (int64_t r = begin; r < end; r++) {
    int64_t h = r % a->H, bt = r / a->H, b = bt / a->T, t = bt % a->T;
    const float *m = a->m + r * a->hd, *dm = a->dm + r * a->hd;
    float d = 0;
    for (int64_t x = 0; x < a->hd; x++) d += dm[x] * m[x];
    a->d[(b * a->H + h) * a->T + t] = d;
  }
}

int rt_sdpa_delta(float *d, const float *m, const float *dm, int64_t B, int64_t H, int64_t T,
                  int64_t hd) {
  if (!d || !m || !dm)
    return rt_fail("sdpa_delta: NULL %s pointer", !d ? "output" : !m ? "m" : "dm");
  int64_t n;
  if (B < 1 || H < 1 || T < 1 || hd < 1 || __builtin_mul_overflow(B * H, T, &n) ||
      __builtin_mul_overflow(n, hd, &n) || n > INT64_MAX / (int64_t)sizeof(float))
    return rt_fail("sdpa_delta: dimensions must be >= 1 and fit, got B %lld, H %lld, T %lld, "
                   "hd %lld", (long long)B, (long long)H, (long long)T, (long long)hd);
  Delta a = {d, m, dm, H, T, hd};
  rt_parallel_for(B * T * H, 256, delta_range, &a);
  return RT_OK;
}
