#include "node/dra_fallback.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "common/exposition.h"
#include "common/log.h"
#include "core/strings.h"
#include "formats/dra_placement.h"
#include "k8s/api_status.h"

namespace tessera::node {

namespace {

using k8s::Json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using TimePoint = std::chrono::system_clock::time_point;

// A Lease's leaseDurationSeconds is held to this, so that `now - duration` cannot overflow.
constexpr int64_t kMaxLeaseSeconds = 366 * 24 * 3600;
// Writes to one pod in one round (the first and two more after a 409): a pod that changes that fast is left
// for the next round.
constexpr int kMaxAttemptsPerPod = 3;

const Json* Field(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::optional<TimePoint> TimeField(const Json* value) {
  if (value == nullptr || !value->is_string()) return std::nullopt;
  absl::StatusOr<TimePoint> t = k8s::ParseTime(value->get_ref<const std::string&>());
  if (!t.ok()) return std::nullopt;
  return *t;
}

bool HasGate(const Json& pod) {
  const Json* spec = Field(pod, "spec");
  const Json* gates = spec != nullptr ? Field(*spec, "schedulingGates") : nullptr;
  if (gates == nullptr || !gates->is_array()) return false;
  return std::any_of(gates->begin(), gates->end(), [](const Json& g) {
    const Json* name = Field(g, "name");
    return name != nullptr && name->is_string() &&
           name->get_ref<const std::string&>() == formats::kDraPlacementGate;
  });
}

// A DNS-1123 label (namespaces) or subdomain (names of most objects, Leases included).
bool IsDnsName(std::string_view s, bool subdomain) {
  if (s.empty() || s.size() > (subdomain ? 253u : 63u)) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [&](char c) { return alnum(c) || c == '-' || (subdomain && c == '.'); });
}

k8s::InformerOptions GatedPodsInformer(const DraFallbackConfig& config) {
  k8s::InformerOptions o;
  o.clock = config.clock;
  o.label_selector = StrCat(formats::kDraPlacementLabel, "=", formats::kDraGated);
  return o;
}

k8s::EventRecorderOptions EventOptions(const DraFallbackConfig& config) {
  k8s::EventRecorderOptions o;
  o.component = "tessera-node";
  o.instance = config.node_name;
  o.host = config.node_name;
  o.clock = config.clock;
  return o;
}

}  // namespace

GatedPod ReadGatedPod(const Json& pod) {
  GatedPod out;
  if (k8s::Label(pod, formats::kDraPlacementLabel) != formats::kDraGated) return out;
  const Json* meta = Field(pod, "metadata");
  if (meta == nullptr) return out;
  if (const Json* deleting = Field(*meta, "deletionTimestamp"); deleting != nullptr && !deleting->is_null()) {
    return out;  // going away: kube-scheduler has nothing to place
  }
  if (!HasGate(pod)) return out;
  std::optional<std::string> annotation = k8s::Annotation(pod, formats::kDraGatedAtAnnotation);
  if (!annotation.has_value()) return out;  // not gated by the webhook (a user's label and gate alone)
  std::optional<TimePoint> created = TimeField(Field(*meta, "creationTimestamp"));
  absl::StatusOr<TimePoint> at = k8s::ParseTime(*annotation);
  if (at.ok()) {
    // Never earlier than the pod's creation (set by the API server): a forged old date does not make a pod
    // due sooner than fallback_after after it was created.
    out.gated_at = created.has_value() ? std::max(*at, *created) : *at;
  } else {
    if (!created.has_value()) return out;  // nothing to measure the wait from
    out.gated_at = *created;
    out.annotation_garbled = true;
  }
  out.state = GatedPod::State::kGated;
  return out;
}

LeaseView ReadLease(const Json& lease) {
  LeaseView out;
  out.present = true;
  const Json* spec = Field(lease, "spec");
  if (spec == nullptr) return out;
  if (const Json* renew = Field(*spec, "renewTime"); renew != nullptr && renew->is_string()) {
    out.renew_text = renew->get<std::string>();
    out.renewed = TimeField(renew);
  }
  if (const Json* d = Field(*spec, "leaseDurationSeconds"); d != nullptr && d->is_number_integer()) {
    out.duration = seconds(std::clamp<int64_t>(d->get<int64_t>(), 0, kMaxLeaseSeconds));
  }
  if (const Json* h = Field(*spec, "holderIdentity"); h != nullptr && h->is_string())
    out.holder = h->get<std::string>();
  return out;
}

bool LeaseLiveAt(const LeaseView& lease, TimePoint now, seconds fallback_after) {
  if (!lease.present || !lease.renewed.has_value()) return false;
  // Compared as `renewed >= now - window`: a difference of two arbitrary times could overflow.
  return *lease.renewed >= now - std::max(fallback_after, lease.duration);
}

Json LiftedPod(const Json& pod) {
  Json out = pod;
  Json& gates = out["spec"]["schedulingGates"];
  Json kept = Json::array();
  if (gates.is_array()) {
    for (const Json& g : gates) {
      const Json* name = Field(g, "name");
      if (name != nullptr && name->is_string() &&
          name->get_ref<const std::string&>() == formats::kDraPlacementGate)
        continue;
      kept.push_back(g);
    }
  }
  if (kept.empty()) {
    out["spec"].erase("schedulingGates");
  } else {
    gates = std::move(kept);
  }
  out["metadata"]["labels"][formats::kDraPlacementLabel] = formats::kDraFallback;
  return out;
}

milliseconds StaggerFor(std::string_view node_name, milliseconds window) {
  if (window.count() <= 0) return milliseconds(0);
  uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char c : node_name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return milliseconds(static_cast<int64_t>(h % static_cast<uint64_t>(window.count())));
}

absl::StatusOr<std::unique_ptr<DraFallback>> DraFallback::Create(DraFallbackConfig config,
                                                                 k8s::KubeApi& api) {
  if (config.node_name.empty()) return absl::InvalidArgumentError("the DRA fallback needs the node's name");
  if (config.fallback_after.count() <= 0) {
    return absl::InvalidArgumentError(
        "the DRA fallback needs a wait above 0 s (--dra-fallback-after 0 turns it off: construct none)");
  }
  if (config.max_writes_per_round < 1) {
    return absl::InvalidArgumentError("the DRA fallback needs max_writes_per_round of at least 1");
  }
  const std::string& ref = config.scheduler_lease;
  const size_t slash = ref.find('/');
  if (slash == std::string::npos || ref.find('/', slash + 1) != std::string::npos ||
      !IsDnsName(std::string_view(ref).substr(0, slash), false) ||
      !IsDnsName(std::string_view(ref).substr(slash + 1), true)) {
    return absl::InvalidArgumentError(
        StrCat("\"", ref,
               "\" does not name a Lease: give NAMESPACE/NAME in lower case (tessera-scheduler's "
               "--leader-elect-namespace and --leader-elect-lease, e.g. tessera-system/tessera-scheduler)"));
  }
  std::string ns = ref.substr(0, slash), name = ref.substr(slash + 1);
  return std::unique_ptr<DraFallback>(
      new DraFallback(std::move(config), api, std::move(ns), std::move(name)));
}

DraFallback::DraFallback(DraFallbackConfig config, k8s::KubeApi& api, std::string lease_ns,
                         std::string lease_name)
    : config_(std::move(config)),
      api_(api),
      clock_(*config_.clock),
      lease_ns_(std::move(lease_ns)),
      lease_name_(std::move(lease_name)),
      stagger_(StaggerFor(config_.node_name, config_.stagger_window)),
      informer_(api, k8s::kPods, GatedPodsInformer(config_), {}),
      events_(api, EventOptions(config_)) {}

DraFallback::~DraFallback() {
  Stop();
}

void DraFallback::Start() {
  informer_.Start();
  log::Info("DRA placement fallback on", {{"after", StrCat(config_.fallback_after.count(), "s")},
                                          {"lease", LeaseName()},
                                          {"stagger", StrCat(stagger_.count(), "ms")}});
  if (config_.period.count() > 0) thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

void DraFallback::Stop() {
  {
    MutexLock lock(&loop_mu_);
    stopping_ = true;
  }
  loop_cv_.SignalAll();
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  informer_.Stop();
  events_.Flush();
}

void DraFallback::Loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    RunRound();
    MutexLock lock(&loop_mu_);
    if (stopping_) break;
    loop_cv_.WaitFor(&loop_mu_, config_.period);
    if (stopping_) break;
  }
}

