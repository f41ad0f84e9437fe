// The fake GPU's state, shared by every process that loads the fake libcuda.so.1 or libnvidia-ml.so.1: a file
// (FAKECUDA_STATE, default /tmp/fakecuda-<uid>.state) mapped into each of them, so several processes contend
// for one simulated GPU as on a real one. Device memory is a counter per GPU; the timeline is real wall-clock
// time (CLOCK_MONOTONIC): a kernel occupies its GPU from max(launch, its stream's previous work, the GPU's
// previous kernel) for its duration, and every kernel is kept in a ring so that events and NVML utilization
// are computed from the same timeline.
//
// Configuration (read by the process that creates the state file): FAKECUDA_GPUS (default 1, at most 8),
// FAKECUDA_UUIDS (comma-separated "GPU-..." UUIDs: these GPUs in this order, instead of FAKECUDA_GPUS made-up
// ones; a node's GPUs as its agent published them), FAKECUDA_MEMORY (per GPU; default 16GiB),
// FAKECUDA_CONTEXT_BYTES (device memory a context takes; default 64MiB). CUDA_VISIBLE_DEVICES is honoured by the fake driver (indices or UUID prefixes), not by the fake NVML,
// as with the real ones.
//
// Thread-safety: the state is guarded by a robust process-shared mutex (a SIGKILLed process leaves no lock).
#ifndef TESSERA_TOOLS_FAKECUDA_FAKE_STATE_H_
#define TESSERA_TOOLS_FAKECUDA_FAKE_STATE_H_

#include <pthread.h>

#include <cstdint>

namespace fakecuda {

inline constexpr int kMaxGpus = 8;
inline constexpr int kRing = 16384;
inline constexpr int kMaxProcs = 512;
inline constexpr uint64_t kStateMagic = 0x4154534b41464346ull;

struct Kernel {
  uint64_t start_ns;
  uint64_t end_ns;
  uint32_t pid;
  uint32_t pad;
};

struct Gpu {
  char uuid[48];
  char name[64];
  uint64_t total_bytes;
  uint64_t used_bytes;
  uint64_t peak_bytes;
  uint64_t busy_until_ns;
  uint32_t ring_head;     // next slot
  uint32_t ring_count;
  Kernel ring[kRing];
};

struct Proc {
  uint32_t pid;
  uint32_t pad;
  uint64_t used_bytes[kMaxGpus];
};

struct State {
  uint64_t magic;
  uint32_t gpu_count;
  uint32_t pad;
  uint64_t context_bytes;
  pthread_mutex_t lock;
  Gpu gpus[kMaxGpus];
  Proc procs[kMaxProcs];
};

// Maps (creating when needed) the state file. Never fails for a usable path; aborts with a message otherwise.
State* Shared();
void Lock(State* s);
void Unlock(State* s);
uint64_t NowNs();
// Fault injection: sleeps as many milliseconds as the environment variable `name` says (nothing when unset).
void SleepAsConfigured(const char* name);
// Frees the memory of processes that died (a real driver does this when a process exits). Under the lock.
void ReapDeadLocked(State* s);
// Adds (or subtracts) device memory for this process. Under the lock. False when the GPU is full.
bool ChargeLocked(State* s, int gpu, int64_t bytes);
// GPU time busy in [from, to), for all processes (pid 0) or one.
uint64_t BusyNsLocked(const Gpu& g, uint32_t pid, uint64_t from, uint64_t to);

}  // namespace fakecuda

#endif  // TESSERA_TOOLS_FAKECUDA_FAKE_STATE_H_
