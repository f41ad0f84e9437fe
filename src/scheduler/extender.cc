#include "scheduler/extender.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>

#include "common/log.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "formats/bounded_json.h"
#include "nlohmann/json.hpp"
#include "scheduler/extender_args.h"

namespace tessera::scheduler {

namespace {

using nlohmann::json;

// A field as Go's encoding/json finds it: the exact name first, then any case. Null counts as absent.
const json* Field(const json& object, std::string_view name) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(name));
  if (it == object.end()) {
    for (auto f = object.begin(); f != object.end(); ++f) {
      if (EqualsIgnoreCase(f.key(), name)) {
        it = f;
        break;
      }
    }
  }
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

Response BadRequest(std::string_view verb, std::string_view what) {
  return {400, formats::DumpJson(json{{"Error", StrCat(verb, ": ", what)}})};
}

absl::StatusOr<json> ParseBody(std::string_view body) {
  absl::StatusOr<json> parsed = formats::ParseBoundedJson(body, "the request body");
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        StrCat(Message(parsed.status()), "; kube-scheduler sends JSON objects"));
  }
  json doc = *std::move(parsed);
  if (!doc.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  return doc;
}

std::string NodeName(const json& node) {
  const json* metadata = Field(node, "metadata");
  if (metadata == nullptr) return "";
  const json* name = Field(*metadata, "name");
  return name != nullptr && name->is_string() ? name->get<std::string>() : "";
}

// Appends `s` as a JSON string: runs of plain bytes at once, escapes where JSON needs them (bytes from 0x80
// are written as they are: names and reasons come from parsed, valid UTF-8).
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  size_t plain = 0;  // start of the run not yet written
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (c != '"' && c != '\\' && u >= 0x20) continue;
    out->append(s.substr(plain, i - plain));
    plain = i + 1;
    if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out->append(buf);
    } else {
      out->push_back('\\');
      out->push_back(c);
    }
  }
  out->append(s.substr(plain));
  out->push_back('"');
}

// Reasons by node, as a JSON object with the nodes in name order, each once (a node named twice in the
// request: its last reason, as a map keyed by name would keep).
void AppendReasons(std::string* out, std::span<const std::string_view> nodes,
                   std::vector<std::pair<uint32_t, std::string>>& reasons) {
  std::stable_sort(reasons.begin(), reasons.end(),
                   [&](const auto& a, const auto& b) { return nodes[a.first] < nodes[b.first]; });
  out->push_back('{');
  bool first = true;
  for (size_t i = 0; i < reasons.size(); ++i) {
    if (i + 1 < reasons.size() && nodes[reasons[i + 1].first] == nodes[reasons[i].first]) continue;
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(out, nodes[reasons[i].first]);
    out->push_back(':');
    AppendJsonString(out, reasons[i].second);
  }
  out->push_back('}');
}

}  // namespace

absl::Status CheckPodMetadataSize(const json& pod) {
  const json* metadata = Field(pod, "metadata");
  if (metadata == nullptr) return absl::OkStatus();
  for (const char* field : {"annotations", "labels"}) {
    const json* map = Field(*metadata, field);
    if (map == nullptr || !map->is_object()) continue;
    size_t bytes = 0;
    for (auto it = map->begin(); it != map->end(); ++it) {
      bytes += it.key().size() + (it->is_string() ? it->get_ref<const std::string&>().size() : 0);
      if (bytes > kMaxPodMetadataBytes) {
        return absl::InvalidArgumentError(
            StrCat("the pod's metadata.", field, " hold more than ", kMaxPodMetadataBytes >> 10, " KiB (",
                   map->size(), " keys); Kubernetes allows 256 KiB of annotations, so no pod does"));
      }
    }
  }
  return absl::OkStatus();
}

struct Extender::ParsedArgs {
  formats::PodObject pod;
  absl::StatusOr<core::PodRequest> request = absl::UnknownError("unset");
  ExtenderArgsDoc args;
  // The nodes asked about: views into the request body or into `args` (NodeNames), or into `list_names`.
  std::vector<std::string_view> nodes;
  // The NodeList form (nodeCacheCapable: false): the node objects, to echo the fitting ones back.
  bool node_list = false;
  std::vector<std::string> list_names;
  std::map<std::string, json> node_objects;
};

