#include "gpu/nvml_source.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "common/log.h"
#include "core/gpu_mask.h"
#include "core/strings.h"

namespace tessera::gpu {

namespace {

using formats::GpuInventory;
using formats::InventoryGpu;

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return std::string(StripWhitespace(s.str()));
}

// CPU numbers -> "0-15,32-47".
std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? StrCat(cpus[i]) : StrCat(cpus[i], "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

core::Link FromTopologyLevel(nvmlGpuTopologyLevel_t level) {
  switch (level) {
    case NVML_TOPOLOGY_INTERNAL:
    case NVML_TOPOLOGY_SINGLE:
      return core::Link::Of(core::LinkKind::kPix);
    case NVML_TOPOLOGY_MULTIPLE:
      return core::Link::Of(core::LinkKind::kPxb);
    case NVML_TOPOLOGY_HOSTBRIDGE:
      return core::Link::Of(core::LinkKind::kPhb);
    case NVML_TOPOLOGY_NODE:
      return core::Link::Of(core::LinkKind::kNode);
    case NVML_TOPOLOGY_SYSTEM:
      return core::Link::Of(core::LinkKind::kSys);
  }
  return core::Link::Of(core::LinkKind::kSys);
}

std::string CString(const char* buf, size_t size) {
  return std::string(buf, strnlen(buf, size));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmlGpuSource>> NvmlGpuSource::Open(const GpuSourceOptions& options) {
  absl::StatusOr<std::unique_ptr<NvmlLibrary>> lib = NvmlLibrary::Load(options.nvml_library);
  if (!lib.ok()) return lib.status();
  return std::unique_ptr<NvmlGpuSource>(new NvmlGpuSource(*std::move(lib), options));
}

NvmlGpuSource::~NvmlGpuSource() {
  if (events_ != nullptr && nvml_->api().nvmlEventSetFree != nullptr) nvml_->api().nvmlEventSetFree(events_);
}

absl::StatusOr<GpuInventory> NvmlGpuSource::Read() {
  const NvmlApi& api = nvml_->api();
  MutexLock lock(&mu_);
  auto fail = [&](std::string_view call, nvmlReturn_t r, int index) {
    return absl::UnavailableError(StrCat(call, index >= 0 ? StrCat(" for GPU ", index) : "",
                                         " failed: ", nvml_->ErrorString(r),
                                         "; check the GPU with nvidia-smi on the host"));
  };
  GpuInventory inv;
  inv.source = "nvml";
  if (api.nvmlSystemGetDriverVersion != nullptr) {
    char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
    if (api.nvmlSystemGetDriverVersion(version, sizeof(version)) == NVML_SUCCESS) {
      inv.driver_version = CString(version, sizeof(version));
    }
  }
  unsigned int count = 0;
  if (nvmlReturn_t r = api.nvmlDeviceGetCount_v2(&count); r != NVML_SUCCESS) {
    return fail("nvmlDeviceGetCount_v2", r, -1);
  }
  if (count > static_cast<unsigned>(core::kMaxGpusPerNode)) {
    return absl::OutOfRangeError(
        StrCat("NVML reports ", count, " GPUs; Tessera handles at most ", core::kMaxGpusPerNode, " per node"));
  }
  std::vector<Device> devices(count);
  std::vector<std::string> bus_ids(count);
  for (unsigned i = 0; i < count; ++i) {
    const int gi = static_cast<int>(i);
    Device& d = devices[i];
    if (nvmlReturn_t r = api.nvmlDeviceGetHandleByIndex_v2(i, &d.handle); r != NVML_SUCCESS) {
      return fail("nvmlDeviceGetHandleByIndex_v2", r, gi);
    }
    InventoryGpu g;
    g.info.index = gi;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (nvmlReturn_t r = api.nvmlDeviceGetUUID(d.handle, uuid, sizeof(uuid)); r != NVML_SUCCESS) {
      return fail("nvmlDeviceGetUUID", r, gi);
    }
    d.uuid = core::GpuUuid(CString(uuid, sizeof(uuid)));
    g.info.uuid = d.uuid;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    if (nvmlReturn_t r = api.nvmlDeviceGetName(d.handle, name, sizeof(name)); r != NVML_SUCCESS) {
      return fail("nvmlDeviceGetName", r, gi);
    }
    g.info.model = NormalizeModelName(CString(name, sizeof(name)));
    nvmlMemory_t memory{};
    if (nvmlReturn_t r = api.nvmlDeviceGetMemoryInfo(d.handle, &memory); r != NVML_SUCCESS) {
      return fail("nvmlDeviceGetMemoryInfo", r, gi);
    }
    g.info.memory = core::MiB(static_cast<int64_t>(memory.total >> 20));
    nvmlPciInfo_t pci{};
    if (nvmlReturn_t r = api.nvmlDeviceGetPciInfo_v3(d.handle, &pci); r != NVML_SUCCESS) {
      return fail("nvmlDeviceGetPciInfo_v3", r, gi);
    }
    g.pci_bus_id = NormalizePciBusId(CString(pci.busId, sizeof(pci.busId)));
    bus_ids[i] = g.pci_bus_id;
    const std::string sysfs = StrCat(options_.sysfs_root, "/bus/pci/devices/", g.pci_bus_id, "/");
    int numa = -1;
    if (ParseInt(ReadSmallFile(sysfs + "numa_node"), &numa) && numa >= 0) g.info.numa_node = numa;
    g.cpus = ReadSmallFile(sysfs + "local_cpulist");
    if (!g.cpus.empty() && !core::ParseCpuList(g.cpus).ok()) g.cpus.clear();
    if (g.cpus.empty() && api.nvmlDeviceGetCpuAffinity != nullptr) {
      constexpr unsigned kWords = 64;  // 4096 CPUs
      unsigned long set[kWords] = {};
      if (api.nvmlDeviceGetCpuAffinity(d.handle, kWords, set) == NVML_SUCCESS) {
        std::vector<int> cpus;
        constexpr int kBits = 8 * sizeof(unsigned long);
        for (unsigned w = 0; w < kWords; ++w) {
          for (int b = 0; b < kBits; ++b) {
            if ((set[w] >> b) & 1UL) cpus.push_back(static_cast<int>(w) * kBits + b);
          }
        }
        g.cpus = FormatCpuList(cpus);
      }
    }
    // Health kept across reads (XIDs are sticky).
    for (const Device& old : devices_) {
      if (old.uuid == d.uuid) {
        d.xid_failed = old.xid_failed;
        d.xid_reason = old.xid_reason;
        d.check_failed = old.check_failed;
        d.check_reason = old.check_reason;
      }
    }
    HealthUpdate h = HealthOf(d);
    g.info.health = h.health;
    g.health_reason = h.reason;
    inv.gpus.push_back(std::move(g));
  }

  // Pairwise links: NVLink first, else the common PCIe ancestor.
  const int n = static_cast<int>(count);
  inv.links = core::LinkMatrix(n);
  std::vector<std::vector<int>> nvlinks(count, std::vector<int>(count, 0));
  std::vector<int> switch_links(count, 0);
  if (api.nvmlDeviceGetNvLinkState != nullptr && api.nvmlDeviceGetNvLinkRemotePciInfo_v2 != nullptr) {
    for (unsigned i = 0; i < count; ++i) {
      for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
        nvmlEnableState_t active = NVML_FEATURE_DISABLED;
        nvmlReturn_t r = api.nvmlDeviceGetNvLinkState(devices[i].handle, link, &active);
        if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_INVALID_ARGUMENT) break;  // no (more) links
        if (r != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
        nvmlPciInfo_t remote{};
        if (api.nvmlDeviceGetNvLinkRemotePciInfo_v2(devices[i].handle, link, &remote) != NVML_SUCCESS) continue;
        const std::string peer = NormalizePciBusId(CString(remote.busId, sizeof(remote.busId)));
        auto it = std::find(bus_ids.begin(), bus_ids.end(), peer);
        if (it == bus_ids.end()) {
          ++switch_links[i];  // an NVSwitch (or a device that is not one of our GPUs)
        } else if (static_cast<unsigned>(it - bus_ids.begin()) != i) {
          ++nvlinks[i][static_cast<size_t>(it - bus_ids.begin())];
        }
      }
    }
  }
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      const size_t ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
      int links = std::max(nvlinks[ua][ub], nvlinks[ub][ua]);
      if (links == 0 && switch_links[ua] > 0 && switch_links[ub] > 0) {
        links = std::min(switch_links[ua], switch_links[ub]);
      }
      if (links > 0) {
        inv.links.Set(a, b, core::Link::NvLink(std::min(links, 64)));
        continue;
      }
      nvmlGpuTopologyLevel_t level = NVML_TOPOLOGY_SYSTEM;
      if (api.nvmlDeviceGetTopologyCommonAncestor != nullptr &&
          api.nvmlDeviceGetTopologyCommonAncestor(devices[ua].handle, devices[ub].handle, &level) ==
              NVML_SUCCESS) {
        inv.links.Set(a, b, FromTopologyLevel(level));
      }  // else SYS, the safe assumption
    }
  }
  devices_ = std::move(devices);
  return inv;
}

