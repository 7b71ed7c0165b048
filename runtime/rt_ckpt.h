/* runtime/rt_ckpt.h -- full-training-state checkpoints: a directory published atomically.
 *
 * A checkpoint is a directory DIR of flat files plus "manifest.json":
 *   {"format": "parc-checkpoint", "version": 1,
 *    "files": [{"name": "model.safetensors", "bytes": 497759232}, ...]}
 *
 * Invariants:
 *  - Writing stages every file in the sibling DIR.new (each file fsynced, the manifest
 *    written last, then the directory fsynced), then swaps: DIR -> DIR.old,
 *    DIR.new -> DIR, remove DIR.old, with the parent fsynced after each rename.
 *  - A kill at any moment leaves the old complete checkpoint or the new complete one:
 *    DIR.new counts as complete only when its manifest parses and every listed file
 *    has the listed size. rt_ckpt_open finds the complete one without changing
 *    anything (DIR; else a complete DIR.new; else DIR.old); the next rt_ckpt_begin
 *    (rt_ckpt_recover) finishes or rolls back the interrupted swap and removes stale
 *    staging directories.
 *  - One writer per DIR at a time (rank 0, or one DIR per rank). rt_ckpt_open never
 *    returns a torn checkpoint, even while a writer swaps; but a writer that replaces
 *    DIR afterwards removes the files under an open handle, so do not read and write
 *    one DIR at the same time.
 *  - File names are plain: [A-Za-z0-9._-], not starting with '.', not "manifest.json". */
#ifndef PARC_RT_CKPT_H
#define PARC_RT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define RT_CKPT_FORMAT "parc-checkpoint"
#define RT_CKPT_VERSION 1
#define RT_CKPT_MANIFEST "manifest.json"

typedef struct {
  const char *name;
  const void *data;
  size_t len;
} RtCkptFile;

/* ---- writing ---- */

typedef struct RtCkptTxn RtCkptTxn;

/* Recovers DIR from an interrupted write (see above), then creates a fresh DIR.new.
 * Missing parent directories are created. */
int rt_ckpt_begin(RtCkptTxn **out, const char *dir);
/* Writes one file into the staging directory and fsyncs it. */
int rt_ckpt_add(RtCkptTxn *txn, const char *name, const void *data, size_t len);
/* Path in the staging directory where the caller may write file `name` itself
 * (e.g. with rt_st_write); register it afterwards with rt_ckpt_add_written. */
int rt_ckpt_staging_path(const RtCkptTxn *txn, const char *name, char *buf, size_t cap);
/* Records a file the caller wrote at its staging path: fsyncs it, notes its size. */
int rt_ckpt_add_written(RtCkptTxn *txn, const char *name);
/* Writes the manifest and publishes the checkpoint; frees txn in every case. */
int rt_ckpt_commit(RtCkptTxn *txn);
/* Drops the staging directory; frees txn. */
void rt_ckpt_abort(RtCkptTxn *txn);

/* begin + add each file + commit. */
int rt_ckpt_write(const char *dir, const RtCkptFile *files, int n);

/* Finishes or rolls back an interrupted write and removes stale DIR.new / DIR.old. */
int rt_ckpt_recover(const char *dir);

/* ---- reading ---- */

typedef struct RtCkpt RtCkpt;

/* Opens the complete checkpoint at DIR (or its complete sibling after a kill) and
 * checks the manifest: format, version, names, and every file's size. */
int rt_ckpt_open(RtCkpt **out, const char *dir);
void rt_ckpt_close(RtCkpt *ck);
int rt_ckpt_count(const RtCkpt *ck);
const char *rt_ckpt_name(const RtCkpt *ck, int i);
/* Size of file `name` from the manifest; -1 (and an error) if it is not listed. */
int64_t rt_ckpt_size(const RtCkpt *ck, const char *name);
/* The directory actually opened (DIR, or DIR.new / DIR.old after a kill). */
const char *rt_ckpt_dir(const RtCkpt *ck);
/* Full path of file `name` (for readers such as rt_st_open). */
int rt_ckpt_path(const RtCkpt *ck, const char *name, char *buf, size_t cap);
/* Reads file `name` into a malloc'd buffer of *len bytes. */
int rt_ckpt_read(const RtCkpt *ck, const char *name, void **data, size_t *len);
/* Reads file `name` into dst, which must be exactly its size. */
int rt_ckpt_read_into(const RtCkpt *ck, const char *name, void *dst, size_t len);

/* Test hook: called at each crash point of a write ("file" after file i is staged,
 * "manifest", "staged", "old-moved", "new-moved", "done"); NULL turns it off. */
void rt_ckpt_set_crash_hook(void (*hook)(const char *point, int index));

#endif
