#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <vector>

#include "common/files.h"
#include "core/strings.h"
#include "gpu/fake_gpu_file.h"
#include "gpu/gpu_source.h"
#include "gpu/health_monitor.h"
#include "gpu/nvml_library.h"
#include "gpu/nvml_source.h"
#include "temp_dir.h"

namespace tessera::gpu {
namespace {

using ::testing::HasSubstr;
using tessera::testing::TempDir;

std::string Example(const std::string& name) {
  return *ReadTextFile(std::string(TESSERA_SOURCE_DIR) + "/examples/fake-gpus/" + name);
}

std::string FakeError(const std::string& yaml) {
  absl::StatusOr<formats::GpuInventory> inv = ParseFakeGpuFile(yaml, "f.yaml");
  EXPECT_FALSE(inv.ok()) << yaml;
  return inv.ok() ? "" : Message(inv.status());
}

// Collects a HealthMonitor's reports and waits for them.
class Recorder {
 public:
  void operator()(const HealthUpdate& u) {
    std::lock_guard<std::mutex> lock(mu_);
    updates_.push_back(u);
    cv_.notify_all();
  }
  // Waits (a generous guard, not a timing assertion) until `n` updates arrived.
  std::vector<HealthUpdate> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return updates_.size() >= n; });
    return updates_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<HealthUpdate> updates_;
};

TEST(FakeGpuFileTest, Examples) {
  absl::StatusOr<formats::GpuInventory> pcie = ParseFakeGpuFile(Example("pcie-4gpu.yaml"), "pcie-4gpu.yaml");
  ASSERT_TRUE(pcie.ok()) << pcie.status();
  ASSERT_EQ(pcie->gpus.size(), 4u);
  EXPECT_EQ(pcie->gpus[2].info.model, "T4");
  EXPECT_EQ(pcie->gpus[2].info.memory.value(), 15360);
  EXPECT_EQ(pcie->gpus[2].info.numa_node, 0);  // from the topology's NUMA column
  EXPECT_EQ(pcie->gpus[2].cpus, "0-23,48-71");
  EXPECT_EQ(pcie->gpus[2].pci_bus_id, "0000:86:00.0");
  EXPECT_EQ(pcie->links.at(0, 1), core::Link::Of(core::LinkKind::kPix));
  EXPECT_EQ(pcie->links.at(0, 2), core::Link::Of(core::LinkKind::kPxb));
  EXPECT_EQ(pcie->source, "fake:pcie-4gpu.yaml");
  EXPECT_EQ(pcie->driver_version, "550.54.15");
  EXPECT_TRUE(pcie->Validate().ok());

  absl::StatusOr<formats::GpuInventory> nv = ParseFakeGpuFile(Example("nvlink-8gpu.yaml"), "nvlink-8gpu.yaml");
  ASSERT_TRUE(nv.ok()) << nv.status();
  ASSERT_EQ(nv->gpus.size(), 8u);
  EXPECT_EQ(nv->links.at(0, 7), core::Link::NvLink(12));
  EXPECT_EQ(nv->gpus[4].info.numa_node, 7);

  absl::StatusOr<formats::GpuInventory> two = ParseFakeGpuFile(Example("two-socket-8gpu.yaml"), "two.yaml");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->gpus[5].info.numa_node, 1);  // given in the file (this driver prints no NUMA column)
  EXPECT_EQ(two->gpus[5].cpus, "10-19,30-39");
  EXPECT_EQ(two->links.at(0, 4), core::Link::Of(core::LinkKind::kSys));
  EXPECT_EQ(two->links.at(0, 2), core::Link::Of(core::LinkKind::kPhb));
}

TEST(FakeGpuFileTest, ShorthandLinksAndDefaults) {
  absl::StatusOr<formats::GpuInventory> inv =
      ParseFakeGpuFile("gpus: {model: T4, count: 2, memoryMiB: 15360, numa: 1}\n", "f.yaml", "node-a");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->gpus[1].info.uuid.value(), "GPU-node-a-1");
  EXPECT_EQ(inv->gpus[1].info.numa_node, 1);
  EXPECT_EQ(inv->links.at(0, 1), core::Link::Of(core::LinkKind::kSys));  // no topology: SYS

  inv = ParseFakeGpuFile(
      "gpus:\n"
      "  - {model: T4, memoryMiB: 15360}\n"
      "  - {model: T4, memoryMiB: 15360, healthy: false, healthReason: XID 79, cpus: 0-7}\n"
      "links: [[X, NV2], [NV2, X]]\n",
      "f.yaml");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->gpus[0].info.uuid.value(), "GPU-fake-0");
  EXPECT_EQ(inv->gpus[1].info.health, core::GpuHealth::kUnhealthy);
  EXPECT_EQ(inv->gpus[1].health_reason, "XID 79");
  EXPECT_EQ(inv->links.at(0, 1), core::Link::NvLink(2));
}

