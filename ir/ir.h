/* ir/ir.h -- parc's intermediate representation.
 *
 * One node type for the whole graph.  A module owns every node, name and
 * array through one arena, freed all at once by ir_module_free.
 *
 * Invariants (checked by ir_verify):
 *   - nodes[] is in topological order: every input of nodes[i] is some
 *     nodes[j] with j < i, and nodes[i]->id == i;
 *   - every node's shape has 0 <= rank <= IR_MAX_RANK, every dimension >= 1,
 *     and the element count fits in int64;
 *   - shapes and dtypes are those ir_infer gives for the op and its inputs;
 *   - PARAM, INPUT and STATE nodes have unique, non-empty names; STATE
 *     nodes are f32;
 *   - phases (see IrPhase): a forward node reads only forward nodes; a B
 *     node reads only forward and B nodes (so W work can be deferred); no
 *     backward node reads an optimizer node; optimizer nodes read anything;
 *   - grad is NULL except on PARAM nodes, where it is NULL or an f32 node of
 *     this module with the parameter's shape; under ZeRO-1 (mesh_zero > 1)
 *     instead f32[ceil(numel / z)], z = ir_zero_pieces(m, param) when
 *     z > 1: the rank's piece of the flattened, dp-averaged gradient (see
 *     flat_shards);
 *   - a STATE node with flat_shards > 1 has shape [ceil(n / flat_shards)],
 *     n the numel of its parameter (PARAM named by the state's name without
 *     its last ".key"), and flat_shards == ir_zero_pieces(m, state);
 *   - updates: each leaf is a PARAM or STATE node of this module, updated at
 *     most once, by a node of this module with the leaf's dtype and shape;
 *   - grad_norm is NULL or a scalar f32 node of this module.
 */
#ifndef PARC_IR_H
#define PARC_IR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ir/arena.h"

#define IR_MAX_RANK 8
#define IR_MAX_DIM  ((int64_t)1 << 40)  /* largest single dimension */

enum {
  IR_F_LEAF = 1,       /* no inputs: a graph value supplied from outside */
  IR_F_DIFF = 2,       /* differentiable with respect to its float inputs */
  IR_F_POINTWISE = 4,  /* elementwise; fusable into one loop nest */
  IR_F_BACKWARD = 8,   /* a backward primitive pass_autodiff emits; it has no
                          VJP rule, so autodiff refuses a loss that depends
                          on one through a parameter */
  IR_F_INTERNAL = 16,  /* made by passes only: not a DSL primitive */
  IR_F_INPLACE0 = 32,  /* the result may be written over input 0 (same
                          element count and dtype): every backend's kernel
                          reads each element of input 0 before it writes the
                          result's element at the same offset, and writes no
                          element of input 0 it has yet to read.  The buffer
                          plan uses it (passes/bufplan.c, In place); each
                          kernel states why it holds where it is written. */
};

typedef enum {
#define X(e, name, arity, flags, ia0, ia1, ia2, fa0) IR_OP_##e,
#include "ir/ops.def"
#undef X
  IR_OP_COUNT
} IrOp;

typedef struct {
  const char *name;
  int arity;           /* -1: variadic, at least one */
  int flags;
  const char *iattr[3];
  const char *fattr;
} IrOpInfo;

extern const IrOpInfo ir_op_info[IR_OP_COUNT];

typedef enum { IR_F32, IR_I32, IR_DTYPE_COUNT } IrDType;
extern const char *const ir_dtype_name[IR_DTYPE_COUNT];

/* Sharding intent a parameter declares; the partitioner reads it. */
typedef enum {
  IR_SHARD_REPLICATED,
  IR_SHARD_COLUMN,   /* last dim split over tp */
  IR_SHARD_ROW,      /* first (input) dim split over tp */
  IR_SHARD_VOCAB,    /* dim 0 (vocabulary) split over tp, padded */
  IR_SHARD_EXPERT,   /* dim 0 (experts) split over ep; `expert(d)`: and
                        dimension d of each expert over tp (shard_dim) */
  IR_SHARD_COUNT
} IrShard;
extern const char *const ir_shard_name[IR_SHARD_COUNT];