bool DraFallback::WaitForSync(milliseconds timeout) const {
  return informer_.WaitForSync(timeout);
}
size_t DraFallback::watched() const {
  return informer_.size();
}
void DraFallback::FlushEvents() {
  events_.Flush();
}

DraFallbackStats DraFallback::stats() const {
  MutexLock lock(&stats_mu_);
  return stats_;
}

bool DraFallback::Due(const GatedPod& g, TimePoint now) const {
  return g.state == GatedPod::State::kGated && g.gated_at <= now - config_.fallback_after - stagger_;
}

void DraFallback::NoteError(std::string_view what, const absl::Status& status) {
  {
    MutexLock lock(&stats_mu_);
    ++stats_.errors;
  }
  std::string message = StrCat(what, ": ", Message(status));
  if (message != last_error_) log::Warn("DRA placement fallback", {{"error", message}});
  last_error_ = std::move(message);
}

DraFallbackRound DraFallback::RunRound() {
  MutexLock lock(&round_mu_);
  DraFallbackRound round;
  const int64_t round_index = round_count_++;
  const TimePoint now = clock_.Now();
  {
    MutexLock s(&stats_mu_);
    ++stats_.rounds;
  }

  // 1. The pods due, by namespace (the round's only list; dropped at its end).
  std::map<std::string, std::vector<std::pair<TimePoint, std::shared_ptr<const Json>>>> by_ns;
  for (std::shared_ptr<const Json>& pod : informer_.Items()) {
    const GatedPod g = ReadGatedPod(*pod);
    if (!Due(g, now)) continue;
    by_ns[k8s::Namespace(*pod)].emplace_back(g.gated_at, std::move(pod));
    ++round.due;
  }
  if (round.due == 0) return round;

  // 2. Is tessera-scheduler there? One Lease read at most, none while the last one read is surely still live.
  const auto steady = clock_.Steady();
  LeaseView lease;
  if (steady < live_until_) {
    round.lease_live = true;
  } else {
    round.lease_read = true;
    {
      MutexLock s(&stats_mu_);
      ++stats_.lease_reads;
    }
    absl::StatusOr<Json> got = api_.Get(k8s::kLeases, lease_ns_, lease_name_);
    if (got.ok()) {
      lease = ReadLease(*got);
    } else if (!absl::IsNotFound(got.status())) {
      // Unknown is not stale: a node that cannot read the Lease (RBAC, API trouble) never acts.
      NoteError(StrCat("cannot read tessera-scheduler's Lease ", LeaseName(),
                       " (tessera-node needs get on leases in namespace ", lease_ns_,
                       ": deploy/node/daemonset.yaml); no gated pod falls back meanwhile"),
                got.status());
      return round;
    }
    last_error_.clear();
    // Live by its timestamps, for as long as they say; or renewed since this agent's previous look, when that
    // look was less than fallback_after ago (a renewal this agent saw happen, whatever the clocks' skew).
    std::chrono::steady_clock::duration live_for{0};
    bool live = false;
    if (LeaseLiveAt(lease, now, config_.fallback_after)) {
      live = true;
      const seconds window = std::max(config_.fallback_after, lease.duration);
      live_for = std::min<std::chrono::steady_clock::duration>(window, (*lease.renewed + window) - now);
    }
    if (lease.present && last_renew_text_.has_value() && *last_renew_text_ != lease.renew_text &&
        steady - last_look_ <= config_.fallback_after) {
      live = true;
      live_for = std::max<std::chrono::steady_clock::duration>(live_for,
                                                               last_look_ + config_.fallback_after - steady);
    }
    last_renew_text_ = lease.present ? std::optional<std::string>(lease.renew_text) : std::nullopt;
    last_look_ = steady;
    live_until_ = live ? steady + live_for : steady;
    round.lease_live = live;
  }
  if (round.lease_live) {
    MutexLock s(&stats_mu_);
    ++stats_.waited_live;
    return round;  // tessera-scheduler keeps them gated on purpose; its events say why
  }

  // 3. Stale or absent: lift, namespace by namespace in turn (a namespace with many gated pods does not hold
  // up the others' beyond its turn), oldest first in each; the first namespace moves on every round.
  std::vector<std::vector<std::pair<TimePoint, std::shared_ptr<const Json>>>*> queues;
  for (auto& [ns, pods] : by_ns) {
    std::sort(pods.begin(), pods.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : k8s::Name(*a.second) < k8s::Name(*b.second);
    });
    queues.push_back(&pods);
  }
  std::rotate(queues.begin(),
              queues.begin() + static_cast<ptrdiff_t>(round_index % static_cast<int64_t>(queues.size())),
              queues.end());
  int handled = 0;
  bool stop = false;
  for (size_t depth = 0; !stop; ++depth) {
    bool any = false;
    for (auto* q : queues) {
      if (depth >= q->size()) continue;
      any = true;
      if (round.writes >= config_.max_writes_per_round) {
        stop = true;
        break;
      }
      ++handled;
      // The newest state the informer has (the list above may be a moment old).
      std::shared_ptr<const Json> latest = informer_.Get(k8s::ObjectKey(*(*q)[depth].second));
      if (latest == nullptr) continue;
      const Outcome o = Lift(*latest, lease, now, &round);
      if (o == Outcome::kUnavailable) {
        stop = true;  // the API server is in trouble: the next round tries again
        break;
      }
      if (o == Outcome::kBudget) {
        --handled;
        stop = true;
        break;
      }
    }
    if (!any) break;
  }
  if (handled < round.due) {
    MutexLock s(&stats_mu_);
    stats_.deferred += round.due - handled;
  }
  return round;
}

