#include "k8s/leader_election.h"

#include <random>

#include "common/log.h"
#include "core/strings.h"
#include "k8s/api_status.h"

namespace tessera::k8s {

namespace {

int64_t CeilSeconds(std::chrono::milliseconds d) {
  return (d.count() + 999) / 1000;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LeaderElector>> LeaderElector::Create(KubeApi& api,
                                                                     LeaderElectionConfig config) {
  if (config.lease_name.empty()) {
    return absl::InvalidArgumentError("leader election: lease_name is empty; name the Lease to elect with");
  }
  if (config.identity.empty()) {
    return absl::InvalidArgumentError(
        "leader election: identity is empty; give each candidate a unique identity (e.g. its pod name)");
  }
  if (config.lease_namespace.empty()) config.lease_namespace = api.config().default_namespace;
  if (config.lease_duration <= config.renew_deadline) {
    return absl::InvalidArgumentError(
        StrCat("leader election: lease_duration (", config.lease_duration.count(), "ms) must be longer than ",
               "renew_deadline (", config.renew_deadline.count(), "ms), or two candidates could both lead"));
  }
  if (config.renew_deadline.count() * 10 <= config.retry_period.count() * 12) {
    return absl::InvalidArgumentError(
        StrCat("leader election: renew_deadline (", config.renew_deadline.count(),
               "ms) must be longer than 1.2 x retry_period (", config.retry_period.count(), "ms)"));
  }
  if (config.retry_period.count() <= 0) {
    return absl::InvalidArgumentError("leader election: retry_period must be positive");
  }
  return std::unique_ptr<LeaderElector>(new LeaderElector(api, std::move(config)));
}

LeaderElector::LeaderElector(KubeApi& api, LeaderElectionConfig config)
    : api_(api), config_(std::move(config)), clock_(*config_.clock) {}

LeaderElector::~LeaderElector() {
  Stop();
}

void LeaderElector::Start() {
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

void LeaderElector::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
    return;  // Run released and stepped down
  }
  bool leading;
  {
    MutexLock lock(&mu_);
    leading = leading_;
  }
  if (leading && config_.release_on_stop) {
    if (absl::Status s = Release(); !s.ok())
      log::Warn("leader election: release failed", {{"error", Message(s)}});
  }
  SetLeading(false);
}

bool LeaderElector::LeadingLocked() const {
  return leading_ && clock_.Now() < renewed_at_ + config_.renew_deadline;
}

bool LeaderElector::IsLeader() const {
  MutexLock lock(&mu_);
  return LeadingLocked();
}

std::string LeaderElector::leader() const {
  MutexLock lock(&mu_);
  return leader_;
}

std::optional<int64_t> LeaderElector::LeadingTerm() const {
  MutexLock lock(&mu_);
  if (!LeadingLocked()) return std::nullopt;
  // The spec this candidate last wrote (or read while holding the Lease): its leaseTransitions is the term.
  return observed_spec_.is_object() ? observed_spec_.value("leaseTransitions", int64_t{0}) : 0;
}

void LeaderElector::SetLeading(bool leading) {
  bool changed;
  {
    MutexLock lock(&mu_);
    changed = leading_ != leading;
    leading_ = leading;
  }
  if (!changed) return;
  if (leading) {
    log::Info("leader election: started leading",
              {{"lease", config_.lease_name}, {"identity", config_.identity}});
    if (config_.on_started_leading) config_.on_started_leading();
  } else {
    log::Info("leader election: stopped leading",
              {{"lease", config_.lease_name}, {"identity", config_.identity}});
    if (config_.on_stopped_leading) config_.on_stopped_leading();
  }
}

void LeaderElector::Observe(const Json& spec) {
  std::string holder = spec.value("holderIdentity", "");
  bool new_leader;
  {
    MutexLock lock(&mu_);
    if (spec != observed_spec_) {
      observed_spec_ = spec;
      observed_at_ = clock_.Now();
    }
    new_leader = holder != leader_;
    leader_ = holder;
  }
  if (new_leader && config_.on_new_leader) config_.on_new_leader(holder);
}

Json LeaderElector::Spec(const std::string& holder, int64_t duration_seconds, const std::string& acquire,
                         int64_t transitions, std::chrono::system_clock::time_point now) const {
  return Json{{"holderIdentity", holder},
              {"leaseDurationSeconds", duration_seconds},
              {"acquireTime", acquire},
              {"renewTime", FormatTime(now, TimeFormat::kMicro)},
              {"leaseTransitions", transitions}};
}

absl::StatusOr<bool> LeaderElector::TryAcquireOrRenew() {
  MutexLock round(&round_mu_);
  auto now = clock_.Now();
  std::string now_text = FormatTime(now, TimeFormat::kMicro);
  int64_t duration = CeilSeconds(config_.lease_duration);
  absl::StatusOr<Json> lease = api_.Get(kLeases, config_.lease_namespace, config_.lease_name);
  if (absl::IsNotFound(lease.status())) {
    Json spec = Spec(config_.identity, duration, now_text, 0, now);
    Json obj = {{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
                {"spec", spec}};
    absl::StatusOr<Json> created = api_.Create(kLeases, config_.lease_namespace, obj);
    if (absl::IsAlreadyExists(created.status())) return false;  // another candidate created it first
    if (!created.ok()) return created.status();
    Observe((*created)["spec"]);
    {
      MutexLock lock(&mu_);
      renewed_at_ = now;
    }
    SetLeading(true);
    return true;
  }
  if (!lease.ok()) return lease.status();
  Json spec = lease->contains("spec") && (*lease)["spec"].is_object() ? (*lease)["spec"] : Json::object();
  Observe(spec);
  std::string holder = spec.value("holderIdentity", "");
  bool expired;
  {
    MutexLock lock(&mu_);
    expired = observed_at_ + config_.lease_duration <= now;
  }
  if (!holder.empty() && holder != config_.identity && !expired) {
    SetLeading(false);  // someone else holds a live lease
    return false;
  }
  int64_t transitions = spec.value("leaseTransitions", int64_t{0});
  std::string acquire = now_text;
  if (holder == config_.identity) {
    acquire = spec.value("acquireTime", now_text);
  } else {
    ++transitions;
  }
  Json updated = *lease;
  updated["spec"] = Spec(config_.identity, duration, acquire, transitions, now);
  absl::StatusOr<Json> written = api_.Update(kLeases, config_.lease_namespace, updated);
  if (IsConflict(written.status())) return false;  // another candidate wrote first; look again next round
  if (!written.ok()) return written.status();
  Observe((*written)["spec"]);
  {
    MutexLock lock(&mu_);
    renewed_at_ = now;
  }
  SetLeading(true);
  return true;
}

absl::Status LeaderElector::Release() {
  MutexLock round(&round_mu_);
  absl::StatusOr<Json> lease = api_.Get(kLeases, config_.lease_namespace, config_.lease_name);
  if (!lease.ok()) return lease.status();
  Json spec = lease->contains("spec") ? (*lease)["spec"] : Json::object();
  if (spec.value("holderIdentity", "") != config_.identity) {
    SetLeading(false);
    return absl::OkStatus();  // not ours (any more)
  }
  auto now = clock_.Now();
  std::string now_text = FormatTime(now, TimeFormat::kMicro);
  Json updated = *lease;
  updated["spec"] = Spec("", 1, now_text, spec.value("leaseTransitions", int64_t{0}), now);
  absl::StatusOr<Json> written = api_.Update(kLeases, config_.lease_namespace, updated);
  SetLeading(false);
  if (!written.ok()) return written.status();
  Observe((*written)["spec"]);
  return absl::OkStatus();
}

void LeaderElector::Run(std::stop_token stop) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(1.0, 1.2);
  while (!stop.stop_requested()) {
    absl::StatusOr<bool> r = TryAcquireOrRenew();
    if (!r.ok()) {
      log::Warn("leader election: could not read or write the lease",
                {{"lease", config_.lease_name}, {"error", Message(r.status())}});
    }
    bool leading;
    std::chrono::system_clock::time_point renewed;
    {
      MutexLock lock(&mu_);
      leading = leading_;
      renewed = renewed_at_;
    }
    if (leading && (!r.ok() || !*r) && clock_.Now() >= renewed + config_.renew_deadline) {
      SetLeading(false);  // could not renew in time
    }
    auto wait = config_.retry_period;
    if (!leading) {
      wait = std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(wait.count()) * jitter(rng)));
    }
    SleepFor(wait, stop);
  }
  bool leading;
  {
    MutexLock lock(&mu_);
    leading = leading_;
  }
  if (leading && config_.release_on_stop) {
    if (absl::Status s = Release(); !s.ok())
      log::Warn("leader election: release failed", {{"error", Message(s)}});
  }
  SetLeading(false);
}

}  // namespace tessera::k8s
