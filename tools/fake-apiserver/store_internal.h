// The fake API server's object store, inside: what its files (store.cc: the registry of resources;
// store_writes.cc: create, update, patch, delete, bind; store_list_watch.cc: lists, paginated snapshots and
// watches; store_faults.cc: fault injection) share. Only they include it.
#ifndef TESSERA_TOOLS_FAKE_APISERVER_STORE_INTERNAL_H_
#define TESSERA_TOOLS_FAKE_APISERVER_STORE_INTERNAL_H_

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/strings.h"
#include "store.h"

namespace tessera::fake {

enum class EventType { kAdded, kModified, kDeleted };

struct HistoryEvent {
  uint64_t rv = 0;
  EventType type = EventType::kAdded;
  ObjectPtr object;  // the new state (for DELETED: the last state, at the deletion's resourceVersion)
  ObjectPtr old;     // the state before (MODIFIED only)
  mutable std::once_flag once;
  mutable std::string line;  // the serialized event, made once for all unfiltered watchers
};

struct Resource {
  ResourceInfo info;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, ObjectPtr> objects;                        // by "ns/name" or "name"
  std::unordered_map<std::string, std::set<std::string>> by_node;  // pods by spec.nodeName
  std::deque<std::shared_ptr<const HistoryEvent>> history;
  uint64_t floor = 0;  // events at or below this resourceVersion may be gone
};

// "ns/name", or "name" for a cluster-scoped object.
inline std::string Key(std::string_view ns, std::string_view name) {
  return ns.empty() ? std::string(name) : StrCat(ns, "/", name);
}

// A string field of an object, or "" (absent, or not a string).
inline std::string Str(const Json& j, const char* field) {
  if (!j.is_object()) return "";
  auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// metadata.<field>, or "".
inline std::string Meta(const Json& obj, const char* field) {
  if (!obj.is_object()) return "";
  auto m = obj.find("metadata");
  return m == obj.end() ? std::string() : Str(*m, field);
}

// spec.nodeName, or "".
inline std::string NodeOf(const Json& obj) {
  if (!obj.is_object()) return "";
  auto s = obj.find("spec");
  return s == obj.end() ? std::string() : Str(*s, "nodeName");
}

}  // namespace tessera::fake

#endif  // TESSERA_TOOLS_FAKE_APISERVER_STORE_INTERNAL_H_
