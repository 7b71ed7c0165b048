/* tests/cuda/emu/emu_runtime.cpp -- the emulated CUDA runtime (cuda_runtime.h,
 * kcu_emu_api.h, kcu_emu_kernel.h): memory, streams, events, graphs, errors,
 * devices, and the kernels' fibers.  The model and its limits are in
 * cuda_runtime.h's head comment.
 *
 * Invariants:
 *   - the tables (allocations, streams, events, captures, kernel attributes)
 *     are read and written under `mu` only; device work (a kernel, a copy)
 *     runs outside it, in the calling host thread, so ranks as threads run
 *     their kernels at once without sharing any kernel state (all of it is
 *     thread_local);
 *   - a stream belongs to at most one capture (Stream::cap); every stream of
 *     a capture has cap set to it until the origin's cudaStreamEndCapture;
 *   - an operation enqueued on a capturing stream is appended to its
 *     capture's ops and not run; the ops run in that order at each
 *     cudaGraphLaunch. */
#include "cuda_runtime.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
/* kcu_emu_swap(save, to): saves the callee-saved registers on this stack and
 * its stack pointer in *save, then resumes the stack `to` (a fiber's start
 * frame, or one saved by an earlier swap). */
extern "C" void kcu_emu_swap(void **save, void *to);
asm(".text\n"
    ".globl kcu_emu_swap\n"
    ".type kcu_emu_swap,@function\n"
    "kcu_emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size kcu_emu_swap, .-kcu_emu_swap\n");
#endif

namespace {

std::recursive_mutex mu;
typedef std::lock_guard<std::recursive_mutex> Lock;

thread_local cudaError_t last_error = cudaSuccess;
thread_local int cur_device = 0;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int env_int(const char *name, int dflt, int lo, int hi) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  int n = atoi(v);
  return n < lo ? lo : n > hi ? hi : n;
}

int device_count() { return env_int("KCU_EMU_GPUS", 1, 1, 64); }
/* KCU_EMU_MEM_MIB (a small device, for tests of the start-up memory check)
 * before KCU_EMU_MEM_GIB */
size_t device_mem() {
  const char *mib = getenv("KCU_EMU_MEM_MIB");
  if (mib && *mib) return (size_t)env_int("KCU_EMU_MEM_MIB", 16384, 1, 1 << 30) << 20;
  return (size_t)env_int("KCU_EMU_MEM_GIB", 16, 1, 1 << 20) << 30;
}

const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024;

/* ---- the tables ---- */

struct GraphBody {
  std::vector<std::function<void()>> ops;
  std::vector<void *> frees; /* cudaFreeAsync'd under capture: freed with the graph */
  ~GraphBody();
};

struct Capture {
  CUstream_st *origin;
  int mode;
  std::thread::id thread;
  bool invalid;
  std::shared_ptr<GraphBody> body;
  std::vector<CUstream_st *> members;
};

} // namespace

struct CUstream_st {
  unsigned flags;
  Capture *cap;
  uint64_t seq;        /* ops enqueued under the current capture */
  uint64_t joined_seq; /* of them, those another member waited for */
};
struct CUevent_st {
  unsigned flags;
  bool recorded;
  double t;
  Capture *cap;        /* recorded in this capture (while it lasts) */
  CUstream_st *src;
  uint64_t seq;
};
struct CUgraph_st {
  std::shared_ptr<GraphBody> body;
};
struct CUgraphExec_st {
  std::shared_ptr<GraphBody> body;
};
struct CUmemPoolHandle_st {
  uint64_t threshold;
};

