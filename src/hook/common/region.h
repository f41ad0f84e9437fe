// The shared region: one file per container, mmapped by every process of that container that uses a GPU, so
// that all of them share one memory quota and one compute budget per GPU. Its layout is a fixed ABI
// (docs/hook-abi.md, "The shared region"): a header with magic, version and reserved space, one entry per GPU
// (named by UUID) with its memory ledger and its GPU-time token bucket, and one slot per process.
//
//   tessera::hook::SharedRegion region;
//   tessera::hook::Error error;
//   if (!region.Open("/run/tessera/region", &error) || !region.Attach(&error)) { ... fail closed ... }
//   int dev = region.FindOrAddDevice("GPU-5d3c...", &error);
//   region.SetDeviceLimits(dev, 4ull << 30, ...);
//   if (region.TryCharge(dev, bytes) == tessera::hook::ChargeResult::kOk) { ...real allocation... }
//   region.Uncharge(dev, bytes);          // on free, or when the real allocation failed
//
// Memory is charged reserve-then-commit: TryCharge reserves under the GPU's lock, against the container's
// total, before the real allocation is made, so two processes can never both pass the limit. The locks are
// process-shared robust mutexes held only for a few loads and stores: a process killed while holding one
// leaves it to the next locker (EOWNERDEAD), which rebuilds the total from the slots. A killed process's
// charges are reclaimed by the next ReclaimDeadSlots() (called at Attach, before reporting an allocation as
// out of memory, and about once a second by the hook's background thread). Slots are claimed without a lock,
// so hundreds of processes starting at once do not wait on each other.
//
// API-neutral: no CUDA or OpenCL types. Thread-safety: all methods are thread-safe after Open, and safe
// between processes. Not async-signal-safe.
#ifndef TESSERA_HOOK_COMMON_REGION_H_
#define TESSERA_HOOK_COMMON_REGION_H_

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "hook/common/base.h"
#include "hook/common/limiter.h"
#include "hook/common/limits.h"

