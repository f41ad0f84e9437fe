#include "node/registration_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "core/strings.h"
#include "http/backlog.h"

namespace tessera::node {

namespace {

// The longest the loop sleeps when nothing is due (it also wakes for every event and for Stop).
constexpr std::chrono::milliseconds kPollCap{1000};

}  // namespace

RegistrationServer::RegistrationServer(std::string socket_path, Handlers handlers, Limits limits,
                                       const Clock& clock)
    : socket_path_(std::move(socket_path)), handlers_(std::move(handlers)), limits_(limits), clock_(clock) {}

RegistrationServer::~RegistrationServer() {
  Stop();
}

absl::Status RegistrationServer::Start() {
  if (listen_fd_ >= 0) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(socket_path_).parent_path(), ec);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(StrCat("registration socket path ", socket_path_, " is longer than ",
                                             sizeof(addr.sun_path) - 1,
                                             " characters; choose a shorter --state-dir"));
  }
  std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  unlink(socket_path_.c_str());  // a stale socket of an earlier run
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return absl::InternalError(StrCat("socket(): ", std::strerror(errno)));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, http::ListenBacklog()) != 0) {
    const std::string why = std::strerror(errno);
    close(listen_fd_);
    listen_fd_ = -1;
    return absl::InternalError(
        StrCat("cannot listen on the registration socket ", socket_path_, ": ", why, "; check --state-dir"));
  }
  chmod(socket_path_.c_str(), 0666);
  // Never more connections than half the descriptors the process may hold: gRPC, the API client and files
  // need the rest.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
    limits_.max_connections = std::min<size_t>(limits_.max_connections, nofile.rlim_cur / 2);
  }
  limits_.max_pending = std::max<size_t>(1, std::min(limits_.max_pending, limits_.max_connections));
  reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void RegistrationServer::Stop() {
  if (listen_fd_ < 0) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(&mu_);
    for (auto& [fd, c] : conns_) close(fd);
    conns_.clear();
  }
  close(listen_fd_);
  close(wake_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
  listen_fd_ = -1;
  wake_fd_ = -1;
  reserve_fd_ = -1;
  unlink(socket_path_.c_str());
}

void RegistrationServer::Loop() {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    {
      MutexLock lock(&mu_);
      for (const auto& [fd, c] : conns_) fds.push_back({fd, POLLIN, 0});
    }
    const std::chrono::milliseconds wait = std::min<std::chrono::milliseconds>(ExpirePending(), kPollCap);
    if (poll(fds.data(), fds.size(), static_cast<int>(wait.count()) + 1) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) break;
    if (fds[1].revents & POLLIN) AcceptAll();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn* c = nullptr;
      {
        MutexLock lock(&mu_);
        auto it = conns_.find(fds[i].fd);
        if (it != conns_.end()) c = &it->second;
      }
      if (c != nullptr && !OnReadable(c)) Close(c);
    }
  }
}

void RegistrationServer::AcceptAll() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
        // No descriptor left: the listening socket stays readable and poll() would spin. Free the reserve,
        // take the waiting connection and close it, shed the oldest pending one, and take the reserve back.
        {
          MutexLock lock(&mu_);
          ++stats_.emfile;
        }
        close(reserve_fd_);
        const int victim = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (victim >= 0) close(victim);
        EvictPending();
        reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        log::Warn("registration socket: out of file descriptors; shed connections",
                  {{"connections", StrCat(connection_count())}});
        continue;
      }
      return;
    }
    if (connection_count() >= limits_.max_connections && !EvictPending()) {
      close(fd);  // every connection is a registered process: the cap holds
      MutexLock lock(&mu_);
      ++stats_.refused;
      continue;
    }
    if (PendingCount() >= limits_.max_pending) EvictPending();
    ucred cred{};
    socklen_t len = sizeof(cred);
    Conn c;
    c.fd = fd;
    c.opened = clock_.Steady();
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) c.pid = cred.pid;
    if (handlers_.peer && c.pid > 0) c.peer = handlers_.peer(c.pid);
    MutexLock lock(&mu_);
    conns_[fd] = std::move(c);
  }
}

size_t RegistrationServer::PendingCount() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [fd, c] : conns_) n += c.tenant.empty() ? 1 : 0;
  return n;
}

bool RegistrationServer::EvictPending() {
  Conn* oldest = nullptr;
  {
    MutexLock lock(&mu_);
    std::map<std::string, size_t> pending;  // by peer
    for (const auto& [fd, c] : conns_) {
      if (c.tenant.empty()) ++pending[c.peer];
    }
    if (pending.empty()) return false;
    const std::string& greedy =
        std::max_element(pending.begin(), pending.end(), [](const auto& a, const auto& b) { return a.second < b.second; })
            ->first;
    for (auto& [fd, c] : conns_) {
      if (c.tenant.empty() && c.peer == greedy && (oldest == nullptr || c.opened < oldest->opened)) oldest = &c;
    }
    ++stats_.evicted;
  }
  Close(oldest);
  return true;
}

