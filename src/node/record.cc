#include "node/record.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "common/files.h"
#include "core/strings.h"
#include "formats/bounded_json.h"
#include "formats/vgpu_json.h"

namespace tessera::node {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A record is a few hundred bytes; anything far larger in the records directory is not one.
constexpr size_t kMaxRecordBytes = size_t{1} << 20;

// A field's value that is not what the format allows (thrown like json's own errors, caught with them).
struct BadValue : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An integer, exactly: a whole number within T's range (formats::JsonIntIn). json's get<T> casts silently:
// 4294967297 read as a uint32_t was 1, and 1.5 was 1.
template <typename T>
T Integer(const json& v) {
  constexpr int64_t lo = std::is_signed_v<T> ? static_cast<int64_t>(std::numeric_limits<T>::min()) : 0;
  constexpr int64_t hi = sizeof(T) < sizeof(int64_t) ? static_cast<int64_t>(std::numeric_limits<T>::max())
                                                     : std::numeric_limits<int64_t>::max();
  const std::optional<int64_t> i = formats::JsonIntIn(v, lo, hi);
  if (!i) throw BadValue(v.is_number_integer() ? "is out of range" : "must be a whole number");
  return static_cast<T>(*i);
}

// Field `key` of `from`: required, or `fallback` when absent. Of the wrong type or out of range it throws,
// with `*field` naming it.
template <typename T>
T Get(const json& from, const char* key, std::string* field, std::optional<T> fallback = std::nullopt) {
  *field = key;
  if (fallback && !from.contains(key)) return *fallback;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return Integer<T>(from.at(key));
  } else {
    return from.at(key).get<T>();
  }
}

}  // namespace

std::string RecordFileName(const ContainerRecord& r) {
  return StrCat(r.pod_uid, "_", r.container, ".json");
}

std::string SerializeRecord(const ContainerRecord& r) {
  json vgpus = json::array();
  for (const core::VGpuAssignment& v : r.vgpus)
    vgpus.push_back(formats::VGpuJson(v, formats::VGpuFormat::kRecord));
  json j = {{"version", 1},
                  {"podUID", r.pod_uid},
                  {"namespace", r.ns},
                  {"pod", r.pod_name},
                  {"container", r.container},
                  {"vgpus", vgpus},
                  {"gpuTenants", r.gpu_tenants},
                  {"numaNode", r.numa_node},
                  {"cpus", r.cpus},
                  {"deviceIDs", r.device_ids},
                  {"generation", r.generation},
                  {"dir", r.dir},
                  {"regionDir", r.region_dir},
                  {"computePolicy", core::ToString(r.compute_policy)},
                  {"priority", core::ToString(r.priority)},
                  {"allocatedAt", r.allocated_at},
                  {"reported", r.reported},
                  {"confirmed", r.confirmed}};
  if (r.claim) {
    j["claim"] = {{"uid", r.claim->uid},
                  {"namespace", r.claim->ns},
                  {"name", r.claim->name},
                  {"consumers", r.claim->consumers}};
  }
  return formats::DumpJson(j);
}

