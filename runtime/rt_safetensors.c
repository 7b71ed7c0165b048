/* runtime/rt_safetensors.c -- safetensors writer and validating reader; see rt_safetensors.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rt_err.h"
#include "runtime/rt_fs.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rt_safetensors copies little-endian float32 data as is; port the copies first"
#endif

#define METADATA_KEY "__metadata__"
#define MAX_EXACT 9007199254740992.0   /* 2^53 */

typedef struct {
  char *name;
  int rank;
  int64_t shape[RT_ST_MAXDIM];
  int64_t numel;
  uint64_t begin, end;      /* relative to the data section */
} Entry;

struct RtSt {
  char *path;
  void *map;
  size_t map_len;
  const uint8_t *data;      /* start of the data section */
  uint64_t data_len;
  int n;
  Entry *e;                 /* sorted by begin: data order */
  const Entry **by_name;    /* the entries sorted by name */
  int nmeta;
  char **mkey, **mval;
};

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Writes "[d0, d1, ...]" into buf for messages. */
static const char *shape_str(char *buf, size_t cap, int rank, const int64_t *shape) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int i = 0; i < rank && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* numel of a shape, or -1 if some dim is negative or the byte size overflows. */
static int64_t shape_numel(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > (INT64_MAX / 4) / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

/* ---- writer ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_tensors(const char *path, const RtStTensor *t, int n, int64_t *numel) {
  const char **names = malloc(sizeof *names * (size_t)(n ? n : 1));
  if (!names) return rt_fail("%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    char sb[160];
    if (!t[i].name || !t[i].name[0] || !strcmp(t[i].name, METADATA_KEY)) {
      free(names);
      return rt_fail("%s: tensor %d has an empty or reserved name '%s'; give each tensor its "
                     "HF name", path, i, t[i].name ? t[i].name : "(null)");
    }
    if (t[i].rank < 0 || t[i].rank > RT_ST_MAXDIM) {
      free(names);
      return rt_fail("%s: tensor '%s' has rank %d; safetensors writing supports 0..%d", path,
                     t[i].name, t[i].rank, RT_ST_MAXDIM);
    }
    numel[i] = shape_numel(t[i].rank, t[i].shape);
    if (numel[i] < 0 || (numel[i] > 0 && !t[i].data)) {
      free(names);
      return rt_fail("%s: tensor '%s' has invalid shape %s or no data", path, t[i].name,
                     shape_str(sb, sizeof sb, t[i].rank, t[i].shape));
    }
    names[i] = t[i].name;
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[i - 1], names[i])) {
      int rc = rt_fail("%s: tensor name '%s' is given twice; names must be unique", path,
                       names[i]);
      free(names);
      return rc;
    }
  free(names);
  return RT_OK;
}

/* The JSON header text for the given layout (caller frees with cJSON_free). */
static char *build_header(const RtStTensor *t, int n, const int64_t *numel,
                          const RtStMeta *meta, int nmeta) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  int ok = 1;
  if (nmeta > 0) {
    cJSON *m = cJSON_AddObjectToObject(root, METADATA_KEY);
    ok = m != NULL;
    for (int i = 0; ok && i < nmeta; i++)
      ok = cJSON_AddStringToObject(m, meta[i].key, meta[i].value) != NULL;
  }
  double off = 0;
  for (int i = 0; ok && i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
    cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
    cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
    ok = offs && cJSON_AddStringToObject(e, "dtype", "F32");
    for (int d = 0; ok && d < t[i].rank; d++)
      ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
    double end = off + 4.0 * (double)numel[i];
    ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber(off)) &&
         cJSON_AddItemToArray(offs, cJSON_CreateNumber(end));
    off = end;
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  return text;
}

