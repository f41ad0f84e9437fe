#include "hook/common/registration.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace tessera::hook {

namespace {

struct Field {
  const char* p;
  size_t n;
  bool Is(const char* s) const { return strlen(s) == n && memcmp(p, s, n) == 0; }
};

// Splits at single spaces; returns the number of fields (at most `max`).
int SplitFields(const char* line, size_t len, Field* fields, int max) {
  while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) --len;
  int count = 0;
  size_t i = 0;
  while (i < len && count < max) {
    while (i < len && line[i] == ' ') ++i;
    if (i >= len) break;
    const size_t start = i;
    while (i < len && line[i] != ' ') ++i;
    fields[count++] = Field{line + start, i - start};
  }
  return count;
}

bool CheckPrelude(const Field* f, int count, Error* error) {
  uint64_t v = 0;
  if (count < 3 || !f[0].Is("TESSERA") || !ParseU64(f[1].p, f[1].n, &v)) {
    error->Set("not a Tessera registration line (expected 'TESSERA <version> <verb> ...')");
    return false;
  }
  if (v != kProtocolVersion) {
    error->Set("registration protocol version %llu; this side speaks %u: update the hook library or the agent",
               static_cast<unsigned long long>(v), kProtocolVersion);
    return false;
  }
  return true;
}

bool SplitKeyValue(const Field& f, Field* key, Field* value) {
  const char* eq = static_cast<const char*>(memchr(f.p, '=', f.n));
  if (eq == nullptr) return false;
  *key = Field{f.p, static_cast<size_t>(eq - f.p)};
  *value = Field{eq + 1, f.n - key->n - 1};
  return true;
}

bool SafeValue(const char* s) {
  for (; *s != 0; ++s) {
    if (*s == ' ' || *s == '\n' || *s == '\r' || *s == '=') return false;
  }
  return true;
}

}  // namespace

size_t FormatHello(const Hello& h, char* buf, size_t cap) {
  if (!SafeValue(h.lib) || !SafeValue(h.version) || !SafeValue(h.gpus)) return 0;
  const int n = snprintf(buf, cap, "TESSERA %u HELLO lib=%s version=%s pid=%d generation=%llu gpus=%s\n",
                         kProtocolVersion, h.lib[0] ? h.lib : "-", h.version[0] ? h.version : "-", h.pid,
                         static_cast<unsigned long long>(h.generation), h.gpus[0] ? h.gpus : "-");
  if (n < 0 || static_cast<size_t>(n) >= cap || static_cast<size_t>(n) > kMaxLine) return 0;
  return static_cast<size_t>(n);
}

size_t FormatAgentMessage(const AgentMessage& m, char* buf, size_t cap) {
  int n = 0;
  switch (m.kind) {
    case AgentMessageKind::kOk:
      if (m.host_pid != 0) {
        n = snprintf(buf, cap, "TESSERA %u OK generation=%llu host_pid=%u\n", kProtocolVersion,
                     static_cast<unsigned long long>(m.generation), m.host_pid);
      } else {
        n = snprintf(buf, cap, "TESSERA %u OK generation=%llu\n", kProtocolVersion,
                     static_cast<unsigned long long>(m.generation));
      }
      break;
    case AgentMessageKind::kReload:
      n = snprintf(buf, cap, "TESSERA %u RELOAD generation=%llu\n", kProtocolVersion,
                   static_cast<unsigned long long>(m.generation));
      break;
    case AgentMessageKind::kError: {
      char clean[sizeof(m.error)];
      CopyString(clean, sizeof(clean), m.error);
      for (char* p = clean; *p != 0; ++p) {
        if (*p == '\n' || *p == '\r') *p = ' ';
      }
      n = snprintf(buf, cap, "TESSERA %u ERR %s\n", kProtocolVersion, clean);
      break;
    }
  }
  if (n < 0 || static_cast<size_t>(n) >= cap) return 0;
  return static_cast<size_t>(n);
}

bool ParseHello(const char* line, size_t len, Hello* out, Error* error) {
  *out = Hello{};
  Field f[16];
  const int count = SplitFields(line, len, f, 16);
  if (!CheckPrelude(f, count, error)) return false;
  if (!f[2].Is("HELLO")) {
    error->Set("expected HELLO, got '%.*s'", static_cast<int>(f[2].n), f[2].p);
    return false;
  }
  for (int i = 3; i < count; ++i) {
    Field key{nullptr, 0};
    Field value{nullptr, 0};
    if (!SplitKeyValue(f[i], &key, &value)) {
      error->Set("HELLO field '%.*s' is not key=value", static_cast<int>(f[i].n), f[i].p);
      return false;
    }
    if (key.Is("lib")) {
      CopyString(out->lib, sizeof(out->lib), value.p, value.n);
    } else if (key.Is("version")) {
      CopyString(out->version, sizeof(out->version), value.p, value.n);
    } else if (key.Is("pid")) {
      uint64_t v = 0;
      if (!ParseU64(value.p, value.n, &v) || v > 0x7fffffff) {
        error->Set("HELLO pid is not a process id");
        return false;
      }
      out->pid = static_cast<int>(v);
    } else if (key.Is("generation")) {
      if (!ParseU64(value.p, value.n, &out->generation)) {
        error->Set("HELLO generation is not a number");
        return false;
      }
    } else if (key.Is("gpus")) {
      if (!value.Is("-") && !CopyString(out->gpus, sizeof(out->gpus), value.p, value.n)) {
        error->Set("HELLO gpus list is too long");
        return false;
      }
    }
  }
  if (out->lib[0] == 0) {
    error->Set("HELLO without lib=");
    return false;
  }
  return true;
}

