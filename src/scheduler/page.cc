#include "scheduler/page.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstdio>
#include <ctime>
#include <unordered_map>

#include "core/strings.h"
#include "http/guarded_server.h"
#include "http/listen.h"
#include "httplib.h"

namespace tessera::scheduler {

namespace {

// Appends `s` as a JSON string (names and reasons are valid UTF-8: bytes from 0x80 are written as they are).
void AppendString(std::string* out, std::string_view s) {
  out->push_back('"');
  size_t plain = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (s[i] != '"' && s[i] != '\\' && u >= 0x20 && s[i] != '<') continue;
    out->append(s.substr(plain, i - plain));
    plain = i + 1;
    char buf[8];
    // '<' as \u003c as well: a name can never close a <script> it is read into.
    if (u < 0x20 || s[i] == '<') {
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out->append(buf);
    } else {
      out->push_back('\\');
      out->push_back(s[i]);
    }
  }
  out->append(s.substr(plain));
  out->push_back('"');
}

void AppendInt(std::string* out, int64_t v) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, end);
}

// Fragments in thousandths of a GPU, to a tenth.
void AppendTenths(std::string* out, double v) {
  AppendInt(out, static_cast<int64_t>(v * 10.0 + 0.5) / 10);
  const int64_t tenth = static_cast<int64_t>(v * 10.0 + 0.5) % 10;
  if (tenth != 0) {
    out->push_back('.');
    out->push_back(static_cast<char>('0' + tenth));
  }
}

std::string Rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

absl::Status CheckPageListen(std::string_view listen) {
  absl::StatusOr<std::pair<std::string, int>> parsed = http::ParseListen(listen);
  if (!parsed.ok()) return parsed.status();
  const std::string& host = parsed->first;
  bool loopback = host == "localhost";
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  }
  if (!loopback) {
    return absl::InvalidArgumentError(
        StrCat("--ui-listen ", listen,
               ": the page serves loopback addresses only (127.0.0.1, ::1, localhost), "
               "as it has no authentication of its own; reach it with `kubectl port-forward` to the "
               "scheduler's pod (docs/page.md), e.g. --ui-listen ",
               kDefaultPageListen));
  }
  return absl::OkStatus();
}

