#include "node/region_jobs.h"

#include <atomic>
#include <thread>

namespace tessera::node {

struct RegionJobs::State {
  std::chrono::steady_clock::time_point started;
  std::atomic<bool> done{false};
  std::atomic<int> result{0};
};

RegionJobs::RegionJobs(std::chrono::milliseconds timeout, const k8s::Clock* clock)
    : timeout_(timeout), clock_(clock) {}

std::chrono::steady_clock::time_point RegionJobs::Now() const {
  return clock_ != nullptr ? clock_->Steady() : std::chrono::steady_clock::now();
}

bool RegionJobs::Start(const std::string& tenant, std::shared_ptr<hook::SharedRegion> region, Job job) {
  auto state = std::make_shared<State>();
  {
    MutexLock lock(&mu_);
    if (running_.count(tenant) > 0) return false;
    state->started = Now();
    running_[tenant] = state;
  }
  // Detached: the thread holds only the region and its own state, never the agent.
  std::thread([state, region = std::move(region), job = std::move(job)] {
    state->result.store(job(*region));
    state->done.store(true);
  }).detach();
  return true;
}

RegionJobs::Swept RegionJobs::Sweep() {
  Swept out;
  const auto now = Now();
  MutexLock lock(&mu_);
  for (auto it = running_.begin(); it != running_.end();) {
    const State& s = *it->second;
    if (s.done.load()) {
      out.finished[it->first] = s.result.load();
      it = running_.erase(it);
    } else if (now - s.started >= timeout_) {
      out.stuck.push_back(it->first);
      abandoned_.push_back(it->second);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(abandoned_, [](const std::shared_ptr<State>& s) { return s->done.load(); });
  return out;
}

bool RegionJobs::WaitIdle(std::chrono::milliseconds max) const {
  const auto deadline = std::chrono::steady_clock::now() + max;
  while (true) {
    bool idle = true;
    {
      MutexLock lock(&mu_);
      for (const auto& [tenant, s] : running_) idle &= s->done.load();
    }
    if (idle) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool RegionJobs::Running(const std::string& tenant) const {
  MutexLock lock(&mu_);
  return running_.count(tenant) > 0;
}

int RegionJobs::abandoned() const {
  MutexLock lock(&mu_);
  int n = 0;
  for (const auto& s : abandoned_) n += s->done.load() ? 0 : 1;
  return n;
}

}  // namespace tessera::node
