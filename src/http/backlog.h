// The listen backlog for every listening socket of Tessera's (HTTP listeners, the registration socket): the
// system's maximum, /proc/sys/net/core/somaxconn, or SOMAXCONN where it cannot be read. A short backlog resets
// bursts of connections (httplib's 5: 100 concurrent requests got 39 ECONNRESET).
#ifndef TESSERA_HTTP_BACKLOG_H_
#define TESSERA_HTTP_BACKLOG_H_

namespace tessera::http {

int ListenBacklog();

}  // namespace tessera::http

#endif  // TESSERA_HTTP_BACKLOG_H_
