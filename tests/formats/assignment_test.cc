// The tessera.dev/assignment annotation (docs/protocols.md).
#include "formats/assignment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
  absl::StatusOr<Assignment> a = ParseAssignment(text);
  ASSERT_TRUE(a.ok()) << a.status();
  core::Placement back = ToPlacement(*a);
  EXPECT_EQ(back, Example());
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
