// The object store's reads: lists (paginated over snapshots, continue tokens) and watches (history replay,
// bookmarks, the ends a watch can have).
#include <algorithm>
#include <mutex>

#include "absl/strings/escaping.h"
#include "core/strings.h"
#include "store.h"
#include "store_internal.h"

namespace tessera::fake {

namespace {

std::string_view TypeName(EventType t) {
  switch (t) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
  }
  return "MODIFIED";
}

std::string EncodeContinue(uint64_t snapshot, size_t next, uint64_t rv) {
  std::string raw = StrCat("{\"v\":\"tessera.fake/v1\",\"snapshot\":", snapshot,
                           ",\"next\":", static_cast<int64_t>(next), ",\"rv\":", rv, "}");
  std::string out;
  absl::WebSafeBase64Escape(raw, &out);
  return out;
}

bool DecodeContinue(const std::string& token, uint64_t* snapshot, size_t* next) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return false;
  Json j = Json::parse(raw, nullptr, false);
  if (!j.is_object() || !j.contains("snapshot") || !j.contains("next")) return false;
  if (!j["snapshot"].is_number_unsigned() || !j["next"].is_number_unsigned()) return false;
  *snapshot = j["snapshot"].get<uint64_t>();
  *next = j["next"].get<size_t>();
  return true;
}

}  // namespace

ListResult ObjectStore::List(Resource& r, std::string_view ns, const ListQuery& query) {
  ListResult result;
  if (query.limit < 0) {
    result.status = Outcome::Fail(400, "BadRequest", "limit must not be negative");
    return result;
  }
  if (!query.continue_token.empty()) {
    uint64_t id = 0;
    size_t next = 0;
    if (!DecodeContinue(query.continue_token, &id, &next)) {
      result.status =
          Outcome::Fail(400, "BadRequest", "continue key is not valid: not a token this server issued");
      return result;
    }
    std::shared_ptr<const Snapshot> snap;
    {
      std::lock_guard<std::mutex> lock(snap_mu_);
      auto it = snapshots_.find(id);
      if (it != snapshots_.end() &&
          std::chrono::steady_clock::now() - it->second->created < options_.continue_ttl) {
        snap = it->second;
      }
    }
    if (!snap) {
      result.status = Outcome::Fail(410, "Expired",
                                    "The provided continue parameter is too old to display a consistent list "
                                    "result. You can start a new list "
                                    "without the continue parameter.");
      return result;
    }
    size_t limit = query.limit > 0 ? static_cast<size_t>(query.limit) : snap->items.size();
    size_t end = std::min(snap->items.size(), next + limit);
    for (size_t i = std::min(next, end); i < end; ++i) result.items.push_back(snap->items[i]);
    result.resource_version = snap->rv;
    if (end < snap->items.size()) {
      result.continue_token = EncodeContinue(id, end, snap->rv);
      result.remaining = static_cast<int64_t>(snap->items.size() - end);
    }
    return result;
  }
  absl::StatusOr<LabelSelector> label = LabelSelector::Parse(query.label_selector);
  if (!label.ok()) {
    result.status = Outcome::Fail(400, "BadRequest", std::string(label.status().message()));
    return result;
  }
  absl::StatusOr<FieldSelector> field = FieldSelector::Parse(query.field_selector);
  if (field.ok()) {
    if (absl::Status s = CheckFields(r, *field); !s.ok()) field = s;
  }
  if (!field.ok()) {
    result.status = Outcome::Fail(400, "BadRequest", std::string(field.status().message()));
    return result;
  }
  std::string scope = r.info.namespaced && !ns.empty() ? StrCat(ns, "/") : "";
  auto wanted = [&](const std::string& key, const Json& obj) {
    if (!scope.empty() && !key.starts_with(scope)) return false;
    if (!label->empty()) {
      const Json* labels = nullptr;
      if (auto m = obj.find("metadata"); m != obj.end()) {
        if (auto l = m->find("labels"); l != m->end()) labels = &*l;
      }
      if (!label->Matches(labels ? *labels : Json())) return false;
    }
    return field->empty() || field->Matches(obj);
  };
  std::vector<ObjectPtr> items;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    result.resource_version = rv_.load();
    std::optional<std::string> node = field->EqualityValue("spec.nodeName");
    if (node && r.info.resource == "pods" && r.info.group.empty()) {
      auto it = r.by_node.find(*node);
      if (it != r.by_node.end()) {
        for (const std::string& key : it->second) {
          const ObjectPtr& obj = r.objects.at(key);
          if (wanted(key, *obj)) items.push_back(obj);
        }
      }
    } else {
      auto it = scope.empty() ? r.objects.begin() : r.objects.lower_bound(scope);
      for (; it != r.objects.end(); ++it) {
        if (!scope.empty() && !it->first.starts_with(scope)) break;
        if (wanted(it->first, *it->second)) items.push_back(it->second);
      }
    }
  }
  size_t limit = static_cast<size_t>(query.limit);
  if (limit == 0 || items.size() <= limit) {
    result.items = std::move(items);
    return result;
  }
  result.items.assign(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(limit));
  result.remaining = static_cast<int64_t>(items.size() - limit);
  auto snap = std::make_shared<Snapshot>();
  snap->items = std::move(items);
  snap->rv = result.resource_version;
  snap->created = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(snap_mu_);
  uint64_t id = next_snapshot_++;
  snapshots_.emplace(id, std::move(snap));
  // Keep the newest max_snapshots.
  while (snapshots_.size() > options_.max_snapshots) {
    uint64_t oldest = UINT64_MAX;
    for (const auto& [k, v] : snapshots_) oldest = std::min(oldest, k);
    snapshots_.erase(oldest);
  }
  result.continue_token = EncodeContinue(id, limit, result.resource_version);
  return result;
}

