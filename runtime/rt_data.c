/* runtime/rt_data.c -- token files, the built-in corpus and batch addressing; see rt_data.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rt_corpus.h"
#include "runtime/rt_err.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rt_data reads little-endian uint16 tokens in place; port the token access first"
#endif

#define HEADER_BYTES (RT_DATA_HEADER_INTS * 4)
#define BUILTIN_NAME "<builtin corpus>"

struct RtData {
  char *name;
  RtDataKind kind;
  int vocab;
  int64_t n;                 /* tokens */
  const uint8_t *bytes;      /* RAW_BYTES: the tokens */
  const uint16_t *tok16;     /* LLMC_BIN: the tokens (page-aligned mapping + 1024) */
  void *map;                 /* mmap'ed file, or NULL */
  size_t map_len;
  uint8_t *owned;            /* malloc'ed bytes (built-in corpus), or NULL */
};

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void rt_data_close(RtData *data) {
  if (!data) return;
  if (data->map) munmap(data->map, data->map_len);
  free(data->owned);
  free(data->name);
  free(data);
}

static int check_length(const RtData *d, int T) {
  if (T <= 0)
    return rt_fail("data '%s': sequence length T = %d must be positive", d->name, T);
  if (d->n < (int64_t)T + 1)
    return rt_fail("data file %s has %lld tokens; one sequence of %d needs %d; use a larger "
                   "file or a shorter sequence", d->name, (long long)d->n, T, T + 1);
  return RT_OK;
}

static int check_vocab_for_bytes(const RtData *d) {
  if (d->vocab < 256)
    return rt_fail("data file %s is read as raw bytes (no llm.c header with magic %d), so "
                   "tokens go up to 255, but the model's vocab is %d; use vocab >= 256 or "
                   "a tokenized .bin file", d->name, RT_DATA_MAGIC, d->vocab);
  return RT_OK;
}

/* Interprets the mapped file as llm.c .bin or raw bytes. */
static int classify(RtData *d, const uint8_t *p, size_t size) {
  if (size >= 4 && le32(p) == (uint32_t)RT_DATA_MAGIC) {
    if (size < HEADER_BYTES)
      return rt_fail("data file %s starts with the llm.c magic %d but is only %zu bytes, "
                     "shorter than the %d-byte header; the file is truncated, regenerate it",
                     d->name, RT_DATA_MAGIC, size, HEADER_BYTES);
    uint32_t version = le32(p + 4);
    if (version != RT_DATA_VERSION)
      return rt_fail("data file %s has llm.c header version %u; parc reads version %d "
                     "(uint16 tokens); re-export the tokens in that format", d->name,
                     version, RT_DATA_VERSION);
    int32_t ntok = (int32_t)le32(p + 8);
    uint64_t want = (uint64_t)HEADER_BYTES + 2 * (uint64_t)(uint32_t)ntok;
    if (ntok < 0 || want != size)
      return rt_fail("data file %s: header says %d tokens (%llu bytes with header) but the "
                     "file has %zu bytes; the file is truncated or corrupt, regenerate it",
                     d->name, ntok, (unsigned long long)want, size);
    d->kind = RT_DATA_LLMC_BIN;
    d->n = ntok;
    d->tok16 = (const uint16_t *)(const void *)(p + HEADER_BYTES);
    return RT_OK;
  }
  d->kind = RT_DATA_RAW_BYTES;
  d->n = (int64_t)size;
  d->bytes = p;
  return check_vocab_for_bytes(d);
}

int rt_data_open(RtData **out, const char *path, int vocab, int T) {
  *out = NULL;
  if (vocab <= 0) return rt_fail("data file %s: vocab %d must be positive", path, vocab);
  RtData *d = calloc(1, sizeof *d);
  if (!d || !(d->name = dupstr(path))) {
    free(d);
    return rt_fail("data file %s: out of memory", path);
  }
  d->vocab = vocab;
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    int err = errno;
    rt_data_close(d);
    return rt_fail("data file %s: cannot open (%s); check the path given with --data",
                   path, strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    rt_data_close(d);
    return rt_fail("data file %s: not a regular file; pass a token file with --data", path);
  }
  size_t size = (size_t)st.st_size;
  static const uint8_t empty[1];
  const uint8_t *p = empty;
  if (size > 0) {
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      close(fd);
      rt_data_close(d);
      return rt_fail("data file %s: cannot map %zu bytes (%s)", path, size, strerror(err));
    }
    d->map = m;
    d->map_len = size;
    p = m;
  }
  close(fd);
  if (classify(d, p, size) || (T != 0 && check_length(d, T))) {
    rt_data_close(d);
    return RT_ERR;
  }
  *out = d;
  return RT_OK;
}

