// Registration of a hooked process with the node agent over the agent's unix socket (docs/hook-protocol.md).
// Tiny and versioned: one text line each way, then the connection stays open for the life of the process so
// that the agent sees it exit (EOF) and may push "reload your limits now".
//
//   client -> agent   TESSERA 1 HELLO lib=cuda version=0.1.0 pid=42 generation=3 gpus=GPU-a,GPU-b
//   agent  -> client  TESSERA 1 OK generation=3 host_pid=81234
//                     TESSERA 1 ERR <one line saying what is wrong>
//   agent  -> client  TESSERA 1 RELOAD generation=4          (any time later)
//
// The agent identifies the caller by the socket's peer credentials (SO_PEERCRED: host pid, then cgroup, then
// pod and container), never by the pid the client writes, which is only the pid inside its own namespace
// (useful for logs). Both sides ignore keys they do not know, so minor additions need no new version.
//
//   tessera::hook::Hello hello;  hello.pid = getpid();  CopyString(hello.lib, sizeof(hello.lib), "cuda");
//   tessera::hook::AgentConnection agent;
//   tessera::hook::AgentMessage reply;
//   if (!agent.Register("/var/run/tessera/agent.sock", hello, 2000, &reply, &error)) { ... }
//   while (agent.Poll(&msg)) if (msg.kind == AgentMessageKind::kReload) ReloadLimits();
//
// API-neutral. Thread-safety: the format/parse functions are pure; an AgentConnection is used by one thread.
#ifndef TESSERA_HOOK_COMMON_REGISTRATION_H_
#define TESSERA_HOOK_COMMON_REGISTRATION_H_

#include <cstddef>
#include <cstdint>

#include "hook/common/base.h"
#include "hook/common/limits.h"

namespace tessera::hook {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kMaxLine = 2048;  // longest line either side sends, newline included

struct Hello {
  char lib[16] = {0};          // "cuda" or "opencl"
  char version[32] = {0};      // the library's version
  int pid = 0;                 // the caller's pid in its own namespace (informational)
  uint64_t generation = 0;     // limits generation the process started with
  char gpus[kMaxDevices * kUuidSize] = {0};  // comma-separated UUIDs the process sees; empty: unknown yet
};

enum class AgentMessageKind { kOk, kError, kReload };

struct AgentMessage {
  AgentMessageKind kind = AgentMessageKind::kOk;
  uint64_t generation = 0;
  uint32_t host_pid = 0;       // kOk: the caller's pid on the host (what NVML reports); 0 when not sent
  char error[256] = {0};       // kError only
};

// Formats a line (with its newline). Returns the length, or 0 when it does not fit.
size_t FormatHello(const Hello& hello, char* buf, size_t cap);
size_t FormatAgentMessage(const AgentMessage& message, char* buf, size_t cap);
// Parses one line (with or without its newline).
bool ParseHello(const char* line, size_t len, Hello* out, Error* error);
bool ParseAgentMessage(const char* line, size_t len, AgentMessage* out, Error* error);

// The hook's side of the connection.
class AgentConnection {
 public:
  AgentConnection() = default;
  AgentConnection(const AgentConnection&) = delete;
  AgentConnection& operator=(const AgentConnection&) = delete;
  // No destructor (see SharedRegion): Close() explicitly.

  // Connects, sends the hello and waits for the agent's answer (at most `timeout_ms` in all). True on OK;
  // false with `error` on no agent, a timeout, a malformed answer, or ERR (the agent's message in `error`).
  // The socket is close-on-exec and stays open after OK.
  bool Register(const char* socket_path, const Hello& hello, int timeout_ms, AgentMessage* reply, Error* error);
  // Reads what the agent sent since, without blocking. True with `out` for each complete line; false when
  // there is none. Sets closed() when the agent went away.
  bool Poll(AgentMessage* out);
  void Close();
  // In a forked child: forget the parent's socket without closing it (the parent still uses it).
  void Forget() { fd_ = -1; len_ = 0; }
  bool connected() const { return fd_ >= 0; }
  bool closed() const { return closed_; }
  int fd() const { return fd_; }

 private:
  bool TakeLine(AgentMessage* out);
  int fd_ = -1;
  bool closed_ = false;
  size_t len_ = 0;
  char buf_[kMaxLine];
};

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_REGISTRATION_H_
