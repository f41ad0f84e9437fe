// The kube-scheduler extender protocol (extender/v1, see ../shared/k8s-api/scheduler-extender-v1.md): the
// filter, prioritize, bind and preempt verbs, from request body to response body. The HTTP server
// (http_server.h) only routes; everything the protocol says happens here, so that tests can feed it the JSON
// kube-scheduler really sends.
//
//   Extender extender(cache, binder, pods);
//   Response r = extender.Filter(body);     // r.status 200 and r.body, or 400 with an error
//
// Field names are written as kube-scheduler's Go types name them (Pod, NodeNames, FailedNodes, ...) and read
// case-insensitively, as Go's decoder does. Both nodeCacheCapable modes are served: NodeNames in, NodeNames
// out; or a NodeList in, the fitting subset of it out.
//
// Thread-safety: thread-safe; verbs run concurrently (the cache and the binder serialize what they must).
#ifndef TESSERA_SCHEDULER_EXTENDER_H_
#define TESSERA_SCHEDULER_EXTENDER_H_

#include <chrono>
#include <list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "core/request.h"
#include "formats/pod_object.h"
#include "scheduler/cluster_cache.h"

namespace tessera::scheduler {

// The pod a bind is about, and where it goes.
struct BindTarget {
  std::string ns;
  std::string name;
  std::string uid;
  std::string node;
};

// Writes decisions to the cluster: the assignment annotations, then the binding (docs/protocols.md).
class Binder {
 public:
  virtual ~Binder() = default;
  virtual absl::Status Bind(const BindTarget& pod, const core::Placement& placement) = 0;
  // Rewrites the assignment of a bound pod whose share changed (compressed, or given back). FailedPrecondition:
  // this replica may not write it (it does not lead); its ledger takes the pod's next assignment seen instead.
  virtual absl::Status UpdateAssignment(const BindTarget& pod, const core::Placement& placement) = 0;
};

// Where the bind verb finds a pod it has not seen in filter (the bind request carries only names).
class PodSource {
 public:
  virtual ~PodSource() = default;
  virtual absl::StatusOr<formats::PodObject> GetPod(const std::string& ns, const std::string& name) = 0;
};

struct Response {
  int status = 200;
  std::string body;
};

// A pod's annotations (and, apart, its labels) hold at most this many bytes of keys and values: Kubernetes'
// own limit on annotations (256 KiB), which the API server enforces on every pod it stores. A body that
// claims more is not from it, and is refused before anything reads the keys (60 MB of tessera.dev/ keys
// used to cost 39 s of CPU).
inline constexpr size_t kMaxPodMetadataBytes = size_t{256} << 10;

// InvalidArgument when `pod` (a Pod object as JSON) has annotations or labels above kMaxPodMetadataBytes.
absl::Status CheckPodMetadataSize(const nlohmann::json& pod);

// A GPU pod the filter verb was asked about and no bind of this scheduler has placed since: why it waits, as
// the last filter saw it (what the operators' page lists).
struct PendingPod {
  std::string uid;
  std::string name;  // namespace/name
  std::string ns;
  core::Priority priority = core::Priority::kLow;
  int vgpus = 0;
  core::MilliGpu cores{0};  // total compute asked (0: proportional to memory)
  int nodes_asked = 0;      // nodes the last filter named
  int nodes_fit = 0;        // of those, nodes with room
  std::string reason;       // why it waits: the reasons nodes gave, most frequent first (bounded)
  std::chrono::system_clock::time_point last_filtered;
  uint64_t filtered = 0;  // filter calls for it
};

// ExtenderOptions::pending_pods when the operators' page is on.
inline constexpr size_t kPagePendingPods = 4096;

struct ExtenderOptions {
  // Pods' requests remembered from filter and prioritize, by UID and resourceVersion: the pod's next verb at
  // the same version (prioritize after filter, filter again while it waits) is not parsed again, and its bind
  // (which carries only names) finds the request here.
  size_t remembered_pods = 4096;
  // Pending pods remembered for the page (the most recently filtered), and for how long after their last
  // filter: kube-scheduler tries an unschedulable pod again at least every 5 minutes, so one not filtered for
  // longer was deleted or placed by someone else. 0 (without the page): none, and filter and bind do no work
  // for it.
  size_t pending_pods = 0;
  std::chrono::seconds pending_ttl{600};
  // Time of the pending pods' filters; never null (common/clock.h). Must outlive the extender.
  const Clock* clock = &RealClock();
  // ... and at most this many bytes of them (a pod's annotations can make its request large: an 8 MB model
  // list). A pod larger than the whole budget is not remembered; its bind reads it from the API.
  size_t remembered_bytes = size_t{64} << 20;
};

class Extender {
 public:
  Extender(ClusterCache& cache, Binder& binder, PodSource* pods, core::ParseOptions parse = {},
           ExtenderOptions options = {});