namespace {

std::map<void *, size_t> device_allocs;
std::set<void *> host_allocs;
size_t allocated;
std::set<CUstream_st *> streams;
std::set<CUevent_st *> events;
std::set<Capture *> captures;
std::set<CUgraph_st *> graphs;
std::set<CUgraphExec_st *> execs;
std::map<const void *, int> max_dyn_smem;
CUmemPoolHandle_st pools[64];
long graph_launches;  /* cudaGraphLaunch calls that succeeded */
long kernel_launches; /* kernel launches enqueued or captured (graph replays not counted) */

void dev_free(void *p);

GraphBody::~GraphBody() {
  for (void *p : frees) dev_free(p);
}

/* A stream handle (0: the legacy default stream) is valid. */
bool valid_stream(cudaStream_t s) { return !s || streams.count(s); }

/* Whether this thread may not make a potentially unsafe call now: a capture
 * in global mode (any thread) or one in thread-local mode begun by this
 * thread.  Those captures are invalidated. */
bool unsafe_now() {
  bool hit = false;
  for (Capture *c : captures) {
    if (c->mode == cudaStreamCaptureModeGlobal ||
        (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == std::this_thread::get_id())) {
      c->invalid = true;
      hit = true;
    }
  }
  return hit;
}

void *dev_alloc(size_t bytes, cudaError_t *e) {
  if (allocated + bytes > device_mem()) {
    *e = cudaErrorMemoryAllocation;
    return NULL;
  }
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) {
    *e = cudaErrorMemoryAllocation;
    return NULL;
  }
  memset(p, 0xff, bytes); /* unwritten floats read as NaN */
  device_allocs[p] = bytes;
  allocated += bytes;
  *e = cudaSuccess;
  return p;
}

void dev_free(void *p) {
  Lock l(mu);
  auto it = device_allocs.find(p);
  if (it == device_allocs.end()) return;
  allocated -= it->second;
  device_allocs.erase(it);
  free(p);
}

/* Runs op in stream order on s, or records it into s's capture. */
cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
  {
    Lock l(mu);
    if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
    if (!s && unsafe_now()) return fail(cudaErrorStreamCaptureImplicit);
    if (s && s->cap) {
      if (s->cap->invalid) return fail(cudaErrorStreamCaptureInvalidated);
      s->cap->body->ops.push_back(std::move(op));
      s->seq++;
      return cudaSuccess;
    }
  }
  op();
  return cudaSuccess;
}

/* ---- fibers: a kernel's threads ---- */


const size_t STACK = 256 * 1024, GUARD = 4096;

struct Fiber {
  int state;
  uint3 tid;   /* its threadIdx */
  char *stack; /* GUARD bytes of PROT_NONE, then STACK */
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t ctx;
#endif
};

/* A host thread's kernel execution.  While a block runs, the fibers of one
 * warp [wbeg, wend) take turns: a fiber that waits switches straight to the
 * next runnable fiber of its warp; the scheduler (main) gets control back only
 * when every fiber of the warp is at a block barrier or done. */
struct Sched {
  std::vector<Fiber> f;
  unsigned n = 0, cur = 0, wbeg = 0, wend = 0;
  bool reversed = false; /* KCU_EMU_ORDER=1: blocks, warps and lanes in reverse */
  unsigned at_warp = 0, at_other = 0; /* of the warp's fibers: stopped at a warp barrier, at
                                         a block barrier or done */
  const std::function<void()> *body = nullptr;
  std::vector<uint64_t> xchg = std::vector<uint64_t>(1024);
  char *smem = nullptr;
  size_t smem_cap = 0;
  uint3 block{0, 0, 0};
#if defined(__x86_64__)
  void *main_sp = nullptr;
#else
  ucontext_t main;
#endif
  ~Sched() {
    for (Fiber &x : f) munmap(x.stack, STACK + GUARD);
    free(smem);
  }
};
/* This thread's scheduler: a plain pointer (read without a TLS wrapper
 * call on the fibers' hot path), made by the thread's first launch and
 * deleted at the thread's exit by its reaper. */
thread_local Sched *tsched;
struct SchedReaper {
  ~SchedReaper() {
    delete tsched;
    tsched = nullptr;
  }
};
thread_local SchedReaper reaper;
Sched &sched_get() {
  if (!tsched) {
    tsched = new Sched;
    (void)&reaper; /* constructs it: its destructor runs at the thread's exit */
  }
  return *tsched;
}

