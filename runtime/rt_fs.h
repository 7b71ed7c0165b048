/* runtime/rt_fs.h -- durable file-system operations shared by the writers.
 *
 * Invariants:
 *  - rt_fs_write_atomic makes `path` either its previous content or the complete new
 *    content, whatever moment the process dies: the bytes go to a temporary file in
 *    the same directory, which is fsynced, renamed over `path`, and the directory is
 *    fsynced. A kill leaves at most a stale "<path>.tmp.XXXXXX" behind, which the
 *    next write of the same path removes (so: one writer per path at a time).
 *  - Every function reports failures through rt_err with the path and errno text. */
#ifndef PARC_RT_FS_H
#define PARC_RT_FS_H

#include <stddef.h>

typedef struct {
  const void *data;
  size_t len;
} RtFsChunk;

/* Atomically replaces path with the concatenation of chunks[0..n). */
int rt_fs_write_atomic(const char *path, const RtFsChunk *chunks, int n);
/* Writes and fsyncs a new file (O_EXCL: path must not exist); for files inside a
 * directory that is itself published atomically (checkpoints). */
int rt_fs_write_new(const char *path, const RtFsChunk *chunks, int n);
/* Writes all n bytes to fd, retrying short writes; path is for messages. */
int rt_fs_write_fd(int fd, const void *buf, size_t n, const char *path);
/* fsyncs a directory, or the directory that contains path. */
int rt_fs_fsync_dir(const char *dir);
int rt_fs_fsync_parent(const char *path);
/* fsyncs an existing regular file. */
int rt_fs_fsync_file(const char *path);
/* Reads a whole file into a malloc'd buffer (NUL-terminated beyond len). */
int rt_fs_read_all(const char *path, void **data, size_t *len);
/* Reads a file of exactly len bytes into dst (another size is an error). */
int rt_fs_read_into(const char *path, void *dst, size_t len);
/* 0: nothing there, 1: regular file, 2: directory, 3: something else. */
int rt_fs_kind(const char *path);
/* Removes a file or a directory tree; a missing path is not an error. */
int rt_fs_remove_tree(const char *path);
/* Creates directory path and any missing parents (mode 0755); existing is fine. */
int rt_fs_mkdirs(const char *path);
/* Writes the directory part of path ("." if none) into buf. */
int rt_fs_dirname(const char *path, char *buf, size_t cap);

#endif