bool ParseAgentMessage(const char* line, size_t len, AgentMessage* out, Error* error) {
  *out = AgentMessage{};
  Field f[8];
  const int count = SplitFields(line, len, f, 8);
  if (!CheckPrelude(f, count, error)) return false;
  if (f[2].Is("ERR")) {
    out->kind = AgentMessageKind::kError;
    // The message is the rest of the line after "ERR ".
    const char* rest = f[2].p + f[2].n;
    const char* end = line + len;
    while (end > rest && (end[-1] == '\n' || end[-1] == '\r')) --end;
    while (rest < end && *rest == ' ') ++rest;
    CopyString(out->error, sizeof(out->error), rest, static_cast<size_t>(end - rest));
    return true;
  }
  if (f[2].Is("OK")) {
    out->kind = AgentMessageKind::kOk;
  } else if (f[2].Is("RELOAD")) {
    out->kind = AgentMessageKind::kReload;
  } else {
    error->Set("unknown agent message '%.*s'", static_cast<int>(f[2].n), f[2].p);
    return false;
  }
  for (int i = 3; i < count; ++i) {
    Field key{nullptr, 0};
    Field value{nullptr, 0};
    if (!SplitKeyValue(f[i], &key, &value)) continue;
    if (key.Is("generation") && !ParseU64(value.p, value.n, &out->generation)) {
      error->Set("agent message has a malformed generation");
      return false;
    }
    uint64_t pid = 0;
    if (key.Is("host_pid")) {
      if (!ParseU64(value.p, value.n, &pid) || pid == 0 || pid > 0x7fffffffu) {
        error->Set("agent message has a malformed host_pid");
        return false;
      }
      out->host_pid = static_cast<uint32_t>(pid);
    }
  }
  return true;
}

void AgentConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  len_ = 0;
}

bool AgentConnection::Register(const char* socket_path, const Hello& hello, int timeout_ms, AgentMessage* reply,
                               Error* error) {
  Close();
  closed_ = false;
  sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (!CopyString(addr.sun_path, sizeof(addr.sun_path), socket_path)) {
    error->Set("agent socket path is too long: %s", socket_path);
    return false;
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error->Set("cannot create a unix socket: %s", strerror(errno));
    return false;
  }
  const uint64_t deadline = MonotonicNs() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  auto remaining_ms = [&]() -> int {
    const uint64_t now = MonotonicNs();
    return now >= deadline ? 0 : static_cast<int>((deadline - now) / 1000000ull) + 1;
  };
  auto fail = [&](const char* what, int err) {
    error->Set("agent at %s: %s%s%s", socket_path, what, err != 0 ? ": " : "", err != 0 ? strerror(err) : "");
    close(fd);
    return false;
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) return fail("cannot connect", errno);
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, remaining_ms()) <= 0) return fail("connect timed out", 0);
    int so_error = 0;
    socklen_t sl = sizeof(so_error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &sl);
    if (so_error != 0) return fail("cannot connect", so_error);
  }
  char line[kMaxLine + 1];
  const size_t n = FormatHello(hello, line, sizeof(line));
  if (n == 0) return fail("hello does not fit in one line", 0);
  size_t sent = 0;
  while (sent < n) {
    const ssize_t w = send(fd, line + sent, n - sent, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, remaining_ms()) <= 0) return fail("send timed out", 0);
        continue;
      }
      return fail("cannot send hello", errno);
    }
    sent += static_cast<size_t>(w);
  }
  fd_ = fd;
  len_ = 0;
  for (;;) {
    if (TakeLine(reply)) break;
    if (closed_) {
      fd_ = -1;
      return fail("closed the connection without answering", 0);
    }
    pollfd p{fd, POLLIN, 0};
    const int ms = remaining_ms();
    if (ms <= 0 || poll(&p, 1, ms) <= 0) {
      fd_ = -1;
      return fail("no answer in time", 0);
    }
    const ssize_t r = recv(fd, buf_ + len_, sizeof(buf_) - len_, 0);
    if (r == 0) {
      closed_ = true;
      continue;
    }
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fd_ = -1;
      return fail("cannot read the answer", errno);
    }
    len_ += static_cast<size_t>(r);
    if (len_ == sizeof(buf_) && memchr(buf_, '\n', len_) == nullptr) {
      fd_ = -1;
      return fail("answered with a line that is too long", 0);
    }
  }
  if (reply->kind == AgentMessageKind::kError) {
    error->Set("agent at %s refused the registration: %s", socket_path, reply->error);
    Close();
    return false;
  }
  if (reply->kind != AgentMessageKind::kOk) {
    error->Set("agent at %s answered the hello with something other than OK", socket_path);
    Close();
    return false;
  }
  return true;
}

bool AgentConnection::TakeLine(AgentMessage* out) {
  for (;;) {
    char* nl = static_cast<char*>(memchr(buf_, '\n', len_));
    if (nl == nullptr) return false;
    const size_t line_len = static_cast<size_t>(nl - buf_) + 1;
    Error ignored;
    const bool ok = ParseAgentMessage(buf_, line_len, out, &ignored);
    memmove(buf_, buf_ + line_len, len_ - line_len);
    len_ -= line_len;
    if (ok) return true;  // malformed lines are skipped
  }
}

bool AgentConnection::Poll(AgentMessage* out) {
  if (fd_ < 0) return false;
  if (TakeLine(out)) return true;
  for (;;) {
    if (len_ == sizeof(buf_)) len_ = 0;  // a line longer than the protocol allows: drop it
    const ssize_t r = recv(fd_, buf_ + len_, sizeof(buf_) - len_, MSG_DONTWAIT);
    if (r == 0) {
      closed_ = true;
      Close();
      return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        closed_ = true;
        Close();
      }
      return false;
    }
    len_ += static_cast<size_t>(r);
    if (TakeLine(out)) return true;
  }
}

}  // namespace tessera::hook