HealthUpdate NvmlGpuSource::HealthOf(const Device& d) const {
  if (d.xid_failed) return {d.uuid, core::GpuHealth::kUnhealthy, d.xid_reason};
  if (d.check_failed) return {d.uuid, core::GpuHealth::kUnhealthy, d.check_reason};
  return {d.uuid, core::GpuHealth::kHealthy, ""};
}

absl::Status NvmlGpuSource::EnsureEventSet() {
  const NvmlApi& api = nvml_->api();
  if (events_ != nullptr || events_unavailable_ || devices_.empty()) return absl::OkStatus();
  if (api.nvmlEventSetCreate == nullptr || api.nvmlDeviceRegisterEvents == nullptr ||
      api.nvmlEventSetWait_v2 == nullptr || api.nvmlEventSetFree == nullptr) {
    events_unavailable_ = true;
    return absl::UnimplementedError(
        "this NVML has no event API; GPU health comes from periodic checks only (no XID events)");
  }
  nvmlEventSet_t set = nullptr;
  if (nvmlReturn_t r = api.nvmlEventSetCreate(&set); r != NVML_SUCCESS) {
    events_unavailable_ = true;
    return absl::UnavailableError(StrCat("nvmlEventSetCreate failed: ", nvml_->ErrorString(r),
                                         "; GPU health comes from periodic checks only (no XID events)"));
  }
  int registered = 0;
  for (const Device& d : devices_) {
    unsigned long long supported = nvmlEventTypeXidCriticalError;
    if (api.nvmlDeviceGetSupportedEventTypes != nullptr &&
        api.nvmlDeviceGetSupportedEventTypes(d.handle, &supported) != NVML_SUCCESS) {
      supported = 0;
    }
    if ((supported & nvmlEventTypeXidCriticalError) == 0) {
      log::Warn("GPU does not report XID events; its health comes from periodic checks only",
                {{"gpu", d.uuid.value()}});
      continue;
    }
    nvmlReturn_t r = api.nvmlDeviceRegisterEvents(d.handle, nvmlEventTypeXidCriticalError, set);
    if (r != NVML_SUCCESS) {
      log::Warn("cannot register for XID events; health from periodic checks only",
                {{"gpu", d.uuid.value()}, {"error", nvml_->ErrorString(r)}});
      continue;
    }
    ++registered;
  }
  if (registered == 0) {
    api.nvmlEventSetFree(set);
    events_unavailable_ = true;
    return absl::OkStatus();
  }
  events_ = set;
  return absl::OkStatus();
}

