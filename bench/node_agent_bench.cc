// tessera-node's Allocate with the real agent behind the device plugin (records, limits file, response), over real gRPC on unix sockets against the fake kubelet, on a node holding 100 tenants:
//   - Allocate p50/p99 (target p99 < 5 ms), next to a baseline from the same run on the same channel: an
//   empty
//     RPC (GetDevicePluginOptions); each measured Allocate is for a fresh pod bound among 100+ others, so it
//     parses every bound pod's assignment, claims, writes the limits file and record;
//   - the same while the agent is busy elsewhere: the API takes 50 ms a call, a background reconcile loop
//     rewrites resident pods' limits (limits files, RELOAD, phase patches), metrics are scraped (each scrape
//     reads every tenant's region) and one tenant holds its region's table lock for the whole run (target p99
//     < 5 ms still; docs/security.md);
//   - re-registration after a kubelet restart with the agent running (target < 1 s).
//
//   build/bin/node_agent_bench [--rounds=10] [--restarts=20]
//   build/bin/node_agent_bench --quick     # CI: 1 round, 2 restarts; the checks below
//
// The full run exits 1 when a target is missed. Checks, in every mode (exit 1 on a wrong answer; quick mode
// judges no time): every Allocate goes to the pod bound first among those waiting (the fresh pods, in order)
// and answers with its GPU; its limits file holds that GPU, the pod's share and its memory; after each quiet
// round's reconcile the agent is back to its 100 resident tenants (101 after the contended run).
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "core/strings.h"
#include "fake_kubelet.h"
#include "formats/assignment.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "kubelet/device_plugin.h"
#include "node/agent.h"

