/* tests/runtime/test_safetensors.c -- round trip, sliced reads, atomic replacement,
 * and rejection (with one-line messages) of corrupt, truncated and foreign files. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_safetensors.h"
#include "tests/runtime/check.h"

static float val(int t, int64_t i) { return (float)t * 1000.0f + (float)i * 0.5f - 7.0f; }

static void test_roundtrip(void) {
  float a[2 * 3 * 4], b[5], c = 3.25f;
  for (int i = 0; i < 24; i++) a[i] = val(0, i);
  for (int i = 0; i < 5; i++) b[i] = val(1, i);
  RtStTensor t[4] = {
    {.name = "h.0.mlp.c_fc.weight", .rank = 3, .shape = {2, 3, 4}, .data = a},
    {.name = "ln_f.bias", .rank = 1, .shape = {5}, .data = b},
    {.name = "scalar", .rank = 0, .data = &c},
    {.name = "empty", .rank = 2, .shape = {0, 7}},
  };
  RtStMeta meta[] = {{"format", "pt"}, {"step", "120"}};
  CHECK_OK(rt_st_write("rt_st_rt.safetensors", t, 4, meta, 2));
  RtSt *st;
  CHECK_OK(rt_st_open(&st, "rt_st_rt.safetensors"));
  if (!st) return;
  CHECK(rt_st_count(st) == 4);
  for (int i = 0; i < 4; i++) CHECK(!strcmp(rt_st_name(st, i), t[i].name));   /* data order */
  CHECK(!strcmp(rt_st_meta(st, "step"), "120") && !strcmp(rt_st_meta(st, "format"), "pt"));
  CHECK(rt_st_meta(st, "missing") == NULL);
  int64_t shape[RT_ST_MAXDIM];
  int i = rt_st_find(st, "h.0.mlp.c_fc.weight");
  CHECK(i == 0 && rt_st_shape(st, i, shape) == 3 && shape[0] == 2 && shape[2] == 4);
  CHECK(rt_st_numel(st, rt_st_find(st, "empty")) == 0);
  CHECK(rt_st_shape(st, rt_st_find(st, "scalar"), shape) == 0);
  float ga[24], gb[5], gc = 0;
  CHECK_OK(rt_st_read(st, "h.0.mlp.c_fc.weight", ga, 3, t[0].shape));
  CHECK_OK(rt_st_read(st, "ln_f.bias", gb, 1, t[1].shape));
  CHECK_OK(rt_st_read(st, "scalar", &gc, 0, NULL));
  CHECK(memcmp(ga, a, sizeof a) == 0 && memcmp(gb, b, sizeof b) == 0 && gc == c);
  CHECK_OK(rt_st_read(st, "empty", NULL, 2, t[3].shape));
  /* Slices along each dim equal the same cut from the full tensor. */
  const int64_t *sh = t[0].shape;
  for (int dim = 0; dim < 3; dim++)
    for (int64_t start = 0; start < sh[dim]; start++)
      for (int64_t len = 0; start + len <= sh[dim]; len++) {
        float got[24], want[24];
        int64_t outer = 1, inner = 1, k = 0;
        for (int d = 0; d < dim; d++) outer *= sh[d];
        for (int d = dim + 1; d < 3; d++) inner *= sh[d];
        for (int64_t o = 0; o < outer; o++)
          for (int64_t j = start; j < start + len; j++)
            for (int64_t x = 0; x < inner; x++) want[k++] = a[(o * sh[dim] + j) * inner + x];
        CHECK_OK(rt_st_read_slice(st, "h.0.mlp.c_fc.weight", got, 3, sh, dim, start, len));
        CHECK(memcmp(got, want, sizeof(float) * (size_t)k) == 0);
      }
  /* Lookups and shapes that do not match say so. */
  const int64_t wrong[2] = {4, 6};
  CHECK_FAILS(rt_st_read(st, "h.0.mlp.c_fc.weight", ga, 2, wrong),
              "tensor 'h.0.mlp.c_fc.weight' has shape [2, 3, 4] but the model expects [4, 6]");
  CHECK_FAILS(rt_st_read(st, "wte.weight", ga, 2, wrong),
              "safetensors file rt_st_rt.safetensors has no tensor 'wte.weight'");
  CHECK_FAILS(rt_st_read_slice(st, "ln_f.bias", gb, 1, t[1].shape, 0, 3, 3), "slice [3, 6)");
  rt_st_close(st);
}

