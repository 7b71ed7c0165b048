/* ir/strmap.c -- FNV-1a hashed, linearly probed. */
#include "ir/strmap.h"

#include <stdint.h>
#include <string.h>

static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

void *strmap_get(const StrMap *m, const char *key) {
  if (!m->cap) return NULL;
  for (uint64_t i = hash(key) & (uint64_t)(m->cap - 1);; i = (i + 1) & (uint64_t)(m->cap - 1)) {
    if (!m->keys[i]) return NULL;
    if (strcmp(m->keys[i], key) == 0) return m->vals[i];
  }
}

static void insert(StrMap *m, const char *key, void *val) {
  uint64_t i = hash(key) & (uint64_t)(m->cap - 1);
  while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (uint64_t)(m->cap - 1);
  if (!m->keys[i]) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
}

void strmap_put(Arena *a, StrMap *m, const char *key, void *val) {
  if ((m->n + 1) * 2 > m->cap) {
    StrMap old = *m;
    m->cap = old.cap ? old.cap * 2 : 64;
    m->n = 0;
    m->keys = arena_alloc(a, sizeof(char *) * (size_t)m->cap);
    m->vals = arena_alloc(a, sizeof(void *) * (size_t)m->cap);
    for (int i = 0; i < old.cap; i++)
      if (old.keys[i]) insert(m, old.keys[i], old.vals[i]);
  }
  insert(m, key, val);
}
