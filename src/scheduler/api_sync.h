// Feeds the cluster cache from Kubernetes objects, as the informers deliver them: nodes with the node agents'
// GPU inventory and heartbeat annotations (docs/protocols.md), and pods with their assignments. This is
// how a (re)started scheduler rebuilds its whole state from the API alone.
//
//   ApiSync sync(cache, {.heartbeat_timeout = std::chrono::seconds(60)});
//   node informer:  sync.OnNode(node_json);  sync.OnNodeDeleted(node_json);
//   pod informer:   sync.OnPod(pod_json);    sync.OnPodDeleted(pod_json);
//   every few seconds: sync.CheckHeartbeats(std::chrono::system_clock::now());
//   for (const Problem& p : sync.TakeProblems()) post an event on p.object
//
// Nodes: a node without `tessera.dev/gpu-inventory` has no Tessera GPU (it is removed from the cache if it
// had one). A node whose inventory cannot be read keeps its last good state and the problem is reported. A
// node is schedulable while it is not cordoned and its agent's heartbeat is fresh. Host CPU and memory are
// not accounted here: kube-scheduler checks them, and it sees every pod, not only GPU pods.
//
// Pods: a pod bound to a node with a readable assignment holds its GPUs; a pod that has finished or is gone
// holds none. An unreadable or impossible assignment is reported and the pod's GPUs are not counted.
//
// Thread-safety: thread-safe (the informers call it from their own threads).
#ifndef TESSERA_SCHEDULER_API_SYNC_H_
#define TESSERA_SCHEDULER_API_SYNC_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "nlohmann/json_fwd.hpp"
#include "scheduler/cluster_cache.h"

namespace tessera::scheduler {

struct SyncOptions {
  // A node whose agent has not refreshed tessera.dev/heartbeat for this long gets no new pods.
  std::chrono::seconds heartbeat_timeout{60};
  // Wall time (heartbeats' age) through the clock seam; never null (common/clock.h). Must outlive the sync.
  const Clock* clock = &RealClock();
};

// Something wrong with an object, to be reported on it (as an Event).
struct Problem {
  std::string kind;  // "Node" or "Pod"
  std::string ns;    // empty for nodes
  std::string name;
  std::string uid;
  std::string reason;  // UpperCamelCase, for the Event
  std::string message;
};

struct SyncCounters {
  int64_t nodes_seen = 0, pods_seen = 0, bad_inventories = 0, bad_assignments = 0, stale_nodes = 0;
};

class ApiSync {
 public:
  ApiSync(ClusterCache& cache, SyncOptions options);

  void OnNode(const nlohmann::json& node);
  void OnNodeDeleted(const nlohmann::json& node);
  void OnPod(const nlohmann::json& pod);
  void OnPodDeleted(const nlohmann::json& pod);
  // The ledger's pods recorded again, at once, from what `list` gives (every pod the informer holds;
  // ClusterCache::ReplacePods); what cannot be read or does not fit is reported as OnPod reports it. `list` is
  // called between two of OnPod's calls: the informer's store, read then, is no older than what they told.
  void ResyncPods(const std::function<std::vector<std::shared_ptr<const nlohmann::json>>()>& list);

  // Makes nodes with a stale heartbeat unschedulable, and schedulable again when it is fresh.
  void CheckHeartbeats(std::chrono::system_clock::time_point now);

  std::vector<Problem> TakeProblems();
  SyncCounters counters() const;

 private:
  struct NodeRecord {
    bool cordoned = false;
    bool has_heartbeat = false;
    std::chrono::system_clock::time_point heartbeat;
    bool stale = false;
    std::string inventory;  // the last annotation applied (to skip unchanged ones)
  };
  void Report(Problem problem) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A bound pod of ours whose assignment the cache refused (`why`): a Warning on it, its GPUs not counted.
  void ReportBadAssignment(const formats::PodObject& pod, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Schedulable(const NodeRecord& r, std::chrono::system_clock::time_point now) const;

  ClusterCache& cache_;
  const SyncOptions options_;
  // Guards the members below and orders node updates against CheckHeartbeats. Held while calling the cache,
  // which never calls back.
  mutable Mutex mu_;
  std::map<std::string, NodeRecord> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> reported_ ABSL_GUARDED_BY(mu_);  // key -> last message (no repeats)
  std::vector<Problem> problems_ ABSL_GUARDED_BY(mu_);
  SyncCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_API_SYNC_H_
