// A minimal fake NVML for the inventory tests: a shared library exporting exactly the NVML symbols that
// src/gpu/nvml_api.h declares (it includes that header, so the signatures cannot drift). It is NOT a general
// NVML emulation; tools/fakecuda's fake libnvidia-ml.so.1 is the project's fuller one.
//
// Configured by the file named in TESSERA_FAKE_NVML_CONFIG, read at nvmlInit_v2, one directive per line:
//   driver <version>
//   gpu <uuid> <memory MiB> <PCI bus id> <cpus|-> <name...>     (in index order)
//   ancestor <i> <j> <nvmlGpuTopologyLevel_t value>                 (unlisted pairs: SYSTEM)
//   nvlink <i> <j> <links>                                          (direct NVLinks between two GPUs)
//   nvswitch <i> <links>                                            (NVLinks from GPU i to an NVSwitch)
//   noevents                                                        (no GPU supports XID events)
//   xids <file>      each new line "<index|all> <xid>" appended to it becomes one XID event
//   lost <file>      GPU indices listed in it answer NVML_ERROR_GPU_IS_LOST to nvmlDeviceGetMemoryInfo
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/nvml_api.h"

struct nvmlDevice_st {
  std::string uuid;
  std::string name;
  unsigned long long memory_mib = 0;
  std::string bus_id;
  std::vector<int> cpus;
  std::vector<std::string> link_remote;  // per NVLink: the remote PCI bus id
};

struct nvmlEventSet_st {
  size_t consumed = 0;  // lines of the xids file already delivered
};

namespace {

struct Config {
  std::string driver = "550.54.15";
  std::vector<nvmlDevice_st> gpus;
  std::vector<std::vector<int>> ancestor;
  bool events = true;
  std::string xids_file;
  std::string lost_file;
};

std::mutex g_mu;
Config* g_config = nullptr;
int g_init_count = 0;

std::vector<int> ParseCpus(const std::string& text) {
  std::vector<int> out;
  if (text == "-") return out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const size_t dash = part.find('-');
    const int a = std::atoi(part.substr(0, dash).c_str());
    const int b = dash == std::string::npos ? a : std::atoi(part.substr(dash + 1).c_str());
    for (int c = a; c <= b; ++c) out.push_back(c);
  }
  return out;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool LoadConfig(Config* c) {
  const char* path = std::getenv("TESSERA_FAKE_NVML_CONFIG");
  if (path == nullptr) return false;
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  std::vector<std::string> switch_bus;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string word;
    if (!(s >> word)) continue;
    if (word == "driver") {
      s >> c->driver;
    } else if (word == "gpu") {
      nvmlDevice_st d;
      std::string cpus;
      s >> d.uuid >> d.memory_mib >> d.bus_id >> cpus;
      d.cpus = ParseCpus(cpus);
      std::getline(s >> std::ws, d.name);
      c->gpus.push_back(std::move(d));
    } else if (word == "ancestor") {
      size_t i = 0, j = 0;
      int level = 0;
      s >> i >> j >> level;
      const size_t n = c->gpus.size();
      if (c->ancestor.size() != n) c->ancestor.assign(n, std::vector<int>(n, NVML_TOPOLOGY_SYSTEM));
      c->ancestor[i][j] = c->ancestor[j][i] = level;
    } else if (word == "nvlink") {
      size_t i = 0, j = 0;
      int links = 0;
      s >> i >> j >> links;
      for (int l = 0; l < links; ++l) {
        c->gpus[i].link_remote.push_back(c->gpus[j].bus_id);
        c->gpus[j].link_remote.push_back(c->gpus[i].bus_id);
      }
    } else if (word == "nvswitch") {
      size_t i = 0;
      int links = 0;
      s >> i >> links;
      for (int l = 0; l < links; ++l) c->gpus[i].link_remote.push_back("00000000:C" + std::to_string(l % 6) + ":00.0");
    } else if (word == "noevents") {
      c->events = false;
    } else if (word == "xids") {
      s >> c->xids_file;
    } else if (word == "lost") {
      s >> c->lost_file;
    }
  }
  const size_t n = c->gpus.size();
  if (c->ancestor.size() != n) c->ancestor.assign(n, std::vector<int>(n, NVML_TOPOLOGY_SYSTEM));
  return true;
}

