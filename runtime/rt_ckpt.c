/* runtime/rt_ckpt.c -- atomically published checkpoint directories; see rt_ckpt.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/rt_err.h"
#include "runtime/rt_fs.h"

#define NEW_SUFFIX ".new"
#define OLD_SUFFIX ".old"

static void (*crash_hook)(const char *point, int index);

void rt_ckpt_set_crash_hook(void (*hook)(const char *point, int index)) { crash_hook = hook; }

static void crash_point(const char *point, int index) {
  if (crash_hook) crash_hook(point, index);
}

typedef struct {
  char *name;
  uint64_t bytes;
} FileRec;

typedef struct {
  FileRec *f;
  int n, cap;
} FileList;

static void list_free(FileList *l) {
  for (int i = 0; i < l->n; i++) free(l->f[i].name);
  free(l->f);
  l->f = NULL;
  l->n = l->cap = 0;
}

static int list_find(const FileList *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->f[i].name, name)) return i;
  return -1;
}

static int list_add(FileList *l, const char *name, uint64_t bytes) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    FileRec *f = realloc(l->f, sizeof *f * (size_t)cap);
    if (!f) return rt_fail("checkpoint: out of memory");
    l->f = f;
    l->cap = cap;
  }
  size_t n = strlen(name) + 1;
  char *copy = malloc(n);
  if (!copy) return rt_fail("checkpoint: out of memory");
  memcpy(copy, name, n);
  l->f[l->n++] = (FileRec){copy, bytes};
  return RT_OK;
}

/* Plain file names only: no directories, no hidden files, not the manifest. */
static int check_name(const char *dir, const char *name) {
  int ok = name && name[0] && name[0] != '.' && strlen(name) < 256 &&
           strcmp(name, RT_CKPT_MANIFEST) != 0;
  for (const char *p = name; ok && *p; p++)
    ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
         *p == '.' || *p == '_' || *p == '-';
  if (!ok)
    return rt_fail("checkpoint %s: file name '%s' is not allowed; use [A-Za-z0-9._-], not "
                   "starting with '.', and not '%s'", dir, name ? name : "(null)",
                   RT_CKPT_MANIFEST);
  return RT_OK;
}

static int join(char *buf, size_t cap, const char *a, const char *sep, const char *b) {
  if (snprintf(buf, cap, "%s%s%s", a, sep, b) >= (int)cap)
    return rt_fail("checkpoint path %s%s%s is too long", a, sep, b);
  return RT_OK;
}

/* DIR without trailing slashes, and its .new / .old siblings. */
typedef struct {
  char dir[PATH_MAX], nu[PATH_MAX], old[PATH_MAX];
} Paths;

static int make_paths(Paths *p, const char *dir) {
  size_t n = dir ? strlen(dir) : 0;
  while (n > 1 && dir[n - 1] == '/') n--;
  if (n == 0 || n + 8 >= sizeof p->dir)
    return rt_fail("checkpoint directory '%s' is empty or too long", dir ? dir : "(null)");
  memcpy(p->dir, dir, n);
  p->dir[n] = '\0';
  const char *base = strrchr(p->dir, '/');
  base = base ? base + 1 : p->dir;
  if (!strcmp(base, ".") || !strcmp(base, "..") || !strcmp(p->dir, "/"))
    return rt_fail("checkpoint directory '%s' must name a directory of its own (e.g. "
                   "out/ckpt), not '.', '..' or '/'", dir);
  if (join(p->nu, sizeof p->nu, p->dir, "", NEW_SUFFIX) ||
      join(p->old, sizeof p->old, p->dir, "", OLD_SUFFIX))
    return RT_ERR;
  return RT_OK;
}

/* ---- manifest ---- */

static int write_manifest(const char *stage, const FileList *l) {
  cJSON *root = cJSON_CreateObject();
  cJSON *files = NULL;
  int ok = root && cJSON_AddStringToObject(root, "format", RT_CKPT_FORMAT) &&
           cJSON_AddNumberToObject(root, "version", RT_CKPT_VERSION) &&
           (files = cJSON_AddArrayToObject(root, "files"));
  for (int i = 0; ok && i < l->n; i++) {
    cJSON *f = cJSON_CreateObject();
    ok = f && cJSON_AddItemToArray(files, f) && cJSON_AddStringToObject(f, "name", l->f[i].name) &&
         cJSON_AddNumberToObject(f, "bytes", (double)l->f[i].bytes);
  }
  char *text = ok ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return rt_fail("checkpoint %s: out of memory writing the manifest", stage);
  char path[PATH_MAX];
  int rc = join(path, sizeof path, stage, "/", RT_CKPT_MANIFEST);
  if (rc == RT_OK) {
    size_t len = strlen(text);
    text[len] = '\n';   /* replaces the terminator; length passed explicitly */
    RtFsChunk c = {text, len + 1};
    rc = rt_fs_write_new(path, &c, 1);
  }
  cJSON_free(text);
  return rc;
}