Extender::Extender(ClusterCache& cache, Binder& binder, PodSource* pods, core::ParseOptions parse,
                   ExtenderOptions options)
    : cache_(cache), binder_(binder), pods_(pods), parse_(parse), options_(options) {}

absl::StatusOr<Extender::ParsedArgs> Extender::ParseArgs(std::string_view body) {
  absl::StatusOr<ExtenderArgsDoc> read = ReadExtenderArgs(body);
  if (!read.ok()) return read.status();
  ParsedArgs args;
  args.args = *std::move(read);
  const json* doc = &args.args.doc;
  const json* pod = Field(*doc, "Pod");
  if (pod == nullptr) return absl::InvalidArgumentError("the request has no Pod; send ExtenderArgs");
  if (absl::Status st = CheckPodMetadataSize(*pod); !st.ok()) return st;
  absl::StatusOr<formats::PodObject> parsed = formats::ParsePodObject(*pod);
  if (!parsed.ok()) return parsed.status();
  args.pod = *std::move(parsed);
  args.request = RequestOf(args.pod);
  if (args.args.has_names) {
    args.nodes = std::move(args.args.names);
  } else if (const json* list = Field(*doc, "Nodes")) {
    const json* items = Field(*list, "items");
    if (items != nullptr && !items->is_array())
      return absl::InvalidArgumentError("Nodes.items must be a list");
    if (items != nullptr && items->size() > kMaxNodeNames) {
      return absl::InvalidArgumentError(StrCat("Nodes.items holds ", items->size(), " nodes; at most ",
                                               kMaxNodeNames, " are read in one request"));
    }
    args.node_list = true;
    if (items != nullptr) {
      for (json& n : const_cast<json&>(*items)) {  // the document is ours: move the nodes out, not copy
        std::string name = NodeName(n);
        if (name.empty()) return absl::InvalidArgumentError("a node in Nodes.items has no metadata.name");
        // Twice, the second object replaced the first and the answer echoed a moved-from `null` item.
        if (!args.node_objects.try_emplace(name, std::move(n)).second) {
          return absl::InvalidArgumentError(
              StrCat("Nodes.items names node ", name, " twice; kube-scheduler sends each node once"));
        }
        args.list_names.push_back(name);
      }
    }
    // Views once the list is complete: growing it moves short strings' bytes.
    args.nodes.assign(args.list_names.begin(), args.list_names.end());
  }
  return args;
}

size_t Extender::ApproxBytes(const Remembered& remembered) {
  const core::PodRequest& r = remembered.request;
  size_t n = sizeof(Remembered) + 2 * remembered.uid.size() + remembered.resource_version.size() + 128 +
             r.ns.value().size() + r.name.size() + r.uid.value().size();
  for (const core::ContainerRequest& c : r.containers) {
    n += sizeof(c) + c.name.size() + c.vgpus.size() * sizeof(core::VGpuDemand);
  }
  for (const auto* list : {&r.model_include, &r.model_exclude}) {
    for (const std::string& m : *list) n += sizeof(m) + m.size();
  }
  for (const auto* list : {&r.uuid_include, &r.uuid_exclude}) {
    for (const core::GpuUuid& u : *list) n += sizeof(u) + u.value().size();
  }
  return n;
}

absl::StatusOr<core::PodRequest> Extender::RequestOf(const formats::PodObject& pod) {
  // An object the API server stored has a resourceVersion, and another one once anything in it changes; a pod
  // without one (a test's, a hand-made body) is parsed every time.
  if (!pod.resource_version.empty()) {
    if (std::optional<core::PodRequest> known = Recall(pod.spec.uid, pod.resource_version)) return *known;
  }
  {
    MutexLock lock(&mu_);
    ++counters_.parsed;
  }
  return core::ParsePodRequest(pod.spec, parse_);
}

