#include "plugin_client.h"

#include <grpcpp/grpcpp.h>

#include <deque>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "core/strings.h"
#include "deviceplugin-v1beta1-api.grpc.pb.h"
#include "wait.h"

namespace tessera::kubelet {

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

}  // namespace

std::vector<FakeDevice> DevicesOf(const ::v1beta1::ListAndWatchResponse& r) {
  std::vector<FakeDevice> out;
  for (const ::v1beta1::Device& d : r.devices()) {
    FakeDevice fd{d.id(), d.health(), {}};
    for (const ::v1beta1::NUMANode& n : d.topology().nodes()) fd.numa.push_back(n.id());
    out.push_back(std::move(fd));
  }
  return out;
}

struct FakePluginClient::Stub {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<::v1beta1::DevicePlugin::Stub> stub;
};

FakePluginClient::FakePluginClient() = default;
FakePluginClient::~FakePluginClient() = default;

std::unique_ptr<FakePluginClient> FakePluginClient::Connect(const std::string& path) {
  auto client = std::unique_ptr<FakePluginClient>(new FakePluginClient());
  client->stub_ = std::make_unique<Stub>();
  client->stub_->channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  client->stub_->stub = ::v1beta1::DevicePlugin::NewStub(client->stub_->channel);
  return client;
}

absl::StatusOr<PluginOptionsView> FakePluginClient::GetDevicePluginOptions(
    std::chrono::milliseconds timeout) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ::v1beta1::Empty request;
  ::v1beta1::DevicePluginOptions response;
  grpc::Status s = stub_->stub->GetDevicePluginOptions(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s);
  return PluginOptionsView{response.pre_start_required(), response.get_preferred_allocation_available()};
}

struct FakeDeviceStream::State {
  Mutex mu;  // guards what the reader thread hands over: the lists read and the stream's end
  CondVar cv;
  std::deque<std::vector<FakeDevice>> lists ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status end ABSL_GUARDED_BY(mu);
  grpc::ClientContext ctx;
  std::shared_ptr<grpc::Channel> channel;
};

absl::StatusOr<std::unique_ptr<FakeDeviceStream>> FakePluginClient::ListAndWatch() const {
  auto stream = std::unique_ptr<FakeDeviceStream>(new FakeDeviceStream());
  auto state = std::make_shared<FakeDeviceStream::State>();
  state->channel = stub_->channel;
  stream->state_ = state;
  stream->reader_ = std::thread([state] {
    auto stub = ::v1beta1::DevicePlugin::NewStub(state->channel);
    ::v1beta1::Empty request;
    std::unique_ptr<grpc::ClientReader<::v1beta1::ListAndWatchResponse>> reader =
        stub->ListAndWatch(&state->ctx, request);
    ::v1beta1::ListAndWatchResponse response;
    while (reader->Read(&response)) {
      MutexLock lock(&state->mu);
      state->lists.push_back(DevicesOf(response));
      state->cv.SignalAll();
    }
    grpc::Status s = reader->Finish();
    MutexLock lock(&state->mu);
    state->done = true;
    state->end = FromGrpc(s);
    state->cv.SignalAll();
  });
  return stream;
}

FakeDeviceStream::~FakeDeviceStream() {
  Cancel();
}

void FakeDeviceStream::Cancel() {
  if (!reader_.joinable()) return;
  state_->ctx.TryCancel();
  reader_.join();
}

absl::StatusOr<std::vector<FakeDevice>> FakeDeviceStream::Next(std::chrono::milliseconds timeout) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  if (!WaitFor(&s.mu, &s.cv, timeout, [&] {
        s.mu.AssertHeld();
        return !s.lists.empty() || s.done;
      })) {
    return absl::DeadlineExceededError(StrCat("no device list within ", timeout.count(), " ms"));
  }
  if (!s.lists.empty()) {
    std::vector<FakeDevice> out = std::move(s.lists.front());
    s.lists.pop_front();
    return out;
  }
  return absl::OutOfRangeError(StrCat("the ListAndWatch stream ended: ", s.end.ok() ? "OK" : Message(s.end)));
}

absl::StatusOr<std::vector<std::vector<std::string>>> FakePluginClient::GetPreferredAllocation(
    const std::vector<PreferredRequest>& containers) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ::v1beta1::PreferredAllocationRequest request;
  for (const PreferredRequest& c : containers) {
    ::v1beta1::ContainerPreferredAllocationRequest* r = request.add_container_requests();
    for (const std::string& id : c.available) r->add_available_deviceids(id);
    for (const std::string& id : c.must_include) r->add_must_include_deviceids(id);
    r->set_allocation_size(c.size);
  }
  ::v1beta1::PreferredAllocationResponse response;
  grpc::Status s = stub_->stub->GetPreferredAllocation(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s);
  std::vector<std::vector<std::string>> out;
  for (const ::v1beta1::ContainerPreferredAllocationResponse& c : response.container_responses()) {
    out.emplace_back(c.deviceids().begin(), c.deviceids().end());
  }
  return out;
}

absl::StatusOr<std::vector<ContainerAllocation>> FakePluginClient::Allocate(
    const std::vector<std::vector<std::string>>& containers, std::chrono::milliseconds timeout) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ::v1beta1::AllocateRequest request;
  for (const std::vector<std::string>& ids : containers) {
    ::v1beta1::ContainerAllocateRequest* r = request.add_container_requests();
    for (const std::string& id : ids) r->add_devices_ids(id);
  }
  ::v1beta1::AllocateResponse response;
  grpc::Status s = stub_->stub->Allocate(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s);
  std::vector<ContainerAllocation> out;
  for (const ::v1beta1::ContainerAllocateResponse& c : response.container_responses()) {
    ContainerAllocation a;
    for (const auto& [k, v] : c.envs()) a.envs[k] = v;
    for (const ::v1beta1::Mount& m : c.mounts())
      a.mounts.push_back({m.container_path(), m.host_path(), m.read_only()});
    for (const ::v1beta1::DeviceSpec& d : c.devices()) {
      a.devices.push_back({d.container_path(), d.host_path(), d.permissions()});
    }
    for (const auto& [k, v] : c.annotations()) a.annotations[k] = v;
    for (const ::v1beta1::CDIDevice& d : c.cdi_devices()) a.cdi_devices.push_back(d.name());
    out.push_back(std::move(a));
  }
  return out;
}

absl::Status FakePluginClient::PreStartContainer(const std::vector<std::string>& device_ids) const {
  grpc::ClientContext ctx;
  // The kubelet's KubeletPreStartContainerRPCTimeoutInSecs.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ::v1beta1::PreStartContainerRequest request;
  for (const std::string& id : device_ids) request.add_devices_ids(id);
  ::v1beta1::PreStartContainerResponse response;
  return FromGrpc(stub_->stub->PreStartContainer(&ctx, request, &response));
}

}  // namespace tessera::kubelet