int rt_st_write(const char *path, const RtStTensor *t, int n, const RtStMeta *meta,
                int nmeta) {
  if (n < 0) return rt_fail("%s: negative tensor count %d", path, n);
  for (int i = 0; i < nmeta; i++)
    if (!meta[i].key || !meta[i].value || !strcmp(meta[i].key, ""))
      return rt_fail("%s: metadata entry %d has no key or value", path, i);
  int64_t *numel = malloc(sizeof *numel * (size_t)(n ? n : 1));
  RtFsChunk *chunks = malloc(sizeof *chunks * (size_t)(n + 2));
  if (!numel || !chunks) {
    free(numel);
    free(chunks);
    return rt_fail("%s: out of memory", path);
  }
  int rc = check_tensors(path, t, n, numel);
  char *text = NULL, *header = NULL;
  uint64_t total = 0;
  for (int i = 0; rc == RT_OK && i < n; i++) total += 4 * (uint64_t)numel[i];
  if (rc == RT_OK && (double)total > MAX_EXACT)
    rc = rt_fail("%s: %llu data bytes exceed the 2^53 that JSON offsets hold exactly", path,
                 (unsigned long long)total);
  if (rc == RT_OK && !(text = build_header(t, n, numel, meta, nmeta)))
    rc = rt_fail("%s: out of memory building the JSON header", path);
  if (rc == RT_OK) {
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    header = malloc(8 + padded);
    if (!header) {
      rc = rt_fail("%s: out of memory", path);
    } else {
      for (int b = 0; b < 8; b++) header[b] = (char)(((uint64_t)padded >> (8 * b)) & 0xff);
      memcpy(header + 8, text, len);
      memset(header + 8 + len, ' ', padded - len);
      chunks[0] = (RtFsChunk){header, 8 + padded};
      for (int i = 0; i < n; i++) chunks[i + 1] = (RtFsChunk){t[i].data, 4 * (size_t)numel[i]};
      rc = rt_fs_write_atomic(path, chunks, n + 1);
    }
  }
  cJSON_free(text);
  free(header);
  free(chunks);
  free(numel);
  return rc;
}

/* ---- reader ---- */

void rt_st_close(RtSt *st) {
  if (!st) return;
  for (int i = 0; i < st->n; i++) free(st->e[i].name);
  for (int i = 0; i < st->nmeta; i++) {
    free(st->mkey[i]);
    free(st->mval[i]);
  }
  free(st->e);
  free(st->by_name);
  free(st->mkey);
  free(st->mval);
  if (st->map) munmap(st->map, st->map_len);
  free(st->path);
  free(st);
}

/* A non-negative integer JSON number below 2^53, or -1. */
static double json_uint(const cJSON *v) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0) || d > MAX_EXACT || d != floor(d)) return -1;
  return d;
}

static int parse_entry(const RtSt *st, const cJSON *item, Entry *e) {
  const char *p = st->path, *name = item->string;
  if (!cJSON_IsObject(item))
    return rt_fail("safetensors file %s: entry '%s' is not an object; the header is corrupt",
                   p, name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
    return rt_fail("safetensors file %s: tensor '%s' lacks a string \"dtype\", an array "
                   "\"shape\" or an array \"data_offsets\"; the header is corrupt", p, name);
  if (strcmp(dtype->valuestring, "F32") != 0)
    return rt_fail("safetensors file %s: tensor '%s' has dtype %s; parc reads only F32, "
                   "convert the file to float32 first", p, name, dtype->valuestring);
  int rank = cJSON_GetArraySize(shape);
  if (rank > RT_ST_MAXDIM)
    return rt_fail("safetensors file %s: tensor '%s' has rank %d; at most %d is supported", p,
                   name, rank, RT_ST_MAXDIM);
  e->rank = rank;
  int d = 0;
  for (const cJSON *v = shape->child; v; v = v->next, d++) {
    double x = json_uint(v);
    if (x < 0)
      return rt_fail("safetensors file %s: tensor '%s' has a shape entry that is not a "
                     "non-negative integer; the header is corrupt", p, name);
    e->shape[d] = (int64_t)x;
  }
  e->numel = shape_numel(rank, e->shape);
  if (e->numel < 0)
    return rt_fail("safetensors file %s: tensor '%s' is too large", p, name);
  double b, en;
  if (cJSON_GetArraySize(offs) != 2 || (b = json_uint(offs->child)) < 0 ||
      (en = json_uint(offs->child->next)) < 0)
    return rt_fail("safetensors file %s: tensor '%s' needs data_offsets [begin, end] of two "
                   "non-negative integers; the header is corrupt", p, name);
  e->begin = (uint64_t)b;
  e->end = (uint64_t)en;
  char sb[160];
  if (e->end < e->begin || e->end > st->data_len)
    return rt_fail("safetensors file %s: tensor '%s' has data_offsets [%llu, %llu] outside "
                   "the %llu-byte data section; the file is truncated or corrupt", p, name,
                   (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)st->data_len);
  if (e->end - e->begin != 4 * (uint64_t)e->numel)
    return rt_fail("safetensors file %s: tensor '%s' of shape %s needs %llu bytes but "
                   "data_offsets span %llu; the header is corrupt", p, name,
                   shape_str(sb, sizeof sb, rank, e->shape),
                   (unsigned long long)(4 * (uint64_t)e->numel),
                   (unsigned long long)(e->end - e->begin));
  if (!(e->name = dupstr(name))) return rt_fail("safetensors file %s: out of memory", p);
  return RT_OK;
}

static int parse_metadata(RtSt *st, const cJSON *m) {
  if (!cJSON_IsObject(m))
    return rt_fail("safetensors file %s: \"%s\" is not an object of strings", st->path,
                   METADATA_KEY);
  int n = cJSON_GetArraySize(m);
  st->mkey = calloc((size_t)(n ? n : 1), sizeof *st->mkey);
  st->mval = calloc((size_t)(n ? n : 1), sizeof *st->mval);
  if (!st->mkey || !st->mval) return rt_fail("safetensors file %s: out of memory", st->path);
  for (const cJSON *v = m->child; v; v = v->next) {
    if (!cJSON_IsString(v))
      return rt_fail("safetensors file %s: metadata value of '%s' is not a string", st->path,
                     v->string);
    st->mkey[st->nmeta] = dupstr(v->string);
    st->mval[st->nmeta] = dupstr(v->valuestring);
    st->nmeta++;
    if (!st->mkey[st->nmeta - 1] || !st->mval[st->nmeta - 1])
      return rt_fail("safetensors file %s: out of memory", st->path);
  }
  return RT_OK;
}

static int cmp_begin(const void *a, const void *b) {
  const Entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(const Entry *const *)a)->name, (*(const Entry *const *)b)->name);
}

