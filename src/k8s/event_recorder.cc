#include "k8s/event_recorder.h"

#include "common/log.h"
#include "core/strings.h"
#include "k8s/api_status.h"

namespace tessera::k8s {

EventRecorder::EventRecorder(KubeApi& api, EventRecorderOptions options)
    : api_(api), options_(std::move(options)), clock_(*options_.clock) {
  thread_ = std::thread([this] { Run(); });
}

EventRecorder::~EventRecorder() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void EventRecorder::Record(const ObjectReference& object, std::string_view type, std::string_view reason,
                           std::string message) {
  {
    MutexLock lock(&mu_);
    if (queue_.size() >= options_.queue_limit) {
      ++stats_.dropped;
      return;
    }
    queue_.push_back(Item{object, std::string(type), std::string(reason), std::move(message)});
  }
  cv_.SignalAll();
}

void EventRecorder::Flush() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || busy_) cv_.Wait(&mu_);
}

EventRecorderStats EventRecorder::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void EventRecorder::Run() {
  while (true) {
    Item item;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and everything was sent
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Send(item);
    {
      MutexLock lock(&mu_);
      busy_ = false;
    }
    cv_.SignalAll();
  }
}

void EventRecorder::Send(const Item& item) {
  const ObjectReference& o = item.object;
  std::string key = StrCat(o.uid, "\x1f", o.kind, "\x1f", o.ns, "\x1f", o.name, "\x1f", item.type, "\x1f",
                           item.reason, "\x1f", item.message);
  auto now = clock_.Now();
  auto it = sent_.find(key);
  if (it != sent_.end() && now - it->second.first < options_.aggregate_window) {
    Sent& s = it->second;
    Json patch = {{"count", s.count + 1}, {"lastTimestamp", FormatTime(now)}};
    absl::StatusOr<Json> r = api_.Patch(kEvents, s.ns, s.name, PatchType::kMerge, patch);
    if (r.ok()) {
      ++s.count;
      MutexLock lock(&mu_);
      ++stats_.aggregated;
      return;
    }
    if (!absl::IsNotFound(r.status())) {
      log::Warn("could not update an event", {{"event", s.name}, {"error", Message(r.status())}});
      MutexLock lock(&mu_);
      ++stats_.failed;
      return;
    }
    sent_.erase(it);  // the Event expired on the server: create a new one
  }
  EventSpec spec;
  spec.involved_object = o;
  spec.type = item.type;
  spec.reason = item.reason;
  spec.message = item.message;
  spec.component = options_.component;
  spec.host = options_.host;
  spec.reporting_instance = options_.instance;
  absl::StatusOr<Json> created = api_.CreateEvent(spec);
  if (!created.ok()) {
    log::Warn(
        "could not create an event",
        {{"object", ObjectKey(o.ns, o.name)}, {"reason", item.reason}, {"error", Message(created.status())}});
    MutexLock lock(&mu_);
    ++stats_.failed;
    return;
  }
  if (sent_.size() >= options_.cache_limit) sent_.clear();
  sent_[key] = Sent{Namespace(*created), Name(*created), 1, now};
  MutexLock lock(&mu_);
  ++stats_.created;
}

}  // namespace tessera::k8s
