// Conversions between the pod-resources v1 protobuf messages and the plain structs of pod_resources_client.h.
// Internal to src/kubelet and the fake kubelet (which serves the structs a test sets).
//
// Thread-safety: pure functions.
#ifndef TESSERA_KUBELET_POD_RESOURCES_CONVERT_H_
#define TESSERA_KUBELET_POD_RESOURCES_CONVERT_H_

#include "kubelet/pod_resources_client.h"
#include "podresources-v1-api.pb.h"

namespace tessera::kubelet {

PodResources FromProto(const ::v1::PodResources& p);
AllocatableResources FromProto(const ::v1::AllocatableResourcesResponse& r);
::v1::PodResources ToProto(const PodResources& p);
::v1::AllocatableResourcesResponse ToProto(const AllocatableResources& r);

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_POD_RESOURCES_CONVERT_H_
