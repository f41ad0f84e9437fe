#include "gpu/fake_gpu_file.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "common/files.h"
#include "core/gpu_mask.h"
#include "core/strings.h"
#include "formats/gpu_topology.h"
#include "formats/yaml_fields.h"

namespace tessera::gpu {

namespace {

using formats::Bool;
using formats::CheckKeys;
using formats::Fail;
using formats::FileError;
using formats::GpuInventory;
using formats::Int;
using formats::InventoryGpu;
using formats::Str;

std::string CpuList(const YAML::Node& n, std::string_view field) {
  std::string text = Str(n, field);
  absl::StatusOr<std::vector<int>> cpus = core::ParseCpuList(text);
  if (!cpus.ok()) Fail(n, StrCat(field, ": ", cpus.status().message()));
  return text;
}

std::string DefaultUuid(std::string_view node, int index) {
  return node.empty() ? StrCat("GPU-fake-", index) : StrCat("GPU-", node, "-", index);
}

InventoryGpu ParseGpu(const YAML::Node& n, int index, std::string_view node) {
  CheckKeys(n, {"uuid", "model", "memoryMiB", "numa", "pciBusId", "cpus", "healthy", "healthReason"},
            "a GPU");
  InventoryGpu g;
  g.info.index = index;
  g.info.uuid = core::GpuUuid(n["uuid"] ? Str(n["uuid"], "uuid") : DefaultUuid(node, index));
  if (g.info.uuid.empty()) Fail(n["uuid"], "uuid must not be empty");
  if (!n["model"]) Fail(n, "a GPU needs a model (e.g. model: A100-SXM4-80GB)");
  g.info.model = Str(n["model"], "model");
  if (!n["memoryMiB"]) Fail(n, "a GPU needs memoryMiB (e.g. memoryMiB: 81920)");
  g.info.memory = core::MiB(Int(n["memoryMiB"], "memoryMiB", 1, int64_t{1} << 40));
  if (n["numa"]) g.info.numa_node = static_cast<int>(Int(n["numa"], "numa", -1, 1023));
  if (n["pciBusId"]) g.pci_bus_id = NormalizePciBusId(Str(n["pciBusId"], "pciBusId"));
  if (n["cpus"]) g.cpus = CpuList(n["cpus"], "cpus");
  if (n["healthy"] && !Bool(n["healthy"], "healthy")) {
    g.info.health = core::GpuHealth::kUnhealthy;
    g.health_reason = "marked unhealthy in the fake-GPU file";
  }
  if (n["healthReason"]) {
    if (g.info.health == core::GpuHealth::kHealthy)
      Fail(n["healthReason"], "healthReason needs healthy: false");
    g.health_reason = Str(n["healthReason"], "healthReason");
  }
  return g;
}

GpuInventory ParseDocument(const YAML::Node& doc, std::string_view node) {
  if (!doc || doc.IsNull()) Fail(doc, "the file is empty; expected a mapping with a list of gpus");
  CheckKeys(doc, {"apiVersion", "kind", "driverVersion", "gpus", "topology", "links"}, "a fake-GPU file");
  if (doc["kind"] && Str(doc["kind"], "kind") != "FakeGpus") {
    Fail(doc["kind"],
         StrCat("kind is ", doc["kind"].as<std::string>(), "; a fake-GPU file has kind: FakeGpus"));
  }
  GpuInventory inv;
  if (doc["driverVersion"]) inv.driver_version = Str(doc["driverVersion"], "driverVersion");
  const YAML::Node& gpus = doc["gpus"];
  if (!gpus) Fail(doc, "a fake-GPU file needs gpus: a list of GPUs, or {model, count, memoryMiB}");
  if (gpus.IsMap()) {
    CheckKeys(gpus, {"model", "count", "memoryMiB", "numa"}, "gpus (shorthand)");
    if (!gpus["model"] || !gpus["count"] || !gpus["memoryMiB"]) {
      Fail(gpus, "the gpus shorthand needs model, count and memoryMiB (or give a list of GPUs)");
    }
    const int count = static_cast<int>(Int(gpus["count"], "count", 0, core::kMaxGpusPerNode));
    for (int i = 0; i < count; ++i) {
      InventoryGpu g;
      g.info.index = i;
      g.info.uuid = core::GpuUuid(DefaultUuid(node, i));
      g.info.model = Str(gpus["model"], "model");
      g.info.memory = core::MiB(Int(gpus["memoryMiB"], "memoryMiB", 1, int64_t{1} << 40));
      if (gpus["numa"]) g.info.numa_node = static_cast<int>(Int(gpus["numa"], "numa", -1, 1023));
      inv.gpus.push_back(std::move(g));
    }
  } else if (gpus.IsSequence()) {
    if (gpus.size() > static_cast<size_t>(core::kMaxGpusPerNode)) {
      Fail(gpus, StrCat("there are ", gpus.size(), " GPUs; a node holds at most ", core::kMaxGpusPerNode));
    }
    int i = 0;
    for (const YAML::Node& g : gpus) inv.gpus.push_back(ParseGpu(g, i++, node));
  } else {
    Fail(gpus, "gpus must be a list of GPUs or {model, count, memoryMiB}");
  }
  std::set<std::string> uuids;
  for (const InventoryGpu& g : inv.gpus) {
    if (!uuids.insert(g.info.uuid.value()).second) {
      Fail(gpus, StrCat("GPU UUID ", g.info.uuid.value(), " appears twice; every GPU needs its own"));
    }
  }
  const int count = static_cast<int>(inv.gpus.size());
  if (std::optional<formats::GpuTopology> topo = formats::ReadGpuTopology(doc, count, "the file lists")) {
    inv.links = std::move(topo->links);
    for (size_t i = 0; i < topo->numa_node.size(); ++i) {
      InventoryGpu& g = inv.gpus[i];
      if (g.info.numa_node < 0) g.info.numa_node = topo->numa_node[i];
      if (g.cpus.empty()) g.cpus = topo->cpu_affinity[i];
    }
  } else {
    inv.links = core::LinkMatrix(count);  // no topology given: every pair SYS, the safe assumption
  }
  return inv;
}

}  // namespace

absl::StatusOr<GpuInventory> ParseFakeGpuFile(std::string_view text, std::string_view source,
                                              std::string_view node_name) {
  try {
    GpuInventory inv = ParseDocument(formats::LoadBounded(text), node_name);
    inv.source = StrCat("fake:", source);
    return inv;
  } catch (const FileError& e) {
    return absl::InvalidArgumentError(
        StrCat(source, e.line > 0 ? StrCat(" line ", e.line) : "", ": ", e.message));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, " line ", e.mark.line + 1, ": ", e.msg));
  }
}