/* KCU_EMU_ORDER=1 runs the blocks of every launch, the warps of a block and
 * the threads of a warp in reverse order (0 or unset: in order).  A kernel
 * whose result depends on that order has a race: a missing __syncthreads
 * or __syncwarp, or an order-dependent atomic. */
bool kcu_emu_reversed() {
  static const bool rev = [] {
    const char *v = getenv("KCU_EMU_ORDER");
    return v && !strcmp(v, "1");
  }();
  return rev;
}

[[noreturn]] void kfail(const char *what) {
  sched_get();
  fprintf(stderr, "kcu_emu: kernel block (%u, %u, %u): %s\n", tsched->block.x, tsched->block.y,
          tsched->block.z, what);
  abort();
}

const unsigned NONE = ~0u;

/* After fiber me stopped (its state set to kind, and counted): the warp's
 * next runnable fiber after me, round robin; or, none being runnable, the
 * warp barrier released when the whole warp is at it (me, runnable again); or
 * NONE: every fiber of the warp is at a block barrier or done. */
unsigned next_fiber(Sched &s, unsigned me, int kind) {
  Fiber *f = s.f.data();
  const unsigned m = s.wend - s.wbeg;
  if (kind == KCU_EMU_WARP) s.at_warp++;
  else s.at_other++;
  if (s.at_warp + s.at_other < m) {
    unsigned j = me;
    do {
      if (s.reversed) j = j == s.wbeg ? s.wend - 1 : j - 1;
      else j = j + 1 == s.wend ? s.wbeg : j + 1;
    } while (f[j].state != KCU_EMU_RUN);
    return j;
  }
  if (s.at_warp == 0) return NONE;
  if (s.at_other) kfail("a __syncwarp or shuffle without the whole warp");
  for (unsigned j = s.wbeg; j < s.wend; j++) f[j].state = KCU_EMU_RUN;
  s.at_warp = 0;
  return me;
}

/* Leaves fiber me (saving its context in *save) for fiber `to`, or for the
 * scheduler when to is NONE. */
#if defined(__x86_64__)
void switch_from(Sched &s, void **save, unsigned to) {
  if (to == NONE) {
    kcu_emu_swap(save, s.main_sp);
  } else {
    s.cur = to;
    threadIdx = s.f[to].tid;
    kcu_emu_swap(save, s.f[to].sp);
  }
}
#else
void switch_from(Sched &s, ucontext_t *save, unsigned to) {
  if (to == NONE) {
    swapcontext(save, &s.main);
  } else {
    s.cur = to;
    threadIdx = s.f[to].tid;
    swapcontext(save, &s.f[to].ctx);
  }
}
#endif

void fiber_entry() {
  (*tsched->body)();
  Sched &s = *tsched;
  const unsigned me = s.cur;
  s.f[me].state = KCU_EMU_DONE;
  unsigned to = next_fiber(s, me, KCU_EMU_DONE);
  if (to == me) kfail("a finished thread resumed"); /* unreachable: DONE is not WARP */
#if defined(__x86_64__)
  void *dead;
  switch_from(s, &dead, to);
#else
  switch_from(s, &s.f[me].ctx, to);
#endif
  abort(); /* never resumed */
}

void fiber_start(Fiber &x) {
  char *top = x.stack + GUARD + STACK;
#if defined(__x86_64__)
  void **sp = (void **)((uintptr_t)top & ~(uintptr_t)15);
  *--sp = nullptr;                /* fiber_entry's return address: it never returns */
  *--sp = (void *)&fiber_entry;   /* kcu_emu_swap's ret goes there */
  for (int i = 0; i < 6; i++) *--sp = nullptr; /* rbp rbx r12-r15 */
  x.sp = sp;
#else
  getcontext(&x.ctx);
  x.ctx.uc_stack.ss_sp = x.stack + GUARD;
  x.ctx.uc_stack.ss_size = STACK;
  x.ctx.uc_link = nullptr;
  makecontext(&x.ctx, fiber_entry, 0);
  (void)top;
#endif
  x.state = KCU_EMU_RUN;
}

