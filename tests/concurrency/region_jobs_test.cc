// RegionJobs under concurrent use (also run under ThreadSanitizer: the "tsan" preset).
#include "node/region_jobs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "temp_dir.h"

namespace tessera::node {
namespace {

std::shared_ptr<hook::SharedRegion> Region(const std::string& path) {
  auto r = std::make_shared<hook::SharedRegion>();
  hook::Error e;
  EXPECT_TRUE(r->Open(path.c_str(), &e)) << e.text;
  return std::shared_ptr<hook::SharedRegion>(r.get(), [r](hook::SharedRegion*) { r->Close(); });
}

TEST(RegionJobsTest, OneJobPerTenantResultsCollectedOnce) {
  tessera::testing::TempDir dir;
  RegionJobs jobs(std::chrono::hours(1));
  std::vector<std::shared_ptr<hook::SharedRegion>> regions;
  for (int i = 0; i < 4; ++i) regions.push_back(Region(dir.path() + "/r" + std::to_string(i)));
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round) {
        const int t = (c + round) % 4;
        if (jobs.Start("t" + std::to_string(t), regions[static_cast<size_t>(t)],
                       [](hook::SharedRegion& r) { return r.ReclaimDeadSlots() + 1; })) {
          ++started;
        }
        for (const auto& [tenant, result] : jobs.Sweep().finished) {
          EXPECT_EQ(result, 1) << tenant;
          ++finished;
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  ASSERT_TRUE(jobs.WaitIdle(std::chrono::seconds(30)));
  for (const auto& [tenant, result] : jobs.Sweep().finished) {
    EXPECT_EQ(result, 1) << tenant;
    ++finished;
  }
  EXPECT_EQ(started.load(), finished.load());
  EXPECT_GT(started.load(), 0);
}

TEST(RegionJobsTest, AJobPastTheTimeoutIsStuckAndForgotten) {
  tessera::testing::TempDir dir;
  k8s::FakeClock clock;
  RegionJobs jobs(std::chrono::seconds(5), &clock);
  auto region = Region(dir.path() + "/r");
  std::atomic<bool> release{false};
  ASSERT_TRUE(jobs.Start("t", region, [&](hook::SharedRegion&) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 7;
  }));
  EXPECT_FALSE(jobs.Start("t", region, [](hook::SharedRegion&) { return 0; }));  // one at a time
  EXPECT_TRUE(jobs.Sweep().stuck.empty());
  clock.Advance(std::chrono::seconds(6));
  RegionJobs::Swept swept = jobs.Sweep();
  ASSERT_EQ(swept.stuck, std::vector<std::string>{"t"});
  EXPECT_EQ(jobs.abandoned(), 1);
  EXPECT_FALSE(jobs.Running("t"));  // a new job may start (on a rebuilt region)
  release = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (jobs.abandoned() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(jobs.abandoned(), 0);
  EXPECT_TRUE(jobs.Sweep().finished.empty());  // the abandoned job's result is not reported
}

}  // namespace
}  // namespace tessera::node