/* Checks layout: entries sorted by offset, contiguous from 0 to the end of the data. */
static int check_layout(const RtSt *st) {
  uint64_t pos = 0;
  for (int i = 0; i < st->n; i++) {
    const Entry *e = &st->e[i];
    if (e->begin < pos)
      return rt_fail("safetensors file %s: tensors '%s' and '%s' overlap (bytes %llu..%llu); "
                     "the header is corrupt", st->path, st->e[i - 1].name, e->name,
                     (unsigned long long)e->begin, (unsigned long long)pos);
    if (e->begin > pos)
      return rt_fail("safetensors file %s: data bytes [%llu, %llu) belong to no tensor (a "
                     "hole before '%s'); the header is corrupt", st->path,
                     (unsigned long long)pos, (unsigned long long)e->begin, e->name);
    pos = e->end;
  }
  if (pos != st->data_len)
    return rt_fail("safetensors file %s: %llu data bytes follow the last tensor; the file "
                   "is corrupt or was appended to", st->path,
                   (unsigned long long)(st->data_len - pos));
  return RT_OK;
}

static int parse_header(RtSt *st, const char *text, size_t len) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return rt_fail("safetensors file %s: header is not a valid JSON object; the file is "
                   "corrupt or not safetensors", st->path);
  }
  for (const char *q = end; q < text + len; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r' && *q != '\0') {
      cJSON_Delete(root);
      return rt_fail("safetensors file %s: unexpected bytes after the JSON header; the file "
                     "is corrupt", st->path);
    }
  int n = 0;
  for (const cJSON *v = root->child; v; v = v->next) n += strcmp(v->string, METADATA_KEY) != 0;
  st->e = calloc((size_t)(n ? n : 1), sizeof *st->e);
  st->by_name = calloc((size_t)(n ? n : 1), sizeof *st->by_name);
  int rc = (st->e && st->by_name) ? RT_OK
                                  : rt_fail("safetensors file %s: out of memory", st->path);
  int seen_meta = 0;
  for (const cJSON *v = root->child; rc == RT_OK && v; v = v->next) {
    if (!strcmp(v->string, METADATA_KEY)) {
      rc = seen_meta++ ? rt_fail("safetensors file %s: \"%s\" appears twice", st->path,
                                 METADATA_KEY)
                       : parse_metadata(st, v);
    } else {
      rc = parse_entry(st, v, &st->e[st->n]);
      if (rc == RT_OK) st->n++;
    }
  }
  cJSON_Delete(root);
  if (rc) return rc;
  qsort(st->e, (size_t)st->n, sizeof *st->e, cmp_begin);
  for (int i = 0; i < st->n; i++) st->by_name[i] = &st->e[i];
  qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_name);
  for (int i = 1; i < st->n; i++)
    if (!strcmp(st->by_name[i - 1]->name, st->by_name[i]->name))
      return rt_fail("safetensors file %s: tensor '%s' appears twice in the header; names "
                     "must be unique", st->path, st->by_name[i]->name);
  return check_layout(st);
}

