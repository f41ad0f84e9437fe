// The agent's records (node/record.h): the file format round trip, strict parsing of what a damaged or edited
// file holds, and the records directory's handling of such files.
#include "node/record.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/strings.h"
#include "temp_dir.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::TempDir;
using ::testing::HasSubstr;

ContainerRecord Sample() {
  ContainerRecord r;
  r.pod_uid = "00000000-0000-4000-8000-000000000001";
  r.ns = "ml";
  r.pod_name = "infer-0";
  r.container = "main";
  core::VGpuAssignment v;
  v.uuid = core::GpuUuid("GPU-1");
  v.gpu_index = 1;
  v.cores = core::MilliGpu(300);
  v.memory = core::MiB(4096);
  v.requested = core::MilliGpu(400);
  r.vgpus = {v};
  r.gpu_tenants = {2};
  r.numa_node = 0;
  r.cpus = "0-7";
  r.device_ids = {"GPU-1::3"};
  r.generation = 4;
  r.dir = "/var/lib/tessera/containers/" + r.pod_uid + "/main";
  r.region_dir = "/var/lib/tessera/regions/" + r.pod_uid + "/main";
  r.compute_policy = core::ComputePolicy::kElastic;
  r.priority = core::Priority::kHigh;
  r.allocated_at = "2026-11-25T10:00:00Z";
  r.reported = true;
  r.confirmed = true;
  return r;
}

TEST(RecordTest, RoundTripsEveryField) {
  const ContainerRecord r = Sample();
  absl::StatusOr<ContainerRecord> back = ParseRecord(SerializeRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, r);
  // The file spells the policy and priority as words (docs/node-agent.md, "Records").
  EXPECT_THAT(SerializeRecord(r), HasSubstr(R"("computePolicy":"elastic")"));
  EXPECT_THAT(SerializeRecord(r), HasSubstr(R"("priority":"high")"));
}

TEST(RecordTest, DamagedOrEditedFilesAreErrorsThatSayWhat) {
  std::string text = SerializeRecord(Sample());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  struct Case {
    std::string text;
    std::string says;
  };
  const Case cases[] = {
      // A policy the hook does not know used to be read as "hard" without a word.
      {with(R"("computePolicy":"elastic")", R"("computePolicy":"burst")"), "hard or elastic"},
      {with(R"("priority":"high")", R"("priority":"urgent")"), "low or high"},
      {with(R"("version":1)", R"("version":2)"), "unknown record version"},
      {with(R"("generation":4)", R"("generation":"4")"), "generation"},
      {with(R"("generation":4)", R"("generation":1e999)"), ""},
      {with(R"("podUID":"00000000-0000-4000-8000-000000000001")", R"("podUID":"../../etc")"), "podUID"},
      {with(R"("gpuTenants":[2])", R"("gpuTenants":[2,1])"), "one per vGPU"},
      {with(R"("gpuTenants":[2])", R"("gpuTenants":[0])"), "1..1000"},
      {with(R"("gpuTenants":[2])", R"("gpuTenants":"2")"), "gpuTenants"},
      // json's own conversion casts silently: these were read as 1, 300 and 1.
      {with(R"("gpuTenants":[2])", R"("gpuTenants":[4294967297])"), "gpuTenants is out of range"},
      {with(R"("milliCores":300)", R"("milliCores":4294967596)"), "milliCores is out of range"},
      {with(R"("generation":4)", R"("generation":1.5)"), "generation must be a whole number"},
      {with(R"("gpuTenants":[2])", R"("gpuTenants":[-1])"), "gpuTenants"},
      {with(R"("gpuTenants":[2])", R"("gpuTenants":[1.5])"), "gpuTenants"},
      {with(R"("gpuTenants":[2])", R"("gpuTenants":[1e999])"), ""},
      {"[]", "JSON object"},
      {text.substr(0, text.size() / 2), ""},
      {std::string(100000, '['), ""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ContainerRecord> r = ParseRecord(c.text);
    EXPECT_FALSE(r.ok()) << c.text.substr(0, 200);
    if (!r.ok()) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.says));
    }
  }
}

