// How long a process waited for a CPU: what a share test on the fake driver's simulated GPU takes off the
// share it expects, so that a busy machine makes it lenient instead of failing it. A tenant that the
// scheduler did not run for a tenth of a window could not use that tenth of the GPU, whatever the hook did;
// a tenant that is over its share is over it however busy the machine is, so upper bounds never take this
// off. (PoCL's tenants share their device, one CPU, and wait for each other there: the OpenCL tests read
// what other processes took of that CPU instead, tests/opencl/foreign_cpu.h.)
#ifndef TESSERA_TESTS_RUN_DELAY_H_
#define TESSERA_TESTS_RUN_DELAY_H_

#include <dirent.h>
#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace tessera::testing {

// Nanoseconds the threads of `pid` (0: this process) have spent runnable but not running, summed over its
// threads: the second field of /proc/<pid>/task/<tid>/schedstat (the kernel's run_delay, kept whenever the
// kernel has CONFIG_SCHED_INFO). A thread named `except` (its comm) is left out. 0 when it cannot be read.
inline uint64_t RunDelayNs(pid_t pid = 0, const std::string& except = "") {
  const std::string tasks = pid == 0 ? "/proc/self/task" : "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return 0;
  uint64_t total = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    if (!except.empty()) {
      std::ifstream comm(tasks + "/" + e->d_name + "/comm");
      std::string name;
      if (std::getline(comm, name) && name == except) continue;
    }
    std::ifstream f(tasks + "/" + e->d_name + "/schedstat");
    uint64_t on_cpu = 0;
    uint64_t waiting = 0;
    if (f >> on_cpu >> waiting) total += waiting;
  }
  closedir(dir);
  return total;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_RUN_DELAY_H_
