/* tests/runtime/test_ckpt.c -- checkpoint directories: round trip, damage detection,
 * and atomicity: a child process SIGKILLed at every crash point of a write, and at
 * random moments of a stream of writes, leaves the old or the new checkpoint
 * complete, and the next write recovers. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_ckpt.h"
#include "runtime/rt_fs.h"
#include "runtime/rt_safetensors.h"
#include "tests/runtime/check.h"

enum { NFILES = 3 };
static const char *const file_names[NFILES] = {"model.bin", "optim.bin", "state.json"};
static char root[64];   /* per-run scratch directory */

/* Contents of file i of checkpoint version v: its size and every byte depend on v. */
static size_t file_size(int v, int i) { return 3000 + (size_t)(v % 50) * 17 + (size_t)i * 5; }
static uint8_t file_byte(int v, int i, size_t k) { return (uint8_t)(v * 31 + i * 7 + k); }

static int write_version(const char *dir, int v) {
  RtCkptFile f[NFILES];
  uint8_t *buf[NFILES];
  for (int i = 0; i < NFILES; i++) {
    size_t n = file_size(v, i);
    buf[i] = malloc(n);
    for (size_t k = 0; k < n; k++) buf[i][k] = file_byte(v, i, k);
    f[i] = (RtCkptFile){file_names[i], buf[i], n};
  }
  int rc = rt_ckpt_write(dir, f, NFILES);
  for (int i = 0; i < NFILES; i++) free(buf[i]);
  return rc;
}

/* The version of the complete checkpoint at dir, or -1 if it cannot be opened or
 * its files do not all belong to one version. */
static int read_version(const char *dir) {
  RtCkpt *ck;
  if (rt_ckpt_open(&ck, dir)) return -1;
  int v = -1;
  void *data;
  size_t len;
  if (rt_ckpt_count(ck) == NFILES && rt_ckpt_read(ck, file_names[0], &data, &len) == 0) {
    /* The first byte names the version modulo 256 (v * 31 mod 256 is a bijection). */
    for (int c = 0; c < 256; c++)
      if (file_byte(c, 0, 0) == ((uint8_t *)data)[0]) v = c;
    free(data);
  }
  for (int i = 0; v >= 0 && i < NFILES; i++) {
    size_t n = file_size(v, i);
    uint8_t *got = malloc(n);
    if (rt_ckpt_size(ck, file_names[i]) != (int64_t)n ||
        rt_ckpt_read_into(ck, file_names[i], got, n) != 0)
      v = -1;
    for (size_t k = 0; v >= 0 && k < n; k++)
      if (got[k] != file_byte(v, i, k)) v = -1;
    free(got);
  }
  rt_ckpt_close(ck);
  return v;
}

static int leftovers(const char *dir) {
  char p[256];
  snprintf(p, sizeof p, "%s.new", dir);
  int n = rt_fs_kind(p) != 0;
  snprintf(p, sizeof p, "%s.old", dir);
  return n + (rt_fs_kind(p) != 0);
}

