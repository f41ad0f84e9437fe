// The node agent's side of the hook registration protocol (docs/node-agent.md, "Registration"; the line
// format is src/hook/common/registration.h, shared with the hooks): a unix socket server on one thread.
//
// Each connection says one HELLO line. The server takes the caller's host PID from SO_PEERCRED (never from
// the line) and asks the handler who that is; the handler answers with the tenant (pod UID/container) and its
// limits generation, or an error, which goes back as "TESSERA 1 ERR <message>" before the connection is
// closed. Accepted connections stay open for the life of the process: EOF means the process exited (the
// handler's gone() hears of it), and PushReload() sends "TESSERA 1 RELOAD generation=<g>" to every process of
// a tenant.
//
//   RegistrationServer server(path, {.hello = [&](int pid, const hook::Hello& h) -> absl::StatusOr<Accepted>
//                                      { ... }, .gone = [&](int pid, const std::string& tenant) { ... }},
//                             {}, RealClock());
//   server.Start();
//   server.PushReload("uid/main", 4);
//
// Limits (docs/security.md, "Registration socket"): anyone in a GPU container can connect, so nothing a
// connection does may starve the others. A connection that has not said its HELLO within `hello_timeout` is
// closed; at most `max_pending` such connections are kept (a new one evicts the oldest of the peer with the
// most pending, so that one container opening connections in a loop sheds its own, not others'); registered
// connections are capped per tenant (`max_per_tenant`, the region's slots) and in all (`max_connections`,
// also kept under half the process's descriptor limit). When accept() fails for want of descriptors the
// server sheds the oldest pending connection with a reserve descriptor and keeps serving.
//
// Thread-safety: Start/Stop from one thread; PushReload, Pids and Count from any thread. The handlers run on
// the server's thread.
#ifndef TESSERA_NODE_REGISTRATION_SERVER_H_
#define TESSERA_NODE_REGISTRATION_SERVER_H_

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "hook/common/registration.h"

namespace tessera::node {

// The registration server's caps (see the header comment).
struct RegistrationLimits {
  std::chrono::milliseconds hello_timeout{5000};  // from connect to a complete HELLO line
  size_t max_pending = 64;                        // connections that have not registered yet
  size_t max_per_tenant = 1024;   // registered processes of one container (the region's slots)
  size_t max_connections = 8192;  // every connection, pending or registered
};

class RegistrationServer {
 public:
  struct Accepted {
    std::string tenant;       // the agent's key for the container
    uint64_t generation = 0;  // its limits generation now
  };
  using Limits = RegistrationLimits;
  struct Stats {
    uint64_t timed_out = 0;  // pending connections closed for saying no HELLO in time
    uint64_t evicted = 0;    // pending connections closed to admit a newer one
    uint64_t refused = 0;    // connections closed at once: a cap was reached
    uint64_t emfile = 0;     // accept() found no descriptor left
  };
  struct Handlers {
    std::function<absl::StatusOr<Accepted>(int host_pid, const hook::Hello& hello)> hello;
    std::function<void(int host_pid, const std::string& tenant)> gone;
    // Optional: who a connecting process is, for fairness among pending connections (the agent: its pod). Called
    // on the server's thread at each accept; must be quick and never block.
    std::function<std::string(int host_pid)> peer;
  };

  // `clock` times the HELLO timeouts (common/clock.h); it must outlive the server.
  RegistrationServer(std::string socket_path, Handlers handlers, Limits limits, const Clock& clock);
  ~RegistrationServer();
  RegistrationServer(const RegistrationServer&) = delete;
  RegistrationServer& operator=(const RegistrationServer&) = delete;

  // Creates the socket's directory, removes a stale socket, listens (mode 0666: container users connect).
  absl::Status Start();
  void Stop();

  // Sends RELOAD to every registered process of `tenant`; returns how many were told.
  int PushReload(const std::string& tenant, uint64_t generation);
  // Host PIDs registered for `tenant` (connections still open).
  std::vector<int> Pids(const std::string& tenant) const;
  // Every registered process: host PID -> tenant.
  std::map<int, std::string> All() const;
  const std::string& socket_path() const { return socket_path_; }
  // Open connections (pending and registered).
  size_t connection_count() const;
  Stats stats() const;

 private:
  struct Conn {
    int fd = -1;
    int pid = 0;
    std::string tenant;  // empty until accepted
    std::string peer;    // handlers.peer's answer at accept ("" without one)
    std::string buf;
    std::chrono::steady_clock::time_point opened;
  };
  void Loop();
  // Handles what arrived on a connection; false when it must be closed.
  bool OnReadable(Conn* c);
  void Close(Conn* c);
  void AcceptAll();
  // Closes pending connections older than hello_timeout; returns how long until the next one expires.
  std::chrono::milliseconds ExpirePending();
  // Closes the oldest pending connection of the peer with the most pending ones; false when there is none.
  bool EvictPending();
  size_t PendingCount() const;

  const std::string socket_path_;
  const Handlers handlers_;
  Limits limits_;
  const Clock& clock_;
  int listen_fd_ = -1;
  int reserve_fd_ = -1;  // held so that a descriptor can be freed to shed connections when none is left
  int wake_fd_ = -1;
  std::thread thread_;
  // Guards the map (inserts and erases happen on the server's thread, under it), each Conn's tenant and pid,
  // and writes to accepted connections.
  mutable Mutex mu_;
  std::map<int, Conn> conns_ ABSL_GUARDED_BY(mu_);  // by fd
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_REGISTRATION_SERVER_H_