/* Parses DIR/manifest.json into l and checks every file's size. */
static int load_manifest(const char *dir, FileList *l) {
  char path[PATH_MAX];
  if (join(path, sizeof path, dir, "/", RT_CKPT_MANIFEST)) return RT_ERR;
  void *text;
  size_t len;
  if (rt_fs_read_all(path, &text, &len))
    return rt_fail("checkpoint %s: no readable %s; the checkpoint is incomplete or not a parc "
                   "checkpoint", dir, RT_CKPT_MANIFEST);
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
  int rc = RT_OK;
  if (!root || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, RT_CKPT_FORMAT) != 0 ||
      !cJSON_IsNumber(ver) || !cJSON_IsArray(files))
    rc = rt_fail("checkpoint %s: %s is not a valid parc checkpoint manifest; the checkpoint "
                 "is damaged", dir, RT_CKPT_MANIFEST);
  else if (ver->valuedouble != RT_CKPT_VERSION)
    rc = rt_fail("checkpoint %s: manifest version %g, this runtime reads version %d; use the "
                 "parc version that wrote it", dir, ver->valuedouble, RT_CKPT_VERSION);
  for (const cJSON *f = files ? files->child : NULL; rc == RT_OK && f; f = f->next) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(f, "bytes");
    if (!cJSON_IsString(name) || !cJSON_IsNumber(bytes) || bytes->valuedouble < 0 ||
        bytes->valuedouble != floor(bytes->valuedouble)) {
      rc = rt_fail("checkpoint %s: a manifest entry lacks a string \"name\" or an integer "
                   "\"bytes\"; the checkpoint is damaged", dir);
      break;
    }
    if ((rc = check_name(dir, name->valuestring))) break;
    if (list_find(l, name->valuestring) >= 0) {
      rc = rt_fail("checkpoint %s: file '%s' is listed twice in the manifest", dir,
                   name->valuestring);
      break;
    }
    uint64_t want = (uint64_t)bytes->valuedouble;
    char fp[PATH_MAX];
    struct stat st;
    if ((rc = join(fp, sizeof fp, dir, "/", name->valuestring))) break;
    if (stat(fp, &st) != 0 || !S_ISREG(st.st_mode))
      rc = rt_fail("checkpoint %s: file '%s' listed in the manifest is missing; the "
                   "checkpoint is damaged", dir, name->valuestring);
    else if ((uint64_t)st.st_size != want)
      rc = rt_fail("checkpoint %s: file '%s' has %lld bytes, the manifest says %llu; the "
                   "checkpoint is damaged", dir, name->valuestring, (long long)st.st_size,
                   (unsigned long long)want);
    else
      rc = list_add(l, name->valuestring, want);
  }
  cJSON_Delete(root);
  if (rc) list_free(l);
  return rc;
}

/* Whether dir holds a complete checkpoint; a probe, so the error buffer is kept. */
static int complete(const char *dir) {
  char saved[RT_ERR_MAX];
  memcpy(saved, rt_last_error(), sizeof saved);
  FileList l = {0};
  int ok = rt_fs_kind(dir) == 2 && load_manifest(dir, &l) == RT_OK;
  list_free(&l);
  if (!ok) {
    rt_clear_error();
    if (saved[0]) rt_fail("%s", saved);
  }
  return ok;
}

/* ---- recovery and writing ---- */

static int rename_synced(const char *from, const char *to) {
  if (rename(from, to) != 0)
    return rt_fail("checkpoint: cannot rename %s to %s (%s)", from, to, strerror(errno));
  return rt_fs_fsync_parent(to);
}

