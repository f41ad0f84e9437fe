#include "k8s/informer.h"

#include <random>

#include "common/log.h"
#include "core/strings.h"
#include "k8s/api_status.h"

namespace tessera::k8s {

Informer::Informer(KubeApi& api, ResourceType type, InformerOptions options, InformerHandlers handlers)
    : api_(api), type_(std::move(type)), options_(std::move(options)), handlers_(std::move(handlers)) {}

Informer::~Informer() {
  Stop();
}

void Informer::Start() {
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

void Informer::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  MutexLock lock(&mu_);
  stopped_ = true;
  synced_cv_.SignalAll();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) const {
  const auto until = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!synced_ && !stopped_) {
    if (!synced_cv_.WaitUntil(&mu_, until)) break;
  }
  return synced_;
}

bool Informer::HasSynced() const {
  MutexLock lock(&mu_);
  return synced_;
}

std::shared_ptr<const Json> Informer::Get(std::string_view key) const {
  MutexLock lock(&mu_);
  auto it = store_.find(std::string(key));
  return it == store_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const Json>> Informer::Items() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const Json>> out;
  out.reserve(store_.size());
  for (const auto& [k, v] : store_) out.push_back(v);
  return out;
}

size_t Informer::size() const {
  MutexLock lock(&mu_);
  return store_.size();
}

std::string Informer::resource_version() const {
  MutexLock lock(&mu_);
  return resource_version_;
}

InformerStats Informer::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

absl::Status Informer::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

absl::Status Informer::Relist(const std::stop_token& stop) {
  ListOptions lo;
  lo.label_selector = options_.label_selector;
  lo.field_selector = options_.field_selector;
  lo.limit = options_.page_size;
  lo.stop = stop;
  absl::StatusOr<ObjectList> list = api_.ListAll(type_, options_.ns, lo);
  if (!list.ok()) return list.status();

  std::unordered_map<std::string, std::shared_ptr<const Json>> fresh;
  std::vector<std::shared_ptr<const Json>> order;
  fresh.reserve(list->items.size());
  order.reserve(list->items.size());
  for (Json& item : list->items) {
    auto obj = std::make_shared<const Json>(std::move(item));
    std::string key = ObjectKey(*obj);
    order.push_back(obj);
    fresh[key] = obj;
  }
  std::unordered_map<std::string, std::shared_ptr<const Json>> old;
  {
    MutexLock lock(&mu_);
    old.swap(store_);
    store_ = fresh;
    resource_version_ = list->resource_version;
    ++stats_.lists;
  }
  int64_t vanished = 0;
  for (const auto& obj : order) {
    auto it = old.find(ObjectKey(*obj));
    if (it == old.end()) {
      if (handlers_.on_add) handlers_.on_add(*obj);
    } else if (Uid(*it->second) != Uid(*obj)) {
      // Deleted and created again under the same name while the watch was down: two objects, not one
      // updated (kube-scheduler's cache tells them apart the same way). As an update, the old one's UID
      // stayed with whoever counts by UID (the scheduler's ledger, the DRA controller) and so did its share.
      ++vanished;
      if (handlers_.on_delete) handlers_.on_delete(*it->second, /*final_state_unknown=*/true);
      if (handlers_.on_add) handlers_.on_add(*obj);
    } else if (ResourceVersion(*it->second) != ResourceVersion(*obj)) {
      if (handlers_.on_update) handlers_.on_update(*it->second, *obj);
    }
  }
  for (const auto& [key, obj] : old) {
    if (fresh.count(key) != 0) continue;
    ++vanished;
    if (handlers_.on_delete) handlers_.on_delete(*obj, /*final_state_unknown=*/true);
  }
  {
    MutexLock lock(&mu_);
    stats_.synthesized_deletes += vanished;
    last_error_ = absl::OkStatus();
  }
  // The handler first, then "synced": whoever WaitForSync() wakes finds what on_synced did done.
  if (handlers_.on_synced) handlers_.on_synced();
  {
    MutexLock lock(&mu_);
    synced_ = true;
    synced_cv_.SignalAll();
  }
  return absl::OkStatus();
}

