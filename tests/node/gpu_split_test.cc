// Which GPUs tessera-node gives to DRA (--dra-gpus), what the device-plugin path then sees, and where a
// health change goes (src/node/gpu_split.h; docs/dra.md, "One node, two paths").
#include "node/gpu_split.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/strings.h"

namespace tessera::node {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

formats::GpuInventory Inventory(int n) {
  formats::GpuInventory inv;
  for (int i = 0; i < n; ++i) {
    formats::InventoryGpu g;
    g.info.uuid = core::GpuUuid(StrCat("GPU-", i));
    g.info.index = i;
    g.info.model = "A100";
    g.info.memory = core::MiB(40960);
    inv.gpus.push_back(g);
  }
  return inv;
}

TEST(GpuSplitTest, NoneGivesEveryGpuToTheDevicePlugin) {
  absl::StatusOr<GpuSplit> split = SplitGpus(Inventory(2), "");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_FALSE(split->has_dra());
  EXPECT_THAT(split->dra_uuids, IsEmpty());
  for (const formats::InventoryGpu& g : split->device_plugin_inventory.gpus) {
    EXPECT_EQ(g.info.health, core::GpuHealth::kHealthy);
  }
  const HealthRoute route = split->RouteHealth(core::GpuUuid("GPU-0"), true);
  EXPECT_FALSE(route.dra);
  EXPECT_TRUE(route.device_plugin);
}

TEST(GpuSplitTest, ListedGpusLeaveTheDevicePluginPathUnhealthyForThatReason) {
  absl::StatusOr<GpuSplit> split = SplitGpus(Inventory(4), "2-3");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_THAT(split->dra_indices, ElementsAre(2, 3));
  EXPECT_THAT(split->dra_uuids, ElementsAre("GPU-2", "GPU-3"));
  const auto& gpus = split->device_plugin_inventory.gpus;
  ASSERT_EQ(gpus.size(), 4u);  // still every GPU: the extender sees the DRA ones as unhealthy
  EXPECT_EQ(gpus[0].info.health, core::GpuHealth::kHealthy);
  EXPECT_EQ(gpus[1].info.health, core::GpuHealth::kHealthy);
  EXPECT_EQ(gpus[2].info.health, core::GpuHealth::kUnhealthy);
  EXPECT_EQ(gpus[2].health_reason, formats::kDraHealthReason);
  EXPECT_EQ(gpus[3].info.health, core::GpuHealth::kUnhealthy);
}

TEST(GpuSplitTest, AllGivesEveryGpuToDra) {
  absl::StatusOr<GpuSplit> split = SplitGpus(Inventory(3), "all");
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_THAT(split->dra_indices, ElementsAre(0, 1, 2));
  for (const formats::InventoryGpu& g : split->device_plugin_inventory.gpus) {
    EXPECT_EQ(g.info.health, core::GpuHealth::kUnhealthy);
  }
}

TEST(GpuSplitTest, HealthReachesEachPathAsItShould) {
  absl::StatusOr<GpuSplit> split = SplitGpus(Inventory(2), "1");
  ASSERT_TRUE(split.ok()) << split.status();
  // A device-plugin GPU: both paths hear of it (the DRA driver ignores GPUs it does not publish).
  HealthRoute r = split->RouteHealth(core::GpuUuid("GPU-0"), false);
  EXPECT_TRUE(r.dra);
  EXPECT_TRUE(r.device_plugin);
  r = split->RouteHealth(core::GpuUuid("GPU-0"), true);
  EXPECT_TRUE(r.dra);
  EXPECT_TRUE(r.device_plugin);
  // A DRA GPU that fails is also marked on the device-plugin path (with the failure's reason); healthy
  // again, it stays out of that path.
  r = split->RouteHealth(core::GpuUuid("GPU-1"), false);
  EXPECT_TRUE(r.dra);
  EXPECT_TRUE(r.device_plugin);
  r = split->RouteHealth(core::GpuUuid("GPU-1"), true);
  EXPECT_TRUE(r.dra);
  EXPECT_FALSE(r.device_plugin);
}

TEST(GpuSplitTest, BadListsSayWhatToGive) {
  absl::StatusOr<GpuSplit> split = SplitGpus(Inventory(2), "one");
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr("give \"all\" or GPU indices such as 6,7 or 4-7"));
  split = SplitGpus(Inventory(2), "1,5");
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("--dra-gpus names GPU 5; this node has GPUs 0-1"));
}

}  // namespace
}  // namespace tessera::node