typedef enum { IR_INIT_NORMAL, IR_INIT_ZEROS, IR_INIT_ONES, IR_INIT_COUNT } IrInit;
extern const char *const ir_init_name[IR_INIT_COUNT];

typedef struct {
  const char *file;  /* arena- or static-owned */
  int line, col;     /* 1-based; line 0 means unknown */
} IrLoc;

/* Which part of a training step a node belongs to.  pass_autodiff tags the
 * nodes it appends; everything the frontend makes is IR_PHASE_FWD.
 *   B: on the path to an activation gradient (d loss / d of a value that
 *      depends on an INPUT): what a pipeline stage must compute before it
 *      can send gradients upstream;
 *   W: everything else in the backward pass, i.e. nodes that only feed
 *      parameter gradients; zero-bubble schedules may defer them.
 * B is closed under inputs: no B node reads a W node.
 *   OPT: the optimizer step pass_optimizer appends after the backward pass
 *      (its leaves too: state, lr, step); it may read anything, and nothing
 *      but the optimizer reads it.
 * Order matters: ir_phase_name follows it. */
typedef enum { IR_PHASE_FWD, IR_PHASE_B, IR_PHASE_W, IR_PHASE_OPT, IR_PHASE_COUNT } IrPhase;
extern const char *const ir_phase_name[IR_PHASE_COUNT];

typedef struct IrNode IrNode;
struct IrNode {
  int id;                  /* index in module->nodes */
  IrOp op;
  IrDType dtype;
  int rank;
  int64_t shape[IR_MAX_RANK];
  int ninputs;
  IrNode **inputs;
  int64_t ia[3];           /* integer attributes, named by ir_op_info */
  double fa;               /* float attribute, named by ir_op_info */
  const char *name;        /* PARAM/INPUT/STATE: full dotted name; else NULL */
  IrInit init;             /* PARAM; STATE: always IR_INIT_ZEROS */
  double init_std;         /* PARAM with IR_INIT_NORMAL */
  IrShard shard;           /* PARAM, and STATE (its parameter's) */
  int shard_dim;           /* PARAM: dimension split, -1 if none (pass_intent);
                              STATE: its parameter's; INPUT: 0 once
                              pass_shard splits its batch over dp */
  int shard_degree;        /* after pass_shard: tp ranks shard_dim is split over
                              (0 or 1: whole on every rank, padded rows
                              included for a padded PARAM at tp 1,
                              ir_param_padded); PARAM: over tp;
                              INPUT: over dp, shard_dim 0 (the batch) */
  int shard_blocks;        /* PARAM after pass_shard with shard_degree > 1:
                              shard_dim is `blocks` equal blocks, each split
                              over the ranks; the local tensor is the
                              rank's piece of every block, in block order
                              (GPT-2's fused q|k|v: 3).  Rank c's local
                              index j along shard_dim is global index
                              (j / b) * B + c * b + j % b with B the global
                              block and b = B / shard_degree */
  int64_t global_shape[IR_MAX_RANK]; /* PARAM or INPUT after pass_shard with
                              shard_degree > 1, or a padded PARAM
                              (ir_param_padded, shard_degree 1 at tp 1):
                              the unsharded shape (shape is the local one).
                              Vocabulary padding: a PARAM with shard_blocks
                              1 may have shape[d] * shard_degree (the padded
                              size, d = shard_dim) above global_shape[d]
                              (the true one) by less than
                              IR_PAD_VOCAB_MAX * shard_degree; the rows at
                              padded indices >= global_shape[d] are padding,
                              exactly 0, never in files */
  int ep_degree;           /* PARAM (and its STATE) with shard IR_SHARD_EXPERT
                              after pass_shard under ep > 1: dimension 0 (the
                              experts) split contiguously over ep_degree ranks
                              of the ep group, on top of the tp split above
                              (shard_dim >= 1 or none); global_shape is then
                              the unsharded shape of both.  0 or 1: none */
  int flat_shards;         /* STATE (and PARAM gradients) under ZeRO-1: the
                              (tp-local) tensor, flattened and padded with
                              zeros to flat_shards * s elements, is cut into
                              flat_shards pieces of s; the node is the piece
                              of the rank's dp coordinate d: elements
                              [d s, (d + 1) s) of the flattened tensor.
                              An expert-parallel tensor's (shard EXPERT,
                              ep_degree ep > 1) is cut over its ep_dp
                              group instead (dp / ep pieces, coordinate
                              d / ep; see ir_zero_pieces).  0 or 1: whole */
  int layer;               /* index of the repeat iteration, -1 outside;
                              backward nodes take the layer of the forward
                              node whose rule made them */
  IrLoc loc;
  IrPhase phase;           /* IR_PHASE_FWD unless made by autodiff */
  IrNode *grad;            /* PARAM after pass_autodiff: the node holding
                              d(loss)/d(this), same shape; NULL when the
                              loss does not depend on the parameter (its
                              gradient is zero) or before autodiff */
};