int IndexOf(nvmlDevice_t d) {
  if (g_config == nullptr) return -1;
  for (size_t i = 0; i < g_config->gpus.size(); ++i) {
    if (&g_config->gpus[i] == d) return static_cast<int>(i);
  }
  return -1;
}

void CopyString(const std::string& s, char* out, unsigned int length) {
  std::strncpy(out, s.c_str(), length);
  if (length > 0) out[length - 1] = '\0';
}

void FillPci(const std::string& bus_id, nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof(*pci));
  CopyString(bus_id, pci->busId, sizeof(pci->busId));
  CopyString(bus_id.size() > 4 ? bus_id.substr(4) : bus_id, pci->busIdLegacy, sizeof(pci->busIdLegacy));
  pci->pciDeviceId = 0x20B010DE;
}

}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_config == nullptr) {
    auto* c = new Config();
    if (!LoadConfig(c)) {
      delete c;
      return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    g_config = c;
  }
  ++g_init_count;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (--g_init_count == 0) {
    delete g_config;
    g_config = nullptr;
  }
  return NVML_SUCCESS;
}

FAKE_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    default:
      return "Unknown Error";
  }
}

FAKE_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_config == nullptr) return NVML_ERROR_UNINITIALIZED;
  CopyString(g_config->driver, version, length);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_config == nullptr) return NVML_ERROR_UNINITIALIZED;
  *count = static_cast<unsigned int>(g_config->gpus.size());
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_config == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (index >= g_config->gpus.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &g_config->gpus[index];
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  CopyString(device->uuid, uuid, length);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  CopyString(device->name, name, length);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int index = IndexOf(device);
  if (index < 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (!g_config->lost_file.empty()) {
    for (const std::string& line : ReadLines(g_config->lost_file)) {
      if (std::atoi(line.c_str()) == index) return NVML_ERROR_GPU_IS_LOST;
    }
  }
  memory->total = device->memory_mib << 20;
  memory->used = 0;
  memory->free = memory->total;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  FillPci(device->bus_id, pci);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                                  unsigned long* cpuSet) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
  constexpr unsigned kBits = 8 * sizeof(unsigned long);
  for (int c : device->cpus) {
    const unsigned word = static_cast<unsigned>(c) / kBits;
    if (word < cpuSetSize) cpuSet[word] |= 1UL << (static_cast<unsigned>(c) % kBits);
  }
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                             nvmlGpuTopologyLevel_t* path) {
  std::lock_guard<std::mutex> lock(g_mu);
  const int i = IndexOf(a), j = IndexOf(b);
  if (i < 0 || j < 0) return NVML_ERROR_INVALID_ARGUMENT;
  *path = static_cast<nvmlGpuTopologyLevel_t>(g_config->ancestor[static_cast<size_t>(i)][static_cast<size_t>(j)]);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                  nvmlEnableState_t* active) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (device->link_remote.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
  *active = link < device->link_remote.size() ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                             nvmlPciInfo_t* pci) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0 || link >= device->link_remote.size()) return NVML_ERROR_INVALID_ARGUMENT;
  FillPci(device->link_remote[link], pci);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  *set = new nvmlEventSet_st();
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long* types) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  *types = g_config->events ? (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError) : 0;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                                  nvmlEventSet_t set) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (IndexOf(device) < 0 || set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!g_config->events || (types & ~(nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError)) != 0) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeoutms) {
  for (int waited = 0;; waited += 5) {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_config == nullptr || set == nullptr) return NVML_ERROR_UNINITIALIZED;
      if (!g_config->xids_file.empty()) {
        std::vector<std::string> lines = ReadLines(g_config->xids_file);
        if (lines.size() > set->consumed) {
          std::istringstream s(lines[set->consumed++]);
          std::string target;
          unsigned long long xid = 0;
          s >> target >> xid;
          std::memset(data, 0, sizeof(*data));
          data->device = target == "all" ? nullptr : &g_config->gpus[static_cast<size_t>(std::atoi(target.c_str()))];
          data->eventType = nvmlEventTypeXidCriticalError;
          data->eventData = xid;
          data->gpuInstanceId = 0xFFFFFFFFu;
          data->computeInstanceId = 0xFFFFFFFFu;
          return NVML_SUCCESS;
        }
      }
    }
    if (static_cast<unsigned>(waited) >= timeoutms) return NVML_ERROR_TIMEOUT;
    usleep(5000);
  }
}

FAKE_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  delete set;
  return NVML_SUCCESS;
}
