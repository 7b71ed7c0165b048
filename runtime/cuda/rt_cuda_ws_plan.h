/* runtime/cuda/rt_cuda_ws_plan.h -- what the GPU trainer's GEMMs take in
 * workspace, known before launch.  Plain C (rt_cuda_ws_plan.c), no CUDA: the
 * runtime (rt_cuda_gemm.cu decides with it, rt_cuda_open plans and allocates
 * with it) and parc's report use the same arithmetic.
 *
 * In GEMM mode bf16 an unbatched GEMM whose k is a multiple of 8 and n of 4
 * (PARC_CUDA_GEMM_OPERANDS: "bf16" every GEMM, "fp32" none) reads bf16 copies
 * of its operands, made in two workspace slots (a, b) with rows padded to 8
 * elements, and, where n % 4 (fp32 rows not 16-byte aligned), writes a result
 * with padded rows to a third.  A trainer's slots are the largest of its
 * GEMMs' needs; rt_cuda_open allocates them with the arena and counts them in
 * the start-up memory check, and a slot may not grow past its plan. */
#ifndef PARC_RT_CUDA_WS_PLAN_H
#define PARC_RT_CUDA_WS_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { RT_CUDA_GEMM_FP32 = 0, RT_CUDA_GEMM_BF16 = 1, RT_CUDA_GEMM_TF32 = 2 };
/* PARC_CUDA_GEMM_OPERANDS: fp32 never, where aligned (the default), bf16 always */
enum { RT_CUDA_OPERANDS_FP32 = 0, RT_CUDA_OPERANDS_ALIGNED = 1, RT_CUDA_OPERANDS_BF16 = 2 };

/* Flags beside rt_gemm.h's RT_MM_*: operand a (b) is stored as bf16 already,
 * rows of its own width (a multiple of 8), by the kernel that computed it
 * (codegen/cuda_store.h); the GEMM reads it as it is, makes no copy of it,
 * and converts the other operand as it would.  Only in GEMM mode bf16.  With
 * _WIDE too, its rows are twice as long (2 cols bf16: each in the first half
 * of the bytes of its fp32 row; rt_cuda_cross_entropy_grad_bf16's dlogits). */
enum {
  RT_CUDA_MM_A_BF16 = 0x100, RT_CUDA_MM_B_BF16 = 0x200,
  RT_CUDA_MM_A_WIDE = 0x400, RT_CUDA_MM_B_WIDE = 0x800
};
/* The result, likewise (rt_cuda_gemm_out_stored_ok): RT_CUDA_MM_C_BF16 writes
 * it as bf16, rows of n (a multiple of 8), rounded to nearest even from the
 * fp32 accumulators; RT_CUDA_MM_C_ROUND, its reference (--bf16-store round),
 * writes it fp32 and rounds it in place to bf16 values.  Either makes the GEMM
 * a bf16-operand one (as a stored operand does), neither accumulates. */
enum { RT_CUDA_MM_C_BF16 = 0x1000, RT_CUDA_MM_C_ROUND = 0x2000 };

/* One GEMM call of a trainer: rt_cuda_matmul (ta 0) or rt_cuda_matmul_ta (ta
 * 1) with these arguments (RT_MM_* and RT_CUDA_MM_* flags). */
typedef struct {
  int ta, flags;
  int64_t batch, m, k, n;
} RtCudaGemm;

/* 1 if such a GEMM (batch folded into m already) reads bf16 operand copies. */
int rt_cuda_gemm_bf16ops(int mode, int operands, int64_t batch, int64_t k, int64_t n);

/* 1 if operand `which` (0: a, 1: b) of GEMM g may be stored as bf16
 * (RT_CUDA_MM_A_BF16 / _B_BF16): in GEMM mode bf16 with the default operand
 * rule the GEMM converts it, and its rows, as the GEMM reads them, are a
 * multiple of 8 elements (the copy's padded rows are then its own). */
int rt_cuda_gemm_stored_ok(const RtCudaGemm *g, int which);

/* 1 if GEMM g's result may be stored as bf16 (RT_CUDA_MM_C_BF16) or rounded
 * so (_C_ROUND): in GEMM mode bf16 with the default operand rule it reads
 * bf16 operands, no batch remains once folded, n is a multiple of 8 (16-byte
 * bf16 rows) and it does not accumulate. */
int rt_cuda_gemm_out_stored_ok(const RtCudaGemm *g);

/* Attention's tensors stored as bf16 (codegen/cuda_store.h), flags of
 * rt_cuda_sdpa_io and rt_cuda_sdpa_grad_stats_io: q, k, v (dy: the
 * backward's) are read as bf16; the result (out, or dqkv) is written as bf16
 * (_O_BF16) or fp32 rounded to bf16 values (_O_ROUND, the reference).  The
 * tensor-core kernels round q, k, v, dy to bf16 as they load them, so a bf16
 * input changes no bit of the results; only the flagged results do. */
enum {
  RT_CUDA_ATTN_Q_BF16 = 1, RT_CUDA_ATTN_K_BF16 = 2, RT_CUDA_ATTN_V_BF16 = 4,
  RT_CUDA_ATTN_DY_BF16 = 8, RT_CUDA_ATTN_O_BF16 = 16, RT_CUDA_ATTN_O_ROUND = 32
};
/* rt_cuda_sdpa_delta_io's: the merged out m, its gradient dm read as bf16
 * (widened exactly; any GEMM mode, any GPU) */
