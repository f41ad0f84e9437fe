// Informer: a local, always-current copy of one kind of object (list, then watch), with change handlers.
//
// It lists (in pages), calls the handlers for what changed since its last list (deletions included, for
// objects that vanished while it was not watching), reports "synced", then watches from the list's
// resourceVersion with bookmarks. When the stream ends it watches again from the last resourceVersion it saw,
// so no event is lost or repeated; when the server says that version is gone (410, as a status or as an ERROR
// event) it lists again. Broken streams and failed lists are retried with capped exponential backoff and
// jitter.
//
//   Informer pods(*api, kPods, {.field_selector = "spec.nodeName=gpu-1"},
//                 {.on_add = [](const Json& p) { ... },
//                  .on_update = [](const Json& old_pod, const Json& pod) { ... },
//                  .on_delete = [](const Json& last, bool final_state_unknown) { ... },
//                  .on_synced = [] { ... }});
//   pods.Start();
//   pods.WaitForSync(std::chrono::seconds(30));
//   std::shared_ptr<const Json> p = pods.Get("default/web-0");
//   pods.Stop();                                   // prompt, even on an idle watch
//
// Thread-safety: Get/Items/size/stats are safe from any thread. Handlers run one at a time on the informer's
// own thread, after the store holds the change; they may call Get and Items but must not call Stop.
#ifndef TESSERA_K8S_INFORMER_H_
#define TESSERA_K8S_INFORMER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "k8s/backoff.h"
#include "k8s/kube_api.h"

namespace tessera::k8s {

struct InformerOptions {
  std::string ns;  // "" for every namespace
  std::string label_selector;
  std::string field_selector;
  int64_t page_size = 500;  // list page size (0: one reply)
  BackoffPolicy backoff;
  // Each watch asks the server to end it after a random time in [watch_timeout, 2 * watch_timeout), so that
  // connections are renewed now and then (as client-go's reflector does).
  std::chrono::seconds watch_timeout{300};
  uint64_t seed = 0;  // 0: random
  // Time (whether a watch lasted long enough to reset the backoff); never null (common/clock.h).
  const Clock* clock = &RealClock();
};

struct InformerHandlers {
  std::function<void(const Json& object)> on_add;
  std::function<void(const Json& old_object, const Json& object)> on_update;
  // final_state_unknown: the object vanished across a relist, or another object (another UID) took its name
  // meanwhile (then on_add follows with the new one); `last` is the last state the informer saw.
  std::function<void(const Json& last, bool final_state_unknown)> on_delete;
  // After each full list has been applied to the store (the first one and every relist); the first call
  // returns before HasSynced() turns true.
  std::function<void()> on_synced;
};

struct InformerStats {
  int64_t lists = 0;      // full lists (the first one and relists)
  int64_t watches = 0;    // watch requests made
  int64_t events = 0;     // ADDED, MODIFIED, DELETED received
  int64_t bookmarks = 0;  // BOOKMARK received
  int64_t gone = 0;       // 410s that forced a relist
  int64_t errors = 0;     // failed lists and broken watches
  int64_t synthesized_deletes = 0;
};

class Informer {
 public:
  Informer(KubeApi& api, ResourceType type, InformerOptions options, InformerHandlers handlers);
  ~Informer();  // Stop()

  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Starts the informer's thread. Call once.
  void Start();
  // Stops the thread and waits for it: returns within a moment even when a watch is idle or a list is
  // running.
  void Stop();

  // Waits until the first list has been applied (true), or the timeout or Stop (false).
  bool WaitForSync(std::chrono::milliseconds timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  bool HasSynced() const ABSL_LOCKS_EXCLUDED(mu_);

  // The object of a key ("namespace/name", or "name" for cluster-scoped objects); null when absent.
  std::shared_ptr<const Json> Get(std::string_view key) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<const Json>> Items() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last resourceVersion seen (a list's, an event's or a bookmark's).
  std::string resource_version() const ABSL_LOCKS_EXCLUDED(mu_);
  InformerStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last list or watch error (OK when none since the last success).
  absl::Status last_error() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Handlers run without the lock (they may call Get and Items).
  void Run(std::stop_token stop) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Relist(const std::stop_token& stop) ABSL_LOCKS_EXCLUDED(mu_);
  void Apply(WatchEvent&& event) ABSL_LOCKS_EXCLUDED(mu_);

  KubeApi& api_;
  const ResourceType type_;
  const InformerOptions options_;
  const InformerHandlers handlers_;

  mutable Mutex mu_;           // the store and what is known about it
  mutable CondVar synced_cv_;  // signalled when synced_ or stopped_ is set
  std::unordered_map<std::string, std::shared_ptr<const Json>> store_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  InformerStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  int64_t watch_events_ = 0;  // events of the current watch; informer thread only

  std::jthread thread_;
};

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_INFORMER_H_
