#include "formats/inventory.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/status/status.h"
#include "core/gpu_mask.h"
#include "core/strings.h"
#include "formats/bounded_json.h"

namespace tessera::formats {

namespace {

using nlohmann::json;

constexpr char kPrefix[] = "tessera.dev/gpu-inventory: ";
constexpr char kHint[] =
    " (the annotation is written by tessera-node; check that node's agent version and logs, or delete the "
    "annotation and let the agent rewrite it)";

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(StrCat(kPrefix, what, kHint));
}

const char* HealthName(core::GpuHealth h) {
  return h == core::GpuHealth::kHealthy ? "Healthy" : "Unhealthy";
}

// Reads an integer field; `what` names it in errors.
absl::Status ReadInt(const json& obj, const char* key, std::string_view what, int64_t min, int64_t max,
                     bool required, int64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return Invalid(StrCat(what, " has no \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return Invalid(StrCat(what, " \"", key, "\" must be a whole number, not ", it->dump()));
  }
  const std::optional<int64_t> v = JsonIntIn(*it, min, max);
  if (!v) return Invalid(StrCat(what, " \"", key, "\" is ", it->dump(), "; expected ", min, " to ", max));
  *out = *v;
  return absl::OkStatus();
}

absl::Status ReadString(const json& obj, const char* key, std::string_view what, bool required,
                        std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return Invalid(StrCat(what, " has no \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_string()) return Invalid(StrCat(what, " \"", key, "\" must be a string, not ", it->dump()));
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<InventoryGpu> ParseGpu(const json& g, size_t position) {
  const std::string what = StrCat("gpus[", position, "]");
  if (!g.is_object()) return Invalid(StrCat(what, " must be an object, not ", g.dump()));
  InventoryGpu gpu;
  int64_t index = 0;
  absl::Status s = ReadInt(g, "index", what, 0, core::kMaxGpusPerNode - 1, true, &index);
  if (!s.ok()) return s;
  gpu.info.index = static_cast<int>(index);
  std::string uuid;
  if (s = ReadString(g, "uuid", what, true, &uuid); !s.ok()) return s;
  if (uuid.empty()) return Invalid(StrCat(what, " has an empty \"uuid\""));
  gpu.info.uuid = core::GpuUuid(uuid);
  if (s = ReadString(g, "model", what, true, &gpu.info.model); !s.ok()) return s;
  if (gpu.info.model.empty()) return Invalid(StrCat(what, " has an empty \"model\""));
  int64_t memory = 0;
  if (s = ReadInt(g, "memoryMiB", what, 1, int64_t{1} << 40, true, &memory); !s.ok()) return s;
  gpu.info.memory = core::MiB(memory);
  int64_t numa = -1;
  if (s = ReadInt(g, "numa", what, -1, 1023, false, &numa); !s.ok()) return s;
  gpu.info.numa_node = static_cast<int>(numa);
  std::string health;
  if (s = ReadString(g, "health", what, true, &health); !s.ok()) return s;
  if (health == "Healthy") {
    gpu.info.health = core::GpuHealth::kHealthy;
  } else if (health == "Unhealthy") {
    gpu.info.health = core::GpuHealth::kUnhealthy;
  } else {
    return Invalid(StrCat(what, " \"health\" is \"", health, "\"; expected \"Healthy\" or \"Unhealthy\""));
  }
  if (s = ReadString(g, "healthReason", what, false, &gpu.health_reason); !s.ok()) return s;
  if (s = ReadString(g, "pciBusId", what, false, &gpu.pci_bus_id); !s.ok()) return s;
  if (s = ReadString(g, "cpus", what, false, &gpu.cpus); !s.ok()) return s;
  return gpu;
}

}  // namespace

std::map<int, std::string> GpuInventory::NumaCpus() const {
  std::map<int, std::string> out;
  for (const InventoryGpu& g : gpus) {
    if (g.info.numa_node >= 0 && !g.cpus.empty()) out.emplace(g.info.numa_node, g.cpus);
  }
  return out;
}

void GpuInventory::ApplyTo(core::NodeInfo* node) const {
  node->gpus.clear();
  for (const InventoryGpu& g : gpus) node->gpus.push_back(g.info);
  node->links = links;
  node->numa_cpus = NumaCpus();
}

