// hook_launch_bench: what libtessera-cuda.so adds to a kernel launch, against the fake driver. Runs itself
// twice per round (unhooked, then with LD_PRELOAD of the hook and a 90% compute limit, so the limiter's fast
// path is on), each child timing cuLaunchKernel (resolved through cuGetProcAddress, as the CUDA runtime does)
// on zero-length kernels, and prints the medians, the difference and the ratio, measured in the same run.
//
//   build/bench/hook_launch_bench [launches-per-child]      (run from anywhere; finds build/ by its own path)
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hook/cuda/cuda_api.h"

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// In the child: median ns per launch over batches of 1000.
int Child(long launches) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return 2;
  auto proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  auto get = [&](const char* name, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st;
    proc(name, &p, version, 0, &st);
    return p;
  };
  auto init = reinterpret_cast<PFN_cuInit_v2000>(get("cuInit", 2000));
  auto dev_get = reinterpret_cast<PFN_cuDeviceGet_v2000>(get("cuDeviceGet", 2000));
  auto retain = reinterpret_cast<PFN_cuDevicePrimaryCtxRetain_v7000>(get("cuDevicePrimaryCtxRetain", 7000));
  auto set = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(get("cuCtxSetCurrent", 4000));
  auto load = reinterpret_cast<PFN_cuModuleLoadData_v2000>(get("cuModuleLoadData", 2000));
  auto fn = reinterpret_cast<PFN_cuModuleGetFunction_v2000>(get("cuModuleGetFunction", 2000));
  auto launch = reinterpret_cast<PFN_cuLaunchKernel_v4000>(get("cuLaunchKernel", 12000));
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUmodule mod = nullptr;
  CUfunction f = nullptr;
  if (init(0) != CUDA_SUCCESS || dev_get(&dev, 0) != CUDA_SUCCESS || retain(&ctx, dev) != CUDA_SUCCESS ||
      set(ctx) != CUDA_SUCCESS || load(&mod, "fake") != CUDA_SUCCESS || fn(&f, mod, "spin") != CUDA_SUCCESS) {
    return 3;
  }
  uint64_t zero = 0;
  void* params[] = {&zero};
  for (int i = 0; i < 20000; ++i) launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);  // warm up
  usleep(20000);  // let the limiter measure the kind
  std::vector<double> batches;
  for (long done = 0; done < launches; done += 1000) {
    const uint64_t t0 = NowNs();
    for (int i = 0; i < 1000; ++i) launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
    batches.push_back(static_cast<double>(NowNs() - t0) / 1000.0);
  }
  std::sort(batches.begin(), batches.end());
  printf("%.2f\n", batches[batches.size() / 2]);
  return 0;
}

double RunChild(const std::string& self, const std::string& build, bool hooked, long launches) {
  int out[2];
  if (pipe(out) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    const std::string state = "/tmp/hook-bench-" + std::to_string(getppid()) + ".state";
    setenv("FAKECUDA_STATE", state.c_str(), 1);
    setenv("LD_LIBRARY_PATH", (build + "/fakecuda").c_str(), 1);
    setenv("TESSERA_BENCH_CHILD", "1", 1);
    if (hooked) {
      setenv("LD_PRELOAD", (build + "/lib/libtessera-cuda.so").c_str(), 1);
      setenv("TESSERA_GPU_CORES", "90", 1);
      setenv("TESSERA_GPU_MEMORY_LIMIT", "4GiB", 1);
      const std::string region = "/tmp/hook-bench-" + std::to_string(getppid()) + ".region";
      setenv("TESSERA_REGION", region.c_str(), 1);
    }
    execl(self.c_str(), self.c_str(), std::to_string(launches).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  char buf[64] = {0};
  const ssize_t n = read(out[0], buf, sizeof(buf) - 1);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return n > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? atof(buf) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const long launches = argc > 1 ? atol(argv[1]) : 200000;
  if (getenv("TESSERA_BENCH_CHILD") != nullptr) return Child(launches);
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 2;
  std::string build = self;
  build = build.substr(0, build.rfind('/'));  // build/bench
  build = build.substr(0, build.rfind('/'));  // build
  std::vector<double> plain;
  std::vector<double> hooked;
  for (int round = 0; round < 5; ++round) {
    plain.push_back(RunChild(self, build, false, launches));
    hooked.push_back(RunChild(self, build, true, launches));
  }
  std::sort(plain.begin(), plain.end());
  std::sort(hooked.begin(), hooked.end());
  const double p = plain[plain.size() / 2];
  const double h = hooked[hooked.size() / 2];
  if (p <= 0 || h <= 0) {
    fprintf(stderr, "hook_launch_bench: a child failed (is build/fakecuda built?)\n");
    return 1;
  }
  printf("cuLaunchKernel on the fake driver, median of 5 runs of the per-1000-launch medians:\n");
  printf("  unhooked        %8.1f ns/launch\n", p);
  printf("  hooked (90%%)    %8.1f ns/launch\n", h);
  printf("  added           %8.1f ns/launch (target < 50)\n", h - p);
  printf("  ratio           %8.2f\n", h / p);
  return 0;
}
