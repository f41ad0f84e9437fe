// Runs tests/hook/cuda_probe in real child processes under LD_PRELOAD=build/lib/libtessera-cuda.so against
// the fake driver (build/fakecuda), each test in its own temporary directory (fake GPU state, region, limits
// file).
//
//   HookSandbox box;                                   // a fresh fake GPU (16 GiB) and paths
//   box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
//   ProbeResult r = box.Run({"dlsym", "init", "ctx", "alloc", "1048576"});
//   EXPECT_EQ(r.Field("alloc", 1), "0");
//
// Thread-safety: one sandbox per test thread.
#ifndef TESSERA_TESTS_HOOK_HOOK_PROCESS_H_
#define TESSERA_TESTS_HOOK_HOOK_PROCESS_H_

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessera::testing {

// The output of one probe run: its lines, split into fields.
struct ProbeResult {
  int status = -1;  // waitpid status
  std::string out;
  std::string err;
  std::vector<std::vector<std::string>> lines;

  bool Exited0() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // Field `i` (0 = the operation's name) of the n-th line (0-based) that starts with `op`; "" when absent.
  std::string Field(const std::string& op, size_t i, int nth = 0) const {
    for (const auto& l : lines) {
      if (!l.empty() && l[0] == op && nth-- == 0) return i < l.size() ? l[i] : "";
    }
    return "";
  }
  uint64_t Num(const std::string& op, size_t i, int nth = 0) const {
    const std::string f = Field(op, i, nth);
    return f.empty() ? UINT64_MAX : std::stoull(f);
  }
};

// A child probe running in the background.
struct Probe {
  pid_t pid = -1;
  int in = -1;   // its stdin (write a line to go on after "ready")
  int out = -1;  // its stdout
  std::string buffer;
  size_t seen = 0;  // WaitFor has looked at buffer up to here

  // Reads until a line equal to `line` arrived (after what earlier calls found) or the child ended. False
  // when it ended first.
  bool WaitFor(const std::string& line) {
    for (;;) {
      const size_t at = buffer.find(line + "\n", seen);
      if (at != std::string::npos && (at == 0 || buffer[at - 1] == '\n')) {
        seen = at + line.size() + 1;
        return true;
      }
      char chunk[4096];
      const ssize_t n = read(out, chunk, sizeof(chunk));
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
    }
  }
  // Reads until a line containing `text` arrived (after what earlier calls found) or the child ended. False
  // when it ended first. With HookSandbox::merge_stderr, the hook's own lines are there too.
  bool WaitForText(const std::string& text) {
    for (;;) {
      const size_t at = buffer.find(text, seen);
      const size_t eol = at == std::string::npos ? at : buffer.find('\n', at);
      if (eol != std::string::npos) {
        seen = eol + 1;
        return true;
      }
      char chunk[4096];
      const ssize_t n = read(out, chunk, sizeof(chunk));
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
    }
  }
  void Continue() {
    if (write(in, "\n", 1) != 1) {
      // the child is gone; Finish() reports it
    }
  }
  ProbeResult Finish() {
    ProbeResult r;
    char chunk[4096];
    ssize_t n;
    while ((n = read(out, chunk, sizeof(chunk))) > 0) buffer.append(chunk, static_cast<size_t>(n));
    close(out);
    close(in);
    waitpid(pid, &r.status, 0);
    r.out = buffer;
    std::istringstream lines(buffer);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::vector<std::string> f;
      std::string w;
      while (fields >> w) f.push_back(w);
      r.lines.push_back(f);
    }
    return r;
  }
};

class HookSandbox {
 public:
  HookSandbox() {
    char tmpl[] = "/tmp/tessera-hook-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    env["PATH"] = "/usr/bin:/bin";
    env["LD_PRELOAD"] = HookLibrary();
    env["LD_LIBRARY_PATH"] = std::string(TESSERA_BINARY_DIR) + "/fakecuda";
    env["FAKECUDA_STATE"] = dir_ + "/fakegpu.state";
    env["FAKECUDA_CONTEXT_BYTES"] = "16MiB";
    env["TESSERA_REGION"] = dir_ + "/region";
  }
  ~HookSandbox() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  HookSandbox(const HookSandbox&) = delete;
  HookSandbox& operator=(const HookSandbox&) = delete;

  // Started probes write their stderr (the hook's lines) into their stdout, for Probe::WaitForText.
  bool merge_stderr = false;

  static std::string HookLibrary() { return std::string(TESSERA_BINARY_DIR) + "/lib/libtessera-cuda.so"; }
  static std::string ProbePath() { return std::string(TESSERA_BINARY_DIR) + "/tests/cuda_probe"; }
  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  Probe Start(const std::vector<std::string>& args,
              const std::map<std::string, std::string>& extra = {}) const {
    std::map<std::string, std::string> e = env;
    for (const auto& [k, v] : extra) e[k] = v;
    std::vector<std::string> envs;
    for (const auto& [k, v] : e) envs.push_back(k + "=" + v);
    int in[2];
    int out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) abort();
    const std::string probe = ProbePath();
    std::vector<char*> argv{const_cast<char*>(probe.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& s : envs) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      if (merge_stderr) dup2(out[1], 2);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    Probe p;
    p.pid = pid;
    p.in = in[1];
    p.out = out[0];
    return p;
  }

  ProbeResult Run(const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& extra = {}) const {
    Probe p = Start(args, extra);
    return p.Finish();
  }

  std::map<std::string, std::string> env;

 private:
  std::string dir_;
};

// The fake GPU's own view (build/fakecuda/libnvidia-ml.so.1 exports these for tests): device memory in use
// and its peak, and the GPU time kernels of one process (pid 0: all) occupied in [from, to).
class FakeGpuView {
 public:
  // The fake maps its state once per loaded copy: each view loads its own copy of the library from `dir`.
  FakeGpuView(const std::string& state_path, const std::string& dir) {
    setenv("FAKECUDA_STATE", state_path.c_str(), 1);
    const std::string copy = dir + "/fake-nvml-view.so";
    std::filesystem::copy_file(std::string(TESSERA_BINARY_DIR) + "/fakecuda/libnvidia-ml.so.1", copy,
                               std::filesystem::copy_options::overwrite_existing);
    lib_ = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) abort();
    busy_ = reinterpret_cast<BusyFn>(dlsym(lib_, "fakecudaBusyNs"));
    used_ = reinterpret_cast<BytesFn>(dlsym(lib_, "fakecudaUsedBytes"));
    peak_ = reinterpret_cast<BytesFn>(dlsym(lib_, "fakecudaPeakBytes"));
  }
  uint64_t BusyNs(unsigned pid, uint64_t from, uint64_t to) const { return busy_(0, pid, from, to); }
  uint64_t UsedBytes() const { return used_(0); }
  uint64_t PeakBytes() const { return peak_(0); }

 private:
  using BusyFn = unsigned long long (*)(unsigned, unsigned, unsigned long long,
                                        unsigned long long);  // NOLINT
  using BytesFn = unsigned long long (*)(unsigned);           // NOLINT
  void* lib_ = nullptr;
  BusyFn busy_ = nullptr;
  BytesFn used_ = nullptr;
  BytesFn peak_ = nullptr;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_HOOK_HOOK_PROCESS_H_
