/* runtime/rt_data.h -- token data for training.
 *
 * Sources:
 *  - llm.c token files: a header of 256 little-endian int32 (header[0] = 20240520
 *    magic, header[1] = 1 version, header[2] = N tokens) then N uint16 tokens.
 *  - any other file: raw bytes, each byte one token (needs vocab >= 256).
 *  - the built-in corpus (rt_corpus.h): raw bytes generated in memory.
 *
 * Invariants:
 *  - Data order depends only on global indices (DESIGN.md, "Pinned semantics"):
 *    sequence i = step*B + b starts at token s = (i*T) mod (N-T-1); inputs are
 *    tokens[s .. s+T-1], targets tokens[s+1 .. s+T]. When N == T+1 the modulus is
 *    zero and the single possible start s = 0 is used.
 *  - An open RtData is read-only (mmap'ed or owned), so ranks in threads may call
 *    rt_data_batch on one handle concurrently.
 *  - Every token returned is < vocab: rt_data_batch checks the tokens it copies and
 *    fails naming the file, token position and value; raw bytes are checked at open. */
#ifndef PARC_RT_DATA_H
#define PARC_RT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define RT_DATA_MAGIC 20240520
#define RT_DATA_VERSION 1
#define RT_DATA_HEADER_INTS 256

typedef struct RtData RtData;

typedef enum { RT_DATA_LLMC_BIN, RT_DATA_RAW_BYTES } RtDataKind;

/* Opens path for a model of `vocab` tokens and sequence length T (T > 0 also checks
 * now that the file holds at least T+1 tokens; T = 0 defers that to rt_data_batch). */
int rt_data_open(RtData **out, const char *path, int vocab, int T);
/* The built-in corpus: nbytes bytes (0 = RT_CORPUS_DEFAULT_BYTES), byte tokens. */
int rt_data_builtin(RtData **out, size_t nbytes, int vocab, int T);
void rt_data_close(RtData *data);

/* Fills inputs and targets (B*T each, row-major [B, T]) for global step `step`. */
int rt_data_batch(const RtData *data, int64_t step, int B, int T, int32_t *inputs,
                  int32_t *targets);
/* The start token of sequence i for length T (the addressing formula above); -1 and
 * an error if the data is too short for T or i < 0. */
int64_t rt_data_seq_start(const RtData *data, int64_t i, int T);

int64_t rt_data_ntokens(const RtData *data);
RtDataKind rt_data_kind(const RtData *data);
const char *rt_data_name(const RtData *data);   /* the path, or "<builtin corpus>" */
/* Token at position pos (0 <= pos < N), unchecked against vocab. */
int32_t rt_data_token(const RtData *data, int64_t pos);

/* Entropy of the token unigram distribution of the whole data, in nats per token:
 * the loss of the best model that ignores context; a model that learned anything
 * goes below it. */
double rt_data_unigram_entropy(const RtData *data);

#endif
