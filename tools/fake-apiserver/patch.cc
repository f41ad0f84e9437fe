#include "patch.h"

#include <string>
#include <string_view>

#include "core/strings.h"

namespace tessera::fake {

namespace {

using Json = nlohmann::json;

// The patch merge key of a list field, "" when the list is replaced as a whole.
std::string_view MergeKey(std::string_view field) {
  if (field == "containers" || field == "initContainers" || field == "ephemeralContainers" ||
      field == "env" || field == "volumes" || field == "imagePullSecrets" || field == "resourceClaims") {
    return "name";
  }
  if (field == "volumeMounts") return "mountPath";
  if (field == "volumeDevices") return "devicePath";
  if (field == "ports") return "containerPort";
  if (field == "conditions" || field == "addresses") return "type";
  if (field == "ownerReferences") return "uid";
  if (field == "hostAliases") return "ip";
  return "";
}

bool MergesAsSet(std::string_view field) {
  return field == "finalizers";
}

struct Deleted {};

// Strips directives from a replacement value.
Json Clean(const Json& v) {
  if (v.is_object()) {
    Json out = Json::object();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.key().starts_with("$")) continue;
      out[it.key()] = Clean(it.value());
    }
    return out;
  }
  if (v.is_array()) {
    Json out = Json::array();
    for (const Json& e : v) {
      if (e.is_object() && e.contains("$patch")) continue;
      out.push_back(Clean(e));
    }
    return out;
  }
  return v;
}

absl::StatusOr<Json> MergeMap(const Json& original, const Json& patch, bool* deleted);

absl::StatusOr<Json> MergeList(std::string_view field, const Json& original, const Json& patch) {
  if (!patch.is_array())
    return absl::InvalidArgumentError(StrCat("strategic merge patch: ", field, " must be a list"));
  for (const Json& e : patch) {
    if (e.is_object() && e.value("$patch", "") == "replace") {
      return Clean(patch);  // `$patch: replace` in a list replaces the whole list
    }
  }
  if (MergesAsSet(field)) {
    Json out = original.is_array() ? original : Json::array();
    for (const Json& e : patch) {
      bool present = false;
      for (const Json& o : out) present = present || o == e;
      if (!present) out.push_back(e);
    }
    return out;
  }
  std::string_view key = MergeKey(field);
  if (key.empty()) return Clean(patch);
  Json out = original.is_array() ? original : Json::array();
  for (const Json& e : patch) {
    if (!e.is_object() || !e.contains(key)) {
      return absl::InvalidArgumentError(
          StrCat("strategic merge patch: every element of ", field, " needs its merge key \"", key, "\""));
    }
    const Json& k = e[std::string(key)];
    auto match = out.end();
    for (auto it = out.begin(); it != out.end(); ++it) {
      if (it->is_object() && it->contains(key) && (*it)[std::string(key)] == k) {
        match = it;
        break;
      }
    }
    if (e.value("$patch", "") == "delete") {
      if (match != out.end()) out.erase(match);
      continue;
    }
    if (match == out.end()) {
      out.push_back(Clean(e));
    } else {
      bool del = false;
      absl::StatusOr<Json> merged = MergeMap(*match, e, &del);
      if (!merged.ok()) return merged.status();
      *match = *merged;
    }
  }
  return out;
}

absl::StatusOr<Json> MergeMap(const Json& original, const Json& patch, bool* deleted) {
  *deleted = false;
  if (!patch.is_object()) return patch;
  if (patch.contains("$patch")) {
    std::string directive = patch.value("$patch", "");
    if (directive == "replace") return Clean(patch);
    if (directive == "delete") {
      *deleted = true;
      return Json();
    }
    if (directive != "merge") {
      return absl::InvalidArgumentError(
          StrCat("strategic merge patch: unknown $patch directive '", directive, "'"));
    }
  }
  Json out = original.is_object() ? original : Json::object();
  if (auto rk = patch.find("$retainKeys"); rk != patch.end()) {
    if (!rk->is_array())
      return absl::InvalidArgumentError("strategic merge patch: $retainKeys must be a list");
    Json kept = Json::object();
    for (auto it = out.begin(); it != out.end(); ++it) {
      bool keep = patch.contains(it.key());
      for (const Json& k : *rk) keep = keep || (k.is_string() && k.get<std::string>() == it.key());
      if (keep) kept[it.key()] = it.value();
    }
    out = kept;
  }
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& key = it.key();
    const Json& value = it.value();
    if (key.starts_with("$deleteFromPrimitiveList/")) {
      std::string field = key.substr(std::string_view("$deleteFromPrimitiveList/").size());
      if (out.contains(field) && out[field].is_array() && value.is_array()) {
        Json kept = Json::array();
        for (const Json& e : out[field]) {
          bool drop = false;
          for (const Json& d : value) drop = drop || d == e;
          if (!drop) kept.push_back(e);
        }
        out[field] = kept;
      }
      continue;
    }
    if (key.starts_with("$")) continue;  // $patch, $retainKeys, $setElementOrder/...
    if (value.is_null()) {
      out.erase(key);
    } else if (value.is_object()) {
      if (out.contains(key) && out[key].is_array()) {
        return absl::InvalidArgumentError(
            StrCat("strategic merge patch: ", key, " is a list in the object but a map in the patch"));
      }
      bool del = false;
      absl::StatusOr<Json> merged = MergeMap(out.contains(key) ? out[key] : Json::object(), value, &del);
      if (!merged.ok()) return merged.status();
      if (del) {
        out.erase(key);
      } else {
        out[key] = *merged;
      }
    } else if (value.is_array()) {
      absl::StatusOr<Json> merged = MergeList(key, out.contains(key) ? out[key] : Json::array(), value);
      if (!merged.ok()) return merged.status();
      out[key] = *merged;
    } else {
      out[key] = value;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Json> ApplyPatch(const Json& target, PatchKind kind, const Json& patch) {
  switch (kind) {
    case PatchKind::kMerge: {
      if (!patch.is_object()) {
        return absl::InvalidArgumentError(
            "a merge patch (application/merge-patch+json) must be a JSON object");
      }
      Json out = target;
      out.merge_patch(patch);
      return out;
    }
    case PatchKind::kStrategic: {
      if (!patch.is_object()) {
        return absl::InvalidArgumentError(
            "a strategic merge patch (application/strategic-merge-patch+json) must be a JSON object");
      }
      bool deleted = false;
      absl::StatusOr<Json> out = MergeMap(target, patch, &deleted);
      if (out.ok() && deleted)
        return absl::InvalidArgumentError("strategic merge patch: cannot delete the object");
      return out;
    }
    case PatchKind::kJson: {
      if (!patch.is_array()) {
        return absl::InvalidArgumentError(
            "a JSON patch (application/json-patch+json) must be a JSON array of operations");
      }
      for (const Json& op : patch) {
        if (!op.is_object() || !op.contains("op") || !op["op"].is_string() || !op.contains("path")) {
          return absl::InvalidArgumentError(
              StrCat("JSON patch: every operation needs \"op\" and \"path\": ", op.dump()));
        }
      }
      try {
        return target.patch(patch);
      } catch (const nlohmann::json::parse_error& e) {
        return absl::InvalidArgumentError(StrCat("JSON patch: ", e.what()));
      } catch (const nlohmann::json::exception& e) {
        return absl::FailedPreconditionError(StrCat("the JSON patch cannot be applied: ", e.what()));
      }
    }
  }
  return absl::InternalError("unknown patch kind");
}

}  // namespace tessera::fake