void Extender::Remember(const core::PodRequest& request, const formats::PodObject& pod) {
  const std::string& uid = pod.spec.uid;
  if (uid.empty()) return;
  Remembered remembered{uid, pod.resource_version, request};
  const size_t bytes = ApproxBytes(remembered);
  MutexLock lock(&mu_);
  if (auto it = recent_index_.find(uid); it != recent_index_.end()) {
    recent_bytes_ -= ApproxBytes(*it->second);
    recent_.erase(it->second);
    recent_index_.erase(it);
  }
  if (bytes > options_.remembered_bytes) return;  // larger than the whole budget: bind reads it again
  recent_.push_front(std::move(remembered));
  recent_index_[uid] = recent_.begin();
  recent_bytes_ += bytes;
  while (recent_.size() > options_.remembered_pods || recent_bytes_ > options_.remembered_bytes) {
    recent_bytes_ -= ApproxBytes(recent_.back());
    recent_index_.erase(recent_.back().uid);
    recent_.pop_back();
  }
}

size_t Extender::remembered_bytes() const {
  MutexLock lock(&mu_);
  return recent_bytes_;
}

std::optional<core::PodRequest> Extender::Recall(const std::string& uid, std::string_view resource_version) {
  MutexLock lock(&mu_);
  auto it = recent_index_.find(uid);
  if (it == recent_index_.end()) return std::nullopt;
  if (!resource_version.empty() && it->second->resource_version != resource_version) return std::nullopt;
  return it->second->request;
}

void Extender::Count(uint64_t Counters::*verb, bool bad_request) {
  MutexLock lock(&mu_);
  ++(counters_.*verb);
  if (bad_request) ++counters_.bad_request;
}

