#include "foreign_cpu.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace tessera::cltest {

namespace {

constexpr auto kPeriod = std::chrono::milliseconds(20);

// Ticks `cpu` was busy since boot: the line "cpuN user nice system idle iowait irq softirq steal ...".
bool CpuBusyTicks(int cpu, uint64_t* busy) {
  std::ifstream f("/proc/stat");
  const std::string want = "cpu" + std::to_string(cpu);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string name;
    uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (!(in >> name) || name != want) continue;
    if (!(in >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal)) return false;
    *busy = user + nice + system + irq + softirq + steal;
    return true;
  }
  return false;
}

// utime + stime of every thread of `pid` (fields 14 and 15 of /proc/<pid>/stat); false once it is gone.
bool ProcessTicks(pid_t pid, uint64_t* ticks) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  // The command name (field 2) is in parentheses and may hold spaces: count fields after its last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream in(line.substr(close + 1));
  std::string field;
  uint64_t utime = 0;
  uint64_t stime = 0;
  for (int i = 3; i <= 13; ++i) {
    if (!(in >> field)) return false;
  }
  if (!(in >> utime >> stime)) return false;
  *ticks = utime + stime;
  return true;
}

}  // namespace

double MonotonicMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

ForeignCpu::ForeignCpu(int cpu) : cpu_(cpu) {
  thread_ = std::thread([this] { Run(); });
}

ForeignCpu::~ForeignCpu() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ForeignCpu::AddTenant(pid_t pid) {
  uint64_t ticks = 0;
  // What it ran before it was added counts as the tenants' too (it just started). A tenant that cannot be
  // read would make all its time foreign, and every lower bound nothing: the figure is then 0 throughout.
  const bool readable = ProcessTicks(pid, &ticks);
  std::lock_guard<std::mutex> lock(mu_);
  if (!readable) unreadable_ = true;
  tenants_.push_back({pid, ticks, false});
}

bool ForeignCpu::TakeSample(Sample* s) {
  const double before = MonotonicMs();
  if (!CpuBusyTicks(cpu_, &s->cpu_busy)) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (TenantTicks& t : tenants_) {
      uint64_t ticks = 0;
      // Once gone (reaped), never read again: its pid may name another process by then.
      if (!t.gone && ProcessTicks(t.pid, &ticks)) {
        t.last = std::max(t.last, ticks);
      } else {
        t.gone = true;
      }
      s->tenants_busy += t.last;
    }
  }
  // Dated in the middle of its reads: a sampler held up between the clock and the counters would otherwise
  // date them early.
  s->ms = (before + MonotonicMs()) / 2;
  return true;
}

void ForeignCpu::Run() {
  // Off the measured CPU where another is allowed, so that its own reads are not counted as foreign.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && cpu_ >= 0 && cpu_ < CPU_SETSIZE &&
      CPU_COUNT(&set) > 1) {
    CPU_CLR(cpu_, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    Sample s;
    const bool ok = TakeSample(&s);
    lock.lock();
    if (ok) samples_.push_back(s);
    wake_.wait_for(lock, kPeriod, [this] { return stop_; });
  }
}

double ForeignCpu::Fraction(double from_ms, double to_ms) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (unreadable_ || samples_.empty() || !(to_ms > from_ms)) return 0;
  // The last sample at or before the span's start and the first at or after its end (or the nearest ones).
  const Sample* a = &samples_.front();
  for (const Sample& s : samples_) {
    if (s.ms <= from_ms) a = &s;
  }
  const Sample* b = &samples_.back();
  for (auto it = samples_.rbegin(); it != samples_.rend(); ++it) {
    if (it->ms >= to_ms) b = &*it;
  }
  if (b->ms <= a->ms) return 0;
  const double cpu = static_cast<double>(b->cpu_busy) - static_cast<double>(a->cpu_busy);
  const double tenants = static_cast<double>(b->tenants_busy) - static_cast<double>(a->tenants_busy);
  const double elapsed_ticks = (b->ms - a->ms) / 1e3 * static_cast<double>(sysconf(_SC_CLK_TCK));
  return std::clamp((cpu - tenants) / elapsed_ticks, 0.0, 1.0);
}

}  // namespace tessera::cltest
