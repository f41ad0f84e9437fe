// Helpers shared by the NodeAgent's source files (agent*.cc); not part of the agent's interface.
#ifndef TESSERA_NODE_AGENT_INTERNAL_H_
#define TESSERA_NODE_AGENT_INTERNAL_H_

#include <string>

#include "node/node_api.h"

namespace tessera::node {

// A pod's annotation, empty when it has none.
inline std::string Annotation(const NodePod& pod, const std::string& key) {
  auto it = pod.annotations.find(key);
  return it == pod.annotations.end() ? std::string() : it->second;
}

}  // namespace tessera::node

#endif  // TESSERA_NODE_AGENT_INTERNAL_H_