namespace {

using namespace tessera;  // NOLINT
using SteadyClock = std::chrono::steady_clock;

// Shares small enough that every GPU fits its residents and a round of fresh pods at any moment (the agent
// refuses an assignment that would put a GPU over its compute): 13 residents at up to 40 and 13 fresh at 20
// thousandths on each of the 8 GPUs.
node::NodePod Pod(int i, int milli_cores = 20) {
  node::NodePod p;
  p.name = StrCat("pod-", i);
  p.uid = StrCat("00000000-0000-4000-8000-", std::string(12 - StrCat(i).size(), '0'), i);
  p.creation_timestamp = "2026-11-22T10:00:00Z";
  core::Placement placement;
  placement.node = core::NodeName("gpu-1");
  core::ContainerAssignment c;
  c.name = "main";
  core::VGpuAssignment v;
  v.gpu_index = i % 8;
  v.uuid = core::GpuUuid(StrCat("GPU-", i % 8));
  v.cores = core::MilliGpu(milli_cores);
  v.memory = core::MiB(512);
  c.vgpus.push_back(v);
  placement.containers.push_back(c);
  p.annotations[formats::kAnnotationAssignment] = formats::FormatAssignment(placement);
  // Bound i milliseconds after the first (the precision the scheduler writes and the agent orders by).
  p.annotations[formats::kAnnotationAssignedAt] = formats::FormatHeartbeat(
      *formats::ParseHeartbeat("2026-11-22T10:00:00.000Z") + std::chrono::milliseconds(i));
  p.annotations[formats::kAnnotationPhase] = formats::kPhaseBound;
  return p;
}

double Pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * q))];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 10;
  int restarts = 20;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
      rounds = 1;
      restarts = 2;
    }
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) rounds = std::max(1, std::atoi(argv[i] + 9));
    if (std::strncmp(argv[i], "--restarts=", 11) == 0) restarts = std::max(1, std::atoi(argv[i] + 11));
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "node_agent_bench [--rounds=10] [--restarts=20]: Allocate p99 with 100 tenants (target 5 ms),\n"
          "  quiet and contended, and re-registration after a kubelet restart (target 1 s), each against a\n"
          "  baseline; the full run exits 1 when a target is missed.\n"
          "node_agent_bench --quick: CI mode, 1 round of 100 Allocates each way and 2 restarts (other flags\n"
          "  still apply); times are printed, never judged.\n"
          "Every run checks the answers (exit 1 on a wrong one): each Allocate goes to the pod bound first\n"
          "among those waiting and answers with its GPU; its limits file holds that GPU, share and memory;\n"
          "after each round's reconcile the agent holds its resident tenants only.\n");
      return 0;
    }
  }
  char tmpl[] = "/tmp/tessera-nbench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 2;
  const std::string dir = tmpl;
  log::Init("node_agent_bench", log::Level::kError);

  kubelet::FakeKubeletOptions ko;
  ko.plugin_dir = dir + "/dp";
  auto fake = kubelet::FakeKubelet::Start(ko);
  if (!fake.ok()) return 2;
  formats::GpuInventory inv;
  for (int g = 0; g < 8; ++g) {
    formats::InventoryGpu gpu;
    gpu.info.uuid = core::GpuUuid(StrCat("GPU-", g));
    gpu.info.index = g;
    gpu.info.model = "A100";
    gpu.info.memory = core::MiB(81920);
    inv.gpus.push_back(gpu);
  }
  inv.links = core::LinkMatrix(8, core::Link::Of(core::LinkKind::kSys));
  node::InMemoryNodeApi api("gpu-1");
  node::NodeAgentConfig config;
  config.node_name = "gpu-1";
  config.state_dir = dir + "/state";
  node::NodeAgent agent(config, &api, inv, nullptr);
  if (!agent.Start(/*background=*/false).ok()) return 2;
  kubelet::DevicePluginConfig pc;
  pc.plugin_dir = ko.plugin_dir;
  pc.slots_per_gpu = 100;
  auto plugin = kubelet::DevicePlugin::Create(pc, kubelet::PluginGpusFrom(inv), &agent);
  if (!plugin.ok() || !(*plugin)->Start().ok() ||
      !(*fake)->WaitForRegistrations(1, std::chrono::seconds(10))) {
    return 2;
  }
  auto client = (*fake)->ConnectPlugin(pc.endpoint);
  if (!client.ok()) return 2;

  int next = 0;
  int wrong = 0;  // Allocates answered for the wrong pod or GPU, or with a wrong limits file
  std::string first_wrong;
  auto allocate = [&]() {
    const int i = next++;
    // Slots 0-99 stay with the resident tenants; the others cycle through the rest (a slot is given again
    // only long after its pod was deleted: the agent refuses a slot a live container holds).
    const int slot = i < 100 ? i : 100 + (i - 100) % 700;
    const auto start = SteadyClock::now();
    auto r = (*client)->Allocate({{StrCat("GPU-", slot % 8, "::", slot / 8)}});
    const double us = std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
    if (!r.ok()) {
      std::fprintf(stderr, "Allocate failed: %s\n", std::string(r.status().message()).c_str());
      std::exit(1);
    }
    // Pod i was bound i-th (its assigned-at), after every pod allocated before it: the agent gives it this
    // container, with its GPU, share (20 thousandths) and memory (512 MiB), in the limits file the first mount
    // holds.
    std::string problem;
    const std::string gpu = StrCat("GPU-", i % 8);
    const auto pod = r->size() == 1 ? (*r)[0].annotations.find("tessera.dev/pod")
                                    : std::map<std::string, std::string>::const_iterator();
    if (r->size() != 1 || pod == (*r)[0].annotations.end() || pod->second != StrCat("default/pod-", i)) {
      problem = "went to another pod";
    } else if (auto env = (*r)[0].envs.find("NVIDIA_VISIBLE_DEVICES");
               env == (*r)[0].envs.end() || env->second != gpu || (*r)[0].mounts.empty()) {
      problem = StrCat("answered GPU ", env == (*r)[0].envs.end() ? "none" : env->second, ", not ", gpu);
    } else {
      hook::Limits limits;
      hook::Error error;
      const std::string file = (*r)[0].mounts[0].host_path + "/limits";
      if (!hook::ReadLimitsFile(file.c_str(), &limits, &error)) {
        problem = StrCat("limits file: ", error.text);
      } else if (limits.device_count != 1 || std::string(limits.devices[0].uuid) != gpu ||
                 hook::SharePpm(limits.devices[0]) != 20000 || limits.devices[0].memory_bytes != 512ull << 20) {
        problem = StrCat("limits file names ", limits.devices[0].uuid, " at ", hook::SharePpm(limits.devices[0]),
                         " ppm and ", limits.devices[0].memory_bytes, " bytes");
      }
    }
    if (!problem.empty() && wrong++ == 0) first_wrong = StrCat("pod-", i, ": ", problem);
    return us;
  };
  // After a round's reconcile: the resident tenants, and nothing else.
  int stray = 0;
  auto expect_tenants = [&](size_t n) {
    if (agent.Records().size() != n) ++stray;
  };
  auto empty = [&]() {
    const auto start = SteadyClock::now();
    if (!(*client)->GetDevicePluginOptions().ok()) std::exit(1);
    return std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
  };
  // 100 tenants that stay for the whole run.
  for (int i = 0; i < 100; ++i) api.UpsertPod(Pod(i));
  for (int i = 0; i < 100; ++i) allocate();
  std::vector<double> alloc_us, empty_us;
  for (int r = 0; r < rounds; ++r) {
    const int first = next;
    for (int i = 0; i < 100; ++i) api.UpsertPod(Pod(first + i));
    for (int i = 0; i < 100; ++i) {
      alloc_us.push_back(allocate());
      empty_us.push_back(empty());
    }
    for (int i = 0; i < 100; ++i) api.DeletePod("default", StrCat("pod-", first + i));
    if (!agent.ReconcileOnce().ok()) return 1;  // collects them: back to 100 tenants
    expect_tenants(100);
  }
  // The contended run.
  std::vector<double> busy_us;
  {
    api.SetCallDelay(std::chrono::milliseconds(50));
    const node::NodePod held = Pod(next);
    api.UpsertPod(held);
    allocate();  // the only unclaimed pod: "held" gets it
    // Its region made first (as a hook starting before the agent's pass would) and its table lock held.
    const std::string region_path = StrCat(config.state_dir, "/regions/", held.uid, "/main/region");
    {
      hook::SharedRegion region;
      hook::Error e;
      if (!region.Open(region_path.c_str(), &e)) return 2;
      region.Close();
    }
    std::atomic<bool> locked{false}, release{false}, stop{false};
    std::thread holder([&] {
      const int fd = open(region_path.c_str(), O_RDWR);
      void* base = mmap(nullptr, hook::kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) std::exit(2);
      pthread_mutex_t* m = &static_cast<hook::RegionHeader*>(base)->table_lock;
      pthread_mutex_lock(m);
      locked = true;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      pthread_mutex_unlock(m);
      munmap(base, hook::kRegionBytes);
      close(fd);
    });
    while (!locked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::atomic<int> passes{0};
    std::thread reconciler([&] {
      for (int k = 0; !stop; ++k) {
        api.UpsertPod(Pod(k % 100, k % 2 == 0 ? 40 : 20));  // a resident pod's share changes
        (void)agent.ReconcileOnce();
        (void)agent.MetricsText();  // a scrape reads every tenant's region
        ++passes;
      }
    });
    for (int r = 0; r < rounds; ++r) {
      const int first = next;
      for (int i = 0; i < 100; ++i) api.UpsertPod(Pod(first + i));
      for (int i = 0; i < 100; ++i) busy_us.push_back(allocate());
      for (int i = 0; i < 100; ++i) api.DeletePod("default", StrCat("pod-", first + i));
    }
    stop = true;
    reconciler.join();
    release = true;
    holder.join();
    api.SetCallDelay(std::chrono::milliseconds(0));
    std::printf("contended run: %d reconcile passes, %llu limit updates, %llu API calls failed\n",
                passes.load(), static_cast<unsigned long long>(agent.stats().limit_updates),
                static_cast<unsigned long long>(agent.stats().api_errors));
    if (!agent.ReconcileOnce().ok()) return 1;
    expect_tenants(101);  // and "held"
  }
  std::vector<double> rereg_ms;
  for (int r = 0; r < restarts; ++r) {
    const size_t before = (*fake)->registrations().size();
    if (!(*fake)->Restart().ok()) return 2;
    const auto created = (*fake)->last_start();
    if (!(*fake)->WaitForRegistrations(before + 1, std::chrono::seconds(30))) return 1;
    rereg_ms.push_back(
        std::chrono::duration<double, std::milli>((*fake)->registrations().back().at - created).count());
  }
  std::printf("node_agent_bench: 8 GPUs, 100 resident tenants, %zu measured Allocates (fresh pods)\n\n",
              alloc_us.size());
  std::printf("%-44s %10s %10s\n", "", "p50 us", "p99 us");
  std::printf("%-44s %10.1f %10.1f\n", "Allocate (agent: records, limits)", Pct(alloc_us, 0.5),
              Pct(alloc_us, 0.99));
  std::printf("%-44s %10.1f %10.1f\n", "baseline: empty RPC on the same channel", Pct(empty_us, 0.5),
              Pct(empty_us, 0.99));
  std::printf("%-44s %10.1f %10.1f\n", "Allocate, API 50 ms/call + held region lock", Pct(busy_us, 0.5),
              Pct(busy_us, 0.99));
  // Quick mode prints the figures without a verdict.
  auto verdict = [&](bool met) { return quick ? "not judged in quick mode" : met ? "met" : "MISSED"; };
  const double quiet_p99 = Pct(alloc_us, 0.99);
  const double busy_p99 = Pct(busy_us, 0.99);
  std::printf(
      "\nSummary:\n  Allocate p99 %.2f ms vs target 5 ms: %.3f of target (%s); p99 / empty-RPC p99 = %.2fx\n",
      quiet_p99 / 1000, quiet_p99 / 5000, verdict(quiet_p99 < 5000), quiet_p99 / Pct(empty_us, 0.99));
  std::printf(
      "  contended Allocate p99 %.2f ms (API 50 ms a call, a tenant holding its region lock, limits "
      "changing): "
      "%.3f of target (%s); contended p99 / quiet p99 = %.2fx\n",
      busy_p99 / 1000, busy_p99 / 5000, verdict(busy_p99 < 5000), busy_p99 / quiet_p99);
  const double max_ms = *std::max_element(rereg_ms.begin(), rereg_ms.end());
  std::printf(
      "  re-registration after a kubelet restart (%d restarts, agent running): p50 %.2f ms, max %.2f ms; "
      "target 1000 ms: max/target = %.4f (%s)\n",
      restarts, Pct(rereg_ms, 0.5), max_ms, max_ms / 1000, verdict(max_ms < 1000));
  std::printf(
      "Checks:\n  %s every Allocate for the pod bound first, with its GPU and limits file: %d of %d "
      "wrong%s\n",
      wrong == 0 ? "ok    " : "FAILED", wrong, next,
      first_wrong.empty() ? "" : (" (" + first_wrong + ")").c_str());
  std::printf("  %s after each round's reconcile, the resident tenants only: %d round(s) not\n",
              stray == 0 ? "ok    " : "FAILED", stray);
  (*plugin)->Stop();
  agent.Stop();
  std::filesystem::remove_all(dir);
  int status = 0;
  if (wrong > 0 || stray > 0) {
    std::fprintf(stderr, "node_agent_bench: check(s) FAILED: a wrong answer, whatever the times\n");
    status = 1;
  }
  if (!quick && (quiet_p99 >= 5000 || busy_p99 >= 5000 || max_ms >= 1000)) {
    std::fprintf(stderr,
                 "node_agent_bench: target missed (Allocate p99 %.2f / %.2f ms contended, target 5 ms; "
                 "re-registration %.2f ms, target 1000 ms)\n",
                 quiet_p99 / 1000, busy_p99 / 1000, max_ms);
    status = 1;
  }
  return status;
}