enum { RT_CUDA_ATTN_M_BF16 = 64, RT_CUDA_ATTN_DM_BF16 = 128 };
/* Layout flags of rt_cuda_sdpa_io and rt_cuda_sdpa_grad_stats_io
 * (rt_attention.h's RT_SDPA_*, ir/ir.h's IR_SDPA_*): the result token-major
 * (out [B, T, H hd], dqkv [B, T, (H + 2 KV) hd]), dy token-major [B, T, H hd],
 * q, k, v one packed token-major [B, T, H + 2 KV, hd] (QKV: row b, t holds
 * q's H heads, k's KV, v's KV; q, k and v each point at its start).  Every
 * kernel family takes them, in any GEMM mode, with or without the bf16
 * flags: they move elements, not values. */
enum {
  RT_CUDA_ATTN_O_TOKENS = 256, RT_CUDA_ATTN_DY_TOKENS = 512, RT_CUDA_ATTN_QKV_TOKENS = 1024,
  RT_CUDA_ATTN_LAYOUT = RT_CUDA_ATTN_O_TOKENS | RT_CUDA_ATTN_DY_TOKENS |
                        RT_CUDA_ATTN_QKV_TOKENS /* any */
};

/* 1 if attention of head dimension hd over T positions may take those flags:
 * the shapes of the tensor-core kernels (rt_cuda_attn_mma.cu), which alone
 * read them (they also need GEMM mode bf16 and compute capability 8.0, which
 * the runtime checks per call). */
int rt_cuda_attn_stored_ok(int64_t hd, int64_t T);

/* The fused attention backward's dq partial sums (rt_cuda_attn_mma.cu): the
 * block of key tile j (keys [keys j, keys (j + 1)), keys = 16 x its warps)
 * writes, for each query row i it sees, its keys' share of dq[i] as hd fp32
 * -- causal: rows [keys j, T), else [0, T) -- and a second kernel sums the
 * shares of a row in the order of j.  Rows of one query head, every key tile:
 * the sum over j of T - begin(j), begin(j) = keys j (causal) or 0.  Invariant:
 * the kernels index the scratch with the same arithmetic (mma_dq_off). */
int64_t rt_cuda_attn_dq_rows(int64_t T, int64_t keys, int causal);
/* A kv group's rows are those of its H / KV query heads; the scratch holds
 * whole groups, as many as the backward takes at once.  One group's bytes: */
int64_t rt_cuda_attn_dq_group(int64_t H, int64_t KV, int64_t T, int64_t hd, int causal,
                              int64_t keys);
#define RT_CUDA_ATTN_DQ_MAX ((int64_t)512 << 20) /* bytes a launch's groups aim under */
/* The scratch bytes of one backward of this shape as the 8-warp kernels
 * (128 keys a block) run it: all B KV groups at once, or where they take more
 * than RT_CUDA_ATTN_DQ_MAX, the fewest equal launches of groups under it (one
 * group at least); 0 where the tensor-core kernels do not run the shape
 * (rt_cuda_attn_stored_ok).  A trainer's scratch is the largest over its
 * backward calls (RtCudaSetup.attn_dq_bytes). */
int64_t rt_cuda_attn_dq_ws(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd, int causal);
/* The groups a launch of blocks of `keys` keys takes in `avail` bytes of
 * scratch (0: none fits; the backward then runs the split kernels), balanced
 * over the fewest launches. */
int64_t rt_cuda_attn_dq_groups(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t hd,
                               int causal, int64_t keys, int64_t avail);

/* Bytes GEMM g takes in the workspace slots: need[0] its a, need[1] its b as
 * bf16, need[2] its padded result (0 where it takes none). */
void rt_cuda_gemm_ws(const RtCudaGemm *g, int mode, int operands, int64_t need[3]);

/* The largest need of each slot over n GEMMs; returns their sum. */
int64_t rt_cuda_gemms_ws(const RtCudaGemm *g, int n, int mode, int operands, int64_t need[3]);

#define RT_CUDA_GEMM_WORKSPACE (32 << 20) /* cuBLASLt's workspace, bytes */

/* The device bytes rt_cuda_open plans for a rank, and checks against the
 * GPU's free memory before it allocates: the parameters and the optimizer
 * state (f32: params_numel, state_numel), the arena, the batch's tokens and
 * targets (ntok i32 each) and 16 f32 scalars, cuBLASLt's workspace, and ws
 * (the GEMM operand workspaces with the params' bf16 copy, as parc's report
 * counts them: codegen/arena_plan.h; and rt_cuda_all_reduce_bf16's scratch,
 * 4 bytes a float of RtCudaSetup.reduce_piece).  What CUDA, cuBLASLt and NCCL take
 * for themselves is not in it. */
int64_t rt_cuda_planned_bytes(int64_t params_numel, int64_t state_numel, int64_t arena_bytes,
                              int64_t ntok, int64_t ws);

#ifdef __cplusplus
}
#endif

#endif