std::string PageDataJson(const PageView& view, std::span<const PendingPod> pending,
                         std::chrono::system_clock::time_point now) {
  const core::Cluster& cluster = view.cluster;
  // Pods by index, in the order their first GPU is met: a tenant names its pod by index.
  std::unordered_map<std::string_view, int> pod_index;
  struct PodSeen {
    std::string_view uid;
    std::string_view ns;
    core::Priority priority;
  };
  std::vector<PodSeen> pod_uids;
  int64_t gpus = 0, healthy = 0, cores_used = 0, idle = 0, memory = 0, memory_used = 0;
  double fragmentation = 0;
  std::string nodes;
  nodes.reserve(static_cast<size_t>(cluster.node_count()) * 256);
  bool first_node = true;
  std::vector<double> fragments;
  for (const core::NodeState& n : cluster.nodes()) {
    if (!first_node) nodes.push_back(',');
    first_node = false;
    nodes += R"({"name":)";
    AppendString(&nodes, n.name().value());
    nodes += R"(,"version":)";
    AppendInt(&nodes, static_cast<int64_t>(n.version()));
    nodes += R"(,"schedulable":)";
    nodes += n.schedulable() ? "true" : "false";
    fragments.assign(static_cast<size_t>(n.gpu_count()), 0.0);
    if (view.fragmentation) fragments = view.fragmentation->GpuFragments(n);
    double node_fragment = 0;
    for (double f : fragments) node_fragment += f;
    fragmentation += node_fragment;
    nodes += R"(,"fragment":)";
    AppendTenths(&nodes, node_fragment);
    nodes += R"(,"gpus":[)";
    for (int g = 0; g < n.gpu_count(); ++g) {
      const core::GpuInfo& info = n.gpu(g);
      const bool ok = info.health == core::GpuHealth::kHealthy;
      const int64_t used = (core::kWholeGpu - n.free_cores(g)).value();
      const int64_t mem_used = (info.memory - n.free_memory(g)).value();
      ++gpus;
      if (ok) {
        ++healthy;
        idle += n.free_cores(g).value();
      }
      cores_used += used;
      memory += info.memory.value();
      memory_used += mem_used;
      if (g > 0) nodes.push_back(',');
      nodes.push_back('[');
      AppendInt(&nodes, n.model_id(g));
      nodes.push_back(',');
      AppendInt(&nodes, info.memory.value());
      nodes.push_back(',');
      AppendInt(&nodes, used);
      nodes.push_back(',');
      AppendInt(&nodes, mem_used);
      nodes.push_back(',');
      nodes.push_back(ok ? '1' : '0');
      nodes.push_back(',');
      AppendTenths(&nodes, fragments[static_cast<size_t>(g)]);
      nodes += ",[";
      bool first_tenant = true;
      for (const core::Tenant& t : n.tenants(g)) {
        auto [it, added] = pod_index.try_emplace(t.id.pod.value(), static_cast<int>(pod_uids.size()));
        if (added) pod_uids.push_back({t.id.pod.value(), t.ns.value(), t.priority});
        if (!first_tenant) nodes.push_back(',');
        first_tenant = false;
        nodes.push_back('[');
        AppendInt(&nodes, it->second);
        nodes.push_back(',');
        AppendString(&nodes, t.id.container);
        nodes.push_back(',');
        AppendInt(&nodes, t.cores.value());
        nodes.push_back(',');
        AppendInt(&nodes, t.requested.value());
        nodes.push_back(',');
        AppendInt(&nodes, t.memory.value());
        nodes.push_back(',');
        AppendInt(&nodes, t.memory_limit.value());
        nodes.push_back(']');
      }
      nodes += "]]";
    }
    nodes += "]}";
  }

  std::string out;
  out.reserve(nodes.size() + pod_uids.size() * 96 + pending.size() * 256 + 1024);
  out += R"({"version":1,"generated":)";
  AppendString(&out, Rfc3339(now));
  out += R"(,"policy":)";
  AppendString(&out, view.policy);
  out += R"(,"cluster":{"nodes":)";
  AppendInt(&out, cluster.node_count());
  out += R"(,"gpus":)";
  AppendInt(&out, gpus);
  out += R"(,"healthyGpus":)";
  AppendInt(&out, healthy);
  out += R"(,"coresUsed":)";
  AppendInt(&out, cores_used);
  out += R"(,"idle":)";
  AppendInt(&out, idle);
  out += R"(,"memoryMiB":)";
  AppendInt(&out, memory);
  out += R"(,"memoryUsedMiB":)";
  AppendInt(&out, memory_used);
  out += R"(,"fragmentation":)";
  AppendTenths(&out, fragmentation);
  out += R"(,"typicalPods":)";
  AppendInt(&out, view.fragmentation ? static_cast<int64_t>(view.fragmentation->profile().pods.size()) : 0);
  out += R"(},"models":[)";
  for (int m = 0; m < cluster.model_count(); ++m) {
    if (m > 0) out.push_back(',');
    AppendString(&out, cluster.ModelName(m));
  }
  out += R"(],"pods":[)";
  for (size_t i = 0; i < pod_uids.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += R"({"uid":)";
    AppendString(&out, pod_uids[i].uid);
    auto it = view.pods.find(std::string(pod_uids[i].uid));
    const std::string_view name = it != view.pods.end() ? std::string_view(it->second.name) : "";
    out += R"(,"name":)";
    AppendString(&out, name);
    out += R"(,"namespace":)";
    AppendString(&out, pod_uids[i].ns);
    out += R"(,"priority":)";
    AppendString(&out, core::ToString(pod_uids[i].priority));
    out += R"(,"compute":)";
    AppendString(&out, it != view.pods.end() ? core::ToString(it->second.compute) : "hard");
    out += R"(,"reserved":)";
    out += it != view.pods.end() && it->second.reserved ? "true" : "false";
    out.push_back('}');
  }
  out += R"(],"nodes":[)";
  out += nodes;
  out += R"(],"pending":[)";
  bool first_pending = true;
  for (const PendingPod& p : pending) {
    if (view.pods.contains(p.uid)) continue;  // bound since (another replica, or seen from the API)
    if (!first_pending) out.push_back(',');
    first_pending = false;
    out += R"({"uid":)";
    AppendString(&out, p.uid);
    out += R"(,"name":)";
    AppendString(&out, p.name);
    out += R"(,"namespace":)";
    AppendString(&out, p.ns);
    out += R"(,"priority":)";
    AppendString(&out, core::ToString(p.priority));
    out += R"(,"vgpus":)";
    AppendInt(&out, p.vgpus);
    out += R"(,"cores":)";
    AppendInt(&out, p.cores.value());
    out += R"(,"nodesAsked":)";
    AppendInt(&out, p.nodes_asked);
    out += R"(,"nodesFit":)";
    AppendInt(&out, p.nodes_fit);
    out += R"(,"reason":)";
    AppendString(&out, p.reason);
    out += R"(,"lastFiltered":)";
    AppendString(&out, Rfc3339(p.last_filtered));
    out += R"(,"filtered":)";
    AppendInt(&out, static_cast<int64_t>(p.filtered));
    out.push_back('}');
  }
  out += R"(],"dra":{"watched":false,"note":)";
  AppendString(
      &out,
      "tessera-scheduler does not watch ResourceClaims: claims of Tessera's DRA classes are allocated "
      "by kube-scheduler's DRA allocator and prepared by tessera-node, and are not drawn here "
      "(docs/page.md)");
  out += "}}";
  return out;
}

