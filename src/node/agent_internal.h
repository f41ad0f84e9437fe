// Helpers shared by the NodeAgent's source files (agent*.cc); not part of the agent's interface.
#ifndef TESSERA_NODE_AGENT_INTERNAL_H_
#define TESSERA_NODE_AGENT_INTERNAL_H_

#include <string>

#include "core/request.h"
#include "node/node_api.h"

namespace tessera::node {

// A pod's annotation, empty when it has none.
inline std::string Annotation(const NodePod& pod, const std::string& key) {
  auto it = pod.annotations.find(key);
  return it == pod.annotations.end() ? std::string() : it->second;
}

// Why a container's part of an assignment cannot be applied for a vGPU without memory ("memoryMiB": 0, which
// the limits file would read as no limit at all); empty when every vGPU has some. Defined in
// agent_allocate.cc.
std::string ZeroMemory(const core::ContainerAssignment& container);

// Where a pod stands in Allocate's queue: its tessera.dev/assigned-at, but never before the pod was created
// (metadata.creationTimestamp, which the API server sets and no one can write), so that a forged old date
// cannot put a pod ahead of the pods bound before it was created. RFC 3339 with milliseconds, so that the
// strings sort as the times do. Defined in agent_allocate.cc.
std::string QueueTime(const NodePod& pod);

}  // namespace tessera::node

#endif  // TESSERA_NODE_AGENT_INTERNAL_H_
