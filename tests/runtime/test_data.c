/* tests/runtime/test_data.c -- token files: batch addressing, validation messages,
 * and the built-in corpus (determinism, size, bytes, and learnable structure). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_corpus.h"
#include "runtime/rt_data.h"
#include "tests/runtime/check.h"

static void put32(FILE *f, uint32_t v) {
  for (int b = 0; b < 4; b++) fputc((int)(v >> (8 * b)) & 0xff, f);
}

/* An llm.c .bin with the given header fields and tokens tok(i) = (i * 37 + 11) % mod. */
static void write_bin(const char *path, uint32_t magic, uint32_t version, uint32_t declared,
                      long ntok, long mod, long header_ints) {
  FILE *f = fopen(path, "wb");
  for (long i = 0; i < header_ints; i++)
    put32(f, i == 0 ? magic : i == 1 ? version : i == 2 ? declared : 0);
  for (long i = 0; i < ntok; i++) {
    long t = (i * 37 + 11) % mod;
    fputc((int)(t & 0xff), f);
    fputc((int)(t >> 8), f);
  }
  fclose(f);
}

static void write_bytes(const char *path, const char *s, size_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(s, 1, n, f);
  fclose(f);
}

/* The addressing formula, restated: sequence i starts at (i*T) mod (N-T-1). */
static void check_batches(RtData *d, int B, int T, int64_t steps) {
  int64_t n = rt_data_ntokens(d), span = n - T - 1;
  int32_t *in = malloc(sizeof(int32_t) * (size_t)(B * T));
  int32_t *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
  for (int64_t step = 0; step < steps; step++) {
    CHECK_OK(rt_data_batch(d, step, B, T, in, tg));
    for (int b = 0; b < B; b++) {
      int64_t i = step * B + b, s = span ? (i * T) % span : 0;
      CHECK(rt_data_seq_start(d, i, T) == s);
      for (int t = 0; t < T; t++) {
        CHECK(in[b * T + t] == rt_data_token(d, s + t));
        CHECK(tg[b * T + t] == rt_data_token(d, s + t + 1));
      }
    }
  }
  free(in);
  free(tg);
}

static void test_bin(void) {
  RtData *d;
  write_bin("rt_data_ok.bin", RT_DATA_MAGIC, 1, 1000, 1000, 50257, 256);
  CHECK_OK(rt_data_open(&d, "rt_data_ok.bin", 50257, 64));
  if (!d) return;
  CHECK(rt_data_kind(d) == RT_DATA_LLMC_BIN);
  CHECK(rt_data_ntokens(d) == 1000);
  CHECK(rt_data_token(d, 0) == 11 && rt_data_token(d, 999) == (999 * 37 + 11) % 50257);
  check_batches(d, 4, 64, 40);
  check_batches(d, 3, 1, 10);
  /* Batches of several ranks are the slices of one global batch: the data order
   * depends only on (step, b), so a DP rank asking for its part gets the same tokens. */
  int32_t g_in[8 * 16], g_tg[8 * 16], r_in[4 * 16], r_tg[4 * 16];
  CHECK_OK(rt_data_batch(d, 5, 8, 16, g_in, g_tg));
  CHECK_OK(rt_data_batch(d, 10, 4, 16, r_in, r_tg));   /* step 10 of B=4 == seqs 40..43 */
  CHECK(memcmp(g_in, r_in, sizeof r_in) == 0 && memcmp(g_tg, r_tg, sizeof r_tg) == 0);
  /* Vocab is checked on the tokens of each batch. */
  CHECK_OK(rt_data_batch(d, 0, 1, 8, r_in, r_tg));
  rt_data_close(d);
  CHECK_OK(rt_data_open(&d, "rt_data_ok.bin", 1000, 0));
  if (d) {
    CHECK_FAILS(rt_data_batch(d, 0, 4, 64, r_in, r_tg), "is >= vocab 1000");
    rt_data_close(d);
  }
  /* N == T+1: one sequence, start 0 for every i. */
  CHECK_OK(rt_data_open(&d, "rt_data_ok.bin", 50257, 999));
  if (d) {
    CHECK(rt_data_seq_start(d, 0, 999) == 0 && rt_data_seq_start(d, 12345, 999) == 0);
    int32_t *in = malloc(sizeof(int32_t) * 999 * 2), *tg = malloc(sizeof(int32_t) * 999 * 2);
    CHECK_OK(rt_data_batch(d, 3, 2, 999, in, tg));
    CHECK(in[0] == rt_data_token(d, 0) && tg[998] == rt_data_token(d, 999));
    CHECK(in[999] == rt_data_token(d, 0));
    free(in);
    free(tg);
    rt_data_close(d);
  }
}