static int count_tmp_files(void) {
  DIR *d = opendir(".");
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += strncmp(e->d_name, "rt_st_", 6) == 0 && strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

static void test_write_errors_and_atomicity(void) {
  float x[2] = {1, 2};
  RtStTensor dup[2] = {{.name = "a", .rank = 1, .shape = {2}, .data = x},
                       {.name = "a", .rank = 1, .shape = {1}, .data = x}};
  CHECK_FAILS(rt_st_write("rt_st_dup.safetensors", dup, 2, NULL, 0),
              "tensor name 'a' is given twice");
  RtStTensor reserved = {.name = "__metadata__", .rank = 1, .shape = {2}, .data = x};
  CHECK_FAILS(rt_st_write("rt_st_res.safetensors", &reserved, 1, NULL, 0), "reserved name");
  RtStTensor rank9 = {.name = "r", .rank = 9, .data = x};
  CHECK_FAILS(rt_st_write("rt_st_r9.safetensors", &rank9, 1, NULL, 0), "rank 9");
  RtStTensor nodata = {.name = "n", .rank = 1, .shape = {2}};
  CHECK_FAILS(rt_st_write("rt_st_nd.safetensors", &nodata, 1, NULL, 0), "no data");
  CHECK_FAILS(rt_st_write("rt_st_no_such_dir/x.safetensors", dup, 1, NULL, 0),
              "rt_st_no_such_dir/x.safetensors: cannot create temporary file");
  /* Replacing a file: readers see old or new; nothing is left behind. */
  RtStTensor one = {.name = "w", .rank = 1, .shape = {2}, .data = x};
  CHECK_OK(rt_st_write("rt_st_replace.safetensors", &one, 1, NULL, 0));
  FILE *stale = fopen("rt_st_replace.safetensors.tmp.AbC123", "wb");   /* a killed writer's */
  if (stale) fclose(stale);
  CHECK(count_tmp_files() == 1);
  x[0] = 5;
  one.shape[0] = 1;
  CHECK_OK(rt_st_write("rt_st_replace.safetensors", &one, 1, NULL, 0));
  RtSt *st;
  CHECK_OK(rt_st_open(&st, "rt_st_replace.safetensors"));
  if (st) {
    float g = 0;
    const int64_t s1[1] = {1};
    CHECK_OK(rt_st_read(st, "w", &g, 1, s1));
    CHECK(g == 5);
    rt_st_close(st);
  }
  CHECK(count_tmp_files() == 0);
  /* The header is padded to a multiple of 8 with spaces. */
  FILE *f = fopen("rt_st_replace.safetensors", "rb");
  unsigned char h[8];
  CHECK(f && fread(h, 1, 8, f) == 8);
  uint64_t hl = 0;
  for (int b = 7; b >= 0; b--) hl = hl << 8 | h[b];
  CHECK(hl % 8 == 0);
  if (f) fclose(f);
}

/* A file made of an 8-byte header length (hlen, or the header's length if 0), the
 * header text and data_len zero bytes. */
static void craft(const char *path, const char *header, uint64_t hlen, size_t data_len) {
  FILE *f = fopen(path, "wb");
  if (!hlen) hlen = strlen(header);
  for (int b = 0; b < 8; b++) fputc((int)(hlen >> (8 * b)) & 0xff, f);
  fputs(header, f);
  for (size_t i = 0; i < data_len; i++) fputc(0, f);
  fclose(f);
}

#define P "rt_st_bad.safetensors"
/* One F32 header entry: "name":{"dtype":"F32","shape":shape,"data_offsets":[b,e]} */
#define E(name, shape, b, e) \
  "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void expect_reject(const char *header, uint64_t hlen, size_t data_len, const char *needle) {
  craft(P, header, hlen, data_len);
  RtSt *st = (RtSt *)1;
  CHECK_FAILS(rt_st_open(&st, P), needle);
  CHECK(st == NULL);
}