namespace tessera::hook {

inline constexpr uint64_t kRegionMagic = 0x314E4F4947455254ull;  // "TREGION1" read as little-endian bytes
inline constexpr uint32_t kRegionVersion = 1;
inline constexpr uint32_t kRegionSlots = 1024;
inline constexpr size_t kRegionHeaderBytes = 512;
inline constexpr size_t kRegionDeviceBytes = 512;
inline constexpr size_t kRegionDevicesOffset = 512;
inline constexpr size_t kRegionSlotsOffset = 16384;
inline constexpr size_t kRegionSlotBytes = 512;
inline constexpr size_t kRegionBytes = kRegionSlotsOffset + kRegionSlots * kRegionSlotBytes;

// The region's fixed header (offset 0, 512 bytes).
struct RegionHeader {
  uint64_t magic;                       // 0: kRegionMagic
  uint32_t version;                     // 8: kRegionVersion
  uint32_t header_bytes;                // 12: kRegionHeaderBytes
  uint32_t device_bytes;                // 16
  uint32_t device_count_max;            // 20: kMaxDevices
  uint32_t slot_bytes;                  // 24
  uint32_t slot_count;                  // 28
  uint64_t devices_offset;              // 32
  uint64_t slots_offset;                // 40
  uint64_t region_bytes;                // 48
  uint32_t creator_pid;                 // 56
  uint32_t reserved0;                   // 60
  pthread_mutex_t table_lock;           // 64: guards adding device entries (robust, process-shared)
  uint8_t pad0[128 - 64 - sizeof(pthread_mutex_t)];
  std::atomic<uint64_t> limits_generation;  // 128: generation of the limits last applied
  std::atomic<uint32_t> device_count;       // 136: device entries in use
  uint32_t reserved1;                       // 140
  uint8_t reserved[kRegionHeaderBytes - 144];
};
static_assert(sizeof(RegionHeader) == kRegionHeaderBytes);

// One GPU of the container (512 bytes each, kMaxDevices of them from offset 512).
struct RegionDevice {
  pthread_mutex_t lock;                 // 0: guards used_bytes and every slot's charged[] of this GPU
  uint8_t pad0[64 - sizeof(pthread_mutex_t)];
  char uuid[kUuidSize];                 // 64: "GPU-..." (or "index-<i>" when the UUID is unknown)
  std::atomic<uint64_t> limit_bytes;    // 128: 0 = no limit
  std::atomic<uint64_t> used_bytes;     // 136: sum of all slots' charged[] for this GPU
  std::atomic<uint64_t> peak_bytes;     // 144: the most used_bytes has been
  std::atomic<uint64_t> oom_count;      // 152: allocations refused for the limit
  std::atomic<uint64_t> context_bytes;  // 160: a context's footprint as last measured here (0: not yet)
  uint8_t pad1[192 - 168];
  BucketState bucket;                   // 192: GPU-time budget (compute share), 128 bytes
  ControllerState controller;           // 320: elastic controller's state, 64 bytes
  uint8_t reserved[kRegionDeviceBytes - 384];
};
static_assert(sizeof(RegionDevice) == kRegionDeviceBytes);

// One process (512 bytes each, kRegionSlots of them from offset 16384).
struct RegionSlot {
  std::atomic<uint64_t> owner;          // 0: pid (low 32 bits) | reclaiming pid (high 32 bits); 0 = free
  std::atomic<uint64_t> start_time;     // 8: the owner's start time (/proc/<pid>/stat field 22); 0 unknown
  std::atomic<uint64_t> attached_ns;    // 16: CLOCK_MONOTONIC when claimed
  std::atomic<uint32_t> host_pid;       // 24: the owner's pid on the host (NVML's pid); 0 unknown
  uint32_t reserved0;                   // 28
  uint8_t pad0[64 - 32];
  std::atomic<uint64_t> charged[kMaxDevices];  // 64: bytes this process holds per device entry
  uint8_t reserved[kRegionSlotBytes - 64 - 8 * kMaxDevices];
};
static_assert(sizeof(RegionSlot) == kRegionSlotBytes);

// The offsets docs/hook-abi.md gives, which the node agent's reader (region_snapshot.h) relies on.
static_assert(offsetof(RegionHeader, version) == 8 && offsetof(RegionHeader, region_bytes) == 48 &&
              offsetof(RegionHeader, table_lock) == 64 && offsetof(RegionHeader, limits_generation) == 128 &&
              offsetof(RegionHeader, device_count) == 136);
static_assert(offsetof(RegionDevice, uuid) == 64 && offsetof(RegionDevice, limit_bytes) == 128 &&
              offsetof(RegionDevice, used_bytes) == 136 && offsetof(RegionDevice, peak_bytes) == 144 &&
              offsetof(RegionDevice, oom_count) == 152 && offsetof(RegionDevice, context_bytes) == 160 &&
              offsetof(RegionDevice, bucket) == 192 && offsetof(RegionDevice, controller) == 320);
static_assert(offsetof(ControllerState, own_util_ppm) == 48);
static_assert(offsetof(RegionSlot, host_pid) == 24 && offsetof(RegionSlot, charged) == 64);

// kLockTimeout: the GPU's lock was held longer than the lock timeout (a process of the container holds it
// and does not let go, or the file was tampered with); nothing was charged.
// kDetached: the process has left the region (Detach, at exit): nothing more is charged to it.
enum class ChargeResult { kOk, kOverLimit, kLockTimeout, kDetached };

// How long any region lock is waited for before giving up (never forever: the region is writable by the
// tenant). TESSERA_REGION_LOCK_TIMEOUT_MS overrides it in the hooks.
inline constexpr int kDefaultRegionLockTimeoutMs = 2000;

class SharedRegion {
 public:
  SharedRegion() = default;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  // No destructor on purpose: the hook keeps its region in a global that must outlive every thread of the
  // process (a destructor at exit would unmap it under a running thread). Call Close() when done.

  // Opens the region file, creating it (fully initialized, then published with link(2)) when it does not
  // exist. Fails with a message that says what to do when the file is not a region or of another version.
  bool Open(const char* path, Error* error);
  // Unmaps the region (keeps the file). The slot is not released: call Detach() first for that.
  void Close();
  bool is_open() const { return base_ != nullptr; }
  const char* path() const { return path_; }

  // Claims a slot for the calling process (reclaiming dead processes' slots first, and a slot this same pid
  // held before an exec). Idempotent per process; call again after fork() in the child (ForgetSlot first).
  bool Attach(Error* error);
  // Releases this process's slot and every charge it holds (process exit). Charge operations of other
  // threads that come later do nothing (TryCharge: kDetached).
  void Detach();
  // After fork(), in the child: the parent's slot is not the child's. Drops it without touching it.
  void ForgetSlot() { slot_ = -1; }
  int slot() const { return slot_; }