absl::Status GpuInventory::Validate() const {
  if (gpus.size() > static_cast<size_t>(core::kMaxGpusPerNode)) {
    return Invalid(StrCat(gpus.size(), " GPUs; a node holds at most ", core::kMaxGpusPerNode));
  }
  std::set<std::string> uuids;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const core::GpuInfo& g = gpus[i].info;
    if (g.index != static_cast<int>(i)) {
      return Invalid(StrCat("gpus[", i, "] has index ", g.index, "; GPUs must be listed in index order 0..",
                            gpus.size() - 1));
    }
    if (!uuids.insert(g.uuid.value()).second) {
      return Invalid(StrCat("GPU UUID ", g.uuid.value(), " appears twice"));
    }
    if (g.memory.value() <= 0) return Invalid(StrCat("gpus[", i, "] has no memory"));
    if (!gpus[i].cpus.empty()) {
      absl::StatusOr<std::vector<int>> cpus = core::ParseCpuList(gpus[i].cpus);
      if (!cpus.ok()) return Invalid(StrCat("gpus[", i, "] \"cpus\": ", cpus.status().message()));
    }
  }
  if (links.size() != static_cast<int>(gpus.size())) {
    return Invalid(StrCat("the link matrix is ", links.size(), "x", links.size(), " but there are ",
                          gpus.size(), " GPUs; it must have one row and one column per GPU"));
  }
  return absl::OkStatus();
}

std::string SerializeGpuInventory(const GpuInventory& inventory) {
  json gpus = json::array();
  for (const InventoryGpu& g : inventory.gpus) {
    json o = json::object();
    o["index"] = g.info.index;
    o["uuid"] = g.info.uuid.value();
    o["model"] = g.info.model;
    o["memoryMiB"] = g.info.memory.value();
    o["numa"] = g.info.numa_node;
    o["health"] = HealthName(g.info.health);
    if (!g.health_reason.empty()) o["healthReason"] = g.health_reason;
    if (!g.pci_bus_id.empty()) o["pciBusId"] = g.pci_bus_id;
    if (!g.cpus.empty()) o["cpus"] = g.cpus;
    gpus.push_back(std::move(o));
  }
  json doc = json::object();
  doc["version"] = kGpuInventoryVersion;
  if (!inventory.source.empty()) doc["source"] = inventory.source;
  if (!inventory.driver_version.empty()) doc["driverVersion"] = inventory.driver_version;
  doc["gpus"] = std::move(gpus);
  doc["links"] = inventory.links.ToRows();
  return doc.dump();
}

absl::StatusOr<GpuInventory> ParseGpuInventory(std::string_view text) {
  absl::StatusOr<json> parsed = ParseBoundedJson(text, "the value");
  if (!parsed.ok()) return Invalid(Message(parsed.status()));
  const json doc = *std::move(parsed);
  if (!doc.is_object()) return Invalid(StrCat("expected a JSON object, got ", doc.type_name()));
  int64_t version = 0;
  absl::Status s = ReadInt(doc, "version", "the inventory", 0, 1 << 30, true, &version);
  if (!s.ok()) return s;
  if (version != kGpuInventoryVersion) {
    return absl::InvalidArgumentError(
        StrCat(kPrefix, "version ", version, " is not supported: this build reads version ",
               kGpuInventoryVersion, "; run tessera-scheduler and tessera-node of the same release"));
  }
  GpuInventory inv;
  if (s = ReadString(doc, "source", "the inventory", false, &inv.source); !s.ok()) return s;
  if (s = ReadString(doc, "driverVersion", "the inventory", false, &inv.driver_version); !s.ok()) return s;
  auto gpus = doc.find("gpus");
  if (gpus == doc.end() || !gpus->is_array()) return Invalid("\"gpus\" must be a list of GPUs");
  for (size_t i = 0; i < gpus->size(); ++i) {
    absl::StatusOr<InventoryGpu> g = ParseGpu((*gpus)[i], i);
    if (!g.ok()) return g.status();
    inv.gpus.push_back(*std::move(g));
  }
  auto links = doc.find("links");
  if (links == doc.end() || !links->is_array()) {
    return Invalid("\"links\" must be the link-level matrix, a list of rows such as [\"X\", \"NV12\"]");
  }
  std::vector<std::vector<std::string>> rows;
  for (size_t r = 0; r < links->size(); ++r) {
    const json& row = (*links)[r];
    if (!row.is_array()) return Invalid(StrCat("links row ", r, " must be a list of link levels"));
    std::vector<std::string> cells;
    for (const json& cell : row) {
      if (!cell.is_string())
        return Invalid(StrCat("links row ", r, " holds ", cell.dump(), ", not a link level"));
      cells.push_back(cell.get<std::string>());
    }
    rows.push_back(std::move(cells));
  }
  if (rows.size() != inv.gpus.size()) {
    return Invalid(StrCat("the link matrix has ", rows.size(), " rows but there are ", inv.gpus.size(),
                          " GPUs; it must have one row and one column per GPU"));
  }
  absl::StatusOr<core::LinkMatrix> m = core::LinkMatrix::FromRows(rows);
  if (!m.ok()) return Invalid(Message(m.status()));
  inv.links = *std::move(m);
  if (s = inv.Validate(); !s.ok()) return s;
  return inv;
}