static void test_roundtrip_and_damage(void) {
  char dir[128], p[256];
  snprintf(dir, sizeof dir, "%s/nested/ck", root);   /* parents are created */
  CHECK_OK(write_version(dir, 3));
  CHECK(read_version(dir) == 3);
  CHECK_OK(write_version(dir, 4));   /* replaces */
  CHECK(read_version(dir) == 4 && leftovers(dir) == 0);
  snprintf(p, sizeof p, "%s/", dir);  /* a trailing slash names the same checkpoint */
  CHECK(read_version(p) == 4);

  RtCkpt *ck;
  CHECK_OK(rt_ckpt_open(&ck, dir));
  if (ck) {
    uint8_t small[10];
    CHECK_FAILS(rt_ckpt_read_into(ck, "model.bin", small, sizeof small),
                "file 'model.bin' has 3068 bytes but the trainer expects 10");
    CHECK_FAILS(rt_ckpt_size(ck, "rng.bin") < 0 ? -1 : 0, "has no file 'rng.bin'");
    CHECK(!strcmp(rt_ckpt_dir(ck), dir) && !strcmp(rt_ckpt_name(ck, 2), "state.json"));
    rt_ckpt_close(ck);
  }
  /* Damage is named. */
  snprintf(p, sizeof p, "%s/optim.bin", dir);
  FILE *f = fopen(p, "ab");
  fputc(0, f);
  fclose(f);
  CHECK_FAILS(rt_ckpt_open(&ck, dir), "file 'optim.bin' has 3074 bytes, the manifest says 3073");
  remove(p);
  CHECK_FAILS(rt_ckpt_open(&ck, dir), "file 'optim.bin' listed in the manifest is missing");
  snprintf(p, sizeof p, "%s/manifest.json", dir);
  f = fopen(p, "wb");
  fputs("{\"format\": \"parc-checkpoint\", \"version\": 2, \"files\": []}", f);
  fclose(f);
  CHECK_FAILS(rt_ckpt_open(&ck, dir), "manifest version 2, this runtime reads version 1");
  f = fopen(p, "wb");
  fputs("{\"format\": \"parc-chec", f);
  fclose(f);
  CHECK_FAILS(rt_ckpt_open(&ck, dir), "is not a valid parc checkpoint manifest");
  remove(p);
  CHECK_FAILS(rt_ckpt_open(&ck, dir), "no readable manifest.json");
  snprintf(p, sizeof p, "%s/none", root);
  CHECK_FAILS(rt_ckpt_open(&ck, p), "no checkpoint at");
  CHECK_FAILS(rt_ckpt_open(&ck, "."), "must name a directory of its own");

  /* Names, duplicates, and a regular file in the way. */
  RtCkptTxn *t;
  snprintf(p, sizeof p, "%s/names", root);
  CHECK_OK(rt_ckpt_begin(&t, p));
  if (t) {
    CHECK_FAILS(rt_ckpt_add(t, "../escape", "x", 1), "file name '../escape' is not allowed");
    CHECK_FAILS(rt_ckpt_add(t, "manifest.json", "x", 1), "not allowed");
    CHECK_FAILS(rt_ckpt_add(t, ".hidden", "x", 1), "not allowed");
    CHECK_OK(rt_ckpt_add(t, "a.bin", "x", 1));
    CHECK_FAILS(rt_ckpt_add(t, "a.bin", "y", 1), "file 'a.bin' added twice");
    CHECK_FAILS(rt_ckpt_add_written(t, "b.bin"), "file 'b.bin' was not written");
    rt_ckpt_abort(t);
  }
  CHECK(leftovers(p) == 0 && rt_fs_kind(p) == 0);
  snprintf(p, sizeof p, "%s/plainfile", root);
  f = fopen(p, "wb");
  fclose(f);
  CHECK_FAILS(rt_ckpt_begin(&t, p), "exists but is not a directory");

  /* Files written by other writers into the staging directory (safetensors). */
  snprintf(p, sizeof p, "%s/with_st", root);
  CHECK_OK(rt_ckpt_begin(&t, p));
  if (t) {
    char sp[256];
    float w[6] = {1, 2, 3, 4, 5, 6};
    RtStTensor tensor = {.name = "wte.weight", .rank = 2, .shape = {2, 3}, .data = w};
    CHECK_OK(rt_ckpt_staging_path(t, "model.safetensors", sp, sizeof sp));
    CHECK_OK(rt_st_write(sp, &tensor, 1, NULL, 0));
    CHECK_OK(rt_ckpt_add_written(t, "model.safetensors"));
    CHECK_OK(rt_ckpt_add(t, "step.txt", "120\n", 4));
    CHECK_OK(rt_ckpt_commit(t));
  }
  CHECK_OK(rt_ckpt_open(&ck, p));
  if (ck) {
    char sp[256];
    RtSt *st = NULL;
    float g[6] = {0};
    CHECK_OK(rt_ckpt_path(ck, "model.safetensors", sp, sizeof sp));
    CHECK_OK(rt_st_open(&st, sp));
    if (st) {
      CHECK_OK(rt_st_read(st, "wte.weight", g, 2, (const int64_t[]){2, 3}));
      CHECK(g[5] == 6);
      rt_st_close(st);
    }
    rt_ckpt_close(ck);
  }
}