int rt_data_builtin(RtData **out, size_t nbytes, int vocab, int T) {
  *out = NULL;
  if (nbytes == 0) nbytes = RT_CORPUS_DEFAULT_BYTES;
  RtData *d = calloc(1, sizeof *d);
  if (!d || !(d->name = dupstr(BUILTIN_NAME)) || !(d->owned = malloc(nbytes))) {
    rt_data_close(d);
    return rt_fail("built-in corpus: out of memory for %zu bytes", nbytes);
  }
  rt_corpus_generate(d->owned, nbytes, RT_CORPUS_DEFAULT_SEED);
  d->kind = RT_DATA_RAW_BYTES;
  d->vocab = vocab;
  d->bytes = d->owned;
  d->n = (int64_t)nbytes;
  if (vocab < 256) {
    rt_fail("the built-in corpus is byte tokens (0..255) but the model's vocab is %d; use "
            "vocab >= 256 or pass a tokenized file with --data", vocab);
    rt_data_close(d);
    return RT_ERR;
  }
  if (T != 0 && check_length(d, T)) {
    rt_data_close(d);
    return RT_ERR;
  }
  *out = d;
  return RT_OK;
}

int64_t rt_data_seq_start(const RtData *d, int64_t i, int T) {
  if (check_length(d, T)) return -1;
  if (i < 0) {
    rt_fail("data '%s': sequence index %lld is negative", d->name, (long long)i);
    return -1;
  }
  int64_t span = d->n - T - 1;
  if (span == 0) return 0;
  /* (i*T) mod span without overflow: i*T fits unless i is astronomically large. */
  if (i > INT64_MAX / T) i %= span;
  return (i * T) % span;
}

int32_t rt_data_token(const RtData *d, int64_t pos) {
  return d->kind == RT_DATA_LLMC_BIN ? (int32_t)d->tok16[pos] : (int32_t)d->bytes[pos];
}

int rt_data_batch(const RtData *d, int64_t step, int B, int T, int32_t *inputs,
                  int32_t *targets) {
  if (B <= 0) return rt_fail("data '%s': batch size B = %d must be positive", d->name, B);
  if (step < 0) return rt_fail("data '%s': step %lld is negative", d->name, (long long)step);
  if (check_length(d, T)) return RT_ERR;
  if (step > INT64_MAX / B - 1)
    return rt_fail("data '%s': step %lld overflows the sequence index", d->name,
                   (long long)step);
  for (int b = 0; b < B; b++) {
    int64_t s = rt_data_seq_start(d, step * B + b, T);
    int32_t *in = inputs + (size_t)b * (size_t)T;
    int32_t *tg = targets + (size_t)b * (size_t)T;
    for (int t = 0; t <= T; t++) {
      int32_t tok = rt_data_token(d, s + t);
      if (tok >= d->vocab)
        return rt_fail("data file %s: token %d at position %lld is >= vocab %d; tokenize "
                       "with the model's tokenizer or raise vocab", d->name, tok,
                       (long long)(s + t), d->vocab);
      if (t < T) in[t] = tok;
      if (t > 0) tg[t - 1] = tok;
    }
  }
  return RT_OK;
}

int64_t rt_data_ntokens(const RtData *d) { return d->n; }
RtDataKind rt_data_kind(const RtData *d) { return d->kind; }
const char *rt_data_name(const RtData *d) { return d->name; }

double rt_data_unigram_entropy(const RtData *d) {
  if (d->n == 0) return 0.0;
  enum { NBINS = 65536 };
  int64_t *count = calloc(NBINS, sizeof *count);
  if (!count) {
    rt_fail("data '%s': out of memory counting tokens", d->name);
    return NAN;
  }
  if (d->kind == RT_DATA_LLMC_BIN)
    for (int64_t i = 0; i < d->n; i++) count[d->tok16[i]]++;
  else
    for (int64_t i = 0; i < d->n; i++) count[d->bytes[i]]++;
  double h = 0.0, n = (double)d->n;
  for (int k = 0; k < NBINS; k++)
    if (count[k]) {
      double p = (double)count[k] / n;
      h -= p * log(p);
    }
  free(count);
  return h;
}
