// The topology block that cluster files and fake-GPU files share (docs/file-formats.md), read by one reader.
#include "formats/gpu_topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/strings.h"
#include "formats/yaml_fields.h"

namespace tessera::formats {
namespace {

using ::testing::HasSubstr;

std::optional<GpuTopology> Read(const std::string& yaml, int gpus) {
  return ReadGpuTopology(YAML::Load(yaml), gpus, "the node has");
}

// The error ReadGpuTopology throws, with its line.
std::string Error(const std::string& yaml, int gpus) {
  try {
    Read(yaml, gpus);
  } catch (const FileError& e) {
    return StrCat("line ", e.line, ": ", e.message);
  }
  ADD_FAILURE() << "no error for " << yaml;
  return "";
}

TEST(GpuTopologyTest, TopologyTextGivesLinksNumaAndCpus) {
  // Two GPUs on one PCIe switch, in the layout `nvidia-smi topo -m` prints with its affinity columns.
  std::optional<GpuTopology> t = Read(
      "topology: |\n"
      "  \tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
      "  GPU0\t X \tPIX\t0-15\t0\n"
      "  GPU1\tPIX\t X \t0-15\t0\n",
      2);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->links.at(0, 1), core::Link::Of(core::LinkKind::kPix));
  ASSERT_EQ(t->numa_node.size(), 2u);
  EXPECT_EQ(t->numa_node[1], 0);
  EXPECT_EQ(t->cpu_affinity[0], "0-15");
}

TEST(GpuTopologyTest, LinksGiveTheMatrixAlone) {
  std::optional<GpuTopology> t = Read("links: [[X, NV12], [NV12, X]]", 2);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->links.at(1, 0), core::Link::NvLink(12));
  EXPECT_TRUE(t->numa_node.empty());
  EXPECT_TRUE(t->cpu_affinity.empty());
  EXPECT_FALSE(Read("name: a", 2));
}

TEST(GpuTopologyTest, ErrorsNameTheLineAndWhatToWrite) {
  EXPECT_THAT(Error("links: [[X]]\ntopology: x\n", 1), HasSubstr("give either topology"));
  EXPECT_THAT(Error("links:\n  - [X, PIX]\n  - [PIX, Y]\n", 2),
              HasSubstr("line 3: unknown link level \"Y\""));
  EXPECT_THAT(Error("links: X\n", 1), HasSubstr("links must be a list of rows"));
  EXPECT_THAT(Error("links: [X]\n", 1), HasSubstr("each row of links must be a list"));
  EXPECT_THAT(Error("links: [[X, PIX], [PIX, X]]\n", 3), HasSubstr("links is 2x2 but the node has 3 GPUs"));
  EXPECT_THAT(Error("topology: |\n  GPU0 GPU1\n  GPU0 X PIX\n  GPU1 PIX X\n", 3),
              HasSubstr("topology describes 2 GPUs but the node has 3"));
}

}  // namespace
}  // namespace tessera::formats
