// The three patch formats of the Kubernetes API, applied to JSON objects (for the fake API server).
//
//   absl::StatusOr<Json> out = ApplyPatch(pod, PatchKind::kStrategic, patch);
//
// - kMerge: RFC 7386 JSON merge patch (null deletes, objects merge, everything else replaces).
// - kJson: RFC 6902 JSON patch (add, remove, replace, move, copy, test).
// - kStrategic: Kubernetes' strategic merge patch for the fields Tessera and its tests use: lists of objects
//   merge by their patch merge key (containers, initContainers, env and volumes by name, volumeMounts by
//   mountPath, ports by containerPort, conditions and node addresses by type, ownerReferences by uid);
//   finalizers merge as a set; other lists replace; directives `$patch: replace|delete` (in maps and list
//   elements), `$retainKeys` and `$deleteFromPrimitiveList/FIELD` are honoured; `$setElementOrder/FIELD` is
//   accepted and ignored (new elements are appended).
//
// Errors: kInvalidArgument for a malformed patch (the API answers 400), kFailedPrecondition for a patch that
// cannot apply to this object (a failed `test`, a path that does not exist: the API answers 422).
//
// Thread-safety: pure functions.
#ifndef TESSERA_TOOLS_FAKE_APISERVER_PATCH_H_
#define TESSERA_TOOLS_FAKE_APISERVER_PATCH_H_

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tessera::fake {

enum class PatchKind { kMerge, kStrategic, kJson };

absl::StatusOr<nlohmann::json> ApplyPatch(const nlohmann::json& target, PatchKind kind,
                                          const nlohmann::json& patch);

}  // namespace tessera::fake

#endif  // TESSERA_TOOLS_FAKE_APISERVER_PATCH_H_