/* One block: every thread from its start to its return.  Warp by warp: the
 * warp's fibers run (next_fiber passing control among them, releasing its
 * warp barriers) until each is at a block barrier or done; then the block
 * barrier, released when every thread of the block is at one. */
void run_block() {
  Sched &s = *tsched;
  const unsigned n = s.n;
  Fiber *f = s.f.data();
  for (unsigned i = 0; i < n; i++) fiber_start(f[i]);
  for (;;) {
    const unsigned nw = (n + 31) / 32;
    for (unsigned k = 0; k < nw; k++) {
      const unsigned w = 32 * (s.reversed ? nw - 1 - k : k);
      s.wbeg = w;
      s.wend = n - w < 32 ? n : w + 32;
      unsigned first = NONE;
      for (unsigned i = w; i < s.wend; i++)
        if (f[i].state == KCU_EMU_RUN && (first == NONE || s.reversed)) first = i;
      if (first == NONE) continue;
      s.at_warp = s.at_other = 0; /* every fiber of the block is runnable here */
      s.cur = first;
      threadIdx = f[first].tid;
#if defined(__x86_64__)
      kcu_emu_swap(&s.main_sp, f[first].sp);
#else
      swapcontext(&s.main, &f[first].ctx);
#endif
    }
    unsigned done = 0, block = 0;
    for (unsigned i = 0; i < n; i++) {
      done += f[i].state == KCU_EMU_DONE;
      block += f[i].state == KCU_EMU_BLOCK;
    }
    if (done == n) return;
    if (block != n) kfail("a __syncthreads that not every thread of the block reaches");
    for (unsigned i = 0; i < n; i++) f[i].state = KCU_EMU_RUN;
  }
}

/* Every block of a launch, grid x fastest. */
void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
  sched_get();
  const unsigned n = block.x * block.y * block.z;
  while (tsched->f.size() < n) {
    Fiber x{};
    void *m = mmap(NULL, STACK + GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) kfail("no memory for the threads' stacks");
    mprotect(m, GUARD, PROT_NONE); /* a stack overflow faults */
    x.stack = (char *)m;
    tsched->f.push_back(x);
  }
  if (smem > tsched->smem_cap) {
    free(tsched->smem);
    tsched->smem_cap = (smem + 127) / 128 * 128;
    tsched->smem = (char *)aligned_alloc(128, tsched->smem_cap);
    if (!tsched->smem) kfail("no memory for dynamic shared memory");
  }
  /* a kernel launched from a kernel's thread is not CUDA (no dynamic parallelism here) */
  const std::function<void()> *outer = tsched->body;
  if (outer) kfail("a launch from inside a kernel");
  tsched->body = &body;
  tsched->n = n;
  for (unsigned i = 0; i < n; i++)
    tsched->f[i].tid = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
  gridDim = uint3{grid.x, grid.y, grid.z};
  blockDim = uint3{block.x, block.y, block.z};
  const bool rev = tsched->reversed = kcu_emu_reversed();
  for (unsigned zz = 0; zz < grid.z; zz++)
    for (unsigned yy = 0; yy < grid.y; yy++)
      for (unsigned xx = 0; xx < grid.x; xx++) {
        blockIdx = rev ? uint3{grid.x - 1 - xx, grid.y - 1 - yy, grid.z - 1 - zz}
                       : uint3{xx, yy, zz};
        tsched->block = blockIdx;
        if (smem) memset(tsched->smem, 0xff, smem);
        run_block();
      }
  tsched->body = nullptr;
}

} // namespace

/* ---- kernel side (kcu_emu_kernel.h) ---- */