/* The end of a training step: leaf takes the value of node value.  Ops are
 * pure; this list is the only place where a step's results replace graph
 * values (parameters and optimizer state) for the next step. */
typedef struct {
  IrNode *leaf;            /* a PARAM or STATE node */
  IrNode *value;           /* its value for the next step: same dtype and shape */
} IrUpdate;

/* A named scalar setting (config or train), kept for reports and codegen. */
typedef struct {
  const char *name;
  int is_float;
  int64_t i;
  double f;
  const char *sym;         /* non-NULL for symbolic values (e.g. bf16) */
} IrSetting;

typedef struct {
  Arena arena;
  const char *name;
  IrNode *ce_loss;         /* the loss as the model wrote it, before aux terms */
  IrNode **nodes;
  int nnodes, capnodes;
  IrNode *loss;            /* scalar objective; NULL until set */
  IrNode *seed;            /* after pass_autodiff: the loss's own gradient, a scalar
                              fill of 1 (1/dp once pass_dp_grads has the dp sum
                              be the mean: passes/dp_grads.c); NULL before */
  int nlayers;             /* iterations of the model's repeat (0 if none) */
  IrSetting *config;  int nconfig;
  IrSetting *train;   int ntrain;
  const char *optimizer;   /* "adamw" or "sgd" */
  IrSetting *optim;   int noptim;   /* optimizer arguments */
  const char *schedule;    /* "constant", "warmup", "cosine" */
  IrSetting *sched;   int nsched;
  IrUpdate *updates;  int nupdates, capupdates;  /* after pass_optimizer, in order */
  int mesh_tp, mesh_dp;    /* after pass_shard: the tp x dp mesh this module is
                              the rank-local program of (shapes are local);
                              0 before */
  int pad_vocab;           /* vocabulary padding quantum, set before pass_shard
                              (parc --pad-vocab, the train setting pad_vocab):
                              a vocab table of V rows gets ir_padded_vocab(V,
                              tp, pad_vocab) rows, so that each tp rank's rows
                              are a multiple of pad_vocab; 0 or 1: only what
                              tp needs */
  int pad_refused;         /* set by pass_shard when it fails because a padded
                              vocabulary dimension reaches an op that needs it
                              whole or cuts it (a gather, slice, reduction) */
  const char *pad_dropped; /* the driver dropped a defaulted padding the model
                              refused: why (pass_shard's message; the report
                              says so), else NULL */
  int mesh_ep;             /* expert parallelism: set before pass_shard (0 or
                              1: none); ep divides dp, and PARAMs with shard
                              IR_SHARD_EXPERT and ep_degree > 1 hold
                              experts / ep experts (dimension 0), split over
                              the ep group (and over tp, when shard_dim says) */
  int mesh_zero;           /* ZeRO-1: the dp degree the optimizer state (and
                              each rank's update) is sharded over, as
                              flat_shards; 0 (or 1): not sharded.  Set right
                              before pass_dp_grads (pass_run_all does, from
                              PassOptions.zero), which makes the pieces */
  int64_t dp_bucket_bytes; /* pass_dp_grads: gradient bytes per bucket of the
                              dp reduction; 0: DP_BUCKET_BYTES_DEFAULT */
  int dp_blocking;         /* parc --no-overlap: codegen emits the dp bucket
                              collectives as blocking calls; 0: started where
                              they stand and waited for where their result is
                              first read (codegen/host.h cg_async_waits) */
  int grads_whole;         /* a pipelined trainer's module (passes/pp_split.c):
                              p->grad stays the whole gradient, which the
                              trainer accumulates over the microbatches and
                              reduces over dp itself (runtime/rt_pipe.h); under
                              ZeRO-1 the optimizer takes the rank's piece of it
                              (flat_shard) instead of reading a piece */
  const uint64_t *opt_stages; /* a pipelined trainer's module, before the
                              optimizer: per node id, a PARAM's pipeline stages
                              (pp_param_stages), else NULL.  ZeRO-1's gather
                              buckets hold parameters of one set of stages */
  int remat_act;           /* pass_remat_act (--recompute pointwise): the
                              forward pointwise values it gave the backward a
                              copy of (0: none, or the pass did not run) */
  int remat_layers;        /* pass_remat_layer (--recompute layers): the layers
                              whose forward the backward runs again, and */
  int remat_layer_nodes;   /* the copies it made of their nodes (0: none) */
  IrNode *grad_norm;       /* after pass_optimizer: the global gradient norm
                              before clipping (logged); NULL before, or when
                              no parameter has a gradient */
} IrModule;

