#include "formats/inventory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/strings.h"

namespace tessera::formats {
namespace {

using ::testing::HasSubstr;

GpuInventory TwoGpus() {
  GpuInventory inv;
  inv.source = "nvml";
  inv.driver_version = "550.54.15";
  InventoryGpu a;
  a.info = {core::GpuUuid("GPU-aaaa"), 0, "A100-SXM4-80GB", core::MiB(81920), 0, core::GpuHealth::kHealthy};
  a.pci_bus_id = "0000:07:00.0";
  a.cpus = "0-15,64-79";
  InventoryGpu b;
  b.info = {core::GpuUuid("GPU-bbbb"), 1, "A100-SXM4-80GB", core::MiB(81920), 1, core::GpuHealth::kUnhealthy};
  b.health_reason = "XID 79";
  b.cpus = "16-31";
  inv.gpus = {a, b};
  inv.links = core::LinkMatrix(2);
  inv.links.Set(0, 1, core::Link::NvLink(12));
  return inv;
}

std::string ParseError(const std::string& json) {
  absl::StatusOr<GpuInventory> inv = ParseGpuInventory(json);
  EXPECT_FALSE(inv.ok()) << json;
  return inv.ok() ? "" : Message(inv.status());
}

TEST(InventoryAnnotationTest, RoundTrip) {
  const GpuInventory inv = TwoGpus();
  ASSERT_TRUE(inv.Validate().ok());
  const std::string json = SerializeGpuInventory(inv);
  EXPECT_THAT(json, HasSubstr("\"version\":1"));
  EXPECT_THAT(json, HasSubstr("\"links\":[[\"X\",\"NV12\"],[\"NV12\",\"X\"]]"));
  absl::StatusOr<GpuInventory> back = ParseGpuInventory(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, inv);
}

TEST(InventoryAnnotationTest, EmptyNode) {
  GpuInventory inv;
  inv.links = core::LinkMatrix(0);
  absl::StatusOr<GpuInventory> back = ParseGpuInventory(SerializeGpuInventory(inv));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->gpus.empty());
}

TEST(InventoryAnnotationTest, ApplyToNodeInfo) {
  core::NodeInfo node;
  node.name = core::NodeName("gpu-1");
  node.cpu = core::MilliCpu(64000);
  TwoGpus().ApplyTo(&node);
  EXPECT_EQ(node.name.value(), "gpu-1");
  EXPECT_EQ(node.cpu.value(), 64000);
  ASSERT_EQ(node.gpus.size(), 2u);
  EXPECT_EQ(node.gpus[1].uuid.value(), "GPU-bbbb");
  EXPECT_EQ(node.gpus[1].health, core::GpuHealth::kUnhealthy);
  EXPECT_EQ(node.gpus[0].numa_node, 0);
  EXPECT_EQ(node.links.at(1, 0), core::Link::NvLink(12));
  EXPECT_EQ(node.numa_cpus.at(0), "0-15,64-79");
  EXPECT_EQ(node.numa_cpus.at(1), "16-31");
}

TEST(InventoryAnnotationTest, UnknownFieldsAreIgnored) {
  absl::StatusOr<GpuInventory> inv = ParseGpuInventory(
      R"({"version":1,"future":{"x":1},"gpus":[{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":15360,)"
      R"("health":"Healthy","newField":true}],"links":[["X"]]})");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->gpus[0].info.numa_node, -1);  // left out: unknown
}

TEST(InventoryAnnotationTest, MalformedJson) {
  EXPECT_THAT(ParseError("{\"version\":1,"), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError(""), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError("[1,2]"), HasSubstr("expected a JSON object"));
  // Every message says where it comes from and what to do.
  EXPECT_THAT(ParseError("{"), HasSubstr("tessera.dev/gpu-inventory: "));
  EXPECT_THAT(ParseError("{"), HasSubstr("tessera-node"));
}