absl::StatusOr<std::unique_ptr<FakeGpuSource>> FakeGpuSource::Open(const std::string& path,
                                                                   const std::string& node_name) {
  std::unique_ptr<FakeGpuSource> src(new FakeGpuSource(path, node_name));
  absl::StatusOr<GpuInventory> first = src->ReadFile(&src->last_content_);
  if (!first.ok()) return first.status();
  src->inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (src->inotify_fd_ >= 0) {
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    // The directory, not the file: editors and ConfigMap updates replace the file by a rename.
    if (inotify_add_watch(src->inotify_fd_, dir.c_str(),
                          IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MODIFY) < 0) {
      close(src->inotify_fd_);
      src->inotify_fd_ = -1;  // fall back to the content check at every wait
    }
  }
  return src;
}

FakeGpuSource::~FakeGpuSource() {
  if (inotify_fd_ >= 0) close(inotify_fd_);
}

absl::StatusOr<GpuInventory> FakeGpuSource::ReadFile(std::string* content) const {
  // Capped: --fake-gpus /dev/zero used to read until bad_alloc.
  absl::StatusOr<std::string> text = ReadTextFile(path_, kMaxFakeGpuFileBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        StrCat("cannot read the fake-GPU file ", text.status().message(),
                               "; check the path given to --fake-gpus"));
  }
  *content = *std::move(text);
  return ParseFakeGpuFile(*content, path_, node_);
}

absl::StatusOr<GpuInventory> FakeGpuSource::Read() {
  std::string content;
  return ReadFile(&content);
}

absl::StatusOr<std::vector<HealthUpdate>> FakeGpuSource::WaitForHealthEvents(
    std::chrono::milliseconds timeout) {
  if (inotify_fd_ >= 0) {
    pollfd p{inotify_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) > 0) {
      alignas(inotify_event) char buf[4096];
      while (read(inotify_fd_, buf, sizeof(buf)) > 0) {
      }
    }
  } else {
    usleep(static_cast<useconds_t>(std::chrono::duration_cast<std::chrono::microseconds>(timeout).count()));
  }
  std::string content;
  absl::StatusOr<GpuInventory> inv = ReadFile(&content);
  if (content == last_content_) return std::vector<HealthUpdate>{};
  last_content_ = content;  // a malformed version is reported once, not at every wait
  if (!inv.ok()) {
    return absl::Status(inv.status().code(),
                        StrCat(inv.status().message(), " (keeping the GPUs' last known health)"));
  }
  std::vector<HealthUpdate> out;
  for (const formats::InventoryGpu& g : inv->gpus)
    out.push_back({g.info.uuid, g.info.health, g.health_reason});
  return out;
}

}  // namespace tessera::gpu