static void test_errors(void) {
  RtData *d = NULL;
  CHECK_FAILS(rt_data_open(&d, "rt_data_missing.bin", 256, 8),
              "data file rt_data_missing.bin: cannot open (No such file or directory)");
  CHECK(d == NULL);
  write_bin("rt_data_v2.bin", RT_DATA_MAGIC, 2, 100, 100, 100, 256);
  CHECK_FAILS(rt_data_open(&d, "rt_data_v2.bin", 50257, 8), "header version 2");
  write_bin("rt_data_shorthdr.bin", RT_DATA_MAGIC, 1, 100, 0, 100, 10);
  CHECK_FAILS(rt_data_open(&d, "rt_data_shorthdr.bin", 50257, 8),
              "shorter than the 1024-byte header");
  write_bin("rt_data_trunc.bin", RT_DATA_MAGIC, 1, 100, 60, 100, 256);
  CHECK_FAILS(rt_data_open(&d, "rt_data_trunc.bin", 50257, 8),
              "header says 100 tokens (1224 bytes with header) but the file has 1144 bytes");
  write_bin("rt_data_small.bin", RT_DATA_MAGIC, 1, 20, 20, 100, 256);
  CHECK_FAILS(rt_data_open(&d, "rt_data_small.bin", 50257, 64),
              "data file rt_data_small.bin has 20 tokens; one sequence of 64 needs 65");
  CHECK_OK(rt_data_open(&d, "rt_data_small.bin", 50257, 0));
  if (d) {
    int32_t in[64], tg[64];
    CHECK_FAILS(rt_data_batch(d, 0, 1, 64, in, tg), "has 20 tokens; one sequence of 64 needs 65");
    CHECK_FAILS(rt_data_batch(d, -1, 1, 8, in, tg), "step -1 is negative");
    CHECK_FAILS(rt_data_batch(d, 0, 0, 8, in, tg), "B = 0");
    CHECK(rt_data_seq_start(d, -3, 8) == -1);
    rt_data_close(d);
  }
  write_bytes("rt_data_raw.txt", "hello world\n", 12);
  CHECK_FAILS(rt_data_open(&d, "rt_data_raw.txt", 100, 4), "vocab is 100; use vocab >= 256");
  CHECK_FAILS(rt_data_open(&d, "rt_data_raw.txt", 256, 12),
              "has 12 tokens; one sequence of 12 needs 13");
  CHECK_OK(rt_data_open(&d, "rt_data_raw.txt", 256, 11));
  rt_data_close(d);
  write_bytes("rt_data_empty.txt", "", 0);
  CHECK_FAILS(rt_data_open(&d, "rt_data_empty.txt", 256, 1),
              "has 0 tokens; one sequence of 1 needs 2");
  CHECK_FAILS(rt_data_open(&d, ".", 256, 1), "not a regular file");
  CHECK_FAILS(rt_data_builtin(&d, 1000, 128, 8), "vocab is 128");
}

static void test_raw(void) {
  const char *text = "The quick brown fox jumps over the lazy dog.\n";
  write_bytes("rt_data_raw2.txt", text, strlen(text));
  RtData *d;
  CHECK_OK(rt_data_open(&d, "rt_data_raw2.txt", 256, 8));
  if (!d) return;
  CHECK(rt_data_kind(d) == RT_DATA_RAW_BYTES);
  CHECK(rt_data_ntokens(d) == (int64_t)strlen(text));
  CHECK(rt_data_token(d, 4) == 'q');
  check_batches(d, 2, 8, 30);
  /* Entropy of "aab"-like counts, computed by hand for this text. */
  int count[256] = {0};
  for (const char *p = text; *p; p++) count[(unsigned char)*p]++;
  double h = 0, n = (double)strlen(text);
  for (int k = 0; k < 256; k++)
    if (count[k]) h -= count[k] / n * log(count[k] / n);
  CHECK(fabs(rt_data_unigram_entropy(d) - h) < 1e-12);
  rt_data_close(d);
}

/* Conditional entropy H(X_t | previous k bytes) of the plug-in estimate, in nats. */
static double cond_entropy(const uint8_t *b, size_t n, int k) {
  /* k <= 2: count tables of 256^(k+1) entries at most. */
  size_t ctx_n = (size_t)1 << (8 * k), all = ctx_n * 256;
  uint32_t *joint = calloc(all, sizeof *joint), *ctx = calloc(ctx_n, sizeof *ctx);
  for (size_t i = (size_t)k; i < n; i++) {
    size_t c = 0;
    for (int j = k; j >= 1; j--) c = c << 8 | b[i - (size_t)j];
    ctx[c]++;
    joint[c << 8 | b[i]]++;
  }
  double h = 0, m = (double)(n - (size_t)k);
  for (size_t x = 0; x < all; x++)
    if (joint[x]) h -= joint[x] / m * log((double)joint[x] / ctx[x >> 8]);
  free(joint);
  free(ctx);
  return h;
}

