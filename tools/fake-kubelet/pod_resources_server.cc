#include "pod_resources_server.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>

#include "core/strings.h"
#include "kubelet/pod_resources_convert.h"
#include "podresources-v1-api.grpc.pb.h"
#include "socket_file.h"

namespace tessera::kubelet {

class FakePodResourcesServer::Service final : public ::v1::PodResourcesLister::Service {
 public:
  explicit Service(FakePodResourcesServer* s) : s_(s) {}
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* response) override {
    MutexLock lock(&s_->mu_);
    for (const PodResources& p : s_->pods_) *response->add_pod_resources() = ToProto(p);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const ::v1::GetPodResourcesRequest* request,
                   ::v1::GetPodResourcesResponse* response) override {
    MutexLock lock(&s_->mu_);
    for (const PodResources& p : s_->pods_) {
      if (p.ns == request->pod_namespace() && p.name == request->pod_name()) {
        *response->mutable_pod_resources() = ToProto(p);
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::UNKNOWN, StrCat("pod ", request->pod_name(), " in namespace ",
                                                          request->pod_namespace(), " not found"));
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext*, const ::v1::AllocatableResourcesRequest*,
                                       ::v1::AllocatableResourcesResponse* response) override {
    MutexLock lock(&s_->mu_);
    *response = ToProto(s_->allocatable_);
    return grpc::Status::OK;
  }

 private:
  FakePodResourcesServer* const s_;
};

FakePodResourcesServer::FakePodResourcesServer(std::string socket_path)
    : socket_path_(std::move(socket_path)) {}

FakePodResourcesServer::~FakePodResourcesServer() {
  Stop(std::chrono::milliseconds(200));
}

absl::Status FakePodResourcesServer::Serve() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(socket_path_).parent_path(), ec);
  RemoveSocket(socket_path_);
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr)
    return absl::UnavailableError(StrCat("the fake kubelet cannot serve ", socket_path_));
  return absl::OkStatus();
}

void FakePodResourcesServer::Stop(std::chrono::milliseconds grace) {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    server_->Wait();
    server_.reset();
  }
  service_.reset();
  RemoveSocket(socket_path_);
}

void FakePodResourcesServer::SetPodResources(std::vector<PodResources> pods) {
  MutexLock lock(&mu_);
  pods_ = std::move(pods);
}

void FakePodResourcesServer::SetAllocatable(AllocatableResources allocatable) {
  MutexLock lock(&mu_);
  allocatable_ = std::move(allocatable);
}

}  // namespace tessera::kubelet