TEST(RecordTest, LimitsFollowTheRecord) {
  hook::Limits l = LimitsFor(Sample());
  ASSERT_EQ(l.device_count, 1);
  EXPECT_EQ(l.generation, 4u);
  EXPECT_STREQ(l.devices[0].uuid, "GPU-1");
  EXPECT_EQ(l.devices[0].cores_percent, 30u);
  EXPECT_EQ(l.devices[0].memory_bytes, uint64_t{4096} << 20);
  EXPECT_EQ(l.devices[0].policy, hook::ComputePolicy::kElastic);
  EXPECT_EQ(l.devices[0].priority, hook::Priority::kHigh);
  EXPECT_EQ(l.devices[0].tenants, 2u);
  EXPECT_STREQ(l.region_path, kContainerRegionFile);
  // A record of an older agent counts no tenants: the file says nothing, the hook does not know.
  ContainerRecord old = Sample();
  old.gpu_tenants.clear();
  EXPECT_EQ(LimitsFor(old).devices[0].tenants, 0u);
  std::string text = SerializeRecord(Sample());
  text.replace(text.find(R"("gpuTenants":[2],)"), std::string(R"("gpuTenants":[2],)").size(), "");
  absl::StatusOr<ContainerRecord> back = ParseRecord(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->gpu_tenants.empty());
}

// The share goes to the limits file in the ledger's thousandths, unrounded; `cores=` beside it is for hooks
// that read percent only, rounded down. The nearest percent (at least 1) used to give 12.5% as 13% and 0.1%
// as 1%.
TEST(RecordTest, LimitsCarryTheLedgersThousandthsUnrounded) {
  for (const auto& [milli, percent] : std::vector<std::pair<int, uint32_t>>{
           {125, 12}, {1, 1}, {9, 1}, {10, 1}, {999, 99}, {1000, 100}, {333, 33}, {905, 90}}) {
    ContainerRecord r = Sample();
    r.vgpus[0].cores = core::MilliGpu(milli);
    const hook::Limits written = LimitsFor(r);
    EXPECT_EQ(written.devices[0].cores_milli, static_cast<uint32_t>(milli));
    EXPECT_EQ(written.devices[0].cores_percent, percent) << milli;
    char text[2048];
    const size_t n = hook::FormatLimits(written, text, sizeof(text));
    ASSERT_GT(n, 0u);
    EXPECT_THAT(std::string(text), HasSubstr(StrCat(" cores=", percent, " ")));
    EXPECT_THAT(std::string(text), HasSubstr(StrCat(" cores-milli=", milli)));
    hook::Limits read;
    hook::Error error;
    ASSERT_TRUE(hook::ParseLimits(text, n, &read, &error)) << error.text;
    EXPECT_EQ(hook::SharePpm(read.devices[0]), static_cast<uint32_t>(milli) * 1000u) << text;
    EXPECT_GE(hook::CeilingPpm(read.devices[0]), hook::SharePpm(read.devices[0]));
  }
}

// A file of an older agent (percent only) still reads, as the share it says; a line whose two shares
// disagree, or whose thousandths are out of range, is refused with the line's number.
TEST(RecordTest, LimitsFilesOfOlderAgentsStillReadAndDisagreementIsRefused) {
  const std::string old_file =
      "tessera-limits 1\ngeneration 2\ngpu uuid=GPU-1 index=0 memory=4294967296 cores=30 policy=hard "
      "ceiling=90 priority=low\n";
  hook::Limits read;
  hook::Error error;
  ASSERT_TRUE(hook::ParseLimits(old_file.data(), old_file.size(), &read, &error)) << error.text;
  EXPECT_EQ(read.devices[0].cores_milli, 0u);
  EXPECT_EQ(hook::SharePpm(read.devices[0]), 300000u);
  const std::string milli_only =
      "tessera-limits 1\ngeneration 2\ngpu uuid=GPU-1 memory=4294967296 cores-milli=125\n";
  ASSERT_TRUE(hook::ParseLimits(milli_only.data(), milli_only.size(), &read, &error)) << error.text;
  EXPECT_EQ(read.devices[0].cores_percent, 12u);
  EXPECT_EQ(hook::SharePpm(read.devices[0]), 125000u);
  for (const auto& [line, says] : std::vector<std::pair<std::string, std::string>>{
           {"gpu uuid=GPU-1 memory=1 cores=13 cores-milli=125", "does not match cores-milli=125"},
           {"gpu uuid=GPU-1 memory=1 cores=1 cores-milli=0", "cores-milli must be 1..1000"},
           {"gpu uuid=GPU-1 memory=1 cores=100 cores-milli=1001", "cores-milli must be 1..1000"},
           {"gpu uuid=GPU-1 memory=1 cores-milli=125 cores-milli=125", "given twice"},
           {"gpu uuid=GPU-1 memory=1", "needs memory=<bytes> and cores"}}) {
    const std::string text = "tessera-limits 1\ngeneration 2\n" + line + "\n";
    EXPECT_FALSE(hook::ParseLimits(text.data(), text.size(), &read, &error)) << line;
    EXPECT_THAT(std::string(error.text), HasSubstr(says)) << line;
  }
}

