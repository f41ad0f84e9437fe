// DraFallback: when tessera-scheduler stays unavailable, tessera-node hands the pods it gated for DRA
// placement to kube-scheduler's own DRA allocator (docs/dra.md, "When tessera-scheduler is down").
//
// The admission webhook gates a pod whose ResourceClaims use Tessera's device classes
// (src/formats/dra_placement.h: the scheduling gate tessera.dev/dra-placement, the label
// tessera.dev/dra-placement=gated, the annotation tessera.dev/dra-gated-at), and only the leader of
// tessera-scheduler lifts the gate. If every replica is down, nothing would. So every node agent watches the
// gated pods (an Informer, label selector tessera.dev/dra-placement=gated, all namespaces) and, each round
// (`period`):
//
//   1. a pod is due when it carries the gate, its label says gated, it is not being deleted, and it was gated
//      (the annotation, never earlier than its creationTimestamp; a garbled annotation reads as the
//      creationTimestamp) at least fallback_after + this node's stagger ago. A pod with the label and no
//      gate, or no annotation, is not Tessera's to touch: it is ignored (a user's label alone never makes the
//      agent write);
//   2. if some pod is due, the scheduler's Lease (coordination.k8s.io/v1) is read, once for the round: it is
//   live
//      while its spec.renewTime is within max(fallback_after, leaseDurationSeconds) of now, or while it
//      changed since this agent's previous look less than fallback_after ago (which holds whatever the
//      clocks' skew). A live Lease means tessera-scheduler keeps the pod gated on purpose (it fits nowhere;
//      its events say why): nothing is done, and the Lease is not read again before it could have gone stale;
//   3. if the Lease is stale or absent, each due pod (round-robin over namespaces, oldest first in each, at
//   most
//      max_writes_per_round writes) gets ONE conditional write: a PUT of the pod at its resourceVersion that
//      removes only the gate tessera.dev/dra-placement from spec.schedulingGates (any other gate stays) and
//      sets the label to "fallback". A 409 means someone else changed the pod (another node's agent,
//      tessera-scheduler coming back): the pod is read again and the decision made again on what it is now,
//      never forced. On success: a Warning event TesseraPlacementFallback on the pod,
//      tessera_node_dra_fallbacks_total + 1, a log line.
//
// The stagger (a hash of the node name, in [0, stagger_window)) makes the agent of one node usually act
// alone; the others find the gate gone (the conditional write, and the pod leaving their informer).
//
// Bounds (a tenant can set the label on its own pods): per round at most one Lease GET, max_writes_per_round
// PUTs and as many re-reads after a conflict, and that many events; the informer's store is the only per-pod
// state (the round's list of due pods is dropped at its end).
//
//   absl::StatusOr<std::unique_ptr<DraFallback>> f = DraFallback::Create(
//       {.node_name = "gpu-1", .fallback_after = std::chrono::seconds(60)}, kube_api);
//   (*f)->Start();                      // the informer and a round every `period`
//   http: (*f)->MetricsText()           // tessera_node_dra_fallbacks_total,
//   tessera_node_dra_fallback_errors_total
//   (*f)->Stop();
//
// Tests set period to 0 (no thread of rounds), drive RunRound() by hand and the time with a FakeClock
// (common/clock.h).
//
// Thread-safety: every method is safe from any thread; rounds never overlap (RunRound holds a lock).
#ifndef TESSERA_NODE_DRA_FALLBACK_H_
#define TESSERA_NODE_DRA_FALLBACK_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "k8s/event_recorder.h"
#include "k8s/informer.h"
#include "k8s/kube_api.h"
#include "k8s/objects.h"

