// The tessera.dev/assignment annotation (docs/protocols.md).
#include "formats/assignment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "formats/vgpu_json.h"

namespace tessera::formats {
namespace {

using ::testing::HasSubstr;

core::Placement Example() {
  core::Placement p;
  p.node = core::NodeName("gpu-1");
  core::ContainerAssignment main{"main", {}, 0, "0-15"};
  main.vgpus.push_back({0, core::GpuUuid("GPU-aa"), core::MilliGpu(300), core::MiB(4096)});
  main.vgpus.push_back(
      {3, core::GpuUuid("GPU-dd"), core::MilliGpu(333), core::MiB(5461), core::MilliGpu(500)});
  p.containers.push_back(main);
  core::ContainerAssignment side;
  side.name = "side";
  side.vgpus.push_back({1, core::GpuUuid("GPU-bb"), core::MilliGpu(1000), core::MiB(16384)});
  p.containers.push_back(side);
  return p;
}

TEST(AssignmentTest, RoundTrips) {
  const std::string text = FormatAssignment(Example());
  EXPECT_THAT(text, HasSubstr(R"("cores":30,)"));
  EXPECT_THAT(text, HasSubstr(R"("cores":33.3,)"));
  EXPECT_THAT(text, HasSubstr(R"("requestedCores":50)"));
  // The ledger's thousandths, as integers: what counts.
  EXPECT_THAT(text, HasSubstr(R"("milliCores":333,)"));
  EXPECT_THAT(text, HasSubstr(R"("requestedMilliCores":500)"));
  absl::StatusOr<Assignment> a = ParseAssignment(text);
  ASSERT_TRUE(a.ok()) << a.status();
  core::Placement back = ToPlacement(*a);
  EXPECT_EQ(back, Example());
}

// The share is carried in thousandths (milliCores, the unit the scheduler's ledger commits in); an annotation
// of an older scheduler (percent only) still reads as the same share, and one written with milliCores alone
// too.
TEST(AssignmentTest, ReadsTheShareInThousandthsAndInPercent) {
  const auto share = [](const std::string& vgpu) -> absl::StatusOr<core::VGpuAssignment> {
    absl::StatusOr<Assignment> a = ParseAssignment(
        R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","memoryMiB":1,)" + vgpu +
        "}]}]}");
    if (!a.ok()) return a.status();
    return a->containers[0].vgpus[0];
  };
  EXPECT_EQ(share(R"("cores":12.5)")->cores.value(), 125);
  EXPECT_EQ(share(R"("milliCores":125)")->cores.value(), 125);
  EXPECT_EQ(share(R"("cores":12.5,"milliCores":125)")->cores.value(), 125);
  EXPECT_EQ(share(R"("cores":0.1,"milliCores":1)")->cores.value(), 1);
  absl::StatusOr<core::VGpuAssignment> compressed =
      share(R"("cores":40,"milliCores":400,"requestedCores":80,"requestedMilliCores":800)");
  ASSERT_TRUE(compressed.ok()) << compressed.status();
  EXPECT_EQ(compressed->requested.value(), 800);
  EXPECT_EQ(share(R"("milliCores":400,"requestedMilliCores":800)")->requested.value(), 800);
  // Two values of one share that disagree are refused, never one of them picked.
  for (const auto& [vgpu, says] : std::vector<std::pair<std::string, std::string>>{
           {R"("cores":13,"milliCores":125)", "not the same share"},
           {R"("cores":40,"milliCores":400,"requestedCores":80,"requestedMilliCores":900)",
            "not the same share"},
           {R"("milliCores":0)", "1-1000 thousandths"},
           {R"("milliCores":1001)", "1-1000 thousandths"},
           {R"("milliCores":12.5)", "1-1000 thousandths"},
           {R"("cores":0.04)", "smallest share"},
           {R"("milliCores":400,"requestedMilliCores":300)", "requestedCores"}}) {
    absl::StatusOr<core::VGpuAssignment> v = share(vgpu);
    ASSERT_FALSE(v.ok()) << vgpu;
    EXPECT_THAT(std::string(v.status().message()), HasSubstr(says)) << vgpu;
  }
}

TEST(AssignmentTest, RefusesWhatItCannotTrust) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not valid JSON"},
      {R"({"version":2,"node":"n","containers":[]})", "version 2"},
      {R"({"version":1,"containers":[]})", "no \"node\""},
      {R"({"version":1,"node":"n"})", "containers"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":0,"memoryMiB":1}]}]})",
       "0-100 percent"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":150,"memoryMiB":1}]}]})",
       "150"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":10}]}]})",
       "memoryMiB"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[]},{"name":"a","vgpus":[]}]})", "twice"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":10,"memoryMiB":1},)"
       R"({"uuid":"G","cores":10,"memoryMiB":1}]}]})",
       "appears twice"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":40,"requestedCores":30,"memoryMiB":1}]}]})",
       "requestedCores"},
      // Numbers that a narrowing read would have taken for valid ones (2^32 + 1 read as an int is 1).
      {R"({"version":4294967297,"node":"n","containers":[]})", "version 4294967297"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","index":4294967296,"cores":10,"memoryMiB":1}]}]})",
       "GPU index"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","numaNode":18446744073709551615,"vgpus":[]}]})",
       "NUMA node"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":10,"memoryMiB":18446744073709551615}]}]})",
       "memoryMiB"},
      {R"({"version":1,"node":"n","containers":[{"name":"a","vgpus":[{"uuid":"G","cores":1e999,"memoryMiB":1}]}]})",
       "outside the range"},
      {std::string(100000, '[') + std::string(100000, ']'), "nested deeper"},
  };
  for (const auto& [text, expected] : cases) {
    absl::StatusOr<Assignment> a = ParseAssignment(text);
    ASSERT_FALSE(a.ok()) << text;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(expected)) << text;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("tessera.dev/assignment"));
  }
}

}  // namespace
}  // namespace tessera::formats

