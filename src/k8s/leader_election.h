// Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection package does it.
//
// Each candidate reads the Lease every retry_period. A candidate takes it when it has no holder or when its
// record has not changed for lease_duration (measured on the candidate's own clock from when it first saw
// that record, so clock skew between machines does not matter). The leader renews it every retry_period; it
// stops leading when it has not renewed for renew_deadline (< lease_duration, so an old leader has stepped
// down before anyone may take over) or when it sees another holder. Writes are conditional on the Lease's
// resourceVersion: a 409 Conflict means another candidate wrote first. On Stop the leader gives the Lease up
// (holderIdentity ""), so another candidate takes over at its next try instead of after lease_duration.
//
//   LeaderElectionConfig c;
//   c.lease_namespace = "tessera-system"; c.lease_name = "tessera-scheduler"; c.identity = hostname;
//   c.on_started_leading = [] { ... };  c.on_stopped_leading = [] { ... };
//   absl::StatusOr<std::unique_ptr<LeaderElector>> e = LeaderElector::Create(*api, c);
//   (*e)->Start();
//   if ((*e)->IsLeader()) ...   // check before acting as the leader
//   (*e)->Stop();               // releases the Lease if held
//
// Tests drive TryAcquireOrRenew() by hand with a FakeClock instead of Start().
//
// Thread-safety: IsLeader, leader and the accessors are safe from any thread. Callbacks run on the elector's
// thread (or the thread that calls TryAcquireOrRenew/Release/Stop), never two at once.
#ifndef TESSERA_K8S_LEADER_ELECTION_H_
#define TESSERA_K8S_LEADER_ELECTION_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "k8s/kube_api.h"

namespace tessera::k8s {

struct LeaderElectionConfig {
  std::string lease_namespace = "default";
  std::string lease_name;
  std::string identity;  // unique per candidate: the pod name, or host name + a random suffix
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  bool release_on_stop = true;
  std::function<void()> on_started_leading;
  std::function<void()> on_stopped_leading;
  std::function<void(const std::string& leader)> on_new_leader;  // whenever the observed holder changes
  const Clock* clock = &RealClock();                             // never null (common/clock.h)
};

class LeaderElector {
 public:
  // Checks the configuration (names set; lease_duration > renew_deadline > 1.2 x retry_period).
  static absl::StatusOr<std::unique_ptr<LeaderElector>> Create(KubeApi& api, LeaderElectionConfig config);
  ~LeaderElector();  // Stop()

  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Starts the loop on its own thread.
  void Start();
  // Ends the loop; releases the Lease when leading and release_on_stop; calls on_stopped_leading if leading.
  void Stop();

  // True while this candidate holds the Lease and renewed it less than renew_deadline ago.
  bool IsLeader() const ABSL_LOCKS_EXCLUDED(mu_);
  // The holder last observed ("" when none).
  std::string leader() const ABSL_LOCKS_EXCLUDED(mu_);
  // While this candidate leads (IsLeader, read under the same lock): the Lease's leaseTransitions, the term it
  // leads in, which a take-over by anyone else increments. A write that carries it can be refused by the API
  // server once the Lease has moved on (tessera-scheduler's binds: deploy/scheduler/70-leader-fence.yaml), which
  // fences a leader paused past its Lease by more than its own clock. Empty when not leading.
  std::optional<int64_t> LeadingTerm() const ABSL_LOCKS_EXCLUDED(mu_);
  const LeaderElectionConfig& config() const { return config_; }

  // One round: reads the Lease, then takes or renews it when allowed. True when this candidate leads after
  // it.
  absl::StatusOr<bool> TryAcquireOrRenew() ABSL_LOCKS_EXCLUDED(round_mu_, mu_);
  // Gives the Lease up when this candidate holds it.
  absl::Status Release() ABSL_LOCKS_EXCLUDED(round_mu_, mu_);

 private:
  LeaderElector(KubeApi& api, LeaderElectionConfig config);
  void Run(std::stop_token stop) ABSL_LOCKS_EXCLUDED(round_mu_, mu_);
  // Holding the Lease and renewed within renew_deadline: what IsLeader and LeadingTerm answer from.
  bool LeadingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Callbacks run without mu_.
  void SetLeading(bool leading) ABSL_LOCKS_EXCLUDED(mu_);
  void Observe(const Json& spec) ABSL_LOCKS_EXCLUDED(mu_);
  Json Spec(const std::string& holder, int64_t duration_seconds, const std::string& acquire,
            int64_t transitions, std::chrono::system_clock::time_point now) const;

  KubeApi& api_;
  const LeaderElectionConfig config_;
  const Clock& clock_;

  // One round (or release) at a time; held across the API calls and callbacks of a round. Guards no field.
  Mutex round_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable Mutex mu_;  // what this candidate knows of the Lease
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::system_clock::time_point renewed_at_ ABSL_GUARDED_BY(mu_);
  Json observed_spec_ ABSL_GUARDED_BY(mu_);
  std::chrono::system_clock::time_point observed_at_ ABSL_GUARDED_BY(mu_);
  std::string leader_ ABSL_GUARDED_BY(mu_);

  std::jthread thread_;
};

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_LEADER_ELECTION_H_