IrModule *ir_module_new(const char *name);
void ir_module_free(IrModule *m);

/* Appends a node; inputs are copied.  Shape and dtype must already be set
 * (see ir_infer).  Never fails: allocation failure aborts. */
IrNode *ir_add(IrModule *m, IrOp op, IrNode **inputs, int ninputs);

/* Records that leaf takes value at the end of the step (see IrUpdate);
 * ir_verify checks the list. */
void ir_add_update(IrModule *m, IrNode *leaf, IrNode *value);

/* Appends a copy of proto: its op, inputs, type and attributes.  proto's
 * type must already be inferred (ir_infer); layer, location and phase are
 * the caller's to set. */
IrNode *ir_add_like(IrModule *m, const IrNode *proto);
/* A pass's new node: proto's type inferred (ir_infer), then appended as
 * ir_add_like, placed like `at` (its layer and source location), in phase,
 * not sharded (shard_dim -1).  NULL after printing "parc: internal error:
 * WHAT: why" when its type does not check. */
IrNode *ir_add_inferred(IrModule *m, IrNode *proto, const IrNode *at, IrPhase phase,
                        const char *what);

/* For passes that insert nodes: order[0..n) (every node of m once, inputs
 * before their readers) becomes m's node list, ids renumbered to match. */
void ir_set_order(IrModule *m, IrNode *const *order, int n);

/* For passes that only add nodes: m's first nold nodes are its old ones, in
 * order, and the pass appended made[0..nmade) after them (m->nnodes == nold +
 * nmade).  Each made[c] moves to right before old node at[c] (0 <= at[c] <=
 * nold; nold: at the end); new nodes sharing a place keep the order of made,
 * so a new node must come after any new node it reads in made, or take a
 * later place.  Ids renumbered; O(nodes). */
void ir_insert_before(IrModule *m, int nold, IrNode *const *made, const int *at, int nmade);