TEST(FakeGpuFileTest, Errors) {
  EXPECT_THAT(FakeError(""), HasSubstr("the file is empty"));
  EXPECT_THAT(FakeError("gpus: [\n"), HasSubstr("f.yaml line"));
  EXPECT_THAT(FakeError("gpu: []\n"), HasSubstr("unknown field \"gpu\""));
  EXPECT_THAT(FakeError("kind: Cluster\ngpus: []\n"), HasSubstr("kind: FakeGpus"));
  EXPECT_THAT(FakeError("driverVersion: x\n"), HasSubstr("needs gpus"));
  EXPECT_THAT(FakeError("gpus:\n  - {memoryMiB: 1}\n"), HasSubstr("f.yaml line 2: a GPU needs a model"));
  EXPECT_THAT(FakeError("gpus:\n  - {model: T4, memoryMiB: lots}\n"), HasSubstr("must be a whole number"));
  EXPECT_THAT(FakeError("gpus:\n  - {model: T4, memoryMiB: 1, colour: red}\n"), HasSubstr("unknown field \"colour\""));
  EXPECT_THAT(FakeError("gpus:\n  - {model: T4, memoryMiB: 1, cpus: 9-3}\n"), HasSubstr("cpus"));
  EXPECT_THAT(FakeError("gpus:\n  - {model: T4, memoryMiB: 1, healthReason: x}\n"),
              HasSubstr("healthReason needs healthy: false"));
  EXPECT_THAT(FakeError("gpus:\n  - {uuid: GPU-a, model: T4, memoryMiB: 1}\n  - {uuid: GPU-a, model: T4, "
                        "memoryMiB: 1}\n"),
              HasSubstr("GPU-a appears twice"));
  EXPECT_THAT(FakeError("gpus: {model: T4, count: 2, memoryMiB: 1}\nlinks: [[X]]\n"),
              HasSubstr("links is 1x1 but the file lists 2 GPUs"));
  EXPECT_THAT(FakeError("gpus: {model: T4, count: 2, memoryMiB: 1}\nlinks: [[X, PIX], [PXB, X]]\n"),
              HasSubstr("not symmetric"));
  EXPECT_THAT(FakeError("gpus: {model: T4, count: 2, memoryMiB: 1}\nlinks: [[X, FAST], [FAST, X]]\n"),
              HasSubstr("unknown link level"));
  EXPECT_THAT(FakeError("gpus: {model: T4, count: 3, memoryMiB: 1}\ntopology: |\n  GPU0 GPU1\n  GPU0 X PIX\n"
                        "  GPU1 PIX X\n"),
              HasSubstr("topology describes 2 GPUs but the file lists 3"));
  EXPECT_THAT(FakeError("gpus: {model: T4, count: 2, memoryMiB: 1}\nlinks: [[X, PIX], [PIX, X]]\ntopology: x\n"),
              HasSubstr("not both"));
}

TEST(FakeGpuSourceTest, MissingFile) {
  absl::StatusOr<std::unique_ptr<FakeGpuSource>> src = FakeGpuSource::Open("/nonexistent/gpus.yaml");
  ASSERT_FALSE(src.ok());
  EXPECT_THAT(Message(src.status()), HasSubstr("cannot read the fake-GPU file /nonexistent/gpus.yaml"));
  EXPECT_THAT(Message(src.status()), HasSubstr("--fake-gpus"));
}

// tessera-node --fake-gpus /dev/zero used to read until bad_alloc.
TEST(FakeGpuSourceTest, EndlessFileIsCapped) {
  absl::StatusOr<std::unique_ptr<FakeGpuSource>> src = FakeGpuSource::Open("/dev/zero");
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(src.status())) << src.status();
  EXPECT_THAT(Message(src.status()), HasSubstr("/dev/zero is larger than 1048576 bytes"));
  EXPECT_THAT(Message(src.status()), HasSubstr("--fake-gpus"));
}

