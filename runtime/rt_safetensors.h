/* runtime/rt_safetensors.h -- float32 safetensors files in and out.
 *
 * Format: 8-byte little-endian header length H; H bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}   (metadata optional)
 * padded with spaces; then the data section, offsets relative to its start.
 *
 * Invariants:
 *  - rt_st_write is atomic (temporary file in the same directory, fsync, rename,
 *    directory fsync): a reader sees the old file or the complete new one. Tensors
 *    are laid out contiguously in the order given; the header is padded with spaces
 *    to a multiple of 8 so the data section is 8-aligned.
 *  - A handle from rt_st_open has passed every check: header inside the file, JSON
 *    valid and an object, every dtype F32 (others rejected naming tensor and dtype),
 *    shapes non-negative, offsets inside the data section, end - begin == 4 * numel,
 *    tensors non-overlapping and covering the data section with no holes (as the
 *    reference implementation demands), names unique, metadata string -> string.
 *  - Tensor indices follow data order; lookups by name are O(log n).
 *  - Offsets and shapes travel through JSON doubles: exact up to 2^53. */
#ifndef PARC_RT_SAFETENSORS_H
#define PARC_RT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define RT_ST_MAXDIM 8
#define RT_ST_MAX_HEADER (100u << 20)   /* header bytes accepted, as the reference reader */

typedef struct {
  const char *name;
  int rank;
  int64_t shape[RT_ST_MAXDIM];
  const float *data;   /* numel floats, row-major; may be NULL when numel == 0 */
} RtStTensor;

typedef struct {
  const char *key, *value;
} RtStMeta;

/* Writes tensors[0..n) (and metadata, if nmeta > 0) to path atomically. */
int rt_st_write(const char *path, const RtStTensor *tensors, int n, const RtStMeta *meta,
                int nmeta);

typedef struct RtSt RtSt;

int rt_st_open(RtSt **out, const char *path);
void rt_st_close(RtSt *st);

int rt_st_count(const RtSt *st);
const char *rt_st_name(const RtSt *st, int i);
/* Index of the tensor called name, or -1 (with an error message naming the file). */
int rt_st_find(const RtSt *st, const char *name);
/* Rank of tensor i; its dims go to shape (RT_ST_MAXDIM entries). */
int rt_st_shape(const RtSt *st, int i, int64_t *shape);
int64_t rt_st_numel(const RtSt *st, int i);
/* Metadata value for key, or NULL. */
const char *rt_st_meta(const RtSt *st, const char *key);

/* Copies tensor `name` into dst after checking that its shape is exactly
 * (rank, shape); a mismatch names the file, tensor and both shapes. */
int rt_st_read(const RtSt *st, const char *name, float *dst, int rank, const int64_t *shape);
/* As rt_st_read, but copies only the slice where dimension dim is restricted to
 * [start, start+len) (row-major order of the slice): what one shard loads. */
int rt_st_read_slice(const RtSt *st, const char *name, float *dst, int rank,
                     const int64_t *shape, int dim, int64_t start, int64_t len);

#endif