void kcu_emu_wait(int kind) {
  Sched &s = *tsched;
  const unsigned me = s.cur;
  s.f[me].state = kind;
  const unsigned to = next_fiber(s, me, kind);
  if (to == me) return; /* the last of the warp at its barrier: released */
#if defined(__x86_64__)
  switch_from(s, &s.f[me].sp, to);
#else
  switch_from(s, &s.f[me].ctx, to);
#endif
  /* resumed by a fiber of the warp or the scheduler, which set cur and threadIdx */
}

uint64_t *kcu_emu_xchg() { return tsched->xchg.data(); } /* inside a kernel: tsched is set */

void *kcu_emu_dyn_smem() { return sched_get().smem; }

int kcu_emu_launch_body(const void *f, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                        std::function<void()> body) {
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 || block.y > 1024 ||
      block.z > 64 || threads > 1024 || grid.x < 1 || grid.y < 1 || grid.z < 1 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return fail(cudaErrorInvalidConfiguration);
  size_t limit = SMEM_DEFAULT;
  {
    Lock l(mu);
    auto it = max_dyn_smem.find(f);
    if (it != max_dyn_smem.end()) limit = (size_t)it->second;
  }
  if (smem > limit) return fail(cudaErrorInvalidValue);
  cudaError_t e = enqueue(s, [grid, block, smem, body]() { run_grid(grid, block, smem, body); });
  if (e == cudaSuccess) {
    Lock l(mu);
    kernel_launches++;
  }
  return e;
}

int kcu_emu_enqueue(cudaStream_t s, std::function<void()> op) {
  return enqueue(s, std::move(op)) == cudaSuccess ? 0 : -1;
}

/* ---- the C API ---- */

extern "C" {

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInitializationError: return "cudaErrorInitializationError";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorIllegalState: return "cudaErrorIllegalState";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
  case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
  case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
  case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
  case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
  case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
  case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
  default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInitializationError: return "initialization error";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorStreamCaptureUnsupported:
    return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated:
    return "operation failed due to a previous error during capture";
  case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
  case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
  case cudaErrorStreamCaptureUnjoined:
    return "capturing stream has unjoined work";
  case cudaErrorStreamCaptureIsolation:
    return "dependency created on uncaptured work in another stream";
  case cudaErrorStreamCaptureImplicit:
    return "operation would make the legacy stream depend on a capturing blocking stream";
  case cudaErrorStreamCaptureWrongThread:
    return "attempt to terminate a thread-local capture sequence from another thread";
  default: return "unknown error";
  }
}

/* devices */

cudaError_t cudaGetDeviceCount(int *n) {
  if (!n) return fail(cudaErrorInvalidValue);
  *n = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  cur_device = dev;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev) {
  if (!dev) return fail(cudaErrorInvalidValue);
  *dev = cur_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "Emulated H200 (kcu_emu, CPU)");
  p->totalGlobalMem = device_mem();
  p->sharedMemPerBlock = SMEM_DEFAULT;
  p->sharedMemPerBlockOptin = SMEM_OPTIN;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->major = 9, p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->memoryBusWidth = 6144;
  p->clockRate = 1980000;
  p->memoryClockRate = 2619000;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
  if (!v) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (a) {
  case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)SMEM_DEFAULT; break;
  case cudaDevAttrWarpSize: *v = 32; break;
  case cudaDevAttrMultiProcessorCount: *v = 132; break;
  case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)SMEM_OPTIN; break;
  default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Lock l(mu);
  /* it would wait for the capturing streams' work */
  bool any = false;
  for (Capture *c : captures) {
    if (c->mode != cudaStreamCaptureModeRelaxed || c->thread == std::this_thread::get_id()) {
      c->invalid = true;
      any = true;
    }
  }
  return any ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
  if (!free_b || !total_b) return fail(cudaErrorInvalidValue);
  Lock l(mu);
  *total_b = device_mem();
  *free_b = *total_b - allocated;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev) {
  if (!pool) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  *pool = &pools[dev];
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) {
  if (!pool || !v) return fail(cudaErrorInvalidValue);
  if (a == cudaMemPoolAttrReleaseThreshold) pool->threshold = *(uint64_t *)v;
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr a, void *v) {
  if (!pool || !v) return fail(cudaErrorInvalidValue);
  if (a == cudaMemPoolAttrReleaseThreshold) *(uint64_t *)v = pool->threshold;
  else *(int *)v = 1;
  return cudaSuccess;
}