// Anyone who may patch a Node writes this annotation: nothing in it may abort the scheduler.
TEST(InventoryAnnotationTest, HostileNumbersAndNesting) {
  const std::string gpu = R"({"index":0,"uuid":"GPU-a","model":"T4","health":"Healthy","memoryMiB":)";
  // 1e999 is valid JSON but no double: nlohmann throws out_of_range, which the parser used not to catch.
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, R"(1e999}],"links":[["X"]]})")),
              HasSubstr("outside the range of a double"));
  EXPECT_THAT(ParseError(R"({"version":1e999,"gpus":[],"links":[]})"),
              HasSubstr("tessera.dev/gpu-inventory"));
  // 2^64 - 1 is an unsigned JSON number; read as int64 it used to be -1, a valid "numa".
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu,
                                R"(1024,"numa":18446744073709551615}],"links":[["X"]]})")),
              HasSubstr("\"numa\" is 18446744073709551615"));
  EXPECT_THAT(
      ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, R"(18446744073709551615}],"links":[["X"]]})")),
      HasSubstr("memoryMiB"));
  const std::string deep = StrCat(R"({"version":1,"gpus":[],"links":[],"x":)", std::string(300000, '['),
                                  std::string(300000, ']'), "}");
  EXPECT_THAT(ParseError(deep), HasSubstr("nested deeper than"));
}

TEST(InventoryAnnotationTest, WrongVersion) {
  EXPECT_THAT(ParseError(R"({"gpus":[],"links":[]})"), HasSubstr("has no \"version\""));
  EXPECT_THAT(ParseError(R"({"version":"1","gpus":[],"links":[]})"), HasSubstr("must be a whole number"));
  const std::string e = ParseError(R"({"version":2,"gpus":[],"links":[]})");
  EXPECT_THAT(e, HasSubstr("version 2 is not supported"));
  EXPECT_THAT(e, HasSubstr("same release"));
}

TEST(InventoryAnnotationTest, MismatchedMatrix) {
  const std::string gpu = R"({"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":15360,"health":"Healthy"})";
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, R"(],"links":[["X","PIX"],["PIX","X"]]})")),
              HasSubstr("link matrix has 2 rows but there are 1 GPUs"));
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, R"(],"links":[["X","PIX"]]})")),
              HasSubstr("row 0 has 2 entries, expected 1"));
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, R"(]})")), HasSubstr("\"links\" must be"));
  const std::string gpu1 = R"({"index":1,"uuid":"GPU-b","model":"T4","memoryMiB":15360,"health":"Healthy"})";
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, ",", gpu1,
                                R"(],"links":[["X","PIX"],["PXB","X"]]})")),
              HasSubstr("not symmetric"));
  EXPECT_THAT(ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, ",", gpu1,
                                R"(],"links":[["X","NVX"],["NVX","X"]]})")),
              HasSubstr("unknown link level"));
  EXPECT_THAT(
      ParseError(StrCat(R"({"version":1,"gpus":[)", gpu, ",", gpu1, R"(],"links":[["X",3],[3,"X"]]})")),
      HasSubstr("not a link level"));
}