std::vector<HealthUpdate> NvmlGpuSource::RunChecks() {
  const NvmlApi& api = nvml_->api();
  MutexLock lock(&mu_);
  std::vector<HealthUpdate> out;
  for (Device& d : devices_) {
    nvmlMemory_t memory{};
    nvmlReturn_t r = api.nvmlDeviceGetMemoryInfo(d.handle, &memory);
    if (r == NVML_SUCCESS || r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_NO_PERMISSION) {
      d.check_failed = false;
      d.check_reason.clear();
    } else {
      d.check_failed = true;
      d.check_reason = StrCat("nvmlDeviceGetMemoryInfo: ", nvml_->ErrorString(r));
    }
    out.push_back(HealthOf(d));
  }
  return out;
}

absl::StatusOr<std::vector<HealthUpdate>> NvmlGpuSource::WaitForHealthEvents(std::chrono::milliseconds timeout) {
  const NvmlApi& api = nvml_->api();
  absl::Status setup;
  nvmlEventSet_t events = nullptr;
  {
    MutexLock lock(&mu_);
    setup = EnsureEventSet();
    events = events_;
  }
  std::vector<HealthUpdate> out;
  absl::Status wait_error;
  if (events != nullptr) {
    nvmlEventData_t data{};
    nvmlReturn_t r = api.nvmlEventSetWait_v2(events, &data, static_cast<unsigned>(timeout.count()));
    if (r == NVML_SUCCESS && (data.eventType & nvmlEventTypeXidCriticalError) != 0) {
      const unsigned long long xid = data.eventData;
      if (options_.ignored_xids.count(xid) == 0) {
        MutexLock lock(&mu_);
        for (Device& d : devices_) {
          if (data.device != nullptr && d.handle != data.device) continue;
          d.xid_failed = true;
          d.xid_reason = StrCat("XID ", xid, data.device == nullptr ? " (not attributable to one GPU)" : "");
          out.push_back(HealthOf(d));
        }
      } else {
        log::Info("ignoring an application XID", {{"xid", StrCat(xid)}});
      }
    } else if (r != NVML_SUCCESS && r != NVML_ERROR_TIMEOUT) {
      wait_error = absl::UnavailableError(StrCat("nvmlEventSetWait_v2 failed: ", nvml_->ErrorString(r)));
      std::this_thread::sleep_for(timeout);  // do not spin on a failing wait
    }
  } else {
    std::this_thread::sleep_for(timeout);
  }
  const auto now = options_.clock->Steady();
  if (now >= next_check_) {
    next_check_ = now + options_.check_interval;
    std::vector<HealthUpdate> checks = RunChecks();
    out.insert(out.end(), checks.begin(), checks.end());
  }
  if (!setup.ok()) log::Warn("GPU health without XID events", {{"reason", Message(setup)}});
  if (!wait_error.ok() && out.empty()) return wait_error;
  return out;
}

}  // namespace tessera::gpu
