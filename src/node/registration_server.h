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
//                                      { ... }, .gone = [&](int pid, const std::string& tenant) { ... }});
//   server.Start();
//   server.PushReload("uid/main", 4);
//
// Thread-safety: Start/Stop from one thread; PushReload, Pids and Count from any thread. The handlers run on
// the server's thread.
#ifndef TESSERA_NODE_REGISTRATION_SERVER_H_
#define TESSERA_NODE_REGISTRATION_SERVER_H_

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "hook/common/registration.h"

namespace tessera::node {

class RegistrationServer {
 public:
  struct Accepted {
    std::string tenant;       // the agent's key for the container
    uint64_t generation = 0;  // its limits generation now
  };
  struct Handlers {
    std::function<absl::StatusOr<Accepted>(int host_pid, const hook::Hello& hello)> hello;
    std::function<void(int host_pid, const std::string& tenant)> gone;
  };

  RegistrationServer(std::string socket_path, Handlers handlers);
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

 private:
  struct Conn {
    int fd = -1;
    int pid = 0;
    std::string tenant;  // empty until accepted
    std::string buf;
  };
  void Loop();
  // Handles what arrived on a connection; false when it must be closed.
  bool OnReadable(Conn* c);
  void Close(Conn* c);

  const std::string socket_path_;
  const Handlers handlers_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  mutable std::mutex mu_;      // guards conns_' tenant/pid and writes to accepted connections
  std::map<int, Conn> conns_;  // by fd
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_REGISTRATION_SERVER_H_