PageServer::PageServer(const ClusterCache& cache, const Extender& extender)
    : cache_(cache), extender_(extender) {
  // Every client of a loopback listener is one peer, so past two waiting connections each new one gets the
  // strict timeout: short here (a browser sends its request at once), so that a flood of idle connections
  // turns over quickly. With 4 threads and the default 1 s, 60 connections trickling a header held a real
  // request back 29 s; with these, 2.8 s.
  limits_.threads = 8;
  limits_.strict_timeout = std::chrono::milliseconds(200);
}

PageServer::~PageServer() {
  Stop();
}

std::string PageServer::DataJson() const {
  // Pending first: a pod bound between the two reads is then in the snapshot and left out of the list.
  std::vector<PendingPod> pending = extender_.Pending();
  PageView view = cache_.PageSnapshot();
  return PageDataJson(view, pending, extender_.clock().Now());
}

absl::Status PageServer::Listen(std::string_view listen) {
  if (absl::Status st = CheckPageListen(listen); !st.ok()) return st;
  absl::StatusOr<std::pair<std::string, int>> address = http::ParseListen(listen);
  if (!address.ok()) return address.status();
  auto server = std::make_unique<http::GuardedHttpServer>(limits_);
  // Only SO_REUSEADDR (httplib's default adds SO_REUSEPORT, which lets a second process share the port).
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  auto guard = [s = server.get()](httplib::Server::Handler h) { return s->Guard(std::move(h)); };
  server->Get("/", guard([](const httplib::Request&, httplib::Response& res) {
                res.set_header("Content-Security-Policy",
                               "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'");
                res.set_header("X-Content-Type-Options", "nosniff");
                res.set_content(std::string(PageHtml()), "text/html; charset=utf-8");
              }));
  server->Get("/ui/data", guard([this](const httplib::Request&, httplib::Response& res) {
                res.set_header("Cache-Control", "no-store");
                res.set_header("X-Content-Type-Options", "nosniff");
                // With the charset named, httplib (0.11) does not compress the answer: for exactly
                // "application/json" it picks Brotli at its highest quality when the client accepts it, as
                // browsers do, and 8 MB of data at 5,000 nodes took 15 s to compress (Chromium's fetch),
                // against 0.2 s to build.
                res.set_content(DataJson(), "application/json; charset=utf-8");
              }));
  absl::StatusOr<int> port = server->BindAndListen(address->first, address->second);
  if (!port.ok()) return port.status();
  port_ = *port;
  http_ = std::move(server);
  return absl::OkStatus();
}

void PageServer::Serve() {
  if (http_) thread_ = std::thread([this] { http_->listen_after_bind(); });
}

void PageServer::Stop() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera::scheduler
