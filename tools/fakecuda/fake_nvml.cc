// A fake NVML (libnvidia-ml.so.1) over the simulated GPUs of fake_state.h: memory as the fake driver counts it,
// utilization from the same kernel timeline (over the last kUtilWindowNs, like NVML's sample period), and a
// few fakecuda* functions that tests and benchmarks use to read the timeline exactly.
//
// FAKECUDA_NVML_UTIL_EXTRA=N: utilization reads N points above the timeline (capped at 100), as a real GPU's
// does against what a program measures of its own kernels (sampled, lagging, counting launch gaps: an H100
// running one process at 85-90% read a few points above, and swung by +-5 between samples).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_state.h"
#include "hook/cuda/nvml_types.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
constexpr uint64_t kUtilWindowNs = 200000000;  // 200 ms

bool Handle(nvmlDevice_t d, int* index) {
  const intptr_t v = reinterpret_cast<intptr_t>(d) - 1;
  if (v < 0 || v >= static_cast<intptr_t>(fakecuda::Shared()->gpu_count)) return false;
  *index = static_cast<int>(v);
  return true;
}
}  // namespace

FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  fakecuda::Shared();
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlInit(void) {
  return nvmlInit_v2();
}
FAKE_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int) {
  return nvmlInit_v2();
}
FAKE_EXPORT nvmlReturn_t nvmlShutdown(void) {
  return NVML_SUCCESS;
}
FAKE_EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  return r == NVML_SUCCESS ? "Success" : "Fake NVML error";
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* n) {
  if (n == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *n = fakecuda::Shared()->gpu_count;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  if (d == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (i >= fakecuda::Shared()->gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
  *d = reinterpret_cast<nvmlDevice_t>(static_cast<intptr_t>(i) + 1);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t* d) {
  return nvmlDeviceGetHandleByIndex_v2(i, d);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* n) {
  return nvmlDeviceGetCount_v2(n);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* d) {
  if (uuid == nullptr || d == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  fakecuda::State* s = fakecuda::Shared();
  for (uint32_t i = 0; i < s->gpu_count; ++i) {
    if (strcmp(s->gpus[i].uuid, uuid) == 0) return nvmlDeviceGetHandleByIndex_v2(i, d);
  }
  return NVML_ERROR_NOT_FOUND;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid, unsigned int len) {
  if (uuid == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  int i = 0;
  if (!Handle(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
  if (snprintf(uuid, len, "%s", fakecuda::Shared()->gpus[i].uuid) >= static_cast<int>(len)) {
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned int len) {
  if (name == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  int i = 0;
  if (!Handle(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(name, len, "%s", fakecuda::Shared()->gpus[i].name);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int* index) {
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  int i = 0;
  if (!Handle(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
  *index = static_cast<unsigned>(i);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  int i = 0;
  if (!Handle(d, &i) || m == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  fakecuda::State* s = fakecuda::Shared();
  fakecuda::Lock(s);
  fakecuda::ReapDeadLocked(s);
  m->total = s->gpus[i].total_bytes;
  m->used = s->gpus[i].used_bytes;
  m->free = m->total - m->used;
  fakecuda::Unlock(s);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t* m) {
  if (m == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (m->version != TESSERA_NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  nvmlMemory_t v1;
  const nvmlReturn_t r = nvmlDeviceGetMemoryInfo(d, &v1);
  if (r != NVML_SUCCESS) return r;
  m->total = v1.total;
  m->reserved = 0;
  m->used = v1.used;
  m->free = v1.free;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  int i = 0;
  if (!Handle(d, &i) || u == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  fakecuda::State* s = fakecuda::Shared();
  const uint64_t now = fakecuda::NowNs();
  fakecuda::Lock(s);
  const uint64_t busy = fakecuda::BusyNsLocked(s->gpus[i], 0, now - kUtilWindowNs, now);
  fakecuda::Unlock(s);
  static const unsigned extra = [] {
    const char* v = getenv("FAKECUDA_NVML_UTIL_EXTRA");
    return v == nullptr ? 0u : static_cast<unsigned>(strtoul(v, nullptr, 10));
  }();
  const unsigned gpu = static_cast<unsigned>(busy * 100 / kUtilWindowNs) + extra;
  u->gpu = gpu > 100 ? 100 : gpu;
  u->memory = 0;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t* samples,
                                                         unsigned int* count, unsigned long long) {
  int i = 0;
  if (!Handle(d, &i) || count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  fakecuda::State* s = fakecuda::Shared();
  const uint64_t now = fakecuda::NowNs();
  uint32_t pids[64];
  unsigned n = 0;
  fakecuda::Lock(s);
  const fakecuda::Gpu& g = s->gpus[i];
  for (uint32_t k = 0; k < g.ring_count && n < 64; ++k) {
    const fakecuda::Kernel& kern = g.ring[(g.ring_head + fakecuda::kRing - 1 - k) % fakecuda::kRing];
    if (kern.end_ns < now - kUtilWindowNs) break;
    bool seen = false;
    for (unsigned j = 0; j < n; ++j) seen = seen || pids[j] == kern.pid;
    if (!seen) pids[n++] = kern.pid;
  }
  if (samples == nullptr || *count < n) {
    fakecuda::Unlock(s);
    *count = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (unsigned j = 0; j < n; ++j) {
    samples[j] = nvmlProcessUtilizationSample_t{};
    samples[j].pid = pids[j];
    samples[j].timeStamp = now / 1000;
    samples[j].smUtil =
        static_cast<unsigned>(fakecuda::BusyNsLocked(g, pids[j], now - kUtilWindowNs, now) * 100 / kUtilWindowNs);
  }
  fakecuda::Unlock(s);
  *count = n;
  return NVML_SUCCESS;
}

// The processes holding memory on a GPU, with what the driver holds for each (NVML's contract: on
// NVML_ERROR_INSUFFICIENT_SIZE, *count is the number needed; a null `infos` with *count 0 asks for it).
namespace {
template <typename Info>
nvmlReturn_t RunningProcesses(nvmlDevice_t d, unsigned int* count, Info* infos) {
  int i = 0;
  if (!Handle(d, &i) || count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  fakecuda::State* s = fakecuda::Shared();
  fakecuda::Lock(s);
  fakecuda::ReapDeadLocked(s);
  unsigned n = 0;
  for (const fakecuda::Proc& p : s->procs) {
    if (p.pid != 0 && p.used_bytes[i] > 0) ++n;
  }
  if (infos == nullptr || *count < n) {
    fakecuda::Unlock(s);
    const bool asked = infos == nullptr && *count == 0;
    *count = n;
    return asked && n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
  }
  unsigned k = 0;
  for (const fakecuda::Proc& p : s->procs) {
    if (p.pid == 0 || p.used_bytes[i] == 0) continue;
    Info info{};
    info.pid = p.pid;
    info.usedGpuMemory = p.used_bytes[i];
    infos[k++] = info;
  }
  fakecuda::Unlock(s);
  *count = k;
  // The figures are as of the moment they were taken; FAKECUDA_SLOW_NVML_MS (fault injection) returns them
  // that much later, as a busy NVML does.
  fakecuda::SleepAsConfigured("FAKECUDA_SLOW_NVML_MS");
  return NVML_SUCCESS;
}
}  // namespace

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int* count,
                                                              nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(d, count, infos);
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int* count,
                                                                 nvmlProcessInfo_t* infos) {
  const nvmlReturn_t r = RunningProcesses(d, count, infos);
  for (unsigned k = 0; r == NVML_SUCCESS && infos != nullptr && k < *count; ++k) {
    infos[k].gpuInstanceId = 0xFFFFFFFFu;
    infos[k].computeInstanceId = 0xFFFFFFFFu;
  }
  return r;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int* count,
                                                                 nvmlProcessInfo_t* infos) {
  return nvmlDeviceGetComputeRunningProcesses_v2(d, count, infos);
}
// No graphics or MPS clients on the fake GPU.
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int* count,
                                                                  nvmlProcessInfo_t*) {
  int i = 0;
  if (!Handle(d, &i) || count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = 0;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int* count,
                                                                    nvmlProcessInfo_t* infos) {
  return nvmlDeviceGetGraphicsRunningProcesses_v3(d, count, infos);
}
// What interception libraries and device plugins ask at start.
namespace {
struct PciInfo {  // nvmlPciInfo_t
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
}  // namespace
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, PciInfo* pci) {
  int i = 0;
  if (!Handle(d, &i) || pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *pci = PciInfo{};
  pci->bus = static_cast<unsigned>(0x10 + i);
  pci->pciDeviceId = 0x233010DEu;  // an H100's device and vendor ids
  snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
  snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int* minor) {
  int i = 0;
  if (!Handle(d, &i) || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *minor = static_cast<unsigned>(i);
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int* major, int* minor) {
  int i = 0;
  if (!Handle(d, &i) || major == nullptr || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *major = 9;
  *minor = 0;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int* mode) {
  int i = 0;
  if (!Handle(d, &i) || mode == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *mode = 0;  // NVML_COMPUTEMODE_DEFAULT
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int*, unsigned int*) {
  int i = 0;
  return Handle(d, &i) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
FAKE_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int len) {
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(version, len, "580.00.fake");
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) {
  if (v == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *v = 13000;
  return NVML_SUCCESS;
}
FAKE_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* v) {
  return nvmlSystemGetCudaDriverVersion_v2(v);
}

// --- For tests and benchmarks: the simulated timeline and memory, exactly -----------------------------------------

// GPU time (ns) that process `pid` (0: all) kept GPU `gpu` busy in [from_ns, to_ns) of CLOCK_MONOTONIC.
FAKE_EXPORT unsigned long long fakecudaBusyNs(unsigned gpu, unsigned pid, unsigned long long from_ns,
                                              unsigned long long to_ns) {
  fakecuda::State* s = fakecuda::Shared();
  if (gpu >= s->gpu_count) return 0;
  fakecuda::Lock(s);
  const uint64_t busy = fakecuda::BusyNsLocked(s->gpus[gpu], pid, from_ns, to_ns);
  fakecuda::Unlock(s);
  return busy;
}
// Device memory in use on GPU `gpu` now, and the most it has been since the state was created.
FAKE_EXPORT unsigned long long fakecudaUsedBytes(unsigned gpu) {
  fakecuda::State* s = fakecuda::Shared();
  fakecuda::Lock(s);
  fakecuda::ReapDeadLocked(s);
  const uint64_t used = gpu < s->gpu_count ? s->gpus[gpu].used_bytes : 0;
  fakecuda::Unlock(s);
  return used;
}
FAKE_EXPORT unsigned long long fakecudaPeakBytes(unsigned gpu) {
  fakecuda::State* s = fakecuda::Shared();
  return gpu < s->gpu_count ? s->gpus[gpu].peak_bytes : 0;
}