TEST(FakeGpuSourceTest, HealthChangesArePickedUp) {
  TempDir dir;
  const std::string yaml = "gpus:\n  - {uuid: GPU-a, model: T4, memoryMiB: 15360}\n"
                           "  - {uuid: GPU-b, model: T4, memoryMiB: 15360}\n";
  const std::string path = dir.Write("gpus.yaml", yaml);
  GpuSourceOptions options;
  options.fake_gpus_file = path;
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->Name(), "fake:" + path);
  absl::StatusOr<formats::GpuInventory> inv = (*src)->Read();
  ASSERT_TRUE(inv.ok()) << inv.status();

  Recorder recorder;
  HealthMonitor monitor(src->get(), *inv, [&](const HealthUpdate& u) { recorder(u); },
                        std::chrono::milliseconds(50));
  // Flip GPU-b unhealthy (a rename over the file, as editors do).
  dir.Write("gpus.yaml", "gpus:\n  - {uuid: GPU-a, model: T4, memoryMiB: 15360}\n"
                         "  - {uuid: GPU-b, model: T4, memoryMiB: 15360, healthy: false, healthReason: XID 48}\n");
  std::vector<HealthUpdate> seen = recorder.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (HealthUpdate{core::GpuUuid("GPU-b"), core::GpuHealth::kUnhealthy, "XID 48"}));

  // A malformed rewrite changes nothing (it is logged); fixing it brings GPU-b back.
  dir.Write("gpus.yaml", "gpus: [\n");
  {
    std::ofstream out(path, std::ios::trunc);  // and an in-place write, as `echo >` does
    out << yaml;
  }
  seen = recorder.WaitFor(2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].uuid.value(), "GPU-b");
  EXPECT_EQ(seen[1].health, core::GpuHealth::kHealthy);
  EXPECT_EQ(monitor.Current().at(core::GpuUuid("GPU-b")).health, core::GpuHealth::kHealthy);
}

TEST(NamesTest, NormalizeModelAndBus) {
  EXPECT_EQ(NormalizeModelName("NVIDIA A100-SXM4-80GB"), "A100-SXM4-80GB");
  EXPECT_EQ(NormalizeModelName("Tesla T4"), "T4");
  EXPECT_EQ(NormalizeModelName("Tesla V100-SXM2-32GB"), "V100-SXM2-32GB");
  EXPECT_EQ(NormalizeModelName("NVIDIA GeForce RTX 3090"), "GeForce-RTX-3090");
  EXPECT_EQ(NormalizeModelName("NVIDIA H100 80GB HBM3"), "H100-80GB-HBM3");
  EXPECT_EQ(NormalizePciBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("00010000:3B:00.0"), "00010000:3b:00.0");
}

TEST(NvmlLibraryTest, MissingLibraryGivesAClearError) {
  absl::StatusOr<std::unique_ptr<NvmlLibrary>> lib = NvmlLibrary::Load("libnvidia-ml-not-here.so.1");
  ASSERT_FALSE(lib.ok());
  const std::string m = Message(lib.status());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m, HasSubstr("cannot load NVML from libnvidia-ml-not-here.so.1"));
  EXPECT_THAT(m, HasSubstr("--fake-gpus"));

  GpuSourceOptions options;
  options.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options);
  ASSERT_FALSE(src.ok());
  EXPECT_THAT(Message(src.status()), HasSubstr("install the NVIDIA driver"));
}

TEST(NvmlLibraryTest, NotNvml) {
  // A real shared library that is not NVML: every required symbol is named as missing.
  absl::StatusOr<std::unique_ptr<NvmlLibrary>> lib = NvmlLibrary::Load("libm.so.6");
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(Message(lib.status()), HasSubstr("lacks nvmlInit_v2, nvmlShutdown"));
}