static int recover(const Paths *p) {
  if (rt_fs_kind(p->dir) == 2) {
    /* The swap never started (DIR.new is unpublished) or finished (DIR.old is stale). */
    if (rt_fs_remove_tree(p->nu) || rt_fs_remove_tree(p->old)) return RT_ERR;
    return RT_OK;
  }
  if (rt_fs_kind(p->dir) != 0)
    return rt_fail("checkpoint path %s exists but is not a directory; move it away", p->dir);
  if (complete(p->nu)) {          /* killed between the two renames: finish the swap */
    if (rename_synced(p->nu, p->dir)) return RT_ERR;
    return rt_fs_remove_tree(p->old);
  }
  if (rt_fs_remove_tree(p->nu)) return RT_ERR;
  if (rt_fs_kind(p->old) == 2) return rename_synced(p->old, p->dir);   /* roll back */
  return RT_OK;
}

int rt_ckpt_recover(const char *dir) {
  Paths p;
  if (make_paths(&p, dir)) return RT_ERR;
  return recover(&p);
}

struct RtCkptTxn {
  Paths p;
  FileList files;
};

int rt_ckpt_begin(RtCkptTxn **out, const char *dir) {
  *out = NULL;
  RtCkptTxn *t = calloc(1, sizeof *t);
  if (!t) return rt_fail("checkpoint %s: out of memory", dir);
  char parent[PATH_MAX];
  if (make_paths(&t->p, dir) || rt_fs_dirname(t->p.dir, parent, sizeof parent) ||
      rt_fs_mkdirs(parent) || recover(&t->p)) {
    free(t);
    return RT_ERR;
  }
  if (mkdir(t->p.nu, 0755) != 0) {
    rt_fail("checkpoint: cannot create staging directory %s (%s); check permissions and "
            "free space", t->p.nu, strerror(errno));
    free(t);
    return RT_ERR;
  }
  *out = t;
  return RT_OK;
}

int rt_ckpt_staging_path(const RtCkptTxn *t, const char *name, char *buf, size_t cap) {
  if (check_name(t->p.dir, name)) return RT_ERR;
  return join(buf, cap, t->p.nu, "/", name);
}

static int check_new(RtCkptTxn *t, const char *name) {
  if (check_name(t->p.dir, name)) return RT_ERR;
  if (list_find(&t->files, name) >= 0)
    return rt_fail("checkpoint %s: file '%s' added twice; give each file its own name",
                   t->p.dir, name);
  return RT_OK;
}

int rt_ckpt_add(RtCkptTxn *t, const char *name, const void *data, size_t len) {
  char path[PATH_MAX];
  if (check_new(t, name) || join(path, sizeof path, t->p.nu, "/", name)) return RT_ERR;
  RtFsChunk c = {data, len};
  if (rt_fs_write_new(path, &c, 1) || list_add(&t->files, name, len)) return RT_ERR;
  crash_point("file", t->files.n - 1);
  return RT_OK;
}

int rt_ckpt_add_written(RtCkptTxn *t, const char *name) {
  char path[PATH_MAX];
  struct stat st;
  if (check_new(t, name) || join(path, sizeof path, t->p.nu, "/", name)) return RT_ERR;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return rt_fail("checkpoint %s: file '%s' was not written at %s; write it at the path "
                   "from rt_ckpt_staging_path first", t->p.dir, name, path);
  if (rt_fs_fsync_file(path) || list_add(&t->files, name, (uint64_t)st.st_size))
    return RT_ERR;
  crash_point("file", t->files.n - 1);
  return RT_OK;
}

void rt_ckpt_abort(RtCkptTxn *t) {
  if (!t) return;
  rt_fs_remove_tree(t->p.nu);
  list_free(&t->files);
  free(t);
}

int rt_ckpt_commit(RtCkptTxn *t) {
  const Paths *p = &t->p;
  int rc = write_manifest(p->nu, &t->files);
  if (rc == RT_OK) crash_point("manifest", 0);
  if (rc == RT_OK) rc = rt_fs_fsync_dir(p->nu);
  if (rc == RT_OK) rc = rt_fs_fsync_parent(p->nu);
  if (rc) {
    rt_ckpt_abort(t);
    return rc;
  }
  crash_point("staged", 0);
  /* From here on the new checkpoint is complete; recover() finishes any kill. */
  int had_old = rt_fs_kind(p->dir) == 2;
  if (had_old) {
    if ((rc = rename_synced(p->dir, p->old))) goto out;
    crash_point("old-moved", 0);
  }
  if ((rc = rename_synced(p->nu, p->dir))) goto out;
  crash_point("new-moved", 0);
  if (had_old && (rc = rt_fs_remove_tree(p->old))) goto out;
  rc = rt_fs_fsync_parent(p->dir);
  crash_point("done", 0);
out:
  list_free(&t->files);
  free(t);
  return rc;
}

