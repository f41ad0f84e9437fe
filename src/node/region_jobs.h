// Work on tenants' shared regions, done where a tenant cannot make the agent wait.
//
// A tenant's processes can write its region, and so can hold the region's process-shared locks as long as
// they like. The agent therefore never takes a region lock on a thread that serves anyone else: each
// operation that may lock (adding a GPU entry, reclaiming dead processes' slots) runs on a thread of its own,
// at most one per tenant at a time. The caller never waits for it. A job still running after `timeout`
// means the tenant holds its lock: Sweep() names it, and the agent rebuilds that tenant's region (a new file,
// its processes told to reload). The stuck thread keeps the old region mapped until the lock is released; it
// touches nothing of the agent's, so it may outlive the agent.
//
//   RegionJobs jobs(std::chrono::seconds(2));
//   jobs.Start("uid/main", region, [](hook::SharedRegion& r) { return r.ReclaimDeadSlots(); });
//   RegionJobs::Swept s = jobs.Sweep();       // finished: results by tenant; stuck: tenants past the timeout
//
// Thread-safety: all methods may be called from any thread.
#ifndef TESSERA_NODE_REGION_JOBS_H_
#define TESSERA_NODE_REGION_JOBS_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "hook/common/region.h"
#include "k8s/clock.h"

namespace tessera::node {

class RegionJobs {
 public:
  using Job = std::function<int(hook::SharedRegion&)>;
  struct Swept {
    std::map<std::string, int> finished;  // tenant -> the job's result
    std::vector<std::string> stuck;       // tenants whose job has run longer than the timeout
  };

  // `clock` (may be null: the steady clock) measures how long jobs run.
  explicit RegionJobs(std::chrono::milliseconds timeout, const k8s::Clock* clock = nullptr);

  // Runs `job` on `region` on a thread of its own, unless a job of `tenant` is still running (then returns
  // false: the caller asks again at its next pass). `region` stays alive until the job ends.
  bool Start(const std::string& tenant, std::shared_ptr<hook::SharedRegion> region, Job job);
  // Results of finished jobs since the last sweep, and the tenants whose job is stuck. A stuck tenant is
  // reported once; its job is forgotten (a new one may start on a rebuilt region).
  Swept Sweep();
  // Waits (real time, at most `max`) until no job is running; true when none is. Never holds a lock while
  // waiting.
  bool WaitIdle(std::chrono::milliseconds max) const;
  // Whether a job of `tenant` is running.
  bool Running(const std::string& tenant) const;
  // Jobs forgotten while stuck whose threads are still blocked (for tests and metrics).
  int abandoned() const;

 private:
  struct State;
  std::chrono::steady_clock::time_point Now() const;

  const std::chrono::milliseconds timeout_;
  const k8s::Clock* const clock_;
  mutable Mutex mu_;  // guards the two maps below; held for no I/O and no region lock
  std::map<std::string, std::shared_ptr<State>> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<State>> abandoned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_REGION_JOBS_H_