namespace tessera::node {

inline constexpr char kDraFallbackReason[] = "TesseraPlacementFallback";

struct DraFallbackConfig {
  std::string node_name;
  // How long a gated pod waits, and how long tessera-scheduler's Lease must have gone unrenewed, before the
  // pod falls back (--dra-fallback-after). Zero turns the fallback off (Create refuses it: do not construct
  // one).
  std::chrono::seconds fallback_after{60};
  // "namespace/name" of tessera-scheduler's Lease (--scheduler-lease).
  std::string scheduler_lease = "tessera-system/tessera-scheduler";
  // A round every `period`; 0: no thread of rounds (tests call RunRound).
  std::chrono::milliseconds period{2000};
  // This node waits a further hash(node_name) mod stagger_window before acting on a pod.
  std::chrono::milliseconds stagger_window{10000};
  int max_writes_per_round = 50;
  // Time (pods' waits, the Lease's age, events, the informer's backoff); never null (common/clock.h).
  const Clock* clock = &RealClock();
};

// What the decision reads of a pod (pure; exposed for tests).
struct GatedPod {
  enum class State {
    kIgnored,  // not gated by Tessera (no gate, label not "gated", no gated-at annotation, being deleted)
    kGated,    // gated by Tessera; due or not is the caller's question (gated_at)
  };
  State state = State::kIgnored;
  // When it was gated: the annotation, never earlier than metadata.creationTimestamp; the creationTimestamp
  // alone when the annotation is garbled.
  std::chrono::system_clock::time_point gated_at;
  bool annotation_garbled = false;
};
GatedPod ReadGatedPod(const k8s::Json& pod);

// What the decision reads of the Lease (pure; exposed for tests).
struct LeaseView {
  bool present = false;
  std::optional<std::chrono::system_clock::time_point> renewed;  // spec.renewTime; absent or garbled: none
  std::string renew_text;                                        // as written, to notice a change
  std::chrono::seconds duration{0};                              // spec.leaseDurationSeconds (0 when absent)
  std::string holder;                                            // spec.holderIdentity ("" when released)
};
LeaseView ReadLease(const k8s::Json& lease);
// Live by its own timestamps: renewed within max(fallback_after, its duration) of `now` (a renewal in the
// future counts as now). An absent Lease, or one never renewed, is not live.
bool LeaseLiveAt(const LeaseView& lease, std::chrono::system_clock::time_point now,
                 std::chrono::seconds fallback_after);

// The pod as the one write leaves it: the gate removed from spec.schedulingGates (other gates kept, the field
// dropped when none is left), the label set to "fallback"; metadata.resourceVersion kept (the write is
// conditional on it).
k8s::Json LiftedPod(const k8s::Json& pod);

// hash(node_name) mod window (FNV-1a, so that it is the same on every build and restart).
std::chrono::milliseconds StaggerFor(std::string_view node_name, std::chrono::milliseconds window);

struct DraFallbackStats {
  int64_t rounds = 0;
  int64_t lease_reads = 0;
  int64_t fallbacks = 0;    // gates lifted by this agent
  int64_t conflicts = 0;    // writes answered 409 (the pod read again)
  int64_t errors = 0;       // Lease reads and pod writes or re-reads that failed otherwise
  int64_t deferred = 0;     // due pods left for a later round by the write cap
  int64_t waited_live = 0;  // rounds with due pods that found tessera-scheduler live
};

// What one round did (tests).
struct DraFallbackRound {
  int due = 0;  // pods due this round
  bool lease_read = false;
  bool lease_live = false;
  int writes = 0;   // PUTs sent
  int rereads = 0;  // GETs after a 409
  int lifted = 0;
};

class DraFallback {
 public:
  // Checks the configuration: a node name, fallback_after > 0, scheduler_lease "namespace/name" (both DNS
  // names), max_writes_per_round >= 1.
  static absl::StatusOr<std::unique_ptr<DraFallback>> Create(DraFallbackConfig config, k8s::KubeApi& api);
  ~DraFallback();  // Stop()

  DraFallback(const DraFallback&) = delete;
  DraFallback& operator=(const DraFallback&) = delete;

  // Starts the informer and, when period > 0, the rounds. Call once.
  void Start();
  // Stops both; sends the events queued. Prompt.
  void Stop();
  bool WaitForSync(std::chrono::milliseconds timeout) const;
  // Gated pods the informer holds (every pod with the label, gated or not).
  size_t watched() const;

  DraFallbackRound RunRound();
  // Waits until every event recorded so far has been sent (tests).
  void FlushEvents();

  std::chrono::milliseconds stagger() const { return stagger_; }
  DraFallbackStats stats() const;
  // The Prometheus families tessera_node_dra_fallbacks_total and tessera_node_dra_fallback_errors_total.
  std::string MetricsText() const;

 private:
  DraFallback(DraFallbackConfig config, k8s::KubeApi& api, std::string lease_ns, std::string lease_name);
  enum class Outcome { kLifted, kNotDue, kGone, kConflictLeft, kError, kUnavailable, kBudget };
  Outcome Lift(k8s::Json pod, const LeaseView& lease, std::chrono::system_clock::time_point now,
               DraFallbackRound* round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(round_mu_);
  bool Due(const GatedPod& g, std::chrono::system_clock::time_point now) const;
  std::string LeaseName() const { return lease_ns_ + "/" + lease_name_; }
  void Loop(std::stop_token stop);
  void NoteError(std::string_view what, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(round_mu_);

  const DraFallbackConfig config_;
  k8s::KubeApi& api_;
  const Clock& clock_;
  const std::string lease_ns_, lease_name_;
  const std::chrono::milliseconds stagger_;
  k8s::Informer informer_;
  k8s::EventRecorder events_;

  // Held for a whole round: what the rounds remember between them.
  Mutex round_mu_;
  int64_t round_count_ ABSL_GUARDED_BY(round_mu_) = 0;
  // The Lease read last, and when (this agent's steady clock), to notice a renewal whatever the clocks' skew.
  std::optional<std::string> last_renew_text_ ABSL_GUARDED_BY(round_mu_);
  std::chrono::steady_clock::time_point last_look_ ABSL_GUARDED_BY(round_mu_);
  // A live Lease is not read again before this (it cannot have gone stale sooner).
  std::chrono::steady_clock::time_point live_until_ ABSL_GUARDED_BY(round_mu_);
  std::string last_error_ ABSL_GUARDED_BY(round_mu_);  // logged once until it changes

  mutable Mutex stats_mu_;  // the counters
  DraFallbackStats stats_ ABSL_GUARDED_BY(stats_mu_);

  // The rounds' thread and its wake-up.
  Mutex loop_mu_;
  CondVar loop_cv_;
  bool stopping_ ABSL_GUARDED_BY(loop_mu_) = false;
  std::jthread thread_;
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_DRA_FALLBACK_H_