void Informer::Apply(WatchEvent&& event) {
  std::string rv = ResourceVersion(event.object);
  if (event.type == WatchEvent::Type::kBookmark) {
    MutexLock lock(&mu_);
    if (!rv.empty()) resource_version_ = rv;
    ++stats_.bookmarks;
    return;
  }
  ++watch_events_;
  std::string key = ObjectKey(event.object);
  auto obj = std::make_shared<const Json>(std::move(event.object));
  std::shared_ptr<const Json> old;
  {
    MutexLock lock(&mu_);
    ++stats_.events;
    if (!rv.empty()) resource_version_ = rv;
    auto it = store_.find(key);
    if (event.type == WatchEvent::Type::kDeleted) {
      if (it == store_.end()) return;  // never seen: nothing to tell
      store_.erase(it);
    } else {
      if (it != store_.end()) {
        old = it->second;
        it->second = obj;
      } else {
        store_.emplace(key, obj);
      }
    }
  }
  if (event.type == WatchEvent::Type::kDeleted) {
    if (handlers_.on_delete) handlers_.on_delete(*obj, /*final_state_unknown=*/false);
  } else if (old && Uid(*old) != Uid(*obj)) {
    // Another object under the same name (its deletion not seen): the old one is gone.
    if (handlers_.on_delete) handlers_.on_delete(*old, /*final_state_unknown=*/true);
    if (handlers_.on_add) handlers_.on_add(*obj);
  } else if (old) {
    if (handlers_.on_update) handlers_.on_update(*old, *obj);
  } else {
    if (handlers_.on_add) handlers_.on_add(*obj);
  }
}

void Informer::Run(std::stop_token stop) {
  Backoff backoff(options_.backoff, options_.seed != 0 ? options_.seed : std::random_device{}());
  std::mt19937_64 rng(options_.seed != 0 ? options_.seed + 1 : std::random_device{}());
  bool need_list = true;
  const std::string what = StrCat(type_.GroupResource(), options_.ns.empty() ? "" : " in ", options_.ns);
  while (!stop.stop_requested()) {
    if (need_list) {
      absl::Status s = Relist(stop);
      if (stop.stop_requested()) break;
      if (!s.ok()) {
        auto wait = backoff.Next();
        {
          MutexLock lock(&mu_);
          ++stats_.errors;
          last_error_ = s;
        }
        log::Warn("informer: list failed; retrying",
                  {{"resource", what}, {"error", Message(s)}, {"retry_ms", StrCat(wait.count())}});
        if (!SleepFor(wait, stop)) break;
        continue;
      }
      need_list = false;
      backoff.Reset();
    }

    WatchOptions wo;
    wo.resource_version = resource_version();
    wo.label_selector = options_.label_selector;
    wo.field_selector = options_.field_selector;
    wo.allow_bookmarks = true;
    int64_t t = options_.watch_timeout.count();
    if (t > 0) wo.timeout_seconds = t + static_cast<int64_t>(rng() % static_cast<uint64_t>(t));
    wo.stop = stop;
    {
      MutexLock lock(&mu_);
      ++stats_.watches;
    }
    watch_events_ = 0;
    const auto started = options_.clock->Steady();
    absl::Status s = api_.Watch(type_, options_.ns, wo, [this](WatchEvent&& e) { Apply(std::move(e)); });
    if (stop.stop_requested()) break;
    if (IsGone(s)) {
      {
        MutexLock lock(&mu_);
        ++stats_.gone;
      }
      log::Info("informer: resourceVersion too old; listing again",
                {{"resource", what}, {"error", Message(s)}});
      need_list = true;
      continue;
    }
    bool lasted = options_.clock->Steady() - started > std::chrono::seconds(1);
    if (s.ok() && (watch_events_ > 0 || lasted)) {
      backoff.Reset();  // the server ended a healthy watch: watch again at once
      continue;
    }
    auto wait = backoff.Next();
    if (!s.ok()) {
      MutexLock lock(&mu_);
      ++stats_.errors;
      last_error_ = s;
    }
    log::Info("informer: watch ended; reconnecting",
              {{"resource", what},
               {"error", s.ok() ? std::string("closed at once") : Message(s)},
               {"retry_ms", StrCat(wait.count())}});
    if (!SleepFor(wait, stop)) break;
  }
}

}  // namespace tessera::k8s
