// Helpers for the Kubernetes client tests: a fake API server on loopback with a client for it, objects in a
// line, temporary directories, and waiting for a condition that another thread makes true.
//
//   FakeCluster c;                                 // fake API server on 127.0.0.1:0 and a KubeApi for it
//   ASSERT_TRUE(c.server->Create("pods", "default", MakePod("web-0")).ok());
//   EXPECT_TRUE(WaitUntil([&] { return informer.size() == 1; }));
//
// WaitUntil is a guard against hangs, not a timing assertion: its limit is far above what any step takes.
// Thread-safety: single test thread, except WaitUntil's predicate, which must be thread-safe.
#ifndef TESSERA_TESTS_K8S_K8S_TEST_UTIL_H_
#define TESSERA_TESTS_K8S_K8S_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/strings.h"
#include "fake_apiserver.h"
#include "k8s/kube_api.h"

namespace tessera::k8s::testing {

inline bool WaitUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline Json MakePod(const std::string& name, const std::string& ns = "default", const std::string& node = "",
                    Json labels = Json::object()) {
  Json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", name}, {"namespace", ns}, {"labels", std::move(labels)}}},
              {"spec", {{"containers", {{{"name", "main"}, {"image", "busybox"}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  return pod;
}

inline Json MakeNodeObject(const std::string& name) {
  return {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}, {"status", Json::object()}};
}

// A fresh directory under the system's temporary directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tessera-k8s-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
    return p;
  }

 private:
  std::string path_;
};

// A fake API server and a client for it.
struct FakeCluster {
  explicit FakeCluster(fake::FakeApiServerOptions options = {}, ClientConfig config = {}) {
    auto s = fake::FakeApiServer::Start(std::move(options));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return;
    server = std::move(*s);
    config.server = server->url();
    auto a = NewKubeApi(config);
    EXPECT_TRUE(a.ok()) << a.status();
    if (a.ok()) api = std::move(*a);
  }
  ~FakeCluster() {
    api.reset();  // closes its pooled keep-alive connections, so the server stops at once
    if (server) server->Stop();
  }
  std::unique_ptr<fake::FakeApiServer> server;
  std::unique_ptr<KubeApi> api;
};

}  // namespace tessera::k8s::testing

#endif  // TESSERA_TESTS_K8S_K8S_TEST_UTIL_H_