/* memory */

/* KCU_EMU_MALLOC_FAIL=N: the process's Nth cudaMalloc (from 1) fails with
 * cudaErrorMemoryAllocation whatever is free, as when another process took the
 * memory after a check of cudaMemGetInfo (tests of start-up out-of-memory). */
static long mallocs; /* cudaMalloc calls so far (under mu) */

cudaError_t cudaMalloc(void **p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  Lock l(mu);
  if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  if (++mallocs == env_int("KCU_EMU_MALLOC_FAIL", 0, 0, INT_MAX)) {
    *p = NULL;
    return fail(cudaErrorMemoryAllocation);
  }
  cudaError_t e;
  *p = dev_alloc(bytes, &e);
  return fail(e);
}

cudaError_t cudaFree(void *p) {
  Lock l(mu);
  if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p) return cudaSuccess;
  if (!device_allocs.count(p)) return fail(cudaErrorInvalidValue);
  dev_free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  if (!p) return fail(cudaErrorInvalidValue);
  Lock l(mu);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s && s->cap && s->cap->invalid) return fail(cudaErrorStreamCaptureInvalidated);
  /* under capture too the memory is allocated now: the graph's allocation is
   * this one, at every launch */
  cudaError_t e;
  *p = dev_alloc(bytes, &e);
  return fail(e);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  Lock l(mu);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (p && !device_allocs.count(p)) return fail(cudaErrorInvalidValue);
  if (s && s->cap) {
    if (s->cap->invalid) return fail(cudaErrorStreamCaptureInvalidated);
    s->cap->body->frees.push_back(p); /* freed with the graph */
    return cudaSuccess;
  }
  if (p) dev_free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  Lock l(mu);
  if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  *p = malloc(bytes ? bytes : 1);
  if (!*p) return fail(cudaErrorMemoryAllocation);
  host_allocs.insert(*p);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  Lock l(mu);
  if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p) return cudaSuccess;
  if (!host_allocs.erase(p)) return fail(cudaErrorInvalidValue);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  if ((unsigned)kind > cudaMemcpyDefault || (bytes && (!dst || !src)))
    return fail(cudaErrorInvalidValue);
  {
    Lock l(mu);
    if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (bytes) memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
  if ((unsigned)kind > cudaMemcpyDefault || (bytes && (!dst || !src)))
    return fail(cudaErrorInvalidValue);
  if (!bytes) return cudaSuccess;
  return enqueue(s, [dst, src, bytes]() { memmove(dst, src, bytes); });
}