std::variant<Outcome, std::unique_ptr<WatchCursor>> ObjectStore::Watch(Resource& r, std::string_view ns,
                                                                       const WatchQuery& query) {
  std::unique_ptr<WatchCursor> w(new WatchCursor());
  absl::StatusOr<LabelSelector> label = LabelSelector::Parse(query.label_selector);
  if (!label.ok()) return Outcome::Fail(400, "BadRequest", std::string(label.status().message()));
  absl::StatusOr<FieldSelector> field = FieldSelector::Parse(query.field_selector);
  if (field.ok()) {
    if (absl::Status s = CheckFields(r, *field); !s.ok()) field = s;
  }
  if (!field.ok()) return Outcome::Fail(400, "BadRequest", std::string(field.status().message()));
  uint64_t from = 0;
  bool initial = query.resource_version.empty() || query.resource_version == "0";
  if (!initial) {
    int64_t v = 0;
    if (!ParseInt(query.resource_version, &v) || v < 0) {
      return Outcome::Fail(400, "BadRequest", StrCat("invalid resource version: ", query.resource_version));
    }
    from = static_cast<uint64_t>(v);
  }
  w->store_ = this;
  w->res_ = &r;
  w->ns_ = r.info.namespaced ? std::string(ns) : "";
  w->label_ = std::move(*label);
  w->field_ = std::move(*field);
  w->filtered_ = !w->ns_.empty() || !w->label_.empty() || !w->field_.empty();
  w->bookmarks_ = query.bookmarks;
  auto now = std::chrono::steady_clock::now();
  if (query.timeout.count() > 0) w->deadline_ = now + query.timeout;
  w->next_bookmark_ = now + options_.bookmark_interval;
  w->drop_epoch_ = drop_epoch_.load();
  w->expire_epoch_ = expire_epoch_.load();
  {
    std::lock_guard<std::mutex> lock(inject_mu_);
    w->inject_seq_ = inject_seq_;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  if (initial) {
    w->cursor_ = rv_.load();
    for (const auto& [key, obj] : r.objects) {
      if (w->Wanted(*obj)) w->initial_.push_back(obj);
    }
  } else {
    if (from < r.floor) {
      return Outcome::Fail(410, "Expired",
                           StrCat("too old resource version: ", from, " (", r.floor + 1, ")"));
    }
    w->cursor_ = from;
  }
  ++open_watches_;
  return w;
}

// ---------------------------------------------------------------------------------------------------------------
// Watches

WatchCursor::~WatchCursor() {
  if (store_ != nullptr) --store_->open_watches_;
}

bool WatchCursor::Wanted(const Json& object) const {
  if (!filtered_) return true;
  if (!ns_.empty() && Meta(object, "namespace") != ns_) return false;
  if (!label_.empty()) {
    const Json* labels = nullptr;
    if (auto m = object.find("metadata"); m != object.end()) {
      if (auto l = m->find("labels"); l != m->end()) labels = &*l;
    }
    if (!label_.Matches(labels ? *labels : Json())) return false;
  }
  return field_.empty() || field_.Matches(object);
}

namespace {

void AppendLine(std::string_view type, const Json& object, std::string* out) {
  StrAppend(out, "{\"type\":\"", type, "\",\"object\":", object.dump(), "}\n");
}

std::string StatusJson(int code, std::string_view reason, std::string_view message) {
  Json s = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", Json::object()},
            {"status", "Failure"}, {"message", message}, {"reason", reason},
            {"code", code}};
  return s.dump();
}

}  // namespace

