// The scheduler extender's speed, through its real HTTP server on loopback.
//
//   build/bin/extender_bench                       # 5,000 nodes x 8 GPUs, about half full
//   build/bin/extender_bench --nodes 1000 --pods 2000 --clients 8
//
// Targets (issue "Scheduler"):
//   - filter plus prioritize for one pod over 5,000 nodes x 8 GPUs: under 5 ms at p99, server side;
//   - at least 1,000 pods/s through filter, prioritize and bind on loopback (kube-scheduler's own throughput
//     thresholds are 180-1,100 pods/s).
//
// Baseline, measured in the same run: a bare HTTP round trip of the same request body to a handler that only
// answers (what any extender pays for HTTP and the body), so that the ratio shows what Tessera adds.
// Throughput requests carry 500 node names, what kube-scheduler sends for 5,000 nodes with its default
// percentageOfNodesToScore (it stops after 10% of the nodes are found feasible).
#include <httplib.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "core/strings.h"
#include "nlohmann/json.hpp"
#include "scheduler/cluster_cache.h"
#include "scheduler/extender.h"
#include "scheduler/http_server.h"
#include "scheduler/standalone.h"

namespace tessera::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  int nodes = 5000;
  int pods = 3000;  // through the throughput phase
  int clients = 8;
  int latency_pods = 300;
  std::string policy = "tessera";
};

double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// CPU time of the calling thread: on a loaded machine, what the verbs cost apart from waiting for a core.
double ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

json Pod(const std::string& uid, int cores, int memory) {
  return {{"metadata", {{"name", uid}, {"namespace", "bench"}, {"uid", uid}}},
          {"spec",
           {{"containers",
             {{{"name", "main"},
               {"resources",
                {{"limits",
                  {{"tessera.dev/gpu-cores", std::to_string(cores)},
                   {"tessera.dev/gpu-memory", std::to_string(memory)}}}}}}}}}}};
}

core::NodeInfo Node(int i) {
  core::NodeInfo info;
  info.name = core::NodeName(StrCat("node-", i));
  for (int g = 0; g < 8; ++g) {
    info.gpus.push_back(
        {core::GpuUuid(StrCat("GPU-", i, "-", g)), g, "A100-SXM4-80GB", core::MiB(81920), g / 4});
  }
  info.links = core::LinkMatrix(8, core::Link::NvLink(12));
  return info;
}

