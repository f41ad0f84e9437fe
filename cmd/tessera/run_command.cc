// `tessera run`: runs a command under libtessera-cuda.so with a memory limit and a compute share on this
// machine, no Kubernetes needed (docs/isolation.md, "tessera run"). It writes a limits file and keeps the
// shared region in a temporary directory, preloads the hook next to this binary (../lib/libtessera-cuda.so),
// runs the command, forwards SIGINT/SIGTERM/SIGHUP to it, and exits with its status.
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "hook/common/base.h"
#include "hook/common/limits.h"
#include "hook_preload.h"

namespace tessera::cli {

namespace {

volatile sig_atomic_t g_child = 0;

void Forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

// The directory holding the hook libraries: ../lib next to this binary (build/lib, or an install's lib/).
std::string LibDir() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (const char* rel : {"../lib", "../lib/tessera"}) {
    const std::filesystem::path p = self.parent_path() / rel;
    if (std::filesystem::exists(p / "libtessera-cuda.so", ec) ||
        std::filesystem::exists(p / "libtessera-opencl.so", ec))
      return std::filesystem::canonical(p, ec).string();
  }
  return (self.parent_path() / "../lib").lexically_normal().string();
}

// LD_PRELOAD for the command: --hook-library or TESSERA_HOOK_LIBRARY when given, else the libraries --api
// names (auto: every one built, so CUDA and OpenCL programs run under the same flags).
PreloadChoice Preload(const RunOptions& options) {
  const char* existing = getenv("LD_PRELOAD");
  std::string library = options.hook_library;
  if (library.empty()) {
    if (const char* env = getenv("TESSERA_HOOK_LIBRARY"); env != nullptr && env[0] != 0) library = env;
  }
  if (!library.empty()) {
    PreloadChoice c;
    if (access(library.c_str(), R_OK) != 0) {
      c.error =
          library + " cannot be read: name the hook library with --hook-library or TESSERA_HOOK_LIBRARY";
      return c;
    }
    c.ld_preload = library;
    if (existing != nullptr && existing[0] != 0) c.ld_preload += std::string(":") + existing;
    return c;
  }
  return ChooseHookPreload(options.api, LibDir(), existing);
}

}  // namespace

int RunRun(const RunOptions& options) {
  if (options.command.empty()) {
    std::cerr << "tessera run: no command; write it after --, as in: tessera run --gpu-memory 4GiB -- python "
                 "x.py\n";
    return 2;
  }
  hook::Limits limits;
  limits.generation = 1;
  limits.device_count = 1;
  hook::DeviceLimits& d = limits.devices[0];
  d.index = hook::kAnyDevice;
  if (!options.gpu_memory.empty() && !hook::ParseByteSize(options.gpu_memory.c_str(), &d.memory_bytes)) {
    std::cerr << "tessera run: --gpu-memory '" << options.gpu_memory
              << "' is not a size: write bytes or a unit, as in 512MiB or 4GiB\n";
    return 2;
  }
  if (!options.gpu_memory.empty() && d.memory_bytes == 0) {
    std::cerr << "tessera run: --gpu-memory '" << options.gpu_memory
              << "' is zero bytes, which would mean no limit at all: give a size, or leave --gpu-memory out for "
                 "no memory limit\n";
    return 2;
  }
  if (options.gpu_cores < 1 || options.gpu_cores > 100) {
    std::cerr << "tessera run: --gpu-cores " << options.gpu_cores
              << " is outside 1..100 (percent of one GPU)\n";
    return 2;
  }
  d.cores_percent = static_cast<uint32_t>(options.gpu_cores);
  if (options.policy == "elastic") {
    d.policy = hook::ComputePolicy::kElastic;
  } else if (options.policy != "hard") {
    std::cerr << "tessera run: --policy '" << options.policy << "' is neither hard nor elastic\n";
    return 2;
  }
  if (options.ceiling != 0) {
    if (options.ceiling < options.gpu_cores || options.ceiling > 100) {
      std::cerr << "tessera run: --ceiling " << options.ceiling << " must be between --gpu-cores and 100\n";
      return 2;
    }
    d.ceiling_percent = static_cast<uint32_t>(options.ceiling);
  } else if (d.ceiling_percent < d.cores_percent) {
    d.ceiling_percent = d.cores_percent;
  }
  if (options.priority == "high") {
    d.priority = hook::Priority::kHigh;
  } else if (options.priority != "low") {
    std::cerr << "tessera run: --priority '" << options.priority << "' is neither high nor low\n";
    return 2;
  }
  const PreloadChoice preload = Preload(options);
  if (!preload.error.empty()) {
    std::cerr << "tessera run: " << preload.error << "\n";
    return 2;
  }
  char tmpl[] = "/tmp/tessera-run-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::cerr << "tessera run: cannot create a directory in /tmp: " << strerror(errno) << "\n";
    return 1;
  }
  const std::string dir = tmpl;
  const std::string region = options.region.empty() ? dir + "/region" : options.region;
  hook::CopyString(limits.region_path, sizeof(limits.region_path), region.c_str());
  const std::string limits_path = dir + "/limits";
  hook::Error error;
  if (!hook::WriteLimitsFile(limits_path.c_str(), limits, &error)) {
    std::cerr << "tessera run: " << error.text << "\n";
    std::filesystem::remove_all(dir);
    return 2;
  }

  struct sigaction sa {};
  sa.sa_handler = &Forward;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &sa, nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::cerr << "tessera run: fork: " << strerror(errno) << "\n";
    std::filesystem::remove_all(dir);
    return 1;
  }
  if (pid == 0) {
    setenv("TESSERA_LIMITS_FILE", limits_path.c_str(), 1);
    setenv("LD_PRELOAD", preload.ld_preload.c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::cerr << "tessera run: cannot run " << argv[0] << ": " << strerror(errno) << "\n";
    _exit(127);
  }
  g_child = pid;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace tessera::cli
