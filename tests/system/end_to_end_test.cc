// The whole path of a GPU pod, with every Tessera part a real process or real protocol: the fake API server
// (tools/fake-apiserver; no kube-apiserver runs here) and the fake kubelet (src/kubelet/fake_kubelet.h: the
// kubelet's side of the device-plugin and pod-resources gRPC protocols) stand in for Kubernetes;
// tessera-node and tessera-scheduler are the real binaries.
//
//   tessera-node publishes the GPUs -> tessera-scheduler sees the node -> kube-scheduler (this test) filters,
//   prioritizes and binds -> the kubelet (fake) calls Allocate with device IDs -> tessera-node finds the pod,
//   writes the limits file, answers with the container's environment and mounts, and marks the pod allocated.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fake_apiserver.h"
#include "formats/assignment.h"
#include "formats/inventory.h"
#include "kubelet/fake_kubelet.h"
#include "nlohmann/json.hpp"
#include "temp_dir.h"

namespace tessera {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// A child process with its output in a file; killed when the object goes.
class Process {
 public:
  Process(const std::vector<std::string>& args, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Process() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  bool running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

bool Eventually(const std::function<bool()>& done, int seconds = 30) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(EndToEndTest, APodAsksForAShareAndItsContainerGetsItsLimits) {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<fake::FakeApiServer>> api = fake::FakeApiServer::Start();
  ASSERT_TRUE(api.ok()) << api.status();
  fake::FakeApiServer& server = **api;
  ASSERT_TRUE(server
                  .Create("nodes", "",
                          json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "gpu-1"}}}})
                  .ok());
  const std::string kubeconfig = dir.path() + "/kubeconfig";
  std::ofstream(kubeconfig) << server.Kubeconfig("");

  kubelet::FakeKubeletOptions kubelet_options;
  kubelet_options.plugin_dir = dir.path() + "/device-plugins";
  kubelet_options.pod_resources_socket = dir.path() + "/pod-resources.sock";
  absl::StatusOr<std::unique_ptr<kubelet::FakeKubelet>> kubelet =
      kubelet::FakeKubelet::Start(kubelet_options);
  ASSERT_TRUE(kubelet.ok()) << kubelet.status();

  const std::string bin = std::string(TESSERA_BINARY_DIR) + "/bin/";
  Process node({bin + "tessera-node", "--node-name", "gpu-1", "--kubeconfig", kubeconfig, "--fake-gpus",
                std::string(TESSERA_SOURCE_DIR) + "/examples/fake-gpus/pcie-4gpu.yaml", "--device-plugin-dir",
                kubelet_options.plugin_dir, "--pod-resources-socket", kubelet_options.pod_resources_socket,
                "--state-dir", dir.path() + "/state", "--slots-per-gpu", "4", "--metrics-listen", "", "-v"},
               dir.path() + "/node.log");
  // The agent registers with the kubelet and publishes its GPUs on its Node.
  ASSERT_TRUE((*kubelet)->WaitForRegistrations(1, std::chrono::seconds(30)))
      << ReadFile(dir.path() + "/node.log");
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<json> n = server.Get("nodes", "", "gpu-1");
    return n.ok() && (*n)["metadata"].contains("annotations") &&
           (*n)["metadata"]["annotations"].contains(formats::kGpuInventoryAnnotation);
  })) << ReadFile(dir.path() + "/node.log");
  ASSERT_TRUE(Eventually([&] { return (*kubelet)->Devices("tessera.dev/gpu").size() == 16; }));

  Process scheduler({bin + "tessera-scheduler", "--kubeconfig", kubeconfig, "--listen", "127.0.0.1:0", "-v"},
                    dir.path() + "/scheduler.log");
  // It prints where it listens once it has listed the cluster.
  int port = 0;
  ASSERT_TRUE(Eventually([&] {
    const std::string log = ReadFile(dir.path() + "/scheduler.log");
    const size_t at = log.find("extender at http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(log.c_str() + at + 29);
    return port > 0;
  })) << ReadFile(dir.path() + "/scheduler.log");
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(30, 0);
  ASSERT_TRUE(Eventually([&] {
    httplib::Result r = http.Get("/readyz");
    return r && r->status == 200;
  })) << ReadFile(dir.path() + "/scheduler.log");

  // A pod asking for 30% of a GPU and 4 GiB, as a user writes it.
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "infer"}, {"namespace", "default"}}},
              {"spec",
               {{"schedulerName", "tessera-scheduler"},
                {"containers",
                 {{{"name", "main"},
                   {"image", "pytorch"},
                   {"resources",
                    {{"limits",
                      {{"tessera.dev/gpu", "1"},
                       {"tessera.dev/gpu-cores", "30"},
                       {"tessera.dev/gpu-memory", "4096"}}}}}}}}}},
              {"status", {{"phase", "Pending"}}}};
  absl::StatusOr<json> created = server.Create("pods", "default", pod);
  ASSERT_TRUE(created.ok());
  const std::string uid = (*created)["metadata"]["uid"];

  // kube-scheduler's part: filter, prioritize, bind.
  const std::string args = json{{"Pod", *created}, {"NodeNames", {"gpu-1"}}}.dump();
  httplib::Result f = http.Post("/scheduler/filter", args, "application/json");
  ASSERT_TRUE(f && f->status == 200);
  ASSERT_EQ(json::parse(f->body)["NodeNames"], json({"gpu-1"})) << f->body;
  httplib::Result b = http.Post(
      "/scheduler/bind",
      json{{"PodName", "infer"}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", "gpu-1"}}.dump(),
      "application/json");
  ASSERT_TRUE(b && b->status == 200) << ReadFile(dir.path() + "/scheduler.log");
  ASSERT_EQ(json::parse(b->body)["Error"], "") << b->body;
  json bound = *server.Get("pods", "default", "infer");
  EXPECT_EQ(bound["spec"]["nodeName"], "gpu-1");
  absl::StatusOr<formats::Assignment> assignment = formats::ParseAssignment(
      bound["metadata"]["annotations"][formats::kAnnotationAssignment].get<std::string>());
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  const std::string gpu = assignment->containers[0].vgpus[0].uuid.value();

  // The kubelet's part: one tessera.dev/gpu slot, any of them (the agent finds the pod by its request).
  const std::string slot = (*kubelet)->Devices("tessera.dev/gpu").front().id;
  absl::StatusOr<std::unique_ptr<kubelet::FakePluginClient>> plugin =
      (*kubelet)->ConnectPlugin("tessera-gpu.sock");
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  absl::StatusOr<std::vector<kubelet::ContainerAllocation>> allocated = (*plugin)->Allocate({{slot}});
  ASSERT_TRUE(allocated.ok()) << allocated.status() << "\n" << ReadFile(dir.path() + "/node.log");
  ASSERT_EQ(allocated->size(), 1u);
  const kubelet::ContainerAllocation& c = (*allocated)[0];
  EXPECT_EQ(c.envs.at("NVIDIA_VISIBLE_DEVICES"), gpu);
  // The container's limits file, on the host side of its mount, says 30% and 4 GiB of that GPU.
  std::string limits_dir;
  for (const kubelet::Mount& m : c.mounts) {
    if (m.container_path == "/etc/tessera") limits_dir = m.host_path;
  }
  ASSERT_FALSE(limits_dir.empty());
  const std::string limits = ReadFile(limits_dir + "/limits");
  EXPECT_THAT(limits, HasSubstr("30"));
  EXPECT_THAT(limits, HasSubstr(std::to_string(4096LL << 20)));
  // And the API tells the truth: the pod is allocated.
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<json> p = server.Get("pods", "default", "infer");
    return p.ok() &&
           (*p)["metadata"]["annotations"].value(formats::kAnnotationPhase, "") == formats::kPhaseAllocated;
  })) << ReadFile(dir.path() + "/node.log");
  EXPECT_TRUE(node.running());
  EXPECT_TRUE(scheduler.running());
}

}  // namespace
}  // namespace tessera