int Main(const Args& args) {
  scheduler::CacheOptions options;
  options.policy = args.policy;
  options.seed = 42;
  scheduler::ClusterCache cache(options);
  for (int i = 0; i < args.nodes; ++i) {
    if (!cache.UpsertNode(Node(i)).ok()) return 1;
  }
  // About half full: shares of 10-90% spread over every node.
  std::printf("filling %d nodes x 8 GPUs...\n", args.nodes);
  core::Rng fill_rng(7);
  for (int i = 0; i < args.nodes * 8; ++i) {
    core::PodRequest r;
    r.uid = core::PodUid(StrCat("fill-", i));
    r.ns = core::Namespace("bench");
    r.name = StrCat("fill-", i);
    const int cores = 10 * static_cast<int>(1 + fill_rng.Uniform(9));
    r.containers.push_back(
        {"main", {{core::MilliGpu(cores * 10), {core::MemorySpec::Kind::kMiB, int64_t{cores} * 400}}}});
    absl::StatusOr<scheduler::Reservation> res =
        cache.Reserve(r, core::NodeName(StrCat("node-", i % args.nodes)));
    if (res.ok()) cache.Confirm(r.uid);
  }
  std::printf("cluster: %d nodes, %d pods placed\n", cache.node_count(), cache.pod_count());

  scheduler::StandaloneBinder binder;
  scheduler::Extender extender(cache, binder, nullptr);
  scheduler::ExtenderServer server(extender, nullptr, cache);
  server.AddPost("/echo", [](std::string_view) { return scheduler::Response{200, R"({"Error":""})"}; });
  scheduler::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  if (absl::Status st = server.Start(server_options); !st.ok()) {
    std::fprintf(stderr, "%s\n", Message(st).c_str());
    return 1;
  }
  const int port = server.port();

  std::vector<std::string> all_nodes;
  for (int i = 0; i < args.nodes; ++i) all_nodes.push_back(StrCat("node-", i));

  // Phase 1: one pod at a time over every node; server-side time of filter + prioritize, and round trips.
  std::vector<double> server_us, server_cpu_us, round_trip_us, echo_us;
  {
    httplib::Client client("127.0.0.1", port);
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    for (int i = 0; i < args.latency_pods; ++i) {
      const std::string body =
          json{{"Pod", Pod(StrCat("lat-", i), 10 * (1 + i % 9), 2048)}, {"NodeNames", all_nodes}}.dump();
      auto t0 = Clock::now();
      const double cpu0 = ThreadCpuMicros();
      scheduler::Response f = extender.Filter(body);
      scheduler::Response p = extender.Prioritize(body);
      server_cpu_us.push_back(ThreadCpuMicros() - cpu0);
      server_us.push_back(Micros(Clock::now() - t0));
      if (f.status != 200 || p.status != 200) return 1;
      t0 = Clock::now();
      auto rf = client.Post("/scheduler/filter", body, "application/json");
      auto rp = client.Post("/scheduler/prioritize", body, "application/json");
      round_trip_us.push_back(Micros(Clock::now() - t0));
      if (!rf || !rp || rf->status != 200 || rp->status != 200) return 1;
      t0 = Clock::now();
      auto e1 = client.Post("/echo", body, "application/json");
      auto e2 = client.Post("/echo", body, "application/json");
      echo_us.push_back(Micros(Clock::now() - t0));
      if (!e1 || !e2) return 1;
    }
  }
  const double p50 = Percentile(server_us, 0.5), p99 = Percentile(server_us, 0.99);
  std::printf("\nfilter+prioritize, one pod over %d nodes (%d pods):\n", args.nodes, args.latency_pods);
  std::printf(
      "  server side     p50 %8.0f us  p99 %8.0f us   target p99 < 5000 us: %s (%.2fx of the budget)\n", p50,
      p99, p99 < 5000 ? "met" : "MISSED", p99 / 5000.0);
  std::printf("  server CPU time p50 %8.0f us  p99 %8.0f us\n", Percentile(server_cpu_us, 0.5),
              Percentile(server_cpu_us, 0.99));
  std::printf("  HTTP round trip p50 %8.0f us  p99 %8.0f us\n", Percentile(round_trip_us, 0.5),
              Percentile(round_trip_us, 0.99));
  std::printf(
      "  baseline: bare HTTP echo of the same body, p50 %8.0f us  p99 %8.0f us  -> Tessera adds %.2fx\n",
      Percentile(echo_us, 0.5), Percentile(echo_us, 0.99),
      Percentile(round_trip_us, 0.5) / std::max(1.0, Percentile(echo_us, 0.5)));

  // Phase 2: throughput, `clients` concurrent schedulers' worth of pods through filter, prioritize, bind.
  std::atomic<int> next{0}, bound{0}, failed{0};
  std::vector<std::string> sample(all_nodes.begin(),
                                  all_nodes.begin() + std::min<size_t>(500, all_nodes.size()));
  auto work = [&](int id) {
    httplib::Client client("127.0.0.1", port);
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    core::Rng rng(static_cast<uint64_t>(100 + id));
    for (int i = next++; i < args.pods; i = next++) {
      // A window of 500 nodes, as kube-scheduler's feasible set; shifted per pod.
      const size_t start = rng.Uniform(static_cast<uint32_t>(all_nodes.size()));
      std::vector<std::string> names;
      names.reserve(sample.size());
      for (size_t k = 0; k < sample.size(); ++k) names.push_back(all_nodes[(start + k) % all_nodes.size()]);
      const std::string uid = StrCat("tp-", i);
      const std::string body = json{{"Pod", Pod(uid, 10 * (1 + i % 5), 1024)}, {"NodeNames", names}}.dump();
      auto rf = client.Post("/scheduler/filter", body, "application/json");
      auto rp = client.Post("/scheduler/prioritize", body, "application/json");
      if (!rf || !rp || rf->status != 200 || rp->status != 200) {
        ++failed;
        continue;
      }
      json scores = json::parse(rp->body);
      std::string best;
      int64_t top = -1;
      for (const json& h : scores) {
        if (h["Score"].get<int64_t>() > top) {
          top = h["Score"].get<int64_t>();
          best = h["Host"].get<std::string>();
        }
      }
      const std::string bind =
          json{{"PodName", uid}, {"PodNamespace", "bench"}, {"PodUID", uid}, {"Node", best}}.dump();
      auto rb = client.Post("/scheduler/bind", bind, "application/json");
      if (rb && rb->status == 200 && json::parse(rb->body)["Error"] == "") {
        ++bound;
      } else {
        ++failed;
      }
    }
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < args.clients; ++c) threads.emplace_back(work, c);
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rate = bound.load() / seconds;
  std::printf("\nthroughput, %d clients, 500 nodes per request: %d pods bound, %d failed in %.2f s\n",
              args.clients, bound.load(), failed.load(), seconds);
  std::printf("  %.0f pods/s through filter + prioritize + bind   target >= 1000: %s (%.2fx)\n", rate,
              rate >= 1000 ? "met" : "MISSED", rate / 1000.0);
  server.Stop();
  return failed.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  tessera::bench::Args args;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag, int* out) {
      if (std::strcmp(argv[i], flag) == 0 && i + 1 < argc) {
        *out = std::atoi(argv[++i]);
        return true;
      }
      return false;
    };
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "extender_bench [--nodes N] [--pods N] [--clients N] [--policy P]: the extender's latency and "
          "throughput "
          "over real HTTP on loopback\n");
      return 0;
    }
    if (std::strcmp(argv[i], "--policy") == 0 && i + 1 < argc) {
      args.policy = argv[++i];
      continue;
    }
    if (!value("--nodes", &args.nodes) && !value("--pods", &args.pods) &&
        !value("--clients", &args.clients) && !value("--latency-pods", &args.latency_pods)) {
      std::fprintf(stderr, "extender_bench: unknown argument %s; see --help\n", argv[i]);
      return 2;
    }
  }
  return tessera::bench::Main(args);
}
