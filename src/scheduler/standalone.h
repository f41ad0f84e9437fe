// The standalone mode of tessera-scheduler (--cluster-file): a static cluster from a file and no API server.
// Binds are recorded in memory; pods leave through POST /standalone/release. For demos, for trying policies
// with a real kube-scheduler-shaped client, and for tests.
//
//   absl::Status loaded = LoadClusterFile(cache, "examples/cluster-small.yaml");
//   StandaloneBinder binder;
//   Extender extender(cache, binder, nullptr);
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SCHEDULER_STANDALONE_H_
#define TESSERA_SCHEDULER_STANDALONE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "scheduler/extender.h"

namespace tessera::scheduler {

class StandaloneBinder : public Binder {
 public:
  absl::Status Bind(const BindTarget& pod, const core::Placement& placement) override;
  absl::Status UpdateAssignment(const BindTarget& pod, const core::Placement& placement) override;

  // The assignment annotation each bound pod would carry, by "namespace/name".
  std::map<std::string, std::string> Assignments() const;
  void Forget(const std::string& key);

 private:
  mutable Mutex mu_;
  std::map<std::string, std::string> assignments_ ABSL_GUARDED_BY(mu_);
};

// --cluster-file: the nodes and quotas of a cluster file (YAML or JSON, docs/file-formats.md) into the cache.
// Errors name the file and what is wrong in it.
absl::Status LoadClusterFile(ClusterCache& cache, const std::string& path);

// POST /standalone/release {"PodUID": "...", "PodNamespace": "...", "PodName": "..."}: the pod is gone.
Response ReleaseStandalone(ClusterCache& cache, StandaloneBinder& binder, std::string_view body);

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_STANDALONE_H_