std::chrono::milliseconds RegistrationServer::ExpirePending() {
  const auto now = clock_.Steady();
  std::vector<Conn*> expired;
  auto next = std::chrono::steady_clock::time_point::max();
  {
    MutexLock lock(&mu_);
    for (auto& [fd, c] : conns_) {
      if (!c.tenant.empty()) continue;
      const auto deadline = c.opened + limits_.hello_timeout;
      if (deadline <= now) {
        expired.push_back(&c);
      } else {
        next = std::min(next, deadline);
      }
    }
    stats_.timed_out += expired.size();
  }
  for (Conn* c : expired) Close(c);
  if (next == std::chrono::steady_clock::time_point::max()) return kPollCap;
  return std::chrono::duration_cast<std::chrono::milliseconds>(next - now);
}

size_t RegistrationServer::connection_count() const {
  MutexLock lock(&mu_);
  return conns_.size();
}

RegistrationServer::Stats RegistrationServer::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

bool RegistrationServer::OnReadable(Conn* c) {
  char buf[1024];
  while (true) {
    const ssize_t n = read(c->fd, buf, sizeof(buf));
    if (n == 0) return false;  // the process exited (or closed)
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return false;
    }
    if (!c->tenant.empty()) continue;  // nothing more is expected from a registered process
    c->buf.append(buf, static_cast<size_t>(n));
    if (c->buf.size() > hook::kMaxLine) {
      c->buf.clear();
      return false;
    }
  }
  if (!c->tenant.empty()) return true;
  const size_t nl = c->buf.find('\n');
  if (nl == std::string::npos) return true;  // wait for the rest of the line
  const std::string line = c->buf.substr(0, nl);
  c->buf.clear();
  hook::Hello hello;
  hook::Error error;
  hook::AgentMessage reply;
  absl::StatusOr<Accepted> accepted = absl::InvalidArgumentError("");
  if (c->pid <= 0) {
    accepted = absl::PermissionDeniedError("the agent cannot read the caller's credentials (SO_PEERCRED)");
  } else if (!hook::ParseHello(line.data(), line.size(), &hello, &error)) {
    accepted = absl::InvalidArgumentError(StrCat("malformed HELLO: ", error.text));
  } else {
    accepted = handlers_.hello(c->pid, hello);
  }
  if (accepted.ok() && Pids(accepted->tenant).size() >= limits_.max_per_tenant) {
    accepted = absl::ResourceExhaustedError(
        StrCat("container ", accepted->tenant, " already has ", limits_.max_per_tenant,
               " registered processes, as many as its shared region holds"));
  }
  if (accepted.ok()) {
    reply.kind = hook::AgentMessageKind::kOk;
    reply.generation = accepted->generation;
    reply.host_pid = static_cast<uint32_t>(c->pid);  // the hook finds itself in NVML's process list by it
  } else {
    reply.kind = hook::AgentMessageKind::kError;
    std::string msg = std::string(accepted.status().message());
    for (char& ch : msg) {
      if (ch == '\n') ch = ' ';
    }
    std::strncpy(reply.error, msg.c_str(), sizeof(reply.error) - 1);
    log::Warn("registration refused", {{"pid", StrCat(c->pid)}, {"error", msg}});
  }
  char out[hook::kMaxLine];
  const size_t len = hook::FormatAgentMessage(reply, out, sizeof(out));
  {
    MutexLock lock(&mu_);
    if (len > 0) [[maybe_unused]]
      ssize_t w = send(c->fd, out, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (accepted.ok()) c->tenant = accepted->tenant;
  }
  if (accepted.ok()) {
    log::Info("process registered", {{"pid", StrCat(c->pid)}, {"tenant", accepted->tenant}});
  }
  return accepted.ok();
}

void RegistrationServer::Close(Conn* c) {
  const int pid = c->pid;
  std::string tenant;
  {
    MutexLock lock(&mu_);
    tenant = c->tenant;
    close(c->fd);
    conns_.erase(c->fd);
  }
  if (!tenant.empty() && handlers_.gone) handlers_.gone(pid, tenant);
}

int RegistrationServer::PushReload(const std::string& tenant, uint64_t generation) {
  hook::AgentMessage m;
  m.kind = hook::AgentMessageKind::kReload;
  m.generation = generation;
  char out[hook::kMaxLine];
  const size_t len = hook::FormatAgentMessage(m, out, sizeof(out));
  int told = 0;
  MutexLock lock(&mu_);
  for (auto& [fd, c] : conns_) {
    if (c.tenant != tenant) continue;
    if (send(fd, out, len, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(len)) ++told;
  }
  return told;
}

std::vector<int> RegistrationServer::Pids(const std::string& tenant) const {
  std::vector<int> out;
  MutexLock lock(&mu_);
  for (const auto& [fd, c] : conns_) {
    if (c.tenant == tenant) out.push_back(c.pid);
  }
  return out;
}

std::map<int, std::string> RegistrationServer::All() const {
  std::map<int, std::string> out;
  MutexLock lock(&mu_);
  for (const auto& [fd, c] : conns_) {
    if (!c.tenant.empty()) out[c.pid] = c.tenant;
  }
  return out;
}

}  // namespace tessera::node
