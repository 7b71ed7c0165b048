/* runtime/rt_shard.h -- one rank's shard of a tensor-parallel parameter.
 *
 * Layout (the partitioner's, passes/shard.c and ir/ir.h shard_dim / shard_degree /
 * shard_blocks): dimension `dim` of global size G is cut into `blocks` equal blocks
 * of width B = G / blocks, and each block into `degree` equal pieces of width
 * b = B / degree. The rank at coordinate `coord` holds its piece of every block, in
 * block order, so the local size along `dim` is blocks * b = G / degree and
 *
 *     local index j along dim  <->  global index (j / b) * B + coord * b + j % b.
 *
 * blocks = 1 is the contiguous slice [coord * G / degree, (coord + 1) * G / degree).
 * GPT-2's fused q|k|v weight [d, 3d] uses dim 1, blocks 3: each rank gets its own
 * heads' q, k and v columns. All other dimensions are whole.
 *
 * Padding (a vocabulary table padded to a multiple of degree, or of pad * degree for
 * parc's --pad-vocab pad, degree 1 included): padded = Gp > G, a multiple of degree
 * below G + RT_SHARD_PAD_MAX * degree, blocks 1. The dimension is cut as if it had
 * Gp entries: b = Gp / degree, local index j <-> global index coord * b + j, and the
 * local entries whose global index would be >= G are padding: not part of the global
 * tensor, zero after init, extract and reads, skipped by insert.
 *
 * Experts (edegree > 1, with dim >= 1, no padding): dimension 0 of global size E is
 * also cut, contiguously, into edegree pieces, and the shard is piece ecoord of it
 * (entries [ecoord E / edegree, (ecoord + 1) E / edegree)) cut along dim as above:
 * each expert of the rank's split over tp. Local dimension 0 is E / edegree.
 *
 * Invariants:
 *  - Tensors are row-major, local ones over the local shape (the global shape with
 *    dimension dim replaced by G / degree, or Gp / degree when padded).
 *  - dim = -1 (or a NULL descriptor) means not sharded: the local tensor is the
 *    global one and degree, blocks and coord are ignored. For dim >= 0 the
 *    descriptor must be valid: 0 <= dim < rank, degree >= 1, blocks >= 1,
 *    0 <= coord < degree, blocks divides G and degree divides G / blocks (or, padded,
 *    blocks 1, degree divides padded, G < padded < G + RT_SHARD_PAD_MAX * degree);
 *    otherwise every function fails (RT_ERR or -1) with a one-line message
 *    naming the descriptor and shape, and writes nothing.
 *  - The shards of coordinates 0..degree-1 partition the global tensor: every
 *    global element is in exactly one of them (padding elements in none).
 *  - rt_shard_init_normal gives each element std * rt_rng_normal(seed, stream,
 *    GLOBAL linear index), so the shards of all coordinates together are bit for
 *    bit the unsharded init (rt_init_normal_slice with dim -1), whatever the mesh.
 *  - Copies move contiguous runs with memcpy: each shard is outer * blocks runs of
 *    b * inner floats (outer = product of the dims before dim, inner = after). */
#ifndef PARC_RT_SHARD_H
#define PARC_RT_SHARD_H

#include <stdint.h>

#include "runtime/rt_safetensors.h"

#define RT_SHARD_MAXRANK 16
#define RT_SHARD_PAD_MAX 4096 /* parc's largest --pad-vocab (IR_PAD_VOCAB_MAX) */

typedef struct {
  int dim;      /* dimension split; -1: not sharded */
  int degree;   /* ranks the dimension is split over */
  int blocks;   /* equal blocks of the dimension, each split over the ranks */
  int coord;    /* this rank's coordinate, 0..degree-1 */
  int64_t padded; /* 0: none; else the padded size of dim (see Padding above) */
  int edegree;  /* > 1: dimension 0 too is split, contiguously, over edegree ranks
                   (the experts over the ep group; see Experts above); 0 or 1: not */
  int ecoord;   /* this rank's coordinate on dimension 0's split, 0..edegree-1 */
} RtShard;

/* Checks the descriptor against the global shape (rank dims). RT_OK or RT_ERR. */
int rt_shard_check(int rank, const int64_t *global_shape, const RtShard *sh);

/* Writes the local shape (rank entries) to local_shape. RT_OK or RT_ERR. */
int rt_shard_local_shape(int rank, const int64_t *global_shape, const RtShard *sh,
                         int64_t *local_shape);

/* Number of local elements, or -1 on an invalid descriptor or shape. */
int64_t rt_shard_numel(int rank, const int64_t *global_shape, const RtShard *sh);

/* The global row-major linear index of the local element whose row-major linear
 * index over the local shape is local_index: with outer / inner the products of
 * the dims before / after dim and L = blocks * b the local size of dim,
 *   o = local_index / (L * inner), j = local_index / inner % L, i = local_index % inner,
 *   global = (o * G + (j / b) * B + coord * b + j % b) * inner + i.
 * Returns -1 (with a message) on an invalid descriptor or local_index outside
 * [0, rt_shard_numel), and -2 (no message) for an element of padding. O(rank); for
 * whole tensors use the functions below. */
int64_t rt_shard_global_index(int rank, const int64_t *global_shape, const RtShard *sh,
                              int64_t local_index);

/* Fills dst (rt_shard_numel floats, local row-major order) with
 * std * rt_rng_normal(seed, stream, global linear index) for each element; padding 0. */
int rt_shard_init_normal(float *dst, uint64_t seed, uint64_t stream, float std, int rank,
                         const int64_t *global_shape, const RtShard *sh);

/* Gathers this shard's elements of the full tensor `global` into `local` (padding 0). */
int rt_shard_extract(const float *global, float *local, int rank,
                     const int64_t *global_shape, const RtShard *sh);

/* Scatters `local` into this shard's elements of the full tensor `global`; the
 * other elements of `global` are left as they are. */
int rt_shard_insert(float *global, const float *local, int rank,
                    const int64_t *global_shape, const RtShard *sh);

/* Reads exactly this shard's elements of tensor `name`, which the file holds whole
 * with shape global_shape (a mismatch fails naming file, tensor and both shapes),
 * into dst in local order (padding 0). Strided reads out of the mapped file, no full-tensor
 * buffer: when the shard is one contiguous slice per outer index (blocks == 1,
 * degree == 1, or dim with no dims before it) it is read straight into dst;
 * otherwise block by block through a scratch buffer of rt_shard_numel / blocks
 * floats (malloc'd and freed in the call). */
int rt_st_read_shard(const RtSt *st, const char *name, float *dst, int rank,
                     const int64_t *global_shape, const RtShard *sh);

#endif