static long count_str(const uint8_t *b, size_t n, const char *s) {
  size_t m = strlen(s);
  long c = 0;
  for (size_t i = 0; i + m <= n; i++) c += memcmp(b + i, s, m) == 0;
  return c;
}

/* The grammar's agreement rules hold everywhere in the text. */
static void check_grammar(const uint8_t *b, size_t n) {
  static const char *const never[] = {
      " they is", " they was ", " he are", " she are", " he were", " she were", " I is",
      " I are", " we is ", " you is", " you was ", " do he ", " do she ", " does they",
      " does we", " does I ", " he walk ", " she walk ", " he sleep ", " she sing ",
      " they walks", " we sleeps", " I sings", " they runs", "  ", " ,", " ."};
  for (size_t k = 0; k < sizeof never / sizeof never[0]; k++) {
    /* "Does he sleep" is right: the base form after "does" does not count. */
    char after_does[32];
    snprintf(after_does, sizeof after_does, "Does%s", never[k]);
    CHECK(count_str(b, n, never[k]) == count_str(b, n, after_does));
  }
  static const char *const sometimes[] = {"they are", "he is", "I am", "she was", "we were",
                                          "Does ", "Do ", "an "};
  for (size_t k = 0; k < sizeof sometimes / sizeof sometimes[0]; k++)
    CHECK(count_str(b, n, sometimes[k]) > 10);
  /* a/an agree with the next word's first letter. */
  long bad_article = 0;
  for (size_t i = 1; i + 4 < n; i++) {
    int at_word = b[i - 1] == ' ' || b[i - 1] == '\n' || b[i - 1] == '"';
    if (!at_word) continue;
    if ((b[i] == 'a' || b[i] == 'A') && b[i + 1] == ' ')
      bad_article += strchr("aeiou", b[i + 2]) != NULL;
    if ((b[i] == 'a' || b[i] == 'A') && b[i + 1] == 'n' && b[i + 2] == ' ')
      bad_article += strchr("aeiou", b[i + 3]) == NULL;
  }
  CHECK(bad_article == 0);
}

static void test_builtin(void) {
  RtData *d;
  CHECK_OK(rt_data_builtin(&d, 0, 256, 1024));
  if (!d) return;
  int64_t n = rt_data_ntokens(d);
  CHECK(n == (int64_t)RT_CORPUS_DEFAULT_BYTES && n >= 1000000);
  uint8_t *b = malloc((size_t)n);
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    b[i] = (uint8_t)rt_data_token(d, i);
    ok &= (b[i] >= 0x20 && b[i] < 0x7f) || b[i] == '\n';
  }
  CHECK(ok);
  /* Deterministic, and a prefix for a smaller size. */
  uint8_t *again = malloc((size_t)n), *small = malloc(5000);
  rt_corpus_generate(again, (size_t)n, RT_CORPUS_DEFAULT_SEED);
  rt_corpus_generate(small, 5000, RT_CORPUS_DEFAULT_SEED);
  CHECK(memcmp(b, again, (size_t)n) == 0 && memcmp(b, small, 5000) == 0);
  rt_corpus_generate(again, 5000, RT_CORPUS_DEFAULT_SEED + 1);
  CHECK(memcmp(b, again, 5000) != 0);
  /* English-like: spaces, sentences, paragraphs, capitals, dialogue. */
  long spaces = 0, periods = 0, newlines = 0, quotes = 0, questions = 0;
  for (int64_t i = 0; i < n; i++) {
    spaces += b[i] == ' ';
    periods += b[i] == '.';
    newlines += b[i] == '\n';
    quotes += b[i] == '"';
    questions += b[i] == '?';
  }
  CHECK(spaces > n / 10 && periods > n / 200 && newlines > n / 500 && quotes > n / 1000 &&
        questions > n / 2000);
  CHECK(memcmp(b, "Chapter 1\n\n", 11) == 0);
  check_grammar(b, (size_t)n);
  /* Structure a model can learn: the next byte is far more predictable from context
   * than from the unigram distribution alone. */
  double h0 = rt_data_unigram_entropy(d), h1 = cond_entropy(b, (size_t)n, 1),
         h2 = cond_entropy(b, (size_t)n, 2);
  CHECK(h0 > 2.5 && h0 < 3.5);
  CHECK(h1 < h0 - 0.5);
  CHECK(h2 < h0 - 1.2);
  check_batches(d, 2, 1024, 3);
  free(b);
  free(again);
  free(small);
  rt_data_close(d);
}

int main(void) {
  test_bin();
  test_errors();
  test_raw();
  test_builtin();
  return check_result("test_data");
}
