/* tests/cuda/emu/cuda_runtime.h -- the CUDA runtime API on the host, for
 * running libparcrt_cuda (runtime/cuda) and its checks (tests/gpu) on a CPU.
 * Usable from C11 (the checks include it as C) and from C++17 (the .cu files,
 * rewritten by tests/cuda/emu_rewrite.py and compiled by g++ with this
 * directory first on the include path).  Implemented by emu_runtime.cpp; the
 * kernel side (launches, threads, barriers, shuffles) is kcu_emu_kernel.h.
 *
 * What is emulated, and its limits:
 *   - device memory is host memory (cudaMalloc'd bytes start as 0xff: reads of
 *     unwritten floats show as NaN); totalGlobalMem is KCU_EMU_MEM_MIB MiB
 *     or else KCU_EMU_MEM_GIB GiB (default 16 GiB) and cudaMemGetInfo's free
 *     is that less what is allocated;
 *     an allocation past it fails with cudaErrorMemoryAllocation, and so does
 *     the process's Nth cudaMalloc (from 1) with KCU_EMU_MALLOC_FAIL=N, whatever
 *     is free (memory taken by another process after a cudaMemGetInfo check);
 *   - KCU_EMU_GPUS devices (default 1), all the same "Emulated H200" (sm_90,
 *     132 SMs, 227 KiB of shared memory a block with the opt-in);
 *   - a stream runs each operation when it is enqueued, in the calling thread:
 *     stream order is program order, every operation is complete when its
 *     call returns, streams never overlap, so a missing cudaStreamWaitEvent
 *     or synchronisation is invisible here (the GPU still needs it);
 *   - events complete when recorded; elapsed times are the host clock's
 *     (CLOCK_MONOTONIC) between the two records: host timings;
 *   - stream capture records the operations of the capturing stream (and of
 *     streams that join it by waiting on an event recorded in it) into the
 *     graph instead of running them; cudaGraphLaunch replays them in order.
 *     Calls CUDA forbids during a capture (synchronous copies and memsets,
 *     synchronising or querying a captured stream or event, cudaMalloc in
 *     global or thread-local mode, legacy-stream work in global mode)
 *     fail with cudaErrorStreamCaptureUnsupported and invalidate the capture
 *     (cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated);
 *     a fork not joined back into the origin stream fails the end with
 *     cudaErrorStreamCaptureUnjoined.  cudaMallocAsync under capture allocates
 *     once, at capture time (every replay uses that memory), and a captured
 *     cudaFreeAsync frees it when the graph and its instances are destroyed;
 *     event records inside a capture are dependencies only (not replayed);
 *   - a kernel launch checks its shape (block <= 1024 threads, x, y <= 1024,
 *     z <= 64, grid y, z <= 65535, dynamic shared memory <= 48 KiB unless
 *     cudaFuncSetAttribute raised the kernel's limit, at most 227 KiB); a bad
 *     one is cudaErrorInvalidConfiguration / cudaErrorInvalidValue in
 *     cudaGetLastError, and nothing runs;
 *   - errors are per host thread (cudaGetLastError), as CUDA's are; every call
 *     is thread-safe: the tables (allocations, streams, events, captures) are
 *     under one mutex, while device work runs unlocked in the calling thread,
 *     so ranks as threads run their kernels at the same time, each with its
 *     own kernel state; a kernel reading memory another thread's kernel
 *     writes is a race here as on a GPU without a stream/event dependency;
 *   - an event handle used after cudaEventDestroy is an error
 *     (cudaErrorInvalidResourceHandle), where CUDA's behaviour is undefined. */
#ifndef KCU_EMU_CUDA_RUNTIME_H
#define KCU_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "kcu_emu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaMemPoolAttr {
  cudaMemPoolReuseFollowEventDependencies = 1,
  cudaMemPoolReuseAllowOpportunistic = 2,
  cudaMemPoolReuseAllowInternalDependencies = 3,
  cudaMemPoolAttrReleaseThreshold = 4
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

/* The fields runtime/cuda and the checks read, with H200-like values. */
typedef struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  size_t sharedMemPerMultiprocessor;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  int l2CacheSize;
  int memoryBusWidth;
  int clockRate, memoryClockRate;
} cudaDeviceProp;

/* errors */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

/* devices */
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v);

/* memory */
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
/* rows of `width` bytes, `height` of them, pitches in bytes (>= width) */
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);

/* streams */
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

/* events */
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* graphs */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *x, cudaGraph_t g,
                                          unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x);

/* kernels: the maximum dynamic shared memory of the kernel at address f */
cudaError_t kcu_emu_func_set_attribute(const void *f, enum cudaFuncAttribute a, int v);
/* Not CUDA, for tests: the cudaGraphLaunch calls that succeeded so far (all
 * threads).  With KCU_EMU_STATS=FILE in the environment the final counts are
 * written to FILE at exit as {"graph_launches": N, "kernel_launches": K} (K:
 * the kernel launches made, a graph's replays of them not counted). */
long kcu_emu_graph_launches(void);

#ifdef __cplusplus
} /* extern "C" */

/* C++ overloads of the runtime API (as CUDA's header has them) */
template <class T> inline cudaError_t cudaMalloc(T **p, size_t bytes) {
  return cudaMalloc((void **)p, bytes);
}
template <class T> inline cudaError_t cudaMallocHost(T **p, size_t bytes) {
  return cudaMallocHost((void **)p, bytes);
}
template <class T> inline cudaError_t cudaMallocAsync(T **p, size_t bytes, cudaStream_t s) {
  return cudaMallocAsync((void **)p, bytes, s);
}
template <class T> inline cudaError_t cudaFuncSetAttribute(T *f, cudaFuncAttribute a, int v) {
  return kcu_emu_func_set_attribute((const void *)f, a, v);
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g) {
  return cudaGraphInstantiate(x, g, 0);
}

#include "kcu_emu_kernel.h"
#else
/* C: cudaFuncSetAttribute on a function pointer */
#define cudaFuncSetAttribute(f, a, v) kcu_emu_func_set_attribute((const void *)(f), (a), (v))
#endif

#endif
