// GuardedHttpServer under concurrent clients, slow ones among them (also run under ThreadSanitizer: the
// "tsan" preset).
#include "scheduler/guarded_http.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tessera::scheduler {
namespace {

TEST(GuardedHttpServerTest, ConcurrentClientsAndSlowOnes) {
  HttpLimits limits;
  limits.request_timeout = std::chrono::milliseconds(500);
  limits.strict_timeout = std::chrono::milliseconds(100);
  limits.max_slow_per_peer = 2;
  GuardedHttpServer server(limits);
  server.new_task_queue = [] { return new httplib::ThreadPool(4); };
  std::atomic<int> hits{0};
  server.Get("/ping", server.Guard([&](const httplib::Request&, httplib::Response& res) {
    ++hits;
    res.set_content("pong", "text/plain");
  }));
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  std::atomic<bool> done{false};
  std::vector<std::thread> slow;
  for (int i = 0; i < 3; ++i) {
    slow.emplace_back([&] {
      while (!done) {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(1, 0);
        (void)c.Post("/ping", std::string(100, 'x'), "text/plain");  // POST without a handler: 404
      }
    });
  }
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(20, 0);
      for (int k = 0; k < 20; ++k) {
        auto r = c.Get("/ping");
        if (r && r->status == 200 && r->body == "pong") ++ok;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  done = true;
  for (std::thread& t : slow) t.join();
  server.stop();
  serving.join();
  EXPECT_EQ(ok.load(), 120);
  EXPECT_EQ(hits.load(), 120);
  EXPECT_EQ(server.waiting("127.0.0.1"), 0u);
}

}  // namespace
}  // namespace tessera::scheduler
