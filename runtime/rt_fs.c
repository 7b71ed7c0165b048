/* runtime/rt_fs.c -- durable file-system operations; see rt_fs.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rt_err.h"

int rt_fs_write_fd(int fd, const void *buf, size_t n, const char *path) {
  const char *p = buf;
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t w = write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return rt_fail("%s: write failed (%s); check free disk space and permissions", path,
                     strerror(errno));
    }
    p += w;
    n -= (size_t)w;
  }
  return RT_OK;
}

int rt_fs_dirname(const char *path, char *buf, size_t cap) {
  const char *slash = strrchr(path, '/');
  size_t n;
  if (!slash) {
    n = 1;
    if (cap < 2) return rt_fail("%s: path too long", path);
    memcpy(buf, ".", 2);
    return RT_OK;
  }
  n = slash == path ? 1 : (size_t)(slash - path);
  if (n + 1 > cap) return rt_fail("%s: path too long (over %zu bytes)", path, cap - 1);
  memcpy(buf, path, n);
  buf[n] = '\0';
  return RT_OK;
}

int rt_fs_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return rt_fail("%s: cannot open directory to sync it (%s)", dir, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  /* Some file systems do not support fsync on directories; that is not data loss. */
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    return rt_fail("%s: fsync of directory failed (%s)", dir, strerror(err));
  return RT_OK;
}

int rt_fs_fsync_parent(const char *path) {
  char dir[PATH_MAX];
  if (rt_fs_dirname(path, dir, sizeof dir)) return RT_ERR;
  return rt_fs_fsync_dir(dir);
}

int rt_fs_fsync_file(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_fail("%s: cannot open to sync it (%s)", path, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) return rt_fail("%s: fsync failed (%s)", path, strerror(err));
  return RT_OK;
}

static int write_chunks_and_sync(int fd, const RtFsChunk *chunks, int n, const char *path) {
  for (int i = 0; i < n; i++)
    if (chunks[i].len && rt_fs_write_fd(fd, chunks[i].data, chunks[i].len, path))
      return RT_ERR;
  if (fsync(fd) != 0)
    return rt_fail("%s: fsync failed (%s); check the disk", path, strerror(errno));
  return RT_OK;
}

/* Removes "<path>.tmp.XXXXXX" files that killed writers of path left behind. */
static void remove_stale_temps(const char *path) {
  char dir[PATH_MAX];
  if (rt_fs_dirname(path, dir, sizeof dir)) return;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t blen = strlen(base);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *name = e->d_name;
    if (strlen(name) != blen + 11 || strncmp(name, base, blen) != 0 ||
        strncmp(name + blen, ".tmp.", 5) != 0)
      continue;
    char stale[PATH_MAX];
    if (snprintf(stale, sizeof stale, "%s/%s", dir, name) < (int)sizeof stale) unlink(stale);
  }
  closedir(d);
}

int rt_fs_write_atomic(const char *path, const RtFsChunk *chunks, int n) {
  char tmp[PATH_MAX];
  remove_stale_temps(path);
  if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
    return rt_fail("%s: path too long", path);
  int fd = mkstemp(tmp);
  if (fd < 0)
    return rt_fail("%s: cannot create temporary file %s (%s); check that the directory "
                   "exists and is writable", path, tmp, strerror(errno));
  if (write_chunks_and_sync(fd, chunks, n, tmp)) {
    close(fd);
    unlink(tmp);
    return RT_ERR;
  }
  /* mkstemp makes 0600; give the usual permissions. */
  fchmod(fd, 0644);
  if (close(fd) != 0) {
    int err = errno;
    unlink(tmp);
    return rt_fail("%s: close failed (%s)", tmp, strerror(err));
  }
  if (rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    return rt_fail("%s: cannot rename temporary file into place (%s)", path, strerror(err));
  }
  return rt_fs_fsync_parent(path);
}

int rt_fs_write_new(const char *path, const RtFsChunk *chunks, int n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0)
    return rt_fail("%s: cannot create file (%s); check that the directory is writable",
                   path, strerror(errno));
  if (write_chunks_and_sync(fd, chunks, n, path)) {
    close(fd);
    return RT_ERR;
  }
  if (close(fd) != 0) return rt_fail("%s: close failed (%s)", path, strerror(errno));
  return RT_OK;
}

int rt_fs_read_all(const char *path, void **data, size_t *len) {
  *data = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_fail("%s: cannot open (%s)", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return rt_fail("%s: not a regular file", path);
  }
  size_t size = (size_t)st.st_size;
  char *buf = malloc(size + 1);
  if (!buf) {
    close(fd);
    return rt_fail("%s: out of memory reading %zu bytes", path, size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = r < 0 ? errno : 0;
      free(buf);
      close(fd);
      return rt_fail("%s: read failed after %zu of %zu bytes (%s)", path, got, size,
                     err ? strerror(err) : "file shrank while reading");
    }
    got += (size_t)r;
  }
  close(fd);
  buf[size] = '\0';
  *data = buf;
  *len = size;
  return RT_OK;
}

int rt_fs_read_into(const char *path, void *dst, size_t len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_fail("%s: cannot open (%s)", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != len) {
    close(fd);
    return rt_fail("%s: expected a regular file of %zu bytes; the file is damaged or from "
                   "another configuration", path, len);
  }
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, (char *)dst + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = r < 0 ? errno : 0;
      close(fd);
      return rt_fail("%s: read failed after %zu of %zu bytes (%s)", path, got, len,
                     err ? strerror(err) : "file shrank while reading");
    }
    got += (size_t)r;
  }
  close(fd);
  return RT_OK;
}

int rt_fs_kind(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  if (S_ISREG(st.st_mode)) return 1;
  if (S_ISDIR(st.st_mode)) return 2;
  return 3;
}

int rt_fs_remove_tree(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return RT_OK;
    return rt_fail("%s: cannot stat (%s)", path, strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path) != 0 && errno != ENOENT)
      return rt_fail("%s: cannot remove (%s)", path, strerror(errno));
    return RT_OK;
  }
  DIR *d = opendir(path);
  if (!d) return rt_fail("%s: cannot open directory (%s)", path, strerror(errno));
  struct dirent *e;
  int rc = RT_OK;
  while (rc == RT_OK && (e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char child[PATH_MAX];
    if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child)
      rc = rt_fail("%s/%s: path too long", path, e->d_name);
    else
      rc = rt_fs_remove_tree(child);
  }
  closedir(d);
  if (rc) return rc;
  if (rmdir(path) != 0 && errno != ENOENT)
    return rt_fail("%s: cannot remove directory (%s)", path, strerror(errno));
  return RT_OK;
}

int rt_fs_mkdirs(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return rt_fail("'%s': empty or too long directory path", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return rt_fail("%s: cannot create directory (%s); check permissions", buf,
                     strerror(errno));
    if (rt_fs_kind(buf) != 2)
      return rt_fail("%s: exists but is not a directory; choose another path", buf);
    buf[i] = c;
  }
  return RT_OK;
}
