// EventRecorder: core/v1 Events about objects, sent in the background and aggregated like kubectl shows them
// ("x5 over 3m"): a repeat of the same event (same object, type, reason and message) within the aggregation
// window raises the existing Event's count and lastTimestamp instead of creating a new Event.
//
//   EventRecorder events(*api, {.component = "tessera-scheduler", .instance = hostname});
//   events.Record(ReferenceTo(pod, kPods), "Warning", "FailedScheduling", "no node has 2 free GPUs");
//   events.Flush();   // tests: wait until everything queued was sent
//
// Record never blocks on the network; when the queue is full the event is dropped (and counted). Events are
// best effort: a failed send is logged and counted, never retried.
//
// Thread-safety: Record, Flush and stats are safe from any thread.
#ifndef TESSERA_K8S_EVENT_RECORDER_H_
#define TESSERA_K8S_EVENT_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "common/clock.h"
#include "common/mutex.h"
#include "k8s/kube_api.h"

namespace tessera::k8s {

struct EventRecorderOptions {
  std::string component = "tessera";
  std::string instance;  // reportingInstance
  std::string host;      // source.host
  size_t queue_limit = 1000;
  std::chrono::seconds aggregate_window{600};
  size_t cache_limit = 4096;  // remembered events for aggregation
  const Clock* clock = &RealClock();  // never null (common/clock.h)
};

struct EventRecorderStats {
  int64_t created = 0;
  int64_t aggregated = 0;  // repeats folded into an existing Event
  int64_t dropped = 0;     // queue full
  int64_t failed = 0;
};

class EventRecorder {
 public:
  EventRecorder(KubeApi& api, EventRecorderOptions options = {});
  ~EventRecorder();  // sends what is queued, then stops

  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // type: "Normal" or "Warning".
  void Record(const ObjectReference& object, std::string_view type, std::string_view reason,
              std::string message) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every event recorded so far has been sent (or failed).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  EventRecorderStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    ObjectReference object;
    std::string type, reason, message;
  };
  struct Sent {
    std::string ns, name;
    int32_t count = 0;
    std::chrono::system_clock::time_point first;
  };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Send(const Item& item) ABSL_LOCKS_EXCLUDED(mu_);  // the network call runs without the lock

  KubeApi& api_;
  const EventRecorderOptions options_;
  const Clock& clock_;

  mutable Mutex mu_;  // the queue and the counters
  CondVar cv_;        // signalled when the queue, busy_ or stopping_ changes
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // an item is being sent
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  EventRecorderStats stats_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, Sent> sent_;  // worker thread only

  std::thread thread_;
};

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_EVENT_RECORDER_H_