static const char *crash_point_name;
static int crash_index;

static void crash_hook(const char *point, int index) {
  if (!strcmp(point, crash_point_name) && index == crash_index) kill(getpid(), SIGKILL);
}

/* Runs write_version(dir, v) in a child that SIGKILLs itself at (point, index). */
static int killed_write(const char *dir, int v, const char *point, int index) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    crash_point_name = point;
    crash_index = index;
    rt_ckpt_set_crash_hook(crash_hook);
    write_version(dir, v);
    _exit(3);   /* not reached when the hook fires */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

static void test_kill_points(void) {
  static const struct {
    const char *point;
    int index;
    int want_new;   /* which checkpoint survives: 0 the old one, 1 the new one */
  } cases[] = {
    {"file", 0, 0}, {"file", 1, 0}, {"file", 2, 0}, {"manifest", 0, 0}, {"staged", 0, 0},
    {"old-moved", 0, 1}, {"new-moved", 0, 1}, {"done", 0, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/kill%zu", root, c);
    CHECK_OK(write_version(dir, 10));
    CHECK(killed_write(dir, 11, cases[c].point, cases[c].index));
    int want = cases[c].want_new ? 11 : 10;
    int got = read_version(dir);
    if (got != want)
      fprintf(stderr, "kill at %s %d: read version %d, want %d (%s)\n", cases[c].point,
              cases[c].index, got, want, rt_last_error());
    CHECK(got == want);
    CHECK(read_version(dir) == want);   /* opening changed nothing */
    CHECK_OK(write_version(dir, 12));   /* the next write recovers and cleans up */
    CHECK(read_version(dir) == 12 && leftovers(dir) == 0);
  }
  /* The very first checkpoint: killed before completion there is none; after the
   * staging is complete, the new one is found. */
  char dir[128];
  snprintf(dir, sizeof dir, "%s/first_a", root);
  CHECK(killed_write(dir, 5, "file", 1));
  RtCkpt *ck;
  CHECK_FAILS(rt_ckpt_open(&ck, dir), "no checkpoint at");
  CHECK_OK(rt_ckpt_recover(dir));
  CHECK(leftovers(dir) == 0);
  snprintf(dir, sizeof dir, "%s/first_b", root);
  CHECK(killed_write(dir, 5, "staged", 0));
  CHECK(read_version(dir) == 5);
  CHECK_OK(rt_ckpt_recover(dir));
  CHECK(read_version(dir) == 5 && leftovers(dir) == 0);
}

/* A child writes versions 1, 2, 3, ... as fast as it can; the parent SIGKILLs it at
 * pseudo-random moments. Every time, one complete version must be readable. */
static void test_kill_random(void) {
  char dir[128];
  snprintf(dir, sizeof dir, "%s/random", root);
  CHECK_OK(write_version(dir, 0));
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  int last = 0;
  for (int round = 0; round < 12; round++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      for (int v = last + 1;; v++) write_version(dir, v % 200);
    }
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    struct timespec ts = {0, (long)(1000000 + (rng >> 33) % 15000000)};   /* 1..16 ms */
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int v = read_version(dir);
    if (v < 0) fprintf(stderr, "random kill round %d: %s\n", round, rt_last_error());
    CHECK(v >= 0);
    if (v >= 0) last = v;
  }
  CHECK_OK(write_version(dir, 199));
  CHECK(read_version(dir) == 199 && leftovers(dir) == 0);
}

int main(void) {
  snprintf(root, sizeof root, "rt_ckpt_XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  test_roundtrip_and_damage();
  test_kill_points();
  test_kill_random();
  int rc = check_result("test_ckpt");
  if (rc == 0) rt_fs_remove_tree(root);
  return rc;
}
