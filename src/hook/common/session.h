// How a hook library starts in a process, API-neutral: find the limits (the limits file, else environment
// variables, else none: pass through), open and attach the container's shared region, register with the node
// agent when one is mounted, and later pick up rewritten limits (file change or the agent's RELOAD). The one
// start of both hook libraries (libtessera-cuda.so and libtessera-opencl.so).
//
//   tessera::hook::Session session;
//   tessera::hook::Error error;
//   switch (tessera::hook::StartSession("opencl", "0.1.0", &getenv_wrapper, &session, &error)) {
//     case SessionMode::kFailClosed: WriteStderrLine("GPU access refused: %s", error.text); break;
//     case SessionMode::kPassThrough: break;  // no limits configured
//     case SessionMode::kLimited: ... session.limits, session.region ...
//   }
//   if (tessera::hook::PollSessionLimits(&session)) ApplyLimits(session.limits);   // about 4 times a second
//
// Sources, in order: TESSERA_LIMITS_FILE, else /etc/tessera/limits when it exists, else the TESSERA_GPU_*
// variables (LimitsFromEnvironment). Region: TESSERA_REGION, else the limits file's region=, else
// DefaultRegionPath() (a directory only this user can have made, checked). Lock waits on the region give up
// after TESSERA_REGION_LOCK_TIMEOUT_MS (default 2000). Agent socket: TESSERA_AGENT_SOCKET, else /var/run/tessera/agent.sock when the
// limits come from a file and the socket exists.
//
// Thread-safety: StartSession runs once, before other threads use the session; PollSessionLimits from one
// thread (the hook's limiter thread).
#ifndef TESSERA_HOOK_COMMON_SESSION_H_
#define TESSERA_HOOK_COMMON_SESSION_H_

#include <pthread.h>

#include <cstdint>

#include "hook/common/base.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/common/registration.h"

namespace tessera::hook {

inline constexpr const char* kDefaultLimitsFile = "/etc/tessera/limits";
inline constexpr const char* kDefaultAgentSocket = "/var/run/tessera/agent.sock";

enum class SessionMode {
  kPassThrough = 1,  // no limits configured: the process runs untouched
  kLimited = 2,      // limits apply; the region is open and attached
  kFailClosed = 3,   // limits were configured but cannot be used: GPU use is refused
};

struct Session {
  Limits limits;
  bool limits_from_file = false;
  char limits_path[kPathSize] = {0};
  char region_path[kPathSize] = {0};
  SharedRegion region;
  AgentConnection agent;
  uint32_t host_pid = 0;  // this process's pid on the host: the agent's answer, else getpid()
  bool host_pid_from_agent = false;
  // The limits file as last read (inode, mtime, size), to notice a rewrite cheaply.
  uint64_t file_ino = 0;
  int64_t file_mtime_sec = 0;
  int64_t file_mtime_nsec = 0;
  int64_t file_size = 0;
};

// Decides the mode and, when limited, opens the region and registers with the agent (a missing or refusing
// agent is a warning, not a failure: the limits file is the authority). `lib` is "cuda" or "opencl".
// On kFailClosed, `error` says why.
SessionMode StartSession(const char* lib, const char* version, EnvLookup lookup, Session* session,
                         Error* error);

// The default region when neither TESSERA_REGION nor the limits file names one:
// $XDG_RUNTIME_DIR/tessera/region when XDG_RUNTIME_DIR is set, else /tmp/tessera-<uid>/region. The
// directory is created mode 0700 when missing; an existing one must be a real directory (no symlink) owned
// by this user and writable by no one else, else false with `error` saying what to do (another local user
// could otherwise plant a region, or a lock that never comes, for this user's processes).
bool DefaultRegionPath(EnvLookup lookup, char* out, size_t cap, Error* error);

// After fork(), in the child (from the pthread_atfork child handler): the parent's slot and agent connection
// stay the parent's; the child claims its own slot before its first charge.
void SessionForgetInChild(Session* session);

// The limiter thread's loop, the same in both libraries: every millisecond `each_ms` (every 10 ms while it
// returns false: no compute limit and nothing being measured, as in a memory-only container); about four times
// a second the agent's messages and the limits file (PollSessionLimits, under `devices_mutex`;
// `limits_changed` applies new limits) and then `each_quarter`; every second the dead processes' charges are
// reclaimed. Never returns.
struct LimiterLoop {
  Session* session = nullptr;
  pthread_mutex_t* devices_mutex = nullptr;
  bool (*each_ms)(uint64_t now_ns) = nullptr;  // true: compute is paced or launches are being measured
  void (*limits_changed)() = nullptr;        // called with devices_mutex held
  void (*each_quarter)(uint64_t now_ns) = nullptr;  // optional
};
[[noreturn]] void RunLimiterLoop(const LimiterLoop& loop);

// After fork(), in the child, once it has attached again: its host pid is known only without a pid
// namespace between it and the agent (then it is getpid()); else 0 until it registers.
void SessionForkedChildAttached(Session* session, bool had_agent_pid);

// Reads the agent's messages and the limits file; true when limits of a higher generation were read into
// session->limits (the caller applies them). A malformed rewrite keeps the current limits (one stderr line).
bool PollSessionLimits(Session* session);

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_SESSION_H_
