/* ir/arena.c -- bump allocator with chunk list. */
#include "ir/arena.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ArenaChunk {
  ArenaChunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};

#define ARENA_CHUNK (64 * 1024)

static void arena_oom(size_t size) {
  fprintf(stderr, "parc: out of memory (asked for %zu bytes)\n", size);
  exit(3);
}

void *arena_alloc(Arena *a, size_t size) {
  size = (size + 15) & ~(size_t)15;
  if (size == 0) size = 16;
  ArenaChunk *c = a->head;
  if (!c || c->cap - c->used < size) {
    size_t cap = size > ARENA_CHUNK ? size : ARENA_CHUNK;
    c = malloc(sizeof *c + cap);
    if (!c) arena_oom(size);
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = c->data + c->used;
  c->used += size;
  a->total += size;
  memset(p, 0, size);
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  char *p = arena_alloc(a, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

void arena_grow(Arena *a, void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return;
  int ncap = *cap ? *cap : 8;
  while (ncap < need) {
    if (ncap > (1 << 29)) arena_oom((size_t)need * elem);
    ncap *= 2;
  }
  void *p = arena_alloc(a, (size_t)ncap * elem);
  if (*cap) memcpy(p, *arr, (size_t)*cap * elem);
  *arr = p;
  *cap = ncap;
}

void arena_free(Arena *a) {
  ArenaChunk *c = a->head;
  while (c) {
    ArenaChunk *n = c->next;
    free(c);
    c = n;
  }
  a->head = NULL;
  a->total = 0;
}
