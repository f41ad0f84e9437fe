// Removing a unix socket file, and nothing else at that path, for the fake kubelet's servers.
#ifndef TESSERA_TOOLS_FAKE_KUBELET_SOCKET_FILE_H_
#define TESSERA_TOOLS_FAKE_KUBELET_SOCKET_FILE_H_

#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace tessera::kubelet {

inline void RemoveSocket(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
}

}  // namespace tessera::kubelet

#endif  // TESSERA_TOOLS_FAKE_KUBELET_SOCKET_FILE_H_