TEST(RecordTest, SignatureTellsTradableAllocationsApart) {
  const ContainerRecord r = Sample();
  ContainerRecord other = r;
  other.vgpus[0].uuid = core::GpuUuid("GPU-2");  // another GPU, same shape: tradable
  EXPECT_EQ(Signature(r.vgpus, r.compute_policy, r.priority),
            Signature(other.vgpus, other.compute_policy, other.priority));
  EXPECT_NE(Signature(r.vgpus, r.compute_policy, r.priority),
            Signature(r.vgpus, core::ComputePolicy::kHard, r.priority));
  EXPECT_NE(Signature(r.vgpus, r.compute_policy, r.priority),
            Signature(r.vgpus, r.compute_policy, core::Priority::kLow));
  EXPECT_FALSE(SameGpus(r.vgpus, other.vgpus));
  other = r;
  other.vgpus[0].cores = core::MilliGpu(200);
  EXPECT_TRUE(SameGpus(r.vgpus, other.vgpus));
  EXPECT_FALSE(SameLimits(r.vgpus, other.vgpus));
}

TEST(RecordStoreTest, SavesLoadsAndMovesBadFilesAside) {
  TempDir dir;
  RecordStore store(dir.path());
  const ContainerRecord r = Sample();
  ASSERT_TRUE(store.Save(r).ok());
  EXPECT_EQ(store.PathOf(r), dir.path() + "/" + r.pod_uid + "_main.json");
  // What a crash or an editor leaves: a temporary file, garbage, a record under another record's name.
  dir.Write(r.pod_uid + "_main.json.tmp.123", "{");
  dir.Write("garbage.json", "not json");
  dir.Write("huge.json", std::string(2 << 20, ' '));  // past the 1 MiB a record may take: not read whole
  ContainerRecord renamed = r;
  renamed.container = "sidecar";
  dir.Write("other_main.json", SerializeRecord(renamed));
  RecordStore::Loaded loaded = store.LoadAll();
  ASSERT_EQ(loaded.records.size(), 1u);
  EXPECT_EQ(loaded.records[0], r);
  ASSERT_EQ(loaded.bad.size(), 3u);
  EXPECT_TRUE(fs::exists(dir.path() + "/garbage.json.bad"));
  EXPECT_TRUE(fs::exists(dir.path() + "/huge.json.bad"));
  EXPECT_TRUE(fs::exists(dir.path() + "/other_main.json.bad"));
  EXPECT_FALSE(fs::exists(dir.path() + "/" + r.pod_uid + "_main.json.tmp.123"));
  // A second load finds only the good record: nothing is lost, nothing is read twice.
  EXPECT_EQ(store.LoadAll().records.size(), 1u);
  EXPECT_TRUE(store.Remove(store.PathOf(r)).ok());
  EXPECT_TRUE(store.Remove(store.PathOf(r)).ok());  // already gone: not an error
  EXPECT_TRUE(store.LoadAll().records.empty());
}

TEST(RecordStoreTest, ACheckTheCallerGivesMovesRefusedRecordsAside) {
  TempDir dir;
  RecordStore store(dir.path());
  ASSERT_TRUE(store.Save(Sample()).ok());
  RecordStore::Loaded loaded =
      store.LoadAll([](const ContainerRecord&) { return absl::InvalidArgumentError("names /etc"); });
  EXPECT_TRUE(loaded.records.empty());
  ASSERT_EQ(loaded.bad.size(), 1u);
  EXPECT_THAT(loaded.bad[0], HasSubstr("names /etc"));
  EXPECT_TRUE(fs::exists(store.PathOf(Sample()) + ".bad"));
}

TEST(RecordStoreTest, AFullOrMissingDirectorySaysSo) {
  RecordStore store("/nonexistent/tessera/records");
  absl::Status s = store.Save(Sample());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/tessera/records"));
  EXPECT_TRUE(store.LoadAll().records.empty());
}

}  // namespace
}  // namespace tessera::node