int rt_ckpt_write(const char *dir, const RtCkptFile *files, int n) {
  RtCkptTxn *t;
  if (rt_ckpt_begin(&t, dir)) return RT_ERR;
  for (int i = 0; i < n; i++)
    if (rt_ckpt_add(t, files[i].name, files[i].data, files[i].len)) {
      /* Keep the message of the failure, not of the cleanup. */
      char msg[RT_ERR_MAX];
      memcpy(msg, rt_last_error(), sizeof msg);
      rt_ckpt_abort(t);
      return rt_fail("%s", msg);
    }
  return rt_ckpt_commit(t);
}

/* ---- reading ---- */

struct RtCkpt {
  char dir[PATH_MAX];
  FileList files;
};

int rt_ckpt_open(RtCkpt **out, const char *dir) {
  *out = NULL;
  Paths p;
  if (make_paths(&p, dir)) return RT_ERR;
  RtCkpt *ck = calloc(1, sizeof *ck);
  if (!ck) return rt_fail("checkpoint %s: out of memory", dir);
  /* A writer may be swapping right now: DIR can vanish between two looks, so a few
   * rounds of looking settle it. */
  for (int attempt = 0; attempt < 3; attempt++) {
    const char *pick = NULL;
    if (rt_fs_kind(p.dir) == 2) pick = p.dir;
    else if (complete(p.nu)) pick = p.nu;
    else if (rt_fs_kind(p.old) == 2) pick = p.old;
    if (!pick) continue;
    memcpy(ck->dir, pick, strlen(pick) + 1);
    if (load_manifest(ck->dir, &ck->files) == RT_OK) {
      *out = ck;
      return RT_OK;
    }
    if (pick == p.dir && rt_fs_kind(p.dir) == 2) {   /* DIR itself is damaged */
      free(ck);
      return RT_ERR;
    }
  }
  free(ck);
  return rt_fail("no checkpoint at %s (nor a complete %s or %s); check the path or start "
                 "without resuming", p.dir, NEW_SUFFIX, OLD_SUFFIX);
}

void rt_ckpt_close(RtCkpt *ck) {
  if (!ck) return;
  list_free(&ck->files);
  free(ck);
}

int rt_ckpt_count(const RtCkpt *ck) { return ck->files.n; }

const char *rt_ckpt_name(const RtCkpt *ck, int i) {
  return (i >= 0 && i < ck->files.n) ? ck->files.f[i].name : NULL;
}

const char *rt_ckpt_dir(const RtCkpt *ck) { return ck->dir; }

static int lookup(const RtCkpt *ck, const char *name) {
  int i = list_find(&ck->files, name);
  if (i < 0)
    rt_fail("checkpoint %s has no file '%s'; it was written by another trainer or "
            "configuration", ck->dir, name);
  return i;
}

int64_t rt_ckpt_size(const RtCkpt *ck, const char *name) {
  int i = lookup(ck, name);
  return i < 0 ? -1 : (int64_t)ck->files.f[i].bytes;
}

int rt_ckpt_path(const RtCkpt *ck, const char *name, char *buf, size_t cap) {
  if (lookup(ck, name) < 0) return RT_ERR;
  return join(buf, cap, ck->dir, "/", name);
}

int rt_ckpt_read(const RtCkpt *ck, const char *name, void **data, size_t *len) {
  char path[PATH_MAX];
  int i = lookup(ck, name);
  if (i < 0 || join(path, sizeof path, ck->dir, "/", name) || rt_fs_read_all(path, data, len))
    return RT_ERR;
  if (*len != ck->files.f[i].bytes) {
    free(*data);
    *data = NULL;
    return rt_fail("checkpoint %s: file '%s' has %zu bytes, the manifest says %llu; the "
                   "checkpoint changed while reading", ck->dir, name, *len,
                   (unsigned long long)ck->files.f[i].bytes);
  }
  return RT_OK;
}

int rt_ckpt_read_into(const RtCkpt *ck, const char *name, void *dst, size_t len) {
  int i = lookup(ck, name);
  if (i < 0) return RT_ERR;
  if (ck->files.f[i].bytes != len)
    return rt_fail("checkpoint %s: file '%s' has %llu bytes but the trainer expects %zu; the "
                   "checkpoint is from another model configuration", ck->dir, name,
                   (unsigned long long)ck->files.f[i].bytes, len);
  char path[PATH_MAX];
  if (join(path, sizeof path, ck->dir, "/", name)) return RT_ERR;
  return rt_fs_read_into(path, dst, len);
}
