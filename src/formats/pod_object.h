// The parts of a Kubernetes Pod object (API JSON, as the API server and kube-scheduler send it) that Tessera
// reads: identity, annotations, containers' resources, where it runs and in what state.
//
//   absl::StatusOr<PodObject> pod = ParsePodObject(json);
//   if (!pod.ok()) return BadRequest(pod.status().message());
//   absl::StatusOr<core::PodRequest> req = core::ParsePodRequest(pod->spec);
//
// Quantities are read as the API writes them (strings); numbers are accepted too. Unknown fields are ignored,
// as Kubernetes clients do; a field of the wrong type is an error that names it.
//
// Thread-safety: pure functions.
#ifndef TESSERA_FORMATS_POD_OBJECT_H_
#define TESSERA_FORMATS_POD_OBJECT_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/request_parser.h"
#include "nlohmann/json_fwd.hpp"

namespace tessera::formats {

struct PodObject {
  core::PodSpec spec;          // namespace, name, uid, annotations, containers (limits, requests, privileged)
  std::string node_name;       // spec.nodeName; empty while unscheduled
  std::string scheduler_name;  // spec.schedulerName
  std::string phase;           // status.phase: Pending, Running, Succeeded, Failed, Unknown
  std::string resource_version;
  std::string creation_timestamp;  // metadata.creationTimestamp (RFC 3339), as given
  bool deleting = false;           // metadata.deletionTimestamp is set

  // Succeeded or Failed: its containers have stopped and hold no GPU.
  bool terminated() const { return phase == "Succeeded" || phase == "Failed"; }
  std::string key() const { return spec.ns + "/" + spec.name; }
};

absl::StatusOr<PodObject> ParsePodObject(const nlohmann::json& pod);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_POD_OBJECT_H_