namespace {

// "60%" -> "60 percent": what kube-scheduler's event formatting leaves intact.
std::string WithoutPercentSigns(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    if (ch == '%') {
      out += " percent";
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

Response Extender::Filter(std::string_view body) {
  absl::StatusOr<ParsedArgs> args = ParseArgs(body);
  Count(&Counters::filter, !args.ok());
  if (!args.ok()) return BadRequest("filter", Message(args.status()));
  const std::vector<std::string_view>& nodes = args->nodes;
  FilterVerdicts verdicts;
  if (!args->request.ok()) {
    // The pod asks for something no node can give: say so on every node, where no preemption helps.
    const std::string why = StrCat("pod ", args->pod.key(), ": ", Message(args->request.status()));
    for (uint32_t k = 0; k < nodes.size(); ++k) verdicts.unresolvable.emplace_back(k, why);
  } else if (!args->request->wants_gpu()) {
    // Not ours to judge: kube-scheduler checks CPU and memory.
    for (uint32_t k = 0; k < nodes.size(); ++k) verdicts.fits.push_back(k);
  } else {
    Remember(*args->request, args->pod);
    verdicts = cache_.FilterAt(*args->request, nodes);
  }
  if (options_.pending_pods > 0 && (!args->request.ok() || args->request->wants_gpu())) {
    NotePending(args->pod, args->request, nodes.size(), verdicts);
  }
  // kube-scheduler posts its FailedScheduling event with the reasons as a printf format and no arguments, so
  // "60% and" shows as "60%!a(MISSING)nd" in `kubectl describe pod` (seen with the real kube-scheduler 1.37).
  for (auto* reasons : {&verdicts.failed, &verdicts.unresolvable}) {
    for (auto& [node, reason] : *reasons) {
      if (reason.find('%') != std::string::npos) reason = WithoutPercentSigns(reason);
    }
  }
  if (args->node_list) {
    json result;
    json items = json::array();
    for (uint32_t k : verdicts.fits) items.push_back(std::move(args->node_objects[std::string(nodes[k])]));
    std::map<std::string, std::string> failed, unresolvable;
    for (auto& [k, why] : verdicts.failed) failed[std::string(nodes[k])] = std::move(why);
    for (auto& [k, why] : verdicts.unresolvable) unresolvable[std::string(nodes[k])] = std::move(why);
    result["Nodes"] = {
        {"apiVersion", "v1"}, {"kind", "NodeList"}, {"metadata", json::object()}, {"items", items}};
    result["NodeNames"] = nullptr;
    result["FailedNodes"] = failed;
    result["FailedAndUnresolvableNodes"] = unresolvable;
    result["Error"] = "";
    return {200, formats::DumpJson(result)};
  }
  // Written by hand into one buffer: the answer may name thousands of nodes.
  size_t bytes = 128;
  for (uint32_t k : verdicts.fits) bytes += nodes[k].size() + 3;
  std::string out;
  out.reserve(bytes);
  out += R"({"Nodes":null,"NodeNames":[)";
  for (size_t i = 0; i < verdicts.fits.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(&out, nodes[verdicts.fits[i]]);
  }
  out += R"(],"FailedNodes":)";
  AppendReasons(&out, nodes, verdicts.failed);
  out += R"(,"FailedAndUnresolvableNodes":)";
  AppendReasons(&out, nodes, verdicts.unresolvable);
  out += R"(,"Error":""})";
  return {200, std::move(out)};
}

Response Extender::Prioritize(std::string_view body) {
  absl::StatusOr<ParsedArgs> args = ParseArgs(body);
  Count(&Counters::prioritize, !args.ok());
  if (!args.ok()) return BadRequest("prioritize", Message(args.status()));
  const std::vector<std::string_view>& nodes = args->nodes;
  std::vector<PositionScore> scores;
  if (args->request.ok() && args->request->wants_gpu()) {
    Remember(*args->request, args->pod);
    scores = cache_.PrioritizeAt(*args->request, nodes);
  } else {
    scores.reserve(nodes.size());
    for (uint32_t k = 0; k < nodes.size(); ++k) scores.push_back({k, 0});
  }
  size_t bytes = 16;
  for (const PositionScore& s : scores) bytes += nodes[s.position].size() + 24;
  std::string out;
  out.reserve(bytes);
  out.push_back('[');
  for (size_t i = 0; i < scores.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += R"({"Host":)";
    AppendJsonString(&out, nodes[scores[i].position]);
    out += R"(,"Score":)";
    char digits[24];
    const auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), scores[i].score);
    out.append(digits, end);
    out.push_back('}');
  }
  out.push_back(']');
  return {200, std::move(out)};
}

Response Extender::Bind(std::string_view body) {
  absl::StatusOr<json> doc = ParseBody(body);
  BindTarget target;
  std::string missing;
  if (doc.ok()) {
    for (auto [field, out] : {std::pair{"PodName", &target.name},
                              {"PodNamespace", &target.ns},
                              {"PodUID", &target.uid},
                              {"Node", &target.node}}) {
      const json* f = Field(*doc, field);
      if (f == nullptr || !f->is_string() || f->get<std::string>().empty()) {
        missing += missing.empty() ? field : StrCat(", ", field);
      } else {
        *out = f->get<std::string>();
      }
    }
  }
  Count(&Counters::bind, !doc.ok() || !missing.empty());
  if (!doc.ok()) return BadRequest("bind", Message(doc.status()));
  if (!missing.empty()) return BadRequest("bind", StrCat("ExtenderBindingArgs lacks ", missing));

  auto fail = [&](std::string_view why) {
    MutexLock lock(&mu_);
    ++counters_.bind_failed;
    return Response{200, formats::DumpJson(json{{"Error", StrCat("bind ", target.ns, "/", target.name, " to ",
                                                                 target.node, ": ", why)}})};
  };
  std::optional<core::PodRequest> request = Recall(target.uid);
  if (!request) {
    if (pods_ == nullptr) {
      return fail(
          "the pod was never filtered by this scheduler; retry, kube-scheduler filters before it binds");
    }
    absl::StatusOr<formats::PodObject> pod = pods_->GetPod(target.ns, target.name);
    if (!pod.ok()) return fail(Message(pod.status()));
    if (pod->spec.uid != target.uid)
      return fail("the pod was replaced (its UID changed); it will be rescheduled");
    absl::StatusOr<core::PodRequest> parsed = RequestOf(*pod);
    if (!parsed.ok()) return fail(Message(parsed.status()));
    request = *std::move(parsed);
  }
  core::Placement placement;
  placement.node = core::NodeName(target.node);
  std::set<core::PodUid> compressed;  // the pods this placement compresses
  if (request->wants_gpu()) {
    absl::StatusOr<Reservation> reservation = cache_.Reserve(*request, core::NodeName(target.node));
    if (reservation.ok()) {
      placement = reservation->placement;
      for (const core::Compression& c : reservation->compressions) compressed.insert(c.tenant.pod);
    } else if (absl::IsAlreadyExists(reservation.status())) {
      // A retried bind of a pod we hold already on this node: write it again.
      std::optional<PodEntry> entry = cache_.FindPod(request->uid);
      if (!entry) return fail(Message(reservation.status()));
      placement = entry->placement;
    } else {
      return fail(Message(reservation.status()));
    }
  }
  // The pods this placement compresses get their lowered shares written before the pod is bound. Bound first,
  // a replica killed before housekeeping wrote them left the GPU over its capacity in the pods' annotations
  // for good: the next leader counted the new pod nowhere and tessera-node refused its Allocate (the fault
  // harness, docs/faults.md). A crash between the two now leaves the compressed pods below their request:
  // room unused, never a GPU over its capacity. And one whose write failed keeps the pod unbound: bound anyway,
  // the GPU was over its capacity in the pods' annotations until housekeeping wrote them, and a leader paused
  // meanwhile wrote nothing until its Lease moved. The pod goes back to kube-scheduler, which binds it again;
  // the compressed pods get their shares back meanwhile.
  if (!compressed.empty()) {
    MutexLock sync(&sync_mu_);
    std::map<core::PodUid, std::string> failed;
    SyncChangedSharesLocked(&failed);
    std::vector<std::string> unwritten;
    for (const auto& [uid, name] : failed) {
      if (compressed.contains(uid)) unwritten.push_back(name);
    }
    if (!unwritten.empty()) {
      cache_.Unreserve(request->uid);
      SyncChangedSharesLocked();  // the shares given back
      return fail(StrCat("the lowered shares of the pods it compresses (", StrJoin(unwritten, ", "),
                         ") could not be written; bound before them, their GPU would hold more than its "
                         "capacity. kube-scheduler retries the pod"));
    }
  }
  if (absl::Status st = binder_.Bind(target, placement); !st.ok()) {
    if (request->wants_gpu()) cache_.Unreserve(request->uid);
    return fail(Message(st));
  }
  if (request->wants_gpu()) cache_.Confirm(request->uid);
  if (options_.pending_pods > 0) ForgetPending(target.uid);
  return {200, json{{"Error", ""}}.dump()};
}

Response Extender::Preempt(std::string_view body) {
  absl::StatusOr<ParsedArgs> args = ParseArgs(body);
  Count(&Counters::preempt, !args.ok());
  if (!args.ok()) return BadRequest("preempt", Message(args.status()));
  // The victims are in the document ParseArgs read: the body is parsed once (twice used to cost 1.78 GB of
  // RSS for 30 MB of `{}`).
  const json& doc = args->args.doc;
  // node -> (victim UIDs, PDB violations)
  std::map<std::string, std::pair<std::vector<std::string>, int64_t>> victims;
  auto read = [&](const json& map, bool meta) -> absl::Status {
    if (!map.is_object()) return absl::InvalidArgumentError("the victims must be a map from node name");
    if (map.size() > kMaxNodeNames) {
      return absl::InvalidArgumentError(StrCat("the victims name ", map.size(), " nodes; at most ",
                                               kMaxNodeNames, " are read in one request"));
    }
    for (auto it = map.begin(); it != map.end(); ++it) {
      auto& [uids, pdb] = victims[it.key()];
      const json* pods = Field(*it, "Pods");
      if (pods != nullptr && !pods->is_array())
        return absl::InvalidArgumentError("Victims.Pods must be a list");
      if (pods != nullptr) {
        for (const json& p : *pods) {
          std::string uid;
          if (meta) {
            const json* u = Field(p, "UID");
            if (u != nullptr && u->is_string()) uid = u->get<std::string>();
          } else {
            const json* m = Field(p, "metadata");
            const json* u = m != nullptr ? Field(*m, "uid") : nullptr;
            if (u != nullptr && u->is_string()) uid = u->get<std::string>();
          }
          if (uid.empty())
            return absl::InvalidArgumentError(StrCat("a victim on node ", it.key(), " has no UID"));
          uids.push_back(uid);
        }
      }
      if (const json* n = Field(*it, "NumPDBViolations"); n != nullptr && n->is_number_integer()) {
        // Go's int64: an unsigned value above its range is not one (2^64-1 used to come back as -1).
        std::optional<int64_t> v = formats::JsonIntIn(*n, 0, std::numeric_limits<int64_t>::max());
        if (!v) {
          return absl::InvalidArgumentError(StrCat("NumPDBViolations of node ", it.key(), " is ", n->dump(),
                                                   "; expected a count from 0 to 2^63-1"));
        }
        pdb = *v;
      }
    }
    return absl::OkStatus();
  };
  absl::Status victims_read = absl::OkStatus();
  if (const json* meta = Field(doc, "NodeNameToMetaVictims")) {
    victims_read = read(*meta, true);
  } else if (const json* full = Field(doc, "NodeNameToVictims")) {
    victims_read = read(*full, false);
  }
  if (!victims_read.ok()) {
    MutexLock lock(&mu_);
    ++counters_.bad_request;
    return BadRequest("preempt", Message(victims_read));
  }
  std::set<std::string> keep;
  if (args->request.ok() && args->request->wants_gpu()) {
    std::map<std::string, std::vector<std::string>> by_node;
    for (const auto& [node, v] : victims) by_node[node] = v.first;
    keep = cache_.FitsAfterEvicting(*args->request, by_node);
  } else {
    for (const auto& [node, v] : victims)
      keep.insert(node);  // not a GPU question: keep kube-scheduler's plan
  }
  json result = json::object();
  for (const auto& [node, v] : victims) {
    if (!keep.contains(node)) continue;
    json pods = json::array();
    for (const std::string& uid : v.first) pods.push_back({{"UID", uid}});
    result[node] = {{"Pods", pods}, {"NumPDBViolations", v.second}};
  }
  return {200, formats::DumpJson(json{{"NodeNameToMetaVictims", result}})};
}

std::vector<std::string> Extender::SyncChangedShares() {
  MutexLock sync(&sync_mu_);
  return SyncChangedSharesLocked();
}

std::vector<std::string> Extender::SyncChangedSharesLocked(std::map<core::PodUid, std::string>* unwritten) {
  std::vector<PodEntry> todo = cache_.TakeChangedShares();
  {
    MutexLock lock(&mu_);
    todo.insert(todo.end(), unsynced_.begin(), unsynced_.end());
    unsynced_.clear();
  }
  std::vector<std::string> failures;
  std::vector<PodEntry> retry;
  std::set<std::string> done;
  for (const PodEntry& e : todo) {
    if (!done.insert(e.request.uid.value()).second) continue;
    // The newest record: the share may have changed again since it was taken.
    std::optional<PodEntry> now = cache_.FindPod(e.request.uid);
    if (!now) continue;
    BindTarget target{now->request.ns.value(), now->request.name, now->request.uid.value(),
                      now->placement.node.value()};
    if (log::Enabled(log::Level::kDebug)) {
      log::Debug("share changed; writing the assignment",
                 {{"pod", StrCat(target.ns, "/", target.name)},
                  {"assignment", formats::FormatAssignment(now->placement)}});
    }
    absl::Status st = binder_.UpdateAssignment(target, now->placement);
    if (st.ok()) continue;
    if (unwritten != nullptr) (*unwritten)[now->request.uid] = StrCat(target.ns, "/", target.name);
    if (absl::IsFailedPrecondition(st)) {
      // Not ours to write (a standby): the pod's next assignment seen is taken as the leader wrote it. Kept as
      // changed here, the record would pass over the leader's writes until one matched it.
      cache_.LeaveShareToLeader(now->request.uid);
      continue;
    }
    failures.push_back(StrCat(target.ns, "/", target.name, ": ", Message(st)));
    retry.push_back(*now);
  }
  MutexLock lock(&mu_);
  unsynced_.insert(unsynced_.end(), retry.begin(), retry.end());
  return failures;
}

namespace {

// At most this much of a pending pod's reason is kept (the most frequent reasons come first).
constexpr size_t kMaxPendingReasonBytes = 1024;

// The nodes' reasons, most frequent first, each with how many nodes gave it ("3 nodes: ..."), as far as
// kMaxPendingReasonBytes allows.
std::string SummarizeReasons(const FilterVerdicts& verdicts, size_t nodes_asked) {
  std::unordered_map<std::string_view, int> counts;
  for (const auto* reasons : {&verdicts.failed, &verdicts.unresolvable}) {
    for (const auto& [k, why] : *reasons) ++counts[why];
  }
  std::vector<std::pair<std::string_view, int>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (nodes_asked == 0) return "kube-scheduler named no node (none passed its own checks)";
  std::string out = StrCat("0 of ", nodes_asked, " nodes fit");
  size_t shown = 0;
  for (const auto& [why, n] : sorted) {
    std::string part = StrCat(shown == 0 ? ": " : "; ", n, n == 1 ? " node: " : " nodes: ", why);
    if (out.size() + part.size() > kMaxPendingReasonBytes) break;
    out += part;
    ++shown;
  }
  if (shown < sorted.size()) StrAppend(&out, "; ", sorted.size() - shown, " other reasons");
  return out;
}

}  // namespace

void Extender::NotePending(const formats::PodObject& pod, const absl::StatusOr<core::PodRequest>& request,
                           size_t nodes_asked, const FilterVerdicts& verdicts) {
  const std::string& uid = pod.spec.uid;
  if (uid.empty()) return;
  PendingPod p;
  p.uid = uid;
  p.name = pod.key();
  p.ns = pod.spec.ns;
  p.nodes_asked = static_cast<int>(nodes_asked);
  p.nodes_fit = static_cast<int>(verdicts.fits.size());
  if (!request.ok()) {
    p.reason = Message(request.status()).substr(0, kMaxPendingReasonBytes);
  } else {
    p.priority = request->priority;
    p.vgpus = request->VGpuCount();
    p.cores = request->TotalCores();
    p.reason = verdicts.fits.empty()
                   ? SummarizeReasons(verdicts, nodes_asked)
                   : StrCat(verdicts.fits.size(), " of ", nodes_asked,
                            " nodes have room; waiting for kube-scheduler to choose one and bind it");
  }
  p.last_filtered = options_.clock->Now();
  MutexLock lock(&mu_);
  if (auto it = pending_index_.find(uid); it != pending_index_.end()) {
    p.filtered = it->second->filtered;
    pending_.erase(it->second);
    pending_index_.erase(it);
  }
  ++p.filtered;
  pending_.push_front(std::move(p));
  pending_index_[uid] = pending_.begin();
  while (pending_.size() > options_.pending_pods) {
    pending_index_.erase(pending_.back().uid);
    pending_.pop_back();
  }
}

void Extender::ForgetPending(const std::string& uid) {
  MutexLock lock(&mu_);
  auto it = pending_index_.find(uid);
  if (it == pending_index_.end()) return;
  pending_.erase(it->second);
  pending_index_.erase(it);
}

std::vector<PendingPod> Extender::Pending() const {
  const auto oldest = options_.clock->Now() - options_.pending_ttl;
  std::vector<PendingPod> out;
  MutexLock lock(&mu_);
  for (const PendingPod& p : pending_) {
    if (p.last_filtered < oldest) break;  // most recent first: the rest are older still
    out.push_back(p);
  }
  return out;
}

Extender::Counters Extender::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

}  // namespace tessera::scheduler