/* 1 if m refers to n other than as an input: its loss (or ce_loss), the
 * gradient norm, an update's value, a parameter's gradient.  A pass may not
 * remove or replace such a node. */
int ir_node_held(const IrModule *m, const IrNode *n);

/* calloc of n (at least one) elements for a pass's scratch; out of memory
 * prints "parc: out of memory" and exits 3 (an internal error). */
void *ir_xcalloc(size_t n, size_t size);

/* Shape inference.  Fills n->dtype, n->rank and n->shape from the op, its
 * inputs and its attributes.  On failure returns 0 and writes a one-line
 * reason (naming the op and the shapes) into why. */
int ir_infer(IrNode *n, char *why, size_t whylen);

int64_t ir_numel(const IrNode *n);
/* The product of n's dims [from, to), 1 for an empty range: the rows before
 * an axis (0, axis), a row's elements after it (axis + 1, rank). */
static inline int64_t ir_dims_product(const IrNode *n, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= n->shape[d];
  return p;
}
/* 1 if a and b have the same rank and dimensions. */
static inline int ir_same_shape(const IrNode *a, const IrNode *b) {
  if (a->rank != b->rank) return 0;
  for (int d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}
/* Extra f32 values a node's buffer holds right after its own ir_numel(n):
 * sdpa keeps the row statistics its backward reads, lse [B, H, T]
 * (logsumexp over the keys of the scaled scores, natural log) at
 * buffer + ir_numel(n); 0 for every other op.  sdpa_grad reads them there
 * (with out) when its fifth operand is the sdpa; passes/attn_delta.c gives
 * it a copy of its own instead (sdpa_lse), so the sdpa's buffer can die in
 * the forward.  Everything that sizes,
 * allocates, sends or copies a node's buffer uses ir_buf_numel. */
int64_t ir_aux_numel(const IrNode *n);

static inline int64_t ir_buf_numel(const IrNode *n) { return ir_numel(n) + ir_aux_numel(n); }

/* A normalisation over the last dimension (layer_norm, rms_norm). */
static inline int ir_op_is_norm(IrOp op) { return op == IR_OP_LAYERNORM || op == IR_OP_RMSNORM; }

/* Made by autodiff for the backward pass (phase B or W). */
static inline int ir_backward(const IrNode *n) {
  return n->phase == IR_PHASE_B || n->phase == IR_PHASE_W;
}

/* The layout bits of sdpa and sdpa_grad (their ia[1], unnamed: the DSL never
 * writes it; printed as layout=N when set).  0 is the head-major layout of
 * ir/ops.def.  passes/attn_layout.c sets them, on the module codegen writes:
 *   IR_SDPA_OUT_TOKENS  the result is token-major: sdpa's out [B, T, H hd]
 *                       (merge_heads of the head-major out; lse still follows
 *                       it, [B, H, T]), sdpa_grad's [B, T, (H + 2 KV) hd] (row
 *                       b, t: dq's heads, then dk's, then dv's, hd each)
 *   IR_SDPA_DY_TOKENS   sdpa_grad's dy operand is [B, T, H hd] (the dm that
 *                       split_heads would have cut)
 *   IR_SDPA_QKV_TOKENS  q, k and v are one packed token-major tensor, the same
 *                       node as all three operands: [B, T, H + 2 KV, hd] (row
 *                       b, t: q's H heads, then k's KV, then v's KV, hd
 *                       each: the layout of sdpa_grad's token-major result),
 *                       with KV in ia[2] (0 otherwise)
 * The same values as the runtimes' RT_SDPA_* (runtime/rt_attention.h).
 * ir_sdpa_dims reads B, H, KV, T, hd in either layout. */
enum { IR_SDPA_OUT_TOKENS = 1, IR_SDPA_DY_TOKENS = 2, IR_SDPA_QKV_TOKENS = 4 };

/* An sdpa's or sdpa_grad's sizes from its (type-checked) q and k operands. */
typedef struct {
  int64_t B, H, KV, T, hd;
} IrSdpaDims;
static inline IrSdpaDims ir_sdpa_dims(const IrNode *n) {
  const int64_t *q = n->inputs[0]->shape, *k = n->inputs[1]->shape;
  if (n->ia[1] & IR_SDPA_QKV_TOKENS) /* [B, T, H + 2 KV, hd] */
    return (IrSdpaDims){q[0], q[2] - 2 * n->ia[2], n->ia[2], q[1], q[3]};
  return (IrSdpaDims){q[0], q[1], k[1], q[2], q[3]}; /* [B, H, T, hd], [B, KV, T, hd] */
}

/* ZeRO-1 (m->mesh_zero > 1): the pieces a PARAM's gradient and state (or a
 * STATE, which carries its parameter's sharding) are cut in: mesh_zero (the
 * dp ranks) for a dense tensor; for an expert-parallel one (shard EXPERT,
 * ep_degree ep > 1) the ranks holding the same experts, the ep_dp group
 * of mesh_zero / ep (1 when ep == dp: whole on the rank).  1 without ZeRO. */
static inline int ir_zero_pieces(const IrModule *m, const IrNode *n) {
  if (m->mesh_zero <= 1) return 1;
  if (n->shard == IR_SHARD_EXPERT && n->ep_degree > 1) return m->mesh_zero / n->ep_degree;
  return m->mesh_zero;
}
/* The floats of n's ZeRO-1 piece: ceil(numel / ir_zero_pieces) (the last
 * rank's piece is padded with zeros to that size). */
static inline int64_t ir_zero_piece_numel(const IrModule *m, const IrNode *n) {
  int64_t z = ir_zero_pieces(m, n);
  return (ir_numel(n) + z - 1) / z;
}
/* Vocabulary padding: the largest --pad-vocab, and the padded size of a
 * vocabulary of V rows over tp ranks, the smallest multiple of pad * tp
 * that is >= V (pad < 1 reads as 1), so every rank's rows are a multiple of
 * pad.  Equal to V when nothing is padded. */
#define IR_PAD_VOCAB_MAX 4096
static inline int64_t ir_padded_vocab(int64_t V, int tp, int pad) {
  int64_t q = (int64_t)(pad > 1 ? pad : 1) * (tp > 1 ? tp : 1);
  return (V + q - 1) / q * q;
}
/* 1 if n is a PARAM whose local rows (times its degree) exceed its true
 * global size: a padded vocabulary table (global_shape valid, shard_dim the
 * rows), at any shard_degree >= 1. */
static inline int ir_param_padded(const IrNode *n) {
  int d = n->shard_dim, deg = n->shard_degree > 1 ? n->shard_degree : 1;
  return n->op == IR_OP_PARAM && n->shard_degree >= 1 && d >= 0 && d < n->rank &&
         n->shard_blocks == 1 && n->global_shape[d] > 0 &&
         n->shape[d] * deg > n->global_shape[d];
}
const IrSetting *ir_setting(const IrSetting *s, int n, const char *name);
/* 1 if n is one of the auxiliary loss terms (add_loss, coefficient applied)
 * the objective adds to the cross-entropy: m->loss is the chain
 * add(...add(ce_loss, t0)..., tk), and n is one of its t's. */
int ir_is_aux_term(const IrModule *m, const IrNode *n);

/* "f32[4, 64, 768]" into buf. */
const char *ir_type_str(const IrNode *n, char *buf, size_t len);

/* Stable text form (golden tests compare it). */
void ir_print(FILE *out, const IrModule *m);
/* Graphviz form. */
void ir_print_dot(FILE *out, const IrModule *m);

/* Structural check of every invariant above.  Returns 0 when sound, else
 * writes the first violation into why and returns -1. */
int ir_verify(const IrModule *m, char *why, size_t whylen);

#endif
