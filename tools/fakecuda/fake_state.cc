#include "fake_state.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hook/common/base.h"

namespace fakecuda {

namespace {
State* g_state = nullptr;
pthread_mutex_t g_map_mutex = PTHREAD_MUTEX_INITIALIZER;

uint64_t EnvSize(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  uint64_t out = 0;
  if (v == nullptr || !tessera::hook::ParseByteSize(v, &out)) return fallback;
  return out;
}

void Initialize(State* s) {
  const char* gpus = getenv("FAKECUDA_GPUS");
  int n = gpus != nullptr ? atoi(gpus) : 1;
  if (n < 1) n = 1;
  if (n > kMaxGpus) n = kMaxGpus;
  s->gpu_count = static_cast<uint32_t>(n);
  s->context_bytes = EnvSize("FAKECUDA_CONTEXT_BYTES", 64ull << 20);
  const uint64_t memory = EnvSize("FAKECUDA_MEMORY", 16ull << 30);
  for (int i = 0; i < n; ++i) {
    Gpu& g = s->gpus[i];
    snprintf(g.uuid, sizeof(g.uuid), "GPU-fa4e%04x-0000-4000-8000-%012x", i, 0x5e55e7a0 + i);
    snprintf(g.name, sizeof(g.name), "Tessera Fake GPU %d", i);
    g.total_bytes = memory;
  }
  // FAKECUDA_UUIDS=GPU-a,GPU-b: these GPUs, in this order (what a container sees of a node's GPUs: the ones
  // NVIDIA_VISIBLE_DEVICES names, with their own UUIDs). Overrides FAKECUDA_GPUS.
  if (const char* list = getenv("FAKECUDA_UUIDS"); list != nullptr && list[0] != 0) {
    int count = 0;
    for (const char* p = list; *p != 0 && count < kMaxGpus;) {
      const char* end = strchr(p, ',');
      const size_t len = end != nullptr ? static_cast<size_t>(end - p) : strlen(p);
      if (len > 0 && len < sizeof(s->gpus[count].uuid)) {
        Gpu& g = s->gpus[count];
        memset(g.uuid, 0, sizeof(g.uuid));
        memcpy(g.uuid, p, len);
        snprintf(g.name, sizeof(g.name), "Tessera Fake GPU %d", count);
        g.total_bytes = memory;
        ++count;
      }
      if (end == nullptr) break;
      p = end + 1;
    }
    if (count > 0) s->gpu_count = static_cast<uint32_t>(count);
  }
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&s->lock, &attr);
  pthread_mutexattr_destroy(&attr);
}
}  // namespace

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void SleepAsConfigured(const char* name) {
  const char* v = getenv(name);
  const long ms = v != nullptr ? atol(v) : 0;
  if (ms > 0) usleep(static_cast<useconds_t>(ms) * 1000);
}

State* Shared() {
  State* s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
  if (s != nullptr) return s;
  pthread_mutex_lock(&g_map_mutex);
  if (g_state == nullptr) {
    char path[512];
    const char* env = getenv("FAKECUDA_STATE");
    if (env != nullptr && env[0] != 0) snprintf(path, sizeof(path), "%s", env);
    else snprintf(path, sizeof(path), "/tmp/fakecuda-%u.state", static_cast<unsigned>(getuid()));
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      // Create fully initialized under a temporary name, then publish with link(2).
      char tmp[600];
      snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, static_cast<int>(getpid()));
      const int t = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (t < 0 || ftruncate(t, sizeof(State)) != 0) {
        fprintf(stderr, "fakecuda: cannot create %s: %s\n", tmp, strerror(errno));
        abort();
      }
      void* p = mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, t, 0);
      auto* init = static_cast<State*>(p);
      Initialize(init);
      init->magic = kStateMagic;
      munmap(p, sizeof(State));
      close(t);
      if (link(tmp, path) != 0 && errno != EEXIST) {
        fprintf(stderr, "fakecuda: cannot publish %s: %s\n", path, strerror(errno));
        abort();
      }
      unlink(tmp);
      fd = open(path, O_RDWR | O_CLOEXEC);
    }
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(State)) {
      fprintf(stderr, "fakecuda: %s is not a fake GPU state of this build; remove it\n", path);
      abort();
    }
    void* p = mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED || static_cast<State*>(p)->magic != kStateMagic) {
      fprintf(stderr, "fakecuda: cannot map %s\n", path);
      abort();
    }
    __atomic_store_n(&g_state, static_cast<State*>(p), __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_map_mutex);
  return g_state;
}

void Lock(State* s) {
  if (pthread_mutex_lock(&s->lock) == EOWNERDEAD) pthread_mutex_consistent(&s->lock);
}

void Unlock(State* s) {
  pthread_mutex_unlock(&s->lock);
}

void ReapDeadLocked(State* s) {
  for (Proc& p : s->procs) {
    if (p.pid == 0) continue;
    if (kill(static_cast<pid_t>(p.pid), 0) == 0 || errno != ESRCH) continue;
    for (uint32_t g = 0; g < s->gpu_count; ++g) {
      s->gpus[g].used_bytes -= p.used_bytes[g] <= s->gpus[g].used_bytes ? p.used_bytes[g] : s->gpus[g].used_bytes;
      p.used_bytes[g] = 0;
    }
    p.pid = 0;
  }
}

bool ChargeLocked(State* s, int gpu, int64_t bytes) {
  const uint32_t me = static_cast<uint32_t>(getpid());
  Proc* mine = nullptr;
  Proc* free_slot = nullptr;
  for (Proc& p : s->procs) {
    if (p.pid == me) {
      mine = &p;
      break;
    }
    if (p.pid == 0 && free_slot == nullptr) free_slot = &p;
  }
  if (mine == nullptr) {
    ReapDeadLocked(s);
    if (free_slot == nullptr || free_slot->pid != 0) {
      for (Proc& p : s->procs) {
        if (p.pid == 0) {
          free_slot = &p;
          break;
        }
      }
    }
    if (free_slot == nullptr) return false;
    mine = free_slot;
    memset(mine, 0, sizeof(*mine));
    mine->pid = me;
  }
  Gpu& g = s->gpus[gpu];
  if (bytes > 0) {
    if (g.used_bytes + static_cast<uint64_t>(bytes) > g.total_bytes) {
      ReapDeadLocked(s);
      if (g.used_bytes + static_cast<uint64_t>(bytes) > g.total_bytes) return false;
    }
    g.used_bytes += static_cast<uint64_t>(bytes);
    mine->used_bytes[gpu] += static_cast<uint64_t>(bytes);
    if (g.used_bytes > g.peak_bytes) g.peak_bytes = g.used_bytes;
  } else {
    const uint64_t b = static_cast<uint64_t>(-bytes);
    g.used_bytes -= b <= g.used_bytes ? b : g.used_bytes;
    mine->used_bytes[gpu] -= b <= mine->used_bytes[gpu] ? b : mine->used_bytes[gpu];
  }
  return true;
}

uint64_t BusyNsLocked(const Gpu& g, uint32_t pid, uint64_t from, uint64_t to) {
  uint64_t busy = 0;
  for (uint32_t i = 0; i < g.ring_count; ++i) {
    const Kernel& k = g.ring[(g.ring_head + kRing - 1 - i) % kRing];
    if (pid != 0 && k.pid != pid) continue;
    const uint64_t s = k.start_ns > from ? k.start_ns : from;
    const uint64_t e = k.end_ns < to ? k.end_ns : to;
    if (e > s) busy += e - s;
  }
  return busy;
}

}  // namespace fakecuda
