#include "http/listen.h"

#include <fstream>

#include "core/strings.h"

namespace tessera::http {

absl::StatusOr<std::pair<std::string, int>> ParseListen(std::string_view listen) {
  const size_t colon = listen.rfind(':');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        StrCat("listen address \"", listen,
               "\" is not HOST:PORT; write e.g. 0.0.0.0:8888, 127.0.0.1:0 or [::1]:8888"));
  };
  if (colon == std::string_view::npos || colon == 0) return bad();
  std::string host(listen.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  if (!ParseInt(listen.substr(colon + 1), &port) || port < 0 || port > 65535) return bad();
  return std::pair{host, port};
}

int ListenBacklog() {
  // One integer from a kernel file (reading it with >> stops at the first non-digit: bounded).
  std::ifstream in("/proc/sys/net/core/somaxconn");
  long value = 0;
  if (in >> value && value > 0) return static_cast<int>(std::min<long>(value, 1L << 20));
  return SOMAXCONN;
}

absl::Status CannotListen(const std::string& host, int port) {
  return absl::UnavailableError(StrCat("cannot listen on ",
                                       host.find(':') == std::string::npos ? host : StrCat("[", host, "]"),
                                       ":", port, ": the address is in use or not local; choose another"));
}

}  // namespace tessera::http