DraFallback::Outcome DraFallback::Lift(Json pod, const LeaseView& lease, TimePoint now,
                                       DraFallbackRound* round) {
  for (int attempt = 0;; ++attempt) {
    const GatedPod g = ReadGatedPod(pod);
    if (!Due(g, now)) return Outcome::kNotDue;  // lifted, placed or changed by someone else meanwhile
    if (round->writes >= config_.max_writes_per_round) return Outcome::kBudget;
    const std::string ns = k8s::Namespace(pod), name = k8s::Name(pod);
    ++round->writes;
    absl::StatusOr<Json> written = api_.Update(k8s::kPods, ns, LiftedPod(pod));
    if (written.ok()) {
      ++round->lifted;
      {
        MutexLock s(&stats_mu_);
        ++stats_.fallbacks;
      }
      std::string why;
      if (!lease.present) {
        why = StrCat("its Lease ", LeaseName(), " does not exist");
      } else if (!lease.renewed.has_value()) {
        why = StrCat("its Lease ", LeaseName(), " has never been renewed");
      } else {
        why = StrCat("its Lease ", LeaseName(), " was last renewed at ",
                     k8s::FormatTime(*lease.renewed, k8s::TimeFormat::kMicro),
                     lease.holder.empty() ? " (released by its holder)" : StrCat(" by ", lease.holder));
      }
      const std::string gated_at = k8s::FormatTime(g.gated_at);
      events_.Record(
          k8s::ReferenceTo(*written, k8s::kPods), "Warning", kDraFallbackReason,
          StrCat("tessera-scheduler is unavailable: ", why, ". The pod has waited for DRA placement since ",
                 gated_at, " (over ", config_.fallback_after.count(), "s), so tessera-node on ",
                 config_.node_name, " lifted its scheduling gate ", formats::kDraPlacementGate,
                 ": kube-scheduler's own DRA allocator places its claims (docs/dra.md)"));
      log::Warn(
          "DRA placement fallback: tessera-scheduler is unavailable, kube-scheduler places the pod's claims",
          {{"pod", k8s::ObjectKey(ns, name)},
           {"lease", LeaseName()},
           {"lease_state", why},
           {"gated_at", gated_at},
           {"gated_at_garbled", g.annotation_garbled ? "true" : "false"}});
      return Outcome::kLifted;
    }
    const absl::Status& s = written.status();
    if (absl::IsNotFound(s)) return Outcome::kGone;
    if (!k8s::IsConflict(s)) {
      NoteError(StrCat("cannot lift the DRA placement gate of pod ", ns, "/", name,
                       " (tessera-node needs update on pods: deploy/node/daemonset.yaml)"),
                s);
      return s.code() == absl::StatusCode::kUnavailable ? Outcome::kUnavailable : Outcome::kError;
    }
    // 409: someone else changed the pod. Read it again and decide on what it is now; never force.
    {
      MutexLock st(&stats_mu_);
      ++stats_.conflicts;
    }
    if (attempt + 1 >= kMaxAttemptsPerPod) return Outcome::kConflictLeft;
    ++round->rereads;
    absl::StatusOr<Json> fresh = api_.Get(k8s::kPods, ns, name);
    if (absl::IsNotFound(fresh.status())) return Outcome::kGone;
    if (!fresh.ok()) {
      NoteError(StrCat("cannot read pod ", ns, "/", name, " again after a conflict"), fresh.status());
      return fresh.status().code() == absl::StatusCode::kUnavailable ? Outcome::kUnavailable
                                                                     : Outcome::kError;
    }
    pod = *std::move(fresh);
  }
}

std::string DraFallback::MetricsText() const {
  const DraFallbackStats s = stats();
  std::string out;
  exposition::AppendFamily(&out, "tessera_node_dra_fallbacks_total",
                           "Pods gated for DRA placement whose gate this agent lifted because "
                           "tessera-scheduler's Lease was stale or "
                           "absent (kube-scheduler's allocator then places their claims).",
                           "counter", StrCat("tessera_node_dra_fallbacks_total ", s.fallbacks, "\n"));
  exposition::AppendFamily(&out, "tessera_node_dra_fallback_errors_total",
                           "Reads of tessera-scheduler's Lease and writes of gated pods by the DRA fallback "
                           "that failed (not 404 or 409).",
                           "counter", StrCat("tessera_node_dra_fallback_errors_total ", s.errors, "\n"));
  return out;
}

}  // namespace tessera::node