namespace {
void copy_2d(char *dst, size_t dpitch, const char *src, size_t spitch, size_t width,
             size_t height) {
  for (size_t r = 0; r < height; r++) memmove(dst + r * dpitch, src + r * spitch, width);
}
bool bad_2d(const void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
            size_t height, enum cudaMemcpyKind kind) {
  return (unsigned)kind > cudaMemcpyDefault || width > dpitch || width > spitch ||
         (width && height && (!dst || !src));
}
} // namespace

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind) {
  if (bad_2d(dst, dpitch, src, spitch, width, height, kind)) return fail(cudaErrorInvalidValue);
  {
    Lock l(mu);
    if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  copy_2d((char *)dst, dpitch, (const char *)src, spitch, width, height);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
  if (bad_2d(dst, dpitch, src, spitch, width, height, kind)) return fail(cudaErrorInvalidValue);
  if (!width || !height) return cudaSuccess;
  return enqueue(s, [=]() {
    copy_2d((char *)dst, dpitch, (const char *)src, spitch, width, height);
  });
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  if (bytes && !p) return fail(cudaErrorInvalidValue);
  {
    Lock l(mu);
    if (unsafe_now()) return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (bytes) memset(p, v, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  if (bytes && !p) return fail(cudaErrorInvalidValue);
  if (!bytes) return cudaSuccess;
  return enqueue(s, [p, v, bytes]() { memset(p, v, bytes); });
}

/* streams */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  if (!s || flags > cudaStreamNonBlocking) return fail(cudaErrorInvalidValue);
  Lock l(mu);
  *s = new CUstream_st{flags, nullptr, 0, 0};
  streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Lock l(mu);
  if (!s || !streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s->cap) {
    /* CUDA: destroying a capturing stream invalidates its capture */
    s->cap->invalid = true;
    auto &m = s->cap->members;
    for (size_t i = 0; i < m.size(); i++)
      if (m[i] == s) m.erase(m.begin() + (long)i), i--;
    if (s->cap->origin == s) s->cap->origin = nullptr;
  }
  streams.erase(s);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Lock l(mu);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s && s->cap) {
    s->cap->invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (!s && unsafe_now()) return fail(cudaErrorStreamCaptureImplicit);
  return cudaSuccess; /* its work is done: it ran when enqueued */
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  Lock l(mu);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s && s->cap) {
    s->cap->invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)flags;
  Lock l(mu);
  if (!valid_stream(s) || !e || !events.count(e)) return fail(cudaErrorInvalidResourceHandle);
  Capture *c = e->cap;
  if (!c) {
    if (s && s->cap) {
      /* a dependency of captured work on uncaptured work: allowed in CUDA's
       * relaxed sense (the event's work is complete here anyway) */
    }
    return cudaSuccess;
  }
  if (s && s->cap && s->cap != c) {
    s->cap->invalid = c->invalid = true;
    return fail(cudaErrorStreamCaptureMerge);
  }
  if (!s) {
    c->invalid = true;
    return fail(cudaErrorStreamCaptureImplicit);
  }
  if (!s->cap) { /* s joins the capture (a fork) */
    s->cap = c;
    s->seq = s->joined_seq = 0;
    c->members.push_back(s);
  }
  /* the work of e's stream up to the record is joined into s */
  if (e->src && e->src != s && e->src->cap == c && e->seq > e->src->joined_seq)
    e->src->joined_seq = e->seq;
  return c->invalid ? fail(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

/* events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  if (!e || flags > (cudaEventBlockingSync | cudaEventDisableTiming))
    return fail(cudaErrorInvalidValue);
  Lock l(mu);
  *e = new CUevent_st{flags, false, 0.0, nullptr, nullptr, 0};
  events.insert(*e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Lock l(mu);
  if (!e || !events.erase(e)) return fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Lock l(mu);
  if (!e || !events.count(e) || !valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s && s->cap) {
    if (s->cap->invalid) return fail(cudaErrorStreamCaptureInvalidated);
    e->cap = s->cap, e->src = s, e->seq = s->seq;
    e->recorded = false;
    return cudaSuccess;
  }
  if (!s && unsafe_now()) return fail(cudaErrorStreamCaptureImplicit);
  /* the stream's earlier work is done: it ran when enqueued */
  e->cap = nullptr, e->src = s, e->seq = 0;
  e->recorded = true;
  e->t = now_s();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  Lock l(mu);
  if (!e || !events.count(e)) return fail(cudaErrorInvalidResourceHandle);
  if (e->cap) {
    e->cap->invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  Lock l(mu);
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!a || !b || !events.count(a) || !events.count(b)) return fail(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (a->cap || b->cap) return fail(cudaErrorStreamCaptureUnsupported);
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = (float)((b->t - a->t) * 1e3);
  return cudaSuccess;
}

/* graphs */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  Lock l(mu);
  if (!s) return fail(cudaErrorStreamCaptureUnsupported); /* not the legacy stream */
  if (!streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
  if ((unsigned)mode > cudaStreamCaptureModeRelaxed) return fail(cudaErrorInvalidValue);
  if (s->cap) return fail(cudaErrorIllegalState);
  Capture *c = new Capture{s, (int)mode, std::this_thread::get_id(), false,
                           std::make_shared<GraphBody>(), {s}};
  captures.insert(c);
  s->cap = c;
  s->seq = s->joined_seq = 0;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  Lock l(mu);
  if (!st) return fail(cudaErrorInvalidValue);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle);
  *st = !s || !s->cap     ? cudaStreamCaptureStatusNone
        : s->cap->invalid ? cudaStreamCaptureStatusInvalidated
                          : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  Lock l(mu);
  if (!g) return fail(cudaErrorInvalidValue);
  *g = nullptr;
  if (!s || !streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
  Capture *c = s->cap;
  if (!c) return fail(cudaErrorIllegalState);
  if (c->origin != s) {
    c->invalid = true;
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  cudaError_t e = c->invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
  for (CUstream_st *m : c->members) {
    if (m != s && m->seq > m->joined_seq && e == cudaSuccess) e = cudaErrorStreamCaptureUnjoined;
    m->cap = nullptr;
  }
  for (CUevent_st *ev : events)
    if (ev->cap == c) ev->cap = nullptr, ev->recorded = true, ev->t = now_s();
  captures.erase(c);
  if (e == cudaSuccess) {
    *g = new CUgraph_st{c->body};
    graphs.insert(*g);
  }
  delete c;
  return fail(e);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
  (void)flags;
  Lock l(mu);
  if (!x) return fail(cudaErrorInvalidValue);
  if (!g || !graphs.count(g)) return fail(cudaErrorInvalidResourceHandle);
  *x = new CUgraphExec_st{g->body};
  execs.insert(*x);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *x, cudaGraph_t g,
                                          unsigned long long flags) {
  return cudaGraphInstantiate(x, g, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
  std::shared_ptr<GraphBody> b;
  {
    Lock l(mu);
    if (!x || !execs.count(x)) return fail(cudaErrorInvalidResourceHandle);
    b = x->body;
  }
  cudaError_t e = enqueue(s, [b]() {
    for (const auto &op : b->ops) op();
  });
  if (e == cudaSuccess) {
    Lock l(mu);
    graph_launches++;
  }
  return e;
}

long kcu_emu_graph_launches(void) {
  Lock l(mu);
  return graph_launches;
}

/* KCU_EMU_STATS=FILE: the process's graph and kernel launches, written at its
 * exit as one JSON object (a whole program -- a generated train_cuda -- has no
 * other way to show that its graph ran, or how many launches it made). */
namespace {
struct StatsAtExit {
  ~StatsAtExit() {
    const char *path = getenv("KCU_EMU_STATS");
    if (!path || !*path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "{\"graph_launches\": %ld, \"kernel_launches\": %ld}\n", graph_launches,
            kernel_launches);
    fclose(f);
  }
} stats_at_exit;
}  // namespace

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  Lock l(mu);
  if (!g || !graphs.erase(g)) return fail(cudaErrorInvalidResourceHandle);
  delete g;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  Lock l(mu);
  if (!x || !execs.erase(x)) return fail(cudaErrorInvalidResourceHandle);
  delete x;
  return cudaSuccess;
}

/* kernels */

cudaError_t kcu_emu_func_set_attribute(const void *f, enum cudaFuncAttribute a, int v) {
  if (!f) return fail(cudaErrorInvalidValue);
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (v < 0 || (size_t)v > SMEM_OPTIN) return fail(cudaErrorInvalidValue);
  Lock l(mu);
  max_dyn_smem[f] = v;
  return cudaSuccess;
}

} /* extern "C" */
