// Fake GPUs from a file: for tests, demos and clusters without GPUs (tessera-node --fake-gpus FILE).
//
// The file (YAML, or JSON) lists GPUs and their topology; docs/node-agent.md has the full format and
// examples/fake-gpus/ has a 4-GPU PCIe box, an 8-GPU NVLink box and a two-socket box:
//
//   gpus:
//     - {uuid: GPU-a0, model: T4, memoryMiB: 15360, numa: 0, pciBusId: "0000:3b:00.0", healthy: true}
//     - {uuid: GPU-a1, model: T4, memoryMiB: 15360, numa: 0, healthy: false, healthReason: "XID 79"}
//   links: [[X, PIX], [PIX, X]]            # or topology: | <what `nvidia-smi topo -m` prints>
//
// FakeGpuSource re-reads the file when it changes (watched with inotify on its directory, which also sees
// editors' rename-over and Kubernetes ConfigMap updates, plus a content check at every wait), so a test or a
// demo flips a GPU unhealthy by rewriting the file. A malformed rewrite is reported once and the last good
// state stays.
//
// Thread-safety: see GpuSource.
#ifndef TESSERA_GPU_FAKE_GPU_FILE_H_
#define TESSERA_GPU_FAKE_GPU_FILE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "gpu/gpu_source.h"

namespace tessera::gpu {

// Parses a fake-GPU file's text. `source` names it in errors ("fake.yaml line 3: ..."); GPUs without a UUID
// become GPU-<node_name>-<index> (GPU-fake-<index> when node_name is empty).
// A fake-GPU file lists at most 64 GPUs and their topology: a few KB. Larger is the wrong file.
inline constexpr size_t kMaxFakeGpuFileBytes = size_t{1} << 20;

absl::StatusOr<formats::GpuInventory> ParseFakeGpuFile(std::string_view text, std::string_view source,
                                                       std::string_view node_name = "");

class FakeGpuSource : public GpuSource {
 public:
  // Reads and checks the file once (errors name the file and line) and starts watching it.
  static absl::StatusOr<std::unique_ptr<FakeGpuSource>> Open(const std::string& path,
                                                             const std::string& node_name = "");
  ~FakeGpuSource() override;

  std::string Name() const override { return "fake:" + path_; }
  absl::StatusOr<formats::GpuInventory> Read() override;
  absl::StatusOr<std::vector<HealthUpdate>> WaitForHealthEvents(std::chrono::milliseconds timeout) override;

 private:
  FakeGpuSource(std::string path, std::string node_name) : path_(std::move(path)), node_(std::move(node_name)) {}
  absl::StatusOr<formats::GpuInventory> ReadFile(std::string* content) const;

  const std::string path_;
  const std::string node_;
  int inotify_fd_ = -1;
  std::string last_content_;  // the content WaitForHealthEvents last looked at (good or not)
};

}  // namespace tessera::gpu

#endif  // TESSERA_GPU_FAKE_GPU_FILE_H_
