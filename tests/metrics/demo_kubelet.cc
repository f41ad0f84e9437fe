// metrics_demo_kubelet: the kubelet's side of a tessera-node run on this machine, for tests/metrics/scrape.py
// (the promtool check and the dashboard's picture). The fake kubelet (tools/fake-kubelet/fake_kubelet.h)
// serves the registration and pod-resources sockets over real gRPC; once tessera-node's device plugin
// registers, this calls its Allocate for each container named, as the kubelet does when the container starts,
// tells pod-resources who holds which devices, and then stays up until its standard input closes.
//
//   metrics_demo_kubelet PLUGIN_DIR POD_RESOURCES_SOCKET NS/POD/CONTAINER=DEVICE[,DEVICE...] ...
//
// For each allocation it prints one line, `allocated NS/POD/CONTAINER LIMITS_FILE REGION_FILE` (host paths),
// then `ready`.
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "fake_kubelet.h"
#include "kubelet/device_plugin.h"

namespace {

using namespace tessera;  // NOLINT

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

int Fail(const std::string& message) {
  std::cerr << "metrics_demo_kubelet: " << message << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Fail("usage: metrics_demo_kubelet PLUGIN_DIR POD_RESOURCES_SOCKET NS/POD/CTR=DEV,... ...");
  kubelet::FakeKubeletOptions options;
  options.plugin_dir = argv[1];
  options.pod_resources_socket = argv[2];
  auto fake = kubelet::FakeKubelet::Start(options);
  if (!fake.ok()) return Fail(std::string(fake.status().message()));
  if (!(*fake)->WaitForRegistrations(1, std::chrono::seconds(60))) {
    return Fail("tessera-node's device plugin did not register within 60 s");
  }
  const std::string endpoint = (*fake)->registrations().front().endpoint;
  auto client = (*fake)->ConnectPlugin(endpoint);
  if (!client.ok()) return Fail(std::string(client.status().message()));

  std::map<std::pair<std::string, std::string>, kubelet::PodResources> pods;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::vector<std::string> who = Split(arg.substr(0, eq), '/');
    if (eq == std::string::npos || who.size() != 3) return Fail("bad allocation " + arg);
    const std::vector<std::string> devices = Split(arg.substr(eq + 1), ',');
    auto allocated = (*client)->Allocate({devices});
    if (!allocated.ok()) return Fail(arg + ": " + std::string(allocated.status().message()));
    std::string limits, region;
    for (const kubelet::Mount& m : allocated->at(0).mounts) {
      if (m.container_path == "/etc/tessera") limits = m.host_path + "/limits";
      if (m.container_path == "/var/lib/tessera/region") region = m.host_path + "/region";
    }
    std::cout << "allocated " << who[0] << "/" << who[1] << "/" << who[2] << " " << limits << " " << region
              << std::endl;
    kubelet::PodResources& pod = pods[{who[0], who[1]}];
    pod.ns = who[0];
    pod.name = who[1];
    kubelet::ContainerResources container;
    container.name = who[2];
    container.devices.push_back({kubelet::kGpuResourceName, devices, {}});
    pod.containers.push_back(container);
  }
  std::vector<kubelet::PodResources> list;
  for (auto& [key, pod] : pods) list.push_back(pod);
  (*fake)->SetPodResources(list);
  std::cout << "ready" << std::endl;
  for (std::string line; std::getline(std::cin, line);) {
  }
  return 0;
}
