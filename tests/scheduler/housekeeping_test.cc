// The scheduler's housekeeping round (src/scheduler/housekeeping.h) and the standalone mode's cluster file
// (LoadClusterFile), which tessera-scheduler's main used to do itself.
#include "scheduler/housekeeping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "common/clock.h"
#include "scheduler/standalone.h"
#include "temp_dir.h"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Share;
using ::testing::HasSubstr;

TEST(HousekeepingTest, ARoundReleasesAReservationOnlyOnceItIsAMinuteOld) {
  FakeClock clock;
  CacheOptions o;
  o.policy = "tessera";
  o.seed = 7;
  o.clock = &clock;
  ClusterCache cache(o);
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  StandaloneBinder binder;
  Extender extender(cache, binder, nullptr);
  Housekeeping housekeeping(cache, extender, nullptr);
  const core::PodRequest a = MakePod("a", {Share(60)});
  ASSERT_TRUE(cache.Reserve(a, core::NodeName("n1")).ok());

  clock.Advance(Housekeeping::kReservationTtl - std::chrono::seconds(1));
  Housekeeping::Round round = housekeeping.RunOnce();
  EXPECT_EQ(round.expired, 0);
  EXPECT_TRUE(round.share_failures.empty());
  EXPECT_TRUE(absl::IsAlreadyExists(cache.Reserve(a, core::NodeName("n1")).status()));  // still held

  clock.Advance(std::chrono::seconds(2));
  round = housekeeping.RunOnce();
  EXPECT_EQ(round.expired, 1);
  EXPECT_EQ(cache.pod_count(), 0);
}

TEST(HousekeepingTest, StopsPromptlyWhetherStartedOrNot) {
  ClusterCache cache(CacheOptions{});
  StandaloneBinder binder;
  Extender extender(cache, binder, nullptr);
  { Housekeeping never_started(cache, extender, nullptr); }
  Housekeeping housekeeping(cache, extender, nullptr);
  housekeeping.Start();
  housekeeping.Start();  // once is enough
  housekeeping.Stop();
  housekeeping.Stop();
}

TEST(LoadClusterFileTest, TheBundledExampleLoadsItsNodesAndQuotas) {
  ClusterCache cache(CacheOptions{});
  absl::Status st = LoadClusterFile(cache, TESSERA_SOURCE_DIR "/examples/cluster-small.yaml");
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(cache.node_count(), 3);  // dgx-a100, t4-box, v100-2s
}

TEST(LoadClusterFileTest, ErrorsNameTheFile) {
  tessera::testing::TempDir dir;
  const std::string path = dir.path() + "/bad.yaml";
  std::ofstream(path) << "nodes: 7\n";
  ClusterCache cache(CacheOptions{});
  absl::Status st = LoadClusterFile(cache, path);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(path));
  st = LoadClusterFile(cache, dir.path() + "/missing.yaml");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("missing.yaml"));
}

}  // namespace
}  // namespace tessera::scheduler
