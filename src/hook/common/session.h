// How a hook library starts in a process, API-neutral: find the limits (the limits file, else environment
// variables, else none: pass through), open and attach the container's shared region, register with the node
// agent when one is mounted, and later pick up rewritten limits (file change or the agent's RELOAD). Used by
// libtessera-opencl.so; libtessera-cuda.so does the same steps in its own entry.cc.
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
// /tmp/tessera-region-<uid>. Agent socket: TESSERA_AGENT_SOCKET, else /var/run/tessera/agent.sock when the
// limits come from a file and the socket exists.
//
// Thread-safety: StartSession runs once, before other threads use the session; PollSessionLimits from one
// thread (the hook's limiter thread).
#ifndef TESSERA_HOOK_COMMON_SESSION_H_
#define TESSERA_HOOK_COMMON_SESSION_H_

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

// Reads the agent's messages and the limits file; true when limits of a higher generation were read into
// session->limits (the caller applies them). A malformed rewrite keeps the current limits (one stderr line).
bool PollSessionLimits(Session* session);

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_SESSION_H_
