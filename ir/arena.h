/* ir/arena.h -- bump allocator: many allocations, one free.
 * Invariant: every block returned stays valid until arena_free. */
#ifndef PARC_ARENA_H
#define PARC_ARENA_H

#include <stddef.h>

typedef struct ArenaChunk ArenaChunk;
typedef struct {
  ArenaChunk *head;
  size_t total;          /* bytes handed out, for reports */
} Arena;

void *arena_alloc(Arena *a, size_t size);          /* zeroed, 16-aligned */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Grows *arr (of *cap elements of size elem) to hold at least need. */
void arena_grow(Arena *a, void **arr, int *cap, int need, size_t elem);
void arena_free(Arena *a);

#endif
