#include "kubelet/pod_resources_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "core/strings.h"
#include "kubelet/pod_resources_convert.h"
#include "podresources-v1-api.grpc.pb.h"

namespace tessera::kubelet {

namespace {

template <typename Proto>
ContainerDevices DevicesFromProto(const Proto& d) {
  ContainerDevices out;
  out.resource_name = d.resource_name();
  out.device_ids.assign(d.device_ids().begin(), d.device_ids().end());
  for (const ::v1::NUMANode& n : d.topology().nodes()) out.numa_nodes.push_back(n.id());
  return out;
}

void DevicesToProto(const ContainerDevices& d, ::v1::ContainerDevices* out) {
  out->set_resource_name(d.resource_name);
  for (const std::string& id : d.device_ids) out->add_device_ids(id);
  for (int64_t n : d.numa_nodes) out->mutable_topology()->add_nodes()->set_id(n);
}

ContainerMemory MemoryFromProto(const ::v1::ContainerMemory& m) {
  ContainerMemory out;
  out.memory_type = m.memory_type();
  out.size = m.size();
  for (const ::v1::NUMANode& n : m.topology().nodes()) out.numa_nodes.push_back(n.id());
  return out;
}

void MemoryToProto(const ContainerMemory& m, ::v1::ContainerMemory* out) {
  out->set_memory_type(m.memory_type);
  out->set_size(m.size);
  for (int64_t n : m.numa_nodes) out->mutable_topology()->add_nodes()->set_id(n);
}

}  // namespace

std::vector<std::string> ContainerResources::DeviceIds(const std::string& resource) const {
  std::vector<std::string> out;
  for (const ContainerDevices& d : devices) {
    if (d.resource_name == resource) out.insert(out.end(), d.device_ids.begin(), d.device_ids.end());
  }
  return out;
}

PodResources FromProto(const ::v1::PodResources& p) {
  PodResources out;
  out.name = p.name();
  out.ns = p.namespace_();
  for (const ::v1::ContainerResources& c : p.containers()) {
    ContainerResources ctr;
    ctr.name = c.name();
    for (const ::v1::ContainerDevices& d : c.devices()) ctr.devices.push_back(DevicesFromProto(d));
    ctr.cpu_ids.assign(c.cpu_ids().begin(), c.cpu_ids().end());
    for (const ::v1::ContainerMemory& m : c.memory()) ctr.memory.push_back(MemoryFromProto(m));
    out.containers.push_back(std::move(ctr));
  }
  return out;
}

AllocatableResources FromProto(const ::v1::AllocatableResourcesResponse& r) {
  AllocatableResources out;
  for (const ::v1::ContainerDevices& d : r.devices()) out.devices.push_back(DevicesFromProto(d));
  out.cpu_ids.assign(r.cpu_ids().begin(), r.cpu_ids().end());
  for (const ::v1::ContainerMemory& m : r.memory()) out.memory.push_back(MemoryFromProto(m));
  return out;
}

::v1::PodResources ToProto(const PodResources& p) {
  ::v1::PodResources out;
  out.set_name(p.name);
  out.set_namespace_(p.ns);
  for (const ContainerResources& c : p.containers) {
    ::v1::ContainerResources* ctr = out.add_containers();
    ctr->set_name(c.name);
    for (const ContainerDevices& d : c.devices) DevicesToProto(d, ctr->add_devices());
    for (int64_t cpu : c.cpu_ids) ctr->add_cpu_ids(cpu);
    for (const ContainerMemory& m : c.memory) MemoryToProto(m, ctr->add_memory());
  }
  return out;
}

::v1::AllocatableResourcesResponse ToProto(const AllocatableResources& r) {
  ::v1::AllocatableResourcesResponse out;
  for (const ContainerDevices& d : r.devices) DevicesToProto(d, out.add_devices());
  for (int64_t cpu : r.cpu_ids) out.add_cpu_ids(cpu);
  for (const ContainerMemory& m : r.memory) MemoryToProto(m, out.add_memory());
  return out;
}

struct PodResourcesClient::Stub {
  std::unique_ptr<::v1::PodResourcesLister::Stub> stub;
};

PodResourcesClient::PodResourcesClient(std::string socket_path, std::chrono::milliseconds timeout)
    : socket_path_(std::move(socket_path)), timeout_(timeout) {}

PodResourcesClient::~PodResourcesClient() = default;

absl::StatusOr<std::unique_ptr<PodResourcesClient>> PodResourcesClient::Connect(const std::string& socket_path,
                                                                                std::chrono::milliseconds timeout) {
  if (socket_path.empty() || socket_path[0] != '/') {
    return absl::InvalidArgumentError(
        StrCat("the pod-resources socket \"", socket_path, "\" must be an absolute path, e.g. ",
               kPodResourcesSocket));
  }
  std::unique_ptr<PodResourcesClient> client(new PodResourcesClient(socket_path, timeout));
  client->stub_ = std::make_unique<Stub>();
  client->stub_->stub = ::v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials()));
  return client;
}

absl::Status PodResourcesClient::Error(std::string_view call, int code, std::string_view message) const {
  std::string hint;
  if (code == static_cast<int>(grpc::StatusCode::UNAVAILABLE)) {
    hint = StrCat("; is the kubelet running, and is ", socket_path_,
                  " mounted into the tessera-node pod (hostPath /var/lib/kubelet/pod-resources)?");
  } else if (code == static_cast<int>(grpc::StatusCode::UNIMPLEMENTED)) {
    hint = "; the kubelet is too old for pod-resources v1 (Kubernetes 1.20+ serves it; Get needs 1.27+)";
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      StrCat("pod-resources ", call, " at ", socket_path_, " failed: ", message, hint));
}

absl::StatusOr<std::vector<PodResources>> PodResourcesClient::List() const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
  ::v1::ListPodResourcesRequest request;
  ::v1::ListPodResourcesResponse response;
  grpc::Status s = stub_->stub->List(&ctx, request, &response);
  if (!s.ok()) return Error("List", s.error_code(), s.error_message());
  std::vector<PodResources> out;
  for (const ::v1::PodResources& p : response.pod_resources()) out.push_back(FromProto(p));
  return out;
}

absl::StatusOr<PodResources> PodResourcesClient::Get(const std::string& ns, const std::string& name) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
  ::v1::GetPodResourcesRequest request;
  request.set_pod_namespace(ns);
  request.set_pod_name(name);
  ::v1::GetPodResourcesResponse response;
  grpc::Status s = stub_->stub->Get(&ctx, request, &response);
  if (!s.ok() && s.error_code() == grpc::StatusCode::UNKNOWN &&
      s.error_message().find("not found") != std::string::npos) {
    // The kubelet answers an unknown pod with a plain error ("pod <name> in namespace <ns> not found").
    return absl::NotFoundError(StrCat("pod-resources Get: the kubelet has no pod ", ns, "/", name, " (",
                                      s.error_message(), ")"));
  }
  if (!s.ok()) return Error(StrCat("Get ", ns, "/", name), s.error_code(), s.error_message());
  return FromProto(response.pod_resources());
}

absl::StatusOr<AllocatableResources> PodResourcesClient::GetAllocatableResources() const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
  ::v1::AllocatableResourcesRequest request;
  ::v1::AllocatableResourcesResponse response;
  grpc::Status s = stub_->stub->GetAllocatableResources(&ctx, request, &response);
  if (!s.ok()) return Error("GetAllocatableResources", s.error_code(), s.error_message());
  return FromProto(response);
}

}  // namespace tessera::kubelet
