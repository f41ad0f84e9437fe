// Runs one of the project's binaries (build/bin/NAME) as users do, in a shell, and captures what it prints.
//
//   BinaryResult r = RunBinary("tessera", "inspect --file x.json");
//   EXPECT_EQ(r.status, 0) << r.output;
//
// Thread-safety: a free function; each call has its own pipe.
#ifndef TESSERA_TESTS_RUN_BINARY_H_
#define TESSERA_TESTS_RUN_BINARY_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace tessera::testing {

struct BinaryResult {
  int status = -1;     // the exit status; -1 when it did not exit normally
  std::string output;  // stdout and stderr together
};

inline BinaryResult RunBinary(const std::string& name, const std::string& args) {
  const std::string cmd = std::string(TESSERA_BINARY_DIR) + "/bin/" + name + " " + args + " 2>&1";
  BinaryResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_RUN_BINARY_H_