int rt_st_open(RtSt **out, const char *path) {
  *out = NULL;
  RtSt *st = calloc(1, sizeof *st);
  if (!st || !(st->path = dupstr(path))) {
    free(st);
    return rt_fail("safetensors file %s: out of memory", path);
  }
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    int err = errno;
    rt_st_close(st);
    return rt_fail("safetensors file %s: cannot open (%s); check the path", path,
                   strerror(err));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    rt_st_close(st);
    return rt_fail("safetensors file %s: not a regular file", path);
  }
  size_t size = (size_t)sb.st_size;
  if (size < 8) {
    close(fd);
    rt_st_close(st);
    return rt_fail("safetensors file %s: only %zu bytes, shorter than the 8-byte header "
                   "length; the file is truncated", path, size);
  }
  void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);
  if (m == MAP_FAILED) {
    rt_st_close(st);
    return rt_fail("safetensors file %s: cannot map %zu bytes (%s)", path, size,
                   strerror(err));
  }
  st->map = m;
  st->map_len = size;
  const uint8_t *p = m;
  uint64_t hlen = 0;
  for (int b = 7; b >= 0; b--) hlen = hlen << 8 | p[b];
  if (hlen > RT_ST_MAX_HEADER || hlen > size - 8) {
    rt_st_close(st);
    return rt_fail("safetensors file %s: header length %llu does not fit in the %zu-byte "
                   "file; the file is truncated or not safetensors", path,
                   (unsigned long long)hlen, size);
  }
  st->data = p + 8 + hlen;
  st->data_len = size - 8 - hlen;
  if (parse_header(st, (const char *)p + 8, (size_t)hlen)) {
    rt_st_close(st);
    return RT_ERR;
  }
  *out = st;
  return RT_OK;
}

int rt_st_count(const RtSt *st) { return st->n; }

const char *rt_st_name(const RtSt *st, int i) {
  return (i >= 0 && i < st->n) ? st->e[i].name : NULL;
}

int rt_st_find(const RtSt *st, const char *name) {
  int lo = 0, hi = st->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(st->by_name[mid]->name, name);
    if (c == 0) return (int)(st->by_name[mid] - st->e);
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  rt_fail("safetensors file %s has no tensor '%s'; check that the file matches the model "
          "and uses its HF parameter names", st->path, name);
  return -1;
}

int rt_st_shape(const RtSt *st, int i, int64_t *shape) {
  if (i < 0 || i >= st->n) return -1;
  for (int d = 0; d < st->e[i].rank; d++) shape[d] = st->e[i].shape[d];
  return st->e[i].rank;
}

int64_t rt_st_numel(const RtSt *st, int i) {
  return (i >= 0 && i < st->n) ? st->e[i].numel : -1;
}

const char *rt_st_meta(const RtSt *st, const char *key) {
  for (int i = 0; i < st->nmeta; i++)
    if (!strcmp(st->mkey[i], key)) return st->mval[i];
  return NULL;
}

/* Finds name and checks its shape equals (rank, shape). */
static const Entry *expect(const RtSt *st, const char *name, int rank, const int64_t *shape) {
  int i = rt_st_find(st, name);
  if (i < 0) return NULL;
  const Entry *e = &st->e[i];
  int same = e->rank == rank;
  for (int d = 0; same && d < rank; d++) same = e->shape[d] == shape[d];
  if (!same) {
    char have[160], want[160];
    rt_fail("safetensors file %s: tensor '%s' has shape %s but the model expects %s; the "
            "file was made for another configuration", st->path, name,
            shape_str(have, sizeof have, e->rank, e->shape),
            shape_str(want, sizeof want, rank, shape));
    return NULL;
  }
  return e;
}

int rt_st_read(const RtSt *st, const char *name, float *dst, int rank, const int64_t *shape) {
  const Entry *e = expect(st, name, rank, shape);
  if (!e) return RT_ERR;
  if (e->numel) memcpy(dst, st->data + e->begin, 4 * (size_t)e->numel);
  return RT_OK;
}

int rt_st_read_slice(const RtSt *st, const char *name, float *dst, int rank,
                     const int64_t *shape, int dim, int64_t start, int64_t len) {
  const Entry *e = expect(st, name, rank, shape);
  if (!e) return RT_ERR;
  if (dim == -1) return rt_st_read(st, name, dst, rank, shape);
  if (dim < 0 || dim >= rank || start < 0 || len < 0 || start > shape[dim] ||
      len > shape[dim] - start)
    return rt_fail("safetensors file %s: slice [%lld, %lld) of dim %d is outside tensor '%s' "
                   "of rank %d; the shard layout does not match the tensor", st->path,
                   (long long)start, (long long)(start + len), dim, name, rank);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= shape[d];
  for (int d = dim + 1; d < rank; d++) inner *= shape[d];
  size_t row = 4 * (size_t)(len * inner);
  const uint8_t *src = st->data + e->begin;
  for (int64_t o = 0; o < outer; o++)
    if (row)
      memcpy((uint8_t *)dst + (size_t)o * row,
             src + 4 * (size_t)((o * shape[dim] + start) * inner), row);
  return RT_OK;
}
