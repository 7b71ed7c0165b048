/* tests/cuda/emu/kcu_emu_api.h -- what the emulated CUDA runtime
 * (cuda_runtime.h, emu_runtime.cpp) offers the emulated libraries built on it
 * (cublasLt.h, emu_cublaslt.cpp).  Not a CUDA header: nothing in runtime/cuda
 * includes it directly.
 *
 * The emulation runs everything on the host: device memory is host memory, a
 * stream runs each operation when it is enqueued (stream order is program
 * order), and a stream being captured records the operation into the capture's
 * graph instead, to run at each cudaGraphLaunch.  A library call that works on
 * a stream therefore hands its work over as a closure that owns copies of what
 * it needs (the caller's descriptors may be gone by the time a graph replays). */
#ifndef KCU_EMU_API_H
#define KCU_EMU_API_H

typedef struct CUstream_st *cudaStream_t;

#ifdef __cplusplus
#include <functional>

/* Runs op in stream order on s (0: the legacy default stream): now, or, while
 * s is being captured, at each launch of the captured graph.  Returns 0, or -1
 * when s is invalid (the error is then also cudaGetLastError's). */
int kcu_emu_enqueue(cudaStream_t s, std::function<void()> op);
#endif

#endif