// The NVML path end to end through tests/gpu/fake_nvml.cc (a minimal fake: see its header).
class FakeNvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    xids_ = dir_.Write("xids", "");
    lost_ = dir_.Write("lost", "");
    // Sysfs knows GPU 0 and 1; GPUs 2 and 3 fall back to nvmlDeviceGetCpuAffinity.
    dir_.Write("sys/bus/pci/devices/0000:07:00.0/numa_node", "0\n");
    dir_.Write("sys/bus/pci/devices/0000:07:00.0/local_cpulist", "0-15,64-79\n");
    dir_.Write("sys/bus/pci/devices/0000:0f:00.0/numa_node", "0\n");
    dir_.Write("sys/bus/pci/devices/0000:0f:00.0/local_cpulist", "0-15,64-79\n");
    const std::string config = dir_.Write(
        "nvml.conf",
        StrCat("driver 535.129.03\n"
               "gpu GPU-11111111-0000-0000-0000-000000000000 81920 00000000:07:00.0 - NVIDIA A100-SXM4-80GB\n"
               "gpu GPU-22222222-0000-0000-0000-000000000000 81920 00000000:0F:00.0 - NVIDIA A100-SXM4-80GB\n"
               "gpu GPU-33333333-0000-0000-0000-000000000000 81920 00000000:47:00.0 16-31,80-95 NVIDIA "
               "A100-SXM4-80GB\n"
               "gpu GPU-44444444-0000-0000-0000-000000000000 81920 00000000:4E:00.0 16-31,80-95 NVIDIA "
               "A100-SXM4-80GB\n"
               "ancestor 0 1 20\nancestor 2 3 10\nancestor 0 2 50\nancestor 0 3 50\nancestor 1 2 50\n"
               "ancestor 1 3 50\n"
               "nvlink 0 1 4\n"
               "nvswitch 2 6\nnvswitch 3 6\n",
               "xids ", xids_, "\nlost ", lost_, "\n"));
    setenv("TESSERA_FAKE_NVML_CONFIG", config.c_str(), 1);
    options_.nvml_library = TESSERA_FAKE_NVML;
    options_.sysfs_root = dir_.path() + "/sys";
    options_.check_interval = std::chrono::milliseconds(0);  // check at every wait
  }
  void TearDown() override { unsetenv("TESSERA_FAKE_NVML_CONFIG"); }

  void Append(const std::string& path, const std::string& line) {
    std::ofstream out(path, std::ios::app);
    out << line << "\n";
  }

  TempDir dir_;
  std::string xids_, lost_;
  GpuSourceOptions options_;
};

TEST_F(FakeNvmlTest, Inventory) {
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options_);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->Name(), "nvml");
  absl::StatusOr<formats::GpuInventory> inv = (*src)->Read();
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->source, "nvml");
  EXPECT_EQ(inv->driver_version, "535.129.03");
  ASSERT_EQ(inv->gpus.size(), 4u);
  const formats::InventoryGpu& g0 = inv->gpus[0];
  EXPECT_EQ(g0.info.uuid.value(), "GPU-11111111-0000-0000-0000-000000000000");
  EXPECT_EQ(g0.info.index, 0);
  EXPECT_EQ(g0.info.model, "A100-SXM4-80GB");
  EXPECT_EQ(g0.info.memory.value(), 81920);
  EXPECT_EQ(g0.pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(g0.info.numa_node, 0);      // sysfs numa_node
  EXPECT_EQ(g0.cpus, "0-15,64-79");     // sysfs local_cpulist
  EXPECT_EQ(inv->gpus[1].pci_bus_id, "0000:0f:00.0");
  EXPECT_EQ(inv->gpus[2].info.numa_node, -1);  // no sysfs entry
  EXPECT_EQ(inv->gpus[2].cpus, "16-31,80-95");  // from nvmlDeviceGetCpuAffinity
  EXPECT_EQ(inv->gpus[0].info.health, core::GpuHealth::kHealthy);
  // Links: 4 direct NVLinks; 6 NVSwitch links each; PCIe ancestors for the rest.
  EXPECT_EQ(inv->links.at(0, 1), core::Link::NvLink(4));
  EXPECT_EQ(inv->links.at(2, 3), core::Link::NvLink(6));
  EXPECT_EQ(inv->links.at(0, 2), core::Link::Of(core::LinkKind::kSys));
  EXPECT_EQ(inv->links.at(1, 3), core::Link::Of(core::LinkKind::kSys));
  EXPECT_TRUE(inv->Validate().ok());
}

