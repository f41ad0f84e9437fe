#include "hook/common/session.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tessera::hook {

namespace {

void Remember(Session* s, const struct stat& st) {
  s->file_ino = static_cast<uint64_t>(st.st_ino);
  s->file_mtime_sec = static_cast<int64_t>(st.st_mtim.tv_sec);
  s->file_mtime_nsec = static_cast<int64_t>(st.st_mtim.tv_nsec);
  s->file_size = static_cast<int64_t>(st.st_size);
}

bool Changed(const Session* s, const struct stat& st) {
  return s->file_ino != static_cast<uint64_t>(st.st_ino) ||
         s->file_mtime_sec != static_cast<int64_t>(st.st_mtim.tv_sec) ||
         s->file_mtime_nsec != static_cast<int64_t>(st.st_mtim.tv_nsec) ||
         s->file_size != static_cast<int64_t>(st.st_size);
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

void Register(const char* lib, const char* version, const char* socket_path, Session* s) {
  Hello hello;
  CopyString(hello.lib, sizeof(hello.lib), lib);
  CopyString(hello.version, sizeof(hello.version), version);
  hello.pid = static_cast<int>(getpid());
  hello.generation = s->limits.generation;
  size_t used = 0;
  for (int i = 0; i < s->limits.device_count; ++i) {
    const char* u = s->limits.devices[i].uuid;
    if (u[0] == 0) continue;
    const int n = snprintf(hello.gpus + used, sizeof(hello.gpus) - used, "%s%s", used ? "," : "", u);
    if (n < 0 || static_cast<size_t>(n) >= sizeof(hello.gpus) - used) break;
    used += static_cast<size_t>(n);
  }
  AgentMessage reply;
  Error error;
  if (!s->agent.Register(socket_path, hello, 2000, &reply, &error)) {
    WriteStderrLine("warning: %s (running on the limits alone)", error.text);
  } else {
    if (reply.host_pid != 0) {
      s->host_pid = reply.host_pid;
      s->host_pid_from_agent = s->host_pid != static_cast<uint32_t>(getpid());
    }
    LogLine(LogLevel::kInfo, "registered with the node agent at %s", socket_path);
  }
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

SessionMode StartSession(const char* lib, const char* version, EnvLookup lookup, Session* s, Error* error) {
  const char* file = lookup("TESSERA_LIMITS_FILE");
  struct stat st;
  bool from_file = false;
  if (file != nullptr && file[0] != 0) {
    from_file = true;
  } else if (stat(kDefaultLimitsFile, &st) == 0) {
    file = kDefaultLimitsFile;
    from_file = true;
  }
  if (from_file) {
    CopyString(s->limits_path, sizeof(s->limits_path), file);
    if (stat(file, &st) == 0) Remember(s, st);
    if (!ReadLimitsFile(file, &s->limits, error)) return SessionMode::kFailClosed;
    s->limits_from_file = true;
  } else {
    bool configured = false;
    if (!LimitsFromEnvironment(lookup, &s->limits, &configured, error)) return SessionMode::kFailClosed;
    if (!configured) return SessionMode::kPassThrough;
  }
  if (const char* env_region = lookup("TESSERA_REGION"); env_region != nullptr && env_region[0] != 0) {
    CopyString(s->region_path, sizeof(s->region_path), env_region);
  } else if (s->limits.region_path[0] != 0) {
    CopyString(s->region_path, sizeof(s->region_path), s->limits.region_path);
  } else if (!DefaultRegionPath(lookup, s->region_path, sizeof(s->region_path), error)) {
    return SessionMode::kFailClosed;
  }
  if (const char* t = lookup("TESSERA_REGION_LOCK_TIMEOUT_MS"); t != nullptr && t[0] != 0) {
    uint64_t ms = 0;
    if (!ParseU64(t, &ms) || ms == 0 || ms > 600000) {
      error->Set("TESSERA_REGION_LOCK_TIMEOUT_MS='%s' must be a number of milliseconds, 1..600000", t);
      return SessionMode::kFailClosed;
    }
    s->region.set_lock_timeout_ms(static_cast<int>(ms));
  }
  s->host_pid = static_cast<uint32_t>(getpid());
  if (!s->region.Open(s->region_path, error) || !s->region.Attach(error)) return SessionMode::kFailClosed;
  const char* socket_path = lookup("TESSERA_AGENT_SOCKET");
  if ((socket_path == nullptr || socket_path[0] == 0) && from_file &&
      access(kDefaultAgentSocket, F_OK) == 0) {
    socket_path = kDefaultAgentSocket;
  }
  if (socket_path != nullptr && socket_path[0] != 0) Register(lib, version, socket_path, s);
  s->region.SetHostPid(s->host_pid);
  LogLine(LogLevel::kInfo, "limits from %s, generation %llu, region %s", from_file ? file : "the environment",
          static_cast<unsigned long long>(s->limits.generation), s->region_path);
  return SessionMode::kLimited;
}

void SessionForgetInChild(Session* s) {
  s->region.ForgetSlot();
  s->agent.Forget();
}

void RunLimiterLoop(const LimiterLoop& loop) {
  uint64_t last_reload = 0;
  uint64_t last_reclaim = 0;
  for (;;) {
    const uint64_t now = MonotonicNs();
    const bool busy = loop.each_ms(now);
    if (now - last_reload >= 250000000ull) {
      last_reload = now;
      pthread_mutex_lock(loop.devices_mutex);
      const bool changed = PollSessionLimits(loop.session);
      if (changed) loop.limits_changed();
      pthread_mutex_unlock(loop.devices_mutex);
      // The line tests wait for (TESSERA_HOOK_LOG=info): the new limits are in force from here on.
      if (changed) {
        LogLine(LogLevel::kInfo, "applied limits generation %llu",
                static_cast<unsigned long long>(loop.session->limits.generation));
      }
      if (loop.each_quarter != nullptr) loop.each_quarter(now);
    }
    if (now - last_reclaim >= 1000000000ull) {
      last_reclaim = now;
      loop.session->region.ReclaimDeadSlots();
    }
    SleepNs(busy ? 1000000 : 10000000);  // 1 ms; 10 ms when there is nothing to pace or measure
  }
}

void SessionForkedChildAttached(Session* s, bool) {
  s->host_pid = s->host_pid_from_agent ? 0 : static_cast<uint32_t>(getpid());
  s->region.SetHostPid(s->host_pid);
}

bool PollSessionLimits(Session* s) {
  bool forced = false;
  AgentMessage msg;
  while (s->agent.Poll(&msg)) {
    if (msg.kind == AgentMessageKind::kReload) forced = true;
  }
  if (!s->limits_from_file) return false;
  struct stat st;
  if (stat(s->limits_path, &st) != 0) return false;  // being replaced: the next look finds it
  if (!forced && !Changed(s, st)) return false;
  Remember(s, st);
  Limits next;
  Error error;
  if (!ReadLimitsFile(s->limits_path, &next, &error)) {
    WriteStderrLine("keeping the current limits: %s", error.text);
    return false;
  }
  if (next.generation <= s->limits.generation) return false;
  s->limits = next;
  LogLine(LogLevel::kInfo, "read limits generation %llu", static_cast<unsigned long long>(next.generation));
  return true;
}

}  // namespace tessera::hook
