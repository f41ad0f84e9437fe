#include "core/topology.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::ReadTestData;

TEST(LinkTest, ParsesWhatNvidiaSmiPrints) {
  EXPECT_EQ(*Link::Parse("NV12"), Link::NvLink(12));
  EXPECT_EQ(*Link::Parse(" pix "), Link::Of(LinkKind::kPix));
  EXPECT_EQ(*Link::Parse("SOC"), Link::Of(LinkKind::kSys));  // older drivers
  EXPECT_EQ(*Link::Parse("X"), Link::Self());
  EXPECT_FALSE(Link::Parse("NV").ok());
  EXPECT_FALSE(Link::Parse("NV0").ok());
  absl::StatusOr<Link> bad = Link::Parse("QPI");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("expected X, NV<links>"), std::string::npos);
}

TEST(LinkTest, CostsOrderNearestFirst) {
  // NVML's order: NVLink (more links nearer), PIX, PXB, PHB, NODE, SYS.
  std::vector<Link> order = {Link::NvLink(18),          Link::NvLink(12),         Link::NvLink(1),
                             Link::Of(LinkKind::kPix),  Link::Of(LinkKind::kPxb), Link::Of(LinkKind::kPhb),
                             Link::Of(LinkKind::kNode), Link::Of(LinkKind::kSys)};
  for (size_t i = 1; i < order.size(); ++i) {
    EXPECT_LT(order[i - 1].Cost(), order[i].Cost())
        << order[i - 1].ToString() << " vs " << order[i].ToString();
  }
}

TEST(LinkMatrixTest, FromRowsValidates) {
  EXPECT_TRUE(LinkMatrix::FromRows({{"X", "PIX"}, {"PIX", "X"}}).ok());
  EXPECT_FALSE(LinkMatrix::FromRows({{"X", "PIX"}, {"PHB", "X"}}).ok());    // not symmetric
  EXPECT_FALSE(LinkMatrix::FromRows({{"PIX", "PIX"}, {"PIX", "X"}}).ok());  // diagonal must be X
  EXPECT_FALSE(LinkMatrix::FromRows({{"X"}, {"PIX", "X"}}).ok());           // ragged
}

TEST(NvidiaSmiTopoTest, DgxA100) {
  absl::StatusOr<TopoReport> r = ParseNvidiaSmiTopo(ReadTestData("topo/dgx-a100.txt"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->links.size(), 8);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) EXPECT_EQ(r->links.at(a, b), a == b ? Link::Self() : Link::NvLink(12));
  }
  EXPECT_EQ(r->numa_node[0], 3);
  EXPECT_EQ(r->numa_node[2], 1);
  EXPECT_EQ(r->cpu_affinity[4], "112-127,240-255");
}

TEST(NvidiaSmiTopoTest, TwoSocketOldDriver) {
  absl::StatusOr<TopoReport> r = ParseNvidiaSmiTopo(ReadTestData("topo/two-socket-8gpu.txt"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->links.size(), 8);
  EXPECT_EQ(r->links.at(0, 1), Link::Of(LinkKind::kPix));
  EXPECT_EQ(r->links.at(0, 2), Link::Of(LinkKind::kPhb));
  EXPECT_EQ(r->links.at(3, 4), Link::Of(LinkKind::kSys));
  EXPECT_EQ(r->cpu_affinity[5], "10-19,30-39");
  EXPECT_EQ(r->numa_node[5], -1);  // this driver prints no NUMA column
}

TEST(NvidiaSmiTopoTest, FiveGpusTabSeparatedOrNot) {
  absl::StatusOr<TopoReport> r = ParseNvidiaSmiTopo(ReadTestData("topo/two-socket-5gpu.txt"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->links.at(1, 2), Link::Of(LinkKind::kPhb));
  EXPECT_EQ(r->links.at(1, 3), Link::Of(LinkKind::kNode));
  EXPECT_EQ(r->numa_node[0], 1);
  absl::StatusOr<TopoReport> t = ParseNvidiaSmiTopo(ReadTestData("topo/pcie-4gpu-t4.txt"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->links.at(2, 3), Link::Of(LinkKind::kPix));
  EXPECT_EQ(t->links.at(0, 3), Link::Of(LinkKind::kPxb));
}

TEST(NvidiaSmiTopoTest, ErrorsNameTheLine) {
  EXPECT_FALSE(ParseNvidiaSmiTopo("nothing here").ok());
  // A row with a link nvidia-smi never prints.
  absl::StatusOr<TopoReport> r = ParseNvidiaSmiTopo("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("FOO"), std::string::npos);
  // Fewer rows than the header names.
  absl::StatusOr<TopoReport> short_rows = ParseNvidiaSmiTopo("\tGPU0\tGPU1\nGPU0\t X \tPIX\n");
  ASSERT_FALSE(short_rows.ok());
  EXPECT_NE(std::string(short_rows.status().message()).find("names 2 GPUs but 1"), std::string::npos);
  // A row cut short.
  absl::StatusOr<TopoReport> cut = ParseNvidiaSmiTopo("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\n");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(std::string(cut.status().message()).find("line 2"), std::string::npos);
  // A GPU column that is not GPU<n> used to be taken for a NIC: 3 GPUs in, "2 GPUs" out, exit 0.
  absl::StatusOr<TopoReport> garbled = ParseNvidiaSmiTopo(
      "\tGPU0\tGPU1\tGPU#2\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPIX\nGPU#2\tPIX\tPIX\t X \n");
  ASSERT_FALSE(garbled.ok());
  EXPECT_NE(std::string(garbled.status().message()).find("GPU#2"), std::string::npos);
}

TEST(CpuListTest, Ranges) {
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList("0-2,8");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 8}));
  EXPECT_TRUE(ParseCpuList("N/A")->empty());
  EXPECT_FALSE(ParseCpuList("3-1").ok());
  EXPECT_FALSE(ParseCpuList("a-b").ok());
}

}  // namespace
}  // namespace tessera::core