TEST_F(FakeNvmlTest, PcieLevels) {
  const std::string config = dir_.Write(
      "pcie.conf",
      "gpu GPU-a 15360 00000000:3B:00.0 0-23 Tesla T4\ngpu GPU-b 15360 00000000:5E:00.0 0-23 Tesla T4\n"
      "gpu GPU-c 15360 00000000:86:00.0 0-23 Tesla T4\ngpu GPU-d 15360 00000000:AF:00.0 0-23 Tesla T4\n"
      "ancestor 0 1 10\nancestor 0 2 20\nancestor 0 3 30\nancestor 1 2 40\nancestor 1 3 50\nancestor 2 3 0\n");
  setenv("TESSERA_FAKE_NVML_CONFIG", config.c_str(), 1);
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options_);
  ASSERT_TRUE(src.ok()) << src.status();
  absl::StatusOr<formats::GpuInventory> inv = (*src)->Read();
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->gpus[0].info.model, "T4");
  EXPECT_EQ(inv->links.ToRows()[0], (std::vector<std::string>{"X", "PIX", "PXB", "PHB"}));
  EXPECT_EQ(inv->links.at(1, 2), core::Link::Of(core::LinkKind::kNode));
  EXPECT_EQ(inv->links.at(1, 3), core::Link::Of(core::LinkKind::kSys));
  EXPECT_EQ(inv->links.at(2, 3), core::Link::Of(core::LinkKind::kPix));  // INTERNAL: one board
}

TEST_F(FakeNvmlTest, XidEventsAndChecks) {
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options_);
  ASSERT_TRUE(src.ok()) << src.status();
  absl::StatusOr<formats::GpuInventory> inv = (*src)->Read();
  ASSERT_TRUE(inv.ok()) << inv.status();
  Recorder recorder;
  HealthMonitor monitor(src->get(), *inv, [&](const HealthUpdate& u) { recorder(u); },
                        std::chrono::milliseconds(20));
  Append(xids_, "1 13");  // an application error: ignored
  Append(xids_, "1 79");  // GPU has fallen off the bus: critical
  std::vector<HealthUpdate> seen = recorder.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].uuid.value(), "GPU-22222222-0000-0000-0000-000000000000");
  EXPECT_EQ(seen[0].health, core::GpuHealth::kUnhealthy);
  EXPECT_EQ(seen[0].reason, "XID 79");

  // A periodic check that fails (GPU is lost), then recovers.
  Append(lost_, "3");
  seen = recorder.WaitFor(2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].uuid.value(), "GPU-44444444-0000-0000-0000-000000000000");
  EXPECT_EQ(seen[1].health, core::GpuHealth::kUnhealthy);
  EXPECT_THAT(seen[1].reason, HasSubstr("NVML_ERROR_GPU_IS_LOST"));
  dir_.Write("lost", "");
  seen = recorder.WaitFor(3);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2].uuid.value(), "GPU-44444444-0000-0000-0000-000000000000");
  EXPECT_EQ(seen[2].health, core::GpuHealth::kHealthy);

  // XIDs are sticky: a re-read still reports GPU 1 unhealthy.
  absl::StatusOr<formats::GpuInventory> again = (*src)->Read();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->gpus[1].info.health, core::GpuHealth::kUnhealthy);
  EXPECT_EQ(again->gpus[1].health_reason, "XID 79");
  EXPECT_EQ(again->gpus[0].info.health, core::GpuHealth::kHealthy);
}

TEST_F(FakeNvmlTest, EventNotAttributableMarksEveryGpu) {
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options_);
  ASSERT_TRUE(src.ok()) << src.status();
  absl::StatusOr<formats::GpuInventory> inv = (*src)->Read();
  ASSERT_TRUE(inv.ok());
  Recorder recorder;
  HealthMonitor monitor(src->get(), *inv, [&](const HealthUpdate& u) { recorder(u); },
                        std::chrono::milliseconds(20));
  Append(xids_, "all 48");
  std::vector<HealthUpdate> seen = recorder.WaitFor(4);
  ASSERT_EQ(seen.size(), 4u);
  for (const HealthUpdate& u : seen) {
    EXPECT_EQ(u.health, core::GpuHealth::kUnhealthy);
    EXPECT_THAT(u.reason, HasSubstr("XID 48"));
  }
}

TEST_F(FakeNvmlTest, InitFailureIsClear) {
  unsetenv("TESSERA_FAKE_NVML_CONFIG");  // the fake then answers DRIVER_NOT_LOADED
  absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(options_);
  ASSERT_FALSE(src.ok());
  EXPECT_THAT(Message(src.status()), HasSubstr("nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)"));
  EXPECT_THAT(Message(src.status()), HasSubstr("kernel driver"));
}

}  // namespace
}  // namespace tessera::gpu