  // The entry for a GPU, added when missing (up to kMaxDevices). -1 with `error` when the table is full.
  int FindOrAddDevice(const char* uuid, Error* error);
  // The entry for a GPU, or -1.
  int FindDevice(const char* uuid) const;
  int device_count() const;
  RegionDevice* device(int index) const;
  RegionSlot* slot_at(int index) const;

  // Applies one GPU's limits (memory limit, compute share and policy). The memory limit may drop below what
  // is in use: nothing is taken away, new charges fail until enough is freed.
  void SetDeviceLimits(int device, const DeviceLimits& limits, uint64_t now_ns);

  // Reserves `bytes` on `device` for this process, if the container's total stays within the limit.
  ChargeResult TryCharge(int device, uint64_t bytes);
  // Charges `bytes` whatever the limit: memory the driver already holds for this process and that the
  // hook learns of afterwards (a kernel loaded lazily at its first launch). False on a lock timeout.
  bool ForceCharge(int device, uint64_t bytes);
  // Gives back `bytes` charged by this process (never below zero). False on a lock timeout (the charge
  // stays: the container is charged too much, never too little).
  bool Uncharge(int device, uint64_t bytes);
  uint64_t Used(int device) const;
  uint64_t Limit(int device) const;
  uint64_t ChargedByMe(int device) const;
  // Bytes this process has charged, and given back, since it opened the region (counted in this process,
  // before each change lands in the slot). Read before and after measuring something against ChargedByMe,
  // they bound how far the two moments differ: the footprint true-ups use them (hook/cuda/footprint.cc).
  uint64_t charged_total() const { return charged_total_.load(std::memory_order_seq_cst); }
  uint64_t uncharged_total() const { return uncharged_total_.load(std::memory_order_seq_cst); }

  // Frees the slots of processes that no longer exist, and their charges. Returns how many were freed.
  int ReclaimDeadSlots();

  // Records this process's pid on the host (NVML reports host pids) in its slot.
  void SetHostPid(uint32_t host_pid);
  // Whether a live process of the container has this host pid; `local` is its pid in the container.
  bool ContainerPidForHostPid(uint32_t host_pid, uint32_t* local) const;
  // Lock waits longer than this give up with kLockTimeout / false (and a message once). Default
  // kDefaultRegionLockTimeoutMs.
  void set_lock_timeout_ms(int ms) { lock_timeout_ms_ = ms > 0 ? ms : 1; }
  int lock_timeout_ms() const { return lock_timeout_ms_; }
  // Set after a lock wait gave up: what happened, for the caller's message.
  const char* lock_error() const { return lock_error_.text; }

  // Recomputes a device's total from the slots and compares (for tests and `tessera inspect`): true when
  // consistent. Takes the lock.
  bool CheckConsistent(int device);

 private:
  bool Create(const char* path, Error* error);
  bool Map(int fd, Error* error);
  bool Lock(int device);
  void Unlock(int device);
  bool LockTable();
  bool TimedLock(pthread_mutex_t* m, const char* what, int device);
  void RepairLocked(int device);
  bool ReclaimSlot(int index, uint64_t observed_owner);

  RegionHeader* header() const { return static_cast<RegionHeader*>(base_); }
  // This process's slot, or nullptr before Attach and from the start of Detach. Charge operations ask under
  // the GPU entry's lock.
  RegionSlot* MySlot() const {
    const int me = slot_.load();
    return me < 0 ? nullptr : slot_at(me);
  }
  // Adds `bytes` to GPU entry `dev` and to slot `s`. Under the entry's lock.
  void AddChargeLocked(int dev, RegionSlot* s, uint64_t bytes);

  void* base_ = nullptr;
  // The process's slot; -1 before Attach and from the start of Detach. Charge operations read it under the
  // device's lock, so none lands in a slot that Detach is emptying (the limiter thread runs on during exit).
  std::atomic<int> slot_{-1};
  int pid_ = 0;
  int lock_timeout_ms_ = kDefaultRegionLockTimeoutMs;
  std::atomic<uint64_t> charged_total_{0};
  std::atomic<uint64_t> uncharged_total_{0};
  Error lock_error_;
  char path_[kPathSize] = {0};
};

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_REGION_H_
