/* ir/strmap.h -- string-keyed hash map (open addressing) in an arena.
 * Keys are not copied: they must outlive the map. */
#ifndef PARC_STRMAP_H
#define PARC_STRMAP_H

#include "ir/arena.h"

typedef struct {
  const char **keys;
  void **vals;
  int cap, n;     /* cap is 0 or a power of two; n < cap / 2 */
} StrMap;

void *strmap_get(const StrMap *m, const char *key);
void strmap_put(Arena *a, StrMap *m, const char *key, void *val);

#endif