absl::StatusOr<ContainerRecord> ParseRecord(std::string_view text) {
  absl::StatusOr<json> parsed = formats::ParseBoundedJson(text, "the record");
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  if (!j.is_object()) return absl::InvalidArgumentError("a record is a JSON object");
  std::string field;  // the one being read, for the error
  try {
    if (Get<int>(j, "version", &field) != 1) return absl::InvalidArgumentError("unknown record version");
    ContainerRecord r;
    r.pod_uid = Get<std::string>(j, "podUID", &field);
    r.ns = Get<std::string>(j, "namespace", &field);
    r.pod_name = Get<std::string>(j, "pod", &field);
    r.container = Get<std::string>(j, "container", &field);
    field = "vgpus";
    for (const json& v : j.at("vgpus")) {
      core::VGpuAssignment a;
      a.uuid = core::GpuUuid(Get<std::string>(v, formats::kVGpuUuid, &field));
      a.gpu_index = Get<int>(v, formats::kVGpuIndex, &field);
      a.cores = core::MilliGpu(Get<int32_t>(v, formats::kVGpuMilliCores, &field));
      a.memory = core::MiB(Get<int64_t>(v, formats::kVGpuMemoryMiB, &field));
      a.requested = core::MilliGpu(Get<int32_t>(v, formats::kVGpuRequestedMilliCores, &field, 0));
      r.vgpus.push_back(a);
    }
    field = "gpuTenants";
    if (j.contains("gpuTenants")) {
      if (!j["gpuTenants"].is_array()) throw BadValue("must be an array");
      for (const json& n : j["gpuTenants"]) r.gpu_tenants.push_back(Integer<uint32_t>(n));
    }
    if (!r.gpu_tenants.empty() && r.gpu_tenants.size() != r.vgpus.size()) {
      return absl::InvalidArgumentError(StrCat("gpuTenants has ", r.gpu_tenants.size(), " entries for ",
                                               r.vgpus.size(), " vgpus; give one per vGPU or none"));
    }
    for (uint32_t n : r.gpu_tenants) {
      if (n < 1 || n > hook::kMaxTenants)
        return absl::InvalidArgumentError(StrCat("gpuTenants holds ", n, "; each must be 1..", hook::kMaxTenants));
    }
    r.numa_node = Get<int>(j, "numaNode", &field, -1);
    r.cpus = Get<std::string>(j, "cpus", &field, "");
    r.device_ids = Get<std::vector<std::string>>(j, "deviceIDs", &field);
    r.generation = Get<uint64_t>(j, "generation", &field);
    r.dir = Get<std::string>(j, "dir", &field);
    r.region_dir = Get<std::string>(j, "regionDir", &field);
    const std::string policy = Get<std::string>(j, "computePolicy", &field, "hard");
    const std::optional<core::ComputePolicy> p = core::ComputePolicyFromString(policy);
    if (!p)
      return absl::InvalidArgumentError(
          StrCat("computePolicy is \"", policy, "\"; it must be hard or elastic"));
    r.compute_policy = *p;
    const std::string priority = Get<std::string>(j, "priority", &field, "low");
    const std::optional<core::Priority> q = core::PriorityFromString(priority);
    if (!q)
      return absl::InvalidArgumentError(StrCat("priority is \"", priority, "\"; it must be low or high"));
    r.priority = *q;
    r.allocated_at = Get<std::string>(j, "allocatedAt", &field, "");
    r.reported = Get<bool>(j, "reported", &field, false);
    r.confirmed = Get<bool>(j, "confirmed", &field, false);
    if (j.contains("claim")) {
      field = "claim";
      const json& c = j.at("claim");
      if (!c.is_object()) throw BadValue("must be an object");
      ContainerRecord::Claim claim;
      claim.uid = Get<std::string>(c, "uid", &field);
      claim.ns = Get<std::string>(c, "namespace", &field);
      claim.name = Get<std::string>(c, "name", &field);
      claim.consumers = Get<std::vector<std::string>>(c, "consumers", &field);
      if (!SafePathName(claim.uid)) return absl::InvalidArgumentError("claim.uid must be a name of [A-Za-z0-9._-]");
      r.claim = std::move(claim);
    }
    if (!SafePathName(r.pod_uid) || !SafePathName(r.container)) {
      return absl::InvalidArgumentError("podUID and container must be names of [A-Za-z0-9._-]");
    }
    return r;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(StrCat("field ", field, ": ", e.what()));
  } catch (const BadValue& e) {
    return absl::InvalidArgumentError(StrCat("field ", field, " ", e.what()));
  }
}