std::string FormatHeartbeat(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(t);
  const auto day = floor<days>(ms);
  const year_month_day ymd(day);
  const hh_mm_ss<milliseconds> tod(ms - day);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                static_cast<int>(tod.hours().count()), static_cast<int>(tod.minutes().count()),
                static_cast<int>(tod.seconds().count()), static_cast<int>(tod.subseconds().count()));
  return buf;
}

absl::StatusOr<std::chrono::system_clock::time_point> ParseHeartbeat(std::string_view text) {
  using namespace std::chrono;
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("tessera.dev/heartbeat \"", text, "\" is not an RFC 3339 time (",
                                             why, "); expected e.g. 2026-11-22T08:14:03.120Z"));
  };
  auto digits = [&](size_t pos, size_t n, int* out) {
    if (pos + n > text.size()) return false;
    int v = 0;
    for (size_t i = pos; i < pos + n; ++i) {
      if (text[i] < '0' || text[i] > '9') return false;
      v = v * 10 + (text[i] - '0');
    }
    *out = v;
    return true;
  };
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  if (text.size() < 20 || !digits(0, 4, &y) || text[4] != '-' || !digits(5, 2, &mo) || text[7] != '-' ||
      !digits(8, 2, &d) || (text[10] != 'T' && text[10] != 't') || !digits(11, 2, &h) || text[13] != ':' ||
      !digits(14, 2, &mi) || text[16] != ':' || !digits(17, 2, &s)) {
    return bad("expected YYYY-MM-DDTHH:MM:SS");
  }
  const year_month_day ymd{year(y), month(static_cast<unsigned>(mo)), day(static_cast<unsigned>(d))};
  if (!ymd.ok() || h > 23 || mi > 59 || s > 60) return bad("the date or time is out of range");
  // Nanoseconds since 1970 in 64 bits reach 1677-2262; outside that the arithmetic below would overflow.
  if (y < 1970 || y > 2200) return bad("the year is outside 1970-2200");
  size_t pos = 19;
  nanoseconds frac{0};
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int64_t v = 0;
    int n = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      if (n < 9) {
        v = v * 10 + (text[pos] - '0');
        ++n;
      }
      ++pos;
    }
    if (n == 0) return bad("no digits after the decimal point");
    for (int i = n; i < 9; ++i) v *= 10;
    frac = nanoseconds(v);
  }
  minutes offset{0};
  if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    ++pos;
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    int oh = 0, om = 0;
    if (!digits(pos + 1, 2, &oh) || pos + 3 >= text.size() || text[pos + 3] != ':' ||
        !digits(pos + 4, 2, &om) || oh > 23 || om > 59) {
      return bad("a malformed UTC offset");
    }
    offset = hours(oh) + minutes(om);
    if (text[pos] == '-') offset = -offset;
    pos += 6;
  } else {
    return bad("no time zone: end with Z or an offset such as +02:00");
  }
  if (pos != text.size()) return bad("unexpected text after the time zone");
  const sys_time<nanoseconds> t = sys_days(ymd) + hours(h) + minutes(mi) + seconds(s) + frac - offset;
  return time_point_cast<system_clock::duration>(t);
}

}  // namespace tessera::formats
