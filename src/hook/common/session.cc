#include "hook/common/session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hook/common/limiter.h"

namespace tessera::hook {

namespace {

// The session the fork handlers and the limiter thread serve: one per library per process (each library
// compiles its own copy of this file).
Session* g_forking = nullptr;
Session* g_limiting = nullptr;
// Set while this thread runs the initialization: the runtime's calls back into the hook pass through.
__thread int t_in_init __attribute__((tls_model("initial-exec"))) = 0;

const char* Getenv(const char* name) {
  return getenv(name);
}

bool CheckPrivateDirectory(const char* dir, Error* error) {
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (errno != ENOENT) {
      error->Set("cannot inspect %s: %s", dir, strerror(errno));
      return false;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
      error->Set("cannot create %s for the shared region: %s; set TESSERA_REGION to a file in a directory of "
                 "yours",
                 dir, strerror(errno));
      return false;
    }
    if (lstat(dir, &st) != 0) {
      error->Set("cannot inspect %s: %s", dir, strerror(errno));
      return false;
    }
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 022) != 0) {
    error->Set("%s is not a private directory of this user (uid %u): it is %s, owned by uid %u, mode %03o; "
               "someone else may have made it to plant a region: remove it, or set TESSERA_REGION to a file in "
               "a directory of yours",
               dir, static_cast<unsigned>(getuid()),
               S_ISLNK(st.st_mode) ? "a symbolic link" : (S_ISDIR(st.st_mode) ? "a directory" : "not a directory"),
               static_cast<unsigned>(st.st_uid), static_cast<unsigned>(st.st_mode & 0777));
    return false;
  }
  return true;
}

}  // namespace

bool DefaultRegionPath(EnvLookup lookup, char* out, size_t cap, Error* error) {
  char dir[kPathSize];
  const char* runtime = lookup("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') {
    snprintf(dir, sizeof(dir), "%s/tessera", runtime);
  } else {
    snprintf(dir, sizeof(dir), "/tmp/tessera-%u", static_cast<unsigned>(getuid()));
  }
  if (!CheckPrivateDirectory(dir, error)) return false;
  const int n = snprintf(out, cap, "%s/region", dir);
  if (n < 0 || static_cast<size_t>(n) >= cap) {
    error->Set("the default region path under %s is too long; set TESSERA_REGION", dir);
    return false;
  }
  return true;
}

