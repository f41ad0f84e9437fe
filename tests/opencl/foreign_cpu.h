// How much of one CPU went to processes other than the tenants of a test: the part of PoCL's device that
// the machine took. PoCL's device is the CPU every share test pins its tenants to, so a busy machine (a
// build, other tests, the stress script's hogs) takes device time that no tenant could use, whatever the
// hook did; a share test takes that part off the share a tenant must reach.
//
//   ForeignCpu foreign(cpu);          // samples /proc every 20 ms until destroyed
//   foreign.AddTenant(tenant.pid());
//   ...
//   double lost = foreign.Fraction(from_ms, to_ms);   // 0..1 of that span, CLOCK_MONOTONIC ms
//
// What it reads: the CPU's busy time in /proc/stat (user, nice, system, irq, softirq, steal) less the
// tenants' own CPU time (utime + stime in /proc/<pid>/stat, every thread of each), both in clock ticks. A
// quiet machine reads a few hundredths, three busy loops beside the tests on 2 cores 0.5-0.7. Where /proc
// cannot be read (the CPU's line, or a tenant when it is added) it reads 0, so a test is as strict as on a
// quiet machine. The sampler runs off the measured CPU when another one is allowed.
//
// It replaces the time the tenants' threads waited for a CPU (tests/run_delay.h), which cannot tell the
// machine from the device's own sharing: tenants on one CPU wait for each other, so two 50% tenants read
// 0.75 on a quiet machine and their lower bound tested nothing.
//
// Thread-safety: AddTenant and Fraction may be called from any thread while it samples.
#ifndef TESSERA_TESTS_OPENCL_FOREIGN_CPU_H_
#define TESSERA_TESTS_OPENCL_FOREIGN_CPU_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::cltest {

// CLOCK_MONOTONIC in milliseconds: the clock of the spans below and of cl_tenant's windows and begin_ms.
double MonotonicMs();

class ForeignCpu {
 public:
  explicit ForeignCpu(int cpu);
  ForeignCpu(const ForeignCpu&) = delete;
  ForeignCpu& operator=(const ForeignCpu&) = delete;
  ~ForeignCpu();

  // Counts `pid`'s CPU time as the tenants' from now on.
  void AddTenant(pid_t pid);
  // The fraction of [from_ms, to_ms) in which the CPU ran something other than the tenants, over the samples
  // that enclose that span; 0 when there are none or /proc could not be read.
  double Fraction(double from_ms, double to_ms) const;

 private:
  struct Sample {
    double ms = 0;              // CLOCK_MONOTONIC
    uint64_t cpu_busy = 0;      // ticks the CPU was busy, since boot
    uint64_t tenants_busy = 0;  // ticks the tenants ran, summed over tenants
  };
  struct TenantTicks {
    pid_t pid;
    uint64_t last;  // the last reading: kept once the process is gone
    bool gone;      // could not be read once: not read again
  };

  void Run();
  bool TakeSample(Sample* s);

  const int cpu_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;                 // guarded by mu_
  bool unreadable_ = false;           // guarded by mu_: a tenant could not be read when added
  std::vector<TenantTicks> tenants_;  // guarded by mu_
  std::vector<Sample> samples_;       // guarded by mu_
  std::thread thread_;
};

}  // namespace tessera::cltest

#endif  // TESSERA_TESTS_OPENCL_FOREIGN_CPU_H_