void WatchCursor::AppendEvent(const HistoryEvent& e, std::string* out) const {
  if (!filtered_) {
    std::call_once(e.once, [&e] { AppendLine(TypeName(e.type), *e.object, &e.line); });
    out->append(e.line);
    return;
  }
  bool now_wanted = Wanted(*e.object);
  switch (e.type) {
    case EventType::kAdded:
      if (now_wanted) AppendLine("ADDED", *e.object, out);
      return;
    case EventType::kDeleted:
      if (now_wanted) AppendLine("DELETED", *e.object, out);
      return;
    case EventType::kModified: {
      bool was_wanted = e.old && Wanted(*e.old);
      if (now_wanted && was_wanted) {
        AppendLine("MODIFIED", *e.object, out);
      } else if (now_wanted) {
        AppendLine("ADDED", *e.object, out);
      } else if (was_wanted) {
        // Left the selection: the watcher sees it deleted, in its old state at the new resourceVersion.
        Json gone = *e.old;
        gone["metadata"]["resourceVersion"] = std::to_string(e.rv);
        AppendLine("DELETED", gone, out);
      }
      return;
    }
  }
}

WatchCursor::Step WatchCursor::Next(std::chrono::milliseconds max_wait, std::string* out) {
  using std::chrono::steady_clock;
  ObjectStore& store = *store_;
  Resource& r = *res_;
  if (initial_pos_ < initial_.size()) {
    size_t end = std::min(initial_.size(), initial_pos_ + 256);
    for (; initial_pos_ < end; ++initial_pos_) AppendLine("ADDED", *initial_[initial_pos_], out);
    if (initial_pos_ == initial_.size()) initial_.clear();
    return Step::kMore;
  }
  std::vector<std::shared_ptr<const HistoryEvent>> batch;
  uint64_t bookmark_rv = 0;
  {
    std::unique_lock<std::mutex> lock(r.mu);
    auto pending = [&] {
      return (!r.history.empty() && r.history.back()->rv > cursor_) || store.stopping_.load() ||
             store.drop_epoch_.load() != drop_epoch_ || store.expire_epoch_.load() != expire_epoch_ ||
             store.inject_seq_atomic() != inject_seq_ || cursor_ < r.floor;
    };
    auto now = steady_clock::now();
    auto until = std::min(deadline_, now + max_wait);
    if (bookmarks_) until = std::min(until, next_bookmark_);
    r.cv.wait_until(lock, until, pending);
    if (store.stopping_.load()) return Step::kEnd;
    if (store.drop_epoch_.load() != drop_epoch_) return Step::kAbort;
    if (store.expire_epoch_.load() != expire_epoch_) {
      StrAppend(out, "{\"type\":\"ERROR\",\"object\":",
                StatusJson(410, "Expired", "too old resource version: the watch was expired by the test"),
                "}\n");
      return Step::kEnd;
    }
    if (store.inject_seq_atomic() != inject_seq_) {
      lock.unlock();
      std::lock_guard<std::mutex> il(store.inject_mu_);
      inject_seq_ = store.inject_seq_;
      out->append(store.inject_data_);
      return store.inject_drop_ ? Step::kAbort : Step::kMore;
    }
    if (cursor_ < r.floor) {
      // This watcher fell behind the history that is kept.
      StrAppend(
          out, "{\"type\":\"ERROR\",\"object\":",
          StatusJson(410, "Expired", StrCat("too old resource version: ", cursor_, " (", r.floor + 1, ")")),
          "}\n");
      return Step::kEnd;
    }
    auto first = std::upper_bound(
        r.history.begin(), r.history.end(), cursor_,
        [](uint64_t rv, const std::shared_ptr<const HistoryEvent>& e) { return rv < e->rv; });
    for (auto it = first; it != r.history.end() && batch.size() < 512; ++it) batch.push_back(*it);
    if (!batch.empty()) {
      cursor_ = batch.back()->rv;
    } else if (bookmarks_ && steady_clock::now() >= next_bookmark_) {
      // Every event of this resource up to the current resourceVersion has been sent.
      bookmark_rv = store.rv_.load();
      cursor_ = std::max(cursor_, bookmark_rv);
      next_bookmark_ = steady_clock::now() + store.options_.bookmark_interval;
    }
  }
  for (const auto& e : batch) AppendEvent(*e, out);
  if (bookmark_rv != 0) {
    StrAppend(out, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"", r.info.kind, "\",\"apiVersion\":\"",
              r.info.ApiVersion(), "\",\"metadata\":{\"resourceVersion\":\"", bookmark_rv, "\"}}}\n");
  }
  if (batch.empty() && bookmark_rv == 0 && steady_clock::now() >= deadline_) return Step::kEnd;
  return Step::kMore;
}

}  // namespace tessera::fake