  Response Filter(std::string_view body);
  Response Prioritize(std::string_view body);
  Response Bind(std::string_view body);
  Response Preempt(std::string_view body);

  // Writes out the assignments of pods whose share changed (see ClusterCache::TakeChangedShares). Returns
  // the failures; those pods are retried on the next call. Housekeeping calls it, and Bind before it binds a
  // pod whose placement compressed others; one call at a time (each writes a pod's newest share, so a later
  // call never writes an older share over a newer one).
  std::vector<std::string> SyncChangedShares() ABSL_LOCKS_EXCLUDED(sync_mu_, mu_);

  // Counters, for metrics.
  struct Counters {
    uint64_t filter = 0, prioritize = 0, bind = 0, bind_failed = 0, preempt = 0, bad_request = 0;
    // Pod requests parsed (core::ParsePodRequest); a verb that finds its pod remembered at the same
    // resourceVersion parses nothing.
    uint64_t parsed = 0;
  };
  Counters counters() const;
  // Pending GPU pods, most recently filtered first (PendingPod); none older than
  // ExtenderOptions::pending_ttl.
  std::vector<PendingPod> Pending() const;
  // The clock the pending pods' times are read on (options.clock).
  const Clock& clock() const { return *options_.clock; }

  // Bytes the remembered pods take (ApproxBytes), for tests and metrics.
  size_t remembered_bytes() const;

 private:
  struct ParsedArgs;
  absl::StatusOr<ParsedArgs> ParseArgs(std::string_view body);
  // A pod's request as this extender last parsed it.
  struct Remembered {
    std::string uid;
    std::string resource_version;
    core::PodRequest request;
  };
  // The pod's request: the remembered one when the pod is known at this resourceVersion, parsed otherwise.
  absl::StatusOr<core::PodRequest> RequestOf(const formats::PodObject& pod);
  void Remember(const core::PodRequest& request, const formats::PodObject& pod);
  // What a remembered request costs in memory, roughly (its strings and vectors).
  static size_t ApproxBytes(const Remembered& r);
  // The request remembered for `uid`; with a `resource_version`, only when remembered at that version.
  std::optional<core::PodRequest> Recall(const std::string& uid, std::string_view resource_version = {});
  void Count(uint64_t Counters::*verb, bool bad_request);
  void NotePending(const formats::PodObject& pod, const absl::StatusOr<core::PodRequest>& request,
                   size_t nodes_asked, const FilterVerdicts& verdicts);
  void ForgetPending(const std::string& uid);
  // SyncChangedShares with sync_mu_ held; the pods whose share was not written go into `unwritten` too
  // (UID -> namespace/name).
  std::vector<std::string> SyncChangedSharesLocked(std::map<core::PodUid, std::string>* unwritten = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  ClusterCache& cache_;
  Binder& binder_;
  PodSource* pods_;
  core::ParseOptions parse_;
  ExtenderOptions options_;

  // One SyncChangedShares at a time; held across the binder's calls.
  Mutex sync_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;  // guards the members below; never held across a call to the cache or binder
  // Requests, most recent first (bounded: ExtenderOptions::remembered_pods and remembered_bytes).
  std::list<Remembered> recent_ ABSL_GUARDED_BY(mu_);
  size_t recent_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // ApproxBytes of everything in recent_
  std::unordered_map<std::string, std::list<Remembered>::iterator> recent_index_ ABSL_GUARDED_BY(mu_);
  std::vector<PodEntry> unsynced_ ABSL_GUARDED_BY(mu_);
  // uid -> pending pod, most recently filtered first (bounded by ExtenderOptions::pending_pods).
  std::list<PendingPod> pending_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::list<PendingPod>::iterator> pending_index_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_EXTENDER_H_