namespace tessera::formats {
namespace {

// One vGPU in the annotation's and the record's format (VGpuJson): the same share, memory, GPU and index in
// each, in the fields docs/protocols.md and docs/node-agent.md give (the annotation's percent is exactly the
// thousandths / 10, and its requested share is written only when compressed; the record's always).
TEST(VGpuJsonTest, TheAnnotationAndTheRecordWriteOneShareAlike) {
  const core::VGpuAssignment compressed{3, core::GpuUuid("GPU-dd"), core::MilliGpu(333), core::MiB(5461),
                                        core::MilliGpu(500)};
  const nlohmann::json a = VGpuJson(compressed, VGpuFormat::kAssignment);
  const nlohmann::json r = VGpuJson(compressed, VGpuFormat::kRecord);
  for (const char* key : {"uuid", "index", "milliCores", "memoryMiB", "requestedMilliCores"}) {
    EXPECT_EQ(a.at(key), r.at(key)) << key;
  }
  EXPECT_EQ(a, nlohmann::json::parse(R"({"uuid":"GPU-dd","index":3,"cores":33.3,"milliCores":333,
      "memoryMiB":5461,"requestedCores":50,"requestedMilliCores":500})"));
  EXPECT_EQ(r, nlohmann::json::parse(R"({"uuid":"GPU-dd","index":3,"milliCores":333,"memoryMiB":5461,
      "requestedMilliCores":500})"));
  const core::VGpuAssignment whole{-1, core::GpuUuid("GPU-aa"), core::MilliGpu(1000), core::MiB(16384)};
  EXPECT_EQ(VGpuJson(whole, VGpuFormat::kAssignment),
            nlohmann::json::parse(R"({"uuid":"GPU-aa","cores":100,"milliCores":1000,"memoryMiB":16384})"));
  EXPECT_EQ(
      VGpuJson(whole, VGpuFormat::kRecord),
      nlohmann::json::parse(
          R"({"uuid":"GPU-aa","index":-1,"milliCores":1000,"memoryMiB":16384,"requestedMilliCores":0})"));
}

}  // namespace
}  // namespace tessera::formats