TEST(InventoryAnnotationTest, BadGpus) {
  auto doc = [](const std::string& gpus, const std::string& links = R"([["X"]])") {
    return StrCat(R"({"version":1,"gpus":)", gpus, R"(,"links":)", links, "}");
  };
  EXPECT_THAT(ParseError(doc("{}")), HasSubstr("\"gpus\" must be a list"));
  EXPECT_THAT(ParseError(doc("[1]")), HasSubstr("gpus[0] must be an object"));
  EXPECT_THAT(ParseError(doc(R"([{"index":0,"model":"T4","memoryMiB":1,"health":"Healthy"}])")),
              HasSubstr("gpus[0] has no \"uuid\""));
  EXPECT_THAT(
      ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":0,"health":"Healthy"}])")),
      HasSubstr("\"memoryMiB\" is 0"));
  EXPECT_THAT(
      ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":1.5,"health":"Healthy"}])")),
      HasSubstr("must be a whole number"));
  EXPECT_THAT(ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":1,"health":"ok"}])")),
              HasSubstr("expected \"Healthy\" or \"Unhealthy\""));
  EXPECT_THAT(ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":1,"health":"Healthy",)"
                             R"("cpus":"0-x"}])")),
              HasSubstr("\"cpus\""));
  EXPECT_THAT(
      ParseError(doc(R"([{"index":1,"uuid":"GPU-a","model":"T4","memoryMiB":1,"health":"Healthy"}])")),
      HasSubstr("index order"));
  EXPECT_THAT(ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":1,"health":"Healthy"},)"
                             R"({"index":1,"uuid":"GPU-a","model":"T4","memoryMiB":1,"health":"Healthy"}])",
                             R"([["X","SYS"],["SYS","X"]])")),
              HasSubstr("GPU-a appears twice"));
  EXPECT_THAT(ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"","memoryMiB":1,"health":"Healthy"}])")),
              HasSubstr("empty \"model\""));
  EXPECT_THAT(ParseError(doc(R"([{"index":0,"uuid":"GPU-a","model":"T4","memoryMiB":1,"health":"Healthy",)"
                             R"("numa":5000}])")),
              HasSubstr("\"numa\" is 5000"));
}

TEST(HeartbeatTest, FormatAndParse) {
  using namespace std::chrono;
  const system_clock::time_point t =
      sys_days(year(2026) / 11 / 22) + hours(8) + minutes(14) + seconds(3) + milliseconds(120);
  EXPECT_EQ(FormatHeartbeat(t), "2026-11-22T08:14:03.120Z");
  absl::StatusOr<system_clock::time_point> back = ParseHeartbeat("2026-11-22T08:14:03.120Z");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, t);
  // Offsets and other precisions, as other writers (kubectl, Go's time.RFC3339Nano) produce them.
  EXPECT_EQ(*ParseHeartbeat("2026-11-22T10:14:03.12+02:00"), t);
  EXPECT_EQ(*ParseHeartbeat("2026-11-22T08:14:03Z"), t - milliseconds(120));
  EXPECT_EQ(*ParseHeartbeat("2026-11-22T08:14:03.120000000Z"), t);
  // Round trip of now, to the millisecond.
  const auto now = floor<milliseconds>(system_clock::now());
  EXPECT_EQ(*ParseHeartbeat(FormatHeartbeat(now)), now);
}

// Found by fuzz/inventory_fuzz: year 0001 overflowed 64-bit nanoseconds (undefined behaviour).
TEST(HeartbeatTest, YearsOutsideTheClockAreRefused) {
  for (const char* t : {"0001-01-01T00:00:00Z", "1056-06-01T00:00:00Z", "9999-12-31T23:59:59Z"}) {
    absl::StatusOr<std::chrono::system_clock::time_point> p = ParseHeartbeat(t);
    ASSERT_FALSE(p.ok()) << t;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("1970-2200"));
  }
  EXPECT_TRUE(ParseHeartbeat("2026-11-22T08:14:03.120Z").ok());
}

TEST(HeartbeatTest, Malformed) {
  for (const char* bad : {"", "yesterday", "2026-11-22", "2026-11-22T08:14:03", "2026-13-22T08:14:03Z",
                          "2026-02-30T08:14:03Z", "2026-11-22T25:14:03Z", "2026-11-22T08:14:03.Z",
                          "2026-11-22T08:14:03Zjunk", "2026-11-22T08:14:03+2:00"}) {
    absl::StatusOr<std::chrono::system_clock::time_point> t = ParseHeartbeat(bad);
    EXPECT_FALSE(t.ok()) << bad;
    if (!t.ok()) {
      EXPECT_THAT(Message(t.status()), HasSubstr("RFC 3339")) << bad;
    }
  }
}

}  // namespace
}  // namespace tessera::formats
