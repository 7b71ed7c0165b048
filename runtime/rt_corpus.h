/* runtime/rt_corpus.h -- the built-in training corpus: English-like text generated in C.
 *
 * Invariants:
 *  - rt_corpus_generate is a pure function of (n, seed): the same bytes on every
 *    machine and every run, no files, no download. Output for a smaller n is a prefix
 *    of the output for a larger n with the same seed.
 *  - Bytes are printable ASCII (0x20..0x7e) plus '\n', so any vocab >= 128 holds them.
 *  - The text comes from a hand-written grammar (a few hundred words; sentences with
 *    subject-verb agreement, a/an, questions, dialogue, subordinate clauses, numbers,
 *    paragraphs and chapter headings), so a byte-level model can learn spellings and
 *    structure and its loss falls well below the unigram entropy of the bytes. */
#ifndef PARC_RT_CORPUS_H
#define PARC_RT_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#define RT_CORPUS_DEFAULT_BYTES ((size_t)2 << 20)   /* 2 MiB */
#define RT_CORPUS_DEFAULT_SEED 20240520u

/* Fills dst[0..n) with corpus text. */
void rt_corpus_generate(uint8_t *dst, size_t n, uint64_t seed);

#endif