void FormatGpuUuid(const unsigned char* b, char* out, size_t cap) {
  snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

Mode Session::InitOnce() {
  if (t_in_init != 0) return Mode::kPassThrough;  // a call made by the initialization itself
  pthread_mutex_lock(&init_mutex_);
  Mode result = mode();
  if (result == Mode::kUninitialized) {
    t_in_init = 1;
    SetLogLevelFromEnvironment();
    library_->load_runtime();
    Error error;
    result = Start(&error);
    if (result == Mode::kFailClosed) {
      WriteStderrLine("%s: %s", library_->refused, error.text);
    } else if (result == Mode::kPassThrough) {
      LogLine(LogLevel::kDebug, "no limits configured; passing through");
    } else if (library_->start_limited != nullptr) {
      library_->start_limited();
    }
    t_in_init = 0;
    mode_.store(static_cast<int>(result), std::memory_order_release);
  }
  pthread_mutex_unlock(&init_mutex_);
  return result;
}

Mode Session::Start(Error* error) {
  const char* file = Getenv("TESSERA_LIMITS_FILE");
  struct stat st;
  bool from_file = false;
  if (file != nullptr && file[0] != 0) {
    from_file = true;
  } else if (stat(kDefaultLimitsFile, &st) == 0) {
    file = kDefaultLimitsFile;
    from_file = true;
  }
  if (from_file) {
    CopyString(limits_path, sizeof(limits_path), file);
    if (stat(file, &st) == 0) Remember(st);
    if (!ReadLimitsFile(file, &limits, error)) return Mode::kFailClosed;
    limits_from_file = true;
  } else {
    bool configured = false;
    if (!LimitsFromEnvironment(&Getenv, &limits, &configured, error)) return Mode::kFailClosed;
    if (!configured) return Mode::kPassThrough;
  }
  if (const char* env_region = Getenv("TESSERA_REGION"); env_region != nullptr && env_region[0] != 0) {
    CopyString(region_path, sizeof(region_path), env_region);
  } else if (limits.region_path[0] != 0) {
    CopyString(region_path, sizeof(region_path), limits.region_path);
  } else if (!DefaultRegionPath(&Getenv, region_path, sizeof(region_path), error)) {
    return Mode::kFailClosed;
  }
  if (const char* t = Getenv("TESSERA_REGION_LOCK_TIMEOUT_MS"); t != nullptr && t[0] != 0) {
    uint64_t ms = 0;
    if (!ParseU64(t, &ms) || ms == 0 || ms > 600000) {
      error->Set("TESSERA_REGION_LOCK_TIMEOUT_MS='%s' must be a number of milliseconds, 1..600000", t);
      return Mode::kFailClosed;
    }
    region.set_lock_timeout_ms(static_cast<int>(ms));
  }
  host_pid = static_cast<uint32_t>(getpid());
  if (!region.Open(region_path, error) || !region.Attach(error)) return Mode::kFailClosed;
  const char* socket_path = Getenv("TESSERA_AGENT_SOCKET");
  if ((socket_path == nullptr || socket_path[0] == 0) && from_file &&
      access(kDefaultAgentSocket, F_OK) == 0) {
    socket_path = kDefaultAgentSocket;
  }
  if (socket_path != nullptr && socket_path[0] != 0) Register(socket_path);
  region.SetHostPid(host_pid);
  LogLine(LogLevel::kInfo, "limits from %s, generation %llu, region %s", from_file ? file : "the environment",
          static_cast<unsigned long long>(limits.generation), region_path);
  return Mode::kLimited;
}

void Session::Register(const char* socket_path) {
  Hello hello;
  CopyString(hello.lib, sizeof(hello.lib), library_->name);
  CopyString(hello.version, sizeof(hello.version), library_->version);
  hello.pid = static_cast<int>(getpid());
  hello.generation = limits.generation;
  size_t used = 0;
  for (int i = 0; i < limits.device_count; ++i) {
    const char* u = limits.devices[i].uuid;
    if (u[0] == 0) continue;
    const int n = snprintf(hello.gpus + used, sizeof(hello.gpus) - used, "%s%s", used ? "," : "", u);
    if (n < 0 || static_cast<size_t>(n) >= sizeof(hello.gpus) - used) break;
    used += static_cast<size_t>(n);
  }
  AgentMessage reply;
  Error error;
  if (!agent.Register(socket_path, hello, 2000, &reply, &error)) {
    WriteStderrLine("warning: %s (running on the limits alone)", error.text);
  } else {
    if (reply.host_pid != 0) {
      host_pid = reply.host_pid;
      host_pid_from_agent = host_pid != static_cast<uint32_t>(getpid());
    }
    LogLine(LogLevel::kInfo, "registered with the node agent at %s", socket_path);
  }
}

bool Session::AttachAgain() {
  pthread_mutex_lock(&init_mutex_);
  bool ok = true;
  if (need_attach_.load()) {
    Error error;
    ok = region.Attach(&error);
    if (!ok) {
      WriteStderrLine("%s", error.text);
    } else {
      need_attach_.store(false);
      // Its host pid is known only without a pid namespace between it and the agent (then it is getpid());
      // else 0 until it registers.
      host_pid = host_pid_from_agent ? 0 : static_cast<uint32_t>(getpid());
      region.SetHostPid(host_pid);
    }
  }
  pthread_mutex_unlock(&init_mutex_);
  return ok;
}

ChargeResult Session::Charge(int index, uint64_t bytes, const char* device) {
  ChargeResult c = region.TryCharge(index, bytes);
  if (c == ChargeResult::kOk || c == ChargeResult::kDetached) return c;
  // Before saying no: processes of this container that died may still hold charges.
  if (c == ChargeResult::kOverLimit && region.ReclaimDeadSlots() > 0) {
    c = region.TryCharge(index, bytes);
    if (c == ChargeResult::kOk) return c;
  }
  if (c == ChargeResult::kLockTimeout) {
    WriteStderrLine("refused %llu bytes on %s: %s", static_cast<unsigned long long>(bytes), device,
                    region.lock_error());
    return c;
  }
  if (c == ChargeResult::kOverLimit) region.device(index)->oom_count.fetch_add(1, std::memory_order_relaxed);
  LogLine(LogLevel::kInfo, "refused %llu bytes on %s: %llu of %llu in use by the container",
          static_cast<unsigned long long>(bytes), device, static_cast<unsigned long long>(region.Used(index)),
          static_cast<unsigned long long>(region.Limit(index)));
  return c;
}

void Session::Uncharge(int index, uint64_t bytes, const char* device) {
  if (forked_unattached()) return;  // a forked child holds nothing
  if (!region.Uncharge(index, bytes)) {
    WriteStderrLine("kept a charge of %llu bytes on %s: %s", static_cast<unsigned long long>(bytes), device,
                    region.lock_error());
  }
}

void Session::StartLimiterThread() {
  if (thread_started_.exchange(true)) return;
  g_limiting = this;
  if (!StartBackgroundThread(&Session::LimiterThread, "tessera-limit")) {
    if (library_->retry_limiter_start) thread_started_.store(false);
    WriteStderrLine("cannot start the limiter thread: compute limits are enforced without it");
  }
}

void* Session::LimiterThread(void*) {
  g_limiting->RunLimiterLoop();
}

void Session::RunLimiterLoop() {
  if (library_->in_limiter_thread != nullptr) library_->in_limiter_thread();
  uint64_t last_reload = 0;
  uint64_t last_reclaim = 0;
  for (;;) {
    const uint64_t now = MonotonicNs();
    AdvanceTabEpoch();  // the launching threads settle their tabs at their next launch
    const bool busy = library_->each_ms(now);
    if (now - last_reload >= 250000000ull) {
      last_reload = now;
      pthread_mutex_lock(&devices_mutex_);
      const bool changed = PollLimits();
      if (changed) library_->limits_changed();
      pthread_mutex_unlock(&devices_mutex_);
      // The line tests wait for (TESSERA_HOOK_LOG=info): the new limits are in force from here on.
      if (changed) {
        LogLine(LogLevel::kInfo, "applied limits generation %llu",
                static_cast<unsigned long long>(limits.generation));
      }
      if (library_->each_quarter != nullptr) library_->each_quarter(now);
    }
    if (now - last_reclaim >= 1000000000ull) {
      last_reclaim = now;
      region.ReclaimDeadSlots();
    }
    SleepNs(busy ? 1000000 : 10000000);  // 1 ms; 10 ms when there is nothing to pace or measure
  }
}

bool Session::PollLimits() {
  bool forced = false;
  AgentMessage msg;
  while (agent.Poll(&msg)) {
    if (msg.kind == AgentMessageKind::kReload) forced = true;
  }
  if (!limits_from_file) return false;
  struct stat st;
  if (stat(limits_path, &st) != 0) return false;  // being replaced: the next look finds it
  if (!forced && !Changed(st)) return false;
  Remember(st);
  Limits next;
  Error error;
  if (!ReadLimitsFile(limits_path, &next, &error)) {
    WriteStderrLine("keeping the current limits: %s", error.text);
    return false;
  }
  if (next.generation <= limits.generation) return false;
  limits = next;
  LogLine(LogLevel::kInfo, "read limits generation %llu", static_cast<unsigned long long>(next.generation));
  return true;
}

void Session::Remember(const struct stat& st) {
  file_ino_ = static_cast<uint64_t>(st.st_ino);
  file_mtime_sec_ = static_cast<int64_t>(st.st_mtim.tv_sec);
  file_mtime_nsec_ = static_cast<int64_t>(st.st_mtim.tv_nsec);
  file_size_ = static_cast<int64_t>(st.st_size);
}

bool Session::Changed(const struct stat& st) const {
  return file_ino_ != static_cast<uint64_t>(st.st_ino) ||
         file_mtime_sec_ != static_cast<int64_t>(st.st_mtim.tv_sec) ||
         file_mtime_nsec_ != static_cast<int64_t>(st.st_mtim.tv_nsec) ||
         file_size_ != static_cast<int64_t>(st.st_size);
}

bool RefillDevice(RegionDevice* shared, uint64_t now, bool* paced) {
  TokenBucket::Refill(&shared->bucket, now);
  if (!TokenBucket::Unlimited(&shared->bucket)) *paced = true;
  const uint64_t last = shared->controller.last_step_ns.load(std::memory_order_relaxed);
  return last == 0 || now - last >= ElasticController::kStepNs;
}

void Session::InstallForkHandlers() {
  g_forking = this;
  pthread_atfork(&Session::AtForkPrepare, &Session::AtForkParent, &Session::AtForkChild);
}

void Session::AtForkPrepare() {
  pthread_mutex_lock(&g_forking->init_mutex_);
}

void Session::AtForkParent() {
  pthread_mutex_unlock(&g_forking->init_mutex_);
}

void Session::AtForkChild() {
  g_forking->ForgetInChild();
}

void Session::ForgetInChild() {
  pthread_mutex_init(&init_mutex_, nullptr);
  pthread_mutex_init(&devices_mutex_, nullptr);
  // The limiter thread, the parent's slot and its agent connection stay with the parent: device contexts do
  // not survive fork(), so the child starts with nothing charged and claims its own slot before its first
  // charge (EnsureAttached).
  thread_started_.store(false);
  region.ForgetSlot();
  agent.Forget();
  need_attach_.store(true);
  ForgetThreadTabInChild();
  library_->forget_in_child();
}

void Session::Unload() {
  if (mode() == Mode::kLimited && !need_attach_.load()) {
    TokenBucket::Settle(ThreadTab());  // what the exiting thread launched and still owes
    region.Detach();
  }
}

}  // namespace tessera::hook
