// The limits a container runs under, per visible GPU, and the two places they come from: the limits file the
// node agent writes (docs/hook-abi.md, "The limits file"), or environment variables (`tessera run`, a plain
// LD_PRELOAD). Both the dependency-free parser (used inside the hook libraries) and the writer (used by the
// node agent: write to a temporary file and rename it over the old one) live here.
//
//   tessera::hook::Limits limits;
//   tessera::hook::Error error;
//   if (!tessera::hook::ReadLimitsFile("/etc/tessera/limits", &limits, &error)) { ... error.text ... }
//   const tessera::hook::DeviceLimits* d = tessera::hook::FindDeviceLimits(limits, "GPU-5d3c...", 0);
//
//   limits.generation += 1;                                    // the node agent, resizing a container
//   tessera::hook::WriteLimitsFile("/var/lib/tessera/containers/<pod>/<ctr>/limits", limits, &error);
//
// API-neutral: no CUDA or OpenCL types; a GPU is named by its UUID string or by its visible index.
// Thread-safety: plain values and pure functions, except the file functions, which touch only their paths.
#ifndef TESSERA_HOOK_COMMON_LIMITS_H_
#define TESSERA_HOOK_COMMON_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "hook/common/base.h"

namespace tessera::hook {

inline constexpr uint32_t kLimitsVersion = 1;
inline constexpr int kMaxDevices = 16;
inline constexpr size_t kUuidSize = 64;
inline constexpr size_t kPathSize = 256;
inline constexpr uint32_t kMaxTenants = 1000;  // tenants= on a gpu line (the agent's --slots-per-gpu bound)
inline constexpr uint32_t kDefaultCeilingPercent = 90;  // GaiaGPU: elastic use stops at 90% of the GPU
// A whole GPU in the unit of `cores-milli=` (thousandths: the scheduler's ledger's unit), and in parts per
// million (the unit the hooks' token bucket enforces).
inline constexpr uint32_t kMilliPerGpu = 1000;
inline constexpr uint32_t kPpmPerGpu = 1000000;
// DeviceLimits::index value for an entry that applies to every visible GPU not named by another entry.
inline constexpr int kAnyDevice = -1;
// DeviceLimits::index value for an entry that names its GPU by UUID only.
inline constexpr int kByUuid = -2;

enum class ComputePolicy : uint32_t { kHard = 0, kElastic = 1 };
enum class Priority : uint32_t { kLow = 0, kHigh = 1 };

const char* ComputePolicyName(ComputePolicy policy);
const char* PriorityName(Priority priority);

struct DeviceLimits {
  char uuid[kUuidSize] = {0};      // "GPU-..." (NVML's and cuDeviceGetUuid's form); empty when by index
  int index = kByUuid;             // visible GPU index (CUDA ordinal), kByUuid, or kAnyDevice
  uint64_t memory_bytes = 0;       // 0: no memory limit (written `memory=unlimited`; `memory=0` is refused)
  uint32_t cores_percent = 100;    // 1..100; 100: no compute limit. With cores_milli: its PercentForMilli
  // The share in thousandths of the GPU (`cores-milli=`, 1..1000), the unit the scheduler's ledger commits
  // in, carried unrounded from the assignment to the hook; 0: not given (a file of an older agent, the
  // environment), and cores_percent is the share. What the hooks enforce is SharePpm().
  uint32_t cores_milli = 0;
  ComputePolicy policy = ComputePolicy::kHard;
  uint32_t ceiling_percent = kDefaultCeilingPercent;  // elastic only: the most it may use when the GPU is idle
  Priority priority = Priority::kLow;
  // The Tessera containers holding this GPU, this one included, as the node agent counts them (`tenants=N`);
  // 0: not known (no agent, or an older one). 1 tells the elastic policy that no other tenant can want the
  // GPU's idle compute, where it cannot see other processes itself (OpenCL; CUDA without NVML).
  uint32_t tenants = 0;
};

struct Limits {
  uint32_t version = kLimitsVersion;
  uint64_t generation = 0;         // rises with every rewrite; the hooks apply a file only when it rises
  char region_path[kPathSize] = {0};  // the shared region file; empty: the hook's default (see docs)
  int device_count = 0;
  DeviceLimits devices[kMaxDevices];
};

// The compute share the hooks enforce, in parts per million of the GPU's time: cores_milli x 1000 when given
// (exact: no share grows on its way from the ledger), else cores_percent x 10,000. kPpmPerGpu: no limit.
uint32_t SharePpm(const DeviceLimits& d);
// The elastic ceiling in parts per million: ceiling_percent x 10,000, never below SharePpm.
uint32_t CeilingPpm(const DeviceLimits& d);
// The whole percent written as `cores=` next to `cores-milli=` for readers that know only percent: rounded
// down, at least 1 (their parser needs 1..100).
uint32_t PercentForMilli(uint32_t milli);

// Parses the text of a limits file. On error, `error` says which line and what to do; `out` is unspecified.
bool ParseLimits(const char* text, size_t size, Limits* out, Error* error);

// Formats `limits` as a limits file. Returns the length written (terminated), or 0 when `cap` is too small.
// Entries by index are written as `index=<i>` (or `index=*` for kAnyDevice).
size_t FormatLimits(const Limits& limits, char* buf, size_t cap);

// Checks a Limits value before it is written: cores 1..100, cores_milli 0 or 1..1000 with cores its
// PercentForMilli, ceiling >= cores, at most one kAnyDevice entry, a UUID or an index on every entry, no
// duplicates.
bool ValidateLimits(const Limits& limits, Error* error);

// Reads and parses a limits file (at most 64 KiB).
bool ReadLimitsFile(const char* path, Limits* out, Error* error);

// Writes `limits` atomically: a temporary file in the same directory, renamed over `path`. Readers see the
// old file or the new one, never a mix. Mode 0644. `durable` also fsyncs the file and its directory, for a
// file that must survive a power loss; a file whose reader dies with the machine anyway (a container's
// limits, written before the container starts) need not wait for the disk.
bool WriteLimitsFile(const char* path, const Limits& limits, Error* error, bool durable = true);

// The entry that applies to a GPU: the one with this UUID, else the one with this index (a line that also names
// a UUID only when the device has none: `uuid` null or empty), else kAnyDevice. `index` is negative when
// unknown. Null when none applies.
const DeviceLimits* FindDeviceLimits(const Limits& limits, const char* uuid, int index);

// Limits from environment variables, read through `lookup` (getenv in the hooks, a map in tests):
//   TESSERA_GPU_MEMORY_LIMIT   512MiB, 4GiB, 1.5GiB, bytes, or unlimited (no limit when unset; 0 refused)
//   TESSERA_GPU_CORES          1..100                                      (100 when unset)
//   TESSERA_COMPUTE_POLICY     hard | elastic                              (hard)
//   TESSERA_COMPUTE_CEILING    1..100, elastic only                        (90)
//   TESSERA_PRIORITY           high | low                                  (low)
//   TESSERA_REGION             the shared region file                      (the hook's default)
// Each GPU variable may also be given as <NAME>_<i> for the i-th visible GPU (i = 0..15), which wins over
// the plain name for that GPU. `configured` is set when any TESSERA_GPU_MEMORY_LIMIT* or TESSERA_GPU_CORES*
// variable is present; then `out` holds one kAnyDevice entry (from the plain names) plus one entry per index
// with a suffixed variable. Returns false (and says which variable and why) on a malformed value.
using EnvLookup = const char* (*)(const char* name);
bool LimitsFromEnvironment(EnvLookup lookup, Limits* out, bool* configured, Error* error);

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_LIMITS_H_