hook::Limits LimitsFor(const ContainerRecord& r) {
  hook::Limits l;
  l.generation = r.generation;
  hook::CopyString(l.region_path, sizeof(l.region_path), kContainerRegionFile);
  for (size_t i = 0; i < r.vgpus.size(); ++i) {
    const core::VGpuAssignment& v = r.vgpus[i];
    if (l.device_count >= hook::kMaxDevices) break;
    hook::DeviceLimits& d = l.devices[l.device_count++];
    d.tenants = i < r.gpu_tenants.size() ? r.gpu_tenants[i] : 0;
    hook::CopyString(d.uuid, sizeof(d.uuid), v.uuid.value().c_str());
    // The GPU's place in the container's list (NVIDIA_VISIBLE_DEVICES order): how a hook finds it on a device
    // that has no UUID to match (OpenCL without cl_khr_device_uuid).
    d.index = static_cast<int>(i);
    d.memory_bytes = static_cast<uint64_t>(v.memory.value()) << 20;
    // The ledger's thousandths, unrounded (the hook enforces them exactly: SharePpm); `cores=` beside them is
    // for hooks that read percent only, rounded down. The rounding to the nearest whole percent here (at
    // least 1) used to hand out more than the scheduler committed: 8 x 12.5% became 8 x 13%.
    const uint32_t milli = static_cast<uint32_t>(std::clamp<int32_t>(v.cores.value(), 1, 1000));
    d.cores_milli = milli;
    d.cores_percent = hook::PercentForMilli(milli);
    d.policy = r.compute_policy == core::ComputePolicy::kElastic ? hook::ComputePolicy::kElastic
                                                                 : hook::ComputePolicy::kHard;
    d.ceiling_percent = std::max<uint32_t>(hook::kDefaultCeilingPercent, d.cores_percent);
    d.priority = r.priority == core::Priority::kHigh ? hook::Priority::kHigh : hook::Priority::kLow;
  }
  return l;
}

std::string Signature(const std::vector<core::VGpuAssignment>& vgpus, core::ComputePolicy policy,
                      core::Priority priority) {
  std::vector<std::string> parts;
  for (const core::VGpuAssignment& v : vgpus)
    parts.push_back(StrCat(v.requested_or_cores().value(), ":", v.memory.value()));
  std::sort(parts.begin(), parts.end());
  return StrCat(vgpus.size(), "|", StrJoin(parts, ","), "|", core::ToString(policy), "|",
                core::ToString(priority));
}

bool SameGpus(const std::vector<core::VGpuAssignment>& a, const std::vector<core::VGpuAssignment>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].uuid != b[i].uuid) return false;
  }
  return true;
}

bool SameLimits(const std::vector<core::VGpuAssignment>& a, const std::vector<core::VGpuAssignment>& b) {
  if (!SameGpus(a, b)) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].cores != b[i].cores || a[i].memory != b[i].memory) return false;
  }
  return true;
}

bool SafePathName(std::string_view name) {
  if (name.empty() || name.size() > 253 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
  });
}

std::string RecordStore::PathOf(const ContainerRecord& r) const {
  return (fs::path(dir_) / RecordFileName(r)).string();
}

std::string RecordStore::PathOf(std::string_view pod_uid, std::string_view container) const {
  return (fs::path(dir_) / StrCat(pod_uid, "_", container, ".json")).string();
}

absl::Status RecordStore::Save(const ContainerRecord& r) const {
  // Not fsynced, as the limits files: the page cache outlives a crash of the agent, and a crash of the
  // machine takes the containers with it.
  absl::Status s = WriteTextFileAtomically(PathOf(r), SerializeRecord(r) + "\n");
  if (!s.ok()) return absl::InternalError(StrCat(Message(s), "; is ", dir_, " full?"));
  return absl::OkStatus();
}

absl::Status RecordStore::Remove(const std::string& path) const {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) return absl::InternalError(StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

RecordStore::Loaded RecordStore::LoadAll(
    const std::function<absl::Status(const ContainerRecord&)>& check) const {
  Loaded out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json") {
      if (name.find(".tmp.") != std::string::npos) fs::remove(entry.path(), ec);  // a write cut short
      continue;
    }
    absl::StatusOr<std::string> text = ReadTextFile(entry.path().string(), kMaxRecordBytes);
    absl::StatusOr<ContainerRecord> r = text.ok() ? ParseRecord(*text) : text.status();
    if (r.ok() && name != RecordFileName(*r)) {
      r = absl::InvalidArgumentError(StrCat("it names ", r->key(), ", whose record is ", RecordFileName(*r)));
    }
    if (r.ok() && check) {
      if (absl::Status s = check(*r); !s.ok()) r = s;
    }
    if (!r.ok()) {
      out.bad.push_back(StrCat(entry.path().string(), ": ", r.status().message()));
      fs::rename(entry.path(), entry.path().string() + ".bad", ec);
      continue;
    }
    out.records.push_back(std::move(*r));
  }
  return out;
}

}  // namespace tessera::node