static void test_reject(void) {
  /* Sanity: the crafting itself makes valid files. */
  craft(P, "{" E("a", "[2]", 0, 8) "," E("b", "[1]", 8, 12) "}", 0, 12);
  RtSt *st;
  CHECK_OK(rt_st_open(&st, P));
  rt_st_close(st);

  FILE *f = fopen(P, "wb");
  fputs("abc", f);
  fclose(f);
  CHECK_FAILS(rt_st_open(&st, P), "only 3 bytes, shorter than the 8-byte header length");
  expect_reject("{}", 1000, 0, "header length 1000 does not fit in the 10-byte file");
  expect_reject("{}", (uint64_t)1 << 40, 0, "does not fit");
  expect_reject("{\"a\": ", 0, 0, "header is not a valid JSON object");
  expect_reject("[1, 2]", 0, 0, "header is not a valid JSON object");
  expect_reject("{} x", 0, 0, "unexpected bytes after the JSON header");
  expect_reject("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 0, 4,
                "tensor 'w' has dtype BF16; parc reads only F32");
  expect_reject("{\"w\":{\"dtype\":\"F32\"}}", 0, 0, "tensor 'w' lacks");
  expect_reject("{\"w\":3}", 0, 0, "entry 'w' is not an object");
  expect_reject("{" E("w", "[-1]", 0, 4) "}", 0, 4, "tensor 'w' has a shape entry");
  expect_reject("{" E("w", "[1.5]", 0, 4) "}", 0, 4, "tensor 'w' has a shape entry");
  expect_reject("{" E("w", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 0, 4, "rank 9");
  expect_reject("{" E("w", "[4]", 0, 16) "}", 0, 8,
                "tensor 'w' has data_offsets [0, 16] outside the 8-byte data section");
  expect_reject("{" E("w", "[1]", 8, 4) "}", 0, 8, "outside");
  expect_reject("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 0, 4,
                "needs data_offsets [begin, end]");
  expect_reject("{" E("w", "[3]", 0, 8) "}", 0, 8,
                "tensor 'w' of shape [3] needs 12 bytes but data_offsets span 8");
  expect_reject("{" E("a", "[2]", 0, 8) "," E("b", "[2]", 4, 12) "}", 0, 12,
                "tensors 'a' and 'b' overlap");
  expect_reject("{" E("a", "[1]", 0, 4) "," E("b", "[1]", 8, 12) "}", 0, 12,
                "data bytes [4, 8) belong to no tensor");
  expect_reject("{" E("a", "[1]", 0, 4) "}", 0, 8, "4 data bytes follow the last tensor");
  expect_reject("{" E("a", "[1]", 0, 4) "," E("a", "[1]", 4, 8) "}", 0, 8,
                "tensor 'a' appears twice");
  expect_reject("{\"__metadata__\":{\"k\":1}," E("a", "[1]", 0, 4) "}", 0, 4,
                "metadata value of 'k' is not a string");
  expect_reject("{\"__metadata__\":[]}", 0, 0, "is not an object of strings");
  CHECK_FAILS(rt_st_open(&st, "rt_st_missing.safetensors"),
              "safetensors file rt_st_missing.safetensors: cannot open");

  /* A valid file cut short anywhere is rejected. */
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = (float)i;
  RtStTensor t[2] = {{.name = "x", .rank = 2, .shape = {4, 8}, .data = v},
                     {.name = "y", .rank = 1, .shape = {32}, .data = v + 32}};
  CHECK_OK(rt_st_write("rt_st_full.safetensors", t, 2, NULL, 0));
  FILE *in = fopen("rt_st_full.safetensors", "rb");
  unsigned char buf[2048];
  size_t n = in ? fread(buf, 1, sizeof buf, in) : 0;
  if (in) fclose(in);
  int all_rejected = 1;
  for (size_t cut = 0; cut < n; cut += 7) {
    FILE *o = fopen(P, "wb");
    fwrite(buf, 1, cut, o);
    fclose(o);
    st = NULL;
    rt_clear_error();
    if (rt_st_open(&st, P) == 0 || strchr(rt_last_error(), '\n') || !rt_last_error()[0]) {
      all_rejected = 0;
      rt_st_close(st);
    }
  }
  CHECK(all_rejected);
}

int main(void) {
  test_roundtrip();
  test_write_errors_and_atomicity();
  test_reject();
  return check_result("test_safetensors");
}
